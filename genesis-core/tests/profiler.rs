//! The profiler: op counts, nesting, self times, backward spans, memory, the table and the
//! Chrome trace. One profiler records the whole process, so these tests take turns.

use genesis::profiler::{
    profile, record_function, EventKind, Profiler, ProfilerOptions, SortBy, TableOptions, TimeSource,
};
use genesis::{DType, Device, Tensor};
use std::sync::Mutex;

static TURN: Mutex<()> = Mutex::new(());

fn cpu() -> Device {
    Device::cpu().unwrap()
}

#[test]
fn every_dispatched_op_is_recorded_once_with_its_shapes() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let a = Tensor::ones(&[8, 4], DType::F32, &cpu()).unwrap();
    let b = Tensor::ones(&[4, 3], DType::F32, &cpu()).unwrap();
    let options = ProfilerOptions { record_shapes: true, ..Default::default() };
    let (_, prof) = profile(options, || {
        for _ in 0..5 {
            a.matmul(&b)?;
        }
        a.exp()?.exp()
    })
    .unwrap();
    let ops: Vec<_> = prof.events_of(EventKind::Op).collect();
    assert_eq!(ops.iter().filter(|e| e.name == "matmul").count(), 5);
    assert_eq!(ops.iter().filter(|e| e.name == "exp").count(), 2);
    let mm = ops.iter().find(|e| e.name == "matmul").unwrap();
    assert_eq!(mm.shapes, vec![vec![8, 4], vec![4, 3]]);
    assert_eq!(mm.dtypes, vec![DType::F32, DType::F32]);
    assert_eq!(mm.device.as_ref().unwrap(), &cpu());
    // Nothing is recorded once the profiler has stopped.
    a.exp().unwrap();
    assert_eq!(prof.events_of(EventKind::Op).count(), ops.len());
}

#[test]
fn spans_nest_and_self_times_add_up_to_the_total() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let x = Tensor::ones(&[16, 16], DType::F32, &cpu()).unwrap();
    let (_, prof) = profile(ProfilerOptions::default(), || {
        let _outer = record_function("outer");
        x.relu()?;
        let _inner = record_function("inner");
        x.matmul(&x)
    })
    .unwrap();
    let find = |name: &str| prof.events().iter().find(|e| e.name == name).unwrap().clone();
    let (outer, inner) = (find("outer"), find("inner"));
    assert_eq!(inner.parent, Some(outer.id));
    assert_eq!(find("matmul").parent, Some(inner.id));
    assert_eq!(find("relu").parent, Some(outer.id));
    assert!(outer.start_ns <= inner.start_ns && inner.end_ns <= outer.end_ns);
    // Self times over all spans = the time of the root spans.
    let spans: Vec<_> = prof.events().iter().filter(|e| e.kind != EventKind::Memory).collect();
    let children = |id| spans.iter().filter(|c| c.parent == Some(id)).map(|c| c.duration_ns()).sum::<u64>();
    let self_sum: u64 = spans.iter().map(|e| e.duration_ns() - children(e.id)).sum();
    let roots: u64 = spans.iter().filter(|e| e.parent.is_none()).map(|e| e.duration_ns()).sum();
    assert_eq!(self_sum, roots);
    let table = prof.table(&TableOptions::default());
    assert!(table.contains("outer") && table.contains("inner") && table.contains("matmul"), "{table}");
    // The CPU backend has neither activity records nor timing events: device time is marked
    // absent, never invented.
    assert!(table.contains("Device time on cpu:0: not measured"), "{table}");
    assert!(!table.contains("Self device"), "{table}");
    assert!(prof.events().iter().all(|e| e.device_ns.is_none() && e.device_start_ns.is_none()));
    let timing = prof.device_timing();
    assert_eq!(timing.len(), 1);
    assert_eq!(timing[0].device, "cpu:0");
    let why = timing[0].unavailable.as_deref().unwrap();
    assert!(why.contains("activity records") && why.contains("timing events"), "{timing:?}");
    assert_eq!(timing[0].source, None);
    assert!(prof.kernels().is_empty());
}

#[test]
fn backward_nodes_are_spans_around_their_ops() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let w = Tensor::ones(&[4, 4], DType::F32, &cpu()).unwrap().requires_grad_(true).unwrap();
    let x = Tensor::ones(&[2, 4], DType::F32, &cpu()).unwrap();
    let (_, prof) = profile(ProfilerOptions::default(), || x.matmul(&w)?.sum()?.backward()).unwrap();
    let back = prof.events().iter().find(|e| e.name == "MatmulBackward").expect("MatmulBackward span");
    assert_eq!(back.kind, EventKind::Backward);
    assert!(prof.events_of(EventKind::Op).any(|e| e.parent == Some(back.id) && e.name == "matmul"));
}

#[test]
fn memory_is_charged_to_the_op_that_allocated_it() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let a = Tensor::ones(&[256, 256], DType::F32, &cpu()).unwrap();
    let options = ProfilerOptions { profile_memory: true, ..Default::default() };
    let (_, prof) = profile(options, || a.matmul(&a)?.relu()).unwrap();
    let allocated: i64 = prof.events_of(EventKind::Memory).filter(|e| e.bytes > 0).map(|e| e.bytes).sum();
    assert!(allocated >= 2 * 256 * 256 * 4, "{allocated}");
    let table = prof.table(&TableOptions { sort_by: SortBy::Allocated, ..Default::default() });
    assert!(table.contains("Allocated") && table.contains("256.00 KiB"), "{table}");
    let peaks = prof.memory_peaks();
    assert_eq!(peaks.len(), 1);
    assert!(peaks[0].1 >= 2 * 256 * 256 * 4 && peaks[0].2 == "relu", "{peaks:?}");
}

#[test]
fn the_chrome_trace_is_json_with_one_complete_event_per_span() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let x = Tensor::ones(&[4], DType::F32, &cpu()).unwrap();
    let options = ProfilerOptions { record_shapes: true, profile_memory: true, ..Default::default() };
    let (_, prof) = profile(options, || {
        let _s = record_function("step");
        x.add(&x)?.mul(&x)
    })
    .unwrap();
    let path = std::env::temp_dir().join(format!("genesis-trace-{}.json", std::process::id()));
    prof.export_chrome_trace(&path).unwrap();
    let trace: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).ok();
    let events = trace["traceEvents"].as_array().unwrap();
    let complete: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    let spans = prof.events().iter().filter(|e| e.kind != EventKind::Memory).count();
    assert_eq!(complete.len(), spans);
    let add = complete.iter().find(|e| e["name"] == "add").unwrap();
    assert_eq!(add["cat"], "op");
    assert_eq!(add["args"]["input shapes"], serde_json::json!([[4], [4]]));
    assert!(add["ts"].as_f64().unwrap() >= 0.0 && add["dur"].as_f64().is_some());
    assert!(events.iter().any(|e| e["ph"] == "C"), "memory counters");
    assert!(complete.iter().any(|e| e["name"] == "step" && e["cat"] == "user_annotation"));
}

#[test]
fn one_profiler_at_a_time() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let first = Profiler::start(ProfilerOptions::default()).unwrap();
    assert!(Profiler::start(ProfilerOptions::default()).is_err());
    drop(first);
    let second = Profiler::start(ProfilerOptions::default()).unwrap();
    assert!(second.stop().events().is_empty());
}

/// The example plugin implements the optional activity records (interface 1.4); its work is
/// done inside each call, so an op's device work lies inside its host span.
fn example() -> Device {
    Device::parse("example").expect("the example plugin is built with the workspace")
}

/// Three steps of two ops each inside a `step` span on `dev`: six ops, each inside its host
/// span on the device (the example plugin's work is done inside each call).
fn three_steps(dev: &Device) -> genesis::profiler::Profile {
    let a = Tensor::ones(&[64, 64], DType::F32, dev).unwrap();
    let (_, prof) = profile(ProfilerOptions::default(), || {
        let _step = record_function("step");
        for _ in 0..3 {
            a.matmul(&a)?.exp()?;
        }
        Ok(())
    })
    .unwrap();
    let ops: Vec<_> = prof.events_of(EventKind::Op).collect();
    assert_eq!(ops.len(), 6);
    for op in &ops {
        let (start, ns) = (op.device_start_ns.unwrap(), op.device_ns.unwrap());
        // Both clocks are the host's here, aligned when the device is first seen.
        assert!(start + 50_000 >= op.start_ns && start + ns <= op.end_ns + 50_000, "{op:?}");
        assert!(ns <= op.duration_ns(), "{op:?}");
    }
    // A span's device total is the sum over its ops.
    let table = prof.table(&TableOptions { sort_by: SortBy::DeviceTotal, ..Default::default() });
    assert!(table.contains("Self device") && table.contains("Device total"), "{table}");
    let first_row = table.lines().nth(3).unwrap();
    assert!(first_row.starts_with("step"), "the span holds every op's device time:\n{table}");
    // The trace: a flow arrow from each op to its device work.
    let trace: serde_json::Value = serde_json::from_str(&prof.chrome_trace()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    for phase in ["s", "f"] {
        assert_eq!(events.iter().filter(|e| e["ph"] == phase && e["cat"] == "flow").count(), 6);
    }
    prof
}

#[test]
fn device_time_comes_from_activity_records_on_a_backend_that_keeps_them() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let prof = three_steps(&example());
    let kernels = prof.kernels();
    assert_eq!(kernels.len(), 6, "{kernels:?}");
    for op in prof.events_of(EventKind::Op) {
        let mine: Vec<_> = kernels.iter().filter(|k| k.op == Some(op.id)).collect();
        assert_eq!(mine.len(), 1, "{op:?}");
        assert_eq!(mine[0].name, op.name);
        let (start, ns) = (op.device_start_ns.unwrap(), op.device_ns.unwrap());
        assert_eq!((mine[0].start_ns, mine[0].end_ns - mine[0].start_ns), (start, ns));
    }
    assert_eq!(prof.device_timing()[0].device, "example:0");
    assert_eq!(prof.device_timing()[0].unavailable, None);
    assert_eq!(prof.device_timing()[0].source, Some(TimeSource::ActivityRecords));
    let table = prof.table(&TableOptions::default());
    assert!(table.contains("Device time on example:0: the sum of each op's kernel times"), "{table}");
    // The trace: a device process with one complete event per kernel on its stream's track.
    let trace: serde_json::Value = serde_json::from_str(&prof.chrome_trace()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let device_pid = events
        .iter()
        .find(|e| e["ph"] == "M" && e["args"]["name"] == "device example:0")
        .map(|e| e["pid"].clone())
        .expect("a device process");
    assert!(events.iter().any(|e| e["ph"] == "M" && e["pid"] == device_pid && e["args"]["name"] == "stream 0"));
    let device_work: Vec<_> = events.iter().filter(|e| e["ph"] == "X" && e["pid"] == device_pid).collect();
    assert_eq!(device_work.len(), 6);
    assert!(device_work.iter().all(|k| k["cat"] == "kernel" && k["args"]["op"] == k["name"]));
}

#[test]
fn device_time_falls_back_to_timing_events() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    // The example plugin's switch for its activity records (CUDA without CUPTI is this
    // case). Every test here holds the turn, so no other thread of this binary reads the
    // environment meanwhile.
    std::env::set_var("GENESIS_EXAMPLE_ACTIVITY", "off");
    let prof = three_steps(&example());
    std::env::remove_var("GENESIS_EXAMPLE_ACTIVITY");
    let timing = &prof.device_timing()[0];
    assert_eq!((timing.device.as_str(), timing.source), ("example:0", Some(TimeSource::TimingEvents)));
    // One interval per op, named after it.
    assert_eq!(prof.kernels().len(), 6);
    let ops: Vec<_> = prof.events_of(EventKind::Op).collect();
    assert!(prof.kernels().iter().all(|k| ops.iter().any(|o| k.op == Some(o.id) && k.name == o.name)));
    let table = prof.table(&TableOptions::default());
    assert!(table.contains("Device time on example:0: the backend's timing events around each op"), "{table}");
}

#[test]
fn work_issued_outside_ops_is_not_charged_to_them() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dev = example();
    let a = Tensor::ones(&[16], DType::F32, &dev).unwrap();
    let (_, prof) = profile(ProfilerOptions::default(), || {
        let b = a.exp()?;
        // An op issued through the low-level device API, outside the core's dispatch: the
        // device ran it, but no recorded op did.
        let (input, output) = (dev.allocate(64)?, dev.allocate(64)?);
        dev.write(input, 0, &[0u8; 64])?;
        let desc = |buffer| genesis_backend_api::TensorDesc::contiguous(buffer, 0, DType::F32, &[16]).unwrap();
        dev.execute(
            &genesis_backend_api::Op::Unary(genesis_backend_api::UnaryOp::Exp),
            &[desc(input)],
            &[desc(output)],
        )?;
        dev.free(input)?;
        dev.free(output)?;
        b.relu()
    })
    .unwrap();
    let ops: Vec<_> = prof.events_of(EventKind::Op).collect();
    let untagged: Vec<_> = prof.kernels().iter().filter(|k| k.op.is_none()).collect();
    assert_eq!(untagged.len(), 1, "{:?}", prof.kernels());
    assert!(ops.iter().all(|o| o.device_ns.is_some()));
}

#[test]
fn device_time_can_be_turned_off() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let dev = example();
    let a = Tensor::ones(&[8], DType::F32, &dev).unwrap();
    let (_, prof) = profile(ProfilerOptions { device_time: false, ..Default::default() }, || a.exp()).unwrap();
    assert!(prof.events().iter().all(|e| e.device_ns.is_none()));
    assert!(prof.device_timing().is_empty());
    assert!(prof.table(&TableOptions::default()).contains("not recorded"));
}
