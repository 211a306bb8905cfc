//! The supervisor: the daemon's shared state — the engine, the model roles' states, the running
//! turns (for cancel by id), and status for clients and subscribers. One per process: `kazeia
//! serve` and `kazeia run` both go through it, so the budget and the ledger apply to both.
//!
//! - `turn`: admission (one place) and the [`Turn`] a request lives in, with its leases;
//! - `load`: loading under the budget, eviction, keep-alive, memory pressure;
//! - `speech`: the speech models, loaded once;
//! - `status`: the report clients, subscribers and D-Bus read.
//!
//! Lock order: `roles` before `turns` before `ledger` before `leases` before `unloading`; the
//! load meter's lock is taken last and alone. No std lock is held across an await or an engine call; `loading` (async) is held across a whole admission + load.

mod heap;
mod load;
mod meter;
mod speech;
mod status;
mod turn;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kazeia_engine::Engine;
use kazeia_ipc::ModelState;
use kazeia_memory_budget::pressure::Level;
use kazeia_pipelines::Registry;
use tokio::sync::{broadcast, Mutex as AsyncMutex};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
pub use load::Unload;
pub use speech::{SpeechRole, SpeechStack, SPEECH_IDLE_BEFORE_SHED};
use turn::TurnEntry;
pub use turn::{Lease, Turn, TurnRequest, Who};

#[derive(Debug, Clone)]
struct RoleState {
    state: ModelState,
    progress: Option<f32>,
    error: Option<String>,
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
    /// Roles an unload has begun on: a turn does not take them for loaded (it waits for the
    /// unload, then loads them again). Entered under `leases`, after checking none is held.
    unloading: Mutex<std::collections::HashSet<String>>,
    /// What each loaded role holds against the budget.
    pub ledger: Mutex<kazeia_memory_budget::Ledger>,
    /// The last pressure level sampled.
    pressure: Mutex<Level>,
    pub connections: AtomicU32,
    /// Open connections per peer uid (`[daemon] max_connections_per_uid`).
    pub per_uid: Mutex<HashMap<u32, u32>>,
    next_conn: AtomicU64,
    /// "Something changed": subscribers then fetch a fresh status.
    pub changes: broadcast::Sender<()>,
    /// Cancelled when the daemon begins to shut down: no new work is taken.
    pub stopping: CancellationToken,
    /// The speech models, loaded by the first audio turn (or at start: `[speech] preload`).
    speech: Mutex<Option<Arc<SpeechStack>>>,
    /// Held across a speech load or unload (never `speech` itself: status reads that).
    speech_loading: Mutex<()>,
    /// The stack was taken from `speech` and is being freed (set under `speech`): status says
    /// `loaded` until its memory is gone, as for a language model, not `loading` (it read
    /// `speech_loading` held with no stack as a load).
    speech_freeing: std::sync::atomic::AtomicBool,
    /// Audio turns running (each holds a [`speech::SpeechUse`]): `unload stt` waits for none.
    speech_users: std::sync::atomic::AtomicUsize,
    /// When the last claim on the speech models ended (or the daemon started): memory pressure
    /// sheds them only after [`speech::SPEECH_IDLE_BEFORE_SHED`] of no use.
    speech_released: Mutex<Instant>,
    /// Loads and unloads under way: a load's `measured_bytes` only when it ran alone.
    meter: meter::LoadMeter,
}

/// Without exclusive compute each role decodes on its own thread, side by side only while their
/// threads fit the cores (engine/src/cores.rs): threads beyond the cores spin at barriers while
/// the ones they wait for have no core. A set whose roles together want more threads than
/// there are cores gets no parallel decoding from `exclusive_compute = false`: say so at start.
fn note_if_roles_outnumber_cores(config: &Config) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads: u32 = config.models.iter().map(|m| m.threads).sum();
    if !config.daemon.exclusive_compute && threads as usize > cores {
        tracing::info!(
            "exclusive_compute = false with {threads} decode threads across the roles on {cores} cores: \
             a decode starts when its role's threads fit in the cores the others leave, so roles \
             whose threads do not fit together take turns"
        );
    }
}

impl Supervisor {
    pub fn new(config: Config, registry: Registry) -> Arc<Supervisor> {
        heap::fix_mmap_threshold();
        note_if_roles_outnumber_cores(&config);
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
            unloading: Mutex::default(),
            ledger: Mutex::new(kazeia_memory_budget::Ledger::new(budget)),
            pressure: Mutex::new(Level::Normal),
            connections: AtomicU32::new(0),
            per_uid: Mutex::default(),
            next_conn: AtomicU64::new(1),
            changes: broadcast::channel(16).0,
            stopping: CancellationToken::new(),
            speech: Mutex::new(None),
            speech_loading: Mutex::new(()),
            speech_freeing: std::sync::atomic::AtomicBool::new(false),
            speech_users: std::sync::atomic::AtomicUsize::new(0),
            speech_released: Mutex::new(Instant::now()),
            meter: meter::LoadMeter::default(),
        })
    }

    /// A role that must stay loaded: a turn holds it or the engine has work for it.
    pub(crate) fn in_use(&self, role: &str) -> bool {
        // A ledger entry that is no language model's (the speech stack, a voice reserved apart,
        // `speech:tts-fr`) is never evicted by a language model's load (only `unload stt`): the
        // engine cannot unload it. Offered as a victim, a voice stayed reserved while the idle
        // guard beside it was unloaded for nothing, and the load was refused anyway.
        self.config.model(role).is_err() || self.leased(role) > 0 || self.engine.pending(role).unwrap_or(0) > 0
    }

    pub fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    fn set_role(&self, role: &str, state: ModelState, progress: Option<f32>, error: Option<String>) {
        self.roles.lock().expect("roles lock").insert(role.to_string(), RoleState { state, progress, error });
        let _ = self.changes.send(());
    }

    pub fn pressure(&self) -> Level {
        *self.pressure.lock().expect("pressure")
    }

    /// Cancel this connection's turn `id`, if it still runs.
    pub fn cancel_own(&self, conn: u64, id: &str) -> bool {
        let turns = self.turns.lock().expect("turns lock");
        turns.get(&(conn, id.to_string())).inspect(|t| t.cancel.cancel()).is_some()
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

    /// Whether a turn runs under `id` on connection `conn`.
    pub fn is_running(&self, conn: u64, id: &str) -> bool {
        self.turns.lock().expect("turns lock").contains_key(&(conn, id.to_string()))
    }

    pub fn turns_running(&self) -> u32 {
        self.turns.lock().expect("turns lock").len() as u32
    }

    /// Cancel every running turn (shutdown after the grace time).
    pub fn cancel_all(&self) {
        self.cancel_of(None);
    }

    /// Cancel the running turns of user `uid` (every user's with none); how many.
    pub fn cancel_of(&self, uid: Option<u32>) -> u32 {
        let turns = self.turns.lock().expect("turns lock");
        let mine = turns.values().filter(|t| uid.is_none_or(|u| t.uid == u));
        mine.map(|t| t.cancel.cancel()).count() as u32
    }
}

#[cfg(test)]
impl Supervisor {
    /// A supervisor on the models.toml text `models_toml`, with the built-in pipelines, that has
    /// loaded nothing (unit tests of its bookkeeping).
    pub(crate) fn for_test(models_toml: &str) -> Arc<Supervisor> {
        let config = Config::parse(std::path::Path::new("models.toml"), models_toml).unwrap();
        Supervisor::new(config, Registry::builtin())
    }
}
