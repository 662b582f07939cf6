//! Helpers shared by genesis-core's integration tests; a test file includes them with
//! `mod common;`. Unused helpers are fine (`dead_code` is allowed): each test binary uses a
//! different subset.
#![allow(dead_code)]

use genesis::Device;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The device `GENESIS_TEST_DEVICE` names (default `cpu`), for the fixture tests that also run
/// on a GPU machine.
pub fn device() -> Device {
    Device::parse(&std::env::var("GENESIS_TEST_DEVICE").unwrap_or_else(|_| "cpu".into())).unwrap()
}

/// The committed fixture folder `tests/models/{name}`, or the folder the environment variable
/// `var` names (for a test binary copied to another machine, or extra fixtures made there).
pub fn fixtures(var: &str, name: &str) -> PathBuf {
    match std::env::var(var) {
        Ok(dir) => PathBuf::from(dir),
        Err(_) => Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/models").join(name),
    }
}

/// A fresh empty folder under the system temp dir, removed when dropped (also when the test
/// panics).
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `genesis-{suite}-{tag}-{process id}-{n}`, where `n` counts this process's folders, so
    /// that tests running in parallel never share one.
    pub fn new(suite: &str, tag: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("genesis-{suite}-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// Writes `contents` to the file `name` inside (creating its parent folders) and returns
    /// its path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, contents).unwrap();
        path
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The profiler records one session per process and a test binary's tests run on parallel
/// threads: each profiled section holds this lock.
pub fn one_profiler() -> std::sync::MutexGuard<'static, ()> {
    static PROFILING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    PROFILING.lock().unwrap_or_else(|p| p.into_inner())
}

/// `f` profiled (holding [`one_profiler`]), with the events the calling thread recorded: the
/// profiler records every thread, and other tests of the binary run the same ops meanwhile.
pub fn profile_this_thread<T>(
    options: genesis::profiler::ProfilerOptions,
    f: impl FnOnce() -> genesis::Result<T>,
) -> genesis::Result<(T, Vec<genesis::profiler::Event>)> {
    use genesis::profiler::{profile, record_function};
    let _profiling = one_profiler();
    let (value, prof) = profile(options, || {
        let _span = record_function("profile_this_thread");
        f()
    })?;
    let thread = prof.events().iter().find(|e| e.name == "profile_this_thread").map(|e| e.thread);
    Ok((value, prof.events().iter().filter(|e| Some(e.thread) == thread).cloned().collect()))
}
