//! Collectives through NCCL, opened at run time like cuBLAS.
//!
//! One process drives every participating GPU (single-process, multi-device NCCL): the first
//! call for a set of devices makes one communicator per device with `ncclCommInitAll` and
//! keeps them for the process; each collective is then a group of per-rank calls, one per
//! device, queued on that device's stream after its earlier work. Nothing waits: like a
//! kernel, a collective's completion is seen at the next synchronize or read.

use crate::device::CudaDevice;
use crate::libs::{self, Found};
use genesis_backend_api::{BackendError, CollectiveOp, DType, Rank, Result};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

type Comm = *mut c_void;
pub type Stream = *mut c_void;

/// A communicator of a group of processes, movable between threads (NCCL allows its use
/// from any thread; the owner serializes the calls).
pub struct SendComm(Comm);
// SAFETY: see the type's doc; every use is under its owner's lock.
unsafe impl Send for SendComm {}
unsafe impl Sync for SendComm {}
type Status = c_int;

/// `ncclRedOp_t`'s sum.
const SUM: c_int = 0;

/// `ncclDataType_t` for our dtypes; bool travels as bytes (only copied, never summed: the
/// interface's checks refuse a sum of bool before we are called).
fn data_type(dtype: DType) -> c_int {
    match dtype {
        DType::U8 | DType::Bool => 1,
        DType::I32 => 2,
        DType::I64 => 4,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::BF16 => 9,
    }
}

/// `(send, recv, count, type, op or root, comm, stream)`: ncclAllReduce, ncclReduceScatter
/// (op) and ncclBroadcast (root).
type SendRecvWith = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Status;
/// `(send, recv, count, type, comm, stream)`: ncclAllGather.
type SendRecv = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> Status;

/// `ncclUniqueId`: the bytes one process makes and every member of a group joins with.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [c_char; 128],
}

/// The NCCL library and the communicators made so far.
pub struct Nccl {
    found: Found,
    /// `ncclGetVersion`'s code (22703 for 2.27.3).
    version: c_int,
    init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> Status,
    all_reduce: SendRecvWith,
    broadcast: SendRecvWith,
    all_gather: SendRecv,
    reduce_scatter: SendRecvWith,
    group_start: unsafe extern "C" fn() -> Status,
    group_end: unsafe extern "C" fn() -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Status,
    init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> Status,
    abort: unsafe extern "C" fn(Comm) -> Status,
    get_async_error: unsafe extern "C" fn(Comm, *mut Status) -> Status,
    /// Communicators by the ordered device list they were made for. The lock is held for a
    /// whole group so that two threads never interleave their calls on one communicator
    /// (every rank must see collectives in the same order).
    communicators: Mutex<HashMap<Vec<c_int>, Vec<Comm>>>,
}

// SAFETY: NCCL communicators may be used from any thread; every use is under `communicators`.
unsafe impl Send for Nccl {}
unsafe impl Sync for Nccl {}

impl Nccl {
    /// Open `libnccl.so.2` (the loader's path, the CUDA directories, Python wheels).
    pub fn open() -> Result<Nccl> {
        let names: Vec<String> =
            if cfg!(windows) { vec!["nccl.dll".into()] } else { vec!["libnccl.so.2".into(), "libnccl.so".into()] };
        let found = libs::open_named("nccl", &names, "nccl")?;
        // SAFETY: the types are the documented C signatures of these NCCL functions.
        unsafe {
            let get_version: unsafe extern "C" fn(*mut c_int) -> Status = libs::symbol(&found, "ncclGetVersion")?;
            let mut version = 0;
            get_version(&mut version);
            // bf16 reductions arrived in NCCL 2.10; older versions would misread its code.
            if version < 21000 {
                return Err(BackendError::unsupported(format!(
                    "cuda: {} is NCCL {version}; collectives need NCCL 2.10 or newer",
                    found.path
                )));
            }
            Ok(libs::entry_points!(found, Nccl {
                init_all: "ncclCommInitAll",
                all_reduce: "ncclAllReduce",
                broadcast: "ncclBroadcast",
                all_gather: "ncclAllGather",
                reduce_scatter: "ncclReduceScatter",
                group_start: "ncclGroupStart",
                group_end: "ncclGroupEnd",
                error_string: "ncclGetErrorString",
                get_unique_id: "ncclGetUniqueId",
                init_rank: "ncclCommInitRank",
                abort: "ncclCommAbort",
                get_async_error: "ncclCommGetAsyncError",
                ;
                communicators: Mutex::new(HashMap::new()),
                version,
                found,
            }))
        }
    }

    /// `ncclGetUniqueId`.
    pub fn unique_id(&self) -> Result<UniqueId> {
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: NCCL writes the 128 bytes of `id`.
        self.check("ncclGetUniqueId", unsafe { (self.get_unique_id)(&mut id) })?;
        Ok(id)
    }

    /// `ncclCommInitRank` on the calling thread's current device; blocks until every member
    /// has joined.
    pub fn init_rank(&self, id: UniqueId, rank: usize, world_size: usize) -> Result<SendComm> {
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: `comm` receives the new communicator; `id` is passed by value as NCCL takes it.
        let status = unsafe { (self.init_rank)(&mut comm, world_size as c_int, id, rank as c_int) };
        self.check(&format!("ncclCommInitRank (rank {rank} of {world_size})"), status)?;
        Ok(SendComm(comm))
    }

    /// `ncclCommAbort`: frees the communicator and makes its queued collectives return.
    pub fn abort(&self, comm: &SendComm) -> Result<()> {
        // SAFETY: a communicator made by `init_rank`, aborted once by its owner.
        self.check("ncclCommAbort", unsafe { (self.abort)(comm.0) })
    }

    /// The communicator's asynchronous error (a failed peer, a network error), if any.
    pub fn async_error(&self, comm: &SendComm) -> Result<()> {
        let mut status: Status = 0;
        // SAFETY: a live communicator; NCCL writes `status`.
        self.check("ncclCommGetAsyncError", unsafe { (self.get_async_error)(comm.0, &mut status) })?;
        self.check("a collective (asynchronous error)", status)
    }

    /// Queue one member's part of `op` on `stream` (counts in elements: the input's, and the
    /// output's for a reduce-scatter).
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(
        &self,
        op: CollectiveOp,
        comm: &SendComm,
        input: *const c_void,
        output: *mut c_void,
        in_count: usize,
        out_count: usize,
        dtype: DType,
        root: usize,
        stream: Stream,
    ) -> Result<()> {
        let status = self.call(op, comm.0, input, output, in_count, out_count, data_type(dtype), root as c_int, stream);
        self.check(&format!("nccl {}", op.name()), status)
    }

    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        op: CollectiveOp,
        comm: Comm,
        input: *const c_void,
        output: *mut c_void,
        in_count: usize,
        out_count: usize,
        nccl_type: c_int,
        root: c_int,
        stream: Stream,
    ) -> Status {
        // SAFETY: the callers resolved the addresses against live buffers of the
        // communicator's device for the counts the SDK checked.
        unsafe {
            match op {
                CollectiveOp::AllReduceSum => (self.all_reduce)(input, output, in_count, nccl_type, SUM, comm, stream),
                CollectiveOp::Broadcast => (self.broadcast)(input, output, in_count, nccl_type, root, comm, stream),
                CollectiveOp::AllGather => (self.all_gather)(input, output, in_count, nccl_type, comm, stream),
                CollectiveOp::ReduceScatterSum => {
                    (self.reduce_scatter)(input, output, out_count, nccl_type, SUM, comm, stream)
                }
            }
        }
    }

    fn check(&self, call: &str, status: Status) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns a static string for any status.
        let text = unsafe { CStr::from_ptr((self.error_string)(status)) }.to_string_lossy().into_owned();
        Err(BackendError::internal(format!("cuda: {call} failed ({}, NCCL {}): {text}", self.found.path, self.version)))
    }

    /// Queue `op` over `ranks` (already checked by the SDK: distinct devices, one dtype,
    /// contiguous operands of fitting shapes).
    pub fn run(&self, op: CollectiveOp, ranks: &[Rank<'_, CudaDevice>]) -> Result<()> {
        let Some(first) = ranks.first() else { return Ok(()) };
        let dtype = first.input.dtype()?;
        // Every rank has the same counts; NCCL needs no call for nothing.
        if first.input.numel() == 0 && first.output.numel() == 0 {
            return Ok(());
        }
        let mut operands = Vec::with_capacity(ranks.len());
        for rank in ranks {
            let input = rank.device.operand(&rank.input)?.ptr as *const c_void;
            let output = rank.device.operand(&rank.output)?.ptr as *mut c_void;
            operands.push((input, output, rank.device.stream() as Stream));
        }
        let devices: Vec<c_int> = ranks.iter().map(|r| r.index as c_int).collect();
        let mut communicators = self.communicators.lock().unwrap_or_else(|p| p.into_inner());
        if !communicators.contains_key(&devices) {
            let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); devices.len()];
            // SAFETY: `comms` has one slot per listed device.
            let status = unsafe { (self.init_all)(comms.as_mut_ptr(), devices.len() as c_int, devices.as_ptr()) };
            self.check(&format!("ncclCommInitAll for devices {devices:?}"), status)?;
            if crate::nvrtc::verbose() {
                eprintln!(
                    "genesis-cuda: NCCL {} ({}): communicators for devices {devices:?}",
                    self.version, self.found.path
                );
            }
            communicators.insert(devices.clone(), comms);
        }
        let comms = &communicators[&devices];
        let nccl_type = data_type(dtype);
        let in_count = first.input.numel();
        let out_count = first.output.numel();
        // SAFETY: group calls pair up below even when a rank's call fails.
        self.check("ncclGroupStart", unsafe { (self.group_start)() })?;
        let mut issued = Ok(());
        for (&(input, output, stream), &comm) in operands.iter().zip(comms) {
            let status = self.call(op, comm, input, output, in_count, out_count, nccl_type, 0, stream);
            if issued.is_ok() {
                issued = self.check(&format!("nccl {}", op.name()), status);
            }
        }
        // SAFETY: closes the group opened above.
        let ended = self.check("ncclGroupEnd", unsafe { (self.group_end)() });
        issued?;
        ended?;
        drop(communicators);
        for rank in ranks {
            rank.device.note_issued(format!("{} ({dtype}, {} ranks)", op.name(), ranks.len()))?;
        }
        Ok(())
    }
}
