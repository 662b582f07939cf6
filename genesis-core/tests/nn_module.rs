//! The Module trait: parameter naming, state dicts, strict and non-strict loading, modes,
//! dtype moves, parameters shared with forward, and a tiny training run.

use genesis::nn::functional as F;
use genesis::nn::{
    BatchNorm2d, Embedding, Entry, LayerNorm, Linear, Module, ModuleList, Param, ReLU, Reduction, Sequential,
};
use genesis::serialize::StateDict;
use genesis::{manual_seed, no_grad, DType, Device, ErrorKind, Result, Tensor};

fn cpu() -> Device {
    Device::parse("cpu").unwrap()
}

struct Block {
    norm: LayerNorm,
    fc: Linear,
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc.forward(&self.norm.forward(x)?)
    }
    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("norm", Entry::Child(&self.norm));
        f("fc", Entry::Child(&self.fc));
    }
}

struct Net {
    embed: Embedding,
    blocks: ModuleList<Block>,
    head: Sequential,
    scale: Param,
}

impl Module for Net {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let mut x = self.embed.forward(ids)?;
        for b in self.blocks.iter() {
            x = x.add(&b.forward(&x)?)?;
        }
        self.head.forward(&x.mul(&self.scale.get())?)
    }
    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("embed", Entry::Child(&self.embed));
        f("blocks", Entry::Child(&self.blocks));
        f("head", Entry::Child(&self.head));
        f("scale", Entry::Buffer(&self.scale));
    }
}

fn net() -> Net {
    let d = cpu();
    let block = || Block {
        norm: LayerNorm::new(&[4], 1e-5, true, true, &d).unwrap(),
        fc: Linear::new(4, 4, true, &d).unwrap(),
    };
    Net {
        embed: Embedding::new(10, 4, &d).unwrap(),
        blocks: ModuleList::new(vec![block(), block()]),
        head: Sequential::new()
            .add(Linear::new(4, 8, true, &d).unwrap())
            .add(ReLU)
            .add(Linear::new(8, 3, false, &d).unwrap()),
        scale: Param::buffer(Tensor::ones(&[4], DType::F32, &d).unwrap()),
    }
}

#[test]
fn names_follow_pytorch() {
    let names: Vec<String> = net().named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "embed.weight",
            "blocks.0.norm.weight",
            "blocks.0.norm.bias",
            "blocks.0.fc.weight",
            "blocks.0.fc.bias",
            "blocks.1.norm.weight",
            "blocks.1.norm.bias",
            "blocks.1.fc.weight",
            "blocks.1.fc.bias",
            "head.0.weight",
            "head.0.bias",
            "head.2.weight",
        ]
    );
    let n = net();
    assert_eq!(n.named_buffers().into_iter().map(|(n, _)| n).collect::<Vec<_>>(), ["scale"]);
    assert_eq!(n.state_dict().len(), 13);
    assert_eq!(n.num_parameters(), 40 + 2 * (4 + 4 + 16 + 4) + 32 + 8 + 24);
    let bn = BatchNorm2d::new_2d(3, &cpu()).unwrap();
    let keys: Vec<String> = bn.state_dict().into_keys().collect();
    assert_eq!(keys, ["bias", "num_batches_tracked", "running_mean", "running_var", "weight"]);
}

#[test]
fn parameters_are_the_tensors_forward_uses() {
    let lin = Linear::new(3, 2, true, &cpu()).unwrap();
    let x = Tensor::ones(&[1, 3], DType::F32, &cpu()).unwrap();
    let before = lin.forward(&x).unwrap().to_vec::<f32>().unwrap();
    for p in lin.parameters() {
        assert!(p.is_leaf() && p.requires_grad());
        no_grad(|| p.add_scalar_(1.0)).unwrap();
    }
    let after = lin.forward(&x).unwrap().to_vec::<f32>().unwrap();
    for (a, b) in before.iter().zip(&after) {
        assert!((b - a - 4.0).abs() < 1e-5, "{a} -> {b}"); // 3 weights + 1 bias, each +1
    }
    // Gradients reach the parameter tensors themselves.
    lin.forward(&x).unwrap().sum().unwrap().backward().unwrap();
    assert_eq!(lin.parameters()[1].grad().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
    lin.zero_grad();
    assert!(lin.parameters()[1].grad().is_none());
}

#[test]
fn state_dict_round_trip() {
    manual_seed(1);
    let (a, b) = (net(), net());
    let ids = Tensor::from_vec(vec![1i64, 5, 9], &[3], &cpu()).unwrap();
    assert_ne!(a.forward(&ids).unwrap().to_vec::<f32>().unwrap(), b.forward(&ids).unwrap().to_vec::<f32>().unwrap());
    let report = b.load_state_dict(&a.state_dict(), true).unwrap();
    assert!(report.is_clean());
    assert_eq!(a.forward(&ids).unwrap().to_vec::<f32>().unwrap(), b.forward(&ids).unwrap().to_vec::<f32>().unwrap());
    // Loading copies into the same tensors: the parameters keep their identity.
    let p = b.parameters()[0].clone();
    b.load_state_dict(&net().state_dict(), true).unwrap();
    assert!(p.shares_storage(&b.parameters()[0]));
}

fn values(m: &dyn Module) -> Vec<Vec<f32>> {
    m.state_dict().values().map(|t| t.to_vec::<f32>().unwrap()).collect()
}

#[test]
fn strict_load_errors_leave_the_module_untouched() {
    let target = net();
    let original = values(&target);
    let good = net().state_dict();

    let mut missing = good.clone();
    missing.remove("head.2.weight");
    let mut unexpected = good.clone();
    unexpected.insert("head.9.weight".into(), Tensor::zeros(&[1], DType::F32, &cpu()).unwrap());
    let mut wrong_shape = good.clone();
    wrong_shape.insert("embed.weight".into(), Tensor::zeros(&[11, 4], DType::F32, &cpu()).unwrap());
    for (bad, needle, kind) in [
        (missing, "head.2.weight", ErrorKind::LoadFailed),
        (unexpected, "head.9.weight", ErrorKind::LoadFailed),
        (wrong_shape, "embed.weight", ErrorKind::ShapeMismatch),
    ] {
        let e = target.load_state_dict(&bad, true).unwrap_err();
        assert_eq!(e.kind(), kind);
        assert!(e.message().contains(needle) && e.message().contains("nothing was loaded"), "{e}");
        assert_eq!(values(&target), original, "a failed strict load changed the module");
    }
}

#[test]
fn non_strict_load_reports_and_loads_the_rest() {
    let target = net();
    let mut sd: StateDict = net().state_dict();
    let source_head = sd["head.0.bias"].to_vec::<f32>().unwrap();
    sd.remove("blocks.1.fc.bias");
    sd.insert("extra".into(), Tensor::zeros(&[2], DType::F32, &cpu()).unwrap());
    let report = target.load_state_dict(&sd, false).unwrap();
    assert_eq!(report.missing_keys, ["blocks.1.fc.bias"]);
    assert_eq!(report.unexpected_keys, ["extra"]);
    assert_eq!(target.state_dict()["head.0.bias"].to_vec::<f32>().unwrap(), source_head);
    // A wrong shape is an error even when not strict (as in PyTorch), and nothing is loaded.
    let fresh = net();
    let before = fresh.state_dict()["head.0.bias"].to_vec::<f32>().unwrap();
    sd.insert("head.2.weight".into(), Tensor::zeros(&[2, 8], DType::F32, &cpu()).unwrap());
    let e = fresh.load_state_dict(&sd, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ShapeMismatch);
    assert!(e.message().contains("head.2.weight") && e.message().contains("[2, 8]"), "{e}");
    assert_eq!(fresh.state_dict()["head.0.bias"].to_vec::<f32>().unwrap(), before);
}

#[test]
fn load_casts_dtype() {
    let lin = Linear::new(2, 2, true, &cpu()).unwrap();
    let sd: StateDict = lin
        .state_dict()
        .into_iter()
        .map(|(k, v)| (k, v.to_dtype(DType::F64).unwrap().mul_scalar(2.0).unwrap()))
        .collect();
    let want = sd["weight"].to_vec::<f32>().unwrap();
    lin.load_state_dict(&sd, true).unwrap();
    assert_eq!(lin.weight.get().dtype(), DType::F32);
    assert_eq!(lin.weight.get().to_vec::<f32>().unwrap(), want);
}

#[test]
fn train_eval_and_dtype_moves() {
    let n = net();
    let model = Sequential::new().add(BatchNorm2d::new_2d(2, &cpu()).unwrap());
    assert!(n.is_training() && model.is_training());
    model.eval();
    assert!(!model.is_training());
    model.train(true);
    assert!(model.is_training());
    n.to_dtype(DType::F64).unwrap();
    for (name, p) in n.named_parameters() {
        assert_eq!(p.dtype(), DType::F64, "{name}");
        assert!(p.requires_grad() && p.is_leaf());
    }
    let ids = Tensor::from_vec(vec![1i64, 2], &[2], &cpu()).unwrap();
    assert_eq!(n.forward(&ids).unwrap().dtype(), DType::F64);
    // Integer buffers keep their dtype; a non-float target dtype is refused.
    let bn = BatchNorm2d::new_2d(2, &cpu()).unwrap();
    bn.to_dtype(DType::BF16).unwrap();
    assert_eq!(bn.num_batches_tracked.get().dtype(), DType::I64);
    assert_eq!(bn.running_mean.get().dtype(), DType::BF16);
    assert_eq!(bn.to_dtype(DType::I32).unwrap_err().kind(), ErrorKind::DtypeMismatch);
}

#[test]
fn sgd_steps_reduce_the_loss_of_an_mlp() {
    manual_seed(0);
    let d = cpu();
    let model = Sequential::new()
        .add(Linear::new(2, 16, true, &d).unwrap())
        .add(ReLU)
        .add(Linear::new(16, 2, true, &d).unwrap());
    // XOR-like labels of four points.
    let x = Tensor::from_vec(vec![0f32, 0., 0., 1., 1., 0., 1., 1.], &[4, 2], &d).unwrap();
    let y = Tensor::from_vec(vec![0i64, 1, 1, 0], &[4], &d).unwrap();
    let loss_of = || F::cross_entropy(&model.forward(&x)?, &y, -100, 0.0, Reduction::Mean);
    let first = loss_of().unwrap().item::<f32>().unwrap();
    for _ in 0..200 {
        model.zero_grad();
        loss_of().unwrap().backward().unwrap();
        no_grad(|| -> Result<()> {
            for p in model.parameters() {
                p.sub_(&p.grad().unwrap().mul_scalar(0.5)?)?;
            }
            Ok(())
        })
        .unwrap();
    }
    let last = loss_of().unwrap().item::<f32>().unwrap();
    assert!(last < first * 0.2, "loss {first} -> {last}");
}
