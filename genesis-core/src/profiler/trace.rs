//! Chrome Trace Event Format: one complete ("X") event per span and op on a track per host
//! thread; the devices' work (kernels, copies, fills) on a track per device stream (one
//! process per device), each with a flow arrow from the op that issued it; allocations as
//! counter ("C") events of each device's live bytes.

use super::record::{Event, EventKind, Kernel};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The process id of the host tracks; devices get 1, 2, ... in order of first use.
const HOST_PID: u64 = 0;

pub(crate) fn chrome_trace(events: &[Event], kernels: &[Kernel]) -> String {
    let us = |ns: u64| ns as f64 / 1e3;
    let mut out: Vec<Value> =
        vec![json!({"name": "process_name", "ph": "M", "pid": HOST_PID, "args": {"name": "genesis host"}})];
    let threads: std::collections::BTreeSet<u64> = events.iter().map(|e| e.thread).collect();
    for t in threads {
        out.push(json!({
            "name": "thread_name", "ph": "M", "pid": HOST_PID, "tid": t, "args": {"name": format!("host thread {t}")},
        }));
    }
    // One process per device that ran work, with a track per stream.
    let mut device_pids: BTreeMap<String, u64> = BTreeMap::new();
    let mut streams: std::collections::BTreeSet<(u64, u32)> = Default::default();
    for k in kernels {
        let name = k.device.to_string();
        let next = device_pids.len() as u64 + 1;
        let pid = *device_pids.entry(name.clone()).or_insert(next);
        if pid == next {
            out.push(
                json!({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": format!("device {name}")}}),
            );
        }
        if streams.insert((pid, k.stream)) {
            out.push(json!({
                "name": "thread_name", "ph": "M", "pid": pid, "tid": k.stream,
                "args": {"name": format!("stream {}", k.stream)},
            }));
        }
    }
    let mut live: BTreeMap<String, i64> = BTreeMap::new();
    let mut op_threads: std::collections::HashMap<u64, (u64, u64, &str)> = Default::default();
    for e in events {
        let device = e.device.as_ref().map(|d| d.to_string());
        if e.kind == EventKind::Memory {
            let device = device.unwrap_or_default();
            let bytes = live.entry(device.clone()).or_default();
            *bytes += e.bytes;
            out.push(json!({
                "name": format!("memory {device}"), "ph": "C", "pid": HOST_PID, "ts": us(e.start_ns),
                "args": {"allocated bytes": *bytes},
            }));
            continue;
        }
        let cat = match e.kind {
            EventKind::Op => "op",
            EventKind::Backward => "backward",
            _ => "user_annotation",
        };
        let mut args = serde_json::Map::new();
        if let Some(d) = &device {
            args.insert("device".into(), json!(d));
        }
        if !e.shapes.is_empty() {
            args.insert("input shapes".into(), json!(e.shapes));
            args.insert("input dtypes".into(), json!(e.dtypes.iter().map(|d| d.name()).collect::<Vec<_>>()));
        }
        if let Some(ns) = e.device_ns {
            args.insert("device us".into(), json!(us(ns)));
        }
        out.push(json!({
            "name": e.name, "cat": cat, "ph": "X", "pid": HOST_PID, "tid": e.thread,
            "ts": us(e.start_ns), "dur": us(e.duration_ns()), "args": args,
        }));
        if e.kind == EventKind::Op {
            op_threads.insert(e.id, (e.thread, e.start_ns, e.name.as_str()));
        }
    }
    for (i, k) in kernels.iter().enumerate() {
        let pid = device_pids[&k.device.to_string()];
        let mut args = serde_json::Map::new();
        let issuer = k.op.and_then(|op| op_threads.get(&op).map(|issuer| (op, issuer)));
        if let Some((op, (_, _, name))) = issuer {
            args.insert("op".into(), json!(name));
            args.insert("op id".into(), json!(op));
        }
        out.push(json!({
            "name": k.name, "cat": "kernel", "ph": "X", "pid": pid, "tid": k.stream,
            "ts": us(k.start_ns), "dur": us(k.end_ns.saturating_sub(k.start_ns)), "args": args,
        }));
        // The arrow from the op (it starts inside the op's host span) to the work it issued.
        if let Some((_, &(thread, start_ns, _))) = issuer {
            out.push(json!({
                "name": "issue", "cat": "flow", "ph": "s", "id": i, "pid": HOST_PID, "tid": thread,
                "ts": us(start_ns),
            }));
            out.push(json!({
                "name": "issue", "cat": "flow", "ph": "f", "bp": "e", "id": i, "pid": pid, "tid": k.stream,
                "ts": us(k.start_ns),
            }));
        }
    }
    json!({"traceEvents": out, "displayTimeUnit": "ms"}).to_string()
}
