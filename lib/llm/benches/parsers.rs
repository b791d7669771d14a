//! The streaming output parsers' cost per token: one response whose tool call carries
//! 100 or 32,000 tokens of arguments (a reasoning block of as many tokens for the
//! reasoning parsers), fed one token-sized delta at a time. Linear parsers cost the
//! same per token at both sizes. Run: `cargo bench -p dynamo-llm --bench parsers`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dynamo_llm::parsers::{reasoning_parser, tool_call_parser};

const SIZES: [usize; 2] = [100, 32_000];

/// The deltas of a response: `open`, `tokens` word-sized pieces, `close`.
fn deltas(open: &str, tokens: usize, close: &str) -> Vec<String> {
    let mut out = vec![open.to_string()];
    out.extend((0..tokens).map(|i| if i % 8 == 7 { " \\\"q\\\"".to_string() } else { format!(" w{}", i % 100) }));
    out.push(close.to_string());
    out
}

fn tool_calls(c: &mut Criterion) {
    let formats = [
        ("hermes", "<tool_call>{\"name\": \"f\", \"arguments\": {\"text\": \"", "\"}}</tool_call>"),
        ("llama3_json", "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"text\": \"", "\"}}"),
        ("mistral", "[TOOL_CALLS]f[ARGS]{\"text\": \"", "\"}"),
        ("pythonic", "[f(text=\"", "\")]"),
        (
            "deepseek_v3",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"text\": \"",
            "\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
    ];
    let mut group = c.benchmark_group("tool_call_parser");
    for (name, open, close) in formats {
        for tokens in SIZES {
            let stream = deltas(open, tokens, close);
            group.throughput(Throughput::Elements(tokens as u64));
            group.bench_with_input(BenchmarkId::new(name, tokens), &stream, |b, stream| {
                b.iter(|| {
                    let mut parser = tool_call_parser(name, None).unwrap();
                    let mut calls = 0;
                    for d in stream {
                        calls += parser.push(black_box(d)).calls.len();
                    }
                    calls += parser.finish().calls.len();
                    assert_eq!(calls, 1);
                })
            });
        }
    }
    group.finish();
}

fn reasoning(c: &mut Criterion) {
    let mut group = c.benchmark_group("reasoning_parser");
    for name in ["deepseek_r1", "qwen3"] {
        for tokens in SIZES {
            let stream = deltas("<think>", tokens, "</think>The answer.");
            group.throughput(Throughput::Elements(tokens as u64));
            group.bench_with_input(BenchmarkId::new(name, tokens), &stream, |b, stream| {
                b.iter(|| {
                    let mut parser = reasoning_parser(name, true).unwrap();
                    let mut content = 0;
                    for d in stream {
                        content += parser.push(black_box(d)).content.len();
                    }
                    black_box(content)
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, tool_calls, reasoning);
criterion_main!(benches);
