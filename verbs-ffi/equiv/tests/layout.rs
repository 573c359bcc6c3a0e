//! The ABI layout verbs-ffi's generated types give every struct and field these tests (and
//! the hot path) touch equals what the C compiler computes from the installed
//! `infiniband/verbs.h`: `sizeof`, `_Alignof` and `offsetof` are exported by
//! `csrc/equiv.c` (`hv_c_layout`) and compared by name. This catches drift between the
//! committed bindings and the header a machine actually has.

use core::mem::{align_of, offset_of, size_of};

use hotverbs_ffi::mlx5dv::*;
use hotverbs_ffi::*;
use hotverbs_ffi_equiv::c::hv_c_layout;

/// The same names, computed by rustc from the generated types.
fn rust_layout() -> Vec<(&'static str, usize)> {
    vec![
        ("sizeof mlx5_wqe_ctrl_seg", size_of::<mlx5_wqe_ctrl_seg>()),
        (
            "mlx5_wqe_ctrl_seg.qpn_ds",
            offset_of!(mlx5_wqe_ctrl_seg, qpn_ds),
        ),
        (
            "mlx5_wqe_ctrl_seg.fm_ce_se",
            offset_of!(mlx5_wqe_ctrl_seg, fm_ce_se),
        ),
        ("mlx5_wqe_ctrl_seg.imm", offset_of!(mlx5_wqe_ctrl_seg, imm)),
        ("sizeof mlx5_wqe_raddr_seg", size_of::<mlx5_wqe_raddr_seg>()),
        (
            "mlx5_wqe_raddr_seg.rkey",
            offset_of!(mlx5_wqe_raddr_seg, rkey),
        ),
        (
            "sizeof mlx5_wqe_atomic_seg",
            size_of::<mlx5_wqe_atomic_seg>(),
        ),
        (
            "mlx5_wqe_atomic_seg.compare",
            offset_of!(mlx5_wqe_atomic_seg, compare),
        ),
        ("sizeof mlx5_wqe_data_seg", size_of::<mlx5_wqe_data_seg>()),
        (
            "mlx5_wqe_data_seg.lkey",
            offset_of!(mlx5_wqe_data_seg, lkey),
        ),
        (
            "mlx5_wqe_data_seg.addr",
            offset_of!(mlx5_wqe_data_seg, addr),
        ),
        ("sizeof mlx5_wqe_av", size_of::<mlx5_wqe_av>()),
        ("mlx5_wqe_av.dqp_dct", offset_of!(mlx5_wqe_av, dqp_dct)),
        (
            "sizeof mlx5_wqe_datagram_seg",
            size_of::<mlx5_wqe_datagram_seg>(),
        ),
        ("sizeof mlx5_cqe64", size_of::<mlx5_cqe64>()),
        ("mlx5_cqe64.byte_cnt", offset_of!(mlx5_cqe64, byte_cnt)),
        (
            "mlx5_cqe64.sop_drop_qpn",
            offset_of!(mlx5_cqe64, sop_drop_qpn),
        ),
        (
            "mlx5_cqe64.wqe_counter",
            offset_of!(mlx5_cqe64, wqe_counter),
        ),
        ("mlx5_cqe64.op_own", offset_of!(mlx5_cqe64, op_own)),
        ("sizeof mlx5_err_cqe", size_of::<mlx5_err_cqe>()),
        (
            "mlx5_err_cqe.vendor_err_synd",
            offset_of!(mlx5_err_cqe, vendor_err_synd),
        ),
        ("mlx5_err_cqe.syndrome", offset_of!(mlx5_err_cqe, syndrome)),
        ("sizeof mlx5dv_qp", size_of::<mlx5dv_qp>()),
        ("mlx5dv_qp.sq", offset_of!(mlx5dv_qp, sq)),
        ("mlx5dv_qp.bf", offset_of!(mlx5dv_qp, bf)),
        ("mlx5dv_qp.comp_mask", offset_of!(mlx5dv_qp, comp_mask)),
        ("mlx5dv_qp.sqn", offset_of!(mlx5dv_qp, sqn)),
        ("sizeof mlx5dv_cq", size_of::<mlx5dv_cq>()),
        ("mlx5dv_cq.cqe_cnt", offset_of!(mlx5dv_cq, cqe_cnt)),
        ("mlx5dv_cq.cqn", offset_of!(mlx5dv_cq, cqn)),
        ("sizeof mlx5dv_ah", size_of::<mlx5dv_ah>()),
        ("sizeof mlx5dv_obj", size_of::<mlx5dv_obj>()),
        ("mlx5dv_obj.cq", offset_of!(mlx5dv_obj, cq)),
        ("mlx5dv_obj.ah", offset_of!(mlx5dv_obj, ah)),
        ("sizeof ibv_sge", size_of::<ibv_sge>()),
        ("alignof ibv_sge", align_of::<ibv_sge>()),
        ("ibv_sge.addr", offset_of!(ibv_sge, addr)),
        ("ibv_sge.length", offset_of!(ibv_sge, length)),
        ("ibv_sge.lkey", offset_of!(ibv_sge, lkey)),
        ("sizeof ibv_send_wr", size_of::<ibv_send_wr>()),
        ("alignof ibv_send_wr", align_of::<ibv_send_wr>()),
        ("ibv_send_wr.wr_id", offset_of!(ibv_send_wr, wr_id)),
        ("ibv_send_wr.next", offset_of!(ibv_send_wr, next)),
        ("ibv_send_wr.sg_list", offset_of!(ibv_send_wr, sg_list)),
        ("ibv_send_wr.num_sge", offset_of!(ibv_send_wr, num_sge)),
        ("ibv_send_wr.opcode", offset_of!(ibv_send_wr, opcode)),
        (
            "ibv_send_wr.send_flags",
            offset_of!(ibv_send_wr, send_flags),
        ),
        (
            "ibv_send_wr.imm_data",
            offset_of!(ibv_send_wr, __bindgen_anon_1.imm_data),
        ),
        ("ibv_send_wr.wr", offset_of!(ibv_send_wr, wr)),
        (
            "ibv_send_wr.wr.rdma.remote_addr",
            offset_of!(ibv_send_wr, wr.rdma.remote_addr),
        ),
        (
            "ibv_send_wr.wr.rdma.rkey",
            offset_of!(ibv_send_wr, wr.rdma.rkey),
        ),
        (
            "ibv_send_wr.wr.atomic.remote_addr",
            offset_of!(ibv_send_wr, wr.atomic.remote_addr),
        ),
        (
            "ibv_send_wr.wr.atomic.compare_add",
            offset_of!(ibv_send_wr, wr.atomic.compare_add),
        ),
        (
            "ibv_send_wr.wr.atomic.swap",
            offset_of!(ibv_send_wr, wr.atomic.swap),
        ),
        (
            "ibv_send_wr.wr.atomic.rkey",
            offset_of!(ibv_send_wr, wr.atomic.rkey),
        ),
        ("ibv_send_wr.wr.ud.ah", offset_of!(ibv_send_wr, wr.ud.ah)),
        (
            "ibv_send_wr.wr.ud.remote_qpn",
            offset_of!(ibv_send_wr, wr.ud.remote_qpn),
        ),
        (
            "ibv_send_wr.wr.ud.remote_qkey",
            offset_of!(ibv_send_wr, wr.ud.remote_qkey),
        ),
        ("sizeof ibv_recv_wr", size_of::<ibv_recv_wr>()),
        ("alignof ibv_recv_wr", align_of::<ibv_recv_wr>()),
        ("ibv_recv_wr.wr_id", offset_of!(ibv_recv_wr, wr_id)),
        ("ibv_recv_wr.next", offset_of!(ibv_recv_wr, next)),
        ("ibv_recv_wr.sg_list", offset_of!(ibv_recv_wr, sg_list)),
        ("ibv_recv_wr.num_sge", offset_of!(ibv_recv_wr, num_sge)),
        ("sizeof ibv_wc", size_of::<ibv_wc>()),
        ("alignof ibv_wc", align_of::<ibv_wc>()),
        ("ibv_wc.wr_id", offset_of!(ibv_wc, wr_id)),
        ("ibv_wc.status", offset_of!(ibv_wc, status)),
        ("ibv_wc.opcode", offset_of!(ibv_wc, opcode)),
        ("ibv_wc.vendor_err", offset_of!(ibv_wc, vendor_err)),
        ("ibv_wc.byte_len", offset_of!(ibv_wc, byte_len)),
        (
            "ibv_wc.imm_data",
            offset_of!(ibv_wc, __bindgen_anon_1.imm_data),
        ),
        ("ibv_wc.qp_num", offset_of!(ibv_wc, qp_num)),
        ("ibv_wc.src_qp", offset_of!(ibv_wc, src_qp)),
        ("ibv_wc.wc_flags", offset_of!(ibv_wc, wc_flags)),
        ("ibv_wc.pkey_index", offset_of!(ibv_wc, pkey_index)),
        ("ibv_wc.slid", offset_of!(ibv_wc, slid)),
        ("ibv_wc.sl", offset_of!(ibv_wc, sl)),
        ("ibv_wc.dlid_path_bits", offset_of!(ibv_wc, dlid_path_bits)),
        ("sizeof ibv_context", size_of::<ibv_context>()),
        ("alignof ibv_context", align_of::<ibv_context>()),
        ("ibv_context.device", offset_of!(ibv_context, device)),
        ("ibv_context.ops", offset_of!(ibv_context, ops)),
        ("ibv_context.cmd_fd", offset_of!(ibv_context, cmd_fd)),
        ("ibv_context.async_fd", offset_of!(ibv_context, async_fd)),
        (
            "ibv_context.num_comp_vectors",
            offset_of!(ibv_context, num_comp_vectors),
        ),
        (
            "ibv_context.abi_compat",
            offset_of!(ibv_context, abi_compat),
        ),
        ("sizeof ibv_context_ops", size_of::<ibv_context_ops>()),
        ("alignof ibv_context_ops", align_of::<ibv_context_ops>()),
        (
            "ibv_context_ops.poll_cq",
            offset_of!(ibv_context_ops, poll_cq),
        ),
        (
            "ibv_context_ops.req_notify_cq",
            offset_of!(ibv_context_ops, req_notify_cq),
        ),
        (
            "ibv_context_ops.post_srq_recv",
            offset_of!(ibv_context_ops, post_srq_recv),
        ),
        (
            "ibv_context_ops.post_send",
            offset_of!(ibv_context_ops, post_send),
        ),
        (
            "ibv_context_ops.post_recv",
            offset_of!(ibv_context_ops, post_recv),
        ),
        ("sizeof verbs_context", size_of::<verbs_context>()),
        ("alignof verbs_context", align_of::<verbs_context>()),
        (
            "verbs_context.query_port",
            offset_of!(verbs_context, query_port),
        ),
        (
            "verbs_context.create_cq_ex",
            offset_of!(verbs_context, create_cq_ex),
        ),
        (
            "verbs_context.alloc_td",
            offset_of!(verbs_context, alloc_td),
        ),
        (
            "verbs_context.dealloc_td",
            offset_of!(verbs_context, dealloc_td),
        ),
        (
            "verbs_context.alloc_parent_domain",
            offset_of!(verbs_context, alloc_parent_domain),
        ),
        (
            "verbs_context.query_rt_values",
            offset_of!(verbs_context, query_rt_values),
        ),
        (
            "verbs_context.query_device_ex",
            offset_of!(verbs_context, query_device_ex),
        ),
        (
            "verbs_context.create_qp_ex",
            offset_of!(verbs_context, create_qp_ex),
        ),
        (
            "verbs_context.create_srq_ex",
            offset_of!(verbs_context, create_srq_ex),
        ),
        ("verbs_context.sz", offset_of!(verbs_context, sz)),
        ("verbs_context.context", offset_of!(verbs_context, context)),
        ("sizeof ibv_qp", size_of::<ibv_qp>()),
        ("alignof ibv_qp", align_of::<ibv_qp>()),
        ("ibv_qp.context", offset_of!(ibv_qp, context)),
        ("ibv_qp.qp_context", offset_of!(ibv_qp, qp_context)),
        ("ibv_qp.pd", offset_of!(ibv_qp, pd)),
        ("ibv_qp.send_cq", offset_of!(ibv_qp, send_cq)),
        ("ibv_qp.recv_cq", offset_of!(ibv_qp, recv_cq)),
        ("ibv_qp.srq", offset_of!(ibv_qp, srq)),
        ("ibv_qp.handle", offset_of!(ibv_qp, handle)),
        ("ibv_qp.qp_num", offset_of!(ibv_qp, qp_num)),
        ("ibv_qp.state", offset_of!(ibv_qp, state)),
        ("ibv_qp.qp_type", offset_of!(ibv_qp, qp_type)),
        (
            "ibv_qp.events_completed",
            offset_of!(ibv_qp, events_completed),
        ),
        ("sizeof ibv_qp_ex", size_of::<ibv_qp_ex>()),
        ("alignof ibv_qp_ex", align_of::<ibv_qp_ex>()),
        ("ibv_qp_ex.qp_base", offset_of!(ibv_qp_ex, qp_base)),
        ("ibv_qp_ex.comp_mask", offset_of!(ibv_qp_ex, comp_mask)),
        ("ibv_qp_ex.wr_id", offset_of!(ibv_qp_ex, wr_id)),
        ("ibv_qp_ex.wr_flags", offset_of!(ibv_qp_ex, wr_flags)),
        (
            "ibv_qp_ex.wr_atomic_cmp_swp",
            offset_of!(ibv_qp_ex, wr_atomic_cmp_swp),
        ),
        (
            "ibv_qp_ex.wr_atomic_fetch_add",
            offset_of!(ibv_qp_ex, wr_atomic_fetch_add),
        ),
        ("ibv_qp_ex.wr_bind_mw", offset_of!(ibv_qp_ex, wr_bind_mw)),
        (
            "ibv_qp_ex.wr_local_inv",
            offset_of!(ibv_qp_ex, wr_local_inv),
        ),
        (
            "ibv_qp_ex.wr_rdma_read",
            offset_of!(ibv_qp_ex, wr_rdma_read),
        ),
        (
            "ibv_qp_ex.wr_rdma_write",
            offset_of!(ibv_qp_ex, wr_rdma_write),
        ),
        (
            "ibv_qp_ex.wr_rdma_write_imm",
            offset_of!(ibv_qp_ex, wr_rdma_write_imm),
        ),
        ("ibv_qp_ex.wr_send", offset_of!(ibv_qp_ex, wr_send)),
        ("ibv_qp_ex.wr_send_imm", offset_of!(ibv_qp_ex, wr_send_imm)),
        ("ibv_qp_ex.wr_send_inv", offset_of!(ibv_qp_ex, wr_send_inv)),
        ("ibv_qp_ex.wr_send_tso", offset_of!(ibv_qp_ex, wr_send_tso)),
        (
            "ibv_qp_ex.wr_set_ud_addr",
            offset_of!(ibv_qp_ex, wr_set_ud_addr),
        ),
        (
            "ibv_qp_ex.wr_set_xrc_srqn",
            offset_of!(ibv_qp_ex, wr_set_xrc_srqn),
        ),
        (
            "ibv_qp_ex.wr_set_inline_data",
            offset_of!(ibv_qp_ex, wr_set_inline_data),
        ),
        (
            "ibv_qp_ex.wr_set_inline_data_list",
            offset_of!(ibv_qp_ex, wr_set_inline_data_list),
        ),
        ("ibv_qp_ex.wr_set_sge", offset_of!(ibv_qp_ex, wr_set_sge)),
        (
            "ibv_qp_ex.wr_set_sge_list",
            offset_of!(ibv_qp_ex, wr_set_sge_list),
        ),
        ("ibv_qp_ex.wr_start", offset_of!(ibv_qp_ex, wr_start)),
        ("ibv_qp_ex.wr_complete", offset_of!(ibv_qp_ex, wr_complete)),
        ("ibv_qp_ex.wr_abort", offset_of!(ibv_qp_ex, wr_abort)),
        (
            "ibv_qp_ex.wr_atomic_write",
            offset_of!(ibv_qp_ex, wr_atomic_write),
        ),
        ("sizeof ibv_cq", size_of::<ibv_cq>()),
        ("alignof ibv_cq", align_of::<ibv_cq>()),
        ("ibv_cq.context", offset_of!(ibv_cq, context)),
        ("ibv_cq.channel", offset_of!(ibv_cq, channel)),
        ("ibv_cq.cq_context", offset_of!(ibv_cq, cq_context)),
        ("ibv_cq.handle", offset_of!(ibv_cq, handle)),
        ("ibv_cq.cqe", offset_of!(ibv_cq, cqe)),
        (
            "ibv_cq.comp_events_completed",
            offset_of!(ibv_cq, comp_events_completed),
        ),
        (
            "ibv_cq.async_events_completed",
            offset_of!(ibv_cq, async_events_completed),
        ),
        ("sizeof ibv_cq_ex", size_of::<ibv_cq_ex>()),
        ("alignof ibv_cq_ex", align_of::<ibv_cq_ex>()),
        ("ibv_cq_ex.context", offset_of!(ibv_cq_ex, context)),
        ("ibv_cq_ex.cqe", offset_of!(ibv_cq_ex, cqe)),
        ("ibv_cq_ex.comp_mask", offset_of!(ibv_cq_ex, comp_mask)),
        ("ibv_cq_ex.status", offset_of!(ibv_cq_ex, status)),
        ("ibv_cq_ex.wr_id", offset_of!(ibv_cq_ex, wr_id)),
        ("ibv_cq_ex.start_poll", offset_of!(ibv_cq_ex, start_poll)),
        ("ibv_cq_ex.next_poll", offset_of!(ibv_cq_ex, next_poll)),
        ("ibv_cq_ex.end_poll", offset_of!(ibv_cq_ex, end_poll)),
        ("ibv_cq_ex.read_opcode", offset_of!(ibv_cq_ex, read_opcode)),
        (
            "ibv_cq_ex.read_vendor_err",
            offset_of!(ibv_cq_ex, read_vendor_err),
        ),
        (
            "ibv_cq_ex.read_byte_len",
            offset_of!(ibv_cq_ex, read_byte_len),
        ),
        (
            "ibv_cq_ex.read_imm_data",
            offset_of!(ibv_cq_ex, read_imm_data),
        ),
        ("ibv_cq_ex.read_qp_num", offset_of!(ibv_cq_ex, read_qp_num)),
        ("ibv_cq_ex.read_src_qp", offset_of!(ibv_cq_ex, read_src_qp)),
        (
            "ibv_cq_ex.read_wc_flags",
            offset_of!(ibv_cq_ex, read_wc_flags),
        ),
        ("ibv_cq_ex.read_slid", offset_of!(ibv_cq_ex, read_slid)),
        ("ibv_cq_ex.read_sl", offset_of!(ibv_cq_ex, read_sl)),
        (
            "ibv_cq_ex.read_dlid_path_bits",
            offset_of!(ibv_cq_ex, read_dlid_path_bits),
        ),
        (
            "ibv_cq_ex.read_completion_ts",
            offset_of!(ibv_cq_ex, read_completion_ts),
        ),
        ("ibv_cq_ex.read_cvlan", offset_of!(ibv_cq_ex, read_cvlan)),
        (
            "ibv_cq_ex.read_flow_tag",
            offset_of!(ibv_cq_ex, read_flow_tag),
        ),
        (
            "ibv_cq_ex.read_tm_info",
            offset_of!(ibv_cq_ex, read_tm_info),
        ),
        (
            "ibv_cq_ex.read_completion_wallclock_ns",
            offset_of!(ibv_cq_ex, read_completion_wallclock_ns),
        ),
        ("sizeof ibv_srq", size_of::<ibv_srq>()),
        ("alignof ibv_srq", align_of::<ibv_srq>()),
        ("ibv_srq.context", offset_of!(ibv_srq, context)),
        ("ibv_srq.srq_context", offset_of!(ibv_srq, srq_context)),
        ("ibv_srq.pd", offset_of!(ibv_srq, pd)),
        ("ibv_srq.handle", offset_of!(ibv_srq, handle)),
        (
            "ibv_srq.events_completed",
            offset_of!(ibv_srq, events_completed),
        ),
        ("sizeof ibv_port_attr", size_of::<ibv_port_attr>()),
        ("alignof ibv_port_attr", align_of::<ibv_port_attr>()),
        ("ibv_port_attr.state", offset_of!(ibv_port_attr, state)),
        ("ibv_port_attr.max_mtu", offset_of!(ibv_port_attr, max_mtu)),
        (
            "ibv_port_attr.active_mtu",
            offset_of!(ibv_port_attr, active_mtu),
        ),
        (
            "ibv_port_attr.gid_tbl_len",
            offset_of!(ibv_port_attr, gid_tbl_len),
        ),
        (
            "ibv_port_attr.port_cap_flags",
            offset_of!(ibv_port_attr, port_cap_flags),
        ),
        ("ibv_port_attr.lid", offset_of!(ibv_port_attr, lid)),
        ("ibv_port_attr.sm_lid", offset_of!(ibv_port_attr, sm_lid)),
        (
            "ibv_port_attr.link_layer",
            offset_of!(ibv_port_attr, link_layer),
        ),
        ("ibv_port_attr.flags", offset_of!(ibv_port_attr, flags)),
        (
            "ibv_port_attr.port_cap_flags2",
            offset_of!(ibv_port_attr, port_cap_flags2),
        ),
        (
            "ibv_port_attr.active_speed",
            offset_of!(ibv_port_attr, active_speed),
        ),
        ("sizeof ibv_device_attr", size_of::<ibv_device_attr>()),
        ("alignof ibv_device_attr", align_of::<ibv_device_attr>()),
        (
            "ibv_device_attr.max_qp",
            offset_of!(ibv_device_attr, max_qp),
        ),
        (
            "ibv_device_attr.max_sge",
            offset_of!(ibv_device_attr, max_sge),
        ),
        ("sizeof ibv_device_attr_ex", size_of::<ibv_device_attr_ex>()),
        (
            "alignof ibv_device_attr_ex",
            align_of::<ibv_device_attr_ex>(),
        ),
        (
            "ibv_device_attr_ex.orig_attr",
            offset_of!(ibv_device_attr_ex, orig_attr),
        ),
        (
            "ibv_device_attr_ex.comp_mask",
            offset_of!(ibv_device_attr_ex, comp_mask),
        ),
        (
            "ibv_device_attr_ex.max_dm_size",
            offset_of!(ibv_device_attr_ex, max_dm_size),
        ),
        (
            "sizeof ibv_query_device_ex_input",
            size_of::<ibv_query_device_ex_input>(),
        ),
        (
            "alignof ibv_query_device_ex_input",
            align_of::<ibv_query_device_ex_input>(),
        ),
        (
            "ibv_query_device_ex_input.comp_mask",
            offset_of!(ibv_query_device_ex_input, comp_mask),
        ),
        ("sizeof ibv_qp_init_attr", size_of::<ibv_qp_init_attr>()),
        ("alignof ibv_qp_init_attr", align_of::<ibv_qp_init_attr>()),
        (
            "ibv_qp_init_attr.qp_context",
            offset_of!(ibv_qp_init_attr, qp_context),
        ),
        (
            "ibv_qp_init_attr.send_cq",
            offset_of!(ibv_qp_init_attr, send_cq),
        ),
        (
            "ibv_qp_init_attr.recv_cq",
            offset_of!(ibv_qp_init_attr, recv_cq),
        ),
        ("ibv_qp_init_attr.srq", offset_of!(ibv_qp_init_attr, srq)),
        ("ibv_qp_init_attr.cap", offset_of!(ibv_qp_init_attr, cap)),
        (
            "ibv_qp_init_attr.qp_type",
            offset_of!(ibv_qp_init_attr, qp_type),
        ),
        (
            "ibv_qp_init_attr.sq_sig_all",
            offset_of!(ibv_qp_init_attr, sq_sig_all),
        ),
        (
            "sizeof ibv_qp_init_attr_ex",
            size_of::<ibv_qp_init_attr_ex>(),
        ),
        (
            "alignof ibv_qp_init_attr_ex",
            align_of::<ibv_qp_init_attr_ex>(),
        ),
        (
            "ibv_qp_init_attr_ex.qp_context",
            offset_of!(ibv_qp_init_attr_ex, qp_context),
        ),
        (
            "ibv_qp_init_attr_ex.send_cq",
            offset_of!(ibv_qp_init_attr_ex, send_cq),
        ),
        (
            "ibv_qp_init_attr_ex.recv_cq",
            offset_of!(ibv_qp_init_attr_ex, recv_cq),
        ),
        (
            "ibv_qp_init_attr_ex.srq",
            offset_of!(ibv_qp_init_attr_ex, srq),
        ),
        (
            "ibv_qp_init_attr_ex.cap",
            offset_of!(ibv_qp_init_attr_ex, cap),
        ),
        (
            "ibv_qp_init_attr_ex.qp_type",
            offset_of!(ibv_qp_init_attr_ex, qp_type),
        ),
        (
            "ibv_qp_init_attr_ex.sq_sig_all",
            offset_of!(ibv_qp_init_attr_ex, sq_sig_all),
        ),
        (
            "ibv_qp_init_attr_ex.comp_mask",
            offset_of!(ibv_qp_init_attr_ex, comp_mask),
        ),
        (
            "ibv_qp_init_attr_ex.pd",
            offset_of!(ibv_qp_init_attr_ex, pd),
        ),
        (
            "ibv_qp_init_attr_ex.send_ops_flags",
            offset_of!(ibv_qp_init_attr_ex, send_ops_flags),
        ),
        ("sizeof ibv_srq_init_attr", size_of::<ibv_srq_init_attr>()),
        ("alignof ibv_srq_init_attr", align_of::<ibv_srq_init_attr>()),
        (
            "ibv_srq_init_attr.srq_context",
            offset_of!(ibv_srq_init_attr, srq_context),
        ),
        (
            "ibv_srq_init_attr.attr",
            offset_of!(ibv_srq_init_attr, attr),
        ),
        (
            "sizeof ibv_srq_init_attr_ex",
            size_of::<ibv_srq_init_attr_ex>(),
        ),
        (
            "alignof ibv_srq_init_attr_ex",
            align_of::<ibv_srq_init_attr_ex>(),
        ),
        (
            "ibv_srq_init_attr_ex.srq_context",
            offset_of!(ibv_srq_init_attr_ex, srq_context),
        ),
        (
            "ibv_srq_init_attr_ex.attr",
            offset_of!(ibv_srq_init_attr_ex, attr),
        ),
        (
            "ibv_srq_init_attr_ex.comp_mask",
            offset_of!(ibv_srq_init_attr_ex, comp_mask),
        ),
        (
            "ibv_srq_init_attr_ex.srq_type",
            offset_of!(ibv_srq_init_attr_ex, srq_type),
        ),
        (
            "ibv_srq_init_attr_ex.pd",
            offset_of!(ibv_srq_init_attr_ex, pd),
        ),
        (
            "ibv_srq_init_attr_ex.xrcd",
            offset_of!(ibv_srq_init_attr_ex, xrcd),
        ),
        (
            "ibv_srq_init_attr_ex.cq",
            offset_of!(ibv_srq_init_attr_ex, cq),
        ),
        (
            "sizeof ibv_cq_init_attr_ex",
            size_of::<ibv_cq_init_attr_ex>(),
        ),
        (
            "alignof ibv_cq_init_attr_ex",
            align_of::<ibv_cq_init_attr_ex>(),
        ),
        (
            "ibv_cq_init_attr_ex.cqe",
            offset_of!(ibv_cq_init_attr_ex, cqe),
        ),
        (
            "ibv_cq_init_attr_ex.cq_context",
            offset_of!(ibv_cq_init_attr_ex, cq_context),
        ),
        (
            "ibv_cq_init_attr_ex.channel",
            offset_of!(ibv_cq_init_attr_ex, channel),
        ),
        (
            "ibv_cq_init_attr_ex.comp_vector",
            offset_of!(ibv_cq_init_attr_ex, comp_vector),
        ),
        (
            "ibv_cq_init_attr_ex.wc_flags",
            offset_of!(ibv_cq_init_attr_ex, wc_flags),
        ),
        (
            "ibv_cq_init_attr_ex.comp_mask",
            offset_of!(ibv_cq_init_attr_ex, comp_mask),
        ),
        (
            "ibv_cq_init_attr_ex.flags",
            offset_of!(ibv_cq_init_attr_ex, flags),
        ),
        ("sizeof ibv_gid_entry", size_of::<ibv_gid_entry>()),
        ("alignof ibv_gid_entry", align_of::<ibv_gid_entry>()),
        ("ibv_gid_entry.gid", offset_of!(ibv_gid_entry, gid)),
        (
            "ibv_gid_entry.gid_index",
            offset_of!(ibv_gid_entry, gid_index),
        ),
        (
            "ibv_gid_entry.port_num",
            offset_of!(ibv_gid_entry, port_num),
        ),
        (
            "ibv_gid_entry.gid_type",
            offset_of!(ibv_gid_entry, gid_type),
        ),
        (
            "ibv_gid_entry.ndev_ifindex",
            offset_of!(ibv_gid_entry, ndev_ifindex),
        ),
        ("sizeof ibv_data_buf", size_of::<ibv_data_buf>()),
        ("alignof ibv_data_buf", align_of::<ibv_data_buf>()),
        ("ibv_data_buf.addr", offset_of!(ibv_data_buf, addr)),
        ("ibv_data_buf.length", offset_of!(ibv_data_buf, length)),
        ("sizeof ibv_poll_cq_attr", size_of::<ibv_poll_cq_attr>()),
        ("alignof ibv_poll_cq_attr", align_of::<ibv_poll_cq_attr>()),
        (
            "ibv_poll_cq_attr.comp_mask",
            offset_of!(ibv_poll_cq_attr, comp_mask),
        ),
        ("sizeof ibv_mw_bind_info", size_of::<ibv_mw_bind_info>()),
        ("alignof ibv_mw_bind_info", align_of::<ibv_mw_bind_info>()),
        ("ibv_mw_bind_info.mr", offset_of!(ibv_mw_bind_info, mr)),
        ("ibv_mw_bind_info.addr", offset_of!(ibv_mw_bind_info, addr)),
        (
            "ibv_mw_bind_info.length",
            offset_of!(ibv_mw_bind_info, length),
        ),
        (
            "ibv_mw_bind_info.mw_access_flags",
            offset_of!(ibv_mw_bind_info, mw_access_flags),
        ),
    ]
}

#[test]
fn generated_layout_matches_the_c_compiler() {
    let mut len = 0usize;
    // SAFETY: hv_c_layout writes the length and returns a static array of that length.
    let table = unsafe { core::slice::from_raw_parts(hv_c_layout(&mut len), len) };
    let c: Vec<(String, usize)> = table
        .iter()
        .map(|e| {
            // SAFETY: every name is a static NUL-terminated C string literal.
            let name = unsafe { core::ffi::CStr::from_ptr(e.name) };
            (name.to_str().expect("ASCII name").to_owned(), e.value)
        })
        .collect();
    let rust = rust_layout();
    assert!(
        c.len() > 200,
        "the C table is the full list ({} entries)",
        c.len()
    );
    assert_eq!(
        c.len(),
        rust.len(),
        "the C and Rust lists name the same entries"
    );
    let mut mismatches = Vec::new();
    for ((c_name, c_value), (r_name, r_value)) in c.iter().zip(&rust) {
        assert_eq!(c_name, r_name, "the lists are in the same order");
        if c_value != r_value {
            mismatches.push(format!("{c_name}: C {c_value}, Rust {r_value}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "layout differs:\n{}",
        mismatches.join("\n")
    );
}
