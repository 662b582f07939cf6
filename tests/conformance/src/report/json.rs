//! The JSON report. The schema name carries its version; fields are only added within one.
//! `verdict.conformant` is about the backend's claims; `required_set` has the coverage of the
//! SDK's required set per float dtype (with the missing pairs), `verdict.covers_required_set`
//! the dtypes it covers, and `verdict.require_met` whether `--require` is satisfied.

use super::Run;
use crate::required::split;
use crate::runner::outcome_json;
use crate::values::short_name;
use serde_json::{json, Value};

/// Schema identifier of [`json_report`].
pub const SCHEMA: &str = "genesis-conformance-report/1";

/// The whole run as one JSON object.
pub fn json_report(run: &Run) -> Value {
    let t = run.target;
    let coverage = run.coverage();
    let summary: serde_json::Map<String, Value> =
        run.counts().into_iter().map(|(s, n)| (s.name().to_string(), json!(n))).collect();
    json!({
        "schema": SCHEMA,
        "suite": {
            "version": env!("CARGO_PKG_VERSION"),
            "interface": genesis_backend_api::API_VERSION.to_string(),
            "tier": run.cfg.tier.name(),
            "filters": run.cfg.filters,
            "isolation": format!("{:?}", run.cfg.isolation).to_lowercase(),
        },
        "backend": {
            "arg": run.cfg.backend,
            "name": t.info.name, "vendor": t.info.vendor, "version": t.info.version,
            "origin": t.origin, "interface": t.api.to_string(),
            "claims": t.capabilities.len(),
            "claims_outside_domains": t.claims_outside_domains(),
        },
        "device": {
            "index": t.index, "name": t.props.name, "total_memory": t.props.total_memory,
            "thread_safe": t.props.thread_safe,
        },
        "duration_ms": run.duration_ms as u64,
        "expectations": run.cfg.expectations.as_ref().map(|e| json!({
            "file": e.path, "entries": e.entries.len(), "stale": run.stale_expectations(),
        })),
        "summary": summary,
        "verdict": {
            "conformant": run.conformant(),
            "unexpected": run.unexpected().len(),
            "covers_required_set": split(&coverage).0,
            "require": run.cfg.require.iter().map(|&d| short_name(d)).collect::<Vec<_>>(),
            "require_met": run.requirement_met(),
        },
        "required_set": coverage.iter().map(|c| c.to_json()).collect::<Vec<_>>(),
        "results": run.results.iter().map(|r| {
            let mut o = outcome_json(&r.outcome);
            o["id"] = json!(r.id);
            o["suite"] = json!(r.suite);
            o["duration_ms"] = json!(r.duration_ms as u64);
            o["expectation"] = json!(r.expectation.as_ref().map(|(g, reason)| json!({"glob": g, "reason": reason})));
            if r.outcome.status.is_failure() {
                o["repro"] = json!(run.repro(&r.id));
            }
            o
        }).collect::<Vec<_>>(),
    })
}
