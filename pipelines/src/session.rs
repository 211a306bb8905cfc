//! Conversation state by session id: the messages of earlier turns. The engine's context keeps
//! their KV, so a session's next turn prefills only its new tokens. Idle sessions expire.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kazeia_engine::api::ChatMessage;

pub struct Sessions {
    ttl: Duration,
    max_messages: usize,
    inner: Mutex<HashMap<String, (Instant, Vec<ChatMessage>)>>,
}

impl Sessions {
    pub fn new(ttl: Duration) -> Sessions {
        Sessions { ttl, max_messages: 64, inner: Mutex::default() }
    }

    /// The session's messages so far (empty for a new or expired session).
    pub fn history(&self, id: &str) -> Vec<ChatMessage> {
        self.history_at(id, Instant::now())
    }

    /// [`Sessions::history`] as if the clock read `now`.
    fn history_at(&self, id: &str, now: Instant) -> Vec<ChatMessage> {
        let mut map = self.inner.lock().expect("sessions lock");
        map.retain(|_, (t, _)| now.saturating_duration_since(*t) < self.ttl);
        map.get(id).map(|(_, m)| m.clone()).unwrap_or_default()
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
        let entry = map.entry(id.to_string()).or_insert_with(|| (Instant::now(), Vec::new()));
        if !dropped.is_empty() && entry.1.starts_with(dropped) {
            entry.1.drain(..dropped.len());
        }
        entry.0 = Instant::now();
        entry.1.push(user);
        entry.1.push(assistant);
        let excess = entry.1.len().saturating_sub(self.max_messages);
        entry.1.drain(..excess);
    }

    /// Drop sessions idle for at least `idle` (memory pressure sheds these first).
    pub fn shed(&self, idle: Duration) -> usize {
        let mut map = self.inner.lock().expect("sessions lock");
        let before = map.len();
        let now = Instant::now();
        map.retain(|_, (t, _)| now.duration_since(*t) < idle);
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
}
