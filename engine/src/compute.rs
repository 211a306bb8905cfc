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

static HOLDS: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static RELEASED: std::sync::Condvar = std::sync::Condvar::new();

impl SpeechHold {
    pub fn take() -> SpeechHold {
        *HOLDS.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        SpeechHold(())
    }
}

impl Drop for SpeechHold {
    fn drop(&mut self) {
        let mut n = HOLDS.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        if *n == 0 {
            RELEASED.notify_all();
        }
    }
}

/// Wait while speech holds the CPU (at most [`MAX_HOLD`]).
fn wait_for_speech() {
    let n = HOLDS.lock().unwrap_or_else(|p| p.into_inner());
    if *n == 0 {
        return;
    }
    let _ = RELEASED.wait_timeout_while(n, MAX_HOLD, |n| *n > 0);
}

impl Compute {
    pub fn new(exclusive: bool) -> Compute {
        Compute { exclusive, cores: Cores::of_this_machine() }
    }

    /// Decode `batch` in `ctx` with the role's `threads`: on the compute thread with
    /// `exclusive`, else right here once the threads fit in the cores other decodes leave.
    pub fn decode(
        &self,
        ctx: &mut LlamaContext<'_>,
        batch: &mut LlamaBatch<'_>,
        threads: u32,
    ) -> Result<(), ComputeError> {
        wait_for_speech();
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
