//! Loading a state dict into a model's tensors (`model.load_state_dict(sd, strict)` in
//! PyTorch), checked in full before anything is written.

use super::StateDict;
use crate::autograd::no_grad;
use crate::error::{Error, ErrorKind, Result};

/// What a non-strict load left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Names the model has and the state dict lacks (left as they were).
    pub missing_keys: Vec<String>,
    /// Names the state dict has and the model lacks (ignored).
    pub unexpected_keys: Vec<String>,
}

/// Copy the tensors of `source` into the tensors of `target` with the same names, in place
/// (values are cast to the target's dtype and moved to its device). `target` is a model's
/// state dict of shared tensors (parameters and buffers), so the model sees the new values.
///
/// Every name and shape is checked before the first copy, so on an error nothing was
/// loaded: a shape mismatch is always an error; missing or unexpected names are an error when
/// `strict` and are listed in the returned [`LoadReport`] otherwise.
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
        return Err(Error::new(
            ErrorKind::ShapeMismatch,
            format!("load_state_dict: size mismatch for {}; nothing was loaded", mismatched.join(", ")),
        ));
    }
    if strict && (!report.missing_keys.is_empty() || !report.unexpected_keys.is_empty()) {
        return Err(Error::invalid(format!(
            "load_state_dict (strict): missing keys {:?}, unexpected keys {:?}; nothing was loaded",
            report.missing_keys, report.unexpected_keys
        )));
    }
    no_grad(|| -> Result<()> {
        for (k, t) in target {
            if let Some(s) = source.get(k) {
                t.copy_(s).map_err(|e| e.context(format_args!("load_state_dict: `{k}`")))?;
            }
        }
        Ok(())
    })?;
    Ok(report)
}
