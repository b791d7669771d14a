//! The events of a resumable stream: what a producer writes ([`EventBody`], already
//! serialized) and what a subscriber reads ([`StreamEvent`], the body with its id).

use std::sync::Arc;

use axum::response::sse::Event;

/// One already-serialized SSE event as a producer writes it: an optional event name
/// (`event:` line; Responses events have one, chat chunks none) and its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventBody {
    /// The `event:` name, if any.
    pub name: Option<String>,
    /// The `data:` payload (JSON, or `[DONE]`).
    pub data: String,
}

impl EventBody {
    /// An unnamed event with `data`.
    pub fn data(data: impl Into<String>) -> Self {
        EventBody { name: None, data: data.into() }
    }

    /// An event named `name` with `data`.
    pub fn named(name: impl Into<String>, data: impl Into<String>) -> Self {
        EventBody { name: Some(name.into()), data: data.into() }
    }

    /// Bytes this event takes in a replay buffer (name and data).
    pub fn size(&self) -> usize {
        self.data.len() + self.name.as_ref().map_or(0, String::len)
    }
}

/// An event of a resumable stream: its id (0, 1, 2 … in production order; the SSE
/// `id:`, `Last-Event-ID` on resume, and `sequence_number` for Responses) and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEvent {
    /// The monotone id.
    pub id: u64,
    /// The event, shared with the buffer.
    pub body: Arc<EventBody>,
}

impl StreamEvent {
    /// The SSE event with its `id:` line.
    pub fn to_sse(&self) -> Event {
        let event = Event::default().id(self.id.to_string()).data(&self.body.data);
        match &self.body.name {
            Some(name) => event.event(name),
            None => event,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_counts_name_and_data() {
        assert_eq!(EventBody::data("abc").size(), 3);
        assert_eq!(EventBody::named("x.y", "abc").size(), 6);
    }
}
