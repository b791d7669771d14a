//! The one way the integration tests of dynamo-runtime and dynamo-llm (which includes this
//! file by path) wait for a state: poll it until it holds,
//! and fail the test, naming what was awaited, once a bound has passed.

#![allow(dead_code)]

use std::time::{Duration, Instant};

/// Between two polls.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Wait until `cond` holds; fail the test naming `what` after `within`.
pub async fn wait_until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting until {what}");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Poll `attempt` until it returns `Some` and return that; fail the test naming `what`
/// after `within`.
pub async fn eventually<T>(what: &str, within: Duration, mut attempt: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = attempt().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting until {what}");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
