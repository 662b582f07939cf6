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
//! With `device_time` (on by default), ops get device times, measured in the best way their
//! backend offers:
//! - **activity records** (interface 1.4; CUPTI on the CUDA backend): each op's device work
//!   is tagged with the op's id, and the backend reports every kernel, copy and fill with
//!   its device times. An op's device time is the sum of its kernels' times; the profile
//!   lists the kernels ([`Profile::kernels`]) and the trace shows them on a track per
//!   device stream.
//! - **timing events** (interface 1.2; CUDA events, used when CUPTI is missing): each op
//!   is bracketed by two events, and its device time is the interval between them.
//! - neither (the CPU backend, which runs ops synchronously, so host time is its device
//!   time): host times only, and the table says so.
//!
//! On an asynchronous backend the host time of an op is the time to issue its work.
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

pub use record::{Event, EventKind, Kernel};
pub use table::{SortBy, TableOptions};

use crate::error::{Error, Result};
pub(crate) use record::{active, memory, transfer, Span};
use record::{set_active, DeviceClock, Session, TimedOp, Timing, SESSION};
use std::time::Instant;

/// What a profiling scope records.
#[derive(Debug, Clone, Copy)]
pub struct ProfilerOptions {
    /// Record the shapes and dtypes of each op's inputs (`record_shapes`; off by default).
    pub record_shapes: bool,
    /// Record device allocations and frees (`profile_memory`; off by default).
    pub profile_memory: bool,
    /// Measure each op's time on its device (on by default, as `torch.profiler` records
    /// CUDA activity by default where there is a GPU). Costs two activity tags or two event
    /// records per op on such devices, and a synchronization of each device when it is
    /// first seen and when the profiler stops.
    pub device_time: bool,
}

impl Default for ProfilerOptions {
    fn default() -> Self {
        ProfilerOptions { record_shapes: false, profile_memory: false, device_time: true }
    }
}

/// Whether a device's op times were measured on the device, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceTiming {
    /// The device (`"cuda:0"`).
    pub device: String,
    /// How they were measured, when they were.
    pub source: Option<TimeSource>,
    /// `None` when measured; otherwise why not (for example, the backend has neither
    /// activity records nor timing events).
    pub unavailable: Option<String>,
}

/// Where a device's times come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSource {
    /// The backend's records of each kernel, copy and fill (interface 1.4; CUPTI on CUDA):
    /// exact kernel times, and the profile lists the kernels.
    ActivityRecords,
    /// Two timing events around each op (interface 1.2; CUDA events): the op's interval on
    /// the device's stream, which includes any wait for its launch on an idle device.
    TimingEvents,
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
            setup_ns: 0,
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
    let (timing, mut kernels) = resolve_device_times(&mut session);
    kernels.sort_by_key(|k| (k.start_ns, k.end_ns));
    attribute_kernels(&mut session.events, &session.clocks, &kernels);
    session.events.sort_by_key(|e| (e.start_ns, e.id));
    Some(Profile { events: session.events, kernels, device_time: session.device_time, timing })
}

/// Collect each device's work: the activity records of backends that keep them (stopped
/// once per backend, after synchronizing its devices), and the interval between each timed
/// op's two events on devices timed with events (released afterwards). A device whose times
/// cannot be read loses them, with the reason.
fn resolve_device_times(session: &mut Session) -> (Vec<DeviceTiming>, Vec<Kernel>) {
    let mut kernels = Vec::new();
    let mut failed: Vec<(usize, String)> = Vec::new();
    let names: std::collections::HashMap<u64, &str> = session.events.iter().map(|e| (e.id, e.name.as_str())).collect();
    let records = |c: &DeviceClock| matches!(c.timing, Timing::Activity { .. });
    for (c, clock) in session.clocks.iter().enumerate() {
        let device = &clock.device;
        match &clock.timing {
            Timing::Activity { offset_ns } => {
                // The first recording clock of each backend stops the recording of all its
                // devices: always, so that a failed synchronization never leaves it running.
                let mine = |o: &DeviceClock| records(o) && o.device.same_backend(device);
                if session.clocks.iter().position(mine) != Some(c) {
                    continue;
                }
                let siblings: Vec<usize> = (0..session.clocks.len()).filter(|&i| mine(&session.clocks[i])).collect();
                let synced: Result<()> = siblings.iter().try_for_each(|&i| session.clocks[i].device.synchronize());
                let stopped = device.activity_stop();
                match synced.and(stopped) {
                    Ok(records) => kernels.extend(records.into_iter().map(|r| Kernel {
                        op: (r.tag != 0).then_some(r.tag),
                        device: device.sibling(r.device),
                        stream: r.stream,
                        name: r.name.into_string(),
                        start_ns: (r.start_ns as i128 + offset_ns).max(0) as u64,
                        end_ns: (r.end_ns as i128 + offset_ns).max(0) as u64,
                    })),
                    Err(e) => failed.extend(siblings.into_iter().map(|i| (i, e.to_string()))),
                }
            }
            Timing::Events { reference, host_ns } => {
                let ops: Vec<&TimedOp> = session.timed.iter().filter(|t| t.clock == c).collect();
                let read = device.synchronize().and_then(|()| {
                    ops.iter()
                        .map(|t| {
                            let start_us = device.event_elapsed_us(*reference, t.start)?.max(0.0);
                            let duration_us = device.event_elapsed_us(t.start, t.end)?.max(0.0);
                            let start_ns = host_ns + (start_us * 1e3) as u64;
                            Ok(Kernel {
                                op: Some(t.event),
                                device: device.clone(),
                                stream: 0,
                                name: names.get(&t.event).copied().unwrap_or_default().to_string(),
                                start_ns,
                                end_ns: start_ns + (duration_us * 1e3) as u64,
                            })
                        })
                        .collect::<Result<Vec<_>>>()
                });
                let events: Vec<_> =
                    std::iter::once(*reference).chain(ops.iter().flat_map(|t| [t.start, t.end])).collect();
                let _ = device.release_events(&events);
                match read {
                    Ok(read) => kernels.extend(read),
                    Err(e) => failed.push((c, e.to_string())),
                }
            }
            Timing::Unavailable(_) => {}
        }
    }
    for (c, reason) in failed {
        let device = &session.clocks[c].device;
        kernels.retain(|k| &k.device != device);
        session.clocks[c].timing = Timing::Unavailable(reason);
    }
    let timing = session
        .clocks
        .iter()
        .map(|c| DeviceTiming {
            device: c.device.to_string(),
            source: match c.timing {
                Timing::Activity { .. } => Some(TimeSource::ActivityRecords),
                Timing::Events { .. } => Some(TimeSource::TimingEvents),
                Timing::Unavailable(_) => None,
            },
            unavailable: match &c.timing {
                Timing::Unavailable(reason) => Some(reason.clone()),
                _ => None,
            },
        })
        .collect();
    (timing, kernels)
}

/// Give each op on a timed device its device time: the sum of its kernels' times (0 when it
/// ran none) and the start of its first kernel.
fn attribute_kernels(events: &mut [Event], clocks: &[DeviceClock], kernels: &[Kernel]) {
    let mut per_op: std::collections::HashMap<u64, (u64, u64)> = std::collections::HashMap::new();
    for k in kernels {
        if let Some(op) = k.op {
            let entry = per_op.entry(op).or_insert((u64::MAX, 0));
            entry.0 = entry.0.min(k.start_ns);
            entry.1 += k.end_ns.saturating_sub(k.start_ns);
        }
    }
    for e in events.iter_mut().filter(|e| e.kind == EventKind::Op) {
        let timed = e
            .device
            .as_ref()
            .is_some_and(|d| clocks.iter().any(|c| &c.device == d && !matches!(c.timing, Timing::Unavailable(_))));
        if !timed {
            continue;
        }
        let (start, ns) = per_op.get(&e.id).copied().unwrap_or((u64::MAX, 0));
        e.device_start_ns = (start != u64::MAX).then_some(start);
        e.device_ns = Some(ns);
    }
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
    kernels: Vec<Kernel>,
    device_time: bool,
    timing: Vec<DeviceTiming>,
}

impl Profile {
    /// Every event, in order of start time.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The work devices ran (kernels, copies, fills), in order of device start, each with
    /// the op that issued it. On devices timed by events, one interval per op.
    pub fn kernels(&self) -> &[Kernel] {
        &self.kernels
    }

    /// The device work by name: `(name, count, total nanoseconds)`, the most time first
    /// (kernels overlapping each other count each their own time).
    pub fn kernel_totals(&self) -> Vec<(&str, usize, u64)> {
        let mut totals: std::collections::HashMap<&str, (usize, u64)> = Default::default();
        for k in &self.kernels {
            let entry = totals.entry(k.name.as_str()).or_default();
            *entry = (entry.0 + 1, entry.1 + k.end_ns.saturating_sub(k.start_ns));
        }
        let mut totals: Vec<(&str, usize, u64)> = totals.into_iter().map(|(n, (c, ns))| (n, c, ns)).collect();
        totals.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(b.0)));
        totals
    }

    /// `(busy, span)` in nanoseconds: the time some device work was running (the union of
    /// the work's intervals, so work that overlaps counts once) and the span from the first
    /// start to the last end; `span - busy` is the devices' idle time in between.
    pub fn device_coverage(&self) -> (u64, u64) {
        let mut spans: Vec<(u64, u64)> = self.kernels.iter().map(|k| (k.start_ns, k.end_ns)).collect();
        spans.sort_unstable();
        let (mut busy, mut reach) = (0u64, 0u64);
        for &(start, end) in &spans {
            busy += end.saturating_sub(start.max(reach));
            reach = reach.max(end);
        }
        (busy, spans.first().map_or(0, |&(first, _)| reach - first))
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
        trace::chrome_trace(&self.events, &self.kernels)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_totals_and_device_coverage() {
        let device = crate::device::Device::cpu().unwrap();
        let kernel = |name: &str, start_ns, end_ns| Kernel {
            op: None,
            device: device.clone(),
            stream: 0,
            name: name.to_string(),
            start_ns,
            end_ns,
        };
        // b overlaps a (launched early); a gap of 10 ns before c.
        let kernels = vec![kernel("a", 100, 150), kernel("b", 140, 160), kernel("c", 170, 180), kernel("a", 180, 200)];
        let prof = Profile { events: Vec::new(), kernels, device_time: true, timing: Vec::new() };
        assert_eq!(prof.kernel_totals(), vec![("a", 2, 70), ("b", 1, 20), ("c", 1, 10)]);
        assert_eq!(prof.device_coverage(), (90, 100));
        let empty = Profile { events: Vec::new(), kernels: Vec::new(), device_time: true, timing: Vec::new() };
        assert_eq!((empty.kernel_totals().len(), empty.device_coverage()), (0, (0, 0)));
    }
}
