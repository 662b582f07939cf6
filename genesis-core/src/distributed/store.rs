//! The rendezvous store: a small key-value server that rank 0 hosts and every rank reaches
//! over TCP (what PyTorch's `TCPStore` is for). Ranks use it to find each other, to agree on
//! what they are about to do, and to publish the handles a collective library needs (an NCCL
//! unique id). Values are bytes; `get` waits for a key that is not there yet.
//!
//! The wire form is private to Genesis (both ends are this file): a request is an op byte, a
//! length-prefixed key, a length-prefixed value and a timeout in milliseconds; a reply is a
//! status byte and a length-prefixed value.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const SET: u8 = 1;
const GET: u8 = 2;
const ADD: u8 = 3;
const CHECK: u8 = 4;

const OK: u8 = 0;
const TIMED_OUT: u8 = 1;
const BAD_REQUEST: u8 = 2;

/// The largest key or value the store accepts (a guard against a stray connection's bytes
/// being read as a length).
const MAX_FIELD: usize = 64 << 20;

/// A client of the rendezvous store, and on the rank that hosts it, the server too.
pub struct Store {
    stream: Mutex<TcpStream>,
    address: String,
    timeout: Duration,
}

/// The data the server guards: the entries, and a condition variable `get` waits on.
#[derive(Default)]
struct Table {
    entries: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl Store {
    /// Reach the store at `host:port`, hosting it first when `host_it` (rank 0). Connecting
    /// is retried until `timeout`, since the host may not be listening yet; blocking calls
    /// (`get`, `wait`) also give up after `timeout`.
    pub fn connect(host: &str, port: u16, host_it: bool, timeout: Duration) -> Result<Store> {
        let address = format!("{host}:{port}");
        if host_it {
            let listener = TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
                Error::communication(format!(
                    "the rendezvous store could not listen on port {port} ({e}); is another job using it?"
                ))
            })?;
            let table = Arc::new(Table::default());
            std::thread::Builder::new()
                .name("genesis-store".into())
                .spawn(move || serve(listener, table))
                .map_err(|e| Error::communication(format!("starting the store's thread: {e}")))?;
        }
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match connect_any(&address) {
                Ok(stream) => break stream,
                Err(e) if Instant::now() >= deadline => {
                    return Err(Error::communication(format!(
                        "could not reach the rendezvous store at {address} within {timeout:?}: {e}"
                    )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let _ = stream.set_nodelay(true);
        Ok(Store { stream: Mutex::new(stream), address, timeout })
    }

    /// The store's address (`host:port`).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The local address of this client's connection: the interface this host uses to reach
    /// the store, which other ranks can use to reach this one.
    pub fn local_ip(&self) -> Result<std::net::IpAddr> {
        let stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        stream.local_addr().map(|a| a.ip()).map_err(|e| Error::communication(format!("store connection: {e}")))
    }

    /// Set `key` to `value` (replacing an earlier value).
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.request(SET, key, value, Duration::ZERO).map(drop)
    }

    /// The value of `key`, waiting up to the store's timeout for some rank to set it.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.request(GET, key, &[], self.timeout)
    }

    /// Add `amount` to the integer at `key` (0 when absent) and return the new value.
    pub fn add(&self, key: &str, amount: i64) -> Result<i64> {
        let reply = self.request(ADD, key, &amount.to_le_bytes(), Duration::ZERO)?;
        let bytes: [u8; 8] =
            reply.try_into().map_err(|_| Error::communication("the store's reply to add is not an integer"))?;
        Ok(i64::from_le_bytes(bytes))
    }

    /// Whether `key` is set, without waiting.
    pub fn check(&self, key: &str) -> Result<bool> {
        Ok(self.request(CHECK, key, &[], Duration::ZERO)? == [1])
    }

    /// Wait until every key in `keys` is set (up to the store's timeout).
    pub fn wait(&self, keys: &[&str]) -> Result<()> {
        keys.iter().try_for_each(|k| self.get(k).map(drop))
    }

    fn request(&self, op: u8, key: &str, value: &[u8], wait: Duration) -> Result<Vec<u8>> {
        let mut stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        let what = |e: std::io::Error| Error::communication(format!("rendezvous store at {}: {e}", self.address));
        let mut frame = vec![op];
        put_field(&mut frame, key.as_bytes());
        put_field(&mut frame, value);
        frame.extend_from_slice(&(wait.as_millis() as u64).to_le_bytes());
        stream.write_all(&frame).map_err(what)?;
        // The server answers a waiting get by its own deadline; allow a margin past it.
        stream.set_read_timeout(Some(wait + Duration::from_secs(30))).map_err(what)?;
        let mut status = [0u8];
        stream.read_exact(&mut status).map_err(what)?;
        let reply = read_field(&mut *stream).map_err(what)?;
        match status[0] {
            OK => Ok(reply),
            TIMED_OUT => Err(Error::communication(format!(
                "timed out after {wait:?} waiting for '{key}' in the rendezvous store at {} (a rank did not \
                 arrive or failed)",
                self.address
            ))),
            _ => Err(Error::communication(format!(
                "the rendezvous store refused a request: {}",
                String::from_utf8_lossy(&reply)
            ))),
        }
    }
}

/// Connect to the first address of `address` that answers (a name like `localhost` may
/// resolve to IPv6 first while the store listens on IPv4).
fn connect_any(address: &str) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "the name resolves to no address");
    for candidate in address.to_socket_addrs()? {
        match TcpStream::connect_timeout(&candidate, Duration::from_secs(1)) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn put_field(frame: &mut Vec<u8>, bytes: &[u8]) {
    frame.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    frame.extend_from_slice(bytes);
}

fn read_field(stream: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FIELD {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("a field of {len} bytes")));
    }
    let mut field = vec![0u8; len];
    stream.read_exact(&mut field)?;
    Ok(field)
}

/// Accept clients for as long as the process lives (the thread is detached: it never keeps
/// the process alive).
fn serve(listener: TcpListener, table: Arc<Table>) {
    for stream in listener.incoming().flatten() {
        let table = table.clone();
        let _ = std::thread::Builder::new().name("genesis-store-client".into()).spawn(move || {
            let _ = stream.set_nodelay(true);
            // A client that disconnects (its rank exited) ends its thread.
            let _ = answer(stream, &table);
        });
    }
}

fn answer(mut stream: TcpStream, table: &Table) -> std::io::Result<()> {
    loop {
        let mut op = [0u8];
        stream.read_exact(&mut op)?;
        let key = read_field(&mut stream)?;
        let value = read_field(&mut stream)?;
        let mut wait = [0u8; 8];
        stream.read_exact(&mut wait)?;
        let key = String::from_utf8_lossy(&key).into_owned();
        let (status, reply) = apply(table, op[0], key, value, Duration::from_millis(u64::from_le_bytes(wait)));
        let mut frame = vec![status];
        put_field(&mut frame, &reply);
        stream.write_all(&frame)?;
    }
}

fn apply(table: &Table, op: u8, key: String, value: Vec<u8>, wait: Duration) -> (u8, Vec<u8>) {
    let mut entries = table.entries.lock().unwrap_or_else(|p| p.into_inner());
    match op {
        SET => {
            entries.insert(key, value);
            table.changed.notify_all();
            (OK, Vec::new())
        }
        ADD => {
            let Ok(amount) = <[u8; 8]>::try_from(value.as_slice()) else {
                return (BAD_REQUEST, b"add takes an 8-byte integer".to_vec());
            };
            let current = entries.get(&key).and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok());
            let sum = current.map_or(0, i64::from_le_bytes).wrapping_add(i64::from_le_bytes(amount));
            entries.insert(key, sum.to_le_bytes().to_vec());
            table.changed.notify_all();
            (OK, sum.to_le_bytes().to_vec())
        }
        CHECK => (OK, vec![entries.contains_key(&key) as u8]),
        GET => {
            let deadline = Instant::now() + wait;
            loop {
                if let Some(v) = entries.get(&key) {
                    return (OK, v.clone());
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return (TIMED_OUT, Vec::new());
                }
                entries = table.changed.wait_timeout(entries, left).unwrap_or_else(|p| p.into_inner()).0;
            }
        }
        _ => (BAD_REQUEST, format!("unknown op {op}").into_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(29_511)
    }

    #[test]
    fn set_get_add_wait_across_clients() -> Result<()> {
        let port = free_port();
        let timeout = Duration::from_secs(5);
        let host = Store::connect("127.0.0.1", port, true, timeout)?;
        let other = Store::connect("127.0.0.1", port, false, timeout)?;
        assert!(!other.check("a")?);
        let waiter = std::thread::spawn(move || other.get("a").map(|v| (v, other)));
        std::thread::sleep(Duration::from_millis(50));
        host.set("a", b"hello")?;
        let (value, other) = waiter.join().map_err(|_| Error::invalid("waiter panicked"))??;
        assert_eq!(value, b"hello");
        assert_eq!(host.add("n", 2)?, 2);
        assert_eq!(other.add("n", 3)?, 5);
        other.wait(&["a", "n"])?;
        Ok(())
    }

    #[test]
    fn a_missing_key_times_out_and_an_absent_store_is_named() -> Result<()> {
        let port = free_port();
        let store = Store::connect("127.0.0.1", port, true, Duration::from_millis(200))?;
        let err = store.get("never").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("timed out") && err.contains("'never'"), "{err}");
        let nobody = free_port();
        let err = Store::connect("127.0.0.1", nobody, false, Duration::from_millis(200)).err();
        let err = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(&format!("127.0.0.1:{nobody}")), "{err}");
        Ok(())
    }
}
