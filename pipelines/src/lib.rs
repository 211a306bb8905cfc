//! Pipelines: stages (think; later guard, transcribe, speak) and the runner that streams events
//! between them. Definitions are files (`chat.toml`, …); the CLI and the daemon run the same ones.

pub mod definition;
pub mod llm;
pub mod runner;

pub use definition::{Pipeline, PipelineError, Registry, Stage};
pub use llm::{ChatMessage, GenEvent, GenSummary, GenerateOptions, GenerateRequest, Llm, LlmError};
pub use runner::{run_turn, Engines, TurnInput};
