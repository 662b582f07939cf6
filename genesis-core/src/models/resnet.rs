//! ResNets for image classification (He et al., "Deep Residual Learning for Image
//! Recognition", 2015) with torchvision's structure, initialization and state-dict names, so
//! a torchvision state dict saved as safetensors loads into [`ResNet`], and the reverse.
//!
//! As in torchvision (its "v1.5"), a bottleneck block downsamples in its 3×3 convolution, and
//! a block whose input and output shapes differ adds a 1×1 convolution and batch norm to its
//! shortcut (`downsample`).
//!
//! ```
//! use genesis::models::resnet::{ResNet, ResNetConfig};
//! use genesis::nn::Module;
//! use genesis::{Device, Tensor};
//! let cpu = Device::cpu()?;
//! // A narrow ResNet-10 (one basic block per stage) for 10 classes.
//! let config = ResNetConfig { widths: vec![8, 16, 32, 64], ..ResNetConfig::resnet18(10) };
//! let model = ResNet::new(&ResNetConfig { layers: vec![1, 1, 1, 1], ..config }, &cpu)?;
//! let images = Tensor::zeros(&[2, 3, 32, 32], genesis::DType::F32, &cpu)?;
//! assert_eq!(model.forward(&images)?.shape(), &[2, 10]);
//! assert!(model.state_dict().contains_key("layer2.0.downsample.1.running_mean"));
//! # Ok::<(), genesis::Error>(())
//! ```

use crate::device::Device;
use crate::error::{Error, Result};
use crate::nn::init::{self, FanMode};
use crate::nn::{AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Conv2dOptions, Entry, Linear, MaxPool2d, Module, Sequential};
use crate::ops::shape_err;
use crate::tensor::Tensor;

/// Which residual block a ResNet is built of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// Two 3×3 convolutions (ResNet-18 and -34); output channels = the stage's width.
    Basic,
    /// 1×1, 3×3, 1×1 convolutions (ResNet-50 and deeper); output channels = 4 × the stage's
    /// width.
    Bottleneck,
}

impl BlockKind {
    /// Output channels per unit of stage width (torchvision's `expansion`).
    pub fn expansion(self) -> usize {
        match self {
            BlockKind::Basic => 1,
            BlockKind::Bottleneck => 4,
        }
    }
}

/// The shape of a [`ResNet`]. The named constructors give torchvision's models; change the
/// fields for other depths and widths.
#[derive(Debug, Clone, PartialEq)]
pub struct ResNetConfig {
    /// The residual block of every stage.
    pub block: BlockKind,
    /// Blocks per stage (torchvision: 4 stages, named `layer1` … `layer4`). The first stage
    /// keeps the resolution, each later one halves it.
    pub layers: Vec<usize>,
    /// Each stage's width ("planes"; torchvision: 64, 128, 256, 512). Blocks output
    /// `width × expansion` channels.
    pub widths: Vec<usize>,
    /// Output channels of the stem convolution (torchvision: 64).
    pub stem_width: usize,
    /// Input channels (3 for RGB).
    pub in_channels: usize,
    /// Outputs of the classifier.
    pub num_classes: usize,
    /// Start every block's last batch-norm scale at 0, so each residual branch starts as
    /// the identity (Goyal et al., 2017); torchvision's `zero_init_residual`.
    pub zero_init_residual: bool,
    /// Convolution groups of the bottleneck's 3×3 (ResNeXt); 1 for ResNets.
    pub groups: usize,
    /// Bottleneck inner width per group at width 64 (64 for ResNets, 128 for Wide ResNets).
    pub width_per_group: usize,
}

impl ResNetConfig {
    fn standard(block: BlockKind, layers: [usize; 4], num_classes: usize) -> ResNetConfig {
        ResNetConfig {
            block,
            layers: layers.to_vec(),
            widths: vec![64, 128, 256, 512],
            stem_width: 64,
            in_channels: 3,
            num_classes,
            zero_init_residual: false,
            groups: 1,
            width_per_group: 64,
        }
    }

    /// ResNet-18: basic blocks, `[2, 2, 2, 2]`.
    pub fn resnet18(num_classes: usize) -> ResNetConfig {
        Self::standard(BlockKind::Basic, [2, 2, 2, 2], num_classes)
    }

    /// ResNet-34: basic blocks, `[3, 4, 6, 3]`.
    pub fn resnet34(num_classes: usize) -> ResNetConfig {
        Self::standard(BlockKind::Basic, [3, 4, 6, 3], num_classes)
    }

    /// ResNet-50: bottlenecks, `[3, 4, 6, 3]`.
    pub fn resnet50(num_classes: usize) -> ResNetConfig {
        Self::standard(BlockKind::Bottleneck, [3, 4, 6, 3], num_classes)
    }

    /// ResNet-101: bottlenecks, `[3, 4, 23, 3]`.
    pub fn resnet101(num_classes: usize) -> ResNetConfig {
        Self::standard(BlockKind::Bottleneck, [3, 4, 23, 3], num_classes)
    }

    fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(Error::invalid(format!("ResNetConfig: {why}")));
        if self.layers.is_empty() || self.layers.len() != self.widths.len() {
            return bad(format!(
                "layers ({:?}) and widths ({:?}) must name the same, non-zero number of stages",
                self.layers, self.widths
            ));
        }
        if self.layers.contains(&0) || self.widths.contains(&0) {
            return bad(format!("every stage needs at least one block and a positive width: {self:?}"));
        }
        if self.stem_width == 0 || self.in_channels == 0 || self.num_classes == 0 {
            return bad("stem_width, in_channels and num_classes must be positive".into());
        }
        if self.groups == 0 || self.width_per_group == 0 {
            return bad("groups and width_per_group must be positive".into());
        }
        if self.block == BlockKind::Basic && (self.groups != 1 || self.width_per_group != 64) {
            return bad("basic blocks support only groups = 1 and width_per_group = 64 (as torchvision)".into());
        }
        Ok(())
    }
}

/// A convolution without bias (every ResNet convolution is followed by batch norm), He-normal
/// in fan-out mode as torchvision initializes them.
fn conv(cin: usize, cout: usize, kernel: usize, stride: usize, groups: usize, device: &Device) -> Result<Conv2d> {
    let pad = kernel / 2;
    let options = Conv2dOptions { stride: [stride; 2], padding: [pad; 2], groups, bias: false, ..Default::default() };
    let c = Conv2d::new(cin, cout, [kernel, kernel], options, device)?;
    init::kaiming_normal_(&c.weight.get(), 0.0, FanMode::FanOut)?;
    Ok(c)
}

/// The shortcut of a block whose output shape differs from its input: a strided 1×1
/// convolution and batch norm, named `0` and `1` as torchvision's `Sequential`.
fn downsample(cin: usize, cout: usize, stride: usize, device: &Device) -> Result<Option<Sequential>> {
    if stride == 1 && cin == cout {
        return Ok(None);
    }
    Ok(Some(Sequential::new().add(conv(cin, cout, 1, stride, 1, device)?).add(BatchNorm2d::new_2d(cout, device)?)))
}

/// `relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`.
pub struct BasicBlock {
    /// 3×3, strided when the block downsamples.
    pub conv1: Conv2d,
    /// Batch norm after `conv1`.
    pub bn1: BatchNorm2d,
    /// 3×3.
    pub conv2: Conv2d,
    /// Batch norm after `conv2` (the one `zero_init_residual` zeroes).
    pub bn2: BatchNorm2d,
    /// The projection shortcut, when the shape changes.
    pub downsample: Option<Sequential>,
}

impl BasicBlock {
    fn new(cin: usize, width: usize, stride: usize, device: &Device) -> Result<BasicBlock> {
        Ok(BasicBlock {
            conv1: conv(cin, width, 3, stride, 1, device)?,
            bn1: BatchNorm2d::new_2d(width, device)?,
            conv2: conv(width, width, 3, 1, 1, device)?,
            bn2: BatchNorm2d::new_2d(width, device)?,
            downsample: downsample(cin, width, stride, device)?,
        })
    }
}

impl Module for BasicBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let out = self.bn1.forward(&self.conv1.forward(x)?)?.relu()?;
        let out = self.bn2.forward(&self.conv2.forward(&out)?)?;
        out.add(&shortcut(&self.downsample, x)?)?.relu()
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        let layers: [(&str, &dyn Module); 4] =
            [("conv1", &self.conv1), ("bn1", &self.bn1), ("conv2", &self.conv2), ("bn2", &self.bn2)];
        visit_block(f, &layers, &self.downsample);
    }
}

/// `relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x))))))) + shortcut(x))`: 1×1 down to the
/// inner width, 3×3 (strided when the block downsamples), 1×1 up to `4 × width`.
pub struct Bottleneck {
    /// 1×1 to the inner width.
    pub conv1: Conv2d,
    /// Batch norm after `conv1`.
    pub bn1: BatchNorm2d,
    /// 3×3, grouped for ResNeXt, strided when the block downsamples.
    pub conv2: Conv2d,
    /// Batch norm after `conv2`.
    pub bn2: BatchNorm2d,
    /// 1×1 to the block's output channels.
    pub conv3: Conv2d,
    /// Batch norm after `conv3` (the one `zero_init_residual` zeroes).
    pub bn3: BatchNorm2d,
    /// The projection shortcut, when the shape changes.
    pub downsample: Option<Sequential>,
}

impl Bottleneck {
    fn new(cin: usize, width: usize, stride: usize, config: &ResNetConfig, device: &Device) -> Result<Bottleneck> {
        let inner = width * config.width_per_group / 64 * config.groups;
        let cout = width * BlockKind::Bottleneck.expansion();
        Ok(Bottleneck {
            conv1: conv(cin, inner, 1, 1, 1, device)?,
            bn1: BatchNorm2d::new_2d(inner, device)?,
            conv2: conv(inner, inner, 3, stride, config.groups, device)?,
            bn2: BatchNorm2d::new_2d(inner, device)?,
            conv3: conv(inner, cout, 1, 1, 1, device)?,
            bn3: BatchNorm2d::new_2d(cout, device)?,
            downsample: downsample(cin, cout, stride, device)?,
        })
    }
}

impl Module for Bottleneck {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let out = self.bn1.forward(&self.conv1.forward(x)?)?.relu()?;
        let out = self.bn2.forward(&self.conv2.forward(&out)?)?.relu()?;
        let out = self.bn3.forward(&self.conv3.forward(&out)?)?;
        out.add(&shortcut(&self.downsample, x)?)?.relu()
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        let layers: [(&str, &dyn Module); 6] = [
            ("conv1", &self.conv1),
            ("bn1", &self.bn1),
            ("conv2", &self.conv2),
            ("bn2", &self.bn2),
            ("conv3", &self.conv3),
            ("bn3", &self.bn3),
        ];
        visit_block(f, &layers, &self.downsample);
    }
}

/// A block's children in state-dict order: its layers, then the shortcut when it has one.
fn visit_block(f: &mut dyn FnMut(&str, Entry<'_>), layers: &[(&str, &dyn Module)], downsample: &Option<Sequential>) {
    for (name, layer) in layers {
        f(name, Entry::Child(*layer));
    }
    if let Some(d) = downsample {
        f("downsample", Entry::Child(d));
    }
}

fn zero_scale(bn: &BatchNorm2d) -> Result<()> {
    match &bn.weight {
        Some(w) => init::zeros_(&w.get()),
        None => Ok(()),
    }
}

fn shortcut(downsample: &Option<Sequential>, x: &Tensor) -> Result<Tensor> {
    match downsample {
        Some(d) => d.forward(x),
        None => Ok(x.clone()),
    }
}

/// A ResNet: a 7×7 stride-2 stem with batch norm, ReLU and 3×3 stride-2 max pooling; the
/// residual stages; global average pooling; a linear classifier. Input `(n, c, h, w)`,
/// output logits `(n, num_classes)`.
pub struct ResNet {
    /// The stem convolution, 7×7 stride 2.
    pub conv1: Conv2d,
    /// Batch norm of the stem.
    pub bn1: BatchNorm2d,
    /// 3×3 stride-2 max pooling, padding 1.
    pub maxpool: MaxPool2d,
    /// The stages (`layer1`, `layer2`, …), each a `Sequential` of blocks.
    pub layers: Vec<Sequential>,
    /// Global average pooling to 1×1.
    pub avgpool: AdaptiveAvgPool2d,
    /// The classifier.
    pub fc: Linear,
    /// The configuration it was built from.
    pub config: ResNetConfig,
}

impl ResNet {
    /// A new f32 ResNet on `device`, initialized as torchvision does: convolutions He-normal
    /// (fan-out, ReLU gain), batch norms scale 1 and shift 0 (the last of each block 0 with
    /// `zero_init_residual`), the classifier as `nn.Linear`. Draws from the default
    /// generator, so [`crate::manual_seed`] makes it reproducible.
    pub fn new(config: &ResNetConfig, device: &Device) -> Result<ResNet> {
        config.validate()?;
        let conv1 = {
            let options = Conv2dOptions { stride: [2, 2], padding: [3, 3], bias: false, ..Default::default() };
            let c = Conv2d::new(config.in_channels, config.stem_width, [7, 7], options, device)?;
            init::kaiming_normal_(&c.weight.get(), 0.0, FanMode::FanOut)?;
            c
        };
        let bn1 = BatchNorm2d::new_2d(config.stem_width, device)?;
        let maxpool = MaxPool2d { kernel: [3, 3], stride: [2, 2], padding: [1, 1], dilation: [1, 1] };
        let mut channels = config.stem_width;
        let mut layers = Vec::with_capacity(config.layers.len());
        for (stage, (&blocks, &width)) in config.layers.iter().zip(&config.widths).enumerate() {
            let mut seq = Sequential::new();
            for b in 0..blocks {
                let stride = if stage > 0 && b == 0 { 2 } else { 1 };
                let block: Box<dyn Module> = match config.block {
                    BlockKind::Basic => {
                        let block = BasicBlock::new(channels, width, stride, device)?;
                        if config.zero_init_residual {
                            zero_scale(&block.bn2)?;
                        }
                        Box::new(block)
                    }
                    BlockKind::Bottleneck => {
                        let block = Bottleneck::new(channels, width, stride, config, device)?;
                        if config.zero_init_residual {
                            zero_scale(&block.bn3)?;
                        }
                        Box::new(block)
                    }
                };
                seq.push(block);
                channels = width * config.block.expansion();
            }
            layers.push(seq);
        }
        let fc = Linear::new(channels, config.num_classes, true, device)?;
        Ok(ResNet {
            conv1,
            bn1,
            maxpool,
            layers,
            avgpool: AdaptiveAvgPool2d { output_size: [1, 1] },
            fc,
            config: config.clone(),
        })
    }

    /// The pooled features before the classifier, `(n, channels of the last stage)`.
    pub fn features(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 4 || x.shape()[1] != self.config.in_channels {
            return Err(shape_err(format!(
                "ResNet: expected images (n, {}, h, w), got shape {:?}",
                self.config.in_channels,
                x.shape()
            )));
        }
        let mut x = self.bn1.forward(&self.conv1.forward(x)?)?.relu()?;
        x = self.maxpool.forward(&x)?;
        for stage in &self.layers {
            x = stage.forward(&x)?;
        }
        self.avgpool.forward(&x)?.flatten(1, -1)
    }
}

impl Module for ResNet {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc.forward(&self.features(x)?)
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("conv1", Entry::Child(&self.conv1));
        f("bn1", Entry::Child(&self.bn1));
        for (i, stage) in self.layers.iter().enumerate() {
            f(&format!("layer{}", i + 1), Entry::Child(stage));
        }
        f("fc", Entry::Child(&self.fc));
    }
}
