//! Elementwise ops with broadcasting and type promotion: unary math and activations,
//! arithmetic, comparisons, where, clamp, masked_fill, and their in-place forms.

use super::{common_device, exec_views, promote_types, promote_with_scalar, sum_to};
use crate::autograd::{is_grad_enabled, record1, record1_reading_output, BackwardFn, Saved, SavedOutput};
use crate::error::{Error, Result};
use crate::tensor::layout::{broadcast_or_err, coalesce};
use crate::tensor::{Layout, Tensor};
use genesis_backend_api::{BinaryOp, DType, Op, UnaryOp};

/// A scalar operand of a tensor op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A floating-point scalar.
    Float(f64),
    /// An integer scalar.
    Int(i64),
    /// A boolean scalar.
    Bool(bool),
}

impl Scalar {
    fn value(self) -> f64 {
        match self {
            Scalar::Float(v) => v,
            Scalar::Int(v) => v as f64,
            Scalar::Bool(v) => v as u8 as f64,
        }
    }
}

macro_rules! scalar_from {
    ($($t:ty => $variant:ident as $as:ty),*) => {$(
        impl From<$t> for Scalar {
            fn from(v: $t) -> Scalar { Scalar::$variant(v as $as) }
        }
    )*};
}
scalar_from!(f64 => Float as f64, f32 => Float as f64, i64 => Int as i64, i32 => Int as i64, usize => Int as i64);

impl From<bool> for Scalar {
    fn from(v: bool) -> Scalar {
        Scalar::Bool(v)
    }
}

// ---- raw (non-recording) kernels ----

/// `op(x)` into a new tensor of `out_dtype`.
fn unary_raw(op: UnaryOp, x: &Tensor, out_dtype: DType) -> Result<Tensor> {
    let out = Tensor::empty(x.shape(), out_dtype, x.device())?;
    let l = coalesce(&[x.layout().clone(), out.layout().clone()]);
    exec_views(&Op::Unary(op), &[(x, &l[0])], &[(&out, &l[1])])?;
    Ok(out)
}

/// `op(a, b)` with broadcasting; `a` and `b` already share a dtype.
fn binary_raw(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let name = op.name();
    let device = common_device(name, &[a, b])?;
    let shape = broadcast_or_err(name, a.shape(), b.shape())?;
    let out_dtype = if op.is_predicate() { DType::Bool } else { a.dtype() };
    let out = Tensor::empty(&shape, out_dtype, device)?;
    let (la, lb) = (broadcast(a, &shape)?, broadcast(b, &shape)?);
    let l = coalesce(&[la, lb, out.layout().clone()]);
    exec_views(&Op::Binary(op), &[(a, &l[0]), (b, &l[1])], &[(&out, &l[2])])?;
    Ok(out)
}

fn scalar_raw(op: BinaryOp, a: &Tensor, scalar: f64, scalar_first: bool) -> Result<Tensor> {
    let out_dtype = if op.is_predicate() { DType::Bool } else { a.dtype() };
    let out = Tensor::empty(a.shape(), out_dtype, a.device())?;
    let l = coalesce(&[a.layout().clone(), out.layout().clone()]);
    exec_views(&Op::BinaryScalar { op, scalar, scalar_first }, &[(a, &l[0])], &[(&out, &l[1])])?;
    Ok(out)
}

fn broadcast(t: &Tensor, shape: &[usize]) -> Result<Layout> {
    t.layout()
        .broadcast_to(shape)
        .ok_or_else(|| super::shape_err(format!("cannot broadcast shape {:?} to {shape:?}", t.shape())))
}

/// Cast both operands to their promoted dtype (differentiably).
fn promote_pair(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let dtype = promote_types(a.dtype(), b.dtype());
    Ok((a.to_dtype(dtype)?, b.to_dtype(dtype)?))
}

fn float_input(x: &Tensor) -> Result<Tensor> {
    if x.dtype().is_float() {
        Ok(x.clone())
    } else {
        x.to_dtype(DType::F32)
    }
}

fn opt(g: &[Option<Tensor>]) -> Result<&Tensor> {
    g[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))
}

impl Tensor {
    // ---- unary ----

    fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        let float_only = !matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Square | UnaryOp::Sign);
        let x = if float_only { float_input(self)? } else { self.clone() };
        let y = unary_raw(op, &x, x.dtype())?;
        if !x.requires_grad() || !is_grad_enabled() {
            return Ok(y);
        }
        let sx = Saved::new(&x);
        let backward = move |sy: SavedOutput| -> BackwardFn {
            Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
                let g = opt(g)?;
                let x = sx.get(op.name())?;
                let y = || sy.get(op.name());
                let dx = match op {
                    UnaryOp::Neg => g.neg()?,
                    UnaryOp::Abs => g.mul(&x.sign()?)?,
                    UnaryOp::Exp => g.mul(&y()?)?,
                    UnaryOp::Log => g.div(x)?,
                    UnaryOp::Sqrt => g.div(&y()?.mul_scalar(2.0)?)?,
                    UnaryOp::Rsqrt => g.mul(&y()?.pow_scalar(3.0)?)?.mul_scalar(-0.5)?,
                    UnaryOp::Sin => g.mul(&x.cos()?)?,
                    UnaryOp::Cos => g.mul(&x.sin()?)?.neg()?,
                    UnaryOp::Tanh => g.mul(&y()?.square()?.rsub_scalar(1.0)?)?,
                    UnaryOp::Sigmoid => g.mul(&y()?.mul(&y()?.rsub_scalar(1.0)?)?)?,
                    UnaryOp::Relu => g.mul(&x.gt_scalar(0.0)?.to_dtype(g.dtype())?)?,
                    UnaryOp::Gelu => {
                        // d/dx x·Φ(x) = Φ(x) + x·φ(x)
                        let cdf =
                            x.mul_scalar(std::f64::consts::FRAC_1_SQRT_2)?.erf()?.add_scalar(1.0)?.mul_scalar(0.5)?;
                        let pdf = x
                            .square()?
                            .mul_scalar(-0.5)?
                            .exp()?
                            .mul_scalar(1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
                        g.mul(&cdf.add(&x.mul(&pdf)?)?)?
                    }
                    UnaryOp::GeluTanh => {
                        let k = (2.0 / std::f64::consts::PI).sqrt();
                        let inner = x.add(&x.pow_scalar(3.0)?.mul_scalar(0.044715)?)?.mul_scalar(k)?;
                        let t = inner.tanh()?;
                        let dinner = x.square()?.mul_scalar(3.0 * 0.044715)?.add_scalar(1.0)?.mul_scalar(k)?;
                        let d = t
                            .add_scalar(1.0)?
                            .mul_scalar(0.5)?
                            .add(&x.mul(&t.square()?.rsub_scalar(1.0)?)?.mul(&dinner)?.mul_scalar(0.5)?)?;
                        g.mul(&d)?
                    }
                    UnaryOp::Silu => {
                        let s = x.sigmoid()?;
                        g.mul(&s.mul(&x.mul(&s.rsub_scalar(1.0)?)?.add_scalar(1.0)?)?)?
                    }
                    UnaryOp::Recip => g.mul(&y()?.square()?)?.neg()?,
                    UnaryOp::Square => g.mul(x)?.mul_scalar(2.0)?,
                    UnaryOp::Erf => g.mul(&x.square()?.neg()?.exp()?.mul_scalar(std::f64::consts::FRAC_2_SQRT_PI)?)?,
                    UnaryOp::Log1p => g.div(&x.add_scalar(1.0)?)?,
                    UnaryOp::Expm1 => g.mul(&y()?.add_scalar(1.0)?)?,
                    UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Not | UnaryOp::IsNan => {
                        g.zeros_like()?
                    }
                };
                Ok(vec![Some(dx)])
            })
        };
        Ok(record1_reading_output(op.name(), &[&x], y, backward))
    }

    /// `-x`
    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg)
    }
    /// `|x|`
    pub fn abs(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Abs)
    }
    /// `e^x`
    pub fn exp(&self) -> Result<Tensor> {
        crate::amp::cast_for(crate::amp::CastPolicy::Float32, self)?.unary(UnaryOp::Exp)
    }
    /// Natural logarithm.
    pub fn log(&self) -> Result<Tensor> {
        crate::amp::cast_for(crate::amp::CastPolicy::Float32, self)?.unary(UnaryOp::Log)
    }
    /// Square root.
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt)
    }
    /// `1/sqrt(x)`
    pub fn rsqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Rsqrt)
    }
    /// Sine.
    pub fn sin(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sin)
    }
    /// Cosine.
    pub fn cos(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Cos)
    }
    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh)
    }
    /// Logistic sigmoid.
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid)
    }
    /// `max(x, 0)`
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu)
    }
    /// GELU with the exact erf.
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Gelu)
    }
    /// GELU with the tanh approximation.
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::GeluTanh)
    }
    /// `x*sigmoid(x)`
    pub fn silu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Silu)
    }
    /// `1/x`
    pub fn reciprocal(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Recip)
    }
    /// `x*x`
    pub fn square(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Square)
    }
    /// -1, 0 or 1.
    pub fn sign(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sign)
    }
    /// Round toward -inf.
    pub fn floor(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Floor)
    }
    /// Round toward +inf.
    pub fn ceil(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Ceil)
    }
    /// Round half to even.
    pub fn round(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Round)
    }
    /// Error function.
    pub fn erf(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Erf)
    }
    /// `ln(1+x)`
    pub fn log1p(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Log1p)
    }
    /// `e^x - 1`
    pub fn expm1(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Expm1)
    }
    /// NaN test (bool).
    pub fn isnan(&self) -> Result<Tensor> {
        unary_raw(UnaryOp::IsNan, self, DType::Bool)
    }
    /// Logical not (bool).
    pub fn logical_not(&self) -> Result<Tensor> {
        unary_raw(UnaryOp::Not, &self.to_dtype(DType::Bool)?, DType::Bool)
    }

    // ---- binary ----

    fn binary(&self, other: &Tensor, op: BinaryOp) -> Result<Tensor> {
        let (a, b) = promote_pair(self, other)?;
        if op.is_predicate() {
            return binary_raw(op, &a, &b);
        }
        let y = binary_raw(op, &a, &b)?;
        if !(a.requires_grad() || b.requires_grad()) || !is_grad_enabled() {
            return Ok(y);
        }
        let (sa, sb) = (Saved::new(&a), Saved::new(&b));
        let (shape_a, shape_b) = (a.shape().to_vec(), b.shape().to_vec());
        let backward = move |sy: SavedOutput| -> BackwardFn {
            Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
                let g = opt(g)?;
                let name = op.name();
                let (da, db) = match op {
                    BinaryOp::Add => (g.clone(), g.clone()),
                    BinaryOp::Sub => (g.clone(), g.neg()?),
                    BinaryOp::Mul => (g.mul(sb.get(name)?)?, g.mul(sa.get(name)?)?),
                    BinaryOp::Div => {
                        let b = sb.get(name)?;
                        let da = g.div(b)?;
                        (da.clone(), da.mul(&sy.get(name)?)?.neg()?)
                    }
                    BinaryOp::Pow => {
                        let (a, b, y) = (sa.get(name)?, sb.get(name)?, &sy.get(name)?);
                        let da = g.mul(&b.mul(&a.pow(&b.sub_scalar(1.0)?)?)?)?;
                        // d/db a^b = a^b ln a; define it as 0 where a == 0 (as PyTorch does).
                        let ln_a = a.log()?.masked_fill(&a.eq_scalar(0.0)?, 0.0)?;
                        (da, g.mul(&y.mul(&ln_a)?)?)
                    }
                    BinaryOp::Maximum | BinaryOp::Minimum => {
                        let (a, b) = (sa.get(name)?, sb.get(name)?);
                        let wins = if op == BinaryOp::Maximum { a.gt(b)? } else { a.lt(b)? };
                        // Ties share the gradient equally, as PyTorch does.
                        let share = wins.to_dtype(g.dtype())?.add(&a.eq(b)?.to_dtype(g.dtype())?.mul_scalar(0.5)?)?;
                        (g.mul(&share)?, g.mul(&share.rsub_scalar(1.0)?)?)
                    }
                    BinaryOp::Remainder => {
                        let (a, b) = (sa.get(name)?, sb.get(name)?);
                        (g.clone(), g.mul(&a.div(b)?.floor()?)?.neg()?)
                    }
                    _ => return Err(Error::invalid(format!("{name} has no gradient"))),
                };
                Ok(vec![Some(sum_to(&da, &shape_a)?), Some(sum_to(&db, &shape_b)?)])
            })
        };
        Ok(record1_reading_output(op.name(), &[&a, &b], y, backward))
    }

    fn binary_scalar(&self, scalar: Scalar, op: BinaryOp, scalar_first: bool) -> Result<Tensor> {
        let dtype =
            promote_with_scalar(self.dtype(), matches!(scalar, Scalar::Float(_)), matches!(scalar, Scalar::Bool(_)));
        let a = self.to_dtype(dtype)?;
        let s = scalar.value();
        let y = scalar_raw(op, &a, s, scalar_first)?;
        if op.is_predicate() || !a.requires_grad() || !is_grad_enabled() {
            return Ok(y);
        }
        let sa = Saved::new(&a);
        let backward = move |sy: SavedOutput| -> BackwardFn {
            Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
                let g = opt(g)?;
                let name = op.name();
                let da = match (op, scalar_first) {
                    (BinaryOp::Add, _) => g.clone(),
                    (BinaryOp::Sub, false) => g.clone(),
                    (BinaryOp::Sub, true) => g.neg()?,
                    (BinaryOp::Mul, _) => g.mul_scalar(s)?,
                    (BinaryOp::Div, false) => g.div_scalar(s)?,
                    (BinaryOp::Div, true) => g.mul(&sy.get(name)?)?.div(sa.get(name)?)?.neg()?,
                    (BinaryOp::Pow, false) => g.mul(&sa.get(name)?.pow_scalar(s - 1.0)?.mul_scalar(s)?)?,
                    (BinaryOp::Pow, true) => g.mul(&sy.get(name)?)?.mul_scalar(s.ln())?,
                    (BinaryOp::Maximum | BinaryOp::Minimum, _) => {
                        let a = sa.get(name)?;
                        let wins = if op == BinaryOp::Maximum { a.gt_scalar(s)? } else { a.lt_scalar(s)? };
                        let share =
                            wins.to_dtype(g.dtype())?.add(&a.eq_scalar(s)?.to_dtype(g.dtype())?.mul_scalar(0.5)?)?;
                        g.mul(&share)?
                    }
                    (BinaryOp::Remainder, false) => g.clone(),
                    _ => return Err(Error::invalid(format!("{name} with a tensor divisor has no gradient here"))),
                };
                Ok(vec![Some(da)])
            })
        };
        Ok(record1_reading_output(op.name(), &[&a], y, backward))
    }

    /// `self + other` with broadcasting and type promotion.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Add)
    }
    /// `self - other`
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Sub)
    }
    /// `self * other`
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Mul)
    }
    /// `self / other` (true division; integer operands give floats as in PyTorch).
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        if !self.dtype().is_float() && !other.dtype().is_float() {
            return self.to_dtype(DType::F32)?.div(&other.to_dtype(DType::F32)?);
        }
        self.binary(other, BinaryOp::Div)
    }
    /// `self ^ other`
    pub fn pow(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Pow)
    }
    /// Elementwise maximum (NaN propagates).
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Maximum)
    }
    /// Elementwise minimum (NaN propagates).
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Minimum)
    }
    /// Python's `%` (sign of the divisor).
    pub fn remainder(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Remainder)
    }

    /// `self + s`
    pub fn add_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Add, false)
    }
    /// `self - s`
    pub fn sub_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Sub, false)
    }
    /// `s - self`
    pub fn rsub_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Sub, true)
    }
    /// `self * s`
    pub fn mul_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Mul, false)
    }
    /// `self / s`
    pub fn div_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        let s = s.into();
        if !self.dtype().is_float() {
            return self.to_dtype(DType::F32)?.binary_scalar(s, BinaryOp::Div, false);
        }
        self.binary_scalar(s, BinaryOp::Div, false)
    }
    /// `s / self`
    pub fn rdiv_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        float_input(self)?.binary_scalar(s.into(), BinaryOp::Div, true)
    }
    /// `self ^ e`
    pub fn pow_scalar(&self, e: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(e.into(), BinaryOp::Pow, false)
    }
    /// `max(self, s)`
    pub fn maximum_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Maximum, false)
    }
    /// `min(self, s)`
    pub fn minimum_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Minimum, false)
    }

    // ---- comparisons (bool results, not differentiable) ----

    /// `self == other`
    pub fn eq(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Eq)
    }
    /// `self != other`
    pub fn ne(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Ne)
    }
    /// `self < other`
    pub fn lt(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Lt)
    }
    /// `self <= other`
    pub fn le(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Le)
    }
    /// `self > other`
    pub fn gt(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Gt)
    }
    /// `self >= other`
    pub fn ge(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Ge)
    }
    /// Logical and.
    pub fn logical_and(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::And)
    }
    /// Logical or.
    pub fn logical_or(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Or)
    }
    /// `self == s`
    pub fn eq_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Eq, false)
    }
    /// `self != s`
    pub fn ne_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Ne, false)
    }
    /// `self < s`
    pub fn lt_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Lt, false)
    }
    /// `self <= s`
    pub fn le_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Le, false)
    }
    /// `self > s`
    pub fn gt_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Gt, false)
    }
    /// `self >= s`
    pub fn ge_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_scalar(s.into(), BinaryOp::Ge, false)
    }

    // ---- selection ----

    /// `cond ? a : b` elementwise with broadcasting (`torch.where`).
    pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let (a, b) = promote_pair(a, b)?;
        let cond = cond.to_dtype(DType::Bool)?;
        let device = common_device("where", &[&cond, &a, &b])?;
        let shape = broadcast_or_err("where", &broadcast_or_err("where", cond.shape(), a.shape())?, b.shape())?;
        let out = Tensor::empty(&shape, a.dtype(), device)?;
        let l = coalesce(&[
            broadcast(&cond, &shape)?,
            broadcast(&a, &shape)?,
            broadcast(&b, &shape)?,
            out.layout().clone(),
        ]);
        exec_views(&Op::Where, &[(&cond, &l[0]), (&a, &l[1]), (&b, &l[2])], &[(&out, &l[3])])?;
        let (sc, shape_a, shape_b) = (cond.clone(), a.shape().to_vec(), b.shape().to_vec());
        let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            let g = opt(g)?;
            let zero = g.zeros_like()?;
            let da = Tensor::where_(&sc, g, &zero)?;
            let db = Tensor::where_(&sc, &zero, g)?;
            Ok(vec![Some(sum_to(&da, &shape_a)?), Some(sum_to(&db, &shape_b)?)])
        });
        Ok(record1("where", &[&a, &b], out, backward))
    }

    /// Limit to `[min, max]` (NaN propagates); the gradient passes where the input is inside.
    pub fn clamp(&self, min: f64, max: f64) -> Result<Tensor> {
        let out = Tensor::empty(self.shape(), self.dtype(), self.device())?;
        let l = coalesce(&[self.layout().clone(), out.layout().clone()]);
        exec_views(&Op::Clamp { min, max }, &[(self, &l[0])], &[(&out, &l[1])])?;
        let sx = Saved::new(self);
        let backward = Box::new(move |g: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
            let x = sx.get("clamp")?;
            let inside = x.ge_scalar(min)?.logical_and(&x.le_scalar(max)?)?;
            Ok(vec![Some(opt(g)?.mul(&inside.to_dtype(x.dtype())?)?)])
        });
        Ok(record1("clamp", &[self], out, backward))
    }

    /// `value` where `mask` is true, `self` elsewhere.
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let fill = Tensor::full(&[], value.into().value(), self.dtype(), self.device())?;
        Tensor::where_(mask, &fill, self)
    }

    // ---- in place ----

    /// Refuse in-place writes that would corrupt the autograd graph.
    pub(crate) fn check_in_place(&self, op: &str, others: &[&Tensor]) -> Result<()> {
        if is_grad_enabled() && (self.requires_grad() || others.iter().any(|t| t.requires_grad())) {
            return Err(Error::invalid(format!(
                "{op}: in-place operations on tensors that take part in autograd are not supported \
                 (use the out-of-place op, or run under no_grad as optimizers do)"
            )));
        }
        Ok(())
    }

    /// PyTorch's rule for in-place results: a float result cannot be written into an integer
    /// or bool tensor, nor an integer result into a bool one.
    fn check_result_type(&self, name: &str, result: DType) -> Result<()> {
        let lossy =
            (result.is_float() && !self.dtype().is_float()) || (result != DType::Bool && self.dtype() == DType::Bool);
        if lossy {
            return Err(super::dtype_err(format!(
                "{name}_: result type {result} can't be cast to the desired output type {}",
                self.dtype()
            )));
        }
        Ok(())
    }

    fn binary_in_place(&self, other: &Tensor, op: BinaryOp) -> Result<()> {
        let name = op.name();
        self.check_in_place(name, &[other])?;
        common_device(name, &[self, other])?;
        let mut result = promote_types(self.dtype(), other.dtype());
        if op == BinaryOp::Div && !result.is_float() {
            // True division of integers gives floats, as out of place.
            result = DType::F32;
        }
        self.check_result_type(name, result)?;
        let other = other.to_dtype(self.dtype())?;
        let lb = broadcast(&other, self.shape())?;
        exec_views(&Op::Binary(op), &[(self, self.layout()), (&other, &lb)], &[(self, self.layout())])?;
        self.storage().bump_version();
        Ok(())
    }

    fn scalar_in_place(&self, s: Scalar, op: BinaryOp) -> Result<()> {
        self.check_in_place(op.name(), &[])?;
        let result = promote_with_scalar(self.dtype(), matches!(s, Scalar::Float(_)), matches!(s, Scalar::Bool(_)));
        self.check_result_type(op.name(), result)?;
        exec_views(
            &Op::BinaryScalar { op, scalar: s.value(), scalar_first: false },
            &[(self, self.layout())],
            &[(self, self.layout())],
        )?;
        self.storage().bump_version();
        Ok(())
    }

    /// `self += other`
    pub fn add_(&self, other: &Tensor) -> Result<()> {
        self.binary_in_place(other, BinaryOp::Add)
    }
    /// `self -= other`
    pub fn sub_(&self, other: &Tensor) -> Result<()> {
        self.binary_in_place(other, BinaryOp::Sub)
    }
    /// `self *= other`
    pub fn mul_(&self, other: &Tensor) -> Result<()> {
        self.binary_in_place(other, BinaryOp::Mul)
    }
    /// `self /= other`
    pub fn div_(&self, other: &Tensor) -> Result<()> {
        self.binary_in_place(other, BinaryOp::Div)
    }
    /// `self += s`. As in PyTorch, a float scalar cannot be added into an integer tensor
    /// (pass an integer: `t.add_scalar_(1)`).
    pub fn add_scalar_(&self, s: impl Into<Scalar>) -> Result<()> {
        self.scalar_in_place(s.into(), BinaryOp::Add)
    }
    /// `self *= s`, with [`Tensor::add_scalar_`]'s dtype rule.
    pub fn mul_scalar_(&self, s: impl Into<Scalar>) -> Result<()> {
        self.scalar_in_place(s.into(), BinaryOp::Mul)
    }
    /// Set every element to `value`.
    pub fn fill_(&self, value: f64) -> Result<()> {
        self.check_in_place("fill_", &[])?;
        exec_views(&Op::Fill { value }, &[], &[(self, self.layout())])?;
        self.storage().bump_version();
        Ok(())
    }
    /// Set every element to zero.
    pub fn zero_(&self) -> Result<()> {
        self.fill_(0.0)
    }
    /// Copy `src` (broadcast and cast to this tensor) into this tensor.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        self.check_in_place("copy_", &[src])?;
        let src = src.to(self.device())?;
        let lb = broadcast(&src, self.shape())?;
        let op = if src.dtype() == self.dtype() { Op::Copy } else { Op::Cast };
        exec_views(&op, &[(&src, &lb)], &[(self, self.layout())])?;
        self.storage().bump_version();
        Ok(())
    }
}

macro_rules! operator {
    ($trait:ident, $method:ident, $tensor_fn:ident, $scalar_fn:ident) => {
        impl std::ops::$trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                self.$tensor_fn(rhs)
            }
        }
        impl std::ops::$trait<f64> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: f64) -> Result<Tensor> {
                self.$scalar_fn(rhs)
            }
        }
    };
}
operator!(Add, add, add, add_scalar);
operator!(Sub, sub, sub, sub_scalar);
operator!(Mul, mul, mul, mul_scalar);
operator!(Div, div, div, div_scalar);

impl std::ops::Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}
