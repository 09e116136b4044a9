#![doc = include_str!("../README.md")]

pub mod channel;
pub mod clock;
mod error;
pub mod partial;
pub mod script;
pub mod sentence;
pub mod silence;
pub mod speaker;
pub mod synth;
pub mod timing;

pub use channel::{partial_channel, FinalSignal, PartialReceiver, PartialSender};
pub use clock::{Clock, ClockKind};
pub use error::{Error, Result};
pub use partial::{
    keeps_words, lag_k, parse_partials, read_partials, spoken_at_rate, Partial,
    DEFAULT_CHARS_PER_MINUTE,
};
pub use script::{parse_conversations, read_conversations};
pub use sentence::{
    first_piece_end, first_sentence_end, first_streamed_sentence, settled_first_piece,
    split_first_piece, split_sentences, SentenceStream, MIN_PIECE_WORDS,
};
pub use silence::SilenceMargins;
pub use speaker::{Speaker, Speech, SpeechEvent, Spoken};
pub use synth::{
    sentence_to_speak, write_wav, AudioChunk, FixedLatencySynthesizer, PreparedAudio,
    SentenceSynthesizer, Synthesis,
};
pub use timing::{duration_of, samples_in};
