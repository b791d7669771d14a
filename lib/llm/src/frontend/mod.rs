//! What a frontend assembles: a [`ModelWatcher`] follows the models workers register
//! ([`crate::discovery`]) and builds, per model, the pipeline over a remote engine
//! ([`crate::remote`]) with its router ([`crate::routing`]), in a
//! [`crate::model_manager::ModelManager`]. With `--keep-models` a model stays listed at
//! zero workers and its requests wait for one (`scale_to_zero`).
//!
//! Imports run one way: `frontend` uses `discovery`, `remote`, `routing`, `kv_router`
//! and `model_manager`; nothing below imports `frontend`.

mod scale_to_zero;
mod watcher;

pub use scale_to_zero::{NoWorkerError, DEFAULT_ZERO_WAIT};
pub use watcher::{ModelWatcher, ModelWatcherHandle, DEFAULT_CARD_TIMEOUT};
