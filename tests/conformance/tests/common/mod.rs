//! Shared by the tests that build fixture plugins (tests/fixtures, a workspace of its own).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// The cargo target directory this test was built in (the harness binary is in its
/// `debug` or `release` directory), so fixtures follow `CARGO_TARGET_DIR`.
pub fn target_dir() -> PathBuf {
    let exe = Path::new(env!("CARGO_BIN_EXE_genesis-conformance"));
    exe.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_else(|| repo().join("target"))
}

/// Build `fixture-buggy` with `feature` (or none) and return the plugin's path under its own
/// directory (each variant is a separate file).
pub fn build_buggy(feature: Option<&str>) -> PathBuf {
    let root = repo();
    let target = target_dir().join("fixtures");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(root.join("tests/fixtures/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .args(["-p", "fixture-buggy"]);
    if let Some(f) = feature {
        cmd.args(["--features", f]);
    }
    assert!(cmd.status().expect("run cargo").success(), "building fixture-buggy ({feature:?}) failed");
    let dir = target.join("conformance").join(feature.unwrap_or("clean"));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let to = dir.join(genesis::backend::plugin_file_name("buggy"));
    std::fs::copy(target.join("debug/libfixture_buggy.so"), &to).expect("copy plugin");
    to
}
