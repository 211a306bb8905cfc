//! Kazeia daemon library: configuration, supervisor, socket server and the CLI's building blocks.
//! The `kazeia` binary (src/main.rs) is a thin front over this.

pub mod cli;
pub mod config;
pub mod output;
pub mod plan;
pub mod server;
pub mod soak;
pub mod speech;
pub mod supervisor;
pub mod turns;
