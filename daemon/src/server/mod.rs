//! `kazeia serve`: the supervisor daemon on a Unix socket (no TCP listener at all).
//!
//! Shutdown (SIGTERM/SIGINT): stop accepting, refuse new turns (`shutting_down`), let running
//! turns finish within the grace time, cancel the rest, close connections, unload the models,
//! remove the socket file.

pub mod connection;
#[cfg(feature = "dbus")]
pub mod dbus;
mod handlers;
pub mod socket;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kazeia_pipelines::Registry;
use tokio::signal::unix::{signal, SignalKind};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
pub use crate::supervisor::Supervisor;
pub use socket::{default_path, SocketError};

/// The info line that ends a `[speech] preload` (with `ms=` and what was warmed); a failed one
/// logs "speech preload failed" or "speech preload stopped". Benches wait for either.
pub const SPEECH_PRELOADED: &str = "speech models preloaded and warmed";

pub async fn serve(config: Config, registry: Registry, socket_path: Option<PathBuf>) -> Result<(), SocketError> {
    let path = socket_path.or_else(|| config.daemon.socket.clone()).unwrap_or_else(default_path);
    let bound = socket::bind(&path, config.daemon.shared_socket_dir)?;
    apply_htp_sessions(&config);
    let grace = config.daemon.shutdown_grace;
    let preload = config.daemon.preload;
    let sup = Supervisor::new(config, registry);
    match &bound {
        socket::Bound::Owned { path, .. } => tracing::info!(socket = %path.display(), "kazeia serving"),
        socket::Bound::Activated { .. } => tracing::info!("kazeia serving on a socket from systemd"),
    }
    // Readiness line for scripts and tests (stderr, stdout stays free). A socket handed over by
    // systemd or Android's init is not `path`: the log says so rather than name a path it does
    // not serve.
    match &bound {
        socket::Bound::Owned { path, .. } => eprintln!("kazeia: listening on {}", path.display()),
        socket::Bound::Activated { .. } => {
            eprintln!("kazeia: listening on the socket handed over by the service manager (systemd or init)")
        }
    }

    if !preload && sup.config.speech.preload {
        tracing::warn!("[speech] preload = true does nothing with [daemon] preload = false");
    }
    if preload {
        let mut loads = JoinSet::new();
        for m in sup.config.models.clone() {
            let sup = sup.clone();
            loads.spawn(async move {
                if let Err(e) = sup.ensure_loaded(&m.role, |_| {}).await {
                    tracing::error!(role = %m.role, "preload failed: {}", e.message);
                }
            });
        }
        let sup = sup.clone();
        tokio::spawn(async move {
            // The speech models after the language models: they never evict one, and the
            // language models' loads go first on the cores.
            while loads.join_next().await.is_some() {}
            if !sup.config.speech.preload || sup.stopping.is_cancelled() {
                return;
            }
            let speech = sup.clone();
            let start = Instant::now();
            match tokio::task::spawn_blocking(move || speech.preload_speech()).await {
                Ok(Ok(warmed)) => tracing::info!(
                    ms = start.elapsed().as_millis() as u64,
                    warmed = %warmed.join(", "),
                    "{SPEECH_PRELOADED}"
                ),
                Ok(Err(e)) => tracing::error!("speech preload failed: {e}"),
                Err(e) => tracing::error!("speech preload stopped: {e}"),
            }
        });
    }

    if sup.config.dbus.enabled {
        #[cfg(feature = "dbus")]
        tokio::spawn(dbus::publish(sup.config.dbus.clone(), sup.clone()));
        #[cfg(not(feature = "dbus"))]
        tracing::warn!("[dbus] enabled = true, but this kazeia was built without D-Bus (cargo feature `dbus`)");
    }

    // Every second: keep-alive (unload roles idle past their `keep_alive`) and memory pressure.
    let keeper = sup.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            if keeper.stopping.is_cancelled() {
                break;
            }
            keeper.expire_idle().await;
            keeper.pressure_tick().await;
        }
    });

    let mut sigterm = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut sigint = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let closing = CancellationToken::new();
    let mut conns = JoinSet::new();
    let why = loop {
        tokio::select! {
            r = bound.listener().accept() => match r {
                Ok((stream, _)) => {
                    conns.spawn(connection::handle(sup.clone(), stream, closing.clone()));
                }
                Err(e) => {
                    // EMFILE and friends: keep serving the connections we have.
                    tracing::error!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = sigterm.recv() => break "SIGTERM",
            _ = sigint.recv() => break "SIGINT",
        }
    };
    shutdown(sup, bound, closing, conns, grace, why).await;
    Ok(())
}

/// Hexagon sessions are created when llama.cpp's backend starts, from `GGML_HEXAGON_DEVICES`:
/// set it from the plan (the most sessions any model needs) before the first load, unless the
/// operator already did. On a build without ggml-hexagon it is read by nobody.
fn apply_htp_sessions(config: &Config) {
    if std::env::var_os("GGML_HEXAGON_DEVICES").is_some() {
        return;
    }
    // Each model planned on its own: one whose file is missing or unreadable leaves the others'
    // split in place (the whole plan failing set no device for any model).
    let mut devices: Vec<String> = Vec::new();
    for m in &config.models {
        let mut one = config.clone();
        one.models = vec![m.clone()];
        match crate::plan::plan(&one) {
            Ok(plan) => devices.extend(plan.models.iter().filter_map(|p| p.htp_devices.clone())),
            Err(e) => tracing::warn!(role = %m.role, "no HTP plan for this role: {e}"),
        }
    }
    if let Some(devices) = devices.into_iter().max_by_key(|d| d.split(',').count()) {
        tracing::info!(%devices, "GGML_HEXAGON_DEVICES from the memory plan");
        std::env::set_var("GGML_HEXAGON_DEVICES", devices);
    }
}

async fn shutdown(
    sup: Arc<Supervisor>,
    bound: socket::Bound,
    closing: CancellationToken,
    mut conns: JoinSet<()>,
    grace: Duration,
    why: &str,
) {
    sup.stopping.cancel();
    let path = match bound {
        socket::Bound::Owned { listener, path, file } => {
            drop(listener);
            Some((path, file))
        }
        socket::Bound::Activated { listener } => {
            drop(listener);
            None
        }
    };
    // Logged once new turns are refused and the listener is closed: whoever reads this line
    // may rely on both.
    tracing::info!("{why}: shutting down");
    let deadline = Instant::now() + grace;
    while sup.turns_running() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if sup.turns_running() > 0 {
        tracing::warn!(turns = sup.turns_running(), "grace time over: cancelling the remaining turns");
        sup.cancel_all();
    }
    closing.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), async { while conns.join_next().await.is_some() {} }).await;
    let engine = sup.engine.clone();
    let _ = tokio::task::spawn_blocking(move || {
        for role in engine.loaded_roles() {
            engine.unload(&role);
        }
    })
    .await;
    if let Some((p, file)) = path {
        socket::remove_own(&p, file);
    }
    tracing::info!("kazeia stopped");
}
