//! Issue 27: while a ring or poller exists, it owns its queue. Misuse through the public
//! API only (no `unsafe`), each case with what it must get: a compile error (the doc tests
//! of `hotverbs::bridge`'s module docs and below), a named error, or sound behaviour.
//!
//! Every test here ran against 069ddb0 (before the change) and failed or misbehaved as
//! its doc comment says; `cargo xtask miri` runs the ones that need no simulator thread.

use std::time::Duration;

use hotverbs::*;

/// A softnic device of its own (tests run in parallel).
fn softnic() -> Context {
    Context::open_softnic_with(SoftnicConfig {
        name: "softnic_own".into(),
        ..Default::default()
    })
    .unwrap()
}

/// Two connected RC QPs on one CQ; `a` sends inline up to 64 bytes.
fn rc_pair<'a>(ctx: &Context, pd: &'a Pd, cq: &'a Cq) -> (Qp, Qp) {
    let a = QpBuilder::new(pd, cq, cq, QpType::Rc)
        .max_send_wr(64)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(pd, cq, cq, QpType::Rc)
        .max_send_wr(64)
        .max_inline_data(64)
        .build()
        .unwrap();
    Qp::connect_pair(
        &a,
        &b,
        &ctx.port_info(None, None).unwrap(),
        &ConnectOptions::default(),
    )
    .unwrap();
    (a, b)
}

fn write_target(pd: &Pd) -> Mr<'static> {
    pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap()
}

fn cfg(remote: &Mr<'_>) -> SendConfig {
    SendConfig::new(0, 16, 64)
        .signal_every(4)
        .remote(remote.remote().into())
}

/// Polls `poller` until `ring` has nothing outstanding (bounded: never hangs).
fn retire_all<const N: usize, const B: usize>(ring: &mut SendRing<'_, N>, p: &mut CqPoller<'_, B>) {
    ring.drain(Duration::from_secs(10), |r| {
        for c in p.poll()? {
            r.on_completion(c)?;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .unwrap();
}

/// Item 1: swapping two wrappers swaps their QPs with them (the datapath value and the QP
/// it posts to move together): each ring still posts to the QP it wraps. (On 069ddb0 the
/// inner values could be swapped through `DerefMut`, leaving a ring on a freed QP; that no
/// longer compiles, see the bridge module's `compile_fail` examples.)
#[test]
fn swapped_rings_post_to_their_own_qps() {
    let ctx = softnic();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let (a1, _b1) = rc_pair(&ctx, &pd, &cq);
    let (a2, _b2) = rc_pair(&ctx, &pd, &cq);
    let t1 = write_target(&pd);
    let t2 = write_target(&pd);
    let mut r1 = a1.send_ring::<16>(cfg(&t1)).unwrap();
    let mut r2 = a2.send_ring::<16>(cfg(&t2)).unwrap();
    std::mem::swap(&mut r1, &mut r2);
    // r1 is now the ring of a2, writing into t2.
    r1.signal_next();
    r1.send_now(Msg::write(Local::Inline(&[7u8; 8]), 0))
        .unwrap();
    let mut p = cq.poller::<16>().unwrap();
    retire_all(&mut r1, &mut p);
    assert_eq!(t2.read_u64(0).unwrap(), u64::from_le_bytes([7; 8]));
    assert_eq!(
        t1.read_u64(0).unwrap(),
        0,
        "nothing reached the other QP's target"
    );
    drop(r2);
}

/// Items 3 and 4 (verbs rings): a QP whose queue a ring owns cannot be reset or
/// reconnected behind the ring's back (on 069ddb0 `Qp::reset` ended the receive lease
/// under a live `RecvRing` and `connect` reset the QP under a live send ring); the ring's
/// own `reset_qp_with` does it, keeps the lease, and the same rings work after `connect`.
#[test]
fn reset_and_connect_under_live_rings_are_the_rings_operation() {
    let ctx = softnic();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let (a, b) = rc_pair(&ctx, &pd, &cq);
    let port = ctx.port_info(None, None).unwrap();
    let mut region = pd.alloc_mr(1024, AccessFlags::LOCAL_WRITE).unwrap();
    let mut tx = a
        .send_ring::<16>(SendConfig::new(0, 16, 64).signal_every(1))
        .unwrap();
    let mut rx = b
        .recv_ring::<8>(&mut region, 0, RecvConfig::new(0, 64, 8))
        .unwrap();
    rx.fill().unwrap();

    for (what, r) in [
        ("Qp::reset", b.reset()),
        (
            "Qp::connect",
            b.connect(&port, &a.endpoint(&port), &ConnectOptions::default()),
        ),
    ] {
        let e = r.expect_err(what);
        assert_eq!(e.errno(), libc::EBUSY, "{what}: {e}");
        assert!(e.to_string().contains("RecvRing::reset_qp"), "{what}: {e}");
    }
    let e = a.reset().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY);
    assert!(e.to_string().contains("SendRing::reset_qp"), "{e}");
    assert_eq!(
        b.query().unwrap().state(),
        QpState::Rts,
        "refused: nothing moved"
    );

    // The receive ring's QP has no send ring: its own reset_qp.
    assert_eq!(
        rx.reset_qp().unwrap(),
        8,
        "the 8 posted receives are requeued"
    );
    // a's send ring alone owns a: reset_qp.
    assert_eq!(tx.reset_qp().unwrap(), 0);
    Qp::connect_pair(&a, &b, &port, &ConnectOptions::default()).unwrap();
    rx.fill().unwrap();
    tx.send_now(Msg::send(Local::Inline(b"again"))).unwrap();
    let mut p = cq.poller::<16>().unwrap();
    let mut got = None;
    for _ in 0..1000 {
        for c in p.poll().unwrap() {
            if c.ring() == tx.ring_id() {
                tx.on_completion(c).unwrap();
            } else {
                let m = rx.on_completion(c).unwrap();
                got = Some(rx.data(&m).unwrap().to_vec());
                rx.release(m).unwrap();
            }
        }
        if got.is_some() && tx.outstanding() == 0 {
            break;
        }
    }
    assert_eq!(got.as_deref(), Some(&b"again"[..]));
}

/// Item 3: after a `RecvRing` is dropped its receives stay posted, so the lease holds
/// until the QP is reset (now allowed: no ring owns the queue), then a slice is given.
#[test]
fn a_dropped_recv_ring_keeps_its_lease_until_the_qp_is_reset() {
    let ctx = softnic();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let (_a, b) = rc_pair(&ctx, &pd, &cq);
    let mut region = pd.alloc_mr(512, AccessFlags::LOCAL_WRITE).unwrap();
    {
        let mut rx = b
            .recv_ring::<4>(&mut region, 0, RecvConfig::new(0, 64, 4))
            .unwrap();
        rx.fill().unwrap();
    }
    assert_eq!(region.as_slice().unwrap_err().errno(), libc::EBUSY);
    b.reset().unwrap();
    assert!(
        region.as_slice().is_ok(),
        "nothing can post into it any more"
    );
}

/// Item 3 with a live ring: a reset through the ring keeps the region leased (the ring
/// will post into it again), so no slice is handed out.
#[test]
fn a_ring_reset_keeps_the_lease() {
    let ctx = softnic();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let (_a, b) = rc_pair(&ctx, &pd, &cq);
    let mut region = pd.alloc_mr(512, AccessFlags::LOCAL_WRITE).unwrap();
    let mut rx = b
        .recv_ring::<4>(&mut region, 0, RecvConfig::new(0, 64, 4))
        .unwrap();
    rx.fill().unwrap();
    rx.reset_qp().unwrap();
    drop(rx);
    // The ring is gone and the QP was reset while it lived: its receives were discarded
    // then, but the lease stays until nothing can post again: a reset now ends it.
    assert_eq!(region.as_slice().unwrap_err().errno(), libc::EBUSY);
    b.reset().unwrap();
    assert!(region.as_slice().is_ok());
}

/// An SRQ's ring: one per SRQ for its life; every QP attached completes on the ring's CQ
/// (a QP with another receive CQ is refused while the ring exists, and a ring while such a
/// QP exists); the region stays leased after the ring is dropped (the SRQ's receives stay
/// posted, whatever happens to its QPs) until the SRQ is destroyed; a QP on the SRQ is
/// pointed to it.
#[test]
fn an_srq_ring_owns_the_srq_and_its_cq() {
    let ctx = softnic();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let other = ctx.create_cq(256, None).unwrap();
    let srq = pd.create_srq(16, 1).unwrap();
    let mut region = pd.alloc_mr(1024, AccessFlags::LOCAL_WRITE).unwrap();
    let on = |rcq| QpBuilder::new(&pd, &cq, rcq, QpType::Rc).srq(&srq).build();
    // A QP on another CQ first: the ring is refused while it lives.
    let stray = on(&other).unwrap();
    let e = srq
        .recv_ring::<16>(&cq, &mut region, 0, RecvConfig::new(0, 64, 16))
        .unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("SrqRing", libc::EINVAL), "{e}");
    assert!(e.to_string().contains("another CQ"), "{e}");
    assert!(region.as_slice().is_ok(), "a refused ring leases nothing");
    drop(stray);
    let qp = on(&cq).unwrap();
    {
        let mut ring = srq
            .recv_ring::<16>(&cq, &mut region, 0, RecvConfig::new(0, 64, 16))
            .unwrap();
        assert_eq!(ring.fill().unwrap(), 16);
        assert_eq!(ring.srq().as_raw(), srq.as_raw());
        // While it exists, QPs on another receive CQ are refused by name.
        let e = on(&other).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        assert!(e.to_string().contains("Srq::recv_ring"), "{e}");
        assert!(on(&cq).is_ok(), "the ring's CQ is fine");
        // The receive queue of a QP on the SRQ is the SRQ's.
        let mut other_region = pd.alloc_mr(1024, AccessFlags::LOCAL_WRITE).unwrap();
        let e = qp
            .recv_ring::<16>(&mut other_region, 0, RecvConfig::new(0, 64, 16))
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
        assert!(e.to_string().contains("Srq::recv_ring"), "{e}");
        // A QP reset leaves the SRQ's receives posted.
        qp.reset().unwrap();
        assert_eq!(ring.posted(), 16);
    }
    // The ring is gone, its receives are not: the region stays leased, and the SRQ takes
    // no second ring (its completions would be the first ring's).
    assert_eq!(region.as_slice().unwrap_err().errno(), libc::EBUSY);
    let mut second = pd.alloc_mr(1024, AccessFlags::LOCAL_WRITE).unwrap();
    let e = srq
        .recv_ring::<16>(&cq, &mut second, 0, RecvConfig::new(0, 64, 16))
        .unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("SrqRing", libc::EBUSY), "{e}");
    assert!(second.as_slice().is_ok(), "the refused ring leased nothing");
    // Destroying the SRQ (after its QPs) ends the lease.
    drop(qp);
    srq.destroy().unwrap();
    assert!(region.as_slice().is_ok());
}

/// `mem::forget` of a ring keeps the QP owned for good: resets are refused (sound: the
/// forgotten ring's state is unknown), destroying the QP still works.
#[test]
fn a_forgotten_ring_keeps_its_queue() {
    let ctx = softnic();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let (a, _b) = rc_pair(&ctx, &pd, &cq);
    let ring = a.send_ring::<16>(SendConfig::new(0, 16, 64)).unwrap();
    std::mem::forget(ring);
    assert_eq!(a.reset().unwrap_err().errno(), libc::EBUSY);
    assert_eq!(
        a.send_ring::<16>(SendConfig::new(0, 16, 64))
            .unwrap_err()
            .errno(),
        libc::EBUSY
    );
    a.destroy().unwrap();
}

/// Item 8: `Cq::poll` on a CQ rings complete on is refused (on 069ddb0 it took the ring's
/// completions, and the ring's `outstanding()` never reached 0); the poller gets them.
#[test]
fn cq_poll_cannot_take_ring_completions() {
    let ctx = softnic();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let (a, _b) = rc_pair(&ctx, &pd, &cq);
    let t = write_target(&pd);
    let mut ring = a.send_ring::<16>(cfg(&t)).unwrap();
    ring.signal_next();
    ring.send_now(Msg::write(Local::Inline(&[1u8; 8]), 0))
        .unwrap();
    let mut wcs = [Wc::default(); 4];
    let e = cq.poll(&mut wcs).unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY);
    assert!(e.to_string().contains("Cq::poller"), "{e}");
    let mut p = cq.poller::<16>().unwrap();
    retire_all(&mut ring, &mut p);
    assert_eq!(ring.outstanding(), 0);
}

/// Item 9: an extended poller always reads the QP number (on 069ddb0 a poller without
/// `QP_NUM` read 0 for every completion and every ring ignored every completion).
#[test]
fn ex_poller_reads_qp_num_or_is_refused() {
    let ctx = softnic();
    let no_qpn = CqBuilder::new(&ctx, 64)
        .wc_fields(WcFields::BYTE_LEN)
        .build()
        .unwrap();
    let e = no_qpn.ex_poller::<8>(ExFields::BYTE_LEN).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(e.to_string().contains("QP_NUM"), "{e}");

    let pd = ctx.alloc_pd().unwrap();
    let cq = CqBuilder::new(&ctx, 64)
        .wc_fields(WcFields::BYTE_LEN | WcFields::QP_NUM)
        .build()
        .unwrap();
    let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .send_ops(SendOps::RDMA_WRITE)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    Qp::connect_pair(
        &a,
        &b,
        &ctx.port_info(None, None).unwrap(),
        &ConnectOptions::default(),
    )
    .unwrap();
    let t = write_target(&pd);
    let mut ring = a
        .wr_ring(
            SendConfig::new(0, 16, 64)
                .signal_every(1)
                .remote(t.remote().into()),
        )
        .unwrap();
    // Fields without QP_NUM: it is read anyway.
    let mut p = cq.ex_poller::<8>(ExFields::BYTE_LEN).unwrap();
    ring.send_now(Msg::write(Local::Inline(&[2u8; 8]), 0))
        .unwrap();
    let mut retired = 0;
    for _ in 0..1000 {
        for c in p.poll().unwrap() {
            assert_eq!(c.qp_num(), a.qp_num());
            retired += ring.on_completion(c).unwrap();
        }
        if retired == 1 {
            break;
        }
    }
    assert_eq!(retired, 1);
}

/// Item 11: a ring whose last WRs were unsignaled drains (on 069ddb0 the natural
/// `while outstanding > 0 { poll }` never ended: nothing asked for a signal).
#[test]
fn drain_asks_for_the_signal_an_unsignaled_tail_needs() {
    let ctx = softnic();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let (a, _b) = rc_pair(&ctx, &pd, &cq);
    let t = write_target(&pd);
    let mut ring = a
        .send_ring::<16>(
            SendConfig::new(0, 16, 64)
                .signal_every(8)
                .remote(t.remote().into()),
        )
        .unwrap();
    for i in 0..3u64 {
        ring.send_now(Msg::write(Local::Inline(&i.to_le_bytes()), i * 8))
            .unwrap();
    }
    let mut p = cq.poller::<16>().unwrap();
    // Polling alone retires nothing: the three WRs are unsignaled.
    for _ in 0..100 {
        for c in p.poll().unwrap() {
            ring.on_completion(c).unwrap();
        }
    }
    assert_eq!(
        ring.outstanding(),
        3,
        "an unsignaled tail is never retired by polling"
    );
    retire_all(&mut ring, &mut p);
    assert_eq!(ring.outstanding(), 0);
    assert_eq!(
        t.read_u64(16).unwrap(),
        2,
        "the messages themselves arrived"
    );
}

/// Item 11, a ring with no remote: `drain` cannot post a zero-length WRITE, and reports
/// why at its deadline instead of hanging.
#[test]
fn drain_without_a_remote_says_why_it_stalls() {
    let ctx = softnic();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let (a, b) = rc_pair(&ctx, &pd, &cq);
    let mut region = pd.alloc_mr(1024, AccessFlags::LOCAL_WRITE).unwrap();
    let mut rx = b
        .recv_ring::<8>(&mut region, 0, RecvConfig::new(0, 64, 8))
        .unwrap();
    rx.fill().unwrap();
    let mut ring = a
        .send_ring::<16>(SendConfig::new(0, 16, 64).signal_every(8))
        .unwrap();
    ring.send_now(Msg::send(Local::Inline(b"x"))).unwrap();
    let mut p = cq.poller::<16>().unwrap();
    let e = ring
        .drain(Duration::from_millis(50), |r| {
            for c in p.poll()? {
                if c.ring() == r.ring_id() {
                    r.on_completion(c)?;
                } else {
                    let m = rx.on_completion(c)?;
                    rx.release(m)?;
                }
            }
            Ok::<_, Box<dyn std::error::Error>>(())
        })
        .unwrap_err();
    match e {
        DrainError::Stalled(s) => {
            assert_eq!(s.outstanding, 1);
            assert_eq!(s.signal, SignalAsked::NoRemote);
            assert!(s.to_string().contains("signal_next"), "{s}");
        }
        other => panic!("{other}"),
    }
}

/// Suspected item: `Cq::req_notify` on a CQ made without the provider's lock is refused
/// while a poller exists (arming reads the consumer index the poller writes); the
/// poller arms it.
#[test]
fn lock_free_cq_is_armed_through_its_poller() {
    let ctx = softnic();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = CqBuilder::new(&ctx, 64)
        .channel(&ch)
        .single_threaded(true)
        .build()
        .unwrap();
    cq.req_notify(false).unwrap();
    let p = cq.poller::<8>();
    let mut p = p.unwrap();
    let e = cq.req_notify(false).unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY);
    assert!(e.to_string().contains("poller.req_notify"), "{e}");
    p.req_notify(false).unwrap();
}

/// softnic with the mlx5 personality (a simulated ConnectX), a device of its own.
fn sim() -> Context {
    Context::open_softnic_with(SoftnicConfig {
        name: "softnic_mlx5_own".into(),
        mlx5: true,
        ..Default::default()
    })
    .unwrap()
}

/// Polls the direct poller until `ring` has nothing outstanding.
fn retire_direct<const B: usize>(ring: &mut DirectRing<'_>, p: &mut DirectPoller<'_, B>) {
    ring.drain(Duration::from_secs(10), |r| {
        for c in p.poll()? {
            r.on_completion(c)?;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .unwrap();
}

/// Item 4: a reconnect under a `DirectRing` (on 069ddb0: accepted; RESET zeroed the
/// device's send counter while the ring kept `cur_post`, and its next doorbell replayed
/// every old WQE: one send gave three CQEs and overwrote the peer's buffer with earlier
/// data). Now `Qp::reset`/`connect` are refused naming the ring, and `reset_qp` + connect
/// gives exactly one execution per WR.
#[test]
fn a_direct_ring_reconnects_without_replaying_old_wqes() {
    let ctx = sim();
    let pd = ctx.alloc_pd().unwrap();
    let cq_a = ctx.create_cq(256, None).unwrap();
    let cq_b = ctx.create_cq(256, None).unwrap();
    let port = ctx.port_info(None, None).unwrap();
    let a = QpBuilder::new(&pd, &cq_a, &cq_a, QpType::Rc)
        .max_send_wr(64)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &cq_b, &cq_b, QpType::Rc)
        .build()
        .unwrap();
    Qp::connect_pair(&a, &b, &port, &ConnectOptions::default()).unwrap();
    let mut t = write_target(&pd);
    let mut p = cq_a.direct_poller::<16>().unwrap();
    let mut ring = a
        .direct_ring(
            &mut p,
            SendConfig::new(0, 16, 64)
                .signal_every(1)
                .remote(t.remote().into()),
        )
        .unwrap();
    for i in 1..=2u64 {
        ring.send_now(Msg::write(Local::Inline(&i.to_le_bytes()), (i - 1) * 8))
            .unwrap();
    }
    retire_direct(&mut ring, &mut p);
    for (what, r) in [
        ("Qp::reset", a.reset()),
        (
            "Qp::connect",
            a.connect(&port, &b.endpoint(&port), &ConnectOptions::default()),
        ),
    ] {
        let e = r.expect_err(what);
        assert_eq!(e.errno(), libc::EBUSY, "{what}: {e}");
        assert!(
            e.to_string().contains("DirectRing::reset_qp"),
            "{what}: {e}"
        );
    }
    assert_eq!(ring.reset_qp(&mut p).unwrap(), 0);
    Qp::connect_pair(&a, &b, &port, &ConnectOptions::default()).unwrap();
    // Clear the target, then one new WRITE: exactly one completion, and nothing old
    // rewritten.
    t.write_from(0, &[0u8; 16]).unwrap();
    ring.send_now(Msg::write(Local::Inline(&9u64.to_le_bytes()), 8))
        .unwrap();
    let mut completions = 0;
    for _ in 0..1000 {
        for c in p.poll().unwrap() {
            completions += 1;
            ring.on_completion(c).unwrap();
        }
        if ring.outstanding() == 0 {
            break;
        }
    }
    for _ in 0..10 {
        completions += p.poll().unwrap().len();
    }
    assert_eq!(completions, 1, "one WR, one CQE: no replay");
    assert_eq!(
        t.read_u64(0).unwrap(),
        0,
        "the first old WQE was not replayed"
    );
    assert_eq!(t.read_u64(8).unwrap(), 9);
}

/// Item 7: a direct poller dropped and made again still serves the rings attached to the
/// CQ (on 069ddb0 their registration was lost: "CQE for QP N, which no direct ring
/// registered", and the ring's WRs never retired).
#[test]
fn a_new_direct_poller_serves_the_existing_rings() {
    let ctx = sim();
    let pd = ctx.alloc_pd().unwrap();
    let cq_a = ctx.create_cq(256, None).unwrap();
    let cq_b = ctx.create_cq(256, None).unwrap();
    let a = QpBuilder::new(&pd, &cq_a, &cq_a, QpType::Rc)
        .max_send_wr(64)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &cq_b, &cq_b, QpType::Rc)
        .build()
        .unwrap();
    Qp::connect_pair(
        &a,
        &b,
        &ctx.port_info(None, None).unwrap(),
        &ConnectOptions::default(),
    )
    .unwrap();
    let t = write_target(&pd);
    let mut ring = {
        let mut p = cq_a.direct_poller::<16>().unwrap();
        a.direct_ring(
            &mut p,
            SendConfig::new(0, 16, 64)
                .signal_every(1)
                .remote(t.remote().into()),
        )
        .unwrap()
    };
    ring.send_now(Msg::write(Local::Inline(&5u64.to_le_bytes()), 0))
        .unwrap();
    let mut p = cq_a.direct_poller::<16>().unwrap();
    retire_direct(&mut ring, &mut p);
    assert_eq!(ring.outstanding(), 0);
    assert_eq!(t.read_u64(0).unwrap(), 5);
}

/// Suspected item, settled: the QPs of one thread domain share its doorbell register
/// without a lock, and rings are `Send`, so two send rings on two of its QPs could ring it
/// from two threads. A thread domain has one send ring at a time; QPs in thread domains
/// of their own each get one.
#[test]
fn a_thread_domain_has_one_send_ring_at_a_time() {
    // Thread domains are softnic's Spec profile's (rxe, and so the Rxe profile, has none).
    let ctx = Context::open_softnic_with(SoftnicConfig {
        name: "softnic_own_td".into(),
        profile: hotverbs_softnic::Profile::Spec,
        ..Default::default()
    })
    .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let td = ctx.alloc_td().unwrap();
    let shared = pd.alloc_parent_domain(Some(&td)).unwrap();
    let qp = |pdom: &Pd| {
        QpBuilder::new(pdom, &cq, &cq, QpType::Rc)
            .max_inline_data(64)
            .build()
            .unwrap()
    };
    let (q1, q2) = (qp(&shared), qp(&shared));
    let cfg = || SendConfig::new(0, 16, 64);
    let r1 = q1.send_ring::<16>(cfg()).unwrap();
    let e = q2.send_ring::<16>(cfg()).unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY);
    assert!(e.to_string().contains("thread domain"), "{e}");
    drop(r1);
    let _r2 = q2.send_ring::<16>(cfg()).expect("the slot is free again");

    let (td3, td4) = (ctx.alloc_td().unwrap(), ctx.alloc_td().unwrap());
    let (p3, p4) = (
        pd.alloc_parent_domain(Some(&td3)).unwrap(),
        pd.alloc_parent_domain(Some(&td4)).unwrap(),
    );
    let (q3, q4) = (qp(&p3), qp(&p4));
    let _r3 = q3.send_ring::<16>(cfg()).unwrap();
    let _r4 = q4
        .send_ring::<16>(cfg())
        .expect("a thread domain of its own");
}

/// `set_remote` on the `ibv_wr_*` and direct rings: later WRITEs land in the new region,
/// the earlier ones stayed in the old one.
#[test]
fn wr_and_direct_rings_follow_a_new_remote() {
    // WrRing on softnic.
    let ctx = softnic();
    let pd = ctx.alloc_pd().unwrap();
    let cq = CqBuilder::new(&ctx, 64)
        .wc_fields(WcFields::QP_NUM)
        .build()
        .unwrap();
    let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .send_ops(SendOps::RDMA_WRITE)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    Qp::connect_pair(
        &a,
        &b,
        &ctx.port_info(None, None).unwrap(),
        &ConnectOptions::default(),
    )
    .unwrap();
    let (t1, t2) = (write_target(&pd), write_target(&pd));
    let mut ring = a
        .wr_ring(
            SendConfig::new(0, 16, 64)
                .signal_every(1)
                .remote(t1.remote().into()),
        )
        .unwrap();
    let mut p = cq.ex_poller::<8>(ExFields::QP_NUM).unwrap();
    ring.send_now(Msg::write(Local::Inline(&1u64.to_le_bytes()), 0))
        .unwrap();
    ring.set_remote(t2.remote()).unwrap();
    ring.send_now(Msg::write(Local::Inline(&2u64.to_le_bytes()), 0))
        .unwrap();
    ring.drain(Duration::from_secs(10), |r| {
        for c in p.poll()? {
            r.on_completion(c)?;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .unwrap();
    assert_eq!((t1.read_u64(0).unwrap(), t2.read_u64(0).unwrap()), (1, 2));

    // DirectRing on the simulated ConnectX.
    let ctx = sim();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (
        ctx.create_cq(64, None).unwrap(),
        ctx.create_cq(64, None).unwrap(),
    );
    let a = QpBuilder::new(&pd, &cq_a, &cq_a, QpType::Rc)
        .max_send_wr(64)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &cq_b, &cq_b, QpType::Rc)
        .build()
        .unwrap();
    Qp::connect_pair(
        &a,
        &b,
        &ctx.port_info(None, None).unwrap(),
        &ConnectOptions::default(),
    )
    .unwrap();
    let (t1, t2) = (write_target(&pd), write_target(&pd));
    let mut p = cq_a.direct_poller::<16>().unwrap();
    let mut ring = a
        .direct_ring(
            &mut p,
            SendConfig::new(0, 16, 64)
                .signal_every(1)
                .remote(t1.remote().into()),
        )
        .unwrap();
    ring.send_now(Msg::write(Local::Inline(&3u64.to_le_bytes()), 8))
        .unwrap();
    ring.set_remote(t2.remote()).unwrap();
    ring.send_now(Msg::write(Local::Inline(&4u64.to_le_bytes()), 8))
        .unwrap();
    retire_direct(&mut ring, &mut p);
    assert_eq!((t1.read_u64(8).unwrap(), t2.read_u64(8).unwrap()), (3, 4));
}

/// Found by the `safe_api` fuzz target: a direct poller made on a CQ where verbs-path rings
/// complete took the CQ away from libmlx5 with their completions still queued there (never
/// delivered, no error). Now refused, as are verbs-path rings on a CQ of the direct path.
#[test]
fn the_direct_path_and_verbs_rings_do_not_share_a_cq() {
    let ctx = sim();
    let pd = ctx.alloc_pd().unwrap();
    let (scq, rcq) = (
        ctx.create_cq(64, None).unwrap(),
        ctx.create_cq(64, None).unwrap(),
    );
    let a = QpBuilder::new(&pd, &scq, &rcq, QpType::Rc)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &scq, &rcq, QpType::Rc).build().unwrap();
    Qp::connect_pair(
        &a,
        &b,
        &ctx.port_info(None, None).unwrap(),
        &ConnectOptions::default(),
    )
    .unwrap();
    let mut region = pd.alloc_mr(1024, AccessFlags::LOCAL_WRITE).unwrap();
    let mut rx = b
        .recv_ring::<4>(&mut region, 0, RecvConfig::new(0, 64, 4))
        .unwrap();
    rx.fill().unwrap();
    let e = rcq.direct_poller::<8>().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "{e}");
    assert!(e.to_string().contains("verbs-path rings"), "{e}");
    // The refusal left the CQ to the verbs poller.
    let _p = rcq.poller::<8>().unwrap();
    // The other way round: a CQ of the direct path takes no verbs-path ring.
    let mut dp = scq.direct_poller::<8>().unwrap();
    let e = a.send_ring::<16>(SendConfig::new(0, 16, 64)).unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "{e}");
    assert!(e.to_string().contains("direct path"), "{e}");
    let _ring = a.direct_ring(&mut dp, SendConfig::new(0, 16, 64)).unwrap();
}

/// Split mode's safe recovery: while a retirer may run on another thread, `reset_qp` is
/// refused (`EBUSY`, saying what to do); the retirer retires the flushes on its thread,
/// comes back by value (`unsplit`), and the same ring recovers, reconnects and sends
/// again; every WR retired once or dropped by the reset.
#[test]
fn a_split_ring_recovers_once_its_retirer_is_back() {
    let ctx = softnic();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let (a, b) = rc_pair(&ctx, &pd, &cq);
    let target = write_target(&pd);
    let mut ring = a.send_ring::<16>(cfg(&target)).unwrap();
    let mut p = cq.poller::<16>().unwrap();
    let (counters, retirer) = ring.split();
    for i in 0..6u64 {
        ring.send_now(Msg::write(Local::Inline(&i.to_le_bytes()), i * 8))
            .unwrap();
    }
    a.to_error().unwrap();
    ring.signal_next();
    ring.send_now(Msg::write(Local::Inline(&[7; 8]), 48))
        .unwrap();
    // The polling thread: its retirer retires everything, flushes included.
    let (retirer, errors) = std::thread::scope(|s| {
        s.spawn(|| {
            let mut retirer = retirer;
            let mut errors = Vec::new();
            for _ in 0..1000 {
                for c in p.poll().unwrap() {
                    if let Err(e) = retirer.on_completion(c, &counters) {
                        errors.push(e);
                    }
                }
                if retirer.retired() == 7 {
                    break;
                }
            }
            (retirer, errors)
        })
        .join()
        .unwrap()
    });
    assert_eq!(retirer.retired(), 7, "{errors:?}");
    assert!(
        !errors.is_empty() && errors.iter().all(|e| *e == WcError::WrFlush),
        "{errors:?}"
    );
    let e = ring.reset_qp().unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("SendRing::reset_qp", libc::EBUSY));
    assert!(e.to_string().contains("unsplit"), "{e}");
    ring.unsplit(&counters, retirer);
    assert!(!ring.is_split());
    assert_eq!(
        ring.error(),
        Some(WcError::WrFlush),
        "absorbed from the counters"
    );
    assert_eq!(
        ring.reset_qp().unwrap(),
        0,
        "every WR was retired by a completion"
    );
    b.reset().unwrap();
    Qp::connect_pair(
        &a,
        &b,
        &ctx.port_info(None, None).unwrap(),
        &ConnectOptions::default(),
    )
    .unwrap();
    ring.send_now(Msg::write(Local::Inline(&[9; 8]), 64))
        .unwrap();
    retire_all(&mut ring, &mut p);
    assert_eq!(target.read_u64(64).unwrap(), u64::from_le_bytes([9; 8]));
    assert_eq!(ring.retired_total(), ring.posted_total());
}

/// `SrqRing` against `mem::swap` and a panic: swapped rings keep their own SRQs (the
/// wrapper moves whole); a panic while a `Received` is held loses only that slot's hold
/// (the ring goes on); a dropped (or forgotten: the same, it has no `Drop`) ring leaves
/// its SRQ taken and its region leased until the SRQ is destroyed.
#[test]
fn srq_rings_against_swap_and_a_panic() {
    let ctx = softnic();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let (s1, s2) = (pd.create_srq(8, 1).unwrap(), pd.create_srq(8, 1).unwrap());
    let mut m1 = pd.alloc_mr(512, AccessFlags::LOCAL_WRITE).unwrap();
    let mut m2 = pd.alloc_mr(512, AccessFlags::LOCAL_WRITE).unwrap();
    let rx = |srq| {
        QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
            .srq(srq)
            .build()
            .unwrap()
    };
    let tx = || {
        QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
            .max_send_wr(16)
            .max_inline_data(64)
            .build()
            .unwrap()
    };
    let (r1, r2, t1, t2) = (rx(&s1), rx(&s2), tx(), tx());
    let port = ctx.port_info(None, None).unwrap();
    Qp::connect_pair(&t1, &r1, &port, &ConnectOptions::default()).unwrap();
    Qp::connect_pair(&t2, &r2, &port, &ConnectOptions::default()).unwrap();
    {
        let mut g1 = s1
            .recv_ring::<8>(&cq, &mut m1, 0, RecvConfig::new(0, 64, 8))
            .unwrap();
        let mut g2 = s2
            .recv_ring::<8>(&cq, &mut m2, 0, RecvConfig::new(0, 64, 8))
            .unwrap();
        std::mem::swap(&mut g1, &mut g2);
        assert_eq!(g1.srq().as_raw(), s2.as_raw(), "the wrapper moved whole");
        g1.fill().unwrap();
        g2.fill().unwrap();
        let mut w1 = t1.send_ring::<16>(SendConfig::new(0, 16, 64)).unwrap();
        let mut w2 = t2.send_ring::<16>(SendConfig::new(0, 16, 64)).unwrap();
        w1.signal_next();
        w1.send_now(Msg::send(Local::Inline(b"to s1"))).unwrap();
        w2.signal_next();
        w2.send_now(Msg::send(Local::Inline(b"to s2"))).unwrap();
        let mut p = cq.poller::<16>().unwrap();
        let mut got = Vec::new();
        for _ in 0..1000 {
            for c in p.poll().unwrap() {
                if c.is_recv() {
                    // g1 is s2's ring now; the other's completion is Misrouted there.
                    let (ring, other) = if c.qp_num() == r2.qp_num() {
                        (&mut g1, &mut g2)
                    } else {
                        (&mut g2, &mut g1)
                    };
                    assert!(other.on_completion(&mut *c).is_err());
                    let m = ring.on_completion(c).unwrap();
                    got.push(ring.data(&m).unwrap().to_vec());
                    // A panic while the Received is held: only that hold is lost.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                        let _held = m;
                        std::panic::resume_unwind(Box::new(()));
                    }));
                    assert!(r.is_err());
                } else {
                    let _ = w1.on_completion(c).or_else(|_| w2.on_completion(c));
                }
            }
            if got.len() == 2 {
                break;
            }
        }
        got.sort();
        assert_eq!(got, [b"to s1".to_vec(), b"to s2".to_vec()]);
        assert_eq!(
            (g1.held(), g2.held()),
            (1, 1),
            "each dropped hold stays held"
        );
        assert_eq!(g1.fill().unwrap(), 0, "a held slot is not reposted");
    }
    // Both rings are gone (`mem::forget` of one is a drop: `SrqRing` has no `Drop`, its
    // receives and lease outlive it by design): both SRQs stay taken, both regions
    // leased; destroying an SRQ (after its QPs) ends its lease.
    assert_eq!(
        s2.recv_ring::<8>(
            &cq,
            &mut pd.alloc_mr(512, AccessFlags::LOCAL_WRITE).unwrap(),
            0,
            RecvConfig::new(0, 64, 8)
        )
        .unwrap_err()
        .errno(),
        libc::EBUSY
    );
    assert_eq!(m2.as_slice().unwrap_err().errno(), libc::EBUSY);
    drop((t2, r2));
    s2.destroy().unwrap();
    assert!(m2.as_slice().is_ok());
}

/// Issue 30, the direct receive ring under the misuses issue 27 tried on the others: two
/// direct receive rings swapped each keep posting to their own QP (a message to `b` lands
/// in `b`'s region); a direct poller made again serves the receive queues attached to the
/// CQ; the verbs resets (`Qp::reset`, `RecvRing::reset_qp`) are refused naming the way
/// that cleans the CQ; `reset_qp_direct` recovers, and the ring works after a reconnect.
#[test]
fn direct_recv_rings_against_swap_a_new_poller_and_a_reset() {
    let ctx = sim();
    let pd = ctx.alloc_pd().unwrap();
    let cq_a = ctx.create_cq(64, None).unwrap();
    let cq_b = ctx.create_cq(64, None).unwrap();
    let port = ctx.port_info(None, None).unwrap();
    let qp = |cq: &Cq| {
        QpBuilder::new(&pd, cq, cq, QpType::Rc)
            .max_send_wr(16)
            .max_recv_wr(4)
            .max_inline_data(64)
            .build()
            .unwrap()
    };
    let (a, a2, b, b2) = (qp(&cq_a), qp(&cq_a), qp(&cq_b), qp(&cq_b));
    let o = ConnectOptions::default();
    let mut pa = cq_a.direct_poller::<16>().unwrap();
    let (mut rb, mut rb2) = (
        pd.alloc_mr(4 * 64, AccessFlags::LOCAL_WRITE).unwrap(),
        pd.alloc_mr(4 * 64, AccessFlags::LOCAL_WRITE).unwrap(),
    );
    let (mut recv, mut recv2) = {
        let mut pb = cq_b.direct_poller::<16>().unwrap();
        (
            b.direct_recv_ring::<4, 16>(&mut pb, &mut rb, 0, RecvConfig::new(0, 64, 4))
                .unwrap(),
            b2.direct_recv_ring::<4, 16>(&mut pb, &mut rb2, 0, RecvConfig::new(0, 64, 4))
                .unwrap(),
        )
    };
    // The poller that attached them is gone: a new one serves them.
    let mut pb = cq_b.direct_poller::<16>().unwrap();
    std::mem::swap(&mut recv, &mut recv2);
    assert_eq!(
        recv.qp().qp_num(),
        b2.qp_num(),
        "the ring moved with its QP"
    );
    b.init(&port, &o).unwrap();
    b2.init(&port, &o).unwrap();
    recv.fill().unwrap();
    recv2.fill().unwrap();
    Qp::connect_pair(&a, &b, &port, &o).unwrap();
    Qp::connect_pair(&a2, &b2, &port, &o).unwrap();
    let mut send = a
        .direct_ring(&mut pa, SendConfig::new(0, 8, 64).signal_every(1))
        .unwrap();
    let receive =
        |pb: &mut DirectPoller<'_, 16>, to_b: &mut RecvRing<'_, 4>, to_b2: &mut RecvRing<'_, 4>| {
            for _ in 0..1000 {
                if let Some(c) = pb.poll().unwrap().first_mut() {
                    let m = to_b.on_completion(c).expect("b's ring takes b's message");
                    let got = to_b.data(&m).unwrap().to_vec();
                    to_b.release(m).unwrap();
                    assert!(to_b2.posted() == 4, "b2's ring untouched");
                    return got;
                }
            }
            panic!("nothing arrived");
        };
    send.send_now(Msg::send(Local::Inline(b"to b"))).unwrap();
    assert_eq!(receive(&mut pb, &mut recv2, &mut recv), b"to b");
    retire_direct(&mut send, &mut pa);
    // Verbs resets would leave stale CQEs in a direct CQ: refused, naming the way.
    let e = b.reset().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "{e}");
    let e = recv2.reset_qp().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "{e}");
    assert!(e.to_string().contains("reset_qp_direct"), "{e}");
    let wrong = recv2.reset_qp_direct(&mut pa).unwrap_err();
    assert_eq!(wrong.errno(), libc::EINVAL, "{wrong}");
    // A message that arrived and was never polled is cleaned with the reset.
    send.send_now(Msg::send(Local::Inline(b"stale"))).unwrap();
    retire_direct(&mut send, &mut pa);
    assert_eq!(recv2.reset_qp_direct(&mut pb).unwrap(), 4);
    assert_eq!(send.reset_qp(&mut pa).unwrap(), 0);
    b.init(&port, &o).unwrap();
    assert_eq!(recv2.fill().unwrap(), 4);
    Qp::connect_pair(&a, &b, &port, &o).unwrap();
    send.send_now(Msg::send(Local::Inline(b"again"))).unwrap();
    assert_eq!(receive(&mut pb, &mut recv2, &mut recv), b"again");
}
