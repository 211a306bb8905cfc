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
        let last = turns::run(sup, turn, source, output.clone()).await;
        // The input gone, the final event queued and the id freed as one step, under the
        // locks an audio frame takes (`audio`, then `turn_ids`): in between, a client that
        // had read `done` and reused the id got `duplicate_id`, and its microphone's frames
        // reached the ring (`bad_frame`, `busy` after `done`) or found it gone while the turn
        // still ran (`no_audio_request`). The outbox only queues: the locks are held for no time.
        let mut inputs = audio.lock().expect("audio turns");
        let mut ids = ids.lock().expect("turn ids");
        // This turn's input only (the id is still live: no other turn has registered one).
        if fed.is_some_and(|fed| inputs.get(&id).is_some_and(|i| i.is(&fed))) {
            inputs.remove(&id);
        }
        output(last);
        ids.end(&id);
    });
}
