//! The real models the real-model tests load (from `../shared/models/fetch`, found in
//! `$SPECVOICE_MODELS`, default `~/.cache/specvoice/models`).

use engine_llm::{LanguageModel, LoadOptions};

pub const SMOLLM: &str = "smollm2-135m-instruct";
pub const QWEN_SMALL: &str = "qwen2.5-coder-0.5b-instruct";
pub const QWEN_LARGE: &str = "qwen2.5-coder-1.5b-instruct";

pub fn load(name: &str) -> LanguageModel {
    LanguageModel::open(name, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e} (run ../shared/models/fetch)"))
}
