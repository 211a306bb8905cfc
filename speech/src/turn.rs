//! End of turn: is the user done, or only pausing? Silence alone cannot tell "what time is it"
//! from "I'd like to book a table for…": a fixed 500 ms of silence cost every turn half a
//! second, and still cut users who paused longer. Smart Turn v3.2 (Pipecat's model, a Whisper
//! tiny encoder with a classifier, int8, 8.7 MB) hears the last 8 s of the utterance and says
//! how likely it is complete; the listener asks it after a short VAD pause (200 ms) and keeps
//! listening when it says no. English, French and 21 other languages.
//!
//! Features are Pipecat's (see [`Mel::smart_turn`]); output `logits` is already a
//! probability (the export's sigmoid), complete above 0.5.

use std::path::Path;

use ndarray::Array3;
use ort::session::Session;
use ort::value::TensorRef;

use crate::mel::{Mel, N_MELS, TURN_FRAMES};
use crate::runtime::{session, Placement, Shapes, SpeechError};
use kazeia_memory_budget::Backend;

pub struct EndOfTurn {
    session: Session,
    mel: Mel,
    pub placement: Placement,
}

impl EndOfTurn {
    /// One thread, as Pipecat runs it: a verdict is one pass over an 8 s window.
    pub fn load(path: &Path, backend: Backend) -> Result<EndOfTurn, SpeechError> {
        let (session, placement) = session(path, 1, backend, Shapes::Fixed)?;
        let bad = |message: String| SpeechError::BadModel { path: path.into(), message };
        let input = session.inputs().first().map(|i| i.name().to_string());
        if input.as_deref() != Some("input_features") {
            return Err(bad(format!("expected an end-of-turn model with input `input_features`, found {input:?}")));
        }
        if !session.outputs().iter().any(|o| o.name() == "logits") {
            return Err(bad("expected an end-of-turn model with output `logits`".into()));
        }
        Ok(EndOfTurn { session, mel: Mel::new(), placement })
    }

    /// The features the model hears for `audio` (16 kHz mono, the utterance so far).
    pub fn features(&self, audio: &[f32]) -> Vec<f32> {
        self.mel.smart_turn(audio)
    }

    /// How likely the utterance `audio` (16 kHz mono) is a finished turn, 0 to 1.
    pub fn probability(&mut self, audio: &[f32]) -> Result<f32, SpeechError> {
        let input = Array3::from_shape_vec((1, N_MELS, TURN_FRAMES), self.features(audio))
            .map_err(|e| SpeechError::Run(e.to_string()))?;
        let out = self.session.run(ort::inputs!["input_features" => TensorRef::from_array_view(&input)?])?;
        let p = out["logits"].try_extract_array::<f32>()?.iter().next().copied();
        p.ok_or_else(|| SpeechError::Run("the end-of-turn model gave no output".into()))
    }
}
