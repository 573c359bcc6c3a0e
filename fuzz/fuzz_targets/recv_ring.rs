//! `RecvRing` on the counting test device (its QP receive queue or its SRQ) or on a softnic
//! RC QP of the profile the input picks (`Spec` or `Rxe`; B sends the messages), driven by
//! arbitrary sequences of fill / repost / release / device completions (success, and flush
//! after a QP error) / polls / delivery of polled completions in any order, again, or after
//! a reset / `data()` / QP error / QP RESET + ring reset / ring reset in ERR / refused posts.
//!
//! Every receive the ring posts passes a recording shim in front of the device's
//! `post_recv` / `post_srq_recv` (the `ops` entries of the device's context, as an
//! interposer sees them), so the harness knows exactly which slot each posted receive is,
//! and a mirror of the counting device (its documented behaviour: FIFO queues of `cap`
//! entries, ENOMEM at the first WR that does not fit, flush on QP error, RESET drops the
//! QP's receives and keeps the SRQ's, a CQ of `cap` entries that drops on overflow)
//! predicts every verb result and every completion. For softnic the mirror follows the
//! crate docs of the chosen profile where they differ for a receive queue: a receive posted
//! in ERR is queued up to the capacity and flushed after the post (Spec) or held without a
//! completion until the QP is reset (Rxe, G9), and the queue holds 8 (Spec) or 15 (Rxe:
//! rounded to 2^k - 1) receives. Flush completions' opcode and `byte_len` are not checked
//! (undefined by `ibv_poll_cq(3)`; rxe reports 0).
//!
//! Invariants checked after every step:
//! - every posted receive is one of the ring's slots with the ring's current `wr_id` tag and
//!   the slot's SGE (address, length, lkey, one SGE); a slot is posted only while it is
//!   neither on the device, nor completed and not yet given to the ring, nor held by the
//!   user (never posted twice, never while the user reads it);
//! - a refused post (queue full: ENOMEM at the first WR that does not fit; a WR the shim
//!   refuses with EINVAL; a failure that names no WR) returns exactly the `PostError` the
//!   device's answer implies, and leaves the ring consistent: `posted()` = receives on the
//!   device + completions not yet given to the ring + completions the full CQ dropped,
//!   `pending()` = slots released (or reset) and not yet accepted by the device, `held()` =
//!   the user's `Received`s; the device's own counts (RQ, SRQ, CQ, overflows) equal the
//!   mirror's;
//! - `on_completion` hands out a slot exactly for a completion of the ring's current tag
//!   whose slot is completed and not yet given (with that completion's `byte_len` and
//!   immediate data), turns a failed one into `RecvError::Completion` (slot idle until
//!   `fill` or `reset`), and calls everything else stale, including a completion given a
//!   second time and completions left over from before a QP reset;
//! - `data()` of a held slot is exactly that slot's bytes in the region (`byte_len`,
//!   capped at the slot length); a `Received` of another ring is refused by `data()` and
//!   `release()` (`Foreign`);
//! - reset: on a QP every slot not held is queued again and the generation changes; on an
//!   SRQ only idle and pending slots are, and the generation stays;
//! - exactly once: at the end, after every completion is given and every slot released,
//!   receives accepted by the device = slots handed out + failed completions + receives
//!   forgotten by a QP reset + receives still on the device or lost in an overflowing CQ.
//!
//! Planted bug (`--features planted-bug`): the harness expects `reset` on an SRQ to queue
//! the slots still posted on the SRQ too, as on a QP (the bug the SRQ branch of
//! `RecvRing::reset` exists to prevent: those buffers would be posted twice).
#![no_main]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::{Mutex, OnceLock};

use arbitrary::Arbitrary;
use hotverbs_datapath::*;
use hotverbs_ffi::*;
use hotverbs_fuzz::{Pair, PairConfig, ALL_ACCESS};
use hotverbs_softnic::counting::CountingDevice;
use hotverbs_softnic::Profile;
use libfuzzer_sys::fuzz_target;

const N: usize = 16;
const MAX_SLOT: u32 = 64;
const RING_ID: u8 = 9;
const LKEY: u32 = 0x4242;
const MAX_OPS: usize = 64;
/// Completions polled per `ibv_poll_cq` at most.
const POLL_MAX: usize = 8;

/// The registered region: one leaked buffer per process (the device never writes it; the
/// ring only reads it through `data()`).
fn region() -> u64 {
    static REGION: OnceLock<usize> = OnceLock::new();
    *REGION.get_or_init(|| {
        Box::leak(vec![0u8; N * MAX_SLOT as usize].into_boxed_slice()).as_mut_ptr() as usize
    }) as u64
}

/// `cap.max_recv_wr` of the softnic receiver QP (Rxe rounds it up to 15).
const SOFT_RQ: u32 = 8;

/// A softnic RC pair of one profile: the ring receives on A, B sends to it. Built once per
/// process and profile (softnic never reuses QP numbers), reset at every input.
struct SoftRig {
    pair: Pair,
    profile: Profile,
    /// The registered region of A's ring and its lkey.
    region: u64,
    lkey: u32,
}

static SOFT_RIGS: [Mutex<Option<SoftRig>>; 2] = [Mutex::new(None), Mutex::new(None)];

fn soft_rig(profile: Profile) -> SoftRig {
    let pair = Pair::with_profile(
        PairConfig {
            sq_depth: 64,
            rq_depth: SOFT_RQ,
            max_sge: 1,
            max_inline: MAX_SLOT,
            cq_size: 4096,
            rnr_retry_a: 7,
            qp_type: IBV_QPT_RC,
        },
        profile,
    );
    let buf: &'static mut [u8] = Box::leak(vec![0u8; N * MAX_SLOT as usize].into_boxed_slice());
    // SAFETY: the leaked buffer lives for the rest of the process.
    let mr = unsafe { pair.reg(pair.pd, buf.as_mut_ptr(), buf.len(), ALL_ACCESS) };
    // SAFETY: an MR returned non-NULL by ibv_reg_mr.
    let lkey = unsafe { (*mr).lkey };
    let ctx = pair.ctx;
    // SAFETY: `ctx` is the rig's live softnic context (never closed); this thread is its
    // only user while the rig is built, and its `ops` are plain function pointers.
    unsafe {
        let ops = &mut (*ctx).ops;
        let r = ops.post_recv.expect("post_recv");
        let orig = *ORIG_SOFTNIC.get_or_init(|| r);
        assert!(orig as usize == r as usize);
        ops.post_recv = Some(shim_softnic_post_recv);
    }
    SoftRig {
        pair,
        profile,
        region: buf.as_ptr() as u64,
        lkey,
    }
}

/// The device under the ring: a counting device made for this input, or a softnic rig.
enum Dev<'r> {
    Counting(std::pin::Pin<Box<CountingDevice>>),
    Soft(&'r mut SoftRig),
}

/// A `Received` of an earlier input's ring (another brand), for the `Foreign` checks.
static STASH: Mutex<Option<Received>> = Mutex::new(None);

// ---------------------------------------------------------------------------------------
// The recording shim.

type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// The counting device's own entries (the same for every device).
static ORIG: OnceLock<(PostRecvFn, PostSrqRecvFn)> = OnceLock::new();
/// softnic's `post_recv` (the same for every softnic context).
static ORIG_SOFTNIC: OnceLock<PostRecvFn> = OnceLock::new();

/// `ops.post_recv` of the shim in front of softnic.
///
/// # Safety
/// As `ibv_post_recv(3)` on a softnic QP.
unsafe extern "C" fn shim_softnic_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let orig = *ORIG_SOFTNIC.get().expect("shim installed");
    // SAFETY: forwarded contract.
    unsafe { shim(wr, bad, |w, b| orig(qp, w, b)) }
}

/// One WR of a chain as the shim saw it.
#[derive(Clone, Copy, Debug)]
struct SeenWr {
    wr_id: u64,
    num_sge: i32,
    /// The SGE's address, length and lkey.
    sge: (u64, u32, u32),
}

/// What the shim saw of the post calls since the last `take`.
#[derive(Default)]
struct Rec {
    /// Post calls since the last `take`.
    calls: u32,
    /// The last call's chain, whole.
    chain: Vec<SeenWr>,
    /// The last call's result and the index of `*bad_wr` in the chain (None: NULL or not
    /// in the chain).
    rc: c_int,
    bad: Option<usize>,
    /// Armed: the next call refuses the WR at this index with EINVAL.
    refuse: Option<usize>,
}

thread_local! {
    static REC: RefCell<Rec> = RefCell::new(Rec::default());
}

/// Puts the shim in front of `dev`'s receive post entries.
fn install_shim(dev: &CountingDevice) {
    let ctx = dev.context();
    // SAFETY: `ctx` is the live device's context (its ops live in an UnsafeCell, see the
    // counting device's invariants); this thread is its only user, and nothing posts while
    // the entries are swapped.
    unsafe {
        let ops = &mut (*ctx).ops;
        let r = ops.post_recv.expect("post_recv");
        let s = ops.post_srq_recv.expect("post_srq_recv");
        let orig = *ORIG.get_or_init(|| (r, s));
        assert!(orig.0 as usize == r as usize && orig.1 as usize == s as usize);
        ops.post_recv = Some(shim_post_recv);
        ops.post_srq_recv = Some(shim_post_srq_recv);
    }
}

/// `ops.post_recv` of the shim.
///
/// # Safety
/// As `ibv_post_recv(3)` on a counting device's QP.
unsafe extern "C" fn shim_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let orig = ORIG.get().expect("shim installed").0;
    // SAFETY: forwarded contract.
    unsafe { shim(wr, bad, |w, b| orig(qp, w, b)) }
}

/// `ops.post_srq_recv` of the shim.
///
/// # Safety
/// As `ibv_post_srq_recv(3)` on a counting device's SRQ.
unsafe extern "C" fn shim_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let orig = ORIG.get().expect("shim installed").1;
    // SAFETY: forwarded contract.
    unsafe { shim(wr, bad, |w, b| orig(srq, w, b)) }
}

/// Records the chain, applies an armed refusal (the chain is cut before the refused WR for
/// the device and restored after), forwards, records the result.
///
/// # Safety
/// `wr` is a valid NULL-terminated chain of WRs with `num_sge` readable SGEs each and `bad`
/// is writable (the post verbs' contract); `fwd` is the device's verb for them.
unsafe fn shim(
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
    fwd: impl FnOnce(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
) -> c_int {
    REC.with_borrow_mut(|rec| {
        rec.calls += 1;
        rec.chain.clear();
        let mut ptrs = [std::ptr::null_mut::<ibv_recv_wr>(); N + 1];
        let mut p = wr;
        while !p.is_null() {
            assert!(rec.chain.len() < N, "chain longer than the ring");
            // SAFETY: a valid chain (caller); sg_list holds num_sge entries, and the ring
            // always posts one.
            let w = unsafe { &*p };
            assert_eq!(w.num_sge, 1, "receive WR with {} SGEs", w.num_sge);
            // SAFETY: as above.
            let sge = unsafe { *w.sg_list };
            let sge = (sge.addr, sge.length, sge.lkey);
            ptrs[rec.chain.len()] = p;
            rec.chain.push(SeenWr {
                wr_id: w.wr_id,
                num_sge: w.num_sge,
                sge,
            });
            p = w.next;
        }
        let n = rec.chain.len();
        let refuse = rec.refuse.filter(|&k| k < n);
        if refuse.is_some() {
            rec.refuse = None;
        }
        let rc = match refuse {
            None => fwd(wr, bad),
            Some(k) => {
                let rc = if k == 0 {
                    0
                } else {
                    // SAFETY: ptrs[k - 1] is a WR of the chain; its link is restored below.
                    unsafe { (*ptrs[k - 1]).next = std::ptr::null_mut() };
                    let rc = fwd(wr, bad);
                    // SAFETY: as above.
                    unsafe { (*ptrs[k - 1]).next = ptrs[k] };
                    rc
                };
                if rc == 0 {
                    // SAFETY: `bad` is writable (caller).
                    unsafe { *bad = ptrs[k] };
                    libc::EINVAL
                } else {
                    rc
                }
            }
        };
        rec.rc = rc;
        rec.bad = if rc == 0 {
            None
        } else {
            // SAFETY: `bad` was written by the device or above when rc != 0.
            let b = unsafe { *bad };
            ptrs[..n].iter().position(|&q| q == b && !b.is_null())
        };
        rc
    })
}

fn rec_take() -> (u32, Vec<SeenWr>, c_int, Option<usize>) {
    REC.with_borrow_mut(|r| {
        let calls = std::mem::take(&mut r.calls);
        (calls, std::mem::take(&mut r.chain), r.rc, r.bad)
    })
}

// ---------------------------------------------------------------------------------------
// The mirror of the counting device.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cqe {
    wr_id: u64,
    status: ibv_wc_status,
    byte_len: u32,
    imm: Option<u32>,
    /// The byte softnic's sender filled the message with (0: no data).
    stamp: u8,
}

struct Mirror {
    /// None: the counting device; Some: softnic with this profile.
    soft: Option<Profile>,
    /// Receive queue (and SRQ) capacity.
    cap: usize,
    cq_cap: usize,
    rq: VecDeque<u64>,
    srq: VecDeque<u64>,
    cq: VecDeque<Cqe>,
    overflows: u64,
    qp_error: bool,
    use_srq: bool,
    /// `fail_next_post_unnamed` armed.
    unnamed: Option<c_int>,
}

impl Mirror {
    /// Queues a completion; false if the full CQ dropped it.
    fn push_cqe(&mut self, c: Cqe) -> bool {
        if self.cq.len() < self.cq_cap {
            self.cq.push_back(c);
            true
        } else {
            self.overflows += 1;
            false
        }
    }

    fn flush_cqe(&mut self, wr_id: u64) -> Slot {
        let fitted = self.push_cqe(Cqe {
            wr_id,
            status: IBV_WC_WR_FLUSH_ERR,
            byte_len: 0,
            imm: None,
            stamp: 0,
        });
        if fitted {
            Slot::Cq
        } else {
            Slot::Lost
        }
    }

    /// A post of `chain` reaching the device: where each accepted WR went, the result and
    /// the index of the WR named in `*bad_wr`.
    fn post(&mut self, srq: bool, chain: &[SeenWr]) -> (Vec<Slot>, c_int, Option<usize>) {
        let mut fate = Vec::with_capacity(chain.len());
        // softnic's Spec profile in ERR queues the chain (up to the capacity) and flushes
        // what it queued after the post; the counting device flushes each WR at once.
        let flush_after = self.qp_error && !srq && self.soft == Some(Profile::Spec);
        let mut refused = None;
        for (j, w) in chain.iter().enumerate() {
            if srq {
                // The SRQ does not depend on the QP's state.
                if self.srq.len() == self.cap {
                    refused = Some(j);
                    break;
                }
                self.srq.push_back(w.wr_id);
                fate.push(Slot::Device);
            } else if self.qp_error && self.soft.is_none() {
                let f = self.flush_cqe(w.wr_id);
                fate.push(f);
            } else {
                // Queued; in ERR on rxe (G9) it waits there until the next ERR->ERR or
                // RESET (softnic's Rxe profile).
                if self.rq.len() == self.cap {
                    refused = Some(j);
                    break;
                }
                self.rq.push_back(w.wr_id);
                fate.push(Slot::Device);
            }
        }
        if flush_after {
            for f in fate.iter_mut() {
                let id = self.rq.pop_front().expect("queued above");
                *f = self.flush_cqe(id);
            }
        }
        if let Some(j) = refused {
            return (fate, libc::ENOMEM, Some(j));
        }
        match self.unnamed.take() {
            Some(e) => (fate, e, None),
            None => (fate, 0, None),
        }
    }

    /// The QP enters ERR: its own receives are flushed in order (the SRQ's stay); returns
    /// each flushed `wr_id` and where its completion went.
    fn enter_error(&mut self) -> Vec<(u64, Slot)> {
        if self.soft.is_some() && self.qp_error {
            // softnic leaves a QP already in ERR alone.
            return Vec::new();
        }
        self.qp_error = true;
        let mut out = Vec::new();
        while let Some(id) = self.rq.pop_front() {
            let f = self.flush_cqe(id);
            out.push((id, f));
        }
        out
    }

    /// `complete_recv`: the wr_id completed, if any.
    fn complete(&mut self, byte_len: u32, imm: Option<u32>, stamp: u8) -> Option<(u64, bool)> {
        if self.soft.is_some() && self.qp_error {
            // A responder in ERR takes no message.
            return None;
        }
        let q = if self.use_srq {
            &mut self.srq
        } else {
            &mut self.rq
        };
        let id = q.pop_front()?;
        let fitted = self.push_cqe(Cqe {
            wr_id: id,
            status: IBV_WC_SUCCESS,
            byte_len,
            imm,
            stamp,
        });
        Some((id, fitted))
    }
}

// ---------------------------------------------------------------------------------------
// The harness.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// Failed (or never posted): re-posted by `fill` or `reset` only.
    Idle,
    /// Released or reset, waiting for a (re-)post.
    Pending,
    /// On the device's RQ or SRQ.
    Device,
    /// Completed by the device, completion not yet given to the ring (in the CQ or the
    /// harness's inbox).
    Cq,
    /// The completion was dropped by the full CQ: the ring can never learn about it.
    Lost,
    /// Handed to the user.
    User,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Fill,
    Repost,
    Complete { n: u8, len: u16, imm: Option<u32> },
    Poll { max: u8 },
    Deliver { pick: u8, again: bool },
    DeliverAll,
    Release { pick: u8 },
    Data { pick: u8 },
    QpError,
    ResetQp,
    ResetRingInErr,
    Refuse { at: u8 },
    Unnamed { einval: bool },
    Foreign,
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// 0, 1: the counting device; 2: softnic Spec; 3: softnic Rxe.
    device: u8,
    srq: bool,
    count: u8,
    slot_len: u8,
    cap: u8,
    repost_batch: u8,
    ops: Vec<Op>,
}

struct Run<'r> {
    // Declared (so dropped) before the device they use.
    ring: RecvRing<N>,
    poller: CqPoller<POLL_MAX>,
    dev: Dev<'r>,
    /// The ring's registered region and its lkey.
    region: u64,
    lkey: u32,
    /// The byte the data of each slot's last completion was filled with (softnic).
    stamp: [u8; N],
    /// The next message's fill byte.
    next_stamp: u8,
    m: Mirror,
    srq: bool,
    count: u32,
    slot_len: u32,
    batch: u32,
    slots: [Slot; N],
    /// The ring's current `wr_id` tag (bits 63..32).
    tag: u64,
    inbox: Vec<Completion>,
    held: Vec<Received>,
    /// The shim's armed refusal (index in the next chain long enough).
    refuse: Option<usize>,
    /// Ledger: receives the device accepted, and where they went.
    accepted: u64,
    handed_ok: u64,
    handed_err: u64,
    forgotten: u64,
}

fn tag_of(wr_id: u64) -> u64 {
    wr_id >> 32
}

impl Run<'_> {
    fn count_of(&self, s: Slot) -> u32 {
        self.slots[..self.count as usize]
            .iter()
            .filter(|&&x| x == s)
            .count() as u32
    }

    fn verb(&self) -> &'static str {
        if self.srq {
            "ibv_post_srq_recv"
        } else {
            "ibv_post_recv"
        }
    }

    /// Checks what the shim saw against the mirror and the ring's bookkeeping; returns the
    /// `PostError` the ring must report (None: no call, or all accepted with rc 0).
    /// `queued` are the slots the ring had to post (every pending one).
    fn absorb_post(&mut self) -> Option<Result<usize, PostError>> {
        let (calls, chain, rc, bad) = rec_take();
        if calls == 0 {
            return None;
        }
        assert_eq!(calls, 1, "one post call per chain");
        let want_pending = self.count_of(Slot::Pending) as usize;
        assert_eq!(
            chain.len(),
            want_pending,
            "the chain holds every pending slot"
        );
        let mut seen = [false; N];
        for w in &chain {
            let slot = (w.wr_id & 0xFFFF_FFFF) as usize;
            assert!(
                slot < self.count as usize,
                "slot {slot} out of range: {w:?}"
            );
            assert!(!seen[slot], "slot {slot} twice in one chain");
            seen[slot] = true;
            assert_eq!(tag_of(w.wr_id), self.tag, "wr_id tag of {w:?}");
            assert_eq!(w.num_sge, 1);
            assert_eq!(
                w.sge,
                (
                    self.region + slot as u64 * self.slot_len as u64,
                    self.slot_len,
                    self.lkey
                ),
                "SGE of slot {slot}"
            );
            assert_eq!(
                self.slots[slot],
                Slot::Pending,
                "slot {slot} posted while {:?}",
                self.slots[slot]
            );
        }
        // What the device does with it (a refusal by the shim cuts the chain first).
        let shim_k = self.refuse.filter(|&k| k < chain.len());
        if shim_k.is_some() {
            self.refuse = None;
        }
        let (fate, want_rc, want_bad) = match shim_k {
            None => self.m.post(self.srq, &chain),
            Some(k) => match self.m.post(self.srq, &chain[..k]) {
                (fate, 0, None) => (fate, libc::EINVAL, Some(k)),
                refused => refused,
            },
        };
        assert_eq!((rc, bad), (want_rc, want_bad), "post result vs the mirror");
        // The device's answer decides what the ring may believe: the WRs before the named
        // one are posted; with none named, all of them (the counting device then queued
        // them all).
        let believed = match bad {
            Some(k) if rc != 0 => k,
            _ => chain.len(),
        };
        assert_eq!(fate.len(), believed, "WRs the device took");
        for (w, f) in chain.iter().zip(&fate) {
            self.slots[(w.wr_id & 0xFFFF_FFFF) as usize] = *f;
        }
        self.accepted += fate.len() as u64;
        let first = |j: usize| chain[j].wr_id & 0xFFFF_FFFF;
        Some(if rc == 0 {
            Ok(chain.len())
        } else {
            Err(PostError {
                verb: self.verb(),
                errno: rc,
                first_rejected: bad.unwrap_or(PostError::UNKNOWN),
                first_rejected_seq: first(bad.unwrap_or(0)),
            })
        })
    }

    fn check(&self) {
        let m = &self.m;
        match &self.dev {
            Dev::Counting(dev) => {
                assert_eq!(
                    dev.posted_recvs(),
                    m.rq.len() + m.srq.len(),
                    "device receives"
                );
                assert_eq!(dev.posted_srq_recvs(), m.srq.len(), "device SRQ receives");
                assert_eq!(dev.queued_cqes(), m.cq.len(), "device CQ fill");
                assert_eq!(dev.cq_overflows(), m.overflows, "device CQ overflows");
                assert_eq!(dev.qp_in_error(), m.qp_error, "device QP state");
            }
            Dev::Soft(rig) => {
                // SAFETY: the rig's live QP.
                let rq = unsafe { hotverbs_softnic::rq_outstanding(rig.pair.a.qp) };
                assert_eq!(rq as usize, m.rq.len(), "softnic RQ occupancy");
                assert_eq!(
                    rig.pair.a.state() == IBV_QPS_ERR,
                    m.qp_error,
                    "softnic QP state"
                );
            }
        }
        let r = &self.ring;
        assert_eq!(r.count(), self.count);
        assert_eq!(r.held(), self.count_of(Slot::User), "held");
        assert_eq!(r.held() as usize, self.held.len(), "held vs the user's");
        assert_eq!(
            r.posted(),
            self.count_of(Slot::Device) + self.count_of(Slot::Cq) + self.count_of(Slot::Lost),
            "posted"
        );
        assert_eq!(r.pending(), self.count_of(Slot::Pending), "pending");
        // Slots on the device are the mirror's receives of the current tag; older ones
        // are gone (a QP RESET drops them; an SRQ keeps its tag).
        let on_dev =
            m.rq.iter()
                .chain(m.srq.iter())
                .filter(|&&w| tag_of(w) == self.tag)
                .count() as u32;
        assert_eq!(on_dev, self.count_of(Slot::Device), "slots on the device");
        assert_eq!(r.slot_wr_id(0) >> 32, self.tag, "tag");
    }

    fn post_result_fill(&mut self, got: Result<usize, PostError>) {
        match self.absorb_post() {
            None => assert_eq!(got, Ok(0), "nothing to post"),
            Some(want) => assert_eq!(got, want, "post result"),
        }
    }

    /// The ring's answer to a completion, predicted, then checked.
    fn deliver(&mut self, mut c: Completion, again: bool) {
        let wr = c.wr_id();
        let slot = (wr & 0xFFFF_FFFF) as usize;
        let ours =
            tag_of(wr) == self.tag && slot < self.count as usize && self.slots[slot] == Slot::Cq;
        let got = self.ring.on_completion(&mut c);
        if !ours {
            assert_eq!(got, Err(RecvError::Stale { wr_id: wr }), "stale {c:?}");
        } else {
            match c.status() {
                Ok(()) => {
                    let m = got.unwrap_or_else(|e| panic!("completion of slot {slot}: {e:?}"));
                    assert_eq!(m.slot() as usize, slot);
                    assert_eq!(m.byte_len(), c.byte_len());
                    assert_eq!(m.imm(), c.imm());
                    self.slots[slot] = Slot::User;
                    self.handed_ok += 1;
                    self.held.push(m);
                }
                Err(error) => {
                    assert_eq!(
                        got,
                        Err(RecvError::Completion {
                            slot: slot as u32,
                            error
                        }),
                        "failed receive"
                    );
                    self.slots[slot] = Slot::Idle;
                    self.handed_err += 1;
                }
            }
            // An accepted completion is spent.
            let again_got = self.ring.on_completion(&mut c);
            assert!(
                matches!(again_got, Err(RecvError::Stale { .. })),
                "a completion given twice: {again_got:?}"
            );
            return;
        }
        if again {
            let g = self.ring.on_completion(&mut c);
            assert_eq!(g, Err(RecvError::Stale { wr_id: wr }), "stale twice");
        }
    }

    fn poll(&mut self, max: usize) {
        let mut buf = [const { Completion::PLACEHOLDER }; POLL_MAX];
        let n = self.poller.poll_into(&mut buf[..max]).expect("poll_cq");
        for c in buf.iter_mut().take(n) {
            let want = self
                .m
                .cq
                .pop_front()
                .expect("a completion the mirror expects");
            let wc = c.as_raw();
            let got = Cqe {
                wr_id: wc.wr_id,
                status: wc.status,
                byte_len: if wc.status == IBV_WC_SUCCESS {
                    wc.byte_len
                } else {
                    // Undefined for errors (ibv_poll_cq(3)).
                    0
                },
                imm: c.imm(),
                stamp: want.stamp,
            };
            assert_eq!(got, want, "completion order and contents");
            // A completion of a slot of the current tag: the device is done with it.
            let slot = (wc.wr_id & 0xFFFF_FFFF) as usize;
            if tag_of(wc.wr_id) == self.tag && slot < self.count as usize {
                assert_eq!(self.slots[slot], Slot::Cq);
                self.stamp[slot] = want.stamp;
            }
            self.inbox
                .push(std::mem::replace(c, Completion::PLACEHOLDER));
        }
        assert!(n == max || self.m.cq.is_empty(), "poll returned too few");
    }

    fn deliver_all(&mut self) {
        loop {
            while let Some(c) = self.inbox.pop() {
                self.deliver(c, false);
            }
            if self.m.cq.is_empty() {
                return;
            }
            self.poll(POLL_MAX);
        }
    }

    /// The device completes the oldest receive (a message of `len` bytes arrives).
    fn complete(&mut self, len: u32, imm: Option<u32>) -> bool {
        let stamp = self.next_stamp;
        self.next_stamp = self.next_stamp.wrapping_add(1).max(1);
        let (len, stamp) = match self.dev {
            Dev::Counting(_) => (len % 100, 0),
            // A message longer than the slot would fail both sides (LOC_LEN_ERR).
            Dev::Soft(_) => (len % (self.slot_len + 1), stamp),
        };
        let id = self.m.complete(len, imm, stamp);
        let ok = match &mut self.dev {
            Dev::Counting(dev) => dev.complete_recv(len, imm),
            Dev::Soft(rig) => {
                if id.is_some() {
                    soft_send(rig, len, imm, stamp);
                }
                id.is_some()
            }
        };
        assert_eq!(ok, id.is_some(), "complete_recv");
        if let Some((id, fitted)) = id {
            let slot = (id & 0xFFFF_FFFF) as usize;
            if tag_of(id) == self.tag {
                assert_eq!(self.slots[slot], Slot::Device);
                self.slots[slot] = if fitted { Slot::Cq } else { Slot::Lost };
            }
        }
        ok
    }

    fn release(&mut self, pick: usize) {
        let m = self.held.swap_remove(pick);
        let slot = m.slot() as usize;
        assert_eq!(self.slots[slot], Slot::User);
        self.slots[slot] = Slot::Pending;
        let repost = self.count_of(Slot::Pending) >= self.batch;
        let got = self.ring.release(m);
        match self.absorb_post() {
            None => {
                assert!(!repost, "release of the batch-th slot did not re-post");
                assert_eq!(got, Ok(()));
            }
            Some(want) => {
                assert!(repost, "re-posted before the batch was complete");
                assert_eq!(got, want.map(|_| ()).map_err(RecvError::Post), "release");
            }
        }
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Fill => {
                for s in &mut self.slots[..self.count as usize] {
                    if *s == Slot::Idle {
                        *s = Slot::Pending;
                    }
                }
                let got = self.ring.fill();
                self.post_result_fill(got);
            }
            Op::Repost => {
                let got = self.ring.repost();
                self.post_result_fill(got);
            }
            Op::Complete { n, len, imm } => {
                for _ in 0..n % 4 + 1 {
                    if !self.complete(len as u32 % 100, imm) {
                        break;
                    }
                }
            }
            Op::Poll { max } => self.poll(max as usize % POLL_MAX + 1),
            Op::Deliver { pick, again } => {
                if !self.inbox.is_empty() {
                    let c = self.inbox.swap_remove(pick as usize % self.inbox.len());
                    self.deliver(c, again);
                }
            }
            Op::DeliverAll => self.deliver_all(),
            Op::Release { pick } => {
                if !self.held.is_empty() {
                    self.release(pick as usize % self.held.len());
                }
            }
            Op::Data { pick } => {
                if let Some(m) = self.held.get(pick as usize % self.held.len().max(1)) {
                    let d = self.ring.data(m).expect("data of a held slot");
                    assert_eq!(
                        d.as_ptr() as u64,
                        self.region + m.slot() as u64 * self.slot_len as u64,
                        "data() address"
                    );
                    if matches!(self.dev, Dev::Soft(_)) {
                        // softnic wrote the message there: this slot's own, untouched since.
                        let want = self.stamp[m.slot() as usize];
                        assert!(d.iter().all(|&b| b == want), "data() of slot {}", m.slot());
                    }
                    assert_eq!(
                        d.len() as u32,
                        m.byte_len().min(self.slot_len),
                        "data() length"
                    );
                }
            }
            Op::QpError => {
                match &self.dev {
                    Dev::Counting(dev) => dev.set_qp_error(),
                    // SAFETY: the rig's live QP.
                    Dev::Soft(rig) => unsafe { hotverbs_softnic::inject_qp_error(rig.pair.a.qp) },
                }
                for (id, fate) in self.m.enter_error() {
                    if tag_of(id) == self.tag {
                        let slot = (id & 0xFFFF_FFFF) as usize;
                        assert_eq!(self.slots[slot], Slot::Device);
                        self.slots[slot] = fate;
                    }
                }
            }
            Op::ResetQp => {
                if self.srq {
                    // reset()'s contract on an SRQ: every receive taken off the SRQ has
                    // completed and was given to the ring.
                    self.deliver_all();
                }
                match &self.dev {
                    Dev::Counting(dev) => dev.reset_qp(),
                    Dev::Soft(rig) => {
                        rig.pair.to_reset(rig.pair.a.qp);
                        rig.pair.connect(rig.pair.a.qp, rig.pair.b.qpn(), 7);
                    }
                }
                self.m.qp_error = false;
                self.m.rq.clear();
                self.reset_ring();
            }
            Op::ResetRingInErr => {
                // reset()'s other contract on a QP: in ERR with every flush given.
                if !self.srq && self.m.qp_error {
                    self.deliver_all();
                    // (Receives rxe holds in ERR are still on the device: no reset then.)
                    if self.count_of(Slot::Lost) + self.count_of(Slot::Device) == 0 {
                        self.reset_ring();
                    }
                }
            }
            Op::Refuse { at } => {
                if self.m.unnamed.is_none() && self.refuse.is_none() {
                    let k = at as usize % N;
                    REC.with_borrow_mut(|r| r.refuse = Some(k));
                    self.refuse = Some(k);
                }
            }
            Op::Unnamed { einval } => {
                if let (Dev::Counting(dev), None, None) = (&self.dev, self.refuse, self.m.unnamed) {
                    let e = if einval { libc::EINVAL } else { libc::EAGAIN };
                    dev.fail_next_post_unnamed(e);
                    self.m.unnamed = Some(e);
                }
            }
            Op::Foreign => {
                let stash = STASH.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(f) = stash.as_ref() {
                    let slot = f.slot();
                    assert_eq!(self.ring.data(f), Err(RecvError::Foreign { slot }));
                }
            }
        }
        self.check();
    }
}

impl Run<'_> {
    /// `RecvRing::reset` after the device dropped (QP) or kept (SRQ) the ring's receives.
    fn reset_ring(&mut self) {
        let old_tag = self.tag;
        // Completions still in the CQ or the inbox become stale on a QP (new generation);
        // on an SRQ the tag stays and so does what is posted.
        let mut want = 0;
        for s in &mut self.slots[..self.count as usize] {
            let requeue = match *s {
                Slot::User => false,
                Slot::Device | Slot::Cq | Slot::Lost => !self.srq || cfg!(feature = "planted-bug"),
                Slot::Idle | Slot::Pending => true,
            };
            if requeue {
                if matches!(*s, Slot::Device | Slot::Cq | Slot::Lost) {
                    self.forgotten += 1;
                }
                *s = Slot::Pending;
                want += 1;
            }
        }
        // SAFETY: QP target: the QP went through RESET (the device dropped its receives) or
        // is in ERR with every flush completion given (`ResetRingInErr`). SRQ target: every
        // receive the device took off the SRQ completed and was given (`deliver_all`).
        let got = unsafe { self.ring.reset() };
        assert_eq!(got, want, "slots queued by reset");
        self.tag = self.ring.slot_wr_id(0) >> 32;
        if self.srq {
            assert_eq!(self.tag, old_tag, "an SRQ ring keeps its generation");
        } else {
            assert_ne!(self.tag, old_tag, "a QP ring changes its generation");
            assert_eq!(
                self.tag >> 23,
                old_tag >> 23,
                "ring id and receive bit stay"
            );
        }
    }

    /// Gives every completion, releases every slot, re-posts; then checks the ledger.
    fn finish(&mut self) {
        // Rounds of: give every completion, release every slot (through the same path: it
        // may re-post, and be refused by a full queue or the shim; refused slots stay
        // pending), re-post. A QP in ERR flushes each re-post at once, so this settles
        // within a few rounds.
        for _ in 0..4 {
            self.deliver_all();
            while !self.held.is_empty() {
                self.release(self.held.len() - 1);
                self.check();
            }
            let got = self.ring.repost();
            self.post_result_fill(got);
            self.check();
            if self.m.cq.is_empty() {
                break;
            }
        }
        self.deliver_all();
        self.check();
        let out = self.count_of(Slot::Device) + self.count_of(Slot::Cq) + self.count_of(Slot::Lost);
        assert_eq!(
            self.accepted,
            self.handed_ok + self.handed_err + self.forgotten + out as u64,
            "receives accepted = handed out + failed + forgotten by reset + still out \
             (ok {}, err {}, forgotten {}, out {out})",
            self.handed_ok,
            self.handed_err,
            self.forgotten
        );
        // Nothing leaks: every slot is on the device (or its completion was lost), pending
        // because the device refused it, or idle after a failed receive.
        assert_eq!(self.count_of(Slot::User) + self.count_of(Slot::Cq), 0);
        // A `Received` of this ring for the next input's Foreign check (the ring, the
        // device and this run end here).
        let mut stash = STASH.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = stash.take() {
            let slot = old.slot();
            match self.ring.try_release(old) {
                // Handed back untouched (its ring is gone: dropped here).
                Err(ReleaseError::Foreign(back)) => assert_eq!(back.slot(), slot),
                other => panic!("another ring's Received released: {other:?}"),
            }
        }
        if self.complete(7, None) {
            self.deliver_all();
            *stash = self.held.pop();
        }
    }
}

/// softnic: B sends one message of `len` bytes of `stamp` (with `imm`) to A and its
/// completion is polled (A has a receive posted: the caller's mirror says so).
fn soft_send(rig: &SoftRig, len: u32, imm: Option<u32>, stamp: u8) {
    let payload = [stamp; MAX_SLOT as usize];
    let mut sge = ibv_sge {
        addr: payload.as_ptr() as u64,
        length: len,
        lkey: 0,
    };
    let mut wr = ibv_send_wr {
        wr_id: 7,
        sg_list: &mut sge,
        num_sge: 1,
        opcode: if imm.is_some() {
            IBV_WR_SEND_WITH_IMM
        } else {
            IBV_WR_SEND
        },
        send_flags: IBV_SEND_INLINE | IBV_SEND_SIGNALED,
        ..Default::default()
    };
    wr.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
    let mut bad = std::ptr::null_mut();
    // SAFETY: B is the rig's live QP; a one-WR chain with one inline SGE of `len` <= 64
    // bytes (B's max_inline_data), read during the call.
    let rc = unsafe { hotverbs_ffi::inline::ibv_post_send(rig.pair.b.qp, &mut wr, &mut bad) };
    assert_eq!(rc, 0, "post_send at B");
    let wcs = rig.pair.b.poll_all();
    assert!(
        wcs.len() == 1 && wcs[0].status == IBV_WC_SUCCESS,
        "B's send: {:?}",
        wcs.iter().map(|w| w.status).collect::<Vec<_>>()
    );
}

/// The receive queue capacity softnic gives a QP created with `SOFT_RQ` (rxe rounds up to
/// 2^k - 1, S3/S4).
fn soft_rq_cap(profile: Profile) -> usize {
    if profile == Profile::Rxe {
        ((SOFT_RQ + 1).next_power_of_two() - 1) as usize
    } else {
        SOFT_RQ as usize
    }
}

fuzz_target!(|input: Input| {
    let count = (input.count as u32 % N as u32) + 1;
    let slot_len = [1, 8, 24, MAX_SLOT][input.slot_len as usize % 4];
    let batch = (input.repost_batch as u32 % count) + 1;
    // Half the inputs on the counting device, a quarter on each softnic profile.
    let profile = match input.device % 4 {
        2 => Some(Profile::Spec),
        3 => Some(Profile::Rxe),
        _ => None,
    };
    let mut guard = profile.map(|p| {
        SOFT_RIGS[(p == Profile::Rxe) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    });
    let (dev, target, cq, region, lkey, cap, cq_cap, srq) = match (profile, guard.as_mut()) {
        (Some(p), Some(g)) => {
            let rig = g.get_or_insert_with(|| soft_rig(p));
            assert_eq!(rig.profile, p);
            // A fresh start: both QPs through RESET (A's receives are dropped) to RTS, both
            // CQs empty.
            rig.pair.to_reset(rig.pair.a.qp);
            rig.pair.to_reset(rig.pair.b.qp);
            rig.pair.connect(rig.pair.a.qp, rig.pair.b.qpn(), 7);
            rig.pair.connect(rig.pair.b.qp, rig.pair.a.qpn(), 7);
            rig.pair.a.poll_all();
            rig.pair.b.poll_all();
            let (qp, cq, region, lkey) = (rig.pair.a.qp, rig.pair.a.cq, rig.region, rig.lkey);
            (
                Dev::Soft(rig),
                RecvTarget::Qp(qp),
                cq,
                region,
                lkey,
                soft_rq_cap(p),
                4096,
                false,
            )
        }
        _ => {
            let cap = (input.cap as usize % (N + 4)) + 1;
            let dev = CountingDevice::new(cap);
            install_shim(&dev);
            dev.use_srq(input.srq);
            let target = if input.srq {
                RecvTarget::Srq(dev.srq())
            } else {
                RecvTarget::Qp(dev.qp())
            };
            let cq = dev.cq();
            (
                Dev::Counting(dev),
                target,
                cq,
                region(),
                LKEY,
                cap,
                cap,
                input.srq,
            )
        }
    };
    let region_buf = LocalBuf::new(region, N as u32 * MAX_SLOT, lkey);
    let cfg = RecvConfig::new(RING_ID, slot_len, count).repost_batch(batch);
    // SAFETY: the device outlives the ring (the counting device is dropped after it, the
    // softnic rig lives for the process) and only this ring posts receives to it; the region
    // is leaked memory only the ring reads and only the device writes (softnic: registered
    // in the rig's PD with LOCAL_WRITE; the counting device never writes).
    let ring = unsafe { RecvRing::<N>::new(target, region_buf, cfg) }.expect("valid config");
    // SAFETY: the device's CQ lives as long as the run; only this poller polls it.
    let poller = unsafe { CqPoller::new(cq) };
    let tag = ring.slot_wr_id(0) >> 32;
    REC.with_borrow_mut(|r| *r = Rec::default());
    let mut run = Run {
        dev,
        ring,
        poller,
        region,
        lkey,
        stamp: [0; N],
        next_stamp: 1,
        m: Mirror {
            soft: profile,
            cap,
            cq_cap,
            rq: VecDeque::new(),
            srq: VecDeque::new(),
            cq: VecDeque::new(),
            overflows: 0,
            qp_error: false,
            use_srq: srq,
            unnamed: None,
        },
        srq,
        count,
        slot_len,
        batch,
        slots: [Slot::Idle; N],
        tag,
        inbox: Vec::new(),
        held: Vec::new(),
        refuse: None,
        accepted: 0,
        handed_ok: 0,
        handed_err: 0,
        forgotten: 0,
    };
    run.check();
    for op in input.ops.iter().take(MAX_OPS) {
        run.step(op);
    }
    run.finish();
    // Dropped field by field: the ring and the poller before the device they use.
});
