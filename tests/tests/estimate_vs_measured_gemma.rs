//! As estimate_vs_measured.rs, for Gemma 3 270M (sliding-window layers, 262k vocabulary).

use kazeia_tests::{estimate_and_peak, gemma3};

#[tokio::test(flavor = "multi_thread")]
async fn gemma3_estimate_is_never_below_the_measured_peak() {
    let (est, peak) = estimate_and_peak(&gemma3(), 2048, 512).await;
    let ratio = est.total() as f64 / peak as f64;
    eprintln!("Gemma 3: estimate {} B {est:?} vs peak growth {peak} B: ratio {ratio:.3}", est.total());
    assert!(ratio >= 1.0, "the estimate is below what the load used: {ratio:.3}");
    assert!(ratio <= 1.10, "the estimate is more than 10% above what the load used: {ratio:.3}");
}
