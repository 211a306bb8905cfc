//! Memory accounting for Kazeia: what a model will cost before it loads, from its file header,
//! and how a model larger than one HTP session is split.
//!
//! Pure: this crate never links llama.cpp, so the planner runs anywhere (`kazeia plan`).

pub mod estimate;
pub mod gguf;
pub mod htp;
pub mod ledger;
pub mod onnx;
pub mod placement;
pub mod pressure;

/// A size as a person reads it: MiB under a GiB, GiB above (refusals, the CLI).
pub fn human_bytes(b: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    let mib = b as f64 / MIB;
    if mib < 1024.0 {
        format!("{mib:.1} MiB")
    } else {
        format!("{:.2} GiB", mib / 1024.0)
    }
}

pub use estimate::{estimate, htp_runs, layer_bytes, ContextParams, Estimate, LayerBytes, Shape};
pub use htp::{plan as plan_htp, HtpPlan, PlanError, DEFAULT_SESSION_CAP};
pub use ledger::{Ledger, Refusal};
pub use placement::{model_cache_dir, Backend, KvType};

#[cfg(test)]
mod tests {
    #[test]
    fn human_bytes_reads_as_mib_or_gib() {
        assert_eq!(super::human_bytes(0), "0.0 MiB");
        assert_eq!(super::human_bytes(135 << 20), "135.0 MiB");
        assert_eq!(super::human_bytes(2_304_051_445_760), "2145.82 GiB");
    }
}
