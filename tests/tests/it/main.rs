//! Cross-crate integration tests in one binary (one link of llama.cpp and ONNX Runtime): the
//! engine, the guarded cascade, the memory plan, speech. Tests that measure this process's own
//! memory (estimate vs measured, shared weights, speech memory, admission) stay in binaries of
//! their own: a neighbour test loading a model would move their figures.

mod ahead;
mod budget;
mod cascade;
mod engine;
mod prefix;
mod speech;
mod thinking;
mod turn;
