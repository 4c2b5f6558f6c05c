//! Logs: `tracing` to stderr, filtered by `VFABRIC_LOG` (e.g. `info`, `debug`, `vfabric_transport=debug`), as
//! text or, with `VFABRIC_LOG_FORMAT=json`, one JSON object a line (for log shippers).

/// Installs the stderr subscriber the `vfabric` and `vfabric-bench` commands use (warnings only by default).
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("VFABRIC_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Colours only for a person at a terminal, not in files or pipes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    // A second call (tests that run a command's main twice) keeps the first subscriber.
    let _ = match std::env::var("VFABRIC_LOG_FORMAT").as_deref() {
        Ok("json") => logs.json().try_init(),
        Ok("text") | Err(_) => logs.try_init(),
        Ok(other) => {
            eprintln!("VFABRIC_LOG_FORMAT={other}: it is text or json; logging as text");
            logs.try_init()
        }
    };
}
