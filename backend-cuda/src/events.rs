//! Timing events (interface 1.2): CUDA events recorded on the device's stream, handed to the
//! host as small integer handles and reused after release, so a profiled step does not create
//! two driver events per op.

use crate::device::driver_error;
use cudarc::driver::{result, sys};
use genesis_backend_api::{BackendError, EventId, Result};
use std::collections::HashMap;

/// The events of one device: recorded ones by handle, and released ones ready for reuse.
#[derive(Default)]
pub struct EventPool {
    live: HashMap<u64, sys::CUevent>,
    free: Vec<sys::CUevent>,
    next: u64,
}

// SAFETY: CUDA events may be used from any thread once the context is current; the pool is
// only touched under the device's mutex.
unsafe impl Send for EventPool {}

impl EventPool {
    /// Record an event on `stream` (the caller has bound the context).
    pub fn record(&mut self, stream: sys::CUstream) -> Result<EventId> {
        let event = match self.free.pop() {
            Some(event) => event,
            None => result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(|e| driver_error("cuEventCreate", e))?,
        };
        // SAFETY: a live event of this context and the device's stream.
        if let Err(e) = unsafe { result::event::record(event, stream) } {
            self.free.push(event);
            return Err(driver_error("cuEventRecord", e));
        }
        self.next += 1;
        self.live.insert(self.next, event);
        Ok(EventId(self.next))
    }

    fn get(&self, id: EventId) -> Result<sys::CUevent> {
        self.live
            .get(&id.0)
            .copied()
            .ok_or_else(|| BackendError::invalid(format!("cuda: timing event {} is unknown or released", id.0)))
    }

    /// Microseconds from `start` to `end`, waiting for `end`.
    pub fn elapsed_us(&self, start: EventId, end: EventId) -> Result<f64> {
        let (start, end) = (self.get(start)?, self.get(end)?);
        // SAFETY: both are live, recorded events of this context.
        unsafe {
            result::event::synchronize(end).map_err(|e| driver_error("cuEventSynchronize", e))?;
            let ms = result::event::elapsed(start, end).map_err(|e| driver_error("cuEventElapsedTime", e))?;
            Ok(f64::from(ms) * 1e3)
        }
    }

    /// Return events to the pool; unknown handles are an error after the known ones are freed.
    pub fn release(&mut self, ids: &[EventId]) -> Result<()> {
        let mut unknown = None;
        for id in ids {
            match self.live.remove(&id.0) {
                Some(event) => self.free.push(event),
                None => unknown = Some(id.0),
            }
        }
        match unknown {
            Some(id) => Err(BackendError::invalid(format!("cuda: timing event {id} is unknown or released"))),
            None => Ok(()),
        }
    }

    /// Destroy every event (the context must be current).
    pub fn destroy_all(&mut self) {
        for event in self.free.drain(..).chain(self.live.drain().map(|(_, e)| e)) {
            // SAFETY: each event was created by this pool and is destroyed once.
            let _ = unsafe { result::event::destroy(event) };
        }
    }
}
