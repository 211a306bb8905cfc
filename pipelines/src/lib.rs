//! Pipelines: stages (think; later guard, transcribe, speak) and the runner that streams events
//! between them. Definitions are files (`chat.toml`, …); the CLI and the daemon run the same ones.

pub mod definition;
pub mod guard;
pub mod runner;
pub mod session;
pub mod split;
pub mod warm;

pub use definition::{Pipeline, PipelineError, Plan, Registry, Stage};
pub use guard::{Check, GuardConfig, GuardFormat, GuardPolicy, Label, PolicyError};
pub use kazeia_engine::api::{
    ChatMessage, Classification, ClassifyRequest, FixedPart, GenEvent, GenSummary, GenerateOptions, GenerateRequest,
    Llm, LlmError, PrefillRequest, Prefilled, Upto,
};
pub use runner::{run_turn, Engines, Guard, TurnInput, Verdict};
pub use session::Sessions;
pub use warm::warm;
