//! The suites, in dependency order. Each returns its cases; the runner runs them in this
//! order and blocks a case whose prerequisite failed.

mod accounting;
mod backward;
mod collective;
mod conv;
mod data;
mod elementwise;
mod errors;
mod graph;
mod interface;
mod linalg;
mod memory;
mod nn;
mod reduce;
mod rng;
mod threads;

use crate::case::{Case, OpCase, Tier};
use crate::target::Target;
use crate::values::{short_name, Rng};
use genesis_backend_api::{DType, OpKind};

/// Suite names in run order.
pub const SUITES: &[&str] = &[
    "load",
    "memory",
    "data",
    "elementwise",
    "reduce",
    "linalg",
    "nn",
    "backward",
    "rng",
    "collective",
    "graph",
    "errors",
    "accounting",
    "threads",
];

/// A suite module's case builder.
type Cases = fn(&Target) -> Vec<Case>;

/// Each suite module's builder, in run order, with the suites its cases belong to. A worker
/// process builds only the modules of the suite it runs: building every case (inputs and
/// reference results) takes seconds, and a run starts a worker per suite.
const MODULES: &[(Cases, &[&str])] = &[
    (interface::cases, &["load"]),
    (memory::cases, &["memory"]),
    (data::cases, &["data"]),
    (elementwise::cases, &["elementwise"]),
    (reduce::cases, &["reduce"]),
    (linalg::cases, &["linalg"]),
    (nn::cases, &["nn"]),
    (conv::cases, &["nn"]),
    (backward::cases, &["backward"]),
    (rng::cases, &["rng"]),
    (collective::cases, &["collective"]),
    (graph::cases, &["graph"]),
    (errors::cases, &["errors"]),
    (accounting::cases, &["accounting"]),
    (threads::cases, &["threads"]),
];

/// Every case for `target`, in run order.
pub fn all_cases(target: &Target) -> Vec<Case> {
    MODULES.iter().flat_map(|(cases, _)| cases(target)).collect()
}

/// The cases of the suites `suites` (names of [`SUITES`]), in run order.
pub fn suite_cases(target: &Target, suites: &[&str]) -> Vec<Case> {
    MODULES
        .iter()
        .filter(|(_, of)| of.iter().any(|s| suites.contains(s)))
        .flat_map(|(cases, _)| cases(target))
        .filter(|c| suites.contains(&c.suite))
        .collect()
}

/// Prerequisites of every op case of `dtype`: the memory round trip of that dtype.
pub fn memory_deps(dtype: DType) -> Vec<String> {
    vec!["load/".into(), format!("memory/roundtrip/{}", short_name(dtype))]
}

/// A sample builder: the samples of one op for one dtype, each `(name, tier, case)`.
pub type Builder<'a> = dyn Fn(DType, &mut Rng) -> Vec<(String, Tier, OpCase)> + 'a;

/// Cases `suite/name/dtype/sample` for every dtype of `domain`: all samples when the backend
/// claims (kind, dtype), else one honesty probe that must be refused with `Unsupported`.
pub fn op_cases(
    target: &Target,
    suite: &'static str,
    name: &str,
    kind: OpKind,
    domain: &[DType],
    extra_deps: &dyn Fn(DType) -> Vec<String>,
    build: &Builder<'_>,
) -> Vec<Case> {
    let mut cases = Vec::new();
    for &dtype in domain {
        let claimed = target.claims(kind, dtype);
        let dt = short_name(dtype);
        let mut rng = Rng::for_id(&format!("{suite}/{name}/{dt}"));
        let samples = build(dtype, &mut rng);
        let mut deps = memory_deps(dtype);
        deps.extend(extra_deps(dtype));
        if claimed {
            for (i, (sample, tier, case)) in samples.into_iter().enumerate() {
                let tier = if i == 0 { Tier::Smoke } else { tier };
                cases.push(Case::op(suite, format!("{name}/{dt}/{sample}"), tier, true, case).after(deps.clone()));
            }
        } else if let Some((_, _, case)) = samples.into_iter().next() {
            cases.push(Case::op(suite, format!("{name}/{dt}/unclaimed"), Tier::Smoke, false, case).after(deps.clone()));
        }
    }
    cases
}

/// A builder's one sample, `sample`, at tier core ([`op_cases`] runs a first sample at smoke).
pub fn only_sample(sample: &str, case: OpCase) -> Vec<(String, Tier, OpCase)> {
    vec![(sample.to_string(), Tier::Core, case)]
}

/// No extra prerequisites.
pub fn no_deps(_: DType) -> Vec<String> {
    Vec::new()
}
