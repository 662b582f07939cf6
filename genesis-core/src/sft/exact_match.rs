//! Exact-match accuracy of a chat model on held-out conversations: the prompt is every
//! message before the last assistant message, rendered with the generation prompt; the reply
//! is generated greedily until an end-of-turn id and compared, trimmed, with that message.

use super::{SftEncoder, SftRecord};
use crate::generation::{generate, CausalLM, GenerationConfig};
use crate::{Error, Result};

/// How a model did on held-out prompts.
#[derive(Debug, Clone)]
pub struct ExactMatch {
    /// Replies equal to the expected answer.
    pub correct: usize,
    /// Prompts asked.
    pub total: usize,
    /// `(prompt's last message, expected, generated)` of the first few prompts.
    pub samples: Vec<(String, String, String)>,
}

impl ExactMatch {
    /// `correct / total` (0 for no prompts).
    pub fn accuracy(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.correct as f64 / self.total as f64
        }
    }
}

/// Ask `model` the held-out `records` in batches of `batch`, greedily, and compare each reply
/// with the record's last assistant message. `config` supplies the end-of-turn ids and the
/// reply length; sampling settings are ignored (greedy).
pub fn exact_match<M: CausalLM>(
    model: &M,
    encoder: &SftEncoder,
    records: &[SftRecord],
    config: &GenerationConfig,
    batch: usize,
) -> Result<ExactMatch> {
    let greedy = GenerationConfig { do_sample: false, ..config.clone() };
    let mut asked = Vec::with_capacity(records.len());
    for record in records {
        let last = record
            .messages
            .iter()
            .rposition(|m| m.role == "assistant")
            .ok_or_else(|| Error::invalid("exact_match: a record has no assistant message"))?;
        let prompt = encoder.template().render(&record.messages[..last], true)?;
        let ids = encoder.tokenizer().encode(&prompt, false)?;
        let question = last.checked_sub(1).map(|i| record.messages[i].content.clone()).unwrap_or_default();
        asked.push((ids, question, record.messages[last].content.trim().to_string()));
    }
    let mut result = ExactMatch { correct: 0, total: asked.len(), samples: Vec::new() };
    for chunk in asked.chunks(batch.max(1)) {
        let prompts: Vec<Vec<u32>> = chunk.iter().map(|(ids, _, _)| ids.clone()).collect();
        let replies = generate(model, &prompts, &greedy)?;
        for ((_, question, expected), reply) in chunk.iter().zip(replies) {
            let text = encoder.tokenizer().decode(&reply, true)?.trim().to_string();
            if &text == expected {
                result.correct += 1;
            }
            if result.samples.len() < 5 {
                result.samples.push((question.clone(), expected.clone(), text));
            }
        }
    }
    Ok(result)
}
