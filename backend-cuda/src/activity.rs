//! Device activity records through CUPTI (interface 1.4): every kernel, copy and fill the
//! GPUs run while the profiler records, with device start and end times and the op that
//! issued it. This is how `torch.profiler` times CUDA work, and it costs the host far less
//! than a CUDA event before and after each op.
//!
//! CUPTI (`libcupti.so`) ships with the CUDA toolkit (`extras/CUPTI/lib64`) and in Python
//! wheels; it is opened on the first `activity_start`, and without it the profiler falls back
//! to CUDA events. The profiler tags each op's work by pushing the op's id as a CUPTI
//! *external correlation id* on the issuing thread: CUPTI then emits, for every driver or
//! runtime call made under it, a record tying the call's correlation id to ours, and the
//! kernel, copy and fill records carry the call's correlation id. Records arrive in buffers
//! CUPTI asks us for and hands back when full or flushed, possibly on its own thread.
//!
//! Only the record fields below are read. Their offsets are the same in every version of the
//! record since CUDA 11 (`CUpti_ActivityKernel4`..`13`, `CUpti_ActivityMemcpy5`/`6`,
//! `CUpti_ActivityMemset4`, from `cupti_activity.h`), and CUPTI hands out records of its own
//! version, so the prefix read here fits whichever libcupti is loaded.

use crate::libs::{self, Found};
use genesis_backend_api::abi_stable::std_types::RString;
use genesis_backend_api::{BackendError, DeviceActivity, ErrorKind, Result};
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// `CUptiResult`; 0 is success.
type Status = u32;
const SUCCESS: Status = 0;

/// `CUpti_ActivityKind` values used here.
const MEMCPY: u32 = 1;
const MEMSET: u32 = 2;
const DRIVER: u32 = 4;
const RUNTIME: u32 = 5;
const CONCURRENT_KERNEL: u32 = 10;
const EXTERNAL_CORRELATION: u32 = 39;
/// What is enabled, in order: the API kinds are needed for the correlation records.
const KINDS: [u32; 6] = [CONCURRENT_KERNEL, MEMCPY, MEMSET, DRIVER, RUNTIME, EXTERNAL_CORRELATION];

/// `CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0`: ids of our own choosing.
const CUSTOM0: u32 = 3;
/// `CUPTI_ACTIVITY_FLAG_FLUSH_FORCED`: flush records of unfinished buffers too.
const FLUSH_FORCED: u32 = 1;

/// The common head of every activity record.
#[repr(C)]
struct Header {
    kind: u32,
}

/// The prefix of `CUpti_ActivityKernel4`..`13` (offsets checked by the test below).
#[repr(C)]
struct KernelRecord {
    kind: u32,
    cache_config: u8,
    shared_memory_config: u8,
    registers_per_thread: u16,
    partitioned_global_cache_requested: u32,
    partitioned_global_cache_executed: u32,
    start: u64,
    end: u64,
    completed: u64,
    device_id: u32,
    context_id: u32,
    stream_id: u32,
    grid: [i32; 3],
    block: [i32; 3],
    static_shared_memory: i32,
    dynamic_shared_memory: i32,
    local_memory_per_thread: u32,
    local_memory_total: u32,
    correlation_id: u32,
    grid_id: i64,
    name: *const c_char,
}

/// The prefix shared by `CUpti_ActivityMemcpy5`/`6` and `CUpti_ActivityMemset4`: the byte
/// after `kind` is a copy's `copyKind` (a fill's `value` starts there).
#[repr(C)]
struct TransferRecord {
    kind: u32,
    copy_kind: u8,
    _kinds_and_flags: [u8; 3],
    bytes: u64,
    start: u64,
    end: u64,
    device_id: u32,
    context_id: u32,
    stream_id: u32,
    correlation_id: u32,
}

/// `CUpti_ActivityExternalCorrelation`.
#[repr(C)]
struct CorrelationRecord {
    kind: u32,
    external_kind: u32,
    external_id: u64,
    correlation_id: u32,
    reserved: u32,
}

type RequestBuffer = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
type BufferComplete = unsafe extern "C" fn(*mut std::ffi::c_void, u32, *mut u8, usize, usize);

/// The CUPTI entry points used, from `libcupti`.
struct Cupti {
    found: Found,
    register_callbacks: unsafe extern "C" fn(RequestBuffer, BufferComplete) -> Status,
    enable: unsafe extern "C" fn(u32) -> Status,
    disable: unsafe extern "C" fn(u32) -> Status,
    flush_all: unsafe extern "C" fn(u32) -> Status,
    next_record: unsafe extern "C" fn(*mut u8, usize, *mut *mut Header) -> Status,
    push: unsafe extern "C" fn(u32, u64) -> Status,
    pop: unsafe extern "C" fn(u32, *mut u64) -> Status,
    timestamp: unsafe extern "C" fn(*mut u64) -> Status,
    result_string: unsafe extern "C" fn(Status, *mut *const c_char) -> Status,
}

impl Cupti {
    fn open() -> Result<Cupti> {
        let found = libs::open("cupti", "cuda_cupti")
            .map_err(|e| BackendError::unsupported(format!("activity records need CUPTI, which was not found: {e}")))?;
        // SAFETY: the types are the documented C signatures of these CUPTI functions.
        unsafe {
            Ok(libs::entry_points!(found, Cupti {
                register_callbacks: "cuptiActivityRegisterCallbacks",
                enable: "cuptiActivityEnable",
                disable: "cuptiActivityDisable",
                flush_all: "cuptiActivityFlushAll",
                next_record: "cuptiActivityGetNextRecord",
                push: "cuptiActivityPushExternalCorrelationId",
                pop: "cuptiActivityPopExternalCorrelationId",
                timestamp: "cuptiGetTimestamp",
                result_string: "cuptiGetResultString",
                ;
                found,
            }))
        }
    }

    /// `status` as an error naming the call, in CUPTI's words.
    fn check(&self, status: Status, call: &str) -> Result<()> {
        if status == SUCCESS {
            return Ok(());
        }
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: CUPTI writes a pointer to a static string.
        let words = if unsafe { (self.result_string)(status, &mut text) } == SUCCESS && !text.is_null() {
            unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
        } else {
            format!("CUPTI error {status}")
        };
        Err(BackendError::new(ErrorKind::Internal, format!("cuda: {call} ({}) failed: {words}", self.found.path)))
    }
}

/// CUPTI, opened once; the error is kept and repeated.
fn cupti() -> Result<&'static Cupti> {
    static CUPTI: OnceLock<std::result::Result<Cupti, BackendError>> = OnceLock::new();
    CUPTI.get_or_init(Cupti::open).as_ref().map_err(Clone::clone)
}

/// What a buffer held that we keep: work records, and correlation ids to tags.
#[derive(Default)]
struct Collected {
    work: Vec<Work>,
    /// (correlation id, tag) pairs.
    tags: Vec<(u32, u64)>,
}

/// A kernel, copy or fill as read from its record.
struct Work {
    correlation_id: u32,
    device: u32,
    stream: u32,
    start: u64,
    end: u64,
    name: String,
}

/// Set between `start` and `stop`; `tag` does nothing outside.
static RECORDING: AtomicBool = AtomicBool::new(false);
/// CUPTI's clock when the current session started.
static SESSION_START: AtomicU64 = AtomicU64::new(0);
static COLLECTED: Mutex<Collected> = Mutex::new(Collected { work: Vec::new(), tags: Vec::new() });

thread_local! {
    /// Whether this thread has an id of ours pushed.
    static PUSHED: Cell<bool> = const { Cell::new(false) };
}

const BUFFER_BYTES: usize = 8 << 20;
const BUFFER_ALIGN: usize = 8;

fn buffer_layout() -> std::alloc::Layout {
    // Constant, valid size and alignment.
    std::alloc::Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN).unwrap_or_else(|_| unreachable!())
}

/// CUPTI asks for an empty buffer.
unsafe extern "C" fn request_buffer(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    // SAFETY: a non-zero size; freed in `buffer_complete`, which CUPTI calls for every buffer.
    let memory = unsafe { std::alloc::alloc(buffer_layout()) };
    unsafe {
        *buffer = memory;
        *size = if memory.is_null() { 0 } else { BUFFER_BYTES };
        // 0: as many records as fit.
        *max_records = 0;
    }
}

/// CUPTI hands back a buffer holding `valid` bytes of records: read them, free it.
unsafe extern "C" fn buffer_complete(
    _context: *mut std::ffi::c_void,
    _stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    if let Ok(cupti) = cupti() {
        let mut collected = COLLECTED.lock().unwrap_or_else(PoisonError::into_inner);
        let mut record: *mut Header = std::ptr::null_mut();
        // SAFETY: CUPTI walks its own buffer and points `record` at each record in it, which
        // stays valid until the buffer is freed below.
        while unsafe { (cupti.next_record)(buffer, valid, &mut record) } == SUCCESS {
            unsafe { read(&*record, &mut collected) };
        }
    }
    // SAFETY: allocated by `request_buffer` with this layout.
    unsafe { std::alloc::dealloc(buffer, buffer_layout()) };
}

/// Keep what a record says.
///
/// # Safety
/// `record` must be a whole CUPTI activity record of the kind its header names.
unsafe fn read(record: &Header, collected: &mut Collected) {
    let at = record as *const Header;
    match record.kind {
        CONCURRENT_KERNEL => {
            let kernel = unsafe { &*(at as *const KernelRecord) };
            let name = if kernel.name.is_null() {
                "kernel".to_string()
            } else {
                unsafe { CStr::from_ptr(kernel.name) }.to_string_lossy().into_owned()
            };
            collected.work.push(Work {
                correlation_id: kernel.correlation_id,
                device: kernel.device_id,
                stream: kernel.stream_id,
                start: kernel.start,
                end: kernel.end,
                name,
            });
        }
        MEMCPY | MEMSET => {
            let transfer = unsafe { &*(at as *const TransferRecord) };
            let name = if record.kind == MEMSET {
                "Memset".to_string()
            } else {
                format!("Memcpy {}", copy_name(transfer.copy_kind))
            };
            collected.work.push(Work {
                correlation_id: transfer.correlation_id,
                device: transfer.device_id,
                stream: transfer.stream_id,
                start: transfer.start,
                end: transfer.end,
                name,
            });
        }
        EXTERNAL_CORRELATION => {
            let link = unsafe { &*(at as *const CorrelationRecord) };
            if link.external_kind == CUSTOM0 {
                collected.tags.push((link.correlation_id, link.external_id));
            }
        }
        _ => {}
    }
}

/// `CUpti_ActivityMemcpyKind` as PyTorch's traces name it.
fn copy_name(kind: u8) -> &'static str {
    match kind {
        1 => "HtoD",
        2 => "DtoH",
        8 => "DtoD",
        9 => "HtoH",
        10 => "PtoP",
        _ => "(other)",
    }
}

/// Start recording; returns CUPTI's clock in nanoseconds.
pub fn start() -> Result<u64> {
    let cupti = cupti()?;
    static CALLBACKS: OnceLock<Result<()>> = OnceLock::new();
    CALLBACKS
        .get_or_init(|| {
            // SAFETY: both callbacks have CUPTI's signatures and live for the process.
            cupti.check(
                unsafe { (cupti.register_callbacks)(request_buffer, buffer_complete) },
                "cuptiActivityRegisterCallbacks",
            )
        })
        .clone()?;
    if RECORDING.swap(true, Ordering::AcqRel) {
        return Err(BackendError::invalid("activity is already being recorded"));
    }
    *COLLECTED.lock().unwrap_or_else(PoisonError::into_inner) = Collected::default();
    let mut now = 0u64;
    let enabled = KINDS.iter().enumerate().try_for_each(|(i, &kind)| {
        // SAFETY: plain calls with valid kinds.
        cupti.check(unsafe { (cupti.enable)(kind) }, "cuptiActivityEnable").inspect_err(|_| disable(&KINDS[..i]))
    });
    // SAFETY: CUPTI writes one u64.
    let started = enabled.and_then(|()| {
        cupti.check(unsafe { (cupti.timestamp)(&mut now) }, "cuptiGetTimestamp").inspect_err(|_| disable(&KINDS))
    });
    if let Err(e) = started {
        RECORDING.store(false, Ordering::Release);
        return Err(e);
    }
    // Records a previous session's flush missed may still arrive; they start before this.
    SESSION_START.store(now, Ordering::Release);
    Ok(now)
}

/// Stop recording `kinds` (best effort: on the way out of an error or a session).
fn disable(kinds: &[u32]) {
    if let Ok(cupti) = cupti() {
        for &kind in kinds {
            // SAFETY: plain calls with valid kinds.
            unsafe { (cupti.disable)(kind) };
        }
    }
}

/// Pop the id this thread pushed, if any; returns it.
fn pop_own(cupti: &Cupti) -> Result<Option<u64>> {
    PUSHED.with(|pushed| {
        if !pushed.replace(false) {
            return Ok(None);
        }
        let mut last = 0u64;
        // SAFETY: pops the id this thread pushed.
        cupti.check(unsafe { (cupti.pop)(CUSTOM0, &mut last) }, "cuptiActivityPopExternalCorrelationId")?;
        Ok(Some(last))
    })
}

/// Push `id` on this thread.
fn push(cupti: &Cupti, id: u64) -> Result<()> {
    // SAFETY: plain call.
    cupti.check(unsafe { (cupti.push)(CUSTOM0, id) }, "cuptiActivityPushExternalCorrelationId")?;
    PUSHED.with(|pushed| pushed.set(true));
    Ok(())
}

/// Tag this thread's work from now on with `tag` (0: none).
pub fn tag(tag: u64) -> Result<()> {
    if !RECORDING.load(Ordering::Relaxed) {
        return Ok(());
    }
    let cupti = cupti()?;
    let previous = pop_own(cupti)?;
    if tag == 0 {
        return Ok(());
    }
    push(cupti, tag).inspect_err(|_| {
        // Keep the work tagged as it was rather than untagged.
        if let Some(previous) = previous {
            let _ = push(cupti, previous);
        }
    })
}

/// Stop recording (the host has synchronized the devices) and return what ran, tagged.
pub fn stop() -> Result<Vec<DeviceActivity>> {
    if !RECORDING.swap(false, Ordering::AcqRel) {
        return Err(BackendError::invalid("activity is not being recorded"));
    }
    let cupti = cupti()?;
    let popped = pop_own(cupti);
    // Disable first, then flush: no record is made after the flush (as Kineto does).
    disable(&KINDS);
    // SAFETY: plain call; the flush calls `buffer_complete` for every buffer before it returns.
    cupti.check(unsafe { (cupti.flush_all)(FLUSH_FORCED) }, "cuptiActivityFlushAll")?;
    popped?;
    let collected = std::mem::take(&mut *COLLECTED.lock().unwrap_or_else(PoisonError::into_inner));
    let tags: HashMap<u32, u64> = collected.tags.into_iter().collect();
    let session_start = SESSION_START.load(Ordering::Acquire);
    Ok(collected
        .work
        .into_iter()
        .filter(|w| w.start >= session_start)
        .map(|w| DeviceActivity {
            device: w.device,
            tag: tags.get(&w.correlation_id).copied().unwrap_or(0),
            stream: w.stream,
            start_ns: w.start,
            end_ns: w.end,
            name: RString::from(w.name),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// The offsets of the named fields of a record type, in order.
    macro_rules! offsets {
        ($record:ty: $($field:ident),*) => {
            [$(offset_of!($record, $field)),*]
        };
    }

    /// The offsets of `cupti_activity.h` (CUDA 12 and 13) for the fields read.
    #[test]
    fn record_prefixes_match_cupti() {
        let kernel = offsets!(KernelRecord: start, end, device_id, stream_id, correlation_id, name);
        assert_eq!(kernel, [16, 24, 40, 48, 92, 104]);
        let transfer = offsets!(TransferRecord: copy_kind, start, device_id, stream_id, correlation_id);
        assert_eq!(transfer, [4, 16, 32, 40, 44]);
        assert_eq!(offsets!(CorrelationRecord: external_id, correlation_id), [8, 16]);
    }
}
