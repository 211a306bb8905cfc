//! `kazeia run <pipeline>`: one turn in this process, through a supervisor of its own, so that
//! the budget, the ledger and admission apply exactly as in the daemon. Text from `--text`,
//! audio from a WAV (`--audio`, transcribed whole); spoken replies written to `--out`.

use std::sync::{Arc, Mutex};

use kazeia_ipc::{AudioSpec, ErrorCode, Event, Frame};
use tokio_util::sync::CancellationToken;

use super::print::noteln;
use super::{Exit, Printer, RunArgs};
use crate::config::Config;
use crate::supervisor::{Supervisor, TurnRequest, Who};
use crate::turns::{self, AudioSource};

pub async fn run(mut args: RunArgs) -> Exit {
    let printer = Printer::new(args.json);
    if let Some(t) = args.text.take() {
        match super::read_text(t) {
            Ok(t) => args.text = Some(t),
            Err(e) => {
                printer.error(ErrorCode::BadRequest, e);
                return Exit::Usage;
            }
        }
    }
    let mut config = match Config::load(&args.common.config) {
        Ok(c) => c,
        Err(e) => {
            printer.error(ErrorCode::BadConfig, e.to_string());
            return Exit::Usage;
        }
    };
    if let Some(lang) = &args.language {
        if lang != "auto" && !crate::config::is_language_code(lang) {
            printer.error(
                ErrorCode::BadRequest,
                format!("--language {lang:?}: a Whisper language code (`fr`, `en`, …) or `auto`"),
            );
            return Exit::Usage;
        }
        config.speech.language = lang.clone();
    }
    let registry = match super::serve::registry(&args.common, &config) {
        Ok(r) => r,
        Err(e) => {
            printer.error(ErrorCode::Pipeline, e.to_string());
            return Exit::Usage;
        }
    };
    let plan = match registry.get(&args.pipeline).map_err(|e| e.to_string()).and_then(|p| p.plan()) {
        Ok(p) => p,
        Err(e) => {
            printer.error(ErrorCode::Pipeline, e);
            return Exit::Usage;
        }
    };
    // What the pipeline takes and gives, checked before anything loads.
    let name = &args.pipeline;
    let usage = |m: String| {
        printer.error(ErrorCode::BadRequest, m);
        Exit::Usage
    };
    if plan.transcribe && args.audio.is_none() {
        return usage(format!("{name} takes --audio FILE.wav"));
    }
    if !plan.transcribe && args.text.is_none() {
        return usage(format!("{name} takes --text \"…\""));
    }
    if plan.speak && args.out.is_none() {
        return usage(format!("{name} speaks: give --out FILE.wav"));
    }
    if let Err(e) = super::check_out(args.out.as_deref(), name, Some(plan.speak)) {
        return usage(e);
    }
    let printer = printer.for_plan(&plan);
    let samples = match &args.audio {
        Some(path) => match crate::speech::audio::read_wav(path) {
            Ok(s) if s.is_empty() => {
                printer.error(ErrorCode::BadRequest, format!("{}: no audio in it", path.display()));
                return Exit::Usage;
            }
            Ok(s) => Some(s),
            Err(e) => {
                printer.error(ErrorCode::BadRequest, e.to_string());
                return Exit::Usage;
            }
        },
        None => None,
    };

    let sup = Supervisor::new(config, registry);
    let request = TurnRequest {
        id: "run".into(),
        pipeline: args.pipeline.clone(),
        text: args.text.clone(),
        audio: samples.as_ref().map(|_| AudioSpec { sample_rate: 16_000, channels: 1 }),
        session: None,
        options: args.sampling.turn_options(),
    };
    // SAFETY: geteuid has no preconditions.
    let who = Who { conn: 0, uid: unsafe { libc::geteuid() } };
    let root = CancellationToken::new();
    let turn = match sup.begin_turn(who, request, &root) {
        Ok(t) => t,
        Err(e) => {
            printer.error(e.code, e.message);
            return Exit::for_code(e.code);
        }
    };
    // `--json` gives the events a socket client would see, `accepted` first.
    if printer.json {
        printer.event(&Event::Accepted { id: turn.id.clone(), pipeline: turn.pipeline.name.clone() });
    }
    let on_signal = root.clone();
    super::on_ctrl_c(move || on_signal.cancel());

    // Events printed as they come; audio gathered for --out.
    let printer = Arc::new(printer);
    let spoken = Arc::new(Mutex::new((Vec::<f32>::new(), 0u32)));
    let failed = Arc::new(Mutex::new(None::<ErrorCode>));
    let output: turns::Output = {
        let (printer, spoken, failed) = (printer.clone(), spoken.clone(), failed.clone());
        Arc::new(move |f: Frame| match f {
            Frame::Audio(a) => {
                let mut s = spoken.lock().expect("spoken audio");
                s.0.extend(crate::speech::audio::from_s16le(&a.pcm));
                s.1 = a.sample_rate;
            }
            Frame::Json(body) => {
                if let Ok(ev) = serde_json::from_slice::<Event>(&body) {
                    if let Event::Error { code, .. } = ev {
                        *failed.lock().expect("failed") = Some(code);
                    }
                    printer.event(&ev);
                }
            }
            Frame::Invalid(_) => {}
        })
    };
    let last = turns::run(sup.clone(), turn, samples.map(AudioSource::Complete), output.clone()).await;
    output(last);
    let mut exit = failed.lock().expect("failed").map_or(Exit::Ok, Exit::for_code);
    // Where speech ran, once per run (instead of a warning per ONNX session).
    if (plan.transcribe || plan.speak) && !printer.json {
        if let Some(p) = crate::speech::placement() {
            noteln!("[speech on {}: {}]", p.device, p.reason);
        }
    }
    if let (Some(out), Exit::Ok) = (&args.out, exit) {
        let (samples, rate) = std::mem::take(&mut *spoken.lock().expect("spoken audio"));
        match crate::speech::audio::write_wav(out, &samples, rate.max(1)) {
            Ok(()) if !printer.json => {
                let secs = samples.len() as f64 / f64::from(rate.max(1));
                noteln!("[{secs:.1} s of audio in {}]", out.display());
            }
            Ok(()) => {}
            Err(e) => {
                printer.error(ErrorCode::Engine, e.to_string());
                exit = Exit::Failed;
            }
        }
    }
    // Unloading joins the engine threads: off the async workers.
    let _ = tokio::task::spawn_blocking(move || drop(sup)).await;
    exit
}
