//! # engine-tts (in progress)
//!
//! Text-to-speech on `spec-core`. **Nothing here runs yet**: this crate holds the place and the
//! layout of the TTS engine so that it is built from `engine-llm`'s Qwen2 transformer (the
//! speech-token language model is a Qwen2.5-0.5B fed embeddings) and the shared `spec-nn`
//! blocks, not from copies. What is coming, module by module:
//!
//! - `cosyvoice`: CosyVoice 2's speech-token LM (text and speech-token embeddings, its output
//!   layer, repetition-aware sampling, streaming in chunks), flow matching to mel and the HiFT
//!   vocoder to 24 kHz audio.
//! - `ssd`: Speech Speculative Decoding, a draft built from the target's own layers and
//!   acceptance with a tolerance factor.
//! - `espeak`: a sentence synthesizer on `espeak-ng` for the voice pipeline until CosyVoice
//!   weights are present.
//!
//! The README of this crate tracks what works.
