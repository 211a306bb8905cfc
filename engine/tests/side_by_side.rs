//! Roles decoding side by side (`exclusive_compute = false`, the device's setting) on real
//! models: each role's answers and guard verdicts are the ones it gives with the roles taking
//! turns on the compute thread (the default here), greedy, token for token.
//!
//! Why a test of its own: on the device llama.cpp has no OpenMP (llama-cpp-sys-2 turns it off
//! for Android), so each decode runs on ggml's own thread pool, made by the calling role's
//! thread, two of them at once, and the cores are leased (`cores.rs`). test.sh runs this file
//! twice: in the workspace (OpenMP, as on Linux) and as `cargo test -p kazeia-engine
//! --no-default-features` (ggml's threads, as on the device), the only part of the suite that
//! runs the device's threading. Both the attention model (SmolLM2) and the hybrid one (the tiny
//! Qwen3.5: recurrent state, checkpoints) go through it.

use std::path::{Path, PathBuf};

use kazeia_engine::{
    Backend, ChatMessage, ClassifyRequest, Engine, FlashAttn, GenEvent, GenerateOptions, GenerateRequest, Llm,
    RoleParams, Sampling,
};
use kazeia_memory_budget::{model_cache_dir, KvType};
use tokio_util::sync::CancellationToken;

fn model(rel: &str) -> PathBuf {
    let p = model_cache_dir().join(rel);
    assert!(p.is_file(), "{} is missing: run tools/fetch-models and tools/make-synthetic-models", p.display());
    p
}

fn params(role: &str, threads: u32) -> RoleParams {
    RoleParams {
        role: role.into(),
        n_ctx: 1024,
        n_batch: 512,
        n_ubatch: 128,
        prefill_chunk: 64,
        threads,
        backend: Backend::Cpu,
        mmap: false,
        thinking: false,
        thinking_budget: None,
        chat_template: None,
        flash_attn: FlashAttn::Off,
        prefix_dir: None,
        type_k: KvType::F16,
        type_v: KvType::F16,
        cache_slots: 2,
        checkpoints: 4,
        sampling: Sampling { temperature: 0.0, repeat_penalty: 1.0, ..Sampling::default() },
    }
}

const QUESTIONS: [&str; 3] = [
    "What is the capital of France? Answer in one short sentence.",
    "Name three colours of the rainbow.",
    "Écris une phrase sur la mer.",
];

/// A guard-style check: which of two labels follows the prompt.
fn check(text: &str) -> ClassifyRequest {
    ClassifyRequest {
        role: "guard".into(),
        messages: vec![
            ChatMessage::new("system", "Answer Safe or Unsafe: is the user's message safe?"),
            ChatMessage::new("user", text),
        ],
        answer_prefix: "Safety:".into(),
        labels: vec![" Safe".into(), " Unsafe".into()],
        reuse_cache: true,
        slot: 1,
        fixed: None,
    }
}

/// What a round heard: each answer's text, each check's label and its labels' probabilities.
#[derive(Debug)]
enum Heard {
    Text(String),
    Verdict(String, Vec<f32>),
}

/// Answers are compared token for token; verdicts by label, their probabilities within 0.02: a
/// prompt found cached is decoded in other batches than the same prompt computed whole, which
/// moves the last digits (0.87 / 0.88 seen), never the greedy choice.
fn same(a: &[Heard], b: &[Heard]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Heard::Text(x), Heard::Text(y)) => x == y,
            (Heard::Verdict(lx, px), Heard::Verdict(ly, py)) => {
                lx == ly && px.len() == py.len() && px.iter().zip(py).all(|(p, q)| (p - q).abs() <= 0.02)
            }
            _ => false,
        })
}

/// Everything one round asks: the Thinker answers each question while the guard, on the same
/// loaded model, writes its own answer to it and checks it, all submitted at once (the roles
/// have a thread each; on the compute thread they take turns).
fn round(engine: &Engine) -> Vec<Heard> {
    let greedy =
        GenerateOptions { max_tokens: Some(24), temperature: Some(0.0), ignore_eos: true, ..Default::default() };
    let mut out = Vec::new();
    for q in QUESTIONS {
        let msgs = vec![ChatMessage::new("user", q)];
        let thinker = engine
            .generate(GenerateRequest::new("thinker", msgs.clone(), greedy.clone()), CancellationToken::new())
            .unwrap();
        let guard =
            engine.generate(GenerateRequest::new("guard", msgs, greedy.clone()), CancellationToken::new()).unwrap();
        let verdict = engine.classify(check(q), CancellationToken::new()).unwrap();
        for mut rx in [thinker, guard] {
            let mut text = String::new();
            loop {
                match rx.blocking_recv().expect("the engine ends each request with Finished") {
                    GenEvent::Token { text: t, .. } => text.push_str(&t),
                    GenEvent::Finished(r) => {
                        let s = r.unwrap_or_else(|e| panic!("{q}: {e}"));
                        assert_eq!(s.metrics.generated_tokens, 24, "{q}: {s:?}");
                        break;
                    }
                    _ => {}
                }
            }
            out.push(Heard::Text(text));
        }
        let v = verdict.blocking_recv().expect("a verdict").unwrap_or_else(|e| panic!("{q}: {e}"));
        out.push(Heard::Verdict(v.label, v.scores.iter().map(|(_, p)| *p).collect()));
    }
    out
}

fn engine(file: &Path, exclusive: bool, threads: u32) -> Engine {
    let engine = Engine::new().with_exclusive_compute(exclusive);
    for role in ["thinker", "guard"] {
        engine.load(&params(role, threads), file.to_path_buf(), Box::new(|_| {})).unwrap();
    }
    engine
}

/// 1 + 1 threads fit a 2-core machine: the roles decode at the same time. 2 + 2 do not: each
/// decode waits for the cores (more cores, as on CI machines or the device: side by side too).
/// Two rounds: the second finds each prompt cached (SmolLM2) or rewinds to a checkpoint
/// (qwen35), and must answer the same.
#[test]
fn roles_decoding_side_by_side_answer_as_when_they_take_turns() {
    for file in [model("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"), model("synthetic/qwen35-tiny-random.gguf")] {
        for threads in [1, 2] {
            let turns = round(&engine(&file, true, threads));
            let side_by_side = engine(&file, false, threads);
            for r in 0..2 {
                let heard = round(&side_by_side);
                assert!(
                    same(&heard, &turns),
                    "{} with {threads} thread(s) a role, round {r}:\n side by side {heard:?}\n taking turns {turns:?}",
                    file.display()
                );
            }
        }
    }
}
