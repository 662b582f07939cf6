//! The data half of supervised fine-tuning (SFT) of chat models (feature `text`): JSONL
//! records in the Hugging Face / TRL forms, tokenized with the model's chat template and a
//! loss mask on the assistant turns only, truncated, then batched padded or packed, in an
//! order fixed by a seed and resumable.
//!
//! ```no_run
//! # fn main() -> genesis::Result<()> {
//! use genesis::sft::{pack_examples, packed_batch, read_jsonl, BadLinePolicy, SftBatches, SftEncoder};
//! use genesis::Device;
//! let read = read_jsonl("train.jsonl", BadLinePolicy::Skip)?;
//! if let Some(summary) = read.skipped_summary() {
//!     eprintln!("{summary}");
//! }
//! let encoder = SftEncoder::from_folder("path/to/Qwen2.5-0.5B-Instruct")?;
//! let (examples, summary) = encoder.encode_all(&read.records, 1024)?;
//! eprintln!("{} examples, {} truncated, {} dropped", summary.examples, summary.truncated, summary.dropped);
//! let pad = encoder.tokenizer().token_to_id("<|endoftext|>").unwrap_or(0);
//! let rows = pack_examples(&examples, 1024, pad)?;
//! let mut batches = SftBatches::new(rows, 8, 42)?;
//! let batch = packed_batch(&batches.next_batch(), &Device::cpu()?)?;
//! // logits = model(batch.input_ids, batch.position_ids, batch.attention_mask);
//! // loss = cross_entropy(logits, batch.targets, ignore_index = -100)
//! # let _ = batch;
//! # Ok(())
//! # }
//! ```

mod batch;
mod encode;
#[cfg(feature = "monitor")]
mod exact_match;
mod model;
mod order;
mod record;
#[cfg(feature = "monitor")]
mod trainer;

pub use batch::{block_diagonal_mask, pack_examples, packed_batch, pad_batch, PackedBatch, PackedRow, PaddedBatch};
pub use encode::{shift_labels, truncate, EncodeSummary, SftEncoder, SftExample, Truncated, IGNORE_INDEX};
#[cfg(feature = "monitor")]
pub use exact_match::{exact_match, ExactMatch};
pub use model::SftModel;
pub use order::{DataPosition, SftBatches, SftBatchesState};
pub use record::{
    parse_jsonl, read_jsonl, read_jsonl_from, BadLine, BadLineKind, BadLinePolicy, ReadReport, RecordFormat, SftRecord,
    ROLES,
};
#[cfg(feature = "monitor")]
pub use trainer::{ModelInputs, SftConfig, SftItem, SftOutcome, SftReport, SftTrainer};
