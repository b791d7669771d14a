//! End-to-end tests of the request/response planes on the embedded backends, with
//! several runtimes in one process sharing an in-memory discovery store.

use crate::poll;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dynamo_runtime::config::{DiscoveryBackend, RuntimeConfig};
use dynamo_runtime::discovery::MemStore;
use dynamo_runtime::typed::{decode_item, stream_handler};
use dynamo_runtime::{Client, DistributedRuntime, ErrorKind, RequestContext, ResponseStream};
use futures::StreamExt;

fn mem_config() -> RuntimeConfig {
    RuntimeConfig { discovery: DiscoveryBackend::Mem, shutdown_timeout: Duration::from_secs(5), ..Default::default() }
}

async fn runtime(store: &Arc<MemStore>) -> DistributedRuntime {
    DistributedRuntime::with_mem_store(mem_config(), store.clone()).await.unwrap()
}

/// A handler streaming `n` numbers; fails with "x" when asked for -1.
async fn serve_counter(rt: &DistributedRuntime) {
    let handler = stream_handler(|n: i64, ctx: RequestContext| {
        async_stream(n, ctx)
    });
    rt.namespace("t").unwrap().component("counter").unwrap().endpoint("generate").unwrap().start(handler).await.unwrap();
}

/// `rt`'s client of the counter endpoint.
async fn counter_client(rt: &DistributedRuntime) -> Client {
    rt.namespace("t").unwrap().component("counter").unwrap().endpoint("generate").unwrap().client().await.unwrap()
}

/// A worker serving the counter endpoint (with `config`), and a caller with a client that
/// sees its instance: (worker, caller, client).
async fn counter_pair(store: &Arc<MemStore>, config: RuntimeConfig) -> (DistributedRuntime, DistributedRuntime, Client) {
    let worker = DistributedRuntime::with_mem_store(config, store.clone()).await.unwrap();
    serve_counter(&worker).await;
    let caller = runtime(store).await;
    let client = counter_client(&caller).await;
    client.wait_for_instances(Some(Duration::from_secs(5))).await.unwrap();
    (worker, caller, client)
}

fn async_stream(n: i64, ctx: RequestContext) -> impl futures::Stream<Item = Result<i64, String>> + Send {
    futures::stream::unfold(0i64, move |i| {
        let ctx = ctx.clone();
        async move {
            if n < 0 {
                return if i == 0 { Some((Err("x".to_string()), 1)) } else { None };
            }
            if i >= n || ctx.is_stopped() {
                return None;
            }
            if n > 10_000 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Some((Ok(i), i + 1))
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_order_errors_and_direct() {
    let store = Arc::new(MemStore::default());
    let worker = runtime(&store).await;
    serve_counter(&worker).await;
    let caller = runtime(&store).await;
    let client = counter_client(&caller).await;
    let ids = client.wait_for_instances(Some(Duration::from_secs(5))).await.unwrap();
    assert_eq!(ids, vec![worker.instance_id()]);

    let mut stream = client.round_robin(Bytes::from_static(b"1000")).await.unwrap();
    let mut got = Vec::new();
    while let Some(item) = stream.next().await {
        got.push(decode_item::<i64>(&item.unwrap()).unwrap());
    }
    assert_eq!(got, (0..1000).collect::<Vec<_>>());

    let mut failing = client.generate(Bytes::from_static(b"-1")).await.unwrap();
    let err = failing.next().await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Handler);
    assert_eq!(err.message(), "x");
    assert!(failing.next().await.is_none());

    let mut bad = client.generate(Bytes::from_static(b"{not json")).await.unwrap();
    assert_eq!(bad.next().await.unwrap().unwrap_err().kind(), ErrorKind::Serialization);

    let err = client.direct(Bytes::from_static(b"1"), 12345).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InstanceNotFound);
    let mut direct = client.direct(Bytes::from_static(b"3"), worker.instance_id()).await.unwrap();
    let mut n = 0;
    while let Some(item) = direct.next().await {
        item.unwrap();
        n += 1;
    }
    assert_eq!(n, 3);
    caller.shutdown().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_drop_reach_the_worker_and_shutdown_unregisters() {
    let store = Arc::new(MemStore::default());
    let (worker, caller, client) = counter_pair(&store, mem_config()).await;

    // A slow, long stream: stop_generating makes the handler end it early.
    let mut stream = client.generate(Bytes::from_static(b"1000000")).await.unwrap();
    stream.next().await.unwrap().unwrap();
    stream.stop_generating();
    let mut rest = 0;
    while let Some(item) = stream.next().await {
        item.unwrap();
        rest += 1;
    }
    assert!(rest < 1000, "stream kept going after stop: {rest}");

    // Graceful shutdown drains an in-flight stream, then the instance disappears.
    let mut inflight = client.generate(Bytes::from_static(b"50")).await.unwrap();
    // The stream is in flight once its first item arrived.
    inflight.next().await.unwrap().unwrap();
    let shutdown = tokio::spawn({
        let worker = worker.clone();
        async move { worker.shutdown().await }
    });
    let mut count = 1;
    while let Some(item) = inflight.next().await {
        item.unwrap();
        count += 1;
    }
    assert_eq!(count, 50);
    tokio::time::timeout(Duration::from_secs(10), shutdown).await.unwrap().unwrap();
    assert!(client.instance_ids().is_empty());
    let err = client.generate(Bytes::from_static(b"1")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoInstances);
    caller.shutdown().await;
}

/// Receive `n` events within a bound and return their payloads.
async fn receive(sub: &mut dynamo_runtime::events::Subscription, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    while got.len() < n {
        match tokio::time::timeout(Duration::from_secs(5), sub.next_event()).await {
            Ok(Some(ev)) => got.push(String::from_utf8_lossy(&ev.payload).into_owned()),
            _ => break,
        }
    }
    got
}

fn numbered(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{{\"n\":{i}}}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_on_the_embedded_plane() {
    let store = Arc::new(MemStore::default());
    let subscriber = runtime(&store).await;
    let mut sub = subscriber.namespace("ev").unwrap().subscribe("kv_events").await.unwrap();
    // A publisher that starts after the subscription publishes at once: nothing is lost.
    let publisher = runtime(&store).await;
    let ns_pub = publisher.namespace("ev").unwrap();
    for payload in numbered(0..100) {
        ns_pub.publish("kv_events", Bytes::from(payload)).await.unwrap();
    }
    assert_eq!(receive(&mut sub, 100).await, numbered(0..100));
    // A subscription made while the publisher runs gets everything published after it returns.
    let mut late = subscriber.namespace("ev").unwrap().subscribe("kv_events").await.unwrap();
    for payload in numbered(100..200) {
        ns_pub.publish("kv_events", Bytes::from(payload)).await.unwrap();
    }
    assert_eq!(receive(&mut late, 100).await, numbered(100..200));
    assert_eq!(receive(&mut sub, 100).await, numbered(100..200));
    let extra = tokio::time::timeout(Duration::from_millis(300), sub.next_event()).await;
    assert!(extra.is_err(), "unexpected extra event {extra:?}");
    publisher.shutdown().await;
    subscriber.shutdown().await;
}

/// Read `stream` until its error (bounded: 10 s); the error and the items before it. A
/// stream that ends without one fails the test: it would have ended as if whole.
async fn until_error(stream: &mut ResponseStream) -> (dynamo_runtime::Error, usize) {
    let mut items = 0;
    let error = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.next().await {
                Some(Ok(_)) => items += 1,
                Some(Err(e)) => return e,
                None => panic!("the stream ended as if whole, without an error"),
            }
        }
    })
    .await
    .expect("the stream was ended in time");
    (error, items)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_deadline_ends_the_streams_still_in_flight_as_unavailable() {
    use dynamo_runtime::ServingState;
    let store = Arc::new(MemStore::default());
    let (worker, caller, client) = counter_pair(&store, mem_config()).await;

    // 20,000 items at 1 ms or more each: far past the deadline.
    let mut stream = client.round_robin(Bytes::from_static(b"20000")).await.unwrap();
    stream.next().await.unwrap().unwrap();
    let status = worker.planes().drain(Some(Duration::from_millis(300))).await.unwrap();
    assert_eq!((status.state, status.inflight, status.cut), (ServingState::Draining, 1, 0));
    assert!(status.deadline_in_s.is_some_and(|s| s > 0.0 && s <= 0.3), "{status:?}");
    let (error, items) = until_error(&mut stream).await;
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    assert!(1 + items < 20_000, "cut before its end");
    poll::wait_until("drained", Duration::from_secs(5), || worker.planes().drain_status().state == ServingState::Drained).await;
    let status = worker.planes().drain_status();
    assert_eq!((status.inflight, status.cut, status.deadline_in_s), (0, 1, Some(0.0)));
    // A resume drops the deadline; the worker serves whole streams again.
    assert_eq!(worker.planes().resume().await.unwrap().deadline_in_s, None);
    poll::wait_until("the instance is back in discovery", Duration::from_secs(5), || client.instance_ids().len() == 1).await;
    let mut again = client.round_robin(Bytes::from_static(b"3")).await.unwrap();
    let mut n = 0;
    while let Some(item) = again.next().await {
        item.unwrap();
        n += 1;
    }
    assert_eq!(n, 3);
    worker.shutdown().await;
    caller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_past_its_bound_ends_the_streams_still_in_flight_as_unavailable() {
    let store = Arc::new(MemStore::default());
    let config = RuntimeConfig { shutdown_timeout: Duration::from_millis(300), ..mem_config() };
    let (worker, caller, client) = counter_pair(&store, config).await;

    // 20,000 items at 1 ms or more each: far past the bound.
    let mut stream = client.round_robin(Bytes::from_static(b"20000")).await.unwrap();
    stream.next().await.unwrap().unwrap();
    let stopping = tokio::spawn(async move { worker.shutdown().await });
    let (error, items) = until_error(&mut stream).await;
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    assert!(error.to_string().contains("drain bound"), "{error}");
    assert!(1 + items < 20_000, "cut before its end");
    tokio::time::timeout(Duration::from_secs(10), stopping).await.expect("the shutdown ends").unwrap();
    caller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_takes_the_instance_out_of_routing_and_resume_brings_it_back() {
    use dynamo_runtime::{NotReady, ServingState};
    let store = Arc::new(MemStore::default());
    let (worker, caller, client) = counter_pair(&store, mem_config()).await;
    assert_eq!(worker.planes().drain_status().state, ServingState::Serving);

    // A slow stream (1 ms or more per item past 10,000 items) is in flight when the drain
    // begins, and finishes.
    let mut stream = client.round_robin(Bytes::from_static(b"10500")).await.unwrap();
    stream.next().await.unwrap().unwrap();
    let status = worker.planes().drain(None).await.unwrap();
    assert_eq!(status.state, ServingState::Draining);
    assert_eq!(status.inflight, 1);
    assert_eq!(worker.planes().readiness(), Err(NotReady::Draining));
    assert_eq!(worker.planes().drain(None).await.unwrap().state, ServingState::Draining, "idempotent");
    poll::wait_until("the instance left discovery", Duration::from_secs(5), || client.instance_ids().is_empty()).await;
    let mut items = 1;
    while let Some(item) = stream.next().await {
        item.unwrap();
        items += 1;
    }
    assert_eq!(items, 10500, "the in-flight stream finished whole");
    assert_eq!(worker.planes().drain_status().state, ServingState::Drained);

    assert_eq!(worker.planes().resume().await.unwrap().state, ServingState::Serving);
    assert_eq!(worker.planes().resume().await.unwrap().state, ServingState::Serving, "idempotent");
    assert_eq!(worker.planes().readiness(), Ok(()));
    poll::wait_until("the instance is back in discovery", Duration::from_secs(5), || client.instance_ids().len() == 1).await;
    let mut again = client.round_robin(Bytes::from_static(b"3")).await.unwrap();
    let mut n = 0;
    while let Some(item) = again.next().await {
        item.unwrap();
        n += 1;
    }
    assert_eq!(n, 3);
    worker.shutdown().await;
    caller.shutdown().await;
}
