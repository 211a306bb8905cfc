//! Events: what the engine tells a client about a request. The same JSON objects are printed by
//! `kazeia run --json` (one per line) and sent over the socket, so a client parses one format.

use serde::{Deserialize, Serialize};

/// Per-turn measurements, carried by [`Event::Done`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
    /// From the start of the turn to the first token released.
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    Eos,
    /// `max_tokens` was reached.
    Length,
    /// The context window is full.
    ContextFull,
    /// A cancel arrived.
    Cancelled,
}

/// One event. Serialized with a `type` tag, e.g. `{"type":"token","text":"Paris"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A piece of generated text, in order; concatenated they are the reply.
    Token {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        text: String,
    },
    /// The turn ended normally (or by cancel: see `stop`).
    Done {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        stop: StopReason,
        metrics: Metrics,
    },
    /// The turn failed. `code` is stable and machine-readable; `message` is for people.
    Error {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        code: ErrorCode,
        message: String,
    },
}

/// Stable error codes. New codes may be added; clients must treat unknown codes as errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The configuration file is invalid.
    BadConfig,
    /// The model file is missing, truncated or not a model.
    ModelFile,
    /// The engine could not load a model (e.g. llama.cpp refused it).
    LoadFailed,
    /// No model is configured or loaded for the role a request needs.
    NoModel,
    /// The prompt does not fit the model's context window.
    ContextOverflow,
    /// The engine failed while running a request.
    Engine,
    /// Unknown pipeline name or bad pipeline file.
    Pipeline,
    /// The request itself is invalid.
    BadRequest,
    /// The model's queue is full; retry later. Answered at once, never by blocking.
    Busy,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadConfig => "bad_config",
            ErrorCode::ModelFile => "model_file",
            ErrorCode::LoadFailed => "load_failed",
            ErrorCode::NoModel => "no_model",
            ErrorCode::ContextOverflow => "context_overflow",
            ErrorCode::Engine => "engine",
            ErrorCode::Pipeline => "pipeline",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Busy => "busy",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_is_stable() {
        let e = Event::Token { id: None, text: "Par".into() };
        assert_eq!(serde_json::to_string(&e).unwrap(), r#"{"type":"token","text":"Par"}"#);
        let e = Event::Error { id: Some("r1".into()), code: ErrorCode::ModelFile, message: "x".into() };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"error","id":"r1","code":"model_file","message":"x"}"#
        );
        let done = Event::Done { id: None, stop: StopReason::Eos, metrics: Metrics::default() };
        let back: Event = serde_json::from_str(&serde_json::to_string(&done).unwrap()).unwrap();
        assert_eq!(back, done);
        for code in [ErrorCode::BadConfig, ErrorCode::ContextOverflow, ErrorCode::NoModel] {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
        }
    }
}
