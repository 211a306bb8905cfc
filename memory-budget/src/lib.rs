//! Memory accounting for Kazeia: what a model will cost before it loads, from its file header,
//! and how a model larger than one HTP session is split.
//!
//! Pure: this crate never links llama.cpp, so the planner runs anywhere (`kazeia plan`).

pub mod estimate;
pub mod gguf;
pub mod htp;
pub mod ledger;
pub mod onnx;
pub mod placement;
pub mod pressure;

pub use estimate::{estimate, htp_runs, layer_bytes, ContextParams, Estimate, LayerBytes, Shape};
pub use htp::{plan as plan_htp, HtpPlan, PlanError, DEFAULT_SESSION_CAP};
pub use ledger::{Ledger, Refusal};
pub use placement::{model_cache_dir, Backend};
