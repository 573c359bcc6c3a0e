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
    Completion(w)
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
    let shared: SendCounters = SendCounters::new();
    let mut retirer = ring.retirer();
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
    let shared: SendCounters = SendCounters::new();
    let mut retirer = ring.retirer();
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

/// The retirer ignores other rings' completions and stale ones from before a reset.
#[test]
fn split_retirer_checks_ring_and_window() {
    let shared: SendCounters = SendCounters::new();
    let mut r = SendRetirer::new(3, 4, 10);
    assert_eq!(
        r.on_completion(&wc(wr_id::encode(2, 11), 0, IBV_WC_SEND), &shared),
        Ok(0),
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
    let foreign = wc(wr_id::encode(1, 0), IBV_WC_SUCCESS, IBV_WC_SEND);
    assert_eq!(
        rr.on_completion(&foreign),
        Err(RecvError::Stale {
            wr_id: foreign.wr_id()
        })
    );
    assert_eq!((rr.posted(), rr.held()), (4, 0), "slot 0 still posted");
    // Its own flushed receive with opcode 0 (rxe) is still recognised by the ring id.
    dev.set_qp_error();
    let cs = poll_all(&mut poller::<8>(&dev));
    assert_eq!(cs.len(), 4);
    for mut c in cs {
        c.0.opcode = IBV_WC_SEND;
        assert!(matches!(
            rr.on_completion(&c),
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
        .iter()
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
    let own = small.on_completion(&poll_all(&mut p)[0]).unwrap();
    assert_eq!(own.slot(), 0);
    assert_eq!(small.data(&slot0), Err(RecvError::Foreign { slot: 0 }));
    assert_eq!(small.release(slot0), Err(RecvError::Foreign { slot: 0 }));
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
    let held = rr.on_completion(&poll_all(&mut p)[0]).unwrap();
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
        .iter()
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
/// zero-copy buffers the NIC was still reading.
#[test]
fn send_ring_ignores_another_rings_completion() {
    let dev = CountingDevice::new(64);
    let mut ring: SendRing<8> = send_ring(&dev, SendConfig::new(1, 8, 64).signal_every(4));
    for _ in 0..3 {
        ring.send_now(Msg::send(Local::Empty)).unwrap();
    }
    assert_eq!(ring.outstanding(), 3);
    let recv = wc(wr_id::encode(2, 1), IBV_WC_SUCCESS, IBV_WC_RECV);
    assert_eq!(ring.on_completion(&recv), Ok(0));
    let flush = wc(wr_id::encode(2, 2), IBV_WC_WR_FLUSH_ERR, 0);
    assert_eq!(ring.on_completion(&flush), Ok(0));
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
    let mut out = [wc(0, 0, 0); 8];
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
