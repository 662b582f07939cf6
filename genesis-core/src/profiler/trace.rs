//! Chrome Trace Event Format: one complete ("X") event per span and op on a track per host
//! thread, allocations as counter ("C") events of each device's live bytes.

use super::record::{Event, EventKind};
use serde_json::{json, Value};
use std::collections::BTreeMap;

pub(crate) fn chrome_trace(events: &[Event]) -> String {
    let us = |ns: u64| ns as f64 / 1e3;
    let mut out: Vec<Value> = vec![json!({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "genesis"}})];
    let threads: std::collections::BTreeSet<u64> = events.iter().map(|e| e.thread).collect();
    for t in threads {
        out.push(
            json!({"name": "thread_name", "ph": "M", "pid": 0, "tid": t, "args": {"name": format!("host thread {t}")}}),
        );
    }
    let mut live: BTreeMap<String, i64> = BTreeMap::new();
    for e in events {
        let device = e.device.as_ref().map(|d| d.to_string());
        if e.kind == EventKind::Memory {
            let device = device.unwrap_or_default();
            let bytes = live.entry(device.clone()).or_default();
            *bytes += e.bytes;
            out.push(json!({
                "name": format!("memory {device}"), "ph": "C", "pid": 0, "ts": us(e.start_ns),
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
        if let Some(d) = device {
            args.insert("device".into(), json!(d));
        }
        if !e.shapes.is_empty() {
            args.insert("input shapes".into(), json!(e.shapes));
            args.insert("input dtypes".into(), json!(e.dtypes.iter().map(|d| d.name()).collect::<Vec<_>>()));
        }
        out.push(json!({
            "name": e.name, "cat": cat, "ph": "X", "pid": 0, "tid": e.thread,
            "ts": us(e.start_ns), "dur": us(e.duration_ns()), "args": args,
        }));
    }
    json!({"traceEvents": out, "displayTimeUnit": "ms"}).to_string()
}
