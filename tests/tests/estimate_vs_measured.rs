//! The memory estimate against what a real load costs (SmolLM2): after load, a prefill of more
//! than a full n_ubatch and a short generation at n_ctx, the estimate must never be below the
//! growth of the process's peak RSS. Alone in its process: the peak is the process's.

use kazeia_tests::{estimate_and_peak, smollm2};

#[tokio::test(flavor = "multi_thread")]
async fn smollm2_estimate_is_never_below_the_measured_peak() {
    let (est, peak) = estimate_and_peak(&smollm2(), 2048, 512).await;
    let ratio = est.total() as f64 / peak as f64;
    eprintln!("SmolLM2: estimate {} B {est:?} vs peak growth {peak} B: ratio {ratio:.3}", est.total());
    assert!(ratio >= 1.0, "the estimate is below what the load used: {ratio:.3}");
    assert!(ratio <= 1.10, "the estimate is more than 10% above what the load used: {ratio:.3}");
}
