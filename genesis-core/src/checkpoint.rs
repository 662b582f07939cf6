//! Training checkpoints (`genesis::checkpoint::Checkpoint`): model and optimizer tensors, scheduler state, RNG state, step and
//! user metadata in one safetensors file, written atomically.
//!
//! Layout: tensors `model.{name}` and `optimizer.{name}`; header metadata `genesis.format`,
//! `step`, `rng.seed`, `rng.offset`, `optimizer.kind`, `optimizer.{scalar}`,
//! `scheduler.{entry}`, `extra.{entry}` (numbers printed so that they read back exactly) and
//! `user.{key}`.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::optim::{OptimState, SchedulerState};
use crate::random::RngState;
use crate::serialize::{remove_stale_temporaries, write_atomically, Metadata, StateDict};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

const FORMAT: &str = "genesis-checkpoint-1";

/// Everything needed to resume training where it stopped.
#[derive(Clone, Debug, Default)]
pub struct Checkpoint {
    /// The model's state dict.
    pub model: StateDict,
    /// The optimizer's state (`optimizer.state_dict()`).
    pub optimizer: Option<OptimState>,
    /// The scheduler's state (`scheduler.state_dict()`).
    pub scheduler: Option<SchedulerState>,
    /// Other named numbers to restore, such as a `GradScaler`'s state.
    pub extra: BTreeMap<String, f64>,
    /// The default generator's state (`genesis::random::get_rng_state()`).
    pub rng: Option<RngState>,
    /// The training step (or epoch) the checkpoint was taken after.
    pub step: u64,
    /// Free-form user metadata.
    pub metadata: Metadata,
}

impl Checkpoint {
    /// The checkpoint as the bytes of a safetensors file, with a CRC-32 of every tensor's data
    /// in the metadata (verified on load).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut tensors = StateDict::new();
        let mut meta = Metadata::new();
        meta.insert("genesis.format".into(), FORMAT.into());
        meta.insert("step".into(), self.step.to_string());
        for (k, t) in &self.model {
            tensors.insert(format!("model.{k}"), t.clone());
        }
        if let Some(o) = &self.optimizer {
            meta.insert("optimizer.kind".into(), o.kind.clone());
            for (k, t) in &o.tensors {
                tensors.insert(format!("optimizer.{k}"), t.clone());
            }
            for (k, v) in &o.scalars {
                meta.insert(format!("optimizer.{k}"), v.to_string());
            }
        }
        if let Some(s) = &self.scheduler {
            meta.insert("scheduler".into(), "present".into());
            for (k, v) in s {
                meta.insert(format!("scheduler.{k}"), v.to_string());
            }
        }
        for (k, v) in &self.extra {
            meta.insert(format!("extra.{k}"), v.to_string());
        }
        if let Some(r) = &self.rng {
            meta.insert("rng.seed".into(), r.seed.to_string());
            meta.insert("rng.offset".into(), r.offset.to_string());
        }
        for (k, v) in &self.metadata {
            meta.insert(format!("user.{k}"), v.clone());
        }
        crate::serialize::to_bytes_with_checksums(&tensors, &meta)
    }

    /// Parse a checkpoint from the bytes of a safetensors file, tensors on `device`;
    /// `origin` names the source in errors. A tensor whose data does not match its saved
    /// checksum is an error naming it.
    pub fn from_bytes(bytes: &[u8], device: &Device, origin: &str) -> Result<Checkpoint> {
        Self::parse(bytes, device, origin, true)
    }

    fn parse(bytes: &[u8], device: &Device, origin: &str, verify: bool) -> Result<Checkpoint> {
        let (tensors, meta) = crate::serialize::safetensors_io::parse(bytes, device, origin, verify)?;
        let bad = |m: String| Error::load(format!("{origin}: {m}"));
        if meta.get("genesis.format").map(String::as_str) != Some(FORMAT) {
            return Err(bad(format!("not a Genesis checkpoint (no `genesis.format: {FORMAT}` in its metadata)")));
        }
        let number =
            |k: &str, v: &str| v.parse::<f64>().map_err(|_| bad(format!("metadata `{k}` = `{v}` is not a number")));
        let integer = |k: &str| -> Result<u64> {
            let v = meta.get(k).ok_or_else(|| bad(format!("metadata has no `{k}`")))?;
            v.parse::<u64>().map_err(|_| bad(format!("metadata `{k}` = `{v}` is not an integer")))
        };
        let mut c = Checkpoint { step: integer("step")?, ..Default::default() };
        if meta.contains_key("rng.seed") {
            c.rng = Some(RngState { seed: integer("rng.seed")?, offset: integer("rng.offset")? });
        }
        let mut optimizer =
            meta.get("optimizer.kind").map(|kind| OptimState { kind: kind.clone(), ..Default::default() });
        let mut scheduler = meta.contains_key("scheduler").then(SchedulerState::new);
        for (k, v) in &meta {
            if let Some(rest) = k.strip_prefix("optimizer.") {
                if rest != "kind" {
                    let o = optimizer.as_mut().ok_or_else(|| bad(format!("`{k}` without `optimizer.kind`")))?;
                    o.scalars.insert(rest.to_string(), number(k, v)?);
                }
            } else if let Some(rest) = k.strip_prefix("scheduler.") {
                scheduler.get_or_insert_default().insert(rest.to_string(), number(k, v)?);
            } else if let Some(rest) = k.strip_prefix("extra.") {
                c.extra.insert(rest.to_string(), number(k, v)?);
            } else if let Some(rest) = k.strip_prefix("user.") {
                c.metadata.insert(rest.to_string(), v.clone());
            }
        }
        for (k, t) in tensors {
            if let Some(rest) = k.strip_prefix("model.") {
                c.model.insert(rest.to_string(), t);
            } else if let Some(rest) = k.strip_prefix("optimizer.") {
                let o = optimizer.as_mut().ok_or_else(|| bad(format!("tensor `{k}` without `optimizer.kind`")))?;
                o.tensors.insert(rest.to_string(), t);
            } else {
                return Err(bad(format!("unexpected tensor `{k}`")));
            }
        }
        c.optimizer = optimizer;
        c.scheduler = scheduler;
        Ok(c)
    }

    /// Write the checkpoint to `path` atomically: a crash mid-save leaves the previous file.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.to_bytes().map_err(|e| e.context(format_args!("saving {}", path.display())))?;
        write_atomically(path, |f| f.write_all(&bytes))
    }

    /// Read a checkpoint from `path`, tensors on `device`, verifying every tensor's checksum
    /// (a checkpoint changed or damaged on disk is an error naming the tensor, where PyTorch
    /// would load whatever the bytes say). Temporary files that interrupted saves of `path`
    /// left behind are removed.
    pub fn load(path: impl AsRef<Path>, device: &Device) -> Result<Checkpoint> {
        Self::read(path.as_ref(), device, true)
    }

    /// [`Checkpoint::load`] without the checksum verification (to salvage a damaged file).
    pub fn load_unverified(path: impl AsRef<Path>, device: &Device) -> Result<Checkpoint> {
        Self::read(path.as_ref(), device, false)
    }

    fn read(path: &Path, device: &Device, verify: bool) -> Result<Checkpoint> {
        remove_stale_temporaries(path);
        let bytes = std::fs::read(path).map_err(|e| Error::load(format!("reading {}: {e}", path.display())))?;
        Checkpoint::parse(&bytes, device, &path.display().to_string(), verify)
    }
}
