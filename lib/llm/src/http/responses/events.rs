//! The streamed events of a response and [`ResponseBuilder`], the state machine that
//! turns text deltas into them while keeping the Response object they describe up to
//! date (the same builder folds a non-streamed response, so both agree).

use serde::{Deserialize, Serialize};

use super::protocol::{
    ContentPart, IncompleteDetails, ItemStatus, OutputItem, ResponseError, ResponseObject, ResponseUsage, Status,
};
use crate::protocols::unix_now;

/// One SSE event: its kind and fields, and its place in the response's sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StreamEvent {
    #[serde(flatten)]
    pub kind: EventKind,
    pub sequence_number: u64,
}

impl StreamEvent {
    /// The event's `type`, also sent as the SSE `event:` name.
    pub(crate) fn name(&self) -> &'static str {
        match &self.kind {
            EventKind::Created { .. } => "response.created",
            EventKind::Queued { .. } => "response.queued",
            EventKind::InProgress { .. } => "response.in_progress",
            EventKind::Completed { .. } => "response.completed",
            EventKind::Incomplete { .. } => "response.incomplete",
            EventKind::Failed { .. } => "response.failed",
            EventKind::ItemAdded { .. } => "response.output_item.added",
            EventKind::ItemDone { .. } => "response.output_item.done",
            EventKind::PartAdded { .. } => "response.content_part.added",
            EventKind::PartDone { .. } => "response.content_part.done",
            EventKind::TextDelta { .. } => "response.output_text.delta",
            EventKind::TextDone { .. } => "response.output_text.done",
            EventKind::ReasoningDelta { .. } => "response.reasoning_text.delta",
            EventKind::ReasoningDone { .. } => "response.reasoning_text.done",
            EventKind::ArgumentsDelta { .. } => "response.function_call_arguments.delta",
            EventKind::ArgumentsDone { .. } => "response.function_call_arguments.done",
            EventKind::Error { .. } => "error",
        }
    }
}

/// The kinds of event, tagged by `type` as the official API names them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub(crate) enum EventKind {
    #[serde(rename = "response.created")]
    Created { response: Box<ResponseObject> },
    #[serde(rename = "response.queued")]
    Queued { response: Box<ResponseObject> },
    #[serde(rename = "response.in_progress")]
    InProgress { response: Box<ResponseObject> },
    #[serde(rename = "response.completed")]
    Completed { response: Box<ResponseObject> },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: Box<ResponseObject> },
    #[serde(rename = "response.failed")]
    Failed { response: Box<ResponseObject> },
    #[serde(rename = "response.output_item.added")]
    ItemAdded { output_index: usize, item: OutputItem },
    #[serde(rename = "response.output_item.done")]
    ItemDone { output_index: usize, item: OutputItem },
    #[serde(rename = "response.content_part.added")]
    PartAdded { item_id: String, output_index: usize, content_index: usize, part: ContentPart },
    #[serde(rename = "response.content_part.done")]
    PartDone { item_id: String, output_index: usize, content_index: usize, part: ContentPart },
    #[serde(rename = "response.output_text.delta")]
    TextDelta { item_id: String, output_index: usize, content_index: usize, delta: String, logprobs: Vec<serde_json::Value> },
    #[serde(rename = "response.output_text.done")]
    TextDone { item_id: String, output_index: usize, content_index: usize, text: String, logprobs: Vec<serde_json::Value> },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningDelta { item_id: String, output_index: usize, content_index: usize, delta: String },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningDone { item_id: String, output_index: usize, content_index: usize, text: String },
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta { item_id: String, output_index: usize, delta: String },
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone { item_id: String, output_index: usize, name: String, arguments: String },
    #[serde(rename = "error")]
    Error { code: Option<String>, message: String, param: Option<String> },
}

/// A piece of generated output, by the item it belongs in.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Delta {
    /// Answer text: a `message` item's `output_text`.
    Text(String),
    /// Reasoning text: a `reasoning` item's `reasoning_text`, from the chat delta's
    /// `reasoning_content` (a model registered with a reasoning parser).
    Reasoning(String),
    /// A whole function call, as the chat output stage splits it out (`tool_calls`).
    Call { call_id: String, name: String, arguments: String },
}

/// How generation ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ending {
    /// The model stopped (EOS or a stop string).
    Stopped,
    /// Cut by `max_output_tokens`.
    Length,
    /// The engine failed: `code` (`server_error`, `invalid_prompt`) and message.
    Failed { code: String, message: String },
    /// `POST /v1/responses/{id}/cancel`.
    Cancelled,
}

/// Builds a response from deltas and says, as events, what changed.
#[derive(Debug)]
pub(crate) struct ResponseBuilder {
    response: ResponseObject,
    next_sequence: u64,
    /// Output index of the item receiving deltas, if one is open.
    open: Option<usize>,
}

impl ResponseBuilder {
    /// A builder of `response` (its `output` empty, its status `queued` or `in_progress`).
    pub(crate) fn new(response: ResponseObject) -> Self {
        ResponseBuilder { response, next_sequence: 0, open: None }
    }

    /// The response as it stands.
    pub(crate) fn response(&self) -> &ResponseObject {
        &self.response
    }

    fn event(&mut self, kind: EventKind) -> StreamEvent {
        let event = StreamEvent { kind, sequence_number: self.next_sequence };
        self.next_sequence += 1;
        event
    }

    fn snapshot(&self) -> Box<ResponseObject> {
        Box::new(self.response.clone())
    }

    /// The opening events: `response.created` (and `response.queued` for a background
    /// response), then `response.in_progress`.
    pub(crate) fn start(&mut self) -> Vec<StreamEvent> {
        let mut events = vec![self.event(EventKind::Created { response: self.snapshot() })];
        if self.response.status == Status::Queued {
            events.push(self.event(EventKind::Queued { response: self.snapshot() }));
        }
        self.response.status = Status::InProgress;
        events.push(self.event(EventKind::InProgress { response: self.snapshot() }));
        events
    }

    /// Add `delta`: open its item if another kind (or none) is open, then the delta
    /// event; a call is an item of its own, opened and closed at once.
    pub(crate) fn push(&mut self, delta: Delta) -> Vec<StreamEvent> {
        let (is_text, text) = match delta {
            Delta::Text(t) => (true, t),
            Delta::Reasoning(t) => (false, t),
            Delta::Call { call_id, name, arguments } => return self.call(call_id, name, arguments),
        };
        if text.is_empty() {
            return Vec::new();
        }
        let mut events = Vec::new();
        let open_matches = self.open.is_some_and(|i| matches!(self.response.output[i], OutputItem::Message { .. }) == is_text);
        if !open_matches {
            events.extend(self.close_item(ItemStatus::Completed));
            events.extend(self.open_item(is_text));
        }
        let index = self.open.unwrap_or_default();
        let item = &mut self.response.output[index];
        let item_id = item.id().to_string();
        if let Some(part) = item.content_mut().and_then(|c| c.first_mut()) {
            part.text_mut().push_str(&text);
        }
        let kind = if is_text {
            EventKind::TextDelta { item_id, output_index: index, content_index: 0, delta: text, logprobs: Vec::new() }
        } else {
            EventKind::ReasoningDelta { item_id, output_index: index, content_index: 0, delta: text }
        };
        events.push(self.event(kind));
        events
    }

    fn open_item(&mut self, is_text: bool) -> Vec<StreamEvent> {
        let index = self.response.output.len();
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let (item, part) = if is_text {
            let part = ContentPart::OutputText { text: String::new(), annotations: Vec::new(), logprobs: Vec::new() };
            let item = OutputItem::Message {
                id: format!("msg_{suffix}"),
                role: "assistant".to_string(),
                status: ItemStatus::InProgress,
                content: Vec::new(),
            };
            (item, part)
        } else {
            let part = ContentPart::ReasoningText { text: String::new() };
            let item = OutputItem::Reasoning {
                id: format!("rs_{suffix}"),
                summary: Vec::new(),
                content: Vec::new(),
                status: ItemStatus::InProgress,
            };
            (item, part)
        };
        let item_id = item.id().to_string();
        let added = self.event(EventKind::ItemAdded { output_index: index, item: item.clone() });
        let part_added =
            self.event(EventKind::PartAdded { item_id, output_index: index, content_index: 0, part: part.clone() });
        let mut item = item;
        if let Some(content) = item.content_mut() {
            content.push(part);
        }
        self.response.output.push(item);
        self.open = Some(index);
        vec![added, part_added]
    }

    /// A `function_call` item: added (no arguments yet), its arguments as one delta
    /// (the chat stage gives each call whole), done.
    fn call(&mut self, call_id: String, name: String, arguments: String) -> Vec<StreamEvent> {
        let mut events = self.close_item(ItemStatus::Completed);
        let index = self.response.output.len();
        let item_id = format!("fc_{}", uuid::Uuid::new_v4().simple());
        let mut item = OutputItem::FunctionCall {
            id: item_id.clone(),
            call_id,
            name: name.clone(),
            arguments: String::new(),
            status: ItemStatus::InProgress,
        };
        events.push(self.event(EventKind::ItemAdded { output_index: index, item: item.clone() }));
        events.push(self.event(EventKind::ArgumentsDelta {
            item_id: item_id.clone(),
            output_index: index,
            delta: arguments.clone(),
        }));
        events.push(self.event(EventKind::ArgumentsDone { item_id, output_index: index, name, arguments: arguments.clone() }));
        if let OutputItem::FunctionCall { arguments: a, status, .. } = &mut item {
            *a = arguments;
            *status = ItemStatus::Completed;
        }
        events.push(self.event(EventKind::ItemDone { output_index: index, item: item.clone() }));
        self.response.output.push(item);
        events
    }

    fn close_item(&mut self, status: ItemStatus) -> Vec<StreamEvent> {
        let Some(index) = self.open.take() else { return Vec::new() };
        let item = &mut self.response.output[index];
        item.set_status(status);
        let item = item.clone();
        let item_id = item.id().to_string();
        let part = item.content().first().cloned();
        let mut events = Vec::new();
        if let Some(part) = part {
            let text = part.text().to_string();
            let done = match part {
                ContentPart::OutputText { .. } => EventKind::TextDone {
                    item_id: item_id.clone(),
                    output_index: index,
                    content_index: 0,
                    text,
                    logprobs: Vec::new(),
                },
                ContentPart::ReasoningText { .. } => {
                    EventKind::ReasoningDone { item_id: item_id.clone(), output_index: index, content_index: 0, text }
                }
            };
            events.push(self.event(done));
            events.push(self.event(EventKind::PartDone { item_id, output_index: index, content_index: 0, part }));
        }
        events.push(self.event(EventKind::ItemDone { output_index: index, item }));
        events
    }

    /// Close the open item and end the response as `ending` says, with `usage`.
    pub(crate) fn finish(&mut self, ending: Ending, usage: Option<ResponseUsage>) -> Vec<StreamEvent> {
        let item_status = if ending == Ending::Stopped { ItemStatus::Completed } else { ItemStatus::Incomplete };
        let mut events = self.close_item(item_status);
        self.response.usage = usage;
        let kind = match ending {
            Ending::Stopped => {
                self.response.status = Status::Completed;
                self.response.completed_at = Some(unix_now());
                EventKind::Completed { response: self.snapshot() }
            }
            Ending::Length => {
                self.response.status = Status::Incomplete;
                self.response.incomplete_details = Some(IncompleteDetails { reason: "max_output_tokens".to_string() });
                EventKind::Incomplete { response: self.snapshot() }
            }
            Ending::Failed { code, message } => {
                let error = self.event(EventKind::Error { code: Some(code.clone()), message: message.clone(), param: None });
                events.push(error);
                self.response.status = Status::Failed;
                self.response.error = Some(ResponseError { code, message });
                EventKind::Failed { response: self.snapshot() }
            }
            Ending::Cancelled => {
                // No event: a cancelled response's stream just ends.
                self.response.status = Status::Cancelled;
                return events;
            }
        };
        events.push(self.event(kind));
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::responses::convert::new_response;

    fn names(events: &[StreamEvent]) -> Vec<&'static str> {
        events.iter().map(StreamEvent::name).collect()
    }

    #[test]
    fn text_stream_has_the_official_sequence() {
        let mut b = ResponseBuilder::new(new_response("resp_1", "m", Status::InProgress));
        let mut events = b.start();
        events.extend(b.push(Delta::Text("Hel".into())));
        events.extend(b.push(Delta::Text(String::new())));
        events.extend(b.push(Delta::Text("lo".into())));
        events.extend(b.finish(Ending::Stopped, Some(ResponseUsage::new(3, 2, None))));
        assert_eq!(
            names(&events),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let sequence: Vec<u64> = events.iter().map(|e| e.sequence_number).collect();
        assert_eq!(sequence, (0..10).collect::<Vec<u64>>());
        let r = b.response();
        assert_eq!(r.status, Status::Completed);
        assert_eq!(r.output.len(), 1);
        assert_eq!(r.output[0].content()[0].text(), "Hello");
        assert_eq!(r.usage.as_ref().map(|u| u.total_tokens), Some(5));
        // The JSON carries the type tag and the sequence number side by side.
        let json = serde_json::to_value(&events[4]).unwrap();
        assert_eq!(json["type"], "response.output_text.delta");
        assert_eq!(json["delta"], "Hel");
        assert_eq!(json["sequence_number"], 4);
    }

    #[test]
    fn reasoning_then_text_makes_two_items() {
        let mut b = ResponseBuilder::new(new_response("resp_2", "m", Status::InProgress));
        b.start();
        let first = b.push(Delta::Reasoning("think".into()));
        assert_eq!(names(&first), ["response.output_item.added", "response.content_part.added", "response.reasoning_text.delta"]);
        let second = b.push(Delta::Text("answer".into()));
        assert_eq!(
            names(&second)[..4],
            ["response.reasoning_text.done", "response.content_part.done", "response.output_item.done", "response.output_item.added"]
        );
        let end = b.finish(Ending::Length, None);
        assert_eq!(names(&end).last(), Some(&"response.incomplete"));
        let r = b.response();
        assert!(matches!(r.output[0], OutputItem::Reasoning { .. }));
        assert!(matches!(r.output[1], OutputItem::Message { status: ItemStatus::Incomplete, .. }));
        assert_eq!(r.incomplete_details.as_ref().map(|d| d.reason.as_str()), Some("max_output_tokens"));
    }

    #[test]
    fn failure_sends_error_then_failed() {
        let mut b = ResponseBuilder::new(new_response("resp_3", "m", Status::Queued));
        assert_eq!(names(&b.start()), ["response.created", "response.queued", "response.in_progress"]);
        let end = b.finish(Ending::Failed { code: "server_error".into(), message: "boom".into() }, None);
        assert_eq!(names(&end), ["error", "response.failed"]);
        assert_eq!(b.response().error.as_ref().map(|e| e.message.as_str()), Some("boom"));
    }

    #[test]
    fn a_call_is_an_item_of_its_own_between_texts() {
        let mut b = ResponseBuilder::new(new_response("resp_4", "m", Status::InProgress));
        b.start();
        b.push(Delta::Text("Let me check.".into()));
        let call = Delta::Call { call_id: "call_1".into(), name: "get_weather".into(), arguments: r#"{"city":"Bern"}"#.into() };
        let events = b.push(call);
        assert_eq!(
            names(&events),
            [
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        let added = serde_json::to_value(&events[3]).unwrap();
        assert_eq!(added["item"]["type"], "function_call");
        assert_eq!(added["item"]["status"], "in_progress");
        assert_eq!(added["item"]["arguments"], "");
        let done = serde_json::to_value(&events[5]).unwrap();
        assert_eq!((done["name"].as_str(), done["arguments"].as_str()), (Some("get_weather"), Some(r#"{"city":"Bern"}"#)));
        assert_eq!(done["item_id"], added["item"]["id"]);
        b.push(Delta::Text("more".into()));
        b.finish(Ending::Stopped, None);
        let r = b.response();
        assert_eq!(r.output.len(), 3, "text, call, text");
        let call = serde_json::to_value(&r.output[1]).unwrap();
        assert_eq!(call["call_id"], "call_1");
        assert_eq!(call["status"], "completed");
        assert!(call["id"].as_str().unwrap().starts_with("fc_"));
        assert_eq!(r.status, Status::Completed);
    }
}
