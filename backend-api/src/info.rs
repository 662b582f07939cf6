//! What a backend says about itself and its devices.

use abi_stable::std_types::RString;
use abi_stable::StableAbi;

/// Identity of a backend plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendInfo {
    /// The device-type name users write (`"cpu"`, `"cuda"`); `[a-z0-9_]+`.
    pub name: String,
    /// Who wrote it.
    pub vendor: String,
    /// The plugin's own version (diagnostics only, never used for compatibility).
    pub version: String,
    /// One line about what it is.
    pub description: String,
}

/// The result of probing for devices; probing may touch drivers, loading may not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Number of usable devices.
    pub device_count: usize,
    /// Why there are none, when `device_count == 0` (`"libcuda.so.1 not found"`).
    pub unavailable_reason: Option<String>,
}

/// Static properties of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceProperties {
    /// Marketing name (`"NVIDIA H100 80GB HBM3"`).
    pub name: String,
    /// Total memory in bytes (0 when unknown).
    pub total_memory: u64,
    /// Compute capability or an equivalent architecture version, `(0, 0)` when meaningless.
    pub compute_capability: (u32, u32),
    /// Whether concurrent calls from several host threads are supported.
    pub thread_safe: bool,
}

/// Memory accounting of one device, in the terms PyTorch's `torch.cuda.memory_stats` uses.
/// A backend without a cache reports `reserved_bytes` equal to the bytes it holds for live
/// allocations (at least `allocated_bytes`), `cache_hits` 0 and every request as a miss.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Bytes in live allocations (as requested, before rounding).
    pub allocated_bytes: u64,
    /// Bytes held from the system or driver, live plus cached.
    pub reserved_bytes: u64,
    /// Peak of `allocated_bytes` since the last reset.
    pub peak_allocated_bytes: u64,
    /// Peak of `reserved_bytes` since the last reset.
    pub peak_reserved_bytes: u64,
    /// Number of live allocations.
    pub active_allocations: u64,
    /// Allocation requests served so far.
    pub allocation_requests: u64,
    /// Requests served from the cache.
    pub cache_hits: u64,
    /// Requests that needed new memory from the system or driver.
    pub cache_misses: u64,
    /// Allocations that failed for lack of memory.
    pub oom_count: u64,
}

/// The accounting every allocator does, so that each backend counts the same way.
impl MemoryStats {
    /// A new live allocation of `bytes` (as requested): allocated bytes, their peak and the
    /// live count grow.
    pub fn record_allocation(&mut self, bytes: u64) {
        self.allocated_bytes += bytes;
        self.peak_allocated_bytes = self.peak_allocated_bytes.max(self.allocated_bytes);
        self.active_allocations += 1;
    }

    /// The release of a live allocation of `bytes` (as requested when it was made).
    pub fn record_release(&mut self, bytes: u64) {
        self.allocated_bytes -= bytes;
        self.active_allocations -= 1;
    }

    /// `bytes` more held from the system or driver: reserved bytes and their peak grow.
    pub fn record_reservation(&mut self, bytes: u64) {
        self.reserved_bytes += bytes;
        self.peak_reserved_bytes = self.peak_reserved_bytes.max(self.reserved_bytes);
    }

    /// Both peaks back to the current values, as `Device::reset_peak_memory` asks.
    pub fn reset_peaks(&mut self) {
        self.peak_allocated_bytes = self.allocated_bytes;
        self.peak_reserved_bytes = self.reserved_bytes;
    }
}

/// Wire form of [`BackendInfo`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct RawBackendInfo {
    /// See [`BackendInfo::name`].
    pub name: RString,
    /// See [`BackendInfo::vendor`].
    pub vendor: RString,
    /// See [`BackendInfo::version`].
    pub version: RString,
    /// See [`BackendInfo::description`].
    pub description: RString,
}

/// Wire form of [`Probe`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct RawProbe {
    /// See [`Probe::device_count`].
    pub device_count: u32,
    /// Empty when available.
    pub unavailable_reason: RString,
}

/// Wire form of [`DeviceProperties`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct RawDeviceProperties {
    /// See [`DeviceProperties::name`].
    pub name: RString,
    /// See [`DeviceProperties::total_memory`].
    pub total_memory: u64,
    /// Major compute capability.
    pub capability_major: u32,
    /// Minor compute capability.
    pub capability_minor: u32,
    /// See [`DeviceProperties::thread_safe`].
    pub thread_safe: bool,
}

impl From<BackendInfo> for RawBackendInfo {
    fn from(i: BackendInfo) -> Self {
        RawBackendInfo {
            name: i.name.into(),
            vendor: i.vendor.into(),
            version: i.version.into(),
            description: i.description.into(),
        }
    }
}

impl From<RawBackendInfo> for BackendInfo {
    fn from(i: RawBackendInfo) -> Self {
        BackendInfo {
            name: i.name.into(),
            vendor: i.vendor.into(),
            version: i.version.into(),
            description: i.description.into(),
        }
    }
}

impl From<Probe> for RawProbe {
    fn from(p: Probe) -> Self {
        RawProbe {
            device_count: p.device_count as u32,
            unavailable_reason: p.unavailable_reason.unwrap_or_default().into(),
        }
    }
}

impl From<RawProbe> for Probe {
    fn from(p: RawProbe) -> Self {
        let reason = p.unavailable_reason.into_string();
        Probe { device_count: p.device_count as usize, unavailable_reason: (!reason.is_empty()).then_some(reason) }
    }
}

impl From<DeviceProperties> for RawDeviceProperties {
    fn from(d: DeviceProperties) -> Self {
        RawDeviceProperties {
            name: d.name.into(),
            total_memory: d.total_memory,
            capability_major: d.compute_capability.0,
            capability_minor: d.compute_capability.1,
            thread_safe: d.thread_safe,
        }
    }
}

impl From<RawDeviceProperties> for DeviceProperties {
    fn from(d: RawDeviceProperties) -> Self {
        DeviceProperties {
            name: d.name.into(),
            total_memory: d.total_memory,
            compute_capability: (d.capability_major, d.capability_minor),
            thread_safe: d.thread_safe,
        }
    }
}
