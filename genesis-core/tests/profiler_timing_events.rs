//! The profiler's fallback for a backend with timing events but no activity records (CUDA
//! without CUPTI): the example plugin with its activity records switched off. A test binary
//! of its own, because the switch is an environment variable the plugin reads.

use genesis::profiler::{profile, record_function, EventKind, ProfilerOptions, SortBy, TableOptions, TimeSource};
use genesis::{DType, Device, Tensor};

#[test]
fn device_time_falls_back_to_timing_events() {
    // Set before any other thread exists in this binary (its only test).
    std::env::set_var("GENESIS_EXAMPLE_ACTIVITY", "off");
    let dev = Device::parse("example").expect("the example plugin is built with the workspace");
    let a = Tensor::ones(&[64, 64], DType::F32, &dev).unwrap();
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
        // Both clocks are the host's here; the device clock is aligned when the device is
        // first seen, which may put it a little after the host's.
        assert!(start + 50_000 >= op.start_ns && start + ns <= op.end_ns + 50_000, "{op:?}");
        assert!(ns <= op.duration_ns(), "{op:?}");
    }
    let timing = &prof.device_timing()[0];
    assert_eq!((timing.device.as_str(), timing.source), ("example:0", Some(TimeSource::TimingEvents)));
    // One interval per op, named after it.
    assert_eq!(prof.kernels().len(), 6);
    assert!(prof.kernels().iter().all(|k| ops.iter().any(|o| k.op == Some(o.id) && k.name == o.name)));
    let table = prof.table(&TableOptions { sort_by: SortBy::DeviceTotal, ..Default::default() });
    assert!(table.contains("Device time on example:0: the backend's timing events around each op"), "{table}");
    let first_row = table.lines().nth(3).unwrap();
    assert!(first_row.starts_with("step"), "the span holds every op's device time:\n{table}");
    let trace: serde_json::Value = serde_json::from_str(&prof.chrome_trace()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    for phase in ["s", "f"] {
        assert_eq!(events.iter().filter(|e| e["ph"] == phase && e["cat"] == "flow").count(), 6);
    }
}
