//! Logs: `tracing` to stderr, filtered by `VFABRIC_LOG` (e.g. `info`, `debug`, `vfabric_transport=debug`).

/// Installs the stderr subscriber the `vfabric` and `vfabric-bench` commands use (warnings only by default).
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("VFABRIC_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // A second call (tests that run a command's main twice) keeps the first subscriber.
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
