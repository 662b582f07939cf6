//! 2-D convolution and pooling: the backend's fused kernels when claimed, compositions of
//! padding, strided slices and matmul otherwise (and for higher-order gradients), and
//! adaptive average pooling as two matrix products.

use super::shape::slice_backward;
use super::{common_device, dtype_err, exec, shape_err};
use crate::amp::{cast_for, suspend, CastPolicy};
use crate::autograd::{is_grad_enabled, record, record1, Saved};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::sdk::checks::{expect_dtype, expect_meta};
use genesis_backend_api::sdk::window::{Axis, Conv2d, Pool2d};
use genesis_backend_api::{DType, Op, Window2d};

/// Stride, padding and dilation per spatial axis, with the kernel size.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    input: [usize; 2],
    output: [usize; 2],
}

impl Geometry {
    /// The geometry of the SDK's validated axes (height, width): the output lengths and every
    /// refusal come from `sdk::window::Axis`, as in the backends.
    fn of(rows: Axis, cols: Axis) -> Geometry {
        let [r, c] = [rows, cols];
        // Validated: stride and dilation >= 1, padding >= 0, and every tap fits an i64.
        let u = |v: i64| v as usize;
        Geometry {
            kernel: [r.kernel, c.kernel],
            stride: [u(r.stride), u(c.stride)],
            padding: [u(r.pad), u(c.pad)],
            dilation: [u(r.dilation), u(c.dilation)],
            input: [r.input, c.input],
            output: [r.output, c.output],
        }
    }

    fn window(&self) -> Window2d {
        let w = |a: [usize; 2]| [a[0] as i64, a[1] as i64];
        Window2d {
            kernel: w(self.kernel),
            stride: w(self.stride),
            padding: w(self.padding),
            dilation: w(self.dilation),
        }
    }

    fn taps(&self) -> usize {
        self.kernel[0] * self.kernel[1]
    }

    /// `x (n, c, h, w)` padded with `value` on both sides of each spatial axis.
    fn pad(&self, x: &Tensor, value: f64) -> Result<Tensor> {
        let mut x = x.clone();
        for a in 0..2 {
            let p = self.padding[a];
            if p > 0 {
                let mut shape = x.shape().to_vec();
                shape[2 + a] = p;
                let fill = Tensor::full(&shape, value, x.dtype(), x.device())?;
                x = Tensor::cat(&[fill.clone(), x, fill], 2 + a as isize)?;
            }
        }
        Ok(x)
    }

    /// The window taps of padded `xp` stacked on a new dim 2: `(n, c, kh·kw, oh, ow)`.
    fn unfold(&self, xp: &Tensor) -> Result<Tensor> {
        let mut taps = Vec::with_capacity(self.taps());
        for i in 0..self.kernel[0] {
            for j in 0..self.kernel[1] {
                taps.push(self.tap(xp, i, j)?);
            }
        }
        Tensor::stack(&taps, 2)
    }

    fn tap(&self, xp: &Tensor, i: usize, j: usize) -> Result<Tensor> {
        let mut t = xp.clone();
        for (a, k) in [(0, i), (1, j)] {
            let start = k * self.dilation[a];
            let end = start + self.stride[a] * (self.output[a] - 1) + 1;
            t = t.slice(2 + a as isize, start as isize, end as isize, self.stride[a])?;
        }
        Ok(t)
    }

    /// The adjoint of `pad` + `unfold`: sums `(n, c, kh·kw, oh, ow)` taps back onto the input
    /// positions they were read from. Differentiable.
    fn fold(&self, cols: &Tensor) -> Result<Tensor> {
        let (n, c) = (cols.shape()[0], cols.shape()[1]);
        let padded = [self.input[0] + 2 * self.padding[0], self.input[1] + 2 * self.padding[1]];
        let mut total: Option<Tensor> = None;
        for i in 0..self.kernel[0] {
            for j in 0..self.kernel[1] {
                let tap = cols.select(2, (i * self.kernel[1] + j) as isize)?;
                let wide =
                    slice_backward(&tap, &[n, c, self.output[0], padded[1]], 3, j * self.dilation[1], self.stride[1])?;
                let placed =
                    slice_backward(&wide, &[n, c, padded[0], padded[1]], 2, i * self.dilation[0], self.stride[0])?;
                total = Some(match total {
                    None => placed,
                    Some(t) => t.add(&placed)?,
                });
            }
        }
        let total = total.ok_or_else(|| Error::invalid("fold: empty kernel"))?;
        total.narrow(2, self.padding[0], self.input[0])?.narrow(3, self.padding[1], self.input[1])
    }
}

/// The op's window attributes; a value past `i64::MAX` saturates, which the SDK's checks
/// refuse as an overflowing geometry.
fn window_of(kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2], dilation: [usize; 2]) -> Window2d {
    let w = |a: [usize; 2]| a.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
    Window2d { kernel: w(kernel), stride: w(stride), padding: w(padding), dilation: w(dilation) }
}

/// The core's own rule (a float input, as PyTorch requires); the rank and window are the
/// SDK's checks.
fn check_float(name: &str, x: &Tensor) -> Result<()> {
    if !x.dtype().is_float() {
        return Err(dtype_err(format!("{name}: expected a floating-point input, got {}", x.dtype())));
    }
    Ok(())
}

/// 2-D convolution (`F.conv2d`) of `x (n, c, h, w)` with `weight (o, c/groups, kh, kw)` and an
/// optional `bias (o)`, zero padding. Runs in the autocast low-precision dtype inside a scope.
pub fn conv2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
) -> Result<Tensor> {
    let x = cast_for(CastPolicy::Low, x)?;
    let w = cast_for(CastPolicy::Low, weight)?;
    let b = bias.map(|b| cast_for(CastPolicy::Low, b)).transpose()?;
    check_float("conv2d", &x)?;
    let groups_u32 =
        u32::try_from(groups).map_err(|_| Error::invalid(format!("conv2d: groups ({groups}) must fit in 32 bits")))?;
    // The SDK's rules, as the backends apply them: ranks, groups, channels, window (the
    // kernel size comes from the weight), the weight's and bias's dtype and the bias's shape.
    let window = window_of([0, 0], stride, padding, dilation);
    let probe = Op::Conv2d { window, groups: groups_u32 };
    let sdk = Conv2d::new(&probe, &window, groups_u32, &x, &w)?;
    expect_dtype(&probe, "weight", &w, x.dtype())?;
    let (n, o) = (sdk.n, sdk.o);
    let mut params = vec![&w];
    if let Some(b) = &b {
        expect_meta(&probe, "bias", b, &[o], x.dtype())?;
        params.push(b);
    }
    common_device("conv2d", &[&[&x][..], &params].concat())?;
    let g = Geometry::of(sdk.rows, sdk.cols);
    let op = Op::Conv2d { window: g.window(), groups: groups_u32 };
    if !super::fused::use_fused(&op, &x)? {
        return conv2d_composite(&x, &w, b.as_ref(), &g, groups);
    }
    let y = Tensor::empty(&[n, o, g.output[0], g.output[1]], x.dtype(), x.device())?;
    let ins: Vec<_> = [&x].into_iter().chain(params.iter().copied()).map(|t| (t, t.layout())).collect();
    exec(&op, &ins, &[&y])?;
    let (sx, sw, has_bias) = (Saved::new(&x), Saved::new(&w), b.is_some());
    let backward = Box::new(move |gr: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let gy = gr[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))?;
        let (x, w) = (sx.get("conv2d")?, sw.get("conv2d")?);
        let (window, gu) = (g.window(), groups_u32);
        let fused_bwd = Op::Conv2dBackwardInput { window, groups: gu };
        let weight_bwd = Op::Conv2dBackwardWeight { window, groups: gu };
        // Both backward kernels or neither: a backend may claim one without the other.
        let fused = super::fused::use_fused(&fused_bwd, gy)? && super::fused::use_fused(&weight_bwd, gy)?;
        if !is_grad_enabled() && fused {
            let dx = Tensor::empty(x.shape(), x.dtype(), x.device())?;
            exec(&fused_bwd, &[(gy, gy.layout()), (w, w.layout())], &[&dx])?;
            let dw = Tensor::empty(w.shape(), w.dtype(), w.device())?;
            let mut outs = vec![dw];
            if has_bias {
                outs.push(Tensor::empty(&[w.shape()[0]], w.dtype(), w.device())?);
            }
            let refs: Vec<&Tensor> = outs.iter().collect();
            exec(&weight_bwd, &[(gy, gy.layout()), (x, x.layout())], &refs)?;
            let mut grads = vec![Some(dx)];
            grads.extend(outs.into_iter().map(Some));
            return Ok(grads);
        }
        conv2d_backward_composite(gy, x, w, has_bias, &g, groups)
    });
    let inputs: Vec<&Tensor> = [&x].into_iter().chain(params.iter().copied()).collect();
    Ok(record("conv2d", &inputs, vec![y], backward).remove(0))
}

/// Rows `(n, groups, c/groups·kh·kw, oh·ow)` of the unfolded input.
fn columns(x: &Tensor, g: &Geometry, groups: usize) -> Result<Tensor> {
    let (n, c) = (x.shape()[0] as isize, x.shape()[1] as isize);
    let cols = g.unfold(&g.pad(x, 0.0)?)?;
    let per_group = (c / groups as isize) * g.taps() as isize;
    cols.reshape(&[n, groups as isize, per_group, (g.output[0] * g.output[1]) as isize])
}

fn conv2d_composite(x: &Tensor, w: &Tensor, b: Option<&Tensor>, g: &Geometry, groups: usize) -> Result<Tensor> {
    let (n, o) = (x.shape()[0] as isize, w.shape()[0] as isize);
    let wg = w.reshape(&[groups as isize, o / groups as isize, -1])?;
    let y = wg.matmul(&columns(x, g, groups)?)?.reshape(&[n, o, g.output[0] as isize, g.output[1] as isize])?;
    match b {
        Some(b) => y.add(&b.reshape(&[o, 1, 1])?),
        None => Ok(y),
    }
}

fn conv2d_backward_composite(
    gy: &Tensor,
    x: &Tensor,
    w: &Tensor,
    has_bias: bool,
    g: &Geometry,
    groups: usize,
) -> Result<Vec<Option<Tensor>>> {
    let (n, c, o) = (x.shape()[0] as isize, x.shape()[1] as isize, w.shape()[0] as isize);
    let gr = gy.reshape(&[n, groups as isize, o / groups as isize, -1])?;
    let cols = columns(x, g, groups)?;
    let dw = gr.matmul(&cols.transpose(-1, -2)?)?.sum_dims(&[0], false)?;
    let dw = dw.reshape(&w.shape().iter().map(|&d| d as isize).collect::<Vec<_>>())?;
    let wg = w.reshape(&[groups as isize, o / groups as isize, -1])?;
    let dcols = wg.transpose(-1, -2)?.matmul(&gr)?;
    let dcols = dcols.reshape(&[n, c, g.taps() as isize, g.output[0] as isize, g.output[1] as isize])?;
    let mut grads = vec![Some(g.fold(&dcols)?), Some(dw)];
    if has_bias {
        grads.push(Some(gy.sum_dims(&[0, 2, 3], false)?));
    }
    Ok(grads)
}

/// PyTorch's rule that keeps every pooling window on at least one real element.
fn check_pool_padding(name: &str, kernel: [usize; 2], padding: [usize; 2]) -> Result<()> {
    if padding[0] > kernel[0] / 2 || padding[1] > kernel[1] / 2 {
        return Err(Error::invalid(format!(
            "{name}: padding {padding:?} must be at most half the kernel size {kernel:?}"
        )));
    }
    Ok(())
}

/// The fused pooling's output `(n, c, oh, ow)`, uninitialized.
fn pool_output(x: &Tensor, g: &Geometry) -> Result<Tensor> {
    let (n, c) = (x.shape()[0], x.shape()[1]);
    Tensor::empty(&[n, c, g.output[0], g.output[1]], x.dtype(), x.device())
}

/// The fused pooling backward `bop` of `gy` (and max pooling's `argmax`) into a new dx of
/// `x_shape`; `None` when the composition is to run instead (gradients of the gradient are
/// recorded, or the backend does not claim `bop`).
fn fused_pool_backward(bop: &Op, gy: &Tensor, argmax: Option<&Tensor>, x_shape: &[usize]) -> Result<Option<Tensor>> {
    if is_grad_enabled() || !super::fused::use_fused(bop, gy)? {
        return Ok(None);
    }
    let dx = Tensor::empty(x_shape, gy.dtype(), gy.device())?;
    let ins: Vec<_> = std::iter::once(gy).chain(argmax).map(|t| (t, t.layout())).collect();
    exec(bop, &ins, &[&dx])?;
    Ok(Some(dx))
}

/// 2-D max pooling (`F.max_pool2d`, floor output size, -inf padding). The gradient goes to
/// the first maximum of each window in the fused kernel; the composition shares it evenly
/// among tied maxima.
pub fn max_pool2d(
    x: &Tensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
) -> Result<Tensor> {
    check_float("max_pool2d", x)?;
    check_pool_padding("max_pool2d", kernel, padding)?;
    let window = window_of(kernel, stride, padding, dilation);
    let op = Op::MaxPool2d { window };
    let sdk = Pool2d::new(&op, &window, x, true)?;
    let g = Geometry::of(sdk.rows, sdk.cols);
    if !super::fused::use_fused(&op, x)? {
        return g.unfold(&g.pad(x, f64::NEG_INFINITY)?)?.max_dims(&[2], false);
    }
    let y = pool_output(x, &g)?;
    let argmax = Tensor::empty(y.shape(), DType::I64, x.device())?;
    exec(&op, &[(x, x.layout())], &[&y, &argmax])?;
    let x_shape = x.shape().to_vec();
    let backward = Box::new(move |gr: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let gy = gr[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))?;
        let bop = Op::MaxPool2dBackward { window: g.window() };
        if let Some(dx) = fused_pool_backward(&bop, gy, Some(&argmax), &x_shape)? {
            return Ok(vec![Some(dx)]);
        }
        let (n, c) = (x_shape[0] as isize, x_shape[1] as isize);
        let plane = Tensor::zeros(&[x_shape[0], x_shape[1], x_shape[2] * x_shape[3]], gy.dtype(), gy.device())?;
        let dx = plane.scatter_add(2, &argmax.reshape(&[n, c, -1])?, &gy.reshape(&[n, c, -1])?)?;
        Ok(vec![Some(dx.reshape(&x_shape.iter().map(|&d| d as isize).collect::<Vec<_>>())?)])
    });
    Ok(record1("max_pool2d", &[x], y, backward))
}

/// 2-D average pooling (`F.avg_pool2d`, floor output size, zero padding counted in the
/// divisor as with PyTorch's default `count_include_pad=True`).
pub fn avg_pool2d(x: &Tensor, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Result<Tensor> {
    check_float("avg_pool2d", x)?;
    check_pool_padding("avg_pool2d", kernel, padding)?;
    let window = window_of(kernel, stride, padding, [1, 1]);
    let op = Op::AvgPool2d { window };
    let sdk = Pool2d::new(&op, &window, x, false)?;
    let g = Geometry::of(sdk.rows, sdk.cols);
    if !super::fused::use_fused(&op, x)? {
        return g.unfold(&g.pad(x, 0.0)?)?.mean_dims(&[2], false);
    }
    let y = pool_output(x, &g)?;
    exec(&op, &[(x, x.layout())], &[&y])?;
    let x_shape = x.shape().to_vec();
    let backward = Box::new(move |gr: &[Option<Tensor>]| -> Result<Vec<Option<Tensor>>> {
        let gy = gr[0].as_ref().ok_or_else(|| Error::invalid("missing gradient"))?;
        let bop = Op::AvgPool2dBackward { window: g.window() };
        if let Some(dx) = fused_pool_backward(&bop, gy, None, &x_shape)? {
            return Ok(vec![Some(dx)]);
        }
        let s = gy.shape().iter().map(|&d| d as isize).collect::<Vec<_>>();
        let cols = gy.unsqueeze(2)?.expand(&[s[0], s[1], g.taps() as isize, s[2], s[3]])?;
        Ok(vec![Some(g.fold(&cols.div_scalar(g.taps() as f64)?)?)])
    });
    Ok(record1("avg_pool2d", &[x], y, backward))
}

/// The `(out, len)` matrix averaging the bins `[floor(i·len/out), ceil((i+1)·len/out))`.
fn bin_matrix(out: usize, len: usize, like: &Tensor) -> Result<Tensor> {
    let mut m = vec![0f64; out * len];
    for i in 0..out {
        let (start, end) = (i * len / out, ((i + 1) * len).div_ceil(out));
        for j in start..end {
            m[i * len + j] = 1.0 / (end - start) as f64;
        }
    }
    Tensor::from_vec(m, &[out, len], like.device())?.to_dtype(like.dtype())
}

/// Adaptive average pooling to `output_size` (`F.adaptive_avg_pool2d`), as PyTorch bins it.
pub fn adaptive_avg_pool2d(x: &Tensor, output_size: [usize; 2]) -> Result<Tensor> {
    check_float("adaptive_avg_pool2d", x)?;
    if x.rank() != 4 {
        return Err(shape_err(format!(
            "adaptive_avg_pool2d: x (n, c, h, w) must have rank 4, got shape {:?}",
            x.shape()
        )));
    }
    if output_size.contains(&0) || x.shape()[2] == 0 || x.shape()[3] == 0 {
        return Err(shape_err(format!(
            "adaptive_avg_pool2d: output size {output_size:?} and input {:?} must have positive spatial sizes",
            x.shape()
        )));
    }
    // Not an autocast op in PyTorch: the products run in the input's dtype.
    let _no_autocast = suspend();
    let rows = bin_matrix(output_size[0], x.shape()[2], x)?;
    let cols = bin_matrix(output_size[1], x.shape()[3], x)?;
    rows.matmul(x)?.matmul(&cols.t()?)
}
