//! The sampler chain for one request, from the role's config and the request's overrides.

use llama_cpp_2::sampling::LlamaSampler;

use crate::params::Sampling;

/// Effective sampling for one request.
#[derive(Debug, Clone)]
pub struct SamplingPlan {
    pub base: Sampling,
    pub temperature: f32,
    pub seed: u32,
}

pub fn build(plan: &SamplingPlan, n_vocab: i32) -> LlamaSampler {
    let s = &plan.base;
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
    LlamaSampler::chain_simple(chain)
}
