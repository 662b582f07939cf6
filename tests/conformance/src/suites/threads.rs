//! Suite `threads`: when the device says it is thread safe, concurrent use from several
//! threads gives the same bits as the single-threaded run.

use crate::case::{Case, OpCase, Outcome, Status, Tier};
use crate::target::{Scope, Spec, Target};
use crate::values::Rng;
use genesis_backend_api::{BinaryOp, DType, Op};

/// Run `case` and return its first output's values (no comparison).
fn outputs(t: &Target, case: &OpCase) -> Result<Vec<f64>, String> {
    let mut scope = Scope::new(t);
    let ins = case.inputs.iter().map(|s| scope.place(s)).collect::<Result<Vec<_>, _>>()?;
    let out = scope.place(&case.outputs[0])?;
    let descs: Vec<_> = ins.iter().map(|p| p.desc).collect();
    t.device.execute(&case.op, &descs, &[out.desc]).map_err(|e| e.to_string())?;
    let (values, _) = scope.fetch(&out)?;
    scope.finish()?;
    Ok(values)
}

fn concurrent(t: &Target) -> Outcome {
    if !t.props.thread_safe {
        return Outcome::with(Status::NotSupported, "the device does not claim thread safety");
    }
    let mut rng = Rng::for_id("threads/concurrent");
    let a = Spec::new(DType::F32, &[24, 24], rng.values(DType::F32, 576, 1.0));
    let b = Spec::new(DType::F32, &[24, 24], rng.values(DType::F32, 576, 1.0));
    let work: Vec<OpCase> = [Op::Matmul, Op::Binary(BinaryOp::Mul), Op::Copy]
        .into_iter()
        .filter(|op| t.claims(op.kind(), DType::F32))
        .map(|op| {
            let inputs = if op == Op::Copy { vec![a.clone()] } else { vec![a.clone(), b.clone()] };
            OpCase { op, inputs, outputs: vec![Spec::out(DType::F32, &[24, 24])], expected: vec![None] }
        })
        .collect();
    if work.is_empty() {
        return Outcome::with(Status::NotSupported, "none of matmul, mul, copy is claimed on f32");
    }
    let reference: Result<Vec<Vec<f64>>, String> = work.iter().map(|c| outputs(t, c)).collect();
    let reference = match reference {
        Ok(r) => r,
        Err(e) => return Outcome::error(e),
    };
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|thread| {
                let (work, reference) = (&work, &reference);
                s.spawn(move || {
                    for round in 0..25 {
                        for (case, expected) in work.iter().zip(reference) {
                            match outputs(t, case) {
                                Ok(v) if v.iter().zip(expected).all(|(x, y)| x.to_bits() == y.to_bits()) => {}
                                Ok(_) => {
                                    return Some(format!(
                                        "thread {thread} round {round}: {} gave other bits",
                                        case.op.name()
                                    ))
                                }
                                Err(e) => {
                                    return Some(format!("thread {thread} round {round}: {}: {e}", case.op.name()))
                                }
                            }
                        }
                    }
                    None
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().unwrap_or_else(|_| Some("a thread panicked".into()))).collect()
    });
    Outcome::check(failures.is_empty(), failures.join("; "))
}

pub fn cases(_: &Target) -> Vec<Case> {
    vec![Case::new("threads", "concurrent_ops", Tier::Smoke, Box::new(concurrent)).after([
        "linalg/matmul/f32/".to_string(),
        "elementwise/mul/f32/".into(),
        "data/copy/f32/".into(),
    ])]
}
