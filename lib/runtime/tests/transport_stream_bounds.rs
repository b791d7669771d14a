//! Bounded streams: a handler that never yields, or yields once and stalls, ends the
//! caller's stream with `Timeout` naming the bound, and the worker's context is killed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dynamo_runtime::config::{DiscoveryBackend, RuntimeConfig};
use dynamo_runtime::discovery::MemStore;
use dynamo_runtime::typed::stream_handler;
use dynamo_runtime::{Client, DistributedRuntime, ErrorKind, RequestContext, RouterMode, SendOptions};
use futures::StreamExt;
use tokio::sync::mpsc;

fn config() -> RuntimeConfig {
    RuntimeConfig { discovery: DiscoveryBackend::Mem, shutdown_timeout: Duration::from_secs(2), ..Default::default() }
}

/// Serves `t/stall/generate`: yields `n` items, then stalls forever; reports each kill.
async fn stalling_worker(store: &Arc<MemStore>) -> (DistributedRuntime, mpsc::UnboundedReceiver<String>) {
    let worker = DistributedRuntime::with_mem_store(config(), store.clone()).await.unwrap();
    let (killed_tx, killed_rx) = mpsc::unbounded_channel::<String>();
    let handler = stream_handler(move |n: i64, ctx: RequestContext| {
        let killed_tx = killed_tx.clone();
        let watch = ctx.clone();
        tokio::spawn(async move {
            watch.killed().await;
            let _ = killed_tx.send(watch.id().to_string());
        });
        futures::stream::iter((0..n).map(Ok::<i64, String>)).chain(futures::stream::pending())
    });
    worker.namespace("t").unwrap().component("stall").unwrap().endpoint("generate").unwrap().start(handler).await.unwrap();
    (worker, killed_rx)
}

async fn client(rt: &DistributedRuntime) -> Client {
    let client = rt.namespace("t").unwrap().component("stall").unwrap().endpoint("generate").unwrap().client().await.unwrap();
    client.wait_for_instances(Some(Duration::from_secs(5))).await.unwrap();
    client
}

async fn expect_killed(killed: &mut mpsc::UnboundedReceiver<String>, id: &str) {
    let got = tokio::time::timeout(Duration::from_secs(5), killed.recv()).await.expect("the worker never saw the kill");
    assert_eq!(got.as_deref(), Some(id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_item_and_item_gap_timeouts() {
    let store = Arc::new(MemStore::default());
    let (worker, mut killed) = stalling_worker(&store).await;
    let caller = DistributedRuntime::with_mem_store(config(), store.clone()).await.unwrap();
    let client = client(&caller).await;

    // Never yields: the first-item bound fires, and the worker is told to drop it.
    let options = SendOptions {
        request_id: Some("first".into()),
        first_item_timeout: Some(Duration::from_millis(300)),
        ..Default::default()
    };
    let mut stream = client.send_with(RouterMode::RoundRobin, Bytes::from_static(b"0"), options).await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(err.to_string().contains("first-item timeout"), "{err}");
    assert!(stream.next().await.is_none());
    expect_killed(&mut killed, "first").await;

    // Yields once, then stalls: the gap bound fires after the item.
    let options = SendOptions {
        request_id: Some("gap".into()),
        item_timeout: Some(Duration::from_millis(300)),
        ..Default::default()
    };
    let mut stream = client.send_with(RouterMode::RoundRobin, Bytes::from_static(b"1"), options).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap().unwrap().unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(err.to_string().contains("item timeout"), "{err}");
    expect_killed(&mut killed, "gap").await;

    // A timeout is not a dead instance: it stays routable.
    assert_eq!(client.routable_instance_ids(), vec![worker.instance_id()]);
    caller.shutdown().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounds_come_from_the_configuration_and_zero_disables_them() {
    let store = Arc::new(MemStore::default());
    let (worker, mut killed) = stalling_worker(&store).await;
    let bounded = RuntimeConfig { stream_first_item_timeout: Some(Duration::from_millis(300)), ..config() };
    let caller = DistributedRuntime::with_mem_store(bounded, store.clone()).await.unwrap();
    let client = client(&caller).await;

    let mut stream = client.send(RouterMode::RoundRobin, Bytes::from_static(b"0"), Some("configured".into())).await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    expect_killed(&mut killed, "configured").await;

    // A per-request zero waits on (still waiting well past the configured bound).
    let options = SendOptions { first_item_timeout: Some(Duration::ZERO), ..Default::default() };
    let mut stream = client.send_with(RouterMode::RoundRobin, Bytes::from_static(b"0"), options).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(1000), stream.next()).await.is_err());
    caller.shutdown().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_flowing_faster_than_the_gap_bound_never_time_out() {
    let store = Arc::new(MemStore::default());
    let worker = DistributedRuntime::with_mem_store(config(), store.clone()).await.unwrap();
    // One item every 40 ms, `n` of them, then silence.
    let handler = stream_handler(move |n: i64, _ctx: RequestContext| {
        let items = futures::stream::unfold(0i64, move |i| async move {
            if i >= n {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
            Some((Ok::<i64, String>(i), i + 1))
        });
        items.chain(futures::stream::pending())
    });
    worker.namespace("t").unwrap().component("drip").unwrap().endpoint("generate").unwrap().start(handler).await.unwrap();
    let caller = DistributedRuntime::with_mem_store(config(), store.clone()).await.unwrap();
    let client = caller.namespace("t").unwrap().component("drip").unwrap().endpoint("generate").unwrap().client().await.unwrap();
    client.wait_for_instances(Some(Duration::from_secs(5))).await.unwrap();

    // The stream lasts 1 s, five times the gap bound: only the final silence times out.
    let options = SendOptions { item_timeout: Some(Duration::from_millis(200)), ..Default::default() };
    let mut stream = client.send_with(RouterMode::RoundRobin, Bytes::from_static(b"25"), options).await.unwrap();
    for expected in 0..25 {
        let item = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap().unwrap();
        let item = item.unwrap_or_else(|e| panic!("item {expected} failed: {e}"));
        assert_eq!(item.body.as_ref(), expected.to_string().as_bytes());
    }
    let err = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    caller.shutdown().await;
    worker.shutdown().await;
}
