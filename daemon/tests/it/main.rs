//! The daemon's integration tests, one binary (one link of llama.cpp and ONNX Runtime): the real
//! `kazeia` binary, its socket, its CLI, D-Bus, service files, faults, the soak, audio turns.
//! Daemons started by these tests take turns (`common::Daemon` holds a process-wide lock).

mod ask;
mod budget;
mod cli;
mod common;
#[cfg(feature = "dbus")]
mod dbus;
mod faults;
mod service;
mod soak;
mod socket;
mod voice;
