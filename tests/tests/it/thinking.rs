//! The Thinker thinks within a budget: on SmolLM2 (attention) and the tiny qwen35 (the
//! target's hybrid DeltaNet architecture), both given a Qwen3-style template with a think block.
//! The engine opens the block, closes it at the budget, never lets reasoning into the answer,
//! and leaves the cache as the next turn's prompt will be (no full re-prefill on the hybrid).

use std::time::Instant;

use kazeia_engine::Engine;
use kazeia_ipc::{Event, StopReason};
use kazeia_pipelines::{
    run_turn, ChatMessage, Engines, GenEvent, GenSummary, GenerateOptions, GenerateRequest, GuardPolicy, Llm, Registry,
    Sessions, TurnInput,
};
use kazeia_tests::{config, model_toml, qwen35_tiny, smollm2};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Qwen3's turn format (ChatML) with its think block, as a `chat_template` override: the
/// stand-in models' own templates have none.
const QWEN3_STYLE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";

fn thinker_toml(file: &std::path::Path) -> String {
    let extra = format!("n_ctx = 2048\nn_ubatch = 128\nthinking = true\nchat_template = '''{QWEN3_STYLE}'''");
    model_toml("thinker", file, &extra)
}

fn load(engine: &Engine, toml: &str, role: &str) {
    let c = config(toml);
    let m = c.model(role).unwrap().clone();
    engine.load(&m.role_params(), c.model_path(&m), Box::new(|_| {})).unwrap();
}

/// (reasoning text, answer text, summary) of one generation.
async fn generate(
    engine: &Engine,
    messages: Vec<ChatMessage>,
    options: GenerateOptions,
) -> (String, String, GenSummary) {
    let mut rx = engine.generate(GenerateRequest::new("thinker", messages, options), CancellationToken::new()).unwrap();
    let (mut thought, mut answer) = (String::new(), String::new());
    loop {
        match rx.recv().await.expect("the engine finishes") {
            GenEvent::Thinking { text, .. } => thought.push_str(&text),
            GenEvent::Token { text, .. } => answer.push_str(&text),
            GenEvent::Prefill { .. } => {}
            GenEvent::Finished(r) => return (thought, answer, r.unwrap()),
        }
    }
}

fn opts(budget: u32) -> GenerateOptions {
    GenerateOptions {
        temperature: Some(0.0),
        max_tokens: Some(16),
        thinking_budget: Some(budget),
        ignore_eos: false,
        ..Default::default()
    }
}

/// The budget bounds the reasoning (the engine's own closing tokens aside), the answer follows
/// it and holds none of it, and the next turn of the conversation finds its cache.
async fn budget_and_cache(file: &std::path::Path) {
    let engine = Engine::new();
    load(&engine, &thinker_toml(file), "thinker");
    let q = ChatMessage::new("user", "What is the capital of France?");
    let (thought, answer, s1) = generate(&engine, vec![q.clone()], opts(6)).await;
    let m = &s1.metrics;
    let n = m.thinking_tokens.expect("it reasoned");
    assert!(n > 0 && n <= 6, "the budget bounds the reasoning: {m:?}");
    assert!(!thought.is_empty(), "{m:?}");
    assert!(!answer.contains("think>"), "reasoning in the answer: {answer:?}");
    assert!(m.generated_tokens > n && m.ttfa_ms.unwrap() >= m.ttft_ms && m.thinking_ms.is_some(), "{m:?}");

    // Budget 0: no reasoning at all.
    let (none, _, s0) = generate(&engine, vec![q.clone()], opts(0)).await;
    assert!(none.is_empty() && s0.metrics.thinking_tokens.is_none(), "{none:?} {:?}", s0.metrics);

    // The next turn re-renders the first answer without its reasoning: the cache holds exactly
    // that (the rewind), so it is reused past the first prompt — on the hybrid model too, whose
    // recurrent state cannot be cut back (without the rewind: 0 cached tokens there).
    let (_, answer, s1) = generate(&engine, vec![q.clone()], opts(6)).await;
    let history = vec![q, ChatMessage::new("assistant", answer.trim()), ChatMessage::new("user", "And of Italy?")];
    let (_, _, s2) = generate(&engine, history, opts(6)).await;
    let first_prompt = s1.metrics.prompt_tokens;
    // Turn 1's prompt ends with the conversation then the block's opening (a few tokens).
    assert!(
        s2.cached_tokens + 8 >= first_prompt,
        "turn 2 reused {} tokens; turn 1's prompt was {first_prompt}",
        s2.cached_tokens
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn smollm2_thinks_within_its_budget_and_keeps_its_cache() {
    budget_and_cache(&smollm2()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn qwen35_thinks_within_its_budget_and_keeps_its_cache() {
    budget_and_cache(&qwen35_tiny()).await;
}

/// Cancel while the model reasons: it stops within one step, as during the answer.
#[tokio::test(flavor = "multi_thread")]
async fn cancel_during_thinking_lands_within_one_token() {
    let engine = Engine::new();
    load(&engine, &thinker_toml(&smollm2()), "thinker");
    let cancel = CancellationToken::new();
    let o = GenerateOptions { thinking_budget: Some(400), temperature: Some(0.8), ..Default::default() };
    let mut rx = engine
        .generate(
            GenerateRequest::new("thinker", vec![ChatMessage::new("user", "Think hard about the sea.")], o),
            cancel.clone(),
        )
        .unwrap();
    let (mut n, mut t_cancel, mut after) = (0, None::<Instant>, 0);
    let s = loop {
        match rx.recv().await.unwrap() {
            GenEvent::Thinking { at, .. } => {
                n += 1;
                match t_cancel {
                    Some(t) if at > t => after += 1,
                    Some(_) => {}
                    None if n == 5 => {
                        t_cancel = Some(Instant::now());
                        cancel.cancel();
                    }
                    None => {}
                }
            }
            GenEvent::Token { text, .. } => panic!("the answer started before the cancel: {text:?}"),
            GenEvent::Prefill { .. } => {}
            GenEvent::Finished(r) => break r.unwrap(),
        }
    };
    assert_eq!(s.stop, StopReason::Cancelled);
    // At most the token in flight, and the text the filter held back (a possible tag's start),
    // flushed at the end.
    assert!(after <= 2, "{after} pieces of reasoning after the cancel");
}

/// Through the guarded cascade: no reasoning in `token`/`sentence` events or the session's
/// history; a client that asks for it gets `thinking` events, each after a `verdict` with stage
/// `thinking`, all before the reply.
#[tokio::test(flavor = "multi_thread")]
async fn reasoning_never_reaches_the_reply_and_is_guarded_when_shown() {
    let engine = Engine::new();
    load(&engine, &thinker_toml(&smollm2()), "thinker");
    load(&engine, &model_toml("guard", &smollm2(), "n_ctx = 2048\nn_ubatch = 128\ncache_slots = 2"), "guard");
    let pipeline = Registry::builtin().get("guarded-chat").unwrap().clone();
    // The output check passes every unit by rule: the 135M guard's verdict on random reasoning
    // is not what this test is about (the rule layer is part of the guard: verdicts still come).
    let guard = "format = \"compact\"\n[[rules]]\npattern = \"(?s).*\"\nlabel = \"Safe\"\non = \"output\"\n";
    let policy = GuardPolicy::new(&toml::from_str(guard).unwrap()).unwrap();
    let sessions = Sessions::new(std::time::Duration::from_secs(600));
    for show in [false, true] {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let input = TurnInput {
            id: Some("t".into()),
            text: "What is the capital of France?".into(),
            options: GenerateOptions {
                temperature: Some(0.0),
                max_tokens: Some(24),
                thinking_budget: Some(12),
                ..Default::default()
            },
            session: Some(format!("s{show}")),
            show_thinking: show,
            ..Default::default()
        };
        let engines = Engines { llm: &engine, policy: &policy, sessions: Some(&sessions) };
        run_turn(&pipeline, input, engines, CancellationToken::new(), tx).await;
        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push(e);
        }
        let Some(Event::Done { stop, metrics, .. }) = events.last() else { panic!("{events:?}") };
        assert_ne!(*stop, StopReason::Blocked, "{events:?}");
        let n = metrics.thinking_tokens.expect("it reasoned");
        assert!(n > 0 && n <= 12, "{metrics:?}");
        let reply: String = events
            .iter()
            .filter_map(|e| if let Event::Token { text, .. } = e { Some(text.as_str()) } else { None })
            .collect();
        let thought: String = events
            .iter()
            .filter_map(|e| if let Event::Thinking { text, .. } = e { Some(text.as_str()) } else { None })
            .collect();
        assert!(!reply.contains("think>"), "{reply:?}");
        let history = sessions.history(&format!("s{show}"));
        assert_eq!(history.len(), 2, "{history:?}");
        assert_eq!(history[1].content, reply.trim_end(), "the history holds the reply, not the reasoning");
        if !show {
            assert!(thought.is_empty(), "thinking events nobody asked for: {thought:?}");
            continue;
        }
        assert!(!thought.is_empty(), "{events:?}");
        // Each thinking event follows its own passing verdict; all of them precede the reply.
        let first_token = events.iter().position(|e| matches!(e, Event::Token { .. })).unwrap_or(events.len());
        for (i, e) in events.iter().enumerate() {
            if let Event::Thinking { .. } = e {
                assert!(i < first_token, "reasoning after the reply started: {events:?}");
                assert!(
                    matches!(&events[i - 1], Event::Verdict { stage, label, .. } if stage == "thinking" && label == "Safe"),
                    "no passing verdict before {e:?}: {events:?}"
                );
            }
        }
    }
}

/// A conversation on the hybrid model reuses its earlier turns (it reused none: any difference
/// between the cached tokens and the next prompt needs a cut back, which recurrent state
/// refuses). The engine keeps each sequence's state at the end of the conversation as its
/// checkpoint; the next turn departs from the cache after it (the answer re-rendered, the empty
/// think block of a Qwen3-style template gone) and rewinds there. With its own ChatML template
/// and with the Qwen3-style one, thinking off.
#[tokio::test(flavor = "multi_thread")]
async fn qwen35_sessions_reuse_their_earlier_turns() {
    // The opening a template adds after the conversation (the empty think block), in tokens:
    // the Qwen3-style prompt less the ChatML one (same conversation, same rendering otherwise).
    let mut chatml_first = 0;
    for template in [None, Some(QWEN3_STYLE)] {
        let engine = Engine::new();
        let extra = match template {
            None => "n_ctx = 2048\nn_ubatch = 128".to_string(),
            Some(t) => format!("n_ctx = 2048\nn_ubatch = 128\nchat_template = '''{t}'''"),
        };
        load(&engine, &model_toml("thinker", &qwen35_tiny(), &extra), "thinker");
        let pipeline = Registry::builtin().get("chat").unwrap().clone();
        let policy = GuardPolicy::default();
        let sessions = Sessions::new(std::time::Duration::from_secs(600));
        let mut prompts: Vec<(u32, u32)> = Vec::new();
        for (i, text) in ["Tell me about the sea.", "And the mountains?", "Which do you prefer?"].iter().enumerate() {
            let (tx, mut rx) = mpsc::unbounded_channel();
            let input = TurnInput {
                id: Some(format!("t{i}")),
                text: text.to_string(),
                options: GenerateOptions { temperature: Some(0.0), max_tokens: Some(12), ..Default::default() },
                session: Some("s".into()),
                show_thinking: false,
                ..Default::default()
            };
            let engines = Engines { llm: &engine, policy: &policy, sessions: Some(&sessions) };
            run_turn(&pipeline, input, engines, CancellationToken::new(), tx).await;
            let mut last = None;
            let mut reply = String::new();
            while let Ok(e) = rx.try_recv() {
                if let Event::Token { text, .. } = &e {
                    reply.push_str(text);
                }
                last = Some(e);
            }
            let Some(Event::Done { metrics, .. }) = last else { panic!("{last:?}") };
            // What a full prefill of the same conversation gives, greedy: the rewound state must
            // be exactly the one a prefill would have built.
            let history = sessions.history("s");
            let fresh = Engine::new();
            load(&fresh, &model_toml("thinker", &qwen35_tiny(), &extra), "thinker");
            let asked = history[..history.len() - 1].to_vec();
            let (_, cold_reply, cold) = generate(
                &fresh,
                asked,
                GenerateOptions { temperature: Some(0.0), max_tokens: Some(12), ..Default::default() },
            )
            .await;
            assert_eq!(cold.cached_tokens, 0);
            assert_eq!(
                reply, cold_reply,
                "{template:?} turn {i}: the rewound cache answers otherwise than a full prefill"
            );
            if i == 0 && template.is_none() {
                chatml_first = metrics.prompt_tokens;
            }
            let opening = if i > 0 && template.is_some() { prompts[0].0 - chatml_first } else { 0 };
            if let Some(&(previous, _)) = prompts.last() {
                // The whole previous prompt but its opening (dropped by the re-rendering) and
                // its last token (the checkpoint is one short of it).
                assert!(
                    metrics.cached_tokens + opening + 1 >= previous,
                    "{template:?} turn {i}: {} of {} reused; the previous prompt was {previous}",
                    metrics.cached_tokens,
                    metrics.prompt_tokens
                );
            }
            eprintln!(
                "{} turn {i}: {} of {} prompt tokens reused",
                if template.is_some() { "qwen3-style" } else { "chatml" },
                metrics.cached_tokens,
                metrics.prompt_tokens
            );
            prompts.push((metrics.prompt_tokens, metrics.cached_tokens));
        }
    }
}
