//! Genesis against PyTorch: inputs, outputs and gradients written by PyTorch
//! (tests/reference/make_reference.py) for the same functions, compared here.

use genesis::{grad, Device, Result, Tensor};
use safetensors::SafeTensors;
use std::collections::BTreeSet;

type Function = fn(&[Tensor]) -> Result<Tensor>;

fn i64s(values: &[i64], shape: &[usize], like: &Tensor) -> Result<Tensor> {
    Tensor::from_slice(values, shape, like.device())
}

/// The same functions as CASES in make_reference.py, by name.
fn function(name: &str) -> Option<Function> {
    let f: Function = match name {
        "add_broadcast" => |x| x[0].add(&x[1]),
        "sub_broadcast" => |x| x[0].sub(&x[1]),
        "mul_broadcast" => |x| x[0].mul(&x[1]),
        "div" => |x| x[0].div(&x[1]),
        "pow" => |x| x[0].pow(&x[1]),
        "scalar_chain" => |x| x[0].mul_scalar(3.0)?.add_scalar(1.0)?.rdiv_scalar(2.0),
        "maximum" => |x| x[0].maximum(&x[1]),
        "minimum" => |x| x[0].minimum(&x[1]),
        "exp_transposed" => |x| x[0].t()?.exp(),
        "log" => |x| x[0].log(),
        "sqrt" => |x| x[0].sqrt(),
        "rsqrt" => |x| x[0].rsqrt(),
        "sin" => |x| x[0].sin(),
        "cos" => |x| x[0].cos(),
        "tanh" => |x| x[0].tanh(),
        "sigmoid" => |x| x[0].sigmoid(),
        "relu" => |x| x[0].relu(),
        "gelu" => |x| x[0].gelu(),
        "gelu_tanh" => |x| x[0].gelu_tanh(),
        "silu" => |x| x[0].silu(),
        "erf" => |x| x[0].erf(),
        "log1p" => |x| x[0].log1p(),
        "expm1" => |x| x[0].expm1(),
        "abs" => |x| x[0].abs(),
        "clamp" => |x| x[0].clamp(-0.5, 0.5),
        "where" => |x| Tensor::where_(&x[0].gt_scalar(0.0)?, &x[0], &x[1]),
        "sum_dims" => |x| x[0].sum_dims(&[0, 2], false),
        "mean" => |x| x[0].mean_dims(&[1], false),
        "var" => |x| x[0].var_dims(&[1], 1, false),
        "std_keepdim" => |x| x[0].std_dims(&[0], 1, true),
        "amax" => |x| x[0].max_dims(&[1], false),
        "amin" => |x| x[0].min_dims(&[0], true),
        "prod" => |x| x[0].prod_dims(&[1], false),
        "logsumexp" => |x| x[0].logsumexp(&[1], false),
        "matmul" | "matmul_batched_broadcast" | "matvec" | "dot" => |x| x[0].matmul(&x[1]),
        "matmul_transposed" => |x| x[0].t()?.matmul(&x[1].t()?),
        "softmax" => |x| x[0].softmax(-1),
        "softmax_dim0" => |x| x[0].softmax(0),
        "log_softmax" => |x| x[0].log_softmax(-1),
        "gather" => |x| x[0].gather(1, &i64s(&[0, 3, 1, 1, 2, 0], &[3, 2], &x[0])?),
        "index_select" => |x| x[0].index_select(0, &i64s(&[3, 0, 3], &[3], &x[0])?),
        "embedding" => |x| x[0].embedding(&i64s(&[4, 0, 4, 2], &[2, 2], &x[0])?),
        "scatter_add" => |x| x[0].scatter_add(1, &i64s(&[0, 3, 1, 1, 2, 0], &[3, 2], &x[0])?, &x[1]),
        "cumsum" => |x| x[0].cumsum(1),
        "cat" => |x| Tensor::cat(&[x[0].clone(), x[1].clone()], 0),
        "stack" => |x| Tensor::stack(&[x[0].clone(), x[1].clone()], 1),
        "slice_step" => |x| x[0].slice(0, 1, 6, 2)?.square(),
        "permute_sin" => |x| x[0].permute(&[2, 0, 1])?.sin(),
        "expand" => |x| x[0].expand(&[3, 4])?.mul_scalar(2.0),
        "reshape_transposed" => |x| x[0].t()?.reshape(&[4, 3])?.tanh(),
        "topk_values" => |x| Ok(x[0].topk(2, -1, true)?.0),
        _ => return None,
    };
    Some(f)
}

fn load(file: &SafeTensors, name: &str, device: &Device) -> Option<Tensor> {
    let view = file.tensor(name).ok()?;
    let values: Vec<f64> =
        view.data().chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
    Some(Tensor::from_vec(values, view.shape(), device).expect("upload"))
}

fn assert_close(case: &str, what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.shape(), want.shape(), "{case} {what}: shape");
    let (g, w) = (got.to_vec::<f64>().unwrap(), want.to_vec::<f64>().unwrap());
    for (k, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= 1e-9 + 1e-9 * b.abs(), "{case} {what}[{k}]: genesis {a}, pytorch {b}");
    }
}

#[test]
fn ops_and_gradients_match_pytorch() {
    let bytes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/reference/ops.safetensors"))
        .expect("reference file");
    let file = SafeTensors::deserialize(&bytes).expect("valid safetensors");
    let cases: BTreeSet<String> =
        file.names().iter().filter_map(|n| n.split_once('.').map(|(c, _)| c.to_string())).collect();
    assert!(cases.len() >= 50, "only {} cases in the reference file", cases.len());
    let device = Device::parse("cpu").unwrap();
    for case in &cases {
        let f = function(case).unwrap_or_else(|| panic!("no Genesis function for reference case {case}"));
        let inputs: Vec<Tensor> = (0..)
            .map_while(|i| load(&file, &format!("{case}.in{i}"), &device))
            .map(|t| t.requires_grad_(true).unwrap())
            .collect();
        let out = f(&inputs).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_close(case, "output", &out, &load(&file, &format!("{case}.out"), &device).unwrap());
        let w = load(&file, &format!("{case}.w"), &device).unwrap();
        let grads = grad(&[out.mul(&w).unwrap().sum().unwrap()], &inputs, None, false, false).unwrap();
        for (i, g) in grads.iter().enumerate() {
            let want = load(&file, &format!("{case}.grad{i}"), &device).unwrap();
            let got = g.clone().unwrap_or_else(|| want.zeros_like().unwrap());
            assert_close(case, &format!("grad{i}"), &got, &want);
        }
    }
}
