//! 2-D max pooling (with PyTorch's argmax: the flat index `ih*w + iw` in the plane; NaN wins)
//! and average pooling (`count_include_pad`), and their backward ops (`kernels/pool.cu`), with
//! the SDK's checks. Every operand is used through its strides.

use super::conv::{launch, strides, ConvArgs};
use super::resolve;
use super::Family;
use crate::device::CudaDevice;
use crate::kernels::Operand;
use genesis_backend_api::sdk::domain;
use genesis_backend_api::sdk::window::Pool2d as Geom;
use genesis_backend_api::{BackendError, DType, Op, OpKind, Result, TensorDesc, Window2d};

inventory::submit! { Family { claims, run } }

/// What this family runs.
fn claims() -> Vec<(OpKind, DType)> {
    let window = Window2d::default();
    let ops = [
        Op::MaxPool2d { window },
        Op::MaxPool2dBackward { window },
        Op::AvgPool2d { window },
        Op::AvgPool2dBackward { window },
    ];
    domain::claims(&ops)
}

/// Elements of y, and of x, over all planes.
fn out_elems(g: &Geom) -> u64 {
    (g.n * g.c * g.plane_out()) as u64
}
fn in_elems(g: &Geom) -> u64 {
    (g.n * g.c * g.plane_in()) as u64
}

/// Run one pooling op.
fn run(device: &CudaDevice, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let (ins, outs) = resolve(device, inputs, outputs)?;
    match *op {
        Op::MaxPool2d { window } => {
            let (g, [x, y, idx]) = Geom::max(op, &window, &ins, &outs)?;
            let mut a = args(&g, x, y, Some(idx), [x.ptr, y.ptr, idx.ptr, 0]);
            launch(device, op, x.dtype, "max_pool2d", &mut a, out_elems(&g))
        }
        Op::MaxPool2dBackward { window } => {
            let (g, [dy, idx, dx]) = Geom::max_backward(op, &window, &ins, &outs)?;
            // The gather only matches argmax values inside each output's window, so a corrupt
            // index is ignored (the CPU reference reports one outside the plane) but never
            // read or written out of bounds.
            let mut a = args(&g, dx, dy, Some(idx), [dy.ptr, idx.ptr, dx.ptr, 0]);
            launch(device, op, dy.dtype, "max_pool2d_backward", &mut a, in_elems(&g))
        }
        Op::AvgPool2d { window } => {
            let (g, [x, y]) = Geom::avg(op, &window, &ins, &outs)?;
            let mut a = args(&g, x, y, None, [x.ptr, y.ptr, 0, 0]);
            launch(device, op, x.dtype, "avg_pool2d", &mut a, out_elems(&g))
        }
        Op::AvgPool2dBackward { window } => {
            let (g, [dy, dx]) = Geom::avg_backward(op, &window, &ins, &outs)?;
            let mut a = args(&g, dx, dy, None, [dy.ptr, dx.ptr, 0, 0]);
            launch(device, op, dy.dtype, "avg_pool2d_backward", &mut a, in_elems(&g))
        }
        _ => Err(BackendError::unsupported(format!("cuda: {} is not a pooling op", op.name()))),
    }
}

/// The argument block with the geometry, x-side strides from `x`, y-side from `y`, the argmax
/// strides from `idx` (max pooling), and the kernel's pointers `p`.
fn args(g: &Geom, x: &Operand, y: &Operand, idx: Option<&Operand>, p: [u64; 4]) -> ConvArgs {
    let mut a = ConvArgs::window(g.n, g.c, &g.rows, &g.cols);
    a.xs = strides(x);
    a.ys = strides(y);
    if let Some(idx) = idx {
        a.zs = strides(idx);
    }
    a.p = p;
    a
}
