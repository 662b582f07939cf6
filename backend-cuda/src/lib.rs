//! # genesis-backend-cuda
//!
//! The CUDA backend of Genesis: NVIDIA GPUs through the CUDA driver API, kernels compiled by
//! NVRTC, matrix products through cuBLAS, convolutions through cuDNN when it is installed and
//! collectives through NCCL, all opened at run time.
//!
//! Layout: [`allocator`] (the stream-ordered caching allocator), `device` (one opened GPU:
//! stream, memory, modules, launches, error reporting), `nvrtc` (compilation and the disk
//! cache of kernels), `blas` (cuBLAS), `cudnn` (convolutions, optional), `nccl` (collectives), `libs` (finding the CUDA
//! libraries), `kernels` (the CUDA C sources and their argument block) and `ops` (operand
//! checks and dispatch per op family). [`Device::capabilities`] lists exactly the (op, dtype) pairs `ops` runs; the
//! rest of the interface is refused with `Unsupported`.
//!
//! The plugin builds without CUDA: cudarc opens the driver library at run time. cudarc panics
//! when that library is missing, so [`CudaBackend::probe`] first looks for it itself, under
//! the names cudarc would try, and reports "libcuda.so.1 not found" instead.

mod activity;
pub mod allocator;
mod blas;
mod cudnn;
mod device;
mod events;
mod groups;
mod kernels;
mod libs;
mod nccl;
mod nvrtc;
mod ops;

pub use device::CudaDevice;

use cudarc::driver::{result, sys, CudaContext, DriverError};
use genesis_backend_api::{
    export_backend, Backend, BackendError, BackendInfo, CollectiveArg, CollectiveOp, CommId, DeviceActivity,
    DeviceProperties, ErrorKind, Probe, Rank, Result,
};
use libloading::Library;
use std::any::Any;
use std::collections::HashSet;
use std::error::Error as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

export_backend!("cuda", CudaBackend, CudaBackend::new);

/// The file the NVIDIA driver installs, as messages name it.
const DRIVER_LIBRARY: &str = if cfg!(windows) { "nvcuda.dll" } else { "libcuda.so.1" };

/// The CUDA backend, the plugin's entry point.
pub struct CudaBackend {
    /// The probe, run on first use: the driver's answer does not change while the process lives.
    driver: OnceLock<Driver>,
    /// NCCL, opened on the first collective.
    nccl: OnceLock<Result<std::sync::Arc<nccl::Nccl>>>,
    /// Communicators across processes (NCCL, interface 1.3).
    groups: groups::Groups,
}

/// What probing found.
struct Driver {
    probe: Probe,
    /// Our own handle on the driver library, when found. Holding it keeps the library loaded
    /// between our check and cudarc's own `dlopen` of the same name, which then only takes
    /// another reference instead of loading the driver a second time.
    _library: Option<Library>,
}

impl CudaBackend {
    /// A backend that has not touched the driver yet; [`Backend::probe`] does that.
    pub fn new() -> Self {
        CudaBackend { driver: OnceLock::new(), nccl: OnceLock::new(), groups: groups::Groups::default() }
    }

    fn driver(&self) -> &Driver {
        self.driver.get_or_init(probe_driver)
    }

    /// The driver's ordinal for `index`, after checking that the probe found such a device.
    /// The SDK checks the range before calling us, but cudarc must never be reached when the
    /// library is missing (it would panic), so this does not rely on that.
    fn ordinal(&self, index: usize) -> Result<i32> {
        let probe = &self.driver().probe;
        if probe.device_count == 0 {
            let reason = probe.unavailable_reason.as_deref().unwrap_or("no devices");
            return Err(BackendError::new(ErrorKind::DeviceUnavailable, format!("cuda:{index}: {reason}")));
        }
        if index >= probe.device_count {
            let count = probe.device_count;
            return Err(BackendError::invalid(format!(
                "cuda:{index} is out of range: there are {count} CUDA device(s)"
            )));
        }
        // The driver counts devices in a C int, so every index below the count fits.
        Ok(index as i32)
    }
}

impl Default for CudaBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for CudaBackend {
    type Device = CudaDevice;

    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: "cuda".into(),
            vendor: "Genesis".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: format!(
                "NVIDIA GPUs through the CUDA driver API, NVRTC, cuBLAS and NCCL; {}",
                cudnn::describe()
            ),
        }
    }

    fn probe(&self) -> Probe {
        self.driver().probe.clone()
    }

    fn device_properties(&self, index: usize) -> Result<DeviceProperties> {
        let ordinal = self.ordinal(index)?;
        let query = || -> std::result::Result<DeviceProperties, String> {
            let device = driver_call("cuDeviceGet", || result::device::get(ordinal))?;
            // SAFETY (both calls): `device` was just returned by cuDeviceGet.
            let total_memory = driver_call("cuDeviceTotalMem", || unsafe { result::device::total_mem(device) })?;
            // Attributes rather than cuDeviceComputeCapability, which is deprecated and gone
            // from newer drivers.
            let attribute = |attribute| {
                driver_call("cuDeviceGetAttribute", || unsafe { result::device::get_attribute(device, attribute) })
            };
            use sys::CUdevice_attribute::{
                CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as MAJOR,
                CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as MINOR,
            };
            Ok(DeviceProperties {
                name: driver_call("cuDeviceGetName", || result::device::get_name(device))?,
                total_memory: total_memory as u64,
                compute_capability: (attribute(MAJOR)? as u32, attribute(MINOR)? as u32),
                // The driver API may be called from any thread.
                thread_safe: true,
            })
        };
        query().map_err(|e| BackendError::new(ErrorKind::DeviceUnavailable, format!("cuda:{index}: {e}")))
    }

    fn open_device(&self, index: usize) -> Result<CudaDevice> {
        self.ordinal(index)?;
        let context = driver_call("retaining the primary context", || CudaContext::new(index))
            .map_err(|e| BackendError::new(ErrorKind::DeviceUnavailable, format!("opening cuda:{index}: {e}")))?;
        CudaDevice::open(context)
    }

    /// Through NCCL: device to device over NVLink/PCIe, never through the host.
    fn collective(&self, op: CollectiveOp, ranks: &[Rank<'_, CudaDevice>]) -> Result<()> {
        self.nccl()?.run(op, ranks)
    }

    /// CUPTI's activity records (see `activity`).
    fn activity_start(&self) -> Result<u64> {
        activity::start()
    }

    fn activity_tag(&self, tag: u64) -> Result<()> {
        activity::tag(tag)
    }

    fn activity_stop(&self) -> Result<Vec<DeviceActivity>> {
        activity::stop()
    }

    /// NCCL's unique id.
    fn comm_unique_id(&self) -> Result<Vec<u8>> {
        groups::Groups::unique_id(&*self.nccl()?)
    }

    /// `ncclCommInitRank`, given up after the timeout (see `groups`).
    fn comm_init_rank(
        &self,
        device: &CudaDevice,
        index: usize,
        id: &[u8],
        rank: usize,
        world_size: usize,
        timeout_ms: u64,
    ) -> Result<CommId> {
        self.groups.join(self.nccl()?, device, index, id, groups::Seat { rank, world_size, timeout_ms })
    }

    /// Queued on the device's stream after its earlier work, watched until it completes.
    fn comm_collective(
        &self,
        comm: CommId,
        op: CollectiveOp,
        root: usize,
        world_size: usize,
        device: &CudaDevice,
        arg: &CollectiveArg,
    ) -> Result<()> {
        self.groups.run(comm, op, root, world_size, device, arg)
    }

    /// The device's stream waits for the communicator's (collectives run on a stream of
    /// their own).
    fn comm_wait(&self, comm: CommId, device: &CudaDevice) -> Result<()> {
        self.groups.wait(comm, device)
    }

    fn comm_abort(&self, comm: CommId) -> Result<()> {
        self.groups.abort(comm)
    }
}

impl CudaBackend {
    /// NCCL, opened on first use.
    fn nccl(&self) -> Result<std::sync::Arc<nccl::Nccl>> {
        self.nccl.get_or_init(|| nccl::Nccl::open().map(std::sync::Arc::new)).clone()
    }
}

/// Find the driver library, then ask it for devices.
fn probe_driver() -> Driver {
    let no_devices = |reason: String| Probe { device_count: 0, unavailable_reason: Some(reason) };
    let (library, file) = match open_driver_library() {
        Ok(found) => found,
        Err(reason) => return Driver { probe: no_devices(reason), _library: None },
    };
    // From here on cudarc finds the library too: it tries the same names in the same order.
    let count =
        driver_call("cuInit", result::init).and_then(|()| driver_call("cuDeviceGetCount", result::device::get_count));
    // Hiding every device is the usual reason for "no device" on a machine that has GPUs.
    let visible =
        std::env::var("CUDA_VISIBLE_DEVICES").map(|v| format!(" (CUDA_VISIBLE_DEVICES={v:?})")).unwrap_or_default();
    let probe = match count {
        Ok(n) if n > 0 => Probe { device_count: n as usize, unavailable_reason: None },
        Ok(_) => no_devices(format!("{} reports no devices{visible}", describe_driver(&file))),
        Err(e) => no_devices(format!("{} is loaded, but {e}{visible}", describe_driver(&file))),
    };
    Driver { probe, _library: Some(library) }
}

/// Open the CUDA driver library the way cudarc 0.19 will (`culib` in its `driver/sys`): the
/// candidates of `get_lib_name_candidates` for "cuda", then for "nvcuda", in that order, each
/// a bare name resolved by the system loader (`LD_LIBRARY_PATH`, the ld.so cache, the
/// default directories). Returns the library and the name that opened it.
///
/// This must come before any cudarc call: cudarc panics when no candidate opens. Its
/// non-panicking `is_culib_present` would do as a check, but cannot say why it failed.
fn open_driver_library() -> std::result::Result<(Library, String), String> {
    let mut names: Vec<String> = ["cuda", "nvcuda"].into_iter().flat_map(cudarc::get_lib_name_candidates).collect();
    let mut loader_error = String::new();
    for name in &names {
        // SAFETY: loading the driver library runs its initializers, which is what every CUDA
        // program does; it has no other preconditions.
        match unsafe { Library::new(name) } {
            Ok(library) => return Ok((library, name.clone())),
            // The loader's message for the usual name tells "absent" from "present but broken".
            // libloading's own text is just "dlopen failed"; the loader's is its source.
            Err(e) if name == DRIVER_LIBRARY => {
                loader_error = format!(": {}", e.source().map_or(e.to_string(), |source| source.to_string()))
            }
            Err(_) => {}
        }
    }
    let mut seen = HashSet::new();
    names.retain(|name| seen.insert(name.clone()));
    // The candidate list is long and mostly exotic spellings; name the usual ones only.
    let usual: Vec<&str> = names.iter().map(String::as_str).filter(|n| n.starts_with("libcuda.so")).collect();
    Err(format!(
        "{DRIVER_LIBRARY} not found (searched the system library path for {} and {} other names){loader_error}",
        usual.join(", "),
        names.len() - usual.len()
    ))
}

/// "libcuda.so (CUDA 12.4 driver)": which library answered, and the CUDA version it supports.
fn describe_driver(file: &str) -> String {
    let version = driver_call("cuDriverGetVersion", || {
        let mut version = 0;
        // SAFETY: writes one int to a valid pointer; callable before cuInit.
        unsafe { sys::cuDriverGetVersion(&mut version) }.result().map(|()| version)
    });
    match version {
        Ok(v) => format!("{file} (CUDA {}.{} driver)", v / 1000, v % 1000 / 10),
        Err(_) => file.to_string(),
    }
}

/// Run a driver call and describe its failure as "`call` failed: CUDA_ERROR_...: text".
///
/// Panics are caught as well: cudarc panics when the driver library lacks a symbol it looks
/// up (a driver older than the bindings), and a probe must answer rather than unwind.
fn driver_call<T>(
    call: &str,
    f: impl FnOnce() -> std::result::Result<T, DriverError>,
) -> std::result::Result<T, String> {
    match catch_unwind(AssertUnwindSafe(|| f().map_err(|e| describe_error(&e)))) {
        Ok(result) => result.map_err(|e| format!("{call} failed: {e}")),
        Err(payload) => Err(format!("{call} failed: {}", panic_text(payload.as_ref()))),
    }
}

fn describe_error(e: &DriverError) -> String {
    match e.error_string() {
        Ok(text) => format!("{:?}: {}", e.0, text.to_string_lossy()),
        Err(_) => format!("{:?}", e.0),
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "panic in cudarc".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where there is no driver (CI, build machines) the probe answers with a reason.
    #[test]
    fn without_a_driver_the_probe_says_why() {
        if open_driver_library().is_ok() {
            eprintln!("skipped: this machine has a CUDA driver library");
            return;
        }
        let backend = CudaBackend::new();
        let probe = backend.probe();
        eprintln!("{probe:?}");
        assert_eq!(probe.device_count, 0);
        let reason = probe.unavailable_reason.clone().expect("a reason");
        assert!(reason.starts_with(&format!("{DRIVER_LIBRARY} not found (searched ")), "{reason}");
        assert_eq!(backend.probe(), probe);
        // Device calls fail cleanly too, without reaching cudarc.
        assert_eq!(backend.device_properties(0).unwrap_err().kind, ErrorKind::DeviceUnavailable);
        assert_eq!(backend.open_device(0).err().map(|e| e.kind), Some(ErrorKind::DeviceUnavailable));
    }

    /// Where there are GPUs: properties come from the driver, and an opened device allocates.
    #[test]
    fn with_devices_they_open_and_allocate() {
        use genesis_backend_api::{BufferId, Device};
        let backend = CudaBackend::new();
        let probe = backend.probe();
        if probe.device_count == 0 {
            eprintln!("skipped: no CUDA device: {}", probe.unavailable_reason.unwrap_or_default());
            return;
        }
        assert_eq!(probe.unavailable_reason, None);
        for i in 0..probe.device_count {
            let properties = backend.device_properties(i).unwrap();
            assert!(!properties.name.is_empty() && properties.total_memory > 0);
        }
        let device = backend.open_device(0).unwrap_or_else(|e| panic!("{e}"));
        let buffer = device.allocate(16).unwrap();
        device.write(buffer, 0, &[7u8; 16]).unwrap();
        let mut back = [0u8; 16];
        device.read(buffer, 0, &mut back).unwrap();
        assert_eq!(back, [7u8; 16]);
        device.free(buffer).unwrap();
        assert_eq!(device.free(BufferId(999)).unwrap_err().kind, ErrorKind::InvalidArgument);
    }

    /// The exported function, behind the SDK's trampoline, gives the same answer.
    #[test]
    fn the_exported_probe_agrees() {
        let raw = (genesis_plugin_module().probe())().unwrap();
        assert_eq!(Probe::from(raw), CudaBackend::new().probe());
    }
}
