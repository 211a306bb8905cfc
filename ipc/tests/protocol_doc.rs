//! docs/PROTOCOL.md is a contract: its tables name exactly the error codes, request types and
//! `done` metrics the code has. A code added without its row (or a row left for a code gone)
//! fails here, not in a client written from the text. The wording of each row is read by
//! people; what is checked is that the names agree both ways.

use kazeia_ipc::{ErrorCode, Metrics, REQUEST_TYPES};

fn doc() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/PROTOCOL.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text of the section whose heading starts with `## {n}.`, up to the next section.
fn section(doc: &str, n: u32) -> &str {
    let head = format!("\n## {n}. ");
    let start = doc.find(&head).unwrap_or_else(|| panic!("no section {n}"));
    let rest = &doc[start + head.len()..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

/// The first column of a section's table rows: "| `name` | …".
fn first_column(section: &str) -> Vec<String> {
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// Every code, in one exhaustive match (each names the next): a new variant does not compile
/// until it is listed here, and then this test asks for its row.
fn all_codes() -> Vec<ErrorCode> {
    use ErrorCode::*;
    let next = |c: Option<ErrorCode>| match c {
        None => Some(BadConfig),
        Some(BadConfig) => Some(ModelFile),
        Some(ModelFile) => Some(LoadFailed),
        Some(LoadFailed) => Some(NoModel),
        Some(NoModel) => Some(ContextOverflow),
        Some(ContextOverflow) => Some(Engine),
        Some(Engine) => Some(Pipeline),
        Some(Pipeline) => Some(BadRequest),
        Some(BadRequest) => Some(Busy),
        Some(Busy) => Some(BadJson),
        Some(BadJson) => Some(UnknownType),
        Some(UnknownType) => Some(FrameTooLarge),
        Some(FrameTooLarge) => Some(BadFrame),
        Some(BadFrame) => Some(ProtocolVersion),
        Some(ProtocolVersion) => Some(HandshakeRequired),
        Some(HandshakeRequired) => Some(NoAudioRequest),
        Some(NoAudioRequest) => Some(UnknownRequest),
        Some(UnknownRequest) => Some(DuplicateId),
        Some(DuplicateId) => Some(PermissionDenied),
        Some(PermissionDenied) => Some(ShuttingDown),
        Some(ShuttingDown) => Some(Cancelled),
        Some(Cancelled) => Some(OverBudget),
        Some(OverBudget) => Some(MemoryPressure),
        Some(MemoryPressure) => Some(TooManyConnections),
        Some(TooManyConnections) => Some(TooManyTurns),
        Some(TooManyTurns) => Some(NoSpeech),
        Some(NoSpeech) => None,
    };
    std::iter::successors(next(None), |&c| next(Some(c))).collect()
}

fn wire(code: ErrorCode) -> String {
    serde_json::to_value(code).unwrap().as_str().unwrap().to_string()
}

#[test]
fn the_error_code_table_names_every_code_and_no_other() {
    let doc = doc();
    let rows = first_column(section(&doc, 6));
    let codes: Vec<String> = all_codes().into_iter().map(wire).collect();
    for c in &codes {
        assert_eq!(rows.iter().filter(|r| *r == c).count(), 1, "`{c}`: not one row in PROTOCOL.md §6");
    }
    for r in &rows {
        assert!(codes.contains(r), "PROTOCOL.md §6 has `{r}`, which is no ErrorCode");
    }
}

#[test]
fn the_request_table_names_every_request_type_and_no_other() {
    let doc = doc();
    let rows = first_column(section(&doc, 4));
    let mut known: Vec<String> = REQUEST_TYPES.iter().map(|t| t.to_string()).collect();
    known.sort();
    let mut rows = rows;
    rows.sort();
    assert_eq!(rows, known, "PROTOCOL.md §4's table against kazeia_ipc::REQUEST_TYPES");
}

#[test]
fn every_metric_of_done_is_documented() {
    // Every field set, so that none is skipped when serialized; named one by one, so that a
    // new field does not compile until it is set here.
    let all = Metrics {
        prompt_tokens: 0,
        generated_tokens: 0,
        ttft_ms: 0.0,
        prefill_tok_s: 0.0,
        decode_tok_s: 0.0,
        cached_tokens: 0,
        guard_in_ms: Some(0.0),
        ttfs_ms: Some(0.0),
        guard_out_ms: Some(0.0),
        tokens_held: Some(0),
        thinking_tokens: Some(0),
        thinking_ms: Some(0.0),
        ttfa_ms: Some(0.0),
        end_of_turn_ms: Some(0.0),
        turn_checks: Some(0),
        turn_check_ms: Some(0.0),
        stt_ms: Some(0.0),
        tts_first_ms: Some(0.0),
        speech_end_to_audio_ms: Some(0.0),
        early_start_ms: Some(0.0),
    };
    let serde_json::Value::Object(fields) = serde_json::to_value(all).unwrap() else { panic!("not an object") };
    let doc = doc();
    let events = section(&doc, 5);
    let metrics = &events[events.find("`metrics`:").expect("§5 describes `metrics`")..];
    for name in fields.keys() {
        assert!(metrics.contains(&format!("`{name}`")), "`{name}` is not described in PROTOCOL.md §5's metrics");
    }
}
