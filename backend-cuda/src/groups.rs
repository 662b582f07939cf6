//! Communicators across processes (interface 1.3) through NCCL: one process per GPU, each a
//! member of a group made from a unique id that one of them creates (`ncclCommInitRank`).
//!
//! NCCL itself never gives up on a member that stops taking part: its kernels wait forever,
//! and so would a thread that then synchronizes the stream. So each collective is followed by
//! an event, and a thread about to wait for a device that has collectives in flight
//! ([`wait_for_collectives`], called before every blocking wait of the device) polls those
//! events and NCCL's asynchronous error instead of blocking. When a collective has not
//! finished within the group's timeout (a peer died or hangs) or NCCL reports an error, it
//! aborts the communicator, which makes the waiting kernels return, and reports the reason;
//! every later call on the communicator fails with it. The polling is done by the waiting
//! thread itself, not a watchdog thread: a second thread calling into the driver while the
//! first is blocked in it was seen not to get through (on an H100 with NCCL 2.28).
//! Joining has its own guard: `ncclCommInitRank` runs on a thread of its own and the caller
//! stops waiting after the timeout.
//!
//! Each communicator has a stream of its own: a collective waits (through an event) for the
//! device's earlier work, then runs beside whatever the device does next, so data-parallel
//! training's gradient buckets travel while backward computes; `comm_wait` makes the
//! device's stream wait for them before anything reads the results.

use crate::device::CudaDevice;
use crate::nccl::{Nccl, SendComm, Stream, UniqueId};
use cudarc::driver::{result, sys, CudaContext};
use genesis_backend_api::{BackendError, CollectiveArg, CollectiveOp, CommId, ErrorKind, Result};
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Every member of this process, for the waits of their devices (weak: [`Groups`] owns them).
static MEMBERS: Mutex<Vec<Weak<Member>>> = Mutex::new(Vec::new());
/// Whether any communicator exists (a device wait checks nothing before the first).
static ANY: AtomicBool = AtomicBool::new(false);

/// Where a process sits in a group: its rank, the group's size, and how long to wait for the
/// others.
pub struct Seat {
    pub rank: usize,
    pub world_size: usize,
    pub timeout_ms: u64,
}

/// The communicators this process has joined.
#[derive(Default)]
pub struct Groups {
    next: AtomicU64,
    members: Mutex<HashMap<u64, Arc<Member>>>,
}

/// This process's membership of one group.
struct Member {
    nccl: Arc<Nccl>,
    rank: usize,
    world_size: usize,
    device: usize,
    timeout: Duration,
    ctx: Arc<CudaContext>,
    state: Mutex<State>,
}

struct State {
    /// `None` once aborted.
    comm: Option<SendComm>,
    /// The communicator's own stream (null once aborted).
    stream: Stream,
    /// Why the communicator was aborted.
    failed: Option<String>,
    /// Events after queued collectives, with the time by which each must have completed.
    pending: VecDeque<(Event, Instant)>,
}

/// A CUDA event (the raw handle, kept in a communicator's state).
struct Event(sys::CUevent);
// SAFETY: events may be used from any thread with their context bound; only under `state`.
unsafe impl Send for Event {}
// SAFETY: the stream handle is only used under `state`'s lock, with its context bound.
unsafe impl Send for State {}

fn comm_error(message: String) -> BackendError {
    BackendError::new(ErrorKind::Communication, message)
}

impl Groups {
    /// A new unique id.
    pub fn unique_id(nccl: &Nccl) -> Result<Vec<u8>> {
        Ok(nccl.unique_id()?.internal.iter().map(|&c| c as u8).collect())
    }

    /// Join the group `id` on `device` (index `index`) at `seat`; fails after the seat's
    /// timeout if not every member joins.
    pub fn join(&self, nccl: Arc<Nccl>, device: &CudaDevice, index: usize, id: &[u8], seat: Seat) -> Result<CommId> {
        let Seat { rank, world_size, timeout_ms } = seat;
        let mut unique = UniqueId { internal: [0; 128] };
        if id.len() != unique.internal.len() {
            return Err(BackendError::invalid(format!(
                "cuda: a communicator id is {} bytes, this one {}",
                unique.internal.len(),
                id.len()
            )));
        }
        for (dst, &src) in unique.internal.iter_mut().zip(id) {
            *dst = src as _;
        }
        let timeout = Duration::from_millis(timeout_ms);
        let (sender, receiver) = std::sync::mpsc::channel();
        let (ctx, joiner) = (device.context(), nccl.clone());
        std::thread::Builder::new()
            .name("genesis-nccl-join".into())
            .spawn(move || {
                let joined = ctx
                    .bind_to_thread()
                    .map_err(|e| comm_error(format!("cuda: binding the context to join a group: {e:?}")))
                    .and_then(|()| joiner.init_rank(unique, rank, world_size));
                // The caller may have stopped waiting; then the communicator is abandoned.
                if let Err(Ok(comm)) = sender.send(joined).map_err(|e| e.0) {
                    let _ = joiner.abort(&comm);
                }
            })
            .map_err(|e| comm_error(format!("cuda: starting the thread that joins a group: {e}")))?;
        let comm = match receiver.recv_timeout(timeout) {
            Ok(joined) => joined?,
            Err(_) => {
                return Err(comm_error(format!(
                    "cuda:{index}: rank {rank} of {world_size}: the group was not complete after {timeout:?} (a rank \
                     did not join)"
                )))
            }
        };
        device.bind()?;
        let stream = match result::stream::create(result::stream::StreamKind::NonBlocking) {
            Ok(stream) => stream as Stream,
            Err(e) => {
                let _ = nccl.abort(&comm);
                return Err(comm_error(format!("cuda: creating a communicator's stream: {e:?}")));
            }
        };
        let member = Arc::new(Member {
            nccl,
            rank,
            world_size,
            device: index,
            timeout,
            ctx: device.context(),
            state: Mutex::new(State { comm: Some(comm), stream, failed: None, pending: VecDeque::new() }),
        });
        lock(&MEMBERS).push(Arc::downgrade(&member));
        ANY.store(true, Ordering::Release);
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.members).insert(id, member);
        if crate::nvrtc::verbose() {
            eprintln!("genesis-cuda: NCCL communicator {id}: rank {rank} of {world_size} on cuda:{index}");
        }
        Ok(CommId(id))
    }

    fn member(&self, comm: CommId) -> Result<Arc<Member>> {
        lock(&self.members)
            .get(&comm.0)
            .cloned()
            .ok_or_else(|| BackendError::invalid(format!("cuda: communicator {} is unknown or aborted", comm.0)))
    }

    /// Queue this member's part of `op`.
    pub fn run(
        &self,
        comm: CommId,
        op: CollectiveOp,
        root: usize,
        world_size: usize,
        device: &CudaDevice,
        arg: &CollectiveArg,
    ) -> Result<()> {
        let index = arg.device as usize;
        let member = self.member(comm)?;
        device.bind()?;
        if world_size != member.world_size || index != member.device {
            return Err(BackendError::invalid(format!(
                "cuda: communicator {} is rank {} of {} on cuda:{}, called for a group of {world_size} on cuda:{index}",
                comm.0, member.rank, member.world_size, member.device
            )));
        }
        let dtype = arg.input.dtype()?;
        let (in_count, out_count) = (arg.input.numel(), arg.output.numel());
        let input = device.operand(&arg.input)?.ptr as *const c_void;
        let output = device.operand(&arg.output)?.ptr as *mut c_void;
        let mut state = lock(&member.state);
        check(&member, &mut state)?;
        let Some(nccl_comm) = &state.comm else {
            return Err(comm_error(format!("cuda: communicator {} was aborted", comm.0)));
        };
        let (device_stream, own) = (device.stream(), state.stream as sys::CUstream);
        let event = |what: &str| {
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(|e| comm_error(format!("cuda: cuEventCreate {what} a collective: {e:?}")))
        };
        // After the device's earlier work (which made the input)...
        let ready = event("before")?;
        // SAFETY: new events of this context, the device's stream and the communicator's.
        unsafe {
            let ordered = result::event::record(ready, device_stream)
                .and_then(|()| result::stream::wait_event(own, ready, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT));
            // Released once the wait has been satisfied.
            let _ = result::event::destroy(ready);
            ordered.map_err(|e| comm_error(format!("cuda: ordering a collective after the device's work: {e:?}")))?;
        }
        // ...on the communicator's stream, beside the device's later work.
        if in_count + out_count > 0 {
            member.nccl.enqueue(op, nccl_comm, input, output, in_count, out_count, dtype, root, own as Stream)?;
        }
        let event = event("after")?;
        // SAFETY: a new event and the communicator's stream.
        unsafe { result::event::record(event, own) }
            .map_err(|e| comm_error(format!("cuda: cuEventRecord after a collective: {e:?}")))?;
        state.pending.push_back((Event(event), Instant::now() + member.timeout));
        drop(state);
        device.note_issued(format!("{} across processes ({dtype}, rank {} of {world_size})", op.name(), member.rank))
    }

    /// Make `device`'s later work wait for the collectives queued on `comm` so far.
    pub fn wait(&self, comm: CommId, device: &CudaDevice) -> Result<()> {
        let member = self.member(comm)?;
        device.bind()?;
        let mut state = lock(&member.state);
        check(&member, &mut state)?;
        if let Some((last, _)) = state.pending.back() {
            // SAFETY: a live event (pending events are destroyed only when removed) and the
            // device's stream.
            unsafe {
                result::stream::wait_event(device.stream(), last.0, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
            }
            .map_err(|e| comm_error(format!("cuda: ordering the device's work after collectives: {e:?}")))?;
        }
        Ok(())
    }

    /// Abort and forget `comm`.
    pub fn abort(&self, comm: CommId) -> Result<()> {
        let member = lock(&self.members)
            .remove(&comm.0)
            .ok_or_else(|| BackendError::invalid(format!("cuda: communicator {} is unknown or aborted", comm.0)))?;
        let mut state = lock(&member.state);
        abort_locked(&member, &mut state, "aborted by its owner".into())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Abort the communicator and drop the pending events (the state's lock is held).
fn abort_locked(member: &Member, state: &mut State, why: String) -> Result<()> {
    let aborted = match state.comm.take() {
        Some(comm) => member.nccl.abort(&comm),
        None => Ok(()),
    };
    if state.failed.is_none() {
        state.failed = Some(why);
    }
    if member.ctx.bind_to_thread().is_ok() {
        for (event, _) in state.pending.drain(..) {
            // SAFETY: each event was created for this communicator and is destroyed once.
            let _ = unsafe { result::event::destroy(event.0) };
        }
        if !state.stream.is_null() {
            // SAFETY: the communicator's stream, destroyed once (then null).
            let _ = unsafe { result::stream::destroy(state.stream as sys::CUstream) };
            state.stream = std::ptr::null_mut();
        }
    }
    aborted
}

/// Look at `member`'s collectives without waiting: drop the finished ones; abort the
/// communicator when one is past its deadline or NCCL reports an error. `Err` once aborted.
/// Returns whether collectives are still in flight.
fn check(member: &Member, state: &mut State) -> Result<bool> {
    if let Some(why) = &state.failed {
        return Err(comm_error(why.clone()));
    }
    let Some(comm) = &state.comm else { return Ok(false) };
    let failure = match member.nccl.async_error(comm) {
        Err(e) => Some(format!("rank {} of {}: NCCL reported {}", member.rank, member.world_size, e.message)),
        Ok(()) => loop {
            let Some((event, deadline)) = state.pending.front() else { break None };
            // SAFETY: a live event of this member's context, which the caller has bound.
            match unsafe { result::event::query(event.0) } {
                Ok(()) => {
                    // SAFETY: completed, destroyed once.
                    let _ = unsafe { result::event::destroy(event.0) };
                    state.pending.pop_front();
                }
                // Anything but "not ready" is the device's own failure (a kernel fault): say
                // so at once rather than wait out the timeout and blame the other ranks.
                Err(e) if e.0 != sys::CUresult::CUDA_ERROR_NOT_READY => {
                    break Some(format!(
                        "rank {} of {}: the device failed while collectives were in flight: {e:?}",
                        member.rank, member.world_size
                    ))
                }
                Err(_) if Instant::now() > *deadline => {
                    break Some(format!(
                        "rank {} of {}: a collective did not finish within {:?}: another rank failed, exited or hangs",
                        member.rank, member.world_size, member.timeout
                    ))
                }
                Err(_) => break None,
            }
        },
    };
    if let Some(why) = failure {
        eprintln!("genesis-cuda: aborting NCCL communicator: {why}");
        let _ = abort_locked(member, state, why.clone());
        return Err(comm_error(why));
    }
    Ok(!state.pending.is_empty())
}

/// Before a thread blocks on device `index` (its context bound): wait, polling, until the
/// collectives in flight there have finished, and fail (after aborting their communicator)
/// when one outlives its timeout. Free when no communicator exists.
pub fn wait_for_collectives(index: usize) -> Result<()> {
    if !ANY.load(Ordering::Acquire) {
        return Ok(());
    }
    let members: Vec<Arc<Member>> = {
        let mut all = lock(&MEMBERS);
        all.retain(|m| m.strong_count() > 0);
        all.iter().filter_map(Weak::upgrade).filter(|m| m.device == index).collect()
    };
    let mut pause = Duration::from_micros(20);
    loop {
        let mut busy = false;
        for member in &members {
            let mut state = lock(&member.state);
            // A communicator that failed was reported by the wait or call that saw it fail;
            // its stream is gone and the device no longer waits for it, so later waits of
            // the device (saving a checkpoint after the error) go on.
            if state.failed.is_some() && state.pending.is_empty() {
                continue;
            }
            busy |= check(member, &mut state)?;
        }
        if !busy {
            return Ok(());
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
}
