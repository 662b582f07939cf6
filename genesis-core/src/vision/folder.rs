//! `ImageFolder`: one sub-folder per class, PNG and JPEG files in them.

use super::pipeline::Pipeline;
use super::transforms::Transform;
use crate::data::{collate, Dataset};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ops::shape_err;
use crate::random::Generator;
use crate::tensor::Tensor;
use std::path::{Path, PathBuf};

/// The file extensions [`ImageFolder`] reads (compared without case).
pub const IMAGE_EXTENSIONS: [&str; 3] = ["png", "jpg", "jpeg"];

/// What [`ImageFolder`] does with a file in a class folder that is not a readable image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadFile {
    /// Opening fails on a file without an image extension, naming it; a file with one whose
    /// contents cannot be decoded fails the read of that item, naming it.
    Fail,
    /// Files without an image extension, and image files whose header cannot be read (every
    /// file's header is read when the folder is opened), are left out and listed in
    /// [`ImageFolder::skipped`].
    Skip,
}

/// An image classification set laid out as `root/<class>/<image>` (`torchvision.datasets
/// .ImageFolder`). Classes are the sub-folders in sorted order and labels their positions.
/// Items are `[image (3, h, w) f32, label () i64]`: the image decoded to RGB in `[0, 1]`, then
/// the [`transform`](ImageFolder::transform), if any. Hidden files (names starting with `.`)
/// are ignored.
///
/// Random transforms are seeded from a Genesis [`Generator`] (the default one, drawn from when
/// the folder is opened, unless [`generator`](ImageFolder::generator) gives another): item
/// `i`'s `k`-th read draws from a
/// stream keyed by the seed, `i` and `k`, so every epoch gets new augmentations and a seed
/// gives the same ones whatever the number of [`DataLoader`](crate::data::DataLoader)
/// workers.
///
/// ```no_run
/// use genesis::data::DataLoader;
/// use genesis::vision::transforms::{Compose, Normalize, RandomHorizontalFlip, RandomResizedCrop};
/// use genesis::vision::ImageFolder;
/// use std::sync::Arc;
/// let train = ImageFolder::new("data/train")?.transform(
///     Compose::new()
///         .then(RandomResizedCrop::new([224, 224]))
///         .then(RandomHorizontalFlip::default())
///         .then(Normalize::IMAGENET),
/// );
/// let loader = DataLoader::new(Arc::new(train), 256)?.num_workers(8);
/// # Ok::<(), genesis::Error>(())
/// ```
pub struct ImageFolder {
    root: PathBuf,
    classes: Vec<String>,
    samples: Vec<(PathBuf, usize)>,
    skipped: Vec<(PathBuf, String)>,
    pipeline: Pipeline,
}

fn has_image_extension(path: &Path) -> bool {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    IMAGE_EXTENSIONS.contains(&ext.as_str())
}

fn is_hidden(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.'))
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let read =
        std::fs::read_dir(dir).map_err(|e| Error::load(format!("ImageFolder: reading {}: {e}", dir.display())))?;
    let mut paths = Vec::new();
    for entry in read {
        let entry = entry.map_err(|e| Error::load(format!("ImageFolder: reading {}: {e}", dir.display())))?;
        if !is_hidden(&entry.path()) {
            paths.push(entry.path());
        }
    }
    paths.sort();
    Ok(paths)
}

/// Decode any image file to RGB f32 in `[0, 1]` (the format is taken from the contents).
pub(crate) fn decode(path: &Path) -> Result<image::Rgb32FImage> {
    let fail = |e: &dyn std::fmt::Display| Error::load(format!("cannot decode the image {}: {e}", path.display()));
    let reader = image::io::Reader::open(path).map_err(|e| fail(&e))?;
    let reader = reader.with_guessed_format().map_err(|e| fail(&e))?;
    Ok(reader.decode().map_err(|e| fail(&e))?.into_rgb32f())
}

impl ImageFolder {
    /// Open `root` with [`BadFile::Fail`].
    pub fn new(root: impl AsRef<Path>) -> Result<ImageFolder> {
        Self::open(root, BadFile::Fail)
    }

    /// Open `root`, handling files that are not readable images as `bad_files` says. A missing
    /// root, a root without class folders, or a class folder without images is an error
    /// naming it.
    pub fn open(root: impl AsRef<Path>, bad_files: BadFile) -> Result<ImageFolder> {
        let root = root.as_ref().to_path_buf();
        if !root.is_dir() {
            return Err(Error::load(format!("ImageFolder: {} is not a folder", root.display())));
        }
        let class_dirs: Vec<PathBuf> = sorted_entries(&root)?.into_iter().filter(|p| p.is_dir()).collect();
        if class_dirs.is_empty() {
            return Err(Error::load(format!(
                "ImageFolder: {} has no class folders (expected root/<class>/<image>)",
                root.display()
            )));
        }
        let mut classes = Vec::new();
        let mut samples = Vec::new();
        let mut skipped = Vec::new();
        for (label, dir) in class_dirs.iter().enumerate() {
            classes.push(dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
            let before = samples.len();
            for path in sorted_entries(dir)? {
                if path.is_dir() {
                    continue; // torchvision looks deeper; class folders here hold files only
                }
                let problem = if !has_image_extension(&path) {
                    Some(format!("not an image file (extensions read: {})", IMAGE_EXTENSIONS.join(", ")))
                } else if bad_files == BadFile::Skip {
                    image::image_dimensions(&path).err().map(|e| format!("unreadable image: {e}"))
                } else {
                    None
                };
                match (problem, bad_files) {
                    (None, _) => samples.push((path, label)),
                    (Some(why), BadFile::Skip) => skipped.push((path, why)),
                    (Some(why), BadFile::Fail) => {
                        return Err(Error::load(format!(
                            "ImageFolder: {}: {why}; remove it or open the folder with BadFile::Skip",
                            path.display()
                        )))
                    }
                }
            }
            if samples.len() == before {
                return Err(Error::load(format!("ImageFolder: the class folder {} has no images", dir.display())));
            }
        }
        let pipeline = Pipeline::new(samples.len());
        Ok(ImageFolder { root, classes, samples, skipped, pipeline })
    }

    /// Apply `transform` to every image (random transforms draw from this dataset's seed).
    pub fn transform(mut self, transform: impl Transform + 'static) -> ImageFolder {
        self.pipeline.set_transform(transform);
        self
    }

    /// Seed the random transforms from `generator` (which advances), instead of the default
    /// generator.
    pub fn generator(mut self, generator: &Generator) -> ImageFolder {
        self.pipeline.seed_from(generator);
        self
    }

    /// The folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Class names, in label order.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Every item's file and label.
    pub fn samples(&self) -> &[(PathBuf, usize)] {
        &self.samples
    }

    /// Files left out with [`BadFile::Skip`], and why.
    pub fn skipped(&self) -> &[(PathBuf, String)] {
        &self.skipped
    }

    fn item(&self, index: usize) -> Result<(Tensor, Tensor)> {
        let (path, label) = self.samples.get(index).ok_or_else(|| {
            Error::invalid(format!("ImageFolder: item {index} requested, it has {}", self.samples.len()))
        })?;
        let image = self.pipeline.finish(index, decode(path)?)?;
        Ok((image, Tensor::from_vec(vec![*label as i64], &[], &Device::cpu()?)?))
    }
}

impl Dataset for ImageFolder {
    fn len(&self) -> usize {
        self.samples.len()
    }

    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        let (image, label) = self.item(index)?;
        Ok(vec![image, label])
    }

    /// Batches must hold images of one size: a mismatch names two of the files.
    fn get_batch(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        let items = indices.iter().map(|&i| self.item(i)).collect::<Result<Vec<_>>>()?;
        if let Some(k) = items.iter().position(|(img, _)| img.shape() != items[0].0.shape()) {
            return Err(shape_err(format!(
                "ImageFolder: images of one batch differ in size after the transforms: {} is {:?}, {} is {:?}; \
                     add a Resize, CenterCrop or RandomResizedCrop transform",
                self.samples[indices[0]].0.display(),
                items[0].0.shape(),
                self.samples[indices[k]].0.display(),
                items[k].0.shape()
            )));
        }
        collate(items.into_iter().map(|(img, label)| vec![img, label]).collect())
    }
}
