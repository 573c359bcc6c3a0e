//! The mlx5 direct receive side (issue 30): `DirectRq` posting receive WQEs and a
//! `DirectPoller` serving the queue (`attach_rq`), on plain memory standing for the RQ and
//! the CQ, driven by arbitrary sequences of receive posts (1 to 4 scatter entries, empty
//! ones among them, the queue full), CQEs the "device" writes for the oldest receive not yet
//! completed (every responder opcode, receive errors, scatter-to-CQE of what fits, 32 bytes
//! in 64-byte CQEs and 64 in 128-byte ones, the GRH flag, the owner bit's passes), and polls
//! of any batch size, checked against a model.
//!
//! Invariants checked after every step:
//! - a post succeeds exactly when fewer than `wqe_cnt` receives are outstanding and it has
//!   at most `max_gs` entries, and the receive counter in the doorbell record is the number
//!   of receives posted;
//! - every completion the poller returns is the model's next one, in order: `wr_id`,
//!   status, opcode, byte count, flags, immediate, source QP, and a payload in the CQE lands
//!   in the receive's buffers (the bytes after it untouched); `DirectRq::complete` retires
//!   the same `wr_id`;
//! - the poller returns nothing the device did not write, and at the end every written CQE
//!   was returned: nothing lost, nothing twice.
//!
//! Planted bug (`--features planted-bug`): the model expects the GRH flag from bit 29 of
//! `flags_rqpn` only (libmlx5 takes bits 28 and 29), so a CQE with only bit 28 set differs.
#![no_main]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::collections::VecDeque;

use arbitrary::Arbitrary;
use hotverbs_datapath::mlx5::rq::{DirectRq, DirectRqDesc, RCV_DBR};
use hotverbs_datapath::mlx5::{DirectCq, RecordingDoorbell};
use hotverbs_datapath::LocalBuf;
use hotverbs_datapath::{Completion, DirectPoller};
use hotverbs_ffi::*;
use libfuzzer_sys::fuzz_target;

const QPN: u32 = 0xabc;
const WQES: u32 = 16;
const STRIDE: u32 = 64; // 4 scatter entries
const NCQE: u32 = 32;
const SLOT: usize = 128; // receive buffer bytes per WQE slot

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    /// A receive of `n % 6` entries (5 is one too many) of the given lengths (0: empty).
    Post { n: u8, lens: [u8; 4] },
    /// The device completes the oldest receive not yet completed.
    Cqe {
        kind: u8,
        scatter: bool,
        len: u8,
        rqpn: u32,
        imm: u32,
        synd: u8,
    },
    /// A poll of up to `max % 8 + 1` completions.
    Poll { max: u8 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    cqe128: bool,
    ops: Vec<Op>,
}

/// What the model expects of a receive's completion.
#[derive(Debug)]
struct Expect {
    wr_id: u64,
    status: u32,
    opcode: u32,
    byte_len: u32,
    flags: u32,
    imm: u32,
    src_qp: u32,
    /// Slot and bytes scattered into its buffers (concatenated over its entries).
    scatter: Option<(usize, Vec<u8>)>,
}

/// A receive posted, with its entries (offset in the slot's buffer, length).
#[derive(Debug)]
struct Posted {
    wr_id: u64,
    slot: usize,
    segs: Vec<(usize, u32)>,
}

fuzz_target!(|input: Input| {
    let cqe_size = if input.cqe128 { 128u32 } else { 64 };
    let mut q = vec![0u128; (WQES * STRIDE / 16) as usize];
    let mut dbrec = [0u32; 2];
    let mut wrid = vec![0u64; WQES as usize];
    let mut cq = vec![0u128; (NCQE * cqe_size / 16) as usize];
    let mut cq_db = [0u32; 2];
    let mut bufs = vec![0u8; WQES as usize * SLOT];
    let bufs_ptr = bufs.as_mut_ptr();
    let desc = DirectRqDesc {
        buf: q.as_mut_ptr().cast(),
        wqe_cnt: WQES,
        stride: STRIDE,
        dbrec: dbrec.as_mut_ptr(),
        wrid: wrid.as_mut_ptr(),
    };
    // Every CQE invalid: owned by the device.
    let cq_bytes = cq.as_mut_ptr().cast::<u8>();
    for i in 0..NCQE as usize {
        // SAFETY: inside the CQ buffer (NCQE entries of cqe_size bytes).
        unsafe { *cq_bytes.add(i * cqe_size as usize + cqe_size as usize - 1) = 0xf0 };
    }
    // SAFETY: the vectors outlive the queue and the poller (declared before them, dropped
    // after), and nothing else touches them while they live except through `bufs_ptr`,
    // read by the checks below only after the poller returned.
    let mut rq =
        unsafe { DirectRq::new(desc, 0, RecordingDoorbell::new(std::ptr::null_mut())) }.unwrap();
    // SAFETY: as above.
    let mut poller = unsafe {
        let mut p = DirectPoller::<8>::new(DirectCq {
            buf: cq.as_mut_ptr().cast(),
            cqe_cnt: NCQE,
            cqe_size,
            dbrec: cq_db.as_mut_ptr(),
            cqn: 1,
            cons_index: 0,
        })
        .unwrap();
        p.attach_rq(QPN, &desc).unwrap();
        p
    };

    let mut posted: VecDeque<Posted> = VecDeque::new(); // not yet completed by a CQE
    let mut expect: VecDeque<Expect> = VecDeque::new(); // CQEs written, not yet polled
    let (mut wr_id, mut produced, mut head) = (0u64, 0u32, 0u32);
    let mut out = [Completion::PLACEHOLDER; 8];

    for op in input.ops.iter().take(400) {
        match *op {
            Op::Post { n, lens } => {
                let n = (n % 6) as usize;
                let slot = (head % WQES) as usize;
                let mut off = 0;
                let mut segs = Vec::new();
                let mut model_segs = Vec::new();
                for &l in lens.iter().chain(&[7]).take(n) {
                    let l = u32::from(l % 33);
                    segs.push(LocalBuf {
                        // SAFETY: inside `bufs` (SLOT bytes per slot, at most 5 x 32 used).
                        addr: unsafe { bufs_ptr.add(slot * SLOT + off) } as u64,
                        len: l,
                        lkey: 0x77,
                    });
                    model_segs.push((off, l));
                    off += l as usize;
                }
                wr_id += 1;
                let full = rq.outstanding() == WQES;
                let r = rq.post(wr_id, &segs);
                rq.publish();
                match r {
                    Ok(()) => {
                        assert!(!full && n <= 4, "posted into a full queue or {n} entries");
                        head += 1;
                        posted.push_back(Posted {
                            wr_id,
                            slot,
                            segs: model_segs,
                        });
                    }
                    Err(e) => assert!(full || n > 4, "refused: {e}"),
                }
                assert_eq!(u32::from_be(dbrec[RCV_DBR]), head & 0xffff);
            }
            Op::Cqe {
                kind,
                scatter,
                len,
                rqpn,
                imm,
                synd,
            } => {
                if produced.wrapping_sub(poller.cons_index()) == NCQE {
                    continue; // the CQ is full: the device waits
                }
                let Some(p) = posted.pop_front() else {
                    continue;
                };
                let op = [1u8, 2, 3, 4, 14][kind as usize % 5];
                let cap: u32 = p.segs.iter().map(|s| s.1).sum();
                let inline_max = if cqe_size == 128 && kind & 0x80 != 0 {
                    64
                } else {
                    32
                };
                let format = if op != 14 && scatter {
                    if inline_max == 64 {
                        0x8
                    } else {
                        0x4
                    }
                } else {
                    0
                };
                let byte_len = if format != 0 {
                    u32::from(len) % (cap.min(inline_max) + 1)
                } else {
                    u32::from(len) * 7
                };
                let at = (produced % NCQE) as usize * cqe_size as usize;
                // SAFETY: the CQE's bytes inside the CQ buffer; the poller reads it only
                // in poll_into, after this write.
                let e =
                    unsafe { std::slice::from_raw_parts_mut(cq_bytes.add(at), cqe_size as usize) };
                let payload: Vec<u8> = (0..64u8).map(|i| i ^ (produced as u8)).collect();
                e.fill(0x5a);
                let off = cqe_size as usize - 64;
                if format == 0x4 {
                    e[off..off + 32].copy_from_slice(&payload[..32]);
                } else if format == 0x8 {
                    e[..64].copy_from_slice(&payload);
                }
                if format != 0x4 {
                    e[off + 24..off + 28].copy_from_slice(&(rqpn & 0x3fff_ffff).to_be_bytes());
                }
                // With 32 bytes scattered into the CQE, `flags_rqpn` is payload: libmlx5
                // reads it all the same, and so does the poller.
                let rqpn = u32::from_be_bytes(e[off + 24..off + 28].try_into().unwrap());
                e[off + 36..off + 40].copy_from_slice(&imm.to_be_bytes());
                e[off + 32..off + 36].copy_from_slice(&0u32.to_be_bytes()); // no SRQ
                e[off + 44..off + 48].copy_from_slice(&byte_len.to_be_bytes());
                e[off + 56..off + 60].copy_from_slice(&QPN.to_be_bytes());
                e[off + 60..off + 62].copy_from_slice(&(produced as u16).to_be_bytes());
                e[off + 55] = synd;
                e[off + 54] = 0;
                let owner = ((produced / NCQE) & 1) as u8;
                // The owner byte last, as the device writes it.
                e[off + 63] = op << 4 | format | owner;
                produced += 1;
                let (status, opcode, flags, imm_w) = match op {
                    14 => (hotverbs_datapath::mlx5::syndrome_status(synd), 0, 0, 0),
                    1 => (
                        IBV_WC_SUCCESS,
                        IBV_WC_RECV_RDMA_WITH_IMM,
                        IBV_WC_WITH_IMM,
                        imm.to_be(),
                    ),
                    3 => (IBV_WC_SUCCESS, IBV_WC_RECV, IBV_WC_WITH_IMM, imm.to_be()),
                    // The invalidated rkey in host order, as libmlx5 gives it.
                    4 => (IBV_WC_SUCCESS, IBV_WC_RECV, IBV_WC_WITH_INV, imm),
                    _ => (IBV_WC_SUCCESS, IBV_WC_RECV, 0, 0),
                };
                let grh_bits = if cfg!(feature = "planted-bug") {
                    (rqpn >> 29) & 1
                } else {
                    (rqpn >> 28) & 3
                };
                let flags = if op != 14 && grh_bits != 0 {
                    flags | IBV_WC_GRH
                } else {
                    flags
                };
                let scatter = (format != 0).then(|| {
                    let src = if format == 0x4 {
                        &payload[..32]
                    } else {
                        &payload[..]
                    };
                    (p.slot, src[..byte_len as usize].to_vec())
                });
                expect.push_back(Expect {
                    wr_id: p.wr_id,
                    status,
                    opcode,
                    byte_len: if op == 14 { 0 } else { byte_len },
                    flags,
                    imm: imm_w,
                    src_qp: if op == 14 { 0 } else { rqpn & 0xff_ffff },
                    scatter,
                });
                // Keep the entry layout for the buffer check.
                SEGS.with(|s| s.borrow_mut().push_back(p.segs));
            }
            Op::Poll { max } => {
                let k = (max % 8 + 1) as usize;
                let n = poller.poll_into(&mut out[..k]).expect("a modelled CQE");
                assert!(
                    n <= expect.len(),
                    "{n} completions, {} written",
                    expect.len()
                );
                for c in &out[..n] {
                    let want = expect.pop_front().unwrap();
                    let segs = SEGS.with(|s| s.borrow_mut().pop_front().unwrap());
                    check(c, &want, &segs, bufs_ptr);
                    assert_eq!(rq.complete(), Some(want.wr_id));
                }
            }
        }
    }
    // Everything written comes out, once.
    loop {
        let n = poller.poll_into(&mut out).expect("a modelled CQE");
        if n == 0 {
            break;
        }
        for c in &out[..n] {
            let want = expect.pop_front().expect("a completion nobody wrote");
            let segs = SEGS.with(|s| s.borrow_mut().pop_front().unwrap());
            check(c, &want, &segs, bufs_ptr);
            assert_eq!(rq.complete(), Some(want.wr_id));
        }
    }
    assert!(
        expect.is_empty(),
        "{} written CQEs never polled",
        expect.len()
    );
    assert_eq!(poller.cons_index(), produced);
    SEGS.with(|s| s.borrow_mut().clear());
    // The poller and the queue go before the memory they point into (declared after it).
});

thread_local! {
    /// The entries of each receive whose CQE was written, in order.
    static SEGS: std::cell::RefCell<VecDeque<Vec<(usize, u32)>>> =
        const { std::cell::RefCell::new(VecDeque::new()) };
}

fn check(c: &Completion, want: &Expect, segs: &[(usize, u32)], bufs: *mut u8) {
    let w = c.as_raw();
    assert_eq!(
        (w.wr_id, w.status, w.qp_num),
        (want.wr_id, want.status, QPN),
        "{c:?} vs {want:?}"
    );
    if want.status != IBV_WC_SUCCESS {
        return;
    }
    // SAFETY: plain integers of the union.
    let imm = unsafe { w.__bindgen_anon_1.imm_data };
    assert_eq!(
        (w.opcode, w.byte_len, w.wc_flags, w.src_qp),
        (want.opcode, want.byte_len, want.flags, want.src_qp),
        "{c:?} vs {want:?}"
    );
    if want.flags & (IBV_WC_WITH_IMM | IBV_WC_WITH_INV) != 0 {
        assert_eq!(imm, want.imm);
    }
    if let Some((slot, bytes)) = &want.scatter {
        // Walk the entries as the scatter does.
        let mut left = &bytes[..];
        for &(off, len) in segs {
            let n = (len as usize).min(left.len());
            // SAFETY: inside `bufs`; the poller is done writing.
            let got = unsafe { std::slice::from_raw_parts(bufs.add(slot * SLOT + off), n) };
            assert_eq!(got, &left[..n], "scattered bytes");
            left = &left[n..];
        }
        assert!(left.is_empty(), "the payload fits its receive");
    }
}
