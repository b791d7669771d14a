//! The liveness clock of one connection: when the peer was last heard from and written
//! to, whether the owner's reader is busy, and the wake-up of a Pong. The kernel keeps
//! ACKing TCP for a SIGSTOPped or wedged peer and a partition can hide a peer's death for
//! minutes, so `keepalive.rs` pings a quiet connection and declares the peer dead when
//! nothing (no frame of any kind) arrives from it for the peer timeout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// When this side last heard from and wrote to its peer, and whether its reader is busy
/// handing a frame to a slow consumer (the peer cannot be judged then: its frames wait
/// unread in the socket).
pub(crate) struct Liveness {
    epoch: Instant,
    last_heard_ms: AtomicU64,
    last_written_ms: AtomicU64,
    reader_busy: AtomicBool,
    pong: Notify,
}

impl Liveness {
    pub(super) fn new() -> Self {
        Liveness {
            epoch: Instant::now(),
            last_heard_ms: AtomicU64::new(0),
            last_written_ms: AtomicU64::new(0),
            reader_busy: AtomicBool::new(false),
            pong: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A frame arrived from the peer.
    pub(super) fn heard(&self) {
        self.last_heard_ms.store(self.now_ms(), Ordering::Release);
    }

    /// A batch of frames went out to the peer.
    pub(super) fn wrote(&self) {
        self.last_written_ms.store(self.now_ms(), Ordering::Release);
    }

    /// The reader starts (`true`) or finished (`false`) routing a frame.
    pub(super) fn set_reader_busy(&self, busy: bool) {
        if !busy {
            self.heard();
        }
        self.reader_busy.store(busy, Ordering::Release);
    }

    /// A Pong arrived: wake whoever waits in `Connection::ping`.
    pub(super) fn pong_received(&self) {
        self.pong.notify_waiters();
    }

    /// Wait for the next Pong after `send` queued a Ping; false if none within `timeout`.
    pub(super) async fn await_pong(&self, send: impl FnOnce() -> bool, timeout: Duration) -> bool {
        let notified = self.pong.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !send() {
            return false;
        }
        tokio::time::timeout(timeout, notified).await.is_ok()
    }

    fn quiet_for(&self, since_ms: &AtomicU64) -> Duration {
        Duration::from_millis(self.now_ms().saturating_sub(since_ms.load(Ordering::Acquire)))
    }

    /// How long nothing has arrived from the peer.
    pub(super) fn silent_for(&self) -> Duration {
        self.quiet_for(&self.last_heard_ms)
    }

    /// How long nothing has been written to the peer.
    pub(super) fn idle_for(&self) -> Duration {
        self.quiet_for(&self.last_written_ms)
    }

    /// Whether the owner's reader is routing a frame now.
    pub(super) fn is_reader_busy(&self) -> bool {
        self.reader_busy.load(Ordering::Acquire)
    }
}
