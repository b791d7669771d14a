//! The `file` backend's prefix watch: it re-reads the directory every
//! [`POLL_INTERVAL`] and sends the differences. A directory that cannot be read is
//! logged once and read again at the next tick; the watch ends only with the runtime or
//! when its consumer drops the receiver.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::store::{blocking, Store};
use crate::discovery::health::{HealthBoard, Source};
use crate::discovery::known::KnownKeys;
use crate::discovery::WatchEvent;

/// How often a watch re-reads the directory. Polling rather than inotify/kqueue: it is
/// portable (including network and container-mounted directories, where change
/// notification is unreliable) and the directories are tiny, so a scan is cheap.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// One polling prefix watch.
pub(super) struct PollingWatch {
    pub(super) store: Arc<Store>,
    pub(super) prefix: String,
    pub(super) known: KnownKeys,
    pub(super) tx: mpsc::Sender<WatchEvent>,
    /// Cancelled when the runtime stops (or the backend handle is dropped).
    pub(super) alive: CancellationToken,
    pub(super) health: Arc<HealthBoard>,
    /// This watch's entry on the health board.
    pub(super) source: Source,
}

impl PollingWatch {
    /// Poll until the runtime stops or the consumer drops the receiver.
    pub(super) async fn run(mut self) {
        let mut tick = tokio::time::interval_at(Instant::now() + POLL_INTERVAL, POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        'poll: loop {
            tokio::select! {
                _ = self.alive.cancelled() => break,
                _ = self.tx.closed() => break,
                _ = tick.tick() => {}
            }
            let prefix = self.prefix.clone();
            let current = match blocking(&self.store, move |st| st.scan(&prefix)).await {
                Ok(current) => current,
                Err(e) => {
                    let problem = format!(
                        "file discovery watch on {} cannot read {}: {}",
                        self.prefix,
                        self.store.root.display(),
                        e
                    );
                    if self.health.report(self.source, problem) {
                        tracing::warn!(
                            prefix = %self.prefix,
                            dir = %self.store.root.display(),
                            error = %e,
                            "file discovery watch cannot read the directory; retrying \
                             (routing continues on what was last known)"
                        );
                    }
                    continue;
                }
            };
            if let Some(since) = self.health.clear(self.source) {
                tracing::info!(
                    prefix = %self.prefix,
                    dir = %self.store.root.display(),
                    "file discovery watch can read the directory again after {:?}",
                    since.elapsed()
                );
            }
            for event in self.known.resync(current) {
                tokio::select! {
                    _ = self.alive.cancelled() => break 'poll,
                    sent = self.tx.send(event) => if sent.is_err() { break 'poll },
                }
            }
        }
        // A watch nobody reads any more is no reason to call the backend degraded.
        self.health.clear(self.source);
    }
}
