//! Creation, views, printing, random numbers and dtype rules of the tensor API.

use genesis::{DType, Device, Tensor};

fn cpu() -> Device {
    Device::parse("cpu").unwrap()
}

#[test]
fn printing_looks_like_pytorch() {
    let d = cpu();
    let t = Tensor::new([[1.0f32, 2.0], [3.0, 4.0]], &d).unwrap();
    assert_eq!(t.to_string(), "tensor([[1., 2.],\n        [3., 4.]])");
    let h = Tensor::new([0.5f64, -1.25], &d).unwrap();
    assert_eq!(h.to_string(), "tensor([ 0.5000, -1.2500], dtype=float64)");
    let b = Tensor::new([true, false], &d).unwrap();
    assert_eq!(b.to_string(), "tensor([ True, False])");
    let i = Tensor::arange(0.0, 3.0, 1.0, DType::I64, &d).unwrap();
    assert_eq!(i.to_string(), "tensor([0, 1, 2])");
    let g = Tensor::new([1.0f32], &d).unwrap().requires_grad_(true).unwrap();
    assert_eq!(g.to_string(), "tensor([1.], requires_grad=True)");
    assert!(g.mul_scalar(2.0).unwrap().to_string().ends_with("grad_fn=<mul>)"));
}

#[test]
fn creation_functions() {
    let d = cpu();
    assert_eq!(
        Tensor::eye(3, DType::F32, &d).unwrap().to_vec::<f32>().unwrap(),
        vec![1., 0., 0., 0., 1., 0., 0., 0., 1.]
    );
    assert_eq!(
        Tensor::linspace(0.0, 1.0, 5, DType::F64, &d).unwrap().to_vec::<f64>().unwrap(),
        vec![0.0, 0.25, 0.5, 0.75, 1.0]
    );
    assert_eq!(Tensor::arange(1.0, 2.0, 0.25, DType::F32, &d).unwrap().shape(), &[4]);
    // As PyTorch: equal bounds give an empty range, a step pointing away from the end raises.
    assert_eq!(Tensor::arange(2.0, 2.0, -1.0, DType::F32, &d).unwrap().shape(), &[0]);
    assert_eq!(Tensor::arange(3.0, 0.0, -1.0, DType::I64, &d).unwrap().to_vec::<i64>().unwrap(), vec![3, 2, 1]);
    for (start, end, step) in [(0.0, 1.0, -1.0), (1.0, 0.0, 1.0)] {
        let e = Tensor::arange(start, end, step, DType::F32, &d).unwrap_err();
        assert!(e.to_string().contains("inconsistent with the sign"), "{e}");
    }
    assert!(Tensor::new(vec![vec![1.0f32, 2.0], vec![3.0]], &d).is_err(), "ragged data is refused");
    let r = Tensor::randint(3, 7, &[1000], &d).unwrap().to_vec::<i64>().unwrap();
    assert!(r.iter().all(|&v| (3..7).contains(&v)) && (3..7).all(|v| r.contains(&v)));
    assert_eq!(Tensor::from_vec(vec![1.0f32; 5], &[2, 3], &d).unwrap_err().kind(), genesis::ErrorKind::ShapeMismatch);
}

#[test]
fn views_share_storage_and_copies_do_not() {
    let d = cpu();
    let x = Tensor::arange(0.0, 12.0, 1.0, DType::F32, &d).unwrap().reshape(&[3, 4]).unwrap();
    let t = x.t().unwrap();
    assert!(t.shares_storage(&x) && !t.is_contiguous());
    assert_eq!(t.to_vec::<f32>().unwrap()[..4], [0., 4., 8., 1.]);
    assert!(t.view(&[12]).is_err(), "a transposed tensor cannot be viewed flat");
    let flat = t.reshape(&[12]).unwrap();
    assert!(!flat.shares_storage(&x));
    let s = x.slice(1, 1, 4, 2).unwrap();
    assert!(s.shares_storage(&x));
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![1., 3., 5., 7., 9., 11.]);
    assert_eq!(x.select(0, -1).unwrap().to_vec::<f32>().unwrap(), vec![8., 9., 10., 11.]);
    let parts = x.chunk(2, 1).unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(Tensor::cat(&parts, 1).unwrap().to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
}

#[test]
fn type_promotion_follows_pytorch() {
    let d = cpu();
    let i = Tensor::new([1i64, 2], &d).unwrap();
    let f = Tensor::new([0.5f32, 0.5], &d).unwrap();
    let h = Tensor::new([genesis::f16::from_f32(1.0), genesis::f16::from_f32(2.0)], &d).unwrap();
    assert_eq!(i.add(&f).unwrap().dtype(), DType::F32);
    assert_eq!(i.mul_scalar(2.5).unwrap().dtype(), DType::F32);
    assert_eq!(i.mul_scalar(2).unwrap().dtype(), DType::I64);
    assert_eq!(h.mul_scalar(2.5).unwrap().dtype(), DType::F16);
    assert_eq!(i.div(&i).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
    assert_eq!(i.lt(&f).unwrap().dtype(), DType::Bool);
    assert_eq!(i.sum().unwrap().dtype(), DType::I64);
    assert!(i.mean().is_err(), "mean of integers needs a cast, as in PyTorch");
}

/// Issue 26 item 2: in-place results that do not fit the tensor raise, with PyTorch's wording;
/// integer division by zero raises on the CPU, as PyTorch's CPU ops do.
#[test]
fn in_place_results_and_integer_division_follow_pytorch() {
    let d = cpu();
    let ints = || Tensor::new([6i64, -7, 9], &d).unwrap();
    let e = ints().div_(&Tensor::new([2i64, 2, 2], &d).unwrap()).unwrap_err();
    assert!(e.to_string().contains("result type float32 can't be cast to the desired output type int64"), "{e}");
    let e = ints().mul_scalar_(0.5).unwrap_err();
    assert!(e.to_string().contains("can't be cast to the desired output type int64"), "{e}");
    let e = ints().add_(&Tensor::new([1.5f32, 0.0, 0.0], &d).unwrap()).unwrap_err();
    assert!(e.to_string().contains("float32"), "{e}");
    let flags = Tensor::new([true, false], &d).unwrap();
    assert!(flags.add_scalar_(1).is_err());
    // What fits is written: integer scalars into integers, anything into floats.
    let t = ints();
    t.mul_scalar_(2).unwrap();
    t.add_scalar_(1i64).unwrap();
    assert_eq!(t.to_vec::<i64>().unwrap(), vec![13, -13, 19]);
    let f = Tensor::new([1.0f32, 2.0], &d).unwrap();
    f.mul_scalar_(0.5).unwrap();
    f.div_(&Tensor::new([2i64, 4], &d).unwrap()).unwrap();
    assert_eq!(f.to_vec::<f32>().unwrap(), vec![0.25, 0.25]);
    // Out of place, integer true division gives floats; floor-style remainder by zero raises.
    assert_eq!(
        ints().div(&Tensor::new([4i64, 2, 3], &d).unwrap()).unwrap().to_vec::<f32>().unwrap(),
        vec![1.5, -3.5, 3.0]
    );
    let zero = Tensor::new([1i64, 0, 1], &d).unwrap();
    let e = ints().remainder(&zero).unwrap_err();
    assert!(e.to_string().contains("division by zero"), "{e}");
    let four = Tensor::new([4i64, 4, 4], &d).unwrap();
    assert_eq!(ints().remainder(&four).unwrap().to_vec::<i64>().unwrap(), vec![2, 1, 1]);
    // Floats follow IEEE.
    let inf = Tensor::new([1.0f32], &d).unwrap().div(&Tensor::new([0.0f32], &d).unwrap()).unwrap();
    assert_eq!(inf.to_vec::<f32>().unwrap(), vec![f32::INFINITY]);
}

/// `addmm_` accumulates a product into a matrix in place: the same result through the
/// backend's op and through the composition, bf16 products into an f32 matrix summed in f32,
/// and clear errors for operands that do not fit or take part in autograd.
#[test]
fn addmm_accumulates_a_product_in_place() {
    let gen = genesis::Generator::new(5);
    let (a, b) = (
        gen.normal(&[3, 5], 0.0, 1.0, DType::F32, &cpu()).unwrap(),
        gen.normal(&[4, 5], 0.0, 1.0, DType::F32, &cpu()).unwrap(),
    );
    let y0 = gen.normal(&[3, 4], 0.0, 1.0, DType::F32, &cpu()).unwrap();
    let expected = y0.add(&a.matmul(&b.t().unwrap()).unwrap()).unwrap().to_vec::<f32>().unwrap();
    let run = |a: &Tensor, b: &Tensor, y_dtype: DType| {
        let y = y0.copy().unwrap().to_dtype(y_dtype).unwrap();
        y.addmm_(a, &b.t().unwrap()).unwrap();
        y.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
    };
    let close = |got: &[f32], want: &[f32], tol: f32| {
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{got:?} vs {want:?}");
        }
    };
    close(&run(&a, &b, DType::F32), &expected, 1e-6);
    close(
        &genesis::testing::composites_only(|| Ok::<_, genesis::Error>(run(&a, &b, DType::F32))).unwrap(),
        &expected,
        1e-6,
    );
    // bf16 operands into an f32 matrix: the products of the bf16 values, summed in f32.
    let (a16, b16) = (a.to_dtype(DType::BF16).unwrap(), b.to_dtype(DType::BF16).unwrap());
    let wide = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let want = y0.add(&wide(&a16).matmul(&wide(&b16).t().unwrap()).unwrap()).unwrap().to_vec::<f32>().unwrap();
    close(&run(&a16, &b16, DType::F32), &want, 1e-6);
    close(
        &genesis::testing::composites_only(|| Ok::<_, genesis::Error>(run(&a16, &b16, DType::F32))).unwrap(),
        &want,
        1e-6,
    );
    // And into a bf16 matrix: one rounding of the f32 sum.
    close(&run(&a16, &b16, DType::BF16), &want, 8e-3);
    let y = y0.copy().unwrap();
    let err = y.addmm_(&a, &b).unwrap_err();
    assert!(err.message().contains("do not fit"), "{err}");
    let err = y0.to_dtype(DType::BF16).unwrap().addmm_(&a, &b.t().unwrap()).unwrap_err();
    assert_eq!(err.kind(), genesis::ErrorKind::DtypeMismatch, "{err}");
    let leaf = a.detach().requires_grad_(true).unwrap();
    assert!(y.addmm_(&leaf, &b.t().unwrap()).unwrap_err().message().contains("autograd"));
}
