//! `kazeia run` as a user runs it: the real binary, the repo's models.toml, the real model.

use std::path::Path;
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn kazeia(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kazeia")).args(args).current_dir(repo()).output().expect("run kazeia");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const QUESTION: &str = "What is the capital of France? Answer in one short sentence.";

#[test]
fn run_chat_answers_paris() {
    let (code, out, err) = kazeia(&["run", "chat", "--text", QUESTION, "--temperature", "0"]);
    assert_eq!(code, 0, "stderr: {err}");
    assert!(out.contains("Paris"), "stdout: {out}");
}

#[test]
fn run_chat_json_lines() {
    let (code, out, err) = kazeia(&["run", "chat", "--text", QUESTION, "--temperature", "0", "--json"]);
    assert_eq!(code, 0, "stderr: {err}");
    let events: Vec<serde_json::Value> =
        out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect();
    let text: String = events.iter().filter(|e| e["type"] == "token").map(|e| e["text"].as_str().unwrap()).collect();
    assert!(text.contains("Paris"), "{text}");
    let done = events.last().unwrap();
    assert_eq!(done["type"], "done");
    for k in ["prompt_tokens", "generated_tokens", "ttft_ms", "prefill_tok_s", "decode_tok_s"] {
        assert!(done["metrics"][k].as_f64().unwrap() > 0.0, "{k} in {done}");
    }
}

#[test]
fn bad_config_and_unknown_pipeline_are_error_events() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[[model]]\nrole = \"thinker\"\nfile = \"x.gguf\"\nthreads = \"two\"\n").unwrap();
    let (code, out, _) = kazeia(&["run", "chat", "--text", "hi", "--json", "--config", bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    let ev: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(ev["code"], "bad_config");
    let msg = ev["message"].as_str().unwrap();
    assert!(msg.contains("bad.toml:4") && msg.contains("threads"), "{msg}");

    let (code, out, _) = kazeia(&["run", "nope", "--text", "hi", "--json"]);
    assert_eq!(code, 2);
    assert!(out.contains("\"code\":\"pipeline\"") && out.contains("chat"), "{out}");

    let missing = dir.path().join("missing.toml");
    std::fs::write(&missing, "[[model]]\nrole = \"thinker\"\nfile = \"/nonexistent/m.gguf\"\n").unwrap();
    let (code, out, _) = kazeia(&["run", "chat", "--text", "hi", "--json", "--config", missing.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(out.contains("\"code\":\"model_file\"") && out.contains("/nonexistent/m.gguf"), "{out}");
}

/// `kazeia run` goes through a supervisor of its own: a model over the budget is refused before
/// it loads, with the daemon's code and listing.
#[test]
fn run_refuses_a_load_over_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tiny-budget.toml");
    let model = repo().join("models.toml");
    let base = std::fs::read_to_string(&model).unwrap();
    let file = base.lines().find(|l| l.trim_start().starts_with("file")).expect("a model file").to_string();
    let text = format!(
        "[budget]\ndevice_ram = \"64MB\"\nreserve_os = 0\nreserve_app = 0\n\n[[model]]\nrole = \"thinker\"\n{file}\nthreads = 2\n"
    );
    std::fs::write(&cfg, text).unwrap();
    let (code, out, _) = kazeia(&["run", "chat", "--text", "hi", "--json", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    let ev: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(ev["code"], "over_budget", "{out}");
    assert!(ev["message"].as_str().unwrap().contains("needed for thinker"), "{out}");
}

#[test]
fn run_transcribe_json_gives_a_transcript_event() {
    // Speech made here: the Piper voice, through `kazeia run speak`.
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("q.wav");
    let (code, _, err) = kazeia(&[
        "run",
        "speak",
        "--language",
        "en",
        "--text",
        "Please send me the report before Friday afternoon.",
        "--out",
        wav.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) =
        kazeia(&["run", "transcribe", "--audio", wav.to_str().unwrap(), "--language", "en", "--json"]);
    assert_eq!(code, 0, "{err}");
    // One event per line: the transcript, then done.
    let events: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events.last().unwrap()["type"], "done", "{out}");
    let ev = events.iter().find(|e| e["type"] == "transcript").expect("a transcript event");
    // Piper samples noise: each rendering is heard a little differently (once "the 4th Friday"
    // for "before Friday", two edits). At most two words in eight may differ.
    let heard = ev["text"].as_str().unwrap();
    assert!(
        kazeia_daemon::speech::wer::wer("Please send me the report before Friday afternoon.", heard) <= 0.25,
        "{heard:?}"
    );
    assert_eq!(ev["language"], "en");
    // A missing audio file is a clear error event.
    let (code, out, _) = kazeia(&["run", "transcribe", "--audio", "/nonexistent.wav", "--json"]);
    assert_eq!(code, 1);
    assert!(out.contains("\"code\":\"bad_request\"") && out.contains("nonexistent.wav"), "{out}");
}

#[test]
fn plan_json_reads_headers_only() {
    let (code, out, err) = kazeia(&["plan", "--json"]);
    assert_eq!(code, 0, "{err}");
    let p: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(p["fits"].as_bool().unwrap());
    let models = p["models"].as_array().unwrap();
    // Thinker and Guard (GGUF), then the speech models (ONNX: stt, and the Piper voice).
    let roles: Vec<&str> = models.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["thinker", "guard", "stt", "tts"]);
    for m in models {
        for k in ["weights_bytes", "kv_bytes", "recurrent_bytes", "compute_bytes", "total_bytes", "htp_sessions"] {
            assert!(m[k].is_u64(), "{k} in {m}");
        }
        assert!(m["layer_ranges"].is_array() && m["backend"].is_string() && m["file"].is_string());
    }
    // The guard shares the Thinker's file: its weights are not counted twice.
    assert_eq!(models[1]["shares_weights_with"], "thinker");
    assert_eq!(models[1]["weights_bytes"], 0);
    let sum: u64 = models.iter().map(|m| m["total_bytes"].as_u64().unwrap()).sum();
    assert_eq!(p["total_bytes"].as_u64().unwrap(), sum);
}
