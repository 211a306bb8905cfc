//! Where a model asks to run. Shared by the planner (an `htp` model is split into HTP sessions),
//! the llama.cpp engine and the speech runtime, which each decide where it really runs.

use serde::{Deserialize, Serialize};

/// `auto` tries the NPU (HTP) and falls back to CPU; the choice and the reason are reported by
/// status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Cpu,
    Htp,
    Auto,
}

/// A KV cache element type (`type_k`, `type_v` in models.toml). Quantized types shrink the KV
/// cache (q8_0: 53%, q4_0: 28% of f16) at some cost in quality; a quantized V cache needs flash
/// attention (llama.cpp).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvType {
    #[default]
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    /// Its name in models.toml and in llama.cpp's tools (`-ctk`, `-ctv`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// Bytes per block of 32 elements (f16: 2 B each; q8_0: 32 + a f16 scale; q4_0: 16 + 2).
    pub fn bytes_per_32(self) -> u64 {
        match self {
            KvType::F16 => 64,
            KvType::Q8_0 => 34,
            KvType::Q4_0 => 18,
        }
    }
}

/// Where model files live unless a config says otherwise: `$KAZEIA_MODELS`, else the user's
/// cache directory's `kazeia/models` (tools/fetch-models fills it).
pub fn model_cache_dir() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("KAZEIA_MODELS") {
        return dir.into();
    }
    dirs::cache_dir().unwrap_or_else(std::env::temp_dir).join("kazeia").join("models")
}
