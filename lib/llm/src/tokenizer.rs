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
        Ok(Tokenizer { inner: Arc::new(inner) })
    }

    /// Load a `tokenizer.json` file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref();
        let inner =
            tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError(format!("{}: {e}", path.display())))?;
        Ok(Tokenizer { inner: Arc::new(inner) })
    }

    /// Wrap an already built tokenizer.
    pub fn from_hf(inner: tokenizers::Tokenizer) -> Self {
        Tokenizer { inner: Arc::new(inner) }
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
