//! Recording: a global switch read once per op, completed events in one list, each thread's
//! stack of open spans (for nesting and self times), and a timing event before and after
//! each op on devices that have them (resolved to device times when the profiler stops).

use crate::device::Device;
use genesis_backend_api::{DType, EventId};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// What an event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A backend op dispatched by the core (a forward or backward computation step).
    Op,
    /// The backward function of one autograd node, around the ops it runs.
    Backward,
    /// A span opened by [`record_function`](super::record_function).
    User,
    /// A device allocation (`bytes` > 0) or free (`bytes` < 0); no duration.
    Memory,
}

/// One recorded event; times are nanoseconds since the profiler started.
#[derive(Debug, Clone)]
pub struct Event {
    /// Unique within a profile.
    pub id: u64,
    /// The enclosing span on the same thread, if any.
    pub parent: Option<u64>,
    /// What was recorded.
    pub kind: EventKind,
    /// The op's, node's or span's name.
    pub name: String,
    /// Small integer naming the recording thread (0 for the first thread seen).
    pub thread: u64,
    /// Host start.
    pub start_ns: u64,
    /// Host end (equal to the start for memory events).
    pub end_ns: u64,
    /// The device the op ran on, or the memory event's device.
    pub device: Option<Device>,
    /// Input shapes, when shapes are recorded.
    pub shapes: Vec<Vec<usize>>,
    /// Input dtypes, when shapes are recorded.
    pub dtypes: Vec<DType>,
    /// Bytes allocated (positive) or freed (negative), for memory events.
    pub bytes: i64,
    /// For ops whose device time was measured: when the op's work started on the device, in
    /// nanoseconds since the profiler started (device clock aligned to the host's when the
    /// device was first seen, so within a few microseconds).
    pub device_start_ns: Option<u64>,
    /// For ops whose device time was measured: its duration on the device, in nanoseconds.
    pub device_ns: Option<u64>,
}

impl Event {
    /// Host duration in nanoseconds.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }

    fn new(id: u64, parent: Option<u64>, kind: EventKind, name: String, start_ns: u64) -> Event {
        Event {
            id,
            parent,
            kind,
            name,
            thread: THREAD.with(|t| *t),
            start_ns,
            end_ns: start_ns,
            device: None,
            shapes: Vec::new(),
            dtypes: Vec::new(),
            bytes: 0,
            device_start_ns: None,
            device_ns: None,
        }
    }
}

/// A device's timing state in a session: a reference event recorded on an idle device at a
/// known host time (device timestamps are measured from it), or why there is none.
pub(crate) struct DeviceClock {
    pub device: Device,
    pub clock: std::result::Result<(EventId, u64), String>,
}

/// An op bracketed by two timing events on its device's clock `clock`.
pub(crate) struct TimedOp {
    pub event: u64,
    pub clock: usize,
    pub start: EventId,
    pub end: EventId,
}

pub(crate) struct Session {
    pub start: Instant,
    pub record_shapes: bool,
    pub profile_memory: bool,
    pub device_time: bool,
    pub events: Vec<Event>,
    pub clocks: Vec<DeviceClock>,
    pub timed: Vec<TimedOp>,
}

impl Session {
    /// The index of `device`'s clock, starting one on first sight.
    fn clock(&mut self, device: &Device) -> usize {
        if let Some(i) = self.clocks.iter().position(|c| &c.device == device) {
            return i;
        }
        let clock = device
            .synchronize()
            .and_then(|()| device.record_event())
            .map(|reference| (reference, self.start.elapsed().as_nanos() as u64))
            .map_err(|e| e.to_string());
        self.clocks.push(DeviceClock { device: device.clone(), clock });
        self.clocks.len() - 1
    }
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_THREAD: AtomicU64 = AtomicU64::new(0);
pub(crate) static SESSION: Mutex<Option<Session>> = Mutex::new(None);

thread_local! {
    static THREAD: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
    /// Ids of the spans open on this thread, innermost last.
    static OPEN: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// True while a profiler records: the one branch every op pays when profiling is off.
#[inline]
pub(crate) fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

pub(crate) fn set_active(on: bool) {
    ACTIVE.store(on, Ordering::Relaxed);
}

fn with_session<T>(f: impl FnOnce(&mut Session) -> T) -> Option<T> {
    SESSION.lock().unwrap_or_else(|p| p.into_inner()).as_mut().map(f)
}

/// An open span: pushed on its thread's stack at start, recorded when dropped.
pub(crate) struct Span {
    event: Option<Event>,
    /// For an op on a device with timing events: its clock and the event recorded before it.
    timing: Option<(usize, EventId)>,
}

impl Span {
    const OFF: Span = Span { event: None, timing: None };

    /// Open a span of `kind` named `name` (`name` is built only when recording).
    pub fn begin(kind: EventKind, name: impl FnOnce() -> String) -> Span {
        if !active() {
            return Span::OFF;
        }
        let Some(start_ns) = with_session(|s| s.start.elapsed().as_nanos() as u64) else {
            return Span::OFF;
        };
        Span { event: Some(Event::new(open(), current(), kind, name(), start_ns)), timing: None }
    }

    /// Open the span of an op about to run on `device` with `inputs` (shapes and dtypes
    /// kept when recorded); with device time on, record a timing event before it.
    pub fn op<'a>(device: &Device, name: &str, inputs: impl Iterator<Item = (&'a [usize], DType)>) -> Span {
        let begun = with_session(|s| {
            let clock = if s.device_time {
                let i = s.clock(device);
                s.clocks[i].clock.is_ok().then_some(i)
            } else {
                None
            };
            (s.start.elapsed().as_nanos() as u64, s.record_shapes, clock)
        });
        let Some((start_ns, record_shapes, clock)) = begun else { return Span::OFF };
        let mut event = Event::new(open(), current(), EventKind::Op, name.to_string(), start_ns);
        event.device = Some(device.clone());
        if record_shapes {
            for (shape, dtype) in inputs {
                event.shapes.push(shape.to_vec());
                event.dtypes.push(dtype);
            }
        }
        let timing = clock.and_then(|i| device.record_event().ok().map(|start| (i, start)));
        Span { event: Some(event), timing }
    }
}

/// A new span id, pushed on this thread's stack of open spans (after reading the parent).
fn open() -> u64 {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    OPEN.with(|o| o.borrow_mut().push(id));
    id
}

/// The innermost span open on this thread, not counting the one just opened.
fn current() -> Option<u64> {
    OPEN.with(|o| {
        let o = o.borrow();
        o.len().checked_sub(2).map(|i| o[i])
    })
}

impl Drop for Span {
    fn drop(&mut self) {
        let Some(mut event) = self.event.take() else { return };
        let end = match (&self.timing, &event.device) {
            (Some(_), Some(device)) => device.record_event().ok(),
            _ => None,
        };
        OPEN.with(|o| {
            let mut o = o.borrow_mut();
            if let Some(i) = o.iter().rposition(|&id| id == event.id) {
                o.truncate(i);
            }
        });
        with_session(|s| {
            event.end_ns = s.start.elapsed().as_nanos() as u64;
            if let (Some((clock, start)), Some(end)) = (self.timing, end) {
                s.timed.push(TimedOp { event: event.id, clock, start, end });
            }
            s.events.push(event);
        });
    }
}

/// Record an allocation (`bytes` > 0) or a free (`bytes` < 0) on `device`, attributed to the
/// span open on this thread.
pub(crate) fn memory(device: &Device, bytes: i64) {
    with_session(|s| {
        if !s.profile_memory {
            return;
        }
        let now = s.start.elapsed().as_nanos() as u64;
        let name = if bytes >= 0 { "[memory] allocate" } else { "[memory] free" };
        let parent = OPEN.with(|o| o.borrow().last().copied());
        let mut event =
            Event::new(NEXT_ID.fetch_add(1, Ordering::Relaxed), parent, EventKind::Memory, name.into(), now);
        event.device = Some(device.clone());
        event.bytes = bytes;
        s.events.push(event);
    });
}
