//! Suite `memory`: allocation, host transfers and their error kinds.

use crate::case::{Case, Outcome, Tier};
use crate::target::{Scope, Target};
use crate::values::{encode, short_name, Rng};
use genesis::ErrorKind;
use genesis_backend_api::{BufferId, DType};

fn expect_kind(result: Result<(), genesis::Error>, kind: ErrorKind, what: &str) -> Outcome {
    match result {
        Ok(()) => Outcome::fail(format!("{what} succeeded; expected a `{kind}` error")),
        Err(e) if e.kind() == kind => Outcome::pass(),
        Err(e) => Outcome::fail(format!("{what}: expected `{kind}`, got `{}`: {e}", e.kind())),
    }
}

fn roundtrip(t: &Target, dtype: DType) -> Result<Outcome, String> {
    let mut scope = Scope::new(t);
    let mut rng = Rng::for_id(&format!("memory/roundtrip/{}", short_name(dtype)));
    let n = 1031;
    let size = dtype.size_in_bytes();
    let mut bytes = vec![0u8; n * size];
    for (i, v) in rng.values(dtype, n, 100.0).into_iter().enumerate() {
        encode(dtype, v, &mut bytes[i * size..(i + 1) * size]);
    }
    let buffer = scope.alloc(bytes.len())?;
    t.device.write(buffer, 0, &bytes).map_err(|e| e.to_string())?;
    let mut back = vec![0u8; bytes.len()];
    t.device.read(buffer, 0, &mut back).map_err(|e| e.to_string())?;
    if back != bytes {
        let at = back.iter().zip(&bytes).position(|(a, b)| a != b).unwrap_or(0);
        return Ok(Outcome::fail(format!("read after write differs first at byte {at}")));
    }
    // A partial write at an odd offset leaves the other bytes alone.
    let patch = [0x5Au8; 7];
    t.device.write(buffer, 13, &patch).map_err(|e| e.to_string())?;
    bytes[13..20].copy_from_slice(&patch);
    let mut part = vec![0u8; 40];
    t.device.read(buffer, 5, &mut part).map_err(|e| e.to_string())?;
    if part[..] != bytes[5..45] {
        return Ok(Outcome::fail("write/read at a byte offset touched or returned the wrong bytes"));
    }
    scope.finish()?;
    Ok(Outcome::pass())
}

type Check = fn(&Target) -> Outcome;

pub fn cases(_: &Target) -> Vec<Case> {
    let mut cases = Vec::new();
    for dtype in DType::ALL {
        cases.push(
            Case::new(
                "memory",
                format!("roundtrip/{}", short_name(dtype)),
                Tier::Smoke,
                Box::new(move |t| roundtrip(t, dtype).unwrap_or_else(Outcome::error)),
            )
            .after(["load/".to_string()]),
        );
    }
    let simple: Vec<(&str, Check)> = vec![
        ("zero_size", |t| {
            let mut scope = Scope::new(t);
            let r = scope.alloc(0).and_then(|b| {
                t.device.write(b, 0, &[]).map_err(|e| e.to_string())?;
                t.device.read(b, 0, &mut []).map_err(|e| e.to_string())
            });
            match r.and_then(|_| scope.finish()) {
                Ok(()) => Outcome::pass(),
                Err(e) => Outcome::fail(format!("a zero-byte buffer must be valid: {e}")),
            }
        }),
        ("write_past_end", |t| {
            let mut scope = Scope::new(t);
            match scope.alloc(16) {
                Ok(b) => {
                    expect_kind(t.device.write(b, 10, &[0u8; 8]), ErrorKind::InvalidArgument, "write past the end")
                }
                Err(e) => Outcome::error(e),
            }
        }),
        ("read_past_end", |t| {
            let mut scope = Scope::new(t);
            match scope.alloc(16) {
                Ok(b) => {
                    expect_kind(t.device.read(b, 12, &mut [0u8; 8]), ErrorKind::InvalidArgument, "read past the end")
                }
                Err(e) => Outcome::error(e),
            }
        }),
        ("free_unknown_handle", |t| {
            expect_kind(
                t.device.free(BufferId(0xDEAD_BEEF_0000)),
                ErrorKind::InvalidArgument,
                "free of an unknown handle",
            )
        }),
        ("double_free", |t| match t.device.allocate(32) {
            Ok(b) => match t.device.free(b) {
                Ok(()) => expect_kind(t.device.free(b), ErrorKind::InvalidArgument, "second free"),
                Err(e) => Outcome::error(format!("first free: {e}")),
            },
            Err(e) => Outcome::error(e.to_string()),
        }),
        ("large_buffer", |t| {
            let mut scope = Scope::new(t);
            let bytes = 64 << 20;
            let r = scope.alloc(bytes).and_then(|b| {
                t.device.write(b, bytes - 3, &[1, 2, 3]).map_err(|e| e.to_string())?;
                let mut back = [0u8; 3];
                t.device.read(b, bytes - 3, &mut back).map_err(|e| e.to_string())?;
                Ok(back)
            });
            match r {
                Ok(back) => {
                    Outcome::check(back == [1, 2, 3], format!("last bytes of a 64 MiB buffer read back as {back:?}"))
                }
                Err(e) => Outcome::error(e),
            }
        }),
    ];
    for (name, f) in simple {
        cases.push(Case::new("memory", name, Tier::Smoke, Box::new(f)).after(["load/".to_string()]));
    }
    cases
}
