//! The safe traits a plugin author implements. [`crate::export_backend!`] turns them into the
//! plugin's exported module; nothing here knows about the wire format.

use crate::error::{BackendError, Result};
use crate::info::{BackendInfo, DeviceProperties, MemoryStats, Probe};
use crate::op::{Capability, CollectiveOp, Op};
use crate::tensor::{BufferId, TensorDesc};

/// One participant in a collective call: a device and its input and output tensors.
#[repr(C)]
#[derive(abi_stable::StableAbi, Debug, Clone, Copy)]
pub struct CollectiveArg {
    /// Device index within the backend.
    pub device: u32,
    /// What this device contributes.
    pub input: TensorDesc,
    /// Where this device's result goes.
    pub output: TensorDesc,
}

/// A timing event recorded on a device ([`Device::record_event`]): an opaque handle the host
/// only passes back to the same device.
#[repr(transparent)]
#[derive(abi_stable::StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId(pub u64);

/// A captured graph of device work ([`Device::capture_end`]): an opaque handle the host only
/// passes back to the device that captured it.
#[repr(transparent)]
#[derive(abi_stable::StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphId(pub u64);

/// One piece of work a device ran while activity was recorded
/// ([`Backend::activity_start`]): a kernel, a copy or a fill, with its device times.
#[repr(C)]
#[derive(abi_stable::StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct DeviceActivity {
    /// Device index within the backend.
    pub device: u32,
    /// The tag ([`Backend::activity_tag`]) in force on the thread that issued the work, 0 for
    /// none.
    pub tag: u64,
    /// The device queue (stream) it ran on, as the backend numbers them.
    pub stream: u32,
    /// Start on the backend's activity clock, in nanoseconds.
    pub start_ns: u64,
    /// End on the same clock.
    pub end_ns: u64,
    /// The kernel's name, or what the copy or fill was (`"Memcpy HtoD"`, `"Memset"`).
    pub name: abi_stable::std_types::RString,
}

/// A communicator: this process's membership, on one device, in a group of processes that
/// run collectives together ([`Backend::comm_init_rank`]); an opaque handle the host only
/// passes back to the same backend.
#[repr(transparent)]
#[derive(abi_stable::StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CommId(pub u64);

/// One participant of a collective as a backend sees it: its opened device and operands.
pub struct Rank<'a, D> {
    /// Device index within the backend.
    pub index: usize,
    /// The opened device.
    pub device: &'a D,
    /// What this device contributes.
    pub input: TensorDesc,
    /// Where this device's result goes.
    pub output: TensorDesc,
}

/// A device backend: the entry point of a plugin.
///
/// Constructing it must be cheap and must not touch device drivers; [`Backend::probe`] is
/// where drivers are first loaded. Every method may be called from several threads.
pub trait Backend: Send + Sync + 'static {
    /// The per-device state this backend opens.
    type Device: Device;

    /// Name, vendor and version.
    fn info(&self) -> BackendInfo;

    /// Count devices; when there are none, say why.
    fn probe(&self) -> Probe;

    /// Properties of device `index` (already checked to be in range).
    fn device_properties(&self, index: usize) -> Result<DeviceProperties>;

    /// Open device `index` (already checked to be in range). Called once per device.
    fn open_device(&self, index: usize) -> Result<Self::Device>;

    /// Run a collective over `ranks` (one per participating device, in rank order). The
    /// export layer has already checked them against the rules of [`crate::sdk::collective`]
    /// (distinct devices, one dtype, contiguous, shapes that fit the op) and opened their
    /// devices.
    ///
    /// Optional: the default, [`crate::sdk::collective::staged`], copies through the host.
    /// Work may be queued asynchronously on each device, like [`Device::execute`].
    fn collective(&self, op: CollectiveOp, ranks: &[Rank<'_, Self::Device>]) -> Result<()> {
        crate::sdk::collective::staged(op, ranks)
    }

    /// A new id for a group of processes (NCCL's unique id): bytes that one process makes
    /// and every member passes to [`Backend::comm_init_rank`].
    ///
    /// Optional (since 1.3), like the three functions after it: the default returns
    /// `Unsupported`, and the host then runs collectives between processes over its own
    /// transport, through host memory.
    fn comm_unique_id(&self) -> Result<Vec<u8>> {
        Err(BackendError::unsupported("communicators across processes are not implemented by this backend"))
    }

    /// Join the group named by `id` as member `rank` of `world_size`, on `device` (already
    /// opened, index `index`). Returns when every member has joined, or fails once
    /// `timeout_ms` have passed without that (a member that never arrives must not hang the
    /// others).
    fn comm_init_rank(
        &self,
        device: &Self::Device,
        index: usize,
        id: &[u8],
        rank: usize,
        world_size: usize,
        timeout_ms: u64,
    ) -> Result<CommId> {
        let _ = (device, index, id, rank, world_size, timeout_ms);
        Err(BackendError::unsupported("communicators across processes are not implemented by this backend"))
    }

    /// Queue this member's part of `op` on `comm`'s device (`root`: the source rank of a
    /// broadcast). The export layer has checked `arg` with
    /// [`crate::sdk::collective::check_member`] for a group of `world_size` and `root` against
    /// it; the backend must refuse a `world_size` that is not its communicator's. Like
    /// [`Device::execute`], work may be queued asynchronously; a member that stops taking part
    /// must make the others' collectives fail within the communicator's timeout rather than
    /// wait forever.
    fn comm_collective(
        &self,
        comm: CommId,
        op: CollectiveOp,
        root: usize,
        world_size: usize,
        device: &Self::Device,
        arg: &CollectiveArg,
    ) -> Result<()> {
        let _ = (comm, op, root, world_size, device, arg);
        Err(BackendError::unsupported("communicators across processes are not implemented by this backend"))
    }

    /// Make `device`'s work issued from now on wait for every collective queued on `comm`
    /// so far. A backend may run collectives beside the device's other work (on a second
    /// queue, so that communication overlaps computation): [`Backend::comm_collective`] is
    /// ordered after the device's earlier work, but later work is ordered after it only once
    /// this is called. The host calls it before it touches a collective's output. The default
    /// does nothing, which is right for a backend whose collectives run in issue order.
    fn comm_wait(&self, comm: CommId, device: &Self::Device) -> Result<()> {
        let _ = (comm, device);
        Ok(())
    }

    /// Leave and free `comm`, abandoning its unfinished collectives (NCCL's abort).
    fn comm_abort(&self, comm: CommId) -> Result<()> {
        let _ = comm;
        Err(BackendError::unsupported("communicators across processes are not implemented by this backend"))
    }

    /// Start recording the work every device of this backend runs (kernels, copies, fills)
    /// with its device times, as CUPTI's activity records do; returns the activity clock's
    /// current reading in nanoseconds, so the host can align it with its own clock.
    ///
    /// Optional (since 1.4), like the two functions after it: the default returns
    /// `Unsupported`, and the profiler then falls back to timing events
    /// ([`Device::record_event`]) or host times. Starting while already recording is an
    /// `InvalidArgument` error.
    fn activity_start(&self) -> Result<u64> {
        Err(BackendError::unsupported("activity records are not implemented by this backend"))
    }

    /// Tag the work the calling thread issues from now on with `tag` (0: no tag) while
    /// activity is recorded; the profiler tags each op's work with the op's id. Called twice
    /// per op, so it must be cheap. Outside a recording it does nothing.
    fn activity_tag(&self, tag: u64) -> Result<()> {
        let _ = tag;
        Err(BackendError::unsupported("activity records are not implemented by this backend"))
    }

    /// Stop recording and return what ran since [`Backend::activity_start`], after the host
    /// synchronized the devices. Stopping when not recording is an `InvalidArgument` error.
    fn activity_stop(&self) -> Result<Vec<DeviceActivity>> {
        Err(BackendError::unsupported("activity records are not implemented by this backend"))
    }
}

/// One opened device: memory, transfers and execution.
///
/// Work may run asynchronously in issue order; [`Device::read`] and [`Device::synchronize`]
/// wait for it, and report an error of earlier asynchronous work if there was one. That
/// includes bad input only the device can see (an index out of range): an asynchronous
/// backend may accept such a call and return its `InvalidArgument` error from the next
/// `read` or `synchronize` instead, as long as the op wrote nothing.
pub trait Device: Send + Sync + 'static {
    /// Allocate `bytes` (0 is allowed and yields a valid, empty buffer).
    fn allocate(&self, bytes: usize) -> Result<BufferId>;

    /// Release a buffer. Releasing an unknown handle is an `InvalidArgument` error.
    fn free(&self, buffer: BufferId) -> Result<()>;

    /// Copy host bytes into `dst` at byte `offset`.
    fn write(&self, dst: BufferId, offset: usize, src: &[u8]) -> Result<()>;

    /// Copy bytes of `src` starting at byte `offset` to the host, after pending work.
    fn read(&self, src: BufferId, offset: usize, dst: &mut [u8]) -> Result<()>;

    /// Wait for all issued work.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// Current memory statistics.
    fn memory_stats(&self) -> Result<MemoryStats>;

    /// Reset the peak counters to the current values.
    fn reset_peak_memory(&self) -> Result<()> {
        Err(BackendError::unsupported("reset_peak_memory is not implemented by this backend"))
    }

    /// Return cached, unused memory to the system or driver.
    fn empty_cache(&self) -> Result<()> {
        Ok(())
    }

    /// The (op, dtype) pairs [`Device::execute`] runs. A claim that is wrong is a
    /// conformance failure; an op not claimed must fail cleanly with `Unsupported`. The pairs
    /// the core needs for tensors, autograd and training in a dtype are
    /// [`crate::sdk::required`]; [`crate::sdk::required::missing`] lists those a list lacks.
    fn capabilities(&self) -> Vec<Capability>;

    /// Run `op` reading `inputs` and writing `outputs` (see [`Op`] for each op's operands).
    fn execute(&self, op: &Op, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()>;

    /// Record a timing event in issue order: it completes when the work issued before it
    /// has run on the device. The profiler records one before and one after each op to
    /// measure device time.
    ///
    /// Optional (since 1.2): the default returns `Unsupported`, and the host then reports
    /// host times only. A synchronous backend gains nothing from it (its host time is its
    /// device time).
    fn record_event(&self) -> Result<EventId> {
        Err(BackendError::unsupported("timing events are not implemented by this backend"))
    }

    /// Microseconds of device time from `start` to `end` (both from
    /// [`Device::record_event`], `start` recorded first), waiting for `end` to complete.
    /// An unknown or released handle is an `InvalidArgument` error.
    fn event_elapsed_us(&self, start: EventId, end: EventId) -> Result<f64> {
        let _ = (start, end);
        Err(BackendError::unsupported("timing events are not implemented by this backend"))
    }

    /// Release events; their handles become invalid (a backend may reuse the resources).
    fn release_events(&self, events: &[EventId]) -> Result<()> {
        let _ = events;
        Err(BackendError::unsupported("timing events are not implemented by this backend"))
    }

    /// Start capturing: until [`Device::capture_end`], the work issued to this device is
    /// recorded into a graph instead of run (CUDA's stream capture). While capturing, reading
    /// from or writing to a buffer from the host is an error; allocating and freeing are not.
    /// The host keeps every buffer a captured op touches alive until the graph is released,
    /// and issues work to a capturing device from one thread only.
    ///
    /// Optional (since 1.5), like the three functions after it: the default returns
    /// `Unsupported`, and the host then runs the same work uncaptured each time.
    /// [`crate::sdk::graph::Recorder`] implements them by recording [`Device::execute`] calls,
    /// for a backend without a graph facility of its own. Beginning while capturing is an
    /// `InvalidArgument` error.
    fn capture_begin(&self) -> Result<()> {
        Err(BackendError::unsupported("graph capture is not implemented by this backend"))
    }

    /// Stop capturing and return the graph. Always leaves the device out of capture mode; if
    /// the captured work could not be made a graph (an op failed while capturing, say), the
    /// error says why and no graph exists.
    fn capture_end(&self) -> Result<GraphId> {
        Err(BackendError::unsupported("graph capture is not implemented by this backend"))
    }

    /// Run the captured work again, in issue order after the work issued so far, on the same
    /// buffers (what they hold now). Errors of the replayed work surface like those of any
    /// asynchronous work.
    fn graph_replay(&self, graph: GraphId) -> Result<()> {
        let _ = graph;
        Err(BackendError::unsupported("graph capture is not implemented by this backend"))
    }

    /// Release a graph; its handle becomes invalid.
    fn graph_release(&self, graph: GraphId) -> Result<()> {
        let _ = graph;
        Err(BackendError::unsupported("graph capture is not implemented by this backend"))
    }
}
