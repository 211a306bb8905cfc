//! `kazeia plan`: what the configured models will cost, and where they will run, before
//! anything is loaded. Reads only GGUF headers (memory-budget).

use std::path::Path;

use kazeia_memory_budget::{estimate, gguf, htp_runs, layer_bytes, plan_htp, DEFAULT_SESSION_CAP};
use serde::Serialize;

use crate::config::{Backend, Config};

#[derive(Debug, Clone, Serialize)]
pub struct ModelPlan {
    pub role: String,
    pub file: String,
    /// Roles earlier in the file that load the same file: this one adds no weights.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shares_weights_with: Option<String>,
    pub weights_bytes: u64,
    pub kv_bytes: u64,
    pub recurrent_bytes: u64,
    /// Checkpoints of the recurrent state the engine may keep (all slots), and each one's size:
    /// in the total.
    pub checkpoints: u64,
    pub checkpoint_bytes: u64,
    /// What a full-ubatch prefill touches of the compute buffer.
    pub compute_bytes: u64,
    /// What llama.cpp reserves for it (address space, mostly the n_ubatch × n_vocab logits our
    /// engine never asks for); not in the total.
    pub compute_reserved_bytes: u64,
    /// Vocabulary tables, logits row, sampler, fixed runtime.
    pub overhead_bytes: u64,
    pub total_bytes: u64,
    pub backend: String,
    pub htp_sessions: usize,
    pub layer_ranges: Vec<[usize; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub htp_devices: Option<String>,
    /// Of the weights, what stays on the CPU (embeddings, types the HTP cannot run).
    pub cpu_weights_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub budget_bytes: u64,
    pub total_bytes: u64,
    pub fits: bool,
    pub models: Vec<ModelPlan>,
}

/// Plan every model of the config: each file's GGUF header, whatever its name (an Ollama blob
/// has none; one without `.gguf` was left out, the plan saying `fits` without it, while `serve`
/// loaded it).
pub fn plan(config: &Config) -> Result<Plan, String> {
    let (cap, cap_note) = session_cap(std::env::var("GGML_HEXAGON_VMEM").ok().as_deref());
    let mut models: Vec<ModelPlan> = Vec::new();
    // Each model's weights key (`ModelConfig::weights_key`), as `models`.
    let mut keys: Vec<String> = Vec::new();
    for m in &config.models {
        let path = config.model_path(m);
        let header = gguf::read_header(&path).map_err(|e| e.to_string())?;
        let est = estimate(&header, &m.context_params()).map_err(|e| format!("{}: {e}", path.display()))?;
        let canonical = std::fs::canonicalize(&path).unwrap_or(path.clone());
        let key = m.weights_key(&path);
        let shares = models
            .iter()
            .zip(&keys)
            .find(|(o, k)| **k == key && o.shares_weights_with.is_none())
            .map(|(o, _)| o.role.clone());
        keys.push(key);
        let weights = if shares.is_some() { 0 } else { est.file_bytes() };
        let (mut backend, mut sessions, mut ranges, mut devices, mut note) =
            ("cpu".to_string(), 0, Vec::new(), None, None);
        let mut cpu_weights = weights;
        if m.backend != Backend::Cpu {
            let split = layer_bytes(&header, htp_runs);
            match plan_htp(&split.layers, split.cpu, split.output, cap) {
                Ok(p) => {
                    backend = "htp".into();
                    sessions = p.sessions.len();
                    ranges = p.sessions.iter().map(|s| [s.layers.start, s.layers.end]).collect();
                    devices = Some(p.devices_env);
                    cpu_weights = if shares.is_some() { 0 } else { p.cpu_bytes };
                    let here = kazeia_engine::place(m.backend);
                    if here.device == "cpu" {
                        note = Some(format!("planned for HTP; on this machine: {}", here.reason));
                    }
                }
                Err(e) => note = Some(format!("no HTP split ({e}): CPU")),
            }
            if let Some(c) = &cap_note {
                note = Some(note.map_or(c.clone(), |n| format!("{n}; {c}")));
            }
        }
        let total = est.cost(shares.is_some());
        models.push(ModelPlan {
            role: m.role.clone(),
            file: canonical.display().to_string(),
            shares_weights_with: shares,
            weights_bytes: weights,
            kv_bytes: est.kv_bytes,
            recurrent_bytes: est.recurrent_bytes,
            checkpoints: est.checkpoints,
            checkpoint_bytes: est.checkpoint_bytes,
            compute_bytes: est.compute_bytes,
            compute_reserved_bytes: est.compute_reserved_bytes,
            overhead_bytes: est.overhead_bytes,
            total_bytes: total,
            backend,
            htp_sessions: sessions,
            layer_ranges: ranges,
            htp_devices: devices,
            cpu_weights_bytes: cpu_weights,
            note,
        });
    }
    // Speech (ONNX): file size × the factor measured per kind (memory-budget/src/onnx.rs).
    models.extend(speech_plans(config));
    // Saturating, as each estimate is (over any budget, never wrapped under it): a header's
    // saturated estimate plus a speech row wrapped to a small total that "fit".
    let total_bytes = models.iter().map(|m| m.total_bytes).fold(0, u64::saturating_add);
    let budget_bytes = config.budget.budget_bytes();
    Ok(Plan { budget_bytes, total_bytes, fits: total_bytes <= budget_bytes, models })
}

/// The bytes of weights one HTP session maps: `GGML_HEXAGON_VMEM` as llama.cpp's Hexagon
/// backend reads it (MiB, C `strtoul` with base 0: decimal, `0x` hex, a leading `0` octal;
/// digits up to the first other character), else its default on v75+ (3,355,443,200 B). A
/// window set smaller than the default and planned at the default made sessions the device
/// could not map; set larger, it planned more sessions than needed. `0` (or no number) makes the
/// backend measure the window when it starts: the plan keeps the default, and says so.
/// Returns the cap and a note for the plan when the variable is set.
fn session_cap(env: Option<&str>) -> (u64, Option<String>) {
    const MIB: u64 = 1 << 20;
    let Some(raw) = env else { return (DEFAULT_SESSION_CAP, None) };
    let s = raw.trim_start().strip_prefix('+').unwrap_or(raw.trim_start());
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None if s.starts_with('0') => (s, 8),
        None => (s, 10),
    };
    let end = digits.find(|c: char| !c.is_digit(radix)).unwrap_or(digits.len());
    // No digits reads 0; too many for a u64 (or a sign) is no size at all.
    let mib = match &digits[..end] {
        "" => Some(0),
        d => u64::from_str_radix(d, radix).ok(),
    };
    let default = kazeia_memory_budget::human_bytes(DEFAULT_SESSION_CAP);
    match mib.filter(|_| !s.starts_with('-')).map(|m| m.checked_mul(MIB)) {
        Some(Some(0)) => (
            DEFAULT_SESSION_CAP,
            Some(format!("GGML_HEXAGON_VMEM={raw:?}: the backend measures its window at start; planned with the default {default}")),
        ),
        Some(Some(bytes)) => {
            (bytes, Some(format!("HTP sessions of {} (GGML_HEXAGON_VMEM)", kazeia_memory_budget::human_bytes(bytes))))
        }
        _ => (
            DEFAULT_SESSION_CAP,
            Some(format!("GGML_HEXAGON_VMEM={raw:?} is not a window in MiB; planned with the default {default}")),
        ),
    }
}

/// The speech rows of the plan (`stt` with the VAD and the end-of-turn model, one `tts` per
/// Piper voice); reads file
/// sizes only (and a Piper voice's `split.json`: split, it is planned with a smaller factor).
pub fn speech_plans(config: &Config) -> Vec<ModelPlan> {
    use kazeia_memory_budget::onnx::{estimate_onnx, OnnxKind};
    let s = &config.speech;
    let stt = config.cache_path(&s.stt);
    let vad = config.cache_path(&s.vad);
    let mut stack = vec![stt.join("encoder.onnx"), stt.join("decoder.onnx"), vad];
    stack.extend(s.turn_model().map(|t| config.cache_path(t)));
    let mut rows = vec![("stt", stack, OnnxKind::Stt)];
    for voice in s.voices.values().filter(|v| !v.starts_with("espeak:")) {
        let path = config.cache_path(Path::new(voice));
        let kind = if kazeia_speech::tts::split_in_use(&path) { OnnxKind::TtsSplit } else { OnnxKind::Tts };
        rows.push(("tts", vec![path], kind));
    }
    rows.into_iter()
        .map(|(role, files, kind)| {
            let missing: Vec<String> = files.iter().filter(|f| !f.is_file()).map(|f| f.display().to_string()).collect();
            let bytes: u64 = files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
            let total = estimate_onnx(bytes, kind);
            let note = if missing.is_empty() {
                Some(format!("ONNX: {bytes} B of files × {} (measured factor)", kind.factor()))
            } else {
                Some(format!("missing: {} (run tools/fetch-models)", missing.join(", ")))
            };
            ModelPlan {
                role: role.into(),
                file: files.first().map(|f| f.display().to_string()).unwrap_or_default(),
                shares_weights_with: None,
                weights_bytes: total,
                kv_bytes: 0,
                recurrent_bytes: 0,
                checkpoints: 0,
                checkpoint_bytes: 0,
                compute_bytes: 0,
                compute_reserved_bytes: 0,
                overhead_bytes: 0,
                total_bytes: total,
                backend: format!("{:?}", s.backend).to_lowercase(),
                htp_sessions: 0,
                layer_ranges: vec![],
                htp_devices: None,
                cpu_weights_bytes: 0,
                note,
            }
        })
        .collect()
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1u64 << 20) as f64)
}

pub fn print(p: &Plan) {
    crate::cli::print::outln!(
        "{:<10} {:>10} {:>9} {:>9} {:>9} {:>7} {:>10}  {:<7} HTP sessions / layers",
        "role",
        "weights",
        "KV",
        "state",
        "compute",
        "other",
        "total MiB",
        "backend"
    );
    for m in &p.models {
        let layers = m.layer_ranges.iter().map(|r| format!("{}..{}", r[0], r[1])).collect::<Vec<_>>().join(" ");
        let weights = match &m.shares_weights_with {
            Some(o) => format!("(={o})"),
            None => mib(m.weights_bytes),
        };
        crate::cli::print::outln!(
            "{:<10} {:>10} {:>9} {:>9} {:>9} {:>7} {:>10}  {:<7} {} {}",
            m.role,
            weights,
            mib(m.kv_bytes),
            mib(m.recurrent_bytes),
            mib(m.compute_bytes),
            mib(m.overhead_bytes),
            mib(m.total_bytes),
            m.backend,
            m.htp_sessions,
            layers
        );
        if m.checkpoints > 0 {
            crate::cli::print::outln!(
                "{:<10} checkpoints: {} × {} MiB = {} MiB (in the total; `checkpoints` per slot)",
                "",
                m.checkpoints,
                mib(m.checkpoint_bytes),
                mib(m.checkpoints.saturating_mul(m.checkpoint_bytes))
            );
        }
        if let Some(n) = &m.note {
            crate::cli::print::outln!("{:<10} {n}", "");
        }
    }
    crate::cli::print::outln!(
        "total {} MiB of a {} MiB budget: {}",
        mib(p.total_bytes),
        mib(p.budget_bytes),
        if p.fits { "fits" } else { "DOES NOT FIT" }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_window_is_read_as_the_backend_reads_it() {
        const MIB: u64 = 1 << 20;
        assert_eq!(session_cap(None), (DEFAULT_SESSION_CAP, None));
        for (env, bytes) in [
            ("3328", 3328 * MIB),
            (" +2048", 2048 * MIB),
            ("0x400", 1024 * MIB),
            ("0100", 64 * MIB),
            ("1500MB", 1500 * MIB),
        ] {
            let (cap, note) = session_cap(Some(env));
            assert_eq!(cap, bytes, "{env}");
            assert!(note.unwrap().contains("GGML_HEXAGON_VMEM"));
        }
        // Measured by the backend at start (0, no number): the default, said.
        for env in ["0", "", "abc"] {
            let (cap, note) = session_cap(Some(env));
            assert_eq!(cap, DEFAULT_SESSION_CAP, "{env}");
            assert!(note.unwrap().contains("measures its window"), "{env}");
        }
        // What strtoul would wrap or clamp: no window to plan from.
        for env in ["-1", "99999999999999999999", "17592186044416"] {
            let (cap, note) = session_cap(Some(env));
            assert_eq!(cap, DEFAULT_SESSION_CAP, "{env}");
            assert!(note.unwrap().contains("not a window"), "{env}");
        }
    }
}
