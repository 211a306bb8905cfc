//! Shared helpers of the benchmarks.

pub mod questions;

/// A count of reps or rounds, clap's own range check: 0 would leave the medians nothing
/// (`median` panicked).
pub fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..)
}

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

impl Kill {
    /// Spawn `cmd` so that it dies with the bench (see [`dies_with_us`]).
    pub fn spawn(cmd: &mut std::process::Command) -> std::io::Result<Kill> {
        dies_with_us(cmd).spawn().map(Kill)
    }
}

/// `cmd`, set to be killed when the bench is, even by SIGKILL (which runs no Drop: a
/// llama-server and a daemon outlived a stopped bench, holding 2 cores). The signal comes when
/// the spawning thread ends: spawn from the main thread (a bench's `#[tokio::main]` future),
/// not from a pool thread that may end first.
pub fn dies_with_us(cmd: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

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

/// CPU time a process has used, in ms: all its threads, the ones that have exited included
/// (utime + stime of `/proc/<pid>/stat`, in clock ticks, 10 ms each here). None off Linux or
/// once the process is gone. bench-voice reads the daemon's at the end of the user's speech and
/// at the reply's first audio: the work a turn does in that window, which 2 cores cannot finish
/// in less than half of it (session 22: 1391-2051 core-ms over 12 turns, busy 80-94%).
pub fn process_cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // SAFETY: sysconf only reads a constant of the system.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (tick > 0).then_some(())?;
    Some(stat_cpu_ticks(&stat)? as f64 * 1e3 / tick as f64)
}

/// utime + stime from a `/proc/<pid>/stat` line. The command name (field 2) may hold spaces
/// and parentheses: the fields are counted from its last `)`.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // After the name: state (3), ppid (4), … utime (14), stime (15).
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_past_an_odd_command_name() {
        let line = "4242 (kazeia ) (x) 1 2) S 1 4242 4242 0 -1 4194560 9 0 0 0 123 45 0 0 20 0 7 0 99 1 2";
        assert_eq!(stat_cpu_ticks(line), Some(168));
        assert_eq!(stat_cpu_ticks("4242 (kazeia) S 1 2"), None);
        assert_eq!(stat_cpu_ticks("no name at all"), None);
    }

    #[test]
    fn this_process_uses_cpu_time() {
        let pid = std::process::id();
        let before = process_cpu_ms(pid).expect("procfs");
        // Spin until a tick is counted: no fixed time, so a busy machine only makes it longer.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while process_cpu_ms(pid).expect("procfs") <= before {
            assert!(t.elapsed() < std::time::Duration::from_secs(30), "30 s of spinning counted nothing");
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        assert!(process_cpu_ms(u32::MAX).is_none());
    }
    /// tools/env.sh: one build cache for several checkouts. Whenever the checkout using it
    /// changes, that checkout's files must come out newer than any build in the cache (cargo
    /// would otherwise take another checkout's newer build for this one's older edits); the
    /// same checkout again touches nothing.
    #[test]
    fn env_sh_makes_a_checkout_new_to_the_build_cache_newer_than_its_builds() {
        use std::path::Path;
        use std::process::Command;
        let env_sh = Path::new(env!("CARGO_MANIFEST_DIR")).join("env.sh");
        let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cargo/config.toml");
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        let run = |cmd: &str, dir: &Path| {
            let out = Command::new("bash")
                .args(["-c", cmd])
                .current_dir(dir)
                .env("CARGO_TARGET_DIR", &target)
                .output()
                .unwrap();
            assert!(out.status.success(), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let checkout = |name: &str| {
            let d = tmp.path().join(name);
            std::fs::create_dir_all(d.join("tools")).unwrap();
            std::fs::create_dir_all(d.join(".cargo")).unwrap();
            std::fs::create_dir_all(d.join("src")).unwrap();
            std::fs::copy(&env_sh, d.join("tools/env.sh")).unwrap();
            std::fs::copy(&config, d.join(".cargo/config.toml")).unwrap();
            std::fs::write(d.join("Cargo.toml"), "[workspace]\n").unwrap();
            std::fs::write(d.join("src/main.rs"), "fn main() {}\n").unwrap();
            run("git init -q . && git add -A", &d);
            d
        };
        let (a, b) = (checkout("a"), checkout("b"));
        let old = |d: &Path| run("touch -d 2001-01-01 src/main.rs", d);
        let is_old = |d: &Path| {
            let m = std::fs::metadata(d.join("src/main.rs")).unwrap().modified().unwrap();
            m < std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000 + 86_400 * 365)
        };
        let source = "set -euo pipefail; source tools/env.sh";
        for (d, touched) in [(&a, true), (&a, false), (&b, true), (&b, false), (&a, true)] {
            old(d);
            run(source, d);
            assert_eq!(!is_old(d), touched, "{}", d.display());
            let stamp = std::fs::read_to_string(target.join(".kazeia-checkout")).unwrap();
            assert_eq!(Path::new(stamp.trim()), d.canonicalize().unwrap());
        }
    }
}
