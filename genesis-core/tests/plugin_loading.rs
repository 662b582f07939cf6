//! The loader against plugins with planted faults and other interface versions
//! (tests/fixtures, built here on first use). Every failure must be an `Err` that names the
//! file and the reason, and the process must keep running.

use genesis::backend::{load_library, plugin_file_name};
use genesis::{backends, DType, Device, ErrorKind, Tensor};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The cargo target directory this test runs from (it is `<target>/<profile>/deps/<test>`),
/// so the fixtures follow `CARGO_TARGET_DIR`; the workspace's `target` if that cannot be told.
fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
        .unwrap_or_else(|| repo().join("target"))
}

/// Build the fixture plugins and lay them out as plugin files; returns the directory.
/// Runs once per process, before anything touches the backend registry, so that the
/// `GENESIS_PLUGIN_PATH` set here is what discovery sees.
fn fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = repo();
        let target = target_dir().join("fixtures");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let manifest = root.join("tests/fixtures/Cargo.toml");
        // Two builds: the older plugins enable a backend-api feature the others must not see.
        let older = ["-p", "fixture-older-minor", "-p", "fixture-older-cpu"];
        let others = ["--workspace", "--exclude", "fixture-older-minor", "--exclude", "fixture-older-cpu"];
        for selection in [&others[..], &older[..]] {
            let status = Command::new(&cargo)
                .arg("build")
                .arg("--manifest-path")
                .arg(&manifest)
                .arg("--target-dir")
                .arg(&target)
                .args(selection)
                .status()
                .expect("run cargo");
            assert!(status.success(), "building the fixture plugins failed");
        }
        let built = |crate_name: &str| target.join("debug").join(format!("libfixture_{crate_name}.so"));
        let dir = target.join("layout");
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["a", "b", "explicit"] {
            std::fs::create_dir_all(dir.join(sub)).expect("mkdir");
        }
        let place = |from: &str, sub: &str, name: &str| {
            std::fs::copy(built(from), dir.join(sub).join(plugin_file_name(name))).expect("copy fixture");
        };
        // Two plugins called "twin" in two directories of the search path.
        place("twin", "a", "twin");
        place("twin", "b", "twin");
        // A CPU plugin of an older interface on the search path, as a stale build leaves one.
        place("older_cpu", "b", "cpu");
        place("not_genesis", "explicit", "notgenesis");
        place("future_major", "explicit", "future");
        place("bad_layout", "explicit", "badlayout");
        place("panicking", "explicit", "panicky");
        place("older_minor", "explicit", "older");
        std::fs::write(dir.join("explicit").join(plugin_file_name("garbage")), b"this is not an ELF file")
            .expect("write");
        let search = std::env::join_paths([dir.join("a"), dir.join("b")]).expect("path list");
        std::env::set_var("GENESIS_PLUGIN_PATH", search);
        dir
    })
}

fn explicit(name: &str) -> PathBuf {
    fixtures().join("explicit").join(plugin_file_name(name))
}

fn load_error(path: &Path) -> genesis::Error {
    load_library(path).expect_err("the load must fail")
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let path = fixtures().join("no-such-plugin.so");
    let e = load_error(&path);
    assert_eq!(e.kind(), ErrorKind::LoadFailed);
    assert!(e.message().contains("no-such-plugin.so"), "{e}");
}

#[test]
fn a_file_that_is_not_a_shared_library_is_refused() {
    let e = load_error(&explicit("garbage"));
    assert_eq!(e.kind(), ErrorKind::LoadFailed);
    assert!(e.message().contains("not a loadable shared library") && e.message().contains("garbage"), "{e}");
}

#[test]
fn a_library_without_a_declaration_is_not_a_plugin() {
    let e = load_error(&explicit("notgenesis"));
    assert!(e.message().contains("not a Genesis plugin"), "{e}");
}

#[test]
fn another_major_version_is_refused_with_both_versions() {
    let e = load_error(&explicit("future"));
    assert!(e.message().contains("interface 2.0") && e.message().contains("supports 1.x"), "{e}");
}

#[test]
fn a_different_module_layout_is_caught_by_the_layout_check() {
    let e = load_error(&explicit("badlayout"));
    assert!(e.message().contains("layout check failed") && e.message().contains("badlayout"), "{e}");
}

#[test]
fn a_panic_inside_a_plugin_becomes_an_internal_error() {
    load_library(explicit("panicky")).expect("loads");
    let device = Device::parse("panicky").expect("opens");
    let e = Tensor::zeros(&[4], DType::F32, &device).expect_err("fill panics inside the plugin");
    assert_eq!(e.kind(), ErrorKind::Internal);
    assert!(e.message().contains("planted panic"), "{e}");
    // The host and the plugin go on working.
    assert!(device.memory_stats().is_ok());
    let e2 = Tensor::zeros(&[4], DType::F32, &device).expect_err("panics again");
    assert_eq!(e2.kind(), ErrorKind::Internal);
}

#[test]
fn an_older_minor_plugin_loads_and_missing_functions_are_unsupported() {
    let status = load_library(explicit("older")).expect("an older minor loads");
    assert_eq!(status.name, "older");
    assert_eq!(status.api_version.map(|v| v.to_string()).as_deref(), Some("1.0"));
    let device = Device::parse("older").expect("opens");
    let e = device.backend().collective(genesis_backend_api::CollectiveOp::AllReduceSum, &[]).expect_err("absent");
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.message().contains("does not provide `collective`"), "{e}");
}

#[test]
fn device_index_out_of_range() {
    fixtures();
    let e = Device::parse("cpu:7").expect_err("one cpu device");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("out of range") && e.message().contains("1 device"), "{e}");
    assert!(Device::parse("cpu:x").is_err());
}

#[test]
fn unknown_backend_lists_the_known_ones() {
    fixtures();
    let e = Device::parse("tpu").expect_err("no such backend");
    assert!(e.message().contains("unknown backend 'tpu'") && e.message().contains("cpu"), "{e}");
    // Where plugins come from, and the file this one would need.
    assert!(e.message().contains("GENESIS_BACKENDS") && e.message().contains(&plugin_file_name("tpu")), "{e}");
}

/// A file named for a backend in GENESIS_BACKENDS answers for it: when it fails to load,
/// asking for the backend gives that failure, not the embedded CPU backend. Runs this test
/// again in a child process, since discovery reads the variable once per process.
#[test]
fn a_failed_file_named_for_a_backend_is_the_answer_for_it() {
    let missing = "/nonexistent/libgenesis_backend_cpu.so";
    if std::env::var("GENESIS_BACKENDS").is_ok_and(|v| v.contains(missing)) {
        let e = Device::parse("cpu").expect_err("the named file does not exist");
        assert!(e.message().contains(missing) && e.kind() == ErrorKind::DeviceUnavailable, "{e}");
        return;
    }
    let child = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", "a_failed_file_named_for_a_backend_is_the_answer_for_it", "--test-threads", "1"])
        .env("GENESIS_BACKENDS", format!("cpu={missing}"))
        .output()
        .expect("run the child");
    let out = String::from_utf8_lossy(&child.stdout);
    assert!(child.status.success() && out.contains("1 passed"), "{out}{}", String::from_utf8_lossy(&child.stderr));
}

#[test]
fn the_first_of_two_same_named_plugins_wins() {
    let dir = fixtures().to_path_buf();
    let twins: Vec<_> = backends().into_iter().filter(|b| b.name == "twin").collect();
    assert_eq!(twins.len(), 2, "{twins:?}");
    let (first, second) = (&twins[0], &twins[1]);
    assert!(first.available && !first.shadowed);
    assert!(second.shadowed && !second.available);
    let origin = |b: &genesis::BackendStatus| b.origin.to_string();
    assert!(origin(first).starts_with(dir.join("a").to_str().unwrap()), "{}", origin(first));
    let reason = second.reason.clone().unwrap_or_default();
    assert!(reason.contains("shadowed by") && reason.contains(&origin(first)), "{reason}");
    let device = Device::parse("twin").expect("the winner opens");
    assert_eq!(device.backend().origin().to_string(), origin(first));
}

/// A plugin named like the embedded CPU backend but built for an older interface (a cargo
/// target folder keeps the last CPU plugin built, which may predate the host) stays listed,
/// shadowed by the embedded backend, which is newer: the `cpu` device is the embedded one.
#[test]
fn an_older_copy_of_the_embedded_backend_is_shadowed_by_it() {
    let dir = fixtures();
    let cpus: Vec<_> = backends().into_iter().filter(|b| b.name == "cpu").collect();
    let stale = cpus
        .iter()
        .find(|b| b.origin.to_string().starts_with(dir.join("b").to_str().unwrap()))
        .unwrap_or_else(|| panic!("the fixture is listed: {cpus:?}"));
    assert!(stale.shadowed && !stale.available, "{stale:?}");
    assert!(stale.reason.clone().unwrap_or_default().contains("shadowed by"), "{stale:?}");
    let device = Device::parse("cpu").expect("cpu opens");
    assert!(matches!(device.backend().origin(), genesis::backend::Origin::Embedded), "{}", device.backend().origin());
}
