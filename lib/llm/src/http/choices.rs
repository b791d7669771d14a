//! `n > 1`: the engine runs once per choice; their streams are merged as they come,
//! each chunk relabelled with its choice index and the response's id. The prompt is
//! counted once (from the first choice).

use futures::StreamExt;

use super::sse::StreamChunk;
use crate::engine::OpenAIStream;

/// One stream of `streams.len()` choices, every chunk carrying `id`.
pub(crate) fn merge<C: StreamChunk>(streams: Vec<OpenAIStream<C>>, id: String) -> OpenAIStream<C> {
    let labelled = streams.into_iter().enumerate().map(|(index, stream)| {
        let id = id.clone();
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        stream
            .map(move |item| {
                item.map(|mut item| {
                    item.data.relabel(index, &id);
                    if index > 0 {
                        item.prompt_tokens = None;
                    }
                    item
                })
            })
            .boxed()
    });
    futures::stream::select_all(labelled).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::StreamItem;
    use crate::protocols::openai::{CompletionChoice, CompletionResponse};

    fn chunk(text: &str) -> Result<StreamItem<CompletionResponse>, crate::engine::EngineError> {
        let choice = CompletionChoice { index: 0, text: text.into(), finish_reason: None, logprobs: None };
        Ok(StreamItem {
            data: CompletionResponse::new("engine-id", "m", 1, choice),
            prompt_tokens: Some(3),
            completion_tokens: 1,
            cached_tokens: None,
        })
    }

    #[tokio::test]
    async fn choices_are_indexed_and_the_prompt_counted_once() {
        let a = futures::stream::iter(vec![chunk("a")]).boxed();
        let b = futures::stream::iter(vec![chunk("b")]).boxed();
        let items: Vec<_> = merge(vec![a, b], "cmpl-x".into()).map(|i| i.unwrap()).collect().await;
        assert_eq!(items.len(), 2);
        let mut seen: Vec<(u32, String, Option<u32>)> =
            items.iter().map(|i| (i.data.choices[0].index, i.data.choices[0].text.clone(), i.prompt_tokens)).collect();
        seen.sort();
        assert_eq!(seen, vec![(0, "a".into(), Some(3)), (1, "b".into(), None)]);
        assert!(items.iter().all(|i| i.data.id == "cmpl-x"));
    }
}
