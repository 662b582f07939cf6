//! Optimizers and schedulers against PyTorch: parameters after each step and learning rates
//! per epoch written by tests/reference/make_optim_reference.py for the same configurations.

use genesis::optim::{
    Adam, AdamOptions, AdamW, CosineAnnealingLR, ExponentialLR, LambdaLR, LinearLR, LrScheduler, MultiStepLR,
    OneCycleLR, Optimizer, ParamGroup, SgdOptions, StepLR, WarmupCosineLR, SGD,
};
use genesis::{Device, Result, Tensor};
use safetensors::SafeTensors;

const STEPS: usize = 5;

struct Reference {
    bytes: Vec<u8>,
}

impl Reference {
    fn open() -> Reference {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/reference/optim.safetensors");
        Reference { bytes: std::fs::read(path).expect("tests/reference/optim.safetensors") }
    }

    fn f64s(&self, name: &str) -> (Vec<f64>, Vec<usize>) {
        let st = SafeTensors::deserialize(&self.bytes).expect("valid reference file");
        let t = st.tensor(name).unwrap_or_else(|_| panic!("reference has no `{name}`"));
        let values = match t.dtype() {
            safetensors::Dtype::F32 => {
                t.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect()
            }
            safetensors::Dtype::F64 => {
                t.data().chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()
            }
            other => panic!("unexpected dtype {other:?}"),
        };
        (values, t.shape().to_vec())
    }

    fn tensor(&self, name: &str, cpu: &Device) -> Result<Tensor> {
        let (v, shape) = self.f64s(name);
        Tensor::from_vec(v.into_iter().map(|x| x as f32).collect::<Vec<f32>>(), &shape, cpu)
    }
}

type MakeOptimizer = fn(Vec<Tensor>) -> Result<Box<dyn Optimizer>>;

fn sgd(o: SgdOptions) -> impl Fn(Vec<Tensor>) -> Result<Box<dyn Optimizer>> {
    move |ps| Ok(Box::new(SGD::new(ps, o.clone())?))
}

fn optimizer(name: &str) -> MakeOptimizer {
    match name {
        "sgd_plain" => |ps| sgd(SgdOptions { lr: 0.1, ..Default::default() })(ps),
        "sgd_momentum" => |ps| {
            sgd(SgdOptions { lr: 0.05, momentum: 0.9, dampening: 0.1, weight_decay: 0.01, ..Default::default() })(ps)
        },
        "sgd_nesterov" => |ps| {
            sgd(SgdOptions { lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.001, ..Default::default() })(ps)
        },
        "sgd_maximize" => |ps| sgd(SgdOptions { lr: 0.01, momentum: 0.5, maximize: true, ..Default::default() })(ps),
        "sgd_groups" => |ps| {
            let o = |lr, momentum| SgdOptions { lr, momentum, ..Default::default() };
            let groups = vec![
                ParamGroup::new(vec![ps[0].clone()], o(0.1, 0.5)),
                ParamGroup::new(vec![ps[1].clone()], o(0.01, 0.9)),
            ];
            Ok(Box::new(SGD::with_groups(groups)?))
        },
        "adam" => |ps| Ok(Box::new(Adam::new(ps, AdamOptions { lr: 0.01, ..Default::default() })?)),
        "adam_wd" => |ps| {
            let o = AdamOptions { lr: 0.01, betas: (0.8, 0.99), eps: 1e-6, weight_decay: 0.1, ..Default::default() };
            Ok(Box::new(Adam::new(ps, o)?))
        },
        "adamw" => {
            |ps| Ok(Box::new(AdamW::new(ps, AdamOptions { lr: 0.01, weight_decay: 0.1, ..Default::default() })?))
        }
        "adamw_maximize" => |ps| {
            Ok(Box::new(AdamW::new(
                ps,
                AdamOptions { lr: 0.01, weight_decay: 0.1, maximize: true, ..Default::default() },
            )?))
        },
        "adamw_groups" => |ps| {
            let g0 = AdamOptions { lr: 0.02, weight_decay: 0.05, ..Default::default() };
            let g1 = AdamOptions { lr: 0.005, weight_decay: 0.0, betas: (0.5, 0.9), ..Default::default() };
            let groups = vec![ParamGroup::new(vec![ps[0].clone()], g0), ParamGroup::new(vec![ps[1].clone()], g1)];
            Ok(Box::new(AdamW::with_groups(groups)?))
        },
        other => panic!("no optimizer case `{other}`"),
    }
}

const OPTIMIZERS: [&str; 10] = [
    "sgd_plain",
    "sgd_momentum",
    "sgd_nesterov",
    "sgd_maximize",
    "sgd_groups",
    "adam",
    "adam_wd",
    "adamw",
    "adamw_maximize",
    "adamw_groups",
];

/// `sum(c·p²) + sum(sin p)` over both parameters, as in the script.
fn loss(ps: &[Tensor], cs: &[Tensor]) -> Result<Tensor> {
    let mut total: Option<Tensor> = None;
    for (p, c) in ps.iter().zip(cs) {
        let term = c.mul(&p.square()?)?.sum()?.add(&p.sin()?.sum()?)?;
        total = Some(match total {
            None => term,
            Some(t) => t.add(&term)?,
        });
    }
    Ok(total.expect("two parameters"))
}

fn close(case: &str, what: &str, got: &[f64], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{case} {what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= atol + rtol * w.abs(), "{case} {what}[{i}]: genesis {g}, pytorch {w}");
    }
}

#[test]
fn optimizers_match_pytorch() -> Result<()> {
    let cpu = Device::cpu()?;
    let r = Reference::open();
    let coefs = [r.tensor("coef.p0", &cpu)?, r.tensor("coef.p1", &cpu)?];
    for case in OPTIMIZERS {
        let ps: Vec<Tensor> =
            (0..2).map(|i| r.tensor(&format!("init.p{i}"), &cpu)?.requires_grad_(true)).collect::<Result<_>>()?;
        let mut opt = optimizer(case)(ps.clone())?;
        for k in 0..STEPS {
            opt.zero_grad();
            loss(&ps, &coefs)?.backward()?;
            opt.step()?;
            for (i, p) in ps.iter().enumerate() {
                let (want, shape) = r.f64s(&format!("{case}.step{k}.p{i}"));
                assert_eq!(p.shape(), &shape[..]);
                close(case, &format!("step {k} p{i}"), &p.to_f64_vec()?, &want, 1e-5, 1e-6);
            }
        }
    }
    Ok(())
}

type MakeScheduler = fn(&mut dyn Optimizer) -> Result<LrScheduler>;

fn scheduler(name: &str) -> MakeScheduler {
    match name {
        "step" => |o| StepLR::new(o, 3, 0.5),
        "multistep" => |o| MultiStepLR::new(o, &[2, 5, 5, 8], 0.3),
        "exponential" => |o| ExponentialLR::new(o, 0.9),
        "cosine" => |o| CosineAnnealingLR::new(o, 6, 0.001),
        "linear" => |o| LinearLR::new(o, 0.25, 1.0, 4),
        "lambda" => |o| LambdaLR::new(o, |e| 0.95f64.powi(e as i32) / (1.0 + 0.1 * e as f64)),
        "warmup_cosine" => |o| WarmupCosineLR::new(o, 3, 10, 0.1),
        "onecycle" => |o| OneCycleLR::new(o, &[0.5, 0.1], 10, 0.3, 25.0, 1e4),
        other => panic!("no scheduler case `{other}`"),
    }
}

const SCHEDULERS: [&str; 8] =
    ["step", "multistep", "exponential", "cosine", "linear", "lambda", "warmup_cosine", "onecycle"];

fn two_group_sgd(cpu: &Device) -> Result<SGD> {
    let p0 = Tensor::zeros(&[2], genesis::DType::F32, cpu)?.requires_grad_(true)?;
    let p1 = Tensor::zeros(&[3], genesis::DType::F32, cpu)?.requires_grad_(true)?;
    let o = |lr| SgdOptions { lr, ..Default::default() };
    SGD::with_groups(vec![ParamGroup::new(vec![p0], o(0.1)), ParamGroup::new(vec![p1], o(0.02))])
}

#[test]
fn schedulers_match_pytorch() -> Result<()> {
    let cpu = Device::cpu()?;
    let r = Reference::open();
    for case in SCHEDULERS {
        let (want, shape) = r.f64s(&format!("{case}.lrs"));
        let mut opt = two_group_sgd(&cpu)?;
        let mut sched = scheduler(case)(&mut opt)?;
        let mut got = opt.lrs();
        assert_eq!(sched.last_lrs(), &got[..], "{case}: last_lrs after creation");
        for _ in 1..shape[0] {
            opt.step()?;
            sched.step(&mut opt)?;
            assert_eq!(sched.last_lrs(), &opt.lrs()[..], "{case}: last_lrs");
            got.extend(opt.lrs());
        }
        close(case, "lr", &got, &want, 1e-12, 1e-15);
    }
    Ok(())
}

/// A scheduler restored from its state dict sets the same learning rates as one that ran on.
#[test]
fn scheduler_state_dict_resumes() -> Result<()> {
    let cpu = Device::cpu()?;
    for case in SCHEDULERS {
        let mut opt = two_group_sgd(&cpu)?;
        let mut sched = scheduler(case)(&mut opt)?;
        for _ in 0..4 {
            sched.step(&mut opt)?;
        }
        let saved = sched.state_dict();
        let mut opt2 = two_group_sgd(&cpu)?;
        let mut sched2 = scheduler(case)(&mut opt2)?;
        sched2.load_state_dict(&saved, &mut opt2)?;
        assert_eq!(opt2.lrs(), opt.lrs(), "{case}: after load");
        for _ in 0..3 {
            sched.step(&mut opt)?;
            sched2.step(&mut opt2)?;
            assert_eq!(opt2.lrs(), opt.lrs(), "{case}: after resume");
        }
    }
    Ok(())
}

#[test]
fn onecycle_refuses_steps_past_the_end() -> Result<()> {
    let cpu = Device::cpu()?;
    let mut opt = two_group_sgd(&cpu)?;
    let mut sched = OneCycleLR::new(&mut opt, &[0.5], 4, 0.3, 25.0, 1e4)?;
    for _ in 0..3 {
        sched.step(&mut opt)?;
    }
    let before = opt.lrs();
    let err = sched.step(&mut opt).unwrap_err();
    assert!(err.message().contains("total steps"), "{err}");
    assert_eq!(opt.lrs(), before);
    assert_eq!(sched.last_epoch(), 3);
    Ok(())
}
