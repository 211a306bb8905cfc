//! The runner's guard paths with a scripted `Llm` (pure logic: which verdict comes when is
//! chosen here, so a path a real model takes only by chance is run every time). The Thinker
//! streams three sentences, one token at a time, and keeps its cancel token; the guard answers
//! by script.
//!
//! What must hold: an input verdict that blocks releases nothing of the Thinker and sends the
//! refusal; an output verdict that blocks the second sentence releases the first (its tokens and
//! its `sentence`), cancels the Thinker, releases nothing more and sends the refusal.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kazeia_ipc::{ErrorCode, Event, Metrics, StopReason};
use kazeia_pipelines::{
    run_turn, ChatMessage, Check, Classification, ClassifyRequest, Engines, GenEvent, GenSummary, GenerateOptions,
    GenerateRequest, GuardPolicy, Label, Llm, LlmError, PrefillRequest, Prefilled, Registry, Sessions, TurnInput, Upto,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

const SENTENCES: [&str; 3] = ["Paris is the capital. ", "Here is how to hurt someone. ", "The end."];

/// The guard's script: the verdict for a check, from its slot and the text it sees.
type Script = dyn Fn(Check, &str) -> Label + Send + Sync;

/// What decides the history a request keeps: the history's place in its messages, its options.
type Fit = (Option<(usize, usize)>, GenerateOptions);

struct Scripted {
    script: Box<Script>,
    /// Label strings as the guard format writes them.
    labels: Vec<(String, Label)>,
    /// The Thinker's cancel token.
    thinker_cancel: Mutex<Option<CancellationToken>>,
    /// What the Thinker was asked, and everything the guard saw.
    thinker_messages: Mutex<Vec<ChatMessage>>,
    guard_saw: Mutex<String>,
    /// Each check's slot and text, in order.
    checks: Mutex<Vec<(u32, String)>>,
    /// The prefills ahead of time asked for: (role, slot, the messages' text, how far).
    prefilled: Mutex<Vec<(String, u32, String, Upto)>>,
    /// What decides the history each prefill and the Thinker's request keep, in order: the
    /// history's place, and the options.
    fits: Mutex<Vec<Fit>>,
    classified: AtomicU32,
    /// The Thinker's reply, streamed a word at a time, after its reasoning (`thinking`).
    reply: Vec<String>,
    thinking: Vec<String>,
    /// The longest prompt (characters) the guard's context takes: longer is `context_overflow`.
    guard_room: usize,
}

impl Scripted {
    fn new(script: impl Fn(Check, &str) -> Label + Send + Sync + 'static) -> Scripted {
        let policy = GuardPolicy { categories: false, ..GuardPolicy::default() };
        Scripted {
            script: Box::new(script),
            labels: policy.format.prompt(Check::Input, "x", "").labels,
            thinker_cancel: Mutex::new(None),
            thinker_messages: Mutex::new(Vec::new()),
            guard_saw: Mutex::new(String::new()),
            checks: Mutex::new(Vec::new()),
            prefilled: Mutex::new(Vec::new()),
            fits: Mutex::new(Vec::new()),
            classified: AtomicU32::new(0),
            reply: SENTENCES.iter().map(|s| s.to_string()).collect(),
            thinking: Vec::new(),
            guard_room: usize::MAX,
        }
    }

    fn with_guard_room(mut self, chars: usize) -> Scripted {
        self.guard_room = chars;
        self
    }

    fn replying(mut self, reply: &str) -> Scripted {
        self.reply = vec![reply.to_string()];
        self
    }

    fn thinking(mut self, thinking: &str) -> Scripted {
        self.thinking = vec![thinking.to_string()];
        self
    }
}

impl Llm for Scripted {
    fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<mpsc::UnboundedReceiver<GenEvent>, LlmError> {
        assert_eq!(request.role, "thinker", "the guard only classifies here (categories off)");
        *self.thinker_cancel.lock().unwrap() = Some(cancel.clone());
        *self.thinker_messages.lock().unwrap() = request.messages.clone();
        self.fits.lock().unwrap().push((request.history, request.options.clone()));
        let (tx, rx) = mpsc::unbounded_channel();
        let words = |texts: &[String]| -> Vec<String> {
            texts.iter().flat_map(|s| s.split_inclusive(' ')).map(String::from).collect()
        };
        let thoughts = words(&self.thinking).into_iter().map(|t| (true, t));
        let tokens: Vec<(bool, String)> = thoughts.chain(words(&self.reply).into_iter().map(|t| (false, t))).collect();
        tokio::spawn(async move {
            let mut generated = 0;
            for (thinking, t) in tokens {
                // A decode step; a cancelled engine stops within one.
                tokio::time::sleep(Duration::from_millis(5)).await;
                if cancel.is_cancelled() {
                    break;
                }
                generated += 1;
                let at = Instant::now();
                let _ = tx.send(if thinking {
                    GenEvent::Thinking { text: t, at }
                } else {
                    GenEvent::Token { text: t, at }
                });
            }
            let stop = if cancel.is_cancelled() { StopReason::Cancelled } else { StopReason::Eos };
            let metrics = Metrics { generated_tokens: generated, ..Metrics::default() };
            let _ = tx.send(GenEvent::Finished(Ok(GenSummary {
                stop,
                metrics,
                prefilled_tokens: 0,
                cached_tokens: 0,
                dropped_messages: 0,
            })));
        });
        Ok(rx)
    }

    fn classify(
        &self,
        request: ClassifyRequest,
        _cancel: CancellationToken,
    ) -> Result<oneshot::Receiver<Result<Classification, LlmError>>, LlmError> {
        self.classified.fetch_add(1, Ordering::SeqCst);
        let check = if request.slot == Check::Output.slot() { Check::Output } else { Check::Input };
        let seen = text_of(&request.messages);
        self.guard_saw.lock().unwrap().push_str(&seen);
        self.checks.lock().unwrap().push((request.slot, seen.clone()));
        let (tx, rx) = oneshot::channel();
        if seen.len() > self.guard_room {
            let _ = tx.send(Err(LlmError::new(ErrorCode::ContextOverflow, "the guard's context is full")));
            return Ok(rx);
        }
        let label = (self.script)(check, &seen);
        let text = self.labels.iter().find(|(_, l)| *l == label).expect("the format has the label").0.clone();
        assert!(request.labels.contains(&text), "{text:?} among {:?}", request.labels);
        let _ = tx.send(Ok(Classification {
            label: text,
            scores: vec![],
            prompt_tokens: 10,
            prefilled_tokens: 10,
            label_steps: 0,
            ms: 1.0,
        }));
        Ok(rx)
    }

    fn prefill(
        &self,
        request: PrefillRequest,
        _cancel: CancellationToken,
    ) -> Result<oneshot::Receiver<Result<Prefilled, LlmError>>, LlmError> {
        if request.role == "thinker" {
            self.fits.lock().unwrap().push((request.history, request.options.clone()));
        }
        self.prefilled.lock().unwrap().push((request.role, request.slot, text_of(&request.messages), request.upto));
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(Ok(Prefilled { prompt_tokens: 1, prefilled_tokens: 1, ms: 1.0 }));
        Ok(rx)
    }
}

/// The messages as one text, roles included (what a template renders, less its markup).
fn text_of(messages: &[ChatMessage]) -> String {
    messages.iter().map(|m| format!("{}: {}", m.role, m.content)).collect::<Vec<_>>().join("\n")
}

/// Run one guarded turn against `llm`; all its events.
async fn turn(llm: &Scripted) -> Vec<Event> {
    let registry = Registry::builtin();
    turn_on(llm, registry.get("guarded-chat").unwrap()).await
}

async fn turn_on(llm: &Scripted, pipeline: &kazeia_pipelines::Pipeline) -> Vec<Event> {
    let policy = GuardPolicy { categories: false, ..GuardPolicy::default() };
    let input = TurnInput { text: "What is the capital of France?".into(), ..Default::default() };
    turn_with(llm, pipeline, &policy, input, CancellationToken::new()).await
}

/// A guarded-chat turn with its own policy, input and cancel token.
async fn turn_with(
    llm: &Scripted,
    pipeline: &kazeia_pipelines::Pipeline,
    policy: &GuardPolicy,
    input: TurnInput,
    cancel: CancellationToken,
) -> Vec<Event> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    run_turn(pipeline, input, Engines { llm, policy, sessions: None }, cancel, tx).await;
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    events
}

fn refusal() -> String {
    GuardPolicy::default().refusal_for(&[], "What is the capital of France?").to_string()
}

#[tokio::test]
async fn an_input_verdict_that_blocks_releases_nothing() {
    let llm = Scripted::new(|check, _| if check == Check::Input { Label::Unsafe } else { Label::Safe });
    let events = turn(&llm).await;
    let released: String = events
        .iter()
        .filter_map(|e| if let Event::Token { text, .. } = e { Some(text.as_str()) } else { None })
        .collect();
    assert_eq!(released, refusal(), "only the refusal: {events:?}");
    assert!(matches!(events.last(), Some(Event::Done { stop: StopReason::Blocked, .. })), "{events:?}");
    assert!(
        matches!(&events[0], Event::Verdict { stage, label, .. } if stage == "input" && label == "Unsafe"),
        "{events:?}"
    );
    let thinker = llm.thinker_cancel.lock().unwrap().clone();
    assert!(thinker.is_none_or(|c| c.is_cancelled()), "an overlapped Thinker is cancelled");
    assert_eq!(llm.classified.load(Ordering::SeqCst), 1, "no output check after a blocked input");
}

#[tokio::test]
async fn an_output_verdict_that_blocks_the_second_sentence_keeps_the_first_and_stops() {
    let llm = Scripted::new(
        |check, seen| {
            if check == Check::Output && seen.contains("hurt") {
                Label::Unsafe
            } else {
                Label::Safe
            }
        },
    );
    let events = turn(&llm).await;
    let tokens: String = events
        .iter()
        .filter_map(|e| if let Event::Token { text, .. } = e { Some(text.as_str()) } else { None })
        .collect();
    let sentences: Vec<&str> = events
        .iter()
        .filter_map(|e| if let Event::Sentence { text, .. } = e { Some(text.as_str()) } else { None })
        .collect();
    assert_eq!(tokens, format!("{}{}", SENTENCES[0], refusal()), "sentence 1, then the refusal: {events:?}");
    assert_eq!(sentences, [SENTENCES[0].trim(), refusal().as_str()], "{events:?}");
    assert!(!tokens.contains(SENTENCES[1]) && !tokens.contains(SENTENCES[2]), "nothing after the block is released");
    let verdicts: Vec<(&str, &str)> = events
        .iter()
        .filter_map(|e| {
            if let Event::Verdict { stage, label, .. } = e {
                Some((stage.as_str(), label.as_str()))
            } else {
                None
            }
        })
        .collect();
    assert_eq!(verdicts, [("input", "Safe"), ("output", "Safe"), ("output", "Unsafe")], "{events:?}");
    assert!(matches!(events.last(), Some(Event::Done { stop: StopReason::Blocked, .. })), "{events:?}");
    let thinker = llm.thinker_cancel.lock().unwrap().clone().expect("the Thinker ran");
    assert!(thinker.is_cancelled(), "the Thinker is cancelled mid-reply");
}

/// A think stage's `system` reaches the Thinker first, before the conversation; the guard judges
/// the user's text and the reply, never our own instructions.
/// A long question: with the reply so far, it outgrows the guard's context after the first unit.
/// Each later unit is judged whole, after the reply's last words and the question's start and
/// end, and the turn goes on (it failed mid-reply with `context_overflow`, sentences gone).
#[tokio::test]
async fn output_checks_past_the_guards_context_judge_a_shortened_one() {
    let question =
        format!("Please read this. {}What is the capital of France?", "Lorem ipsum dolor sit amet. ".repeat(150));
    let policy = GuardPolicy { categories: false, ..GuardPolicy::default() };
    let first = policy.format.prompt(Check::Output, &question, SENTENCES[0].trim()).messages;
    let llm = Scripted::new(|_, _| Label::Safe).with_guard_room(text_of(&first).len() + 10);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let input = TurnInput { text: question.clone(), ..Default::default() };
    let pipeline = Registry::builtin().get("guarded-chat").unwrap().clone();
    run_turn(&pipeline, input, Engines { llm: &llm, policy: &policy, sessions: None }, CancellationToken::new(), tx)
        .await;
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    let sentences: Vec<String> = events
        .iter()
        .filter_map(|e| if let Event::Sentence { text, .. } = e { Some(text.clone()) } else { None })
        .collect();
    assert_eq!(sentences, SENTENCES.map(|s| s.trim().to_string()), "{events:?}");
    assert!(matches!(events.last(), Some(Event::Done { stop: StopReason::Eos, .. })), "{events:?}");
    // The later units' checks saw the question shortened, each unit whole.
    let checks = llm.checks.lock().unwrap().clone();
    let shortened: Vec<&String> = checks.iter().map(|(_, t)| t).filter(|t| t.contains(" … ")).collect();
    assert_eq!(shortened.len(), 2, "{checks:?}");
    assert!(shortened[0].contains(SENTENCES[1].trim()) && shortened[1].contains(SENTENCES[2].trim()));
}

/// A reply written without a sentence end (a list without marks, a URL, Chinese without
/// spaces): it is checked and released in units of at most `split::MAX_BYTES` bytes, each
/// fitting the guard's context. Whole, the one unit outgrew it and failed the turn.
#[tokio::test]
async fn a_reply_without_sentence_ends_is_checked_in_bounded_units() {
    let reply = "item ".repeat(240);
    let policy = GuardPolicy { categories: false, ..GuardPolicy::default() };
    let room =
        text_of(&policy.format.prompt(Check::Output, "What is the capital of France?", &"x".repeat(1150)).messages)
            .len();
    let llm = Scripted::new(|_, _| Label::Safe).with_guard_room(room).replying(&reply);
    let events = turn(&llm).await;
    assert!(matches!(events.last(), Some(Event::Done { stop: StopReason::Eos, .. })), "{events:?}");
    let sentences: Vec<String> = events
        .iter()
        .filter_map(|e| if let Event::Sentence { text, .. } = e { Some(text.clone()) } else { None })
        .collect();
    assert!(sentences.len() >= 3, "{sentences:?}");
    assert!(sentences.iter().all(|s| s.len() <= kazeia_pipelines::split::MAX_BYTES), "{sentences:?}");
    assert_eq!(sentences.join(" "), reply.trim());
}

/// A question longer than the guard's context is judged in parts that fit, the worst verdict
/// standing: whole, it failed with `context_overflow`.
#[tokio::test]
async fn a_question_past_the_guards_context_is_judged_in_parts() {
    let policy = GuardPolicy { categories: false, ..GuardPolicy::default() };
    let filler = "Lorem ipsum dolor sit amet. ".repeat(60);
    let room = text_of(&policy.format.prompt(Check::Input, &filler, "").messages).len();
    for (bad, blocked) in [(false, false), (true, true)] {
        let middle = if bad { "PART-BAD " } else { "" };
        let question = format!("{filler}{filler}{middle}{filler}{filler}What is the capital of France?");
        let llm =
            Scripted::new(
                |check, seen| {
                    if check == Check::Input && seen.contains("PART-BAD") {
                        Label::Unsafe
                    } else {
                        Label::Safe
                    }
                },
            )
            .with_guard_room(room);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let input = TurnInput { text: question, ..Default::default() };
        let pipeline = Registry::builtin().get("guarded-chat").unwrap().clone();
        run_turn(
            &pipeline,
            input,
            Engines { llm: &llm, policy: &policy, sessions: None },
            CancellationToken::new(),
            tx,
        )
        .await;
        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push(e);
        }
        let stop = match events.last() {
            Some(Event::Done { stop, .. }) => *stop,
            other => panic!("{other:?}\n{events:?}"),
        };
        assert_eq!(stop == StopReason::Blocked, blocked, "{events:?}");
        // The guard answered parts that fitted its context, the whole having overflowed.
        let checks = llm.checks.lock().unwrap().clone();
        let inputs: Vec<usize> =
            checks.iter().filter(|(s, _)| *s == Check::Input.slot()).map(|(_, t)| t.len()).collect();
        assert!(inputs[0] > room && inputs.iter().filter(|&&n| n <= room).count() >= 2, "{inputs:?} against {room}");
    }
}

/// A question far past what parts can judge (a megabyte pasted: hours of the guard's time,
/// every other guarded turn `busy` behind it) is refused with `context_overflow` after a
/// bounded number of checks.
#[tokio::test]
async fn a_question_too_long_for_any_parts_is_refused_after_bounded_checks() {
    let policy = GuardPolicy { categories: false, ..GuardPolicy::default() };
    let filler = "Lorem ipsum dolor sit amet. ".repeat(20);
    let room = text_of(&policy.format.prompt(Check::Input, &filler, "").messages).len();
    let llm = Scripted::new(|_, _| Label::Safe).with_guard_room(room);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let input = TurnInput { text: filler.repeat(500), ..Default::default() };
    let pipeline = Registry::builtin().get("guard").unwrap().clone();
    run_turn(&pipeline, input, Engines { llm: &llm, policy: &policy, sessions: None }, CancellationToken::new(), tx)
        .await;
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    assert!(
        matches!(events.last(), Some(Event::Error { code: ErrorCode::ContextOverflow, is_final: true, .. })),
        "{events:?}"
    );
    let n = llm.classified.load(Ordering::SeqCst);
    assert!(n <= 33, "{n} checks");
}

#[tokio::test]
async fn the_think_stages_system_prompt_goes_to_the_thinker_only() {
    let system = "You are Kazeia. Answer briefly.";
    let text = format!(
        "[[stage]]\nkind = \"guard\"\nrole = \"guard\"\ncheck = \"input\"\n\
         [[stage]]\nkind = \"think\"\nrole = \"thinker\"\nsystem = \"{system}\"\n\
         [[stage]]\nkind = \"guard\"\nrole = \"guard\"\ncheck = \"output\"\n"
    );
    let pipeline = kazeia_pipelines::Pipeline::parse("sys", "sys.toml", &text).unwrap();
    let llm = Scripted::new(|_, _| Label::Safe);
    let events = turn_on(&llm, &pipeline).await;
    assert!(matches!(events.last(), Some(Event::Done { stop: StopReason::Eos, .. })), "{events:?}");
    let asked = llm.thinker_messages.lock().unwrap().clone();
    assert_eq!((asked[0].role.as_str(), asked[0].content.as_str()), ("system", system), "{asked:?}");
    assert_eq!(asked.last().unwrap().role, "user", "{asked:?}");
    let saw = llm.guard_saw.lock().unwrap().clone();
    assert!(!saw.is_empty() && !saw.contains("Kazeia"), "the guard saw {saw:?}");
}

/// `first_clause`: the reply's first clause is the output guard's first unit, checked and
/// released (as a `sentence`) before the rest of its sentence; every later unit is a sentence.
/// Without it, the first unit is the whole first sentence.
#[tokio::test]
async fn the_first_clause_is_checked_and_released_first() {
    let reply = "Well, the capital of France, as you know, is Paris. It is a big city.";
    let stages = "[[stage]]\nkind = \"guard\"\nrole = \"guard\"\ncheck = \"input\"\n\
                  [[stage]]\nkind = \"think\"\nrole = \"thinker\"\n\
                  [[stage]]\nkind = \"guard\"\nrole = \"guard\"\ncheck = \"output\"\n";
    for (first_clause, units) in [
        (true, vec!["Well, the capital of France,", "as you know, is Paris.", "It is a big city."]),
        (false, vec!["Well, the capital of France, as you know, is Paris.", "It is a big city."]),
    ] {
        let text = format!("first_clause = {first_clause}\n{stages}");
        let pipeline = kazeia_pipelines::Pipeline::parse("v", "v.toml", &text).unwrap();
        let llm = Scripted::new(|_, _| Label::Safe).replying(reply);
        let events = turn_on(&llm, &pipeline).await;
        let sentences: Vec<&str> = events
            .iter()
            .filter_map(|e| if let Event::Sentence { text, .. } = e { Some(text.as_str()) } else { None })
            .collect();
        assert_eq!(sentences, units, "first_clause = {first_clause}");
        // One input check, then one output check per unit, each before its release.
        assert_eq!(llm.classified.load(Ordering::SeqCst) as usize, 1 + units.len());
        let verdicts = events.iter().filter(|e| matches!(e, Event::Verdict { .. })).count();
        assert_eq!(verdicts, 1 + units.len(), "{events:?}");
    }
}

/// A guarded turn's parts for the prefill-ahead tests: the scripted engine (every check safe),
/// the policy, and a session "s" holding one exchange.
struct Conversation {
    llm: Scripted,
    policy: GuardPolicy,
    sessions: Sessions,
}

impl Conversation {
    fn new() -> Conversation {
        let sessions = Sessions::new(Duration::from_secs(60));
        sessions.append("s", ChatMessage::new("user", "Hi."), ChatMessage::new("assistant", "Hello!"));
        Conversation {
            llm: Scripted::new(|_, _| Label::Safe),
            policy: GuardPolicy { categories: false, ..GuardPolicy::default() },
            sessions,
        }
    }

    fn engines(&self) -> Engines<'_> {
        Engines { llm: &self.llm, policy: &self.policy, sessions: Some(&self.sessions) }
    }
}

/// What a voice turn prefills while the user speaks is the start of what the turn then asks:
/// the input check's prompt and the Thinker's (system prompt, session history, the user's words
/// so far), then the output check's, each cut after the last word but one.
#[tokio::test]
async fn a_prefill_ahead_renders_the_start_of_the_turns_own_prompts() {
    let c = Conversation::new();
    let (llm, engines) = (&c.llm, || c.engines());
    let registry = Registry::builtin();
    let pipeline = registry.get("guarded-chat").unwrap();
    let partial = TurnInput { text: "What is the capital.".into(), session: Some("s".into()), ..Default::default() };
    let outcomes = kazeia_pipelines::warm(pipeline, &partial, false, engines(), CancellationToken::new()).await;
    assert_eq!(
        outcomes.iter().map(|(r, o)| (r.as_str(), o.is_ok())).collect::<Vec<_>>(),
        [("guard", true), ("thinker", true), ("guard", true)]
    );

    let (tx, _rx) = mpsc::unbounded_channel();
    let whole =
        TurnInput { text: "What is the capital of France?".into(), session: Some("s".into()), ..Default::default() };
    run_turn(pipeline, whole, engines(), CancellationToken::new(), tx).await;
    let prefilled = llm.prefilled.lock().unwrap().clone();
    let cut = |t: &str| t.split('\u{E000}').next().unwrap().to_string();
    let checks = llm.checks.lock().unwrap().clone();
    let check = |slot: u32| &checks.iter().find(|(s, _)| *s == slot).expect("a check of the slot").1;
    let (role, slot, guard, _) = &prefilled[0];
    assert_eq!((role.as_str(), *slot), ("guard", Check::Input.slot()));
    assert!(cut(guard).ends_with("What is the"), "{guard:?}");
    assert!(check(*slot).starts_with(&cut(guard)), "the input check starts with the prefill");
    let (role, slot, output, _) = &prefilled[2];
    assert_eq!((role.as_str(), *slot), ("guard", Check::Output.slot()));
    assert!(cut(output).ends_with("What is the"), "{output:?}");
    assert!(check(*slot).starts_with(&cut(output)), "the output check starts with the prefill");
    let (role, slot, thinker, _) = &prefilled[1];
    assert_eq!((role.as_str(), *slot), ("thinker", 0));
    let asked = text_of(&llm.thinker_messages.lock().unwrap());
    assert!(asked.contains("Hello!") && asked.starts_with(&cut(thinker)), "{asked:?} / {thinker:?}");
    assert!(cut(thinker).ends_with("user: What is the"), "{thinker:?}");

    assert!(prefilled.iter().all(|p| p.3 == Upto::Cut), "{prefilled:?}");

    // One word heard: nothing worth prefilling.
    let one = TurnInput { text: "What".into(), ..Default::default() };
    assert!(kazeia_pipelines::warm(pipeline, &one, false, engines(), CancellationToken::new()).await.is_empty());
}

/// The whole utterance's transcript before its pause: the input check's and the Thinker's
/// prompts are the turn's own, whole (the engine stops before what the requests decode); the
/// output check's goes up to where the reply begins.
#[tokio::test]
async fn a_whole_transcript_is_prefilled_as_the_turn_will_ask() {
    let c = Conversation::new();
    let (llm, engines) = (&c.llm, || c.engines());
    let registry = Registry::builtin();
    let pipeline = registry.get("guarded-chat").unwrap();
    let question = "What is the capital of France?";
    let input = |budget| TurnInput {
        text: question.into(),
        session: Some("s".into()),
        options: GenerateOptions { thinking_budget: budget, max_tokens: Some(7), ..Default::default() },
        ..Default::default()
    };
    let outcomes = kazeia_pipelines::warm(pipeline, &input(Some(0)), true, engines(), CancellationToken::new()).await;
    assert_eq!(outcomes.len(), 3);
    let (tx, _rx) = mpsc::unbounded_channel();
    run_turn(pipeline, input(Some(0)), engines(), CancellationToken::new(), tx).await;
    let prefilled = llm.prefilled.lock().unwrap().clone();
    let checks = llm.checks.lock().unwrap().clone();
    let check = |slot: u32| checks.iter().find(|(s, _)| *s == slot).expect("a check of the slot").1.clone();

    let (role, slot, text, upto) = &prefilled[0];
    assert_eq!((role.as_str(), *slot), ("guard", Check::Input.slot()));
    assert_eq!(*text, check(*slot), "the input check's own prompt");
    let prefix = c.policy.format.prompt(Check::Input, question, "").answer_prefix;
    assert_eq!(*upto, Upto::Check { answer_prefix: prefix });
    let (role, slot, text, upto) = &prefilled[1];
    assert_eq!((role.as_str(), *slot), ("thinker", 0));
    assert_eq!(*text, text_of(&llm.thinker_messages.lock().unwrap()), "the Thinker's own prompt");
    assert_eq!(*upto, Upto::Generation);
    // The prefill leaves out the history the Thinker's request will leave out: the same place,
    // the same budget and most new tokens.
    let fits = llm.fits.lock().unwrap().clone();
    assert_eq!(fits.len(), 2, "{fits:?}");
    assert_eq!(fits[0], fits[1]);
    assert!(matches!(fits[0].0, Some((_, n)) if n >= 2), "the session's turns: {fits:?}");
    assert_eq!((fits[0].1.thinking_budget, fits[0].1.max_tokens), (Some(0), Some(7)));
    let (role, slot, text, upto) = &prefilled[2];
    assert_eq!((role.as_str(), *slot), ("guard", Check::Output.slot()));
    assert_eq!(*upto, Upto::Cut);
    let head = text.split('\u{E000}').next().unwrap();
    assert!(head.contains(question) && check(*slot).starts_with(head), "{head:?}");
    assert!(head.trim_end().ends_with("ASSISTANT:"), "up to the reply: {head:?}");

    // Nothing heard, or the cut mark in the text: nothing prefilled.
    for text in ["", "  ", "a\u{E000} b"] {
        let t = TurnInput { text: text.into(), ..Default::default() };
        assert!(kazeia_pipelines::warm(pipeline, &t, true, engines(), CancellationToken::new()).await.is_empty());
    }
}

/// Released text of `events`: tokens, and the sentences and thoughts.
fn released(events: &[Event]) -> (String, Vec<&str>, Vec<&str>) {
    let mut tokens = String::new();
    let (mut sentences, mut thoughts) = (Vec::new(), Vec::new());
    for e in events {
        match e {
            Event::Token { text, .. } => tokens.push_str(text),
            Event::Sentence { text, .. } => sentences.push(text.as_str()),
            Event::Thinking { text, .. } => thoughts.push(text.as_str()),
            _ => {}
        }
    }
    (tokens, sentences, thoughts)
}

/// A cancel that comes while a unit's verdict is ready: the unit is not released (the verdict
/// came first in the runner's select half the time, and the sentence left after the cancel).
#[tokio::test]
async fn a_unit_whose_verdict_meets_the_cancel_is_not_released() {
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    // The second sentence's check: the turn is cancelled, and the verdict (Safe) is ready at once.
    let llm = Scripted::new(move |check, seen| {
        if check == Check::Output && seen.contains("hurt") {
            c.cancel();
        }
        Label::Safe
    });
    let registry = Registry::builtin();
    let policy = GuardPolicy { categories: false, ..GuardPolicy::default() };
    let input = TurnInput { text: "What is the capital of France?".into(), ..Default::default() };
    let events = turn_with(&llm, registry.get("guarded-chat").unwrap(), &policy, input, cancel).await;
    let (tokens, sentences, _) = released(&events);
    assert_eq!(tokens, SENTENCES[0], "{events:?}");
    assert_eq!(sentences, [SENTENCES[0].trim()], "{events:?}");
    assert!(matches!(events.last(), Some(Event::Done { stop: StopReason::Cancelled, .. })), "{events:?}");
}

/// A rule that passes (`Safe`) decides the text it matches, not the sentences after it: the
/// output rule layer read the reply so far, so once a released sentence matched, every later
/// one passed by rule, without the model.
#[tokio::test]
async fn a_safe_rule_decides_only_the_unit_it_matches() {
    let cfg: kazeia_pipelines::GuardConfig = toml::from_str(
        "categories = false\n[[rules]]\npattern = \"(?i)bath salts\"\nlabel = \"Safe\"\non = \"output\"\n",
    )
    .unwrap();
    let policy = GuardPolicy::new(&cfg).unwrap();
    let llm = Scripted::new(
        |check, seen| if check == Check::Output && seen.contains("hurt") { Label::Unsafe } else { Label::Safe },
    )
    .replying("Bath salts are relaxing. Here is how to hurt someone. The end.");
    let registry = Registry::builtin();
    let input = TurnInput { text: "Tell me about baths.".into(), ..Default::default() };
    let events = turn_with(&llm, registry.get("guarded-chat").unwrap(), &policy, input, CancellationToken::new()).await;
    let (tokens, _, _) = released(&events);
    assert!(tokens.starts_with("Bath salts are relaxing. "), "{events:?}");
    assert!(!tokens.contains("hurt"), "the second sentence went to the model, which blocks it: {events:?}");
    assert!(matches!(events.last(), Some(Event::Done { stop: StopReason::Blocked, .. })), "{events:?}");
}

/// Shown reasoning is judged unit by unit after the reasoning released before it, as a reply's
/// sentences are: each was judged alone, so steps harmless one at a time passed together.
#[tokio::test]
async fn shown_reasoning_is_judged_with_the_reasoning_before_it() {
    // The guard blocks the two steps together, never either alone.
    let llm = Scripted::new(|check, seen| {
        if check == Check::Output && seen.contains("obtain X") && seen.contains("mix it with Y") {
            Label::Unsafe
        } else {
            Label::Safe
        }
    })
    .thinking("Step one: obtain X. Step two: mix it with Y. ");
    let registry = Registry::builtin();
    let policy = GuardPolicy { categories: false, ..GuardPolicy::default() };
    let input = TurnInput { text: "What is the capital of France?".into(), show_thinking: true, ..Default::default() };
    let events = turn_with(&llm, registry.get("guarded-chat").unwrap(), &policy, input, CancellationToken::new()).await;
    let (tokens, _, thoughts) = released(&events);
    assert_eq!(thoughts, ["Step one: obtain X. "], "{events:?}");
    assert!(!tokens.contains("Paris"), "{events:?}");
    assert!(matches!(events.last(), Some(Event::Done { stop: StopReason::Blocked, .. })), "{events:?}");
}

/// A spoken reply with no output guard (`[think, speak]`) is sent to the speaker sentence by
/// sentence too: only the output guard's path sent `sentence` events, the ones the speaker
/// speaks, and such a pipeline said nothing.
#[tokio::test]
async fn an_unguarded_spoken_reply_is_spoken_sentence_by_sentence() {
    let text = "[[stage]]\nkind = \"think\"\nrole = \"thinker\"\n[[stage]]\nkind = \"speak\"\n";
    let pipeline = kazeia_pipelines::Pipeline::parse("v", "v.toml", text).unwrap();
    let llm = Scripted::new(|_, _| Label::Safe).replying("Paris is the capital. It is a big city, and old");
    let events = turn_on(&llm, &pipeline).await;
    let (tokens, sentences, _) = released(&events);
    assert_eq!(tokens, "Paris is the capital. It is a big city, and old");
    assert_eq!(sentences, ["Paris is the capital.", "It is a big city, and old"], "{events:?}");
    assert_eq!(llm.classified.load(Ordering::SeqCst), 0);
}
