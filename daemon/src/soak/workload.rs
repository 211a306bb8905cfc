//! The soak's traffic: clients that take turns of every kind against the daemon, with cancels,
//! vanishing clients, and loads and unloads mixed in. Every step is drawn from a seeded RNG, so
//! a failing run can be replayed with the same `--seed`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kazeia_ipc::{AudioFrame, AudioSpec, Client, ErrorCode, Event, Frame, Incoming, Request, StopReason, TurnOptions};

/// What one step of a client does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A text turn on `chat`, read to the end.
    Chat,
    /// A text turn through both guards (`guarded-chat`), read to the end.
    Guarded,
    /// A turn cancelled after a random delay.
    Cancel,
    /// A turn whose client disconnects after a random delay (the daemon must clean up).
    Vanish,
    /// Unload a role and load it back (the ledger and the engine free and take memory).
    Reload,
    /// A status request.
    Status,
    /// A spoken question on `voice` (a clip sent at once, flagged last), read to its end: the
    /// transcript, the guarded reply and its audio.
    Voice,
}

impl Step {
    /// `voice`: the percentage of voice steps; the rest keep their shares.
    pub fn draw(rng: &mut fastrand::Rng, voice: u32) -> Step {
        if rng.u32(0..100) < voice {
            return Step::Voice;
        }
        match rng.u32(0..100) {
            0..40 => Step::Chat,
            40..65 => Step::Guarded,
            65..77 => Step::Cancel,
            77..87 => Step::Vanish,
            87..92 => Step::Reload,
            _ => Step::Status,
        }
    }
}

/// Outcomes, counted over the whole soak.
#[derive(Debug, Default)]
pub struct Counts {
    pub done: AtomicU64,
    pub cancelled: AtomicU64,
    pub vanished: AtomicU64,
    pub busy: AtomicU64,
    pub reloads: AtomicU64,
    pub errors: AtomicU64,
    /// Voice turns answered (transcript, reply, audio).
    pub voice: AtomicU64,
    /// Turns refused with `over_budget` where the soak expects it (speech that does not fit).
    pub refused: AtomicU64,
}

impl Counts {
    pub fn finished(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
            + self.cancelled.load(Ordering::Relaxed)
            + self.vanished.load(Ordering::Relaxed)
            + self.busy.load(Ordering::Relaxed)
            + self.refused.load(Ordering::Relaxed)
    }
}

/// A spoken question: s16le mono PCM at `rate`.
pub struct Clip {
    pub text: String,
    pub rate: u32,
    pub pcm: Vec<u8>,
}

pub struct Plan {
    pub socket: PathBuf,
    pub turns: u64,
    pub max_tokens: u32,
    pub roles: Vec<String>,
    pub pipelines: Vec<String>,
    /// Percentage of voice steps (0: none).
    pub voice: u32,
    pub clips: Vec<Clip>,
    /// The daemon's budget leaves no room for speech: every voice turn must be refused with
    /// `over_budget`, and text turns go on.
    pub speech_refused: bool,
}

const PROMPTS: &[&str] = &[
    "What is the capital of France? Answer in one short sentence.",
    "Give me three tips to sleep better.",
    "Explain what a rainbow is to a child.",
    "Write a haiku about the sea.",
    "How do I boil an egg?",
    "Quelle est la capitale de l'Italie ?",
    "List four fruits that are red.",
    "What should I pack for a weekend in the mountains?",
];

/// One client: take steps until `next` passes `plan.turns`. Unexpected errors are counted and
/// logged, not fatal: the soak's verdict is about the daemon's process, and the log says why.
pub async fn client(plan: Arc<Plan>, next: Arc<AtomicU64>, counts: Arc<Counts>, seed: u64) -> Result<(), String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut c = connect(&plan).await?;
    while next.fetch_add(1, Ordering::Relaxed) < plan.turns {
        let mut step = Step::draw(&mut rng, plan.voice);
        if step == Step::Guarded && !plan.pipelines.iter().any(|p| p == "guarded-chat") {
            step = Step::Chat;
        }
        let pipeline = if step == Step::Guarded { "guarded-chat" } else { "chat" };
        let text = PROMPTS[rng.usize(..PROMPTS.len())];
        let opts = TurnOptions {
            temperature: Some(0.7),
            seed: Some(rng.u32(..)),
            max_tokens: Some(plan.max_tokens),
            ..Default::default()
        };
        match step {
            Step::Chat | Step::Guarded => {
                let mut rx = c.turn(&c.new_id(), pipeline, text, opts).await.map_err(|e| e.to_string())?;
                tally(&counts, end_of(&mut rx).await);
            }
            Step::Cancel => {
                let id = c.new_id();
                let mut rx = c.turn(&id, pipeline, text, opts).await.map_err(|e| e.to_string())?;
                tokio::time::sleep(Duration::from_millis(rng.u64(0..400))).await;
                c.cancel(&id).await.map_err(|e| e.to_string())?;
                tally(&counts, end_of(&mut rx).await);
            }
            Step::Vanish => {
                let _rx = c.turn(&c.new_id(), pipeline, text, opts).await.map_err(|e| e.to_string())?;
                tokio::time::sleep(Duration::from_millis(rng.u64(0..400))).await;
                drop(_rx);
                c = connect(&plan).await?;
                counts.vanished.fetch_add(1, Ordering::Relaxed);
            }
            Step::Reload => {
                let role = &plan.roles[rng.usize(..plan.roles.len())];
                let unloaded = request(&c, Request::Unload { id: c.new_id(), role: role.clone() }).await;
                let loaded = request(&c, Request::Load { id: c.new_id(), role: role.clone() }).await;
                let counted = match (unloaded, loaded) {
                    // Unloaded then loaded; or another client's reload, or a load under the
                    // budget, had unloaded it first (`no_model`), and the load still loaded it.
                    (Event::Unloaded { .. } | Event::Error { code: ErrorCode::NoModel, .. }, Event::Loaded { .. }) => {
                        counts.reloads.fetch_add(1, Ordering::Relaxed);
                        &counts.done
                    }
                    // Another client's turn used the role: nothing was unloaded, so nothing was
                    // reloaded (the load answers `loaded` for a model already in place).
                    (Event::Error { code: ErrorCode::Busy, .. }, Event::Loaded { .. }) => &counts.busy,
                    (u, l) => {
                        tracing::warn!("reload of {role}: {u:?} then {l:?}");
                        counts.errors.fetch_add(1, Ordering::Relaxed);
                        &counts.done
                    }
                };
                counted.fetch_add(1, Ordering::Relaxed);
            }
            Step::Status => {
                c.status().await.map_err(|e| format!("status: {e}"))?;
                counts.done.fetch_add(1, Ordering::Relaxed);
            }
            Step::Voice => {
                let clip = &plan.clips[rng.usize(..plan.clips.len())];
                voice(&c, clip, opts, &plan, &counts).await?;
            }
        }
    }
    Ok(())
}

/// One voice turn: the clip in 100 ms frames, the last flagged; then its events to the end.
async fn voice(c: &Client, clip: &Clip, options: TurnOptions, plan: &Plan, counts: &Counts) -> Result<(), String> {
    let id = c.new_id();
    let req = Request::Turn {
        id: id.clone(),
        pipeline: "voice".into(),
        text: None,
        audio: Some(AudioSpec { sample_rate: clip.rate, channels: 1 }),
        session: None,
        options,
    };
    let mut rx = c.send(req).await.map_err(|e| e.to_string())?;
    let frame_bytes = (clip.rate as usize / 10) * 2;
    let chunks: Vec<&[u8]> = clip.pcm.chunks(frame_bytes).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let frame =
            AudioFrame { id: id.clone(), sample_rate: clip.rate, channels: 1, last, pcm: chunk.to_vec().into() };
        c.send_frame(Frame::Audio(frame)).await.map_err(|e| e.to_string())?;
    }
    let (mut heard, mut audio, mut last_audio) = (false, 0u32, false);
    let end = loop {
        match rx.recv().await {
            Some(Incoming::Event(Event::Transcript { is_final: true, .. })) => heard = true,
            Some(Incoming::Event(ev @ (Event::Done { .. } | Event::Error { is_final: true, .. }))) => break ev,
            Some(Incoming::Event(_)) => {}
            Some(Incoming::Audio(a)) => {
                audio += 1;
                last_audio |= a.last;
            }
            None => {
                break Event::Error {
                    id: None,
                    code: ErrorCode::Engine,
                    message: "connection closed mid-turn".into(),
                    is_final: true,
                }
            }
        }
    };
    let wrong = |why: String| {
        tracing::warn!("voice turn {id:?} ({:?}): {why}", clip.text);
        counts.errors.fetch_add(1, Ordering::Relaxed);
        counts.done.fetch_add(1, Ordering::Relaxed);
    };
    match (&end, plan.speech_refused) {
        (Event::Error { code: ErrorCode::OverBudget, .. }, true) => {
            counts.refused.fetch_add(1, Ordering::Relaxed);
        }
        (_, true) => wrong(format!("speech does not fit the budget, yet the turn ended with {end:?}")),
        (Event::Done { stop: StopReason::Eos | StopReason::Length | StopReason::Blocked, .. }, false) => {
            if heard && audio > 0 && last_audio {
                counts.voice.fetch_add(1, Ordering::Relaxed);
                counts.done.fetch_add(1, Ordering::Relaxed);
            } else {
                wrong(format!("answered without transcript or reply audio (transcript {heard}, {audio} audio frames)"));
            }
        }
        (_, false) => tally(counts, end),
    }
    Ok(())
}

async fn connect(plan: &Plan) -> Result<Client, String> {
    Client::connect(&plan.socket, "kazeia-soak").await.map_err(|e| format!("connect {}: {e}", plan.socket.display()))
}

/// The last event of a request (unloading a role already unloaded is an error we expect).
async fn request(c: &Client, req: Request) -> Event {
    let Ok(mut rx) = c.send(req).await else {
        return Event::Error { id: None, code: ErrorCode::Engine, message: "connection closed".into(), is_final: true };
    };
    loop {
        match rx.recv().await {
            Some(Incoming::Event(Event::LoadProgress { .. })) => {}
            Some(Incoming::Event(ev)) => return ev,
            Some(_) => {}
            None => {
                return Event::Error {
                    id: None,
                    code: ErrorCode::Engine,
                    message: "connection closed".into(),
                    is_final: true,
                }
            }
        }
    }
}

async fn end_of(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Incoming>) -> Event {
    while let Some(item) = rx.recv().await {
        if let Incoming::Event(ev @ (Event::Done { .. } | Event::Error { is_final: true, .. })) = item {
            return ev;
        }
    }
    Event::Error { id: None, code: ErrorCode::Engine, message: "connection closed mid-turn".into(), is_final: true }
}

fn tally(counts: &Counts, end: Event) {
    let n = match &end {
        Event::Done { stop: StopReason::Cancelled, .. } => &counts.cancelled,
        Event::Done { .. } => &counts.done,
        Event::Error { code: ErrorCode::Cancelled, .. } => &counts.cancelled,
        Event::Error { code: ErrorCode::Busy, .. } => &counts.busy,
        Event::Error { code, message, .. } => {
            tracing::warn!("turn failed: {code:?}: {message}");
            counts.errors.fetch_add(1, Ordering::Relaxed);
            &counts.done
        }
        _ => &counts.done,
    };
    n.fetch_add(1, Ordering::Relaxed);
}
