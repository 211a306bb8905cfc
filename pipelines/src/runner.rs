//! The runner: executes one turn of a pipeline and streams protocol events.
//!
//! The guarded cascade (`guarded-chat`): the input guard and the Thinker start together
//! (`overlap`); Thinker text is held until the input verdict. Then the reply is cut into
//! sentences; each goes to the output guard — in the context of the question and the reply so
//! far — while the Thinker writes the next, and is released (its `token`s, then a `sentence`)
//! only once it passed. A blocking verdict cancels the Thinker at once and the refusal is sent
//! instead. Guarantee: no Thinker text leaves the runner before both guards passed it; unlike
//! NeMo Guardrails' `stream_first`, nothing is shown first and checked after.
//!
//! Reasoning (`GenEvent::Thinking`) is never answer text: no `token`, `sentence`, speech or
//! history. A client that asked for it (`show_thinking`) gets `thinking` events, which pass the
//! output guard sentence by sentence like the reply (verdicts with stage `thinking`), before
//! any of the reply.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use kazeia_ipc::{ErrorCode, Event, Metrics, StopReason};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::definition::{Pipeline, Plan};
use crate::guard::{parse_categories, Check, GuardPolicy, Label};
use crate::session::Sessions;
use crate::split::{first_clause, first_sentence};
use kazeia_engine::api::{ChatMessage, GenEvent, GenSummary, GenerateOptions, GenerateRequest, Llm, LlmError};

/// The input of one turn.
#[derive(Debug, Clone, Default)]
pub struct TurnInput {
    /// Client-chosen request id, echoed in every event.
    pub id: Option<String>,
    pub text: String,
    pub options: GenerateOptions,
    /// Conversation to continue (see [`Sessions`]).
    pub session: Option<String>,
    /// Send the model's reasoning as `thinking` events (guarded like the reply).
    pub show_thinking: bool,
    /// A reply started before the user's turn had ended (a voice turn's preemptive start): it
    /// joins the session only once this says `true`; dropped (or the turn cancelled), never.
    pub confirmed: Option<tokio::sync::watch::Receiver<bool>>,
}

/// What a turn runs with.
pub struct Engines<'a> {
    pub llm: &'a dyn Llm,
    pub policy: &'a GuardPolicy,
    pub sessions: Option<&'a Sessions>,
}

/// A guard decision.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub label: Label,
    pub categories: Vec<String>,
    pub ms: f64,
    /// Decided by the rule layer, without the model.
    pub by_rule: bool,
}

/// A guard role's checks in a turn: the engine, the policy, the role, and whether its prefix
/// cache is used (the pipeline's `prefix_cache`).
#[derive(Clone, Copy)]
pub struct Guard<'a> {
    pub llm: &'a dyn Llm,
    pub policy: &'a GuardPolicy,
    pub role: &'a str,
    pub reuse_cache: bool,
}

impl Guard<'_> {
    /// One guard check: the rule layer, then the model (one pass), then categories when it blocks.
    /// A question longer than the guard's context is judged in parts, halved until each fits, and
    /// the worst verdict stands (it failed with `context_overflow`: a pasted article could not be
    /// asked about through a guarded pipeline, the device's guard holding 2048 tokens).
    /// `unit`: what this check decides (the question, or the reply's newest unit): a rule that
    /// passes decides only the text it matches there.
    pub async fn check(
        self,
        check: Check,
        user: &str,
        reply: &str,
        unit: &str,
        cancel: CancellationToken,
    ) -> Result<Verdict, LlmError> {
        let Guard { policy, .. } = self;
        let t = Instant::now();
        let overflow = match self.check_once(check, user, reply, unit, cancel.clone()).await {
            Err(e) if e.code == ErrorCode::ContextOverflow && check == Check::Input => e,
            other => return other,
        };
        let mut parts: VecDeque<String> = halves(user).into();
        let mut worst: Option<Verdict> = None;
        let mut checks = 0;
        while let Some(part) = parts.pop_front() {
            // A megabyte of text was ~170 checks of the whole context (hours of the device's
            // guard, every other guarded turn `busy` behind them).
            checks += 1;
            if checks > MAX_CHECKS {
                let msg =
                    format!("the question is too long for the guard to judge (over {MAX_CHECKS} checks of its parts)");
                return Err(LlmError::new(ErrorCode::ContextOverflow, msg));
            }
            match self.check_once(check, &part, reply, &part, cancel.clone()).await {
                Ok(v) => {
                    let blocks = policy.blocks(v.label);
                    worst = Some(match worst {
                        Some(w) if w.label.severity() >= v.label.severity() => w,
                        _ => v,
                    });
                    if blocks {
                        break;
                    }
                }
                Err(e) if e.code == ErrorCode::ContextOverflow => match halves(&part) {
                    [a, b] if !a.is_empty() && !b.is_empty() => {
                        parts.push_front(b);
                        parts.push_front(a);
                    }
                    _ => return Err(overflow),
                },
                Err(e) => return Err(e),
            }
        }
        let mut v = worst.ok_or(overflow)?;
        v.ms = t.elapsed().as_secs_f64() * 1e3;
        Ok(v)
    }

    /// [`Guard::check`], in one pass.
    async fn check_once(
        self,
        check: Check,
        user: &str,
        reply: &str,
        unit: &str,
        cancel: CancellationToken,
    ) -> Result<Verdict, LlmError> {
        let Guard { llm, policy, role, reuse_cache } = self;
        let t = Instant::now();
        let text = if check == Check::Input { user } else { reply };
        // A blocking rule reads all the check reads; one that passes decides only the text it
        // matches: the unit. (A `Safe` rule matched in a reply's first sentence passed every
        // later sentence without the model.)
        let rule = match policy.rule(check, text) {
            Some(r) if check == Check::Output && !policy.blocks(r.label) => policy.rule(check, unit),
            r => r,
        };
        if let Some(rule) = rule {
            return Ok(Verdict {
                label: rule.label,
                categories: rule.categories.clone(),
                ms: t.elapsed().as_secs_f64() * 1e3,
                by_rule: true,
            });
        }
        let p = policy.format.prompt(check, user, reply);
        let c = llm
            .classify(p.request(role, check, reuse_cache), cancel.clone())?
            .await
            .map_err(|_| LlmError::new(ErrorCode::Engine, "the guard engine stopped"))??;
        let label = p.labels.iter().find(|(s, _)| *s == c.label).map(|(_, l)| *l).unwrap_or(Label::Unsafe);
        let mut categories = Vec::new();
        if policy.blocks(label) && policy.categories {
            let opts = GenerateOptions { temperature: Some(0.0), max_tokens: Some(24), ..Default::default() };
            let mut req = GenerateRequest::new(role, p.messages, opts);
            req.answer_prefix = policy.format.categories_prefix(label);
            req.slot = check.slot();
            let mut rx = llm.generate(req, cancel)?;
            let mut text = String::new();
            while let Some(ev) = rx.recv().await {
                match ev {
                    GenEvent::Token { text: t, .. } => {
                        text.push_str(&t);
                        if text.contains('\n') && !text.trim().is_empty() {
                            break;
                        }
                    }
                    GenEvent::Finished(_) => break,
                    GenEvent::Prefill { .. } | GenEvent::Thinking { .. } => {}
                }
            }
            categories = parse_categories(&text);
        }
        Ok(Verdict { label, categories, ms: t.elapsed().as_secs_f64() * 1e3, by_rule: false })
    }

    /// The output check of `unit`, in the context of the question and of the reply before it
    /// (`earlier`). When the question and the reply so far do not fit the guard's context with its
    /// instructions (a long question: a later unit's check failed the turn mid-reply, after
    /// sentences had left), the unit is judged whole, after the reply's last words and the
    /// question's start and end. Units are at most `split::MAX_BYTES`, so that one fits.
    async fn check_output(
        self,
        question: &str,
        earlier: &str,
        unit: &str,
        cancel: CancellationToken,
    ) -> Result<Verdict, LlmError> {
        let reply = format!("{earlier}{unit}");
        match self.check(Check::Output, question, reply.trim(), unit, cancel.clone()).await {
            Err(e) if e.code == ErrorCode::ContextOverflow => {
                let reply = format!("{}{unit}", tail(earlier, SHORT));
                self.check(Check::Output, &ends(question, SHORT), reply.trim(), unit, cancel).await
            }
            other => other,
        }
    }
}

/// The most guard checks a long question's parts may take: parts of about the guard's context
/// each, some 16 of them (~100,000 characters with the device's 2048 tokens).
const MAX_CHECKS: usize = 32;

/// Bytes around the cut that both halves of a long question hold (whole words, at most an
/// eighth of the text each way): a phrase the cut falls in is also judged whole, in one of them.
const OVERLAP: usize = 160;

/// `text` in two at the space nearest its middle (its middle character without one), each half
/// running on into the other by up to [`OVERLAP`] bytes of whole words. Each is shorter than
/// `text`, so halving again ends.
fn halves(text: &str) -> [String; 2] {
    let mid = text.char_indices().nth(text.chars().count() / 2).map_or(text.len(), |(i, _)| i);
    let at = match (text[..mid].rfind(char::is_whitespace), text[mid..].find(char::is_whitespace)) {
        (Some(b), Some(a)) if mid - b <= a => b,
        (_, Some(a)) => mid + a,
        (Some(b), None) => b,
        (None, None) => mid,
    };
    let over = (text.len() / 8).min(OVERLAP);
    let end = floor_char(text, (at + over).min(text.len()));
    let start = ceil_char(text, at.saturating_sub(over));
    // The first half ends at a space, the second starts at one: no word is cut.
    let end = text[at..end].rfind(char::is_whitespace).map_or(at, |i| at + i);
    let start = text[start..at].find(char::is_whitespace).map_or(at, |i| start + i);
    [text[..end].trim().to_string(), text[start..].trim().to_string()]
}

/// What the Thinker reads for `text`: the stage's system prompt, the session's earlier turns,
/// then `text` as the user's message (a prefill ahead of time renders the same, cut short).
pub(crate) fn thinker_messages(plan: &Plan, input: &TurnInput, engines: &Engines<'_>, text: &str) -> Vec<ChatMessage> {
    let mut messages: Vec<ChatMessage> =
        plan.think_system.iter().map(|s| ChatMessage::new("system", s.clone())).collect();
    if let (Some(s), Some(store)) = (&input.session, engines.sessions) {
        messages.extend(store.history(s));
    }
    messages.push(ChatMessage::new("user", text));
    messages
}

/// Where the session's earlier turns are in the Thinker's `messages` ([`thinker_messages`]):
/// between the system prompt and the question. The engine leaves out the oldest of them when
/// the prompt would not fit (`GenerateRequest::history`), and a prefill ahead the same ones.
pub(crate) fn thinker_history(plan: &Plan, messages: &[ChatMessage]) -> Option<(usize, usize)> {
    let system = usize::from(plan.think_system.is_some());
    let history = messages.len().saturating_sub(1 + system);
    (history > 0).then_some((system, history))
}

/// Bytes kept of the question's start and of its end, and of the reply before the unit, when
/// an output check does not fit the guard's context whole: with a unit (at most
/// `split::MAX_BYTES`) and the guard's instructions, at most ~1,750 tokens (a byte-level BPE
/// spends at most one a byte), within the guard's 2048.
const SHORT: usize = 300;

/// `text`'s first and last `keep` bytes (whole characters), joined by ` … `, when it is longer
/// than both.
fn ends(text: &str, keep: usize) -> String {
    if text.len() <= 2 * keep {
        return text.to_string();
    }
    let head = &text[..floor_char(text, keep)];
    let rest = &text[ceil_char(text, text.len() - keep)..];
    format!("{head} … {rest}")
}

/// `text`'s last `keep` bytes (whole characters).
fn tail(text: &str, keep: usize) -> &str {
    &text[ceil_char(text, text.len().saturating_sub(keep))..]
}

/// The character boundary at or before byte `i`.
fn floor_char(text: &str, mut i: usize) -> usize {
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The character boundary at or after byte `i`.
fn ceil_char(text: &str, mut i: usize) -> usize {
    while !text.is_char_boundary(i) {
        i += 1;
    }
    i
}

type Pending<'a> = Pin<Box<dyn Future<Output = Result<Verdict, LlmError>> + Send + 'a>>;

/// Run one turn of `pipeline`. Every event goes to `out`; the turn always ends with exactly one
/// `done` or `error` event. A closed `out` (the client went away) cancels the turn.
pub async fn run_turn(
    pipeline: &Pipeline,
    input: TurnInput,
    engines: Engines<'_>,
    cancel: CancellationToken,
    out: mpsc::UnboundedSender<Event>,
) {
    let id = input.id.clone();
    let emit = |ev: Event| {
        if out.send(ev).is_err() {
            // Nobody listens any more: stop the engines within one token.
            cancel.cancel();
        }
    };
    // A cancelled turn ends with `done` (stop = cancelled), whatever stage it was in.
    let fail = |e: LlmError| {
        if cancel.is_cancelled() {
            emit(Event::Done { id: id.clone(), stop: StopReason::Cancelled, metrics: Metrics::default() });
        } else {
            emit(Event::error(id.clone(), e.code, e.message, true));
        }
    };
    let plan = match pipeline.plan() {
        Ok(p) => p,
        Err(m) => return fail(LlmError::new(ErrorCode::Pipeline, m)),
    };
    let t0 = Instant::now();
    let ms = |t: Instant| t.duration_since(t0).as_secs_f64() * 1e3;
    let (llm, policy) = (engines.llm, engines.policy);
    let user = ChatMessage::new("user", input.text.clone());
    let messages = thinker_messages(&plan, &input, &engines, &input.text);
    let verdict_event = |stage: Check, v: &Verdict| Event::Verdict {
        id: id.clone(),
        stage: stage.as_str().to_string(),
        label: v.label.as_str().to_string(),
        categories: v.categories.clone(),
        ms: v.ms,
    };
    let refuse = |metrics: Metrics, categories: &[String]| {
        let text = policy.refusal_for(categories, &input.text).to_string();
        emit(Event::Token { id: id.clone(), text: text.clone() });
        emit(Event::Sentence { id: id.clone(), text });
        emit(Event::Done { id: id.clone(), stop: StopReason::Blocked, metrics });
    };

    let mut guard_in: Option<Pending> = plan.input_guard.as_ref().map(|role| {
        let guard = Guard { llm, policy, role, reuse_cache: pipeline.prefix_cache };
        Box::pin(guard.check(Check::Input, &input.text, "", &input.text, cancel.child_token())) as Pending
    });

    // Guard-only pipeline: the verdict is the answer.
    let Some(think_role) = plan.think.clone() else {
        let Some(g) = guard_in else { return fail(LlmError::new(ErrorCode::Pipeline, "empty pipeline")) };
        match g.await {
            Ok(v) => {
                emit(verdict_event(Check::Input, &v));
                let metrics = Metrics { guard_in_ms: Some(v.ms), ..Metrics::default() };
                let stop = if policy.blocks(v.label) { StopReason::Blocked } else { StopReason::Eos };
                emit(Event::Done { id: id.clone(), stop, metrics });
            }
            Err(e) => fail(e),
        }
        return;
    };

    let thinker_cancel = cancel.child_token();
    let mut options = input.options.clone();
    options.thinking_budget = options.thinking_budget.or(plan.think_budget);
    let mut request = GenerateRequest::new(&think_role, messages, options);
    request.history = thinker_history(&plan, &request.messages);
    let mut thinker: Option<mpsc::UnboundedReceiver<GenEvent>> = None;
    if guard_in.is_none() || pipeline.overlap {
        match llm.generate(request.clone(), thinker_cancel.clone()) {
            Ok(rx) => thinker = Some(rx),
            Err(e) => return fail(e),
        }
    }
    let output_guard = plan.output_guard.clone();
    let mut input_passed = guard_in.is_none();
    let mut guard_in_ms = None;
    let mut tokens_held = 0u32;
    // Text not yet released, as the Thinker's pieces; `queued` bytes of it are whole sentences
    // waiting for (or in) the output guard.
    let mut pending: VecDeque<String> = VecDeque::new();
    let mut pending_text = String::new();
    let mut queued: VecDeque<usize> = VecDeque::new();
    let mut queued_bytes = 0usize;
    let mut released = String::new();
    let mut out_check: Option<Pending> = None;
    // A spoken reply's unit under the output check pauses the Thinker until the speaker takes
    // it (see `RolePause`); not with one role for both (the check would wait on itself).
    let pause_thinker = plan.speak && output_guard.as_ref().is_some_and(|g| *g != think_role);
    let mut paused: Option<kazeia_engine::RolePause> = None;
    let mut guard_out_ms = 0.0;
    let mut first_release: Option<Instant> = None;
    let mut first_sentence_at: Option<Instant> = None;
    let mut summary: Option<GenSummary> = None;
    // Reasoning the client asked to see: `thought` is the unfinished sentence; `thoughts` whole
    // units waiting for the input verdict or the output guard (always before any reply text).
    let mut thought = String::new();
    let mut thoughts: VecDeque<String> = VecDeque::new();
    let mut checking_thought = false;
    // The reasoning released so far: each unit of it is judged after it, as a reply's sentence
    // is after the reply before it (a procedure spread over harmless steps passed step by step).
    let mut released_thoughts = String::new();

    // Release `n` bytes of pending text as token events (splitting a piece at the boundary).
    let release = |n: usize,
                   pending: &mut VecDeque<String>,
                   pending_text: &mut String,
                   released: &mut String,
                   first: &mut Option<Instant>| {
        let mut left = n;
        while left > 0 {
            let Some(mut piece) = pending.pop_front() else { break };
            if piece.len() > left {
                let rest = piece.split_off(left);
                pending.push_front(rest);
            }
            left -= piece.len();
            if !piece.is_empty() {
                first.get_or_insert_with(Instant::now);
                emit(Event::Token { id: id.clone(), text: piece });
            }
        }
        released.push_str(&pending_text[..n]);
        pending_text.drain(..n);
    };

    // A spoken reply with no output guard (a pipeline `[think, speak]`): its released text goes
    // to the speaker sentence by sentence as well (the speaker speaks `sentence` events, which
    // only the output guard's path sent: such a pipeline said nothing). `spoken`: the bytes of
    // `released` sent so far; `end`: the last, unfinished sentence too.
    let mut spoken = 0;
    let speak_released = |released: &str, spoken: &mut usize, end: bool| {
        while *spoken < released.len() {
            let rest = &released[*spoken..];
            let n = match first_sentence(rest) {
                Some(n) => n,
                None if end => rest.len(),
                None => break,
            };
            if !rest[..n].trim().is_empty() {
                emit(Event::Sentence { id: id.clone(), text: rest[..n].trim().to_string() });
            }
            *spoken += n;
        }
    };
    let speaks_unguarded = plan.speak && output_guard.is_none();

    loop {
        // Unguarded output: reasoning held for the input verdict leaves once it passed.
        if input_passed && output_guard.is_none() && !cancel.is_cancelled() {
            while let Some(text) = thoughts.pop_front() {
                emit(Event::Thinking { id: id.clone(), text });
            }
            if speaks_unguarded {
                speak_released(&released, &mut spoken, false);
            }
        }
        // Feed the output guard the next sentence once the input guard passed (not after a
        // cancel: nothing more will be released). Reasoning first: it came first.
        if input_passed && out_check.is_none() && !cancel.is_cancelled() {
            if let (Some(role), Some(unit)) = (&output_guard, thoughts.front()) {
                let (role, user_text, unit) = (role.clone(), input.text.clone(), unit.trim().to_string());
                let (c, reuse_cache, earlier) =
                    (cancel.child_token(), pipeline.prefix_cache, released_thoughts.clone());
                checking_thought = true;
                out_check = Some(Box::pin(async move {
                    Guard { llm, policy, role: &role, reuse_cache }.check_output(&user_text, &earlier, &unit, c).await
                }));
            } else if let (Some(role), Some(&n)) = (&output_guard, queued.front()) {
                checking_thought = false;
                if pause_thinker {
                    paused = Some(kazeia_engine::RolePause::take(&think_role, role));
                }
                let (earlier, unit) = (released.clone(), pending_text[..n].to_string());
                let (role, user_text) = (role.clone(), input.text.clone());
                let (c, reuse_cache) = (cancel.child_token(), pipeline.prefix_cache);
                out_check = Some(Box::pin(async move {
                    Guard { llm, policy, role: &role, reuse_cache }.check_output(&user_text, &earlier, &unit, c).await
                }));
            }
        }
        let finished = summary.is_some()
            && (cancel.is_cancelled()
                || (input_passed && out_check.is_none() && queued.is_empty() && thoughts.is_empty()));
        if finished {
            break;
        }
        tokio::select! {
            v = async { guard_in.as_mut().unwrap().await }, if guard_in.is_some() => {
                guard_in = None;
                let v = match v {
                    Ok(v) => v,
                    Err(e) => {
                        thinker_cancel.cancel();
                        return fail(e);
                    }
                };
                guard_in_ms = Some(v.ms);
                emit(verdict_event(Check::Input, &v));
                if policy.blocks(v.label) {
                    thinker_cancel.cancel();
                    let metrics = Metrics { guard_in_ms, tokens_held: Some(tokens_held), ..Metrics::default() };
                    return refuse(metrics, &v.categories);
                }
                input_passed = true;
                if thinker.is_none() {
                    match llm.generate(request.clone(), thinker_cancel.clone()) {
                        Ok(rx) => thinker = Some(rx),
                        Err(e) => return fail(e),
                    }
                }
                // (After a cancel, nothing held is released.)
                if output_guard.is_none() && !cancel.is_cancelled() {
                    // Reasoning held for the verdict leaves before the reply it preceded.
                    while let Some(text) = thoughts.pop_front() {
                        emit(Event::Thinking { id: id.clone(), text });
                    }
                    let n = pending_text.len();
                    release(n, &mut pending, &mut pending_text, &mut released, &mut first_release);
                }
            }
            ev = async { thinker.as_mut().unwrap().recv().await }, if thinker.is_some() && summary.is_none() => {
                // The reasoning is over once the answer starts (or the Thinker stops): its last
                // unfinished sentence is a unit of its own.
                if matches!(ev, Some(GenEvent::Token { .. } | GenEvent::Finished(_))) && !thought.trim().is_empty() {
                    thoughts.push_back(std::mem::take(&mut thought));
                }
                match ev {
                    Some(GenEvent::Thinking { text, .. }) => {
                        if input.show_thinking {
                            if output_guard.is_some() {
                                thought.push_str(&text);
                                while let Some(n) = first_sentence(&thought) {
                                    thoughts.push_back(thought.drain(..n).collect());
                                }
                            } else if input_passed && !cancel.is_cancelled() {
                                emit(Event::Thinking { id: id.clone(), text });
                            } else {
                                thoughts.push_back(text);
                            }
                        }
                    }
                    Some(GenEvent::Token { text, .. }) => {
                        if !input_passed {
                            tokens_held += 1;
                        }
                        pending_text.push_str(&text);
                        pending.push_back(text);
                        if output_guard.is_some() {
                            loop {
                                // The reply's first unit may be a clause (a spoken reply's
                                // first sound sooner); every later one is a sentence.
                                let first = pipeline.first_clause && released.is_empty() && queued.is_empty();
                                let rest = &pending_text[queued_bytes..];
                                let Some(n) = (if first { first_clause(rest) } else { first_sentence(rest) }) else {
                                    break;
                                };
                                queued.push_back(queued_bytes + n);
                                queued_bytes += n;
                            }
                        } else if input_passed && !cancel.is_cancelled() {
                            let n = pending_text.len();
                            release(n, &mut pending, &mut pending_text, &mut released, &mut first_release);
                        }
                    }
                    Some(GenEvent::Prefill { .. }) => {}
                    Some(GenEvent::Finished(Ok(s))) => {
                        // The unfinished last sentence is checked as it is.
                        if output_guard.is_some() && !pending_text[queued_bytes..].trim().is_empty() {
                            queued.push_back(pending_text.len());
                            queued_bytes = pending_text.len();
                        }
                        summary = Some(s);
                    }
                    Some(GenEvent::Finished(Err(e))) => return fail(e),
                    None => return fail(LlmError::new(ErrorCode::Engine, "the engine stopped without finishing the turn")),
                }
            }
            v = async { out_check.as_mut().unwrap().await }, if out_check.is_some() => {
                out_check = None;
                // The unit (or the refusal in its place) goes to the speaker, unless the turn
                // was cancelled (nothing more is spoken).
                if let (Ok(_), Some(p), false) = (&v, paused.take(), cancel.is_cancelled()) {
                    p.to_speech();
                }
                // A verdict ready when the cancel came: the unit is not released (the Thinker,
                // cancelled too, finishes the loop).
                if cancel.is_cancelled() {
                    continue;
                }
                let v = match v {
                    Ok(v) => v,
                    Err(e) => {
                        thinker_cancel.cancel();
                        return fail(e);
                    }
                };
                guard_out_ms += v.ms;
                if checking_thought {
                    let mut e = verdict_event(Check::Output, &v);
                    if let Event::Verdict { stage, .. } = &mut e {
                        *stage = "thinking".into();
                    }
                    emit(e);
                } else {
                    emit(verdict_event(Check::Output, &v));
                }
                if policy.blocks(v.label) {
                    thinker_cancel.cancel();
                    let metrics = Metrics { guard_in_ms, guard_out_ms: Some(guard_out_ms), tokens_held: Some(tokens_held), ..Metrics::default() };
                    return refuse(metrics, &v.categories);
                }
                if checking_thought {
                    let text = thoughts.pop_front().expect("a thought was being checked");
                    released_thoughts.push_str(text.trim());
                    released_thoughts.push(' ');
                    emit(Event::Thinking { id: id.clone(), text });
                    continue;
                }
                let end = queued.pop_front().expect("a sentence was being checked");
                // Offsets of the remaining queued sentences shift by what is released now.
                for q in queued.iter_mut() {
                    *q -= end;
                }
                queued_bytes -= end;
                let sentence = pending_text[..end].trim().to_string();
                release(end, &mut pending, &mut pending_text, &mut released, &mut first_release);
                first_sentence_at.get_or_insert_with(Instant::now);
                emit(Event::Sentence { id: id.clone(), text: sentence });
            }
        }
    }

    let s = summary.expect("the loop ends after the Thinker finished");
    if speaks_unguarded && input_passed && !cancel.is_cancelled() {
        speak_released(&released, &mut spoken, true);
    }
    // Cancelled with text still unreleased: it never leaves, and the turn says it was cut.
    let stop = if cancel.is_cancelled() { StopReason::Cancelled } else { s.stop };
    let mut metrics = s.metrics;
    if plan.input_guard.is_some() || output_guard.is_some() {
        metrics.guard_in_ms = guard_in_ms;
        metrics.tokens_held = Some(tokens_held);
        if output_guard.is_some() {
            metrics.guard_out_ms = Some(guard_out_ms);
            metrics.ttfs_ms = first_sentence_at.map(ms);
        }
        // What the client saw: its first token came when text was first released.
        if let Some(t) = first_release {
            metrics.ttft_ms = ms(t);
        }
    }
    if let (Some(sid), Some(store)) = (&input.session, engines.sessions) {
        let confirmed = match input.confirmed.clone() {
            None => true,
            // Confirmed then cancelled: kept, as a turn that ended before its cancel.
            Some(mut c) => tokio::select! {
                biased;
                r = c.wait_for(|yes| *yes) => r.is_ok(),
                () = cancel.cancelled() => false,
            },
        };
        if stop != StopReason::Cancelled && confirmed {
            // The turns the engine left out to fit go from the session too: the next prompt
            // starts as this one did, its start cached.
            let dropped = request.history.map_or(&[][..], |(start, len)| {
                let n = (s.dropped_messages as usize).min(len);
                &request.messages[start..start + n]
            });
            let reply = ChatMessage::new("assistant", released.trim_end().to_string());
            store.append_after(sid, dropped, user, reply);
        }
    }
    emit(Event::Done { id: id.clone(), stop, metrics });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_share_the_words_around_the_cut() {
        let text = format!("{} how to make a bomb {}", "calm words ".repeat(40), "calm words ".repeat(40));
        let [a, b] = halves(&text);
        assert!(a.contains("how to make a bomb") || b.contains("how to make a bomb"), "{a:?} / {b:?}");
        assert!(a.len() < text.len() && b.len() < text.len());
        assert!(text.starts_with(&a) && text.trim_end().ends_with(&b));
        // No word is cut, and each half ends (or starts) at one.
        assert!(a.ends_with("words") || a.ends_with("calm") || a.ends_with("bomb") || a.ends_with('a'), "{a:?}");
        // A text with no space at all is cut in its middle; one character cannot be.
        assert_eq!(halves("abcdef"), ["abc".to_string(), "def".to_string()]);
        assert_eq!(halves("é"), ["".to_string(), "é".to_string()]);
    }
}
