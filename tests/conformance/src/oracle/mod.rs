//! The f64 reference oracle: naive, obviously correct implementations fed the inputs
//! already rounded to the tested dtype. Vector-Jacobian products of the backward ops live in
//! `vjp` and are checked against finite differences in the unit tests.

pub mod conv;
pub mod nn;
pub mod scalar;
pub mod tensor;
