//! What the soak watches in the daemon's process, read from /proc/<pid>.

use std::path::Path;

/// One sample of the daemon's process.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sample {
    /// Seconds since the soak started.
    pub t_s: f64,
    /// Resident set (VmRSS): what the budget is about.
    pub rss_bytes: u64,
    /// Anonymous resident memory (RssAnon): what cannot be dropped under pressure (weights
    /// without mmap, KV, compute buffers); a leak shows here.
    pub anon_bytes: u64,
    pub fds: u64,
    pub threads: u64,
    /// Turns finished so far (any outcome).
    pub turns: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot read /proc/{pid}: {source} (has the daemon exited?)")]
pub struct SampleError {
    pub pid: u32,
    #[source]
    pub source: std::io::Error,
}

fn kb_field(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

fn count_entries(dir: &Path) -> std::io::Result<u64> {
    Ok(std::fs::read_dir(dir)?.count() as u64)
}

/// The name of the daemon's tokio blocking-pool threads (set in main.rs).
pub const POOL_THREAD: &str = "tokio-blocking";

/// Threads of the process but its tokio blocking pool's: that pool starts a thread when two
/// blocking jobs overlap (a reload and a voice turn's speech admission) and lets it go after
/// 10 s idle, bounded; counted, it read as "threads grew 8 -> 9" in a 100-turn soak whose
/// second pool thread first came 20 s in. Every other thread (workers, roles, their CPU thread
/// teams, ONNX Runtime's, named `ort-speech` though a pool thread starts them) counts.
fn count_threads(task: &Path) -> std::io::Result<u64> {
    let mut n = 0;
    for t in std::fs::read_dir(task)? {
        let comm = std::fs::read_to_string(t?.path().join("comm")).unwrap_or_default();
        n += u64::from(comm.trim_end() != POOL_THREAD);
    }
    Ok(n)
}

/// Read the process's memory, file descriptors and threads.
pub fn sample(pid: u32, t_s: f64, turns: u64) -> Result<Sample, SampleError> {
    let proc = Path::new("/proc").join(pid.to_string());
    let err = |source| SampleError { pid, source };
    let status = std::fs::read_to_string(proc.join("status")).map_err(err)?;
    Ok(Sample {
        t_s,
        rss_bytes: kb_field(&status, "VmRSS"),
        anon_bytes: kb_field(&status, "RssAnon"),
        fds: count_entries(&proc.join("fd")).map_err(err)?,
        threads: count_threads(&proc.join("task")).map_err(err)?,
        turns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_this_process() {
        let s = sample(std::process::id(), 0.0, 0).unwrap();
        assert!(s.rss_bytes > 0 && s.anon_bytes > 0 && s.anon_bytes <= s.rss_bytes);
        assert!(s.fds >= 3 && s.threads >= 1);
    }

    #[test]
    fn a_missing_process_is_a_clear_error() {
        let e = sample(u32::MAX - 1, 0.0, 0).unwrap_err();
        assert!(e.to_string().contains("has the daemon exited"));
    }
}
