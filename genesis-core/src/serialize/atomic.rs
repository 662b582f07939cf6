//! Crash-safe file replacement: write a temporary file in the target's directory, flush it
//! to disk, rename it over the target, then flush the directory so the rename itself is
//! durable. Readers see either the old file or the complete new one, never a mix.
//!
//! Failures are `InvalidArgument` errors naming the file and the step that failed (the error
//! kinds have no I/O kind).

use crate::error::{Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Replace `path` with what `write` puts into a fresh file, atomically. If `write` fails (or
/// the process dies before the rename) the old file at `path`, if any, is untouched and the
/// temporary file is removed. A crash leaves its `.{name}.tmp-{pid}-*` file beside `path`;
/// the next save of `path` removes those of processes that no longer run.
pub fn write_atomically(path: impl AsRef<Path>, write: impl FnOnce(&mut File) -> io::Result<()>) -> Result<()> {
    let path = path.as_ref();
    remove_stale_temporaries(path);
    let fail = |what: &str, e: io::Error| Error::invalid(format!("saving {}: {what}: {e}", path.display()));
    let name = path
        .file_name()
        .ok_or_else(|| Error::invalid(format!("saving {}: the path does not name a file", path.display())))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| fail("creating a temporary file", e))?;
        write(&mut file).map_err(|e| fail("writing", e))?;
        file.sync_all().map_err(|e| fail("flushing to disk", e))?;
        drop(file);
        fs::rename(&tmp, path).map_err(|e| fail("renaming the temporary file into place", e))?;
        sync_dir(dir).map_err(|e| fail("flushing the directory", e))
    })();
    if result.is_err() {
        // Best effort: the error that matters is the one being returned.
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Remove the temporary files that saves of `path` by processes no longer running left behind
/// (best effort: a file that cannot be read or removed stays).
pub(crate) fn remove_stale_temporaries(path: &Path) {
    let (Some(name), Some(dir)) = (path.file_name(), path.parent()) else { return };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let prefix = format!(".{}.tmp-", name.to_string_lossy());
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(rest) = file.to_str().and_then(|f| f.strip_prefix(&prefix)) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if pid != std::process::id() && !process_runs(pid, &entry) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Whether process `pid` (which wrote `temporary`) may still be writing it.
#[cfg(target_os = "linux")]
fn process_runs(pid: u32, _temporary: &fs::DirEntry) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Without `/proc`, a temporary file untouched for a day is taken as abandoned.
#[cfg(not(target_os = "linux"))]
fn process_runs(_pid: u32, temporary: &fs::DirEntry) -> bool {
    let age = temporary.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
    age.is_none_or(|a| a < std::time::Duration::from_secs(24 * 3600))
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Directories cannot be opened as files on other systems; the rename is as durable as the
/// platform makes it.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}
