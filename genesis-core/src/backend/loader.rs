//! Opening plugin files: the declaration check, then abi_stable's typed load.

use crate::error::{Error, Result};
use genesis_backend_api::abi::{PluginDeclaration, PluginModuleRef, DECLARATION_MAGIC, DECLARATION_SYMBOL};
use genesis_backend_api::{ApiVersion, API_VERSION};
use std::path::Path;

/// A plugin file that passed every check; its library is leaked, so the module stays valid.
pub(crate) struct LoadedPlugin {
    pub name: String,
    pub plugin_version: String,
    pub api: ApiVersion,
    pub module: PluginModuleRef,
}

/// Load the plugin at `path` (already canonical). Each failure names the file and the reason.
pub(crate) fn load_plugin(path: &Path) -> Result<LoadedPlugin> {
    let shown = path.display();
    if !path.exists() {
        return Err(Error::load(format!("{shown}: file does not exist")));
    }
    let library =
        open_library(path).map_err(|e| Error::load(format!("{shown}: not a loadable shared library: {e}")))?;

    let declaration: PluginDeclaration = {
        let symbol = format!("{DECLARATION_SYMBOL}\0");
        // SAFETY: the symbol, when present, is the `PluginDeclaration` static that
        // `export_backend!` defines; its layout is frozen for every interface version.
        let found = unsafe { library.get::<*const PluginDeclaration>(symbol.as_bytes()) };
        match found {
            Ok(pointer) if !pointer.is_null() => unsafe { **pointer },
            _ => {
                return Err(Error::load(format!("{shown}: not a Genesis plugin (no `{DECLARATION_SYMBOL}` symbol)")));
            }
        }
    };
    if declaration.magic != DECLARATION_MAGIC {
        return Err(Error::load(format!("{shown}: not a Genesis plugin (bad declaration magic)")));
    }
    let name = declaration
        .name()
        .filter(|n| valid_name(n))
        .map(str::to_string)
        .ok_or_else(|| Error::load(format!("{shown}: plugin name must be 1-31 characters of [a-z0-9_]")))?;
    let api = ApiVersion { major: declaration.api_major, minor: declaration.api_minor };
    if api.major != API_VERSION.major {
        return Err(Error::load(format!(
            "{shown}: plugin '{name}' was built for interface {api}, this host supports {}.x",
            API_VERSION.major
        )));
    }

    // abi_stable checks its own ABI version and the layout of every type reachable from the
    // root module, per library (no process-wide cache, unlike `RootModule::load_from_file`).
    let header = abi_stable::library::lib_header_from_path(path)
        .map_err(|e| Error::load(format!("{shown}: plugin '{name}': {e}")))?;
    let layout_error = |e: &dyn std::fmt::Display| {
        Error::load(format!("{shown}: plugin '{name}' (interface {api}) interface layout check failed: {e}"))
    };
    let module = if api.minor >= API_VERSION.minor {
        header.init_root_module::<PluginModuleRef>().map_err(|e| layout_error(&e))?
    } else {
        // abi_stable only accepts libraries whose root module has at least the host's fields.
        // A plugin of an older minor has a prefix of them, so check the other way round: every
        // field the plugin has must match the host's field of the same position. Fields it
        // lacks then read as `None` through the prefix-type accessors.
        let plugin_layout = header.layout().ok_or_else(|| layout_error(&"the plugin exports no layout"))?;
        let host_layout = <PluginModuleRef as abi_stable::StableAbi>::LAYOUT;
        abi_stable::abi_stability::abi_checking::check_layout_compatibility(plugin_layout, host_layout)
            .map_err(|e| layout_error(&e))?;
        // SAFETY: the layout was checked just above, in the direction that fits an older plugin.
        unsafe { header.init_root_module_with_unchecked_layout::<PluginModuleRef>() }.map_err(|e| layout_error(&e))?
    };

    // Never unload: plugin code may have registered thread-local destructors and the module
    // holds function pointers into the library.
    std::mem::forget(library);
    Ok(LoadedPlugin { name, plugin_version: declaration.plugin_version().unwrap_or("?").to_string(), api, module })
}

#[cfg(unix)]
fn open_library(path: &Path) -> std::result::Result<libloading::Library, libloading::Error> {
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    // RTLD_NOW surfaces missing symbols here rather than at the first call; RTLD_LOCAL keeps
    // plugins' symbols from colliding with each other.
    unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map(Into::into)
}

#[cfg(not(unix))]
fn open_library(path: &Path) -> std::result::Result<libloading::Library, libloading::Error> {
    unsafe { libloading::Library::new(path) }
}

/// `[a-z0-9_]{1,31}`.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 32
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// `libgenesis_backend_<name>.so` (with the platform's prefix and suffix).
pub(crate) fn library_file_name(name: &str) -> String {
    format!("{}genesis_backend_{name}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

/// The backend name a plugin file name announces, if it follows the naming rule.
pub(crate) fn name_from_file(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    let stem = file.strip_prefix(std::env::consts::DLL_PREFIX)?.strip_suffix(std::env::consts::DLL_SUFFIX)?;
    let name = stem.strip_prefix("genesis_backend_")?;
    valid_name(name).then(|| name.to_string())
}
