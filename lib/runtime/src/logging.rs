//! Logging setup: `DYN_LOG` takes the `RUST_LOG` syntax (default `info`).

/// Install the global tracing subscriber once; later calls do nothing.
pub fn init() {
    let filter = std::env::var("DYN_LOG").ok().filter(|s| !s.trim().is_empty()).unwrap_or_else(|| "info".to_string());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("DYN_LOG='{filter}' is not a valid filter ({e}); using 'info'");
        tracing_subscriber::EnvFilter::new("info")
    });
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
