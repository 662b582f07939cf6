//! Loading a state dict into a model's tensors (`model.load_state_dict(sd, strict)` in
//! PyTorch), checked in full before anything is written.

use super::StateDict;
use crate::autograd::no_grad;
use crate::error::{Error, ErrorKind, Result};
use crate::ops::shape_err;

/// What a non-strict load left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Names the model has and the state dict lacks (left as they were).
    pub missing_keys: Vec<String>,
    /// Names the state dict has and the model lacks (ignored).
    pub unexpected_keys: Vec<String>,
}

impl LoadReport {
    /// True when every name matched.
    pub fn is_clean(&self) -> bool {
        self.missing_keys.is_empty() && self.unexpected_keys.is_empty()
    }
}

/// Copy the tensors of `source` into the tensors of `target` with the same names, in place
/// (values are cast to the target's dtype and moved to its device). `target` is a model's
/// state dict of shared tensors (parameters and buffers), so the model sees the new values.
///
/// Every name and shape is checked and every value cast to the model's dtype before the first
/// copy, so on an error (other than running out of device memory midway) nothing was loaded: a shape mismatch is always an error (`ShapeMismatch`, as PyTorch
/// raises in both modes); missing or unexpected names are an error (`LoadFailed`) when
/// `strict` and are listed in the returned [`LoadReport`] otherwise. `Module::load_state_dict`
/// is this function on the module's own state dict.
pub fn load_state_dict_into(target: &StateDict, source: &StateDict, strict: bool) -> Result<LoadReport> {
    let report = LoadReport {
        missing_keys: target.keys().filter(|k| !source.contains_key(*k)).cloned().collect(),
        unexpected_keys: source.keys().filter(|k| !target.contains_key(*k)).cloned().collect(),
    };
    let mismatched: Vec<String> = target
        .iter()
        .filter_map(|(k, t)| {
            let s = source.get(k)?;
            (s.shape() != t.shape()).then(|| format!("`{k}`: the file has {:?}, the model {:?}", s.shape(), t.shape()))
        })
        .collect();
    if !mismatched.is_empty() {
        return Err(shape_err(format!(
            "load_state_dict: size mismatch for {}; nothing was loaded",
            mismatched.join(", ")
        )));
    }
    if strict && !report.is_clean() {
        return Err(Error::new(
            ErrorKind::LoadFailed,
            format!(
                "load_state_dict (strict): missing keys {:?}, unexpected keys {:?}; nothing was loaded",
                report.missing_keys, report.unexpected_keys
            ),
        ));
    }
    no_grad(|| -> Result<()> {
        // Cast everything first, where the values are (a failing cast then leaves the model
        // untouched); then move and copy one tensor at a time, so that loading a host state
        // dict into a GPU model never holds a second copy of the whole model on the GPU.
        fn context(k: &str) -> impl Fn(Error) -> Error + '_ {
            move |e| e.context(format_args!("load_state_dict: `{k}`"))
        }
        let mut plan = Vec::new();
        for (k, t) in target {
            if let Some(s) = source.get(k) {
                plan.push((k, t, s.to_dtype(t.dtype()).map_err(context(k))?));
            }
        }
        for (k, t, s) in plan {
            t.copy_(&s).map_err(context(k))?;
        }
        Ok(())
    })?;
    Ok(report)
}
