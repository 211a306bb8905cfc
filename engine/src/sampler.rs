//! The sampler for one request, from the role's config and the request's overrides.
//!
//! Greedy decoding (temperature 0, no repeat penalty: every guard check, and the benches) takes
//! the arg max of the logits in place. llama.cpp's sampler first copies the whole vocabulary into
//! a candidate array (49 152 × 12 bytes for SmolLM2) and then scans it: under callgrind that was
//! 0.74 M instructions per decoded token, 0.65 % of SmolLM2-135M's step and all of the per-token
//! gap to llama-bench that was ours (docs/ARCHITECTURE.md, Compute). Everything else goes through
//! llama.cpp's chain.

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;

use crate::params::Sampling;

/// Effective sampling for one request.
#[derive(Debug, Clone)]
pub struct SamplingPlan {
    pub base: Sampling,
    pub temperature: f32,
    pub seed: u32,
}

/// How one request picks its tokens.
pub enum Sampler {
    /// The most likely token, read from the logits without a copy; stateless.
    Greedy,
    /// llama.cpp's sampler chain (penalties, top-k/p, min-p, temperature, seeded draw).
    Chain(LlamaSampler),
}

impl Sampler {
    /// The next token from the logits at `idx` of the last decoded batch.
    pub fn sample(&mut self, ctx: &LlamaContext<'_>, idx: i32) -> LlamaToken {
        match self {
            Sampler::Greedy => {
                let logits = ctx.get_logits_ith(idx);
                // A vocabulary is at most i32::MAX tokens (llama_vocab_n_tokens is an i32).
                LlamaToken(i32::try_from(argmax(logits)).unwrap_or(0))
            }
            Sampler::Chain(chain) => chain.sample(ctx, idx),
        }
    }
}

pub fn build(plan: &SamplingPlan, n_vocab: i32) -> Sampler {
    let s = &plan.base;
    if plan.temperature <= 0.0 && s.repeat_penalty == 1.0 {
        return Sampler::Greedy;
    }
    let mut chain = Vec::new();
    if s.repeat_penalty != 1.0 {
        chain.push(LlamaSampler::penalties(n_vocab, s.repeat_last_n, s.repeat_penalty, 0.0, 0.0));
    }
    if plan.temperature <= 0.0 {
        // Temperature 0: deterministic, the most likely token every time.
        chain.push(LlamaSampler::greedy());
    } else {
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
        chain.push(LlamaSampler::dist(plan.seed));
    }
    Sampler::Chain(LlamaSampler::chain_simple(chain))
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
    const LANES: usize = 16;
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
    use super::argmax;
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
