//! `turn`: admission by the supervisor (one place), `accepted`, then the turn runs in the
//! connection's task set; an audio turn's input ring is registered for its frames until the
//! turn ends.

use kazeia_ipc::{ErrorCode, Event};

use super::Conn;
use crate::supervisor::TurnRequest;
use crate::turns::{self, AudioSource};

pub fn turn(c: &mut Conn, request: TurnRequest) {
    let id = request.id.clone();
    let spec = request.audio.clone();
    let turn = match c.sup.begin_turn(c.who, request, &c.cancel) {
        Ok(t) => t,
        // The running turn under that id goes on: its final event is still to come.
        Err(e) if e.code == ErrorCode::DuplicateId => return c.out.notice(Some(id), e.code, e.message),
        Err(e) => return c.out.error(Some(id), e.code, e.message),
    };
    c.turn_ids.lock().expect("turn ids").begin(&id);
    c.out.send(&Event::Accepted { id: id.clone(), pipeline: turn.pipeline.name.clone() });
    let (source, fed) = match (turn.plan.transcribe, spec) {
        (true, Some(spec)) => {
            let (input, ring) = turns::listen::ring(spec.sample_rate, u16::from(spec.channels));
            let fed = input.mark();
            c.audio.lock().expect("audio turns").insert(id.clone(), input);
            (Some(AudioSource::Stream(ring)), Some(fed))
        }
        _ => (None, None),
    };
    let (sup, output, audio, ids) = (c.sup.clone(), c.out.output(), c.audio.clone(), c.turn_ids.clone());
    c.tasks.spawn(async move {
        turns::run(sup, turn, source, output).await;
        // Its final event is queued: the id is free for a new turn from here (see `TurnIds`).
        ids.lock().expect("turn ids").end(&id);
        // This turn's input only: the id is free from the turn's end, before its final event
        // leaves, and a new audio turn under it may have registered its own meanwhile.
        if let Some(fed) = fed {
            let mut inputs = audio.lock().expect("audio turns");
            if inputs.get(&id).is_some_and(|i| i.is(&fed)) {
                inputs.remove(&id);
            }
        }
    });
}
