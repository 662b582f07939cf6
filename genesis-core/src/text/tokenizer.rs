//! [`Tokenizer`]: a Hugging Face `tokenizer.json` behind Genesis errors.

use super::stream::TextStream;
use crate::{Error, Result};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// A Hugging Face fast tokenizer, loaded from a `tokenizer.json`.
///
/// Cloning is cheap (the vocabulary is shared). Encoding and decoding behave as the
/// `tokenizers` library (and so transformers' fast tokenizers) does.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    origin: String,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer").field("origin", &self.origin).field("vocab_size", &self.vocab_size(true)).finish()
    }
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`.
    pub fn from_folder(dir: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(dir.as_ref().join("tokenizer.json"))
    }

    /// Loads a `tokenizer.json` file. A missing or malformed file is a `LoadFailed` error
    /// that names the path.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).map_err(|e| Error::load(format!("cannot read tokenizer {}: {e}", path.display())))?;
        Self::from_bytes_named(&bytes, path.display().to_string())
    }

    /// Parses the contents of a `tokenizer.json`.
    pub fn from_bytes(json: &[u8]) -> Result<Self> {
        Self::from_bytes_named(json, "<bytes>".to_string())
    }

    fn from_bytes_named(json: &[u8], origin: String) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_bytes(json)
            .map_err(|e| Error::load(format!("cannot parse tokenizer {origin}: {e}")))?;
        Ok(Self::from_tokenizers(inner, origin))
    }

    /// Wraps a tokenizer built with the `tokenizers` crate; `origin` names it in errors.
    pub fn from_tokenizers(tokenizer: tokenizers::Tokenizer, origin: impl Into<String>) -> Self {
        Tokenizer { inner: Arc::new(tokenizer), origin: origin.into() }
    }

    /// Where this tokenizer came from (a path, or `<bytes>`).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The ids of `text`. `add_special_tokens` applies the tokenizer's post-processor (for
    /// instance a BOS token), as `tokenizer.encode(text, add_special_tokens=...)` does in
    /// transformers. Special tokens written in `text` (`<|im_start|>`) are matched either way.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| Error::invalid(format!("tokenizer {}: encode failed: {e}", self.origin)))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`. Ids outside the vocabulary are left out, as `tokenizers` does;
    /// `skip_special_tokens` leaves special tokens out too.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::invalid(format!("tokenizer {}: decode failed: {e}", self.origin)))
    }

    /// The id of a token (a vocabulary entry or an added token such as `<|im_end|>`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token of an id, in the vocabulary's own spelling (byte-level BPE writes a space
    /// as `Ġ`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The number of tokens: with added tokens this is transformers' `len(tokenizer)`,
    /// without it is `tokenizer.vocab_size`. A model's embedding table may be larger.
    pub fn vocab_size(&self, with_added_tokens: bool) -> usize {
        self.inner.get_vocab_size(with_added_tokens)
    }

    /// A streaming decoder for generated ids; see [`TextStream`].
    pub fn stream(&self, skip_special_tokens: bool) -> TextStream {
        TextStream::new(self.clone(), skip_special_tokens)
    }

    /// The underlying `tokenizers` tokenizer, for what this type does not wrap.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
