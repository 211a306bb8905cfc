//! What the speech models cost in memory against the plan's estimate (file size × a factor
//! measured here: tests print the measured factor). Alone in its process: the peak is ours.

use kazeia_daemon::speech::voice_for;
use kazeia_memory_budget::onnx::{estimate_onnx, OnnxKind};
use kazeia_tests::{config, proc_status_bytes};

#[test]
fn speech_models_stay_within_their_estimate() {
    let c = config("");
    let stt_dir = c.cache_path(&c.speech.stt);
    let files = |paths: &[std::path::PathBuf]| paths.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum::<u64>();
    let stt_bytes = files(&[stt_dir.join("encoder.onnx"), stt_dir.join("decoder.onnx"), c.cache_path(&c.speech.vad)]);
    let tts_file = c.cache_path(std::path::Path::new(&c.speech.voices["en"]));
    let tts_bytes = files(&[tts_file]);

    let before = proc_status_bytes("VmRSS");
    let mut stt = kazeia_daemon::speech::transcriber(&c).unwrap();
    let speech: Vec<f32> = (0..16_000 * 3).map(|i| ((i as f32) * 0.05).sin() * 0.1).collect();
    stt.transcribe(&speech, Some("en"), &|| false).unwrap();
    let stt_peak = proc_status_bytes("VmHWM") - before;
    // ONNX Runtime's arena keeps what a run took: RSS after the run is its peak.
    let mid = proc_status_bytes("VmRSS");
    let mut voice = voice_for(&c, "en").unwrap();
    voice.synthesize("The weather is nice today and we will go to the park.").unwrap();
    let tts_peak = proc_status_bytes("VmRSS").saturating_sub(mid);
    let rows = [("stt+vad", stt_bytes, stt_peak, OnnxKind::Stt), ("tts", tts_bytes, tts_peak, OnnxKind::Tts)];
    for (name, file, peak, _) in rows {
        eprintln!("{name}: files {file} B, measured {peak} B (factor {:.2})", peak as f64 / file as f64);
    }
    for (name, file, peak, kind) in rows {
        let est = estimate_onnx(file, kind);
        eprintln!(
            "{name}: estimate {est} B (factor {}) vs measured {peak} B: ratio {:.3}",
            kind.factor(),
            est as f64 / peak as f64
        );
        assert!(est >= peak, "{name}: the estimate {est} is below the measured {peak}");
        assert!(est as f64 <= peak as f64 * 1.25, "{name}: the estimate {est} is far above the measured {peak}");
    }
}
