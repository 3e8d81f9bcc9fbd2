//! Logging set-up for the binary and workers: `tracing` to stderr, filtered by `RUST_LOG`
//! (default `info` for Squall, `warn` for everything else).

/// Installs the global subscriber for workers (Squall at `info`) once; later calls do nothing.
pub fn init() {
    init_with("warn,squall=info,squall_topology=info");
}

/// Installs the global subscriber with `default` as the filter unless `RUST_LOG` is set.
pub fn init_with(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
}
