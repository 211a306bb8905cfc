//! The async client against a fake daemon on a real Unix socket, speaking raw frames: what it
//! does when the daemon goes away, says something it cannot read, or never answers `hello`.
//! (The real daemon's side is tested in daemon/tests and tests/.)

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use kazeia_ipc::{Client, ClientError, ErrorCode, Event, Frame, FrameCodec, Incoming, Request, MAX_FRAME};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::codec::Framed;

const WELCOME: &str = r#"{"type":"welcome","protocol":1,"server":"fake","capabilities":[],
    "limits":{"max_frame":1048576,"queue_per_model":8,"connection_buffer":1024}}"#;

/// A fake daemon's first connection: `hello` read, `welcome` sent.
async fn accepted(listener: &UnixListener) -> Framed<UnixStream, FrameCodec> {
    let (stream, _) = listener.accept().await.unwrap();
    let mut framed = Framed::new(stream, FrameCodec::new(MAX_FRAME));
    match framed.next().await {
        Some(Ok(Frame::Json(b))) => assert!(String::from_utf8_lossy(&b).contains("\"hello\"")),
        other => panic!("expected hello, got {other:?}"),
    }
    let welcome: serde_json::Value = serde_json::from_str(WELCOME).unwrap();
    framed.send(Frame::json(&welcome)).await.unwrap();
    framed
}

/// A client connected to a fake daemon on a socket in its own directory (kept while the test
/// runs), and the daemon's side of the connection.
async fn connected() -> (tempfile::TempDir, Client, Framed<UnixStream, FrameCodec>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fake.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (client, framed) = tokio::join!(Client::connect(&path, "test"), accepted(&listener));
    (dir, client.unwrap(), framed)
}

/// The id of the next request the fake daemon reads.
async fn next_request(framed: &mut Framed<UnixStream, FrameCodec>) -> String {
    match framed.next().await {
        Some(Ok(Frame::Json(b))) => {
            let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
            v["id"].as_str().unwrap().to_string()
        }
        other => panic!("expected a request, got {other:?}"),
    }
}

/// A request sent after the daemon closed the connection fails at once: it found the writer
/// still waiting, queued its frame, kept a route no reader would ever fill, and waited for good.
#[tokio::test]
async fn a_request_after_the_daemon_went_fails_at_once() {
    let (_dir, client, framed) = connected().await;
    drop(framed);
    // The reader sees the end of the stream; every request from then on fails.
    for _ in 0..200 {
        if client.is_closed() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(client.is_closed());
    let status = tokio::time::timeout(Duration::from_secs(5), client.status()).await.expect("status waited for good");
    assert!(matches!(status, Err(ClientError::Closed)), "{status:?}");
    let turn = client.turn(&client.new_id(), "chat", "hi", Default::default()).await;
    assert!(matches!(turn, Err(ClientError::Closed)), "{turn:?}");
}

/// A final error with a code this client does not know (a newer daemon's) ends its request as
/// an error naming that code; so does a `done` it cannot read. Both were dropped as unreadable,
/// and their requests waited for good. A non-final one is still only dropped.
#[tokio::test]
async fn an_unknown_code_still_ends_its_request() {
    let (_dir, client, mut framed) = connected().await;

    let mut rx = client.send(Request::Status { id: client.new_id() }).await.unwrap();
    let id = next_request(&mut framed).await;
    let soft = serde_json::json!({"type": "error", "id": id, "code": "new_code", "message": "m", "final": false});
    let hard = serde_json::json!({"type": "error", "id": id, "code": "new_code", "message": "later", "final": true});
    framed.send(Frame::json(&soft)).await.unwrap();
    framed.send(Frame::json(&hard)).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("the error never came");
    match got {
        Some(Incoming::Event(Event::Error { code, message, is_final: true, .. })) => {
            assert_eq!(code, ErrorCode::Engine);
            assert!(message.contains("new_code") && message.contains("later"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(rx.recv().await.is_none(), "the route goes with its final event");

    let mut rx = client.send(Request::Load { id: client.new_id(), role: "guard".into() }).await.unwrap();
    let id = next_request(&mut framed).await;
    let done = serde_json::json!({"type": "done", "id": id, "stop": "new_reason", "metrics": {}});
    framed.send(Frame::json(&done)).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("the done never came");
    assert!(matches!(got, Some(Incoming::Event(Event::Error { is_final: true, .. }))), "{got:?}");
    assert_eq!(client.pending(), 0);

    // A status with a model state this client does not know: `status()` is an error, not a
    // wait for good.
    let (status, ()) = tokio::join!(tokio::time::timeout(Duration::from_secs(5), client.status()), async {
        let id = next_request(&mut framed).await;
        let st =
            serde_json::json!({"type": "status", "id": id, "status": {"models": [{"role": "x", "state": "sleeping"}]}});
        framed.send(Frame::json(&st)).await.unwrap();
    });
    let status = status.expect("status waited for good");
    assert!(matches!(status, Err(ClientError::Refused { code: ErrorCode::Engine, .. })), "{status:?}");
}

/// A socket that takes the connection and never answers `hello` is an error within the
/// handshake's time, not a wait for good.
#[tokio::test(start_paused = true)]
async fn no_welcome_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mute.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let mute = async {
        let (stream, _) = listener.accept().await.unwrap();
        // Held open, never written to.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(stream);
    };
    tokio::select! {
        r = Client::connect(&path, "test") => match r {
            Err(ClientError::Unexpected(m)) => assert!(m.contains("welcome"), "{m}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("connected to a mute socket"),
        },
        _ = mute => panic!("the client waited for an hour"),
    }
}
