//! Memory pressure: how close the process and the system are to trouble.
//!
//! Android's lmkd kills processes under critical pressure; Linux's OOM killer does the same. The
//! daemon watches the system's available memory and its own RSS against its budget, sheds what
//! it can under low pressure, and refuses new turns under critical pressure rather than be killed.
//! Read from /proc (Linux and Android alike).

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Normal,
    /// Shed: idle sessions, idle lower-priority models.
    Low,
    /// Refuse new turns.
    Critical,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// MemAvailable of the system.
    pub available: u64,
    pub total: u64,
    /// This process's resident set.
    pub rss: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    /// System available memory under which pressure is low.
    pub low_available: u64,
    /// ... and critical.
    pub critical_available: u64,
    /// The engine's budget: RSS over 90% of it is low pressure, over it critical.
    pub budget: u64,
}

pub fn level(s: &Sample, w: &Watermarks) -> Level {
    if s.available < w.critical_available || s.rss > w.budget {
        Level::Critical
    } else if s.available < w.low_available || s.rss > w.budget / 10 * 9 {
        Level::Low
    } else {
        Level::Normal
    }
}

fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|k| k * 1024)
}

/// Read a sample from /proc.
pub fn sample() -> std::io::Result<Sample> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let status = std::fs::read_to_string("/proc/self/status")?;
    let bad = |what| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("no {what} in /proc"));
    Ok(Sample {
        available: kib_field(&meminfo, "MemAvailable:").ok_or_else(|| bad("MemAvailable"))?,
        total: kib_field(&meminfo, "MemTotal:").ok_or_else(|| bad("MemTotal"))?,
        rss: kib_field(&status, "VmRSS:").ok_or_else(|| bad("VmRSS"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels() {
        let w = Watermarks { low_available: 1000, critical_available: 500, budget: 10_000 };
        let s = |available, rss| Sample { available, total: 100_000, rss };
        assert_eq!(level(&s(5000, 100), &w), Level::Normal);
        assert_eq!(level(&s(900, 100), &w), Level::Low);
        assert_eq!(level(&s(5000, 9100), &w), Level::Low);
        assert_eq!(level(&s(400, 100), &w), Level::Critical);
        assert_eq!(level(&s(5000, 10_001), &w), Level::Critical);
    }

    #[test]
    fn reads_this_machine() {
        let s = sample().unwrap();
        assert!(s.total > 0 && s.available <= s.total && s.rss > 0, "{s:?}");
    }
}
