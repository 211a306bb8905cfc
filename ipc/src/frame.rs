//! Frames on the socket: a 4-byte big-endian length, then one kind byte, then the body.
//!
//! - kind 0x01: a JSON object (a request or an event), UTF-8.
//! - kind 0x02: audio: `u16` id length, id (UTF-8), `u32` sample rate, `u8` channels,
//!   `u8` flags (bit 0: last frame of the stream), then PCM s16le samples, interleaved.
//!
//! All integers big-endian except the samples. A frame larger than the limit is refused
//! before its body is read.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::{Event, Request};

/// Default largest frame, body and kind byte included (1 MiB: ~32 s of 16 kHz mono audio).
pub const MAX_FRAME: usize = 1 << 20;

pub const KIND_JSON: u8 = 0x01;
pub const KIND_AUDIO: u8 = 0x02;

/// A chunk of PCM audio for (or from) the request `id`.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioFrame {
    pub id: String,
    pub sample_rate: u32,
    pub channels: u8,
    pub last: bool,
    /// s16le samples.
    pub pcm: Bytes,
}

/// One decoded frame. JSON stays raw here: parsing it is the receiver's business, so that a bad
/// message can be answered with an error while the stream itself stays in sync.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Json(Bytes),
    Audio(AudioFrame),
    /// A frame whose length was sound but whose content was not. The stream stays in step and
    /// goes on (a decoder error would end a tokio-util stream), so the receiver answers it.
    Invalid(InvalidFrame),
}

impl Frame {
    /// The frame's length as the limit counts it: its kind byte and body.
    pub fn size(&self) -> usize {
        match self {
            Frame::Json(json) => 1 + json.len(),
            Frame::Audio(a) => 1 + 2 + a.id.len() + 4 + 1 + 1 + a.pcm.len(),
            Frame::Invalid(_) => 0,
        }
    }
}

/// What was wrong with a frame that could be skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidFrame {
    #[error("empty frame (no kind byte)")]
    Empty,
    #[error("unknown frame kind 0x{0:02x}")]
    UnknownKind(u8),
    #[error("malformed audio frame: {0}")]
    BadAudio(&'static str),
    /// An id as a request's could not be: not echoed (it is the problem), and a 64 KiB one
    /// would have been, in each answer to each frame.
    #[error("audio frame id {0}")]
    BadId(&'static str),
}

/// Errors after which the stream cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes is over the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("cannot send an invalid frame")]
    Invalid,
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
}

impl Frame {
    pub fn json<T: serde::Serialize>(msg: &T) -> Frame {
        Frame::Json(Bytes::from(serde_json::to_vec(msg).expect("protocol messages serialize")))
    }

    pub fn event(ev: &Event) -> Frame {
        Frame::json(ev)
    }

    pub fn request(req: &Request) -> Frame {
        Frame::json(req)
    }
}

/// The codec: a length prefix with a hard maximum, then the kind byte. Stateless: each call
/// looks at the buffer from a frame boundary, so a partial frame simply waits for more bytes.
#[derive(Debug)]
pub struct FrameCodec {
    max: usize,
}

impl FrameCodec {
    pub fn new(max_frame: usize) -> FrameCodec {
        FrameCodec { max: max_frame }
    }
}

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec::new(MAX_FRAME)
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if src.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
        // Refused before the body is read: the peer cannot make us buffer more than the limit.
        if len > self.max {
            return Err(FrameError::TooLarge { len, max: self.max });
        }
        if src.len() < 4 + len {
            src.reserve(4 + len - src.len());
            return Ok(None);
        }
        src.advance(4);
        let mut body = src.split_to(len);
        if body.is_empty() {
            return Ok(Some(Frame::Invalid(InvalidFrame::Empty)));
        }
        let kind = body.get_u8();
        Ok(Some(match kind {
            KIND_JSON => Frame::Json(body.freeze()),
            KIND_AUDIO => decode_audio(body.freeze()).map_or_else(Frame::Invalid, Frame::Audio),
            other => Frame::Invalid(InvalidFrame::UnknownKind(other)),
        }))
    }
}

fn decode_audio(mut b: Bytes) -> Result<AudioFrame, InvalidFrame> {
    if b.remaining() < 2 {
        return Err(InvalidFrame::BadAudio("no id length"));
    }
    let id_len = b.get_u16() as usize;
    if b.remaining() < id_len + 6 {
        return Err(InvalidFrame::BadAudio("header shorter than its id length says"));
    }
    let id = String::from_utf8(b.split_to(id_len).to_vec()).map_err(|_| InvalidFrame::BadAudio("id is not UTF-8"))?;
    if let Some(why) = crate::request::bad_name(&id) {
        return Err(InvalidFrame::BadId(why));
    }
    let sample_rate = b.get_u32();
    let channels = b.get_u8();
    let flags = b.get_u8();
    if channels == 0 || sample_rate == 0 {
        return Err(InvalidFrame::BadAudio("zero sample rate or channels"));
    }
    if !b.remaining().is_multiple_of(2 * channels as usize) {
        return Err(InvalidFrame::BadAudio("PCM length is not a whole number of s16 frames"));
    }
    Ok(AudioFrame { id, sample_rate, channels, last: flags & 1 == 1, pcm: b })
}

impl Encoder<Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        let mut body = BytesMut::new();
        match frame {
            Frame::Json(json) => {
                body.put_u8(KIND_JSON);
                body.put_slice(&json);
            }
            Frame::Audio(a) => {
                body.put_u8(KIND_AUDIO);
                body.put_u16(a.id.len() as u16);
                body.put_slice(a.id.as_bytes());
                body.put_u32(a.sample_rate);
                body.put_u8(a.channels);
                body.put_u8(u8::from(a.last));
                body.put_slice(&a.pcm);
            }
            Frame::Invalid(_) => return Err(FrameError::Invalid),
        }
        if body.len() > self.max {
            return Err(FrameError::TooLarge { len: body.len(), max: self.max });
        }
        dst.reserve(4 + body.len());
        dst.put_u32(body.len() as u32);
        dst.put_slice(&body);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(|b| Frame::Json(Bytes::from(b))),
            ("[a-z0-9-]{1,12}", 1u32..96_000, 1u8..3, any::<bool>(), proptest::collection::vec(any::<i16>(), 0..200))
                .prop_map(|(id, sample_rate, channels, last, samples)| {
                    let mut pcm: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
                    pcm.truncate(pcm.len() / (2 * channels as usize) * 2 * channels as usize);
                    Frame::Audio(AudioFrame { id, sample_rate, channels, last, pcm: Bytes::from(pcm) })
                }),
        ]
    }

    proptest! {
        /// `size` is what the limit counts: the encoded frame less its 4-byte length.
        #[test]
        fn size_is_the_encoded_length(frame in arb_frame()) {
            let mut wire = BytesMut::new();
            FrameCodec::default().encode(frame.clone(), &mut wire).unwrap();
            prop_assert_eq!(frame.size(), wire.len() - 4);
        }

        /// Any sequence of frames, cut into arbitrary pieces on the wire, decodes to itself.
        #[test]
        fn stream_roundtrip(frames in proptest::collection::vec(arb_frame(), 1..8), cuts in proptest::collection::vec(1usize..64, 1..40)) {
            let mut c = FrameCodec::default();
            let mut wire = BytesMut::new();
            for f in &frames {
                c.encode(f.clone(), &mut wire).unwrap();
            }
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            let mut cuts = cuts.into_iter().cycle();
            while !wire.is_empty() {
                let n = cuts.next().unwrap().min(wire.len());
                buf.extend_from_slice(&wire.split_to(n));
                while let Some(f) = c.decode(&mut buf).unwrap() {
                    out.push(f);
                }
            }
            prop_assert_eq!(out, frames);
            prop_assert!(buf.is_empty());
        }

        /// Frames built to reach every path of the decoder (lengths drawn small, so that empty
        /// frames, unknown kinds, short and odd audio headers, a frame over the limit and a cut
        /// tail all come up), each decoded to exactly what it is: the oracle is how it was built.
        #[test]
        fn every_path_decodes_to_what_was_built(
            segs in proptest::collection::vec(arb_seg(), 1..12),
            cut in 0usize..6,
        ) {
            let mut wire = BytesMut::new();
            for s in &segs {
                let body = s.body();
                wire.put_u32(body.len() as u32);
                wire.put_slice(&body);
            }
            // The last frame may arrive cut: the decoder waits for the rest.
            let whole = wire.len();
            wire.truncate(whole.saturating_sub(cut));
            let mut c = FrameCodec::new(SMALL_MAX);
            let mut expected = segs.iter();
            loop {
                let next = c.decode(&mut wire);
                let Some(seg) = expected.next() else {
                    prop_assert!(matches!(next, Ok(None)), "{next:?} after the last frame");
                    break;
                };
                let fits_whole = 4 + seg.body().len() <= wire.len();
                match (seg.expect(), next) {
                    (Outcome::TooLarge, Err(FrameError::TooLarge { .. })) => break,
                    (_, Ok(None)) => {
                        prop_assert!(!fits_whole && cut > 0, "waiting though the frame is whole");
                        break;
                    }
                    (Outcome::Frame(want), Ok(Some(got))) => prop_assert_eq!(got, want),
                    (Outcome::Invalid(want), Ok(Some(Frame::Invalid(got)))) => prop_assert_eq!(got, want),
                    (want, got) => prop_assert!(false, "{:?}: expected {:?}, decoded {:?}", seg, want, got),
                }
            }
        }

        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut c = FrameCodec::new(256);
            let mut buf = BytesMut::from(&bytes[..]);
            for _ in 0..16 {
                match c.decode(&mut buf) {
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
        }
    }

    /// The limit of the structured test: small, so that a frame over it comes up.
    const SMALL_MAX: usize = 48;

    /// One frame on the wire, as the test builds it.
    #[derive(Debug, Clone)]
    enum Seg {
        /// Length 0: no kind byte.
        Empty,
        Json(Vec<u8>),
        Unknown(u8, Vec<u8>),
        /// An audio frame's fields, written as they are (the id length as declared).
        Audio {
            id_len: u16,
            id: Vec<u8>,
            rate: u32,
            channels: u8,
            flags: u8,
            pcm: Vec<u8>,
        },
        /// An audio body cut short after `keep` bytes.
        AudioCut {
            keep: usize,
        },
        /// Over the limit.
        Huge,
    }

    #[derive(Debug)]
    enum Outcome {
        Frame(Frame),
        Invalid(InvalidFrame),
        TooLarge,
    }

    impl Seg {
        fn body(&self) -> Vec<u8> {
            let mut b = Vec::new();
            match self {
                Seg::Empty => {}
                Seg::Json(j) => {
                    b.push(KIND_JSON);
                    b.extend(j);
                }
                Seg::Unknown(k, rest) => {
                    b.push(*k);
                    b.extend(rest);
                }
                Seg::Audio { id_len, id, rate, channels, flags, pcm } => {
                    b.push(KIND_AUDIO);
                    b.extend(id_len.to_be_bytes());
                    b.extend(id);
                    b.extend(rate.to_be_bytes());
                    b.push(*channels);
                    b.push(*flags);
                    b.extend(pcm);
                }
                Seg::AudioCut { keep } => {
                    b.push(KIND_AUDIO);
                    b.extend([0, 2, b'i', b'd', 0, 0, 0x3e, 0x80, 1, 0].iter().take(*keep));
                }
                Seg::Huge => b.resize(SMALL_MAX + 1, KIND_JSON),
            }
            b
        }

        fn expect(&self) -> Outcome {
            let bad = |why| Outcome::Invalid(InvalidFrame::BadAudio(why));
            match self {
                Seg::Empty => Outcome::Invalid(InvalidFrame::Empty),
                Seg::Json(j) => Outcome::Frame(Frame::Json(Bytes::from(j.clone()))),
                Seg::Unknown(k, _) => Outcome::Invalid(InvalidFrame::UnknownKind(*k)),
                Seg::AudioCut { keep } if *keep < 2 => bad("no id length"),
                Seg::AudioCut { .. } => bad("header shorter than its id length says"),
                Seg::Audio { id_len, id, rate, channels, flags, pcm } => {
                    let after_len = id.len() + 6 + pcm.len();
                    if after_len < *id_len as usize + 6 {
                        return bad("header shorter than its id length says");
                    }
                    // The id is the first `id_len` bytes after the length, whatever was meant.
                    let mut rest: Vec<u8> = id.clone();
                    rest.extend(rate.to_be_bytes());
                    rest.push(*channels);
                    rest.push(*flags);
                    rest.extend(pcm);
                    let (id, tail) = rest.split_at(*id_len as usize);
                    let Ok(id) = String::from_utf8(id.to_vec()) else { return bad("id is not UTF-8") };
                    if let Some(why) = crate::request::bad_name(&id) {
                        return Outcome::Invalid(InvalidFrame::BadId(why));
                    }
                    let rate = u32::from_be_bytes(tail[..4].try_into().unwrap());
                    let (channels, flags, pcm) = (tail[4], tail[5], &tail[6..]);
                    if channels == 0 || rate == 0 {
                        return bad("zero sample rate or channels");
                    }
                    if pcm.len() % (2 * channels as usize) != 0 {
                        return bad("PCM length is not a whole number of s16 frames");
                    }
                    Outcome::Frame(Frame::Audio(AudioFrame {
                        id,
                        sample_rate: rate,
                        channels,
                        last: flags & 1 == 1,
                        pcm: Bytes::from(pcm.to_vec()),
                    }))
                }
                Seg::Huge => Outcome::TooLarge,
            }
        }
    }

    fn arb_seg() -> impl Strategy<Value = Seg> {
        let small = |n| proptest::collection::vec(any::<u8>(), 0..n);
        prop_oneof![
            Just(Seg::Empty),
            small(12).prop_map(Seg::Json),
            (3u8.., small(6)).prop_map(|(k, r)| Seg::Unknown(k, r)),
            (
                0u16..6,
                proptest::collection::vec(prop_oneof![Just(b'a'), Just(0xff)], 0..5),
                0u32..3,
                0u8..3,
                any::<u8>(),
                small(9)
            )
                .prop_map(|(id_len, id, rate, channels, flags, pcm)| Seg::Audio {
                    id_len,
                    id,
                    rate,
                    channels,
                    flags,
                    pcm
                }),
            (0usize..10).prop_map(|keep| Seg::AudioCut { keep }),
            Just(Seg::Huge),
        ]
    }

    fn roundtrip(f: Frame) -> Frame {
        let mut c = FrameCodec::default();
        let mut buf = BytesMut::new();
        c.encode(f, &mut buf).unwrap();
        let out = c.decode(&mut buf).unwrap().unwrap();
        assert!(buf.is_empty());
        out
    }

    #[test]
    fn json_and_audio_roundtrip() {
        let j = Frame::Json(Bytes::from_static(br#"{"type":"status","id":"1"}"#));
        assert_eq!(roundtrip(j.clone()), j);
        let a = Frame::Audio(AudioFrame {
            id: "t1".into(),
            sample_rate: 16000,
            channels: 1,
            last: true,
            pcm: Bytes::from(vec![1, 0, 2, 0]),
        });
        assert_eq!(roundtrip(a.clone()), a);
    }

    #[test]
    fn partial_frames_wait_for_more() {
        let mut c = FrameCodec::default();
        let mut buf = BytesMut::new();
        c.encode(Frame::Json(Bytes::from_static(b"{}")), &mut buf).unwrap();
        let mut part = buf.split_to(3);
        assert!(c.decode(&mut part).unwrap().is_none());
        part.unsplit(buf);
        assert!(c.decode(&mut part).unwrap().is_some());
    }

    #[test]
    fn oversized_and_malformed_frames() {
        let mut c = FrameCodec::new(64);
        let mut buf = BytesMut::from(&[0u8, 0, 1, 0][..]);
        assert!(matches!(c.decode(&mut buf), Err(FrameError::TooLarge { len: 256, max: 64 })));
        let mut buf = BytesMut::from(&[0u8, 0, 0, 2, 0x07, b'x'][..]);
        assert!(matches!(c.decode(&mut buf), Ok(Some(Frame::Invalid(InvalidFrame::UnknownKind(7))))));
        // Audio whose PCM is half a sample: kind, id length 1, "a", 16 kHz, mono, flags, 1 byte.
        let body = [0x02u8, 0, 1, b'a', 0, 0, 0x3e, 0x80, 1, 0, 7];
        let mut buf = BytesMut::new();
        buf.put_u32(body.len() as u32);
        buf.put_slice(&body);
        assert!(matches!(c.decode(&mut buf), Ok(Some(Frame::Invalid(InvalidFrame::BadAudio(_))))));
        // An id a request could not have: empty, over 128 bytes, a control character.
        for id in [&b""[..], &[b'x'; 129][..], &b"a\x01"[..]] {
            let mut body = vec![0x02u8];
            body.extend((id.len() as u16).to_be_bytes());
            body.extend(id);
            body.extend([0, 0, 0x3e, 0x80, 1, 0]);
            let mut buf = BytesMut::new();
            buf.put_u32(body.len() as u32);
            buf.put_slice(&body);
            let bad = FrameCodec::new(1024).decode(&mut buf);
            assert!(matches!(bad, Ok(Some(Frame::Invalid(InvalidFrame::BadId(_))))), "{id:?}");
        }
        // The boundary was kept: the next frame decodes.
        c.encode(Frame::Json(Bytes::from_static(b"{}")), &mut buf).unwrap();
        assert!(matches!(c.decode(&mut buf), Ok(Some(Frame::Json(_)))));
    }
}
