//! What [`crate::export_backend!`] expands to: trampolines from the wire functions of
//! [`PluginModule`] to the safe traits, each behind `catch_unwind`.
//!
//! abi_stable's own wrappers exit the process when a panic reaches them, so no panic may get
//! that far: every trampoline runs the plugin's code inside [`guard`], which turns a panic
//! into an `Internal` error naming the call.

use crate::abi::{PluginModule, PluginModuleRef, RawResult};
use crate::error::{BackendError, ErrorKind, RawError, Result};
use crate::info::{MemoryStats, RawBackendInfo, RawDeviceProperties, RawProbe};
use crate::op::{Capability, CollectiveOp, Op, RawOp};
use crate::tensor::{BufferId, TensorDesc};
use crate::traits::{Backend, CollectiveArg, CommId, Device, DeviceActivity, EventId, GraphId, Rank};
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{RErr, ROk, RSlice, RSliceMut, RVec};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock};

/// The exported symbol abi_stable 0.11 looks up (checked by a test against abi_stable's
/// constant, since an attribute needs a literal).
pub const ROOT_MODULE_SYMBOL: &str = "_1as_0lib_1header_0root_bmodule_bloader";

/// A backend plus its lazily opened devices.
pub struct Instance<B: Backend> {
    backend: B,
    devices: OnceLock<Vec<OnceLock<B::Device>>>,
    opening: Mutex<()>,
}

impl<B: Backend> Instance<B> {
    /// Wrap a freshly constructed backend.
    pub fn new(backend: B) -> Self {
        Instance { backend, devices: OnceLock::new(), opening: Mutex::new(()) }
    }

    fn slots(&self) -> &[OnceLock<B::Device>] {
        self.devices.get_or_init(|| (0..self.backend.probe().device_count).map(|_| OnceLock::new()).collect())
    }

    fn index(&self, index: u32) -> Result<usize> {
        let count = self.slots().len();
        let i = index as usize;
        if i >= count {
            let name = self.backend.info().name;
            return Err(BackendError::invalid(format!(
                "device index {index} is out of range: backend '{name}' has {count} device(s)"
            )));
        }
        Ok(i)
    }

    /// The opened device `index`, opening it on first use.
    pub fn device(&self, index: u32) -> Result<&B::Device> {
        let i = self.index(index)?;
        let slot = &self.slots()[i];
        if let Some(device) = slot.get() {
            return Ok(device);
        }
        // Open under a lock so a device is opened once even when threads race; a failed open
        // is not cached, so a later call can try again.
        let _guard = self.opening.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if slot.get().is_none() {
            let device = self.backend.open_device(i)?;
            let _ = slot.set(device);
        }
        slot.get().ok_or_else(|| BackendError::internal("device slot empty after open"))
    }
}

/// Implemented by the type [`crate::export_backend!`] generates.
pub trait Exported: 'static {
    /// The plugin's backend type.
    type B: Backend;
    /// The process-wide instance.
    fn instance() -> &'static Instance<Self::B>;
}

/// Run `f`, turning errors and panics into the wire result.
pub fn guard<T>(call: &str, f: impl FnOnce() -> Result<T>) -> RawResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => ROk(value),
        Ok(Err(error)) => RErr(error.into()),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".into());
            RErr(RawError {
                kind: ErrorKind::Internal as u32,
                message: format!("panic in backend call `{call}`: {what}").into(),
            })
        }
    }
}

extern "C" fn info<E: Exported>() -> RawResult<RawBackendInfo> {
    guard("info", || Ok(E::instance().backend.info().into()))
}

extern "C" fn probe<E: Exported>() -> RawResult<RawProbe> {
    guard("probe", || {
        let mut probe = E::instance().backend.probe();
        probe.device_count = E::instance().slots().len().min(probe.device_count);
        Ok(probe.into())
    })
}

extern "C" fn device_properties<E: Exported>(index: u32) -> RawResult<RawDeviceProperties> {
    guard("device_properties", || {
        let i = E::instance().index(index)?;
        Ok(E::instance().backend.device_properties(i)?.into())
    })
}

extern "C" fn open_device<E: Exported>(index: u32) -> RawResult<()> {
    guard("open_device", || E::instance().device(index).map(|_| ()))
}

extern "C" fn allocate<E: Exported>(index: u32, bytes: u64) -> RawResult<BufferId> {
    guard("allocate", || {
        let bytes =
            usize::try_from(bytes).map_err(|_| BackendError::invalid(format!("allocation of {bytes} bytes")))?;
        E::instance().device(index)?.allocate(bytes)
    })
}

extern "C" fn free<E: Exported>(index: u32, buffer: BufferId) -> RawResult<()> {
    guard("free", || E::instance().device(index)?.free(buffer))
}

extern "C" fn write<E: Exported>(index: u32, dst: BufferId, offset: u64, src: RSlice<'_, u8>) -> RawResult<()> {
    guard("write", || E::instance().device(index)?.write(dst, offset as usize, src.as_slice()))
}

extern "C" fn read<E: Exported>(index: u32, src: BufferId, offset: u64, mut dst: RSliceMut<'_, u8>) -> RawResult<()> {
    guard("read", || E::instance().device(index)?.read(src, offset as usize, dst.as_mut_slice()))
}

extern "C" fn synchronize<E: Exported>(index: u32) -> RawResult<()> {
    guard("synchronize", || E::instance().device(index)?.synchronize())
}

extern "C" fn memory_stats<E: Exported>(index: u32) -> RawResult<MemoryStats> {
    guard("memory_stats", || E::instance().device(index)?.memory_stats())
}

extern "C" fn reset_peak_memory<E: Exported>(index: u32) -> RawResult<()> {
    guard("reset_peak_memory", || E::instance().device(index)?.reset_peak_memory())
}

extern "C" fn empty_cache<E: Exported>(index: u32) -> RawResult<()> {
    guard("empty_cache", || E::instance().device(index)?.empty_cache())
}

extern "C" fn capabilities<E: Exported>(index: u32) -> RawResult<RVec<Capability>> {
    guard("capabilities", || Ok(E::instance().device(index)?.capabilities().into()))
}

extern "C" fn execute<E: Exported>(
    index: u32,
    op: &RawOp,
    inputs: RSlice<'_, TensorDesc>,
    outputs: RSlice<'_, TensorDesc>,
) -> RawResult<()> {
    guard("execute", || {
        let op = Op::decode(op)?;
        E::instance().device(index)?.execute(&op, inputs.as_slice(), outputs.as_slice())
    })
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn collective<E: Exported>(op: u32, args: RSlice<'_, CollectiveArg>) -> RawResult<()> {
    guard("collective", || {
        let op =
            CollectiveOp::from_code(op).ok_or_else(|| BackendError::unsupported(format!("unknown collective {op}")))?;
        let args = args.as_slice();
        crate::sdk::collective::check(op, args)?;
        let instance = E::instance();
        let ranks = args
            .iter()
            .map(|arg| {
                Ok(Rank {
                    index: instance.index(arg.device)?,
                    device: instance.device(arg.device)?,
                    input: arg.input,
                    output: arg.output,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        instance.backend.collective(op, &ranks)
    })
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn record_event<E: Exported>(index: u32) -> RawResult<EventId> {
    guard("record_event", || E::instance().device(index)?.record_event())
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn event_elapsed_us<E: Exported>(index: u32, start: EventId, end: EventId) -> RawResult<f64> {
    guard("event_elapsed_us", || E::instance().device(index)?.event_elapsed_us(start, end))
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn release_events<E: Exported>(index: u32, events: RSlice<'_, EventId>) -> RawResult<()> {
    guard("release_events", || E::instance().device(index)?.release_events(events.as_slice()))
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn capture_begin<E: Exported>(index: u32) -> RawResult<()> {
    guard("capture_begin", || E::instance().device(index)?.capture_begin())
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn capture_end<E: Exported>(index: u32) -> RawResult<GraphId> {
    guard("capture_end", || E::instance().device(index)?.capture_end())
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn graph_replay<E: Exported>(index: u32, graph: GraphId) -> RawResult<()> {
    guard("graph_replay", || E::instance().device(index)?.graph_replay(graph))
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn graph_release<E: Exported>(index: u32, graph: GraphId) -> RawResult<()> {
    guard("graph_release", || E::instance().device(index)?.graph_release(graph))
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn comm_unique_id<E: Exported>() -> RawResult<RVec<u8>> {
    guard("comm_unique_id", || E::instance().backend.comm_unique_id().map(RVec::from))
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn comm_init_rank<E: Exported>(
    index: u32,
    id: RSlice<'_, u8>,
    rank: u32,
    world_size: u32,
    timeout_ms: u64,
) -> RawResult<CommId> {
    guard("comm_init_rank", || {
        if world_size == 0 || rank >= world_size {
            return Err(BackendError::invalid(format!(
                "comm_init_rank: rank {rank} is not within a group of {world_size}"
            )));
        }
        let instance = E::instance();
        let device = instance.device(index)?;
        instance.backend.comm_init_rank(
            device,
            index as usize,
            id.as_slice(),
            rank as usize,
            world_size as usize,
            timeout_ms,
        )
    })
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn comm_collective<E: Exported>(
    index: u32,
    comm: CommId,
    op: u32,
    root: u32,
    world_size: u32,
    arg: &CollectiveArg,
) -> RawResult<()> {
    guard("comm_collective", || {
        let op =
            CollectiveOp::from_code(op).ok_or_else(|| BackendError::unsupported(format!("unknown collective {op}")))?;
        crate::sdk::collective::check_member(op, world_size as usize, arg)?;
        if arg.device != index {
            return Err(BackendError::invalid(format!(
                "{}: the operands name device {} but the call is for device {index}",
                op.name(),
                arg.device
            )));
        }
        if root >= world_size {
            return Err(BackendError::invalid(format!(
                "{}: root {root} is not within a group of {world_size}",
                op.name()
            )));
        }
        let instance = E::instance();
        let device = instance.device(index)?;
        instance.backend.comm_collective(comm, op, root as usize, world_size as usize, device, arg)
    })
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn comm_abort<E: Exported>(comm: CommId) -> RawResult<()> {
    guard("comm_abort", || E::instance().backend.comm_abort(comm))
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn comm_wait<E: Exported>(index: u32, comm: CommId) -> RawResult<()> {
    guard("comm_wait", || {
        let instance = E::instance();
        instance.backend.comm_wait(comm, instance.device(index)?)
    })
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn activity_start<E: Exported>() -> RawResult<u64> {
    guard("activity_start", || E::instance().backend.activity_start())
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn activity_tag<E: Exported>(tag: u64) -> RawResult<()> {
    guard("activity_tag", || E::instance().backend.activity_tag(tag))
}

#[cfg(not(feature = "fixture-api-1-0"))]
extern "C" fn activity_stop<E: Exported>() -> RawResult<RVec<DeviceActivity>> {
    guard("activity_stop", || E::instance().backend.activity_stop().map(RVec::from))
}

/// The root module for backend `E`. Leaks one small table per call; hosts call it once.
pub fn module<E: Exported>() -> PluginModuleRef {
    PluginModule {
        info: info::<E>,
        probe: probe::<E>,
        device_properties: device_properties::<E>,
        open_device: open_device::<E>,
        allocate: allocate::<E>,
        free: free::<E>,
        write: write::<E>,
        read: read::<E>,
        synchronize: synchronize::<E>,
        memory_stats: memory_stats::<E>,
        reset_peak_memory: reset_peak_memory::<E>,
        empty_cache: empty_cache::<E>,
        capabilities: capabilities::<E>,
        execute: execute::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        collective: collective::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        record_event: record_event::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        event_elapsed_us: event_elapsed_us::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        release_events: release_events::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        comm_unique_id: comm_unique_id::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        comm_init_rank: comm_init_rank::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        comm_collective: comm_collective::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        comm_abort: comm_abort::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        comm_wait: comm_wait::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        activity_start: activity_start::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        activity_tag: activity_tag::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        activity_stop: activity_stop::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        capture_begin: capture_begin::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        capture_end: capture_end::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        graph_replay: graph_replay::<E>,
        #[cfg(not(feature = "fixture-api-1-0"))]
        graph_release: graph_release::<E>,
    }
    .leak_into_prefix()
}

// Keep the unused-import lint quiet when the optional tail is compiled out.
#[cfg(feature = "fixture-api-1-0")]
const _: Option<(CollectiveOp, CollectiveArg, Rank<()>, EventId, CommId, DeviceActivity, GraphId)> = None;

/// Export a backend from a plugin crate.
///
/// `export_backend!("name", BackendType, constructor)` where `constructor` is a function or
/// closure returning `BackendType`. It defines:
/// - the `genesis_plugin_declaration` static (name, plugin version, interface version);
/// - the abi_stable root module every host loads;
/// - `pub fn genesis_plugin_module()`, so a host can also link the backend statically.
///
/// The name must match `BackendInfo::name`, be 1 to 31 characters of `[a-z0-9_]`.
#[macro_export]
macro_rules! export_backend {
    ($name:literal, $ty:ty, $ctor:expr) => {
        $crate::export_backend!(@versioned $name, $ty, $ctor, $crate::API_VERSION.major, $crate::API_VERSION.minor);
    };
    (@versioned $name:literal, $ty:ty, $ctor:expr, $major:expr, $minor:expr) => {
        /// The plugin declaration the Genesis loader reads first.
        #[no_mangle]
        #[allow(non_upper_case_globals)]
        pub static genesis_plugin_declaration: $crate::abi::PluginDeclaration =
            $crate::abi::PluginDeclaration::new($name, env!("CARGO_PKG_VERSION"), $major, $minor);

        #[doc(hidden)]
        pub struct GenesisExport;

        impl $crate::export::Exported for GenesisExport {
            type B = $ty;
            fn instance() -> &'static $crate::export::Instance<$ty> {
                static INSTANCE: ::std::sync::OnceLock<$crate::export::Instance<$ty>> = ::std::sync::OnceLock::new();
                INSTANCE.get_or_init(|| $crate::export::Instance::new(($ctor)()))
            }
        }

        /// This plugin's root module, for hosts that link the backend statically.
        pub fn genesis_plugin_module() -> $crate::abi::PluginModuleRef {
            $crate::export::module::<GenesisExport>()
        }

        #[doc(hidden)]
        #[export_name = "_1as_0lib_1header_0root_bmodule_bloader"]
        pub static GENESIS_ROOT_MODULE_HEADER: $crate::abi_stable::library::LibHeader = {
            extern "C" fn erased_root_module() -> $crate::abi_stable::library::RootModuleResult {
                $crate::abi_stable::library::__call_root_module_loader(genesis_plugin_module)
            }
            // SAFETY: the constructor returns the module type named here, as abi_stable's own
            // `#[export_root_module]` expansion guarantees for its functions.
            unsafe {
                $crate::abi_stable::library::LibHeader::from_constructor::<$crate::abi::PluginModuleRef>(
                    erased_root_module,
                    $crate::abi_stable::library::CheckTypeLayout::Yes,
                )
            }
        };
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn root_module_symbol_matches_abi_stable() {
        assert_eq!(super::ROOT_MODULE_SYMBOL, abi_stable::library::ROOT_MODULE_LOADER_NAME);
    }
}
