//! Saving and loading tensors: state dicts as safetensors files with PyTorch / Hugging Face
//! names. Training checkpoints, which add optimizer and scheduler state, are
//! [`crate::checkpoint`].
//!
//! Files are written atomically ([`write_atomically`]): a crash during a save leaves the
//! previous file as it was.
//!
//! ```
//! use genesis::serialize::{load, save, Metadata, StateDict};
//! use genesis::{Device, Tensor};
//! let cpu = Device::cpu()?;
//! let mut sd = StateDict::new();
//! sd.insert("layer.weight".into(), Tensor::new([[1.0f32, 2.0], [3.0, 4.0]], &cpu)?);
//! let path = std::env::temp_dir().join(format!("genesis-doc-{}.safetensors", std::process::id()));
//! save(&path, &sd, &Metadata::new())?;
//! let back = load(&path, &cpu)?;
//! assert_eq!(back["layer.weight"].to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0]);
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), genesis::Error>(())
//! ```

mod atomic;
mod load_into;
pub(crate) mod safetensors_io;

pub(crate) use atomic::remove_stale_temporaries;
pub use atomic::write_atomically;
pub use load_into::{load_state_dict_into, LoadReport};
pub(crate) use safetensors_io::{describe_error, tensor_from_view};
pub use safetensors_io::{
    from_bytes, load, load_with_metadata, save, to_bytes, to_bytes_with_checksums, CHECKSUM_PREFIX,
};

use crate::tensor::Tensor;
use std::collections::BTreeMap;

/// Named tensors, as `model.state_dict()` returns them in PyTorch: dotted names
/// (`"layers.0.weight"`) mapped to tensors. Sorted, so files and reports are deterministic.
pub type StateDict = BTreeMap<String, Tensor>;

/// Free-form string metadata stored in a safetensors header (`__metadata__`).
pub type Metadata = BTreeMap<String, String>;
