//! A NATS outage: with nats-server killed -9, requests over the NATS plane fail at once
//! with `Unavailable` (not after DYN_RESPONSE_TIMEOUT), `/health` says why; once the
//! server is back on the same port, requests and event subscriptions work again without
//! restarting the runtimes.

use crate::nats_support;
use crate::poll;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dynamo_runtime::config::RuntimeConfig;
use dynamo_runtime::discovery::MemStore;
use dynamo_runtime::typed::stream_handler;
use dynamo_runtime::{Client, DistributedRuntime, ErrorKind, RequestContext};
use futures::StreamExt;
use nats_support::{count_items, free_port, nats_planes, Nats};
use poll::eventually;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn config(port: u16) -> RuntimeConfig {
    RuntimeConfig {
        // Far above the bound the test waits: a request that waited for it would fail the test.
        response_timeout: Duration::from_secs(60),
        system_enabled: true,
        system_host: "127.0.0.1".into(),
        system_port: 0,
        ..nats_planes(port)
    }
}

async fn health_status(rt: &DistributedRuntime) -> (u16, String) {
    let addr = rt.system_address().unwrap();
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket.write_all(b"GET /health HTTP/1.0\r\nHost: x\r\n\r\n").await.unwrap();
    let mut response = String::new();
    socket.read_to_string(&mut response).await.unwrap();
    let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, response)
}

async fn request(client: &Client) -> dynamo_runtime::Result<usize> {
    count_items(client, b"3").await
}


#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_outage_fails_fast_and_recovers_without_restarts() {
    let port = free_port();
    let mut nats = Nats::start(port);
    nats.wait_ready().await;
    let store = Arc::new(MemStore::default());
    let worker = DistributedRuntime::with_mem_store(config(port), store.clone()).await.unwrap();
    let handler = stream_handler(|n: i64, _ctx: RequestContext| futures::stream::iter((0..n).map(Ok::<i64, String>)));
    worker.namespace("t").unwrap().component("n").unwrap().endpoint("generate").unwrap().start(handler).await.unwrap();
    let caller = DistributedRuntime::with_mem_store(config(port), store.clone()).await.unwrap();
    let client = caller.namespace("t").unwrap().component("n").unwrap().endpoint("generate").unwrap().client().await.unwrap();
    client.wait_for_instances(Some(Duration::from_secs(5))).await.unwrap();
    assert_eq!(request(&client).await.unwrap(), 3);
    let mut events = caller.events().subscribe("t.load").await.unwrap();
    // `subscribe` returns once the server has the subscription (tests/events_nats.rs):
    // the retry only bounds the wait.
    let payload = eventually("the subscription receives events", Duration::from_secs(10), async || {
        worker.events().publish("t.load", Bytes::from_static(b"before")).await.ok()?;
        let event = tokio::time::timeout(Duration::from_millis(500), events.next_event()).await.ok()??;
        Some(event.payload)
    })
    .await;
    assert_eq!(&payload[..], b"before");
    assert_eq!(health_status(&worker).await.0, 200);

    nats.kill();
    eventually("the caller sees NATS down", Duration::from_secs(10), async || { caller.planes_health().err() }).await;
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(5), request(&client)).await.expect("the request waited on the dead NATS").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("disconnected"), "{err}");
    eprintln!("failed after {:?}: {err}", started.elapsed());
    let (status, body) = eventually("the worker's /health says NATS is down", Duration::from_secs(10), async || {
        let (status, body) = health_status(&worker).await;
        (status == 503).then_some((status, body))
    })
    .await;
    assert_eq!(status, 503);
    assert!(body.contains("NATS at nats://127.0.0.1"), "{body}");

    // Same port, same runtimes.
    let nats = Nats::start(port);
    nats.wait_ready().await;
    let n = eventually("requests work again", Duration::from_secs(20), async || { request(&client).await.ok() }).await;
    assert_eq!(n, 3);
    assert!(caller.planes_health().is_ok());
    assert_eq!(health_status(&worker).await.0, 200);
    // The subscription made before the outage receives again.
    let payload = eventually("the old subscription receives events again", Duration::from_secs(20), async || {
        worker.events().publish("t.load", Bytes::from_static(b"after")).await.ok()?;
        let event = tokio::time::timeout(Duration::from_millis(500), events.next_event()).await.ok()??;
        Some(event.payload)
    })
    .await;
    assert_eq!(&payload[..], b"after");
    caller.shutdown().await;
    worker.shutdown().await;
    drop(nats);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_no_worker_took_fails_when_nats_goes_down() {
    use dynamo_runtime::{EndpointId, Instance, InstanceTransport};

    let port = free_port();
    let mut nats = Nats::start(port);
    nats.wait_ready().await;
    let store = Arc::new(MemStore::default());
    let caller = DistributedRuntime::with_mem_store(config(port), store.clone()).await.unwrap();
    // An instance whose subject has a listener that takes messages and never answers, so
    // the request is neither refused nor taken.
    let subject = "dynamo.t.mute.generate.1";
    let _mute = caller.nats().unwrap().subscribe(subject).await.unwrap();
    caller.nats().unwrap().flush().await.unwrap();
    let instance = Instance {
        namespace: "t".into(),
        component: "mute".into(),
        endpoint: "generate".into(),
        instance_id: 1,
        transport: InstanceTransport::Nats(subject.into()),
    };
    let id = EndpointId { namespace: "t".into(), component: "mute".into(), name: "generate".into() };
    caller.discovery().put(&format!("{}1", id.instances_prefix()), serde_json::to_vec(&instance).unwrap().into()).await.unwrap();
    let client = caller.namespace("t").unwrap().component("mute").unwrap().endpoint("generate").unwrap().client().await.unwrap();
    client.wait_for_instances(Some(Duration::from_secs(5))).await.unwrap();

    let mut stream = client.round_robin(Bytes::from_static(b"1")).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(300), stream.next()).await.is_err(), "nobody answers yet");
    nats.kill();
    let err = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the request waited for DYN_RESPONSE_TIMEOUT")
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    caller.shutdown().await;
}
