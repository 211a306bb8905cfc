//! The supervisor: the daemon's shared state — the engine, the model roles' states, the running
//! turns (for cancel by id), and status for clients and subscribers.
//!
//! Lock order: `roles` before `turns` before `ledger` before `leases`. No std lock is held
//! across an await or an engine call; `loading` (async) is held across a whole admission + load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kazeia_ipc::{ErrorCode, ModelState, ModelStatus, StatusReport, PROTOCOL_VERSION};
use kazeia_pipelines::{LlmError, Registry};
use tokio::sync::{broadcast, Mutex as AsyncMutex};
use tokio_util::sync::CancellationToken;

use kazeia_memory_budget::pressure::{self, Level, Watermarks};

use crate::config::Config;
use kazeia_engine::Engine;

#[derive(Debug, Clone)]
struct RoleState {
    state: ModelState,
    progress: Option<f32>,
    error: Option<String>,
}

/// A turn's hold on the roles of its pipeline, from admission until it is dropped. Admission
/// counts leases, not engine jobs: a turn just accepted has not queued any work yet (it may
/// still be loading), and between a guarded turn's two guard checks the guard has no job at
/// all. A leased role is never evicted, shed under pressure or unloaded by keep-alive.
pub struct Lease {
    sup: Arc<Supervisor>,
    roles: Vec<String>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut leases = self.sup.leases.lock().expect("leases lock");
        for r in &self.roles {
            if let Some(n) = leases.get_mut(r) {
                *n -= 1;
                if *n == 0 {
                    leases.remove(r);
                }
            }
        }
        drop(leases);
        let _ = self.sup.changes.send(());
    }
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
    /// One admission + load at a time: the ledger's view stays true while a load decides.
    loading: AsyncMutex<()>,
    /// Admitted turns per role (see [`Lease`]).
    leases: Mutex<HashMap<String, usize>>,
    /// What each loaded role holds against the budget.
    pub ledger: Mutex<kazeia_memory_budget::Ledger>,
    /// The last pressure level sampled.
    pressure: Mutex<Level>,
    pub connections: AtomicU32,
    next_conn: AtomicU64,
    /// "Something changed": subscribers then fetch a fresh status.
    pub changes: broadcast::Sender<()>,
    /// Cancelled when the daemon begins to shut down: no new work is taken.
    pub stopping: CancellationToken,
    /// The speech models, loaded by the first audio turn.
    speech: Mutex<Option<Arc<super::voice::SpeechStack>>>,
}

impl Supervisor {
    pub fn new(config: Config, registry: Registry) -> Arc<Supervisor> {
        let budget = config.budget.budget_bytes();
        // Admission is by lease (see [`Lease`]); the engine's own bound is a backstop sized so
        // that admitted turns never reach it (a turn may have two jobs on one role at once).
        let backstop = 2 * (config.daemon.queue_per_model + 1);
        let engine =
            Engine::new().with_queue_capacity(backstop).with_exclusive_compute(config.daemon.exclusive_compute);
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
            loading: AsyncMutex::new(()),
            leases: Mutex::default(),
            ledger: Mutex::new(kazeia_memory_budget::Ledger::new(budget)),
            pressure: Mutex::new(Level::Normal),
            connections: AtomicU32::new(0),
            next_conn: AtomicU64::new(1),
            changes: broadcast::channel(16).0,
            stopping: CancellationToken::new(),
            speech: Mutex::new(None),
        })
    }

    /// Admit a turn on `roles`: each may hold `queue_per_model` turns beyond the running one;
    /// past that the turn is refused with `busy` at once (nothing is counted then).
    pub fn lease(self: &Arc<Self>, roles: &[String]) -> Result<Lease, LlmError> {
        let capacity = self.config.daemon.queue_per_model;
        let mut leases = self.leases.lock().expect("leases lock");
        if let Some(full) = roles.iter().find(|r| leases.get(*r).copied().unwrap_or(0) > capacity) {
            let msg = format!("role {full:?} has {capacity} requests waiting: try again later");
            return Err(LlmError::new(ErrorCode::Busy, msg));
        }
        for r in roles {
            *leases.entry(r.clone()).or_insert(0) += 1;
        }
        drop(leases);
        let _ = self.changes.send(());
        Ok(Lease { sup: self.clone(), roles: roles.to_vec() })
    }

    /// Turns holding `role`.
    pub fn leased(&self, role: &str) -> usize {
        self.leases.lock().expect("leases lock").get(role).copied().unwrap_or(0)
    }

    /// A role that must stay loaded: a turn holds it or the engine has work for it.
    fn in_use(&self, role: &str) -> bool {
        self.leased(role) > 0 || self.engine.pending(role).unwrap_or(0) > 0
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
        let _one_at_a_time = self.loading.lock().await;
        if self.engine.info(role).is_some() {
            return Ok(());
        }
        let path = self.config.model_path(&cfg);
        // Plan before loading: the header gives the cost; the ledger says who must go.
        let header = kazeia_memory_budget::gguf::read_header(&path).map_err(|e| {
            self.set_role(role, ModelState::Failed, None, Some(e.to_string()));
            LlmError::new(ErrorCode::ModelFile, e.to_string())
        })?;
        let est = kazeia_memory_budget::estimate(&header, &cfg.context_params())
            .map_err(|e| LlmError::new(ErrorCode::ModelFile, e))?;
        let file = std::fs::canonicalize(&path).unwrap_or(path.clone()).display().to_string();
        let file_weights = est.weights_bytes + est.repack_bytes;
        let context_bytes = est.kv_bytes + est.recurrent_bytes + est.compute_bytes + est.overhead_bytes;
        let need = context_bytes + if self.ledger.lock().expect("ledger").holds_file(&file) { 0 } else { file_weights };
        let admitted = self.ledger.lock().expect("ledger").admit(role, need, cfg.priority, |r| self.in_use(r));
        let victims = admitted.map_err(|refusal| {
            tracing::warn!("refused to load {role}: {refusal}");
            LlmError::new(ErrorCode::OverBudget, refusal.to_string())
        })?;
        for v in victims {
            tracing::info!(role = %v, for_role = %role, "evicting an idle model to make room");
            self.unload(&v).await;
        }
        self.set_role(role, ModelState::Loading, Some(0.0), None);
        let engine = self.engine.clone();
        let rss_before = rss_bytes();
        let result = tokio::task::spawn_blocking(move || engine.load(&cfg.role_params(), path, Box::new(progress)))
            .await
            .map_err(|e| LlmError::new(ErrorCode::Engine, format!("load task: {e}")))?;
        match result {
            Ok(_) => {
                // Measured: RSS growth across the load. With mmap off the weights are read into
                // anonymous memory, so RSS covers them (Pss would be equal for this process).
                let measured = rss_before.zip(rss_bytes()).map(|(a, b)| b as i64 - a as i64);
                let priority = self.config.model(role).map(|m| m.priority).unwrap_or(0);
                self.ledger.lock().expect("ledger").insert(
                    role,
                    &file,
                    priority,
                    file_weights,
                    context_bytes,
                    measured,
                );
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
            super::heap::trim();
            self.ledger.lock().expect("ledger").remove(role);
            self.set_role(role, ModelState::Unloaded, None, None);
        }
        unloaded
    }

    pub fn pressure(&self) -> Level {
        *self.pressure.lock().expect("pressure")
    }

    /// Sample memory pressure and act on it: under low pressure shed idle sessions and idle
    /// models below the highest priority; under critical pressure also refuse new turns (see
    /// [`Supervisor::pressure`]). Subscribers hear of every change of level.
    pub async fn pressure_tick(&self) -> Level {
        let Ok(sample) = pressure::sample() else { return self.pressure() };
        let b = &self.config.budget;
        let marks = Watermarks {
            low_available: b.low_watermark,
            critical_available: b.critical_watermark,
            budget: b.budget_bytes(),
        };
        let level = pressure::level(&sample, &marks);
        let changed = std::mem::replace(&mut *self.pressure.lock().expect("pressure"), level) != level;
        if changed {
            tracing::warn!(?level, available = sample.available, rss = sample.rss, "memory pressure changed");
            let _ = self.changes.send(());
        }
        if level >= Level::Low {
            let shed = self.sessions.shed(std::time::Duration::from_secs(60));
            let top = self.config.models.iter().map(|m| m.priority).max().unwrap_or(0);
            let idle_low: Vec<String> = self
                .config
                .models
                .iter()
                .filter(|m| m.priority < top && self.engine.info(&m.role).is_some() && !self.in_use(&m.role))
                .map(|m| m.role.clone())
                .collect();
            for r in &idle_low {
                self.unload(r).await;
            }
            if shed > 0 || !idle_low.is_empty() {
                tracing::warn!(sessions = shed, models = ?idle_low, "shed under memory pressure");
            }
        }
        level
    }

    /// A turn used these roles now (least-recent-use order and keep-alive).
    pub fn touch(&self, roles: &[String]) {
        let mut ledger = self.ledger.lock().expect("ledger");
        for r in roles {
            ledger.touch(r);
        }
    }

    /// Unload roles idle for longer than their keep-alive. Returns the roles unloaded.
    pub async fn expire_idle(&self) -> Vec<String> {
        self.expire_idle_at(Instant::now()).await
    }

    /// [`Supervisor::expire_idle`] as if the clock read `now` (tests give a later instant
    /// rather than sleeping past a keep-alive).
    pub async fn expire_idle_at(&self, now: Instant) -> Vec<String> {
        let expired: Vec<String> = {
            let ledger = self.ledger.lock().expect("ledger");
            self.config
                .models
                .iter()
                .filter(|m| {
                    let idle_since = ledger.get(&m.role).map(|e| e.last_used);
                    matches!((m.keep_alive, idle_since), (Some(ka), Some(t)) if now.saturating_duration_since(t) >= ka)
                        && !self.in_use(&m.role)
                })
                .map(|m| m.role.clone())
                .collect()
        };
        let mut done = Vec::new();
        for r in expired {
            if self.unload(&r).await {
                tracing::info!(role = %r, "keep-alive expired: unloaded");
                done.push(r);
            }
        }
        done
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
    /// The speech stack, loaded on first use and entered in the ledger as role `speech`
    /// (estimate: ONNX file size × the measured factor; then the measured RSS growth). It never
    /// evicts a language model: if it does not fit, the audio turn is refused.
    pub fn speech(&self) -> Result<Arc<super::voice::SpeechStack>, crate::speech::SpeechError> {
        let mut slot = self.speech.lock().expect("speech");
        if let Some(s) = &*slot {
            return Ok(s.clone());
        }
        // The STT row of the plan (file sizes only: no GGUF header is read here).
        let need: u64 =
            crate::plan::speech_plans(&self.config).iter().filter(|m| m.role == "stt").map(|m| m.total_bytes).sum();
        let refused = self.ledger.lock().expect("ledger").admit("speech", need, 95, |_| true);
        match refused {
            Ok(v) if v.is_empty() => {}
            Ok(_) => {
                return Err(crate::speech::SpeechError::Run(format!(
                    "over budget: speech needs {need} B and would have to evict a language model"
                )))
            }
            Err(r) => return Err(crate::speech::SpeechError::Run(format!("over budget: {r}"))),
        }
        let before = rss_bytes();
        let stack = Arc::new(super::voice::SpeechStack::load(self)?);
        let measured = before.zip(rss_bytes()).map(|(a, b)| b as i64 - a as i64);
        let file = self.config.cache_path(&self.config.speech.stt).display().to_string();
        self.ledger.lock().expect("ledger").insert("speech", &file, 95, 0, need, measured);
        let _ = self.changes.send(());
        *slot = Some(stack.clone());
        Ok(stack)
    }

    /// Status rows of the speech models (`stt`, `vad`, `tts`): where they run and why.
    fn speech_status(&self, ledger: &kazeia_memory_budget::Ledger) -> Vec<ModelStatus> {
        let loaded = self.speech.lock().expect("speech").clone();
        let entry = ledger.get("speech");
        let sp = &self.config.speech;
        let row =
            |role: &str, file: String, device: Option<String>, placement: Option<String>, first: bool| ModelStatus {
                role: role.into(),
                state: if loaded.is_some() { ModelState::Loaded } else { ModelState::Unloaded },
                file,
                architecture: Some("onnx".into()),
                file_bytes: None,
                device,
                placement: placement.or_else(|| Some("loaded by the first audio turn".into())),
                shares_model_with: vec![],
                busy: 0,
                turns: 0,
                generated_tokens: 0,
                reserved_bytes: if first { entry.map(|e| e.reserved) } else { None },
                measured_bytes: if first { entry.and_then(|e| e.measured) } else { None },
                progress: None,
                error: None,
            };
        let (stt_dev, stt_why, vad_dev) = match &loaded {
            Some(s) => {
                let t = s.stt.lock().expect("stt");
                (
                    Some(t.whisper.placement.device.clone()),
                    Some(t.whisper.placement.reason.clone()),
                    Some(t.vad.placement.device.clone()),
                )
            }
            None => (None, None, None),
        };
        let mut rows = vec![
            row("stt", self.config.cache_path(&sp.stt).display().to_string(), stt_dev, stt_why.clone(), true),
            row("vad", self.config.cache_path(&sp.vad).display().to_string(), vad_dev, stt_why, false),
        ];
        for (lang, v) in &sp.voices {
            rows.push(row(
                &format!("tts-{lang}"),
                v.clone(),
                None,
                Some(if v.starts_with("espeak:") {
                    "espeak-ng (CPU), loaded on first use".into()
                } else {
                    "ONNX, loaded on first use".into()
                }),
                false,
            ));
        }
        rows
    }

    pub fn cancel_all(&self) {
        for t in self.turns.lock().expect("turns lock").values() {
            t.cancel.cancel();
        }
    }

    pub fn status(&self) -> StatusReport {
        let roles = self.roles.lock().expect("roles lock").clone();
        let ledger = self.ledger.lock().expect("ledger").clone();
        let models = self
            .config
            .models
            .iter()
            .map(|m| {
                let st = roles.get(&m.role).cloned().unwrap_or(RoleState {
                    state: ModelState::Unloaded,
                    progress: None,
                    error: None,
                });
                let info = self.engine.info(&m.role);
                let placement =
                    info.as_ref().map(|i| i.placement.clone()).unwrap_or_else(|| kazeia_engine::place(m.backend));
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
                    turns: self.leased(&m.role) as u32,
                    generated_tokens: self.engine.generated_tokens(&m.role).unwrap_or(0),
                    reserved_bytes: ledger.get(&m.role).map(|e| e.reserved),
                    measured_bytes: ledger.get(&m.role).and_then(|e| e.measured),
                    progress: st.progress,
                    error: st.error,
                }
            })
            .collect::<Vec<_>>();
        let mut models = models;
        models.extend(self.speech_status(&ledger));
        StatusReport {
            server: format!("kazeia {}", env!("CARGO_PKG_VERSION")),
            protocol: PROTOCOL_VERSION,
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            connections: self.connections.load(Ordering::Relaxed),
            turns_running: self.turns_running(),
            pipelines: self
                .registry
                .names()
                .map(str::to_string)
                .chain(["transcribe".to_string(), "speak".to_string(), "voice".to_string()])
                .collect(),
            budget_bytes: ledger.budget,
            pressure: format!("{:?}", self.pressure()).to_lowercase(),
            reserved_bytes: ledger.used(),
            models,
        }
    }
}

/// This process's resident set size (VmRSS), bytes.
fn rss_bytes() -> Option<u64> {
    pressure::sample().ok().map(|s| s.rss)
}
