//! Launch helpers shared by the kernel families: grids, compute types, scratch buffers (and
//! outputs written through them) and 1-D launches. (Their operand checks are the SDK's
//! `sdk::checks`.)

use crate::device::CudaDevice;
use crate::kernels::{set_geometry, Args, Module, Operand};
use genesis_backend_api::{contiguous_strides, BufferId, DType, Op, Result, TensorDesc};

/// Blocks for a grid-stride kernel over `work` items: enough to fill every SM `per_sm` times.
pub fn grid(device: &CudaDevice, work: u64, per_sm: u32) -> u32 {
    work.min(device.facts.sm_count as u64 * per_sm as u64).min(i32::MAX as u64) as u32
}

/// The compute type of a float element type: f32 for f16, bf16 and f32, f64 for f64.
pub fn compute_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Scratch buffers of one op, freed together (stream order makes freeing while the op is
/// queued safe).
#[derive(Default)]
pub struct Scratch(Vec<BufferId>);

impl Scratch {
    /// A dense row-major scratch operand of `shape` and `dtype`.
    pub fn dense(&mut self, device: &CudaDevice, dtype: DType, shape: &[usize]) -> Result<Operand> {
        let bytes = shape.iter().product::<usize>().max(1) * dtype.size_in_bytes();
        let (id, ptr) = device.scratch(bytes)?;
        self.0.push(id);
        Ok(Operand { ptr, dtype, shape: shape.to_vec(), strides: contiguous_strides(shape) })
    }

    /// A dense row-major scratch tensor of `shape` and `dtype` as a descriptor: for running
    /// other ops of the plugin on it (a fused op's composition).
    pub fn desc(&mut self, device: &CudaDevice, dtype: DType, shape: &[usize]) -> Result<TensorDesc> {
        let bytes = shape.iter().product::<usize>().max(1) * dtype.size_in_bytes();
        let (id, _) = device.scratch(bytes)?;
        self.0.push(id);
        TensorDesc::contiguous(id, 0, dtype, shape)
    }

    /// `x` itself when it is dense row-major, else a dense copy of it (with the elementwise
    /// module's strided copy kernel).
    pub fn contiguous(&mut self, device: &CudaDevice, op: &Op, x: &Operand) -> Result<Operand> {
        if is_dense(x) {
            return Ok(x.clone());
        }
        let y = self.dense(device, x.dtype, &x.shape)?;
        copy(device, op, x, &y)?;
        Ok(y)
    }

    /// Where kernels that take dense operands write output `y`: `y` itself when it is dense
    /// row-major, else a dense scratch buffer that `copy_back` then copies into `y`.
    pub fn dense_output(&mut self, device: &CudaDevice, y: &Operand) -> Result<Operand> {
        if is_dense(y) {
            Ok(y.clone())
        } else {
            self.dense(device, y.dtype, &y.shape)
        }
    }

    /// Free every buffer; the first error wins.
    pub fn free(self, device: &CudaDevice) -> Result<()> {
        let mut result = Ok(());
        for id in self.0 {
            let r = device.free_scratch(id);
            if result.is_ok() {
                result = r;
            }
        }
        result
    }
}

/// Runs `body` with a fresh scratch set and frees the set afterwards, whether or not `body`
/// failed; the body's error wins over the free's.
pub fn with_scratch<T>(device: &CudaDevice, body: impl FnOnce(&mut Scratch) -> Result<T>) -> Result<T> {
    let mut scratch = Scratch::default();
    let result = body(&mut scratch);
    let freed = scratch.free(device);
    result.and_then(|value| freed.map(|()| value))
}

/// Whether `x` is dense row-major (an operand of at most one element is, whatever its strides).
pub fn is_dense(x: &Operand) -> bool {
    x.numel() <= 1 || x.strides == contiguous_strides(&x.shape)
}

/// The last step of an op whose kernels wrote through `Scratch::dense_output`: copies each
/// scratch output in `written` into the output of `outs` it stands for.
pub fn copy_back(device: &CudaDevice, op: &Op, outs: &[Operand], written: &[Operand]) -> Result<()> {
    for (y, w) in outs.iter().zip(written) {
        if y.ptr != w.ptr {
            copy(device, op, w, y)?;
        }
    }
    Ok(())
}

/// `y = x` elementwise (same shape and dtype, any strides) with the strided copy kernel.
pub fn copy(device: &CudaDevice, op: &Op, x: &Operand, y: &Operand) -> Result<()> {
    let mut args = Args::default();
    set_geometry(&mut args, &[x, y]);
    device.launch(op.name(), x.dtype, "copy_s", &mut args, 1)
}

/// Zero `bytes` bytes at `ptr` on the device's stream.
pub fn zero(device: &CudaDevice, ptr: u64, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the callers pass ranges inside buffers they own; ordered on our stream.
    unsafe { cudarc::driver::result::memset_d8_async(ptr, 0, bytes, device.stream()) }
        .map_err(|e| crate::device::driver_error("cuMemsetD8Async", e))
}

/// Launch on a 1-D grid of 1-D blocks: `(blocks, threads, shared bytes)`, the geometry the
/// attention, convolution and pooling kernels use.
pub fn launch_1d<P: Copy>(
    device: &CudaDevice,
    op: &str,
    module: &'static Module,
    dtype: DType,
    name: &str,
    params: &mut P,
    (blocks, threads, smem): (u32, u32, u32),
) -> Result<()> {
    device.launch_with(op, module, dtype, name, params, ((blocks, 1), (threads, 1), smem), false)
}
