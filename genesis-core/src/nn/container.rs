//! `Sequential` and `ModuleList`.

use super::module::{Entry, Module, TrainingFlag};
use crate::error::Result;
use crate::tensor::Tensor;

/// Modules applied in order (`nn.Sequential`); children are named `0`, `1`, ...
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
    training: TrainingFlag,
}

impl Sequential {
    /// An empty sequence.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// This sequence with `layer` appended.
    #[allow(clippy::should_implement_trait)]
    pub fn add(mut self, layer: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    /// Append a boxed module.
    pub fn push(&mut self, layer: Box<dyn Module>) {
        self.layers.push(layer);
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True without layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Layer `i`.
    pub fn get(&self, i: usize) -> Option<&dyn Module> {
        self.layers.get(i).map(|m| m.as_ref())
    }
}

impl Module for Sequential {
    fn forward(&self, input: &Tensor) -> Result<Tensor> {
        let mut x = input.clone();
        for layer in &self.layers {
            x = layer.forward(&x)?;
        }
        Ok(x)
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("", Entry::Training(&self.training));
        for (i, layer) in self.layers.iter().enumerate() {
            f(&i.to_string(), Entry::Child(layer.as_ref()));
        }
    }
}

/// A list of modules whose parameters are registered under `0`, `1`, ... (`nn.ModuleList`).
/// It has no forward of its own: iterate it in the parent's forward.
#[derive(Debug)]
pub struct ModuleList<M: Module> {
    items: Vec<M>,
    training: TrainingFlag,
}

impl<M: Module> ModuleList<M> {
    /// A list of `items`.
    pub fn new(items: Vec<M>) -> ModuleList<M> {
        ModuleList { items, training: TrainingFlag::default() }
    }

    /// The modules.
    pub fn iter(&self) -> std::slice::Iter<'_, M> {
        self.items.iter()
    }

    /// Number of modules.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Module `i`.
    pub fn get(&self, i: usize) -> Option<&M> {
        self.items.get(i)
    }
}

impl<M: Module> Module for ModuleList<M> {
    /// A `ModuleList` is a container, not a layer: calling forward is an error.
    fn forward(&self, _input: &Tensor) -> Result<Tensor> {
        Err(crate::error::Error::invalid("ModuleList has no forward; iterate over its modules instead"))
    }

    fn visit(&self, f: &mut dyn FnMut(&str, Entry<'_>)) {
        f("", Entry::Training(&self.training));
        for (i, m) in self.items.iter().enumerate() {
            f(&i.to_string(), Entry::Child(m));
        }
    }
}
