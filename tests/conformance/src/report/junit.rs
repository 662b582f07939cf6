//! JUnit XML: one testsuite per harness suite; failures as `<failure>`, errors, crashes and
//! timeouts as `<error>`, everything not run or not supported as `<skipped>`.

use super::Run;
use crate::case::Status;
use crate::suites::SUITES;

fn escape(s: &str) -> String {
    s.chars()
        .filter(|&c| c == '\n' || c == '\t' || c >= ' ')
        .map(|c| match c {
            '&' => "&amp;".to_string(),
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            '"' => "&quot;".to_string(),
            c => c.to_string(),
        })
        .collect()
}

/// The run as JUnit XML.
pub fn junit_report(run: &Run) -> String {
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    xml += &format!("<testsuites name=\"genesis-conformance {}\">\n", escape(&run.target.info.name));
    for suite in SUITES {
        let results: Vec<_> = run.results.iter().filter(|r| r.suite == *suite).collect();
        if results.is_empty() {
            continue;
        }
        let count = |f: &dyn Fn(Status) -> bool| results.iter().filter(|r| f(r.outcome.status)).count();
        xml += &format!(
            "  <testsuite name=\"{suite}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\">\n",
            results.len(),
            count(&|s| s == Status::Fail),
            count(&|s| matches!(s, Status::Error | Status::Crash | Status::Timeout)),
            count(&|s| matches!(s, Status::NotSupported | Status::Skipped | Status::Blocked | Status::XFail)),
        );
        for r in results {
            let name = escape(&r.id);
            let time = r.duration_ms as f64 / 1000.0;
            let msg = escape(&r.outcome.message);
            let body = match r.outcome.status {
                Status::Pass | Status::XPass => String::new(),
                Status::Fail => format!("<failure message=\"{msg}\">{}</failure>", escape(&run.repro(&r.id))),
                Status::Error | Status::Crash | Status::Timeout => {
                    format!(
                        "<error type=\"{}\" message=\"{msg}\">{}</error>",
                        r.outcome.status,
                        escape(&run.repro(&r.id))
                    )
                }
                s => format!("<skipped message=\"{s}: {msg}\"/>"),
            };
            xml +=
                &format!("    <testcase classname=\"{suite}\" name=\"{name}\" time=\"{time:.3}\">{body}</testcase>\n");
        }
        xml += "  </testsuite>\n";
    }
    xml += "</testsuites>\n";
    xml
}
