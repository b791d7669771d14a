//! The KV index's hot paths: applying `stored` events, `find_matches` on a fleet of 8
//! workers × 10,000 blocks, and hashing a prompt's blocks.
//! Run: `cargo bench -p dynamo-llm --bench kv_index`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use dynamo_llm::kv_router::{
    compute_block_hash_for_seq, KvCacheEvent, KvCacheEventData, KvCacheStoreData, KvCacheStoredBlockData, RadixTree,
};

const BLOCK_SIZE: usize = 16;
const WORKERS: u64 = 8;
const BLOCKS_PER_WORKER: usize = 10_000;
const EVENT_BLOCKS: usize = 16;

/// A prompt of `len` tokens: ids drawn from a small LCG seeded with `seed`.
fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 40) as u32 % 32_000
        })
        .collect()
}

/// `stored` events of 16 blocks each, chaining a worker's sequence from the root.
fn stored_events(hashes: &[u64], first_id: u64) -> Vec<KvCacheEvent> {
    hashes
        .chunks(EVENT_BLOCKS)
        .enumerate()
        .map(|(i, chunk)| {
            let base = first_id + (i * EVENT_BLOCKS) as u64;
            let blocks = chunk
                .iter()
                .enumerate()
                .map(|(j, &tokens_hash)| KvCacheStoredBlockData { block_hash: base + j as u64, tokens_hash })
                .collect();
            let parent_hash = (i > 0).then(|| base - 1);
            KvCacheEvent { event_id: i as u64, data: KvCacheEventData::Stored(KvCacheStoreData { parent_hash, blocks }) }
        })
        .collect()
}

/// 8 workers, each holding ~10,000 blocks: an 8k-token prompt they all share, then
/// sequences of their own.
fn fleet(shared: &[u64]) -> RadixTree {
    let mut tree = RadixTree::new();
    for worker in 0..WORKERS {
        let mut held = 0;
        let mut seq = 0u64;
        while held < BLOCKS_PER_WORKER {
            let hashes = if seq == 0 {
                shared.to_vec()
            } else {
                compute_block_hash_for_seq(&prompt(worker * 1_000_000 + seq, 8192), BLOCK_SIZE)
            };
            for event in stored_events(&hashes, seq << 32) {
                tree.apply_event(worker, &event);
            }
            held += hashes.len();
            seq += 1;
        }
    }
    tree
}

fn bench(c: &mut Criterion) {
    let tokens_8k = prompt(42, 8192);
    let shared = compute_block_hash_for_seq(&tokens_8k, BLOCK_SIZE);

    let mut group = c.benchmark_group("kv_index");
    // 64 sequences of 8k tokens (32 events each), spread over the workers.
    let events: Vec<(u64, KvCacheEvent)> = (0..64u64)
        .flat_map(|s| {
            let hashes = compute_block_hash_for_seq(&prompt(s, 8192), BLOCK_SIZE);
            stored_events(&hashes, s << 32).into_iter().map(move |e| (s % WORKERS, e))
        })
        .collect();
    group.throughput(Throughput::Elements(events.len() as u64));
    group.bench_function("apply_stored_events_16_blocks", |b| {
        b.iter_batched(
            RadixTree::new,
            |mut tree| {
                for (worker, event) in &events {
                    tree.apply_event(*worker, event);
                }
                assert_eq!(tree.stats().unknown_parents, 0);
                tree
            },
            BatchSize::LargeInput,
        )
    });

    group.throughput(Throughput::Elements(1));
    let tree = fleet(&shared);
    group.bench_function("find_matches_512_tokens_8x10k", |b| b.iter(|| tree.find_matches(black_box(&shared[..32]))));
    group.bench_function("find_matches_8k_tokens_8x10k", |b| b.iter(|| tree.find_matches(black_box(&shared))));
    group.bench_function("hash_8k_tokens", |b| b.iter(|| compute_block_hash_for_seq(black_box(&tokens_8k), BLOCK_SIZE)));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
