//! Data loading: a [`Dataset`] gives items (tuples of tensors); a [`DataLoader`] groups them
//! into batches, shuffled with a seeded [`Generator`](crate::Generator) or in a [`Sampler`]'s
//! order (a [`DistributedSampler`] for data-parallel training), optionally prepared by worker
//! threads ahead of use.
//!
//! ```
//! use genesis::data::{DataLoader, TensorDataset};
//! use genesis::{DType, Device, Generator, Tensor};
//! use std::sync::Arc;
//! let cpu = Device::cpu()?;
//! let x = Tensor::arange(0.0, 10.0, 1.0, DType::F32, &cpu)?.reshape(&[5, 2])?;
//! let y = Tensor::from_vec(vec![0i64, 1, 0, 1, 1], &[5], &cpu)?;
//! let data = Arc::new(TensorDataset::new(vec![x, y])?);
//! let loader = DataLoader::new(data, 2)?.shuffle(Generator::new(0)).drop_last(true);
//! let mut batches = 0;
//! for batch in loader.iter() {
//!     let batch = batch?; // [x (2, 2), y (2)]
//!     assert_eq!(batch[0].shape(), &[2, 2]);
//!     batches += 1;
//! }
//! assert_eq!(batches, 2);
//! # Ok::<(), genesis::Error>(())
//! ```

mod dataset;
mod loader;
mod sampler;

pub use dataset::{collate, random_split, randperm, Dataset, Subset, TensorDataset};
pub use loader::{Batches, DataLoader};
pub use sampler::{DistributedSampler, Sampler};
