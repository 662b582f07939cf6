//! Chrome Trace Event Format: one complete ("X") event per span and op on a track per host
//! thread; for ops timed on a device, their device work on a track per device stream (one
//! process per device) with a flow arrow from the op to it; allocations as counter ("C")
//! events of each device's live bytes.

use super::record::{Event, EventKind};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The process id of the host tracks; devices get 1, 2, ... in order of first use.
const HOST_PID: u64 = 0;

pub(crate) fn chrome_trace(events: &[Event]) -> String {
    let us = |ns: u64| ns as f64 / 1e3;
    let mut out: Vec<Value> =
        vec![json!({"name": "process_name", "ph": "M", "pid": HOST_PID, "args": {"name": "genesis host"}})];
    let threads: std::collections::BTreeSet<u64> = events.iter().map(|e| e.thread).collect();
    for t in threads {
        out.push(json!({
            "name": "thread_name", "ph": "M", "pid": HOST_PID, "tid": t, "args": {"name": format!("host thread {t}")},
        }));
    }
    // One process per device with device times; its single track is the device's stream
    // (backends order a device's work on one stream).
    let mut device_pids: BTreeMap<String, u64> = BTreeMap::new();
    for e in events.iter().filter(|e| e.device_ns.is_some()) {
        let name = e.device.as_ref().map(|d| d.to_string()).unwrap_or_default();
        let next = device_pids.len() as u64 + 1;
        let pid = *device_pids.entry(name.clone()).or_insert(next);
        if pid == next {
            out.push(
                json!({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": format!("device {name}")}}),
            );
            out.push(json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "stream"}}));
        }
    }
    let mut live: BTreeMap<String, i64> = BTreeMap::new();
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
        if let (Some(start), Some(ns), Some(d)) = (e.device_start_ns, e.device_ns, &device) {
            let pid = device_pids[d];
            out.push(json!({
                "name": e.name, "cat": "device", "ph": "X", "pid": pid, "tid": 0,
                "ts": us(start), "dur": us(ns), "args": {"op id": e.id},
            }));
            // The arrow from the op (it starts inside the op's host span) to its device work.
            out.push(json!({
                "name": "issue", "cat": "flow", "ph": "s", "id": e.id, "pid": HOST_PID, "tid": e.thread,
                "ts": us(e.start_ns),
            }));
            out.push(json!({
                "name": "issue", "cat": "flow", "ph": "f", "bp": "e", "id": e.id, "pid": pid, "tid": 0,
                "ts": us(start),
            }));
        }
    }
    json!({"traceEvents": out, "displayTimeUnit": "ms"}).to_string()
}
