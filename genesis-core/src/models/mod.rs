//! Models written on the public `nn` API, loaded from and saved to Hugging Face folders.
//!
//! - [`qwen2`]: Qwen2 / Qwen2.5 causal language models.
//! - [`resnet`]: ResNets for image classification, torchvision-compatible.
//! - [`hf`]: reading and writing the files of a Hugging Face model folder.
//! - [`KvCache`]: the key/value cache of incremental decoding.

pub mod hf;
mod kv_cache;
pub mod qwen2;
pub mod resnet;
mod rope;

pub use kv_cache::KvCache;
pub use rope::RotaryTables;
