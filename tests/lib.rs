//! Helpers for the cross-crate tests: real models from the cache, real engine, /proc figures.

use std::path::{Path, PathBuf};

use kazeia_daemon::config::{default_cache_dir, Config};

/// SmolLM2-135M-Instruct, the default Thinker/Guard (fetched by tools/fetch-models).
pub fn smollm2() -> PathBuf {
    model_file("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Gemma 3 270M base: a second, different architecture.
pub fn gemma3() -> PathBuf {
    model_file("gemma3/gemma-3-270m-q4_k_m.gguf")
}

fn model_file(rel: &str) -> PathBuf {
    let p = default_cache_dir().join(rel);
    assert!(p.is_file(), "{} is missing: run tools/fetch-models first", p.display());
    p
}

/// A config from TOML text (model files given as absolute paths).
pub fn config(text: &str) -> Config {
    Config::parse(Path::new("test-models.toml"), text).unwrap_or_else(|e| panic!("{e}"))
}

/// One `[[model]]` table for `role` on `file`, greedy, 2 threads.
pub fn model_toml(role: &str, file: &Path, extra: &str) -> String {
    format!(
        "[[model]]\nrole = \"{role}\"\nfile = \"{}\"\nthreads = 2\nbackend = \"cpu\"\n{extra}\n[model.sampling]\ntemperature = 0.0\nmax_tokens = 64\n",
        file.display()
    )
}

/// Fields of /proc/self/status in bytes (`VmRSS`, `RssAnon`, `RssFile`, …).
pub fn proc_status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Proportional set size of this process (/proc/self/smaps_rollup), in bytes.
pub fn pss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/smaps_rollup").expect("smaps_rollup");
    s.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .expect("Pss in smaps_rollup")
}
