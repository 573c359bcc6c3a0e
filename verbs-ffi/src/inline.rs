//! The static-inline functions of `infiniband/verbs.h`, in Rust.
//!
//! The hot ones (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`,
//! `ibv_post_srq_recv`, `ibv_wr_*`, `ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll`,
//! `ibv_wc_read_*`) do exactly what the header does: one load of the provider's function
//! pointer out of `ibv_context.ops` (or out of `ibv_qp_ex` / `ibv_cq_ex`) and one indirect
//! call. They are `#[inline(always)]` so the datapath compiles to the same instructions a C
//! program gets.
//!
//! # NULL slots
//! A slot is `Option<fn>`; what a NULL one does depends on whether any provider leaves it
//! NULL:
//! - The five `ibv_context.ops` verbs (`post_send`, `post_recv`, `post_srq_recv`,
//!   `poll_cq`, `req_notify_cq`) are never NULL in a context libibverbs made: its
//!   `verbs_init_context` installs `verbs_dummy_ops` (which answer EOPNOTSUPP) before the
//!   provider sets its own, and softnic's contexts fill all five. "A live QP/SRQ/CQ" below
//!   includes "of a context whose five hot ops are filled", so these stay one load and one
//!   call (`unreachable_unchecked` on NULL), exactly the C inline.
//! - The `ibv_qp_ex` (`ibv_wr_*`) and `ibv_cq_ex` (`ibv_start_poll`, `ibv_wc_read_*`) slots
//!   are filled only on request: rxe sets `wr_send_tso` only for a QP created with
//!   `IBV_QP_EX_WITH_TSO` in `send_ops_flags`, mlx5 sets a `read_*` only for the fields in
//!   `wc_flags`. Where C would fault at address 0, these abort the process with a message
//!   naming the slot (one predicted-not-taken branch; the abort path is out of line). Calling
//!   an op or reading a field that was not requested is still a contract violation (it is
//!   `unsafe` to call them for the other reasons too), but it is never undefined behaviour.
//!
//! The setup-side inlines (`___ibv_query_port` behind the `ibv_query_port` macro,
//! `ibv_query_device_ex`, `ibv_create_qp_ex`, `ibv_create_cq_ex`, `ibv_create_srq_ex`,
//! `ibv_query_gid_ex`, `ibv_alloc_td`, `ibv_dealloc_td`, `ibv_alloc_parent_domain`,
//! `ibv_query_rt_values_ex`) follow the header's `verbs_context` logic and take the loaded
//! [`IbvFns`] table for their fallbacks to exported symbols.
//!
//! Equivalence with the header's own C is tested in `verbs-ffi/equiv/` (C compiled with `cc`
//! from the real header against a recording ops table).
//!
//! # Safety (whole module)
//! Every function here is `unsafe`: the pointers must be live objects of an opened device
//! (or of a software device that fills the same ABI), exactly as for the C inlines; for the
//! five context ops that includes "the context's hot ops are filled" (see above).
#![allow(clippy::missing_safety_doc)] // one contract for the module, stated above.

use core::ffi::{c_int, c_uint, c_void};
use core::mem::{offset_of, size_of};

use crate::generated::types::*;
use crate::IbvFns;

/// One of the five `ibv_context.ops` hot verbs: never NULL in a context libibverbs made
/// (`verbs_dummy_ops`) or softnic made, which the callers' contract ("a live QP/SRQ/CQ")
/// includes.
macro_rules! hot_op {
    ($e:expr) => {
        match $e {
            Some(f) => f,
            // Callers are inside an `unsafe` block under that contract (the C inline would
            // call through NULL here).
            None => core::hint::unreachable_unchecked(),
        }
    };
}

/// An `ibv_qp_ex` / `ibv_cq_ex` slot, which the provider fills only when it was requested at
/// creation: the function, or an abort naming the slot.
macro_rules! requested_slot {
    ($e:expr, $name:expr) => {
        match $e {
            Some(f) => f,
            None => null_slot($name),
        }
    };
}

/// Aborts the process because the provider slot `name` is NULL: the op or completion field
/// was not requested when the QP or CQ was created. What the C inline would do (fault at
/// address 0), with a message; never undefined behaviour.
#[cold]
#[inline(never)]
fn null_slot(name: &'static str) -> ! {
    let parts: [&[u8]; 3] = [
        b"hotverbs-ffi: NULL provider slot `",
        name.as_bytes(),
        b"` (an ibv_qp_ex op or ibv_cq_ex field not requested when the QP/CQ was created); \
          aborting\n",
    ];
    for part in parts {
        // SAFETY: `part` is a live byte slice of `part.len()` bytes; fd 2 may be closed, in
        // which case write fails harmlessly (its result is ignored: we abort either way).
        let _ = unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
    }
    // SAFETY: abort has no preconditions; it does not return.
    unsafe { libc::abort() }
}

/// `ibv_post_send(3)`: `qp->context->ops.post_send(qp, wr, bad_wr)`.
///
/// # Safety
/// `qp` is a live QP (of a context whose hot ops are filled: [NULL slots](self#null-slots));
/// `wr` a valid chain; `bad_wr` writable.
#[inline(always)]
pub unsafe fn ibv_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: caller guarantees qp is live, so its context and ops are valid and the op is
    // filled.
    unsafe { hot_op!((*(*qp).context).ops.post_send)(qp, wr, bad_wr) }
}

/// `ibv_post_recv(3)`: `qp->context->ops.post_recv(qp, wr, bad_wr)`.
///
/// # Safety
/// `qp` is a live QP (of a context whose hot ops are filled: [NULL slots](self#null-slots));
/// `wr` a valid chain; `bad_wr` writable.
#[inline(always)]
pub unsafe fn ibv_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: caller guarantees qp is live and its context's hot ops are filled.
    unsafe { hot_op!((*(*qp).context).ops.post_recv)(qp, wr, bad_wr) }
}

/// `ibv_post_srq_recv(3)`: `srq->context->ops.post_srq_recv(srq, wr, bad_wr)`.
///
/// # Safety
/// `srq` is a live SRQ (of a context whose hot ops are filled:
/// [NULL slots](self#null-slots)); `wr` a valid chain; `bad_wr` writable.
#[inline(always)]
pub unsafe fn ibv_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: caller guarantees srq is live and its context's hot ops are filled.
    unsafe { hot_op!((*(*srq).context).ops.post_srq_recv)(srq, wr, bad_wr) }
}

/// `ibv_poll_cq(3)`: `cq->context->ops.poll_cq(cq, num_entries, wc)`.
///
/// # Safety
/// `cq` is a live CQ (of a context whose hot ops are filled: [NULL slots](self#null-slots));
/// `wc` points to at least `num_entries` writable `ibv_wc`.
#[inline(always)]
pub unsafe fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: caller guarantees cq is live and its context's hot ops are filled.
    unsafe { hot_op!((*(*cq).context).ops.poll_cq)(cq, num_entries, wc) }
}

/// `ibv_req_notify_cq(3)`: `cq->context->ops.req_notify_cq(cq, solicited_only)`.
///
/// # Safety
/// `cq` is a live CQ (of a context whose hot ops are filled: [NULL slots](self#null-slots)).
#[inline(always)]
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: caller guarantees cq is live and its context's hot ops are filled.
    unsafe { hot_op!((*(*cq).context).ops.req_notify_cq)(cq, solicited_only) }
}

macro_rules! wr_fn {
    ($(#[$m:meta])* $name:ident => $slot:ident ( $($arg:ident : $ty:ty),* ) $(-> $ret:ty)?) => {
        $(#[$m])*
        ///
        /// # Safety
        /// `qp` is a live extended QP (from `ibv_qp_to_qp_ex` or `ibv_create_qp_ex` with
        /// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`) inside `ibv_wr_start` .. `ibv_wr_complete`,
        /// the op was requested in its `send_ops_flags` (providers fill only the requested
        /// ops; a NULL slot aborts the process), and every pointer argument is valid as
        /// `ibv_wr_post(3)` requires.
        #[inline(always)]
        pub unsafe fn $name(qp: *mut ibv_qp_ex $(, $arg: $ty)*) $(-> $ret)? {
            // SAFETY: caller guarantees qp is a live extended QP, so the slot is readable;
            // a NULL slot aborts instead of being called, a filled one is the provider's
            // op for this QP, called with the header's arguments.
            unsafe { requested_slot!((*qp).$slot, stringify!($slot))(qp $(, $arg)*) }
        }
    };
}

wr_fn!(/// `ibv_wr_start(3)`.
    ibv_wr_start => wr_start());
wr_fn!(/// `ibv_wr_complete(3)`.
    ibv_wr_complete => wr_complete() -> c_int);
wr_fn!(/// `ibv_wr_abort(3)`.
    ibv_wr_abort => wr_abort());
wr_fn!(/// `ibv_wr_send(3)`.
    ibv_wr_send => wr_send());
wr_fn!(/// `ibv_wr_send_imm(3)`.
    ibv_wr_send_imm => wr_send_imm(imm_data: __be32));
wr_fn!(/// `ibv_wr_send_inv(3)`.
    ibv_wr_send_inv => wr_send_inv(invalidate_rkey: u32));
wr_fn!(/// `ibv_wr_send_tso(3)`.
    ibv_wr_send_tso => wr_send_tso(hdr: *mut c_void, hdr_sz: u16, mss: u16));
wr_fn!(/// `ibv_wr_rdma_write(3)`.
    ibv_wr_rdma_write => wr_rdma_write(rkey: u32, remote_addr: u64));
wr_fn!(/// `ibv_wr_rdma_write_imm(3)`.
    ibv_wr_rdma_write_imm => wr_rdma_write_imm(rkey: u32, remote_addr: u64, imm_data: __be32));
wr_fn!(/// `ibv_wr_rdma_read(3)`.
    ibv_wr_rdma_read => wr_rdma_read(rkey: u32, remote_addr: u64));
wr_fn!(/// `ibv_wr_atomic_cmp_swp(3)`.
    ibv_wr_atomic_cmp_swp => wr_atomic_cmp_swp(rkey: u32, remote_addr: u64, compare: u64, swap: u64));
wr_fn!(/// `ibv_wr_atomic_fetch_add(3)`.
    ibv_wr_atomic_fetch_add => wr_atomic_fetch_add(rkey: u32, remote_addr: u64, add: u64));
wr_fn!(/// `ibv_wr_atomic_write(3)`.
    ibv_wr_atomic_write => wr_atomic_write(rkey: u32, remote_addr: u64, atomic_wr: *const c_void));
wr_fn!(/// `ibv_wr_bind_mw(3)`.
    ibv_wr_bind_mw => wr_bind_mw(mw: *mut ibv_mw, rkey: u32, bind_info: *const ibv_mw_bind_info));
wr_fn!(/// `ibv_wr_local_inv(3)`.
    ibv_wr_local_inv => wr_local_inv(invalidate_rkey: u32));
wr_fn!(/// `ibv_wr_set_sge(3)`.
    ibv_wr_set_sge => wr_set_sge(lkey: u32, addr: u64, length: u32));
wr_fn!(/// `ibv_wr_set_sge_list(3)`.
    ibv_wr_set_sge_list => wr_set_sge_list(num_sge: usize, sg_list: *const ibv_sge));
wr_fn!(/// `ibv_wr_set_inline_data(3)`.
    ibv_wr_set_inline_data => wr_set_inline_data(addr: *mut c_void, length: usize));
wr_fn!(/// `ibv_wr_set_inline_data_list(3)`.
    ibv_wr_set_inline_data_list => wr_set_inline_data_list(num_buf: usize, buf_list: *const ibv_data_buf));
wr_fn!(/// `ibv_wr_set_ud_addr(3)`.
    ibv_wr_set_ud_addr => wr_set_ud_addr(ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32));
wr_fn!(/// `ibv_wr_set_xrc_srqn(3)`.
    ibv_wr_set_xrc_srqn => wr_set_xrc_srqn(remote_srqn: u32));

macro_rules! cq_fn {
    ($(#[$m:meta])* $name:ident => $slot:ident ( $($arg:ident : $ty:ty),* ) $(-> $ret:ty)?) => {
        $(#[$m])*
        ///
        /// # Safety
        /// `cq` is a live extended CQ (`ibv_create_cq_ex`), used as `ibv_create_cq_ex(3)`
        /// describes (read functions only between a successful start/next poll and end),
        /// and for an `ibv_wc_read_*` the field was requested in its `wc_flags` (providers
        /// fill only the requested readers; a NULL slot aborts the process).
        #[inline(always)]
        pub unsafe fn $name(cq: *mut ibv_cq_ex $(, $arg: $ty)*) $(-> $ret)? {
            // SAFETY: caller guarantees cq is a live extended CQ, so the slot is readable;
            // a NULL slot aborts instead of being called, a filled one is the provider's
            // function for this CQ, called with the header's arguments.
            unsafe { requested_slot!((*cq).$slot, stringify!($slot))(cq $(, $arg)*) }
        }
    };
}

cq_fn!(/// `ibv_start_poll(3)`.
    ibv_start_poll => start_poll(attr: *mut ibv_poll_cq_attr) -> c_int);
cq_fn!(/// `ibv_next_poll(3)`.
    ibv_next_poll => next_poll() -> c_int);
cq_fn!(/// `ibv_end_poll(3)`.
    ibv_end_poll => end_poll());
cq_fn!(/// `ibv_wc_read_opcode(3)`.
    ibv_wc_read_opcode => read_opcode() -> ibv_wc_opcode);
cq_fn!(/// `ibv_wc_read_vendor_err(3)`.
    ibv_wc_read_vendor_err => read_vendor_err() -> u32);
cq_fn!(/// `ibv_wc_read_byte_len(3)`.
    ibv_wc_read_byte_len => read_byte_len() -> u32);
cq_fn!(/// `ibv_wc_read_imm_data(3)`.
    ibv_wc_read_imm_data => read_imm_data() -> __be32);
cq_fn!(/// `ibv_wc_read_qp_num(3)`.
    ibv_wc_read_qp_num => read_qp_num() -> u32);
cq_fn!(/// `ibv_wc_read_src_qp(3)`.
    ibv_wc_read_src_qp => read_src_qp() -> u32);
cq_fn!(/// `ibv_wc_read_wc_flags(3)`.
    ibv_wc_read_wc_flags => read_wc_flags() -> c_uint);
cq_fn!(/// `ibv_wc_read_slid(3)`.
    ibv_wc_read_slid => read_slid() -> u32);
cq_fn!(/// `ibv_wc_read_sl(3)`.
    ibv_wc_read_sl => read_sl() -> u8);
cq_fn!(/// `ibv_wc_read_completion_ts(3)`.
    ibv_wc_read_completion_ts => read_completion_ts() -> u64);
cq_fn!(/// `ibv_wc_read_dlid_path_bits(3)`.
    ibv_wc_read_dlid_path_bits => read_dlid_path_bits() -> u8);
cq_fn!(/// `ibv_wc_read_completion_wallclock_ns(3)`.
    ibv_wc_read_completion_wallclock_ns => read_completion_wallclock_ns() -> u64);
cq_fn!(/// `ibv_wc_read_cvlan(3)`.
    ibv_wc_read_cvlan => read_cvlan() -> u16);
cq_fn!(/// `ibv_wc_read_flow_tag(3)`.
    ibv_wc_read_flow_tag => read_flow_tag() -> u32);
cq_fn!(/// `ibv_wc_read_tm_info(3)`.
    ibv_wc_read_tm_info => read_tm_info(tm_info: *mut ibv_wc_tm_info));

/// `ibv_wc_read_invalidated_rkey(3)`: the header returns `read_imm_data` unchanged (the
/// `__be32` is reinterpreted, not byte-swapped; the equivalence test pins this).
///
/// # Safety
/// As [`ibv_wc_read_imm_data`].
#[inline(always)]
pub unsafe fn ibv_wc_read_invalidated_rkey(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { ibv_wc_read_imm_data(cq) }
}

/// `ibv_cq_ex_to_cq`: an extended CQ starts with the `ibv_cq` fields.
#[inline(always)]
pub fn ibv_cq_ex_to_cq(cq: *mut ibv_cq_ex) -> *mut ibv_cq {
    cq.cast()
}

// ---------------------------------------------------------------------------------------
// Setup-side inlines: the header's verbs_context logic.
// ---------------------------------------------------------------------------------------

/// `verbs_get_ctx(3)`: the `verbs_context` around `ctx`, if the provider made one.
///
/// # Safety
/// `ctx` is a live context.
#[inline]
pub unsafe fn verbs_get_ctx(ctx: *mut ibv_context) -> *mut verbs_context {
    // SAFETY: caller guarantees ctx is live.
    if unsafe { (*ctx).abi_compat } != crate::VERBS_ABI_IS_EXTENDED {
        return core::ptr::null_mut();
    }
    // container_of: the context is the last field of verbs_context.
    ctx.cast::<u8>()
        .wrapping_sub(offset_of!(verbs_context, context))
        .cast()
}

/// `verbs_get_ctx_op(ctx, op)`: the extended context if it is large enough to hold the
/// op and the op is set.
macro_rules! ctx_op {
    ($ctx:expr, $op:ident) => {{
        // SAFETY: forwarded from the caller's contract (live context).
        let vctx = unsafe { verbs_get_ctx($ctx) };
        let need = size_of::<verbs_context>() - offset_of!(verbs_context, $op);
        // SAFETY: vctx is non-null only for an extended context, whose `sz` field (just
        // before `context`) says how many bytes before `context` are valid.
        if vctx.is_null() || unsafe { (*vctx).sz } < need {
            None
        } else {
            // SAFETY: the op field lies within the valid part (checked above).
            unsafe { (*vctx).$op }
        }
    }};
}

fn enosys<T>(f: Option<T>) -> Result<T, c_int> {
    f.ok_or(libc::ENOSYS)
}

/// `ibv_query_port(3)` as the header's `___ibv_query_port`: the extended `query_port` op
/// with `sizeof(ibv_port_attr)`, else a zeroed struct and the exported
/// `ibv_query_port@IBVERBS_1.1` (never the 1.0 compat symbol).
///
/// # Safety
/// `ctx` live; `attr` writable.
pub unsafe fn ibv_query_port(
    fns: &IbvFns,
    ctx: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    if let Some(op) = ctx_op!(ctx, query_port) {
        // SAFETY: provider op with the header's arguments.
        return unsafe { op(ctx, port_num, attr, size_of::<ibv_port_attr>()) };
    }
    // SAFETY: attr is writable (caller).
    unsafe { core::ptr::write_bytes(attr, 0, 1) };
    match enosys(fns.ibv_query_port) {
        // SAFETY: exported symbol; the header passes the new struct cast to the compat type.
        Ok(f) => unsafe { f(ctx, port_num, attr.cast()) },
        Err(e) => e,
    }
}

/// `ibv_query_device_ex(3)`: the extended op, falling back to `ibv_query_device` into
/// `orig_attr` (zeroing the rest) when it is absent or answers EOPNOTSUPP/ENOSYS.
///
/// # Safety
/// `ctx` live; `input` null or valid; `attr` writable.
pub unsafe fn ibv_query_device_ex(
    fns: &IbvFns,
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
) -> c_int {
    // SAFETY: input is null or valid (caller).
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return libc::EINVAL;
    }
    if let Some(op) = ctx_op!(ctx, query_device_ex) {
        // SAFETY: provider op with the header's arguments.
        let ret = unsafe { op(ctx, input, attr, size_of::<ibv_device_attr_ex>()) };
        if ret != libc::EOPNOTSUPP && ret != libc::ENOSYS {
            return ret;
        }
    }
    // SAFETY: attr is writable (caller).
    unsafe { core::ptr::write_bytes(attr, 0, 1) };
    match enosys(fns.ibv_query_device) {
        // SAFETY: exported symbol, valid arguments.
        Ok(f) => unsafe { f(ctx, core::ptr::addr_of_mut!((*attr).orig_attr)) },
        Err(e) => e,
    }
}

/// `ibv_create_qp_ex(3)`: plain `ibv_create_qp` when only the PD is given, else the
/// extended op (errno EOPNOTSUPP and NULL when the provider has none).
///
/// # Safety
/// `ctx` live; `attr` valid and writable.
pub unsafe fn ibv_create_qp_ex(
    fns: &IbvFns,
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    // SAFETY: attr valid (caller).
    let mask = unsafe { (*attr).comp_mask };
    if mask == IBV_QP_INIT_ATTR_PD {
        return match enosys(fns.ibv_create_qp) {
            // SAFETY: the header casts ibv_qp_init_attr_ex to its ibv_qp_init_attr prefix.
            Ok(f) => unsafe { f((*attr).pd, attr.cast()) },
            Err(e) => {
                crate::set_errno(e);
                core::ptr::null_mut()
            }
        };
    }
    match ctx_op!(ctx, create_qp_ex) {
        // SAFETY: provider op with the header's arguments.
        Some(op) => unsafe { op(ctx, attr) },
        None => {
            crate::set_errno(libc::EOPNOTSUPP);
            core::ptr::null_mut()
        }
    }
}

/// `ibv_create_cq_ex(3)`: the extended op, or NULL with errno EOPNOTSUPP.
///
/// # Safety
/// `ctx` live; `attr` valid.
pub unsafe fn ibv_create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    match ctx_op!(ctx, create_cq_ex) {
        // SAFETY: provider op with the header's arguments.
        Some(op) => unsafe { op(ctx, attr) },
        None => {
            crate::set_errno(libc::EOPNOTSUPP);
            core::ptr::null_mut()
        }
    }
}

/// `ibv_create_srq_ex(3)`: plain `ibv_create_srq` for a basic SRQ with a PD, else the
/// extended op (EOPNOTSUPP when absent).
///
/// # Safety
/// `ctx` live; `attr` valid and writable.
pub unsafe fn ibv_create_srq_ex(
    fns: &IbvFns,
    ctx: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    // SAFETY: attr valid (caller).
    let (mask, srq_type) = unsafe { ((*attr).comp_mask, (*attr).srq_type) };
    let basic = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
    if mask & !basic == 0
        && mask & IBV_SRQ_INIT_ATTR_PD != 0
        && (mask & IBV_SRQ_INIT_ATTR_TYPE == 0 || srq_type == IBV_SRQT_BASIC)
    {
        return match enosys(fns.ibv_create_srq) {
            // SAFETY: the header casts to the ibv_srq_init_attr prefix.
            Ok(f) => unsafe { f((*attr).pd, attr.cast()) },
            Err(e) => {
                crate::set_errno(e);
                core::ptr::null_mut()
            }
        };
    }
    match ctx_op!(ctx, create_srq_ex) {
        // SAFETY: provider op with the header's arguments.
        Some(op) => unsafe { op(ctx, attr) },
        None => {
            crate::set_errno(libc::EOPNOTSUPP);
            core::ptr::null_mut()
        }
    }
}

/// `ibv_query_gid_ex(3)`: `_ibv_query_gid_ex` with `sizeof(ibv_gid_entry)`.
///
/// # Safety
/// `ctx` live; `entry` writable.
pub unsafe fn ibv_query_gid_ex(
    fns: &IbvFns,
    ctx: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
) -> c_int {
    match enosys(fns._ibv_query_gid_ex) {
        // SAFETY: exported symbol, valid arguments (caller).
        Ok(f) => unsafe {
            f(
                ctx,
                port_num,
                gid_index,
                entry,
                flags,
                size_of::<ibv_gid_entry>(),
            )
        },
        Err(e) => e,
    }
}

/// `ibv_query_gid_table(3)`: `_ibv_query_gid_table` with `sizeof(ibv_gid_entry)`.
///
/// # Safety
/// `ctx` live; `entries` has room for `max_entries`.
pub unsafe fn ibv_query_gid_table(
    fns: &IbvFns,
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
) -> isize {
    match enosys(fns._ibv_query_gid_table) {
        // SAFETY: exported symbol, valid arguments (caller).
        Ok(f) => unsafe { f(ctx, entries, max_entries, flags, size_of::<ibv_gid_entry>()) },
        Err(e) => -(e as isize),
    }
}

/// `ibv_alloc_td(3)`: the extended `alloc_td` op, or NULL with errno EOPNOTSUPP when the
/// provider has none.
///
/// # Safety
/// `ctx` live; `init_attr` valid for the provider.
pub unsafe fn ibv_alloc_td(ctx: *mut ibv_context, init_attr: *mut ibv_td_init_attr) -> *mut ibv_td {
    match ctx_op!(ctx, alloc_td) {
        // SAFETY: provider op with the header's arguments.
        Some(op) => unsafe { op(ctx, init_attr) },
        None => {
            crate::set_errno(libc::EOPNOTSUPP);
            core::ptr::null_mut()
        }
    }
}

/// `ibv_dealloc_td(3)`: the extended `dealloc_td` op of `td->context`, or EOPNOTSUPP.
///
/// # Safety
/// `td` is a live thread domain.
pub unsafe fn ibv_dealloc_td(td: *mut ibv_td) -> c_int {
    // SAFETY: live td (caller).
    let ctx = unsafe { (*td).context };
    match ctx_op!(ctx, dealloc_td) {
        // SAFETY: provider op with the header's arguments.
        Some(op) => unsafe { op(td) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_alloc_parent_domain(3)`: the extended `alloc_parent_domain` op, or NULL with errno
/// EOPNOTSUPP.
///
/// # Safety
/// `ctx` live; `attr` valid.
pub unsafe fn ibv_alloc_parent_domain(
    ctx: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    match ctx_op!(ctx, alloc_parent_domain) {
        // SAFETY: provider op with the header's arguments.
        Some(op) => unsafe { op(ctx, attr) },
        None => {
            crate::set_errno(libc::EOPNOTSUPP);
            core::ptr::null_mut()
        }
    }
}

/// `ibv_query_rt_values_ex(3)`: the extended `query_rt_values` op, or EOPNOTSUPP.
///
/// # Safety
/// `ctx` live; `values` valid and writable.
pub unsafe fn ibv_query_rt_values_ex(ctx: *mut ibv_context, values: *mut ibv_values_ex) -> c_int {
    match ctx_op!(ctx, query_rt_values) {
        // SAFETY: provider op with the header's arguments.
        Some(op) => unsafe { op(ctx, values) },
        None => libc::EOPNOTSUPP,
    }
}
