//! The event plane on NATS: a subscription, once `subscribe` returned, receives every
//! event published after it, including a new publisher's very first ones, and a new
//! subscription's first event from a publisher on another connection.

use crate::nats_support;
use crate::poll;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dynamo_runtime::config::{DiscoveryBackend, EventPlane, RuntimeConfig};
use dynamo_runtime::discovery::MemStore;
use dynamo_runtime::DistributedRuntime;
use nats_support::{free_port, Nats};

fn config(port: u16) -> RuntimeConfig {
    RuntimeConfig {
        discovery: DiscoveryBackend::Mem,
        event_plane: EventPlane::Nats,
        nats_server: format!("nats://127.0.0.1:{port}"),
        shutdown_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_publisher_loses_no_event_on_nats() {
    let port = free_port();
    let nats = Nats::start(port);
    nats.wait_ready().await;
    let store = Arc::new(MemStore::default());
    let subscriber = DistributedRuntime::with_mem_store(config(port), store.clone()).await.unwrap();
    let mut sub = subscriber.namespace("ev").unwrap().subscribe("kv_events").await.unwrap();
    let publisher = DistributedRuntime::with_mem_store(config(port), store.clone()).await.unwrap();
    let ns_pub = publisher.namespace("ev").unwrap();
    let sent: Vec<String> = (0..100).map(|i| format!("{{\"n\":{i}}}")).collect();
    for payload in &sent {
        ns_pub.publish("kv_events", Bytes::from(payload.clone())).await.unwrap();
    }
    let mut got = Vec::new();
    while got.len() < sent.len() {
        match tokio::time::timeout(Duration::from_secs(5), sub.next_event()).await {
            Ok(Some(ev)) => got.push(String::from_utf8_lossy(&ev.payload).into_owned()),
            _ => break,
        }
    }
    assert_eq!(got, sent);
    publisher.shutdown().await;
    subscriber.shutdown().await;
    drop(nats);
}

/// A subscription made while another runtime (another NATS connection) publishes gets the
/// first event published after `subscribe` returned. Before `subscribe` waited for a round
/// trip to the server, the server could route that event before it had read the SUB, and
/// the event was lost (in 36 of 200 rounds on a 2-core machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_subscription_gets_the_next_event_from_another_connection() {
    const ROUNDS: usize = 50;
    let port = free_port();
    let nats = Nats::start(port);
    nats.wait_ready().await;
    let store = Arc::new(MemStore::default());
    let publisher = DistributedRuntime::with_mem_store(config(port), store.clone()).await.unwrap();
    let subscriber = DistributedRuntime::with_mem_store(config(port), store.clone()).await.unwrap();
    let ns_pub = publisher.namespace("ev").unwrap();
    let ns_sub = subscriber.namespace("ev").unwrap();
    let mut lost = Vec::new();
    for round in 0..ROUNDS {
        let event = format!("load_{round}");
        let mut sub = ns_sub.subscribe(&event).await.unwrap();
        ns_pub.publish(&event, Bytes::from_static(b"first")).await.unwrap();
        match tokio::time::timeout(Duration::from_secs(2), sub.next_event()).await {
            Ok(Some(ev)) => assert_eq!(&ev.payload[..], b"first"),
            _ => lost.push(round),
        }
    }
    assert!(lost.is_empty(), "the first event was lost in {} of {ROUNDS} rounds: {lost:?}", lost.len());
    publisher.shutdown().await;
    subscriber.shutdown().await;
    drop(nats);
}
