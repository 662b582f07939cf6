//! Qwen2 and Qwen2.5 language models from Hugging Face folders.
//!
//! ```no_run
//! use genesis::models::qwen2::Qwen2ForCausalLM;
//! use genesis::{DType, Device, Tensor};
//! let cpu = Device::cpu()?;
//! let model = Qwen2ForCausalLM::from_pretrained("path/to/Qwen2.5-0.5B-Instruct", &cpu, DType::F32)?;
//! let ids = Tensor::from_vec(vec![9707i64, 11, 1879], &[1, 3], &cpu)?;
//! let logits = genesis::nn::Module::forward(&model, &ids)?; // (1, 3, vocab)
//! # Ok::<(), genesis::Error>(())
//! ```
//!
//! What is supported: `Qwen2ForCausalLM` checkpoints (the Qwen2 and Qwen2.5 families) with
//! full attention and the default rotary embedding, tied or untied embeddings, one
//! safetensors file or shards with an index, weights cast to f32, f16 or bf16 on load. Not
//! supported (a clear error when a config asks for it): sliding-window attention, rotary
//! scaling (YaRN and other `rope_type`s), activations other than SiLU.

mod config;
mod model;

pub use config::Qwen2Config;
pub use model::{Qwen2Attention, Qwen2DecoderLayer, Qwen2ForCausalLM, Qwen2Mlp, Qwen2Model};

use crate::device::Device;
use crate::error::Result;
use crate::generation::CausalLM;
use crate::models::hf::{self, Weights};
use crate::models::KvCache;
use crate::nn::Module;
use crate::tensor::Tensor;
use genesis_backend_api::DType;
use std::path::Path;

impl Qwen2ForCausalLM {
    /// Load a Hugging Face model folder (`config.json` and `model.safetensors` or its shards)
    /// onto `device` in `dtype` (f32, f16 or bf16; the file's dtype is cast on the device).
    /// Weights are memory-mapped and each is copied once from the map to the device; casting
    /// and stacking q/k/v and gate/up make short-lived device copies, one layer's at a time.
    /// A missing file, a wrong
    /// architecture, or a weight that is missing or has the wrong shape is an error naming
    /// the file and the weight; nothing is returned half-loaded.
    pub fn from_pretrained(dir: impl AsRef<Path>, device: &Device, dtype: DType) -> Result<Qwen2ForCausalLM> {
        let dir = dir.as_ref();
        if !dtype.is_float() {
            return Err(crate::Error::invalid(format!("from_pretrained: dtype must be a float dtype, got {dtype}")));
        }
        let config = Qwen2Config::from_file(dir.join("config.json"))?;
        let weights = Weights::open(dir)?;
        Qwen2ForCausalLM::build(config, device, &mut |name, shape| weights.get(name, shape, dtype, device))
    }

    /// Write the model as a folder transformers loads (`from_pretrained`): `config.json`
    /// and `model.safetensors` with Hugging Face's names (the tied head is not stored, as
    /// transformers does). Copy the tokenizer files with [`hf::copy_tokenizer_files`].
    pub fn save_pretrained(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| crate::Error::invalid(format!("creating {}: {e}", dir.display())))?;
        let dtype = self.model.embed_tokens.weight.get().dtype();
        hf::write_weights(dir, &self.state_dict())?;
        hf::write_json(&dir.join("config.json"), &self.config.to_json(Some(dtype.name())))
    }
}

impl CausalLM for Qwen2ForCausalLM {
    fn forward_step(&self, ids: &Tensor, key_valid: Option<&Tensor>, cache: &mut KvCache) -> Result<Tensor> {
        Qwen2ForCausalLM::forward_step(self, ids, key_valid, cache)
    }
    fn forward_step_at(
        &self,
        ids: &Tensor,
        position: &Tensor,
        key_mask: &Tensor,
        cache: &mut KvCache,
    ) -> Option<Result<Tensor>> {
        Some(Qwen2ForCausalLM::forward_step_at(self, ids, position, key_mask, cache))
    }
    fn new_cache(&self, capacity: usize) -> KvCache {
        Qwen2ForCausalLM::new_cache(self, capacity)
    }
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn max_positions(&self) -> usize {
        self.config.max_position_embeddings
    }
    fn device(&self) -> Device {
        self.model.embed_tokens.weight.get().device().clone()
    }
}
