//! DistributedSampler against PyTorch's definition (padding, dropping, striding), its shuffle
//! determinism, and the DataLoader taking its order from a sampler.

use genesis::data::{randperm, DataLoader, DistributedSampler, Sampler, TensorDataset};
use genesis::{DType, Device, ErrorKind, Generator, Result, Tensor};
use std::collections::BTreeSet;
use std::sync::Arc;

/// PyTorch's num_samples, written as its source reads (float division and ceil).
fn expected_num_samples(len: usize, replicas: usize, drop_last: bool) -> usize {
    let (n, r) = (len as f64, replicas as f64);
    let v = if drop_last && len % replicas != 0 { ((n - r) / r).ceil() } else { (n / r).ceil() };
    v.max(0.0) as usize
}

/// The epoch's order before padding or dropping.
fn base_order(len: usize, shuffle: bool, seed: u64, epoch: u64) -> Result<Vec<usize>> {
    if shuffle {
        randperm(len, &Generator::new(seed + epoch))
    } else {
        Ok((0..len).collect())
    }
}

/// The padded (or truncated) order over all replicas, built as PyTorch's source does.
fn expected_full(base: &[usize], total: usize, drop_last: bool) -> Vec<usize> {
    let mut indices = base.to_vec();
    if !drop_last {
        let padding = total - indices.len();
        if padding <= indices.len() {
            indices.extend_from_slice(&base[..padding]);
        } else {
            let copies = padding.div_ceil(base.len());
            let repeated: Vec<usize> = (0..copies).flat_map(|_| base.iter().copied()).collect();
            indices.extend_from_slice(&repeated[..padding]);
        }
    } else {
        indices.truncate(total);
    }
    assert_eq!(indices.len(), total);
    indices
}

fn slice(full: &[usize], rank: usize, replicas: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut i = rank;
    while i < full.len() {
        out.push(full[i]);
        i += replicas;
    }
    out
}

#[test]
fn every_rank_gets_its_share_as_pytorch_defines_it() -> Result<()> {
    let seed = 5;
    let epoch = 2;
    for len in [0usize, 1, 2, 3, 4, 5, 7, 8, 10, 12, 13, 31, 100] {
        for replicas in [1usize, 2, 3, 4, 5, 8] {
            for drop_last in [false, true] {
                for shuffle in [false, true] {
                    let case = format!("len {len}, {replicas} replicas, drop_last {drop_last}, shuffle {shuffle}");
                    let n = expected_num_samples(len, replicas, drop_last);
                    let total = n * replicas;
                    let base = base_order(len, shuffle, seed, epoch)?;
                    let full = expected_full(&base, total, drop_last);
                    let mut ranks = Vec::new();
                    for rank in 0..replicas {
                        let s = DistributedSampler::new(len, replicas, rank)?
                            .shuffle(shuffle)
                            .seed(seed)
                            .drop_last(drop_last);
                        s.set_epoch(epoch);
                        assert_eq!(s.len(), n, "{case}: len of rank {rank}");
                        assert_eq!(s.total_size(), total, "{case}");
                        let got = s.indices()?;
                        assert_eq!(got.len(), n, "{case}: rank {rank} has num_samples items");
                        assert_eq!(got, slice(&full, rank, replicas), "{case}: rank {rank}");
                        ranks.push(got);
                    }
                    let union: BTreeSet<usize> = ranks.iter().flatten().copied().collect();
                    if drop_last {
                        let all: Vec<usize> = ranks.concat();
                        assert_eq!(all.len(), union.len(), "{case}: ranks are disjoint");
                        let dropped: BTreeSet<usize> = base[total..].iter().copied().collect();
                        assert_eq!(dropped.len(), len - total, "{case}");
                        assert!(union.is_disjoint(&dropped), "{case}: the dropped tail is seen by no rank");
                        assert_eq!(union.len() + dropped.len(), len, "{case}: the rest is the tail of the order");
                    } else {
                        assert_eq!(union, (0..len).collect(), "{case}: every index is covered");
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn hand_checked_case_without_shuffle() -> Result<()> {
    let ranks = |drop_last: bool| -> Result<Vec<Vec<usize>>> {
        (0..4).map(|r| DistributedSampler::new(10, 4, r)?.shuffle(false).drop_last(drop_last).indices()).collect()
    };
    assert_eq!(ranks(false)?, vec![vec![0, 4, 8], vec![1, 5, 9], vec![2, 6, 0], vec![3, 7, 1]]);
    assert_eq!(ranks(true)?, vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
    assert_eq!(DistributedSampler::new(10, 4, 0)?.len(), 3);
    assert_eq!(DistributedSampler::new(10, 4, 0)?.drop_last(true).len(), 2);
    // Fewer items than replicas: padding longer than the list repeats it whole.
    let small: Vec<Vec<usize>> =
        (0..5).map(|r| DistributedSampler::new(2, 5, r)?.shuffle(false).indices()).collect::<Result<_>>()?;
    assert_eq!(small, vec![vec![0], vec![1], vec![0], vec![1], vec![0]]);
    let dropped = DistributedSampler::new(2, 5, 1)?.shuffle(false).drop_last(true);
    assert_eq!((dropped.len(), dropped.indices()?), (0, vec![]));
    Ok(())
}

#[test]
fn empty_dataset_gives_empty_epochs() -> Result<()> {
    for drop_last in [false, true] {
        let s = DistributedSampler::new(0, 3, 2)?.drop_last(drop_last);
        assert_eq!(s.len(), 0);
        assert!(s.is_empty());
        assert_eq!(s.indices()?, Vec::<usize>::new());
    }
    Ok(())
}

#[test]
fn shuffle_is_determined_by_seed_and_epoch() -> Result<()> {
    let (len, replicas) = (23, 3);
    let samplers: Vec<DistributedSampler> =
        (0..replicas).map(|r| Ok(DistributedSampler::new(len, replicas, r)?.seed(11))).collect::<Result<_>>()?;
    let epoch = |e: u64| -> Result<Vec<Vec<usize>>> {
        samplers
            .iter()
            .map(|s| {
                s.set_epoch(e);
                s.indices()
            })
            .collect()
    };
    let e0 = epoch(0)?;
    assert_eq!(e0, epoch(0)?, "same seed and epoch, same order");
    assert_eq!(samplers[0].epoch(), 0);
    let e1 = epoch(1)?;
    assert_eq!(samplers[0].epoch(), 1);
    assert_ne!(e0, e1, "set_epoch changes the order");
    assert_eq!(e1, epoch(1)?);
    let other_seed = DistributedSampler::new(len, replicas, 0)?.seed(12);
    assert_ne!(other_seed.indices()?, e0[0], "another seed, another order");
    for e in [&e0, &e1] {
        // All ranks shuffled alike: together they are the padded permutation, each index once
        // but for the padding, which repeats the permutation's start.
        let n = len.div_ceil(replicas);
        let mut interleaved = Vec::new();
        for k in 0..n {
            for r in e.iter() {
                interleaved.push(r[k]);
            }
        }
        let set: BTreeSet<usize> = interleaved[..len].iter().copied().collect();
        assert_eq!(set, (0..len).collect(), "the first len positions are a permutation");
        assert_eq!(interleaved[len..], interleaved[..interleaved.len() - len], "padding from the start");
        assert_ne!(interleaved[..len], (0..len).collect::<Vec<_>>(), "shuffled");
    }
    // Without shuffle the epoch does not matter.
    let plain = DistributedSampler::new(len, replicas, 1)?.shuffle(false);
    let before = plain.indices()?;
    plain.set_epoch(9);
    assert_eq!(plain.indices()?, before);
    Ok(())
}

#[test]
fn bad_arguments_are_errors() {
    let e = DistributedSampler::new(10, 0, 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("num_replicas"), "{e}");
    let e = DistributedSampler::new(10, 4, 4).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("rank 4"), "{e}");
}

fn dataset(n: usize) -> Result<Arc<TensorDataset>> {
    let cpu = Device::cpu()?;
    let x = Tensor::arange(0.0, n as f64, 1.0, DType::I64, &cpu)?;
    Ok(Arc::new(TensorDataset::new(vec![x])?))
}

fn epoch(loader: &DataLoader) -> Result<Vec<Vec<i64>>> {
    loader.iter().map(|b| b?[0].to_vec::<i64>()).collect()
}

#[test]
fn data_loader_takes_its_order_from_the_sampler() -> Result<()> {
    let data = dataset(10)?;
    let sampler = Arc::new(DistributedSampler::new(10, 4, 1)?.shuffle(false));
    let loader = DataLoader::new(data.clone(), 2)?.sampler(sampler.clone());
    assert_eq!(loader.len(), 2);
    assert_eq!(epoch(&loader)?, vec![vec![1, 5], vec![9]]);
    let dropping = DataLoader::new(data.clone(), 2)?.sampler(sampler).drop_last(true);
    assert_eq!(dropping.len(), 1);
    assert_eq!(epoch(&dropping)?, vec![vec![1, 5]]);

    // Shuffled, every rank's batches are its indices in order, with or without workers, and
    // set_epoch through the shared Arc changes the next epoch.
    for rank in 0..3 {
        let sampler = Arc::new(DistributedSampler::new(10, 3, rank)?.seed(3));
        for workers in [0, 2] {
            let loader = DataLoader::new(data.clone(), 3)?.sampler(sampler.clone()).num_workers(workers);
            assert_eq!(loader.len(), 2);
            sampler.set_epoch(0);
            let e0 = epoch(&loader)?;
            let want: Vec<i64> = sampler.indices()?.iter().map(|&i| i as i64).collect();
            assert_eq!(e0.concat(), want, "rank {rank}, {workers} workers");
            assert_eq!(e0.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 1]);
            sampler.set_epoch(1);
            let e1 = epoch(&loader)?;
            let want: Vec<i64> = sampler.indices()?.iter().map(|&i| i as i64).collect();
            assert_eq!(e1.concat(), want);
            assert_ne!(e0, e1, "rank {rank}: the epoch reshuffles");
        }
    }
    Ok(())
}

#[test]
fn sampler_with_shuffle_is_an_error() -> Result<()> {
    let sampler = Arc::new(DistributedSampler::new(10, 2, 0)?);
    for workers in [0, 2] {
        let loader =
            DataLoader::new(dataset(10)?, 2)?.shuffle(Generator::new(0)).sampler(sampler.clone()).num_workers(workers);
        let mut it = loader.iter();
        let e = it.next().expect("an error item").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("mutually exclusive with shuffle"), "{e}");
        assert!(it.next().is_none());
    }
    Ok(())
}

struct Fixed(Vec<usize>);

impl Sampler for Fixed {
    fn indices(&self) -> Result<Vec<usize>> {
        Ok(self.0.clone())
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

#[test]
fn sampler_indices_out_of_range_are_an_error() -> Result<()> {
    // A sampler made for a larger dataset than the loader's.
    let too_long = Arc::new(DistributedSampler::new(12, 2, 0)?.shuffle(false));
    let custom = Arc::new(Fixed(vec![3, 1, 99]));
    for sampler in [too_long as Arc<dyn Sampler>, custom] {
        for workers in [0, 2] {
            let loader = DataLoader::new(dataset(10)?, 2)?.sampler(sampler.clone()).num_workers(workers);
            let mut it = loader.iter();
            let e = it.next().expect("an error item").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.to_string().contains("out of range"), "{e}");
            assert!(it.next().is_none());
        }
    }
    // In range, a custom sampler's order is followed as given.
    let loader = DataLoader::new(dataset(10)?, 2)?.sampler(Arc::new(Fixed(vec![3, 1, 9])));
    assert_eq!(epoch(&loader)?, vec![vec![3, 1], vec![9]]);
    Ok(())
}
