"""Reference token ids for tokenizer tests, from llama.cpp's own GGUF tokenizer.

Qwen2's Hugging Face tokenizer normalizes text to NFC before splitting; llama.cpp does not, so
for each model the ids of the NFC-normalized text are stored too ("nfc"), which is what the
Hugging Face tokenizer gives for Qwen2.

Run after ../shared/models/fetch, with `pip install llama-cpp-python` (PyPI):
    python3 crates/engine-llm/tests/data/make_tokenizer_reference.py > crates/engine-llm/tests/data/tokenizer_reference.json
"""
import json
import os
import sys
import unicodedata

from llama_cpp import Llama

MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]
TEXTS = [
    "Hello, world! How's it going?",
    "What is the capital of France?",
    "Numbers: 3.14159, 1,000,000 and 2026-11-22; 12345678901234567890.",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "def f(x):\n\treturn x**2  # square\n",
    "Unicode: naïve café — 日本語のテキスト, Ελληνικά, Русский, emoji 🎉🚀 and e\u0301 (combining).",
    "   leading spaces,\ttabs\t\tand\n\n\nnewlines   ",
    "I'm sure they've said it's OK, you'll see; WE'LL SEE.",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "a  b   c    d\r\ne\r\n\r\nf",
    "$$x^2 + y^2 = z^2$$ & <tag attr=\"v\">text</tag> @user #hash 100%",
]

base = os.environ.get("SPECVOICE_MODELS", os.path.expanduser("~/.cache/specvoice/models"))
reference = {"texts": TEXTS, "models": {}}
for name in MODELS:
    llm = Llama(model_path=os.path.join(base, name, "model.gguf"), vocab_only=True, verbose=False)
    ids = lambda t: llm.tokenize(t.encode("utf-8"), add_bos=False, special=True)
    reference["models"][name] = {
        "raw": [ids(t) for t in TEXTS],
        "nfc": [ids(unicodedata.normalize("NFC", t)) for t in TEXTS],
    }
json.dump(reference, sys.stdout, ensure_ascii=False, indent=1)
sys.stdout.write("\n")
