//! Autoregressive generation: a prefill over the prompts, then one token per step with a
//! key/value cache, sampling on the device.
//!
//! ```no_run
//! use genesis::generation::{generate, GenerationConfig};
//! use genesis::models::qwen2::Qwen2ForCausalLM;
//! use genesis::{DType, Device};
//! let cpu = Device::cpu()?;
//! let model = Qwen2ForCausalLM::from_pretrained("path/to/model", &cpu, DType::F32)?;
//! let config = GenerationConfig { max_new_tokens: 32, ..GenerationConfig::from_folder("path/to/model")? };
//! let outputs = generate(&model, &[vec![9707, 11, 1879]], &config)?; // new ids per prompt
//! # Ok::<(), genesis::Error>(())
//! ```

mod config;
mod sampling;

pub use config::{GenerationConfig, GraphUse};
pub use sampling::{min_p_filter, repetition_penalty, sample, top_k_filter, top_p_filter};

use crate::autograd::no_grad;
use crate::device::Device;
use crate::error::{Error, ErrorKind, Result};
use crate::graph::Graph;
use crate::models::KvCache;
use crate::random::Generator;
use crate::tensor::Tensor;
use genesis_backend_api::DType;

/// A causal language model that decodes incrementally.
pub trait CausalLM {
    /// Logits `(b, vocab)` of the last of the new `ids (b, s)`, which follow the
    /// `cache.len()` positions already in `cache` (and are appended to it). `key_valid (b,
    /// cache.len() + s)` marks real tokens (1) and left padding (0) when rows differ in length.
    fn forward_step(&self, ids: &Tensor, key_valid: Option<&Tensor>, cache: &mut KvCache) -> Result<Tensor>;
    /// The logits `(b, vocab)` of one new token per row, `ids (b, 1)`, at the position held by
    /// the device tensor `position (1,)` (i64), written into `cache`'s full-capacity buffers
    /// (see [`KvCache::write_at`]) and attending to the keys `key_mask (b, 1, 1,
    /// cache.capacity())` keeps; `cache.len()` is not advanced. Such a step can be captured
    /// as a graph and replayed for every token. `None` (the default) when the model has none;
    /// generation then calls [`forward_step`](CausalLM::forward_step) for every token.
    fn forward_step_at(
        &self,
        ids: &Tensor,
        position: &Tensor,
        key_mask: &Tensor,
        cache: &mut KvCache,
    ) -> Option<Result<Tensor>> {
        let _ = (ids, position, key_mask, cache);
        None
    }
    /// An empty cache that holds `capacity` positions before growing.
    fn new_cache(&self, capacity: usize) -> KvCache;
    /// Size of the output vocabulary.
    fn vocab_size(&self) -> usize;
    /// Longest sequence (prompt and generated tokens) the model can position.
    fn max_positions(&self) -> usize;
    /// The device the weights are on.
    fn device(&self) -> Device;
}

/// A generation in progress over a batch of prompts; each [`step`](Generation::step) yields
/// one token per row.
pub struct Generation<'m, M: CausalLM + ?Sized> {
    model: &'m M,
    config: GenerationConfig,
    rng: Generator,
    cache: KvCache,
    device: Device,
    /// The ids to feed next: the left-padded prompts first, then the last tokens.
    next_input: Tensor,
    /// The last tokens fed, on the host.
    feed: Vec<i64>,
    /// `(b, positions)` 1 for real tokens, 0 for padding; `None` when no row is padded.
    key_valid: Option<Tensor>,
    /// `(b, vocab)` count of each token per row, for the repetition penalty.
    seen: Option<Tensor>,
    finished: Vec<bool>,
    produced: usize,
    pad: u32,
    /// The decode step as a captured graph, once made.
    replay: Replay,
}

/// The decode step captured as a graph, with the tensors it reads and writes.
enum Replay {
    /// Not tried yet (the prompt has not been run).
    Untried,
    /// Off: disabled by the config, or the model or backend cannot capture.
    Off,
    /// Every token replays `graph` after writing `ids` and `position`; it writes `logits`.
    On { graph: Graph, ids: Tensor, position: Tensor, logits: Tensor },
}

impl<'m, M: CausalLM + ?Sized> Generation<'m, M> {
    /// Start generating from `prompts` (token ids; at least one, none empty). Prompts of
    /// different lengths are left-padded and masked. Generation also stops when the
    /// sequence reaches the model's longest position.
    pub fn new(model: &'m M, prompts: &[Vec<u32>], config: &GenerationConfig) -> Result<Self> {
        config.validate()?;
        if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
            return Err(Error::invalid("generate: every prompt needs at least one token"));
        }
        let vocab = model.vocab_size();
        if let Some(bad) = prompts.iter().flatten().find(|&&id| id as usize >= vocab) {
            return Err(Error::invalid(format!("generate: token id {bad} is outside the vocabulary of {vocab}")));
        }
        let device = model.device();
        let (b, len) = (prompts.len(), prompts.iter().map(Vec::len).max().unwrap_or(0));
        if len >= model.max_positions() {
            return Err(Error::invalid(format!(
                "generate: a prompt of {len} tokens leaves no room in the model's {} positions",
                model.max_positions()
            )));
        }
        let mut config = config.clone();
        config.max_new_tokens = config.max_new_tokens.min(model.max_positions() - len);
        let pad = config.pad_token_id.or(config.eos_token_ids.first().copied()).unwrap_or(0);
        if pad as usize >= vocab {
            return Err(Error::invalid(format!("generate: pad id {pad} is outside the vocabulary of {vocab}")));
        }
        let mut ids = Vec::with_capacity(b * len);
        let mut valid = Vec::with_capacity(b * len);
        for p in prompts {
            let padding = len - p.len();
            ids.extend(std::iter::repeat_n(pad as i64, padding).chain(p.iter().map(|&i| i as i64)));
            valid.extend(std::iter::repeat_n(0i64, padding).chain(std::iter::repeat_n(1, p.len())));
        }
        let next_input = Tensor::from_vec(ids.clone(), &[b, len], &device)?;
        let key_valid =
            if valid.contains(&0) { Some(Tensor::from_vec(valid.clone(), &[b, len], &device)?) } else { None };
        let seen = if config.repetition_penalty != 1.0 {
            let counts = Tensor::zeros(&[b, vocab], DType::F32, &device)?;
            let weights: Vec<f32> = valid.iter().map(|&v| v as f32).collect();
            let weights = Tensor::from_vec(weights, &[b, len], &device)?;
            Some(no_grad(|| counts.scatter_add(1, &next_input, &weights))?)
        } else {
            None
        };
        let rng = match config.seed {
            Some(seed) => Generator::new(seed),
            None => Generator::default_for(&device),
        };
        let cache = model.new_cache(len + config.max_new_tokens);
        let replay = match config.graph {
            GraphUse::Always => Replay::Untried,
            GraphUse::SingleSequence if b == 1 => Replay::Untried,
            _ => Replay::Off,
        };
        Ok(Generation {
            model,
            config,
            rng,
            cache,
            device,
            next_input,
            feed: Vec::new(),
            key_valid,
            seen,
            finished: vec![false; b],
            produced: 0,
            pad,
            replay,
        })
    }

    /// True when every row has stopped or `max_new_tokens` are out.
    pub fn is_done(&self) -> bool {
        self.produced >= self.config.max_new_tokens || self.finished.iter().all(|&f| f)
    }

    /// Whether the tokens after the first come from replaying a captured graph of the decode
    /// step ([`GenerationConfig::graph`]); false until the first token has been produced.
    pub fn uses_graph(&self) -> bool {
        matches!(self.replay, Replay::On { .. })
    }

    /// Mark `row` as finished (for instance on a stop string found by the caller).
    pub fn finish_row(&mut self, row: usize) {
        if let Some(f) = self.finished.get_mut(row) {
            *f = true;
        }
    }

    /// The next token of every row: `None` for rows that had already finished, `Some(id)`
    /// otherwise (an end-of-sequence id finishes its row and is returned). Returns an empty
    /// vector once [`is_done`](Generation::is_done).
    pub fn step(&mut self) -> Result<Vec<Option<u32>>> {
        if self.is_done() {
            return Ok(vec![]);
        }
        let b = self.finished.len();
        if self.produced > 0 && matches!(self.replay, Replay::Untried) {
            self.replay = self.capture()?;
        }
        let next = no_grad(|| -> Result<Vec<i64>> {
            let logits = match &self.replay {
                Replay::On { graph, ids, position, logits } => {
                    if b == 1 {
                        // A fill is a kernel: no host copy to stage.
                        ids.fill_(self.feed[0] as f64)?;
                    } else {
                        ids.copy_(&self.next_input)?;
                    }
                    position.fill_(self.cache.len() as f64)?;
                    graph.replay()?;
                    self.cache.advance(1);
                    logits.clone()
                }
                _ => self.model.forward_step(&self.next_input, self.key_valid.as_ref(), &mut self.cache)?,
            };
            let ids = sample(&logits, self.seen.as_ref(), &self.config, &self.rng)?;
            ids.to_vec::<i64>()
        })?;
        let mut out = Vec::with_capacity(b);
        let mut feed = Vec::with_capacity(b);
        for (row, &id) in next.iter().enumerate() {
            if self.finished[row] {
                out.push(None);
                feed.push(self.pad as i64);
            } else {
                let id = id as u32;
                self.finished[row] = self.config.eos_token_ids.contains(&id);
                out.push(Some(id));
                feed.push(id as i64);
            }
        }
        self.produced += 1;
        self.feed = feed.clone();
        if b > 1 || self.seen.is_some() || !matches!(self.replay, Replay::On { .. }) {
            self.next_input = Tensor::from_vec(feed.clone(), &[b, 1], &self.device)?;
        }
        // The captured step builds its key mask from the prompt's padding alone.
        let captured = matches!(self.replay, Replay::On { .. });
        if let Some(valid) = self.key_valid.as_ref().filter(|_| !captured) {
            let ones = Tensor::ones(&[b, 1], valid.dtype(), &self.device)?;
            self.key_valid = Some(Tensor::cat(&[valid.clone(), ones], 1)?);
        }
        if let Some(seen) = &self.seen {
            let add = Tensor::ones(&[b, 1], DType::F32, &self.device)?;
            self.seen = Some(no_grad(|| seen.scatter_add(1, &self.next_input, &add))?);
        }
        Ok(out)
    }
}

impl<'m, M: CausalLM + ?Sized> Generation<'m, M> {
    /// Capture the model's positioned decode step as a graph, after the prompt has filled the
    /// cache: `Off` when the model has no such step or the backend cannot capture.
    fn capture(&mut self) -> Result<Replay> {
        let (b, len, capacity) = (self.finished.len(), self.cache.len(), self.cache.capacity());
        if capacity < len + self.config.max_new_tokens - self.produced {
            return Ok(Replay::Off);
        }
        let device = self.device.clone();
        no_grad(|| -> Result<Replay> {
            self.cache.zero_from(len)?;
            let ids = Tensor::zeros(&[b, 1], DType::I64, &device)?;
            let position = Tensor::zeros(&[1], DType::I64, &device)?;
            // Keys the step may see: those before and at its position that are not padding.
            let keys = Tensor::arange(0.0, capacity as f64, 1.0, DType::I64, &device)?;
            let valid = match &self.key_valid {
                Some(v) => {
                    // `v` also covers the token about to be fed; later positions are all real.
                    let generated = Tensor::ones(&[b, capacity - v.shape()[1]], v.dtype(), &device)?;
                    Some(Tensor::cat(&[v.clone(), generated], 1)?.ne_scalar(0)?.reshape(&[b as isize, 1, 1, -1])?)
                }
                None => None,
            };
            let (model, cache) = (self.model, &mut self.cache);
            let captured = Graph::capture(&device, || -> Result<Option<Tensor>> {
                let seen = keys.le(&position)?;
                let mask = match &valid {
                    Some(v) => seen.logical_and(v)?,
                    None => seen.reshape(&[1, 1, 1, -1])?,
                };
                model.forward_step_at(&ids, &position, &mask, cache).transpose()
            });
            Ok(match captured {
                Ok((graph, Some(logits))) => Replay::On { graph, ids, position, logits },
                Ok((_, None)) => Replay::Off,
                Err(e) if e.kind() == ErrorKind::Unsupported => Replay::Off,
                Err(e) => return Err(e),
            })
        })
    }
}

/// Generate from every prompt until it stops (an end-of-sequence id) or `max_new_tokens`;
/// returns the new ids of each prompt (with the end-of-sequence id that stopped it).
pub fn generate<M: CausalLM + ?Sized>(
    model: &M,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
) -> Result<Vec<Vec<u32>>> {
    let mut generation = Generation::new(model, prompts, config)?;
    let mut outputs = vec![Vec::new(); prompts.len()];
    while !generation.is_done() {
        for (row, id) in generation.step()?.into_iter().enumerate() {
            if let Some(id) = id {
                outputs[row].push(id);
            }
        }
    }
    Ok(outputs)
}

/// Where the first of `stop_strings` begins in `text`, if any does (the caller cuts the
/// text there and stops).
pub fn find_stop_string(text: &str, stop_strings: &[String]) -> Option<usize> {
    stop_strings.iter().filter(|s| !s.is_empty()).filter_map(|s| text.find(s.as_str())).min()
}
