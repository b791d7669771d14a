//! Resumable streams: a generation detached from the HTTP connection that started it.
//!
//! A producer (the SSE events of a chat or completions response, or the events of a
//! background Responses request) is handed to a [`StreamRegistry`], which runs it on a
//! task it owns and writes its events, each with a monotone id, into a replay buffer
//! bounded in bytes. A [`Subscription`] reads from an id onwards and then follows live.
//! When the last subscriber leaves, the generation goes on for a grace period before it
//! is cancelled; a finished stream stays replayable for a retention period; an explicit
//! [`StreamRegistry::cancel`] aborts it; shutting the registry down cancels them all.

mod buffer;
mod config;
mod detached;
mod directory;
mod error;
mod event;
pub(crate) mod proxy;
mod registry;
mod routes;
mod subscription;

pub use config::{StreamsConfig, DEFAULT_BUFFER_BYTES, DEFAULT_GRACE, DEFAULT_RETENTION};
pub use directory::{DirectoryError, DiscoveryDirectory, StreamDirectory, STREAMS_PREFIX};
pub use error::StreamError;
pub use event::{EventBody, StreamEvent};
pub use registry::{StreamRegistry, StreamStats};
pub(crate) use routes::{cancel_stream, detach, resume_stream, wants_resume};
pub use routes::{RESUMABLE_HEADER, STREAM_FORWARDED_HEADER};
pub use subscription::Subscription;
