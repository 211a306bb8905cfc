//! Prefills ahead of the end of a voice turn (pipelines/src/warm.rs): both guard checks and the
//! Thinker prefill the words heard so far; the turn's own requests then decode only the rest,
//! and answer exactly as a cold context would. On SmolLM2 (attention) and the tiny qwen35 (the
//! target Thinker's hybrid architecture, whose recurrent state cannot be cut back: a transcript
//! that departs from the partial one rewinds to the state where the prefill began).

use kazeia_engine::Engine;
use kazeia_ipc::ErrorCode;
use kazeia_pipelines::{
    ChatMessage, Check, Classification, Engines, GenEvent, GenSummary, GenerateOptions, GenerateRequest, GuardFormat,
    GuardPolicy, Llm, PrefillRequest, Registry, TurnInput,
};
use kazeia_tests::{config, model_toml, qwen35_tiny, smollm2};
use tokio_util::sync::CancellationToken;

use crate::same_verdict;

/// The target guard's format: its input and output checks share almost nothing (the first line
/// names the user or the assistant), so the output check's slot gains only from its own prefill
/// (with the compact format it would copy the input check's cells, question included).
const FORMAT: GuardFormat = GuardFormat::Qwen3guard;

/// A Thinker and a two-slot guard on `file` (one model, two contexts), as models.toml has them.
fn engine(file: &std::path::Path) -> Engine {
    let toml = format!(
        "{}\n{}",
        model_toml("thinker", file, "n_ctx = 1024\nn_ubatch = 128"),
        model_toml("guard", file, "n_ctx = 1024\nn_ubatch = 128\ncache_slots = 2")
    );
    let c = config(&toml);
    let engine = Engine::new();
    for role in ["thinker", "guard"] {
        let m = c.model(role).unwrap().clone();
        engine.load(&m.role_params(), c.model_path(&m), Box::new(|_| {})).unwrap();
    }
    engine
}

async fn answer(engine: &Engine, text: &str) -> (String, GenSummary) {
    generate(engine, vec![ChatMessage::new("user", text)]).await
}

/// The Thinker's greedy answer to `messages` (10 tokens at most).
async fn generate(engine: &Engine, messages: Vec<ChatMessage>) -> (String, GenSummary) {
    let opts = GenerateOptions { temperature: Some(0.0), max_tokens: Some(10), ..Default::default() };
    let req = GenerateRequest::new("thinker", messages, opts);
    let mut rx = engine.generate(req, CancellationToken::new()).unwrap();
    let mut reply = String::new();
    loop {
        match rx.recv().await.expect("the engine finishes") {
            GenEvent::Token { text, .. } => reply.push_str(&text),
            GenEvent::Finished(r) => return (reply, r.unwrap()),
            _ => {}
        }
    }
}

async fn input_check(engine: &Engine, text: &str) -> Classification {
    guard_check(engine, Check::Input, text, "").await
}

async fn guard_check(engine: &Engine, what: Check, text: &str, reply: &str) -> Classification {
    let req = FORMAT.prompt(what, text, reply).request("guard", what, true);
    engine.classify(req, CancellationToken::new()).unwrap().await.unwrap().unwrap()
}

/// The roles of the guarded chat prefilled with `partial` (pipelines' warm): the prompt tokens
/// prefilled ahead by the input check, the Thinker and the output check, in that order.
async fn warm(engine: &Engine, policy: &GuardPolicy, partial: &str) -> [u32; 3] {
    warm_with(engine, policy, partial, false).await
}

/// The same with `whole`: `text` is the whole utterance's transcript.
async fn warm_with(engine: &Engine, policy: &GuardPolicy, text: &str, whole: bool) -> [u32; 3] {
    let registry = Registry::builtin();
    let pipeline = registry.get("guarded-chat").unwrap();
    let input = TurnInput { text: text.into(), ..Default::default() };
    let engines = Engines { llm: engine, policy, sessions: None };
    let prefilled = kazeia_pipelines::warm(pipeline, &input, whole, engines, CancellationToken::new()).await;
    let roles: Vec<&str> = prefilled.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(roles, ["guard", "thinker", "guard"], "{text:?}");
    let tokens: Vec<u32> = prefilled.into_iter().map(|(_, r)| r.unwrap().prompt_tokens).collect();
    [tokens[0], tokens[1], tokens[2]]
}

/// A cold context's turn on `question`: the Thinker's reply and summary, the input check, the
/// output check of that reply; what a turn after a prefill ahead must give.
struct Cold {
    reply: String,
    summary: GenSummary,
    check: Classification,
    output: Classification,
}

async fn cold(file: &std::path::Path, question: &str) -> Cold {
    let engine = engine(file);
    let (reply, summary) = answer(&engine, question).await;
    let check = input_check(&engine, question).await;
    let output = guard_check(&engine, Check::Output, question, &reply).await;
    Cold { reply, summary, check, output }
}

/// An engine that has had a first turn, as a conversation has: the guard's slot then holds
/// its instructions.
async fn after_a_first_turn(file: &std::path::Path) -> Engine {
    let engine = engine(file);
    input_check(&engine, "Hello there.").await;
    engine
}

async fn ahead_then_whole(file: &std::path::Path) {
    let question = "What is the capital of France?";
    let cold = cold(file, question).await;
    let policy = GuardPolicy { format: FORMAT, ..GuardPolicy::default() };
    for (partial, extends) in [("What is the capital.", true), ("What was the", false)] {
        let warm_engine = after_a_first_turn(file).await;
        let [guard_ahead, thinker_ahead, output_ahead] = warm(&warm_engine, &policy, partial).await;

        let check = input_check(&warm_engine, question).await;
        same_verdict(&check, &cold.check, &format!("{file:?} {partial:?}"));
        let (reply, summary) = answer(&warm_engine, question).await;
        assert_eq!(reply, cold.reply, "{file:?} {partial:?}: not the answer of a full prefill");
        assert_eq!(summary.metrics.prompt_tokens, cold.summary.metrics.prompt_tokens);
        let output = guard_check(&warm_engine, Check::Output, question, &reply).await;
        same_verdict(&output, &cold.output, &format!("{file:?} {partial:?} output"));
        if extends {
            // Everything prefilled ahead was kept: only the rest of the question was decoded.
            assert!(summary.cached_tokens >= thinker_ahead, "{file:?}: {summary:?} after {thinker_ahead}");
            let guard_rest = check.prompt_tokens - guard_ahead;
            assert!(check.prefilled_tokens <= guard_rest + 1, "{file:?}: {check:?} after {guard_ahead}");
            // The output check's slot held its instructions and the question's start: only the
            // rest, the reply and the closing lines were decoded (not most of the prompt).
            let output_rest = output.prompt_tokens - output_ahead;
            assert!(output.prefilled_tokens <= output_rest + 1, "{file:?}: {output:?} after {output_ahead}");
            assert!(output.prefilled_tokens * 2 < output.prompt_tokens, "{file:?}: {output:?}");
        } else {
            // "was" departs from "is": the start before it is kept, the rest decoded again.
            assert!(summary.cached_tokens < thinker_ahead, "{file:?}: {summary:?}");
            assert!(check.prefilled_tokens < cold.check.prefilled_tokens, "{file:?}: {check:?} vs {:?}", cold.check);
        }
    }
}

/// The whole utterance's transcript, prefilled before the turn ends on it: the input check
/// decodes its last token only, the Thinker only what its generation decodes itself (the last
/// token; on a hybrid model what follows the conversation), the output check the reply and its
/// closing; every answer and verdict as a cold context's.
async fn whole_then_turn(file: &std::path::Path) {
    let question = "What is the capital of France?";
    let cold = cold(file, question).await;
    let policy = GuardPolicy { format: FORMAT, ..GuardPolicy::default() };
    let warm_engine = after_a_first_turn(file).await;
    // First the words heard during speech, then the whole utterance, as a voice turn has them.
    warm(&warm_engine, &policy, "What is the capital.").await;
    let [guard_ahead, thinker_ahead, output_ahead] = warm_with(&warm_engine, &policy, question, true).await;

    let check = input_check(&warm_engine, question).await;
    same_verdict(&check, &cold.check, &format!("{file:?}"));
    assert_eq!(guard_ahead + 1, check.prompt_tokens, "{file:?}: {check:?}");
    assert_eq!(check.prefilled_tokens, 1, "{file:?}: {check:?}");

    let (reply, summary) = answer(&warm_engine, question).await;
    assert_eq!(reply, cold.reply, "{file:?}: not the answer of a full prefill");
    assert_eq!(summary.metrics.prompt_tokens, cold.summary.metrics.prompt_tokens);
    assert_eq!(summary.cached_tokens, thinker_ahead, "{file:?}: {summary:?}");
    assert_eq!(summary.prefilled_tokens, summary.metrics.prompt_tokens - thinker_ahead, "{file:?}: {summary:?}");
    if !file.to_string_lossy().contains("qwen35") {
        assert_eq!(summary.prefilled_tokens, 1, "{file:?}: {summary:?}");
    }

    let output = guard_check(&warm_engine, Check::Output, question, &reply).await;
    same_verdict(&output, &cold.output, &format!("{file:?} output"));
    // Held up to where the reply begins: the question's last word and the assistant's label
    // were decoded ahead, the reply and the closing lines now.
    assert_eq!(output.prefilled_tokens, output.prompt_tokens - output_ahead, "{file:?}: {output:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_whole_transcript_prefilled_leaves_the_turn_its_last_tokens() {
    whole_then_turn(&smollm2()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn qwen35_a_whole_transcript_prefilled_leaves_the_turn_its_last_tokens() {
    whole_then_turn(&qwen35_tiny()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn words_heard_so_far_are_prefilled_and_the_answer_is_unchanged() {
    ahead_then_whole(&smollm2()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn qwen35_words_heard_so_far_are_prefilled_and_the_answer_is_unchanged() {
    ahead_then_whole(&qwen35_tiny()).await;
}

/// The hybrid Thinker in a conversation: the first prefill ahead keeps the state where the turn's
/// own text begins (after the first turn, its answer included), and later partials keep it
/// (2 checkpoints: one per partial evicted it by the second); a final transcript departing from
/// the partials' words rewinds there, not to the older checkpoint where the first turn's prompt
/// ended (its answer would be decoded again), and answers as a cold context does.
#[tokio::test(flavor = "multi_thread")]
async fn qwen35_a_departing_transcript_rewinds_to_where_the_prefill_began() {
    let file = qwen35_tiny();
    let engine = engine(&file);
    let first = vec![ChatMessage::new("user", "Tell me about the sea.")];
    let (said, s0) = generate(&engine, first.clone()).await;
    assert!(s0.metrics.generated_tokens >= 2, "{s0:?}");
    // The sequence holds the first prompt and the answer (its last token, when the length
    // stopped it, not decoded).
    let held = s0.metrics.prompt_tokens + s0.metrics.generated_tokens - 1;
    let mut history = first;
    history.push(ChatMessage::new("assistant", said));
    for heard in ["What was the", "What was the capital of"] {
        let mut partial = history.clone();
        partial.push(ChatMessage::new("user", format!("{heard}{}", kazeia_engine::PREFILL_CUT)));
        let ahead = PrefillRequest::new("thinker", partial, 0);
        let p = engine.prefill(ahead, CancellationToken::new()).unwrap().await.unwrap().unwrap();
        assert!(p.prompt_tokens > held, "{p:?} {s0:?}");
    }
    let mut whole = history;
    whole.push(ChatMessage::new("user", "What is the capital of France?"));
    let (reply, s) = generate(&engine, whole.clone()).await;
    assert!(s.cached_tokens >= held, "rewound to {} of {held} held before the prefill: {s:?}", s.cached_tokens);
    let (cold_reply, cold) = generate(&self::engine(&file), whole).await;
    assert_eq!(cold.cached_tokens, 0);
    assert_eq!(reply, cold_reply, "the rewound state answers otherwise than a full prefill");
}

/// A prefill ahead of time yields to requests: queued while the role serves one, then with a
/// request queued behind it, it is skipped (`busy`) and that request runs as if it had never
/// been asked; alone, it runs. Without its cut mark it is a bad request, and the role serves on.
#[tokio::test(flavor = "multi_thread")]
async fn a_prefill_ahead_yields_to_requests() {
    let engine = engine(&smollm2());
    let opts = GenerateOptions { temperature: Some(0.0), max_tokens: Some(48), ignore_eos: true, ..Default::default() };
    let req = GenerateRequest::new("thinker", vec![ChatMessage::new("user", "Count to twenty.")], opts);
    let mut running = engine.generate(req, CancellationToken::new()).unwrap();
    // Once a token came, the generation is surely running (48 tokens take far longer).
    while !matches!(running.recv().await, Some(GenEvent::Token { .. })) {}
    let ahead = PrefillRequest::new(
        "thinker",
        vec![ChatMessage::new("user", format!("What is{}", kazeia_engine::PREFILL_CUT))],
        0,
    );
    let skipped = engine.prefill(ahead.clone(), CancellationToken::new()).unwrap();
    let opts = GenerateOptions { temperature: Some(0.0), max_tokens: Some(4), ..Default::default() };
    let question = vec![ChatMessage::new("user", "What is the capital of France?")];
    let mut next =
        engine.generate(GenerateRequest::new("thinker", question.clone(), opts), CancellationToken::new()).unwrap();
    let finished = |mut rx: tokio::sync::mpsc::UnboundedReceiver<GenEvent>| async move {
        loop {
            if let GenEvent::Finished(r) = rx.recv().await.expect("the engine finishes") {
                return r.unwrap();
            }
        }
    };
    assert_eq!(finished(running).await.metrics.generated_tokens, 48);
    let e = skipped.await.unwrap().expect_err("skipped for the request behind it");
    assert_eq!(e.code, ErrorCode::Busy, "{e}");
    let asked = loop {
        if let GenEvent::Finished(r) = next.recv().await.unwrap() {
            break r.unwrap();
        }
    };
    // Alone, it runs; had it run before the question, the question would have found it cached.
    let ran = engine.prefill(ahead, CancellationToken::new()).unwrap().await.unwrap().unwrap();
    assert!(asked.cached_tokens < ran.prompt_tokens, "{asked:?} vs {ran:?}");
    let unmarked = PrefillRequest::new("thinker", vec![ChatMessage::new("user", "What is")], 0);
    let e = engine.prefill(unmarked, CancellationToken::new()).unwrap().await.unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::BadRequest, "{e}");
    generate(&engine, question).await;
}

/// A prefill ahead that is running stops between two of its chunks for a request that comes,
/// and keeps what it decoded: it answers `busy`, and the request finds those tokens cached and
/// answers as a cold context does. Seen running by its first chunk's progress event, so nothing
/// here is ordered by time: the request comes with ~20 of its chunks (~2 s) still to go.
async fn a_running_prefill_stops_for_a_request(file: &std::path::Path) {
    let engine = engine(file);
    let text = "The committee met on a rainy Tuesday to review the plans for the new library, \
                its reading rooms, the children's corner and the garden behind it. "
        .repeat(24);
    let (tx, mut progress) = tokio::sync::mpsc::unbounded_channel();
    let mut ahead = PrefillRequest::new(
        "thinker",
        vec![ChatMessage::new("user", format!("{text}{}", kazeia_engine::PREFILL_CUT))],
        0,
    );
    ahead.progress = Some(tx);
    let running = engine.prefill(ahead, CancellationToken::new()).unwrap();
    // (On the hybrid model, the pass up to where the turn's text begins comes first.)
    let (first, total) = loop {
        match progress.recv().await {
            Some(GenEvent::Prefill { done, total, .. }) if total > 16 * 32 => break (done, total),
            Some(GenEvent::Prefill { done, total, .. }) => eprintln!("{done} of {total}"),
            Some(_) => {}
            None => panic!("{file:?}: no progress event for the question"),
        }
    };
    assert!(first <= 32 + 8, "{file:?}: {first} of {total} after the first chunk");
    let question = vec![ChatMessage::new("user", format!("{text}What is it about?"))];
    let (reply, asked) = generate(&engine, question.clone()).await;
    let e = running.await.unwrap().expect_err("stopped for the request");
    assert_eq!(e.code, ErrorCode::Busy, "{file:?}: {e}");
    let mut kept = first;
    while let Ok(GenEvent::Prefill { done, .. }) = progress.try_recv() {
        kept = done;
    }
    eprintln!("{file:?}: prefilled {kept} of {total}, then the request found {} cached", asked.cached_tokens);
    assert!(kept < total, "{file:?}: the prefill ran to its end ({kept} of {total})");
    assert!(asked.cached_tokens + 1 >= kept, "{file:?}: {asked:?} after {kept} prefilled");
    let (cold_reply, cold) = generate(&self::engine(file), question).await;
    assert_eq!(cold.cached_tokens, 0);
    assert_eq!(reply, cold_reply, "{file:?}: answered otherwise after a prefill stopped mid-way");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_running_prefill_stops_for_a_request_smollm2() {
    a_running_prefill_stops_for_a_request(&smollm2()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_running_prefill_stops_for_a_request_qwen35() {
    a_running_prefill_stops_for_a_request(&qwen35_tiny()).await;
}

/// The first token of the Thinker's greedy answer to `request`, and the summary (the rest is
/// not generated: the request is cancelled once its first token came).
async fn first_token(engine: &Engine, request: GenerateRequest) -> (String, GenSummary) {
    let cancel = CancellationToken::new();
    let mut rx = engine.generate(request, cancel.clone()).unwrap();
    let mut first = String::new();
    loop {
        match rx.recv().await.expect("the engine finishes") {
            GenEvent::Token { text, .. } => {
                if first.is_empty() {
                    first = text;
                }
                cancel.cancel();
            }
            GenEvent::Finished(r) => return (first, r.unwrap()),
            _ => {}
        }
    }
}

/// A session past the Thinker's context with room for the reply: the turn's generation leaves
/// out the oldest half of the history, and the prefill ahead of it (a voice turn's whole
/// transcript) leaves out the same, so that the generation decodes only what it decodes itself
/// (its last token, or on a hybrid model what follows the conversation). A prefill of the whole
/// history was lost: the generation departed from it after the first message it kept, and
/// decoded nearly all of its prompt again. Answers as a cold context does.
async fn a_long_history_is_prefilled_as_the_generation_fits_it(file: &std::path::Path) {
    let engine = engine(file);
    let mut messages = Vec::new();
    for i in 0..17 {
        messages.push(ChatMessage::new("user", format!("Tell me fact number {i} about the sea and its old harbours.")));
        messages.push(ChatMessage::new("assistant", "The sea is wide, the ships are many, and the harbours are busy."));
    }
    messages.push(ChatMessage::new("user", "What is the capital of France?"));
    let history = Some((0, messages.len() - 1));
    // ~750 prompt tokens: within the 1024 cells, but not with 400 to answer in.
    let opts = GenerateOptions { temperature: Some(0.0), max_tokens: Some(400), ..Default::default() };
    let mut ahead = PrefillRequest::new("thinker", messages.clone(), 0);
    ahead.upto = kazeia_engine::Upto::Generation;
    ahead.history = history;
    ahead.options = opts.clone();
    let p = engine.prefill(ahead, CancellationToken::new()).unwrap().await.unwrap().unwrap();
    let mut request = GenerateRequest::new("thinker", messages, opts);
    request.history = history;
    let (first, s) = first_token(&engine, request.clone()).await;
    assert!(s.dropped_messages >= 2, "{file:?}: the history fits, the test asks nothing: {s:?}");
    assert!(
        s.cached_tokens >= p.prompt_tokens && s.prefilled_tokens < 16,
        "{file:?}: {} of the prompt held after the prefill ahead ({p:?}): {s:?}",
        s.cached_tokens
    );
    let (cold_first, cold) = first_token(&self::engine(file), request).await;
    assert_eq!(cold.cached_tokens, 0);
    assert_eq!(first, cold_first, "{file:?}: answered otherwise after the prefill ahead");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_history_is_prefilled_as_the_generation_fits_it_smollm2() {
    a_long_history_is_prefilled_as_the_generation_fits_it(&smollm2()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_history_is_prefilled_as_the_generation_fits_it_qwen35() {
    a_long_history_is_prefilled_as_the_generation_fits_it(&qwen35_tiny()).await;
}
