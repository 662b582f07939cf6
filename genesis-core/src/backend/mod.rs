//! Backends: discovery, loading and the safe host-side handle to a plugin's module.
//!
//! Discovery order (first match per name wins; later ones are listed as shadowed):
//! 1. [`load_library`] calls (these replace an auto-discovered backend of the same name);
//! 2. `GENESIS_BACKENDS=name=path,...`;
//! 3. the directories of `GENESIS_PLUGIN_PATH` (OS path-list syntax);
//! 4. the running executable's directory and its parents up to the cargo target profile
//!    directory (so `cargo build` output is found with no setup);
//! 5. `~/.local/lib/genesis/plugins`;
//! 6. the CPU backend linked into the core (feature `embedded-cpu`).
//!
//! Loading is cheap and touches no device library; probing (device count, availability) runs
//! on first need and is cached. A plugin that fails to load or probe never stops the core;
//! [`backends`] lists it with the reason, and asking for it by name returns that reason.

mod loader;
mod registry;

use crate::error::{Error, ErrorKind, Result};
use abi_stable::std_types::RSlice;
use genesis_backend_api::abi::{PluginModuleRef, RawResult};
use genesis_backend_api::{ApiVersion, BackendInfo, Probe};
use genesis_backend_api::{CollectiveArg, CollectiveOp};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

pub(crate) use registry::find;
pub use registry::{backends, load_library, plugin_file_name, BackendStatus};

thread_local! {
    /// The highest 1.x interface the core uses new op inputs of, on this thread (testing:
    /// [`crate::testing::as_interface`]).
    pub(crate) static INTERFACE_CAP: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// (op kind code, dtype code) pairs a device claims.
pub(crate) type CapabilitySet = Arc<HashSet<(u32, u32)>>;

/// Where a backend came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Linked into the core (the `embedded-cpu` feature).
    Embedded,
    /// Loaded from this file.
    Path(PathBuf),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Embedded => f.write_str("embedded"),
            Origin::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Which discovery step found a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// [`load_library`].
    Explicit,
    /// The `GENESIS_BACKENDS` variable.
    BackendsVar,
    /// A directory of `GENESIS_PLUGIN_PATH`.
    PluginPath,
    /// Next to the running executable.
    ExecutableDir,
    /// `~/.local/lib/genesis/plugins`.
    UserDir,
    /// Linked into the core.
    Embedded,
}

/// A loaded backend plugin. Shared by every device and tensor that uses it; never unloaded.
pub struct Backend {
    name: String,
    origin: Origin,
    plugin_version: String,
    api: ApiVersion,
    module: PluginModuleRef,
    probe: OnceLock<Probe>,
    /// Capability sets per device index, read once.
    capabilities: Mutex<HashMap<u32, CapabilitySet>>,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend").field("name", &self.name).field("origin", &self.origin).finish()
    }
}

impl Backend {
    /// The device-type name (`"cpu"`, `"cuda"`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where it was loaded from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// The interface version the plugin was built against.
    pub fn api_version(&self) -> ApiVersion {
        self.api
    }

    /// Whether two outputs of one op may interleave in one buffer without sharing a byte
    /// (the halves of a stacked gradient's rows): plugins of interface 1.9 or later take
    /// them; older ones refuse them as overlapping.
    pub(crate) fn takes_interleaved_outputs(&self) -> bool {
        self.speaks(9)
    }

    /// Whether the plugin's interface is at least `1.minor`, as far as the core's use of the
    /// additions of later minors to existing ops goes ([`crate::testing::as_interface`] can
    /// lower it on a thread, to exercise the paths for older plugins).
    fn speaks(&self, minor: u32) -> bool {
        let cap = INTERFACE_CAP.with(std::cell::Cell::get);
        self.api.major > 1 || self.api.minor.min(cap.unwrap_or(u32::MAX)) >= minor
    }

    /// Whether `AdamW` takes a gradient scale as its last input (plugins of interface 1.10 or
    /// later); older ones get gradients scaled beforehand.
    pub(crate) fn takes_adamw_grad_scale(&self) -> bool {
        self.speaks(10)
    }

    /// Whether `RmsNormBackward` takes the gradient of its input's other uses as a fifth input
    /// `dsum` (plugins of interface 1.11 or later); older ones get it added afterwards.
    pub(crate) fn takes_rms_norm_dsum(&self) -> bool {
        self.speaks(11)
    }

    /// Whether `AddRmsNorm` and `RmsNormBackward` take their mixed-precision forms (an f32
    /// stream with an f16/bf16 residual, y or dy; plugins of interface 1.12 or later); older
    /// ones get f32 operands, cast around the op.
    pub(crate) fn takes_mixed_norms(&self) -> bool {
        self.speaks(12)
    }

    /// Whether the mixed form of `RmsNormBackward` takes a third output, dx rounded to dy's half
    /// dtype (plugins of interface 1.13 or later).
    pub(crate) fn takes_half_dx(&self) -> bool {
        self.speaks(13)
    }

    /// Whether `Matmul` writes f32 products of f16/bf16 operands (its widened form; plugins of
    /// interface 1.13 or later).
    pub(crate) fn takes_widened_matmul(&self) -> bool {
        self.speaks(13)
    }

    /// The plugin's own version.
    pub fn plugin_version(&self) -> &str {
        &self.plugin_version
    }

    /// Name, vendor, version and description as the plugin reports them.
    pub fn info(&self) -> Result<BackendInfo> {
        self.check((self.module.info())(), "info").map(Into::into)
    }

    /// Device count and availability (probed once, then cached).
    pub fn probe(&self) -> &Probe {
        self.probe.get_or_init(|| match self.check((self.module.probe())(), "probe") {
            Ok(raw) => raw.into(),
            Err(e) => Probe { device_count: 0, unavailable_reason: Some(e.to_string()) },
        })
    }

    /// Run a collective over devices of this backend (low level: descriptors, not tensors).
    /// A plugin built against an interface without collectives reads as `Unsupported`.
    pub fn collective(&self, op: CollectiveOp, args: &[CollectiveArg]) -> Result<()> {
        let Some(function) = self.module.collective() else {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("backend '{}' (interface {}) does not provide `collective`", self.name, self.api),
            ));
        };
        self.check(function(op as u32, RSlice::from_slice(args)), "collective")
    }

    /// The capability set of device `index`, fetched with `fetch` on first use.
    pub(crate) fn capabilities(
        &self,
        index: u32,
        fetch: impl FnOnce() -> Result<Vec<genesis_backend_api::Capability>>,
    ) -> Result<CapabilitySet> {
        let mut cache = self.capabilities.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(set) = cache.get(&index) {
            return Ok(set.clone());
        }
        let set: CapabilitySet = Arc::new(fetch()?.into_iter().map(|c| (c.op.0, c.dtype)).collect());
        cache.insert(index, set.clone());
        Ok(set)
    }

    pub(crate) fn module(&self) -> PluginModuleRef {
        self.module
    }

    /// Turn a wire result into a `Result` whose error names this backend and the call.
    pub(crate) fn check<T>(&self, result: RawResult<T>, call: impl fmt::Display) -> Result<T> {
        result.into_result().map_err(|e| {
            Error::from(genesis_backend_api::BackendError::from(e)).context(format_args!("{} {call}", self.name))
        })
    }
}
