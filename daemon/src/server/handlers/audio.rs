//! Audio frames: into the ring of the running audio turn they name.

use kazeia_ipc::{AudioFrame, ErrorCode};

use super::Conn;

pub fn frame(c: &Conn, a: AudioFrame) {
    let mut turns = c.audio.lock().expect("audio turns");
    let Some(input) = turns.get_mut(&a.id) else {
        let msg = format!("audio frame for {:?}, which is not a running audio turn", a.id);
        return c.out.notice(Some(a.id), ErrorCode::NoAudioRequest, msg);
    };
    if !input.matches(&a) {
        let msg = "audio frame with another rate or channel count than the turn's `audio`";
        return c.out.notice(Some(a.id), ErrorCode::BadFrame, msg);
    }
    if !input.push(&a) && !input.overrun {
        input.overrun = true;
        let msg = "audio overrun: the speech task is more than 20 s behind; samples were dropped";
        c.out.notice(Some(a.id), ErrorCode::Busy, msg);
    }
}
