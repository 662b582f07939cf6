//! Elementwise ops, copies, casts, fill and arange: operand checks here, arithmetic in
//! `kernels/elementwise.cu` and `kernels/cast.cu`. The dtype rules are the CPU backend's.

use super::arity;
use super::Family;
use crate::device::CudaDevice;
use crate::kernels::{set_geometry, Args, KernelName, Operand};
use cudarc::driver::result;
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, TensorDesc, UnaryOp};

kernel_module! {
    /// The elementwise, cast, random and reduction kernels, for every dtype.
    MODULE = "elementwise", for &DType::ALL,
    from "elementwise.cu", "cast.cu", "random.cu", "reduce.cu"
}
inventory::submit! { Family { claims, run } }

/// What this family runs.
fn claims() -> Vec<(OpKind, DType)> {
    let mut claims = domain::elementwise_claims();
    claims.extend(domain::claims(&[Op::Copy, Op::Cast, Op::Fill { value: 0.0 }, Op::Arange { start: 0.0, step: 1.0 }]));
    claims
}

/// Launch kernel `base` (its name in two parts, "unary_" + "exp") over `operands` (output
/// last): the contiguous kernel `base_c` when every
/// operand is dense and `has_contiguous`, in packs of 16 bytes of `dtype` when every address
/// is aligned for them; the strided kernel `base_s` otherwise.
fn launch(
    device: &CudaDevice,
    op: &Op,
    dtype: DType,
    base: [&str; 2],
    operands: &[&Operand],
    mut args: Args,
    has_contiguous: bool,
) -> Result<()> {
    let dense = set_geometry(&mut args, operands);
    if dense && has_contiguous {
        let pack = (16 / dtype.size_in_bytes()) as u64;
        let aligned = operands.iter().all(|o| o.ptr % (o.dtype.size_in_bytes() as u64 * pack) == 0);
        if aligned {
            args.flag |= 2;
        }
        let per_thread = if aligned { pack } else { 1 };
        device.launch(op.name(), dtype, &KernelName::new(&[base[0], base[1], "_c"])?, &mut args, per_thread)
    } else {
        device.launch(op.name(), dtype, &KernelName::new(&[base[0], base[1], "_s"])?, &mut args, 1)
    }
}

/// Set up the broadcast kernel (`binary_*_b`) for `args` as [`set_geometry`] left it, when
/// the output is dense and each input is dense, a broadcast row or column of it, or a
/// scalar: the mode bits and row length, and the pack flag when every operand that is read
/// in packs is aligned for them. Returns elements per thread, or `None` for other layouts.
fn broadcast(args: &mut Args, operands: &[&Operand; 3]) -> Option<u64> {
    // As rows of n_cols: a merged 1-D geometry is a single row.
    let (n_cols, rank) = match args.ndim {
        1 => (args.shape[0], 1),
        2 => (args.shape[1], 2),
        _ => return None,
    };
    let strides = |j: usize| if rank == 1 { (0, args.st[j][0]) } else { (args.st[j][0], args.st[j][1]) };
    if strides(2) != (if rank == 1 { 0 } else { n_cols }, 1) {
        return None;
    }
    let mut modes = [0u32; 2];
    for (j, mode) in modes.iter_mut().enumerate() {
        *mode = match strides(j) {
            (_, 1) if strides(j) == strides(2) => 0,
            (0, 1) => 1,
            (1, 0) => 2,
            (0, 0) => 3,
            _ => return None,
        };
    }
    let pack = (16 / operands[0].dtype.size_in_bytes()) as i64;
    let aligned = (0..3).all(|j| {
        let o = operands[j];
        (j < 2 && modes[j] >= 2) || o.ptr % (o.dtype.size_in_bytes() as u64 * pack as u64) == 0
    });
    let packs = aligned && (rank == 1 || n_cols % pack == 0);
    args.u[0] = n_cols as u64;
    args.flag = (modes[0] << 2 | modes[1] << 4) as i32 | if packs { 2 } else { 0 };
    Some(if packs { pack as u64 } else { 1 })
}

/// Run one op of this family.
pub(super) fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let resolve = |descs: &[TensorDesc]| descs.iter().map(|d| device.operand(d)).collect::<Result<Vec<_>>>();
    match *op {
        Op::Unary(u) => {
            arity(op, 1, 1, inputs, outputs)?;
            let (x, y) = (device.operand(&inputs[0])?, device.operand(&outputs[0])?);
            checks::same_shapes(op, &[&x, &y])?;
            checks::expect_dtype(op, "the output", &y, if u == UnaryOp::IsNan { DType::Bool } else { x.dtype })?;
            launch(device, op, x.dtype, ["unary_", u.name()], &[&x, &y], Args::default(), true)
        }
        Op::Binary(b) => {
            arity(op, 2, 1, inputs, outputs)?;
            let v = resolve(inputs)?;
            let y = device.operand(&outputs[0])?;
            checks::same_shapes(op, &[&v[0], &v[1], &y])?;
            checks::expect_dtype(op, "the second operand", &v[1], v[0].dtype)?;
            checks::expect_dtype(op, "the output", &y, if b.is_predicate() { DType::Bool } else { v[0].dtype })?;
            let base = ["binary_", b.name()];
            let operands = [&v[0], &v[1], &y];
            let mut args = Args::default();
            let dense = set_geometry(&mut args, &operands);
            // `broadcast` leaves `args` as it found them when the layout does not fit it.
            if !dense {
                if let Some(per_thread) = broadcast(&mut args, &operands) {
                    let name = KernelName::new(&[base[0], base[1], "_b"])?;
                    return device.launch(op.name(), v[0].dtype, &name, &mut args, per_thread);
                }
            }
            // `launch` sets the same geometry again (a few integer operations, on the host).
            launch(device, op, v[0].dtype, base, &operands, args, true)
        }
        Op::BinaryScalar { op: b, scalar, scalar_first } => {
            arity(op, 1, 1, inputs, outputs)?;
            let (x, y) = (device.operand(&inputs[0])?, device.operand(&outputs[0])?);
            checks::same_shapes(op, &[&x, &y])?;
            checks::expect_dtype(op, "the output", &y, if b.is_predicate() { DType::Bool } else { x.dtype })?;
            let mut args = Args::default();
            args.s[0] = scalar;
            args.flag = scalar_first as i32;
            launch(device, op, x.dtype, ["binary_scalar_", b.name()], &[&x, &y], args, true)
        }
        Op::Clamp { min, max } => {
            arity(op, 1, 1, inputs, outputs)?;
            let (x, y) = (device.operand(&inputs[0])?, device.operand(&outputs[0])?);
            checks::same_shapes(op, &[&x, &y])?;
            checks::expect_dtype(op, "the output", &y, x.dtype)?;
            let mut args = Args::default();
            args.s[0] = min;
            args.s[1] = max;
            // The contiguous clamp kernel works element by element (no packs).
            launch(device, op, x.dtype, ["clamp", ""], &[&x, &y], args, false)
        }
        Op::Where => {
            arity(op, 3, 1, inputs, outputs)?;
            let v = resolve(inputs)?;
            let y = device.operand(&outputs[0])?;
            checks::same_shapes(op, &[&v[0], &v[1], &v[2], &y])?;
            checks::expect_dtype(op, "the condition", &v[0], DType::Bool)?;
            checks::expect_dtype(op, "the second operand", &v[2], v[1].dtype)?;
            checks::expect_dtype(op, "the output", &y, v[1].dtype)?;
            launch(device, op, v[1].dtype, ["where", ""], &[&v[0], &v[1], &v[2], &y], Args::default(), false)
        }
        Op::Copy | Op::Cast => {
            arity(op, 1, 1, inputs, outputs)?;
            let (x, y) = (device.operand(&inputs[0])?, device.operand(&outputs[0])?);
            checks::same_shapes(op, &[&x, &y])?;
            if *op == Op::Copy && x.dtype != y.dtype {
                return Err(BackendError::dtype(format!("copy: {} to {} needs cast", x.dtype, y.dtype)));
            }
            if x.dtype == y.dtype {
                copy(device, op, &x, &y)
            } else {
                launch(device, op, x.dtype, ["cast_to_", y.dtype.name()], &[&x, &y], Args::default(), true)
            }
        }
        Op::Fill { value } => {
            arity(op, 0, 1, inputs, outputs)?;
            let y = device.operand(&outputs[0])?;
            let mut args = Args::default();
            args.s[0] = value;
            launch(device, op, y.dtype, ["fill", ""], &[&y], args, true)
        }
        Op::Arange { start, step } => {
            arity(op, 0, 1, inputs, outputs)?;
            let y = device.operand(&outputs[0])?;
            if y.shape.len() != 1 {
                return Err(BackendError::shape(format!("arange: output must be rank 1, got {:?}", y.shape)));
            }
            let mut args = Args::default();
            args.s[0] = start;
            args.s[1] = step;
            args.n = y.shape[0] as u64;
            args.p[0] = y.ptr;
            args.st[0][0] = y.strides[0] as i64;
            device.launch("arange", y.dtype, "arange_s", &mut args, 1)
        }
        _ => Err(BackendError::unsupported(format!("cuda: {} is not an elementwise op", op.name()))),
    }
}

/// Same-dtype copy: one driver copy when both views are dense, the strided kernel otherwise.
fn copy(device: &CudaDevice, op: &Op, x: &Operand, y: &Operand) -> Result<()> {
    let mut args = Args::default();
    let dense = set_geometry(&mut args, &[x, y]);
    if args.n == 0 {
        return Ok(());
    }
    if dense {
        let bytes = args.n as usize * x.dtype.size_in_bytes();
        // SAFETY: both ranges were validated against their buffers; ordered on our stream.
        return unsafe { result::memcpy_dtod_async(y.ptr, x.ptr, bytes, device.stream()) }
            .map_err(|e| crate::device::driver_error("copy (cuMemcpyDtoD)", e));
    }
    if let Some(word) = in_words(&mut args, x.dtype.size_in_bytes()) {
        let kernel = match word {
            16 => "copy_w16",
            8 => "copy_w8",
            _ => "copy_w4",
        };
        return device.launch(op.name(), x.dtype, kernel, &mut args, 1);
    }
    if let Some((da, db)) = transposed_plane(&args) {
        // One tile per block: 32x32 elements of 4 bytes or more, 64x64 below.
        let tile = if x.dtype.size_in_bytes() >= 4 { 32 * 32 } else { 64 * 64 };
        args.u = [da as u64, db as u64];
        return device.launch(op.name(), x.dtype, "copy_t", &mut args, tile / 256);
    }
    device.launch(op.name(), x.dtype, "copy_s", &mut args, 1)
}

/// The widest word (16, 8 or 4 bytes, wider than an element of `size` bytes) that a strided
/// copy can move whole, with `args` rescaled from elements to words: the innermost merged dim
/// unit-stride in both views and a whole number of words long, every outer stride a whole
/// number of words and both addresses word-aligned. `None` (args untouched) when no word fits.
fn in_words(args: &mut Args, size: usize) -> Option<usize> {
    let last = (args.ndim as usize).checked_sub(1)?;
    if args.st[0][last] != 1 || args.st[1][last] != 1 {
        return None;
    }
    let word = [16, 8, 4].into_iter().filter(|&w| w > size).find(|&w| {
        let k = (w / size) as i64;
        args.shape[last] % k == 0
            && (0..last).all(|d| args.st[0][d] % k == 0 && args.st[1][d] % k == 0)
            && args.p[0] % w as u64 == 0
            && args.p[1] % w as u64 == 0
    })?;
    let k = (word / size) as i64;
    args.shape[last] /= k;
    for st in &mut args.st[..2] {
        for s in &mut st[..last] {
            *s /= k;
        }
    }
    args.n /= k as u64;
    Some(word)
}

/// The (y, x) unit-stride dims of a merged copy geometry when they differ and both are long
/// enough for tiles to pay: then the copy transposes a plane, and `copy_t` keeps both its
/// reads and its writes coalesced.
fn transposed_plane(args: &Args) -> Option<(usize, usize)> {
    let ndim = args.ndim as usize;
    let unit = |set: usize| (0..ndim).find(|&d| args.st[set][d] == 1 && args.shape[d] >= 16);
    match (unit(1), unit(0)) {
        (Some(da), Some(db)) if da != db => Some((da, db)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Args of a 2-d copy: `rows × cols` elements, x and y with the given row strides.
    fn rows(rows: i64, cols: i64, x_row: i64, y_row: i64, x_ptr: u64, y_ptr: u64) -> Args {
        let mut args = Args { n: (rows * cols) as u64, ndim: 2, p: [x_ptr, y_ptr, 0, 0], ..Args::default() };
        args.shape[..2].copy_from_slice(&[rows, cols]);
        args.st[0][..2].copy_from_slice(&[x_row, 1]);
        args.st[1][..2].copy_from_slice(&[y_row, 1]);
        args
    }

    #[test]
    fn row_strided_copies_move_words() {
        // A q gradient (rows of 896 bf16) into its columns of the stacked (rows, 1152) buffer.
        let mut args = rows(8, 896, 896, 1152, 4096, 8192);
        assert_eq!(in_words(&mut args, 2), Some(16));
        assert_eq!((args.n, &args.shape[..2]), (8 * 112, &[8, 112][..]));
        assert_eq!((&args.st[0][..2], &args.st[1][..2]), (&[112, 1][..], &[144, 1][..]));
        // Rows of 6 bf16 (12 bytes): 4-byte words only.
        let mut args = rows(3, 6, 6, 10, 0, 64);
        assert_eq!(in_words(&mut args, 2), Some(4));
        assert_eq!((args.n, args.shape[1], args.st[1][0]), (9, 3, 5));
    }

    #[test]
    fn misaligned_or_strided_rows_stay_elements() {
        // An address off the word grid: the widest word that fits both, or none.
        let mut args = rows(8, 64, 64, 128, 4096 + 8, 8192);
        assert_eq!(in_words(&mut args, 4), Some(8));
        let mut args = rows(8, 64, 64, 128, 4096 + 2, 8192);
        assert_eq!(in_words(&mut args, 2), None);
        assert_eq!(args.n, 8 * 64, "args are left as they were");
        // The innermost dim is not unit-stride in y.
        let mut args = rows(8, 64, 64, 1, 0, 0);
        args.st[1][..2].copy_from_slice(&[1, 8]);
        assert_eq!(in_words(&mut args, 4), None);
        // 8-byte elements have no wider word than 16 bytes; odd-length rows of f64 none.
        let mut args = rows(4, 3, 3, 5, 0, 0);
        assert_eq!(in_words(&mut args, 8), None);
    }
}
