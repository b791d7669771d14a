//! `dynamo-run`: run an LLM engine behind an input.
//!
//! ```text
//! dynamo-run [in=http|text|stdin|batch:FILE.jsonl|dyn://ns.comp.ep] [out=echo_full|echo_core|mocker|dyn|vllm] [flags] [-- engine flags]
//! ```
//!
//! The binary and the Python console script (through the extension) both call
//! [`run_cli`]. See `docs/dynamo-run.md` for inputs, outputs, flags and examples.

mod engine_process;
mod error;
mod flags;
mod input;
mod local;
mod logging;
mod models;
mod output;
mod signal;

use std::io::IsTerminal;
use std::time::Duration;

use clap::Parser;

pub use error::{RunError, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE};
pub use flags::{Flags, Input, Output, RunConfig, DEFAULT_HTTP_PORT};
pub use input::batch::{MAX_IN_FLIGHT, OUTPUT_FILE};

/// How long blocked work (a read of stdin) may hold up the end of a run.
const RUNTIME_SHUTDOWN_BOUND: Duration = Duration::from_secs(1);

/// Run `dynamo-run` with `args` (without the program name) and return the process exit
/// code: 0 on success, 2 for bad flags (clap's message, or `dynamo-run: error: …`), 1
/// when the run fails (`dynamo-run: error: …` on stderr), 130 when a signal cut short a
/// text, stdin or batch run. Builds its own multi-thread tokio runtime; when called
/// from inside one, it runs on a thread of its own.
pub fn run_cli(args: Vec<String>) -> i32 {
    if tokio::runtime::Handle::try_current().is_ok() {
        return match std::thread::Builder::new().name("dynamo-run".to_string()).spawn(move || run_cli(args)) {
            Ok(thread) => thread.join().unwrap_or(EXIT_FAILURE),
            Err(e) => report(&RunError::AsyncRuntime(e)),
        };
    }
    let argv = std::iter::once("dynamo-run".to_string()).chain(args);
    let flags = match Flags::try_parse_from(argv) {
        Ok(flags) => flags,
        Err(e) => {
            // --help and --version land here too, with exit code 0.
            let _ = e.print();
            return e.exit_code();
        }
    };
    let config = match flags.into_config(std::io::stdin().is_terminal()) {
        Ok(config) => config,
        Err(e) => return report(&e),
    };
    logging::init(config.verbose, matches!(config.input, Input::Http | Input::Endpoint(_)));
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("dynamo-run").build() {
        Ok(runtime) => runtime,
        Err(e) => return report(&RunError::AsyncRuntime(e)),
    };
    let result = runtime.block_on(run(config));
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_BOUND);
    match result {
        Ok(()) => 0,
        Err(e) => report(&e),
    }
}

/// Run a checked configuration until its work is done or SIGINT/SIGTERM arrives. Must
/// be called inside a multi-thread tokio runtime.
pub async fn run(config: RunConfig) -> Result<(), RunError> {
    let (cancel, signals) = signal::cancel_on_signal();
    // out=vllm: the engine in a child process, this one its frontend (out=dyn://…).
    let (config, engine) = match engine_process::start(config, &cancel) {
        Ok(started) => started,
        Err(e) => {
            signals.abort();
            return Err(e);
        }
    };
    let result = match &config.input {
        Input::Http => input::http::run(&config, cancel).await,
        Input::Text => input::chat::run(&config, cancel, true).await,
        Input::Stdin => input::chat::run(&config, cancel, false).await,
        Input::Batch(file) => input::batch::run(&config, file, cancel).await,
        Input::Endpoint(id) => input::endpoint::run(&config, id, cancel).await,
    };
    // A child that died is the reason the run ended, whatever the input made of it.
    let engine = match engine {
        Some(engine) => engine.stop().await,
        None => Ok(()),
    };
    signals.abort();
    engine.and(result)
}

fn report(e: &RunError) -> i32 {
    output::error(&e.to_string());
    e.exit_code()
}
