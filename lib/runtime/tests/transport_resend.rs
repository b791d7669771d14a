//! A request whose instance dies or stops answering before the first item is resent to
//! another instance; once an item was delivered it never is.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dynamo_runtime::config::{DiscoveryBackend, RuntimeConfig};
use dynamo_runtime::discovery::MemStore;
use dynamo_runtime::typed::{decode_item, stream_handler};
use dynamo_runtime::{DistributedRuntime, EndpointId, ErrorKind, Instance, InstanceTransport, RequestContext};
use futures::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

fn config() -> RuntimeConfig {
    RuntimeConfig {
        discovery: DiscoveryBackend::Mem,
        shutdown_timeout: Duration::from_millis(200),
        tcp_ping_interval: Duration::from_millis(200),
        tcp_peer_timeout: Duration::from_millis(800),
        ..Default::default()
    }
}

/// Serves `t/r/generate`. `stall`: report the request, then never yield (after
/// `items_first` items); otherwise answer `[instance id]`.
async fn worker(store: &Arc<MemStore>, stall: Option<(usize, mpsc::UnboundedSender<()>)>) -> DistributedRuntime {
    let rt = DistributedRuntime::with_mem_store(config(), store.clone()).await.unwrap();
    let me = rt.instance_id();
    let handler = stream_handler(move |_req: serde_json::Value, _ctx: RequestContext| {
        let items: Vec<Result<u64, String>> = match &stall {
            Some((n, _)) => vec![Ok(me); *n],
            None => vec![Ok(me)],
        };
        let stalls = stall.as_ref().map(|(_, got)| {
            let _ = got.send(());
        });
        let tail = match stalls {
            Some(()) => futures::stream::pending().left_stream(),
            None => futures::stream::empty().right_stream(),
        };
        futures::stream::iter(items).chain(tail)
    });
    rt.namespace("t").unwrap().component("r").unwrap().endpoint("generate").unwrap().start(handler).await.unwrap();
    rt
}

async fn caller(store: &Arc<MemStore>, expect: usize) -> (DistributedRuntime, dynamo_runtime::Client) {
    let rt = DistributedRuntime::with_mem_store(config(), store.clone()).await.unwrap();
    let client = rt.namespace("t").unwrap().component("r").unwrap().endpoint("generate").unwrap().client().await.unwrap();
    for _ in 0..100 {
        if client.instance_ids().len() == expect {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(client.instance_ids().len(), expect);
    (rt, client)
}

async fn two_workers(store: &Arc<MemStore>, items_before_stall: usize) -> (DistributedRuntime, DistributedRuntime, mpsc::UnboundedReceiver<()>) {
    let (got_tx, got_rx) = mpsc::unbounded_channel();
    let stalling = worker(store, Some((items_before_stall, got_tx))).await;
    let healthy = worker(store, None).await;
    (stalling, healthy, got_rx)
}

/// A round-robin request that the stalling worker received. A client starts round-robin
/// at a random instance, so one request may go to the healthy worker first (it is
/// drained); the next one goes to the other instance.
async fn to_stalling(client: &dynamo_runtime::Client, got: &mut mpsc::UnboundedReceiver<()>) -> dynamo_runtime::ResponseStream {
    for _ in 0..2 {
        let mut stream = client.round_robin(Bytes::from_static(b"{}")).await.unwrap();
        if tokio::time::timeout(Duration::from_secs(2), got.recv()).await.is_ok() {
            return stream;
        }
        while tokio::time::timeout(Duration::from_secs(5), stream.next()).await.expect("the healthy worker stalled").is_some() {}
    }
    panic!("round-robin never reached the stalling worker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_before_the_first_item_gets_the_request_resent() {
    let store = Arc::new(MemStore::default());
    let (stalling, healthy, mut got) = two_workers(&store, 0).await;
    let (rt, client) = caller(&store, 2).await;

    let mut stream = to_stalling(&client, &mut got).await;
    // The worker goes away with the request accepted but not started; its connection drops.
    stalling.shutdown().await;
    let item = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.expect("no resend").unwrap().unwrap();
    assert_eq!(decode_item::<u64>(&item).unwrap(), healthy.instance_id());
    assert!(stream.next().await.is_none());
    rt.shutdown().await;
    healthy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_not_resent_once_an_item_arrived() {
    let store = Arc::new(MemStore::default());
    let (stalling, healthy, mut got) = two_workers(&store, 1).await;
    let (rt, client) = caller(&store, 2).await;

    let mut stream = to_stalling(&client, &mut got).await;
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(decode_item::<u64>(&first).unwrap(), stalling.instance_id());
    // The worker goes away mid-stream: its shutdown ends the stalled stream at its drain
    // bound. An item arrived, so the error is the caller's, not a resend's.
    stalling.shutdown().await;
    let err = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("drain bound"), "{err}");
    let after = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.expect("the stream ends after its error");
    assert!(after.is_none(), "an item after the error: the request was resent");
    rt.shutdown().await;
    healthy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_a_partitioned_worker_is_resent_after_the_ping_timeout() {
    let store = Arc::new(MemStore::default());
    let healthy = worker(&store, None).await;
    // A "partitioned" instance: it accepts the connection and reads, but nothing ever
    // comes back.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let frozen = tokio::spawn(async move {
        let mut sockets = Vec::new();
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = socket.read(&mut buf).await;
            sockets.push(socket);
        }
    });
    let instance = Instance {
        namespace: "t".into(),
        component: "r".into(),
        endpoint: "generate".into(),
        instance_id: 1,
        transport: InstanceTransport::Tcp(address),
    };
    let id = EndpointId { namespace: "t".into(), component: "r".into(), name: "generate".into() };
    healthy.discovery().put(&format!("{}1", id.instances_prefix()), serde_json::to_vec(&instance).unwrap().into()).await.unwrap();
    let (rt, client) = caller(&store, 2).await;

    // Two round-robin requests: one of them goes to the partitioned instance first.
    for _ in 0..2 {
        let mut stream = client.round_robin(Bytes::from_static(b"{}")).await.unwrap();
        let item = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.expect("no resend").unwrap().unwrap();
        assert_eq!(decode_item::<u64>(&item).unwrap(), healthy.instance_id());
    }
    // Every following request goes straight to the healthy instance.
    assert_eq!(client.routable_instance_ids(), vec![healthy.instance_id()]);
    for _ in 0..4 {
        let mut s = tokio::time::timeout(Duration::from_secs(2), client.round_robin(Bytes::from_static(b"{}"))).await.unwrap().unwrap();
        let item = tokio::time::timeout(Duration::from_secs(2), s.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(decode_item::<u64>(&item).unwrap(), healthy.instance_id());
    }
    frozen.abort();
    rt.shutdown().await;
    healthy.shutdown().await;
}
