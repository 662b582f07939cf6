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
/// temporary file is removed (after a crash, a `.{name}.tmp-*` file may remain beside it).
pub fn write_atomically(path: impl AsRef<Path>, write: impl FnOnce(&mut File) -> io::Result<()>) -> Result<()> {
    let path = path.as_ref();
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
