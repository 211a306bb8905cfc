//! ONNX models (speech): no header predicts ONNX Runtime's working memory, so the estimate is the
//! file size times a factor measured on this project's models, per kind: the peak RSS of a load and
//! a run, each kind alone in a process (tests/tests/speech_memory_{stt,tts,tts_whole}.rs print the
//! factors they measure and check the estimate against them; speech/src/runtime.rs says which
//! sessions keep ORT's CPU arena):
//! - STT (Whisper base: int8 encoder, 8-bit decoder; with the VAD and Smart Turn): 1.99–2.03
//!   measured (2.40–2.41 with the float32 decoder, whose file was 195 MB against 162, and whose RSS
//!   ~190 MB more; 2.45–2.47 with the float32 encoder, whose file was 3.3 × larger; 2.33 before the
//!   encoder kept its arena, which it fills once and holds between runs). The session keeps the
//!   weights copied out of the protobuf, and the encoder's activations for a 30 s window (1500
//!   positions; attention scores 8 × 1500 × 1500 floats per layer) peak during a run.
//! - TTS (Piper, its whole graph): 2.99–3.06 measured, the peak over twelve rounds of sentences
//!   with runs at the voice's cap of phoneme ids per run (kazeia_speech::tts::MAX_IDS_PER_RUN; its
//!   working memory grows with a run's audio), in six processes, with ONNX Runtime's CPU arena
//!   (which the cap bounds). Without the arena it was 3.55–4.13 (eight processes; estimate 4.6):
//!   the system allocator's pages varied with Piper's sampled noise. The older 1.6–2.4 (estimate
//!   2.5) was measured after the STT in the same process: the voice reused the pages the STT had
//!   freed.
//! - TTS split (the same voice with `tools/piper-split`'s two graphs, its vocoder run on pieces
//!   with their context, so at most ~3/4 of a run's frames): 2.52–2.61 measured (2.37–2.43 while a
//!   short tail was its own piece), as above (the whole graph's vocoder held a whole run's audio at
//!   each of its layers). The file counted is the voice's own.
//!
//! Rounded up, so that the estimate is never below.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnnxKind {
    Stt,
    /// A Piper voice run whole (no split beside it).
    Tts,
    /// A Piper voice run split (front and vocoder, the vocoder on pieces).
    TtsSplit,
}

impl OnnxKind {
    pub fn factor(self) -> f64 {
        match self {
            OnnxKind::Stt => 2.2,
            OnnxKind::Tts => 3.6,
            OnnxKind::TtsSplit => 3.1,
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
        assert_eq!(super::estimate_onnx(1000, super::OnnxKind::Stt), 2200);
        assert_eq!(super::estimate_onnx(1000, super::OnnxKind::Tts), 3600);
        assert_eq!(super::estimate_onnx(1000, super::OnnxKind::TtsSplit), 3100);
    }
}
