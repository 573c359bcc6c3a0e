//! [`WrRing`] and [`ExCqPoller`] on the counting device: round trips, batching and
//! signaling, accounting against the device's counts, failure paths (a failed
//! `ibv_wr_complete`, QP error flushes, reset), split mode, and the poller's fields.

use hotverbs_datapath::*;
use hotverbs_ffi::*;
use hotverbs_softnic::counting::{CountingDevice, QP_NUM};

const ENOMEM: i32 = 12;
const EINVAL: i32 = 22;

/// Every `IBV_WC_EX_WITH_*` flag the counting device's extended CQ serves.
const ALL_WC: u64 = (IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) as u64;

fn ring(dev: &CountingDevice, cfg: SendConfig) -> WrRing {
    // SAFETY: the device's extended QP outlives the ring (every test drops the ring first:
    // declared after the device); nothing else posts to it.
    unsafe { WrRing::new(dev.qp_ex(), cfg) }.unwrap()
}

fn poller(dev: &CountingDevice, fields: ExFields) -> ExCqPoller<8> {
    // SAFETY: the device's extended CQ serves every flag of ALL_WC and outlives the poller.
    unsafe { ExCqPoller::new(dev.cq_ex(), fields, ALL_WC) }.unwrap()
}

/// Polls until empty, giving every completion to the ring; returns (completions, retired).
fn drain(p: &mut ExCqPoller<8>, r: &mut WrRing) -> (u64, u64) {
    let (mut seen, mut retired) = (0, 0);
    loop {
        let cs = p.poll().unwrap();
        if cs.is_empty() {
            return (seen, retired);
        }
        for c in cs.iter() {
            seen += 1;
            retired += r.on_completion(c).unwrap_or(0);
        }
    }
}

#[test]
fn batch_posts_one_region_and_signals_on_schedule() {
    let dev = CountingDevice::new(256);
    let mut r = ring(&dev, SendConfig::new(3, 32, 64).signal_every(8).batch(32));
    let mut p = poller(&dev, ExFields::QP_NUM | ExFields::OPCODE);
    let data = [*b"hello-wr"; 32];
    let mut b = r.batch();
    for (i, d) in data.iter().enumerate() {
        assert_eq!(b.push(Msg::send(Local::Inline(d))).unwrap(), i as u64);
        if i < 31 {
            assert_eq!(b.staged(), i as u64 + 1, "staged, not posted");
        }
    }
    // The 32nd WR fills the ring (depth 32): posted at once.
    assert_eq!(b.staged(), 0);
    b.finish().unwrap();
    assert_eq!(dev.doorbells(), 1, "one region, one ibv_wr_complete");
    assert_eq!(dev.send_wrs(), 32);
    assert_eq!(r.outstanding(), 32);
    assert!(!r.region_open() && !dev.wr_region_open());
    // Signaled: 7, 15, 23, 31.
    let cs = p.poll().unwrap();
    assert_eq!(cs.len(), 4);
    for (k, c) in cs.iter().enumerate() {
        assert_eq!(c.ring(), 3);
        assert_eq!(c.seq(), 8 * k as u64 + 7);
        assert_eq!(c.opcode(), IBV_WC_SEND);
        assert_eq!(c.qp_num(), QP_NUM);
        assert_eq!(r.on_completion(c).unwrap(), 8);
    }
    assert_eq!(r.outstanding(), 0);
    assert_eq!(r.progress().retired, 32);
}

#[test]
fn send_now_posts_alone_and_drains_with_the_legacy_poller_too() {
    let dev = CountingDevice::new(256);
    let mut r = ring(&dev, SendConfig::new(1, 16, 64).signal_every(4));
    // SAFETY: the extended CQ is an ibv_cq too; live for the test.
    let mut legacy: CqPoller<8> =
        unsafe { CqPoller::new(hotverbs_ffi::inline::ibv_cq_ex_to_cq(dev.cq_ex())) };
    let mut sent = 0;
    for i in 0..100u64 {
        let d = i.to_le_bytes();
        match r.send_now(Msg::send(Local::Inline(&d))) {
            Ok(seq) => {
                assert_eq!(seq, sent);
                sent += 1;
                assert_eq!(r.staged(), 0);
            }
            Err(SendError::WouldBlock) => {
                for c in legacy.poll().unwrap() {
                    r.on_completion(c).unwrap();
                }
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(dev.send_wrs(), sent);
    assert_eq!(dev.doorbells(), sent, "one ibv_wr_complete per send_now");
    assert!(sent > 50);
}

#[test]
fn every_opcode_builds_with_its_flags() {
    let dev = CountingDevice::new(256);
    let remote = RemoteBuf {
        addr: 0x10_000,
        len: 4096,
        rkey: 7,
    };
    let mut r = ring(
        &dev,
        SendConfig::new(2, 16, 16)
            .signal_every(1)
            .batch(1)
            .remote(remote),
    );
    let mut p = poller(
        &dev,
        ExFields::QP_NUM | ExFields::OPCODE | ExFields::BYTE_LEN,
    );
    let buf = LocalBuf {
        addr: 0x2000,
        len: 8,
        lkey: 5,
    };
    let big = LocalBuf {
        addr: 0x3000,
        len: 100,
        lkey: 5,
    };
    let inl = [1u8; 16];
    let msgs = [
        (Msg::send(Local::Inline(&inl)), IBV_WC_SEND),
        (Msg::send(Local::Empty), IBV_WC_SEND),
        (Msg::send_imm(Local::Inline(&inl), 9), IBV_WC_SEND),
        (Msg::write(Local::Inline(&inl), 64), IBV_WC_RDMA_WRITE),
        (Msg::write(Local::Buf(big), 128), IBV_WC_RDMA_WRITE),
        (Msg::write_imm(Local::Buf(buf), 0, 3), IBV_WC_RDMA_WRITE),
        (Msg::read(buf, 8), IBV_WC_RDMA_READ),
        (Msg::fetch_add(buf, 16, 1), IBV_WC_FETCH_ADD),
        (Msg::cmp_swap(buf, 24, 1, 2), IBV_WC_COMP_SWAP),
    ];
    for (i, (m, op)) in msgs.iter().enumerate() {
        // SAFETY: the "registered" buffers are fake addresses the counting device never
        // touches; inline bytes outlive the call.
        let seq = unsafe { r.stage(*m) }.unwrap();
        assert_eq!(seq, i as u64);
        let cs = p.poll().unwrap();
        assert_eq!(cs.len(), 1, "{m:?}: signal_every 1, batch 1");
        assert_eq!(cs[0].opcode(), *op);
        assert_eq!(r.on_completion(&cs[0]).unwrap(), 1);
    }
    assert_eq!(dev.doorbells(), msgs.len() as u64);
    // Refusals touch nothing.
    let long = [0u8; 17];
    assert_eq!(
        r.send_now(Msg::send(Local::Inline(&long))),
        Err(SendError::InlineTooLong { len: 17, max: 16 })
    );
    assert_eq!(
        // SAFETY: refused before any use.
        unsafe { r.stage(Msg::fetch_add(buf, 4, 1)) },
        Err(SendError::AtomicMisaligned)
    );
    assert_eq!(
        r.send_now(Msg::write(Local::Inline(&inl), 4090)),
        Err(SendError::RemoteOutOfRange {
            offset: 4090,
            len: 16
        })
    );
    assert_eq!(
        r.send_now(Msg::send(Local::Buf(buf))),
        Err(SendError::NotInline)
    );
    assert!(!r.region_open());
    assert_eq!(dev.doorbells(), msgs.len() as u64);
    assert_eq!(r.staged(), 0);
}

#[test]
fn a_refused_message_leaves_the_region_open_with_its_staged_wrs() {
    let dev = CountingDevice::new(256);
    let mut r = ring(&dev, SendConfig::new(1, 16, 8).signal_every(8).batch(16));
    let ok = [0u8; 8];
    let long = [0u8; 9];
    let mut b = r.batch();
    b.push(Msg::send(Local::Inline(&ok))).unwrap();
    b.push(Msg::send(Local::Inline(&ok))).unwrap();
    assert!(matches!(
        b.push(Msg::send(Local::Inline(&long))),
        Err(SendError::InlineTooLong { .. })
    ));
    assert!(dev.wr_region_open(), "kept open: its WRs were accepted");
    b.push(Msg::send(Local::Inline(&ok))).unwrap();
    b.finish().unwrap();
    assert_eq!((dev.send_wrs(), dev.doorbells()), (3, 1));
    assert_eq!(dev.wr_aborts(), 0);
    assert_eq!(r.outstanding(), 3);
}

#[test]
fn op_without_builder_is_refused() {
    let dev = CountingDevice::new(16);
    // SAFETY: the device's QP is live; the test removes one builder as a QP created
    // without IBV_QP_EX_WITH_RDMA_READ in send_ops_flags would have it, before any ring.
    unsafe { (*dev.qp_ex()).wr_rdma_read = None };
    let remote = RemoteBuf {
        addr: 0,
        len: 64,
        rkey: 1,
    };
    let mut r = ring(&dev, SendConfig::new(1, 8, 0).remote(remote));
    let buf = LocalBuf {
        addr: 0x1000,
        len: 8,
        lkey: 1,
    };
    assert_eq!(
        // SAFETY: refused before use.
        unsafe { r.stage(Msg::read(buf, 0)) },
        Err(SendError::OpNotEnabled(Opcode::Read))
    );
    // SAFETY: a live QP; the same kind of edit.
    unsafe { (*dev.qp_ex()).wr_start = None };
    // SAFETY: as in `ring`.
    let e = unsafe { WrRing::new(dev.qp_ex(), SendConfig::new(2, 8, 0)) }.unwrap_err();
    assert_eq!(e, ConfigError::ExtendedOps);
}

#[test]
fn failed_wr_complete_posts_nothing_and_rewinds() {
    let dev = CountingDevice::new(256);
    let mut r = ring(&dev, SendConfig::new(1, 16, 8).signal_every(4).batch(16));
    let mut p = poller(&dev, ExFields::QP_NUM);
    let d = [0u8; 8];
    let mut b = r.batch();
    for _ in 0..6 {
        b.push(Msg::send(Local::Inline(&d))).unwrap();
    }
    drop(b);
    // The batch's drop posted the 6: now fail the next region of 5.
    assert_eq!(r.outstanding(), 6);
    dev.fail_next_post(ENOMEM, 3);
    let mut b = r.batch();
    for _ in 0..5 {
        b.push(Msg::send(Local::Inline(&d))).unwrap();
    }
    let e = b.finish().unwrap_err();
    match e {
        SendError::Post(pe) => {
            assert_eq!(pe.verb, "ibv_wr_complete");
            assert_eq!(pe.errno, ENOMEM);
            assert_eq!(pe.first_rejected, 0);
            assert_eq!(pe.first_rejected_seq, 6);
            assert!(e.to_string().contains("ibv_wr_complete"), "{e}");
        }
        e => panic!("{e}"),
    }
    assert_eq!(dev.send_wrs(), 6, "none of the failed region was posted");
    assert_eq!(r.outstanding(), 6);
    assert_eq!(r.staged(), 0);
    // The schedule went back: the next WRs reuse sequences 6.. and seq 7 is signaled.
    let mut b = r.batch();
    assert_eq!(b.push(Msg::send(Local::Inline(&d))).unwrap(), 6);
    assert_eq!(b.push(Msg::send(Local::Inline(&d))).unwrap(), 7);
    b.finish().unwrap();
    assert_eq!(drain(&mut p, &mut r), (2, 8));
    assert_eq!(r.outstanding(), 0);
    // A failure of the batch's drop is reported by the next flush.
    dev.fail_next_post(EINVAL, 0);
    {
        let mut b = r.batch();
        b.push(Msg::send(Local::Inline(&d))).unwrap();
    }
    assert!(matches!(r.flush(), Err(SendError::Post(pe)) if pe.errno == EINVAL));
    assert_eq!(r.flush(), Ok(()));
    assert_eq!(r.outstanding(), 0);
}

#[test]
fn qp_error_flushes_retire_exactly_the_outstanding_wrs_then_reset_recovers() {
    let dev = CountingDevice::new(256);
    let mut r = ring(&dev, SendConfig::new(1, 16, 8).signal_every(8).batch(4));
    let mut p = poller(&dev, ExFields::QP_NUM);
    let d = [0u8; 8];
    let mut b = r.batch();
    for _ in 0..4 {
        b.push(Msg::send(Local::Inline(&d))).unwrap();
    }
    b.finish().unwrap();
    // The 5th WR fails (unsignaled), the QP enters error, the rest flush.
    dev.fail_next_wr(IBV_WC_REM_ACCESS_ERR);
    let mut b = r.batch();
    for _ in 0..4 {
        b.push(Msg::send(Local::Inline(&d))).unwrap();
    }
    b.finish().unwrap();
    assert_eq!(r.outstanding(), 8);
    let mut errors = 0;
    let mut retired = 0;
    loop {
        let cs = p.poll().unwrap();
        if cs.is_empty() {
            break;
        }
        for c in cs.iter() {
            match r.on_completion(c) {
                Ok(n) => retired += n,
                Err(_) => {
                    errors += 1;
                    retired = r.retired_total();
                }
            }
        }
    }
    // seq 4 failed (retires 0..=4), 5, 6, 7 flushed (each retires itself).
    assert_eq!(errors, 4);
    assert_eq!(retired, 8);
    assert_eq!(r.outstanding(), 0);
    assert_eq!(r.error(), Some(WcError::RemAccess));
    assert_eq!(
        r.send_now(Msg::send(Local::Inline(&d))),
        Err(SendError::QpError(WcError::RemAccess))
    );
    // Stage something unposted, then reset: the open region is aborted.
    dev.reset_qp();
    // SAFETY: the QP went through RESET (the device's reset_qp); nothing is outstanding.
    assert_eq!(unsafe { r.reset() }, 0);
    assert_eq!(r.error(), None);
    // A leaked batch: the ring cannot know what it built, so its region is aborted.
    let mut b = r.batch();
    b.push(Msg::send(Local::Inline(&d))).unwrap();
    core::mem::forget(b);
    assert!(dev.wr_region_open());
    assert_eq!(r.flush(), Ok(()));
    assert!(!dev.wr_region_open());
    assert_eq!((dev.wr_aborts(), r.staged(), r.outstanding()), (1, 0, 0));
    // A staged WR at reset: aborted and counted.
    // SAFETY: inline bytes outlive the call.
    unsafe { r.stage(Msg::send(Local::Inline(&d))) }.unwrap();
    assert!(dev.wr_region_open());
    // SAFETY: as above: the staged WR was never posted.
    assert_eq!(unsafe { r.reset() }, 1);
    assert!(!dev.wr_region_open());
    assert_eq!(dev.wr_aborts(), 2);
    let before = dev.send_wrs();
    for _ in 0..16 {
        r.signal_next();
        r.send_now(Msg::send(Local::Inline(&d))).unwrap();
        assert_eq!(drain(&mut p, &mut r).1, 1);
    }
    assert_eq!(dev.send_wrs(), before + 16);
}

#[test]
fn dropping_a_ring_with_an_open_region_aborts_it() {
    let dev = CountingDevice::new(64);
    let d = [0u8; 4];
    {
        let mut r = ring(&dev, SendConfig::new(1, 16, 8).batch(16));
        // SAFETY: inline bytes outlive the call.
        unsafe { r.stage(Msg::send(Local::Inline(&d))) }.unwrap();
        assert!(dev.wr_region_open());
    }
    assert!(!dev.wr_region_open());
    assert_eq!((dev.wr_aborts(), dev.send_wrs()), (1, 0));
}

#[test]
fn split_mode_retires_through_the_retirer() {
    let dev = CountingDevice::new(256);
    let mut r = ring(&dev, SendConfig::new(4, 16, 8).signal_every(4).batch(4));
    let mut p = poller(&dev, ExFields::QP_NUM);
    let (shared, mut retirer) = r.split();
    let d = [0u8; 8];
    let mut sent = 0u64;
    while sent < 200 {
        match r.send_now(Msg::send(Local::Inline(&d))) {
            Ok(_) => sent += 1,
            Err(SendError::WouldBlock) => {
                for c in p.poll().unwrap().iter() {
                    retirer.on_completion(c, &shared).unwrap();
                }
                r.sync(&shared);
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(r.staged(), 0);
    assert_eq!(dev.send_wrs(), 200);
    assert!(r.retired_total() > 0);
    r.sync(&shared);
    assert_eq!(shared.observe_posted(), 200);
}

#[test]
fn poller_reads_requested_fields_and_timestamps() {
    let dev = CountingDevice::new(64);
    dev.set_loopback(true);
    let mut r = ring(&dev, SendConfig::new(1, 16, 16).signal_every(1).batch(1));
    let fields = ExFields::QP_NUM
        | ExFields::OPCODE
        | ExFields::BYTE_LEN
        | ExFields::IMM
        | ExFields::COMPLETION_TS;
    let mut p = poller(&dev, fields);
    assert!(
        p.fields().contains(ExFields::WC_FLAGS),
        "IMM implies WC_FLAGS"
    );
    // A receive for the loopback SEND_WITH_IMM (its wr_id is a receive ring's).
    let mut wr: ibv_recv_wr = unsafe_zeroed();
    wr.wr_id = wr_id::encode_recv(9, 0, 0);
    let mut bad = core::ptr::null_mut();
    // SAFETY: the device's QP, a one-WR chain.
    let rc = unsafe { hotverbs_ffi::inline::ibv_post_recv(dev.qp(), &mut wr, &mut bad) };
    assert_eq!(rc, 0);
    r.send_now(Msg::send_imm(Local::Inline(b"12345"), 0xABCD))
        .unwrap();
    let (cs, ts) = p.poll_ts().unwrap();
    assert_eq!(cs.len(), 2);
    assert_eq!(ts, &[1, 2], "the device's completion ordinals");
    assert_eq!(cs[0].opcode(), IBV_WC_RECV);
    assert_eq!(cs[0].byte_len(), 5);
    assert_eq!(cs[0].imm(), Some(0xABCD));
    assert_eq!(cs[1].opcode(), IBV_WC_SEND);
    assert_eq!(cs[1].imm(), None);
    assert_eq!(r.on_completion(&cs[1]).unwrap(), 1);
    dev.set_loopback(false);
    // Fields not asked for stay 0.
    let mut q = poller(&dev, ExFields::NONE);
    r.send_now(Msg::send(Local::Inline(b"x"))).unwrap();
    let cs = q.poll().unwrap();
    assert_eq!((cs[0].qp_num(), cs[0].opcode(), cs[0].seq()), (0, 0, 1));
    assert!(
        matches!(
            r.on_completion(&cs[0]),
            Err(WcError::Misrouted(m)) if m.no_qp_num()
        ),
        "no qp_num: refused as not this ring's, never Ok(0)"
    );
    assert_eq!(r.outstanding(), 1);
    // ... unless the poller is told its CQ serves one QP.
    let mut q = poller(&dev, ExFields::NONE).with_qp_num(QP_NUM);
    r.send_now(Msg::send(Local::Inline(b"y"))).unwrap();
    let cs = q.poll().unwrap();
    assert_eq!(r.on_completion(&cs[0]).unwrap(), 2);
    // Fields outside the CQ's wc_flags are refused.
    // SAFETY: as in `poller`, with a narrower (claimed) wc_flags.
    let e = unsafe {
        ExCqPoller::<4>::new(
            dev.cq_ex(),
            ExFields::COMPLETION_TS,
            IBV_WC_EX_WITH_QP_NUM as u64,
        )
    }
    .unwrap_err();
    assert_eq!(e, ConfigError::WcFields);
}

#[test]
fn poll_of_more_than_b_completions_takes_several_polls() {
    let dev = CountingDevice::new(64);
    let mut r = ring(&dev, SendConfig::new(1, 32, 8).signal_every(1).batch(32));
    let mut p = poller(&dev, ExFields::QP_NUM);
    let d = [0u8; 8];
    let mut b = r.batch();
    for _ in 0..20 {
        b.push(Msg::send(Local::Inline(&d))).unwrap();
    }
    b.finish().unwrap();
    let polls0 = dev.polls();
    let lens: Vec<usize> = (0..4).map(|_| p.poll().unwrap().len()).collect();
    assert_eq!(lens, [8, 8, 4, 0]);
    assert_eq!(dev.polls() - polls0, 4, "one start_poll per poll");
}

fn unsafe_zeroed<T>() -> T {
    // SAFETY: only used for plain C structs (integers and pointers) where all-zero is valid.
    unsafe { core::mem::zeroed() }
}

// ---------------------------------------------------------------------------------------
// softnic, in the profile HOTVERBS_SOFTNIC_PROFILE selects (Spec or Rxe): real extended QPs
// and CQs through `ibv_create_qp_ex` / `ibv_create_cq_ex`.
// ---------------------------------------------------------------------------------------

#[path = "common/ex.rs"]
mod ex;
use ex::{ex_pair, ExSide};
use hotverbs_softnic::testing::{self as t, ConnectAttr};

fn ex_ring(s: &ExSide, cfg: SendConfig) -> WrRing {
    // SAFETY: the side's extended QP (created with RC_OPS, 64 B inline, depth >= cfg's)
    // lives until the process ends; only this ring posts to it.
    unsafe { WrRing::new(s.qpx, cfg) }.unwrap()
}

fn ex_poller(s: &ExSide, fields: ExFields, wc: u64) -> ExCqPoller<16> {
    // SAFETY: the side's CQ was created with `wc` and lives until the process ends.
    unsafe { ExCqPoller::new(s.cq, fields, wc) }.unwrap()
}

/// Polls until the ring has nothing outstanding; returns the timestamps seen.
fn settle(p: &mut ExCqPoller<16>, r: &mut WrRing) -> Vec<u64> {
    let mut stamps = Vec::new();
    for _ in 0..1_000_000 {
        if r.outstanding() == 0 {
            return stamps;
        }
        let (cs, ts) = p.poll_ts().unwrap();
        stamps.extend_from_slice(ts);
        for c in cs.iter() {
            r.on_completion(c).unwrap();
        }
    }
    panic!("ring did not drain: {r:?}");
}

#[test]
fn softnic_writes_reads_and_atomics_through_the_wr_api() {
    let (a, b, wc) = ex_pair(64);
    let stamped = wc & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP as u64 != 0;
    let rxe = std::env::var("HOTVERBS_SOFTNIC_PROFILE").is_ok_and(|v| v == "rxe");
    assert_eq!(
        stamped, !rxe,
        "completion timestamps exactly outside the Rxe profile"
    );
    let mut r = ex_ring(
        &a,
        SendConfig::new(1, 64, 64)
            .signal_every(8)
            .remote(b.remote()),
    );
    let fields = if stamped {
        ExFields::QP_NUM | ExFields::COMPLETION_TS
    } else {
        ExFields::QP_NUM
    };
    let mut p = ex_poller(&a, fields, wc);
    // 32 inline WRITEs in one region.
    let msgs: Vec<[u8; 8]> = (0..32u64).map(|i| (i * 0x0101).to_le_bytes()).collect();
    let mut batch = r.batch();
    for (i, m) in msgs.iter().enumerate() {
        batch
            .push(Msg::write(Local::Inline(m), i as u64 * 8))
            .unwrap();
    }
    batch.finish().unwrap();
    let stamps = settle(&mut p, &mut r);
    for (i, m) in msgs.iter().enumerate() {
        assert_eq!(b.bytes(i * 8, 8), m, "write {i}");
    }
    if stamped {
        assert_eq!(stamps.len(), 4, "signaled every 8th");
        assert!(
            stamps.windows(2).all(|w| w[0] <= w[1]) && stamps[0] > 0,
            "{stamps:?}"
        );
    }
    // A zero-copy WRITE, a READ back and a FETCH_AND_ADD.
    // SAFETY: A's buffer, written before the post; the device is done with it when the
    // ring retires the WRs (settle), and nothing touches it meanwhile.
    unsafe {
        core::ptr::copy_nonoverlapping(b"zerocopy-payload".as_ptr(), a.buf, 16);
        r.stage(Msg::write(Local::Buf(a.local(0, 16)), 512))
            .unwrap();
        r.stage(Msg::read(a.local(1024, 16), 512)).unwrap();
        r.signal_next();
        r.stage(Msg::fetch_add(a.local(2048, 8), 0, 5)).unwrap();
    }
    r.flush().unwrap();
    {}
    settle(&mut p, &mut r);
    assert_eq!(b.bytes(512, 16), b"zerocopy-payload");
    assert_eq!(a.bytes(1024, 16), b"zerocopy-payload");
    assert_eq!(a.bytes(2048, 8), msgs[0], "the old value");
    assert_eq!(
        u64::from_le_bytes(b.bytes(0, 8).try_into().unwrap()),
        u64::from_le_bytes(msgs[0]).wrapping_add(5)
    );
}

#[test]
fn softnic_remote_error_flushes_exactly_the_outstanding_wrs_and_reset_recovers() {
    let (a, b, wc) = ex_pair(32);
    let bad = RemoteBuf::new(b.remote().addr, 4096, b.remote().rkey ^ 0x5555);
    let mut r = ex_ring(&a, SendConfig::new(2, 32, 64).signal_every(4).remote(bad));
    let mut p = ex_poller(&a, ExFields::QP_NUM, wc);
    let d = [7u8; 8];
    let mut batch = r.batch();
    for i in 0..6u64 {
        batch.push(Msg::write(Local::Inline(&d), i * 8)).unwrap();
    }
    batch.finish().unwrap();
    assert_eq!(r.outstanding(), 6);
    let mut errors = 0;
    for _ in 0..1_000_000 {
        if r.outstanding() == 0 {
            break;
        }
        for c in p.poll().unwrap().iter() {
            if r.on_completion(c).is_err() {
                errors += 1;
            }
        }
    }
    assert_eq!(r.outstanding(), 0, "every WR retired: {r:?}");
    assert!(errors >= 1, "an error completion");
    assert_eq!(r.error(), Some(WcError::RemAccess), "{r:?}");
    assert!(matches!(
        r.send_now(Msg::write(Local::Inline(&d), 0)),
        Err(SendError::QpError(WcError::RemAccess))
    ));
    // Recovery: RESET -> RTS, ring reset, then the good rkey.
    let gid = {
        // SAFETY: the QP's live context.
        unsafe { t::query_gid((*a.qp).context, 1) }
    };
    // SAFETY: live QPs of the pair; A's WRs all completed (drained above).
    unsafe {
        t::qp_to_reset(a.qp);
        t::qp_to_reset(b.qp);
        t::connect_qp(a.qp, &ConnectAttr::new(b.qpn(), gid));
        t::connect_qp(b.qp, &ConnectAttr::new(a.qpn(), gid));
        assert_eq!(r.reset(), 0);
    }
    drop(r);
    let mut r = ex_ring(
        &a,
        SendConfig::new(3, 32, 64)
            .signal_every(4)
            .remote(b.remote()),
    );
    r.signal_next();
    r.send_now(Msg::write(Local::Inline(b"recover!"), 64))
        .unwrap();
    settle_plain(&mut p, &mut r);
    assert_eq!(b.bytes(64, 8), b"recover!");
}

fn settle_plain(p: &mut ExCqPoller<16>, r: &mut WrRing) {
    for _ in 0..1_000_000 {
        if r.outstanding() == 0 {
            return;
        }
        for c in p.poll().unwrap().iter() {
            r.on_completion(c).unwrap();
        }
    }
    panic!("ring did not drain: {r:?}");
}

#[test]
fn failed_wr_complete_outside_rts_has_an_unknown_outcome_until_reset() {
    let dev = CountingDevice::new(64);
    let mut r = ring(&dev, SendConfig::new(1, 16, 8).signal_every(4).batch(16));
    // SAFETY: the device's extended QP; the test plays libibverbs' modify_qp to RTR.
    unsafe { (*dev.qp_ex()).qp_base.state = IBV_QPS_RTR };
    dev.fail_next_post(EINVAL, 0);
    let d = [0u8; 8];
    let mut b = r.batch();
    b.push(Msg::send(Local::Inline(&d))).unwrap();
    b.push(Msg::send(Local::Inline(&d))).unwrap();
    let pe = match b.finish() {
        Err(SendError::Post(pe)) => pe,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (pe.verb, pe.errno, pe.first_rejected, pe.first_rejected_seq),
        ("ibv_wr_complete", EINVAL, PostError::UNKNOWN, 0)
    );
    // Counted as posted (the provider may run them), refused until reset.
    assert_eq!((r.outstanding(), r.staged()), (2, 0));
    assert_eq!(
        r.send_now(Msg::send(Local::Inline(&d))),
        Err(SendError::Post(pe))
    );
    // SAFETY: the test's QP "goes through RESET" (nothing of it is in use).
    unsafe { (*dev.qp_ex()).qp_base.state = IBV_QPS_RTS };
    dev.reset_qp();
    // SAFETY: as above.
    assert_eq!(unsafe { r.reset() }, 2);
    r.signal_next();
    assert_eq!(r.send_now(Msg::send(Local::Inline(&d))), Ok(2));
    let mut p = poller(&dev, ExFields::QP_NUM);
    assert_eq!(drain(&mut p, &mut r), (1, 1));
    assert_eq!(r.outstanding(), 0);
}

#[test]
fn recv_ring_takes_completions_from_the_extended_poller() {
    let dev = CountingDevice::new(256);
    dev.set_loopback(true);
    let region = vec![0u8; 16 * 64];
    // SAFETY: the device and the region outlive the rings and the poller.
    let mut recv: RecvRing<16> = unsafe {
        RecvRing::new(
            RecvTarget::Qp(dev.qp()),
            LocalBuf::new(region.as_ptr() as u64, region.len() as u32, 1),
            RecvConfig::new(2, 64, 16),
        )
    }
    .unwrap();
    recv.fill().unwrap();
    let mut r = ring(&dev, SendConfig::new(1, 16, 64).signal_every(4).batch(1));
    let mut p = poller(
        &dev,
        ExFields::QP_NUM | ExFields::BYTE_LEN | ExFields::IMM | ExFields::OPCODE,
    );
    r.send_now(Msg::send_imm(Local::Inline(b"hello"), 42))
        .unwrap();
    r.send_now(Msg::send(Local::Inline(b"hi"))).unwrap();
    let mut got = Vec::new();
    for c in p.poll().unwrap().iter_mut() {
        match c.ring() {
            2 => {
                let m = recv.on_completion(c).unwrap();
                got.push((m.byte_len(), m.imm()));
                recv.release(m).unwrap();
            }
            _ => {
                r.on_completion(c).unwrap();
            }
        }
    }
    assert_eq!(got, [(5, Some(42)), (2, None)]);
}

#[test]
fn one_per_poll_never_calls_next_poll_and_returns_the_same_completions() {
    let run = |one: bool| {
        let dev = CountingDevice::new(64);
        let mut r = ring(&dev, SendConfig::new(1, 32, 8).signal_every(1).batch(32));
        let mut p = poller(&dev, ExFields::QP_NUM).one_per_poll(one);
        assert_eq!(p.is_one_per_poll(), one);
        let d = [0u8; 8];
        let mut b = r.batch();
        for _ in 0..20 {
            b.push(Msg::send(Local::Inline(&d))).unwrap();
        }
        b.finish().unwrap();
        let polls0 = dev.polls();
        let mut got = Vec::new();
        let mut lens = Vec::new();
        for _ in 0..4 {
            let wcs = p.poll().unwrap();
            lens.push(wcs.len());
            got.extend(
                wcs.iter()
                    .map(|c| (c.wr_id(), c.status().is_ok(), c.qp_num())),
            );
        }
        (got, lens, dev.polls() - polls0, dev.next_polls())
    };
    let (batch, lens_b, starts_b, next_b) = run(false);
    let (one, lens_o, starts_o, next_o) = run(true);
    assert_eq!(batch.len(), 20);
    assert_eq!(batch, one, "same completions, same order");
    assert_eq!(lens_b, [8, 8, 4, 0]);
    assert_eq!(
        lens_o,
        [8, 8, 4, 0],
        "a one-per-poll poll still fills the burst"
    );
    assert!(next_b > 0);
    assert_eq!(next_o, 0, "one-per-poll never calls ibv_next_poll");
    assert_eq!(starts_b, 4);
    // 20 successful start polls plus one ENOENT per poll that stopped short (the third
    // and fourth).
    assert_eq!(starts_o, 22);
}

/// The QP and CQ functions a `WrRing` and an `ExCqPoller` read once at creation move with
/// them: swapped rings (and pollers) of two devices post to (and poll) their own QP (CQ); a
/// batch dropped by a panic in the middle posts what it built, a forgotten one is aborted,
/// and afterwards every WR of both rings retires through the poller of its own CQ.
#[test]
fn cached_functions_move_with_rings_and_pollers_through_swap_forget_and_a_panic() {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let (dev1, dev2) = (CountingDevice::new(64), CountingDevice::new(64));
    let cfg = || SendConfig::new(1, 16, 64).signal_every(1);
    let (mut r1, mut r2) = (ring(&dev1, cfg()), ring(&dev2, cfg()));
    let (mut p1, mut p2) = (
        poller(&dev1, ExFields::QP_NUM),
        poller(&dev2, ExFields::QP_NUM),
    );
    std::mem::swap(&mut r1, &mut r2);
    std::mem::swap(&mut p1, &mut p2);
    let d = [3u8; 8];
    // r1 is dev2's ring now, r2 dev1's.
    r1.send_now(Msg::send(Local::Inline(&d))).unwrap();
    assert_eq!((dev1.send_wrs(), dev2.send_wrs()), (0, 1));
    // A panic with a batch open on r2 (dev1): the batch's drop completes its region.
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut b = r2.batch();
        b.push(Msg::send(Local::Inline(&d))).unwrap();
        b.push(Msg::send(Local::Inline(&d))).unwrap();
        std::panic::resume_unwind(Box::new(0u8));
    }));
    assert!(r.is_err());
    assert!(!dev1.wr_region_open());
    assert_eq!((dev1.send_wrs(), dev2.send_wrs()), (2, 1));
    // A forgotten batch on r1 (dev2): its region is aborted at the next call.
    let mut b = r1.batch();
    b.push(Msg::send(Local::Inline(&d))).unwrap();
    std::mem::forget(b);
    assert!(dev2.wr_region_open());
    assert_eq!(r1.flush(), Ok(()));
    assert_eq!((dev2.wr_aborts(), dev1.wr_aborts()), (1, 0));
    // p1 is dev2's poller (r1's CQ), p2 dev1's (r2's).
    assert_eq!(drain(&mut p1, &mut r1), (1, 1));
    assert_eq!(drain(&mut p2, &mut r2), (2, 2));
    assert_eq!((r1.outstanding(), r2.outstanding()), (0, 0));
}
