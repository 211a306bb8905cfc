//! Arbitrary bytes from a peer, cut into arbitrary reads: the frame decoder and the request
//! parser must never panic, never loop, never buffer past the limit, and every frame they
//! accept must encode back to the same bytes.
#![no_main]

use bytes::BytesMut;
use kazeia_ipc::{parse_request, Frame, FrameCodec};
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::{Decoder, Encoder};

const MAX: usize = 4096;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the read size, as the kernel would split a stream.
    let Some((&cut, wire)) = data.split_first() else { return };
    let step = 1 + cut as usize % 64;
    let mut codec = FrameCodec::new(MAX);
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut consumed_frames = Vec::new();
    loop {
        match codec.decode(&mut buf) {
            Ok(Some(frame)) => consumed_frames.push(frame),
            Ok(None) => {
                if fed >= wire.len() {
                    break;
                }
                let end = (fed + step).min(wire.len());
                buf.extend_from_slice(&wire[fed..end]);
                fed = end;
            }
            // A frame over the limit ends the stream: the connection is closed.
            Err(_) => return,
        }
        assert!(buf.len() <= MAX + 4 + step, "buffered {} bytes", buf.len());
    }
    for frame in consumed_frames {
        match &frame {
            Frame::Json(body) => {
                let _ = parse_request(body);
            }
            Frame::Audio(_) => {}
            Frame::Invalid(_) => continue,
        }
        // What was accepted encodes back, and decodes to itself.
        let mut out = BytesMut::new();
        FrameCodec::new(MAX).encode(frame.clone(), &mut out).expect("an accepted frame encodes");
        let again = FrameCodec::new(MAX).decode(&mut out).expect("decodes").expect("a whole frame");
        assert_eq!(again, frame);
        assert!(out.is_empty());
    }
});
