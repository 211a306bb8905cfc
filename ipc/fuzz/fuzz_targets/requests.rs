//! Client strings in every place a request carries one: random bytes (made UTF-8) become the
//! `id`, the `session`, the `role` or the `text` of a well-formed request of a random type, so
//! the parser's string validation is reached on every run (random whole frames almost never
//! parse as JSON). Whatever the parser returns, accepted or refused, never holds an id or a
//! session the protocol forbids (empty, over 128 bytes, control characters): those end up in
//! logs, events and once a thread name (a NUL panicked a worker).
#![no_main]

use kazeia_ipc::{parse_request, Request, MAX_ID_BYTES};
use libfuzzer_sys::fuzz_target;

fn allowed(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_ID_BYTES && !s.chars().any(char::is_control)
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let s = String::from_utf8_lossy(rest).into_owned();
    let ty = ["turn", "status", "cancel", "load", "unload", "subscribe", "hello", "dance"][pick as usize % 8];
    let mut req = serde_json::json!({ "type": ty, "id": "r1" });
    match (pick / 8) % 4 {
        0 => req["id"] = s.clone().into(),
        1 => {
            req["session"] = s.clone().into();
            req["text"] = "hi".into();
        }
        2 => req["role"] = s.clone().into(),
        _ => req["text"] = s.clone().into(),
    }
    let body = serde_json::to_vec(&req).expect("a JSON value encodes");
    match parse_request(&body) {
        Ok(r) => {
            assert!(r.id().is_none_or(allowed), "accepted id {:?}", r.id());
            if let Request::Turn { session: Some(name), .. } = &r {
                assert!(allowed(name), "accepted session {name:?}");
            }
        }
        Err(e) => assert!(e.id.as_deref().is_none_or(allowed), "echoed id {:?}", e.id),
    }
});
