//! Engines built into the crate. `echo` needs no model: `EchoFull` echoes OpenAI
//! requests as chunks, `EchoCore` echoes a tokenized prompt's ids (behind the
//! preprocessor pipeline). `mocker` simulates a paged-KV-cache engine on the CPU.

pub mod echo;
pub mod mocker;

pub use echo::{echo_delay_from_env, EchoCore, EchoFull};
