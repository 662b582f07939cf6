//! safetensors interop with PyTorch: a file written by `safetensors.torch.save_file` loads
//! with its names, dtypes and values, and the file Genesis writes for the same state dict is
//! the one that tests/reference/make_interop_reference.py loaded and checked with PyTorch.

use genesis::serialize::{from_bytes, load_with_metadata, to_bytes, Metadata, StateDict};
use genesis::{bf16, f16, DType, Device, Result, Tensor};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/reference");

/// The state dict of make_interop_reference.py's `expected()`.
fn expected(cpu: &Device) -> Result<StateDict> {
    let mut sd = StateDict::new();
    let embed: Vec<f32> = (0..15).map(|i| i as f32 * 0.25 - 1.0).collect();
    sd.insert("embed.weight".into(), Tensor::from_vec(embed, &[5, 3], cpu)?);
    let norm = [1.0f32, 0.5, -2.0].map(bf16::from_f32).to_vec();
    sd.insert("norm.weight".into(), Tensor::from_vec(norm, &[3], cpu)?);
    let lin: Vec<f16> = (0..6).map(|i| f16::from_f32(i as f32 * 0.5)).collect();
    sd.insert("layers.0.linear.weight".into(), Tensor::from_vec(lin, &[2, 3], cpu)?);
    sd.insert("bn.running_mean".into(), Tensor::from_vec(vec![0.1f64, -0.2], &[2], cpu)?);
    sd.insert("bn.num_batches_tracked".into(), Tensor::scalar(7i64, cpu)?);
    sd.insert("tokens".into(), Tensor::from_vec(vec![-3i32, 0, 2, 1 << 30], &[2, 2], cpu)?);
    sd.insert("pixels".into(), Tensor::from_vec(vec![0u8, 128, 255], &[3], cpu)?);
    sd.insert("mask".into(), Tensor::from_vec(vec![true, false, false, true], &[4], cpu)?);
    Ok(sd)
}

fn pt_metadata() -> Metadata {
    [("format".to_string(), "pt".to_string())].into()
}

fn assert_same(got: &StateDict, want: &StateDict) -> Result<()> {
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    for (name, w) in want {
        let g = &got[name];
        assert_eq!((g.dtype(), g.shape()), (w.dtype(), w.shape()), "{name}");
        if w.dtype() == DType::I64 {
            assert_eq!(g.to_vec::<i64>()?, w.to_vec::<i64>()?, "{name}");
        } else {
            assert_eq!(g.to_f64_vec()?, w.to_f64_vec()?, "{name}");
        }
    }
    Ok(())
}

#[test]
fn loads_a_state_dict_saved_by_pytorch() -> Result<()> {
    let cpu = Device::cpu()?;
    let (sd, meta) = load_with_metadata(format!("{DIR}/torch_written.safetensors"), &cpu)?;
    assert_eq!(meta, pt_metadata());
    assert_same(&sd, &expected(&cpu)?)
}

/// The committed genesis_written.safetensors, which PyTorch loaded and found equal to its
/// own state dict, is byte for byte what Genesis writes today. Set
/// GENESIS_WRITE_INTEROP=path to write it afresh.
#[test]
fn writes_the_file_pytorch_checked() -> Result<()> {
    let cpu = Device::cpu()?;
    let bytes = to_bytes(&expected(&cpu)?, &pt_metadata())?;
    if let Ok(path) = std::env::var("GENESIS_WRITE_INTEROP") {
        std::fs::write(path, &bytes).expect("write interop file");
    }
    let committed = std::fs::read(format!("{DIR}/genesis_written.safetensors")).expect("committed file");
    assert_eq!(bytes, committed, "Genesis now writes a different file than the one PyTorch checked");
    assert_same(&from_bytes(&committed, &cpu, "genesis_written.safetensors")?.0, &expected(&cpu)?)
}
