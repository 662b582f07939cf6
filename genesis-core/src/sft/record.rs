//! [`SftRecord`]: one training conversation parsed from a JSONL line, in the Hugging Face /
//! TRL dataset forms, and the JSONL reader that reports bad lines by number.

use crate::text::Message;
use crate::{Error, Result};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::io::BufRead;
use std::path::Path;

/// The roles a record may use. `tool` is accepted here; whether the model's chat template
/// renders it is up to the template (Qwen2.5's does; a template that raises on it makes
/// encoding fail with the template's message).
pub const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// Which dataset form a record was written in (TRL's `dataset_formats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordFormat {
    /// `{"messages": [{"role": ..., "content": ...}, ...]}`.
    Conversational,
    /// `{"prompt": "...", "completion": "..."}`: plain strings.
    PromptCompletion,
    /// `{"prompt": [messages], "completion": [messages]}`.
    ConversationalPromptCompletion,
}

/// One supervised fine-tuning example before tokenization: a conversation, and the index of
/// the first message whose assistant turns are trained on.
///
/// * Conversational records train on every assistant message (`first_trained == 0`).
/// * Prompt/completion records become a conversation too, rendered with the model's chat
///   template: a plain-string prompt is one `user` message and a plain-string completion one
///   `assistant` message. (TRL concatenates plain-string prompt and completion without a
///   template; for a chat model the template is what the model sees at inference, so Genesis
///   renders it.) A conversational prompt/completion is the prompt's messages followed by the
///   completion's. Either way only the completion's assistant messages are trained on
///   (`first_trained == prompt length`), as TRL's `completion_only_loss` does: assistant turns
///   inside the prompt are context.
///
/// Every record has at least one trained assistant message with non-blank content and does
/// not start with an assistant message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftRecord {
    /// The conversation in order.
    pub messages: Vec<Message>,
    /// Assistant messages at this index or later carry the loss; earlier ones do not.
    pub first_trained: usize,
    /// The form the record was written in.
    pub format: RecordFormat,
    /// The 1-based line of the JSONL file it came from (`None` when built in code).
    pub line: Option<usize>,
}

/// Why a JSONL line was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BadLineKind {
    /// Not valid UTF-8 or not valid JSON.
    MalformedJson,
    /// Valid JSON of the wrong shape: not an object, no `messages` / `prompt`+`completion`,
    /// a message that is not an object, a prompt and completion of different forms.
    BadStructure,
    /// A role outside [`ROLES`] (or not a string).
    UnknownRole,
    /// A message whose `content` is missing or not a string, or an assistant message whose
    /// content is blank.
    BadContent,
    /// No assistant message to train on, or a conversation that starts with one.
    NoAssistant,
}

impl BadLineKind {
    /// A short description (`"malformed JSON"`).
    pub fn describe(self) -> &'static str {
        match self {
            BadLineKind::MalformedJson => "malformed JSON",
            BadLineKind::BadStructure => "bad structure",
            BadLineKind::UnknownRole => "unknown role",
            BadLineKind::BadContent => "bad content",
            BadLineKind::NoAssistant => "no assistant turn",
        }
    }
}

impl fmt::Display for BadLineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// A rejected line: where, why, and the message an error would have had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    /// 1-based line number.
    pub line: usize,
    /// The category of the problem.
    pub kind: BadLineKind,
    /// What is wrong, without the line number (`"message 2: unknown role \"bot\""`).
    pub reason: String,
}

impl fmt::Display for BadLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

/// What to do with a bad line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BadLinePolicy {
    /// Fail with an `InvalidArgument` error naming the file and the line number.
    #[default]
    Stop,
    /// Leave the line out and record it in [`ReadReport::skipped`].
    Skip,
}

/// The result of reading a JSONL file: the good records and the lines left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadReport {
    /// The records in file order.
    pub records: Vec<SftRecord>,
    /// Bad lines left out under [`BadLinePolicy::Skip`], in file order.
    pub skipped: Vec<BadLine>,
    /// Lines that were empty or only whitespace (ignored, not counted as bad).
    pub blank_lines: usize,
}

impl ReadReport {
    /// The number of skipped lines of each kind.
    pub fn skipped_by_kind(&self) -> BTreeMap<BadLineKind, usize> {
        let mut counts = BTreeMap::new();
        for bad in &self.skipped {
            *counts.entry(bad.kind).or_insert(0) += 1;
        }
        counts
    }

    /// A one-line summary for a log: `None` when nothing was skipped, else
    /// `"skipped 3 lines (2 malformed JSON, 1 unknown role); first: line 4: ..."`.
    pub fn skipped_summary(&self) -> Option<String> {
        let first = self.skipped.first()?;
        let n = self.skipped.len();
        let kinds: Vec<String> = self.skipped_by_kind().iter().map(|(k, c)| format!("{c} {k}")).collect();
        let lines = if n == 1 { "line" } else { "lines" };
        Some(format!("skipped {n} {lines} ({}); first: {first}", kinds.join(", ")))
    }
}

impl SftRecord {
    /// A conversational record; errors as [`SftRecord::from_json_str`] describes.
    pub fn conversation(messages: Vec<Message>) -> Result<Self> {
        let record = SftRecord { messages, first_trained: 0, format: RecordFormat::Conversational, line: None };
        record.validate().map_err(|(_, reason)| Error::invalid(reason))?;
        Ok(record)
    }

    /// A plain-string prompt/completion record: one user message, one assistant message.
    pub fn prompt_completion(prompt: impl Into<String>, completion: impl Into<String>) -> Result<Self> {
        let messages = vec![Message::user(prompt), Message::assistant(completion)];
        let record = SftRecord { messages, first_trained: 1, format: RecordFormat::PromptCompletion, line: None };
        record.validate().map_err(|(_, reason)| Error::invalid(reason))?;
        Ok(record)
    }

    /// Parses one JSON object in any of the [`RecordFormat`]s. Keys other than `messages`,
    /// `prompt` and `completion` are ignored, and so are message keys other than `role` and
    /// `content`. An `InvalidArgument` error says what is wrong: malformed JSON, a missing
    /// field, a role outside [`ROLES`], a `content` that is missing or not a string, a blank
    /// assistant message, no assistant message to train on, a first message from the
    /// assistant.
    pub fn from_json_str(json: &str) -> Result<Self> {
        parse_line(json).map_err(|bad| Error::invalid(bad.1))
    }

    /// The messages whose tokens carry the loss: assistant messages from
    /// [`first_trained`](Self::first_trained) on.
    pub fn is_trained(&self, index: usize) -> bool {
        index >= self.first_trained && self.messages.get(index).is_some_and(|m| m.role == "assistant")
    }

    fn validate(&self) -> std::result::Result<(), (BadLineKind, String)> {
        if self.messages.is_empty() {
            return Err((BadLineKind::NoAssistant, "the conversation has no messages".into()));
        }
        for (i, m) in self.messages.iter().enumerate() {
            if !ROLES.contains(&m.role.as_str()) {
                return Err((
                    BadLineKind::UnknownRole,
                    format!("message {}: unknown role {:?} (expected one of {})", i + 1, m.role, ROLES.join(", ")),
                ));
            }
            if m.role == "assistant" && m.content.trim().is_empty() {
                return Err((BadLineKind::BadContent, format!("message {}: assistant content is blank", i + 1)));
            }
        }
        if self.messages[0].role == "assistant" {
            return Err((
                BadLineKind::NoAssistant,
                "the conversation starts with an assistant message (nothing to respond to)".into(),
            ));
        }
        if !(0..self.messages.len()).any(|i| self.is_trained(i)) {
            let place = if self.first_trained == 0 { "the conversation" } else { "the completion" };
            return Err((BadLineKind::NoAssistant, format!("{place} has no assistant message to train on")));
        }
        Ok(())
    }
}

type LineError = (BadLineKind, String);

fn parse_line(json: &str) -> std::result::Result<SftRecord, LineError> {
    let value: Value =
        serde_json::from_str(json).map_err(|e| (BadLineKind::MalformedJson, format!("malformed JSON: {e}")))?;
    let Value::Object(object) = value else {
        return Err((BadLineKind::BadStructure, format!("expected a JSON object, got {}", json_type(&value))));
    };
    let record = match (object.get("messages"), object.get("prompt"), object.get("completion")) {
        (Some(messages), None, None) => SftRecord {
            messages: parse_messages(messages, "messages")?,
            first_trained: 0,
            format: RecordFormat::Conversational,
            line: None,
        },
        (None, Some(prompt), Some(completion)) => parse_prompt_completion(prompt, completion)?,
        (Some(_), _, _) => {
            return Err((BadLineKind::BadStructure, "has both \"messages\" and \"prompt\"/\"completion\"".into()))
        }
        (None, Some(_), None) => {
            return Err((BadLineKind::BadStructure, "has \"prompt\" but no \"completion\"".into()))
        }
        (None, None, Some(_)) => {
            return Err((BadLineKind::BadStructure, "has \"completion\" but no \"prompt\"".into()))
        }
        (None, None, None) => {
            return Err((
                BadLineKind::BadStructure,
                format!("needs \"messages\" or \"prompt\" and \"completion\"; keys are {}", keys(&object)),
            ))
        }
    };
    record.validate()?;
    Ok(record)
}

fn parse_prompt_completion(prompt: &Value, completion: &Value) -> std::result::Result<SftRecord, LineError> {
    match (prompt, completion) {
        (Value::String(p), Value::String(c)) => Ok(SftRecord {
            messages: vec![Message::user(p.clone()), Message::assistant(c.clone())],
            first_trained: 1,
            format: RecordFormat::PromptCompletion,
            line: None,
        }),
        (Value::Array(_), Value::Array(_)) => {
            let mut messages = parse_messages(prompt, "prompt")?;
            let first_trained = messages.len();
            messages.extend(parse_messages(completion, "completion")?);
            Ok(SftRecord { messages, first_trained, format: RecordFormat::ConversationalPromptCompletion, line: None })
        }
        _ => Err((
            BadLineKind::BadStructure,
            format!(
                "\"prompt\" ({}) and \"completion\" ({}) must both be strings or both be lists of messages",
                json_type(prompt),
                json_type(completion)
            ),
        )),
    }
}

fn parse_messages(value: &Value, field: &str) -> std::result::Result<Vec<Message>, LineError> {
    let Value::Array(items) = value else {
        return Err((BadLineKind::BadStructure, format!("\"{field}\" must be a list, got {}", json_type(value))));
    };
    let mut messages = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let Value::Object(m) = item else {
            return Err((BadLineKind::BadStructure, format!("{at} must be an object, got {}", json_type(item))));
        };
        let role = string_field(m, "role", BadLineKind::UnknownRole, &at)?;
        if !ROLES.contains(&role.as_str()) {
            return Err((
                BadLineKind::UnknownRole,
                format!("{at}: unknown role {role:?} (expected one of {})", ROLES.join(", ")),
            ));
        }
        let content = string_field(m, "content", BadLineKind::BadContent, &format!("{at} ({role})"))?;
        messages.push(Message::new(role, content));
    }
    Ok(messages)
}

/// The string field `key` of the message at `at` (for errors), or an error of `kind`.
fn string_field(
    m: &Map<String, Value>,
    key: &str,
    kind: BadLineKind,
    at: &str,
) -> std::result::Result<String, LineError> {
    match m.get(key) {
        Some(Value::String(v)) => Ok(v.clone()),
        Some(other) => Err((kind, format!("{at}: {key} must be a string, got {}", json_type(other)))),
        None => Err((kind, format!("{at}: no \"{key}\""))),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn keys(object: &Map<String, Value>) -> String {
    if object.is_empty() {
        return "none".into();
    }
    object.keys().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ")
}

/// Reads a JSONL file of records (one JSON object a line; blank lines are ignored, a leading
/// UTF-8 byte order mark and `\r\n` line ends are accepted). With [`BadLinePolicy::Stop`] the
/// first bad line is an `InvalidArgument` error naming the file and its 1-based line number;
/// with [`BadLinePolicy::Skip`] bad lines are left out and listed in the report. A file that
/// cannot be opened or read is a `LoadFailed` error.
pub fn read_jsonl(path: impl AsRef<Path>, policy: BadLinePolicy) -> Result<ReadReport> {
    let path = path.as_ref();
    let origin = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| Error::load(format!("cannot open {origin}: {e}")))?;
    read_jsonl_from(std::io::BufReader::new(file), &origin, policy)
}

/// [`read_jsonl`] over JSONL text held in memory; `origin` names it in errors.
pub fn parse_jsonl(text: &str, origin: &str, policy: BadLinePolicy) -> Result<ReadReport> {
    read_jsonl_from(text.as_bytes(), origin, policy)
}

/// [`read_jsonl`] over any buffered reader; `origin` names it in errors.
pub fn read_jsonl_from(reader: impl BufRead, origin: &str, policy: BadLinePolicy) -> Result<ReadReport> {
    let mut report = ReadReport::default();
    for (i, bytes) in reader.split(b'\n').enumerate() {
        let line = i + 1;
        let bytes = bytes.map_err(|e| Error::load(format!("{origin}: cannot read line {line}: {e}")))?;
        let parsed = match std::str::from_utf8(&bytes) {
            Ok(text) => {
                let text = if line == 1 { text.strip_prefix('\u{feff}').unwrap_or(text) } else { text };
                if text.trim().is_empty() {
                    report.blank_lines += 1;
                    continue;
                }
                parse_line(text)
            }
            Err(e) => Err((BadLineKind::MalformedJson, format!("not valid UTF-8: {e}"))),
        };
        match parsed {
            Ok(mut record) => {
                record.line = Some(line);
                report.records.push(record);
            }
            Err((kind, reason)) => {
                let bad = BadLine { line, kind, reason };
                match policy {
                    BadLinePolicy::Stop => return Err(Error::invalid(format!("{origin}: {bad}"))),
                    BadLinePolicy::Skip => report.skipped.push(bad),
                }
            }
        }
    }
    Ok(report)
}
