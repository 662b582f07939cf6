//! Reports: the terminal table, JSON (versioned schema) and JUnit XML.

mod json;
mod junit;
mod terminal;

pub use json::{json_report, SCHEMA};
pub use junit::junit_report;
pub use terminal::terminal_report;

use crate::case::Status;
use crate::required::Coverage;
use crate::runner::{CaseResult, RunConfig};
use crate::target::Target;
use genesis_backend_api::DType;

/// Everything a report needs.
pub struct Run<'a> {
    /// The backend.
    pub target: &'a Target,
    /// The configuration.
    pub cfg: &'a RunConfig,
    /// Results in run order.
    pub results: &'a [CaseResult],
    /// Wall time of the run.
    pub duration_ms: u128,
}

impl Run<'_> {
    /// Count of each status.
    pub fn counts(&self) -> Vec<(Status, usize)> {
        Status::ALL.iter().map(|&s| (s, self.results.iter().filter(|r| r.outcome.status == s).count())).collect()
    }

    /// Unexpected results: failures of any kind, and blocked cases.
    pub fn unexpected(&self) -> Vec<&CaseResult> {
        self.results.iter().filter(|r| r.outcome.status.is_failure() || r.outcome.status == Status::Blocked).collect()
    }

    /// True when nothing failed in the requested tier: the backend is conformant for its
    /// claims (which says nothing about how much it claims; see [`Run::coverage`]).
    pub fn conformant(&self) -> bool {
        self.unexpected().is_empty()
    }

    /// Coverage of the SDK's required set by the claims, per float dtype.
    pub fn coverage(&self) -> Vec<Coverage> {
        self.target.coverage()
    }

    /// The `--require` dtypes whose required set the claims do not cover.
    pub fn unmet_requirements(&self) -> Vec<DType> {
        let cover = self.coverage();
        self.cfg.require.iter().copied().filter(|d| cover.iter().any(|c| c.dtype == *d && !c.covered())).collect()
    }

    /// True when the claims cover the required set of every `--require` dtype (always true
    /// without `--require`).
    pub fn requirement_met(&self) -> bool {
        self.unmet_requirements().is_empty()
    }

    /// Expectations entries that matched no case, or whose xfail cases all passed.
    pub fn stale_expectations(&self) -> Vec<String> {
        let Some(exp) = &self.cfg.expectations else { return Vec::new() };
        exp.entries
            .iter()
            .filter_map(|e| {
                let matched: Vec<&CaseResult> =
                    self.results.iter().filter(|r| r.expectation.as_ref().is_some_and(|(g, _)| *g == e.glob)).collect();
                if matched.is_empty() {
                    Some(format!("{}:{}: `{}` matches no case", exp.path, e.line, e.glob))
                } else if matched.iter().all(|r| r.outcome.status == Status::XPass) {
                    Some(format!("{}:{}: `{}`: every matching case passes", exp.path, e.line, e.glob))
                } else {
                    None
                }
            })
            .collect()
    }

    /// The command that reruns one case.
    pub fn repro(&self, id: &str) -> String {
        format!(
            "genesis-conformance --backend {} --device {} --tier full --isolation none --filter '{id}'",
            self.cfg.backend, self.cfg.device
        )
    }
}
