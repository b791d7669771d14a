//! Every integration test of dynamo-llm in one binary (`autotests = false` in Cargo.toml):
//! one link instead of one per file, and the files' tests run side by side.

mod common;
#[path = "../../runtime/tests/poll/mod.rs"]
mod poll;

mod http_public;
mod http_resume;
mod http_service;
mod kv_routing;
mod mocker_events;
mod model_discovery;
mod pipeline;
