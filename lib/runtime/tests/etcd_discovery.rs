//! The etcd discovery backend against a real `etcd` process (started per test on free
//! loopback ports). CI installs `etcd`; a missing binary fails the tests loudly.

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use dynamo_runtime::config::{DiscoveryBackend, LeaseLossPolicy, RuntimeConfig};
use dynamo_runtime::discovery::{Discovery, EtcdDiscovery, KeyValue, PrefixWatch, WatchEvent};
use dynamo_runtime::ErrorKind;
use tokio::time::{sleep, timeout, Instant};
use tokio_util::sync::CancellationToken;

/// Bound on etcd becoming ready after it is started.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// A single-node etcd in a temp dir, killed on drop.
struct Etcd {
    child: Child,
    endpoint: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    // Bind-and-release: the port could in theory be taken again before etcd binds it,
    // which start() reports through the log.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

impl Etcd {
    async fn start() -> Etcd {
        let binary = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".to_string());
        let dir = tempfile::tempdir().expect("temp dir");
        let (client_port, peer_port) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let log = dir.path().join("etcd.log");
        let log_file = File::create(&log).expect("create etcd log");
        let child = Command::new(&binary)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--name", "default"])
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}")])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("clone log handle"))
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start `{binary}` ({e}): these tests need a real etcd on PATH \
                     (e.g. `apt-get install etcd-server`, or set ETCD_BIN)"
                )
            });
        let mut etcd = Etcd { child, endpoint: client_url, log, _dir: dir };
        etcd.wait_ready(client_port).await;
        etcd
    }

    async fn wait_ready(&mut self, port: u16) {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("etcd exited during startup ({status}); log:\n{}", self.log_text());
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                let probe = async {
                    let mut client = etcd_client::Client::connect([&self.endpoint], None).await?;
                    client.get("probe", None).await
                };
                if let Ok(Ok(_)) = timeout(Duration::from_secs(1), probe).await {
                    return;
                }
            }
            if Instant::now() > deadline {
                panic!("etcd not ready within {STARTUP_TIMEOUT:?}; log:\n{}", self.log_text());
            }
            sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn config(&self, lease_ttl: Duration, lease_loss: LeaseLossPolicy) -> RuntimeConfig {
        RuntimeConfig {
            discovery: DiscoveryBackend::Etcd,
            etcd_endpoints: vec![self.endpoint.clone()],
            lease_ttl,
            lease_loss,
            ..RuntimeConfig::default()
        }
    }

    async fn client(&self, lease_ttl: Duration) -> (EtcdDiscovery, CancellationToken) {
        let cancel = CancellationToken::new();
        let config = self.config(lease_ttl, LeaseLossPolicy::Reregister);
        let d = EtcdDiscovery::connect(&config, cancel.clone()).await.expect("connect to etcd");
        (d, cancel)
    }

    /// Revoke `lease` behind the client's back, as if etcd had expired it.
    async fn revoke(&self, lease: i64) {
        let mut raw =
            etcd_client::Client::connect([&self.endpoint], None).await.expect("raw client");
        raw.lease_revoke(lease).await.expect("revoke");
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn b(s: &'static str) -> Bytes {
    Bytes::from_static(s.as_bytes())
}

fn kv(key: &str, value: &'static str) -> KeyValue {
    KeyValue { key: key.to_string(), value: b(value) }
}

async fn next(watch: &mut PrefixWatch, within: Duration) -> WatchEvent {
    timeout(within, watch.events.recv())
        .await
        .expect("no watch event in time")
        .expect("watch ended")
}

const TTL: Duration = Duration::from_secs(2);

#[tokio::test]
async fn etcd_put_get_create_and_prefix() {
    let etcd = Etcd::start().await;
    let (a, _ca) = etcd.client(TTL).await;
    let (b2, _cb) = etcd.client(TTL).await;
    assert_ne!(a.lease_id(), b2.lease_id());

    a.put_leased("ns/generate/2", b("two")).await.unwrap();
    a.put_leased("ns/generate/1", b("one")).await.unwrap();
    a.put_leased("ns/generate_v2/1", b("other")).await.unwrap();
    a.put("ns/config", b("cfg")).await.unwrap();
    assert_eq!(b2.get("ns/generate/1").await.unwrap(), Some(b("one")));
    assert_eq!(b2.get("ns/missing").await.unwrap(), None);
    let found = b2.get_prefix("ns/generate/").await.unwrap();
    assert_eq!(found, vec![kv("ns/generate/1", "one"), kv("ns/generate/2", "two")]);

    a.create_leased("ns/lock", b("a")).await.unwrap();
    let e = b2.create_leased("ns/lock", b("b")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists);
    let e = a.create_leased("ns/lock", b("again")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists);
    assert_eq!(b2.get("ns/lock").await.unwrap(), Some(b("a")));

    a.delete("ns/generate/1").await.unwrap();
    a.delete("ns/generate/1").await.unwrap();
    assert_eq!(b2.get("ns/generate/1").await.unwrap(), None);
    a.shutdown().await;
    b2.shutdown().await;
}

#[tokio::test]
async fn etcd_watch_sees_puts_and_deletes() {
    let etcd = Etcd::start().await;
    let (a, _ca) = etcd.client(TTL).await;
    let (w, _cw) = etcd.client(TTL).await;
    a.put_leased("ns/ep/1", b("one")).await.unwrap();
    let mut watch = w.watch_prefix("ns/ep/").await.unwrap();
    assert_eq!(watch.initial, vec![kv("ns/ep/1", "one")]);

    a.put_leased("ns/ep_v2/x", b("not under the prefix")).await.unwrap();
    a.put_leased("ns/ep/2", b("two")).await.unwrap();
    a.put_leased("ns/ep/1", b("uno")).await.unwrap();
    a.delete("ns/ep/2").await.unwrap();
    let within = Duration::from_secs(5);
    assert_eq!(next(&mut watch, within).await, WatchEvent::Put(kv("ns/ep/2", "two")));
    assert_eq!(next(&mut watch, within).await, WatchEvent::Put(kv("ns/ep/1", "uno")));
    assert_eq!(next(&mut watch, within).await, WatchEvent::Delete("ns/ep/2".into()));
    a.shutdown().await;
    w.shutdown().await;
}

#[tokio::test]
async fn etcd_shutdown_removes_leased_keys_at_once() {
    let etcd = Etcd::start().await;
    let (a, _ca) = etcd.client(Duration::from_secs(30)).await;
    let (w, _cw) = etcd.client(TTL).await;
    a.put_leased("ns/ep/a", b("a")).await.unwrap();
    a.put("ns/keep", b("k")).await.unwrap();
    let mut watch = w.watch_prefix("ns/").await.unwrap();
    assert_eq!(watch.initial.len(), 2);

    let started = Instant::now();
    a.shutdown().await;
    // Well under the 30 s TTL: the lease was revoked, not left to expire.
    assert_eq!(
        next(&mut watch, Duration::from_secs(3)).await,
        WatchEvent::Delete("ns/ep/a".into())
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(w.get("ns/ep/a").await.unwrap(), None);
    assert_eq!(w.get("ns/keep").await.unwrap(), Some(b("k")));
    w.shutdown().await;
}

#[tokio::test]
async fn etcd_dead_client_keys_expire_after_ttl() {
    let etcd = Etcd::start().await;
    let (a, cancel_a) = etcd.client(TTL).await;
    let (w, _cw) = etcd.client(TTL).await;
    a.put_leased("ns/ep/a", b("a")).await.unwrap();
    w.put_leased("ns/ep/w", b("w")).await.unwrap();
    let mut watch = w.watch_prefix("ns/ep/").await.unwrap();

    // The process "dies": keep-alives stop, nothing is revoked.
    cancel_a.cancel();
    drop(a);
    let started = Instant::now();
    assert_eq!(
        next(&mut watch, Duration::from_secs(8)).await,
        WatchEvent::Delete("ns/ep/a".into())
    );
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "gone too early: {:?}",
        started.elapsed()
    );
    assert_eq!(w.get_prefix("ns/ep/").await.unwrap(), vec![kv("ns/ep/w", "w")]);
    w.shutdown().await;
}

#[tokio::test]
async fn etcd_lost_lease_is_reregistered() {
    let etcd = Etcd::start().await;
    let (a, cancel_a) = etcd.client(TTL).await;
    let (w, _cw) = etcd.client(TTL).await;
    a.put_leased("ns/ep/a", b("a")).await.unwrap();
    a.create_leased("ns/ep/excl", b("x")).await.unwrap();
    a.put_leased("ns/ep/gone", b("g")).await.unwrap();
    a.delete("ns/ep/gone").await.unwrap();
    let mut watch = w.watch_prefix("ns/ep/").await.unwrap();
    let old = a.lease_id();

    etcd.revoke(old).await;
    let deadline = Instant::now() + Duration::from_secs(8);
    while a.lease_id() == old {
        assert!(Instant::now() < deadline, "lease was not replaced");
        sleep(Duration::from_millis(50)).await;
    }
    let mut seen = Vec::new();
    while seen.len() < 4 {
        seen.push(next(&mut watch, Duration::from_secs(5)).await);
    }
    assert!(seen.contains(&WatchEvent::Put(kv("ns/ep/a", "a"))), "{seen:?}");
    assert!(seen.contains(&WatchEvent::Put(kv("ns/ep/excl", "x"))), "{seen:?}");
    assert_eq!(
        w.get_prefix("ns/ep/").await.unwrap(),
        vec![kv("ns/ep/a", "a"), kv("ns/ep/excl", "x")],
        "deleted keys must not come back"
    );
    assert!(!cancel_a.is_cancelled());
    // The keys are bound to the new lease: shutdown removes them.
    a.shutdown().await;
    assert!(w.get_prefix("ns/ep/").await.unwrap().is_empty());
    w.shutdown().await;
}

#[tokio::test]
async fn etcd_lost_lease_with_shutdown_policy_cancels_the_runtime() {
    let etcd = Etcd::start().await;
    let cancel = CancellationToken::new();
    let config = etcd.config(TTL, LeaseLossPolicy::Shutdown);
    let a = EtcdDiscovery::connect(&config, cancel.clone()).await.unwrap();
    etcd.revoke(a.lease_id()).await;
    timeout(Duration::from_secs(5), cancel.cancelled()).await.expect("runtime was not cancelled");
}

#[tokio::test]
async fn etcd_dead_endpoint_fails_fast_with_a_clear_error() {
    // Nothing listens on a port just released.
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let config = RuntimeConfig {
        discovery: DiscoveryBackend::Etcd,
        etcd_endpoints: vec![endpoint.clone()],
        ..RuntimeConfig::default()
    };
    let started = Instant::now();
    let result =
        timeout(Duration::from_secs(10), EtcdDiscovery::connect(&config, CancellationToken::new()))
            .await
            .expect("connect hung");
    let e = result.err().expect("connect to a dead endpoint succeeded");
    assert_eq!(e.kind(), ErrorKind::Discovery);
    assert!(e.to_string().contains(&endpoint), "{e}");
    assert!(started.elapsed() < Duration::from_secs(7), "took {:?}", started.elapsed());
}
