//! The requests a role's worker thread serves, each with its own reply channel (mistral.rs's
//! request enum): shared by the worker (which queues them) and generate (which runs them), so
//! neither imports the other.

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::api::{Classification, ClassifyRequest, GenEvent, GenerateRequest, LlmError, PrefillRequest, Prefilled};

/// A generation: its request, its cancel, and the channel its events go to.
pub struct Job {
    pub request: GenerateRequest,
    pub cancel: CancellationToken,
    pub events: UnboundedSender<GenEvent>,
    /// When the request was accepted: ttft counts queueing too.
    pub submitted: Instant,
}

/// A one-pass classification and the channel its answer goes to.
pub struct ClassifyJob {
    pub request: ClassifyRequest,
    pub cancel: CancellationToken,
    pub reply: tokio::sync::oneshot::Sender<Result<Classification, LlmError>>,
}

/// A prefill of a prompt's start and the channel its outcome goes to.
pub struct PrefillJob {
    pub request: PrefillRequest,
    pub cancel: CancellationToken,
    pub reply: tokio::sync::oneshot::Sender<Result<Prefilled, LlmError>>,
}

/// A request for the role's thread; each carries its own reply channel.
pub enum Msg {
    Generate(Box<Job>),
    Classify(Box<ClassifyJob>),
    Prefill(Box<PrefillJob>),
}
