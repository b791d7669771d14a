//! Dynamo's LLM layer. The OpenAI frontend, preprocessor, engines and KV router are
//! built on `dynamo-runtime`; this crate currently only re-exports the runtime version
//! it was built against.

/// The version of this crate.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
