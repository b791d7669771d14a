//! What a frontend assembles: a [`ModelWatcher`] follows the models workers register
//! ([`crate::discovery`]) and builds, per model, the pipeline over a remote engine
//! ([`crate::remote`]) with its router ([`crate::routing`]), in a
//! [`crate::model_manager::ModelManager`]. With `--keep-models` a model stays listed at
//! zero workers and its requests wait for one (`scale_to_zero`); the model is recorded
//! in discovery so that a frontend started while the fleet is at zero lists it too
//! (`kept`).
//!
//! Imports run one way: `frontend` uses `discovery`, `remote`, `routing`, `kv_router`
//! and `model_manager`; nothing below imports `frontend`.

mod kept;
mod scale_to_zero;
mod watcher;

pub use kept::KEPT_MODELS_PREFIX;
pub use scale_to_zero::{NoWorkerError, DEFAULT_ZERO_WAIT};
pub use watcher::{ModelWatcher, ModelWatcherHandle, DEFAULT_CARD_TIMEOUT};
