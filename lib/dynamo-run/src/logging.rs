//! Logging to stderr: `-v`/`-vv` force debug/trace; otherwise `DYN_LOG` as the runtime
//! reads it, or a default that keeps interactive and batch output quiet.

use tracing_subscriber::EnvFilter;

/// Install the global subscriber (a no-op when one is installed already, e.g. by the
/// Python extension). `server` inputs (http, dyn://) log `info` by default, the others
/// `warn`, so that their stdout/stderr carry the answers.
pub fn init(verbose: u8, server: bool) {
    let level = match verbose {
        0 if std::env::var("DYN_LOG").is_ok_and(|v| !v.trim().is_empty()) => return dynamo_runtime::logging::init(),
        0 if server => "info",
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let _ = tracing_subscriber::fmt().with_env_filter(EnvFilter::new(level)).with_writer(std::io::stderr).try_init();
}
