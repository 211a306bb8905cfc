//! `load` and `unload` of a model role, with progress events on the request's id. The speech
//! roles that `status` lists (`stt`, `vad`, `tts-<lang>`) load and unload here too.

use kazeia_ipc::{ErrorCode, Event};

use super::Conn;
use crate::supervisor::Unload;

pub fn load(c: &mut Conn, id: String, role: String) {
    let (sup, out) = (c.sup.clone(), c.out.clone());
    c.tasks.spawn(async move {
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
    let (sup, out) = (c.sup.clone(), c.out.clone());
    c.tasks.spawn(async move {
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
