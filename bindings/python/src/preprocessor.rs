//! `OpenAIPreprocessor`: the Rust preprocessor, detokenizer and chunk builder for a
//! Python processor that picks the worker itself (from the token ids) between
//! tokenizing and generating.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde::Serialize;

use dynamo_llm::remote::wire::OpenAIWireItem;
use dynamo_llm::remote::RemoteTokenEngine;
use dynamo_llm::routing::RouterMode;
use dynamo_llm::engine::{EngineError, OpenAIStream, RequestContext};
use dynamo_llm::model_card::{CardOptions, ModelKind};
use dynamo_llm::pipeline::Pipeline;
use dynamo_llm::preprocessor::{chat_input_bytes, completion_input_bytes, Preprocessed, Preprocessor};
use dynamo_llm::protocols::openai::{ChatCompletionRequest, CompletionRequest};

use crate::bridge::LoopBridge;
use crate::client::PyClient;
use crate::convert::{from_json, to_json};
use crate::errors::{DynamoError, DynamoTimeoutError, NoInstancesError};
use crate::llm::card_error;
use crate::poll_iter::{PollIter, Source};
use crate::serving::PyRequestContext;

/// The Python exception of an engine error.
fn engine_error(e: EngineError) -> PyErr {
    match e {
        EngineError::BadRequest(m) | EngineError::NotFound(m) => PyValueError::new_err(m),
        EngineError::Unavailable(m) => NoInstancesError::new_err(m),
        EngineError::Timeout(m) => DynamoTimeoutError::new_err(m),
        // Overloaded: an admission refusal, which only the HTTP frontend makes.
        EngineError::Internal(m) | EngineError::Overloaded(m) => DynamoError::new_err(m),
    }
}

/// Tokenizes OpenAI requests with one model card, and turns a worker's token stream
/// back into OpenAI chunks.
#[pyclass(name = "OpenAIPreprocessor", module = "dynamo._core", frozen)]
pub struct PyOpenAIPreprocessor {
    preprocessor: Arc<Preprocessor>,
}

#[pymethods]
impl PyOpenAIPreprocessor {
    /// Load the model card of `model_path` (a HuggingFace folder), or the built-in card
    /// (byte-level tokenizer) named `model_name` when no path is given; the output
    /// parsers and a template override as `register_llm` takes them.
    #[new]
    #[pyo3(signature = (model_path=None, model_name=None, context_length=None, kv_cache_block_size=None, tool_call_parser=None, reasoning_parser=None, chat_template=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model_path: Option<std::path::PathBuf>,
        model_name: Option<String>,
        context_length: Option<u32>,
        kv_cache_block_size: Option<u32>,
        tool_call_parser: Option<String>,
        reasoning_parser: Option<String>,
        chat_template: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let options = CardOptions {
            model_path,
            model_name,
            kind: ModelKind::Backend,
            context_length,
            kv_cache_block_size,
            tool_call_parser,
            reasoning_parser,
            chat_template,
        };
        let preprocessor = py.detach(move || {
            let card = options.build().map_err(card_error)?;
            Preprocessor::new(Arc::new(card)).map_err(card_error)
        })?;
        Ok(PyOpenAIPreprocessor { preprocessor: Arc::new(preprocessor) })
    }

    /// The model's public name.
    #[getter]
    fn model_name(&self) -> String {
        self.preprocessor.card().display_name.clone()
    }

    /// Tokens per KV block of the card.
    #[getter]
    fn kv_cache_block_size(&self) -> u32 {
        self.preprocessor.card().kv_cache_block_size
    }

    /// Template and tokenize an OpenAI request: a chat request (it has `messages`) or a
    /// completions request. Raises `ValueError` for an invalid or too long request.
    fn preprocess(&self, py: Python<'_>, request: &Bound<'_, PyAny>) -> PyResult<PyPreprocessed> {
        let body = to_json(request)?;
        let preprocessor = self.preprocessor.clone();
        py.detach(move || {
            let value: serde_json::Value = serde_json::from_slice(&body)
                .map_err(|e| PyValueError::new_err(format!("invalid request: {e}")))?;
            let invalid = |e: serde_json::Error| PyValueError::new_err(format!("invalid request: {e}"));
            let (request, pre) = if value.get("messages").is_some() {
                let request: ChatCompletionRequest = serde_json::from_value(value).map_err(invalid)?;
                preprocessor.check_prompt_bytes(chat_input_bytes(&request)).map_err(engine_error)?;
                let pre = preprocessor.preprocess_chat(&request).map_err(engine_error)?;
                (OpenAIRequest::Chat(request), pre)
            } else {
                let request: CompletionRequest = serde_json::from_value(value).map_err(invalid)?;
                preprocessor.check_prompt_bytes(completion_input_bytes(&request)).map_err(engine_error)?;
                let pre = preprocessor.preprocess_completion(&request).map_err(engine_error)?;
                (OpenAIRequest::Completion(request), pre)
            };
            Ok(PyPreprocessed { request, pre })
        })
    }

    /// Send `request` (from `preprocess`) to a worker of `client`'s endpoint, to
    /// `instance_id` when given (else round-robin), and stream the OpenAI items
    /// (`{"data": chunk, "prompt_tokens": n, "completion_tokens": n}`, what a chat model's
    /// worker yields to a frontend). `context` (the handler's) carries cancellation.
    #[pyo3(signature = (request, client, instance_id=None, context=None))]
    fn generate(
        &self,
        py: Python<'_>,
        request: &PyPreprocessed,
        client: &PyClient,
        instance_id: Option<u64>,
        context: Option<&PyRequestContext>,
    ) -> PyResult<Py<PyAny>> {
        let engine = match instance_id {
            Some(id) => RemoteTokenEngine::to_instance(client.inner.clone(), id),
            None => RemoteTokenEngine::new(client.inner.clone(), RouterMode::RoundRobin),
        };
        let pipeline = Pipeline::with_preprocessor(self.preprocessor.clone(), Arc::new(engine));
        let ctx = match context {
            Some(c) => c.context(),
            None => RequestContext::new(uuid::Uuid::new_v4().to_string()),
        };
        let openai = request.request.clone();
        let pre = request.pre.clone();
        let bridge = client.bridge.clone();
        let started = async move {
            let stream = match openai {
                OpenAIRequest::Chat(r) => wire_items(pipeline.chat_preprocessed(r, pre, ctx).await),
                OpenAIRequest::Completion(r) => wire_items(pipeline.completion_preprocessed(r, pre, ctx).await),
            };
            stream.map_err(engine_error)
        };
        client.bridge.awaitable(py, started, move |py, stream| {
            Ok(Py::new(py, PyChunkStream::new(stream, bridge))?.into_any())
        })
    }
}

/// The stream's items as wire JSON.
fn wire_items<T: Serialize + Send + 'static>(
    started: Result<OpenAIStream<T>, EngineError>,
) -> Result<BoxStream<'static, Result<Bytes, EngineError>>, EngineError> {
    Ok(started?
        .map(|item| {
            item.and_then(|item| {
                serde_json::to_vec(&OpenAIWireItem::from(item))
                    .map(Bytes::from)
                    .map_err(|e| EngineError::Internal(format!("cannot serialize a chunk: {e}")))
            })
        })
        .boxed())
}

#[derive(Clone)]
enum OpenAIRequest {
    Chat(ChatCompletionRequest),
    Completion(CompletionRequest),
}

/// A tokenized OpenAI request.
#[pyclass(name = "PreprocessedRequest", module = "dynamo._core", frozen)]
pub struct PyPreprocessed {
    request: OpenAIRequest,
    pre: Preprocessed,
}

#[pymethods]
impl PyPreprocessed {
    /// The prompt's token ids.
    #[getter]
    fn token_ids(&self) -> Vec<u32> {
        self.pre.request.token_ids.clone()
    }

    /// The token-level request a worker receives, as a dict.
    #[getter]
    fn request(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let body = serde_json::to_vec(&self.pre.request).map_err(|e| DynamoError::new_err(e.to_string()))?;
        from_json(py, &body)
    }

    /// The rendered prompt (empty for a token-id prompt).
    #[getter]
    fn prompt(&self) -> String {
        self.pre.formatted_prompt.clone()
    }

    /// "chat" or "completion".
    #[getter]
    fn kind(&self) -> &'static str {
        match self.request {
            OpenAIRequest::Chat(_) => "chat",
            OpenAIRequest::Completion(_) => "completion",
        }
    }
}

struct ChunkSource {
    stream: BoxStream<'static, Result<Bytes, EngineError>>,
}

impl Source for ChunkSource {
    type Item = Result<Bytes, EngineError>;

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.stream.poll_next_unpin(cx)
    }

    fn convert(&self, py: Python<'_>, item: Self::Item) -> PyResult<Option<Py<PyAny>>> {
        from_json(py, &item.map_err(engine_error)?).map(Some)
    }
}

/// The OpenAI items of one generated request, as an async iterator.
#[pyclass(name = "ChunkStream", module = "dynamo._core", frozen)]
pub struct PyChunkStream {
    iter: Arc<PollIter<ChunkSource>>,
}

impl PyChunkStream {
    fn new(stream: BoxStream<'static, Result<Bytes, EngineError>>, bridge: Arc<LoopBridge>) -> Self {
        PyChunkStream { iter: PollIter::new(ChunkSource { stream }, bridge) }
    }
}

#[pymethods]
impl PyChunkStream {
    fn __aiter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __anext__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.iter.anext(py)
    }
}
