//! Compile-time layout checks of everything the hot path touches (x86_64 / aarch64 LP64).
//! A provider and our inline verbs must agree on these bytes; bindgen's own layout tests
//! are off (they bloat the output), these are the ones we rely on.

use core::mem::{align_of, offset_of, size_of};

use crate::generated::types::*;
use static_assertions::const_assert_eq;

const_assert_eq!(size_of::<ibv_sge>(), 16);
const_assert_eq!(align_of::<ibv_sge>(), 8);
const_assert_eq!(offset_of!(ibv_sge, addr), 0);
const_assert_eq!(offset_of!(ibv_sge, length), 8);
const_assert_eq!(offset_of!(ibv_sge, lkey), 12);

const_assert_eq!(size_of::<ibv_send_wr>(), 128);
const_assert_eq!(align_of::<ibv_send_wr>(), 8);
const_assert_eq!(offset_of!(ibv_send_wr, wr_id), 0);
const_assert_eq!(offset_of!(ibv_send_wr, next), 8);
const_assert_eq!(offset_of!(ibv_send_wr, sg_list), 16);
const_assert_eq!(offset_of!(ibv_send_wr, num_sge), 24);
const_assert_eq!(offset_of!(ibv_send_wr, opcode), 28);
const_assert_eq!(offset_of!(ibv_send_wr, send_flags), 32);
const_assert_eq!(offset_of!(ibv_send_wr, __bindgen_anon_1), 36); // imm_data
const_assert_eq!(offset_of!(ibv_send_wr, wr), 40); // rdma / atomic / ud
const_assert_eq!(offset_of!(ibv_send_wr__bindgen_ty_2__bindgen_ty_1, rkey), 8);
const_assert_eq!(
    offset_of!(ibv_send_wr__bindgen_ty_2__bindgen_ty_2, compare_add),
    8
);
const_assert_eq!(
    offset_of!(ibv_send_wr__bindgen_ty_2__bindgen_ty_2, swap),
    16
);
const_assert_eq!(
    offset_of!(ibv_send_wr__bindgen_ty_2__bindgen_ty_2, rkey),
    24
);
const_assert_eq!(
    offset_of!(ibv_send_wr__bindgen_ty_2__bindgen_ty_3, remote_qpn),
    8
);
const_assert_eq!(
    offset_of!(ibv_send_wr__bindgen_ty_2__bindgen_ty_3, remote_qkey),
    12
);

const_assert_eq!(size_of::<ibv_recv_wr>(), 32);
const_assert_eq!(offset_of!(ibv_recv_wr, wr_id), 0);
const_assert_eq!(offset_of!(ibv_recv_wr, next), 8);
const_assert_eq!(offset_of!(ibv_recv_wr, sg_list), 16);
const_assert_eq!(offset_of!(ibv_recv_wr, num_sge), 24);

const_assert_eq!(size_of::<ibv_wc>(), 48);
const_assert_eq!(offset_of!(ibv_wc, wr_id), 0);
const_assert_eq!(offset_of!(ibv_wc, status), 8);
const_assert_eq!(offset_of!(ibv_wc, opcode), 12);
const_assert_eq!(offset_of!(ibv_wc, vendor_err), 16);
const_assert_eq!(offset_of!(ibv_wc, byte_len), 20);
const_assert_eq!(offset_of!(ibv_wc, __bindgen_anon_1), 24); // imm_data
const_assert_eq!(offset_of!(ibv_wc, qp_num), 28);
const_assert_eq!(offset_of!(ibv_wc, src_qp), 32);
const_assert_eq!(offset_of!(ibv_wc, wc_flags), 36);

const_assert_eq!(offset_of!(ibv_context, device), 0);
const_assert_eq!(offset_of!(ibv_context, ops), 8);
const_assert_eq!(offset_of!(ibv_context_ops, poll_cq), 88);
const_assert_eq!(offset_of!(ibv_context_ops, req_notify_cq), 96);
const_assert_eq!(offset_of!(ibv_context_ops, post_srq_recv), 160);
const_assert_eq!(offset_of!(ibv_context_ops, post_send), 200);
const_assert_eq!(offset_of!(ibv_context_ops, post_recv), 208);
const_assert_eq!(
    offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send),
    208
);
const_assert_eq!(size_of::<ibv_context_ops>(), 256);

const_assert_eq!(offset_of!(ibv_qp, context), 0);
const_assert_eq!(offset_of!(ibv_cq, context), 0);
const_assert_eq!(offset_of!(ibv_srq, context), 0);
const_assert_eq!(offset_of!(ibv_qp, qp_num), 52);

// verbs_context: `context` is the last member and `sz` sits right before it.
const_assert_eq!(
    offset_of!(verbs_context, context) + size_of::<ibv_context>(),
    size_of::<verbs_context>()
);
const_assert_eq!(
    offset_of!(verbs_context, sz) + 8,
    offset_of!(verbs_context, context)
);

// ibv_qp_ex starts with the ibv_qp it extends; ibv_cq_ex with the ibv_cq prefix.
const_assert_eq!(offset_of!(ibv_qp_ex, qp_base), 0);
const_assert_eq!(offset_of!(ibv_cq_ex, context), 0);
