//! Neural-network building blocks in PyTorch's shape: the [`Module`] trait with named
//! parameters and buffers, state dicts and train/eval modes; layers; losses;
//! [`functional`] forms and [`init`]ializers.

mod activation;
mod attention;
mod container;
mod conv;
pub mod functional;
pub mod init;
mod linear;
mod loss;
mod module;
mod norm;

pub use crate::serialize::LoadReport;
pub use activation::{Flatten, Identity, ReLU, SiLU, Sigmoid, Softmax, Tanh, GELU};
pub use attention::{Dropout, MultiheadAttention};
pub use container::{ModuleList, Sequential};
pub use conv::{AdaptiveAvgPool2d, AvgPool2d, Conv2d, Conv2dOptions, MaxPool2d};
pub use functional::Reduction;
pub use linear::{Embedding, Linear};
pub use loss::{BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, L1Loss, MSELoss, NLLLoss};
pub use module::{Entry, Module, Param, TrainingFlag};
pub use norm::{BatchNorm, BatchNorm1d, BatchNorm2d, LayerNorm, RMSNorm};
