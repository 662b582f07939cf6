//! The deferred index check: kernels that read indices first run a check kernel that records
//! the first bad index in its module's `index_fault` word pair; the host reads the words at
//! the next synchronization and reports the op's error then, without waiting per op.

use super::{driver_error, CudaDevice};
use cudarc::driver::result;
use genesis_backend_api::{BackendError, Result};

/// An index bounds check queued on the stream (see `ops::rows::check_indices`): what the
/// error names if the device finds a bad index.
#[derive(Clone)]
pub struct IndexCheck {
    /// Device address of the checking module's `index_fault` word pair.
    pub fault: u64,
    /// The op that uses the indices.
    pub op: &'static str,
    /// What the indices are ("index", "target").
    pub what: &'static str,
    /// The exclusive bound.
    pub bound: usize,
    /// A value allowed besides `[0, bound)` (cross-entropy's ignore_index).
    pub ignore: Option<i64>,
}

/// Checks queued before the host looks at their results without being asked to: a loop that
/// never synchronizes still gets its errors, and a check's number fits the kernel's flag.
const INDEX_CHECKS_KEPT: usize = 1 << 16;

impl CudaDevice {
    /// Queue an index check: `launch` gets the check's number and issues the kernel. The
    /// result is read at the next synchronization ([`CudaDevice::take_index_fault`]).
    pub fn queue_index_check(&self, check: IndexCheck, launch: impl FnOnce(u32) -> Result<()>) -> Result<()> {
        let mut checks = Self::lock(&self.index_checks);
        if checks.len() == INDEX_CHECKS_KEPT {
            // A full list is a synchronization like any other: a fault found here is
            // reported now (naming its op), and the lists start over either way.
            self.wait_locked(&mut checks, "before an index check, the list of pending ones full")?;
        }
        checks.push(check);
        launch(checks.len() as u32)
    }

    /// The distinct fault words of `checks`, in order: the ones a synchronization reads.
    pub(super) fn fault_words(checks: &[IndexCheck]) -> Vec<u64> {
        let mut words: Vec<u64> = checks.iter().map(|c| c.fault).collect();
        words.sort_unstable();
        words.dedup();
        words
    }

    /// After the stream is idle: the first failed index check since the last call, as the
    /// error its op would have returned on the CPU; the fault words are reset and the list
    /// emptied either way. `words` are [`Self::fault_words`] of `checks`, and `staged` holds
    /// the first of them as copied before the synchronization; the others are read here.
    pub(super) fn take_index_fault(checks: &mut Vec<IndexCheck>, words: &[u64], staged: &[[u8; 16]]) -> Result<()> {
        let result = Self::first_index_fault(checks, words, staged);
        checks.clear();
        result
    }

    fn first_index_fault(checks: &[IndexCheck], words: &[u64], staged: &[[u8; 16]]) -> Result<()> {
        if checks.is_empty() {
            return Ok(());
        }
        let mut first: Option<(u64, i64)> = None;
        for (i, &word) in words.iter().enumerate() {
            let mut fault = [0u8; 16];
            match staged.get(i) {
                Some(bytes) => fault = *bytes,
                // SAFETY: 16 bytes of a loaded module's `index_fault`; the stream is idle.
                None => unsafe {
                    result::memcpy_dtoh_sync(&mut fault, word).map_err(|e| driver_error("reading index_fault", e))?;
                },
            }
            let number = u64::from_le_bytes(fault[..8].try_into().unwrap_or_default());
            if number != 0 {
                let value = i64::from_le_bytes(fault[8..].try_into().unwrap_or_default());
                first = Some(first.map_or((number, value), |f| f.min((number, value))));
                // SAFETY: as above.
                unsafe { result::memset_d8_sync(word, 0, 16) }.map_err(|e| driver_error("resetting index_fault", e))?;
            }
        }
        let found = first.and_then(|(number, value)| Some((checks.get(number as usize - 1)?, value)));
        match found {
            Some((c, value)) => {
                let ignored = c.ignore.map_or(String::new(), |i| format!(" and is not ignore_index ({i})"));
                Err(BackendError::invalid(format!(
                    "{}: {} {value} is out of range [0, {}){ignored} (found on the device and reported at the next \
                     synchronization; the op wrote nothing)",
                    c.op, c.what, c.bound
                )))
            }
            None if first.is_some() => Err(BackendError::internal("cuda: an index check failed that was not recorded")),
            None => Ok(()),
        }
    }
}
