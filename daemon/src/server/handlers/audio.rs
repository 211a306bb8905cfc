//! Audio frames: into the ring of the running audio turn they name.

use kazeia_ipc::{AudioFrame, ErrorCode};

use super::Conn;

pub fn frame(c: &Conn, a: AudioFrame) {
    let mut turns = c.audio.lock().expect("audio turns");
    let Some(input) = turns.get_mut(&a.id) else {
        // The microphone of a turn that has ended streams until its client reads `done`:
        // dropped, not an error per frame after the final event (PROTOCOL §7).
        if c.turn_ids.lock().expect("turn ids").ended(&a.id) {
            return;
        }
        let msg = format!("audio frame for {:?}, which is not a running audio turn", a.id);
        return c.out.notice(Some(a.id), ErrorCode::NoAudioRequest, msg);
    };
    if !input.matches(&a) {
        let msg = "audio frame with another rate or channel count than the turn's `audio`";
        return c.out.notice(Some(a.id), ErrorCode::BadFrame, msg);
    }
    // After `last` nobody reads the ring (its end is the utterance's, and barge-in stops
    // there): frames went to it unheard until it was full, then were called `busy`.
    if input.ended() {
        if !std::mem::replace(&mut input.after_last, true) {
            let msg = "audio frame after the stream's `last` frame: the turn hears no more of it";
            c.out.notice(Some(a.id), ErrorCode::BadFrame, msg);
        }
        return;
    }
    if !input.push(&a) && !input.overrun {
        input.overrun = true;
        let msg = "audio overrun: the speech task is more than 20 s behind; samples were dropped";
        c.out.notice(Some(a.id), ErrorCode::Busy, msg);
    }
}
