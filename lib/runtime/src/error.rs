//! Errors of the runtime: a value with a kind the caller can match on, and a message.

use std::fmt;

/// What went wrong, for callers that react differently to different failures
/// (a router retries `NoInstances`/`Unavailable` elsewhere, a user fixes `Config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A configuration value is missing, malformed or contradicts another.
    Config,
    /// The discovery backend (etcd, file, mem) failed or refused an operation.
    Discovery,
    /// A key that must be created fresh already exists.
    AlreadyExists,
    /// No instance of the endpoint is known.
    NoInstances,
    /// The requested instance id is not (or no longer) known.
    InstanceNotFound,
    /// The instance could not be reached or refused new work (shutting down).
    Unavailable,
    /// A connection or a stream broke: the peer died, reset or stopped answering.
    Disconnected,
    /// A bounded wait ran out.
    Timeout,
    /// No worker took the request within `DYN_RESPONSE_TIMEOUT` (NATS plane): the
    /// instance did not answer at all, unlike a stream bound (first-item or item
    /// timeout, `Timeout`), which a slow handler of a live worker hits.
    NotTaken,
    /// A message exceeds the size limit of the plane that would carry it.
    PayloadTooLarge,
    /// The remote endpoint does not exist on the instance.
    UnknownEndpoint,
    /// The handler on the worker raised or returned an error.
    Handler,
    /// The peer sent something that does not follow the wire protocol.
    Protocol,
    /// A request or response could not be (de)serialized.
    Serialization,
    /// The runtime is shutting down.
    Shutdown,
    /// NATS failed or refused an operation.
    Nats,
    /// An I/O error that fits no other kind.
    Io,
}

impl ErrorKind {
    /// A short stable name, used on the wire and in Python exception mapping.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Config => "config",
            ErrorKind::Discovery => "discovery",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::NoInstances => "no_instances",
            ErrorKind::InstanceNotFound => "instance_not_found",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Disconnected => "disconnected",
            ErrorKind::Timeout => "timeout",
            ErrorKind::NotTaken => "not_taken",
            ErrorKind::PayloadTooLarge => "payload_too_large",
            ErrorKind::UnknownEndpoint => "unknown_endpoint",
            ErrorKind::Handler => "handler",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Serialization => "serialization",
            ErrorKind::Shutdown => "shutdown",
            ErrorKind::Nats => "nats",
            ErrorKind::Io => "io",
        }
    }

    /// Parse a name written by [`ErrorKind::as_str`]; unknown names map to `Handler`.
    pub fn parse(name: &str) -> ErrorKind {
        match name {
            "config" => ErrorKind::Config,
            "discovery" => ErrorKind::Discovery,
            "already_exists" => ErrorKind::AlreadyExists,
            "no_instances" => ErrorKind::NoInstances,
            "instance_not_found" => ErrorKind::InstanceNotFound,
            "unavailable" => ErrorKind::Unavailable,
            "disconnected" => ErrorKind::Disconnected,
            "timeout" => ErrorKind::Timeout,
            "not_taken" => ErrorKind::NotTaken,
            "payload_too_large" => ErrorKind::PayloadTooLarge,
            "unknown_endpoint" => ErrorKind::UnknownEndpoint,
            "protocol" => ErrorKind::Protocol,
            "serialization" => ErrorKind::Serialization,
            "shutdown" => ErrorKind::Shutdown,
            "nats" => ErrorKind::Nats,
            "io" => ErrorKind::Io,
            _ => ErrorKind::Handler,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The runtime's error: a kind, a message for humans, and an optional source.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Error {
    /// An error of `kind` with a message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into(), source: None }
    }

    /// An error of `kind` with a message and the underlying cause.
    pub fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error { kind, message: message.into(), source: Some(Box::new(source)) }
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The human-readable message (without the source chain).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The message followed by each cause, `a: b: c`.
    pub fn full_message(&self) -> String {
        let mut out = self.message.clone();
        let mut cur: Option<&(dyn std::error::Error + 'static)> =
            self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static));
        while let Some(e) = cur {
            out.push_str(": ");
            out.push_str(&e.to_string());
            cur = e.source();
        }
        out
    }
}

impl Clone for Error {
    fn clone(&self) -> Self {
        Error::new(self.kind, self.full_message())
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::with_source(ErrorKind::Io, "i/o error", e)
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::with_source(ErrorKind::Serialization, "invalid JSON", e)
    }
}

/// Result with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_round_trip() {
        for kind in [
            ErrorKind::Config,
            ErrorKind::NoInstances,
            ErrorKind::PayloadTooLarge,
            ErrorKind::Disconnected,
            ErrorKind::Timeout,
            ErrorKind::NotTaken,
            ErrorKind::Shutdown,
        ] {
            assert_eq!(ErrorKind::parse(kind.as_str()), kind);
        }
        assert_eq!(ErrorKind::parse("something-else"), ErrorKind::Handler);
    }

    #[test]
    fn full_message_includes_sources() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = Error::with_source(ErrorKind::Unavailable, "connect to 1.2.3.4:5", io);
        assert_eq!(e.full_message(), "connect to 1.2.3.4:5: refused");
        assert_eq!(e.to_string(), "connect to 1.2.3.4:5");
    }
}
