//! Connected RC QP pairs on softnic, built only through `hotverbs_softnic::verbs_table()`
//! (the same `IbvFns` libibverbs loads into), as the setup layer will.
#![allow(dead_code)]

use core::ptr;

use hotverbs_datapath::{LocalBuf, RemoteBuf};
use hotverbs_ffi::*;

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

const ACCESS: u32 = IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC;

impl Pair {
    pub fn new(opts: PairOpts) -> Pair {
        // SAFETY: the verbs are called as their man pages describe, on objects created here.
        unsafe {
            let mut n = 0;
            let list = verb!(ibv_get_device_list)(&mut n);
            assert!(!list.is_null() && n >= 1, "softnic lists a device");
            let ctx = verb!(ibv_open_device)(*list);
            verb!(ibv_free_device_list)(list);
            assert!(!ctx.is_null(), "ibv_open_device errno {}", errno());
            let pd = verb!(ibv_alloc_pd)(ctx);
            assert!(!pd.is_null());
            let mut gid: ibv_gid = core::mem::zeroed();
            assert_eq!(verb!(ibv_query_gid)(ctx, 1, 1, &mut gid), 0);
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
            let cq = verb!(ibv_create_cq)(ctx, o.cq_size, ptr::null_mut(), ptr::null_mut(), 0);
            assert!(!cq.is_null(), "ibv_create_cq errno {}", errno());
            let mut buf = vec![0u8; o.buf_len].into_boxed_slice();
            let mr = verb!(ibv_reg_mr)(pd, buf.as_mut_ptr().cast(), buf.len(), ACCESS as i32);
            assert!(!mr.is_null(), "ibv_reg_mr errno {}", errno());
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
            let mut ia: ibv_qp_init_attr = core::mem::zeroed();
            ia.send_cq = cq;
            ia.recv_cq = cq;
            ia.srq = srq_p;
            ia.cap = ibv_qp_cap {
                max_send_wr: o.sq_depth,
                max_recv_wr: if srq { 0 } else { o.rq_depth },
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: o.max_inline,
            };
            ia.qp_type = qp_type;
            ia.sq_sig_all = 0;
            let qp = verb!(ibv_create_qp)(pd, &mut ia);
            assert!(!qp.is_null(), "ibv_create_qp errno {}", errno());
            Side {
                cq,
                qp,
                srq: srq_p,
                mr,
                buf,
            }
        }
    }

    fn modify(&self, qp: *mut ibv_qp, attr: &mut ibv_qp_attr, mask: u32) {
        // SAFETY: live QP, initialised attr.
        let rc = unsafe { verb!(ibv_modify_qp)(qp, attr, mask as i32) };
        assert_eq!(
            rc,
            0,
            "ibv_modify_qp to state {} failed: {}",
            attr.qp_state,
            errno_name(rc)
        );
    }

    /// RESET -> INIT -> RTR -> RTS towards `dest_qpn`.
    pub fn connect(&self, qp: *mut ibv_qp, dest_qpn: u32) {
        // SAFETY: ibv_qp_attr is plain data.
        let mut at: ibv_qp_attr = unsafe { core::mem::zeroed() };
        at.qp_state = IBV_QPS_INIT;
        at.pkey_index = 0;
        at.port_num = 1;
        at.qp_access_flags = ACCESS;
        self.modify(
            qp,
            &mut at,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        );
        // SAFETY: as above.
        let mut at: ibv_qp_attr = unsafe { core::mem::zeroed() };
        at.qp_state = IBV_QPS_RTR;
        at.path_mtu = IBV_MTU_1024;
        at.dest_qp_num = dest_qpn;
        at.rq_psn = 0;
        at.max_dest_rd_atomic = 16;
        at.min_rnr_timer = 1;
        at.ah_attr.is_global = 1;
        at.ah_attr.port_num = 1;
        at.ah_attr.grh.dgid = self.gid;
        at.ah_attr.grh.sgid_index = 1;
        at.ah_attr.grh.hop_limit = 1;
        self.modify(
            qp,
            &mut at,
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER,
        );
        // SAFETY: as above.
        let mut at: ibv_qp_attr = unsafe { core::mem::zeroed() };
        at.qp_state = IBV_QPS_RTS;
        at.sq_psn = 0;
        at.timeout = 14;
        at.retry_cnt = 7;
        at.rnr_retry = self.opts.rnr_retry;
        at.max_rd_atomic = 16;
        self.modify(
            qp,
            &mut at,
            IBV_QP_STATE
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_SQ_PSN
                | IBV_QP_MAX_QP_RD_ATOMIC,
        );
    }

    /// QP to RESET (outstanding WRs vanish without completions).
    pub fn to_reset(&self, qp: *mut ibv_qp) {
        // SAFETY: plain data.
        let mut at: ibv_qp_attr = unsafe { core::mem::zeroed() };
        at.qp_state = IBV_QPS_RESET;
        self.modify(qp, &mut at, IBV_QP_STATE);
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
            let mut n = 0;
            let list = verb!(ibv_get_device_list)(&mut n);
            let ctx = verb!(ibv_open_device)(*list);
            verb!(ibv_free_device_list)(list);
            let pd = verb!(ibv_alloc_pd)(ctx);
            let mut gid: ibv_gid = core::mem::zeroed();
            assert_eq!(verb!(ibv_query_gid)(ctx, 1, 1, &mut gid), 0);
            let mk = || {
                let mut s = Pair::side_typed(ctx, pd, &opts, false, IBV_QPT_UD);
                let m = |st: u32, mask: u32, f: &dyn Fn(&mut ibv_qp_attr)| {
                    let mut at: ibv_qp_attr = core::mem::zeroed();
                    at.qp_state = st;
                    f(&mut at);
                    assert_eq!(
                        verb!(ibv_modify_qp)(s.qp, &mut at, mask as i32),
                        0,
                        "UD modify to {st}"
                    );
                };
                m(
                    IBV_QPS_INIT,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
                    &|a| {
                        a.port_num = 1;
                        a.qkey = QKEY;
                    },
                );
                m(IBV_QPS_RTR, IBV_QP_STATE, &|_| {});
                m(IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_SQ_PSN, &|_| {});
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
