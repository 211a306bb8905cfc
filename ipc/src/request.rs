//! Requests: what a client asks of the daemon. JSON control frames with a `type` tag.

use serde::{Deserialize, Serialize};

/// The protocol version this crate speaks. A client must say it in `hello`.
pub const PROTOCOL_VERSION: u32 = 1;

/// A turn that names no pipeline passes the Guard both ways: unguarded `chat` is asked for by
/// name.
pub const DEFAULT_PIPELINE: &str = "guarded-chat";

fn default_pipeline() -> String {
    DEFAULT_PIPELINE.to_string()
}

/// An optional field written `null` is as if left out: Python's json, kotlinx.serialization
/// and Gson write absent values so, and `"pipeline": null` was `bad_request` ("invalid type:
/// null"), `"client": null` in `hello` closed the connection.
fn null_is_default<'de, D: serde::Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn null_is_default_pipeline<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_else(default_pipeline))
}

/// Per-turn overrides of the role's configured sampling.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Most tokens the Thinker may reason before the engine closes its think block (0: no
    /// reasoning); default the role's `thinking_budget`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_budget: Option<u32>,
    /// Send the reasoning as `thinking` events (guarded like the reply on guarded pipelines).
    #[serde(default, deserialize_with = "null_is_default", skip_serializing_if = "std::ops::Not::not")]
    pub show_thinking: bool,
}

/// Audio that the client will stream for a turn, as binary frames carrying the turn's id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AudioSpec {
    pub sample_rate: u32,
    pub channels: u8,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// First frame of every connection.
    Hello {
        protocol: u32,
        #[serde(default, deserialize_with = "null_is_default")]
        client: String,
    },
    /// Run one turn of a pipeline. `id` is chosen by the client and unique among its running
    /// requests; every event of the turn carries it.
    Turn {
        id: String,
        #[serde(default = "default_pipeline", deserialize_with = "null_is_default_pipeline")]
        pipeline: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        audio: Option<AudioSpec>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
        #[serde(default, deserialize_with = "null_is_default")]
        options: TurnOptions,
    },
    /// Cancel the running request `id` (of this connection).
    Cancel {
        id: String,
    },
    Status {
        id: String,
    },
    Load {
        id: String,
        role: String,
    },
    Unload {
        id: String,
        role: String,
    },
    /// Receive `status` events whenever models load or unload, until the connection closes.
    Subscribe {
        id: String,
    },
}

impl Request {
    pub fn id(&self) -> Option<&str> {
        match self {
            Request::Hello { .. } => None,
            Request::Turn { id, .. }
            | Request::Cancel { id }
            | Request::Status { id }
            | Request::Load { id, .. }
            | Request::Unload { id, .. }
            | Request::Subscribe { id } => Some(id),
        }
    }
}

/// Every request `type` the daemon knows.
pub const REQUEST_TYPES: &[&str] = &["hello", "turn", "cancel", "status", "load", "unload", "subscribe"];

/// Why a JSON frame is not a request, with the code the daemon answers and the request's id
/// when one could be read (so that the client can match the error to its request).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ParseError {
    pub id: Option<String>,
    pub code: crate::ErrorCode,
    pub message: String,
}

/// Longest request id or session name, in bytes.
pub const MAX_ID_BYTES: usize = 128;

/// Why a client-chosen name (a request id, a session) is refused: ids end up in logs and
/// events, so they are short and printable (a NUL in an id once panicked a worker).
pub(crate) fn bad_name(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        Some("must not be empty")
    } else if s.len() > MAX_ID_BYTES {
        Some("must be at most 128 bytes")
    } else if s.chars().any(char::is_control) {
        Some("must not contain control characters")
    } else {
        None
    }
}

/// Parse a JSON frame's body, telling apart bad JSON, an unknown type and a malformed request.
pub fn parse_request(body: &[u8]) -> Result<Request, ParseError> {
    use crate::ErrorCode;
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| ParseError {
        id: None,
        code: ErrorCode::BadJson,
        message: e.to_string(),
    })?;
    if !v.is_object() {
        return Err(ParseError { id: None, code: ErrorCode::BadJson, message: "a request is one JSON object".into() });
    }
    for field in ["id", "session"] {
        if let Some(why) = v.get(field).and_then(|i| i.as_str()).and_then(bad_name) {
            // The id is not echoed: it is the problem.
            return Err(ParseError { id: None, code: ErrorCode::BadRequest, message: format!("`{field}` {why}") });
        }
    }
    let id = v.get("id").and_then(|i| i.as_str()).map(str::to_string);
    let ty = v.get("type").and_then(|t| t.as_str()).unwrap_or_default().to_string();
    if !REQUEST_TYPES.contains(&ty.as_str()) {
        let message = format!("unknown request type {ty:?} (known: {})", REQUEST_TYPES.join(", "));
        return Err(ParseError { id, code: ErrorCode::UnknownType, message });
    }
    serde_json::from_value(v).map_err(|e| ParseError { id, code: ErrorCode::BadRequest, message: format!("{ty}: {e}") })
}

#[cfg(test)]
mod parse_tests {
    use super::*;
    use crate::ErrorCode;
    use proptest::prelude::*;

    #[test]
    fn errors_are_told_apart() {
        assert_eq!(parse_request(b"{nope").unwrap_err().code, ErrorCode::BadJson);
        let e = parse_request(br#"{"type":"dance","id":"7"}"#).unwrap_err();
        assert_eq!((e.code, e.id.as_deref()), (ErrorCode::UnknownType, Some("7")));
        let e = parse_request(br#"{"type":"turn","id":"8","options":{"bogus":1}}"#).unwrap_err();
        assert_eq!((e.code, e.id.as_deref()), (ErrorCode::BadRequest, Some("8")));
        assert_eq!(parse_request(br#"{"type":"status","id":"9"}"#).unwrap(), Request::Status { id: "9".into() });
        // Not an object: bad JSON for the protocol.
        assert_eq!(parse_request(b"[1,2]").unwrap_err().code, ErrorCode::BadJson);
        assert_eq!(parse_request(b"\"status\"").unwrap_err().code, ErrorCode::BadJson);
        // Ids and sessions: short, printable, not echoed when they are the problem.
        for body in [
            r#"{"type":"status","id":"a\u0000b"}"#.to_string(),
            format!(r#"{{"type":"status","id":"{}"}}"#, "x".repeat(129)),
            r#"{"type":"status","id":""}"#.to_string(),
            r#"{"type":"turn","id":"t","text":"hi","session":"s\nx"}"#.to_string(),
        ] {
            let e = parse_request(body.as_bytes()).unwrap_err();
            assert_eq!((e.code, e.id.as_deref()), (ErrorCode::BadRequest, None), "{body}");
        }
        assert!(parse_request(format!(r#"{{"type":"status","id":"{}"}}"#, "é".repeat(64)).as_bytes()).is_ok());
        // No pipeline: the guarded one.
        match parse_request(br#"{"type":"turn","id":"1","text":"hi"}"#).unwrap() {
            Request::Turn { pipeline, .. } => assert_eq!(pipeline, "guarded-chat"),
            other => panic!("{other:?}"),
        }
    }

    fn arb_request() -> impl Strategy<Value = Request> {
        let id = "[a-zA-Z0-9-]{1,16}";
        prop_oneof![
            (
                id,
                ".{0,40}",
                proptest::option::of(0.0f32..2.0),
                proptest::option::of(any::<u32>()),
                proptest::option::of(1u32..4096)
            )
                .prop_map(|(id, text, temperature, seed, max_tokens)| Request::Turn {
                    id,
                    pipeline: "chat".into(),
                    text: Some(text),
                    audio: None,
                    session: None,
                    options: TurnOptions { temperature, seed, max_tokens, ..Default::default() },
                }),
            id.prop_map(|id| Request::Cancel { id }),
            id.prop_map(|id| Request::Status { id }),
            (id, "[a-z]{1,8}").prop_map(|(id, role)| Request::Load { id, role }),
            (id, "[a-z]{1,8}").prop_map(|(id, role)| Request::Unload { id, role }),
            id.prop_map(|id| Request::Subscribe { id }),
        ]
    }

    proptest! {
        /// What a client serializes, the daemon parses back to the same request.
        #[test]
        fn requests_round_trip(req in arb_request()) {
            let bytes = serde_json::to_vec(&req).unwrap();
            prop_assert_eq!(parse_request(&bytes).unwrap(), req);
        }

        /// Arbitrary bytes never panic the parser, and always get a code.
        #[test]
        fn arbitrary_bytes_parse_or_get_a_code(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_request(&b);
        }

        /// Whatever id a client sends, an accepted request's id is short and printable.
        #[test]
        fn accepted_ids_are_short_and_printable(id in "\\PC{0,140}|[\\x00-\\x1f]{1,4}|.{0,200}") {
            let body = serde_json::json!({"type": "status", "id": id}).to_string();
            if let Ok(Request::Status { id }) = parse_request(body.as_bytes()) {
                prop_assert!(!id.is_empty() && id.len() <= MAX_ID_BYTES && !id.chars().any(char::is_control));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Request, TurnOptions, DEFAULT_PIPELINE};

    /// An optional field written `null` is as if left out.
    #[test]
    fn null_optional_fields_are_left_out() {
        let turn: Request = serde_json::from_str(
            r#"{"type":"turn","id":"t","pipeline":null,"text":"hi","audio":null,"session":null,"options":null}"#,
        )
        .unwrap();
        match turn {
            Request::Turn { pipeline, options, session, .. } => {
                assert_eq!(pipeline, DEFAULT_PIPELINE);
                assert_eq!(options, TurnOptions::default());
                assert_eq!(session, None);
            }
            other => panic!("{other:?}"),
        }
        let opts: TurnOptions = serde_json::from_str(r#"{"temperature":null,"show_thinking":null}"#).unwrap();
        assert_eq!(opts, TurnOptions::default());
        let hello: Request = serde_json::from_str(r#"{"type":"hello","protocol":1,"client":null}"#).unwrap();
        assert_eq!(hello, Request::Hello { protocol: 1, client: String::new() });
        // A required field is still required, and a wrong type still wrong.
        assert!(serde_json::from_str::<Request>(r#"{"type":"turn","id":null,"text":"hi"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"type":"turn","id":"t","pipeline":3}"#).is_err());
    }
}
