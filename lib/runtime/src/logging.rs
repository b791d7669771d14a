//! Logging setup: `DYN_LOG` takes the `RUST_LOG` syntax (default `info`).
//!
//! Lines are formatted on the logging thread and written to stderr by a writer thread
//! through a buffer that is flushed whenever the writer has nothing more queued: a
//! busy frontend (one line per request) pays for one `write` per batch of lines, not
//! one per line, and an idle process shows each line at once. Nothing is dropped: when
//! the queue is full the logging thread waits, as it would on a blocking stderr. The
//! queue is flushed when the process exits normally (`exit`, end of `main`, Python's
//! interpreter exit); see [`flush`].

use std::io::{BufWriter, Stderr};
use std::sync::Mutex;

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

/// The writer thread's guard: dropping it writes out what is queued and stops the thread.
static WRITER: Mutex<Option<WorkerGuard>> = Mutex::new(None);

/// Bytes gathered before a write to stderr when lines come faster than it takes them.
const WRITE_BUFFER: usize = 64 * 1024;

/// Install the global subscriber once with `DYN_LOG` (default `info`); later calls do
/// nothing.
pub fn init() {
    init_with_default("info");
}

/// Install the global subscriber once with `DYN_LOG` when it is set, else with
/// `default` (also `RUST_LOG` syntax). A malformed `DYN_LOG` is reported and `default`
/// used.
pub fn init_with_default(default: &str) {
    let filter = match std::env::var("DYN_LOG").ok().filter(|s| !s.trim().is_empty()) {
        Some(value) => EnvFilter::try_new(&value).unwrap_or_else(|e| {
            eprintln!("DYN_LOG='{value}' is not a valid filter ({e}); using '{default}'");
            EnvFilter::new(default)
        }),
        None => EnvFilter::new(default),
    };
    install(filter);
}

/// Install the global subscriber once with exactly `filter`, whatever `DYN_LOG` says.
pub fn init_with_filter(filter: &str) {
    install(EnvFilter::new(filter));
}

fn install(filter: EnvFilter) {
    let mut writer = WRITER.lock().unwrap_or_else(|e| e.into_inner());
    if writer.is_some() {
        return;
    }
    let (non_blocking, guard) = NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("dynamo-log")
        .finish(BufWriter::with_capacity(WRITE_BUFFER, std::io::stderr()) as BufWriter<Stderr>);
    if tracing_subscriber::fmt().with_env_filter(filter).with_writer(non_blocking).try_init().is_ok() {
        *writer = Some(guard);
        // SAFETY: `atexit` registers a plain `extern "C"` function without arguments;
        // it runs once, on the exiting thread, after `main` returns or `exit` is called.
        unsafe {
            libc::atexit(flush_at_exit);
        }
    }
}

/// Write out every queued line and stop the writer thread; later lines are not written.
/// Called by itself at a normal exit; call it before leaving a process some other way
/// (e.g. `_exit`) when its last lines matter.
pub fn flush() {
    let guard = WRITER.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(guard);
}

extern "C" fn flush_at_exit() {
    flush();
}
