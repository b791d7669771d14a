//! The command line: `in=`/`out=` and the `--` flags, parsed with clap, then checked
//! together into a [`RunConfig`].

use std::path::PathBuf;
use std::str::FromStr;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{ArgAction, Parser};
use dynamo_llm::disagg::{DisaggConfig, DisaggRole};
use dynamo_llm::routing::RouterMode;
use dynamo_runtime::EndpointId;

use crate::error::RunError;

/// Default HTTP port of `in=http`.
pub const DEFAULT_HTTP_PORT: u16 = 8080;

/// The flags as clap parses them.
#[derive(Debug, Parser)]
#[command(
    name = "dynamo-run",
    version,
    about = "Run an LLM engine behind an input: an OpenAI HTTP server, an interactive chat, a batch file, or a dyn:// endpoint",
    after_help = "INPUTS: in=http | in=text | in=stdin | in=batch:FILE.jsonl | in=dyn://NAMESPACE.COMPONENT.ENDPOINT\n\
                  \x20 (default: text when stdin is a terminal, else stdin)\n\
                  OUTPUTS: out=echo_full | out=echo_core | out=mocker | out=dyn | out=vllm (default: echo_full)\n\
                  See docs/dynamo-run.md."
)]
pub struct Flags {
    /// `in=INPUT` and/or `out=OUTPUT`, in either order.
    #[arg(value_name = "in=INPUT|out=OUTPUT")]
    pub io: Vec<String>,

    /// HuggingFace model folder (tokenizer.json, tokenizer_config.json, config.json);
    /// without it a built-in byte-level card is used.
    #[arg(long, value_name = "DIR")]
    pub model_path: Option<PathBuf>,

    /// The name clients use for the model (default: the folder's name, or `dynamo`).
    #[arg(long, value_name = "NAME")]
    pub model_name: Option<String>,

    /// Port of `in=http` (0 picks a free port; the bound one is printed).
    #[arg(long, value_name = "PORT", default_value_t = DEFAULT_HTTP_PORT)]
    pub http_port: u16,

    /// Address of `in=http`.
    #[arg(long, value_name = "HOST", default_value = "0.0.0.0")]
    pub http_host: String,

    /// Most open HTTP connections; one more is answered 503 and closed.
    #[arg(long, value_name = "N", default_value_t = dynamo_llm::http::DEFAULT_MAX_CONNECTIONS, value_parser = positive_usize)]
    pub http_max_connections: usize,

    /// Most generation requests served at once (streams until their end); more are
    /// answered 503 with Retry-After.
    #[arg(long, value_name = "N", default_value_t = dynamo_llm::http::DEFAULT_MAX_INFLIGHT, value_parser = positive_usize)]
    pub http_max_inflight: usize,

    /// Most generation requests of one model in flight (each model has its own); more
    /// are answered 429 with Retry-After (admission, docs/reliability.md).
    #[arg(long, value_name = "N", value_parser = positive_usize)]
    pub max_inflight_requests: Option<usize>,

    /// Most prompt tokens of one model's admitted requests without a first token yet;
    /// past it requests are answered 429 with Retry-After.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_queued_tokens: Option<u64>,

    /// TTFT target in milliseconds: a request is answered 429 with Retry-After at
    /// admission when the router's estimate of its time to first token on the best
    /// worker already exceeds it.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub admission_ttft_ms: Option<u64>,

    /// Seconds a connection gets to send a request's headers, counted from when the
    /// server starts waiting for them (closes slowloris and idle keep-alive connections).
    #[arg(long, value_name = "SECONDS", default_value_t = dynamo_llm::http::DEFAULT_HEADER_TIMEOUT.as_secs_f64(), value_parser = positive_seconds)]
    pub http_header_timeout: f64,

    /// Seconds a request gets to send its whole body (408 after).
    #[arg(long, value_name = "SECONDS", default_value_t = dynamo_llm::http::DEFAULT_BODY_TIMEOUT.as_secs_f64(), value_parser = positive_seconds)]
    pub http_body_timeout: f64,

    /// `max_tokens` of an HTTP request that sets none (the model's context is the
    /// ceiling either way).
    #[arg(long, value_name = "TOKENS", default_value_t = dynamo_llm::http::DEFAULT_MAX_TOKENS, value_parser = clap::value_parser!(u32).range(1..))]
    pub default_max_tokens: u32,

    /// Require `Authorization: Bearer KEY` on the HTTP API (`/health`, `/live`,
    /// `/metrics` stay open).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,

    /// Seconds a resumable stream (`X-Dynamo-Resumable: true`) goes on generating after
    /// its last reader disconnected, before it is cancelled.
    #[arg(long, value_name = "SECONDS", default_value_t = dynamo_llm::http::streams::DEFAULT_GRACE.as_secs_f64(), value_parser = positive_seconds)]
    pub stream_grace_s: f64,

    /// Seconds a finished resumable stream stays replayable.
    #[arg(long, value_name = "SECONDS", default_value_t = dynamo_llm::http::streams::DEFAULT_RETENTION.as_secs_f64(), value_parser = positive_seconds)]
    pub stream_retention_s: f64,

    /// Bytes of events one resumable stream's replay buffer keeps (the oldest are
    /// dropped beyond; resuming before them is a 410).
    #[arg(long, value_name = "BYTES", default_value_t = dynamo_llm::http::streams::DEFAULT_BUFFER_BYTES, value_parser = positive_usize)]
    pub stream_buffer_bytes: usize,

    /// Answer CORS requests from this origin (repeatable; `*` for any).
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,

    /// Where `/v1/responses` keeps responses: `memory` (this process), or `discovery`
    /// (the discovery store, shared by every frontend on it; needs out=dyn).
    #[arg(long, value_name = "STORE", default_value = "memory", value_parser = ["memory", "discovery"])]
    pub responses_store: String,

    /// Seconds a stored response is kept.
    #[arg(long = "responses-ttl-s", value_name = "SECONDS", default_value_t = dynamo_llm::http::responses::DEFAULT_RESPONSES_TTL.as_secs_f64(), value_parser = positive_seconds)]
    pub responses_ttl: f64,

    /// Most responses the store keeps (the oldest go first; the discovery store checks
    /// its count at most once a second per frontend).
    #[arg(long, value_name = "N", default_value_t = dynamo_llm::http::responses::DEFAULT_RESPONSES_MAX, value_parser = positive_usize)]
    pub responses_max: usize,

    /// How `out=dyn` picks a worker instance.
    #[arg(long, value_name = "MODE", default_value_t = RouterMode::RoundRobin,
          value_parser = PossibleValuesParser::new(RouterMode::NAMES).try_map(|s| s.parse::<RouterMode>()))]
    pub router_mode: RouterMode,

    /// `--router-mode kv`: weight of a KV block still to prefill (request blocks minus
    /// the worker's cached prefix) against a block in use on the worker (decode load).
    #[arg(long, value_name = "W", default_value_t = dynamo_llm::kv_router::DEFAULT_OVERLAP_WEIGHT)]
    pub kv_overlap_weight: f64,

    /// `--router-mode kv`: softmax temperature over the workers' normalised cost; 0
    /// always picks the cheapest (ties at random), more spreads bursts.
    #[arg(long, value_name = "T", default_value_t = dynamo_llm::kv_router::DEFAULT_TEMPERATURE)]
    pub router_temperature: f64,

    /// `--router-mode kv`: correct the router's predictions with the workers' KV events
    /// (the default).
    #[arg(long = "kv-events", overrides_with = "no_kv_events")]
    pub kv_events: bool,

    /// `--router-mode kv`: approximate mode, predictions from routing decisions only
    /// (expiring after a TTL).
    #[arg(long = "no-kv-events")]
    pub no_kv_events: bool,

    /// `--router-mode kv`: share routing decisions with the other frontends (router
    /// replicas) of the same workers on the event plane, and start from a peer's
    /// snapshot (the default).
    #[arg(long = "router-replica-sync", overrides_with = "no_router_replica_sync")]
    pub router_replica_sync: bool,

    /// `--router-mode kv`: route on this frontend's own view only.
    #[arg(long = "no-router-replica-sync")]
    pub no_router_replica_sync: bool,

    /// `--router-mode kv`: fraction (0–1] of a worker's KV blocks in use at which it is
    /// busy; when every worker is, requests are answered 503 with Retry-After (at once,
    /// or after `--busy-wait-s`).
    #[arg(long, value_name = "FRACTION")]
    pub busy_threshold: Option<f64>,

    /// With `--busy-threshold`: seconds a request that finds every worker busy waits at
    /// the frontend (first come, first served) for one to free before the 503; default:
    /// refused at once.
    #[arg(long, value_name = "SECONDS")]
    pub busy_wait_s: Option<f64>,

    /// Override the model's context length (tokens).
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(1..))]
    pub context_length: Option<u32>,

    /// Override the KV cache block size (tokens per block; the mocker's `block_size`).
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(1..))]
    pub kv_cache_block_size: Option<u32>,

    /// Parse tool calls out of the model's chat output with this parser (vLLM's
    /// names); carried in the model card, so every frontend applies it.
    #[arg(long, value_name = "NAME", value_parser = clap::builder::PossibleValuesParser::new(dynamo_llm::parsers::TOOL_CALL_PARSERS))]
    pub tool_call_parser: Option<String>,

    /// Split the model's thinking into `reasoning_content` with this parser (vLLM's names).
    #[arg(long, value_name = "NAME", value_parser = clap::builder::PossibleValuesParser::new(dynamo_llm::parsers::REASONING_PARSERS))]
    pub reasoning_parser: Option<String>,

    /// A Jinja chat template file replacing the model's own.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,

    /// Accepted for vLLM command lines: `tool_choice: auto` is served whenever the
    /// model has a `--tool-call-parser`.
    #[arg(long)]
    pub enable_auto_tool_choice: bool,

    /// Times a stream broken mid-way (its worker died, stalled or was cut off) is
    /// continued on another worker with the prompt plus the tokens generated so far.
    /// With `in=dyn://…` it is registered with the model; with `out=dyn` it is the
    /// default for models that register none (default 3; 0 turns migration off).
    #[arg(long, value_name = "N")]
    pub migration_limit: Option<u32>,

    /// With `out=dyn`: times a request no worker started (its instance was unreachable,
    /// refused it, did not take it within `DYN_RESPONSE_TIMEOUT`, or lost it before the
    /// first item) is sent to another instance, for every model (default
    /// `DYN_RESEND_LIMIT`, else 3).
    #[arg(long, value_name = "N")]
    pub resend_limit: Option<u32>,

    /// With `out=dyn`: serve only the models registered in this namespace.
    #[arg(long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// With `out=dyn`: keep a model listed after its last worker leaves (scale to zero);
    /// a request for it waits up to `--zero-wait-s` for a worker, else 503 + Retry-After.
    #[arg(long)]
    pub keep_models: bool,

    /// With `--keep-models`: seconds a request waits for a worker of a model at zero
    /// workers (default 30).
    #[arg(long, value_name = "SECONDS")]
    pub zero_wait_s: Option<f64>,

    /// JSON file of engine arguments (`out=mocker`: see docs/mocker.md; `out=vllm`: an
    /// object of vLLM flags, see docs/vllm.md).
    #[arg(long, value_name = "FILE")]
    pub extra_engine_args: Option<PathBuf>,

    /// Disaggregated serving role of an `in=dyn://…` worker: `agg` (prefill and decode
    /// here), `prefill` (take prefill jobs from decode workers; registers no model) or
    /// `decode` (serve the model, send long prefills to prefill workers). See docs/disagg.md.
    #[arg(long, value_name = "ROLE", default_value = "agg", value_parser = parse_role)]
    pub role: DisaggRole,

    /// Decode role: the prefill workers' endpoint (default `NAMESPACE.prefill.generate`,
    /// in the worker's namespace).
    #[arg(long, value_name = "dyn://NS.COMP.EP")]
    pub prefill_endpoint: Option<String>,

    /// Decode role: a prefill goes to a prefill worker only when the prompt's uncached
    /// part is longer than this many tokens...
    #[arg(long, value_name = "TOKENS", default_value_t = dynamo_llm::disagg::DEFAULT_MAX_LOCAL_PREFILL_LENGTH)]
    pub max_local_prefill_length: usize,

    /// ...and fewer than this many prefill jobs are waiting (0: never remote).
    #[arg(long, value_name = "N", default_value_t = dynamo_llm::disagg::DEFAULT_MAX_PREFILL_QUEUE_SIZE)]
    pub max_prefill_queue_size: usize,

    /// Decode role: seconds a remote prefill (queue, prefill, KV transfer) may take
    /// before the worker gives up on it and prefills locally.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = positive_seconds)]
    pub remote_prefill_timeout: f64,

    /// Prefill role: most prefill jobs run at once (the others wait in the queue).
    #[arg(long, value_name = "N", default_value_t = dynamo_llm::disagg::DEFAULT_MAX_CONCURRENT_PREFILLS, value_parser = positive_usize)]
    pub max_concurrent_prefills: usize,

    /// `out=mocker`: bandwidth of a KV handoff in GB/s (overrides `kv_transfer_gbps`).
    #[arg(long, value_name = "GBPS", value_parser = positive_f64)]
    pub kv_transfer_bandwidth: Option<f64>,

    /// Most tokens generated per prompt by `in=text`, `in=stdin` and `in=batch`
    /// (default: up to the context length).
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: Option<u32>,

    /// Flags after `--` go to the engine process of `out=vllm` as given (vLLM's own
    /// flags, e.g. `-- --tensor-parallel-size 2 --enforce-eager`).
    #[arg(last = true, value_name = "ENGINE_FLAGS")]
    pub engine_args: Vec<String>,

    /// More logging: `-v` debug, `-vv` trace (default: `DYN_LOG`, else `info` for
    /// servers and `warn` for text, stdin and batch).
    #[arg(short, long, action = ArgAction::Count)]
    pub verbose: u8,
}

fn positive_usize(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("expected a positive integer, got '{s}'")),
    }
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x < 1e9 => Ok(x),
        _ => Err(format!("expected a positive number of seconds, got '{s}'")),
    }
}

fn positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!("expected a positive number, got '{s}'")),
    }
}

fn parse_role(s: &str) -> Result<DisaggRole, String> {
    s.parse()
}

/// Where requests come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// The OpenAI HTTP service.
    Http,
    /// An interactive chat on stdin/stdout, with history.
    Text,
    /// All of stdin as one prompt; the answer goes to stdout.
    Stdin,
    /// A JSONL file of `{"text": ...}` prompts.
    Batch(PathBuf),
    /// Serve the engine on this endpoint and register the model.
    Endpoint(EndpointId),
}

impl FromStr for Input {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "http" => Ok(Input::Http),
            "text" => Ok(Input::Text),
            "stdin" => Ok(Input::Stdin),
            _ if s.starts_with("batch:") => {
                let file = &s["batch:".len()..];
                if file.is_empty() {
                    return Err("in=batch: needs a file: in=batch:FILE.jsonl".to_string());
                }
                Ok(Input::Batch(PathBuf::from(file)))
            }
            _ if s.starts_with("dyn://") => {
                EndpointId::parse(s).map(Input::Endpoint).map_err(|e| format!("in={s}: {}", e.message()))
            }
            _ => {
                Err(format!("unknown input 'in={s}': expected http, text, stdin, batch:FILE.jsonl or dyn://ns.comp.ep"))
            }
        }
    }
}

/// What answers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Echoes the last user message / the prompt, character by character.
    EchoFull,
    /// Echoes the prompt's token ids behind the preprocessor.
    EchoCore,
    /// The simulated paged-KV-cache engine.
    Mocker,
    /// Models that workers registered in discovery.
    Dyn,
    /// vLLM in a child process (`python -m dynamo.vllm`), this process its frontend.
    Vllm,
}

impl FromStr for Output {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "echo_full" => Ok(Output::EchoFull),
            "echo_core" => Ok(Output::EchoCore),
            "mocker" => Ok(Output::Mocker),
            "dyn" => Ok(Output::Dyn),
            "vllm" => Ok(Output::Vllm),
            _ => Err(format!("unknown output 'out={s}': expected echo_full, echo_core, mocker, dyn or vllm")),
        }
    }
}

impl Output {
    /// The name `out=` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Output::EchoFull => "echo_full",
            Output::EchoCore => "echo_core",
            Output::Mocker => "mocker",
            Output::Dyn => "dyn",
            Output::Vllm => "vllm",
        }
    }
}

/// Where `in=http` keeps `/v1/responses` responses.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesConfig {
    /// In the discovery store (shared by the frontends), not in memory.
    pub in_discovery: bool,
    /// How long a response is kept.
    pub ttl: std::time::Duration,
    /// Most responses kept in memory.
    pub max: usize,
}

/// Everything a run needs, checked.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub input: Input,
    pub output: Output,
    pub model_path: Option<PathBuf>,
    pub model_name: Option<String>,
    pub http_host: String,
    pub http_port: u16,
    /// Limits of `in=http`.
    pub http_limits: dynamo_llm::http::HttpLimits,
    /// `--api-key`.
    pub api_key: Option<String>,
    /// `--cors-origin`, each.
    pub cors_origins: Vec<String>,
    /// `--responses-store`, `--responses-ttl-s`, `--responses-max`.
    pub responses: ResponsesConfig,
    /// `--stream-grace-s`, `--stream-retention-s`, `--stream-buffer-bytes`.
    pub streams: dynamo_llm::http::streams::StreamsConfig,
    pub router_mode: RouterMode,
    /// `out=dyn://ns.comp.ep`: serve only the models registered on this endpoint.
    pub dyn_endpoint: Option<EndpointId>,
    /// `--namespace` with `out=dyn`: serve only the models of this namespace.
    pub namespace: Option<String>,
    /// `--keep-models` with `out=dyn`: the bound on a request's wait at zero workers.
    pub keep_models: Option<std::time::Duration>,
    /// Settings of `--router-mode kv` (the block size comes from each model).
    pub kv_router: dynamo_llm::kv_router::KvRouterConfig,
    pub context_length: Option<u32>,
    pub kv_cache_block_size: Option<u32>,
    /// `--tool-call-parser`, `--reasoning-parser`, `--chat-template`: the model card's.
    pub tool_call_parser: Option<String>,
    pub reasoning_parser: Option<String>,
    pub chat_template: Option<PathBuf>,
    pub migration_limit: Option<u32>,
    /// `--resend-limit`, else `DYN_RESEND_LIMIT` (frontends only).
    pub resend_limit: Option<u32>,
    pub extra_engine_args: Option<PathBuf>,
    /// Role and thresholds of disaggregated serving.
    pub disagg: DisaggConfig,
    /// Decode role: where the prefill workers are.
    pub prefill_endpoint: Option<EndpointId>,
    /// `--kv-transfer-bandwidth` (GB/s).
    pub kv_transfer_gbps: Option<f64>,
    /// Flags after `--`, for the engine process of `out=vllm`.
    pub engine_args: Vec<String>,
    pub max_tokens: Option<u32>,
    pub verbose: u8,
}

impl Flags {
    /// Check the flags together. `stdin_is_terminal` picks the default input.
    pub fn into_config(self, stdin_is_terminal: bool) -> Result<RunConfig, RunError> {
        let usage = |m: String| Err(RunError::Usage(m));
        let (mut input, mut output) = (None, None);
        let mut dyn_endpoint = None;
        for arg in &self.io {
            if let Some(value) = arg.strip_prefix("in=") {
                if input.replace(value.parse::<Input>().map_err(RunError::Usage)?).is_some() {
                    return usage("in= is given twice".to_string());
                }
            } else if let Some(value) = arg.strip_prefix("out=") {
                // `out=dyn://ns.comp.ep`: a frontend bound to the models of one endpoint.
                let parsed = if value.starts_with("dyn://") {
                    let id = EndpointId::parse(value).map_err(|e| RunError::Usage(format!("out={value}: {}", e.message())))?;
                    dyn_endpoint = Some(id);
                    Output::Dyn
                } else {
                    value.parse::<Output>().map_err(RunError::Usage)?
                };
                if output.replace(parsed).is_some() {
                    return usage("out= is given twice".to_string());
                }
            } else {
                return usage(format!("unexpected argument '{arg}': positional arguments are in=INPUT and out=OUTPUT"));
            }
        }
        let input = input.unwrap_or(if stdin_is_terminal { Input::Text } else { Input::Stdin });
        let output = output.unwrap_or(Output::EchoFull);

        if output == Output::Vllm {
            if let Input::Endpoint(id) = &input {
                return usage(format!(
                    "in=dyn://… with out=vllm: run the worker itself, python -m dynamo.vllm --endpoint dyn://{id}"
                ));
            }
            if self.model_path.is_none() {
                return usage("out=vllm needs --model-path (a model folder or a HuggingFace id)".to_string());
            }
        } else if !self.engine_args.is_empty() {
            return usage(format!("flags after -- go to the engine process of out=vllm, not out={}", output.as_str()));
        }
        let router_mode = self.router_mode;
        let kv_flags = [
            ("--kv-overlap-weight", self.kv_overlap_weight != dynamo_llm::kv_router::DEFAULT_OVERLAP_WEIGHT),
            ("--router-temperature", self.router_temperature != dynamo_llm::kv_router::DEFAULT_TEMPERATURE),
            ("--kv-events", self.kv_events),
            ("--no-kv-events", self.no_kv_events),
            ("--router-replica-sync", self.router_replica_sync),
            ("--no-router-replica-sync", self.no_router_replica_sync),
            ("--busy-threshold", self.busy_threshold.is_some()),
            ("--busy-wait-s", self.busy_wait_s.is_some()),
        ];
        if router_mode != RouterMode::Kv || output != Output::Dyn {
            if let Some((flag, _)) = kv_flags.iter().find(|(_, given)| *given) {
                return usage(format!("{flag} applies to out=dyn with --router-mode kv"));
            }
        }
        let kv_router = dynamo_llm::kv_router::KvRouterConfig {
            scheduler: dynamo_llm::kv_router::SchedulerConfig {
                weights: dynamo_llm::kv_router::SelectorWeights {
                    overlap_weight: self.kv_overlap_weight,
                    temperature: self.router_temperature,
                },
                busy_threshold: self.busy_threshold,
                busy_wait: match self.busy_wait_s {
                    None => None,
                    Some(s) if s.is_finite() && s > 0.0 => Some(std::time::Duration::from_secs_f64(s)),
                    Some(s) => return usage(format!("--busy-wait-s must be a number of seconds > 0, got {s}")),
                },
                ..Default::default()
            },
            use_kv_events: !self.no_kv_events,
            replica_sync: !self.no_router_replica_sync,
            ..Default::default()
        };
        kv_router.scheduler.validate().map_err(RunError::Usage)?;
        if output == Output::Dyn {
            if matches!(input, Input::Endpoint(_)) {
                return usage("in=dyn://… serves a local engine; it cannot be combined with out=dyn".to_string());
            }
            for (flag, given) in [
                ("--context-length", self.context_length.is_some()),
                ("--kv-cache-block-size", self.kv_cache_block_size.is_some()),
                ("--tool-call-parser", self.tool_call_parser.is_some()),
                ("--reasoning-parser", self.reasoning_parser.is_some()),
                ("--chat-template", self.chat_template.is_some()),
                ("--model-path", self.model_path.is_some()),
                ("--extra-engine-args", self.extra_engine_args.is_some()),
            ] {
                if given {
                    return usage(format!("{flag} cannot be used with out=dyn: the workers' model cards decide"));
                }
            }
        }
        if self.namespace.is_some() && !matches!(output, Output::Dyn | Output::Vllm) {
            return usage("--namespace applies to out=dyn (a frontend) and out=vllm (its engine's endpoint)".to_string());
        }
        if let (Some(ns), Some(ep)) = (&self.namespace, &dyn_endpoint) {
            if *ns != ep.namespace {
                return usage(format!("--namespace {ns} and out=dyn://{ep} name different namespaces"));
            }
        }
        if self.migration_limit.is_some()
            && !(matches!(output, Output::Dyn | Output::Vllm) || matches!(input, Input::Endpoint(_)))
        {
            return usage(
                "--migration-limit applies to out=dyn (a frontend), out=vllm and in=dyn://… (a worker registering its model)"
                    .to_string(),
            );
        }
        let frontend = matches!(output, Output::Dyn | Output::Vllm);
        if self.resend_limit.is_some() && !frontend {
            return usage("--resend-limit applies to out=dyn and out=vllm (a frontend of discovered models)".to_string());
        }
        let resend_limit = match self.resend_limit {
            Some(n) => Some(n),
            None if frontend => dynamo_llm::remote::resend_limit_from_env().map_err(|e| RunError::Usage(e.to_string()))?,
            None => None,
        };
        let keep_models = self.keep_models_config(output)?;
        if self.extra_engine_args.is_some() && !matches!(output, Output::Mocker | Output::Vllm) {
            return usage(format!("--extra-engine-args is read by out=mocker and out=vllm, not out={}", output.as_str()));
        }
        if self.role != DisaggRole::Agg && !(output == Output::Mocker && matches!(input, Input::Endpoint(_))) {
            return usage(format!(
                "--role {} needs a worker: in=dyn://NS.COMP.EP out=mocker (the mocker is the engine that supports disaggregation)",
                self.role.as_str()
            ));
        }
        if self.prefill_endpoint.is_some() && self.role != DisaggRole::Decode {
            return usage("--prefill-endpoint applies to --role decode".to_string());
        }
        let prefill_endpoint = match &self.prefill_endpoint {
            Some(s) => Some(EndpointId::parse(s).map_err(|e| RunError::Usage(format!("--prefill-endpoint {s}: {}", e.message())))?),
            None => None,
        };
        if self.kv_transfer_bandwidth.is_some() && output != Output::Mocker {
            return usage(format!("--kv-transfer-bandwidth is read by out=mocker only, not out={}", output.as_str()));
        }
        let disagg = DisaggConfig {
            role: self.role,
            max_local_prefill_length: self.max_local_prefill_length,
            max_prefill_queue_size: self.max_prefill_queue_size,
            remote_prefill_timeout: std::time::Duration::from_secs_f64(self.remote_prefill_timeout),
            max_concurrent_prefills: self.max_concurrent_prefills,
        };
        if self.max_tokens.is_some() && matches!(input, Input::Http | Input::Endpoint(_)) {
            return usage(
                "--max-tokens applies to in=text, in=stdin and in=batch; HTTP clients send their own".to_string(),
            );
        }
        if self.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            return usage("--api-key must not be empty".to_string());
        }
        let http_limits = dynamo_llm::http::HttpLimits {
            max_connections: self.http_max_connections,
            max_inflight: self.http_max_inflight,
            header_timeout: std::time::Duration::from_secs_f64(self.http_header_timeout),
            body_timeout: std::time::Duration::from_secs_f64(self.http_body_timeout),
            default_max_tokens: self.default_max_tokens,
            admission: dynamo_llm::http::AdmissionLimits {
                max_inflight_requests: self.max_inflight_requests,
                max_queued_tokens: self.max_queued_tokens,
                ttft_target: self.admission_ttft_ms.map(std::time::Duration::from_millis),
            },
        };
        if let Some(name) = &self.model_name {
            if name.trim().is_empty() {
                return usage("--model-name must not be empty".to_string());
            }
        }
        if self.responses_store == "discovery" && output != Output::Dyn {
            return usage("--responses-store discovery needs out=dyn (a discovery backend to store in)".to_string());
        }
        let responses = ResponsesConfig {
            in_discovery: self.responses_store == "discovery",
            ttl: std::time::Duration::from_secs_f64(self.responses_ttl),
            max: self.responses_max,
        };
        Ok(RunConfig {
            input,
            output,
            model_path: self.model_path,
            model_name: self.model_name,
            http_host: self.http_host,
            http_port: self.http_port,
            http_limits,
            api_key: self.api_key,
            cors_origins: self.cors_origins,
            responses,
            streams: dynamo_llm::http::streams::StreamsConfig {
                buffer_bytes: self.stream_buffer_bytes,
                grace: std::time::Duration::from_secs_f64(self.stream_grace_s),
                retention: std::time::Duration::from_secs_f64(self.stream_retention_s),
            },
            router_mode,
            dyn_endpoint,
            namespace: self.namespace,
            keep_models,
            kv_router,
            context_length: self.context_length,
            kv_cache_block_size: self.kv_cache_block_size,
            tool_call_parser: self.tool_call_parser,
            reasoning_parser: self.reasoning_parser,
            chat_template: self.chat_template,
            migration_limit: self.migration_limit,
            resend_limit,
            extra_engine_args: self.extra_engine_args,
            disagg,
            prefill_endpoint,
            kv_transfer_gbps: self.kv_transfer_bandwidth,
            engine_args: self.engine_args,
            max_tokens: self.max_tokens,
            verbose: self.verbose,
        })
    }
}

impl Flags {
    /// `--keep-models` / `--zero-wait-s`: the zero-wait bound when models are kept.
    fn keep_models_config(&self, output: Output) -> Result<Option<std::time::Duration>, RunError> {
        if !self.keep_models {
            if self.zero_wait_s.is_some() {
                return Err(RunError::Usage("--zero-wait-s applies with --keep-models".to_string()));
            }
            return Ok(None);
        }
        if output != Output::Dyn {
            return Err(RunError::Usage("--keep-models applies to out=dyn (a frontend of discovered models)".to_string()));
        }
        match self.zero_wait_s {
            None => Ok(Some(dynamo_llm::frontend::DEFAULT_ZERO_WAIT)),
            Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(std::time::Duration::from_secs_f64(s))),
            Some(s) => Err(RunError::Usage(format!("--zero-wait-s must be a number of seconds >= 0, got {s}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Result<RunConfig, RunError> {
        let argv = std::iter::once("dynamo-run").chain(args.iter().copied());
        Flags::try_parse_from(argv).map_err(|e| RunError::Usage(e.to_string()))?.into_config(false)
    }

    fn usage_error(args: &[&str]) -> String {
        match config(args) {
            Err(RunError::Usage(m)) => m,
            other => panic!("expected a usage error for {args:?}, got {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let c = config(&[]).unwrap();
        assert_eq!(c.input, Input::Stdin);
        assert_eq!(c.output, Output::EchoFull);
        assert_eq!(c.http_port, 8080);
        assert_eq!(c.http_host, "0.0.0.0");
        assert_eq!(c.http_limits, dynamo_llm::http::HttpLimits::default());
        assert_eq!(c.streams, dynamo_llm::http::streams::StreamsConfig::default());
        let c = config(&["in=http", "--stream-grace-s", "2.5", "--stream-buffer-bytes", "1024"]).unwrap();
        assert_eq!((c.streams.grace, c.streams.buffer_bytes), (std::time::Duration::from_millis(2500), 1024));
        let c = config(&["in=http", "--http-max-inflight", "3", "--http-header-timeout", "0.5", "--cors-origin", "a", "--cors-origin", "b"]).unwrap();
        assert_eq!(c.http_limits.max_inflight, 3);
        assert_eq!(c.http_limits.admission, dynamo_llm::http::AdmissionLimits::default());
        assert_eq!(c.http_limits.header_timeout, std::time::Duration::from_millis(500));
        assert_eq!(c.cors_origins, vec!["a".to_string(), "b".to_string()]);
        let limited = config(&["in=http", "--max-inflight-requests", "4", "--max-queued-tokens", "900"]).unwrap();
        assert_eq!(limited.http_limits.admission.max_inflight_requests, Some(4));
        assert_eq!(limited.http_limits.admission.max_queued_tokens, Some(900));
        let targeted = config(&["in=http", "--admission-ttft-ms", "750"]).unwrap();
        assert_eq!(targeted.http_limits.admission.ttft_target, Some(std::time::Duration::from_millis(750)));
        assert_eq!(c.router_mode, RouterMode::RoundRobin);
        assert!(!c.responses.in_discovery);
        let c = config(&["in=http", "out=dyn", "--responses-store", "discovery", "--responses-ttl-s", "2.5", "--responses-max", "7"]).unwrap();
        assert!(c.responses.in_discovery);
        assert_eq!(c.responses.ttl, std::time::Duration::from_millis(2500));
        assert_eq!(c.responses.max, 7);
        assert!(usage_error(&["in=http", "out=echo_full", "--responses-store", "discovery"]).contains("out=dyn"));
        let argv = ["dynamo-run"];
        assert_eq!(Flags::try_parse_from(argv).unwrap().into_config(true).unwrap().input, Input::Text);
    }

    #[test]
    fn parser_flags_take_vllm_names_and_refuse_others() {
        let c = config(&["in=dyn://ns.mocker.generate", "out=mocker", "--tool-call-parser", "hermes", "--reasoning-parser",
            "qwen3", "--chat-template", "t.jinja", "--enable-auto-tool-choice"])
        .unwrap();
        assert_eq!(c.tool_call_parser.as_deref(), Some("hermes"));
        assert_eq!(c.reasoning_parser.as_deref(), Some("qwen3"));
        assert_eq!(c.chat_template, Some(PathBuf::from("t.jinja")));
        let e = usage_error(&["out=mocker", "--tool-call-parser", "hermes2"]);
        assert!(e.contains("hermes2") && e.contains("llama3_json"), "{e}");
        let e = usage_error(&["out=mocker", "--reasoning-parser", "r1"]);
        assert!(e.contains("deepseek_r1"), "{e}");
        let e = usage_error(&["in=http", "out=dyn", "--tool-call-parser", "hermes"]);
        assert!(e.contains("--tool-call-parser cannot be used with out=dyn"), "{e}");
    }

    #[test]
    fn in_and_out_in_either_order() {
        let c = config(&["out=mocker", "in=dyn://ns.mocker.generate", "--kv-cache-block-size", "32", "-vv"]).unwrap();
        assert_eq!(c.output, Output::Mocker);
        assert_eq!(c.input, Input::Endpoint(EndpointId::parse("ns.mocker.generate").unwrap()));
        assert_eq!(c.kv_cache_block_size, Some(32));
        assert_eq!(c.verbose, 2);
        let c = config(&["in=batch:/tmp/x.jsonl", "--router-mode", "random", "out=dyn"]).unwrap();
        assert_eq!(c.input, Input::Batch(PathBuf::from("/tmp/x.jsonl")));
        assert_eq!(c.router_mode, RouterMode::Random);
        let c = config(&["in=http", "out=dyn", "--router-mode", "kv"]).unwrap();
        assert_eq!(c.router_mode, RouterMode::Kv);
        assert_eq!(c.dyn_endpoint, None);
        assert_eq!(c.kv_router, dynamo_llm::kv_router::KvRouterConfig::default());
    }

    #[test]
    fn out_dyn_endpoint_binds_the_frontend_to_one_endpoint() {
        let c = config(&["in=http", "out=dyn://ns.Processor.chat"]).unwrap();
        assert_eq!(c.output, Output::Dyn);
        assert_eq!(c.dyn_endpoint, Some(EndpointId::parse("ns.Processor.chat").unwrap()));
        assert!(usage_error(&["in=http", "out=dyn://ns.only"]).contains("namespace.component.endpoint"));
        assert!(usage_error(&["in=dyn://a.b.c", "out=dyn://a.b.d"]).contains("out=dyn"));
        let c = config(&["in=http", "out=dyn", "--namespace", "ns"]).unwrap();
        assert_eq!(c.namespace.as_deref(), Some("ns"));
        assert!(usage_error(&["in=http", "out=echo_full", "--namespace", "ns"]).contains("--namespace"));
        assert!(usage_error(&["in=http", "out=dyn://a.b.c", "--namespace", "x"]).contains("different namespaces"));
    }

    #[test]
    fn keep_models_and_its_wait() {
        assert_eq!(config(&["in=http", "out=dyn"]).unwrap().keep_models, None);
        let c = config(&["in=http", "out=dyn", "--keep-models"]).unwrap();
        assert_eq!(c.keep_models, Some(dynamo_llm::frontend::DEFAULT_ZERO_WAIT));
        let c = config(&["in=http", "out=dyn", "--keep-models", "--zero-wait-s", "2.5"]).unwrap();
        assert_eq!(c.keep_models, Some(std::time::Duration::from_millis(2500)));
        assert!(usage_error(&["in=http", "out=echo_full", "--keep-models"]).contains("--keep-models applies to out=dyn"));
        assert!(usage_error(&["in=http", "out=dyn", "--zero-wait-s", "1"]).contains("with --keep-models"));
        assert!(usage_error(&["in=http", "out=dyn", "--keep-models", "--zero-wait-s=-1"]).contains(">= 0"));
        assert!(usage_error(&["in=http", "out=dyn", "--keep-models", "--zero-wait-s", "nan"]).contains(">= 0"));
    }

    #[test]
    fn kv_router_flags() {
        let kv = ["in=http", "out=dyn", "--router-mode", "kv"];
        let with = |extra: &[&str]| config(&[&kv[..], extra].concat());
        let c = with(&["--kv-overlap-weight", "2.5", "--router-temperature", "0.3", "--busy-threshold", "0.9"]).unwrap();
        let s = c.kv_router.scheduler;
        assert_eq!((s.weights.overlap_weight, s.weights.temperature, s.busy_threshold), (2.5, 0.3, Some(0.9)));
        assert!(c.kv_router.use_kv_events);
        assert!(!with(&["--no-kv-events"]).unwrap().kv_router.use_kv_events);
        assert!(with(&["--no-kv-events", "--kv-events"]).unwrap().kv_router.use_kv_events, "the last one wins");
        assert!(c.kv_router.replica_sync, "replica sync is on by default");
        assert!(!with(&["--no-router-replica-sync"]).unwrap().kv_router.replica_sync);
        let err = |extra: &[&str]| match with(extra) {
            Err(RunError::Usage(m)) => m,
            other => panic!("expected a usage error for {extra:?}, got {other:?}"),
        };
        assert!(err(&["--busy-threshold", "1.5"]).contains("busy threshold"));
        assert_eq!(s.busy_wait, None, "refused at once by default");
        let held = with(&["--busy-threshold", "0.9", "--busy-wait-s", "2.5"]).unwrap();
        assert_eq!(held.kv_router.scheduler.busy_wait, Some(std::time::Duration::from_millis(2500)));
        assert!(err(&["--busy-wait-s", "2"]).contains("with a busy threshold"));
        assert!(err(&["--busy-threshold", "0.9", "--busy-wait-s", "0"]).contains("> 0"));
        assert!(err(&["--busy-threshold", "0.9", "--busy-wait-s", "inf"]).contains("> 0"));
        assert!(err(&["--router-temperature=-1"]).contains("temperature"));
        assert!(err(&["--kv-overlap-weight", "nan"]).contains("overlap weight"));
        assert!(usage_error(&["in=http", "out=dyn", "--busy-threshold", "0.5"]).contains("--router-mode kv"));
        assert!(usage_error(&["in=http", "--no-kv-events"]).contains("--router-mode kv"));
    }

    #[test]
    fn bad_combinations_are_usage_errors() {
        assert!(usage_error(&["in=dyn://a.b.c", "out=dyn"]).contains("out=dyn"));
        assert!(usage_error(&["in=http", "out=dyn", "--context-length", "5"]).contains("--context-length"));
        assert!(usage_error(&["out=dyn", "--kv-cache-block-size", "5"]).contains("--kv-cache-block-size"));
        assert!(usage_error(&["out=vllm"]).contains("out=vllm needs --model-path"));
        assert!(usage_error(&["in=dyn://a.b.c", "out=vllm", "--model-path", "m"]).contains("python -m dynamo.vllm"));
        assert!(usage_error(&["out=mocker", "--", "--enforce-eager"]).contains("flags after --"));
        assert!(usage_error(&["in=http", "in=text"]).contains("twice"));
        assert!(usage_error(&["in=nope"]).contains("unknown input"));
        assert!(usage_error(&["out=nope"]).contains("unknown output"));
        assert!(usage_error(&["in=dyn://a.b"]).contains("namespace.component.endpoint"));
        assert!(usage_error(&["in=batch:"]).contains("FILE"));
        assert!(usage_error(&["model.gguf"]).contains("unexpected argument"));
        assert!(usage_error(&["out=echo_full", "--extra-engine-args", "x.json"]).contains("out=mocker"));
        assert!(usage_error(&["in=http", "--max-tokens", "3"]).contains("--max-tokens"));
        assert!(usage_error(&["--http-port", "nope"]).contains("--http-port"));
        assert!(usage_error(&["--http-max-inflight", "0"]).contains("--http-max-inflight"));
        assert!(usage_error(&["--max-inflight-requests", "0"]).contains("--max-inflight-requests"));
        assert!(usage_error(&["--max-queued-tokens", "0"]).contains("--max-queued-tokens"));
        assert!(usage_error(&["--admission-ttft-ms", "0"]).contains("--admission-ttft-ms"));
        assert!(usage_error(&["--http-header-timeout", "0"]).contains("--http-header-timeout"));
        assert!(usage_error(&["in=http", "--api-key", " "]).contains("--api-key"));
        assert!(usage_error(&["--context-length", "0"]).contains("--context-length"));
        assert!(usage_error(&["in=http", "out=mocker", "--role", "decode"]).contains("in=dyn://"));
        assert!(usage_error(&["in=dyn://a.b.c", "out=echo_core", "--role", "prefill"]).contains("out=mocker"));
        assert!(usage_error(&["in=dyn://a.b.c", "out=mocker", "--role", "both"]).contains("agg, prefill or decode"));
        assert!(usage_error(&["in=dyn://a.b.c", "out=mocker", "--prefill-endpoint", "a.p.g"]).contains("--role decode"));
        assert!(usage_error(&["in=dyn://a.b.c", "out=mocker", "--role", "decode", "--prefill-endpoint", "a.p"]).contains("--prefill-endpoint"));
        assert!(usage_error(&["out=echo_full", "--kv-transfer-bandwidth", "5"]).contains("out=mocker"));
        assert!(usage_error(&["out=mocker", "--kv-transfer-bandwidth", "0"]).contains("--kv-transfer-bandwidth"));
    }

    #[test]
    fn disaggregation_flags() {
        let c = config(&["in=dyn://ns.w.generate", "out=mocker"]).unwrap();
        assert_eq!(c.disagg, DisaggConfig::default());
        let c = config(&[
            "in=dyn://ns.w.generate", "out=mocker", "--role", "decode", "--prefill-endpoint", "dyn://ns.pre.generate",
            "--max-local-prefill-length", "64", "--max-prefill-queue-size", "0", "--remote-prefill-timeout", "2.5",
            "--kv-transfer-bandwidth", "12.5",
        ])
        .unwrap();
        assert_eq!(c.disagg.role, DisaggRole::Decode);
        assert_eq!((c.disagg.max_local_prefill_length, c.disagg.max_prefill_queue_size), (64, 0));
        assert_eq!(c.disagg.remote_prefill_timeout, std::time::Duration::from_millis(2500));
        assert_eq!(c.prefill_endpoint, Some(EndpointId::parse("ns.pre.generate").unwrap()));
        assert_eq!(c.kv_transfer_gbps, Some(12.5));
    }
}
