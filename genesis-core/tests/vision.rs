//! Image datasets and transforms: folder layout and labels, pixel values, transform geometry,
//! determinism under a seed (whatever the number of loader workers), CIFAR-10 records, and
//! every bad input the issue lists.
#![cfg(feature = "vision")]

mod common;

use common::TempDir;
use genesis::data::{DataLoader, Dataset};
use genesis::vision::transforms::{
    CenterCrop, Compose, Normalize, RandomCrop, RandomHorizontalFlip, RandomResizedCrop, Resize, Transform,
    TransformRng,
};
use genesis::vision::{BadFile, Cifar10, ImageFolder};
use genesis::{ErrorKind, Generator};
use image::{Rgb, Rgb32FImage, RgbImage};
use std::path::Path;
use std::sync::Arc;

/// A `w × h` image whose pixel (x, y) is `(seed + x, 2y, 7)`.
fn pattern(w: u32, h: u32, seed: u8) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| Rgb([seed.wrapping_add(x as u8), (2 * y) as u8, 7]))
}

/// root/{cat,dog}/ with three and two 12×10 PNGs, and a JPEG among the dogs.
fn small_folder(root: &Path) {
    for (class, n) in [("dog", 2), ("cat", 3)] {
        std::fs::create_dir_all(root.join(class)).unwrap();
        for i in 0..n {
            pattern(12, 10, 10 * i as u8).save(root.join(class).join(format!("{i}.png"))).unwrap();
        }
    }
    pattern(12, 10, 99).save(root.join("dog").join("photo.JPG")).unwrap();
    std::fs::write(root.join("cat").join(".DS_Store"), b"hidden files are ignored").unwrap();
}

#[test]
fn image_folder_lists_classes_in_order_and_decodes_pixels() {
    let dir = TempDir::new("vision", "folder");
    small_folder(&dir.0);
    let data = ImageFolder::new(&dir.0).unwrap();
    assert_eq!(data.classes(), ["cat", "dog"]);
    assert_eq!(data.len(), 6);
    let labels: Vec<usize> = data.samples().iter().map(|s| s.1).collect();
    assert_eq!(labels, [0, 0, 0, 1, 1, 1]);
    let item = data.get(1).unwrap(); // cat/1.png, seed 10
    assert_eq!(item[0].shape(), &[3, 10, 12]);
    assert_eq!(item[1].item::<i64>().unwrap(), 0);
    let pixels = item[0].to_vec::<f32>().unwrap();
    // (channel, y, x) = (0, 3, 5) is 10 + 5; (1, 3, 5) is 2·3; (2, ..) is 7; over 255.
    let at = |c: usize, y: usize, x: usize| pixels[c * 120 + y * 12 + x];
    assert_eq!(at(0, 3, 5), 15.0 / 255.0);
    assert_eq!(at(1, 3, 5), 6.0 / 255.0);
    assert_eq!(at(2, 9, 11), 7.0 / 255.0);
    // The JPEG decodes (lossy, so only its size is certain).
    assert_eq!(data.get(5).unwrap()[0].shape(), &[3, 10, 12]);
    // A batch through the loader.
    let batch = DataLoader::new(Arc::new(data), 4).unwrap().iter().next().unwrap().unwrap();
    assert_eq!(batch[0].shape(), &[4, 3, 10, 12]);
    assert_eq!(batch[1].to_vec::<i64>().unwrap(), [0, 0, 0, 1]);
}

fn rng() -> TransformRng {
    TransformRng::new(42)
}

#[test]
fn transforms_give_torchvision_geometry() {
    let image = pattern(12, 10, 0);
    let f = |img: &RgbImage| {
        Rgb32FImage::from_fn(img.width(), img.height(), |x, y| Rgb(img.get_pixel(x, y).0.map(|v| v as f32 / 255.0)))
    };
    let img = f(&image);
    let dims = |t: &dyn Transform| {
        let out = t.apply(img.clone(), &mut rng()).unwrap();
        (out.height(), out.width())
    };
    assert_eq!(dims(&Resize::Shorter(5)), (5, 6)); // 10×12 → shorter side 5
    assert_eq!(dims(&Resize::Exact([7, 3])), (7, 3));
    assert_eq!(dims(&CenterCrop([4, 4])), (4, 4));
    assert_eq!(dims(&CenterCrop([14, 14])), (14, 14)); // zero-padded first, as torchvision
    assert_eq!(dims(&RandomCrop { size: [10, 12], padding: 2 }), (10, 12));
    assert_eq!(dims(&RandomResizedCrop::new([8, 8])), (8, 8));
    // CenterCrop takes the middle: rows 3..7 and columns 4..8 of a 10×12 image.
    let c = CenterCrop([4, 4]).apply(img.clone(), &mut rng()).unwrap();
    assert_eq!(c.get_pixel(0, 0).0[0], 4.0 / 255.0);
    assert_eq!(c.get_pixel(0, 0).0[1], 6.0 / 255.0);
    // A flip with p = 1 mirrors; with p = 0 it does nothing.
    let flipped = RandomHorizontalFlip { p: 1.0 }.apply(img.clone(), &mut rng()).unwrap();
    assert_eq!(flipped.get_pixel(0, 4), img.get_pixel(11, 4));
    assert_eq!(RandomHorizontalFlip { p: 0.0 }.apply(img.clone(), &mut rng()).unwrap(), img);
    // Normalize per channel.
    let n = Normalize { mean: [0.5, 0.0, 0.1], std: [0.5, 2.0, 1.0] }.apply(img.clone(), &mut rng()).unwrap();
    let (p, q) = (n.get_pixel(3, 2).0, img.get_pixel(3, 2).0);
    assert_eq!(p, [(q[0] - 0.5) / 0.5, q[1] / 2.0, q[2] - 0.1]);
    // A crop of the unpadded size after padding 2 starts at any of the 5 column offsets: the
    // image's first and last columns in the crop tell which.
    let mut offsets = std::collections::BTreeSet::new();
    let mut r = rng();
    for _ in 0..200 {
        let out = RandomCrop { size: [10, 12], padding: 2 }.apply(img.clone(), &mut r).unwrap();
        let inside: Vec<u32> = (0..12).filter(|&x| (0..10).any(|y| out.get_pixel(x, y).0[2] != 0.0)).collect();
        offsets.insert((inside[0], inside[inside.len() - 1]));
    }
    assert_eq!(offsets.into_iter().collect::<Vec<_>>(), [(0, 9), (0, 10), (0, 11), (1, 11), (2, 11)]);
    // Bad sizes are errors.
    assert!(Resize::Exact([0, 4]).apply(img.clone(), &mut rng()).is_err());
    assert!(RandomCrop { size: [20, 20], padding: 0 }.apply(img.clone(), &mut rng()).is_err());
    assert!(Normalize { mean: [0.0; 3], std: [1.0, 0.0, 1.0] }.apply(img, &mut rng()).is_err());
}

fn augmenting(root: &Path, seed: u64) -> ImageFolder {
    ImageFolder::new(root)
        .unwrap()
        .transform(
            Compose::new()
                .then(RandomResizedCrop::new([6, 6]))
                .then(RandomHorizontalFlip::default())
                .then(Normalize { mean: [0.5; 3], std: [0.25; 3] }),
        )
        .generator(&Generator::new(seed))
}

fn epoch(data: Arc<ImageFolder>, workers: usize) -> Vec<Vec<f32>> {
    let loader = DataLoader::new(data, 2).unwrap().shuffle(Generator::new(7)).num_workers(workers);
    loader.iter().map(|b| b.unwrap()[0].to_vec::<f32>().unwrap()).collect()
}

#[test]
fn random_transforms_are_deterministic_under_a_seed_whatever_the_workers() {
    let dir = TempDir::new("vision", "seeded");
    small_folder(&dir.0);
    let a = Arc::new(augmenting(&dir.0, 1));
    let b = Arc::new(augmenting(&dir.0, 1));
    let (a1, a2) = (epoch(a.clone(), 0), epoch(a, 0));
    let (b1, b2) = (epoch(b.clone(), 3), epoch(b, 3));
    assert_eq!(a1, b1, "the same seed gives the same first epoch with 0 and 3 workers");
    assert_eq!(a2, b2, "and the same second epoch");
    assert_ne!(a1, a2, "each epoch draws new augmentations");
    let c = Arc::new(augmenting(&dir.0, 2));
    assert_ne!(epoch(c, 0), a1, "another seed, other augmentations");
}

#[test]
fn bad_files_are_named_skipped_or_fatal_by_flag() {
    let dir = TempDir::new("vision", "bad");
    small_folder(&dir.0);
    std::fs::write(dir.0.join("cat").join("notes.txt"), b"not an image").unwrap();
    let err = ImageFolder::new(&dir.0).err().unwrap();
    assert!(err.to_string().contains("notes.txt") && err.to_string().contains("BadFile::Skip"), "{err}");
    let data = ImageFolder::open(&dir.0, BadFile::Skip).unwrap();
    assert_eq!(data.len(), 6);
    assert_eq!(data.skipped().len(), 1);

    // A file with an image extension whose contents are not an image.
    std::fs::remove_file(dir.0.join("cat").join("notes.txt")).unwrap();
    std::fs::write(dir.0.join("cat").join("broken.png"), b"\x89PNG but then nothing").unwrap();
    let data = ImageFolder::open(&dir.0, BadFile::Skip).unwrap();
    assert_eq!((data.len(), data.skipped()[0].0.file_name().unwrap().to_str()), (6, Some("broken.png")));
    let data = ImageFolder::new(&dir.0).unwrap(); // Fail: found when read
    let broken = data.samples().iter().position(|s| s.0.ends_with("broken.png")).unwrap();
    let err = data.get(broken).unwrap_err();
    assert!(err.to_string().contains("broken.png"), "{err}");
}

#[test]
fn empty_classes_missing_folders_and_mixed_sizes_are_clear_errors() {
    let dir = TempDir::new("vision", "empty");
    small_folder(&dir.0);
    std::fs::create_dir_all(dir.0.join("emu")).unwrap();
    let err = ImageFolder::new(&dir.0).err().unwrap();
    assert!(err.to_string().contains("emu") && err.to_string().contains("no images"), "{err}");
    std::fs::remove_dir(dir.0.join("emu")).unwrap();
    assert!(ImageFolder::new(dir.0.join("nowhere")).is_err());
    let err = ImageFolder::new(dir.0.join("cat")).err().unwrap(); // files, no class folders
    assert!(err.to_string().contains("no class folders"), "{err}");

    pattern(16, 16, 0).save(dir.0.join("cat").join("3-big.png")).unwrap();
    let data = ImageFolder::new(&dir.0).unwrap();
    let err = data.get_batch(&[0, 3]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShapeMismatch);
    assert!(err.to_string().contains("3-big.png") && err.to_string().contains("Resize"), "{err}");
    // With a resize the batch works.
    let data = ImageFolder::new(&dir.0).unwrap().transform(Resize::Exact([8, 8]));
    assert_eq!(data.get_batch(&[0, 3]).unwrap()[0].shape(), &[2, 3, 8, 8]);
}

#[test]
fn cifar10_binary_records() {
    let dir = TempDir::new("vision", "cifar");
    let record = |label: u8, red: u8| {
        let mut r = vec![label];
        r.extend(std::iter::repeat_n(red, 1024));
        r.extend((0..1024).map(|i| (i % 32) as u8)); // green = x
        r.extend(std::iter::repeat_n(200, 1024));
        r
    };
    let test: Vec<u8> = [record(3, 10), record(9, 20)].concat();
    std::fs::write(dir.0.join("test_batch.bin"), &test).unwrap();
    let data = Cifar10::new(&dir.0, false).unwrap();
    assert_eq!((data.len(), data.labels()), (2, &[3u8, 9][..]));
    let item = data.get(1).unwrap();
    assert_eq!(item[0].shape(), &[3, 32, 32]);
    assert_eq!(item[1].item::<i64>().unwrap(), 9);
    let px = item[0].to_vec::<f32>().unwrap();
    assert_eq!((px[5], px[1024 + 32 + 7], px[2048]), (20.0 / 255.0, 7.0 / 255.0, 200.0 / 255.0));

    // The training split needs all five files.
    let err = Cifar10::new(&dir.0, true).err().unwrap();
    assert!(err.to_string().contains("data_batch_1.bin"), "{err}");
    // A truncated file and a bad label are errors naming the file.
    std::fs::write(dir.0.join("test_batch.bin"), &test[..5000]).unwrap();
    assert!(Cifar10::new(&dir.0, false).err().unwrap().to_string().contains("whole number"));
    std::fs::write(dir.0.join("test_batch.bin"), record(10, 0)).unwrap();
    assert!(Cifar10::new(&dir.0, false).err().unwrap().to_string().contains("label 10"));
}
