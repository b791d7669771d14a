//! What can go wrong in a run, and the exit code each failure gives.

use std::path::PathBuf;

use dynamo_llm::discovery::ModelDiscoveryError;
use dynamo_llm::engine::EngineError;
use dynamo_llm::http::HttpError;
use dynamo_llm::engines::mocker::ArgsError;
use dynamo_llm::model_card::CardError;

/// Exit code of a usage error (bad flags or a bad combination of them), as clap uses.
pub const EXIT_USAGE: i32 = 2;
/// Exit code of a run that failed.
pub const EXIT_FAILURE: i32 = 1;
/// Exit code of a run interrupted by SIGINT/SIGTERM before it finished its work (128 + SIGINT).
pub const EXIT_INTERRUPTED: i32 = 130;

/// Why a run could not start or failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The flags do not make sense together (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// The model card could not be built.
    #[error("model card: {0}")]
    Card(#[from] CardError),
    /// The mocker's configuration is invalid.
    #[error(transparent)]
    MockerArgs(#[from] ArgsError),
    /// The distributed runtime failed (discovery, request plane).
    #[error("runtime: {0}")]
    Runtime(#[from] dynamo_runtime::Error),
    /// Registering or discovering a model failed.
    #[error("{0}")]
    Discovery(#[from] ModelDiscoveryError),
    /// The HTTP service could not start or failed.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// The engine child process of `out=vllm` exited by itself.
    #[error("{0}")]
    EngineProcess(String),
    /// An engine refused or failed a request.
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    /// A file or stream could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file (or `stdin`/`stdout`).
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A signal ended a run that had work left (text, stdin or batch input).
    #[error("interrupted")]
    Interrupted,
    /// Some prompts of a batch failed (their lines in the output say why).
    #[error("{failed} of {total} prompts failed")]
    PromptsFailed {
        /// How many failed.
        failed: usize,
        /// How many ran.
        total: usize,
    },
    /// The tokio runtime could not be built.
    #[error("cannot start the async runtime: {0}")]
    AsyncRuntime(std::io::Error),
}

impl RunError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::Usage(_) => EXIT_USAGE,
            RunError::Interrupted => EXIT_INTERRUPTED,
            _ => EXIT_FAILURE,
        }
    }

    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        RunError::Io { path: path.into(), source }
    }
}
