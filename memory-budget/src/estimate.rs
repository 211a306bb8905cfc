//! What a model will cost in memory, from its GGUF header and the context settings.
//!
//! Components, as llama.cpp allocates them:
//! - weights: the tensors' bytes. With mmap the CPU backend also copies repackable weights
//!   (Q4_0, Q4_K, IQ4_NL on this machine's CPU) into an anonymous buffer while the mapped file
//!   pages stay resident (FACTS.md, measured): they count twice.
//! - KV cache: per token, only attention layers (Qwen3.5: its full-attention layers; Gemma 3:
//!   global layers hold n_ctx tokens, sliding-window layers only the window).
//! - recurrent state (Qwen3.5's DeltaNet layers): fixed per sequence, always F32; plus the
//!   engine's checkpoints, host copies of it that a later prompt rewinds to (the state cannot be
//!   cut back): `checkpoints` per sequence (the role's setting, 2 by default: the end of the
//!   fixed opening, the end of the last conversation), each the size of the state.
//! - compute buffer: llama.cpp *reserves* it for its worst graph, a full n_ubatch batch that
//!   outputs logits for every token (n_ubatch × n_vocab × 4 B dominates). Our engine only ever
//!   asks for the last token's logits (generation and one-pass guard verdicts alike), so the
//!   logits part of that reservation is malloc'd address space that is never touched and never
//!   becomes resident. We count what a full-ubatch prefill touches — activations per token of
//!   the ubatch (dense: 8·n_embd + 2·n_ff floats; a Gated DeltaNet layer adds its chunked
//!   intermediates, 24 × state × value heads floats) — and report the reservation apart
//!   (`compute_reserved_bytes`, not in the total). Coefficients measured on SmolLM2, Gemma 3
//!   and the tiny qwen35 at n_ubatch 128/256/512 (tests/estimate_vs_measured*).
//! - runtime tables: vocabulary, merges and token maps, the logits row and the sampler's
//!   candidate array — ≈240 B per vocabulary entry — plus a fixed 20 MiB (backend, threads, KV cell metadata; rounded up so that no measured case falls below).
//! - with `swa_full` (llama.cpp's default, which we keep because prefix reuse must be able to
//!   rewind any layer) sliding-window layers hold the whole context too.

use crate::gguf::{GgmlType, GgufHeader, Value};

/// Context settings that change the cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ContextParams {
    pub n_ctx: u64,
    pub n_ubatch: u64,
    /// Sequences kept side by side (cache slots); they share the n_ctx KV cells, but each has its
    /// own recurrent state.
    pub n_seq: u64,
    pub mmap: bool,
    /// KV cache element types of keys and values (f16 by default).
    pub type_k: crate::KvType,
    pub type_v: crate::KvType,
    /// Checkpoints of the recurrent state the engine keeps per sequence (hybrid models; other
    /// models cut their KV back and keep none).
    pub checkpoints: u64,
    /// Sliding-window layers keep the whole context (llama.cpp's default; the engine keeps it).
    pub swa_full: bool,
    /// Flash attention (the engine's `auto` enables it on the CPU): no n_kv × n_ubatch score
    /// matrix per head.
    pub flash_attn: bool,
}

impl Default for ContextParams {
    fn default() -> Self {
        ContextParams {
            n_ctx: 4096,
            n_ubatch: 512,
            n_seq: 1,
            mmap: false,
            type_k: crate::KvType::F16,
            type_v: crate::KvType::F16,
            checkpoints: 2,
            swa_full: true,
            flash_attn: true,
        }
    }
}

/// The estimate, by component, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Estimate {
    pub weights_bytes: u64,
    /// The anonymous repack copy that mmap adds (0 without mmap).
    pub repack_bytes: u64,
    pub kv_bytes: u64,
    /// The live recurrent state of every sequence.
    pub recurrent_bytes: u64,
    /// Checkpoints the engine may hold (all sequences), each of `checkpoint_bytes`.
    pub checkpoints: u64,
    pub checkpoint_bytes: u64,
    /// What a full-ubatch prefill touches of the compute buffer (activations).
    pub compute_bytes: u64,
    /// Runtime tables that grow with the vocabulary, plus a fixed part.
    pub overhead_bytes: u64,
    /// The compute buffer llama.cpp reserves (address space; only `compute_bytes` of it is
    /// touched by our engine). Not in the total.
    pub compute_reserved_bytes: u64,
}

/// Fixed runtime cost of a loaded model and its context (backend, thread pool, graph metadata).
pub const FIXED_OVERHEAD: u64 = 20 << 20;
/// Runtime bytes per vocabulary entry (token text and maps, merges, logits row, sampler array).
/// 300 until session 37 counted our own GGUF reader's copy of the vocabulary too (its tokens,
/// scores and types as 32-byte values, ~130 B an entry), which it no longer keeps: the measured
/// peak of a Gemma 3 270M load (262k entries) fell from 393.2 to 359.6 MB (the estimate 1.120
/// of it, past the tests' 1.10), SmolLM2's (49k, whose copy the load's allocations reused) and
/// the tiny qwen35's (49k) stayed 190.4 and 83.9 MB. At 240: 1.010, 1.076, 1.014 (at 300: 1.025,
/// 1.120, 1.050).
pub const PER_VOCAB_ENTRY: u64 = 240;

impl Estimate {
    /// The file's part: weights and their repack copy. Roles sharing one loaded file pay it once.
    pub fn file_bytes(&self) -> u64 {
        self.weights_bytes.saturating_add(self.repack_bytes)
    }

    /// The role's own part: KV, recurrent state, touched compute, runtime tables.
    pub fn context_bytes(&self) -> u64 {
        [self.kv_bytes, self.recurrent_bytes, self.checkpoints_total(), self.compute_bytes, self.overhead_bytes]
            .into_iter()
            .fold(0, u64::saturating_add)
    }

    /// All the checkpoints' bytes.
    pub fn checkpoints_total(&self) -> u64 {
        self.checkpoints.saturating_mul(self.checkpoint_bytes)
    }

    /// The one cost function: what loading this role adds, given whether its file is already
    /// loaded for another role. The plan, the ledger's admission and the supervisor all use it.
    /// Sums saturate: a figure past u64 (an odd header, an odd context) is over any budget, never
    /// wrapped under it.
    pub fn cost(&self, file_already_loaded: bool) -> u64 {
        self.context_bytes().saturating_add(if file_already_loaded { 0 } else { self.file_bytes() })
    }

    pub fn total(&self) -> u64 {
        self.file_bytes().saturating_add(self.context_bytes())
    }
}

/// The architecture facts the estimate needs, read from the header.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub arch: String,
    pub n_layer: u64,
    pub n_vocab: u64,
    pub n_embd: u64,
    pub n_ff: u64,
    pub n_head: u64,
    /// Gated DeltaNet layers and their value heads × state size (0 for other architectures).
    pub n_recurrent_layers: u64,
    pub recurrent_heads_x_state: u64,
    /// Per layer: KV bytes per token per element size unit (n_head_kv × (k + v)), 0 for a layer
    /// without attention.
    pub kv_elems_per_token: Vec<u64>,
    /// Key and value lengths per head (their element types may differ).
    pub k_len: u64,
    pub v_len: u64,
    /// Per layer: tokens its KV holds at most (None: the whole context).
    pub window: Vec<Option<u64>>,
    /// Recurrent state per sequence, bytes (F32).
    pub recurrent_bytes_per_seq: u64,
}

fn get_u64(h: &GgufHeader, key: &str) -> Option<u64> {
    h.arch_u64(key)
}

/// The largest figure a header may give for a model dimension (layers, heads, lengths, state
/// sizes, vocabulary), far past any real model's (Qwen3.5-9B: 32 layers, 4096 wide, 248,320
/// tokens). Past it the header is refused: a `block_count` of 2^40 allocated per-layer tables of
/// 16 TiB and aborted the daemon, and products of such figures wrapped u64.
pub const MAX_DIM: u64 = 1 << 24;

/// The most layers a header may give (the per-layer tables are this long).
pub const MAX_LAYERS: u64 = 1 << 16;

/// `v`, if at most [`MAX_DIM`].
fn plausible(arch: &str, key: &str, v: u64) -> Result<u64, String> {
    match v <= MAX_DIM {
        true => Ok(v),
        false => Err(format!("{arch}: {arch}.{key} = {v} is not plausible (at most {MAX_DIM})")),
    }
}

/// A per-layer value that GGUF may store as one number or as an array.
fn per_layer(h: &GgufHeader, key: &str, n_layer: u64) -> Option<Vec<u64>> {
    let arch = h.architecture()?;
    match h.get(&format!("{arch}.{key}"))? {
        Value::Array(items) => Some(items.iter().map(|v| v.as_u64().unwrap_or(0)).collect()),
        v => v.as_u64().map(|x| vec![x; n_layer as usize]),
    }
}

impl Shape {
    pub fn from_header(h: &GgufHeader) -> Result<Shape, String> {
        let arch = h.architecture().ok_or("no general.architecture")?.to_string();
        let need = |k: &str| {
            let v = get_u64(h, k).ok_or_else(|| format!("{arch}: no {arch}.{k} in the header"))?;
            plausible(&arch, k, v)
        };
        let maybe = |k: &str| get_u64(h, k).map(|v| plausible(&arch, k, v)).transpose();
        let n_layer = need("block_count")?;
        if n_layer > MAX_LAYERS {
            return Err(format!("{arch}: {arch}.block_count = {n_layer} is not plausible (at most {MAX_LAYERS})"));
        }
        let n_embd = need("embedding_length")?;
        let n_head = need("attention.head_count")?.max(1);
        let n_head_kv =
            per_layer(h, "attention.head_count_kv", n_layer).unwrap_or_else(|| vec![n_head; n_layer as usize]);
        if let Some(&v) = n_head_kv.iter().find(|&&v| v > MAX_DIM) {
            plausible(&arch, "attention.head_count_kv", v)?;
        }
        let k_len = maybe("attention.key_length")?.unwrap_or(n_embd / n_head);
        let v_len = maybe("attention.value_length")?.unwrap_or(n_embd / n_head);
        let n_vocab = match h.get("tokenizer.ggml.tokens") {
            Some(Value::Array(t)) => t.len() as u64,
            Some(Value::LongArray { len }) => *len,
            _ => h
                .tensors
                .iter()
                .find(|t| t.name == "token_embd.weight")
                .and_then(|t| t.dims.get(1).copied())
                .unwrap_or(0),
        };
        let n_vocab = plausible(&arch, "vocabulary", n_vocab)?;
        let mut kv: Vec<u64> =
            (0..n_layer as usize).map(|i| n_head_kv.get(i).copied().unwrap_or(n_head) * (k_len + v_len)).collect();
        let mut window = vec![None; n_layer as usize];
        let mut recurrent = 0;
        let mut n_recurrent_layers = 0;
        let mut recurrent_heads_x_state = 0;
        let n_ff = per_layer(h, "feed_forward_length", n_layer).and_then(|v| v.into_iter().max()).unwrap_or(4 * n_embd);
        let n_ff = plausible(&arch, "feed_forward_length", n_ff)?;
        match arch.as_str() {
            "qwen35" | "qwen3next" => {
                // Layer i is full attention when (i + 1) % interval == 0; the others are DeltaNet.
                let interval = get_u64(h, "full_attention_interval").unwrap_or(4).max(1);
                // The convolution keeps its last `conv - 1` inputs (none for a kernel of 0 or 1).
                let conv = need("ssm.conv_kernel")?.max(1);
                let state = need("ssm.state_size")?;
                let groups = need("ssm.group_count")?;
                let inner = need("ssm.inner_size")?;
                recurrent_heads_x_state = maybe("ssm.time_step_rank")?.unwrap_or(inner / state.max(1)) * state;
                let conv_state = (conv - 1).saturating_mul(inner + 2 * groups * state);
                let per_layer_rs = conv_state.saturating_add(state * inner).saturating_mul(4);
                for (i, e) in kv.iter_mut().enumerate() {
                    if !(i as u64 + 1).is_multiple_of(interval) {
                        *e = 0;
                        recurrent = u64::saturating_add(recurrent, per_layer_rs);
                        n_recurrent_layers += 1;
                    }
                }
            }
            "gemma3" | "gemma2" => {
                // Sliding-window layers keep only the window; every `pattern`-th layer is global.
                if let Some(w) = get_u64(h, "attention.sliding_window") {
                    let pattern = get_u64(h, "attention.sliding_window_pattern")
                        .unwrap_or(if arch == "gemma3" { 6 } else { 2 })
                        .max(1);
                    for (i, win) in window.iter_mut().enumerate() {
                        if !(i as u64 + 1).is_multiple_of(pattern) {
                            *win = Some(w);
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(Shape {
            arch,
            n_layer,
            n_vocab,
            n_embd,
            n_ff,
            n_head,
            n_recurrent_layers,
            recurrent_heads_x_state,
            kv_elems_per_token: kv,
            k_len,
            v_len,
            window,
            recurrent_bytes_per_seq: recurrent,
        })
    }
}

/// llama.cpp pads KV cells to 256.
fn pad256(n: u64) -> u64 {
    n.div_ceil(256).saturating_mul(256)
}

/// Tensor types the CPU backend repacks into its own buffer on x86 and ARM.
fn repackable(t: GgmlType) -> bool {
    t == GgmlType::Q4_0 || t == GgmlType::Q4_K || t == GgmlType(20)
}

pub fn estimate(h: &GgufHeader, p: &ContextParams) -> Result<Estimate, String> {
    let shape = Shape::from_header(h)?;
    let weights_bytes = h.weights_bytes();
    let repack_bytes = if p.mmap {
        h.tensors
            .iter()
            .filter(|t| repackable(t.ggml_type) && t.dims.len() >= 2 && t.name != "token_embd.weight")
            .map(|t| t.n_bytes())
            .sum()
    } else {
        0
    };
    let n_ctx = pad256(p.n_ctx);
    let kv_bytes = shape
        .kv_elems_per_token
        .iter()
        .zip(&shape.window)
        .map(|(&e, w)| {
            let cells = match w {
                // Without swa_full the sliding-window cache holds the window per sequence plus
                // one ubatch.
                Some(win) if !p.swa_full => pad256(win.saturating_mul(p.n_seq).saturating_add(p.n_ubatch).min(p.n_ctx)),
                _ => n_ctx,
            };
            // Heads × (k × key bytes + v × value bytes), the types' blocks of 32.
            let heads = e / (shape.k_len + shape.v_len).max(1);
            let per_token_x32 = heads * (shape.k_len * p.type_k.bytes_per_32() + shape.v_len * p.type_v.bytes_per_32());
            per_token_x32.saturating_mul(cells) / 32
        })
        .fold(0, u64::saturating_add);
    let compute_bytes = compute_touched(&shape, p);
    Ok(Estimate {
        weights_bytes,
        repack_bytes,
        kv_bytes,
        recurrent_bytes: shape.recurrent_bytes_per_seq.saturating_mul(p.n_seq),
        checkpoints: if shape.recurrent_bytes_per_seq > 0 { p.checkpoints.saturating_mul(p.n_seq) } else { 0 },
        // llama.cpp's partial sequence state: the recurrent layers' state (no SWA layers on a
        // model that has recurrent ones, among those we run).
        checkpoint_bytes: shape.recurrent_bytes_per_seq,
        compute_bytes,
        overhead_bytes: FIXED_OVERHEAD + PER_VOCAB_ENTRY * shape.n_vocab,
        compute_reserved_bytes: compute_bytes.saturating_add(p.n_ubatch.saturating_mul(shape.n_vocab * 4)),
    })
}

/// Activation bytes a full-ubatch prefill touches (see the module note for the coefficients).
fn compute_touched(s: &Shape, p: &ContextParams) -> u64 {
    let mut floats_per_token = 8 * s.n_embd + 2 * s.n_ff;
    if s.n_recurrent_layers > 0 {
        floats_per_token += 24 * s.recurrent_heads_x_state;
    }
    if !p.flash_attn {
        // The attention scores of one layer: n_head × n_kv per token of the ubatch.
        floats_per_token = floats_per_token.saturating_add(s.n_head.saturating_mul(pad256(p.n_ctx)));
    }
    p.n_ubatch.saturating_mul(floats_per_token).saturating_mul(4)
}

/// Where a model's bytes go when its layers are offloaded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LayerBytes {
    /// Per layer (`blk.<i>.`), the tensors the device can run.
    pub layers: Vec<u64>,
    /// Output norm and head, when the device can run them (they go with the last layer).
    pub output: u64,
    /// What stays on the CPU: token embeddings, and tensors of types the device cannot run.
    pub cpu: u64,
}

/// Tensor types the Hexagon HTP backend runs (FACTS.md): Q4_0, Q4_1, Q8_0, IQ4_NL, MXFP4, and
/// the F32/F16 norms. K-quants fall back to the CPU.
pub fn htp_runs(t: GgmlType) -> bool {
    matches!(t.0, 0 | 1 | 2 | 3 | 8 | 20 | 39)
}

/// Split the tensors' bytes by layer for an offload plan; `on_device` says which tensor types
/// the device runs (see [`htp_runs`]).
pub fn layer_bytes(h: &GgufHeader, on_device: impl Fn(GgmlType) -> bool) -> LayerBytes {
    // (A header past MAX_LAYERS layers was refused by the estimate, before any split.)
    let n = h.arch_u64("block_count").unwrap_or(0).min(MAX_LAYERS) as usize;
    let mut out = LayerBytes { layers: vec![0u64; n], ..LayerBytes::default() };
    for t in &h.tensors {
        let b = t.n_bytes();
        if t.name.starts_with("token_embd") || !on_device(t.ggml_type) {
            out.cpu += b;
            continue;
        }
        let layer = t.name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|s| s.parse::<usize>().ok());
        match layer {
            Some(i) if i < n => out.layers[i] += b,
            _ => out.output += b,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufHeader;
    use std::collections::BTreeMap;

    /// A header of `arch` with these architecture keys, no tensors.
    fn header(arch: &str, keys: &[(&str, Value)]) -> GgufHeader {
        let mut metadata = BTreeMap::new();
        metadata.insert("general.architecture".to_string(), Value::Str(arch.into()));
        for (k, v) in keys {
            metadata.insert(format!("{arch}.{k}"), v.clone());
        }
        GgufHeader { path: "m.gguf".into(), version: 3, metadata, tensors: vec![], data_offset: 0, file_size: 0 }
    }

    fn llama(block_count: u64) -> Vec<(&'static str, Value)> {
        vec![
            ("block_count", Value::U64(block_count)),
            ("embedding_length", Value::U32(576)),
            ("attention.head_count", Value::U32(9)),
            ("attention.head_count_kv", Value::U32(3)),
        ]
    }

    /// Figures no model has are refused with the key named: a block_count of 2^40 allocated
    /// per-layer tables of 16 TiB (the allocation failed and aborted the daemon).
    #[test]
    fn implausible_figures_are_refused() {
        let e = estimate(&header("llama", &llama(1 << 40)), &ContextParams::default()).unwrap_err();
        assert!(e.contains("llama.block_count = 1099511627776 is not plausible"), "{e}");
        // Layers have their own bound, below the other figures'.
        let e = estimate(&header("llama", &llama(1 << 20)), &ContextParams::default()).unwrap_err();
        assert!(e.contains("llama.block_count = 1048576 is not plausible (at most 65536)"), "{e}");
        let mut keys = llama(30);
        keys[3] = ("attention.head_count_kv", Value::Array(vec![Value::U32(3), Value::U64(u64::MAX)]));
        let e = estimate(&header("llama", &keys), &ContextParams::default()).unwrap_err();
        assert!(e.contains("head_count_kv"), "{e}");
        keys[3] = ("attention.key_length", Value::U64(1 << 40));
        assert!(estimate(&header("llama", &keys), &ContextParams::default()).unwrap_err().contains("key_length"));
        let e = estimate(&header("llama", &llama(30)), &ContextParams::default()).unwrap();
        assert!(e.kv_bytes > 0 && e.total() > e.kv_bytes, "{e:?}");
    }

    /// Large but plausible figures, and any context settings, saturate instead of wrapping: the
    /// total is over any budget, never a small number; a kernel of 0 keeps no convolution state
    /// (`conv - 1` underflowed).
    #[test]
    fn large_figures_saturate() {
        let big = Value::U64(MAX_DIM);
        let mut keys = vec![
            ("block_count", Value::U64(MAX_LAYERS)),
            ("embedding_length", big.clone()),
            ("attention.head_count", Value::U32(1)),
            ("feed_forward_length", big.clone()),
        ];
        for k in ["ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.inner_size"] {
            keys.push((k, big.clone()));
        }
        let huge = ContextParams {
            n_ctx: u64::MAX,
            n_ubatch: u64::MAX,
            n_seq: u64::MAX,
            checkpoints: u64::MAX,
            flash_attn: false,
            swa_full: false,
            ..ContextParams::default()
        };
        let e = estimate(&header("qwen35", &keys), &huge).unwrap();
        assert_eq!((e.total(), e.cost(false), e.cost(true)), (u64::MAX, u64::MAX, u64::MAX), "{e:?}");
        let small = |k: &'static str, v: u32| (k, Value::U32(v));
        let keys = [
            small("block_count", 8),
            small("embedding_length", 64),
            small("attention.head_count", 1),
            small("ssm.conv_kernel", 0),
            small("ssm.state_size", 16),
            small("ssm.group_count", 2),
            small("ssm.inner_size", 128),
        ];
        let e = estimate(&header("qwen35", &keys), &ContextParams::default()).unwrap();
        // 6 DeltaNet layers of 16 x 128 F32 state each, no convolution state.
        assert_eq!(e.recurrent_bytes, 6 * 4 * 16 * 128, "{e:?}");
    }
}
