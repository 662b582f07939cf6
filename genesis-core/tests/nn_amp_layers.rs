//! Autocast dtypes per op, layer output shapes, initialization statistics, masked
//! multi-head attention and the Dropout module's modes.

use genesis::amp::{autocast, autocast_dtype};
use genesis::nn::functional as F;
use genesis::nn::{
    AdaptiveAvgPool2d, Conv2d, Conv2dOptions, Dropout, Flatten, Linear, MaxPool2d, Module, MultiheadAttention, ReLU,
    Reduction, Sequential,
};
use genesis::{manual_seed, DType, Device, Tensor};

fn cpu() -> Device {
    Device::parse("cpu").unwrap()
}

#[test]
fn autocast_dtypes_per_op() {
    let d = cpu();
    let x = Tensor::ones(&[2, 4], DType::F32, &d).unwrap().requires_grad_(true).unwrap();
    let w = Tensor::ones(&[3, 4], DType::F32, &d).unwrap();
    let ids = Tensor::from_vec(vec![0i64, 2], &[2], &d).unwrap();
    let img = Tensor::ones(&[1, 2, 4, 4], DType::F32, &d).unwrap();
    let k = Tensor::ones(&[3, 2, 3, 3], DType::F32, &d).unwrap();
    for low in [DType::BF16, DType::F16] {
        autocast(low, || {
            assert_eq!(autocast_dtype(), Some(low));
            let h = x.matmul(&w.t().unwrap()).unwrap();
            assert_eq!(h.dtype(), low, "matmul");
            assert_eq!(F::linear(&x, &w, None).unwrap().dtype(), low, "linear");
            assert_eq!(F::conv2d(&img, &k, None, [1, 1], [0, 0], [1, 1], 1).unwrap().dtype(), low, "conv2d");
            let q = Tensor::ones(&[1, 1, 2, 4], DType::F32, &d).unwrap();
            assert_eq!(F::scaled_dot_product_attention(&q, &q, &q, None, true, None).unwrap().dtype(), low);
            // Precision-sensitive ops run in f32 on low-precision inputs.
            assert_eq!(h.softmax(-1).unwrap().dtype(), DType::F32, "softmax");
            assert_eq!(h.log_softmax(-1).unwrap().dtype(), DType::F32, "log_softmax");
            assert_eq!(h.sum().unwrap().dtype(), DType::F32, "sum");
            assert_eq!(h.exp().unwrap().dtype(), DType::F32, "exp");
            assert_eq!(F::layer_norm(&h, &[3], None, None, 1e-5).unwrap().dtype(), DType::F32, "layer_norm");
            assert_eq!(F::rms_norm(&h, &[3], None, None).unwrap().dtype(), DType::F32, "rms_norm");
            let loss = F::cross_entropy(&h, &ids, -100, 0.0, Reduction::Mean).unwrap();
            assert_eq!(loss.dtype(), DType::F32, "cross_entropy");
            assert_eq!(F::mse_loss(&h, &h, Reduction::Mean).unwrap().dtype(), DType::F32, "mse");
            // f64 is never cast; nested scopes override and restore.
            let x64 = x.to_dtype(DType::F64).unwrap();
            assert_eq!(x64.matmul(&x64.t().unwrap()).unwrap().dtype(), DType::F64);
            autocast(DType::F16, || assert_eq!(autocast_dtype(), Some(DType::F16))).unwrap();
            assert_eq!(autocast_dtype(), Some(low));
            // Backward inside the scope gives the leaf an f32 gradient.
            loss.backward().unwrap();
        })
        .unwrap();
        assert_eq!(x.grad().unwrap().dtype(), DType::F32);
        x.zero_grad();
    }
    assert_eq!(autocast_dtype(), None);
    assert!(autocast(DType::F32, || ()).is_err());
}

#[test]
fn cnn_shapes_and_training_mode() {
    manual_seed(3);
    let d = cpu();
    let opts = Conv2dOptions { padding: [1, 1], ..Default::default() };
    let model = Sequential::new()
        .add(Conv2d::new(1, 8, [3, 3], opts, &d).unwrap())
        .add(ReLU)
        .add(MaxPool2d::new([2, 2]))
        .add(Conv2d::new(8, 8, [3, 3], Conv2dOptions { groups: 2, ..opts }, &d).unwrap())
        .add(AdaptiveAvgPool2d { output_size: [2, 2] })
        .add(Flatten::default())
        .add(Dropout::new(0.5).unwrap())
        .add(Linear::new(32, 10, true, &d).unwrap());
    let x = Tensor::ones(&[5, 1, 8, 8], DType::F32, &d).unwrap();
    assert_eq!(model.forward(&x).unwrap().shape(), [5, 10]);
    let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "3.weight", "3.bias", "7.weight", "7.bias"]);
    assert_eq!(model.named_parameters()[2].1.shape(), [8, 4, 3, 3]);
    // Dropout makes training forwards differ; eval forwards repeat.
    let a = model.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_ne!(a, model.forward(&x).unwrap().to_vec::<f32>().unwrap());
    model.eval();
    let b = model.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(b, model.forward(&x).unwrap().to_vec::<f32>().unwrap());
}

fn stats(t: &Tensor) -> (f64, f64, f64) {
    let v = t.to_vec::<f64>().unwrap();
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt(), v.iter().fold(0f64, |m, x| m.max(x.abs())))
}

#[test]
fn initialization_statistics() {
    manual_seed(11);
    let d = cpu();
    // kaiming_uniform(a = sqrt 5): U(±1/sqrt(fan_in)), std = bound/sqrt 3.
    let lin = Linear::new(400, 300, true, &d).unwrap();
    let bound = 1.0 / 400f64.sqrt();
    let (mean, std, max) = stats(&lin.weight.get());
    assert!(mean.abs() < 0.002 && (std - bound / 3f64.sqrt()).abs() < 0.002 && max <= bound, "{mean} {std} {max}");
    let (_, _, bmax) = stats(&lin.bias.as_ref().unwrap().get());
    assert!(bmax <= bound && bmax > 0.8 * bound);
    let conv = Conv2d::new(16, 32, [3, 3], Conv2dOptions::default(), &d).unwrap();
    let (_, std, max) = stats(&conv.weight.get());
    let bound = 1.0 / 144f64.sqrt();
    assert!(max <= bound && (std - bound / 3f64.sqrt()).abs() < 0.003, "{std} {max}");
    let emb = genesis::nn::Embedding::new(500, 64, &d).unwrap();
    let (mean, std, _) = stats(&emb.weight.get());
    assert!(mean.abs() < 0.02 && (std - 1.0).abs() < 0.02, "{mean} {std}");
}

#[test]
fn multihead_attention_masks() {
    manual_seed(4);
    let d = cpu();
    let mha = MultiheadAttention::new(8, 2, true, &d).unwrap();
    let names: Vec<String> = mha.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]);
    let x = genesis::Generator::new(1).normal(&[2, 5, 8], 0.0, 1.0, DType::F32, &d).unwrap();
    let full = mha.attend(&x, &x, &x, None, true).unwrap();
    assert_eq!(full.shape(), [2, 5, 8]);
    // Causal: the first 3 outputs depend only on the first 3 inputs.
    let head = x.narrow(1, 0, 3).unwrap();
    let short = mha.attend(&head, &head, &head, None, true).unwrap().to_vec::<f32>().unwrap();
    let full3 = full.narrow(1, 0, 3).unwrap().to_vec::<f32>().unwrap();
    for (a, b) in short.iter().zip(&full3) {
        assert!((a - b).abs() < 1e-5);
    }
    // Key padding: masking the last 2 keys equals dropping them (non-causal).
    let pad = Tensor::from_vec([false, false, false, true, true].repeat(2), &[2, 5], &d).unwrap();
    let kept = x.narrow(1, 0, 3).unwrap();
    let masked = mha.attend(&x, &x, &x, Some(&pad), false).unwrap().to_vec::<f32>().unwrap();
    let dropped = mha.attend(&x, &kept, &kept, None, false).unwrap().to_vec::<f32>().unwrap();
    for (a, b) in masked.iter().zip(&dropped) {
        assert!((a - b).abs() < 1e-5);
    }
    // Sequence-first layout gives the same result transposed.
    let mha_sf = MultiheadAttention { batch_first: false, ..mha.clone() };
    let xt = x.transpose(0, 1).unwrap();
    let sf = mha_sf.attend(&xt, &xt, &xt, None, true).unwrap().transpose(0, 1).unwrap().to_vec::<f32>().unwrap();
    for (a, b) in sf.iter().zip(&full.to_vec::<f32>().unwrap()) {
        assert!((a - b).abs() < 1e-5);
    }
    assert!(mha.attend(&x, &x, &x, Some(&pad.narrow(1, 0, 4).unwrap()), false).is_err());
    assert!(MultiheadAttention::new(8, 3, true, &d).is_err());
}
