//! Reproducers of reviewed defects: each test failed (or hung, or did not compile in the
//! unsafe-API cases, see the `compile_fail` doctests in `split.rs` / `send.rs`) before its
//! fix and passes after. All run on the counting test device, single-threaded, so the
//! interleavings that matter are forced, not hoped for.

mod common;

use common::poll_all;
use hotverbs_datapath::*;
use hotverbs_ffi::*;
use hotverbs_softnic::counting::CountingDevice;

fn send_ring<const N: usize>(dev: &CountingDevice, cfg: SendConfig) -> SendRing<N> {
    // SAFETY: the device outlives every ring a test makes from it; completions come from
    // its CQ or are built to model one it could produce.
    unsafe { SendRing::new(dev.qp(), cfg) }.expect("config")
}

fn poller<const B: usize>(dev: &CountingDevice) -> CqPoller<B> {
    // SAFETY: as above.
    unsafe { CqPoller::new(dev.cq()) }
}

fn wc(wr_id: u64, status: ibv_wc_status, opcode: ibv_wc_opcode) -> Completion {
    // SAFETY: ibv_wc is plain data; all-zero is valid.
    let mut w: ibv_wc = unsafe { core::mem::zeroed() };
    w.wr_id = wr_id;
    w.status = status;
    w.opcode = opcode;
    w.byte_len = 4;
    w.qp_num = hotverbs_softnic::counting::QP_NUM;
    // SAFETY: these tests forge completions on purpose, to show what the rings refuse; the
    // accepted ones stand for WRs the counting device really has outstanding.
    unsafe { Completion::from_raw(w) }
}

/// A receive ring of `count` slots of 64 bytes over `region` on `target`.
fn recv_ring<const N: usize>(target: RecvTarget, region: &[u8], id: u8, count: u32) -> RecvRing<N> {
    // SAFETY: `region` outlives the ring in every test and is only read through it.
    unsafe {
        RecvRing::new(
            target,
            LocalBuf::new(region.as_ptr() as u64, region.len() as u32, 9),
            RecvConfig::new(id, 64, count).repost_batch(1),
        )
    }
    .unwrap()
}

// ---- 1. split mode: completions before the poster's publication --------------------------

/// softnic and the counting device complete a signaled WR inside `ibv_post_send`, so the
/// poller can handle it before the poster's `sync` publishes `posted`. The retirer used to
/// rebuild the sequence against `observe_posted()`, found it "stale" and dropped it
/// (`Ok(0)`): when that was the WR that filled the ring, the poster saw `WouldBlock` forever.
#[test]
fn split_completion_before_sync_is_not_dropped() {
    const D: u32 = 4;
    let dev = CountingDevice::new(64);
    let mut ring: SendRing<4> = send_ring(&dev, SendConfig::new(1, D, 64).signal_every(2));
    let (shared, mut retirer) = ring.split();
    let mut p: CqPoller<8> = poller(&dev);
    for _ in 0..D {
        ring.send_now(Msg::send(Local::Empty)).unwrap();
    }
    assert_eq!(
        ring.send_now(Msg::send(Local::Empty)),
        Err(SendError::WouldBlock)
    );
    // The poller runs between the doorbell and the poster's sync.
    let mut retired = 0;
    for c in poll_all(&mut p) {
        retired += retirer.on_completion(&c, &shared).unwrap();
    }
    assert_eq!(retired, D as u64, "every WR retired, none dropped as stale");
    ring.sync(&shared);
    assert_eq!(ring.free(), D as u64, "the poster is unblocked");
    assert_eq!(ring.send_now(Msg::send(Local::Empty)), Ok(D as u64));
}

/// The same window loses an error status: the poster never learns the QP failed.
#[test]
fn split_error_completion_before_sync_is_published() {
    let dev = CountingDevice::new(64);
    let mut ring: SendRing<8> = send_ring(&dev, SendConfig::new(1, 8, 64).signal_every(1));
    let (shared, mut retirer) = ring.split();
    let mut p: CqPoller<8> = poller(&dev);
    dev.fail_next_wr(IBV_WC_REM_ACCESS_ERR);
    ring.send_now(Msg::send(Local::Empty)).unwrap();
    let cs = poll_all(&mut p);
    assert_eq!(cs.len(), 1);
    assert_eq!(
        retirer.on_completion(&cs[0], &shared),
        Err(WcError::RemAccess)
    );
    assert_eq!(shared.observe_error(), Some(WcError::RemAccess));
    ring.sync(&shared);
    assert_eq!(ring.error(), Some(WcError::RemAccess));
    assert_eq!(ring.outstanding(), 0);
}

/// The retirer refuses other rings' completions (issue 27 item 10: they used to be
/// ignored as `Ok(0)`) and ignores stale ones from before a reset.
#[test]
fn split_retirer_checks_ring_and_window() {
    let shared: SendCounters = SendCounters::new();
    let mut r = SendRetirer::new(3, 4, 10);
    assert_eq!(r.ring(), 3);
    assert_eq!(
        r.on_completion(&wc(wr_id::encode(2, 11), 0, IBV_WC_SEND), &shared),
        Err(WcError::Misrouted(Misrouted::new(
            2,
            false,
            3,
            false,
            hotverbs_softnic::counting::QP_NUM == 0
        ))),
        "another ring"
    );
    assert_eq!(
        r.on_completion(&wc(wr_id::encode(3, 9), IBV_WC_WR_FLUSH_ERR, 0), &shared),
        Ok(0),
        "stale"
    );
    assert_eq!(
        r.on_completion(&wc(wr_id::encode(3, 14), 0, 0), &shared),
        Ok(0),
        "beyond the depth"
    );
    assert_eq!(shared.observe_error(), None);
    assert_eq!(
        r.on_completion(&wc(wr_id::encode(3, 12), 0, 0), &shared),
        Ok(3)
    );
    assert_eq!((r.retired(), shared.observe_retired()), (13, 13));
}

// ---- 2. RecvRing::on_completion checks the ring id ---------------------------------------

/// A send completion of ring 1 seq 0 (rxe reports flushed receives with opcode 0 too, so
/// opcode-based dispatch mixes them up) used to be accepted by a receive ring as slot 0:
/// a slot the NIC still owned became HELD and `data` returned bytes the NIC may write.
#[test]
fn recv_ring_rejects_another_rings_completion() {
    let dev = CountingDevice::new(64);
    let region = vec![0u8; 4 * 64];
    let mut rr: RecvRing<4> = recv_ring(RecvTarget::Qp(dev.qp()), &region, 2, 4);
    rr.fill().unwrap();
    let mut foreign = wc(wr_id::encode(1, 0), IBV_WC_SUCCESS, IBV_WC_SEND);
    assert_eq!(
        rr.on_completion(&mut foreign),
        Err(RecvError::Misrouted(Misrouted::new(
            1,
            false,
            2,
            true,
            hotverbs_softnic::counting::QP_NUM == 0
        )))
    );
    assert_eq!((rr.posted(), rr.held()), (4, 0), "slot 0 still posted");
    // Its own flushed receive with opcode 0 (rxe) is still recognised by the ring id.
    dev.set_qp_error();
    let cs = poll_all(&mut poller::<8>(&dev));
    assert_eq!(cs.len(), 4);
    for c in cs {
        let mut w = *c.as_raw();
        w.opcode = IBV_WC_SEND;
        // SAFETY: the device's own flush completion with rxe's opcode 0, given once.
        let mut c = unsafe { Completion::from_raw(w) };
        assert!(matches!(
            rr.on_completion(&mut c),
            Err(RecvError::Completion {
                error: WcError::WrFlush,
                ..
            })
        ));
    }
    assert_eq!(rr.posted(), 0);
}

// ---- 3. data / release check that the Received is this ring's ----------------------------

#[test]
fn received_of_another_ring_is_refused() {
    let dev = CountingDevice::new(64);
    let small_region = vec![1u8; 2 * 64];
    let big_region = vec![2u8; 16 * 64];
    let mut small: RecvRing<2> = recv_ring(RecvTarget::Qp(dev.qp()), &small_region, 1, 2);
    let mut big: RecvRing<16> = recv_ring(RecvTarget::Srq(dev.srq()), &big_region, 2, 16);
    dev.use_srq(true);
    small.fill().unwrap();
    big.fill().unwrap();
    let mut p: CqPoller<32> = poller(&dev);
    // Complete all 16 of the big ring's receives; keep slot 0 and slot 10.
    for _ in 0..16 {
        assert!(dev.complete_recv(8, None));
    }
    let mut held: Vec<Received> = poll_all(&mut p)
        .iter_mut()
        .map(|c| big.on_completion(c).unwrap())
        .collect();
    let slot10 = held.remove(10);
    let slot0 = held.remove(0);
    assert_eq!((slot0.slot(), slot10.slot()), (0, 10));
    // Slot 10 is past the small ring's end: data() used to read out of bounds.
    assert_eq!(small.data(&slot10), Err(RecvError::Foreign { slot: 10 }));
    // The small ring holds its own slot 0 too: release() used to accept big's slot 0.
    dev.use_srq(false);
    assert!(dev.complete_recv(8, None));
    let own = small.on_completion(&mut poll_all(&mut p)[0]).unwrap();
    assert_eq!(own.slot(), 0);
    assert_eq!(small.data(&slot0), Err(RecvError::Foreign { slot: 0 }));
    // Refused and handed back by `try_release` (issue 27: `release` drops it, its slot on
    // `big` then held for good): released on its own ring, its slot is posted again.
    let Err(ReleaseError::Foreign(slot0)) = small.try_release(slot0) else {
        panic!("another ring's Received released");
    };
    assert_eq!(slot0.slot(), 0);
    assert_eq!(
        (small.held(), small.pending(), small.posted()),
        (1, 0, 1),
        "nothing re-posted"
    );
    assert_eq!(small.data(&own).unwrap(), &[1u8; 8][..]);
    assert_eq!(big.data(&slot10).unwrap(), &[2u8; 8][..]);
    small.release(own).unwrap();
    big.release(slot10).unwrap();
    assert_eq!(small.posted(), 2);
    // `release` refuses the same way, and drops it (its slot then stays held on `big`).
    let dropped = held.pop().expect("big holds more");
    let slot = dropped.slot();
    assert_eq!(small.release(dropped), Err(RecvError::Foreign { slot }));
    let held_before = big.held();
    big.release(slot0).unwrap();
    assert_eq!(
        big.held(),
        held_before - 1,
        "the handed-back slot is free again"
    );
}

// ---- 4. RecvRing::reset on an SRQ ---------------------------------------------------------

/// A QP going to ERR or RESET leaves an SRQ's receives posted (IBA). `reset` used to queue
/// them again, so `repost` posted the same buffers twice; the counting device used to flush
/// SRQ receives on QP error, hiding this.
#[test]
fn srq_receives_survive_qp_error_and_reset() {
    let dev = CountingDevice::new(64);
    dev.use_srq(true);
    let region = vec![0u8; 8 * 64];
    let mut rr: RecvRing<8> = recv_ring(RecvTarget::Srq(dev.srq()), &region, 5, 8);
    rr.fill().unwrap();
    let mut p: CqPoller<16> = poller(&dev);
    assert!(dev.complete_recv(3, None));
    let held = rr.on_completion(&mut poll_all(&mut p)[0]).unwrap();
    dev.set_qp_error();
    assert!(
        poll_all(&mut p).is_empty(),
        "the SRQ's receives are not flushed"
    );
    assert_eq!(dev.posted_srq_recvs(), 7);
    dev.reset_qp();
    assert_eq!(dev.posted_srq_recvs(), 7, "nor dropped by a QP reset");
    let wrs = dev.recv_wrs();
    // SAFETY: the SRQ still holds its receives, which this reset leaves posted; nothing the
    // device took off the SRQ is outstanding.
    assert_eq!(unsafe { rr.reset() }, 0, "no slot to take back");
    assert_eq!(rr.repost(), Ok(0));
    assert_eq!(dev.recv_wrs(), wrs, "nothing posted twice");
    assert_eq!((rr.posted(), rr.held()), (7, 1));
    // The receives posted before the reset still complete and are accepted.
    for _ in 0..7 {
        assert!(dev.complete_recv(5, None));
    }
    let got: Vec<Received> = poll_all(&mut p)
        .iter_mut()
        .map(|c| rr.on_completion(c).expect("accepted after reset"))
        .collect();
    assert_eq!(got.len(), 7);
    for m in got.into_iter().chain([held]) {
        rr.release(m).unwrap();
    }
    assert_eq!(dev.posted_srq_recvs(), 8);
}

/// On a QP target the device's model flushes the RQ, and reset re-posts every idle slot once.
#[test]
fn qp_recv_reset_reposts_each_slot_once() {
    let dev = CountingDevice::new(64);
    let region = vec![0u8; 8 * 64];
    let mut rr: RecvRing<8> = recv_ring(RecvTarget::Qp(dev.qp()), &region, 5, 8);
    rr.fill().unwrap();
    dev.set_qp_error();
    let mut p: CqPoller<16> = poller(&dev);
    assert_eq!(poll_all(&mut p).len(), 8);
    dev.reset_qp();
    // SAFETY: the QP went through RESET: no receive of this ring is posted.
    assert_eq!(unsafe { rr.reset() }, 8);
    assert_eq!(rr.repost(), Ok(8));
    assert_eq!(dev.posted_recvs(), 8);
}

// ---- 5. SendRing::on_completion checks the ring id ---------------------------------------

/// A receive completion of ring 2 slot 3 used to retire the send ring's WRs 0..=3, freeing
/// zero-copy buffers the NIC was still reading. (Since issue 27 item 10 another ring's
/// completion is an error naming that ring, no longer `Ok(0)`.)
#[test]
fn send_ring_refuses_another_rings_completion() {
    let dev = CountingDevice::new(64);
    let mut ring: SendRing<8> = send_ring(&dev, SendConfig::new(1, 8, 64).signal_every(4));
    for _ in 0..3 {
        ring.send_now(Msg::send(Local::Empty)).unwrap();
    }
    assert_eq!(ring.outstanding(), 3);
    let recv = wc(wr_id::encode(2, 1), IBV_WC_SUCCESS, IBV_WC_RECV);
    assert!(matches!(
        ring.on_completion(&recv),
        Err(WcError::Misrouted(m)) if m.ring() == 2
    ));
    let flush = wc(wr_id::encode(2, 2), IBV_WC_WR_FLUSH_ERR, 0);
    assert!(matches!(
        ring.on_completion(&flush),
        Err(WcError::Misrouted(m)) if m.ring() == 2
    ));
    assert_eq!(ring.outstanding(), 3, "nothing retired");
    assert_eq!(ring.error(), None);
    assert!(!ring.is_retired(0));
}

// ---- bad_wr that names no WR of the chain ------------------------------------------------

/// rxe before RTS: EINVAL, `bad_wr` NULL, and the WRs are queued anyway (fault-truth S1).
/// The ring used to read NULL as "all rejected" and reuse the slots (and free zero-copy
/// buffers) of WRs the device would still run.
#[test]
fn post_send_failure_without_bad_wr_keeps_the_chain_outstanding() {
    let dev = CountingDevice::new(64);
    let mut ring: SendRing<8> = send_ring(&dev, SendConfig::new(1, 8, 64).signal_every(4).batch(8));
    for _ in 0..3 {
        // SAFETY: empty messages borrow nothing.
        unsafe { ring.stage(Msg::send(Local::Empty)) }.unwrap();
    }
    dev.fail_next_post_unnamed(22);
    let e = match ring.flush() {
        Err(SendError::Post(e)) => e,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (e.errno, e.first_rejected, e.first_rejected_seq),
        (22, PostError::UNKNOWN, 0)
    );
    assert!(format!("{e}").contains("RESET"), "{e}");
    assert_eq!((ring.posted_total(), ring.outstanding()), (3, 3));
    assert_eq!(ring.free(), 0);
    assert_eq!(
        ring.send_now(Msg::send(Local::Empty)),
        Err(SendError::Post(e)),
        "refused until reset"
    );
    dev.reset_qp();
    // SAFETY: the (counting) QP went through RESET.
    assert_eq!(unsafe { ring.reset() }, 3);
    assert_eq!(ring.send_now(Msg::send(Local::Empty)), Ok(3));
}

#[test]
fn post_recv_failure_without_bad_wr_posts_nothing_twice() {
    let dev = CountingDevice::new(64);
    let region = vec![0u8; 4 * 64];
    let mut rr: RecvRing<4> = recv_ring(RecvTarget::Qp(dev.qp()), &region, 3, 4);
    dev.fail_next_post_unnamed(22);
    let e = rr.fill().unwrap_err();
    assert_eq!((e.first_rejected, e.errno), (PostError::UNKNOWN, 22));
    assert_eq!((rr.posted(), rr.pending()), (4, 0), "all may be posted");
    assert_eq!(rr.repost(), Ok(0));
    assert_eq!(dev.posted_recvs(), 4, "each buffer posted once");
}

// ---- smaller items -----------------------------------------------------------------------

#[test]
fn is_recv_is_exact() {
    assert!(wc(0, 0, IBV_WC_RECV).is_recv());
    assert!(wc(0, 0, IBV_WC_RECV_RDMA_WITH_IMM).is_recv());
    assert!(
        !wc(0, 0, IBV_WC_TM_ADD).is_recv(),
        "tag-matching ADD is not a receive"
    );
    assert!(!wc(0, 0, IBV_WC_SEND).is_recv());
}

#[test]
fn credits_grant_saturates() {
    let mut c = Credits::new(u32::MAX - 1);
    c.grant(5);
    assert_eq!(c.available(), u32::MAX);
}

#[test]
fn local_buf_slice_never_overflows_the_address() {
    let b = LocalBuf::new(u64::MAX - 3, 16, 1);
    assert_eq!(b.slice(8, 4), None);
    assert_eq!(b.slice(0, 3), Some(LocalBuf::new(u64::MAX - 3, 3, 1)));
}

#[test]
fn poll_into_a_caller_owned_array() {
    let dev = CountingDevice::new(64);
    let mut ring: SendRing<8> = send_ring(&dev, SendConfig::new(4, 8, 64).signal_every(1));
    let mut p: CqPoller<2> = poller(&dev);
    for _ in 0..5 {
        ring.send_now(Msg::send(Local::Empty)).unwrap();
    }
    let mut out = [const { Completion::PLACEHOLDER }; 8];
    assert_eq!(p.poll_into(&mut out[..3]), Ok(3), "bounded by the slice");
    assert_eq!(p.poll_into(&mut out[3..]), Ok(2));
    assert_eq!(p.poll_into(&mut out), Ok(0));
    let seqs: Vec<u64> = out[..5].iter().map(|c| c.seq()).collect();
    assert_eq!(seqs, [0, 1, 2, 3, 4]);
    for c in &out[..5] {
        assert_eq!(ring.on_completion(c), Ok(1));
    }
}

/// An idle ring's last `< signal_every` WRs used to stay outstanding until more traffic.
#[test]
fn flush_signaled_retires_an_idle_tail() {
    let dev = CountingDevice::new(64);
    let mut ring: SendRing<16> =
        send_ring(&dev, SendConfig::new(1, 16, 64).signal_every(8).batch(16));
    let mut p: CqPoller<8> = poller(&dev);
    for _ in 0..3 {
        // SAFETY: empty messages.
        unsafe { ring.stage(Msg::send(Local::Empty)) }.unwrap();
    }
    assert_eq!(ring.flush_signaled(), Ok(true));
    for c in poll_all(&mut p) {
        ring.on_completion(&c).unwrap();
    }
    assert_eq!(ring.outstanding(), 0);
    // signal_next: the next lone message is signaled although the schedule says 10.
    ring.signal_next();
    let s = ring.send_now(Msg::send(Local::Empty)).unwrap();
    assert_eq!(s, 3);
    for c in poll_all(&mut p) {
        ring.on_completion(&c).unwrap();
    }
    assert_eq!(ring.outstanding(), 0);
    assert_eq!(ring.flush_signaled(), Ok(false), "nothing staged");
}

#[test]
fn rings_built_on_the_heap_in_place() {
    const BIG: usize = 1 << 15;
    let dev = CountingDevice::new(1 << 16);
    let region = vec![0u8; BIG * 8];
    // SAFETY: the device and region outlive both rings.
    let (mut send, mut recv) = unsafe {
        (
            SendRing::<BIG>::new_boxed(dev.qp(), SendConfig::new(1, BIG as u32, 64)).unwrap(),
            RecvRing::<BIG>::new_boxed(
                RecvTarget::Qp(dev.qp()),
                LocalBuf::new(region.as_ptr() as u64, region.len() as u32, 3),
                RecvConfig::new(2, 8, BIG as u32),
            )
            .unwrap(),
        )
    };
    assert_eq!(recv.fill(), Ok(BIG));
    assert_eq!(send.send_now(Msg::send(Local::Empty)), Ok(0));
    assert_eq!(send.free(), BIG as u64 - 1);
}

// ---- soundness review (items 3 and 4): completions and counters of another ring ----------

/// Item 3: with separate send and receive CQs, a send ring and a receive ring may both be
/// ring id 1 (ids are unique per CQ). A genuine send completion handed to the receive ring
/// used to turn a POSTED slot into HELD, and `data()` then returned a view the NIC writes.
/// The receive bit in `wr_id` now tells the two kinds apart.
#[test]
fn recv_ring_refuses_a_send_completion_with_its_ring_id() {
    let dev = CountingDevice::new(64);
    let region = vec![0u8; 4 * 64];
    let mut rr: RecvRing<4> = recv_ring(RecvTarget::Qp(dev.qp()), &region, 1, 4);
    rr.fill().unwrap();
    let mut sr: SendRing<8> = send_ring(&dev, SendConfig::new(1, 8, 64).signal_every(1));
    sr.send_now(Msg::send(Local::Empty)).unwrap();
    let mut cs = poll_all(&mut poller::<8>(&dev));
    assert_eq!(cs.len(), 1);
    assert_eq!(cs[0].ring(), 1, "same ring id as the receive ring");
    let got = rr.on_completion(&mut cs[0]);
    assert!(
        matches!(
            got,
            Err(RecvError::Misrouted(m)) if m.ring() == 1 && !m.recv()
        ),
        "a send completion must not hand out a receive slot: {got:?}"
    );
    assert_eq!(
        (rr.posted(), rr.held()),
        (4, 0),
        "every slot still the NIC's"
    );
    // The send ring still takes its own completion.
    assert_eq!(sr.on_completion(&cs[0]), Ok(1));
}

/// Item 3, the reverse: a receive completion of a ring with the same id retires no send.
#[test]
fn send_ring_refuses_a_receive_completion_with_its_ring_id() {
    let dev = CountingDevice::new(64);
    let region = vec![0u8; 4 * 64];
    let mut rr: RecvRing<4> = recv_ring(RecvTarget::Qp(dev.qp()), &region, 1, 4);
    rr.fill().unwrap();
    let mut sr: SendRing<8> = send_ring(&dev, SendConfig::new(1, 8, 64).signal_every(4));
    for _ in 0..3 {
        sr.send_now(Msg::send(Local::Empty)).unwrap();
    }
    assert!(dev.complete_recv(8, None));
    let mut cs = poll_all(&mut poller::<8>(&dev));
    assert_eq!(cs.len(), 1);
    assert_eq!(
        sr.on_completion(&cs[0]),
        Err(WcError::Misrouted(Misrouted::new(
            1,
            true,
            1,
            false,
            hotverbs_softnic::counting::QP_NUM == 0
        ))),
        "a receive retires no send (and is not dropped as Ok(0))"
    );
    assert_eq!(sr.outstanding(), 3);
    // Still the receive ring's.
    assert_eq!(rr.on_completion(&mut cs[0]).unwrap().byte_len(), 8);
}

/// Item 3 across QPs: a completion of another QP (another CQ's ring with the same id)
/// retires nothing and hands out no slot: the rings check `qp_num`.
#[test]
fn rings_refuse_completions_of_another_qp() {
    let dev = CountingDevice::new(64);
    let region = vec![0u8; 4 * 64];
    let mut rr: RecvRing<4> = recv_ring(RecvTarget::Qp(dev.qp()), &region, 1, 4);
    rr.fill().unwrap();
    let mut sr: SendRing<8> = send_ring(&dev, SendConfig::new(1, 8, 64).signal_every(4));
    for _ in 0..3 {
        sr.send_now(Msg::send(Local::Empty)).unwrap();
    }
    let mut other = *wc(wr_id::encode(1, 0), IBV_WC_SUCCESS, IBV_WC_SEND).as_raw();
    other.qp_num = hotverbs_softnic::counting::QP_NUM + 1;
    // SAFETY: stands for a genuine completion of another QP's ring 1, polled from its CQ.
    let send_of_other_qp = unsafe { Completion::from_raw(other) };
    let other_qp = Misrouted::new(
        1,
        false,
        1,
        false,
        hotverbs_softnic::counting::QP_NUM + 1 == 0,
    );
    assert_eq!(
        sr.on_completion(&send_of_other_qp),
        Err(WcError::Misrouted(other_qp))
    );
    assert_eq!(sr.outstanding(), 3, "nothing retired");
    other.wr_id = rr.slot_wr_id(0);
    // SAFETY: as above, a receive of another QP's ring 1 in the same generation and slot.
    let mut recv_of_other_qp = unsafe { Completion::from_raw(other) };
    assert_eq!(
        rr.on_completion(&mut recv_of_other_qp),
        Err(RecvError::Misrouted(Misrouted::new(
            other_qp.ring(),
            true,
            other_qp.given_to(),
            true,
            other_qp.no_qp_num()
        )))
    );
    assert_eq!((rr.posted(), rr.held()), (4, 0));
}

/// A completion cannot be given twice: the receive ring consumes the one it accepts. Before,
/// `Completion` was `Copy`: accept it, release the slot (re-posted to the NIC), give the
/// copy again, and the slot was HELD while the NIC owned it.
#[test]
fn recv_ring_consumes_the_completion_it_accepts() {
    let dev = CountingDevice::new(64);
    let region = vec![0u8; 4 * 64];
    let mut rr: RecvRing<4> = recv_ring(RecvTarget::Qp(dev.qp()), &region, 2, 4);
    rr.fill().unwrap();
    assert!(dev.complete_recv(8, None));
    let mut p = poller::<8>(&dev);
    let cs = p.poll().unwrap();
    assert_eq!(cs.len(), 1);
    let m = rr.on_completion(&mut cs[0]).unwrap();
    rr.release(m).unwrap();
    assert_eq!(rr.posted(), 4, "re-posted");
    assert!(matches!(
        rr.on_completion(&mut cs[0]),
        Err(RecvError::Stale { .. })
    ));
    assert_eq!((rr.posted(), rr.held()), (4, 0));
}

/// Item 4: `sync` used to accept any `SendCounters`: ring A, with no completion of its own,
/// reported its WRs retired after syncing with ring B's counters (whose retirer was fed B's
/// completions), freeing A's zero-copy buffers. Counters now carry their ring's split key.
#[test]
#[should_panic(expected = "counters of another ring")]
fn sync_refuses_another_rings_counters() {
    let dev_a = CountingDevice::new(64);
    let dev_b = CountingDevice::new(64);
    let mut a: SendRing<8> = send_ring(&dev_a, SendConfig::new(1, 8, 64).signal_every(1));
    let mut b: SendRing<8> = send_ring(&dev_b, SendConfig::new(1, 8, 64).signal_every(1));
    let (_counters_a, _retirer_a) = a.split();
    let (counters_b, mut retirer_b) = b.split();
    for _ in 0..4 {
        a.send_now(Msg::send(Local::Empty)).unwrap();
        b.send_now(Msg::send(Local::Empty)).unwrap();
    }
    for c in poll_all(&mut poller::<8>(&dev_b)) {
        retirer_b.on_completion(&c, &counters_b).unwrap();
    }
    assert_eq!(counters_b.observe_retired(), 4);
    a.sync(&counters_b); // panics
    unreachable!(
        "ring A took B's retired count: {} outstanding",
        a.outstanding()
    );
}

/// Item 4: counters made with `SendCounters::new` (no ring's) are never accepted either.
#[test]
#[should_panic(expected = "counters of another ring")]
fn sync_refuses_unpaired_counters() {
    let dev = CountingDevice::new(64);
    let mut a: SendRing<8> = send_ring(&dev, SendConfig::new(1, 8, 64).signal_every(1));
    let unpaired: SendCounters = SendCounters::new();
    a.sync(&unpaired);
}

/// Item 4: a retirer publishes only into its own counters.
#[test]
#[should_panic(expected = "counters of another ring")]
fn retirer_refuses_another_rings_counters() {
    let dev = CountingDevice::new(64);
    let mut a: SendRing<8> = send_ring(&dev, SendConfig::new(1, 8, 64).signal_every(1));
    let (_counters, mut retirer) = a.split();
    let other: SendCounters = SendCounters::new();
    a.send_now(Msg::send(Local::Empty)).unwrap();
    let cs = poll_all(&mut poller::<8>(&dev));
    let _ = retirer.on_completion(&cs[0], &other);
}

/// After a reset, a new split: the old counters are refused.
#[test]
fn a_new_split_retires_the_old_counters() {
    let dev = CountingDevice::new(64);
    let mut a: SendRing<8> = send_ring(&dev, SendConfig::new(1, 8, 64).signal_every(1));
    let (old, _) = a.split();
    let (new, mut retirer) = a.split();
    a.send_now(Msg::send(Local::Empty)).unwrap();
    for c in poll_all(&mut poller::<8>(&dev)) {
        assert_eq!(retirer.on_completion(&c, &new), Ok(1));
    }
    a.sync(&new);
    assert_eq!(a.outstanding(), 0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.sync(&old)));
    assert!(r.is_err(), "counters of an earlier split accepted");
}

/// Issue 27 (split mode's recovery): `unsplit` takes only the pair of the ring's latest
/// split, and afterwards the ring retires its own completions and refuses that pair.
#[test]
fn unsplit_takes_only_the_latest_pair_and_ends_split_mode() {
    let dev = CountingDevice::new(64);
    let mut a: SendRing<8> = send_ring(&dev, SendConfig::new(1, 8, 64).signal_every(1));
    let (old, old_retirer) = a.split();
    let (new, mut retirer) = a.split();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        a.unsplit(&old, old_retirer)
    }));
    assert!(r.is_err(), "a pair of an earlier split accepted");
    assert!(a.is_split(), "a refused unsplit leaves split mode on");
    a.send_now(Msg::send(Local::Empty)).unwrap();
    for c in poll_all(&mut poller::<8>(&dev)) {
        assert_eq!(retirer.on_completion(&c, &new), Ok(1));
    }
    a.unsplit(&new, retirer);
    assert!(!a.is_split());
    assert_eq!(a.outstanding(), 0, "the retirer's progress absorbed");
    a.send_now(Msg::send(Local::Empty)).unwrap();
    for c in poll_all(&mut poller::<8>(&dev)) {
        assert_eq!(a.on_completion(&c), Ok(1), "its own completions again");
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.sync(&new)));
    assert!(r.is_err(), "the unsplit pair's counters accepted");
}

/// Soundness review: a ring on a UD QP without a destination posted `ah = NULL`, which
/// rxe and mlx5 dereference while posting. Now refused at construction (and a NULL AH in
/// `set_ud_dest`).
#[test]
fn a_ud_ring_needs_a_destination() {
    use hotverbs::{Context, QpBuilder, QpType};
    let ctx = Context::open("softnic").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let ud = QpBuilder::new(&pd, &cq, &cq, QpType::Ud).build().unwrap();
    // SAFETY: live QP; the attempts are refused (asserted).
    let r = unsafe { SendRing::<8>::new(ud.as_raw(), SendConfig::new(1, 8, 0)) };
    assert_eq!(r.err(), Some(ConfigError::UdDest));
    let null = UdDest {
        ah: core::ptr::null_mut(),
        remote_qpn: 1,
        remote_qkey: 1,
    };
    // SAFETY: as above.
    let r = unsafe { SendRing::<8>::new(ud.as_raw(), SendConfig::new(1, 8, 0).ud(null)) };
    assert_eq!(r.err(), Some(ConfigError::UdDest));
}

// ---- issue 27, item 10: a completion that is not a ring's is an error, never `Ok(0)` -----

/// A completion forged with `wr_id`, `status` and `qp_num`.
fn forge(wr_id: u64, status: ibv_wc_status, qp_num: u32) -> Completion {
    let mut w = *wc(wr_id, status, IBV_WC_SEND).as_raw();
    w.qp_num = qp_num;
    // SAFETY: these stand for completions of other rings, kinds and QPs (refused, asserted)
    // and a stale one of the ring (ignored, asserted): none retires anything.
    unsafe { Completion::from_raw(w) }
}

/// What every send ring (and the split-mode retirer) must answer, given `on`, its
/// `on_completion`: another ring's, a receive with its own ring id and another QP's
/// completion are `Misrouted` naming where they belong; its own stale flush and a spent
/// completion are ignored (`Ok(0)`). Before issue 27 all five were `Ok(0)`.
fn refuses_foreign_ignores_stale(
    what: &str,
    ring_id: u8,
    qp_num: u32,
    mut on: impl FnMut(&Completion) -> Result<u64, WcError>,
) {
    let other = ring_id.wrapping_add(1);
    let misrouted = |ring, recv, qp_num| {
        Err(WcError::Misrouted(Misrouted::new(
            ring,
            recv,
            ring_id,
            false,
            qp_num == 0,
        )))
    };
    assert_eq!(
        on(&forge(wr_id::encode(other, 0), IBV_WC_SUCCESS, qp_num)),
        misrouted(other, false, qp_num),
        "{what}: another ring's send completion"
    );
    assert_eq!(
        on(&forge(
            wr_id::encode_recv(ring_id, 0, 0),
            IBV_WC_SUCCESS,
            qp_num
        )),
        misrouted(ring_id, true, qp_num),
        "{what}: a receive completion with its ring id"
    );
    assert_eq!(
        on(&forge(
            wr_id::encode(ring_id, 0),
            IBV_WC_SUCCESS,
            qp_num + 1
        )),
        misrouted(ring_id, false, qp_num + 1),
        "{what}: another QP's completion with its ring id"
    );
    assert_eq!(
        on(&forge(
            wr_id::encode(ring_id, 1000),
            IBV_WC_WR_FLUSH_ERR,
            qp_num
        )),
        Ok(0),
        "{what}: its own stale flush stays ignored"
    );
    assert_eq!(
        on(&Completion::PLACEHOLDER),
        Ok(0),
        "{what}: a spent completion is nobody's"
    );
}

/// The user-visible failure: an application dispatching by "send ring first" (or with a
/// routing bug) handed a receive completion to the send ring, got `Ok(0)`, and dropped it:
/// the receive slot stayed posted for ever and its message was never delivered. Before the
/// fix `misrouted` stayed empty (the first assertion below: left 0, right 1) and the ring
/// kept 3 of its 4 slots. Now the send ring's error names the receive ring, which still
/// takes the completion.
#[test]
fn a_receive_completion_handed_to_a_send_ring_is_an_error_naming_its_ring() {
    let dev = CountingDevice::new(64);
    let region = vec![0u8; 4 * 64];
    let mut rr: RecvRing<4> = recv_ring(RecvTarget::Qp(dev.qp()), &region, 7, 4);
    rr.fill().unwrap();
    let mut sr: SendRing<8> = send_ring(&dev, SendConfig::new(1, 8, 64).signal_every(1));
    sr.send_now(Msg::send(Local::Empty)).unwrap();
    assert!(dev.complete_recv(5, None));
    let mut p = poller::<8>(&dev);
    let (mut retired, mut misrouted) = (0, Vec::new());
    for c in p.poll().unwrap() {
        match sr.on_completion(c) {
            Ok(n) => retired += n,
            Err(WcError::Misrouted(m)) => {
                misrouted.push(m.to_string());
                let got = rr
                    .on_completion(c)
                    .expect("the receive ring's own completion");
                assert_eq!(got.byte_len(), 5);
                rr.release(got).unwrap();
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(misrouted.len(), 1, "the receive completion was dropped");
    assert!(
        misrouted[0].contains("hand it to the RecvRing with ring id 7"),
        "{}",
        misrouted[0]
    );
    assert_eq!(retired, 1);
    assert_eq!(
        (sr.outstanding(), sr.error()),
        (0, None),
        "the send ring is untouched"
    );
    assert_eq!(rr.posted(), 4, "the receive slot came back: nothing lost");
}

/// Every send ring kind, and the split-mode retirer, refuse what is not theirs and keep
/// ignoring their own stale completions; the refusals change nothing. Failed before the
/// fix at the first check of [`refuses_foreign_ignores_stale`] (`Ok(0)` for another ring's
/// completion).
#[test]
fn every_send_ring_refuses_what_is_not_its_own_and_ignores_its_stale() {
    use hotverbs_softnic::counting::QP_NUM;
    let dev = CountingDevice::new(64);
    // SendRing.
    let mut sr: SendRing<8> = send_ring(&dev, SendConfig::new(1, 8, 64).signal_every(4));
    for _ in 0..3 {
        sr.send_now(Msg::send(Local::Empty)).unwrap();
    }
    refuses_foreign_ignores_stale("SendRing", 1, QP_NUM, |c| sr.on_completion(c));
    assert_eq!((sr.outstanding(), sr.error()), (3, None));
    // Its retirer (split mode).
    let (shared, mut retirer) = sr.split();
    refuses_foreign_ignores_stale("SendRetirer", 1, QP_NUM, |c| {
        retirer.on_completion(c, &shared)
    });
    assert_eq!(
        (retirer.retired(), shared.observe_error()),
        (0, None),
        "nothing published"
    );
    // WrRing.
    // SAFETY: the device's extended QP outlives the ring; nothing else posts to it.
    let mut wr = unsafe { WrRing::new(dev.qp_ex(), SendConfig::new(4, 8, 64).signal_every(4)) }
        .expect("config");
    for _ in 0..2 {
        wr.send_now(Msg::send(Local::Empty)).unwrap();
    }
    refuses_foreign_ignores_stale("WrRing", 4, QP_NUM, |c| wr.on_completion(c));
    assert_eq!((wr.outstanding(), wr.error()), (2, None));
    // DirectRing, on the simulated ConnectX queues.
    let (mut sim, qpn) = (
        hotverbs_softnic::mlx5sim::Mlx5Sim::new(64, 16, 0xabc),
        0xabc,
    );
    let mut dr = direct_ring(&mut sim, qpn, SendConfig::new(9, 8, 64).signal_every(4));
    for _ in 0..2 {
        dr.send_now(Msg::send(Local::Empty)).unwrap();
    }
    refuses_foreign_ignores_stale("DirectRing", 9, qpn, |c| dr.on_completion(c));
    assert_eq!((dr.outstanding(), dr.error()), (2, None));
}

/// A `DirectRing` on `sim`'s send queue.
fn direct_ring(
    sim: &mut hotverbs_softnic::mlx5sim::Mlx5Sim,
    qp_num: u32,
    cfg: SendConfig,
) -> DirectRing<mlx5::RecordingDoorbell> {
    let sq = common::mlx5::sim_sq(sim, qp_num, 64, 4);
    // SAFETY: the simulator's memory outlives the ring; nothing else posts.
    unsafe { DirectRing::with_doorbell(sq, cfg, None, mlx5::RecordingDoorbell::new(sq.bf_reg)) }
        .expect("config")
}

/// An extended poller that reads no QP numbers gives every completion `qp_num` 0 (item 9
/// seen from the datapath): every ring used to ignore all of them (`Ok(0)`), so nothing
/// ever retired. Now the first one is an error that names the missing field.
#[test]
fn a_completion_without_its_qp_number_is_refused_naming_the_missing_field() {
    let dev = CountingDevice::new(64);
    // SAFETY: the device's extended QP and CQ outlive the ring and the poller.
    let (mut r, mut p) = unsafe {
        (
            WrRing::new(dev.qp_ex(), SendConfig::new(2, 8, 64).signal_every(1)).expect("config"),
            ExCqPoller::<4>::new(dev.cq_ex(), ExFields::NONE, 0).expect("fields"),
        )
    };
    r.send_now(Msg::send(Local::Empty)).unwrap();
    let cs = p.poll().unwrap();
    assert_eq!((cs.len(), cs[0].qp_num()), (1, 0));
    let e = r.on_completion(&cs[0]).unwrap_err();
    assert!(matches!(e, WcError::Misrouted(m) if m.no_qp_num()), "{e:?}");
    assert!(e.to_string().contains("ExFields::QP_NUM"), "{e}");
    assert_eq!(
        r.outstanding(),
        1,
        "nothing retired from a completion of no known QP"
    );
}

/// A receive ring refuses another receive ring's completion as `Misrouted` (it used to be
/// `Stale`, which applications must ignore after a reset, so the other ring's message was
/// lost as surely as with `Ok(0)`: this test failed at its first assertion), and keeps
/// calling its own leftovers stale: a completion given twice, flushes of an older
/// generation after a reset.
#[test]
fn recv_ring_refuses_another_receive_rings_completion_and_keeps_stale_for_its_own() {
    let dev = CountingDevice::new(64);
    let (ra, rb) = (vec![0u8; 4 * 64], vec![0u8; 4 * 64]);
    let mut a: RecvRing<4> = recv_ring(RecvTarget::Qp(dev.qp()), &ra, 1, 4);
    let mut b: RecvRing<4> = recv_ring(RecvTarget::Srq(dev.srq()), &rb, 2, 4);
    a.fill().unwrap();
    b.fill().unwrap();
    let mut p = poller::<8>(&dev);
    assert!(dev.complete_recv(3, None));
    let mut cs = poll_all(&mut p);
    assert_eq!(cs.len(), 1);
    let got = b.on_completion(&mut cs[0]);
    assert_eq!(
        got,
        Err(RecvError::Misrouted(Misrouted::new(
            1,
            true,
            2,
            true,
            hotverbs_softnic::counting::QP_NUM == 0
        )))
    );
    assert!(
        got.unwrap_err()
            .to_string()
            .contains("ring id 1 is another ring's"),
        "names the ring"
    );
    assert_eq!((b.posted(), b.held()), (4, 0), "b unchanged");
    let m = a.on_completion(&mut cs[0]).expect("a's own");
    // Spent: given again, to either ring, it is stale.
    let spent = cs[0].wr_id();
    assert_eq!(
        a.on_completion(&mut cs[0]),
        Err(RecvError::Stale { wr_id: spent })
    );
    assert_eq!(
        b.on_completion(&mut cs[0]),
        Err(RecvError::Stale { wr_id: spent })
    );
    a.release(m).unwrap();
    // Flushes of a's old generation, handed over after a's reset: stale, not misrouted.
    dev.set_qp_error();
    let mut flushes = poll_all(&mut p);
    assert_eq!(flushes.len(), 4);
    dev.reset_qp();
    // SAFETY: the QP went through RESET: no receive of `a` is posted.
    unsafe { a.reset() };
    for c in &mut flushes {
        assert_eq!(
            a.on_completion(c),
            Err(RecvError::Stale { wr_id: c.wr_id() })
        );
    }
}

// ---- issue 27, suspected: a panic inside `CqPoller::drain`'s closure ------------------------

/// The rest a panicking `drain` left moves with its poller: swapped with another poller
/// (of another CQ), `poll` (the one path that merges the rest into a poll's return code,
/// rotating it to the front of the batch) hands it out exactly once, from the poller that
/// holds it, and the other poller polls its own CQ. (`mem::forget` of a datapath poller is
/// a drop: it has no `Drop`, and owns nothing but its array.)
#[test]
fn a_drain_rest_moves_with_its_poller_through_swap() {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let (dev, other) = (CountingDevice::new(64), CountingDevice::new(64));
    let mut ring: SendRing<16> = send_ring(&dev, SendConfig::new(1, 16, 64).signal_every(1));
    for _ in 0..5 {
        ring.send_now(Msg::send(Local::Empty)).unwrap();
    }
    let mut a: CqPoller<8> = poller(&dev);
    let mut b: CqPoller<8> = poller(&other);
    let r = catch_unwind(AssertUnwindSafe(|| {
        a.drain(|c| {
            assert_eq!(ring.on_completion(c), Ok(1));
            if c.seq() == 1 {
                std::panic::resume_unwind(Box::new(1u64));
            }
        })
    }));
    assert!(r.is_err());
    std::mem::swap(&mut a, &mut b);
    let polls = other.polls();
    assert!(a.poll().unwrap().is_empty(), "a now polls the other CQ");
    assert_eq!(other.polls(), polls + 1);
    let rest: Vec<u64> = b.poll().unwrap().iter().map(|c| c.seq()).collect();
    assert_eq!(
        rest,
        [2, 3, 4],
        "the rest, from the poller that holds it, once"
    );
    assert!(b.poll().unwrap().is_empty());
    assert!(a.poll().unwrap().is_empty());
}

/// `drain` polls a batch off the CQ and hands it to `f` one completion at a time. A panic
/// in `f` used to unwind out of `drain` with the rest of the batch, already consumed from
/// the CQ, gone: those WRs never retired (before the fix the second `drain` below found
/// the CQ empty, so it did not panic and the test failed there; the ring kept 5 WRs
/// outstanding for ever). Now the poller keeps them and every kind of poll returns them
/// first, in order, each exactly once.
#[test]
fn completions_after_a_panicking_drain_closure_come_back_on_the_next_poll() {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let dev = CountingDevice::new(64);
    let mut ring: SendRing<16> = send_ring(&dev, SendConfig::new(1, 16, 64).signal_every(1));
    for _ in 0..7 {
        ring.send_now(Msg::send(Local::Empty)).unwrap();
    }
    let mut p: CqPoller<8> = poller(&dev);
    let mut handed = Vec::new();
    let mut panics_at = |p: &mut CqPoller<8>, ring: &mut SendRing<16>, at: u64| {
        catch_unwind(AssertUnwindSafe(|| {
            p.drain(|c| {
                handed.push(c.seq());
                assert_eq!(ring.on_completion(c), Ok(1));
                if c.seq() == at {
                    // An unwinding panic without the panic hook (no message, no backtrace
                    // capture: cheap under miri).
                    std::panic::resume_unwind(Box::new(at));
                }
            })
        }))
        .is_err()
    };
    assert!(panics_at(&mut p, &mut ring, 1));
    assert_eq!(ring.outstanding(), 5);
    // The rest of that batch (2..=6) before anything new, without polling the CQ; a second
    // panic, at the first of them, keeps the others.
    let polls = dev.polls();
    assert!(panics_at(&mut p, &mut ring, 2));
    let mut rest = [const { Completion::PLACEHOLDER }; 2];
    assert_eq!(p.poll_into(&mut rest), Ok(2), "3 and 4 into a short array");
    let tail: Vec<u64> = p.poll().unwrap().iter().map(|c| c.seq()).collect();
    assert_eq!(dev.polls(), polls, "the CQ was not polled meanwhile");
    let rest: Vec<u64> = rest.iter().map(|c| c.seq()).collect();
    assert_eq!(
        (rest.as_slice(), tail.as_slice()),
        (&[3, 4][..], &[5, 6][..])
    );
    assert_eq!(handed, [0, 1, 2]);
    assert_eq!(ring.outstanding(), 4, "3..=6 not yet given to the ring");
    assert!(p.poll().unwrap().is_empty(), "then the (empty) CQ again");
    assert_eq!(dev.polls(), polls + 1);
}
