//! Samplers: the order in which a [`DataLoader`](super::DataLoader) visits a dataset's items,
//! and [`DistributedSampler`], which gives each of several processes its own share of them.

use super::dataset::randperm;
use crate::error::{Error, Result};
use crate::random::Generator;
use std::sync::atomic::{AtomicU64, Ordering};

/// The order of one epoch's items (`torch.utils.data.Sampler`). A
/// [`DataLoader`](super::DataLoader) given a sampler asks it for a fresh order at the start of
/// each epoch, so a sampler that changes between epochs (as [`DistributedSampler::set_epoch`]
/// does) is seen by the next [`iter`](super::DataLoader::iter). Shared with the loader through
/// an `Arc`, hence `Send + Sync`.
pub trait Sampler: Send + Sync {
    /// The dataset indices of one epoch, in the order they are to be loaded. Its length should
    /// be [`len`](Sampler::len).
    fn indices(&self) -> Result<Vec<usize>>;

    /// The number of indices in an epoch.
    fn len(&self) -> usize;

    /// True when an epoch has no indices.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One replica's share of a dataset (`torch.utils.data.distributed.DistributedSampler`), for
/// data-parallel training where each of `num_replicas` processes loads different items.
///
/// Every replica gets the same number of indices, [`len`](DistributedSampler::len), so that
/// collective operations stay in step: without `drop_last` the order is padded with indices
/// from its start (some items are seen twice in an epoch); with `drop_last` its tail is
/// dropped (some items are not seen). Replica `rank` takes every `num_replicas`-th index of
/// the padded or truncated order, starting at position `rank`.
///
/// With shuffling (the default) the order is a permutation drawn from a [`Generator`] seeded
/// with `seed + epoch`: every replica must use the same seed and call
/// [`set_epoch`](DistributedSampler::set_epoch) with the same epoch so they shuffle alike and
/// their shares do not overlap. The permutation is Genesis's own (see
/// [`randperm`](super::randperm)), not the one PyTorch draws for the same seed; the padding,
/// dropping and striding are PyTorch's.
///
/// ```
/// use genesis::data::{DistributedSampler, Sampler};
/// // 10 items over 4 replicas, in order: each gets 3, the last two wrap to the start.
/// let sampler = DistributedSampler::new(10, 4, 2)?.shuffle(false);
/// assert_eq!(sampler.len(), 3);
/// assert_eq!(sampler.indices()?, vec![2, 6, 0]);
/// # Ok::<(), genesis::Error>(())
/// ```
#[derive(Debug)]
pub struct DistributedSampler {
    len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    // Atomic so that the epoch can be set through the `Arc` the DataLoader shares.
    epoch: AtomicU64,
}

impl DistributedSampler {
    /// Replica `rank`'s share of a dataset of `len` items split over `num_replicas` replicas,
    /// shuffled with seed 0, without dropping: an error unless `rank < num_replicas`.
    pub fn new(len: usize, num_replicas: usize, rank: usize) -> Result<DistributedSampler> {
        if num_replicas == 0 {
            return Err(Error::invalid("DistributedSampler: num_replicas must be > 0"));
        }
        if rank >= num_replicas {
            return Err(Error::invalid(format!(
                "DistributedSampler: invalid rank {rank}, rank should be in the interval [0, {}]",
                num_replicas - 1
            )));
        }
        Ok(DistributedSampler {
            len,
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
            epoch: AtomicU64::new(0),
        })
    }

    /// Shuffle the order every epoch (default true); without, the order is `0..len`.
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// The seed of the shuffle (default 0); every replica must use the same.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Drop the tail of the order that does not split evenly over the replicas, instead of
    /// padding it with indices from the start (default false).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Set the epoch, which seeds the shuffle together with the seed: call it before each
    /// epoch on every replica, or every epoch has the same order.
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    /// The current epoch (0 until [`set_epoch`](DistributedSampler::set_epoch)).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// The number of replicas.
    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    /// This replica's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The indices of an epoch over all replicas: [`len`](DistributedSampler::len) times
    /// `num_replicas`.
    pub fn total_size(&self) -> usize {
        self.num_samples() * self.num_replicas
    }

    fn num_samples(&self) -> usize {
        if self.drop_last {
            // PyTorch's ceil((len - r) / r) when len % r != 0, else len / r: both are
            // floor(len / r) (for len < r, ceil of a value in (-1, 0) is 0).
            self.len / self.num_replicas
        } else {
            self.len.div_ceil(self.num_replicas)
        }
    }
}

impl Sampler for DistributedSampler {
    /// This replica's indices for the current epoch.
    fn indices(&self) -> Result<Vec<usize>> {
        let mut order: Vec<usize> = if self.shuffle {
            randperm(self.len, &Generator::new(self.seed.wrapping_add(self.epoch())))?
        } else {
            (0..self.len).collect()
        };
        let total = self.total_size();
        if order.len() < total {
            // Pad by repeating the order from its start, whole copies first when the padding is
            // longer than the order (a dataset smaller than the number of replicas). The
            // padding is less than num_replicas, and order is non-empty here: an empty order
            // has total 0.
            let head = order.clone();
            order.extend(head.iter().copied().cycle().take(total - head.len()));
        } else {
            order.truncate(total);
        }
        Ok(order.into_iter().skip(self.rank).step_by(self.num_replicas).collect())
    }

    /// PyTorch's `num_samples`: the same for every rank.
    fn len(&self) -> usize {
        self.num_samples()
    }
}
