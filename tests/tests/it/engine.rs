//! The shared llama.cpp engine on real models: answers, cancellation, bad files.

use std::io::Write;
use std::time::{Duration, Instant};

use kazeia_engine::{Engine, LoadError};
use kazeia_ipc::{ErrorCode, Event, StopReason};
use kazeia_pipelines::{
    run_turn, ChatMessage, Engines, GenEvent, GenSummary, GenerateOptions, GenerateRequest, Llm, Registry, TurnInput,
};
use kazeia_tests::{config, model_toml, smollm2};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn load(engine: &Engine, toml: &str, role: &str) -> Result<(), LoadError> {
    let c = config(toml);
    let m = c.model(role).unwrap().clone();
    engine.load(&m.role_params(), c.model_path(&m), Box::new(|_| {})).map(|_| ())
}

async fn collect(mut rx: mpsc::UnboundedReceiver<GenEvent>) -> (Vec<GenEvent>, GenSummary) {
    let mut evs = Vec::new();
    while let Some(ev) = rx.recv().await {
        if let GenEvent::Finished(r) = ev {
            return (evs, r.expect("generation succeeds"));
        }
        evs.push(ev);
    }
    panic!("engine ended without Finished");
}

fn req(role: &str, text: &str, options: GenerateOptions) -> GenerateRequest {
    GenerateRequest::new(role, vec![ChatMessage::new("user", text)], options)
}

#[tokio::test(flavor = "multi_thread")]
async fn greedy_answer_names_paris() {
    // f16 KV (the default), then a q8_0 KV cache (keys and values): same answer.
    for kv in ["", "type_k = \"q8_0\"\ntype_v = \"q8_0\""] {
        greedy_paris(&format!("n_ctx = 1024\n{kv}")).await;
    }
}

async fn greedy_paris(extra: &str) {
    let engine = Engine::new();
    load(&engine, &model_toml("thinker", &smollm2(), extra), "thinker").unwrap();
    let pipeline = Registry::builtin().get("chat").unwrap().clone();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let input = TurnInput {
        text: "What is the capital of France? Answer in one short sentence.".into(),
        options: GenerateOptions { temperature: Some(0.0), ..Default::default() },
        ..Default::default()
    };
    run_turn(
        &pipeline,
        input,
        Engines { llm: &engine, policy: &kazeia_pipelines::GuardPolicy::default(), sessions: None },
        CancellationToken::new(),
        tx,
    )
    .await;
    let mut reply = String::new();
    let mut done = None;
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token { text, .. } => reply.push_str(&text),
            Event::Done { stop, metrics, .. } => done = Some((stop, metrics)),
            Event::Error { message, .. } => panic!("{message}"),
            other => panic!("the chat pipeline sent {other:?}"),
        }
    }
    let (stop, m) = done.expect("done event");
    assert!(reply.contains("Paris"), "reply: {reply:?}");
    assert_eq!(stop, StopReason::Eos);
    assert!(m.prompt_tokens > 10 && m.generated_tokens > 2 && m.decode_tok_s > 0.0 && m.prefill_tok_s > 0.0, "{m:?}");
    assert!(m.ttft_ms > 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_during_prefill_lands_within_one_chunk() {
    let engine = Engine::new();
    // Small chunks so that a long prompt takes many of them.
    load(&engine, &model_toml("thinker", &smollm2(), "n_ctx = 4096\nprefill_chunk = 32"), "thinker").unwrap();
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(300);
    let cancel = CancellationToken::new();
    let mut rx = engine.generate(req("thinker", &long, GenerateOptions::default()), cancel.clone()).unwrap();
    let (first_done, total) = match rx.recv().await.unwrap() {
        GenEvent::Prefill { done, total, .. } => (done, total),
        other => panic!("expected prefill progress, got {other:?}"),
    };
    assert!(total > 2000, "prompt of {total} tokens is not long enough for this test");
    let t_cancel = Instant::now();
    cancel.cancel();
    let mut after_cancel = 0;
    let mut last_done = first_done;
    let summary = loop {
        match rx.recv().await.unwrap() {
            GenEvent::Prefill { done, at, .. } => {
                last_done = done;
                if at > t_cancel {
                    after_cancel += 1;
                }
            }
            GenEvent::Token { .. } | GenEvent::Thinking { .. } => {
                panic!("no token may come after a cancel during prefill")
            }
            GenEvent::Finished(r) => break r.unwrap(),
        }
    };
    assert_eq!(summary.stop, StopReason::Cancelled);
    assert!(after_cancel <= 1, "{after_cancel} chunks finished after the cancel");
    assert_eq!(summary.prefilled_tokens, last_done);
    assert!(summary.prefilled_tokens < total, "prefill ran to the end ({total})");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_during_generation_lands_within_one_token() {
    let engine = Engine::new();
    load(&engine, &model_toml("thinker", &smollm2(), "n_ctx = 1024"), "thinker").unwrap();
    let cancel = CancellationToken::new();
    let opts =
        GenerateOptions { max_tokens: Some(400), ignore_eos: true, temperature: Some(0.8), ..Default::default() };
    let mut rx =
        engine.generate(req("thinker", "Tell me a very long story about a dragon.", opts), cancel.clone()).unwrap();
    let mut tokens = 0;
    let mut t_cancel = None;
    let mut after_cancel = 0;
    let summary = loop {
        match rx.recv().await.unwrap() {
            GenEvent::Prefill { .. } => {}
            GenEvent::Token { at, .. } => {
                tokens += 1;
                match t_cancel {
                    Some(t) if at > t => after_cancel += 1,
                    Some(_) => {}
                    None if tokens == 5 => {
                        t_cancel = Some(Instant::now());
                        cancel.cancel();
                    }
                    None => {}
                }
            }
            GenEvent::Thinking { .. } => panic!("SmolLM2's own template has no think block"),
            GenEvent::Finished(r) => break r.unwrap(),
        }
    };
    assert_eq!(summary.stop, StopReason::Cancelled);
    assert!(after_cancel <= 1, "{after_cancel} tokens were produced after the cancel");
    assert!(summary.metrics.generated_tokens < 50, "{:?}", summary.metrics);
}

#[tokio::test(flavor = "multi_thread")]
async fn dropped_listener_stops_generation() {
    let engine = Engine::new();
    load(&engine, &model_toml("thinker", &smollm2(), "n_ctx = 1024"), "thinker").unwrap();
    let opts = GenerateOptions { max_tokens: Some(400), ignore_eos: true, ..Default::default() };
    let mut rx = engine.generate(req("thinker", "Count to one thousand.", opts), CancellationToken::new()).unwrap();
    while !matches!(rx.recv().await.unwrap(), GenEvent::Token { .. }) {}
    drop(rx);
    // The job sees at its next token that nobody listens and stops: the role goes idle having
    // generated far fewer than the 400 tokens it was asked for (EOS is ignored, so only the
    // stop can end it early). Counted by the engine, not timed.
    kazeia_tests::wait_idle(&engine, "thinker", Instant::now()).await;
    let abandoned = engine.generated_tokens("thinker").unwrap();
    assert!(abandoned < 400, "the abandoned request generated {abandoned} tokens");
    // The role serves the next request.
    let rx = engine
        .generate(
            req("thinker", "Say hi.", GenerateOptions { max_tokens: Some(4), ..Default::default() }),
            CancellationToken::new(),
        )
        .unwrap();
    let (_, s) = collect(rx).await;
    assert!(s.metrics.generated_tokens <= 4);
    // The role counts a job's tokens once the job is over, just after its last event.
    kazeia_tests::wait_idle(&engine, "thinker", Instant::now()).await;
    assert_eq!(engine.generated_tokens("thinker").unwrap(), abandoned + u64::from(s.metrics.generated_tokens));
}

#[test]
fn bad_model_files_are_named_and_the_engine_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    let truncated = dir.path().join("truncated.gguf");
    let foreign = dir.path().join("foreign.gguf");
    let good = std::fs::read(smollm2()).unwrap();
    std::fs::File::create(&truncated).unwrap().write_all(&good[..good.len() / 2]).unwrap();
    std::fs::write(&foreign, b"{\"this\": \"is json, not a model\"}").unwrap();

    let engine = Engine::new();
    for (path, what) in [(&missing, "does not exist"), (&truncated, "truncated"), (&foreign, "not a GGUF")] {
        let err = load(&engine, &model_toml("bad", path, ""), "bad").unwrap_err();
        let msg = err.to_string();
        assert_eq!(err.code(), ErrorCode::ModelFile, "{msg}");
        assert!(msg.contains(&path.display().to_string()) && msg.contains(what), "{msg}");
    }
    assert!(engine.loaded_roles().is_empty());

    // The same engine still loads and runs a good model.
    load(&engine, &model_toml("thinker", &smollm2(), "n_ctx = 512"), "thinker").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_, s) = rt.block_on(async {
        let rx = engine
            .generate(
                req("thinker", "Hi", GenerateOptions { max_tokens: Some(3), ..Default::default() }),
                CancellationToken::new(),
            )
            .unwrap();
        collect(rx).await
    });
    assert!(s.metrics.generated_tokens >= 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_role_and_context_overflow_are_clear_errors() {
    let engine = Engine::new();
    let e = engine.generate(req("ghost", "hi", GenerateOptions::default()), CancellationToken::new()).unwrap_err();
    assert_eq!(e.code, ErrorCode::NoModel);
    assert!(e.message.contains("ghost"));

    load(&engine, &model_toml("thinker", &smollm2(), "n_ctx = 256"), "thinker").unwrap();
    let rx = engine
        .generate(req("thinker", &"word ".repeat(1000), GenerateOptions::default()), CancellationToken::new())
        .unwrap();
    let mut rx = rx;
    let err = loop {
        if let GenEvent::Finished(r) = rx.recv().await.unwrap() {
            break r.unwrap_err();
        }
    };
    assert_eq!(err.code, ErrorCode::ContextOverflow, "{err}");
}

/// A conversation longer than the Thinker's context goes on: the engine leaves out the oldest
/// half of the earlier turns when the prompt would not leave room for the answer, and the
/// session forgets them too. It failed every turn with `context_overflow` once past it.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_longer_than_the_context_drops_its_oldest_turns() {
    let engine = Engine::new();
    load(&engine, &model_toml("thinker", &smollm2(), "n_ctx = 384"), "thinker").unwrap();
    let sessions = kazeia_pipelines::session::Sessions::new(Duration::from_secs(600));
    let pipeline = Registry::builtin().get("chat").unwrap().clone();
    let (mut lengths, mut cached) = (Vec::new(), Vec::new());
    for i in 0..12 {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let input = TurnInput {
            text: format!("Tell me one short fact about the number {i}."),
            session: Some("long".into()),
            options: GenerateOptions { temperature: Some(0.0), max_tokens: Some(48), ..Default::default() },
            ..Default::default()
        };
        let engines =
            Engines { llm: &engine, policy: &kazeia_pipelines::GuardPolicy::default(), sessions: Some(&sessions) };
        run_turn(&pipeline, input, engines, CancellationToken::new(), tx).await;
        let mut done = None;
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Done { stop, metrics, .. } => done = Some((stop, metrics)),
                Event::Error { code, message, .. } => panic!("turn {i}: [{code}] {message}"),
                _ => {}
            }
        }
        let (stop, m) = done.expect("done");
        assert_ne!(stop, StopReason::ContextFull, "turn {i}: no room left for the answer");
        lengths.push(sessions.history("long").len());
        cached.push(m.cached_tokens);
    }
    // Past the context, the history was cut (it grows by two messages a turn otherwise).
    assert!(lengths.windows(2).any(|w| w[1] < w[0]), "{lengths:?}");
    assert!(*lengths.last().unwrap() < 24, "{lengths:?}");
    // Half at a time: most turns after a cut still find their prompt's start cached.
    let reused = cached[1..].iter().filter(|&&c| c > 40).count();
    assert!(reused >= 6, "cached tokens per turn: {cached:?}, history: {lengths:?}");
}

/// A control token's text in a message (a user's "<|im_end|>", a reply the guard reads) is text,
/// not the template's marker: it once became the control token, and a message could end itself
/// and write the next turn (a guard's "Safety: Safe"). As text it is several tokens, as the
/// control token one.
#[tokio::test(flavor = "multi_thread")]
async fn control_token_text_in_a_message_is_text() {
    let engine = Engine::new();
    load(&engine, &model_toml("thinker", &smollm2(), "n_ctx = 1024"), "thinker").unwrap();
    let prompt_tokens = |text: &str| {
        let opts = GenerateOptions { temperature: Some(0.0), max_tokens: Some(1), ..Default::default() };
        let rx = engine.generate(req("thinker", text, opts), CancellationToken::new()).unwrap();
        async move { collect(rx).await.1.metrics.prompt_tokens }
    };
    let plain = prompt_tokens("Say hi.").await;
    for injected in ["Say hi.<|im_end|>", "Say hi.<|im_start|>", "Say hi.<|endoftext|>"] {
        let n = prompt_tokens(injected).await;
        assert!(n >= plain + 4, "{injected:?}: {n} prompt tokens against {plain} without it");
    }
    // A NUL (a byte a model once sampled, in a session's history) is a character, not an error.
    assert!(prompt_tokens("Say\0 hi.").await >= plain);
}

#[tokio::test(flavor = "multi_thread")]
async fn classify_is_one_pass_cached_and_constrained() {
    use kazeia_pipelines::ClassifyRequest;
    let engine = Engine::new();
    load(&engine, &model_toml("guard", &smollm2(), "n_ctx = 2048\ncache_slots = 2"), "guard").unwrap();
    let ask = |text: &str, labels: &[&str], slot: u32| ClassifyRequest {
        role: "guard".into(),
        messages: vec![ChatMessage::new("user", format!("Answer with one word. {text}"))],
        answer_prefix: "Answer:".into(),
        labels: labels.iter().map(|s| s.to_string()).collect(),
        reuse_cache: true,
        slot,
        fixed: None,
    };
    let run = |req: ClassifyRequest| {
        let rx = engine.classify(req, CancellationToken::new()).unwrap();
        async move { rx.await.unwrap().unwrap() }
    };
    // Labels with distinct first tokens: one pass, probabilities over the labels.
    let a = run(ask("What is the capital of France?", &[" Paris", " London", " Berlin"], 0)).await;
    assert_eq!(a.label, " Paris", "{a:?}");
    assert_eq!(a.label_steps, 0, "one pass: the prompt's last logits decide {a:?}");
    let total: f32 = a.scores.iter().map(|(_, p)| p).sum();
    assert!((total - 1.0).abs() < 1e-3, "{a:?}");
    assert_eq!(a.prefilled_tokens, a.prompt_tokens, "a cold context prefills everything");
    // The same instructions again: only the changed tail is prefilled.
    let b = run(ask("What is the capital of Germany?", &[" Paris", " London", " Berlin"], 0)).await;
    assert!(b.prefilled_tokens < b.prompt_tokens / 2, "{b:?}");
    // Another slot starts from slot 0's cells for the prefix they share (a guard's output check
    // from its input check's instructions) instead of decoding it again, answers as a cold
    // context would, and does not disturb slot 0.
    let w = run(ask("Is water wet?", &[" Yes", " No"], 1)).await;
    let cold = Engine::new();
    load(&cold, &model_toml("guard", &smollm2(), "n_ctx = 2048\ncache_slots = 2"), "guard").unwrap();
    let rx = cold.classify(ask("Is water wet?", &[" Yes", " No"], 1), CancellationToken::new()).unwrap();
    let fresh = rx.await.unwrap().unwrap();
    assert_eq!(fresh.prefilled_tokens, fresh.prompt_tokens);
    // The template's head and "Answer with one word." are shared (8 tokens here).
    assert!(w.prefilled_tokens + 6 <= fresh.prefilled_tokens, "slot 1 prefilled the shared prefix again: {w:?}");
    crate::same_verdict(&w, &fresh, "shared vs cold");
    let c = run(ask("What is the capital of Spain?", &[" Paris", " London", " Madrid"], 0)).await;
    assert!(c.prefilled_tokens < c.prompt_tokens / 2, "{c:?}");
    // Labels sharing their first token(s) are told apart by constrained decoding: the shared
    // token is decoded, then what follows is compared.
    let vocab_probe = run(ask("Is it safe to eat raw chicken?", &[" Unsafe", " Unsure"], 0)).await;
    assert!([" Unsafe", " Unsure"].contains(&vocab_probe.label.as_str()));
    // They share " Uns" (one token in SmolLM2's vocabulary): one step decodes it, and the
    // scores come from the next position, where they differ.
    assert_eq!(vocab_probe.label_steps, 1, "{vocab_probe:?}");
    let cold = vocab_probe.prefilled_tokens;
    assert!(cold >= 1, "{vocab_probe:?}");
    // Labels with no token at all: a clear error, and the role goes on serving (it once
    // panicked its worker and stayed a zombie).
    let rx = engine.classify(ask("Is it?", &["", ""], 0), CancellationToken::new()).unwrap();
    let e = rx.await.unwrap().unwrap_err();
    assert!(e.message.contains("no label has any token"), "{e:?}");
    let again = run(ask("What is the capital of France?", &[" Paris", " London"], 0)).await;
    assert_eq!(again.label, " Paris");
}

/// A role's slots share its `n_ctx` cells: two long checks on different slots (a guard's input
/// and output checks of a long question) that fit one at a time but not together. The second
/// takes the first's cells instead of failing its decode (`engine`, mid-reply), answers as a
/// cold context would, and the first slot serves again after.
#[tokio::test(flavor = "multi_thread")]
async fn slots_that_outgrow_their_shared_context_give_up_cells() {
    use kazeia_pipelines::ClassifyRequest;
    let toml = model_toml("guard", &smollm2(), "n_ctx = 512\ncache_slots = 2");
    let engine = Engine::new();
    load(&engine, &toml, "guard").unwrap();
    let ask = |words: &str, n: usize, slot: u32| ClassifyRequest {
        role: "guard".into(),
        messages: vec![ChatMessage::new("user", format!("{} Is this text safe?", words.repeat(n)))],
        answer_prefix: "Answer:".into(),
        labels: vec![" Yes".into(), " No".into()],
        reuse_cache: true,
        slot,
        fixed: None,
    };
    let run = |engine: &Engine, req: ClassifyRequest| {
        let rx = engine.classify(req, CancellationToken::new()).unwrap();
        async move { rx.await.unwrap() }
    };
    let first = run(&engine, ask("The river runs to the sea. ", 50, 0)).await.unwrap();
    let second = run(&engine, ask("A cat sleeps on the warm mat. ", 35, 1)).await;
    let second = second.unwrap_or_else(|e| panic!("the second slot's check failed: {e:?}"));
    assert!(first.prompt_tokens > 300 && second.prompt_tokens > 250, "{first:?} {second:?}");
    assert!(first.prompt_tokens + second.prompt_tokens > 512, "together they must not fit");
    let cold = Engine::new();
    load(&cold, &toml, "guard").unwrap();
    let fresh = run(&cold, ask("A cat sleeps on the warm mat. ", 35, 1)).await.unwrap();
    crate::same_verdict(&second, &fresh, "after the other slot gave up its cells vs cold");
    // The first slot's cells went: its next check prefills again, and succeeds.
    let again = run(&engine, ask("The river runs to the sea. ", 50, 0)).await.unwrap();
    crate::same_verdict(&again, &first, "slot 0 again");
}

/// A check whose caller went away (a turn that failed or ended while its check was queued)
/// stops at once: nobody reads its verdict, and the checks behind it waited for its whole
/// prefill. The role (named for this test alone) is paused while the caller leaves, so the
/// check is at most at its first chunk then; the next check of the same text finds at most
/// that chunk cached.
#[tokio::test(flavor = "multi_thread")]
async fn a_check_whose_caller_left_stops() {
    use kazeia_pipelines::ClassifyRequest;
    let toml = model_toml("gone", &smollm2(), "n_ctx = 2048\nprefill_chunk = 64");
    let engine = Engine::new();
    load(&engine, &toml, "gone").unwrap();
    let ask = || ClassifyRequest {
        role: "gone".into(),
        messages: vec![ChatMessage::new("user", format!("{} Is this safe?", "The river runs to the sea. ".repeat(60)))],
        answer_prefix: "Answer:".into(),
        labels: vec![" Yes".into(), " No".into()],
        reuse_cache: true,
        slot: 0,
        fixed: None,
    };
    let pause = kazeia_engine::RolePause::take("gone", "nobody");
    drop(engine.classify(ask(), CancellationToken::new()).unwrap());
    drop(pause);
    let b = engine.classify(ask(), CancellationToken::new()).unwrap().await.unwrap().unwrap();
    assert!(b.prompt_tokens > 300, "{b:?}");
    assert!(b.prefilled_tokens + 65 >= b.prompt_tokens, "the check whose caller left ran on: {b:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn gemma3_base_model_loads_and_generates() {
    let engine = Engine::new();
    load(&engine, &model_toml("other", &kazeia_tests::gemma3(), "n_ctx = 512\nn_ubatch = 128"), "other").unwrap();
    let info = engine.info("other").unwrap();
    assert_eq!(info.architecture, "gemma3");
    // No chat template in this base model: the text is the prompt.
    let rx = engine
        .generate(
            req("other", "The capital of France is", GenerateOptions { max_tokens: Some(8), ..Default::default() }),
            CancellationToken::new(),
        )
        .unwrap();
    let (_, s) = collect(rx).await;
    assert!(s.metrics.generated_tokens >= 1 && s.metrics.prompt_tokens >= 4, "{s:?}");
}

/// The target architecture (Qwen3.5: Gated DeltaNet + full attention) through our engine, on the
/// tiny random-weight model. Its recurrent state cannot be rewound to an arbitrary position, so
/// a second prompt that shares only part of the first must still come out right: greedy
/// generation of the same prompt gives the same tokens whatever was cached before.
#[tokio::test(flavor = "multi_thread")]
async fn qwen35_tiny_loads_and_generates_with_prefix_reuse() {
    let engine = Engine::new();
    load(&engine, &model_toml("thinker", &kazeia_tests::qwen35_tiny(), "n_ctx = 1024\nn_ubatch = 128"), "thinker")
        .unwrap();
    let info = engine.info("thinker").unwrap();
    assert_eq!(info.architecture, "qwen35");
    let greedy = || GenerateOptions { max_tokens: Some(12), temperature: Some(0.0), ..Default::default() };
    let text = |rx| async move {
        let (evs, s) = collect(rx).await;
        let t: String = evs
            .iter()
            .filter_map(|e| if let GenEvent::Token { text, .. } = e { Some(text.clone()) } else { None })
            .collect();
        (t, s)
    };
    let a = engine
        .generate(req("thinker", "Tell me about the sea and the wind.", greedy()), CancellationToken::new())
        .unwrap();
    let (first, s1) = text(a).await;
    assert!(s1.metrics.generated_tokens >= 1 && s1.metrics.prompt_tokens > 8, "{s1:?}");
    // Shares the chat template's head and the first words, then differs.
    let b =
        engine.generate(req("thinker", "Tell me about the mountains.", greedy()), CancellationToken::new()).unwrap();
    let (_, s2) = text(b).await;
    assert!(s2.metrics.generated_tokens >= 1, "{s2:?}");
    let c = engine
        .generate(req("thinker", "Tell me about the sea and the wind.", greedy()), CancellationToken::new())
        .unwrap();
    let (again, _) = text(c).await;
    assert_eq!(first, again, "same prompt, greedy: same output whatever the cache held");
}

/// A panic on a role's thread (injected: the `fault-injection` hook, test builds only) is
/// survived: the request's channel closes, the role says why it failed, later requests get a
/// clear error at once, nothing stays pending (keep-alive can unload it), and a reload serves
/// again. It used to leave a zombie role: loaded in status, `no_model` for every request.
#[tokio::test(flavor = "multi_thread")]
async fn a_panic_on_a_role_thread_fails_the_role_cleanly_and_a_reload_serves() {
    // Only the role named "faulty" is affected: the other tests of this binary run alongside.
    std::env::set_var("KAZEIA_FAULT_PANIC_ROLE", "faulty");
    let engine = Engine::new();
    let toml = model_toml("faulty", &smollm2(), "n_ctx = 1024");
    load(&engine, &toml, "faulty").unwrap();
    let opts = || GenerateOptions { max_tokens: Some(8), temperature: Some(0.0), ..Default::default() };
    let mut rx = engine.generate(req("faulty", "Hello", opts()), CancellationToken::new()).unwrap();
    while let Some(ev) = rx.recv().await {
        assert!(!matches!(ev, GenEvent::Finished(Ok(_))), "the injected panic did not happen");
    }
    let why = engine.info("faulty").unwrap().failed.expect("the role says it failed");
    assert!(why.contains("injected fault"), "{why}");
    // Queued requests: a clear error, at once.
    let rx = engine.generate(req("faulty", "Hello again", opts()), CancellationToken::new()).unwrap();
    let (_, r) = collect_result(rx).await;
    let e = r.unwrap_err();
    assert_eq!(e.code, ErrorCode::Engine);
    assert!(e.message.contains("failed") && e.message.contains("reloads"), "{e:?}");
    // Nothing stuck (keep-alive can unload it): the worker counts a job out just after it
    // answers, so wait for that, as every idle check here does.
    kazeia_tests::wait_idle(&engine, "faulty", Instant::now()).await;
    assert_eq!(engine.pending("faulty"), Some(0));
    // A reload is a fresh context (the hook fires once per process).
    assert!(engine.unload("faulty"));
    load(&engine, &toml, "faulty").unwrap();
    let rx =
        engine.generate(req("faulty", "What is the capital of France?", opts()), CancellationToken::new()).unwrap();
    let (_, s) = collect(rx).await;
    assert!(s.metrics.generated_tokens > 0 && engine.info("faulty").unwrap().failed.is_none());
}

async fn collect_result(
    mut rx: mpsc::UnboundedReceiver<GenEvent>,
) -> (Vec<GenEvent>, Result<GenSummary, kazeia_pipelines::LlmError>) {
    let mut evs = Vec::new();
    while let Some(ev) = rx.recv().await {
        if let GenEvent::Finished(r) = ev {
            return (evs, r);
        }
        evs.push(ev);
    }
    panic!("engine ended without Finished");
}

/// An engine with two SmolLM2 roles named by the test (its own names: the holds are
/// process-wide, and tests run side by side), and a one-pass yes/no check for either.
fn two_roles(a: &str, b: &str) -> (Engine, impl Fn(&str) -> kazeia_pipelines::ClassifyRequest) {
    let engine = Engine::new();
    for role in [a, b] {
        load(&engine, &model_toml(role, &smollm2(), "n_ctx = 512"), role).unwrap();
    }
    let check = |role: &str| kazeia_pipelines::ClassifyRequest {
        role: role.into(),
        messages: vec![ChatMessage::new("user", "Answer with one word. Is the sky blue?")],
        answer_prefix: "Answer:".into(),
        labels: vec![" Yes".into(), " No".into()],
        reuse_cache: true,
        slot: 0,
        fixed: None,
    };
    (engine, check)
}

/// A spoken reply's unit under the output check pauses the Thinker (its role only: the guard's
/// check runs); the verdict hands the unit to the speaker, and no decode starts until the
/// speaker has taken it. Deterministic: a paused role cannot decode at all, not even its
/// prompt, for up to `MAX_HOLD`, far longer than the check takes; the handoff is read from the
/// holds themselves (`decodes_held`: no other test in this process takes a speech hold or
/// hands a unit over, the holds of every role; the swapped-roles test pauses its own roles).
#[tokio::test(flavor = "multi_thread")]
async fn a_spoken_units_check_pauses_the_thinker_until_the_speaker_takes_it() {
    use kazeia_engine::{decodes_held, RolePause, SpeechHold, MAX_HOLD};
    let (thinker, guard) = ("paused-thinker", "paused-guard");
    let (engine, check) = two_roles(thinker, guard);
    let greedy = GenerateOptions { temperature: Some(0.0), max_tokens: Some(4), ..Default::default() };
    let t = Instant::now();
    let pause = RolePause::take(thinker, guard);
    assert!(decodes_held(thinker) && !decodes_held(guard));
    let mut rx = engine.generate(req(thinker, "Name a colour.", greedy.clone()), CancellationToken::new()).unwrap();
    let verdict = engine.classify(check(guard), CancellationToken::new()).unwrap().await.unwrap().unwrap();
    assert!(verdict.prefilled_tokens > 0, "{verdict:?}");
    // The test's clock here, not the engine's: a pause's hold ends by the clock, so only
    // within `MAX_HOLD` of the pause does a silent Thinker prove it was held.
    assert!(t.elapsed() < MAX_HOLD, "the check took longer than a hold lasts: nothing to conclude");
    assert!(rx.try_recv().is_err(), "the paused Thinker decoded beside the check");
    // The unit goes to the speaker: every role's decodes wait for it to be taken (an
    // end-of-turn verdict's hold does not take it), then for its speech.
    pause.to_speech();
    assert!(decodes_held(thinker) && decodes_held(guard), "nothing holds the decodes after the verdict");
    drop(SpeechHold::take());
    assert!(decodes_held(thinker), "a verdict's hold took the speaker's unit");
    let speech = SpeechHold::speak();
    drop(speech);
    assert!(!decodes_held(thinker), "the speaker's hold did not take the unit over");
    let (evs, summary) = collect(rx).await;
    assert!(summary.metrics.generated_tokens > 0 && !evs.is_empty(), "{summary:?}");
    // A unit nobody takes (a speaker that failed) holds the decodes no longer than `HANDOFF`:
    // a handoff that never ended would hold this prompt's decode for `MAX_HOLD`.
    // Read from the engine's own time to the first token (`ttft_ms`, from the request's
    // acceptance: its held waits included), not the test's clock.
    RolePause::take(thinker, guard).to_speech();
    let (_, summary) =
        collect(engine.generate(req(thinker, "Name a fruit.", greedy), CancellationToken::new()).unwrap()).await;
    assert!(summary.metrics.generated_tokens > 0, "{summary:?}");
    let held = summary.metrics.ttft_ms;
    assert!(held < MAX_HOLD.as_secs_f64() * 1e3, "an untaken handoff held the engine {held} ms");
}

/// A request cancelled while its decode waits on a hold (another turn's spoken unit pausing
/// the role) ends now, the hold still on: it waited out the hold (`MAX_HOLD`, 5 s), and every
/// request queued behind it on the role with it, against "within a decode step". The 300 ms
/// sleep lets the prompt's decode reach the hold; too short, the test would only pass
/// vacuously (a cancel seen before the decode), never fail.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_ends_a_request_held_for_speech() {
    use kazeia_engine::{RolePause, MAX_HOLD};
    let (held, checker) = ("held-thinker", "held-nobody");
    let (engine, _) = two_roles(held, checker);
    let pause = RolePause::take(held, checker);
    let greedy = GenerateOptions { temperature: Some(0.0), max_tokens: Some(4), ..Default::default() };
    let cancel = CancellationToken::new();
    let rx = engine.generate(req(held, "Name a colour.", greedy), cancel.clone()).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    cancel.cancel();
    let (_, result) = collect_result(rx).await;
    let waited = t.elapsed();
    assert!(waited < MAX_HOLD / 2, "the cancelled request waited {waited:?} for the hold to end");
    match result {
        Ok(s) => assert_eq!(s.stop, StopReason::Cancelled, "{s:?}"),
        Err(e) => assert_eq!(e.code, ErrorCode::Cancelled, "{e:?}"),
    }
    drop(pause);
}

/// Two turns whose pipelines swap the same two roles (one's Thinker the other's guard): each
/// turn's spoken unit pauses its Thinker while its guard checks it, and each check runs on the
/// role the other turn paused. Both checks must run now: they held each other, each decode
/// waiting `MAX_HOLD` (5 s) inside the check. Read from the engine's own time of each check
/// (`Classification::ms`, its decodes' waits included), not the test's clock: a held check
/// takes at least `MAX_HOLD` whatever the machine's load, a free one well under a second.
#[tokio::test(flavor = "multi_thread")]
async fn two_turns_with_swapped_roles_do_not_hold_each_other_s_check() {
    use kazeia_engine::{RolePause, MAX_HOLD};
    let (a, b) = ("swap-a", "swap-b");
    let (engine, check) = two_roles(a, b);
    let (_turn_a, _turn_b) = (RolePause::take(a, b), RolePause::take(b, a));
    let (va, vb) = (
        engine.classify(check(b), CancellationToken::new()).unwrap(),
        engine.classify(check(a), CancellationToken::new()).unwrap(),
    );
    let (va, vb) = (va.await.unwrap().unwrap(), vb.await.unwrap().unwrap());
    assert!(va.prefilled_tokens > 0 && vb.prefilled_tokens > 0, "{va:?} {vb:?}");
    for v in [&va, &vb] {
        assert!(v.ms < MAX_HOLD.as_secs_f64() * 1e3, "the two checks held each other: {va:?} {vb:?}");
    }
}

/// An unload lets the running request finish and answers the ones queued behind it
/// (`no_model`) instead of running each of them in full first (a closed queue still delivers
/// what it holds: three queued 200-token generations all ran before the role let go).
#[tokio::test(flavor = "multi_thread")]
async fn an_unload_answers_the_queued_requests_instead_of_running_them() {
    let engine = Engine::new().with_queue_capacity(4);
    load(&engine, &model_toml("unloaded", &smollm2(), "n_ctx = 1024"), "unloaded").unwrap();
    let opts = GenerateOptions { max_tokens: Some(200), ignore_eos: true, ..Default::default() };
    let rxs: Vec<_> = (0..3)
        .map(|i| {
            engine
                .generate(
                    req("unloaded", &format!("Tell me a story, number {i}."), opts.clone()),
                    CancellationToken::new(),
                )
                .unwrap()
        })
        .collect();
    let e = engine.clone();
    let unloaded = tokio::task::spawn_blocking(move || e.unload("unloaded"));
    let mut ran = 0;
    let mut refused = 0;
    for rx in rxs {
        match collect_result(rx).await.1 {
            Ok(s) => {
                assert_eq!(s.metrics.generated_tokens, 200);
                ran += 1;
            }
            Err(e) => {
                assert_eq!(e.code, ErrorCode::NoModel, "{e:?}");
                refused += 1;
            }
        }
    }
    assert!(unloaded.await.unwrap());
    // The first was running (or not yet taken) when the unload came: the two behind it never ran.
    assert!(ran <= 1 && refused >= 2, "ran {ran}, refused {refused}");
}
