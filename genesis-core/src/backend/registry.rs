//! The process-wide registry of backends and the discovery that fills it.

use super::loader::{library_file_name, load_plugin, name_from_file};
use super::{Backend, Origin, Source};
use crate::error::{Error, ErrorKind, Result};
use genesis_backend_api::ApiVersion;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};

/// One line of [`backends`]: a backend that was found, whether it works, and if not, why.
#[derive(Debug, Clone)]
pub struct BackendStatus {
    /// Device-type name (from the plugin, or from the file name when loading failed early).
    pub name: String,
    /// Where it was found.
    pub origin: Origin,
    /// Which discovery step found it.
    pub source: Source,
    /// The plugin's version, when it loaded.
    pub plugin_version: Option<String>,
    /// The interface version it was built against, when it loaded.
    pub api_version: Option<ApiVersion>,
    /// Usable devices (0 when unavailable).
    pub device_count: usize,
    /// Loaded, not shadowed, and has at least one device.
    pub available: bool,
    /// Why it is not available: the load error, the probe's reason, or the shadowing backend.
    pub reason: Option<String>,
    /// True when another backend of the same name took precedence.
    pub shadowed: bool,
    /// The plugin's one-line description (`BackendInfo::description`), when it loaded: what
    /// it runs on and which libraries it uses (the CUDA plugin says whether convolutions go
    /// through cuDNN, and why not).
    pub description: Option<String>,
}

struct Record {
    name: String,
    origin: Origin,
    source: Source,
    outcome: std::result::Result<Arc<Backend>, Error>,
    shadowed_by: Option<Origin>,
}

#[derive(Default)]
struct Registry {
    records: Vec<Record>,
    active: HashMap<String, Arc<Backend>>,
    seen_files: HashSet<FileKey>,
}

/// Identity of a file across paths: canonical path, plus device/inode on Unix so that cargo's
/// hard links (`target/debug/deps/x.so` and `target/debug/x.so`) count as one file.
#[derive(Hash, PartialEq, Eq)]
enum FileKey {
    Path(PathBuf),
    #[cfg(unix)]
    Inode(u64, u64),
}

fn file_keys(path: &Path) -> Vec<FileKey> {
    let mut keys = vec![FileKey::Path(path.to_path_buf())];
    #[cfg(unix)]
    if let Ok(meta) = std::fs::metadata(path) {
        use std::os::unix::fs::MetadataExt;
        keys.push(FileKey::Inode(meta.dev(), meta.ino()));
    }
    keys
}

fn registry() -> &'static RwLock<Registry> {
    static REGISTRY: OnceLock<RwLock<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(discover()))
}

impl Registry {
    /// Load `path` unless that file was loaded before. Returns the record index.
    fn add_file(&mut self, path: &Path, source: Source, expected_name: Option<&str>) -> Option<usize> {
        let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let keys = file_keys(&canonical);
        if keys.iter().any(|k| self.seen_files.contains(k)) {
            return None;
        }
        self.seen_files.extend(keys);
        let fallback_name =
            expected_name.map(str::to_string).or_else(|| name_from_file(&canonical)).unwrap_or_else(|| "?".into());
        let origin = Origin::Path(canonical.clone());
        let outcome = load_plugin(&canonical).and_then(|p| {
            if let Some(expected) = expected_name.filter(|e| *e != p.name) {
                return Err(Error::load(format!(
                    "{}: GENESIS_BACKENDS names it '{expected}' but the plugin calls itself '{}'",
                    canonical.display(),
                    p.name
                )));
            }
            Ok(Arc::new(Backend {
                name: p.name,
                origin: origin.clone(),
                plugin_version: p.plugin_version,
                api: p.api,
                module: p.module,
                probe: OnceLock::new(),
                capabilities: Default::default(),
            }))
        });
        let name = outcome.as_ref().map(|b| b.name.clone()).unwrap_or(fallback_name);
        self.records.push(Record { name, origin, source, outcome, shadowed_by: None });
        Some(self.records.len() - 1)
    }

    /// Make record `index` the active backend of its name, or mark it shadowed.
    fn activate(&mut self, index: usize, replace: bool) {
        let Ok(backend) = &self.records[index].outcome else { return };
        let backend = backend.clone();
        let name = backend.name.clone();
        if let Some(existing) = self.active.get(&name).cloned() {
            if !replace {
                self.records[index].shadowed_by = Some(existing.origin.clone());
                return;
            }
            for record in &mut self.records {
                if matches!(&record.outcome, Ok(b) if Arc::ptr_eq(b, &existing)) {
                    record.shadowed_by = Some(backend.origin.clone());
                }
            }
        }
        self.active.insert(name, backend);
    }

    fn add_and_activate(&mut self, path: &Path, source: Source, expected_name: Option<&str>) {
        if let Some(index) = self.add_file(path, source, expected_name) {
            self.activate(index, false);
        }
    }
}

fn discover() -> Registry {
    let mut reg = Registry::default();

    if let Ok(list) = std::env::var("GENESIS_BACKENDS") {
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.split_once('=') {
                Some((name, path)) => {
                    reg.add_and_activate(Path::new(path.trim()), Source::BackendsVar, Some(name.trim()))
                }
                None => reg.records.push(Record {
                    name: "?".into(),
                    origin: Origin::Path(PathBuf::from(item)),
                    source: Source::BackendsVar,
                    outcome: Err(Error::load(format!("GENESIS_BACKENDS entry '{item}' is not of the form name=path"))),
                    shadowed_by: None,
                }),
            }
        }
    }
    if let Some(dirs) = std::env::var_os("GENESIS_PLUGIN_PATH") {
        for dir in std::env::split_paths(&dirs) {
            scan_dir(&mut reg, &dir, Source::PluginPath);
        }
    }
    for dir in executable_dirs() {
        scan_dir(&mut reg, &dir, Source::ExecutableDir);
    }
    if let Some(home) = std::env::var_os("HOME") {
        scan_dir(&mut reg, &Path::new(&home).join(".local/lib/genesis/plugins"), Source::UserDir);
    }
    add_embedded(&mut reg);
    reg
}

#[cfg(feature = "embedded-cpu")]
fn add_embedded(reg: &mut Registry) {
    let declaration = &genesis_backend_cpu::genesis_plugin_declaration;
    let backend = Arc::new(Backend {
        name: declaration.name().unwrap_or("cpu").to_string(),
        origin: Origin::Embedded,
        plugin_version: declaration.plugin_version().unwrap_or("?").to_string(),
        api: ApiVersion { major: declaration.api_major, minor: declaration.api_minor },
        module: genesis_backend_cpu::genesis_plugin_module(),
        probe: OnceLock::new(),
        capabilities: Default::default(),
    });
    reg.records.push(Record {
        name: backend.name.clone(),
        origin: Origin::Embedded,
        source: Source::Embedded,
        outcome: Ok(backend),
        shadowed_by: None,
    });
    let index = reg.records.len() - 1;
    // A discovered plugin of this name built for an older interface (a cargo target folder
    // keeps the last CPU plugin built as a library, which may predate this host) gives way
    // to the embedded backend; one named in GENESIS_BACKENDS or loaded by `load_library`
    // keeps its place.
    let older = reg.active.get(&reg.records[index].name).is_some_and(|active| {
        let discovered = reg.records.iter().any(|r| {
            matches!(&r.outcome, Ok(b) if Arc::ptr_eq(b, active))
                && matches!(r.source, Source::PluginPath | Source::ExecutableDir | Source::UserDir)
        });
        discovered && active.api.major == declaration.api_major && active.api.minor < declaration.api_minor
    });
    reg.activate(index, older);
}

#[cfg(not(feature = "embedded-cpu"))]
fn add_embedded(_: &mut Registry) {}

/// Plugin files in `dir`, in name order so discovery is deterministic.
fn scan_dir(reg: &mut Registry, dir: &Path, source: Source) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut files: Vec<PathBuf> =
        entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| name_from_file(p).is_some()).collect();
    files.sort();
    for file in files {
        reg.add_and_activate(&file, source, None);
    }
}

/// The executable's directory, then parents up to the cargo profile directory (the child of
/// the directory holding `CACHEDIR.TAG`, possibly under a target triple). Without a cargo
/// target directory above, only the executable's own directory.
fn executable_dirs() -> Vec<PathBuf> {
    let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.canonicalize().ok())
        .and_then(|p| p.parent().map(Path::to_path_buf))
    else {
        return Vec::new();
    };
    let chain: Vec<PathBuf> = exe_dir.ancestors().take(4).map(Path::to_path_buf).collect();
    for (i, dir) in chain.iter().enumerate() {
        let parent_tagged =
            |levels: usize| dir.ancestors().nth(levels).is_some_and(|p| p.join("CACHEDIR.TAG").exists());
        if parent_tagged(1) || (i > 0 && parent_tagged(2)) {
            return chain[..=i].to_vec();
        }
    }
    vec![exe_dir]
}

/// Load a plugin from `path` now, ahead of every auto-discovered backend of the same name
/// (which is then listed as shadowed). Loading the same file twice returns its first status.
pub fn load_library(path: impl AsRef<Path>) -> Result<BackendStatus> {
    let path = path.as_ref();
    let mut reg = registry().write().unwrap_or_else(|p| p.into_inner());
    let canonical = std::fs::canonicalize(path).map_err(|e| Error::load(format!("{}: {e}", path.display())))?;
    if let Some(index) = reg.records.iter().position(|r| r.origin == Origin::Path(canonical.clone())) {
        return match &reg.records[index].outcome {
            Ok(_) => Ok(status(&reg.records[index])),
            Err(e) => Err(e.clone()),
        };
    }
    let index = reg.add_file(&canonical, Source::Explicit, None).ok_or_else(|| {
        Error::load(format!("{}: this file is already loaded under another path", canonical.display()))
    })?;
    if let Err(e) = &reg.records[index].outcome {
        return Err(e.clone());
    }
    reg.activate(index, true);
    Ok(status(&reg.records[index]))
}

fn status(record: &Record) -> BackendStatus {
    let mut s = BackendStatus {
        name: record.name.clone(),
        origin: record.origin.clone(),
        source: record.source,
        plugin_version: None,
        api_version: None,
        device_count: 0,
        available: false,
        reason: None,
        shadowed: record.shadowed_by.is_some(),
        description: None,
    };
    match &record.outcome {
        Err(e) => s.reason = Some(e.message().to_string()),
        Ok(backend) => {
            s.plugin_version = Some(backend.plugin_version.clone());
            s.api_version = Some(backend.api);
            s.description = backend.info().ok().map(|info| info.description);
            if let Some(by) = &record.shadowed_by {
                s.reason = Some(format!("shadowed by {by}"));
            } else {
                let probe = backend.probe();
                s.device_count = probe.device_count;
                s.available = probe.device_count > 0;
                s.reason = probe.unavailable_reason.clone().filter(|_| !s.available);
            }
        }
    }
    s
}

/// Every backend found, in discovery order, with its availability.
pub fn backends() -> Vec<BackendStatus> {
    let reg = registry().read().unwrap_or_else(|p| p.into_inner());
    reg.records.iter().map(status).collect()
}

/// The active backend called `name`; the error explains a failed load or lists the names.
pub(crate) fn find(name: &str) -> Result<Arc<Backend>> {
    let reg = registry().read().unwrap_or_else(|p| p.into_inner());
    let failed = |r: &&Record| r.name == name && r.outcome.is_err();
    let chosen_by_user = |source: Source| matches!(source, Source::BackendsVar | Source::Explicit);
    // A file the user named for this backend in GENESIS_BACKENDS answers for it even when it
    // failed and another copy (the embedded CPU backend, a discovered plugin) loaded: the user
    // asked for that file. A copy the user chose too (another entry, `load_library`) wins.
    let named = reg.records.iter().filter(failed).find(|r| r.source == Source::BackendsVar);
    let active = reg.active.get(name).map(|backend| {
        let source = reg.records.iter().find(|r| r.outcome.as_ref().is_ok_and(|b| Arc::ptr_eq(b, backend)));
        (backend, source.map(|r| r.source))
    });
    let failure = match (named, active) {
        (Some(named), Some((_, source))) if !source.is_some_and(chosen_by_user) => Some(named),
        (Some(named), None) => Some(named),
        (_, Some((backend, _))) => return Ok(backend.clone()),
        (None, None) => reg.records.iter().find(failed),
    };
    if let Some(record) = failure {
        let reason = record.outcome.as_ref().err().map(|e| e.message().to_string()).unwrap_or_default();
        return Err(Error::new(ErrorKind::DeviceUnavailable, format!("backend '{name}' failed to load: {reason}")));
    }
    let mut names: Vec<&str> = reg.active.keys().map(String::as_str).collect();
    names.sort();
    let available = if names.is_empty() { "none".to_string() } else { names.join(", ") };
    Err(Error::invalid(format!(
        "unknown backend '{name}'; available backends: {available}. Plugins are loaded from GENESIS_BACKENDS \
         (name=path,...), the folders of GENESIS_PLUGIN_PATH, the running program's folder and \
         ~/.local/lib/genesis/plugins; a plugin for '{name}' is a file named {}",
        library_file_name(name)
    )))
}

/// The file name a backend called `name` must have.
pub fn plugin_file_name(name: &str) -> String {
    library_file_name(name)
}
