//! The on-device logits processors and the draw, against host computations of the same
//! rules (transformers' definitions) and the distribution they must sample from.

use genesis::generation::{min_p_filter, repetition_penalty, sample, top_k_filter, top_p_filter, GenerationConfig};
use genesis::{Device, Generator, Tensor};

fn cpu() -> Device {
    Device::cpu().unwrap()
}

/// Rows of pseudo-random logits with a few exact ties.
fn logits(rows: usize, vocab: usize, seed: u64) -> Tensor {
    let g = Generator::new(seed);
    let t = g.normal(&[rows, vocab], 0.0, 3.0, genesis::DType::F32, &cpu()).unwrap();
    let mut v = t.to_vec::<f32>().unwrap();
    for r in 0..rows {
        v[r * vocab + 1] = v[r * vocab];
    }
    Tensor::from_vec(v, &[rows, vocab], &cpu()).unwrap()
}

fn kept(filtered: &Tensor) -> Vec<Vec<bool>> {
    let (rows, vocab) = (filtered.shape()[0], filtered.shape()[1]);
    let v = filtered.to_vec::<f32>().unwrap();
    (0..rows).map(|r| v[r * vocab..(r + 1) * vocab].iter().map(|x| x.is_finite()).collect()).collect()
}

fn row(t: &Tensor, r: usize) -> Vec<f32> {
    t.select(0, r as isize).unwrap().to_vec::<f32>().unwrap()
}

#[test]
fn top_k_keeps_the_k_largest_and_their_ties() {
    let l = logits(6, 300, 1);
    for k in [1, 2, 7, 50, 299] {
        let keep = kept(&top_k_filter(&l, k).unwrap());
        for (r, keep) in keep.iter().enumerate() {
            let mut sorted = row(&l, r);
            sorted.sort_by(|a, b| b.total_cmp(a));
            let kth = sorted[k - 1];
            let expected: Vec<bool> = row(&l, r).iter().map(|&x| x >= kth).collect();
            assert_eq!(keep, &expected, "k = {k}, row {r}");
        }
    }
    assert_eq!(kept(&top_k_filter(&l, 0).unwrap()), kept(&l), "k = 0 is off");
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    let l = logits(6, 200, 2);
    for p in [0.05, 0.3, 0.8, 0.95, 0.999] {
        let keep = kept(&top_p_filter(&l, p).unwrap());
        for (r, keep) in keep.iter().enumerate() {
            let x = row(&l, r);
            let max = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let z: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
            let mut probs: Vec<(f64, usize)> = x.iter().map(|&v| (v as f64 - max).exp() / z).zip(0..).collect();
            probs.sort_by(|a, b| b.0.total_cmp(&a.0));
            let (mut mass, mut expected) = (0.0, vec![false; x.len()]);
            for &(q, i) in &probs {
                if mass >= p {
                    break;
                }
                mass += q;
                expected[i] = true;
            }
            assert_eq!(keep, &expected, "p = {p}, row {r}");
        }
    }
}

#[test]
fn min_p_and_repetition_penalty_follow_transformers() {
    let l = Tensor::new([[2.0f32, -1.0, 0.0, 1.0]], &cpu()).unwrap();
    // probabilities ∝ e^2, e^-1, 1, e: min_p 0.3 keeps p >= 0.3 p_max, i.e. logit >= 2 + ln 0.3.
    assert_eq!(kept(&min_p_filter(&l, 0.3).unwrap())[0], vec![true, false, false, true]);
    let seen = Tensor::new([[1.0f32, 2.0, 0.0, 0.0]], &cpu()).unwrap();
    let penalized = repetition_penalty(&l, &seen, 2.0).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(penalized, vec![1.0, -2.0, 0.0, 1.0]);
}

#[test]
fn draws_follow_the_softmax_distribution() {
    // 20000 rows of the same logits: frequencies within 5 standard errors of softmax.
    let probs = [0.5f64, 0.25, 0.125, 0.0625, 0.0625];
    let row: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    let n = 20_000;
    let l = Tensor::from_vec(row.repeat(n), &[n, probs.len()], &cpu()).unwrap();
    let config = GenerationConfig { do_sample: true, top_k: 0, ..Default::default() };
    let ids = sample(&l, None, &config, &Generator::new(11)).unwrap().to_vec::<i64>().unwrap();
    for (i, &p) in probs.iter().enumerate() {
        let freq = ids.iter().filter(|&&id| id == i as i64).count() as f64 / n as f64;
        let se = (p * (1.0 - p) / n as f64).sqrt();
        assert!((freq - p).abs() < 5.0 * se, "token {i}: frequency {freq}, probability {p}");
    }
    // Temperature 0.5 squares the probabilities (renormalized): token 0 gets 0.25/0.3359.
    let hot = GenerationConfig { temperature: 0.5, ..config };
    let ids = sample(&l, None, &hot, &Generator::new(12)).unwrap().to_vec::<i64>().unwrap();
    let freq = ids.iter().filter(|&&id| id == 0).count() as f64 / n as f64;
    let p0 = 0.25 / probs.iter().map(|p| p * p).sum::<f64>();
    assert!((freq - p0).abs() < 5.0 * (p0 * (1.0 - p0) / n as f64).sqrt(), "{freq} vs {p0}");
}

#[test]
fn top_k_ignores_already_masked_tokens() {
    let l = Tensor::new([[3.0f32, f32::NEG_INFINITY, 1.0, 2.0, f32::NEG_INFINITY, -5.0]], &cpu()).unwrap();
    assert_eq!(kept(&top_k_filter(&l, 2).unwrap())[0], vec![true, false, false, true, false, false]);
    assert_eq!(kept(&top_k_filter(&l, 3).unwrap())[0], vec![true, false, true, true, false, false]);
}

#[test]
fn processors_refuse_logits_that_are_not_batch_by_vocab() {
    let flat = Tensor::new([1.0f32, 2.0, 3.0], &cpu()).unwrap();
    assert!(top_k_filter(&flat, 1).is_err());
    assert!(top_p_filter(&flat, 0.5).is_err());
    assert!(min_p_filter(&flat, 0.5).is_err());
    assert!(sample(&flat, None, &GenerationConfig::default(), &Generator::new(0)).is_err());
}
