//! The data half of supervised fine-tuning (SFT) of chat models (feature `text`): JSONL
//! records in the Hugging Face / TRL forms, with bad lines reported by number.

mod record;

pub use record::{
    parse_jsonl, read_jsonl, read_jsonl_from, BadLine, BadLineKind, BadLinePolicy, ReadReport, RecordFormat,
    SftRecord, ROLES,
};
