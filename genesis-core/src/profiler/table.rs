//! The summary table (`key_averages().table()`) and the memory peaks.

use super::record::{Event, EventKind};
use super::{DeviceTiming, TimeSource};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

/// The column a table is sorted by (largest first; `Name` alphabetically).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SortBy {
    /// Host time spent in the op itself, without nested spans.
    #[default]
    SelfHost,
    /// Host time including nested spans.
    HostTotal,
    /// Host total per call.
    HostAverage,
    /// Number of calls.
    Calls,
    /// Device time of the op itself (ops only; spans have none of their own).
    SelfDevice,
    /// Device time including the ops nested in a span.
    DeviceTotal,
    /// Device total per call.
    DeviceAverage,
    /// Bytes allocated for the op (with `profile_memory`).
    Allocated,
    /// The name.
    Name,
}

/// How [`Profile::table`](super::Profile::table) lays out the table.
#[derive(Debug, Clone, Copy)]
pub struct TableOptions {
    /// The sort column.
    pub sort_by: SortBy,
    /// One row per (name, input shapes) instead of per name (`group_by_input_shape`).
    pub group_by_input_shape: bool,
    /// At most this many rows (`row_limit`).
    pub row_limit: usize,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions { sort_by: SortBy::SelfHost, group_by_input_shape: false, row_limit: 50 }
    }
}

#[derive(Default)]
struct Row {
    name: String,
    shapes: String,
    calls: u64,
    self_ns: u64,
    total_ns: u64,
    self_device_ns: u64,
    device_total_ns: u64,
    allocated: i64,
}

/// Device time of each op itself, and of each span summed over the ops nested in it.
fn device_totals(events: &[Event]) -> HashMap<u64, u64> {
    let parents: HashMap<u64, Option<u64>> = events.iter().map(|e| (e.id, e.parent)).collect();
    let mut totals: HashMap<u64, u64> = HashMap::new();
    for e in events {
        let Some(ns) = e.device_ns else { continue };
        let mut id = Some(e.id);
        while let Some(i) = id {
            *totals.entry(i).or_default() += ns;
            id = parents.get(&i).copied().flatten();
        }
    }
    totals
}

/// Host time of each span minus that of the spans nested directly in it.
fn self_times(events: &[Event]) -> HashMap<u64, u64> {
    let mut children: HashMap<u64, u64> = HashMap::new();
    for e in events.iter().filter(|e| e.kind != EventKind::Memory) {
        if let Some(p) = e.parent {
            *children.entry(p).or_default() += e.duration_ns();
        }
    }
    events
        .iter()
        .filter(|e| e.kind != EventKind::Memory)
        .map(|e| (e.id, e.duration_ns().saturating_sub(children.get(&e.id).copied().unwrap_or(0))))
        .collect()
}

/// Bytes allocated for each op: the allocations made on its thread since the previous op
/// (an op's outputs are allocated just before it runs).
fn allocations(events: &[Event]) -> HashMap<u64, i64> {
    let mut pending: HashMap<u64, i64> = HashMap::new();
    let mut out = HashMap::new();
    for e in events {
        match e.kind {
            EventKind::Memory if e.bytes > 0 => *pending.entry(e.thread).or_default() += e.bytes,
            EventKind::Op => {
                out.insert(e.id, pending.remove(&e.thread).unwrap_or(0));
            }
            _ => {}
        }
    }
    out
}

fn shapes_of(e: &Event) -> String {
    e.shapes.iter().zip(&e.dtypes).map(|(s, d)| format!("{s:?}{}", d.name())).collect::<Vec<_>>().join(", ")
}

/// `ns` as PyTorch's tables print times.
pub(crate) fn fmt_time(ns: u64) -> String {
    match ns {
        n if n >= 1_000_000_000 => format!("{:.3}s", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.3}ms", n as f64 / 1e6),
        n => format!("{:.3}us", n as f64 / 1e3),
    }
}

fn fmt_bytes(b: i64) -> String {
    let a = b.unsigned_abs() as f64;
    let (v, unit) = match a {
        a if a >= (1u64 << 30) as f64 => (a / (1u64 << 30) as f64, "GiB"),
        a if a >= (1u64 << 20) as f64 => (a / (1u64 << 20) as f64, "MiB"),
        a if a >= 1024.0 => (a / 1024.0, "KiB"),
        a => (a, "B"),
    };
    format!("{}{v:.2} {unit}", if b < 0 { "-" } else { "" })
}

pub(crate) fn render(events: &[Event], options: &TableOptions, device_time: bool, timing: &[DeviceTiming]) -> String {
    let self_ns = self_times(events);
    let allocated = allocations(events);
    let device_total = device_totals(events);
    let with_memory = events.iter().any(|e| e.kind == EventKind::Memory);
    let with_device = events.iter().any(|e| e.device_ns.is_some());
    let mut rows: BTreeMap<(String, String), Row> = BTreeMap::new();
    for e in events.iter().filter(|e| e.kind != EventKind::Memory) {
        let shapes = if options.group_by_input_shape { shapes_of(e) } else { String::new() };
        let row = rows.entry((e.name.clone(), shapes.clone())).or_insert_with(|| Row {
            name: e.name.clone(),
            shapes,
            ..Row::default()
        });
        row.calls += 1;
        row.self_ns += self_ns.get(&e.id).copied().unwrap_or(0);
        row.total_ns += e.duration_ns();
        row.self_device_ns += e.device_ns.unwrap_or(0);
        row.device_total_ns += device_total.get(&e.id).copied().unwrap_or(0);
        row.allocated += allocated.get(&e.id).copied().unwrap_or(0);
    }
    let mut rows: Vec<Row> = rows.into_values().collect();
    let avg = |r: &Row| r.total_ns / r.calls.max(1);
    let device_avg = |r: &Row| r.device_total_ns / r.calls.max(1);
    match options.sort_by {
        SortBy::SelfHost => rows.sort_by_key(|r| std::cmp::Reverse(r.self_ns)),
        SortBy::HostTotal => rows.sort_by_key(|r| std::cmp::Reverse(r.total_ns)),
        SortBy::HostAverage => rows.sort_by_key(|r| std::cmp::Reverse(avg(r))),
        SortBy::SelfDevice => rows.sort_by_key(|r| std::cmp::Reverse(r.self_device_ns)),
        SortBy::DeviceTotal => rows.sort_by_key(|r| std::cmp::Reverse(r.device_total_ns)),
        SortBy::DeviceAverage => rows.sort_by_key(|r| std::cmp::Reverse(device_avg(r))),
        SortBy::Calls => rows.sort_by_key(|r| std::cmp::Reverse(r.calls)),
        SortBy::Allocated => rows.sort_by_key(|r| std::cmp::Reverse(r.allocated)),
        SortBy::Name => rows.sort_by(|a, b| a.name.cmp(&b.name)),
    }
    let all_self: u64 = rows.iter().map(|r| r.self_ns).sum();
    let all_self_device: u64 = rows.iter().map(|r| r.self_device_ns).sum();
    let name_width = rows.iter().map(|r| r.name.chars().count()).max().unwrap_or(4).clamp(4, 40);
    let mut header = format!(
        "{:<name_width$}  {:>11}  {:>12}  {:>12}  {:>12}  {:>8}",
        "Name", "Self host %", "Self host", "Host total", "Host avg", "# Calls"
    );
    if with_device {
        header += &format!("  {:>13}  {:>12}  {:>12}", "Self device %", "Self device", "Device total");
        header += &format!("  {:>12}", "Device avg");
    }
    if with_memory {
        header += &format!("  {:>12}", "Allocated");
    }
    if options.group_by_input_shape {
        header += "  Input shapes";
    }
    let rule = "-".repeat(header.chars().count().max(80));
    let mut out = format!("{rule}\n{header}\n{rule}\n");
    for r in rows.iter().take(options.row_limit) {
        let name: String = r.name.chars().take(name_width).collect();
        let host = time_columns(10, r.self_ns, all_self, r.total_ns, avg(r));
        let _ = write!(out, "{name:<name_width$}  {host}  {:>8}", r.calls);
        if with_device {
            let device = time_columns(12, r.self_device_ns, all_self_device, r.device_total_ns, device_avg(r));
            let _ = write!(out, "  {device}");
        }
        if with_memory {
            let _ = write!(out, "  {:>12}", fmt_bytes(r.allocated));
        }
        if options.group_by_input_shape {
            let _ = write!(out, "  [{}]", r.shapes);
        }
        out.push('\n');
    }
    let _ = writeln!(out, "{rule}\nSelf host time total: {}", fmt_time(all_self));
    if with_device {
        let _ = writeln!(out, "Self device time total: {}", fmt_time(all_self_device));
    }
    if !device_time {
        out += "Device time: not recorded (ProfilerOptions::device_time is off).\n";
    }
    for t in timing {
        let how = match (t.source, &t.unavailable) {
            (Some(TimeSource::ActivityRecords), _) => {
                "the sum of each op's kernel times from the backend's activity records".to_string()
            }
            (Some(TimeSource::TimingEvents), _) => "the backend's timing events around each op".to_string(),
            (None, Some(why)) => {
                let _ = writeln!(out, "Device time on {}: not measured ({why}); host times only.", t.device);
                continue;
            }
            (None, None) => continue,
        };
        let _ = writeln!(out, "Device time on {}: {how}; host times there are the time to issue the work.", t.device);
    }
    out
}

/// One clock's columns of a row: self time as a percentage of `all` (`width` characters before
/// the sign), self time, total and average.
fn time_columns(width: usize, self_ns: u64, all: u64, total_ns: u64, avg_ns: u64) -> String {
    format!(
        "{:>width$.2}%  {:>12}  {:>12}  {:>12}",
        percent(self_ns, all),
        fmt_time(self_ns),
        fmt_time(total_ns),
        fmt_time(avg_ns)
    )
}

/// `part` as a percentage of `all` (0 when `all` is 0).
fn percent(part: u64, all: u64) -> f64 {
    if all > 0 {
        100.0 * part as f64 / all as f64
    } else {
        0.0
    }
}

pub(crate) fn memory_peaks(events: &[Event]) -> Vec<(String, i64, String)> {
    let mut live: BTreeMap<String, (i64, i64, Option<usize>)> = BTreeMap::new();
    for (i, e) in events.iter().enumerate().filter(|(_, e)| e.kind == EventKind::Memory) {
        let device = e.device.as_ref().map(|d| d.to_string()).unwrap_or_default();
        let entry = live.entry(device).or_insert((0, 0, None));
        entry.0 += e.bytes;
        if entry.0 > entry.1 {
            (entry.1, entry.2) = (entry.0, Some(i));
        }
    }
    live.into_iter()
        .map(|(device, (_, peak, at))| {
            let thread = at.map(|i| events[i].thread);
            let op = at
                .and_then(|i| events[i..].iter().find(|e| e.kind == EventKind::Op && Some(e.thread) == thread))
                .map_or_else(|| "(none)".to_string(), |e| e.name.clone());
            (device, peak, op)
        })
        .collect()
}
