//! Engines across the request plane. A worker serves an engine on an endpoint
//! ([`serve_openai_engine`], [`serve_token_engine`]) in the formats of [`wire`]; a
//! frontend reaches it through a remote engine ([`RemoteOpenAIEngine`],
//! [`RemoteTokenEngine`]), which picks an instance with a [`crate::routing`] selector,
//! sends direct, and leaves every resend to [`migration`] (bounded by
//! [`MigrationPolicy`]).
//!
//! Imports run one way: `remote` uses `routing`, `engine`, `protocols` and the runtime;
//! [`crate::frontend`] and workers use `remote`.

mod engine;
mod linked_stream;
mod migration;
mod serve;
pub mod wire;

pub use engine::{RemoteOpenAIEngine, RemoteTokenEngine};
pub use migration::{resend_limit_from_env, BadResendLimit, MigrationPolicy, DEFAULT_MIGRATION_LIMIT, DEFAULT_RESEND_LIMIT, RESEND_LIMIT_ENV};
pub use serve::{openai_engine_handler, serve_openai_engine, serve_token_engine, token_engine_handler};
