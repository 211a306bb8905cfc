//! Requests: what a client asks of the daemon. JSON control frames with a `type` tag.

use serde::{Deserialize, Serialize};

/// The protocol version this crate speaks. A client must say it in `hello`.
pub const PROTOCOL_VERSION: u32 = 1;

fn default_pipeline() -> String {
    "chat".to_string()
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
        #[serde(default)]
        client: String,
    },
    /// Run one turn of a pipeline. `id` is chosen by the client and unique among its running
    /// requests; every event of the turn carries it.
    Turn {
        id: String,
        #[serde(default = "default_pipeline")]
        pipeline: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        audio: Option<AudioSpec>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
        #[serde(default)]
        options: TurnOptions,
    },
    /// Cancel the running request `id` (of this connection).
    Cancel { id: String },
    Status { id: String },
    Load { id: String, role: String },
    Unload { id: String, role: String },
    /// Receive `status` events whenever models load or unload, until the connection closes.
    Subscribe { id: String },
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
