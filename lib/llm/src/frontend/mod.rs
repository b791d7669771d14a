//! What a frontend assembles: a [`ModelWatcher`] follows the models workers register
//! ([`crate::discovery`]) and builds, per model, the pipeline over a remote engine
//! ([`crate::remote`]) with its router ([`crate::routing`]), in a
//! [`crate::model_manager::ModelManager`].
//!
//! Imports run one way: `frontend` uses `discovery`, `remote`, `routing`, `kv_router`
//! and `model_manager`; nothing below imports `frontend`.

mod watcher;

pub use watcher::{ModelWatcher, ModelWatcherHandle, DEFAULT_CARD_TIMEOUT};
