//! cuBLAS, opened at run time like NVRTC: the handful of entry points the matrix product
//! uses, bound to the device's stream.

use crate::libs::{self, Found};
use genesis_backend_api::{BackendError, DType, Result};
use std::ffi::{c_char, c_int, c_void, CStr};

type Handle = *mut c_void;
type Status = c_int;

/// `cudaDataType` codes (stable across CUDA 11-13).
pub mod data_type {
    /// f32
    pub const R_32F: i32 = 0;
    /// f64
    pub const R_64F: i32 = 1;
    /// f16
    pub const R_16F: i32 = 2;
    /// bf16
    pub const R_16BF: i32 = 14;
}

/// `cublasComputeType_t` codes.
pub mod compute {
    /// f32 accumulation, IEEE.
    pub const F32: i32 = 68;
    /// f64.
    pub const F64: i32 = 70;
    /// f32 through TF32 tensor cores (opt-in).
    pub const F32_FAST_TF32: i32 = 77;
}

/// The cuBLAS data type of `dtype` and the compute type of its products, for matmul and the
/// convolution's products (`what` names the op in the error for a dtype without a product).
/// f32 products run on TF32 tensor cores only when `GENESIS_CUDA_ALLOW_TF32` is set (and not
/// to 0), as PyTorch's `allow_tf32` is opt-in.
pub fn gemm_types(dtype: DType, what: &str) -> Result<(i32, i32)> {
    Ok(match dtype {
        DType::F32 if std::env::var_os("GENESIS_CUDA_ALLOW_TF32").is_some_and(|v| v != "0") => {
            (data_type::R_32F, compute::F32_FAST_TF32)
        }
        DType::F32 => (data_type::R_32F, compute::F32),
        DType::F64 => (data_type::R_64F, compute::F64),
        DType::F16 => (data_type::R_16F, compute::F32),
        DType::BF16 => (data_type::R_16BF, compute::F32),
        other => return Err(BackendError::unsupported(format!("cuda: {what} is not implemented for {other}"))),
    })
}

type GemmStridedBatchedEx = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    i64,
    *const c_void,
    c_int,
    c_int,
    i64,
    *const c_void,
    *mut c_void,
    c_int,
    c_int,
    i64,
    c_int,
    c_int,
    c_int,
) -> Status;

/// A cuBLAS handle on one device's stream.
pub struct Blas {
    found: Found,
    handle: Handle,
    gemm: GemmStridedBatchedEx,
    status_string: Option<unsafe extern "C" fn(Status) -> *const c_char>,
}

// SAFETY: the handle is used under the device's execute path, one call at a time per op;
// cuBLAS handles may move between threads.
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

/// One strided-batched GEMM in cuBLAS's column-major terms.
pub struct Gemm {
    /// `CUBLAS_OP_N` (0) or `CUBLAS_OP_T` (1) for A and B.
    pub trans: (i32, i32),
    /// Rows of op(A) and C, columns of op(B) and C, inner dimension.
    pub m: i32,
    /// See `m`.
    pub n: i32,
    /// See `m`.
    pub k: i32,
    /// Addresses, leading dimensions and batch strides (in elements) of A, B, C.
    pub a: (u64, i32, i64),
    /// See `a`.
    pub b: (u64, i32, i64),
    /// See `a`.
    pub c: (u64, i32, i64),
    /// Number of products.
    pub batch: i32,
    /// `cudaDataType` of all three matrices.
    pub dtype: i32,
    /// `cublasComputeType_t`.
    pub compute: i32,
}

impl Blas {
    /// Open cuBLAS and create a handle on `stream` (the device's context is current).
    pub fn open(stream: *mut c_void) -> Result<Blas> {
        let found = libs::open("cublas", "cublas")?;
        // SAFETY: the types are the documented C signatures of these cuBLAS functions.
        unsafe {
            let create: unsafe extern "C" fn(*mut Handle) -> Status = libs::symbol(&found, "cublasCreate_v2")?;
            let set_stream: unsafe extern "C" fn(Handle, *mut c_void) -> Status =
                libs::symbol(&found, "cublasSetStream_v2")?;
            let gemm: GemmStridedBatchedEx = libs::symbol(&found, "cublasGemmStridedBatchedEx")?;
            let status_string = libs::symbol(&found, "cublasGetStatusString").ok();
            let mut blas = Blas { found, handle: std::ptr::null_mut(), gemm, status_string };
            let mut handle: Handle = std::ptr::null_mut();
            blas.check("cublasCreate", create(&mut handle))?;
            blas.handle = handle;
            blas.check("cublasSetStream", set_stream(handle, stream))?;
            Ok(blas)
        }
    }

    fn check(&self, call: &str, status: Status) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        let text = match self.status_string {
            // SAFETY: cuBLAS returns a static string for any status.
            Some(f) => unsafe { CStr::from_ptr(f(status)) }.to_string_lossy().into_owned(),
            None => format!("status {status}"),
        };
        Err(BackendError::internal(format!("cuda: {call} ({}) failed: {text}", self.found.path)))
    }

    /// Queue one strided-batched product `C = op(A) op(B)` on the stream, with C of `c_dtype`
    /// (`g.dtype`, or f32 from f16/bf16 inputs) and, with `accumulate`, `C += op(A) op(B)`.
    ///
    /// # Safety
    /// The addresses, leading dimensions and strides must describe memory inside live
    /// buffers of the device this handle belongs to.
    pub unsafe fn gemm_into(&self, g: &Gemm, c_dtype: i32, accumulate: bool) -> Result<()> {
        let (one_f, zero_f) = (1.0f32, 0.0f32);
        let (one_d, zero_d) = (1.0f64, 0.0f64);
        let (alpha, beta): (*const c_void, *const c_void) = if g.compute == compute::F64 {
            (&one_d as *const f64 as _, if accumulate { &one_d } else { &zero_d } as *const f64 as _)
        } else {
            (&one_f as *const f32 as _, if accumulate { &one_f } else { &zero_f } as *const f32 as _)
        };
        let status = (self.gemm)(
            self.handle,
            g.trans.0,
            g.trans.1,
            g.m,
            g.n,
            g.k,
            alpha,
            g.a.0 as *const c_void,
            g.dtype,
            g.a.1,
            g.a.2,
            g.b.0 as *const c_void,
            g.dtype,
            g.b.1,
            g.b.2,
            beta,
            g.c.0 as *mut c_void,
            c_dtype,
            g.c.1,
            g.c.2,
            g.batch,
            g.compute,
            -1, // CUBLAS_GEMM_DEFAULT
        );
        self.check("cublasGemmStridedBatchedEx", status)
    }
}
