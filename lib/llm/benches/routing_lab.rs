//! The routing lab's replay loop: a conversation trace (sessions whose turns extend their
//! prompt, every session starting with one shared system block) through 4 simulated
//! mocker engines with a cache small enough to evict, per policy. What it measures is the
//! simulated engines' block bookkeeping and the router's index work per request.
//! Run: `cargo bench -p dynamo-llm --bench routing_lab`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use dynamo_llm::engines::mocker::MockerArgs;
use dynamo_llm::routing_lab::{self as lab, LabConfig, Policy, TraceRequest};

/// Tokens per trace block (the Mooncake traces').
const TRACE_BLOCK: usize = 512;

/// `sessions` conversations of `turns` turns, a turn every `gap_ms` across the fleet;
/// each turn adds two 512-token blocks to its session's prompt.
fn conversations(sessions: u64, turns: u64, gap_ms: f64) -> Vec<TraceRequest> {
    let mut next_id = 1;
    let mut prompts: Vec<Vec<u64>> = vec![vec![0]; sessions as usize];
    let mut trace = Vec::new();
    for turn in 0..turns {
        for (s, prompt) in prompts.iter_mut().enumerate() {
            prompt.extend([next_id, next_id + 1]);
            next_id += 2;
            trace.push(TraceRequest {
                timestamp: (turn * sessions + s as u64) as f64 * gap_ms,
                input_length: prompt.len() * TRACE_BLOCK - 100,
                output_length: 64,
                hash_ids: prompt.clone(),
            });
        }
    }
    trace
}

fn bench(c: &mut Criterion) {
    // 768 requests of 1.5k to 12k tokens; 4 workers of 8,192 blocks (128 Ki tokens) hold
    // about a third of the live conversations, so blocks are evicted throughout.
    let trace = conversations(96, 8, 40.0);
    let config = LabConfig {
        workers: 4,
        trace_block_size: TRACE_BLOCK,
        engine: MockerArgs { num_gpu_blocks: 8192, ..MockerArgs::default() },
        ..LabConfig::default()
    };
    let mut group = c.benchmark_group("routing_lab");
    group.sample_size(10);
    group.throughput(Throughput::Elements(trace.len() as u64));
    for policy in [Policy::Kv, Policy::Approx, Policy::RoundRobin] {
        group.bench_function(format!("replay_768_requests_{}", policy.as_str()), |b| {
            b.iter(|| {
                let report = lab::run(&trace, policy, &config).expect("the replay runs");
                assert_eq!(report.completed, trace.len());
                report
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
