//! ONNX models (speech): no header predicts ONNX Runtime's arenas, so the estimate is the file
//! size times a factor measured on this project's models, per kind (tests/tests/speech_memory.rs
//! prints the factors it measures and checks the estimate against them):
//! - STT (Whisper base encoder + decoder, with the VAD): 2.43 measured. The session keeps the
//!   weights copied out of the protobuf, and the encoder's activations for a 30 s window
//!   (1500 positions; attention scores 8 × 1500 × 1500 floats per layer) stay in its arena.
//! - TTS (Piper): 1.31 measured.
//!
//! Rounded up, so that the estimate is never below.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnnxKind {
    Stt,
    Tts,
}

impl OnnxKind {
    pub fn factor(self) -> f64 {
        match self {
            OnnxKind::Stt => 2.6,
            OnnxKind::Tts => 1.45,
        }
    }
}

pub fn estimate_onnx(file_bytes: u64, kind: OnnxKind) -> u64 {
    (file_bytes as f64 * kind.factor()) as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn factors_apply() {
        assert_eq!(super::estimate_onnx(1000, super::OnnxKind::Stt), 2600);
        assert_eq!(super::estimate_onnx(1000, super::OnnxKind::Tts), 1450);
    }
}
