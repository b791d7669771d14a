//! `StreamRegistry`: the resumable streams of one frontend by request id. It owns the
//! task of every detached generation (tracked, cancelled and awaited on shutdown) and
//! frees a stream's entry when its task ends.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::Stream;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::StreamsConfig;
use super::detached::{drive, Detached};
use super::directory::{DirectoryError, StreamDirectory};
use super::error::StreamError;
use super::event::EventBody;
use super::subscription::Subscription;

/// The resumable streams of one frontend. Cloning shares the registry.
#[derive(Debug, Clone)]
pub struct StreamRegistry {
    inner: Arc<Inner>,
}

/// Bound on one announcement or withdrawal in the directory.
const DIRECTORY_BOUND: Duration = Duration::from_secs(5);

struct Inner {
    config: StreamsConfig,
    streams: Mutex<HashMap<String, Arc<Detached>>>,
    tasks: TaskTracker,
    cancel: CancellationToken,
    directory: Option<Arc<dyn StreamDirectory>>,
    /// This frontend's HTTP address (`host:port`) as other frontends reach it.
    address: OnceLock<String>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamRegistry")
            .field("config", &self.config)
            .field("streams", &self.streams.lock().len())
            .field("directory", &self.directory.is_some())
            .field("address", &self.address.get())
            .finish()
    }
}

/// A snapshot of a registry's streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamStats {
    /// Streams still generating.
    pub active: usize,
    /// Finished streams kept for replay.
    pub finished: usize,
    /// Bytes of events held in all replay buffers.
    pub buffered_bytes: usize,
}

impl StreamRegistry {
    /// An empty registry; `shutdown` firing (or [`StreamRegistry::shutdown`]) cancels
    /// every stream.
    pub fn new(config: StreamsConfig, shutdown: &CancellationToken) -> Self {
        Self::with_directory(config, shutdown, None)
    }

    /// A registry that announces its streams in `directory` (once its address is set,
    /// see [`StreamRegistry::set_address`]) and finds other frontends' streams there.
    pub fn with_directory(
        config: StreamsConfig,
        shutdown: &CancellationToken,
        directory: Option<Arc<dyn StreamDirectory>>,
    ) -> Self {
        let inner = Inner {
            config,
            streams: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
            cancel: shutdown.child_token(),
            directory,
            address: OnceLock::new(),
        };
        StreamRegistry { inner: Arc::new(inner) }
    }

    /// The address (`host:port`) other frontends reach this one at; set once, when the
    /// HTTP service is bound. Streams started before it are not announced.
    pub fn set_address(&self, address: String) {
        let _ = self.inner.address.set(address);
    }

    /// The frontend that owns stream `request_id` when it is not held here: `None`
    /// without a directory, when nobody announced it, or when the announcement is ours
    /// (a stale one).
    pub async fn owner_of(&self, request_id: &str) -> Result<Option<String>, DirectoryError> {
        let Some(directory) = &self.inner.directory else { return Ok(None) };
        let owner = tokio::time::timeout(DIRECTORY_BOUND, directory.locate(request_id))
            .await
            .map_err(|_| DirectoryError(format!("no answer within {DIRECTORY_BOUND:?}")))??;
        Ok(owner.filter(|o| Some(o) != self.inner.address.get()))
    }

    /// Run `task` on the registry's tracker: it is awaited by [`StreamRegistry::shutdown`]
    /// and must end when `shutdown` (the token given to it) fires.
    pub(crate) fn track<F>(&self, task: impl FnOnce(CancellationToken) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.inner.tasks.spawn(task(self.inner.cancel.clone()));
    }

    /// The bounds this registry applies.
    pub fn config(&self) -> &StreamsConfig {
        &self.inner.config
    }

    /// Detach `events` as stream `request_id`: run it on a task of the registry and
    /// return the first subscription, from its first event. Dropping the producer (at
    /// cancel, shutdown or the end of the grace period) is how its engine is stopped.
    /// Must be called within a tokio runtime.
    pub fn start<S>(&self, request_id: impl Into<String>, events: S) -> Result<Subscription, StreamError>
    where
        S: Stream<Item = EventBody> + Send + 'static,
    {
        let request_id = request_id.into();
        let inner = &self.inner;
        if inner.cancel.is_cancelled() {
            return Err(StreamError::ShutDown);
        }
        let detached = {
            let mut streams = inner.streams.lock();
            if streams.contains_key(&request_id) {
                return Err(StreamError::AlreadyExists(request_id));
            }
            let detached = Arc::new(Detached::new(request_id.clone(), inner.config.buffer_bytes, inner.cancel.child_token()));
            streams.insert(request_id, detached.clone());
            detached
        };
        // Subscribe before the task starts, so the grace period never runs before the
        // first reader.
        let subscription = Subscription::open(detached.clone(), None)?;
        let registry = self.inner.clone();
        let (grace, retention) = (inner.config.grace, inner.config.retention);
        inner.tasks.spawn(async move {
            let announced = registry.announce(&detached.request_id).await;
            let outcome = drive(&detached, events, grace, retention).await;
            tracing::debug!(request = %detached.request_id, ?outcome, "resumable stream freed");
            registry.remove(&detached);
            if announced {
                registry.withdraw(&detached.request_id).await;
            }
        });
        Ok(subscription)
    }

    /// Read stream `request_id` after event `after` (`None`: from its first event),
    /// then live to its end.
    pub fn subscribe(&self, request_id: &str, after: Option<u64>) -> Result<Subscription, StreamError> {
        let detached = self.get(request_id)?;
        Subscription::open(detached, after)
    }

    /// Abort stream `request_id`: its producer is dropped (its engine stopped), its
    /// readers reach the end, and its id is forgotten at once.
    pub fn cancel(&self, request_id: &str) -> Result<(), StreamError> {
        let detached = self.inner.streams.lock().remove(request_id);
        let detached = detached.ok_or_else(|| StreamError::NotFound(request_id.to_string()))?;
        detached.cancel.cancel();
        Ok(())
    }

    /// Whether stream `request_id` is held here.
    pub fn contains(&self, request_id: &str) -> bool {
        self.inner.streams.lock().contains_key(request_id)
    }

    /// Counts and buffered bytes of the streams held now.
    pub fn stats(&self) -> StreamStats {
        let streams = self.inner.streams.lock();
        streams.values().fold(StreamStats::default(), |mut stats, detached| {
            let buffer = detached.buffer.lock();
            if buffer.outcome().is_some() {
                stats.finished += 1;
            } else {
                stats.active += 1;
            }
            stats.buffered_bytes += buffer.bytes();
            stats
        })
    }

    /// Cancel every stream, take no new ones, and wait for their tasks to end.
    pub async fn shutdown(&self) {
        self.inner.cancel.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    fn get(&self, request_id: &str) -> Result<Arc<Detached>, StreamError> {
        let streams = self.inner.streams.lock();
        streams.get(request_id).cloned().ok_or_else(|| StreamError::NotFound(request_id.to_string()))
    }
}

impl Inner {
    /// Announce `request_id` in the directory (if any, once the address is known);
    /// whether it was.
    async fn announce(&self, request_id: &str) -> bool {
        let (Some(directory), Some(address)) = (&self.directory, self.address.get()) else { return false };
        match tokio::time::timeout(DIRECTORY_BOUND, directory.announce(request_id, address)).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(request = request_id, error = %e, "cannot announce the stream; only this frontend can resume it");
                false
            }
            Err(_) => {
                tracing::warn!(request = request_id, "announcing the stream timed out; only this frontend can resume it");
                false
            }
        }
    }

    async fn withdraw(&self, request_id: &str) {
        let Some(directory) = &self.directory else { return };
        match tokio::time::timeout(DIRECTORY_BOUND, directory.withdraw(request_id)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(request = request_id, error = %e, "cannot withdraw the stream's announcement"),
            Err(_) => tracing::warn!(request = request_id, "withdrawing the stream's announcement timed out"),
        }
    }

    /// Forget `detached`, unless its id now names another stream.
    fn remove(&self, detached: &Arc<Detached>) {
        let mut streams = self.streams.lock();
        if streams.get(&detached.request_id).is_some_and(|held| Arc::ptr_eq(held, detached)) {
            streams.remove(&detached.request_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::channel::mpsc;
    use futures::StreamExt;

    use super::*;
    use crate::http::streams::StreamEvent;

    const BOUND: Duration = Duration::from_secs(10);

    fn registry(grace_ms: u64, retention_ms: u64, buffer_bytes: usize) -> StreamRegistry {
        let config = StreamsConfig {
            buffer_bytes,
            grace: Duration::from_millis(grace_ms),
            retention: Duration::from_millis(retention_ms),
        };
        StreamRegistry::new(config, &CancellationToken::new())
    }

    async fn next(sub: &mut Subscription) -> Option<StreamEvent> {
        tokio::time::timeout(BOUND, sub.next()).await.expect("an event within the bound").map(|r| r.unwrap())
    }

    async fn until(mut condition: impl FnMut() -> bool) {
        tokio::time::timeout(BOUND, async {
            while !condition() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the condition within the bound");
    }

    #[tokio::test]
    async fn a_reader_resumes_after_an_id_and_follows_live() {
        let registry = registry(60_000, 60_000, 1024);
        let (tx, rx) = mpsc::unbounded();
        let mut first = registry.start("r1", rx).unwrap();
        tx.unbounded_send(EventBody::data("a")).unwrap();
        tx.unbounded_send(EventBody::named("n", "b")).unwrap();
        assert_eq!(next(&mut first).await.unwrap().id, 0);
        drop(first);

        let mut again = registry.subscribe("r1", Some(0)).unwrap();
        let event = next(&mut again).await.unwrap();
        assert_eq!((event.id, event.body.name.as_deref(), event.body.data.as_str()), (1, Some("n"), "b"));
        tx.unbounded_send(EventBody::data("c")).unwrap();
        assert_eq!(next(&mut again).await.unwrap().id, 2);
        drop(tx);
        assert!(next(&mut again).await.is_none(), "the stream ends with its producer");

        // Finished and retained: a late reader replays all of it.
        let all: Vec<u64> = registry.subscribe("r1", None).unwrap().map(|e| e.unwrap().id).collect().await;
        assert_eq!(all, vec![0, 1, 2]);
        assert_eq!(registry.stats(), StreamStats { active: 0, finished: 1, buffered_bytes: 4 });
        assert!(matches!(registry.subscribe("r1", Some(7)), Err(StreamError::BeyondEnd { .. })));
        assert!(matches!(registry.start("r1", futures::stream::empty()), Err(StreamError::AlreadyExists(_))));
    }

    #[tokio::test]
    async fn without_a_reader_the_generation_stops_after_the_grace_period() {
        let registry = registry(50, 60_000, 1024);
        let (tx, rx) = mpsc::unbounded::<EventBody>();
        drop(registry.start("r", rx).unwrap());
        until(|| tx.is_closed()).await;
        until(|| !registry.contains("r")).await;
        assert!(matches!(registry.subscribe("r", None), Err(StreamError::NotFound(_))));
    }

    #[tokio::test]
    async fn a_reader_within_the_grace_period_keeps_it_going() {
        let registry = registry(300, 60_000, 1024);
        let (tx, rx) = mpsc::unbounded::<EventBody>();
        drop(registry.start("r", rx).unwrap());
        let mut back = registry.subscribe("r", None).unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(!tx.is_closed(), "a subscribed stream is not cancelled");
        tx.unbounded_send(EventBody::data("x")).unwrap();
        assert_eq!(next(&mut back).await.unwrap().id, 0);
    }

    #[tokio::test]
    async fn a_finished_stream_is_freed_after_the_retention() {
        let registry = registry(60_000, 50, 1024);
        let events = futures::stream::iter([EventBody::data("a")]);
        let replay: Vec<_> = registry.start("r", events).unwrap().collect().await;
        assert_eq!(replay.len(), 1);
        until(|| !registry.contains("r")).await;
    }

    #[tokio::test]
    async fn cancel_stops_the_producer_and_ends_the_readers() {
        let registry = registry(60_000, 60_000, 1024);
        let (tx, rx) = mpsc::unbounded::<EventBody>();
        let mut reader = registry.start("r", rx).unwrap();
        registry.cancel("r").unwrap();
        assert!(next(&mut reader).await.is_none());
        until(|| tx.is_closed()).await;
        assert!(matches!(registry.cancel("r"), Err(StreamError::NotFound(_))));
    }

    #[tokio::test]
    async fn a_reader_too_far_behind_gets_gone() {
        let registry = registry(60_000, 60_000, 8);
        let (tx, rx) = mpsc::unbounded();
        let mut slow = registry.start("r", rx).unwrap();
        for _ in 0..4 {
            tx.unbounded_send(EventBody::data("abcd")).unwrap();
        }
        // Ok once all four are in (event 3 is the last): the buffer then holds 2 and 3.
        until(|| registry.subscribe("r", Some(3)).is_ok()).await;
        let err = tokio::time::timeout(BOUND, slow.next()).await.unwrap().unwrap().unwrap_err();
        assert!(matches!(err, StreamError::Gone { after: None, first_available: 2, .. }), "{err:?}");
        assert!(slow.next().await.is_none());
        assert!(matches!(registry.subscribe("r", Some(0)), Err(StreamError::Gone { .. })));
    }

    #[tokio::test]
    async fn shutdown_cancels_everything_and_waits() {
        let registry = registry(60_000, 60_000, 1024);
        let (tx, rx) = mpsc::unbounded::<EventBody>();
        let _reader = registry.start("r", rx).unwrap();
        tokio::time::timeout(BOUND, registry.shutdown()).await.expect("shutdown within the bound");
        assert!(tx.is_closed());
        assert!(!registry.contains("r"));
        assert!(matches!(registry.start("s", futures::stream::empty()), Err(StreamError::ShutDown)));
    }
}
