//! The planner against the figures of FACTS.md, on the synthetic target-shaped models
//! (tools/make-synthetic-models), and the plan of the device set.

use kazeia_daemon::config::{default_cache_dir, Config};
use kazeia_memory_budget::{
    estimate, gguf, htp_runs, layer_bytes, plan_htp, ContextParams, KvType, DEFAULT_SESSION_CAP,
};

fn synthetic(name: &str) -> gguf::GgufHeader {
    let p = default_cache_dir().join("synthetic").join(name);
    assert!(p.is_file(), "{} missing: run tools/make-synthetic-models", p.display());
    gguf::read_header(&p).unwrap()
}

const MIB: u64 = 1 << 20;

#[test]
fn qwen35_9b_matches_the_memory_formulas() {
    let h = synthetic("qwen35-9b-q4_0.gguf");
    // The real file is 5,302,414,848 B; ours has the same tensors, byte for byte in size, and a
    // different header (a padded stand-in tokenizer).
    assert_eq!(h.weights_bytes(), 5_302_388_736);
    let e = estimate(&h, &ContextParams { n_ctx: 4096, n_ubatch: 512, ..Default::default() }).unwrap();
    // 8 full-attention layers × 2 × 4 KV heads × 256 × 2 B = 32,768 B per token.
    assert_eq!(e.kv_bytes, 32_768 * 4096);
    assert_eq!(e.kv_bytes, 128 * MIB);
    // 24 DeltaNet layers of recurrent state, F32: 52,690,944 B per sequence, and as much for
    // each of the sequence's checkpoints (the engine's copies to rewind to), 2 by default.
    assert_eq!(e.recurrent_bytes, 52_690_944);
    assert_eq!((e.checkpoints, e.checkpoint_bytes), (2, 52_690_944));
    let none = estimate(&h, &ContextParams { checkpoints: 0, ..Default::default() }).unwrap();
    assert_eq!(e.total() - none.total(), 2 * 52_690_944);
    // Touched: activations of a 512-token ubatch, dense (8·4096 + 2·12288) plus DeltaNet
    // (24 × 32 heads × 128) floats per token. Reserved adds the 512 × 248,320 logits rows.
    assert_eq!(e.compute_bytes, 512 * (8 * 4096 + 2 * 12288 + 24 * 32 * 128) * 4);
    assert_eq!(e.compute_reserved_bytes, e.compute_bytes + 512 * 248_320 * 4);
    assert_eq!(e.overhead_bytes, 20 * MIB + 240 * 248_320);
    // Quantized KV (type_k, type_v): blocks of 32 elements in 34 B (q8_0) or 18 B (q4_0)
    // instead of 64 B.
    let q8 = estimate(
        &h,
        &ContextParams { type_k: KvType::Q8_0, type_v: KvType::Q8_0, n_ctx: 4096, n_ubatch: 512, ..Default::default() },
    )
    .unwrap();
    assert_eq!(q8.kv_bytes, e.kv_bytes * 34 / 64);
    let mixed = estimate(
        &h,
        &ContextParams { type_k: KvType::Q8_0, type_v: KvType::Q4_0, n_ctx: 4096, n_ubatch: 512, ..Default::default() },
    )
    .unwrap();
    assert_eq!(mixed.kv_bytes, e.kv_bytes * (34 + 18) / 128);
    // Two cache slots keep two recurrent states but share the KV cells.
    let two = estimate(&h, &ContextParams { n_ctx: 4096, n_ubatch: 512, n_seq: 2, ..Default::default() }).unwrap();
    assert_eq!((two.kv_bytes, two.recurrent_bytes), (e.kv_bytes, 2 * e.recurrent_bytes));
    assert_eq!(two.checkpoints, 2 * e.checkpoints);
    // mmap adds the CPU repack copy of the Q4_0 matrices (the measured trap in FACTS.md).
    let mapped = estimate(&h, &ContextParams { mmap: true, ..Default::default() }).unwrap();
    assert!(mapped.repack_bytes > 3_000_000_000, "{mapped:?}");

    // Larger than one HTP session: two, contiguous, the Q6_K head left on the CPU.
    let split = layer_bytes(&h, htp_runs);
    let plan = plan_htp(&split.layers, split.cpu, split.output, DEFAULT_SESSION_CAP).unwrap();
    assert_eq!(plan.sessions.len(), 2);
    assert_eq!(plan.devices_env, "HTP0:0,HTP0:1");
    assert!(plan.sessions.iter().all(|s| s.bytes <= DEFAULT_SESSION_CAP));
    assert_eq!((plan.sessions[0].layers.start, plan.sessions[1].layers.end), (0, 32));
}

#[test]
fn guard_4b_kv_is_four_and_a_half_times_the_thinkers() {
    let h = synthetic("qwen3-4b-guard-q4_0.gguf");
    let e = estimate(&h, &ContextParams { n_ctx: 2048, n_ubatch: 128, ..Default::default() }).unwrap();
    assert_eq!(e.kv_bytes, 147_456 * 2048);
    assert_eq!(e.kv_bytes, 288 * MIB);
    // An attention model cuts its KV back: no checkpoint.
    assert_eq!((e.recurrent_bytes, e.checkpoints), (0, 0));
    let split = layer_bytes(&h, htp_runs);
    assert_eq!(plan_htp(&split.layers, split.cpu, split.output, DEFAULT_SESSION_CAP).unwrap().sessions.len(), 1);
}

#[test]
fn device_plan_fits_the_16_gb_budget() {
    let path = crate::repo().join("models.target.toml");
    let plan = kazeia_daemon::plan::plan(&Config::load(&path).unwrap()).unwrap();
    let gib = |roles: &[&str]| {
        plan.models.iter().filter(|m| roles.contains(&m.role.as_str())).map(|m| m.total_bytes).sum::<u64>() as f64
            / (1u64 << 30) as f64
    };
    // FACTS.md: 9B + Guard-4B with these contexts ≈ 8.2 GiB (the seed's 7.5 GB is optimistic).
    let llms = gib(&["thinker", "guard"]);
    assert!((7.9..8.4).contains(&llms), "{llms:.2} GiB");
    // With speech (Whisper base + VAD, Piper): well under the seed's "11.5 GB".
    let all = plan.total_bytes as f64 / (1u64 << 30) as f64;
    assert!((8.5..9.3).contains(&all) && all > llms, "{all:.2} GiB");
    assert!(plan.fits);
    assert_eq!(plan.budget_bytes, 11 << 30);
    assert_eq!(plan.models[0].htp_sessions, 2);
    // The hybrid Thinker's checkpoints (`checkpoints = 2`), in its total; the guard keeps none.
    assert_eq!((plan.models[0].checkpoints, plan.models[0].checkpoint_bytes), (2, 52_690_944));
    assert_eq!(plan.models[1].checkpoints, 0);
    assert_eq!(plan.models[1].htp_sessions, 1);
}
