//! State dicts as safetensors: every Genesis dtype, names kept as they are (so PyTorch and
//! Hugging Face files load with their own names), string metadata in `__metadata__`.

use super::{write_atomically, Metadata, StateDict};
use crate::device::Device;
use crate::error::{Error, ErrorKind, Result};
use crate::tensor::Tensor;
use genesis_backend_api::DType;
use safetensors::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// A tensor's bytes on the host, for the safetensors writer.
struct HostTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &HostTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn to_safetensors_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

fn from_safetensors_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// The tensor's elements in row-major order as little-endian bytes (views are made dense).
pub(crate) fn tensor_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let t = crate::autograd::no_grad(|| t.contiguous())?;
    let esize = t.dtype().size_in_bytes();
    let mut bytes = vec![0u8; t.numel() * esize];
    if !bytes.is_empty() {
        t.device().read(t.storage().buffer, t.layout().offset * esize, &mut bytes)?;
    }
    Ok(bytes)
}

/// A tensor on `device` holding a safetensors view's data (one copy, straight from the view's
/// bytes, which may be a memory-mapped file).
pub(crate) fn tensor_from_view(view: &safetensors::tensor::TensorView<'_>, device: &Device) -> Result<Tensor> {
    let dtype = from_safetensors_dtype(view.dtype()).ok_or_else(|| {
        Error::new(ErrorKind::Unsupported, format!("dtype {:?} is not supported by Genesis", view.dtype()))
    })?;
    tensor_from_bytes(view.data(), dtype, view.shape(), device)
}

/// A tensor on `device` holding `bytes` (little-endian, row-major).
pub(crate) fn tensor_from_bytes(bytes: &[u8], dtype: DType, shape: &[usize], device: &Device) -> Result<Tensor> {
    let t = Tensor::empty(shape, dtype, device)?;
    if bytes.is_empty() {
        return Ok(t);
    }
    if dtype == DType::Bool {
        // Any nonzero byte is true; backends expect exactly 0 or 1.
        let normalized: Vec<u8> = bytes.iter().map(|&b| (b != 0) as u8).collect();
        device.write(t.storage().buffer, 0, &normalized)?;
    } else {
        device.write(t.storage().buffer, 0, bytes)?;
    }
    Ok(t)
}

/// The metadata key holding the CRC-32 of tensor `name`'s data (hex), written by
/// [`to_bytes_with_checksums`] and verified by [`from_bytes`] wherever it is present.
pub const CHECKSUM_PREFIX: &str = "checksum.crc32.";

/// `tensors` and `metadata` as the bytes of a safetensors file.
pub fn to_bytes(tensors: &StateDict, metadata: &Metadata) -> Result<Vec<u8>> {
    serialize(tensors, metadata, false)
}

/// [`to_bytes`] plus a CRC-32 of each tensor's data in the metadata (`checksum.crc32.<name>`),
/// so that [`from_bytes`] finds bytes changed on disk (training checkpoints are written so).
pub fn to_bytes_with_checksums(tensors: &StateDict, metadata: &Metadata) -> Result<Vec<u8>> {
    serialize(tensors, metadata, true)
}

fn serialize(tensors: &StateDict, metadata: &Metadata, checksums: bool) -> Result<Vec<u8>> {
    let host = tensors
        .iter()
        .map(|(name, t)| {
            let bytes = tensor_bytes(t).map_err(|e| e.context(format_args!("saving tensor `{name}`")))?;
            Ok((name.as_str(), HostTensor { dtype: to_safetensors_dtype(t.dtype()), shape: t.shape().to_vec(), bytes }))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut metadata = metadata.clone();
    if checksums {
        for (name, t) in &host {
            metadata.insert(format!("{CHECKSUM_PREFIX}{name}"), format!("{:08x}", crc32fast::hash(&t.bytes)));
        }
    }
    let info: Option<HashMap<String, String>> =
        if metadata.is_empty() { None } else { Some(metadata.into_iter().collect()) };
    safetensors::serialize(host.iter().map(|(n, t)| (*n, t)), info)
        .map_err(|e| Error::invalid(format!("serializing safetensors: {e}")))
}

/// Parse the bytes of a safetensors file into tensors on `device` and the metadata;
/// `origin` (a file name) goes into error messages. A tensor whose data does not match its
/// checksum in the metadata (see [`to_bytes_with_checksums`]) is an error naming it.
pub fn from_bytes(bytes: &[u8], device: &Device, origin: &str) -> Result<(StateDict, Metadata)> {
    parse(bytes, device, origin, true)
}

/// [`from_bytes`] with or without the checksum verification.
pub(crate) fn parse(bytes: &[u8], device: &Device, origin: &str, verify: bool) -> Result<(StateDict, Metadata)> {
    let bad = |why: String| Error::load(format!("{origin}: {why}"));
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| bad(describe_error(&e, bytes.len())))?;
    let st = SafeTensors::deserialize(bytes).map_err(|e| bad(describe_error(&e, bytes.len())))?;
    let checksums = header.metadata().as_ref().filter(|_| verify);
    let mut out = StateDict::new();
    for (name, view) in st.iter() {
        if let Some(expected) = checksums.and_then(|m| m.get(&format!("{CHECKSUM_PREFIX}{name}"))) {
            let actual = format!("{:08x}", crc32fast::hash(view.data()));
            if &actual != expected {
                return Err(bad(format!(
                    "the data of tensor `{name}` does not match its checksum (crc32 {actual}, saved {expected}): the \
                     file was changed or damaged after it was written"
                )));
            }
        }
        let dtype = from_safetensors_dtype(view.dtype()).ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                format!("{origin}: tensor `{name}` has dtype {:?}, which Genesis does not support", view.dtype()),
            )
        })?;
        let t = tensor_from_bytes(view.data(), dtype, view.shape(), device)
            .map_err(|e| e.context(format_args!("{origin}: tensor `{name}`")))?;
        out.insert(name.to_string(), t);
    }
    let metadata = header.metadata().as_ref().map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
    Ok((out, metadata.unwrap_or_default()))
}

/// A reader's explanation of a safetensors parse error.
pub(crate) fn describe_error(e: &safetensors::SafeTensorError, len: usize) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::HeaderTooSmall | E::InvalidHeaderLength => {
            format!("not a safetensors file, or truncated ({len} bytes; the header length does not fit): {e}")
        }
        E::InvalidHeader(_) | E::InvalidHeaderDeserialization(_) | E::HeaderTooLarge => {
            format!("not a safetensors file (its header is not safetensors JSON): {e}")
        }
        E::MetadataIncompleteBuffer | E::InvalidOffset(_) => {
            format!("truncated or corrupt safetensors file (tensor data does not match the header): {e}")
        }
        _ => format!("corrupt safetensors file: {e}"),
    }
}

/// Write `tensors` with `metadata` to `path` as a safetensors file, atomically.
pub fn save(path: impl AsRef<Path>, tensors: &StateDict, metadata: &Metadata) -> Result<()> {
    let path = path.as_ref();
    let bytes = to_bytes(tensors, metadata).map_err(|e| e.context(format_args!("saving {}", path.display())))?;
    write_atomically(path, |f| f.write_all(&bytes))
}

/// Read the safetensors file at `path` into tensors on `device`.
pub fn load(path: impl AsRef<Path>, device: &Device) -> Result<StateDict> {
    load_with_metadata(path, device).map(|(t, _)| t)
}

/// Read the safetensors file at `path` into tensors on `device`, with its metadata.
pub fn load_with_metadata(path: impl AsRef<Path>, device: &Device) -> Result<(StateDict, Metadata)> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::load(format!("reading {}: {e}", path.display())))?;
    from_bytes(&bytes, device, &path.display().to_string())
}
