//! Mutation fuzzing of SpecVoice's parsers on stable Rust: no compiler instrumentation, a
//! corpus that grows with inputs that end in new ways, a counting allocator for memory out of
//! proportion to the input, and a watchdog for hangs. `cargo xtask fuzz` runs the
//! `spec-fuzz` program; `docs/fuzzing.md` describes the targets and the numbers measured.

pub mod alloc;
mod mutate;
mod rng;
pub mod run;
pub mod targets;
