//! The SFT training loop: a stopped and resumed run gives bit for bit the losses of one that
//! was not stopped (CPU), the stop flag saves a checkpoint, checkpoints are complete or absent,
//! a checkpoint of another model or other data is refused, and the saved folder loads back.

use genesis::models::qwen2::Qwen2ForCausalLM;
use genesis::nn::Module;
use genesis::sft::{read_jsonl, BadLinePolicy, SftBatches, SftConfig, SftEncoder, SftExample, SftOutcome, SftTrainer};
use genesis::{DType, Device, Tensor};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn base() -> PathBuf {
    root().join("tests/models/qwen2/sft-base")
}

fn model() -> Qwen2ForCausalLM {
    Qwen2ForCausalLM::from_pretrained(base(), &Device::cpu().unwrap(), DType::F32).unwrap()
}

fn examples(n: usize) -> Vec<SftExample> {
    let read = read_jsonl(root().join("tests/sft/train.jsonl"), BadLinePolicy::Stop).unwrap();
    let encoder = SftEncoder::from_folder(base()).unwrap();
    encoder.encode_all(&read.records[..n], 64).unwrap().0
}

fn config(steps: u64) -> SftConfig {
    SftConfig {
        max_steps: steps,
        batch_size: 4,
        grad_accum: 2,
        lr: 3e-3,
        warmup_steps: 2,
        save_every: 3,
        keep_checkpoints: 5,
        progress: false,
        ..SftConfig::default()
    }
}

fn out(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("genesis-sft-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_resumed_run_repeats_the_losses_of_an_uninterrupted_one_bit_for_bit() {
    let dir = out("resume");
    let data = examples(40);
    let eval = examples(48)[40..].to_vec();
    let whole = model();
    let mut trainer = SftTrainer::new(&whole, config(6), &dir).unwrap();
    let mut batches = SftBatches::new(data.clone(), 4, 7).unwrap();
    let straight = trainer.train(&mut batches, Some(&eval)).unwrap();
    assert_eq!(straight.outcome, SftOutcome::Finished);
    assert_eq!(straight.losses.len(), 6);
    assert!(straight.losses[5].1 < straight.losses[0].1, "{:?}", straight.losses);
    let checkpoint = dir.join("checkpoints/checkpoint-000003");
    assert!(checkpoint.join("model.safetensors").is_file() && checkpoint.join("config.json").is_file());

    // A fresh model and trainer, resumed from step 3, must see the same batches and updates.
    let resumed_model = model();
    let mut resumed = SftTrainer::new(&resumed_model, config(6), out("resume-2")).unwrap();
    let mut batches = SftBatches::new(data, 4, 7).unwrap();
    resumed.resume(&checkpoint, &mut batches).unwrap();
    assert_eq!(resumed.step(), 3);
    let rest = resumed.train(&mut batches, Some(&eval)).unwrap();
    let bits = |l: &[(u64, f64)]| l.iter().map(|(s, v)| (*s, v.to_bits())).collect::<Vec<_>>();
    assert_eq!(bits(&rest.losses), bits(&straight.losses[3..]));
    assert_eq!(bits(&rest.eval_losses), bits(&straight.eval_losses[straight.eval_losses.len() - 1..]));
    // The resumed run's metrics continue the first run's.
    assert_eq!(resumed.metrics().series("train_loss").len(), 6);
    for (a, b) in whole.named_parameters().iter().zip(resumed_model.named_parameters()) {
        assert_eq!(a.1.to_vec::<f32>().unwrap(), b.1.to_vec::<f32>().unwrap(), "{}", a.0);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_stop_flag_saves_a_checkpoint_and_resume_continues() {
    let dir = out("stop");
    let data = examples(16);
    let m = model();
    let mut trainer = SftTrainer::new(&m, SftConfig { save_every: 0, ..config(4) }, &dir).unwrap();
    let mut batches = SftBatches::new(data.clone(), 4, 1).unwrap();
    trainer.stop_flag().store(true, Ordering::Relaxed);
    let report = trainer.train(&mut batches, None).unwrap();
    assert_eq!((report.outcome, report.step), (SftOutcome::Stopped, 1));
    assert_eq!(report.checkpoints, vec![dir.join("checkpoints/checkpoint-000001")]);
    // The output folder names its newest checkpoint.
    let m2 = model();
    let mut again = SftTrainer::new(&m2, config(4), &dir).unwrap();
    let mut batches = SftBatches::new(data, 4, 1).unwrap();
    again.resume(&dir, &mut batches).unwrap();
    let report = again.train(&mut batches, None).unwrap();
    assert_eq!((report.outcome, report.step, report.losses.len()), (SftOutcome::Finished, 4, 3));
    std::fs::remove_dir_all(&dir).ok();
}

/// `train_for` runs a given number of steps and the next call continues: 1 + 2 + the rest
/// gives the losses of one uninterrupted run, with one optimizer throughout.
#[test]
fn train_for_runs_some_steps_and_the_next_call_continues() {
    let data = examples(16);
    let config = SftConfig { save_every: 0, ..config(4) };
    let straight_model = model();
    let mut straight = SftTrainer::new(&straight_model, config.clone(), out("whole")).unwrap();
    let whole = straight.train(&mut SftBatches::new(data.clone(), 4, 3).unwrap(), None).unwrap();
    let parts_model = model();
    let mut parts = SftTrainer::new(&parts_model, config, out("parts")).unwrap();
    let mut batches = SftBatches::new(data, 4, 3).unwrap();
    let first = parts.train_for(&mut batches, None, 1).unwrap();
    assert_eq!((first.outcome, first.step, first.losses.len()), (SftOutcome::Paused, 1, 1));
    let second = parts.train_for(&mut batches, None, 2).unwrap();
    assert_eq!((second.outcome, second.step), (SftOutcome::Paused, 3));
    let rest = parts.train_for(&mut batches, None, 10).unwrap();
    assert_eq!((rest.outcome, rest.step, rest.losses.len()), (SftOutcome::Finished, 4, 1));
    let losses: Vec<(u64, f64)> = [first.losses, second.losses, rest.losses].concat();
    let bits = |l: &[(u64, f64)]| l.iter().map(|(s, v)| (*s, v.to_bits())).collect::<Vec<_>>();
    assert_eq!(bits(&losses), bits(&whole.losses));
    std::fs::remove_dir_all(out("whole")).ok();
    std::fs::remove_dir_all(out("parts")).ok();
}

#[test]
fn only_complete_checkpoints_are_kept_and_the_newest_survive() {
    let dir = out("keep");
    let m = model();
    let cfg = SftConfig { save_every: 1, keep_checkpoints: 2, ..config(5) };
    let mut trainer = SftTrainer::new(&m, cfg, &dir).unwrap();
    let mut batches = SftBatches::new(examples(12), 4, 3).unwrap();
    trainer.train(&mut batches, None).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(dir.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["checkpoint-000003", "checkpoint-000004"]);
    assert!(dir.join("metrics.csv").is_file() && dir.join("curves.png").is_file());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn resuming_another_models_or_another_datasets_checkpoint_is_an_error() {
    let dir = out("refuse");
    let m = model();
    let mut trainer = SftTrainer::new(&m, SftConfig { save_every: 1, ..config(1) }, &dir).unwrap();
    trainer.train(&mut SftBatches::new(examples(8), 4, 0).unwrap(), None).unwrap();
    let saved = trainer.save_checkpoint(&SftBatches::new(examples(8), 4, 0).unwrap()).unwrap();

    let other_data = SftBatches::new(examples(12), 4, 0);
    let m2 = model();
    let mut t2 = SftTrainer::new(&m2, config(2), out("refuse-2")).unwrap();
    let err = t2.resume(&saved, &mut other_data.unwrap()).unwrap_err().to_string();
    assert!(err.contains("other data"), "{err}");

    let tiny = Qwen2ForCausalLM::from_pretrained(
        root().join("tests/models/qwen2/tiny-tied"),
        &Device::cpu().unwrap(),
        DType::F32,
    )
    .unwrap();
    let mut t3 = SftTrainer::new(&tiny, config(2), out("refuse-3")).unwrap();
    let err = t3.resume(&saved, &mut SftBatches::new(examples(8), 4, 0).unwrap()).unwrap_err().to_string();
    assert!(err.contains("another model"), "{err}");
    let err = t3.resume(dir.join("nowhere"), &mut SftBatches::new(examples(8), 4, 0).unwrap()).unwrap_err();
    assert!(err.to_string().contains("neither a checkpoint"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_checkpoints_model_folder_loads_with_the_trained_weights() {
    let dir = out("load");
    let m = model();
    let mut trainer = SftTrainer::new(&m, SftConfig { save_every: 1, ..config(2) }, &dir).unwrap();
    let mut batches = SftBatches::new(examples(8), 4, 0).unwrap();
    trainer.train(&mut batches, None).unwrap();
    let saved = trainer.save_checkpoint(&batches).unwrap();
    let loaded = Qwen2ForCausalLM::from_pretrained(&saved, &Device::cpu().unwrap(), DType::F32).unwrap();
    let ids = Tensor::from_vec(vec![1i64, 5, 9, 3], &[1, 4], &Device::cpu().unwrap()).unwrap();
    let (a, b) = (m.forward(&ids).unwrap(), loaded.forward(&ids).unwrap());
    assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    std::fs::remove_dir_all(&dir).ok();
}
