//! Transport micro-benchmarks: the frame codec, and the request planes between two
//! runtimes in one process (mem discovery), with no Python involved: TCP always, NATS
//! when `BENCH_NATS_SERVER` names a running nats-server.
//!
//! ```text
//! CARGO_TARGET_DIR=$HOME/.cache/dynamo-target cargo bench -p dynamo-runtime --bench transport
//! # one group only:  ... --bench transport -- tcp_plane
//! # also the NATS request plane, against a running nats-server:
//! BENCH_NATS_SERVER=nats://127.0.0.1:4222 cargo bench -p dynamo-runtime --bench transport -- nats_plane
//! ```
//!
//! Sample sizes and times are kept small: about a minute after the build, two with NATS.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use dynamo_runtime::config::{DiscoveryBackend, RequestPlane, RuntimeConfig};
use dynamo_runtime::discovery::MemStore;
use dynamo_runtime::transport::frame::{Frame, FrameKind};
use dynamo_runtime::typed::stream_handler;
use dynamo_runtime::{Client, DistributedRuntime, RequestContext};
use futures::StreamExt;

const REQUEST_HEADER: &[u8] = br#"{"endpoint":"bench/worker/generate","id":"0b5d8a0e-3a43-4c55-9a53-5f0d9c1f2a77"}"#;
const SMALL_BODY: &[u8] = br#"{"token_ids":[101,2023,2003,1037,3231],"max_tokens":16}"#;

fn frames() -> [(&'static str, Frame); 2] {
    [
        (
            "small",
            Frame::with_header(FrameKind::Request, 42, Bytes::from_static(REQUEST_HEADER), Bytes::from_static(SMALL_BODY)),
        ),
        ("4KiB", Frame::new(FrameKind::Item, 42, Bytes::from(vec![b'x'; 4096]))),
    ]
}

fn codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");
    g.sample_size(50).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for (name, frame) in frames() {
        g.throughput(Throughput::Bytes(frame.encoded_len() as u64));
        // Encode into a reused buffer, as the connection writer does.
        g.bench_function(format!("encode/{name}"), |b| {
            let mut buf = BytesMut::with_capacity(64 * 1024);
            b.iter(|| {
                buf.clear();
                std::hint::black_box(&frame).encode(&mut buf);
                std::hint::black_box(buf.len());
            })
        });
        // Decode the part after the length prefix, as the connection reader does.
        let encoded = frame.to_bytes();
        g.bench_function(format!("decode/{name}"), |b| {
            b.iter(|| Frame::decode(std::hint::black_box(encoded.slice(4..))).unwrap())
        });
        // Decode a prefixed frame (NATS messages), starting from a fresh copy each time.
        g.bench_function(format!("decode_prefixed_copy/{name}"), |b| {
            b.iter_batched(
                || Bytes::copy_from_slice(&encoded),
                |bytes| Frame::decode_prefixed(bytes).unwrap(),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

/// A worker and a caller runtime sharing one in-memory discovery store.
struct Pair {
    worker: DistributedRuntime,
    caller: DistributedRuntime,
    client: Client,
}

/// Yields `n` integers.
fn counter(n: u64, _ctx: RequestContext) -> impl futures::Stream<Item = Result<u64, String>> + Send {
    futures::stream::iter((0..n).map(Ok))
}

/// `nats`: the NATS server URL for the NATS request plane; `None`: the TCP plane.
async fn pair(nats: Option<&str>) -> Pair {
    let store = Arc::new(MemStore::default());
    let config = || {
        let mut c = RuntimeConfig { discovery: DiscoveryBackend::Mem, shutdown_timeout: Duration::from_secs(5), ..Default::default() };
        if let Some(url) = nats {
            c.request_plane = RequestPlane::Nats;
            c.nats_server = url.to_string();
        }
        c
    };
    let worker = DistributedRuntime::with_mem_store(config(), store.clone()).await.unwrap();
    worker
        .namespace("bench")
        .unwrap()
        .component("worker")
        .unwrap()
        .endpoint("generate")
        .unwrap()
        .start(stream_handler(counter))
        .await
        .unwrap();
    let caller = DistributedRuntime::with_mem_store(config(), store).await.unwrap();
    let client = caller.namespace("bench").unwrap().component("worker").unwrap().endpoint("generate").unwrap().client().await.unwrap();
    client.wait_for_instances(Some(Duration::from_secs(5))).await.unwrap();
    Pair { worker, caller, client }
}

/// Send `n` and read the whole stream; the number of items.
async fn call(client: &Client, n: u64) -> usize {
    let mut stream = client.generate(Bytes::from(n.to_string())).await.unwrap();
    let mut got = 0;
    while let Some(item) = stream.next().await {
        item.unwrap();
        got += 1;
    }
    assert_eq!(got as u64, n);
    got
}

fn tcp_plane(c: &mut Criterion) {
    plane(c, "tcp_plane", None);
}

fn nats_plane(c: &mut Criterion) {
    match std::env::var("BENCH_NATS_SERVER") {
        Ok(url) if !url.is_empty() => plane(c, "nats_plane", Some(&url)),
        _ => eprintln!("nats_plane: skipped (set BENCH_NATS_SERVER=nats://host:port to run it)"),
    }
}

fn plane(c: &mut Criterion, group: &str, nats: Option<&str>) {
    // Two worker threads: the machine this is tuned for has two cores.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let p = rt.block_on(pair(nats));
    // Open the pooled connection before measuring.
    rt.block_on(call(&p.client, 10));

    let mut g = c.benchmark_group(group);
    g.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));

    g.throughput(Throughput::Elements(1));
    g.bench_function("round_trip_1_item", |b| b.to_async(&rt).iter(|| call(&p.client, 1)));

    g.throughput(Throughput::Elements(64));
    g.bench_function("64_concurrent_1_item", |b| {
        b.to_async(&rt).iter(|| async {
            let calls = (0..64).map(|_| call(&p.client, 1));
            futures::future::join_all(calls).await
        })
    });

    g.throughput(Throughput::Elements(1000));
    g.bench_function("stream_1000_items", |b| b.to_async(&rt).iter(|| call(&p.client, 1000)));

    if let Some(url) = nats {
        // For comparison: a bare async-nats request/reply through the same server, which
        // every request on the NATS plane pays for (request out, acknowledgement back).
        let (requester, _responder) = rt.block_on(async {
            let responder = async_nats::connect(url).await.unwrap();
            let mut sub = responder.subscribe("bench.raw").await.unwrap();
            let r = responder.clone();
            tokio::spawn(async move {
                while let Some(msg) = sub.next().await {
                    if let Some(reply) = msg.reply {
                        let _ = r.publish(reply, Bytes::from_static(b"{\"ok\":true}")).await;
                    }
                }
            });
            responder.flush().await.unwrap();
            (async_nats::connect(url).await.unwrap(), responder)
        });
        g.throughput(Throughput::Elements(1));
        g.bench_function("bare_nats_request_reply", |b| {
            b.to_async(&rt).iter(|| async { requester.request("bench.raw", Bytes::from_static(b"1")).await.unwrap() })
        });
    }
    g.finish();

    rt.block_on(async {
        p.caller.shutdown().await;
        p.worker.shutdown().await;
    });
}

criterion_group!(benches, codec, tcp_plane, nats_plane);
criterion_main!(benches);
