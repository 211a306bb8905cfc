//! Printing events: text mode writes the reply to stdout and notes to stderr; `--json` writes
//! one event object per line to stdout.
//!
//! A closed stdout (`kazeia status | head -1`) ends the command at once and quietly, with exit
//! code 141 as a Unix tool killed by SIGPIPE would (it used to panic, exit 101). Rust ignores
//! SIGPIPE, and the daemon must keep doing so (a client that vanishes is not a reason to die),
//! so every write to stdout goes through [`out`].

use std::io::{IsTerminal, Write};

use indicatif::{ProgressBar, ProgressStyle};
use kazeia_ipc::{ErrorCode, Event, StopReason};
use kazeia_pipelines::Plan;

/// Exit code when stdout was closed before the command was done: 128 + SIGPIPE.
pub const EXIT_CLOSED_STDOUT: i32 = 141;

/// Text for a terminal: control characters other than a line break and a tab become U+FFFD (a
/// carriage return before a line break goes). Replies, reasoning, transcripts, model file names
/// and the daemon's messages are printed as they come, and a model's byte-level tokenizer
/// writes ESC as readily as any byte: a reply holding `ESC]0;…BEL` or `ESC[2J` retitled or
/// cleared the user's terminal (OSC 52 writes its clipboard on some).
pub fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(bad) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' if chars.peek() == Some(&'\n') => {}
            c if bad(c) => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Write to stdout and flush; a closed stdout ends the process quietly (see the module's doc).
/// Through [`shown`]: everything a command prints goes through here or [`note`], but
/// [`json_line`]'s.
pub fn out(args: std::fmt::Arguments) {
    write_out(&shown(&args.to_string()));
}

/// One `--json` line, as it is: JSON escapes the C0 controls, and a DEL or a C1 control in a
/// string is data (U+FFFD would change it).
pub fn json_line(line: impl std::fmt::Display) {
    write_out(&format!("{line}\n"));
}

fn write_out(text: &str) {
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_all(text.as_bytes()).and_then(|()| o.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(EXIT_CLOSED_STDOUT);
        }
    }
}

/// A note for the person at the terminal (stderr); a closed stderr loses it, nothing else.
pub fn note(args: std::fmt::Arguments) {
    let _ = writeln!(std::io::stderr().lock(), "{}", shown(&args.to_string()));
}

/// `println!` through [`out`].
macro_rules! outln {
    ($($t:tt)*) => { $crate::cli::print::out(format_args!("{}\n", format_args!($($t)*))) };
}
/// `eprintln!` through [`note`].
macro_rules! noteln {
    ($($t:tt)*) => { $crate::cli::print::note(format_args!($($t)*)) };
}
pub(crate) use {noteln, outln};

/// Print events: text mode writes the reply to stdout and the rest to stderr; JSON mode writes
/// one object per line to stdout.
pub struct Printer {
    pub json: bool,
    /// A pipeline without a Thinker: its transcript (`transcribe`) or its verdict (`guard`) is
    /// the output (stdout), not a note.
    pub transcript_out: bool,
    pub verdict_out: bool,
    /// Reply text went to stdout: it gets its final newline at `done`.
    wrote_text: std::sync::atomic::AtomicBool,
    /// Reasoning went to stderr: a newline ends it before the next note or the reply.
    thinking_open: std::sync::atomic::AtomicBool,
    bar: std::sync::Mutex<Option<ProgressBar>>,
}

impl Printer {
    pub fn new(json: bool) -> Printer {
        Printer {
            json,
            transcript_out: false,
            verdict_out: false,
            wrote_text: Default::default(),
            thinking_open: Default::default(),
            bar: Default::default(),
        }
    }

    /// What goes to stdout for a pipeline of this shape.
    pub fn for_plan(mut self, plan: &Plan) -> Printer {
        self.transcript_out = plan.transcribe && !plan.has_text_stages();
        self.verdict_out = plan.think.is_none() && (plan.input_guard.is_some() || plan.output_guard.is_some());
        self
    }

    pub fn event(&self, ev: &Event) {
        if self.json {
            json_line(serde_json::to_string(ev).expect("events serialize"));
            return;
        }
        if !matches!(ev, Event::Thinking { .. }) && self.thinking_open.swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            noteln!("");
        }
        match ev {
            Event::Token { text, .. } => {
                self.wrote_text.store(true, std::sync::atomic::Ordering::Relaxed);
                out(format_args!("{text}"))
            }
            Event::Done { stop, metrics, .. } => {
                let note = if *stop == StopReason::Eos { String::new() } else { format!(" (stopped: {stop:?})") };
                // Stages without a language model (transcribe, speak, a guard's verdict) have
                // no token figures to give.
                if self.wrote_text.swap(false, std::sync::atomic::Ordering::Relaxed) {
                    outln!("");
                }
                if metrics.generated_tokens > 0 || metrics.prompt_tokens > 0 {
                    noteln!(
                        "[{} prompt + {} generated tokens, ttft {:.0} ms, prefill {:.1} tok/s, decode {:.1} tok/s]{note}",
                        metrics.prompt_tokens,
                        metrics.generated_tokens,
                        metrics.ttft_ms,
                        metrics.prefill_tok_s,
                        metrics.decode_tok_s
                    );
                } else if *stop != StopReason::Eos {
                    noteln!("[stopped: {}]", format!("{stop:?}").to_lowercase());
                }
            }
            Event::Error { code, message, .. } => noteln!("error [{code}]: {message}"),
            Event::Accepted { id, .. } => noteln!("[request {id}]"),
            // Reasoning (asked for with --show-thinking) is not the answer: stderr, as it comes.
            Event::Thinking { text, .. } => {
                self.thinking_open.store(true, std::sync::atomic::Ordering::Relaxed);
                let _ = write!(std::io::stderr().lock(), "{}", shown(text));
            }
            Event::Verdict { stage, label, categories, ms, .. } if self.verdict_out => {
                let cats = if categories.is_empty() { String::new() } else { format!(" ({})", categories.join(", ")) };
                outln!("{label}{cats}");
                noteln!("[{stage} guard, {ms:.0} ms]");
            }
            Event::Verdict { stage, label, ms, .. } => noteln!("[{stage} guard: {label}, {ms:.0} ms]"),
            Event::Transcript { text, is_final: false, .. } => noteln!("[hearing: {text}]"),
            Event::Transcript { text, .. } if self.transcript_out => outln!("{text}"),
            Event::Transcript { text, .. } => noteln!("[heard: {text}]"),
            Event::LoadProgress { role, progress, .. } => self.progress(role, *progress),
            Event::Sentence { .. } | Event::Welcome { .. } => {}
            Event::Loaded { role, .. } => noteln!("loaded {role}"),
            Event::Unloaded { role, .. } => noteln!("unloaded {role}"),
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
        self.event(&Event::Error { id: None, code, message, is_final: true });
    }
}

/// The status report as a table.
pub fn status(s: &kazeia_ipc::StatusReport) {
    outln!(
        "{} (protocol {}), pid {}, up {:.0} s, {} connection(s), {} turn(s) running",
        s.server,
        s.protocol,
        s.pid,
        s.uptime_s,
        s.connections,
        s.turns_running
    );
    outln!("pipelines: {}", s.pipelines.join(", "));
    let to_mib = |b: u64| b as f64 / 1048576.0;
    outln!(
        "memory: {:.1} MiB reserved of a {:.1} MiB budget, pressure {}",
        to_mib(s.reserved_bytes),
        to_mib(s.budget_bytes),
        s.pressure
    );
    outln!("{:<10} {:<9} {:<6} {:>9} {:>5}  file / placement", "role", "state", "device", "MiB", "busy");
    for m in &s.models {
        let mib = m.file_bytes.map(|b| format!("{:.1}", b as f64 / 1048576.0)).unwrap_or_else(|| "-".into());
        let state = format!("{:?}", m.state).to_lowercase();
        outln!(
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
            outln!("{:<10} {:<9} {:<6} {:>9} {:>5}  reserves {:.1} MiB{measured}", "", "", "", "", "", to_mib(r));
        }
        if let Some(p) = &m.placement {
            outln!("{:<10} {:<9} {:<6} {:>9} {:>5}  {}", "", "", "", "", "", p);
        }
        if !m.shares_model_with.is_empty() {
            outln!(
                "{:<10} {:<9} {:<6} {:>9} {:>5}  shares its model with {}",
                "",
                "",
                "",
                "",
                "",
                m.shares_model_with.join(", ")
            );
        }
        if let Some(b) = m.prefix_file_bytes {
            outln!(
                "{:<10} {:<9} {:<6} {:>9} {:>5}  keeps its fixed opening in a {:.1} MiB file",
                "",
                "",
                "",
                "",
                "",
                to_mib(b)
            );
        }
        if let Some(e) = &m.error {
            outln!("{:<10} {:<9} {:<6} {:>9} {:>5}  error: {e}", "", "", "", "", "");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_are_not_shown() {
        assert_eq!(super::shown("Paris.\u{1b}]0;x\u{7}\u{9b}2J\r"), "Paris.\u{fffd}]0;x\u{fffd}\u{fffd}2J\u{fffd}");
        assert_eq!(super::shown("one\r\ntwo\u{1b}"), "one\ntwo\u{fffd}");
        assert!(matches!(super::shown("deux lignes\n\tet une tabulation, « é »"), std::borrow::Cow::Borrowed(_)));
    }
}
