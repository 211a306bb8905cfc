//! The one llama.cpp backend of the process, and where models may run.

use std::sync::{Mutex, OnceLock};

use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::{list_llama_ggml_backend_devices, send_logs_to_tracing, LogOptions};
use serde::Serialize;

use crate::error::LoadError;
use crate::params::Backend;

static BACKEND: OnceLock<LlamaBackend> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

/// llama.cpp allows one backend per process; every engine shares it.
pub fn backend() -> Result<&'static LlamaBackend, LoadError> {
    if let Some(b) = BACKEND.get() {
        return Ok(b);
    }
    let _guard = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = BACKEND.get() {
        return Ok(b);
    }
    // llama.cpp's own logging goes through tracing (RUST_LOG=llama_cpp_2=info to see it).
    send_logs_to_tracing(LogOptions::default());
    let b = LlamaBackend::init().map_err(|e| LoadError::Backend(e.to_string()))?;
    // Which threads run the CPU's graphs: OpenMP here, ggml's own pool in the device's build.
    let threads = if cfg!(feature = "openmp") { "OpenMP" } else { "ggml's thread pool (no OpenMP)" };
    tracing::info!(threads, "llama.cpp backend ready");
    Ok(BACKEND.get_or_init(|| b))
}

/// Where a model really runs, and why: reported by status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// `cpu`, or `htp` with the HTP devices used.
    pub device: String,
    pub devices: Vec<String>,
    /// Why this placement (e.g. the fallback reason).
    pub reason: String,
    /// ggml device indices handed to llama.cpp (empty: CPU only).
    #[serde(skip)]
    pub device_indices: Vec<usize>,
}

/// Choose the devices for a model. `auto` and `htp` look for Hexagon (HTP) devices in this
/// build of llama.cpp; when there are none, the model runs on the CPU and the reason says so.
pub fn place(requested: Backend) -> Placement {
    if requested == Backend::Cpu {
        return Placement {
            device: "cpu".into(),
            devices: vec![],
            reason: "backend = \"cpu\" in config".into(),
            device_indices: vec![],
        };
    }
    let htp: Vec<_> = list_llama_ggml_backend_devices()
        .into_iter()
        .filter(|d| {
            d.name.to_ascii_uppercase().starts_with("HTP") || d.backend.to_ascii_lowercase().contains("hexagon")
        })
        .collect();
    if htp.is_empty() {
        let reason = format!(
            "backend = \"{}\" but this llama.cpp build has no Hexagon HTP device (CPU-only build or no NPU): running on CPU",
            if requested == Backend::Htp { "htp" } else { "auto" }
        );
        static WARNED: OnceLock<()> = OnceLock::new();
        if requested == Backend::Htp && WARNED.set(()).is_ok() {
            tracing::warn!("{reason}");
        }
        return Placement { device: "cpu".into(), devices: vec![], reason, device_indices: vec![] };
    }
    Placement {
        device: "htp".into(),
        devices: htp.iter().map(|d| d.name.clone()).collect(),
        reason: format!("{} HTP session(s) found", htp.len()),
        device_indices: htp.iter().map(|d| d.index).collect(),
    }
}
