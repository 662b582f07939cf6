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
//! With `device_time` (on by default), each op on a device whose backend has timing events
//! (interface 1.2; the CUDA backend records CUDA events) is bracketed by two of them, and
//! the profiler resolves them to device start times and durations when it stops: the table
//! gains device columns and the trace a track per device stream. A backend without timing
//! events (the CPU backend, which runs ops synchronously, so host time is its device time)
//! reports host times only, and the table says so. On an asynchronous backend the host time
//! of an op is the time to issue its work.
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
use record::{set_active, Session, TimedOp, SESSION};
use std::time::Instant;

/// What a profiling scope records.
#[derive(Debug, Clone, Copy)]
pub struct ProfilerOptions {
    /// Record the shapes and dtypes of each op's inputs (`record_shapes`; off by default).
    pub record_shapes: bool,
    /// Record device allocations and frees (`profile_memory`; off by default).
    pub profile_memory: bool,
    /// Measure each op's time on devices with timing events (on by default, as
    /// `torch.profiler` records CUDA activity by default where there is a GPU). Costs two
    /// event records per op on such devices, and a synchronization of each device when it
    /// is first seen and when the profiler stops.
    pub device_time: bool,
}

impl Default for ProfilerOptions {
    fn default() -> Self {
        ProfilerOptions { record_shapes: false, profile_memory: false, device_time: true }
    }
}

/// Whether a device's op times were measured on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceTiming {
    /// The device (`"cuda:0"`).
    pub device: String,
    /// `None` when measured; otherwise why not (for example, the backend has no timing
    /// events).
    pub unavailable: Option<String>,
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
            device_time: options.device_time,
            events: Vec::new(),
            clocks: Vec::new(),
            timed: Vec::new(),
        });
        set_active(true);
        Ok(Profiler { stopped: false })
    }

    /// Stop recording and return what was recorded. Spans still open are not included.
    pub fn stop(mut self) -> Profile {
        self.stopped = true;
        finish().unwrap_or_default()
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if !self.stopped {
            finish();
        }
    }
}

fn finish() -> Option<Profile> {
    set_active(false);
    let mut session = SESSION.lock().unwrap_or_else(|p| p.into_inner()).take()?;
    let timing = resolve_device_times(&mut session);
    session.events.sort_by_key(|e| (e.start_ns, e.id));
    Some(Profile { events: session.events, device_time: session.device_time, timing })
}

/// Turn each timed op's two events into its device start and duration, then release the
/// events. A device whose events cannot be read loses its device times, with the reason.
fn resolve_device_times(session: &mut Session) -> Vec<DeviceTiming> {
    let index: std::collections::HashMap<u64, usize> =
        session.events.iter().enumerate().map(|(i, e)| (e.id, i)).collect();
    let mut timing = Vec::new();
    for (c, clock) in session.clocks.iter().enumerate() {
        let device = &clock.device;
        let ops: Vec<&TimedOp> = session.timed.iter().filter(|t| t.clock == c).collect();
        let resolved = clock.clock.clone().and_then(|(reference, host_ns)| {
            device.synchronize().map_err(|e| e.to_string())?;
            let mut times = Vec::with_capacity(ops.len());
            for t in &ops {
                let start_us = device.event_elapsed_us(reference, t.start).map_err(|e| e.to_string())?;
                let duration_us = device.event_elapsed_us(t.start, t.end).map_err(|e| e.to_string())?;
                let start_ns = host_ns as f64 + start_us.max(0.0) * 1e3;
                times.push((t.event, start_ns as u64, (duration_us.max(0.0) * 1e3) as u64));
            }
            Ok(times)
        });
        if let Ok((reference, _)) = &clock.clock {
            let events: Vec<_> = std::iter::once(*reference).chain(ops.iter().flat_map(|t| [t.start, t.end])).collect();
            let _ = device.release_events(&events);
        }
        let unavailable = match resolved {
            Ok(times) => {
                for (id, start_ns, ns) in times {
                    if let Some(&i) = index.get(&id) {
                        session.events[i].device_start_ns = Some(start_ns);
                        session.events[i].device_ns = Some(ns);
                    }
                }
                None
            }
            Err(reason) => Some(reason),
        };
        timing.push(DeviceTiming { device: device.to_string(), unavailable });
    }
    timing
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
    device_time: bool,
    timing: Vec<DeviceTiming>,
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

    /// For each device ops ran on (when device time was requested): whether their device
    /// time was measured.
    pub fn device_timing(&self) -> &[DeviceTiming] {
        &self.timing
    }

    /// The summary table (`key_averages().table()`).
    pub fn table(&self, options: &TableOptions) -> String {
        table::render(&self.events, options, self.device_time, &self.timing)
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
