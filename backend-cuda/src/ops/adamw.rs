//! Multi-tensor AdamW, in place (`kernels/adamw.cu`), with the CPU backend's checks and
//! update rule: each (grad, param, exp_avg, exp_avg_sq) group runs in its param's compute type
//! (f32 for f16/bf16, f64 for f64), moments stored in the param's dtype or in f32.
//!
//! Dense groups are batched: one launch per (param dtype, moment dtype) per 64 tensors, the
//! tensor table passed in the kernel parameter. A group with a strided operand gets a launch
//! of its own with the strided kernel (no copies).

use super::resolve;
use super::Family;
use crate::device::CudaDevice;
use crate::kernels::{set_geometry, Args, Operand};
use genesis_backend_api::sdk::domain;
use genesis_backend_api::sdk::{checks, expect_disjoint_updates, Extent};
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, TensorDesc};

kernel_module! {
    /// Multi-tensor AdamW, compiled per parameter dtype.
    MODULE = "adamw", for &DType::FLOATS,
    from "adamw.cu"
}
inventory::submit! { Family { claims, run } }

/// Tensors per launch (`MAX_ENTRIES` in adamw.cu: the table fills most of the 4 KiB of kernel
/// parameters).
const MAX_ENTRIES: usize = 64;

/// Elements per chunk (`CHUNK` in adamw.cu); a block updates one chunk at a time.
const CHUNK: u64 = 4096;

/// Mirror of `struct Entry` in adamw.cu (a test compares the layouts).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    g: u64,
    p: u64,
    m: u64,
    v: u64,
    n: u64,
    chunk0: u64,
    aligned: u64,
}

/// Mirror of `struct TableArgs` in adamw.cu (a test compares the layouts).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct TableArgs {
    h: [f64; 8],
    /// The gradient scale's address, 0 for none.
    scale: u64,
    count: u64,
    chunks: u64,
    e: [Entry; MAX_ENTRIES],
}

/// Mirror of `struct StridedArgs` in adamw.cu (a test compares the layouts): one strided
/// group's geometry and the gradient scale's address (0 for none).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct StridedArgs {
    a: Args,
    scale: u64,
}

/// What this family runs.
fn claims() -> Vec<(OpKind, DType)> {
    domain::claims(&[Op::AdamW { lr: 0.0, beta1: 0.0, beta2: 0.0, eps: 0.0, weight_decay: 0.0, step: 1 }])
}

/// Run one AdamW step.
fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let Op::AdamW { lr, beta1, beta2, eps, weight_decay, step } = *op else {
        return Err(BackendError::unsupported(format!("cuda: {} is not adamw", op.name())));
    };
    let (ins, outs) = resolve(device, inputs, outputs)?;
    checks::adamw(op, &ins, &outs, |dtype| {
        BackendError::unsupported(format!("cuda: adamw is not implemented for {dtype}"))
    })?;
    let (grads, scale) = checks::adamw_grad_scale(&ins, &outs);
    // The scale (checked: one f32 element) is read by the kernels from device memory.
    let scale = scale.map_or(0, |s| s.ptr);
    let mut outs = outs.iter().cloned();
    let groups: Vec<[Operand; 4]> =
        grads.iter().cloned().filter_map(|g| Some([g, outs.next()?, outs.next()?, outs.next()?])).collect();
    check_disjoint(op, inputs, outputs)?;
    // Bias corrections in f64: early on, 1 - β2^step is a small difference of numbers near 1,
    // which f32 would get wrong in the third digit.
    let bc1 = 1.0 - beta1.powf(step as f64);
    let bc2 = 1.0 - beta2.powf(step as f64);
    let (decay, step_size, bc2_sqrt) = (1.0 - lr * weight_decay, lr / bc1, bc2.sqrt());
    let h = [decay, beta1, beta2, 1.0 - beta1, 1.0 - beta2, step_size, bc2_sqrt, eps];

    // Dense groups by (param dtype, moment dtype); strided groups one by one.
    let mut batches: Vec<((DType, DType), Vec<Entry>)> = Vec::new();
    for [g, p, m, v] in &groups {
        let n = g.numel() as u64;
        if n == 0 {
            continue;
        }
        let key = (p.dtype, m.dtype);
        let kernel = if m.dtype == p.dtype { "adamw_same" } else { "adamw_f32" };
        let mut args = Args::default();
        if !set_geometry(&mut args, &[g, p, m, v]) {
            args.s = [decay, beta1, beta2, eps];
            args.u = [step_size.to_bits(), bc2_sqrt.to_bits()];
            let grid = n.div_ceil(256).min(device.facts.sm_count as u64 * 16) as u32;
            let mut strided = StridedArgs { a: args, scale };
            // The four operands were validated against their buffers with the geometry above.
            let shape = ((grid, 1), (256, 1), 0);
            device.launch_with("adamw", &MODULE, p.dtype, &format!("{kernel}_s"), &mut strided, shape, false)?;
            continue;
        }
        let (ps, ms) = (p.dtype.size_in_bytes() as u64 * 4, m.dtype.size_in_bytes() as u64 * 4);
        let aligned = g.ptr % ps == 0 && p.ptr % ps == 0 && m.ptr % ms == 0 && v.ptr % ms == 0;
        let entry = Entry { g: g.ptr, p: p.ptr, m: m.ptr, v: v.ptr, n, chunk0: 0, aligned: aligned as u64 };
        match batches.iter_mut().find(|(k, _)| *k == key) {
            Some((_, list)) => list.push(entry),
            None => batches.push((key, vec![entry])),
        }
    }
    for ((pd, md), list) in batches {
        let kernel = if md == pd { "adamw_same" } else { "adamw_f32" };
        for batch in list.chunks(MAX_ENTRIES) {
            let mut a =
                TableArgs { h, scale, count: batch.len() as u64, chunks: 0, e: [Entry::default(); MAX_ENTRIES] };
            for (slot, e) in a.e.iter_mut().zip(batch) {
                *slot = Entry { chunk0: a.chunks, ..*e };
                a.chunks += e.n.div_ceil(CHUNK);
            }
            let grid = a.chunks.min(device.facts.sm_count as u64 * 16) as u32;
            // Each entry's four dense operands of `n` elements were validated against their buffers.
            device.launch_with("adamw", &MODULE, pd, kernel, &mut a, ((grid, 1), (256, 1), 0), false)?;
        }
    }
    Ok(())
}

/// Outputs are updated in place: none may share a byte with another output or with a grad.
fn check_disjoint(op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    for (i, v) in outputs.iter().enumerate() {
        if v.numel() > 1 && v.shape().iter().zip(v.strides()).any(|(&n, s)| n > 1 && s == 0) {
            return Err(BackendError::invalid(format!(
                "adamw: output {i} has a zero stride (it would overlap itself)"
            )));
        }
    }
    let extents = |list: &[TensorDesc]| -> Result<Vec<Option<Extent>>> {
        list.iter().map(|v| Ok(v.byte_extent()?.map(|(s, e)| (v.buffer.0, s, e)))).collect()
    };
    expect_disjoint_updates(op, "grad", &extents(inputs)?, &extents(outputs)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    impl crate::kernels::layout::CField for Entry {
        fn scalar() -> (char, usize) {
            ('s', std::mem::size_of::<Entry>())
        }
    }

    impl crate::kernels::layout::CField for Args {
        fn scalar() -> (char, usize) {
            ('s', std::mem::size_of::<Args>())
        }
    }

    #[test]
    fn the_argument_blocks_have_the_c_layout() {
        use crate::kernels::layout::assert_c_layout;
        assert_c_layout!(Entry { g, p, m, v, n, chunk0, aligned }, MODULE.source(), "Entry");
        assert_c_layout!(TableArgs { h, scale, count, chunks, e }, MODULE.source(), "TableArgs");
        assert_c_layout!(StridedArgs { a, scale }, MODULE.source(), "StridedArgs");
    }
}
