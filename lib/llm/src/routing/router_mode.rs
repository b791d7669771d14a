//! The one parser of router mode names: `--router-mode` (clap in dynamo-run, the
//! Python frontend through `dynamo._core.ROUTER_MODES`) and the routing lab.

use std::fmt;
use std::str::FromStr;

/// How requests to a discovered model pick an instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RouterMode {
    /// Each instance in turn (the default).
    #[default]
    RoundRobin,
    /// Uniformly at random.
    Random,
    /// KV-cache-aware routing ([`crate::kv_router`]) for `backend` models, whose
    /// requests carry token ids. `chat`/`completions` models (no token ids at the
    /// frontend) fall back to round-robin.
    Kv,
}

impl RouterMode {
    /// Every mode's name, as `--router-mode` takes it.
    pub const NAMES: [&'static str; 3] = ["round-robin", "random", "kv"];

    /// The name `--router-mode` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            RouterMode::RoundRobin => "round-robin",
            RouterMode::Random => "random",
            RouterMode::Kv => "kv",
        }
    }
}

impl fmt::Display for RouterMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A router mode name that is not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown router mode '{0}': expected round-robin, random or kv")]
pub struct UnknownRouterMode(pub String);

impl FromStr for RouterMode {
    type Err = UnknownRouterMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "round-robin" | "round_robin" | "roundrobin" => Ok(RouterMode::RoundRobin),
            "random" => Ok(RouterMode::Random),
            "kv" => Ok(RouterMode::Kv),
            _ => Err(UnknownRouterMode(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names() {
        assert_eq!("round-robin".parse::<RouterMode>().unwrap(), RouterMode::RoundRobin);
        assert_eq!("Random".parse::<RouterMode>().unwrap(), RouterMode::Random);
        assert_eq!("KV".parse::<RouterMode>().unwrap(), RouterMode::Kv);
        assert_eq!(RouterMode::Kv.to_string(), "kv");
        assert!("lru".parse::<RouterMode>().unwrap_err().to_string().contains("kv"));
        for name in RouterMode::NAMES {
            assert_eq!(name.parse::<RouterMode>().unwrap().as_str(), name);
        }
    }
}
