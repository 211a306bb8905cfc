//! `org.kazeia.Engine1` on D-Bus (opt-in, `[dbus] enabled = true`): for system tools and
//! desktop shells that watch the engine without speaking its socket protocol.
//!
//! Object `/org/kazeia/Engine1`, interface `org.kazeia.Engine1`:
//! - properties: `State` (s: serving / stopping), `LoadedModels` (as), `MemoryUsed` (t: the
//!   process's RSS), `MemoryReserved` (t: the ledger), `MemoryBudget` (t), `Pressure` (s);
//!   changes are announced with `PropertiesChanged`;
//! - signals: `ModelLoaded(s role)`, `ModelUnloaded(s role)`,
//!   `MemoryPressure(s level, t available_bytes)`;
//! - methods: `Status() -> s` (the socket's status report, as JSON), `CancelAll() -> u` (turns
//!   cancelled: the caller's own, every user's for the daemon's own user; a user the socket
//!   refuses is refused here too, `AccessDenied`).
//!
//! The bus is a side door: if it cannot be reached the daemon says so and serves on its socket.

use std::collections::BTreeSet;
use std::sync::Arc;

use kazeia_ipc::ModelState;
use zbus::object_server::SignalEmitter;

use super::Supervisor;
use crate::config::DbusConfig;

pub const PATH: &str = "/org/kazeia/Engine1";

pub struct Engine {
    sup: Arc<Supervisor>,
}

fn loaded(sup: &Supervisor) -> Vec<String> {
    sup.status().models.into_iter().filter(|m| m.state == ModelState::Loaded).map(|m| m.role).collect()
}

impl Engine {
    /// The uid of a method's caller, asked of the bus, if the socket would serve it (the
    /// daemon's own user or `allow_uids`); else `AccessDenied`.
    async fn caller(
        &self,
        header: &zbus::message::Header<'_>,
        conn: &zbus::Connection,
        method: &str,
    ) -> zbus::fdo::Result<u32> {
        let denied = |why: String| zbus::fdo::Error::AccessDenied(why);
        let sender = header.sender().ok_or_else(|| denied("a call without a sender".into()))?.to_owned();
        let uid = zbus::fdo::DBusProxy::new(conn).await?.get_connection_unix_user(sender.into()).await?;
        let own = unsafe { libc::geteuid() };
        if uid != own && !self.sup.config.daemon.allow_uids.contains(&uid) {
            tracing::warn!(uid, method, "D-Bus call refused: uid not allowed");
            return Err(denied(format!("uid {uid} may not use this daemon")));
        }
        Ok(uid)
    }
}

fn level_name(sup: &Supervisor) -> String {
    format!("{:?}", sup.pressure()).to_lowercase()
}

#[zbus::interface(name = "org.kazeia.Engine1")]
impl Engine {
    #[zbus(property)]
    fn state(&self) -> String {
        if self.sup.stopping.is_cancelled() { "stopping" } else { "serving" }.into()
    }

    #[zbus(property)]
    fn loaded_models(&self) -> Vec<String> {
        loaded(&self.sup)
    }

    #[zbus(property)]
    fn memory_used(&self) -> u64 {
        kazeia_memory_budget::pressure::sample().map(|s| s.rss).unwrap_or(0)
    }

    #[zbus(property)]
    fn memory_reserved(&self) -> u64 {
        self.sup.status().reserved_bytes
    }

    #[zbus(property)]
    fn memory_budget(&self) -> u64 {
        self.sup.status().budget_bytes
    }

    #[zbus(property)]
    fn pressure(&self) -> String {
        level_name(&self.sup)
    }

    /// The same report as the socket's `status`, as JSON, for the users the socket serves: it
    /// names the model files and the turns (any peer of a system bus, or of a shared one, read
    /// it; the properties and signals say only what runs and how much memory it holds).
    async fn status(
        &self,
        #[zbus(header)] header: zbus::message::Header<'_>,
        #[zbus(connection)] conn: &zbus::Connection,
    ) -> zbus::fdo::Result<String> {
        self.caller(&header, conn, "Status").await?;
        Ok(serde_json::to_string(&self.sup.status()).unwrap_or_default())
    }

    /// Cancel the caller's running turns (the daemon's own user: everyone's); how many there
    /// were. Asked by anyone on the bus, it cancelled every user's turns: a system bus, or a
    /// shared one, reaches further than the socket, which refuses other users and never lets
    /// one touch another's turns.
    async fn cancel_all(
        &self,
        #[zbus(header)] header: zbus::message::Header<'_>,
        #[zbus(connection)] conn: &zbus::Connection,
    ) -> zbus::fdo::Result<u32> {
        let uid = self.caller(&header, conn, "CancelAll").await?;
        let own = unsafe { libc::geteuid() };
        let n = self.sup.cancel_of((uid != own).then_some(uid));
        tracing::info!(uid, turns = n, "D-Bus CancelAll");
        Ok(n)
    }

    #[zbus(signal)]
    async fn model_loaded(emitter: &SignalEmitter<'_>, role: &str) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn model_unloaded(emitter: &SignalEmitter<'_>, role: &str) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn memory_pressure(emitter: &SignalEmitter<'_>, level: &str, available_bytes: u64) -> zbus::Result<()>;
}

async fn connect(cfg: &DbusConfig, sup: Arc<Supervisor>) -> zbus::Result<zbus::Connection> {
    let builder = match cfg.bus.as_str() {
        "session" => zbus::connection::Builder::session()?,
        "system" => zbus::connection::Builder::system()?,
        address => zbus::connection::Builder::address(address)?,
    };
    builder.name(cfg.name.as_str())?.serve_at(PATH, Engine { sup })?.build().await
}

/// Publish the engine and relay the supervisor's changes as signals, until it stops.
pub async fn publish(cfg: DbusConfig, sup: Arc<Supervisor>) {
    let conn = match connect(&cfg, sup.clone()).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(
                "D-Bus: cannot publish {} on the {} bus: {e}; serving on the socket only",
                cfg.name,
                cfg.bus
            );
            return;
        }
    };
    tracing::info!(name = %cfg.name, bus = %cfg.bus, "D-Bus: published {PATH}");
    let iface = match conn.object_server().interface::<_, Engine>(PATH).await {
        Ok(i) => i,
        Err(e) => return tracing::error!("D-Bus: {e}"),
    };
    let mut changes = sup.changes.subscribe();
    let mut was: BTreeSet<String> = loaded(&sup).into_iter().collect();
    let mut level = level_name(&sup);
    loop {
        tokio::select! {
            r = changes.recv() => {
                if let Err(tokio::sync::broadcast::error::RecvError::Closed) = r {
                    break;
                }
            }
            _ = sup.stopping.cancelled() => {
                let e = iface.signal_emitter();
                let _ = iface.get().await.state_changed(e).await;
                break;
            }
        }
        let e = iface.signal_emitter();
        let now: BTreeSet<String> = loaded(&sup).into_iter().collect();
        for role in now.difference(&was) {
            let _ = Engine::model_loaded(e, role).await;
        }
        for role in was.difference(&now) {
            let _ = Engine::model_unloaded(e, role).await;
        }
        if now != was {
            let i = iface.get().await;
            let _ = i.loaded_models_changed(e).await;
            let _ = i.memory_reserved_changed(e).await;
            let _ = i.memory_used_changed(e).await;
        }
        let new_level = level_name(&sup);
        if new_level != level {
            let available = kazeia_memory_budget::pressure::sample().map(|s| s.available).unwrap_or(0);
            let _ = Engine::memory_pressure(e, &new_level, available).await;
            let _ = iface.get().await.pressure_changed(e).await;
            level = new_level;
        }
        was = now;
    }
    // Keep the connection (and the name) until the daemon has stopped serving.
    drop(conn);
}
