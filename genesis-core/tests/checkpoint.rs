//! Training checkpoints: round trip, atomic replacement under an injected write failure, and
//! resuming gives the same losses as training on without a break.
//!
//! Only `resume_gives_the_same_losses` draws from the default generator, so tests running in
//! parallel in this binary cannot disturb its random stream.

use genesis::checkpoint::Checkpoint;
use genesis::optim::{AdamOptions, AdamW, LrScheduler, Optimizer, WarmupCosineLR};
use genesis::random::{get_rng_state, manual_seed, set_rng_state};
use genesis::serialize::{write_atomically, StateDict};
use genesis::{no_grad, DType, Device, ErrorKind, Result, Tensor};
use std::io::Write;
use std::path::PathBuf;

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("genesis-checkpoint-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A 2-layer MLP made of raw tensors: x (b, 4) -> tanh(x W1 + b1) W2 + b2 -> (b, 1).
struct Mlp {
    params: Vec<Tensor>,
}

const NAMES: [&str; 4] = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"];

impl Mlp {
    /// Parameters from a fixed formula (`salt` changes them), so no random numbers are drawn.
    fn new(cpu: &Device, salt: f64) -> Result<Mlp> {
        let make = |shape: &[usize], k: f64| -> Result<Tensor> {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n).map(|i| ((i as f64 * k + salt).sin() * 0.5) as f32).collect();
            Tensor::from_vec(v, shape, cpu)?.requires_grad_(true)
        };
        Ok(Mlp { params: vec![make(&[4, 8], 0.7)?, make(&[8], 1.3)?, make(&[8, 1], 0.9)?, make(&[1], 2.1)?] })
    }

    fn loss(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        let p = &self.params;
        let h = x.matmul(&p[0])?.add(&p[1])?.tanh()?;
        h.matmul(&p[2])?.add(&p[3])?.sub(y)?.square()?.mean()
    }

    fn state_dict(&self) -> Result<StateDict> {
        NAMES.iter().zip(&self.params).map(|(n, p)| Ok((n.to_string(), no_grad(|| p.copy())?))).collect()
    }

    fn load_state_dict(&self, sd: &StateDict) -> Result<()> {
        no_grad(|| NAMES.iter().zip(&self.params).try_for_each(|(n, p)| p.copy_(&sd[*n])))
    }
}

struct Run {
    model: Mlp,
    opt: AdamW,
    sched: LrScheduler,
}

impl Run {
    fn new(cpu: &Device, salt: f64) -> Result<Run> {
        let model = Mlp::new(cpu, salt)?;
        let mut opt = AdamW::new(model.params.clone(), AdamOptions { lr: 0.05, ..AdamOptions::adamw() })?;
        let sched = WarmupCosineLR::new(&mut opt, 3, 20, 0.1)?;
        Ok(Run { model, opt, sched })
    }

    /// One step on a fresh random batch from the default generator.
    fn step(&mut self, cpu: &Device) -> Result<f32> {
        let x = Tensor::randn(&[16, 4], DType::F32, cpu)?;
        let y = x.sum_dims(&[1], true)?.sin()?;
        self.opt.zero_grad();
        let loss = self.model.loss(&x, &y)?;
        loss.backward()?;
        self.opt.step()?;
        self.sched.step(&mut self.opt)?;
        loss.item::<f32>()
    }

    fn checkpoint(&self, step: u64) -> Result<Checkpoint> {
        Ok(Checkpoint {
            model: self.model.state_dict()?,
            optimizer: Some(self.opt.state_dict()?),
            scheduler: Some(self.sched.state_dict()),
            rng: Some(get_rng_state()),
            step,
            metadata: [("run".to_string(), "resume-test".to_string())].into(),
            ..Default::default()
        })
    }

    fn restore(&mut self, c: &Checkpoint) -> Result<()> {
        self.model.load_state_dict(&c.model)?;
        self.opt.load_state_dict(c.optimizer.as_ref().expect("optimizer state"))?;
        self.sched.load_state_dict(c.scheduler.as_ref().expect("scheduler state"), &mut self.opt)?;
        set_rng_state(c.rng.expect("rng state"));
        Ok(())
    }
}

#[test]
fn resume_gives_the_same_losses() -> Result<()> {
    let cpu = Device::cpu()?;
    let path = temp_dir("resume").join("ckpt.safetensors");

    manual_seed(1234);
    let mut straight = Run::new(&cpu, 0.0)?;
    let losses: Vec<f32> = (0..12).map(|_| straight.step(&cpu)).collect::<Result<_>>()?;

    manual_seed(1234);
    let mut first = Run::new(&cpu, 0.0)?;
    for _ in 0..6 {
        first.step(&cpu)?;
    }
    first.checkpoint(6)?.save(&path)?;
    drop(first);

    // A fresh process would start from other weights and another random state.
    manual_seed(999);
    let mut resumed = Run::new(&cpu, 5.0)?;
    let c = Checkpoint::load(&path, &cpu)?;
    assert_eq!(c.step, 6);
    assert_eq!(c.metadata["run"], "resume-test");
    resumed.restore(&c)?;
    let after: Vec<f32> = (0..6).map(|_| resumed.step(&cpu)).collect::<Result<_>>()?;
    assert_eq!(after, losses[6..], "losses after resuming differ from the uninterrupted run");
    assert!(losses[11] < losses[0], "the model should learn: {losses:?}");
    Ok(())
}

fn small_checkpoint(cpu: &Device, step: u64) -> Result<Checkpoint> {
    let mut model = StateDict::new();
    model.insert("w".into(), Tensor::from_vec(vec![step as f32; 6], &[2, 3], cpu)?);
    Ok(Checkpoint { model, step, extra: [("scale".to_string(), 0.1)].into(), ..Default::default() })
}

#[test]
fn round_trip_keeps_every_part() -> Result<()> {
    let cpu = Device::cpu()?;
    let model = Mlp::new(&cpu, 1.0)?;
    let mut opt = AdamW::new(model.params.clone(), AdamOptions::adamw())?;
    let x = Tensor::ones(&[2, 4], DType::F32, &cpu)?;
    model.loss(&x, &Tensor::zeros(&[2, 1], DType::F32, &cpu)?)?.backward()?;
    opt.step()?;
    let mut sched_opt = AdamW::new(Mlp::new(&cpu, 2.0)?.params, AdamOptions::adamw())?;
    let sched = WarmupCosineLR::new(&mut sched_opt, 2, 10, 0.0)?;
    let c = Checkpoint {
        model: model.state_dict()?,
        optimizer: Some(opt.state_dict()?),
        scheduler: Some(sched.state_dict()),
        extra: [("grad_scaler.scale".to_string(), 32768.0), ("tiny".to_string(), 1e-300)].into(),
        rng: Some(genesis::random::RngState { seed: u64::MAX, offset: 12345 }),
        step: 77,
        metadata: [("note".to_string(), "a=b, c".to_string())].into(),
    };
    let path = temp_dir("roundtrip").join("c.ckpt");
    c.save(&path)?;
    let back = Checkpoint::load(&path, &cpu)?;
    assert_eq!(back.step, 77);
    assert_eq!(back.rng, c.rng);
    assert_eq!(back.metadata, c.metadata);
    assert_eq!(back.extra, c.extra);
    assert_eq!(back.scheduler, c.scheduler);
    let (o, ob) = (c.optimizer.as_ref().unwrap(), back.optimizer.as_ref().unwrap());
    assert_eq!(ob.kind, o.kind);
    assert_eq!(ob.scalars, o.scalars);
    assert_eq!(ob.tensors.keys().collect::<Vec<_>>(), o.tensors.keys().collect::<Vec<_>>());
    for (k, t) in &o.tensors {
        assert_eq!(ob.tensors[k].to_vec::<f32>()?, t.to_vec::<f32>()?, "{k}");
    }
    for (k, t) in &c.model {
        assert_eq!(back.model[k].to_vec::<f32>()?, t.to_vec::<f32>()?, "{k}");
    }
    // The optimizer state loads into a twin optimizer.
    let twin = Mlp::new(&cpu, 3.0)?;
    let mut twin_opt = AdamW::new(twin.params.clone(), AdamOptions::adamw())?;
    twin_opt.load_state_dict(ob)?;
    Ok(())
}

/// A save that fails halfway (as a crash or a full disk would) leaves the last good
/// checkpoint loadable and no temporary file behind.
#[test]
fn failed_save_keeps_the_previous_checkpoint() -> Result<()> {
    let cpu = Device::cpu()?;
    let dir = temp_dir("atomic");
    let path = dir.join("last.ckpt");
    small_checkpoint(&cpu, 1)?.save(&path)?;
    let newer = small_checkpoint(&cpu, 2)?.to_bytes()?;
    let err = write_atomically(&path, |f| {
        f.write_all(&newer[..newer.len() / 2])?;
        Err(std::io::Error::other("injected failure after half the bytes"))
    })
    .unwrap_err();
    assert!(err.message().contains("injected failure") && err.message().contains("last.ckpt"), "{err}");
    let kept = Checkpoint::load(&path, &cpu)?;
    assert_eq!(kept.step, 1);
    assert_eq!(kept.model["w"].to_vec::<f32>()?, vec![1.0; 6]);
    let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("last.ckpt")]);
    // A save that succeeds replaces it.
    small_checkpoint(&cpu, 2)?.save(&path)?;
    assert_eq!(Checkpoint::load(&path, &cpu)?.step, 2);
    Ok(())
}

#[test]
fn a_plain_state_dict_is_not_a_checkpoint() -> Result<()> {
    let cpu = Device::cpu()?;
    let path = temp_dir("plain").join("weights.safetensors");
    let mut sd = StateDict::new();
    sd.insert("w".into(), Tensor::ones(&[2], DType::F32, &cpu)?);
    genesis::serialize::save(&path, &sd, &Default::default())?;
    let err = Checkpoint::load(&path, &cpu).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LoadFailed);
    assert!(
        err.message().contains("weights.safetensors") && err.message().contains("not a Genesis checkpoint"),
        "{err}"
    );
    Ok(())
}

/// Bytes changed inside a tensor's data are an error naming the tensor (the checksum saved
/// with each tensor), unless the caller asks to load without verification.
#[test]
fn a_damaged_checkpoint_is_an_error_naming_the_tensor() -> Result<()> {
    let cpu = Device::cpu()?;
    let path = temp_dir("damaged").join("c.ckpt");
    small_checkpoint(&cpu, 3)?.save(&path)?;
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1; // inside the data of the only tensor, `model.w`
    bytes[last] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let err = Checkpoint::load(&path, &cpu).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LoadFailed);
    assert!(err.message().contains("`model.w`") && err.message().contains("checksum"), "{err}");
    let salvaged = Checkpoint::load_unverified(&path, &cpu)?;
    assert_ne!(salvaged.model["w"].to_vec::<f32>()?, vec![3.0; 6]);
    Ok(())
}

/// A crash mid-save leaves its temporary file; the next save or load of that checkpoint
/// removes those of processes that no longer run, and keeps this process's own.
#[test]
fn temporaries_of_crashed_saves_are_cleaned_up() -> Result<()> {
    let cpu = Device::cpu()?;
    let dir = temp_dir("stale");
    let path = dir.join("last.ckpt");
    // A pid above the kernel's limit (4,194,304) never runs.
    let stale = |n: u32| dir.join(format!(".last.ckpt.tmp-4294967{n:03}-0"));
    let own = dir.join(format!(".last.ckpt.tmp-{}-999", std::process::id()));
    let other = dir.join(".other.ckpt.tmp-4294967000-0");
    for f in [stale(1), own.clone(), other.clone()] {
        std::fs::write(&f, vec![0u8; 1024]).unwrap();
    }
    small_checkpoint(&cpu, 1)?.save(&path)?;
    assert!(!stale(1).exists(), "the save removed the dead process's temporary");
    assert!(own.exists() && other.exists(), "this process's own and another file's stay");
    std::fs::write(stale(2), b"partial").unwrap();
    Checkpoint::load(&path, &cpu)?;
    assert!(!stale(2).exists(), "the load removed it too");
    Ok(())
}
