//! [`ChatTemplate`]: a model's Jinja chat template, rendered as transformers renders it.

use super::config::{NamedTemplate, TokenizerConfig};
use super::pycompat;
use crate::{Error, ErrorKind, Result};
use minijinja::value::Value;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `"system"`, `"user"`, `"assistant"`, `"tool"`, ... (the template decides what it
    /// accepts).
    pub role: String,
    /// The text of the message.
    pub content: String,
}

impl Message {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message { role: role.into(), content: content.into() }
    }

    /// A `"system"` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A `"user"` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `"assistant"` message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// What a template is rendered with besides the messages: transformers'
/// `apply_chat_template(messages, add_generation_prompt=..., tools=..., **kwargs)`.
///
/// Map values keep their key order (as Python dicts do) when they come from JSON text or from
/// Rust structs; a `serde_json::Value` object has already sorted its keys, unless serde_json's
/// `preserve_order` feature is on.
#[derive(Debug, Clone, Default)]
pub struct ChatOptions {
    add_generation_prompt: bool,
    tools: Option<Value>,
    kwargs: Vec<(String, Value)>,
}

impl ChatOptions {
    /// No generation prompt, no tools, no extra arguments.
    pub fn new() -> Self {
        Self::default()
    }

    /// Ends the prompt with the start of an assistant turn (for generation).
    pub fn add_generation_prompt(mut self, yes: bool) -> Self {
        self.add_generation_prompt = yes;
        self
    }

    /// The `tools` variable: a list of tool descriptions (JSON schemas), from any serde value.
    pub fn tools<T: Serialize + ?Sized>(mut self, tools: &T) -> Self {
        self.tools = Some(Value::from(minijinja::value::Serde(tools)));
        self
    }

    /// The `tools` variable from JSON text (a list), keeping its key order.
    pub fn tools_json(mut self, json: &str) -> Result<Self> {
        let tools = parse_json(json, "tools")?;
        if tools.kind() != minijinja::value::ValueKind::Seq {
            return Err(Error::invalid(format!("tools must be a JSON list, got {}", tools.kind())));
        }
        self.tools = Some(tools);
        Ok(self)
    }

    /// An extra template variable (`enable_thinking`, `date_string`, or a special token
    /// such as `bos_token` to override the folder's).
    pub fn kwarg<T: Serialize + ?Sized>(mut self, name: &str, value: &T) -> Self {
        self.set_kwarg(name, Value::from(minijinja::value::Serde(value)));
        self
    }

    /// Extra template variables from a JSON object (`{"enable_thinking": false}`).
    pub fn kwargs_json(mut self, json: &str) -> Result<Self> {
        let object = parse_json(json, "kwargs")?;
        if object.kind() != minijinja::value::ValueKind::Map {
            return Err(Error::invalid(format!("kwargs must be a JSON object, got {}", object.kind())));
        }
        for key in object.try_iter().map_err(|e| Error::invalid(e.to_string()))? {
            let value = object.get_item(&key).map_err(|e| Error::invalid(e.to_string()))?;
            self.set_kwarg(&key.to_string(), value);
        }
        Ok(self)
    }

    fn set_kwarg(&mut self, name: &str, value: Value) {
        self.kwargs.retain(|(k, _)| k != name);
        self.kwargs.push((name.to_string(), value));
    }
}

/// A chat template, compiled, with the special tokens of its folder.
///
/// Rendering follows transformers' `apply_chat_template`: a sandboxed Jinja environment with
/// `trim_blocks` and `lstrip_blocks`, no trailing-newline keeping, the variables `messages`,
/// `tools` (none unless given), `documents` (none), `add_generation_prompt`, the folder's
/// special tokens (`bos_token`, `eos_token`, `pad_token`, `unk_token`) and extra arguments;
/// the functions `raise_exception(message)` and `strftime_now(format)`; a `tojson` filter
/// that writes what Python's `json.dumps` does; Python string and dict methods
/// (`.strip()`, `.split()`, `.startswith()`, `.items()`, ...).
#[derive(Clone)]
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    source: String,
    origin: String,
    special_tokens: Vec<(&'static str, String)>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("special_tokens", &self.special_tokens)
            .finish_non_exhaustive()
    }
}

/// The name of the one template in each environment.
const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`; errors name it `<string>`. No special tokens are set (pass them
    /// with [`ChatOptions::kwarg`]).
    #[allow(clippy::should_implement_trait)]
    pub fn from_str(source: &str) -> Result<Self> {
        Self::from_source(source, "<string>")
    }

    /// Compiles `source`; `origin` names it in errors (a file, a config key).
    pub fn from_source(source: impl Into<String>, origin: impl Into<String>) -> Result<Self> {
        let (source, origin) = (source.into(), origin.into());
        let mut env = minijinja::Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| template_error(ErrorKind::Internal, &origin, &e))?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_formatter(pycompat::format_value);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", pycompat::tojson);
        env.add_function("raise_exception", pycompat::raise_exception);
        env.add_function("strftime_now", pycompat::strftime_now);
        env.add_template_owned(NAME, pycompat::rewrite_generation_tags(&source))
            .map_err(|e| template_error(ErrorKind::LoadFailed, &origin, &e))?;
        Ok(ChatTemplate { env, source, origin, special_tokens: Vec::new() })
    }

    /// The `"default"` chat template of a model folder (or its only one) with the folder's
    /// special tokens; see [`TokenizerConfig`] for the files read.
    pub fn from_folder(dir: impl AsRef<Path>) -> Result<Self> {
        Self::from_config(&TokenizerConfig::from_folder(dir)?, None)
    }

    /// The chat template called `name` of a model folder (`"tool_use"`, ...).
    pub fn from_folder_named(dir: impl AsRef<Path>, name: &str) -> Result<Self> {
        Self::from_config(&TokenizerConfig::from_folder(dir)?, Some(name))
    }

    /// The template `name` (`None`: the default) of an already read configuration.
    pub fn from_config(config: &TokenizerConfig, name: Option<&str>) -> Result<Self> {
        let NamedTemplate { source, origin, .. } = config.chat_template(name)?;
        let mut template = Self::from_source(source.clone(), origin.clone())?;
        let tokens = [
            ("bos_token", &config.bos_token),
            ("eos_token", &config.eos_token),
            ("pad_token", &config.pad_token),
            ("unk_token", &config.unk_token),
        ];
        template.special_tokens =
            tokens.into_iter().filter_map(|(name, token)| token.clone().map(|t| (name, t))).collect();
        Ok(template)
    }

    /// The Jinja source as read (before any rewriting).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Where the template came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Renders `messages`, ending with the start of an assistant turn when
    /// `add_generation_prompt` is set.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, &ChatOptions::new().add_generation_prompt(add_generation_prompt))
    }

    /// Renders `messages` with tools and extra arguments. A template error, including one
    /// raised by the template with `raise_exception`, is an `InvalidArgument` error naming the
    /// template, the line and the message.
    pub fn render_with(&self, messages: &[Message], options: &ChatOptions) -> Result<String> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| Value::from_pairs([("role", m.role.as_str()), ("content", m.content.as_str())]))
            .collect();
        self.render_value(Value::from(messages), options)
    }

    /// Renders messages given as JSON text: a list of objects that may carry more than `role`
    /// and `content` (`tool_calls`, content parts, ...), as transformers takes them. Key order is
    /// kept (it shows in `tojson`).
    pub fn render_json(&self, messages_json: &str, options: &ChatOptions) -> Result<String> {
        let messages = parse_json(messages_json, "messages")?;
        if messages.kind() != minijinja::value::ValueKind::Seq {
            return Err(Error::invalid(format!("messages must be a JSON list, got {}", messages.kind())));
        }
        self.render_value(messages, options)
    }

    fn render_value(&self, messages: Value, options: &ChatOptions) -> Result<String> {
        const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];
        if let Some((name, _)) = options.kwargs.iter().find(|(k, _)| RESERVED.contains(&k.as_str())) {
            return Err(Error::invalid(format!(
                "chat template {}: {name:?} cannot be an extra argument (it has its own option)",
                self.origin
            )));
        }
        let mut context: Vec<(String, Value)> =
            self.special_tokens.iter().map(|(k, v)| (k.to_string(), Value::from(v.as_str()))).collect();
        for (key, value) in &options.kwargs {
            context.retain(|(k, _)| k != key);
            context.push((key.clone(), value.clone()));
        }
        context.push(("messages".into(), messages));
        context.push(("tools".into(), options.tools.clone().unwrap_or(Value::from(()))));
        context.push(("documents".into(), Value::from(())));
        context.push(("add_generation_prompt".into(), Value::from(options.add_generation_prompt)));
        let template =
            self.env.get_template(NAME).map_err(|e| template_error(ErrorKind::LoadFailed, &self.origin, &e))?;
        template
            .render(Value::from_pairs(context))
            .map_err(|e| template_error(ErrorKind::InvalidArgument, &self.origin, &e))
    }
}

/// A MiniJinja error as a Genesis error naming the template and the line.
fn template_error(kind: ErrorKind, origin: &str, e: &minijinja::Error) -> Error {
    let line = e.line().map(|l| format!(", line {l}")).unwrap_or_default();
    let mut message = format!("chat template {origin}{line}: {}", e.kind());
    if let Some(detail) = e.detail() {
        message.push_str(": ");
        message.push_str(detail);
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    Error::new(kind, message)
}

/// Parses JSON text into a template value, keeping map key order.
fn parse_json(json: &str, what: &str) -> Result<Value> {
    serde_json::from_str::<Value>(json).map_err(|e| Error::invalid(format!("{what}: invalid JSON: {e}")))
}
