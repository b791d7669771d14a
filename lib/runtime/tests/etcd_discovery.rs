//! The etcd discovery backend against a real `etcd` process (started per test on free
//! loopback ports). Without an `etcd` binary the tests print why and pass.

use crate::discovery_support;
use crate::poll;

use std::time::Duration;

use bytes::Bytes;
use discovery_support::{free_port, next, Etcd};
use poll::wait_until;
use dynamo_runtime::config::{DiscoveryBackend, LeaseLossPolicy, RuntimeConfig};
use dynamo_runtime::discovery::{Discovery, EtcdDiscovery, KeyValue, WatchEvent};
use dynamo_runtime::ErrorKind;
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;

fn b(s: &'static str) -> Bytes {
    Bytes::from_static(s.as_bytes())
}

fn kv(key: &str, value: &'static str) -> KeyValue {
    KeyValue { key: key.to_string(), value: b(value) }
}

const TTL: Duration = Duration::from_secs(2);

#[tokio::test]
async fn etcd_put_get_create_and_prefix() {
    let Some(etcd) = Etcd::start().await else { return };
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
    let Some(etcd) = Etcd::start().await else { return };
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
    let Some(etcd) = Etcd::start().await else { return };
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
    let Some(etcd) = Etcd::start().await else { return };
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
    let Some(etcd) = Etcd::start().await else { return };
    let (a, cancel_a) = etcd.client(TTL).await;
    let (w, _cw) = etcd.client(TTL).await;
    a.put_leased("ns/ep/a", b("a")).await.unwrap();
    a.create_leased("ns/ep/excl", b("x")).await.unwrap();
    a.put_leased("ns/ep/gone", b("g")).await.unwrap();
    a.delete("ns/ep/gone").await.unwrap();
    let mut watch = w.watch_prefix("ns/ep/").await.unwrap();
    let old = a.lease_id();

    etcd.revoke(old).await;
    wait_until("the lease is replaced", Duration::from_secs(8), || a.lease_id() != old).await;
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
    let Some(etcd) = Etcd::start().await else { return };
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
