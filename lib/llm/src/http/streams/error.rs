//! Why a resumable stream cannot be started, read or cancelled.

/// An error of the stream registry; each variant is a kind the HTTP side maps to a status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// No stream has this id here: never started, cancelled, or finished and expired (404).
    #[error("no resumable stream {0:?} (never started, cancelled, or finished and expired)")]
    NotFound(String),
    /// The events after `after` were dropped from the bounded replay buffer (410).
    #[error(
        "stream {request_id:?} cannot resume after event {after:?}: the replay buffer starts at event {first_available}"
    )]
    Gone {
        /// The stream.
        request_id: String,
        /// The last event id the reader had (`None`: from the start).
        after: Option<u64>,
        /// The oldest event id the buffer still holds.
        first_available: u64,
    },
    /// The reader claims an event the stream has not produced (400).
    #[error("stream {request_id:?} has no event {after} yet (its last event is {last:?})")]
    BeyondEnd {
        /// The stream.
        request_id: String,
        /// The id the reader asked to resume after.
        after: u64,
        /// The last id produced so far.
        last: Option<u64>,
    },
    /// A stream with this id is already registered (409).
    #[error("a resumable stream {0:?} already exists")]
    AlreadyExists(String),
    /// The registry is shut down and takes no new streams (503).
    #[error("the stream registry is shut down")]
    ShutDown,
}
