//! `SendRing` in split mode on a softnic RC QP pair: the poster side (`SendRing` +
//! `sync` with its `SendCounters`) and the completion side (`CqPoller` + `SendRetirer`)
//! driven in arbitrary interleavings on one thread: send_now / batches (finished or
//! dropped) / flush / flush_signaled / signal_next, `sync`, polls, delivery of polled
//! completions to the retirer in any order, receives posted at the peer, QP errors, QP
//! RESET + ring reset + a new split, and (Rxe profile) completions dropped by a full CQ.
//! The input picks the softnic profile (`Spec` or `Rxe`, one device of each per process).
//!
//! The checker keeps a ledger of every sequence number (staged, posted, retired, dropped by
//! a reset) from the ring's answers and the completions; it does not re-implement the ring
//! and depends on nothing that differs between the profiles (not the opcode of error
//! completions, not whether a full CQ errors or drops: `Spec` never gets an overflow).
//!
//! Invariants checked after every step:
//! - every WR is retired exactly once (by its own completion or a later one's, through the
//!   retirer's window) or dropped by a reset, and never before it was posted; a completion
//!   outside the retirer's window (stale, from before a reset, or covered by a later one
//!   delivered first) retires nothing; the retirer's result is the number it retired (or
//!   the error of the completion), and the counters publish the retirer's count and its
//!   first error;
//! - counts never go negative or over depth: retired (ring) <= retired (retirer) <= posted
//!   <= staged, staged - retired <= depth, softnic's SQ occupancy <= the WRs the retirer
//!   has not retired; after `sync` the ring's retired count and error equal the retirer's,
//!   and the counters show the ring's posted count;
//! - completions of one QP incarnation come in sequence order, each for a posted WR, at
//!   most once, and after an error only flushes follow;
//! - a refused post (an inline message over the QP's `max_inline_data`, see below) names
//!   exactly that WR, the WRs before it stay posted and the rest are dropped; a dropped
//!   batch's refusal is reported by the next `flush`; the counts stay consistent;
//! - stage results: `WouldBlock` only when full, `QpError` only after `sync` saw an error,
//!   consecutive sequence numbers otherwise; a full ring has a signaled WR in flight;
//! - at the end, padding with a signaled empty write (or a reset, when the QP failed or a
//!   completion was lost) leaves nothing outstanding: no deadlock, no WR lost.
//!
//! As in `ring`, the QP is created with `max_inline_data` 32 and the ring is told 64, so
//! inline messages of 33..=64 bytes are refused by `ibv_post_send` at their chain index.
//!
//! Planted bug (`--features planted-bug`): after a reset the harness keeps the old
//! retirer and only resets the counters (`SendCounters::reset`), instead of making a new
//! pair with `split()` as `SendRing::reset` requires: the old retirer's window still takes
//! completions of WRs the reset dropped.
#![no_main]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::sync::Mutex;

use arbitrary::Arbitrary;
use hotverbs_datapath::*;
use hotverbs_ffi::*;
use hotverbs_fuzz::{post_one_recv, Pair, PairConfig, ALL_ACCESS};
use hotverbs_softnic::Profile;
use libfuzzer_sys::fuzz_target;

const N: usize = 16;
/// The QP's `cap.max_inline_data`.
const QP_INLINE: u32 = 32;
/// What the ring is told (deliberately more, see the module doc).
const RING_INLINE: u32 = 64;
const SQ_CAP: u32 = 16;
const RQ_CAP: u32 = 64;
const B_BUF: usize = 4096;
const RECV_SLOT: usize = 64;
const MAX_OPS: usize = 48;
const POLL_MAX: usize = 8;
const RING_ID: u8 = 5;

static PAYLOAD: [u8; 80] = [0x5a; 80];

struct Rig {
    pair: Pair,
    b_buf: &'static mut [u8],
    b_key: u32,
    b_recv_ids: u64,
}

/// One rig per profile (softnic never reuses QP numbers: build once, reset per input).
static RIGS: [Mutex<Option<Rig>>; 2] = [Mutex::new(None), Mutex::new(None)];

fn rig(profile: Profile) -> Rig {
    let pair = Pair::with_profile(
        PairConfig {
            sq_depth: SQ_CAP,
            rq_depth: RQ_CAP,
            max_sge: 1,
            max_inline: QP_INLINE,
            cq_size: 4096,
            rnr_retry_a: 0,
            qp_type: IBV_QPT_RC,
        },
        profile,
    );
    let b_buf: &'static mut [u8] = Box::leak(vec![0u8; B_BUF].into_boxed_slice());
    // SAFETY: the leaked buffer lives for the rest of the process.
    let mr = unsafe { pair.reg(pair.pd, b_buf.as_mut_ptr(), B_BUF, ALL_ACCESS) };
    // SAFETY: an MR returned non-NULL by ibv_reg_mr.
    let b_key = unsafe { (*mr).rkey };
    Rig {
        pair,
        b_buf,
        b_key,
        b_recv_ids: 0,
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct MsgSpec {
    /// SEND (consumes a receive at B; RNR error without one) or RDMA WRITE.
    send: bool,
    len: u8,
}

#[derive(Arbitrary, Debug)]
enum Op {
    SendNow(MsgSpec),
    Batch {
        msgs: [MsgSpec; 4],
        n: u8,
        finish: bool,
    },
    Flush,
    FlushSignaled,
    SignalNext,
    Sync,
    Poll {
        max: u8,
    },
    Deliver {
        pick: u8,
    },
    DeliverAll,
    PostRecvB(u8),
    InjectError,
    Reset,
    Overflow(u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    rxe: bool,
    depth_log: u8,
    k: u8,
    batch: u8,
    ops: Vec<Op>,
}

/// What happened to one sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    /// Staged (not posted); `refused`: softnic will reject it (inline over its cap).
    Staged {
        refused: bool,
    },
    Posted,
    Retired,
    /// Posted, then forgotten by a reset.
    Dropped,
}

fn inline_len(m: &MsgSpec) -> usize {
    m.len as usize % 72
}

fn msg(m: &MsgSpec) -> Msg<'static> {
    let local = Local::Inline(&PAYLOAD[..inline_len(m)]);
    if m.send {
        Msg::send(local)
    } else {
        Msg::write(local, 0)
    }
}

struct Run<'r> {
    rig: &'r mut Rig,
    rnr_retry: u8,
    depth: u64,
    ring: SendRing<N>,
    counters: SendCounters,
    retirer: SendRetirer,
    inbox: Vec<Completion>,
    life: Vec<Life>,
    /// The retirer's count as the ledger sees it.
    r: u64,
    /// First error the retirer reported since the last split; the ring's first error.
    err: Option<WcError>,
    ring_err: Option<WcError>,
    /// The current QP incarnation starts at this sequence number.
    inc_start: u64,
    /// Last sequence polled in this incarnation, and whether an error was polled.
    last_polled: Option<u64>,
    polled_error: bool,
    /// A dropped batch's refusal, to be reported by the next flush.
    deferred: Option<u64>,
    /// Completions were dropped by the CQ (Rxe overflow): a stall is then legitimate.
    lost: bool,
}

impl Run<'_> {
    /// Absorbs a stage result: `Ok(seq)` must be the next sequence number.
    fn staged(&mut self, m: &MsgSpec, got: Result<u64, SendError>) {
        let len = inline_len(m);
        match got {
            Ok(seq) => {
                assert!(
                    len as u32 <= RING_INLINE,
                    "staged an over-long inline message"
                );
                assert_eq!(seq, self.life.len() as u64, "consecutive sequence numbers");
                self.life.push(Life::Staged {
                    refused: len as u32 > QP_INLINE,
                });
            }
            Err(SendError::InlineTooLong { len: l, max }) => {
                assert_eq!((l, max), (len, RING_INLINE));
            }
            Err(e @ SendError::Post(_)) => {
                // The message was staged (with the next number) and its automatic flush
                // failed: it is the last WR of the refused chain, so it is dropped.
                self.life.push(Life::Staged {
                    refused: len as u32 > QP_INLINE,
                });
                self.refused(e);
            }
            Err(e) => self.refused(e),
        }
    }

    /// A post failure or back-pressure from any call.
    fn refused(&mut self, e: SendError) {
        match e {
            SendError::Post(p) => {
                assert_eq!(p.verb, "ibv_post_send");
                assert_eq!(p.errno, libc::EINVAL, "{p}");
                assert_ne!(p.first_rejected, PostError::UNKNOWN, "softnic names the WR");
                let s = p.first_rejected_seq;
                assert_eq!(
                    self.life.get(s as usize),
                    Some(&Life::Staged { refused: true }),
                    "refused seq {s}: {:?}",
                    self.life.get(s as usize)
                );
                for q in s - p.first_rejected as u64..s {
                    assert_eq!(self.life[q as usize], Life::Staged { refused: false });
                    self.life[q as usize] = Life::Posted;
                }
                // The rest of the chain is dropped (the numbers are handed out again).
                self.life.truncate(s as usize);
            }
            SendError::WouldBlock => {
                assert!(self.ring_err.is_none(), "WouldBlock in error state");
            }
            SendError::QpError(e) => {
                assert_eq!(Some(e), self.ring_err, "QpError without sync seeing it");
            }
            other => panic!("unexpected send error {other:?}"),
        }
    }

    /// The result of `flush` / `flush_signaled`: first the refusal a dropped batch
    /// deferred (nothing is posted then), else that of posting what is staged.
    fn flushed(&mut self, got: Result<(), SendError>) {
        if let Some(s) = self.deferred.take() {
            assert!(
                matches!(got, Err(SendError::Post(p)) if p.first_rejected_seq == s && p.errno == libc::EINVAL),
                "deferred refusal of seq {s}: {got:?}"
            );
            return;
        }
        if let Err(e) = got {
            self.refused(e);
        }
    }

    /// Reconciles the ledger with the ring's posted / staged counts after a call.
    fn reconcile(&mut self) {
        let posted = self.ring.posted_total();
        let staged = self.ring.staged();
        for q in 0..posted.min(self.life.len() as u64) {
            if let Life::Staged { refused } = self.life[q as usize] {
                assert!(!refused, "seq {q} posted although softnic refuses it");
                self.life[q as usize] = Life::Posted;
            }
        }
        if (self.life.len() as u64) > posted + staged {
            // A post failed without reporting (a dropped batch): its refusal is deferred.
            assert_eq!(staged, 0);
            assert_eq!(
                self.life[posted as usize],
                Life::Staged { refused: true },
                "silently dropped seq {posted}"
            );
            // (A later dropped batch's refusal replaces an unreported one.)
            self.deferred = Some(posted);
            self.life.truncate(posted as usize);
        }
        assert_eq!(self.life.len() as u64, posted + staged, "ledger length");
    }

    fn check(&mut self) {
        self.reconcile();
        let ring = &self.ring;
        let posted = ring.posted_total();
        assert!(ring.retired_total() <= self.r, "ring ahead of the retirer");
        assert!(self.r <= posted, "retired beyond posted");
        assert_eq!(self.retirer.retired(), self.r, "retirer count");
        assert_eq!(self.counters.observe_retired(), self.r, "published retired");
        assert_eq!(self.counters.observe_error(), self.err, "published error");
        assert!(
            ring.outstanding() + ring.staged() <= self.depth,
            "over depth"
        );
        assert!(posted - self.r <= self.depth, "retirer window over depth");
        // SAFETY: a live softnic QP.
        let occ = unsafe { hotverbs_softnic::sq_outstanding(self.rig.pair.a.qp) } as u64;
        assert!(
            occ <= posted - self.r,
            "softnic holds {occ} SQ slots, {} not retired",
            posted - self.r
        );
        if ring.error().is_none() && ring.free() == 0 {
            assert!(ring.signaled_in_flight(), "full ring without a signaled WR");
            assert_eq!(ring.staged(), 0, "a full ring has flushed");
        }
        assert_eq!(ring.error(), self.ring_err, "ring error");
    }

    fn sync(&mut self) {
        self.ring.sync(&self.counters);
        assert_eq!(self.ring.retired_total(), self.r, "retired after sync");
        if self.ring_err.is_none() {
            self.ring_err = self.err;
        }
        assert_eq!(self.counters.observe_posted(), self.ring.posted_total());
    }

    fn poll(&mut self, max: usize) -> usize {
        let mut buf = [const { Completion::PLACEHOLDER }; POLL_MAX];
        let mut poller =
            // SAFETY: A's CQ lives for the process; nothing else polls it meanwhile.
            unsafe { CqPoller::<POLL_MAX>::new(self.rig.pair.a.cq) };
        let n = poller.poll_into(&mut buf[..max]).expect("poll_cq");
        let qpn = self.rig.pair.a.qpn();
        for c in buf.iter_mut().take(n) {
            assert_eq!(c.qp_num(), qpn, "{c:?}");
            assert_eq!(c.ring(), RING_ID, "{c:?}");
            assert!(!wr_id::is_recv(c.wr_id()), "{c:?}");
            let s = c.seq();
            if s >= self.inc_start {
                assert!(
                    self.life.get(s as usize) == Some(&Life::Posted),
                    "completion of seq {s}: {:?}",
                    self.life.get(s as usize)
                );
                if let Some(l) = self.last_polled {
                    assert!(s > l, "completion order: {s} after {l}");
                }
                self.last_polled = Some(s);
                match c.status() {
                    Ok(()) => assert!(!self.polled_error, "success after an error"),
                    Err(e) => {
                        if self.polled_error {
                            assert_eq!(e, WcError::WrFlush, "after an error only flushes");
                        }
                        self.polled_error = true;
                    }
                }
            }
            self.inbox
                .push(std::mem::replace(c, Completion::PLACEHOLDER));
        }
        n
    }

    fn deliver(&mut self, c: Completion) {
        let s = c.seq();
        let got = self.retirer.on_completion(&c, &self.counters);
        let want = if s >= self.r && s < self.r + self.depth {
            for q in self.r..=s {
                assert_eq!(
                    self.life[q as usize],
                    Life::Posted,
                    "seq {q} retired by seq {s}'s completion"
                );
                self.life[q as usize] = Life::Retired;
            }
            let n = s + 1 - self.r;
            self.r = s + 1;
            match c.status() {
                Ok(()) => Ok(n),
                Err(e) => {
                    self.err = self.err.or(Some(e));
                    Err(e)
                }
            }
        } else {
            Ok(0)
        };
        assert_eq!(got, want, "retirer on seq {s} (window from {})", self.r);
    }

    fn deliver_all(&mut self) {
        loop {
            while let Some(c) = self.inbox.pop() {
                self.deliver(c);
            }
            if self.poll(POLL_MAX) == 0 {
                return;
            }
        }
    }

    fn reset(&mut self) {
        self.rig.pair.to_reset(self.rig.pair.a.qp);
        let before = self.ring.retired_total();
        // SAFETY: the QP was just moved to RESET, so softnic dropped every WR of the ring;
        // the old retirer is not used after this (a new split below).
        let dropped = unsafe { self.ring.reset() };
        assert_eq!(dropped, self.life.len() as u64 - before, "reset's count");
        let posted = self.ring.posted_total();
        for q in self.r..posted {
            assert_eq!(self.life[q as usize], Life::Posted);
            self.life[q as usize] = Life::Dropped;
        }
        self.life.truncate(posted as usize);
        if cfg!(feature = "planted-bug") {
            // SAFETY: `posted` is the ring's posted_total right after its reset.
            unsafe { self.counters.reset(posted) };
        } else {
            (self.counters, self.retirer) = self.ring.split();
            self.r = posted;
        }
        self.err = None;
        self.ring_err = None;
        self.deferred = None;
        self.inc_start = posted;
        self.last_polled = None;
        self.polled_error = false;
        self.rig
            .pair
            .connect(self.rig.pair.a.qp, self.rig.pair.b.qpn(), self.rnr_retry);
    }

    fn post_recvs_b(&mut self, n: u32) {
        // SAFETY: a live softnic QP.
        let have = unsafe { hotverbs_softnic::rq_outstanding(self.rig.pair.b.qp) };
        let rig = &mut *self.rig;
        for _ in 0..n.min(RQ_CAP - have) {
            let slot = (rig.b_recv_ids % (B_BUF / RECV_SLOT) as u64) as usize;
            let addr = rig.b_buf.as_ptr() as u64 + (slot * RECV_SLOT) as u64;
            // SAFETY: live QP; the leaked buffer stays registered for the process.
            let rc = unsafe {
                post_one_recv(
                    rig.pair.b.qp,
                    rig.b_recv_ids,
                    addr,
                    RECV_SLOT as u32,
                    rig.b_key,
                )
            };
            assert_eq!(rc, 0, "post_recv at B");
            rig.b_recv_ids += 1;
        }
    }

    fn step(&mut self, op: &Op, rxe: bool) {
        match op {
            Op::SendNow(m) => {
                let full = self.ring.free() == 0;
                let got = self.ring.send_now(msg(m));
                assert_eq!(
                    full,
                    matches!(got, Err(SendError::WouldBlock | SendError::QpError(_))),
                    "send_now refused iff the ring is full (or failed): {got:?}"
                );
                self.staged(m, got);
            }
            Op::Batch { msgs, n, finish } => {
                let mut results = [None; 4];
                let fin = {
                    let mut b = self.ring.batch();
                    for (i, m) in msgs.iter().take(*n as usize % 5).enumerate() {
                        results[i] = Some(b.push(msg(m)));
                    }
                    if *finish {
                        Some(b.finish())
                    } else {
                        // Dropped: posts what is staged; a refusal is reported by the next
                        // flush (see `reconcile`).
                        drop(b);
                        None
                    }
                };
                for (m, r) in msgs.iter().zip(results) {
                    if let Some(r) = r {
                        self.staged(m, r);
                    }
                }
                if let Some(Err(e)) = fin {
                    self.refused(e);
                }
            }
            Op::Flush => {
                let got = self.ring.flush();
                self.flushed(got);
            }
            Op::FlushSignaled => {
                let got = self.ring.flush_signaled().map(|_| ());
                self.flushed(got);
            }
            Op::SignalNext => self.ring.signal_next(),
            Op::Sync => self.sync(),
            Op::Poll { max } => {
                self.poll(*max as usize % POLL_MAX + 1);
            }
            Op::Deliver { pick } => {
                if !self.inbox.is_empty() {
                    let c = self.inbox.swap_remove(*pick as usize % self.inbox.len());
                    self.deliver(c);
                }
            }
            Op::DeliverAll => self.deliver_all(),
            Op::PostRecvB(n) => self.post_recvs_b(*n as u32 % 8),
            Op::InjectError => {
                // SAFETY: a live softnic QP.
                unsafe { hotverbs_softnic::inject_qp_error(self.rig.pair.a.qp) };
            }
            Op::Reset => self.reset(),
            Op::Overflow(n) => {
                // Spec: an overflow puts the CQ in the error state for good, which would
                // end the rig; only Rxe drops and carries on.
                if rxe {
                    // SAFETY: a live softnic CQ.
                    unsafe {
                        hotverbs_softnic::inject_cq_overflow(self.rig.pair.a.cq, *n as u32 % 3 + 1)
                    };
                    self.lost = true;
                }
            }
        }
        self.check();
    }

    /// Pads with signaled empty writes (resetting when the QP failed or a completion may
    /// have been lost) until nothing is outstanding.
    fn drain(&mut self) {
        for round in 0..8 {
            self.deliver_all();
            self.sync();
            self.check();
            if self.ring.outstanding() == 0 && self.ring.staged() == 0 {
                assert_eq!(self.r, self.ring.posted_total());
                for (q, l) in self.life.iter().enumerate() {
                    assert!(
                        matches!(l, Life::Retired | Life::Dropped),
                        "seq {q} never retired: {l:?}"
                    );
                }
                return;
            }
            if self.ring.error().is_some() || (self.lost && round >= 2) || round >= 5 {
                self.reset();
                continue;
            }
            let got = self.ring.flush();
            self.flushed(got);
            self.ring.signal_next();
            let pad = MsgSpec {
                send: false,
                len: 0,
            };
            let got = self.ring.send_now(msg(&pad));
            self.staged(&pad, got);
            self.check();
        }
        panic!(
            "no progress: {} outstanding, {} staged (deadlock)",
            self.ring.outstanding(),
            self.ring.staged()
        );
    }
}

fuzz_target!(|input: Input| {
    let (idx, profile) = if input.rxe {
        (1, Profile::Rxe)
    } else {
        (0, Profile::Spec)
    };
    let mut guard = RIGS[idx].lock().unwrap_or_else(|p| p.into_inner());
    let rig = guard.get_or_insert_with(|| rig(profile));
    let depth = 2u64 << (input.depth_log % 4); // 2, 4, 8, 16
    let k = (input.k as u64 % (depth / 2)) + 1;
    let batch = (input.batch as u64 % depth) + 1;
    // A fresh start: no overflow armed, both QPs through RESET to RTS, both CQs empty.
    // SAFETY: a live softnic CQ.
    unsafe { hotverbs_softnic::inject_cq_overflow(rig.pair.a.cq, 0) };
    rig.pair.to_reset(rig.pair.a.qp);
    rig.pair.to_reset(rig.pair.b.qp);
    rig.pair.connect(rig.pair.a.qp, rig.pair.b.qpn(), 0);
    rig.pair.connect(rig.pair.b.qp, rig.pair.a.qpn(), 7);
    rig.pair.a.poll_all();
    rig.pair.b.poll_all();
    let remote = RemoteBuf::new(rig.b_buf.as_ptr() as u64, B_BUF as u64, rig.b_key);
    let cfg = SendConfig::new(RING_ID, depth as u32, RING_INLINE)
        .signal_every(k as u32)
        .batch(batch as u32)
        .remote(remote);
    // SAFETY: the QP lives for the process; its SQ is this ring's only; completions go to
    // the retirer made by split (max_inline is deliberately above the QP's, see the
    // module doc).
    let mut ring = unsafe { SendRing::<N>::new(rig.pair.a.qp, cfg) }.expect("valid config");
    let (counters, retirer) = ring.split();
    let mut run = Run {
        rig,
        rnr_retry: 0,
        depth,
        ring,
        counters,
        retirer,
        inbox: Vec::new(),
        life: Vec::new(),
        r: 0,
        err: None,
        ring_err: None,
        inc_start: 0,
        last_polled: None,
        polled_error: false,
        deferred: None,
        lost: false,
    };
    for op in input.ops.iter().take(MAX_OPS) {
        run.step(op, input.rxe);
    }
    run.drain();
});
