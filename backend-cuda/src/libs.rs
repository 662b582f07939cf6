//! Finding the CUDA libraries besides the driver (NVRTC, cuBLAS) at run time.
//!
//! They come with the CUDA toolkit (`/usr/local/cuda/lib64`), with distribution packages
//! (the loader's path) or with Python wheels (`site-packages/nvidia/*/lib`, where PyTorch
//! installs them). We look by bare name first (the loader's path, `LD_LIBRARY_PATH`), then
//! in those directories, for each major version we can use; a failure names every place
//! searched, so a user can see what is missing.

use genesis_backend_api::{BackendError, ErrorKind, Result};
use libloading::Library;
use std::path::{Path, PathBuf};

/// A library the plugin opened, and where from.
pub struct Found {
    /// The open library (kept open for the process).
    pub library: Library,
    /// The file or name that opened it.
    pub path: String,
}

/// Directories to search after the loader's own path.
fn search_dirs(subdir: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(custom) = std::env::var_os("GENESIS_CUDA_LIB_DIR") {
        dirs.extend(std::env::split_paths(&custom));
    }
    for var in ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"] {
        if let Some(root) = std::env::var_os(var) {
            dirs.push(Path::new(&root).join("lib64"));
            dirs.push(Path::new(&root).join("lib"));
        }
    }
    dirs.push("/usr/local/cuda/lib64".into());
    dirs.push("/usr/local/cuda/targets/x86_64-linux/lib".into());
    // CUPTI's home in the toolkit.
    dirs.push("/usr/local/cuda/extras/CUPTI/lib64".into());
    dirs.push("/usr/lib/x86_64-linux-gnu".into());
    // Python wheels: any site-packages under the usual prefixes.
    for prefix in ["/usr/local/lib", "/usr/lib", "/opt/conda/lib"] {
        if let Ok(entries) = std::fs::read_dir(prefix) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                if name.to_string_lossy().starts_with("python3") {
                    for site in ["site-packages", "dist-packages"] {
                        dirs.push(entry.path().join(site).join("nvidia").join(subdir).join("lib"));
                        dirs.push(entry.path().join(site).join("nvidia").join("cu13").join("lib"));
                    }
                }
            }
        }
    }
    dirs.retain(|d| d.is_dir());
    dirs.dedup();
    dirs
}

/// Open `lib<base>.so` for any of the CUDA majors we support (newest first). `subdir` is the
/// wheel directory name (`cuda_nvrtc`, `cublas`).
pub fn open(base: &str, subdir: &str) -> Result<Found> {
    let names: Vec<String> = if cfg!(windows) {
        vec![format!("{base}64_13.dll"), format!("{base}64_12.dll"), format!("{base}.dll")]
    } else {
        vec![format!("lib{base}.so.13"), format!("lib{base}.so.12"), format!("lib{base}.so")]
    };
    open_named(base, &names, subdir)
}

/// Open the first of `names` found on the loader's path or in the search directories; a
/// failure lists every place searched.
pub fn open_named(base: &str, names: &[String], subdir: &str) -> Result<Found> {
    let mut tried = Vec::new();
    for name in names {
        // SAFETY: loading a CUDA library runs its initializers, as any CUDA program does.
        if let Ok(library) = unsafe { Library::new(name) } {
            return Ok(Found { library, path: name.clone() });
        }
    }
    tried.push("the system library path".to_string());
    for dir in search_dirs(subdir) {
        for name in names {
            let path = dir.join(name);
            if path.exists() {
                // SAFETY: as above.
                match unsafe { Library::new(&path) } {
                    Ok(library) => {
                        preload_companions(&dir, base);
                        return Ok(Found { library, path: path.display().to_string() });
                    }
                    Err(e) => tried.push(format!("{} ({e})", path.display())),
                }
            }
        }
        tried.push(dir.display().to_string());
    }
    Err(BackendError::new(
        ErrorKind::DeviceUnavailable,
        format!(
            "cuda: {} not found (looked for {} in {}; set GENESIS_CUDA_LIB_DIR to its directory)",
            names.first().map_or("the library", String::as_str),
            names.join(", "),
            tried.join(", ")
        ),
    ))
}

/// NVRTC opens `libnvrtc-builtins.so.<version>` by name when it compiles; outside the
/// loader's path (a wheel's directory) that fails unless the file is already loaded, so load
/// the ones beside the library we found. They stay loaded for the process.
fn preload_companions(dir: &Path, base: &str) {
    let prefix = format!("lib{base}-builtins.so");
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            // SAFETY: a library of the same toolkit as the one just loaded.
            if let Ok(library) = unsafe { Library::new(entry.path()) } {
                std::mem::forget(library);
            }
        }
    }
}

/// Look up `symbol` in `found`, naming library and symbol when it is missing.
///
/// # Safety
/// `T` must be the symbol's true type.
pub unsafe fn symbol<T: Copy>(found: &Found, symbol: &str) -> Result<T> {
    let name = format!("{symbol}\0");
    found.library.get::<T>(name.as_bytes()).map(|s| *s).map_err(|e| {
        BackendError::new(ErrorKind::DeviceUnavailable, format!("cuda: {} lacks {symbol}: {e}", found.path))
    })
}

/// A struct literal whose function-pointer fields are looked up in a [`Found`] library by
/// symbol name, each with [`symbol`] (so a missing one is an error naming it); the fields
/// after the `;` are given as in any literal. It stands in an `unsafe` block whose SAFETY
/// comment vouches for the field types, in a function returning `Result`:
/// `entry_points!(found, Api { version: "nvrtcVersion", create: "nvrtcCreateProgram"; found })`.
macro_rules! entry_points {
    ($found:expr, $ty:ident { $($field:ident: $name:literal),* $(,)? ; $($rest:tt)* }) => {
        $ty { $($field: $crate::libs::symbol(&$found, $name)?,)* $($rest)* }
    };
}
pub(crate) use entry_points;
