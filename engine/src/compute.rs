//! Who runs a decode. With `exclusive` (the default where the roles' threads outnumber the
//! cores), every decode of every role runs on one process-wide thread, `llm-compute`, one call
//! at a time in arrival order; the role's worker hands it its context and batch and waits.
//!
//! Why one thread and not a lock: llama.cpp's CPU backend runs a graph on an OpenMP team that
//! belongs to the calling thread, and libgomp stops spin-waiting at its barriers (100 spins,
//! then a futex sleep) as soon as the process holds more OpenMP threads than there are CPUs.
//! Two roles, each decoding on its own thread with a 2-thread team, made 4 > 2 cores: every op's
//! barrier slept, ~140 voluntary context switches per token, and the Thinker decoded at 58-68
//! tok/s in the daemon against 97-101 in a process with one role (SmolLM2-135M, 2 threads). One
//! calling thread means one team, which keeps spinning between ops and between tokens. The
//! hand-off costs two wake-ups per decode call (tens of µs against ~10 ms a token): bench-engine's
//! decode against llama-bench was 0.951 and 0.921 with no hand-off (`exclusive_compute = false`),
//! 0.905 and 0.952 with it, alternated.
//!
//! Without `exclusive` (more cores, or the NPU for one role) each role decodes on its own
//! thread, in parallel as long as the roles' threads fit the cores (`cores.rs`): a decode
//! whose threads do not fit waits for the cores, in arrival order.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::OnceLock;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::DecodeError;

use crate::cores::Cores;

pub struct Compute {
    pub exclusive: bool,
    /// Without `exclusive`: the cores decodes running side by side may hold.
    cores: Cores,
}

/// A decode handed to the compute thread: the caller's context and batch, which the caller
/// keeps borrowed (blocked on `done`) until the reply has come.
struct Call {
    ctx: *mut LlamaContext<'static>,
    batch: *mut LlamaBatch<'static>,
    done: SyncSender<Result<(), ComputeError>>,
}

// SAFETY: the pointers come from `&mut` borrows whose owner waits, blocked, until the compute
// thread has replied; nothing else touches the context or batch meanwhile. llama.cpp's contexts
// are not tied to the thread that created them.
unsafe impl Send for Call {}

fn compute_thread() -> &'static SyncSender<Call> {
    static THREAD: OnceLock<SyncSender<Call>> = OnceLock::new();
    THREAD.get_or_init(|| {
        // Callers block until their call is served, so one slot per waiting role is plenty.
        let (tx, rx) = sync_channel::<Call>(8);
        std::thread::Builder::new()
            .name("llm-compute".into())
            .spawn(move || serve(rx))
            .expect("spawn the llm-compute thread");
        tx
    })
}

fn serve(rx: Receiver<Call>) {
    for call in rx {
        // SAFETY: see `Call`; the caller is blocked on `done` until we reply below.
        let result = catch_unwind(AssertUnwindSafe(|| unsafe { (*call.ctx).decode(&mut *call.batch) }));
        let _ = call.done.send(match result {
            Ok(r) => r.map_err(ComputeError::from),
            Err(_) => Err(ComputeError("the decode panicked".into())),
        });
    }
}

/// A decode that failed, as the callers report it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ComputeError(pub String);

impl From<DecodeError> for ComputeError {
    fn from(e: DecodeError) -> ComputeError {
        ComputeError(e.to_string())
    }
}

/// Speech first. While a [`SpeechHold`] lives (the speaker synthesising a reply's sentence; an
/// end-of-turn verdict; a voice turn's early reply waiting for the end of the turn), no decode
/// starts: the user waits for that audio, and the sentences after it have the whole time
/// it plays to be written (text comes 10-20 times faster than speech). On 2 cores the Thinker's
/// and the guard's decodes beside Piper made the first sentence's synthesis 2.3 s instead of
/// ~0.4 s alone (tools/bench-voice). A decode already running finishes; a decode waits at most
/// [`MAX_HOLD`] (holders keep theirs shorter: the early reply's ends after it).
pub struct SpeechHold(());

/// The longest a decode waits for speech (a stuck synthesis must not stop the engine).
pub const MAX_HOLD: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a unit handed to speech ([`RolePause::to_speech`], [`SpeechHold::to_speech`]) holds
/// the decodes for the speaker to take it, counted from the handoff or from the end of the
/// speech holding the decodes then (a unit checked while the one before it is spoken waits for
/// it): the speaker takes it within a millisecond when idle; a turn cancelled meanwhile, or a
/// speaker that failed, must not hold the engine.
pub const HANDOFF: std::time::Duration = std::time::Duration::from_millis(300);

/// What holds the decodes: speech (every role's), paused roles (theirs only), units handed to
/// the speaker and not yet taken (every role's, each until its deadline).
struct Holds {
    speech: usize,
    /// (paused role, the role whose check the pause waits for).
    paused: Vec<(String, String)>,
    handoffs: Vec<std::time::Instant>,
}

impl Holds {
    /// Handoffs past their deadline end, unless speech holds the decodes (then the deadline is
    /// pushed back when it ends, [`Holds::end_speech`]).
    fn expire(&mut self, now: std::time::Instant) {
        if self.speech == 0 {
            self.handoffs.retain(|&d| d > now);
        }
    }

    /// Whether a decode of `role` waits now. A paused role that another pause's check runs on
    /// is not held: two turns whose pipelines swap the same two roles (one's Thinker the
    /// other's guard) would otherwise each hold the check that ends the other's pause, and
    /// every decode of both would wait [`MAX_HOLD`].
    fn blocks(&mut self, role: &str, now: std::time::Instant) -> bool {
        self.expire(now);
        self.speech > 0
            || !self.handoffs.is_empty()
            || (self.paused.iter().any(|(p, _)| p == role) && !self.paused.iter().any(|(_, c)| c == role))
    }

    /// The next time a wait must look again with no one to wake it: a handoff's deadline.
    fn next_deadline(&self) -> Option<std::time::Instant> {
        (self.speech == 0).then(|| self.handoffs.iter().min().copied()).flatten()
    }

    /// A speech hold; the speaker's (`handed`) takes over the oldest handoff waiting.
    fn take_speech(&mut self, now: std::time::Instant, handed: bool) {
        self.expire(now);
        if handed && !self.handoffs.is_empty() {
            self.handoffs.remove(0);
        }
        self.speech += 1;
    }

    fn end_speech(&mut self, now: std::time::Instant) {
        self.speech = self.speech.saturating_sub(1);
        if self.speech == 0 {
            for d in &mut self.handoffs {
                *d = (*d).max(now + HANDOFF);
            }
        }
    }

    fn hand_off(&mut self, now: std::time::Instant) {
        self.handoffs.push(now + HANDOFF);
    }

    fn unpause(&mut self, role: &str, checker: &str) {
        if let Some(i) = self.paused.iter().position(|(p, c)| p == role && c == checker) {
            self.paused.remove(i);
        }
    }
}

static HOLDS: std::sync::Mutex<Holds> =
    std::sync::Mutex::new(Holds { speech: 0, paused: Vec::new(), handoffs: Vec::new() });
static RELEASED: std::sync::Condvar = std::sync::Condvar::new();

fn holds() -> std::sync::MutexGuard<'static, Holds> {
    HOLDS.lock().unwrap_or_else(|p| p.into_inner())
}

impl SpeechHold {
    /// Hold the decodes (an end-of-turn verdict).
    pub fn take() -> SpeechHold {
        holds().take_speech(std::time::Instant::now(), false);
        SpeechHold(())
    }

    /// The speaker's hold for a sentence: it takes over the oldest unit handed to speech and
    /// not yet taken (the sentence it was checked for, unless another turn's speaker came
    /// first: then that one's, the same hold on the same decodes).
    pub fn speak() -> SpeechHold {
        holds().take_speech(std::time::Instant::now(), true);
        SpeechHold(())
    }

    /// This hold ends, and a unit handed to speech takes its place until the speaker takes it:
    /// an early reply's first sentence, held since it was released, going to the speaker.
    pub fn to_speech(self) {
        // Before the hold ends (when `self` drops here): no moment without either.
        holds().hand_off(std::time::Instant::now());
    }
}

impl Drop for SpeechHold {
    fn drop(&mut self) {
        holds().end_speech(std::time::Instant::now());
        RELEASED.notify_all();
    }
}

/// A role paused while a unit of a spoken reply is checked: its decodes wait, the other roles'
/// run. The Thinker's next tokens are not needed before that unit's audio has played (text
/// comes 10-20 times faster than speech), while the unit's check and synthesis are what the
/// user waits for: a Thinker decode queued behind the output check used to start at its
/// verdict, before the speaker held the decodes, and ran beside the first synthesis (one token
/// 166 ms instead of 16, the first audio 210 ms instead of ~97: tools/bench-voice, debug log).
/// Process-wide, by role name (another turn's decodes of that role wait too); a role another
/// pause's check runs on is never held ([`Holds::blocks`]). The runner pauses only a Thinker
/// that is not its own guard (the check would wait on itself).
pub struct RolePause {
    role: String,
    checker: String,
}

impl RolePause {
    /// Pause `role` while `checker` checks its unit.
    pub fn take(role: &str, checker: &str) -> RolePause {
        holds().paused.push((role.to_string(), checker.to_string()));
        RolePause { role: role.to_string(), checker: checker.to_string() }
    }

    /// The unit passed and goes to the speaker: every decode waits until the speaker takes it
    /// ([`SpeechHold::speak`]), at most [`HANDOFF`] after no speech holds them.
    pub fn to_speech(self) {
        // Before the pause ends (when `self` drops here): no moment without either.
        holds().hand_off(std::time::Instant::now());
    }
}

impl Drop for RolePause {
    fn drop(&mut self) {
        holds().unpause(&self.role, &self.checker);
        RELEASED.notify_all();
    }
}

/// Whether a decode of `role` would wait now (for tests and diagnostics: the holds are the
/// process's).
pub fn decodes_held(role: &str) -> bool {
    holds().blocks(role, std::time::Instant::now())
}

/// How often a held decode looks at its request's cancel.
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Wait while speech holds the CPU or `role` is paused (at most [`MAX_HOLD`] in all); false
/// when `stop` (the request was cancelled, or its caller left) ended the wait: another turn's
/// hold kept a cancelled request, and every request queued behind it on the role, waiting up
/// to 5 s, against "a cancel lands within a decode step".
fn wait_for_speech(role: &str, stop: &dyn Fn() -> bool) -> bool {
    let start = std::time::Instant::now();
    let mut h = holds();
    loop {
        let now = std::time::Instant::now();
        if !h.blocks(role, now) {
            return true;
        }
        if stop() {
            return false;
        }
        let Some(left) = MAX_HOLD.checked_sub(start.elapsed()) else { return true };
        // A handoff ends by its deadline, with no one to notify.
        let left = h.next_deadline().map_or(left, |d| left.min(d.saturating_duration_since(now)));
        h = RELEASED.wait_timeout(h, left.min(CANCEL_POLL)).unwrap_or_else(|p| p.into_inner()).0;
    }
}

impl Compute {
    pub fn new(exclusive: bool) -> Compute {
        Compute { exclusive, cores: Cores::of_this_machine() }
    }

    /// Decode `batch` in `ctx` with `role`'s `threads`: on the compute thread with
    /// `exclusive`, else right here once the threads fit in the cores other decodes leave.
    /// `stop`: the request is cancelled. A decode held for speech then stops waiting and does
    /// not run (`Ok(false)`: the batch is not in the context; a cancelled prompt's chunk would
    /// have taken the CPU that speech holds, for nobody).
    pub fn decode(
        &self,
        role: &str,
        ctx: &mut LlamaContext<'_>,
        batch: &mut LlamaBatch<'_>,
        threads: u32,
        stop: &dyn Fn() -> bool,
    ) -> Result<bool, ComputeError> {
        // Each decode in the trace log (`kazeia_engine::compute=trace`): what a turn's time went
        // to, call by call (how session 29 found a Thinker token beside the first synthesis).
        let t = std::time::Instant::now();
        if !wait_for_speech(role, stop) {
            return Ok(false);
        }
        let held = t.elapsed();
        let r = self.run(ctx, batch, threads);
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        tracing::trace!(role, tokens = batch.n_tokens(), held_ms = ms(held), ms = ms(t.elapsed() - held), "decoded");
        r.map(|()| true)
    }

    fn run(&self, ctx: &mut LlamaContext<'_>, batch: &mut LlamaBatch<'_>, threads: u32) -> Result<(), ComputeError> {
        if !self.exclusive {
            let _cores = self.cores.take(threads as usize);
            return ctx.decode(batch).map_err(ComputeError::from);
        }
        let (done, reply) = sync_channel(1);
        let call = Call {
            ctx: (ctx as *mut LlamaContext<'_>).cast::<LlamaContext<'static>>(),
            batch: (batch as *mut LlamaBatch<'_>).cast::<LlamaBatch<'static>>(),
            done,
        };
        compute_thread().send(call).map_err(|_| ComputeError("the compute thread is gone".into()))?;
        // The borrow of `ctx` and `batch` lasts until this returns: the compute thread always
        // replies (a panic in llama.cpp's Rust wrapper is caught and reported).
        reply.recv().unwrap_or_else(|_| Err(ComputeError("the compute thread is gone".into())))
    }
}

#[cfg(test)]
mod tests {
    use super::Holds;
    use std::time::{Duration, Instant};

    fn none() -> Holds {
        Holds { speech: 0, paused: Vec::new(), handoffs: Vec::new() }
    }

    fn pause(h: &mut Holds, role: &str, checker: &str) {
        h.paused.push((role.into(), checker.into()));
    }

    #[test]
    fn a_paused_role_waits_and_the_others_run() {
        let (mut h, now) = (none(), Instant::now());
        pause(&mut h, "thinker", "guard");
        assert!(h.blocks("thinker", now));
        assert!(!h.blocks("guard", now));
        // Two turns of the same pipeline: the Thinker waits until both checks ended.
        pause(&mut h, "thinker", "guard");
        h.unpause("thinker", "guard");
        assert!(h.blocks("thinker", now));
        h.unpause("thinker", "guard");
        assert!(!h.blocks("thinker", now));
    }

    #[test]
    fn two_turns_with_swapped_roles_do_not_hold_each_other_s_check() {
        let (mut h, now) = (none(), Instant::now());
        // Turn A: Thinker `a`, guard `b`; turn B: Thinker `b`, guard `a`. Each check runs on the
        // role the other turn paused.
        pause(&mut h, "a", "b");
        assert!(h.blocks("a", now) && !h.blocks("b", now));
        pause(&mut h, "b", "a");
        assert!(!h.blocks("a", now) && !h.blocks("b", now));
        // A's check ended: its pause goes, and B's holds `b` again.
        h.unpause("a", "b");
        assert!(!h.blocks("a", now) && h.blocks("b", now));
        h.unpause("b", "a");
        assert!(!h.blocks("b", now));
    }

    #[test]
    fn a_handoff_holds_every_role_until_the_speaker_takes_it_or_its_deadline() {
        let now = Instant::now();
        let ms = |n| Duration::from_millis(n);
        let mut h = none();
        h.hand_off(now);
        assert!(h.blocks("guard", now) && h.blocks("thinker", now));
        // A verdict's hold is not the speaker's: the handoff waits on.
        h.take_speech(now, false);
        h.end_speech(now);
        assert_eq!(h.handoffs.len(), 1);
        // The speaker takes the unit: its hold replaces the handoff, and its end frees all.
        h.take_speech(now, true);
        assert!(h.handoffs.is_empty() && h.blocks("thinker", now));
        h.end_speech(now);
        assert!(!h.blocks("thinker", now));
        // Nobody takes it: it ends at its deadline, and a later speech hold has none to take.
        h.hand_off(now);
        assert!(!h.blocks("thinker", now + ms(301)));
        h.take_speech(now + ms(301), true);
        assert_eq!((h.speech, h.handoffs.len()), (1, 0));
        h.end_speech(now + ms(301));
    }

    #[test]
    fn a_unit_handed_over_while_the_one_before_is_spoken_waits_for_its_end() {
        let now = Instant::now();
        let ms = |n| Duration::from_millis(n);
        let mut h = none();
        h.take_speech(now, true);
        h.hand_off(now);
        // The speaker is still on the sentence before, past the handoff's deadline.
        assert!(h.blocks("thinker", now + ms(500)));
        assert_eq!(h.next_deadline(), None, "the speech's end wakes the waits");
        h.end_speech(now + ms(500));
        assert!(h.blocks("thinker", now + ms(700)), "the handoff counts from the speech's end");
        assert_eq!(h.next_deadline(), Some(now + ms(800)));
        assert!(!h.blocks("thinker", now + ms(801)));
    }
}
