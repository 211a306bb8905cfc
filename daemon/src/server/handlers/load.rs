//! `load` and `unload` of a model role, with progress events on the request's id.

use kazeia_ipc::{ErrorCode, Event};

use super::Conn;

pub fn load(c: &mut Conn, id: String, role: String) {
    let (sup, out) = (c.sup.clone(), c.out.clone());
    c.tasks.spawn(async move {
        let progress = crate::turns::progress(out.output(), &id, &role);
        match sup.ensure_loaded(&role, progress).await {
            Ok(()) => out.send(&Event::Loaded { id: Some(id), role }),
            Err(e) => out.error(Some(id), e.code, e.message),
        }
    });
}

pub fn unload(c: &mut Conn, id: String, role: String) {
    let (sup, out) = (c.sup.clone(), c.out.clone());
    c.tasks.spawn(async move {
        if sup.unload(&role).await {
            out.send(&Event::Unloaded { id: Some(id), role });
        } else {
            let msg = format!("role {role:?} is not loaded");
            out.error(Some(id), ErrorCode::NoModel, msg);
        }
    });
}
