//! 2-D convolution (stride, zero padding, dilation, groups, optional bias) and its two backward
//! ops: through cuDNN when it is there and takes the problem (`crate::cudnn`), else im2col /
//! col2im kernels (`kernels/conv.cu`) around cuBLAS strided-batched products, one product per
//! chunk of samples with the groups as its batch. Also the argument block
//! ([`ConvArgs`]) that pooling shares; the window geometry is the SDK's [`Axis`].
//!
//! Dtype rules of the plugin's own kernels are the CPU backend's: products read T and accumulate in the compute type (f32
//! for f16/bf16 — cuBLAS writes an f32 C — f64 for f64); every result is rounded to T once,
//! after the bias is added. f32 products are IEEE unless `GENESIS_CUDA_ALLOW_TF32=1`, as for
//! matmul. x, dy, y, dx, bias and dbias are used through their strides; the weight is copied
//! dense when it is not (cuBLAS needs one leading dimension).

use super::launch::{compute_dtype, grid, launch_1d, with_scratch, zero, Scratch};
use super::resolve;
use super::Family;
use crate::blas::{data_type, gemm_types, Blas, Gemm};
use crate::cudnn::{Direction, Dnn, Operands};
use crate::device::CudaDevice;
use crate::kernels::Operand;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::sdk::window::{Axis, Conv2d as Geom};
use genesis_backend_api::{contiguous_strides, BackendError, DType, Op, OpKind, Result, TensorDesc, Window2d};

kernel_module! {
    /// im2col/col2im for convolution, and 2-D pooling.
    MODULE = "window", for &DType::FLOATS,
    from "conv.cu", "pool.cu"
}
inventory::submit! { Family { claims, run } }

/// Bytes of scratch one chunk of samples may use (column matrix plus product); a single
/// sample always goes, whatever its size.
const CHUNK_BYTES: usize = 256 << 20;

/// What this family runs.
fn claims() -> Vec<(OpKind, DType)> {
    let (window, groups) = (Window2d::default(), 1);
    let ops = [
        Op::Conv2d { window, groups },
        Op::Conv2dBackwardInput { window, groups },
        Op::Conv2dBackwardWeight { window, groups },
    ];
    domain::claims(&ops)
}

/// Mirror of `struct ConvArgs` in conv.cu (a test compares the layouts).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ConvArgs {
    /// Operand addresses (per kernel, see conv.cu and pool.cu).
    pub p: [u64; 4],
    /// Strides of x / dx (or of dweight in `conv_store`).
    pub xs: [i64; 4],
    /// Strides of y / dy.
    pub ys: [i64; 4],
    /// Strides of the third operand (bias, argmax).
    pub zs: [i64; 4],
    /// First sample of the chunk.
    pub n0: i64,
    /// Samples in the chunk.
    pub nc: i64,
    /// Input channels, height, width; output channels, groups, output height, width; taps.
    pub c: i64,
    /// See `c`.
    pub h: i64,
    /// See `c`.
    pub w: i64,
    /// See `c`.
    pub o: i64,
    /// See `c`.
    pub g: i64,
    /// See `c`.
    pub oh: i64,
    /// See `c`.
    pub ow: i64,
    /// See `c`.
    pub kh: i64,
    /// See `c`.
    pub kw: i64,
    /// Strides, paddings, dilations (height, width).
    pub sh: i64,
    /// See `sh`.
    pub sw: i64,
    /// See `sh`.
    pub ph: i64,
    /// See `sh`.
    pub pw: i64,
    /// See `sh`.
    pub dh: i64,
    /// See `sh`.
    pub dw: i64,
}

/// Element strides of a rank-4 operand (or of a rank-1 one in slot 0).
pub fn strides(o: &Operand) -> [i64; 4] {
    let mut st = [0i64; 4];
    for (d, &s) in st.iter_mut().zip(&o.strides) {
        *d = s as i64;
    }
    st
}

impl ConvArgs {
    /// The geometry of a window over `n` samples of `c` planes.
    pub fn window(n: usize, c: usize, rows: &Axis, cols: &Axis) -> ConvArgs {
        ConvArgs {
            nc: n as i64,
            c: c as i64,
            h: rows.input as i64,
            w: cols.input as i64,
            oh: rows.output as i64,
            ow: cols.output as i64,
            kh: rows.kernel as i64,
            kw: cols.kernel as i64,
            sh: rows.stride,
            sw: cols.stride,
            ph: rows.pad,
            pw: cols.pad,
            dh: rows.dilation,
            dw: cols.dilation,
            ..ConvArgs::default()
        }
    }
}

/// Launch `name` of the window module (conv.cu + pool.cu) over `work` elements.
pub fn launch(device: &CudaDevice, op: &Op, dtype: DType, name: &str, a: &mut ConvArgs, work: u64) -> Result<()> {
    let blocks = grid(device, work.div_ceil(256), 32);
    launch_1d(device, op.name(), &MODULE, dtype, name, a, (blocks, 256, 0))
}

/// The argument block of `g`.
fn conv_args(g: &Geom) -> ConvArgs {
    let mut a = ConvArgs::window(g.n, g.c, &g.rows, &g.cols);
    a.o = g.o as i64;
    a.g = g.groups as i64;
    a
}

/// Samples per chunk when one sample needs `per_sample` bytes of scratch.
fn chunk(g: &Geom, per_sample: usize) -> usize {
    (CHUNK_BYTES / per_sample.max(1)).clamp(1, g.n.max(1))
}

/// Run one convolution op.
fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let (ins, outs) = resolve(device, inputs, outputs)?;
    with_scratch(device, |scratch| match *op {
        Op::Conv2d { window, groups } => {
            let (g, ([x, w, y], bias)) = Geom::forward(op, &window, groups, &ins, &outs)?;
            if with_cudnn(device, Direction::Forward, &g, Operands { x, w, y, bias })? {
                return Ok(());
            }
            forward(device, op, &g, x, w, bias, y, scratch)
        }
        Op::Conv2dBackwardInput { window, groups } => {
            let (g, [dy, w, dx]) = Geom::backward_input(op, &window, groups, &ins, &outs)?;
            if with_cudnn(device, Direction::BackwardData, &g, Operands { x: dx, w, y: dy, bias: None })? {
                return Ok(());
            }
            backward_input(device, op, &g, dy, w, dx, scratch)
        }
        Op::Conv2dBackwardWeight { window, groups } => {
            let (g, ([dy, x, dw], db)) = Geom::backward_weight(op, &window, groups, &ins, &outs)?;
            if with_cudnn(device, Direction::BackwardFilter, &g, Operands { x, w: dw, y: dy, bias: db })? {
                return Ok(());
            }
            backward_weight(device, op, &g, dy, x, dw, db, scratch)
        }
        _ => Err(BackendError::unsupported(format!("cuda: {} is not a convolution", op.name()))),
    })
}

/// Run a convolution through cuDNN when the library is there and takes the problem; `false`
/// leaves it to the plugin's kernels (see `cudnn`).
fn with_cudnn(device: &CudaDevice, direction: Direction, g: &Geom, ops: Operands) -> Result<bool> {
    match device.cudnn.get_or_init(|| Dnn::open(device.stream() as *mut _)) {
        Ok(dnn) => dnn.convolve(device, direction, g, &ops),
        Err(_) => Ok(false),
    }
}

fn blas(device: &CudaDevice) -> Result<&Blas> {
    device.blas.get_or_init(|| Blas::open(device.stream() as *mut _)).as_ref().map_err(Clone::clone)
}

/// cuBLAS data type of the compute type of `dtype` (the accumulators' C).
fn acc_type(dtype: DType) -> i32 {
    if dtype == DType::F64 {
        data_type::R_64F
    } else {
        data_type::R_32F
    }
}

/// One strided-batched product over the groups, in cuBLAS's column-major terms: `(op, addr,
/// ld, batch stride)` for A and B, `(addr, ld, stride)` for C (of the compute type). A zero
/// inner dimension writes zeros (unless accumulating) rather than asking cuBLAS.
#[allow(clippy::too_many_arguments)]
fn product(
    device: &CudaDevice,
    dtype: DType,
    groups: usize,
    (m, n, k): (usize, usize, usize),
    a: (i32, u64, usize, usize),
    b: (i32, u64, usize, usize),
    c: (u64, usize, usize),
    accumulate: bool,
) -> Result<()> {
    if m == 0 || n == 0 || groups == 0 {
        return Ok(());
    }
    let acc_bytes = compute_dtype(dtype).size_in_bytes();
    if k == 0 {
        return if accumulate { Ok(()) } else { zero(device, c.0, groups * c.2 * acc_bytes) };
    }
    let fits = |v: usize| {
        i32::try_from(v).map_err(|_| {
            BackendError::unsupported(format!(
                "cuda: a convolution product dimension ({v}) exceeds cuBLAS's 32-bit sizes"
            ))
        })
    };
    let (dtype_code, compute_type) = gemm_types(dtype, "convolution")?;
    let g = Gemm {
        trans: (a.0, b.0),
        m: fits(m)?,
        n: fits(n)?,
        k: fits(k)?,
        a: (a.1, fits(a.2)?, a.3 as i64),
        b: (b.1, fits(b.2)?, b.3 as i64),
        c: (c.0, fits(c.1)?, c.2 as i64),
        batch: fits(groups)?,
        dtype: dtype_code,
        compute: compute_type,
    };
    // SAFETY: the callers size every matrix from one `Geom` inside scratch buffers (or the
    // dense weight); the handle is on this device's stream.
    unsafe { blas(device)?.gemm_into(&g, acc_type(dtype), accumulate) }
}

/// Copy samples n0..n0+nc of dy (n, o, oh, ow) to `dst` as a dense (O, nc, OH·OW) array: one
/// matrix per group with the chunk's positions as columns. `dst` holds a full chunk.
fn dy_columns(device: &CudaDevice, op: &Op, g: &Geom, dy: &Operand, (n0, nc): (usize, usize), dst: u64) -> Result<()> {
    let elem = dy.dtype.size_in_bytes() as i64;
    let view = Operand {
        ptr: dy.ptr.wrapping_add((n0 as i64 * dy.strides[0] as i64 * elem) as u64),
        dtype: dy.dtype,
        shape: vec![g.o, nc, g.rows.output, g.cols.output],
        strides: vec![dy.strides[1], dy.strides[0], dy.strides[2], dy.strides[3]],
    };
    let dense =
        Operand { ptr: dst, dtype: dy.dtype, shape: view.shape.clone(), strides: contiguous_strides(&view.shape) };
    super::launch::copy(device, op, &view, &dense)
}

#[allow(clippy::too_many_arguments)]
fn forward(
    device: &CudaDevice,
    op: &Op,
    g: &Geom,
    x: &Operand,
    w: &Operand,
    bias: Option<&Operand>,
    y: &Operand,
    scratch: &mut Scratch,
) -> Result<()> {
    if y.numel() == 0 {
        return Ok(());
    }
    let dtype = x.dtype;
    let (elem, acc_elem) = (dtype.size_in_bytes(), compute_dtype(dtype).size_in_bytes());
    let w = scratch.contiguous(device, op, w)?;
    let (ck, og, l) = (g.ck(), g.og(), g.l());
    let nc = chunk(g, (g.c * g.rows.kernel * g.cols.kernel * elem + g.o * acc_elem) * l);
    let cols = scratch.dense(device, dtype, &[g.c * g.rows.kernel * g.cols.kernel, nc * l])?;
    let acc = scratch.dense(device, compute_dtype(dtype), &[g.o, nc, l])?;
    let mut a = conv_args(g);
    a.xs = strides(x);
    a.ys = strides(y);
    if let Some(b) = bias {
        a.zs[0] = b.strides[0] as i64;
    }
    for n0 in (0..g.n).step_by(nc) {
        let count = nc.min(g.n - n0);
        let k = count * l;
        (a.n0, a.nc) = (n0 as i64, count as i64);
        a.p = [x.ptr, cols.ptr, 0, 0];
        launch(device, op, dtype, "conv_im2col", &mut a, (g.c * g.rows.kernel * g.cols.kernel * k) as u64)?;
        // Y_g (og × K) = W_g (og × ck) · cols_g (ck × K); column-major: Y_gᵀ = cols_gᵀ · W_gᵀ.
        product(
            device,
            dtype,
            g.groups,
            (k, og, ck),
            (0, cols.ptr, k, ck * k),
            (0, w.ptr, ck, og * ck),
            (acc.ptr, k, og * k),
            false,
        )?;
        a.p = [acc.ptr, bias.map_or(0, |b| b.ptr), y.ptr, 0];
        launch(device, op, dtype, "conv_out", &mut a, (count * g.o * l) as u64)?;
    }
    Ok(())
}

fn backward_input(
    device: &CudaDevice,
    op: &Op,
    g: &Geom,
    dy: &Operand,
    w: &Operand,
    dx: &Operand,
    scratch: &mut Scratch,
) -> Result<()> {
    if dx.numel() == 0 {
        return Ok(());
    }
    let dtype = dy.dtype;
    let (elem, acc_elem) = (dtype.size_in_bytes(), compute_dtype(dtype).size_in_bytes());
    let w = scratch.contiguous(device, op, w)?;
    let (ck, og, l) = (g.ck(), g.og(), g.l());
    let rows = g.c * g.rows.kernel * g.cols.kernel;
    let nc = chunk(g, (rows * acc_elem + g.o * elem) * l);
    let cols = scratch.dense(device, compute_dtype(dtype), &[rows, nc * l])?;
    let dyc = scratch.dense(device, dtype, &[g.o, nc * l])?;
    let mut a = conv_args(g);
    a.xs = strides(dx);
    for n0 in (0..g.n).step_by(nc) {
        let count = nc.min(g.n - n0);
        let k = count * l;
        if k > 0 {
            dy_columns(device, op, g, dy, (n0, count), dyc.ptr)?;
            // cols_g (ck × K) = W_gᵀ (ck × og) · dy_g (og × K); column-major:
            // cols_gᵀ (K × ck) = dy_gᵀ (K × og) · W_g (og × ck, W read transposed).
            product(
                device,
                dtype,
                g.groups,
                (k, ck, og),
                (0, dyc.ptr, k, og * k),
                (1, w.ptr, ck, og * ck),
                (cols.ptr, k, ck * k),
                false,
            )?;
        }
        (a.n0, a.nc) = (n0 as i64, count as i64);
        a.p = [cols.ptr, dx.ptr, 0, 0];
        launch(device, op, dtype, "conv_col2im", &mut a, (count * g.c * g.rows.input * g.cols.input) as u64)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn backward_weight(
    device: &CudaDevice,
    op: &Op,
    g: &Geom,
    dy: &Operand,
    x: &Operand,
    dw: &Operand,
    db: Option<&Operand>,
    scratch: &mut Scratch,
) -> Result<()> {
    let dtype = dy.dtype;
    let elem = dtype.size_in_bytes();
    let (ck, og, l) = (g.ck(), g.og(), g.l());
    let rows = g.c * g.rows.kernel * g.cols.kernel;
    let mut a = conv_args(g);
    if dw.numel() > 0 {
        // dW accumulates over chunks in the compute type, then is rounded into dw once.
        let acc = scratch.dense(device, compute_dtype(dtype), &[g.o, ck])?;
        let nc = chunk(g, (rows + g.o) * elem * l);
        let cols = scratch.dense(device, dtype, &[rows, nc * l])?;
        let dyc = scratch.dense(device, dtype, &[g.o, nc * l])?;
        a.xs = strides(x);
        let mut first = true;
        for n0 in (0..g.n).step_by(nc) {
            let count = nc.min(g.n - n0);
            let k = count * l;
            if k == 0 {
                continue;
            }
            (a.n0, a.nc) = (n0 as i64, count as i64);
            a.p = [x.ptr, cols.ptr, 0, 0];
            launch(device, op, dtype, "conv_im2col", &mut a, (rows * k) as u64)?;
            dy_columns(device, op, g, dy, (n0, count), dyc.ptr)?;
            // dW_g (og × ck) += dy_g (og × K) · cols_gᵀ (K × ck); column-major:
            // dW_gᵀ (ck × og) = cols_g (ck × K, read transposed) · dy_gᵀ (K × og).
            product(
                device,
                dtype,
                g.groups,
                (ck, og, k),
                (1, cols.ptr, k, ck * k),
                (0, dyc.ptr, k, og * k),
                (acc.ptr, ck, og * ck),
                !first,
            )?;
            first = false;
        }
        if first {
            // No sample or no output position: the gradient is an empty sum.
            zero(device, acc.ptr, g.o * ck * compute_dtype(dtype).size_in_bytes())?;
        }
        let mut s = conv_args(g);
        s.c = g.cg() as i64;
        s.xs = strides(dw);
        s.p = [acc.ptr, dw.ptr, 0, 0];
        launch(device, op, dtype, "conv_store", &mut s, (g.o * ck) as u64)?;
    }
    if let Some(db) = db {
        if g.o > 0 {
            let mut b = conv_args(g);
            b.ys = strides(dy);
            b.zs[0] = db.strides[0] as i64;
            b.p = [dy.ptr, db.ptr, 0, 0];
            let smem = 256 * compute_dtype(dtype).size_in_bytes() as u32;
            let blocks = grid(device, g.o as u64, 64);
            launch_1d(device, op.name(), &MODULE, dtype, "conv_bias_grad", &mut b, (blocks, 256, smem))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_block_has_the_c_layout() {
        use crate::kernels::layout::assert_c_layout;
        assert_c_layout!(
            ConvArgs { p, xs, ys, zs, n0, nc, c, h, w, o, g, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw },
            MODULE.source(),
            "ConvArgs"
        );
    }
}
