//! Saving and loading tensors: state dicts as safetensors files with PyTorch / Hugging Face
//! names, and training checkpoints.

use crate::tensor::Tensor;
use std::collections::BTreeMap;

/// Named tensors, as `model.state_dict()` returns them in PyTorch: dotted names
/// (`"layers.0.weight"`) mapped to tensors. Sorted, so files and reports are deterministic.
pub type StateDict = BTreeMap<String, Tensor>;
