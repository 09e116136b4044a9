#![doc = include_str!("../README.md")]

pub mod cosyvoice;
pub mod espeak;
