//! What the index, softmax and cross-entropy families share: the device-side index bounds
//! check, flat launches over a module's kernels, row geometry for the last-dim ops, and
//! scratch buffers with contiguous copies for layouts the kernels do not take directly.

use super::launch;
use crate::device::{CudaDevice, IndexCheck};
use crate::kernels::{merge_dims, set_geometry, Args, Module, Operand};
use genesis_backend_api::{BufferId, DType, Op, Result};

/// Threads of the flat (one element per thread, grid-stride) launches.
const FLAT_THREADS: u64 = 256;

/// Launch `name` of `module` over `args.n` elements, one per thread, grid-stride.
pub fn launch_flat(
    device: &CudaDevice,
    op: &Op,
    module: &'static Module,
    dtype: DType,
    name: &str,
    args: &mut Args,
) -> Result<()> {
    let blocks = args.n.div_ceil(FLAT_THREADS).min(device.facts.sm_count as u64 * 32) as u32;
    device.launch_with(op.name(), module, dtype, name, args, ((blocks, 1), (FLAT_THREADS as u32, 1), 0), false)
}

/// Queue a check on the device that every i64 in `index` is in `[0, bound)` (or equals
/// `ignore`), with `check_index` of `module` compiled for `dtype`, before the op's own kernels
/// (which write nothing while a check has failed). The host does not wait: a bad index is an
/// `InvalidArgument` error naming this op at the next synchronization.
#[allow(clippy::too_many_arguments)]
pub fn check_indices(
    device: &CudaDevice,
    op: &Op,
    module: &'static Module,
    dtype: DType,
    index: &Operand,
    bound: usize,
    ignore: Option<i64>,
    what: &'static str,
) -> Result<()> {
    if index.numel() == 0 {
        return Ok(());
    }
    let fault = device.module_global(module, dtype, "index_fault")?;
    let check = IndexCheck { fault, op: op.name(), what, bound, ignore };
    device.queue_index_check(check, |number| {
        let mut args = Args::default();
        set_geometry(&mut args, &[index]);
        args.u[0] = bound as u64;
        args.flag = (number as i32) << 1;
        if let Some(ignore) = ignore {
            args.flag |= 1;
            args.u[1] = ignore as u64;
        }
        launch_flat(device, op, module, dtype, "check_index", &mut args)
    })
}

/// A view as the CPU backend's index ops see it: rank 0 behaves as shape `[1]`.
pub fn lift(o: &Operand) -> Operand {
    let mut o = o.clone();
    if o.shape.is_empty() {
        o.shape = vec![1];
        o.strides = vec![0];
    }
    o
}

/// Fill the flat geometry of `args` over `shape` with one stride set per entry of `sets`
/// (merged like any elementwise geometry).
pub fn fill_geometry(args: &mut Args, shape: &[usize], sets: &[&[isize]]) {
    let (merged, strides) = merge_dims(shape, sets);
    args.n = shape.iter().product::<usize>() as u64;
    args.ndim = merged.len() as i32;
    for (d, &n) in merged.iter().enumerate() {
        args.shape[d] = n as i64;
        for (k, s) in strides.iter().enumerate() {
            args.st[k][d] = s[d] as i64;
        }
    }
}

/// One operand of a row op as the kernels see it (rows.cuh): row `r` starts at
/// `ptr + r * row` elements and its columns are `col` apart.
#[derive(Debug, Clone, Copy)]
pub struct RowView {
    /// Address of element zero.
    pub ptr: u64,
    /// Stride between rows, in elements.
    pub row: i64,
    /// Stride between columns (0 for per-row operands such as targets).
    pub col: i64,
    /// Element size in bytes.
    pub size: usize,
    /// Whether the operand has the column dim.
    pub has_cols: bool,
}

impl RowView {
    /// True when every operand with columns can be moved in aligned 16-byte packs.
    pub fn vectorizable(views: &[RowView], rows: usize) -> bool {
        views
            .iter()
            .filter(|v| v.has_cols)
            .all(|v| v.col == 1 && v.ptr % 16 == 0 && (rows <= 1 || (v.row.unsigned_abs() as usize * v.size) % 16 == 0))
    }
}

/// Scratch buffers of one op, returned to the allocator when dropped (stream order makes
/// that safe while kernels using them are still queued).
pub struct Scratch<'a> {
    device: &'a CudaDevice,
    ids: Vec<BufferId>,
}

impl<'a> Scratch<'a> {
    /// No buffers yet.
    pub fn new(device: &'a CudaDevice) -> Self {
        Scratch { device, ids: Vec::new() }
    }

    /// A dense row-major operand of `like`'s dtype and shape (contents undefined).
    pub fn dense(&mut self, like: &Operand) -> Result<Operand> {
        let bytes = (like.numel() * like.dtype.size_in_bytes()).max(1);
        let (id, ptr) = self.device.scratch(bytes)?;
        self.ids.push(id);
        let mut strides = vec![0isize; like.shape.len()];
        let mut step = 1isize;
        for d in (0..like.shape.len()).rev() {
            strides[d] = step;
            step *= like.shape[d].max(1) as isize;
        }
        Ok(Operand { ptr, dtype: like.dtype, shape: like.shape.clone(), strides })
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        for &id in &self.ids {
            let _ = self.device.free_scratch(id);
        }
    }
}

/// Run a row kernel over `operands` (each with a flag: has the column dim; and a flag: is an
/// output), all sharing the leading shape `lead`. When each operand's leading dims merge into
/// one strided dim (the usual case: any contiguous or transposed matrix, any batch of rows),
/// `f` gets the operands themselves. Otherwise (a permuted batch, say) the inputs are copied
/// into dense scratch tensors, `f` writes dense scratch outputs, and those are copied back.
pub fn with_rows(
    device: &CudaDevice,
    op: &Op,
    lead: &[usize],
    operands: &[(&Operand, bool, bool)],
    f: impl FnOnce(&[RowView]) -> Result<()>,
) -> Result<()> {
    let lead_strides = |o: &Operand, cols: bool| -> Vec<isize> {
        let r = if cols { o.strides.len().saturating_sub(1) } else { o.strides.len() };
        o.strides[..r].to_vec()
    };
    let col = |o: &Operand, cols: bool| if cols { o.strides.last().copied().unwrap_or(0) as i64 } else { 0 };
    let sets: Vec<Vec<isize>> = operands.iter().map(|&(o, cols, _)| lead_strides(o, cols)).collect();
    let set_refs: Vec<&[isize]> = sets.iter().map(Vec::as_slice).collect();
    let (merged, strides) = merge_dims(lead, &set_refs);
    if merged.len() <= 1 {
        let views: Vec<RowView> = operands
            .iter()
            .zip(&strides)
            .map(|(&(o, cols, _), s)| RowView {
                ptr: o.ptr,
                row: s.first().copied().unwrap_or(0) as i64,
                col: col(o, cols),
                size: o.dtype.size_in_bytes(),
                has_cols: cols,
            })
            .collect();
        return f(&views);
    }
    // Dense copies: rows of a dense operand with columns are its last dim apart.
    let mut scratch = Scratch::new(device);
    let mut dense = Vec::with_capacity(operands.len());
    for &(o, _, _) in operands {
        let d = scratch.dense(o)?;
        // Outputs too start as the caller's values: an op that writes nothing (a deferred
        // index fault, index_check.cu) then copies back what was there.
        launch::copy(device, op, o, &d)?;
        dense.push(d);
    }
    let views: Vec<RowView> = operands
        .iter()
        .zip(&dense)
        .map(|(&(_, cols, _), d)| RowView {
            ptr: d.ptr,
            row: if cols { d.shape.last().copied().unwrap_or(1) as i64 } else { 1 },
            col: if cols { 1 } else { 0 },
            size: d.dtype.size_in_bytes(),
            has_cols: cols,
        })
        .collect();
    f(&views)?;
    for (&(o, _, is_output), d) in operands.iter().zip(&dense) {
        if is_output {
            launch::copy(device, op, d, o)?;
        }
    }
    Ok(())
}

/// The leading dims and the last dim's size of a row op's shape (rank 0 is one row of one).
pub fn rows_of(shape: &[usize]) -> (&[usize], usize) {
    match shape.split_last() {
        Some((&d, lead)) => (lead, d),
        None => (&[], 1),
    }
}
