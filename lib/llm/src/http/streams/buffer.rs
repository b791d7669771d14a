//! One stream's replay buffer: the latest events, bounded in bytes, with the id of the
//! next one, and whether the stream has ended. Readers ask for the events after an id.

use std::collections::VecDeque;
use std::sync::Arc;

use super::error::StreamError;
use super::event::{EventBody, StreamEvent};

/// How a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The producer wrote its last event.
    Completed,
    /// Cancelled: explicitly, by shutdown, or after the grace period without subscribers.
    Cancelled,
}

/// What a reader gets for "the events after id `after`".
#[derive(Debug)]
pub(crate) enum Read {
    /// Events to deliver, oldest first (never empty).
    Events(Vec<StreamEvent>),
    /// Nothing new yet; wait for a change.
    Pending,
    /// Nothing more will come.
    Ended,
}

/// The bounded buffer of one stream.
#[derive(Debug)]
pub(crate) struct ReplayBuffer {
    request_id: String,
    limit: usize,
    events: VecDeque<StreamEvent>,
    bytes: usize,
    next_id: u64,
    outcome: Option<Outcome>,
}

impl ReplayBuffer {
    /// An empty buffer keeping at most `limit` bytes of events.
    pub(crate) fn new(request_id: String, limit: usize) -> Self {
        ReplayBuffer { request_id, limit, events: VecDeque::new(), bytes: 0, next_id: 0, outcome: None }
    }

    /// Append `body` with the next id; drop the oldest events while over the bound
    /// (the newest is always kept, even alone over it).
    pub(crate) fn push(&mut self, body: EventBody) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.bytes += body.size();
        self.events.push_back(StreamEvent { id, body: Arc::new(body) });
        while self.bytes > self.limit && self.events.len() > 1 {
            if let Some(old) = self.events.pop_front() {
                self.bytes -= old.body.size();
            }
        }
        id
    }

    /// Mark the stream ended (the first outcome wins).
    pub(crate) fn finish(&mut self, outcome: Outcome) {
        self.outcome.get_or_insert(outcome);
    }

    /// How it ended, if it has.
    pub(crate) fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// Bytes of events held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The events after `after` (`None`: from the first), up to `max` of them.
    pub(crate) fn read_after(&self, after: Option<u64>, max: usize) -> Result<Read, StreamError> {
        let wanted = after.map_or(0, |a| a.saturating_add(1));
        if wanted > self.next_id {
            return Err(StreamError::BeyondEnd {
                request_id: self.request_id.clone(),
                after: wanted - 1,
                last: self.next_id.checked_sub(1),
            });
        }
        if wanted == self.next_id {
            return Ok(match self.outcome {
                Some(_) => Read::Ended,
                None => Read::Pending,
            });
        }
        let first = self.events.front().map_or(self.next_id, |e| e.id);
        if wanted < first {
            return Err(StreamError::Gone { request_id: self.request_id.clone(), after, first_available: first });
        }
        let skip = usize::try_from(wanted - first).unwrap_or(usize::MAX);
        Ok(Read::Events(self.events.iter().skip(skip).take(max.max(1)).cloned().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(read: Result<Read, StreamError>) -> Vec<u64> {
        match read {
            Ok(Read::Events(events)) => events.iter().map(|e| e.id).collect(),
            other => panic!("expected events, got {other:?}"),
        }
    }

    #[test]
    fn reads_after_an_id_then_waits_then_ends() {
        let mut buffer = ReplayBuffer::new("r".into(), 1024);
        for i in 0..3 {
            assert_eq!(buffer.push(EventBody::data(format!("e{i}"))), i);
        }
        assert_eq!(ids(buffer.read_after(None, 10)), vec![0, 1, 2]);
        assert_eq!(ids(buffer.read_after(Some(0), 10)), vec![1, 2]);
        assert_eq!(ids(buffer.read_after(Some(0), 1)), vec![1]);
        assert!(matches!(buffer.read_after(Some(2), 10), Ok(Read::Pending)));
        buffer.finish(Outcome::Completed);
        buffer.finish(Outcome::Cancelled);
        assert!(matches!(buffer.read_after(Some(2), 10), Ok(Read::Ended)));
        let err = buffer.read_after(Some(3), 10).unwrap_err();
        assert!(matches!(err, StreamError::BeyondEnd { after: 3, last: Some(2), .. }), "{err:?}");
    }

    #[test]
    fn drops_the_oldest_over_the_bound_and_says_gone() {
        let mut buffer = ReplayBuffer::new("r".into(), 10);
        for _ in 0..5 {
            buffer.push(EventBody::data("abcd"));
        }
        assert_eq!(buffer.bytes(), 8);
        assert_eq!(ids(buffer.read_after(Some(2), 10)), vec![3, 4]);
        let err = buffer.read_after(Some(1), 10).unwrap_err();
        assert_eq!(err, StreamError::Gone { request_id: "r".into(), after: Some(1), first_available: 3 });
        assert!(matches!(buffer.read_after(None, 10), Err(StreamError::Gone { first_available: 3, .. })));

        // One event larger than the bound is still kept, alone.
        buffer.push(EventBody::data("x".repeat(50)));
        assert_eq!(buffer.bytes(), 50);
        assert_eq!(ids(buffer.read_after(Some(4), 10)), vec![5]);
    }
}
