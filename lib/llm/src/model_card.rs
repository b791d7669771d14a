//! The model deployment card: everything a frontend needs to serve a model that a
//! worker registered — its name, kind, context length, KV block size, and the
//! tokenizer and chat template themselves (embedded, so the card is self-contained
//! JSON that can be shipped to a frontend on another machine).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::parsers::{reasoning_parser, tool_call_parser, UnknownParser};

/// Context length used when neither `config.json` nor `tokenizer_config.json` says.
pub const DEFAULT_CONTEXT_LENGTH: u32 = 8192;

/// KV cache block size (tokens per block) used unless overridden.
pub const DEFAULT_KV_CACHE_BLOCK_SIZE: u32 = 16;

/// The built-in card's model name when neither a model folder nor a name is given (the
/// name the README's requests use), for `dynamo-run` and `register_llm` alike.
pub const DEFAULT_MODEL_NAME: &str = "dynamo";

/// What a registered model serves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// An OpenAI engine (the worker templates and tokenizes itself): frontends route
    /// both chat and completions requests to it, as [`crate::engine::OpenAIEngine`]
    /// has both methods. A worker that only does chat answers completions with its
    /// own error.
    Chat,
    /// An OpenAI engine that serves completions only.
    Completions,
    /// Token level: `PreprocessedRequest` in, `LLMEngineOutput` out; the frontend
    /// preprocesses and detokenizes with this card.
    #[default]
    Backend,
}

impl ModelKind {
    /// The name used in JSON and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelKind::Chat => "chat",
            ModelKind::Completions => "completions",
            ModelKind::Backend => "backend",
        }
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A card could not be built or is invalid.
#[derive(Debug, thiserror::Error)]
pub enum CardError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A file is not the JSON we expect.
    #[error("{path}: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    /// The tokenizer could not be loaded.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The card has no tokenizer but one is needed.
    #[error("model {0} has no tokenizer")]
    NoTokenizer(String),
    /// A value is out of range.
    #[error("{0}")]
    Invalid(String),
    /// A parser name is not registered; the message lists the known names.
    #[error(transparent)]
    UnknownParser(#[from] UnknownParser),
    /// The model path is not a folder.
    #[error("model path {} is not a directory (a HuggingFace model folder with tokenizer.json is expected)", .0.display())]
    NotADirectory(PathBuf),
}

/// What a worker builds its model card from: a HuggingFace folder or the built-in card,
/// the kind it serves, and overrides. `dynamo-run` and the bindings' `register_llm` (and
/// `OpenAIPreprocessor`) build their cards with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CardOptions {
    /// A HuggingFace model folder; `None`: the built-in card ([`ModelDeploymentCard::builtin`]).
    pub model_path: Option<PathBuf>,
    /// The public name; default the folder's name, or [`DEFAULT_MODEL_NAME`] for the built-in card.
    pub model_name: Option<String>,
    /// What the worker serves.
    pub kind: ModelKind,
    /// Overrides the card's context length (at least 1).
    pub context_length: Option<u32>,
    /// Overrides the card's KV block size (at least 1).
    pub kv_cache_block_size: Option<u32>,
    /// The tool-call parser for the model's output (`--tool-call-parser`; vLLM's names).
    pub tool_call_parser: Option<String>,
    /// The reasoning parser for the model's output (`--reasoning-parser`; vLLM's names).
    pub reasoning_parser: Option<String>,
    /// A Jinja chat template file that replaces the model's templates (`--chat-template`).
    pub chat_template: Option<PathBuf>,
}

impl CardOptions {
    /// Build the card. Reads the model folder: blocking work. A `backend` card's
    /// tokenizer must load, since a frontend cannot serve the model without it.
    pub fn build(&self) -> Result<ModelDeploymentCard, CardError> {
        let mut card = match &self.model_path {
            Some(path) if !path.is_dir() => return Err(CardError::NotADirectory(path.clone())),
            Some(path) => ModelDeploymentCard::from_hf_dir(path, self.model_name.as_deref())?,
            None => ModelDeploymentCard::builtin(self.model_name.as_deref().unwrap_or(DEFAULT_MODEL_NAME)),
        };
        card = card.with_kind(self.kind);
        if let Some(n) = self.context_length {
            card = card.with_context_length(n)?;
        }
        if let Some(n) = self.kv_cache_block_size {
            card = card.with_kv_cache_block_size(n)?;
        }
        if let Some(name) = &self.tool_call_parser {
            tool_call_parser(name, None)?;
            card.tool_call_parser = Some(name.clone());
        }
        if let Some(name) = &self.reasoning_parser {
            reasoning_parser(name, true)?;
            card.reasoning_parser = Some(name.clone());
        }
        if let Some(path) = &self.chat_template {
            let text = std::fs::read_to_string(path).map_err(|source| CardError::Io { path: path.clone(), source })?;
            card.chat_template = Some(text);
            card.tool_use_template = None;
        }
        if self.kind == ModelKind::Backend {
            card.tokenizer()?;
        }
        Ok(card)
    }
}

/// Everything a frontend needs to serve one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelDeploymentCard {
    /// The name clients use (`model` in requests).
    pub display_name: String,
    /// What the registering worker serves.
    #[serde(default)]
    pub kind: ModelKind,
    /// Most tokens (prompt + completion) of one request.
    pub context_length: u32,
    /// Tokens per KV cache block (the KV router hashes blocks of this size); never 0.
    #[serde(default = "default_block_size", deserialize_with = "block_size_at_least_one")]
    pub kv_cache_block_size: u32,
    /// The full `tokenizer.json` text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_json: Option<String>,
    /// The chat template (Jinja) used without tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// The chat template used when a request has tools (`tool_use` in a named list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_template: Option<String>,
    /// The BOS token's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token: Option<String>,
    /// The EOS token's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token: Option<String>,
    /// Ids that end a generation.
    #[serde(default)]
    pub eos_token_ids: Vec<u32>,
    /// The tool-call parser a frontend runs on this model's chat output (a name of
    /// [`crate::parsers::TOOL_CALL_PARSERS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_parser: Option<String>,
    /// The reasoning parser a frontend runs on this model's chat output (a name of
    /// [`crate::parsers::REASONING_PARSERS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_parser: Option<String>,
}

fn default_block_size() -> u32 {
    DEFAULT_KV_CACHE_BLOCK_SIZE
}

fn block_size_at_least_one<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = u32::deserialize(d)?;
    if n == 0 {
        return Err(serde::de::Error::custom("kv_cache_block_size must be at least 1"));
    }
    Ok(n)
}

impl ModelDeploymentCard {
    /// A card from a HuggingFace model folder (`tokenizer.json`,
    /// `tokenizer_config.json`, `config.json`, `generation_config.json`; weights are
    /// not read). The name defaults to the folder's name.
    pub fn from_hf_dir(path: impl AsRef<Path>, name_override: Option<&str>) -> Result<Self, CardError> {
        let dir = path.as_ref();
        let dir = dir.canonicalize().map_err(|source| CardError::Io { path: dir.to_path_buf(), source })?;
        let display_name = match name_override {
            Some(name) => name.to_string(),
            None => dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".to_string()),
        };

        let tokenizer_json = read_optional(&dir.join("tokenizer.json"))?;
        let tokenizer = tokenizer_json.as_deref().map(Tokenizer::from_json).transpose()?;
        let tokenizer_config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let special_tokens_map = read_json(&dir.join("special_tokens_map.json"))?.unwrap_or(Value::Null);
        let config = read_json(&dir.join("config.json"))?.unwrap_or(Value::Null);
        let generation_config = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);

        let (mut chat_template, tool_use_template) = chat_templates(tokenizer_config.get("chat_template"));
        if chat_template.is_none() {
            chat_template = read_optional(&dir.join("chat_template.jinja"))?;
        }
        let bos_token =
            token_text(tokenizer_config.get("bos_token")).or_else(|| token_text(special_tokens_map.get("bos_token")));
        let eos_token =
            token_text(tokenizer_config.get("eos_token")).or_else(|| token_text(special_tokens_map.get("eos_token")));

        let mut eos_token_ids = Vec::new();
        for source in [generation_config.get("eos_token_id"), config.get("eos_token_id")] {
            for id in token_ids(source) {
                if !eos_token_ids.contains(&id) {
                    eos_token_ids.push(id);
                }
            }
        }
        if let (Some(tok), Some(eos)) = (&tokenizer, &eos_token) {
            if let Some(id) = tok.token_to_id(eos) {
                if !eos_token_ids.contains(&id) {
                    eos_token_ids.push(id);
                }
            }
        }

        let context_length = positive_u32(config.get("max_position_embeddings"))
            .or_else(|| positive_u32(tokenizer_config.get("model_max_length")))
            .unwrap_or(DEFAULT_CONTEXT_LENGTH);

        Ok(ModelDeploymentCard {
            display_name,
            kind: ModelKind::Backend,
            context_length,
            kv_cache_block_size: DEFAULT_KV_CACHE_BLOCK_SIZE,
            tokenizer_json,
            chat_template,
            tool_use_template,
            bos_token,
            eos_token,
            eos_token_ids,
            tool_call_parser: None,
            reasoning_parser: None,
        })
    }

    /// A minimal card that works offline: a byte-level tokenizer (every byte one
    /// token, plus `<unk>`, `<s>`, `</s>`) and a plain chat template that writes
    /// `<|role|>\ncontent\n` per message and `<|assistant|>\n` as the prompt.
    pub fn builtin(name: &str) -> Self {
        ModelDeploymentCard {
            display_name: name.to_string(),
            kind: ModelKind::Backend,
            context_length: DEFAULT_CONTEXT_LENGTH,
            kv_cache_block_size: DEFAULT_KV_CACHE_BLOCK_SIZE,
            tokenizer_json: Some(byte_level_tokenizer_json()),
            chat_template: Some(BUILTIN_CHAT_TEMPLATE.to_string()),
            tool_use_template: None,
            bos_token: Some("<s>".to_string()),
            eos_token: Some("</s>".to_string()),
            eos_token_ids: vec![EOS_ID],
            tool_call_parser: None,
            reasoning_parser: None,
        }
    }

    /// The same card with another kind.
    pub fn with_kind(mut self, kind: ModelKind) -> Self {
        self.kind = kind;
        self
    }

    /// Override the context length (must be at least 1).
    pub fn with_context_length(mut self, context_length: u32) -> Result<Self, CardError> {
        if context_length == 0 {
            return Err(CardError::Invalid("context length must be at least 1".to_string()));
        }
        self.context_length = context_length;
        Ok(self)
    }

    /// Override the KV cache block size (must be at least 1).
    pub fn with_kv_cache_block_size(mut self, block_size: u32) -> Result<Self, CardError> {
        if block_size == 0 {
            return Err(CardError::Invalid("kv_cache_block_size must be at least 1".to_string()));
        }
        self.kv_cache_block_size = block_size;
        Ok(self)
    }

    /// Load the embedded tokenizer.
    pub fn tokenizer(&self) -> Result<Tokenizer, CardError> {
        let json = self.tokenizer_json.as_deref().ok_or_else(|| CardError::NoTokenizer(self.display_name.clone()))?;
        Ok(Tokenizer::from_json(json)?)
    }

    /// A stable hash of the card (hex SHA-256 of its JSON): a worker and a frontend
    /// that hold the same card agree on it.
    pub fn checksum(&self) -> String {
        // Serializing a struct of strings, numbers and lists cannot fail.
        let json = serde_json::to_vec(self).unwrap_or_default();
        Sha256::digest(&json).iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The builtin card's chat template.
const BUILTIN_CHAT_TEMPLATE: &str =
    "{% for message in messages %}<|{{ message.role }}|>\n{{ message.content }}\n{% endfor %}\
{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

/// Ids of the builtin tokenizer's special tokens; byte `b` is id `b + 3`.
const UNK_ID: u32 = 0;
const BOS_ID: u32 = 1;
const EOS_ID: u32 = 2;
const FIRST_BYTE_ID: u32 = 3;

/// The character the byte-level (GPT-2) alphabet uses for each byte: printable bytes
/// stand for themselves, the others are shifted past U+0100 in order.
fn byte_level_char(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(byte) {
        return char::from(byte);
    }
    let shifted = (0..byte).filter(|b| !printable(*b)).count() as u32;
    char::from_u32(256 + shifted).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// The `tokenizer.json` text of the builtin byte-level tokenizer: a BPE model with
/// one token per byte and no merges, ByteLevel pre-tokenizer and decoder.
pub fn byte_level_tokenizer_json() -> String {
    let mut vocab = serde_json::Map::new();
    let specials = [(UNK_ID, "<unk>"), (BOS_ID, "<s>"), (EOS_ID, "</s>")];
    for (id, content) in specials {
        vocab.insert(content.to_string(), Value::from(id));
    }
    for byte in 0..=255u8 {
        vocab.insert(byte_level_char(byte).to_string(), Value::from(FIRST_BYTE_ID + u32::from(byte)));
    }
    let added_tokens: Vec<Value> = specials
        .iter()
        .map(|(id, content)| {
            serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let byte_level =
        serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens,
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []}
    })
    .to_string()
}

fn read_optional(path: &Path) -> Result<Option<String>, CardError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CardError::Io { path: path.to_path_buf(), source }),
    }
}

fn read_json(path: &Path) -> Result<Option<Value>, CardError> {
    let Some(text) = read_optional(path)? else { return Ok(None) };
    serde_json::from_str(&text).map(Some).map_err(|source| CardError::Json { path: path.to_path_buf(), source })
}

/// `chat_template`: a string, or a list of `{name, template}` (`default`, `tool_use`).
fn chat_templates(value: Option<&Value>) -> (Option<String>, Option<String>) {
    match value {
        Some(Value::String(s)) => (Some(s.clone()), None),
        Some(Value::Array(list)) => {
            let named = |wanted: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some(wanted))
                    .and_then(|t| t.get("template").and_then(Value::as_str))
                    .map(str::to_string)
            };
            (named("default"), named("tool_use"))
        }
        _ => (None, None),
    }
}

/// A special token: `"</s>"` or `{"content": "</s>", ...}`.
fn token_text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// `eos_token_id`: an int or a list of ints.
fn token_ids(value: Option<&Value>) -> Vec<u32> {
    let as_id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    match value {
        Some(Value::Array(list)) => list.iter().filter_map(as_id).collect(),
        Some(v) => as_id(v).into_iter().collect(),
        None => Vec::new(),
    }
}

/// A positive length; tokenizer configs use huge floats (1e30) for "no limit", which
/// are ignored.
fn positive_u32(value: Option<&Value>) -> Option<u32> {
    let n = value?.as_f64()?;
    (n >= 1.0 && n <= f64::from(u32::MAX)).then_some(n as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_card_round_trips_as_json() {
        let card = ModelDeploymentCard::builtin("echo").with_kind(ModelKind::Chat);
        let json = serde_json::to_string(&card).unwrap();
        assert!(json.contains("\"kind\":\"chat\""));
        let back: ModelDeploymentCard = serde_json::from_str(&json).unwrap();
        assert_eq!(back, card);
        assert_eq!(back.checksum(), card.checksum());
        let tok = back.tokenizer().unwrap();
        assert_eq!(tok.token_to_id("</s>"), Some(EOS_ID));
        assert_eq!(tok.decode(&tok.encode("héllo 🦀", false).unwrap(), true).unwrap(), "héllo 🦀");
    }

    #[test]
    fn checksum_changes_with_the_card() {
        let a = ModelDeploymentCard::builtin("a");
        let b = a.clone().with_context_length(100).unwrap();
        assert_ne!(a.checksum(), b.checksum());
        assert_eq!(a.checksum().len(), 64);
    }

    #[test]
    fn zero_block_size_is_rejected() {
        let mut v = serde_json::to_value(ModelDeploymentCard::builtin("a")).unwrap();
        v["kv_cache_block_size"] = 0.into();
        let e = serde_json::from_value::<ModelDeploymentCard>(v.clone()).unwrap_err();
        assert!(e.to_string().contains("kv_cache_block_size"));
        v.as_object_mut().unwrap().remove("kv_cache_block_size");
        assert_eq!(serde_json::from_value::<ModelDeploymentCard>(v).unwrap().kv_cache_block_size, 16);
        assert!(ModelDeploymentCard::builtin("a").with_kv_cache_block_size(0).is_err());
    }

    #[test]
    fn config_value_shapes() {
        let list = serde_json::json!([{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]);
        assert_eq!(chat_templates(Some(&list)), (Some("D".into()), Some("T".into())));
        assert_eq!(token_text(Some(&serde_json::json!({"content": "</s>"}))), Some("</s>".into()));
        assert_eq!(token_ids(Some(&serde_json::json!([1, 2]))), vec![1, 2]);
        assert_eq!(token_ids(Some(&serde_json::json!(7))), vec![7]);
        assert_eq!(positive_u32(Some(&serde_json::json!(1e30))), None);
        assert_eq!(positive_u32(Some(&serde_json::json!(2048))), Some(2048));
    }

    #[test]
    fn byte_level_alphabet_is_a_bijection() {
        let chars: std::collections::HashSet<char> = (0..=255u8).map(byte_level_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(byte_level_char(b' '), 'Ġ');
        assert_eq!(byte_level_char(b'\n'), 'Ċ');
    }

    #[test]
    fn card_options_build_the_builtin_card_with_overrides() {
        let card = CardOptions { kind: ModelKind::Chat, context_length: Some(64), kv_cache_block_size: Some(4), ..Default::default() }
            .build()
            .unwrap();
        assert_eq!(card.display_name, DEFAULT_MODEL_NAME);
        assert_eq!((card.kind, card.context_length, card.kv_cache_block_size), (ModelKind::Chat, 64, 4));
        let named = CardOptions { model_name: Some("m".to_string()), ..Default::default() }.build().unwrap();
        assert_eq!(named.display_name, "m");
        assert_eq!(named.kind, ModelKind::Backend);
    }

    #[test]
    fn card_options_refuse_a_missing_folder_and_zero_overrides() {
        let missing = CardOptions { model_path: Some(PathBuf::from("/nonexistent/model")), ..Default::default() };
        assert!(matches!(missing.build(), Err(CardError::NotADirectory(_))));
        let zero = CardOptions { context_length: Some(0), ..Default::default() };
        assert!(matches!(zero.build(), Err(CardError::Invalid(_))));
    }

    #[test]
    fn card_options_carry_the_parsers_and_a_template_file_and_refuse_unknown_parsers() {
        let file = std::env::temp_dir().join(format!("dynamo-card-template-{}.jinja", std::process::id()));
        std::fs::write(&file, "T{{ tools | length }}").unwrap();
        let options = CardOptions {
            tool_call_parser: Some("hermes".into()),
            reasoning_parser: Some("qwen3".into()),
            chat_template: Some(file.clone()),
            ..Default::default()
        };
        let card = options.build();
        std::fs::remove_file(&file).unwrap();
        let card = card.unwrap();
        assert_eq!(card.tool_call_parser.as_deref(), Some("hermes"));
        assert_eq!(card.reasoning_parser.as_deref(), Some("qwen3"));
        assert_eq!(card.chat_template.as_deref(), Some("T{{ tools | length }}"));
        let back: ModelDeploymentCard = serde_json::from_str(&serde_json::to_string(&card).unwrap()).unwrap();
        assert_eq!(back, card);
        // Old cards (no parser fields) still load.
        assert_eq!(ModelDeploymentCard::builtin("a").tool_call_parser, None);

        let e = CardOptions { tool_call_parser: Some("hermes2".into()), ..Default::default() }.build().unwrap_err();
        assert!(matches!(&e, CardError::UnknownParser(_)) && e.to_string().contains("known: deepseek_v3, hermes"), "{e}");
        let e = CardOptions { reasoning_parser: Some("r1".into()), ..Default::default() }.build().unwrap_err();
        assert!(e.to_string().contains("known: deepseek_r1, qwen3"), "{e}");
        let e = CardOptions { chat_template: Some("/nonexistent/t.jinja".into()), ..Default::default() }.build().unwrap_err();
        assert!(matches!(e, CardError::Io { .. }));
    }

    #[test]
    fn a_backend_card_needs_a_tokenizer_that_loads() {
        let dir = std::env::temp_dir().join(format!("dynamo-card-options-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let backend = CardOptions { model_path: Some(dir.clone()), ..Default::default() };
        let result = backend.build();
        let chat = CardOptions { model_path: Some(dir.clone()), kind: ModelKind::Chat, ..Default::default() }.build();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(result, Err(CardError::NoTokenizer(_))), "{result:?}");
        assert!(chat.is_ok(), "{chat:?}");
    }

    /// Manual check against a real model folder (not needed by the suite).
    #[test]
    #[ignore]
    fn tinyllama_card() {
        let card = ModelDeploymentCard::from_hf_dir("/work/shared/models/tinyllama-chat", None).unwrap();
        assert_eq!(card.display_name, "tinyllama-chat");
        assert_eq!(card.context_length, 2048);
        assert_eq!(card.eos_token_ids, vec![2]);
        assert_eq!(card.bos_token.as_deref(), Some("<s>"));
        assert!(card.chat_template.is_some());
    }
}
