//! Mutation fuzzing of the loaders, bounded in time for CI: safetensors files, training
//! checkpoints, and the JSON files of a model folder (`config.json`, `tokenizer_config.json`,
//! `generation_config.json`), each damaged many ways (bit flips, interesting bytes,
//! truncation, repeated slices, a rewritten header length, numbers swapped for extreme ones).
//!
//! Every damaged input must give `Ok` or an error: never a panic, and never an allocation
//! larger than [`MAX_ALLOCATION`] (a counting global allocator records the largest request),
//! so a header cannot make a loader reserve memory its file does not hold. Cases are drawn
//! from a fixed seed, so a failure names a case that reproduces.

use genesis::checkpoint::Checkpoint;
use genesis::generation::GenerationConfig;
use genesis::models::qwen2::Qwen2Config;
use genesis::serialize::StateDict;
#[cfg(feature = "text")]
use genesis::text::{ChatTemplate, TokenizerConfig};
use genesis::{DType, Device, Tensor};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The largest single allocation a damaged input may cause: far above anything these small
/// inputs need, far below what a lying header would ask for.
const MAX_ALLOCATION: usize = 64 << 20;

struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only recording the size of each request.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// splitmix64: the cases' random numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to four random damages to `input`.
fn mutate(input: &[u8], rng: &mut Rng, json: bool) -> Vec<u8> {
    let mut b = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        if b.is_empty() {
            b.push(b'{');
        }
        let at = rng.below(b.len());
        match rng.below(if json { 7 } else { 6 }) {
            0 => b[at] ^= 1 << rng.below(8),
            1 => b[at] = [0x00, 0xff, 0x7f, 0x80, b'"', b'{', b'[', b'9', b'-', b'\\'][rng.below(10)],
            2 => b.truncate(at),
            3 => {
                let len = rng.below(64).min(b.len() - at);
                let slice = b[at..at + len].to_vec();
                let to = rng.below(b.len());
                b.splice(to..to, slice);
            }
            4 => {
                b.remove(at);
            }
            // The 8-byte little-endian header length of a safetensors file.
            5 if !json && b.len() >= 8 => {
                let n = [0u64, 1, 7, u64::MAX, 1 << 40, b.len() as u64, b.len() as u64 + 1][rng.below(7)];
                b[..8].copy_from_slice(&n.to_le_bytes());
            }
            5 => b[at] = b'x',
            // A number swapped for an extreme one.
            _ => {
                if let Some(start) = (at..b.len()).find(|&i| b[i].is_ascii_digit()) {
                    let end = (start..b.len()).find(|&i| !b[i].is_ascii_digit() && b[i] != b'.').unwrap_or(b.len());
                    let extreme = ["1e308", "-1", "18446744073709551616", "0", "1e-320", "-9223372036854775809", "NaN"];
                    b.splice(start..end, extreme[rng.below(extreme.len())].bytes());
                }
            }
        }
    }
    b
}

/// Run `load` on `cases` damaged copies of `input` (or until `budget` runs out); any panic
/// or oversized allocation fails the test, naming the case.
fn fuzz(what: &str, input: &[u8], json: bool, seed: u64, cases: usize, budget: Duration, load: &dyn Fn(&[u8])) {
    // One fuzz run at a time: the allocation record is process-wide.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut rng = Rng(seed);
    let start = Instant::now();
    let mut ran = 0;
    for case in 0..cases {
        if start.elapsed() > budget {
            break;
        }
        let damaged = mutate(input, &mut rng, json);
        LARGEST.store(0, Ordering::Relaxed);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| load(&damaged)));
        assert!(outcome.is_ok(), "{what}: case {case} (seed {seed}) panicked");
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(largest <= MAX_ALLOCATION, "{what}: case {case} (seed {seed}) allocated {largest} bytes at once");
        ran += 1;
    }
    assert!(ran >= 50, "{what}: only {ran} cases ran in {budget:?}");
    println!("{what}: {ran} damaged inputs, no panic, largest allocation within {MAX_ALLOCATION} bytes");
}

const BUDGET: Duration = Duration::from_secs(8);

fn small_state_dict() -> StateDict {
    let cpu = Device::cpu().unwrap();
    let mut sd = StateDict::new();
    sd.insert("w".into(), Tensor::arange(0.0, 12.0, 1.0, DType::F32, &cpu).unwrap().reshape(&[3, 4]).unwrap());
    sd.insert("h".into(), Tensor::ones(&[5], DType::BF16, &cpu).unwrap());
    sd.insert("ids".into(), Tensor::from_vec(vec![1i64, -2, 3], &[3], &cpu).unwrap());
    sd.insert("mask".into(), Tensor::from_vec(vec![true, false], &[2], &cpu).unwrap());
    sd
}

#[test]
fn damaged_safetensors_and_checkpoints_are_errors() {
    let cpu = Device::cpu().unwrap();
    let meta = [("format".to_string(), "pt".to_string())].into();
    let file = genesis::serialize::to_bytes(&small_state_dict(), &meta).unwrap();
    fuzz("safetensors", &file, false, 1, 3000, BUDGET, &|b| {
        let _ = genesis::serialize::from_bytes(b, &cpu, "fuzz");
    });
    let checkpoint = Checkpoint { model: small_state_dict(), step: 3, ..Default::default() }.to_bytes().unwrap();
    fuzz("checkpoint", &checkpoint, false, 2, 3000, BUDGET, &|b| {
        let _ = Checkpoint::from_bytes(b, &cpu, "fuzz");
    });
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/models/qwen2/tiny-tied").join(name)
}

/// Write `bytes` as `name` in a scratch folder of its own and return the folder.
fn scratch_with(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    std::fs::write(dir.join(name), bytes).unwrap();
    dir.to_path_buf()
}

#[test]
fn damaged_model_folder_json_is_an_error() {
    let dir = std::env::temp_dir().join(format!("genesis-fuzz-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let read = |name: &str| std::fs::read(fixture(name)).unwrap();
    fuzz("config.json", &read("config.json"), true, 3, 2000, BUDGET, &|b| {
        let folder = scratch_with(&dir, "config.json", b);
        let _ = Qwen2Config::from_file(folder.join("config.json"));
    });
    #[cfg(feature = "text")]
    fuzz("tokenizer_config.json", &read("tokenizer_config.json"), true, 4, 2000, BUDGET, &|b| {
        let folder = scratch_with(&dir, "tokenizer_config.json", b);
        if let Ok(config) = TokenizerConfig::from_file(folder.join("tokenizer_config.json")) {
            let _ = ChatTemplate::from_config(&config, None);
        }
    });
    fuzz("generation_config.json", &read("generation_config.json"), true, 5, 2000, BUDGET, &|b| {
        let folder = scratch_with(&dir, "generation_config.json", b);
        let _ = GenerationConfig::from_folder(&folder);
    });
    let _ = std::fs::remove_dir_all(&dir);
}
