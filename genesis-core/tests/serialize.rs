//! safetensors save/load: every dtype round-trips bit for bit, views are written densely,
//! names and metadata are kept, and broken files give errors that name the file.

use genesis::serialize::{from_bytes, load, load_with_metadata, save, to_bytes, Metadata, StateDict};
use genesis::{bf16, f16, DType, Device, ErrorKind, Result, Tensor};
use std::path::PathBuf;

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("genesis-serialize-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn sample(cpu: &Device) -> Result<StateDict> {
    let mut sd = StateDict::new();
    sd.insert("f32".into(), Tensor::from_vec(vec![1.5f32, -2.25, f32::MIN_POSITIVE, 3e38], &[2, 2], cpu)?);
    sd.insert("f64".into(), Tensor::from_vec(vec![std::f64::consts::PI, -1e-300], &[2], cpu)?);
    sd.insert("f16".into(), Tensor::from_vec(vec![f16::from_f32(0.1), f16::from_f32(-65504.0)], &[2, 1], cpu)?);
    sd.insert("bf16".into(), Tensor::from_vec(vec![bf16::from_f32(1e30), bf16::from_f32(-0.5)], &[1, 2], cpu)?);
    sd.insert("i64".into(), Tensor::from_vec(vec![i64::MIN, 0, i64::MAX], &[3], cpu)?);
    sd.insert("i32".into(), Tensor::from_vec(vec![-7i32, 1 << 30], &[2], cpu)?);
    sd.insert("u8".into(), Tensor::from_vec(vec![0u8, 255, 17], &[3], cpu)?);
    sd.insert("bool".into(), Tensor::from_vec(vec![true, false, true], &[3], cpu)?);
    sd.insert("scalar".into(), Tensor::scalar(42.0f32, cpu)?);
    sd.insert("empty".into(), Tensor::zeros(&[0, 3], DType::F32, cpu)?);
    Ok(sd)
}

fn same(a: &Tensor, b: &Tensor) -> Result<bool> {
    if a.shape() != b.shape() || a.dtype() != b.dtype() {
        return Ok(false);
    }
    // Compare exact bits through f64 (every dtype here converts to f64 exactly except i64
    // extremes, compared separately).
    if a.dtype() == DType::I64 {
        return Ok(a.to_vec::<i64>()? == b.to_vec::<i64>()?);
    }
    let (x, y) = (a.to_f64_vec()?, b.to_f64_vec()?);
    Ok(x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()))
}

#[test]
fn every_dtype_round_trips_with_metadata() -> Result<()> {
    let cpu = Device::cpu()?;
    let sd = sample(&cpu)?;
    let path = temp_dir("dtypes").join("all.safetensors");
    let meta = Metadata::from([("format".to_string(), "pt".to_string()), ("note".to_string(), "ünïcode".to_string())]);
    save(&path, &sd, &meta)?;
    let (back, meta_back) = load_with_metadata(&path, &cpu)?;
    assert_eq!(meta_back, meta);
    assert_eq!(back.keys().collect::<Vec<_>>(), sd.keys().collect::<Vec<_>>());
    for (name, t) in &sd {
        assert!(same(t, &back[name])?, "{name}: {:?} vs {:?}", t, back[name]);
    }
    Ok(())
}

#[test]
fn views_are_saved_as_their_elements() -> Result<()> {
    let cpu = Device::cpu()?;
    let base = Tensor::arange(0.0, 24.0, 1.0, DType::F32, &cpu)?.reshape(&[2, 3, 4])?;
    let mut sd = StateDict::new();
    sd.insert("transposed".into(), base.transpose(0, 2)?);
    sd.insert("sliced".into(), base.slice(2, 1, 4, 2)?);
    sd.insert("expanded".into(), Tensor::scalar(7.0f32, &cpu)?.expand(&[2, 2])?);
    let back = from_bytes(&to_bytes(&sd, &Metadata::new())?, &cpu, "memory")?.0;
    for (name, t) in &sd {
        assert!(!t.is_contiguous(), "{name} should be a view");
        assert_eq!(back[name].shape(), t.shape(), "{name}");
        assert_eq!(back[name].to_vec::<f32>()?, t.to_vec::<f32>()?, "{name}");
    }
    Ok(())
}

/// A file written by another safetensors writer (the reference crate, which the Hugging Face
/// Python package wraps) with dotted PyTorch names loads under those names.
#[test]
fn reads_files_from_the_reference_writer_with_pytorch_names() -> Result<()> {
    let cpu = Device::cpu()?;
    let w: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let b: Vec<u8> = [0.5f32, -0.5].iter().flat_map(|v| v.to_le_bytes()).collect();
    let views = vec![
        (
            "encoder.layers.0.linear.weight",
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 3], &w).unwrap(),
        ),
        (
            "encoder.layers.0.linear.bias",
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &b).unwrap(),
        ),
    ];
    let bytes = safetensors::serialize(views, None).unwrap();
    let (sd, _) = from_bytes(&bytes, &cpu, "hf.safetensors")?;
    assert_eq!(sd["encoder.layers.0.linear.weight"].shape(), &[2, 3]);
    assert_eq!(sd["encoder.layers.0.linear.weight"].to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(sd["encoder.layers.0.linear.bias"].to_vec::<f32>()?, vec![0.5, -0.5]);
    // And ours parses with the reference reader.
    let ours = to_bytes(&sd, &Metadata::new())?;
    let st = safetensors::SafeTensors::deserialize(&ours).unwrap();
    assert_eq!(st.tensor("encoder.layers.0.linear.weight").unwrap().data(), &w[..]);
    Ok(())
}

#[test]
fn broken_files_are_errors_naming_the_file() -> Result<()> {
    let cpu = Device::cpu()?;
    let dir = temp_dir("broken");
    let good = to_bytes(&sample(&cpu)?, &Metadata::new())?;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated.safetensors", good[..good.len() - 5].to_vec(), "truncated"),
        ("header_cut.safetensors", good[..20].to_vec(), "truncated"),
        ("tiny.safetensors", vec![1, 2, 3], "not a safetensors file"),
        ("text.safetensors", b"this is a plain text file, not tensors at all".to_vec(), "not a safetensors file"),
        ("trailing.safetensors", [good.clone(), vec![0u8; 16]].concat(), "corrupt"),
        ("empty.safetensors", Vec::new(), "not a safetensors file"),
    ];
    for (name, bytes, expect) in cases {
        let path = dir.join(name);
        std::fs::write(&path, &bytes).expect("write test file");
        let err = load(&path, &cpu).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LoadFailed, "{name}: {err}");
        assert!(err.message().contains(name), "{name}: message should name the file: {err}");
        assert!(err.message().contains(expect), "{name}: expected `{expect}` in: {err}");
    }
    let missing = dir.join("missing.safetensors");
    let err = load(&missing, &cpu).unwrap_err();
    assert!(err.message().contains("missing.safetensors"), "{err}");
    Ok(())
}

#[test]
fn unsupported_dtypes_are_named() -> Result<()> {
    let cpu = Device::cpu()?;
    let data = [0u8; 4];
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::I16, vec![2], &data).unwrap();
    let bytes = safetensors::serialize(vec![("small_ints", view)], None).unwrap();
    let err = from_bytes(&bytes, &cpu, "i16.safetensors").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.message().contains("small_ints") && err.message().contains("I16"), "{err}");
    Ok(())
}

#[test]
fn strict_and_non_strict_loading_into_a_model() -> Result<()> {
    use genesis::serialize::{load_state_dict_into, LoadReport};
    let cpu = Device::cpu()?;
    let w = Tensor::zeros(&[2, 2], DType::F32, &cpu)?.requires_grad_(true)?;
    let b = Tensor::zeros(&[2], DType::F32, &cpu)?.requires_grad_(true)?;
    let model: StateDict = [("fc.weight".to_string(), w.clone()), ("fc.bias".to_string(), b.clone())].into();

    // A full, matching state dict (f64 values are cast to the model's f32).
    let mut file = StateDict::new();
    file.insert("fc.weight".into(), Tensor::new([[1.0f64, 2.0], [3.0, 4.0]], &cpu)?);
    file.insert("fc.bias".into(), Tensor::new([5.0f32, 6.0], &cpu)?);
    assert_eq!(load_state_dict_into(&model, &file, true)?, LoadReport::default());
    assert_eq!(w.to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(w.dtype(), DType::F32);

    // Missing and unexpected keys: an error when strict (nothing loaded), a report otherwise.
    let mut partial = StateDict::new();
    partial.insert("fc.weight".into(), Tensor::new([[9.0f32, 9.0], [9.0, 9.0]], &cpu)?);
    partial.insert("head.weight".into(), Tensor::new([1.0f32], &cpu)?);
    let err = load_state_dict_into(&model, &partial, true).unwrap_err();
    assert!(err.message().contains("fc.bias") && err.message().contains("head.weight"), "{err}");
    assert_eq!(w.to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0], "strict failure loaded nothing");
    let report = load_state_dict_into(&model, &partial, false)?;
    assert_eq!(report.missing_keys, vec!["fc.bias".to_string()]);
    assert_eq!(report.unexpected_keys, vec!["head.weight".to_string()]);
    assert_eq!(w.to_vec::<f32>()?, vec![9.0; 4]);
    assert_eq!(b.to_vec::<f32>()?, vec![5.0, 6.0]);

    // A wrong shape is an error even when not strict, and nothing is loaded, not even the
    // tensors that fit.
    let mut wrong = StateDict::new();
    wrong.insert("fc.weight".into(), Tensor::new([[0.0f32, 0.0, 0.0]], &cpu)?);
    wrong.insert("fc.bias".into(), Tensor::new([7.0f32, 7.0], &cpu)?);
    let err = load_state_dict_into(&model, &wrong, false).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShapeMismatch);
    assert!(err.message().contains("fc.weight") && err.message().contains("[1, 3]"), "{err}");
    assert_eq!(b.to_vec::<f32>()?, vec![5.0, 6.0]);
    Ok(())
}
