//! Data loading: batching, shuffling determinism with a seed, drop_last, workers, splits and
//! the errors for items that cannot be batched.

use genesis::data::{collate, random_split, randperm, DataLoader, Dataset, TensorDataset};
use genesis::{DType, Device, ErrorKind, Generator, Result, Tensor};
use std::sync::Arc;

fn dataset(n: usize) -> Result<Arc<TensorDataset>> {
    let cpu = Device::cpu()?;
    let x = Tensor::arange(0.0, (n * 3) as f64, 1.0, DType::F32, &cpu)?.reshape(&[n as isize, 3])?;
    let y = Tensor::arange(0.0, n as f64, 1.0, DType::I64, &cpu)?;
    Ok(Arc::new(TensorDataset::new(vec![x, y])?))
}

/// The labels (item indices) of every batch of one epoch.
fn epoch(loader: &DataLoader) -> Result<Vec<Vec<i64>>> {
    loader
        .iter()
        .map(|b| {
            let b = b?;
            assert_eq!(b.len(), 2);
            let labels = b[1].to_vec::<i64>()?;
            // The features travel with their label: row i is [3i, 3i+1, 3i+2].
            let x = b[0].to_vec::<f32>()?;
            for (k, &l) in labels.iter().enumerate() {
                assert_eq!(&x[3 * k..3 * k + 3], &[3.0 * l as f32, 3.0 * l as f32 + 1.0, 3.0 * l as f32 + 2.0]);
            }
            Ok(labels)
        })
        .collect()
}

#[test]
fn batches_in_order_with_a_partial_last_batch() -> Result<()> {
    let loader = DataLoader::new(dataset(10)?, 4)?;
    assert_eq!(loader.len(), 3);
    assert_eq!(epoch(&loader)?, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
    let dropped = DataLoader::new(dataset(10)?, 4)?.drop_last(true);
    assert_eq!(dropped.len(), 2);
    assert_eq!(epoch(&dropped)?, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    let first = loader.iter().next().unwrap()?;
    assert_eq!(first[0].shape(), &[4, 3]);
    assert_eq!(first[1].shape(), &[4]);
    Ok(())
}

#[test]
fn shuffling_is_determined_by_the_seed() -> Result<()> {
    let data = dataset(37)?;
    let run = |seed: u64, workers: usize| -> Result<Vec<Vec<Vec<i64>>>> {
        let loader = DataLoader::new(data.clone(), 5)?.shuffle(Generator::new(seed)).num_workers(workers).prefetch(1);
        (0..3).map(|_| epoch(&loader)).collect()
    };
    let a = run(7, 0)?;
    assert_eq!(a, run(7, 0)?, "same seed, same batches");
    assert_eq!(a, run(7, 3)?, "worker threads do not change the batches");
    assert_ne!(a, run(8, 0)?, "another seed shuffles differently");
    assert_ne!(a[0], a[1], "each epoch draws a new order");
    for e in &a {
        let mut all: Vec<i64> = e.concat();
        assert_ne!(all, (0..37).collect::<Vec<i64>>(), "shuffled");
        all.sort();
        assert_eq!(all, (0..37).collect::<Vec<i64>>(), "every item once per epoch");
        assert_eq!(e.last().unwrap().len(), 2);
    }
    Ok(())
}

#[test]
fn workers_stop_when_the_epoch_is_abandoned() -> Result<()> {
    let loader = DataLoader::new(dataset(200)?, 2)?.num_workers(2).prefetch(1);
    let mut it = loader.iter();
    assert_eq!(it.next().unwrap()?[1].to_vec::<i64>()?, vec![0, 1]);
    drop(it); // must not hang: blocked workers see the closed channel and return
    assert_eq!(epoch(&loader)?.len(), 100);
    Ok(())
}

/// A dataset whose items have different shapes (as variable-length sequences would).
struct Ragged;
impl Dataset for Ragged {
    fn len(&self) -> usize {
        4
    }
    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        Ok(vec![Tensor::zeros(&[1 + index % 2], DType::F32, &Device::cpu()?)?])
    }
}

#[test]
fn items_of_different_shapes_are_an_error_at_collate() -> Result<()> {
    let loader = DataLoader::new(Arc::new(Ragged), 2)?;
    let err = loader.iter().next().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShapeMismatch);
    assert!(err.message().contains("item 1") && err.message().contains("[2]"), "{err}");
    let with_workers = DataLoader::new(Arc::new(Ragged), 2)?.num_workers(2);
    assert!(with_workers.iter().all(|b| b.is_err()));
    // One item per batch is fine.
    assert_eq!(DataLoader::new(Arc::new(Ragged), 1)?.iter().collect::<Result<Vec<_>>>()?.len(), 4);
    let cpu = Device::cpu()?;
    let mixed = vec![vec![Tensor::zeros(&[2], DType::F32, &cpu)?], vec![Tensor::zeros(&[2], DType::F64, &cpu)?]];
    assert!(collate(mixed).is_err(), "dtypes differ");
    Ok(())
}

#[test]
fn random_split_partitions_deterministically() -> Result<()> {
    let data: Arc<dyn Dataset> = dataset(20)?;
    let parts = random_split(data.clone(), &[15, 5], &Generator::new(3))?;
    assert_eq!((parts[0].len(), parts[1].len()), (15, 5));
    let mut all: Vec<usize> = parts.iter().flat_map(|p| p.indices().to_vec()).collect();
    all.sort();
    assert_eq!(all, (0..20).collect::<Vec<_>>());
    let again = random_split(data.clone(), &[15, 5], &Generator::new(3))?;
    assert_eq!(again[1].indices(), parts[1].indices());
    // A subset's items are the dataset's items.
    let k = parts[1].indices()[0];
    assert_eq!(parts[1].get(0)?[1].item::<i64>()?, k as i64);
    let loader = DataLoader::new(Arc::new(parts[1].clone()), 5)?;
    let labels = epoch(&loader)?.concat();
    assert_eq!(labels, parts[1].indices().iter().map(|&i| i as i64).collect::<Vec<_>>());
    assert!(random_split(data, &[10, 5], &Generator::new(3)).is_err(), "lengths must add up");
    let p = randperm(50, &Generator::new(1))?;
    assert_eq!(p, randperm(50, &Generator::new(1))?);
    Ok(())
}

#[test]
fn bad_datasets_and_indices_are_errors() -> Result<()> {
    let cpu = Device::cpu()?;
    let a = Tensor::zeros(&[3, 2], DType::F32, &cpu)?;
    let b = Tensor::zeros(&[4], DType::F32, &cpu)?;
    assert_eq!(TensorDataset::new(vec![a.clone(), b]).unwrap_err().kind(), ErrorKind::ShapeMismatch);
    assert!(TensorDataset::new(vec![]).is_err());
    let d = TensorDataset::new(vec![a])?;
    assert!(d.get(3).is_err());
    assert!(d.get_batch(&[0, 5]).is_err());
    assert!(DataLoader::new(Arc::new(d), 0).is_err());
    Ok(())
}
