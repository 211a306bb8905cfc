//! Shared helpers of the benchmarks.

pub mod questions;

/// The median of a sample (the mean of the two middle values for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty(), "median of nothing");
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A child process (a daemon, a reference server) killed and reaped when the bench ends,
/// however it ends.
pub struct Kill(pub std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether a daemon started on `config` is done with its `[speech] preload` (loaded and warmed,
/// or failed), from its log at `log`: a bench waits for it so that it does not time a turn
/// against the speech models' loads on the same cores. True at once when the config does not
/// preload speech.
pub fn speech_preload_done(config: &kazeia_daemon::config::Config, log: &std::path::Path) -> bool {
    if !(config.daemon.preload && config.speech.preload) {
        return true;
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.contains(kazeia_daemon::server::SPEECH_PRELOADED) || text.contains("speech preload")
}

/// The `ms=` of the daemon's [`kazeia_daemon::server::SPEECH_PRELOADED`] log line, if it is there.
pub fn speech_preload_ms(log: &std::path::Path) -> Option<u64> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text.lines().find(|l| l.contains(kazeia_daemon::server::SPEECH_PRELOADED))?;
    line.split_whitespace().find_map(|w| w.strip_prefix("ms=")).and_then(|v| v.parse().ok())
}

/// RUST_LOG for a daemon a bench starts: the caller's, or warnings only, and in either case the
/// server's info lines ([`speech_preload_done`] reads one).
pub fn daemon_log_filter() -> String {
    let base = std::env::var("RUST_LOG").ok().filter(|v| !v.is_empty()).unwrap_or_else(|| "warn".into());
    format!("{base},kazeia_daemon::server=info")
}
