//! `in=text` (an interactive chat with history) and `in=stdin` (all of stdin as one
//! prompt): answers stream to stdout as they are generated.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dynamo_llm::engine::{OpenAIEngine, RequestContext};
use dynamo_llm::protocols::openai::ChatMessage;
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio_util::sync::CancellationToken;

use super::{chat_request, message};
use crate::error::RunError;
use crate::flags::RunConfig;
use crate::models::Models;
use crate::output;

/// Run the interactive chat (`interactive`) or answer stdin once.
pub async fn run(config: &RunConfig, cancel: CancellationToken, interactive: bool) -> Result<(), RunError> {
    let models = Models::start(config).await?;
    let result = async {
        let (name, engine) = models.chat_engine(config.model_name.as_deref(), &cancel).await?;
        let chat = Chat { model: name, engine, max_tokens: config.max_tokens, cancel };
        if interactive {
            chat.interactive().await
        } else {
            chat.once().await
        }
    }
    .await;
    models.shutdown().await;
    result
}

/// One model to chat with.
struct Chat {
    model: String,
    engine: Arc<dyn OpenAIEngine>,
    max_tokens: Option<u32>,
    cancel: CancellationToken,
}

fn stdout_error(e: std::io::Error) -> RunError {
    RunError::io("stdout", e)
}

impl Chat {
    /// Read all of stdin, print the answer, return.
    async fn once(&self) -> Result<(), RunError> {
        let mut prompt = String::new();
        let mut stdin = tokio::io::stdin();
        tokio::select! {
            r = stdin.read_to_string(&mut prompt) => r.map_err(|e| RunError::io("stdin", e))?,
            _ = self.cancel.cancelled() => return Err(RunError::Interrupted),
        };
        if prompt.trim().is_empty() {
            return Err(RunError::Usage("in=stdin: stdin is empty, there is no prompt".to_string()));
        }
        self.answer(vec![message("user", prompt)]).await?;
        writeln!(std::io::stdout()).map_err(stdout_error)
    }

    /// Prompt, answer, repeat with the history, until EOF or a signal.
    async fn interactive(&self) -> Result<(), RunError> {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        let mut history: Vec<ChatMessage> = Vec::new();
        loop {
            let mut out = std::io::stdout();
            out.write_all(b"> ").and_then(|_| out.flush()).map_err(stdout_error)?;
            let line = tokio::select! {
                l = lines.next_line() => l.map_err(|e| RunError::io("stdin", e))?,
                _ = self.cancel.cancelled() => None,
            };
            let Some(line) = line else {
                writeln!(out).map_err(stdout_error)?;
                return Ok(());
            };
            if line.trim().is_empty() {
                continue;
            }
            history.push(message("user", line));
            match self.answer(history.clone()).await {
                Ok(answer) => history.push(message("assistant", answer)),
                Err(RunError::Interrupted) => {
                    writeln!(out).map_err(stdout_error)?;
                    return Ok(());
                }
                Err(RunError::Engine(e)) => {
                    // The conversation goes on without the failed turn.
                    history.pop();
                    output::error(&e.to_string());
                }
                Err(e) => return Err(e),
            }
            writeln!(out).map_err(stdout_error)?;
        }
    }

    /// Stream the answer to `messages` to stdout; return its text.
    async fn answer(&self, messages: Vec<ChatMessage>) -> Result<String, RunError> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        let ctx = RequestContext::new(format!("chat-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed)));
        let request = chat_request(&self.model, messages, self.max_tokens);
        let mut stream = tokio::select! {
            s = self.engine.chat(request, ctx.clone()) => s?,
            _ = self.cancel.cancelled() => return Err(RunError::Interrupted),
        };
        let mut answer = String::new();
        loop {
            let item = tokio::select! {
                item = stream.next() => item,
                _ = self.cancel.cancelled() => {
                    ctx.kill();
                    return Err(RunError::Interrupted);
                }
            };
            let Some(item) = item else { return Ok(answer) };
            for choice in item?.data.choices {
                if let Some(text) = choice.delta.content {
                    let mut out = std::io::stdout();
                    out.write_all(text.as_bytes()).and_then(|_| out.flush()).map_err(stdout_error)?;
                    answer.push_str(&text);
                }
            }
        }
    }
}
