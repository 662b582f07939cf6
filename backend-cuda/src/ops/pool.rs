//! 2-D max pooling (with PyTorch's argmax: the flat index `ih*w + iw` in the plane; NaN wins)
//! and average pooling (`count_include_pad`), and their backward ops (`kernels/pool.cu`), with
//! the CPU backend's checks. Every operand is used through its strides.

use super::checks::{dims, expect_dtype, expect_shape};
use super::conv::{launch, strides, ConvArgs};
use crate::device::CudaDevice;
use crate::kernels::Operand;
use genesis_backend_api::sdk::window::Axis;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, TensorDesc, Window2d};

const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// What this family runs.
pub fn claims() -> Vec<(OpKind, DType)> {
    let window = Window2d::default();
    let ops = [
        Op::MaxPool2d { window },
        Op::MaxPool2dBackward { window },
        Op::AvgPool2d { window },
        Op::AvgPool2dBackward { window },
    ];
    ops.iter().flat_map(|op| DTYPES.iter().map(move |&d| (op.kind(), d))).collect()
}

/// The geometry of one pooling: planes (n·c) and the two axes.
struct Geom {
    n: usize,
    c: usize,
    rows: Axis,
    cols: Axis,
}

impl Geom {
    fn y_shape(&self) -> [usize; 4] {
        [self.n, self.c, self.rows.output, self.cols.output]
    }
    fn outputs(&self) -> u64 {
        (self.n * self.c * self.rows.output * self.cols.output) as u64
    }
    fn inputs(&self) -> u64 {
        (self.n * self.c * self.rows.input * self.cols.input) as u64
    }
}

/// Validate the window against `x` (n, c, h, w). Average pooling has no dilation: the field
/// must be 0 (unset) or 1.
fn geometry(op: &Op, window: &Window2d, x: &Operand, max: bool) -> Result<Geom> {
    let [n, c, h, w] = dims::<4>(op, "x (n, c, h, w)", x)?;
    let mut dilation = window.dilation;
    if !max {
        if dilation.iter().any(|&d| d != 0 && d != 1) {
            return Err(BackendError::invalid(format!(
                "{}: average pooling has no dilation, got {:?}",
                op.name(),
                window.dilation
            )));
        }
        dilation = [1, 1];
    }
    let rows = Axis::new(op, "height", h, window.kernel[0], window.stride[0], window.padding[0], dilation[0])?;
    let cols = Axis::new(op, "width", w, window.kernel[1], window.stride[1], window.padding[1], dilation[1])?;
    if max {
        // A window that covers only padding has no element to pick (its argmax would point
        // outside the plane): refused, as the CPU reference does.
        for (name, axis) in [("row", rows), ("column", cols)] {
            if let Some(o) = (0..axis.output).find(|&o| (0..axis.kernel).all(|k| axis.tap(o, k).is_none())) {
                return Err(BackendError::invalid(format!(
                    "{}: the window of output {name} {o} covers only padding (input {:?}, window {window:?})",
                    op.name(),
                    x.shape
                )));
            }
        }
    }
    Ok(Geom { n, c, rows, cols })
}

/// Run one pooling op.
pub fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let wrong = |expected: &str| BackendError::invalid(format!("{}: expected {expected}", op.name()));
    let ins = inputs.iter().map(|d| device.operand(d)).collect::<Result<Vec<_>>>()?;
    let outs = outputs.iter().map(|d| device.operand(d)).collect::<Result<Vec<_>>>()?;
    match *op {
        Op::MaxPool2d { window } => {
            let ([x], [y, idx]) = (&ins[..], &outs[..]) else {
                return Err(wrong("1 input (x) and 2 outputs (y, argmax)"));
            };
            let g = geometry(op, &window, x, true)?;
            expect_shape(op, "y", y, &g.y_shape())?;
            expect_dtype(op, "y", y, x.dtype)?;
            expect_shape(op, "argmax", idx, &g.y_shape())?;
            expect_dtype(op, "argmax", idx, DType::I64)?;
            let mut a = args(&g, x, y);
            a.zs = strides(idx);
            a.p = [x.ptr, y.ptr, idx.ptr, 0];
            launch(device, op, x.dtype, "max_pool2d", &mut a, g.outputs())
        }
        Op::MaxPool2dBackward { window } => {
            let ([dy, idx], [dx]) = (&ins[..], &outs[..]) else {
                return Err(wrong("2 inputs (dy, argmax) and 1 output (dx)"));
            };
            let g = geometry(op, &window, dx, true)?;
            expect_shape(op, "dy", dy, &g.y_shape())?;
            expect_shape(op, "argmax", idx, &g.y_shape())?;
            expect_dtype(op, "argmax", idx, DType::I64)?;
            expect_dtype(op, "dx", dx, dy.dtype)?;
            // The gather only matches argmax values inside each output's window, so a corrupt
            // index is ignored (the CPU reference reports one outside the plane) but never
            // read or written out of bounds.
            let mut a = args(&g, dx, dy);
            a.zs = strides(idx);
            a.p = [dy.ptr, idx.ptr, dx.ptr, 0];
            launch(device, op, dy.dtype, "max_pool2d_backward", &mut a, g.inputs())
        }
        Op::AvgPool2d { window } => {
            let ([x], [y]) = (&ins[..], &outs[..]) else { return Err(wrong("1 input (x) and 1 output (y)")) };
            let g = geometry(op, &window, x, false)?;
            expect_shape(op, "y", y, &g.y_shape())?;
            expect_dtype(op, "y", y, x.dtype)?;
            let mut a = args(&g, x, y);
            a.p = [x.ptr, y.ptr, 0, 0];
            launch(device, op, x.dtype, "avg_pool2d", &mut a, g.outputs())
        }
        Op::AvgPool2dBackward { window } => {
            let ([dy], [dx]) = (&ins[..], &outs[..]) else { return Err(wrong("1 input (dy) and 1 output (dx)")) };
            let g = geometry(op, &window, dx, false)?;
            expect_shape(op, "dy", dy, &g.y_shape())?;
            expect_dtype(op, "dx", dx, dy.dtype)?;
            let mut a = args(&g, dx, dy);
            a.p = [dy.ptr, dx.ptr, 0, 0];
            launch(device, op, dy.dtype, "avg_pool2d_backward", &mut a, g.inputs())
        }
        _ => Err(BackendError::unsupported(format!("cuda: {} is not a pooling op", op.name()))),
    }
}

/// The argument block with the geometry, x-side strides from `x` and y-side from `y`.
fn args(g: &Geom, x: &Operand, y: &Operand) -> ConvArgs {
    let mut a = ConvArgs::window(g.n, g.c, &g.rows, &g.cols);
    a.xs = strides(x);
    a.ys = strides(y);
    a
}
