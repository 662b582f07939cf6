#![warn(missing_docs)]
//! # genesis-backend-api
//!
//! The versioned interface between the Genesis core and its device backends, and the SDK for
//! writing a backend plugin.
//!
//! A backend is a `cdylib` the core discovers and loads at run time. Its author implements two
//! safe traits, [`Backend`] and [`Device`], and writes one line:
//!
//! ```ignore
//! genesis_backend_api::export_backend!("mydev", MyBackend, MyBackend::new);
//! ```
//!
//! The macro exports a [`abi::PluginDeclaration`] (name and interface version, readable without
//! running plugin code) and an abi_stable root module whose every function catches panics and
//! turns them into [`ErrorKind::Internal`] errors. Optional parts of the interface have default
//! methods: most return [`ErrorKind::Unsupported`], and some do the work a simple backend needs
//! (`synchronize` and `empty_cache` succeed, collectives go through host memory); each method's
//! doc, and the table in the backend guide, says which.
//!
//! ## Versions
//! [`API_VERSION`] is `major.minor`, independent of crate versions. A minor version only appends
//! functions to the root module or values to open enums ([`DType`], [`OpKind`], [`ErrorKind`]);
//! receivers refuse unknown values with `Unsupported`. The host loads any plugin of its major
//! version and never calls a function the plugin lacks. See `CHANGELOG.md`.
//!
//! ## Operations
//! Ops are described by [`Op`] on strided [`TensorDesc`]s; [`Device::capabilities`] lists the
//! (op, dtype) pairs a device runs. The [`sdk`] module has helpers for validating operands and
//! walking strided tensors; [`sdk::required`] is the set of pairs the core needs for
//! tensors, autograd and training in a dtype.
//!
//! Conventions shared by every op (normative):
//! - Inputs are read-only; outputs are written and may not overlap each other or the inputs
//!   unless the op says "in place".
//! - Broadcasting is resolved by the core: inputs arrive with the output's shape and stride 0
//!   on broadcast dims.
//! - "last dim" ops (softmax, norms, cross-entropy) treat all leading dims as rows.
//! - f16/bf16 reductions and contractions accumulate in f32.
//! - The *compute type* of a float dtype is f32 for f16, bf16 and f32, and f64 for f64. An op
//!   that computes "in the compute type" widens its inputs to it, computes, and rounds each
//!   result to the output dtype once.
//! - A [`Capability`] names an op and the dtype of its first input (of its output when it has
//!   no inputs). So `where` is claimed under `bool`, its condition's dtype, and `cast` under
//!   the dtype it reads.
//! - Each op's dtype domain is published with it ([`Op::domain`]); the core never issues a
//!   pair outside it.

pub mod abi;
mod dtype;
mod error;
#[doc(hidden)]
pub mod export;
mod info;
mod op;
pub mod sdk;
mod tensor;
mod traits;

pub use abi_stable;
pub use dtype::DType;
pub use error::{BackendError, ErrorKind, RawError, Result};
pub use info::{BackendInfo, DeviceProperties, MemoryStats, Probe, RawBackendInfo, RawDeviceProperties, RawProbe};
pub use op::{BinaryOp, Capability, CollectiveOp, Domain, Op, OpAttrs, OpKind, RawOp, ReduceOp, UnaryOp, Window2d};
pub use tensor::{contiguous_strides, is_contiguous, BufferId, TensorDesc, MAX_DIMS};
pub use traits::{Backend, CollectiveArg, CommId, Device, DeviceActivity, EventId, GraphId, Rank};

/// An interface version, `major.minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ApiVersion {
    /// Incompatible changes bump this.
    pub major: u32,
    /// Compatible additions bump this.
    pub minor: u32,
}

impl std::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The interface version this crate defines (see `CHANGELOG.md` for what each minor added).
pub const API_VERSION: ApiVersion =
    ApiVersion { major: 1, minor: if cfg!(feature = "fixture-api-1-0") { 0 } else { 13 } };
