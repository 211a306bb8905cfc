//! The Kazeia protocol: message types shared by the daemon, the CLI and clients.
//! Dependency-light on purpose: an app team can vendor it.

pub mod event;

pub use event::{ErrorCode, Event, Metrics, StopReason};
