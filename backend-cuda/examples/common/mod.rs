//! What the GPU checkers and the GPU benchmark share: the plugin seen through the wire
//! interface (as the core sees it), a reproducible random source and byte conversions.
//! Each example `#[path]`-includes this file; it is not an example of its own.

use genesis_backend_api::abi::PluginModuleRef;
use genesis_backend_api::{BackendError, BufferId, DType, MemoryStats, Op, OpKind, RawOp, TensorDesc};
use half::{bf16, f16};

pub type R<T> = Result<T, BackendError>;

/// One device of a plugin, through the wire interface.
pub struct Dev {
    pub m: PluginModuleRef,
}

impl Dev {
    pub fn alloc(&self, bytes: usize) -> R<BufferId> {
        (self.m.allocate())(0, bytes as u64).into_result().map_err(Into::into)
    }
    pub fn free(&self, b: BufferId) -> R<()> {
        (self.m.free())(0, b).into_result().map_err(Into::into)
    }
    pub fn write(&self, b: BufferId, bytes: &[u8]) -> R<()> {
        self.write_at(b, 0, bytes)
    }
    pub fn write_at(&self, b: BufferId, offset: usize, bytes: &[u8]) -> R<()> {
        (self.m.write())(0, b, offset as u64, bytes.into()).into_result().map_err(Into::into)
    }
    pub fn read(&self, b: BufferId, len: usize) -> R<Vec<u8>> {
        self.read_at(b, 0, len)
    }
    pub fn read_at(&self, b: BufferId, offset: usize, len: usize) -> R<Vec<u8>> {
        let mut out = vec![0u8; len];
        (self.m.read())(0, b, offset as u64, out.as_mut_slice().into()).into_result().map_err(BackendError::from)?;
        Ok(out)
    }
    pub fn exec(&self, op: &Op, ins: &[TensorDesc], outs: &[TensorDesc]) -> R<()> {
        let raw: RawOp = op.encode();
        (self.m.execute())(0, &raw, ins.into(), outs.into()).into_result().map_err(Into::into)
    }
    pub fn sync(&self) -> R<()> {
        (self.m.synchronize())(0).into_result().map_err(Into::into)
    }
    pub fn stats(&self) -> R<MemoryStats> {
        (self.m.memory_stats())(0).into_result().map_err(Into::into)
    }
    pub fn empty_cache(&self) -> R<()> {
        (self.m.empty_cache())(0).into_result().map_err(Into::into)
    }
    pub fn caps(&self) -> R<Vec<(OpKind, DType)>> {
        let caps = (self.m.capabilities())(0).into_result().map_err(BackendError::from)?;
        Ok(caps.iter().filter_map(|c| DType::from_code(c.dtype).ok().map(|d| (c.op, d))).collect())
    }
}

/// Deterministic pseudo-random numbers (xorshift), so a failure reproduces.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Bytes of `n` random elements of `dtype`.
pub fn random_bytes(rng: &mut Rng, dtype: DType, n: usize, positive: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size_in_bytes());
    for _ in 0..n {
        let x = if positive { 0.05 + 3.0 * rng.unit() } else { -3.0 + 6.0 * rng.unit() };
        match dtype {
            DType::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&x.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f64(x).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&bf16::from_f64(x).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&((x * 15.0) as i64).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&((x * 15.0) as i32).to_le_bytes()),
            DType::U8 => out.push(((x + 3.0) * 40.0) as u8),
            DType::Bool => out.push((rng.next() & 1) as u8),
        }
    }
    out
}

/// `xs` as elements of `dtype` (rounded to nearest), little-endian.
pub fn encode(dtype: DType, xs: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(xs.len() * dtype.size_in_bytes());
    for &x in xs {
        match dtype {
            DType::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&x.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f64(x).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&bf16::from_f64(x).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&(x as i64).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(x as i32).to_le_bytes()),
            DType::U8 | DType::Bool => out.push(x as u8),
        }
    }
    out
}

/// Elements of `dtype` as f64.
pub fn values(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    let s = dtype.size_in_bytes();
    bytes
        .chunks_exact(s)
        .map(|c| match dtype {
            DType::F32 => f32::from_le_bytes(c.try_into().unwrap()) as f64,
            DType::F64 => f64::from_le_bytes(c.try_into().unwrap()),
            DType::F16 => f16::from_le_bytes(c.try_into().unwrap()).to_f64(),
            DType::BF16 => bf16::from_le_bytes(c.try_into().unwrap()).to_f64(),
            DType::I64 => i64::from_le_bytes(c.try_into().unwrap()) as f64,
            DType::I32 => i32::from_le_bytes(c.try_into().unwrap()) as f64,
            DType::U8 | DType::Bool => c[0] as f64,
        })
        .collect()
}

/// Load the plugin from its file, as the core does.
pub fn load_plugin(path: &str) -> Result<PluginModuleRef, String> {
    abi_stable::library::lib_header_from_path(std::path::Path::new(path))
        .and_then(|h| h.init_root_module::<PluginModuleRef>())
        .map_err(|e| e.to_string())
}
