//! Recording: a global switch read once per op, completed events in one list, and each
//! thread's stack of open spans (for nesting and self times).

use crate::device::Device;
use genesis_backend_api::DType;
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
}

impl Event {
    /// Host duration in nanoseconds.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

pub(crate) struct Session {
    pub start: Instant,
    pub record_shapes: bool,
    pub profile_memory: bool,
    pub events: Vec<Event>,
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
    record_shapes: bool,
}

impl Span {
    /// Open a span of `kind` named `name` (`name` is built only when recording).
    pub fn begin(kind: EventKind, name: impl FnOnce() -> String) -> Span {
        if !active() {
            return Span { event: None, record_shapes: false };
        }
        let Some((start_ns, record_shapes)) = with_session(|s| (s.start.elapsed().as_nanos() as u64, s.record_shapes))
        else {
            return Span { event: None, record_shapes: false };
        };
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let parent = OPEN.with(|o| {
            let mut o = o.borrow_mut();
            let parent = o.last().copied();
            o.push(id);
            parent
        });
        let event = Event {
            id,
            parent,
            kind,
            name: name(),
            thread: THREAD.with(|t| *t),
            start_ns,
            end_ns: start_ns,
            device: None,
            shapes: Vec::new(),
            dtypes: Vec::new(),
            bytes: 0,
        };
        Span { event: Some(event), record_shapes }
    }

    /// Attach the device and, when shapes are recorded, the inputs' shapes and dtypes.
    pub fn inputs<'a>(&mut self, device: &Device, inputs: impl Iterator<Item = (&'a [usize], DType)>) {
        let Some(event) = self.event.as_mut() else { return };
        event.device = Some(device.clone());
        if self.record_shapes {
            for (shape, dtype) in inputs {
                event.shapes.push(shape.to_vec());
                event.dtypes.push(dtype);
            }
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        let Some(mut event) = self.event.take() else { return };
        OPEN.with(|o| {
            let mut o = o.borrow_mut();
            if let Some(i) = o.iter().rposition(|&id| id == event.id) {
                o.truncate(i);
            }
        });
        with_session(|s| {
            event.end_ns = s.start.elapsed().as_nanos() as u64;
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
        s.events.push(Event {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            parent: OPEN.with(|o| o.borrow().last().copied()),
            kind: EventKind::Memory,
            name: if bytes >= 0 { "[memory] allocate".into() } else { "[memory] free".into() },
            thread: THREAD.with(|t| *t),
            start_ns: now,
            end_ns: now,
            device: Some(device.clone()),
            shapes: Vec::new(),
            dtypes: Vec::new(),
            bytes,
        });
    });
}
