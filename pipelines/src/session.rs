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
        let mut map = self.inner.lock().expect("sessions lock");
        let entry = map.entry(id.to_string()).or_insert_with(|| (Instant::now(), Vec::new()));
        entry.0 = Instant::now();
        entry.1.push(user);
        entry.1.push(assistant);
        let excess = entry.1.len().saturating_sub(self.max_messages);
        entry.1.drain(..excess);
    }

    /// Drop the session's `n` oldest messages (turns the Thinker's context no longer holds).
    pub fn forget_oldest(&self, id: &str, n: usize) {
        if n == 0 {
            return;
        }
        if let Some((_, messages)) = self.inner.lock().expect("sessions lock").get_mut(id) {
            messages.drain(..n.min(messages.len()));
        }
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
}
