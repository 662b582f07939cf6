//! Optimizers, learning-rate schedulers, gradient clipping and dynamic loss scaling, with
//! PyTorch's update rules.
//!
//! Parameters are leaf tensors that require grad (what a module's `parameters()` returns:
//! shared handles, so updating them in place updates the model). An optimizer reads each
//! parameter's `.grad`, skips parameters without one, and writes the update in place under
//! [`no_grad`](crate::no_grad).
//!
//! ```
//! use genesis::optim::{Optimizer, SgdOptions, SGD};
//! use genesis::{DType, Device, Tensor};
//! let cpu = Device::cpu()?;
//! let w = Tensor::from_vec(vec![1.0f32, -2.0], &[2], &cpu)?.requires_grad_(true)?;
//! let mut opt = SGD::new(vec![w.clone()], SgdOptions { lr: 0.1, ..Default::default() })?;
//! w.square()?.sum()?.backward()?; // d/dw = 2w
//! opt.step()?;
//! opt.zero_grad();
//! assert_eq!(w.to_vec::<f32>()?, vec![0.8, -1.6]);
//! # Ok::<(), genesis::Error>(())
//! ```

mod adam;
mod clip;
mod grad_scaler;
mod groups;
mod scheduler;
mod sgd;

pub use adam::{Adam, AdamOptions, AdamW};
pub use clip::{clip_coefficient, clip_grad_norm_, clip_grad_value_, get_total_norm};
pub use grad_scaler::{GradScaler, GradScalerOptions};
pub use groups::{GroupOptions, OptimState, ParamGroup};
pub use scheduler::{
    CosineAnnealingLR, ExponentialLR, LambdaLR, LinearLR, LrScheduler, MultiStepLR, OneCycleLR, SchedulerState, StepLR,
    WarmupCosineLR,
};
pub use sgd::{SgdOptions, SGD};

use crate::error::Result;
use crate::tensor::Tensor;

/// What every optimizer offers: a step, clearing gradients, reading and setting the learning
/// rate of each parameter group (schedulers use this), and saving and restoring its state.
pub trait Optimizer: Send {
    /// Update every parameter that has a gradient, in place.
    fn step(&mut self) -> Result<()>;

    /// All parameters, group by group, in order.
    fn params(&self) -> Vec<Tensor>;

    /// Clear every parameter's gradient (`set_to_none=True`, PyTorch's default).
    fn zero_grad(&mut self) {
        for p in self.params() {
            p.zero_grad();
        }
    }

    /// The learning rate of each parameter group.
    fn lrs(&self) -> Vec<f64>;

    /// Set the learning rate of each parameter group; `lrs` must have one value per group.
    fn set_lrs(&mut self, lrs: &[f64]) -> Result<()>;

    /// The optimizer's hyperparameters and per-parameter state (momentum buffers, moments,
    /// step counts), as [`OptimState`].
    fn state_dict(&self) -> Result<OptimState>;

    /// Restore a state saved by [`state_dict`](Optimizer::state_dict). A state made for other
    /// parameters (another optimizer kind, group count, parameter count or shape) is an error
    /// and leaves the optimizer unchanged.
    fn load_state_dict(&mut self, state: &OptimState) -> Result<()>;
}
