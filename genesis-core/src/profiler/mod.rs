//! The profiler (`torch.profiler`'s questions): which ops ran, how often, for how long, with
//! which shapes, and what they allocated; as a table and as a Chrome trace.
//!
//! Inside a profiling scope every backend op the core dispatches is recorded with its name,
//! device, host time and (optionally) its inputs' shapes and dtypes; the backward function
//! of every autograd node is a span named as PyTorch names it (`rms_norm` → `RmsNormBackward`) around the ops it runs; users open
//! their own nested spans with [`record_function`]. With `profile_memory`, every device
//! allocation and free is recorded too, and each op is charged with the allocations made for
//! it (its outputs are allocated just before it runs).
//!
//! Device time is not measured yet: backend interface 1.1 has no timing events, so the times
//! are host times (for an asynchronous backend such as CUDA, the time to issue the work) and
//! the table says so.
//!
//! Every op also enters a `tracing` span (`genesis::op`, level TRACE), so a `tracing`
//! subscriber sees ops without the profiler.
//!
//! ```
//! use genesis::profiler::{profile, record_function, ProfilerOptions, SortBy, TableOptions};
//! use genesis::{Device, Tensor};
//! let cpu = Device::cpu()?;
//! let (_, prof) = profile(ProfilerOptions { record_shapes: true, ..Default::default() }, || {
//!     let _step = record_function("step");
//!     let a = Tensor::ones(&[64, 64], genesis::DType::F32, &cpu)?;
//!     a.matmul(&a)?.relu()?.sum()
//! })?;
//! println!("{}", prof.table(&TableOptions { sort_by: SortBy::HostTotal, ..Default::default() }));
//! assert!(prof.events().iter().any(|e| e.name == "step"));
//! # Ok::<(), genesis::Error>(())
//! ```
//!
//! Cost: with no profiler running, each op pays one relaxed atomic load; recording costs are
//! measured by `examples/profile_training.rs` and recorded in its doc.

mod record;
mod table;
mod trace;

pub use record::{Event, EventKind};
pub use table::{SortBy, TableOptions};

use crate::error::{Error, Result};
pub(crate) use record::{active, memory, Span};
use record::{set_active, Session, SESSION};
use std::time::Instant;

/// What a profiling scope records.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProfilerOptions {
    /// Record the shapes and dtypes of each op's inputs (`record_shapes`).
    pub record_shapes: bool,
    /// Record device allocations and frees (`profile_memory`).
    pub profile_memory: bool,
}

/// A running profiler; [`stop`](Profiler::stop) it to get the [`Profile`]. Dropping it
/// without stopping discards what it recorded.
pub struct Profiler {
    stopped: bool,
}

impl Profiler {
    /// Start recording. One profiler at a time per process: starting a second one while the
    /// first runs is an error.
    pub fn start(options: ProfilerOptions) -> Result<Profiler> {
        let mut session = SESSION.lock().unwrap_or_else(|p| p.into_inner());
        if session.is_some() {
            return Err(Error::invalid("profiler: another profiler is already recording"));
        }
        *session = Some(Session {
            start: Instant::now(),
            record_shapes: options.record_shapes,
            profile_memory: options.profile_memory,
            events: Vec::new(),
        });
        set_active(true);
        Ok(Profiler { stopped: false })
    }

    /// Stop recording and return what was recorded. Spans still open are not included.
    pub fn stop(mut self) -> Profile {
        self.stopped = true;
        Profile { events: finish().map(|s| s.events).unwrap_or_default() }
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if !self.stopped {
            finish();
        }
    }
}

fn finish() -> Option<Session> {
    set_active(false);
    let mut session = SESSION.lock().unwrap_or_else(|p| p.into_inner()).take()?;
    session.events.sort_by_key(|e| (e.start_ns, e.id));
    Some(session)
}

/// Run `f` under a profiler; returns its result and the profile (`with profile(...) as prof`).
pub fn profile<T>(options: ProfilerOptions, f: impl FnOnce() -> Result<T>) -> Result<(T, Profile)> {
    let profiler = Profiler::start(options)?;
    let value = f()?;
    Ok((value, profiler.stop()))
}

/// A user span (`torch.profiler.record_function`): open until the returned guard drops;
/// spans and ops inside it nest under it.
#[must_use = "the span ends when the guard is dropped"]
pub fn record_function(name: &str) -> RecordFunction {
    RecordFunction { _span: Span::begin(EventKind::User, || name.to_string()) }
}

/// The guard of [`record_function`].
pub struct RecordFunction {
    _span: Span,
}

/// What a profiler recorded: the events in start order, and views of them.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    events: Vec<Event>,
}

impl Profile {
    /// Every event, in order of start time.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Events of `kind`.
    pub fn events_of(&self, kind: EventKind) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(move |e| e.kind == kind)
    }

    /// The summary table (`key_averages().table()`).
    pub fn table(&self, options: &TableOptions) -> String {
        table::render(&self.events, options)
    }

    /// The events as Chrome Trace Event Format JSON (opens in Perfetto and chrome://tracing).
    pub fn chrome_trace(&self) -> String {
        trace::chrome_trace(&self.events)
    }

    /// Write [`chrome_trace`](Profile::chrome_trace) to `path` (atomically).
    pub fn export_chrome_trace(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let json = self.chrome_trace();
        crate::serialize::write_atomically(path, |f| std::io::Write::write_all(f, json.as_bytes()))
    }

    /// With `profile_memory`: the op running when each device's allocated memory (counted
    /// from the profiler's start) peaked, with that peak in bytes.
    pub fn memory_peaks(&self) -> Vec<(String, i64, String)> {
        table::memory_peaks(&self.events)
    }
}
