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

/// Where model files live unless a config says otherwise: `$KAZEIA_MODELS`, else the user's
/// cache directory's `kazeia/models` (tools/fetch-models fills it).
pub fn model_cache_dir() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("KAZEIA_MODELS") {
        return dir.into();
    }
    dirs::cache_dir().unwrap_or_else(std::env::temp_dir).join("kazeia").join("models")
}
