//! `rstest` fixtures for plugin authors: the core tier inside their own `cargo test`.
//!
//! ```ignore
//! use genesis_conformance::fixtures::{backend, run_suite};
//! use genesis_conformance::target::Target;
//! use rstest::rstest;
//!
//! // GENESIS_CONFORMANCE_BACKEND=/path/to/libgenesis_backend_mine.so cargo test
//! #[rstest]
//! fn elementwise(backend: &'static Target) {
//!     run_suite(backend, "elementwise", None).assert_all_passed();
//! }
//! ```
//!
//! libtest knows only pass and fail, and runs these in-process: a crashing case takes the
//! test binary down. The CLI, with its child processes and statuses, is the authority.

use crate::case::{Status, Tier};
use crate::expectations::{Action, Expectations};
use crate::runner::{run_in_process, CaseResult};
use crate::suites::suite_cases;
use crate::target::Target;
use rstest::fixture;
use std::sync::OnceLock;

/// The environment variable naming the backend (a name or a plugin path).
pub const BACKEND_VAR: &str = "GENESIS_CONFORMANCE_BACKEND";

/// The backend under test, opened once per test process from `GENESIS_CONFORMANCE_BACKEND`
/// (default `cpu`). Panics with the loader's message when it cannot be opened: in a test,
/// that is the failure to report.
#[fixture]
#[once]
pub fn backend() -> &'static Target {
    static TARGET: OnceLock<Target> = OnceLock::new();
    TARGET.get_or_init(|| {
        let name = std::env::var(BACKEND_VAR).unwrap_or_else(|_| "cpu".into());
        Target::open(&name, 0).unwrap_or_else(|e| panic!("{BACKEND_VAR}={name}: {e}"))
    })
}

/// The results of one suite's core-tier cases, run in this process.
pub struct SuiteResults(pub Vec<CaseResult>);

impl SuiteResults {
    /// Panic listing every case that failed (not-supported cases are fine).
    pub fn assert_all_passed(&self) {
        let failed: Vec<String> = self
            .0
            .iter()
            .filter(|r| r.outcome.status.is_failure())
            .map(|r| format!("{} {}: {}", r.outcome.status, r.id, r.outcome.message))
            .collect();
        assert!(failed.is_empty(), "{} case(s) failed:\n{}", failed.len(), failed.join("\n"));
        assert!(self.0.iter().any(|r| r.outcome.status == Status::Pass), "no case of the suite passed");
    }
}

/// Run the core-tier cases of `suite` (no dependency blocking: each case stands alone),
/// applying `expectations` (`skip` entries are not run, failures of `xfail` entries become
/// `xfail`).
pub fn run_suite(target: &Target, suite: &str, expectations: Option<&Expectations>) -> SuiteResults {
    let results = suite_cases(target, &[suite])
        .into_iter()
        .filter(|c| c.tier <= Tier::Core)
        .filter_map(|c| {
            let entry = expectations.and_then(|e| e.lookup(&c.id));
            if entry.is_some_and(|e| e.action == Action::Skip) {
                return None;
            }
            let (mut outcome, ms) = run_in_process(target, &c);
            if entry.is_some_and(|e| e.action == Action::XFail) && outcome.status.is_failure() {
                outcome.status = Status::XFail;
            }
            let expectation = entry.map(|e| (e.glob.clone(), e.reason.clone()));
            Some(CaseResult { id: c.id, suite: suite.to_string(), outcome, duration_ms: ms, expectation })
        })
        .collect();
    SuiteResults(results)
}
