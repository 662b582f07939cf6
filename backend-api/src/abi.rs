//! The wire format: the declaration every plugin exports and the abi_stable root module.
//!
//! Plugin authors never use this module directly; [`crate::export_backend!`] fills it in.
//! Loading is two steps: the host reads [`PluginDeclaration`] (a plain C static, readable
//! without running plugin code) to learn the name and interface version, and only for a
//! compatible major version asks abi_stable for [`PluginModuleRef`], which checks the layout
//! of every type reachable from it.

use crate::error::RawError;
use crate::info::{MemoryStats, RawBackendInfo, RawDeviceProperties, RawProbe};
use crate::op::{Capability, RawOp};
use crate::tensor::{BufferId, TensorDesc};
#[cfg(not(feature = "fixture-api-1-0"))]
use crate::traits::{CollectiveArg, CommId, DeviceActivity, EventId, GraphId};
use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RResult, RSlice, RSliceMut, RVec};
use abi_stable::StableAbi;

/// The symbol name of the [`PluginDeclaration`] static.
pub const DECLARATION_SYMBOL: &str = "genesis_plugin_declaration";

/// The first bytes of every [`PluginDeclaration`].
pub const DECLARATION_MAGIC: [u8; 8] = *b"GENESIS\0";

/// Length of the fixed, NUL-padded text fields of [`PluginDeclaration`].
pub const DECLARATION_TEXT_LEN: usize = 32;

/// Plain data every plugin exports as `genesis_plugin_declaration`.
///
/// Its layout is frozen for all versions: it is how a host learns, before trusting anything
/// else, whether a file is a plugin and which interface it speaks.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PluginDeclaration {
    /// [`DECLARATION_MAGIC`].
    pub magic: [u8; 8],
    /// Interface major version the plugin was built against.
    pub api_major: u32,
    /// Interface minor version the plugin was built against.
    pub api_minor: u32,
    /// Backend name, NUL-padded.
    pub name: [u8; DECLARATION_TEXT_LEN],
    /// Plugin version, NUL-padded.
    pub plugin_version: [u8; DECLARATION_TEXT_LEN],
}

impl PluginDeclaration {
    /// A declaration; text longer than the field is cut (names are checked to be short).
    pub const fn new(name: &str, plugin_version: &str, api_major: u32, api_minor: u32) -> Self {
        PluginDeclaration {
            magic: DECLARATION_MAGIC,
            api_major,
            api_minor,
            name: fixed_text(name),
            plugin_version: fixed_text(plugin_version),
        }
    }

    /// The backend name, if it is valid UTF-8.
    pub fn name(&self) -> Option<&str> {
        read_text(&self.name)
    }

    /// The plugin version, if it is valid UTF-8.
    pub fn plugin_version(&self) -> Option<&str> {
        read_text(&self.plugin_version)
    }
}

const fn fixed_text(s: &str) -> [u8; DECLARATION_TEXT_LEN] {
    let bytes = s.as_bytes();
    let mut out = [0u8; DECLARATION_TEXT_LEN];
    let mut i = 0;
    while i < bytes.len() && i < DECLARATION_TEXT_LEN - 1 {
        out[i] = bytes[i];
        i += 1;
    }
    out
}

fn read_text(field: &[u8]) -> Option<&str> {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    std::str::from_utf8(&field[..end]).ok()
}

/// Every call returns this: a value or an error, never an unwinding panic.
pub type RawResult<T> = RResult<T, RawError>;

/// The root module of a plugin: one function pointer per interface function.
///
/// Device-level functions take the device index first; the plugin opens devices lazily.
/// Fields up to `execute` exist since 1.0; each later minor version appends fields at the
/// end, and those read as `Option` (a plugin built against an older minor lacks them, which
/// the host reports as `Unsupported`). Never reorder, remove or retype a field.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
#[sabi(missing_field(option))]
pub struct PluginModule {
    /// Name, vendor, version.
    pub info: extern "C" fn() -> RawResult<RawBackendInfo>,
    /// Device count or the reason there are none.
    pub probe: extern "C" fn() -> RawResult<RawProbe>,
    /// Properties of one device.
    pub device_properties: extern "C" fn(u32) -> RawResult<RawDeviceProperties>,
    /// Open a device (idempotent).
    pub open_device: extern "C" fn(u32) -> RawResult<()>,
    /// Allocate bytes.
    pub allocate: extern "C" fn(u32, u64) -> RawResult<BufferId>,
    /// Free a buffer.
    pub free: extern "C" fn(u32, BufferId) -> RawResult<()>,
    /// Host to device copy at a byte offset.
    pub write: extern "C" fn(u32, BufferId, u64, RSlice<'_, u8>) -> RawResult<()>,
    /// Device to host copy from a byte offset.
    pub read: extern "C" fn(u32, BufferId, u64, RSliceMut<'_, u8>) -> RawResult<()>,
    /// Wait for issued work.
    pub synchronize: extern "C" fn(u32) -> RawResult<()>,
    /// Memory statistics.
    pub memory_stats: extern "C" fn(u32) -> RawResult<MemoryStats>,
    /// Reset the peaks.
    pub reset_peak_memory: extern "C" fn(u32) -> RawResult<()>,
    /// Release cached memory.
    pub empty_cache: extern "C" fn(u32) -> RawResult<()>,
    /// The (op, dtype) claims of a device.
    pub capabilities: extern "C" fn(u32) -> RawResult<RVec<Capability>>,
    /// Run one op.
    #[sabi(last_prefix_field)]
    pub execute: extern "C" fn(u32, &RawOp, RSlice<'_, TensorDesc>, RSlice<'_, TensorDesc>) -> RawResult<()>,
    /// Run a collective over several devices. Since 1.1.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub collective: extern "C" fn(u32, RSlice<'_, CollectiveArg>) -> RawResult<()>,
    /// Record a timing event on a device, after the work issued so far. Since 1.2.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub record_event: extern "C" fn(u32) -> RawResult<EventId>,
    /// Microseconds of device time between two recorded events, after both completed.
    /// Since 1.2.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub event_elapsed_us: extern "C" fn(u32, EventId, EventId) -> RawResult<f64>,
    /// Release recorded events. Since 1.2.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub release_events: extern "C" fn(u32, RSlice<'_, EventId>) -> RawResult<()>,
    /// A new id for a group of processes. Since 1.3.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub comm_unique_id: extern "C" fn() -> RawResult<RVec<u8>>,
    /// Join a group of processes on a device: (device, id, rank, world size, timeout in
    /// milliseconds). Since 1.3.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub comm_init_rank: extern "C" fn(u32, RSlice<'_, u8>, u32, u32, u64) -> RawResult<CommId>,
    /// This member's part of a collective: (device, communicator, op code, root, world size,
    /// operands). Since 1.3.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub comm_collective: extern "C" fn(u32, CommId, u32, u32, u32, &CollectiveArg) -> RawResult<()>,
    /// Leave and free a communicator. Since 1.3.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub comm_abort: extern "C" fn(CommId) -> RawResult<()>,
    /// Order a device's later work after a communicator's queued collectives. Since 1.3.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub comm_wait: extern "C" fn(u32, CommId) -> RawResult<()>,
    /// Start recording device activity; returns the activity clock in nanoseconds. Since 1.4.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub activity_start: extern "C" fn() -> RawResult<u64>,
    /// Tag the calling thread's work from now on (0: none). Since 1.4.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub activity_tag: extern "C" fn(u64) -> RawResult<()>,
    /// Stop recording and return the activity. Since 1.4.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub activity_stop: extern "C" fn() -> RawResult<RVec<DeviceActivity>>,
    /// Start capturing a device's work into a graph. Since 1.5.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub capture_begin: extern "C" fn(u32) -> RawResult<()>,
    /// Stop capturing and return the graph. Since 1.5.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub capture_end: extern "C" fn(u32) -> RawResult<GraphId>,
    /// Run a captured graph again. Since 1.5.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub graph_replay: extern "C" fn(u32, GraphId) -> RawResult<()>,
    /// Release a captured graph. Since 1.5.
    #[cfg(not(feature = "fixture-api-1-0"))]
    pub graph_release: extern "C" fn(u32, GraphId) -> RawResult<()>,
}

impl RootModule for PluginModuleRef {
    abi_stable::declare_root_module_statics! {PluginModuleRef}
    const BASE_NAME: &'static str = "genesis_backend";
    const NAME: &'static str = "genesis backend plugin";
    // abi_stable compares this string between host and plugin. It tracks the interface
    // major only: minor compatibility is ours to decide (from the declaration), and the
    // prefix-type layout check already accepts a plugin with fewer or more trailing fields.
    const VERSION_STRINGS: VersionStrings = VersionStrings::new("1.0.0");
}
