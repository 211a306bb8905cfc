//! The short soak of CI: `kazeia soak` against a real daemon with the default pair of roles
//! (Thinker and Guard on SmolLM2): 100 mixed turns, two clients, cancels, vanishing clients,
//! reloads. It must pass its own checks (budget, RSS drift ≤ 5% here, no FD or thread growth) and
//! write its CSV and plot (kept in the target directory, outside the clone).

use crate::common;

use std::process::Command;

use common::{smollm2, Daemon};

#[test]
fn short_soak_passes_and_writes_its_plot() {
    let m = smollm2();
    let text = format!(
        "[daemon]\npreload = true\n\n\
         [[model]]\nrole = \"thinker\"\nfile = \"{f}\"\nn_ctx = 2048\nthreads = 2\nbackend = \"cpu\"\n[model.sampling]\ntemperature = 0.7\nmax_tokens = 64\n\n\
         [[model]]\nrole = \"guard\"\nfile = \"{f}\"\nn_ctx = 2048\nn_ubatch = 128\ncache_slots = 2\nthreads = 2\nbackend = \"cpu\"\npriority = 90\n[model.sampling]\ntemperature = 0.0\nmax_tokens = 16\n\n\
         [guard]\nformat = \"compact\"\n",
        f = m.display()
    );
    let d = Daemon::start(&text);
    let out = common::run_dir("soak");
    let (png, csv) = (out.join("ci-memory.png"), out.join("ci-memory.csv"));
    let run = Command::new(env!("CARGO_BIN_EXE_kazeia"))
        .args([
            "soak",
            "--socket",
            d.socket.to_str().unwrap(),
            "--turns",
            "100",
            "--clients",
            "2",
            "--interval-ms",
            "100",
            "--json",
        ])
        // 100 turns take ~40 s: KV pages touched as the contexts fill are still growing towards
        // their plateau (seen: drift +0.07% on one run, +2.14% on another), so this short soak
        // leaves out 30% as warm-up and allows 5%. The leak it guards against (12 MiB per
        // reload, 4 reloads here: +19%) still fails it; the long soak keeps the 2% default.
        .args(["--warmup", "0.3", "--max-drift", "0.05"])
        .args(["--plot", png.to_str().unwrap(), "--csv", csv.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    eprintln!("{stdout}\nplot: {}", png.display());
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().expect("a summary line")).unwrap();
    assert!(run.status.success() && summary["passed"] == true, "{summary:#}\n{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(summary["errors"], 0, "{summary:#}");
    assert!(
        summary["cancelled"].as_u64().unwrap() > 0
            && summary["vanished"].as_u64().unwrap() > 0
            && summary["reloads"].as_u64().unwrap() > 0,
        "{summary:#}"
    );
    assert!(summary["peak_rss_bytes"].as_u64().unwrap() < summary["budget_bytes"].as_u64().unwrap());
    assert_eq!(&std::fs::read(&png).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
    assert!(std::fs::read_to_string(&csv).unwrap().lines().count() > 100);
    assert!(!d.log().contains("panicked"), "{}", d.log());
}
