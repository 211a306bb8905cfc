//! The ledger: what each loaded role holds against the budget, and who must go for a new load.
//!
//! Admission policy (explicit): a load that does not fit first evicts idle roles — lowest
//! priority first, then least recently used — but never a role in use and never a role of higher
//! priority than the one loading (so the Thinker is never evicted for a lesser model). If it still
//! does not fit, it is refused with the list of what is resident and what is missing.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    pub role: String,
    /// Canonical file path: roles on one file share its weights.
    pub file: String,
    pub priority: u32,
    /// Bytes held against the budget (the estimate; the weights only for the first role of a file).
    pub reserved: u64,
    /// The weights part of `reserved` (0 when another role holds them).
    pub weights: u64,
    /// Weights of the file, for handing over when the holder leaves.
    #[serde(skip)]
    pub file_weights: u64,
    /// RSS growth measured when the role loaded.
    pub measured: Option<i64>,
    #[serde(skip)]
    pub last_used: Instant,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} needed for {role} but only {} of the {} budget are free after evicting every idle role of priority <= {priority}; resident: {resident}",
    crate::human_bytes(*.need), crate::human_bytes(*.free), crate::human_bytes(*.budget)
)]
pub struct Refusal {
    pub role: String,
    pub need: u64,
    pub free: u64,
    pub budget: u64,
    pub priority: u32,
    /// Human listing of the resident roles.
    pub resident: String,
    pub missing: u64,
}

#[derive(Debug, Clone)]
pub struct Ledger {
    pub budget: u64,
    entries: BTreeMap<String, Entry>,
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

impl Ledger {
    pub fn new(budget: u64) -> Ledger {
        Ledger { budget, entries: BTreeMap::new() }
    }

    pub fn used(&self) -> u64 {
        self.entries.values().map(|e| e.reserved).fold(0, u64::saturating_add)
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    pub fn get(&self, role: &str) -> Option<&Entry> {
        self.entries.get(role)
    }

    /// Whether the file's weights are already held by a resident role.
    pub fn holds_file(&self, file: &str) -> bool {
        self.entries.values().any(|e| e.file == file)
    }

    /// Which roles to evict, in order, so that `need` more bytes fit; or why it cannot fit.
    pub fn admit(
        &self,
        role: &str,
        need: u64,
        priority: u32,
        in_use: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, Refusal> {
        self.admit_as(role, |_| need, priority, in_use)
    }

    /// [`Ledger::admit`] for a load whose need depends on who stays resident: a model file's
    /// weights are counted unless a role still holds them (`need(ledger)` with the ledger as it
    /// would be after the victims so far). With a fixed need, evicting the last holder of the
    /// file being loaded freed its weights and counted them free, though the load needs them
    /// again: the idle guard was unloaded for a Thinker on its file, then the Thinker refused.
    pub fn admit_as(
        &self,
        role: &str,
        need: impl Fn(&Ledger) -> u64,
        priority: u32,
        in_use: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, Refusal> {
        let mut free = self.budget.saturating_sub(self.used());
        let mut victims: Vec<String> = Vec::new();
        let mut candidates: Vec<&Entry> =
            self.entries.values().filter(|e| e.role != role && e.priority <= priority && !in_use(&e.role)).collect();
        candidates.sort_by_key(|e| (e.priority, e.last_used));
        // What the victims free is what the ledger holds once they are gone, their weights
        // passing as `remove` passes them: counted role by role, the holder of shared weights
        // freed only its context (another role stayed on them), and the other role, holding
        // none, freed only its own, so the weights were never counted free (a false refusal).
        let mut after = self.clone();
        for c in candidates {
            if free >= need(&after) {
                break;
            }
            victims.push(c.role.clone());
            after.remove(&c.role);
            free = self.budget.saturating_sub(after.used());
        }
        let need = need(&after);
        if free >= need {
            return Ok(victims);
        }
        let mut resident = String::new();
        for e in self.entries.values() {
            let _ = write!(
                resident,
                "{}{} {:.1} MiB (priority {}{})",
                if resident.is_empty() { "" } else { ", " },
                e.role,
                mib(e.reserved),
                e.priority,
                if in_use(&e.role) { ", in use" } else { "" }
            );
        }
        if resident.is_empty() {
            resident.push_str("nothing");
        }
        Err(Refusal {
            role: role.to_string(),
            need,
            free,
            budget: self.budget,
            priority,
            resident,
            missing: need - free,
        })
    }

    /// Record a loaded role. `estimate_without_weights` + the file's weights unless a resident
    /// role already holds them.
    pub fn insert(
        &mut self,
        role: &str,
        file: &str,
        priority: u32,
        file_weights: u64,
        estimate_without_weights: u64,
        measured: Option<i64>,
    ) {
        let weights = if self.holds_file(file) { 0 } else { file_weights };
        self.entries.insert(
            role.to_string(),
            Entry {
                role: role.to_string(),
                file: file.to_string(),
                priority,
                reserved: estimate_without_weights.saturating_add(weights),
                weights,
                file_weights,
                measured,
                last_used: Instant::now(),
            },
        );
    }

    /// The RSS growth measured once a role's load finished (its entry was reserved before the
    /// load, so that a load running meanwhile sees the bytes as taken).
    pub fn set_measured(&mut self, role: &str, measured: Option<i64>) {
        if let Some(e) = self.entries.get_mut(role) {
            e.measured = measured;
        }
    }

    /// Forget a role; its weights pass to another role on the same file, if any.
    pub fn remove(&mut self, role: &str) {
        let Some(e) = self.entries.remove(role) else { return };
        if e.weights > 0 {
            if let Some(heir) = self.entries.values_mut().find(|o| o.file == e.file) {
                heir.weights = e.weights;
                heir.reserved = heir.reserved.saturating_add(e.weights);
            }
        }
    }

    pub fn touch(&mut self, role: &str) {
        if let Some(e) = self.entries.get_mut(role) {
            e.last_used = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> Ledger {
        let mut l = Ledger::new(1000);
        l.insert("thinker", "a.gguf", 100, 300, 100, None);
        std::thread::sleep(std::time::Duration::from_millis(2));
        l.insert("guard", "a.gguf", 90, 300, 50, None);
        std::thread::sleep(std::time::Duration::from_millis(2));
        l.insert("other", "b.gguf", 50, 200, 100, None);
        l
    }

    #[test]
    fn shared_weights_count_once_and_pass_on() {
        let mut l = ledger();
        assert_eq!(l.used(), 400 + 50 + 300);
        assert_eq!(l.get("guard").unwrap().weights, 0);
        l.remove("thinker");
        assert_eq!(l.get("guard").unwrap().reserved, 350);
        assert_eq!(l.used(), 350 + 300);
    }

    #[test]
    fn evicts_idle_lowest_priority_first_never_in_use_never_higher() {
        let l = ledger();
        // 250 free; 400 needed: the idle lowest-priority role goes.
        assert_eq!(l.admit("new", 400, 95, |_| false).unwrap(), vec!["other".to_string()]);
        // In use: never evicted; the next candidate is the guard (it frees only its context:
        // the thinker keeps the shared weights).
        assert_eq!(l.admit("new", 300, 95, |r| r == "other").unwrap(), vec!["guard".to_string()]);
        // A lower-priority load never evicts the Thinker.
        let r = l.admit("new", 700, 60, |_| false).unwrap_err();
        assert!(r.resident.contains("thinker 0.0 MiB (priority 100)") && r.missing > 0, "{r}");
        // Fits without evicting anything.
        assert!(l.admit("new", 200, 10, |_| false).unwrap().is_empty());
    }

    /// Both roles on one file going free its weights: the holder first (lower priority), then
    /// the role on the same file, which was counted as freeing only its context.
    #[test]
    fn evicting_every_role_of_a_file_frees_its_weights() {
        let mut l = Ledger::new(1000);
        l.insert("holder", "a.gguf", 10, 300, 100, None);
        l.insert("sharer", "a.gguf", 20, 300, 50, None);
        assert_eq!(l.used(), 450);
        assert_eq!(l.admit("new", 1000, 30, |_| false).unwrap(), ["holder", "sharer"]);
        // The holder alone frees its context only: the sharer stays on the weights.
        assert_eq!(l.admit("new", 650, 30, |r| r == "sharer").unwrap(), ["holder"]);
        let r = l.admit("new", 700, 30, |r| r == "sharer").unwrap_err();
        assert_eq!((r.free, r.missing), (650, 50), "{r}");
    }

    /// A load of a file whose only holder is a candidate: evicting that holder frees the weights
    /// the load needs again, so they are not counted free. It evicted the idle guard for a
    /// Thinker on the guard's file, then refused the Thinker all the same.
    #[test]
    fn evicting_the_holder_of_the_file_being_loaded_frees_nothing_for_it() {
        let mut l = Ledger::new(80);
        l.insert("x", "b.gguf", 10, 0, 20, None);
        l.insert("guard", "a.gguf", 10, 50, 5, None);
        // The Thinker on a.gguf: its context (12), plus the weights if nobody holds them.
        let need = |l: &Ledger| 12 + if l.holds_file("a.gguf") { 0 } else { 50 };
        let r = l.admit_as("thinker", need, 100, |r| r == "x").unwrap_err();
        assert_eq!((r.need, r.free, r.missing), (62, 60, 2), "{r}");
        // Once x may go, it goes, and the guard stays: the Thinker shares its weights.
        assert_eq!(l.admit_as("thinker", need, 100, |_| false).unwrap(), ["x"]);
        // A load of another file still frees the guard's weights and context.
        assert_eq!(l.admit_as("new", |_| 60, 100, |r| r == "x").unwrap(), ["guard"]);
    }

    #[test]
    fn impossible_loads_are_refused_with_the_listing() {
        let l = ledger();
        let r = l.admit("huge", 5000, 200, |r| r == "thinker").unwrap_err();
        assert!(r.resident.contains("thinker") && r.resident.contains("in use") && r.resident.contains("other"), "{r}");
        assert_eq!(r.missing, 5000 - r.free);
        assert!(r.to_string().contains("huge"));
    }
}
