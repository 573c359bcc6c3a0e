//! `mlx5::srq::DirectSrq`, the receive WQEs the direct path writes into a ConnectX SRQ
//! (issue 30), on plain memory: the linked list, the free bitmap and its search, the
//! segments and the counter. (`cargo xtask golden` compares it with `mlx5_post_srq_recv`
//! byte for byte; this file runs under miri.)

mod common;

use hotverbs_datapath::mlx5::{DirectSrq, DirectSrqDesc, MmioEvent, RecordingDoorbell, SrqError};
use hotverbs_datapath::LocalBuf;

struct Mem {
    buf: Vec<u128>,
    dbrec: [u32; 2],
    wrid: Vec<u64>,
    free: Vec<u64>,
}

/// A new SRQ of `nwqes` WQEs of `stride` bytes, linked in order (head 0, tail `nwqes - 1`).
fn srq(m: &mut Mem, nwqes: u32, stride: u32) -> (DirectSrq<RecordingDoorbell>, DirectSrqDesc) {
    let desc = DirectSrqDesc {
        buf: m.buf.as_mut_ptr().cast(),
        stride,
        nwqes,
        dbrec: m.dbrec.as_mut_ptr(),
        wrid: m.wrid.as_mut_ptr(),
        free: m.free.as_mut_ptr(),
    };
    // SAFETY: the test's buffers outlive the queue and nothing else touches them.
    let mut q = unsafe {
        DirectSrq::new(
            desc,
            0,
            nwqes - 1,
            0,
            RecordingDoorbell::new(core::ptr::null_mut()),
        )
    }
    .unwrap();
    q.link_all();
    (q, desc)
}

fn mem(nwqes: usize, stride: usize) -> Mem {
    Mem {
        buf: vec![0; nwqes * stride / 16],
        dbrec: [0; 2],
        wrid: vec![0; nwqes],
        free: vec![0; nwqes.div_ceil(64)],
    }
}

fn buf(i: u64) -> LocalBuf {
    LocalBuf {
        addr: 0x1000 * i,
        len: 64,
        lkey: 7,
    }
}

/// The device never takes the last linked WQE: `nwqes - 1` posts fill a new SRQ; freed
/// WQEs come back through the bitmap, the one after the tail first, else the run nearest
/// after the head (renumbered in order); the WQE layout is a next segment, then the data
/// segments and a terminator; one counter store per publish.
#[test]
fn the_free_list_takes_back_freed_wqes_in_libmlx5s_order() {
    let mut m = mem(8, 64);
    let (mut q, desc) = srq(&mut m, 8, 64);
    assert_eq!(q.max_segs(), 3);
    let idx: Vec<u32> = (0..7).map(|i| q.post(i, &[buf(i)]).unwrap()).collect();
    assert_eq!(idx, [0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(
        q.post(99, &[]),
        Err(SrqError::Full),
        "the last WQE stays linked"
    );
    q.publish();
    q.publish();
    assert_eq!(
        q.doorbell().events,
        [MmioEvent::ToDeviceBarrier, MmioEvent::Dbr(7)]
    );
    // SAFETY: the queue's memory, read through the pointers it writes through.
    let (db, wr) = unsafe { (desc.dbrec.read(), desc.wrid.add(3).read()) };
    assert_eq!((u32::from_be(db), wr), (7, 3));
    // SAFETY: as above: WQE 3's bytes.
    let w3 = unsafe { core::slice::from_raw_parts(desc.buf.add(3 * 64), 64) };
    assert_eq!(&w3[2..4], &4u16.to_be_bytes(), "linked to 4");
    assert_eq!(&w3[16..20], &64u32.to_be_bytes(), "its segment");
    assert_eq!(&w3[36..40], &0x100u32.to_be_bytes(), "then the terminator");
    // Completions out of order: 2 and 3, then 0. Head is at 7 (= tail): the next post
    // links in the WQE after the tail (0) if free.
    q.free(3);
    q.free(2);
    q.free(0);
    assert_eq!(q.post(10, &[]).unwrap(), 7, "the old tail, now head");
    assert_eq!(q.tail(), 0, "0 linked after 7");
    // Head = tail = 0 and WQE 1 is not free: the run 2..=3 is linked in after 0.
    assert_eq!(q.post(11, &[]), Ok(0));
    assert_eq!(q.tail(), 3, "the run 2, 3 linked in");
    assert_eq!(q.post(12, &[]), Ok(2));
    // Head = tail = 3, nothing free: full.
    assert_eq!(q.post(13, &[]), Err(SrqError::Full));
    assert_eq!(
        q.post(15, &[buf(1); 4]),
        Err(SrqError::TooManySegs { got: 4, max: 3 })
    );
    assert_eq!(q.counter(), 10);
}

/// Two queues swapped keep their memory; a forgotten one changes nothing.
#[test]
fn swapped_srqs_post_into_their_own_memory() {
    let (mut ma, mut mb) = (mem(4, 32), mem(4, 32));
    let (mut a, da) = srq(&mut ma, 4, 32);
    let (mut b, db) = srq(&mut mb, 4, 32);
    a.post(1, &[]).unwrap();
    core::mem::swap(&mut a, &mut b);
    b.post(2, &[]).unwrap(); // queue A's second
    a.post(3, &[]).unwrap(); // queue B's first
    a.publish();
    b.publish();
    // SAFETY: the queues' memory through the pointers they write through.
    unsafe {
        assert_eq!(
            (da.wrid.read(), da.wrid.add(1).read(), db.wrid.read()),
            (1, 2, 3)
        );
        assert_eq!(
            (u32::from_be(da.dbrec.read()), u32::from_be(db.dbrec.read())),
            (2, 1)
        );
    }
    let forgotten = core::mem::ManuallyDrop::new(a);
    b.post(4, &[]).unwrap();
    b.publish();
    // SAFETY: as above.
    assert_eq!(u32::from_be(unsafe { db.dbrec.read() }), 1, "B untouched");
    drop(core::mem::ManuallyDrop::into_inner(forgotten));
    drop((b, ma, mb));
}

/// Geometry the SRQ cannot have is refused by name.
#[test]
fn a_description_that_is_no_srq_is_refused() {
    let mut m = mem(4, 32);
    let good = DirectSrqDesc {
        buf: m.buf.as_mut_ptr().cast(),
        stride: 32,
        nwqes: 4,
        dbrec: m.dbrec.as_mut_ptr(),
        wrid: m.wrid.as_mut_ptr(),
        free: m.free.as_mut_ptr(),
    };
    for d in [
        DirectSrqDesc { stride: 16, ..good },
        DirectSrqDesc { stride: 48, ..good },
        DirectSrqDesc { nwqes: 3, ..good },
        DirectSrqDesc {
            free: core::ptr::null_mut(),
            ..good
        },
    ] {
        // SAFETY: refused before anything is touched.
        let r =
            unsafe { DirectSrq::new(d, 0, 0, 0, RecordingDoorbell::new(core::ptr::null_mut())) };
        assert!(matches!(r, Err(SrqError::Geometry)), "{d:?}");
    }
    // SAFETY: as above.
    let r = unsafe { DirectSrq::new(good, 4, 0, 0, RecordingDoorbell::new(core::ptr::null_mut())) };
    assert!(matches!(r, Err(SrqError::Geometry)), "head out of range");
    assert!(SrqError::Full.to_string().contains("ENOMEM"));
}

/// The direct poller completes an attached SRQ's receives in any order: each responder
/// CQE (its `srqn`, its `wqe_counter` the WQE's index) gives the WQE's `wr_id`, marks the
/// WQE free (so the next post can link it in again), and a payload in the CQE is copied
/// through the WQE's segments; a CQE of an SRQ nobody attached is refused in place, as is
/// an ODP page fault (which libmlx5 handles inside its poll).
#[test]
fn the_poller_completes_srq_receives_out_of_order() {
    use hotverbs_datapath::mlx5::DirectError;
    use hotverbs_datapath::Completion;
    let mut m = mem(4, 32);
    let (mut q, desc) = srq(&mut m, 4, 32);
    let mut rx = [0u8; 3 * 16];
    for i in 0..3u64 {
        let b = LocalBuf {
            addr: rx[i as usize * 16..].as_mut_ptr() as u64,
            len: 16,
            lkey: 1,
        };
        assert_eq!(q.post(100 + i, &[b]), Ok(i as u32));
    }
    q.publish();
    assert_eq!(q.post(9, &[]), Err(SrqError::Full));
    let mut cq = vec![0u128; 8 * 4];
    let mut cq_db = [0u32; 2];
    let cq_bytes = |cq: &mut Vec<u128>, i: usize| -> &mut [u8] {
        // SAFETY: the CQ's u128s as bytes: no padding, any byte valid.
        unsafe { core::slice::from_raw_parts_mut(cq.as_mut_ptr().cast::<u8>().add(i * 64), 64) }
    };
    for i in 0..8 {
        cq_bytes(&mut cq, i)[63] = 0xf0;
    }
    // SAFETY: the test's memory outlives the poller; the SRQ is not posted to during polls.
    let mut poller = unsafe {
        let mut p = common::mlx5::cq_poller::<4>(cq.as_mut_ptr().cast(), cq_db.as_mut_ptr(), 8);
        p.attach_srq(0x77, &desc).unwrap();
        p
    };
    let resp = |op: u8, format: u8, srqn: u32, ctr: u16, len: u32| {
        let mut c = [0u8; 64];
        c[32..36].copy_from_slice(&srqn.to_be_bytes());
        c[44..48].copy_from_slice(&len.to_be_bytes());
        c[56..60].copy_from_slice(&0x0abcu32.to_be_bytes());
        c[60..62].copy_from_slice(&ctr.to_be_bytes());
        c[63] = op << 4 | format;
        c
    };
    // WQE 2 first, its 5 bytes in the CQE; then WQE 0, in its buffer.
    let mut c = resp(2, 0x4, 0x77, 2, 5);
    c[..5].copy_from_slice(b"srq!!");
    cq_bytes(&mut cq, 0).copy_from_slice(&c);
    cq_bytes(&mut cq, 1).copy_from_slice(&resp(2, 0, 0x77, 0, 9));
    let mut out = [Completion::PLACEHOLDER; 4];
    assert_eq!(poller.poll_into(&mut out).unwrap(), 2);
    assert_eq!((out[0].wr_id(), out[0].byte_len()), (102, 5));
    assert_eq!((out[1].wr_id(), out[1].byte_len()), (100, 9));
    assert_eq!(&rx[32..37], b"srq!!");
    // Both WQEs are free again: two posts fit (and a third does not).
    assert!(q.post(200, &[]).is_ok());
    assert!(q.post(201, &[]).is_ok());
    assert_eq!(q.post(202, &[]), Err(SrqError::Full));
    // An SRQ nobody attached: refused, left in place.
    cq_bytes(&mut cq, 2).copy_from_slice(&resp(2, 0, 0x78, 1, 1));
    assert_eq!(
        poller.poll_into(&mut out),
        Err(DirectError::UnknownSrq(0x78))
    );
    // An ODP page fault (REMOTE_ABORTED_ERR with the vendor syndrome 0x93): refused.
    let mut f = resp(14, 0, 0x77, 1, 0);
    f[54] = 0x93;
    f[55] = 0x22;
    cq_bytes(&mut cq, 2).copy_from_slice(&f);
    assert!(matches!(
        poller.poll_into(&mut out),
        Err(DirectError::CqeOpcode { index: 2, .. })
    ));
    assert_eq!(poller.cons_index(), 2);
    drop((poller, q, cq, m));
}

/// `DirectPoller::clean` of a QP whose SRQ receive CQEs were not polled removes them and
/// frees their WQEs (as libmlx5's `free_res_cqe`): the SRQ takes them again.
#[test]
fn a_cleaned_srq_receive_frees_its_wqe() {
    let mut m = mem(4, 32);
    let (mut q, desc) = srq(&mut m, 4, 32);
    for i in 0..3 {
        q.post(i, &[]).unwrap();
    }
    assert_eq!(q.post(9, &[]), Err(SrqError::Full));
    let mut cq = vec![0u128; 8 * 4];
    let mut cq_db = [0u32; 2];
    // SAFETY: the CQ's u128s as bytes: no padding, any byte valid.
    let bytes = unsafe { core::slice::from_raw_parts_mut(cq.as_mut_ptr().cast::<u8>(), 8 * 64) };
    for i in 0..8 {
        bytes[i * 64 + 63] = 0xf0;
    }
    // A receive of WQE 1 of SRQ 0x77, for QP 0xabc, written and not polled.
    bytes[32..36].copy_from_slice(&0x77u32.to_be_bytes());
    bytes[56..60].copy_from_slice(&0x0abcu32.to_be_bytes());
    bytes[60..62].copy_from_slice(&1u16.to_be_bytes());
    bytes[63] = 2 << 4;
    // SAFETY: the test's memory outlives the poller; the SRQ is not posted to meanwhile.
    let mut poller = unsafe {
        let mut p = common::mlx5::cq_poller::<4>(cq.as_mut_ptr().cast(), cq_db.as_mut_ptr(), 8);
        p.attach_srq(0x77, &desc).unwrap();
        p
    };
    assert_eq!(poller.clean(0xabc), 1);
    assert!(poller.poll().unwrap().is_empty(), "the CQE is gone");
    assert!(q.post(10, &[]).is_ok(), "WQE 1 is free again");
    drop((poller, q, cq, m));
}
