//! The CPU's cores as a budget for decodes that run side by side (`exclusive_compute = false`):
//! a decode starts only when its role's threads fit in the cores no other decode holds, in
//! arrival order. Roles whose threads together fit the cores still decode in parallel.
//!
//! Why: a decode's threads wait for each other at every op's barrier, spinning. Threads beyond
//! the cores spin away the time slices the ones they wait for need. The Android build has no
//! OpenMP (llama-cpp-sys-2 turns it off there): ggml's own threads spin at barriers without
//! end, where libgomp would at least fall asleep. Here, built that way, with two 2-thread roles
//! on 2 cores decoding side by side, a guarded turn reached its first sentence after 1.7-8.0 s
//! instead of 0.46 s with the roles taking turns (tools/bench-cascade); the device set (a
//! Thinker of 8 threads, a Guard of 4, 8 cores) was the same case.
//!
//! Strict arrival order: a small request never passes a big one waiting, so a stream of guard
//! checks cannot starve the Thinker's decode of the cores it needs.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

pub struct Cores {
    total: usize,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    free: usize,
    /// Tickets of the requests waiting, oldest first.
    waiting: VecDeque<u64>,
    next: u64,
}

impl State {
    /// Whether `ticket`, needing `need` cores, may start now: it is the oldest waiting and its
    /// cores are free.
    fn admits(&self, ticket: u64, need: usize) -> bool {
        self.waiting.front() == Some(&ticket) && self.free >= need
    }
}

/// Cores held by one decode; given back when dropped.
pub struct CoreLease<'a> {
    cores: &'a Cores,
    n: usize,
}

impl Cores {
    pub fn new(total: usize) -> Cores {
        let total = total.max(1);
        Cores { total, state: Mutex::new(State { free: total, ..State::default() }), changed: Condvar::new() }
    }

    /// The machine's cores (the process's CPU affinity).
    pub fn of_this_machine() -> Cores {
        Cores::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// Wait for `threads` cores (at most all of them: a role with more threads than cores runs
    /// alone), in arrival order.
    pub fn take(&self, threads: usize) -> CoreLease<'_> {
        let need = threads.clamp(1, self.total);
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let ticket = s.next;
        s.next += 1;
        s.waiting.push_back(ticket);
        while !s.admits(ticket, need) {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.waiting.pop_front();
        s.free -= need;
        // The next in line may fit in what is left.
        self.changed.notify_all();
        CoreLease { cores: self, n: need }
    }

    /// Requests waiting for cores.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).waiting.len()
    }

    /// Cores no decode holds.
    #[cfg(test)]
    pub fn free(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).free
    }
}

impl Drop for CoreLease<'_> {
    fn drop(&mut self) {
        let mut s = self.cores.state.lock().unwrap_or_else(|p| p.into_inner());
        s.free += self.n;
        self.cores.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;

    #[test]
    fn the_oldest_request_goes_first_and_only_when_it_fits() {
        let s = State { free: 1, waiting: VecDeque::from([4, 5]), next: 6 };
        assert!(!s.admits(4, 2), "does not fit");
        assert!(!s.admits(5, 1), "fits, but 4 came first");
        assert!(s.admits(4, 1));
        let s = State { free: 2, waiting: VecDeque::from([5]), next: 6 };
        assert!(s.admits(5, 2));
    }

    #[test]
    fn roles_that_fit_decode_side_by_side() {
        let cores = Cores::new(4);
        let a = cores.take(2);
        let b = cores.take(2);
        assert_eq!(cores.free(), 0);
        drop(a);
        assert_eq!(cores.free(), 2);
        drop(b);
        // More threads than cores: the role takes them all and runs alone.
        let all = cores.take(16);
        assert_eq!(cores.free(), 0);
        drop(all);
        assert_eq!(cores.free(), 4);
    }

    /// A 2-core request waits for the cores; a 1-core request that came after it waits behind
    /// it even when one core is free.
    #[test]
    fn a_later_small_request_does_not_pass_a_waiting_big_one() {
        let cores = Arc::new(Cores::new(2));
        let order = Arc::new(Mutex::new(Vec::new()));
        let first = cores.take(1);
        let spawn = |name: &'static str, need: usize| {
            let (cores, order) = (cores.clone(), order.clone());
            let (release_tx, release_rx) = mpsc::channel::<()>();
            let (started_tx, started_rx) = mpsc::channel::<()>();
            let t = std::thread::spawn(move || {
                let lease = cores.take(need);
                order.lock().unwrap().push(name);
                started_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                drop(lease);
            });
            (t, release_tx, started_rx)
        };
        let (big, release_big, big_started) = spawn("big", 2);
        while cores.waiting() < 1 {
            std::thread::yield_now();
        }
        let (small, release_small, small_started) = spawn("small", 1);
        while cores.waiting() < 2 {
            std::thread::yield_now();
        }
        // One core is free, but the big request came first.
        assert_eq!((cores.free(), cores.waiting()), (1, 2));
        drop(first);
        big_started.recv().unwrap();
        // The big one holds both cores: the small one still waits.
        assert_eq!((cores.free(), cores.waiting()), (0, 1));
        release_big.send(()).unwrap();
        small_started.recv().unwrap();
        release_small.send(()).unwrap();
        big.join().unwrap();
        small.join().unwrap();
        assert_eq!(*order.lock().unwrap(), ["big", "small"]);
        assert_eq!((cores.free(), cores.waiting()), (2, 0));
    }
}
