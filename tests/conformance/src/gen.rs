//! Case generators: shapes from empty and scalar to large, non-contiguous and offset views,
//! broadcast (zero-stride) inputs, odd sizes and special values.

use crate::case::Tier;
use crate::target::{Layout, Spec};
use crate::values::{max_finite, min_subnormal, quantize_all, Rng};
use genesis_backend_api::DType;

/// One generated operand set for an elementwise op.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Name used in the case id.
    pub name: String,
    /// Smallest tier that runs it.
    pub tier: Tier,
    /// Inputs.
    pub inputs: Vec<Spec>,
    /// Output shape.
    pub out_shape: Vec<usize>,
    /// Output layout.
    pub out_layout: Layout,
}

/// Special values of a float dtype: NaN, ±inf, ±0, ±smallest subnormal, ±largest finite,
/// and a few ordinary ones.
pub fn special_values(dtype: DType) -> Vec<f64> {
    let (tiny, big) = (min_subnormal(dtype), max_finite(dtype));
    vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, tiny, -tiny, big, -big, 1.0, -1.0, 0.5, -2.5, 3.0]
}

/// How input values are drawn.
#[derive(Debug, Clone, Copy)]
pub struct ValueRange {
    /// Scale of the normals (or the integer range).
    pub scale: f64,
    /// Take absolute values (domains like log and sqrt).
    pub positive: bool,
    /// Replace zeros (integer divisors).
    pub nonzero: bool,
}

impl ValueRange {
    /// Normals of scale `scale`.
    pub fn normal(scale: f64) -> ValueRange {
        ValueRange { scale, positive: false, nonzero: false }
    }
}

fn draw(rng: &mut Rng, dtype: DType, n: usize, range: ValueRange) -> Vec<f64> {
    let mut v = rng.values(dtype, n, range.scale);
    if range.positive {
        v.iter_mut().for_each(|x| *x = x.abs());
    }
    if range.nonzero {
        v.iter_mut().filter(|x| **x == 0.0).for_each(|x| *x = 1.0);
    }
    v
}

/// A tensor of `shape` with values from `range`, in `layout` (broadcast layouts repeat the
/// values along the broadcast dim, as a stride-0 view must).
pub fn tensor(rng: &mut Rng, dtype: DType, shape: &[usize], layout: Layout, range: ValueRange) -> Spec {
    let numel: usize = shape.iter().product();
    let values = match layout {
        Layout::Broadcast(dim) => {
            let mut base = shape.to_vec();
            base[dim] = 1;
            let base_values = draw(rng, dtype, base.iter().product(), range);
            let inner: usize = shape[dim + 1..].iter().product();
            (0..numel).map(|i| base_values[(i / (inner * shape[dim])) * inner + i % inner]).collect()
        }
        _ => draw(rng, dtype, numel, range),
    };
    Spec { dtype, shape: shape.to_vec(), layout, values }
}

/// The standard elementwise samples for an op of `arity` operands of `dtype`.
pub fn elementwise_samples(rng: &mut Rng, dtype: DType, arity: usize, range: ValueRange) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut plain = |rng: &mut Rng, name: &str, tier: Tier, shape: &[usize], layouts: &[Layout], out_layout: Layout| {
        let inputs = (0..arity).map(|i| tensor(rng, dtype, shape, layouts[i.min(layouts.len() - 1)], range)).collect();
        out.push(Sample { name: name.into(), tier, inputs, out_shape: shape.to_vec(), out_layout });
    };
    let c = Layout::Contiguous;
    plain(rng, "odd37", Tier::Smoke, &[37], &[c], c);
    plain(rng, "scalar", Tier::Core, &[], &[c], c);
    plain(rng, "empty", Tier::Core, &[0], &[c], c);
    plain(rng, "empty3d", Tier::Core, &[2, 0, 3], &[c], c);
    plain(rng, "large1029", Tier::Core, &[1029], &[c], c);
    plain(rng, "transposed", Tier::Core, &[13, 17], &[Layout::Transposed, Layout::Strided], c);
    plain(rng, "offset_in_strided_out", Tier::Core, &[5, 6], &[Layout::Offset], Layout::Strided);
    if arity >= 2 {
        plain(rng, "broadcast", Tier::Core, &[4, 9], &[c, Layout::Broadcast(0)], Layout::Offset);
    }
    plain(rng, "large_2d", Tier::Full, &[129, 257], &[Layout::Transposed, c], c);
    if dtype.is_float() {
        let specials = quantize_all(dtype, &special_values(dtype));
        let n = specials.len();
        let inputs = if arity == 1 {
            vec![Spec::new(dtype, &[n], specials)]
        } else {
            // Every pair of special values; any further operands repeat the first.
            let a: Vec<f64> = (0..n * n).map(|i| specials[i / n]).collect();
            let b: Vec<f64> = (0..n * n).map(|i| specials[i % n]).collect();
            let mut v = vec![Spec::new(dtype, &[n * n], a.clone()), Spec::new(dtype, &[n * n], b)];
            v.extend((2..arity).map(|_| Spec::new(dtype, &[n * n], a.clone())));
            v
        };
        let shape = inputs[0].shape.clone();
        out.push(Sample { name: "special".into(), tier: Tier::Core, inputs, out_shape: shape, out_layout: c });
    }
    out
}
