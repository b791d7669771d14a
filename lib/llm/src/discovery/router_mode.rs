//! How a frontend picks the worker instance of a discovered model.

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
}

impl RouterMode {
    /// The runtime client's mode.
    pub fn to_runtime(self) -> dynamo_runtime::RouterMode {
        match self {
            RouterMode::RoundRobin => dynamo_runtime::RouterMode::RoundRobin,
            RouterMode::Random => dynamo_runtime::RouterMode::Random,
        }
    }

    /// The name `--router-mode` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            RouterMode::RoundRobin => "round-robin",
            RouterMode::Random => "random",
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
#[error("unknown router mode '{0}': expected round-robin or random")]
pub struct UnknownRouterMode(pub String);

impl FromStr for RouterMode {
    type Err = UnknownRouterMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "round-robin" | "round_robin" | "roundrobin" => Ok(RouterMode::RoundRobin),
            "random" => Ok(RouterMode::Random),
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
        assert!("kv".parse::<RouterMode>().unwrap_err().to_string().contains("round-robin"));
        assert_eq!(RouterMode::Random.to_runtime(), dynamo_runtime::RouterMode::Random);
    }
}
