//! The real daemon, driven only through its socket: answers, concurrency, cancel, disconnect,
//! bad input as raw bytes, the peer allow-list, stale sockets, busy, slow readers, SIGTERM.

use crate::common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{config, finish, Daemon};
use kazeia_ipc::{ClientError, ErrorCode, Event, Incoming, StopReason, TurnOptions};

const QUESTION: &str = "What is the capital of France? Answer in one short sentence.";
const LONG: &str = "Write a very long story about a dragon who learns to bake bread, with many chapters.";

fn long_opts() -> TurnOptions {
    TurnOptions { temperature: Some(0.9), seed: Some(7), max_tokens: Some(400), ..Default::default() }
}

// ---- raw frames, as an app written in another language would send them ----

fn write_frame(s: &mut UnixStream, kind: u8, body: &[u8]) {
    let mut f = ((body.len() + 1) as u32).to_be_bytes().to_vec();
    f.push(kind);
    f.extend_from_slice(body);
    s.write_all(&f).unwrap_or_else(|e| panic!("writing {:?}: {e}", String::from_utf8_lossy(body)));
}

/// Read one frame: (kind, body); None at EOF.
fn read_frame(s: &mut UnixStream) -> Option<(u8, Vec<u8>)> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    Some((body[0], body[1..].to_vec()))
}

#[track_caller]
fn read_json(s: &mut UnixStream) -> serde_json::Value {
    let (kind, body) = read_frame(s).expect("a frame");
    assert_eq!(kind, 1);
    serde_json::from_slice(&body).unwrap()
}

fn raw(d: &Daemon, hello: bool) -> UnixStream {
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    if hello {
        write_frame(&mut s, 1, br#"{"type":"hello","protocol":1,"client":"raw"}"#);
        assert_eq!(read_json(&mut s)["type"], "welcome");
    }
    s
}

fn is_eof(s: &mut UnixStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    read_frame(s).is_none()
}

// ---- tests ----

#[tokio::test(flavor = "multi_thread")]
async fn streamed_answer_and_socket_permissions() {
    let d = Daemon::start(&config(""));
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&d.socket), 0o600);
    assert_eq!(mode(d.socket.parent().unwrap()), 0o700);

    let c = d.client().await;
    let id = c.new_id();
    let mut rx =
        c.turn(&id, "chat", QUESTION, TurnOptions { temperature: Some(0.0), ..Default::default() }).await.unwrap();
    let first = match rx.recv().await.unwrap() {
        Incoming::Event(e) => e,
        other => panic!("{other:?}"),
    };
    assert_eq!(first, Event::Accepted { id: id.clone(), pipeline: "chat".into() });
    let (text, done) = finish(&mut rx).await;
    assert!(text.contains("Paris"), "{text}");
    match done {
        Event::Done { id: Some(did), stop, metrics } => {
            assert_eq!(did, id);
            assert_eq!(stop, StopReason::Eos);
            assert!(metrics.generated_tokens > 0 && metrics.ttft_ms > 0.0);
        }
        other => panic!("{other:?}"),
    }
    let st = c.status().await.unwrap();
    let thinker = st.models.iter().find(|m| m.role == "thinker").unwrap();
    assert_eq!(thinker.device.as_deref(), Some("cpu"));
    assert!(thinker.placement.as_deref().unwrap().contains("running on CPU"));
    // The client routes nothing for requests that ended: the turn's `done` came (its receiver
    // still held), each `status` was read once (a long-lived app polling it grew the table by
    // one route a call).
    for _ in 0..50 {
        c.status().await.unwrap();
    }
    assert_eq!(c.pending(), 0);
    drop(rx);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_concurrent_clients() {
    let d = Daemon::start(&config(""));
    let (a, b) = (d.client().await, d.client().await);
    let opts = TurnOptions { temperature: Some(0.0), ..Default::default() };
    let (ia, ib) = (a.new_id(), b.new_id());
    let mut ra = a.turn(&ia, "chat", QUESTION, opts.clone()).await.unwrap();
    let mut rb =
        b.turn(&ib, "chat", "What is the capital of Italy? Answer in one short sentence.", opts).await.unwrap();
    let ((ta, da), (tb, db)) = tokio::join!(finish(&mut ra), finish(&mut rb));
    assert!(matches!(da, Event::Done { .. }) && matches!(db, Event::Done { .. }), "{da:?} {db:?}");
    assert!(ta.contains("Paris"), "{ta}");
    assert!(tb.contains("Rome"), "{tb}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_mid_generation() {
    let d = Daemon::start(&config(""));
    let c = d.client().await;
    let id = c.new_id();
    let mut rx = c.turn(&id, "chat", LONG, long_opts()).await.unwrap();
    let mut tokens = 0;
    let done = loop {
        match rx.recv().await.unwrap() {
            Incoming::Event(Event::Token { .. }) => {
                tokens += 1;
                if tokens == 3 {
                    c.cancel(&id).await.unwrap();
                }
            }
            Incoming::Event(ev @ (Event::Done { .. } | Event::Error { .. })) => break ev,
            _ => {}
        }
    };
    // Cut short, and says so. (How soon after the daemon reads the cancel is checked in the
    // engine's tests with engine-side timestamps: within one token. Here the tokens already in
    // flight depend on how fast this client reads on a loaded machine, so they are not counted.)
    match done {
        Event::Done { stop: StopReason::Cancelled, metrics, .. } => {
            assert!(metrics.generated_tokens < 400, "{metrics:?}")
        }
        other => panic!("{other:?}"),
    }
    // Cancelling something that is not running is a clear error, about the cancel only (not
    // final: a turn that has just ended may have its `done` still to come).
    let mut rx = c.send(kazeia_ipc::Request::Cancel { id: "nope".into() }).await.unwrap();
    match rx.recv().await.unwrap() {
        Incoming::Event(Event::Error { code, is_final, .. }) => {
            assert_eq!((code, is_final), (ErrorCode::UnknownRequest, false))
        }
        other => panic!("{other:?}"),
    }
}

/// A cancel of a connection's own ended turn stays on that connection: it went on to the
/// same user's other connections, and stopped another app's turn that had the same id.
#[tokio::test(flavor = "multi_thread")]
async fn a_late_cancel_does_not_stop_another_apps_turn() {
    let guard = format!(
        "\n[[model]]\nrole = \"guard\"\nfile = \"{}\"\nn_ctx = 1024\nthreads = 1\nbackend = \"cpu\"\n\
         [model.sampling]\ntemperature = 0.0\nmax_tokens = 16\n[guard]\nformat = \"compact\"\n",
        common::smollm2().display()
    );
    let d = Daemon::start(&(config("") + &guard));
    let (a, b) = (d.client().await, d.client().await);
    let turn = |pipeline: &str, text: &str, options| kazeia_ipc::Request::Turn {
        id: "same".into(),
        pipeline: pipeline.into(),
        text: Some(text.into()),
        audio: None,
        session: None,
        options,
    };
    let mut long = b.send(turn("chat", LONG, long_opts())).await.unwrap();
    while !matches!(long.recv().await.unwrap(), Incoming::Event(Event::Token { .. })) {}
    // A's turn under the same id (the guard alone: the Thinker is busy with B's), to its end.
    let mut short = a.send(turn("guard", "What is the capital of France?", TurnOptions::default())).await.unwrap();
    assert!(matches!(finish(&mut short).await.1, Event::Done { .. }));
    // A's stop button, just too late. No answer, and the status behind it is answered after it.
    let mut late = a.send(kazeia_ipc::Request::Cancel { id: "same".into() }).await.unwrap();
    a.status().await.unwrap();
    assert!(late.try_recv().is_err(), "{:?}", late.try_recv());
    match finish(&mut long).await.1 {
        Event::Done { stop, metrics, .. } => assert_eq!(stop, StopReason::Length, "{metrics:?}"),
        other => panic!("{other:?}"),
    }
    // A connection that never had the id still reaches the user's other turns (`kazeia cancel`).
    let mut again = b.send(turn("chat", LONG, long_opts())).await.unwrap();
    while !matches!(again.recv().await.unwrap(), Incoming::Event(Event::Token { .. })) {}
    let other = d.client().await;
    other.cancel("same").await.unwrap();
    assert!(matches!(finish(&mut again).await.1, Event::Done { stop: StopReason::Cancelled, .. }));
}

#[tokio::test(flavor = "multi_thread")]
async fn disconnect_mid_generation_frees_the_model() {
    let d = Daemon::start(&config(""));
    let id;
    {
        let a = d.client().await;
        id = a.new_id();
        let mut rx = a.turn(&id, "chat", LONG, long_opts()).await.unwrap();
        let mut n = 0;
        while n < 3 {
            if let Some(Incoming::Event(Event::Token { .. })) = rx.recv().await {
                n += 1;
            }
        }
        // `a` and its connection go away mid-generation.
    }
    // The daemon notices, cancels the turn and says so: cut short, not run to its 400 tokens.
    tokio::task::block_in_place(|| d.wait_log(&format!("id={id:?}")));
    let line = d.log().lines().find(|l| l.contains(&format!("id={id:?}"))).unwrap().to_string();
    assert!(line.contains("turn ended") && line.contains("stop=\"cancelled\""), "{line}");
    let generated: u32 =
        line.split("generated=").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|n| n.parse().ok()).unwrap();
    assert!(generated < 400, "{line}");

    // The next client's turn runs on the freed model.
    let b = d.client().await;
    let mut rx = b
        .turn(&b.new_id(), "chat", QUESTION, TurnOptions { temperature: Some(0.0), ..Default::default() })
        .await
        .unwrap();
    let (text, done) = finish(&mut rx).await;
    assert!(matches!(done, Event::Done { .. }), "{done:?}");
    assert!(text.contains("Paris"));
    let mut st = common::settled(&b).await;
    // a's connection is gone too (its handler ends after its turn's log line).
    let t = Instant::now();
    while st.connections != 1 {
        assert!(t.elapsed() < common::HANG, "{st:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        st = b.status().await.unwrap();
    }
    let thinker = st.models.iter().find(|m| m.role == "thinker").unwrap();
    // Every token the engine made is accounted for: the abandoned turn's and b's.
    let Event::Done { metrics, .. } = done else { unreachable!() };
    assert_eq!(thinker.generated_tokens, u64::from(generated + metrics.generated_tokens), "{thinker:?}");
}

#[test]
fn bad_input_gets_error_codes_and_others_are_unaffected() {
    let d = Daemon::start(&config("max_frame = 65536"));
    let mut bystander = raw(&d, true);

    // Before hello.
    let mut s = raw(&d, false);
    write_frame(&mut s, 1, br#"{"type":"status","id":"1"}"#);
    assert_eq!(read_json(&mut s)["code"], "handshake_required");
    assert!(is_eof(&mut s));

    // A first frame that is not even JSON: still "not hello".
    let mut s = raw(&d, false);
    write_frame(&mut s, 1, b"{not json");
    assert_eq!(read_json(&mut s)["code"], "handshake_required");
    assert!(is_eof(&mut s));

    // Wrong protocol version.
    let mut s = raw(&d, false);
    write_frame(&mut s, 1, br#"{"type":"hello","protocol":99}"#);
    let e = read_json(&mut s);
    assert_eq!(e["code"], "protocol_version", "{e}");
    assert!(is_eof(&mut s));

    // After hello: each bad frame gets an error, and the connection goes on.
    let mut s = raw(&d, true);
    write_frame(&mut s, 1, b"{not json");
    assert_eq!(read_json(&mut s)["code"], "bad_json");
    write_frame(&mut s, 1, br#"{"type":"dance","id":"d1"}"#);
    let e = read_json(&mut s);
    assert_eq!((e["code"].as_str(), e["id"].as_str()), (Some("unknown_type"), Some("d1")));
    write_frame(&mut s, 1, br#"{"type":"turn","id":"t1","text":42}"#);
    assert_eq!(read_json(&mut s)["code"], "bad_request");
    write_frame(&mut s, 1, br#"{"type":"turn","id":"t2","pipeline":"nope","text":"hi"}"#);
    assert_eq!(read_json(&mut s)["code"], "pipeline");
    // A rate no microphone has: every frame was 0 samples at 16 kHz, a turn that never heard.
    for rate in [7_999u32, 384_001, u32::MAX] {
        let turn = serde_json::json!({"type":"turn","id":"r1","pipeline":"transcribe","audio":{"sample_rate":rate,"channels":1}});
        write_frame(&mut s, 1, turn.to_string().as_bytes());
        let e = read_json(&mut s);
        assert_eq!((e["code"].as_str(), e["final"].as_bool()), (Some("bad_request"), Some(true)), "{e}");
    }
    write_frame(&mut s, 9, b"???");
    assert_eq!(read_json(&mut s)["code"], "bad_frame");
    // Audio for a request that does not exist: id "zz", 16 kHz mono, two samples.
    let mut audio = vec![0u8, 2, b'z', b'z'];
    audio.extend_from_slice(&16000u32.to_be_bytes());
    audio.extend_from_slice(&[1, 0, 1, 0, 2, 0]);
    write_frame(&mut s, 2, &audio);
    let e = read_json(&mut s);
    assert_eq!((e["code"].as_str(), e["id"].as_str()), (Some("no_audio_request"), Some("zz")));
    write_frame(&mut s, 1, br#"{"type":"status","id":"s1"}"#);
    assert_eq!(read_json(&mut s)["type"], "status");
    // Not an object; ids with a NUL or too long: codes, no echo of the bad id, and on it goes.
    write_frame(&mut s, 1, b"[1,2]");
    assert_eq!(read_json(&mut s)["code"], "bad_json");
    write_frame(&mut s, 1, br#"{"type":"status","id":"a\u0000b"}"#);
    let e = read_json(&mut s);
    assert_eq!((e["code"].as_str(), e.get("id")), (Some("bad_request"), None), "{e}");
    let long = serde_json::json!({"type":"transcribe","id":"x".repeat(200)}).to_string();
    write_frame(&mut s, 1, long.as_bytes());
    assert_eq!(read_json(&mut s)["code"], "bad_request");
    write_frame(&mut s, 1, br#"{"type":"status","id":"s2"}"#);
    assert_eq!(read_json(&mut s)["type"], "status");
    // Errors that quote what was sent (a type, a pipeline, a field's value): 30000 backslashes,
    // quoted with `{:?}` and escaped again by JSON, made a 120 KB error over the 64 KiB limit,
    // and the connection went deaf to the errors and the replies after it.
    let slashes = "\\".repeat(30_000);
    for (body, code) in [
        (serde_json::json!({"type": slashes, "id": "q1"}), "unknown_type"),
        (serde_json::json!({"type": "turn", "id": "q2", "pipeline": slashes, "text": "hi"}), "pipeline"),
        (
            serde_json::json!({"type": "turn", "id": "q3", "text": "hi", "options": {"temperature": slashes}}),
            "bad_request",
        ),
    ] {
        let body = body.to_string();
        assert!(body.len() < 65536, "{} bytes", body.len());
        write_frame(&mut s, 1, body.as_bytes());
        let e = read_json(&mut s);
        assert_eq!(e["code"], code, "{e}");
        let message = serde_json::to_string(&e["message"]).unwrap();
        assert!(message.len() - 2 <= kazeia_ipc::MAX_MESSAGE, "{e}");
        write_frame(&mut s, 1, br#"{"type":"status","id":"s3"}"#);
        assert_eq!(read_json(&mut s)["type"], "status");
    }

    // A frame over the limit: an error, then the connection closes (the stream is out of step).
    s.write_all(&100_000u32.to_be_bytes()).unwrap();
    // The daemon may already have closed: the rest of this frame is allowed to fail.
    let _ = s.write_all(&[1u8; 64]);
    assert_eq!(read_json(&mut s)["code"], "frame_too_large");
    assert!(is_eof(&mut s));

    // The daemon still serves everyone else.
    write_frame(&mut bystander, 1, br#"{"type":"status","id":"s2"}"#);
    let st = read_json(&mut bystander);
    assert_eq!(st["type"], "status");
    assert!(d.log().find("panicked").is_none(), "{}", d.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_peer() {
    // The test runs as some uid; allow only another one.
    let me = unsafe { libc::geteuid() };
    let d = Daemon::start(&config(&format!("allow_uids = [{}]", me + 4242)));
    match kazeia_ipc::Client::connect(&d.socket, "test").await {
        Err(ClientError::Refused { code, message }) => {
            assert_eq!(code, ErrorCode::PermissionDenied);
            assert!(message.contains(&me.to_string()), "{message}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a refused peer was let in"),
    }
    // Logged before the refusal is sent, but read from the daemon's stderr by another thread.
    d.wait_log("refused a peer");
}

#[tokio::test(flavor = "multi_thread")]
async fn full_queue_answers_busy_at_once() {
    let d = Daemon::start(&config("queue_per_model = 1"));
    let c = d.client().await;
    // One running + one queued fill the role; the rest must be refused straight away. A turn is
    // counted from its `accepted` on (before it has queued any work), and the connection reads
    // requests in order: once both are accepted, the third meets a full role.
    let mut rxs = Vec::new();
    for _ in 0..2 {
        let mut rx = c.turn(&c.new_id(), "chat", LONG, long_opts()).await.unwrap();
        assert!(matches!(rx.recv().await, Some(Incoming::Event(Event::Accepted { .. }))));
        rxs.push(rx);
    }
    let mut rx = c.turn(&c.new_id(), "chat", "hi", TurnOptions::default()).await.unwrap();
    match rx.recv().await.unwrap() {
        Incoming::Event(Event::Error { code, .. }) => assert_eq!(code, ErrorCode::Busy),
        other => panic!("expected busy, got {other:?}"),
    }
    // "At once": before the queued turn has produced anything, so it did not wait for a slot.
    let queued = &mut rxs[1];
    while let Ok(item) = queued.try_recv() {
        assert!(
            !matches!(item, Incoming::Event(Event::Token { .. } | Event::Done { .. })),
            "busy came after the queued turn ran: {item:?}"
        );
    }
    let st = c.status().await.unwrap();
    assert_eq!(st.models[0].turns, 2, "{:?}", st.models[0]);
    for mut rx in rxs {
        let (_, done) = finish(&mut rx).await;
        assert!(matches!(done, Event::Done { .. }), "{done:?}");
    }
    // The leases went with the turns: the role takes turns again.
    let mut rx = c
        .turn(&c.new_id(), "chat", QUESTION, TurnOptions { temperature: Some(0.0), ..Default::default() })
        .await
        .unwrap();
    assert!(finish(&mut rx).await.0.contains("Paris"));
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_reader_is_disconnected_and_its_turn_cancelled() {
    let d = Daemon::start(&config("connection_buffer = 4\nsocket_send_buffer = 4096"));
    let mut s = raw(&d, true);
    // A write the daemon never reads must fail this test, not hang it.
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let turn = serde_json::json!({"type":"turn","id":"slow","pipeline":"chat","text":LONG,"options":{"max_tokens":400,"temperature":0.9,"seed":7}});
    write_frame(&mut s, 1, turn.to_string().as_bytes());
    // Never read. The daemon must drop us rather than stall, and stop our turn.
    let c = d.client().await;
    let t = Instant::now();
    loop {
        let st = c.status().await.unwrap();
        if st.connections == 1 && st.turns_running == 0 && d.log().contains("reads too slowly") {
            break;
        }
        assert!(t.elapsed() < common::HANG, "slow reader still connected: {st:?}\n{}", d.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Meanwhile the engine keeps serving others.
    let mut rx = c
        .turn(&c.new_id(), "chat", QUESTION, TurnOptions { temperature: Some(0.0), ..Default::default() })
        .await
        .unwrap();
    assert!(finish(&mut rx).await.0.contains("Paris"));
    // And the daemon let go of the socket: a writer blocked on it once held it open for good
    // (uncounted: the uid could open as many again, up to the daemon's file descriptors). Once
    // the daemon's end is closed, our writes fail; until then they land in its buffer.
    let status = br#"{"type":"status","id":"late"}"#;
    let t = Instant::now();
    loop {
        let mut f = ((status.len() + 1) as u32).to_be_bytes().to_vec();
        f.push(1);
        f.extend_from_slice(status);
        match s.write_all(&f) {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset) => break,
            Err(e) => panic!("writing to the dropped connection: {e}"),
        }
        assert!(t.elapsed() < common::HANG, "the daemon still holds the slow reader's socket open\n{}", d.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn stale_socket_is_replaced_and_live_socket_is_kept() {
    let mut d = Daemon::start(&config(""));
    // A second daemon on the same socket refuses to start and leaves the first alone.
    let cfg = d.dir.path().join("models.toml");
    let (mut second, log) = common::spawn(&cfg, &d.socket);
    let code = second.wait().unwrap().code();
    assert_eq!(code, Some(1));
    // Its stderr is read by another thread: the line may trail the exit by a moment.
    let said = || log.lock().unwrap().clone();
    common::wait_until("\"already serving\" from the second daemon", || said().contains("already serving"), said);
    let mut s = raw(&d, true);
    write_frame(&mut s, 1, br#"{"type":"status","id":"1"}"#);
    assert_eq!(read_json(&mut s)["type"], "status");

    // SIGKILL leaves the socket file behind; a new daemon replaces it.
    d.signal(libc::SIGKILL);
    d.wait(Duration::from_secs(5)).map(|_| ()).unwrap_or(());
    let _ = d.child.wait();
    assert!(d.socket.exists(), "the killed daemon's socket should still be there");
    let dir = std::mem::replace(&mut d.dir, tempfile::tempdir().unwrap());
    let text = std::fs::read_to_string(dir.path().join("models.toml")).unwrap();
    let serial = d.take_serial();
    let d2 = Daemon::start_in(serial, dir, &text);
    assert!(d2.log().contains("stale socket"), "{}", d2.log());
    let mut s = raw(&d2, true);
    write_frame(&mut s, 1, br#"{"type":"status","id":"2"}"#);
    assert_eq!(read_json(&mut s)["type"], "status");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_a_turn() {
    let mut d = Daemon::start(&config("shutdown_grace = \"1s\""));
    let c = d.client().await;
    let id = c.new_id();
    let mut rx = c.turn(&id, "chat", LONG, TurnOptions { max_tokens: Some(2000), ..long_opts() }).await.unwrap();
    while !matches!(rx.recv().await, Some(Incoming::Event(Event::Token { .. }))) {}
    d.signal(libc::SIGTERM);
    // New turns on an open connection are refused while the running turn gets its grace time
    // (the daemon logs this once it refuses new turns).
    tokio::task::block_in_place(|| d.wait_log("SIGTERM: shutting down"));
    let mut refused = c.turn(&c.new_id(), "chat", "hi", TurnOptions::default()).await.unwrap();
    match refused.recv().await {
        Some(Incoming::Event(Event::Error { code, .. })) => assert_eq!(code, ErrorCode::ShuttingDown),
        other => panic!("expected shutting_down, got {other:?}"),
    }
    // So is a load: the models are about to be unloaded, and it held the shutdown.
    let load = kazeia_ipc::Request::Load { id: c.new_id(), role: "thinker".into() };
    match c.send(load).await.unwrap().recv().await {
        Some(Incoming::Event(Event::Error { code, .. })) => assert_eq!(code, ErrorCode::ShuttingDown),
        other => panic!("expected shutting_down for a load, got {other:?}"),
    }
    // The long turn cannot finish in the 1 s grace: it is cancelled, and says so.
    let (_, done) = finish(&mut rx).await;
    assert!(matches!(done, Event::Done { stop: StopReason::Cancelled, .. }), "{done:?}");
    let code = tokio::task::block_in_place(|| {
        let code = d.wait(common::HANG);
        (code, d.socket.exists(), d.log())
    });
    assert_eq!(code.0, Some(0), "{}", code.2);
    assert!(!code.1, "socket file was left behind");
}

/// A daemon started while another drains its last turn (SIGTERM, grace time) takes the socket
/// path (the old listener is gone: `ECONNREFUSED`, a stale socket); the old one, once stopped,
/// leaves the new one's socket in place. It removed the path at its end: the new daemon ran on,
/// reachable by no one.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopping_daemon_leaves_its_successors_socket() {
    let text = crate::voice::config_text().replace("[daemon]\n", "[daemon]\nshutdown_grace = \"60s\"\n");
    let mut old = Daemon::start(&text);
    let c = old.client().await;
    // An audio turn with no audio yet runs until its audio comes (or `audio_idle`, 30 s).
    let id = c.new_id();
    let audio = Some(kazeia_ipc::AudioSpec { sample_rate: 16_000, channels: 1 });
    let turn = kazeia_ipc::Request::Turn {
        id: id.clone(),
        pipeline: "transcribe".into(),
        text: None,
        audio,
        session: None,
        options: TurnOptions::default(),
    };
    let mut rx = c.send(turn).await.unwrap();
    assert!(matches!(rx.recv().await, Some(Incoming::Event(Event::Accepted { .. }))));
    old.signal(libc::SIGTERM);
    tokio::task::block_in_place(|| old.wait_log("SIGTERM: shutting down"));
    let (child, log) = common::spawn(&old.dir.path().join("models.toml"), &old.socket);
    let _new = common::Reaped(child);
    let log = || log.lock().unwrap().clone();
    tokio::task::block_in_place(|| {
        common::wait_until("the new daemon listening", || log().contains("kazeia: listening on"), log)
    });
    // The old daemon's last turn ends with its connection; then it stops.
    drop(rx);
    drop(c);
    let (code, old_log) = tokio::task::block_in_place(|| (old.wait(common::HANG), old.log()));
    assert_eq!(code, Some(0), "{old_log}");
    assert!(old.socket.exists(), "the stopped daemon removed its successor's socket: {old_log}");
    let c = kazeia_ipc::Client::connect(&old.socket, "test").await.expect("the new daemon serves");
    assert!(c.status().await.is_ok());
}

/// What the daemon refuses without echoing the id (a bad `id` or `session`) is refused by the
/// client, with the daemon's code: the daemon's error named no request, so the request's
/// receiver waited for good. So is an id still running on this client (its route was replaced,
/// the running turn's receiver closed, while the daemon goes on with it).
#[tokio::test(flavor = "multi_thread")]
async fn the_client_refuses_what_the_daemon_could_not_answer_to_it() {
    let d = Daemon::start(&config(""));
    let c = d.client().await;
    let long = "x".repeat(129);
    for (id, session) in [("", None), (long.as_str(), None), ("a\tb", None), ("ok", Some("")), ("ok", Some("a\nb"))] {
        let req = kazeia_ipc::Request::Turn {
            id: id.into(),
            pipeline: "chat".into(),
            text: Some("hi".into()),
            audio: None,
            session: session.map(str::to_string),
            options: TurnOptions::default(),
        };
        match c.send(req).await {
            Err(ClientError::Refused { code: ErrorCode::BadRequest, .. }) => {}
            other => panic!("{id:?} {session:?}: {other:?}"),
        }
    }
    assert!(matches!(c.cancel("").await, Err(ClientError::Refused { code: ErrorCode::BadRequest, .. })));
    let id = c.new_id();
    let mut rx = c.turn(&id, "chat", QUESTION, TurnOptions::default()).await.unwrap();
    match c.turn(&id, "chat", "hi", TurnOptions::default()).await {
        Err(ClientError::Refused { code: ErrorCode::DuplicateId, .. }) => {}
        other => panic!("a running id sent again: {other:?}"),
    }
    // A cancel names a running request: it is sent, and the turn keeps its events to its end.
    c.send(kazeia_ipc::Request::Cancel { id: id.clone() }).await.expect("a cancel of a running turn is sent");
    let (_, done) = finish(&mut rx).await;
    assert!(
        matches!(done, Event::Done { stop: StopReason::Cancelled, .. }),
        "the running turn kept its events: {done:?}"
    );
    assert!(c.status().await.is_ok());
    match kazeia_ipc::Client::connect(&d.socket, "bad\nname").await {
        Err(ClientError::Refused { code: ErrorCode::BadRequest, .. }) => {}
        other => panic!("a client name no id can be made of: {:?}", other.err()),
    }
}

/// A turn cancelled while its model loads ends then (`done` `cancelled`), not once the load
/// (and every load queued before it) is over; the load goes on to its end on its own. The turn
/// is cancelled as it is sent: its `done` comes while its Thinker (Gemma 3 270M, ~250 MB) is
/// still loading.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_cancelled_while_its_model_loads_ends_at_once() {
    // (No preload: the turn's load, not the daemon's own at start.)
    let text = config("preload = false")
        .replace(&common::smollm2().display().to_string(), &common::gemma3().display().to_string());
    let d = Daemon::start(&text);
    let c = d.client().await;
    let id = c.new_id();
    let mut rx = c.turn(&id, "chat", QUESTION, TurnOptions::default()).await.unwrap();
    c.cancel(&id).await.unwrap();
    let (_, done) = finish(&mut rx).await;
    assert!(matches!(done, Event::Done { stop: StopReason::Cancelled, .. }), "{done:?}");
    let thinker = |s: &kazeia_ipc::StatusReport| s.models.iter().find(|m| m.role == "thinker").unwrap().state;
    let state = thinker(&c.status().await.unwrap());
    assert_ne!(state, kazeia_ipc::ModelState::Loaded, "the turn ended only after its model's load");
    // The load ends on its own, and the daemon serves on.
    let mut rx = c.turn(&c.new_id(), "chat", QUESTION, TurnOptions::default()).await.unwrap();
    let (_, done) = finish(&mut rx).await;
    assert!(matches!(done, Event::Done { stop: StopReason::Eos | StopReason::Length, .. }), "{done:?}");
    assert_eq!(thinker(&c.status().await.unwrap()), kazeia_ipc::ModelState::Loaded);
}

#[test]
fn systemd_socket_activation() {
    use std::os::unix::io::AsRawFd;
    let d = Daemon::start(&config(""));
    // A socket bound by "systemd" (us), handed over as fd 3 with LISTEN_PID/LISTEN_FDS.
    let path = d.dir.path().join("activated.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let fd = listener.as_raw_fd();
    let cfg = d.dir.path().join("models.toml");
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        "export LISTEN_PID=$$ LISTEN_FDS=1; exec \"$0\" serve --config \"$1\"",
        env!("CARGO_BIN_EXE_kazeia"),
        cfg.to_str().unwrap(),
    ]);
    cmd.stderr(std::process::Stdio::piped());
    hand_over(&mut cmd, fd, 3);
    let mut child = common::Reaped(cmd.spawn().unwrap());
    let log = common::collect_lines(child.stderr.take().unwrap());
    drop(listener);
    serves_then_stops(child, &path);
    // The readiness line does not name a path the daemon does not serve (the default one). The
    // log is read by another thread: wait for the line, never read once and conclude.
    let needle = "kazeia: listening on the socket handed over by the service manager";
    common::wait_until("the readiness line", || log.lock().unwrap().contains(needle), || log.lock().unwrap().clone());
    assert!(!log.lock().unwrap().contains("engine.sock"), "{}", log.lock().unwrap());
}

/// In the child, before exec: `fd` becomes `target`, inheritable. When the listener already is
/// `target` (whatever number the test process happens to be at), dup2 onto itself does nothing
/// and would leave close-on-exec set: clear the flag instead.
fn hand_over(cmd: &mut std::process::Command, fd: i32, target: i32) {
    use std::os::unix::process::CommandExt;
    // SAFETY: dup2 and fcntl are async-signal-safe; no allocation happens in the closure.
    unsafe {
        cmd.pre_exec(move || {
            let r = if fd == target { libc::fcntl(target, libc::F_SETFD, 0) } else { libc::dup2(fd, target) };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A daemon serving on a socket it was handed: it answers, exits 0 on SIGTERM, and leaves the
/// socket to its owner (systemd, init).
fn serves_then_stops(mut child: common::Reaped, path: &std::path::Path) {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write_frame(&mut s, 1, br#"{"type":"hello","protocol":1}"#);
    assert_eq!(read_json(&mut s)["type"], "welcome");
    write_frame(&mut s, 1, br#"{"type":"status","id":"1"}"#);
    assert_eq!(read_json(&mut s)["type"], "status");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(path.exists(), "the socket belongs to the supervisor that made it");
}

/// Android's init creates the `socket` of the service's .rc (dist/android/kazeia.rc) and passes
/// its fd in `ANDROID_SOCKET_kazeia`; the daemon serves on it as on systemd's.
#[test]
fn android_init_socket() {
    use std::os::unix::io::AsRawFd;
    let d = Daemon::start(&config(""));
    let path = d.dir.path().join("android.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let fd = listener.as_raw_fd();
    let cfg = d.dir.path().join("models.toml");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kazeia"));
    cmd.args(["serve", "--config", cfg.to_str().unwrap()])
        .env("ANDROID_SOCKET_kazeia", "9")
        .stderr(std::process::Stdio::null());
    hand_over(&mut cmd, fd, 9);
    let child = common::Reaped(cmd.spawn().unwrap());
    drop(listener);
    serves_then_stops(child, &path);
}

#[tokio::test(flavor = "multi_thread")]
async fn load_unload_and_subscribe() {
    let d = Daemon::start(&config("preload = false"));
    let c = d.client().await;
    // A subscriber sees every change.
    let sub = c.new_id();
    let mut subs = c.send(kazeia_ipc::Request::Subscribe { id: sub.clone() }).await.unwrap();
    let state = |ev: Incoming| match ev {
        Incoming::Event(Event::Status { status, .. }) => {
            status.models.iter().find(|m| m.role == "thinker").unwrap().state
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(state(subs.recv().await.unwrap()), kazeia_ipc::ModelState::Unloaded);

    let mut rx = c.send(kazeia_ipc::Request::Load { id: c.new_id(), role: "thinker".into() }).await.unwrap();
    let mut progress = 0;
    loop {
        match rx.recv().await.unwrap() {
            Incoming::Event(Event::LoadProgress { progress: p, .. }) => {
                assert!((0.0..=1.0).contains(&p));
                progress += 1;
            }
            Incoming::Event(Event::Loaded { role, .. }) => break assert_eq!(role, "thinker"),
            other => panic!("{other:?}"),
        }
    }
    assert!(progress > 0);
    // The subscriber hears the load through to its end: loading first, then loaded.
    let mut seen = vec![];
    while seen.last() != Some(&kazeia_ipc::ModelState::Loaded) {
        let ev = tokio::time::timeout(common::HANG, subs.recv()).await.expect("a status change").expect("open");
        seen.push(state(ev));
    }
    assert!(seen.contains(&kazeia_ipc::ModelState::Loading), "{seen:?}");

    let mut rx = c.send(kazeia_ipc::Request::Unload { id: c.new_id(), role: "thinker".into() }).await.unwrap();
    assert!(matches!(rx.recv().await, Some(Incoming::Event(Event::Unloaded { .. }))));
    assert_eq!(c.status().await.unwrap().models[0].state, kazeia_ipc::ModelState::Unloaded);
    // Unloading again, or loading an unknown role, is a clear error.
    let mut rx = c.send(kazeia_ipc::Request::Unload { id: c.new_id(), role: "thinker".into() }).await.unwrap();
    assert!(matches!(rx.recv().await, Some(Incoming::Event(Event::Error { code: ErrorCode::NoModel, .. }))));
    let mut rx = c.send(kazeia_ipc::Request::Load { id: c.new_id(), role: "ghost".into() }).await.unwrap();
    assert!(matches!(rx.recv().await, Some(Incoming::Event(Event::Error { code: ErrorCode::NoModel, .. }))));
    // A turn loads what it needs, with progress on the turn's id.
    let id = c.new_id();
    let mut rx =
        c.turn(&id, "chat", QUESTION, TurnOptions { temperature: Some(0.0), ..Default::default() }).await.unwrap();
    let mut saw_progress = false;
    let done = loop {
        match rx.recv().await.unwrap() {
            Incoming::Event(Event::LoadProgress { .. }) => saw_progress = true,
            Incoming::Event(e @ (Event::Done { .. } | Event::Error { .. })) => break e,
            _ => {}
        }
    };
    assert!(saw_progress && matches!(done, Event::Done { .. }), "{done:?}");
}

/// A subscription ends when a `cancel` names it (a client's "close" once left it pushing for as
/// long as the connection lived), its id is taken while it runs, and a connection holds at most
/// 16 of them.
#[test]
fn subscriptions_end_on_cancel_and_are_bounded() {
    let d = Daemon::start(&config(""));
    let mut s = raw(&d, true);
    let mut subscribed: Vec<String> = Vec::new();
    // The next frame that is not a push of a running subscription.
    let next = |s: &mut UnixStream, subscribed: &[String]| loop {
        let e = read_json(s);
        let push = e["type"] == "status" && subscribed.iter().any(|id| e["id"] == id.as_str());
        if !push {
            return e;
        }
    };
    let send = |s: &mut UnixStream, v: serde_json::Value| write_frame(s, 1, v.to_string().as_bytes());
    let subscribe = |s: &mut UnixStream, subscribed: &mut Vec<String>, id: &str| {
        send(s, serde_json::json!({"type":"subscribe","id":id}));
        let e = next(s, subscribed);
        assert_eq!((e["type"].as_str(), e["id"].as_str()), (Some("status"), Some(id)), "{e}");
        subscribed.push(id.to_string());
    };
    subscribe(&mut s, &mut subscribed, "s0");
    // Its id is taken: a second subscribe, a turn, a status under it.
    for v in [
        serde_json::json!({"type":"subscribe","id":"s0"}),
        serde_json::json!({"type":"turn","id":"s0","pipeline":"chat","text":"hi"}),
        serde_json::json!({"type":"status","id":"s0"}),
    ] {
        send(&mut s, v.clone());
        let e = next(&mut s, &subscribed);
        assert_eq!((e["code"].as_str(), e["final"].as_bool()), (Some("duplicate_id"), Some(false)), "{v}: {e}");
    }
    // Cancelled: its last event, final (a push may come before it); then nothing runs under
    // its id.
    send(&mut s, serde_json::json!({"type":"cancel","id":"s0"}));
    let e = next(&mut s, &subscribed);
    subscribed.clear();
    assert_eq!(
        (e["id"].as_str(), e["code"].as_str(), e["final"].as_bool()),
        (Some("s0"), Some("cancelled"), Some(true)),
        "{e}"
    );
    send(&mut s, serde_json::json!({"type":"cancel","id":"s0"}));
    assert_eq!(next(&mut s, &subscribed)["code"], "unknown_request");
    // The id is free again; sixteen at once, not seventeen, until one is cancelled.
    for i in 0..16 {
        subscribe(&mut s, &mut subscribed, &format!("s{i}"));
    }
    send(&mut s, serde_json::json!({"type":"subscribe","id":"s16"}));
    let e = next(&mut s, &subscribed);
    assert_eq!(
        (e["id"].as_str(), e["code"].as_str(), e["final"].as_bool()),
        (Some("s16"), Some("bad_request"), Some(true)),
        "{e}"
    );
    send(&mut s, serde_json::json!({"type":"cancel","id":"s3"}));
    assert_eq!(next(&mut s, &subscribed)["code"], "cancelled");
    subscribed.retain(|id| id != "s3");
    subscribe(&mut s, &mut subscribed, "s16");
}

/// The HTP sessions the memory plan asks for are set at start for every model that can be
/// planned: a role whose file is missing is named in the log and the others keep their split
/// (the whole plan failing set no device for any model). Here no NPU runs them, so the roles
/// then run on the CPU, as status says.
#[test]
fn a_missing_model_file_leaves_the_others_htp_plan() {
    let text = format!(
        "[daemon]\npreload = false\n\n[[model]]\nrole = \"thinker\"\nfile = \"{}\"\nbackend = \"htp\"\n\n\
         [[model]]\nrole = \"guard\"\nfile = \"/nonexistent/guard.gguf\"\nbackend = \"htp\"\n",
        common::smollm2().display()
    );
    let d = Daemon::start(&text);
    d.wait_log("GGML_HEXAGON_DEVICES from the memory plan");
    assert!(
        d.log().contains("no HTP plan for this role") && d.log().contains("/nonexistent/guard.gguf"),
        "{}",
        d.log()
    );
}

/// `load` and `unload` take their ids until their final event, and a connection runs at most 16
/// of them (uncounted, a client's million unloads during a load were a million tasks): the
/// speech models' load (seconds of ONNX Runtime) holds the first, the others wait behind it. A
/// 17th is `busy` at once; a turn or an unload under a running load's id is `duplicate_id` (the
/// load's `loaded` could follow the turn's `done`). All 16 end `loaded`, and their ids are free.
#[test]
fn loads_take_their_ids_and_are_bounded() {
    let d = Daemon::start(&crate::voice::config_text());
    let mut s = raw(&d, true);
    let send = |s: &mut UnixStream, v: serde_json::Value| write_frame(s, 1, v.to_string().as_bytes());
    for i in 0..=16 {
        send(&mut s, serde_json::json!({"type":"load","id":format!("l{i}"),"role":"stt"}));
    }
    send(&mut s, serde_json::json!({"type":"turn","id":"l0","pipeline":"chat","text":"hi"}));
    send(&mut s, serde_json::json!({"type":"unload","id":"l1","role":"stt"}));
    let (mut loaded, mut refused) = (std::collections::BTreeSet::new(), Vec::new());
    while loaded.len() < 16 || refused.len() < 3 {
        let e = read_json(&mut s);
        let id = e["id"].as_str().unwrap_or_default().to_string();
        match e["type"].as_str() {
            Some("loaded") => assert!(loaded.insert(id), "{e}"),
            Some("error") => refused.push((id, e["code"].as_str().unwrap().to_string(), e["final"].as_bool())),
            _ => panic!("{e}"),
        }
    }
    refused.sort();
    let expected = [("l0", "duplicate_id", false), ("l1", "duplicate_id", false), ("l16", "busy", true)];
    let expected: Vec<_> = expected.iter().map(|(i, c, f)| (i.to_string(), c.to_string(), Some(*f))).collect();
    assert_eq!(refused, expected);
    assert_eq!(loaded, (0..16).map(|i| format!("l{i}")).collect());
    // Ended: the ids are free again.
    send(&mut s, serde_json::json!({"type":"status","id":"l0"}));
    let e = read_json(&mut s);
    assert_eq!((e["type"].as_str(), e["id"].as_str()), (Some("status"), Some("l0")), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn critical_memory_pressure_refuses_new_turns() {
    // A critical watermark above any machine's available memory: pressure is critical at once.
    let d = Daemon::start(&config("[budget]\ncritical_watermark = \"100000GiB\"\nlow_watermark = \"100001GiB\""));
    let c = d.client().await;
    let t = Instant::now();
    loop {
        if c.status().await.unwrap().pressure == "critical" {
            break;
        }
        assert!(t.elapsed() < common::HANG, "pressure never became critical");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut rx = c.turn(&c.new_id(), "chat", QUESTION, TurnOptions::default()).await.unwrap();
    match rx.recv().await.unwrap() {
        Incoming::Event(Event::Error { code, .. }) => assert_eq!(code, ErrorCode::MemoryPressure),
        other => panic!("{other:?}"),
    }
    // The daemon keeps answering everything else.
    assert!(c.status().await.is_ok());
}

/// One user cannot take every connection or every turn: the limits are announced in `welcome`,
/// a connection over them gets `too_many_connections` and is closed, a turn over them gets
/// `too_many_turns` while the connection goes on, and a freed slot serves again.
#[test]
fn per_uid_limits_are_announced_and_refused_with_codes() {
    let d = Daemon::start(&config("max_connections_per_uid = 2\nmax_turns_per_uid = 1"));
    let mut a = UnixStream::connect(&d.socket).unwrap();
    a.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write_frame(&mut a, 1, br#"{"type":"hello","protocol":1}"#);
    let welcome = read_json(&mut a);
    assert_eq!(
        (welcome["limits"]["max_connections_per_uid"].as_u64(), welcome["limits"]["max_turns_per_uid"].as_u64()),
        (Some(2), Some(1)),
        "{welcome}"
    );
    let mut b = raw(&d, true);
    // The third connection of this uid.
    let mut c = UnixStream::connect(&d.socket).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    assert_eq!(read_json(&mut c)["code"], "too_many_connections");
    assert!(is_eof(&mut c));

    // One turn running on `a`: a second one of this uid, on `b`, is refused; `b` goes on.
    let long =
        serde_json::json!({"type":"turn","id":"long","pipeline":"chat","text":LONG,"options":{"max_tokens":400}});
    write_frame(&mut a, 1, long.to_string().as_bytes());
    assert_eq!(read_json(&mut a)["type"], "accepted");
    let second = serde_json::json!({"type":"turn","id":"two","pipeline":"chat","text":"Hi"});
    write_frame(&mut b, 1, second.to_string().as_bytes());
    let e = read_json(&mut b);
    assert_eq!((e["code"].as_str(), e["id"].as_str()), (Some("too_many_turns"), Some("two")), "{e}");
    write_frame(&mut b, 1, br#"{"type":"status","id":"s"}"#);
    assert_eq!(read_json(&mut b)["type"], "status");

    // The first connection leaves (its turn is cancelled): a connection and a turn are free.
    drop(a);
    d.wait_log("stop=\"cancelled\"");
    let t = Instant::now();
    let mut c = loop {
        let mut c = UnixStream::connect(&d.socket).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write_frame(&mut c, 1, br#"{"type":"hello","protocol":1}"#);
        let ev = read_json(&mut c);
        if ev["type"] == "welcome" {
            break c;
        }
        // The daemon may not have counted the first connection out yet.
        assert_eq!(ev["code"], "too_many_connections", "{ev}");
        assert!(t.elapsed() < common::HANG, "the connection was never freed");
        std::thread::sleep(Duration::from_millis(20));
    };
    let again =
        serde_json::json!({"type":"turn","id":"again","pipeline":"chat","text":"Hi","options":{"max_tokens":4}});
    write_frame(&mut c, 1, again.to_string().as_bytes());
    assert_eq!(read_json(&mut c)["type"], "accepted");
}

/// `session` over the socket: the second turn of a session continues the first (its prompt
/// holds it, and the context reuses it instead of prefilling it again), from another connection
/// of the same user too; another session name starts afresh.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_continues_across_turns_and_connections() {
    let d = Daemon::start(&config(""));
    let turn = |session: &'static str, text: &'static str| kazeia_ipc::Request::Turn {
        id: format!("{session}-{}", text.len()),
        pipeline: "chat".into(),
        text: Some(text.into()),
        audio: None,
        session: Some(session.into()),
        options: TurnOptions { temperature: Some(0.0), max_tokens: Some(16), ..Default::default() },
    };
    let done = |ev: Event| match ev {
        Event::Done { metrics, .. } => metrics,
        other => panic!("{other:?}"),
    };
    let a = d.client().await;
    let (_, first) = finish(&mut a.send(turn("alice", "My name is Alice. Say hello.")).await.unwrap()).await;
    let first = done(first);
    assert_eq!(first.cached_tokens, 0, "{first:?}");
    // Another connection, same user, same session: the conversation goes on.
    let b = d.client().await;
    let (_, second) = finish(&mut b.send(turn("alice", "What is my name?")).await.unwrap()).await;
    let second = done(second);
    assert!(second.prompt_tokens > first.prompt_tokens, "the first turn is in the prompt: {second:?}");
    assert!(second.cached_tokens >= first.prompt_tokens, "and reused, not prefilled again: {second:?} after {first:?}");
    // Another name: a new conversation (its prompt is this turn alone).
    let (_, other) = finish(&mut b.send(turn("bob", "What is my name?")).await.unwrap()).await;
    let other = done(other);
    assert!(other.prompt_tokens < second.prompt_tokens, "{other:?} vs {second:?}");
}

/// Two users on one daemon (a socket handed over with `allow_uids` = root and `nobody`, as a
/// service's socket would be): one user cannot cancel the other's turn (`unknown_request`, the
/// turn runs to its end) nor continue the other's session (the same name is a fresh
/// conversation); the owner's own `kazeia cancel` from another connection does stop it. The other
/// user runs the real CLI under its uid (the test runs as root, as CI does).
#[tokio::test(flavor = "multi_thread")]
async fn another_user_cannot_cancel_or_continue() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::io::AsRawFd;
    use std::os::unix::process::CommandExt;
    const NOBODY: u32 = 65534;
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test switches to another uid: run the suite as root (CI does)");
    let d = Daemon::start(&config(&format!("allow_uids = [0, {NOBODY}]")));
    // A directory and a CLI binary the other user can reach (/root is 0700).
    let shared = tempfile::Builder::new().prefix("kazeia-uid").tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let cli = shared.path().join("kazeia");
    std::fs::copy(env!("CARGO_BIN_EXE_kazeia"), &cli).unwrap();
    let path = shared.path().join("engine.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let cfg = d.dir.path().join("models.toml");
    // Handed over as Android's init does (systemd's LISTEN_PID would have to name the child).
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kazeia"));
    cmd.args(["serve", "--config", cfg.to_str().unwrap()])
        .env("ANDROID_SOCKET_kazeia", "9")
        .stderr(std::process::Stdio::piped());
    hand_over(&mut cmd, listener.as_raw_fd(), 9);
    let mut child = common::Reaped(cmd.spawn().unwrap());
    drop(listener);
    let log = common::collect_lines(child.stderr.take().unwrap());
    let _dump = DumpOnPanic(log);
    let as_nobody = |args: &[&str]| {
        let out = std::process::Command::new(&cli)
            .args(args)
            .args(["--socket", path.to_str().unwrap()])
            .uid(NOBODY)
            .gid(NOBODY)
            .env("HOME", "/nonexistent")
            .env_remove("XDG_RUNTIME_DIR")
            .current_dir(shared.path())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let root = kazeia_ipc::Client::connect(&path, "root").await.unwrap();

    // Sessions: root's "s1" grows; nobody's "s1" is as fresh as a name never used.
    let turn = |id: &str, text: &str, session: &str| kazeia_ipc::Request::Turn {
        id: id.into(),
        pipeline: "chat".into(),
        text: Some(text.into()),
        audio: None,
        session: Some(session.into()),
        options: TurnOptions { max_tokens: Some(16), ..Default::default() },
    };
    let prompt_tokens = |ev: &Event| match ev {
        Event::Done { metrics, .. } => u64::from(metrics.prompt_tokens),
        other => panic!("{other:?}"),
    };
    let mut rx = root.send(turn("a", "My name is Zorglub. Remember it.", "s1")).await.unwrap();
    let first = prompt_tokens(&finish(&mut rx).await.1);
    let (code, out, err) = as_nobody(&[
        "ask",
        "--pipeline",
        "chat",
        "--session",
        "s1",
        "--max-tokens",
        "16",
        "--json",
        "What is my name?",
    ]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let done = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["type"] == "done")
        .unwrap_or_else(|| panic!("no done in {out}"));
    let theirs = done["metrics"]["prompt_tokens"].as_u64().unwrap();
    let mut rx = root.send(turn("b", "What is my name?", "never-used")).await.unwrap();
    let fresh = prompt_tokens(&finish(&mut rx).await.1);
    let mut rx = root.send(turn("c", "What is my name?", "s1")).await.unwrap();
    let ours = prompt_tokens(&finish(&mut rx).await.1);
    assert_eq!(theirs, fresh, "nobody's \"s1\" holds nothing of root's");
    assert!(ours > fresh + first / 2, "root's \"s1\" holds its first turn: {first}, then {ours} (fresh {fresh})");

    // Cancel: refused across users; the owner's own CLI cancels.
    let long = kazeia_ipc::Request::Turn {
        id: "long".into(),
        pipeline: "chat".into(),
        text: Some("Write a very long story about a dragon who learns to bake bread.".into()),
        audio: None,
        session: None,
        options: TurnOptions { max_tokens: Some(2000), ..Default::default() },
    };
    let mut rx = root.send(long).await.unwrap();
    // Started: its first token came.
    loop {
        match rx.recv().await.unwrap() {
            Incoming::Event(Event::Token { .. }) => break,
            Incoming::Event(Event::Accepted { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    let (code, out, err) = as_nobody(&["cancel", "long"]);
    assert_ne!(code, Some(0), "another user's cancel is refused: {out}{err}");
    assert!(format!("{out}{err}").contains("unknown_request"), "{out}{err}");
    let mine = std::process::Command::new(env!("CARGO_BIN_EXE_kazeia"))
        .args(["cancel", "long", "--socket", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(mine.status.success(), "{mine:?}");
    let (_, end) = finish(&mut rx).await;
    assert!(matches!(end, Event::Done { stop: StopReason::Cancelled, .. }), "the owner's cancel stopped it: {end:?}");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// The handed-over daemon's log, printed if the test fails.
struct DumpOnPanic(std::sync::Arc<std::sync::Mutex<String>>);
impl Drop for DumpOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- handed-over daemon ---\n{}", self.0.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }
}
