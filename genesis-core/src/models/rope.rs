//! Rotary position tables, computed in f32 the way transformers computes them.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::DType;
use std::sync::Mutex;

/// `cos` and `sin` of every position's rotation angles, `(max_positions, head_dim / 2)`.
///
/// Angles are `position · inv_freq` rounded to f32 with `inv_freq = 1 / theta^(2i / d)` in
/// f32, as transformers computes them (so long-context logits agree with it), and their
/// cosines and sines are taken in f64 and rounded once. Building the angles in bf16 (a known
/// bug of other implementations) loses positions past a few hundred. The tables are cast to
/// the model's dtype once per dtype and kept.
#[derive(Debug)]
pub struct RotaryTables {
    head_dim: usize,
    positions: usize,
    tables: Mutex<Vec<(DType, Tensor, Tensor)>>,
}

impl RotaryTables {
    /// Tables for `positions` positions of heads of size `head_dim` (even) on `device`.
    pub fn new(head_dim: usize, positions: usize, theta: f64, device: &Device) -> Result<RotaryTables> {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> =
            (0..half).map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32)).collect();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for &f in &inv_freq {
                let angle = (p as f32 * f) as f64;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let (cos, sin) =
            (Tensor::from_vec(cos, &[positions, half], device)?, Tensor::from_vec(sin, &[positions, half], device)?);
        Ok(RotaryTables { head_dim, positions, tables: Mutex::new(vec![(DType::F32, cos, sin)]) })
    }

    /// The `(s, head_dim / 2)` rows for positions `start..start + s` in `dtype`.
    pub fn get(&self, start: usize, s: usize, dtype: DType) -> Result<(Tensor, Tensor)> {
        if start + s > self.positions {
            return Err(Error::invalid(format!(
                "rotary: position {} is past the model's max_position_embeddings ({})",
                start + s - 1,
                self.positions
            )));
        }
        let mut tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
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
        self.head_dim
    }
}
