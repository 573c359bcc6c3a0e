//! Connected RC QP pairs on softnic, built only through `hotverbs_softnic::verbs_table()`
//! (the same `IbvFns` libibverbs loads into), as the setup layer will.
#![allow(dead_code)]

use core::ptr;

use hotverbs_datapath::{LocalBuf, RemoteBuf};
use hotverbs_ffi::*;
// The raw-verbs setup (open, PD, CQ, QP, MR, the modify_qp sequence) shared with softnic's
// tests and the fuzz targets.
use hotverbs_softnic::testing::{self, ConnectAttr, ALL_ACCESS as ACCESS};

pub fn fns() -> &'static IbvFns {
    hotverbs_softnic::verbs_table()
}

macro_rules! verb {
    ($name:ident) => {
        fns().$name.expect(stringify!($name))
    };
}

#[derive(Clone, Copy, Debug)]
pub struct PairOpts {
    pub sq_depth: u32,
    pub rq_depth: u32,
    pub max_inline: u32,
    pub cq_size: i32,
    /// Side B receives through an SRQ.
    pub srq_b: bool,
    pub rnr_retry: u8,
    pub buf_len: usize,
}

impl Default for PairOpts {
    fn default() -> Self {
        Self {
            sq_depth: 64,
            rq_depth: 64,
            max_inline: 64,
            cq_size: 1024,
            srq_b: false,
            rnr_retry: 7,
            buf_len: 1 << 16,
        }
    }
}

/// One end: CQ, QP (and SRQ), a registered buffer.
pub struct Side {
    pub cq: *mut ibv_cq,
    pub qp: *mut ibv_qp,
    pub srq: *mut ibv_srq,
    pub mr: *mut ibv_mr,
    pub buf: Box<[u8]>,
}

impl Side {
    pub fn local(&self) -> LocalBuf {
        // SAFETY: mr is live while the pair lives.
        LocalBuf::new(self.buf.as_ptr() as u64, self.buf.len() as u32, unsafe {
            (*self.mr).lkey
        })
    }
    pub fn remote(&self) -> RemoteBuf {
        // SAFETY: as above.
        RemoteBuf::new(self.buf.as_ptr() as u64, self.buf.len() as u64, unsafe {
            (*self.mr).rkey
        })
    }
    pub fn qpn(&self) -> u32 {
        // SAFETY: live QP.
        unsafe { (*self.qp).qp_num }
    }
}

pub struct Pair {
    pub ctx: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub a: Side,
    pub b: Side,
    pub opts: PairOpts,
    gid: ibv_gid,
}

impl Pair {
    pub fn new(opts: PairOpts) -> Pair {
        // SAFETY: the verbs are called as their man pages describe, on objects created here.
        unsafe {
            let (ctx, _) = testing::open_listed_device();
            let pd = testing::alloc_pd(ctx);
            let gid = testing::query_gid(ctx, 1);
            let a = Self::side(ctx, pd, &opts, false);
            let b = Self::side(ctx, pd, &opts, opts.srq_b);
            let pair = Pair {
                ctx,
                pd,
                a,
                b,
                opts,
                gid,
            };
            pair.connect(pair.a.qp, pair.b.qpn());
            pair.connect(pair.b.qp, pair.a.qpn());
            pair
        }
    }

    /// One RC side (see [`side_typed`](Self::side_typed)).
    ///
    /// # Safety
    /// `ctx` and `pd` are a live softnic context and a PD of it, outliving the side.
    unsafe fn side(ctx: *mut ibv_context, pd: *mut ibv_pd, o: &PairOpts, srq: bool) -> Side {
        // SAFETY: forwarded.
        unsafe { Self::side_typed(ctx, pd, o, srq, IBV_QPT_RC) }
    }

    /// A CQ, a registered buffer, an SRQ if `srq`, and a QP of `qp_type` in RESET.
    ///
    /// # Safety
    /// `ctx` and `pd` are a live softnic context and a PD of it, outliving the side.
    pub(crate) unsafe fn side_typed(
        ctx: *mut ibv_context,
        pd: *mut ibv_pd,
        o: &PairOpts,
        srq: bool,
        qp_type: ibv_qp_type,
    ) -> Side {
        // SAFETY: caller's contract (live ctx/pd); attributes are fully initialised.
        unsafe {
            let cq = testing::create_cq(ctx, o.cq_size);
            let mut buf = vec![0u8; o.buf_len].into_boxed_slice();
            // The buffer lives in the Side, as long as the MR (never deregistered).
            let mr = testing::reg_mr(pd, buf.as_mut_ptr(), buf.len(), ACCESS);
            let srq_p = if srq {
                let mut sa: ibv_srq_init_attr = core::mem::zeroed();
                sa.attr.max_wr = o.rq_depth;
                sa.attr.max_sge = 1;
                let s = verb!(ibv_create_srq)(pd, &mut sa);
                assert!(!s.is_null(), "ibv_create_srq errno {}", errno());
                s
            } else {
                ptr::null_mut()
            };
            let cap = ibv_qp_cap {
                max_send_wr: o.sq_depth,
                max_recv_wr: if srq { 0 } else { o.rq_depth },
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: o.max_inline,
            };
            let qp = testing::create_qp(pd, qp_type, cq, cq, cap, srq_p);
            Side {
                cq,
                qp,
                srq: srq_p,
                mr,
                buf,
            }
        }
    }

    /// RESET -> INIT -> RTR -> RTS towards `dest_qpn`.
    pub fn connect(&self, qp: *mut ibv_qp, dest_qpn: u32) {
        let c = ConnectAttr {
            rnr_retry: self.opts.rnr_retry,
            ..ConnectAttr::new(dest_qpn, self.gid)
        };
        // SAFETY: a live QP of this pair.
        unsafe { testing::connect_qp(qp, &c) }
    }

    /// QP to RESET (outstanding WRs vanish without completions).
    pub fn to_reset(&self, qp: *mut ibv_qp) {
        // SAFETY: a live QP of this pair.
        unsafe { testing::qp_to_reset(qp) }
    }

    /// Full recovery of both QPs: RESET -> INIT -> RTR -> RTS.
    pub fn reconnect_both(&self) {
        self.to_reset(self.a.qp);
        self.to_reset(self.b.qp);
        self.connect(self.a.qp, self.b.qpn());
        self.connect(self.b.qp, self.a.qpn());
    }
}

/// Two UD QPs (sharing one context and PD) and an address handle towards `gid`.
pub struct UdPair {
    pub ctx: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub a: Side,
    pub b: Side,
    pub gid: ibv_gid,
}

pub const QKEY: u32 = 0x1111_2222;

impl UdPair {
    pub fn new(depth: u32) -> UdPair {
        let opts = PairOpts {
            sq_depth: depth,
            rq_depth: depth,
            ..PairOpts::default()
        };
        // SAFETY: verbs called as documented on objects created here.
        unsafe {
            let (ctx, _) = testing::open_listed_device();
            let pd = testing::alloc_pd(ctx);
            let gid = testing::query_gid(ctx, 1);
            let mk = || {
                let mut s = Pair::side_typed(ctx, pd, &opts, false, IBV_QPT_UD);
                // UD: INIT with the Q_Key, RTR and RTS (SQ PSN 0) with nothing else.
                let c = ConnectAttr {
                    qkey: QKEY,
                    ..ConnectAttr::new(0, gid)
                };
                testing::connect_qp(s.qp, &c);
                s.srq = ptr::null_mut();
                s
            };
            let a = mk();
            let b = mk();
            UdPair { ctx, pd, a, b, gid }
        }
    }

    /// An AH towards `dgid` (this device's GID or a multicast GID).
    pub fn ah(&self, dgid: ibv_gid) -> *mut ibv_ah {
        // SAFETY: plain data, live PD.
        unsafe {
            let mut at: ibv_ah_attr = core::mem::zeroed();
            at.is_global = 1;
            at.port_num = 1;
            at.grh.dgid = dgid;
            at.grh.sgid_index = 1;
            at.grh.hop_limit = 1;
            let ah = verb!(ibv_create_ah)(self.pd, &mut at);
            assert!(!ah.is_null(), "ibv_create_ah errno {}", errno());
            ah
        }
    }

    pub fn attach_mcast(&self, qp: *mut ibv_qp, mgid: &ibv_gid) {
        // SAFETY: live UD QP.
        assert_eq!(unsafe { verb!(ibv_attach_mcast)(qp, mgid, 0) }, 0);
    }
}
