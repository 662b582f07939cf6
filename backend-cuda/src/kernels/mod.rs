//! The kernel side of the device: the CUDA C sources, the modules NVRTC compiles them into and
//! the defines of each element type, kernel names; the argument block and the strided geometry
//! of a launch are in [`args`].

use genesis_backend_api::{BackendError, DType, Result};

mod args;
#[cfg(test)]
pub mod layout;

pub use args::{merge_dims, set_geometry, Args, Operand};

/// The header every module starts with: element types, conversions, the argument block.
const COMMON: &str = include_str!("common.cuh");

/// A kernel module: CUDA C sources that NVRTC compiles together, after `common.cuh`, once per
/// element type in `dtypes`, on first use (each compile costs seconds on a cold cache, so the
/// fused families exist for the float types only). The family file that launches a module's
/// kernels declares it and registers it with `inventory::submit!`; a new module is a `.cu`
/// file and one declaration.
#[derive(Debug)]
pub struct Module {
    /// The name in cache files and errors.
    pub name: &'static str,
    /// The sources after `common.cuh`, in order.
    pub sources: &'static [&'static str],
    /// The element types it is compiled for.
    pub dtypes: &'static [DType],
}

inventory::collect!(Module);

impl Module {
    /// Every registered module.
    pub fn all() -> impl Iterator<Item = &'static Module> {
        inventory::iter::<Module>.into_iter()
    }

    /// The whole source NVRTC compiles.
    pub fn source(&self) -> String {
        std::iter::once(COMMON).chain(self.sources.iter().copied()).collect()
    }

    /// Whether this module is ever compiled for `dtype`.
    pub fn serves(&self, dtype: DType) -> bool {
        self.dtypes.contains(&dtype)
    }
}

/// The C type and defines a module is compiled with for element type `dtype`.
pub fn defines(dtype: DType) -> Vec<String> {
    let ctype = match dtype {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "h16",
        DType::BF16 => "b16",
        DType::I64 => "i64",
        DType::I32 => "int",
        DType::U8 => "u8",
        DType::Bool => "bool8",
    };
    let class = if dtype.is_float() {
        "IS_FLOAT=1"
    } else if dtype == DType::Bool {
        "IS_BOOL=1"
    } else {
        "IS_INT=1"
    };
    let mut defines = vec![format!("ELEM={ctype}"), class.to_string()];
    if matches!(dtype, DType::F32 | DType::F64) {
        // Sums of f32 accumulate in f64, as the CPU reference does.
        defines.push("IS_DOUBLE_ACC=1".into());
    }
    defines
}

/// A kernel name composed on the stack ("binary_" + "add" + "_c"): names are chosen per
/// launch, and the launch path of a small op should not allocate.
pub struct KernelName {
    len: usize,
    bytes: [u8; 64],
}

impl KernelName {
    /// The concatenation of `parts`; an error if it is longer than 64 bytes.
    pub fn new(parts: &[&str]) -> Result<KernelName> {
        let mut name = KernelName { len: 0, bytes: [0; 64] };
        for part in parts {
            let end = name.len + part.len();
            let Some(dst) = name.bytes.get_mut(name.len..end) else {
                return Err(BackendError::internal(format!("cuda: kernel name {}.. is too long", parts.concat())));
            };
            dst.copy_from_slice(part.as_bytes());
            name.len = end;
        }
        Ok(name)
    }
}

impl std::ops::Deref for KernelName {
    type Target = str;
    fn deref(&self) -> &str {
        // Whole `&str` parts were copied, so the bytes are UTF-8.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every CUDA source file in this directory is part of a module (a file left out of the
    /// list compiles fine and then fails at run time with "named symbol not found").
    #[test]
    fn every_source_file_is_compiled() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kernels");
        let mut files = std::collections::HashSet::new();
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.ends_with(".cu") || name.ends_with(".cuh") {
                let text = std::fs::read_to_string(entry.path()).unwrap();
                let used = text == COMMON || Module::all().any(|m| m.sources.contains(&text.as_str()));
                assert!(used, "{name} is in no module");
                files.insert(text);
            }
        }
        // And every source of every module is a file here (none listed twice in one module).
        let mut names = std::collections::HashSet::new();
        for module in Module::all() {
            assert!(names.insert(module.name), "two modules are named {}", module.name);
            let srcs = module.sources;
            let unique: std::collections::HashSet<&str> = srcs.iter().copied().collect();
            assert_eq!(unique.len(), srcs.len(), "{} lists a source twice", module.name);
            assert!(!srcs.contains(&COMMON), "{} lists common.cuh, which every module starts with", module.name);
            assert!(srcs.iter().all(|s| files.contains(*s)), "{} has a source that is not a file here", module.name);
        }
    }
}
