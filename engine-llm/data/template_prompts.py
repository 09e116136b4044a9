"""Writes heads_template_prompts.txt: chat prompts for the heads' self-distilled training data,
built from templates over MT-Bench's eight kinds of request (writing, role play, reasoning,
maths, coding, extraction, STEM, humanities) with a fixed seed. Tooling only: run once with
`python3 engine-llm/data/template_prompts.py`; the prompts file is what training reads.
Prompts close to an MT-Bench question (word Jaccard >= 0.5) are dropped when the questions are
in the models folder."""

import json
import os
import random
import re

rng = random.Random(17)
NAMES = ["Amara", "Bruno", "Chen", "Dalia", "Erik", "Farah", "Goran", "Hana", "Ivan", "Jamal",
         "Keiko", "Liam", "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq",
         "Uma", "Victor", "Wen", "Ximena", "Yusuf", "Zara"]
PLACES = ["Lisbon", "Nairobi", "Osaka", "Quebec City", "Valparaiso", "Tbilisi", "Hobart",
          "Reykjavik", "Cusco", "Hanoi", "Marrakesh", "Bergen", "Kraków", "Cork", "Mendoza",
          "Ljubljana", "Busan", "Zanzibar", "Tallinn", "Oaxaca"]

WRITING_FORMS = ["a short blog post", "a four-line poem", "a limerick", "a product description",
                 "a cover letter", "a two-minute speech", "a diary entry", "a short news article",
                 "a persuasive paragraph", "a thank-you note", "a restaurant review",
                 "a one-day itinerary", "a short story opening", "a newsletter introduction",
                 "an apology email", "a motivational message", "a podcast episode outline",
                 "a haiku", "a toast for a wedding", "a letter to the editor"]
WRITING_SUBJECTS = ["a rainy afternoon in a bookshop", "a bakery opening in a small town",
                    "learning to swim as an adult", "a lost umbrella", "a community garden",
                    "the first day at a new job", "an old lighthouse keeper", "a robot that collects stamps",
                    "a bicycle repair café", "a night train across the mountains",
                    "a grandmother's recipe book", "a city without cars for a day",
                    "a noisy neighbour who plays the trumpet", "a forgotten birthday",
                    "a solar-powered boat", "a chess club for retirees", "a winter market",
                    "a dog that refuses to walk in the rain", "moving to a new country",
                    "a library that never closes", "a failed cooking experiment",
                    "a power cut during a storm", "a music festival in the desert",
                    "a school science fair", "an abandoned train station",
                    "a local football team's unlikely win", "a hiking trip gone wrong",
                    "a new ergonomic office chair", "reusable water bottles",
                    "a smart thermostat", "a language exchange meetup", "a lighthouse museum"]
PERSONAS = ["a medieval blacksmith", "a ship's captain in the 1700s", "a tired night-shift nurse",
            "a cheerful kindergarten teacher", "a grumpy cat", "a detective in 1920s Chicago",
            "an astronaut on the International Space Station", "a barista at a busy café",
            "a park ranger in Yellowstone", "a Roman senator", "a travel guide in Kyoto",
            "a personal fitness coach", "a wizard who is bad at magic", "a museum tour guide",
            "a retired jazz pianist", "a beekeeper", "a lighthouse keeper", "a pirate who hates the sea",
            "a librarian in a haunted library", "a professional chef", "a nervous first-time pilot",
            "a time traveller from the year 2300", "a farmer in the 19th century",
            "a customer support agent for a phone company", "a mountain guide in Nepal",
            "a sommelier", "a robot learning human manners", "a high-school football coach"]
PERSONA_ASKS = ["Describe a typical day in your life.", "Give advice to someone just starting out in your line of work.",
                "Tell me about the hardest moment of your career.", "What do you wish people understood about you?",
                "Explain your favourite tool and how you use it.", "Introduce yourself to a group of visitors.",
                "How do you handle a difficult customer?", "What would you change about the world if you could?",
                "Describe the best meal you ever had.", "Tell me a story from your youth."]
CONCEPTS = ["photosynthesis", "plate tectonics", "how vaccines train the immune system", "black holes",
            "the greenhouse effect", "how a refrigerator works", "compound interest", "DNA replication",
            "the Doppler effect", "how batteries store energy", "entropy", "how airplanes stay in the air",
            "the water cycle", "natural selection", "how the internet routes data", "nuclear fission",
            "why the sky is blue", "how GPS finds your position", "the placebo effect",
            "how a transistor works", "ocean tides", "the speed of light", "how muscles grow",
            "antibiotic resistance", "the Big Bang theory", "how earthquakes are measured",
            "supply and demand", "machine learning", "how solar panels work", "the human circulatory system",
            "radioactive decay", "how sound travels", "the periodic table", "how hurricanes form",
            "the immune response to a cold", "electric motors", "how bridges carry weight",
            "the carbon cycle", "how lenses focus light", "quantum tunnelling", "sleep and memory",
            "how 3D printers work", "the nitrogen cycle", "how noise-cancelling headphones work"]
STEM_FRAMES = ["Explain {} to a high-school student.", "Explain {} and give an everyday example.",
               "Describe {} in three short paragraphs.", "What are common misconceptions about {}?",
               "How would you demonstrate {} with a simple experiment at home?"]
HISTORY = ["the printing press", "the Silk Road", "the Industrial Revolution", "the fall of the Roman Empire",
           "the Renaissance", "the French Revolution", "the Cold War", "the invention of the telephone",
           "the Meiji Restoration", "the abolition of slavery", "the space race", "the Black Death",
           "the Enlightenment", "the partition of India", "the Great Depression", "the Mongol Empire",
           "the Reformation", "the age of exploration", "the civil rights movement", "the Berlin Wall",
           "ancient Greek democracy", "the Ottoman Empire", "the invention of writing", "the Olympic Games"]
HUMANITIES_FRAMES = ["What were the main causes and effects of {}?", "How did {} change everyday life?",
                     "Discuss the legacy of {} today.", "Compare two historians' views of {}.",
                     "Write a short lesson plan for teaching {} to teenagers."]
THEMES = ["justice", "freedom", "loneliness", "ambition", "friendship", "memory", "power", "identity",
          "nature", "duty", "forgiveness", "progress"]
CODE_TASKS = ["reverses the words in a sentence", "checks whether a string is a palindrome",
              "merges two sorted lists", "counts word frequencies in a text",
              "finds the second largest number in a list", "removes duplicates while keeping order",
              "converts a Roman numeral to an integer", "validates an email address",
              "computes the nth Fibonacci number iteratively", "flattens a nested list",
              "returns the longest common prefix of a list of strings", "rotates a matrix by 90 degrees",
              "parses a CSV line with quoted fields", "implements binary search",
              "groups anagrams together", "computes the median of a list",
              "checks if parentheses are balanced", "finds all prime numbers below n",
              "converts a temperature between Celsius and Fahrenheit",
              "computes the edit distance between two strings", "implements a stack with a min operation",
              "finds the first non-repeating character", "chunks a list into pieces of size k",
              "computes a running average", "transposes a list of lists",
              "implements an LRU cache", "finds the intersection of two arrays",
              "counts the islands in a grid", "serializes a binary tree to a string",
              "checks whether two rectangles overlap", "formats a number with thousands separators",
              "finds the majority element", "implements run-length encoding"]
LANGS = ["Python", "JavaScript", "Rust", "Go", "Java", "C++", "TypeScript", "C#"]
CODE_FRAMES = ["Write a {lang} function that {task}.", "In {lang}, how would you write code that {task}? Explain the approach.",
               "Write a {lang} function that {task}, and add a few test cases.",
               "What is an efficient algorithm that {task}? Show it in {lang}."]
CODE_QUESTIONS = ["What is the difference between a process and a thread?", "When should I use a hash map instead of a list?",
                  "Explain recursion with a simple example.", "What does Big-O notation describe?",
                  "How does garbage collection work?", "What is a race condition and how do you avoid one?",
                  "Explain the difference between SQL and NoSQL databases.", "What are pure functions?",
                  "How does HTTPS keep data private?", "What is dependency injection?",
                  "Explain how a hash table handles collisions.", "What is the difference between git merge and git rebase?"]
ITEMS = ["apples", "notebooks", "tickets", "marbles", "cupcakes", "stamps", "pencils", "bricks"]


def writing():
    return f"Write {rng.choice(WRITING_FORMS)} about {rng.choice(WRITING_SUBJECTS)}."


def roleplay():
    return f"Pretend you are {rng.choice(PERSONAS)}. {rng.choice(PERSONA_ASKS)}"


def reasoning():
    a, b, c, d = rng.sample(NAMES, 4)
    kind = rng.randrange(6)
    if kind == 0:
        return f"{a} is older than {b}, and {c} is younger than {b} but older than {d}. Who is the youngest? Explain step by step."
    if kind == 1:
        n = rng.randrange(3, 9)
        return f"{a} has {n} boxes and each box holds twice as many {rng.choice(ITEMS)} as the one before, starting with one. How many are there in total? Reason it through."
    if kind == 2:
        start, step = rng.randrange(1, 10), rng.randrange(2, 6)
        seq = [start + step * i * i for i in range(5)]
        return f"What number comes next in the sequence {', '.join(map(str, seq))}? Explain the pattern."
    if kind == 3:
        return f"{a}, {b} and {c} each own one pet: a cat, a dog and a parrot. {a} does not own the dog, and {b} owns the parrot. Who owns which pet? Explain."
    if kind == 4:
        return f"If all {rng.choice(['painters', 'runners', 'singers', 'sailors'])} in a club are early risers, and {a} is an early riser, can we conclude that {a} is in the club? Explain the logic."
    return f"{a} walks {rng.randrange(2, 9)} km north, then {rng.randrange(2, 9)} km east, then {rng.randrange(2, 9)} km south. How far is {a} from the start, in a straight line?"


def maths():
    kind = rng.randrange(6)
    a, b, c = rng.randrange(2, 12), rng.randrange(1, 30), rng.randrange(30, 120)
    if kind == 0:
        return f"Solve for x: {a}x + {b} = {c}. Show each step."
    if kind == 1:
        return f"A shop sells {rng.choice(ITEMS)} at {a} dollars each, with a {rng.choice([10, 15, 20, 25])} % discount on orders above {b}. How much do {b + a} of them cost?"
    if kind == 2:
        return f"Find the derivative of f(x) = {a}x^3 - {b}x^2 + {c}x - 7, and its value at x = 2."
    if kind == 3:
        return f"What is the probability of rolling a sum of {rng.randrange(4, 11)} with two fair six-sided dice? Explain."
    if kind == 4:
        return f"A rectangle has a perimeter of {2 * (a + b)} cm and one side of {a} cm. What is its area, and what is the length of its diagonal?"
    return f"Compute the sum of the integers from {a} to {c}, and explain a quick way to do it."


def coding():
    if rng.random() < 0.2:
        return rng.choice(CODE_QUESTIONS)
    return rng.choice(CODE_FRAMES).format(lang=rng.choice(LANGS), task=rng.choice(CODE_TASKS))


def extraction():
    names = rng.sample(NAMES, 3)
    place = rng.choice(PLACES)
    year = rng.randrange(1990, 2025)
    amount = rng.randrange(2, 90)
    text = (f"In {year}, {names[0]} opened a small {rng.choice(['bakery', 'repair shop', 'design studio', 'bookshop'])} in {place}. "
            f"Within two years {names[1]} joined as a partner and sales grew to {amount} thousand euros a month. "
            f"In {year + 3} they hired {names[2]} to run a second branch.")
    ask = rng.choice(["Extract every person, place and year from this text as a JSON object:",
                      "Summarise the following text in one sentence:",
                      "List the events in this text in chronological order:",
                      "Turn this text into a table with the columns person, role and year:"])
    return f"{ask} {text}"


def stem():
    return rng.choice(STEM_FRAMES).format(rng.choice(CONCEPTS))


def humanities():
    if rng.random() < 0.3:
        return f"How do two novels or plays you know treat the theme of {rng.choice(THEMES)}?"
    return rng.choice(HUMANITIES_FRAMES).format(rng.choice(HISTORY))


def words(text):
    return set(re.findall(r"[a-z']+", text.lower()))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    models = os.environ.get("SPECVOICE_MODELS", os.path.expanduser("~/.cache/specvoice/models"))
    bench = os.path.join(models, "data", "mt_bench", "question.jsonl")
    mt_bench = []
    if os.path.exists(bench):
        with open(bench) as f:
            mt_bench = [words(" ".join(json.loads(line)["turns"])) for line in f]
    existing = set()
    for name in os.listdir(here):
        if name.endswith("_prompts.txt") and name != "heads_template_prompts.txt":
            with open(os.path.join(here, name)) as f:
                existing.update(line.strip() for line in f)
    makers = [writing, roleplay, reasoning, maths, coding, extraction, stem, humanities]
    prompts, seen = [], set(existing)
    while len(prompts) < 720:
        prompt = makers[len(prompts) % len(makers)]()
        w = words(prompt)
        if prompt in seen or any(len(w & q) / len(w | q) >= 0.5 for q in mt_bench):
            continue
        seen.add(prompt)
        prompts.append(prompt)
    with open(os.path.join(here, "heads_template_prompts.txt"), "w") as f:
        f.write("\n".join(prompts) + "\n")


main()
