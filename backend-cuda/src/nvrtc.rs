//! Kernel compilation: CUDA C sources of this crate compiled by NVRTC to a CUBIN for the
//! device's architecture, cached on disk.
//!
//! The cache key is a hash of the source and options, the architecture, the driver version
//! and the NVRTC version, so a second process start finds every module on disk and compiles
//! nothing; a different GPU, driver or compiler gets its own entries. Entries are written to a
//! temporary name and renamed, so concurrent processes never read half a file.

use crate::libs::{self, Found};
use genesis_backend_api::{BackendError, Result};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

type Program = *mut c_void;
type Status = c_int;

/// The NVRTC entry points we use (stable since CUDA 11.1).
struct Api {
    found: Found,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Program) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
}

/// NVRTC, opened once per process.
pub struct Compiler {
    api: Api,
    /// `(major, minor)` of NVRTC.
    pub version: (i32, i32),
    cache_dir: Option<PathBuf>,
    /// Modules compiled by this process (the rest came from the disk cache).
    pub compiled: AtomicU64,
}

/// 64-bit FNV-1a: a stable hash (std's hasher may change between Rust releases, which would
/// orphan every cache entry).
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        // Separate the parts so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("GENESIS_CUDA_CACHE") {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("genesis").join("cuda-kernels"))
}

pub(crate) fn verbose() -> bool {
    std::env::var_os("GENESIS_CUDA_VERBOSE").is_some_and(|v| v != "0")
}

impl Compiler {
    /// Open NVRTC; the error names the library and the paths searched.
    pub fn open() -> Result<Compiler> {
        let found = libs::open("nvrtc", "cuda_nvrtc")?;
        // SAFETY: each type below is the documented C signature of the named NVRTC function.
        let api = unsafe {
            libs::entry_points!(found, Api {
                version: "nvrtcVersion",
                create: "nvrtcCreateProgram",
                compile: "nvrtcCompileProgram",
                log_size: "nvrtcGetProgramLogSize",
                log: "nvrtcGetProgramLog",
                cubin_size: "nvrtcGetCUBINSize",
                cubin: "nvrtcGetCUBIN",
                destroy: "nvrtcDestroyProgram",
                error_string: "nvrtcGetErrorString",
                ;
                found,
            })
        };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        unsafe { (api.version)(&mut major, &mut minor) };
        Ok(Compiler { api, version: (major, minor), cache_dir: cache_dir(), compiled: AtomicU64::new(0) })
    }

    fn status(&self, call: &str, status: Status) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: NVRTC returns a static string for any status.
        let text = unsafe { CStr::from_ptr((self.api.error_string)(status)) }.to_string_lossy().into_owned();
        Err(BackendError::internal(format!("cuda: {call} failed: {text}")))
    }

    /// Whether modules for `sm_{arch}` are compiled for its arch-specific target (`sm_90a`),
    /// so that kernels using its instructions (wgmma) are not compiled empty.
    pub fn arch_specific(&self, arch: u32) -> bool {
        arch_specific(arch, self.version.0)
    }

    /// The CUBIN of `source` for `sm_{arch}` (`target`), from the disk cache or compiled now.
    /// `name` is used for messages and file names; `defines` become `-D` options.
    pub fn cubin(&self, name: &str, source: &str, defines: &[String], arch: u32, driver: i32) -> Result<Vec<u8>> {
        let mut options: Vec<String> = vec![
            format!("--gpu-architecture={}", target(arch, self.version.0)),
            "--std=c++17".into(),
            "-default-device".into(),
        ];
        options.extend(defines.iter().map(|d| format!("-D{d}")));
        let option_text = options.join(" ");
        let nvrtc = format!("{}.{}", self.version.0, self.version.1);
        let key = fnv1a(&[source.as_bytes(), option_text.as_bytes(), nvrtc.as_bytes()]);
        let file = self.cache_dir.as_ref().map(|d| d.join(format!("{name}-{key:016x}-sm{arch}-drv{driver}.cubin")));
        if let Some(path) = &file {
            if let Ok(bytes) = std::fs::read(path) {
                if !bytes.is_empty() {
                    return Ok(bytes);
                }
            }
        }
        let cubin = self.compile(name, source, &options)?;
        let count = self.compiled.fetch_add(1, Ordering::Relaxed) + 1;
        if verbose() {
            let from = &self.api.found.path;
            eprintln!(
                "genesis-cuda: compiled kernel module {name} ({option_text}) with {from}, #{count} in this process"
            );
        }
        if let Some(path) = &file {
            // A cache that cannot be written only costs time: the next start compiles again.
            let _ = store(path, &cubin);
        }
        Ok(cubin)
    }

    fn compile(&self, name: &str, source: &str, options: &[String]) -> Result<Vec<u8>> {
        let src = CString::new(source).map_err(|_| BackendError::internal("kernel source has a NUL byte"))?;
        let cname = CString::new(format!("{name}.cu")).map_err(|_| BackendError::internal("bad kernel name"))?;
        let copts: Vec<CString> = options.iter().filter_map(|o| CString::new(o.as_str()).ok()).collect();
        let ptrs: Vec<*const c_char> = copts.iter().map(|c| c.as_ptr()).collect();
        let mut program: Program = std::ptr::null_mut();
        // SAFETY: valid C strings that outlive the calls; the program is destroyed below.
        unsafe {
            self.status(
                "nvrtcCreateProgram",
                (self.api.create)(&mut program, src.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null()),
            )?;
            let compiled = (self.api.compile)(program, ptrs.len() as c_int, ptrs.as_ptr());
            let result = if compiled != 0 {
                let log = self.log(program);
                let text = CStr::from_ptr((self.api.error_string)(compiled)).to_string_lossy().into_owned();
                Err(BackendError::internal(format!(
                    "cuda: NVRTC {}.{} ({}) could not compile kernel module `{name}` ({text}) with options {}:\n{log}",
                    self.version.0,
                    self.version.1,
                    self.api.found.path,
                    options.join(" ")
                )))
            } else {
                let mut size = 0usize;
                self.status("nvrtcGetCUBINSize", (self.api.cubin_size)(program, &mut size)).and_then(|()| {
                    let mut bytes = vec![0u8; size];
                    self.status("nvrtcGetCUBIN", (self.api.cubin)(program, bytes.as_mut_ptr() as *mut c_char))
                        .map(|()| bytes)
                })
            };
            (self.api.destroy)(&mut program);
            result
        }
    }

    /// # Safety
    /// `program` must be a live NVRTC program.
    unsafe fn log(&self, program: Program) -> String {
        let mut size = 0usize;
        if (self.api.log_size)(program, &mut size) != 0 || size == 0 {
            return String::from("(no log)");
        }
        let mut bytes = vec![0u8; size];
        if (self.api.log)(program, bytes.as_mut_ptr() as *mut c_char) != 0 {
            return String::from("(log unavailable)");
        }
        String::from_utf8_lossy(&bytes).trim_end_matches('\0').to_string()
    }
}

/// NVRTC's name for the architecture a module is compiled for: sm_90 compiles as sm_90a (with
/// NVRTC 12 or newer, which knows it), whose warpgroup products (wgmma) the Hopper attention
/// forward uses; the code runs on sm_90 alone, which is the device it is compiled for.
fn target(arch: u32, nvrtc_major: i32) -> String {
    if arch_specific(arch, nvrtc_major) {
        format!("sm_{arch}a")
    } else {
        format!("sm_{arch}")
    }
}

fn arch_specific(arch: u32, nvrtc_major: i32) -> bool {
    arch == 90 && nvrtc_major >= 12
}

fn store(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::{fnv1a, target, Compiler};

    #[test]
    fn hopper_compiles_for_its_arch_specific_target() {
        assert_eq!(target(90, 13), "sm_90a");
        assert_eq!(target(90, 12), "sm_90a");
        // NVRTC 11 does not know sm_90a: the module compiles for sm_90, without wgmma.
        assert_eq!(target(90, 11), "sm_90");
        assert_eq!(target(80, 13), "sm_80");
        assert_eq!(target(100, 13), "sm_100");
    }

    /// Every kernel module compiles for each element type it serves (Hopper, Ampere, and Turing,
    /// which takes the `__CUDA_ARCH__ < 800` paths no GPU of ours runs), where NVRTC can be found
    /// (it needs no GPU: `GENESIS_CUDA_LIB_DIR` may point at a wheel's `lib`).
    // Ignored rather than silently passing where NVRTC is absent (CI): run with
    // `GENESIS_CUDA_LIB_DIR=<nvrtc lib dir> cargo test -p genesis-backend-cuda -- --ignored`.
    #[test]
    #[ignore = "needs NVRTC (set GENESIS_CUDA_LIB_DIR or install CUDA)"]
    fn every_kernel_module_compiles() {
        let mut compiler = Compiler::open().expect("NVRTC opens");
        compiler.cache_dir = None;
        for module in crate::kernels::Module::all() {
            let name = module.name;
            for &dtype in module.dtypes {
                for arch in [75, 80, 90] {
                    let defines = crate::kernels::defines(dtype);
                    let cubin = compiler.cubin(name, &module.source(), &defines, arch, 0);
                    assert!(
                        cubin.as_ref().is_ok_and(|c| c.len() > 1000),
                        "{name} {dtype} sm_{arch}: {:?}",
                        cubin.err()
                    );
                }
            }
        }
    }

    #[test]
    #[ignore = "needs NVRTC (set GENESIS_CUDA_LIB_DIR or install CUDA)"]
    fn compile_errors_carry_the_log() {
        let mut compiler = Compiler::open().expect("NVRTC opens");
        compiler.cache_dir = None;
        let e = compiler.cubin("broken", "extern \"C\" __global__ void k() { undefined_thing(); }", &[], 90, 0);
        let message = e.unwrap_err().message;
        assert!(message.contains("undefined_thing") && message.contains("broken"), "{message}");
    }

    #[test]
    fn the_cache_hash_is_stable_and_separates_parts() {
        // The FNV-1a reference value of the empty string, before our part separator.
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[b"kernel"]), fnv1a(&[b"kernel"]));
        assert_eq!(fnv1a(&[]), 0xcbf2_9ce4_8422_2325);
    }
}
