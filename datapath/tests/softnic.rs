//! The datapath on softnic (a full software RDMA device behind the verbs ABI): RC pairs
//! built through `verbs_table()`, every operation in ping-pong and streaming form, batching
//! and signal periods checked against softnic's own SQ accounting (which frees slots as
//! mlx5 does: only at a completion of that WR or a later one), back-pressure, error
//! injection with exact slot accounting and the RESET -> RTS recovery, RecvRing on an RQ and
//! an SRQ, credits, and split mode on two threads.

mod common;

use common::nic::{Pair, PairOpts, Side};
use hotverbs_datapath::*;
use hotverbs_ffi::*;

const N: usize = 64;
const SLOT: u32 = 256;
/// Receive slots occupy the first 16 KiB of each side's buffer; RDMA targets start here.
const RDMA_OFF: u64 = 32 * 1024;

const A_SEND: u8 = 1;
const A_RECV: u8 = 2;
const B_SEND: u8 = 3;
const B_RECV: u8 = 4;

struct End {
    send: SendRing<N>,
    recv: RecvRing<N>,
    poller: CqPoller<16>,
    /// (imm, bytes) of messages received (copied out, slot released).
    got: Vec<(Option<u32>, Vec<u8>)>,
    /// Error completions of the send ring.
    errors: Vec<WcError>,
    /// Error completions of receives (flushes).
    recv_errors: Vec<WcError>,
}

struct Rig {
    pair: Pair,
    a: End,
    b: End,
}

fn end(
    side: &Side,
    peer: &Side,
    send_id: u8,
    recv_id: u8,
    cfg: impl Fn(SendConfig) -> SendConfig,
    depth: u32,
) -> End {
    let target = if side.srq.is_null() {
        RecvTarget::Qp(side.qp)
    } else {
        RecvTarget::Srq(side.srq)
    };
    let region = side.local().slice(0, 16 * 1024).unwrap();
    // SAFETY: QP/CQ/SRQ/MR live as long as the rig (the rig owns the pair and drops the
    // rings first: field order); the region is only touched through the RecvRing.
    unsafe {
        let send = SendRing::new(
            side.qp,
            cfg(SendConfig::new(send_id, depth, 64).remote(peer.remote())),
        )
        .unwrap();
        let mut recv = RecvRing::new(
            target,
            region,
            RecvConfig::new(recv_id, SLOT, 64).repost_batch(8),
        )
        .unwrap();
        recv.fill().unwrap();
        End {
            send,
            recv,
            poller: CqPoller::new(side.cq),
            got: Vec::new(),
            errors: Vec::new(),
            recv_errors: Vec::new(),
        }
    }
}

impl Rig {
    fn new(opts: PairOpts, cfg: impl Fn(SendConfig) -> SendConfig + Copy) -> Rig {
        let pair = Pair::new(opts);
        let a = end(&pair.a, &pair.b, A_SEND, A_RECV, cfg, opts.sq_depth);
        let b = end(&pair.b, &pair.a, B_SEND, B_RECV, cfg, opts.sq_depth);
        Rig { pair, a, b }
    }
}

impl End {
    /// Polls until the CQ is empty; dispatches by ring id.
    fn pump(&mut self) -> usize {
        let mut n = 0;
        loop {
            let batch = self.poller.poll().expect("poll_cq");
            if batch.is_empty() {
                return n;
            }
            for c in batch {
                n += 1;
                match c.ring() {
                    A_SEND | B_SEND => {
                        if let Err(e) = self.send.on_completion(c) {
                            self.errors.push(e);
                        }
                    }
                    A_RECV | B_RECV => match self.recv.on_completion(c) {
                        Ok(m) => {
                            self.got
                                .push((m.imm(), self.recv.data(&m).unwrap().to_vec()));
                            self.recv.release(m).unwrap();
                        }
                        Err(RecvError::Completion { error, .. }) => self.recv_errors.push(error),
                        Err(e) => panic!("{e}"),
                    },
                    r => panic!("unknown ring {r}"),
                }
            }
        }
    }

    /// Sends (retrying on back-pressure while pumping) and returns the sequence number.
    fn send(&mut self, msg: Msg<'_>) -> u64 {
        loop {
            // SAFETY: the tests keep every LocalBuf they pass alive until the end of the test.
            match unsafe { self.send.stage(msg) } {
                Ok(s) => return s,
                Err(SendError::WouldBlock) => {
                    self.send.flush().unwrap();
                    self.pump();
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
}

fn sq_outstanding(qp: *mut ibv_qp) -> u64 {
    // SAFETY: live softnic QP.
    unsafe { hotverbs_softnic::sq_outstanding(qp) as u64 }
}

/// After draining, our count of outstanding WRs equals softnic's SQ occupancy.
fn assert_sq_accounting(rig: &mut Rig) {
    rig.a.send.flush().unwrap();
    rig.b.send.flush().unwrap();
    rig.a.pump();
    rig.b.pump();
    assert_eq!(
        rig.a.send.outstanding(),
        sq_outstanding(rig.pair.a.qp),
        "A: ring vs device SQ"
    );
    assert_eq!(
        rig.b.send.outstanding(),
        sq_outstanding(rig.pair.b.qp),
        "B: ring vs device SQ"
    );
}

fn word(side: &Side, off: u64) -> u64 {
    u64::from_ne_bytes(side.buf[off as usize..off as usize + 8].try_into().unwrap())
}

#[test]
fn ping_pong_every_operation() {
    let mut rig = Rig::new(PairOpts::default(), |c| c.signal_every(1).batch(1));
    let a_loc = rig.pair.a.local();
    let scratch = a_loc.slice(RDMA_OFF as u32, 4096).unwrap();
    // SEND / SEND_WITH_IMM / zero-byte: A -> B, B answers, A receives.
    for (i, payload) in [&b"ping"[..], b"", b"order:42"].iter().enumerate() {
        let imm = (i == 1).then_some(0xABCD_0000 + i as u32);
        let msg = match imm {
            Some(v) => Msg::send_imm(Local::Inline(payload), v),
            None => Msg::send(Local::Inline(payload)),
        };
        rig.a.send.send_now(msg).unwrap();
        rig.b.pump();
        assert_eq!(rig.b.got.pop(), Some((imm, payload.to_vec())));
        rig.b
            .send
            .send_now(Msg::send(Local::Inline(b"pong")))
            .unwrap();
        rig.a.pump();
        assert_eq!(rig.a.got.pop(), Some((None, b"pong".to_vec())));
    }
    // RDMA WRITE and WRITE_WITH_IMM into B's buffer.
    rig.a
        .send
        .send_now(Msg::write(Local::Inline(b"written!"), RDMA_OFF))
        .unwrap();
    rig.a
        .send
        .send_now(Msg::write_imm(Local::Inline(b"with imm"), RDMA_OFF + 8, 77))
        .unwrap();
    rig.a.pump();
    rig.b.pump();
    assert_eq!(
        &rig.pair.b.buf[RDMA_OFF as usize..RDMA_OFF as usize + 16],
        b"written!with imm"
    );
    assert_eq!(
        rig.b.got.pop(),
        Some((Some(77), Vec::new())),
        "WRITE_WITH_IMM consumes a receive (no data in the slot)"
    );
    rig.a.pump();
    // Zero-copy WRITE from registered memory (bigger than max_inline).
    rig.pair.a.buf[RDMA_OFF as usize..RDMA_OFF as usize + 200].fill(0x5A);
    let src = a_loc.slice(RDMA_OFF as u32, 200).unwrap();
    let seq = rig.a.send(Msg::write(Local::Buf(src), RDMA_OFF + 1000));
    rig.a.send.flush().unwrap();
    rig.a.pump();
    assert!(rig.a.send.is_retired(seq));
    assert!(rig.pair.b.buf[RDMA_OFF as usize + 1000..][..200]
        .iter()
        .all(|&b| b == 0x5A));
    // RDMA READ of B's bytes into A's scratch.
    let dst = scratch.slice(512, 16).unwrap();
    let seq = rig.a.send(Msg::read(dst, RDMA_OFF));
    rig.a.send.flush().unwrap();
    rig.a.pump();
    assert!(rig.a.send.is_retired(seq));
    assert_eq!(
        &rig.pair.a.buf[RDMA_OFF as usize + 512..][..16],
        b"written!with imm"
    );
    // Atomics on B's word at RDMA_OFF + 64.
    let off = RDMA_OFF + 64;
    rig.pair.b.buf[off as usize..off as usize + 8].copy_from_slice(&10u64.to_ne_bytes());
    let old = scratch.slice(1024, 8).unwrap();
    rig.a.send(Msg::fetch_add(old, off, 5));
    rig.a.send.flush().unwrap();
    rig.a.pump();
    assert_eq!(
        (word(&rig.pair.a, RDMA_OFF + 1024), word(&rig.pair.b, off)),
        (10, 15)
    );
    rig.a.send(Msg::cmp_swap(old, off, 15, 99));
    rig.a.send.flush().unwrap();
    rig.a.pump();
    assert_eq!(
        (word(&rig.pair.a, RDMA_OFF + 1024), word(&rig.pair.b, off)),
        (15, 99)
    );
    rig.a.send(Msg::cmp_swap(old, off, 15, 7));
    rig.a.send.flush().unwrap();
    rig.a.pump();
    assert_eq!(
        (word(&rig.pair.a, RDMA_OFF + 1024), word(&rig.pair.b, off)),
        (99, 99),
        "compare failed: no swap"
    );
    assert!(
        rig.a.errors.is_empty() && rig.b.errors.is_empty(),
        "{:?} {:?}",
        rig.a.errors,
        rig.b.errors
    );
    assert_sq_accounting(&mut rig);
}

#[test]
fn streaming_every_operation_with_exact_sq_accounting() {
    for op in 0..8 {
        let mut rig = Rig::new(PairOpts::default(), |c| c.signal_every(16).batch(8));
        let a_loc = rig.pair.a.local();
        let dst = a_loc.slice(RDMA_OFF as u32, 8).unwrap();
        const COUNT: u64 = 3000;
        for i in 0..COUNT {
            let bytes = i.to_le_bytes();
            let off = RDMA_OFF + (i % 512) * 8;
            let msg = match op {
                0 => Msg::send(Local::Inline(&bytes)),
                1 => Msg::send_imm(Local::Inline(&bytes), i as u32),
                2 => Msg::write(Local::Inline(&bytes), off),
                3 => Msg::write_imm(Local::Inline(&bytes), off, i as u32),
                4 => Msg::read(dst, off),
                5 => Msg::fetch_add(dst, RDMA_OFF, 1),
                6 => Msg::cmp_swap(dst, RDMA_OFF, i, i + 1),
                _ => Msg::send(Local::Empty),
            };
            rig.a.send(msg);
            if i % 8 == 7 {
                rig.b.pump();
                assert!(rig.a.send.outstanding() <= N as u64);
            }
            // Inline bytes live on this stack frame only: flush before they go.
            rig.a.send.flush().unwrap();
        }
        assert_sq_accounting(&mut rig);
        rig.b.pump();
        assert!(rig.a.errors.is_empty(), "op {op}: {:?}", rig.a.errors);
        let consumed_recv = matches!(op, 0 | 1 | 3 | 7);
        assert_eq!(
            rig.b.got.len() as u64,
            if consumed_recv { COUNT } else { 0 },
            "op {op}"
        );
        if op == 1 || op == 3 {
            assert!(
                rig.b
                    .got
                    .iter()
                    .enumerate()
                    .all(|(i, (imm, _))| *imm == Some(i as u32)),
                "in order"
            );
        }
        if op == 5 || op == 6 {
            assert_eq!(
                word(&rig.pair.b, RDMA_OFF),
                COUNT,
                "op {op}: every atomic applied once"
            );
        }
        if op == 2 {
            // Last writes: i = 2999 at index 2999 % 512, i = 2559 at index 511.
            assert_eq!(word(&rig.pair.b, RDMA_OFF + 8 * (2999 % 512)), 2999);
            assert_eq!(word(&rig.pair.b, RDMA_OFF + 8 * 511), 2559);
        }
    }
}

#[test]
fn batching_and_signal_periods_never_overrun_the_sq() {
    // The ring depth equals the QP's max_send_wr: an accounting error would be ENOMEM.
    for k in 1..=(N as u32 / 2) {
        for b in [1u32, 2, 3, 7, 16, 31, 64] {
            let opts = PairOpts::default();
            let mut rig = Rig::new(opts, |c| c.signal_every(k).batch(b));
            let mut blocked = 0;
            let mut sent = 0;
            while sent < 500 {
                // SAFETY: empty WRITE: nothing borrowed.
                match unsafe { rig.a.send.stage(Msg::write(Local::Empty, RDMA_OFF)) } {
                    Ok(_) => sent += 1,
                    Err(SendError::WouldBlock) => {
                        blocked += 1;
                        assert!(rig.a.send.signaled_in_flight());
                        // softnic frees SQ slots when it generates a completion, we when we
                        // poll it: the device never holds a slot the ring thinks is free.
                        assert!(sq_outstanding(rig.pair.a.qp) <= rig.a.send.outstanding());
                        rig.a.pump();
                    }
                    Err(e) => panic!("k={k} b={b}: {e}"),
                }
                if sent % 97 == 0 {
                    rig.a.pump();
                }
            }
            assert!(blocked > 0, "the test reaches back-pressure");
            assert_sq_accounting(&mut rig);
            assert!(rig.a.send.outstanding() < k as u64);
        }
    }
}

#[test]
fn bad_rkey_flushes_with_exact_accounting_then_recovers() {
    let mut rig = Rig::new(PairOpts::default(), |c| c.signal_every(8).batch(4));
    // One ring per SQ (the device retires unsignaled WRs through any later completion of
    // the SQ): A's ring carries a wrong rkey from the start.
    let mut bad_remote = rig.pair.b.remote();
    bad_remote.rkey ^= 0xdead;
    // SAFETY: replaces A's ring before any traffic; the QP outlives it.
    rig.a.send = unsafe {
        SendRing::new(
            rig.pair.a.qp,
            SendConfig::new(A_SEND, 64, 64)
                .signal_every(8)
                .batch(4)
                .remote(bad_remote),
        )
    }
    .unwrap();
    // Five unsignaled SENDs complete silently; the WRITE then fails; three more flush.
    for i in 0..5u64 {
        rig.a.send(Msg::send(Local::Inline(&i.to_le_bytes())));
        rig.a.send.flush().unwrap();
    }
    rig.a.send(Msg::write(Local::Inline(b"x"), RDMA_OFF));
    for _ in 0..3 {
        rig.a.send(Msg::write(Local::Inline(b"y"), RDMA_OFF));
    }
    rig.a.send.flush().unwrap();
    assert_eq!(rig.a.send.outstanding(), 9);
    rig.a.pump();
    assert_eq!(rig.a.errors[0], WcError::RemAccess, "{:?}", rig.a.errors);
    assert_eq!(rig.a.errors.len(), 4, "the bad WRITE + three flushed");
    assert!(rig.a.errors[1..].iter().all(|s| *s == WcError::WrFlush));
    assert_eq!(
        rig.a.send.outstanding(),
        0,
        "the error retired the five before it, each flush itself"
    );
    assert_eq!(sq_outstanding(rig.pair.a.qp), 0);
    assert_eq!(
        rig.a.send.send_now(Msg::send(Local::Empty)),
        Err(SendError::QpError(WcError::RemAccess))
    );
    // The responder went to ERR too (softnic, like rxe): its receives are flushed.
    rig.b.pump();
    assert_eq!(rig.b.got.len(), 5);
    // The 5 consumed slots were released but wait for a chain of 8: 59 were posted.
    assert_eq!(
        (rig.b.recv_errors.len(), rig.b.recv.pending()),
        (59, 5),
        "B's posted receives flushed"
    );
    assert!(rig.b.recv_errors.iter().all(|e| *e == WcError::WrFlush));
    assert_eq!(rig.a.recv_errors.len(), 64);
    // Recovery: RESET -> INIT -> RTR -> RTS on both, then the rings.
    rig.pair.reconnect_both();
    // SAFETY: the QPs went through RESET (reconnect_both): none of this ring's WRs is posted.
    assert_eq!(unsafe { rig.a.send.reset() }, 0, "nothing of unknown fate");
    // SAFETY: the QPs went through RESET (reconnect_both): none of this ring's WRs is posted.
    unsafe { rig.b.send.reset() };
    // SAFETY: the QPs went through RESET (reconnect_both): none of this ring's WRs is posted.
    assert_eq!(unsafe { rig.b.recv.reset() }, 64);
    // SAFETY: the QPs went through RESET (reconnect_both): none of this ring's WRs is posted.
    unsafe { rig.a.recv.reset() };
    rig.a.recv.repost().unwrap();
    rig.b.recv.repost().unwrap();
    assert_eq!(rig.b.recv.posted(), 64);
    rig.b.got.clear();
    for i in 0..200u32 {
        rig.a.send(Msg::send_imm(Local::Empty, i));
        rig.a.send.flush().unwrap();
        if i % 16 == 15 {
            rig.b.pump();
        }
    }
    assert_sq_accounting(&mut rig);
    rig.b.pump();
    assert_eq!(rig.b.got.len(), 200);
    assert!(rig
        .b
        .got
        .iter()
        .enumerate()
        .all(|(i, (imm, _))| *imm == Some(i as u32)));
}

#[test]
fn rnr_without_receives_is_a_named_error() {
    let opts = PairOpts {
        rnr_retry: 0,
        ..PairOpts::default()
    };
    let mut rig = Rig::new(opts, |c| c.signal_every(4).batch(1));
    // B posted 64 receives: the 65th SEND without a release on B is RNR.
    for _ in 0..64 {
        rig.a.send(Msg::send(Local::Empty));
    }
    rig.a.send(Msg::send(Local::Empty));
    rig.a.send(Msg::send(Local::Empty));
    rig.a.pump();
    assert_eq!(
        rig.a.errors.first(),
        Some(&WcError::RnrRetryExc),
        "{:?}",
        rig.a.errors
    );
    assert_eq!(rig.a.send.outstanding(), 0);
    assert_eq!(sq_outstanding(rig.pair.a.qp), 0);
}

#[test]
fn qp_to_error_flushes_everything_and_reset_recovers() {
    let opts = PairOpts {
        rnr_retry: 7,
        ..PairOpts::default()
    };
    let mut rig = Rig::new(opts, |c| c.signal_every(8).batch(8));
    // B has 64 receives and is not polled: SENDs 64..100 wait in RNR (rnr_retry 7).
    for i in 0..100u32 {
        rig.a.send(Msg::send_imm(Local::Empty, i));
    }
    rig.a.send.flush().unwrap();
    // SAFETY: live softnic QP.
    unsafe { hotverbs_softnic::inject_qp_error(rig.pair.a.qp) };
    rig.a.pump();
    assert_eq!(
        rig.a.errors.len(),
        36,
        "the waiting WRs flush, one CQE each"
    );
    assert!(rig.a.errors.iter().all(|e| *e == WcError::WrFlush));
    assert_eq!(
        rig.a.send.outstanding(),
        0,
        "flushes retire exactly the outstanding WRs"
    );
    assert_eq!(sq_outstanding(rig.pair.a.qp), 0);
    assert_eq!(
        (rig.a.recv.posted(), rig.a.recv.pending()),
        (0, 0),
        "A's receives were flushed"
    );
    assert_eq!(rig.a.recv_errors.len(), 64);
    rig.b.pump();
    assert_eq!(rig.b.got.len(), 64);
    // Recover, then leave three unsignaled WRs that complete silently before the next error:
    // no completion will ever name them; `reset` reports them.
    rig.pair.reconnect_both();
    // SAFETY: the QPs went through RESET (reconnect_both): none of this ring's WRs is posted.
    assert_eq!(unsafe { rig.a.send.reset() }, 0);
    // SAFETY: the QPs went through RESET (reconnect_both): none of this ring's WRs is posted.
    let marked = unsafe { rig.a.recv.reset() };
    assert_eq!(marked, 64, "all idle slots come back");
    // SAFETY: the QPs went through RESET (reconnect_both): none of this ring's WRs is posted.
    assert_eq!(unsafe { rig.b.recv.reset() }, 64);
    rig.a.recv.repost().unwrap();
    rig.b.recv.repost().unwrap();
    rig.a.errors.clear();
    let base = rig.a.send.posted_total();
    assert_eq!(base % 8, 4, "100 = 12 * 8 + 4");
    for _ in 0..3 {
        rig.a.send(Msg::write(Local::Empty, RDMA_OFF));
    }
    rig.a.send.flush().unwrap();
    rig.a.pump();
    assert_eq!(
        (rig.a.send.outstanding(), sq_outstanding(rig.pair.a.qp)),
        (3, 3)
    );
    // SAFETY: live softnic QP.
    unsafe { hotverbs_softnic::inject_qp_error(rig.pair.a.qp) };
    rig.a.pump();
    assert_eq!(
        rig.a.send.outstanding(),
        3,
        "completed silently: no flush names them"
    );
    rig.pair.reconnect_both();
    assert_eq!(
        // SAFETY: the QPs went through RESET (reconnect_both): none of this ring's WRs is posted.
        unsafe { rig.a.send.reset() },
        3,
        "reset accounts for the WRs without a completion"
    );
    // SAFETY: the QPs went through RESET (reconnect_both): none of this ring's WRs is posted.
    assert_eq!(unsafe { rig.a.recv.reset() }, 64);
    rig.a.recv.repost().unwrap();
    // SAFETY: the QPs went through RESET (reconnect_both): none of this ring's WRs is posted.
    assert_eq!(unsafe { rig.b.recv.reset() } as u32, 64 - rig.b.recv.held());
    rig.b.recv.repost().unwrap();
    rig.b
        .send
        .send_now(Msg::send(Local::Inline(b"again")))
        .unwrap();
    rig.a.pump();
    assert_eq!(rig.a.got.last(), Some(&(None, b"again".to_vec())));
    assert_sq_accounting(&mut rig);
}

#[test]
fn recv_ring_on_an_srq() {
    let opts = PairOpts {
        srq_b: true,
        ..PairOpts::default()
    };
    let mut rig = Rig::new(opts, |c| c.signal_every(8).batch(4));
    for i in 0..1000u32 {
        let bytes = i.to_le_bytes();
        rig.a.send(Msg::send(Local::Inline(&bytes)));
        rig.a.send.flush().unwrap();
        if i % 32 == 31 {
            rig.b.pump();
            rig.a.pump();
        }
    }
    rig.b.pump();
    assert_eq!(rig.b.got.len(), 1000);
    assert!(rig
        .b
        .got
        .iter()
        .enumerate()
        .all(|(i, (_, d))| d == &(i as u32).to_le_bytes()));
    assert_eq!(rig.b.recv.posted() + rig.b.recv.pending(), 64);
}

#[test]
fn credits_keep_a_fast_sender_from_rnr() {
    // rnr_retry 0: one SEND without a posted receive fails the QP.
    let opts = PairOpts {
        rnr_retry: 0,
        ..PairOpts::default()
    };
    let mut rig = Rig::new(opts, |c| c.signal_every(8).batch(4));
    let mut credits = Credits::new(rig.b.recv.posted());
    let mut owed = CreditReturn::new(16);
    let mut sent = 0u32;
    let mut received = 0usize;
    let mut stalls = 0;
    let mut reposted_seen = 0u32;
    while received < 5000 {
        // The sender goes as fast as credits allow.
        while sent < 5000 && credits.try_take() {
            rig.a.send(Msg::send_imm(Local::Empty, sent));
            sent += 1;
        }
        rig.a.send.flush().unwrap();
        // The receiver handles what arrived; every release re-posts (repost_batch 8);
        // credits go back in a zero-byte WRITE_WITH_IMM once 16 are owed.
        rig.b.pump();
        received = rig.b.got.len();
        // Every received slot was released at once; those no longer pending are re-posted.
        let reposted = received as u32 - rig.b.recv.pending();
        owed.reposted(reposted - reposted_seen);
        reposted_seen = reposted;
        if let Some(n) = owed.take() {
            rig.b.send(Msg::write_imm(
                Local::Empty,
                RDMA_OFF,
                credits::encode_imm(n),
            ));
            rig.b.send.flush().unwrap();
        } else {
            stalls += 1;
        }
        rig.a.pump();
        for (imm, _) in rig.a.got.drain(..) {
            credits.grant(credits::decode_imm(imm.unwrap()).unwrap());
        }
        rig.b.pump();
        assert!(rig.a.errors.is_empty(), "{:?}", rig.a.errors);
        assert!(stalls < 1_000_000);
    }
    assert!(rig
        .b
        .got
        .iter()
        .enumerate()
        .all(|(i, (imm, _))| *imm == Some(i as u32)));
}

/// Sets the flag when dropped: the poster's "done" also on panic, so the poller thread
/// always ends and a stuck run fails instead of hanging.
struct SetOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Time without progress after which the poster gives up (a failure path only: a loaded
/// machine may starve the poller thread for a while, which must not fail the test).
const STUCK: std::time::Duration = std::time::Duration::from_secs(120);
/// Empty polls after the poster is done (every completion is in the CQ by then: the
/// device completes inside the post) after which the poller gives up.
const IDLE_POLLS_AFTER_DONE: u64 = 2_000_000;

#[test]
fn split_mode_on_two_threads() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const TOTAL: u64 = 50_000;
    let mut rig = Rig::new(PairOpts::default(), |c| c.signal_every(16).batch(8));
    let done = AtomicBool::new(false);
    let a_cq = rig.pair.a.cq;
    let ring = &mut rig.a.send;
    let (shared, mut r) = ring.split();
    // SAFETY: the poller thread is the only poller of A's CQ while the scope runs.
    let mut p: CqPoller<32> = unsafe { CqPoller::new(a_cq) };
    let (shared, done) = (&shared, &done);
    std::thread::scope(|s| {
        let poller = s.spawn(move || {
            let mut idle_after_done = 0u64;
            while !(done.load(Ordering::Acquire) && r.retired() == shared.observe_posted()) {
                let batch = p.poll().unwrap();
                for c in batch.iter() {
                    assert_eq!(c.ring(), A_SEND);
                    r.on_completion(c, shared).unwrap();
                }
                if batch.is_empty() && done.load(Ordering::Acquire) {
                    idle_after_done += 1;
                    if idle_after_done > IDLE_POLLS_AFTER_DONE {
                        break; // the assertion below reports the shortfall
                    }
                }
            }
            r.retired()
        });
        let guard = SetOnDrop(done);
        let mut sent = 0u64;
        let mut progress = std::time::Instant::now();
        while sent < TOTAL {
            // SAFETY: empty WRITE: nothing borrowed.
            match unsafe { ring.stage(Msg::write(Local::Empty, RDMA_OFF)) } {
                Ok(_) => {
                    sent += 1;
                    progress = std::time::Instant::now();
                }
                Err(SendError::WouldBlock) => {
                    assert!(
                        progress.elapsed() < STUCK,
                        "poster blocked for good at {sent}: a completion was lost"
                    );
                    ring.flush().unwrap();
                    ring.sync(shared);
                    std::thread::yield_now();
                }
                Err(e) => panic!("{e}"),
            }
            if sent % 8 == 0 {
                ring.sync(shared);
            }
        }
        ring.flush().unwrap();
        ring.sync(shared);
        drop(guard);
        assert_eq!(poller.join().unwrap(), TOTAL);
        ring.sync(shared);
        assert_eq!(ring.outstanding(), 0);
    });
    assert_eq!(sq_outstanding(rig.pair.a.qp), 0);
}

#[test]
fn ud_mode_datagrams_and_multicast() {
    use common::nic::{UdPair, QKEY};
    const GRH: usize = 40;
    let ud = UdPair::new(64);
    let ah = ud.ah(ud.gid);
    let dest = UdDest {
        ah,
        remote_qpn: ud.b.qpn(),
        remote_qkey: QKEY,
    };
    // SAFETY: the UD pair, its AH and buffers outlive the rings.
    let (mut send, mut recv, mut sp, mut rp) = unsafe {
        let send: SendRing<N> = SendRing::new(
            ud.a.qp,
            SendConfig::new(A_SEND, 64, 64)
                .signal_every(8)
                .batch(4)
                .ud(dest),
        )
        .unwrap();
        let mut recv: RecvRing<N> = RecvRing::new(
            RecvTarget::Qp(ud.b.qp),
            ud.b.local().slice(0, 64 * SLOT).unwrap(),
            RecvConfig::new(B_RECV, SLOT, 64).repost_batch(8),
        )
        .unwrap();
        recv.fill().unwrap();
        (
            send,
            recv,
            CqPoller::<16>::new(ud.a.cq),
            CqPoller::<16>::new(ud.b.cq),
        )
    };
    let mut got = Vec::new();
    let mut pump = |recv: &mut RecvRing<N>, got: &mut Vec<(u32, Vec<u8>, u32)>| {
        for mut c in common::poll_all(&mut rp) {
            let m = recv.on_completion(&mut c).unwrap();
            let d = recv.data(&m).unwrap();
            assert_eq!(d.len(), m.byte_len() as usize);
            got.push((m.imm().unwrap(), d[GRH..].to_vec(), m.src_qp()));
            recv.release(m).unwrap();
        }
    };
    for i in 0..300u32 {
        let payload = i.to_le_bytes();
        loop {
            match send.send_now(Msg::send_imm(Local::Inline(&payload), i)) {
                Ok(_) => break,
                Err(SendError::WouldBlock) => {
                    for c in common::poll_all(&mut sp) {
                        send.on_completion(&c).unwrap();
                    }
                }
                Err(e) => panic!("{e}"),
            }
        }
        if i % 16 == 15 {
            pump(&mut recv, &mut got);
        }
    }
    pump(&mut recv, &mut got);
    assert_eq!(got.len(), 300);
    for (i, (imm, data, src)) in got.iter().enumerate() {
        assert_eq!(
            (*imm, data.as_slice(), *src),
            (i as u32, &(i as u32).to_le_bytes()[..], ud.a.qpn())
        );
    }
    // Multicast: B attached to ff0e::1, A sends to QPN 0xFFFFFF through an AH to the group.
    let mut mgid: ibv_gid = ud.gid;
    // SAFETY: writing the raw bytes of a plain union.
    unsafe {
        mgid.raw = [0; 16];
        mgid.raw[0] = 0xff;
        mgid.raw[1] = 0x0e;
        mgid.raw[15] = 1;
    }
    ud.attach_mcast(ud.b.qp, &mgid);
    let mah = ud.ah(mgid);
    // One ring per SQ: the same ring switches its preformatted destination to the group.
    // SAFETY: `mah` is a live AH of the pair's PD and outlives the ring.
    unsafe {
        send.set_ud_dest(UdDest {
            ah: mah,
            remote_qpn: 0xFF_FFFF,
            remote_qkey: QKEY,
        })
    }
    .unwrap();
    got.clear();
    send.send_now(Msg::send_imm(Local::Inline(b"md-tick"), 42))
        .unwrap();
    pump(&mut recv, &mut got);
    assert_eq!(got, vec![(42, b"md-tick".to_vec(), ud.a.qpn())]);
}
