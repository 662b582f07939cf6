//! The Qwen2 decoder: pre-norm layers of grouped-query attention with rotary positions and
//! a SiLU-gated MLP, then a final RMSNorm and the language-model head.

use super::Qwen2Config;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::models::kv_cache::KvCache;
use crate::models::rope::RotaryTables;
use crate::nn::functional::{
    add_rms_norm_linear, rotary_embedding, scaled_dot_product_attention, scaled_dot_product_attention_lower_right,
    swiglu_halves, swiglu_linear,
};
use crate::nn::{Embedding, Entry, Linear, Module, ModuleList, Param, RMSNorm};
use crate::tensor::Tensor;
use genesis_backend_api::DType;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Where a layer's weights come from: called with the weight's Hugging Face name and shape.
pub(crate) type WeightSource<'a> = dyn FnMut(&str, &[usize]) -> Result<Tensor> + 'a;

fn linear(source: &mut WeightSource<'_>, name: &str, input: usize, output: usize, bias: bool) -> Result<Linear> {
    let weight = Param::parameter(source(&format!("{name}.weight"), &[output, input])?)?;
    let bias = if bias { Some(Param::parameter(source(&format!("{name}.bias"), &[output])?)?) } else { None };
    Ok(Linear { weight, bias })
}

/// Linear layers whose weights (and biases) are stored back to back in one buffer, as views
/// that keep their own names: q/k/v and gate/up read the same input, so each group runs as
/// one GEMM (`forward_stacked`, `gated`) while optimizers and state dicts see the separate
/// Hugging Face parameters.
fn stacked_linears(
    source: &mut WeightSource<'_>,
    layers: &[(String, usize)],
    input: usize,
    bias: bool,
) -> Result<Vec<Linear>> {
    let stack = |source: &mut WeightSource<'_>, suffix: &str, shape: &dyn Fn(usize) -> Vec<usize>| {
        let parts = layers
            .iter()
            .map(|(name, out)| source(&format!("{name}.{suffix}"), &shape(*out)))
            .collect::<Result<Vec<_>>>()?;
        let buffer = crate::autograd::no_grad(|| Tensor::cat(&parts, 0))?;
        let mut start = 0;
        layers
            .iter()
            .map(|(_, out)| {
                let view = buffer.narrow(0, start, *out)?;
                start += out;
                Param::parameter(view)
            })
            .collect::<Result<Vec<_>>>()
    };
    let weights = stack(source, "weight", &|out| vec![out, input])?;
    let biases = if bias { Some(stack(source, "bias", &|out| vec![out])?) } else { None };
    Ok(weights
        .into_iter()
        .enumerate()
        .map(|(i, weight)| Linear { weight, bias: biases.as_ref().map(|b| b[i].clone()) })
        .collect())
}

/// The weights (and biases) of `group` as one stacked layer, when they are still back to back
/// in one buffer. In training too: each layer's gradient is then its rows of the stacked
/// one, and the group costs one GEMM (and one cast of its input) forward and two backward.
fn stacked(group: &[&Linear]) -> Option<(Tensor, Option<Tensor>)> {
    let weights: Vec<Tensor> = group.iter().map(|l| l.weight.get()).collect();
    let weight = Tensor::adjacent_rows(&weights)?;
    let biases: Option<Vec<Tensor>> = group.iter().map(|l| l.bias.as_ref().map(Param::get)).collect();
    match biases {
        Some(b) => Some((weight, Some(Tensor::adjacent_rows(&b)?))),
        None => Some((weight, None)),
    }
}

/// The stacked layer's output `y (.., Σ out)` split back into one view per layer of `group`.
fn unstack(y: &Tensor, group: &[&Linear]) -> Result<Vec<Tensor>> {
    let sizes: Vec<usize> = group.iter().map(|l| l.weight.get().shape()[0]).collect();
    y.split_with_sizes(&sizes, -1)
}

/// `x` through each layer of `group`: one GEMM over their stacked weights when it can
/// ([`stacked`]), else one layer at a time.
fn forward_stacked(x: &Tensor, group: &[&Linear]) -> Result<Vec<Tensor>> {
    match stacked(group) {
        Some((w, b)) => unstack(&crate::nn::functional::linear(x, &w, b.as_ref())?, group),
        None => group.iter().map(|l| l.forward(x)).collect(),
    }
}

/// `silu(gate(x)) · up(x)` of the projections `[gate, up]`: one GEMM and [`swiglu_halves`]
/// when they are stacked, which keeps their gradient in one buffer too.
fn gated(x: &Tensor, [gate, up]: [&Linear; 2]) -> Result<Tensor> {
    match stacked(&[gate, up]) {
        Some((w, b)) => swiglu_halves(&crate::nn::functional::linear(x, &w, b.as_ref())?),
        None => crate::nn::functional::swiglu(&gate.forward(x)?, &up.forward(x)?),
    }
}

fn rms_norm(source: &mut WeightSource<'_>, name: &str, c: &Qwen2Config) -> Result<RMSNorm> {
    let weight = Param::parameter(source(&format!("{name}.weight"), &[c.hidden_size])?)?;
    Ok(RMSNorm { normalized_shape: vec![c.hidden_size], eps: Some(c.rms_norm_eps), weight: Some(weight) })
}

/// What one forward pass sees besides the hidden states.
#[derive(Clone, Copy)]
pub(crate) struct Context<'a> {
    /// Position of the first new token.
    pub start: usize,
    /// `(b, 1, s, t)` bool mask of the keys each query may see, when padding makes the plain
    /// causal mask wrong.
    pub mask: Option<&'a Tensor>,
    /// For a decode step whose position lives on the device (a captured graph): that
    /// position and its rotary rows; `start` is then unused.
    pub at: Option<&'a DevicePosition>,
}

/// The position of a one-token decode step as a device tensor, and its rotary rows.
pub(crate) struct DevicePosition {
    /// `(1,)` i64.
    pub position: Tensor,
    /// `(1, head_dim / 2)` cosines and sines of the position's angles.
    pub cos: Tensor,
    pub sin: Tensor,
}

const FULL_SEQUENCE: Context<'static> = Context { start: 0, mask: None, at: None };

/// Grouped-query self-attention: q/k/v projections with bias, rotary positions, causal
/// attention over the cache, output projection without bias.
#[derive(Debug)]
pub struct Qwen2Attention {
    /// `(heads·head_dim, hidden)` with bias.
    pub q_proj: Linear,
    /// `(kv_heads·head_dim, hidden)` with bias.
    pub k_proj: Linear,
    /// `(kv_heads·head_dim, hidden)` with bias.
    pub v_proj: Linear,
    /// `(hidden, heads·head_dim)`, no bias.
    pub o_proj: Linear,
    rope: Arc<RotaryTables>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Qwen2Attention {
    fn new(source: &mut WeightSource<'_>, prefix: &str, c: &Qwen2Config, rope: Arc<RotaryTables>) -> Result<Self> {
        let (h, hq, hk) = (c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
        let names = [("q_proj", hq), ("k_proj", hk), ("v_proj", hk)].map(|(n, out)| (format!("{prefix}.{n}"), out));
        let [q_proj, k_proj, v_proj]: [Linear; 3] =
            stacked_linears(source, &names, h, true)?.try_into().map_err(|_| Error::invalid("q/k/v projections"))?;
        Ok(Qwen2Attention {
            q_proj,
            k_proj,
            v_proj,
            o_proj: linear(source, &format!("{prefix}.o_proj"), hq, h, false)?,
            rope,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
        })
    }

    /// `(b, s, heads·d)` → `(b, heads, s, d)` (a view).
    fn split_heads(&self, x: &Tensor, heads: usize) -> Result<Tensor> {
        let (b, s) = (x.shape()[0] as isize, x.shape()[1] as isize);
        x.reshape(&[b, s, heads as isize, self.head_dim as isize])?.transpose(1, 2)
    }

    /// The q, k and v projections, which read the same input.
    fn projections(&self) -> [&Linear; 3] {
        [&self.q_proj, &self.k_proj, &self.v_proj]
    }

    fn forward_ctx(&self, x: &Tensor, ctx: &Context<'_>, cache: Option<(&mut KvCache, usize)>) -> Result<Tensor> {
        self.attend(forward_stacked(x, &self.projections())?, ctx, cache)
    }

    /// Attention from the projections `[q, k, v]`, each `(b, s, heads·d)`, through o_proj.
    fn attend(&self, qkv: Vec<Tensor>, ctx: &Context<'_>, cache: Option<(&mut KvCache, usize)>) -> Result<Tensor> {
        let [q, k, v]: [Tensor; 3] = qkv.try_into().map_err(|_| Error::invalid("q/k/v projections"))?;
        let (b, s) = (q.shape()[0], q.shape()[1]);
        let (q, k, v) = (
            self.split_heads(&q, self.heads)?,
            self.split_heads(&k, self.kv_heads)?,
            self.split_heads(&v, self.kv_heads)?,
        );
        let (cos, sin) = match ctx.at {
            Some(at) => (at.cos.clone(), at.sin.clone()),
            None => self.rope.get(ctx.start, s, q.dtype())?,
        };
        let (q, k, v) = match (cache, ctx.at) {
            // The captured decode step: rotary and the cache write as one op.
            (Some((cache, layer)), Some(at)) => cache.write_rotated_at(layer, &at.position, &q, &k, &v, &cos, &sin)?,
            (cache, _) => {
                let (q, k) = (rotary_embedding(&q, &cos, &sin)?, rotary_embedding(&k, &cos, &sin)?);
                let (k, v) = match cache {
                    Some((cache, layer)) => cache.append(layer, &k, &v)?,
                    None => (k, v),
                };
                (q, k, v)
            }
        };
        // Without a mask, causal over the cache: the queries are the last `s` key positions.
        let o = match ctx.mask {
            Some(mask) => scaled_dot_product_attention(&q, &k, &v, Some(mask), false, None)?,
            None => scaled_dot_product_attention_lower_right(&q, &k, &v, None)?,
        };
        self.o_proj.forward(&o.transpose(1, 2)?.reshape(&[b as isize, s as isize, -1])?)
    }
}

impl Module for Qwen2Attention {
    /// Causal self-attention over the whole sequence `x (b, s, hidden)`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_ctx(x, &FULL_SEQUENCE, None)
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("q_proj", Entry::Child(&self.q_proj));
        f("k_proj", Entry::Child(&self.k_proj));
        f("v_proj", Entry::Child(&self.v_proj));
        f("o_proj", Entry::Child(&self.o_proj));
    }
}

/// `down(silu(gate(x)) · up(x))`, no biases.
#[derive(Debug)]
pub struct Qwen2Mlp {
    /// `(intermediate, hidden)`.
    pub gate_proj: Linear,
    /// `(intermediate, hidden)`.
    pub up_proj: Linear,
    /// `(hidden, intermediate)`.
    pub down_proj: Linear,
    /// Whether a recorded forward drops the `(.., intermediate)` activation and the backward
    /// computes it again ([`Qwen2Mlp::set_recompute_activation`]).
    recompute: AtomicBool,
}

impl Qwen2Mlp {
    fn new(source: &mut WeightSource<'_>, prefix: &str, c: &Qwen2Config) -> Result<Self> {
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let names = [format!("{prefix}.gate_proj"), format!("{prefix}.up_proj")].map(|n| (n, i));
        let [gate_proj, up_proj]: [Linear; 2] =
            stacked_linears(source, &names, h, false)?.try_into().map_err(|_| Error::invalid("gate/up projections"))?;
        let down_proj = linear(source, &format!("{prefix}.down_proj"), i, h, false)?;
        Ok(Qwen2Mlp { gate_proj, up_proj, down_proj, recompute: AtomicBool::new(false) })
    }
}

impl Qwen2Mlp {
    /// Recompute the activation `silu(gate(x)) · up(x)` in the backward pass instead of keeping
    /// it from the forward (off by default, as in transformers): the largest tensor a layer
    /// keeps after the gate/up projection's output, `(tokens × intermediate)` in the autocast
    /// dtype, for one more SwiGLU kernel per layer in the backward. A partial form of
    /// transformers' `gradient_checkpointing_enable()`, which recomputes whole layers.
    pub fn set_recompute_activation(&self, on: bool) {
        self.recompute.store(on, Ordering::Relaxed);
    }

    /// The gate and up projections, which read the same input.
    fn projections(&self) -> [&Linear; 2] {
        [&self.gate_proj, &self.up_proj]
    }
}

impl Module for Qwen2Mlp {
    /// With the gate/up projections stacked, one GEMM and the fused SwiGLU; with
    /// [`Qwen2Mlp::set_recompute_activation`] the down projection takes their output through
    /// [`swiglu_linear`], whose backward computes the activation again rather than keeping it.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match stacked(&self.projections()) {
            Some((w, b)) if self.down_proj.bias.is_none() && self.recompute.load(Ordering::Relaxed) => {
                swiglu_linear(&crate::nn::functional::linear(x, &w, b.as_ref())?, &self.down_proj.weight.get())
            }
            _ => self.down_proj.forward(&gated(x, self.projections())?),
        }
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("gate_proj", Entry::Child(&self.gate_proj));
        f("up_proj", Entry::Child(&self.up_proj));
        f("down_proj", Entry::Child(&self.down_proj));
    }
}

/// The residual stream between layers, `h + pending`: a layer leaves its last addition
/// pending, and the norm that reads the stream next does it in the same pass
/// ([`RMSNorm::forward_residual`]).
pub(crate) struct Stream {
    h: Tensor,
    pending: Option<Tensor>,
}

impl Stream {
    /// `(norm(h + pending), h + pending)`.
    fn norm(self, norm: &RMSNorm) -> Result<(Tensor, Tensor)> {
        match self.pending {
            Some(pending) => norm.forward_residual(&self.h, &pending),
            None => Ok((norm.forward(&self.h)?, self.h)),
        }
    }

    /// The pending addition, the norm and `group`'s stacked layer as one op
    /// ([`add_rms_norm_linear`]), when a sum is pending and the stacked layer applies
    /// ([`stacked`]).
    fn fused(&self, norm: &RMSNorm, group: &[&Linear], gated: bool) -> Option<Result<(Tensor, Tensor)>> {
        let (pending, (w, b)) = (self.pending.as_ref()?, stacked(group)?);
        let g = norm.weight.as_ref().map(Param::get);
        Some(add_rms_norm_linear(&self.h, pending, g.as_ref(), norm.eps, &w, b.as_ref(), gated))
    }

    /// `(group(norm(h + pending)), h + pending)`: the norm and the layers of `group`, which
    /// all read it, in one op where [`Stream::fused`] applies.
    fn norm_linear(self, norm: &RMSNorm, group: &[&Linear]) -> Result<(Vec<Tensor>, Tensor)> {
        if let Some(fused) = self.fused(norm, group, false) {
            let (y, sum) = fused?;
            return Ok((unstack(&y, group)?, sum));
        }
        let (normed, x) = self.norm(norm)?;
        Ok((forward_stacked(&normed, group)?, x))
    }

    /// `(silu(gate(n)) · up(n), h + pending)` with `n = norm(h + pending)`: a gated MLP's
    /// input, in one op (gated) where [`Stream::fused`] applies.
    fn norm_gated(self, norm: &RMSNorm, group: [&Linear; 2]) -> Result<(Tensor, Tensor)> {
        if let Some(fused) = self.fused(norm, &group, true) {
            return fused;
        }
        let (normed, x) = self.norm(norm)?;
        Ok((gated(&normed, group)?, x))
    }

    /// `(mlp(norm(h + pending)), h + pending)`. Without recorded gradients the norm, the
    /// gate/up projections and SwiGLU are one op where [`Stream::fused`] applies; with them
    /// the MLP's own forward keeps less for the backward.
    fn norm_mlp(self, norm: &RMSNorm, mlp: &Qwen2Mlp) -> Result<(Tensor, Tensor)> {
        let recording = crate::autograd::is_grad_enabled()
            && mlp.projections().iter().chain([&&mlp.down_proj]).any(|l| l.weight.get().requires_grad());
        if recording {
            let (normed, x) = self.norm(norm)?;
            return Ok((mlp.forward(&normed)?, x));
        }
        let (gated, x) = self.norm_gated(norm, mlp.projections())?;
        Ok((mlp.down_proj.forward(&gated)?, x))
    }

    /// The same view (`f`) of both parts, such as the last position.
    fn view(self, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Stream> {
        Ok(Stream { h: f(&self.h)?, pending: self.pending.as_ref().map(f).transpose()? })
    }

    /// `h + pending` as one tensor.
    fn sum(self) -> Result<Tensor> {
        match self.pending {
            Some(pending) => self.h.add(&pending),
            None => Ok(self.h),
        }
    }
}

/// One decoder layer: `x + attn(norm(x))`, then `x + mlp(norm(x))`.
#[derive(Debug)]
pub struct Qwen2DecoderLayer {
    /// RMSNorm before attention.
    pub input_layernorm: RMSNorm,
    /// Self-attention.
    pub self_attn: Qwen2Attention,
    /// RMSNorm before the MLP.
    pub post_attention_layernorm: RMSNorm,
    /// The gated MLP.
    pub mlp: Qwen2Mlp,
}

impl Qwen2DecoderLayer {
    fn new(source: &mut WeightSource<'_>, prefix: &str, c: &Qwen2Config, rope: Arc<RotaryTables>) -> Result<Self> {
        Ok(Qwen2DecoderLayer {
            input_layernorm: rms_norm(source, &format!("{prefix}.input_layernorm"), c)?,
            self_attn: Qwen2Attention::new(source, &format!("{prefix}.self_attn"), c, rope)?,
            post_attention_layernorm: rms_norm(source, &format!("{prefix}.post_attention_layernorm"), c)?,
            mlp: Qwen2Mlp::new(source, &format!("{prefix}.mlp"), c)?,
        })
    }

    /// Each norm is taken together with the projections that read it ([`Stream::norm_linear`]).
    fn forward_ctx(&self, x: Stream, ctx: &Context<'_>, cache: Option<(&mut KvCache, usize)>) -> Result<Stream> {
        let (qkv, x) = x.norm_linear(&self.input_layernorm, &self.self_attn.projections())?;
        let attn = self.self_attn.attend(qkv, ctx, cache)?;
        let x = Stream { h: x, pending: Some(attn) };
        let (mlp, x) = x.norm_mlp(&self.post_attention_layernorm, &self.mlp)?;
        Ok(Stream { h: x, pending: Some(mlp) })
    }
}

impl Module for Qwen2DecoderLayer {
    /// A causal pass over the whole sequence `x (b, s, hidden)`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_ctx(Stream { h: x.clone(), pending: None }, &FULL_SEQUENCE, None)?.sum()
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("self_attn", Entry::Child(&self.self_attn));
        f("mlp", Entry::Child(&self.mlp));
        f("input_layernorm", Entry::Child(&self.input_layernorm));
        f("post_attention_layernorm", Entry::Child(&self.post_attention_layernorm));
    }
}

/// The decoder stack without the head: embeddings, layers, final norm.
#[derive(Debug)]
pub struct Qwen2Model {
    /// `(vocab, hidden)` token embeddings.
    pub embed_tokens: Embedding,
    /// The decoder layers.
    pub layers: ModuleList<Qwen2DecoderLayer>,
    /// The final RMSNorm.
    pub norm: RMSNorm,
    /// The rotary tables every layer shares.
    rope: Arc<RotaryTables>,
}

impl Qwen2Model {
    fn new(source: &mut WeightSource<'_>, c: &Qwen2Config, device: &Device) -> Result<Self> {
        let embed = Param::parameter(source("model.embed_tokens.weight", &[c.vocab_size, c.hidden_size])?)?;
        let rope = Arc::new(RotaryTables::new(c.head_dim, c.max_position_embeddings, c.rope_theta, device)?);
        let layers = (0..c.num_hidden_layers)
            .map(|i| Qwen2DecoderLayer::new(source, &format!("model.layers.{i}"), c, rope.clone()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Qwen2Model {
            embed_tokens: Embedding { weight: embed },
            layers: ModuleList::new(layers),
            norm: rms_norm(source, "model.norm", c)?,
            rope,
        })
    }

    /// The residual stream `(b, s, hidden)` after the last layer (before the final norm) of
    /// `ids (b, s)` whose first position is `start`, appending to `cache` when given.
    pub(crate) fn forward_from(
        &self,
        ids: &Tensor,
        start: usize,
        mask: Option<&Tensor>,
        mut cache: Option<&mut KvCache>,
    ) -> Result<Stream> {
        let ctx = Context { start, mask, at: None };
        let x = self.layers_forward(ids, &ctx, cache.as_deref_mut())?;
        if let Some(cache) = cache {
            cache.advance(ids.shape()[1]);
        }
        Ok(x)
    }

    fn layers_forward(&self, ids: &Tensor, ctx: &Context<'_>, mut cache: Option<&mut KvCache>) -> Result<Stream> {
        let mut x = Stream { h: self.embed_tokens.forward(ids)?, pending: None };
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward_ctx(x, ctx, cache.as_deref_mut().map(|c| (c, i)))?;
        }
        Ok(x)
    }

    /// The final norm of the stream: the hidden states the head reads.
    fn final_norm(&self, x: Stream) -> Result<Tensor> {
        Ok(x.norm(&self.norm)?.0)
    }
}

impl Module for Qwen2Model {
    /// Final hidden states `(b, s, hidden)` of `ids (b, s)` (causal, no cache).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.final_norm(self.forward_from(ids, 0, None, None)?)
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("embed_tokens", Entry::Child(&self.embed_tokens));
        f("layers", Entry::Child(&self.layers));
        f("norm", Entry::Child(&self.norm));
    }
}

/// Qwen2 with its language-model head (`Qwen2ForCausalLM`): logits over the vocabulary.
///
/// Parameter names are Hugging Face's (`model.layers.0.self_attn.q_proj.weight`, ...), so
/// [`Module::state_dict`] is a checkpoint transformers loads. With tied embeddings the head
/// reads `model.embed_tokens.weight` and has no parameter of its own, as in transformers'
/// saved files.
#[derive(Debug)]
pub struct Qwen2ForCausalLM {
    /// The decoder.
    pub model: Qwen2Model,
    /// `(vocab, hidden)`, absent when tied to the embeddings.
    pub lm_head: Option<Linear>,
    /// The configuration the model was built from.
    pub config: Qwen2Config,
}

impl Qwen2ForCausalLM {
    /// Build the model with weights from `source` (name, shape → tensor).
    pub(crate) fn build(config: Qwen2Config, device: &Device, source: &mut WeightSource<'_>) -> Result<Self> {
        let model = Qwen2Model::new(source, &config, device)?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(linear(source, "lm_head", config.hidden_size, config.vocab_size, false)?)
        };
        Ok(Qwen2ForCausalLM { model, lm_head, config })
    }

    /// A model with new random weights on `device` in `dtype`, initialized as transformers
    /// does: normal(0, `initializer_range`) for projections and embeddings, zero biases, unit
    /// norm weights. Draws from the global generator ([`crate::manual_seed`]).
    pub fn new(config: Qwen2Config, device: &Device, dtype: DType) -> Result<Self> {
        let std = config.initializer_range;
        Self::build(config, device, &mut |name, shape| {
            let t = if name.ends_with("norm.weight") {
                Tensor::ones(shape, dtype, device)?
            } else if name.ends_with(".bias") {
                Tensor::zeros(shape, dtype, device)?
            } else {
                crate::random::Generator::default_for(device)
                    .normal(shape, 0.0, std, DType::F32, device)?
                    .to_dtype(dtype)?
            };
            Ok(t)
        })
    }

    /// [`Qwen2Mlp::set_recompute_activation`] for every layer: trade one SwiGLU kernel per
    /// layer in the backward pass for the memory of the MLP activations (for the 0.5B model at
    /// 8 × 1024 tokens in bf16, 24 × 80 MB).
    pub fn set_recompute_mlp_activations(&self, on: bool) {
        for layer in self.model.layers.iter() {
            layer.mlp.set_recompute_activation(on);
        }
    }

    /// The head's weight: `lm_head.weight`, or the embeddings when tied.
    pub fn lm_head_weight(&self) -> Tensor {
        match &self.lm_head {
            Some(l) => l.weight.get(),
            None => self.model.embed_tokens.weight.get(),
        }
    }

    /// Logits of the final hidden states `h (.., hidden)`.
    pub fn logits(&self, h: &Tensor) -> Result<Tensor> {
        crate::nn::functional::linear(h, &self.lm_head_weight(), None)
    }

    /// Logits `(b, s, vocab)` of `ids (b, s)` with an optional `attention_mask (b, s)` (1 or
    /// `true` for real tokens, 0 for padding; left padding as generation uses it). Padded
    /// positions get finite but meaningless logits.
    pub fn forward_with_mask(&self, ids: &Tensor, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        let s = token_count(ids)?;
        let mask = match attention_mask {
            Some(m) => Some(padding_mask(m, s, s)?),
            None => None,
        };
        let h = self.model.forward_from(ids, 0, mask.as_ref(), None)?;
        self.logits(&self.model.final_norm(h)?)
    }

    /// Final (normalized) hidden states `(b, s, hidden)` of `ids (b, s)`, causal, or with
    /// `attention_mask (b, 1, s, s)` (bool, true where a query may see a key), such as the
    /// block-diagonal mask of packed training rows. Rotary embeddings depend only on the
    /// distance between positions, so examples packed at any offset and kept apart by the
    /// mask see exactly what they would alone.
    pub fn hidden_states(&self, ids: &Tensor, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        let s = token_count(ids)?;
        if let Some(m) = attention_mask {
            if m.rank() != 4
                || m.shape()[1] != 1
                || m.shape()[2] != s
                || m.shape()[3] != s
                || m.shape()[0] != ids.shape()[0]
            {
                return Err(Error::invalid(format!(
                    "Qwen2: attention mask must be (batch, 1, {s}, {s}) for ids {:?}, got {:?}",
                    ids.shape(),
                    m.shape()
                )));
            }
        }
        self.model.final_norm(self.model.forward_from(ids, 0, attention_mask, None)?)
    }

    /// One step of incremental decoding: the new `ids (b, s)` at positions `cache.len()..`,
    /// their keys and values appended to `cache`; returns the logits of the last position
    /// only, `(b, vocab)`. `key_valid (b, cache.len() + s)`, when given, marks the real
    /// tokens of every position so far (left padding).
    pub fn forward_step(&self, ids: &Tensor, key_valid: Option<&Tensor>, cache: &mut KvCache) -> Result<Tensor> {
        let (s, start) = (token_count(ids)?, cache.len());
        let mask = match key_valid {
            Some(m) => Some(padding_mask(m, s, start + s)?),
            None => None,
        };
        let h = self.model.forward_from(ids, start, mask.as_ref(), Some(cache))?;
        let last = h.view(|t| t.narrow(1, s - 1, 1)?.squeeze(Some(1)))?;
        self.logits(&self.model.final_norm(last)?)
    }

    /// One decode step whose position is the device tensor `position (1,)` (i64) instead of
    /// `cache.len()`: the logits `(b, vocab)` of `ids (b, 1)`, their keys and values written at
    /// that position of `cache`'s full-capacity buffers (see [`KvCache::write_at`]), attending
    /// to the keys `key_mask (b, 1, 1, cache.capacity())` (bool) keeps. Nothing in it depends
    /// on host values that change from token to token, so it can be captured once as a graph
    /// ([`crate::graph::Graph`]) and replayed for every token, with `ids` and `position`
    /// rewritten in between. `cache.len()` is not advanced.
    pub fn forward_step_at(
        &self,
        ids: &Tensor,
        position: &Tensor,
        key_mask: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        if token_count(ids)? != 1 || position.shape() != [1] {
            return Err(Error::invalid(format!(
                "Qwen2: a positioned step takes ids (batch, 1) and position (1,), got {:?} and {:?}",
                ids.shape(),
                position.shape()
            )));
        }
        let dtype = self.model.embed_tokens.weight.get().dtype();
        // The cache may hold more positions than the model has; the step never reaches them.
        let rows = cache.capacity().min(self.config.max_position_embeddings);
        let (cos, sin) = self.model.rope.get(0, rows, dtype)?;
        let at = DevicePosition {
            position: position.clone(),
            cos: cos.index_select(0, position)?,
            sin: sin.index_select(0, position)?,
        };
        let ctx = Context { start: 0, mask: Some(key_mask), at: Some(&at) };
        let h = self.model.layers_forward(ids, &ctx, Some(cache))?;
        self.logits(&self.model.final_norm(h.view(|t| t.squeeze(Some(1)))?)?)
    }

    /// A cache for this model holding `capacity` positions before it grows (in blocks of 256).
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        KvCache::with_capacity(self.config.num_hidden_layers, capacity, 256)
    }
}

/// The length `s` of `ids (b, s)`, or an error for another rank or an empty sequence.
fn token_count(ids: &Tensor) -> Result<usize> {
    match ids.shape() {
        [_, s] if *s > 0 => Ok(*s),
        other => Err(Error::invalid(format!("Qwen2: expected token ids (batch, tokens), got shape {other:?}"))),
    }
}

/// The `(b, 1, s, t)` bool mask of keys visible to the last `s` of `t` positions: causal,
/// without padded keys, and every query sees itself (so a padded query has a finite, unused
/// output instead of a NaN that would reach real positions through later layers).
pub(crate) fn padding_mask(key_valid: &Tensor, s: usize, t: usize) -> Result<Tensor> {
    if key_valid.rank() != 2 || key_valid.shape()[1] != t {
        return Err(Error::invalid(format!(
            "attention mask must be (batch, {t}) for {t} positions, got {:?}",
            key_valid.shape()
        )));
    }
    let device = key_valid.device();
    let valid = key_valid.ne_scalar(0)?.unsqueeze(1)?.unsqueeze(1)?; // (b, 1, 1, t)
    let i = Tensor::arange((t - s) as f64, t as f64, 1.0, DType::I64, device)?.unsqueeze(1)?; // (s, 1)
    let j = Tensor::arange(0.0, t as f64, 1.0, DType::I64, device)?.unsqueeze(0)?; // (1, t)
    let causal = j.le(&i)?;
    causal.logical_and(&valid)?.logical_or(&j.eq(&i)?)
}

impl Module for Qwen2ForCausalLM {
    /// Logits `(b, s, vocab)` of `ids (b, s)`, causal, no cache (the training forward).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        token_count(ids)?;
        self.logits(&self.model.forward(ids)?)
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("model", Entry::Child(&self.model));
        if let Some(head) = &self.lm_head {
            f("lm_head", Entry::Child(head));
        }
    }
}
