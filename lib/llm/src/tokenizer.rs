//! A thin, cheaply cloned wrapper over a HuggingFace `tokenizers::Tokenizer`, and an
//! owned incremental decoder that only ever yields complete UTF-8 text.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

/// A tokenizer failed to load, encode or decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tokenizer: {0}")]
pub struct TokenizerError(pub String);

impl TokenizerError {
    fn from_hf(e: tokenizers::Error) -> Self {
        TokenizerError(e.to_string())
    }
}

/// A loaded tokenizer; clones share one instance.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// The space marker of a SentencePiece-style (`Metaspace`) pre-tokenizer, whose
    /// decoder drops a token's leading space when the token is decoded alone.
    space_marker: Option<char>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("vocab_size", &self.vocab_size()).finish()
    }
}

impl Tokenizer {
    /// Load from the text of a `tokenizer.json`.
    pub fn from_json(json: &str) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_str(json).map_err(TokenizerError::from_hf)?;
        Ok(Tokenizer::from_hf(inner))
    }

    /// Load a `tokenizer.json` file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref();
        let inner =
            tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError(format!("{}: {e}", path.display())))?;
        Ok(Tokenizer::from_hf(inner))
    }

    /// Wrap an already built tokenizer.
    pub fn from_hf(inner: tokenizers::Tokenizer) -> Self {
        let space_marker = inner.get_pre_tokenizer().and_then(space_marker);
        Tokenizer { inner: Arc::new(inner), space_marker }
    }

    /// The underlying HuggingFace tokenizer.
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The `tokenizer.json` text of this tokenizer.
    pub fn to_json(&self) -> Result<String, TokenizerError> {
        self.inner.to_string(false).map_err(TokenizerError::from_hf)
    }

    /// Token ids of `text`. With `add_special_tokens` the tokenizer's post-processor
    /// adds what the model expects around a sequence (a BOS, typically).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        // Ids only: tracking offsets costs memory per token that a big prompt multiplies.
        let encoding = self.inner.encode_fast(text, add_special_tokens).map_err(TokenizerError::from_hf)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Token ids of a prompt: special tokens are added unless the text already starts
    /// with `bos_token` (a chat template that writes the BOS itself), so a BOS is never
    /// doubled.
    pub fn encode_prompt(&self, text: &str, bos_token: Option<&str>) -> Result<Vec<u32>, TokenizerError> {
        let has_bos = bos_token.is_some_and(|bos| !bos.is_empty() && text.starts_with(bos));
        self.encode(text, !has_bos)
    }

    /// The text of `ids` (lossy: an incomplete UTF-8 sequence becomes U+FFFD).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner.decode(ids, skip_special_tokens).map_err(TokenizerError::from_hf)
    }

    /// The text of one token as a response lists it (log probabilities): the token
    /// decoded alone, special tokens kept, with the leading spaces its vocabulary piece
    /// stands for. A SentencePiece-style decoder strips the first space of a decoded
    /// text, so `▁lies` alone decodes to `lies`; the piece's markers put it back
    /// (`" lies"`), as vLLM's server lists tokens.
    pub fn token_text(&self, id: u32) -> String {
        let text = self.decode(&[id], false).unwrap_or_default();
        let (Some(marker), Some(piece)) = (self.space_marker, self.inner.id_to_token(id)) else {
            return text;
        };
        let markers = piece.chars().take_while(|&c| c == marker).count();
        let spaces = text.chars().take_while(|&c| c == ' ').count();
        if markers > spaces {
            format!("{}{text}", " ".repeat(markers - spaces))
        } else {
            text
        }
    }

    /// The text of token `id` as a response lists it when the sampled tokens before it
    /// were `context` (oldest first): [`Tokenizer::token_text`], except that a token
    /// ending in half a character (a byte-fallback token) is given the text it completes
    /// with up to four context tokens, and `""` when it completes nothing yet — what
    /// vLLM's server lists for it.
    pub fn token_text_after(&self, context: &[u32], id: u32) -> String {
        let text = self.token_text(id);
        if !text.ends_with(char::REPLACEMENT_CHARACTER) {
            return text;
        }
        let decode = |ids: &[u32]| self.decode(ids, false).unwrap_or_default();
        let start = context.len().saturating_sub(UTF8_CONTEXT_TOKENS);
        for from in (start..context.len()).rev() {
            let context = &context[from..];
            let full = decode(&[context, &[id]].concat());
            if full.ends_with(char::REPLACEMENT_CHARACTER) {
                continue;
            }
            // Context tokens that are themselves half characters belong to this text.
            let clean = context
                .iter()
                .rposition(|&c| !decode(&[c]).ends_with(char::REPLACEMENT_CHARACTER))
                .map_or(0, |last| last + 1);
            let prefix = decode(&context[..clean]);
            let common = full.char_indices().zip(prefix.chars()).take_while(|((_, a), b)| a == b).count();
            let cut = full.char_indices().nth(common).map_or(full.len(), |(i, _)| i);
            return full[cut..].to_string();
        }
        String::new()
    }

    /// The id of a token (added tokens included).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token of an id (added tokens included).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// An incremental decoder over this tokenizer.
    pub fn decode_stream(&self, skip_special_tokens: bool) -> IncrementalDecoder {
        IncrementalDecoder::new(self.clone(), skip_special_tokens)
    }

    /// An incremental decoder that continues `prompt`: the first generated token is
    /// decoded after the prompt's last tokens, so it keeps the leading space a
    /// SentencePiece decoder strips at the start of a text (`" lies"`, not `"lies"`),
    /// as vLLM's detokenizer, primed with the prompt, decodes it.
    pub fn decode_stream_after(&self, prompt: &[u32], skip_special_tokens: bool) -> IncrementalDecoder {
        let mut decoder = IncrementalDecoder::new(self.clone(), skip_special_tokens);
        let start = prompt.len().saturating_sub(PRIMING_TOKENS);
        decoder.ids.extend_from_slice(&prompt[start..]);
        decoder.read_offset = decoder.ids.len();
        decoder
    }
}

/// Sampled tokens a half character in a response's token list may complete (a UTF-8
/// character has at most four bytes).
pub const UTF8_CONTEXT_TOKENS: usize = 4;

/// Prompt tokens an incremental decoder is primed with: enough context for any
/// decoder that merges across tokens (vLLM primes its own with five or more).
const PRIMING_TOKENS: usize = 6;

/// The space marker of a `Metaspace` pre-tokenizer (alone or in a sequence).
fn space_marker(pre: &tokenizers::PreTokenizerWrapper) -> Option<char> {
    use tokenizers::PreTokenizerWrapper as Pre;
    match pre {
        Pre::Metaspace(m) => Some(m.get_replacement()),
        Pre::Sequence(seq) => seq.as_ref().iter().find_map(space_marker),
        _ => None,
    }
}

/// Turns token ids, one at a time, into text deltas.
///
/// Decoding a token on its own is wrong in general (a byte-level token may be half of
/// a UTF-8 character; SentencePiece decoders drop the leading space of the first
/// token), so the decoder re-decodes a short window: the ids already emitted since
/// the last complete step (`prefix`) plus the new ones, and yields what the new ids
/// added once that text is longer and does not end in U+FFFD. Emitted ids before the
/// window are dropped, so memory stays bounded on long streams.
pub struct IncrementalDecoder {
    tokenizer: Tokenizer,
    skip_special_tokens: bool,
    /// Ids from the start of the window.
    ids: Vec<u32>,
    /// `ids[..read_offset]` have been emitted as text.
    read_offset: usize,
}

impl IncrementalDecoder {
    fn new(tokenizer: Tokenizer, skip_special_tokens: bool) -> Self {
        IncrementalDecoder { tokenizer, skip_special_tokens, ids: Vec::new(), read_offset: 0 }
    }

    /// Add one id; returns the new text when it forms complete characters.
    pub fn step(&mut self, id: u32) -> Result<Option<String>, TokenizerError> {
        self.ids.push(id);
        let prefix = self.tokenizer.decode(&self.ids[..self.read_offset], self.skip_special_tokens)?;
        let full = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        if full.len() <= prefix.len() || full.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(None);
        }
        let Some(delta) = full.strip_prefix(prefix.as_str()) else {
            // The window decodes differently with the new id (a decoder that merges
            // across tokens); wait for more ids rather than emit something wrong.
            return Ok(None);
        };
        let delta = delta.to_string();
        // The emitted ids [read_offset..] become the next prefix.
        self.ids.drain(..self.read_offset);
        self.read_offset = self.ids.len();
        Ok(Some(delta))
    }

    /// Text still held back (an incomplete character at the end of the stream),
    /// decoded lossily; call once when the stream ends.
    pub fn flush(&mut self) -> Result<Option<String>, TokenizerError> {
        if self.read_offset == self.ids.len() {
            return Ok(None);
        }
        let prefix = self.tokenizer.decode(&self.ids[..self.read_offset], self.skip_special_tokens)?;
        let full = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        self.ids.clear();
        self.read_offset = 0;
        Ok(full.strip_prefix(prefix.as_str()).filter(|d| !d.is_empty()).map(str::to_string))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_card::byte_level_tokenizer_json;

    fn byte_tokenizer() -> Tokenizer {
        Tokenizer::from_json(&byte_level_tokenizer_json()).unwrap()
    }

    #[test]
    fn utf8_round_trips_one_token_per_byte() {
        let tok = byte_tokenizer();
        for text in ["hello world", "  two  spaces\n\ttab", "emoji 🦀🎉 done", "中文字符 and ÿ þ", "\u{0}\u{7f}"]
        {
            let ids = tok.encode(text, false).unwrap();
            assert_eq!(ids.len(), text.len(), "{text:?}");
            assert_eq!(tok.decode(&ids, true).unwrap(), text);
        }
    }

    #[test]
    fn special_tokens_are_matched_and_skipped() {
        let tok = byte_tokenizer();
        let ids = tok.encode("<s>hi</s>", false).unwrap();
        assert_eq!(ids.len(), 4);
        assert_eq!(ids[0], tok.token_to_id("<s>").unwrap());
        assert_eq!(tok.decode(&ids, true).unwrap(), "hi");
        assert_eq!(tok.decode(&ids, false).unwrap(), "<s>hi</s>");
    }

    #[test]
    fn incremental_decoder_emits_whole_characters() {
        let tok = byte_tokenizer();
        let text = "a🦀é中";
        let mut dec = tok.decode_stream(true);
        let mut pieces = Vec::new();
        for id in tok.encode(text, false).unwrap() {
            if let Some(piece) = dec.step(id).unwrap() {
                pieces.push(piece);
            }
        }
        assert_eq!(pieces, vec!["a", "🦀", "é", "中"]);
        assert_eq!(dec.flush().unwrap(), None);
    }

    #[test]
    fn flush_releases_an_incomplete_character() {
        let tok = byte_tokenizer();
        let ids = tok.encode("🦀", false).unwrap();
        let mut dec = tok.decode_stream(true);
        assert_eq!(dec.step(ids[0]).unwrap(), None);
        assert_eq!(dec.flush().unwrap(), Some("\u{FFFD}".to_string()));
    }
}

#[cfg(test)]
mod sentencepiece_tests {
    use super::*;

    /// A Llama-2-style tokenizer: `▁` for spaces, byte fallback, BOS added.
    fn llama_style() -> Tokenizer {
        let json = serde_json::json!({
            "version": "1.0",
            "added_tokens": [
                {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true},
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
            },
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}
            ]},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0xE2>": 3, "<0x82>": 4, "<0xAC>": 5,
                          "▁": 6, "t": 7, "h": 8, "e": 9, "▁the": 10, "▁lies": 11, "l": 12, "i": 13, "s": 14},
                "merges": []
            }
        });
        Tokenizer::from_json(&json.to_string()).unwrap()
    }

    #[test]
    fn a_token_listed_alone_keeps_the_spaces_its_piece_stands_for() {
        let tok = llama_style();
        assert_eq!(tok.decode(&[11], false).unwrap(), "lies");
        assert_eq!(tok.token_text(11), " lies");
        assert_eq!(tok.token_text(7), "t");
        assert_eq!(tok.token_text(2), "</s>");
        // Half a character alone is the replacement character, as Python's decode gives.
        assert_eq!(tok.token_text(3), "\u{FFFD}");
    }

    #[test]
    fn a_half_character_is_listed_as_what_it_completes() {
        let tok = llama_style();
        // "€" is E2 82 AC: the first two complete nothing, the last completes it.
        assert_eq!(tok.token_text_after(&[], 3), "");
        assert_eq!(tok.token_text_after(&[3], 4), "");
        assert_eq!(tok.token_text_after(&[11, 3, 4], 5), "€");
        // After whole tokens, a lone continuation byte completes nothing.
        assert_eq!(tok.token_text_after(&[10, 11], 4), "");
        assert_eq!(tok.token_text_after(&[10], 11), " lies");
    }

    #[test]
    fn a_stream_primed_with_the_prompt_keeps_the_first_tokens_space() {
        let tok = llama_style();
        let mut fresh = tok.decode_stream(true);
        assert_eq!(fresh.step(11).unwrap().as_deref(), Some("lies"));
        let mut primed = tok.decode_stream_after(&[1, 10], true);
        assert_eq!(primed.step(11).unwrap().as_deref(), Some(" lies"));
        // A character split over byte tokens comes out whole, after the prompt too.
        let euro: Vec<Option<String>> = [3, 4, 5].iter().map(|&id| primed.step(id).unwrap()).collect();
        assert_eq!(euro, vec![None, None, Some("€".to_string())]);
    }
}
