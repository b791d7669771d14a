//! Exponential backoff with jitter for the retry loops of the discovery backends.

use std::time::Duration;

/// Delays that double from `initial` up to `max`, each drawn at random from the upper
/// half of the current step, so that processes that lost their store at the same moment
/// do not all come back at the same moment.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// A backoff starting at `initial` and capped at `max`.
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.min(max);
        Backoff { initial, max, current: initial }
    }

    /// The next delay to wait; the step after it is twice as long (up to the cap).
    pub(crate) fn next_delay(&mut self) -> Duration {
        let step = self.current;
        self.current = (self.current * 2).min(self.max);
        step.mul_f64(rand::random_range(0.5..=1.0))
    }

    /// Start again from the initial delay (after a success).
    pub(crate) fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        let steps: Vec<Duration> = (0..5).map(|_| b.next_delay()).collect();
        let caps = [100, 200, 400, 400, 400];
        for (step, cap) in steps.iter().zip(caps) {
            let cap = Duration::from_millis(cap);
            assert!(*step <= cap && *step >= cap / 2, "{step:?} not in [{:?}, {cap:?}]", cap / 2);
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
