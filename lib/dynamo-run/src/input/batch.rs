//! `in=batch:FILE.jsonl`: every line `{"text": "..."}` is one prompt, sent as a chat
//! request; at most [`MAX_IN_FLIGHT`] run at once. The results go to `output.jsonl`
//! next to the input, one line per prompt in input order:
//! `{"text", "response", "tokens_in", "tokens_out", "elapsed_ms", "finish_reason"}`
//! (plus `"error"` for a prompt that failed). A malformed input line is reported on
//! stderr with its line number and skipped; the run goes on. Some failed prompts make
//! the exit code 1.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dynamo_llm::aggregate::ChatAggregator;
use dynamo_llm::engine::{OpenAIEngine, RequestContext};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{chat_request, message};
use crate::error::RunError;
use crate::flags::RunConfig;
use crate::models::Models;
use crate::output;

/// Most prompts in flight at once.
pub const MAX_IN_FLIGHT: usize = 64;

/// The name of the output file, written next to the input.
pub const OUTPUT_FILE: &str = "output.jsonl";

/// One input line.
#[derive(Debug, Deserialize)]
struct Prompt {
    text: String,
}

/// One output line.
#[derive(Debug, Serialize)]
struct Answer {
    text: String,
    response: Option<String>,
    tokens_in: u32,
    tokens_out: u32,
    elapsed_ms: u64,
    finish_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Run every prompt of `file`; write `output.jsonl` beside it; print a summary.
pub async fn run(config: &RunConfig, file: &Path, cancel: CancellationToken) -> Result<(), RunError> {
    let text = tokio::fs::read_to_string(file).await.map_err(|e| RunError::io(file, e))?;
    let prompts = parse(file, &text);
    let out_path = output_path(file);
    let mut out = std::fs::File::create(&out_path).map_err(|e| RunError::io(&out_path, e))?;
    let models = Models::start(config).await?;
    let result = async {
        let (model, engine) = models.chat_engine(config.model_name.as_deref(), &cancel).await?;
        run_prompts(&model, engine, config.max_tokens, prompts, &mut out, &out_path, &cancel).await
    }
    .await;
    models.shutdown().await;
    let summary = result?;
    output::status(&summary.describe(&out_path));
    if summary.failed > 0 {
        return Err(RunError::PromptsFailed { failed: summary.failed, total: summary.count });
    }
    Ok(())
}

/// The prompts of the file; malformed lines are reported and skipped, blank ones ignored.
fn parse(file: &Path, text: &str) -> Vec<String> {
    let mut prompts = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Prompt>(line) {
            Ok(p) => prompts.push(p.text),
            Err(e) => output::error(&format!("{}:{}: skipped: {e}", file.display(), index + 1)),
        }
    }
    prompts
}

fn output_path(file: &Path) -> PathBuf {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(OUTPUT_FILE),
        _ => PathBuf::from(OUTPUT_FILE),
    }
}

/// Totals of a batch.
#[derive(Debug, Default)]
struct Summary {
    count: usize,
    failed: usize,
    tokens_in: u64,
    tokens_out: u64,
    wall: Duration,
}

impl Summary {
    fn describe(&self, out_path: &Path) -> String {
        let secs = self.wall.as_secs_f64().max(1e-9);
        format!(
            "batch: {} prompts ({} failed) in {:.2} s; tokens in: {} ({:.1}/s), tokens out: {} ({:.1}/s); wrote {}",
            self.count,
            self.failed,
            self.wall.as_secs_f64(),
            self.tokens_in,
            self.tokens_in as f64 / secs,
            self.tokens_out,
            self.tokens_out as f64 / secs,
            out_path.display()
        )
    }
}

async fn run_prompts(
    model: &str,
    engine: Arc<dyn OpenAIEngine>,
    max_tokens: Option<u32>,
    prompts: Vec<String>,
    out: &mut std::fs::File,
    out_path: &Path,
    cancel: &CancellationToken,
) -> Result<Summary, RunError> {
    let started = Instant::now();
    let mut summary = Summary::default();
    let mut answers = futures::stream::iter(prompts.into_iter().enumerate())
        .map(|(index, text)| ask(model, engine.clone(), max_tokens, index, text))
        .buffered(MAX_IN_FLIGHT);
    loop {
        // Dropping the pending requests on a signal ends them (their contexts are killed).
        let answer = tokio::select! {
            a = answers.next() => a,
            _ = cancel.cancelled() => return Err(RunError::Interrupted),
        };
        let Some(answer) = answer else { break };
        summary.count += 1;
        summary.failed += usize::from(answer.error.is_some());
        summary.tokens_in += u64::from(answer.tokens_in);
        summary.tokens_out += u64::from(answer.tokens_out);
        let line = serde_json::to_string(&answer).map_err(|e| RunError::io(out_path, e.into()))?;
        writeln!(out, "{line}").map_err(|e| RunError::io(out_path, e))?;
    }
    out.flush().map_err(|e| RunError::io(out_path, e))?;
    summary.wall = started.elapsed();
    Ok(summary)
}

/// Run one prompt to the end.
async fn ask(
    model: &str,
    engine: Arc<dyn OpenAIEngine>,
    max_tokens: Option<u32>,
    index: usize,
    text: String,
) -> Answer {
    let started = Instant::now();
    let ctx = RequestContext::new(format!("batch-{index}"));
    let request = chat_request(model, vec![message("user", text.clone())], max_tokens);
    let result = match engine.chat(request, ctx).await {
        Ok(stream) => ChatAggregator::new(&format!("batch-{index}"), model).fold(stream).await,
        Err(e) => Err(e),
    };
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    match result {
        Ok(response) => {
            let choice = response.choices.into_iter().next();
            Answer {
                text,
                response: Some(choice.as_ref().and_then(|c| c.message.content.clone()).unwrap_or_default()),
                tokens_in: response.usage.prompt_tokens,
                tokens_out: response.usage.completion_tokens,
                elapsed_ms,
                finish_reason: choice.and_then(|c| c.finish_reason),
                error: None,
            }
        }
        Err(e) => Answer {
            text,
            response: None,
            tokens_in: 0,
            tokens_out: 0,
            elapsed_ms,
            finish_reason: Some("error".to_string()),
            error: Some(e.to_string()),
        },
    }
}
