//! The host transport: every rank holds a TCP connection to the next rank and one from the
//! previous, and collectives move bytes around that ring (what gloo does for PyTorch on CPUs).
//! All-reduce is the bandwidth-optimal ring: a reduce-scatter, then an all-gather, each in
//! `world - 1` steps that send and receive one chunk at a time. Every chunk is summed in one
//! fixed rank order and then copied, so all ranks end with the same bits.
//!
//! A peer that exits closes its sockets, so its neighbours fail at once with an error; a peer
//! that hangs makes reads time out after the group's timeout. Either way the failing ranks
//! exit and close theirs, so the failure travels round the ring instead of hanging it.

use super::store::Store;
use crate::error::{Error, Result};
use genesis_backend_api::DType;
use half::{bf16, f16};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// This rank's two connections (none in a world of one).
pub(crate) struct Ring {
    rank: usize,
    world: usize,
    next: Option<TcpStream>,
    prev: Option<TcpStream>,
    /// The first failure: after it the streams are out of step (a partial message may be
    /// unread), so every later collective reports it instead of misreading bytes.
    broken: Option<Error>,
}

impl Ring {
    /// Connect rank `rank` of `world` to its neighbours, finding them through `store` under
    /// the key prefix `prefix`.
    pub fn connect(store: &Store, prefix: &str, rank: usize, world: usize, timeout: Duration) -> Result<Ring> {
        if world == 1 {
            return Ok(Ring { rank, world, next: None, prev: None, broken: None });
        }
        let ip = store.local_ip()?;
        let listener = TcpListener::bind((ip, 0))
            .map_err(|e| Error::communication(format!("rank {rank}: listening on {ip}: {e}")))?;
        let port = listener.local_addr().map_err(|e| Error::communication(e.to_string()))?.port();
        // SocketAddr's form brackets an IPv6 address, so the neighbour can parse it back.
        store.set(&format!("{prefix}/ring/{rank}"), std::net::SocketAddr::new(ip, port).to_string().as_bytes())?;
        let next_rank = (rank + 1) % world;
        let next_addr = String::from_utf8_lossy(&store.get(&format!("{prefix}/ring/{next_rank}"))?).into_owned();
        let deadline = Instant::now() + timeout;
        let mut next = loop {
            match TcpStream::connect(&next_addr) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(Error::communication(format!(
                        "rank {rank}: connecting to rank {next_rank} at {next_addr}: {e}"
                    )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        next.write_all(&(rank as u64).to_le_bytes())
            .map_err(|e| Error::communication(format!("greeting rank {next_rank}: {e}")))?;
        let prev = accept(&listener, rank, (rank + world - 1) % world, deadline)?;
        for s in [&next, &prev] {
            s.set_nodelay(true)
                .and_then(|()| s.set_read_timeout(Some(timeout)))
                .map_err(|e| Error::communication(e.to_string()))?;
            s.set_write_timeout(Some(timeout)).map_err(|e| Error::communication(e.to_string()))?;
        }
        Ok(Ring { rank, world, next: Some(next), prev: Some(prev), broken: None })
    }

    /// Send `send` to the next rank while receiving exactly `recv.len()` bytes from the
    /// previous one (concurrently, so two ranks sending large chunks to each other cannot
    /// both block on full socket buffers).
    fn exchange(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(e.clone().context("an earlier collective failed"));
        }
        let result = self.exchange_once(send, recv);
        if let Err(e) = &result {
            self.broken = Some(e.clone());
        }
        result
    }

    fn exchange_once(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let (rank, world) = (self.rank, self.world);
        let (Some(next), Some(prev)) = (&mut self.next, &mut self.prev) else {
            return Ok(());
        };
        let (next_rank, prev_rank) = ((rank + 1) % world, (rank + world - 1) % world);
        std::thread::scope(|scope| {
            let sender = scope.spawn(move || -> std::io::Result<()> {
                next.write_all(&(send.len() as u64).to_le_bytes())?;
                next.write_all(send)
            });
            let received = (|| -> std::io::Result<u64> {
                let mut len = [0u8; 8];
                prev.read_exact(&mut len)?;
                let len = u64::from_le_bytes(len);
                if len == recv.len() as u64 {
                    prev.read_exact(recv)?;
                }
                Ok(len)
            })();
            let sent = sender.join().unwrap_or_else(|_| Err(std::io::Error::other("the sending thread panicked")));
            let len = received.map_err(|e| peer_failed(rank, prev_rank, "receiving from", e))?;
            sent.map_err(|e| peer_failed(rank, next_rank, "sending to", e))?;
            if len != recv.len() as u64 {
                return Err(Error::communication(format!(
                    "rank {rank}: rank {prev_rank} sent {len} bytes where {} were expected: the ranks called \
                     different collectives or passed tensors of different sizes",
                    recv.len()
                )));
            }
            Ok(())
        })
    }

    /// Sum (`average`: then divide by the world size) `data`, a dense buffer of `dtype`
    /// elements, across all ranks; every rank ends with the same result.
    pub fn all_reduce(&mut self, data: &mut [u8], dtype: DType, average: bool) -> Result<()> {
        let world = self.world;
        let size = dtype.size_in_bytes();
        let n = data.len() / size;
        let bounds = |c: usize| (c * n / world * size, (c + 1) * n / world * size);
        let mut incoming = Vec::new();
        // An f16 sum of many ranks overflows: divide first (as PyTorch's DDP does).
        let divide_first = average && world > 1 && dtype == DType::F16;
        if divide_first {
            divide(dtype, data, world)?;
        }
        // Reduce-scatter: after step s, the chunk received holds s + 2 ranks' values; after
        // world - 1 steps rank r holds the whole sum of chunk r.
        for step in 0..world.saturating_sub(1) {
            let (send_chunk, recv_chunk) = (self.offset(step + 1), self.offset(step + 2));
            let (s0, s1) = bounds(send_chunk);
            let (r0, r1) = bounds(recv_chunk);
            incoming.resize(r1 - r0, 0);
            let send = data[s0..s1].to_vec();
            self.exchange(&send, &mut incoming)?;
            // The interface's host sum: wide accumulation, wrapping integers, bool as or.
            let summed = genesis_backend_api::sdk::collective::sum(dtype, &[data[r0..r1].to_vec(), incoming.clone()]);
            data[r0..r1].copy_from_slice(&summed);
        }
        if average && world > 1 && !divide_first {
            let (o0, o1) = bounds(self.rank);
            divide(dtype, &mut data[o0..o1], world)?;
        }
        // All-gather: pass the finished chunks round the ring.
        for step in 0..world.saturating_sub(1) {
            let (send_chunk, recv_chunk) = (self.offset(step), self.offset(step + 1));
            let (s0, s1) = bounds(send_chunk);
            let (r0, r1) = bounds(recv_chunk);
            let send = data[s0..s1].to_vec();
            self.exchange(&send, &mut data[r0..r1])?;
        }
        Ok(())
    }

    /// Every rank's `data` (all the same length), concatenated in rank order.
    pub fn all_gather(&mut self, data: &[u8]) -> Result<Vec<u8>> {
        let len = data.len();
        let mut all = vec![0u8; len * self.world];
        all[self.rank * len..(self.rank + 1) * len].copy_from_slice(data);
        for step in 0..self.world.saturating_sub(1) {
            let (send, recv) = (self.offset(step), self.offset(step + 1));
            let chunk = all[send * len..(send + 1) * len].to_vec();
            self.exchange(&chunk, &mut all[recv * len..(recv + 1) * len])?;
        }
        Ok(all)
    }

    /// Rank `root`'s `data` on every rank (passed along the ring from the root).
    pub fn broadcast(&mut self, data: &mut [u8], root: usize) -> Result<()> {
        // Rank root + k receives at step k - 1 and forwards at step k; every rank takes part
        // in every step (sending or receiving nothing), so the exchanges stay paired.
        let hops = (self.rank + self.world - root) % self.world;
        for step in 0..self.world.saturating_sub(1) {
            let sending = step == hops;
            let receiving = step + 1 == hops;
            let send = if sending { data.to_vec() } else { Vec::new() };
            if receiving {
                self.exchange(&send, data)?;
            } else {
                self.exchange(&send, &mut [])?;
            }
        }
        Ok(())
    }

    /// The chunk index `rank - k` (mod world): the chunk this rank handles at a ring step.
    fn offset(&self, k: usize) -> usize {
        (self.rank + self.world * 2 - k % self.world) % self.world
    }
}

fn accept(listener: &TcpListener, rank: usize, prev: usize, deadline: Instant) -> Result<TcpStream> {
    listener.set_nonblocking(true).map_err(|e| Error::communication(e.to_string()))?;
    loop {
        match listener.accept() {
            Ok((mut stream, _)) => {
                stream.set_nonblocking(false).map_err(|e| Error::communication(e.to_string()))?;
                let _ = stream.set_read_timeout(Some(
                    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)),
                ));
                let mut hello = [0u8; 8];
                match stream.read_exact(&mut hello) {
                    Ok(()) if u64::from_le_bytes(hello) == prev as u64 => return Ok(stream),
                    // A stray connection (not our neighbour): drop it and keep waiting.
                    _ => continue,
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(Error::communication(format!(
                        "rank {rank}: rank {prev} did not connect before the timeout"
                    )));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(Error::communication(format!("rank {rank}: accepting rank {prev}: {e}"))),
        }
    }
}

fn peer_failed(rank: usize, peer: usize, doing: &str, e: std::io::Error) -> Error {
    let why = match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            "it did not answer before the timeout (it hangs or is far behind)".to_string()
        }
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe
        | std::io::ErrorKind::ConnectionAborted => "the connection closed (the rank exited or failed)".to_string(),
        _ => e.to_string(),
    };
    Error::communication(format!("rank {rank}: {doing} rank {peer}: {why}"))
}

/// `data /= world` for floating-point dtypes (an average of integers is refused, as PyTorch's
/// `ReduceOp.AVG` is for them).
fn divide(dtype: DType, data: &mut [u8], world: usize) -> Result<()> {
    fn div<T: bytemuck::Pod>(data: &mut [u8], f: impl Fn(T) -> T) {
        for a in data.chunks_exact_mut(std::mem::size_of::<T>()) {
            a.copy_from_slice(bytemuck::bytes_of(&f(bytemuck::pod_read_unaligned::<T>(a))));
        }
    }
    let w = world as f64;
    match dtype {
        DType::F32 => div::<f32>(data, |v| v / w as f32),
        DType::F64 => div::<f64>(data, |v| v / w),
        DType::BF16 => div::<bf16>(data, |v| bf16::from_f32(v.to_f32() / w as f32)),
        DType::F16 => div::<f16>(data, |v| f16::from_f32(v.to_f32() / w as f32)),
        other => {
            return Err(Error::invalid(format!("all_reduce: an average of {other} values is not defined (use a sum)")))
        }
    }
    Ok(())
}
