//! `mlx5::rq::DirectRq`, the receive WQEs the direct path writes into a ConnectX receive
//! queue (issue 30), on plain memory: the segments, the terminator, the counter and its
//! barrier, refusals and wraps. (`cargo xtask golden` compares it with `mlx5_post_recv`
//! byte for byte; this file runs under miri.)

use hotverbs_datapath::mlx5::rq::{DirectRq, DirectRqDesc, RecvSeg, RqError, RCV_DBR};
use hotverbs_datapath::mlx5::{MmioEvent, RecordingDoorbell};

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
        RecvSeg {
            addr: 0x1122_3344_5566_7788,
            length: 100,
            lkey: 7,
        },
        RecvSeg {
            addr: 0x99,
            length: 0,
            lkey: 8,
        }, // skipped
        RecvSeg {
            addr: 0xaabb,
            length: 4,
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
    let three = [RecvSeg {
        addr: 1,
        length: 1,
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
