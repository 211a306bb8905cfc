//! The shared llama.cpp engine: one backend per process, one loaded model per distinct file,
//! one context (and one thread) per role.
//!
//! Lock order: `roles` before `models`. Neither is held while llama.cpp loads a file or runs a
//! request; `loading` serializes loads (one model loads at a time, as in Ollama) so two roles
//! naming one file cannot both load it.

pub mod api;
mod backend;
mod compute;
pub use compute::{decodes_held, RolePause, SpeechHold, HANDOFF, MAX_HOLD};
mod cores;
mod error;
mod generate;
mod job;
mod model;
pub mod params;
mod prefix_file;
mod prompt;
pub mod sampler;
pub mod think;
mod worker;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use api::{
    ChatMessage, Classification, ClassifyRequest, FixedPart, GenEvent, GenSummary, GenerateOptions, GenerateRequest,
    Llm, LlmError, PrefillRequest, Prefilled, Upto, PREFILL_CUT,
};
pub use backend::{place, Placement};
pub use error::{GenerateError, LoadError};
pub use model::{ModelKey, SharedModel};
pub use params::{Backend, FlashAttn, RoleParams, Sampling};

use job::{ClassifyJob, Job, Msg, PrefillJob};
use worker::Worker;

/// Requests waiting per role beyond the running one, before `busy`.
pub const DEFAULT_QUEUE: usize = 8;

/// What status reports about a loaded role.
#[derive(Debug, Clone, Serialize)]
pub struct RoleInfo {
    pub role: String,
    pub path: PathBuf,
    pub architecture: String,
    pub file_bytes: u64,
    pub n_ctx: u32,
    pub placement: Placement,
    /// Other roles that share this role's loaded model.
    pub shares_model_with: Vec<String>,
    /// The file keeping this role's shared prefix across loads, and its size, if written.
    pub prefix_file: Option<(PathBuf, u64)>,
    /// Why the role stopped serving (a panic on its thread), if it did.
    pub failed: Option<String>,
}

struct Role {
    worker: Worker,
    model: Arc<SharedModel>,
    cfg: RoleParams,
    /// Where this role keeps its shared prefix (named by a key over the model file and the
    /// context): computed once at load, not on every status.
    prefix_path: Option<PathBuf>,
}

#[derive(Default)]
struct Inner {
    roles: Mutex<HashMap<String, Role>>,
    models: Mutex<HashMap<ModelKey, Weak<SharedModel>>>,
    loading: Mutex<()>,
}

/// A cheap, cloneable handle to the engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
    queue_capacity: Option<usize>,
    compute: Arc<compute::Compute>,
}

impl Default for Engine {
    fn default() -> Self {
        Engine::new()
    }
}

impl Engine {
    /// An engine whose roles take turns decoding (see [`Engine::with_exclusive_compute`]).
    pub fn new() -> Engine {
        Engine { inner: Arc::default(), queue_capacity: None, compute: Arc::new(compute::Compute::new(true)) }
    }

    /// Whether roles decode one at a time (default) or in parallel. Set before loading roles.
    pub fn with_exclusive_compute(mut self, exclusive: bool) -> Engine {
        self.compute = Arc::new(compute::Compute::new(exclusive));
        self
    }

    pub fn with_queue_capacity(mut self, n: usize) -> Engine {
        self.queue_capacity = Some(n);
        self
    }

    /// Load a role (blocking: call from a blocking thread). A file already loaded for another
    /// role is shared, not loaded again. Loading a role that is already loaded is a no-op.
    pub fn load(
        &self,
        cfg: &RoleParams,
        path: PathBuf,
        progress: Box<dyn FnMut(f32) + Send>,
    ) -> Result<RoleInfo, LoadError> {
        let _one_at_a_time = self.inner.loading.lock().unwrap_or_else(|p| p.into_inner());
        if self.inner.roles.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&cfg.role) {
            return Ok(self.info(&cfg.role).expect("role is loaded"));
        }
        let placement = place(cfg.backend);
        let key = ModelKey::new(&path, cfg.mmap, &placement);
        let existing = self.inner.models.lock().unwrap_or_else(|p| p.into_inner()).get(&key).and_then(Weak::upgrade);
        let model = match existing {
            Some(m) => {
                tracing::info!(role = %cfg.role, path = %path.display(), "sharing an already loaded model");
                m
            }
            None => {
                let t = Instant::now();
                let m = SharedModel::load(&path, cfg.mmap, placement, progress)?;
                tracing::info!(role = %cfg.role, path = %path.display(), secs = t.elapsed().as_secs_f64(), "model loaded");
                self.inner.models.lock().unwrap_or_else(|p| p.into_inner()).insert(key, Arc::downgrade(&m));
                m
            }
        };
        let worker = Worker::start(cfg.clone(), model.clone(), self.queue_capacity(), self.compute.clone())?;
        self.inner.roles.lock().unwrap_or_else(|p| p.into_inner()).insert(cfg.role.clone(), {
            let prefix_path = prefix_file::path(cfg, &model).map(|(p, _)| p);
            Role { worker, model, cfg: cfg.clone(), prefix_path }
        });
        Ok(self.info(&cfg.role).expect("role was just loaded"))
    }

    /// Unload a role: its thread finishes the running request (those queued behind it are
    /// answered `no_model`), then its context is freed; the model goes when no other role uses
    /// it. Returns false when the role was not loaded.
    pub fn unload(&self, role: &str) -> bool {
        let removed = self.inner.roles.lock().unwrap_or_else(|p| p.into_inner()).remove(role);
        let Some(removed) = removed else { return false };
        drop(removed.worker);
        drop(removed.model);
        self.inner.models.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, w| w.strong_count() > 0);
        true
    }

    /// Requests queued or running on `role` (None when not loaded).
    pub fn pending(&self, role: &str) -> Option<usize> {
        self.inner.roles.lock().unwrap_or_else(|p| p.into_inner()).get(role).map(|r| r.worker.pending())
    }

    /// Tokens `role` generated since it loaded (None when not loaded).
    pub fn generated_tokens(&self, role: &str) -> Option<u64> {
        self.inner.roles.lock().unwrap_or_else(|p| p.into_inner()).get(role).map(|r| r.worker.generated())
    }

    /// How many requests a role queues beyond the running one.
    pub fn queue_capacity(&self) -> usize {
        self.queue_capacity.unwrap_or(DEFAULT_QUEUE)
    }

    pub fn loaded_roles(&self) -> Vec<String> {
        let mut v: Vec<_> = self.inner.roles.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        v.sort();
        v
    }

    /// Number of distinct models in memory (roles sharing a file count once).
    pub fn loaded_models(&self) -> usize {
        self.inner.models.lock().unwrap_or_else(|p| p.into_inner()).values().filter(|w| w.strong_count() > 0).count()
    }

    pub fn info(&self, role: &str) -> Option<RoleInfo> {
        let roles = self.inner.roles.lock().unwrap_or_else(|p| p.into_inner());
        let r = roles.get(role)?;
        let m = &r.model;
        Some(RoleInfo {
            role: role.to_string(),
            path: m.path.clone(),
            architecture: m.header.architecture().unwrap_or("?").to_string(),
            file_bytes: m.file_bytes(),
            n_ctx: r.cfg.n_ctx,
            placement: m.placement.clone(),
            shares_model_with: roles
                .iter()
                .filter(|(name, o)| name.as_str() != role && Arc::ptr_eq(&o.model, m))
                .map(|(name, _)| name.clone())
                .collect(),
            failed: r.worker.failed(),
            prefix_file: r
                .prefix_path
                .as_ref()
                .and_then(|p| std::fs::metadata(p).ok().map(|meta| (p.clone(), meta.len()))),
        })
    }

    /// Queue `msg` on `role`'s worker (`no_model` when it is not loaded, `busy` when full).
    fn submit(&self, role: &str, msg: Msg) -> Result<(), GenerateError> {
        let roles = self.inner.roles.lock().unwrap_or_else(|p| p.into_inner());
        let r = roles.get(role).ok_or_else(|| GenerateError::NoModel(role.to_string()))?;
        r.worker.submit(msg)
    }
}

impl Llm for Engine {
    fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<mpsc::UnboundedReceiver<GenEvent>, LlmError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let role = request.role.clone();
        self.submit(&role, Msg::Generate(Box::new(Job { request, cancel, events: tx, submitted: Instant::now() })))?;
        Ok(rx)
    }

    fn classify(
        &self,
        request: ClassifyRequest,
        cancel: CancellationToken,
    ) -> Result<oneshot::Receiver<Result<Classification, LlmError>>, LlmError> {
        let (reply, rx) = oneshot::channel();
        let role = request.role.clone();
        self.submit(&role, Msg::Classify(Box::new(ClassifyJob { request, cancel, reply })))?;
        Ok(rx)
    }

    fn prefill(
        &self,
        request: PrefillRequest,
        cancel: CancellationToken,
    ) -> Result<oneshot::Receiver<Result<Prefilled, LlmError>>, LlmError> {
        let (reply, rx) = oneshot::channel();
        let role = request.role.clone();
        self.submit(&role, Msg::Prefill(Box::new(PrefillJob { request, cancel, reply })))?;
        Ok(rx)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Stop every role's thread before the models go.
        self.roles.get_mut().unwrap_or_else(|p| p.into_inner()).clear();
    }
}
