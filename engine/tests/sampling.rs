//! The engine's sampler (`engine/src/sampler.rs`) picks llama.cpp's own tokens, step by step on
//! real logits, SmolLM2 and the tiny Qwen3.5 (hybrid), 48 tokens a run: greedy (the arg max in
//! place) against llama.cpp's greedy sampler, and draws with the repeat penalty, top-k, top-p,
//! min-p and a seed (llama.cpp's chain on the top-k candidates only) against llama.cpp's whole
//! chain. Both exist to save work per token (0.74 M instructions greedy; 311 µs a draw); neither
//! may change an answer.

use std::num::NonZeroU32;

use kazeia_engine::sampler::{self, argmax, SamplingPlan};
use kazeia_engine::Sampling;
use kazeia_memory_budget::model_cache_dir;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::{send_logs_to_tracing, LogOptions};

const MODELS: [(&str, &str); 2] = [
    ("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "The capital of France is Paris. The capital of Italy is"),
    ("synthetic/qwen35-tiny-random.gguf", "Écris une phrase sur la mer."),
];

fn load(backend: &LlamaBackend, rel: &str) -> LlamaModel {
    let path = model_cache_dir().join(rel);
    assert!(path.is_file(), "{} is missing: run tools/fetch-models and tools/make-synthetic-models", path.display());
    LlamaModel::load_from_file(backend, &path, &LlamaModelParams::default()).expect("load")
}

/// Decodes `prompt`, then 48 tokens, each picked by `pick` (which also checks it): the tokens.
fn run(
    backend: &LlamaBackend,
    model: &LlamaModel,
    prompt: &str,
    mut pick: impl FnMut(&LlamaContext<'_>, i32, usize) -> LlamaToken,
) -> Vec<i32> {
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
    let mut picked = Vec::new();
    let start = tokens.len() as i32;
    for pos in start..start + 48 {
        let token = pick(&ctx, batch.n_tokens() - 1, picked.len());
        picked.push(token.0);
        batch.clear();
        batch.add(token, pos, &[0], true).expect("batch");
        ctx.decode(&mut batch).expect("decode");
    }
    picked
}

/// A run that picked one token all along would prove little.
fn varied(rel: &str, picked: &[i32]) {
    let mut distinct = picked.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 3, "{rel}: only {} distinct tokens in {picked:?}", distinct.len());
}

#[test]
fn samplers_pick_llama_cpp_tokens_on_real_logits() {
    // llama.cpp's log lines go to tracing, which this test does not print.
    send_logs_to_tracing(LogOptions::default());
    let backend = LlamaBackend::init().expect("backend");
    let thinker = Sampling::default();
    let plans = [
        // Greedy, no penalty: the arg max in place.
        (0.0, Sampling { repeat_penalty: 1.0, ..thinker.clone() }),
        // Greedy with the penalty (its window applied to a copy of the logits).
        (0.0, Sampling { repeat_penalty: 1.3, repeat_last_n: 8, ..thinker.clone() }),
        // models.toml's Thinker: penalty 1.1 over 64, top-k 40, top-p 0.95, min-p 0.05, 0.7.
        (0.7, Sampling { repeat_penalty: 1.1, ..thinker.clone() }),
        // A hot draw, wide top-k, a short window that wraps around.
        (
            1.5,
            Sampling { top_k: 200, top_p: 1.0, min_p: 0.0, repeat_penalty: 1.5, repeat_last_n: 4, ..thinker.clone() },
        ),
        // Near uniform over a small top-k: a wrong candidate set shows at once.
        (8.0, Sampling { top_k: 5, top_p: 1.0, min_p: 0.0, repeat_penalty: 1.0, ..thinker.clone() }),
        // No top-k: the chain on the whole vocabulary.
        (1.0, Sampling { top_k: 0, repeat_penalty: 1.2, ..thinker.clone() }),
    ];
    for (rel, prompt) in MODELS {
        let model = load(&backend, rel);
        for (temperature, base) in &plans {
            for seed in [1, 42] {
                let plan = SamplingPlan { base: base.clone(), temperature: *temperature, seed };
                let mut ours = sampler::build(&plan);
                let mut theirs = sampler::llama_chain(&plan, model.n_vocab());
                let picked = run(&backend, &model, prompt, |ctx, idx, step| {
                    let mine = ours.sample(ctx, idx);
                    let reference = theirs.sample(ctx, idx);
                    assert_eq!(mine, reference, "{rel}, {plan:?}: step {step}");
                    if *temperature == 0.0 && base.repeat_penalty == 1.0 {
                        assert_eq!(argmax(ctx.get_logits_ith(idx)) as i32, reference.0);
                    }
                    mine
                });
                varied(rel, &picked);
            }
        }
    }
}
