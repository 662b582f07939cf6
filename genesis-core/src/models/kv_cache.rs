//! The key/value cache of incremental decoding: one preallocated buffer per layer that grows
//! in blocks, written in place, so a new token never copies the whole cache.

use crate::autograd::no_grad;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Keys and values of every layer for the positions seen so far, each layer's as
/// `(batch, kv_heads, capacity, head_dim)` buffers of which the first [`len`](KvCache::len)
/// positions are filled.
///
/// A forward pass appends its new positions to every layer ([`append`](KvCache::append)) and
/// then [`advance`](KvCache::advance)s the length once. When the capacity runs out it grows
/// to the next multiple of the block size: one copy of the filled part per block of
/// tokens, never per token. Preallocating the whole run
/// ([`with_capacity`](KvCache::with_capacity)) avoids growing at all.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
    capacity: usize,
    block: usize,
}

impl KvCache {
    /// An empty cache for `layers` layers that grows in blocks of `block` positions.
    pub fn new(layers: usize, block: usize) -> KvCache {
        KvCache { layers: vec![None; layers], len: 0, capacity: 0, block: block.max(1) }
    }

    /// An empty cache whose first allocation holds `capacity` positions.
    pub fn with_capacity(layers: usize, capacity: usize, block: usize) -> KvCache {
        KvCache { capacity, ..KvCache::new(layers, block) }
    }

    /// Positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no position is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the current buffers hold before they grow.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forget every position (the buffers are kept for reuse).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Write `k, v (batch, kv_heads, s, head_dim)` of `layer` after the filled positions and
    /// return the layer's keys and values for all `len + s` positions (views of the buffers).
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let n = self.layers.len();
        let slot =
            self.layers.get_mut(layer).ok_or_else(|| Error::invalid(format!("kv cache: layer {layer} of {n}")))?;
        if k.rank() != 4 || v.shape() != k.shape() {
            return Err(Error::invalid(format!(
                "kv cache: keys and values must be (batch, kv_heads, s, head_dim) alike, got {:?} and {:?}",
                k.shape(),
                v.shape()
            )));
        }
        let s = k.shape()[2];
        let need = self.len + s;
        if self.len > 0 && slot.is_none() {
            return Err(Error::invalid(format!(
                "kv cache: layer {layer} has no entries for the first {} positions",
                self.len
            )));
        }
        if let Some((kb, _)) = slot.as_ref().filter(|_| self.len > 0) {
            if kb.shape()[..2] != k.shape()[..2] || kb.shape()[3] != k.shape()[3] || kb.dtype() != k.dtype() {
                return Err(Error::invalid(format!(
                    "kv cache: layer {layer} holds {} positions of shape {:?} ({}); new keys {:?} ({}) do not fit \
                     (clear the cache to start another batch)",
                    self.len,
                    kb.shape(),
                    kb.dtype(),
                    k.shape(),
                    k.dtype()
                )));
            }
        }
        let fits = |buf: &Tensor| {
            buf.shape()[..2] == k.shape()[..2]
                && buf.shape()[3] == k.shape()[3]
                && buf.dtype() == k.dtype()
                && buf.shape()[2] >= need
        };
        no_grad(|| -> Result<(Tensor, Tensor)> {
            if !slot.as_ref().is_some_and(|(kb, _)| fits(kb)) {
                let capacity = self.capacity.max(need.div_ceil(self.block) * self.block);
                let mut shape = k.shape().to_vec();
                shape[2] = capacity;
                let (kb, vb) =
                    (Tensor::empty(&shape, k.dtype(), k.device())?, Tensor::empty(&shape, v.dtype(), v.device())?);
                if let Some((old_k, old_v)) = slot.as_ref().filter(|_| self.len > 0) {
                    kb.narrow(2, 0, self.len)?.copy_(&old_k.narrow(2, 0, self.len)?)?;
                    vb.narrow(2, 0, self.len)?.copy_(&old_v.narrow(2, 0, self.len)?)?;
                }
                self.capacity = capacity;
                *slot = Some((kb, vb));
            }
            let (kb, vb) = slot.as_ref().ok_or_else(|| Error::invalid("kv cache: no buffer"))?;
            kb.narrow(2, self.len, s)?.copy_(k)?;
            vb.narrow(2, self.len, s)?.copy_(v)?;
            Ok((kb.narrow(2, 0, need)?, vb.narrow(2, 0, need)?))
        })
    }

    /// Write `k, v (batch, kv_heads, 1, head_dim)` of `layer` at the position held by the
    /// device tensor `position (1,)` (i64) and return the layer's whole buffers, all
    /// [`capacity`](KvCache::capacity) positions: the step of a captured decode graph, whose
    /// position changes between replays without the host rewriting the graph. The buffers
    /// must exist and their positions from `position` on must be zero
    /// ([`zero_from`](KvCache::zero_from)): the write adds into them.
    pub fn write_at(&mut self, layer: usize, position: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (kb, vb) = self.buffers(layer)?;
        no_grad(|| -> Result<()> {
            kb.index_add_(2, position, k)?;
            vb.index_add_(2, position, v)
        })?;
        Ok((kb.clone(), vb.clone()))
    }

    /// The decode step's rotary embedding and cache write in one op: rotates `q (batch,
    /// heads, s, head_dim)` and `k (batch, kv_heads, s, head_dim)` by `cos, sin (s,
    /// head_dim / 2)` (the angles of the new positions), writes the rotated keys and `v` into
    /// `layer`'s buffers at the positions `p..p + s`, with `p` the value of the device tensor
    /// `position (1,)` (i64), and returns the rotated queries and the layer's whole buffers,
    /// all [`capacity`](KvCache::capacity) positions. As for [`write_at`](KvCache::write_at),
    /// the buffers must exist and the positions written must be zero
    /// ([`zero_from`](KvCache::zero_from)): where the device has no fused kernel for this
    /// step, the write adds into them. A position outside the buffers is an error and writes
    /// nothing. Not differentiable: run it under `no_grad`, as generation does.
    #[allow(clippy::too_many_arguments)]
    pub fn write_rotated_at(
        &mut self,
        layer: usize,
        position: &Tensor,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (kb, vb) = self.buffers(layer)?;
        let q = crate::ops::rotary::rotary_kv_write(q, k, v, cos, sin, position, kb, vb)?;
        Ok((q, kb.clone(), vb.clone()))
    }

    /// `layer`'s key and value buffers, or an error when there is no such layer or it has
    /// no buffers yet.
    fn buffers(&self, layer: usize) -> Result<(&Tensor, &Tensor)> {
        let n = self.layers.len();
        let (kb, vb) = self
            .layers
            .get(layer)
            .ok_or_else(|| Error::invalid(format!("kv cache: layer {layer} of {n}")))?
            .as_ref()
            .ok_or_else(|| Error::invalid(format!("kv cache: layer {layer} has no buffers to write into")))?;
        Ok((kb, vb))
    }

    /// Set every layer's positions from `start` to the capacity to zero (before
    /// [`write_at`](KvCache::write_at) fills them).
    pub fn zero_from(&mut self, start: usize) -> Result<()> {
        for (kb, vb) in self.layers.iter().flatten() {
            let rest = kb.shape()[2].saturating_sub(start);
            if rest > 0 {
                kb.narrow(2, start, rest)?.zero_()?;
                vb.narrow(2, start, rest)?.zero_()?;
            }
        }
        Ok(())
    }

    /// Count `s` more filled positions (after every layer has appended them).
    pub fn advance(&mut self, s: usize) {
        self.len += s;
    }
}
