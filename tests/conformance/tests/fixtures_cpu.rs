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
