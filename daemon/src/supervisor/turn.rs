//! One turn from admission to its final event. Admission is decided here and only here
//! (a duplicate id first, then shutting down, memory pressure, the pipeline and its input,
//! the options, the uid's running turns, each role's capacity);
//! an admitted [`Turn`] is registered for `cancel` by id and leases its roles for its whole
//! life. Dropping it — whichever way the turn ends — deregisters it and releases its leases:
//! there are no add/remove pairs to keep in step.

use std::collections::HashMap;
use std::sync::Arc;

use kazeia_ipc::{AudioSpec, ErrorCode, TurnOptions};
use kazeia_pipelines::{LlmError, Pipeline, Plan};
use tokio_util::sync::CancellationToken;

use super::Supervisor;

/// Who asks: the connection (0 for `kazeia run`) and the peer's uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Who {
    pub conn: u64,
    pub uid: u32,
}

/// A turn as the protocol asks for it.
#[derive(Debug, Clone, Default)]
pub struct TurnRequest {
    pub id: String,
    pub pipeline: String,
    pub text: Option<String>,
    pub audio: Option<AudioSpec>,
    pub session: Option<String>,
    pub options: TurnOptions,
}

/// A turn's hold on the roles of its pipeline, from admission until it is dropped. Admission
/// counts leases, not engine jobs: a turn just accepted has not queued any work yet (it may
/// still be loading), and between a guarded turn's two guard checks the guard has no job at
/// all. A leased role is never evicted, shed under pressure or unloaded by keep-alive.
pub struct Lease {
    sup: Arc<Supervisor>,
    roles: Vec<String>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Idle from the turn's end (a turn longer than a role's keep-alive left it to be
        // unloaded within a second of ending). The ledger's lock before `leases`'.
        self.sup.touch(&self.roles);
        let mut leases = self.sup.leases.lock().expect("leases lock");
        for r in &self.roles {
            if let Some(n) = leases.get_mut(r) {
                *n -= 1;
                if *n == 0 {
                    leases.remove(r);
                }
            }
        }
        drop(leases);
        let _ = self.sup.changes.send(());
    }
}

/// A running turn, findable by its client id for `cancel`.
pub(super) struct TurnEntry {
    pub(super) uid: u32,
    pub(super) cancel: CancellationToken,
}

/// An admitted turn. See the module's comment.
pub struct Turn {
    pub id: String,
    pub who: Who,
    pub pipeline: Pipeline,
    pub plan: Plan,
    pub request: TurnRequest,
    /// Cancelled by `cancel`, by the connection's end, by shutdown.
    pub cancel: CancellationToken,
    _lease: Lease,
    sup: Arc<Supervisor>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.sup.turns.lock().expect("turns lock").remove(&(self.who.conn, self.id.clone()));
        let _ = self.sup.changes.send(());
    }
}

impl Supervisor {
    /// Admit a turn, or say why not with the protocol's code. `parent` is the connection's
    /// token: the turn's own is its child.
    pub fn begin_turn(
        self: &Arc<Self>,
        who: Who,
        request: TurnRequest,
        parent: &CancellationToken,
    ) -> Result<Turn, LlmError> {
        let refuse = |code, message: String| Err(LlmError::new(code, message));
        let id = &request.id;
        let duplicate = || refuse(ErrorCode::DuplicateId, format!("request {id:?} is already running"));
        // Before any other refusal: a final error under a running turn's id would tell its
        // client that turn had ended (it goes on; `duplicate_id` is not final).
        if self.is_running(who.conn, id) {
            return duplicate();
        }
        if self.stopping.is_cancelled() {
            return refuse(ErrorCode::ShuttingDown, "the daemon is shutting down".into());
        }
        if self.pressure() == kazeia_memory_budget::pressure::Level::Critical {
            return refuse(
                ErrorCode::MemoryPressure,
                "critical memory pressure: new turns are refused until it eases".into(),
            );
        }
        let pipeline = match self.registry.get(&request.pipeline) {
            Ok(p) => p.clone(),
            Err(e) => return refuse(ErrorCode::Pipeline, e.to_string()),
        };
        let plan = pipeline.plan().map_err(|m| LlmError::new(ErrorCode::Pipeline, m))?;
        let name = &pipeline.name;
        match (&request.text, &request.audio, plan.transcribe) {
            (_, None, true) => {
                return refuse(
                    ErrorCode::BadRequest,
                    format!(
                        "pipeline {name:?} takes audio: give `audio` {{sample_rate, channels}} and send audio frames"
                    ),
                )
            }
            // Over 384 kHz no microphone: a rate near u32::MAX made every frame 0 samples at
            // 16 kHz, a turn that heard frames and never a sound.
            (_, Some(a), true) if !kazeia_speech::audio::RATES.contains(&a.sample_rate) || a.channels == 0 => {
                return refuse(ErrorCode::BadRequest, "audio: sample_rate from 8000 to 384000 and channels >= 1".into())
            }
            (_, Some(_), false) => {
                return refuse(ErrorCode::BadRequest, format!("pipeline {name:?} does not take audio"))
            }
            (None, None, false) => return refuse(ErrorCode::BadRequest, "a turn needs text or audio".into()),
            // Empty text once generated 218 tokens of whatever the model liked.
            (Some(t), None, false) if t.trim().is_empty() => {
                return refuse(ErrorCode::BadRequest, format!("{name} takes `text` with something in it: it is empty"))
            }
            _ => {}
        }
        let o = &request.options;
        if o.max_tokens == Some(0) {
            return refuse(ErrorCode::BadRequest, "options.max_tokens must be at least 1".into());
        }
        if o.temperature.is_some_and(|t| !kazeia_engine::params::TEMPERATURES.contains(&t)) {
            return refuse(ErrorCode::BadRequest, "options.temperature must be a number from 0 to 5".into());
        }
        let max = self.config.daemon.max_turns_per_uid;
        let full = |turns: &HashMap<(u64, String), TurnEntry>| {
            turns.values().filter(|t| t.uid == who.uid).count() >= max as usize
        };
        let uid = who.uid;
        let too_many = || {
            refuse(
                ErrorCode::TooManyTurns,
                format!("uid {uid} already has {max} turns running (limits.max_turns_per_uid)"),
            )
        };
        // Before the lease too: a refused turn's lease, taken and dropped, told every subscriber
        // of a change twice and held roles from their keep-alive unload (a flood of refusals).
        if full(&self.turns.lock().expect("turns lock")) {
            return too_many();
        }
        let lease = self.lease(&pipeline.roles())?;
        let cancel = parent.child_token();
        {
            let mut turns = self.turns.lock().expect("turns lock");
            let key = (who.conn, request.id.clone());
            // (Checked again under the lock that inserts it.)
            if turns.contains_key(&key) {
                return duplicate();
            }
            if full(&turns) {
                return too_many();
            }
            turns.insert(key, TurnEntry { uid: who.uid, cancel: cancel.clone() });
        }
        let _ = self.changes.send(());
        Ok(Turn { id: request.id.clone(), who, pipeline, plan, request, cancel, _lease: lease, sup: self.clone() })
    }

    /// Admit a turn on `roles`: each may hold `queue_per_model` turns beyond the running one;
    /// past that the turn is refused with `busy` at once (nothing is counted then).
    pub fn lease(self: &Arc<Self>, roles: &[String]) -> Result<Lease, LlmError> {
        let capacity = self.config.daemon.queue_per_model;
        let mut leases = self.leases.lock().expect("leases lock");
        if let Some(full) = roles.iter().find(|r| leases.get(*r).copied().unwrap_or(0) > capacity) {
            let msg = format!("role {full:?} has {capacity} requests waiting: try again later");
            return Err(LlmError::new(ErrorCode::Busy, msg));
        }
        for r in roles {
            *leases.entry(r.clone()).or_insert(0) += 1;
        }
        drop(leases);
        let _ = self.changes.send(());
        Ok(Lease { sup: self.clone(), roles: roles.to_vec() })
    }

    /// Turns holding `role`.
    pub fn leased(&self, role: &str) -> usize {
        self.leases.lock().expect("leases lock").get(role).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A turn refused for the uid's running turns changes nothing a subscriber sees: its lease,
    /// taken before the count and dropped with the refusal, told every subscriber of a change
    /// twice per refusal (and held the roles from their keep-alive unload).
    #[test]
    fn a_turn_over_the_uids_limit_tells_subscribers_nothing() {
        let text = "[daemon]\nmax_turns_per_uid = 1\n\n[[model]]\nrole = \"thinker\"\nfile = \"m.gguf\"\n";
        let sup = Supervisor::for_test(text);
        let conn = CancellationToken::new();
        let request = |id: &str| TurnRequest {
            id: id.into(),
            pipeline: "chat".into(),
            text: Some("hi".into()),
            ..TurnRequest::default()
        };
        let who = Who { conn: 1, uid: 1000 };
        let _running = sup.begin_turn(who, request("a"), &conn).expect("the first turn is admitted");
        let mut changes = sup.changes.subscribe();
        for i in 0..5 {
            let e = sup.begin_turn(who, request(&format!("b{i}")), &conn).err().expect("over the limit");
            assert_eq!(e.code, ErrorCode::TooManyTurns);
        }
        assert!(changes.try_recv().is_err(), "a refusal told subscribers of a change");
        assert_eq!(sup.leased("thinker"), 1);
    }
}
