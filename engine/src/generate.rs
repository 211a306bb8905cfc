//! Requests on one role's context: prefill with prefix reuse, then generate or classify.
//!
//! The context remembers which tokens its KV holds (`Cache`). A new prompt that starts with them
//! (a session's earlier turns, a guard's fixed instructions) only prefills what follows.
//!
//! Cancellation is checked between prefill chunks and before every decode step, so a cancel
//! lands within one chunk or one token (llama.cpp has no safe way to abort a running decode).
//!
//! Thinking (templates with a `<think>` block, role `thinking = true`): the engine opens the
//! block, routes the reasoning to `GenEvent::Thinking` (never `Token`), closes it itself when
//! the budget runs out, and afterwards cuts the sequence back to the end of the conversation,
//! which is where the next turn's prompt departs from it (Qwen-style templates re-render earlier
//! answers without their reasoning): the next turn reuses the conversation and prefills the
//! answer, as it would have to anyway. Nothing is decoded after the answer, so `done` and a
//! cancel are not delayed. Hybrid models (Qwen3.5's DeltaNet layers) cannot cut their state
//! back: their recurrent state is saved one token before the conversation's end
//! (`PARTIAL_ONLY`, llama.cpp's per-sequence state, as llama-server's checkpoints; one token
//! early because a prefill always re-decodes the prompt's last token) and kept as one of the
//! sequence's checkpoints (`checkpoints` per role, see `Cache`).

use std::time::Instant;

use crate::api::{
    ChatMessage, Classification, ClassifyRequest, FixedPart, GenEvent, GenSummary, GenerateOptions, LlmError,
    Prefilled as PrefillSummary, Upto, PREFILL_CUT,
};
use kazeia_ipc::{Metrics, StopReason};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::{LlamaStateSeqFlags, SeqState};
use tokio::sync::mpsc::UnboundedSender;

use crate::compute::Compute;
use crate::error::GenerateError;
use crate::job::{ClassifyJob, Job, PrefillJob};
use crate::model::SharedModel;
use crate::params::RoleParams;
use crate::prompt;
use crate::sampler::{self, SamplingPlan};
use crate::think::{self, Piece, ThinkFilter};

/// The tokens whose KV the context holds, per sequence (cache slot), in order; and per
/// sequence its checkpoints (hybrid models): the recurrent state after its first `pos` tokens,
/// where a later prompt that differs beyond `pos` can rewind to (the state cannot be cut back
/// otherwise). Taken at the end of a role's fixed opening (a one-slot role's system prompt, a
/// guard's instructions: `FixedPart`), where a reasoning turn's conversation ended (the next
/// turn's prompt re-renders the answer, and differs from the sampled tokens as often as not),
/// and where a prompt departed from the one before (a guard's next check after its
/// instructions). At most the role's `checkpoints` per sequence.
#[derive(Default)]
pub struct Cache {
    seqs: Vec<Vec<LlamaToken>>,
    /// Per sequence, in the order they were taken.
    checkpoints: Vec<Vec<Checkpoint>>,
    /// The role's prefix file is written (or was restored): once per load.
    pub prefix_kept: bool,
    /// The tokens restored from the prefix file at load, until the first prompt has been
    /// compared with them (see `Run::judge_restored`).
    restored: Option<Vec<LlamaToken>>,
}

struct Checkpoint {
    pos: usize,
    state: SeqState,
}

impl Cache {
    fn seq(&mut self, s: usize) -> &mut Vec<LlamaToken> {
        if self.seqs.len() <= s {
            self.seqs.resize_with(s + 1, Vec::new);
        }
        &mut self.seqs[s]
    }

    fn checkpoints(&mut self, s: usize) -> &mut Vec<Checkpoint> {
        if self.checkpoints.len() <= s {
            self.checkpoints.resize_with(s + 1, Vec::new);
        }
        &mut self.checkpoints[s]
    }

    /// Keep `state` as sequence `s`'s checkpoint at `pos`, within `max` per sequence. When full,
    /// the earliest position stays (the fixed opening every new conversation departs from, or a
    /// guard's instructions) and the oldest of the others goes; with `max` 1, the newest stays.
    fn add_checkpoint(&mut self, s: usize, pos: usize, state: SeqState, max: usize) {
        let list = self.checkpoints(s);
        list.retain(|c| c.pos != pos);
        list.push(Checkpoint { pos, state });
        while list.len() > max {
            let earliest = list.iter().enumerate().min_by_key(|(_, c)| c.pos).map(|(i, _)| i);
            let victim = if max >= 2 && earliest == Some(0) { 1 } else { 0 };
            list.remove(victim);
        }
    }

    /// Sequence `s`'s latest checkpoint at or before `limit` tokens.
    fn checkpoint_at_or_before(&mut self, s: usize, limit: usize) -> Option<&Checkpoint> {
        self.checkpoints(s).iter().filter(|c| c.pos <= limit).max_by_key(|c| c.pos)
    }

    /// The sequence other than `seq` holding the longest prefix of `tokens`, and its length.
    fn longest_elsewhere(&self, seq: usize, tokens: &[LlamaToken]) -> Option<(usize, usize)> {
        self.seqs
            .iter()
            .enumerate()
            .filter(|(s, _)| *s != seq)
            .map(|(s, held)| (s, held.iter().zip(tokens).take_while(|(a, b)| a == b).count()))
            .max_by_key(|&(_, n)| n)
    }

    /// The sequence now holds only its first `len` tokens: checkpoints past them are stale.
    fn truncate(&mut self, s: usize, len: usize) {
        self.seq(s).truncate(len);
        self.checkpoints(s).retain(|c| c.pos <= len);
    }
}

/// Outcome of a prefill.
struct Prefilled {
    /// Tokens decoded now (the rest were cached).
    decoded: u32,
    cached: u32,
    /// Batch index of the last prompt token's logits.
    logits_idx: i32,
    cancelled: bool,
    secs: f64,
}

struct Run<'a, 'c> {
    ctx: &'a mut LlamaContext<'c>,
    /// This request's sequence: its cache slot.
    seq: i32,
    cache: &'a mut Cache,
    model: &'a SharedModel,
    cfg: &'a RoleParams,
    compute: &'a Compute,
    /// The request is cancelled or its caller gone: a decode held for speech stops waiting.
    stop: &'a dyn Fn() -> bool,
}

impl Run<'_, '_> {
    /// The prompt's tokens, how many of them are the conversation (the rest open the answer:
    /// a think block, open or empty), and whether the model will reason.
    fn tokenize(
        &self,
        messages: &[ChatMessage],
        answer_prefix: &str,
        thinking: bool,
    ) -> Result<(Vec<LlamaToken>, usize, bool), GenerateError> {
        let p = prompt::build(
            self.model,
            self.cfg.chat_template.as_deref(),
            messages,
            thinking && answer_prefix.is_empty(),
        )?;
        let vocab = self.model.model.vocab();
        let (head, tail) = match answer_prefix.is_empty() {
            true => (p.base, p.open.to_string()),
            // A forced answer start (a guard's "Safety:") follows the opening, in one piece.
            false => (format!("{}{}{answer_prefix}", p.base, p.open), String::new()),
        };
        let mut tokens = vocab.tokenize(head.as_bytes(), true, true);
        let base = tokens.len();
        tokens.extend(vocab.tokenize(tail.as_bytes(), false, true));
        let n_ctx = self.ctx.n_ctx();
        if base == 0 {
            return Err(GenerateError::Prompt("the prompt is empty".into()));
        }
        if tokens.len() >= n_ctx as usize {
            return Err(GenerateError::ContextOverflow { role: self.cfg.role.clone(), prompt: tokens.len(), n_ctx });
        }
        Ok((tokens, base, p.thinks))
    }

    /// The tokens of `messages` rendered and cut at [`PREFILL_CUT`] (a prompt's start, for a
    /// prefill ahead of time). The start of a prompt tokenizes as the whole prompt's start:
    /// llama.cpp's tokenizers split words before merging them, and the caller cuts at a word's
    /// end.
    fn tokenize_until(&self, messages: &[ChatMessage]) -> Result<Vec<LlamaToken>, GenerateError> {
        let p = prompt::build(self.model, self.cfg.chat_template.as_deref(), messages, false)?;
        // The last mark: the cut is in the last message; an earlier one is some client's text.
        let Some(cut) = p.base.rfind(PREFILL_CUT) else {
            return Err(GenerateError::Prompt("the rendered prompt has no cut mark".into()));
        };
        // Spaces before the mark belong to the text after it ("ASSISTANT: " then the reply:
        // " The" is one token).
        let head = p.base[..cut].trim_end_matches(' ');
        let tokens = self.model.model.vocab().tokenize(head.as_bytes(), true, true);
        if tokens.is_empty() {
            return Err(GenerateError::Prompt("the prompt is empty".into()));
        }
        let n_ctx = self.ctx.n_ctx();
        if tokens.len() >= n_ctx as usize {
            return Err(GenerateError::ContextOverflow { role: self.cfg.role.clone(), prompt: tokens.len(), n_ctx });
        }
        Ok(tokens)
    }

    /// Bring the context to `tokens`: keep the common prefix, drop the rest, decode the new part
    /// in chunks. On return the cache matches what the KV holds, even when cancelled or failed.
    /// `logits`: the last token's logits are wanted (else a prompt already held is left as
    /// it is: a part prefilled before a checkpoint).
    /// `ahead`: a prefill ahead of a turn (`PrefillRequest`): decoded in chunks of
    /// `AHEAD_CHUNK`, so that `cancelled` (a request queued behind it) stops it within one, and
    /// with no checkpoint where it departs from the cache (a hybrid model keeps few: they are
    /// for the turn's own text, see `prefill_ahead`).
    #[allow(clippy::too_many_arguments)]
    fn prefill(
        &mut self,
        tokens: &[LlamaToken],
        logits: bool,
        keep_at: Option<usize>,
        cancelled: &dyn Fn() -> bool,
        events: Option<&UnboundedSender<GenEvent>>,
        ahead: bool,
    ) -> Result<Prefilled, GenerateError> {
        let t = Instant::now();
        self.judge_restored(tokens);
        self.make_room(tokens.len() + SLOT_MARGIN);
        let seq = self.seq;
        let cached = self.cache.seq(seq as usize);
        let common = cached.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        // With logits, at least the last prompt token is decoded again.
        let mut keep = if logits { common.min(tokens.len() - 1) } else { common };
        // Hybrid models: where this prompt departs from the previous one, when that had to be
        // decoded again; a checkpoint there lets the next prompt that shares as much (a guard's
        // next check after its instructions) rewind instead of starting over.
        let mut mark = None;
        if keep < cached.len() {
            let removed = self.ctx.clear_kv_cache_seq(Some(seq as u32), Some(keep as u32), None).unwrap_or(false);
            if !removed {
                mark = Some(keep).filter(|_| !ahead);
                // Recurrent state (e.g. Qwen3.5's DeltaNet layers) cannot be cut back: back to
                // the checkpoint if one is before the difference, else start over.
                keep = match self.rewind_to_checkpoint(keep) {
                    Some(pos) => pos,
                    None => {
                        self.reset();
                        0
                    }
                };
            }
            self.cache.truncate(seq as usize, keep);
        }
        // Another slot may hold more of this prompt (a guard's input and output checks share
        // their instructions): its cells are shared with this sequence, not decoded again. In a
        // unified KV cache that is a copy of cell tags (attention models only: a recurrent
        // state is one per sequence, at its end).
        let want = if logits { tokens.len() - 1 } else { tokens.len() };
        if !self.model.recurrent_state() && self.cfg.cache_slots > 1 {
            if let Some((other, n)) = self.cache.longest_elsewhere(seq as usize, tokens) {
                let n = n.min(want);
                if n > keep {
                    let shared = self.ctx.clear_kv_cache_seq(Some(seq as u32), None, None).unwrap_or(false)
                        && self.ctx.copy_kv_cache_seq(other as i32, seq, Some(0), Some(n as u32)).is_ok();
                    if shared {
                        let held = self.cache.seq(other)[..n].to_vec();
                        *self.cache.seq(seq as usize) = held;
                        keep = n;
                        // Not kept on disk here: what two slots share may run into the user's
                        // text (a guard's input and output checks share the question). The
                        // file keeps the fixed opening alone (`keep_at`).
                    } else {
                        self.reset();
                        keep = 0;
                    }
                }
            }
        }
        let mut chunk = (self.cfg.prefill_chunk.min(self.ctx.n_batch()) as usize).max(1);
        if ahead {
            chunk = chunk.min(AHEAD_CHUNK);
        }
        let mut batch = LlamaBatch::new(chunk, 1);
        let total = tokens.len() as u32;
        let mut decoded = 0u32;
        let mut logits_idx = 0;
        // What this call did: `cancelled` when it stopped before the end (between two chunks, or
        // held for speech: that chunk not decoded).
        let prefilled = |decoded, logits_idx, cancelled| Prefilled {
            decoded,
            cached: keep as u32,
            logits_idx,
            cancelled,
            secs: t.elapsed().as_secs_f64(),
        };
        let mut ends = vec![tokens.len()];
        if let Some(m) = mark.filter(|&m| m >= 16 && m > keep && m < tokens.len()) {
            ends.insert(0, m);
        }
        // The end of the role's fixed opening: the sequence holds exactly it there, which is what
        // its prefix file keeps (and, on a hybrid model, a checkpoint to rewind to).
        if let Some(k) = keep_at.filter(|&k| k > keep && k < tokens.len() && !ends.contains(&k)) {
            ends.push(k);
            ends.sort_unstable();
        }
        let mut start = keep;
        for end in ends {
            for piece in tokens[start..end].chunks(chunk) {
                if cancelled() {
                    return Ok(prefilled(decoded, logits_idx, true));
                }
                batch.clear();
                let base = self.cache.seq(seq as usize).len();
                for (j, &tok) in piece.iter().enumerate() {
                    let pos = base + j;
                    batch
                        .add(tok, pos as i32, &[seq], logits && pos + 1 == tokens.len())
                        .map_err(|e| GenerateError::Decode { pos, reason: e.to_string() })?;
                }
                match self.compute.decode(&self.cfg.role, self.ctx, &mut batch, self.cfg.threads, self.stop) {
                    Ok(true) => {}
                    // Stopped while held for speech: the chunk was not decoded.
                    Ok(false) => return Ok(prefilled(decoded, logits_idx, true)),
                    Err(e) => {
                        self.reset();
                        return Err(GenerateError::Decode { pos: base, reason: e.to_string() });
                    }
                }
                self.cache.seq(seq as usize).extend_from_slice(piece);
                decoded += piece.len() as u32;
                logits_idx = batch.n_tokens() - 1;
                if let Some(ev) = events {
                    let _ = ev.send(GenEvent::Prefill { done: keep as u32 + decoded, total, at: Instant::now() });
                }
            }
            if end < tokens.len() {
                self.take_checkpoint(end);
            }
            if keep_at == Some(end) {
                self.keep_prefix(end);
            }
            start = end;
        }
        Ok(prefilled(decoded, logits_idx, false))
    }

    /// Cells the other slots hold: a role with several shares its `n_ctx` cells among them (a
    /// unified KV cache). Counted whole, a prefix shared with this slot too: on the safe side,
    /// where a miscount costs a prefill, not a failed decode.
    fn others_len(&self) -> usize {
        if self.cfg.cache_slots <= 1 {
            return 0;
        }
        let seq = self.seq as usize;
        self.cache.seqs.iter().enumerate().filter(|(s, _)| *s != seq).map(|(_, t)| t.len()).sum()
    }

    /// Make `need` cells free for this slot: when the other slots hold too many, they give
    /// theirs up. Each prompt was only checked against `n_ctx` alone, so a guard's input and
    /// output checks of a long question (~700 tokens, on the device's 2048) had no cell left
    /// for the second: llama.cpp's decode failed, an `engine` error mid-reply, again at each
    /// long check while the other slot held its cells.
    fn make_room(&mut self, need: usize) {
        let n_ctx = self.ctx.n_ctx() as usize;
        let others = self.others_len();
        if others == 0 || others + need <= n_ctx {
            return;
        }
        tracing::debug!(role = %self.cfg.role, slot = self.seq, others, need, n_ctx, "the other slots give up their cells");
        let seq = self.seq as usize;
        for s in (0..self.cache.seqs.len()).filter(|&s| s != seq) {
            if !self.ctx.clear_kv_cache_seq(Some(s as u32), None, None).unwrap_or(false) {
                self.ctx.clear_kv_cache();
                self.cache.seqs.iter_mut().for_each(Vec::clear);
                self.cache.checkpoints.iter_mut().for_each(Vec::clear);
                return;
            }
            self.cache.seq(s).clear();
            self.cache.checkpoints(s).clear();
        }
    }

    /// Decode one token at the end of the context.
    fn step(&mut self, batch: &mut LlamaBatch, token: LlamaToken) -> Result<(), GenerateError> {
        let seq = self.seq;
        let pos = self.cache.seq(seq as usize).len();
        batch.clear();
        batch.add(token, pos as i32, &[seq], true).map_err(|e| GenerateError::Decode { pos, reason: e.to_string() })?;
        match self.compute.decode(&self.cfg.role, self.ctx, batch, self.cfg.threads, self.stop) {
            Ok(true) => {}
            // Stopped while held for speech: the token is not in the context.
            Ok(false) => return Err(GenerateError::Cancelled),
            Err(e) => {
                self.reset();
                return Err(GenerateError::Decode { pos, reason: e.to_string() });
            }
        }
        self.cache.seq(seq as usize).push(token);
        Ok(())
    }

    /// The first prompt after a restore: when it shares less than half of the restored tokens,
    /// the file holds another prompt's prefix under this key (the key has the model, shape and
    /// template, not the instructions or the system prompt: an update that changed the guard's
    /// prompt, a pipeline's new system prompt). It is written again from this load, instead of
    /// being restored, useless, at every start while the role prefills its prefix each time.
    fn judge_restored(&mut self, tokens: &[LlamaToken]) {
        let Some(restored) = self.cache.restored.take() else { return };
        let common = restored.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        if common * 2 < restored.len() {
            tracing::info!(
                role = %self.cfg.role,
                restored = restored.len(),
                common,
                "the prefix file holds another prompt's prefix: it will be written again"
            );
            self.cache.prefix_kept = false;
        }
    }

    /// Write this sequence (holding exactly its `n` cached tokens) as the role's prefix file,
    /// once per load. A failure is logged and costs only the next load a prefill.
    fn keep_prefix(&mut self, n: usize) {
        if self.cache.prefix_kept || n < 16 {
            return;
        }
        self.cache.prefix_kept = true;
        let Some((path, key)) = crate::prefix_file::path(self.cfg, self.model) else { return };
        let tokens = self.cache.seq(self.seq as usize).clone();
        match crate::prefix_file::save(self.ctx, self.seq, &tokens, &path, &key) {
            Ok(bytes) => {
                tracing::info!(role = %self.cfg.role, tokens = n, bytes, file = %path.display(), "prefix kept for the next load")
            }
            Err(e) => tracing::warn!(role = %self.cfg.role, "prefix not kept: {e}"),
        }
    }

    /// The free `take_checkpoint`, on this run's sequence.
    fn take_checkpoint(&mut self, pos: usize) {
        take_checkpoint(self.ctx, self.cache, self.model, self.cfg, self.seq, pos);
    }

    /// Restore this sequence's latest checkpoint at or before `limit` tokens, and drop the KV
    /// after it; the position it is at.
    fn rewind_to_checkpoint(&mut self, limit: usize) -> Option<usize> {
        let seq = self.seq;
        let c = self.cache.checkpoint_at_or_before(seq as usize, limit)?;
        let pos = c.pos;
        let ok = self.ctx.state_seq_set(&c.state, seq).is_ok()
            && self.ctx.clear_kv_cache_seq(Some(seq as u32), Some(pos as u32), None).unwrap_or(false);
        ok.then_some(pos)
    }

    /// Forget this sequence (after a failed decode its KV state is unknown).
    fn reset(&mut self) {
        let seq = self.seq;
        if !self.ctx.clear_kv_cache_seq(Some(seq as u32), None, None).unwrap_or(false) {
            self.ctx.clear_kv_cache();
            self.cache.seqs.clear();
            self.cache.checkpoints.clear();
        }
        self.cache.seq(seq as usize).clear();
        self.cache.checkpoints(seq as usize).clear();
    }
}

/// At load: the role's prefix file, if any and intact, into slot 0 (see `prefix_file`).
pub fn restore_prefix(ctx: &mut LlamaContext<'_>, cache: &mut Cache, model: &SharedModel, cfg: &RoleParams) {
    let Some((path, key)) = crate::prefix_file::path(cfg, model) else { return };
    if !path.exists() {
        return;
    }
    match crate::prefix_file::restore(ctx, 0, &path, &key) {
        Ok(tokens) => {
            tracing::info!(role = %cfg.role, tokens = tokens.len(), file = %path.display(), "prefix restored");
            let n = tokens.len();
            cache.restored = Some(tokens.clone());
            *cache.seq(0) = tokens;
            cache.prefix_kept = true;
            // A hybrid model's state there is also the first checkpoint: every conversation
            // departs from it, and its state cannot be cut back to it later.
            take_checkpoint(ctx, cache, model, cfg, 0, n);
        }
        // A bad file goes (it is written again from this load); one that could not be read
        // now (a passing I/O error) stays for the next load.
        Err(e @ crate::prefix_file::PrefixFileError::Invalid(..)) => {
            tracing::warn!(role = %cfg.role, "prefix file not used, prefilling normally: {e}");
            let _ = std::fs::remove_file(&path);
        }
        Err(e) => tracing::warn!(role = %cfg.role, "prefix file not read, prefilling normally: {e}"),
    }
}

/// Hybrid models: keep sequence `seq`'s recurrent state (it holds exactly `pos` tokens) as a
/// checkpoint. Attention models cut their KV back instead and keep none.
fn take_checkpoint(
    ctx: &mut LlamaContext<'_>,
    cache: &mut Cache,
    model: &SharedModel,
    cfg: &RoleParams,
    seq: i32,
    pos: usize,
) {
    if cfg.checkpoints == 0 || !model.recurrent_state() {
        return;
    }
    if let Ok(state) = ctx.state_seq_get(seq, LlamaStateSeqFlags::PARTIAL_ONLY) {
        cache.add_checkpoint(seq as usize, pos, state, cfg.checkpoints as usize);
    }
}

/// The sequence for a requested slot; slots beyond the role's `cache_slots` share the last.
fn slot(cfg: &RoleParams, requested: u32) -> i32 {
    requested.min(cfg.cache_slots.max(1) - 1) as i32
}

/// Run a generation job. Always sends exactly one `Finished` event. Returns the tokens it
/// generated (counted by the role, e.g. for a job whose listener vanished).
pub fn run(
    ctx: &mut LlamaContext<'_>,
    cache: &mut Cache,
    model: &SharedModel,
    cfg: &RoleParams,
    compute: &Compute,
    job: Job,
) -> u32 {
    let events = job.events.clone();
    let seq = slot(cfg, job.request.slot);
    let stop = || job.cancel.is_cancelled() || job.events.is_closed();
    let mut run = Run { ctx, seq, cache, model, cfg, compute, stop: &stop };
    let result = generate(&mut run, &job).map_err(LlmError::from);
    let generated = result.as_ref().map(|s| s.metrics.generated_tokens).unwrap_or(0);
    let _ = events.send(GenEvent::Finished(result));
    generated
}

/// Where a role's fixed opening ends in `tokens`, while it is not on disk yet, or (a hybrid
/// model) while its sequence has no checkpoint. With `fixed` (a guard's instructions): up to
/// that point of the messages. Else, for a one-slot role: the template's start with the
/// request's system messages, up to the first user text. Either is found as what two probe
/// prompts share, the opening followed by "a" and by "b" (a token the next text could merge
/// with is left out). Kept in the role's prefix file, the next load restores it: a Thinker's
/// system prompt or a guard's instructions are prefilled once per model and context shape, not
/// once per start of the daemon (Android stops idle services). Kept as a checkpoint, a new
/// conversation rewinds to it instead of starting over. Nothing past it is ever kept on disk.
fn fixed_opening(
    run: &mut Run<'_, '_>,
    messages: &[ChatMessage],
    tokens: &[LlamaToken],
    fixed: Option<FixedPart>,
) -> Option<usize> {
    run.judge_restored(tokens);
    let for_file = !run.cache.prefix_kept && run.cfg.prefix_dir.is_some();
    let for_checkpoint =
        run.cfg.checkpoints >= 2 && run.model.recurrent_state() && run.cache.checkpoints(run.seq as usize).is_empty();
    if (fixed.is_none() && run.cfg.cache_slots > 1) || !(for_file || for_checkpoint) {
        return None;
    }
    // The messages before the fixed part's end, and the head of the one it ends in.
    let (before, head) = match fixed {
        Some(f) => {
            let m = messages.get(f.message);
            let head = m.map_or(Some(("user", "")), |m| m.content.get(..f.bytes).map(|h| (m.role.as_str(), h)))?;
            (messages[..f.message.min(messages.len())].to_vec(), head)
        }
        None => (messages.iter().take_while(|m| m.role == "system").cloned().collect(), ("user", "")),
    };
    let probe = |text: &str| {
        let mut m = before.clone();
        m.push(ChatMessage::new(head.0, format!("{}{text}", head.1)));
        run.tokenize(&m, "", false).ok().map(|(t, _, _)| t)
    };
    let (a, b) = (probe("a")?, probe("b")?);
    let n = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    (n >= 16 && n < tokens.len() && tokens[..n] == a[..n]).then_some(n)
}

/// Whether a generation with this request budget reasons: a budget bounds the reasoning of a
/// role that reasons; it never turns it on.
fn thinks(cfg: &RoleParams, budget: Option<u32>) -> bool {
    cfg.thinking && budget.or(cfg.thinking_budget) != Some(0)
}

/// The request's messages with the oldest half of its history left out, again, until the prompt
/// leaves `room` tokens for what comes after it (at most half the context) or none is left: the
/// messages, how many were dropped, and the prompt's tokens ([`Run::tokenize`]). Half at a time,
/// so that the next turns find the shorter history's start cached (one pair at a time would
/// change the prompt's start at every turn, all of it prefilled again).
/// A prefill ahead of the generation (`prefill_ahead`) leaves out the same messages.
#[allow(clippy::type_complexity)]
fn fitted(
    run: &Run<'_, '_>,
    messages: &[ChatMessage],
    history: Option<(usize, usize)>,
    answer_prefix: &str,
    room: u32,
    thinking: bool,
) -> Result<(Vec<ChatMessage>, usize, (Vec<LlamaToken>, usize, bool)), GenerateError> {
    let mut messages = messages.to_vec();
    let history = history.filter(|&(s, l)| l >= 2 && s + l <= messages.len());
    let n_ctx = run.ctx.n_ctx() as usize;
    let room = (room as usize).min(n_ctx / 2);
    let (start, len) = history.unwrap_or((0, 0));
    let (mut dropped, mut left) = (0, len - len % 2);
    loop {
        match run.tokenize(&messages, answer_prefix, thinking) {
            Ok(t) if left == 0 || t.0.len() + room <= n_ctx => return Ok((messages, dropped, t)),
            Err(e) if left == 0 || !matches!(e, GenerateError::ContextOverflow { .. }) => return Err(e),
            _ => {}
        }
        // Half the pairs left, at least one.
        let cut = ((left / 2).div_ceil(2) * 2).max(2);
        messages.drain(start..start + cut);
        dropped += cut;
        left -= cut;
    }
}

/// What a generation with `opts` writes after its prompt: its most new tokens, the reasoning
/// budget (the whole generation's room when it reasons), and the room for both.
struct Room {
    max_new: u32,
    budget: u32,
    thinking: bool,
    room: u32,
}

impl Room {
    fn new(cfg: &RoleParams, opts: &GenerateOptions) -> Room {
        let max_new = opts.max_tokens.unwrap_or(cfg.sampling.max_tokens);
        let thinking = thinks(cfg, opts.thinking_budget);
        // Unbounded reasoning once hung the app: without a budget, the turn's max_tokens bounds it.
        let budget = opts.thinking_budget.or(cfg.thinking_budget).unwrap_or(max_new).max(1);
        // Room for the answer, and for the reasoning before it (and the block's close).
        let room = max_new.saturating_add(if thinking { budget.saturating_add(16) } else { 0 });
        Room { max_new, budget, thinking, room }
    }
}

fn generate(run: &mut Run<'_, '_>, job: &Job) -> Result<GenSummary, GenerateError> {
    let start = job.submitted;
    let opts = &job.request.options;
    // A vanished listener is a cancel: nobody would read what we produce.
    let cancelled = || job.cancel.is_cancelled() || job.events.is_closed();
    let Room { max_new, budget, thinking, room } = Room::new(run.cfg, opts);
    let request = &job.request;
    let (messages, dropped, (tokens, base, opened)) =
        fitted(run, &request.messages, request.history, &request.answer_prefix, room, thinking)?;
    let total = tokens.len() as u32;
    let n_ctx = run.ctx.n_ctx();
    let mut metrics = Metrics { prompt_tokens: total, ..Metrics::default() };

    // The conversation, then (when the engine opens a think block) the state where it ends,
    // then the opening.
    // Hybrid models: the conversation minus its last token first, and their recurrent state
    // there as the sequence's checkpoint: the next turn of the conversation departs from this
    // prompt after it (the answer re-rendered, the think block gone) and rewinds to it instead
    // of starting over.
    // Room for the reply beside the other slots' cells (a role with several; see `make_room`).
    run.make_room(tokens.len() + (room as usize).min(n_ctx as usize / 2));
    let hybrid = base >= 2 && run.model.recurrent_state();
    let first = if hybrid { base - 1 } else { tokens.len() };
    let keep_at = fixed_opening(run, &messages, &tokens, None);
    let mut pre =
        run.prefill(&tokens[..first], first == tokens.len(), keep_at, &cancelled, Some(&job.events), false)?;
    let rewind = Rewind { at: base };
    if first < tokens.len() && !pre.cancelled {
        run.take_checkpoint(first);
        let more = run.prefill(&tokens, true, keep_at, &cancelled, Some(&job.events), false)?;
        pre = Prefilled {
            decoded: pre.decoded + more.decoded,
            cached: pre.cached,
            logits_idx: more.logits_idx,
            cancelled: more.cancelled,
            secs: pre.secs + more.secs,
        };
    }
    metrics.cached_tokens = pre.cached;
    let summary = |stop, mut metrics: Metrics, pre: &Prefilled| {
        if metrics.ttft_ms == 0.0 {
            metrics.ttft_ms = start.elapsed().as_secs_f64() * 1e3;
        }
        Ok(GenSummary {
            stop,
            metrics,
            prefilled_tokens: pre.decoded,
            cached_tokens: pre.cached,
            dropped_messages: dropped as u32,
        })
    };
    if pre.cancelled {
        return summary(StopReason::Cancelled, metrics, &pre);
    }
    metrics.prefill_tok_s = f64::from(pre.decoded) / pre.secs.max(1e-9);

    let plan = SamplingPlan {
        base: run.cfg.sampling.clone(),
        temperature: opts.temperature.unwrap_or(run.cfg.sampling.temperature),
        seed: opts.seed.unwrap_or(run.cfg.sampling.seed),
    };
    let mut sampler = sampler::build(&plan);
    let room = n_ctx.saturating_sub(total + run.others_len() as u32);
    let vocab = run.model.model.vocab();
    let mut decoder = encoding_rs::UTF_8.new_decoder();
    let mut batch = LlamaBatch::new(1, 1);
    let mut logits_idx = pre.logits_idx;
    let mut filter = match prompt::has_think_block(run.model, run.cfg.chat_template.as_deref()) {
        true => ThinkFilter::new(opened),
        false => ThinkFilter::answering(),
    };
    let mut thought = Thought::default();
    // `used`: context cells taken since the prompt.
    let (mut generated, mut used, mut decoded) = (0u32, 0u32, 0u32);
    let mut first_at: Option<Instant> = None;
    let t_gen = Instant::now();
    let send = |pieces: Vec<Piece>, thought: &mut Thought, first_at: &mut Option<Instant>, metrics: &mut Metrics| {
        for p in pieces {
            let now = Instant::now();
            if first_at.is_none() {
                *first_at = Some(now);
                metrics.ttft_ms = (now - start).as_secs_f64() * 1e3;
            }
            let ev = match p {
                Piece::Thinking(text) => {
                    thought.started.get_or_insert(now);
                    GenEvent::Thinking { text, at: now }
                }
                Piece::Answer(text) => {
                    if metrics.ttfa_ms.is_none() {
                        metrics.ttfa_ms = Some((now - start).as_secs_f64() * 1e3);
                        thought.ended.get_or_insert(now);
                    }
                    GenEvent::Token { text, at: now }
                }
            };
            let _ = job.events.send(ev);
        }
    };

    let stop = loop {
        if cancelled() {
            break StopReason::Cancelled;
        }
        let token = sampler.sample(run.ctx, logits_idx);
        // The end of generation inside the think block ends the reasoning, not the turn: the
        // engine closes the block and the answer follows (a turn never ends on a thought).
        let eog = vocab.is_eog(token) && !opts.ignore_eos;
        if eog && filter.state() == think::State::Thinking {
            if !close_thinking(run, &mut batch, &mut used, room)? {
                break StopReason::ContextFull;
            }
            let closing = flushed(&mut decoder) + think::FORCED_CLOSE;
            send(filter.push(&closing), &mut thought, &mut first_at, &mut metrics);
            logits_idx = 0;
            continue;
        }
        if eog {
            break StopReason::Eos;
        }
        generated += 1;
        used += 1;
        let was = filter.state();
        let bytes = vocab.token_to_piece(token, false, None);
        let mut piece = String::with_capacity(utf8_room(&decoder, bytes.len()));
        let _ = decoder.decode_to_string(&bytes, &mut piece, false);
        let pieces = filter.push(&piece);
        if was == think::State::Thinking || filter.state() == think::State::Thinking {
            thought.tokens += 1;
        }
        send(pieces, &mut thought, &mut first_at, &mut metrics);
        let answering = filter.state() != think::State::Thinking;
        if answering && generated - thought.tokens >= max_new {
            break StopReason::Length;
        }
        if used >= room {
            break StopReason::ContextFull;
        }
        if cancelled() {
            break StopReason::Cancelled;
        }
        // The sampled token joins the context, so a session's next turn can reuse it.
        match run.step(&mut batch, token) {
            Err(GenerateError::Cancelled) => break StopReason::Cancelled,
            r => r?,
        }
        decoded += 1;
        logits_idx = 0;
        // Out of budget while still thinking: the engine writes the end of the block itself,
        // and the answer follows from there.
        if filter.state() == think::State::Thinking && thought.tokens >= budget {
            if !close_thinking(run, &mut batch, &mut used, room)? {
                break StopReason::ContextFull;
            }
            // A character cut by the budget stays in the thought, not at the answer's start.
            let closing = flushed(&mut decoder) + think::FORCED_CLOSE;
            send(filter.push(&closing), &mut thought, &mut first_at, &mut metrics);
        }
    };
    // Bytes of an incomplete UTF-8 sequence at the very end, and what the filter held back.
    let mut tail = String::with_capacity(utf8_room(&decoder, 0));
    let _ = decoder.decode_to_string(&[], &mut tail, true);
    let mut pieces = filter.push(&tail);
    pieces.extend(filter.finish());
    send(pieces, &mut thought, &mut first_at, &mut metrics);
    let gen_s = t_gen.elapsed().as_secs_f64();
    metrics.generated_tokens = generated;
    // Steady-state decode speed: decode steps over the whole sampling+decode loop time.
    metrics.decode_tok_s = if decoded > 0 { f64::from(decoded) / gen_s.max(1e-9) } else { 0.0 };
    if opened || thought.started.is_some() {
        metrics.thinking_tokens = Some(thought.tokens);
        let t0 = thought.started.unwrap_or(t_gen);
        metrics.thinking_ms = Some((thought.ended.unwrap_or_else(Instant::now) - t0).as_secs_f64() * 1e3);
        rewind.apply(run);
    } else {
        metrics.ttfa_ms = None;
    }
    summary(stop, metrics, &pre)
}

/// Decode the end of the think block (the template's own text, as tokens) into the sequence;
/// false when the context has no room for it.
fn close_thinking(
    run: &mut Run<'_, '_>,
    batch: &mut LlamaBatch,
    used: &mut u32,
    room: u32,
) -> Result<bool, GenerateError> {
    let close = run.model.model.vocab().tokenize(think::FORCED_CLOSE.as_bytes(), false, true);
    if *used + close.len() as u32 >= room {
        return Ok(false);
    }
    for &t in &close {
        run.step(batch, t)?;
        *used += 1;
    }
    Ok(true)
}

/// The reasoning of one request: how many tokens, when.
#[derive(Default)]
struct Thought {
    tokens: u32,
    started: Option<Instant>,
    ended: Option<Instant>,
}

/// Room for what `decoder` may write for `n` more bytes: `decode_to_string` writes only into
/// spare capacity (an empty String cannot take the U+FFFD of an unfinished character).
fn utf8_room(decoder: &encoding_rs::Decoder, n: usize) -> usize {
    decoder.max_utf8_buffer_length(n).unwrap_or(n * 3 + 16)
}

/// What the UTF-8 decoder still holds, as text (U+FFFD for an unfinished character); the
/// decoder starts afresh.
fn flushed(decoder: &mut encoding_rs::Decoder) -> String {
    let mut tail = String::with_capacity(utf8_room(decoder, 0));
    let _ = decoder.decode_to_string(&[], &mut tail, true);
    *decoder = encoding_rs::UTF_8.new_decoder();
    tail
}

/// Where the conversation ended in the sequence.
struct Rewind {
    at: usize,
}

impl Rewind {
    /// Drop the reasoning (and the answer) from the sequence: back to the end of the
    /// conversation, where the next turn's prompt departs from it. A failure only costs the
    /// next turn a longer prefill (the cache then says what the KV really holds).
    fn apply(self, run: &mut Run<'_, '_>) {
        let seq = run.seq;
        let at = match run.ctx.clear_kv_cache_seq(Some(seq as u32), Some(self.at as u32), None).unwrap_or(false) {
            true => Some(self.at),
            false => run.rewind_to_checkpoint(self.at),
        };
        match at {
            Some(at) => run.cache.truncate(seq as usize, at),
            None => {
                tracing::debug!(role = %run.cfg.role, "cannot rewind past the reasoning: the next turn prefills again");
                run.reset();
            }
        }
    }
}

/// Run a classification job. Always answers once.
pub fn run_classify(
    ctx: &mut LlamaContext<'_>,
    cache: &mut Cache,
    model: &SharedModel,
    cfg: &RoleParams,
    compute: &Compute,
    job: ClassifyJob,
) {
    let seq = slot(cfg, job.request.slot);
    // A caller gone (its receiver dropped: a turn that failed, or ended, while its check was
    // queued or running) is a cancel: nobody reads the verdict, and the checks behind it wait.
    let gone = || job.cancel.is_cancelled() || job.reply.is_closed();
    let mut run = Run { ctx, seq, cache, model, cfg, compute, stop: &gone };
    let result = classify(&mut run, &job.request, &gone).map_err(LlmError::from);
    let _ = job.reply.send(result);
}

/// Run a prefill job. Always answers once. `queued`: a request waits behind it (it stops for
/// it between two chunks, answering `busy`).
#[allow(clippy::too_many_arguments)]
pub fn run_prefill(
    ctx: &mut LlamaContext<'_>,
    cache: &mut Cache,
    model: &SharedModel,
    cfg: &RoleParams,
    compute: &Compute,
    job: PrefillJob,
    queued: &dyn Fn() -> bool,
) {
    let seq = slot(cfg, job.request.slot);
    // A decode held for speech stops waiting when the prefill is cancelled or nobody waits for
    // it; not for a request queued behind it, which the same hold holds anyway.
    let held = || job.reply.is_closed() || job.cancel.is_cancelled();
    let mut run = Run { ctx, seq, cache, model, cfg, compute, stop: &held };
    let result = prefill_ahead(&mut run, &job, queued).map_err(LlmError::from);
    let _ = job.reply.send(result);
}

/// Cells a prefill leaves free beyond its prompt in a role of several slots: a classify's
/// label steps and a blocking verdict's categories (24 tokens) after it.
const SLOT_MARGIN: usize = 64;

/// Tokens a prefill ahead decodes at a time: a request that comes while it runs waits at most
/// one such chunk (~90 ms on SmolLM2-135M here; larger chunks gain little on a CPU).
const AHEAD_CHUNK: usize = 32;

fn prefill_ahead(
    run: &mut Run<'_, '_>,
    job: &PrefillJob,
    queued: &dyn Fn() -> bool,
) -> Result<PrefillSummary, GenerateError> {
    let t = Instant::now();
    let request = &job.request;
    // The messages the generation will read: as many of the history's as fit beside its room.
    let Room { room, thinking, .. } = Room::new(run.cfg, &request.options);
    let fit = |messages: &[ChatMessage]| -> Result<Vec<ChatMessage>, GenerateError> {
        match request.history {
            Some(h) => Ok(fitted(run, messages, Some(h), "", room, thinking)?.0),
            None => Ok(messages.to_vec()),
        }
    };
    let messages = &match &request.upto {
        Upto::Check { .. } => request.messages.clone(),
        _ => fit(&request.messages)?,
    };
    let tokens = match &request.upto {
        Upto::Cut => run.tokenize_until(messages)?,
        Upto::Generation => {
            let (mut tokens, base, _) = run.tokenize(messages, "", thinking)?;
            // Where `generate` starts decoding: its hybrid pass ends before the last token of the
            // conversation, an attention model's prefill before the prompt's last token.
            let end = if base >= 2 && run.model.recurrent_state() { base - 1 } else { tokens.len() - 1 };
            tokens.truncate(end);
            tokens
        }
        Upto::Check { answer_prefix } => {
            let (mut tokens, _, _) = run.tokenize(messages, answer_prefix, false)?;
            tokens.pop();
            tokens
        }
    };
    if tokens.is_empty() {
        // A one-token prompt: its request decodes it anyway.
        return Ok(PrefillSummary { prompt_tokens: 0, prefilled_tokens: 0, ms: t.elapsed().as_secs_f64() * 1e3 });
    }
    // A caller gone (a dropped `warm()`) stops it too: it decoded to its end for nobody.
    let stop = || job.cancel.is_cancelled() || job.reply.is_closed() || queued();
    let progress = job.request.progress.as_ref();
    let role = run.cfg.role.clone();
    let stopped = || match job.cancel.is_cancelled() {
        true => GenerateError::Cancelled,
        false => GenerateError::Occupied(role.clone()),
    };
    let keep_at = fixed_opening(run, messages, &tokens, request.fixed);
    // A hybrid model keeps its state where the turn's own text begins (after the history and
    // the last message's header), once per turn: the final transcript, or a later partial, that
    // departs anywhere in the words heard rewinds there, not to the turn's start or further
    // (with 2 checkpoints, one per partial evicted it by the second partial). Not a guard's (a
    // request with a fixed part): its text begins inside the message that holds its
    // instructions, so that point is the message's header, before them; kept, it evicted the
    // checkpoint at the instructions' end, and every later check prefilled them again.
    if run.model.recurrent_state() && request.fixed.is_none() {
        let text_at = text_start(run, messages, &tokens).filter(|&u| u < tokens.len());
        let seq = run.seq as usize;
        if let Some(u) = text_at.filter(|&u| !run.cache.checkpoints(seq).iter().any(|c| c.pos == u)) {
            let pre = run.prefill(&tokens[..u], false, keep_at, &stop, progress, true)?;
            if pre.cancelled {
                return Err(stopped());
            }
            run.take_checkpoint(u);
        }
    }
    let pre = run.prefill(&tokens, false, keep_at, &stop, progress, true)?;
    if pre.cancelled {
        // What it kept stays cached for the request that stopped it (a timeline reads this).
        tracing::debug!(
            role = %run.cfg.role,
            slot = run.seq,
            prompt = tokens.len(),
            kept = pre.cached + pre.decoded,
            "prefill ahead stopped"
        );
        return Err(stopped());
    }
    tracing::debug!(
        role = %run.cfg.role,
        slot = run.seq,
        prompt = tokens.len(),
        cached = pre.cached,
        prefilled = pre.decoded,
        ms = t.elapsed().as_secs_f64() * 1e3,
        "prefilled ahead"
    );
    Ok(PrefillSummary {
        prompt_tokens: tokens.len() as u32,
        prefilled_tokens: pre.decoded,
        ms: t.elapsed().as_secs_f64() * 1e3,
    })
}

/// Where the last message's text begins in `tokens`, `messages`' prompt (its header before it):
/// the same messages with that text replaced by the cut mark, tokenized up to it, when the
/// prompt starts with those tokens.
fn text_start(run: &Run<'_, '_>, messages: &[ChatMessage], tokens: &[LlamaToken]) -> Option<usize> {
    let mut probe = messages.to_vec();
    probe.last_mut()?.content = PREFILL_CUT.to_string();
    let head = run.tokenize_until(&probe).ok()?;
    tokens.starts_with(&head).then_some(head.len())
}

fn log_softmax_at(logits: &[f32], ids: &[LlamaToken]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln();
    ids.iter().map(|t| logits[t.0 as usize] - lse).collect()
}

/// The most tokens a classify decodes after its prompt: two labels sharing their first `k`
/// tokens are told apart after `k` decodes, unless one of them ends first (it wins there).
fn shared_label_steps<T: PartialEq>(seqs: &[Vec<T>]) -> usize {
    let mut most = 0;
    for (i, a) in seqs.iter().enumerate() {
        for b in &seqs[i + 1..] {
            let shared = a.iter().zip(b).take_while(|(x, y)| x == y).count();
            most = most.max(shared.min(a.len().min(b.len()).saturating_sub(1)));
        }
    }
    most
}

fn classify(
    run: &mut Run<'_, '_>,
    req: &ClassifyRequest,
    cancelled: &dyn Fn() -> bool,
) -> Result<Classification, GenerateError> {
    let t = Instant::now();
    if req.labels.is_empty() {
        return Err(GenerateError::Prompt("no labels to choose from".into()));
    }
    let (tokens, _, _) = run.tokenize(&req.messages, &req.answer_prefix, false)?;
    let vocab = run.model.model.vocab();
    // Each label as it would continue the prompt: " Safe", " Unsafe", …
    let seqs: Vec<Vec<LlamaToken>> = req.labels.iter().map(|l| vocab.tokenize(l.as_bytes(), false, false)).collect();
    // A token that labels share is one more decode after the prompt: past the context it
    // failed as an `engine` error (the slot's cache reset with it), where a `context_overflow`
    // lets the runner shorten the checked text.
    let steps = shared_label_steps(&seqs);
    let n_ctx = run.ctx.n_ctx();
    if tokens.len() + steps > n_ctx as usize {
        return Err(GenerateError::ContextOverflow { role: run.cfg.role.clone(), prompt: tokens.len() + steps, n_ctx });
    }
    if !req.reuse_cache {
        run.reset();
    }
    let keep_at = fixed_opening(run, &req.messages, &tokens, req.fixed);
    let pre = run.prefill(&tokens, true, keep_at, cancelled, None, false)?;
    if pre.cancelled {
        return Err(GenerateError::Cancelled);
    }
    let mut alive: Vec<usize> = (0..seqs.len()).filter(|&i| !seqs[i].is_empty()).collect();
    // Labels that are all empty text once panicked the role's worker (a zombie role: loaded in
    // status, `no_model` for every request after).
    if alive.is_empty() {
        return Err(GenerateError::Prompt(format!("no label has any token to compare: {:?}", req.labels)));
    }
    let mut depth = 0;
    let mut logits_idx = pre.logits_idx;
    let mut scores: Option<Vec<(String, f32)>> = None;
    let mut batch = LlamaBatch::new(1, 1);
    let mut extra = 0u32;
    let chosen = loop {
        let logits = run.ctx.get_logits_ith(logits_idx);
        let next: Vec<LlamaToken> = alive.iter().map(|&i| seqs[i][depth]).collect();
        let lp = log_softmax_at(logits, &next);
        // The first position where the survivors differ decides; report it as probabilities.
        let distinct = next.iter().any(|t| *t != next[0]);
        if scores.is_none() && (distinct || alive.len() == 1) {
            let z = lp.iter().map(|v| v.exp()).sum::<f32>().max(f32::MIN_POSITIVE);
            scores = Some(alive.iter().zip(&lp).map(|(&i, v)| (req.labels[i].clone(), v.exp() / z)).collect());
        }
        let best = next[lp.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(k, _)| k).unwrap()];
        alive.retain(|&i| seqs[i][depth] == best);
        // A label complete at this depth wins over longer ones sharing its tokens.
        if let Some(&done) = alive.iter().find(|&&i| seqs[i].len() == depth + 1) {
            break done;
        }
        if alive.len() == 1 {
            break alive[0];
        }
        if cancelled() {
            return Err(GenerateError::Cancelled);
        }
        // Labels share this token: decode it and compare what follows.
        run.step(&mut batch, best)?;
        extra += 1;
        logits_idx = 0;
        depth += 1;
    };
    tracing::debug!(
        role = %run.cfg.role,
        slot = run.seq,
        prompt = tokens.len(),
        cached = pre.cached,
        prefilled = pre.decoded,
        prefill_ms = pre.secs * 1e3,
        label_steps = extra,
        ms = t.elapsed().as_secs_f64() * 1e3,
        "classified"
    );
    let mut scores = scores.unwrap_or_default();
    for l in &req.labels {
        if !scores.iter().any(|(s, _)| s == l) {
            scores.push((l.clone(), 0.0));
        }
    }
    Ok(Classification {
        label: req.labels[chosen].clone(),
        scores,
        prompt_tokens: tokens.len() as u32,
        prefilled_tokens: pre.decoded + extra,
        label_steps: extra,
        ms: t.elapsed().as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::shared_label_steps;

    /// The decodes a classify may add after its prompt, as its loop takes them.
    #[test]
    fn label_steps_count_shared_tokens_until_one_label_ends() {
        assert_eq!(shared_label_steps(&[vec![1], vec![2], vec![3, 4]]), 0, "apart at once");
        assert_eq!(shared_label_steps(&[vec![1, 2, 3], vec![1, 2, 4]]), 2);
        assert_eq!(shared_label_steps(&[vec![1], vec![1, 2]]), 0, "the short one wins where it ends");
        assert_eq!(shared_label_steps(&[vec![1, 2], vec![1, 2, 3]]), 1);
        assert_eq!(shared_label_steps(&[vec![1, 5], vec![1, 2, 3], vec![1, 2, 4]]), 2);
        assert_eq!(shared_label_steps::<u32>(&[]), 0);
    }
}
