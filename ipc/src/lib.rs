//! The Kazeia protocol: message types, framing and an async client, shared by the daemon, the
//! CLI and app clients. Dependency-light on purpose. The wire format is in docs/PROTOCOL.md.

pub mod client;
pub mod event;
pub mod frame;
pub mod request;

pub use client::{Client, ClientError, Incoming};
pub use event::{ErrorCode, Event, Limits, Metrics, ModelState, ModelStatus, StatusReport, StopReason, MAX_MESSAGE};
pub use frame::{AudioFrame, Frame, FrameCodec, FrameError, InvalidFrame, MAX_FRAME};
pub use request::{
    parse_request, AudioSpec, ParseError, Request, TurnOptions, DEFAULT_PIPELINE, MAX_ID_BYTES, PROTOCOL_VERSION,
    REQUEST_TYPES,
};
