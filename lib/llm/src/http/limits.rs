//! The limits that keep a public server standing: connections, requests in flight,
//! how long a client may take to send a request, and each model's admission limits.

use std::time::Duration;

pub use crate::admission::AdmissionLimits;

/// Default most open connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default most generation requests in flight.
pub const DEFAULT_MAX_INFLIGHT: usize = 1024;
/// Default bound on receiving a request's headers (and on an idle keep-alive connection).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default bound on receiving a request's whole body.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `max_tokens` of a request that sets none.
pub const DEFAULT_MAX_TOKENS: u32 = 1024;
/// Seconds a client is told to wait (`Retry-After`) when the server is at a limit.
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// Connection and request limits of an [`super::HttpService`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    /// Most open connections; a connection beyond it is answered 503 with
    /// `Retry-After` and closed. Keep it below the process's open-file limit.
    pub max_connections: usize,
    /// Most generation requests (`/v1/chat/completions`, `/v1/completions`,
    /// `/v1/embeddings`) being served at once, streams included until their last
    /// event; more are answered 503 with `Retry-After`. `/health`, `/metrics` and
    /// `/v1/models` are not counted.
    pub max_inflight: usize,
    /// Time a connection gets to send a request's headers, counted from when the
    /// server starts waiting for them: closes connections that never finish their
    /// headers (slowloris) and idle keep-alive connections.
    pub header_timeout: Duration,
    /// Time a request gets to send its whole body once its headers are in (408 after).
    pub body_timeout: Duration,
    /// `max_tokens` of a request that sets none (the model's remaining context is
    /// the ceiling either way).
    pub default_max_tokens: u32,
    /// Each model's admission limits (none by default).
    pub admission: AdmissionLimits,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_inflight: DEFAULT_MAX_INFLIGHT,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            default_max_tokens: DEFAULT_MAX_TOKENS,
            admission: AdmissionLimits::default(),
        }
    }
}
