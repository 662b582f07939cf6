//! Recording: a global switch read once per op, completed events in one list, each thread's
//! stack of open spans (for nesting and self times), and each op's device work: tagged with
//! the op's id on backends that record device activity, or bracketed by two timing events on
//! backends that only have those (both resolved to device times when the profiler stops).

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
    /// For ops whose device time was measured and that ran work on the device: when its
    /// first work started there, in nanoseconds since the profiler started (device clock
    /// aligned to the host's, so within a few microseconds).
    pub device_start_ns: Option<u64>,
    /// For ops whose device time was measured: the time its work ran on the device, in
    /// nanoseconds (the sum of its kernels' times; 0 for an op that ran none, such as a
    /// copy-free view).
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

/// Work a device ran while the profiler recorded: a kernel, a copy or a fill from the
/// backend's activity records, or, on a backend with timing events only, the interval
/// between the events around one op (named after the op).
#[derive(Debug, Clone)]
pub struct Kernel {
    /// The id of the op that issued it, when it was issued inside one.
    pub op: Option<u64>,
    /// The device it ran on.
    pub device: Device,
    /// The device queue it ran on, as the backend numbers them.
    pub stream: u32,
    /// The kernel's name, or what the copy or fill was.
    pub name: String,
    /// Device start, in nanoseconds since the profiler started (the device clock aligned to
    /// the host's, so within a few microseconds).
    pub start_ns: u64,
    /// Device end, on the same clock.
    pub end_ns: u64,
}

/// How a device's op times are measured in a session.
pub(crate) enum Timing {
    /// Its backend records device activity; the backend's clock plus `offset_ns` is the
    /// session's clock.
    Activity { offset_ns: i128 },
    /// Timing events around each op, measured from `reference`, recorded on the idle device
    /// at session time `host_ns`.
    Events { reference: EventId, host_ns: u64 },
    /// Not measured, and why.
    Unavailable(String),
}

/// A device's timing state in a session.
pub(crate) struct DeviceClock {
    pub device: Device,
    pub timing: Timing,
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
    /// Time spent starting device timing (CUPTI's start-up takes milliseconds), left out of
    /// the session's clock so that no span is charged with it.
    pub setup_ns: u64,
    pub record_shapes: bool,
    pub profile_memory: bool,
    pub device_time: bool,
    pub events: Vec<Event>,
    pub clocks: Vec<DeviceClock>,
    pub timed: Vec<TimedOp>,
}

impl Session {
    fn now_ns(&self) -> u64 {
        (self.start.elapsed().as_nanos() as u64).saturating_sub(self.setup_ns)
    }

    /// The index of `device`'s clock, starting one on first sight: activity records when its
    /// backend has them (started once per backend), else timing events, else none.
    fn clock(&mut self, device: &Device) -> usize {
        if let Some(i) = self.clocks.iter().position(|c| &c.device == device) {
            return i;
        }
        let shared = self.clocks.iter().find_map(|c| match c.timing {
            Timing::Activity { offset_ns } if c.device.same_backend(device) => Some(offset_ns),
            _ => None,
        });
        let setup = Instant::now();
        let started = match shared {
            Some(offset_ns) => Ok(Ok(offset_ns)),
            None => device.activity_start().map(Err),
        };
        let fallback = started.as_ref().err().map(|_| device.synchronize().and_then(|()| device.record_event()));
        // The session clock leaves the start-up out from here on; the host instant that
        // matches the backend's reading (or the reference event) is its end.
        self.setup_ns += setup.elapsed().as_nanos() as u64;
        let timing = match (started, fallback) {
            (Ok(Ok(offset_ns)), _) => Timing::Activity { offset_ns },
            (Ok(Err(backend_ns)), _) => Timing::Activity { offset_ns: self.now_ns() as i128 - backend_ns as i128 },
            (Err(_), Some(Ok(reference))) => Timing::Events { reference, host_ns: self.now_ns() },
            (Err(no_activity), Some(Err(no_events))) => Timing::Unavailable(format!("{no_activity}; {no_events}")),
            (Err(no_activity), None) => Timing::Unavailable(no_activity.to_string()),
        };
        self.clocks.push(DeviceClock { device: device.clone(), timing });
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

/// How an open op is being timed on its device.
#[derive(Clone, Copy)]
enum OpTiming {
    None,
    /// Its work is tagged with its id (ops never nest: each is one backend call, so the tag
    /// goes back to 0 after it).
    Tagged,
    /// The timing event recorded before it, on clock `clock`.
    Event {
        clock: usize,
        start: EventId,
    },
}

/// An open span: pushed on its thread's stack at start, recorded when dropped.
pub(crate) struct Span {
    event: Option<Event>,
    timing: OpTiming,
}

impl Span {
    const OFF: Span = Span { event: None, timing: OpTiming::None };

    /// Open a span of `kind` named `name` (`name` is built only when recording).
    pub fn begin(kind: EventKind, name: impl FnOnce() -> String) -> Span {
        if !active() {
            return Span::OFF;
        }
        let Some(start_ns) = with_session(|s| s.now_ns()) else {
            return Span::OFF;
        };
        Span { event: Some(Event::new(open(), current(), kind, name(), start_ns)), timing: OpTiming::None }
    }

    /// Open the span of an op about to run on `device` with `inputs` (shapes and dtypes
    /// kept when recorded); with device time on, tag its device work or record a timing
    /// event before it.
    pub fn op<'a>(device: &Device, name: &str, inputs: impl Iterator<Item = (&'a [usize], DType)>) -> Span {
        let begun = with_session(|s| {
            let clock = if s.device_time { Some(s.clock(device)) } else { None };
            let method = clock.map(|i| match s.clocks[i].timing {
                Timing::Activity { .. } => Method::Tag,
                Timing::Events { .. } => Method::Event(i),
                Timing::Unavailable(_) => Method::None,
            });
            (s.now_ns(), s.record_shapes, method.unwrap_or(Method::None))
        });
        let Some((start_ns, record_shapes, method)) = begun else { return Span::OFF };
        let mut event = Event::new(open(), current(), EventKind::Op, name.to_string(), start_ns);
        event.device = Some(device.clone());
        if record_shapes {
            for (shape, dtype) in inputs {
                event.shapes.push(shape.to_vec());
                event.dtypes.push(dtype);
            }
        }
        let timing = match method {
            Method::None => OpTiming::None,
            Method::Tag => {
                if device.activity_tag(event.id).is_ok() {
                    OpTiming::Tagged
                } else {
                    OpTiming::None
                }
            }
            Method::Event(clock) => {
                device.record_event().ok().map_or(OpTiming::None, |start| OpTiming::Event { clock, start })
            }
        };
        Span { event: Some(event), timing }
    }
}

/// The span of a copy between the host and `device` (`copy_to_host`, `copy_from_host`) of a
/// tensor of `shape` and `dtype`, while a profiler records: a transfer is charged to it as
/// an op's kernels are.
pub(crate) fn transfer(device: &Device, name: &str, shape: &[usize], dtype: DType) -> Span {
    if !active() {
        return Span::OFF;
    }
    Span::op(device, name, std::iter::once((shape, dtype)))
}

/// How [`Span::op`] times an op, decided under the session lock.
enum Method {
    None,
    Tag,
    Event(usize),
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
        let end = match (self.timing, &event.device) {
            (OpTiming::Event { .. }, Some(device)) => device.record_event().ok(),
            (OpTiming::Tagged, Some(device)) => {
                let _ = device.activity_tag(0);
                None
            }
            _ => None,
        };
        OPEN.with(|o| {
            let mut o = o.borrow_mut();
            if let Some(i) = o.iter().rposition(|&id| id == event.id) {
                o.truncate(i);
            }
        });
        with_session(|s| {
            event.end_ns = s.now_ns();
            if let (OpTiming::Event { clock, start }, Some(end)) = (self.timing, end) {
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
        let now = s.now_ns();
        let name = if bytes >= 0 { "[memory] allocate" } else { "[memory] free" };
        let parent = OPEN.with(|o| o.borrow().last().copied());
        let mut event =
            Event::new(NEXT_ID.fetch_add(1, Ordering::Relaxed), parent, EventKind::Memory, name.into(), now);
        event.device = Some(device.clone());
        event.bytes = bytes;
        s.events.push(event);
    });
}
