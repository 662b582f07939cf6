//! Running cases: in this process, or in child processes (the CLI re-executed as a worker)
//! so that a crash or hang of one case is contained and the run goes on.

use crate::case::{Case, Outcome, Status, Tier};
use crate::expectations::{glob_match, Action, Expectations};
use crate::suites::{all_cases, suite_cases, SUITES};
use crate::target::Target;
use crate::tolerance::Worst;
use genesis_backend_api::DType;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Where cases run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// In this process (fast; a crash ends the run).
    None,
    /// In a worker child process per suite, restarted after a crash or timeout.
    Process,
}

/// What to run and how.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// `--backend` as given.
    pub backend: String,
    /// `--device`.
    pub device: usize,
    /// `--tier`.
    pub tier: Tier,
    /// `--filter` globs (a case runs when it matches any; none means all).
    pub filters: Vec<String>,
    /// `--isolation`.
    pub isolation: Isolation,
    /// Per-case time limit (process isolation only).
    pub timeout: Duration,
    /// `--expectations`.
    pub expectations: Option<Expectations>,
    /// `--require`: float dtypes whose required set the claims must cover for exit code 0.
    pub require: Vec<DType>,
    /// The harness executable to re-run as a worker.
    pub exe: PathBuf,
}

/// The result of one case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// Case id.
    pub id: String,
    /// Suite.
    pub suite: String,
    /// Outcome.
    pub outcome: Outcome,
    /// Wall time.
    pub duration_ms: u128,
    /// The expectations entry that applied (glob and reason).
    pub expectation: Option<(String, String)>,
}

/// Cases of `tier` that pass the filters, in run order.
pub fn selected_cases(target: &Target, cfg: &RunConfig) -> Vec<Case> {
    all_cases(target)
        .into_iter()
        .filter(|c| c.tier <= cfg.tier)
        .filter(|c| cfg.filters.is_empty() || cfg.filters.iter().any(|f| glob_match(f, &c.id)))
        .collect()
}

/// Run one case here, turning a panic of the harness into an `Error`.
pub fn run_in_process(target: &Target, case: &Case) -> (Outcome, u128) {
    let start = Instant::now();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (case.run)(target))).unwrap_or_else(|p| {
        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        Outcome::error(format!("the harness panicked: {}", msg.unwrap_or_default()))
    });
    (outcome, start.elapsed().as_millis())
}

/// Run every selected case; statuses of prerequisites decide `blocked`.
pub fn run(target: &Target, cfg: &RunConfig, mut progress: impl FnMut(&CaseResult)) -> Vec<CaseResult> {
    let cases = selected_cases(target, cfg);
    let mut results: Vec<CaseResult> = Vec::new();
    let mut failed_ids: Vec<String> = Vec::new();
    for suite in SUITES {
        let suite_cases: Vec<&Case> = cases.iter().filter(|c| c.suite == *suite).collect();
        let mut pending: Vec<&Case> = Vec::new();
        for case in suite_cases {
            let entry = cfg.expectations.as_ref().and_then(|e| e.lookup(&case.id));
            let blocker = case.deps.iter().find_map(|d| failed_ids.iter().find(|f| f.starts_with(d.as_str())));
            let pre = if let Some(e) = entry.filter(|e| e.action == Action::Skip) {
                Some(Outcome::with(Status::Skipped, format!("expectations: {}", e.reason)))
            } else {
                blocker.map(|b| Outcome::with(Status::Blocked, format!("prerequisite {b} failed")))
            };
            match pre {
                Some(outcome) => {
                    if outcome.status == Status::Blocked {
                        failed_ids.push(case.id.clone());
                    }
                    let r = CaseResult {
                        id: case.id.clone(),
                        suite: suite.to_string(),
                        outcome,
                        duration_ms: 0,
                        expectation: entry.map(|e| (e.glob.clone(), e.reason.clone())),
                    };
                    progress(&r);
                    results.push(r);
                }
                None => pending.push(case),
            }
        }
        let mut record = |id: &str, outcome: Outcome, ms: u128| {
            let entry = cfg.expectations.as_ref().and_then(|e| e.lookup(id));
            let mut outcome = outcome;
            if let Some(e) = entry.filter(|e| e.action == Action::XFail) {
                outcome.status = match outcome.status {
                    s if s.is_failure() => Status::XFail,
                    Status::Pass => Status::XPass,
                    s => s,
                };
                if outcome.status == Status::XFail {
                    outcome.message = format!("expected failure ({}): {}", e.reason, outcome.message);
                }
            }
            if outcome.status.is_failure() {
                failed_ids.push(id.to_string());
            }
            let r = CaseResult {
                id: id.to_string(),
                suite: suite.to_string(),
                outcome,
                duration_ms: ms,
                expectation: entry.map(|e| (e.glob.clone(), e.reason.clone())),
            };
            progress(&r);
            results.push(r);
        };
        match cfg.isolation {
            Isolation::None => {
                for case in pending {
                    let (outcome, ms) = run_in_process(target, case);
                    record(&case.id, outcome, ms);
                }
            }
            Isolation::Process => {
                let ids: Vec<String> = pending.iter().map(|c| c.id.clone()).collect();
                run_batch(cfg, &ids, &mut record);
            }
        }
    }
    results
}

/// Serialize an outcome for the worker protocol and the JSON report.
pub fn outcome_json(o: &Outcome) -> Value {
    json!({
        "status": o.status.name(),
        "message": o.message,
        "worst": o.worst.as_ref().map(|(output, w)| json!({
            "output": output, "index": w.index, "expected": fmt_f(w.expected), "actual": fmt_f(w.actual), "allowed": w.allowed
        })),
        "mismatches": o.mismatches.map(|(m, n)| json!({"mismatches": m, "numel": n})),
        "tolerance": o.tolerance,
        "worst_inputs": o.worst_inputs.iter().map(|(k, v)| json!({"input": k, "value": fmt_f(*v)})).collect::<Vec<_>>(),
    })
}

/// Numbers as JSON values, with NaN and infinities as strings (JSON has no such numbers).
fn fmt_f(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        json!(x.to_string())
    }
}

fn parse_f(v: &Value) -> f64 {
    v.as_f64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or(f64::NAN)
}

/// The inverse of [`outcome_json`].
pub fn outcome_from_json(v: &Value) -> Option<Outcome> {
    let status = Status::from_name(v.get("status")?.as_str()?)?;
    let mut o = Outcome::with(status, v.get("message").and_then(Value::as_str).unwrap_or_default());
    o.tolerance = v.get("tolerance").and_then(Value::as_str).map(str::to_string);
    o.mismatches = v
        .get("mismatches")
        .filter(|m| !m.is_null())
        .map(|m| (m["mismatches"].as_u64().unwrap_or(0) as usize, m["numel"].as_u64().unwrap_or(0) as usize));
    o.worst_inputs = v
        .get("worst_inputs")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|x| (x["input"].as_u64().unwrap_or(0) as usize, parse_f(&x["value"]))).collect())
        .unwrap_or_default();
    o.worst = v.get("worst").filter(|w| !w.is_null()).map(|w| {
        (
            w["output"].as_str().unwrap_or_default().to_string(),
            Worst {
                index: w["index"].as_u64().unwrap_or(0) as usize,
                expected: parse_f(&w["expected"]),
                actual: parse_f(&w["actual"]),
                allowed: w["allowed"].as_f64().unwrap_or(0.0),
            },
        )
    });
    Some(o)
}

/// The worker side: run the cases listed in `ids_file`, one `START`/`RESULT` line pair each.
pub fn worker(target: &Target, ids_file: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(ids_file).map_err(|e| format!("{ids_file}: {e}"))?;
    let mut suites: Vec<&str> = text.lines().filter_map(|id| id.split('/').next()).collect();
    suites.dedup();
    let cases: HashMap<String, Case> = suite_cases(target, &suites).into_iter().map(|c| (c.id.clone(), c)).collect();
    let mut out = std::io::stdout();
    for id in text.lines().filter(|l| !l.is_empty()) {
        writeln!(out, "START {id}").and_then(|_| out.flush()).map_err(|e| e.to_string())?;
        let (outcome, ms) = match cases.get(id) {
            Some(case) => run_in_process(target, case),
            None => (Outcome::error(format!("the worker has no case {id}")), 0),
        };
        let line = json!({"id": id, "ms": ms as u64, "outcome": outcome_json(&outcome)});
        writeln!(out, "RESULT {line}").and_then(|_| out.flush()).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// How long a worker may take to load the backend and reach its first case (or the next one).
const WORKER_START_LIMIT: Duration = Duration::from_secs(60);

fn run_batch(cfg: &RunConfig, ids: &[String], record: &mut dyn FnMut(&str, Outcome, u128)) {
    let mut remaining: Vec<String> = ids.to_vec();
    let mut attempt = 0;
    while !remaining.is_empty() {
        attempt += 1;
        let file = std::env::temp_dir().join(format!("genesis-conformance-{}-{attempt}.ids", std::process::id()));
        if let Err(e) = std::fs::write(&file, remaining.join("\n")) {
            for id in remaining.drain(..) {
                record(&id, Outcome::error(format!("cannot write {}: {e}", file.display())), 0);
            }
            return;
        }
        let child = Command::new(&cfg.exe)
            .args(["--worker", "--backend", &cfg.backend, "--device", &cfg.device.to_string(), "--ids-file"])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                for id in remaining.drain(..) {
                    record(&id, Outcome::error(format!("cannot start a worker: {e}")), 0);
                }
                return;
            }
        };
        let (tx, rx) = mpsc::channel::<String>();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let stderr_tail = child.stderr.take().map(|mut err| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = err.read_to_string(&mut s);
                let start = s.len().saturating_sub(600);
                let start = (start..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(s.len());
                s[start..].trim().to_string()
            })
        });
        let mut current: Option<(String, Instant)> = None;
        let mut progressed = false;
        loop {
            // Before a case starts the worker may still be loading the plugin (a debug build on a
            // busy machine can take seconds): that time is not any case's, so it gets its own,
            // longer limit rather than being charged to the first case's timeout.
            let wait = match &current {
                Some((_, started)) => cfg.timeout.saturating_sub(started.elapsed()),
                None => cfg.timeout.max(WORKER_START_LIMIT),
            };
            match rx.recv_timeout(wait) {
                Ok(line) => {
                    if let Some(id) = line.strip_prefix("START ") {
                        current = Some((id.to_string(), Instant::now()));
                    } else if let Some(json) = line.strip_prefix("RESULT ") {
                        let v: Value = serde_json::from_str(json).unwrap_or(Value::Null);
                        let id = v["id"].as_str().unwrap_or_default().to_string();
                        let outcome = outcome_from_json(&v["outcome"])
                            .unwrap_or_else(|| Outcome::error(format!("unreadable worker line: {line}")));
                        record(&id, outcome, v["ms"].as_u64().unwrap_or(0) as u128);
                        remaining.retain(|r| *r != id);
                        current = None;
                        progressed = true;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let (id, msg, limit) = match current.take() {
                        Some((id, _)) => (
                            id,
                            format!("no result after {:.0} s; the worker was killed", cfg.timeout.as_secs_f64()),
                            cfg.timeout,
                        ),
                        None => {
                            let limit = cfg.timeout.max(WORKER_START_LIMIT);
                            let msg = format!(
                                "the worker started no case within {:.0} s (loading the backend hung?); it was killed",
                                limit.as_secs_f64()
                            );
                            (remaining[0].clone(), msg, limit)
                        }
                    };
                    record(&id, Outcome::with(Status::Timeout, msg), limit.as_millis());
                    remaining.retain(|r| *r != id);
                    break;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                    let tail = stderr_tail.and_then(|h| h.join().ok()).unwrap_or_default();
                    if let Some((id, started)) = current.take() {
                        let msg = format!("the worker died ({status}) while running this case; stderr: {tail}");
                        record(&id, Outcome::with(Status::Crash, msg), started.elapsed().as_millis());
                        remaining.retain(|r| *r != id);
                    } else if !remaining.is_empty() && !progressed {
                        // The worker could not even start: report it once per case, do not loop.
                        for id in remaining.drain(..) {
                            record(
                                &id,
                                Outcome::error(format!("the worker exited ({status}) before running: {tail}")),
                                0,
                            );
                        }
                    }
                    break;
                }
            }
        }
        let _ = std::fs::remove_file(&file);
    }
}
