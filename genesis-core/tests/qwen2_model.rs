//! Qwen2 on random weights: incremental decoding against full recomputation, batching with
//! left padding, configs, saving and loading, and sampling.

use genesis::generation::{generate, GenerationConfig, GraphUse};
use genesis::models::qwen2::{Qwen2Config, Qwen2ForCausalLM};
use genesis::nn::Module;
use genesis::{no_grad, DType, Device, Tensor};

fn tiny_config(tied: bool) -> Qwen2Config {
    let mut c = Qwen2Config::qwen2_5_0_5b();
    c.vocab_size = 97;
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 8;
    c.max_position_embeddings = 128;
    c.rope_theta = 10000.0;
    c.tie_word_embeddings = tied;
    c.initializer_range = 0.3;
    c
}

/// `f` right after `manual_seed(seed)`, with no other test of this binary drawing from the
/// global generator meanwhile: tests run on parallel threads, and a seed set by one would
/// otherwise change the weights another draws (and which tolerances its model meets).
fn seeded<T>(seed: u64, f: impl FnOnce() -> T) -> T {
    static GLOBAL_GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _only_us = GLOBAL_GENERATOR.lock().unwrap_or_else(|p| p.into_inner());
    genesis::manual_seed(seed);
    f()
}

fn model(tied: bool) -> Qwen2ForCausalLM {
    seeded(7, || Qwen2ForCausalLM::new(tiny_config(tied), &Device::cpu().unwrap(), DType::F32).unwrap())
}

fn ids(v: &[u32]) -> Tensor {
    let data: Vec<i64> = v.iter().map(|&i| i as i64).collect();
    Tensor::from_vec(data, &[1, v.len()], &Device::cpu().unwrap()).unwrap()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// Greedy decoding by recomputing the whole sequence at every step (no cache).
fn greedy_by_recomputation(m: &Qwen2ForCausalLM, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    for _ in 0..n {
        let logits = no_grad(|| m.forward(&ids(&seq))).unwrap();
        let last = logits.select(1, -1).unwrap();
        seq.push(last.argmax(Some(-1), false).unwrap().to_vec::<i64>().unwrap()[0] as u32);
    }
    seq[prompt.len()..].to_vec()
}

#[test]
fn cached_steps_match_the_full_forward() {
    let m = model(false);
    let seq = [3u32, 17, 42, 5, 88, 1, 60, 33, 9];
    let full = no_grad(|| m.forward(&ids(&seq))).unwrap();
    // Prefill of 4 tokens, then one at a time; a cache with capacity 2 must grow on the way.
    let mut cache = genesis::models::KvCache::with_capacity(2, 2, 3);
    // f32 rounding differs between one pass and the cached steps: a bound relative to the
    // logits' size (about 4e-6 of 5.5 here), far below what a wrong cache entry would give.
    let scale = full.abs().unwrap().max().unwrap().item::<f32>().unwrap().max(1.0) as f64;
    let first = no_grad(|| m.forward_step(&ids(&seq[..4]), None, &mut cache)).unwrap();
    assert!(max_abs_diff(&first, &full.select(1, 3).unwrap()) < 4e-6 * scale);
    for t in 4..seq.len() {
        let step = no_grad(|| m.forward_step(&ids(&seq[t..t + 1]), None, &mut cache)).unwrap();
        let diff = max_abs_diff(&step, &full.select(1, t as isize).unwrap());
        assert!(diff < 4e-6 * scale, "position {t}: {diff:e} (logits up to {scale})");
    }
    assert_eq!(cache.len(), seq.len());
    assert!(cache.capacity() >= seq.len());
}

#[test]
fn greedy_generation_equals_recomputation() {
    for tied in [true, false] {
        let m = model(tied);
        let prompt = [5u32, 9, 11, 2];
        let config = GenerationConfig { max_new_tokens: 12, ..Default::default() };
        let got = generate(&m, &[prompt.to_vec()], &config).unwrap();
        assert_eq!(got[0], greedy_by_recomputation(&m, &prompt, 12), "tied = {tied}");
    }
}

#[test]
fn left_padded_batch_matches_each_prompt_alone() {
    let m = model(true);
    let prompts = vec![vec![5u32, 9, 11, 2, 7, 7], vec![40u32, 3], vec![1u32, 2, 3, 4]];
    let config = GenerationConfig { max_new_tokens: 8, pad_token_id: Some(0), ..Default::default() };
    let batched = generate(&m, &prompts, &config).unwrap();
    for (p, out) in prompts.iter().zip(&batched) {
        assert_eq!(out, &generate(&m, std::slice::from_ref(p), &config).unwrap()[0]);
    }
}

#[test]
fn padding_mask_forward_matches_unpadded_rows() {
    let m = model(false);
    let cpu = Device::cpu().unwrap();
    let row = [7u32, 8, 9, 10];
    let alone = no_grad(|| m.forward(&ids(&row))).unwrap();
    let padded = Tensor::from_vec(vec![0i64, 0, 7, 8, 9, 10], &[1, 6], &cpu).unwrap();
    let mask = Tensor::from_vec(vec![0i64, 0, 1, 1, 1, 1], &[1, 6], &cpu).unwrap();
    let out = no_grad(|| m.forward_with_mask(&padded, Some(&mask))).unwrap();
    assert!(out.to_f64_vec().unwrap().iter().all(|x| x.is_finite()));
    assert!(max_abs_diff(&out.narrow(1, 2, 4).unwrap(), &alone) < 1e-4);
}

#[test]
fn eos_stops_a_row_and_the_eos_is_returned() {
    let m = model(true);
    let prompt = vec![5u32, 9, 11, 2];
    let free =
        generate(&m, std::slice::from_ref(&prompt), &GenerationConfig { max_new_tokens: 6, ..Default::default() })
            .unwrap();
    let stop = free[0][2];
    let config = GenerationConfig { max_new_tokens: 6, eos_token_ids: vec![stop], ..Default::default() };
    let got = generate(&m, &[prompt], &config).unwrap();
    let end = free[0].iter().position(|&t| t == stop).unwrap();
    assert_eq!(got[0], free[0][..=end].to_vec());
}

#[test]
fn sampling_is_seeded_and_top_k_one_is_greedy() {
    let m = model(true);
    let prompt = vec![vec![5u32, 9, 11, 2]];
    let sampled = GenerationConfig { max_new_tokens: 10, do_sample: true, seed: Some(3), ..Default::default() };
    let a = generate(&m, &prompt, &sampled).unwrap();
    assert_eq!(a, generate(&m, &prompt, &sampled).unwrap(), "same seed, same tokens");
    let other = GenerationConfig { seed: Some(4), ..sampled.clone() };
    let greedy = generate(&m, &prompt, &GenerationConfig { max_new_tokens: 10, ..Default::default() }).unwrap();
    let k1 = GenerationConfig { top_k: 1, ..sampled.clone() };
    assert_eq!(generate(&m, &prompt, &k1).unwrap(), greedy);
    let tiny_p = GenerationConfig { top_p: 1e-6, ..sampled.clone() };
    assert_eq!(generate(&m, &prompt, &tiny_p).unwrap(), greedy);
    let one_min_p = GenerationConfig { min_p: 1.0, ..sampled };
    assert_eq!(generate(&m, &prompt, &one_min_p).unwrap(), greedy);
    // A high temperature over 10 tokens differs between seeds (97-way choices).
    let hot = |seed| GenerationConfig { temperature: 5.0, seed: Some(seed), top_k: 0, ..other.clone() };
    assert_ne!(generate(&m, &prompt, &hot(1)).unwrap(), generate(&m, &prompt, &hot(2)).unwrap());
}

#[test]
fn save_and_load_round_trip() {
    for tied in [true, false] {
        let m = model(tied);
        let dir = std::env::temp_dir().join(format!("genesis-qwen2-rt-{}-{tied}", std::process::id()));
        m.save_pretrained(&dir).unwrap();
        let back = Qwen2ForCausalLM::from_pretrained(&dir, &Device::cpu().unwrap(), DType::F32).unwrap();
        assert_eq!(back.config.tie_word_embeddings, tied);
        assert_eq!(back.lm_head.is_some(), !tied);
        let x = ids(&[1, 2, 3, 4, 5]);
        let (a, b) = (no_grad(|| m.forward(&x)).unwrap(), no_grad(|| back.forward(&x)).unwrap());
        assert_eq!(max_abs_diff(&a, &b), 0.0);
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn training_forward_matches_inference_and_reaches_every_projection() {
    let m = model(false);
    let x = ids(&[4, 8, 15, 16, 23, 42]);
    let inference = no_grad(|| m.forward(&x)).unwrap();
    let training = m.forward(&x).unwrap();
    assert!(max_abs_diff(&inference, &training) < 1e-5);
    training.square().unwrap().mean().unwrap().backward().unwrap();
    for (name, p) in m.named_parameters() {
        let g = p.grad().unwrap_or_else(|| panic!("{name} has no gradient"));
        assert!(g.abs().unwrap().sum().unwrap().item::<f32>().unwrap() > 0.0, "{name}");
    }
    // Names are Hugging Face's, stacked storage notwithstanding.
    let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"model.layers.1.self_attn.k_proj.bias".to_string()));
    assert!(names.contains(&"model.layers.0.mlp.up_proj.weight".to_string()));
}

#[test]
fn bad_ids_and_a_mismatched_cache_are_errors() {
    let m = model(true);
    let cpu = Device::cpu().unwrap();
    let flat = Tensor::from_vec(vec![1i64, 2, 3], &[3], &cpu).unwrap();
    assert!(m.forward(&flat).is_err());
    let empty = Tensor::from_vec(Vec::<i64>::new(), &[1, 0], &cpu).unwrap();
    let mut cache = m.new_cache(8);
    assert!(no_grad(|| m.forward_step(&empty, None, &mut cache)).is_err());
    // A cache filled for batch 1 refuses a batch of 2 instead of reading stale memory.
    no_grad(|| m.forward_step(&ids(&[1, 2, 3]), None, &mut cache)).unwrap();
    let two = Tensor::from_vec(vec![4i64, 5], &[2, 1], &cpu).unwrap();
    let err = no_grad(|| m.forward_step(&two, None, &mut cache)).unwrap_err();
    assert!(err.message().contains("kv cache"), "{err}");
    cache.clear();
    assert!(no_grad(|| m.forward_step(&two, None, &mut cache)).is_ok());
    // Prompt ids and the pad id must lie in the vocabulary.
    let config = GenerationConfig { max_new_tokens: 2, ..Default::default() };
    assert!(generate(&m, &[vec![1, 97]], &config).is_err());
    assert!(generate(&m, &[vec![1], vec![]], &config).is_err());
    let bad_pad = GenerationConfig { pad_token_id: Some(500), ..config };
    assert!(generate(&m, &[vec![1, 2], vec![3]], &bad_pad).is_err());
}

#[test]
fn generation_stops_at_the_last_position_and_rows_can_be_finished() {
    let m = model(true); // 128 positions
    let prompt = vec![(0..120).map(|i| (i % 90) as u32).collect::<Vec<u32>>()];
    let out = generate(&m, &prompt, &GenerationConfig { max_new_tokens: 50, ..Default::default() }).unwrap();
    assert_eq!(out[0].len(), 8);
    let too_long = vec![(0..128).map(|i| (i % 90) as u32).collect::<Vec<u32>>()];
    assert!(generate(&m, &too_long, &GenerationConfig::default()).is_err());
    let config = GenerationConfig { max_new_tokens: 5, ..Default::default() };
    let mut g = genesis::generation::Generation::new(&m, &[vec![1, 2], vec![3, 4]], &config).unwrap();
    assert!(g.step().unwrap().iter().all(Option::is_some));
    g.finish_row(0);
    let next = g.step().unwrap();
    assert!(next[0].is_none() && next[1].is_some());
}

#[test]
fn decoding_through_a_captured_graph_gives_the_same_ids() {
    let m = model(true);
    let cases: [(Vec<Vec<u32>>, GenerationConfig); 3] = [
        (vec![vec![3, 17, 42, 5]], GenerationConfig { max_new_tokens: 12, ..Default::default() }),
        // Left padding, and a repetition penalty that reads the fed ids.
        (
            vec![vec![3, 17, 42, 5, 88], vec![9, 60]],
            GenerationConfig {
                max_new_tokens: 9,
                pad_token_id: Some(0),
                repetition_penalty: 1.3,
                ..Default::default()
            },
        ),
        // Sampling draws outside the graph, so seeded runs agree too.
        (
            vec![vec![11, 12, 13]],
            GenerationConfig { max_new_tokens: 10, do_sample: true, seed: Some(5), top_k: 20, ..Default::default() },
        ),
    ];
    // Greedy rows feed themselves inside the graph, several tokens per read: two padded
    // rows, and an end id that one row reaches in the middle of a read's tokens.
    let greedy = |eos: Vec<u32>| GenerationConfig {
        max_new_tokens: 14,
        pad_token_id: Some(0),
        eos_token_ids: eos,
        ..Default::default()
    };
    let two = vec![vec![3, 17, 42, 5, 88], vec![9, 60]];
    let plain = generate(&m, &two, &GenerationConfig { graph: GraphUse::Never, ..greedy(vec![]) }).unwrap();
    let early_end = plain[1][3];
    let cases = cases.into_iter().chain([(two.clone(), greedy(vec![])), (two, greedy(vec![early_end]))]);
    for (prompts, config) in cases {
        let run = |use_graph: bool| {
            let graph = if use_graph { GraphUse::Always } else { GraphUse::Never };
            let config = GenerationConfig { graph, ..config.clone() };
            let mut generation = genesis::generation::Generation::new(&m, &prompts, &config).unwrap();
            let mut out = Vec::new();
            while !generation.is_done() {
                out.push(generation.step().unwrap());
            }
            (out, generation.uses_graph())
        };
        let (plain, plain_graph) = run(false);
        let (graphed, graphed_graph) = run(true);
        assert!(!plain_graph && graphed_graph, "the CPU backend captures graphs");
        assert_eq!(plain, graphed, "prompts {prompts:?}");
    }
}

/// Positioned decode steps (`forward_step_at`, the captured step) after a prefill: each step's
/// logits and its greedy token, fed to the next.
fn positioned_steps(m: &Qwen2ForCausalLM, steps: usize) -> Vec<(Vec<f64>, u32)> {
    let cpu = Device::cpu().unwrap();
    no_grad(|| {
        let mut cache = m.new_cache(16);
        m.forward_step(&ids(&[3, 17, 42, 5]), None, &mut cache).unwrap();
        let len = cache.len();
        cache.zero_from(len).unwrap();
        let keys = Tensor::arange(0.0, cache.capacity() as f64, 1.0, DType::I64, &cpu).unwrap();
        let mut next = 7u32;
        (0..steps)
            .map(|step| {
                let position = Tensor::from_vec(vec![(len + step) as i64], &[1], &cpu).unwrap();
                let mask = keys.le(&position).unwrap().reshape(&[1, 1, 1, -1]).unwrap();
                let logits = m.forward_step_at(&ids(&[next]), &position, &mask, &mut cache).unwrap();
                next = logits.argmax(Some(-1), false).unwrap().to_vec::<i64>().unwrap()[0] as u32;
                (logits.to_f64_vec().unwrap(), next)
            })
            .collect()
    })
}

#[test]
fn the_fused_rotary_cache_write_matches_its_composite() {
    let m = model(false);
    let cpu = Device::cpu().unwrap();
    assert!(cpu.supports(&genesis_backend_api::Op::RotaryKvWrite, DType::F32).unwrap(), "the CPU runs the fused op");
    let fused = positioned_steps(&m, 6);
    // The composites of the other nn ops (norms, attention, SwiGLU) round differently, so the
    // logits agree to f32 accuracy (the op itself is compared bit for bit below) and the
    // tokens exactly.
    let composite = genesis::testing::composites_only(|| positioned_steps(&m, 6));
    let diff = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    for (step, ((fl, fid), (cl, cid))) in fused.iter().zip(&composite).enumerate() {
        assert!(diff(fl, cl) < 1e-5, "step {step}: {}", diff(fl, cl));
        assert_eq!(fid, cid, "step {step}");
    }
    // And both are the decode of the appending steps.
    let mut cache = m.new_cache(16);
    no_grad(|| m.forward_step(&ids(&[3, 17, 42, 5]), None, &mut cache)).unwrap();
    let mut next = 7u32;
    for (step, (logits, id)) in fused.iter().enumerate() {
        let plain = no_grad(|| m.forward_step(&ids(&[next]), None, &mut cache)).unwrap();
        assert!(diff(&plain.to_f64_vec().unwrap(), logits) < 1e-5, "step {step}");
        next = plain.argmax(Some(-1), false).unwrap().to_vec::<i64>().unwrap()[0] as u32;
        assert_eq!(next, *id, "step {step}");
    }
    // Generation through a captured graph gives the same ids on either path.
    let config = GenerationConfig { max_new_tokens: 8, graph: GraphUse::Always, ..Default::default() };
    let prompts = [vec![3, 17, 42, 5, 88], vec![9, 60]];
    let config = GenerationConfig { pad_token_id: Some(0), ..config };
    let graphed = generate(&m, &prompts, &config).unwrap();
    assert_eq!(graphed, genesis::testing::composites_only(|| generate(&m, &prompts, &config)).unwrap());
}

#[test]
fn the_rotated_cache_write_refuses_a_position_outside_the_cache() {
    let cpu = Device::cpu().unwrap();
    // Values from a formula, not the global generator (which the other tests seed while
    // building their models).
    let f = |shape: &[usize], seed: u64| {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|i| ((i as f64 * 0.73 + seed as f64 * 1.9).sin() * 1.5) as f32).collect();
        Tensor::from_vec(values, shape, &cpu).unwrap()
    };
    let (q, k, v) = (f(&[1, 4, 1, 8], 1), f(&[1, 2, 1, 8], 2), f(&[1, 2, 1, 8], 3));
    let (cos, sin) = (f(&[1, 4], 4), f(&[1, 4], 5));
    let at = |p: i64| Tensor::from_vec(vec![p], &[1], &cpu).unwrap();
    let mut written = Vec::new();
    for composite in [false, true] {
        let run = || {
            let mut cache = genesis::models::KvCache::with_capacity(1, 6, 6);
            // No buffers before the first append.
            let err = no_grad(|| cache.write_rotated_at(0, &at(0), &q, &k, &v, &cos, &sin)).unwrap_err();
            assert!(err.message().contains("no buffers"), "{err}");
            no_grad(|| cache.append(0, &f(&[1, 2, 2, 8], 6), &f(&[1, 2, 2, 8], 7))).unwrap();
            cache.advance(2);
            cache.zero_from(2).unwrap();
            let (_, kb, vb) = no_grad(|| cache.write_rotated_at(0, &at(2), &q, &k, &v, &cos, &sin)).unwrap();
            let before = (kb.to_f64_vec().unwrap(), vb.to_f64_vec().unwrap());
            for p in [-1, 6, 7] {
                let err = no_grad(|| cache.write_rotated_at(0, &at(p), &q, &k, &v, &cos, &sin)).unwrap_err();
                assert_eq!(err.kind(), genesis::ErrorKind::InvalidArgument, "{err}");
                assert_eq!((kb.to_f64_vec().unwrap(), vb.to_f64_vec().unwrap()), before, "position {p}");
            }
            // The last position: rotary(q) back, rotary(k) and v in the buffers' last row.
            let (q_out, kb, vb) = no_grad(|| cache.write_rotated_at(0, &at(5), &q, &k, &v, &cos, &sin)).unwrap();
            let rotated =
                |x: &Tensor| genesis::nn::functional::rotary_embedding(x, &cos, &sin).unwrap().to_f64_vec().unwrap();
            assert_eq!(q_out.to_f64_vec().unwrap(), rotated(&q));
            assert_eq!(kb.narrow(2, 5, 1).unwrap().to_f64_vec().unwrap(), rotated(&k));
            assert_eq!(vb.narrow(2, 5, 1).unwrap().to_f64_vec().unwrap(), v.to_f64_vec().unwrap());
            let mut outputs = [q_out, kb.clone(), vb.clone()].map(|t| t.to_f64_vec().unwrap()).to_vec();
            // Several new positions (3, at 2..5 of a cache whose first position holds a key).
            let mut three = genesis::models::KvCache::with_capacity(1, 6, 6);
            no_grad(|| three.append(0, &f(&[1, 2, 1, 8], 9), &f(&[1, 2, 1, 8], 10))).unwrap();
            three.advance(1);
            three.zero_from(1).unwrap();
            let (q3, k3, v3) = (f(&[1, 4, 3, 8], 11), f(&[1, 2, 3, 8], 12), f(&[1, 2, 3, 8], 13));
            let (cos3, sin3) = (f(&[3, 4], 14), f(&[3, 4], 15));
            let (q_out, kb3, vb3) = no_grad(|| three.write_rotated_at(0, &at(2), &q3, &k3, &v3, &cos3, &sin3)).unwrap();
            assert_eq!(vb3.narrow(2, 2, 3).unwrap().to_f64_vec().unwrap(), v3.to_f64_vec().unwrap());
            assert!(vb3.narrow(2, 5, 1).unwrap().to_f64_vec().unwrap().iter().all(|&x| x == 0.0));
            assert!(no_grad(|| three.write_rotated_at(0, &at(4), &q3, &k3, &v3, &cos3, &sin3)).is_err());
            outputs.extend([q_out, kb3, vb3].map(|t| t.to_f64_vec().unwrap()));
            // Not differentiable: a tensor that takes part in autograd is refused.
            let q_grad = q.clone().requires_grad_(true).unwrap();
            let err = cache.write_rotated_at(0, &at(4), &q_grad, &k, &v, &cos, &sin).unwrap_err();
            assert!(err.message().contains("autograd"), "{err}");
            // Shapes and dtypes are checked with the op's name.
            let err = no_grad(|| cache.write_rotated_at(0, &at(4), &q, &k, &v, &sin, &f(&[2, 4], 8))).unwrap_err();
            assert_eq!(err.message(), "rotary_kv_write: sin has shape [2, 4], expected [1, 4]");
            let err =
                no_grad(|| cache.write_rotated_at(0, &at(4), &q, &k.to_dtype(DType::F64).unwrap(), &v, &cos, &sin))
                    .unwrap_err();
            assert_eq!(err.kind(), genesis::ErrorKind::DtypeMismatch, "{err}");
            outputs
        };
        written.push(if composite { genesis::testing::composites_only(run) } else { run() });
    }
    // f32 rotary rounds each product and their sum alike in the kernel and in the composite,
    // and the composite adds into zeros: the fused op and its composite agree bit for bit.
    assert_eq!(written[0], written[1]);
}

/// Training runs each group of projections that reads one input (q/k/v, gate/up) as one
/// stacked layer; with `set_recompute_mlp_activations` the MLP's down projection computes its
/// activation again in the backward. The gradients of every parameter, either way, equal those
/// of the same weights held as separate tensors, which take the layer-by-layer path, in f64.
#[test]
fn stacked_training_path_gives_the_layer_by_layer_gradients() {
    use genesis::nn::functional::cross_entropy;
    use genesis::nn::Reduction;
    use genesis::profiler::{profile, ProfilerOptions};
    let cpu = Device::cpu().unwrap();
    let new = |dtype| seeded(11, || Qwen2ForCausalLM::new(tiny_config(true), &cpu, dtype).unwrap());
    let stacked = new(DType::F64);
    let recomputing = new(DType::F64);
    recomputing.load_state_dict(&stacked.state_dict(), true).unwrap();
    recomputing.set_recompute_mlp_activations(true);
    // Cast from f32, each parameter becomes a tensor of its own: nothing is adjacent.
    let separate = new(DType::F32);
    separate.to_dtype(DType::F64).unwrap();
    separate.load_state_dict(&stacked.state_dict(), true).unwrap();
    let tokens = ids(&[5, 17, 3, 88, 41, 9, 60, 2]);
    let targets = ids(&[17, 3, 88, 41, 9, 60, 2, 5]).reshape(&[-1]).unwrap();
    let loss = |m: &Qwen2ForCausalLM| {
        let logits = m.forward(&tokens).unwrap();
        let logits = logits.reshape(&[-1, logits.shape()[2] as isize]).unwrap();
        cross_entropy(&logits, &targets, -100, 0.0, Reduction::Mean).unwrap()
    };
    let options = ProfilerOptions { device_time: false, ..Default::default() };
    let (a, r, b) = (loss(&stacked), loss(&recomputing), loss(&separate));
    for other in [&r, &b] {
        assert!((a.item::<f64>().unwrap() - other.item::<f64>().unwrap()).abs() < 1e-12);
    }
    let recomputes = |loss: &Tensor| {
        let ((), trace) = profile(options, || loss.backward()).unwrap();
        let names: Vec<String> = trace.events().iter().map(|e| e.name.clone()).collect();
        names.iter().any(|n| n == "SwigluLinearBackward")
    };
    assert!(!recomputes(&a), "by default the activation is kept");
    assert!(recomputes(&r), "set_recompute_mlp_activations(true) recomputes it");
    assert!(!recomputes(&b), "the separate weights take the layer-by-layer path");
    let grads = |m: &Qwen2ForCausalLM| -> Vec<(String, Tensor)> {
        m.named_parameters().into_iter().map(|(n, p)| (n, p.grad().expect("a gradient"))).collect()
    };
    let (ga, gr, gb) = (grads(&stacked), grads(&recomputing), grads(&separate));
    assert_eq!((ga.len(), gr.len()), (gb.len(), gb.len()));
    for (((name, x), (_, z)), (_, y)) in ga.iter().zip(&gr).zip(&gb) {
        let scale = y.abs().unwrap().max().unwrap().item::<f64>().unwrap().max(1e-3);
        assert!(max_abs_diff(x, y) <= 1e-10 * scale, "{name}: {}", max_abs_diff(x, y));
        assert!(max_abs_diff(z, y) <= 1e-10 * scale, "{name} (recomputed): {}", max_abs_diff(z, y));
    }
}
