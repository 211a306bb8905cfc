//! `kazeia ask`: one turn through the daemon, streamed; Ctrl-C cancels it there.
//!
//! Text from the argument (`-`: stdin) or a WAV streamed as audio frames (`--audio`, 100 ms per
//! frame, as fast as the socket takes them (at most 19 s of it) or at recording pace with
//! `--realtime`); the spoken
//! reply, if any, written to `--out`. Everything is checked before the daemon is asked: the
//! question, the audio file, that `--out` can be written.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kazeia_ipc::{AudioFrame, AudioSpec, ClientError, ErrorCode, Event, Frame, Request, DEFAULT_PIPELINE};

use super::client::{connect, follow};
use super::print::noteln;
use super::{AskArgs, Exit, Printer};

/// Samples per audio frame: 100 ms at 16 kHz, what a microphone client sends.
const FRAME: usize = 1_600;

pub async fn ask(args: AskArgs) -> Exit {
    let printer = Printer::new(args.client.json);
    let text = match args.text.or(args.text_flag).map(super::read_text).transpose() {
        Ok(t) => t,
        Err(e) => return usage(&printer, e),
    };
    let samples = match &args.audio {
        Some(path) => match crate::speech::audio::read_wav(path) {
            Ok(s) if s.is_empty() => return usage(&printer, format!("{}: no audio in it", path.display())),
            Ok(s) => Some(s),
            Err(e) => return usage(&printer, e.to_string()),
        },
        None => None,
    };
    if let Some(s) = samples.as_ref().filter(|s| !args.realtime && s.len() > AT_ONCE_FRAMES * FRAME) {
        let secs = s.len() as f64 / 16_000.0;
        return usage(
            &printer,
            format!(
                "the recording is {secs:.1} s: at most {} s is sent at once (the daemon holds 20 s of a turn's audio); \
                 --realtime streams it as a microphone would (its turn ends at a pause), \
                 `kazeia run transcribe --audio` reads it whole",
                AT_ONCE_FRAMES / 10
            ),
        );
    }
    if text.is_none() && samples.is_none() {
        return usage(
            &printer,
            "ask what? give the question (`kazeia ask \"…\"`, `-` reads stdin) or --audio FILE.wav".into(),
        );
    }
    let pipeline =
        args.pipeline.clone().unwrap_or_else(|| if samples.is_some() { "voice" } else { DEFAULT_PIPELINE }.into());
    // The built-in pipelines are known here: what they print, and whether --out is needed. A
    // pipeline only the daemon knows (--pipelines) is left to it.
    let plan = kazeia_pipelines::Registry::builtin().get(&pipeline).ok().and_then(|p| p.plan().ok());
    let printer = match &plan {
        Some(p) => printer.for_plan(p),
        None => printer,
    };
    match &plan {
        Some(p) if p.transcribe && samples.is_none() => {
            return usage(&printer, format!("{pipeline} listens: give --audio FILE.wav"))
        }
        Some(p) if !p.transcribe && samples.is_some() => {
            return usage(&printer, format!("{pipeline} takes text, not --audio (audio pipelines: voice, transcribe)"))
        }
        _ => {}
    }
    if plan.as_ref().is_some_and(|p| p.speak && !p.has_text_stages() && !p.transcribe) && args.out.is_none() {
        return usage(&printer, format!("{pipeline} only speaks: give --out FILE.wav"));
    }
    if let Err(e) = super::check_out(args.out.as_deref(), &pipeline, plan.as_ref().map(|p| p.speak)) {
        return usage(&printer, e);
    }

    let Some(client) = connect(&args.client, &printer).await else { return Exit::Failed };
    let client = Arc::new(client);
    let id = client.new_id();
    let req = Request::Turn {
        id: id.clone(),
        pipeline,
        text,
        audio: samples.as_ref().map(|_| AudioSpec { sample_rate: 16_000, channels: 1 }),
        session: args.session.clone(),
        options: args.sampling.turn_options(),
    };
    let rx = match client.send(req).await {
        Ok(rx) => rx,
        // Over the daemon's frame limit: the question, not the daemon, is the problem.
        Err(ClientError::Frame(e)) => return usage(&printer, format!("the question is too long to send: {e}")),
        Err(e) => return super::client::not_sent(&printer, &e),
    };
    // Ctrl-C cancels the turn in the daemon, then we wait for its `done`.
    let (c2, id2) = (client.clone(), id.clone());
    super::on_ctrl_c(move || {
        tokio::spawn(async move {
            let _ = c2.cancel(&id2).await;
        });
    });

    // The audio starts once the turn is accepted (frames for an id the daemon does not know yet
    // would be refused), and stops when the turn ends.
    let mut audio = samples.map(Arc::new);
    let mut streamer: Option<tokio::task::JoinHandle<()>> = None;
    let reply = Arc::new(Mutex::new((Vec::<f32>::new(), 0u32)));
    let exit = {
        let reply = reply.clone();
        let (client, realtime) = (client.clone(), args.realtime);
        follow(
            &printer,
            rx,
            |ev| matches!(ev, Event::Done { .. }),
            |ev| {
                if let (Event::Accepted { .. }, Some(samples)) = (ev, audio.take()) {
                    streamer = Some(tokio::spawn(stream(client.clone(), id.clone(), samples, realtime)));
                }
            },
            move |a: AudioFrame| {
                let mut r = reply.lock().expect("reply audio");
                r.0.extend(crate::speech::audio::from_s16le(&a.pcm));
                r.1 = a.sample_rate;
            },
        )
        .await
    };
    if let Some(s) = streamer {
        s.abort();
    }
    let (spoken, rate) = std::mem::take(&mut *reply.lock().expect("reply audio"));
    let secs = spoken.len() as f64 / f64::from(rate.max(1));
    match (&args.out, exit) {
        (Some(out), Exit::Ok) => match crate::speech::audio::write_wav(out, &spoken, rate.max(1)) {
            Ok(()) if !printer.json => noteln!("[{secs:.1} s of audio in {}]", out.display()),
            Ok(()) => {}
            Err(e) => {
                printer.error(ErrorCode::Engine, e.to_string());
                return Exit::Failed;
            }
        },
        (None, _) if !spoken.is_empty() && !printer.json => {
            noteln!("[{secs:.1} s of spoken reply not kept: give --out FILE.wav]")
        }
        _ => {}
    }
    exit
}

/// A question the command cannot ask: said as the protocol's `bad_request`, exit 2.
fn usage(printer: &Printer, m: String) -> Exit {
    printer.error(ErrorCode::BadRequest, m);
    Exit::Usage
}

/// The longest recording sent at once: 19 s. The daemon keeps 20 s of a turn's audio in flight
/// and drops what finds that full (`busy`, audio overrun): a 42 s recording lost most of its
/// words. Sent at its pace instead, it is a live stream, whose turn ends at its first pause the
/// end-of-turn model calls complete (the whole recording is one utterance only when its `last`
/// frame has come): longer ones take `--realtime`, which says so, or `kazeia run`.
const AT_ONCE_FRAMES: usize = 190;

/// Send `samples` (16 kHz mono) as 100 ms audio frames, the last one flagged: as fast as the
/// socket takes them, or at the recording's pace with `realtime`.
async fn stream(client: Arc<kazeia_ipc::Client>, id: String, samples: Arc<Vec<f32>>, realtime: bool) {
    let chunks: Vec<&[f32]> = samples.chunks(FRAME).collect();
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    for (i, chunk) in chunks.iter().enumerate() {
        if realtime {
            pace.tick().await;
        }
        let frame = AudioFrame {
            id: id.clone(),
            sample_rate: 16_000,
            channels: 1,
            last: i + 1 == chunks.len(),
            pcm: crate::speech::audio::to_s16le(chunk).into(),
        };
        if client.send_frame(Frame::Audio(frame)).await.is_err() {
            return;
        }
    }
}
