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
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let code = rt.block_on(kazeia_daemon::cli::main(cli));
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    std::process::exit(code);
}
