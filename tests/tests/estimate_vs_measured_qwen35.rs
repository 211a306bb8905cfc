//! As estimate_vs_measured.rs, for the tiny random-weight qwen35 model: full-attention KV on one
//! layer in four, recurrent (DeltaNet) state for the others.

use kazeia_tests::{estimate_and_peak, qwen35_tiny};

#[tokio::test(flavor = "multi_thread")]
async fn qwen35_estimate_is_never_below_the_measured_peak() {
    let (est, peak) = estimate_and_peak(&qwen35_tiny(), 2048, 512).await;
    let ratio = est.total() as f64 / peak as f64;
    eprintln!("qwen35 tiny: estimate {} B {est:?} vs peak growth {peak} B: ratio {ratio:.3}", est.total());
    assert!(ratio >= 1.0, "the estimate is below what the load used: {ratio:.3}");
    assert!(ratio <= 1.10, "the estimate is more than 10% above what the load used: {ratio:.3}");
}
