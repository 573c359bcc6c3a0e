//! Temporary: the header's `verbs_context` dispatch for the thread/parent domain and
//! real-time-values verbs, until hotverbs-ffi's inlines of them are merged (then this
//! module re-exports those).

use std::mem::{offset_of, size_of};

use hotverbs_ffi::{
    ibv_context, ibv_parent_domain_init_attr, ibv_pd, ibv_td, ibv_td_init_attr, ibv_values_ex,
    verbs_context,
};

macro_rules! op {
    ($ctx:expr, $op:ident) => {{
        // SAFETY: caller's contract: live context.
        let vctx = unsafe { hotverbs_ffi::inline::verbs_get_ctx($ctx) };
        let need = size_of::<verbs_context>() - offset_of!(verbs_context, $op);
        // SAFETY: an extended context's `sz` says how many bytes before `context` are valid.
        if vctx.is_null() || unsafe { (*vctx).sz } < need {
            None
        } else {
            // SAFETY: within the valid part (checked above).
            unsafe { (*vctx).$op }
        }
    }};
}

/// `ibv_alloc_td(3)`.
///
/// # Safety
/// `ctx` live; `attr` valid.
pub(crate) unsafe fn ibv_alloc_td(
    ctx: *mut ibv_context,
    attr: *mut ibv_td_init_attr,
) -> *mut ibv_td {
    match op!(ctx, alloc_td) {
        // SAFETY: provider op with the header's arguments.
        Some(f) => unsafe { f(ctx, attr) },
        None => {
            hotverbs_ffi::set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        }
    }
}

/// `ibv_dealloc_td(3)`.
///
/// # Safety
/// `td` live.
pub(crate) unsafe fn ibv_dealloc_td(td: *mut ibv_td) -> i32 {
    // SAFETY: live td.
    let ctx = unsafe { (*td).context };
    match op!(ctx, dealloc_td) {
        // SAFETY: provider op with the header's arguments.
        Some(f) => unsafe { f(td) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_alloc_parent_domain(3)`.
///
/// # Safety
/// `ctx` live; `attr` valid.
pub(crate) unsafe fn ibv_alloc_parent_domain(
    ctx: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    match op!(ctx, alloc_parent_domain) {
        // SAFETY: provider op with the header's arguments.
        Some(f) => unsafe { f(ctx, attr) },
        None => {
            hotverbs_ffi::set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        }
    }
}

/// `ibv_query_rt_values_ex(3)`.
///
/// # Safety
/// `ctx` live; `values` writable.
pub(crate) unsafe fn ibv_query_rt_values_ex(
    ctx: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> i32 {
    match op!(ctx, query_rt_values) {
        // SAFETY: provider op with the header's arguments.
        Some(f) => unsafe { f(ctx, values) },
        None => libc::EOPNOTSUPP,
    }
}
