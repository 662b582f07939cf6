//! Image transforms in torchvision's shape, applied to decoded RGB images (`f32` in `[0, 1]`,
//! height × width × 3) before they become `(3, h, w)` tensors.
//!
//! Random transforms draw from a [`TransformRng`] that the dataset derives from its seed, the
//! item's index and how many times that item was read before; see [`ImageFolder`] for why.
//!
//! [`ImageFolder`]: super::ImageFolder

use crate::error::{Error, Result};
use genesis_backend_api::sdk::philox;
use image::imageops::{self, FilterType};
use image::Rgb32FImage;

/// The random numbers of one item's transforms: a Philox4x32-10 stream (the generator every
/// Genesis backend fills tensors with) under a key of its own.
#[derive(Debug, Clone)]
pub struct TransformRng {
    key: u64,
    block: u64,
    words: [u32; 4],
    used: usize,
}

impl TransformRng {
    /// The stream for `key`.
    pub fn new(key: u64) -> TransformRng {
        TransformRng { key, block: 0, words: [0; 4], used: 4 }
    }

    fn next_u32(&mut self) -> u32 {
        if self.used == 4 {
            self.words = philox::block(self.key, self.block);
            self.block += 1;
            self.used = 0;
        }
        self.used += 1;
        self.words[self.used - 1]
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        let bits = ((self.next_u32() as u64) << 21) ^ (self.next_u32() as u64 >> 11);
        bits as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[low, high)`.
    pub fn uniform_in(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.uniform()
    }

    /// Uniform integer in `[0, n)` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.uniform() * n as f64) as usize).min(n.saturating_sub(1))
    }
}

/// One step of a preprocessing pipeline.
pub trait Transform: Send + Sync {
    /// Transform `image`, drawing any randomness from `rng`.
    fn apply(&self, image: Rgb32FImage, rng: &mut TransformRng) -> Result<Rgb32FImage>;
}

/// Transforms applied in order (`transforms.Compose`).
#[derive(Default)]
pub struct Compose {
    steps: Vec<Box<dyn Transform>>,
}

impl Compose {
    /// An empty pipeline (the identity).
    pub fn new() -> Compose {
        Compose::default()
    }

    /// This pipeline followed by `step`.
    pub fn then(mut self, step: impl Transform + 'static) -> Compose {
        self.steps.push(Box::new(step));
        self
    }
}

impl Transform for Compose {
    fn apply(&self, mut image: Rgb32FImage, rng: &mut TransformRng) -> Result<Rgb32FImage> {
        for step in &self.steps {
            image = step.apply(image, rng)?;
        }
        Ok(image)
    }
}

fn size_error(what: &str, size: [usize; 2]) -> Error {
    Error::invalid(format!("{what}: the output size must be positive, got {size:?}"))
}

/// Resample to exactly `height × width` with a triangle (bilinear) filter that widens when it
/// shrinks, so downscaling is antialiased as torchvision's `Resize(antialias=True)` is.
fn resample(image: &Rgb32FImage, size: [usize; 2]) -> Rgb32FImage {
    if image.height() as usize == size[0] && image.width() as usize == size[1] {
        return image.clone();
    }
    imageops::resize(image, size[1] as u32, size[0] as u32, FilterType::Triangle)
}

/// The `(top, left)` window of `size` (clipped to the image where it reaches past it is an
/// error in the callers, so this only crops).
fn crop(image: &Rgb32FImage, top: usize, left: usize, size: [usize; 2]) -> Rgb32FImage {
    imageops::crop_imm(image, left as u32, top as u32, size[1] as u32, size[0] as u32).to_image()
}

/// Resize (`transforms.Resize`): `Shorter(s)` scales the shorter side to `s` keeping the
/// aspect ratio; `Exact([h, w])` resizes to that size.
#[derive(Debug, Clone, Copy)]
pub enum Resize {
    /// The shorter side becomes this long.
    Shorter(usize),
    /// Exactly `[height, width]`.
    Exact([usize; 2]),
}

impl Transform for Resize {
    fn apply(&self, image: Rgb32FImage, _rng: &mut TransformRng) -> Result<Rgb32FImage> {
        let (h, w) = (image.height() as usize, image.width() as usize);
        let size = match *self {
            Resize::Exact(size) => size,
            Resize::Shorter(s) if h <= w => [s, (s * w + h / 2) / h.max(1)],
            Resize::Shorter(s) => [(s * h + w / 2) / w.max(1), s],
        };
        if size.contains(&0) {
            return Err(size_error("Resize", size));
        }
        Ok(resample(&image, size))
    }
}

/// Crop the center `[height, width]` (`transforms.CenterCrop`); an image smaller than that is
/// zero-padded around first, as torchvision does.
#[derive(Debug, Clone, Copy)]
pub struct CenterCrop(pub [usize; 2]);

impl Transform for CenterCrop {
    fn apply(&self, image: Rgb32FImage, _rng: &mut TransformRng) -> Result<Rgb32FImage> {
        let size = self.0;
        if size.contains(&0) {
            return Err(size_error("CenterCrop", size));
        }
        let (h, w) = (image.height() as usize, image.width() as usize);
        let image = if h < size[0] || w < size[1] {
            let (ph, pw) = (size[0].saturating_sub(h), size[1].saturating_sub(w));
            pad(&image, [ph / 2, pw / 2, ph - ph / 2, pw - pw / 2])
        } else {
            image
        };
        let (h, w) = (image.height() as usize, image.width() as usize);
        // torchvision rounds the offsets: int(round((h - ch) / 2)).
        let top = ((h - size[0]) as f64 / 2.0).round_ties_even() as usize;
        let left = ((w - size[1]) as f64 / 2.0).round_ties_even() as usize;
        Ok(crop(&image, top, left, size))
    }
}

/// Zero padding `[top, left, bottom, right]`.
fn pad(image: &Rgb32FImage, [top, left, bottom, right]: [usize; 4]) -> Rgb32FImage {
    let (h, w) = (image.height() as usize, image.width() as usize);
    let mut out = Rgb32FImage::new((w + left + right) as u32, (h + top + bottom) as u32);
    imageops::replace(&mut out, image, left as i64, top as i64);
    out
}

/// A random `[height, width]` window (`transforms.RandomCrop`), after zero-padding every side
/// by `padding` (CIFAR's usual augmentation is `RandomCrop { size: [32, 32], padding: 4 }`).
#[derive(Debug, Clone, Copy)]
pub struct RandomCrop {
    /// Output `[height, width]`.
    pub size: [usize; 2],
    /// Zero padding added to each side first.
    pub padding: usize,
}

impl Transform for RandomCrop {
    fn apply(&self, image: Rgb32FImage, rng: &mut TransformRng) -> Result<Rgb32FImage> {
        let size = self.size;
        if size.contains(&0) {
            return Err(size_error("RandomCrop", size));
        }
        let image = if self.padding > 0 { pad(&image, [self.padding; 4]) } else { image };
        let (h, w) = (image.height() as usize, image.width() as usize);
        if h < size[0] || w < size[1] {
            return Err(Error::invalid(format!(
                "RandomCrop: the crop {size:?} is larger than the (padded) image {h}x{w}"
            )));
        }
        let (top, left) = (rng.below(h - size[0] + 1), rng.below(w - size[1] + 1));
        Ok(crop(&image, top, left, size))
    }
}

/// A random window of random area and aspect ratio, resized to `size`
/// (`transforms.RandomResizedCrop`, the ImageNet training augmentation): the window covers a
/// fraction of the image's area drawn from `scale` and has a width/height ratio drawn
/// log-uniformly from `ratio`; after 10 draws that do not fit, the largest centered window
/// with the ratio clamped into `ratio` is used, as torchvision does.
#[derive(Debug, Clone, Copy)]
pub struct RandomResizedCrop {
    /// Output `[height, width]`.
    pub size: [usize; 2],
    /// Range of the window's fraction of the image area (torchvision: 0.08 to 1).
    pub scale: (f64, f64),
    /// Range of the window's width/height (torchvision: 3/4 to 4/3).
    pub ratio: (f64, f64),
}

impl RandomResizedCrop {
    /// torchvision's defaults for output `size`.
    pub fn new(size: [usize; 2]) -> RandomResizedCrop {
        RandomResizedCrop { size, scale: (0.08, 1.0), ratio: (3.0 / 4.0, 4.0 / 3.0) }
    }

    fn window(&self, h: usize, w: usize, rng: &mut TransformRng) -> (usize, usize, [usize; 2]) {
        let area = (h * w) as f64;
        let (log_lo, log_hi) = (self.ratio.0.ln(), self.ratio.1.ln());
        for _ in 0..10 {
            let target = area * rng.uniform_in(self.scale.0, self.scale.1);
            let aspect = rng.uniform_in(log_lo, log_hi).exp();
            let cw = (target * aspect).sqrt().round() as usize;
            let ch = (target / aspect).sqrt().round() as usize;
            if 0 < cw && cw <= w && 0 < ch && ch <= h {
                return (rng.below(h - ch + 1), rng.below(w - cw + 1), [ch, cw]);
            }
        }
        let in_ratio = w as f64 / h as f64;
        let (ch, cw) = if in_ratio < self.ratio.0 {
            ((w as f64 / self.ratio.0).round() as usize, w)
        } else if in_ratio > self.ratio.1 {
            (h, (h as f64 * self.ratio.1).round() as usize)
        } else {
            (h, w)
        };
        ((h - ch) / 2, (w - cw) / 2, [ch, cw])
    }
}

impl Transform for RandomResizedCrop {
    fn apply(&self, image: Rgb32FImage, rng: &mut TransformRng) -> Result<Rgb32FImage> {
        if self.size.contains(&0) {
            return Err(size_error("RandomResizedCrop", self.size));
        }
        let ok = |r: (f64, f64)| r.0 > 0.0 && r.0 <= r.1 && r.1.is_finite();
        if !ok(self.scale) || !ok(self.ratio) {
            return Err(Error::invalid(format!(
                "RandomResizedCrop: scale {:?} and ratio {:?} must be positive ranges (low <= high)",
                self.scale, self.ratio
            )));
        }
        let (top, left, window) = self.window(image.height() as usize, image.width() as usize, rng);
        Ok(resample(&crop(&image, top, left, window), self.size))
    }
}

/// Mirror left to right with probability `p` (`transforms.RandomHorizontalFlip`).
#[derive(Debug, Clone, Copy)]
pub struct RandomHorizontalFlip {
    /// Probability of flipping.
    pub p: f64,
}

impl Default for RandomHorizontalFlip {
    fn default() -> Self {
        RandomHorizontalFlip { p: 0.5 }
    }
}

impl Transform for RandomHorizontalFlip {
    fn apply(&self, image: Rgb32FImage, rng: &mut TransformRng) -> Result<Rgb32FImage> {
        Ok(if rng.uniform() < self.p { imageops::flip_horizontal(&image) } else { image })
    }
}

/// `(x - mean) / std` per channel (`transforms.Normalize`).
#[derive(Debug, Clone, Copy)]
pub struct Normalize {
    /// Per-channel mean (R, G, B).
    pub mean: [f32; 3],
    /// Per-channel standard deviation (R, G, B).
    pub std: [f32; 3],
}

impl Normalize {
    /// The ImageNet statistics torchvision's pretrained models expect.
    pub const IMAGENET: Normalize = Normalize { mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] };
}

impl Transform for Normalize {
    fn apply(&self, mut image: Rgb32FImage, _rng: &mut TransformRng) -> Result<Rgb32FImage> {
        if self.std.iter().any(|&s| s == 0.0 || !s.is_finite()) {
            return Err(Error::invalid(format!("Normalize: std must be finite and non-zero, got {:?}", self.std)));
        }
        for pixel in image.pixels_mut() {
            for c in 0..3 {
                pixel.0[c] = (pixel.0[c] - self.mean[c]) / self.std[c];
            }
        }
        Ok(image)
    }
}

/// An image as a `(3, h, w)` channel-major buffer (what `transforms.ToTensor` makes).
pub(crate) fn to_chw(image: &Rgb32FImage) -> Vec<f32> {
    let plane = (image.width() * image.height()) as usize;
    let mut out = vec![0f32; 3 * plane];
    for (i, pixel) in image.pixels().enumerate() {
        for c in 0..3 {
            out[c * plane + i] = pixel.0[c];
        }
    }
    out
}
