//! `--router-mode kv` end to end: two token workers serve one `backend` model on one
//! endpoint; a frontend's `ModelWatcher` in kv mode builds the remote token engine, and
//! each worker answers with its tag, so the test sees which one served. All runtimes
//! share an in-memory discovery store; requests travel over the TCP request plane.

use crate::common;
use crate::poll;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use dynamo_llm::discovery::{register_model, ModelKind, ModelRegistration};
use dynamo_llm::engine::EngineFactory;
use dynamo_llm::frontend::ModelWatcher;
use dynamo_llm::remote::{serve_token_engine, RemoteTokenEngine};
use dynamo_llm::routing::RouterMode;
use dynamo_llm::engine::{EngineError, OpenAIEngine, RequestContext, TokenEngine, TokenStream};
use dynamo_llm::engines::EchoFull;
use dynamo_llm::kv_router::{KvRouter, KvRouterConfig};
use dynamo_llm::model_manager::ModelManager;
use dynamo_llm::protocols::common::{FinishReason, LLMEngineOutput, PreprocessedRequest};
use dynamo_runtime::config::{DiscoveryBackend, RuntimeConfig};
use dynamo_runtime::discovery::MemStore;
use dynamo_runtime::{Client, DistributedRuntime};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

const BLOCK: u32 = 4;

async fn runtime(store: &Arc<MemStore>) -> DistributedRuntime {
    let config =
        RuntimeConfig { discovery: DiscoveryBackend::Mem, shutdown_timeout: Duration::from_secs(1), ..Default::default() };
    DistributedRuntime::with_mem_store(config, store.clone()).await.unwrap()
}

/// Answers every request with the single token `tag`.
struct TagEngine {
    tag: u32,
}

#[async_trait]
impl TokenEngine for TagEngine {
    async fn generate(&self, _request: PreprocessedRequest, _ctx: RequestContext) -> Result<TokenStream, EngineError> {
        let item = LLMEngineOutput { token_ids: vec![self.tag], finish_reason: Some(FinishReason::Eos), ..Default::default() };
        Ok(futures::stream::iter([Ok(item)]).boxed())
    }
}

/// A worker tagged `tag` serving the backend model `kv-model` (block size 4).
async fn worker(store: &Arc<MemStore>, tag: u32) -> DistributedRuntime {
    let rt = runtime(store).await;
    let endpoint = rt.namespace("ns").unwrap().component("backend").unwrap().endpoint("generate").unwrap();
    serve_token_engine(&endpoint, Arc::new(TagEngine { tag })).await.unwrap();
    let mut registration = ModelRegistration::new("kv-model", ModelKind::Backend);
    registration.kv_cache_block_size = Some(BLOCK);
    register_model(&endpoint, registration, Some(serde_json::json!({}))).await.unwrap();
    rt
}

async fn client(rt: &DistributedRuntime, instances: usize) -> Client {
    let client = rt.namespace("ns").unwrap().component("backend").unwrap().endpoint("generate").unwrap().client().await.unwrap();
    wait_for_count(&client, instances).await;
    client
}

async fn wait_for_count(client: &Client, instances: usize) {
    poll::wait_until(&format!("{instances} instances"), WAIT, || client.instance_ids().len() == instances).await;
}

/// A prompt of `blocks` full blocks starting at token `first`, plus a partial block.
fn prompt(first: u32, blocks: u32, suffix: u32) -> Vec<u32> {
    (first..first + blocks * BLOCK).chain([suffix]).collect()
}

/// The tag of the worker that answers `tokens`, reading the whole stream.
async fn served_by(engine: &dyn TokenEngine, tokens: Vec<u32>) -> u32 {
    let stream = open(engine, tokens).await;
    tag_of(stream).await
}

async fn open(engine: &dyn TokenEngine, tokens: Vec<u32>) -> TokenStream {
    let request = PreprocessedRequest { token_ids: tokens, ..Default::default() };
    bounded("the request", engine.generate(request, RequestContext::new("kv"))).await.unwrap()
}

async fn tag_of(stream: TokenStream) -> u32 {
    let items: Vec<_> = bounded("the answer", stream.collect::<Vec<_>>()).await;
    items.iter().flat_map(|i| i.as_ref().unwrap().token_ids.clone()).next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_in_kv_mode_keeps_each_prefix_on_one_worker() {
    let store = Arc::new(MemStore::default());
    let workers = [worker(&store, 1).await, worker(&store, 2).await];
    let frontend = runtime(&store).await;
    let _seen = client(&frontend, 2).await;

    // The watcher builds the model's token engine; keep it to call directly.
    let built: Arc<Mutex<Option<Arc<dyn TokenEngine>>>> = Arc::default();
    let keep = built.clone();
    let factory: EngineFactory = Arc::new(move |_card, tokens: Arc<dyn TokenEngine>| {
        *keep.lock().unwrap() = Some(tokens);
        Ok(Arc::new(EchoFull::new(Duration::ZERO)) as Arc<dyn OpenAIEngine>)
    });
    let watcher = ModelWatcher::new(frontend.clone(), Arc::new(ModelManager::new()), RouterMode::Kv, factory)
        .start(CancellationToken::new())
        .await
        .unwrap();
    let engine = poll::eventually("the model's engine is built", WAIT, async || built.lock().unwrap().clone()).await;

    // Prefix A goes where its first request went, whatever the suffix.
    let a_worker = served_by(engine.as_ref(), prompt(0, 16, 0)).await;
    for suffix in 1..6 {
        assert_eq!(served_by(engine.as_ref(), prompt(0, 16, suffix)).await, a_worker, "prefix A, suffix {suffix}");
    }
    // While an A request is in flight, a new prefix B goes to the idle worker ...
    let held = open(engine.as_ref(), prompt(0, 16, 99)).await;
    let b_worker = served_by(engine.as_ref(), prompt(5000, 16, 0)).await;
    assert_ne!(b_worker, a_worker);
    assert_eq!(tag_of(held).await, a_worker);
    // ... and each prefix then stays on its worker.
    for suffix in 1..4 {
        assert_eq!(served_by(engine.as_ref(), prompt(5000, 16, suffix)).await, b_worker, "prefix B, suffix {suffix}");
        assert_eq!(served_by(engine.as_ref(), prompt(0, 16, suffix)).await, a_worker, "prefix A, suffix {suffix}");
    }

    watcher.stop().await;
    frontend.shutdown().await;
    for w in workers {
        w.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_counts_end_with_the_stream_and_gone_workers_are_forgotten() {
    let store = Arc::new(MemStore::default());
    let first = worker(&store, 1).await;
    let second = worker(&store, 2).await;
    let caller = runtime(&store).await;
    let client = client(&caller, 2).await;
    let router = KvRouter::new(KvRouterConfig::with_block_size(Some(BLOCK)));
    let engine = RemoteTokenEngine::with_kv_router(client.clone(), router.clone());
    let ids = client.instance_ids();
    let total = || ids.iter().map(|id| router.inflight(*id)).sum::<usize>();

    let a = prompt(0, 8, 0);
    let stream = open(&engine, a.clone()).await;
    assert_eq!(total(), 1);
    let a_worker = tag_of(stream).await;
    assert_eq!(total(), 0, "released at the end of the stream");
    let dropped = open(&engine, a.clone()).await;
    assert_eq!(total(), 1);
    drop(dropped);
    assert_eq!(total(), 0, "released when the stream is dropped");

    // The worker holding prefix A leaves: A is served by the other and predicted there.
    let (gone, stays) = if a_worker == 1 { (first, second) } else { (second, first) };
    let gone_id = gone.instance_id();
    gone.shutdown().await;
    wait_for_count(&client, 1).await;
    assert_ne!(served_by(&engine, a.clone()).await, a_worker);
    assert_eq!(router.predicted_overlap(gone_id, &a), 0);
    assert_eq!(router.predicted_overlap(client.instance_ids()[0], &a), 8);

    caller.shutdown().await;
    stays.shutdown().await;
}

/// A router replica in its own process-like runtime: a kv-routed token engine over the
/// workers, following the other replicas (approximate mode: decisions are all it knows).
async fn replica(store: &Arc<MemStore>) -> (DistributedRuntime, Arc<KvRouter>, RemoteTokenEngine) {
    let rt = runtime(store).await;
    let client = client(&rt, 2).await;
    let config = KvRouterConfig { use_kv_events: false, ..KvRouterConfig::with_block_size(Some(BLOCK)) };
    let router = KvRouter::new(config);
    router.follow_component(&rt.namespace("ns").unwrap().component("backend").unwrap()).await.unwrap();
    let engine = RemoteTokenEngine::with_kv_router(client, router.clone());
    (rt, router, engine)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_replicas_share_decisions_and_a_new_one_starts_from_a_snapshot() {
    let store = Arc::new(MemStore::default());
    let workers = [worker(&store, 1).await, worker(&store, 2).await];
    let ids: Vec<u64> = workers.iter().map(|w| w.instance_id()).collect();
    let tag_id = |tag: u32| ids[tag as usize - 1];
    let (rt_a, a, engine_a) = replica(&store).await;
    let (rt_b, b, engine_b) = replica(&store).await;
    poll::wait_until("replica B restores A's (empty) snapshot", WAIT, || b.snapshot_restored().is_some()).await;

    // A routes prefix P; B learns it from A's decision, not from any event.
    let p = prompt(0, 8, 0);
    let p_worker = tag_id(served_by(&engine_a, p.clone()).await);
    let load = |r: &KvRouter, w: u64| r.load().lock().decode_blocks(w, std::time::Instant::now());
    poll::wait_until("B predicts P where A sent it", WAIT, || b.predicted_overlap(p_worker, &p) == 8).await;
    poll::wait_until("B sees A's request end", WAIT, || load(&b, p_worker) == 0.0).await;
    assert_eq!(tag_id(served_by(&engine_b, prompt(0, 8, 1)).await), p_worker);

    // A's request in flight counts in B's view of the load, until it ends.
    let held = open(&engine_a, prompt(9000, 8, 0)).await;
    let busy = *ids.iter().find(|w| a.inflight(**w) == 1).expect("A has one request in flight");
    poll::wait_until("B counts A's request in flight", WAIT, || load(&b, busy) >= 9.0).await;
    // B's next new prefix goes to the other worker.
    let other = *ids.iter().find(|w| **w != busy).unwrap();
    assert_eq!(tag_id(served_by(&engine_b, prompt(5000, 8, 0)).await), other);
    drop(held);
    poll::wait_until("B stops counting it when it ends", WAIT, || load(&b, busy) == 0.0).await;

    // A replica started now restores the predictions the others made.
    let (rt_c, c, _engine_c) = replica(&store).await;
    let (from, blocks) = poll::eventually("C restores a peer's snapshot", WAIT, async || c.snapshot_restored()).await;
    assert!([a.replica_id(), b.replica_id()].contains(&from));
    assert!(blocks >= 8 + 8 + 8, "P, Q and the new prefix: {blocks} blocks");
    assert_eq!(c.predicted_overlap(p_worker, &p), 8);
    assert_eq!(c.predicted_overlap(other, &prompt(5000, 8, 0)), 8);

    for rt in [rt_a, rt_b, rt_c] {
        rt.shutdown().await;
    }
    for w in workers {
        w.shutdown().await;
    }
}
