//! Matrix products: `Matmul` (also widened: f32 out of f16/bf16), and `Addmm`, which accumulates.

use super::{dims, expect_dtype, expect_self_disjoint, expect_shape, operands, Meta, Operands};
use crate::{BackendError, DType, Op, Result};

/// `Matmul`'s rules for `a (.., m, k) @ b (.., k, n) -> y (.., m, n)`: one dtype, rank >= 2
/// and equal batch dims (a broadcast batch arrives as a zero stride). Returns `[m, k, n]`.
/// Refuses the widened form (an f32 `y` of f16/bf16 inputs, interface 1.13): a kernel that
/// checks with [`matmul_widened`] says it writes that form.
pub fn matmul<T: Meta>(op: &Op, a: &T, b: &T, y: &T) -> Result<[usize; 3]> {
    matmul_dtypes(op, a, b, y, false)?;
    matmul_shapes(op, a, b, y)
}

/// [`matmul`]'s rules, and also the widened form of interface 1.13: `y` f32 when `a` and `b`
/// are f16 or bf16 (the f32 sums stored as they are). Returns `[m, k, n]`.
pub fn matmul_widened<T: Meta>(op: &Op, a: &T, b: &T, y: &T) -> Result<[usize; 3]> {
    matmul_dtypes(op, a, b, y, true)?;
    matmul_shapes(op, a, b, y)
}

fn matmul_dtypes<T: Meta>(op: &Op, a: &T, b: &T, y: &T, widened: bool) -> Result<()> {
    let widened = widened && matches!(a.dtype(), DType::F16 | DType::BF16) && y.dtype() == DType::F32;
    if b.dtype() != a.dtype() || (y.dtype() != a.dtype() && !widened) {
        return Err(BackendError::dtype(format!(
            "{}: operands must share one dtype, got {} x {} -> {}",
            op.name(),
            a.dtype(),
            b.dtype(),
            y.dtype()
        )));
    }
    Ok(())
}

fn matmul_shapes<T: Meta>(op: &Op, a: &T, b: &T, y: &T) -> Result<[usize; 3]> {
    let (sa, sb, sy) = (a.shape(), b.shape(), y.shape());
    let bad = || {
        BackendError::shape(format!(
            "{}: expected a (.., m, k), b (.., k, n) -> y (.., m, n) with equal batch dims, got {sa:?} x {sb:?} -> {sy:?}",
            op.name()
        ))
    };
    let r = sa.len();
    if r < 2 || sb.len() != r || sy.len() != r {
        return Err(bad());
    }
    let (m, k, n) = (sa[r - 2], sa[r - 1], sb[r - 1]);
    if sb[r - 2] != k || sy[r - 2] != m || sy[r - 1] != n || sa[..r - 2] != sy[..r - 2] || sb[..r - 2] != sy[..r - 2] {
        return Err(bad());
    }
    Ok([m, k, n])
}

/// Operands of `Addmm`, `[a (m, k), b (k, n)] -> [y (m, n)]` with `y += a · b`: `a` and `b`
/// of one float dtype, `y` of that dtype or f32 when it is f16 or bf16, `y` not overlapping
/// itself (each position gets one `+=`). Returns `(m, k, n)` with the operands.
pub fn addmm<'a, T: Meta>(op: &Op, inputs: &'a [T], outputs: &'a [T]) -> Result<(Operands<'a, T, 2, 1>, [usize; 3])> {
    let (ins @ [a, b], outs @ [y]) = operands(op, inputs, outputs)?;
    let [m, k] = dims(op, "a (m, k)", a)?;
    let [k2, n] = dims(op, "b (k, n)", b)?;
    if k2 != k {
        return Err(BackendError::shape(format!(
            "{}: a {:?} and b {:?} do not fit (m, k) x (k, n)",
            op.name(),
            a.shape(),
            b.shape()
        )));
    }
    expect_shape(op, "y", y, &[m, n])?;
    if !a.dtype().is_float() {
        return Err(BackendError::unsupported(format!("{}: a is {}, expected a float dtype", op.name(), a.dtype())));
    }
    expect_dtype(op, "b", b, a.dtype())?;
    let widened = matches!(a.dtype(), DType::F16 | DType::BF16) && y.dtype() == DType::F32;
    if !widened {
        expect_dtype(op, "y", y, a.dtype())?;
    }
    expect_self_disjoint(op, y)?;
    Ok(((ins, outs), [m, k, n]))
}

#[cfg(test)]
mod tests {
    use super::super::Fake;
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn matmul_rules() {
        let op = Op::Matmul;
        let f = |dtype, shape: &[usize]| Fake::new(dtype, shape);
        let f32_ = DType::F32;
        let mm = |a: Fake, b: Fake, y: Fake| matmul(&op, &a, &b, &y);
        assert_eq!(mm(f(f32_, &[5, 2, 3]), f(f32_, &[5, 3, 4]), f(f32_, &[5, 2, 4])).unwrap(), [2, 3, 4]);
        let err = mm(f(f32_, &[2, 3]), f(DType::F64, &[3, 4]), f(f32_, &[2, 4])).unwrap_err();
        assert_eq!(err.kind, ErrorKind::DtypeMismatch);
        for (a, b, y) in [([2, 3], [4, 4], [2, 4]), ([2, 3], [3, 4], [4, 2])] {
            assert_eq!(mm(f(f32_, &a), f(f32_, &b), f(f32_, &y)).unwrap_err().kind, ErrorKind::ShapeMismatch);
        }
        // Batch dims must be equal, and rank at least 2.
        assert!(mm(f(f32_, &[5, 2, 3]), f(f32_, &[1, 3, 4]), f(f32_, &[5, 2, 4])).is_err());
        assert!(mm(f(f32_, &[3]), f(f32_, &[3]), f(f32_, &[1])).is_err());
        // The widened form: f32 out of f16/bf16 only, and only where the kernel says it takes it.
        let bf = DType::BF16;
        let (a, b, y) = (f(bf, &[2, 3]), f(bf, &[3, 4]), f(f32_, &[2, 4]));
        assert_eq!(mm(a.clone(), b.clone(), y.clone()).unwrap_err().kind, ErrorKind::DtypeMismatch);
        assert_eq!(matmul_widened(&op, &a, &b, &y).unwrap(), [2, 3, 4]);
        assert!(matmul_widened(&op, &f(f32_, &[2, 3]), &f(f32_, &[3, 4]), &f(DType::F64, &[2, 4])).is_err());
        assert!(matmul_widened(&op, &a, &b, &f(f32_, &[4, 2])).is_err());
        assert!(matmul_widened(&op, &a, &f(DType::F16, &[3, 4]), &y).is_err());
    }

    #[test]
    fn addmm_rules() {
        let op = Op::Addmm;
        let f = |dtype, shape: &[usize]| Fake::new(dtype, shape);
        let (bf, f32_) = (DType::BF16, DType::F32);
        let ok = |a: Fake, b: Fake, y: Fake| addmm(&op, &[a, b], &[y]).map(|(_, mkn)| mkn);
        assert_eq!(ok(f(f32_, &[2, 3]), f(f32_, &[3, 4]), f(f32_, &[2, 4])).unwrap(), [2, 3, 4]);
        // bf16 products into an f32 accumulator, or into bf16.
        assert!(ok(f(bf, &[2, 3]), f(bf, &[3, 4]), f(f32_, &[2, 4])).is_ok());
        assert!(ok(f(bf, &[2, 3]), f(bf, &[3, 4]), f(bf, &[2, 4])).is_ok());
        // But not f32 products into bf16, nor mixed inputs.
        let err = ok(f(f32_, &[2, 3]), f(f32_, &[3, 4]), f(bf, &[2, 4])).unwrap_err();
        assert_eq!(
            (err.kind, err.message.as_str()),
            (ErrorKind::DtypeMismatch, "addmm: y is bfloat16, expected float32")
        );
        assert!(ok(f(bf, &[2, 3]), f(f32_, &[3, 4]), f(f32_, &[2, 4])).is_err());
        let err = ok(f(f32_, &[2, 3]), f(f32_, &[4, 4]), f(f32_, &[2, 4])).unwrap_err();
        assert_eq!(err.message, "addmm: a [2, 3] and b [4, 4] do not fit (m, k) x (k, n)");
        assert!(ok(f(f32_, &[2, 3]), f(f32_, &[3, 4]), f(f32_, &[4, 2])).is_err());
        assert!(ok(f(f32_, &[1, 2, 3]), f(f32_, &[3, 4]), f(f32_, &[2, 4])).is_err());
        assert_eq!(
            ok(f(DType::I64, &[2, 3]), f(DType::I64, &[3, 4]), f(DType::I64, &[2, 4])).unwrap_err().kind,
            ErrorKind::Unsupported
        );
        // A broadcast output would take two `+=` at one address.
        let y = Fake(f32_, vec![2, 4], vec![0, 1]);
        assert!(ok(f(f32_, &[2, 3]), f(f32_, &[3, 4]), y).unwrap_err().message.contains("overlaps itself"));
    }
}
