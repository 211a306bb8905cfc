//! The engine's greedy pick (`argmax` over the logits in place, `sampler.rs`) is llama.cpp's own
//! greedy sampler, step by step, on real logits: SmolLM2 and the tiny Qwen3.5 (hybrid), 48
//! tokens each. The fast path exists to save 0.74 M instructions per token (callgrind); it must
//! never change an answer.

use std::num::NonZeroU32;

use kazeia_engine::argmax;
use kazeia_memory_budget::model_cache_dir;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::{send_logs_to_tracing, LogOptions};

fn same_tokens(backend: &LlamaBackend, rel: &str, prompt: &str) {
    let path = model_cache_dir().join(rel);
    assert!(path.is_file(), "{} is missing: run tools/fetch-models and tools/make-synthetic-models", path.display());
    let model = LlamaModel::load_from_file(backend, &path, &LlamaModelParams::default()).expect("load");
    let params =
        LlamaContextParams::default().with_n_ctx(NonZeroU32::new(256)).with_n_threads(2).with_n_threads_batch(2);
    let mut ctx = model.new_context(backend, params).expect("context");
    let tokens = model.vocab().tokenize(prompt.as_bytes(), true, true);
    let mut batch = LlamaBatch::new(256, 1);
    let last = tokens.len() - 1;
    for (i, t) in tokens.iter().enumerate() {
        batch.add(*t, i as i32, &[0], i == last).expect("batch");
    }
    ctx.decode(&mut batch).expect("prefill");
    let mut greedy = LlamaSampler::greedy();
    let mut picked = Vec::new();
    let start = tokens.len() as i32;
    for pos in start..start + 48 {
        let idx = batch.n_tokens() - 1;
        let ours = argmax(ctx.get_logits_ith(idx));
        let theirs = greedy.sample(&ctx, idx);
        assert_eq!(ours as i32, theirs.0, "{rel}: step {} after {picked:?}", picked.len());
        picked.push(theirs.0);
        batch.clear();
        batch.add(theirs, pos, &[0], true).expect("batch");
        ctx.decode(&mut batch).expect("decode");
    }
    // A run that picked one token all along would prove little.
    picked.sort_unstable();
    picked.dedup();
    assert!(picked.len() > 3, "{rel}: only {} distinct tokens", picked.len());
}

#[test]
fn argmax_is_llama_cpp_greedy_on_real_logits() {
    // llama.cpp's log lines go to tracing, which this test does not print.
    send_logs_to_tracing(LogOptions::default());
    let backend = LlamaBackend::init().expect("backend");
    same_tokens(
        &backend,
        "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "The capital of France is Paris. The capital of Italy is",
    );
    same_tokens(&backend, "synthetic/qwen35-tiny-random.gguf", "Écris une phrase sur la mer.");
}
