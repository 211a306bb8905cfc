//! `load` and `unload` of a model role, with progress events on the request's id. The speech
//! roles that `status` lists (`stt`, `vad`, `tts-<lang>`) load and unload here too. A
//! connection runs at most [`MAX_LOADS`] of them at once, and their ids are taken until their
//! final event, as a turn's are.

use kazeia_ipc::{ErrorCode, Event};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::Conn;
use crate::supervisor::Unload;

/// `load` and `unload` requests one connection may run at once. Models load one at a time, so
/// more would only wait; uncounted, a client's million `unload`s during a load were a million
/// tasks (and as many blocking threads asked for, for a speech role's).
pub const MAX_LOADS: usize = 16;

/// Take `id` for a load or an unload: the guard frees it when dropped (its final event queued);
/// none, and `busy` answered, past [`MAX_LOADS`].
fn admit(c: &mut Conn, id: &str) -> Option<DropGuard> {
    c.loads.retain(|_, ended| !ended.is_cancelled());
    if c.loads.len() >= MAX_LOADS {
        let msg = format!("this connection has {MAX_LOADS} loads and unloads running: wait for one to end");
        c.out.error(Some(id.to_string()), ErrorCode::Busy, msg);
        return None;
    }
    let ended = CancellationToken::new();
    c.loads.insert(id.to_string(), ended.clone());
    Some(ended.drop_guard())
}

pub fn load(c: &mut Conn, id: String, role: String) {
    // A stopping daemon unloads every model: a load begun in its grace time was wasted work
    // that held the shutdown (the connection's tasks are awaited) for as long as it took.
    if c.sup.stopping.is_cancelled() {
        return c.out.error(Some(id), ErrorCode::ShuttingDown, "the daemon is shutting down");
    }
    let Some(ended) = admit(c, &id) else { return };
    let (sup, out) = (c.sup.clone(), c.out.clone());
    c.tasks.spawn(async move {
        let _ended = ended;
        if let Some(speech) = sup.speech_role(&role) {
            // An ONNX load blocks for seconds: off the async workers.
            let s = sup.clone();
            match tokio::task::spawn_blocking(move || s.load_speech(&speech)).await {
                Ok(Ok(())) => out.send(&Event::Loaded { id: Some(id), role }),
                Ok(Err(e)) => out.error(Some(id), e.code(), e.to_string()),
                Err(e) => out.error(Some(id), ErrorCode::Engine, format!("load task: {e}")),
            }
            return;
        }
        let progress = crate::turns::progress(out.output(), &id, &role);
        match sup.ensure_loaded(&role, progress).await {
            Ok(()) => out.send(&Event::Loaded { id: Some(id), role }),
            // An unknown role: the speech ones are roles too.
            Err(e) if e.code == ErrorCode::NoModel && sup.config.model(&role).is_err() => {
                let speech = sup.speech_roles().join(", ");
                out.error(Some(id), e.code, format!("{}; speech roles: {speech}", e.message))
            }
            Err(e) => out.error(Some(id), e.code, e.message),
        }
    });
}

pub fn unload(c: &mut Conn, id: String, role: String) {
    let Some(ended) = admit(c, &id) else { return };
    let (sup, out) = (c.sup.clone(), c.out.clone());
    c.tasks.spawn(async move {
        let _ended = ended;
        let unloaded = match sup.speech_role(&role) {
            Some(speech) => {
                let s = sup.clone();
                match tokio::task::spawn_blocking(move || s.unload_speech(&speech)).await {
                    Ok(Ok(done)) => done,
                    Ok(Err(busy)) => return out.error(Some(id), ErrorCode::Busy, busy),
                    Err(e) => return out.error(Some(id), ErrorCode::Engine, format!("unload task: {e}")),
                }
            }
            None => match sup.unload(&role).await {
                Unload::Done => true,
                Unload::NotLoaded => false,
                Unload::InUse(n) => {
                    let msg = format!("role {role:?} is in use by {n} running turn(s): unload it when they end");
                    return out.error(Some(id), ErrorCode::Busy, msg);
                }
            },
        };
        if unloaded {
            out.send(&Event::Unloaded { id: Some(id), role });
        } else {
            let msg = format!("role {role:?} is not loaded");
            out.error(Some(id), ErrorCode::NoModel, msg);
        }
    });
}
