//! Suite `graph`: capture and replay of device work (interface 1.5, optional). Nothing runs
//! while capturing; each replay runs the captured ops on the buffers' current contents; host
//! access inside a capture is refused and leaves the device usable; a released graph is gone.

use crate::case::{Case, Outcome, Status, Tier};
use crate::target::{Scope, Target};
use genesis::ErrorKind;
use genesis_backend_api::{BufferId, DType, Op, TensorDesc};

const N: usize = 4;

fn bytes(values: [f32; N]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn read(t: &Target, buffer: BufferId) -> Result<[f32; N], String> {
    let mut raw = [0u8; N * 4];
    t.device.read(buffer, 0, &mut raw).map_err(|e| format!("read: {e}"))?;
    let mut out = [0f32; N];
    for (i, chunk) in raw.chunks_exact(4).enumerate() {
        out[i] = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
    }
    Ok(out)
}

fn desc(buffer: BufferId) -> Result<TensorDesc, String> {
    TensorDesc::contiguous(buffer, 0, DType::F32, &[N]).map_err(|e| e.to_string())
}

fn write(t: &Target, buffer: BufferId, values: [f32; N]) -> Result<(), String> {
    t.device.write(buffer, 0, &bytes(values)).map_err(|e| format!("write: {e}"))
}

/// Begin capturing; `Some(not_supported)` (after freeing the scope) when the backend has no
/// graphs.
fn begin<'t>(t: &'t Target, scope: &mut Scope<'t>) -> Result<Option<Outcome>, String> {
    match t.device.capture_begin() {
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            std::mem::replace(scope, Scope::new(t)).finish()?;
            Ok(Some(Outcome::with(Status::NotSupported, e.to_string())))
        }
        other => other.map(|()| None).map_err(|e| format!("capture_begin: {e}")),
    }
}

fn replay(t: &Target) -> Result<Outcome, String> {
    let mut scope = Scope::new(t);
    let (x, y) = (scope.alloc(N * 4)?, scope.alloc(N * 4)?);
    write(t, x, [1.0, 2.0, 3.0, 4.0])?;
    write(t, y, [9.0; N])?;
    if let Some(skip) = begin(t, &mut scope)? {
        return Ok(skip);
    }
    let issued = t.device.execute(&Op::Copy, &[desc(x)?], &[desc(y)?]);
    let graph = t.device.capture_end().map_err(|e| format!("capture_end: {e}"))?;
    issued.map_err(|e| format!("copy while capturing: {e}"))?;
    if read(t, y)? != [9.0; N] {
        return Ok(Outcome::fail("the captured copy ran during the capture"));
    }
    for round in 0..2 {
        let values = [10.0 * round as f32 + 5.0, 6.0, 7.0, -8.0];
        write(t, x, values)?;
        t.device.graph_replay(graph).map_err(|e| format!("graph_replay: {e}"))?;
        if read(t, y)? != values {
            return Ok(Outcome::fail(format!("replay {round} did not copy the input's current values")));
        }
    }
    t.device.graph_release(graph).map_err(|e| format!("graph_release: {e}"))?;
    let outcome = match t.device.graph_replay(graph) {
        Ok(()) => Outcome::fail("a released graph replayed"),
        Err(e) if e.kind() == ErrorKind::InvalidArgument => Outcome::pass(),
        Err(e) => Outcome::fail(format!("replaying a released graph: expected InvalidArgument, got {e}")),
    };
    scope.finish()?;
    Ok(outcome)
}

fn host_access(t: &Target) -> Result<Outcome, String> {
    let mut scope = Scope::new(t);
    let x = scope.alloc(N * 4)?;
    write(t, x, [1.0; N])?;
    if let Some(skip) = begin(t, &mut scope)? {
        return Ok(skip);
    }
    let read_inside = read(t, x);
    let write_inside = write(t, x, [2.0; N]);
    if let Ok(graph) = t.device.capture_end() {
        t.device.graph_release(graph).map_err(|e| format!("graph_release: {e}"))?;
    }
    let outcome = if read_inside.is_ok() || write_inside.is_ok() {
        Outcome::fail("a host read or write was accepted while capturing")
    } else {
        // The device must work as before.
        write(t, x, [3.0; N])?;
        Outcome::check(read(t, x)? == [3.0; N], "after a refused capture the device no longer round-trips")
    };
    scope.finish()?;
    Ok(outcome)
}

pub fn cases(_: &Target) -> Vec<Case> {
    let deps = || ["load/".to_string(), "memory/roundtrip/f32".to_string(), "data/copy/f32".to_string()];
    vec![
        Case::new("graph", "replay", Tier::Core, Box::new(|t| replay(t).unwrap_or_else(Outcome::error))).after(deps()),
        Case::new("graph", "host_access", Tier::Core, Box::new(|t| host_access(t).unwrap_or_else(Outcome::error)))
            .after(deps()),
    ]
}
