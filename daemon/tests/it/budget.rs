//! The budget under concurrency: language-model loads and an audio turn (which loads the speech
//! stack) race on a budget too small for all of them. Every status the daemon pushes meanwhile
//! must show `reserved_bytes` within `budget_bytes`: a load takes its bytes in the ledger before
//! it starts (it used to enter the ledger only after a load of seconds, so a concurrent load saw
//! the memory as free). Language-model loads take turns under one lock, the speech stack loads
//! under its own: the race that matters is a model's load against the speech stack's.

use crate::common;

use common::{gemma3, settled, smollm2, Daemon};
use kazeia_ipc::{AudioFrame, AudioSpec, ErrorCode, Event, Frame, Incoming, ModelState, Request, TurnOptions};

/// Thinker (SmolLM2) and Guard (Gemma 3 270M): two files, so two reservations of weights.
fn models() -> String {
    format!(
        "[[model]]\nrole = \"thinker\"\nfile = \"{}\"\nn_ctx = 2048\nthreads = 2\nbackend = \"cpu\"\n\n\
         [[model]]\nrole = \"guard\"\nfile = \"{}\"\nn_ctx = 2048\nthreads = 2\nbackend = \"cpu\"\npriority = 90\n\n\
         [speech]\nlanguage = \"en\"\n",
        smollm2().display(),
        gemma3().display()
    )
}

/// Each row's planned bytes, from `kazeia plan --json` on the same models.
fn planned(dir: &std::path::Path) -> std::collections::HashMap<String, u64> {
    let cfg = dir.join("plan.toml");
    std::fs::write(&cfg, models()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kazeia"))
        .args(["plan", "--json", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("plan --json");
    plan["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap().to_string(), m["total_bytes"].as_u64().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn racing_loads_never_reserve_more_than_the_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let p = planned(tmp.path());
    // The speech stack loads Whisper, the VAD, the end-of-turn model and the voices of the
    // languages a reply may be in (here the Piper voice): `stt` + `tts` of the plan.
    let (thinker, guard, stt) = (p["thinker"], p["guard"], p["stt"] + p.get("tts").copied().unwrap_or(0));
    // Room for the speech stack and the larger model, not for all three.
    let budget = stt + thinker.max(guard) + (thinker.min(guard) / 2);
    assert!(budget < thinker + guard + stt && thinker + guard < budget);
    let last = race(budget, &["thinker", "guard"], false).await;
    let loaded = |role: &str| last.models.iter().any(|m| m.role == role && m.state == ModelState::Loaded);
    assert!(!(loaded("thinker") && loaded("guard") && loaded("stt")), "all three cannot fit: {last:?}");
}

/// Room for one of the Thinker and the speech stack. The audio turn starts once the Thinker is
/// loading (admitted): its bytes are taken, so the speech stack is refused. (With the Thinker's
/// bytes entered only after its load, the speech stack was admitted meanwhile and the ledger
/// ended over the budget: tools/break-tests `reserve-after-load`.)
#[tokio::test(flavor = "multi_thread")]
async fn a_model_load_and_the_speech_stack_never_share_room_for_one() {
    let tmp = tempfile::tempdir().unwrap();
    let p = planned(tmp.path());
    let (thinker, stt) = (p["thinker"], p["stt"] + p.get("tts").copied().unwrap_or(0));
    let budget = thinker.max(stt) + thinker.min(stt) / 2;
    let last = race(budget, &["thinker"], true).await;
    let loaded = |role: &str| last.models.iter().any(|m| m.role == role && m.state == ModelState::Loaded);
    assert!(!(loaded("thinker") && loaded("stt")), "both cannot fit: {last:?}");
}

/// Loads of `roles` and an audio turn, each from its own connection, on a daemon with this
/// budget: sent at once, or (`after_first_loading`) the turn once the first role shows
/// `loading`. Every refusal is `over_budget`; every status pushed meanwhile (each load's start
/// and end pushes one) and the settled one hold no more than the budget. The settled status.
async fn race(budget: u64, roles: &[&str], after_first_loading: bool) -> kazeia_ipc::StatusReport {
    let config = format!(
        "[daemon]\npreload = false\n\n[budget]\ndevice_ram = {}\nreserve_os = 0\nreserve_app = 0\n\n{}",
        budget,
        models()
    );
    let d = Daemon::start(&config);
    let watcher = d.client().await;
    let mut pushes = watcher.send(Request::Subscribe { id: "sub".into() }).await.unwrap();

    let mut clients = Vec::new();
    let mut streams = Vec::new();
    for role in roles {
        let c = d.client().await;
        streams.push(c.send(Request::Load { id: format!("load-{role}"), role: role.to_string() }).await.unwrap());
        clients.push(c);
    }
    let mut statuses = Vec::new();
    if after_first_loading {
        loop {
            // A guard against a hang, not a bound on the daemon: a refused load never shows it.
            let next = tokio::time::timeout(std::time::Duration::from_secs(120), pushes.recv());
            match next.await.expect("the first role never showed `loading`").expect("the subscription ended") {
                Incoming::Event(Event::Status { status, .. }) => {
                    let loading = status.models.iter().any(|m| m.role == roles[0] && m.state == ModelState::Loading);
                    statuses.push(status);
                    if loading {
                        break;
                    }
                }
                other => panic!("{other:?}"),
            }
        }
    }
    let v = d.client().await;
    let turn = Request::Turn {
        id: "v".into(),
        pipeline: "transcribe".into(),
        text: None,
        audio: Some(AudioSpec { sample_rate: 16_000, channels: 1 }),
        session: None,
        options: TurnOptions::default(),
    };
    streams.push(v.send(turn).await.unwrap());
    let frame =
        AudioFrame { id: "v".into(), sample_rate: 16_000, channels: 1, last: true, pcm: vec![0u8; 16_000].into() };
    v.send_frame(Frame::Audio(frame)).await.unwrap();

    let end = |mut rx: tokio::sync::mpsc::UnboundedReceiver<Incoming>| async move {
        while let Some(item) = rx.recv().await {
            match item {
                Incoming::Event(e @ (Event::Loaded { .. } | Event::Done { .. })) => return Ok(e),
                // The audio is silence: a turn admitted with its speech stack hears none.
                Incoming::Event(e @ Event::Error { code: ErrorCode::NoSpeech, .. }) => return Ok(e),
                Incoming::Event(Event::Error { code, is_final: true, .. }) => return Err(code),
                _ => {}
            }
        }
        panic!("connection closed")
    };
    let results = futures_util::future::join_all(streams.into_iter().map(end)).await;
    println!("{roles:?} then the audio turn: {results:?}");
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(*r, ErrorCode::OverBudget, "a refusal is over_budget\n{}", d.log());
    }

    let last = settled(&watcher).await;
    while let Ok(Incoming::Event(Event::Status { status, .. })) = pushes.try_recv() {
        statuses.push(status);
    }
    for status in &statuses {
        assert!(
            status.reserved_bytes <= status.budget_bytes,
            "{} reserved of a {} budget: {:?}",
            status.reserved_bytes,
            status.budget_bytes,
            status.models.iter().map(|m| (&m.role, m.state, m.reserved_bytes)).collect::<Vec<_>>()
        );
    }
    assert!(statuses.len() >= 2, "status pushes seen: {}", statuses.len());
    assert!(last.reserved_bytes <= last.budget_bytes, "settled: {last:?}");
    last
}
