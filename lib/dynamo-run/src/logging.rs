//! Logging to stderr: `-v`/`-vv` force debug/trace; otherwise `DYN_LOG` as the runtime
//! reads it, or a default that keeps interactive and batch output quiet.

use dynamo_runtime::logging;

/// Install the global subscriber (a no-op when one is installed already, e.g. by the
/// Python extension). `server` inputs (http, dyn://) log `info` by default, the others
/// `warn`, so that their stdout/stderr carry the answers.
pub fn init(verbose: u8, server: bool) {
    match verbose {
        0 => logging::init_with_default(if server { "info" } else { "warn" }),
        1 => logging::init_with_filter("debug"),
        _ => logging::init_with_filter("trace"),
    }
}
