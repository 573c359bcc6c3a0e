//! `mlx5::rq::DirectRq`, the receive WQEs the direct path writes into a ConnectX receive
//! queue (issue 30), on plain memory: the segments, the terminator, the counter and its
//! barrier, refusals and wraps. (`cargo xtask golden` compares it with `mlx5_post_recv`
//! byte for byte; this file runs under miri.)

mod common;

use hotverbs_datapath::mlx5::rq::{DirectRq, DirectRqDesc, RqError, RCV_DBR};
use hotverbs_datapath::mlx5::{MmioEvent, RecordingDoorbell};
use hotverbs_datapath::LocalBuf;

struct Q {
    buf: Vec<u128>,
    dbrec: [u32; 2],
    wrid: Vec<u64>,
}

fn q(wqe_cnt: usize, stride: usize) -> Q {
    Q {
        buf: vec![u128::from_ne_bytes([0xee; 16]); wqe_cnt * stride / 16],
        dbrec: [0; 2],
        wrid: vec![0; wqe_cnt],
    }
}

fn rq(q: &mut Q, stride: u32) -> DirectRq<RecordingDoorbell> {
    let desc = DirectRqDesc {
        buf: q.buf.as_mut_ptr().cast(),
        wqe_cnt: q.wrid.len() as u32,
        stride,
        dbrec: q.dbrec.as_mut_ptr(),
        wrid: q.wrid.as_mut_ptr(),
    };
    // SAFETY: the test's buffers outlive the queue and nothing else touches them.
    unsafe { DirectRq::new(desc, 0, RecordingDoorbell::new(core::ptr::null_mut())) }.unwrap()
}

fn bytes(q: &Q) -> Vec<u8> {
    q.buf.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

#[test]
fn a_wqe_is_data_segments_then_a_terminator_and_one_counter_store_per_publish() {
    let mut mem = q(4, 64);
    let mut r = rq(&mut mem, 64);
    let segs = [
        LocalBuf {
            addr: 0x1122_3344_5566_7788,
            len: 100,
            lkey: 7,
        },
        LocalBuf {
            addr: 0x99,
            len: 0,
            lkey: 8,
        }, // skipped
        LocalBuf {
            addr: 0xaabb,
            len: 4,
            lkey: 9,
        },
    ];
    r.post(42, &segs).unwrap();
    r.post(43, &[]).unwrap();
    r.publish();
    r.publish(); // nothing new: no store
    assert_eq!(
        r.doorbell().events,
        [MmioEvent::ToDeviceBarrier, MmioEvent::Dbr(2)]
    );
    assert_eq!(u32::from_be(mem.dbrec[RCV_DBR]), 2);
    let b = bytes(&mem);
    assert_eq!(&b[0..4], &100u32.to_be_bytes());
    assert_eq!(&b[4..8], &7u32.to_be_bytes());
    assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_be_bytes());
    assert_eq!(&b[16..20], &4u32.to_be_bytes());
    assert_eq!(&b[20..24], &9u32.to_be_bytes());
    // The terminator, then the poison the segments after it keep.
    assert_eq!(
        &b[32..48],
        &[0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(&b[48..64], &[0xee; 16]);
    // The second WQE: a terminator alone.
    assert_eq!(
        &b[64..80],
        &[0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(&mem.wrid[..2], &[42, 43]);
}

#[test]
fn refusals_change_nothing_and_completions_free_slots_in_order() {
    let mut mem = q(2, 32);
    let mut r = rq(&mut mem, 32);
    let three = [LocalBuf {
        addr: 1,
        len: 1,
        lkey: 1,
    }; 3];
    assert_eq!(
        r.post(1, &three),
        Err(RqError::TooManySegs { got: 3, max: 2 })
    );
    r.post(1, &three[..2]).unwrap(); // a full WQE: no terminator
    r.post(2, &three[..1]).unwrap();
    assert_eq!(r.post(3, &[]), Err(RqError::Full));
    assert_eq!((r.outstanding(), r.head()), (2, 2));
    assert_eq!(r.complete(), Some(1));
    r.post(3, &[]).unwrap(); // wraps into slot 0
    r.publish();
    assert_eq!(u32::from_be(mem.dbrec[RCV_DBR]), 3);
    assert_eq!(mem.wrid, [3, 2]);
    assert_eq!(
        (r.complete(), r.complete(), r.complete()),
        (Some(2), Some(3), None)
    );
}

#[test]
fn a_description_that_is_no_queue_is_refused() {
    let mut mem = q(4, 64);
    for (wqe_cnt, stride) in [(3, 64), (4, 48), (4, 8)] {
        let desc = DirectRqDesc {
            buf: mem.buf.as_mut_ptr().cast(),
            wqe_cnt,
            stride,
            dbrec: mem.dbrec.as_mut_ptr(),
            wrid: mem.wrid.as_mut_ptr(),
        };
        // SAFETY: refused before anything is touched.
        let r = unsafe { DirectRq::new(desc, 0, RecordingDoorbell::new(core::ptr::null_mut())) };
        assert_eq!(r.err(), Some(RqError::Geometry), "{wqe_cnt} x {stride}");
    }
}

use hotverbs_datapath::mlx5::rq::{InlineScatter, RecvCqe};

use hotverbs_ffi::*;

/// A 64-byte responder CQE: opcode, format bits, owner 0.
fn cqe(op: u8, format: u8) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[17] = 0x85; // ml_path: path bits 0x05
    c[22..24].copy_from_slice(&0x1234u16.to_be_bytes()); // slid
    c[24..28].copy_from_slice(&(0x2700_0000u32 | 0xabcdef).to_be_bytes()); // GRH, sl 7, src_qp
    c[36..40].copy_from_slice(&0xdead_0042u32.to_be_bytes()); // imm / rkey / pkey
    c[44..48].copy_from_slice(&24u32.to_be_bytes()); // byte_cnt
    c[56..60].copy_from_slice(&0x5500_0abcu32.to_be_bytes()); // qpn 0xabc
    c[60..62].copy_from_slice(&7u16.to_be_bytes()); // wqe_counter
    c[63] = op << 4 | format;
    c
}

#[test]
fn responder_cqes_decode_as_libmlx5_reads_them() {
    let c = RecvCqe::decode(&cqe(3, 0x4)).unwrap(); // SEND with immediate, scattered (32)
    assert_eq!((c.qpn, c.wqe_counter, c.status), (0xabc, 7, IBV_WC_SUCCESS));
    assert_eq!((c.opcode, c.byte_len), (IBV_WC_RECV, 24));
    assert_eq!(c.wc_flags, IBV_WC_WITH_IMM | IBV_WC_GRH);
    assert_eq!(u32::from_be(c.imm_raw), 0xdead_0042);
    assert_eq!(
        (c.src_qp, c.slid, c.sl, c.dlid_path_bits),
        (0xabcdef, 0x1234, 7, 5)
    );
    assert_eq!((c.pkey_index, c.inline), (0x0042, InlineScatter::In32));
    let w = RecvCqe::decode(&cqe(1, 0)).unwrap(); // RDMA WRITE with immediate
    assert_eq!(
        (w.opcode, w.inline),
        (IBV_WC_RECV_RDMA_WITH_IMM, InlineScatter::No)
    );
    let i = RecvCqe::decode(&cqe(4, 0x8)).unwrap(); // SEND with invalidate, scattered (64)
    assert_eq!(i.wc_flags, IBV_WC_WITH_INV | IBV_WC_GRH);
    assert_eq!(i.inline, InlineScatter::In64);
    let mut e = cqe(14, 0); // responder error: remote access (0x13)
    e[54] = 0x99;
    e[55] = 0x13;
    let e = RecvCqe::decode(&e).unwrap();
    assert_eq!((e.status, e.vendor_err), (IBV_WC_REM_ACCESS_ERR, 0x99));
    for not_a_receive in [0u8, 5, 13, 15] {
        assert_eq!(
            RecvCqe::decode(&cqe(not_a_receive, 0)),
            None,
            "opcode {not_a_receive}"
        );
    }
    assert_eq!(RecvCqe::decode(&cqe(2, 0xc)), None, "a compressed CQE");
}

#[test]
fn a_payload_in_the_cqe_is_scattered_over_the_wqes_segments() {
    let mut mem = q(4, 64);
    let mut r = rq(&mut mem, 64);
    let mut a = [0u8; 5];
    let mut b = [0u8; 40];
    let segs = [
        LocalBuf {
            addr: a.as_mut_ptr() as u64,
            len: 5,
            lkey: 1,
        },
        LocalBuf {
            addr: b.as_mut_ptr() as u64,
            len: 40,
            lkey: 2,
        },
    ];
    r.post(9, &segs).unwrap();
    r.publish();
    let data: Vec<u8> = (1..=24).collect();
    // SAFETY: the segments name `a` and `b`, not otherwise accessed until read below.
    unsafe { r.scatter(0, &data) }.unwrap();
    assert_eq!(r.complete_at(0), Some(9));
    assert_eq!(a, [1, 2, 3, 4, 5]);
    assert_eq!(&b[..19], &data[5..]);
    assert_eq!(b[19], 0);
    // More than the WQE holds: LOC_LEN_ERR (the device never sends that; libmlx5 says so).
    // A fresh pointer: `a` was read since (the receive's memory is the device's again).
    let again = [LocalBuf {
        addr: a.as_mut_ptr() as u64,
        len: 5,
        lkey: 1,
    }];
    r.post(10, &again).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { r.scatter(1, &data) }, Err(IBV_WC_LOC_LEN_ERR));
}

/// The direct poller serving a receive queue: a responder CQE becomes the receive's
/// completion, and a payload in the CQE lands in the receive's buffer; a CQE of a QP whose
/// receive queue is not attached is refused and left in place.
#[test]
fn the_poller_completes_receives_of_an_attached_queue() {
    use hotverbs_datapath::mlx5::DirectError;
    use hotverbs_datapath::Completion;
    let mut mem = q(4, 64);
    let desc = DirectRqDesc {
        buf: mem.buf.as_mut_ptr().cast(),
        wqe_cnt: 4,
        stride: 64,
        dbrec: mem.dbrec.as_mut_ptr(),
        wrid: mem.wrid.as_mut_ptr(),
    };
    // SAFETY: the test's buffers outlive the queue and the poller.
    let mut r =
        unsafe { DirectRq::new(desc, 0, RecordingDoorbell::new(core::ptr::null_mut())) }.unwrap();
    let mut payload = [0u8; 16];
    r.post(
        77,
        &[LocalBuf {
            addr: payload.as_mut_ptr() as u64,
            len: 16,
            lkey: 3,
        }],
    )
    .unwrap();
    r.publish();
    let mut cq = vec![0u128; 4 * 64 / 16];
    let mut cq_db = [0u32; 2];
    // SAFETY: as above.
    let mut poller = unsafe {
        let mut p = common::mlx5::cq_poller::<4>(cq.as_mut_ptr().cast(), cq_db.as_mut_ptr(), 4);
        p.attach_rq(0xabc, &desc).unwrap();
        p
    };
    // Every CQE invalid (owned by the device), then one SEND with immediate, payload in the
    // CQE: "hello", at CQ index 0, owner bit 0.
    for e in cq.chunks_mut(4) {
        let b: &mut [u8] = bytemuck_free(e);
        b[63] = 0xf0;
    }
    let mut c = cqe(3, 0x4);
    c[60..62].copy_from_slice(&0u16.to_be_bytes());
    c[44..48].copy_from_slice(&5u32.to_be_bytes());
    c[..5].copy_from_slice(b"hello");
    bytemuck_free(&mut cq[..4]).copy_from_slice(&c);
    let mut out = [Completion::PLACEHOLDER; 4];
    assert_eq!(poller.poll_into(&mut out).unwrap(), 1);
    let wc = out[0].as_raw();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (77, IBV_WC_SUCCESS, IBV_WC_RECV, 5)
    );
    assert_eq!(wc.wc_flags, IBV_WC_WITH_IMM | IBV_WC_GRH);
    assert_eq!(r.complete(), Some(77));
    assert_eq!(&payload[..5], b"hello");
    // A receive CQE for QP 0xdef, whose queue nobody attached: refused, left in place.
    let mut other = cqe(2, 0);
    other[56..60].copy_from_slice(&0x0000_0defu32.to_be_bytes());
    bytemuck_free(&mut cq[4..8]).copy_from_slice(&other);
    assert_eq!(
        poller.poll_into(&mut out),
        Err(DirectError::UnknownQp(0xdef))
    );
    assert_eq!(poller.cons_index(), 1);
}

/// The bytes of some `u128`s (the test's 16-aligned CQ memory).
fn bytemuck_free(w: &mut [u128]) -> &mut [u8] {
    // SAFETY: u128 has no padding and any bytes are valid u8s; the length is in bytes.
    unsafe { core::slice::from_raw_parts_mut(w.as_mut_ptr().cast(), w.len() * 16) }
}

/// A queue's state travels with its value: after `mem::swap` each `DirectRq` posts into
/// the queue it was made for, and a forgotten one leaves its queue as it was (it owns no
/// memory and has no drop). `ManuallyDrop` stands in for `mem::forget` so the recording
/// doorbell's event list is freed at the end (miri reports a forgotten `Vec` as a leak);
/// nothing runs for `a` between the forget and the assertions.
#[test]
fn swapped_and_forgotten_queues_stay_with_their_memory() {
    let (mut ma, mut mb) = (q(4, 32), q(4, 32));
    let mut a = rq(&mut ma, 32);
    let mut b = rq(&mut mb, 32);
    a.post(1, &[]).unwrap();
    core::mem::swap(&mut a, &mut b);
    // `b` is now queue A's (one outstanding), `a` queue B's (empty).
    assert_eq!((a.outstanding(), b.outstanding()), (0, 1));
    a.post(2, &[]).unwrap();
    b.post(3, &[]).unwrap();
    a.publish();
    b.publish();
    let a = core::mem::ManuallyDrop::new(a);
    assert_eq!(b.complete(), Some(1));
    assert_eq!(b.complete(), Some(3));
    assert_eq!((ma.wrid[..2].to_vec(), mb.wrid[0]), (vec![1, 3], 2));
    assert_eq!(
        (
            u32::from_be(ma.dbrec[RCV_DBR]),
            u32::from_be(mb.dbrec[RCV_DBR])
        ),
        (2, 1)
    );
    drop(core::mem::ManuallyDrop::into_inner(a));
}

/// A [`hotverbs_datapath::RecvRing`] on a ConnectX receive queue (`RecvTarget::Mlx5`,
/// issue 30) with a direct poller, on plain memory: `fill` writes one WQE per slot and one
/// counter store; responder CQEs (one scattered into the CQE, one in the slot, one
/// flushed) become `Received`s and an error through the ring's `on_completion`; released
/// slots are reposted as WQEs with new counters; `mem::swap` of two rings keeps each with
/// its queue, and a forgotten ring leaves the queue as it was. (The `wr_id`s the poller
/// reports are the ones the ring wrote into the queue's `wrid` table.)
#[test]
fn a_recv_ring_on_a_direct_queue_posts_and_takes_its_completions() {
    use hotverbs_datapath::{Completion, RecvConfig, RecvError, RecvRing, RecvTarget};
    let mut mem = q(4, 32);
    let desc = DirectRqDesc {
        buf: mem.buf.as_mut_ptr().cast(),
        wqe_cnt: 4,
        stride: 32,
        dbrec: mem.dbrec.as_mut_ptr(),
        wrid: mem.wrid.as_mut_ptr(),
    };
    // SAFETY: plain C struct; all-zero is valid. Only `qp_num` is read.
    let mut qp: ibv_qp = unsafe { core::mem::zeroed() };
    qp.qp_num = 0xabc;
    let mut slots = vec![0u64; 4 * 8]; // 4 slots of 64 bytes, 8-aligned
    let region = LocalBuf {
        addr: slots.as_mut_ptr() as u64,
        len: 256,
        lkey: 5,
    };
    let target = RecvTarget::Mlx5 {
        qp: &mut qp,
        desc,
        head: 0,
    };
    // SAFETY: the queue, the QP struct and the slots outlive the ring, and only it posts;
    // completions come from the poller below only.
    let mut ring: RecvRing<4> =
        unsafe { RecvRing::new(target, region, RecvConfig::new(9, 64, 4).repost_batch(2)) }
            .unwrap();
    // The queue is read through the pointers the ring writes through (a read through
    // `mem` would be a foreign access under Tree Borrows).
    // SAFETY: the queue's doorbell record, wrid table and bytes, alive and not being
    // written while read (one thread).
    let dbr = |d: &DirectRqDesc| u32::from_be(unsafe { d.dbrec.add(RCV_DBR).read() });
    // SAFETY: as above.
    let wrid = |d: &DirectRqDesc, i: usize| unsafe { d.wrid.add(i).read() };
    // SAFETY: as above.
    let wqe = |d: &DirectRqDesc, off: usize, n: usize| unsafe {
        core::slice::from_raw_parts(d.buf.add(off), n).to_vec()
    };
    assert_eq!(ring.fill().unwrap(), 4);
    assert_eq!(dbr(&desc), 4, "one counter store for the four");
    assert_eq!(ring.posted(), 4);
    for i in 0..4 {
        assert_eq!(wrid(&desc, i), ring.slot_wr_id(i as u32));
    }
    assert_eq!(wqe(&desc, 0, 4), 64u32.to_be_bytes(), "slot 0's segment");
    assert_eq!(wqe(&desc, 8, 8), region.addr.to_be_bytes());
    assert_eq!(
        wqe(&desc, 20, 4),
        0x100u32.to_be_bytes(),
        "then the terminator"
    );
    // More slots than the queue's WQEs: refused.
    let mut small = q(2, 32);
    let small_desc = DirectRqDesc {
        buf: small.buf.as_mut_ptr().cast(),
        wqe_cnt: 2,
        stride: 32,
        dbrec: small.dbrec.as_mut_ptr(),
        wrid: small.wrid.as_mut_ptr(),
    };
    let too_many = RecvTarget::Mlx5 {
        qp: &mut qp,
        desc: small_desc,
        head: 0,
    };
    // SAFETY: as above (refused before anything is posted).
    let refused = unsafe { RecvRing::<4>::new(too_many, region, RecvConfig::new(9, 64, 4)) };
    assert!(refused.is_err());

    let mut cq = vec![0u128; 8 * 64 / 16];
    let mut cq_db = [0u32; 2];
    for e in cq.chunks_mut(4) {
        bytemuck_free(e)[63] = 0xf0;
    }
    // SAFETY: the test's buffers outlive the poller; it is the CQ's only consumer.
    let mut poller = unsafe {
        let mut p = common::mlx5::cq_poller::<8>(cq.as_mut_ptr().cast(), cq_db.as_mut_ptr(), 8);
        p.attach_rq(0xabc, &desc).unwrap();
        p
    };
    // WQE 0: "tiny" in the CQE (scatter 32); WQE 1: 40 bytes the device put in the slot;
    // WQE 2: flushed.
    let mut c0 = cqe(2, 0x4);
    c0[60..62].copy_from_slice(&0u16.to_be_bytes());
    c0[44..48].copy_from_slice(&4u32.to_be_bytes());
    c0[..4].copy_from_slice(b"tiny");
    let mut c1 = cqe(2, 0);
    c1[60..62].copy_from_slice(&1u16.to_be_bytes());
    c1[44..48].copy_from_slice(&40u32.to_be_bytes());
    let mut c2 = [0u8; 64];
    c2[55] = 0x05; // WR_FLUSH_ERR
    c2[56..60].copy_from_slice(&0xabcu32.to_be_bytes());
    c2[60..62].copy_from_slice(&2u16.to_be_bytes());
    c2[63] = 0xe0; // RESP_ERR
                   // The device's write of slot 1.
                   // SAFETY: slot 1 is posted: the "device" (this test) writes it before its CQE.
    unsafe { core::ptr::write_bytes((region.addr as *mut u8).add(64), 0x5a, 40) };
    for (k, c) in [c0, c1, c2].iter().enumerate() {
        bytemuck_free(&mut cq[k * 4..k * 4 + 4]).copy_from_slice(c);
    }
    let mut out = [Completion::PLACEHOLDER; 8];
    assert_eq!(poller.poll_into(&mut out).unwrap(), 3);
    let m0 = ring.on_completion(&mut out[0]).unwrap();
    assert_eq!(ring.data(&m0).unwrap(), b"tiny");
    let m1 = ring.on_completion(&mut out[1]).unwrap();
    assert_eq!(ring.data(&m1).unwrap(), &[0x5a; 40]);
    match ring.on_completion(&mut out[2]) {
        Err(RecvError::Completion { slot: 2, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!((ring.posted(), ring.held()), (1, 2));
    ring.release(m0).unwrap();
    assert_eq!(dbr(&desc), 4, "one released: not reposted yet");
    ring.release(m1).unwrap();
    assert_eq!(dbr(&desc), 6, "two released: reposted as WQEs 4 and 5");
    assert_eq!(wrid(&desc, 0), ring.slot_wr_id(0));
    assert_eq!(wrid(&desc, 1), ring.slot_wr_id(1));
    assert_eq!(ring.posted(), 3);

    // A second ring on another queue, swapped with the first: each posts into its own.
    let mut mem2 = q(4, 32);
    let desc2 = DirectRqDesc {
        buf: mem2.buf.as_mut_ptr().cast(),
        wqe_cnt: 4,
        stride: 32,
        dbrec: mem2.dbrec.as_mut_ptr(),
        wrid: mem2.wrid.as_mut_ptr(),
    };
    // SAFETY: as for `qp`.
    let mut qp2: ibv_qp = unsafe { core::mem::zeroed() };
    qp2.qp_num = 0xdef;
    let mut slots2 = vec![0u64; 4 * 8];
    let region2 = LocalBuf {
        addr: slots2.as_mut_ptr() as u64,
        len: 256,
        lkey: 6,
    };
    // SAFETY: as for the first ring.
    let mut other: RecvRing<4> = unsafe {
        RecvRing::new(
            RecvTarget::Mlx5 {
                qp: &mut qp2,
                desc: desc2,
                head: 0,
            },
            region2,
            RecvConfig::new(10, 64, 4),
        )
    }
    .unwrap();
    core::mem::swap(&mut ring, &mut other);
    assert_eq!(ring.fill().unwrap(), 4, "the second ring's queue, empty");
    assert_eq!(dbr(&desc2), 4);
    assert_eq!(other.fill().unwrap(), 1, "the first ring: slot 2 was idle");
    assert_eq!(dbr(&desc), 7);
    // (`RecvRing` has no `Drop`, receives stay posted: dropping or forgetting it posts and
    // changes nothing.)
    assert_eq!(dbr(&desc), 7, "forgetting posts nothing");
    drop(slots);
    drop(slots2);
    drop((mem, mem2, small));
}

/// A slot released alone, in the order it was posted (repost batch 1), is reposted by the
/// receive counter only: its WQE's bytes and `wrid` entry are already its own. A panic
/// between taking a receive and releasing it (caught) leaves the slot held and the ring
/// consistent; the release after it reposts the slot.
#[test]
fn a_slot_released_in_order_is_reposted_by_the_counter_alone() {
    use hotverbs_datapath::{Completion, RecvConfig, RecvRing, RecvTarget};
    let mut mem = q(2, 16);
    let desc = DirectRqDesc {
        buf: mem.buf.as_mut_ptr().cast(),
        wqe_cnt: 2,
        stride: 16,
        dbrec: mem.dbrec.as_mut_ptr(),
        wrid: mem.wrid.as_mut_ptr(),
    };
    // SAFETY: plain C struct; all-zero is valid. Only `qp_num` is read.
    let mut qp: ibv_qp = unsafe { core::mem::zeroed() };
    qp.qp_num = 0xabc;
    let mut slots = vec![0u64; 2 * 8];
    let region = LocalBuf {
        addr: slots.as_mut_ptr() as u64,
        len: 128,
        lkey: 5,
    };
    let target = RecvTarget::Mlx5 {
        qp: &mut qp,
        desc,
        head: 0,
    };
    // SAFETY: the queue, the QP struct and the slots outlive the ring; completions come
    // from the poller below only.
    let mut ring: RecvRing<2> =
        unsafe { RecvRing::new(target, region, RecvConfig::new(9, 64, 2).repost_batch(1)) }
            .unwrap();
    ring.fill().unwrap();
    // SAFETY: the queue's bytes and counter, read through the pointers it writes through.
    let wqes = |d: &DirectRqDesc| unsafe { core::slice::from_raw_parts(d.buf, 32).to_vec() };
    // SAFETY: as above.
    let dbr = |d: &DirectRqDesc| u32::from_be(unsafe { d.dbrec.add(RCV_DBR).read() });
    let before = wqes(&desc);
    assert_eq!(dbr(&desc), 2);
    let mut cq = vec![0u128; 4 * 4];
    let mut cq_db = [0u32; 2];
    for e in cq.chunks_mut(4) {
        bytemuck_free(e)[63] = 0xf0;
    }
    // SAFETY: the test's memory outlives the poller, the CQ's only consumer.
    let mut poller = unsafe {
        let mut p = common::mlx5::cq_poller::<4>(cq.as_mut_ptr().cast(), cq_db.as_mut_ptr(), 4);
        p.attach_rq(0xabc, &desc).unwrap();
        p
    };
    let mut c = cqe(2, 0);
    c[60..62].copy_from_slice(&0u16.to_be_bytes());
    c[44..48].copy_from_slice(&8u32.to_be_bytes());
    bytemuck_free(&mut cq[..4]).copy_from_slice(&c);
    let mut out = [Completion::PLACEHOLDER; 4];
    assert_eq!(poller.poll_into(&mut out).unwrap(), 1);
    let m = ring.on_completion(&mut out[0]).unwrap();
    // A panic while the slot is held: nothing is reposted, the slot stays held.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = ring.data(&m).unwrap();
        panic!("the application fails while holding the receive");
    }));
    assert!(r.is_err());
    assert_eq!((ring.held(), ring.posted(), dbr(&desc)), (1, 1, 2));
    // A mark in WQE 0 (the high byte of its segment's byte count, 0 for 64 bytes): a
    // repost that rewrote the WQE would erase it. (No device reads it here.)
    // SAFETY: byte 0 of the queue: WQE 0, completed, not the device's until reposted.
    unsafe { desc.buf.write(0xaa) };
    ring.release(m).unwrap();
    assert_eq!((ring.held(), ring.posted(), dbr(&desc)), (0, 2, 3));
    let mut marked = before.clone();
    marked[0] = 0xaa;
    assert_eq!(wqes(&desc), marked, "no byte of the WQEs rewritten");
    // SAFETY: the queue's wrid table, through the pointer it writes through.
    assert_eq!(unsafe { desc.wrid.read() }, ring.slot_wr_id(0));
    drop((poller, ring, slots, mem));
}
