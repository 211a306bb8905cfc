use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() {
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
    let cli = kazeia_daemon::cli::Cli::parse();
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
