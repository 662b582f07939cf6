//! The data loader: batches in order or shuffled, built on the calling thread or by worker
//! threads that stay a few batches ahead.

use super::dataset::{randperm, Dataset};
use crate::error::{Error, Result};
use crate::random::Generator;
use crate::tensor::Tensor;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Batches from a [`Dataset`] (`torch.utils.data.DataLoader`). Each call to
/// [`iter`](DataLoader::iter) is one epoch; with shuffling, each epoch draws a new
/// permutation from the loader's generator, so a seeded generator gives the same sequence
/// of epochs on every run, whatever the number of workers.
#[derive(Clone)]
pub struct DataLoader {
    dataset: Arc<dyn Dataset>,
    batch_size: usize,
    shuffle: Option<Generator>,
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
        Ok(DataLoader { dataset, batch_size, shuffle: None, drop_last: false, num_workers: 0, prefetch: 2 })
    }

    /// Shuffle every epoch with `generator` (give it a seed for reproducible runs).
    pub fn shuffle(mut self, generator: Generator) -> Self {
        self.shuffle = Some(generator);
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

    /// The number of batches in an epoch.
    pub fn len(&self) -> usize {
        let n = self.dataset.len();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
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

    /// One epoch of batches: each a `Vec` with one batched tensor per item field.
    pub fn iter(&self) -> Batches {
        let order = match &self.shuffle {
            Some(g) => match randperm(self.dataset.len(), g) {
                Ok(p) => p,
                Err(e) => return Batches { state: State::Failed(Some(e)) },
            },
            None => (0..self.dataset.len()).collect(),
        };
        let batches: Vec<Vec<usize>> = order.chunks(self.batch_size).take(self.len()).map(<[usize]>::to_vec).collect();
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
