//! Suite `load`: what the plugin says about itself is well formed.

use crate::case::{Case, Outcome, Tier};
use crate::target::Target;
use genesis_backend_api::{DType, OpKind, API_VERSION};
use std::collections::HashSet;

/// A smoke case of this suite: each one must pass before any op is worth running.
fn load_case(name: &str, check: impl Fn(&Target) -> Outcome + Send + Sync + 'static) -> Case {
    Case::new("load", name, Tier::Smoke, Box::new(check))
}

pub fn cases(_: &Target) -> Vec<Case> {
    vec![
        load_case("info", |t| {
            let i = &t.info;
            let name_ok =
                !i.name.is_empty() && i.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            Outcome::check(
                name_ok && !i.version.is_empty() && !i.vendor.is_empty(),
                format!("info must have a [a-z0-9_]+ name, a vendor and a version: {i:?}"),
            )
        }),
        load_case("interface_version", |t| {
            Outcome::check(
                t.api.major == API_VERSION.major,
                format!("plugin built for interface {}, harness tests {API_VERSION}", t.api),
            )
        }),
        load_case("probe", |t| {
            let probe = t.device.backend().probe();
            Outcome::check(
                probe.device_count > t.index && probe.unavailable_reason.is_none(),
                format!("probe says {probe:?} although device {} opened", t.index),
            )
        }),
        load_case("capabilities", |t| {
            let mut seen = HashSet::new();
            for c in &t.capabilities {
                if c.op.name().is_none() {
                    return Outcome::fail(format!("claims op kind {:#x}, unknown to interface {API_VERSION}", c.op.0));
                }
                if DType::from_code(c.dtype).is_err() {
                    return Outcome::fail(format!("claims dtype code {} for {:?}", c.dtype, c.op.name()));
                }
                if !seen.insert((c.op, c.dtype)) {
                    return Outcome::fail(format!("claims ({:?}, {}) twice", c.op.name(), c.dtype));
                }
            }
            let kinds: HashSet<OpKind> = t.capabilities.iter().map(|c| c.op).collect();
            Outcome::check(!kinds.is_empty(), "the capability list is empty")
        }),
    ]
}
