//! Batches of [`SftExample`]s as tensors: right-padded with an attention mask, or packed
//! into fixed-length rows whose examples are kept apart by a block-diagonal causal mask.

use super::encode::{shift_labels, SftExample, IGNORE_INDEX};
use crate::{DType, Device, Error, Result, Tensor};
use std::borrow::Borrow;

/// A right-padded batch; every tensor is `(b, s)` `i64` with `s` the longest example.
///
/// With right padding and causal attention a real token never attends to a pad (pads come
/// after it), so `attention_mask` changes nothing for the real positions of a causal model;
/// it marks which positions are real (for the loss and for models that take it).
#[derive(Debug, Clone)]
pub struct PaddedBatch {
    /// Token ids, pads at the end of each row.
    pub input_ids: Tensor,
    /// Labels aligned with `input_ids` (see [`SftExample`]); [`IGNORE_INDEX`] at pads.
    pub labels: Tensor,
    /// The loss targets of each position's logits: `labels` shifted left by one, the last
    /// position of each row [`IGNORE_INDEX`].
    pub targets: Tensor,
    /// 1 at real tokens, 0 at pads.
    pub attention_mask: Tensor,
}

/// Right-pads `examples` to the longest of them with `pad_id` and builds the batch on
/// `device`. An empty batch or an empty example is an error.
pub fn pad_batch<E: Borrow<SftExample>>(examples: &[E], pad_id: u32, device: &Device) -> Result<PaddedBatch> {
    if examples.is_empty() {
        return Err(Error::invalid("pad_batch: no examples"));
    }
    check_examples(examples)?;
    let (b, s) = (examples.len(), examples.iter().map(|e| e.borrow().len()).max().unwrap_or(0));
    let mut ids = Vec::with_capacity(b * s);
    let mut labels = Vec::with_capacity(b * s);
    let mut targets = Vec::with_capacity(b * s);
    let mut mask = Vec::with_capacity(b * s);
    for e in examples {
        let e = e.borrow();
        let pad = s - e.len();
        ids.extend(e.input_ids.iter().map(|&id| i64::from(id)).chain(std::iter::repeat_n(i64::from(pad_id), pad)));
        let row_labels: Vec<i64> = e.labels.iter().copied().chain(std::iter::repeat_n(IGNORE_INDEX, pad)).collect();
        targets.extend(shift_labels(&row_labels));
        labels.extend(row_labels);
        mask.extend(std::iter::repeat_n(1i64, e.len()).chain(std::iter::repeat_n(0, pad)));
    }
    let shape = [b, s];
    Ok(PaddedBatch {
        input_ids: Tensor::from_vec(ids, &shape, device)?,
        labels: Tensor::from_vec(labels, &shape, device)?,
        targets: Tensor::from_vec(targets, &shape, device)?,
        attention_mask: Tensor::from_vec(mask, &shape, device)?,
    })
}

fn check_examples<E: Borrow<SftExample>>(examples: &[E]) -> Result<()> {
    for (i, e) in examples.iter().enumerate() {
        let e = e.borrow();
        if e.is_empty() || e.labels.len() != e.input_ids.len() {
            return Err(Error::invalid(format!(
                "SFT example {i}: {} ids and {} labels (needs as many labels as ids, at least one)",
                e.input_ids.len(),
                e.labels.len()
            )));
        }
    }
    Ok(())
}

/// One packed row of `max_len` tokens: whole examples one after another, then padding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedRow {
    /// Token ids.
    pub input_ids: Vec<u32>,
    /// Labels aligned with `input_ids`. The first token of each example and the pads are
    /// [`IGNORE_INDEX`], so the shifted targets never ask one example's last token to
    /// predict the next example's first.
    pub labels: Vec<i64>,
    /// Positions that restart at 0 at each example (0 at pads).
    pub position_ids: Vec<i64>,
    /// Which example each token belongs to: 1, 2, ... in row order; 0 marks padding.
    pub segment_ids: Vec<i64>,
}

impl PackedRow {
    /// The number of examples in the row.
    pub fn examples(&self) -> usize {
        self.segment_ids.iter().copied().max().unwrap_or(0) as usize
    }
}

/// Packs `examples` in order into rows of exactly `max_len` tokens: each example goes into
/// the current row if it fits, else it starts a new row (examples are never split, so the
/// order is kept and a row holds whole examples). Rows are right-padded with `pad_id`. An
/// example longer than `max_len` is an error: truncate first (see
/// [`SftEncoder::encode_all`](super::SftEncoder::encode_all)).
pub fn pack_examples<E: Borrow<SftExample>>(examples: &[E], max_len: usize, pad_id: u32) -> Result<Vec<PackedRow>> {
    if max_len == 0 {
        return Err(Error::invalid("pack_examples: max_len must be > 0"));
    }
    check_examples(examples)?;
    let mut rows = Vec::new();
    let mut row = empty_row(max_len);
    for (i, e) in examples.iter().enumerate() {
        let e = e.borrow();
        if e.len() > max_len {
            return Err(Error::invalid(format!(
                "pack_examples: example {i} has {} tokens, more than max_len {max_len} (truncate first)",
                e.len()
            )));
        }
        if row.input_ids.len() + e.len() > max_len {
            rows.push(finish_row(row, max_len, pad_id));
            row = empty_row(max_len);
        }
        let segment = row.segment_ids.last().copied().unwrap_or(0) + 1;
        row.input_ids.extend_from_slice(&e.input_ids);
        row.labels.push(IGNORE_INDEX);
        row.labels.extend_from_slice(&e.labels[1..]);
        row.position_ids.extend(0..e.len() as i64);
        row.segment_ids.extend(std::iter::repeat_n(segment, e.len()));
    }
    if !row.input_ids.is_empty() {
        rows.push(finish_row(row, max_len, pad_id));
    }
    Ok(rows)
}

fn empty_row(max_len: usize) -> PackedRow {
    PackedRow {
        input_ids: Vec::with_capacity(max_len),
        labels: Vec::with_capacity(max_len),
        position_ids: Vec::with_capacity(max_len),
        segment_ids: Vec::with_capacity(max_len),
    }
}

fn finish_row(mut row: PackedRow, max_len: usize, pad_id: u32) -> PackedRow {
    let pad = max_len - row.input_ids.len();
    row.input_ids.extend(std::iter::repeat_n(pad_id, pad));
    row.labels.extend(std::iter::repeat_n(IGNORE_INDEX, pad));
    row.position_ids.extend(std::iter::repeat_n(0, pad));
    row.segment_ids.extend(std::iter::repeat_n(0, pad));
    row
}

/// A batch of packed rows; the `(b, s)` tensors are `i64`.
#[derive(Debug, Clone)]
pub struct PackedBatch {
    /// Token ids.
    pub input_ids: Tensor,
    /// Labels aligned with `input_ids` (see [`PackedRow::labels`]).
    pub labels: Tensor,
    /// The loss targets of each position's logits: `labels` shifted left by one within the
    /// row, the last position [`IGNORE_INDEX`].
    pub targets: Tensor,
    /// Positions restarting at 0 at each example: the rotary positions to use.
    pub position_ids: Tensor,
    /// Example of each token (1, 2, ...; 0 at pads).
    pub segment_ids: Tensor,
    /// `(b, 1, s, s)` bool, true where a query may attend to a key: see
    /// [`block_diagonal_mask`]. Resetting positions alone does not keep packed examples apart.
    pub attention_mask: Tensor,
}

/// Stacks packed rows into a batch on `device`, with the block-diagonal attention mask.
/// All rows must have the same length.
pub fn packed_batch<R: Borrow<PackedRow>>(rows: &[R], device: &Device) -> Result<PackedBatch> {
    let Some(first) = rows.first() else {
        return Err(Error::invalid("packed_batch: no rows"));
    };
    let s = first.borrow().input_ids.len();
    let b = rows.len();
    let (mut ids, mut labels, mut targets) = (Vec::new(), Vec::new(), Vec::new());
    let (mut positions, mut segments) = (Vec::new(), Vec::new());
    for (i, row) in rows.iter().enumerate() {
        let row = row.borrow();
        let lens = [row.labels.len(), row.position_ids.len(), row.segment_ids.len()];
        if row.input_ids.len() != s || lens.iter().any(|&n| n != s) {
            return Err(Error::invalid(format!(
                "packed_batch: row {i} has {} ids, {} labels, {} positions, {} segments; row 0 has {s} tokens",
                row.input_ids.len(),
                lens[0],
                lens[1],
                lens[2]
            )));
        }
        ids.extend(row.input_ids.iter().map(|&id| i64::from(id)));
        labels.extend_from_slice(&row.labels);
        targets.extend(shift_labels(&row.labels));
        positions.extend_from_slice(&row.position_ids);
        segments.extend_from_slice(&row.segment_ids);
    }
    let shape = [b, s];
    let segment_ids = Tensor::from_vec(segments, &shape, device)?;
    Ok(PackedBatch {
        input_ids: Tensor::from_vec(ids, &shape, device)?,
        labels: Tensor::from_vec(labels, &shape, device)?,
        targets: Tensor::from_vec(targets, &shape, device)?,
        position_ids: Tensor::from_vec(positions, &shape, device)?,
        attention_mask: block_diagonal_mask(&segment_ids)?,
        segment_ids,
    })
}

/// The `(b, 1, s, s)` bool attention mask of packed rows from their `(b, s)` integer
/// `segment_ids` (0 = padding): query `i` may attend to key `j` (true) when `j <= i` and both
/// tokens belong to the same example. A padding query sees only itself, so its attention
/// output is finite instead of NaN (and unused). This is the mask the Qwen2 model's
/// attention takes (`(b, 1, s, t)` bool, true = may attend).
pub fn block_diagonal_mask(segment_ids: &Tensor) -> Result<Tensor> {
    let [_, s] = *segment_ids.shape() else {
        return Err(Error::invalid(format!(
            "block_diagonal_mask: segment ids must be (batch, tokens), got shape {:?}",
            segment_ids.shape()
        )));
    };
    let device = segment_ids.device();
    let seg = segment_ids.to_dtype(DType::I64)?;
    let query = seg.unsqueeze(2)?; // (b, s, 1)
    let key = seg.unsqueeze(1)?; // (b, 1, s)
    let same = query.eq(&key)?.logical_and(&key.ne_scalar(0)?)?; // (b, s, s)
    let i = Tensor::arange(0.0, s as f64, 1.0, DType::I64, device)?.unsqueeze(1)?; // (s, 1)
    let j = Tensor::arange(0.0, s as f64, 1.0, DType::I64, device)?.unsqueeze(0)?; // (1, s)
    let causal = j.le(&i)?;
    same.logical_and(&causal)?.logical_or(&j.eq(&i)?)?.unsqueeze(1)
}
