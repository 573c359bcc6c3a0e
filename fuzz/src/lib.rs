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
// The raw-verbs setup (open, PD, CQ, QP, MR, the modify_qp sequence) shared with the
// datapath's and softnic's tests.
use hotverbs_softnic::testing::{self, ConnectAttr};

/// softnic's verbs table.
pub fn fns() -> &'static IbvFns {
    hotverbs_softnic::verbs_table()
}

/// Access flags of every MR and QP that should allow everything.
pub use hotverbs_softnic::testing::ALL_ACCESS;

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
        let (ctx, _) = testing::open_listed_device();
        Self::on(ctx, cfg)
    }

    /// Opens a new softnic device with behaviour `profile` (softnic's other settings at
    /// their defaults) and builds the pair on it.
    pub fn with_profile(cfg: PairConfig, profile: hotverbs_softnic::Profile) -> Pair {
        let ctx = hotverbs_softnic::open_device(hotverbs_softnic::Config {
            profile,
            ..Default::default()
        });
        assert!(!ctx.is_null(), "hotverbs_softnic::open_device failed");
        Self::on(ctx, cfg)
    }

    /// Builds the pair on the live softnic context `ctx`.
    fn on(ctx: *mut ibv_context, cfg: PairConfig) -> Pair {
        // SAFETY: the verbs are called as their man pages describe, on `ctx` (live, from
        // softnic) and objects created here and checked non-NULL.
        unsafe {
            let pd = testing::alloc_pd(ctx);
            let pd2 = testing::alloc_pd(ctx);
            let gid = testing::query_gid(ctx, 1);
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
            let cq = testing::create_cq(ctx, c.cq_size);
            let cap = ibv_qp_cap {
                max_send_wr: c.sq_depth,
                max_recv_wr: c.rq_depth,
                max_send_sge: c.max_sge,
                max_recv_sge: c.max_sge,
                max_inline_data: c.max_inline,
            };
            let qp = testing::create_qp(pd, c.qp_type, cq, cq, cap, ptr::null_mut());
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
        unsafe { testing::reg_mr(pd, addr, len, access) }
    }

    /// RESET -> INIT -> RTR -> RTS towards `dest_qpn` (RC or UC, from the QP's type).
    pub fn connect(&self, qp: *mut ibv_qp, dest_qpn: u32, rnr_retry: u8) {
        let c = ConnectAttr {
            rnr_retry,
            ..ConnectAttr::new(dest_qpn, self.gid)
        };
        connect_pair_qp(qp, &c);
    }

    /// Moves `qp` to RESET (its queued WRs vanish without completions).
    pub fn to_reset(&self, qp: *mut ibv_qp) {
        reset_pair_qp(qp);
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

/// [`testing::connect_qp`] on one of a [`Pair`]'s QPs (the only callers' arguments).
fn connect_pair_qp(qp: *mut ibv_qp, c: &ConnectAttr) {
    // SAFETY: a live QP of a pair (module invariant: never destroyed).
    unsafe { testing::connect_qp(qp, c) }
}

/// [`testing::qp_to_reset`] on one of a [`Pair`]'s QPs (the only callers' arguments).
fn reset_pair_qp(qp: *mut ibv_qp) {
    // SAFETY: a live QP of a pair (module invariant: never destroyed).
    unsafe { testing::qp_to_reset(qp) }
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

std::thread_local! {
    /// The text buffer of [`display_with`] / [`debug_with`], reused across inputs.
    static TEXT: core::cell::RefCell<String> = const { core::cell::RefCell::new(String::new()) };
}

/// Formats `v` with `Display` into a buffer reused across inputs (no allocation per input
/// once it has grown: allocations under AddressSanitizer are a large share of a fast
/// target's time) and hands the text to `f`. Not reentrant: `f` must not call it again.
pub fn display_with<R>(v: &dyn core::fmt::Display, f: impl FnOnce(&str) -> R) -> R {
    TEXT.with_borrow_mut(|t| {
        use core::fmt::Write;
        t.clear();
        write!(t, "{v}").expect("Display into a String");
        f(t)
    })
}

/// [`display_with`] for `Debug`.
pub fn debug_with<R>(v: &dyn core::fmt::Debug, f: impl FnOnce(&str) -> R) -> R {
    TEXT.with_borrow_mut(|t| {
        use core::fmt::Write;
        t.clear();
        write!(t, "{v:?}").expect("Debug into a String");
        f(t)
    })
}

/// `n` in decimal, in `buf` (no allocation).
pub fn decimal(n: u32, buf: &mut [u8; 10]) -> &str {
    let mut i = buf.len();
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    core::str::from_utf8(&buf[i..]).expect("ASCII digits")
}
