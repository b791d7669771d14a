//! How long and how much a resumable stream keeps: its replay buffer's bound, the grace
//! period after its last subscriber leaves, and the retention after it finishes.

use std::time::Duration;

/// Default bound of one stream's replay buffer: 64 KiB of event bytes.
pub const DEFAULT_BUFFER_BYTES: usize = 64 * 1024;
/// Default time a generation goes on without a subscriber before it is cancelled.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);
/// Default time a finished stream stays replayable.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30);

/// Bounds of the resumable streams of one registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamsConfig {
    /// Bytes of events (name and data) one stream's buffer keeps; when a new event
    /// would exceed it, the oldest events are dropped (the newest is always kept).
    pub buffer_bytes: usize,
    /// How long a generation goes on after its last subscriber left (`--stream-grace-s`).
    pub grace: Duration,
    /// How long a finished stream stays replayable (`--stream-retention-s`).
    pub retention: Duration,
}

impl Default for StreamsConfig {
    fn default() -> Self {
        StreamsConfig { buffer_bytes: DEFAULT_BUFFER_BYTES, grace: DEFAULT_GRACE, retention: DEFAULT_RETENTION }
    }
}
