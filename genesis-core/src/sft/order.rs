//! [`SftBatches`]: the order in which training visits items (examples or packed rows),
//! epoch after epoch, fixed by a seed and resumable from a saved position.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// Where a run is in its data: the epoch and the index of the next batch within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct DataPosition {
    /// The epoch, from 0.
    pub epoch: u64,
    /// The next batch of the epoch, from 0.
    pub batch: usize,
}

/// Everything needed to resume a [`SftBatches`] exactly: its settings and position. Saved
/// with serde next to a training checkpoint (`serde_json::to_string(&batches.state_dict())`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SftBatchesState {
    /// The shuffling seed.
    pub seed: u64,
    /// Whether epochs are shuffled.
    pub shuffle: bool,
    /// Items per batch.
    pub batch_size: usize,
    /// Whether the last, smaller batch of an epoch is left out.
    pub drop_last: bool,
    /// The number of items (a resumed run must have the same data).
    pub items: usize,
    /// The position of the next batch.
    pub position: DataPosition,
}

/// Batches of items (typically [`SftExample`](super::SftExample)s or
/// [`PackedRow`](super::PackedRow)s) without end, epoch after epoch.
///
/// Epoch `e` visits the items in an order that depends only on `(seed, e, number of items)`
/// (a Fisher-Yates shuffle driven by SplitMix64), or in item order without shuffling. The
/// position is the epoch and the next batch in it, so a run restored with
/// [`seek`](Self::seek) or [`load_state_dict`](Self::load_state_dict) continues with exactly
/// the batches it would have seen.
///
/// ```
/// use genesis::sft::SftBatches;
/// let items = vec!['a', 'b', 'c', 'd', 'e'];
/// let mut batches = SftBatches::new(items.clone(), 2, 7)?;
/// let first = batches.next_indices(); // two item indices
/// let saved = batches.state_dict(); // epoch 0, batch 1
/// let second = batches.next_indices();
/// let mut resumed = SftBatches::new(items, 2, 7)?;
/// resumed.load_state_dict(&saved)?;
/// assert_eq!(resumed.next_indices(), second);
/// assert_eq!(first.len(), 2);
/// # Ok::<(), genesis::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct SftBatches<T> {
    items: Vec<T>,
    state: SftBatchesState,
    /// The order of `state.position.epoch`, computed when first needed.
    order: Option<(u64, Vec<usize>)>,
}

impl<T> SftBatches<T> {
    /// Shuffled batches of `batch_size` items with the given seed, last smaller batch kept.
    /// No items or a zero batch size is an error.
    pub fn new(items: Vec<T>, batch_size: usize, seed: u64) -> Result<Self> {
        if items.is_empty() {
            return Err(Error::invalid("SftBatches: no items"));
        }
        if batch_size == 0 {
            return Err(Error::invalid("SftBatches: batch_size must be > 0"));
        }
        let state = SftBatchesState {
            seed,
            shuffle: true,
            batch_size,
            drop_last: false,
            items: items.len(),
            position: DataPosition::default(),
        };
        Ok(SftBatches { items, state, order: None })
    }

    /// Shuffle each epoch (the default) or keep item order.
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.state.shuffle = shuffle;
        self.order = None;
        self
    }

    /// Leave out the last batch of an epoch when it is smaller than the batch size. An error
    /// when that leaves no batch at all.
    pub fn drop_last(mut self, drop_last: bool) -> Result<Self> {
        self.state.drop_last = drop_last;
        if self.batches_per_epoch() == 0 {
            return Err(Error::invalid(format!(
                "SftBatches: {} items make no full batch of {}",
                self.items.len(),
                self.state.batch_size
            )));
        }
        Ok(self)
    }

    /// The items.
    pub fn items(&self) -> &[T] {
        &self.items
    }

    /// The number of batches in an epoch.
    pub fn batches_per_epoch(&self) -> usize {
        let (n, b) = (self.items.len(), self.state.batch_size);
        if self.state.drop_last {
            n / b
        } else {
            n.div_ceil(b)
        }
    }

    /// The position of the next batch.
    pub fn position(&self) -> DataPosition {
        self.state.position
    }

    /// Moves to `position`; an error when its batch is outside the epoch.
    pub fn seek(&mut self, position: DataPosition) -> Result<()> {
        if position.batch >= self.batches_per_epoch() {
            return Err(Error::invalid(format!(
                "SftBatches: batch {} is outside an epoch of {} batches",
                position.batch,
                self.batches_per_epoch()
            )));
        }
        self.state.position = position;
        Ok(())
    }

    /// The settings and position, to save.
    pub fn state_dict(&self) -> SftBatchesState {
        self.state
    }

    /// Restores a saved state. Its settings must match these (the same seed, shuffling,
    /// batch size, `drop_last` and number of items), else resuming would not give the same
    /// batches and this is an error naming the differences.
    pub fn load_state_dict(&mut self, state: &SftBatchesState) -> Result<()> {
        let mine = self.state;
        let mut diffs = Vec::new();
        let mut check = |name: &str, saved: String, here: String| {
            if saved != here {
                diffs.push(format!("{name} {saved} (saved) vs {here}"));
            }
        };
        check("seed", state.seed.to_string(), mine.seed.to_string());
        check("shuffle", state.shuffle.to_string(), mine.shuffle.to_string());
        check("batch_size", state.batch_size.to_string(), mine.batch_size.to_string());
        check("drop_last", state.drop_last.to_string(), mine.drop_last.to_string());
        check("items", state.items.to_string(), mine.items.to_string());
        if !diffs.is_empty() {
            return Err(Error::invalid(format!("SftBatches: cannot resume: {}", diffs.join(", "))));
        }
        self.seek(state.position)
    }

    /// The order in which epoch `epoch` visits the items (a permutation of their indices).
    pub fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let n = self.items.len();
        let mut order: Vec<usize> = (0..n).collect();
        if self.state.shuffle {
            let mut rng = SplitMix64(self.state.seed ^ splitmix(epoch.wrapping_add(0x5EED)));
            for i in (1..n).rev() {
                let j = (rng.next() % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
        }
        order
    }

    /// The item indices of the next batch; moves the position on (to the next epoch after
    /// its last batch).
    pub fn next_indices(&mut self) -> Vec<usize> {
        let DataPosition { epoch, batch } = self.state.position;
        if self.order.as_ref().is_none_or(|(e, _)| *e != epoch) {
            self.order = Some((epoch, self.epoch_order(epoch)));
        }
        let order = self.order.as_ref().map(|(_, o)| o.as_slice()).unwrap_or_default();
        let b = self.state.batch_size;
        let indices = order[batch * b..((batch + 1) * b).min(order.len())].to_vec();
        self.state.position = if batch + 1 >= self.batches_per_epoch() {
            DataPosition { epoch: epoch + 1, batch: 0 }
        } else {
            DataPosition { epoch, batch: batch + 1 }
        };
        indices
    }

    /// The items of the next batch; moves the position on.
    pub fn next_batch(&mut self) -> Vec<&T> {
        let indices = self.next_indices();
        indices.into_iter().map(|i| &self.items[i]).collect()
    }
}

/// SplitMix64 (Steele, Lea and Flood): a small, fast generator whose stream is fixed by the
/// seed on every platform.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix(self.0)
    }
}

/// SplitMix64's output function.
fn splitmix(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
