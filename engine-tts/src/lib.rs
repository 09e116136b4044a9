#![doc = include_str!("../README.md")]

pub mod cosyvoice;
pub mod espeak;
pub mod kokoro;
pub mod onnx;
pub mod piper;
pub mod text;
pub mod voices;
