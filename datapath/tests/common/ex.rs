//! Connected extended RC QPs (`ibv_create_qp_ex` with every RC opcode in
//! `send_ops_flags`, `ibv_create_cq_ex`) on softnic, for the `WrRing` / `ExCqPoller` tests.
#![allow(dead_code)]

use hotverbs_datapath::{LocalBuf, RemoteBuf};
use hotverbs_ffi::*;

use hotverbs_softnic::testing::{self as t, ConnectAttr};

/// One extended side: its CQ, QP (and its `ibv_qp_ex`), a registered buffer.
pub struct ExSide {
    pub cq: *mut ibv_cq_ex,
    pub qp: *mut ibv_qp,
    pub qpx: *mut ibv_qp_ex,
    pub mr: *mut ibv_mr,
    /// The registered buffer ([`BUF_LEN`] bytes), leaked like the QPs and reached only
    /// through this raw pointer: the device writes it through the MR, so a `Box` here
    /// (which asserts uniqueness whenever the side moves or is read) would invalidate the
    /// pointer the MR was registered with (miri, Stacked and Tree Borrows; issue 27).
    pub buf: *mut u8,
}

/// Bytes in each side's registered buffer.
pub const BUF_LEN: usize = 4096;

impl ExSide {
    pub fn local(&self, off: u64, len: u32) -> LocalBuf {
        // SAFETY: the MR lives as long as the side.
        LocalBuf::new(self.buf as u64 + off, len, unsafe { (*self.mr).lkey })
    }
    pub fn remote(&self) -> RemoteBuf {
        // SAFETY: as above.
        RemoteBuf::new(self.buf as u64, BUF_LEN as u64, unsafe { (*self.mr).rkey })
    }
    pub fn qpn(&self) -> u32 {
        // SAFETY: a live QP.
        unsafe { (*self.qp).qp_num }
    }
    /// The buffer as the device left it (read through the raw pointer: the device writes
    /// it behind the compiler's back).
    pub fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= BUF_LEN);
        // SAFETY: inside the buffer; no WR is in flight when tests read.
        unsafe { core::slice::from_raw_parts(self.buf.add(off), len).to_vec() }
    }
}

pub const RC_OPS: u64 = (IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) as u64;

/// Two connected extended RC QPs on one softnic context; `wc` are the CQs' `wc_flags`.
/// Returns the sides and whether the CQs have completion timestamps (not in the Rxe
/// profile: `ibv_create_cq_ex` refuses them with EOPNOTSUPP, as rxe).
pub fn ex_pair(depth: u32) -> (ExSide, ExSide, u64) {
    let fns = hotverbs_softnic::verbs_table();
    // SAFETY: softnic's verbs, called as their man pages say on objects made here, which
    // the test never frees (they live until the process ends).
    unsafe {
        let (ctx, _) = t::open_listed_device();
        let pd = t::alloc_pd(ctx);
        let gid = t::query_gid(ctx, 1);
        let base = (IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_BYTE_LEN) as u64;
        let stamped = base | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP as u64;
        let mk_cq = |wc: u64| {
            let mut a = ibv_cq_init_attr_ex {
                cqe: 4 * depth,
                wc_flags: wc,
                ..Default::default()
            };
            let cq = hotverbs_ffi::inline::ibv_create_cq_ex(ctx, &mut a);
            (cq, hotverbs_ffi::errno())
        };
        let wc = match mk_cq(stamped) {
            (cq, _) if !cq.is_null() => stamped,
            (_, e) => {
                assert_eq!(
                    e, 95,
                    "only EOPNOTSUPP (the Rxe profile) refuses timestamps"
                );
                base
            }
        };
        let side = || {
            let (cq, e) = mk_cq(wc);
            assert!(!cq.is_null(), "ibv_create_cq_ex: errno {e}");
            let mut a = ibv_qp_init_attr_ex {
                send_cq: hotverbs_ffi::inline::ibv_cq_ex_to_cq(cq),
                recv_cq: hotverbs_ffi::inline::ibv_cq_ex_to_cq(cq),
                cap: ibv_qp_cap {
                    max_send_wr: depth,
                    max_recv_wr: depth,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 64,
                },
                qp_type: IBV_QPT_RC,
                comp_mask: IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                pd,
                send_ops_flags: RC_OPS,
                ..Default::default()
            };
            let qp = hotverbs_ffi::inline::ibv_create_qp_ex(fns, ctx, &mut a);
            assert!(
                !qp.is_null(),
                "ibv_create_qp_ex: errno {}",
                hotverbs_ffi::errno()
            );
            let qpx = fns.ibv_qp_to_qp_ex.expect("ibv_qp_to_qp_ex")(qp);
            // Words, not bytes: atomics need 8-byte aligned remote addresses, and a byte
            // allocation has no such promise (miri places them anywhere).
            let buf: *mut u8 = Box::into_raw(vec![0u64; BUF_LEN / 8].into_boxed_slice()).cast();
            let mr = t::reg_mr(pd, buf, BUF_LEN, t::ALL_ACCESS);
            ExSide {
                cq,
                qp,
                qpx,
                mr,
                buf,
            }
        };
        let a = side();
        let b = side();
        t::connect_qp(a.qp, &ConnectAttr::new(b.qpn(), gid));
        t::connect_qp(b.qp, &ConnectAttr::new(a.qpn(), gid));
        (a, b, wc)
    }
}
