//! Hugging Face model folders: JSON files and safetensors weights (one file, or shards listed
//! in `model.safetensors.index.json`), memory-mapped so that loading never holds a second
//! full copy of the checkpoint on the host.

use crate::device::Device;
use crate::error::{Error, ErrorKind, Result};
use crate::ops::shape_err;
use crate::serialize::{self, Metadata, StateDict};
use crate::tensor::Tensor;
use genesis_backend_api::DType;
use safetensors::SafeTensors;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A JSON object (the top level of `config.json` and friends).
pub type JsonObject = serde_json::Map<String, serde_json::Value>;

fn load_err(message: String) -> Error {
    Error::new(ErrorKind::LoadFailed, message)
}

/// Read a JSON file whose top level is an object; errors name the file.
pub fn read_json(path: &Path) -> Result<JsonObject> {
    let text = std::fs::read_to_string(path).map_err(|e| load_err(format!("reading {}: {e}", path.display())))?;
    match serde_json::from_str(&text) {
        Ok(serde_json::Value::Object(obj)) => Ok(obj),
        Ok(_) => Err(load_err(format!("{}: expected a JSON object at the top level", path.display()))),
        Err(e) => Err(load_err(format!("{}: not valid JSON: {e}", path.display()))),
    }
}

/// Token ids given as an int or a list of ints.
pub(crate) fn token_ids(v: Option<&serde_json::Value>, key: &str, origin: &str) -> Result<Vec<u32>> {
    let bad = || Error::new(ErrorKind::LoadFailed, format!("{origin}: `{key}` must be a token id or a list of ids"));
    let one = |v: &serde_json::Value| v.as_u64().filter(|&n| n <= u32::MAX as u64).map(|n| n as u32).ok_or_else(bad);
    match v {
        None | Some(serde_json::Value::Null) => Ok(vec![]),
        Some(serde_json::Value::Array(items)) => items.iter().map(one).collect(),
        Some(v) => Ok(vec![one(v)?]),
    }
}

/// The memory-mapped safetensors files of a model folder, indexed by tensor name.
pub struct Weights {
    files: Vec<(PathBuf, memmap2::Mmap)>,
    /// Tensor name → index into `files`.
    index: BTreeMap<String, usize>,
}

impl Weights {
    /// Map the weights of the folder `dir`: `model.safetensors`, or the shards that
    /// `model.safetensors.index.json` lists. Every file is checked to be a readable
    /// safetensors file (a truncated or corrupt shard is an error naming it) and every
    /// tensor the index names must be in its shard.
    pub fn open(dir: &Path) -> Result<Weights> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let (paths, expected): (Vec<PathBuf>, Option<BTreeMap<String, String>>) = if single.is_file() {
            (vec![single], None)
        } else if index_path.is_file() {
            let obj = read_json(&index_path)?;
            let map = obj.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| {
                load_err(format!("{}: missing required field `weight_map` (an object)", index_path.display()))
            })?;
            let mut names = BTreeMap::new();
            for (tensor, file) in map {
                let file = file.as_str().filter(|f| !f.contains('/') && !f.contains('\\')).ok_or_else(|| {
                    load_err(format!("{}: `weight_map.{tensor}` must be a file name", index_path.display()))
                })?;
                names.insert(tensor.clone(), file.to_string());
            }
            if names.is_empty() {
                return Err(load_err(format!("{}: `weight_map` lists no tensors", index_path.display())));
            }
            let mut files: Vec<String> = names.values().cloned().collect();
            files.sort();
            files.dedup();
            (files.iter().map(|f| dir.join(f)).collect(), Some(names))
        } else {
            return Err(load_err(format!(
                "{}: no model.safetensors or model.safetensors.index.json in the folder",
                dir.display()
            )));
        };
        let mut files = Vec::new();
        let mut index = BTreeMap::new();
        for (i, path) in paths.into_iter().enumerate() {
            let file = std::fs::File::open(&path).map_err(|e| load_err(format!("opening {}: {e}", path.display())))?;
            // SAFETY: the map is read-only; as with every memory-mapped loader, a file changed
            // by another process while it is mapped is outside what this can guard against.
            let map = unsafe { memmap2::Mmap::map(&file) }
                .map_err(|e| load_err(format!("mapping {}: {e}", path.display())))?;
            let st = SafeTensors::deserialize(&map)
                .map_err(|e| load_err(format!("{}: {}", path.display(), serialize::describe_error(&e, map.len()))))?;
            for name in st.names() {
                index.insert(name.to_string(), i);
            }
            files.push((path, map));
        }
        if let Some(expected) = expected {
            for (tensor, file) in expected {
                match index.get(&tensor) {
                    Some(&i) if files[i].0.file_name().and_then(|n| n.to_str()) == Some(file.as_str()) => {}
                    _ => {
                        return Err(load_err(format!(
                            "{}: tensor `{tensor}` is listed in model.safetensors.index.json but is not in {file}",
                            dir.join(&file).display()
                        )))
                    }
                }
            }
        }
        Ok(Weights { files, index })
    }

    /// True when the checkpoint has a tensor named `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Every tensor name of the checkpoint.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// The tensor `name`, checked to have `shape`, on `device` in `dtype` (a float dtype;
    /// the cast runs on the device after one copy from the mapped file).
    pub fn get(&self, name: &str, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let &i =
            self.index.get(name).ok_or_else(|| load_err(format!("{}: missing weight `{name}`", self.describe())))?;
        let (path, map) = &self.files[i];
        let st = SafeTensors::deserialize(map)
            .map_err(|e| load_err(format!("{}: {}", path.display(), serialize::describe_error(&e, map.len()))))?;
        let view = st.tensor(name).map_err(|e| load_err(format!("{}: tensor `{name}`: {e}", path.display())))?;
        if view.shape() != shape {
            return Err(shape_err(format!(
                "{}: weight `{name}` has shape {:?}, the config implies {shape:?}",
                path.display(),
                view.shape()
            )));
        }
        let t = serialize::tensor_from_view(&view, device)
            .map_err(|e| e.context(format_args!("{}: tensor `{name}`", path.display())))?;
        if !t.dtype().is_float() {
            return Err(Error::new(
                ErrorKind::DtypeMismatch,
                format!("{}: weight `{name}` has dtype {}, expected a float dtype", path.display(), t.dtype()),
            ));
        }
        crate::autograd::no_grad(|| t.to_dtype(dtype))
    }

    fn describe(&self) -> String {
        match self.files.as_slice() {
            [(p, _)] => p.display().to_string(),
            [(p, _), ..] => {
                format!("{} (in {} shards)", p.parent().unwrap_or(Path::new(".")).display(), self.files.len())
            }
            [] => "the checkpoint (no files)".into(),
        }
    }
}

/// Parse a dtype as transformers names it (`"bfloat16"`) or as Genesis does (`"bf16"`).
pub fn parse_dtype(name: &str) -> Result<DType> {
    Ok(match name {
        "float32" | "f32" | "fp32" => DType::F32,
        "float16" | "f16" | "fp16" | "half" => DType::F16,
        "bfloat16" | "bf16" => DType::BF16,
        "float64" | "f64" => DType::F64,
        other => return Err(Error::invalid(format!("unknown dtype `{other}` (expected f32, f16, bf16 or f64)"))),
    })
}

/// Write `json` to `path` (pretty, as transformers writes it), atomically.
pub fn write_json(path: &Path, json: &JsonObject) -> Result<()> {
    let text = serde_json::to_string_pretty(json).map_err(|e| Error::invalid(format!("serializing JSON: {e}")))?;
    serialize::write_atomically(path, |f| std::io::Write::write_all(f, format!("{text}\n").as_bytes()))
}

/// Write `weights` as `model.safetensors` in `dir` with the metadata transformers writes
/// (`format: pt`), atomically.
pub fn write_weights(dir: &Path, weights: &StateDict) -> Result<()> {
    let mut metadata = Metadata::new();
    metadata.insert("format".into(), "pt".into());
    serialize::save(dir.join("model.safetensors"), weights, &metadata)
}

/// The tokenizer and generation files of a model folder, copied by [`copy_tokenizer_files`].
pub const TOKENIZER_FILES: [&str; 7] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
];

/// Copy the tokenizer, chat template and generation files that exist in `from` to `to`, so a
/// folder written by `save_pretrained` is complete.
pub fn copy_tokenizer_files(from: &Path, to: &Path) -> Result<()> {
    for name in TOKENIZER_FILES {
        let src = from.join(name);
        if src.is_file() {
            let bytes = std::fs::read(&src).map_err(|e| load_err(format!("reading {}: {e}", src.display())))?;
            serialize::write_atomically(to.join(name), |f| std::io::Write::write_all(f, &bytes))?;
        }
    }
    Ok(())
}
