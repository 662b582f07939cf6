//! Collectives over the devices of one backend, from one process (like
//! `torch.cuda.comm` and single-process NCCL): the building block of data-parallel training,
//! where every device holds a replica and the gradients are summed across them.
//!
//! Each function takes one tensor per participating device, in rank order; the devices must be
//! distinct and belong to one backend. The work is queued on every device like any other op.
//! The CUDA backend runs them through NCCL; a backend without its own implementation runs the
//! interface's host-staged default. Results carry no autograd history.

use crate::autograd::no_grad;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use genesis_backend_api::{CollectiveArg, CollectiveOp};

/// Every tensor becomes the elementwise sum of all of them, in place (the step that makes
/// data-parallel gradients equal on every replica).
pub fn all_reduce_sum_(tensors: &[Tensor]) -> Result<()> {
    let dense = dense(CollectiveOp::AllReduceSum, tensors)?;
    let args = pairs(&dense, &dense)?;
    run(CollectiveOp::AllReduceSum, tensors, &args)?;
    // A non-contiguous tensor was summed in a dense copy: write the result back.
    for (t, d) in tensors.iter().zip(&dense) {
        if !t.shares_storage(d) {
            no_grad(|| t.copy_(d))?;
        } else {
            t.storage().bump_version();
        }
    }
    Ok(())
}

/// The elementwise sum of `tensors`, one copy on each of their devices.
pub fn all_reduce_sum(tensors: &[Tensor]) -> Result<Vec<Tensor>> {
    collect(CollectiveOp::AllReduceSum, tensors, |t| t.shape().to_vec())
}

/// Copies of `tensor` on each of `devices` (which must include the tensor's own device; the
/// copy there is a new tensor too).
pub fn broadcast(tensor: &Tensor, devices: &[Device]) -> Result<Vec<Tensor>> {
    let Some(root) = devices.iter().position(|d| d == tensor.device()) else {
        return Err(Error::invalid(format!(
            "broadcast: the source's device {} is not among the targets",
            tensor.device()
        )));
    };
    let source = no_grad(|| tensor.contiguous())?;
    let outputs: Vec<Tensor> =
        devices.iter().map(|d| Tensor::empty(tensor.shape(), tensor.dtype(), d)).collect::<Result<_>>()?;
    // The interface's root is rank 0: the source's device goes first. The other ranks
    // contribute nothing: their input is their output (in place).
    let ranks = std::iter::once(root).chain((0..devices.len()).filter(|&i| i != root));
    let (inputs, rank_outputs): (Vec<Tensor>, Vec<Tensor>) =
        ranks.map(|i| (if i == root { source.clone() } else { outputs[i].clone() }, outputs[i].clone())).unzip();
    run(CollectiveOp::Broadcast, &inputs, &pairs(&inputs, &rank_outputs)?)?;
    Ok(outputs)
}

/// Every device gets all the tensors concatenated along dim 0, in rank order.
pub fn all_gather(tensors: &[Tensor]) -> Result<Vec<Tensor>> {
    let n = tensors.len();
    collect(CollectiveOp::AllGather, tensors, |t| scaled_rows(t.shape(), |rows| rows * n))
}

/// Rank r gets chunk r (along dim 0, which must split into equal chunks) of the sum of all
/// the tensors.
pub fn reduce_scatter_sum(tensors: &[Tensor]) -> Result<Vec<Tensor>> {
    let n = tensors.len().max(1);
    collect(CollectiveOp::ReduceScatterSum, tensors, |t| scaled_rows(t.shape(), |rows| rows / n))
}

fn scaled_rows(shape: &[usize], f: impl Fn(usize) -> usize) -> Vec<usize> {
    // A scalar is refused by the interface's checks with a message that says why.
    shape.iter().enumerate().map(|(d, &s)| if d == 0 { f(s) } else { s }).collect()
}

/// Run `op` with new outputs of `out_shape(input)` on each input's device.
fn collect(op: CollectiveOp, tensors: &[Tensor], out_shape: impl Fn(&Tensor) -> Vec<usize>) -> Result<Vec<Tensor>> {
    let inputs = dense(op, tensors)?;
    let outputs: Vec<Tensor> =
        inputs.iter().map(|t| Tensor::empty(&out_shape(t), t.dtype(), t.device())).collect::<Result<_>>()?;
    run(op, &inputs, &pairs(&inputs, &outputs)?)?;
    Ok(outputs)
}

/// Contiguous versions of `tensors` (the interface takes dense operands), after checking
/// that there is at least one and that they share a backend.
fn dense(op: CollectiveOp, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
    let Some(first) = tensors.first() else {
        return Err(Error::invalid(format!("{}: no tensors", op.name())));
    };
    for t in tensors {
        if !std::ptr::eq(t.device().backend(), first.device().backend()) {
            return Err(Error::invalid(format!(
                "{}: tensors on {} and {} belong to different backends",
                op.name(),
                first.device(),
                t.device()
            )));
        }
    }
    no_grad(|| tensors.iter().map(Tensor::contiguous).collect())
}

fn pairs(inputs: &[Tensor], outputs: &[Tensor]) -> Result<Vec<CollectiveArg>> {
    inputs
        .iter()
        .zip(outputs)
        .map(|(i, o)| Ok(CollectiveArg { device: i.device().index() as u32, input: i.desc()?, output: o.desc()? }))
        .collect()
}

/// Hand the descriptors to the backend of `on` (the inputs; `dense` checked there is one).
fn run(op: CollectiveOp, on: &[Tensor], args: &[CollectiveArg]) -> Result<()> {
    let backend = on.first().map(|t| t.device().backend()).ok_or_else(|| Error::invalid("no tensors"))?;
    backend.collective(op, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu() -> Device {
        Device::cpu().unwrap()
    }

    /// One device is a valid world: each collective reduces to a copy.
    #[test]
    fn a_world_of_one_device() {
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &cpu()).unwrap();
        let y = all_reduce_sum(std::slice::from_ref(&x)).unwrap();
        assert_eq!(y[0].to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        assert!(!y[0].shares_storage(&x));
        let g = all_gather(&[x.t().unwrap()]).unwrap();
        assert_eq!(g[0].shape(), &[2, 2]);
        assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
        let b = broadcast(&x, &[x.device().clone()]).unwrap();
        assert_eq!(b[0].to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        let s = reduce_scatter_sum(std::slice::from_ref(&x)).unwrap();
        assert_eq!(s[0].to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        // In place through a transposed view: the result lands in the view's own storage.
        let xt = x.t().unwrap();
        all_reduce_sum_(std::slice::from_ref(&xt)).unwrap();
        assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn bad_calls_are_errors() {
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &cpu()).unwrap();
        assert!(all_reduce_sum(&[]).unwrap_err().to_string().contains("no tensors"));
        // The same device twice is refused by the interface's checks.
        let e = all_reduce_sum(&[x.clone(), x.clone()]).unwrap_err();
        assert!(e.to_string().contains("appears twice"), "{e}");
        let s = Tensor::from_slice(&[1.0f32], &[], &cpu()).unwrap();
        assert!(all_gather(&[s]).unwrap_err().to_string().contains("rank 1 or more"));
        let b = Tensor::from_slice(&[true, false], &[2], &cpu()).unwrap();
        assert!(all_reduce_sum(&[b]).is_err());
    }
}
