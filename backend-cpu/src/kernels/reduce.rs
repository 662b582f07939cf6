//! Reductions: sum, mean, sum of squares, max, min, prod, argmax and argmin over the axes where the output
//! (same rank as the input) has size 1 and the input does not (`sdk::checks::reduce`).
//!
//! Every op is a [`Fold`]: a state per output element, stepped with the reduced elements in
//! row-major order of the reduced axes and merged in that order across blocks. One engine
//! drives all of them over three layouts:
//! - **rows** (the reduced elements of one output are contiguous, e.g. the last axis): each
//!   output folds a slice, summed pairwise with eight lanes, so the inner loop vectorizes;
//! - **columns** (the innermost kept axis is contiguous and the reduced axes are outer, e.g.
//!   reducing leading axes): each reduced row adds a contiguous vector into a vector of states;
//! - anything else walks the reduced axes with strides, in runs along the innermost one.
//!
//! Work is split into blocks of at most [`BLOCK`] input elements whose boundaries depend only
//! on the shapes, never on the thread count, and partial states are merged in a fixed order:
//! results are bit-identical whether the blocks ran on one thread or many.
//!
//! Accuracy: sums and means accumulate in [`Accumulate::Acc`] (f64 for f32, f32 for f16/bf16,
//! f64 for f64), pairwise within a block (error growing with log n) and sequentially across
//! blocks of 32K elements; long f32 sums are therefore accurate to about one f32 ulp, and f64
//! sums to a few f64 ulps per doubling of the block count, without Kahan's extra cost.

use super::fused::with_float;
use super::{for_each_run, map_tasks, merge_dims, unsupported, Kernel, SyncPtr, View, PAR_MIN};
use crate::element::{Accumulate, Arith, Element};
use crate::with_dtype;
use genesis_backend_api::sdk::checks;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::{BackendError, DType, Op, OpKind, ReduceOp, Result};

/// Input elements folded by one task into one partial state (or one vector of them).
const BLOCK: usize = 1 << 15;

/// Columns handled by one task of the column layout (its state vector stays in L1/L2).
const COLUMNS: usize = 4096;

fn claims() -> Vec<(OpKind, DType)> {
    let mut kinds: Vec<OpKind> = ReduceOp::ALL.iter().map(|&r| OpKind::reduce(r)).collect();
    kinds.push(Op::ForeachSumSquares.kind());
    domain::kind_claims(&kinds)
}

fn run(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    if *op == Op::ForeachSumSquares {
        return foreach_sum_squares(op, inputs, outputs);
    }
    let Op::Reduce(r) = *op else {
        return Err(unsupported(op, inputs.first().map_or(DType::F32, |v| v.dtype)));
    };
    let ([x], [y]) = (inputs, outputs) else {
        return Err(BackendError::invalid(format!(
            "{}: expected 1 input and 1 output, got {} and {}",
            op.name(),
            inputs.len(),
            outputs.len()
        )));
    };
    if !r.domain().contains(x.dtype) {
        return Err(unsupported(op, x.dtype));
    }
    let reduced = checks::reduce(op, r, x, y)?;
    with_dtype!(x.dtype, T => match r {
        ReduceOp::Sum => reduce::<T, _>(&SumFold { mean: false, squares: false }, x, y, &reduced),
        ReduceOp::Mean => reduce::<T, _>(&SumFold { mean: true, squares: false }, x, y, &reduced),
        ReduceOp::SumSquares => reduce::<T, _>(&SumFold { mean: false, squares: true }, x, y, &reduced),
        ReduceOp::Prod => reduce::<T, _>(&ProdFold, x, y, &reduced),
        ReduceOp::Max => reduce::<T, _>(&ExtremeFold::<true>, x, y, &reduced),
        ReduceOp::Min => reduce::<T, _>(&ExtremeFold::<false>, x, y, &reduced),
        ReduceOp::ArgMax => reduce::<T, _>(&ArgFold::<true>, x, y, &reduced),
        ReduceOp::ArgMin => reduce::<T, _>(&ArgFold::<false>, x, y, &reduced),
    });
    Ok(())
}

/// `ForeachSumSquares`: each input reduced whole by `Reduce(SumSquares)`'s fold into its entry
/// of `y` (a rank-matching view of that one element).
fn foreach_sum_squares(op: &Op, inputs: &[View], outputs: &[View]) -> Result<()> {
    let (xs, y) = checks::foreach_sum_squares(op, inputs, outputs)?;
    let esize = y.dtype.size_in_bytes() as isize;
    for (i, x) in xs.iter().enumerate() {
        let entry = View {
            base: y.base.wrapping_offset(i as isize * y.strides[0] * esize),
            dtype: y.dtype,
            shape: vec![1; x.shape.len()],
            strides: vec![0; x.shape.len()],
        };
        let reduced = checks::reduce(op, ReduceOp::SumSquares, x, &entry)?;
        with_float!(op, x.dtype, T => {
            reduce::<T, _>(&SumFold { mean: false, squares: true }, x, &entry, &reduced);
            Ok(())
        })?;
    }
    Ok(())
}

/// One reduction. `i` is the position of an element in row-major order of the reduced axes
/// (for the arg reductions, which reduce one axis, its index along that axis).
trait Fold<T: Element>: Sync {
    /// Running state.
    type S: Copy + Send + Sync;
    /// Output element.
    type Out: Copy;
    /// The state of an empty fold.
    fn init(&self) -> Self::S;
    /// Fold in element `v` at position `i`.
    fn step(&self, s: Self::S, v: T, i: usize) -> Self::S;
    /// Fold in a contiguous run starting at position `i0` (overridden where lanes help).
    fn slice(&self, mut s: Self::S, xs: &[T], i0: usize) -> Self::S {
        for (j, &v) in xs.iter().enumerate() {
            s = self.step(s, v, i0 + j);
        }
        s
    }
    /// Combine the states of two consecutive ranges, `a` first.
    fn merge(&self, a: Self::S, b: Self::S) -> Self::S;
    /// The output of a state that folded `count` elements.
    fn finish(&self, s: Self::S, count: usize) -> Self::Out;
}

/// Sum, or mean when `mean` (the sum divided by the count in the accumulator type, so an
/// empty mean is 0/0 = NaN), of the elements or, when `squares`, of their squares.
struct SumFold {
    mean: bool,
    squares: bool,
}

/// Pairwise sum of `term(x)` over a slice: eight independent lanes over blocks of 128
/// (vectorizable, and each lane's error grows with 16 terms, not 128), halves combined
/// recursively above that.
#[inline(always)]
fn pairwise<T: Accumulate>(xs: &[T], term: impl Fn(T) -> T::Acc + Copy) -> T::Acc {
    const BASE: usize = 128;
    if xs.len() > BASE {
        // Split on a multiple of 8 so every leaf but the last runs full lanes.
        let mid = (xs.len() / 2).next_multiple_of(8);
        return pairwise(&xs[..mid], term).add(pairwise(&xs[mid..], term));
    }
    let zero = <T::Acc as Arith>::ZERO;
    let mut lanes = [zero; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = l.add(term(v));
        }
    }
    let tail = chunks.remainder().iter().fold(zero, |s, &v| s.add(term(v)));
    let l = lanes;
    let left = l[0].add(l[1]).add(l[2].add(l[3]));
    let right = l[4].add(l[5]).add(l[6].add(l[7]));
    left.add(right).add(tail)
}

/// An element's square in the accumulator type (f16/bf16 squares do not overflow).
fn square<T: Accumulate>(v: T) -> T::Acc {
    let a = v.to_acc();
    a.mul(a)
}

impl<T: Accumulate> Fold<T> for SumFold {
    type S = T::Acc;
    type Out = T;
    fn init(&self) -> T::Acc {
        <T::Acc as Arith>::ZERO
    }
    #[inline(always)]
    fn step(&self, s: T::Acc, v: T, _: usize) -> T::Acc {
        s.add(if self.squares { square(v) } else { v.to_acc() })
    }
    fn slice(&self, s: T::Acc, xs: &[T], _: usize) -> T::Acc {
        s.add(if self.squares { pairwise(xs, square::<T>) } else { pairwise(xs, T::to_acc) })
    }
    fn merge(&self, a: T::Acc, b: T::Acc) -> T::Acc {
        a.add(b)
    }
    fn finish(&self, s: T::Acc, count: usize) -> T {
        if self.mean {
            T::from_acc(s.div(<T::Acc as Arith>::from_f64(count as f64)))
        } else {
            T::from_acc(s)
        }
    }
}

/// Product in the accumulator type (wrapping for integers).
struct ProdFold;

impl<T: Accumulate> Fold<T> for ProdFold {
    type S = T::Acc;
    type Out = T;
    fn init(&self) -> T::Acc {
        <T::Acc as Arith>::ONE
    }
    #[inline(always)]
    fn step(&self, s: T::Acc, v: T, _: usize) -> T::Acc {
        s.mul(v.to_acc())
    }
    fn merge(&self, a: T::Acc, b: T::Acc) -> T::Acc {
        a.mul(b)
    }
    fn finish(&self, s: T::Acc, _: usize) -> T {
        T::from_acc(s)
    }
}

/// `v` replaces `best` for a max (`MAX`) or min: NaN wins and, once in, stays (first NaN).
#[inline(always)]
fn better<C: Arith, const MAX: bool>(v: C, best: C) -> bool {
    !best.is_nan() && (v.is_nan() || if MAX { v > best } else { v < best })
}

/// Max (`MAX`) or min. The start state is ∓∞ converted to the compute type, which is the
/// identity for every dtype (floats: ∓inf; integers saturate to their MIN/MAX; bool's u8 to
/// 0/255); empty reductions are refused before folding, so it never reaches an output.
struct ExtremeFold<const MAX: bool>;

impl<T: Element, const MAX: bool> Fold<T> for ExtremeFold<MAX> {
    type S = T::Compute;
    type Out = T;
    fn init(&self) -> T::Compute {
        <T::Compute as Arith>::from_f64(if MAX { f64::NEG_INFINITY } else { f64::INFINITY })
    }
    #[inline(always)]
    fn step(&self, s: T::Compute, v: T, _: usize) -> T::Compute {
        let v = v.compute();
        if better::<_, MAX>(v, s) {
            v
        } else {
            s
        }
    }
    fn merge(&self, a: T::Compute, b: T::Compute) -> T::Compute {
        if better::<_, MAX>(b, a) {
            b
        } else {
            a
        }
    }
    fn finish(&self, s: T::Compute, _: usize) -> T {
        T::store(s)
    }
}

/// Argmax (`MAX`) or argmin: the value and index of the pick so far, `usize::MAX` before the
/// first element. Strict comparison keeps the first index on ties; the first NaN wins.
struct ArgFold<const MAX: bool>;

const NO_INDEX: usize = usize::MAX;

impl<const MAX: bool> ArgFold<MAX> {
    #[inline(always)]
    fn pick<C: Arith>(s: (C, usize), v: C, i: usize) -> (C, usize) {
        if s.1 == NO_INDEX || better::<_, MAX>(v, s.0) {
            (v, i)
        } else {
            s
        }
    }
}

impl<T: Element, const MAX: bool> Fold<T> for ArgFold<MAX> {
    type S = (T::Compute, usize);
    type Out = i64;
    fn init(&self) -> Self::S {
        (<T::Compute as Arith>::ZERO, NO_INDEX)
    }
    #[inline(always)]
    fn step(&self, s: Self::S, v: T, i: usize) -> Self::S {
        Self::pick(s, v.compute(), i)
    }
    fn merge(&self, a: Self::S, b: Self::S) -> Self::S {
        if b.1 == NO_INDEX {
            a
        } else {
            Self::pick(a, b.0, b.1)
        }
    }
    fn finish(&self, s: Self::S, _: usize) -> i64 {
        if s.1 == NO_INDEX {
            0
        } else {
            s.1 as i64
        }
    }
}

/// The offset of row-major position `pos` of `shape` under `strides`.
fn offset_of(pos: usize, shape: &[usize], strides: &[isize]) -> isize {
    let mut offset = 0;
    for_each_run(shape, [strides], pos, pos + 1, |[o], _, _| offset = o);
    offset
}

/// Geometry of one reduction after splitting and merging dims.
struct Plan<'a, T> {
    x: SyncPtr<T>,
    /// Kept dims (row-major order of the output) and their input strides.
    kept: (&'a [usize], &'a [isize]),
    /// Reduced dims and their input strides.
    red: (&'a [usize], &'a [isize]),
    n_out: usize,
    n_red: usize,
    parallel: bool,
}

fn reduce<T: Element, F: Fold<T>>(fold: &F, x: &View, y: &View, reduced: &[bool]) {
    let n_out = y.numel();
    if n_out == 0 {
        return;
    }
    let (mut ks, mut kx, mut rs, mut rx) = (vec![], vec![], vec![], vec![]);
    for (d, &is_reduced) in reduced.iter().enumerate() {
        let (s, st) = if is_reduced { (&mut rs, &mut rx) } else { (&mut ks, &mut kx) };
        s.push(x.shape[d]);
        st.push(x.strides[d]);
    }
    let n_red: usize = rs.iter().product();
    let (ks, [kx]) = merge_dims(&ks, [&kx]);
    let (rs, [rx]) = merge_dims(&rs, [&rx]);
    let plan = Plan {
        x: SyncPtr(x.base as *mut T),
        kept: (&ks, &kx),
        red: (&rs, &rx),
        n_out,
        n_red,
        parallel: x.numel() >= PAR_MIN,
    };
    let states = if n_red == 0 {
        vec![fold.init(); n_out]
    } else if kx.last() == Some(&1) && rx.last() != Some(&1) {
        columns(fold, &plan)
    } else {
        rows(fold, &plan)
    };
    // SAFETY: `y` is bounds-checked, typed `F::Out` (checked in `run`) and disjoint from `x`;
    // its row-major order is the kept dims' row-major order, which is the order of `states`.
    unsafe {
        for (s, o) in states.iter().zip(y.offsets()) {
            *y.at::<F::Out>(o) = fold.finish(*s, n_red);
        }
    }
}

/// One state per output, each folding its reduced elements (contiguous or strided).
fn rows<T: Element, F: Fold<T>>(fold: &F, p: &Plan<'_, T>) -> Vec<F::S> {
    let ((ks, kx), (rs, rx), xp) = (p.kept, p.red, p.x);
    let contiguous = rs.len() <= 1 && rx.first().is_none_or(|&s| s == 1);
    // Fold reduced positions [r0, r1) of the output whose first element is at `base`.
    // SAFETY: offsets come from the validated geometry of `x`, which no output overlaps, so
    // shared slices over it are sound.
    let fold_range = |base: isize, r0: usize, r1: usize| -> F::S {
        unsafe {
            if contiguous {
                let xs = std::slice::from_raw_parts(xp.get().offset(base + r0 as isize), r1 - r0);
                return fold.slice(fold.init(), xs, r0);
            }
            let (mut s, mut i) = (fold.init(), r0);
            for_each_run(rs, [rx], r0, r1, |[o], [st], len| {
                let ptr = xp.get().offset(base + o);
                if st == 1 {
                    s = fold.slice(s, std::slice::from_raw_parts(ptr, len), i);
                } else {
                    for j in 0..len {
                        s = fold.step(s, *ptr.offset(j as isize * st), i + j);
                    }
                }
                i += len;
            });
            s
        }
    };
    let blocks = p.n_red.div_ceil(BLOCK);
    if blocks <= 1 {
        // Short reductions: a task folds whole outputs, as many as make up a block.
        let per_task = (BLOCK / p.n_red).max(1);
        let parts = map_tasks(p.n_out.div_ceil(per_task), p.parallel, |t| {
            let (o0, o1) = (t * per_task, p.n_out.min((t + 1) * per_task));
            let mut out = Vec::with_capacity(o1 - o0);
            for_each_run(ks, [kx], o0, o1, |[base], [st], len| {
                out.extend((0..len as isize).map(|j| fold_range(base + j * st, 0, p.n_red)));
            });
            out
        });
        parts.concat()
    } else {
        // Long reductions: a task folds one block of one output; blocks merge in order.
        let parts = map_tasks(p.n_out * blocks, p.parallel, |t| {
            let (o, b) = (t / blocks, t % blocks);
            fold_range(offset_of(o, ks, kx), b * BLOCK, p.n_red.min((b + 1) * BLOCK))
        });
        parts.chunks(blocks).map(|c| c[1..].iter().fold(c[0], |a, &b| fold.merge(a, b))).collect()
    }
}

/// The innermost kept dim is contiguous and the reduced dims are not: fold whole rows of it
/// at once into a vector of states (a vectorizable `acc[j] += row[j]` for sums).
fn columns<T: Element, F: Fold<T>>(fold: &F, p: &Plan<'_, T>) -> Vec<F::S> {
    let ((ks, kx), (rs, rx), xp) = (p.kept, p.red, p.x);
    let last = ks.len() - 1;
    let (cols, outer) = (ks[last], (&ks[..last], &kx[..last]));
    let n_outer = p.n_out / cols;
    let chunks = cols.div_ceil(COLUMNS);
    let rows_per_task = (BLOCK / cols.min(COLUMNS)).max(1);
    let blocks = p.n_red.div_ceil(rows_per_task);
    // Task (o, b, c): outer position o, reduced rows of block b, column chunk c.
    let parts = map_tasks(n_outer * blocks * chunks, p.parallel, |t| {
        let (o, b, c) = (t / (blocks * chunks), t / chunks % blocks, t % chunks);
        let c0 = c * COLUMNS;
        let width = cols.min(c0 + COLUMNS) - c0;
        let base = offset_of(o, outer.0, outer.1) + c0 as isize;
        let mut acc = vec![fold.init(); width];
        let (r0, r1) = (b * rows_per_task, p.n_red.min((b + 1) * rows_per_task));
        let mut i = r0;
        for_each_run(rs, [rx], r0, r1, |[ro], [rst], len| {
            for j in 0..len as isize {
                // SAFETY: a row of `width` elements of the contiguous kept dim, inside `x`.
                let row = unsafe { std::slice::from_raw_parts(xp.get().offset(base + ro + j * rst), width) };
                for (s, &v) in acc.iter_mut().zip(row) {
                    *s = fold.step(*s, v, i);
                }
                i += 1;
            }
        });
        acc
    });
    let mut states = Vec::with_capacity(p.n_out);
    for o in 0..n_outer {
        for c in 0..chunks {
            let part = |b: usize| &parts[(o * blocks + b) * chunks + c];
            states.extend((0..part(0).len()).map(|k| (1..blocks).fold(part(0)[k], |s, b| fold.merge(s, part(b)[k]))));
        }
    }
    states
}

inventory::submit! { Kernel { claims, run } }
