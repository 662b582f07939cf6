//! Suite `collective`: all-reduce, broadcast, all-gather and reduce-scatter over the backend's
//! devices, from one process.
//!
//! A world of one device always runs (each collective is then a copy); with two or more
//! devices, every device joins, and once more in reverse order so rank 0 is not device 0.
//! Values are small integers (quarter-integers for f16/f32/f64), so every sum is exact in
//! every dtype, whatever order a backend adds in: outputs must match bit for bit. Guard
//! bytes around each output catch writes past it. A backend that leaves collectives to the
//! interface's host-staged default passes too: the suite checks results, not speed.

use crate::case::{Case, Outcome, Status, Tier};
use crate::target::{Target, CANARY, GUARD_BYTES};
use crate::values::{decode, encode, short_name, Rng};
use genesis::{Device, ErrorKind};
use genesis_backend_api::{BufferId, CollectiveArg, CollectiveOp, DType, TensorDesc};

/// Worlds to test: `(name, device indices in rank order)`.
fn worlds(count: usize) -> Vec<(String, Vec<usize>)> {
    let mut worlds = vec![("world1".to_string(), vec![0])];
    if count >= 2 {
        worlds.push((format!("world{count}"), (0..count).collect()));
        worlds.push((format!("world{count}_reversed"), (0..count).rev().collect()));
    }
    worlds
}

/// Buffers on several devices, freed when dropped.
struct Buffers(Vec<(Device, BufferId)>);

impl Buffers {
    /// A buffer of `bytes` plus guard regions, guards set to the canary; returns the buffer.
    fn guarded(&mut self, device: &Device, bytes: usize) -> Result<BufferId, String> {
        let buffer = device.allocate(bytes + 2 * GUARD_BYTES).map_err(|e| format!("allocate on {device}: {e}"))?;
        self.0.push((device.clone(), buffer));
        device.write(buffer, 0, &vec![CANARY; bytes + 2 * GUARD_BYTES]).map_err(|e| e.to_string())?;
        Ok(buffer)
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        for (device, buffer) in self.0.drain(..) {
            let _ = device.free(buffer);
        }
    }
}

/// Values whose sums over up to 64 ranks are exact in `dtype`.
fn exact_values(rng: &mut Rng, dtype: DType, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| match dtype {
            DType::F32 | DType::F64 | DType::F16 => (rng.below(65) as f64 - 32.0) / 4.0,
            DType::BF16 => rng.below(9) as f64 - 4.0,
            DType::Bool => (rng.next_u64() & 1) as f64,
            // Near the top of the range, so that sums wrap.
            DType::U8 => (rng.below(64) + 192) as f64,
            DType::I32 | DType::I64 => rng.below(2001) as f64 - 1000.0,
        })
        .collect()
}

/// The expected sum of `parts`, wrapped like the dtype wraps.
fn wrapped_sum(dtype: DType, parts: &[&[f64]], i: usize) -> f64 {
    let s: f64 = parts.iter().map(|p| p[i]).sum();
    match dtype {
        DType::U8 => (s as i64).rem_euclid(256) as f64,
        _ => s,
    }
}

fn to_bytes(dtype: DType, values: &[f64]) -> Vec<u8> {
    let size = dtype.size_in_bytes();
    let mut bytes = vec![0u8; values.len() * size];
    for (v, chunk) in values.iter().zip(bytes.chunks_exact_mut(size)) {
        encode(dtype, *v, chunk);
    }
    bytes
}

/// One collective call: `rows` is dim 0 of each rank's input, `cols` its columns;
/// `in_place` makes each output its input (for the ops that allow it).
struct Sample {
    op: CollectiveOp,
    dtype: DType,
    world: Vec<usize>,
    rows: usize,
    cols: usize,
    in_place: bool,
    id: String,
}

fn run_collective(t: &Target, sample: &Sample) -> Outcome {
    match try_collective(t, sample) {
        Ok(outcome) => outcome,
        Err((ErrorKind::Unsupported, message)) => Outcome::with(Status::NotSupported, message),
        Err((_, message)) => Outcome::error(message),
    }
}

fn try_collective(t: &Target, sample: &Sample) -> Result<Outcome, (ErrorKind, String)> {
    let Sample { op, dtype, ref world, rows, cols, in_place, ref id } = *sample;
    let harness = |e: String| (ErrorKind::Internal, e);
    let name = t.device.backend().name().to_string();
    let devices: Vec<Device> = world
        .iter()
        .map(|i| Device::parse(&format!("{name}:{i}")).map_err(|e| harness(e.to_string())))
        .collect::<Result<_, _>>()?;
    let n = world.len();
    let size = dtype.size_in_bytes();
    let out_rows = match op {
        CollectiveOp::AllReduceSum | CollectiveOp::Broadcast => rows,
        CollectiveOp::AllGather => rows * n,
        CollectiveOp::ReduceScatterSum => rows / n,
    };
    let mut rng = Rng::for_id(id);
    let inputs: Vec<Vec<f64>> = (0..n).map(|_| exact_values(&mut rng, dtype, rows * cols)).collect();
    let mut buffers = Buffers(Vec::new());
    let mut args = Vec::new();
    let mut outputs = Vec::new();
    for (device, values) in devices.iter().zip(&inputs) {
        let in_bytes = to_bytes(dtype, values);
        let input_buffer = buffers.guarded(device, in_bytes.len()).map_err(harness)?;
        device.write(input_buffer, GUARD_BYTES, &in_bytes).map_err(|e| harness(e.to_string()))?;
        let input = TensorDesc::contiguous(input_buffer, GUARD_BYTES, dtype, &[rows, cols])
            .map_err(|e| harness(e.to_string()))?;
        let output = if in_place {
            input
        } else {
            let buffer = buffers.guarded(device, out_rows * cols * size).map_err(harness)?;
            TensorDesc::contiguous(buffer, GUARD_BYTES, dtype, &[out_rows, cols]).map_err(|e| harness(e.to_string()))?
        };
        outputs.push((device.clone(), output));
        args.push(CollectiveArg { device: device.index() as u32, input, output });
    }
    t.device.backend().collective(op, &args).map_err(|e| (e.kind(), format!("{}: {e}", op.name())))?;
    let parts: Vec<&[f64]> = inputs.iter().map(Vec::as_slice).collect();
    let chunk = out_rows * cols;
    for (rank, (device, output)) in outputs.iter().enumerate() {
        let expected: Vec<f64> = (0..chunk)
            .map(|i| match op {
                CollectiveOp::AllReduceSum => wrapped_sum(dtype, &parts, i),
                CollectiveOp::Broadcast => parts[0][i],
                CollectiveOp::AllGather => parts[i / (rows * cols)][i % (rows * cols)],
                CollectiveOp::ReduceScatterSum => wrapped_sum(dtype, &parts, rank * chunk + i),
            })
            .collect();
        let mut bytes = vec![0u8; chunk * size + 2 * GUARD_BYTES];
        device.read(output.buffer, 0, &mut bytes).map_err(|e| harness(format!("reading rank {rank}: {e}")))?;
        let body = &bytes[GUARD_BYTES..GUARD_BYTES + chunk * size];
        if let Some(i) = (0..chunk).find(|&i| decode(dtype, &body[i * size..(i + 1) * size]) != expected[i]) {
            let got = decode(dtype, &body[i * size..(i + 1) * size]);
            return Ok(Outcome::fail(format!(
                "{}: rank {rank} (device {}) element {i}: got {got}, expected {}",
                op.name(),
                world[rank],
                expected[i]
            )));
        }
        let guards = bytes[..GUARD_BYTES].iter().chain(&bytes[GUARD_BYTES + chunk * size..]);
        if guards.clone().any(|&b| b != CANARY) {
            return Ok(Outcome::fail(format!("{}: rank {rank} wrote outside its output", op.name())));
        }
    }
    Ok(Outcome::pass())
}

/// A collective that must be refused with `kind` before any work.
fn refused(t: &Target, op: CollectiveOp, kind: ErrorKind, args: Args) -> Outcome {
    let mut buffers = Buffers(Vec::new());
    let made = buffers.guarded(&t.device, 256).and_then(|a| buffers.guarded(&t.device, 256).map(|b| (a, b)));
    let (a, b) = match made {
        Ok(pair) => pair,
        Err(e) => return Outcome::error(e),
    };
    match t.device.backend().collective(op, &args(t.index as u32, a, b)) {
        Ok(()) => Outcome::fail(format!("{}: succeeded; expected a `{kind}` error", op.name())),
        Err(e) if e.kind() == kind => Outcome::pass(),
        Err(e) if e.kind() == ErrorKind::Unsupported => Outcome::with(Status::NotSupported, e.to_string()),
        Err(e) => Outcome::fail(format!("{}: expected `{kind}`, got `{}`: {e}", op.name(), e.kind())),
    }
}

/// Builds the arguments of an error case from the device index and two 256-byte buffers.
type Args = fn(u32, BufferId, BufferId) -> Vec<CollectiveArg>;

const F32: DType = DType::F32;

fn desc(buffer: BufferId, dtype: DType, shape: &[usize]) -> TensorDesc {
    // Shapes here are tiny and of rank ≤ 2: construction cannot fail.
    TensorDesc::contiguous(buffer, GUARD_BYTES, dtype, shape).unwrap_or_else(|e| panic!("{e}"))
}

pub fn cases(t: &Target) -> Vec<Case> {
    let mut cases = Vec::new();
    let count = t.device.backend().probe().device_count;
    for (world_name, world) in worlds(count) {
        let n = world.len();
        for &op in CollectiveOp::ALL {
            for dtype in DType::ALL {
                let sums = matches!(op, CollectiveOp::AllReduceSum | CollectiveOp::ReduceScatterSum);
                if sums && dtype == DType::Bool {
                    continue;
                }
                let dt = short_name(dtype);
                // (sample, tier, rows per rank, columns, in place)
                let mut samples = vec![
                    ("odd".to_string(), Tier::Core, 3 * n, 37, false),
                    ("empty".to_string(), Tier::Core, 0, 5, false),
                    ("large".to_string(), Tier::Full, 64 * n, 4099, false),
                ];
                if matches!(op, CollectiveOp::AllReduceSum | CollectiveOp::Broadcast) {
                    samples.push(("in_place".to_string(), Tier::Core, 2 * n + 1, 33, true));
                }
                for (sample, tier, rows, cols, in_place) in samples {
                    let id = format!("{}/{world_name}/{dt}/{sample}", op.name());
                    let full_id = format!("collective/{id}");
                    let sample = Sample { op, dtype, world: world.clone(), rows, cols, in_place, id: full_id };
                    cases.push(
                        Case::new("collective", id, tier, Box::new(move |t| run_collective(t, &sample)))
                            .after(["load/".to_string(), format!("memory/roundtrip/{dt}")]),
                    );
                }
            }
        }
    }
    let errors: Vec<(&str, CollectiveOp, ErrorKind, Args)> = vec![
        ("no_ranks", CollectiveOp::AllReduceSum, ErrorKind::InvalidArgument, |_, _, _| vec![]),
        ("same_device_twice", CollectiveOp::AllReduceSum, ErrorKind::InvalidArgument, |d, a, b| {
            let arg = CollectiveArg { device: d, input: desc(a, F32, &[4]), output: desc(b, F32, &[4]) };
            vec![arg, arg]
        }),
        ("shape_mismatch", CollectiveOp::AllReduceSum, ErrorKind::ShapeMismatch, |d, a, b| {
            vec![CollectiveArg { device: d, input: desc(a, F32, &[4]), output: desc(b, F32, &[5]) }]
        }),
        ("dtype_mismatch", CollectiveOp::Broadcast, ErrorKind::DtypeMismatch, |d, a, b| {
            vec![CollectiveArg { device: d, input: desc(a, F32, &[4]), output: desc(b, DType::I32, &[4]) }]
        }),
        ("sum_of_bool", CollectiveOp::AllReduceSum, ErrorKind::DtypeMismatch, |d, a, b| {
            vec![CollectiveArg { device: d, input: desc(a, DType::Bool, &[4]), output: desc(b, DType::Bool, &[4]) }]
        }),
        ("not_contiguous", CollectiveOp::AllReduceSum, ErrorKind::InvalidArgument, |d, a, b| {
            let mut input = desc(a, F32, &[2, 2]);
            input.strides[..2].copy_from_slice(&[1, 2]);
            vec![CollectiveArg { device: d, input, output: desc(b, F32, &[2, 2]) }]
        }),
        ("gather_in_place", CollectiveOp::AllGather, ErrorKind::InvalidArgument, |d, a, _| {
            vec![CollectiveArg { device: d, input: desc(a, F32, &[4]), output: desc(a, F32, &[4]) }]
        }),
        ("scatter_output_shape", CollectiveOp::ReduceScatterSum, ErrorKind::ShapeMismatch, |d, a, b| {
            vec![CollectiveArg { device: d, input: desc(a, F32, &[0]), output: desc(b, F32, &[1]) }]
        }),
        ("view_past_buffer", CollectiveOp::AllReduceSum, ErrorKind::InvalidArgument, |d, a, b| {
            vec![CollectiveArg { device: d, input: desc(a, F32, &[1000]), output: desc(b, F32, &[1000]) }]
        }),
        ("device_out_of_range", CollectiveOp::Broadcast, ErrorKind::InvalidArgument, |_, a, b| {
            vec![CollectiveArg { device: 4096, input: desc(a, F32, &[4]), output: desc(b, F32, &[4]) }]
        }),
    ];
    for (name, op, kind, args) in errors {
        cases.push(
            Case::new(
                "collective",
                format!("errors/{name}"),
                Tier::Core,
                Box::new(move |t| refused(t, op, kind, args)),
            )
            .after(["load/".to_string()]),
        );
    }
    cases
}
