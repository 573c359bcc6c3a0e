//! Test-only proof that `hotverbs_ffi::inline` dispatches exactly as the static inlines of
//! the system's `infiniband/verbs.h` do.
//!
//! - [`c`]: the header's own inlines, compiled by the C compiler from `csrc/equiv.c` (one
//!   non-inline wrapper each), plus that file's stand-ins for the exported libibverbs
//!   symbols the setup inlines fall back to (libibverbs is never linked).
//! - [`record`]: a recording provider: `extern "C"` functions for every `ibv_context.ops`,
//!   `ibv_qp_ex`, `ibv_cq_ex` and `verbs_context` slot the inlines reach, each logging its
//!   slot name and arguments into a thread-local log and returning a distinctive value.
//! - [`fake`]: real ABI objects (`verbs_context` with its `ibv_context`, `ibv_qp`,
//!   `ibv_srq`, `ibv_cq`, `ibv_qp_ex`, `ibv_cq_ex`) wired to the recording provider.
//! - [`compare`]: runs one operation through the C side and through the Rust side and
//!   asserts both produced the same calls, return value and `errno`.
//!
//! The tests (`cargo test -p hotverbs-ffi-equiv`):
//! - `tests/hot_path.rs`: the five legacy hot verbs, every `ibv_wr_*`, the extended-CQ
//!   poll/read family, plus a negative control proving the harness reports a wrong slot,
//!   argument or return value.
//! - `tests/setup.rs`: `verbs_get_ctx`, `ibv_query_port`, `ibv_query_device_ex`,
//!   `ibv_create_{qp,srq,cq}_ex`, `ibv_alloc_td`, `ibv_dealloc_td`, `ibv_alloc_parent_domain`,
//!   `ibv_query_rt_values_ex`, `ibv_query_gid_{ex,table}` on every `verbs_context` path
//!   (extended, legacy, op NULL, `sz` at / one below the op's boundary, `sz` 0).
//! - `tests/layout.rs`: `sizeof` / `_Alignof` / `offsetof` of the C compiler against the
//!   generated types.
//! - `tests/softnic.rs`: the same C-vs-Rust comparison on softnic's real objects (the
//!   exported-symbol stand-ins forward to its table, [`record::forward_exports_to`]),
//!   including its extended context, `ibv_qp_ex` batches and `ibv_cq_ex` polls.
//!
//! This crate needs libibverbs-dev headers to build, so it is `publish = false` and
//! nothing depends on it; libibverbs itself is never linked or loaded.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs)]
// Bench and test harness types, not an API: no Debug needed.
#![allow(missing_debug_implementations)]

pub mod c;
pub mod fake;
pub mod record;

pub use record::{Arg, Call};

/// Which implementation of an inline a comparison step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The header's static inline, compiled by the C compiler.
    C,
    /// `hotverbs_ffi::inline`.
    Rust,
}

/// What one side did: the provider calls it caused, what it returned, and `errno` after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome<R> {
    /// Every recorded provider / exported-symbol call, in order.
    pub calls: Vec<Call>,
    /// The operation's result (return value, plus whatever the closure chose to observe).
    pub ret: R,
    /// `errno` after the call (it is cleared before).
    pub errno: i32,
}

/// Runs `op` for one side with a clean log and `errno` = 0, and returns what it did.
pub fn run<R>(side: Side, op: &mut impl FnMut(Side) -> R) -> Outcome<R> {
    record::install_export_hooks();
    drop(record::take());
    hotverbs_ffi::set_errno(0);
    let ret = op(side);
    let errno = hotverbs_ffi::errno();
    Outcome {
        calls: record::take(),
        ret,
        errno,
    }
}

/// The equivalence check: runs `op` once as [`Side::C`] and once as [`Side::Rust`], asserts
/// that the C side made exactly the `expected` calls (so the test states which slot the
/// header uses, with which arguments), and that the Rust side made the same calls, returned
/// the same value and left the same `errno`. Returns the (common) result.
#[track_caller]
pub fn compare<R>(what: &str, expected: &[Call], mut op: impl FnMut(Side) -> R) -> R
where
    R: PartialEq + core::fmt::Debug,
{
    let c = run(Side::C, &mut op);
    let rust = run(Side::Rust, &mut op);
    assert_eq!(
        c.calls, expected,
        "{what}: the header's C inline did not make the expected provider calls"
    );
    assert_eq!(
        rust.calls, c.calls,
        "{what}: Rust dispatch differs from the header's (slot or arguments)"
    );
    assert_eq!(
        rust.ret, c.ret,
        "{what}: Rust result differs from the header's"
    );
    assert_eq!(
        rust.errno, c.errno,
        "{what}: Rust errno differs from the header's"
    );
    rust.ret
}
