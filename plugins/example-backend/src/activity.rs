//! Device activity records (optional, interface 1.4): what the profiler uses for exact device
//! times. This backend finishes each op inside its `execute` call, on the calling thread, so
//! an op's record is simply that call's start and end on the host clock; an asynchronous
//! backend collects its device's own records instead (the CUDA backend uses CUPTI).
//!
//! Setting `GENESIS_EXAMPLE_ACTIVITY=off` makes `activity_start` report `Unsupported`, so
//! the profiler's fallback to timing events can be tested with this plugin too.

use genesis_backend_api::abi_stable::std_types::RString;
use genesis_backend_api::{BackendError, DeviceActivity, Result};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

/// Set while recording, so `execute` pays one atomic load when not recording.
static RECORDING: AtomicBool = AtomicBool::new(false);
static RECORDS: Mutex<Vec<DeviceActivity>> = Mutex::new(Vec::new());

thread_local! {
    static TAG: Cell<u64> = const { Cell::new(0) };
}

/// The activity clock: nanoseconds since the first use.
fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

pub fn start() -> Result<u64> {
    if std::env::var("GENESIS_EXAMPLE_ACTIVITY").is_ok_and(|v| v == "off") {
        return Err(BackendError::unsupported("activity records are switched off (GENESIS_EXAMPLE_ACTIVITY=off)"));
    }
    if RECORDING.swap(true, Ordering::AcqRel) {
        return Err(BackendError::invalid("activity is already being recorded"));
    }
    RECORDS.lock().unwrap_or_else(PoisonError::into_inner).clear();
    Ok(now_ns())
}

pub fn tag(tag: u64) {
    TAG.with(|t| t.set(tag));
}

pub fn stop() -> Result<Vec<DeviceActivity>> {
    if !RECORDING.swap(false, Ordering::AcqRel) {
        return Err(BackendError::invalid("activity is not being recorded"));
    }
    Ok(std::mem::take(&mut *RECORDS.lock().unwrap_or_else(PoisonError::into_inner)))
}

/// Run `work` (the op `name` on the one device), recording it when activity is recorded.
pub fn record(name: &str, work: impl FnOnce() -> Result<()>) -> Result<()> {
    if !RECORDING.load(Ordering::Acquire) {
        return work();
    }
    let start_ns = now_ns();
    let result = work();
    let record = DeviceActivity {
        device: 0,
        tag: TAG.with(Cell::get),
        stream: 0,
        start_ns,
        end_ns: now_ns(),
        name: RString::from(name),
    };
    RECORDS.lock().unwrap_or_else(PoisonError::into_inner).push(record);
    result
}
