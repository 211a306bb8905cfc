//! The engine's face: what a pipeline asks of a language model and what comes back. [`Llm`] is
//! implemented by [`crate::Engine`] (llama.cpp) and, in pipelines' unit tests of pure logic, by
//! fakes; nothing here links llama.cpp.

use std::time::Instant;

use kazeia_ipc::{ErrorCode, Metrics, StopReason};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// One chat message, in the model's chat template's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        ChatMessage { role: role.to_string(), content: content.into() }
    }
}

/// Per-request overrides of the role's configured sampling.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerateOptions {
    pub temperature: Option<f32>,
    pub seed: Option<u32>,
    pub max_tokens: Option<u32>,
    /// Keep generating past end-of-generation tokens (benchmarks need a fixed length).
    pub ignore_eos: bool,
    /// Most tokens the model may spend in its `<think>` block before the engine closes it; 0
    /// turns thinking off. None: the role's `thinking_budget`.
    pub thinking_budget: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// The model role from models.toml (`thinker`, `guard`, …).
    pub role: String,
    pub messages: Vec<ChatMessage>,
    pub options: GenerateOptions,
    /// Text the answer starts with, after the template's assistant opening (usually empty).
    pub answer_prefix: String,
    /// Which of the role's cached sequences to use (see `cache_slots` in models.toml): requests
    /// of different shapes on one role keep their own reusable prefix.
    pub slot: u32,
    /// `messages[start..start + len]` are earlier turns (a session's), user and assistant in
    /// pairs: when the prompt leaves no room for the answer, the engine drops the oldest half
    /// of them (again, until it fits) and says how many in [`GenSummary::dropped_messages`].
    /// Without it, a conversation past the context failed every turn with `context_overflow`.
    pub history: Option<(usize, usize)>,
}

impl GenerateRequest {
    pub fn new(role: &str, messages: Vec<ChatMessage>, options: GenerateOptions) -> Self {
        GenerateRequest {
            role: role.to_string(),
            messages,
            options,
            answer_prefix: String::new(),
            slot: 0,
            history: None,
        }
    }
}

/// Where the part of a request's messages that never depends on the checked or user's text
/// ends: the messages before `message`, then `bytes` of that one's content. A role keeps only
/// that part in its prefix file (`prefix_file`, on disk across restarts). The guard's formats
/// write the user's text inside the message that holds the instructions, so the prefix two
/// slots shared (what the file kept) held the first question after each load: the only place
/// a user's words reached the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedPart {
    pub message: usize,
    pub bytes: usize,
}

/// Pick one of `labels` (exact continuation texts, e.g. " Safe") as the continuation of the chat
/// prompt followed by `answer_prefix` (e.g. "Safety:"), in one pass: the labels' next-token logits are compared, and where labels
/// share leading tokens the choice is decoded constrained to the labels.
#[derive(Debug, Clone)]
pub struct ClassifyRequest {
    pub role: String,
    pub messages: Vec<ChatMessage>,
    pub answer_prefix: String,
    pub labels: Vec<String>,
    /// Reuse what the context already holds (the guard's fixed instructions). False prefills the
    /// whole prompt again: only for measuring what the cache saves.
    pub reuse_cache: bool,
    /// Cache slot, as for [`GenerateRequest::slot`].
    pub slot: u32,
    /// The instructions' extent, kept on disk for the next load; None keeps nothing of a role
    /// with several slots.
    pub fixed: Option<FixedPart>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Classification {
    pub label: String,
    /// Each label's probability among the labels, from the first differing token.
    pub scores: Vec<(String, f32)>,
    pub prompt_tokens: u32,
    /// Tokens decoded for this request (the rest came from the context's cache).
    pub prefilled_tokens: u32,
    /// Decode steps past the prompt: 0 when the labels differ at their first token (one pass:
    /// the prompt's last logits decide); else one per token the surviving labels share.
    pub label_steps: u32,
    pub ms: f64,
}

/// Where a prefill request's prompt ends: the last occurrence of this character in its rendered
/// messages (a private-use code point, which no template writes; put at the end of the last
/// message's text). Text after it is not prefilled.
pub const PREFILL_CUT: char = '\u{E000}';

/// Prefill the start of a prompt that is not whole yet — a voice turn's transcript while the
/// user still speaks — into a role's cache slot, so that the request with the whole prompt
/// decodes only what follows. The messages are rendered with the role's template and cut at
/// [`PREFILL_CUT`]; nothing is sampled or answered. It yields to every request: when its turn
/// comes with anything queued behind it, it answers `busy` without running, and a request
/// that comes while it runs waits for one chunk of it (32 tokens), then it stops (`busy`),
/// keeping what it decoded. With [`Upto::Generation`] or [`Upto::Check`] the prompt is whole
/// instead (the transcript of a whole utterance, ready before the end of the turn is decided):
/// the request that follows with the same messages decodes only its last token.
#[derive(Debug, Clone)]
pub struct PrefillRequest {
    pub role: String,
    pub messages: Vec<ChatMessage>,
    /// Cache slot, as for [`GenerateRequest::slot`].
    pub slot: u32,
    /// How far to go: the cut mark by default.
    pub upto: Upto,
    /// Where to hear of each chunk decoded ([`GenEvent::Prefill`]: tokens in the context of
    /// the prompt's total; on a hybrid model the pass to where the turn's text begins first,
    /// against that point), as a generation's prefill is heard of; none by default.
    pub progress: Option<mpsc::UnboundedSender<GenEvent>>,
    /// The generation this prefill is ahead of: its [`GenerateRequest::history`], and the
    /// `max_tokens` and `thinking_budget` of its options, which decide how much of that history
    /// fits. The prefill leaves out the oldest messages the generation will leave out: a long
    /// session's voice turn prefilled the whole history, the generation dropped half of it, and
    /// found nothing after the system prompt held (the whole prompt decoded again).
    pub history: Option<(usize, usize)>,
    pub options: GenerateOptions,
    /// As [`ClassifyRequest::fixed`].
    pub fixed: Option<FixedPart>,
}

impl PrefillRequest {
    pub fn new(role: impl Into<String>, messages: Vec<ChatMessage>, slot: u32) -> PrefillRequest {
        PrefillRequest {
            role: role.into(),
            messages,
            slot,
            upto: Upto::Cut,
            progress: None,
            history: None,
            options: GenerateOptions::default(),
            fixed: None,
        }
    }
}

/// How far a [`PrefillRequest`] goes.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Upto {
    /// To [`PREFILL_CUT`]: the words heard so far.
    #[default]
    Cut,
    /// A generation's whole prompt (as its request's, [`PrefillRequest::options`]), less what the
    /// generation decodes itself: its last token, or on a hybrid model what follows the
    /// conversation (the generation keeps its state there for the next turn, which a longer
    /// prefill would refuse).
    Generation,
    /// A check's (a classification's) whole prompt with this answer start, less its last token
    /// (the check decodes it for the labels' logits).
    Check { answer_prefix: String },
}

/// What a prefill did.
#[derive(Debug, Clone, PartialEq)]
pub struct Prefilled {
    /// Tokens of the prompt up to the cut.
    pub prompt_tokens: u32,
    /// Of those, the ones decoded now (the rest were already held).
    pub prefilled_tokens: u32,
    pub ms: f64,
}

/// How a generation ended.
#[derive(Debug, Clone, PartialEq)]
pub struct GenSummary {
    pub stop: StopReason,
    pub metrics: Metrics,
    /// Prompt tokens decoded for this request: the prompt minus what the context already held
    /// (a session's earlier turns, a guard's fixed instructions), fewer if cancelled.
    pub prefilled_tokens: u32,
    /// Prompt tokens reused from the context's cache.
    pub cached_tokens: u32,
    /// The oldest messages of [`GenerateRequest::history`] left out for the prompt to fit.
    pub dropped_messages: u32,
}

/// What the engine reports while it works. `at` is when the engine produced the event, so a
/// caller can tell what happened before and after a cancel without trusting channel latency.
// `Finished` carries the turn's metrics (~250 bytes, the speech stages included) and makes every
// event that size: a few hundred bytes per queued token against a box to unwrap at each of the
// two dozen places that match it.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum GenEvent {
    /// A prefill chunk finished: `done` of `total` prompt tokens are in the context.
    Prefill {
        done: u32,
        total: u32,
        at: Instant,
    },
    /// A piece of the answer.
    Token {
        text: String,
        at: Instant,
    },
    /// A piece of the model's reasoning (`<think>…</think>`): never part of the answer.
    Thinking {
        text: String,
        at: Instant,
    },
    Finished(Result<GenSummary, LlmError>),
}

/// An engine failure with a stable code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct LlmError {
    pub code: ErrorCode,
    pub message: String,
}

impl LlmError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        LlmError { code, message: message.into() }
    }
}

/// A language-model engine. `generate` returns at once; the work runs on the engine's threads and
/// reports through the channel, ending with exactly one [`GenEvent::Finished`]. Cancelling the
/// token stops it within one prefill chunk or one generated token.
pub trait Llm: Send + Sync {
    fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<mpsc::UnboundedReceiver<GenEvent>, LlmError>;

    /// One-pass classification (see [`ClassifyRequest`]); same queue and cancellation rules.
    fn classify(
        &self,
        request: ClassifyRequest,
        cancel: CancellationToken,
    ) -> Result<oneshot::Receiver<Result<Classification, LlmError>>, LlmError>;

    /// Prefill a prompt's start (see [`PrefillRequest`]); same queue and cancellation rules,
    /// but it yields (`busy`) to any request queued behind it.
    fn prefill(
        &self,
        request: PrefillRequest,
        cancel: CancellationToken,
    ) -> Result<oneshot::Receiver<Result<Prefilled, LlmError>>, LlmError>;
}
