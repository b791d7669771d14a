//! The NATS request plane: an endpoint is discoverable only once nats-server has its
//! subscription, so the first request to a new worker is taken, not refused with NATS's
//! no-responders status.

mod nats_support;
mod poll;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dynamo_runtime::config::{DiscoveryBackend, EventPlane, RequestPlane, RuntimeConfig};
use dynamo_runtime::discovery::MemStore;
use dynamo_runtime::typed::stream_handler;
use dynamo_runtime::{DistributedRuntime, RequestContext};
use futures::StreamExt;
use nats_support::{free_port, Nats};

fn config(port: u16) -> RuntimeConfig {
    RuntimeConfig {
        discovery: DiscoveryBackend::Mem,
        request_plane: RequestPlane::Nats,
        event_plane: EventPlane::Nats,
        nats_server: format!("nats://127.0.0.1:{port}"),
        response_timeout: Duration::from_secs(10),
        shutdown_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

/// Each round starts a worker runtime (a fresh instance each round: a refusal takes an
/// instance out of the caller's routing), serves an endpoint on it, and sends it one
/// request at once from the caller (another NATS connection), which found it in discovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_request_to_a_new_endpoint_is_taken() {
    const ROUNDS: usize = 50;
    let port = free_port();
    let nats = Nats::start(port);
    nats.wait_ready().await;
    let store = Arc::new(MemStore::default());
    let caller = DistributedRuntime::with_mem_store(config(port), store.clone()).await.unwrap();
    let mut refused = Vec::new();
    for round in 0..ROUNDS {
        let name = format!("generate{round}");
        let worker = DistributedRuntime::with_mem_store(config(port), store.clone()).await.unwrap();
        let handler = stream_handler(|n: i64, _ctx: RequestContext| futures::stream::iter((0..n).map(Ok::<i64, String>)));
        worker.namespace("t").unwrap().component("w").unwrap().endpoint(name.clone()).unwrap().start(handler).await.unwrap();
        let client = caller.namespace("t").unwrap().component("w").unwrap().endpoint(name).unwrap().client().await.unwrap();
        client.wait_for_instances(Some(Duration::from_secs(5))).await.unwrap();
        let result: dynamo_runtime::Result<usize> = async {
            let mut stream = client.round_robin(Bytes::from_static(b"2")).await?;
            let mut n = 0;
            while let Some(item) = stream.next().await {
                item?;
                n += 1;
            }
            Ok(n)
        }
        .await;
        match result {
            Ok(n) => assert_eq!(n, 2),
            Err(e) => refused.push(format!("{round}: {e}")),
        }
        worker.shutdown().await;
    }
    assert!(refused.is_empty(), "{} of {ROUNDS} first requests failed: {refused:?}", refused.len());
    caller.shutdown().await;
    drop(nats);
}
