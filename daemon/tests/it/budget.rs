//! The budget under concurrency: two language-model loads and an audio turn (which loads the
//! speech stack) race on a budget that holds any two of them but not all three. Every status
//! the daemon pushes meanwhile must show `reserved_bytes` within `budget_bytes`: a load takes
//! its bytes in the ledger before it starts (it used to enter the ledger only after a load of
//! seconds, so a concurrent load saw the memory as free).

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
    let (thinker, guard, stt) = (p["thinker"], p["guard"], p["stt"]);
    // Room for the speech stack and the larger model, not for all three.
    let budget = stt + thinker.max(guard) + (thinker.min(guard) / 2);
    assert!(budget < thinker + guard + stt && thinker + guard < budget);
    let config = format!(
        "[daemon]\npreload = false\n\n[budget]\ndevice_ram = {}\nreserve_os = 0\nreserve_app = 0\n\n{}",
        budget,
        models()
    );
    let d = Daemon::start(&config);
    let watcher = d.client().await;
    let mut pushes = watcher.send(Request::Subscribe { id: "sub".into() }).await.unwrap();

    // The three at once, each from its own connection.
    let (a, b, v) = (d.client().await, d.client().await, d.client().await);
    let mut la = a.send(Request::Load { id: "la".into(), role: "thinker".into() }).await.unwrap();
    let mut lb = b.send(Request::Load { id: "lb".into(), role: "guard".into() }).await.unwrap();
    let turn = Request::Turn {
        id: "v".into(),
        pipeline: "transcribe".into(),
        text: None,
        audio: Some(AudioSpec { sample_rate: 16_000, channels: 1 }),
        session: None,
        options: TurnOptions::default(),
    };
    let mut lv = v.send(turn).await.unwrap();
    let frame =
        AudioFrame { id: "v".into(), sample_rate: 16_000, channels: 1, last: true, pcm: vec![0u8; 16_000].into() };
    v.send_frame(Frame::Audio(frame)).await.unwrap();

    let end = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<Incoming>| {
        let mut rx = std::mem::replace(rx, tokio::sync::mpsc::unbounded_channel().1);
        async move {
            while let Some(item) = rx.recv().await {
                match item {
                    Incoming::Event(e @ (Event::Loaded { .. } | Event::Done { .. })) => return Ok(e),
                    Incoming::Event(Event::Error { code, is_final: true, .. }) => return Err(code),
                    _ => {}
                }
            }
            panic!("connection closed")
        }
    };
    let (ra, rb, rv) = tokio::join!(end(&mut la), end(&mut lb), end(&mut lv));
    println!("thinker {ra:?}\nguard {rb:?}\naudio turn {rv:?}");
    for r in [ra.as_ref().err(), rb.as_ref().err(), rv.as_ref().err()].into_iter().flatten() {
        assert_eq!(*r, ErrorCode::OverBudget, "a refusal is over_budget\n{}", d.log());
    }

    let last = settled(&watcher).await;
    // Every status pushed meanwhile (each load's start and end pushes one).
    let mut seen = 0;
    while let Ok(Incoming::Event(Event::Status { status, .. })) = pushes.try_recv() {
        seen += 1;
        assert!(
            status.reserved_bytes <= status.budget_bytes,
            "{} reserved of a {} budget: {:?}",
            status.reserved_bytes,
            status.budget_bytes,
            status.models.iter().map(|m| (&m.role, m.state, m.reserved_bytes)).collect::<Vec<_>>()
        );
    }
    assert!(seen >= 3, "status pushes seen: {seen}");
    assert!(last.reserved_bytes <= last.budget_bytes);
    let loaded = |role: &str| last.models.iter().any(|m| m.role == role && m.state == ModelState::Loaded);
    assert!(!(loaded("thinker") && loaded("guard") && loaded("stt")), "all three cannot fit: {last:?}");
}
