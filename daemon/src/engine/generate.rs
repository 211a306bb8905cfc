//! One generation: prefill the prompt in chunks, then sample token by token.
//!
//! Cancellation is checked between prefill chunks and before every decode step, so a cancel
//! lands within one chunk or one token (llama.cpp has no safe way to abort a running decode).

use std::time::Instant;

use kazeia_ipc::{Metrics, StopReason};
use kazeia_pipelines::{GenEvent, GenSummary, LlmError};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;

use super::error::GenerateError;
use super::model::SharedModel;
use super::prompt;
use super::sampler::{self, SamplingPlan};
use super::worker::Job;
use crate::config::ModelConfig;

/// Run `job` on `ctx`. Always sends exactly one `Finished` event.
pub fn run(ctx: &mut LlamaContext<'_>, model: &SharedModel, cfg: &ModelConfig, job: Job) {
    let events = job.events.clone();
    let result = generate(ctx, model, cfg, &job).map_err(LlmError::from);
    let _ = events.send(GenEvent::Finished(result));
}

fn generate(ctx: &mut LlamaContext<'_>, model: &SharedModel, cfg: &ModelConfig, job: &Job) -> Result<GenSummary, GenerateError> {
    let start = job.submitted;
    let opts = &job.request.options;
    // A vanished listener is a cancel: nobody would read what we produce.
    let cancelled = || job.cancel.is_cancelled() || job.events.is_closed();

    let text = prompt::build(model, &job.request.messages, cfg.thinking)?;
    let vocab = model.model.vocab();
    let tokens = vocab.tokenize(text.as_bytes(), true, true);
    let n_ctx = ctx.n_ctx();
    if tokens.is_empty() {
        return Err(GenerateError::Prompt("the prompt is empty".into()));
    }
    if tokens.len() >= n_ctx as usize {
        return Err(GenerateError::ContextOverflow { role: cfg.role.clone(), prompt: tokens.len(), n_ctx });
    }

    // No conversation state yet: every request starts from an empty context.
    ctx.clear_kv_cache();

    let total = tokens.len() as u32;
    let chunk = (cfg.prefill_chunk().min(ctx.n_batch()) as usize).max(1);
    let mut batch = LlamaBatch::new(chunk, 1);
    let mut metrics = Metrics { prompt_tokens: total, ..Metrics::default() };
    let mut prefilled = 0u32;
    let summary = |stop, metrics: Metrics, prefilled| Ok(GenSummary { stop, metrics, prefilled_tokens: prefilled });

    let t_prefill = Instant::now();
    for piece in tokens.chunks(chunk) {
        if cancelled() {
            return summary(StopReason::Cancelled, metrics, prefilled);
        }
        batch.clear();
        for (j, &t) in piece.iter().enumerate() {
            let pos = prefilled as usize + j;
            batch
                .add(t, pos as i32, &[0], pos + 1 == tokens.len())
                .map_err(|e| GenerateError::Decode { pos, reason: e.to_string() })?;
        }
        ctx.decode(&mut batch).map_err(|e| GenerateError::Decode { pos: prefilled as usize, reason: e.to_string() })?;
        prefilled += piece.len() as u32;
        let _ = job.events.send(GenEvent::Prefill { done: prefilled, total, at: Instant::now() });
    }
    let prefill_s = t_prefill.elapsed().as_secs_f64();
    metrics.prefill_tok_s = f64::from(total) / prefill_s.max(1e-9);

    let plan = SamplingPlan {
        base: cfg.sampling.clone(),
        temperature: opts.temperature.unwrap_or(cfg.sampling.temperature),
        seed: opts.seed.unwrap_or(cfg.sampling.seed),
    };
    let mut sampler = sampler::build(&plan, model.model.n_vocab());
    let max_new = opts.max_tokens.unwrap_or(cfg.sampling.max_tokens);
    let room = n_ctx - total;
    let mut decoder = encoding_rs::UTF_8.new_decoder();
    let mut logits_idx = batch.n_tokens() - 1;
    let mut pos = tokens.len();
    let mut generated = 0u32;
    let mut decoded = 0u32;
    let mut first_at: Option<Instant> = None;
    let t_gen = Instant::now();

    let stop = loop {
        if cancelled() {
            break StopReason::Cancelled;
        }
        let token = sampler.sample(ctx, logits_idx);
        if vocab.is_eog(token) && !opts.ignore_eos {
            break StopReason::Eos;
        }
        generated += 1;
        let bytes = vocab.token_to_piece(token, false, None);
        let mut piece = String::with_capacity(bytes.len() + 4);
        let _ = decoder.decode_to_string(&bytes, &mut piece, false);
        if !piece.is_empty() {
            let now = Instant::now();
            if first_at.is_none() {
                first_at = Some(now);
                metrics.ttft_ms = (now - start).as_secs_f64() * 1e3;
            }
            let _ = job.events.send(GenEvent::Token { text: piece, at: now });
        }
        if generated >= max_new {
            break StopReason::Length;
        }
        if generated >= room {
            break StopReason::ContextFull;
        }
        if cancelled() {
            break StopReason::Cancelled;
        }
        batch.clear();
        batch.add(token, pos as i32, &[0], true).map_err(|e| GenerateError::Decode { pos, reason: e.to_string() })?;
        ctx.decode(&mut batch).map_err(|e| GenerateError::Decode { pos, reason: e.to_string() })?;
        decoded += 1;
        pos += 1;
        logits_idx = 0;
    };
    // Bytes of an incomplete UTF-8 sequence at the very end.
    let mut tail = String::new();
    let _ = decoder.decode_to_string(&[], &mut tail, true);
    if !tail.is_empty() {
        let _ = job.events.send(GenEvent::Token { text: tail, at: Instant::now() });
    }
    let gen_s = t_gen.elapsed().as_secs_f64();
    metrics.generated_tokens = generated;
    // Steady-state decode speed: decode steps over the whole sampling+decode loop time.
    metrics.decode_tok_s = if decoded > 0 { f64::from(decoded) / gen_s.max(1e-9) } else { 0.0 };
    if first_at.is_none() {
        metrics.ttft_ms = start.elapsed().as_secs_f64() * 1e3;
    }
    summary(stop, metrics, prefilled)
}
