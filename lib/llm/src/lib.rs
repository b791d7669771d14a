//! Dynamo's LLM layer on top of `dynamo-runtime`: the OpenAI protocol and HTTP
//! frontend, model cards and their discovery, the preprocessor (tokenizer + chat
//! template) and detokenizer, and the engines (echo, mocker).
//!
//! Two engine shapes meet in this crate (see [`engine`]): an [`engine::OpenAIEngine`]
//! takes OpenAI requests and yields OpenAI chunks (what the HTTP frontend calls); a
//! [`engine::TokenEngine`] takes a [`protocols::common::PreprocessedRequest`] (token ids)
//! and yields [`protocols::common::LLMEngineOutput`] (token ids). The preprocessor and
//! detokenizer turn a token engine into an OpenAI engine.

pub mod admission;
pub mod aggregate;
pub mod chat_output;
pub mod detokenizer;
pub mod disagg;
pub mod discovery;
pub mod engine;
pub mod engines;
pub mod frontend;
pub mod http;
pub mod kv_router;
pub mod lab_trace;
pub mod model_card;
pub mod model_manager;
pub mod parsers;
pub mod pipeline;
pub mod planner_lab;
pub mod preprocessor;
pub mod protocols;
pub mod remote;
pub mod routing;
pub mod routing_lab;
pub mod tokenizer;

/// The version of this crate.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
