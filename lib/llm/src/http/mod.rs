//! The OpenAI-compatible HTTP frontend: `/v1/models`, `/v1/chat/completions`,
//! `/v1/completions` (SSE or whole responses), `/health`, `/live`, `/metrics`.
//! Models come from a [`crate::model_manager::ModelManager`].

mod error;
mod guard;
mod health;
pub mod metrics;
mod openai;
mod request;
mod service;
mod sse;

pub use error::ApiError;
pub use service::{BoundHttpService, HealthCheck, HttpError, HttpService, HttpServiceBuilder, RunningHttpService, DEFAULT_BODY_LIMIT, DEFAULT_DRAIN_TIMEOUT};
