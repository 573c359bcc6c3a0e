//! SendRing / RecvRing / CqPoller / credits / split mode on the counting test device
//! (`hotverbs_softnic::counting`), which completes every signaled WR at post time and has
//! hooks for post failures, error completions, QP error and RESET.

mod common;

use common::{drain_send, poll_all};
use hotverbs_datapath::*;
use hotverbs_ffi::*;
use hotverbs_softnic::counting::CountingDevice;

const REMOTE: RemoteBuf = RemoteBuf::new(0x10_0000, 1 << 20, 0x77);

fn ring<const N: usize>(dev: &CountingDevice, cfg: SendConfig) -> SendRing<N> {
    // SAFETY: the device outlives every ring a test makes from it.
    unsafe { SendRing::new(dev.qp(), cfg) }.expect("config")
}

fn poller<const B: usize>(dev: &CountingDevice) -> CqPoller<B> {
    // SAFETY: as above.
    unsafe { CqPoller::new(dev.cq()) }
}

fn all_ops(dest: LocalBuf, data: &[u8]) -> [Msg<'_>; 8] {
    [
        Msg::send(Local::Inline(data)),
        Msg::send_imm(Local::Inline(data), 7),
        Msg::write(Local::Inline(data), 64),
        Msg::write_imm(Local::Inline(data), 64, 9),
        Msg::read(dest, 128),
        Msg::fetch_add(dest.slice(0, 8).unwrap(), 256, 1),
        Msg::cmp_swap(dest.slice(0, 8).unwrap(), 264, 0, 5),
        Msg::send(Local::Empty),
    ]
}

fn wc_op(op: Opcode) -> ibv_wc_opcode {
    match op {
        Opcode::Send | Opcode::SendImm => IBV_WC_SEND,
        Opcode::Write | Opcode::WriteImm => IBV_WC_RDMA_WRITE,
        Opcode::Read => IBV_WC_RDMA_READ,
        Opcode::FetchAdd => IBV_WC_FETCH_ADD,
        Opcode::CmpSwap => IBV_WC_COMP_SWAP,
        other => panic!("wc_op: no completion opcode for {other:?} in this test"),
    }
}

#[test]
fn ping_pong_every_operation() {
    let dev = CountingDevice::new(64);
    let mut r: SendRing<8> = ring(
        &dev,
        SendConfig::new(3, 8, 64)
            .signal_every(1)
            .batch(1)
            .remote(REMOTE),
    );
    let mut p: CqPoller<4> = poller(&dev);
    let dest = LocalBuf::new(0x2000, 64, 0x55);
    let data = [1u8; 32];
    for (k, msg) in all_ops(dest, &data).into_iter().enumerate() {
        // SAFETY: `dest` is never dereferenced by the counting device.
        let seq = unsafe { r.stage(msg) }.unwrap();
        assert_eq!(
            dev.doorbells(),
            seq + 1,
            "batch(1) posts each message alone"
        );
        let wr = r.slot_wr(seq);
        // The first four carry inline bytes; READ/atomics write local memory; the last is empty.
        let expect_inline = k < 4;
        assert_eq!(
            wr.send_flags & IBV_SEND_INLINE != 0,
            expect_inline,
            "{:?} {:#x}",
            msg.opcode(),
            wr.send_flags
        );
        let cs = poll_all(&mut p);
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].opcode(), wc_op(msg.opcode()));
        assert_eq!((cs[0].ring(), cs[0].seq()), (3, seq));
        assert_eq!(r.on_completion(&cs[0]), Ok(1));
        assert_eq!(r.outstanding(), 0);
        assert!(r.is_retired(seq));
    }
    // The remote fields went into the right union members.
    let w = r.slot_wr(2);
    // SAFETY: seq 2 was a WRITE: `rdma` is the member in use.
    unsafe {
        assert_eq!(
            (w.wr.rdma.remote_addr, w.wr.rdma.rkey),
            (REMOTE.addr + 64, REMOTE.rkey)
        );
        assert_eq!(u32::from_be(r.slot_wr(3).__bindgen_anon_1.imm_data), 9);
        let a = r.slot_wr(6).wr.atomic;
        assert_eq!(
            (a.remote_addr, a.compare_add, a.swap, a.rkey),
            (REMOTE.addr + 264, 0, 5, REMOTE.rkey)
        );
    }
    assert_eq!(r.slot_wr(7).num_sge, 0, "zero-byte message has no SGE");
}

#[test]
fn streaming_every_operation() {
    for (k, _) in all_ops(LocalBuf::new(0, 8, 0), &[]).iter().enumerate() {
        let dev = CountingDevice::new(256);
        let mut r: SendRing<64> = ring(
            &dev,
            SendConfig::new(1, 64, 64)
                .signal_every(16)
                .batch(8)
                .remote(REMOTE),
        );
        let mut p: CqPoller<16> = poller(&dev);
        let dest = LocalBuf::new(0x4000, 8, 1);
        let data = [0u8; 16];
        let mut sent = 0u64;
        while sent < 10_000 {
            let msg = all_ops(dest, &data)[k];
            // SAFETY: counting device never touches memory.
            match unsafe { r.stage(msg) } {
                Ok(seq) => {
                    assert_eq!(seq, sent);
                    sent += 1;
                }
                Err(SendError::WouldBlock) => {
                    assert!(
                        r.signaled_in_flight(),
                        "full ring without a signaled WR in flight"
                    );
                    drain_send(&mut p, &mut r);
                }
                Err(e) => panic!("{e}"),
            }
            assert!(r.outstanding() <= 64);
        }
        r.flush().unwrap();
        drain_send(&mut p, &mut r);
        assert_eq!(dev.send_wrs(), 10_000);
        assert_eq!(
            r.retired_total(),
            10_000,
            "10_000 is a multiple of 16: all retired"
        );
        assert_eq!(dev.cq_overflows(), 0);
    }
}

#[test]
fn batching_sizes_1_to_n() {
    const N: usize = 32;
    for b in 1..=N as u32 {
        let dev = CountingDevice::new(512);
        let mut r: SendRing<N> = ring(
            &dev,
            SendConfig::new(0, N as u32, 64).signal_every(1).batch(b),
        );
        let mut p: CqPoller<32> = poller(&dev);
        let msgs = vec![[5u8; 8]; 4 * N];
        let mut batch = r.batch();
        let mut pushed = 0u64;
        for (i, m) in msgs.iter().enumerate().take((N / b as usize) * b as usize) {
            assert_eq!(batch.push(Msg::send(Local::Inline(m))), Ok(i as u64));
            pushed += 1;
            assert_eq!(
                batch.staged(),
                pushed % b as u64,
                "auto-flush exactly at {b}"
            );
        }
        batch.finish().unwrap();
        assert_eq!(
            dev.doorbells(),
            pushed / b as u64,
            "one doorbell per {b} WRs"
        );
        assert_eq!(dev.send_wrs(), pushed);
        let (seen, retired, errs) = drain_send(&mut p, &mut r);
        assert!(errs.is_empty());
        assert_eq!((seen as u64, retired), (pushed, pushed));
        // An explicit flush of a partial batch.
        if b > 1 {
            let d0 = dev.doorbells();
            r.send_now(Msg::send(Local::Empty)).unwrap();
            assert_eq!(dev.doorbells(), d0 + 1);
        }
    }
}

#[test]
fn signal_periods_1_to_half_depth() {
    const N: usize = 32;
    for k in 1..=(N as u64 / 2) {
        let dev = CountingDevice::new(1024);
        let mut r: SendRing<N> = ring(
            &dev,
            SendConfig::new(9, N as u32, 64)
                .signal_every(k as u32)
                .batch(4),
        );
        let mut p: CqPoller<8> = poller(&dev);
        let total = 10 * k * N as u64;
        let mut completions = 0u64;
        let mut signaled = 0u64;
        for s in 0..total {
            loop {
                // SAFETY: empty message: nothing borrowed.
                match unsafe { r.stage(Msg::send(Local::Empty)) } {
                    Ok(seq) => {
                        assert_eq!(seq, s);
                        break;
                    }
                    Err(SendError::WouldBlock) => {
                        assert!(r.signaled_in_flight());
                        for c in poll_all(&mut p) {
                            let n = r.on_completion(&c).unwrap();
                            assert!(n >= 1 && n <= N as u64);
                            completions += 1;
                        }
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            // Signaled exactly when the schedule says so, or when this WR filled the ring.
            let is_signaled = r.slot_wr(s).send_flags & IBV_SEND_SIGNALED != 0;
            assert_eq!(
                is_signaled,
                s % k == k - 1 || r.free() == 0,
                "k={k} seq={s}"
            );
            signaled += is_signaled as u64;
            assert!(r.outstanding() + r.staged() <= N as u64);
        }
        r.flush().unwrap();
        let (seen, _, errs) = drain_send(&mut p, &mut r);
        assert!(errs.is_empty());
        completions += seen as u64;
        assert_eq!(completions, signaled, "k={k}: one CQE per signaled WR");
        assert!(signaled >= total / k);
        assert_eq!(dev.send_wrs(), total);
        assert_eq!(
            r.outstanding(),
            0,
            "total is a multiple of k: the last WR is signaled"
        );
    }
}

#[test]
fn back_pressure_is_would_block_and_drains() {
    const N: usize = 16;
    let dev = CountingDevice::new(64);
    let mut r: SendRing<N> = ring(
        &dev,
        SendConfig::new(2, N as u32, 64).signal_every(8).batch(16),
    );
    let mut p: CqPoller<8> = poller(&dev);
    for i in 0..N as u64 {
        assert_eq!(r.send_now(Msg::send(Local::Empty)), Ok(i));
    }
    assert_eq!(r.free(), 0);
    assert_eq!(
        r.send_now(Msg::send(Local::Empty)),
        Err(SendError::WouldBlock)
    );
    assert_eq!(r.outstanding(), N as u64);
    assert!(r.signaled_in_flight());
    // Seqs 7 and 15 are signaled (the schedule), 15 also fills the ring.
    let (seen, retired, _) = drain_send(&mut p, &mut r);
    assert_eq!((seen, retired), (2, N as u64));
    assert_eq!(r.free(), N as u64);
    // A ring filled through staging alone flushes itself at the last slot.
    let d0 = dev.doorbells();
    for _ in 0..N {
        // SAFETY: empty messages.
        unsafe { r.stage(Msg::send(Local::Empty)) }.unwrap();
    }
    assert_eq!(r.staged(), 0, "the filling WR flushed the chain");
    assert_eq!(dev.doorbells(), d0 + 1);
    // Unsignaled-by-schedule last WR was forced signaled.
    assert!(r.slot_wr(2 * N as u64 - 1).send_flags & IBV_SEND_SIGNALED != 0);
    let (_, retired, _) = drain_send(&mut p, &mut r);
    assert_eq!(retired, N as u64);
}

#[test]
fn argument_errors() {
    let dev = CountingDevice::new(16);
    let mut r: SendRing<8> = ring(
        &dev,
        SendConfig::new(0, 8, 16).remote(RemoteBuf::new(0x1000, 64, 5)),
    );
    let big = [0u8; 17];
    assert_eq!(
        r.send_now(Msg::send(Local::Inline(&big))),
        Err(SendError::InlineTooLong { len: 17, max: 16 })
    );
    assert_eq!(
        r.send_now(Msg::write(Local::Inline(&big[..8]), 60)),
        Err(SendError::RemoteOutOfRange { offset: 60, len: 8 })
    );
    let d = LocalBuf::new(0x10, 8, 1);
    assert_eq!(r.send_now(Msg::read(d, 0)), Err(SendError::NotInline));
    // SAFETY: the counting device never touches `d`.
    unsafe {
        assert_eq!(
            r.stage(Msg::fetch_add(d, 4, 1)),
            Err(SendError::AtomicMisaligned)
        );
        assert_eq!(
            r.stage(Msg::fetch_add(LocalBuf::new(0x10, 4, 1), 8, 1)),
            Err(SendError::AtomicMisaligned)
        );
    }
    let mut plain: SendRing<8> = ring(&dev, SendConfig::new(0, 8, 16));
    assert_eq!(
        plain.send_now(Msg::write(Local::Empty, 0)),
        Err(SendError::NoRemote)
    );
    assert_eq!(
        (r.outstanding(), r.staged(), plain.staged()),
        (0, 0, 0),
        "rejected messages take no slot"
    );
    // Configuration checks.
    let bad = |cfg| {
        // SAFETY: the device outlives the attempt.
        unsafe { SendRing::<8>::new(dev.qp(), cfg) }.err()
    };
    assert_eq!(bad(SendConfig::new(0, 16, 0)), Some(ConfigError::Depth));
    assert_eq!(
        bad(SendConfig::new(0, 8, 0).signal_every(5)),
        Some(ConfigError::SignalPeriod)
    );
    assert_eq!(
        bad(SendConfig::new(0, 8, 0).batch(9)),
        Some(ConfigError::Batch)
    );
}

#[test]
fn failed_post_reports_first_rejected_and_frees_the_rest() {
    let dev = CountingDevice::new(64);
    let mut r: SendRing<16> = ring(&dev, SendConfig::new(4, 16, 64).signal_every(2).batch(16));
    let mut p: CqPoller<16> = poller(&dev);
    let data = [[0u8; 4]; 8];
    let mut b = r.batch();
    for d in &data {
        b.push(Msg::send(Local::Inline(d))).unwrap();
    }
    dev.fail_next_post(12, 3); // ENOMEM at the 4th WR
    let e = b.finish().unwrap_err();
    assert_eq!(
        e,
        SendError::Post(PostError {
            verb: "ibv_post_send",
            errno: 12,
            first_rejected: 3,
            first_rejected_seq: 3
        })
    );
    assert_eq!((r.posted_total(), r.staged(), r.outstanding()), (3, 0, 3));
    assert_eq!(dev.send_wrs(), 3);
    // Seq 1 was signaled; seq 3 (rejected) would have been: the schedule rewinds to it.
    let seq = r.send_now(Msg::send(Local::Empty)).unwrap();
    assert_eq!(seq, 3);
    assert!(r.slot_wr(3).send_flags & IBV_SEND_SIGNALED != 0);
    let (seen, retired, errs) = drain_send(&mut p, &mut r);
    assert!(errs.is_empty());
    assert_eq!((seen, retired, r.outstanding()), (2, 4, 0));
}

#[test]
fn error_completion_flushes_are_accounted_then_reset() {
    let dev = CountingDevice::new(256);
    let mut r: SendRing<32> = ring(&dev, SendConfig::new(6, 32, 64).signal_every(8).batch(4));
    let mut p: CqPoller<8> = poller(&dev);
    for _ in 0..5 {
        r.send_now(Msg::send(Local::Empty)).unwrap();
    }
    dev.fail_next_wr(IBV_WC_REM_ACCESS_ERR); // bad rkey on seq 5
    for _ in 0..6 {
        r.send_now(Msg::send(Local::Empty)).unwrap();
    }
    assert_eq!(r.outstanding(), 11);
    let (seen, _, errs) = drain_send(&mut p, &mut r);
    let retired = r.retired_total();
    // seq 5 errors (unsignaled, still a CQE), 6..=10 flush: each retires exactly itself
    // (and seq 0..=4 with the first).
    assert_eq!(seen, 6);
    assert_eq!(retired, 11);
    assert_eq!(errs[0], WcError::RemAccess);
    assert!(errs[1..].iter().all(|e| *e == WcError::WrFlush));
    assert_eq!(r.error(), Some(WcError::RemAccess));
    assert_eq!(
        r.send_now(Msg::send(Local::Empty)),
        Err(SendError::QpError(WcError::RemAccess))
    );
    assert_eq!(r.outstanding(), 0);
    // QP: RESET -> INIT -> RTR -> RTS.
    dev.reset_qp();
    // SAFETY: the QP went through RESET.
    let dropped = unsafe { r.reset() };
    assert_eq!(dropped, 0, "everything was accounted by completions");
    assert_eq!(r.free(), 32);
    for _ in 0..64 {
        loop {
            match r.send_now(Msg::send(Local::Empty)) {
                Ok(_) => break,
                Err(SendError::WouldBlock) => {
                    drain_send(&mut p, &mut r);
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    drain_send(&mut p, &mut r);
    assert_eq!(r.error(), None);
    assert_eq!(r.retired_total(), 11 + 64);
}

#[test]
fn reset_with_wrs_outstanding_drops_them_and_ignores_stale_cqes() {
    let dev = CountingDevice::new(256);
    let mut r: SendRing<32> = ring(&dev, SendConfig::new(6, 32, 64).signal_every(16).batch(4));
    let mut p: CqPoller<8> = poller(&dev);
    dev.set_qp_error();
    for _ in 0..10 {
        r.send_now(Msg::send(Local::Empty)).unwrap();
    }
    // 10 flush CQEs sit in the CQ; the setup layer resets the QP before draining them.
    dev.reset_qp();
    // SAFETY: the QP went through RESET.
    assert_eq!(unsafe { r.reset() }, 10);
    assert_eq!((r.outstanding(), r.free()), (0, 32));
    let (seen, retired, errs) = drain_send(&mut p, &mut r);
    assert_eq!((seen, retired), (10, 0), "stale completions retire nothing");
    assert!(
        errs.is_empty(),
        "stale flushes do not re-enter the error state"
    );
    assert_eq!(r.error(), None);
    let seq = r.send_now(Msg::send(Local::Empty)).unwrap();
    assert_eq!(seq, 10, "sequence numbers continue across a reset");
}

#[test]
fn leaked_batch_drops_its_unposted_wrs() {
    let dev = CountingDevice::new(64);
    let mut r: SendRing<16> = ring(&dev, SendConfig::new(0, 16, 64).batch(16));
    {
        let data = [1u8; 8];
        let mut b = r.batch();
        b.push(Msg::send(Local::Inline(&data))).unwrap();
        core::mem::forget(b);
    }
    r.flush().unwrap();
    assert_eq!(
        dev.doorbells(),
        0,
        "the dangling inline WR was dropped, not posted"
    );
    assert_eq!((r.staged(), r.outstanding()), (0, 0));
}

#[test]
fn ring_moved_between_stage_and_flush_relinks() {
    let dev = CountingDevice::new(64);
    let mut r: SendRing<8> = ring(&dev, SendConfig::new(0, 8, 64).signal_every(1).batch(8));
    for _ in 0..3 {
        // SAFETY: empty messages.
        unsafe { r.stage(Msg::send(Local::Empty)) }.unwrap();
    }
    let mut boxed = Box::new(r);
    boxed.flush().unwrap();
    assert_eq!((dev.doorbells(), dev.send_wrs()), (1, 3));
    let mut p: CqPoller<8> = poller(&dev);
    let (seen, retired, _) = drain_send(&mut p, &mut boxed);
    assert_eq!((seen, retired), (3, 3));
}

#[test]
fn ud_mode_preformats_the_destination() {
    let dev = CountingDevice::new(64);
    let ah = 0x1234usize as *mut ibv_ah;
    let dest = UdDest {
        ah,
        remote_qpn: 0xFF_FFFF,
        remote_qkey: 0x1111_1111,
    };
    let mut r: SendRing<8> = ring(&dev, SendConfig::new(0, 8, 64).ud(dest));
    for _ in 0..20 {
        match r.send_now(Msg::send_imm(Local::Inline(b"md"), 3)) {
            Ok(_) | Err(SendError::WouldBlock) => {}
            Err(e) => panic!("{e}"),
        }
        let mut p: CqPoller<8> = poller(&dev);
        drain_send(&mut p, &mut r);
    }
    for s in 0..8 {
        // SAFETY: UD ring: `ud` is the member in use.
        let ud = unsafe { r.slot_wr(s).wr.ud };
        assert_eq!(
            (ud.ah, ud.remote_qpn, ud.remote_qkey),
            (ah, 0xFF_FFFF, 0x1111_1111)
        );
    }
    assert_eq!(
        r.send_now(Msg::write(Local::Empty, 0)),
        Err(SendError::NoRemote)
    );
    // SAFETY: the device outlives the attempt.
    let both =
        unsafe { SendRing::<8>::new(dev.qp(), SendConfig::new(0, 8, 0).ud(dest).remote(REMOTE)) };
    assert_eq!(both.err(), Some(ConfigError::RemoteAndUd));
}

fn recv_ring_roundtrip(use_srq: bool) {
    const SLOT: u32 = 64;
    let dev = CountingDevice::new(256);
    // With an SRQ the QP consumes from it (a QP created with `init_attr.srq`).
    dev.use_srq(use_srq);
    let mut region = vec![0u8; 16 * SLOT as usize];
    for (i, b) in region.iter_mut().enumerate() {
        *b = (i / SLOT as usize) as u8;
    }
    let buf = LocalBuf::new(region.as_ptr() as u64, region.len() as u32, 0x42);
    let target = if use_srq {
        RecvTarget::Srq(dev.srq())
    } else {
        RecvTarget::Qp(dev.qp())
    };
    // SAFETY: `region` outlives the ring and is only read through it.
    let mut rr: RecvRing<16> =
        unsafe { RecvRing::new(target, buf, RecvConfig::new(5, SLOT, 16).repost_batch(4)) }
            .unwrap();
    assert_eq!(rr.fill(), Ok(16));
    assert_eq!((dev.posted_recvs(), dev.recv_doorbells()), (16, 1));
    let mut p: CqPoller<8> = poller(&dev);
    let mut held = Vec::new();
    for i in 0..40u32 {
        assert!(dev.complete_recv(10 + i % 5, (i % 2 == 0).then_some(i)));
        for mut c in poll_all(&mut p) {
            assert_eq!(c.ring(), 5);
            let m = rr.on_completion(&mut c).unwrap();
            assert_eq!(m.byte_len(), 10 + i % 5);
            assert_eq!(m.imm(), (i % 2 == 0).then_some(i));
            let d = rr.data(&m).unwrap();
            assert_eq!(d.len(), (10 + i % 5) as usize);
            assert!(
                d.iter().all(|&b| b == m.slot() as u8),
                "read in place from its slot"
            );
            held.push(m);
        }
        if held.len() == 3 {
            for m in held.drain(..) {
                rr.release(m).unwrap();
            }
        }
        assert_eq!(rr.posted() + rr.held() + rr.pending(), 16);
        assert_eq!(rr.posted() as usize, dev.posted_recvs());
    }
    // 40 receives, releases in threes, re-posted in chains of >= 4.
    assert_eq!(dev.recv_wrs(), 16 + 36);
    assert!(dev.recv_doorbells() <= 1 + 36 / 4);
    // Flush on QP error: slots go idle; reset re-posts all but the held ones. An SRQ's
    // receives are neither flushed nor dropped: reset leaves them posted.
    dev.set_qp_error();
    let mut flushed = 0;
    for mut c in poll_all(&mut p) {
        match rr.on_completion(&mut c) {
            Err(RecvError::Completion {
                error: WcError::WrFlush,
                ..
            }) => flushed += 1,
            other => panic!("{other:?}"),
        }
    }
    if use_srq {
        assert_eq!(flushed, 0, "a QP error does not flush the SRQ");
    } else {
        assert_eq!(rr.posted(), 0);
    }
    assert_eq!(flushed as u32 + rr.pending() + rr.held() + rr.posted(), 16);
    dev.reset_qp();
    let expect = if use_srq {
        rr.pending()
    } else {
        16 - rr.held()
    };
    let wrs_before = dev.recv_wrs();
    // SAFETY: the QP went through RESET (nothing of this ring is on its RQ); on the SRQ the
    // posted receives stay posted and reset leaves them alone.
    assert_eq!(unsafe { rr.reset() } as u32, expect);
    rr.repost().unwrap();
    assert_eq!(
        dev.recv_wrs() - wrs_before,
        expect as u64,
        "each slot posted once"
    );
    assert_eq!(
        (rr.posted() as usize, rr.posted() + rr.held()),
        (dev.posted_recvs(), 16)
    );
    for m in held {
        rr.release(m).unwrap();
    }
    rr.repost().unwrap();
    assert_eq!(dev.posted_recvs(), 16);
    // A completion of a slot that is not posted is stale.
    let mut w = unsafe_zeroed_wc();
    w.wr_id = rr.slot_wr_id(99);
    w.qp_num = hotverbs_softnic::counting::QP_NUM;
    // SAFETY: forged on purpose: the ring must refuse it.
    let mut c = unsafe { Completion::from_raw(w) };
    assert_eq!(
        rr.on_completion(&mut c),
        Err(RecvError::Stale { wr_id: w.wr_id })
    );
}

fn unsafe_zeroed_wc() -> ibv_wc {
    // SAFETY: ibv_wc is plain data.
    unsafe { core::mem::zeroed() }
}

#[test]
fn recv_ring_on_rq() {
    recv_ring_roundtrip(false);
}

#[test]
fn recv_ring_on_srq() {
    recv_ring_roundtrip(true);
}

/// Loopback: each SEND consumes one of the device's posted receives. With credits the
/// sender never outruns the receiver; without them the same traffic hits RNR.
fn loopback_stream(use_credits: bool) -> Result<u64, WcError> {
    let dev = CountingDevice::new(512);
    dev.set_loopback(true);
    let region = vec![0u8; 8 * 32];
    // SAFETY: region outlives the ring.
    let mut rr: RecvRing<8> = unsafe {
        RecvRing::new(
            RecvTarget::Qp(dev.qp()),
            LocalBuf::new(region.as_ptr() as u64, 256, 1),
            RecvConfig::new(1, 32, 8).repost_batch(2),
        )
    }
    .unwrap();
    rr.fill().unwrap();
    let mut sr: SendRing<32> = ring(&dev, SendConfig::new(2, 32, 64).signal_every(4).batch(1));
    let mut p: CqPoller<16> = poller(&dev);
    let mut credits = Credits::new(8);
    let mut ret = CreditReturn::new(4);
    let mut received = 0u64;
    let mut sent = 0u64;
    let mut backlog: Vec<Received> = Vec::new();
    let mut step = 0u64;
    while received < 2000 {
        step += 1;
        if !use_credits || credits.try_take() {
            match sr.send_now(Msg::send_imm(Local::Inline(b"order"), sent as u32)) {
                Ok(_) => sent += 1,
                Err(SendError::WouldBlock) => credits.grant(1),
                Err(SendError::QpError(e)) => return Err(e),
                Err(e) => panic!("{e}"),
            }
        }
        for mut c in poll_all(&mut p) {
            if c.ring() == 2 {
                sr.on_completion(&c)?;
            } else {
                let m = rr.on_completion(&mut c).map_err(|e| match e {
                    RecvError::Completion { error, .. } => error,
                    e => panic!("{e}"),
                })?;
                assert_eq!(m.imm(), Some(received as u32));
                received += 1;
                backlog.push(m);
            }
        }
        // The receiver is slow: it releases only every third step.
        if step % 24 == 0 {
            for m in backlog.drain(..) {
                let before = rr.pending();
                rr.release(m).unwrap();
                if rr.pending() < before + 1 {
                    ret.reposted(before + 1 - rr.pending());
                }
            }
            // Piggyback / return credits once enough have built up.
            if let Some(n) = ret.take() {
                credits.grant(credits::decode_imm(credits::encode_imm(n)).unwrap());
            }
        }
        assert!(step < 1_000_000, "no progress");
    }
    Ok(received)
}

#[test]
fn credits_prevent_rnr() {
    assert_eq!(loopback_stream(true), Ok(2000));
    assert_eq!(
        loopback_stream(false),
        Err(WcError::RnrRetryExc),
        "without credits the same traffic RNRs"
    );
}

/// Sets the flag when dropped: the poster's "done" also on panic, so the poller thread
/// always ends and a stuck run fails instead of hanging.
struct SetOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Time without progress after which the poster gives up (a lost completion would otherwise
/// block it forever). A failure path only: a loaded machine may starve the poller thread
/// for a while, which must not fail the test.
const STUCK: std::time::Duration = std::time::Duration::from_secs(120);
/// Empty polls after the poster is done (every completion is in the CQ by then: the
/// device completes inside the post) after which the poller gives up.
const IDLE_POLLS_AFTER_DONE: u64 = 2_000_000;

#[test]
fn split_mode_poster_and_poller_threads() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const TOTAL: u64 = 200_000;
    let dev = CountingDevice::new(4096);
    let mut r: SendRing<64> = ring(&dev, SendConfig::new(8, 64, 64).signal_every(16).batch(8));
    let done = AtomicBool::new(false);
    let (shared, mut retirer) = r.split();
    std::thread::scope(|s| {
        let poller_thread = s.spawn(|| {
            let mut p: CqPoller<32> = poller(&dev);
            let mut idle_after_done = 0u64;
            while !(done.load(Ordering::Acquire) && retirer.retired() == shared.observe_posted()) {
                let batch = p.poll().unwrap();
                for c in batch.iter() {
                    assert_eq!(c.ring(), 8);
                    retirer.on_completion(c, &shared).unwrap();
                }
                if batch.is_empty() {
                    if done.load(Ordering::Acquire) {
                        idle_after_done += 1;
                        if idle_after_done > IDLE_POLLS_AFTER_DONE {
                            break; // the assertion below reports the shortfall
                        }
                    }
                    core::hint::spin_loop();
                }
            }
            retirer.retired()
        });
        let guard = SetOnDrop(&done);
        let mut sent = 0;
        let mut blocked = 0u64;
        let mut progress = std::time::Instant::now();
        while sent < TOTAL {
            match r.send_now(Msg::send(Local::Inline(&sent.to_le_bytes()))) {
                Ok(seq) => {
                    assert_eq!(seq, sent);
                    sent += 1;
                    progress = std::time::Instant::now();
                    r.sync(&shared);
                }
                Err(SendError::WouldBlock) => {
                    blocked += 1;
                    assert!(
                        progress.elapsed() < STUCK,
                        "poster blocked for good at seq {sent}: a completion was lost"
                    );
                    r.sync(&shared);
                    std::thread::yield_now();
                }
                Err(e) => panic!("{e}"),
            }
            assert!(r.outstanding() <= 64);
        }
        r.sync(&shared);
        drop(guard);
        let retired = poller_thread.join().unwrap();
        assert_eq!(retired, TOTAL, "TOTAL is a multiple of the signal period");
        r.sync(&shared);
        assert_eq!(r.outstanding(), 0);
        eprintln!("split mode: {blocked} WouldBlock rounds");
    });
}

#[test]
fn poll_spin_spins_a_bounded_number_of_polls() {
    let dev = CountingDevice::new(16);
    let mut p: CqPoller<4> = poller(&dev);
    assert!(p.poll_spin(5).unwrap().is_empty());
    assert_eq!(
        dev.polls(),
        5,
        "five empty polls, then it returns (never blocks)"
    );
    let mut r: SendRing<8> = ring(&dev, SendConfig::new(7, 8, 64).signal_every(1));
    r.send_now(Msg::send(Local::Empty)).unwrap();
    let got = p.poll_spin(1_000).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(dev.polls(), 6, "returns at the first non-empty poll");
    let mut n = 0;
    r.send_now(Msg::send(Local::Empty)).unwrap();
    r.send_now(Msg::send(Local::Empty)).unwrap();
    assert_eq!(p.drain(|c| n += c.seq()).unwrap(), 2);
    assert_eq!(n, 1 + 2);
}

#[test]
fn big_rings_are_built_in_place_on_the_heap() {
    use std::mem::MaybeUninit;
    const BIG: usize = 1 << 16; // 9 MiB of send WRs, 4 MiB of receive WRs: never on a stack
    let dev = CountingDevice::new(1 << 17);
    let region = vec![0u8; BIG * 8];
    let mut s: Box<MaybeUninit<SendRing<BIG>>> = Box::new_uninit();
    let mut r: Box<MaybeUninit<RecvRing<BIG>>> = Box::new_uninit();
    // SAFETY: the device and region outlive both rings.
    let (send, recv) = unsafe {
        (
            SendRing::init_in(&mut s, dev.qp(), SendConfig::new(1, BIG as u32, 64)).unwrap(),
            RecvRing::init_in(
                &mut r,
                RecvTarget::Qp(dev.qp()),
                LocalBuf::new(region.as_ptr() as u64, region.len() as u32, 3),
                RecvConfig::new(2, 8, BIG as u32),
            )
            .unwrap(),
        )
    };
    assert_eq!(recv.fill(), Ok(BIG));
    assert_eq!(dev.posted_recvs(), BIG);
    assert_eq!(send.send_now(Msg::send(Local::Empty)), Ok(0));
    assert_eq!(send.free(), BIG as u64 - 1);
}

/// `Msg::fence` / `Msg::solicited` reach the WR as `IBV_SEND_FENCE` / `IBV_SEND_SOLICITED`,
/// staged or in a batch, on every opcode; an unflagged message later staged in the same
/// slot gets its flags back (the flags are part of a slot's format), and the signal flag
/// still follows the schedule.
#[test]
fn fence_and_solicited_reach_send_flags_of_their_wr_only() {
    let dev = CountingDevice::new(256);
    let mut r: SendRing<8> = ring(
        &dev,
        SendConfig::new(1, 8, 64)
            .signal_every(4)
            .batch(8)
            .remote(REMOTE),
    );
    let mut p: CqPoller<8> = poller(&dev);
    let dest = LocalBuf::new(0x2000, 64, 0x55);
    let data = [3u8; 16];
    const FLAGS: u32 = IBV_SEND_FENCE | IBV_SEND_SOLICITED;
    for round in 0..6u64 {
        for (k, msg) in all_ops(dest, &data).into_iter().enumerate() {
            // Fenced, solicited, both or neither, moving through the slots round by round.
            let (fence, sol) = match (k as u64 + round) % 4 {
                0 => (false, false),
                1 => (true, false),
                2 => (false, true),
                _ => (true, true),
            };
            let m = if fence { msg.fence() } else { msg };
            let m = if sol { m.solicited() } else { m };
            let seq = if k % 2 == 0 {
                // SAFETY: `dest` is never dereferenced by the counting device.
                unsafe { r.stage(m) }.unwrap()
            } else if m.is_borrow_free() {
                let mut b = r.batch();
                let s = b.push(m).unwrap();
                b.finish().unwrap();
                s
            } else {
                // SAFETY: as above.
                unsafe { r.stage(m) }.unwrap()
            };
            let f = r.slot_wr(seq).send_flags;
            let want =
                if fence { IBV_SEND_FENCE } else { 0 } | if sol { IBV_SEND_SOLICITED } else { 0 };
            assert_eq!(
                f & FLAGS,
                want,
                "round {round}, {:?}, flags {f:#x}",
                m.opcode()
            );
            assert_eq!(
                f & IBV_SEND_SIGNALED != 0,
                seq % 4 == 3,
                "seq {seq}: the schedule's signal"
            );
            r.flush().unwrap();
            for c in poll_all(&mut p) {
                r.on_completion(&c).unwrap();
            }
        }
    }
    // The lone path (`send_now` with nothing staged) posts flagged messages too.
    let seq = r
        .send_now(Msg::send(Local::Inline(&data)).solicited())
        .unwrap();
    r.signal_next();
    let last = r.send_now(Msg::send(Local::Inline(&data)).fence()).unwrap();
    assert_eq!(last, seq + 1);
    for c in poll_all(&mut p) {
        r.on_completion(&c).unwrap();
    }
    assert!(r.is_retired(last));
}
