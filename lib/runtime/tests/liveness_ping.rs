//! Application-level liveness: a peer that accepts and reads but never answers (what a
//! SIGSTOPped or partitioned worker looks like: the kernel, or nobody, ACKs) is declared
//! dead within the peer timeout plus one ping interval, taken out of routing, and
//! routed to again once something at its address answers pings.

use crate::poll;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dynamo_runtime::config::{DiscoveryBackend, RuntimeConfig};
use dynamo_runtime::discovery::MemStore;
use dynamo_runtime::typed::stream_handler;
use dynamo_runtime::{DistributedRuntime, EndpointId, ErrorKind, Instance, InstanceTransport, RequestContext};
use futures::StreamExt;
use poll::wait_until;
use tokio::io::AsyncReadExt;
use tokio::task::JoinSet;

const PING_INTERVAL: Duration = Duration::from_millis(200);
const PEER_TIMEOUT: Duration = Duration::from_millis(800);

fn config(port: u16) -> RuntimeConfig {
    RuntimeConfig {
        discovery: DiscoveryBackend::Mem,
        tcp_port: port,
        tcp_ping_interval: PING_INTERVAL,
        tcp_peer_timeout: PEER_TIMEOUT,
        shutdown_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

/// A listener that accepts connections and reads everything, never writing a byte.
async fn frozen_peer() -> (u16, JoinSet<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut tasks = JoinSet::new();
    tasks.spawn(async move {
        let mut readers = JoinSet::new();
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            readers.spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    (port, tasks)
}

async fn register_at(rt: &DistributedRuntime, id: u64, address: &str) {
    let endpoint = EndpointId { namespace: "t".into(), component: "frozen".into(), name: "generate".into() };
    let instance = Instance {
        namespace: "t".into(),
        component: "frozen".into(),
        endpoint: "generate".into(),
        instance_id: id,
        transport: InstanceTransport::Tcp(address.to_string()),
    };
    let key = format!("{}{id:x}", endpoint.instances_prefix());
    rt.discovery().put(&key, serde_json::to_vec(&instance).unwrap().into()).await.unwrap();
}


#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peer_is_declared_dead_taken_out_and_brought_back_when_it_answers() {
    let store = Arc::new(MemStore::default());
    let (port, mut frozen) = frozen_peer().await;
    let address = format!("127.0.0.1:{port}");
    let caller = DistributedRuntime::with_mem_store(config(0), store.clone()).await.unwrap();
    let fake_id = 0xf00d;
    register_at(&caller, fake_id, &address).await;
    let client = caller.namespace("t").unwrap().component("frozen").unwrap().endpoint("generate").unwrap().client().await.unwrap();
    client.wait_for_instances(Some(Duration::from_secs(5))).await.unwrap();

    // The connection opens and the request is written; no answer ever comes.
    let mut stream = client.round_robin(Bytes::from_static(b"3")).await.unwrap();
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.expect("the caller waited forever").unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Disconnected, "{err}");
    assert!(err.to_string().contains("no answer from"), "{err}");
    eprintln!("declared dead after {:?} (bound {:?})", started.elapsed(), PEER_TIMEOUT + PING_INTERVAL);

    // Out of routing for every client of the process; new requests fail fast.
    assert!(client.routable_instance_ids().is_empty());
    assert_eq!(client.instance_ids(), vec![fake_id], "discovery still lists it");
    let err = client.round_robin(Bytes::from_static(b"3")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoInstances, "{err}");
    // It stays out while it keeps not answering (the probe keeps failing).
    tokio::time::sleep(PEER_TIMEOUT * 3).await;
    assert!(client.routable_instance_ids().is_empty());

    // Something that answers pings takes the address over: the probe brings it back.
    frozen.shutdown().await;
    let mut worker = None;
    for _ in 0..100 {
        match DistributedRuntime::with_mem_store(config(port), store.clone()).await {
            Ok(rt) => {
                worker = Some(rt);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let worker = worker.expect("could not take over the frozen peer's port");
    wait_until("the instance is routable again", Duration::from_secs(10), || client.routable_instance_ids() == vec![fake_id]).await;

    // And requests to it work (the worker now serves the endpoint at that address).
    let handler = stream_handler(|n: i64, _ctx: RequestContext| futures::stream::iter((0..n).map(Ok::<i64, String>)));
    worker.namespace("t").unwrap().component("frozen").unwrap().endpoint("generate").unwrap().start(handler).await.unwrap();
    let mut stream = client.direct(Bytes::from_static(b"3"), fake_id).await.unwrap();
    let mut items = 0;
    while let Some(item) = stream.next().await {
        item.unwrap();
        items += 1;
    }
    assert_eq!(items, 3);
    caller.shutdown().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_to_a_live_peer_stays_up() {
    let store = Arc::new(MemStore::default());
    let worker = DistributedRuntime::with_mem_store(config(0), store.clone()).await.unwrap();
    let handler = stream_handler(|n: i64, _ctx: RequestContext| futures::stream::iter((0..n).map(Ok::<i64, String>)));
    worker.namespace("t").unwrap().component("frozen").unwrap().endpoint("generate").unwrap().start(handler).await.unwrap();
    let caller = DistributedRuntime::with_mem_store(config(0), store.clone()).await.unwrap();
    let client = caller.namespace("t").unwrap().component("frozen").unwrap().endpoint("generate").unwrap().client().await.unwrap();
    client.wait_for_instances(Some(Duration::from_secs(5))).await.unwrap();
    assert_eq!(client.round_robin(Bytes::from_static(b"2")).await.unwrap().count().await, 2);
    // Quiet for several peer timeouts: pings keep it alive on both sides.
    tokio::time::sleep(PEER_TIMEOUT * 4).await;
    assert_eq!(client.routable_instance_ids(), vec![worker.instance_id()]);
    assert_eq!(client.round_robin(Bytes::from_static(b"2")).await.unwrap().count().await, 2);
    caller.shutdown().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stops_serving_a_caller_that_went_silent() {
    use dynamo_runtime::transport::frame::{Frame, FrameKind};
    use tokio::io::AsyncWriteExt;

    let store = Arc::new(MemStore::default());
    let worker = DistributedRuntime::with_mem_store(config(0), store.clone()).await.unwrap();
    let (killed_tx, mut killed_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let handler = stream_handler(move |_req: serde_json::Value, ctx: RequestContext| {
        let killed_tx = killed_tx.clone();
        let watch = ctx.clone();
        tokio::spawn(async move {
            watch.killed().await;
            let _ = killed_tx.send(watch.id().to_string());
        });
        futures::stream::unfold(0u64, |i| async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Some((Ok::<u64, String>(i), i + 1))
        })
    });
    worker.namespace("t").unwrap().component("frozen").unwrap().endpoint("generate").unwrap().start(handler).await.unwrap();

    // A caller that sends its request and then goes silent (partitioned, SIGSTOPped):
    // it neither answers pings nor reads.
    let mut socket = tokio::net::TcpStream::connect(worker.tcp_address()).await.unwrap();
    let hello = Frame::with_header(FrameKind::Hello, 0, Bytes::from_static(br#"{"version":3,"instance_id":7}"#), Bytes::new());
    let request = Frame::with_header(
        FrameKind::Request,
        1,
        Bytes::from_static(br#"{"endpoint":"t/frozen/generate","id":"silent-caller"}"#),
        Bytes::from_static(b"{}"),
    );
    socket.write_all(&hello.to_bytes()).await.unwrap();
    socket.write_all(&request.to_bytes()).await.unwrap();

    let killed = tokio::time::timeout(Duration::from_secs(10), killed_rx.recv()).await.expect("the worker kept serving a silent caller");
    assert_eq!(killed.as_deref(), Some("silent-caller"));
    drop(socket);
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_is_not_mistaken_for_a_dead_peer() {
    let store = Arc::new(MemStore::default());
    let worker = DistributedRuntime::with_mem_store(config(0), store.clone()).await.unwrap();
    let handler = stream_handler(|n: i64, _ctx: RequestContext| futures::stream::iter((0..n).map(Ok::<i64, String>)));
    worker.namespace("t").unwrap().component("frozen").unwrap().endpoint("generate").unwrap().start(handler).await.unwrap();
    let caller = DistributedRuntime::with_mem_store(config(0), store.clone()).await.unwrap();
    let client = caller.namespace("t").unwrap().component("frozen").unwrap().endpoint("generate").unwrap().client().await.unwrap();
    client.wait_for_instances(Some(Duration::from_secs(5))).await.unwrap();

    // Far more items than a stream buffers: the caller's connection reader blocks on this
    // consumer, reading nothing from the socket, for several peer timeouts.
    let mut stream = client.round_robin(Bytes::from_static(b"20000")).await.unwrap();
    stream.next().await.unwrap().unwrap();
    tokio::time::sleep(PEER_TIMEOUT * 4).await;
    let mut rest = 0;
    while let Some(item) = stream.next().await {
        item.unwrap();
        rest += 1;
    }
    assert_eq!(rest, 19_999);
    assert_eq!(client.routable_instance_ids(), vec![worker.instance_id()]);
    caller.shutdown().await;
    worker.shutdown().await;
}
