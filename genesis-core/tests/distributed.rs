//! Process groups, collectives and DistributedDataParallel on the CPU.
//!
//! Most tests run each rank on its own thread of this process (every rank has its own
//! `ProcessGroup`, connections and store client, exactly as separate processes would). The
//! failure tests start real processes: this test binary runs itself as a rank (the ignored
//! test `rank_process`, chosen by environment variables).

use genesis::distributed::{DdpOptions, DistributedDataParallel, InitOptions, ProcessGroup, ReduceOp, Transport};
use genesis::nn::{functional::mse_loss, Entry, Linear, Module, Reduction};
use genesis::optim::{Optimizer, SgdOptions, SGD};
use genesis::{DType, Device, ErrorKind, Result, Tensor};
use std::net::TcpListener;
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// Run `f(group)` on `world` threads, one per rank; the results in rank order.
fn on_ranks<T: Send + 'static>(
    world: usize,
    f: impl Fn(ProcessGroup) -> Result<T> + Send + Sync + Clone + 'static,
) -> Vec<Result<T>> {
    let port = free_port();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let f = f.clone();
            std::thread::spawn(move || {
                let options = InitOptions {
                    rank,
                    world_size: world,
                    local_rank: rank,
                    master_addr: "127.0.0.1".into(),
                    master_port: port,
                    timeout: Duration::from_secs(20),
                    transport: Transport::Auto,
                };
                f(ProcessGroup::new(options)?)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("a rank thread panicked")).collect()
}

#[test]
fn collectives_give_every_rank_the_same_answer() -> Result<()> {
    for world in [1, 2, 3, 4] {
        let results = on_ranks(world, move |group| {
            let cpu = Device::cpu()?;
            let r = group.rank() as f32;
            // 7 elements: chunks of the ring are uneven.
            let values: Vec<f32> = (0..7).map(|i| r * 10.0 + i as f32).collect();
            let sum = Tensor::from_vec(values.clone(), &[7], &cpu)?;
            group.all_reduce_(&sum, ReduceOp::Sum)?;
            let mean = Tensor::from_vec(values, &[7], &cpu)?;
            group.all_reduce_(&mean, ReduceOp::Average)?;
            let ints = Tensor::from_vec(vec![group.rank() as i64 + 1; 3], &[3], &cpu)?;
            group.all_reduce_(&ints, ReduceOp::Sum)?;
            let from_last = Tensor::full(&[2, 2], r as f64, DType::F64, &cpu)?;
            group.broadcast_(&from_last, world - 1)?;
            let gathered = group.all_gather(&Tensor::full(&[2], r as f64, DType::F32, &cpu)?)?;
            let rows = Tensor::from_vec((0..world * 2).map(|i| i as f32 + r).collect::<Vec<_>>(), &[world * 2], &cpu)?;
            let mine = group.reduce_scatter(&rows, ReduceOp::Sum)?;
            group.barrier()?;
            Ok((
                sum.to_vec::<f32>()?,
                mean.to_vec::<f32>()?,
                ints.to_vec::<i64>()?,
                from_last.to_vec::<f64>()?,
                gathered.iter().map(|t| t.to_vec::<f32>()).collect::<Result<Vec<_>>>()?,
                mine.to_vec::<f32>()?,
            ))
        });
        let ranks_total: f32 = (0..world).map(|r| r as f32).sum();
        for (rank, result) in results.into_iter().enumerate() {
            let (sum, mean, ints, from_last, gathered, mine) = result?;
            let w = world as f32;
            let expected: Vec<f32> = (0..7).map(|i| ranks_total * 10.0 + w * i as f32).collect();
            assert_eq!(sum, expected, "world {world} rank {rank}");
            let expected_mean: Vec<f32> = expected.iter().map(|v| v / w).collect();
            for (a, b) in mean.iter().zip(&expected_mean) {
                assert!((a - b).abs() < 1e-5, "world {world} rank {rank}: mean {mean:?} vs {expected_mean:?}");
            }
            let tri = (world * (world + 1) / 2) as i64;
            assert_eq!(ints, vec![tri; 3]);
            assert_eq!(from_last, vec![(world - 1) as f64; 4]);
            let expected_gather: Vec<Vec<f32>> = (0..world).map(|r| vec![r as f32; 2]).collect();
            assert_eq!(gathered, expected_gather);
            let expected_chunk: Vec<f32> = (rank * 2..rank * 2 + 2).map(|i| w * i as f32 + ranks_total).collect();
            assert_eq!(mine, expected_chunk, "world {world} rank {rank}: reduce_scatter");
        }
    }
    Ok(())
}

#[test]
fn collectives_refuse_mismatched_input() -> Result<()> {
    let results = on_ranks(2, |group| {
        let cpu = Device::cpu()?;
        let odd = Tensor::zeros(&[3], DType::F32, &cpu)?;
        let scatter = group.reduce_scatter(&odd, ReduceOp::Sum).err().map(|e| e.to_string());
        let average_ints = Tensor::zeros(&[2], DType::I64, &cpu)?;
        let ints = group.all_reduce_(&average_ints, ReduceOp::Average).err().map(|e| e.to_string());
        let bad_root = group.broadcast_(&odd, 5).err().map(|e| e.to_string());
        Ok((scatter, ints, bad_root))
    });
    for result in results {
        let (scatter, ints, bad_root) = result?;
        assert!(scatter.is_some_and(|e| e.contains("equal chunks")));
        assert!(ints.is_some_and(|e| e.contains("average")));
        assert!(bad_root.is_some_and(|e| e.contains("rank 5")));
    }
    let bad = ProcessGroup::new(InitOptions {
        rank: 2,
        world_size: 2,
        local_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: free_port(),
        timeout: Duration::from_secs(1),
        transport: Transport::Auto,
    });
    assert!(bad.err().is_some_and(|e| e.message().contains("rank 2")));
    Ok(())
}

/// A two-layer network whose first layer gets a gradient only through `use_second`.
struct Net {
    fc1: Linear,
    fc2: Linear,
    spare: Linear,
}

impl Net {
    fn new(cpu: &Device) -> Result<Net> {
        Ok(Net {
            fc1: Linear::new(4, 8, true, cpu)?,
            fc2: Linear::new(8, 2, true, cpu)?,
            spare: Linear::new(2, 2, false, cpu)?,
        })
    }
}

impl Module for Net {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc2.forward(&self.fc1.forward(x)?.tanh()?)
    }
    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("fc1", Entry::Child(&self.fc1));
        f("fc2", Entry::Child(&self.fc2));
        f("spare", Entry::Child(&self.spare));
    }
}

fn batch(step: usize, rows: usize) -> Result<(Tensor, Tensor)> {
    let cpu = Device::cpu()?;
    let x: Vec<f32> = (0..rows * 4).map(|i| ((i * 7 + step * 13) % 17) as f32 / 8.0 - 1.0).collect();
    let y: Vec<f32> = (0..rows * 2).map(|i| ((i * 5 + step * 3) % 11) as f32 / 5.0 - 1.0).collect();
    Ok((Tensor::from_vec(x, &[rows, 4], &cpu)?, Tensor::from_vec(y, &[rows, 2], &cpu)?))
}

/// The generator is one per process, shared by the rank threads and by the tests running
/// at once: every network of this file is seeded and drawn under this lock.
static SEEDING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn seeded_net(seed: u64) -> Result<Net> {
    let _one_at_a_time = SEEDING.lock().unwrap_or_else(|p| p.into_inner());
    genesis::manual_seed(seed);
    Net::new(&Device::cpu()?)
}

#[test]
fn ddp_training_equals_one_process_on_the_whole_batch() -> Result<()> {
    let (world, per_rank, steps) = (3, 4, 5);
    // The reference: one process, the concatenated batch, the same start (seed 0).
    let reference = seeded_net(0)?;
    let mut sgd = SGD::new(reference.parameters(), SgdOptions { lr: 0.1, momentum: 0.9, ..Default::default() })?;
    for step in 0..steps {
        let (x, y) = batch(step, per_rank * world)?;
        let loss = mse_loss(&reference.forward(&x)?, &y, Reduction::Mean)?;
        loss.backward()?;
        sgd.step()?;
        sgd.zero_grad();
    }
    let expected: Vec<Vec<f32>> = reference.parameters().iter().map(|p| p.to_vec::<f32>()).collect::<Result<_>>()?;

    let results = on_ranks(world, move |group| {
        // Ranks other than 0 start from other weights: construction must copy rank 0's.
        let net = seeded_net(if group.rank() == 0 { 0 } else { 100 + group.rank() as u64 })?;
        let options = DdpOptions {
            find_unused_parameters: true,
            bucket_cap_mb: 0.0001,
            first_bucket_cap_mb: 0.00005,
            ..Default::default()
        };
        let model = DistributedDataParallel::with_options(net, &group, options)?;
        assert!(model.buckets().len() > 2, "small caps make several buckets: {:?}", model.buckets());
        let mut sgd = SGD::new(model.parameters(), SgdOptions { lr: 0.1, momentum: 0.9, ..Default::default() })?;
        for step in 0..steps {
            let (x, y) = batch(step, per_rank * world)?;
            let rows = per_rank * group.rank();
            let loss = mse_loss(
                &model.forward(&x.narrow(0, rows, per_rank)?)?,
                &y.narrow(0, rows, per_rank)?,
                Reduction::Mean,
            )?;
            loss.backward()?;
            sgd.step()?;
            sgd.zero_grad();
        }
        model.module().parameters().iter().map(|p| p.to_vec::<f32>()).collect::<Result<Vec<_>>>()
    });
    let results: Vec<Vec<Vec<f32>>> = results.into_iter().collect::<Result<_>>()?;
    for (rank, params) in results.iter().enumerate() {
        assert_eq!(params, &results[0], "rank {rank}'s parameters differ from rank 0's");
        for (got, want) in params.iter().zip(&expected) {
            let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-6, "rank {rank}: max difference {worst} from the one-process run");
        }
    }
    Ok(())
}

#[test]
fn no_sync_accumulates_and_the_next_pass_averages_the_sum() -> Result<()> {
    let results = on_ranks(2, |group| {
        let model = DistributedDataParallel::with_options(
            seeded_net(0)?,
            &group,
            DdpOptions { find_unused_parameters: true, ..Default::default() },
        )?;
        let grads = |m: &DistributedDataParallel<Net>| -> Result<Vec<f32>> {
            m.module().fc1.weight.get().grad().map(|g| g.to_vec::<f32>()).unwrap_or(Ok(vec![]))
        };
        let (x, y) = batch(group.rank(), 3)?;
        {
            let _local = model.no_sync();
            mse_loss(&model.forward(&x)?, &y, Reduction::Sum)?.backward()?;
        }
        let local = grads(&model)?;
        mse_loss(&model.forward(&x)?, &y, Reduction::Sum)?.backward()?;
        Ok((local, grads(&model)?))
    });
    let results: Vec<(Vec<f32>, Vec<f32>)> = results.into_iter().collect::<Result<_>>()?;
    assert_ne!(results[0].0, results[1].0, "inside no_sync the ranks keep their own gradients");
    // After the synced pass: the mean over ranks of (twice each rank's local gradient).
    let expected: Vec<f32> = results[0].0.iter().zip(&results[1].0).map(|(a, b)| (2.0 * a + 2.0 * b) / 2.0).collect();
    for (rank, (_, synced)) in results.iter().enumerate() {
        for (a, b) in synced.iter().zip(&expected) {
            assert!((a - b).abs() < 1e-5, "rank {rank}: {synced:?} vs {expected:?}");
        }
    }
    Ok(())
}

#[test]
fn ddp_names_unused_parameters_and_different_models() -> Result<()> {
    let results = on_ranks(2, |group| {
        let model = DistributedDataParallel::new(seeded_net(1)?, &group)?;
        let (x, y) = batch(0, 2)?;
        let err = mse_loss(&model.forward(&x)?, &y, Reduction::Mean)?.backward().err();
        Ok(err.map(|e| e.to_string()).unwrap_or_default())
    });
    for result in results {
        let message = result?;
        assert!(message.contains("spare.weight") && message.contains("find_unused_parameters"), "{message}");
    }
    let results = on_ranks(2, |group| {
        let cpu = Device::cpu()?;
        let width = if group.rank() == 0 { 3 } else { 4 };
        let layer = {
            let _one_at_a_time = SEEDING.lock().unwrap_or_else(|p| p.into_inner());
            Linear::new(width, 2, true, &cpu)?
        };
        Ok(DistributedDataParallel::new(layer, &group).err())
    });
    for result in results {
        let err = result?.expect("different models are refused");
        assert_eq!(err.kind(), ErrorKind::ShapeMismatch);
        assert!(err.message().contains("'weight' [2, 3]") && err.message().contains("[2, 4]"), "{err}");
    }
    Ok(())
}

/// The body of one rank when this binary is started as a rank process by the tests below.
#[test]
#[ignore = "started by the failure tests as a separate process"]
fn rank_process() -> Result<()> {
    let Ok(role) = std::env::var("GENESIS_TEST_ROLE") else { return Ok(()) };
    let group = ProcessGroup::from_env()?;
    let cpu = Device::cpu()?;
    for step in 0.. {
        if step == 3 && group.rank() == 2 {
            match role.as_str() {
                "exit" => std::process::exit(7),
                _ => std::thread::sleep(Duration::from_secs(600)),
            }
        }
        let t = Tensor::ones(&[1000], DType::F32, &cpu)?;
        if let Err(e) = group.all_reduce_(&t, ReduceOp::Sum) {
            println!("RANK {} FAILED: {e}", group.rank());
            std::process::exit(3);
        }
    }
    Ok(())
}

/// Start `world` rank processes with `role`; wait for ranks 0 and 1, then stop rank 2. The
/// two survivors' outputs and how long they took.
fn survivors(role: &str, timeout_s: u64) -> Vec<(i32, String, Duration)> {
    let exe = std::env::current_exe().expect("the test binary");
    let port = free_port();
    let start = Instant::now();
    let mut children: Vec<_> = (0..3)
        .map(|rank| {
            std::process::Command::new(&exe)
                .args(["--ignored", "--exact", "rank_process", "--nocapture", "--test-threads=1"])
                .env("GENESIS_TEST_ROLE", role)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "3")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("GENESIS_DIST_TIMEOUT", timeout_s.to_string())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let mut last = children.pop().expect("three children");
    let out = children
        .into_iter()
        .map(|c| {
            let output = c.wait_with_output().expect("a rank's output");
            (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stdout).into_owned(), start.elapsed())
        })
        .collect();
    let _ = last.kill();
    let _ = last.wait();
    out
}

#[test]
fn a_rank_that_exits_fails_the_others_at_once() {
    for (code, output, took) in survivors("exit", 60) {
        assert_eq!(code, 3, "{output}");
        assert!(output.contains("communication failed") && output.contains("closed"), "{output}");
        assert!(took < Duration::from_secs(30), "took {took:?}");
    }
}

#[test]
fn a_rank_that_hangs_fails_the_others_after_the_timeout() {
    for (code, output, took) in survivors("hang", 3) {
        assert_eq!(code, 3, "{output}");
        assert!(output.contains("communication failed"), "{output}");
        assert!(took < Duration::from_secs(60), "took {took:?}");
    }
}

#[test]
fn ddp_averages_again_after_a_backward_pass_that_failed_halfway() -> Result<()> {
    let results = on_ranks(2, |group| {
        let options = DdpOptions {
            find_unused_parameters: true,
            bucket_cap_mb: 0.0001,
            first_bucket_cap_mb: 0.00005,
            ..Default::default()
        };
        let model = DistributedDataParallel::with_options(seeded_net(0)?, &group, options)?;
        // fc1's weight gets its gradient last: by then fc2's buckets are out.
        let fail_once = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = fail_once.clone();
        model.module().fc1.weight.get().register_hook(move |_| {
            if flag.swap(false, std::sync::atomic::Ordering::SeqCst) {
                return Err(genesis::Error::invalid("planted failure"));
            }
            Ok(None)
        })?;
        let (x, y) = batch(group.rank(), 3)?;
        let failed = mse_loss(&model.forward(&x)?, &y, Reduction::Sum)?.backward().is_err();
        model.module().parameters().iter().for_each(|p| p.zero_grad());
        mse_loss(&model.forward(&x)?, &y, Reduction::Sum)?.backward()?;
        let grads = model.module().fc2.weight.get().grad().map(|g| g.to_vec::<f32>()).transpose()?;
        Ok((failed, grads.unwrap_or_default()))
    });
    let results: Vec<(bool, Vec<f32>)> = results.into_iter().collect::<Result<_>>()?;
    assert!(results.iter().all(|(failed, _)| *failed), "the planted failure fails the first pass");
    assert!(!results[0].1.is_empty());
    assert_eq!(results[0].1, results[1].1, "the second pass averaged the ranks' gradients");
    Ok(())
}

#[test]
fn two_wrapped_models_on_one_group_both_average() -> Result<()> {
    let results = on_ranks(2, |group| {
        let cpu = Device::cpu()?;
        let (first, second) = {
            let _one_at_a_time = SEEDING.lock().unwrap_or_else(|p| p.into_inner());
            genesis::manual_seed(3);
            (Linear::new(4, 8, true, &cpu)?, Linear::new(8, 2, true, &cpu)?)
        };
        let small = DdpOptions { bucket_cap_mb: 0.00005, first_bucket_cap_mb: 0.00005, ..Default::default() };
        let first = DistributedDataParallel::with_options(first, &group, small)?;
        let second = DistributedDataParallel::with_options(second, &group, small)?;
        let (x, y) = batch(group.rank(), 3)?;
        mse_loss(&second.forward(&first.forward(&x)?.tanh()?)?, &y, Reduction::Sum)?.backward()?;
        let grad = |m: &Linear| m.weight.get().grad().map(|g| g.to_vec::<f32>()).transpose();
        Ok((grad(first.module())?.unwrap_or_default(), grad(second.module())?.unwrap_or_default()))
    });
    let results: Vec<(Vec<f32>, Vec<f32>)> = results.into_iter().collect::<Result<_>>()?;
    assert!(!results[0].0.is_empty() && !results[0].1.is_empty());
    assert_eq!(results[0], results[1], "both models' gradients are averaged, the same on both ranks");
    Ok(())
}
