//! [`SftModel`]: what the fine-tuning loop needs of a causal language model.

use crate::models::qwen2::Qwen2ForCausalLM;
use crate::nn::Module;
use crate::{Device, Result, Tensor};
use std::path::Path;

/// A causal language model [`SftTrainer`](super::SftTrainer) can fine-tune: the final hidden
/// states and the head's weight (so the loss never materializes all logits), saving as a
/// model folder, and a fingerprint of its architecture (to refuse resuming another model's
/// checkpoint).
pub trait SftModel: Module {
    /// Final (normalized) hidden states `(b, s, dim)` of `ids (b, s)`; with
    /// `attention_mask (b, 1, s, s)` (bool, true where a query may see a key) instead of the
    /// plain causal mask.
    fn hidden_states(&self, ids: &Tensor, attention_mask: Option<&Tensor>) -> Result<Tensor>;
    /// The head's weight `(vocabulary, dim)`: logits are `hidden · weightᵀ`.
    fn lm_head_weight(&self) -> Tensor;
    /// Write the model as a folder its loader reads back (Hugging Face layout).
    fn save_pretrained(&self, dir: &Path) -> Result<()>;
    /// The device the parameters live on.
    fn device(&self) -> Device;
    /// A string naming the architecture and sizes.
    fn fingerprint(&self) -> String;
}

impl SftModel for Qwen2ForCausalLM {
    fn hidden_states(&self, ids: &Tensor, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        Qwen2ForCausalLM::hidden_states(self, ids, attention_mask)
    }
    fn lm_head_weight(&self) -> Tensor {
        Qwen2ForCausalLM::lm_head_weight(self)
    }
    fn save_pretrained(&self, dir: &Path) -> Result<()> {
        Qwen2ForCausalLM::save_pretrained(self, dir)
    }
    fn device(&self) -> Device {
        crate::generation::CausalLM::device(self)
    }
    fn fingerprint(&self) -> String {
        let c = &self.config;
        format!(
            "Qwen2ForCausalLM vocab {} hidden {} intermediate {} layers {} heads {}/{} head_dim {} tied {}",
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.tie_word_embeddings
        )
    }
}
