//! Criterion benchmarks of the CPU backend, run through the `Device` trait exactly as the core
//! calls it: buffers are allocated and filled once, then each iteration is one
//! `Device::execute`.
//!
//! `cargo bench -p genesis-backend-cpu --bench cpu` (a few minutes on 2 cores). Results land in
//! `target/criterion/<group>/<name>/new/estimates.json`; `benches/compare_numpy.py` reads them
//! and times the same work with numpy. Pass a criterion filter to run a subset, e.g.
//! `cargo bench -p genesis-backend-cpu --bench cpu -- matmul/`.
//!
//! Benchmark ids (`group/name`) are part of the interface with `compare_numpy.py`: rename both
//! together.

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use genesis_backend_api::{Backend, BinaryOp, DType, Device, Op, ReduceOp, TensorDesc, UnaryOp, Window2d};
use genesis_backend_cpu::{CpuBackend, CpuDevice};
use half::bf16;
use std::time::Duration;

/// Rows and columns of the 2-D tensors of the elementwise, reduction and row-wise benchmarks.
const ROWS: usize = 4096;
const COLS: usize = 1024;

/// Deterministic values in `[lo, hi)` (an LCG: benchmarks need realistic magnitudes, not
/// statistical quality).
fn values(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

struct Bench {
    dev: CpuDevice,
}

impl Bench {
    fn new() -> Self {
        Bench { dev: CpuBackend::new().open_device(0).expect("the CPU device opens") }
    }

    /// A dense tensor holding `bytes`.
    fn upload(&self, bytes: &[u8], dtype: DType, shape: &[usize]) -> TensorDesc {
        let buffer = self.dev.allocate(bytes.len()).expect("allocate");
        self.dev.write(buffer, 0, bytes).expect("write");
        TensorDesc::contiguous(buffer, 0, dtype, shape).expect("descriptor")
    }

    fn f32(&self, shape: &[usize], seed: u64, lo: f32, hi: f32) -> TensorDesc {
        let v = values(shape.iter().product(), seed, lo, hi);
        self.upload(bytemuck::cast_slice(&v), DType::F32, shape)
    }

    fn bf16(&self, shape: &[usize], seed: u64, lo: f32, hi: f32) -> TensorDesc {
        let v: Vec<bf16> = values(shape.iter().product(), seed, lo, hi).into_iter().map(bf16::from_f32).collect();
        self.upload(bytemuck::cast_slice(&v), DType::BF16, shape)
    }

    /// A dense output (zero-filled once, so the first iteration does not pay for page faults).
    fn output(&self, dtype: DType, shape: &[usize]) -> TensorDesc {
        let n: usize = shape.iter().product();
        self.upload(&vec![0u8; n * dtype.size_in_bytes()], dtype, shape)
    }

    /// Register `group/name`: one `execute` of `op` per iteration.
    fn run(
        &self,
        group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
        name: &str,
        throughput: Throughput,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
    ) {
        // Fail loudly (once, outside the timing loop) rather than time an error path.
        self.dev.execute(&op, inputs, outputs).unwrap_or_else(|e| panic!("{name}: {e}"));
        group.throughput(throughput);
        group.bench_function(name, |b| b.iter(|| self.dev.execute(&op, inputs, outputs).unwrap()));
    }
}

/// Short runs: every benchmark here is milliseconds long, so ten samples over a couple of
/// seconds already give a median stable to a few percent.
fn configure<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2));
    g
}

fn bytes_f32(n: usize) -> u64 {
    (n * 4) as u64
}

fn elementwise(c: &mut Criterion) {
    let bench = Bench::new();
    let shape = [ROWS, COLS];
    let n = ROWS * COLS;
    let a = bench.f32(&shape, 1, -4.0, 4.0);
    let b = bench.f32(&shape, 2, -4.0, 4.0);
    let row = bench.f32(&[COLS], 3, -4.0, 4.0);
    let row_b = TensorDesc::new(row.buffer, 0, DType::F32, &shape, &[0, 1]).unwrap();
    let y = bench.output(DType::F32, &shape);
    let mut g = configure(c, "elementwise");
    // Bytes moved: inputs read plus output written (write-allocate traffic not counted).
    bench.run(&mut g, "copy_f32", Throughput::Bytes(bytes_f32(2 * n)), Op::Copy, &[a], &[y]);
    let add = Op::Binary(BinaryOp::Add);
    bench.run(&mut g, "add_f32", Throughput::Bytes(bytes_f32(3 * n)), add, &[a, b], &[y]);
    bench.run(&mut g, "add_f32_bcast", Throughput::Bytes(bytes_f32(2 * n)), add, &[a, row_b], &[y]);
    bench.run(&mut g, "exp_f32", Throughput::Bytes(bytes_f32(2 * n)), Op::Unary(UnaryOp::Exp), &[a], &[y]);
    // A copy far larger than the last-level cache: the memory-bandwidth reference (the 16 MiB
    // operands above are partly cache-resident on a machine with a 32 MiB L3).
    let big = 64 << 20;
    let (src, dst) = (bench.f32(&[big], 12, -1.0, 1.0), bench.output(DType::F32, &[big]));
    bench.run(&mut g, "copy_f32_256mib", Throughput::Bytes(bytes_f32(2 * big)), Op::Copy, &[src], &[dst]);
    g.finish();
}

fn reduce(c: &mut Criterion) {
    let bench = Bench::new();
    let x = bench.f32(&[ROWS, COLS], 4, -1.0, 1.0);
    let per_row = bench.output(DType::F32, &[ROWS, 1]);
    let per_col = bench.output(DType::F32, &[1, COLS]);
    let sum = Op::Reduce(ReduceOp::Sum);
    let bytes = Throughput::Bytes(bytes_f32(ROWS * COLS));
    let mut g = configure(c, "reduce");
    // Sum of each row (over the contiguous last dim) and of each column (over dim 0).
    bench.run(&mut g, "sum_rows_f32", bytes.clone(), sum, &[x], &[per_row]);
    bench.run(&mut g, "sum_cols_f32", bytes, sum, &[x], &[per_col]);
    g.finish();
}

fn matmul(c: &mut Criterion) {
    let bench = Bench::new();
    let mut g = configure(c, "matmul");
    for n in [64usize, 256, 1024] {
        let flops = Throughput::Elements((2 * n * n * n) as u64);
        let shape = [n, n];
        let (a, b) = (bench.f32(&shape, 5, -1.0, 1.0), bench.f32(&shape, 6, -1.0, 1.0));
        let y = bench.output(DType::F32, &shape);
        bench.run(&mut g, &format!("f32_{n}"), flops.clone(), Op::Matmul, &[a, b], &[y]);
        let (a, b) = (bench.bf16(&shape, 5, -1.0, 1.0), bench.bf16(&shape, 6, -1.0, 1.0));
        let y = bench.output(DType::BF16, &shape);
        bench.run(&mut g, &format!("bf16_{n}"), flops, Op::Matmul, &[a, b], &[y]);
    }
    g.finish();
}

fn rowwise(c: &mut Criterion) {
    let bench = Bench::new();
    let shape = [ROWS, COLS];
    let bytes = Throughput::Bytes(bytes_f32(2 * ROWS * COLS));
    let x = bench.f32(&shape, 7, -4.0, 4.0);
    let y = bench.output(DType::F32, &shape);
    let w = bench.f32(&[COLS], 8, 0.5, 1.5);
    let bias = bench.f32(&[COLS], 9, -0.5, 0.5);
    let mean = bench.output(DType::F32, &[ROWS]);
    let rstd = bench.output(DType::F32, &[ROWS]);
    let mut g = configure(c, "rowwise");
    bench.run(&mut g, "softmax_f32", bytes.clone(), Op::Softmax, &[x], &[y]);
    bench.run(&mut g, "layer_norm_f32", bytes, Op::LayerNorm { eps: 1e-5 }, &[x, w, bias], &[y, mean, rstd]);
    g.finish();
}

fn conv2d(c: &mut Criterion) {
    let bench = Bench::new();
    let (n, ci, h, w, co, k) = (8, 64, 56, 56, 64, 3);
    let x = bench.f32(&[n, ci, h, w], 10, -1.0, 1.0);
    let weight = bench.f32(&[co, ci, k, k], 11, -0.1, 0.1);
    let y = bench.output(DType::F32, &[n, co, h, w]);
    let window = Window2d { kernel: [0, 0], stride: [1, 1], padding: [1, 1], dilation: [1, 1] };
    let flops = Throughput::Elements((2 * n * co * h * w * ci * k * k) as u64);
    let mut g = configure(c, "conv2d");
    g.measurement_time(Duration::from_secs(3));
    bench.run(&mut g, "f32_8x64x56x56_k3", flops, Op::Conv2d { window, groups: 1 }, &[x, weight], &[y]);
    g.finish();
}

fn adamw(c: &mut Criterion) {
    let bench = Bench::new();
    // Ten million parameters in four tensors of uneven size (a small model's parameter list).
    let sizes = [4_000_000usize, 3_000_000, 2_000_000, 1_000_000];
    let (mut grads, mut state) = (Vec::new(), Vec::new());
    for (i, &len) in sizes.iter().enumerate() {
        let s = 20 + 4 * i as u64;
        grads.push(bench.f32(&[len], s, -1e-2, 1e-2));
        state.push(bench.f32(&[len], s + 1, -1.0, 1.0));
        state.push(bench.f32(&[len], s + 2, -1e-3, 1e-3));
        state.push(bench.f32(&[len], s + 3, 0.0, 1e-5));
    }
    let total: usize = sizes.iter().sum();
    // Read grad, param, exp_avg, exp_avg_sq; write the last three.
    let bytes = Throughput::Bytes(bytes_f32(7 * total));
    let op = Op::AdamW { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, step: 10 };
    let mut g = configure(c, "adamw");
    g.measurement_time(Duration::from_secs(3));
    bench.run(&mut g, "f32_10m", bytes, op, &grads, &state);
    g.finish();
}

criterion_group!(benches, elementwise, reduce, matmul, rowwise, conv2d, adamw);
criterion_main!(benches);
