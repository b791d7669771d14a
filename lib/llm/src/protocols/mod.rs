//! Wire types: the OpenAI HTTP API ([`openai`]) and the token-level request/response
//! that travels between a frontend and a token engine ([`common`]).

pub mod common;
pub mod logprobs;
pub mod openai;
pub mod tools;

/// Seconds since the Unix epoch (the `created` field of OpenAI objects).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
