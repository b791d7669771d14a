//! The engines that run in this process (`out=echo_full|echo_core|mocker`) and the model
//! card they are served with.

use std::sync::Arc;

use dynamo_llm::engine::{OpenAIEngine, TokenEngine};
use dynamo_llm::engines::{EchoCore, EchoFull};
use dynamo_llm::engines::mocker::{MockerArgs, MockerEngine, MockerPublisher};
use dynamo_llm::model_card::{CardOptions, ModelDeploymentCard, ModelKind};
use dynamo_llm::pipeline::Pipeline;

use crate::error::RunError;
use crate::flags::{Output, RunConfig};

/// How a local engine is served.
pub enum LocalEngine {
    /// Templates and tokenizes itself (`echo_full`): registered as a `chat` model.
    OpenAI(Arc<dyn OpenAIEngine>),
    /// Token level (`echo_core`, `mocker`): served behind the preprocessor with the
    /// card, registered as a `backend` model.
    Tokens(Arc<dyn TokenEngine>),
}

/// A local engine and its model card.
pub struct LocalModel {
    /// The card (its `display_name` is the served model name).
    pub card: Arc<ModelDeploymentCard>,
    /// The engine.
    pub engine: LocalEngine,
    /// The mocker, kept to stop its scheduler at shutdown.
    mocker: Option<Arc<MockerEngine>>,
}

impl LocalModel {
    /// Build the engine `config.output` names. `publisher` receives the mocker's KV
    /// events and load metrics (`in=dyn://`). Must run inside the tokio runtime.
    pub fn build(config: &RunConfig, publisher: Option<MockerPublisher>) -> Result<Self, RunError> {
        let kind = if config.output == Output::EchoFull { ModelKind::Chat } else { ModelKind::Backend };
        let mut card = card_options(config, kind).build()?;
        let mut mocker = None;
        let engine = match config.output {
            Output::EchoFull => LocalEngine::OpenAI(Arc::new(EchoFull::from_env())),
            Output::EchoCore => LocalEngine::Tokens(Arc::new(EchoCore::from_env())),
            Output::Mocker => {
                let mut args = match &config.extra_engine_args {
                    Some(path) => MockerArgs::from_path(path)?,
                    None => MockerArgs::default(),
                };
                if let Some(block_size) = config.kv_cache_block_size {
                    args.block_size = block_size as usize;
                }
                if let Some(gbps) = config.kv_transfer_gbps {
                    args.kv_transfer_gbps = gbps;
                }
                // The frontend hashes KV blocks with the card's block size: keep them equal.
                let block_size = u32::try_from(args.block_size)
                    .map_err(|_| RunError::Usage(format!("block_size {} is too large", args.block_size)))?;
                card = card.with_kv_cache_block_size(block_size)?;
                let engine = Arc::new(MockerEngine::new(args, publisher)?);
                mocker = Some(engine.clone());
                LocalEngine::Tokens(engine)
            }
            Output::Dyn | Output::Vllm => {
                return Err(RunError::Usage(format!("out={} is not a local engine", config.output.as_str())));
            }
        };
        Ok(LocalModel { card: Arc::new(card), engine, mocker })
    }

    /// The served model name.
    pub fn name(&self) -> &str {
        &self.card.display_name
    }

    /// The engine as the HTTP service, text and batch inputs call it: a token engine
    /// behind the preprocessor pipeline, an OpenAI engine as it is.
    pub fn openai_engine(&self) -> Result<Arc<dyn OpenAIEngine>, RunError> {
        match &self.engine {
            LocalEngine::OpenAI(engine) => Ok(engine.clone()),
            LocalEngine::Tokens(engine) => Ok(Arc::new(Pipeline::new(self.card.clone(), engine.clone())?)),
        }
    }

    /// The mocker engine, when `out=mocker` (it takes part in disaggregated serving).
    pub fn mocker(&self) -> Option<&Arc<MockerEngine>> {
        self.mocker.as_ref()
    }

    /// Stop background work (the mocker's scheduler and publisher).
    pub async fn shutdown(&self) {
        if let Some(mocker) = &self.mocker {
            mocker.shutdown().await;
        }
    }
}

/// How the card of `--model-path` (or the built-in one) is built, with the flags' overrides.
fn card_options(config: &RunConfig, kind: ModelKind) -> CardOptions {
    CardOptions {
        model_path: config.model_path.clone(),
        model_name: config.model_name.clone(),
        kind,
        context_length: config.context_length,
        kv_cache_block_size: config.kv_cache_block_size,
        tool_call_parser: config.tool_call_parser.clone(),
        reasoning_parser: config.reasoning_parser.clone(),
        chat_template: config.chat_template.clone(),
    }
}
