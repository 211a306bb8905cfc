//! Memory accounting for Kazeia: what a model will cost before it loads, from its file header.
//!
//! Pure: this crate never links llama.cpp, so the planner runs anywhere (`kazeia plan`).

pub mod gguf;
