//! Autoregressive generation: a prefill over the prompts, then one token per step with a
//! key/value cache, sampling on the device. Where the backend captures graphs, the decode step
//! is captured once and replayed; greedy decoding then runs several tokens per host
//! synchronization ([`TOKENS_PER_READ`]).
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
use std::collections::VecDeque;

/// Tokens a greedy generation replaying its captured step computes per read of the chosen ids.
/// Its graph takes each token's argmax and feeds it to the next step on the device, so the
/// host queues this many replays back to back and waits for the device once, instead of once
/// per token (about 60 µs per token on an H100; vLLM's multi-step scheduling does the same).
/// Tokens computed past an end-of-sequence id are dropped.
pub const TOKENS_PER_READ: usize = 8;

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
    /// Tokens the device has chosen that [`step`](Generation::step) has not returned yet,
    /// one id per row each (a self-feeding replay reads several at once).
    chosen_ahead: VecDeque<Vec<i64>>,
}

/// The decode step captured as a graph, with the tensors it reads and writes.
enum Replay {
    /// Not tried yet (the prompt has not been run).
    Untried,
    /// Off: disabled by the config, or the model or backend cannot capture.
    Off,
    /// Every token replays `graph` after writing `ids` and `position`; it writes `logits`.
    On { graph: Graph, ids: Tensor, position: Tensor, logits: Tensor },
    /// Greedy decoding: `graph` also takes the argmax of the logits, stores it in
    /// `chosen (b, capacity)` at the column of the step's position, writes it into `ids` and
    /// advances `position`, so replays follow one another with no host work between them.
    SelfFeeding { graph: Graph, chosen: Tensor },
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
            chosen_ahead: VecDeque::new(),
        })
    }

    /// True when every row has stopped or `max_new_tokens` are out.
    pub fn is_done(&self) -> bool {
        self.produced >= self.config.max_new_tokens || self.finished.iter().all(|&f| f)
    }

    /// Whether the tokens after the first come from replaying a captured graph of the decode
    /// step ([`GenerationConfig::graph`]); false until the first token has been produced.
    pub fn uses_graph(&self) -> bool {
        matches!(self.replay, Replay::On { .. } | Replay::SelfFeeding { .. })
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
        let next = match self.chosen_ahead.pop_front() {
            Some(ids) => ids,
            None => self.compute_next()?,
        };
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
        let (captured, self_feeding) = (self.uses_graph(), matches!(self.replay, Replay::SelfFeeding { .. }));
        if !self_feeding && (b > 1 || self.seen.is_some() || !captured) {
            self.next_input = Tensor::from_vec(feed.clone(), &[b, 1], &self.device)?;
        }
        // The captured step builds its key mask from the prompt's padding alone.
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

    /// Run the model for the next token (or, self-feeding, the next few) and return the ids
    /// chosen for it, one per row; later tokens wait in `chosen_ahead`.
    fn compute_next(&mut self) -> Result<Vec<i64>> {
        let b = self.finished.len();
        no_grad(|| {
            let logits = match &self.replay {
                Replay::SelfFeeding { graph, chosen } => {
                    let (start, count) =
                        (self.cache.len(), TOKENS_PER_READ.min(self.config.max_new_tokens - self.produced));
                    for _ in 0..count {
                        graph.replay()?;
                    }
                    self.cache.advance(count);
                    // (b, count), row by row: token t of row r at r * count + t.
                    let ids = chosen.narrow(1, start, count)?.to_vec::<i64>()?;
                    self.chosen_ahead.extend((1..count).map(|t| (0..b).map(|r| ids[r * count + t]).collect()));
                    return Ok((0..b).map(|r| ids[r * count]).collect());
                }
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
            sample(&logits, self.seen.as_ref(), &self.config, &self.rng)?.to_vec::<i64>()
        })
    }
}

impl<'m, M: CausalLM + ?Sized> Generation<'m, M> {
    /// Capture the model's positioned decode step as a graph, after the prompt has filled the
    /// cache: `Off` when the model has no such step or the backend cannot capture.
    fn capture(&mut self) -> Result<Replay> {
        let (b, len, capacity) = (self.finished.len(), self.cache.len(), self.cache.capacity());
        // (Asked first: the graph's inputs need ops, such as an integer arange, that a backend
        // without graphs need not have.)
        if capacity < len + self.config.max_new_tokens - self.produced || !Graph::supported(&self.device) {
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
            // Greedy choices need no host: the graph takes them and feeds them on.
            let self_feeding = !self.config.do_sample && self.seen.is_none();
            let chosen = Tensor::zeros(&[b, capacity], DType::I64, &device)?;
            let (model, cache, config, rng) = (self.model, &mut self.cache, &self.config, &self.rng);
            let captured = Graph::capture(&device, || -> Result<Option<Tensor>> {
                let seen = keys.le(&position)?;
                let mask = match &valid {
                    Some(v) => seen.logical_and(v)?,
                    None => seen.reshape(&[1, 1, 1, -1])?,
                };
                let logits = model.forward_step_at(&ids, &position, &mask, cache).transpose()?;
                if let Some(logits) = logits.as_ref().filter(|_| self_feeding) {
                    let next = sample(logits, None, config, rng)?.reshape(&[b as isize, 1])?;
                    chosen.copy_(&Tensor::where_(&keys.eq(&position)?, &next, &chosen)?)?;
                    ids.copy_(&next)?;
                    position.add_scalar_(1)?;
                }
                Ok(logits)
            });
            Ok(match captured {
                Ok((graph, Some(_))) if self_feeding => {
                    ids.copy_(&self.next_input)?;
                    position.fill_(len as f64)?;
                    Replay::SelfFeeding { graph, chosen }
                }
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
