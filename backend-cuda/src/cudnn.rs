//! cuDNN, opened at run time like cuBLAS: convolutions and their two backward passes through
//! its convolution API, the field's standard kernels for them (Hopper tensor cores, implicit
//! GEMM, Winograd and FFT variants chosen per shape).
//!
//! Optional: when the library is missing, its version too old, `GENESIS_CUDA_CUDNN=0` is set
//! or cuDNN declines a shape, the convolution ops run on the plugin's own im2col kernels
//! (`ops/conv.rs`), and the backend's description says which is in use and why.
//!
//! The algorithm for each shape is chosen on first use and kept: by timing the candidates
//! (as PyTorch with `cudnn.benchmark = True`), or from cuDNN's heuristics while a graph is
//! being captured (timing would run work inside the capture). Dtype rules: f16 and bf16
//! accumulate in f32 on tensor cores; f32 stays IEEE (no TF32) unless
//! `GENESIS_CUDA_ALLOW_TF32=1`, as for matmul; only algorithms that compute plain dot
//! products are used (no FFT or Winograd, whose transforms round in T); an f32 or f64 bias
//! is added to the rounded result, as PyTorch's cuDNN path does, and an f16 or bf16 one is
//! left to the plugin's kernels, which round once.

use crate::device::CudaDevice;
use crate::kernels::Operand;
use crate::libs::{self, Found};
use genesis_backend_api::sdk::window::Conv2d as Geom;
use genesis_backend_api::{BackendError, DType, ErrorKind, Result};
use std::collections::hash_map::{Entry as Slot, HashMap};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Mutex, OnceLock};

type Handle = *mut c_void;
type Desc = *mut c_void;
type Status = c_int;

/// The `CUDNN_STATUS_BAD_PARAM*` and `CUDNN_STATUS_NOT_SUPPORTED*` families (2000-3999 in
/// cuDNN 9): cuDNN declines the problem, and the plugin's kernels take it.
fn declined(status: Status) -> bool {
    (2000..4000).contains(&status)
}

/// Oldest cuDNN used: the 9.x API (grouped convolutions, bf16, the `_v7` heuristics).
const MIN_VERSION: usize = 90000;
/// Largest workspace an algorithm may ask for.
const WORKSPACE_CAP: usize = 1 << 30;
/// Candidates asked of cuDNN per search (more than any direction has algorithms).
const CANDIDATES: usize = 16;

/// `cudnnConvolution*AlgoPerf_t` (the three directions share the layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AlgoPerf {
    algo: c_int,
    status: Status,
    time: f32,
    memory: usize,
    determinism: c_int,
    math_type: c_int,
    reserved: [c_int; 3],
}

type SetTensor = unsafe extern "C" fn(Desc, c_int, c_int, c_int, c_int, c_int, c_int, c_int, c_int, c_int) -> Status;
type SetFilter = unsafe extern "C" fn(Desc, c_int, c_int, c_int, c_int, c_int, c_int) -> Status;
type SetConv = unsafe extern "C" fn(Desc, c_int, c_int, c_int, c_int, c_int, c_int, c_int, c_int) -> Status;
/// `_v7` heuristics: handle, three descriptors in the direction's order, the convolution,
/// requested count, returned count, results.
type Heuristic = unsafe extern "C" fn(Handle, Desc, Desc, Desc, Desc, c_int, *mut c_int, *mut AlgoPerf) -> Status;
/// `Find*AlgorithmEx`: handle, (descriptor, address) of the two inputs, the convolution,
/// the output's descriptor and address, requested, returned, results, workspace, its size.
type Find = unsafe extern "C" fn(
    Handle,
    Desc,
    *const c_void,
    Desc,
    *const c_void,
    Desc,
    Desc,
    *mut c_void,
    c_int,
    *mut c_int,
    *mut AlgoPerf,
    *mut c_void,
    usize,
) -> Status;
/// `Get*WorkspaceSize`: handle, descriptors in the direction's order, algorithm, size.
type WorkspaceSize = unsafe extern "C" fn(Handle, Desc, Desc, Desc, Desc, c_int, *mut usize) -> Status;
/// The convolution itself: handle, alpha, (descriptor, address) of the two inputs, the
/// convolution, algorithm, workspace, its size, beta, the output's descriptor and address.
type Run = unsafe extern "C" fn(
    Handle,
    *const c_void,
    Desc,
    *const c_void,
    Desc,
    *const c_void,
    Desc,
    c_int,
    *mut c_void,
    usize,
    *const c_void,
    Desc,
    *mut c_void,
) -> Status;
/// `cudnnAddTensor` and `cudnnConvolutionBackwardBias`: handle, alpha, (descriptor,
/// address) in, beta, (descriptor, address) out.
type Blend =
    unsafe extern "C" fn(Handle, *const c_void, Desc, *const c_void, *const c_void, Desc, *mut c_void) -> Status;

/// The entry points of one direction.
#[derive(Clone, Copy)]
struct Entry {
    heuristic: Heuristic,
    find: Find,
    workspace: WorkspaceSize,
    run: Run,
}

/// The library: its entry points, opened once per process.
struct Library {
    found: Found,
    version: usize,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    set_stream: unsafe extern "C" fn(Handle, *mut c_void) -> Status,
    create_tensor: unsafe extern "C" fn(*mut Desc) -> Status,
    set_tensor: SetTensor,
    destroy_tensor: unsafe extern "C" fn(Desc) -> Status,
    create_filter: unsafe extern "C" fn(*mut Desc) -> Status,
    set_filter: SetFilter,
    destroy_filter: unsafe extern "C" fn(Desc) -> Status,
    create_conv: unsafe extern "C" fn(*mut Desc) -> Status,
    set_conv: SetConv,
    set_groups: unsafe extern "C" fn(Desc, c_int) -> Status,
    set_math: unsafe extern "C" fn(Desc, c_int) -> Status,
    destroy_conv: unsafe extern "C" fn(Desc) -> Status,
    entries: [Entry; 3],
    add_tensor: Blend,
    backward_bias: Blend,
}

// SAFETY: plain function pointers into a library that stays loaded for the process.
unsafe impl Send for Library {}
unsafe impl Sync for Library {}

impl Library {
    fn open() -> Result<Library> {
        if std::env::var_os("GENESIS_CUDA_CUDNN").is_some_and(|v| v == "0") {
            return Err(BackendError::unsupported("turned off by GENESIS_CUDA_CUDNN=0"));
        }
        let found = libs::open_named("cudnn", &["libcudnn.so.9".to_string(), "libcudnn.so".to_string()], "cudnn")?;
        // SAFETY: the types are the documented C signatures of these cuDNN 9 functions.
        unsafe {
            let get_version: unsafe extern "C" fn() -> usize = libs::symbol(&found, "cudnnGetVersion")?;
            let version = get_version();
            if version < MIN_VERSION {
                return Err(BackendError::unsupported(format!(
                    "{} is cuDNN {}, older than 9.0",
                    found.path,
                    version_text(version)
                )));
            }
            let entry = |direction: Direction| -> Result<Entry> {
                let [heuristic, find, workspace, run] = direction.symbols();
                Ok(Entry {
                    heuristic: libs::symbol(&found, heuristic)?,
                    find: libs::symbol(&found, find)?,
                    workspace: libs::symbol(&found, workspace)?,
                    run: libs::symbol(&found, run)?,
                })
            };
            let entries =
                [entry(Direction::Forward)?, entry(Direction::BackwardData)?, entry(Direction::BackwardFilter)?];
            Ok(libs::entry_points!(found, Library {
                error_string: "cudnnGetErrorString",
                create: "cudnnCreate",
                set_stream: "cudnnSetStream",
                create_tensor: "cudnnCreateTensorDescriptor",
                set_tensor: "cudnnSetTensor4dDescriptorEx",
                destroy_tensor: "cudnnDestroyTensorDescriptor",
                create_filter: "cudnnCreateFilterDescriptor",
                set_filter: "cudnnSetFilter4dDescriptor",
                destroy_filter: "cudnnDestroyFilterDescriptor",
                create_conv: "cudnnCreateConvolutionDescriptor",
                set_conv: "cudnnSetConvolution2dDescriptor",
                set_groups: "cudnnSetConvolutionGroupCount",
                set_math: "cudnnSetConvolutionMathType",
                destroy_conv: "cudnnDestroyConvolutionDescriptor",
                add_tensor: "cudnnAddTensor",
                backward_bias: "cudnnConvolutionBackwardBias",
                ;
                version,
                entries,
                found,
            }))
        }
    }

    /// `Ok` for success, else an error naming `call` and cuDNN's text.
    fn check(&self, call: &str, status: Status) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: cuDNN returns a static string for any status.
        let text = unsafe { CStr::from_ptr((self.error_string)(status)) }.to_string_lossy().into_owned();
        Err(BackendError::new(ErrorKind::Internal, format!("cuda: {call} failed ({status}): {text}")))
    }
}

/// `9.10.2` from cuDNN's `91002` (9.x numbering: major·10000 + minor·100 + patch).
fn version_text(v: usize) -> String {
    format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
}

fn library() -> std::result::Result<&'static Library, &'static BackendError> {
    static LIBRARY: OnceLock<Result<Library>> = OnceLock::new();
    LIBRARY.get_or_init(Library::open).as_ref()
}

/// One line for the backend's description: which convolutions run, and why.
pub fn describe() -> String {
    match library() {
        Ok(lib) => format!("cuDNN {} for convolutions ({})", version_text(lib.version), lib.found.path),
        Err(e) => format!("convolutions on the plugin's own kernels: cuDNN unavailable ({})", e.message),
    }
}

/// Which of the three convolution ops; indexes [`Library::entries`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// `y = conv(x, w)`.
    Forward = 0,
    /// `dx` from `dy` and `w`.
    BackwardData = 1,
    /// `dw` from `x` and `dy`.
    BackwardFilter = 2,
}

/// The operands of one call in the forward's terms: `x` is the input or its gradient, `w`
/// the weight or its gradient, `y` the output or its gradient.
pub struct Operands<'a> {
    /// Input (forward, backward filter) or its gradient (backward data).
    pub x: &'a Operand,
    /// Weight (forward, backward data) or its gradient (backward filter).
    pub w: &'a Operand,
    /// Output (forward) or its gradient (backward).
    pub y: &'a Operand,
    /// Bias (forward) or its gradient (backward filter).
    pub bias: Option<&'a Operand>,
}

/// Descriptors and the chosen algorithm for one shape (`None`: cuDNN declined it).
struct Plan {
    x: Desc,
    w: Desc,
    y: Desc,
    conv: Desc,
    algo: c_int,
    workspace: usize,
}

/// A cuDNN handle on one device's stream, with the plans made so far.
pub struct Dnn {
    lib: &'static Library,
    handle: Handle,
    plans: Mutex<HashMap<Vec<i64>, Option<Plan>>>,
}

// SAFETY: the handle is used under the plans' lock, one call at a time; cuDNN handles may
// move between threads; descriptors are only read after they are made.
unsafe impl Send for Dnn {}
unsafe impl Sync for Dnn {}

impl Dnn {
    /// Open cuDNN and create a handle on `stream` (the device's context is current).
    pub fn open(stream: *mut c_void) -> Result<Dnn> {
        let lib = library().map_err(Clone::clone)?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: plain calls; the handle is ours.
        unsafe {
            lib.check("cudnnCreate", (lib.create)(&mut handle))?;
            lib.check("cudnnSetStream", (lib.set_stream)(handle, stream))?;
        }
        Ok(Dnn { lib, handle, plans: Mutex::new(HashMap::new()) })
    }

    /// Run `direction` on `ops` with cuDNN. `Ok(false)`: cuDNN declines this problem (layout,
    /// dtype or size), so the caller runs its own kernels, which overwrite the outputs.
    pub fn convolve(&self, device: &CudaDevice, direction: Direction, g: &Geom, ops: &Operands) -> Result<bool> {
        let Some(key) = plan_key(direction, g, ops) else { return Ok(false) };
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        let plan = match plans.entry(key) {
            Slot::Occupied(known) => known.into_mut(),
            Slot::Vacant(new) => new.insert(self.plan(device, direction, g, ops)?),
        };
        let Some(plan) = plan.as_ref() else { return Ok(false) };
        let lib = self.lib;
        let (one_f64, zero_f64, one_f32, zero_f32) = (1.0f64, 0.0f64, 1.0f32, 0.0f32);
        let (one, zero): (*const c_void, *const c_void) = if ops.x.dtype == DType::F64 {
            (&one_f64 as *const f64 as _, &zero_f64 as *const f64 as _)
        } else {
            (&one_f32 as *const f32 as _, &zero_f32 as *const f32 as _)
        };
        let scratch = if plan.workspace > 0 { Some(device.scratch(plan.workspace)?) } else { None };
        let workspace = scratch.map_or(std::ptr::null_mut(), |(_, ptr)| ptr as *mut c_void);
        let [(d0, a0), (d1, a1), (d2, a2)] = operands(direction, plan, ops);
        let entry = lib.entries[direction as usize];
        // SAFETY: descriptors describe the operands' validated views; the workspace has the
        // size the algorithm asked for; every call is ordered on the device's stream.
        let mut ran = unsafe {
            let status = (entry.run)(
                self.handle,
                one,
                d0,
                a0 as *const c_void,
                d1,
                a1 as *const c_void,
                plan.conv,
                plan.algo,
                workspace,
                plan.workspace,
                zero,
                d2,
                a2 as *mut c_void,
            );
            lib.check(direction.symbols()[3], status)
        };
        if let (Ok(()), Some(bias)) = (&ran, ops.bias) {
            ran = self.bias(direction, plan, ops, bias, one, zero);
        }
        if let Some((id, _)) = scratch {
            device.free_scratch(id)?;
        }
        ran.map(|()| true)
    }

    /// Forward: add the bias to y. Backward filter: the bias's gradient, summed from dy.
    fn bias(
        &self,
        direction: Direction,
        plan: &Plan,
        ops: &Operands,
        bias: &Operand,
        one: *const c_void,
        zero: *const c_void,
    ) -> Result<()> {
        let lib = self.lib;
        let desc = self.tensor(&[1, bias.shape[0] as i64, 1, 1], &[bias.shape[0] as i64, 1, 1, 1], bias.dtype)?;
        // SAFETY: `desc` describes the dense bias (checked by `plan_key`), `plan.y` y or dy.
        let status = unsafe {
            match direction {
                Direction::Forward => {
                    (lib.add_tensor)(self.handle, one, desc, bias.ptr as _, one, plan.y, ops.y.ptr as _)
                }
                _ => (lib.backward_bias)(self.handle, one, plan.y, ops.y.ptr as _, zero, desc, bias.ptr as _),
            }
        };
        // SAFETY: made above, destroyed once (cuDNN keeps no reference after the call).
        unsafe { (lib.destroy_tensor)(desc) };
        lib.check(
            if direction == Direction::Forward { "cudnnAddTensor" } else { "cudnnConvolutionBackwardBias" },
            status,
        )
    }

    /// Make the descriptors of a problem and choose its algorithm; `None` when cuDNN
    /// declines it.
    fn plan(&self, device: &CudaDevice, direction: Direction, g: &Geom, ops: &Operands) -> Result<Option<Plan>> {
        let null = std::ptr::null_mut();
        let mut plan = Plan { x: null, y: null, w: null, conv: null, algo: 0, workspace: 0 };
        let made = self.describe(&mut plan, g, ops).and_then(|()| self.choose(device, direction, &mut plan, ops));
        match made {
            Ok(true) => return Ok(Some(plan)),
            Ok(false) => {}
            // Declined while describing (a layout or size cuDNN does not take): not an error.
            Err(e) if e.kind == ErrorKind::Unsupported => {}
            Err(e) => {
                self.destroy(&plan);
                return Err(e);
            }
        }
        self.destroy(&plan);
        Ok(None)
    }

    /// The descriptors of `plan`.
    fn describe(&self, plan: &mut Plan, g: &Geom, ops: &Operands) -> Result<()> {
        let lib = self.lib;
        let dtype = cudnn_type(ops.x.dtype).ok_or_else(|| BackendError::unsupported("cudnn: dtype"))?;
        plan.x = self.tensor_of(ops.x)?;
        plan.y = self.tensor_of(ops.y)?;
        let w = &ops.w.shape;
        // SAFETY: plain descriptor calls on descriptors we own.
        unsafe {
            lib.check("cudnnCreateFilterDescriptor", (lib.create_filter)(&mut plan.w))?;
            let nhwc = is_channels_last(ops.w);
            let dims = [w[0], w[1], w[2], w[3]].map(|d| d as c_int);
            let status = (lib.set_filter)(plan.w, dtype, nhwc as c_int, dims[0], dims[1], dims[2], dims[3]);
            decline_or_check(lib, "cudnnSetFilter4dDescriptor", status)?;
            lib.check("cudnnCreateConvolutionDescriptor", (lib.create_conv)(&mut plan.conv))?;
            let (r, c) = (&g.rows, &g.cols);
            let compute = if dtype == 1 { 1 } else { 0 };
            let status = (lib.set_conv)(
                plan.conv,
                r.pad as c_int,
                c.pad as c_int,
                r.stride as c_int,
                c.stride as c_int,
                r.dilation as c_int,
                c.dilation as c_int,
                1, // CUDNN_CROSS_CORRELATION: PyTorch's convolution
                compute,
            );
            decline_or_check(lib, "cudnnSetConvolution2dDescriptor", status)?;
            decline_or_check(lib, "cudnnSetConvolutionGroupCount", (lib.set_groups)(plan.conv, g.groups as c_int))?;
            decline_or_check(lib, "cudnnSetConvolutionMathType", (lib.set_math)(plan.conv, math_type(ops.x.dtype)))?;
        }
        Ok(())
    }

    /// Choose the algorithm: time the candidates, or ask the heuristics while capturing.
    /// `false` when no algorithm takes the problem.
    fn choose(&self, device: &CudaDevice, direction: Direction, plan: &mut Plan, ops: &Operands) -> Result<bool> {
        let lib = self.lib;
        let entry = lib.entries[direction as usize];
        let [(d0, _), (d1, _), (d2, _)] = operands(direction, plan, ops);
        let mut found = [AlgoPerf::default(); CANDIDATES];
        let mut count: c_int = 0;
        // SAFETY: the descriptors are made; `found` has room for CANDIDATES results.
        let status = unsafe {
            (entry.heuristic)(self.handle, d0, d1, plan.conv, d2, CANDIDATES as c_int, &mut count, found.as_mut_ptr())
        };
        if declined(status) {
            return Ok(false);
        }
        lib.check(direction.symbols()[0], status)?;
        let usable = |p: &AlgoPerf| p.status == 0 && p.memory <= WORKSPACE_CAP && direction.keeps_precision(p.algo);
        let heuristic: Vec<AlgoPerf> = found[..count.max(0) as usize].iter().copied().filter(usable).collect();
        let Some(first) = heuristic.first().copied() else { return Ok(false) };
        let mut best = first;
        if !device.capturing() {
            if let Some(timed) = self.time(device, direction, plan, ops, &heuristic)? {
                best = timed;
            }
        }
        // The size the algorithm needs with these descriptors (the search's figure can be
        // for another math mode).
        let mut bytes = 0usize;
        // SAFETY: as above.
        let status = unsafe { (entry.workspace)(self.handle, d0, d1, plan.conv, d2, best.algo, &mut bytes) };
        if declined(status) {
            return Ok(false);
        }
        lib.check(direction.symbols()[2], status)?;
        plan.algo = best.algo;
        plan.workspace = bytes;
        Ok(true)
    }

    /// Time the candidates on the real operands (the outputs are overwritten, and written
    /// again by the call that follows). `None` when the search finds nothing usable.
    fn time(
        &self,
        device: &CudaDevice,
        direction: Direction,
        plan: &Plan,
        ops: &Operands,
        candidates: &[AlgoPerf],
    ) -> Result<Option<AlgoPerf>> {
        let lib = self.lib;
        let entry = lib.entries[direction as usize];
        let bytes = candidates.iter().map(|p| p.memory).max().unwrap_or(0);
        let scratch = if bytes > 0 { device.scratch(bytes).ok() } else { None };
        let (workspace, size) = scratch.map_or((std::ptr::null_mut(), 0), |(_, ptr)| (ptr as *mut c_void, bytes));
        let [(d0, a0), (d1, a1), (d2, a2)] = operands(direction, plan, ops);
        let mut found = [AlgoPerf::default(); CANDIDATES];
        let mut count: c_int = 0;
        // SAFETY: descriptors and addresses of validated operands; the workspace has `size`
        // bytes; cuDNN synchronizes the stream around its timing runs.
        let status = unsafe {
            (entry.find)(
                self.handle,
                d0,
                a0 as *const c_void,
                d1,
                a1 as *const c_void,
                plan.conv,
                d2,
                a2 as *mut c_void,
                CANDIDATES as c_int,
                &mut count,
                found.as_mut_ptr(),
                workspace,
                size,
            )
        };
        if let Some((id, _)) = scratch {
            device.free_scratch(id)?;
        }
        if declined(status) {
            return Ok(None);
        }
        lib.check(direction.symbols()[1], status)?;
        let usable = |p: &&AlgoPerf| p.status == 0 && p.memory <= size && direction.keeps_precision(p.algo);
        Ok(found[..count.max(0) as usize].iter().find(usable).copied())
    }

    /// A tensor descriptor of `shape` and `strides`; declined (`Unsupported`) when cuDNN
    /// cannot describe it.
    fn tensor(&self, shape: &[i64; 4], strides: &[i64; 4], dtype: DType) -> Result<Desc> {
        let lib = self.lib;
        let Some(dt) = cudnn_type(dtype) else { return Err(BackendError::unsupported("cudnn: dtype")) };
        let mut desc: Desc = std::ptr::null_mut();
        let [n, c, h, w] = shape.map(|d| d as c_int);
        let [ns, cs, hs, ws] = strides.map(|s| s as c_int);
        // SAFETY: plain descriptor calls.
        unsafe {
            lib.check("cudnnCreateTensorDescriptor", (lib.create_tensor)(&mut desc))?;
            let status = (lib.set_tensor)(desc, dt, n, c, h, w, ns, cs, hs, ws);
            if status != 0 {
                (lib.destroy_tensor)(desc);
                return decline_or_check(lib, "cudnnSetTensor4dDescriptorEx", status).map(|()| desc);
            }
        }
        Ok(desc)
    }

    /// The descriptor of a rank-4 operand (strides of size-1 dimensions made packed).
    fn tensor_of(&self, o: &Operand) -> Result<Desc> {
        let shape: [i64; 4] = std::array::from_fn(|i| o.shape[i] as i64);
        self.tensor(&shape, &packed_strides(o), o.dtype)
    }

    fn destroy(&self, plan: &Plan) {
        let lib = self.lib;
        // SAFETY: each descriptor is ours and destroyed once; null ones were never made.
        unsafe {
            for t in [plan.x, plan.y] {
                if !t.is_null() {
                    (lib.destroy_tensor)(t);
                }
            }
            if !plan.w.is_null() {
                (lib.destroy_filter)(plan.w);
            }
            if !plan.conv.is_null() {
                (lib.destroy_conv)(plan.conv);
            }
        }
    }
}

impl Drop for Dnn {
    fn drop(&mut self) {
        let plans = std::mem::take(self.plans.get_mut().unwrap_or_else(|p| p.into_inner()));
        for plan in plans.values().flatten() {
            self.destroy(plan);
        }
        // The handle is left to the process's end: destroying it needs the device's context
        // current, which a dropping device no longer guarantees.
    }
}

impl Direction {
    /// Whether algorithm `algo` computes plain dot products. The FFT and Winograd ones
    /// transform the data and round the transforms in T: for f16 and bf16 that is an error of
    /// the order of T's epsilon times the operands' magnitude, far beyond a dot product's
    /// (measured: 8% on small outputs), so they are never chosen.
    fn keeps_precision(self, algo: c_int) -> bool {
        match self {
            // IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM, GEMM, DIRECT.
            Direction::Forward => (0..=3).contains(&algo),
            // ALGO_0, ALGO_1.
            Direction::BackwardData => (0..=1).contains(&algo),
            // ALGO_0, ALGO_1, ALGO_3.
            Direction::BackwardFilter => matches!(algo, 0 | 1 | 3),
        }
    }

    /// The names of the direction's entry points: heuristics, timed search, workspace size,
    /// the convolution itself (the order of [`Entry`]'s fields).
    fn symbols(self) -> [&'static str; 4] {
        [
            [
                "cudnnGetConvolutionForwardAlgorithm_v7",
                "cudnnFindConvolutionForwardAlgorithmEx",
                "cudnnGetConvolutionForwardWorkspaceSize",
                "cudnnConvolutionForward",
            ],
            [
                "cudnnGetConvolutionBackwardDataAlgorithm_v7",
                "cudnnFindConvolutionBackwardDataAlgorithmEx",
                "cudnnGetConvolutionBackwardDataWorkspaceSize",
                "cudnnConvolutionBackwardData",
            ],
            [
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                "cudnnFindConvolutionBackwardFilterAlgorithmEx",
                "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                "cudnnConvolutionBackwardFilter",
            ],
        ][self as usize]
    }
}

/// The (descriptor, address) triples of a direction in cuDNN's argument order: the two
/// inputs, then the output.
fn operands(direction: Direction, plan: &Plan, ops: &Operands) -> [(Desc, u64); 3] {
    let (x, w, y) = ((plan.x, ops.x.ptr), (plan.w, ops.w.ptr), (plan.y, ops.y.ptr));
    match direction {
        Direction::Forward => [x, w, y],
        Direction::BackwardData => [w, y, x],
        Direction::BackwardFilter => [x, y, w],
    }
}

/// `cudnnDataType_t` of `dtype`, for the dtypes cuDNN convolves.
fn cudnn_type(dtype: DType) -> Option<c_int> {
    match dtype {
        DType::F32 => Some(0),
        DType::F64 => Some(1),
        DType::F16 => Some(2),
        DType::BF16 => Some(9),
        _ => None,
    }
}

/// `cudnnMathType_t`: tensor cores for f16 and bf16; f32 IEEE (`CUDNN_FMA_MATH`) unless TF32
/// is allowed; the default for f64.
fn math_type(dtype: DType) -> c_int {
    match dtype {
        DType::F16 | DType::BF16 => 1,
        DType::F32 if std::env::var_os("GENESIS_CUDA_ALLOW_TF32").is_none_or(|v| v == "0") => 3,
        _ => 0,
    }
}

/// Whether a weight is dense in channels-last order `(o, kh, kw, c/g)`.
fn is_channels_last(w: &Operand) -> bool {
    let [_, c, h, wd] = [w.shape[0], w.shape[1], w.shape[2], w.shape[3]].map(|d| d as isize);
    w.strides[1..] == [1, wd * c, c] && (w.shape[0] == 1 || w.strides[0] == h * wd * c)
}

/// Whether a weight is dense in `(o, c/g, kh, kw)` order.
fn is_dense(w: &Operand) -> bool {
    w.strides == genesis_backend_api::contiguous_strides(&w.shape) || is_channels_last(w)
}

/// Strides for cuDNN: those of size-1 dimensions do not address anything, so they are set
/// as a packed tensor would have them (cuDNN rejects some, such as 0).
fn packed_strides(o: &Operand) -> [i64; 4] {
    let span: i64 =
        (0..4).filter(|&i| o.shape[i] > 1).map(|i| o.strides[i] as i64 * o.shape[i] as i64).max().unwrap_or(1);
    std::array::from_fn(|i| if o.shape[i] == 1 { span.max(1) } else { o.strides[i] as i64 })
}

/// The key of a problem's plan: direction, dtype, window, groups, every operand's shape and
/// strides; `None` when cuDNN cannot take it: a dtype it lacks, a non-dense weight or bias,
/// negative or zero strides, sizes beyond its 32-bit indices, an address not aligned to 16
/// bytes (its vectorized kernels fault on those), or a bias in f16 or bf16 (cuDNN adds it to
/// the rounded output, a second rounding the plugin's kernels do not make).
fn plan_key(direction: Direction, g: &Geom, ops: &Operands) -> Option<Vec<i64>> {
    cudnn_type(ops.x.dtype)?;
    let half = matches!(ops.x.dtype, DType::F16 | DType::BF16);
    if !is_dense(ops.w) || ops.bias.is_some_and(|b| half || (b.strides[0] != 1 && b.shape[0] > 1)) {
        return None;
    }
    if [Some(ops.x), Some(ops.w), Some(ops.y), ops.bias].into_iter().flatten().any(|o| o.ptr % 16 != 0) {
        return None;
    }
    let mut key = vec![direction as i64, ops.x.dtype as i64, g.groups as i64, ops.bias.is_some() as i64];
    for axis in [&g.rows, &g.cols] {
        key.extend([axis.stride, axis.pad, axis.dilation]);
    }
    for o in [ops.x, ops.w, ops.y] {
        if o.shape.len() != 4 || o.shape.contains(&0) {
            return None;
        }
        let strides = packed_strides(o);
        if strides.iter().any(|&s| s <= 0) || o.shape.iter().product::<usize>() >= i32::MAX as usize {
            return None;
        }
        key.extend(o.shape.iter().map(|&d| d as i64));
        key.extend(strides);
    }
    Some(key)
}

/// Declined statuses become `Unsupported` (the plugin's kernels take the problem); others
/// are errors.
fn decline_or_check(lib: &Library, call: &str, status: Status) -> Result<()> {
    if declined(status) {
        return Err(BackendError::unsupported(format!("cudnn: {call} declined ({status})")));
    }
    lib.check(call, status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algo_perf_has_cudnns_layout() {
        // cudnnConvolutionFwdAlgoPerf_t: enum, status, float, (pad), size_t, two enums, int[3].
        assert_eq!(std::mem::size_of::<AlgoPerf>(), 48);
        assert_eq!(std::mem::offset_of!(AlgoPerf, memory), 16);
        assert_eq!(std::mem::offset_of!(AlgoPerf, determinism), 24);
    }

    #[test]
    fn cudnn_versions_read_as_major_minor_patch() {
        assert_eq!(version_text(91002), "9.10.2");
        assert_eq!(version_text(90000), "9.0.0");
    }

    fn operand(shape: [usize; 4], strides: [isize; 4]) -> Operand {
        Operand { ptr: 0, dtype: DType::BF16, shape: shape.to_vec(), strides: strides.to_vec() }
    }

    #[test]
    fn size_one_dimensions_get_packed_strides() {
        let o = operand([1, 8, 4, 4], [0, 16, 4, 1]);
        assert_eq!(packed_strides(&o), [128, 16, 4, 1]);
    }

    #[test]
    fn weights_must_be_dense_in_either_order() {
        assert!(is_dense(&operand([8, 3, 3, 3], [27, 9, 3, 1])));
        assert!(is_dense(&operand([8, 3, 3, 3], [27, 1, 9, 3])));
        assert!(!is_dense(&operand([8, 3, 3, 3], [54, 9, 3, 1])));
    }
}
