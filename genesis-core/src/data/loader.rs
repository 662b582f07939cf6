//! The data loader: batches in order, shuffled or in a [`Sampler`]'s order, built on the
//! calling thread or by worker threads that stay a few batches ahead.

use super::dataset::{randperm, Dataset};
use super::sampler::Sampler;
use crate::error::{Error, Result};
use crate::random::Generator;
use crate::tensor::Tensor;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Batches from a [`Dataset`] (`torch.utils.data.DataLoader`). Each call to
/// [`iter`](DataLoader::iter) is one epoch; with shuffling, each epoch draws a new
/// permutation from the loader's generator, so a seeded generator gives the same sequence
/// of epochs on every run, whatever the number of workers. With a [`Sampler`], each epoch
/// takes its order from the sampler instead.
#[derive(Clone)]
pub struct DataLoader {
    dataset: Arc<dyn Dataset>,
    batch_size: usize,
    shuffle: Option<Generator>,
    sampler: Option<Arc<dyn Sampler>>,
    drop_last: bool,
    num_workers: usize,
    prefetch: usize,
}

impl DataLoader {
    /// Batches of `batch_size` items in dataset order, built on the calling thread.
    pub fn new(dataset: Arc<dyn Dataset>, batch_size: usize) -> Result<DataLoader> {
        if batch_size == 0 {
            return Err(Error::invalid("DataLoader: batch_size must be > 0"));
        }
        Ok(DataLoader {
            dataset,
            batch_size,
            shuffle: None,
            sampler: None,
            drop_last: false,
            num_workers: 0,
            prefetch: 2,
        })
    }

    /// Shuffle every epoch with `generator` (give it a seed for reproducible runs).
    pub fn shuffle(mut self, generator: Generator) -> Self {
        self.shuffle = Some(generator);
        self
    }

    /// Take each epoch's order from `sampler` (for example a
    /// [`DistributedSampler`](super::DistributedSampler)), asked afresh at every
    /// [`iter`](DataLoader::iter). As in PyTorch, a sampler excludes
    /// [`shuffle`](DataLoader::shuffle): with both, `iter` yields an error.
    pub fn sampler(mut self, sampler: Arc<dyn Sampler>) -> Self {
        self.sampler = Some(sampler);
        self
    }

    /// Drop the last batch when it is smaller than `batch_size`.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Build batches on `n` worker threads (0: on the calling thread).
    pub fn num_workers(mut self, n: usize) -> Self {
        self.num_workers = n;
        self
    }

    /// How many finished batches each worker may hold ahead of use (at least 1; default 2).
    pub fn prefetch(mut self, per_worker: usize) -> Self {
        self.prefetch = per_worker.max(1);
        self
    }

    /// The number of batches in an epoch (of the sampler's length, when there is one).
    pub fn len(&self) -> usize {
        match &self.sampler {
            Some(s) => self.batches_of(s.len()),
            None => self.batches_of(self.dataset.len()),
        }
    }

    fn batches_of(&self, items: usize) -> usize {
        if self.drop_last {
            items / self.batch_size
        } else {
            items.div_ceil(self.batch_size)
        }
    }

    /// True when an epoch has no batches.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<dyn Dataset> {
        &self.dataset
    }

    /// The order of one epoch's items: the sampler's (checked to be in range), a permutation,
    /// or `0..len`.
    fn order(&self) -> Result<Vec<usize>> {
        let n = self.dataset.len();
        match (&self.sampler, &self.shuffle) {
            (Some(_), Some(_)) => Err(Error::invalid("DataLoader: sampler option is mutually exclusive with shuffle")),
            (Some(s), None) => {
                let order = s.indices()?;
                // Checked here, not left to the dataset: a user's Dataset may index without
                // checking, and a bad sampler should be an error naming the sampler.
                if let Some(&i) = order.iter().find(|&&i| i >= n) {
                    return Err(Error::invalid(format!(
                        "DataLoader: the sampler gave index {i}, out of range for a dataset of {n} items"
                    )));
                }
                Ok(order)
            }
            (None, Some(g)) => randperm(n, g),
            (None, None) => Ok((0..n).collect()),
        }
    }

    /// One epoch of batches: each a `Vec` with one batched tensor per item field. An order
    /// that cannot be made (a sampler together with shuffling, or a sampler's index out of
    /// range) is the epoch's first and only item, an error.
    pub fn iter(&self) -> Batches {
        let order = match self.order() {
            Ok(o) => o,
            Err(e) => return Batches { state: State::Failed(Some(e)) },
        };
        // Counted from the order itself, so a sampler whose epoch is not of its stated length
        // still has every batch of what it gave.
        let count = self.batches_of(order.len());
        let batches: Vec<Vec<usize>> = order.chunks(self.batch_size).take(count).map(<[usize]>::to_vec).collect();
        let batches = Arc::new(batches);
        if self.num_workers == 0 {
            return Batches { state: State::Inline { dataset: self.dataset.clone(), batches, next: 0 } };
        }
        let workers = self.num_workers.min(batches.len().max(1));
        let (mut receivers, mut handles) = (Vec::new(), Vec::new());
        for w in 0..workers {
            let (tx, rx) = sync_channel::<Result<Vec<Tensor>>>(self.prefetch);
            let (dataset, batches) = (self.dataset.clone(), batches.clone());
            // Worker w builds batches w, w + workers, ...; the consumer reads the workers in
            // turn, so batches arrive in order whatever the timing.
            handles.push(std::thread::spawn(move || {
                for b in (w..batches.len()).step_by(workers) {
                    if tx.send(dataset.get_batch(&batches[b])).is_err() {
                        break; // the consumer went away
                    }
                }
            }));
            receivers.push(rx);
        }
        Batches { state: State::Workers { receivers, handles, total: batches.len(), next: 0 } }
    }
}

impl IntoIterator for &DataLoader {
    type Item = Result<Vec<Tensor>>;
    type IntoIter = Batches;
    fn into_iter(self) -> Batches {
        self.iter()
    }
}

enum State {
    Inline { dataset: Arc<dyn Dataset>, batches: Arc<Vec<Vec<usize>>>, next: usize },
    Workers { receivers: Vec<Receiver<Result<Vec<Tensor>>>>, handles: Vec<JoinHandle<()>>, total: usize, next: usize },
    Failed(Option<Error>),
}

/// The batches of one epoch (from [`DataLoader::iter`]).
pub struct Batches {
    state: State,
}

impl Iterator for Batches {
    type Item = Result<Vec<Tensor>>;

    fn next(&mut self) -> Option<Result<Vec<Tensor>>> {
        match &mut self.state {
            State::Failed(e) => e.take().map(Err),
            State::Inline { dataset, batches, next } => {
                let b = batches.get(*next)?;
                *next += 1;
                Some(dataset.get_batch(b))
            }
            State::Workers { receivers, total, next, .. } => {
                if *next >= *total {
                    return None;
                }
                let w = *next % receivers.len();
                *next += 1;
                Some(receivers[w].recv().unwrap_or_else(|_| {
                    Err(Error::new(
                        crate::error::ErrorKind::Internal,
                        format!("DataLoader: worker {w} stopped before delivering its batch (it panicked)"),
                    ))
                }))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = match &self.state {
            State::Inline { batches, next, .. } => batches.len() - next,
            State::Workers { total, next, .. } => total - next,
            State::Failed(e) => e.is_some() as usize,
        };
        (left, Some(left))
    }
}

impl Drop for Batches {
    fn drop(&mut self) {
        if let State::Workers { receivers, handles, .. } = &mut self.state {
            // Closing the channels makes blocked workers' sends fail, so they return.
            receivers.clear();
            for h in handles.drain(..) {
                let _ = h.join();
            }
        }
    }
}
