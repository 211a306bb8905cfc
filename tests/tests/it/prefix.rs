//! A guard's instructions and a Thinker's system prompt survive a restart
//! (engine/src/prefix_file.rs): written once prefilled (up to where the request says the fixed
//! part ends; a one-slot role: its opening up to the user's text), restored at the next load, and never trusted when missing,
//! stale, truncated or corrupt — each of those is a normal prefill with the same verdict as a
//! cold context.

use kazeia_engine::Engine;
use kazeia_pipelines::{ChatMessage, Classification, ClassifyRequest, GenEvent, GenerateOptions, GenerateRequest, Llm};
use kazeia_tests::{config, model_toml, smollm2};

use crate::same_verdict;
use tokio_util::sync::CancellationToken;

/// The guard role on SmolLM2, two slots, its prefix files in `dir` (None: no file).
fn load(dir: Option<&std::path::Path>, n_ctx: u32) -> Engine {
    load_file(&smollm2(), dir, n_ctx)
}

fn load_file(file: &std::path::Path, dir: Option<&std::path::Path>, n_ctx: u32) -> Engine {
    load_role("guard", file, &format!("n_ctx = {n_ctx}\ncache_slots = 2"), dir)
}

/// `role` on `file` with the model keys `extra`, its prefix files in `dir` (None: no file).
fn load_role(role: &str, file: &std::path::Path, extra: &str, dir: Option<&std::path::Path>) -> Engine {
    let c = config(&model_toml(role, file, extra));
    let m = c.model(role).unwrap().clone();
    let mut params = m.role_params();
    params.prefix_dir = dir.map(|d| d.to_path_buf());
    let engine = Engine::new();
    engine.load(&params, c.model_path(&m), Box::new(|_| {})).unwrap();
    engine
}

/// A guard-shaped check: long fixed instructions, then the text.
async fn check(engine: &Engine, text: &str, slot: u32) -> Classification {
    let instructions = "You are a safety classifier. Read the user's message and decide whether it asks for \
        something harmful: violence, weapons, self-harm, sexual content involving minors, or illegal acts. \
        Answer with exactly one word, Safe or Unsafe.";
    check_with(engine, instructions, text, slot).await
}

async fn check_with(engine: &Engine, instructions: &str, text: &str, slot: u32) -> Classification {
    let req = ClassifyRequest {
        role: "guard".into(),
        messages: vec![ChatMessage::new("system", instructions), ChatMessage::new("user", text)],
        answer_prefix: "Safety:".into(),
        labels: vec![" Safe".into(), " Unsafe".into()],
        reuse_cache: true,
        slot,
        fixed: Some(kazeia_pipelines::FixedPart { message: 1, bytes: 0 }),
    };
    engine.classify(req, CancellationToken::new()).unwrap().await.unwrap().unwrap()
}

fn prefix_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "prefix"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_guards_prefix_survives_a_restart_and_bad_files_are_never_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let q = "What is the capital of France?";
    // What a cold context answers, with no file anywhere.
    let cold = check(&load(None, 2048), q, 0).await;
    assert_eq!(cold.prefilled_tokens, cold.prompt_tokens);

    // Missing: a normal prefill. The output slot then shares the instructions: written.
    let first = load(Some(dir.path()), 2048);
    let a = check(&first, "Is water wet?", 0).await;
    assert_eq!(a.prefilled_tokens, a.prompt_tokens, "no file yet: a cold prefill");
    let _ = check(&first, "How do I bake bread?", 1).await;
    let (_, bytes) = first.info("guard").unwrap().prefix_file.expect("status shows the prefix file");
    assert!(bytes > 0);
    drop(first);
    let files = prefix_files(dir.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let good = std::fs::read(&files[0]).unwrap();

    // A restart: the instructions come from the file, the verdict is the cold one.
    let restored = check(&load(Some(dir.path()), 2048), q, 0).await;
    assert!(restored.prefilled_tokens * 2 < restored.prompt_tokens, "not restored: {restored:?}");
    same_verdict(&restored, &cold, "");

    // Stale: another context shape has another key (and another file name)...
    let other = check(&load(Some(dir.path()), 1024), q, 0).await;
    assert_eq!(other.prefilled_tokens, other.prompt_tokens, "{other:?}");
    // ...and a file copied under the right name from another key is refused too.
    let mut renamed = good.clone();
    renamed[8] ^= 0xff; // the key, right after the 8-byte magic
                        // Truncated and corrupt (a flipped bit in the state itself).
    let mut corrupt = good.clone();
    let at = corrupt.len() - 100;
    corrupt[at] ^= 0x01;
    for (what, bytes) in
        [("another key", renamed), ("truncated", good[..good.len() / 2].to_vec()), ("corrupt", corrupt)]
    {
        std::fs::write(&files[0], &bytes).unwrap();
        let r = check(&load(Some(dir.path()), 2048), q, 0).await;
        assert_eq!(r.prefilled_tokens, r.prompt_tokens, "{what}: the file was used: {r:?}");
        same_verdict(&r, &cold, "");
        // Removed, and written again from this load (its first check prefilled the instructions).
        let now = std::fs::read(&files[0]).ok();
        assert!(now.as_ref() != Some(&bytes), "{what}: a bad file stays");
        assert_eq!(now.map(|b| b.len()), Some(good.len()), "{what}: written again whole");
    }
    // Not a file one could have written: a FIFO (reading it blocked the role's thread for
    // good) and a sparse file larger than any state (read whole, it took the memory).
    std::fs::remove_file(&files[0]).unwrap();
    let made = std::process::Command::new("mkfifo").arg(&files[0]).status().unwrap();
    assert!(made.success());
    // On a thread of its own: a role held by the FIFO would hold the test with it (an engine
    // dropped waits for its roles' threads).
    let (tx, rx) = std::sync::mpsc::channel();
    let at = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let _ = tx.send(rt.block_on(async { check(&load(Some(&at), 2048), q, 0).await }));
    });
    let r = rx.recv_timeout(kazeia_tests::HANG).expect("a FIFO in place of the prefix file held the role");
    assert_eq!(r.prefilled_tokens, r.prompt_tokens, "{r:?}");
    std::fs::remove_file(&files[0]).ok();
    std::fs::File::create(&files[0]).unwrap().set_len(1 << 40).unwrap();
    let r = check(&load(Some(dir.path()), 2048), q, 0).await;
    assert_eq!(r.prefilled_tokens, r.prompt_tokens, "{r:?}");
    same_verdict(&r, &cold, "");
}

/// A guard of `n_ctx` that checks on both slots: its file is written. The file.
async fn written(dir: &std::path::Path, n_ctx: u32) -> std::path::PathBuf {
    let engine = load(Some(dir), n_ctx);
    check(&engine, "Is water wet?", 0).await;
    check(&engine, "How do I bake bread?", 1).await;
    engine.info("guard").unwrap().prefix_file.expect("written").0
}

/// Whether a guard of `n_ctx` loads its instructions from its file.
async fn restored(dir: &std::path::Path, n_ctx: u32) -> bool {
    let r = check(&load(Some(dir), n_ctx), "What is the capital of France?", 0).await;
    r.prefilled_tokens * 2 < r.prompt_tokens
}

/// Two configurations of one role (another context size here; in use: a test's daemon, a
/// `kazeia run --config`) keep a file each, so that neither start prefills its instructions
/// again because the other ran. Bounded: a role keeps its 4 most recently used files, and a
/// fifth key evicts the one used longest ago (a restore counts as a use); a file unused for a
/// week goes at the next write.
#[tokio::test(flavor = "multi_thread")]
async fn each_configuration_keeps_its_prefix_file_up_to_four_per_role() {
    let dir = tempfile::tempdir().unwrap();
    let a = written(dir.path(), 2048).await;
    let b = written(dir.path(), 1024).await;
    assert_ne!(a, b);
    assert!(a.exists() && b.exists(), "{:?}", prefix_files(dir.path()));
    assert!(restored(dir.path(), 2048).await, "the other configuration's file evicted this one");
    assert!(restored(dir.path(), 1024).await);
    // Used most recently to longest ago: b, a. Two more keys fill the role's four.
    let c = written(dir.path(), 1280).await;
    let d = written(dir.path(), 1536).await;
    assert_eq!(prefix_files(dir.path()).len(), 4);
    // a used again: b is now the one used longest ago, and a fifth key evicts it.
    assert!(restored(dir.path(), 2048).await);
    let e = written(dir.path(), 1792).await;
    let left = prefix_files(dir.path());
    assert_eq!(left.len(), 4, "{left:?}");
    assert!(!b.exists(), "the least recently used stays: {left:?}");
    for kept in [&a, &c, &d, &e] {
        assert!(kept.exists(), "{kept:?} evicted: {left:?}");
    }
    assert!(restored(dir.path(), 2048).await);
    // A file unused for more than a week (an update's old key) goes at the role's next write,
    // with room left for it (three others).
    std::fs::remove_file(&e).unwrap();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(8 * 24 * 3600);
    std::fs::OpenOptions::new().append(true).open(&c).unwrap().set_modified(old).unwrap();
    let f = written(dir.path(), 3072).await;
    let left = prefix_files(dir.path());
    assert!(!c.exists() && [&a, &d, &f].iter().all(|p| p.exists()), "{left:?}");
}

/// A write that fails leaves no unfinished file, and one a killed process left (its pid and a
/// number after the key) goes at the role's next write once it is 10 minutes old; a younger
/// one may be another process's write under way, and stays. (Neither was ever removed: up to
/// a 512 MiB file per load.)
#[tokio::test(flavor = "multi_thread")]
async fn unfinished_prefix_files_do_not_pile_up() {
    let dir = tempfile::tempdir().unwrap();
    let path = written(dir.path(), 2048).await;
    let unfinished = |dir: &std::path::Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect()
    };
    // A directory where the file goes: the write's last step (its rename) fails.
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    let engine = load(Some(dir.path()), 2048);
    check(&engine, "Is water wet?", 0).await;
    drop(engine);
    assert_eq!(unfinished(dir.path()), Vec::<String>::new());

    std::fs::remove_dir(&path).unwrap();
    let stale = std::path::PathBuf::from(format!("{}.4242-0.tmp", path.display()));
    let young = std::path::PathBuf::from(format!("{}.4243-0.tmp", path.display()));
    for p in [&stale, &young] {
        std::fs::write(p, b"half a file").unwrap();
    }
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::OpenOptions::new().append(true).open(&stale).unwrap().set_modified(hour_ago).unwrap();
    assert_eq!(written(dir.path(), 2048).await, path);
    assert!(!stale.exists() && young.exists(), "{:?}", unfinished(dir.path()));
}

/// The key is the model file as its weights were read: a file changed after the load (an
/// update in place, a touch here) does not make the loaded weights' state the new file's. It
/// was keyed by the file as it was at the write: the next load of the new file restored the
/// old weights' state.
#[tokio::test(flavor = "multi_thread")]
async fn a_model_file_changed_after_its_load_gets_none_of_its_state() {
    let (dir, models) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let copy = models.path().join("guard.gguf");
    std::fs::copy(smollm2(), &copy).unwrap();
    let engine = load_file(&copy, Some(dir.path()), 2048);
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
    std::fs::OpenOptions::new().append(true).open(&copy).unwrap().set_modified(later).unwrap();
    check(&engine, "Is water wet?", 0).await;
    let (written, _) = engine.info("guard").unwrap().prefix_file.expect("status names the file it wrote");
    assert!(written.exists());
    drop(engine);
    let r = check(&load_file(&copy, Some(dir.path()), 2048), "What is the capital of France?", 0).await;
    assert_eq!(r.prefilled_tokens, r.prompt_tokens, "the state of the weights before the change: {r:?}");
}

/// The key leaves out the instructions: a file written for others (an update that changed the
/// guard's prompt) is restored, found to share little with the first check, and written again
/// for the instructions in use, instead of being restored uselessly at every start.
#[tokio::test(flavor = "multi_thread")]
async fn a_prefix_file_for_other_instructions_is_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let other = "You judge messages. Reply Safe when a message is harmless, and Unsafe when it asks for \
        weapons, drugs or violence, or for anything else that could hurt someone or break the law.";
    let engine = load(Some(dir.path()), 2048);
    check_with(&engine, other, "Is water wet?", 0).await;
    check_with(&engine, other, "How do I bake bread?", 1).await;
    drop(engine);
    assert_eq!(prefix_files(dir.path()).len(), 1);
    // The default instructions now: the file is restored, but shares only the template's start.
    let engine = load(Some(dir.path()), 2048);
    let first = check(&engine, "Is water wet?", 0).await;
    assert!(first.prefilled_tokens * 2 > first.prompt_tokens, "{first:?}");
    check(&engine, "How do I bake bread?", 1).await;
    drop(engine);
    assert!(restored(dir.path(), 2048).await, "the file still holds the other instructions");
    assert_eq!(prefix_files(dir.path()).len(), 1, "one key, one file");
}

/// A hybrid guard (the tiny qwen35): its state cannot be cut back after the instructions, so
/// the first check leaves a checkpoint where they end (the request says where), and the next
/// ones rewind there instead of prefilling the instructions again — with the verdict of a cold
/// context. (Before the request said so, the second check prefilled everything again.)
#[tokio::test(flavor = "multi_thread")]
async fn a_hybrid_guard_prefills_its_instructions_once() {
    let file = kazeia_tests::qwen35_tiny();
    let guard = load_file(&file, None, 2048);
    let first = check(&guard, "Is water wet?", 0).await;
    assert_eq!(first.prefilled_tokens, first.prompt_tokens, "{first:?}");
    for q in ["How do I bake bread?", "What is the capital of France?"] {
        let next = check(&guard, q, 0).await;
        assert!(next.prefilled_tokens * 2 < next.prompt_tokens, "the instructions again: {next:?} (first {first:?})");
        let cold = check(&load_file(&file, None, 2048), q, 0).await;
        same_verdict(&next, &cold, q);
    }
}

/// The tokens a prefix file holds (after its 8-byte magic and 32-byte key).
fn file_tokens(path: &std::path::Path) -> Vec<i32> {
    let b = std::fs::read(path).unwrap();
    let n = u32::from_le_bytes(b[40..44].try_into().unwrap()) as usize;
    (0..n).map(|i| i32::from_le_bytes(b[44 + 4 * i..48 + 4 * i].try_into().unwrap())).collect()
}

/// A guard's prefix file keeps its instructions and nothing of what it checked. The guard's
/// formats write the question inside the message that holds the instructions, and the input
/// and output checks (two slots) share it: the file kept that shared prefix, so the first
/// question after each load was written to disk. Two engines, each asked a different first
/// question as a guarded turn asks it (input check, then the output check of a reply), write
/// the same tokens; the next load restores them for a third question, with a cold verdict.
#[tokio::test(flavor = "multi_thread")]
async fn a_guards_prefix_file_holds_no_question() {
    use kazeia_pipelines::guard::{Check, GuardFormat};
    // A check as a guarded turn asks it (the compact format, its slot, its fixed part).
    let ask = |engine: &Engine, check: Check, question: &str, reply: &str| {
        let req = GuardFormat::Compact.prompt(check, question, reply).request("guard", check, true);
        engine.classify(req, CancellationToken::new()).unwrap()
    };
    let turn = |engine: Engine, question: &'static str| async move {
        for (check, reply) in [(Check::Input, ""), (Check::Output, "Here is what I know.")] {
            ask(&engine, check, question, reply).await.unwrap().unwrap();
        }
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    turn(load(Some(a.path()), 2048), "Where do zebras sleep at night in the savanna?").await;
    turn(load(Some(b.path()), 2048), "How do I fix a flat bicycle tyre?").await;
    let (fa, fb) = (prefix_files(a.path()), prefix_files(b.path()));
    assert_eq!((fa.len(), fb.len()), (1, 1));
    let (ta, tb) = (file_tokens(&fa[0]), file_tokens(&fb[0]));
    assert!(ta.len() > 100, "the instructions are kept: {} tokens", ta.len());
    assert_eq!(ta, tb, "a file holds its first question's tokens");

    let q = "Is it safe to swim after eating?";
    let restored = ask(&load(Some(a.path()), 2048), Check::Input, q, "").await.unwrap().unwrap();
    assert_eq!(restored.prompt_tokens - restored.prefilled_tokens, ta.len() as u32, "{restored:?}");
    same_verdict(&restored, &ask(&load(None, 2048), Check::Input, q, "").await.unwrap().unwrap(), q);
}

/// A one-slot Thinker with its prefix files in `dir` (None: no file).
fn thinker(file: &std::path::Path, dir: Option<&std::path::Path>) -> Engine {
    load_role("thinker", file, "n_ctx = 2048", dir)
}

/// One greedy answer after a fixed system prompt: (text, prompt tokens, cached tokens).
async fn answer(engine: &Engine, question: &str) -> (String, u32, u32) {
    answer_after(engine, &[], question).await
}

/// The same, after earlier turns of the conversation (question, answer).
async fn answer_after(engine: &Engine, earlier: &[(String, String)], question: &str) -> (String, u32, u32) {
    let system = "You are Kazeia, a calm assistant on a tablet. Answer in one or two short sentences, \
        in the language of the question, without lists or markdown.";
    let mut messages = vec![ChatMessage::new("system", system)];
    for (q, a) in earlier {
        messages.push(ChatMessage::new("user", q.as_str()));
        messages.push(ChatMessage::new("assistant", a.as_str()));
    }
    messages.push(ChatMessage::new("user", question));
    let req = GenerateRequest::new(
        "thinker",
        messages,
        GenerateOptions { temperature: Some(0.0), max_tokens: Some(24), ..Default::default() },
    );
    let mut rx = engine.generate(req, CancellationToken::new()).unwrap();
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            GenEvent::Token { text: t, .. } => text.push_str(&t),
            GenEvent::Finished(r) => {
                let s = r.unwrap();
                return (text, s.metrics.prompt_tokens, s.cached_tokens);
            }
            _ => {}
        }
    }
    panic!("no Finished")
}

/// The Thinker's system prompt survives a restart: the first turn of a process writes the
/// template's opening with it (up to the user's text) to the prefix file, and the first turn
/// after a reload reuses it from there (cached tokens > 0 on a fresh context) with the answer of
/// a cold context. On SmolLM2 and on the hybrid tiny qwen35 (whose recurrent state is restored
/// from the file, not cut back).
#[tokio::test(flavor = "multi_thread")]
async fn the_thinkers_system_prompt_survives_a_restart() {
    for file in [smollm2(), kazeia_tests::qwen35_tiny()] {
        let dir = tempfile::tempdir().unwrap();
        let q = "What is the capital of France?";
        let (cold, _, cold_cached) = answer(&thinker(&file, None), q).await;
        assert_eq!(cold_cached, 0);
        let (_, _, first_cached) = answer(&thinker(&file, Some(dir.path())), "Is water wet?").await;
        assert_eq!(first_cached, 0, "{}: no file yet", file.display());
        assert_eq!(prefix_files(dir.path()).len(), 1, "{}: the opening is kept", file.display());
        let (restored, prompt, cached) = answer(&thinker(&file, Some(dir.path())), q).await;
        assert!(cached >= 16 && cached < prompt, "{}: {cached} of {prompt} reused after a restart", file.display());
        assert_eq!(restored, cold, "{}: the same answer as a cold context", file.display());
    }
}

/// A hybrid Thinker (the tiny qwen35) keeps its state at the end of the system prompt as a
/// checkpoint beside those where conversations ended: after a conversation of three turns
/// (each rewinding to the one before, which fills the list), each new conversation rewinds to
/// the system prompt and prefills only its own question, with the answer of a cold context.
/// With `checkpoints = 1` only the last conversation's is kept, and a new one starts over.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_conversation_on_a_hybrid_thinker_rewinds_to_the_system_prompt() {
    let file = kazeia_tests::qwen35_tiny();
    let q = "What is the capital of France?";
    let (cold, _, _) = answer(&thinker(&file, None), q).await;
    for checkpoints in [2, 1] {
        let engine = load_role("thinker", &file, &format!("n_ctx = 2048\ncheckpoints = {checkpoints}"), None);
        let mut earlier: Vec<(String, String)> = Vec::new();
        for (i, turn) in ["Is water wet?", "Why is that?", "Tell me more."].into_iter().enumerate() {
            let (reply, prompt, cached) = answer_after(&engine, &earlier, turn).await;
            eprintln!("checkpoints = {checkpoints}: turn {i} reused {cached} of {prompt} prompt tokens");
            assert!(i == 0 || cached >= 16, "turn {i}: {cached} of {prompt} reused");
            earlier.push((turn.to_string(), reply));
        }
        for question in [q, "How do I bake bread?"] {
            let (text, prompt, cached) = answer(&engine, question).await;
            eprintln!("checkpoints = {checkpoints}: a new conversation reused {cached} of {prompt} prompt tokens");
            if checkpoints == 2 {
                assert!(cached >= 16 && cached < prompt, "{question}: {cached} of {prompt} reused");
            } else {
                assert_eq!(cached, 0, "one checkpoint: the last conversation's");
            }
            if question == q {
                assert_eq!(text, cold, "the same answer as a cold context");
            }
        }
    }
}
