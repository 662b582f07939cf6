//! Rotary position embedding, forward and inverse (`kernels/rotary.cu`), with the SDK's
//! checks: x `(b, h, s, d)` with `d` even, cos and sin `(s, d/2)`, all of x's dtype. And the
//! decode step's `RotaryKvWrite`: q and k rotated and k and v written into the caches at a
//! position held on the device, in one launch that checks the position itself.
//!
//! Strided operands are handled in the kernels, so no copies are made: operands whose rows are
//! unit-stride and 16-byte aligned (dense ones, and the head views of a stacked q/k/v
//! projection) take a vectorized kernel with per-operand row strides, any others a kernel
//! with per-operand strides over the merged `(b, h, s, d/2)` pair space.

use super::resolve;
use super::Family;
use crate::device::{CudaDevice, IndexCheck};
use crate::kernels::{merge_dims, Args, Operand};
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, TensorDesc};

kernel_module! {
    /// Rotary position embedding, and its fused cache write (which records a bad position
    /// in the module's `index_fault`, hence `index_check.cu`).
    MODULE = "rotary", for &DType::FLOATS,
    from "index_check.cu", "rotary.cu"
}
inventory::submit! { Family { claims, run } }

/// Mirror of `struct KvWriteArgs` in rotary.cu (a test compares the layouts).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct KvWriteArgs {
    /// q, k, v, cos, sin, position, q_out, k_cache, v_cache.
    p: [u64; 9],
    /// Strides of each operand of `p` over (b, heads, positions, last dim).
    st: [[i64; 4]; 9],
    b: u64,
    hq: u64,
    hk: u64,
    s: u64,
    t: u64,
    half: u64,
    /// q pairs, k pairs, v elements.
    nq: u64,
    nk: u64,
    nv: u64,
    /// The index check's number, recorded on a bad position.
    number: u64,
}

/// Threads per block of `rotary_kv_write`: small blocks, so that a decode step's few thousand
/// items still spread over several SMs.
const KV_WRITE_THREADS: u64 = 128;

/// What this family runs.
fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[Op::Rotary { inverse: false }, Op::RotaryKvWrite])
}

/// Run the rotation, or the fused cache write.
fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let inverse = match *op {
        Op::Rotary { inverse } => inverse,
        Op::RotaryKvWrite => return kv_write(device, op, inputs, outputs),
        _ => return Err(BackendError::unsupported(format!("cuda: {} is not rotary", op.name()))),
    };
    let (ins, outs) = resolve(device, inputs, outputs)?;
    let ([b, h, s, d], [x, cos, sin], [y]) = checks::rotary(op, &ins, &outs)?;
    let half = d / 2;
    let n = b * h * s * half;
    if n == 0 {
        return Ok(());
    }
    let mut args = Args { p: [x.ptr, y.ptr, cos.ptr, sin.ptr], n: n as u64, flag: inverse as i32, ..Args::default() };
    let operands = [x, y, cos, sin];
    let (kernel, per_thread) = match row_geometry(&operands, [b, h, s], half) {
        Some((shape, strides)) => {
            args.ndim = 3;
            args.shape[..3].copy_from_slice(&shape);
            for (st, rows) in args.st.iter_mut().zip(&strides) {
                st[..3].copy_from_slice(rows);
            }
            args.u[0] = half as u64;
            ("rotary_v", (16 / x.dtype.size_in_bytes()) as u64)
        }
        None => {
            // The pair space (b, h, s, d/2): cos and sin broadcast over b and h. The second
            // half of a row is d/2 steps along the last dim.
            let pair_shape = [b, h, s, half];
            let (xs, ys, cs, ss) = (&x.strides, &y.strides, &cos.strides, &sin.strides);
            let lists = [xs.to_vec(), ys.to_vec(), vec![0, 0, cs[0], cs[1]], vec![0, 0, ss[0], ss[1]]];
            let refs: Vec<&[isize]> = lists.iter().map(|l| l.as_slice()).collect();
            let (merged, merged_st) = merge_dims(&pair_shape, &refs);
            args.ndim = merged.len() as i32;
            for (dd, &m) in merged.iter().enumerate() {
                args.shape[dd] = m as i64;
                for (j, st) in merged_st.iter().enumerate() {
                    args.st[j][dd] = st[dd] as i64;
                }
            }
            args.u = [(half as isize * xs[3]) as u64, (half as isize * ys[3]) as u64];
            ("rotary_s", 1)
        }
    };
    let threads = 256u64;
    let wanted = (n as u64).div_ceil(threads * per_thread);
    let grid = wanted.min(device.facts.sm_count as u64 * 32).max(1) as u32;
    // Every operand was validated against its buffer with the shapes and strides in `args`.
    device.launch_with("rotary", &MODULE, x.dtype, kernel, &mut args, ((grid, 1), (threads as u32, 1), 0), false)
}

/// The geometry of the vectorized kernel `rotary_v`, when it applies: every row (of x, y, cos
/// and sin) unit-stride, `half` a whole number of 16-byte packs, every address and row stride
/// pack-aligned, and at most 2^32 packs. Returns the row dims (b, h, s) ordered as they lie in
/// x's memory, outermost first (so neighbouring threads read neighbouring rows), and the row
/// strides of x, y, cos and sin over them (cos and sin broadcast over b and h).
fn row_geometry(operands: &[&Operand; 4], dims: [usize; 3], half: usize) -> Option<([i64; 3], [[i64; 3]; 4])> {
    let pack = 16 / operands[0].dtype.size_in_bytes();
    let rows = |o: &Operand| -> [i64; 3] {
        match o.strides[..] {
            [s0, s1, s2, _] => [s0 as i64, s1 as i64, s2 as i64],
            [s2, _] => [0, 0, s2 as i64],
            _ => [0; 3],
        }
    };
    let fits = operands
        .iter()
        .all(|o| o.strides.last() == Some(&1) && o.ptr % 16 == 0 && rows(o).iter().all(|&st| st % pack as i64 == 0));
    if !fits || half % pack != 0 || dims.iter().product::<usize>() * half / pack > u32::MAX as usize {
        return None;
    }
    // x's row dims by decreasing stride; a stable sort keeps (b, h, s) among equal strides.
    let x_rows = rows(operands[0]);
    let mut order = [0, 1, 2];
    order.sort_by_key(|&d| std::cmp::Reverse(x_rows[d]));
    let shape = order.map(|d| dims[d] as i64);
    let strides = [0, 1, 2, 3].map(|j| {
        let r = rows(operands[j]);
        order.map(|d| r[d])
    });
    Some((shape, strides))
}

/// The strides of a rank-4 operand as the kernel takes them; cos and sin `(s, d/2)` get zero
/// strides over (b, heads).
fn strides4(o: &Operand) -> [i64; 4] {
    match o.strides[..] {
        [s0, s1, s2, s3] => [s0 as i64, s1 as i64, s2 as i64, s3 as i64],
        [s2, s3] => [0, 0, s2 as i64, s3 as i64],
        _ => [0; 4],
    }
}

/// `RotaryKvWrite`: one launch over the q pairs, the k pairs and the v elements. The position
/// is never read on the host (the step runs inside captured graphs): the kernel checks it and
/// records a bad one as this launch's index check, reported at the next synchronization.
fn kv_write(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let (ins, outs) = resolve(device, inputs, outputs)?;
    let (dims, [q, k, v, cos, sin, position], [q_out, k_cache, v_cache]) = checks::rotary_kv_write(op, &ins, &outs)?;
    let dtype = q.dtype;
    let half = dims.d / 2;
    let (nq, nk, nv) =
        (dims.b * dims.hq * dims.s * half, dims.b * dims.hk * dims.s * half, dims.b * dims.hk * dims.s * dims.d);
    let operands = [q, k, v, cos, sin, position, q_out, k_cache, v_cache];
    let mut args = KvWriteArgs {
        b: dims.b as u64,
        hq: dims.hq as u64,
        hk: dims.hk as u64,
        s: dims.s as u64,
        t: dims.t as u64,
        half: half as u64,
        nq: nq as u64,
        nk: nk as u64,
        nv: nv as u64,
        ..KvWriteArgs::default()
    };
    for (j, o) in operands.iter().enumerate() {
        args.p[j] = o.ptr;
        if j != 5 {
            args.st[j] = strides4(o);
        }
    }
    // At least one block even with nothing to write: the position is checked all the same.
    let total = (nq + nk + nv) as u64;
    let grid = total.div_ceil(KV_WRITE_THREADS).min(device.facts.sm_count as u64 * 32).max(1) as u32;
    let fault = device.module_global(&MODULE, dtype, "index_fault")?;
    let check = IndexCheck { fault, op: op.name(), what: "position", bound: dims.positions_free(), ignore: None };
    device.queue_index_check(check, |number| {
        args.number = number as u64;
        // Every operand was validated against its buffer with the shapes and strides in `args`.
        let shape = ((grid, 1), (KV_WRITE_THREADS as u32, 1), 0);
        device.launch_with(op.name(), &MODULE, dtype, "rotary_kv_write", &mut args, shape, true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_block_has_the_c_layout() {
        use crate::kernels::layout::assert_c_layout;
        assert_c_layout!(
            KvWriteArgs { p, st, b, hq, hk, s, t, half, nq, nk, nv, number },
            MODULE.source(),
            "KvWriteArgs"
        );
    }

    #[test]
    fn head_views_of_a_stacked_projection_take_the_vectorized_kernel() {
        let o = |ptr: u64, shape: Vec<usize>, strides: Vec<isize>| Operand { ptr, dtype: DType::BF16, shape, strides };
        // q (8, 14, 1024, 64) as a view of the (8, 1024, 1152) q/k/v output; y in the same
        // memory order; cos and sin (1024, 32).
        let x = o(1 << 20, vec![8, 14, 1024, 64], vec![1024 * 1152, 64, 1152, 1]);
        let y = o(1 << 30, vec![8, 14, 1024, 64], vec![1024 * 896, 64, 896, 1]);
        let (cos, sin) = (o(4096, vec![1024, 32], vec![32, 1]), o(8192, vec![1024, 32], vec![32, 1]));
        let (shape, strides) = row_geometry(&[&x, &y, &cos, &sin], [8, 14, 1024], 32).unwrap();
        // Rows in x's memory order: batch, position, head.
        assert_eq!(shape, [8, 1024, 14]);
        assert_eq!(strides[0], [1024 * 1152, 1152, 64]);
        assert_eq!(strides[1], [1024 * 896, 896, 64]);
        assert_eq!(strides[2], [0, 32, 0]);
        // A row stride off the 16-byte grid, or a misaligned address: the strided kernel.
        let odd = o(1 << 30, vec![8, 14, 1024, 64], vec![1024 * 900, 60, 900, 1]);
        assert!(row_geometry(&[&x, &odd, &cos, &sin], [8, 14, 1024], 32).is_none());
        let shifted = o((1 << 30) + 2, vec![8, 14, 1024, 64], vec![1024 * 896, 64, 896, 1]);
        assert!(row_geometry(&[&x, &shifted, &cos, &sin], [8, 14, 1024], 32).is_none());
    }

    #[test]
    fn cos_and_sin_are_broadcast_over_batch_and_heads() {
        let o = |strides: Vec<isize>| Operand { ptr: 0, dtype: DType::F32, shape: vec![1; strides.len()], strides };
        assert_eq!(strides4(&o(vec![64, 1])), [0, 0, 64, 1]);
        assert_eq!(strides4(&o(vec![896, 64, 896, 1])), [896, 64, 896, 1]);
    }
}
