//! CIFAR-10 in its binary format.

use super::pipeline::Pipeline;
use super::transforms::Transform;
use crate::data::Dataset;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::random::Generator;
use crate::tensor::Tensor;
use image::Rgb32FImage;
use std::path::{Path, PathBuf};

const SIDE: usize = 32;
const PIXELS: usize = 3 * SIDE * SIDE;
/// One record: a label byte, then the red, green and blue planes, row by row.
const RECORD: usize = 1 + PIXELS;

/// The class names in label order, as `batches.meta.txt` lists them.
pub const CIFAR10_CLASSES: [&str; 10] =
    ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"];

/// CIFAR-10 from the "binary version" files (`data_batch_1.bin` … `data_batch_5.bin` for
/// training, `test_batch.bin` for testing) in `root` or in `root/cifar-10-batches-bin`, the
/// folder the archive unpacks to (`torchvision.datasets.CIFAR10` reads the Python version
/// instead; the images are the same). Items are `[image (3, 32, 32) f32 in [0, 1] then the
/// transform, label () i64]`, the transforms seeded as [`super::ImageFolder`]'s are.
pub struct Cifar10 {
    images: Vec<u8>,
    labels: Vec<u8>,
    pipeline: Pipeline,
}

impl Cifar10 {
    /// The training (`train`) or test split. A missing file, a file whose size is not a whole
    /// number of records, or a label above 9 is an error naming the file.
    pub fn new(root: impl AsRef<Path>, train: bool) -> Result<Cifar10> {
        let root = root.as_ref();
        let dir = if root.join("cifar-10-batches-bin").is_dir() {
            root.join("cifar-10-batches-bin")
        } else {
            root.to_path_buf()
        };
        let files: Vec<PathBuf> = if train {
            (1..=5).map(|i| dir.join(format!("data_batch_{i}.bin"))).collect()
        } else {
            vec![dir.join("test_batch.bin")]
        };
        let (mut images, mut labels) = (Vec::new(), Vec::new());
        for file in &files {
            let bytes =
                std::fs::read(file).map_err(|e| Error::load(format!("CIFAR-10: reading {}: {e}", file.display())))?;
            if bytes.is_empty() || bytes.len() % RECORD != 0 {
                return Err(Error::load(format!(
                    "CIFAR-10: {} has {} bytes, not a whole number of {RECORD}-byte records",
                    file.display(),
                    bytes.len()
                )));
            }
            for (r, record) in bytes.chunks_exact(RECORD).enumerate() {
                if record[0] >= 10 {
                    return Err(Error::load(format!(
                        "CIFAR-10: record {r} of {} has label {}, expected 0..9",
                        file.display(),
                        record[0]
                    )));
                }
                labels.push(record[0]);
                images.extend_from_slice(&record[1..]);
            }
        }
        let pipeline = Pipeline::new(labels.len());
        Ok(Cifar10 { images, labels, pipeline })
    }

    /// Apply `transform` to every image (random transforms draw from this dataset's seed).
    pub fn transform(mut self, transform: impl Transform + 'static) -> Cifar10 {
        self.pipeline.set_transform(transform);
        self
    }

    /// Seed the random transforms from `generator` (which advances) instead of the default one.
    pub fn generator(mut self, generator: &Generator) -> Cifar10 {
        self.pipeline.seed_from(generator);
        self
    }

    /// Every item's label.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }
}

impl Dataset for Cifar10 {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        if index >= self.labels.len() {
            return Err(Error::invalid(format!("CIFAR-10: item {index} requested, it has {}", self.labels.len())));
        }
        let planes = &self.images[index * PIXELS..(index + 1) * PIXELS];
        let plane = SIDE * SIDE;
        let image = Rgb32FImage::from_fn(SIDE as u32, SIDE as u32, |x, y| {
            let at = y as usize * SIDE + x as usize;
            image::Rgb([0, 1, 2].map(|c| planes[c * plane + at] as f32 / 255.0))
        });
        let image = self.pipeline.finish(index, image)?;
        Ok(vec![image, Tensor::from_vec(vec![self.labels[index] as i64], &[], &Device::cpu()?)?])
    }
}
