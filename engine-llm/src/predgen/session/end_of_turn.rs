//! The end of the user's turn, as the model sees it: the probability that the user's sentence
//! ends right after the words heard so far. A question that reads as complete ("What's the
//! weather in Paris tomorrow") makes it likely, words that stop mid-sentence ("I'd like to book
//! a table for", "What's the weather like") make it unlikely. The voice pipeline waits a long
//! silence only when the model expects more words (issue 75's semantic end of turn).
//!
//! The words are read as one sentence without marks ([`as_one_sentence`]): Whisper ends every
//! pause's transcript with a full stop or a question mark ("What's the weather like?"), after
//! which the model's end-of-turn token is likely whatever came before, and writes a pause
//! inside a question as a sentence end. So the probability is the model's probability of a
//! sentence end next — a token opening with `.`, `?` or `!`, or the end of the turn — after the
//! words so read. On the turn-taking set this cut the pauses taken for an end from 13 of 18 to
//! 3 (docs/turns.md).
//!
//! The forward that measures it also reads the row after all the words, whose most likely token
//! is the first of the model's completion of the same words
//! ([`PredGen::complete_question_step`]): it is kept, so that a completion starting from these
//! words does not run it again.

use std::time::Instant;

use spec_core::decoder::{forward_tokens, rewind_to_prefix};
use spec_core::math::softmax_in_place;
use spec_core::sampling::argmax;
use spec_core::LogitRows;

use super::{EventKind, PredGen, TurnState};
use crate::Result;

/// The model's estimate that the user's turn ends after `words`.
#[derive(Clone, Debug, PartialEq)]
pub struct EndOfTurn {
    /// The words heard (a partial transcript).
    pub words: String,
    /// P(the user's turn ends here | the conversation and `words`): the model's probability of
    /// a sentence end (a token opening with `.`, `?` or `!`, or an end token) right after the
    /// user's words read as one sentence without marks, in the chat prompt.
    pub probability: f32,
    /// Whether an end token is the model's most likely next token there: its greedy
    /// completion of the words ends the question at once.
    pub complete: bool,
}

/// An estimate with the model's most likely next token after the words.
#[derive(Clone, Debug)]
pub(super) struct Estimate {
    pub(super) end_of_turn: EndOfTurn,
    pub(super) next_token: u32,
    /// The recognizer's probability of the last word the estimate weighed, if any.
    last_word: Option<f32>,
}

impl PredGen<'_> {
    /// The newest estimate of the end of the user's turn, for the newest partial heard that
    /// was estimated (with [`PredGenConfig::estimate_end_of_turn`](crate::predgen::PredGenConfig::estimate_end_of_turn)); `None`
    /// outside a turn or before the first.
    pub fn end_of_turn(&self) -> Option<&EndOfTurn> {
        self.turn
            .as_ref()
            .and_then(|turn| turn.end_of_turn.as_ref())
            .map(|estimate| &estimate.end_of_turn)
    }

    /// The words of the newest partial heard, when they are still to be estimated: new words,
    /// or the same with a new probability of the last word.
    pub(super) fn end_of_turn_wanted(&self, turn: &TurnState) -> Option<String> {
        if !self.config.estimate_end_of_turn {
            return None;
        }
        let pending = turn.pending.as_ref()?;
        let words = pending.text.clone();
        let known = turn.end_of_turn.as_ref().is_some_and(|estimate| {
            estimate.end_of_turn.words == words
                && (pending.last_word_probability.is_none()
                    || estimate.last_word == pending.last_word_probability)
        });
        (!known && !words.trim().is_empty()).then_some(words)
    }

    /// Measures the end of the user's turn after `words` and reports it: one forward over the
    /// chat prompt up to the end of the words (the cached prefix reused), two when marks inside
    /// the words were dropped (the words read as one sentence are then not a prefix of them).
    ///
    /// When the recognizer gave its probability `p` of the last word
    /// ([`Partial::last_word_probability`](spec_voice::Partial::last_word_probability)), the
    /// estimate is the expectation over whether that word was said:
    /// `p · P(end | words) + (1 − p) · P(end | words but the last)`, the second read from a row
    /// of the same forward.
    pub(super) fn estimate_end_of_turn(&mut self, turn: &mut TurnState, words: &str) -> Result<()> {
        let started = Instant::now();
        let context = self.words_context(words)?;
        let one = as_one_sentence(words);
        let sentence = if !one.is_empty() && one != words {
            self.words_context(&one)?
        } else {
            context.clone()
        };
        let heard_last_word = turn
            .pending
            .as_ref()
            .and_then(|partial| partial.last_word_probability);
        let last_word = heard_last_word.filter(|&p| p < 1.0);
        let shorter = match (last_word, without_last_word(&one)) {
            (Some(_), Some(shorter)) => Some(self.words_context(shorter)?)
                .filter(|s| s.len() < sentence.len() && sentence.starts_with(s)),
            _ => None,
        };
        // The first row wanted follows `first` tokens: the words but the last, or all of them.
        let first = shorter.as_ref().map_or(sentence.len(), Vec::len);
        let keep = rewind_to_prefix(&mut self.model.model, &sentence[..first])?;
        // When the unmarked words are a prefix of the words (no marks inside them), one forward
        // gives the rows after the unmarked words and after all of them.
        let one_forward = context.starts_with(&sentence);
        let forwarded = if one_forward { &context } else { &sentence };
        let count = forwarded.len() - first + 1;
        let rows = forward_tokens(
            &mut self.model.model,
            &forwarded[keep..],
            LogitRows::Last(count),
        )?;
        let next_token = if one_forward {
            argmax(rows.row(count - 1))
        } else {
            let keep = rewind_to_prefix(&mut self.model.model, &context)?;
            let last = forward_tokens(&mut self.model.model, &context[keep..], LogitRows::Last(1))?
                .into_last_row();
            turn.forwards_during_input += 1;
            argmax(&last)
        };
        turn.forwards_during_input += 1;
        let with_last = self.sentence_end_probability(rows.row(sentence.len() - first));
        let probability = match last_word {
            Some(p) if shorter.is_some() => {
                let without_last = self.sentence_end_probability(rows.row(0));
                p * with_last + (1.0 - p) * without_last
            }
            _ => with_last,
        };
        let end_tokens = self.model.tokenizer.end_tokens();
        let end_of_turn = EndOfTurn {
            words: words.to_string(),
            probability,
            complete: end_tokens.contains(&next_token),
        };
        turn.clock.charge(started.elapsed());
        turn.timeline.push(turn.event(EventKind::EndOfTurn {
            words: end_of_turn.words.clone(),
            probability,
        }));
        turn.end_of_turn = Some(Estimate {
            end_of_turn,
            next_token,
            last_word: heard_last_word,
        });
        Ok(())
    }

    /// The probability of a sentence end (a token opening with `.`, `?` or `!`, or an end
    /// token) in the next-token `logits`.
    fn sentence_end_probability(&self, logits: &[f32]) -> f32 {
        let mut row = logits.to_vec();
        softmax_in_place(&mut row);
        self.model
            .tokenizer
            .sentence_end_tokens()
            .iter()
            .filter_map(|&token| row.get(token as usize))
            .sum::<f32>()
            .min(1.0)
    }
}

/// The words of `sentence` (as [`as_one_sentence`] gives it) but the last; `None` for one
/// word or none.
fn without_last_word(sentence: &str) -> Option<&str> {
    let (rest, _) = sentence.trim_end().rsplit_once(char::is_whitespace)?;
    Some(rest.trim_end()).filter(|rest| !rest.is_empty())
}

/// `words` as one unfinished sentence: without the marks that end them, and without the
/// sentence ends inside them. Whisper ends the transcript of every pause with a full stop or a
/// question mark and writes a pause inside a question as a sentence end ("How much should I
/// tip? At a restaurant in Germany."); read so, the last piece looks like a fragment and the
/// whole like anything but an ended question. The next word's first letter is lowercased,
/// unless it is the pronoun "I".
pub(super) fn as_one_sentence(words: &str) -> String {
    let unmarked = words.trim_end_matches(|c: char| {
        c.is_whitespace() || matches!(c, '.' | '?' | '!' | ',' | ';' | ':' | '…' | '-' | '—')
    });
    let mut sentence: Vec<String> = Vec::new();
    let mut after_an_end = false;
    for piece in unmarked.split_whitespace() {
        let mut word = piece.to_string();
        let pronoun = word == "I" || word.starts_with("I'") || word.starts_with("I’");
        if after_an_end && !pronoun {
            let mut chars = word.chars();
            if let Some(first) = chars.next() {
                word = first.to_lowercase().chain(chars).collect();
            }
        }
        after_an_end = word.len() > 1 && word.ends_with(['.', '?', '!']);
        if after_an_end {
            word.truncate(word.trim_end_matches(['.', '?', '!']).len());
        }
        sentence.push(word);
    }
    sentence.join(" ")
}

#[cfg(test)]
mod tests {
    use super::{as_one_sentence, without_last_word};

    #[test]
    fn the_words_but_the_last() {
        assert_eq!(
            without_last_word("I'd like to book a table for us"),
            Some("I'd like to book a table for")
        );
        assert_eq!(without_last_word("two  words "), Some("two"));
        assert_eq!(without_last_word("one"), None);
        assert_eq!(without_last_word(""), None);
    }

    #[test]
    fn the_sentence_ends_whisper_writes_at_pauses_are_dropped() {
        let one = as_one_sentence;
        assert_eq!(one("What's the weather like?"), "What's the weather like");
        assert_eq!(one("a table for... "), "a table for");
        assert_eq!(one("Can you, uh,"), "Can you, uh");
        assert_eq!(one("It's 3.5"), "It's 3.5");
        assert_eq!(one("?!"), "");
        assert_eq!(
            one("How much should I tip? At a restaurant in Germany."),
            "How much should I tip at a restaurant in Germany"
        );
        assert_eq!(
            one("I need arms. I'd like a good recipe. Now!"),
            "I need arms I'd like a good recipe now"
        );
        assert_eq!(one("What about Élise? Or"), "What about Élise or");
    }
}
