//! One thread per loaded role. It owns the role's llama.cpp context (which borrows the shared
//! model) and serves requests from a bounded queue, one at a time.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};

use crate::api::{GenEvent, LlmError};
use crate::backend::backend;
use crate::error::{GenerateError, LoadError};
use crate::generate;
use crate::job::Msg;
use crate::model::SharedModel;
use crate::params::{FlashAttn, RoleParams};
use kazeia_ipc::ErrorCode;

/// llama.cpp mutates the model while creating a context (see llama-cpp-2's `new_context`):
/// contexts of a shared model must be created one at a time.
static CONTEXT_CREATION: Mutex<()> = Mutex::new(());

/// The handle the engine keeps for a loaded role. Dropping it stops the thread after its
/// current request (the queue sender closes) and waits for it.
pub struct Worker {
    role: String,
    queue: Option<SyncSender<Msg>>,
    capacity: usize,
    /// Requests queued or running.
    pending: Arc<AtomicUsize>,
    /// Tokens generated since the role loaded, whoever read them.
    generated: Arc<AtomicU64>,
    /// Why the role stopped serving (a panic on its thread), if it did.
    failed: Arc<Mutex<Option<String>>>,
    /// The role is being unloaded: queued jobs are answered, not run.
    closing: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Start the role's thread and create its context there. Returns once the context exists.
    pub fn start(
        cfg: RoleParams,
        model: Arc<SharedModel>,
        queue_capacity: usize,
        compute: Arc<crate::compute::Compute>,
    ) -> Result<Worker, LoadError> {
        let (tx, rx) = mpsc::sync_channel::<Msg>(queue_capacity);
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), LoadError>>();
        let role = cfg.role.clone();
        let pending = Arc::new(AtomicUsize::new(0));
        let generated = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(Mutex::new(None));
        let closing = Arc::new(AtomicBool::new(false));
        let counters = Counters {
            pending: pending.clone(),
            generated: generated.clone(),
            failed: failed.clone(),
            closing: closing.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("llm-{role}"))
            .spawn(move || run(cfg, model, rx, ready_tx, counters, compute))
            .map_err(|e| LoadError::Thread { role: role.clone(), reason: e.to_string() })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Worker {
                role,
                queue: Some(tx),
                capacity: queue_capacity,
                pending,
                generated,
                failed,
                closing,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(LoadError::Thread { role, reason: "the thread ended before its context was ready".into() })
            }
        }
    }

    /// Queue a job; a full queue is refused at once (`busy`), never waited on.
    pub fn submit(&self, msg: Msg) -> Result<(), GenerateError> {
        let queue = self.queue.as_ref().ok_or_else(|| GenerateError::NoModel(self.role.clone()))?;
        self.pending.fetch_add(1, Ordering::SeqCst);
        queue
            .try_send(msg)
            .inspect_err(|_e| {
                self.pending.fetch_sub(1, Ordering::SeqCst);
            })
            .map_err(|e| match e {
                TrySendError::Full(_) => GenerateError::Busy { role: self.role.clone(), capacity: self.capacity },
                TrySendError::Disconnected(_) => GenerateError::NoModel(self.role.clone()),
            })
    }
}

impl Worker {
    /// Requests queued or running on this role.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// Tokens this role generated since it loaded.
    pub fn generated(&self) -> u64 {
        self.generated.load(Ordering::SeqCst)
    }

    /// Why this role stopped serving, if it did (see `run`).
    pub fn failed(&self) -> Option<String> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// What the role's thread counts for the engine.
struct Counters {
    pending: Arc<AtomicUsize>,
    generated: Arc<AtomicU64>,
    failed: Arc<Mutex<Option<String>>>,
    closing: Arc<AtomicBool>,
}

impl Drop for Worker {
    /// The running request finishes; the ones queued behind it are answered `no_model` (a
    /// closed channel still delivers what it buffered: an unload ran every queued job in full,
    /// up to the queue's capacity of whole generations, before the role let go).
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        drop(self.queue.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One decode of one token, then an empty context, before the role says it is ready (as
/// llama.cpp's own tools warm a context up). The first decode starts the CPU backend's thread
/// team (OpenMP: `threads - 1` more threads, alive from then on; with exclusive compute the
/// compute thread's one team, shared by every role) and touches the compute buffers: done here,
/// the role's thread count and memory are what they will be while it serves, from its load on
/// (a soak's thread count breathed 7-8 with each reload, until the reloaded role's first
/// request), and the first turn does not pay for it.
fn warm_up(ctx: &mut llama_cpp_2::context::LlamaContext<'_>, cfg: &RoleParams, compute: &crate::compute::Compute) {
    let mut batch = llama_cpp_2::llama_batch::LlamaBatch::new(1, 1);
    let decoded =
        batch.add(llama_cpp_2::token::LlamaToken::new(0), 0, &[0], true).map_err(|e| e.to_string()).and_then(|()| {
            compute.decode(&cfg.role, ctx, &mut batch, cfg.threads, &|| false).map(drop).map_err(|e| e.to_string())
        });
    if let Err(e) = decoded {
        tracing::debug!(role = cfg.role, "warm-up decode skipped: {e}");
    }
    ctx.clear_kv_cache();
}

fn run(
    cfg: RoleParams,
    model: Arc<SharedModel>,
    rx: Receiver<Msg>,
    ready: mpsc::Sender<Result<(), LoadError>>,
    counters: Counters,
    compute: Arc<crate::compute::Compute>,
) {
    let ctx = {
        let _guard = CONTEXT_CREATION.lock().unwrap_or_else(|p| p.into_inner());
        let mut params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(cfg.n_ctx))
            .with_n_batch(cfg.n_batch)
            .with_n_ubatch(cfg.n_ubatch)
            .with_n_threads(cfg.threads as i32)
            .with_n_threads_batch(cfg.threads as i32)
            .with_flash_attention_policy(match cfg.flash_attn {
                FlashAttn::Auto => llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_AUTO,
                FlashAttn::On => llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_ENABLED,
                FlashAttn::Off => llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_DISABLED,
            });
        let kv = |t| match t {
            kazeia_memory_budget::KvType::F16 => KvCacheType::F16,
            kazeia_memory_budget::KvType::Q8_0 => KvCacheType::Q8_0,
            kazeia_memory_budget::KvType::Q4_0 => KvCacheType::Q4_0,
        };
        params = params.with_type_k(kv(cfg.type_k)).with_type_v(kv(cfg.type_v));
        if cfg.cache_slots > 1 {
            // Several slots share the n_ctx cells (one slot keeps llama.cpp's default layout).
            params = params.with_n_seq_max(cfg.cache_slots).with_kv_unified(true);
        }
        backend().and_then(|b| {
            model.model.new_context(b, params).map_err(|e| LoadError::Context {
                role: cfg.role.clone(),
                path: model.path.display().to_string(),
                reason: e.to_string(),
            })
        })
    };
    let mut ctx = match ctx {
        Ok(mut ctx) => {
            warm_up(&mut ctx, &cfg, &compute);
            let _ = ready.send(Ok(()));
            ctx
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut cache = generate::Cache::default();
    generate::restore_prefix(&mut ctx, &mut cache, &model, &cfg);
    // The queue closes when the engine drops this role's Worker. A panic while serving a job is
    // caught: that job's channel closes (its caller sees the engine stop), the role is marked
    // failed with the reason (status shows it; the supervisor reloads it on next use), and every
    // job still queued is answered with that error instead of running on a context whose state
    // is unknown. Without this a panic ended the thread and left a zombie role: loaded in status,
    // `no_model` for every request, never unloaded by keep-alive.
    while let Ok(msg) = rx.recv() {
        let failed = counters.failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let refused = match failed {
            Some(why) => Some(LlmError::new(
                ErrorCode::Engine,
                format!("role {:?} failed ({why}); it reloads on next use", cfg.role),
            )),
            None if counters.closing.load(Ordering::SeqCst) => Some(LlmError::new(
                ErrorCode::NoModel,
                format!("role {:?} was unloaded before this request ran", cfg.role),
            )),
            None => None,
        };
        if let Some(e) = refused {
            match msg {
                Msg::Generate(job) => {
                    let _ = job.events.send(GenEvent::Finished(Err(e)));
                }
                Msg::Classify(job) => {
                    let _ = job.reply.send(Err(e));
                }
                Msg::Prefill(job) => {
                    let _ = job.reply.send(Err(e));
                }
            }
            counters.pending.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        // A prefill ahead of time yields to any request queued behind it (the worker takes a
        // message only after counting the previous one done, so this count is exact): it is
        // skipped, not run first, and one running stops between two chunks when a request
        // comes. Of several prefills queued, the newest runs.
        let msg = match msg {
            Msg::Prefill(job) if counters.pending.load(Ordering::SeqCst) > 1 => {
                let _ = job.reply.send(Err(GenerateError::Occupied(cfg.role.clone()).into()));
                counters.pending.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            msg => msg,
        };
        // A generation's channel stays open through a panic (this clone), so that its caller
        // hears the error only once the role is marked failed, never before.
        let events = match &msg {
            Msg::Generate(job) => Some(job.events.clone()),
            Msg::Classify(_) | Msg::Prefill(_) => None,
        };
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fault::maybe_panic(&cfg.role);
            match msg {
                Msg::Generate(job) => {
                    let n = generate::run(&mut ctx, &mut cache, &model, &cfg, &compute, *job);
                    counters.generated.fetch_add(u64::from(n), Ordering::SeqCst);
                }
                Msg::Classify(job) => generate::run_classify(&mut ctx, &mut cache, &model, &cfg, &compute, *job),
                Msg::Prefill(job) => {
                    let queued = || counters.pending.load(Ordering::SeqCst) > 1;
                    generate::run_prefill(&mut ctx, &mut cache, &model, &cfg, &compute, *job, &queued)
                }
            }
        }));
        if let Err(panic) = served {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            tracing::error!(role = %cfg.role, "the role's worker panicked: {why}");
            *counters.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("panic: {why}"));
            if let Some(events) = events {
                let e = LlmError::new(ErrorCode::Engine, format!("role {:?} failed (panic: {why})", cfg.role));
                let _ = events.send(GenEvent::Finished(Err(e)));
            }
        }
        counters.pending.fetch_sub(1, Ordering::SeqCst);
    }
    // The context (and with it, this role's KV and compute buffers) is freed here, before the
    // model's last Arc may go.
    drop(ctx);
}

/// Fault injection for the test that proves a panic on a role's thread is survived: built only
/// with the `fault-injection` feature (the tests crate's dev-dependency), and then only for the
/// role named by `KAZEIA_FAULT_PANIC_ROLE`, once.
mod fault {
    #[cfg(feature = "fault-injection")]
    pub fn maybe_panic(role: &str) {
        use std::sync::atomic::{AtomicBool, Ordering};
        static DONE: AtomicBool = AtomicBool::new(false);
        if std::env::var("KAZEIA_FAULT_PANIC_ROLE").is_ok_and(|r| r == role) && !DONE.swap(true, Ordering::SeqCst) {
            panic!("injected fault");
        }
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn maybe_panic(_role: &str) {}
}
