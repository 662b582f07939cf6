#![warn(missing_docs)]
//! # genesis-conformance
//!
//! The conformance harness of Genesis backends: loads a backend through the core's loader,
//! reads its capability list, runs suites in dependency order against an f64 oracle with the
//! tolerances of `NUMERICS.md` (the normative numerical contract), and reports a terminal
//! table, JSON and JUnit. The verdict is about the backend's claims; beside it the report says
//! for which float dtypes the claims cover the SDK's required set ([`required`]). The CLI (`genesis-conformance`) is the authority for a conformance
//! claim; [`fixtures`] gives plugin authors the same cases inside their own `cargo test`.

pub mod case;
pub mod cli;
pub mod expectations;
pub mod fixtures;
pub mod gen;
pub mod oracle;
pub mod report;
pub mod required;
pub mod runner;
pub mod suites;
pub mod target;
pub mod tolerance;
pub mod values;
