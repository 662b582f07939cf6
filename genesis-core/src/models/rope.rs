//! Rotary position tables, computed in f32 the way transformers computes them.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::DType;
use std::sync::Mutex;

/// Rows of the tables built at first use; they grow (doubling) as positions are asked for.
const FIRST_ROWS: usize = 4096;

/// `cos` and `sin` of every position's rotation angles, `(positions, head_dim / 2)`.
///
/// Angles are `position · inv_freq` rounded to f32 with `inv_freq = 1 / theta^(2i / d)` in
/// f32, as transformers computes them (so long-context logits agree with it), and their
/// cosines and sines are taken in f64 and rounded once. Building the angles in bf16 (a known
/// bug of other implementations) loses positions past a few hundred. The tables cover the
/// positions used so far (growing by doubling up to `max_positions`) and are cast to the
/// model's dtype once per dtype.
#[derive(Debug)]
pub struct RotaryTables {
    inv_freq: Vec<f32>,
    max_positions: usize,
    device: Device,
    /// `(dtype, cos, sin)`; the f32 tables first. Every entry covers the same rows.
    tables: Mutex<Vec<(DType, Tensor, Tensor)>>,
}

impl RotaryTables {
    /// Tables for up to `max_positions` positions of heads of size `head_dim` (even) on
    /// `device`, with rotation base `theta`.
    pub fn new(head_dim: usize, max_positions: usize, theta: f64, device: &Device) -> Result<RotaryTables> {
        if head_dim == 0 || head_dim % 2 != 0 || theta.is_nan() || theta <= 0.0 || theta.is_infinite() {
            return Err(Error::invalid(format!(
                "rotary: head size {head_dim} must be even and theta {theta} positive"
            )));
        }
        let half = head_dim / 2;
        let inv_freq = (0..half).map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32)).collect();
        Ok(RotaryTables { inv_freq, max_positions, device: device.clone(), tables: Mutex::new(Vec::new()) })
    }

    fn build(&self, rows: usize) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(rows * half);
        let mut sin = Vec::with_capacity(rows * half);
        for p in 0..rows {
            for &f in &self.inv_freq {
                let angle = (p as f32 * f) as f64;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Ok((Tensor::from_vec(cos, &[rows, half], &self.device)?, Tensor::from_vec(sin, &[rows, half], &self.device)?))
    }

    /// The `(s, head_dim / 2)` rows for positions `start..start + s` in `dtype`.
    pub fn get(&self, start: usize, s: usize, dtype: DType) -> Result<(Tensor, Tensor)> {
        let end = start.checked_add(s).filter(|&e| e <= self.max_positions).ok_or_else(|| {
            Error::invalid(format!(
                "rotary: positions {start}..{} go past the model's max_position_embeddings ({})",
                start.saturating_add(s),
                self.max_positions
            ))
        })?;
        let mut tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        let rows = tables.first().map_or(0, |(_, c, _)| c.shape()[0]);
        if end > rows {
            let grown = end.max(2 * rows).max(FIRST_ROWS).min(self.max_positions);
            let (cos, sin) = self.build(grown)?;
            *tables = vec![(DType::F32, cos, sin)];
        }
        if !tables.iter().any(|(d, _, _)| *d == dtype) {
            let (_, c, s) = &tables[0];
            let cast = (dtype, c.to_dtype(dtype)?, s.to_dtype(dtype)?);
            tables.push(cast);
        }
        let (_, c, sn) =
            tables.iter().find(|(d, _, _)| *d == dtype).ok_or_else(|| Error::invalid("rotary: no table"))?;
        Ok((c.narrow(0, start, s)?, sn.narrow(0, start, s)?))
    }

    /// Size of the heads the tables rotate.
    pub fn head_dim(&self) -> usize {
        2 * self.inv_freq.len()
    }
}
