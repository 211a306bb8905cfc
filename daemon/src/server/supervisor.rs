//! The supervisor: the daemon's shared state — the engine, the model roles' states, the running
//! turns (for cancel by id), and status for clients and subscribers.
//!
//! Lock order: `roles` before `turns`. No lock is held across an await or an engine call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kazeia_ipc::{ErrorCode, ModelState, ModelStatus, StatusReport, PROTOCOL_VERSION};
use kazeia_pipelines::{LlmError, Registry};
use tokio::sync::{broadcast, Mutex as AsyncMutex};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::engine::Engine;

#[derive(Debug, Clone)]
struct RoleState {
    state: ModelState,
    progress: Option<f32>,
    error: Option<String>,
}

/// A running turn, findable by its client id for `cancel`.
#[derive(Clone)]
pub struct TurnEntry {
    pub conn: u64,
    pub uid: u32,
    pub cancel: CancellationToken,
}

pub struct Supervisor {
    pub engine: Engine,
    pub sessions: kazeia_pipelines::Sessions,
    pub config: Config,
    pub registry: Registry,
    started: Instant,
    roles: Mutex<HashMap<String, RoleState>>,
    turns: Mutex<HashMap<(u64, String), TurnEntry>>,
    /// One load at a time per role; waiters share the outcome.
    load_locks: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
    pub connections: AtomicU32,
    next_conn: AtomicU64,
    /// "Something changed": subscribers then fetch a fresh status.
    pub changes: broadcast::Sender<()>,
    /// Cancelled when the daemon begins to shut down: no new work is taken.
    pub stopping: CancellationToken,
}

impl Supervisor {
    pub fn new(config: Config, registry: Registry) -> Arc<Supervisor> {
        let engine = Engine::new().with_queue_capacity(config.daemon.queue_per_model).with_exclusive_compute(config.daemon.exclusive_compute);
        let roles = config
            .models
            .iter()
            .map(|m| (m.role.clone(), RoleState { state: ModelState::Unloaded, progress: None, error: None }))
            .collect();
        Arc::new(Supervisor {
            engine,
            sessions: kazeia_pipelines::Sessions::new(config.daemon.session_ttl),
            config,
            registry,
            started: Instant::now(),
            roles: Mutex::new(roles),
            turns: Mutex::default(),
            load_locks: Mutex::default(),
            connections: AtomicU32::new(0),
            next_conn: AtomicU64::new(1),
            changes: broadcast::channel(16).0,
            stopping: CancellationToken::new(),
        })
    }

    pub fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    fn set_role(&self, role: &str, state: ModelState, progress: Option<f32>, error: Option<String>) {
        self.roles.lock().expect("roles lock").insert(role.to_string(), RoleState { state, progress, error });
        let _ = self.changes.send(());
    }

    /// Load `role` unless it is loaded; `progress` sees the load's progress. Concurrent callers
    /// for one role wait for the same load.
    pub async fn ensure_loaded(&self, role: &str, progress: impl Fn(f32) + Send + 'static) -> Result<(), LlmError> {
        if self.engine.info(role).is_some() {
            return Ok(());
        }
        let cfg = self.config.model(role).map_err(|e| LlmError::new(ErrorCode::NoModel, e.to_string()))?.clone();
        let lock = self.load_locks.lock().expect("load lock").entry(role.to_string()).or_default().clone();
        let _guard = lock.lock().await;
        if self.engine.info(role).is_some() {
            return Ok(());
        }
        self.set_role(role, ModelState::Loading, Some(0.0), None);
        let path = self.config.model_path(&cfg);
        let engine = self.engine.clone();
        let result = tokio::task::spawn_blocking(move || engine.load(&cfg, path, Box::new(progress)))
            .await
            .map_err(|e| LlmError::new(ErrorCode::Engine, format!("load task: {e}")))?;
        match result {
            Ok(_) => {
                self.set_role(role, ModelState::Loaded, None, None);
                Ok(())
            }
            Err(e) => {
                self.set_role(role, ModelState::Failed, None, Some(e.to_string()));
                Err(e.into())
            }
        }
    }

    /// Unload a role (waits for its running request). False if it was not loaded.
    pub async fn unload(&self, role: &str) -> bool {
        let engine = self.engine.clone();
        let r = role.to_string();
        let unloaded = tokio::task::spawn_blocking(move || engine.unload(&r)).await.unwrap_or(false);
        if unloaded {
            self.set_role(role, ModelState::Unloaded, None, None);
        }
        unloaded
    }

    /// Record a running turn. False when this connection already runs a request with that id.
    pub fn add_turn(&self, conn: u64, id: &str, entry: TurnEntry) -> bool {
        let mut turns = self.turns.lock().expect("turns lock");
        if turns.contains_key(&(conn, id.to_string())) {
            return false;
        }
        turns.insert((conn, id.to_string()), entry);
        true
    }

    pub fn remove_turn(&self, conn: u64, id: &str) {
        self.turns.lock().expect("turns lock").remove(&(conn, id.to_string()));
    }

    /// Cancel the request `id`: this connection's first, else one of the same user's other
    /// connections (so that `kazeia cancel ID` works from another process).
    pub fn cancel(&self, conn: u64, uid: u32, id: &str) -> bool {
        let turns = self.turns.lock().expect("turns lock");
        if let Some(t) = turns.get(&(conn, id.to_string())) {
            t.cancel.cancel();
            return true;
        }
        let mut found = false;
        for ((_, tid), t) in turns.iter() {
            if tid == id && t.uid == uid {
                t.cancel.cancel();
                found = true;
            }
        }
        found
    }

    pub fn turns_running(&self) -> u32 {
        self.turns.lock().expect("turns lock").len() as u32
    }

    /// Cancel every running turn (shutdown after the grace time).
    pub fn cancel_all(&self) {
        for t in self.turns.lock().expect("turns lock").values() {
            t.cancel.cancel();
        }
    }

    pub fn status(&self) -> StatusReport {
        let roles = self.roles.lock().expect("roles lock").clone();
        let models = self
            .config
            .models
            .iter()
            .map(|m| {
                let st = roles.get(&m.role).cloned().unwrap_or(RoleState { state: ModelState::Unloaded, progress: None, error: None });
                let info = self.engine.info(&m.role);
                let placement = info.as_ref().map(|i| i.placement.clone()).unwrap_or_else(|| crate::engine::place(m.backend));
                ModelStatus {
                    role: m.role.clone(),
                    state: st.state,
                    file: self.config.model_path(m).display().to_string(),
                    architecture: info.as_ref().map(|i| i.architecture.clone()),
                    file_bytes: info.as_ref().map(|i| i.file_bytes),
                    device: Some(placement.device.clone()),
                    placement: Some(placement.reason.clone()),
                    shares_model_with: info.map(|i| i.shares_model_with).unwrap_or_default(),
                    busy: self.engine.pending(&m.role).unwrap_or(0) as u32,
                    progress: st.progress,
                    error: st.error,
                }
            })
            .collect();
        StatusReport {
            server: format!("kazeia {}", env!("CARGO_PKG_VERSION")),
            protocol: PROTOCOL_VERSION,
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            connections: self.connections.load(Ordering::Relaxed),
            turns_running: self.turns_running(),
            pipelines: self.registry.names().map(str::to_string).collect(),
            models,
        }
    }
}
