//! The backend under test, opened through the core's loader, and the host side of moving
//! tensors in and out of it with guard bytes around every view.

use crate::values::{decode, encode};
use genesis::backend::load_library;
use genesis::Device;
use genesis_backend_api::{
    contiguous_strides, ApiVersion, BackendInfo, BufferId, Capability, DType, DeviceProperties, OpKind, TensorDesc,
};
use std::collections::HashSet;
use std::path::Path;

/// Bytes of guard before and after every view the harness places.
pub const GUARD_BYTES: usize = 64;
/// The byte guard regions are filled with; any other value there after an op is a stray write.
pub const CANARY: u8 = 0xA7;

/// An opened device of the backend under test.
pub struct Target {
    /// The device, opened by `genesis::Device::parse` after the loader found the backend.
    pub device: Device,
    /// What was passed to `--backend` (for reproduction commands).
    pub backend_arg: String,
    /// The device index.
    pub index: usize,
    /// What the plugin says about itself.
    pub info: BackendInfo,
    /// The device's properties.
    pub props: DeviceProperties,
    /// Interface version the plugin was built for.
    pub api: ApiVersion,
    /// Where the plugin came from.
    pub origin: String,
    /// The raw capability list.
    pub capabilities: Vec<Capability>,
    claims: HashSet<(u32, u32)>,
}

impl Target {
    /// Load `backend` (a name the loader can find, or a path to a plugin file) and open device
    /// `index`. The error says what failed.
    pub fn open(backend: &str, index: usize) -> Result<Target, String> {
        let looks_like_path = backend.contains('/') || backend.contains('.') || Path::new(backend).exists();
        let name = if looks_like_path {
            let status = load_library(backend).map_err(|e| format!("loading {backend}: {e}"))?;
            status.name
        } else {
            backend.to_string()
        };
        let device = Device::parse(&format!("{name}:{index}")).map_err(|e| format!("opening {name}:{index}: {e}"))?;
        let info = device.backend().info().map_err(|e| format!("{name}: info: {e}"))?;
        let props = device.properties().map_err(|e| format!("{name}: device_properties: {e}"))?;
        let capabilities = device.capabilities().map_err(|e| format!("{name}: capabilities: {e}"))?;
        let claims = capabilities.iter().map(|c| (c.op.0, c.dtype)).collect();
        Ok(Target {
            api: device.backend().api_version(),
            origin: device.backend().origin().to_string(),
            device,
            backend_arg: backend.to_string(),
            index,
            info,
            props,
            capabilities,
            claims,
        })
    }

    /// Claims outside their op's domain, see [`outside_domains`].
    pub fn claims_outside_domains(&self) -> Vec<String> {
        outside_domains(&self.capabilities)
    }

    /// How far the claims cover the SDK's required set, per float dtype.
    pub fn coverage(&self) -> Vec<crate::required::Coverage> {
        crate::required::coverage(&self.capabilities)
    }

    /// True when the device claims `op` for `dtype`.
    pub fn claims(&self, op: OpKind, dtype: DType) -> bool {
        self.claims.contains(&(op.0, dtype as u32))
    }
}

/// The claims outside their op's published domain (`Op::domain`) or of a kind this interface
/// version does not know, as "name dtype".
pub fn outside_domains(capabilities: &[Capability]) -> Vec<String> {
    let mut outside = Vec::new();
    for c in capabilities {
        let name = c.op.name().map_or_else(|| format!("unknown kind {:#x}", c.op.0), str::to_string);
        let dtype = DType::from_code(c.dtype);
        if !dtype.as_ref().is_ok_and(|&d| genesis_backend_api::sdk::domain::contains(c.op, d)) {
            outside.push(format!("{name} {}", dtype.map_or_else(|_| format!("dtype {}", c.dtype), |d| d.to_string())));
        }
    }
    outside
}

/// How a tensor is laid out in its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Row-major, at the start of the view area.
    Contiguous,
    /// Row-major, starting a few elements into the buffer.
    Offset,
    /// Column-major (all dims reversed): a transposed view.
    Transposed,
    /// Row-major with a gap after every element of the last dim (a strided slice).
    Strided,
    /// The first halves of rows twice as long (as the gate and up halves of one stacked
    /// projection are): contiguous rows with a row stride of twice the last dim.
    HalfRows,
    /// Stride 0 along this dim (inputs only; values must repeat along it).
    Broadcast(usize),
}

impl Layout {
    /// Short name for case ids.
    pub fn name(self) -> String {
        match self {
            Layout::Contiguous => "contig".into(),
            Layout::Offset => "offset".into(),
            Layout::Transposed => "transposed".into(),
            Layout::Strided => "strided".into(),
            Layout::HalfRows => "half_rows".into(),
            Layout::Broadcast(d) => format!("bcast{d}"),
        }
    }

    /// Element strides and element offset for `shape`, and the number of elements the
    /// buffer area must hold.
    pub fn place(self, shape: &[usize]) -> (Vec<isize>, usize, usize) {
        let numel: usize = shape.iter().product();
        match self {
            Layout::Contiguous => (contiguous_strides(shape), 0, numel),
            Layout::Offset => (contiguous_strides(shape), 3, numel + 3),
            Layout::Transposed => {
                let reversed: Vec<usize> = shape.iter().rev().copied().collect();
                let mut strides = contiguous_strides(&reversed);
                strides.reverse();
                (strides, 0, numel)
            }
            Layout::Strided => {
                let mut wide = shape.to_vec();
                if let Some(last) = wide.last_mut() {
                    *last *= 2;
                }
                let mut strides = contiguous_strides(&wide);
                if let Some(last) = strides.last_mut() {
                    *last = 2;
                }
                (strides, 1, numel * 2 + 1)
            }
            Layout::HalfRows => {
                let mut wide = shape.to_vec();
                if let Some(last) = wide.last_mut() {
                    *last *= 2;
                }
                let mut strides = contiguous_strides(&wide);
                if let Some(last) = strides.last_mut() {
                    *last = 1;
                }
                (strides, 0, numel * 2)
            }
            Layout::Broadcast(dim) => {
                let mut base = shape.to_vec();
                if dim < base.len() {
                    base[dim] = 1;
                }
                let mut strides = contiguous_strides(&base);
                if dim < strides.len() {
                    strides[dim] = 0;
                }
                (strides, 0, base.iter().product())
            }
        }
    }
}

/// A host description of one operand: dtype, shape, layout and row-major logical values.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Layout in the buffer.
    pub layout: Layout,
    /// Logical values in row-major order (for outputs: the initial values, or empty for
    /// canary-filled outputs).
    pub values: Vec<f64>,
}

impl Spec {
    /// A contiguous operand.
    pub fn new(dtype: DType, shape: &[usize], values: Vec<f64>) -> Spec {
        Spec { dtype, shape: shape.to_vec(), layout: Layout::Contiguous, values }
    }

    /// An output with no initial values (its bytes start as canaries).
    pub fn out(dtype: DType, shape: &[usize]) -> Spec {
        Spec::new(dtype, shape, Vec::new())
    }

    /// The same operand in another layout.
    pub fn with_layout(mut self, layout: Layout) -> Spec {
        self.layout = layout;
        self
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A buffer the harness placed on the device, with the view it describes.
#[derive(Debug, Clone)]
pub struct Placed {
    /// The descriptor handed to the backend.
    pub desc: TensorDesc,
    /// The buffer's full size in bytes (guards included).
    pub bytes: usize,
    spec_dtype: DType,
}

/// Every buffer of one case; [`Scope::finish`] frees them and reports a failed free.
pub struct Scope<'t> {
    target: &'t Target,
    buffers: Vec<BufferId>,
}

impl<'t> Scope<'t> {
    /// An empty scope on `target`.
    pub fn new(target: &'t Target) -> Scope<'t> {
        Scope { target, buffers: Vec::new() }
    }

    /// Allocate a raw buffer owned by the scope.
    pub fn alloc(&mut self, bytes: usize) -> Result<BufferId, String> {
        let id = self.target.device.allocate(bytes).map_err(|e| format!("allocate({bytes}): {e}"))?;
        self.buffers.push(id);
        Ok(id)
    }

    /// Place `spec`: allocate its buffer with guards, fill everything with canaries, write
    /// its values (if any) at their strided positions.
    pub fn place(&mut self, spec: &Spec) -> Result<Placed, String> {
        let size = spec.dtype.size_in_bytes();
        let (strides, offset_elems, area) = spec.layout.place(&spec.shape);
        let bytes = GUARD_BYTES * 2 + area * size;
        let buffer = self.alloc(bytes)?;
        let offset = GUARD_BYTES + offset_elems * size;
        let desc = TensorDesc::new(buffer, offset, spec.dtype, &spec.shape, &strides)
            .map_err(|e| format!("descriptor for {:?}: {e}", spec.shape))?;
        let mut host = vec![CANARY; bytes];
        if !spec.values.is_empty() {
            for (value, at) in spec.values.iter().zip(element_offsets(&desc)) {
                encode(spec.dtype, *value, &mut host[at..at + size]);
            }
        }
        self.target.device.write(buffer, 0, &host).map_err(|e| format!("write of {bytes} bytes: {e}"))?;
        Ok(Placed { desc, bytes, spec_dtype: spec.dtype })
    }

    /// Read a placed view back: its logical values and the byte positions outside the view
    /// that no longer hold the canary.
    pub fn fetch(&self, placed: &Placed) -> Result<(Vec<f64>, Vec<usize>), String> {
        let mut host = vec![0u8; placed.bytes];
        self.target.device.read(placed.desc.buffer, 0, &mut host).map_err(|e| format!("read: {e}"))?;
        let size = placed.spec_dtype.size_in_bytes();
        let mut inside = vec![false; placed.bytes];
        let mut values = Vec::with_capacity(placed.desc.numel());
        for at in element_offsets(&placed.desc) {
            values.push(decode(placed.spec_dtype, &host[at..at + size]));
            inside[at..at + size].iter_mut().for_each(|b| *b = true);
        }
        let stray = (0..placed.bytes).filter(|&i| !inside[i] && host[i] != CANARY).collect();
        Ok((values, stray))
    }

    /// Free every buffer; the first failed free is the error.
    pub fn finish(mut self) -> Result<(), String> {
        let mut first = Ok(());
        for id in std::mem::take(&mut self.buffers) {
            if let Err(e) = self.target.device.free(id) {
                if first.is_ok() {
                    first = Err(format!("free: {e}"));
                }
            }
        }
        first
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        // Early returns still release memory, so one failing case cannot make later
        // accounting checks fail too.
        for id in std::mem::take(&mut self.buffers) {
            let _ = self.target.device.free(id);
        }
    }
}

/// Byte offsets (within the buffer) of every element of `desc`, row-major.
pub fn element_offsets(desc: &TensorDesc) -> impl Iterator<Item = usize> {
    let size = desc.dtype().map(|d| d.size_in_bytes()).unwrap_or(1) as isize;
    let base = desc.offset_bytes as isize;
    genesis_backend_api::sdk::offsets(&desc.shape(), &desc.strides()).map(move |o| (base + o * size) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use genesis_backend_api::{BinaryOp, Op, UnaryOp};

    #[test]
    fn claims_outside_domains_are_listed() {
        let claim = |op: OpKind, dtype: u32| Capability { op, dtype };
        let caps = [
            claim(OpKind::unary(UnaryOp::Exp), DType::F32 as u32),
            claim(OpKind::unary(UnaryOp::Not), DType::F32 as u32),
            claim(OpKind::binary(BinaryOp::Add), DType::Bool as u32),
            claim(Op::Softmax.kind(), DType::BF16 as u32),
            claim(OpKind(0x5ff), DType::F32 as u32),
            claim(Op::Copy.kind(), 99),
        ];
        assert_eq!(
            outside_domains(&caps),
            ["logical_not float32", "add bool", "unknown kind 0x5ff float32", "copy dtype 99"].map(String::from)
        );
    }
}
