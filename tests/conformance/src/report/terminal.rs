//! The terminal report: header, ops × dtypes table, suites line, failures with a reproduction
//! command, the required set's coverage per float dtype, summary, verdict (conformant for the
//! claims or not) and a line saying for which dtypes the claims cover the required set.

use super::Run;
use crate::case::Status;
use crate::required::split;
use crate::runner::CaseResult;
use crate::suites::SUITES;
use crate::values::{from_short_name, short_name};
use genesis_backend_api::DType;
use std::collections::BTreeMap;

/// `suite/op/dtype/sample` → (op, dtype) for op cases.
fn op_and_dtype(id: &str) -> Option<(String, DType)> {
    let parts: Vec<&str> = id.split('/').collect();
    if parts.len() != 4 {
        return None;
    }
    from_short_name(parts[2]).map(|d| (parts[1].to_string(), d))
}

fn cell(results: &[&CaseResult]) -> String {
    let n = results.len();
    let count = |s: Status| results.iter().filter(|r| r.outcome.status == s).count();
    let failed = results.iter().filter(|r| r.outcome.status.is_failure()).count();
    let pass = count(Status::Pass) + count(Status::XPass);
    if failed > 0 {
        format!("✗ {pass}/{n}")
    } else if count(Status::NotSupported) == n {
        "NS".into()
    } else if count(Status::Blocked) > 0 {
        format!("B {pass}/{n}")
    } else if count(Status::XFail) > 0 {
        format!("x {pass}/{n}")
    } else if pass + count(Status::Skipped) + count(Status::NotSupported) == n && pass > 0 {
        format!("✓ {pass}/{n}")
    } else {
        format!("- {pass}/{n}")
    }
}

/// The report as text.
pub fn terminal_report(run: &Run) -> String {
    let t = run.target;
    let mut s = format!(
        "genesis-conformance {} · interface {} · backend {} {} ({}, interface {})\n",
        env!("CARGO_PKG_VERSION"),
        genesis_backend_api::API_VERSION,
        t.info.name,
        t.info.version,
        t.origin,
        t.api
    );
    s += &format!(
        "device {} \"{}\" · thread_safe {} · {} claims · tier {} · isolation {:?}{}\n\n",
        t.index,
        t.props.name,
        t.props.thread_safe,
        t.capabilities.len(),
        run.cfg.tier.name(),
        run.cfg.isolation,
        run.cfg
            .expectations
            .as_ref()
            .map(|e| format!(" · expectations {} ({} entries)", e.path, e.entries.len()))
            .unwrap_or_default()
    );
    let outside = t.claims_outside_domains();
    if !outside.is_empty() {
        s += &format!(
            "warning: {} claims outside their op's published domain (Op::domain): {}\n\n",
            outside.len(),
            outside.join(", ")
        );
    }
    let mut table: BTreeMap<(usize, String), BTreeMap<DType, Vec<&CaseResult>>> = BTreeMap::new();
    for r in run.results {
        if let Some((op, dtype)) = op_and_dtype(&r.id) {
            let order = SUITES.iter().position(|x| *x == r.suite).unwrap_or(99);
            table.entry((order, op)).or_default().entry(dtype).or_default().push(r);
        }
    }
    let dtypes: Vec<DType> = DType::ALL.into_iter().filter(|d| table.values().any(|row| row.contains_key(d))).collect();
    s += &format!("{:<24}", "op");
    for d in &dtypes {
        s += &format!("{:<12}", short_name(*d));
    }
    s += "\n";
    for ((_, op), row) in &table {
        s += &format!("{op:<24}");
        for d in &dtypes {
            s += &format!("{:<12}", row.get(d).map(|r| cell(r)).unwrap_or_else(|| "—".into()));
        }
        s += "\n";
    }
    s += "\nsuites:";
    for suite in SUITES {
        let rs: Vec<&CaseResult> = run.results.iter().filter(|r| r.suite == *suite).collect();
        if !rs.is_empty() {
            s += &format!(" {suite} {}", cell(&rs));
        }
    }
    s += "\n";
    for r in run.unexpected() {
        s += &format!("\n{:<8} {}\n         {}\n", r.outcome.status.name().to_uppercase(), r.id, r.outcome.message);
        if let Some(tol) = &r.outcome.tolerance {
            s += &format!("         tolerance: {tol}\n");
        }
        if r.outcome.status != Status::Blocked {
            s += &format!("         repro: {}\n", run.repro(&r.id));
        }
    }
    let stale = run.stale_expectations();
    for line in &stale {
        s += &format!("\nSTALE    {line}");
    }
    if !stale.is_empty() {
        s += "\n";
    }
    s += &required_block(run);
    s += "\nSummary:";
    for (status, n) in run.counts() {
        s += &format!(" {n} {status} ·");
    }
    s.pop();
    s += &format!(" ({} cases, {:.1} s)\n", run.results.len(), run.duration_ms as f64 / 1000.0);
    s += &if run.conformant() {
        format!("Verdict: CONFORMANT for its claims (tier {}): no unexpected results\n", run.cfg.tier.name())
    } else {
        format!(
            "Verdict: NOT CONFORMANT (tier {}): {} unexpected result(s)\n",
            run.cfg.tier.name(),
            run.unexpected().len()
        )
    };
    s += &required_line(run);
    s
}

/// Width the lists of missing pairs are folded at.
const WIDTH: usize = 100;

/// `items` joined with ", ", folded at [`WIDTH`] with continuation lines indented by `indent`
/// (the first line starts after `first` columns of other text).
fn fold(items: &[String], first: usize, indent: usize) -> String {
    let mut out = String::new();
    let mut column = first;
    for (i, item) in items.iter().enumerate() {
        let piece = if i + 1 < items.len() { format!("{item},") } else { item.clone() };
        if i > 0 {
            if column + 1 + piece.chars().count() > WIDTH {
                out += &format!("\n{:indent$}", "");
                column = indent;
            } else {
                out.push(' ');
                column += 1;
            }
        }
        column += piece.chars().count();
        out += &piece;
    }
    out
}

/// The required-set block: one line per float dtype, covered or the pairs that are missing.
fn required_block(run: &Run) -> String {
    let mut s = String::from(
        "\nRequired set (sdk::required: what the core needs for tensors, autograd and training in a dtype):\n",
    );
    for c in run.coverage() {
        let dtype = short_name(c.dtype);
        if c.covered() {
            s += &format!("  {dtype:<5} covered: all {} pairs claimed\n", c.required);
        } else {
            let head = format!("  {dtype:<5} not covered: {} of {} pairs missing: ", c.missing.len(), c.required);
            s += &format!("{head}{}\n", fold(&c.missing_names(), head.chars().count(), 8));
        }
    }
    s
}

/// The line after the verdict: the dtypes whose required set the claims cover, and whether
/// `--require` is met.
fn required_line(run: &Run) -> String {
    let (covered, not) = split(&run.coverage());
    let mut s = match (covered.is_empty(), not.is_empty()) {
        (false, true) => format!("Required set: covered for {}", covered.join(", ")),
        (false, false) => {
            format!(
                "Required set: covered for {}; not covered for {} (missing pairs above)",
                covered.join(", "),
                not.join(", ")
            )
        }
        _ => format!("Required set: not covered for any float dtype ({}; missing pairs above)", not.join(", ")),
    };
    if !run.cfg.require.is_empty() {
        let wanted: Vec<&str> = run.cfg.require.iter().map(|&d| short_name(d)).collect();
        let unmet: Vec<&str> = run.unmet_requirements().into_iter().map(short_name).collect();
        s += &if unmet.is_empty() {
            format!(" · --require {}: met", wanted.join(","))
        } else {
            format!(" · --require {}: NOT MET for {}", wanted.join(","), unmet.join(", "))
        };
    }
    s + "\n"
}
