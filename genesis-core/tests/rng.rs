//! The global generator: seeding, state round trips, fork_rng. Its own test binary, since
//! other tests drawing random numbers concurrently would move the shared state.

use genesis::random::{fork_rng, get_rng_state, set_rng_state};
use genesis::{manual_seed, DType, Device, Tensor};

fn cpu() -> Device {
    Device::parse("cpu").unwrap()
}

#[test]
fn seeds_reproduce_and_rng_state_round_trips() {
    let d = cpu();
    manual_seed(42);
    let a = Tensor::randn(&[16], DType::F32, &d).unwrap().to_vec::<f32>().unwrap();
    let state = get_rng_state();
    let b = Tensor::rand(&[16], DType::F32, &d).unwrap().to_vec::<f32>().unwrap();
    set_rng_state(state);
    let b2 = Tensor::rand(&[16], DType::F32, &d).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(b, b2);
    manual_seed(42);
    assert_eq!(Tensor::randn(&[16], DType::F32, &d).unwrap().to_vec::<f32>().unwrap(), a);
    let inside = fork_rng(|| Tensor::rand(&[4], DType::F32, &d).unwrap().to_vec::<f32>().unwrap());
    let after = Tensor::rand(&[4], DType::F32, &d).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(inside, after, "fork_rng restores the state");
}
