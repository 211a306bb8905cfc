//! A real `kazeia serve` process on a temporary socket, with the real default model.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kazeia_ipc::{Client, Event, Incoming};
use tokio::sync::mpsc::UnboundedReceiver;

/// The checkout under test, read when the test runs (cargo sets `CARGO_MANIFEST_DIR` for it),
/// not built in with `env!`: the build cache outside the clone is shared by every clone, and a
/// test binary still fresh from another checkout's build would read that checkout's files, or
/// fail once it is deleted.
pub fn repo() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo test")).join("..")
}

/// The repo's models.toml with `lines` added at the top of its `[speech]` table.
pub fn shipped_models_with_speech(lines: &str) -> String {
    let models = std::fs::read_to_string(repo().join("models.toml")).unwrap();
    assert!(models.contains("\n[speech]\n"), "models.toml has no [speech] table");
    models.replacen("\n[speech]\n", &format!("\n[speech]\n{lines}"), 1)
}

pub fn smollm2() -> PathBuf {
    model_file("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

pub fn gemma3() -> PathBuf {
    model_file("gemma3/gemma-3-270m-q4_k_m.gguf")
}

/// A file of the model cache (`KAZEIA_MODELS`, else ~/.cache/kazeia/models), which must exist.
fn model_file(rel: &str) -> PathBuf {
    let p = models_dir().join(rel);
    assert!(p.is_file(), "{} missing: run tools/fetch-models", p.display());
    p
}

/// The model cache: `KAZEIA_MODELS`, else ~/.cache/kazeia/models.
fn models_dir() -> PathBuf {
    std::env::var_os("KAZEIA_MODELS").map(PathBuf::from).unwrap_or_else(|| dirs_cache().join("kazeia").join("models"))
}

fn dirs_cache() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache"))
}

/// The daemons of this file's tests run one at a time: each uses both cores, and the tests
/// measure latencies.
static SERIAL: Mutex<()> = Mutex::new(());

/// The turn of a test that runs models in its own process, not in a daemon (see [`SERIAL`]).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

pub struct Daemon {
    _serial: Option<std::sync::MutexGuard<'static, ()>>,
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub stderr: Arc<Mutex<String>>,
}

/// The thinker role on SmolLM2 plus `[daemon]` settings from `daemon_toml`.
pub fn config(daemon_toml: &str) -> String {
    format!(
        "[daemon]\n{daemon_toml}\n\n[[model]]\nrole = \"thinker\"\nfile = \"{}\"\nn_ctx = 2048\nthreads = 2\nbackend = \"auto\"\n[model.sampling]\ntemperature = 0.0\nmax_tokens = 64\n",
        smollm2().display()
    )
}

impl Daemon {
    pub fn start(config_text: &str) -> Daemon {
        Daemon::start_with_env(config_text, &[])
    }

    /// [`Daemon::start`] with `env` added to the daemon's environment.
    pub fn start_with_env(config_text: &str, env: &[(&str, &str)]) -> Daemon {
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        Daemon::start_in_with_env(serial, tempfile::tempdir().unwrap(), config_text, env)
    }

    pub fn start_in(serial: std::sync::MutexGuard<'static, ()>, dir: tempfile::TempDir, config_text: &str) -> Daemon {
        Daemon::start_in_with_env(serial, dir, config_text, &[])
    }

    fn start_in_with_env(
        serial: std::sync::MutexGuard<'static, ()>,
        dir: tempfile::TempDir,
        config_text: &str,
        env: &[(&str, &str)],
    ) -> Daemon {
        let cfg = dir.path().join("models.toml");
        std::fs::write(&cfg, config_text).unwrap();
        let socket = dir.path().join("run").join("engine.sock");
        let (child, stderr) = spawn_with_env(&cfg, &socket, env);
        let d = Daemon { _serial: Some(serial), child, dir, socket, stderr };
        d.wait_ready();
        d
    }

    fn wait_ready(&self) {
        self.wait_log("listening on");
    }

    /// Wait until the daemon's log holds `needle`. The log is read by another thread as the
    /// daemon writes it: a line the daemon has written may not be here yet, so never read the
    /// log once and conclude.
    #[track_caller]
    pub fn wait_log(&self, needle: &str) {
        wait_until(
            &format!("{needle:?} in the daemon's log"),
            || self.stderr.lock().unwrap().contains(needle),
            || self.log(),
        );
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.socket, "test").await.expect("connect")
    }

    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Wait for exit; the exit code.
    pub fn wait(&mut self, limit: Duration) -> Option<i32> {
        let t = Instant::now();
        while t.elapsed() < limit {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

/// A directory of this run of the test binary under the build's temporary directory,
/// `{name}-{pid}`, emptied; those of runs that have ended are removed (a run is known by its
/// pid in this PID namespace: a suite in another container sharing the build directory would
/// look ended). One per process: the build directory is shared by every checkout
/// (`CARGO_TARGET_DIR`), and a suite started in another one while this one ran emptied a shared
/// directory under its daemons.
pub fn run_dir(name: &str) -> PathBuf {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let prefix = format!("{name}-");
    for entry in std::fs::read_dir(&base).into_iter().flatten().flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        // (The single `{name}` of earlier versions is left alone: a checkout of one may be
        // running its suite now.)
        let ended = match file.strip_prefix(&prefix).map(str::parse::<u32>) {
            Some(Ok(pid)) => !Path::new(&format!("/proc/{pid}")).exists(),
            _ => false,
        };
        if ended {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let dir = base.join(format!("{prefix}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The cache directory of the test daemons, new for each run of this binary ([`run_dir`]):
/// their prefix files (`[daemon] prefix_cache`) stay out of the user's, whose default
/// configuration's file they would otherwise push out (a role keeps 4), and no test starts from
/// a file an earlier run left. The models stay where they are (`KAZEIA_MODELS`).
fn daemon_cache() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| run_dir("daemon-cache"))
}

pub fn spawn(cfg: &Path, socket: &Path) -> (Child, Arc<Mutex<String>>) {
    spawn_with_env(cfg, socket, &[])
}

/// [`spawn`] with `env` added to the daemon's environment.
fn spawn_with_env(cfg: &Path, socket: &Path, env: &[(&str, &str)]) -> (Child, Arc<Mutex<String>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kazeia"))
        .args(["serve", "--config", cfg.to_str().unwrap(), "--socket", socket.to_str().unwrap()])
        .env("RUST_LOG", "info,llama_cpp_2=warn,llama-cpp-2=warn")
        .env("XDG_CACHE_HOME", daemon_cache())
        .env("KAZEIA_MODELS", models_dir())
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kazeia serve");
    let stderr = collect_lines(child.stderr.take().unwrap());
    (child, stderr)
}

/// Everything a child writes to `pipe`, line by line, as it comes.
pub fn collect_lines(pipe: impl std::io::Read + Send + 'static) -> Arc<Mutex<String>> {
    let out = Arc::new(Mutex::new(String::new()));
    let sink = out.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut s = sink.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    out
}

/// A child process killed and reaped when the test ends, passing or failing: a daemon a failed
/// test left running kept the test binary's output pipes open, and whoever ran the suite waited
/// for it forever (found by tools/break-tests).
pub struct Reaped(pub Child);

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Daemon {
    /// Stop this daemon and hand over its turn, to start another in the same test.
    pub fn take_serial(&mut self) -> std::sync::MutexGuard<'static, ()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self._serial.take().expect("serial guard")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- daemon log ---\n{}", self.stderr.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }
}

/// How long a test waits for something that should happen, before it calls it a hang. Not a
/// speed check: it only has to be far above what a loaded 2-core machine ever needs.
pub const HANG: Duration = Duration::from_secs(120);

/// Poll `ready` until it holds; past [`HANG`], fail with `what` and `context()`.
#[track_caller]
pub fn wait_until(what: &str, mut ready: impl FnMut() -> bool, context: impl Fn() -> String) {
    let t = Instant::now();
    while !ready() {
        assert!(t.elapsed() < HANG, "timed out waiting for {what}\n{}", context());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The daemon's status once every turn has ended and every role is idle. A turn's final event
/// reaches the client just before the daemon lets go of the turn: poll, never assume.
pub async fn settled(c: &Client) -> kazeia_ipc::StatusReport {
    let t = Instant::now();
    loop {
        let st = c.status().await.unwrap();
        if st.turns_running == 0 && st.models.iter().all(|m| m.busy == 0 && m.turns == 0) {
            return st;
        }
        assert!(t.elapsed() < HANG, "the daemon never settled: {st:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Everything of one turn until done/error: (text, final event).
pub async fn finish(rx: &mut UnboundedReceiver<Incoming>) -> (String, Event) {
    let mut text = String::new();
    while let Some(item) = rx.recv().await {
        if let Incoming::Event(ev) = item {
            match ev {
                Event::Token { text: t, .. } => text.push_str(&t),
                ev @ (Event::Done { .. } | Event::Error { is_final: true, .. }) => return (text, ev),
                _ => {}
            }
        }
    }
    panic!("connection closed before the turn ended (so far: {text:?})");
}
