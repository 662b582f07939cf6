//! [`SftEncoder`]: records to token ids with an assistant-only loss mask, found by rendering
//! the conversation message by message (no `{% generation %}` markers needed), and truncation.

use super::record::SftRecord;
use crate::text::{ChatTemplate, Tokenizer};
use crate::{Error, Result};
use std::ops::Range;
use std::path::Path;

/// The label of a token that carries no loss (PyTorch's `ignore_index`).
pub const IGNORE_INDEX: i64 = -100;

/// One tokenized example.
///
/// `labels` is aligned with `input_ids`: `labels[t]` is `input_ids[t]` as an `i64` where that
/// token is trained on and [`IGNORE_INDEX`] elsewhere, exactly as transformers'
/// `labels` for causal language models. The shift by one happens at loss time: the logits at
/// position `t` predict token `t + 1`, so the loss compares `logits[t]` with `labels[t + 1]`
/// (transformers' `ForCausalLMLoss` shifts inside the loss). [`SftExample::shifted_targets`]
/// gives those targets; `labels[0]` is never a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftExample {
    /// The token ids of the rendered conversation.
    pub input_ids: Vec<u32>,
    /// Per-token labels, aligned with `input_ids` (not shifted).
    pub labels: Vec<i64>,
}

impl SftExample {
    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    /// True when there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }

    /// The number of tokens that are loss targets (labelled tokens after the first position).
    pub fn target_count(&self) -> usize {
        self.labels.iter().skip(1).filter(|&&l| l != IGNORE_INDEX).count()
    }

    /// The loss targets for the logits at each position: `targets[t] = labels[t + 1]`, and the
    /// last position, which has no next token, gets [`IGNORE_INDEX`].
    pub fn shifted_targets(&self) -> Vec<i64> {
        shift_labels(&self.labels)
    }
}

/// `targets[t] = labels[t + 1]`, the last one [`IGNORE_INDEX`]: the targets for the logits
/// of a causal language model whose labels are aligned with its inputs.
pub fn shift_labels(labels: &[i64]) -> Vec<i64> {
    labels.iter().skip(1).copied().chain((!labels.is_empty()).then_some(IGNORE_INDEX)).collect()
}

/// What [`SftEncoder::encode_all`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodeSummary {
    /// Records encoded.
    pub records: usize,
    /// Examples kept.
    pub examples: usize,
    /// Kept examples that were cut to the maximum length.
    pub truncated: usize,
    /// Examples dropped because truncation left them no loss target.
    pub dropped: usize,
    /// The indices (in the input slice) of the dropped records; their
    /// [`line`](SftRecord::line)s say where they are in the file.
    pub dropped_records: Vec<usize>,
    /// Tokens in the kept examples.
    pub tokens: usize,
    /// Loss targets in the kept examples.
    pub target_tokens: usize,
    /// The length of the longest example before truncation.
    pub longest: usize,
}

/// Turns [`SftRecord`]s into [`SftExample`]s with a model's tokenizer and chat template.
///
/// The loss mask covers the assistant messages the record trains on (see
/// [`SftRecord::first_trained`]): for assistant message `i` the text before it is the
/// rendering of `messages[..i]` with the generation prompt, and the text through it is the
/// rendering of `messages[..=i]` without; both must be prefixes of the rendering of the whole
/// conversation (an error names the template otherwise, since the spans would be wrong). The
/// span runs from the end of the first to the end of the second: everything the template
/// renders for the assistant turn, so for ChatML the content, `<|im_end|>` (the model learns
/// to stop) and the line break that closes the turn. (That last token is never generated,
/// since generation stops at `<|im_end|>`, but training on the whole turn is what the recipe
/// of the demonstration was checked with: with the line break left out, the same PyTorch
/// training of `tests/sft` stayed on its loss plateau about 150 steps longer.) The whole
/// text is tokenized once (no special tokens added, as `apply_chat_template(tokenize=True)`
/// does) and a token is labelled when its byte offsets overlap a span: for Qwen2's
/// tokenizer the tokens never straddle a span edge; for a tokenizer whose token joins a
/// template character with the first character of the content, that token is labelled too,
/// because the model has to produce it.
#[derive(Debug, Clone)]
pub struct SftEncoder {
    tokenizer: Tokenizer,
    template: ChatTemplate,
}

impl SftEncoder {
    /// An encoder from a tokenizer and a chat template.
    pub fn new(tokenizer: Tokenizer, template: ChatTemplate) -> Self {
        SftEncoder { tokenizer, template }
    }

    /// The tokenizer and default chat template of a Hugging Face model folder.
    pub fn from_folder(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        Ok(Self::new(Tokenizer::from_folder(dir)?, ChatTemplate::from_folder(dir)?))
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat template.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The rendered conversation and the byte ranges of its trained assistant spans, in order.
    pub fn render_with_spans(&self, record: &SftRecord) -> Result<(String, Vec<Range<usize>>)> {
        let messages = &record.messages;
        let full = self.template.render(messages, false).map_err(|e| e.context(record_name(record)))?;
        let mut spans = Vec::new();
        for i in (0..messages.len()).filter(|&i| record.is_trained(i)) {
            let before = self.template.render(&messages[..i], true).map_err(|e| e.context(record_name(record)))?;
            let through = self.template.render(&messages[..=i], false).map_err(|e| e.context(record_name(record)))?;
            for (prefix, what) in [(&before, "with the generation prompt"), (&through, "")] {
                if !full.starts_with(prefix.as_str()) {
                    let n = if what.is_empty() { i + 1 } else { i };
                    return Err(Error::invalid(format!(
                        "{}: chat template {}: the first {n} messages rendered {what} are not a prefix of the \
                         whole conversation, so the assistant tokens cannot be found by rendering message by \
                         message",
                        record_name(record),
                        self.template.origin(),
                    )));
                }
            }
            let end = through.len();
            let span = before.len()..end;
            let content = messages[i].content.trim();
            if span.is_empty() || !full[span.clone()].contains(content) {
                return Err(Error::invalid(format!(
                    "{}: chat template {}: message {} (assistant) does not appear between its prefix and the \
                     rendering through it",
                    record_name(record),
                    self.template.origin(),
                    i + 1
                )));
            }
            spans.push(span);
        }
        Ok((full, spans))
    }

    /// Tokenizes a record with its loss mask (no truncation).
    pub fn encode(&self, record: &SftRecord) -> Result<SftExample> {
        let (text, spans) = self.render_with_spans(record)?;
        let encoding = self.tokenizer.inner().encode(text.as_str(), false).map_err(|e| {
            Error::invalid(format!(
                "{}: tokenizer {}: encode failed: {e}",
                record_name(record),
                self.tokenizer.origin()
            ))
        })?;
        let input_ids = encoding.get_ids().to_vec();
        let labels = input_ids
            .iter()
            .zip(encoding.get_offsets())
            .map(|(&id, &(start, end))| {
                let inside = spans.iter().any(|s| start < s.end && end > s.start && start < end);
                if inside {
                    i64::from(id)
                } else {
                    IGNORE_INDEX
                }
            })
            .collect();
        Ok(SftExample { input_ids, labels })
    }

    /// Encodes every record and truncates each example to `max_len` tokens (keeping the
    /// start). A truncated example keeps its remaining labels; one left with no loss target
    /// is dropped. Both are counted in the summary. An encoding error (a template that
    /// rejects a record) stops with an error naming the record's line.
    pub fn encode_all(&self, records: &[SftRecord], max_len: usize) -> Result<(Vec<SftExample>, EncodeSummary)> {
        if max_len < 2 {
            return Err(Error::invalid(format!("SFT max_len must be at least 2, got {max_len}")));
        }
        let mut summary = EncodeSummary { records: records.len(), ..EncodeSummary::default() };
        let mut examples = Vec::with_capacity(records.len());
        for (index, record) in records.iter().enumerate() {
            let example = self.encode(record)?;
            summary.longest = summary.longest.max(example.len());
            match truncate(example, max_len) {
                Truncated::Whole(e) | Truncated::Cut(e) if e.target_count() == 0 => {
                    summary.dropped += 1;
                    summary.dropped_records.push(index);
                }
                Truncated::Whole(e) => examples.push(e),
                Truncated::Cut(e) => {
                    summary.truncated += 1;
                    examples.push(e);
                }
            }
        }
        summary.examples = examples.len();
        summary.tokens = examples.iter().map(SftExample::len).sum();
        summary.target_tokens = examples.iter().map(SftExample::target_count).sum();
        Ok((examples, summary))
    }
}

/// An example after [`truncate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Truncated {
    /// It fitted and is unchanged.
    Whole(SftExample),
    /// It was cut to the maximum length.
    Cut(SftExample),
}

/// Keeps the first `max_len` tokens of `example` (and their labels).
pub fn truncate(mut example: SftExample, max_len: usize) -> Truncated {
    if example.len() <= max_len {
        return Truncated::Whole(example);
    }
    example.input_ids.truncate(max_len);
    example.labels.truncate(max_len);
    Truncated::Cut(example)
}

fn record_name(record: &SftRecord) -> String {
    match record.line {
        Some(line) => format!("record at line {line}"),
        None => "record".to_string(),
    }
}
