use clap::Parser;
use tracing_subscriber::EnvFilter;

/// libgomp, which runs llama.cpp's CPU threads, spins up to `GOMP_SPINCOUNT` times (300,000 by
/// default: milliseconds of it) at each of a token's hundreds of barriers before it sleeps. With
/// another process busy on the same cores, a waiting thread spins away the time slice its
/// partner needs: llama-bench on 2 cores beside two busy loops prefilled 12 tok/s instead of
/// 309 alone and decoded 30 instead of 122; with 10,000 spins 127 and 53, and alone the same
/// within noise (session 22). The daemon's `it` test of eight clients took 35-39 s instead of
/// 3.6 beside two busy loops, and failed its 120 s limit in a CI run beside a numpy job.
/// libgomp reads the variable once, when it is loaded, before `main`: so the process starts
/// itself again with it set, unless the caller chose (`GOMP_SPINCOUNT` or `OMP_WAIT_POLICY`
/// set). `exec` keeps the pid, the arguments and every inherited descriptor (systemd's and
/// Android init's sockets); if it fails, the process goes on with libgomp's default.
/// Not on Android: llama-cpp-sys-2 builds llama.cpp there without OpenMP (ggml's own threads;
/// the engine keeps their decodes within the cores, engine/src/cores.rs).
fn bounded_openmp_spin() {
    use std::os::unix::process::CommandExt;
    const VAR: &str = "GOMP_SPINCOUNT";
    if cfg!(target_os = "android") {
        return;
    }
    if std::env::var_os(VAR).is_some() || std::env::var_os("OMP_WAIT_POLICY").is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else { return };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
    std::env::set_var(VAR, "10000");
    let err = std::process::Command::new(&exe).arg0(arg0).args(args).exec();
    eprintln!("kazeia: could not restart with {VAR}=10000 ({err}); OpenMP keeps its default spin");
}

fn main() {
    bounded_openmp_spin();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal who did not ask for none (no-color.org):
        // journald, logcat, log files and tests read plain text.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .init();
    let cli = kazeia_daemon::cli::Cli::try_parse().unwrap_or_else(|e| kazeia_daemon::cli::refused_arguments(e));
    // The runtime's workers are the first threads it starts; every later one belongs to its
    // blocking pool (loads, unloads, speech), which grows with concurrent blocking work and
    // shrinks after 10 s idle. Named apart, so that a soak can tell a pool that breathes from
    // threads that leak (kazeia_daemon::soak::POOL_THREAD).
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = std::sync::atomic::AtomicUsize::new(0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name_fn(move || {
            let n = started.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n < workers {
                "tokio-worker".into()
            } else {
                kazeia_daemon::soak::POOL_THREAD.into()
            }
        })
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = rt.block_on(kazeia_daemon::cli::main(cli));
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    std::process::exit(code);
}
