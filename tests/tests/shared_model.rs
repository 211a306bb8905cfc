//! Two roles naming one file load it once: measured with the process's resident memory, against
//! a control (a byte-identical copy under another name, which must load again).
//! Alone in its own test binary so no other test moves the numbers.

use kazeia_engine::Engine;
use kazeia_tests::{config, model_toml, proc_status_bytes, pss_bytes, smollm2};

#[test]
fn two_roles_on_one_file_load_it_once() {
    let file = smollm2();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.gguf");
    std::fs::copy(&file, &copy).unwrap();
    let file_bytes = std::fs::metadata(&file).unwrap().len();

    let extra = "n_ctx = 256\nn_batch = 64\nn_ubatch = 64";
    let c = config(&format!(
        "{}{}{}",
        model_toml("thinker", &file, extra),
        model_toml("guard", &file, extra),
        model_toml("other", &copy, extra)
    ));
    let engine = Engine::new();
    let load = |role: &str| {
        let before = (proc_status_bytes("VmRSS"), pss_bytes());
        let m = c.model(role).unwrap();
        engine.load(&m.role_params(), c.model_path(m), Box::new(|_| {})).unwrap();
        let after = (proc_status_bytes("VmRSS"), pss_bytes());
        (after.0 as i64 - before.0 as i64, after.1 as i64 - before.1 as i64)
    };
    let first = load("thinker");
    let shared = load("guard");
    let control = load("other");
    let mib = |b: i64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "file {:.1} MiB; growth (RSS/Pss MiB): first role {:.1}/{:.1}, second role on the same file {:.1}/{:.1}, same bytes under another name {:.1}/{:.1}",
        mib(file_bytes as i64), mib(first.0), mib(first.1), mib(shared.0), mib(shared.1), mib(control.0), mib(control.1)
    );
    // The control proves that a load of these bytes costs about the file's size...
    assert!(control.0 as f64 > 0.7 * file_bytes as f64, "control load grew RSS by only {} B", control.0);
    // ...and the second role on the same file costs only its own context.
    assert!(
        (shared.0 as f64) < 0.25 * control.0 as f64,
        "second role grew RSS by {} B (control {} B)",
        shared.0,
        control.0
    );
    assert!(
        (shared.1 as f64) < 0.25 * control.1 as f64,
        "second role grew Pss by {} B (control {} B)",
        shared.1,
        control.1
    );
    assert_eq!(engine.loaded_models(), 2);
    assert_eq!(engine.info("guard").unwrap().shares_model_with, vec!["thinker".to_string()]);
}
