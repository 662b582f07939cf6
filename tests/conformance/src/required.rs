//! Coverage of the required set (`genesis_backend_api::sdk::required`): for every float dtype,
//! whether a backend's claims include every pair the core needs for tensors, autograd and
//! training in that dtype. Separate from conformance: a backend is conformant when what it
//! claims is right, and covers a dtype's required set when it claims enough for the core to
//! work in that dtype.

use crate::values::short_name;
use genesis_backend_api::sdk::required;
use genesis_backend_api::{Capability, DType, OpKind};
use serde_json::{json, Value};

/// How far a capability list covers the required set of one dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    /// The dtype trained in.
    pub dtype: DType,
    /// Number of pairs in its required set.
    pub required: usize,
    /// The pairs not claimed, in the set's order.
    pub missing: Vec<(OpKind, DType)>,
}

impl Coverage {
    /// True when every required pair is claimed.
    pub fn covered(&self) -> bool {
        self.missing.is_empty()
    }

    /// The missing pairs as reports print them (`add`, `cast(bool)`).
    pub fn missing_names(&self) -> Vec<String> {
        self.missing.iter().map(|&p| required::pair_name(p, self.dtype)).collect()
    }

    /// The JSON form: dtype, covered, the set's size and the missing pairs as
    /// `{"op", "dtype"}` objects.
    pub fn to_json(&self) -> Value {
        json!({
            "dtype": short_name(self.dtype),
            "covered": self.covered(),
            "required": self.required,
            "missing": self.missing.iter().map(|&(op, d)| json!({
                "op": op.name().unwrap_or("unknown"),
                "dtype": short_name(d),
            })).collect::<Vec<_>>(),
        })
    }
}

/// The coverage of every float dtype (`DType::FLOATS` order) by `capabilities`.
pub fn coverage(capabilities: &[Capability]) -> Vec<Coverage> {
    DType::FLOATS
        .into_iter()
        .map(|dtype| Coverage {
            dtype,
            required: required::pairs(dtype).len(),
            missing: required::missing(dtype, capabilities),
        })
        .collect()
}

/// The dtypes of `cover` whose set is covered, and those whose set is not, as short names.
pub fn split(cover: &[Coverage]) -> (Vec<&'static str>, Vec<&'static str>) {
    let names = |want: bool| cover.iter().filter(|c| c.covered() == want).map(|c| short_name(c.dtype)).collect();
    (names(true), names(false))
}

/// Parse `--require`'s value: float dtypes by short name, separated by commas.
pub fn parse_dtypes(list: &str) -> Result<Vec<DType>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| match crate::values::from_short_name(name) {
            Some(d) if d.is_float() => Ok(d),
            _ => Err(format!("--require takes float dtypes (f32, f64, f16, bf16), not `{name}`")),
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|v| if v.is_empty() { Err("--require needs at least one dtype".to_string()) } else { Ok(v) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use genesis_backend_api::{Op, UnaryOp};

    fn claims(pairs: &[(OpKind, DType)]) -> Vec<Capability> {
        pairs.iter().map(|&(op, d)| Capability { op, dtype: d as u32 }).collect()
    }

    #[test]
    fn claiming_nothing_covers_nothing() {
        let cover = coverage(&[]);
        assert_eq!(cover.len(), 4);
        for c in &cover {
            assert!(!c.covered());
            assert_eq!(c.missing.len(), c.required);
        }
        assert!(cover[0].missing_names().contains(&"matmul".to_string()));
        assert!(cover[0].missing_names().contains(&"cast(bool)".to_string()));
        assert_eq!(split(&cover), (vec![], vec!["f32", "f64", "f16", "bf16"]));
    }

    #[test]
    fn a_gap_is_named_in_text_and_json() {
        let mut pairs = required::pairs(DType::F32);
        pairs.extend(required::pairs(DType::F64));
        pairs.retain(|&p| p != (OpKind::unary(UnaryOp::Sqrt), DType::F64));
        let cover = coverage(&claims(&pairs));
        assert!(cover[0].covered());
        assert_eq!(cover[1].missing_names(), vec!["sqrt".to_string()]);
        assert_eq!(split(&cover), (vec!["f32"], vec!["f64", "f16", "bf16"]));
        let j = cover[1].to_json();
        assert_eq!(j["covered"], false);
        assert_eq!(j["missing"], json!([{"op": "sqrt", "dtype": "f64"}]));
        assert_eq!(cover[2].to_json()["missing"][0], json!({"op": "fill", "dtype": "f16"}));
        assert_eq!(required::pair_name((Op::Cast.kind(), DType::Bool), DType::F16), "cast(bool)");
    }

    #[test]
    fn require_takes_float_dtypes() {
        assert_eq!(parse_dtypes("f32, f64").unwrap(), vec![DType::F32, DType::F64]);
        assert!(parse_dtypes("i64").unwrap_err().contains("float dtypes"));
        assert!(parse_dtypes("float32").is_err());
        assert!(parse_dtypes(",").is_err());
    }
}
