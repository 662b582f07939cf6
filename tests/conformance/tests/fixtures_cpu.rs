//! The rstest fixtures as a plugin author uses them, here on the configured backend
//! (`GENESIS_CONFORMANCE_BACKEND`, default: the CPU backend) with the CPU's expectations.

use genesis_conformance::expectations::Expectations;
use genesis_conformance::fixtures::{backend, run_suite};
use genesis_conformance::target::Target;
use rstest::rstest;

fn cpu_expectations(target: &Target) -> Option<Expectations> {
    (target.info.name == "cpu").then(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/expectations/cpu.txt");
        Expectations::load(path).expect("the CPU expectations file parses")
    })
}

#[rstest]
#[case::load("load")]
#[case::memory("memory")]
#[case::data("data")]
#[case::elementwise("elementwise")]
#[case::reduce("reduce")]
#[case::linalg("linalg")]
#[case::nn("nn")]
#[case::backward("backward")]
#[case::rng("rng")]
#[case::errors("errors")]
#[case::accounting("accounting")]
fn core_tier_suite_passes(backend: &'static Target, #[case] suite: &str) {
    run_suite(backend, suite, cpu_expectations(backend).as_ref()).assert_all_passed();
}

/// A worker process builds only its suite's cases: they must be exactly that suite's cases of
/// the whole list, in the same order.
#[rstest]
fn suite_cases_are_the_suites_share_of_all_cases(backend: &'static Target) {
    use genesis_conformance::suites::{all_cases, suite_cases, SUITES};
    let all: Vec<(String, &str)> = all_cases(backend).into_iter().map(|c| (c.id, c.suite)).collect();
    for suite in SUITES {
        let ids: Vec<String> = suite_cases(backend, &[suite]).into_iter().map(|c| c.id).collect();
        let expected: Vec<String> = all.iter().filter(|(_, s)| s == suite).map(|(id, _)| id.clone()).collect();
        assert!(!expected.is_empty(), "suite {suite} has no case");
        assert_eq!(ids, expected, "suite {suite}");
    }
    assert!(all.iter().all(|(_, s)| SUITES.contains(s)), "a case of an unlisted suite");
}
