//! The mocker publishes the KV events and load metrics a KV router reads, on the
//! embedded event plane: a worker runtime runs the engine, a second runtime in the same
//! process (sharing an in-memory discovery store) subscribes to the component's events.

use std::sync::Arc;
use std::time::Duration;

use dynamo_llm::engine::{RequestContext, TokenEngine};
use dynamo_llm::kv_router::protocols::{
    hash_full_blocks, BlockHash, KvCacheEventData, LoadMetricsEvent, RouterEvent, KV_EVENTS_SUBJECT, LOAD_METRICS_SUBJECT,
};
use dynamo_llm::engines::mocker::{MockerArgs, MockerEngine, MockerPublisher};
use dynamo_llm::protocols::common::{FinishReason, PreprocessedRequest, StopConditions};
use dynamo_runtime::config::{DiscoveryBackend, RuntimeConfig};
use dynamo_runtime::discovery::MemStore;
use dynamo_runtime::events::Subscription;
use dynamo_runtime::DistributedRuntime;
use futures::StreamExt;
use serde_json::Value;

const BLOCK: usize = 16;

async fn runtime(store: &Arc<MemStore>) -> DistributedRuntime {
    let config =
        RuntimeConfig { discovery: DiscoveryBackend::Mem, shutdown_timeout: Duration::from_secs(5), ..Default::default() };
    DistributedRuntime::with_mem_store(config, store.clone()).await.unwrap()
}

/// What the subscriber has seen so far.
#[derive(Default)]
struct Seen {
    kv: Vec<RouterEvent>,
    metrics: Vec<Value>,
}

impl Seen {
    /// Read events (bounded) until `done` holds.
    async fn until(&mut self, sub: &mut Subscription, what: &str, done: impl Fn(&Seen) -> bool) {
        let wait = async {
            while !done(self) {
                let event = sub.next_event().await.expect("event plane open");
                if event.subject.ends_with(&format!(".{KV_EVENTS_SUBJECT}")) {
                    self.kv.push(serde_json::from_slice(&event.payload).expect("RouterEvent JSON"));
                } else if event.subject.ends_with(&format!(".{LOAD_METRICS_SUBJECT}")) {
                    self.metrics.push(serde_json::from_slice(&event.payload).expect("metrics JSON"));
                }
            }
        };
        if tokio::time::timeout(Duration::from_secs(15), wait).await.is_err() {
            panic!("timed out waiting for {what}; kv events: {:?}", self.kv);
        }
    }
}

async fn run(engine: &MockerEngine, tokens: Vec<u32>, max_tokens: u32) {
    let request = PreprocessedRequest {
        token_ids: tokens,
        stop_conditions: StopConditions { max_tokens: Some(max_tokens), ..Default::default() },
        ..Default::default()
    };
    let stream = engine.generate(request, RequestContext::new("t")).await.unwrap();
    let items: Vec<_> = tokio::time::timeout(Duration::from_secs(15), stream.collect()).await.expect("stream ended");
    assert_eq!(items.len(), max_tokens as usize);
    assert_eq!(items.last().unwrap().as_ref().unwrap().finish_reason, Some(FinishReason::Length));
}

fn stored(event: &RouterEvent) -> (Option<u64>, Vec<BlockHash>) {
    match &event.event.data {
        KvCacheEventData::Stored(data) => (
            data.parent_hash,
            data.blocks.iter().map(|b| BlockHash { block_hash: b.block_hash, tokens_hash: b.tokens_hash }).collect(),
        ),
        other => panic!("expected stored, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefix_stores_evicts_and_reports_load() {
    let store = Arc::new(MemStore::default());
    let worker = runtime(&store).await;
    let watcher = runtime(&store).await;
    // One subscription for both subjects, so that once metrics arrive, KV events will too.
    let mut sub = watcher.namespace("mock").unwrap().component("worker").unwrap().subscribe(">").await.unwrap();

    let component = worker.namespace("mock").unwrap().component("worker").unwrap();
    let worker_id = worker.instance_id();
    let args = MockerArgs::from_json(&format!(
        r#"{{"block_size": {BLOCK}, "num_gpu_blocks": 10, "watermark": 0, "max_num_seqs": 4, "speedup_ratio": 100}}"#
    ))
    .unwrap();
    let engine = MockerEngine::new(args, Some(MockerPublisher::new(component, worker_id))).unwrap();

    // Metrics are published at once and then every second: the first one shows the
    // subscription is connected.
    let mut seen = Seen::default();
    seen.until(&mut sub, "the first load metrics", |s| !s.metrics.is_empty()).await;
    let first = &seen.metrics[0];
    assert_eq!(first["worker_id"].as_u64(), Some(worker_id));
    assert_eq!(first["kv_total_blocks"], 10);
    assert_eq!(first["request_total_slots"], 4);
    assert!(first["data_parallel_rank"].is_null());
    let keys: Vec<&str> = first.as_object().unwrap().keys().map(String::as_str).collect();
    for key in [
        "request_active_slots",
        "kv_active_blocks",
        "num_requests_waiting",
        "gpu_cache_usage_perc",
        "gpu_prefix_cache_hit_rate",
    ] {
        assert!(keys.contains(&key), "{key} missing from {first}");
    }
    assert!(serde_json::from_value::<LoadMetricsEvent>(first.clone()).is_ok());

    // A: 4 full blocks + 5 tokens. Only the full blocks are stored.
    let prefix: Vec<u32> = (0..4 * BLOCK as u32).collect();
    let a: Vec<u32> = prefix.iter().copied().chain(9000..9005).collect();
    run(&engine, a.clone(), 3).await;
    seen.until(&mut sub, "A's stored event", |s| !s.kv.is_empty()).await;
    let ha = hash_full_blocks(&a, BLOCK);
    assert_eq!(seen.kv[0].worker_id, worker_id);
    assert_eq!(seen.kv[0].event.event_id, 0);
    assert_eq!(stored(&seen.kv[0]), (None, ha.clone()));

    // B: the same 4-block prefix + 2 new full blocks + 3 tokens: only the new blocks
    // are stored, chained to A's last block.
    let b: Vec<u32> = prefix.iter().copied().chain(7000..7000 + 2 * BLOCK as u32 + 3).collect();
    run(&engine, b.clone(), 1).await;
    seen.until(&mut sub, "B's stored event", |s| s.kv.len() >= 2).await;
    let hb = hash_full_blocks(&b, BLOCK);
    assert_eq!(hb[..4], ha[..]);
    assert_eq!(seen.kv[1].event.event_id, 1);
    assert_eq!(stored(&seen.kv[1]), (Some(ha[3].block_hash), hb[4..6].to_vec()));

    // C: 8 unrelated full blocks. The cache (10 blocks, 6 cached) must evict 4, the
    // least recently used first: B's tail before the shared prefix's head.
    let c: Vec<u32> = (20_000..20_000 + 8 * BLOCK as u32).collect();
    run(&engine, c.clone(), 1).await;
    seen.until(&mut sub, "C's removed and stored events", |s| s.kv.len() >= 4).await;
    assert_eq!(seen.kv[2].event.event_id, 2);
    let KvCacheEventData::Removed(removed) = &seen.kv[2].event.data else {
        panic!("expected removed, got {:?}", seen.kv[2])
    };
    let expected: Vec<u64> = [hb[5], hb[4], hb[3], hb[2]].iter().map(|h| h.block_hash).collect();
    assert_eq!(removed.block_hashes, expected);
    assert_eq!(seen.kv[3].event.event_id, 3);
    assert_eq!(stored(&seen.kv[3]), (None, hash_full_blocks(&c, BLOCK)));

    // The raw JSON is exactly the router's format.
    let raw = serde_json::to_value(&seen.kv[1]).unwrap();
    assert_eq!(raw["event"]["data"]["stored"]["parent_hash"].as_u64(), Some(ha[3].block_hash));
    assert_eq!(raw["event"]["data"]["stored"]["blocks"][0]["tokens_hash"].as_u64(), Some(hb[4].tokens_hash));

    // Idle again: metrics report no active blocks and the prefix hits (4 of 18 blocks).
    seen.until(&mut sub, "idle metrics with prefix hits", |s| {
        s.metrics.last().is_some_and(|m| {
            m["kv_active_blocks"] == 0 && m["request_active_slots"] == 0 && m["gpu_prefix_cache_hit_rate"].as_f64() > Some(0.0)
        })
    })
    .await;
    let last = seen.metrics.last().unwrap();
    let hit_rate = last["gpu_prefix_cache_hit_rate"].as_f64().unwrap();
    assert!((hit_rate - 4.0 / 18.0).abs() < 1e-4, "{last}");
    assert_eq!(last["gpu_cache_usage_perc"].as_f64(), Some(0.0));
    assert_eq!(last["num_requests_waiting"], 0);
    let snapshot = engine.metrics();
    assert_eq!(snapshot.kv_total_blocks, 10);
    assert_eq!(snapshot.kv_active_blocks, 0);

    engine.shutdown().await;
    watcher.shutdown().await;
    worker.shutdown().await;
}
