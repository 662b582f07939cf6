//! Suite `accounting`: memory statistics move as promised, bytes return to the baseline after
//! frees (leaks), and an impossible allocation is a recoverable `OutOfMemory`.

use crate::case::{run_op, Case, OpCase, Outcome, Status, Tier};
use crate::target::{Spec, Target};
use crate::tolerance::Expected;
use genesis::ErrorKind;
use genesis_backend_api::{BinaryOp, DType, MemoryStats, Op};

fn stats(t: &Target) -> Result<MemoryStats, String> {
    t.device.memory_stats().map_err(|e| format!("memory_stats: {e}"))
}

/// Allocation and transfers must work; the free-related error checks of `memory` are not
/// prerequisites, so a leaking free still shows up here as the leak it is.
fn deps() -> Vec<String> {
    vec!["memory/roundtrip/".into()]
}

fn tracks_allocations(t: &Target) -> Outcome {
    let before = match stats(t) {
        Ok(s) => s,
        Err(e) => return Outcome::fail(e),
    };
    let sizes = [1000usize, 24, 4096];
    let mut ids = Vec::new();
    for &n in &sizes {
        match t.device.allocate(n) {
            Ok(id) => ids.push(id),
            Err(e) => return Outcome::error(format!("allocate({n}): {e}")),
        }
    }
    let during = match stats(t) {
        Ok(s) => s,
        Err(e) => return Outcome::fail(e),
    };
    let frees: Vec<String> = ids.iter().filter_map(|&id| t.device.free(id).err().map(|e| e.to_string())).collect();
    let after = match stats(t) {
        Ok(s) => s,
        Err(e) => return Outcome::fail(e),
    };
    let total: u64 = sizes.iter().map(|&n| n as u64).sum();
    let mut problems = Vec::new();
    if !frees.is_empty() {
        problems.push(format!("free failed: {}", frees.join("; ")));
    }
    if during.allocated_bytes != before.allocated_bytes + total {
        problems.push(format!(
            "allocated_bytes went {} → {} after allocating {total} bytes",
            before.allocated_bytes, during.allocated_bytes
        ));
    }
    if during.active_allocations != before.active_allocations + 3 {
        problems.push(format!(
            "active_allocations went {} → {} after 3 allocations",
            before.active_allocations, during.active_allocations
        ));
    }
    if during.peak_allocated_bytes < during.allocated_bytes || during.reserved_bytes < during.allocated_bytes {
        problems.push(format!("peak/reserved below allocated: {during:?}"));
    }
    if during.allocation_requests < before.allocation_requests + 3 {
        problems.push("allocation_requests did not count the requests".into());
    }
    if after.allocated_bytes != before.allocated_bytes || after.active_allocations != before.active_allocations {
        problems.push(format!(
            "after freeing everything: allocated_bytes {} (baseline {}), active_allocations {} (baseline {})",
            after.allocated_bytes, before.allocated_bytes, after.active_allocations, before.active_allocations
        ));
    }
    Outcome::check(problems.is_empty(), problems.join("; "))
}

fn no_leak_after_ops(t: &Target) -> Outcome {
    let before = match stats(t) {
        Ok(s) => s,
        Err(e) => return Outcome::fail(e),
    };
    let x = Spec::new(DType::F32, &[8, 8], (0..64).map(|i| i as f64).collect());
    let ops = [Op::Copy, Op::Binary(BinaryOp::Add), Op::Matmul];
    let mut ran = 0;
    for op in ops.into_iter().filter(|op| t.claims(op.kind(), DType::F32)) {
        let inputs = if matches!(op, Op::Copy) { vec![x.clone()] } else { vec![x.clone(), x.clone()] };
        let case =
            OpCase { op, inputs, outputs: vec![Spec::out(DType::F32, &[8, 8])], expected: vec![None::<Expected>] };
        for _ in 0..10 {
            let o = run_op(t, &case);
            if o.status != Status::Pass {
                return Outcome::with(Status::Error, format!("{} did not run: {}", op.name(), o.message));
            }
        }
        ran += 1;
    }
    let after = match stats(t) {
        Ok(s) => s,
        Err(e) => return Outcome::fail(e),
    };
    if ran == 0 {
        return Outcome::with(Status::NotSupported, "none of copy, add, matmul is claimed on f32");
    }
    Outcome::check(
        after.allocated_bytes == before.allocated_bytes && after.active_allocations == before.active_allocations,
        format!(
            "after 10 rounds of {ran} op(s) whose buffers were all freed: allocated_bytes {} → {}, active_allocations {} → {}",
            before.allocated_bytes, after.allocated_bytes, before.active_allocations, after.active_allocations
        ),
    )
}

fn oom_is_recoverable(t: &Target) -> Outcome {
    let before = match stats(t) {
        Ok(s) => s,
        Err(e) => return Outcome::fail(e),
    };
    let huge = if t.props.total_memory > 0 { t.props.total_memory.saturating_mul(2) } else { 1u64 << 52 };
    match t.device.allocate(huge as usize) {
        Ok(id) => {
            let _ = t.device.free(id);
            return Outcome::fail(format!("allocating {huge} bytes succeeded"));
        }
        Err(e) if e.kind() != ErrorKind::OutOfMemory => {
            return Outcome::fail(format!("allocating {huge} bytes: expected `out of memory`, got `{}`: {e}", e.kind()))
        }
        Err(_) => {}
    }
    let after = match stats(t) {
        Ok(s) => s,
        Err(e) => return Outcome::fail(e),
    };
    let small = t.device.allocate(256).and_then(|id| t.device.free(id));
    let mut problems = Vec::new();
    if let Err(e) = small {
        problems.push(format!("a small allocation after the OOM failed: {e}"));
    }
    if after.allocated_bytes != before.allocated_bytes {
        problems.push(format!(
            "allocated_bytes moved {} → {} on a failed allocation",
            before.allocated_bytes, after.allocated_bytes
        ));
    }
    if after.oom_count <= before.oom_count {
        problems.push("oom_count did not count the failed allocation".into());
    }
    Outcome::check(problems.is_empty(), problems.join("; "))
}

fn reset_peak(t: &Target) -> Outcome {
    let id = match t.device.allocate(1 << 16) {
        Ok(id) => id,
        Err(e) => return Outcome::error(e.to_string()),
    };
    let _ = t.device.free(id);
    match t.device.reset_peak_memory_stats() {
        Err(e) if e.kind() == ErrorKind::Unsupported => Outcome::with(Status::NotSupported, e.to_string()),
        Err(e) => Outcome::fail(format!("reset_peak_memory: expected success or `unsupported`, got {e}")),
        Ok(()) => match stats(t) {
            Ok(s) => Outcome::check(
                s.peak_allocated_bytes == s.allocated_bytes,
                format!(
                    "after a reset the peak ({}) must equal the current allocation ({})",
                    s.peak_allocated_bytes, s.allocated_bytes
                ),
            ),
            Err(e) => Outcome::fail(e),
        },
    }
}

type Check = fn(&Target) -> Outcome;

pub fn cases(_: &Target) -> Vec<Case> {
    let list: [(&str, Check); 4] = [
        ("stats_track_allocations", tracks_allocations),
        ("no_leak_after_ops", no_leak_after_ops),
        ("oom_is_recoverable", oom_is_recoverable),
        ("reset_peak", reset_peak),
    ];
    list.into_iter().map(|(name, f)| Case::new("accounting", name, Tier::Smoke, Box::new(f)).after(deps())).collect()
}
