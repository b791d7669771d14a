//! etcd discovery rides out its etcd: a real etcd is killed (SIGKILL), kept down,
//! compacted behind the watchers' backs, and started again with its data; watches keep
//! delivering, leases are kept or replaced, and no process gives up.
//! Without an `etcd` binary the tests print why and pass.

use crate::discovery_support;
use crate::poll;

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use discovery_support::{next, raw, Etcd};
use poll::{eventually, wait_until};
use dynamo_runtime::config::{LeaseLossPolicy, RuntimeConfig};
use dynamo_runtime::discovery::{Discovery, EtcdDiscovery, KeyValue, WatchEvent};
use dynamo_runtime::{DiscoveryHealth, DistributedRuntime};
use etcd_client::{CompactionOptions, GetOptions};
use tokio::time::{sleep, timeout, Instant};
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(2);

fn b(s: &'static str) -> Bytes {
    Bytes::from_static(s.as_bytes())
}

fn kv(key: &str, value: &'static str) -> KeyValue {
    KeyValue { key: key.to_string(), value: b(value) }
}

/// Collect events until every one of `wanted` has been seen, failing after `within`.
async fn collect_until(
    watch: &mut dynamo_runtime::discovery::PrefixWatch,
    wanted: &[WatchEvent],
    within: Duration,
) -> Vec<WatchEvent> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    while !wanted.iter().all(|w| seen.contains(w)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, watch.events.recv()).await {
            Ok(Some(event)) => seen.push(event),
            Ok(None) => panic!("the watch ended; seen {seen:?}"),
            Err(_) => panic!("not all of {wanted:?} within {within:?}; seen {seen:?}"),
        }
    }
    seen
}

#[tokio::test]
async fn watch_survives_etcd_kill_and_immediate_restart() {
    let Some(mut etcd) = Etcd::start().await else { return };
    let (w, cancel_w) = etcd.client(TTL).await;
    let (a, _ca) = etcd.client(TTL).await;
    a.put_leased("ns/ep/1", b("one")).await.unwrap();
    let mut watch = w.watch_prefix("ns/ep/").await.unwrap();
    assert_eq!(watch.initial, vec![kv("ns/ep/1", "one")]);

    etcd.restart().await;

    // A worker that starts after the blip is seen by the watch started before it.
    let (late, _cl) = etcd.client(TTL).await;
    late.put_leased("ns/ep/2", b("two")).await.unwrap();
    collect_until(&mut watch, &[WatchEvent::Put(kv("ns/ep/2", "two"))], Duration::from_secs(10))
        .await;
    wait_until("watcher healthy", Duration::from_secs(10), || w.health().is_healthy()).await;
    assert!(!cancel_w.is_cancelled());
    // The earlier registration survived the blip.
    assert_eq!(w.get("ns/ep/1").await.unwrap(), Some(b("one")));
}

#[tokio::test]
async fn watch_survives_etcd_down_longer_than_the_lease_ttl() {
    let Some(mut etcd) = Etcd::start().await else { return };
    let (w, cancel_w) = etcd.client(TTL).await;
    let (dying, cancel_dying) = etcd.client(TTL).await;
    dying.put_leased("ns/ep/dead", b("d")).await.unwrap();
    let mut watch = w.watch_prefix("ns/ep/").await.unwrap();
    assert_eq!(watch.initial, vec![kv("ns/ep/dead", "d")]);

    // The process dies (no revoke), then etcd goes away for longer than the TTL.
    cancel_dying.cancel();
    drop(dying);
    etcd.kill();
    wait_until("watcher degraded", Duration::from_secs(5), || !w.health().is_healthy()).await;
    sleep(TTL * 2).await;
    assert!(
        timeout(Duration::from_millis(100), watch.events.recv()).await.is_err(),
        "no events while etcd is down"
    );
    etcd.restart().await;

    // etcd expires the dead process's lease after its restart: the watch delivers it.
    collect_until(&mut watch, &[WatchEvent::Delete("ns/ep/dead".into())], Duration::from_secs(10))
        .await;
    let (late, _cl) = etcd.client(TTL).await;
    late.put_leased("ns/ep/new", b("n")).await.unwrap();
    collect_until(&mut watch, &[WatchEvent::Put(kv("ns/ep/new", "n"))], Duration::from_secs(10))
        .await;
    wait_until("watcher healthy", Duration::from_secs(10), || w.health().is_healthy()).await;
    assert!(!cancel_w.is_cancelled());
}

#[tokio::test]
async fn watch_relists_exactly_the_differences_after_compaction() {
    let Some(mut etcd) = Etcd::start().await else { return };
    let mut direct = etcd.raw().await;
    for (key, value) in [("ns/c/keep", "k"), ("ns/c/change", "v1"), ("ns/c/gone", "g")] {
        direct.put(key, value, None).await.unwrap();
    }
    let (w, _cw) = etcd.client(Duration::from_secs(10)).await;
    let mut watch = w.watch_prefix("ns/c/").await.unwrap();
    assert_eq!(watch.initial.len(), 3);

    // Behind the watch's back (etcd on a port it does not know): change, add, delete,
    // churn a key, and compact the whole history away.
    let aside = etcd.restart_aside().await;
    let mut direct = raw(&aside).await;
    direct.put("ns/c/change", "v2", None).await.unwrap();
    direct.put("ns/c/new", "n", None).await.unwrap();
    direct.delete("ns/c/gone", None).await.unwrap();
    direct.put("ns/c/churn", "1", None).await.unwrap();
    direct.delete("ns/c/churn", None).await.unwrap();
    direct.put("other/x", "not watched", None).await.unwrap();
    let revision = direct.get("ns/c/", None).await.unwrap().header().unwrap().revision();
    direct.compact(revision, Some(CompactionOptions::new().with_physical())).await.unwrap();
    etcd.restart().await;

    let expected = vec![
        WatchEvent::Delete("ns/c/gone".into()),
        WatchEvent::Put(kv("ns/c/change", "v2")),
        WatchEvent::Put(kv("ns/c/new", "n")),
    ];
    let mut seen = Vec::new();
    for _ in 0..expected.len() {
        seen.push(next(&mut watch, Duration::from_secs(10)).await);
    }
    assert_eq!(seen, expected, "exactly the differences");
    assert!(
        timeout(Duration::from_millis(500), watch.events.recv()).await.is_err(),
        "nothing else"
    );
    // And the watch goes on from the re-list.
    let mut direct = etcd.raw().await;
    direct.put("ns/c/after", "a", None).await.unwrap();
    assert_eq!(
        next(&mut watch, Duration::from_secs(5)).await,
        WatchEvent::Put(kv("ns/c/after", "a"))
    );
}

#[tokio::test]
async fn watch_reads_again_when_etcd_comes_back_without_its_data() {
    let Some(mut etcd) = Etcd::start().await else { return };
    let mut direct = etcd.raw().await;
    direct.put("ns/ep/plain", "p", None).await.unwrap();
    // History the new etcd will not reach soon.
    for i in 0..30 {
        direct.put("other/churn", format!("{i}"), None).await.unwrap();
    }
    let (a, _ca) = etcd.client(TTL).await;
    a.put_leased("ns/ep/a", b("a")).await.unwrap();
    let (w, _cw) = etcd.client(TTL).await;
    let mut watch = w.watch_prefix("ns/ep/").await.unwrap();
    assert_eq!(watch.initial.len(), 2);

    etcd.restart_wiped().await;
    // The unleased key is gone for good; the live process registers its key again.
    collect_until(&mut watch, &[WatchEvent::Delete("ns/ep/plain".into())], Duration::from_secs(10))
        .await;
    eventually("the live process registers again", Duration::from_secs(10), async || w.get("ns/ep/a").await.unwrap()).await;
    let mut direct = etcd.raw().await;
    direct.put("ns/ep/after", "x", None).await.unwrap();
    collect_until(&mut watch, &[WatchEvent::Put(kv("ns/ep/after", "x"))], Duration::from_secs(10))
        .await;
    let now: Vec<String> =
        w.get_prefix("ns/ep/").await.unwrap().into_iter().map(|kv| kv.key).collect();
    assert_eq!(now, vec!["ns/ep/a", "ns/ep/after"]);
}

/// The lease each of `keys` is bound to in etcd (0 for a missing key).
async fn leases_of(etcd: &Etcd, keys: &[&str]) -> HashSet<i64> {
    let mut direct = etcd.raw().await;
    let mut leases = HashSet::new();
    for key in keys {
        let resp = direct.get(*key, Some(GetOptions::new())).await.unwrap();
        leases.insert(resp.kvs().first().map_or(0, |kv| kv.lease()));
    }
    leases
}

#[tokio::test]
async fn lease_loss_keeps_the_process_and_reregisters_when_etcd_is_back() {
    let Some(mut etcd) = Etcd::start().await else { return };
    let (a, cancel_a) = etcd.client(TTL).await;
    a.put_leased("ns/ep/a", b("a")).await.unwrap();
    a.create_leased("ns/ep/excl", b("x")).await.unwrap();
    assert_eq!(a.health(), DiscoveryHealth::Healthy);

    etcd.kill();
    wait_until("degraded", Duration::from_secs(5), || !a.health().is_healthy()).await;
    wait_until("lease lost", Duration::from_secs(5), || {
        matches!(a.health(), DiscoveryHealth::Degraded { ref reason, .. } if reason.contains("lost"))
    })
    .await;
    // A registration made while the lease is lost is kept and written on recovery.
    timeout(Duration::from_secs(1), a.put_leased("ns/ep/later", b("l")))
        .await
        .expect("a leased write while the lease is lost returns at once")
        .unwrap();
    sleep(TTL * 2).await;
    assert!(!cancel_a.is_cancelled(), "the default policy never gives up");
    let DiscoveryHealth::Degraded { since, .. } = a.health() else { panic!("healthy while down") };
    assert!(since.elapsed() >= TTL * 2);

    etcd.restart().await;
    wait_until("healthy again", Duration::from_secs(15), || a.health().is_healthy()).await;
    assert!(!cancel_a.is_cancelled());
    let mut direct = etcd.raw().await;
    for (key, value) in [("ns/ep/a", "a"), ("ns/ep/excl", "x"), ("ns/ep/later", "l")] {
        let resp = direct.get(key, None).await.unwrap();
        let found = resp.kvs().first().map(|kv| kv.value().to_vec());
        assert_eq!(found.as_deref(), Some(value.as_bytes()), "{key}");
    }
    // Every key is bound to the lease the process now holds, so it lives and dies with it.
    let keys = ["ns/ep/a", "ns/ep/excl", "ns/ep/later"];
    assert_eq!(leases_of(&etcd, &keys).await, HashSet::from([a.lease_id()]));
    a.shutdown().await;
    assert_eq!(leases_of(&etcd, &keys).await, HashSet::from([0]));
}

#[tokio::test]
async fn lease_loss_with_shutdown_policy_cancels_when_etcd_stays_away() {
    let Some(mut etcd) = Etcd::start().await else { return };
    let cancel = CancellationToken::new();
    let a = EtcdDiscovery::connect(&etcd.config(TTL, LeaseLossPolicy::Shutdown), cancel.clone())
        .await
        .unwrap();
    a.put_leased("ns/ep/a", b("a")).await.unwrap();
    etcd.kill();
    timeout(TTL + Duration::from_secs(5), cancel.cancelled())
        .await
        .expect("the runtime was not cancelled");
}

#[tokio::test]
async fn runtime_reports_discovery_health_and_outlives_an_etcd_outage() {
    let Some(mut etcd) = Etcd::start().await else { return };
    let config = RuntimeConfig {
        tcp_host: Some("127.0.0.1".to_string()),
        ..etcd.config(TTL, LeaseLossPolicy::Reregister)
    };
    let rt = DistributedRuntime::new(config).await.unwrap();
    assert_eq!(rt.discovery_health(), DiscoveryHealth::Healthy);
    etcd.kill();
    wait_until("degraded", Duration::from_secs(5), || !rt.discovery_health().is_healthy()).await;
    sleep(TTL * 2).await;
    assert!(!rt.cancel_token().is_cancelled() && !rt.is_shutting_down());
    etcd.restart().await;
    wait_until("healthy", Duration::from_secs(15), || rt.discovery_health().is_healthy()).await;
    assert!(!rt.cancel_token().is_cancelled());
    rt.shutdown().await;
}
