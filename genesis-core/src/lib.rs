#![warn(missing_docs)]
//! # Genesis
//!
//! A deep learning framework with PyTorch's programming model whose device backends are
//! plugins. The core never links a device backend (except the CPU backend, embedded as the
//! default); backends are `cdylib`s found at run time. See [`backends`] for what was found and
//! [`Device::parse`] to pick one.
//!
//! ```
//! use genesis::{Device, Tensor};
//! let cpu = Device::parse("cpu")?;
//! let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3], &cpu)?;
//! let b = Tensor::from_vec(vec![10.0f32], &[1], &cpu)?;
//! assert_eq!(a.add(&b)?.to_vec::<f32>()?, vec![11.0, 12.0, 13.0]);
//! # Ok::<(), genesis::Error>(())
//! ```

pub mod amp;
pub mod autograd;
pub mod backend;
pub mod checkpoint;
pub mod comm;
pub mod data;
mod device;
pub mod distributed;
mod element;
mod error;
pub mod generation;
pub mod graph;
pub mod models;
pub mod monitor;
pub mod nn;
mod ops;
pub mod optim;
pub mod profiler;
pub mod random;
pub mod serialize;
#[cfg(feature = "text")]
pub mod sft;
mod storage;
mod tensor;
pub mod testing;
#[cfg(feature = "text")]
pub mod text;
#[cfg(feature = "vision")]
pub mod vision;

pub use autograd::{grad, no_grad};
pub use backend::{backends, BackendStatus};
pub use device::Device;
pub use element::Element;
pub use error::{Error, ErrorKind, Result};
pub use genesis_backend_api::{ApiVersion, DType, DeviceActivity, EventId, GraphId, MemoryStats, API_VERSION};
pub use half::{bf16, f16};
pub use ops::{promote_types, Scalar};
pub use random::{manual_seed, Generator};
pub use tensor::{broadcast_shapes, Tensor, TensorData};
