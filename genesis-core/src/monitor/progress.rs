//! A terminal progress bar for training loops (indicatif), showing the loss, throughput and
//! time left. Drawn on stderr only when it is a terminal, so logs stay clean.

use indicatif::{ProgressBar, ProgressStyle};
use std::time::Instant;

/// A progress bar over a known number of steps.
///
/// ```
/// use genesis::monitor::Progress;
/// let mut bar = Progress::hidden(100, "train");
/// for _ in 0..10 {
///     bar.step(0.5, 32); // loss 0.5 on a batch of 32 samples
/// }
/// assert!(bar.message().contains("loss 0.5000"));
/// bar.finish();
/// ```
pub struct Progress {
    bar: ProgressBar,
    start: Instant,
    items: u64,
    unit: String,
}

impl Progress {
    /// A bar for `total` steps labelled `label`, drawn on stderr.
    pub fn new(total: u64, label: &str) -> Progress {
        Self::with_bar(ProgressBar::new(total), label)
    }

    /// A bar that keeps count but draws nothing (tests, quiet runs).
    pub fn hidden(total: u64, label: &str) -> Progress {
        Self::with_bar(ProgressBar::hidden(), label).with_total(total)
    }

    fn with_total(self, total: u64) -> Self {
        self.bar.set_length(total);
        self
    }

    fn with_bar(bar: ProgressBar, label: &str) -> Progress {
        let style = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} | {elapsed_precise} eta {eta}")
            .expect("the template is valid")
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(label.to_string());
        Progress { bar, start: Instant::now(), items: 0, unit: "samples".into() }
    }

    /// Name the counted items in the throughput (default `samples`; `tokens` for a
    /// language model).
    pub fn unit(mut self, unit: &str) -> Self {
        self.unit = unit.to_string();
        self
    }

    /// One step done, with its `loss` and the number of `items` (samples, tokens) it processed.
    pub fn step(&mut self, loss: f64, items: u64) {
        self.items += items;
        self.bar.set_message(format!("loss {loss:.4} | {:.0} {}/s", self.throughput(), self.unit));
        self.bar.inc(1);
    }

    /// Items per second since the bar was made.
    pub fn throughput(&self) -> f64 {
        self.items as f64 / self.start.elapsed().as_secs_f64().max(1e-9)
    }

    /// Steps done so far.
    pub fn position(&self) -> u64 {
        self.bar.position()
    }

    /// The text after the bar (loss and throughput).
    pub fn message(&self) -> String {
        self.bar.message()
    }

    /// Print a line above the bar without breaking it (to stdout when the bar is not
    /// drawn, so logs keep it).
    pub fn println(&self, line: impl AsRef<str>) {
        if self.bar.is_hidden() {
            println!("{}", line.as_ref());
        } else {
            self.bar.println(line);
        }
    }

    /// Leave the finished bar on screen.
    pub fn finish(&self) {
        self.bar.finish();
    }
}
