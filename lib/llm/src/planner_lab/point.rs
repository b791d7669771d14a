//! One simulated replica measured at a fixed concurrency ([`closed_loop_point`]): the
//! capacity profile the planner lab's planner uses, taken from the same simulated engine
//! as the lab's fleet, for an aggregated, a prefill or a decode replica.

use rustc_hash::FxHashMap;

use crate::disagg::DisaggRole;
use crate::engines::mocker::{MockerArgs, SimWorker};
use crate::lab_trace::{percentile, synthesize_tokens, LabError, TraceRequest, DEFAULT_TRACE_BLOCK_SIZE};

/// One replica measured at a fixed concurrency.
#[derive(Debug, Clone, PartialEq)]
pub struct PointStats {
    /// TTFT (ms) at the quantile asked, over the measured requests.
    pub ttft_ms: f64,
    /// Mean inter-token latency of a request (ms) at the quantile asked.
    pub itl_ms: f64,
    /// Measured requests completed per simulated second.
    pub throughput_rps: f64,
}

/// Measure one replica of `engine` holding `concurrency` requests of `isl` prompt tokens
/// (unique: no prefix-cache hits) and `osl` output tokens at all times, each finished
/// request replaced at once, until `requests` have finished; the first `concurrency`
/// (the ramp-up) are left out of the figures. `role` says what the replica does, as in a
/// disaggregated lab: [`DisaggRole::Prefill`], one-token requests (`osl` not used; the TTFT is
/// the prefill's, the ITL 0); [`DisaggRole::Decode`], each prompt's full blocks stored as
/// cached when it is added (handed over by a prefill replica); [`DisaggRole::Agg`], both.
pub fn closed_loop_point(
    engine: &MockerArgs,
    isl: usize,
    osl: usize,
    concurrency: usize,
    requests: usize,
    quantile: f64,
    role: DisaggRole,
) -> Result<PointStats, LabError> {
    let osl = if role == DisaggRole::Prefill { 1 } else { osl };
    if isl == 0 || osl == 0 || concurrency == 0 || requests <= concurrency {
        return Err(LabError::Invalid("a point needs isl, osl, concurrency >= 1 and more requests than concurrency".into()));
    }
    if !(quantile > 0.0 && quantile < 1.0) {
        return Err(LabError::Invalid(format!("the quantile must be in (0, 1), got {quantile}")));
    }
    let mut worker = SimWorker::new(engine.clone(), 1.0).map_err(|e| LabError::Invalid(e.to_string()))?;
    // Each request in flight: (arrival, first token, latest token, tokens).
    let mut streams: FxHashMap<u64, (f64, Option<f64>, f64, u32)> = FxHashMap::default();
    let request = TraceRequest { timestamp: 0.0, input_length: isl, output_length: osl, hash_ids: Vec::new() };
    let mut submitted = 0u64;
    let mut submit = |worker: &mut SimWorker, streams: &mut FxHashMap<u64, (f64, Option<f64>, f64, u32)>, t: f64| {
        if submitted >= (requests + concurrency) as u64 {
            return Ok(());
        }
        let tokens = synthesize_tokens(&request, submitted as usize, DEFAULT_TRACE_BLOCK_SIZE);
        if role == DisaggRole::Decode {
            worker.import_kv(&tokens);
        }
        worker.add(submitted, tokens, osl).map_err(LabError::Invalid)?;
        streams.insert(submitted, (t, None, t, 0));
        submitted += 1;
        Ok::<(), LabError>(())
    };
    for _ in 0..concurrency {
        submit(&mut worker, &mut streams, 0.0)?;
    }
    let (mut now, mut finished, mut measured_from) = (0.0f64, 0usize, None::<f64>);
    let (mut ttft, mut itl) = (Vec::new(), Vec::new());
    let mut outputs = Vec::new();
    while finished < requests {
        let Some(ms) = worker.start_step() else {
            return Err(LabError::Invalid(format!("the replica stalled with {} requests", worker.requests())));
        };
        now += ms;
        outputs.clear();
        worker.finish_step(&mut outputs);
        for out in &outputs {
            let Some(s) = streams.get_mut(&out.request) else { continue };
            if out.token {
                s.1.get_or_insert(now);
                s.2 = now;
                s.3 += 1;
            }
            if out.finished {
                let Some((arrival, first, last, tokens)) = streams.remove(&out.request) else { continue };
                finished += 1;
                if finished > concurrency {
                    measured_from.get_or_insert(arrival);
                    if let Some(first) = first {
                        ttft.push(first - arrival);
                        if tokens >= 2 {
                            itl.push((last - first) / f64::from(tokens - 1));
                        }
                    }
                }
                submit(&mut worker, &mut streams, now)?;
            }
        }
    }
    ttft.sort_by(f64::total_cmp);
    itl.sort_by(f64::total_cmp);
    let measured = (requests - concurrency) as f64;
    let span_s = (now - measured_from.unwrap_or(0.0)) / 1000.0;
    Ok(PointStats {
        ttft_ms: percentile(&ttft, quantile),
        itl_ms: if itl.is_empty() { 0.0 } else { percentile(&itl, quantile) },
        throughput_rps: if span_s > 0.0 { measured / span_s } else { 0.0 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_loop_point_grows_latency_with_concurrency() {
        let engine = MockerArgs { block_size: 16, num_gpu_blocks: 8192, ..Default::default() };
        let one = closed_loop_point(&engine, 1000, 50, 1, 20, 0.9, DisaggRole::Agg).unwrap();
        let many = closed_loop_point(&engine, 1000, 50, 16, 100, 0.9, DisaggRole::Agg).unwrap();
        assert!(many.itl_ms > one.itl_ms && many.ttft_ms > one.ttft_ms);
        assert!(many.throughput_rps > one.throughput_rps);
        assert_eq!(closed_loop_point(&engine, 1000, 50, 16, 100, 0.9, DisaggRole::Agg).unwrap(), many);
        assert!(closed_loop_point(&engine, 1000, 50, 4, 4, 0.9, DisaggRole::Agg).is_err());
    }

    #[test]
    fn a_role_point_measures_a_prefill_or_a_decode_replica() {
        let engine = MockerArgs { block_size: 16, num_gpu_blocks: 8192, ..Default::default() };
        let point = |role, c| closed_loop_point(&engine, 2000, 50, c, 8 * c, 0.9, role).unwrap();
        let (agg, prefill, decode) = (point(DisaggRole::Agg, 8), point(DisaggRole::Prefill, 8), point(DisaggRole::Decode, 8));
        // Prefill only: one token each, no decoding steps in the way. Alone, a prompt
        // takes as long as in an aggregated replica.
        assert_eq!(prefill.itl_ms, 0.0);
        assert!(prefill.throughput_rps > agg.throughput_rps, "{prefill:?} vs {agg:?}");
        assert!((point(DisaggRole::Prefill, 1).ttft_ms - point(DisaggRole::Agg, 1).ttft_ms).abs() < 1e-9);
        // Decode only: the prompts arrive cached, so first tokens are quick and no
        // prefill slows the decoding steps.
        assert!(decode.ttft_ms < prefill.ttft_ms / 5.0, "{decode:?} vs {prefill:?}");
        assert!(decode.itl_ms < agg.itl_ms && decode.throughput_rps > agg.throughput_rps, "{decode:?} vs {agg:?}");
    }
}
