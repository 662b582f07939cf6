//! The profiler: op counts, nesting, self times, backward spans, memory, the table and the
//! Chrome trace. One profiler records the whole process, so these tests take turns.

use genesis::profiler::{profile, record_function, EventKind, Profiler, ProfilerOptions, SortBy, TableOptions};
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
    assert!(table.contains("Device time: not measured"), "{table}");
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
    let options = ProfilerOptions { record_shapes: true, profile_memory: true };
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
