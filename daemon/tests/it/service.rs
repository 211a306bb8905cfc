//! The service files of dist/: the systemd units pass `systemd-analyze verify` (with ExecStart
//! pointed at the binary under test), and the Android .rc names the socket the daemon reads.
//! That the daemon serves on a socket handed over by systemd or init is in socket.rs
//! (`systemd_socket_activation`, `android_init_socket`).

use std::process::Command;

use crate::common;

fn dist(rel: &str) -> String {
    std::fs::read_to_string(common::repo().join("dist").join(rel)).unwrap()
}

#[test]
fn systemd_units_verify() {
    let dir = tempfile::tempdir().unwrap();
    let service = dist("systemd/kazeia.service").replace("%h/.cargo/bin/kazeia", env!("CARGO_BIN_EXE_kazeia"));
    std::fs::write(dir.path().join("kazeia.service"), service).unwrap();
    std::fs::write(dir.path().join("kazeia.socket"), dist("systemd/kazeia.socket")).unwrap();
    let runtime = dir.path().join("run");
    std::fs::create_dir(&runtime).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["--user", "verify", "kazeia.socket", "kazeia.service"])
        .current_dir(dir.path())
        .env("XDG_RUNTIME_DIR", &runtime)
        .output()
        .expect("systemd-analyze (Debian package systemd; tools/setup installs it)");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}");
}

#[test]
fn android_rc_declares_the_socket_the_daemon_reads() {
    let rc = dist("android/kazeia.rc");
    assert!(rc.contains("service kazeia ") && rc.contains(" serve --config "));
    // init exports ANDROID_SOCKET_<name>: the name must be the one socket.rs reads.
    assert!(rc.lines().any(|l| l.trim().starts_with("socket kazeia stream ")), "{rc}");
    assert!(rc.lines().any(|l| l.trim().starts_with("oom_score_adj ")));
    assert!(rc.lines().any(|l| l.trim().starts_with("user ")));
}
