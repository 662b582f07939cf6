//! `generation_config.json`: how a model likes to be sampled.

use crate::error::{Error, Result};
use crate::models::hf::read_json;
use serde_json::Value;
use std::path::Path;

/// Decoding settings, with transformers' meaning and defaults (greedy unless `do_sample`),
/// except `max_new_tokens`, 256 here (transformers' default stops at 20 tokens in all).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationConfig {
    /// Tokens to generate at most after the prompt.
    pub max_new_tokens: usize,
    /// Sample from the processed distribution; `false` is greedy decoding.
    pub do_sample: bool,
    /// Divides the logits before sampling (> 0).
    pub temperature: f64,
    /// Keep only the `top_k` most likely tokens (0: off).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (1: off).
    pub top_p: f64,
    /// Drop tokens less likely than `min_p` times the most likely one (0: off).
    pub min_p: f64,
    /// Penalize tokens already in the prompt or the output: positive logits are divided by it,
    /// negative ones multiplied (1: off).
    pub repetition_penalty: f64,
    /// Seed of the sampling noise; `None` draws from the global generator.
    pub seed: Option<u64>,
    /// A row stops when it produces one of these ids (the id is part of its output).
    pub eos_token_ids: Vec<u32>,
    /// Generation stops when the text contains one of these (checked by the caller that
    /// decodes, see [`find_stop_string`](super::find_stop_string)).
    pub stop_strings: Vec<String>,
    /// Id used for left padding and for rows that have finished.
    pub pad_token_id: Option<u32>,
    /// When to decode by replaying a captured device graph of the model's step (one launch
    /// per token instead of hundreds) where the model and the backend allow it. Greedy
    /// decoding without a repetition penalty then also chooses and feeds each token inside
    /// the graph, and reads the chosen ids [`TOKENS_PER_READ`](super::TOKENS_PER_READ) tokens
    /// at a time. Genesis's own setting, not read from `generation_config.json`.
    pub graph: GraphUse,
}

/// When generation captures its decode step as a graph ([`GenerationConfig::graph`]). The
/// generated ids are the same either way (in low precision up to ties: the captured step
/// attends with a masked kernel over the whole preallocated cache, which rounds differently).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GraphUse {
    /// Never: every token runs the step op by op.
    Never,
    /// For a single sequence only: the captured step attends over the whole preallocated
    /// cache, so with many rows and a cache much longer than the filled part it can cost more
    /// than the launches it saves.
    SingleSequence,
    /// Whenever the model and backend can (the default). Measured on an H100 with the
    /// Qwen2.5-0.5B shape after a 512-token prompt (benches/qwen2/RESULTS.md), captured
    /// against uncaptured in the same runs: 598 against 373 and 681 against 301 tokens/s at
    /// batch 1, 1,208 against 591 at batch 2, 11,936 against 5,880 at batch 32.
    #[default]
    Always,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        GenerationConfig {
            max_new_tokens: 256,
            do_sample: false,
            temperature: 1.0,
            top_k: 50,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            eos_token_ids: vec![],
            stop_strings: vec![],
            pad_token_id: None,
            graph: GraphUse::Always,
        }
    }
}

impl GenerationConfig {
    /// The defaults updated with `generation_config.json` in the folder `dir`: `do_sample`,
    /// `temperature`, `top_k`, `top_p`, `min_p`, `repetition_penalty`, `max_new_tokens`,
    /// `eos_token_id` (an int or a list), `pad_token_id`. Without that file, the end and pad
    /// ids come from `config.json`, as transformers falls back; without either, the defaults.
    pub fn from_folder(dir: impl AsRef<Path>) -> Result<GenerationConfig> {
        let mut path = dir.as_ref().join("generation_config.json");
        let mut config = GenerationConfig::default();
        if !path.is_file() {
            path = dir.as_ref().join("config.json");
            if !path.is_file() {
                return Ok(config);
            }
            let obj = read_json(&path)?;
            let origin = path.display().to_string();
            config.eos_token_ids = crate::models::hf::token_ids(obj.get("eos_token_id"), "eos_token_id", &origin)?;
            config.pad_token_id =
                crate::models::hf::token_ids(obj.get("pad_token_id"), "pad_token_id", &origin)?.first().copied();
            return Ok(config);
        }
        let obj = read_json(&path)?;
        let origin = path.display().to_string();
        let num = |key: &str| -> Result<Option<f64>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| Error::load(format!("{origin}: `{key}` must be a number, got {v}"))),
            }
        };
        match obj.get("do_sample") {
            None | Some(Value::Null) => {}
            Some(Value::Bool(v)) => config.do_sample = *v,
            Some(v) => return Err(Error::load(format!("{origin}: `do_sample` must be true or false, got {v}"))),
        }
        if let Some(v) = num("temperature")? {
            config.temperature = v;
        }
        if let Some(v) = num("top_k")? {
            config.top_k = v.max(0.0) as usize;
        }
        if let Some(v) = num("top_p")? {
            config.top_p = v;
        }
        if let Some(v) = num("min_p")? {
            config.min_p = v;
        }
        if let Some(v) = num("repetition_penalty")? {
            config.repetition_penalty = v;
        }
        if let Some(v) = num("max_new_tokens")? {
            config.max_new_tokens = v.max(0.0) as usize;
        }
        config.eos_token_ids = crate::models::hf::token_ids(obj.get("eos_token_id"), "eos_token_id", &origin)?;
        config.pad_token_id =
            crate::models::hf::token_ids(obj.get("pad_token_id"), "pad_token_id", &origin)?.first().copied();
        config.validate().map_err(|e| e.context(&origin))?;
        Ok(config)
    }

    /// Check that every setting is in range. The sampling settings matter, and are checked,
    /// only with `do_sample` (transformers ignores them for greedy decoding too).
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::invalid(format!("generation config: {what}")));
        if self.repetition_penalty.is_nan() || self.repetition_penalty <= 0.0 || self.repetition_penalty.is_infinite() {
            return bad(format!("repetition_penalty must be > 0, got {}", self.repetition_penalty));
        }
        if !self.do_sample {
            return Ok(());
        }
        if self.temperature.is_nan() || self.temperature <= 0.0 || self.temperature.is_infinite() {
            return bad(format!("temperature must be > 0 when sampling, got {}", self.temperature));
        }
        if self.top_p.is_nan() || self.top_p <= 0.0 || self.top_p > 1.0 {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        Ok(())
    }
}
