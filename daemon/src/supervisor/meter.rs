//! A load's `measured_bytes`: the process's RSS growth across it, kept only when nothing else
//! changed the RSS meanwhile. RSS is one figure for the whole process, and the language models
//! (under `loading`) and the speech models (under `speech_loading`) load and unload under
//! different locks: a guard loading while the speech stack loaded reported the two growths
//! added, and the speech row the part of the guard's that came before its own end. A load
//! that overlapped another load or an unload now reports no figure (status: `measured_bytes`
//! absent) rather than a wrong one; the ledger's reservation never depended on it.

use std::sync::Mutex;

use kazeia_memory_budget::pressure;

/// This process's resident set size (VmRSS), bytes.
fn rss_bytes() -> Option<u64> {
    pressure::sample().ok().map(|s| s.rss)
}

/// Loads and unloads under way, and how many began since the process started.
#[derive(Debug, Default)]
pub struct LoadMeter {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    running: usize,
    began: u64,
}

/// One load or unload under way (see [`LoadMeter::begin`]): dropping it ends it.
#[derive(Debug)]
pub struct Measuring<'a> {
    meter: &'a LoadMeter,
    before: Option<u64>,
    /// `began` when this one began; another beginning after it changes it.
    began: u64,
    /// Nothing else was under way when this one began.
    alone: bool,
}

impl LoadMeter {
    /// A change of the process's memory begins: a load (read its growth with
    /// [`Measuring::growth`]) or an unload (kept only so that an overlapping load's figure is
    /// dropped).
    pub fn begin(&self) -> Measuring<'_> {
        let mut s = self.state.lock().expect("load meter");
        s.began += 1;
        let alone = s.running == 0;
        s.running += 1;
        let began = s.began;
        drop(s);
        Measuring { meter: self, before: rss_bytes(), began, alone }
    }
}

impl Measuring<'_> {
    /// The RSS growth since [`LoadMeter::begin`], or None when another load or unload ran at
    /// any moment in between (its growth or release would be counted as this one's).
    pub fn growth(&self) -> Option<i64> {
        let after = rss_bytes();
        let s = self.meter.state.lock().expect("load meter");
        // Read after `after`: one that began before the reading changed `began`.
        let alone = self.alone && s.began == self.began;
        drop(s);
        self.before.zip(after).filter(|_| alone).map(|(a, b)| b as i64 - a as i64)
    }
}

impl Drop for Measuring<'_> {
    fn drop(&mut self) {
        self.meter.state.lock().expect("load meter").running -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_only_for_a_load_nothing_overlapped() {
        let meter = LoadMeter::default();
        let a = meter.begin();
        assert!(a.growth().is_some(), "alone: measured");
        drop(a);

        // b begins while a runs: neither is measured, whichever ends first.
        let a = meter.begin();
        let b = meter.begin();
        assert!(b.growth().is_none());
        drop(b);
        assert!(a.growth().is_none(), "b began and ended during a");
        drop(a);

        // One that began alone, then another began: the first is not measured either.
        let a = meter.begin();
        let unload = meter.begin();
        drop(unload);
        assert!(a.growth().is_none());
        drop(a);

        // Once both ended, a load alone is measured again.
        let c = meter.begin();
        assert!(c.growth().is_some());
    }
}
