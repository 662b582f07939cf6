//! `MultiheadAttention` and `Dropout`.

use super::functional;
use super::init;
use super::linear::Linear;
use super::module::{Entry, Module, Param, TrainingFlag};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ops::shape_err;
use crate::tensor::Tensor;
use genesis_backend_api::DType;

/// Dropout (`nn.Dropout`): active in training mode only.
#[derive(Debug)]
pub struct Dropout {
    /// Drop probability.
    pub p: f64,
    training: TrainingFlag,
}

impl Dropout {
    /// Dropout with probability `p` in `[0, 1]`.
    pub fn new(p: f64) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::invalid(format!("Dropout: p must be in [0, 1], got {p}")));
        }
        Ok(Dropout { p, training: TrainingFlag::default() })
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        functional::dropout(x, self.p, self.training.get())
    }
    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("", Entry::Training(&self.training));
    }
}

/// Multi-head attention (`nn.MultiheadAttention` without attention-weight dropout, `kdim`/
/// `vdim` or returned weights), through [`functional::scaled_dot_product_attention`]. Parameters
/// use PyTorch's names and initialization: `in_proj_weight (3E, E)` xavier-uniform,
/// `in_proj_bias` zeros, `out_proj` a Linear with a zero bias.
#[derive(Debug, Clone)]
pub struct MultiheadAttention {
    /// Query, key and value projections stacked.
    pub in_proj_weight: Param,
    /// Their biases.
    pub in_proj_bias: Param,
    /// The output projection.
    pub out_proj: Linear,
    /// Number of heads.
    pub num_heads: usize,
    /// Inputs are `(batch, seq, embed)` when true, `(seq, batch, embed)` otherwise (PyTorch's
    /// default).
    pub batch_first: bool,
}

impl MultiheadAttention {
    /// `embed_dim` split over `num_heads` heads.
    pub fn new(embed_dim: usize, num_heads: usize, batch_first: bool, device: &Device) -> Result<MultiheadAttention> {
        if num_heads == 0 || embed_dim == 0 || embed_dim % num_heads != 0 {
            return Err(Error::invalid(format!(
                "MultiheadAttention: embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})"
            )));
        }
        let w = Tensor::empty_float(&[3 * embed_dim, embed_dim], device)?;
        init::xavier_uniform_(&w, 1.0)?;
        let out_proj = Linear::new(embed_dim, embed_dim, true, device)?;
        if let Some(b) = &out_proj.bias {
            init::zeros_(&b.get())?;
        }
        Ok(MultiheadAttention {
            in_proj_weight: Param::parameter(w)?,
            in_proj_bias: Param::parameter(Tensor::zeros(&[3 * embed_dim], DType::F32, device)?)?,
            out_proj,
            num_heads,
            batch_first,
        })
    }

    /// Attention of `query (.., L, E)` over `key`, `value (.., S, E)` (batch first or not as
    /// configured). `key_padding_mask (N, S)`: bool with `true` marking keys to ignore, or
    /// float added to the scores. `causal` hides later keys. Returns the attended output only.
    pub fn attend(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        key_padding_mask: Option<&Tensor>,
        causal: bool,
    ) -> Result<Tensor> {
        let bf = |t: &Tensor| if self.batch_first { Ok(t.clone()) } else { t.transpose(0, 1) };
        let (q, k, v) = (bf(query)?, bf(key)?, bf(value)?);
        let e = self.in_proj_weight.get().shape()[1];
        for t in [&q, &k, &v] {
            if t.rank() != 3 || t.shape()[2] != e || t.shape()[0] != q.shape()[0] {
                return Err(shape_err(format!(
                    "MultiheadAttention: expected 3-D inputs with embed dim {e} and one batch size, got {:?}, {:?}, \
                         {:?}",
                    query.shape(),
                    key.shape(),
                    value.shape()
                )));
            }
        }
        if k.shape() != v.shape() {
            return Err(shape_err("MultiheadAttention: key and value shapes differ"));
        }
        let (w, b) = (self.in_proj_weight.get(), self.in_proj_bias.get());
        let project = |x: &Tensor, i: usize| -> Result<Tensor> {
            let y = functional::linear(x, &w.narrow(0, i * e, e)?, Some(&b.narrow(0, i * e, e)?))?;
            let (n, l) = (y.shape()[0] as isize, y.shape()[1] as isize);
            let h = self.num_heads as isize;
            y.reshape(&[n, l, h, e as isize / h])?.transpose(1, 2)
        };
        let (qh, kh, vh) = (project(&q, 0)?, project(&k, 1)?, project(&v, 2)?);
        let (n, s) = (k.shape()[0], k.shape()[1]);
        let mask = match key_padding_mask {
            None => None,
            Some(m) if m.shape() != [n, s] => {
                return Err(shape_err(format!(
                    "MultiheadAttention: key_padding_mask {:?} should be [{n}, {s}]",
                    m.shape()
                )))
            }
            Some(m) if m.dtype() == DType::Bool => Some(m.logical_not()?.reshape(&[n as isize, 1, 1, s as isize])?),
            Some(m) => Some(m.reshape(&[n as isize, 1, 1, s as isize])?),
        };
        let o = functional::scaled_dot_product_attention(&qh, &kh, &vh, mask.as_ref(), causal, None)?;
        let (n, l) = (o.shape()[0] as isize, o.shape()[2] as isize);
        let o = self.out_proj.forward(&o.transpose(1, 2)?.reshape(&[n, l, e as isize])?)?;
        bf(&o)
    }
}

impl Module for MultiheadAttention {
    /// Unmasked self-attention of `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attend(x, x, x, None, false)
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("in_proj_weight", Entry::Param(&self.in_proj_weight));
        f("in_proj_bias", Entry::Param(&self.in_proj_bias));
        f("out_proj", Entry::Child(&self.out_proj));
    }
}
