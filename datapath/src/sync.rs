//! The one place atomics come from: `core::sync::atomic`, or loom's model-checked
//! atomics under `cfg(loom)` (`RUSTFLAGS="--cfg loom"`), so the split-mode protocol in
//! [`crate::split`] is the code loom explores.

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A value on its own cache line, so the poster's and the poller's counters never share
/// one (no false sharing between the two threads of the split mode).
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct CachePadded<T>(pub T);

impl<T> core::ops::Deref for CachePadded<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}
