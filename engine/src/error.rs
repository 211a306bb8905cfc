//! One error enum per failure site: loading a role, running a request.

use crate::api::LlmError;
use kazeia_ipc::ErrorCode;
use kazeia_memory_budget::gguf::GgufError;

/// Loading a model role failed. The engine stays usable for the other roles.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Missing, truncated or foreign file: caught from the header before llama.cpp sees it.
    #[error(transparent)]
    ModelFile(#[from] GgufError),
    #[error("llama.cpp could not load {path}: {reason}")]
    Llama { path: String, reason: String },
    #[error("llama.cpp could not create a context for role {role:?} ({path}): {reason}")]
    Context { role: String, path: String, reason: String },
    #[error("llama.cpp backend failed to start: {0}")]
    Backend(String),
    #[error("the engine thread for role {role:?} could not start: {reason}")]
    Thread { role: String, reason: String },
}

impl LoadError {
    pub fn code(&self) -> ErrorCode {
        match self {
            LoadError::ModelFile(_) => ErrorCode::ModelFile,
            _ => ErrorCode::LoadFailed,
        }
    }
}

impl From<LoadError> for LlmError {
    fn from(e: LoadError) -> Self {
        LlmError::new(e.code(), e.to_string())
    }
}

/// A request failed while running.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("no model is loaded for role {0:?}")]
    NoModel(String),
    #[error("the queue for role {role:?} is full ({capacity} waiting): try again later")]
    Busy { role: String, capacity: usize },
    #[error("role {0:?} has a request waiting: a prefill ahead of time yields to it")]
    Occupied(String),
    #[error("prompt has {prompt} tokens but role {role:?} has a context of {n_ctx}")]
    ContextOverflow { role: String, prompt: usize, n_ctx: u32 },
    #[error("cannot build the prompt: {0}")]
    Prompt(String),
    #[error("llama.cpp decode failed at position {pos}: {reason}")]
    Decode { pos: usize, reason: String },
    #[error("cancelled")]
    Cancelled,
}

impl From<GenerateError> for LlmError {
    fn from(e: GenerateError) -> Self {
        let code = match &e {
            GenerateError::NoModel(_) => ErrorCode::NoModel,
            GenerateError::Busy { .. } | GenerateError::Occupied(_) => ErrorCode::Busy,
            GenerateError::ContextOverflow { .. } => ErrorCode::ContextOverflow,
            GenerateError::Prompt(_) => ErrorCode::BadRequest,
            GenerateError::Decode { .. } => ErrorCode::Engine,
            GenerateError::Cancelled => ErrorCode::Cancelled,
        };
        LlmError::new(code, e.to_string())
    }
}
