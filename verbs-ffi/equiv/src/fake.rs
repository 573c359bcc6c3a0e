//! A fake device made of real ABI structs, wired to the [`record`](crate::record) provider:
//! a `verbs_context` (so `ibv_context` is its last member, as libibverbs lays it out),
//! an `ibv_qp`, `ibv_srq`, `ibv_cq`, and an `ibv_qp_ex` / `ibv_cq_ex`, all zeroed first and
//! pointing at the context.

use core::mem::{offset_of, size_of};
use core::ptr;

use hotverbs_ffi::*;

use crate::record as r;

/// Allocates a zeroed `T` on the heap and leaks it as a raw pointer (freed by [`Device`]).
///
/// # Safety
/// All-zero bytes must be a valid `T` (true of the verbs ABI structs: integers, raw
/// pointers, `Option<fn>` and C unions/pthread objects only).
unsafe fn alloc_zeroed<T>() -> *mut T {
    // SAFETY: caller guarantees zero is a valid T.
    Box::into_raw(Box::new(unsafe { core::mem::zeroed::<T>() }))
}

/// The fake device. Every pointer stays valid until the `Device` is dropped.
pub struct Device {
    /// The extended context around [`ctx`](Self::ctx).
    pub vctx: *mut verbs_context,
    /// `&vctx.context`: what the inlines receive.
    pub ctx: *mut ibv_context,
    /// A QP on `ctx` (`qp_num` 0x1234).
    pub qp: *mut ibv_qp,
    /// An SRQ on `ctx`.
    pub srq: *mut ibv_srq,
    /// A CQ on `ctx`.
    pub cq: *mut ibv_cq,
    /// An extended QP on `ctx` with every `wr_*` slot recording.
    pub qpx: *mut ibv_qp_ex,
    /// An extended CQ on `ctx` with every poll/read slot recording.
    pub cqx: *mut ibv_cq_ex,
    /// A thread domain on `ctx` (what `ibv_dealloc_td` is given).
    pub td: *mut ibv_td,
}

/// `sizeof(struct verbs_context) - offsetof(struct verbs_context, op)`: the smallest `sz`
/// for which the header's `verbs_get_ctx_op` considers `op` present.
#[macro_export]
macro_rules! min_sz {
    ($op:ident) => {
        core::mem::size_of::<hotverbs_ffi::verbs_context>()
            - core::mem::offset_of!(hotverbs_ffi::verbs_context, $op)
    };
}

impl Device {
    /// An extended context (`abi_compat` = `__VERBS_ABI_IS_EXTENDED`, `sz` = the whole
    /// `verbs_context`) with every hot `ops` slot and the `query_port`, `query_device_ex`,
    /// `create_qp_ex`, `create_srq_ex`, `create_cq_ex`, `alloc_td`, `dealloc_td`,
    /// `alloc_parent_domain`, `query_rt_values` extended ops recording.
    ///
    /// Also resets this thread's recording state (log, [`set_ret`](r::set_ret)
    /// overrides, [`forward_exports_to`](r::forward_exports_to)), so each test starts clean whatever thread the harness runs it on.
    pub fn new() -> Self {
        r::reset_rets();
        r::forward_exports_to(None);
        drop(r::take());
        // SAFETY: all-zero is valid for these plain C structs (see alloc_zeroed).
        let (vctx, qp, srq, cq, qpx, cqx, td) = unsafe {
            (
                alloc_zeroed::<verbs_context>(),
                alloc_zeroed::<ibv_qp>(),
                alloc_zeroed::<ibv_srq>(),
                alloc_zeroed::<ibv_cq>(),
                alloc_zeroed::<ibv_qp_ex>(),
                alloc_zeroed::<ibv_cq_ex>(),
                alloc_zeroed::<ibv_td>(),
            )
        };
        // SAFETY: vctx was just allocated; `context` is a field inside it.
        let ctx = unsafe { ptr::addr_of_mut!((*vctx).context) };
        // SAFETY: every pointer was just allocated by us and is exclusively ours.
        unsafe {
            (*vctx).sz = size_of::<verbs_context>();
            (*vctx).query_port = Some(r::vctx_query_port);
            (*vctx).query_device_ex = Some(r::vctx_query_device_ex);
            (*vctx).create_qp_ex = Some(r::vctx_create_qp_ex);
            (*vctx).create_srq_ex = Some(r::vctx_create_srq_ex);
            (*vctx).create_cq_ex = Some(r::vctx_create_cq_ex);
            (*vctx).alloc_td = Some(r::vctx_alloc_td);
            (*vctx).dealloc_td = Some(r::vctx_dealloc_td);
            (*vctx).alloc_parent_domain = Some(r::vctx_alloc_parent_domain);
            (*vctx).query_rt_values = Some(r::vctx_query_rt_values);
            (*td).context = ctx;
            (*ctx).abi_compat = VERBS_ABI_IS_EXTENDED;
            (*ctx).num_comp_vectors = 1;
            let ops = &mut (*ctx).ops;
            ops.post_send = Some(r::post_send);
            ops.post_recv = Some(r::post_recv);
            ops.post_srq_recv = Some(r::post_srq_recv);
            ops.poll_cq = Some(r::poll_cq);
            ops.req_notify_cq = Some(r::req_notify_cq);

            (*qp).context = ctx;
            (*qp).qp_num = 0x1234;
            (*qp).qp_type = IBV_QPT_RC;
            (*qp).send_cq = cq;
            (*qp).recv_cq = cq;
            (*srq).context = ctx;
            (*cq).context = ctx;
            (*cq).cqe = 64;

            (*qpx).qp_base.context = ctx;
            (*qpx).qp_base.qp_num = 0x5678;
            (*qpx).wr_start = Some(r::wr_start);
            (*qpx).wr_complete = Some(r::wr_complete);
            (*qpx).wr_abort = Some(r::wr_abort);
            (*qpx).wr_send = Some(r::wr_send);
            (*qpx).wr_send_imm = Some(r::wr_send_imm);
            (*qpx).wr_send_inv = Some(r::wr_send_inv);
            (*qpx).wr_send_tso = Some(r::wr_send_tso);
            (*qpx).wr_rdma_write = Some(r::wr_rdma_write);
            (*qpx).wr_rdma_write_imm = Some(r::wr_rdma_write_imm);
            (*qpx).wr_rdma_read = Some(r::wr_rdma_read);
            (*qpx).wr_atomic_cmp_swp = Some(r::wr_atomic_cmp_swp);
            (*qpx).wr_atomic_fetch_add = Some(r::wr_atomic_fetch_add);
            (*qpx).wr_atomic_write = Some(r::wr_atomic_write);
            (*qpx).wr_bind_mw = Some(r::wr_bind_mw);
            (*qpx).wr_local_inv = Some(r::wr_local_inv);
            (*qpx).wr_set_sge = Some(r::wr_set_sge);
            (*qpx).wr_set_sge_list = Some(r::wr_set_sge_list);
            (*qpx).wr_set_inline_data = Some(r::wr_set_inline_data);
            (*qpx).wr_set_inline_data_list = Some(r::wr_set_inline_data_list);
            (*qpx).wr_set_ud_addr = Some(r::wr_set_ud_addr);
            (*qpx).wr_set_xrc_srqn = Some(r::wr_set_xrc_srqn);

            (*cqx).context = ctx;
            (*cqx).cqe = 64;
            (*cqx).start_poll = Some(r::start_poll);
            (*cqx).next_poll = Some(r::next_poll);
            (*cqx).end_poll = Some(r::end_poll);
            (*cqx).read_opcode = Some(r::read_opcode);
            (*cqx).read_vendor_err = Some(r::read_vendor_err);
            (*cqx).read_byte_len = Some(r::read_byte_len);
            (*cqx).read_imm_data = Some(r::read_imm_data);
            (*cqx).read_qp_num = Some(r::read_qp_num);
            (*cqx).read_src_qp = Some(r::read_src_qp);
            (*cqx).read_wc_flags = Some(r::read_wc_flags);
            (*cqx).read_slid = Some(r::read_slid);
            (*cqx).read_sl = Some(r::read_sl);
            (*cqx).read_dlid_path_bits = Some(r::read_dlid_path_bits);
            (*cqx).read_completion_ts = Some(r::read_completion_ts);
            (*cqx).read_completion_wallclock_ns = Some(r::read_completion_wallclock_ns);
            (*cqx).read_cvlan = Some(r::read_cvlan);
            (*cqx).read_flow_tag = Some(r::read_flow_tag);
            (*cqx).read_tm_info = Some(r::read_tm_info);
        }
        Device {
            vctx,
            ctx,
            qp,
            srq,
            cq,
            qpx,
            cqx,
            td,
        }
    }

    /// Makes the context a legacy one (`abi_compat` not `__VERBS_ABI_IS_EXTENDED`), as a
    /// pre-verbs_context provider leaves it; the extended ops stay set but must be ignored.
    pub fn make_legacy(&mut self) {
        // SAFETY: ctx is live and ours.
        unsafe { (*self.ctx).abi_compat = ptr::null_mut() };
    }

    /// Sets `verbs_context.sz` (how many bytes before `context` the provider filled).
    pub fn set_sz(&mut self, sz: usize) {
        // SAFETY: vctx is live and ours.
        unsafe { (*self.vctx).sz = sz };
    }

    /// Clears the extended ops (a provider with a `verbs_context` but none of these ops).
    pub fn clear_ext_ops(&mut self) {
        // SAFETY: vctx is live and ours.
        unsafe {
            (*self.vctx).query_port = None;
            (*self.vctx).query_device_ex = None;
            (*self.vctx).create_qp_ex = None;
            (*self.vctx).create_srq_ex = None;
            (*self.vctx).create_cq_ex = None;
            (*self.vctx).alloc_td = None;
            (*self.vctx).dealloc_td = None;
            (*self.vctx).alloc_parent_domain = None;
            (*self.vctx).query_rt_values = None;
        }
    }

    /// The `sz` values worth trying for an op whose [`min_sz!`](crate::min_sz) is `min`:
    /// the full struct, exactly the minimum that covers the op, one byte short, and 0.
    pub fn sz_cases(min: usize) -> [usize; 4] {
        [size_of::<verbs_context>(), min, min - 1, 0]
    }
}

impl Default for Device {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: each pointer came from Box::into_raw in `new` and is freed once here.
        unsafe {
            drop(Box::from_raw(self.vctx));
            drop(Box::from_raw(self.qp));
            drop(Box::from_raw(self.srq));
            drop(Box::from_raw(self.cq));
            drop(Box::from_raw(self.qpx));
            drop(Box::from_raw(self.cqx));
            drop(Box::from_raw(self.td));
        }
    }
}

// The header's container_of must land on our allocation: `context` is the last field.
const _: () = assert!(
    offset_of!(verbs_context, context) + size_of::<ibv_context>() == size_of::<verbs_context>()
);
