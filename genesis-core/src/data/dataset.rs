//! Datasets, batching of items, and random splits.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::ops::shape_err;
use crate::random::Generator;
use crate::tensor::Tensor;
use genesis_backend_api::DType;
use std::sync::Arc;

/// A collection of items addressed by index; an item is a tuple of tensors (for example
/// `[input, label]`). Shared between worker threads, hence `Send + Sync`.
pub trait Dataset: Send + Sync {
    /// The number of items.
    fn len(&self) -> usize;

    /// True when there are no items.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Item `index` (`index < len()`; otherwise an error).
    fn get(&self, index: usize) -> Result<Vec<Tensor>>;

    /// The items at `indices`, batched: each field stacked along a new first dim. The default
    /// gets every item and [`collate`]s them; datasets that can gather a batch at once
    /// override it.
    fn get_batch(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        collate(indices.iter().map(|&i| self.get(i)).collect::<Result<Vec<_>>>()?)
    }
}

impl<D: Dataset + ?Sized> Dataset for Arc<D> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        (**self).get(index)
    }
    fn get_batch(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        (**self).get_batch(indices)
    }
}

/// Stack items field by field into a batch. Every item must have the same number of fields,
/// and each field the same shape and dtype in every item; otherwise an error names the item.
pub fn collate(items: Vec<Vec<Tensor>>) -> Result<Vec<Tensor>> {
    let first = items.first().ok_or_else(|| Error::invalid("collate: no items to batch"))?;
    let fields = first.len();
    for (i, item) in items.iter().enumerate() {
        if item.len() != fields {
            return Err(Error::invalid(format!(
                "collate: item {i} of the batch has {} fields, item 0 has {fields}",
                item.len()
            )));
        }
        for (f, (t, t0)) in item.iter().zip(first).enumerate() {
            if t.shape() != t0.shape() || t.dtype() != t0.dtype() {
                return Err(shape_err(format!(
                    "collate: field {f} of item {i} in the batch is {:?} {}, but item 0 has {:?} {}; items of \
                         one batch must match (pad them, or batch them yourself)",
                    t.shape(),
                    t.dtype(),
                    t0.shape(),
                    t0.dtype()
                )));
            }
        }
    }
    (0..fields)
        .map(|f| {
            let column: Vec<Tensor> = items.iter().map(|item| item[f].clone()).collect();
            crate::autograd::no_grad(|| Tensor::stack(&column, 0))
        })
        .collect()
}

/// Tensors that share their first dimension; item `i` is `[t[i] for t in tensors]`
/// (`torch.utils.data.TensorDataset`).
#[derive(Clone, Debug)]
pub struct TensorDataset {
    tensors: Vec<Tensor>,
    len: usize,
}

impl TensorDataset {
    /// A dataset over `tensors`, which must all have the same size in dim 0.
    pub fn new(tensors: Vec<Tensor>) -> Result<TensorDataset> {
        let first = tensors.first().ok_or_else(|| Error::invalid("TensorDataset: no tensors given"))?;
        let len = *first.shape().first().ok_or_else(|| Error::invalid("TensorDataset: tensor 0 is 0-dimensional"))?;
        for (k, t) in tensors.iter().enumerate() {
            if t.shape().first() != Some(&len) {
                return Err(shape_err(format!(
                    "TensorDataset: tensor {k} has shape {:?}, its first dim must be {len} as tensor 0's",
                    t.shape()
                )));
            }
        }
        Ok(TensorDataset { tensors, len })
    }

    /// The tensors.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }
}

fn out_of_range(index: usize, len: usize) -> Error {
    Error::invalid(format!("dataset index {index} is out of range for {len} items"))
}

impl Dataset for TensorDataset {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        if index >= self.len {
            return Err(out_of_range(index, self.len));
        }
        self.tensors.iter().map(|t| t.select(0, index as isize)).collect()
    }

    /// One gather per tensor instead of one view per item.
    fn get_batch(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        if let Some(&i) = indices.iter().find(|&&i| i >= self.len) {
            return Err(out_of_range(i, self.len));
        }
        let Some(first) = self.tensors.first() else { return Ok(Vec::new()) };
        let idx: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
        let idx = Tensor::from_vec(idx, &[indices.len()], first.device())?;
        crate::autograd::no_grad(|| self.tensors.iter().map(|t| t.index_select(0, &idx.to(t.device())?)).collect())
    }
}

/// The items of `dataset` at `indices`, as a dataset of its own.
#[derive(Clone)]
pub struct Subset {
    dataset: Arc<dyn Dataset>,
    indices: Vec<usize>,
}

impl Subset {
    /// The items of `dataset` at `indices` (each checked to be in range).
    pub fn new(dataset: Arc<dyn Dataset>, indices: Vec<usize>) -> Result<Subset> {
        let n = dataset.len();
        if let Some(&i) = indices.iter().find(|&&i| i >= n) {
            return Err(out_of_range(i, n));
        }
        Ok(Subset { dataset, indices })
    }

    /// The indices into the underlying dataset.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }
}

impl Dataset for Subset {
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        let i = *self.indices.get(index).ok_or_else(|| out_of_range(index, self.indices.len()))?;
        self.dataset.get(i)
    }
    fn get_batch(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        let mapped = indices
            .iter()
            .map(|&k| self.indices.get(k).copied().ok_or_else(|| out_of_range(k, self.indices.len())))
            .collect::<Result<Vec<usize>>>()?;
        self.dataset.get_batch(&mapped)
    }
}

/// A random permutation of `0..n` drawn from `generator` (random keys, sorted), so a seed
/// gives the same permutation on every machine.
pub fn randperm(n: usize, generator: &Generator) -> Result<Vec<usize>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let keys = generator.uniform(&[n], 0.0, 1.0, DType::F64, &Device::cpu()?)?.to_vec::<f64>()?;
    let mut order: Vec<usize> = (0..n).collect();
    // Ties (vanishingly rare with f64 keys) keep index order: sort_by is stable.
    order.sort_by(|&a, &b| keys[a].total_cmp(&keys[b]));
    Ok(order)
}

/// Split `dataset` into non-overlapping random subsets of the given `lengths`, which must add
/// up to its length (`torch.utils.data.random_split`).
pub fn random_split(dataset: Arc<dyn Dataset>, lengths: &[usize], generator: &Generator) -> Result<Vec<Subset>> {
    let total: usize = lengths.iter().sum();
    if total != dataset.len() {
        return Err(Error::invalid(format!(
            "random_split: lengths {lengths:?} add up to {total}, the dataset has {} items",
            dataset.len()
        )));
    }
    let perm = randperm(total, generator)?;
    let mut start = 0;
    lengths
        .iter()
        .map(|&n| {
            let s = Subset::new(dataset.clone(), perm[start..start + n].to_vec());
            start += n;
            s
        })
        .collect()
}
