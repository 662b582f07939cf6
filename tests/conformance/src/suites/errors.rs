//! Suite `errors`: each bad input of the interface gets the documented error kind (from the
//! call, or for errors only the device can see from the next synchronization), changes no
//! output, and leaves the device usable.

use super::memory_deps;
use crate::case::{Case, Outcome, Status, Tier};
use crate::target::{element_offsets, Scope, Spec, Target};
use genesis::ErrorKind;
use genesis_backend_api::{BinaryOp, BufferId, DType, Op, OpAttrs, OpKind, RawOp, ReduceOp, TensorDesc};

/// An op in wire form with its input and output descriptors.
type Call = (RawOp, Vec<TensorDesc>, Vec<TensorDesc>);

/// How a bad call is built: inputs, outputs and the op, from placed f32 operands.
struct BadCall {
    name: &'static str,
    needs: Op,
    kind: ErrorKind,
    build: fn(&mut Scope) -> Result<Call, String>,
}

fn f32s(shape: &[usize]) -> Spec {
    let n: usize = shape.iter().product();
    Spec::new(DType::F32, shape, (0..n).map(|i| i as f64 * 0.5).collect())
}

fn placed(scope: &mut Scope, spec: Spec) -> Result<TensorDesc, String> {
    scope.place(&spec).map(|p| p.desc)
}

fn calls() -> Vec<BadCall> {
    let add = Op::Binary(BinaryOp::Add);
    vec![
        BadCall {
            name: "binary_shape_mismatch",
            needs: add,
            kind: ErrorKind::ShapeMismatch,
            build: |s| {
                Ok((
                    Op::Binary(BinaryOp::Add).encode(),
                    vec![placed(s, f32s(&[4, 5]))?, placed(s, f32s(&[4, 6]))?],
                    vec![placed(s, Spec::out(DType::F32, &[4, 5]))?],
                ))
            },
        },
        BadCall {
            name: "binary_dtype_mismatch",
            needs: add,
            kind: ErrorKind::DtypeMismatch,
            build: |s| {
                let b = Spec::new(DType::I64, &[4, 5], vec![1.0; 20]);
                Ok((
                    Op::Binary(BinaryOp::Add).encode(),
                    vec![placed(s, f32s(&[4, 5]))?, placed(s, b)?],
                    vec![placed(s, Spec::out(DType::F32, &[4, 5]))?],
                ))
            },
        },
        BadCall {
            name: "wrong_operand_count",
            needs: add,
            kind: ErrorKind::InvalidArgument,
            build: |s| {
                Ok((
                    Op::Binary(BinaryOp::Add).encode(),
                    vec![placed(s, f32s(&[4, 5]))?],
                    vec![placed(s, Spec::out(DType::F32, &[4, 5]))?],
                ))
            },
        },
        BadCall {
            name: "view_past_buffer_end",
            needs: Op::Copy,
            kind: ErrorKind::InvalidArgument,
            build: |s| {
                let mut x = placed(s, f32s(&[4, 5]))?;
                x.shape[0] = 400;
                Ok((Op::Copy.encode(), vec![x], vec![placed(s, Spec::out(DType::F32, &[400, 5]))?]))
            },
        },
        BadCall {
            name: "unknown_buffer",
            needs: Op::Copy,
            kind: ErrorKind::InvalidArgument,
            build: |s| {
                let mut x = placed(s, f32s(&[4, 5]))?;
                x.buffer = BufferId(0x0BAD_0000_0000_0001);
                Ok((Op::Copy.encode(), vec![x], vec![placed(s, Spec::out(DType::F32, &[4, 5]))?]))
            },
        },
        BadCall {
            name: "zero_stride_output",
            needs: Op::Copy,
            kind: ErrorKind::InvalidArgument,
            build: |s| {
                let mut y = placed(s, Spec::out(DType::F32, &[4, 5]))?;
                y.strides[0] = 0;
                Ok((Op::Copy.encode(), vec![placed(s, f32s(&[4, 5]))?], vec![y]))
            },
        },
        BadCall {
            name: "output_overlaps_input",
            needs: Op::Matmul,
            kind: ErrorKind::InvalidArgument,
            build: |s| {
                let a = placed(s, f32s(&[4, 4]))?;
                let mut y = a;
                // Same shape, two elements further into a's buffer (still inside its guard bytes).
                y.offset_bytes += 8;
                Ok((Op::Matmul.encode(), vec![a, placed(s, f32s(&[4, 4]))?], vec![y]))
            },
        },
        BadCall {
            name: "matmul_inner_mismatch",
            needs: Op::Matmul,
            kind: ErrorKind::ShapeMismatch,
            build: |s| {
                Ok((
                    Op::Matmul.encode(),
                    vec![placed(s, f32s(&[3, 4]))?, placed(s, f32s(&[5, 2]))?],
                    vec![placed(s, Spec::out(DType::F32, &[3, 2]))?],
                ))
            },
        },
        BadCall {
            name: "reduce_bad_output_shape",
            needs: Op::Reduce(ReduceOp::Sum),
            kind: ErrorKind::ShapeMismatch,
            build: |s| {
                let op = Op::Reduce(ReduceOp::Sum);
                Ok((op.encode(), vec![placed(s, f32s(&[4, 5]))?], vec![placed(s, Spec::out(DType::F32, &[3, 1]))?]))
            },
        },
        BadCall {
            name: "gather_index_out_of_range",
            needs: Op::Gather { dim: 0 },
            kind: ErrorKind::InvalidArgument,
            build: |s| {
                let idx = Spec::new(DType::I64, &[2, 3], vec![0.0, 1.0, 7.0, 2.0, 0.0, 1.0]);
                Ok((
                    Op::Gather { dim: 0 }.encode(),
                    vec![placed(s, f32s(&[5, 3]))?, placed(s, idx)?],
                    vec![placed(s, Spec::out(DType::F32, &[2, 3]))?],
                ))
            },
        },
        BadCall {
            name: "rotary_kv_write_position_past_the_end",
            needs: Op::RotaryKvWrite,
            kind: ErrorKind::InvalidArgument,
            // Caches of 5 positions, 2 new ones: the last position that fits is 3.
            build: |s| kv_write_call(s, 4.0, 5),
        },
        BadCall {
            name: "rotary_kv_write_negative_position",
            needs: Op::RotaryKvWrite,
            kind: ErrorKind::InvalidArgument,
            build: |s| kv_write_call(s, -1.0, 5),
        },
        BadCall {
            name: "rotary_kv_write_caches_too_short",
            needs: Op::RotaryKvWrite,
            kind: ErrorKind::ShapeMismatch,
            build: |s| kv_write_call(s, 0.0, 1),
        },
        BadCall {
            name: "unknown_op_kind",
            needs: Op::Copy,
            kind: ErrorKind::Unsupported,
            build: |s| {
                let raw = RawOp { kind: OpKind(0x5ff), attrs: OpAttrs::default() };
                Ok((raw, vec![placed(s, f32s(&[4]))?], vec![placed(s, Spec::out(DType::F32, &[4]))?]))
            },
        },
        BadCall {
            name: "unknown_dtype_code",
            needs: Op::Copy,
            kind: ErrorKind::Unsupported,
            build: |s| {
                let mut x = placed(s, f32s(&[4]))?;
                x.dtype = 99;
                Ok((Op::Copy.encode(), vec![x], vec![placed(s, Spec::out(DType::F32, &[4]))?]))
            },
        },
    ]
}

/// `RotaryKvWrite` of 2 new positions (q `(1, 2, 2, 4)`, k and v `(1, 1, 2, 4)`) into caches
/// of `t` positions holding values, at `position`.
fn kv_write_call(s: &mut Scope, position: f64, t: usize) -> Result<Call, String> {
    let (q, kv) = ([1usize, 2, 2, 4], [1usize, 1, 2, 4]);
    Ok((
        Op::RotaryKvWrite.encode(),
        vec![
            placed(s, f32s(&q))?,
            placed(s, f32s(&kv))?,
            placed(s, f32s(&kv))?,
            placed(s, f32s(&[2, 2]))?,
            placed(s, f32s(&[2, 2]))?,
            placed(s, Spec::new(DType::I64, &[1], vec![position]))?,
        ],
        vec![placed(s, Spec::out(DType::F32, &q))?, placed(s, f32s(&[1, 1, t, 4]))?, placed(s, f32s(&[1, 1, t, 4]))?],
    ))
}

fn run_bad(t: &Target, call: &BadCall) -> Outcome {
    if !t.claims(call.needs.kind(), DType::F32) {
        return Outcome::with(
            Status::NotSupported,
            format!("needs {} on f32, which is not claimed", call.needs.name()),
        );
    }
    let mut scope = Scope::new(t);
    let (raw, inputs, outputs) = match (call.build)(&mut scope) {
        Ok(x) => x,
        Err(e) => return Outcome::error(e),
    };
    let before: Vec<Option<Vec<u8>>> = outputs.iter().map(|out| element_bytes(t, out)).collect();
    // Errors only the device can see (an index out of range) may come from the next
    // synchronization instead of the call (see `Device`): accept either.
    let result = t.device.execute_raw(&raw, &inputs, &outputs).and_then(|()| t.device.synchronize());
    let verdict = match result {
        Ok(()) => Outcome::fail(format!("the call succeeded; expected `{}`", call.kind)),
        Err(e) if e.kind() != call.kind => Outcome::fail(format!("expected `{}`, got `{}`: {e}", call.kind, e.kind())),
        Err(e) if e.message().trim().is_empty() => Outcome::fail("the error has no message"),
        Err(_) => Outcome::pass(),
    };
    if verdict.status != Status::Pass {
        return verdict;
    }
    let after: Vec<Option<Vec<u8>>> = outputs.iter().map(|out| element_bytes(t, out)).collect();
    if before.iter().zip(&after).any(|(b, a)| b.is_some() && b != a) {
        return Outcome::fail("the call failed but changed its output");
    }
    // The device must still work: a small round trip through a fresh buffer.
    let probe = scope.alloc(16).and_then(|b| {
        t.device.write(b, 0, &[7u8; 16]).map_err(|e| e.to_string())?;
        let mut back = [0u8; 16];
        t.device.read(b, 0, &mut back).map_err(|e| e.to_string())?;
        Ok(back == [7u8; 16])
    });
    match probe {
        Ok(true) => Outcome::pass(),
        Ok(false) => Outcome::fail("after the error, a write/read round trip returned other bytes"),
        Err(e) => Outcome::fail(format!("after the error the device no longer works: {e}")),
    }
}

/// The bytes of each element of `out`, or `None` when they cannot be read (a bad view).
fn element_bytes(t: &Target, out: &TensorDesc) -> Option<Vec<u8>> {
    let size = out.dtype().map_or(1, |d| d.size_in_bytes());
    let offsets: Vec<usize> = element_offsets(out).collect();
    let mut host = vec![0u8; offsets.iter().max().map_or(0, |&o| o + size)];
    t.device.read(out.buffer, 0, &mut host).ok()?;
    Some(offsets.iter().flat_map(|&o| host[o..o + size].iter().copied()).collect())
}

pub fn cases(_: &Target) -> Vec<Case> {
    calls()
        .into_iter()
        .map(|call| {
            let name = call.name;
            Case::new("errors", name, Tier::Smoke, Box::new(move |t| run_bad(t, &call))).after(memory_deps(DType::F32))
        })
        .collect()
}
