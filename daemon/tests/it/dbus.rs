//! `org.kazeia.Engine1` on a real bus: the test starts its own `dbus-daemon` (Debian `dbus`),
//! points the daemon at it, and reads everything back with `busctl`, `gdbus` and `dbus-monitor` — other
//! programs, as a desktop shell would.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use common::{smollm2, Daemon, Reaped};
use kazeia_ipc::{Event, Incoming, Request, StopReason, TurnOptions};

const DEST: &str = "org.kazeia.Engine1";
const PATH: &str = "/org/kazeia/Engine1";

struct Bus {
    child: Child,
    address: String,
}

impl Bus {
    /// A session bus that any user may reach (a shared bus, as a system bus is): the tests call
    /// it as another user too.
    fn start(dir: &std::path::Path) -> Bus {
        use std::os::unix::fs::PermissionsExt;
        let address = format!("unix:path={}", dir.join("bus").display());
        let config = dir.join("bus.conf");
        std::fs::write(
            &config,
            format!(
                "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\"\n \
                 \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n\
                 <busconfig><type>session</type><listen>{address}</listen><auth>EXTERNAL</auth>\
                 <policy context=\"default\"><allow user=\"*\"/><allow send_destination=\"*\" eavesdrop=\"true\"/>\
                 <allow eavesdrop=\"true\"/><allow own=\"*\"/></policy></busconfig>\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut child = Command::new("dbus-daemon")
            .args(["--nofork", "--nopidfile", "--print-address=1", &format!("--config-file={}", config.display())])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("dbus-daemon (Debian package `dbus`; tools/setup installs it)");
        // It prints its address once it listens.
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("unix:path="), "dbus-daemon said {line:?}");
        std::fs::set_permissions(dir.join("bus"), std::fs::Permissions::from_mode(0o777)).unwrap();
        Bus { child, address }
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tool(bus: &Bus, program: &str, args: &[&str]) -> String {
    let addr_flag = format!("--address={}", bus.address);
    let mut cmd = Command::new(program);
    match program {
        "busctl" => cmd.arg(&addr_flag).args(args),
        // gdbus wants its command first: `gdbus call --address … …`.
        _ => cmd.arg(args[0]).args(["--address", &bus.address]).args(&args[1..]),
    };
    let out = cmd.output().unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn property(bus: &Bus, name: &str) -> String {
    tool(bus, "busctl", &["get-property", DEST, PATH, DEST, name]).trim().to_string()
}

/// `dbus-monitor` on the daemon's object, its output collected, once it is listening. It
/// becomes a monitor with one blocking call, and the bus then tells it it lost its own name:
/// that line is the signal that every later signal will be seen. (`gdbus monitor` subscribes
/// asynchronously and says nothing when it has, so a signal right after its start may be lost.)
fn monitor(bus: &Bus) -> (Reaped, Arc<Mutex<String>>) {
    let mut child = Command::new("dbus-monitor")
        .args(["--address", &bus.address, &format!("type='signal',path='{PATH}'")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("dbus-monitor (Debian package dbus-bin)");
    let out = common::collect_lines(child.stdout.take().unwrap());
    let reaped = Reaped(child);
    wait_for("dbus-monitor to become a monitor", || out.lock().unwrap().contains("member=NameLost"));
    (reaped, out)
}

/// Whether `seen` (dbus-monitor's output) holds the signal `member` of our interface with the
/// string argument `arg`.
fn signal_seen(seen: &Mutex<String>, member: &str, arg: &str) -> bool {
    seen.lock().unwrap().contains(&format!("interface={DEST}; member={member}\n   string \"{arg}\""))
}

fn wait_for(what: &str, f: impl FnMut() -> bool) {
    common::wait_until(what, f, String::new);
}

#[tokio::test(flavor = "multi_thread")]
async fn engine1_on_a_real_session_bus() {
    let busdir = tempfile::tempdir().unwrap();
    let bus = Bus::start(busdir.path());
    let text = format!(
        "[daemon]\npreload = false\n\n[dbus]\nenabled = true\nbus = \"{}\"\n\n[budget]\ndevice_ram = \"8GiB\"\nreserve_os = \"1GiB\"\nreserve_app = 0\n\n[[model]]\nrole = \"thinker\"\nfile = \"{}\"\nn_ctx = 2048\nthreads = 2\nbackend = \"cpu\"\n[model.sampling]\ntemperature = 0.9\nmax_tokens = 400\n",
        bus.address,
        smollm2().display()
    );
    let d = Daemon::start(&text);
    wait_for("the name on the bus", || tool(&bus, "busctl", &["list", "--no-pager"]).contains(DEST));

    // Properties, read by another program.
    assert_eq!(property(&bus, "State"), "s \"serving\"");
    assert_eq!(property(&bus, "LoadedModels"), "as 0");
    assert_eq!(property(&bus, "MemoryBudget"), format!("t {}", 7u64 << 30));
    let used: u64 = property(&bus, "MemoryUsed").strip_prefix("t ").unwrap().parse().unwrap();
    assert!(used > 1_000_000, "{used}");
    assert_eq!(property(&bus, "Pressure"), "s \"normal\"");
    let intro = tool(&bus, "gdbus", &["introspect", "--dest", DEST, "--object-path", PATH]);
    for m in ["Status", "CancelAll", "ModelLoaded", "ModelUnloaded", "MemoryPressure", "MemoryReserved"] {
        assert!(intro.contains(m), "{m} missing from {intro}");
    }

    // Signals: load and unload through the socket, watched on the bus.
    let (_monitor, seen) = monitor(&bus);
    let c = d.client().await;
    let mut rx = c.send(Request::Load { id: c.new_id(), role: "thinker".into() }).await.unwrap();
    while !matches!(rx.recv().await, Some(Incoming::Event(Event::Loaded { .. }))) {}
    wait_for("ModelLoaded", || signal_seen(&seen, "ModelLoaded", "thinker"));
    assert_eq!(property(&bus, "LoadedModels"), "as 1 \"thinker\"");
    let reserved: u64 = property(&bus, "MemoryReserved").strip_prefix("t ").unwrap().parse().unwrap();
    assert!(reserved > 50_000_000, "{reserved}");

    // Status: the socket's report, as JSON (busctl's JSON output carries the string intact).
    let reply: serde_json::Value =
        serde_json::from_str(&tool(&bus, "busctl", &["--json=short", "call", DEST, PATH, DEST, "Status"])).unwrap();
    let report: kazeia_ipc::StatusReport = serde_json::from_str(reply["data"][0].as_str().unwrap()).unwrap();
    assert_eq!(report.models[0].role, "thinker");
    assert_eq!(report.models[0].state, kazeia_ipc::ModelState::Loaded);
    assert_eq!(report.pid, d.child.id());

    // CancelAll stops a running turn.
    let mut turn = c
        .turn(
            &c.new_id(),
            "chat",
            "Write a very long story about a dragon.",
            TurnOptions { max_tokens: Some(400), ..Default::default() },
        )
        .await
        .unwrap();
    loop {
        if let Some(Incoming::Event(Event::Token { .. })) = turn.recv().await {
            break;
        }
    }
    // Another user on the bus (uid 65534, not allowed on the socket either) is refused, and the
    // turn goes on: CancelAll once cancelled every user's turns for anyone who could call it.
    // Nor may it read the Status report (the model files, the turns).
    let call = ["call", "--address", &bus.address, "--dest", DEST, "--object-path", PATH];
    for method in ["org.kazeia.Engine1.CancelAll", "org.kazeia.Engine1.Status"] {
        let other = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "gdbus"])
            .args(call)
            .args(["--method", method])
            .output()
            .expect("setpriv (util-linux)");
        let said = String::from_utf8_lossy(&other.stderr);
        assert!(!other.status.success() && said.contains("AccessDenied"), "{method}: {said}");
    }
    assert_eq!(d.client().await.status().await.unwrap().turns_running, 1);
    // The daemon's own user cancels it.
    let n = tool(
        &bus,
        "gdbus",
        &["call", "--dest", DEST, "--object-path", PATH, "--method", "org.kazeia.Engine1.CancelAll"],
    );
    assert_eq!(n.trim(), "(uint32 1,)");
    let (_, end) = common::finish(&mut turn).await;
    assert!(matches!(end, Event::Done { stop: StopReason::Cancelled, .. }), "{end:?}");

    // At once after `done`: the turn released the role before its final event.
    let mut rx = c.send(Request::Unload { id: c.new_id(), role: "thinker".into() }).await.unwrap();
    let got = rx.recv().await;
    assert!(matches!(got, Some(Incoming::Event(Event::Unloaded { .. }))), "{got:?}");
    wait_for("ModelUnloaded", || signal_seen(&seen, "ModelUnloaded", "thinker"));
    assert!(seen.lock().unwrap().contains("member=PropertiesChanged"), "{}", seen.lock().unwrap());
    assert_eq!(property(&bus, "LoadedModels"), "as 0");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_bus_is_logged_and_the_socket_still_serves() {
    let text = format!(
        "[daemon]\npreload = false\n\n[dbus]\nenabled = true\nbus = \"unix:path=/nonexistent/kazeia-bus\"\n\n[[model]]\nrole = \"thinker\"\nfile = \"{}\"\nthreads = 2\n",
        smollm2().display()
    );
    let d = Daemon::start(&text);
    let c = d.client().await;
    assert!(c.status().await.is_ok());
    d.wait_log("D-Bus: cannot publish");
}
