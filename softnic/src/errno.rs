//! `errno` as the verbs define it, whatever softnic did internally.
//!
//! A provider must leave `errno` alone on every path where the verb does not define it
//! (`ibv_post_send(3)` returns its error and says nothing of `errno`; rxe G1: a rejected post
//! leaves it untouched), and set it exactly where the man page says the verb sets it (the
//! pointer-returning verbs, `ibv_get_cq_event(3)`, `ibv_get_async_event(3)`, ...). softnic's
//! internals make system calls that clobber `errno` as a side effect: the fabric mutex's futex
//! wait fails with `EAGAIN` under contention, pipe writes on a full pipe fail with `EAGAIN`,
//! allocations may touch `errno`. Every ABI entry point therefore opens an [`ErrnoScope`]
//! first: it saves the caller's `errno` and, when the entry point returns, writes back either
//! the value the verb chose to report (through [`set_errno`]) or the saved one.
//!
//! Scopes nest (an entry point that calls another, e.g. `ibv_create_ah_from_wc` ->
//! `ibv_init_ah_from_wc`): a value reported inside an inner scope is also the outer scope's
//! report, so it reaches the caller.

use core::cell::Cell;

std::thread_local! {
    /// The `errno` the innermost open scope of this thread will report, if any.
    static REPORTED: Cell<Option<i32>> = const { Cell::new(None) };
}

/// Restores or reports `errno` when dropped; see the module docs.
pub(crate) struct ErrnoScope {
    saved: i32,
    outer: Option<i32>,
}

impl ErrnoScope {
    /// Opens a scope at the top of an ABI entry point.
    #[inline]
    pub(crate) fn enter() -> Self {
        ErrnoScope {
            saved: hotverbs_ffi::errno(),
            outer: REPORTED.replace(None),
        }
    }
}

impl Drop for ErrnoScope {
    #[inline]
    fn drop(&mut self) {
        let reported = REPORTED.take();
        hotverbs_ffi::set_errno(reported.unwrap_or(self.saved));
        REPORTED.set(reported.or(self.outer));
    }
}

/// Reports `value` as the verb's `errno` (the caller sees it when the entry point returns,
/// whatever system calls run after this).
#[inline]
pub(crate) fn set_errno(value: i32) {
    REPORTED.set(Some(value));
    hotverbs_ffi::set_errno(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreported_errno_is_restored() {
        hotverbs_ffi::set_errno(1234);
        {
            let _s = ErrnoScope::enter();
            hotverbs_ffi::set_errno(libc::EAGAIN); // an internal syscall's side effect
        }
        assert_eq!(hotverbs_ffi::errno(), 1234);
    }

    #[test]
    fn reported_errno_survives_later_clobbering() {
        hotverbs_ffi::set_errno(1234);
        {
            let _s = ErrnoScope::enter();
            set_errno(libc::EINVAL);
            hotverbs_ffi::set_errno(libc::EAGAIN);
        }
        assert_eq!(hotverbs_ffi::errno(), libc::EINVAL);
        // The report ends with its scope: the next entry point starts clean.
        {
            let _s = ErrnoScope::enter();
            hotverbs_ffi::set_errno(libc::EAGAIN);
        }
        assert_eq!(hotverbs_ffi::errno(), libc::EINVAL);
    }

    #[test]
    fn an_inner_report_reaches_the_outer_caller() {
        hotverbs_ffi::set_errno(7);
        {
            let _outer = ErrnoScope::enter();
            {
                let _inner = ErrnoScope::enter();
                set_errno(libc::ENODATA);
            }
            hotverbs_ffi::set_errno(libc::EAGAIN);
        }
        assert_eq!(hotverbs_ffi::errno(), libc::ENODATA);
        // An inner scope with nothing to report does not erase the outer one's report.
        {
            let _outer = ErrnoScope::enter();
            set_errno(libc::EBUSY);
            {
                let _inner = ErrnoScope::enter();
                hotverbs_ffi::set_errno(libc::EAGAIN);
            }
        }
        assert_eq!(hotverbs_ffi::errno(), libc::EBUSY);
    }
}
