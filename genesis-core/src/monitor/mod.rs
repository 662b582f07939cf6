//! Watching training: a progress bar with loss, throughput and ETA ([`Progress`]), and a
//! metrics log ([`MetricsLog`]) written as CSV and drawn as PNG curves.
//!
//! [`Progress`] and [`MetricsLog::plot_png`] need the `monitor` feature (on by default);
//! the CSV log works without it.
//!
//! ```
//! use genesis::monitor::MetricsLog;
//! let mut log = MetricsLog::new();
//! log.record(1, &[("loss", 2.3)]);
//! log.record(2, &[("loss", 1.7), ("accuracy", 0.41)]);
//! assert_eq!(log.to_csv(), "step,loss,accuracy\n1,2.3,\n2,1.7,0.41\n");
//! ```

#[cfg(feature = "monitor")]
mod font;
#[cfg(feature = "monitor")]
mod plot;
#[cfg(feature = "monitor")]
mod progress;

#[cfg(feature = "monitor")]
pub use progress::Progress;

use crate::error::Result;
use crate::serialize::write_atomically;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// Named numbers recorded by step (train loss, test accuracy, learning rate, ...).
#[derive(Clone, Debug, Default)]
pub struct MetricsLog {
    /// Metric names in order of first appearance (the CSV's columns).
    names: Vec<String>,
    /// One row per step, in recording order.
    rows: Vec<(u64, BTreeMap<String, f64>)>,
}

impl MetricsLog {
    /// An empty log.
    pub fn new() -> MetricsLog {
        MetricsLog::default()
    }

    /// Record `values` at `step`. Values recorded for the same step as the previous call
    /// join that row (so train and test metrics of one epoch share a CSV line).
    pub fn record(&mut self, step: u64, values: &[(&str, f64)]) {
        for (name, _) in values {
            if !self.names.iter().any(|n| n == name) {
                self.names.push(name.to_string());
            }
        }
        if self.rows.last().is_none_or(|(s, _)| *s != step) {
            self.rows.push((step, BTreeMap::new()));
        }
        let row = &mut self.rows.last_mut().expect("a row was just ensured").1;
        for (name, v) in values {
            row.insert(name.to_string(), *v);
        }
    }

    /// The metric names, in order of first appearance.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Every `(step, value)` recorded for `name`.
    pub fn series(&self, name: &str) -> Vec<(u64, f64)> {
        self.rows.iter().filter_map(|(s, row)| row.get(name).map(|v| (*s, *v))).collect()
    }

    /// The log as CSV: a `step` column then one column per metric; a metric not recorded at
    /// a step leaves its cell empty.
    pub fn to_csv(&self) -> String {
        let mut out = String::from("step");
        for n in &self.names {
            out.push(',');
            out.push_str(&csv_field(n));
        }
        out.push('\n');
        for (step, row) in &self.rows {
            out.push_str(&step.to_string());
            for n in &self.names {
                out.push(',');
                if let Some(v) = row.get(n) {
                    out.push_str(&v.to_string());
                }
            }
            out.push('\n');
        }
        out
    }

    /// Write [`to_csv`](Self::to_csv) to `path` (atomically).
    pub fn write_csv(&self, path: impl AsRef<Path>) -> Result<()> {
        let text = self.to_csv();
        write_atomically(path, |f| f.write_all(text.as_bytes()))
    }
}

/// A CSV cell: quoted when it holds a comma, quote or line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}
