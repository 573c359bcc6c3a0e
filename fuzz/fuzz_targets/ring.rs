//! `SendRing` on a real softnic RC QP pair, driven by arbitrary sequences of stage /
//! send_now / batch (finished or dropped) / flush / poll / receives posted at the peer /
//! injected QP errors / QP reset, compared step by step with a reference model of the ring
//! and of softnic's send queue.
//!
//! Invariants checked after every step:
//! - the ring's counters (posted, retired, staged, error) and every return value equal the
//!   model's; every completion polled is the one the model predicts (ring id, sequence,
//!   status), so signaled WRs are exactly the scheduled ones (every `signal_every`-th, plus
//!   the WR that fills the ring);
//! - never over depth: staged + outstanding <= depth, and softnic's own count of occupied
//!   SQ slots (`sq_outstanding`) never exceeds the ring's depth (so no post ever gets
//!   ENOMEM);
//! - a full ring has a signaled WR in flight and nothing staged (no deadlock);
//! - `retired_total` never decreases (no WR retired twice); at the end, after receives are
//!   supplied and the ring is padded with empty writes, everything posted is retired
//!   within a bounded number of polls (no deadlock, no WR lost).
//!
//! Post failures are provoked on purpose: the QP is created with `max_inline_data` 32
//! while the ring is told 64, so an inline message of 33..=64 bytes is rejected by
//! `ibv_post_send` with EINVAL at its index in the chain (this breaks `SendRing::new`'s
//! contract about `max_inline` only, which exists to avoid exactly this error).
//!
//! Planted bug (`--features planted-bug`): the model forgets to rewind the signal schedule
//! after a partially rejected chain (the bookkeeping `SendRing::unstage_to` does).
#![no_main]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::collections::VecDeque;
use std::sync::Mutex;

use arbitrary::Arbitrary;
use hotverbs_datapath::*;
use hotverbs_ffi::*;
use hotverbs_fuzz::{post_one_recv, Pair, PairConfig, ALL_ACCESS};
use libfuzzer_sys::fuzz_target;

const N: usize = 16;
/// The QP's `cap.max_inline_data`.
const QP_INLINE: u32 = 32;
/// What the ring is told (deliberately more, see the module doc).
const RING_INLINE: u32 = 64;
const SQ_CAP: u32 = 16;
const RQ_CAP: u32 = 64;
const RECV_SLOT: usize = 4096;
const A_BUF: usize = 4096;
const B_BUF: usize = 1 << 16;
const MAX_OPS: usize = 200;
const RING_ID: u8 = 3;

static PAYLOAD: [u8; 80] = [0xab; 80];

struct Rig {
    pair: Pair,
    a_buf: &'static mut [u8],
    a_lkey: u32,
    b_buf: &'static mut [u8],
    b_key: u32,
    b_recv_ids: u64,
}

static RIG: Mutex<Option<Rig>> = Mutex::new(None);

fn rig() -> Rig {
    let pair = Pair::new(PairConfig {
        sq_depth: SQ_CAP,
        rq_depth: RQ_CAP,
        max_sge: 1,
        max_inline: QP_INLINE,
        cq_size: 16384,
        rnr_retry_a: 7,
        qp_type: IBV_QPT_RC,
    });
    let a_buf: &'static mut [u8] = Box::leak(vec![0u8; A_BUF].into_boxed_slice());
    let b_buf: &'static mut [u8] = Box::leak(vec![0u8; B_BUF].into_boxed_slice());
    // SAFETY: leaked buffers live for the rest of the process.
    let (a_mr, b_mr) = unsafe {
        (
            pair.reg(pair.pd, a_buf.as_mut_ptr(), A_BUF, ALL_ACCESS),
            pair.reg(pair.pd, b_buf.as_mut_ptr(), B_BUF, ALL_ACCESS),
        )
    };
    // SAFETY: MRs returned non-NULL by ibv_reg_mr.
    let (a_lkey, b_key) = unsafe { ((*a_mr).lkey, (*b_mr).rkey) };
    Rig {
        pair,
        a_buf,
        a_lkey,
        b_buf,
        b_key,
        b_recv_ids: 0,
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Kind {
    Empty,
    Inline,
    Buf,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op4 {
    Send,
    SendImm,
    Write,
    WriteImm,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct MsgSpec {
    kind: Kind,
    op: Op4,
    len: u16,
    off: u16,
    remote_off: u16,
    bad_lkey: bool,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Stage(MsgSpec),
    SendNow(MsgSpec),
    Batch { msgs: Vec<MsgSpec>, finish: bool },
    Flush,
    Poll,
    PostRecvB(u8),
    DrainB,
    InjectError,
    Reset,
}

#[derive(Arbitrary, Debug)]
struct Input {
    depth_log: u8,
    k: u8,
    batch: u8,
    rnr_wait: bool,
    ops: Vec<Op>,
}

/// What a message turns into on the wire, as the model needs it.
#[derive(Clone, Copy, Debug)]
struct Wr {
    seq: u64,
    signaled: bool,
    /// Consumes a receive at B (SEND, SEND_WITH_IMM, WRITE_WITH_IMM).
    needs_recv: bool,
    /// Passes the local key check (inline, empty, or a good lkey).
    good: bool,
    /// Bytes sent with IBV_SEND_INLINE.
    inline_len: Option<u32>,
}

/// A send completion the model expects.
#[derive(Clone, Copy, Debug)]
struct Cqe {
    /// Ring sequence (in the wr_id).
    seq: u64,
    status: u32,
    /// softnic's sequence of the WR in its SQ.
    dseq: u64,
    epoch: u32,
}

/// softnic's side of QP A (and B's receive queue), as its documentation describes it.
struct Dev {
    err: bool,
    rnr_wait: bool,
    pending: VecDeque<Wr>,
    b_recvs: u64,
    b_consumed: u64,
    /// Send CQEs of A in order.
    cq: VecDeque<Cqe>,
    /// Occupied SQ slots (softnic's sq_posted - sq_released, restarted by RESET): a slot is
    /// released when a completion of its WR or a later one is polled.
    occ_posted: u64,
    occ_retired: u64,
    /// Bumped by every RESET.
    epoch: u32,
    /// Device sequence of each pending WR is occ_posted at its acceptance.
    pending_dseq: VecDeque<u64>,
}

impl Dev {
    fn cqe(&mut self, w: &Wr, dseq: u64, status: u32) {
        self.cq.push_back(Cqe {
            seq: w.seq,
            status,
            dseq,
            epoch: self.epoch,
        });
    }

    /// A send CQE was polled: it releases its WR's SQ slot and every earlier one, unless
    /// the QP was reset since it was generated.
    fn polled(&mut self, c: &Cqe) {
        if c.epoch == self.epoch {
            self.occ_retired = self.occ_retired.max(c.dseq + 1);
        }
    }

    fn enter_err(&mut self) {
        self.err = true;
        while let Some(w) = self.pending.pop_front() {
            let d = self.pending_dseq.pop_front().unwrap();
            self.cqe(&w, d, IBV_WC_WR_FLUSH_ERR);
        }
    }

    /// Executes one WR; false if it has to wait for a receive.
    fn execute(&mut self, w: &Wr, dseq: u64) -> bool {
        if !w.good {
            self.cqe(w, dseq, IBV_WC_LOC_PROT_ERR);
            self.enter_err();
            return true;
        }
        if w.needs_recv {
            if self.b_recvs == 0 {
                if self.rnr_wait {
                    return false;
                }
                self.cqe(w, dseq, IBV_WC_RNR_RETRY_EXC_ERR);
                self.enter_err();
                return true;
            }
            self.b_recvs -= 1;
            self.b_consumed += 1;
        }
        if w.signaled {
            self.cqe(w, dseq, IBV_WC_SUCCESS);
        }
        true
    }

    /// `ibv_post_send` of `chain`: how many were accepted and the errno if one was rejected.
    fn post(&mut self, chain: &[Wr]) -> (usize, i32) {
        for (j, w) in chain.iter().enumerate() {
            if self.occ_posted - self.occ_retired >= SQ_CAP as u64 {
                return (j, libc::ENOMEM);
            }
            if w.inline_len.is_some_and(|l| l > QP_INLINE) {
                return (j, libc::EINVAL);
            }
            let dseq = self.occ_posted;
            self.occ_posted += 1;
            if self.err {
                self.cqe(w, dseq, IBV_WC_WR_FLUSH_ERR);
            } else if !self.pending.is_empty() || !self.execute(w, dseq) {
                // Behind waiting WRs, or waiting itself (RNR with rnr_retry 7).
                self.pending.push_back(*w);
                self.pending_dseq.push_back(dseq);
            }
        }
        (chain.len(), 0)
    }

    fn post_recvs(&mut self, n: u64) {
        self.b_recvs += n;
        while !self.err {
            let Some(w) = self.pending.pop_front() else {
                break;
            };
            let d = self.pending_dseq.pop_front().unwrap();
            if !self.execute(&w, d) {
                self.pending.push_front(w);
                self.pending_dseq.push_front(d);
                break;
            }
        }
    }

    fn reset(&mut self) {
        self.err = false;
        self.pending.clear();
        self.pending_dseq.clear();
        self.occ_posted = 0;
        self.occ_retired = 0;
        self.epoch += 1;
    }
}

/// The reference model of the ring (plain counters, as `SendRing`'s docs define them).
struct Model {
    depth: u64,
    k: u64,
    batch: u64,
    staged: u64,
    posted: u64,
    retired: u64,
    next_signal: u64,
    error: Option<WcError>,
    deferred: Option<PostError>,
    staged_wrs: VecDeque<Wr>,
    remote_len: u64,
    dev: Dev,
}

impl Model {
    fn limit(&self) -> u64 {
        if self.error.is_some() {
            0
        } else {
            self.depth
        }
    }

    /// The expected result of staging `m` (checks in `SendRing::stage_inner`'s order).
    fn stage(&mut self, m: &MsgSpec) -> Result<u64, SendError> {
        if self.staged - self.retired >= self.limit() {
            return Err(match self.error {
                Some(e) => SendError::QpError(e),
                None => SendError::WouldBlock,
            });
        }
        let (len, inline_len, good) = match m.kind {
            Kind::Empty => (0u64, None, true),
            Kind::Inline => {
                let len = inline_len(m);
                if len > RING_INLINE {
                    return Err(SendError::InlineTooLong {
                        len: len as usize,
                        max: RING_INLINE,
                    });
                }
                (len as u64, Some(len), true)
            }
            Kind::Buf => {
                let len = buf_len(m);
                if len <= RING_INLINE {
                    (len as u64, Some(len), true)
                } else {
                    (len as u64, None, !m.bad_lkey)
                }
            }
        };
        if matches!(m.op, Op4::Write | Op4::WriteImm) {
            let off = m.remote_off as u64 * 3;
            if off + len > self.remote_len {
                return Err(SendError::RemoteOutOfRange { offset: off, len });
            }
        }
        let seq = self.staged;
        let full = seq + 1 - self.retired == self.limit();
        let signaled = if seq == self.next_signal {
            self.next_signal += self.k;
            true
        } else {
            full
        };
        self.staged_wrs.push_back(Wr {
            seq,
            signaled,
            needs_recv: !matches!(m.op, Op4::Write),
            good,
            inline_len,
        });
        self.staged += 1;
        if full || self.staged - self.posted >= self.batch {
            self.flush_inner()?;
        }
        Ok(seq)
    }

    fn flush_inner(&mut self) -> Result<(), SendError> {
        let n = (self.staged - self.posted) as usize;
        if n == 0 {
            return Ok(());
        }
        let chain: Vec<Wr> = self.staged_wrs.drain(..).collect();
        let (accepted, errno) = self.dev.post(&chain);
        self.posted += accepted as u64;
        if accepted < n {
            self.staged = self.posted;
            if !cfg!(feature = "planted-bug") {
                while self.next_signal >= self.k && self.next_signal - self.k >= self.staged {
                    self.next_signal -= self.k;
                }
            }
            return Err(SendError::Post(PostError {
                verb: "ibv_post_send",
                errno,
                first_rejected: accepted,
                first_rejected_seq: self.posted,
            }));
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SendError> {
        if let Some(e) = self.deferred.take() {
            return Err(SendError::Post(e));
        }
        self.flush_inner()
    }

    fn on_completion(&mut self, seq: u64, status: u32) -> Result<u64, WcError> {
        if seq < self.retired || seq >= self.posted {
            return Ok(0);
        }
        let n = seq + 1 - self.retired;
        self.retired = seq + 1;
        match WcError::from_status(status) {
            None => Ok(n),
            Some(e) => {
                if self.error.is_none() {
                    self.error = Some(e);
                }
                Err(e)
            }
        }
    }

    fn reset(&mut self) -> u64 {
        let dropped = self.staged - self.retired;
        self.staged_wrs.clear();
        self.deferred = None;
        self.staged = self.posted;
        self.retired = self.posted;
        self.error = None;
        self.next_signal = self.posted + self.k - 1;
        dropped
    }
}

fn inline_len(m: &MsgSpec) -> u32 {
    (m.len % 72) as u32
}

fn buf_len(m: &MsgSpec) -> u32 {
    (m.len as usize % (A_BUF + 1)) as u32
}

fn msg<'a>(m: &MsgSpec, rig: &Rig) -> Msg<'a> {
    let local = match m.kind {
        Kind::Empty => Local::Empty,
        Kind::Inline => Local::Inline(&PAYLOAD[..(inline_len(m) as usize).min(PAYLOAD.len())]),
        Kind::Buf => {
            let len = buf_len(m);
            let off = m.off as usize % (A_BUF - len as usize + 1);
            let lkey = if m.bad_lkey { 0 } else { rig.a_lkey };
            Local::Buf(LocalBuf::new(
                rig.a_buf.as_ptr() as u64 + off as u64,
                len,
                lkey,
            ))
        }
    };
    let roff = m.remote_off as u64 * 3;
    match m.op {
        Op4::Send => Msg::send(local),
        Op4::SendImm => Msg::send_imm(local, 0x1234),
        Op4::Write => Msg::write(local, roff),
        Op4::WriteImm => Msg::write_imm(local, roff, 0x5678),
    }
}

fn post_recvs_b(rig: &mut Rig, n: u64) {
    for _ in 0..n {
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
        assert_eq!(rc, 0, "post_recv at B: {}", errno_name(rc));
        rig.b_recv_ids += 1;
    }
}

struct Run<'r> {
    rig: &'r mut Rig,
    ring: SendRing<N>,
    m: Model,
    last_retired: u64,
    rnr: u8,
}

impl Run<'_> {
    fn poll(&mut self) {
        for wc in self.rig.pair.a.poll_all() {
            // SAFETY: polled from the ring's CQ (poll_all) and given to the ring once.
            let c = unsafe { Completion::from_raw(wc) };
            let want = self
                .m
                .dev
                .cq
                .pop_front()
                .unwrap_or_else(|| panic!("unexpected completion {c:?}"));
            self.m.dev.polled(&want);
            let (want_seq, want_status) = (want.seq, want.status);
            assert_eq!(c.ring(), RING_ID, "{c:?}");
            assert_eq!(
                c.seq(),
                want_seq & wr_id::SEQ_MASK,
                "completion order {c:?}"
            );
            assert_eq!(wc.status, want_status, "status of seq {want_seq}: {c:?}");
            let got = self.ring.on_completion(&c);
            let want = self.m.on_completion(want_seq, want_status);
            assert_eq!(got, want, "on_completion of seq {want_seq}");
        }
        assert!(
            self.m.dev.cq.is_empty(),
            "completions missing: {:?}",
            self.m.dev.cq
        );
    }

    fn check(&mut self) {
        let (r, m) = (&self.ring, &self.m);
        assert_eq!(r.posted_total(), m.posted, "posted");
        assert_eq!(r.retired_total(), m.retired, "retired");
        assert_eq!(r.staged(), m.staged - m.posted, "staged");
        assert_eq!(r.error(), m.error, "error");
        assert!(
            r.retired_total() >= self.last_retired,
            "retired went backwards"
        );
        self.last_retired = r.retired_total();
        assert!(r.outstanding() + r.staged() <= r.depth(), "over depth");
        // SAFETY: live softnic QP.
        let occ = unsafe { hotverbs_softnic::sq_outstanding(self.rig.pair.a.qp) } as u64;
        assert!(
            occ <= r.depth(),
            "softnic holds {occ} SQ slots, ring depth {}",
            r.depth()
        );
        assert_eq!(occ, m.dev.occ_posted - m.dev.occ_retired, "SQ occupancy");
        // softnic releases slots when their completions are polled, the ring retires WRs
        // when it is given them: the two counts agree.
        assert_eq!(
            occ,
            r.outstanding(),
            "softnic's SQ occupancy vs the ring's outstanding"
        );
        if r.error().is_none() && r.free() == 0 {
            assert!(
                r.signaled_in_flight(),
                "full ring without a signaled WR in flight"
            );
            assert_eq!(r.staged(), 0, "a full ring has flushed");
        }
    }

    fn step(&mut self, op: &Op) {
        match op {
            Op::Stage(s) => {
                let msg = msg(s, self.rig);
                // SAFETY: Buf payloads point into a leaked, registered buffer; inline ones
                // into a static.
                let got = unsafe { self.ring.stage(msg) };
                assert_eq!(got, self.m.stage(s), "stage {s:?}");
            }
            Op::SendNow(s) => {
                let got = self.ring.send_now(msg(s, self.rig));
                let want = if matches!(s.kind, Kind::Buf) {
                    Err(SendError::NotInline)
                } else {
                    self.m
                        .stage(s)
                        .and_then(|q| self.m.flush_inner().map(|_| q))
                };
                assert_eq!(got, want, "send_now {s:?}");
            }
            Op::Batch { msgs, finish } => {
                let rig = &*self.rig;
                let m = &mut self.m;
                let mut b = self.ring.batch();
                for s in msgs.iter().take(24) {
                    let got = b.push(msg(s, rig));
                    let want = if matches!(s.kind, Kind::Buf) {
                        Err(SendError::NotInline)
                    } else {
                        m.stage(s)
                    };
                    assert_eq!(got, want, "batch push {s:?}");
                }
                if *finish {
                    assert_eq!(b.finish(), m.flush_inner(), "batch finish");
                } else {
                    drop(b);
                    if let Err(SendError::Post(e)) = m.flush_inner() {
                        m.deferred = Some(e);
                    }
                }
            }
            Op::Flush => assert_eq!(self.ring.flush(), self.m.flush(), "flush"),
            Op::Poll => self.poll(),
            Op::PostRecvB(n) => {
                let room = RQ_CAP as u64 - self.m.dev.b_recvs;
                let n = (*n as u64 % 8).min(room);
                post_recvs_b(self.rig, n);
                self.m.dev.post_recvs(n);
            }
            Op::DrainB => {
                let got = self.rig.pair.b.poll_all();
                for wc in &got {
                    assert_eq!(
                        wc.status,
                        IBV_WC_SUCCESS,
                        "receive at B: {}",
                        wc_status_name(wc.status)
                    );
                }
                assert_eq!(
                    got.len() as u64,
                    self.m.dev.b_consumed,
                    "receives consumed at B"
                );
                self.m.dev.b_consumed = 0;
            }
            Op::InjectError => {
                // SAFETY: live softnic QP.
                unsafe { hotverbs_softnic::inject_qp_error(self.rig.pair.a.qp) };
                if !self.m.dev.err {
                    self.m.dev.enter_err();
                }
            }
            Op::Reset => {
                self.rig.pair.to_reset(self.rig.pair.a.qp);
                // SAFETY: the QP was just moved to RESET, so softnic dropped every WR of
                // the ring; no split-mode retirer exists.
                let dropped = unsafe { self.ring.reset() };
                assert_eq!(dropped, self.m.reset(), "reset");
                self.m.dev.reset();
                self.rig
                    .pair
                    .connect(self.rig.pair.a.qp, self.rig.pair.b.qpn(), self.rnr);
            }
        }
        self.check();
    }

    /// Supplies receives and pads with empty writes until everything posted is retired.
    fn drain(&mut self) {
        if self.m.error.is_some() || self.m.dev.err {
            return;
        }
        let _ = self.ring.flush();
        let _ = self.m.flush();
        for _ in 0..4 * N {
            let room = RQ_CAP as u64 - self.m.dev.b_recvs;
            let n = (self.m.dev.pending.len() as u64 + self.m.staged_wrs.len() as u64).min(room);
            post_recvs_b(self.rig, n);
            self.m.dev.post_recvs(n);
            self.poll();
            self.check();
            if self.ring.outstanding() == 0 && self.ring.staged() == 0 {
                assert_eq!(self.ring.retired_total(), self.ring.posted_total());
                return;
            }
            if self.ring.error().is_some() {
                return;
            }
            let pad = MsgSpec {
                kind: Kind::Empty,
                op: Op4::Write,
                len: 0,
                off: 0,
                remote_off: 0,
                bad_lkey: false,
            };
            let got = self.ring.send_now(Msg::write(Local::Empty, 0));
            let want = self
                .m
                .stage(&pad)
                .and_then(|q| self.m.flush_inner().map(|_| q));
            assert_eq!(got, want, "padding write");
        }
        panic!(
            "no progress: {} outstanding, {} staged after {} padding rounds (deadlock)",
            self.ring.outstanding(),
            self.ring.staged(),
            4 * N
        );
    }
}

fuzz_target!(|input: Input| {
    let mut guard = RIG.lock().unwrap_or_else(|p| p.into_inner());
    let rig = guard.get_or_insert_with(rig);
    let depth = 2u64 << (input.depth_log % 4); // 2, 4, 8, 16
    let k = (input.k as u64 % (depth / 2)) + 1;
    let batch = (input.batch as u64 % depth) + 1;
    let rnr = if input.rnr_wait { 7 } else { 0 };
    // Fresh QPs and CQs for this input.
    rig.pair.to_reset(rig.pair.a.qp);
    rig.pair.to_reset(rig.pair.b.qp);
    rig.pair.connect(rig.pair.a.qp, rig.pair.b.qpn(), rnr);
    rig.pair.connect(rig.pair.b.qp, rig.pair.a.qpn(), 7);
    rig.pair.a.poll_all();
    rig.pair.b.poll_all();
    let remote = RemoteBuf::new(rig.b_buf.as_ptr() as u64, B_BUF as u64, rig.b_key);
    let cfg = SendConfig::new(RING_ID, depth as u32, RING_INLINE)
        .signal_every(k as u32)
        .batch(batch as u32)
        .remote(remote);
    // SAFETY: the QP lives for the process; its SQ is this ring's only; completions go to
    // on_completion. (max_inline is deliberately above the QP's, see the module doc.)
    let ring = unsafe { SendRing::<N>::new(rig.pair.a.qp, cfg) }.expect("valid config");
    let mut run = Run {
        rig,
        ring,
        m: Model {
            depth,
            k,
            batch,
            staged: 0,
            posted: 0,
            retired: 0,
            next_signal: k - 1,
            error: None,
            deferred: None,
            staged_wrs: VecDeque::new(),
            remote_len: B_BUF as u64,
            dev: Dev {
                err: false,
                rnr_wait: input.rnr_wait,
                pending: VecDeque::new(),
                b_recvs: 0,
                b_consumed: 0,
                cq: VecDeque::new(),
                occ_posted: 0,
                occ_retired: 0,
                epoch: 0,
                pending_dseq: VecDeque::new(),
            },
        },
        last_retired: 0,
        rnr,
    };
    for op in input.ops.iter().take(MAX_OPS) {
        run.step(op);
    }
    run.drain();
});
