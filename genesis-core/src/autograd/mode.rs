//! Grad mode: whether ops record the graph, per thread (as in PyTorch).

use std::cell::Cell;

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// True when ops record the autograd graph on this thread.
pub fn is_grad_enabled() -> bool {
    ENABLED.with(Cell::get)
}

/// Restores the previous grad mode when dropped.
pub struct GradModeGuard {
    previous: bool,
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        ENABLED.with(|e| e.set(self.previous));
    }
}

/// Set grad mode until the guard is dropped.
pub fn set_grad_enabled(enabled: bool) -> GradModeGuard {
    let previous = ENABLED.with(|e| e.replace(enabled));
    GradModeGuard { previous }
}

/// Run `f` without recording the graph (`torch.no_grad()`).
pub fn no_grad<T>(f: impl FnOnce() -> T) -> T {
    let _guard = set_grad_enabled(false);
    f()
}
