//! `out=vllm`: the engine runs as a child process (`python -m dynamo.vllm`) serving a
//! private endpoint, and this process is the frontend bound to that endpoint
//! (`out=dyn://…`). Both join discovery from the same environment, so the embedded
//! default works on one machine as etcd + NATS do across several.
//!
//! The child's stdout and stderr are this process's. When the child exits on its own the
//! run ends with an error naming its status; when the run ends, the child gets SIGTERM
//! and [`CHILD_STOP_GRACE`] to drain before SIGKILL.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use dynamo_runtime::EndpointId;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::RunError;
use crate::flags::{Output, RunConfig};
use crate::output;

/// Time the child gets to finish after SIGTERM before it is killed.
pub const CHILD_STOP_GRACE: Duration = Duration::from_secs(30);
/// The interpreter that runs the engine module when `DYN_PYTHON` is not set (the wheel's
/// `dynamo-run` command sets it to its own interpreter).
pub const DEFAULT_PYTHON: &str = "python3";
/// The engine module (`DYN_VLLM_MODULE` overrides it: any module taking the same flags,
/// e.g. `dynamo.mocker`).
pub const DEFAULT_MODULE: &str = "dynamo.vllm";
/// The namespace of the child's endpoint when `--namespace` is not given.
pub const DEFAULT_NAMESPACE: &str = "dynamo";

/// A running engine child process and the endpoint it serves.
pub struct EngineProcess {
    child: Child,
    /// Where the child serves its model.
    pub endpoint: EndpointId,
    /// What the child runs, for messages.
    pub module: String,
}

impl EngineProcess {
    /// Start the engine child for `config` on a fresh endpoint in `namespace`.
    pub fn spawn(config: &RunConfig, namespace: &str) -> Result<Self, RunError> {
        let python = std::env::var("DYN_PYTHON").unwrap_or_else(|_| DEFAULT_PYTHON.to_string());
        let module =
            std::env::var("DYN_VLLM_MODULE").unwrap_or_else(|_| DEFAULT_MODULE.to_string());
        let component = format!("vllm-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let endpoint = EndpointId {
            namespace: namespace.to_string(),
            component,
            name: "generate".to_string(),
        };
        let mut argv = vec![
            "-m".to_string(),
            module.clone(),
            "--endpoint".to_string(),
            format!("dyn://{endpoint}"),
        ];
        argv.extend(engine_flags(config)?);
        tracing::debug!(python, ?argv, "starting the engine process");
        let mut command = Command::new(&python);
        command.args(&argv).stdin(Stdio::null()).kill_on_drop(true);
        #[cfg(target_os = "linux")]
        // SAFETY: prctl(2) is async-signal-safe; it runs in the forked child before exec.
        // A frontend killed without a chance to stop its engine (SIGKILL) still takes the
        // engine down with it, instead of leaving it holding GPUs.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = command
            .spawn()
            .map_err(|e| RunError::EngineProcess(format!("out=vllm: cannot run '{python} -m {module}' ({e}); set DYN_PYTHON to the Python that has dynamo and vllm installed")))?;
        Ok(EngineProcess {
            child,
            endpoint,
            module,
        })
    }

    /// Wait until the child exits by itself.
    pub async fn exited(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// SIGTERM the child, wait up to [`CHILD_STOP_GRACE`], then kill it.
    pub async fn stop(mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) with a pid we own (our child, not yet reaped) and a valid signal.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
        if tokio::time::timeout(CHILD_STOP_GRACE, self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!(module = %self.module, "the engine process did not stop within {CHILD_STOP_GRACE:?} of SIGTERM; killing it");
            let _ = self.child.kill().await;
        }
    }
}

/// The engine child of an `out=vllm` run, watched: its exit ends the run.
pub struct Supervised {
    stop: CancellationToken,
    task: JoinHandle<Result<(), RunError>>,
}

impl Supervised {
    /// Stop the child (unless it already exited); `Err` when it had exited by itself.
    pub async fn stop(self) -> Result<(), RunError> {
        self.stop.cancel();
        self.task.await.unwrap_or(Ok(()))
    }
}

/// For `out=vllm`: start the engine child and turn `config` into a frontend bound to
/// its endpoint (`out=dyn://…`); the child exiting cancels `cancel`. Other outputs:
/// `config` unchanged and no child. Must run inside the tokio runtime.
pub fn start(
    mut config: RunConfig,
    cancel: &CancellationToken,
) -> Result<(RunConfig, Option<Supervised>), RunError> {
    if config.output != Output::Vllm {
        return Ok((config, None));
    }
    let namespace = config
        .namespace
        .clone()
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string());
    let mut process = EngineProcess::spawn(&config, &namespace)?;
    output::status(&format!(
        "started the engine process (python -m {}) serving {}",
        process.module, process.endpoint
    ));
    config.output = Output::Dyn;
    config.dyn_endpoint = Some(process.endpoint.clone());
    let stop = CancellationToken::new();
    let (stopping, run_cancel) = (stop.clone(), cancel.clone());
    let task = tokio::spawn(async move {
        tokio::select! {
            status = process.exited() => {
                run_cancel.cancel();
                let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                Err(RunError::EngineProcess(format!("the engine process (python -m {}) exited: {status}", process.module)))
            }
            _ = stopping.cancelled() => {
                process.stop().await;
                Ok(())
            }
        }
    });
    Ok((config, Some(Supervised { stop, task })))
}

/// The engine module's flags from `dynamo-run`'s: the model, its name and card overrides,
/// `--extra-engine-args` (a JSON object; each key a flag: `"enforce_eager": true` →
/// `--enforce-eager`, `false` → `--no-enforce-eager`, lists repeat the value), then
/// everything after `--` as given.
pub fn engine_flags(config: &RunConfig) -> Result<Vec<String>, RunError> {
    let mut argv = Vec::new();
    let Some(model) = &config.model_path else {
        return Err(RunError::Usage(
            "out=vllm needs --model-path (a model folder or a HuggingFace id)".to_string(),
        ));
    };
    argv.extend(["--model-path".to_string(), model.display().to_string()]);
    if let Some(name) = &config.model_name {
        argv.extend(["--model-name".to_string(), name.clone()]);
    }
    if let Some(n) = config.context_length {
        argv.extend(["--context-length".to_string(), n.to_string()]);
    }
    if let Some(n) = config.kv_cache_block_size {
        argv.extend(["--kv-cache-block-size".to_string(), n.to_string()]);
    }
    if let Some(name) = &config.tool_call_parser {
        argv.extend(["--tool-call-parser".to_string(), name.clone()]);
    }
    if let Some(name) = &config.reasoning_parser {
        argv.extend(["--reasoning-parser".to_string(), name.clone()]);
    }
    if let Some(path) = &config.chat_template {
        argv.extend(["--chat-template".to_string(), path.display().to_string()]);
    }
    if let Some(n) = config.migration_limit {
        argv.extend(["--migration-limit".to_string(), n.to_string()]);
    }
    if let Some(path) = &config.extra_engine_args {
        argv.extend(json_flags(path)?);
    }
    argv.extend(config.engine_args.iter().cloned());
    Ok(argv)
}

/// `--extra-engine-args FILE`: a JSON object of engine flags.
fn json_flags(path: &Path) -> Result<Vec<String>, RunError> {
    let io = |source| RunError::Io {
        path: path.to_path_buf(),
        source,
    };
    let text = std::fs::read_to_string(path).map_err(io)?;
    let object: BTreeMap<String, serde_json::Value> = serde_json::from_str(&text).map_err(|e| {
        RunError::Usage(format!(
            "{}: the engine arguments must be a JSON object ({e})",
            path.display()
        ))
    })?;
    let mut argv = Vec::new();
    for (key, value) in object {
        let flag = format!("--{}", key.replace('_', "-"));
        match value {
            serde_json::Value::Bool(true) => argv.push(flag),
            serde_json::Value::Bool(false) => argv.push(format!("--no-{}", key.replace('_', "-"))),
            serde_json::Value::Null => {}
            serde_json::Value::Array(items) => {
                for item in items {
                    argv.extend([flag.clone(), scalar(&item)]);
                }
            }
            other => argv.extend([flag, scalar(&other)]),
        }
    }
    Ok(argv)
}

/// A JSON value as a command-line value: strings bare, anything else as JSON (vLLM's
/// parser reads JSON for its object-valued flags, e.g. `--kv-transfer-config`).
fn scalar(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flags::Flags;
    use clap::Parser;

    fn config(args: &[&str]) -> RunConfig {
        let argv = std::iter::once("dynamo-run").chain(args.iter().copied());
        Flags::try_parse_from(argv)
            .unwrap()
            .into_config(false)
            .unwrap()
    }

    #[test]
    fn flags_reach_the_engine_module() {
        let dir = tempfile::tempdir().unwrap();
        let extra = dir.path().join("engine.json");
        std::fs::write(
            &extra,
            r#"{"enforce_eager": true, "enable_prefix_caching": false, "gpu_memory_utilization": 0.8,
                "kv_transfer_config": {"kv_connector": "NixlConnector"}, "served_model_name": ["a", "b"], "seed": null}"#,
        )
        .unwrap();
        let c = config(&[
            "in=http", "out=vllm", "--model-path", "/m/llama", "--model-name", "llama", "--context-length", "4096",
            "--kv-cache-block-size", "32", "--migration-limit", "2", "--extra-engine-args", extra.to_str().unwrap(),
            "--", "--tensor-parallel-size", "2",
        ]);
        let expected = [
            "--model-path", "/m/llama", "--model-name", "llama", "--context-length", "4096", "--kv-cache-block-size", "32",
            "--migration-limit", "2",
            // the JSON file, keys in order
            "--no-enable-prefix-caching", "--enforce-eager", "--gpu-memory-utilization", "0.8",
            "--kv-transfer-config", r#"{"kv_connector":"NixlConnector"}"#, "--served-model-name", "a", "--served-model-name", "b",
            // after --
            "--tensor-parallel-size", "2",
        ];
        assert_eq!(engine_flags(&c).unwrap(), expected.map(String::from));
    }

    #[test]
    fn a_bad_engine_args_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let extra = dir.path().join("engine.json");
        std::fs::write(&extra, "[1, 2]").unwrap();
        let c = config(&[
            "in=http",
            "out=vllm",
            "--model-path",
            "/m",
            "--extra-engine-args",
            extra.to_str().unwrap(),
        ]);
        let e = engine_flags(&c).unwrap_err().to_string();
        assert!(e.contains("must be a JSON object"), "{e}");
    }
}
