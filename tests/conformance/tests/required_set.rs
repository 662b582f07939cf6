//! The required-set report (issue 25, item 2): conformance is about what a backend claims,
//! coverage of the SDK's required set about whether it claims enough. A fixture that claims
//! very little (copy and fill on f32) is conformant for its claims and is reported as covering
//! no dtype, with the missing pairs named; the CPU backend covers f32 and f64.

use genesis_backend_api::sdk::required;
use genesis_backend_api::{Capability, DType, Op};
use genesis_conformance::required::coverage;
use genesis_conformance::target::Target;
use serde_json::{json, Value};
use std::process::Command;

mod common;

#[test]
fn the_cpu_backend_covers_f32_and_f64() {
    let cpu = Target::open("cpu", 0).expect("the CPU backend opens");
    let cover = cpu.coverage();
    for dtype in [DType::F32, DType::F64] {
        let c = cover.iter().find(|c| c.dtype == dtype).expect("a row per float dtype");
        assert!(c.covered(), "cpu misses {:?} in {dtype}", c.missing_names());
        assert_eq!(c.required, required::pairs(dtype).len());
    }
}

#[test]
fn a_backend_that_claims_little_covers_no_required_set() {
    let plugin = common::build_buggy(Some("claims_little"));
    let json_path = std::env::temp_dir().join(format!("genesis-conformance-claims-little-{}.json", std::process::id()));
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_genesis-conformance"))
            .arg("--backend")
            .arg(&plugin)
            // In process: worker processes would cost seconds each, and nothing here crashes.
            .args(["--tier", "smoke", "--isolation", "none", "--quiet", "--json"])
            .arg(&json_path)
            .args(extra)
            .output()
            .expect("run the harness")
    };

    let out = run(&[]);
    let text = String::from_utf8_lossy(&out.stdout);
    // Right about what it claims (copy and fill run, everything else is refused cleanly), so
    // conformant and exit code 0.
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("Verdict: CONFORMANT for its claims (tier smoke)"), "{text}");
    assert!(
        text.contains("Required set: not covered for any float dtype (f32, f64, f16, bf16; missing pairs above)"),
        "{text}"
    );
    // Every missing pair is named, per dtype.
    let f32_line = text.lines().find(|l| l.trim_start().starts_with("f32   not covered")).expect("an f32 line");
    assert!(f32_line.contains("23 of 25 pairs missing: cast, rand_uniform,"), "{f32_line}");
    for name in ["matmul", "cast(bool)", "sqrt", "argmax"] {
        assert!(text.contains(name), "{name} is not named in\n{text}");
    }

    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("json report")).expect("valid JSON");
    assert_eq!(report["verdict"]["conformant"], true);
    assert_eq!(report["verdict"]["covers_required_set"], json!([]));
    let rows = report["required_set"].as_array().expect("required_set rows");
    assert_eq!(rows.len(), 4);
    let claims = [Op::Copy, Op::Fill { value: 0.0 }].map(|op| Capability { op: op.kind(), dtype: DType::F32 as u32 });
    for (row, cover) in rows.iter().zip(coverage(&claims)) {
        assert_eq!(row["covered"], false);
        assert_eq!(row["missing"].as_array().map(Vec::len), Some(cover.missing.len()), "{row}");
    }
    assert_eq!(rows[0]["missing"].as_array().map(Vec::len), Some(23));
    assert_eq!(rows[1]["missing"].as_array().map(Vec::len), Some(25));
    assert!(rows[0]["missing"].as_array().is_some_and(|m| m.contains(&json!({"op": "matmul", "dtype": "f32"}))));
    assert!(rows[1]["missing"].as_array().is_some_and(|m| m.contains(&json!({"op": "cast", "dtype": "bool"}))));

    // --require turns a gap into a failed run, without touching the verdict on the claims.
    let out = run(&["--require", "f32", "--filter", "load/*"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("--require f32: NOT MET for f32"), "{text}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("json report")).expect("valid JSON");
    assert_eq!(report["verdict"]["conformant"], true);
    assert_eq!(report["verdict"]["require_met"], false);
    let _ = std::fs::remove_file(&json_path);
}
