//! [`TextStream`]: printable text from generated ids, one id at a time.

use super::tokenizer::Tokenizer;
use crate::Result;

/// Turns a stream of token ids into text that can be printed as it comes.
///
/// A token is not a unit of text: with byte-level BPE one character (a CJK ideograph, an
/// emoji) may span several tokens, and some decoders change a token's text by what precedes
/// it (SentencePiece's leading space). The stream decodes a short window of recent ids and
/// returns only text that can no longer change: it holds text back while the window's text
/// ends in an incomplete UTF-8 sequence (decoded as U+FFFD) and never splits a character.
/// The chunks of [`push`](Self::push) followed by [`finish`](Self::finish) concatenate to
/// [`Tokenizer::decode`] of all the ids.
///
/// ```no_run
/// # fn main() -> genesis::Result<()> {
/// use genesis::text::Tokenizer;
/// let tokenizer = Tokenizer::from_folder("path/to/Qwen2.5-0.5B-Instruct")?;
/// let mut stream = tokenizer.stream(true);
/// for id in tokenizer.encode("你好, world 👋", false)? {
///     print!("{}", stream.push(id)?);
/// }
/// print!("{}", stream.finish()?);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TextStream {
    tokenizer: Tokenizer,
    skip_special_tokens: bool,
    /// The window: ids of the last returned chunk (context), then ids not returned yet.
    ids: Vec<u32>,
    /// `ids[..read]` were already returned as text.
    read: usize,
    /// The length in bytes of the text of `ids[..read]`.
    settled_len: usize,
}

impl TextStream {
    /// A stream decoding with `tokenizer`; `skip_special_tokens` as in [`Tokenizer::decode`].
    pub fn new(tokenizer: Tokenizer, skip_special_tokens: bool) -> Self {
        TextStream { tokenizer, skip_special_tokens, ids: Vec::new(), read: 0, settled_len: 0 }
    }

    /// Adds one id; returns the text that became final (often empty while a character is
    /// incomplete).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        if text.len() <= self.settled_len || text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(String::new());
        }
        let chunk = new_suffix(&text, self.settled_len).to_string();
        // The ids returned so far stay as context (the window) for the next decode: a
        // decoder may render a token differently at the start of a text.
        self.ids.drain(..self.read);
        self.read = self.ids.len();
        self.settled_len = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?.len();
        Ok(chunk)
    }

    /// Returns what is left (text held back at the end, even an incomplete character, as
    /// U+FFFD like `decode` writes it) and resets the stream.
    pub fn finish(&mut self) -> Result<String> {
        let text = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        let chunk =
            if text.len() > self.settled_len { new_suffix(&text, self.settled_len).to_string() } else { String::new() };
        self.ids.clear();
        self.read = 0;
        self.settled_len = 0;
        Ok(chunk)
    }
}

/// The part of `text` after its first `settled_len` bytes, starting on a character boundary.
fn new_suffix(text: &str, settled_len: usize) -> &str {
    let start = (settled_len..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
    &text[start..]
}
