//! The NATS request plane: an endpoint is discoverable only once nats-server has its
//! subscription, so the first request to a new worker is taken, not refused with NATS's
//! no-responders status.

use crate::nats_support;
use crate::poll;

use std::sync::Arc;
use std::time::Duration;

use dynamo_runtime::config::RuntimeConfig;
use dynamo_runtime::discovery::MemStore;
use dynamo_runtime::typed::stream_handler;
use dynamo_runtime::{DistributedRuntime, RequestContext};
use nats_support::{count_items, free_port, nats_planes, Nats};

fn config(port: u16) -> RuntimeConfig {
    RuntimeConfig { response_timeout: Duration::from_secs(10), ..nats_planes(port) }
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
        match count_items(&client, b"2").await {
            Ok(n) => assert_eq!(n, 2),
            Err(e) => refused.push(format!("{round}: {e}")),
        }
        worker.shutdown().await;
    }
    assert!(refused.is_empty(), "{} of {ROUNDS} first requests failed: {refused:?}", refused.len());
    caller.shutdown().await;
    drop(nats);
}
