//! Events: what the engine tells a client about a request. The same JSON objects are printed by
//! `kazeia run --json` (one per line) and sent over the socket, so a client parses one format.

use serde::{Deserialize, Serialize};

/// Per-turn measurements, carried by [`Event::Done`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
    /// From the start of the cascade (the turn's models loaded) to the first token released:
    /// queueing for the engine and prefill included.
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    /// Prompt tokens reused from the context (earlier turns of a session), not prefilled again.
    #[serde(default)]
    pub cached_tokens: u32,
    /// Guarded pipelines: input guard time (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard_in_ms: Option<f64>,
    /// Guarded pipelines: time to the first released sentence (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttfs_ms: Option<f64>,
    /// Guarded pipelines: total output-guard time (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard_out_ms: Option<f64>,
    /// Guarded pipelines: Thinker tokens produced before the input verdict, held until it came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_held: Option<u32>,
    /// Turns that reasoned: tokens spent in the think block (part of `generated_tokens`; never
    /// part of the answer), and the time from its first to the answer's first token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_ms: Option<f64>,
    /// Turns that reasoned: from the start of the turn to the answer's first token (`ttft_ms`
    /// counts the first token of any kind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttfa_ms: Option<f64>,
    /// Audio turns: from the end of the user's speech to the end of their turn (the pause
    /// waited and the end-of-turn verdicts), ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_of_turn_ms: Option<f64>,
    /// Audio turns: the end-of-turn model's verdicts asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_checks: Option<u32>,
    /// Audio turns with verdicts: the time of the one that ended the turn (ms; part of
    /// `end_of_turn_ms`). f32: a f64 here made every event over clippy's enum size limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_check_ms: Option<f32>,
    /// Audio turns: Whisper on the utterance, after the end of the turn (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stt_ms: Option<f64>,
    /// Spoken replies: the synthesis of the first sentence, until its first audio frame (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tts_first_ms: Option<f64>,
    /// Voice turns: from the end of the user's speech to the reply's first audio frame sent
    /// (ms): what the user waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speech_end_to_audio_ms: Option<f64>,
    /// Voice turns whose reply started before the end of the turn (the transcript was ready
    /// while the end-of-turn model still doubted): how long before it (ms). Nothing of the
    /// reply was released before the end of the turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_start_ms: Option<f64>,
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
    /// A guard blocked the turn; the refusal was sent instead.
    Blocked,
}

/// Limits the daemon enforces, announced in `welcome`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Largest frame accepted, in bytes (kind byte included).
    pub max_frame: usize,
    /// Requests a model role queues beyond the running one before answering `busy`.
    pub queue_per_model: usize,
    /// Frames buffered for a connection that reads too slowly before it is closed.
    pub connection_buffer: usize,
    /// Connections one uid may hold open, and turns it may have running, at once.
    #[serde(default)]
    pub max_connections_per_uid: u32,
    #[serde(default)]
    pub max_turns_per_uid: u32,
}

/// State of one configured model role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelState {
    Unloaded,
    Loading,
    Loaded,
    Failed,
}

/// One configured model role, as status reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelStatus {
    pub role: String,
    pub state: ModelState,
    pub file: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_bytes: Option<u64>,
    /// Where it runs: `cpu` or `htp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Why it runs there (e.g. the CPU fallback reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares_model_with: Vec<String>,
    /// Requests running or waiting for this role.
    #[serde(default)]
    pub busy: u32,
    /// Turns admitted that use this role, from `accepted` to their final event (at most
    /// `queue_per_model` + 1; a leased role is never unloaded to make room or by keep-alive).
    #[serde(default)]
    pub turns: u32,
    /// Tokens this role generated since it loaded (whether or not a client read them).
    #[serde(default)]
    pub generated_tokens: u64,
    /// Bytes this role holds against the budget (the estimate; shared weights counted once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    /// RSS growth measured when it loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_bytes: Option<i64>,
    /// Load progress 0..=1 while loading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<f32>,
    /// Last load error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Bytes of the file keeping this role's shared prefix (a guard's instructions) across
    /// loads and restarts, once written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_file_bytes: Option<u64>,
}

/// The daemon's state, answered to `status` and pushed to subscribers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub server: String,
    pub protocol: u32,
    pub pid: u32,
    pub uptime_s: f64,
    pub connections: u32,
    pub turns_running: u32,
    pub pipelines: Vec<String>,
    /// The engine's memory budget and what the loaded roles hold against it.
    #[serde(default)]
    pub budget_bytes: u64,
    #[serde(default)]
    pub reserved_bytes: u64,
    /// Memory pressure: `normal`, `low` (the daemon sheds idle sessions and models) or
    /// `critical` (new turns are refused).
    #[serde(default)]
    pub pressure: String,
    pub models: Vec<ModelStatus>,
}

/// One event. Serialized with a `type` tag, e.g. `{"type":"token","text":"Paris"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// Answer to `hello`.
    Welcome { protocol: u32, server: String, capabilities: Vec<String>, limits: Limits },
    /// The turn `id` was admitted and will run.
    Accepted { id: String, pipeline: String },
    /// A model role is loading (for a `load` request, or for a turn that needs it).
    LoadProgress {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        role: String,
        progress: f32,
    },
    /// A role finished loading.
    Loaded {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        role: String,
    },
    /// A role was unloaded.
    Unloaded {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        role: String,
    },
    /// Answer to `status`; also pushed to subscribers when something changes.
    Status {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        status: StatusReport,
    },
    /// A guard's decision on the input (`stage` = input) or on a sentence of the reply (output).
    Verdict {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        stage: String,
        label: String,
        #[serde(default)]
        categories: Vec<String>,
        ms: f64,
    },
    /// A sentence of the reply, released after the output guard passed it.
    Sentence {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        text: String,
    },
    /// What speech-to-text heard. `final: false`: a partial transcript of the speech heard so
    /// far, while the user may still be speaking (it may change); one `final: true` follows,
    /// the text the turn answers.
    Transcript {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        language: Option<String>,
        #[serde(rename = "final", default = "absent_final")]
        is_final: bool,
    },
    /// A piece of the Thinker's reasoning, for a turn that asked for it (`show_thinking`):
    /// never part of the reply; on guarded pipelines released sentence by sentence after the
    /// output guard passed it (a `verdict` with stage `thinking` before each).
    Thinking {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        text: String,
    },
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
        /// `false` when the request `id` names (if one runs) goes on: the error is about one
        /// frame or a second request under a running id (`duplicate_id`, `bad_frame`,
        /// `no_audio_request`, an audio overrun's `busy`, and `bad_request` or `unknown_type`
        /// for a request under a running id that cannot be read). Every other error ends its
        /// request.
        #[serde(rename = "final", default = "absent_final")]
        is_final: bool,
    },
}

/// An `error` or `transcript` without `final` (from a daemon before the field): final.
fn absent_final() -> bool {
    true
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
    /// A JSON frame that does not parse.
    BadJson,
    /// A JSON frame with an unknown `type`.
    UnknownType,
    /// A frame over the size limit; the connection is closed after this error.
    FrameTooLarge,
    /// A frame that is not JSON or audio, or a malformed audio header.
    BadFrame,
    /// `hello` with a protocol version the daemon does not speak; the connection is closed.
    ProtocolVersion,
    /// A request before `hello`.
    HandshakeRequired,
    /// An audio frame whose id names no running audio turn.
    NoAudioRequest,
    /// `cancel` of an id that is not running.
    UnknownRequest,
    /// A request id already in use by a running request of this connection.
    DuplicateId,
    /// The peer's uid is not allowed; the connection is closed.
    PermissionDenied,
    /// The daemon is shutting down and takes no new work.
    ShuttingDown,
    /// A request that has no partial result (a guard check) was cancelled.
    Cancelled,
    /// The model does not fit the memory budget even after evicting idle models; the message
    /// lists what is resident and what is missing.
    OverBudget,
    /// Critical memory pressure: new turns are refused until it eases.
    MemoryPressure,
    /// The peer's uid has `limits.max_connections_per_uid` connections open; the connection is
    /// closed.
    TooManyConnections,
    /// The peer's uid has `limits.max_turns_per_uid` turns running.
    TooManyTurns,
    /// An audio turn in which the VAD heard no speech, or Whisper said it heard none: no
    /// transcript (Whisper would invent words in silence).
    NoSpeech,
}

/// The longest `message` an error carries, in bytes once written as JSON. Messages quote what
/// the client sent (an unknown type, a pipeline name, serde's account of a bad field): a quote
/// of a 600 KB string, escaped twice (Rust's `{:?}`, then JSON), made a 1.2 MB error over the
/// frame limit, which the daemon could not send at all.
pub const MAX_MESSAGE: usize = 1024;

/// A character's length in a JSON string, as serde_json writes it.
fn json_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

impl Event {
    /// An error event, its message cut to [`MAX_MESSAGE`] bytes of JSON (ending with `…`).
    pub fn error(id: Option<String>, code: ErrorCode, message: impl Into<String>, is_final: bool) -> Event {
        let mut message = message.into();
        if message.chars().map(json_len).sum::<usize>() > MAX_MESSAGE {
            let room = MAX_MESSAGE - '…'.len_utf8();
            let mut used = 0;
            let end = message
                .char_indices()
                .find(|&(_, c)| {
                    used += json_len(c);
                    used > room
                })
                .map_or(message.len(), |(i, _)| i);
            message.truncate(end);
            message.push('…');
        }
        Event::Error { id, code, message, is_final }
    }

    /// The request id this event answers, if any.
    pub fn id(&self) -> Option<&str> {
        match self {
            Event::Welcome { .. } => None,
            Event::Accepted { id, .. } => Some(id),
            Event::LoadProgress { id, .. }
            | Event::Loaded { id, .. }
            | Event::Unloaded { id, .. }
            | Event::Status { id, .. }
            | Event::Verdict { id, .. }
            | Event::Sentence { id, .. }
            | Event::Thinking { id, .. }
            | Event::Transcript { id, .. }
            | Event::Token { id, .. }
            | Event::Done { id, .. }
            | Event::Error { id, .. } => id.as_deref(),
        }
    }
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
            ErrorCode::BadJson => "bad_json",
            ErrorCode::UnknownType => "unknown_type",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::BadFrame => "bad_frame",
            ErrorCode::ProtocolVersion => "protocol_version",
            ErrorCode::HandshakeRequired => "handshake_required",
            ErrorCode::NoAudioRequest => "no_audio_request",
            ErrorCode::UnknownRequest => "unknown_request",
            ErrorCode::DuplicateId => "duplicate_id",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::OverBudget => "over_budget",
            ErrorCode::MemoryPressure => "memory_pressure",
            ErrorCode::TooManyConnections => "too_many_connections",
            ErrorCode::TooManyTurns => "too_many_turns",
            ErrorCode::NoSpeech => "no_speech",
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
        let e = Event::Error { id: Some("r1".into()), code: ErrorCode::ModelFile, message: "x".into(), is_final: true };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"error","id":"r1","code":"model_file","message":"x","final":true}"#
        );
        let done = Event::Done { id: None, stop: StopReason::Eos, metrics: Metrics::default() };
        let back: Event = serde_json::from_str(&serde_json::to_string(&done).unwrap()).unwrap();
        assert_eq!(back, done);
        for code in [
            ErrorCode::BadConfig,
            ErrorCode::ContextOverflow,
            ErrorCode::NoModel,
            ErrorCode::ProtocolVersion,
            ErrorCode::NoAudioRequest,
        ] {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
        }
    }

    #[test]
    fn error_messages_are_cut_to_their_json_length_at_a_char_boundary() {
        let short = Event::error(Some("r".into()), ErrorCode::BadRequest, "short", false);
        assert_eq!(
            short,
            Event::Error {
                id: Some("r".into()),
                code: ErrorCode::BadRequest,
                message: "short".into(),
                is_final: false
            }
        );
        for n in [MAX_MESSAGE / 6, MAX_MESSAGE / 2, MAX_MESSAGE - 1, MAX_MESSAGE, MAX_MESSAGE + 1, 10 * MAX_MESSAGE] {
            for fill in ["a", "é", "日", "\\\"", "🦀", "\u{1}", "\n", "\\"] {
                let text = fill.repeat(n);
                let Event::Error { message, .. } = Event::error(None, ErrorCode::UnknownType, text.clone(), true)
                else {
                    unreachable!()
                };
                // What goes on the wire, less the quotes around it.
                let json = |s: &str| serde_json::to_string(s).unwrap().len() - 2;
                assert!(json(&message) <= MAX_MESSAGE, "{fill:?} x {n}: {} bytes", json(&message));
                if json(&text) <= MAX_MESSAGE {
                    assert_eq!(message, text);
                } else {
                    assert!(message.ends_with('…') && text.starts_with(message.trim_end_matches('…')));
                    assert!(json(&message) > MAX_MESSAGE - 12, "{fill:?} x {n}: cut short, {} bytes", json(&message));
                }
            }
        }
    }
}
