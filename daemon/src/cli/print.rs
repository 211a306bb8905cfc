//! Printing events: text mode writes the reply to stdout and notes to stderr; `--json` writes
//! one event object per line to stdout.

use std::io::{IsTerminal, Write};

use indicatif::{ProgressBar, ProgressStyle};
use kazeia_ipc::{ErrorCode, Event, StopReason};

/// Print events: text mode writes the reply to stdout and the rest to stderr; JSON mode writes
/// one object per line to stdout.
pub struct Printer {
    pub json: bool,
    /// `run transcribe`: the transcript is the output (stdout), not a note.
    pub transcript_out: bool,
    bar: std::sync::Mutex<Option<ProgressBar>>,
}

impl Printer {
    pub fn new(json: bool) -> Printer {
        Printer { json, transcript_out: false, bar: std::sync::Mutex::new(None) }
    }

    pub fn event(&self, ev: &Event) {
        let mut out = std::io::stdout().lock();
        if self.json {
            let _ = writeln!(out, "{}", serde_json::to_string(ev).expect("events serialize"));
            let _ = out.flush();
            return;
        }
        match ev {
            Event::Token { text, .. } => {
                let _ = write!(out, "{text}");
                let _ = out.flush();
            }
            Event::Done { stop, metrics, .. } => {
                let _ = writeln!(out);
                let note = if *stop == StopReason::Eos { String::new() } else { format!(" (stopped: {stop:?})") };
                eprintln!(
                    "[{} prompt + {} generated tokens, ttft {:.0} ms, prefill {:.1} tok/s, decode {:.1} tok/s]{note}",
                    metrics.prompt_tokens,
                    metrics.generated_tokens,
                    metrics.ttft_ms,
                    metrics.prefill_tok_s,
                    metrics.decode_tok_s
                );
            }
            Event::Error { code, message, .. } => {
                let _ = out.flush();
                eprintln!("error [{code}]: {message}");
            }
            Event::Accepted { id, .. } => eprintln!("[request {id}]"),
            Event::Verdict { stage, label, ms, .. } => eprintln!("[{stage} guard: {label}, {ms:.0} ms]"),
            Event::Transcript { text, .. } if self.transcript_out => {
                let _ = writeln!(out, "{text}");
            }
            Event::Transcript { text, .. } => eprintln!("[heard: {text}]"),
            Event::LoadProgress { role, progress, .. } => self.progress(role, *progress),
            Event::Sentence { .. } | Event::Welcome { .. } => {}
            Event::Loaded { role, .. } => eprintln!("loaded {role}"),
            Event::Unloaded { role, .. } => eprintln!("unloaded {role}"),
            Event::Status { status: s, .. } => status(s),
        }
    }

    /// A load's progress: a bar on an interactive stderr, nothing otherwise.
    fn progress(&self, role: &str, p: f32) {
        if !std::io::stderr().is_terminal() {
            return;
        }
        let mut bar = self.bar.lock().expect("progress bar");
        let b = bar.get_or_insert_with(|| {
            let b = ProgressBar::new(100);
            if let Ok(style) = ProgressStyle::with_template("{msg:>12} [{bar:40}] {percent:>3}%") {
                b.set_style(style.progress_chars("=> "));
            }
            b
        });
        b.set_message(format!("loading {role}"));
        b.set_position((p * 100.0) as u64);
        if p >= 1.0 {
            b.finish_and_clear();
            *bar = None;
        }
    }

    pub fn error(&self, code: ErrorCode, message: String) {
        self.event(&Event::Error { id: None, code, message });
    }
}

/// The status report as a table.
pub fn status(s: &kazeia_ipc::StatusReport) {
    println!(
        "{} (protocol {}), pid {}, up {:.0} s, {} connection(s), {} turn(s) running",
        s.server, s.protocol, s.pid, s.uptime_s, s.connections, s.turns_running
    );
    println!("pipelines: {}", s.pipelines.join(", "));
    let to_mib = |b: u64| b as f64 / 1048576.0;
    println!("memory: {:.1} MiB reserved of a {:.1} MiB budget", to_mib(s.reserved_bytes), to_mib(s.budget_bytes));
    println!("{:<10} {:<9} {:<6} {:>9} {:>5}  file / placement", "role", "state", "device", "MiB", "busy");
    for m in &s.models {
        let mib = m.file_bytes.map(|b| format!("{:.1}", b as f64 / 1048576.0)).unwrap_or_else(|| "-".into());
        let state = format!("{:?}", m.state).to_lowercase();
        println!(
            "{:<10} {:<9} {:<6} {:>9} {:>5}  {}",
            m.role,
            state,
            m.device.as_deref().unwrap_or("-"),
            mib,
            m.busy,
            m.file
        );
        if let Some(r) = m.reserved_bytes {
            let measured = m
                .measured_bytes
                .map(|b| format!(", measured at load {:.1} MiB", b as f64 / 1048576.0))
                .unwrap_or_default();
            println!("{:<10} {:<9} {:<6} {:>9} {:>5}  reserves {:.1} MiB{measured}", "", "", "", "", "", to_mib(r));
        }
        if let Some(p) = &m.placement {
            println!("{:<10} {:<9} {:<6} {:>9} {:>5}  {}", "", "", "", "", "", p);
        }
        if !m.shares_model_with.is_empty() {
            println!(
                "{:<10} {:<9} {:<6} {:>9} {:>5}  shares its model with {}",
                "",
                "",
                "",
                "",
                "",
                m.shares_model_with.join(", ")
            );
        }
        if let Some(e) = &m.error {
            println!("{:<10} {:<9} {:<6} {:>9} {:>5}  error: {e}", "", "", "", "", "");
        }
    }
}
