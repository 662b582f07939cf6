//! `config.json` of a Qwen2 / Qwen2.5 model folder, in both layouts transformers writes.

use crate::error::{Error, ErrorKind, Result};
use crate::models::hf::{read_json, token_ids, JsonObject};
use serde_json::{json, Value};
use std::path::Path;

/// The architecture hyperparameters of a Qwen2 model (`Qwen2Config` in transformers).
///
/// Read from `config.json` in either layout: transformers 4.x writes `rope_theta` at the top
/// level, 5.x nests it in `rope_parameters {rope_theta, rope_type}`. `"sliding_window": null`
/// is accepted, unknown fields are ignored (and written back unchanged by
/// [`Qwen2Config::to_json`]). Optional fields take transformers' defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2Config {
    /// Rows of the embedding table and of the output projection.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP's gate and up projections.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention; equal to the query heads when absent).
    pub num_key_value_heads: usize,
    /// Size of one head (`hidden_size / num_attention_heads` unless the file says otherwise).
    pub head_dim: usize,
    /// Longest sequence the rotary tables cover.
    pub max_position_embeddings: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f64,
    /// Base of the rotary frequencies.
    pub rope_theta: f64,
    /// `lm_head` shares the embedding table.
    pub tie_word_embeddings: bool,
    /// Standard deviation of the normal initialization of new weights.
    pub initializer_range: f64,
    /// Beginning-of-sequence id, when the file names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence ids (`eos_token_id` as an int or a list).
    pub eos_token_ids: Vec<u32>,
    /// The dtype the weights were saved in (`dtype`, or `torch_dtype` in 4.x), if stated.
    pub saved_dtype: Option<String>,
    /// Every field of the file as read, so that saving writes back what Genesis does not use.
    pub extra: JsonObject,
}

fn field<'a>(obj: &'a JsonObject, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn usize_field(obj: &JsonObject, key: &str, origin: &str) -> Result<Option<usize>> {
    match field(obj, key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
            Error::new(ErrorKind::LoadFailed, format!("{origin}: `{key}` must be a non-negative integer, got {v}"))
        }),
    }
}

fn required(obj: &JsonObject, key: &str, origin: &str) -> Result<usize> {
    let n = usize_field(obj, key, origin)?
        .ok_or_else(|| Error::new(ErrorKind::LoadFailed, format!("{origin}: missing required field `{key}`")))?;
    if n == 0 {
        return Err(Error::new(ErrorKind::LoadFailed, format!("{origin}: `{key}` must be positive")));
    }
    Ok(n)
}

fn bool_field(obj: &JsonObject, key: &str, origin: &str) -> Result<Option<bool>> {
    match field(obj, key) {
        None => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| {
            Error::new(ErrorKind::LoadFailed, format!("{origin}: `{key}` must be true or false, got {v}"))
        }),
    }
}

fn f64_field(obj: &JsonObject, key: &str, origin: &str) -> Result<Option<f64>> {
    match field(obj, key) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| Error::new(ErrorKind::LoadFailed, format!("{origin}: `{key}` must be a number, got {v}"))),
    }
}

impl Qwen2Config {
    /// Read `config.json` (the file itself, or the model folder holding it).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Qwen2Config> {
        let path = path.as_ref();
        let path = if path.is_dir() { path.join("config.json") } else { path.to_path_buf() };
        let obj = read_json(&path)?;
        Self::from_json(obj, &path.display().to_string())
    }

    /// Parse the object of a `config.json`; `origin` names the file in errors.
    pub fn from_json(obj: JsonObject, origin: &str) -> Result<Qwen2Config> {
        let unsupported = |what: String| Error::new(ErrorKind::Unsupported, format!("{origin}: {what}"));
        match field(&obj, "architectures") {
            Some(Value::Array(archs)) => {
                if !archs.iter().any(|a| a.as_str() == Some("Qwen2ForCausalLM")) {
                    return Err(unsupported(format!(
                        "`architectures` is {}, expected [\"Qwen2ForCausalLM\"]",
                        Value::Array(archs.clone())
                    )));
                }
            }
            Some(other) => return Err(unsupported(format!("`architectures` must be a list, got {other}"))),
            None => match field(&obj, "model_type").and_then(Value::as_str) {
                Some("qwen2") => {}
                other => {
                    return Err(Error::new(
                        ErrorKind::LoadFailed,
                        format!(
                            "{origin}: missing required field `architectures` (and `model_type` is {other:?}, not \
                             \"qwen2\")"
                        ),
                    ))
                }
            },
        }
        if let Some(act) = field(&obj, "hidden_act") {
            if act.as_str() != Some("silu") {
                return Err(unsupported(format!("`hidden_act` {act} is not supported (Qwen2 uses \"silu\")")));
            }
        }
        if bool_field(&obj, "use_sliding_window", origin)? == Some(true) {
            return Err(unsupported("`use_sliding_window: true` is not supported (full attention only)".into()));
        }
        let vocab_size = required(&obj, "vocab_size", origin)?;
        let hidden_size = required(&obj, "hidden_size", origin)?;
        let intermediate_size = required(&obj, "intermediate_size", origin)?;
        let num_hidden_layers = required(&obj, "num_hidden_layers", origin)?;
        let num_attention_heads = required(&obj, "num_attention_heads", origin)?;
        let num_key_value_heads = usize_field(&obj, "num_key_value_heads", origin)?.unwrap_or(num_attention_heads);
        if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(Error::new(
                ErrorKind::LoadFailed,
                format!(
                    "{origin}: `num_attention_heads` ({num_attention_heads}) must be a multiple of \
                     `num_key_value_heads` ({num_key_value_heads})"
                ),
            ));
        }
        let head_dim = match usize_field(&obj, "head_dim", origin)? {
            Some(d) => d,
            None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
            None => {
                return Err(Error::new(
                    ErrorKind::LoadFailed,
                    format!("{origin}: `hidden_size` {hidden_size} is not a multiple of `num_attention_heads`"),
                ))
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(Error::new(ErrorKind::LoadFailed, format!("{origin}: head size {head_dim} must be even")));
        }
        // transformers 5.x: `rope_parameters {rope_theta, rope_type}`; 4.x: top-level
        // `rope_theta` and an optional `rope_scaling`.
        let rope_params = field(&obj, "rope_parameters").and_then(Value::as_object);
        let rope_theta = match rope_params {
            Some(p) => f64_field(p, "rope_theta", origin)?,
            None => None,
        };
        let rope_theta = match rope_theta {
            Some(t) => t,
            None => f64_field(&obj, "rope_theta", origin)?.unwrap_or(10000.0),
        };
        let rope_type = rope_params
            .and_then(|p| field(p, "rope_type"))
            .or_else(|| field(&obj, "rope_scaling").and_then(|s| s.get("rope_type").or_else(|| s.get("type"))))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if rope_type != "default" {
            return Err(unsupported(format!("rope type `{rope_type}` is not supported (only \"default\")")));
        }
        if rope_theta.is_nan() || rope_theta <= 0.0 || rope_theta.is_infinite() {
            return Err(Error::new(ErrorKind::LoadFailed, format!("{origin}: `rope_theta` must be positive")));
        }
        let rms_norm_eps = f64_field(&obj, "rms_norm_eps", origin)?.unwrap_or(1e-6);
        if rms_norm_eps.is_nan() || rms_norm_eps < 0.0 {
            return Err(Error::new(ErrorKind::LoadFailed, format!("{origin}: `rms_norm_eps` must be >= 0")));
        }
        let bos_token_id = token_ids(field(&obj, "bos_token_id"), "bos_token_id", origin)?.first().copied();
        Ok(Qwen2Config {
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            max_position_embeddings: usize_field(&obj, "max_position_embeddings", origin)?.unwrap_or(32768),
            rms_norm_eps,
            rope_theta,
            tie_word_embeddings: bool_field(&obj, "tie_word_embeddings", origin)?.unwrap_or(false),
            initializer_range: f64_field(&obj, "initializer_range", origin)?.unwrap_or(0.02),
            bos_token_id,
            eos_token_ids: token_ids(field(&obj, "eos_token_id"), "eos_token_id", origin)?,
            saved_dtype: field(&obj, "dtype")
                .or_else(|| field(&obj, "torch_dtype"))
                .and_then(Value::as_str)
                .map(String::from),
            extra: obj,
        })
    }

    /// The shape of Qwen2.5-0.5B (hidden 896, 24 layers, 14 query and 2 key/value heads of 64,
    /// vocabulary 151936, tied embeddings), for benchmarks with random weights.
    pub fn qwen2_5_0_5b() -> Qwen2Config {
        Qwen2Config {
            vocab_size: 151936,
            hidden_size: 896,
            intermediate_size: 4864,
            num_hidden_layers: 24,
            num_attention_heads: 14,
            num_key_value_heads: 2,
            head_dim: 64,
            max_position_embeddings: 32768,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            tie_word_embeddings: true,
            initializer_range: 0.02,
            bos_token_id: Some(151643),
            eos_token_ids: vec![151645],
            saved_dtype: Some("bfloat16".into()),
            extra: JsonObject::new(),
        }
    }

    /// The config as `config.json` content: the fields read from the file, updated with this
    /// struct's values, in the layout transformers 5.x writes (`rope_parameters`) with the
    /// top-level `rope_theta` of 4.x kept beside it so both versions read it.
    pub fn to_json(&self, dtype: Option<&str>) -> JsonObject {
        let mut obj = self.extra.clone();
        let mut set = |k: &str, v: Value| {
            obj.insert(k.to_string(), v);
        };
        set("architectures", json!(["Qwen2ForCausalLM"]));
        set("model_type", json!("qwen2"));
        set("vocab_size", json!(self.vocab_size));
        set("hidden_size", json!(self.hidden_size));
        set("intermediate_size", json!(self.intermediate_size));
        set("num_hidden_layers", json!(self.num_hidden_layers));
        set("num_attention_heads", json!(self.num_attention_heads));
        set("num_key_value_heads", json!(self.num_key_value_heads));
        set("max_position_embeddings", json!(self.max_position_embeddings));
        set("rms_norm_eps", json!(self.rms_norm_eps));
        set("rope_theta", json!(self.rope_theta));
        set("rope_parameters", json!({"rope_theta": self.rope_theta, "rope_type": "default"}));
        set("tie_word_embeddings", json!(self.tie_word_embeddings));
        set("initializer_range", json!(self.initializer_range));
        set("hidden_act", json!("silu"));
        if self.head_dim * self.num_attention_heads != self.hidden_size {
            set("head_dim", json!(self.head_dim));
        }
        if let Some(b) = self.bos_token_id {
            set("bos_token_id", json!(b));
        }
        match self.eos_token_ids.as_slice() {
            [] => {}
            [one] => set("eos_token_id", json!(one)),
            many => set("eos_token_id", json!(many)),
        }
        if let Some(d) = dtype.or(self.saved_dtype.as_deref()) {
            set("dtype", json!(d));
            set("torch_dtype", json!(d));
        }
        obj
    }
}
