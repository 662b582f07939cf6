//! The error type of the `genesis` crate.

use genesis_backend_api::BackendError;
pub use genesis_backend_api::ErrorKind;
use std::fmt;

/// Every fallible Genesis call returns this: a kind to match on and a message that names the
/// operation, shapes, dtypes, devices or file involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into() }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// This error with `context` in front of the message (`"add on cpu:0: ..."`).
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// An `InvalidArgument` error (bad user input: a flag, a value out of range, a malformed file).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// A `Communication` error (another process failed or did not answer in time).
    pub(crate) fn communication(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Communication, message)
    }

    pub(crate) fn load(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::LoadFailed, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

impl From<BackendError> for Error {
    fn from(e: BackendError) -> Self {
        Error { kind: e.kind, message: e.message }
    }
}
