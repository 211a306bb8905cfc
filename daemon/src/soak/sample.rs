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
        threads: count_entries(&proc.join("task")).map_err(err)?,
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
