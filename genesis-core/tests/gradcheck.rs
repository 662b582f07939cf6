//! Every differentiable op against finite differences in f64, including broadcast, strided
//! (transposed, sliced) and reduced-dim cases.

use genesis::testing::{gradcheck, GradcheckOptions};
use genesis::{Device, Generator, Result, Tensor};
use rstest::rstest;

type Function = fn(&[Tensor]) -> Result<Tensor>;

/// Inputs of the given shapes, random in (-1, 1) or, for `positive`, in (0.5, 1.5).
fn inputs(shapes: &[&[usize]], positive: bool, seed: u64) -> Vec<Tensor> {
    let cpu = Device::parse("cpu").unwrap();
    let gen = Generator::new(seed);
    shapes
        .iter()
        .map(|s| {
            let (lo, hi) = if positive { (0.5, 1.5) } else { (-1.0, 1.0) };
            gen.uniform(s, lo, hi, genesis::DType::F64, &cpu).unwrap().requires_grad_(true).unwrap()
        })
        .collect()
}

#[rstest]
#[case::neg("neg", "3x4", false, |x: &[Tensor]| x[0].neg())]
#[case::abs("abs", "3x4", false, |x: &[Tensor]| x[0].abs())]
#[case::exp("exp", "3x4", false, |x: &[Tensor]| x[0].exp())]
#[case::log("log", "3x4", true, |x: &[Tensor]| x[0].log())]
#[case::sqrt("sqrt", "3x4", true, |x: &[Tensor]| x[0].sqrt())]
#[case::rsqrt("rsqrt", "3x4", true, |x: &[Tensor]| x[0].rsqrt())]
#[case::sin("sin", "5", false, |x: &[Tensor]| x[0].sin())]
#[case::cos("cos", "5", false, |x: &[Tensor]| x[0].cos())]
#[case::tanh("tanh", "5", false, |x: &[Tensor]| x[0].tanh())]
#[case::sigmoid("sigmoid", "5", false, |x: &[Tensor]| x[0].sigmoid())]
#[case::relu("relu", "6", false, |x: &[Tensor]| x[0].relu())]
#[case::gelu("gelu", "6", false, |x: &[Tensor]| x[0].gelu())]
#[case::gelu_tanh("gelu_tanh", "6", false, |x: &[Tensor]| x[0].gelu_tanh())]
#[case::silu("silu", "6", false, |x: &[Tensor]| x[0].silu())]
#[case::reciprocal("reciprocal", "4", true, |x: &[Tensor]| x[0].reciprocal())]
#[case::square("square", "4", false, |x: &[Tensor]| x[0].square())]
#[case::erf("erf", "4", false, |x: &[Tensor]| x[0].erf())]
#[case::log1p("log1p", "4", true, |x: &[Tensor]| x[0].log1p())]
#[case::expm1("expm1", "4", false, |x: &[Tensor]| x[0].expm1())]
#[case::add_broadcast("add", "3x4 4", false, |x: &[Tensor]| x[0].add(&x[1]))]
#[case::sub_broadcast("sub", "3x1 1x4", false, |x: &[Tensor]| x[0].sub(&x[1]))]
#[case::mul_broadcast("mul", "2x3x4 3x1", false, |x: &[Tensor]| x[0].mul(&x[1]))]
#[case::div("div", "3x4 3x4", true, |x: &[Tensor]| x[0].div(&x[1]))]
#[case::pow("pow", "3 3", true, |x: &[Tensor]| x[0].pow(&x[1]))]
#[case::maximum("maximum", "5 5", false, |x: &[Tensor]| x[0].maximum(&x[1]))]
#[case::minimum("minimum", "5 5", false, |x: &[Tensor]| x[0].minimum(&x[1]))]
#[case::scalar_ops("scalar ops", "4", true, |x: &[Tensor]| x[0].mul_scalar(3.0)?.add_scalar(1.0)?.rdiv_scalar(2.0)?.pow_scalar(1.5))]
#[case::rsub("rsub", "4", false, |x: &[Tensor]| x[0].rsub_scalar(2.0))]
#[case::clamp("clamp", "8", false, |x: &[Tensor]| x[0].clamp(-0.5, 0.5))]
#[case::where_("where", "4 4", false, |x: &[Tensor]| Tensor::where_(&x[0].gt_scalar(0.0)?, &x[0], &x[1]))]
#[case::masked_fill("masked_fill", "4", false, |x: &[Tensor]| x[0].masked_fill(&x[0].gt_scalar(0.0)?, 2.0))]
#[case::transposed_input("transposed", "3x4", false, |x: &[Tensor]| x[0].t()?.exp()?.mul(&x[0].t()?))]
#[case::sliced_input("slice", "6x4", false, |x: &[Tensor]| x[0].slice(0, 1, 6, 2)?.square())]
#[case::narrow_select("narrow+select", "3x5", false, |x: &[Tensor]| x[0].narrow(1, 1, 3)?.select(0, -1))]
#[case::reshape("reshape", "2x6", false, |x: &[Tensor]| x[0].t()?.reshape(&[4, 3])?.tanh())]
#[case::permute("permute", "2x3x4", false, |x: &[Tensor]| x[0].permute(&[2, 0, 1])?.sin())]
#[case::expand("expand", "3x1", false, |x: &[Tensor]| x[0].expand(&[3, 4])?.mul_scalar(2.0))]
#[case::unsqueeze_squeeze("squeeze", "3x1x2", false, |x: &[Tensor]| x[0].squeeze(None)?.unsqueeze(0))]
#[case::cat("cat", "2x3 1x3", false, |x: &[Tensor]| Tensor::cat(&[x[0].clone(), x[1].clone()], 0))]
#[case::stack("stack", "2x3 2x3", false, |x: &[Tensor]| Tensor::stack(&[x[0].clone(), x[1].clone()], 1))]
#[case::split_with_sizes("split_with_sizes", "2x5", false, |x: &[Tensor]| { let p = x[0].split_with_sizes(&[2, 3], 1)?; p[1].narrow(1, 1, 2)?.mul(&p[0]) })]
#[case::split_unused_piece("split, one piece unused", "2x5", false, |x: &[Tensor]| x[0].split_with_sizes(&[1, 2, 2], 1)?[2].mul_scalar(3.0))]
#[case::chunk("chunk", "4x3", false, |x: &[Tensor]| { let c = x[0].chunk(2, 0)?; c[0].mul(&c[1]) })]
#[case::sum("sum", "3x4", false, |x: &[Tensor]| x[0].sum())]
#[case::sum_dims("sum_dims", "2x3x4", false, |x: &[Tensor]| x[0].sum_dims(&[0, 2], false))]
#[case::sum_keepdim("sum keepdim", "3x4", false, |x: &[Tensor]| x[0].sum_dims(&[-1], true))]
#[case::mean("mean", "3x4", false, |x: &[Tensor]| x[0].mean_dims(&[1], false))]
#[case::var("var", "3x5", false, |x: &[Tensor]| x[0].var_dims(&[1], 1, false))]
#[case::std("std", "3x5", true, |x: &[Tensor]| x[0].std_dims(&[0], 1, true))]
#[case::max("max", "3x4", false, |x: &[Tensor]| x[0].max_dims(&[1], false))]
#[case::min("min", "3x4", false, |x: &[Tensor]| x[0].min_dims(&[0], true))]
#[case::prod("prod", "3x4", true, |x: &[Tensor]| x[0].prod_dims(&[1], false))]
#[case::logsumexp("logsumexp", "3x4", false, |x: &[Tensor]| x[0].logsumexp(&[1], false))]
#[case::matmul("matmul", "3x4 4x2", false, |x: &[Tensor]| x[0].matmul(&x[1]))]
#[case::matmul_batched("batched matmul", "2x3x4 4x5", false, |x: &[Tensor]| x[0].matmul(&x[1]))]
#[case::matmul_shared_weight("x @ w over two batch dims", "2x2x3x4 1x4x5", false, |x: &[Tensor]| x[0].matmul(&x[1]))]
#[case::matmul_shared_weight_strided("strided x @ wᵀ", "3x2x4 5x4", false, |x: &[Tensor]| x[0].transpose(0, 1)?.matmul(&x[1].t()?))]
#[case::matmul_shared_input("m @ batched b", "3x4 2x4x5", false, |x: &[Tensor]| x[0].matmul(&x[1]))]
#[case::matmul_broadcast_both("2x1 batch @ 1x3 batch", "2x1x3x4 1x3x4x2", false, |x: &[Tensor]| x[0].matmul(&x[1]))]
#[case::matmul_transposed("matmul^T", "4x3 2x4", false, |x: &[Tensor]| x[0].t()?.matmul(&x[1].t()?))]
#[case::matvec("matvec", "3x4 4", false, |x: &[Tensor]| x[0].matmul(&x[1]))]
#[case::dot("dot", "4 4", false, |x: &[Tensor]| x[0].matmul(&x[1]))]
#[case::softmax("softmax", "3x5", false, |x: &[Tensor]| x[0].softmax(-1))]
#[case::softmax_dim0("softmax dim 0", "3x5", false, |x: &[Tensor]| x[0].softmax(0))]
#[case::log_softmax("log_softmax", "3x5", false, |x: &[Tensor]| x[0].log_softmax(-1))]
#[case::gather("gather", "3x4", false, |x: &[Tensor]| {
    let idx = Tensor::from_vec(vec![0i64, 3, 1, 1, 2, 0], &[3, 2], x[0].device())?;
    x[0].gather(1, &idx)
})]
#[case::index_select("index_select", "4x3", false, |x: &[Tensor]| {
    let idx = Tensor::from_vec(vec![3i64, 0, 3], &[3], x[0].device())?;
    x[0].index_select(0, &idx)
})]
#[case::embedding("embedding", "5x3", false, |x: &[Tensor]| {
    let ids = Tensor::from_vec(vec![4i64, 0, 4, 2], &[2, 2], x[0].device())?;
    x[0].embedding(&ids)
})]
#[case::scatter_add("scatter_add", "3x4 3x2", false, |x: &[Tensor]| {
    let idx = Tensor::from_vec(vec![0i64, 3, 1, 1, 2, 0], &[3, 2], x[0].device())?;
    x[0].scatter_add(1, &idx, &x[1])
})]
#[case::cumsum("cumsum", "3x4", false, |x: &[Tensor]| x[0].cumsum(1))]
#[case::topk("topk", "3x5", false, |x: &[Tensor]| Ok(x[0].topk(2, -1, true)?.0))]
#[case::to_dtype("to_dtype", "4", false, |x: &[Tensor]| x[0].to_dtype(genesis::DType::F32)?.to_dtype(genesis::DType::F64)?.mul(&x[0]))]
fn gradients_match_finite_differences(
    #[case] name: &str,
    #[case] shapes: &str,
    #[case] positive: bool,
    #[case] f: Function,
) {
    let parsed: Vec<Vec<usize>> =
        shapes.split(' ').map(|s| s.split('x').map(|n| n.parse().expect("shape")).collect()).collect();
    let refs: Vec<&[usize]> = parsed.iter().map(Vec::as_slice).collect();
    let xs = inputs(&refs, positive, 17);
    // f32 round trips lose precision; every other case is pure f64.
    let options = if name == "to_dtype" {
        GradcheckOptions { eps: 1e-3, atol: 1e-4, rtol: 1e-3 }
    } else {
        GradcheckOptions::default()
    };
    if let Err(e) = gradcheck(f, &xs, options) {
        panic!("{name}: {e}");
    }
}

#[test]
fn gradcheck_catches_a_wrong_gradient() {
    // A hook that doubles the gradient makes autograd disagree with finite differences.
    let xs = inputs(&[&[3]], false, 3);
    let f = |x: &[Tensor]| -> Result<Tensor> {
        let y = x[0].mul_scalar(1.0)?;
        y.register_hook(|g| Ok(Some(g.mul_scalar(2.0)?)))?;
        Ok(y)
    };
    assert!(gradcheck(f, &xs, GradcheckOptions::default()).is_err());
}
