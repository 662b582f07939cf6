//! Image data for vision models, in torchvision's shape: datasets that decode PNG and JPEG
//! files ([`ImageFolder`]) or read CIFAR-10 ([`Cifar10`]), and the usual [`transforms`].
//! Items are `[image (3, h, w) f32, label () i64]` on the CPU, ready for a
//! [`DataLoader`](crate::data::DataLoader); random transforms run in the loader's workers and
//! are seeded from a Genesis [`Generator`](crate::Generator).
//!
//! The models are in [`crate::models::resnet`]. Needs the `vision` feature (on by default).

mod cifar;
mod folder;
mod pipeline;
pub mod transforms;

pub use cifar::{Cifar10, CIFAR10_CLASSES};
pub use folder::{BadFile, ImageFolder, IMAGE_EXTENSIONS};
