//! The engine side of the frontend inputs (`in=http|text|stdin|batch`): a
//! [`ModelManager`] filled either with the local engine or, for `out=dyn`, by a
//! [`ModelWatcher`] following the models workers register in discovery.

use std::sync::Arc;
use std::time::Duration;

use dynamo_llm::frontend::{ModelWatcher, ModelWatcherHandle};
use dynamo_llm::engine::OpenAIEngine;
use dynamo_llm::model_manager::ModelManager;
use dynamo_llm::pipeline::Pipeline;
use dynamo_runtime::DistributedRuntime;
use tokio_util::sync::CancellationToken;

use crate::error::RunError;
use crate::flags::{Output, RunConfig};
use crate::local::LocalModel;

/// How often a text or batch input looks for a discovered model to appear.
const MODEL_POLL: Duration = Duration::from_millis(100);

/// Where the models come from.
enum Source {
    Local(LocalModel),
    Discovered { runtime: DistributedRuntime, watcher: ModelWatcherHandle },
}

/// The models a frontend input serves.
pub struct Models {
    /// What the HTTP service and the text/batch inputs look models up in.
    pub manager: Arc<ModelManager>,
    source: Source,
}

impl Models {
    /// Build the local engine, or join the distributed runtime (configured from the
    /// environment) and watch its models for `out=dyn`.
    pub async fn start(config: &RunConfig) -> Result<Self, RunError> {
        let manager = Arc::new(ModelManager::new());
        let source = if config.output == Output::Dyn {
            let runtime = DistributedRuntime::from_env().await?;
            let mut watcher = ModelWatcher::new(runtime.clone(), manager.clone(), config.router_mode, Pipeline::factory())
                .with_migration_limit(config.migration_limit.unwrap_or(dynamo_llm::remote::DEFAULT_MIGRATION_LIMIT))
                .with_resend_limit(config.resend_limit.unwrap_or(dynamo_llm::remote::DEFAULT_RESEND_LIMIT))
                .with_kv_config(config.kv_router);
            if let Some(endpoint) = &config.dyn_endpoint {
                watcher = watcher.with_endpoint(endpoint.clone());
            }
            if let Some(namespace) = &config.namespace {
                watcher = watcher.with_namespace(namespace.clone());
            }
            let watcher = watcher.start(runtime.child_token())
                .await;
            match watcher {
                Ok(watcher) => Source::Discovered { runtime, watcher },
                Err(e) => {
                    runtime.shutdown().await;
                    return Err(e.into());
                }
            }
        } else {
            let local = LocalModel::build(config, None)?;
            manager.add_full_model(local.name(), local.openai_engine()?);
            Source::Local(local)
        };
        Ok(Models { manager, source })
    }

    /// The distributed runtime the models are discovered through (`out=dyn`).
    pub fn runtime(&self) -> Option<&DistributedRuntime> {
        match &self.source {
            Source::Discovered { runtime, .. } => Some(runtime),
            Source::Local(_) => None,
        }
    }

    /// A line for humans: which models are served, or where they come from.
    pub fn describe(&self) -> String {
        match &self.source {
            Source::Local(local) => format!("models: {}", local.name()),
            Source::Discovered { .. } => "models: discovered (out=dyn)".to_string(),
        }
    }

    /// The chat engine of `wanted` (or of the first model when `None`). With `out=dyn`
    /// this waits until a worker has registered one, or until `cancel` fires.
    pub async fn chat_engine(
        &self,
        wanted: Option<&str>,
        cancel: &CancellationToken,
    ) -> Result<(String, Arc<dyn OpenAIEngine>), RunError> {
        let mut announced = false;
        loop {
            let routable = self.manager.routable_models();
            let name = match wanted {
                Some(name) => routable.iter().find(|m| *m == name).cloned(),
                None => routable.first().cloned(),
            };
            if let Some(name) = name {
                if let Ok(engine) = self.manager.chat_engine(&name) {
                    return Ok((name, engine));
                }
            }
            if let Source::Local(_) = self.source {
                // Local models are registered up front: nothing more will come.
                return Err(RunError::Usage(format!("no chat model named '{}'", wanted.unwrap_or_default())));
            }
            if !announced {
                announced = true;
                crate::output::note(&format!(
                    "waiting for a worker to register {} (Ctrl-C to give up)",
                    wanted.map_or("a model".to_string(), |n| format!("model '{n}'"))
                ));
            }
            tokio::select! {
                _ = tokio::time::sleep(MODEL_POLL) => {}
                _ = cancel.cancelled() => return Err(RunError::Interrupted),
            }
        }
    }

    /// Stop watching, leave the runtime, stop local engines.
    pub async fn shutdown(self) {
        match self.source {
            Source::Local(local) => local.shutdown().await,
            Source::Discovered { runtime, watcher } => {
                watcher.stop().await;
                runtime.shutdown().await;
            }
        }
    }
}
