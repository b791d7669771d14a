//! The lease keeper shared by the etcd and `file` backends: it owns this process's
//! leased registrations, renews the lease, and rides out a store that goes away.
//!
//! States, each entered with one log line:
//!
//! - *held*: the lease is renewed every TTL/3.
//! - *unreachable*: a renewal failed; renewals are retried with backoff, the lease is
//!   still ours until a whole TTL has passed without one. When the store answers again
//!   every registration is checked (and written where it is missing).
//! - *lost*: the store says the lease is gone, or no renewal succeeded for a TTL. Under
//!   [`LeaseLossPolicy::Reregister`] the keeper retries for as long as the process
//!   lives: keep the old lease if the store still has it (etcd extends leases when it
//!   restarts), otherwise take a new one, then write every registration under it.
//!   Instance ids do not change: they are not lease ids.
//!
//! The keeper reports its state on the backend's [`HealthBoard`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::Mutex as AsyncMutex;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};
use tokio_util::sync::CancellationToken;

use super::backoff::Backoff;
use super::health::{HealthBoard, Source};
use crate::config::LeaseLossPolicy;
use crate::error::{Error, ErrorKind, Result};

/// First delay between renewals while the store does not answer (then doubling up to TTL/3).
const RENEW_RETRY_INITIAL: Duration = Duration::from_millis(250);
/// First and longest delay between re-registration attempts after the lease is lost
/// (the longest is also at most TTL/2: a store that comes back with the old lease still
/// alive, as etcd does after a restart, keeps it only for about a TTL).
const REREGISTER_RETRY_INITIAL: Duration = Duration::from_millis(250);
const REREGISTER_RETRY_MAX: Duration = Duration::from_secs(5);
/// Shortest bound on one re-registration attempt (otherwise one TTL).
const MIN_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on waiting for the keeper task at shutdown.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(3);

/// What the keeper needs from a store that holds leases.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// The backend's name for log lines: "etcd", "file discovery".
    fn name(&self) -> &'static str;

    /// Where the store is (endpoints, directory), for log lines.
    fn location(&self) -> String;

    /// Renew `lease` once: `Ok(true)` it is alive for another TTL, `Ok(false)` the store
    /// says it is gone, `Err` the store could not be asked.
    async fn renew(&self, lease: i64) -> Result<bool>;

    /// A new lease.
    async fn grant(&self) -> Result<i64>;

    /// Make `key` hold `value` under `lease`. With `exclusive`, only if the key is
    /// absent (or expired) or bound to one of the leases in `ours`; `Ok(false)` when
    /// someone else holds it. A key already holding `value` under `lease` may be left
    /// untouched (so checking registrations wakes no watcher).
    async fn write(
        &self,
        key: &str,
        value: &Bytes,
        lease: i64,
        exclusive: bool,
        ours: &[i64],
    ) -> Result<bool>;

    /// Give `lease` up with whatever is still bound to it. Best effort and bounded;
    /// failures are logged.
    async fn abandon(&self, lease: i64);

    /// Work to do after each successful renewal (the file backend collects garbage).
    async fn after_renewal(&self) {}
}

/// A key this process wrote under its lease, kept to write it again under a new lease.
struct Registration {
    value: Bytes,
    /// Written with `create_leased`: on re-registration it must not replace a key another
    /// process created meanwhile.
    exclusive: bool,
}

/// State shared by the handle and the keeper task.
struct Inner<S> {
    store: Arc<S>,
    ttl: Duration,
    lease: AtomicI64,
    /// Set while the lease is lost and not yet replaced: leased writes are deferred.
    lost: AtomicBool,
    /// Leased keys of this process. Leased writes hold this lock across the store call
    /// so a re-registration never interleaves with them (a write could otherwise land on
    /// a dead lease after the re-write, or a deleted key could be written again).
    registrations: AsyncMutex<HashMap<String, Registration>>,
    policy: LeaseLossPolicy,
    /// The runtime's root token; cancelled on loss under [`LeaseLossPolicy::Shutdown`].
    root: CancellationToken,
    /// Ends the keeper task (shutdown, or the backend handle dropped).
    stop: CancellationToken,
    health: Arc<HealthBoard>,
}

/// Keeps one process's lease and its leased registrations; see the module docs.
pub(crate) struct LeaseKeeper<S: LeaseStore> {
    inner: Arc<Inner<S>>,
    task: parking_lot::Mutex<Option<JoinHandle<()>>>,
}

/// Everything [`LeaseKeeper::start`] needs.
pub(crate) struct KeeperConfig {
    /// The lease the backend was granted at startup.
    pub lease: i64,
    pub ttl: Duration,
    pub policy: LeaseLossPolicy,
    /// The runtime's root token.
    pub root: CancellationToken,
    /// The keeper's task ends when this token (or a parent) is cancelled.
    pub stop: CancellationToken,
    pub health: Arc<HealthBoard>,
}

impl<S: LeaseStore> LeaseKeeper<S> {
    /// Start keeping `config.lease` alive in `store`.
    pub(crate) fn start(store: Arc<S>, config: KeeperConfig) -> Self {
        let inner = Arc::new(Inner {
            store,
            ttl: config.ttl,
            lease: AtomicI64::new(config.lease),
            lost: AtomicBool::new(false),
            registrations: AsyncMutex::new(HashMap::new()),
            policy: config.policy,
            root: config.root,
            stop: config.stop,
            health: config.health,
        });
        let task = tokio::spawn(inner.clone().run());
        LeaseKeeper { inner, task: parking_lot::Mutex::new(Some(task)) }
    }

    /// The current lease (changes only when a lost lease is replaced).
    pub(crate) fn lease_id(&self) -> i64 {
        self.inner.lease_id()
    }

    /// Write `key` under the lease and remember it for re-registration.
    ///
    /// While the lease is lost, a plain write (`exclusive == false`) is only recorded
    /// and returns `Ok`: the keeper writes it with every other registration once it has
    /// a lease again. An exclusive write fails then (`Discovery`), because whether the
    /// key is free cannot be known until the store is back.
    pub(crate) async fn write_leased(
        &self,
        key: &str,
        value: Bytes,
        exclusive: bool,
    ) -> Result<()> {
        let s = &self.inner;
        let mut registrations = s.registrations.lock().await;
        if s.lost.load(Ordering::Acquire) {
            if exclusive {
                return Err(Error::new(
                    ErrorKind::Discovery,
                    format!(
                        "cannot create {key}: this process's {} lease is lost and being \
                         re-established ({}); retry later",
                        s.store.name(),
                        s.store.location()
                    ),
                ));
            }
            tracing::debug!(key, "lease lost: the write is recorded and done on re-registration");
            registrations.insert(key.to_string(), Registration { value, exclusive });
            return Ok(());
        }
        if !s.store.write(key, &value, s.lease_id(), exclusive, &[]).await? {
            return Err(Error::new(ErrorKind::AlreadyExists, format!("key {key} already exists")));
        }
        registrations.insert(key.to_string(), Registration { value, exclusive });
        Ok(())
    }

    /// Run `op` (an unleased write or a delete of `key`) and, if it succeeds, stop
    /// re-registering `key`. The registrations stay locked across `op`, so a
    /// re-registration cannot bring the key back behind it.
    pub(crate) async fn unregister<T>(
        &self,
        key: &str,
        op: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let mut registrations = self.inner.registrations.lock().await;
        let out = op.await?;
        registrations.remove(key);
        Ok(out)
    }

    /// Stop keeping the lease, forget the registrations and give the lease up (its keys
    /// disappear now rather than after the TTL).
    pub(crate) async fn shutdown(&self) {
        let s = &self.inner;
        s.stop.cancel();
        let task = self.task.lock().take();
        if let Some(task) = task {
            if timeout(SHUTDOWN_WAIT, task).await.is_err() {
                tracing::warn!(
                    "{} lease keeper did not stop within {SHUTDOWN_WAIT:?}",
                    s.store.name()
                );
            }
        }
        let mut registrations = s.registrations.lock().await;
        registrations.clear();
        s.store.abandon(s.lease_id()).await;
    }
}

/// Whether the keeper goes on after a lease loss.
enum AfterLoss {
    /// A lease is held again; renew it now.
    Held,
    /// The keeper stops (shutdown policy, or it was stopped).
    Stop,
}

impl<S: LeaseStore> Inner<S> {
    fn lease_id(&self) -> i64 {
        self.lease.load(Ordering::Acquire)
    }

    /// One renewal, bounded so that a store that hangs counts as unreachable.
    async fn renew_once(&self, lease: i64, bound: Duration) -> Result<bool> {
        match timeout(bound, self.store.renew(lease)).await {
            Ok(result) => result,
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!("renewing the lease got no answer within {bound:?}"),
            )),
        }
    }

    /// The keeper task.
    async fn run(self: Arc<Self>) {
        let period = self.ttl / 3;
        let mut last_renewed = Instant::now();
        let mut unreachable = false;
        let mut retry = Backoff::new(RENEW_RETRY_INITIAL, period);
        let mut wait = period;
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = sleep(wait) => {}
            }
            let lease = self.lease_id();
            let late = last_renewed.elapsed();
            let renewed = if late > self.ttl {
                // Others may already have judged the lease dead and acted on it; carrying
                // on as if nothing happened would be a silent half-life.
                Ok(false)
            } else {
                self.renew_once(lease, period).await
            };
            if self.stop.is_cancelled() {
                return;
            }
            match renewed {
                Ok(true) => {
                    last_renewed = Instant::now();
                    if unreachable {
                        // The lease survived; the keys may not have (a store restored
                        // from an older state), so check every one.
                        if let Err(e) = self.check_registrations(lease).await {
                            tracing::debug!(error = %e, "checking registrations failed; retrying");
                            wait = retry.next_delay();
                            continue;
                        }
                        unreachable = false;
                        if let Some(since) = self.health.clear(Source::Lease) {
                            tracing::info!(
                                lease,
                                location = %self.store.location(),
                                "{} answers again after {:?}; lease kept, registrations checked",
                                self.store.name(),
                                since.elapsed()
                            );
                        }
                    }
                    self.store.after_renewal().await;
                    retry.reset();
                    wait = period;
                }
                Ok(false) => {
                    let reason = if late > self.ttl {
                        format!("no renewal for {late:?}, over the TTL ({:?})", self.ttl)
                    } else {
                        format!("{} says the lease has expired", self.store.name())
                    };
                    match self.lost(lease, reason).await {
                        AfterLoss::Stop => return,
                        AfterLoss::Held => {
                            last_renewed = Instant::now();
                            unreachable = false;
                            retry.reset();
                            // Re-registration may have taken a while: renew at once.
                            wait = Duration::ZERO;
                        }
                    }
                }
                Err(e) => {
                    if !unreachable {
                        unreachable = true;
                        let reason = format!(
                            "{} at {} does not answer: {}",
                            self.store.name(),
                            self.store.location(),
                            e
                        );
                        if self.health.report(Source::Lease, reason) {
                            tracing::warn!(
                                lease,
                                location = %self.store.location(),
                                error = %e,
                                "{} does not answer; keeping the lease and registrations, retrying",
                                self.store.name()
                            );
                        }
                    } else {
                        tracing::debug!(lease, error = %e, "lease renewal failed again");
                    }
                    wait = retry.next_delay();
                }
            }
        }
    }

    /// Write every registration again under `lease`, which is still ours.
    async fn check_registrations(&self, lease: i64) -> Result<()> {
        let mut registrations = self.registrations.lock().await;
        self.write_all(&mut registrations, lease, &[lease]).await
    }

    /// Write every registration under `lease`; exclusive keys that another process
    /// took meanwhile (bound to none of `ours`) are given up, with a warning.
    async fn write_all(
        &self,
        registrations: &mut HashMap<String, Registration>,
        lease: i64,
        ours: &[i64],
    ) -> Result<()> {
        let mut taken = Vec::new();
        for (key, reg) in registrations.iter() {
            if !self.store.write(key, &reg.value, lease, reg.exclusive, ours).await? {
                taken.push(key.clone());
            }
        }
        for key in taken {
            tracing::warn!(
                key = %key,
                "another process created this key while our {} lease was lost; giving it up",
                self.store.name()
            );
            registrations.remove(&key);
        }
        Ok(())
    }

    /// Apply the loss policy to the lost `lease`; under `Reregister`, retry until a
    /// lease holds every registration again (or the keeper is stopped).
    async fn lost(&self, lease: i64, reason: String) -> AfterLoss {
        let name = self.store.name();
        self.lost.store(true, Ordering::Release);
        self.health.report(Source::Lease, format!("{name} lease {lease} lost: {reason}"));
        tracing::error!(
            lease,
            location = %self.store.location(),
            reason = %reason,
            "{name} lease lost; keeping registrations locally and retrying"
        );
        if self.policy == LeaseLossPolicy::Shutdown {
            tracing::error!("DYN_LEASE_LOSS=shutdown: shutting the runtime down");
            self.store.abandon(lease).await;
            self.root.cancel();
            return AfterLoss::Stop;
        }
        let started = Instant::now();
        // Every lease this process held since the loss: keys bound to any of them are
        // ours to overwrite.
        let mut ours = vec![lease];
        let mut candidate = lease;
        let longest = REREGISTER_RETRY_MAX.min(self.ttl / 2).max(REREGISTER_RETRY_INITIAL);
        let mut retry = Backoff::new(REREGISTER_RETRY_INITIAL, longest);
        let bound = self.ttl.max(MIN_ATTEMPT_TIMEOUT);
        loop {
            let attempt = timeout(bound, self.reregister(&mut candidate, &mut ours));
            let outcome = tokio::select! {
                _ = self.stop.cancelled() => return AfterLoss::Stop,
                outcome = attempt => outcome,
            };
            match outcome {
                Ok(Ok(())) => break,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "{name} re-registration attempt failed")
                }
                Err(_) => {
                    tracing::debug!("{name} re-registration attempt timed out after {bound:?}")
                }
            }
            tokio::select! {
                _ = self.stop.cancelled() => return AfterLoss::Stop,
                _ = sleep(retry.next_delay()) => {}
            }
        }
        for old in ours.into_iter().filter(|l| *l != candidate) {
            self.store.abandon(old).await;
        }
        self.health.clear(Source::Lease);
        if candidate == lease {
            tracing::warn!(
                lease,
                "{name} still had lease {lease}; registrations checked after {:?}",
                started.elapsed()
            );
        } else {
            tracing::warn!(
                old = lease,
                new = candidate,
                "re-registered under {name} lease {candidate} after {:?}",
                started.elapsed()
            );
        }
        AfterLoss::Held
    }

    /// One re-registration attempt: keep `candidate` if the store still has it,
    /// otherwise take a new lease (which becomes the candidate, so a failed attempt
    /// does not leak it); then write every registration under it.
    async fn reregister(&self, candidate: &mut i64, ours: &mut Vec<i64>) -> Result<()> {
        let mut registrations = self.registrations.lock().await;
        if !self.store.renew(*candidate).await? {
            let lease = self.store.grant().await?;
            ours.push(lease);
            *candidate = lease;
        }
        self.write_all(&mut registrations, *candidate, ours).await?;
        self.lease.store(*candidate, Ordering::Release);
        self.lost.store(false, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use parking_lot::Mutex;

    use super::*;
    use crate::discovery::DiscoveryHealth;

    /// A store in memory that can be taken down, for the keeper's own logic (the
    /// backends are tested against real etcd and a real directory).
    #[derive(Default)]
    struct FakeStore {
        state: Mutex<FakeState>,
    }

    #[derive(Default)]
    struct FakeState {
        down: bool,
        leases: HashSet<i64>,
        granted: i64,
        /// key → (value, lease)
        keys: HashMap<String, (Bytes, i64)>,
    }

    impl FakeStore {
        fn with_lease(lease: i64) -> Arc<Self> {
            let store = FakeStore::default();
            store.state.lock().leases.insert(lease);
            store.state.lock().granted = lease;
            Arc::new(store)
        }

        fn up(&self) -> Result<parking_lot::MutexGuard<'_, FakeState>> {
            let state = self.state.lock();
            if state.down {
                return Err(Error::new(ErrorKind::Discovery, "fake store is down"));
            }
            Ok(state)
        }

        fn expire(&self, lease: i64) {
            let mut state = self.state.lock();
            state.leases.remove(&lease);
            state.keys.retain(|_, (_, l)| *l != lease);
        }

        fn key(&self, key: &str) -> Option<(Bytes, i64)> {
            self.state.lock().keys.get(key).cloned()
        }
    }

    #[async_trait]
    impl LeaseStore for FakeStore {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn location(&self) -> String {
            "memory".into()
        }
        async fn renew(&self, lease: i64) -> Result<bool> {
            Ok(self.up()?.leases.contains(&lease))
        }
        async fn grant(&self) -> Result<i64> {
            let mut state = self.up()?;
            state.granted += 1;
            let lease = state.granted;
            state.leases.insert(lease);
            Ok(lease)
        }
        async fn write(
            &self,
            key: &str,
            value: &Bytes,
            lease: i64,
            exclusive: bool,
            ours: &[i64],
        ) -> Result<bool> {
            let mut state = self.up()?;
            if exclusive {
                if let Some((_, holder)) = state.keys.get(key) {
                    if !ours.contains(holder) && state.leases.contains(holder) {
                        return Ok(false);
                    }
                }
            }
            state.keys.insert(key.to_string(), (value.clone(), lease));
            Ok(true)
        }
        async fn abandon(&self, lease: i64) {
            self.expire(lease);
        }
    }

    const TTL: Duration = Duration::from_millis(900);

    fn keeper(
        store: &Arc<FakeStore>,
        lease: i64,
        policy: LeaseLossPolicy,
    ) -> (LeaseKeeper<FakeStore>, CancellationToken, Arc<HealthBoard>) {
        let root = CancellationToken::new();
        let health = Arc::new(HealthBoard::default());
        let config = KeeperConfig {
            lease,
            ttl: TTL,
            policy,
            root: root.clone(),
            stop: root.child_token(),
            health: health.clone(),
        };
        (LeaseKeeper::start(store.clone(), config), root, health)
    }

    async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(Instant::now() < deadline, "{what}: not within 5 s");
            sleep(Duration::from_millis(10)).await;
        }
    }

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    fn lost(health: &HealthBoard) -> bool {
        matches!(health.health(), DiscoveryHealth::Degraded { ref reason, .. } if reason.contains("lost"))
    }

    #[tokio::test]
    async fn an_outage_shorter_than_the_ttl_keeps_the_lease() {
        let store = FakeStore::with_lease(7);
        let (keeper, root, health) = keeper(&store, 7, LeaseLossPolicy::Reregister);
        keeper.write_leased("k", b("v"), true).await.unwrap();
        store.state.lock().down = true;
        wait_for("degraded", || !health.health().is_healthy()).await;
        assert!(!lost(&health));
        store.state.lock().down = false;
        wait_for("healthy", || health.health().is_healthy()).await;
        assert_eq!(keeper.lease_id(), 7);
        assert_eq!(store.state.lock().granted, 7, "no new lease");
        assert_eq!(store.key("k"), Some((b("v"), 7)));
        assert!(!root.is_cancelled());
    }

    #[tokio::test]
    async fn a_lost_lease_is_retried_until_the_store_is_back() {
        let store = FakeStore::with_lease(7);
        let (keeper, root, health) = keeper(&store, 7, LeaseLossPolicy::Reregister);
        keeper.write_leased("plain", b("p"), false).await.unwrap();
        keeper.write_leased("excl", b("x"), true).await.unwrap();
        store.state.lock().down = true;
        store.expire(7);
        wait_for("lost", || lost(&health)).await;
        // Well past the old limit of three attempts.
        sleep(TTL * 4).await;
        assert!(!root.is_cancelled());
        keeper.write_leased("later", b("l"), false).await.unwrap();
        let e = keeper.write_leased("excl2", b("y"), true).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Discovery);

        store.state.lock().down = false;
        wait_for("healthy", || health.health().is_healthy()).await;
        let lease = keeper.lease_id();
        assert_ne!(lease, 7);
        for (key, value) in [("plain", "p"), ("excl", "x"), ("later", "l")] {
            assert_eq!(store.key(key), Some((b(value), lease)), "{key}");
        }
        assert!(!root.is_cancelled());
        keeper.shutdown().await;
        assert!(store.state.lock().keys.is_empty());
    }

    #[tokio::test]
    async fn an_exclusive_key_taken_meanwhile_is_given_up() {
        let store = FakeStore::with_lease(7);
        let (keeper, _root, health) = keeper(&store, 7, LeaseLossPolicy::Reregister);
        keeper.write_leased("excl", b("mine"), true).await.unwrap();
        keeper.write_leased("plain", b("p"), false).await.unwrap();
        {
            let mut state = store.state.lock();
            state.leases.remove(&7);
            state.leases.insert(99);
            state.keys.insert("excl".into(), (b("theirs"), 99));
        }
        wait_for("re-registered", || keeper.lease_id() != 7 && health.health().is_healthy()).await;
        assert_eq!(store.key("excl"), Some((b("theirs"), 99)));
        assert_eq!(store.key("plain"), Some((b("p"), keeper.lease_id())));
        // Given up for good: a later re-registration does not fight for it either.
        store.expire(keeper.lease_id());
        wait_for("re-registered again", || store.key("plain").is_some()).await;
        assert_eq!(store.key("excl"), Some((b("theirs"), 99)));
    }

    #[tokio::test]
    async fn shutdown_policy_cancels_the_root_on_loss() {
        let store = FakeStore::with_lease(7);
        let (keeper, root, _health) = keeper(&store, 7, LeaseLossPolicy::Shutdown);
        keeper.write_leased("k", b("v"), false).await.unwrap();
        store.expire(7);
        timeout(Duration::from_secs(3), root.cancelled()).await.expect("root not cancelled");
        assert_eq!(store.state.lock().granted, 7, "no new lease under the shutdown policy");
    }
}
