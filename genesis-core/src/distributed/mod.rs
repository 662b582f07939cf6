//! Training one model across processes, GPUs and machines (`torch.distributed`): process
//! groups, collectives on tensors, [`DistributedDataParallel`] and, in [`crate::data`], the
//! `DistributedSampler`.
//!
//! A job is `world_size` processes, one per device, each with a `rank`. They meet through a
//! rendezvous [`Store`] that rank 0 hosts at `MASTER_ADDR:MASTER_PORT`, found from the
//! environment that `genesis-run` (or `torchrun --no-python`) sets:
//!
//! ```no_run
//! use genesis::distributed::{ProcessGroup, ReduceOp};
//! use genesis::{Device, DType, Tensor};
//! let group = ProcessGroup::from_env()?; // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...
//! let t = Tensor::full(&[4], group.rank() as f64, DType::F32, &Device::cpu()?)?;
//! group.all_reduce_(&t, ReduceOp::Sum)?; // 0 + 1 + ... on every rank
//! # Ok::<(), genesis::Error>(())
//! ```
//!
//! **Transport.** A tensor on a device whose backend has communicators across processes
//! (interface 1.3; the CUDA plugin's are NCCL's) goes through them, device to device: the
//! first collective on a device makes its communicator (rank 0 asks the backend for an id and
//! publishes it in the store). Any other tensor, and every tensor with
//! `GENESIS_DIST_TRANSPORT=host` ([`Transport::Host`]), goes over TCP between the processes
//! (a ring, as PyTorch's gloo does for CPU tensors), through host memory.
//!
//! **Failures.** A rank that exits closes its connections and its neighbours fail at once; a
//! rank that hangs makes the others' reads time out after [`InitOptions::timeout`] (default
//! 300 s, `GENESIS_DIST_TIMEOUT` in seconds from the environment). Every error is of kind
//! [`crate::ErrorKind::Communication`] and names the ranks
//! involved; a collective never waits forever.

mod ddp;
mod ring;
mod store;

pub use ddp::{DdpOptions, DistributedDataParallel, MaybeDdp, NoSync};
pub use store::Store;

use crate::autograd::no_grad;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ops::shape_err;
use crate::serialize::safetensors_io::{tensor_bytes, tensor_from_bytes};
use crate::tensor::Tensor;
use genesis_backend_api::{CollectiveOp, CommId, DType};
use ring::Ring;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How a collective combines the ranks' tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// The elementwise sum.
    Sum,
    /// The elementwise mean (floating-point dtypes only).
    Average,
}

/// How collectives move tensors between processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// The device backend's communicators where it has them (NCCL on CUDA), the host ring
    /// otherwise.
    #[default]
    Auto,
    /// Always the host ring (to compare, or to avoid a backend's communicators).
    Host,
}

/// Where this process stands in the job and how to reach the others.
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// This process's rank, `0..world_size` (`RANK`).
    pub rank: usize,
    /// The number of processes (`WORLD_SIZE`).
    pub world_size: usize,
    /// The rank among the processes of this machine, which picks the device (`LOCAL_RANK`).
    pub local_rank: usize,
    /// The host of rank 0's rendezvous store (`MASTER_ADDR`).
    pub master_addr: String,
    /// The store's port (`MASTER_PORT`; under torchrun, whose agent holds that port, the next
    /// one).
    pub master_port: u16,
    /// How long any wait for another rank may last before it is an error.
    pub timeout: Duration,
    /// How collectives move tensors.
    pub transport: Transport,
}

impl InitOptions {
    /// The options torchrun's environment gives: `RANK`, `WORLD_SIZE`, `LOCAL_RANK` (default
    /// the rank), `MASTER_ADDR` (default 127.0.0.1), `MASTER_PORT` (default 29500) and,
    /// Genesis's own, `GENESIS_DIST_TIMEOUT` (seconds, default 300) and
    /// `GENESIS_DIST_TRANSPORT` (`auto`, the default, or `host`).
    pub fn from_env() -> Result<InitOptions> {
        fn var(name: &str) -> Option<String> {
            std::env::var(name).ok().filter(|v| !v.is_empty())
        }
        fn number<T: std::str::FromStr>(name: &str, default: Option<T>) -> Result<T> {
            match var(name) {
                Some(v) => v.parse().map_err(|_| Error::invalid(format!("{name}={v:?} is not a valid number"))),
                None => default.ok_or_else(|| {
                    Error::invalid(format!(
                        "{name} is not set: start the program with genesis-run (or torchrun --no-python), or pass \
                         InitOptions explicitly"
                    ))
                }),
            }
        }
        let rank = number("RANK", None)?;
        let seconds: f64 = number("GENESIS_DIST_TIMEOUT", Some(300.0))?;
        let timeout = Duration::try_from_secs_f64(seconds)
            .ok()
            .filter(|t| !t.is_zero() && *t <= Duration::from_secs(7 * 24 * 3600))
            .ok_or_else(|| {
                Error::invalid(format!("GENESIS_DIST_TIMEOUT={seconds}: expected seconds > 0, at most a week"))
            })?;
        let transport = match var("GENESIS_DIST_TRANSPORT").as_deref() {
            None | Some("auto") => Transport::Auto,
            Some("host") => Transport::Host,
            Some(other) => {
                return Err(Error::invalid(format!("GENESIS_DIST_TRANSPORT={other:?}: expected auto or host")))
            }
        };
        Ok(InitOptions {
            rank,
            world_size: number("WORLD_SIZE", None)?,
            local_rank: number("LOCAL_RANK", Some(rank))?,
            master_addr: var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
            master_port: store_port(number("MASTER_PORT", Some(29500))?)?,
            timeout,
            transport,
        })
    }
}

/// The port of Genesis's store: `MASTER_PORT`, except under torchrun's agent, which hosts
/// its own (PyTorch's) store there (`TORCHELASTIC_USE_AGENT_STORE`): then the next port.
fn store_port(master_port: u16) -> Result<u16> {
    let agent = std::env::var("TORCHELASTIC_USE_AGENT_STORE").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    if !agent {
        return Ok(master_port);
    }
    master_port
        .checked_add(1)
        .ok_or_else(|| Error::invalid("MASTER_PORT=65535 leaves no port for Genesis's store beside torchrun's"))
}

/// The processes of one job and the collectives among them (`torch.distributed`'s default
/// process group, as a value). Clones share the connections.
#[derive(Clone)]
pub struct ProcessGroup {
    inner: Arc<Group>,
}

struct Group {
    rank: usize,
    world_size: usize,
    local_rank: usize,
    timeout: Duration,
    store: Store,
    ring: Mutex<Ring>,
    /// Wrappers and communicators made on this group so far: names their agreement keys in
    /// the store (every rank makes them in the same order).
    wrappers: std::sync::atomic::AtomicUsize,
    transport: Transport,
    /// Each device seen so far and its communicator (`None`: the host ring serves it).
    comms: Mutex<Vec<(Device, Option<CommId>)>>,
    /// The queue of the thread that runs asynchronous ring all-reduces, in submission order
    /// (started on first use).
    worker: Mutex<Option<Sender<RingJob>>>,
}

/// An average to run on the host ring, and where to send its result.
struct RingJob {
    bytes: Vec<u8>,
    dtype: DType,
    reply: Sender<Result<Vec<u8>>>,
}

impl Drop for Group {
    fn drop(&mut self) {
        for (device, comm) in self.comms.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..) {
            if let Some(comm) = comm {
                // Let the last collectives finish (the others may still need this rank's
                // part), within the timeout, before the communicator goes.
                let _ = device.comm_wait(comm).and_then(|()| device.synchronize());
                let _ = device.comm_abort(comm);
            }
        }
    }
}

impl ProcessGroup {
    /// Join the job described by the environment ([`InitOptions::from_env`]).
    pub fn from_env() -> Result<ProcessGroup> {
        Self::new(InitOptions::from_env()?)
    }

    /// The job's group when a launcher started this program (`WORLD_SIZE` is set), `None`
    /// when it runs on its own: what a program that trains either way starts with.
    pub fn from_env_if_launched() -> Result<Option<ProcessGroup>> {
        std::env::var_os("WORLD_SIZE").map(|_| Self::from_env()).transpose()
    }

    /// This rank's device for a command line's `spec`: `"cuda"` is `cuda:{local_rank}` (one
    /// GPU per rank); anything else is [`Device::parse`]d as given.
    pub fn device(group: Option<&ProcessGroup>, spec: &str) -> Result<Device> {
        match group {
            Some(g) if spec == "cuda" => Device::parse(&format!("cuda:{}", g.local_rank())),
            _ => Device::parse(spec),
        }
    }

    /// Join the job: rank 0 hosts the store, every rank connects to it and to its ring
    /// neighbours. Returns once all ranks have arrived (or fails after the timeout).
    pub fn new(options: InitOptions) -> Result<ProcessGroup> {
        let InitOptions { rank, world_size, local_rank, master_addr, master_port, timeout, transport } = options;
        if world_size == 0 || rank >= world_size {
            return Err(Error::invalid(format!("process group: rank {rank} is not within a world of {world_size}")));
        }
        let store = Store::connect(&master_addr, master_port, rank == 0, timeout)?;
        let ring = Ring::connect(&store, "pg", rank, world_size, timeout)?;
        let group = ProcessGroup {
            inner: Arc::new(Group {
                rank,
                world_size,
                local_rank,
                timeout,
                store,
                ring: Mutex::new(ring),
                wrappers: Default::default(),
                transport,
                comms: Mutex::new(Vec::new()),
                worker: Mutex::new(None),
            }),
        };
        group.barrier()?;
        Ok(group)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The number of processes.
    pub fn world_size(&self) -> usize {
        self.inner.world_size
    }

    /// The rank among this machine's processes (use it to pick the device: `cuda:{local_rank}`).
    pub fn local_rank(&self) -> usize {
        self.inner.local_rank
    }

    /// The longest wait for another rank.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The rendezvous store, for agreeing on things outside collectives.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// A store key prefix that names the next wrapper built on this group.
    fn next_wrapper_key(&self, kind: &str) -> String {
        format!("{kind}/{}", self.inner.wrappers.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.inner.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        // A one-element all-reduce completes only once every rank has contributed.
        let mut token = [0u8];
        self.ring().all_reduce(&mut token, genesis_backend_api::DType::U8, false)
    }

    /// The communicator for tensors on `device`, made on first use: rank 0 asks the backend
    /// for an id and publishes it (or why there is none) in the store, every rank joins.
    /// `None` when the host ring serves the device. Collectives run in one order on every
    /// rank, so every rank gets here for the same device at the same point.
    pub(crate) fn device_comm(&self, device: &Device) -> Result<Option<CommId>> {
        let mut comms = self.inner.comms.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, comm)) = comms.iter().find(|(d, _)| d == device) {
            return Ok(*comm);
        }
        let comm = if self.inner.transport == Transport::Host {
            None
        } else {
            let key = format!("{}/id", self.next_wrapper_key("comm"));
            if self.rank() == 0 {
                let published = match device.comm_unique_id() {
                    Ok(id) => [vec![1], id].concat(),
                    Err(e) => [vec![0], e.to_string().into_bytes()].concat(),
                };
                self.store().set(&key, &published)?;
            }
            match self.store().get(&key)?.split_first() {
                Some((1, id)) => Some(device.comm_init_rank(id, self.rank(), self.world_size(), self.timeout())?),
                _ => None,
            }
        };
        comms.push((device.clone(), comm));
        Ok(comm)
    }

    /// Start averaging `bytes` (dense `dtype` elements) over the host ring on the group's
    /// communication thread, so the caller goes on meanwhile; the result arrives on the
    /// returned channel. Jobs run one at a time in submission order, whoever submits them,
    /// which keeps every rank's sequence of ring collectives the same.
    pub(crate) fn start_ring_average(&self, bytes: Vec<u8>, dtype: DType) -> Result<Receiver<Result<Vec<u8>>>> {
        let mut worker = self.inner.worker.lock().unwrap_or_else(|p| p.into_inner());
        if worker.is_none() {
            let (jobs, inbox) = channel::<RingJob>();
            // Weak: the thread must not keep the group (and its connections) alive; it ends
            // when the group, and so the queue's sender, is dropped.
            let group = Arc::downgrade(&self.inner);
            std::thread::Builder::new()
                .name("genesis-ring".into())
                .spawn(move || ring_worker(group, inbox))
                .map_err(|e| Error::communication(format!("starting the communication thread: {e}")))?;
            *worker = Some(jobs);
        }
        let (reply, result) = channel();
        let job = RingJob { bytes, dtype, reply };
        worker
            .as_ref()
            .and_then(|jobs| jobs.send(job).ok())
            .ok_or_else(|| Error::communication("the communication thread stopped"))?;
        Ok(result)
    }

    /// Whether tensors on `device` travel through its backend's communicator (true) or the
    /// host ring (false). The first call for a device makes its communicator, so every rank
    /// must make it at the same point.
    pub fn uses_device_communicator(&self, device: &Device) -> Result<bool> {
        Ok(self.device_comm(device)?.is_some())
    }

    /// Run `op` on the device communicator of `input`'s device, if it has one: `input` and
    /// `output` dense; false when the host ring must do it instead.
    fn on_device(&self, op: CollectiveOp, root: usize, input: &Tensor, output: &Tensor) -> Result<bool> {
        let summing = matches!(op, CollectiveOp::AllReduceSum | CollectiveOp::ReduceScatterSum);
        if summing && input.dtype() == DType::Bool {
            return Ok(false); // the host ring's logical or
        }
        let Some(comm) = self.device_comm(input.device())? else { return Ok(false) };
        input.device().comm_collective(comm, op, root, self.world_size(), input.desc()?, output.desc()?)?;
        input.device().comm_wait(comm)?;
        output.storage().bump_version();
        Ok(true)
    }

    /// Start summing `dense` (contiguous, floating point) in place across the ranks on its
    /// device's communicator, without ordering the device's later work after it (so that it
    /// overlaps what comes next); the caller must `comm_wait` on the returned communicator
    /// before it touches `dense`. `None` when the device has no communicator.
    pub(crate) fn start_all_reduce_sum(&self, dense: &Tensor) -> Result<Option<CommId>> {
        let Some(comm) = self.device_comm(dense.device())? else { return Ok(None) };
        let desc = dense.desc()?;
        dense.device().comm_collective(comm, CollectiveOp::AllReduceSum, 0, self.world_size(), desc, desc)?;
        dense.storage().bump_version();
        Ok(Some(comm))
    }

    /// Combine `tensor` across ranks in place: afterwards every rank holds the sum (or mean).
    pub fn all_reduce_(&self, tensor: &Tensor, op: ReduceOp) -> Result<()> {
        if op == ReduceOp::Average && !tensor.dtype().is_float() {
            return Err(Error::invalid(format!(
                "all_reduce: an average of {} values is not defined (use a sum)",
                tensor.dtype()
            )));
        }
        let dense = no_grad(|| tensor.contiguous())?;
        if self.on_device(CollectiveOp::AllReduceSum, 0, &dense, &dense)? {
            if op == ReduceOp::Average {
                no_grad(|| dense.mul_scalar_(1.0 / self.world_size() as f64))?;
            }
            return if dense.shares_storage(tensor) { Ok(()) } else { no_grad(|| tensor.copy_(&dense)) };
        }
        let mut bytes = tensor_bytes(tensor)?;
        self.ring().all_reduce(&mut bytes, tensor.dtype(), op == ReduceOp::Average)?;
        write_back(tensor, &bytes)
    }

    /// Rank `root`'s `tensor` into `tensor` on every rank.
    pub fn broadcast_(&self, tensor: &Tensor, root: usize) -> Result<()> {
        self.check_rank(root, "broadcast")?;
        let dense = no_grad(|| tensor.contiguous())?;
        if self.on_device(CollectiveOp::Broadcast, root, &dense, &dense)? {
            return if dense.shares_storage(tensor) { Ok(()) } else { no_grad(|| tensor.copy_(&dense)) };
        }
        let mut bytes = tensor_bytes(tensor)?;
        self.ring().broadcast(&mut bytes, root)?;
        write_back(tensor, &bytes)
    }

    /// Every rank's `tensor` (all of one shape and dtype), in rank order.
    pub fn all_gather(&self, tensor: &Tensor) -> Result<Vec<Tensor>> {
        let world = self.world_size();
        if !tensor.shape().is_empty() {
            let dense = no_grad(|| tensor.contiguous())?;
            let mut shape = tensor.shape().to_vec();
            shape[0] *= world;
            let all = Tensor::empty(&shape, tensor.dtype(), tensor.device())?;
            if self.on_device(CollectiveOp::AllGather, 0, &dense, &all)? {
                let rows = tensor.shape()[0];
                return (0..world).map(|r| all.narrow(0, r * rows, rows)).collect();
            }
        }
        let bytes = tensor_bytes(tensor)?;
        let all = self.ring().all_gather(&bytes)?;
        let size = bytes.len();
        (0..world)
            .map(|r| tensor_from_bytes(&all[r * size..(r + 1) * size], tensor.dtype(), tensor.shape(), tensor.device()))
            .collect()
    }

    /// Rank r's share of the sum (or mean) of every rank's `tensor`: chunk r of dim 0, which
    /// must divide evenly by the world size.
    pub fn reduce_scatter(&self, tensor: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let world = self.world_size();
        let rows = tensor.shape().first().copied().unwrap_or(0);
        if tensor.shape().is_empty() || rows % world != 0 {
            return Err(shape_err(format!(
                "reduce_scatter: dim 0 of shape {:?} does not split into {world} equal chunks",
                tensor.shape()
            )));
        }
        if op == ReduceOp::Average && !tensor.dtype().is_float() {
            return Err(Error::invalid(format!(
                "reduce_scatter: an average of {} values is not defined (use a sum)",
                tensor.dtype()
            )));
        }
        let mut shape = tensor.shape().to_vec();
        shape[0] = rows / world;
        let dense = no_grad(|| tensor.contiguous())?;
        let mine = Tensor::empty(&shape, tensor.dtype(), tensor.device())?;
        if self.on_device(CollectiveOp::ReduceScatterSum, 0, &dense, &mine)? {
            if op == ReduceOp::Average {
                no_grad(|| mine.mul_scalar_(1.0 / world as f64))?;
            }
            return Ok(mine);
        }
        // The ring all-reduce is a reduce-scatter followed by an all-gather; the host
        // transport runs both and keeps this rank's chunk.
        let mut bytes = tensor_bytes(tensor)?;
        self.ring().all_reduce(&mut bytes, tensor.dtype(), op == ReduceOp::Average)?;
        let chunk_bytes = bytes.len() / world;
        let start = self.rank() * chunk_bytes;
        tensor_from_bytes(&bytes[start..start + chunk_bytes], tensor.dtype(), &shape, tensor.device())
    }

    fn check_rank(&self, rank: usize, what: &str) -> Result<()> {
        if rank >= self.world_size() {
            return Err(Error::invalid(format!("{what}: rank {rank} is not within a world of {}", self.world_size())));
        }
        Ok(())
    }
}

/// The group's communication thread: averages what it is given, in order.
fn ring_worker(group: Weak<Group>, inbox: Receiver<RingJob>) {
    for RingJob { mut bytes, dtype, reply } in inbox {
        let result = match group.upgrade() {
            Some(group) => {
                let mut ring = group.ring.lock().unwrap_or_else(|p| p.into_inner());
                ring.all_reduce(&mut bytes, dtype, true).map(|()| bytes)
            }
            None => Err(Error::communication("the process group is gone")),
        };
        let _ = reply.send(result);
    }
}

/// Write `bytes` (dense, the tensor's dtype) into `tensor`, whatever its layout.
fn write_back(tensor: &Tensor, bytes: &[u8]) -> Result<()> {
    let dense = tensor_from_bytes(bytes, tensor.dtype(), tensor.shape(), tensor.device())?;
    no_grad(|| tensor.copy_(&dense))
}
