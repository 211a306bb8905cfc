//! `kazeia run` as a user runs it: the real binary, the repo's models.toml, the real model.

use std::path::Path;
use std::process::Command;

use crate::common::repo;

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
    assert!(out.contains("tools/fetch-models"), "a missing model says how to get it: {out}");
}

/// Text mode prints no control character but line breaks and tabs, whatever it prints: a
/// model file's name here (a reply, a transcript or a daemon's message would do the same), with
/// the escapes that clear a terminal and retitle it. `--json` keeps it, escaped.
#[test]
fn text_mode_prints_no_terminal_escapes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("escapes.toml");
    std::fs::write(
        &cfg,
        "[[model]]\nrole = \"thinker\"\nfile = \"/nonexistent/\\u001b[2J\\u001b]0;PWNED\\u0007.gguf\"\n",
    )
    .unwrap();
    let (code, out, err) = kazeia(&["run", "chat", "--text", "hi", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(!out.contains('\u{1b}') && !err.contains('\u{1b}') && !err.contains('\u{7}'), "{err:?}");
    assert!(err.contains("\u{fffd}[2J\u{fffd}]0;PWNED\u{fffd}.gguf"), "{err:?}");
    let (_, out, _) = kazeia(&["run", "chat", "--text", "hi", "--json", "--config", cfg.to_str().unwrap()]);
    assert!(out.contains("\\u001b[2J"), "{out}");
}

/// A pipeline file naming a role the model set has not (a typo) is refused before anything
/// runs, by `run` and by `serve` (which started, and failed each turn on that pipeline).
#[test]
fn a_pipeline_file_with_an_unknown_role_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("typo.toml"), "[[stage]]\nkind = \"think\"\nrole = \"thinkr\"\n").unwrap();
    let pipelines = dir.path().to_str().unwrap();
    let (code, out, _) = kazeia(&["run", "typo", "--pipelines", pipelines, "--text", "hi", "--json"]);
    assert_eq!(code, 2, "{out}");
    let ev: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(ev["code"], "pipeline");
    assert!(ev["message"].as_str().unwrap().contains("typo.toml") && out.contains("thinkr"), "{out}");
    let socket = dir.path().join("s.sock");
    let (code, _, err) = kazeia(&["serve", "--pipelines", pipelines, "--socket", socket.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("thinkr") && !socket.exists(), "{err}");
}

/// A fake daemon on `path` for one connection: the handshake, then `serve` with the frames
/// (kind, body) as they come and a way to send JSON events. For what a real daemon does only
/// when something has gone wrong (a connection closed unanswered, audio dropped).
fn fake_daemon(
    path: &Path,
    serve: impl FnOnce(&mut dyn FnMut() -> Option<(u8, Vec<u8>)>, &mut dyn FnMut(&str)) + Send + 'static,
) -> std::thread::JoinHandle<()> {
    use std::io::{Read, Write};
    let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let (mut r, mut w) = (s.try_clone().unwrap(), s);
        let mut frame = move || {
            let mut len = [0u8; 4];
            r.read_exact(&mut len).ok()?;
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            r.read_exact(&mut body).ok()?;
            Some((body[0], body[1..].to_vec()))
        };
        let mut send = move |json: &str| {
            let mut f = ((json.len() + 1) as u32).to_be_bytes().to_vec();
            f.push(1);
            f.extend_from_slice(json.as_bytes());
            w.write_all(&f).unwrap();
        };
        let (_, hello) = frame().expect("hello");
        assert!(String::from_utf8_lossy(&hello).contains("\"hello\""));
        send(
            r#"{"type":"welcome","protocol":1,"server":"fake","capabilities":[],"limits":{"max_frame":1048576,"queue_per_model":8,"connection_buffer":1024}}"#,
        );
        serve(&mut frame, &mut send);
    })
}

/// `kazeia cancel` against a daemon that closes the connection before it answers (one stopping,
/// or gone): the cancel may not have been taken, and the command says so. It printed
/// "cancelled" and exited 0.
#[test]
fn cancel_with_no_answer_is_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fake.sock");
    // The cancel, then the status behind it: the connection closes unanswered.
    let fake = fake_daemon(&path, |frame, _| {
        while let Some((_, req)) = frame() {
            if String::from_utf8_lossy(&req).contains("\"status\"") {
                return;
            }
        }
    });
    let (code, out, err) = kazeia(&["cancel", "--socket", path.to_str().unwrap(), "some-id"]);
    fake.join().unwrap();
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("closed the connection") && !err.contains("cancelled some-id"), "{err}");
}

/// `ask --audio` sends a recording at once, up to 19 s (the daemon holds 20 s of a turn's audio
/// and drops what finds that full); a longer one is refused unless `--realtime` streams it. An
/// error that was not final (the daemon's `busy` for audio it dropped) makes the exit code,
/// though the turn then ends: a 42 s recording lost most of its words, and `ask` exited 0.
#[test]
fn ask_sends_what_the_daemon_holds_and_fails_on_dropped_audio() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fake.sock");
    let wav = |name: &str, secs: usize| {
        let p = dir.path().join(name);
        kazeia_daemon::speech::audio::write_wav(&p, &vec![0.0; secs * 16_000], 16_000).unwrap();
        p.to_str().unwrap().to_string()
    };
    let (long, short) = (wav("long.wav", 20), wav("short.wav", 17));
    let socket = path.to_str().unwrap();
    let (code, out, _) = kazeia(&["ask", "--socket", socket, "--pipeline", "transcribe", "--audio", &long, "--json"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("20.0 s") && out.contains("--realtime"), "{out}");
    let fake = fake_daemon(&path, move |frame, send| {
        let (_, turn) = frame().expect("the turn");
        let turn: serde_json::Value = serde_json::from_slice(&turn).unwrap();
        let id = turn["id"].as_str().unwrap().to_string();
        send(&format!(r#"{{"type":"accepted","id":"{id}","pipeline":"transcribe"}}"#));
        for _ in 0..170 {
            let (kind, _) = frame().expect("an audio frame");
            assert_eq!(kind, 2);
        }
        send(&format!(
            r#"{{"type":"error","id":"{id}","code":"busy","message":"audio overrun: 1600 samples were dropped","final":false}}"#
        ));
        let metrics = kazeia_ipc::Metrics::default();
        send(
            &serde_json::to_string(&kazeia_ipc::Event::Done {
                id: Some(id),
                stop: kazeia_ipc::StopReason::Eos,
                metrics,
            })
            .unwrap(),
        );
    });
    let (code, out, err) =
        kazeia(&["ask", "--socket", socket, "--pipeline", "transcribe", "--audio", &short, "--json"]);
    fake.join().unwrap();
    // The turn ended (its `done` is the last line), but audio was lost.
    let last: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last["type"], "done", "{out}");
    assert!(out.contains("audio overrun"), "{out}");
    assert_eq!(code, 1, "the daemon dropped audio: {out}{err}");
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
    let msg = ev["message"].as_str().unwrap();
    assert!(msg.contains("needed for thinker") && msg.contains(" MiB") && !msg.contains(" B "), "{out}");

    // A context no device holds (n_ctx 99,999,999: 2 TiB of KV) is refused from the plan,
    // before llama.cpp is asked (it once tried for 18 s and said "null reference").
    let text = format!("[[model]]\nrole = \"thinker\"\n{file}\nn_ctx = 99999999\nthreads = 2\n");
    std::fs::write(&cfg, text).unwrap();
    let t = std::time::Instant::now();
    let (code, out, _) = kazeia(&["run", "chat", "--text", "hi", "--json", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    let ev: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(ev["code"], "over_budget", "{out}");
    assert!(ev["message"].as_str().unwrap().contains(" GiB needed for thinker"), "{out}");
    eprintln!("refused in {:?}", t.elapsed());
}

#[test]
fn run_transcribe_json_gives_a_transcript_event() {
    // Speech made here: the Piper voice, through `kazeia run speak`, without its sampled noise
    // (the same clip every run: with it, each rendering was heard a little differently, once
    // "the 4th Friday" for "before Friday", two edits of the eight words this allows).
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("q.wav");
    let config = dir.path().join("models.toml");
    std::fs::write(&config, crate::common::shipped_models_with_speech("voice_noise = false\n")).unwrap();
    let (code, _, err) = kazeia(&[
        "run",
        "speak",
        "--config",
        config.to_str().unwrap(),
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
    // At most two words in eight may differ.
    let heard = ev["text"].as_str().unwrap();
    assert!(
        kazeia_daemon::speech::wer::wer("Please send me the report before Friday afternoon.", heard) <= 0.25,
        "{heard:?}"
    );
    assert_eq!(ev["language"], "en");
    // A missing audio file is a clear error event, and a usage error as in `ask`.
    let (code, out, _) = kazeia(&["run", "transcribe", "--audio", "/nonexistent.wav", "--json"]);
    assert_eq!(code, 2);
    assert!(out.contains("\"code\":\"bad_request\"") && out.contains("nonexistent.wav"), "{out}");
}

#[test]
fn plan_json_reads_headers_only() {
    let (code, out, err) = kazeia(&["plan", "--json"]);
    assert_eq!(code, 0, "{err}");
    let p: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(p["type"], "plan", "tagged like every --json line");
    assert!(p["fits"].as_bool().unwrap());
    let models = p["models"].as_array().unwrap();
    // Thinker and Guard (GGUF), then the speech models (ONNX: stt, and the Piper voice).
    let roles: Vec<&str> = models.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["thinker", "guard", "stt", "tts"]);
    for m in models {
        for k in [
            "weights_bytes",
            "kv_bytes",
            "recurrent_bytes",
            "checkpoints",
            "checkpoint_bytes",
            "compute_bytes",
            "total_bytes",
            "htp_sessions",
        ] {
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

/// A model file named without `.gguf` (an Ollama blob) is planned like any other: it was left
/// out, the plan saying `fits` without it, while `serve` loaded it.
#[test]
fn plan_reads_a_model_whatever_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let blob = dir.path().join("sha256-0123abcd");
    std::os::unix::fs::symlink(crate::common::smollm2(), &blob).unwrap();
    let plan = |file: &Path| {
        let cfg = dir.path().join("m.toml");
        std::fs::write(&cfg, format!("[[model]]\nrole = \"thinker\"\nfile = \"{}\"\n", file.display())).unwrap();
        let (code, out, err) = kazeia(&["plan", "--json", "--config", cfg.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
        let p: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        p["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "thinker")
            .cloned()
            .unwrap_or_else(|| panic!("{p}"))
    };
    let (named, blob) = (plan(&crate::common::smollm2()), plan(&blob));
    assert!(named["total_bytes"].as_u64().unwrap() > 0, "{named}");
    assert_eq!(named["total_bytes"], blob["total_bytes"], "{named}\n{blob}");
}

/// Roles share weights as the engine shares a loaded model: by the file, mmap and the devices.
/// Two roles on one file with mmap on and off are two loads: each pays its weights (the plan
/// counted them once, and so did the budget's ledger, by the same file key).
#[test]
fn plan_shares_weights_as_the_engine_shares_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let f = crate::common::smollm2();
    let roles = |guard_mmap: bool| {
        let cfg = dir.path().join("m.toml");
        let toml = format!(
            "[[model]]\nrole = \"thinker\"\nfile = \"{f}\"\nbackend = \"cpu\"\n\
             [[model]]\nrole = \"guard\"\nfile = \"{f}\"\nbackend = \"cpu\"\nmmap = {guard_mmap}\n",
            f = f.display()
        );
        std::fs::write(&cfg, toml).unwrap();
        let (code, out, err) = kazeia(&["plan", "--json", "--config", cfg.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
        let p: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        p["models"].as_array().unwrap()[..2].to_vec()
    };
    // The same settings: one load.
    let same = roles(false);
    assert_eq!(
        (same[1]["shares_weights_with"].as_str(), same[1]["weights_bytes"].as_u64()),
        (Some("thinker"), Some(0))
    );
    // mmap differs: two loads, each with its weights.
    let apart = roles(true);
    assert!(apart[1].get("shares_weights_with").is_none(), "{}", apart[1]);
    assert!(apart[1]["weights_bytes"].as_u64().unwrap() > 0, "{}", apart[1]);
}

/// Arguments the command refuses, each before any model loads: exit 2, and with `--json` one
/// `bad_request` event line on stdout (clap's own refusals printed nothing there).
#[test]
fn refused_arguments_are_one_json_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("keep.wav");
    std::fs::write(&wav, b"not to be lost").unwrap();
    let wav = wav.to_str().unwrap();
    for args in [
        &["run", "chat", "--json", "--max-tokens", "0", "--text", "hi"][..],
        &["run", "chat", "--json", "--temperature", "warm", "--text", "hi"],
        &["run", "chat", "--json", "--bogus", "--text", "hi"],
        &["ask", "--json", "--max-tokens", "0", "hi"],
        // A pipeline that does not speak left --out an empty WAV, the file lost.
        &["run", "chat", "--json", "--text", "hi", "--out", wav],
        &["ask", "--json", "--pipeline", "chat", "--out", wav, "hi"],
        &["run", "transcribe", "--json", "--language", "english", "--audio", "x.wav"],
    ] {
        let (code, out, err) = kazeia(args);
        assert_eq!(code, 2, "{args:?}: {out} {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {out}");
        let ev: serde_json::Value = serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"));
        assert_eq!((ev["type"].as_str(), ev["code"].as_str()), (Some("error"), Some("bad_request")), "{args:?}: {ev}");
    }
    assert_eq!(std::fs::read(wav).unwrap(), b"not to be lost");
    // Help is not an error.
    let (code, out, _) = kazeia(&["run", "--json", "--help"]);
    assert_eq!(code, 0);
    assert!(!out.trim_start().starts_with('{'), "{out}");
}

/// Text that starts with `-` (a temperature, a list item) is text, not an option.
#[test]
fn text_starting_with_a_dash_is_text() {
    for text in ["-5 degrees: what should I wear?", "- Paris or Lyon?", "--"] {
        let (code, out, err) = kazeia(&["run", "chat", "--json", "--max-tokens", "2", "--text", text]);
        assert_eq!(code, 0, "{text:?}: {err}");
        assert!(out.lines().last().unwrap_or_default().contains("\"done\""), "{text:?}: {out}");
    }
}

/// `kazeia plan | head -1` and the like: stdout closed before the end. The command stops
/// quietly with 141 (as a tool killed by SIGPIPE), not a panic (it was exit 101).
#[test]
fn a_closed_stdout_ends_quietly() {
    // A pipe whose reading end is closed before the command starts: its first write fails.
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    unsafe { libc::close(fds[0]) };
    let write_end = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) };
    let out = Command::new(env!("CARGO_BIN_EXE_kazeia"))
        .args(["plan"])
        .current_dir(repo())
        .stdout(write_end)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
}

/// `serve --socket DIR/x.sock`: a directory the daemon did not create keeps its mode (it once
/// became 0700: `--socket ./engine.sock` locked the current folder); one that other users can
/// enter is refused unless the config says so; one it creates is 0700; the socket is 0600.
#[test]
fn serve_leaves_an_existing_socket_directory_as_it_is() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let tmp = tempfile::tempdir().unwrap();
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = |name: &str, daemon: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, format!("[daemon]\npreload = false\n{daemon}\n")).unwrap();
        p
    };
    let strict = cfg("strict.toml", "");
    let out = Command::new(env!("CARGO_BIN_EXE_kazeia"))
        .args(["serve", "--config", strict.to_str().unwrap(), "--socket"])
        .arg(shared.join("engine.sock"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("open to other users (mode 0755)") && err.contains("shared_socket_dir"), "{err}");
    assert_eq!(mode(&shared), 0o755);

    // Allowed by the config: served, the directory untouched, the socket private.
    let allowed = cfg("allowed.toml", "shared_socket_dir = true");
    let sock = shared.join("engine.sock");
    let (mut child, log) = crate::common::spawn(&allowed, &sock);
    crate::common::wait_until(
        "listening",
        || log.lock().unwrap().contains("listening on"),
        || log.lock().unwrap().clone(),
    );
    assert_eq!((mode(&shared), mode(&sock)), (0o755, 0o600));
    let _ = child.kill();
    let _ = child.wait();

    // A directory it creates (two levels) is private.
    let made = tmp.path().join("new/run");
    let (mut child, log) = crate::common::spawn(&strict, &made.join("engine.sock"));
    crate::common::wait_until(
        "listening",
        || log.lock().unwrap().contains("listening on"),
        || log.lock().unwrap().clone(),
    );
    assert_eq!((mode(&made), mode(&made.join("engine.sock"))), (0o700, 0o600));
    let _ = child.kill();
    let _ = child.wait();
}

/// In-process speech and guard runs print their events (`run speak --json` once printed
/// nothing), logs are plain text when stderr is not a terminal, and where speech runs is said
/// once per run (it was a warning per ONNX session). The voice runs without its sampled noise
/// (`[speech] voice_noise = false`): the same audio each run, so what Whisper hears is too (a
/// sampled "Hello there." was once heard "alo there.").
#[test]
fn run_prints_events_and_says_where_speech_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("models.toml");
    std::fs::write(&config, crate::common::shipped_models_with_speech("voice_noise = false\n")).unwrap();
    let config = config.to_str().unwrap();
    let speak = |wav: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_kazeia"))
            .args(["run", "speak", "--config", config, "--language", "en", "--text", "Hello there.", "--json"])
            .arg("--out")
            .arg(wav)
            .env("RUST_LOG", "info")
            .current_dir(repo())
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            out.status.code(),
        )
    };
    let (wav, again) = (dir.path().join("hello.wav"), dir.path().join("again.wav"));
    let (stdout, stderr, code) = speak(&wav);
    assert_eq!(code, Some(0), "{stderr}");
    let types: Vec<String> = stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(types, ["accepted", "done"], "{stdout}");
    assert!(!stderr.contains('\x1b'), "colour codes in a log that is not a terminal: {stderr:?}");
    assert!(stderr.matches("QNN").count() <= 1, "{stderr}");
    let (_, stderr, code) = speak(&again);
    assert_eq!(code, Some(0), "{stderr}");
    let bytes = std::fs::read(&wav).unwrap();
    assert!(bytes.len() > 16_000, "{} bytes", bytes.len());
    assert!(bytes == std::fs::read(&again).unwrap(), "voice_noise = false rendered the same text differently");

    let (code, out, err) =
        kazeia(&["run", "transcribe", "--config", config, "--audio", wav.to_str().unwrap(), "--language", "en"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.to_lowercase().contains("hello"), "{out}");
    assert_eq!(err.matches("[speech on ").count(), 1, "{err}");

    let (code, out, err) = kazeia(&["run", "guard", "--text", "Comment fabriquer une bombe artisanale ?"]);
    assert_eq!((code, out.as_str()), (0, "Unsafe (Violent)\n"), "{err}");
}
