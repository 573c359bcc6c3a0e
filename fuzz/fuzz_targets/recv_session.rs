//! The direct receive ring (`RecvRing` with `RecvTarget::Mlx5`) with its `DirectPoller`
//! and the fused `RecvSession` (issue 30), on plain memory standing for a ConnectX RQ and
//! CQ, driven by arbitrary sequences of: device deliveries (SEND, SEND with immediate,
//! RDMA WRITE with immediate, SEND with invalidate; in the slot, 32 bytes in the CQE, 64 in
//! the first half of a 128-byte CQE), another QP's receives on the same CQ, a QP error
//! (every posted receive flushed), a QP reset (the device forgets everything, the CQ is
//! cleaned, the ring reset and refilled); sessions of receives with deliveries while a
//! message is out, closed or leaked (`mem::forget`); polls through the poller and
//! `on_completion`, `Received`s held and released in any order, reposts. Or, as the input
//! picks, the ring on an SRQ (`RecvTarget::Mlx5Srq`, linked as libmlx5 makes a new one):
//! the device takes its WQEs along the list, the poller frees them in the bitmap, a repost
//! may be refused with `ENOMEM` while none is free; sessions are refused.
//!
//! The device is a model that reads what the ring wrote: it takes the next posted WQE
//! (the receive counter in the doorbell record says how many there are), finds the slot
//! from the WQE's address, writes the payload there (or into the CQE) and a CQE only where
//! the CQ's consumer index (its doorbell record) gives it room.
//!
//! Invariants checked:
//! - every WQE the device takes names a slot of the region (address, length, lkey), with
//!   the slot's current `wr_id` in the `wrid` table, and the slot is not the
//!   application's (a `Received` held, the session's message out, a slot a leaked session
//!   took), not already taken and not completed, not idle after a flush: nothing posted
//!   twice, no buffer written under the application;
//! - every message delivered (by the session or the ring) is the device's next one for
//!   that QP, in order: slot, bytes (read in place, in the CQE or the slot, and again
//!   after the device wrote more CQEs while the message was out), `byte_len`, immediate;
//!   flushes are the ring's `Completion` errors with their slot; another QP's receives
//!   come out as `Other` (session) or `Misrouted` (ring) with their `wr_id`; `Empty`
//!   exactly when nothing is waiting;
//! - the ring's books balance after every step: posted + held + pending + idle = count,
//!   `held()` = the `Received`s out, `retired` counts every completion taken.
//!
//! Planted bug (`--features planted-bug`): the model expects an RDMA WRITE with immediate
//! to leave its bytes in the slot (it leaves none: they went to the remote buffer).
#![no_main]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::collections::VecDeque;

use arbitrary::Arbitrary;
use hotverbs_datapath::mlx5::rq::{DirectRqDesc, RCV_DBR};
use hotverbs_datapath::mlx5::{DirectCq, DirectSrqDesc, Polled, RecvSessionError};
use hotverbs_datapath::{
    Completion, DirectPoller, LocalBuf, Received, RecvConfig, RecvError, RecvRing, RecvTarget,
};
use hotverbs_ffi::*;
use libfuzzer_sys::fuzz_target;

const QPN: u32 = 0x1a2;
const FOREIGN: u32 = 0x3b4;
const SLOT: u32 = 64;
const LKEY: u32 = 0x55;
const NCQE: u32 = 16;
const FOREIGN_WQES: u32 = 16;
const SRQN: u32 = 0x2c;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Step {
    /// Receive once; if a message comes, the device delivers `deliver % 3` more while it
    /// is out, then it is checked again.
    Recv { deliver: u8, kind: u8, len: u8 },
    /// The device delivers one message.
    Deliver { kind: u8, len: u8 },
}

#[derive(Arbitrary, Debug, Clone)]
enum Op {
    Deliver { kind: u8, len: u8 },
    Foreign,
    Flush,
    Reset,
    Session { steps: Vec<Step>, leak: bool },
    Poll { n: u8 },
    Release { i: u8 },
    Repost,
}

#[derive(Arbitrary, Debug)]
struct Input {
    cqe128: bool,
    /// The ring on an SRQ (`RecvTarget::Mlx5Srq`, of 4, 8 or 16 WQEs of 32 or 64 bytes, at
    /// most WQEs - 1 slots) instead of the QP's RQ: no session (refused), no QP error or
    /// reset (a QP's error leaves the SRQ's receives posted).
    srq: bool,
    /// WQEs: 4 << (w % 3); slots 1..=WQEs; stride 16 or 32.
    w: u8,
    slots: u8,
    wide: bool,
    ops: Vec<Op>,
}

/// What the consumer expects next of the ring's QP.
#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Msg {
        slot: u32,
        bytes: Vec<u8>,
        byte_len: u32,
        imm: Option<u32>,
        in_cqe: bool,
    },
    Flush {
        slot: u32,
    },
}

struct Device {
    cq: *mut u8,
    cq_dbr: *const u32,
    cqe_size: usize,
    rq: DirectRqDesc,
    /// The SRQ mode: its queue, and the device's place in its list (the next WQE to take).
    srq: Option<DirectSrqDesc>,
    srq_head: u32,
    region: u64,
    nslots: u32,
    /// CQEs written, WQEs taken, foreign receives completed.
    prod: u32,
    wqe: u32,
    foreign: u32,
    error: bool,
    seq: u8,
}

impl Device {
    fn room(&self) -> bool {
        // SAFETY: the CQ's doorbell record, alive for the input.
        let ci = u32::from_be(unsafe { self.cq_dbr.read_volatile() }) & 0xff_ffff;
        self.prod.wrapping_sub(ci) < NCQE
    }

    /// Writes a CQE (its 64-byte half `c`, and `first` in the first half of a 128-byte
    /// one), the owner byte last.
    fn write_cqe(&mut self, c: [u8; 64], first: Option<[u8; 64]>) {
        let owner = ((self.prod / NCQE) & 1) as u8;
        let at = (self.prod % NCQE) as usize * self.cqe_size;
        // SAFETY: CQE `at` of the buffer, which has room (checked by the caller).
        unsafe {
            if let Some(f) = first {
                std::ptr::copy_nonoverlapping(f.as_ptr(), self.cq.add(at), 64);
            }
            let half = self.cq.add(at + self.cqe_size - 64);
            std::ptr::copy_nonoverlapping(c.as_ptr(), half, 63);
            half.add(63).write_volatile(c[63] | owner);
        }
        self.prod += 1;
    }

    fn posted(&self) -> u32 {
        let dbr = match &self.srq {
            Some(q) => q.dbrec,
            // SAFETY: element RCV_DBR of the RQ's doorbell record.
            None => unsafe { self.rq.dbrec.add(RCV_DBR) },
        };
        // SAFETY: the queue's doorbell record, alive for the input.
        let db = u32::from_be(unsafe { dbr.read_volatile() });
        db.wrapping_sub(self.wqe) & 0xffff
    }

    /// The next WQE to take: its index, its data segment's bytes and its `wr_id` (an SRQ's
    /// from the list, advancing along `next_wqe_index`; an RQ's in order).
    fn next_wqe(&mut self) -> (u32, Vec<u8>, u64) {
        match self.srq {
            Some(q) => {
                let idx = self.srq_head;
                assert!(idx < q.nwqes, "the SRQ's list leaves the queue at {idx}");
                // SAFETY: WQE idx of the SRQ (its next segment and first data segment)
                // and its wrid entry.
                unsafe {
                    let w = q.buf.add((idx * q.stride) as usize);
                    self.srq_head =
                        u32::from(u16::from_be_bytes([w.add(2).read(), w.add(3).read()]));
                    (
                        idx,
                        std::slice::from_raw_parts(w.add(16), 16).to_vec(),
                        q.wrid.add(idx as usize).read(),
                    )
                }
            }
            None => {
                let idx = self.wqe & (self.rq.wqe_cnt - 1);
                // SAFETY: WQE idx of the queue and its wrid entry.
                unsafe {
                    let w = self.rq.buf.add((idx * self.rq.stride) as usize);
                    (
                        self.wqe,
                        std::slice::from_raw_parts(w, 16).to_vec(),
                        self.rq.wrid.add(idx as usize).read(),
                    )
                }
            }
        }
    }

    /// Takes the next posted WQE: its slot (checked against `out`, the slots the device
    /// must not see) and `wr_id`, and the WQE counter its CQE carries (an SRQ's: the WQE's
    /// index).
    fn take(&mut self, out: &[u32], tag: u64) -> Option<(u32, u32)> {
        if self.posted() == 0 || !self.room() {
            return None;
        }
        let (counter, seg, wr_id) = self.next_wqe();
        let len = u32::from_be_bytes(seg[0..4].try_into().unwrap());
        let lkey = u32::from_be_bytes(seg[4..8].try_into().unwrap());
        let addr = u64::from_be_bytes(seg[8..16].try_into().unwrap());
        assert_eq!((len, lkey), (SLOT, LKEY), "WQE {} names no slot", self.wqe);
        let off = addr.wrapping_sub(self.region);
        assert!(off % u64::from(SLOT) == 0 && off / u64::from(SLOT) < u64::from(self.nslots));
        let slot = (off / u64::from(SLOT)) as u32;
        assert_eq!(
            wr_id,
            tag | u64::from(slot),
            "WQE {} of slot {slot}: wr_id",
            self.wqe
        );
        assert!(
            !out.contains(&slot),
            "WQE {} posts slot {slot}, which is not the device's ({out:?})",
            self.wqe
        );
        self.wqe += 1;
        Some((slot, counter))
    }

    fn base_cqe(&self, qpn: u32, counter: u32, byte_len: u32) -> [u8; 64] {
        let mut c = [0u8; 64];
        c[24..28].copy_from_slice(&0x0000_0777u32.to_be_bytes());
        c[36..40].copy_from_slice(&(0xabc0_0000 | u32::from(self.seq)).to_be_bytes());
        c[44..48].copy_from_slice(&byte_len.to_be_bytes());
        c[56..60].copy_from_slice(&(0x7700_0000 | qpn).to_be_bytes());
        if self.srq.is_some() && qpn == QPN {
            c[32..36].copy_from_slice(&SRQN.to_be_bytes());
        }
        c[60..62].copy_from_slice(&(counter as u16).to_be_bytes());
        c
    }

    /// One message of `kind` and `len`, or flushes when the QP is in error.
    fn deliver(&mut self, kind: u8, len: u8, out: &[u32], tag: u64) -> Vec<Expect> {
        if self.error {
            return self.flush(out, tag);
        }
        let Some((slot, counter)) = self.take(out, tag) else {
            return Vec::new();
        };
        self.seq = self.seq.wrapping_add(1);
        let kind = kind % 8;
        let big = self.cqe_size == 128;
        // (opcode, format, cap of the bytes)
        let (op, fmt) = match kind {
            0 => (2u8, 0u8),
            1 => (2, 1),
            2 if big => (2, 2),
            2 => (2, 1),
            3 => (3, 0),
            4 => (3, 1),
            5 => (1, 0),
            6 => (4, 0),
            _ => (4, 1),
        };
        let cap = match fmt {
            0 => SLOT,
            1 => 32,
            _ => 64,
        };
        let n = u32::from(len) % (cap + 1);
        let byte_len = if op == 1 { u32::from(len) * 16 } else { n };
        let bytes: Vec<u8> = (0..n)
            .map(|i| self.seq ^ (i as u8).wrapping_mul(7))
            .collect();
        let mut c = self.base_cqe(QPN, counter, byte_len);
        let mut first = None;
        if op != 1 {
            match fmt {
                // SAFETY: the slot's `n <= SLOT` bytes, the device's (checked by `take`).
                0 => unsafe {
                    let p = (self.region + u64::from(slot * SLOT)) as *mut u8;
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, n as usize);
                },
                1 => c[..n as usize].copy_from_slice(&bytes),
                _ => {
                    let mut f = [0u8; 64];
                    f[..n as usize].copy_from_slice(&bytes);
                    first = Some(f);
                }
            }
        }
        c[63] = op << 4 | fmt << 2;
        self.write_cqe(c, first);
        let mut bytes = if op == 1 { Vec::new() } else { bytes };
        if cfg!(feature = "planted-bug") && op == 1 {
            bytes = vec![0; (byte_len.min(SLOT)) as usize];
        }
        vec![Expect::Msg {
            slot,
            bytes,
            byte_len,
            imm: (op == 1 || op == 3).then_some(0xabc0_0000 | u32::from(self.seq)),
            // SEND with invalidate goes through the general path, and an SRQ's receives:
            // copied into the slot.
            in_cqe: op != 4 && fmt != 0 && self.srq.is_none(),
        }]
    }

    /// Every posted WQE flushed (the QP in error).
    fn flush(&mut self, out: &[u32], tag: u64) -> Vec<Expect> {
        self.error = true;
        let mut v = Vec::new();
        while self.posted() > 0 && self.room() {
            let (slot, counter) = self.take(out, tag).unwrap();
            let mut c = self.base_cqe(QPN, counter, 0);
            c[55] = 0x05; // WR_FLUSH_ERR
            c[63] = 14 << 4;
            self.write_cqe(c, None);
            v.push(Expect::Flush { slot });
        }
        v
    }

    /// Another QP's receive (its wr_id), if the CQ has room.
    fn foreign(&mut self) -> Option<u64> {
        if !self.room() {
            return None;
        }
        let counter = self.foreign;
        self.foreign += 1;
        let mut c = self.base_cqe(FOREIGN, counter, 9);
        c[63] = 2 << 4;
        self.write_cqe(c, None);
        Some(0xf0f0_0000_0000_0000 | u64::from(counter % FOREIGN_WQES))
    }
}

struct Model {
    expect: VecDeque<Expect>,
    foreign: VecDeque<u64>,
    /// Slots the device must not see: held by `Received`s, by a leaked session, idle
    /// after a flush.
    lost: Vec<u32>,
    idle: Vec<u32>,
    retired: u64,
}

impl Model {
    fn out(&self, held: &[Received], extra: Option<u32>) -> Vec<u32> {
        let mut v: Vec<u32> = held.iter().map(|m| m.slot()).collect();
        v.extend(&self.lost);
        v.extend(&self.idle);
        v.extend(extra);
        v
    }

    fn next(&mut self) -> Expect {
        self.retired += 1;
        self.expect.pop_front().expect("a message nobody sent")
    }
}

/// A refused repost: only an SRQ's, and only for want of a free WQE (`ENOMEM`, named as
/// `ibv_post_srq_recv` names it); the slots not posted stay pending.
fn enomem(e: &hotverbs_datapath::PostError, srq: bool) {
    assert!(srq && e.errno == 12, "a refused repost: {e}");
}

fn check_books(ring: &RecvRing<16>, held: &[Received], model: &Model) {
    assert_eq!(ring.held() as usize, held.len(), "held()");
    assert_eq!(
        ring.posted() + ring.held() + ring.pending() + model.idle.len() as u32,
        ring.count(),
        "posted {} + held {} + pending {} + idle {:?} != count",
        ring.posted(),
        ring.held(),
        ring.pending(),
        model.idle
    );
    assert_eq!(ring.progress().retired, model.retired, "retired");
}

fuzz_target!(|input: Input| {
    let wqe_cnt = 4u32 << (input.w % 3);
    // An SRQ never lets the device take its last linked WQE: WQEs - 1 slots at most.
    let nslots = u32::from(input.slots) % (wqe_cnt - u32::from(input.srq)) + 1;
    let stride = match (input.srq, input.wide) {
        (false, w) => 16u32 << u32::from(w),
        (true, w) => 32u32 << u32::from(w),
    };
    let cqe_size = if input.cqe128 { 128usize } else { 64 };
    let mut rq = vec![0u128; (wqe_cnt * stride / 16) as usize];
    let mut rq_db = vec![0u32; 2];
    let mut wrid = vec![0u64; wqe_cnt as usize];
    let mut fwrid: Vec<u64> = (0..u64::from(FOREIGN_WQES))
        .map(|i| 0xf0f0_0000_0000_0000 | i)
        .collect();
    let mut frq = vec![0u128; FOREIGN_WQES as usize];
    let mut frq_db = vec![0u32; 2];
    let mut slots = vec![0u64; (nslots * SLOT / 8) as usize];
    let mut cq = vec![0u128; NCQE as usize * cqe_size / 16];
    let mut cq_db = vec![0u32; 2];
    // SAFETY: plain C struct; all-zero is valid. Only `qp_num` is read.
    let mut qp: Vec<ibv_qp> = vec![unsafe { std::mem::zeroed() }];
    qp[0].qp_num = QPN;
    let cq_buf: *mut u8 = cq.as_mut_ptr().cast();
    for i in 0..NCQE as usize {
        // SAFETY: the op_own byte of CQE i.
        unsafe { cq_buf.add(i * cqe_size + cqe_size - 1).write(0xf0) };
    }
    let desc = DirectRqDesc {
        buf: rq.as_mut_ptr().cast(),
        wqe_cnt,
        stride,
        dbrec: rq_db.as_mut_ptr(),
        wrid: wrid.as_mut_ptr(),
    };
    let fdesc = DirectRqDesc {
        buf: frq.as_mut_ptr().cast(),
        wqe_cnt: FOREIGN_WQES,
        stride: 16,
        dbrec: frq_db.as_mut_ptr(),
        wrid: fwrid.as_mut_ptr(),
    };
    // The SRQ (its WQEs in `rq`, linked in order as libmlx5 makes a new SRQ: head 0, tail
    // WQEs - 1), its wrid table in `wrid`, its free bitmap.
    let mut free = vec![0u64; 1];
    // SAFETY: plain C struct; all-zero is valid. The ring only checks the pointer.
    let mut srq: Vec<ibv_srq> = vec![unsafe { std::mem::zeroed() }];
    let sdesc = DirectSrqDesc {
        buf: desc.buf,
        stride,
        nwqes: wqe_cnt,
        dbrec: rq_db.as_mut_ptr(),
        wrid: desc.wrid,
        free: free.as_mut_ptr(),
    };
    if input.srq {
        for i in 0..wqe_cnt - 1 {
            // SAFETY: the next segment's next_wqe_index of WQE i, inside the queue.
            unsafe {
                let b = ((i + 1) as u16).to_be_bytes();
                let w = sdesc.buf.add((i * stride) as usize);
                w.add(2).write(b[0]);
                w.add(3).write(b[1]);
            }
        }
    }
    let region = slots.as_mut_ptr() as u64;
    // SAFETY: every buffer above outlives the poller and the ring (declared before them),
    // and is touched otherwise only through these pointers by the device model, on the
    // memory the device owns (checked by its assertions).
    let mut poller = unsafe {
        let mut p = DirectPoller::<8>::new(DirectCq {
            buf: cq_buf,
            cqe_cnt: NCQE,
            cqe_size: cqe_size as u32,
            dbrec: cq_db.as_mut_ptr(),
            cqn: 1,
            cons_index: 0,
        })
        .unwrap();
        if input.srq {
            p.attach_srq(SRQN, &sdesc).unwrap();
        } else {
            p.attach_rq(QPN, &desc).unwrap();
        }
        p.attach_rq(FOREIGN, &fdesc).unwrap();
        p
    };
    let target = if input.srq {
        RecvTarget::Mlx5Srq {
            srq: srq.as_mut_ptr(),
            desc: sdesc,
            head: 0,
            tail: wqe_cnt - 1,
            counter: 0,
        }
    } else {
        RecvTarget::Mlx5 {
            qp: qp.as_mut_ptr(),
            desc,
            head: 0,
        }
    };
    // SAFETY: as above.
    let mut ring: RecvRing<16> = unsafe {
        RecvRing::new(
            target,
            LocalBuf::new(region, nslots * SLOT, LKEY),
            RecvConfig::new(2, SLOT, nslots).repost_batch(1 + nslots / 2),
        )
    }
    .unwrap();
    let mut dev = Device {
        cq: cq_buf,
        cq_dbr: cq_db.as_ptr(),
        cqe_size,
        rq: desc,
        srq: input.srq.then_some(sdesc),
        srq_head: 0,
        region,
        nslots,
        prod: 0,
        wqe: 0,
        foreign: 0,
        error: false,
        seq: 0,
    };
    let mut model = Model {
        expect: VecDeque::new(),
        foreign: VecDeque::new(),
        lost: Vec::new(),
        idle: Vec::new(),
        retired: 0,
    };
    let mut held: Vec<Received> = Vec::new();
    ring.fill().unwrap();

    for op in input.ops.iter().take(64) {
        // The ring's wr_id of slot 0 (its tag): the generation changes only at a reset.
        let tag = ring.slot_wr_id(0);
        match op {
            Op::Deliver { kind, len } => {
                let out = model.out(&held, None);
                let e = dev.deliver(*kind, *len, &out, tag);
                model.expect.extend(e);
            }
            Op::Foreign => model.foreign.extend(dev.foreign()),
            // A QP's error or reset leaves an SRQ's receives posted: nothing to model.
            Op::Flush | Op::Reset if input.srq => {}
            Op::Session { .. } if input.srq => {
                let e = ring.session(&mut poller).unwrap_err();
                assert_eq!(e, RecvSessionError::NotDirect);
            }
            Op::Flush => {
                let out = model.out(&held, None);
                let e = dev.flush(&out, tag);
                model.expect.extend(e);
            }
            Op::Reset => {
                // The QP through RESET: the device forgets its receives; the CQ is cleaned
                // of the QP's CQEs (the foreign ones stay), the ring reset and refilled.
                poller.clean(QPN);
                model.expect.clear();
                dev.wqe = 0;
                dev.error = false;
                // SAFETY: the RQ's doorbell record: zeroed by the move to RESET.
                unsafe { desc.dbrec.add(RCV_DBR).write_volatile(0) };
                // SAFETY: the "QP" went through RESET: the device holds none of the
                // ring's receives (the model forgot them).
                let queued = unsafe { ring.reset() };
                let posted_before = ring.posted();
                assert_eq!(posted_before, 0);
                assert_eq!(queued as usize + held.len(), nslots as usize);
                // Reset counts the receives it took back as retired.
                model.retired = ring.progress().retired;
                model.lost.clear();
                model.idle.clear();
                ring.repost().unwrap();
            }
            Op::Session { steps, leak } => {
                let mut s = ring.session(&mut poller).unwrap();
                let mut out_slot = None;
                for st in steps.iter().take(24) {
                    match *st {
                        Step::Deliver { kind, len } => {
                            let out = model.out(&held, out_slot);
                            let e = dev.deliver(kind, len, &out, tag);
                            model.expect.extend(e);
                        }
                        Step::Recv { deliver, kind, len } => {
                            out_slot = None;
                            match s.recv() {
                                Ok(Polled::Empty) => {
                                    assert!(
                                        model.expect.is_empty() && model.foreign.is_empty(),
                                        "Empty with {:?} / {:?} waiting",
                                        model.expect,
                                        model.foreign
                                    );
                                }
                                Ok(Polled::Msg(m)) => {
                                    let e = model.next();
                                    let got = Expect::Msg {
                                        slot: m.slot(),
                                        bytes: m.bytes().to_vec(),
                                        byte_len: m.byte_len(),
                                        imm: m.imm(),
                                        in_cqe: m.in_cqe(),
                                    };
                                    assert_eq!(got, e, "the session's message");
                                    // More deliveries while it is out: its CQE and slot stay.
                                    for _ in 0..deliver % 3 {
                                        let out = model.out(&held, Some(m.slot()));
                                        model.expect.extend(dev.deliver(kind, len, &out, tag));
                                    }
                                    assert_eq!(
                                        (m.slot(), m.bytes().to_vec()),
                                        match &e {
                                            Expect::Msg { slot, bytes, .. } =>
                                                (*slot, bytes.clone()),
                                            _ => unreachable!(),
                                        },
                                        "the message changed while it was out"
                                    );
                                    out_slot = Some(m.slot());
                                }
                                Ok(Polled::Other(c)) => {
                                    let w =
                                        model.foreign.pop_front().expect("an Other nobody sent");
                                    assert_eq!((c.wr_id(), c.qp_num()), (w, FOREIGN));
                                }
                                Err(RecvSessionError::Recv(RecvError::Completion {
                                    slot,
                                    error,
                                })) => {
                                    assert_eq!(model.next(), Expect::Flush { slot });
                                    assert_eq!(error.status(), IBV_WC_WR_FLUSH_ERR);
                                    model.idle.push(slot);
                                }
                                Err(e) => panic!("the session failed: {e}"),
                            }
                        }
                    }
                }
                if *leak {
                    model.lost.extend(out_slot);
                    std::mem::forget(s);
                }
            }
            Op::Poll { n } => {
                let mut out = [Completion::PLACEHOLDER; 8];
                let k = poller
                    .poll_into(&mut out[..usize::from(n % 8) + 1])
                    .unwrap();
                for c in out.iter_mut().take(k) {
                    match ring.on_completion(c) {
                        Ok(m) => {
                            let e = model.next();
                            let got = Expect::Msg {
                                slot: m.slot(),
                                bytes: ring.data(&m).unwrap().to_vec(),
                                byte_len: m.byte_len(),
                                imm: m.imm(),
                                in_cqe: false,
                            };
                            let e = match e {
                                Expect::Msg {
                                    slot,
                                    bytes,
                                    byte_len,
                                    imm,
                                    ..
                                } => Expect::Msg {
                                    slot,
                                    bytes,
                                    byte_len,
                                    imm,
                                    in_cqe: false,
                                },
                                f => f,
                            };
                            assert_eq!(got, e, "the ring's message");
                            held.push(m);
                        }
                        Err(RecvError::Completion { slot, error }) => {
                            assert_eq!(model.next(), Expect::Flush { slot });
                            assert_eq!(error.status(), IBV_WC_WR_FLUSH_ERR);
                            model.idle.push(slot);
                        }
                        Err(RecvError::Misrouted(_)) => {
                            let w = model.foreign.pop_front().expect("a misrouted nobody sent");
                            assert_eq!((c.wr_id(), c.qp_num()), (w, FOREIGN));
                        }
                        Err(e) => panic!("on_completion: {e}"),
                    }
                }
            }
            Op::Release { i } => {
                if !held.is_empty() {
                    let m = held.swap_remove(usize::from(*i) % held.len());
                    match ring.release(m) {
                        Ok(()) => {}
                        Err(RecvError::Post(e)) => enomem(&e, input.srq),
                        Err(e) => panic!("release: {e}"),
                    }
                }
            }
            Op::Repost => {
                if let Err(e) = ring.repost() {
                    enomem(&e, input.srq);
                }
            }
        }
        check_books(&ring, &held, &model);
    }
    // Everything waiting comes out, once.
    for m in held.drain(..) {
        if let Err(e) = ring.release(m) {
            assert!(
                input.srq && matches!(e, RecvError::Post(p) if p.errno == 12),
                "{e}"
            );
        }
    }
    if input.srq {
        let mut out = [Completion::PLACEHOLDER; 8];
        loop {
            let k = poller.poll_into(&mut out).unwrap();
            if k == 0 {
                break;
            }
            for c in out.iter_mut().take(k) {
                match ring.on_completion(c) {
                    Ok(m) => {
                        let slot = m.slot();
                        assert!(matches!(model.next(), Expect::Msg { slot: s2, .. } if s2 == slot));
                        let _ = ring.release(m);
                    }
                    Err(RecvError::Misrouted(_)) => {
                        assert_eq!(Some(c.wr_id()), model.foreign.pop_front());
                    }
                    Err(e) => panic!("draining: {e}"),
                }
            }
        }
        assert!(model.expect.is_empty() && model.foreign.is_empty());
        return;
    }
    let mut s = ring.session(&mut poller).unwrap();
    loop {
        match s.recv() {
            Ok(Polled::Empty) => break,
            Ok(Polled::Msg(m)) => {
                let slot = m.slot();
                assert!(matches!(model.next(), Expect::Msg { slot: s2, .. } if s2 == slot));
            }
            Ok(Polled::Other(c)) => {
                assert_eq!(Some(c.wr_id()), model.foreign.pop_front());
            }
            Err(RecvSessionError::Recv(RecvError::Completion { slot, .. })) => {
                assert_eq!(model.next(), Expect::Flush { slot });
                model.idle.push(slot);
            }
            Err(e) => panic!("draining: {e}"),
        }
    }
    drop(s);
    assert!(model.expect.is_empty() && model.foreign.is_empty());
    check_books(&ring, &held, &model);
});
