//! Soak under faults: SendRing + RecvRing + credits between two softnic QPs, for at least
//! 10 million messages per behaviour profile in release mode (CI runs `cargo test
//! --release --test soak`; a debug build runs a short version), with faults injected at
//! pseudo-random points (a fixed seed, so a failure reproduces):
//!
//! - a QP error on either side (`inject_qp_error`: as a fatal error would);
//! - an RDMA WRITE the responder refuses (remote access error: the ring's rkey does not
//!   cover the range) — both QPs go to ERR;
//! - RNR with `rnr_retry` 0: the receiver holds every message so no receive is posted,
//!   then one message is sent without a credit;
//! - a CQ overflow on either side (`inject_cq_overflow`): in the Spec profile the CQ enters
//!   the error state (`poll_cq` fails) and everything is rebuilt; in the Rxe profile the
//!   completion is dropped silently (fault-truth S15), and the liveness watch
//!   ([`hotverbs::datapath::StallWatch`], clocked by loop iterations so the test does not
//!   depend on timing) notices that nothing progresses.
//!
//! Recovery is the documented one: both QPs to ERR, drain the flushes into the rings,
//! RESET, the rings' `reset`, reconnect, refill, fresh credits.
//!
//! Checked throughout: every message is delivered at most once and in order (sequence
//! numbers strictly increase at the receiver); every WR is retired exactly once (the
//! retired totals the completions and resets account for equal the posted totals after
//! each recovery, and never exceed them); softnic's queue occupancy equals the rings'
//! outstanding counts at every check point (send queues: posted and not released by a
//! polled completion; receive queues: posted and not consumed).

// softnic's test hooks (fault injection, queue occupancy) need the device itself.
#![cfg(feature = "softnic")]

use hotverbs::datapath::{CreditReturn, Credits, Progress, StallWatch};
use hotverbs::*;
use hotverbs_softnic::Profile;

/// Messages each profile delivers.
const MESSAGES: u64 = if cfg!(debug_assertions) {
    200_000
} else {
    10_000_000
};
/// Mean number of messages between two faults (about 300 faults per run).
const SPACING: u64 = MESSAGES / 300;
/// Loop iterations without any progress that count as a stall (softnic completes work
/// inside `post_send`, so a healthy connection progresses on every iteration).
const STALL_ITERATIONS: u64 = 64;
const TX_DEPTH: usize = 64;
const RX_SLOTS: u32 = 64;
const CREDIT_SLOTS: u32 = 16;
const BATCH: u32 = 16;
/// The responder's MR for RDMA WRITE (the ring is told it is larger, see `Fault::Rkey`).
const WRITE_MR: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    QpErrorA,
    QpErrorB,
    Rkey,
    Rnr,
    CqOverflowA,
    CqOverflowB,
}

const FAULTS: [Fault; 6] = [
    Fault::QpErrorA,
    Fault::QpErrorB,
    Fault::Rkey,
    Fault::Rnr,
    Fault::CqOverflowA,
    Fault::CqOverflowB,
];

/// xorshift64*: a fixed-seed stream, so a failing run reproduces.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the whole run saw; printed at the end and checked.
#[derive(Default, Debug)]
struct Tally {
    delivered: u64,
    posted: u64,
    recoveries: u64,
    rebuilds: u64,
    stalls: u64,
    faults: [u64; 6],
    wc_errors: u64,
    occupancy_checks: u64,
    last_seq: Option<u64>,
    next_seq: u64,
}

/// The accounting of one send ring across its life: retirements seen through completions
/// and resets must add up to what it posted, never more.
#[derive(Default)]
struct Acct {
    retired: u64,
}
impl Acct {
    fn absorb(&mut self, retired_total: u64, posted_total: u64, what: &str) {
        assert!(
            retired_total >= self.retired,
            "{what}: retired total went back"
        );
        assert!(
            retired_total <= posted_total,
            "{what}: retired {retired_total} > posted {posted_total}"
        );
        self.retired = retired_total;
    }
}

#[test]
fn soak_spec_profile() {
    soak(Profile::Spec, 0x5eed_0001);
}

#[test]
fn soak_rxe_profile() {
    soak(Profile::Rxe, 0x5eed_0002);
}

fn soak(profile: Profile, seed: u64) {
    let started = std::time::Instant::now();
    let ctx = Context::open_softnic_with(SoftnicConfig {
        profile,
        ..Default::default()
    })
    .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let port = ctx.port_info(None, None).unwrap();
    let mut rx_region = pd
        .alloc_mr((RX_SLOTS * 64) as usize, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let mut credit_region = pd
        .alloc_mr((CREDIT_SLOTS * 16) as usize, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let write_target = pd
        .alloc_mr(
            WRITE_MR,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let opts = ConnectOptions {
        rnr_retry: 0,
        ..Default::default()
    };
    let mut rng = Rng(seed);
    let mut t = Tally::default();
    let mut next_fault = 1 + rng.below(SPACING);
    while t.delivered < MESSAGES {
        // One incarnation: CQs, QPs and rings, rebuilt only when a CQ is lost (Spec
        // profile: an overflowed CQ stays in the error state until destroyed).
        t.rebuilds += 1;
        let cq_a = ctx.create_cq(256, None).unwrap();
        let cq_b = ctx.create_cq(256, None).unwrap();
        let qp = |cq: &Cq| {
            QpBuilder::new(&pd, cq, cq, QpType::Rc)
                .max_send_wr(TX_DEPTH as u32)
                .max_recv_wr(RX_SLOTS)
                .max_inline_data(64)
                .build()
                .unwrap()
        };
        let (a, b) = (qp(&cq_a), qp(&cq_b));
        Qp::connect_pair(&a, &b, &port, &opts).unwrap();
        let remote = RemoteBuf::from(write_target.remote());
        // The ring believes the remote buffer is 16x larger than the MR, so a WRITE past
        // the MR passes the ring's bounds check and the responder refuses it.
        let remote = RemoteBuf::new(remote.addr, remote.len * 16, remote.rkey);
        let mut tx = a
            .send_ring::<TX_DEPTH>(
                SendConfig::new(0, TX_DEPTH as u32, 64)
                    .signal_every(BATCH)
                    .batch(BATCH)
                    .remote(remote),
            )
            .unwrap();
        let mut crx = a
            .recv_ring::<16>(&mut credit_region, 0, RecvConfig::new(0, 16, CREDIT_SLOTS))
            .unwrap();
        let mut rx = b
            .recv_ring::<64>(&mut rx_region, 0, RecvConfig::new(0, 64, RX_SLOTS))
            .unwrap();
        let mut ctx_b = b
            .send_ring::<16>(SendConfig::new(0, 16, 0).signal_every(4))
            .unwrap();
        let mut poll_a = cq_a.poller::<32>().unwrap();
        let mut poll_b = cq_b.poller::<32>().unwrap();
        let (mut acct_tx, mut acct_cb) = (Acct::default(), Acct::default());

        'epoch: loop {
            // One connection epoch: from a fresh connect to the next fault.
            crx.fill().unwrap();
            rx.fill().unwrap();
            let mut credits = Credits::new(rx.posted());
            let mut owed = CreditReturn::new(RX_SLOTS / 4);
            let mut held: Vec<Received> = Vec::new();
            let mut hold = false;
            let mut watch = StallWatch::new();
            let mut iter = 0u64;
            let mut events = 0u64;
            let mut fault: Option<Fault> = None;
            let mut fault_iter = 0u64;
            let mut lost_cq = false;
            loop {
                iter += 1;
                // Sender: a batch of messages, one credit each.
                let n = (BATCH as u64)
                    .min(credits.available() as u64)
                    .min(tx.free()) as usize;
                let mut payloads = [[0u8; 8]; BATCH as usize];
                for (i, p) in payloads[..n].iter_mut().enumerate() {
                    *p = (t.next_seq + i as u64).to_le_bytes();
                }
                let mut batch = tx.batch();
                let mut pushed = 0;
                for p in &payloads[..n] {
                    match batch.push(Msg::send(Local::Inline(p))) {
                        Ok(_) => pushed += 1,
                        Err(e) => {
                            assert!(fault.is_some(), "send refused without a fault: {e}");
                            break;
                        }
                    }
                }
                for _ in 0..pushed {
                    assert!(credits.try_take());
                }
                t.next_seq += pushed;
                match batch.finish() {
                    Ok(()) => t.posted += pushed,
                    Err(e) => assert!(fault.is_some(), "flush refused without a fault: {e}"),
                }

                // Completions on A: the data ring and credit returns.
                let mut drained = true;
                match poll_a.poll() {
                    Ok(cs) => {
                        drained &= cs.len() < 32;
                        for c in cs {
                            events += 1;
                            if c.ring() == tx.ring_id() {
                                if let Err(e) = tx.on_completion(c) {
                                    t.wc_errors += 1;
                                    assert!(fault.is_some(), "tx completion {e} without a fault");
                                }
                                acct_tx.absorb(tx.retired_total(), tx.posted_total(), "tx");
                            } else {
                                match crx.on_completion(c) {
                                    Ok(m) => {
                                        let n = m.imm().expect("credit message carries imm");
                                        credits.grant(
                                            hotverbs::datapath::credits::decode_imm(n).unwrap(),
                                        );
                                        crx.release(m).unwrap();
                                    }
                                    Err(RecvError::Completion { .. }) => {
                                        assert!(fault.is_some(), "credit receive failed");
                                    }
                                    Err(e) => panic!("credit ring: {e}"),
                                }
                            }
                        }
                    }
                    Err(e) => {
                        assert_eq!(profile, Profile::Spec, "only a Spec CQ fails: {e}");
                        assert_eq!(fault, Some(Fault::CqOverflowA), "{e}");
                        lost_cq = true;
                    }
                }
                // Completions on B: data and the credit ring's sends.
                match poll_b.poll() {
                    Ok(cs) => {
                        drained &= cs.len() < 32;
                        for c in cs {
                            events += 1;
                            if c.ring() == ctx_b.ring_id() {
                                if let Err(e) = ctx_b.on_completion(c) {
                                    t.wc_errors += 1;
                                    assert!(fault.is_some(), "credit send {e} without a fault");
                                }
                                acct_cb.absorb(
                                    ctx_b.retired_total(),
                                    ctx_b.posted_total(),
                                    "credits",
                                );
                            } else {
                                match rx.on_completion(c) {
                                    Ok(m) => {
                                        let seq = u64::from_le_bytes(
                                            rx.data(&m).unwrap().try_into().unwrap(),
                                        );
                                        assert!(
                                            t.last_seq.is_none_or(|l| seq > l),
                                            "message {seq} after {:?}: duplicated or reordered",
                                            t.last_seq
                                        );
                                        t.last_seq = Some(seq);
                                        t.delivered += 1;
                                        if hold {
                                            held.push(m);
                                        } else {
                                            let before = rx.posted();
                                            rx.release(m).unwrap();
                                            owed.reposted(rx.posted() - before);
                                        }
                                    }
                                    Err(RecvError::Completion { .. }) => {
                                        assert!(fault.is_some(), "receive failed without a fault");
                                    }
                                    Err(e) => panic!("data ring: {e}"),
                                }
                            }
                        }
                    }
                    Err(e) => {
                        assert_eq!(profile, Profile::Spec, "only a Spec CQ fails: {e}");
                        assert_eq!(fault, Some(Fault::CqOverflowB), "{e}");
                        lost_cq = true;
                    }
                }
                // Both CQs were drained and nothing was posted since: a check point.
                if fault.is_none() && drained {
                    t.occupancy_checks += check_occupancy(&a, &b, &tx, &ctx_b, &rx, &crx, iter);
                }
                // Receiver: return credits.
                if fault.is_none() {
                    if let Some(n) = owed.take() {
                        let imm = hotverbs::datapath::credits::encode_imm(n);
                        match ctx_b.send_now(Msg::send_imm(Local::Empty, imm)) {
                            Ok(_) => {}
                            Err(SendError::WouldBlock) => owed.reposted(n),
                            Err(e) => panic!("credit return refused without a fault: {e}"),
                        }
                    }
                }

                if lost_cq {
                    break 'epoch;
                }
                // Liveness: on a healthy connection something happens every iteration.
                let p = Progress {
                    retired: events,
                    outstanding: 1,
                };
                if watch.check(p, iter, STALL_ITERATIONS).is_err() {
                    if fault.is_none() && hold {
                        // RNR setup done: the sender has no credit left and the receiver
                        // holds every message; the receives still posted are the ones
                        // whose credits were not returned yet. Use them up, then send
                        // one more: no receive is posted for it.
                        assert_eq!(rx.posted(), owed.take_all(), "posted = unreturned credits");
                        for _ in 0..=rx.posted() {
                            let payload = t.next_seq.to_le_bytes();
                            tx.send_now(Msg::send(Local::Inline(&payload))).unwrap();
                            t.next_seq += 1;
                            t.posted += 1;
                        }
                        fault = Some(Fault::Rnr);
                        fault_iter = iter;
                        watch.clear();
                        continue;
                    }
                    assert!(
                        fault.is_some(),
                        "{profile:?}: stalled without a fault: {t:?}, tx {tx:?}, rx {rx:?}"
                    );
                    t.stalls += 1;
                    break;
                }
                if fault.is_some() && (tx.error().is_some() || ctx_b.error().is_some()) {
                    // The error surfaced; drain what is left in the recovery.
                    break;
                }
                if fault.is_some() && iter - fault_iter > 4096 {
                    // The fault was absorbed (rxe: a dropped completion of a WR that a
                    // later completion retired anyway): recover anyway, so the rings and
                    // the device agree again.
                    break;
                }
                if t.delivered >= MESSAGES {
                    break;
                }

                if fault.is_none() && !hold && t.delivered >= next_fault {
                    next_fault = t.delivered + SPACING / 2 + rng.below(SPACING);
                    let f = FAULTS[rng.below(FAULTS.len() as u64) as usize];
                    t.faults[f as usize] += 1;
                    fault_iter = iter;
                    // SAFETY: live softnic QPs and CQs of this incarnation.
                    unsafe {
                        match f {
                            Fault::QpErrorA => hotverbs_softnic::inject_qp_error(a.as_raw()),
                            Fault::QpErrorB => hotverbs_softnic::inject_qp_error(b.as_raw()),
                            Fault::CqOverflowA => {
                                hotverbs_softnic::inject_cq_overflow(cq_a.as_raw(), 1)
                            }
                            Fault::CqOverflowB => {
                                hotverbs_softnic::inject_cq_overflow(cq_b.as_raw(), 1)
                            }
                            Fault::Rkey | Fault::Rnr => {}
                        }
                    }
                    match f {
                        Fault::Rkey => {
                            let off = WRITE_MR as u64 + 64 * rng.below(32);
                            tx.send_now(Msg::write(Local::Inline(&[7u8; 8]), off))
                                .unwrap();
                            t.posted += 1;
                            fault = Some(f);
                        }
                        // Set up first: hold every message until no receive is posted.
                        Fault::Rnr => hold = true,
                        _ => fault = Some(f),
                    }
                }
            }

            // Recovery: both QPs to ERR, drain the flushes, RESET, reset the rings.
            t.recoveries += 1;
            a.to_error().unwrap();
            b.to_error().unwrap();
            for m in held.drain(..) {
                rx.release(m).unwrap();
            }
            let mut quiet = 0;
            while quiet < 2 {
                let mut n = 0;
                if let Ok(cs) = poll_a.poll() {
                    for c in cs {
                        n += 1;
                        if c.ring() == tx.ring_id() {
                            let _ = tx.on_completion(c);
                        } else if let Ok(m) = crx.on_completion(c) {
                            crx.release(m).unwrap();
                        }
                    }
                } else {
                    lost_cq = true;
                }
                if let Ok(cs) = poll_b.poll() {
                    for c in cs {
                        n += 1;
                        if c.ring() == ctx_b.ring_id() {
                            let _ = ctx_b.on_completion(c);
                        } else if let Ok(m) = rx.on_completion(c) {
                            // A message that arrived before the error still counts.
                            let seq = u64::from_le_bytes(rx.data(&m).unwrap().try_into().unwrap());
                            assert!(t.last_seq.is_none_or(|l| seq > l));
                            t.last_seq = Some(seq);
                            t.delivered += 1;
                            rx.release(m).unwrap();
                        }
                    }
                } else {
                    lost_cq = true;
                }
                quiet = if n == 0 { quiet + 1 } else { 0 };
            }
            acct_tx.absorb(tx.retired_total(), tx.posted_total(), "tx");
            acct_cb.absorb(ctx_b.retired_total(), ctx_b.posted_total(), "credits");
            if lost_cq {
                break;
            }
            // RESET through the rings that own each QP's queues (the QPs' own reset is
            // refused while they do): the device holds none of the rings' WRs after it.
            tx.reset_qp_with(&mut crx)
                .expect("A: SendRing::reset_qp_with");
            ctx_b
                .reset_qp_with(&mut rx)
                .expect("B: SendRing::reset_qp_with");
            // Every WR retired exactly once: by a completion or by the reset.
            acct_tx.absorb(tx.retired_total(), tx.posted_total(), "tx");
            assert_eq!(
                tx.retired_total(),
                tx.posted_total(),
                "tx: every WR retired"
            );
            acct_cb.absorb(ctx_b.retired_total(), ctx_b.posted_total(), "credits");
            assert_eq!(
                ctx_b.retired_total(),
                ctx_b.posted_total(),
                "credits: every WR retired"
            );
            t.occupancy_checks += check_occupancy(&a, &b, &tx, &ctx_b, &rx, &crx, 0);
            Qp::connect_pair(&a, &b, &port, &opts).unwrap();
            if t.delivered >= MESSAGES {
                break;
            }
        }
    }
    eprintln!(
        "soak {profile:?}: {} messages delivered, {} posted, {} faults {:?} (QpErrorA, \
         QpErrorB, Rkey, Rnr, CqOverflowA, CqOverflowB), {} recoveries, {} rebuilds, {} \
         stalls detected, {} error completions, {} occupancy checks, {:.1} s",
        t.delivered,
        t.posted,
        t.faults.iter().sum::<u64>(),
        t.faults,
        t.recoveries,
        t.rebuilds,
        t.stalls,
        t.wc_errors,
        t.occupancy_checks,
        started.elapsed().as_secs_f64()
    );
    assert!(t.delivered >= MESSAGES);
    assert!(
        t.occupancy_checks > t.recoveries,
        "occupancy checked during traffic too"
    );
    assert!(
        t.faults.iter().all(|&n| n > 0),
        "every fault kind was injected: {:?}",
        t.faults
    );
    if profile == Profile::Rxe {
        assert!(t.stalls > 0, "a silently dropped completion was detected");
    }
}

/// softnic's queue occupancy equals the rings' outstanding counts (every 64th iteration,
/// and after each recovery); returns 1 if it checked.
fn check_occupancy<const T: usize, const C: usize, const R: usize, const K: usize>(
    a: &Qp,
    b: &Qp,
    tx: &SendRing<'_, T>,
    ctx_b: &SendRing<'_, C>,
    rx: &RecvRing<'_, R>,
    crx: &RecvRing<'_, K>,
    iter: u64,
) -> u64 {
    if iter % 64 != 0 {
        return 0;
    }
    // SAFETY: live softnic QPs.
    let (sq_a, sq_b, rq_a, rq_b) = unsafe {
        (
            hotverbs_softnic::sq_outstanding(a.as_raw()),
            hotverbs_softnic::sq_outstanding(b.as_raw()),
            hotverbs_softnic::rq_outstanding(a.as_raw()),
            hotverbs_softnic::rq_outstanding(b.as_raw()),
        )
    };
    assert_eq!(sq_a as u64, tx.outstanding(), "A's send queue");
    assert_eq!(sq_b as u64, ctx_b.outstanding(), "B's send queue");
    assert_eq!(rq_a, crx.posted(), "A's receive queue");
    assert_eq!(rq_b, rx.posted(), "B's receive queue");
    1
}
