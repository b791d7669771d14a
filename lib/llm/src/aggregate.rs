//! Folding a stream of chunks into one whole response, for `stream: false`.

use futures::StreamExt;

use crate::engine::{ChatStream, CompletionStream, EngineError, StreamItem};
use crate::protocols::openai::{
    ChatChoice, ChatCompletionChunk, ChatCompletionResponse, ChatResponseMessage, CompletionChoice, CompletionResponse,
    Usage,
};

/// Token counts summed over a stream's items.
#[derive(Default)]
struct UsageCounter {
    prompt_tokens: u32,
    completion_tokens: u32,
}

impl UsageCounter {
    fn add<T>(&mut self, item: &StreamItem<T>) {
        if let Some(p) = item.prompt_tokens {
            self.prompt_tokens = self.prompt_tokens.max(p);
        }
        self.completion_tokens = self.completion_tokens.saturating_add(item.completion_tokens);
    }

    fn usage(&self) -> Usage {
        Usage::new(self.prompt_tokens, self.completion_tokens)
    }
}

fn no_output() -> EngineError {
    EngineError::Internal("the engine returned no output".to_string())
}

/// Fold a chat stream into a `chat.completion`: the deltas' content joined, the
/// last finish reason, and `usage` from the items' token counts. An `Err` item (or
/// an empty stream) fails the whole response.
pub async fn fold_chat(mut stream: ChatStream) -> Result<ChatCompletionResponse, EngineError> {
    let mut first: Option<ChatCompletionChunk> = None;
    let mut role = None;
    let mut content = String::new();
    let mut finish_reason = None;
    let mut counter = UsageCounter::default();
    while let Some(item) = stream.next().await {
        let item = item?;
        counter.add(&item);
        for choice in &item.data.choices {
            if let Some(r) = &choice.delta.role {
                role.get_or_insert_with(|| r.clone());
            }
            if let Some(c) = &choice.delta.content {
                content.push_str(c);
            }
            if choice.finish_reason.is_some() {
                finish_reason.clone_from(&choice.finish_reason);
            }
        }
        first.get_or_insert(item.data);
    }
    let first = first.ok_or_else(no_output)?;
    Ok(ChatCompletionResponse {
        id: first.id,
        object: "chat.completion".to_string(),
        created: first.created,
        model: first.model,
        choices: vec![ChatChoice {
            index: 0,
            message: ChatResponseMessage {
                role: role.unwrap_or_else(|| "assistant".to_string()),
                content: Some(content),
            },
            finish_reason,
        }],
        usage: counter.usage(),
    })
}

/// Fold a completion stream into one `text_completion` with `usage`. An `Err` item
/// (or an empty stream) fails the whole response.
pub async fn fold_completion(mut stream: CompletionStream) -> Result<CompletionResponse, EngineError> {
    let mut first: Option<CompletionResponse> = None;
    let mut text = String::new();
    let mut finish_reason = None;
    let mut counter = UsageCounter::default();
    while let Some(item) = stream.next().await {
        let item = item?;
        counter.add(&item);
        for choice in &item.data.choices {
            text.push_str(&choice.text);
            if choice.finish_reason.is_some() {
                finish_reason.clone_from(&choice.finish_reason);
            }
        }
        first.get_or_insert(item.data);
    }
    let first = first.ok_or_else(no_output)?;
    let mut response = CompletionResponse::new(
        &first.id,
        &first.model,
        first.created,
        CompletionChoice { index: 0, text, finish_reason, logprobs: None },
    );
    response.usage = Some(counter.usage());
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::openai::{ChatChunkChoice, ChatDelta};

    fn chunk(role: Option<&str>, content: &str, finish: Option<&str>) -> ChatCompletionChunk {
        ChatCompletionChunk::new(
            "chatcmpl-1",
            "m",
            7,
            ChatChunkChoice {
                index: 0,
                delta: ChatDelta { role: role.map(String::from), content: Some(content.to_string()) },
                finish_reason: finish.map(String::from),
                logprobs: None,
            },
        )
    }

    #[tokio::test]
    async fn chat_fold_joins_content_and_counts_usage() {
        let items = vec![
            Ok(StreamItem { data: chunk(Some("assistant"), "he", None), prompt_tokens: Some(5), completion_tokens: 2 }),
            Ok(StreamItem { data: chunk(None, "llo", Some("length")), prompt_tokens: None, completion_tokens: 3 }),
        ];
        let r = fold_chat(futures::stream::iter(items).boxed()).await.unwrap();
        assert_eq!(r.id, "chatcmpl-1");
        assert_eq!(r.object, "chat.completion");
        assert_eq!(r.choices[0].message.content.as_deref(), Some("hello"));
        assert_eq!(r.choices[0].message.role, "assistant");
        assert_eq!(r.choices[0].finish_reason.as_deref(), Some("length"));
        assert_eq!(r.usage, Usage::new(5, 5));
    }

    #[tokio::test]
    async fn an_error_item_fails_the_fold() {
        let items = vec![Ok(StreamItem::new(chunk(None, "a", None))), Err(EngineError::Internal("boom".into()))];
        assert_eq!(
            fold_chat(futures::stream::iter(items).boxed()).await.unwrap_err(),
            EngineError::Internal("boom".into())
        );
        let empty: CompletionStream = futures::stream::empty().boxed();
        assert!(fold_completion(empty).await.is_err());
    }
}
