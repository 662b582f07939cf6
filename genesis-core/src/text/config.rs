//! `tokenizer_config.json`, chat template files and stop ids of a model folder.

use super::tokenizer::Tokenizer;
use crate::{Error, Result};
use serde_json::Value as Json;
use std::path::Path;

/// One chat template of a model folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedTemplate {
    /// Its name: `"default"` for the main template (a plain string `chat_template` or
    /// `chat_template.jinja`), others as in the folder (`"tool_use"`, ...).
    pub name: String,
    /// The Jinja source.
    pub source: String,
    /// Where it was read from, for error messages (`.../chat_template.jinja`, or
    /// `.../tokenizer_config.json (chat_template "tool_use")`).
    pub origin: String,
}

/// What Genesis reads from a model folder's tokenizer configuration.
///
/// Sources, as transformers reads them: `tokenizer_config.json` (special tokens as strings or
/// `{"content": ...}` objects, `add_bos_token`, `chat_template` as a string or a list of
/// `{"name", "template"}`), `special_tokens_map.json` for tokens the former lacks,
/// `chat_template.jinja` (replaces the `"default"` template) and
/// `additional_chat_templates/<name>.jinja`. Every file is optional; unknown fields are
/// ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenizerConfig {
    /// The beginning-of-sequence token.
    pub bos_token: Option<String>,
    /// The end-of-sequence token.
    pub eos_token: Option<String>,
    /// The padding token.
    pub pad_token: Option<String>,
    /// The unknown token.
    pub unk_token: Option<String>,
    /// Whether the tokenizer adds a BOS token when encoding with special tokens.
    pub add_bos_token: Option<bool>,
    /// Whether the tokenizer adds an EOS token when encoding with special tokens.
    pub add_eos_token: Option<bool>,
    /// The chat templates, `"default"` first when there is one, then by name.
    pub chat_templates: Vec<NamedTemplate>,
    /// The folder (or file) this was read from, for error messages.
    pub origin: String,
}

impl TokenizerConfig {
    /// Reads the configuration files of a model folder (see the type's documentation).
    pub fn from_folder(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let mut config = match read_json(&dir.join("tokenizer_config.json"))? {
            Some(json) => Self::from_json(&json, &dir.join("tokenizer_config.json"))?,
            None => TokenizerConfig::default(),
        };
        config.origin = dir.display().to_string();
        let map_path = dir.join("special_tokens_map.json");
        if let Some(json) = read_json(&map_path)? {
            let map = Self::from_json(&json, &map_path)?;
            fill(&mut config.bos_token, map.bos_token);
            fill(&mut config.eos_token, map.eos_token);
            fill(&mut config.pad_token, map.pad_token);
            fill(&mut config.unk_token, map.unk_token);
        }
        let jinja = dir.join("chat_template.jinja");
        if let Some(source) = read_text(&jinja)? {
            config.set_template("default", source, jinja.display().to_string());
        }
        let extra = dir.join("additional_chat_templates");
        if extra.is_dir() {
            let entries = std::fs::read_dir(&extra).map_err(|e| read_error(&extra, e))?;
            let mut files = Vec::new();
            for entry in entries {
                let path = entry.map_err(|e| read_error(&extra, e))?.path();
                if path.extension().is_some_and(|x| x == "jinja") {
                    files.push(path);
                }
            }
            files.sort();
            for path in files {
                let name = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
                let source = read_text(&path)?.unwrap_or_default();
                config.set_template(&name, source, path.display().to_string());
            }
        }
        Ok(config)
    }

    /// Reads one `tokenizer_config.json` file (no other file of its folder).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        match read_json(path)? {
            Some(json) => Self::from_json(&json, path),
            None => Err(Error::load(format!("cannot read tokenizer config {}: no such file", path.display()))),
        }
    }

    fn from_json(json: &Json, path: &Path) -> Result<Self> {
        let origin = path.display().to_string();
        let Some(object) = json.as_object() else {
            return Err(malformed(&origin, "the top level is not a JSON object"));
        };
        let token = |key: &str| match object.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(Json::String(s)) => Ok(Some(s.clone())),
            Some(Json::Object(o)) => match o.get("content") {
                Some(Json::String(s)) => Ok(Some(s.clone())),
                _ => Err(malformed(&origin, &format!("{key} is an object without a string \"content\""))),
            },
            Some(other) => Err(malformed(&origin, &format!("{key} is {other}, not a string or an object"))),
        };
        let flag = |key: &str| match object.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(Json::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(malformed(&origin, &format!("{key} is {other}, not a boolean"))),
        };
        let mut config = TokenizerConfig {
            bos_token: token("bos_token")?,
            eos_token: token("eos_token")?,
            pad_token: token("pad_token")?,
            unk_token: token("unk_token")?,
            add_bos_token: flag("add_bos_token")?,
            add_eos_token: flag("add_eos_token")?,
            chat_templates: Vec::new(),
            origin: origin.clone(),
        };
        match object.get("chat_template") {
            None | Some(Json::Null) => {}
            Some(Json::String(s)) => config.set_template("default", s.clone(), format!("{origin} (chat_template)")),
            Some(Json::Array(list)) => {
                for entry in list {
                    let (Some(Json::String(name)), Some(Json::String(source))) =
                        (entry.get("name"), entry.get("template"))
                    else {
                        return Err(malformed(
                            &origin,
                            "a chat_template list entry is not {\"name\": string, \"template\": string}",
                        ));
                    };
                    let entry_origin = format!("{origin} (chat_template {name:?})");
                    config.set_template(name, source.clone(), entry_origin);
                }
            }
            Some(other) => {
                return Err(malformed(
                    &origin,
                    &format!("chat_template is a {}, not a string or a list", json_type(other)),
                ));
            }
        }
        Ok(config)
    }

    /// The chat template called `name`, or with `None` the `"default"` one (or the only one).
    /// The error lists the names there are.
    pub fn chat_template(&self, name: Option<&str>) -> Result<&NamedTemplate> {
        let names = || {
            let names: Vec<&str> = self.chat_templates.iter().map(|t| t.name.as_str()).collect();
            names.join(", ")
        };
        let found = match name {
            Some(name) => self.chat_templates.iter().find(|t| t.name == name),
            None if self.chat_templates.len() == 1 => self.chat_templates.first(),
            None => self.chat_templates.iter().find(|t| t.name == "default"),
        };
        found.ok_or_else(|| {
            let message = match (name, self.chat_templates.is_empty()) {
                (_, true) => format!(
                    "{} has no chat template (looked for chat_template.jinja, tokenizer_config.json's \
                     chat_template and additional_chat_templates/)",
                    self.origin
                ),
                (Some(name), false) => {
                    format!("{} has no chat template named {name:?} (it has: {})", self.origin, names())
                }
                (None, false) => format!(
                    "{} has several chat templates and none named \"default\" (it has: {}); pick one by name",
                    self.origin,
                    names()
                ),
            };
            Error::load(message)
        })
    }

    /// Adds or replaces the template `name`; `"default"` goes first, the others stay sorted.
    fn set_template(&mut self, name: &str, source: String, origin: String) {
        self.chat_templates.retain(|t| t.name != name);
        let template = NamedTemplate { name: name.to_string(), source, origin };
        let at = if name == "default" {
            0
        } else {
            self.chat_templates
                .iter()
                .position(|t| t.name != "default" && t.name.as_str() > name)
                .unwrap_or(self.chat_templates.len())
        };
        self.chat_templates.insert(at, template);
    }
}

/// The ids that end generation for the model in `dir`, deduplicated, in this order:
/// `eos_token_id` of `generation_config.json` (an integer or a list; `config.json`'s when
/// there is no `generation_config.json`), then the id of the tokenizer configuration's
/// `eos_token` (looked up in `tokenizer.json`). Missing files contribute nothing; a
/// malformed one, or an `eos_token` the tokenizer does not know, is an error.
pub fn stop_token_ids(dir: impl AsRef<Path>) -> Result<Vec<u32>> {
    let dir = dir.as_ref();
    // generation_config.json's eos ids, or config.json's without it (one parser for both).
    let mut ids = crate::generation::GenerationConfig::from_folder(dir)?.eos_token_ids;
    let config = TokenizerConfig::from_folder(dir)?;
    let tokenizer_path = dir.join("tokenizer.json");
    if let (Some(eos), true) = (&config.eos_token, tokenizer_path.is_file()) {
        let tokenizer = Tokenizer::from_file(&tokenizer_path)?;
        let id = tokenizer.token_to_id(eos).ok_or_else(|| {
            Error::invalid(format!("the eos_token {eos:?} of {} is not in {}", config.origin, tokenizer_path.display()))
        })?;
        ids.push(id);
    }
    let mut unique = Vec::with_capacity(ids.len());
    for id in ids {
        if !unique.contains(&id) {
            unique.push(id);
        }
    }
    Ok(unique)
}

/// Parses a JSON file; `None` when it does not exist.
pub(crate) fn read_json(path: &Path) -> Result<Option<Json>> {
    let Some(text) = read_text(path)? else { return Ok(None) };
    serde_json::from_str(&text).map(Some).map_err(|e| Error::load(format!("cannot parse {}: {e}", path.display())))
}

/// Reads a UTF-8 file; `None` when it does not exist.
pub(crate) fn read_text(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(read_error(path, e)),
    }
}

fn read_error(path: &Path, e: std::io::Error) -> Error {
    Error::load(format!("cannot read {}: {e}", path.display()))
}

fn malformed(origin: &str, what: &str) -> Error {
    Error::load(format!("malformed {origin}: {what}"))
}

fn fill(slot: &mut Option<String>, value: Option<String>) {
    if slot.is_none() {
        *slot = value;
    }
}

fn json_type(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "boolean",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "list",
        Json::Object(_) => "object",
    }
}
