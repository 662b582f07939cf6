//! The one error type that crosses the plugin boundary.

use abi_stable::std_types::RString;
use abi_stable::StableAbi;
use std::fmt;

/// What went wrong, as a closed set of kinds the core can act on.
///
/// On the wire this is a `u32`; a code this host does not know reads as [`ErrorKind::Internal`]
/// so that a newer plugin can never produce an invalid Rust enum.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// An argument is malformed: bad index, negative size, overlapping output, ...
    InvalidArgument = 1,
    /// Shapes of inputs and outputs do not fit the operation.
    ShapeMismatch = 2,
    /// Dtypes of inputs and outputs do not fit the operation.
    DtypeMismatch = 3,
    /// The backend does not implement this operation, dtype or function.
    Unsupported = 4,
    /// An allocation failed even after the backend released its cached memory.
    OutOfMemory = 5,
    /// The device or a library it needs is not there.
    DeviceUnavailable = 6,
    /// A bug or an unexpected failure inside the backend (a caught panic lands here).
    Internal = 7,
    /// The plugin file could not be loaded or is not a compatible Genesis plugin.
    LoadFailed = 8,
    /// Communication with other processes failed: a peer exited or stopped answering, a
    /// rendezvous timed out, or the ranks disagree (since 1.3; older hosts read it as
    /// `Internal`).
    Communication = 9,
}

impl ErrorKind {
    /// The kind for a wire code; unknown codes become `Internal`.
    pub fn from_code(code: u32) -> ErrorKind {
        match code {
            1 => ErrorKind::InvalidArgument,
            2 => ErrorKind::ShapeMismatch,
            3 => ErrorKind::DtypeMismatch,
            4 => ErrorKind::Unsupported,
            5 => ErrorKind::OutOfMemory,
            6 => ErrorKind::DeviceUnavailable,
            8 => ErrorKind::LoadFailed,
            9 => ErrorKind::Communication,
            _ => ErrorKind::Internal,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::ShapeMismatch => "shape mismatch",
            ErrorKind::DtypeMismatch => "dtype mismatch",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::OutOfMemory => "out of memory",
            ErrorKind::DeviceUnavailable => "device unavailable",
            ErrorKind::Internal => "internal error",
            ErrorKind::LoadFailed => "plugin load failed",
            ErrorKind::Communication => "communication failed",
        };
        f.write_str(text)
    }
}

/// An error returned by a backend: a kind and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendError {
    /// What kind of failure this is.
    pub kind: ErrorKind,
    /// A message naming the operation, shapes and reason.
    pub message: String,
}

impl BackendError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        BackendError { kind, message: message.into() }
    }
    /// Shorthand for [`ErrorKind::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    /// Shorthand for [`ErrorKind::Unsupported`].
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }
    /// Shorthand for [`ErrorKind::ShapeMismatch`].
    pub fn shape(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::ShapeMismatch, message)
    }
    /// Shorthand for [`ErrorKind::DtypeMismatch`].
    pub fn dtype(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::DtypeMismatch, message)
    }
    /// Shorthand for [`ErrorKind::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for BackendError {}

/// Result type of every backend call.
pub type Result<T> = std::result::Result<T, BackendError>;

/// The wire form of [`BackendError`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct RawError {
    /// An [`ErrorKind`] code.
    pub kind: u32,
    /// The message.
    pub message: RString,
}

impl From<BackendError> for RawError {
    fn from(e: BackendError) -> Self {
        RawError { kind: e.kind as u32, message: e.message.into() }
    }
}

impl From<RawError> for BackendError {
    fn from(e: RawError) -> Self {
        BackendError { kind: ErrorKind::from_code(e.kind), message: e.message.into_string() }
    }
}
