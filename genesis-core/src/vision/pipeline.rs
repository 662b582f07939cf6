//! What the image datasets share: an item's transforms, seeded so that a run is reproducible
//! whatever the number of loader workers, and the conversion to a tensor.

use super::transforms::{to_chw, Transform, TransformRng};
use crate::device::Device;
use crate::error::Result;
use crate::random::Generator;
use crate::tensor::Tensor;
use genesis_backend_api::sdk::philox::Draw;
use genesis_backend_api::DType;
use image::Rgb32FImage;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A dataset's transforms and the state that seeds them.
///
/// The randomness of item `i`'s `k`-th read comes from a stream keyed by `(seed, i, k)`: each
/// epoch sees new augmentations, and the same seed gives the same augmentations however many
/// workers read the items and in whatever order (PyTorch seeds per worker instead, so its
/// augmentations change with the number of workers).
pub(crate) struct Pipeline {
    transform: Option<Arc<dyn Transform>>,
    seed: u64,
    reads: Vec<AtomicU32>,
}

impl Pipeline {
    /// No transform yet; seeded from the default generator.
    pub(crate) fn new(len: usize) -> Pipeline {
        let mut p = Pipeline { transform: None, seed: 0, reads: (0..len).map(|_| AtomicU32::new(0)).collect() };
        p.seed_from(&crate::random::default_generator());
        p
    }

    pub(crate) fn set_transform(&mut self, transform: impl Transform + 'static) {
        self.transform = Some(Arc::new(transform));
    }

    /// Take the seed from `generator` (advancing it), and start every item's count again.
    pub(crate) fn seed_from(&mut self, generator: &Generator) {
        let (seed, offset) = generator.advance(Draw::Uniform, DType::F32, 4);
        self.seed = splitmix64(seed ^ splitmix64(offset));
        for r in &self.reads {
            r.store(0, Ordering::Relaxed);
        }
    }

    /// Transform item `index`'s decoded image and make it a `(3, h, w)` f32 CPU tensor.
    pub(crate) fn finish(&self, index: usize, image: Rgb32FImage) -> Result<Tensor> {
        let image = match &self.transform {
            Some(t) => {
                let read = self.reads[index].fetch_add(1, Ordering::Relaxed) as u64;
                let mut rng = TransformRng::new(splitmix64(self.seed ^ splitmix64(((index as u64) << 32) | read)));
                t.apply(image, &mut rng)?
            }
            None => image,
        };
        let (h, w) = (image.height() as usize, image.width() as usize);
        Tensor::from_vec(to_chw(&image), &[3, h, w], &Device::cpu()?)
    }
}
