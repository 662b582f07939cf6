//! Kernel modules on a device: compiled by NVRTC (or read from its disk cache) and loaded on
//! first use per element type, their functions and globals looked up once; and the launches.

use super::{driver_error, CudaDevice};
use crate::kernels::{self, Args, Module};
use crate::nvrtc::Compiler;
use cudarc::driver::{result, sys};
use genesis_backend_api::{BackendError, DType, Result};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::OnceLock;

/// A kernel module and the functions looked up in it so far. Keyed by name so that a
/// lookup with a borrowed `&str` allocates nothing.
pub(super) struct LoadedModule {
    handle: sys::CUmodule,
    functions: HashMap<String, sys::CUfunction>,
    globals: HashMap<&'static str, u64>,
}

/// The process-wide NVRTC, opened on the first kernel launch.
fn compiler() -> Result<&'static Compiler> {
    static COMPILER: OnceLock<Result<Compiler>> = OnceLock::new();
    COMPILER.get_or_init(Compiler::open).as_ref().map_err(Clone::clone)
}

impl CudaDevice {
    /// Whether this device's modules are compiled for its arch-specific target (sm_90a), where
    /// the kernels that use Hopper's warpgroup products are built (see `nvrtc::target`).
    pub(crate) fn arch_specific(&self) -> bool {
        compiler().is_ok_and(|c| c.arch_specific(self.facts.arch))
    }

    /// The loaded module `module` for `dtype`, loading it on first use (the caller holds the
    /// module lock).
    fn loaded<'m>(
        &self,
        modules: &'m mut HashMap<(&'static str, DType), LoadedModule>,
        module: &'static Module,
        dtype: DType,
    ) -> Result<&'m mut LoadedModule> {
        Ok(match modules.entry((module.name, dtype)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let handle = self.load_module(module, dtype)?;
                e.insert(LoadedModule { handle, functions: HashMap::new(), globals: HashMap::new() })
            }
        })
    }

    fn function(&self, module: &'static Module, dtype: DType, name: &str) -> Result<sys::CUfunction> {
        let mut modules = Self::lock(&self.modules);
        let loaded = self.loaded(&mut modules, module, dtype)?;
        if let Some(&f) = loaded.functions.get(name) {
            return Ok(f);
        }
        let cname = CString::new(name).map_err(|_| BackendError::internal("kernel name with NUL"))?;
        // SAFETY: the module is loaded and never unloaded while the device lives.
        let f = unsafe { result::module::get_function(loaded.handle, cname) }
            .map_err(|e| driver_error(&format!("kernel {name} of module {} for {dtype}", module.name), e))?;
        loaded.functions.insert(name.to_string(), f);
        Ok(f)
    }

    /// Device address of the `__device__` variable `name` of kernel module `module` built for
    /// `dtype` (loading the module if needed).
    pub fn module_global(&self, module: &'static Module, dtype: DType, name: &'static str) -> Result<u64> {
        let mut modules = Self::lock(&self.modules);
        let loaded = self.loaded(&mut modules, module, dtype)?;
        if let Some(&ptr) = loaded.globals.get(name) {
            return Ok(ptr);
        }
        let cname = CString::new(name).map_err(|_| BackendError::internal("global name with NUL"))?;
        // SAFETY: a loaded module; the driver writes the address and size.
        let (ptr, _) = unsafe { result::module::get_global(loaded.handle, cname) }
            .map_err(|e| driver_error(&format!("variable {name} of module {} for {dtype}", module.name), e))?;
        loaded.globals.insert(name, ptr);
        Ok(ptr)
    }

    /// Compile (or fetch from the disk cache) and load kernel module `module` for `dtype`.
    fn load_module(&self, module: &'static Module, dtype: DType) -> Result<sys::CUmodule> {
        if !module.serves(dtype) {
            return Err(BackendError::internal(format!("cuda: kernel module {} has no {dtype} build", module.name)));
        }
        let name = format!("{}_{}", module.name, dtype.name());
        let cubin =
            compiler()?.cubin(&name, &module.source(), &kernels::defines(dtype), self.facts.arch, self.facts.driver)?;
        // SAFETY: a CUBIN NVRTC produced for this device's architecture.
        unsafe { result::module::load_data(cubin.as_ptr() as *const c_void) }
            .map_err(|e| driver_error(&format!("loading kernel module {name}"), e))
    }

    /// Launch `name` of the elementwise module of `dtype` over `args.n` elements, `per_thread`
    /// elements per thread per step; `op` names the op in errors.
    pub fn launch(&self, op: &str, dtype: DType, name: &str, args: &mut Args, per_thread: u64) -> Result<()> {
        if args.n == 0 {
            return Ok(());
        }
        let f = self.function(&crate::ops::ELEMENTWISE, dtype, name)?;
        const THREADS: u64 = 256;
        let wanted = args.n.div_ceil(THREADS * per_thread.max(1));
        // Enough blocks to fill every SM several times over; grid-stride loops do the rest.
        let blocks = wanted.min(self.facts.sm_count as u64 * 32).max(1) as u32;
        let mut params = [args as *mut Args as *mut c_void];
        // SAFETY: every kernel of the module takes one `Args` by value, which is what
        // `params` points at; the addresses inside were validated against their buffers.
        unsafe {
            result::launch_kernel(f, (blocks, 1, 1), (THREADS as u32, 1, 1), 0, self.stream, &mut params)
                .map_err(|e| driver_error(&format!("{op}: launching {name}"), e))?;
        }
        Ok(())
    }

    /// Launch `name` with one block of `threads` per output element (`args.n` outputs; the
    /// kernel loops when there are more outputs than blocks).
    pub fn launch_blocks(&self, op: &str, dtype: DType, name: &str, args: &mut Args, threads: u32) -> Result<()> {
        if args.n == 0 {
            return Ok(());
        }
        let f = self.function(&crate::ops::ELEMENTWISE, dtype, name)?;
        let blocks = args.n.min(self.facts.sm_count as u64 * 64).max(1) as u32;
        let mut params = [args as *mut Args as *mut c_void];
        // SAFETY: as in `launch`.
        unsafe {
            // 16 bytes of shared memory per thread: the widest (value, index) state.
            result::launch_kernel(f, (blocks, 1, 1), (threads, 1, 1), 256 * 16, self.stream, &mut params)
                .map_err(|e| driver_error(&format!("{op}: launching {name}"), e))?;
        }
        Ok(())
    }

    /// Blocks of `threads` threads and `smem` bytes of dynamic shared memory that one SM holds
    /// at once for kernel `name` of `module` (compiled for `dtype` on first use): what its
    /// registers and shared memory allow.
    pub fn resident_blocks(
        &self,
        module: &'static Module,
        dtype: DType,
        name: &str,
        threads: u32,
        smem: u32,
    ) -> Result<u32> {
        let f = self.function(module, dtype, name)?;
        // SAFETY: `f` is a loaded function.
        let blocks =
            unsafe { result::occupancy::max_active_block_per_multiprocessor(f, threads as i32, smem as usize) }
                .map_err(|e| driver_error(&format!("cuOccupancyMaxActiveBlocksPerMultiprocessor for {name}"), e))?;
        Ok(blocks.max(1) as u32)
    }

    /// Launch `name` of kernel module `module` (compiled for `dtype` on first use) on a
    /// `grid` of `block`-shaped blocks with `smem` bytes of dynamic shared memory, passing
    /// `params` (`Args`, or a `#[repr(C)]` mirror of the kernel's own argument struct) by
    /// value. For kernels that pick their own geometry (row kernels, attention tiles, conv);
    /// `op` names the op in errors. An empty grid launches nothing. `early` is for a kernel
    /// that calls `wait_previous` (common.cuh) before it reads or writes device memory: where
    /// the device allows it ([`Switches::early_launch`](super::Switches::early_launch)), its
    /// blocks may then start while the kernel ahead of it finishes, so that its launch
    /// overlaps that kernel's tail.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_with<P: Copy>(
        &self,
        op: &str,
        module: &'static Module,
        dtype: DType,
        name: &str,
        params: &mut P,
        (grid, block, smem): ((u32, u32), (u32, u32), u32),
        early: bool,
    ) -> Result<()> {
        let early = early && self.switches.early_launch;
        if grid.0 == 0 || grid.1 == 0 {
            return Ok(());
        }
        // `function` refuses a module built for other dtypes when it first loads it.
        let f = self.function(module, dtype, name)?;
        // Above 48 KiB a kernel must opt in to dynamic shared memory, up to the device limit.
        const DEFAULT_SMEM: u32 = 48 * 1024;
        if smem > DEFAULT_SMEM {
            let limit = self.facts.max_smem_optin;
            if smem > limit {
                return Err(BackendError::unsupported(format!(
                    "{op}: {name} needs {smem} bytes of shared memory per block, the device allows {limit}"
                )));
            }
            // SAFETY: `f` is a loaded function; the value is within the device limit.
            unsafe {
                result::function::set_function_attribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
            }
            .map_err(|e| driver_error(&format!("{op}: cuFuncSetAttribute for {name}"), e))?;
        }
        let mut args = [params as *mut P as *mut c_void];
        // SAFETY: a zeroed attribute is a valid (empty) value; the two fields set are the
        // attribute's id and its value. It is passed only when `early`.
        let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attribute.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: 1,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream,
            attrs: &mut attribute,
            numAttrs: early as u32,
        };
        // SAFETY: the kernel takes one argument of the struct `P` mirrors; the addresses inside
        // were validated against their buffers by the caller. `config` and `attribute` outlive
        // the call.
        unsafe { sys::cuLaunchKernelEx(&config, f, args.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(|e| driver_error(&format!("{op}: launching {name}"), e))?;
        Ok(())
    }
}
