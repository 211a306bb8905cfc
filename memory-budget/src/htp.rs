//! Split a model over HTP sessions. One Hexagon session maps at most `GGML_HEXAGON_VMEM`
//! (default 3,355,443,200 B on v75+) of weights, so a larger model is cut by layers into
//! contiguous ranges, one per session: the fewest sessions, then the most balanced ranges.
//!
//! Placement: the token embeddings stay on the CPU (llama.cpp reads them there, and they are the
//! largest single tensor of a big-vocabulary model), and so does any tensor of a type the HTP
//! cannot run (K-quants, e.g. a Q6_K output head); the output norm and head otherwise go with the
//! last layers, as llama.cpp places them when every layer is offloaded.

use std::ops::Range;

use serde::Serialize;

pub const DEFAULT_SESSION_CAP: u64 = 3_355_443_200;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Session {
    pub device: String,
    pub layers: Range<usize>,
    /// Includes the output head on the last session.
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HtpPlan {
    pub sessions: Vec<Session>,
    /// Value for `GGML_HEXAGON_DEVICES`: that many virtual sessions on NPU 0.
    pub devices_env: String,
    /// Bytes left on the CPU (token embeddings, tensors the HTP cannot run).
    pub cpu_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("layer {layer} alone needs {bytes} B, over the session cap of {cap} B")]
    LayerTooLarge { layer: usize, bytes: u64, cap: u64 },
    #[error("more than {0} HTP sessions would be needed")]
    TooManySessions(usize),
    #[error("the model has no layers")]
    Empty,
}

/// At most 16 sessions exist.
pub const MAX_SESSIONS: usize = 16;

/// Cut `layers` into at most `k` contiguous ranges whose largest sum is smallest (binary search
/// on that largest sum, greedy check: the classic linear partition). `tail` stays with the last
/// layer. Returns the ranges if every one fits `cap`.
fn split(layers: &[u64], tail: u64, k: usize, cap: u64) -> Option<Vec<Range<usize>>> {
    let mut units = layers.to_vec();
    *units.last_mut()? += tail;
    let greedy = |limit: u64| -> Option<Vec<Range<usize>>> {
        let mut ranges = Vec::new();
        let (mut start, mut sum) = (0, 0u64);
        for (i, &b) in units.iter().enumerate() {
            if b > limit {
                return None;
            }
            if sum + b > limit {
                ranges.push(start..i);
                start = i;
                sum = 0;
            }
            sum += b;
        }
        ranges.push(start..units.len());
        (ranges.len() <= k).then_some(ranges)
    };
    let total: u64 = units.iter().sum();
    let mut lo = units.iter().copied().max().unwrap_or(0).max(total.div_ceil(k as u64));
    let mut hi = cap;
    if lo > hi {
        return None;
    }
    let mut best = greedy(hi)?;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match greedy(mid) {
            Some(r) => {
                best = r;
                hi = mid;
            }
            None => lo = mid + 1,
        }
    }
    Some(best)
}

/// Plan the fewest sessions, then balance them.
pub fn plan(layers: &[u64], cpu_bytes: u64, output_bytes: u64, cap: u64) -> Result<HtpPlan, PlanError> {
    if layers.is_empty() {
        return Err(PlanError::Empty);
    }
    for (i, &b) in layers.iter().enumerate() {
        let b = if i + 1 == layers.len() { b + output_bytes } else { b };
        if b > cap {
            return Err(PlanError::LayerTooLarge { layer: i, bytes: b, cap });
        }
    }
    let total: u64 = layers.iter().sum::<u64>() + output_bytes;
    let first_k = total.div_ceil(cap).max(1) as usize;
    for k in first_k..=MAX_SESSIONS {
        if let Some(ranges) = split(layers, output_bytes, k, cap) {
            let n = ranges.len();
            let sessions: Vec<Session> = ranges
                .into_iter()
                .enumerate()
                .map(|(i, r)| {
                    let bytes = layers[r.clone()].iter().sum::<u64>() + if i + 1 == n { output_bytes } else { 0 };
                    Session { device: format!("HTP{i}"), layers: r, bytes }
                })
                .collect();
            let devices_env = (0..n).map(|i| format!("HTP0:{i}")).collect::<Vec<_>>().join(",");
            return Ok(HtpPlan { sessions, devices_env, cpu_bytes });
        }
    }
    Err(PlanError::TooManySessions(MAX_SESSIONS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn just_under_at_and_over_the_cap() {
        let cap = 1000;
        // Under: one session.
        let p = plan(&[300, 300, 300], 50, 99, cap).unwrap();
        assert_eq!(p.sessions.len(), 1);
        assert_eq!(p.sessions[0].bytes, 999);
        assert_eq!(p.devices_env, "HTP0:0");
        assert_eq!(p.cpu_bytes, 50);
        // Exactly at the cap: still one.
        assert_eq!(plan(&[300, 300, 300], 0, 100, cap).unwrap().sessions.len(), 1);
        // One byte over: two, contiguous, covering every layer, each under the cap.
        let p = plan(&[300, 300, 300], 0, 101, cap).unwrap();
        assert_eq!(p.sessions.len(), 2);
        assert_eq!(p.sessions[0].layers.start, 0);
        assert_eq!(p.sessions[0].layers.end, p.sessions[1].layers.start);
        assert_eq!(p.sessions[1].layers.end, 3);
        assert!(p.sessions.iter().all(|s| s.bytes <= cap));
        assert_eq!(p.devices_env, "HTP0:0,HTP0:1");
    }

    #[test]
    fn balanced_ranges() {
        let p = plan(&[100; 10], 0, 0, 600).unwrap();
        assert_eq!(p.sessions.iter().map(|s| s.layers.len()).collect::<Vec<_>>(), vec![5, 5]);
        let p = plan(&[100; 9], 0, 0, 400).unwrap();
        assert_eq!(p.sessions.len(), 3);
        assert!(p.sessions.iter().all(|s| s.layers.len() == 3), "{p:?}");
    }

    #[test]
    fn nine_b_shaped_needs_two_sessions() {
        // Qwen3.5-9B Q4_0: 32 layers of ~130 MB, a 572 MB output head, 572 MB embeddings.
        let layers = vec![130_000_000u64; 32];
        let p = plan(&layers, 572_000_000, 572_000_000, DEFAULT_SESSION_CAP).unwrap();
        assert_eq!(p.sessions.len(), 2);
        let (a, b) = (p.sessions[0].bytes, p.sessions[1].bytes);
        assert!(a.abs_diff(b) <= 130_000_000, "{a} vs {b}");
        assert_eq!(p.cpu_bytes, 572_000_000);
        // The 4B guard (~2.36 GB) fits one.
        assert_eq!(
            plan(&vec![60_000_000u64; 36], 300_000_000, 300_000_000, DEFAULT_SESSION_CAP).unwrap().sessions.len(),
            1
        );
    }

    #[test]
    fn impossible_plans_are_errors() {
        assert!(matches!(plan(&[2000], 0, 0, 1000), Err(PlanError::LayerTooLarge { layer: 0, .. })));
        assert!(matches!(plan(&[900; 20], 0, 0, 1000), Err(PlanError::TooManySessions(16))));
        assert_eq!(plan(&[], 0, 0, 1000), Err(PlanError::Empty));
    }
}
