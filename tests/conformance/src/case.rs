//! Cases, their statuses and outcomes, and the generic runner of one op on placed operands.

use crate::target::{Scope, Spec, Target};
use crate::tolerance::{compare, Expected, Worst};
use genesis::ErrorKind;
use genesis_backend_api::Op;
use std::fmt;

/// How a case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// Everything checked held.
    Pass,
    /// A check did not hold.
    Fail,
    /// The backend returned an error where it should have run (or the harness could not
    /// run the case).
    Error,
    /// The process running the case died.
    Crash,
    /// The case did not finish in time.
    Timeout,
    /// The backend does not claim the (op, dtype) and refused it cleanly.
    NotSupported,
    /// A prerequisite case failed.
    Blocked,
    /// Not run (expectations file).
    Skipped,
    /// Failed as the expectations file says.
    XFail,
    /// Passed although the expectations file says it fails.
    XPass,
}

impl Status {
    /// Every status, in report order.
    pub const ALL: [Status; 10] = [
        Status::Pass,
        Status::Fail,
        Status::Error,
        Status::Crash,
        Status::Timeout,
        Status::NotSupported,
        Status::Blocked,
        Status::Skipped,
        Status::XFail,
        Status::XPass,
    ];

    /// The JSON name.
    pub fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Error => "error",
            Status::Crash => "crash",
            Status::Timeout => "timeout",
            Status::NotSupported => "not_supported",
            Status::Blocked => "blocked",
            Status::Skipped => "skipped",
            Status::XFail => "xfail",
            Status::XPass => "xpass",
        }
    }

    /// The status for a JSON name.
    pub fn from_name(name: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.name() == name)
    }

    /// True for the statuses that make a run non-conformant (and block dependants).
    pub fn is_failure(self) -> bool {
        matches!(self, Status::Fail | Status::Error | Status::Crash | Status::Timeout)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The result of one case.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// How it ended.
    pub status: Status,
    /// What happened, for people.
    pub message: String,
    /// The worst element of a numeric comparison, with the output's name.
    pub worst: Option<(String, Worst)>,
    /// Elements compared and out of tolerance.
    pub mismatches: Option<(usize, usize)>,
    /// The tolerance applied.
    pub tolerance: Option<String>,
    /// The inputs' values at the worst element (input position, value): those with the
    /// output's element count (elementwise ops) or a single element.
    pub worst_inputs: Vec<(usize, f64)>,
}

impl Outcome {
    /// A pass.
    pub fn pass() -> Outcome {
        Outcome::with(Status::Pass, String::new())
    }
    /// An outcome with a message.
    pub fn with(status: Status, message: impl Into<String>) -> Outcome {
        Outcome {
            status,
            message: message.into(),
            worst: None,
            mismatches: None,
            tolerance: None,
            worst_inputs: Vec::new(),
        }
    }
    /// A failure.
    pub fn fail(message: impl Into<String>) -> Outcome {
        Outcome::with(Status::Fail, message)
    }
    /// An error.
    pub fn error(message: impl Into<String>) -> Outcome {
        Outcome::with(Status::Error, message)
    }
    /// Pass when `ok`, else fail with `message`.
    pub fn check(ok: bool, message: impl Into<String>) -> Outcome {
        if ok {
            Outcome::pass()
        } else {
            Outcome::fail(message)
        }
    }
}

/// Which tier a case belongs to; a run of tier T runs every case of tier ≤ T.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// One case per (op, dtype) and the interface basics; about a minute on a laptop.
    Smoke,
    /// The must-pass profile.
    Core,
    /// Larger shapes and longer stress.
    Full,
}

impl Tier {
    /// Parse `smoke|core|full`.
    pub fn parse(s: &str) -> Option<Tier> {
        match s {
            "smoke" => Some(Tier::Smoke),
            "core" => Some(Tier::Core),
            "full" => Some(Tier::Full),
            _ => None,
        }
    }
    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Smoke => "smoke",
            Tier::Core => "core",
            Tier::Full => "full",
        }
    }
}

/// The code a case runs.
pub type CaseFn = Box<dyn Fn(&Target) -> Outcome + Send + Sync>;

/// One named check.
pub struct Case {
    /// `suite/op/dtype/sample` or `suite/check`.
    pub id: String,
    /// The suite (first id component).
    pub suite: &'static str,
    /// Smallest tier that runs it.
    pub tier: Tier,
    /// Id prefixes of prerequisite cases (in earlier suites).
    pub deps: Vec<String>,
    /// The check.
    pub run: CaseFn,
}

impl Case {
    /// A case of `suite` named `id` (without the suite prefix).
    pub fn new(suite: &'static str, id: impl Into<String>, tier: Tier, run: CaseFn) -> Case {
        Case { id: format!("{suite}/{}", id.into()), suite, tier, deps: Vec::new(), run }
    }
    /// A case that runs the op case `case` with [`run_claimed`]; `claimed` says whether the
    /// target claims its (op, dtype) pair.
    pub fn op(suite: &'static str, id: impl Into<String>, tier: Tier, claimed: bool, case: OpCase) -> Case {
        Case::new(suite, id, tier, Box::new(move |t| run_claimed(t, claimed, &case)))
    }
    /// Add prerequisite id prefixes.
    pub fn after(mut self, deps: impl IntoIterator<Item = String>) -> Case {
        self.deps.extend(deps);
        self
    }
}

/// One op call with operands and the expected outputs.
#[derive(Debug, Clone)]
pub struct OpCase {
    /// The op.
    pub op: Op,
    /// Inputs.
    pub inputs: Vec<Spec>,
    /// Outputs (values are initial contents for in-place ops).
    pub outputs: Vec<Spec>,
    /// Expected contents per output (`None`: not checked, e.g. an argmax of ties).
    pub expected: Vec<Option<Expected>>,
}

impl OpCase {
    /// A case with one output, checked against `expected`.
    pub fn single(op: Op, inputs: Vec<Spec>, output: Spec, expected: Expected) -> OpCase {
        OpCase { op, inputs, outputs: vec![output], expected: vec![Some(expected)] }
    }
}

/// Run `case` on `target`: place operands, execute, compare outputs and guard regions.
/// An `Unsupported` error becomes `NotSupported`; the caller turns that into a failure when
/// the pair is claimed.
pub fn run_op(target: &Target, case: &OpCase) -> Outcome {
    match try_run_op(target, case) {
        Ok(outcome) => outcome,
        Err(e) => Outcome::error(e),
    }
}

fn try_run_op(target: &Target, case: &OpCase) -> Result<Outcome, String> {
    let mut scope = Scope::new(target);
    let inputs = case.inputs.iter().map(|s| scope.place(s)).collect::<Result<Vec<_>, _>>()?;
    let outputs = case.outputs.iter().map(|s| scope.place(s)).collect::<Result<Vec<_>, _>>()?;
    let in_descs: Vec<_> = inputs.iter().map(|p| p.desc).collect();
    let out_descs: Vec<_> = outputs.iter().map(|p| p.desc).collect();
    if let Err(e) = target.device.execute(&case.op, &in_descs, &out_descs) {
        let status = if e.kind() == ErrorKind::Unsupported { Status::NotSupported } else { Status::Error };
        return Ok(Outcome::with(status, format!("{}: {e}", e.kind())));
    }
    for (i, (placed, expected)) in outputs.iter().zip(&case.expected).enumerate() {
        let (values, stray) = scope.fetch(placed)?;
        if let Some(&first) = stray.first() {
            return Ok(Outcome::fail(format!(
                "output {i}: {} byte(s) outside the view were written (first at byte {first} of {})",
                stray.len(),
                placed.bytes
            )));
        }
        let Some(expected) = expected else { continue };
        let cmp = compare(expected, &values);
        if cmp.mismatches > 0 {
            let worst_inputs = cmp.worst.as_ref().map_or(Vec::new(), |w| inputs_at(case, w.index, values.len()));
            let mut o = Outcome::fail(match &cmp.worst {
                Some(w) => format!(
                    "output {i}: {}/{} elements out of tolerance; worst at flat index {}: expected {:e}, got {:e}, allowed error {:.3e}{}",
                    cmp.mismatches,
                    cmp.numel,
                    w.index,
                    w.expected,
                    w.actual,
                    w.allowed,
                    describe_inputs(&worst_inputs)
                ),
                None => format!("output {i}: {} elements, expected {}", values.len(), expected.values.len()),
            });
            o.worst_inputs = worst_inputs;
            o.worst = cmp.worst.map(|w| (format!("output {i}"), w));
            o.mismatches = Some((cmp.mismatches, cmp.numel));
            o.tolerance = Some(expected.describe.clone());
            return Ok(o);
        }
    }
    scope.finish()?;
    let mut o = Outcome::pass();
    o.tolerance = case.expected.iter().flatten().next().map(|e| e.describe.clone());
    Ok(o)
}

/// The inputs' values at flat output index `index` (of `numel`): each input holding as many
/// elements as the output (read at the same index) or a single one. Inputs of other sizes
/// (reductions, matrix products, broadcasts) are left out: no one element of them explains
/// the output element.
pub fn inputs_at(case: &OpCase, index: usize, numel: usize) -> Vec<(usize, f64)> {
    case.inputs
        .iter()
        .enumerate()
        .filter_map(|(k, s)| match s.values.len() {
            1 => Some((k, s.values[0])),
            n if n == numel => s.values.get(index).map(|&v| (k, v)),
            _ => None,
        })
        .collect()
}

/// `"; inputs there: input 0 = 2.5e0, input 1 = -1e0"`, or nothing without inputs.
pub fn describe_inputs(inputs: &[(usize, f64)]) -> String {
    if inputs.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = inputs.iter().map(|(k, v)| format!("input {k} = {v:e}")).collect();
    format!("; inputs there: {}", parts.join(", "))
}

/// Run an op case for an (op, dtype) pair: claimed pairs must pass; unclaimed ones are
/// `NotSupported` when the backend refuses them cleanly and fail otherwise.
pub fn run_claimed(target: &Target, claimed: bool, case: &OpCase) -> Outcome {
    let outcome = run_op(target, case);
    match (claimed, outcome.status) {
        (true, Status::NotSupported) => {
            Outcome::fail(format!("claimed in the capability list but refused: {}", outcome.message))
        }
        (true, _) => outcome,
        (false, Status::NotSupported) => outcome,
        (false, Status::Pass) => {
            Outcome::fail("not claimed in the capability list, yet it ran (an unclaimed op must be `Unsupported`)")
        }
        (false, _) => Outcome::fail(format!(
            "not claimed, so the call must fail with `Unsupported`; instead: {} {}",
            outcome.status, outcome.message
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use genesis_backend_api::DType;

    #[test]
    fn a_failure_names_the_inputs_at_the_worst_element() {
        let case = OpCase {
            op: Op::Binary(genesis_backend_api::BinaryOp::Add),
            inputs: vec![
                Spec::new(DType::F32, &[2, 2], vec![1.0, 2.0, 3.0, 4.0]),
                Spec::new(DType::F32, &[], vec![0.5]),
                Spec::new(DType::F32, &[2], vec![7.0, 8.0]), // broadcast: left out
            ],
            outputs: vec![Spec::out(DType::F32, &[2, 2])],
            expected: vec![None],
        };
        let inputs = inputs_at(&case, 2, 4);
        assert_eq!(inputs, [(0, 3.0), (1, 0.5)]);
        assert_eq!(describe_inputs(&inputs), "; inputs there: input 0 = 3e0, input 1 = 5e-1");
        assert_eq!(describe_inputs(&[]), "");
        // The JSON report carries them and reads them back.
        let mut o = Outcome::fail("x");
        o.worst_inputs = vec![(0, 3.0), (1, f64::NAN)];
        let back = crate::runner::outcome_from_json(&crate::runner::outcome_json(&o)).unwrap();
        assert_eq!(back.worst_inputs[0], (0, 3.0));
        assert!(back.worst_inputs[1].1.is_nan());
    }
}
