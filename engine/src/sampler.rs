//! The sampler for one request, from the role's config and the request's overrides.
//!
//! Ours, not llama.cpp's `llama_sampler_sample`, which copies the whole vocabulary into a
//! candidate array every token (49 152 × 12 bytes for SmolLM2). Greedy decoding (temperature 0:
//! every guard check, the benches) takes the arg max of the logits in place: under callgrind the
//! copy and scan were 0.74 M instructions per decoded token, 0.65% of SmolLM2-135M's step and all
//! of the per-token gap to llama-bench that was ours (docs/ARCHITECTURE.md, Compute). A draw
//! (the Thinker's default) runs llama.cpp's chain on the top-k candidates only (`Sampler`).

use std::collections::VecDeque;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::LlamaToken;

use crate::params::Sampling;

/// Effective sampling for one request.
#[derive(Debug, Clone)]
pub struct SamplingPlan {
    pub base: Sampling,
    pub temperature: f32,
    pub seed: u32,
}

/// How one request picks its tokens: llama.cpp's samplers on the candidates that can win.
///
/// llama.cpp's `llama_sampler_sample` copies the whole vocabulary into a candidate array, the
/// repeat penalty looks every candidate up in a hash map, and top-k sorts them all: 311 µs a
/// token with models.toml's Thinker settings on SmolLM2 (49 152 tokens), 4.6% of a 6.7 ms decode
/// step here; ours 24 µs. The penalty is applied to the few tokens of its window (on a copy of
/// the logits), the top-k cut is found in one pass, and llama.cpp's own chain (top-k, top-p, min-p,
/// temperature, seeded draw) runs on the tokens at or above it: the same candidates with the same
/// logits in the same order, so the same draws from the same seed (tests/sampling.rs). Only the
/// order of candidates with equal logits inside the top k can differ (each as likely).
pub struct Sampler {
    penalty: Option<Penalty>,
    pick: Pick,
    /// The logits with the penalty applied, reused from token to token.
    scratch: Vec<f32>,
}

enum Pick {
    /// The most likely token (temperature 0).
    Greedy,
    /// A draw: llama.cpp's chain without the penalty, on the top `top_k` (all when 0).
    Draw { top_k: usize, chain: LlamaSampler },
}

/// The repeat penalty's window, kept as llama.cpp's penalties sampler keeps it: the last
/// `last_n` sampled tokens (the prompt is not in it) and how often each occurs.
struct Penalty {
    last_n: usize,
    repeat: f32,
    window: VecDeque<i32>,
    counts: Vec<(i32, u32)>,
}

impl Penalty {
    fn accept(&mut self, token: i32) {
        match self.counts.iter_mut().find(|(t, _)| *t == token) {
            Some((_, n)) => *n += 1,
            None => self.counts.push((token, 1)),
        }
        if self.window.len() >= self.last_n {
            if let Some(old) = self.window.pop_front() {
                if let Some(i) = self.counts.iter().position(|(t, _)| *t == old) {
                    self.counts[i].1 -= 1;
                    if self.counts[i].1 == 0 {
                        self.counts.swap_remove(i);
                    }
                }
            }
        }
        self.window.push_back(token);
    }

    /// llama_sampler_penalties_apply's repeat penalty (frequency and presence are 0 here):
    /// a positive logit divided, a negative one multiplied.
    fn apply(&self, logits: &mut [f32]) {
        for &(token, _) in &self.counts {
            if let Some(l) = usize::try_from(token).ok().and_then(|i| logits.get_mut(i)) {
                if *l <= 0.0 {
                    *l *= self.repeat;
                } else {
                    *l /= self.repeat;
                }
            }
        }
    }
}

impl Sampler {
    /// The next token from the logits at `idx` of the last decoded batch.
    pub fn sample(&mut self, ctx: &LlamaContext<'_>, idx: i32) -> LlamaToken {
        let logits = ctx.get_logits_ith(idx);
        let values: &[f32] = match &self.penalty {
            None => logits,
            Some(p) => {
                self.scratch.clear();
                self.scratch.extend_from_slice(logits);
                p.apply(&mut self.scratch);
                &self.scratch
            }
        };
        let token = match &mut self.pick {
            Pick::Greedy => index_token(argmax(values)),
            Pick::Draw { top_k, chain } => {
                let mut cands = LlamaTokenDataArray::new(candidates(values, *top_k), false);
                chain.apply(&mut cands);
                // The chain ends with a draw, which always selects.
                cands.selected_token().unwrap_or_else(|| index_token(argmax(values)))
            }
        };
        if let Some(p) = &mut self.penalty {
            p.accept(token.0);
        }
        token
    }
}

/// A vocabulary is at most i32::MAX tokens (llama_vocab_n_tokens is an i32).
fn index_token(i: usize) -> LlamaToken {
    LlamaToken(i32::try_from(i).unwrap_or(0))
}

/// The tokens that top-k can keep, in token order as llama.cpp lists them: every value at or
/// above the `k`-th largest (all of them when `k` is 0, or when a NaN leaves fewer than `k`).
fn candidates(values: &[f32], k: usize) -> Vec<LlamaTokenData> {
    let all = || values.iter().enumerate().map(|(i, &v)| LlamaTokenData::new(index_token(i), v, 0.0)).collect();
    if k == 0 || k >= values.len() {
        return all();
    }
    let cut = kth_largest(values, k);
    let mut kept = Vec::with_capacity(k + 8);
    for (c, chunk) in values.chunks(LANES).enumerate() {
        if !chunk.iter().fold(false, |any, &x| any | (x >= cut)) {
            continue;
        }
        for (j, &v) in chunk.iter().enumerate() {
            if v >= cut {
                kept.push(LlamaTokenData::new(index_token(c * LANES + j), v, 0.0));
            }
        }
    }
    if kept.len() < k {
        return all();
    }
    kept
}

/// The `k`-th largest value (1 ≤ k < len): the best `k` kept sorted, each later value compared
/// with the smallest of them, 16 at a time (a few hundred of 49 152 get in).
fn kth_largest(values: &[f32], k: usize) -> f32 {
    let mut best = values[..k].to_vec();
    best.sort_unstable_by(|a, b| b.total_cmp(a));
    let mut low = best[k - 1];
    for chunk in values[k..].chunks(LANES) {
        if !any_above(chunk, low) {
            continue;
        }
        for &x in chunk {
            if x > low {
                let at = best.partition_point(|&b| b >= x);
                best.insert(at, x);
                best.pop();
                low = best[k - 1];
            }
        }
    }
    low
}

const LANES: usize = 16;

/// Whether any value is over `low` (without a branch per value, so it vectorises).
fn any_above(chunk: &[f32], low: f32) -> bool {
    chunk.iter().fold(false, |any, &x| any | (x > low))
}

/// At or below this temperature the pick is greedy: logits divided by a temperature near 0
/// overflow to infinity, and llama.cpp's draw then took the least likely candidate (1e-40 did).
pub const MIN_TEMPERATURE: f32 = 1e-3;

/// llama.cpp reads seed 4294967295 (`LLAMA_DEFAULT_SEED`) as "any": it draws as 4294967294, so
/// every seed gives the same tokens each time.
fn fixed_seed(seed: u32) -> u32 {
    seed.min(u32::MAX - 1)
}

pub fn build(plan: &SamplingPlan) -> Sampler {
    let s = &plan.base;
    let penalty = (s.repeat_penalty != 1.0 && s.repeat_last_n > 0).then(|| Penalty {
        last_n: s.repeat_last_n as usize,
        repeat: s.repeat_penalty,
        window: VecDeque::new(),
        counts: Vec::new(),
    });
    let pick = if plan.temperature <= MIN_TEMPERATURE {
        // Temperature 0: deterministic, the most likely token every time.
        Pick::Greedy
    } else {
        let top_k = usize::try_from(plan.base.top_k).unwrap_or(0);
        Pick::Draw { top_k, chain: LlamaSampler::chain_simple(draw(plan)) }
    };
    Sampler { penalty, pick, scratch: Vec::new() }
}

/// llama.cpp's samplers after the penalty for a draw (temperature > 0): top-k, top-p, min-p
/// where set, then the temperature and the seeded draw.
fn draw(plan: &SamplingPlan) -> Vec<LlamaSampler> {
    let s = &plan.base;
    let mut chain = Vec::new();
    if s.top_k > 0 {
        chain.push(LlamaSampler::top_k(s.top_k));
    }
    if s.top_p < 1.0 {
        chain.push(LlamaSampler::top_p(s.top_p, 1));
    }
    if s.min_p > 0.0 {
        chain.push(LlamaSampler::min_p(s.min_p, 1));
    }
    chain.push(LlamaSampler::temp(plan.temperature));
    chain.push(LlamaSampler::dist(fixed_seed(plan.seed)));
    chain
}

/// llama.cpp's chain for the same plan, whole: the reference `Sampler` is tested against.
pub fn llama_chain(plan: &SamplingPlan, n_vocab: i32) -> LlamaSampler {
    let s = &plan.base;
    let mut chain = Vec::new();
    if s.repeat_penalty != 1.0 {
        chain.push(LlamaSampler::penalties(n_vocab, s.repeat_last_n, s.repeat_penalty, 0.0, 0.0));
    }
    if plan.temperature <= MIN_TEMPERATURE {
        chain.push(LlamaSampler::greedy());
    } else {
        chain.extend(draw(plan));
    }
    LlamaSampler::chain_simple(chain)
}

/// The index llama.cpp's greedy sampler picks: the first logit greater than all before it,
/// starting from index 0 (so a NaN is never picked past 0, and ties go to the lowest index).
///
/// Two passes so the first vectorises: the lane-wise maximum of 16 columns, then the first
/// position holding it.
pub fn argmax(logits: &[f32]) -> usize {
    let Some(&first) = logits.first() else { return 0 };
    if first.is_nan() {
        // Nothing compares greater than a NaN: llama.cpp keeps index 0.
        return 0;
    }
    let mut lanes = [first; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            *m = if x > *m { x } else { *m };
        }
    }
    let mut max = first;
    for &x in lanes.iter().chain(tail) {
        if x > max {
            max = x;
        }
    }
    logits.iter().position(|&x| x == max).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::{argmax, build, candidates, fixed_seed, Penalty, Pick, Sampling, SamplingPlan, MIN_TEMPERATURE};
    use proptest::prelude::*;

    /// llama_sampler_greedy_apply, as written in llama.cpp.
    fn reference(logits: &[f32]) -> usize {
        let mut selected = 0;
        for i in 1..logits.len() {
            if logits[i] > logits[selected] {
                selected = i;
            }
        }
        selected
    }

    fn logit() -> impl Strategy<Value = f32> {
        prop_oneof![
            8 => -30.0f32..30.0,
            // Few distinct values: ties everywhere.
            4 => (-3i32..3).prop_map(|v| v as f32),
            1 => Just(f32::NEG_INFINITY),
            1 => Just(f32::INFINITY),
            1 => Just(f32::NAN),
            1 => Just(-0.0f32),
            1 => Just(0.0f32),
        ]
    }

    proptest! {
        #[test]
        fn argmax_is_llama_cpp_greedy(logits in prop::collection::vec(logit(), 0..200)) {
            prop_assert_eq!(argmax(&logits), reference(&logits));
        }
    }

    /// The values top-k keeps, by sorting them all.
    fn top_k_reference(values: &[f32], k: usize) -> Vec<usize> {
        if k == 0 || k >= values.len() {
            return (0..values.len()).collect();
        }
        let mut sorted = values.to_vec();
        sorted.sort_unstable_by(|a, b| b.total_cmp(a));
        let cut = sorted[k - 1];
        (0..values.len()).filter(|&i| values[i] >= cut).collect()
    }

    proptest! {
        #[test]
        fn candidates_are_the_top_k_and_their_ties(
            values in prop::collection::vec(prop_oneof![4 => -30.0f32..30.0, 2 => (-3i32..3).prop_map(|v| v as f32)], 1..300),
            k in 0usize..60,
        ) {
            let got: Vec<usize> = candidates(&values, k).iter().map(|d| d.id().0 as usize).collect();
            prop_assert_eq!(&got, &top_k_reference(&values, k));
            for d in candidates(&values, k) {
                prop_assert_eq!(d.logit(), values[d.id().0 as usize]);
            }
        }
    }

    #[test]
    fn penalty_window_counts_as_llama_cpp() {
        let mut p = Penalty { last_n: 3, repeat: 2.0, window: VecDeque::new(), counts: Vec::new() };
        for t in [5, 5, 7, 9] {
            p.accept(t);
        }
        // The window holds 5, 7, 9: the first 5 left it.
        let mut counts = p.counts.clone();
        counts.sort_unstable();
        assert_eq!(counts, vec![(5, 1), (7, 1), (9, 1)]);
        let mut logits = vec![1.0f32; 10];
        logits[7] = -1.0;
        p.apply(&mut logits);
        assert_eq!((logits[5], logits[7], logits[9], logits[6]), (0.5, -2.0, 0.5, 1.0));
        p.accept(7);
        p.accept(7);
        let mut counts = p.counts.clone();
        counts.sort_unstable();
        assert_eq!(counts, vec![(7, 2), (9, 1)]);
    }

    /// A temperature near 0 is greedy (a draw at 1e-40 took the least likely token), and the
    /// one seed llama.cpp reads as "any" is a fixed one.
    #[test]
    fn tiny_temperatures_are_greedy_and_every_seed_is_fixed() {
        let plan = |temperature| SamplingPlan { base: Sampling::default(), temperature, seed: 7 };
        for t in [0.0, 1e-40, 1e-6, MIN_TEMPERATURE] {
            assert!(matches!(build(&plan(t)).pick, Pick::Greedy), "{t}");
        }
        assert!(matches!(build(&plan(0.7)).pick, Pick::Draw { .. }));
        assert_eq!(fixed_seed(u32::MAX), u32::MAX - 1);
        assert_eq!(fixed_seed(42), 42);
    }

    #[test]
    fn edge_cases() {
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[f32::NAN, 5.0]), 0);
        assert_eq!(argmax(&[1.0, f32::NAN, 5.0, 5.0]), 2);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 40]), 0);
        let mut v = vec![0.0f32; 49_152];
        v[49_151] = 1.0;
        assert_eq!(argmax(&v), 49_151);
        v[17] = 1.0;
        assert_eq!(argmax(&v), 17);
    }
}
