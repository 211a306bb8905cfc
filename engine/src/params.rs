//! What the engine needs to run a role: its own types, filled by whoever owns the settings (the
//! daemon's models.toml). The engine never parses a config file.

use serde::{Deserialize, Serialize};

pub use kazeia_memory_budget::Backend;

/// llama.cpp's flash-attention policy for a role's context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FlashAttn {
    #[default]
    Auto,
    On,
    Off,
}

impl FlashAttn {
    /// As models.toml and llama.cpp's tools (`-fa`) spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            FlashAttn::Auto => "auto",
            FlashAttn::On => "on",
            FlashAttn::Off => "off",
        }
    }
}

/// The temperatures a role's config and a request may set: past 5 a draw is all but uniform
/// over the vocabulary.
pub const TEMPERATURES: std::ops::RangeInclusive<f32> = 0.0..=5.0;

/// Sampling defaults for a role; a request may override temperature, seed and max_tokens.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sampling {
    /// 0 means greedy.
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: i32,
    pub seed: u32,
    pub max_tokens: u32,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 42,
            max_tokens: 512,
        }
    }
}

/// One role's context and sampling: everything a worker needs besides the model file.
#[derive(Debug, Clone, PartialEq)]
pub struct RoleParams {
    /// `thinker`, `guard`, …: the name requests use.
    pub role: String,
    pub n_ctx: u32,
    pub n_batch: u32,
    pub n_ubatch: u32,
    /// Prompt tokens decoded between two cancel checks (≥ 1).
    pub prefill_chunk: u32,
    pub threads: u32,
    pub backend: Backend,
    pub mmap: bool,
    /// Templates with a think block: false appends the empty block that turns thinking off.
    pub thinking: bool,
    /// Most tokens of reasoning per request before the engine closes the block (None: the
    /// request's `max_tokens`); 0 turns thinking off.
    pub thinking_budget: Option<u32>,
    /// A chat template replacing the one in the model file (llama.cpp renders the formats it
    /// knows: ChatML, Llama 3, Gemma…).
    pub chat_template: Option<String>,
    pub flash_attn: FlashAttn,
    /// Keep the role's fixed opening (a guard's instructions, a Thinker's system prompt) in a
    /// file here, restored at load (see `prefix_file`). None: no file.
    pub prefix_dir: Option<std::path::PathBuf>,
    /// KV cache element types.
    pub type_k: kazeia_memory_budget::KvType,
    pub type_v: kazeia_memory_budget::KvType,
    /// Sequences cached side by side in one context (they share the n_ctx cells).
    pub cache_slots: u32,
    /// Hybrid models: checkpoints of the recurrent state kept per sequence (see `generate::Cache`).
    pub checkpoints: u32,
    pub sampling: Sampling,
}
