//! Conversation state by session id: the messages of earlier turns. The engine's context keeps
//! their KV, so a session's next turn prefills only its new tokens. Idle sessions expire.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kazeia_engine::api::ChatMessage;

pub struct Sessions {
    ttl: Duration,
    inner: Mutex<HashMap<String, Entry>>,
    /// Uses so far: the order sessions were last used in (instants can tie).
    uses: std::sync::atomic::AtomicU64,
}

/// One session: when and in which use it was last touched, and its messages.
struct Entry {
    at: Instant,
    used: u64,
    messages: Vec<ChatMessage>,
}

/// Sessions one owner keeps (an owner: what comes before a key's first U+001F, the daemon's
/// user id; the whole key without one): past it, a new one replaces that owner's least
/// recently used. Each new name made a session that lived `session_ttl` (30 min), as many as a
/// client cared to name: the daemon's memory, and every turn's scan of them under one lock.
pub const MAX_PER_OWNER: usize = 32;

/// Messages a session keeps (32 turns): past them its oldest half goes at once. One turn at a
/// time, from the 33rd on, every turn's prompt changed right after the system prompt and the
/// Thinker decoded the whole history again, each turn.
pub const MAX_MESSAGES: usize = 64;

fn owner(key: &str) -> &str {
    key.split('\u{1f}').next().unwrap_or(key)
}

impl Sessions {
    pub fn new(ttl: Duration) -> Sessions {
        Sessions { ttl, inner: Mutex::default(), uses: Default::default() }
    }

    /// The session's messages so far (empty for a new or expired session).
    pub fn history(&self, id: &str) -> Vec<ChatMessage> {
        self.history_at(id, Instant::now())
    }

    /// [`Sessions::history`] as if the clock read `now`.
    fn history_at(&self, id: &str, now: Instant) -> Vec<ChatMessage> {
        let mut map = self.inner.lock().expect("sessions lock");
        map.retain(|_, e| now.saturating_duration_since(e.at) < self.ttl);
        map.get(id).map(|e| e.messages.clone()).unwrap_or_default()
    }

    /// Record a finished turn.
    pub fn append(&self, id: &str, user: ChatMessage, assistant: ChatMessage) {
        self.append_after(id, &[], user, assistant);
    }

    /// Record a finished turn whose prompt left out `dropped`, the oldest turns it read (the
    /// Thinker's context no longer holds them): they go, if the session still starts with them,
    /// then the turn is appended, under one lock. Another turn of the session that ran beside
    /// this one may have dropped them already: then nothing more goes (counting them off again
    /// lost turns this one had read).
    pub fn append_after(&self, id: &str, dropped: &[ChatMessage], user: ChatMessage, assistant: ChatMessage) {
        let mut map = self.inner.lock().expect("sessions lock");
        if !map.contains_key(id) {
            let mine = map.iter().filter(|(k, _)| owner(k) == owner(id));
            if mine.clone().count() >= MAX_PER_OWNER {
                if let Some(k) = mine.min_by_key(|(_, e)| e.used).map(|(k, _)| k.clone()) {
                    map.remove(&k);
                }
            }
        }
        let used = self.uses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let e = map.entry(id.to_string()).or_insert_with(|| Entry { at: Instant::now(), used, messages: Vec::new() });
        if !dropped.is_empty() && e.messages.starts_with(dropped) {
            e.messages.drain(..dropped.len());
        }
        e.at = Instant::now();
        e.used = used;
        e.messages.push(user);
        e.messages.push(assistant);
        if e.messages.len() > MAX_MESSAGES {
            // Whole turns (user and assistant in pairs).
            let half = e.messages.len() / 2 / 2 * 2;
            e.messages.drain(..half);
        }
    }

    /// Take back the session's latest turn if it answered `user`: a spoken reply the user
    /// stopped (barge-in) after the Thinker had finished, and so after the turn was recorded,
    /// was kept whole, as if heard (one stopped while the Thinker wrote is never recorded).
    /// True when a turn was taken back.
    pub fn retract(&self, id: &str, user: &str) -> bool {
        let mut map = self.inner.lock().expect("sessions lock");
        let Some(e) = map.get_mut(id) else { return false };
        let n = e.messages.len();
        let latest =
            n >= 2 && e.messages[n - 2] == ChatMessage::new("user", user) && e.messages[n - 1].role == "assistant";
        if latest {
            e.messages.truncate(n - 2);
        }
        latest
    }

    /// Drop sessions idle for at least `idle` (memory pressure sheds these first).
    pub fn shed(&self, idle: Duration) -> usize {
        let mut map = self.inner.lock().expect("sessions lock");
        let before = map.len();
        let now = Instant::now();
        map.retain(|_, e| now.duration_since(e.at) < idle);
        before - map.len()
    }

    pub fn len(&self) -> usize {
        self.inner.lock().expect("sessions lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_expires() {
        // The clock is given, not slept on (a sleep races the TTL on a loaded machine).
        let s = Sessions::new(Duration::from_secs(60));
        s.append("a", ChatMessage::new("user", "hi"), ChatMessage::new("assistant", "hello"));
        let now = Instant::now();
        assert_eq!(s.history_at("a", now).len(), 2);
        assert_eq!(s.history_at("a", now + Duration::from_secs(30)).len(), 2);
        assert!(s.history_at("a", now + Duration::from_secs(61)).is_empty());
        assert!(s.is_empty());
    }

    /// An owner keeps at most `MAX_PER_OWNER` sessions, the most recently used; another
    /// owner's are not touched.
    #[test]
    fn an_owner_keeps_its_most_recent_sessions() {
        let m = |r: &str| ChatMessage::new(r, "x");
        let s = Sessions::new(Duration::from_secs(600));
        s.append("2\u{1f}other", m("user"), m("assistant"));
        for i in 0..MAX_PER_OWNER + 5 {
            s.append(&format!("1\u{1f}s{i}"), m("user"), m("assistant"));
            if i == 0 {
                // The first is used again later: it stays.
                continue;
            }
            if i == MAX_PER_OWNER / 2 {
                s.append("1\u{1f}s0", m("user"), m("assistant"));
            }
        }
        assert_eq!(s.len(), MAX_PER_OWNER + 1, "the owner's cap, and the other owner's one");
        assert_eq!(s.history("1\u{1f}s0").len(), 4, "used recently: kept");
        assert!(s.history("1\u{1f}s1").is_empty(), "the least recently used went");
        assert_eq!(s.history(&format!("1\u{1f}s{}", MAX_PER_OWNER + 4)).len(), 2);
        assert_eq!(s.history("2\u{1f}other").len(), 2);
    }

    /// A long session keeps at most `MAX_MESSAGES`, forgetting its oldest half at once: its
    /// start, which the Thinker's context holds, changes once in 16 turns, not at every turn.
    #[test]
    fn a_long_session_forgets_its_oldest_half_at_once() {
        let s = Sessions::new(Duration::from_secs(600));
        let mut firsts = Vec::new();
        for i in 0..60 {
            s.append("a", ChatMessage::new("user", format!("q{i}")), ChatMessage::new("assistant", format!("r{i}")));
            let h = s.history("a");
            assert!(h.len() <= MAX_MESSAGES && h.len().is_multiple_of(2), "{}", h.len());
            assert_eq!(h.last().unwrap().content, format!("r{i}"));
            if firsts.last() != Some(&h[0].content) {
                firsts.push(h[0].content.clone());
            }
        }
        assert_eq!(firsts, ["q0", "q16", "q32"]);
    }

    /// Turns dropped to fit go once, even when two turns of the session dropped them.
    #[test]
    fn dropped_turns_go_once() {
        let m = |r: &str, t: &str| ChatMessage::new(r, t);
        let s = Sessions::new(Duration::from_secs(60));
        for i in 0..3 {
            s.append("a", m("user", &format!("q{i}")), m("assistant", &format!("r{i}")));
        }
        let read = s.history("a");
        // Two turns ran side by side on the same six messages; each left out the first two.
        s.append_after("a", &read[..2], m("user", "q3"), m("assistant", "r3"));
        s.append_after("a", &read[..2], m("user", "q4"), m("assistant", "r4"));
        let texts: Vec<String> = s.history("a").into_iter().map(|c| c.content).collect();
        assert_eq!(texts, ["q1", "r1", "q2", "r2", "q3", "r3", "q4", "r4"]);
    }

    /// A turn taken back goes only if it is the session's latest, answering that question.
    #[test]
    fn a_retracted_turn_is_the_latest_one_only() {
        let m = |r: &str, t: &str| ChatMessage::new(r, t);
        let s = Sessions::new(Duration::from_secs(60));
        s.append("a", m("user", "q0"), m("assistant", "r0"));
        s.append("a", m("user", "q1"), m("assistant", "r1"));
        assert!(!s.retract("a", "q0"), "an older turn stays");
        assert!(!s.retract("b", "q1"), "another session is untouched");
        assert!(s.retract("a", "q1"));
        let texts: Vec<String> = s.history("a").into_iter().map(|c| c.content).collect();
        assert_eq!(texts, ["q0", "r0"]);
    }
}
