//! ResNet against torchvision on the committed fixtures (tests/models/resnet, written by its
//! make_fixtures.py): logits in eval and train mode, the loss, every parameter and running
//! statistic after one SGD step, and eval logits after it; state-dict round trips; bad input.
//!
//! `GENESIS_TEST_DEVICE` picks the device (default `cpu`); `GENESIS_RESNET_FIXTURES` overrides
//! the fixture folder (every `*.safetensors` in it is checked, so the full-size resnet50
//! fixture made on the GPU machine is checked by adding it to a copy of the folder).

mod common;

use common::device;
use genesis::models::resnet::{BlockKind, ResNet, ResNetConfig};
use genesis::nn::{CrossEntropyLoss, Module};
use genesis::optim::{Optimizer, SgdOptions, SGD};
use genesis::serialize::StateDict;
use genesis::{no_grad, DType, Device, ErrorKind, Tensor};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    common::fixtures("GENESIS_RESNET_FIXTURES", "resnet")
}

/// The largest |ours - torchvision| over two tensors of the same shape.
fn max_abs_diff(ours: &Tensor, reference: &Tensor) -> f64 {
    assert_eq!(ours.shape(), reference.shape());
    let (a, b) = (ours.to_f64_vec().unwrap(), reference.to_f64_vec().unwrap());
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

fn config_of(meta: &Value) -> ResNetConfig {
    let list = |k: &str| meta[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    let block = if meta["block"] == "basic" { BlockKind::Basic } else { BlockKind::Bottleneck };
    ResNetConfig {
        block,
        layers: list("layers"),
        widths: list("widths"),
        stem_width: meta["stem_width"].as_u64().unwrap() as usize,
        num_classes: meta["num_classes"].as_u64().unwrap() as usize,
        ..ResNetConfig::resnet18(1)
    }
}

fn with_prefix(tensors: &StateDict, prefix: &str) -> StateDict {
    tensors.iter().filter_map(|(k, v)| k.strip_prefix(prefix).map(|name| (name.to_string(), v.clone()))).collect()
}

/// Run the fixture's sequence (eval forward; train forward, loss, backward, SGD step; eval
/// forward) and return, per compared quantity, the largest difference from torchvision and
/// the bound it must stay within: 1e-4 (the bound for f32 logits), or 4 times the
/// distance of PyTorch's own f32 result from f64 where f32 rounding alone is larger than that
/// (a randomly initialized ResNet-50 in training mode; make_fixtures.py explains).
fn replay(path: &Path, device: &Device) -> Vec<(String, f64, f64)> {
    let (tensors, metadata) = genesis::serialize::load_with_metadata(path, device).unwrap();
    let meta: Value = serde_json::from_str(&metadata["config"]).unwrap();
    let f32_error: Value = serde_json::from_str(&metadata["f32_error"]).unwrap();
    let bound = |key: &str| f64::max(1e-4, 4.0 * f32_error[key].as_f64().unwrap());
    let model = ResNet::new(&config_of(&meta), device).unwrap();
    model.load_state_dict(&with_prefix(&tensors, "init."), true).unwrap();
    let (x, y) = (&tensors["x"], &tensors["y"]);
    let mut diffs = Vec::new();

    model.eval();
    let logits = no_grad(|| model.forward(x)).unwrap();
    let mut check =
        |key: &str, ours: &Tensor| diffs.push((key.to_string(), max_abs_diff(ours, &tensors[key]), bound(key)));
    check("logits_eval", &logits);

    model.train(true);
    let options = SgdOptions {
        lr: meta["lr"].as_f64().unwrap(),
        momentum: meta["momentum"].as_f64().unwrap(),
        weight_decay: meta["weight_decay"].as_f64().unwrap(),
        ..Default::default()
    };
    let mut sgd = SGD::new(model.parameters(), options).unwrap();
    let logits = model.forward(x).unwrap();
    let loss = CrossEntropyLoss::default().forward(&logits, y).unwrap();
    loss.backward().unwrap();
    sgd.step().unwrap();
    check("logits_train", &logits.detach());
    check("loss", &loss.reshape(&[1]).unwrap());
    let state = model.state_dict();
    let stepped = with_prefix(&tensors, "step.");
    assert_eq!(state.keys().collect::<Vec<_>>(), stepped.keys().collect::<Vec<_>>());
    for name in stepped.keys() {
        check(&format!("step.{name}"), &state[name]);
    }

    model.eval();
    let logits = no_grad(|| model.forward(x)).unwrap();
    check("logits_eval_after", &logits);
    diffs
}

#[test]
fn resnets_match_torchvision_in_eval_and_train_mode_and_after_one_sgd_step() {
    let device = device();
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "expected the basic and bottleneck fixtures in {}", fixtures().display());
    for path in files {
        let diffs = replay(&path, &device);
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        for (what, diff, bound) in &diffs {
            if !what.starts_with("step.") {
                println!("{file} {what}: max |ours - torchvision| = {diff:.2e} (bound {bound:.1e})");
            }
        }
        let step = diffs.iter().filter(|d| d.0.starts_with("step.")).max_by(|a, b| (a.1 / a.2).total_cmp(&(b.1 / b.2)));
        if let Some((what, diff, bound)) = step {
            println!("{file} state after the step, nearest its bound: {what} {diff:.2e} (bound {bound:.1e})");
        }
        for (what, diff, bound) in diffs {
            assert!(diff <= bound, "{file}: {what} differs from torchvision by {diff:.3e} (bound {bound:.1e})");
        }
    }
}

#[test]
fn torchvision_parameter_counts() {
    let cpu = Device::cpu().unwrap();
    // torchvision's published sizes.
    for (config, params) in [(ResNetConfig::resnet18(1000), 11_689_512), (ResNetConfig::resnet50(1000), 25_557_032)] {
        assert_eq!(ResNet::new(&config, &cpu).unwrap().num_parameters(), params, "{config:?}");
    }
}

fn narrow(block: BlockKind, layers: Vec<usize>) -> ResNetConfig {
    ResNetConfig { block, layers, widths: vec![4, 8, 8, 16], stem_width: 4, ..ResNetConfig::resnet18(5) }
}

#[test]
fn state_dict_round_trips_through_safetensors() {
    let cpu = Device::cpu().unwrap();
    let config = narrow(BlockKind::Bottleneck, vec![1, 2, 1, 1]);
    genesis::manual_seed(3);
    let a = ResNet::new(&config, &cpu).unwrap();
    let x = genesis::Generator::new(0).normal(&[2, 3, 32, 32], 0.0, 1.0, DType::F32, &cpu).unwrap();
    a.forward(&x).unwrap(); // move the running statistics away from their initial values
    let path = std::env::temp_dir().join(format!("genesis-resnet-{}.safetensors", std::process::id()));
    genesis::serialize::save(&path, &a.state_dict(), &Default::default()).unwrap();
    genesis::manual_seed(4);
    let b = ResNet::new(&config, &cpu).unwrap();
    b.load_state_dict(&genesis::serialize::load(&path, &cpu).unwrap(), true).unwrap();
    std::fs::remove_file(&path).ok();
    let (sa, sb) = (a.state_dict(), b.state_dict());
    assert_eq!(sa.len(), sb.len());
    for (name, t) in &sa {
        assert_eq!(max_abs_diff(t, &sb[name]), 0.0, "{name}");
    }
    a.eval();
    b.eval();
    assert_eq!(max_abs_diff(&a.forward(&x).unwrap(), &b.forward(&x).unwrap()), 0.0);
}

#[test]
fn zero_init_residual_zeroes_the_last_norm_of_every_block() {
    let cpu = Device::cpu().unwrap();
    for (block, last) in [(BlockKind::Basic, "bn2"), (BlockKind::Bottleneck, "bn3")] {
        let config = ResNetConfig { zero_init_residual: true, ..narrow(block, vec![2, 1, 1, 1]) };
        let state = ResNet::new(&config, &cpu).unwrap().state_dict();
        let zeroed: Vec<&String> = state.keys().filter(|k| k.ends_with(&format!("{last}.weight"))).collect();
        assert_eq!(zeroed.len(), 5, "{block:?}");
        for name in zeroed {
            assert!(state[name].to_f64_vec().unwrap().iter().all(|&v| v == 0.0), "{name}");
        }
        // The other norms keep scale 1.
        assert!(state["layer1.0.bn1.weight"].to_f64_vec().unwrap().iter().all(|&v| v == 1.0));
    }
}

#[test]
fn a_state_dict_of_another_depth_or_width_is_a_clear_error() {
    let cpu = Device::cpu().unwrap();
    let deeper = ResNet::new(&narrow(BlockKind::Basic, vec![2, 2, 1, 1]), &cpu).unwrap().state_dict();
    let model = ResNet::new(&narrow(BlockKind::Basic, vec![1, 1, 1, 1]), &cpu).unwrap();
    let err = model.load_state_dict(&deeper, true).unwrap_err();
    assert!(err.to_string().contains("layer1.1.conv1.weight"), "{err}");
    let wider =
        ResNet::new(&ResNetConfig { widths: vec![8, 8, 8, 16], ..narrow(BlockKind::Basic, vec![1, 1, 1, 1]) }, &cpu)
            .unwrap()
            .state_dict();
    let err = model.load_state_dict(&wider, true).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShapeMismatch, "{err}");
}

#[test]
fn bad_configs_and_inputs_are_errors() {
    let cpu = Device::cpu().unwrap();
    let bad = [
        ResNetConfig { layers: vec![], widths: vec![], ..ResNetConfig::resnet18(10) },
        ResNetConfig { layers: vec![2, 2], ..ResNetConfig::resnet18(10) },
        ResNetConfig { layers: vec![2, 0, 2, 2], ..ResNetConfig::resnet18(10) },
        ResNetConfig { num_classes: 0, ..ResNetConfig::resnet18(10) },
        ResNetConfig { groups: 32, ..ResNetConfig::resnet18(10) },
    ];
    for config in bad {
        assert!(ResNet::new(&config, &cpu).is_err(), "{config:?}");
    }
    let model = ResNet::new(&narrow(BlockKind::Basic, vec![1, 1, 1, 1]), &cpu).unwrap();
    let gray = Tensor::zeros(&[2, 1, 32, 32], DType::F32, &cpu).unwrap();
    let err = model.forward(&gray).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShapeMismatch, "{err}");
    assert!(err.to_string().contains("(n, 3, h, w)"), "{err}");
}
