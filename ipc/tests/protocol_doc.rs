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

/// The variants of `pub enum {name}` in `src/{file}`, as the wire writes them (snake_case),
/// read from the source itself: a variant added there is in this list without anyone
/// remembering to add it (a list kept by hand next to the test could forget it).
fn variants(file: &str, name: &str) -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(file);
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let head = format!("pub enum {name} {{\n");
    let body = &src[src.find(&head).unwrap_or_else(|| panic!("no `{head}` in {file}")) + head.len()..];
    let body = &body[..body.find("\n}").expect("the enum's end")];
    // A variant starts a line at the enum's indentation (4 spaces) with a capital letter.
    let found: Vec<String> = body
        .lines()
        .filter_map(|l| l.strip_prefix("    "))
        .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()))
        .map(|l| l.split(|c: char| !c.is_ascii_alphanumeric()).next().unwrap())
        .map(|v| {
            let mut snake = String::new();
            for (k, c) in v.chars().enumerate() {
                if c.is_ascii_uppercase() && k > 0 {
                    snake.push('_');
                }
                snake.push(c.to_ascii_lowercase());
            }
            snake
        })
        .collect();
    assert!(found.len() >= 5, "{name}: only {found:?} read from {file}");
    found
}

/// Every error code, read from its enum; each checked to be the wire's own spelling.
fn all_codes() -> Vec<String> {
    let codes = variants("event.rs", "ErrorCode");
    for c in &codes {
        let parsed: ErrorCode = serde_json::from_value(serde_json::Value::String(c.clone()))
            .unwrap_or_else(|e| panic!("`{c}` read from ErrorCode is not its wire name: {e}"));
        assert_eq!(serde_json::to_value(parsed).unwrap(), c.as_str());
    }
    codes
}

#[test]
fn the_error_code_table_names_every_code_and_no_other() {
    let doc = doc();
    let rows = first_column(section(&doc, 6));
    let codes = all_codes();
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
    let mut rows = first_column(section(&doc, 4));
    rows.sort();
    // The parser's list of known types is the enum's.
    let mut known = variants("request.rs", "Request");
    known.sort();
    let mut listed: Vec<String> = REQUEST_TYPES.iter().map(|t| t.to_string()).collect();
    listed.sort();
    assert_eq!(listed, known, "kazeia_ipc::REQUEST_TYPES against the Request enum");
    assert_eq!(rows, known, "PROTOCOL.md §4's table against the Request enum");
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
