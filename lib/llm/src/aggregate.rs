//! Folding a stream of chunks into one whole response (`stream: false` in the HTTP
//! frontend, and `dynamo-run`'s text and batch inputs): chat deltas are concatenated
//! per choice (`reasoning_content` likewise; `tool_calls` pieces folded by their
//! `index`), completions text likewise, the last finish reason wins, and `usage`
//! adds up the token counts the items carry.

use std::collections::BTreeMap;

use futures::StreamExt;

use crate::engine::{ChatStream, CompletionStream, EngineError, StreamItem};
use crate::protocols::logprobs;
use crate::protocols::openai::{
    ChatChoice, ChatCompletionChunk, ChatCompletionResponse, ChatResponseMessage, CompletionChoice, CompletionResponse,
    ToolCallItem, Usage,
};
use crate::protocols::unix_now;

/// Token counts over a stream: the prompt count from the items that carry one, the
/// completion counts summed; a `usage` an engine put on a chunk is the fallback.
#[derive(Debug, Default, Clone, Copy)]
struct TokenCount {
    prompt: Option<u32>,
    completion: u32,
    cached: Option<u32>,
    from_chunk: Option<Usage>,
}

impl TokenCount {
    fn add<T>(&mut self, item: &StreamItem<T>, chunk_usage: Option<Usage>) {
        let (prompt, completion) = (item.prompt_tokens, item.completion_tokens);
        if prompt.is_some() {
            self.prompt = prompt;
        }
        if item.cached_tokens.is_some() {
            self.cached = item.cached_tokens;
        }
        self.completion += completion;
        if chunk_usage.is_some() {
            self.from_chunk = chunk_usage;
        }
    }

    fn usage(&self) -> Usage {
        match (self.prompt, self.completion, self.from_chunk) {
            (None, 0, Some(u)) => u,
            (prompt, completion, _) => Usage::new(prompt.unwrap_or(0), completion).with_cached(self.cached),
        }
    }
}

/// The response's id, model and creation time: the caller's, until the first chunk
/// brings the engine's.
#[derive(Debug)]
struct Identity {
    id: String,
    model: String,
    created: u64,
    from_chunk: bool,
}

impl Identity {
    fn new(id: &str, model: &str) -> Self {
        Identity { id: id.to_string(), model: model.to_string(), created: unix_now(), from_chunk: false }
    }

    /// Take a chunk's identity if no chunk came before.
    fn adopt(&mut self, id: String, model: String, created: u64) {
        if !self.from_chunk {
            *self = Identity { id, model, created, from_chunk: true };
        }
    }
}

/// Folds chat chunks into a `chat.completion`.
#[derive(Debug)]
pub struct ChatAggregator {
    identity: Identity,
    choices: BTreeMap<u32, ChatFold>,
    tokens: TokenCount,
}

/// One chat choice so far.
#[derive(Debug, Default)]
struct ChatFold {
    role: Option<String>,
    content: String,
    reasoning: String,
    /// Calls by their delta `index`: id, type and name from the first piece,
    /// arguments concatenated.
    tool_calls: BTreeMap<usize, ToolCallItem>,
    finish_reason: Option<String>,
    logprobs: Option<serde_json::Value>,
}

impl ChatFold {
    fn add_call(&mut self, piece: ToolCallItem) {
        let index = piece.index.unwrap_or(self.tool_calls.len());
        let call = self.tool_calls.entry(index).or_default();
        call.id = call.id.take().or(piece.id);
        call.kind = call.kind.take().or(piece.kind);
        call.function.name = call.function.name.take().or(piece.function.name);
        if let Some(arguments) = piece.function.arguments {
            call.function.arguments.get_or_insert_with(String::new).push_str(&arguments);
        }
    }

    fn into_message(self) -> ChatResponseMessage {
        let tool_calls: Vec<ToolCallItem> = self
            .tool_calls
            .into_values()
            .map(|mut call| {
                call.index = None;
                call.kind.get_or_insert_with(|| "function".to_string());
                call.function.arguments.get_or_insert_with(String::new);
                call
            })
            .collect();
        // With calls and no text, `content` is null (as OpenAI answers).
        let content = (!self.content.is_empty() || tool_calls.is_empty()).then_some(self.content);
        ChatResponseMessage {
            role: self.role.unwrap_or_else(|| "assistant".to_string()),
            content,
            reasoning_content: (!self.reasoning.is_empty()).then_some(self.reasoning),
            tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
        }
    }
}

impl ChatAggregator {
    /// An aggregator whose response uses `id`/`model` unless the chunks carry their own.
    pub fn new(id: &str, model: &str) -> Self {
        ChatAggregator { identity: Identity::new(id, model), choices: BTreeMap::new(), tokens: TokenCount::default() }
    }

    /// Add one item.
    pub fn push(&mut self, item: StreamItem<ChatCompletionChunk>) {
        self.tokens.add(&item, item.data.usage);
        let chunk = item.data;
        self.identity.adopt(chunk.id, chunk.model, chunk.created);
        for choice in chunk.choices {
            let fold = self.choices.entry(choice.index).or_default();
            if fold.role.is_none() {
                fold.role = choice.delta.role;
            }
            if let Some(text) = choice.delta.content {
                fold.content.push_str(&text);
            }
            if let Some(text) = choice.delta.reasoning_content {
                fold.reasoning.push_str(&text);
            }
            for piece in choice.delta.tool_calls.into_iter().flatten() {
                fold.add_call(piece);
            }
            if choice.finish_reason.is_some() {
                fold.finish_reason = choice.finish_reason;
            }
            logprobs::merge(&mut fold.logprobs, choice.logprobs);
        }
    }

    /// The whole response.
    pub fn finish(self) -> ChatCompletionResponse {
        let mut choices: Vec<ChatChoice> = self
            .choices
            .into_iter()
            .map(|(index, mut fold)| {
                let finish_reason = fold.finish_reason.take();
                let logprobs = fold.logprobs.take();
                ChatChoice { index, message: fold.into_message(), finish_reason, logprobs }
            })
            .collect();
        if choices.is_empty() {
            choices.push(ChatChoice {
                index: 0,
                message: ChatResponseMessage { role: "assistant".to_string(), content: Some(String::new()), ..Default::default() },
                finish_reason: None,
                logprobs: None,
            });
        }
        ChatCompletionResponse {
            id: self.identity.id,
            object: "chat.completion".to_string(),
            created: self.identity.created,
            model: self.identity.model,
            choices,
            usage: self.tokens.usage(),
        }
    }

    /// Fold a whole stream; the first error item fails the fold.
    pub async fn fold(mut self, mut stream: ChatStream) -> Result<ChatCompletionResponse, EngineError> {
        while let Some(item) = stream.next().await {
            self.push(item?);
        }
        Ok(self.finish())
    }
}

/// Folds completion chunks into one `text_completion` with `usage`.
#[derive(Debug)]
pub struct CompletionAggregator {
    identity: Identity,
    choices: BTreeMap<u32, (String, Option<String>, Option<serde_json::Value>)>,
    tokens: TokenCount,
}

impl CompletionAggregator {
    /// An aggregator whose response uses `id`/`model` unless the chunks carry their own.
    pub fn new(id: &str, model: &str) -> Self {
        CompletionAggregator { identity: Identity::new(id, model), choices: BTreeMap::new(), tokens: TokenCount::default() }
    }

    /// Add one item.
    pub fn push(&mut self, item: StreamItem<CompletionResponse>) {
        self.tokens.add(&item, item.data.usage);
        let chunk = item.data;
        self.identity.adopt(chunk.id, chunk.model, chunk.created);
        for choice in chunk.choices {
            let (text, finish, folded_logprobs) = self.choices.entry(choice.index).or_default();
            text.push_str(&choice.text);
            if choice.finish_reason.is_some() {
                *finish = choice.finish_reason;
            }
            logprobs::merge(folded_logprobs, choice.logprobs);
        }
    }

    /// The whole response.
    pub fn finish(self) -> CompletionResponse {
        let mut choices: Vec<CompletionChoice> = self
            .choices
            .into_iter()
            .map(|(index, (text, finish_reason, logprobs))| CompletionChoice { index, text, finish_reason, logprobs })
            .collect();
        if choices.is_empty() {
            choices.push(CompletionChoice::default());
        }
        CompletionResponse {
            id: self.identity.id,
            object: "text_completion".to_string(),
            created: self.identity.created,
            model: self.identity.model,
            choices,
            usage: Some(self.tokens.usage()),
        }
    }

    /// Fold a whole stream; the first error item fails the fold.
    pub async fn fold(mut self, mut stream: CompletionStream) -> Result<CompletionResponse, EngineError> {
        while let Some(item) = stream.next().await {
            self.push(item?);
        }
        Ok(self.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::openai::{ChatChunkChoice, ChatDelta};

    fn chat_item(content: Option<&str>, finish: Option<&str>, prompt: Option<u32>, tokens: u32) -> StreamItem<ChatCompletionChunk> {
        let choice = ChatChunkChoice {
            index: 0,
            delta: ChatDelta { role: Some("assistant".into()), content: content.map(String::from), ..Default::default() },
            finish_reason: finish.map(String::from),
            logprobs: None,
        };
        StreamItem { data: ChatCompletionChunk::new("c1", "m", 5, choice), prompt_tokens: prompt, completion_tokens: tokens, cached_tokens: None }
    }

    #[tokio::test]
    async fn chat_concatenates_and_counts() {
        let items = vec![
            Ok(chat_item(Some("Hel"), None, Some(4), 1)),
            Ok(chat_item(Some("lo"), None, None, 1)),
            Ok(chat_item(None, Some("stop"), None, 0)),
        ];
        let resp = ChatAggregator::new("x", "y").fold(futures::stream::iter(items).boxed()).await.unwrap();
        assert_eq!(resp.id, "c1");
        assert_eq!(resp.object, "chat.completion");
        assert_eq!(resp.choices[0].message.content.as_deref(), Some("Hello"));
        assert_eq!(resp.choices[0].finish_reason.as_deref(), Some("stop"));
        assert_eq!(resp.usage, Usage::new(4, 2));
    }

    #[test]
    fn chat_folds_reasoning_and_tool_call_pieces_by_index() {
        use crate::protocols::openai::FunctionCall;
        let piece = |index, id: Option<&str>, name: Option<&str>, arguments: &str| ToolCallItem {
            index: Some(index),
            id: id.map(String::from),
            kind: id.map(|_| "function".to_string()),
            function: FunctionCall { name: name.map(String::from), arguments: Some(arguments.into()) },
        };
        let mut agg = ChatAggregator::new("x", "m");
        let deltas = [
            ChatDelta { reasoning_content: Some("think".into()), ..Default::default() },
            ChatDelta { reasoning_content: Some("ing".into()), ..Default::default() },
            ChatDelta { tool_calls: Some(vec![piece(0, Some("call_a"), Some("f"), "{\"x\":"), piece(1, Some("call_b"), Some("g"), "{}")]), ..Default::default() },
            ChatDelta { tool_calls: Some(vec![piece(0, None, None, " 1}")]), ..Default::default() },
        ];
        let last = deltas.len() - 1;
        for (i, delta) in deltas.into_iter().enumerate() {
            let choice = ChatChunkChoice { index: 0, delta, finish_reason: (i == last).then(|| "tool_calls".into()), logprobs: None };
            agg.push(StreamItem { data: ChatCompletionChunk::new("c", "m", 1, choice), prompt_tokens: None, completion_tokens: 1, cached_tokens: None });
        }
        let resp = agg.finish();
        let message = &resp.choices[0].message;
        assert_eq!(message.content, None);
        assert_eq!(message.reasoning_content.as_deref(), Some("thinking"));
        let calls = message.tool_calls.as_ref().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].index, calls[0].id.as_deref(), calls[0].kind.as_deref()), (None, Some("call_a"), Some("function")));
        assert_eq!(calls[0].function.name.as_deref(), Some("f"));
        assert_eq!(calls[0].function.arguments.as_deref(), Some("{\"x\": 1}"));
        assert_eq!(calls[1].function.name.as_deref(), Some("g"));
        assert_eq!(resp.choices[0].finish_reason.as_deref(), Some("tool_calls"));
        let json = serde_json::to_value(message).unwrap();
        assert_eq!(json["tool_calls"][0], serde_json::json!({"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}));
    }

    #[tokio::test]
    async fn an_error_item_fails_the_fold() {
        let items = vec![Ok(chat_item(Some("a"), None, None, 1)), Err(EngineError::Internal("boom".into()))];
        let err = ChatAggregator::new("x", "y").fold(futures::stream::iter(items).boxed()).await.unwrap_err();
        assert_eq!(err, EngineError::Internal("boom".into()));
    }

    #[test]
    fn completions_concatenate_text() {
        let mut agg = CompletionAggregator::new("req", "m");
        for (text, finish) in [("a", None), ("b", Some("length"))] {
            let choice = CompletionChoice { index: 0, text: text.into(), finish_reason: finish.map(String::from), logprobs: None };
            agg.push(StreamItem { data: CompletionResponse::new("cmpl-1", "m", 1, choice), prompt_tokens: Some(3), completion_tokens: 1, cached_tokens: None });
        }
        let resp = agg.finish();
        assert_eq!(resp.choices[0].text, "ab");
        assert_eq!(resp.choices[0].finish_reason.as_deref(), Some("length"));
        assert_eq!(resp.usage, Some(Usage::new(3, 2)));
        let empty = CompletionAggregator::new("req", "m").finish();
        assert_eq!(empty.id, "req");
        assert_eq!(empty.usage, Some(Usage::new(0, 0)));
    }
}
