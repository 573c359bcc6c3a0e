//! Shared pieces of the hotverbs fuzz targets: a connected RC QP pair on softnic, built only
//! through `hotverbs_softnic::verbs_table()` (the same `IbvFns` libibverbs is loaded into).
//!
//! softnic never reuses QP numbers, MR keys or object slots, so the targets build one pair
//! per process (lazily, in a `static`) and bring it back to a known state at the start of
//! every input ([`Pair::restart`]): both QPs through RESET -> INIT -> RTR -> RTS, both CQs
//! drained. Nothing of one input survives into the next except those objects.
//!
//! # Invariants (this module owns raw verbs pointers)
//! Every pointer in a [`Pair`] comes from a softnic verb that returned it non-NULL, and the
//! objects are never destroyed (the pair lives for the whole process).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use core::ptr;

use hotverbs_ffi::*;

/// softnic's verbs table.
pub fn fns() -> &'static IbvFns {
    hotverbs_softnic::verbs_table()
}

macro_rules! verb {
    ($name:ident) => {
        fns().$name.expect(stringify!($name))
    };
}

/// Access flags of every MR and QP that should allow everything.
pub const ALL_ACCESS: u32 = IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC;

/// What a pair is built with.
#[derive(Clone, Copy, Debug)]
pub struct PairConfig {
    /// `cap.max_send_wr` of both QPs.
    pub sq_depth: u32,
    /// `cap.max_recv_wr` of both QPs.
    pub rq_depth: u32,
    /// `cap.max_send_sge` / `cap.max_recv_sge`.
    pub max_sge: u32,
    /// `cap.max_inline_data`.
    pub max_inline: u32,
    /// CQ size (each QP has its own CQ).
    pub cq_size: i32,
    /// `rnr_retry` of side A (7 = wait for a receive forever; RC only).
    pub rnr_retry_a: u8,
    /// `IBV_QPT_RC` or `IBV_QPT_UC`.
    pub qp_type: ibv_qp_type,
}

/// One QP with its own CQ.
#[derive(Debug)]
pub struct End {
    /// The CQ for both queues of `qp`.
    pub cq: *mut ibv_cq,
    /// The QP.
    pub qp: *mut ibv_qp,
}

impl End {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: live QP (module invariant).
        unsafe { (*self.qp).qp_num }
    }

    /// Polls the CQ until it is empty, returning everything it held.
    pub fn poll_all(&self) -> Vec<ibv_wc> {
        let mut out = Vec::new();
        let mut wc = [ibv_wc::default(); 16];
        loop {
            // SAFETY: a live CQ (module invariant); room for 16 entries.
            let n = unsafe { inline::ibv_poll_cq(self.cq, 16, wc.as_mut_ptr()) };
            assert!(n >= 0, "ibv_poll_cq returned {n} (CQ overflow?)");
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&wc[..n as usize]);
        }
    }

    /// The QP's current state as softnic mirrors it into `ibv_qp.state`.
    pub fn state(&self) -> ibv_qp_state {
        // SAFETY: live QP (module invariant).
        unsafe { (*self.qp).state }
    }
}

/// Two connected RC (or UC) QPs (A -> B and B -> A) in one PD, plus a second PD.
pub struct Pair {
    /// The context.
    pub ctx: *mut ibv_context,
    /// The PD of both QPs.
    pub pd: *mut ibv_pd,
    /// A second PD (its MRs must not be usable by the QPs).
    pub pd2: *mut ibv_pd,
    /// Side A.
    pub a: End,
    /// Side B.
    pub b: End,
    /// How it was built.
    pub cfg: PairConfig,
    gid: ibv_gid,
}

// SAFETY: softnic objects may be used from any thread (every verb takes softnic's mutex);
// the fuzz targets keep the pair behind a Mutex anyway.
unsafe impl Send for Pair {}

impl Pair {
    /// Opens the default softnic device and builds the pair.
    pub fn new(cfg: PairConfig) -> Pair {
        // SAFETY: the verbs are called as their man pages describe, on objects created here
        // and checked non-NULL.
        unsafe {
            let mut n = 0;
            let list = verb!(ibv_get_device_list)(&mut n);
            assert!(!list.is_null() && n >= 1, "softnic lists a device");
            let ctx = verb!(ibv_open_device)(*list);
            verb!(ibv_free_device_list)(list);
            assert!(!ctx.is_null(), "ibv_open_device: {}", errno_name(errno()));
            let pd = verb!(ibv_alloc_pd)(ctx);
            let pd2 = verb!(ibv_alloc_pd)(ctx);
            assert!(!pd.is_null() && !pd2.is_null(), "ibv_alloc_pd");
            let mut gid: ibv_gid = core::mem::zeroed();
            assert_eq!(
                verb!(ibv_query_gid)(ctx, 1, 1, &mut gid),
                0,
                "ibv_query_gid"
            );
            let a = Self::end(ctx, pd, &cfg);
            let b = Self::end(ctx, pd, &cfg);
            let pair = Pair {
                ctx,
                pd,
                pd2,
                a,
                b,
                cfg,
                gid,
            };
            pair.connect(pair.a.qp, pair.b.qpn(), cfg.rnr_retry_a);
            pair.connect(pair.b.qp, pair.a.qpn(), 7);
            pair
        }
    }

    /// # Safety
    /// `ctx` and `pd` are live softnic objects.
    unsafe fn end(ctx: *mut ibv_context, pd: *mut ibv_pd, c: &PairConfig) -> End {
        // SAFETY: caller's contract; the attributes are fully initialised.
        unsafe {
            let cq = verb!(ibv_create_cq)(ctx, c.cq_size, ptr::null_mut(), ptr::null_mut(), 0);
            assert!(!cq.is_null(), "ibv_create_cq: {}", errno_name(errno()));
            let mut ia: ibv_qp_init_attr = core::mem::zeroed();
            ia.send_cq = cq;
            ia.recv_cq = cq;
            ia.cap = ibv_qp_cap {
                max_send_wr: c.sq_depth,
                max_recv_wr: c.rq_depth,
                max_send_sge: c.max_sge,
                max_recv_sge: c.max_sge,
                max_inline_data: c.max_inline,
            };
            ia.qp_type = c.qp_type;
            ia.sq_sig_all = 0;
            let qp = verb!(ibv_create_qp)(pd, &mut ia);
            assert!(!qp.is_null(), "ibv_create_qp: {}", errno_name(errno()));
            End { cq, qp }
        }
    }

    /// Registers `len` bytes at `addr` in `pd` with `access`; returns the MR (lkey == rkey
    /// on softnic).
    ///
    /// # Safety
    /// `addr..addr + len` stays valid memory for the rest of the process.
    pub unsafe fn reg(
        &self,
        pd: *mut ibv_pd,
        addr: *mut u8,
        len: usize,
        access: u32,
    ) -> *mut ibv_mr {
        // SAFETY: caller's contract; live PD.
        let mr = unsafe { verb!(ibv_reg_mr)(pd, addr.cast(), len, access as i32) };
        assert!(!mr.is_null(), "ibv_reg_mr: {}", errno_name(errno()));
        mr
    }

    fn modify(&self, qp: *mut ibv_qp, attr: &mut ibv_qp_attr, mask: u32) {
        // SAFETY: live QP, initialised attr.
        let rc = unsafe { verb!(ibv_modify_qp)(qp, attr, mask as i32) };
        assert_eq!(
            rc,
            0,
            "ibv_modify_qp to state {}: {}",
            attr.qp_state,
            errno_name(rc)
        );
    }

    /// RESET -> INIT -> RTR -> RTS towards `dest_qpn`.
    pub fn connect(&self, qp: *mut ibv_qp, dest_qpn: u32, rnr_retry: u8) {
        // SAFETY: ibv_qp_attr is plain data; all-zero is valid.
        let mut at: ibv_qp_attr = unsafe { core::mem::zeroed() };
        at.qp_state = IBV_QPS_INIT;
        at.port_num = 1;
        at.qp_access_flags = ALL_ACCESS;
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
        at.max_dest_rd_atomic = 16;
        at.min_rnr_timer = 1;
        at.ah_attr.is_global = 1;
        at.ah_attr.port_num = 1;
        at.ah_attr.grh.dgid = self.gid;
        at.ah_attr.grh.sgid_index = 1;
        at.ah_attr.grh.hop_limit = 1;
        let rc = self.cfg.qp_type == IBV_QPT_RC;
        let rc_rtr = IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        self.modify(
            qp,
            &mut at,
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | if rc { rc_rtr } else { 0 },
        );
        // SAFETY: as above.
        let mut at: ibv_qp_attr = unsafe { core::mem::zeroed() };
        at.qp_state = IBV_QPS_RTS;
        at.timeout = 14;
        at.retry_cnt = 7;
        at.rnr_retry = rnr_retry;
        at.max_rd_atomic = 16;
        let rc_rts = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(
            qp,
            &mut at,
            IBV_QP_STATE | IBV_QP_SQ_PSN | if rc { rc_rts } else { 0 },
        );
    }

    /// Moves `qp` to RESET (its queued WRs vanish without completions).
    pub fn to_reset(&self, qp: *mut ibv_qp) {
        // SAFETY: plain data.
        let mut at: ibv_qp_attr = unsafe { core::mem::zeroed() };
        at.qp_state = IBV_QPS_RESET;
        self.modify(qp, &mut at, IBV_QP_STATE);
    }

    /// Side A through RESET and back to RTS (side B untouched).
    pub fn reconnect_a(&self) {
        self.to_reset(self.a.qp);
        self.connect(self.a.qp, self.b.qpn(), self.cfg.rnr_retry_a);
    }

    /// Both sides through RESET and back to RTS.
    pub fn reconnect_both(&self) {
        self.to_reset(self.a.qp);
        self.to_reset(self.b.qp);
        self.connect(self.a.qp, self.b.qpn(), self.cfg.rnr_retry_a);
        self.connect(self.b.qp, self.a.qpn(), 7);
    }

    /// The state at the start of an input: both QPs fresh in RTS, both CQs empty.
    pub fn restart(&self) {
        self.reconnect_both();
        self.a.poll_all();
        self.b.poll_all();
    }
}

/// Posts one receive of `len` bytes at `addr` (`lkey`) on `qp`; returns the verb's result.
///
/// # Safety
/// `qp` is a live softnic QP and the range stays valid until the receive completes.
pub unsafe fn post_one_recv(qp: *mut ibv_qp, wr_id: u64, addr: u64, len: u32, lkey: u32) -> i32 {
    let mut sge = ibv_sge {
        addr,
        length: len,
        lkey,
    };
    let mut wr = ibv_recv_wr {
        wr_id,
        next: ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
    };
    let mut bad = ptr::null_mut();
    // SAFETY: caller's contract; a one-WR chain with one SGE.
    unsafe { inline::ibv_post_recv(qp, &mut wr, &mut bad) }
}
