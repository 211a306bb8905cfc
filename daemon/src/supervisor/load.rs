//! Loading under the budget: plan from the file header, evict idle lower-priority roles (never a
//! leased one), load, enter the ledger; unload; keep-alive; memory pressure.

use kazeia_ipc::{ErrorCode, ModelState};
use kazeia_memory_budget::pressure::{self, Level, Watermarks};
use kazeia_pipelines::LlmError;
use std::sync::Arc;
use std::time::Instant;

use super::Supervisor;

/// What an unload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unload {
    Done,
    NotLoaded,
    /// Turns hold the role (their leases): it stays.
    InUse(usize),
}

impl Supervisor {
    /// Load `role` unless it is loaded; `progress` sees the load's progress. Concurrent callers
    /// for one role wait for the same load.
    pub async fn ensure_loaded(&self, role: &str, progress: impl Fn(f32) + Send + 'static) -> Result<(), LlmError> {
        self.load_unless(role, progress, None).await
    }

    /// [`Supervisor::ensure_loaded`] for a turn: cancelled (`cancelled`) before its load began,
    /// once it has the loads' lock, it gives up its place. A load under way goes on to its end.
    pub async fn load_for_turn(
        &self,
        role: &str,
        progress: impl Fn(f32) + Send + 'static,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<(), LlmError> {
        self.load_unless(role, progress, Some(cancel)).await
    }

    async fn load_unless(
        &self,
        role: &str,
        progress: impl Fn(f32) + Send + 'static,
        cancel: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<(), LlmError> {
        match self.engine.info(role).map(|i| i.failed) {
            // Loaded, and no unload has begun on it (else: wait for that below, and load again).
            Some(None) if !self.unloading.lock().expect("unloading").contains(role) => return Ok(()),
            Some(None) => {}
            // Its worker panicked: a fresh context, not a zombie (whoever holds it).
            Some(Some(why)) => {
                tracing::warn!(role, "reloading a role that failed: {why}");
                let _one_at_a_time = self.loading.lock().await;
                self.unload_held(role, true).await;
            }
            None => {}
        }
        let cfg = self.config.model(role).map_err(|e| LlmError::new(ErrorCode::NoModel, e.to_string()))?.clone();
        let _one_at_a_time = self.loading.lock().await;
        if self.engine.info(role).is_some() {
            return Ok(());
        }
        if cancel.is_some_and(|c| c.is_cancelled()) {
            return Err(LlmError::new(ErrorCode::Cancelled, "cancelled before its load began"));
        }
        let path = self.config.model_path(&cfg);
        // Plan before loading: the header gives the cost; the ledger says who must go.
        let header = kazeia_memory_budget::gguf::read_header(&path).map_err(|e| {
            self.set_role(role, ModelState::Failed, None, Some(e.to_string()));
            LlmError::new(ErrorCode::ModelFile, e.to_string())
        })?;
        let est = kazeia_memory_budget::estimate(&header, &cfg.context_params()).map_err(|e| {
            // As for a header that cannot be read: status says why (it said `unloaded`).
            let e = format!("{}: {e}", path.display());
            self.set_role(role, ModelState::Failed, None, Some(e.clone()));
            LlmError::new(ErrorCode::ModelFile, e)
        })?;
        let file = cfg.weights_key(&path);
        let (file_weights, context_bytes) = (est.file_bytes(), est.context_bytes());
        // Admission and reservation under one lock: the bytes are the role's before its load
        // starts, so a speech load running meanwhile sees them taken (and the other way round).
        // Evicting an idle role awaits its unload, so admission runs again after each round.
        for round in 0.. {
            let victims = {
                let mut ledger = self.ledger.lock().expect("ledger");
                let need = |l: &kazeia_memory_budget::Ledger| est.cost(l.holds_file(&file));
                let victims = ledger.admit_as(role, need, cfg.priority, |r| self.in_use(r)).map_err(|refusal| {
                    tracing::warn!("refused to load {role}: {refusal}");
                    LlmError::new(ErrorCode::OverBudget, refusal.to_string())
                })?;
                if victims.is_empty() {
                    ledger.insert(role, &file, cfg.priority, file_weights, context_bytes, None);
                    break;
                }
                victims
            };
            if round == 3 {
                let msg = format!("{role} still does not fit after evicting {victims:?} three times");
                return Err(LlmError::new(ErrorCode::OverBudget, msg));
            }
            for v in victims {
                tracing::info!(role = %v, for_role = %role, "evicting an idle model to make room");
                self.unload_held(&v, false).await;
            }
        }
        self.set_role(role, ModelState::Loading, Some(0.0), None);
        let engine = self.engine.clone();
        let measuring = self.meter.begin();
        let mut params = cfg.role_params();
        params.prefix_dir = self.config.daemon.prefix_dir();
        let result =
            tokio::task::spawn_blocking(move || engine.load(&params, path, Box::new(progress))).await.unwrap_or_else(
                |e| Err(kazeia_engine::LoadError::Thread { role: role.to_string(), reason: e.to_string() }),
            );
        match result {
            Ok(_) => {
                // Measured: RSS growth across the load (none if another load or unload ran
                // meanwhile). With mmap off the weights are read into anonymous memory, so RSS
                // covers them (Pss would be equal for this process).
                let measured = measuring.growth();
                let mut ledger = self.ledger.lock().expect("ledger");
                ledger.set_measured(role, measured);
                // Idle from now, not from its reservation: a load longer than the role's
                // keep-alive was unloaded as soon as it ended.
                ledger.touch(role);
                drop(ledger);
                self.set_role(role, ModelState::Loaded, None, None);
                Ok(())
            }
            Err(e) => {
                self.ledger.lock().expect("ledger").remove(role);
                self.set_role(role, ModelState::Failed, None, Some(e.to_string()));
                Err(e.into())
            }
        }
    }

    /// Unload a role (waits for its running request). False if it was not loaded.
    ///
    /// Under the loading lock, as loads are: the engine lets go of the role before the ledger
    /// does, and a load of the same role in between saw it gone from the engine but still in
    /// the ledger (refused: "needed for thinker … resident: thinker"), or had its fresh
    /// reservation removed by this unload's ledger update (found by the tight-budget soak).
    ///
    /// A role that admitted turns hold is not unloaded ([`Unload::InUse`]): such a turn may be
    /// between its load and its first request, and would find no model (seen in the soak as
    /// `no_model` after a reload step).
    pub async fn unload(&self, role: &str) -> Unload {
        let _one_at_a_time = self.loading.lock().await;
        self.unload_held(role, false).await
    }

    /// [`Supervisor::unload`] with the loading lock already held (evictions by a load);
    /// `force`: whatever holds it (a failed role, reloaded by the turn that found it failed).
    async fn unload_held(&self, role: &str, force: bool) -> Unload {
        {
            // Under `leases`: a turn leases before it checks `unloading`, so either this sees
            // its lease or the turn sees the unload begun.
            let leases = self.leases.lock().expect("leases lock");
            let held = leases.get(role).copied().unwrap_or(0);
            if held > 0 && !force {
                return Unload::InUse(held);
            }
            self.unloading.lock().expect("unloading").insert(role.to_string());
        }
        let engine = self.engine.clone();
        let r = role.to_string();
        let freeing = self.meter.begin();
        let unloaded = tokio::task::spawn_blocking(move || engine.unload(&r)).await.unwrap_or(false);
        if unloaded {
            super::heap::trim();
            self.ledger.lock().expect("ledger").remove(role);
            self.set_role(role, ModelState::Unloaded, None, None);
        }
        drop(freeing);
        self.unloading.lock().expect("unloading").remove(role);
        if unloaded {
            Unload::Done
        } else {
            Unload::NotLoaded
        }
    }

    /// Sample memory pressure and act on it: under low pressure shed idle sessions, idle models
    /// below the highest priority and the speech models idle a minute; under critical pressure
    /// also refuse new turns (see [`Supervisor::pressure`]). Subscribers hear of every change
    /// of level.
    pub async fn pressure_tick(self: &Arc<Self>) -> Level {
        self.pressure_tick_at(Instant::now()).await
    }

    /// [`Supervisor::pressure_tick`] as if the clock read `now` for the speech models' idle
    /// time (tests give a later instant rather than sleeping a minute).
    pub async fn pressure_tick_at(self: &Arc<Self>, now: Instant) -> Level {
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
            // The speech models (ledger priority 95) are below the top role too.
            let sup = self.clone();
            let speech = tokio::task::spawn_blocking(move || sup.shed_speech(now)).await.unwrap_or(false);
            if shed > 0 || !idle_low.is_empty() || speech {
                tracing::warn!(sessions = shed, models = ?idle_low, speech, "shed under memory pressure");
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

    /// Whether `m`'s role is loaded, unused, and was last used a keep-alive or more before `now`.
    fn idle_past_keep_alive(&self, m: &crate::config::ModelConfig, now: Instant) -> bool {
        let idle_since = self.ledger.lock().expect("ledger").get(&m.role).map(|e| e.last_used);
        matches!((m.keep_alive, idle_since), (Some(ka), Some(t)) if now.saturating_duration_since(t) >= ka)
            && !self.in_use(&m.role)
    }

    /// Unload roles idle for longer than their keep-alive. Returns the roles unloaded.
    pub async fn expire_idle(&self) -> Vec<String> {
        self.expire_idle_at(Instant::now()).await
    }

    /// [`Supervisor::expire_idle`] as if the clock read `now` (tests give a later instant
    /// rather than sleeping past a keep-alive).
    pub async fn expire_idle_at(&self, now: Instant) -> Vec<String> {
        let expired: Vec<String> =
            self.config.models.iter().filter(|m| self.idle_past_keep_alive(m, now)).map(|m| m.role.clone()).collect();
        let mut done = Vec::new();
        for r in expired {
            let _one_at_a_time = self.loading.lock().await;
            // Again under the loading lock, which a load holds for its whole length: a turn may
            // have used the role while this waited (it was unloaded straight after).
            if !self.config.models.iter().any(|m| m.role == r && self.idle_past_keep_alive(m, now)) {
                continue;
            }
            if self.unload_held(&r, false).await == Unload::Done {
                tracing::info!(role = %r, "keep-alive expired: unloaded");
                done.push(r);
            }
        }
        done
    }
}
