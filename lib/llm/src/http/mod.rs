//! The OpenAI-compatible HTTP frontend: `/v1/models`, `/v1/chat/completions`,
//! `/v1/completions` (SSE or whole responses), `/v1/responses`, `/health`, `/live`, `/metrics`.
//! Models come from a [`crate::model_manager::ModelManager`].

pub(crate) mod admission;
mod choices;
mod connections;
mod error;
mod guard;
mod health;
mod layers;
mod limits;
pub mod metrics;
mod openai;
mod request;
pub mod responses;
mod service;
mod sse;
mod state;
pub mod streams;

pub use error::ApiError;
pub use layers::REQUEST_ID;
pub use state::HealthCheck;
pub use limits::{
    AdmissionLimits, HttpLimits, DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_INFLIGHT,
    DEFAULT_MAX_TOKENS, RETRY_AFTER_SECONDS,
};
pub use service::{BoundHttpService, HttpError, HttpService, HttpServiceBuilder, RunningHttpService, DEFAULT_BODY_LIMIT, DEFAULT_DRAIN_TIMEOUT};
