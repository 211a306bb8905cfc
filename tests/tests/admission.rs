//! Admission and eviction with real models under a deliberately small budget.

use kazeia_daemon::server::Supervisor;
use kazeia_ipc::{ErrorCode, ModelState};
use kazeia_pipelines::{ChatMessage, GenerateOptions, GenerateRequest, Llm, Registry};
use kazeia_tests::{config, gemma3, smollm2};
use tokio_util::sync::CancellationToken;

/// A role on `file`; `sizes` overrides the default n_ctx 512 / ubatch 128.
fn role(name: &str, file: &std::path::Path, priority: u32, sizes: &str) -> String {
    let sizes = if sizes.is_empty() { "n_ctx = 512\nn_batch = 128\nn_ubatch = 128" } else { sizes };
    format!(
        "[[model]]\nrole = \"{name}\"\nfile = \"{}\"\nthreads = 2\nbackend = \"cpu\"\npriority = {priority}\n{sizes}\n",
        file.display()
    )
}

/// The supervisor measures a load as this process's RSS growth across it: a test loading or
/// unloading at the same time would move that figure (seen: `a` measured under 50 MB while the
/// keep-alive test unloaded). One test at a time in this process.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn state(sup: &Supervisor, r: &str) -> ModelState {
    sup.status().models.iter().find(|m| m.role == r).unwrap().state
}

#[tokio::test(flavor = "multi_thread")]
async fn small_budget_evicts_idle_by_priority_and_refuses_what_cannot_fit() {
    let _one = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("smollm2-copy.gguf");
    std::fs::copy(smollm2(), &copy).unwrap();
    // SmolLM2 here plans to ~134 MB, Gemma 3 to ~385 MB: two fit in 600 MB, not three.
    let text = format!(
        "[budget]\ndevice_ram = \"600MB\"\nreserve_os = 0\nreserve_app = 0\n{}{}{}{}{}",
        role("a", &smollm2(), 50, ""),
        role("b", &gemma3(), 40, ""),
        role("c", &copy, 60, ""),
        role("d", &gemma3(), 70, ""),
        role("huge", &gemma3(), 80, "n_ctx = 32768\nn_batch = 512\nn_ubatch = 512"),
    );
    let sup = Supervisor::new(config(&text), Registry::builtin());
    sup.ensure_loaded("a", |_| {}).await.unwrap();
    sup.ensure_loaded("b", |_| {}).await.unwrap();
    let st = sup.status();
    assert!(st.reserved_bytes <= st.budget_bytes, "{st:?}");
    assert!(st.models.iter().find(|m| m.role == "a").unwrap().measured_bytes.unwrap() > 50_000_000);

    // The third load evicts the idle, lowest-priority model.
    sup.ensure_loaded("c", |_| {}).await.unwrap();
    assert_eq!(
        (state(&sup, "a"), state(&sup, "b"), state(&sup, "c")),
        (ModelState::Loaded, ModelState::Unloaded, ModelState::Loaded)
    );

    // A lower-priority model never evicts higher ones: refused, with the listing.
    let e = sup.ensure_loaded("b", |_| {}).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::OverBudget);
    assert!(
        e.message.contains("a ") && e.message.contains("c ") && e.message.contains("needed for b"),
        "{}",
        e.message
    );

    // A model in use is never evicted: with `a` generating, `d` takes `c`'s place.
    let req = GenerateRequest::new(
        "a",
        vec![ChatMessage::new("user", "Tell me a long story.")],
        GenerateOptions { max_tokens: Some(2000), ignore_eos: true, ..Default::default() },
    );
    let busy = CancellationToken::new();
    let mut rx = sup.engine.generate(req, busy.clone()).unwrap();
    let _ = rx.recv().await;
    assert!(sup.engine.pending("a").unwrap() > 0);
    sup.ensure_loaded("d", |_| {}).await.unwrap();
    assert_eq!(
        (state(&sup, "a"), state(&sup, "c"), state(&sup, "d")),
        (ModelState::Loaded, ModelState::Unloaded, ModelState::Loaded)
    );
    busy.cancel();
    while rx.recv().await.is_some() {}

    // Impossible whatever is evicted: refused, saying what is resident and what is missing.
    let e = sup.ensure_loaded("huge", |_| {}).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::OverBudget);
    assert!(e.message.contains("resident: a ") && e.message.contains("needed for huge"), "{}", e.message);
    assert_eq!(state(&sup, "huge"), ModelState::Unloaded);

    // A turn's lease protects a role as a running job does, even while the role has no job
    // (a guard between its input and output checks): `c` may not evict a leased `a`.
    let lease = sup.lease(&["a".to_string()]).unwrap();
    assert_eq!(sup.engine.pending("a"), Some(0));
    let e = sup.ensure_loaded("c", |_| {}).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::OverBudget, "{}", e.message);
    assert_eq!(state(&sup, "a"), ModelState::Loaded);
    drop(lease);
    sup.ensure_loaded("c", |_| {}).await.unwrap();
    assert_eq!(
        (state(&sup, "a"), state(&sup, "c"), state(&sup, "d")),
        (ModelState::Unloaded, ModelState::Loaded, ModelState::Loaded)
    );
    let st = sup.status();
    assert!(st.reserved_bytes <= st.budget_bytes, "{st:?}");
}

/// A GGUF whose header reads but whose figures cannot be planned (here no layer count; a
/// `block_count` of 2^40 is refused the same way) is refused as `model_file`, and status shows
/// the role failed, with the reason naming the file (it said `unloaded`).
#[tokio::test(flavor = "multi_thread")]
async fn a_header_that_cannot_be_planned_fails_the_role_in_status() {
    let _one = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("headless.gguf");
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    let key = "general.architecture";
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&5u64.to_le_bytes());
    b.extend_from_slice(b"llama");
    std::fs::write(&file, b).unwrap();
    let sup = Supervisor::new(config(&role("a", &file, 50, "")), Registry::builtin());
    let e = sup.ensure_loaded("a", |_| {}).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::ModelFile, "{}", e.message);
    let row = sup.status().models.into_iter().find(|m| m.role == "a").unwrap();
    assert_eq!(row.state, ModelState::Failed);
    let why = row.error.unwrap();
    assert!(why.contains("headless.gguf") && why.contains("block_count"), "{why}");
    assert_eq!(sup.status().reserved_bytes, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn keep_alive_unloads_idle_models() {
    let _one = SERIAL.lock().await;
    let text = role("a", &smollm2(), 50, "n_ctx = 512\nkeep_alive = \"1h\"");
    let sup = Supervisor::new(config(&text), Registry::builtin());
    sup.ensure_loaded("a", |_| {}).await.unwrap();
    // The clock is given, not slept on: just after its last use the role stays; a keep-alive
    // later it goes, unless a turn holds it.
    let used = std::time::Instant::now();
    assert!(sup.expire_idle_at(used).await.is_empty());
    let later = used + std::time::Duration::from_secs(3601);
    let lease = sup.lease(&["a".to_string()]).unwrap();
    assert!(sup.expire_idle_at(later).await.is_empty());
    assert_eq!(state(&sup, "a"), ModelState::Loaded);
    drop(lease);
    assert_eq!(sup.expire_idle_at(later).await, vec!["a".to_string()]);
    assert_eq!(state(&sup, "a"), ModelState::Unloaded);
    assert_eq!(sup.status().reserved_bytes, 0);

    // A role is idle from the end of the turn that held it, not from that turn's start: a turn
    // longer than the keep-alive left the role to be unloaded as soon as it ended.
    sup.ensure_loaded("a", |_| {}).await.unwrap();
    let lease = sup.lease(&["a".to_string()]).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let ended = std::time::Instant::now();
    drop(lease);
    let hour = std::time::Duration::from_secs(3600);
    // A keep-alive after its start, less than one after its end: it stays.
    assert!(sup.expire_idle_at(ended + hour - std::time::Duration::from_millis(10)).await.is_empty());
    assert_eq!(state(&sup, "a"), ModelState::Loaded);
    assert_eq!(sup.expire_idle_at(ended + hour + std::time::Duration::from_secs(1)).await, vec!["a".to_string()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn low_pressure_sheds_idle_lower_priority_models_speech_and_sessions() {
    let _one = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.gguf");
    std::fs::copy(smollm2(), &copy).unwrap();
    // Low pressure whatever this machine has free; never critical.
    let text = format!(
        "[budget]\nlow_watermark = \"100000GiB\"\ncritical_watermark = 0\n{}{}",
        role("top", &smollm2(), 100, ""),
        role("minor", &copy, 10, "")
    );
    let sup = Supervisor::new(config(&text), Registry::builtin());
    sup.ensure_loaded("top", |_| {}).await.unwrap();
    sup.ensure_loaded("minor", |_| {}).await.unwrap();
    assert_eq!(sup.pressure_tick().await, kazeia_memory_budget::pressure::Level::Low);
    assert_eq!((state(&sup, "top"), state(&sup, "minor")), (ModelState::Loaded, ModelState::Unloaded));
    assert_eq!(sup.status().pressure, "low");

    // The speech models too (below the top role), but not while an audio turn holds them, nor
    // within a minute of the last one.
    let sup2 = sup.clone();
    tokio::task::spawn_blocking(move || sup2.speech().map(drop)).await.unwrap().unwrap();
    let speech = |sup: &Supervisor| state(sup, "stt");
    let later = || std::time::Instant::now() + kazeia_daemon::supervisor::SPEECH_IDLE_BEFORE_SHED;
    let held = sup.speech_use();
    sup.pressure_tick_at(later()).await;
    assert_eq!(speech(&sup), ModelState::Loaded, "shed while an audio turn held it");
    drop(held);
    sup.pressure_tick().await;
    assert_eq!(speech(&sup), ModelState::Loaded, "shed right after an audio turn");
    sup.pressure_tick_at(later()).await;
    assert_eq!(speech(&sup), ModelState::Unloaded);
    assert!(sup.status().models.iter().all(|m| m.role != "stt" || m.reserved_bytes.is_none()));
}
