//! Cross-crate integration tests in one binary (one link of llama.cpp and ONNX Runtime): the
//! engine, the guarded cascade, the memory plan, speech. Tests that measure this process's own
//! memory (estimate vs measured, shared weights, speech memory, admission) stay in binaries of
//! their own: a neighbour test loading a model would move their figures.

mod ahead;
mod budget;
mod cascade;
mod engine;
mod prefix;
mod speech;
mod thinking;
mod turn;

/// The checkout under test, read when the test runs (cargo sets `CARGO_MANIFEST_DIR` for it),
/// not built in with `env!`: the build cache outside the clone is shared by every clone, and a
/// test binary still fresh from another checkout's build would read that checkout's files, or
/// fail once it is deleted.
fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo test")).join("..")
}

/// A verdict as another context's (a cold one's): the same label, each label's probability
/// within 0.02 (a cached prefix adds its cells in another order than a full prefill). `what`
/// names the case in a failure.
fn same_verdict(got: &kazeia_pipelines::Classification, cold: &kazeia_pipelines::Classification, what: &str) {
    assert_eq!(got.label, cold.label, "{what}");
    for ((l, p), (_, q)) in got.scores.iter().zip(&cold.scores) {
        assert!((p - q).abs() < 0.02, "{what} {l}: {p} vs {q}");
    }
}
