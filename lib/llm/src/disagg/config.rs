//! The disaggregation settings and the decision rule.

use std::str::FromStr;
use std::time::Duration;

/// Uncached prompt tokens above which a prefill goes to a prefill worker (default).
pub const DEFAULT_MAX_LOCAL_PREFILL_LENGTH: usize = 1000;
/// Prefill jobs waiting in the queue below which a new one may join it (default).
pub const DEFAULT_MAX_PREFILL_QUEUE_SIZE: usize = 2;
/// Prefill jobs a prefill worker computes at once (default). Small, so that jobs beyond
/// what its engine can batch wait in the queue, where decode workers see them.
pub const DEFAULT_MAX_CONCURRENT_PREFILLS: usize = 2;

/// What a worker does in disaggregated serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DisaggRole {
    /// Prefill and decode locally, as without disaggregation.
    #[default]
    Agg,
    /// Pull prefill jobs and hand their KV cache to decode workers; serves no model.
    Prefill,
    /// Serve the model; send long prefills to prefill workers.
    Decode,
}

impl DisaggRole {
    /// The role's name on the command line.
    pub fn as_str(&self) -> &'static str {
        match self {
            DisaggRole::Agg => "agg",
            DisaggRole::Prefill => "prefill",
            DisaggRole::Decode => "decode",
        }
    }
}

impl FromStr for DisaggRole {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "agg" => Ok(DisaggRole::Agg),
            "prefill" => Ok(DisaggRole::Prefill),
            "decode" => Ok(DisaggRole::Decode),
            _ => Err(format!("unknown disaggregation role '{s}': expected agg, prefill or decode")),
        }
    }
}

/// Settings of a decode or prefill worker.
#[derive(Debug, Clone, PartialEq)]
pub struct DisaggConfig {
    /// This worker's role.
    pub role: DisaggRole,
    /// A prefill goes remote only if its uncached prompt tokens exceed this...
    pub max_local_prefill_length: usize,
    /// ...and fewer than this many jobs wait in the prefill queue.
    pub max_prefill_queue_size: usize,
    /// Bound on a remote prefill, from enqueueing to the KV being received; past it
    /// the decode worker prefills locally.
    pub remote_prefill_timeout: Duration,
    /// Most prefill jobs a prefill worker runs at once (the rest wait in the queue).
    pub max_concurrent_prefills: usize,
}

impl Default for DisaggConfig {
    fn default() -> Self {
        DisaggConfig {
            role: DisaggRole::Agg,
            max_local_prefill_length: DEFAULT_MAX_LOCAL_PREFILL_LENGTH,
            max_prefill_queue_size: DEFAULT_MAX_PREFILL_QUEUE_SIZE,
            remote_prefill_timeout: Duration::from_secs(30),
            max_concurrent_prefills: DEFAULT_MAX_CONCURRENT_PREFILLS,
        }
    }
}

impl DisaggConfig {
    /// The conditional-disaggregation rule: remote iff the prompt's uncached part is
    /// longer than `max_local_prefill_length` and the queue holds fewer than
    /// `max_prefill_queue_size` jobs.
    pub fn prefill_remotely(&self, prompt_tokens: usize, cached_tokens: usize, queue_size: usize) -> bool {
        prompt_tokens.saturating_sub(cached_tokens) > self.max_local_prefill_length
            && queue_size < self.max_prefill_queue_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_uncached_prompts_go_remote_while_the_queue_is_short() {
        let c = DisaggConfig { max_local_prefill_length: 100, max_prefill_queue_size: 2, ..Default::default() };
        assert!(c.prefill_remotely(101, 0, 0));
        assert!(!c.prefill_remotely(100, 0, 0), "at the threshold stays local");
        assert!(!c.prefill_remotely(500, 450, 0), "the cached part does not count");
        assert!(c.prefill_remotely(500, 399, 1));
        assert!(!c.prefill_remotely(500, 0, 2), "a full queue keeps it local");
        let never = DisaggConfig { max_prefill_queue_size: 0, ..c };
        assert!(!never.prefill_remotely(10_000, 0, 0));
    }

    #[test]
    fn roles_parse() {
        assert_eq!("decode".parse::<DisaggRole>(), Ok(DisaggRole::Decode));
        assert_eq!("prefill".parse::<DisaggRole>().map(|r| r.as_str()), Ok("prefill"));
        assert!("both".parse::<DisaggRole>().unwrap_err().contains("agg, prefill or decode"));
    }
}
