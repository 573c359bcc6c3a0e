//! [`DirectPoller`]: requester CQEs (and responder CQEs of attached receive queues) read
//! straight from an mlx5 CQ.
//!
//! # Invariants
//! - `cons` is libmlx5's `cons_index`: the CQE at `cons & (cqe_cnt - 1)` is the next one,
//!   and it belongs to software when its opcode is not `INVALID` and its owner bit equals
//!   `cons & cqe_cnt != 0` (the device flips the bit on every pass).
//! - CQEs are 64 or 128 bytes (`stride`). Every field parsed, the owner byte included, is
//!   in the CQE's last 64 bytes (libmlx5: `cqe64 = cqe_sz == 64 ? cqe : cqe + 64`), so the
//!   poll works on `buf64 = buf + stride - 64` with the stride as its step: the 64-byte
//!   case is the same arithmetic with an offset of 0.
//! - A CQE is consumed (`cons` advanced) only once it became a [`Completion`]; a CQE the
//!   poller refuses stays in place and is reported again by the next poll.
//! - After every poll the CQ's doorbell record holds `cons & 0xffffff` (what the device
//!   reads to know the free room), as `update_cons_index()` writes it.

use hotverbs_ffi::*;

use super::{cqe, from_device_barrier, syndrome_status, DirectCq, DirectError, DirectSq};
use crate::cq::Completion;

/// Send queues one poller serves.
pub(super) const MAX_QPS: usize = 8;

#[derive(Clone, Copy, Debug)]
struct QpSlot {
    qpn: u32,
    mask: u32,
    wrid: *const u64,
}

const NO_QP: QpSlot = QpSlot {
    qpn: u32::MAX,
    mask: 0,
    wrid: core::ptr::null(),
};

/// A receive queue the poller serves (issue 30): its `wrid` table and WQEs (scatter-to-CQE
/// copies through their segments).
#[derive(Clone, Copy, Debug)]
struct RqSlot {
    qpn: u32,
    mask: u32,
    wrid: *const u64,
    buf: *const u8,
    shift: u32,
    max_gs: u32,
}

/// An SRQ the poller serves (issue 30): its `wrid` table, WQEs (scatter-to-CQE) and free
/// bitmap, which the poll marks as `mlx5_poll_cq` does (`mlx5_free_srq_wqe`).
#[derive(Clone, Copy, Debug)]
struct SrqSlot {
    srqn: u32,
    nwqes: u32,
    wrid: *const u64,
    buf: *const u8,
    shift: u32,
    free: *mut u64,
}

const NO_SRQ: SrqSlot = SrqSlot {
    srqn: 0,
    nwqes: 0,
    wrid: core::ptr::null(),
    buf: core::ptr::null(),
    shift: 0,
    free: core::ptr::null_mut(),
};

/// Marks SRQ WQE `idx` free in the bitmap at `free` (`mlx5_free_srq_wqe`): an atomic OR
/// with Release, as the queue that posts reads the bitmap atomically, maybe on another
/// thread (see `DirectSrq`).
fn free_srq_wqe(free: *mut u64, idx: u32) {
    // SAFETY: idx < nwqes of an attached SRQ: word idx / 64 of its bitmap, 8-aligned and
    // accessed only atomically (attach_srq's contract).
    let w = unsafe { core::sync::atomic::AtomicU64::from_ptr(free.add(idx as usize / 64)) };
    w.fetch_or(1 << (idx % 64), core::sync::atomic::Ordering::Release);
}

/// Fills `out` with a receive's completion: its `wr_id`, its `status` (the CQE's, or a
/// scatter's failure) and the fields of `r` as `handle_responder` sets them.
fn recv_wc(out: &mut Completion, wr_id: u64, status: u32, r: &super::rq::RecvCqe) {
    let wc = out.raw_mut();
    wc.wr_id = wr_id;
    wc.status = status;
    wc.qp_num = r.qpn;
    wc.vendor_err = r.vendor_err;
    wc.opcode = r.opcode;
    wc.byte_len = if r.status == IBV_WC_SUCCESS {
        r.byte_len
    } else {
        0
    };
    wc.wc_flags = r.wc_flags;
    // The immediate as the CQE holds it (network order, as `ibv_wc.imm_data`); the
    // invalidated rkey of a SEND_WITH_INV in host order (libmlx5's
    // `be32toh(imm_inval_pkey)`).
    wc.__bindgen_anon_1.imm_data = if r.wc_flags & IBV_WC_WITH_INV != 0 {
        u32::from_be(r.imm_raw)
    } else {
        r.imm_raw
    };
    wc.src_qp = r.src_qp;
    wc.slid = r.slid;
    wc.sl = r.sl;
    wc.dlid_path_bits = r.dlid_path_bits;
    wc.pkey_index = r.pkey_index;
}

/// SRQs one poller serves.
pub(super) const MAX_SRQS: usize = 4;

const NO_RQ: RqSlot = RqSlot {
    qpn: u32::MAX,
    mask: 0,
    wrid: core::ptr::null(),
    buf: core::ptr::null(),
    shift: 0,
    max_gs: 0,
};

/// Polls an mlx5 send CQ directly: up to `B` requester CQEs per [`poll`](Self::poll), each
/// a [`Completion`] with the fields libmlx5's `mlx5_poll_cq` sets (`wr_id` from the
/// attached ring's `wrid` table at the CQE's `wqe_counter`, `status` from the syndrome,
/// `vendor_err`, `qp_num`, `opcode`, `wc_flags`, `byte_len` for READ and atomics; the other
/// fields 0).
///
/// Receive completions too, for a receive queue [`attach_rq`](Self::attach_rq)ed (issue
/// 30): responder CQEs, scatter-to-CQE included, decoded as libmlx5 decodes them.
///
/// # Not modelled, refused
/// Resize and signature CQEs, compressed CQEs, a requester scatter-to-CQE entry, receives
/// of an SRQ, and CQEs of a QP no ring [`attach`](Self::attach)ed (or no receive queue
/// [`attach_rq`](Self::attach_rq)ed): [`DirectError`], with the CQE left in place.
///
/// CQEs of 64 or 128 bytes (`MLX5_CQE_SIZE=128`): a 128-byte CQE is read from its second
/// half, where the device puts the 64-byte CQE's fields (the first half holds what a
/// requester CQE does not use).
pub struct DirectPoller<const B: usize> {
    cq: CqState,
    wcs: [Completion; B],
}

#[derive(Debug)]
struct CqState {
    /// Written only by [`clean`](DirectPoller::clean) (as libmlx5's `__mlx5_cq_clean`
    /// rewrites its own CQ); the poll path only reads. The last 64 bytes of the first CQE
    /// (`buf + stride - 64`): where the fields are (see the module invariants).
    buf64: *mut u8,
    /// Bytes per CQE: 64 or 128.
    stride: usize,
    /// `log2(stride)`.
    shift: u32,
    /// One past the last CQE's 64-byte half (`buf64 + cqe_cnt * stride`): where a walking
    /// CQE pointer wraps.
    end: *const u8,
    mask: u32,
    cqe_cnt: u32,
    dbrec: *mut u32,
    cons: u32,
    cqn: u32,
    last: usize,
    /// The `rqs` entry of the last receive completed (a guess for the next).
    last_rq: usize,
    qps: [QpSlot; MAX_QPS],
    rqs: [RqSlot; MAX_QPS],
    srqs: [SrqSlot; MAX_SRQS],
}

// SAFETY: the CQ memory is read and its doorbell record written only through `&mut self`
// (new's contract makes this poller the CQ's only consumer).
unsafe impl<const B: usize> Send for DirectPoller<B> {}

impl<const B: usize> core::fmt::Debug for DirectPoller<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DirectPoller")
            .field("cqn", &self.cq.cqn)
            .field("cqe_cnt", &self.cq.cqe_cnt)
            .field("cqe_size", &self.cq.stride)
            .field("cons_index", &self.cq.cons)
            .finish_non_exhaustive()
    }
}

impl<const B: usize> DirectPoller<B> {
    /// A poller of the CQ `cq`.
    ///
    /// # Safety
    /// `cq` describes a live CQ (`mlx5dv_init_obj(3)`) that outlives the poller and that
    /// nothing else polls (no `ibv_poll_cq`, no extended poll, no other poller); it serves
    /// as send CQ only. Its buffer is writable ([`clean`](Self::clean) moves CQEs in it, as
    /// libmlx5 does).
    pub unsafe fn new(cq: DirectCq) -> Result<Self, DirectError> {
        if cq.cqe_size != 64 && cq.cqe_size != 128 {
            return Err(DirectError::Cq("CQE size other than 64 or 128 bytes"));
        }
        if cq.buf.is_null() || cq.dbrec.is_null() {
            return Err(DirectError::Cq("a NULL buffer or doorbell record"));
        }
        if !cq.cqe_cnt.is_power_of_two() || cq.cqe_cnt > 1 << 23 {
            return Err(DirectError::Cq("cqe_cnt not a power of two up to 2^23"));
        }
        let stride = cq.cqe_size as usize;
        let buf64 = cq.buf.wrapping_add(stride - 64);
        Ok(Self {
            cq: CqState {
                buf64,
                stride,
                shift: stride.trailing_zeros(),
                end: buf64.wrapping_add(cq.cqe_cnt as usize * stride),
                mask: cq.cqe_cnt - 1,
                cqe_cnt: cq.cqe_cnt,
                dbrec: cq.dbrec,
                cons: cq.cons_index,
                cqn: cq.cqn,
                last: 0,
                last_rq: 0,
                qps: [NO_QP; MAX_QPS],
                rqs: [NO_RQ; MAX_QPS],
                srqs: [NO_SRQ; MAX_SRQS],
            },
            wcs: [Completion::PLACEHOLDER; B],
        })
    }

    /// Serves the send queue `sq` (its QP number and `wrid` table) from now on.
    ///
    /// # Safety
    /// `sq.wrid` (`sq.wqe_cnt` entries) stays valid while attached; it is the table of the
    /// one [`DirectRing`](super::DirectRing) posting to that SQ.
    pub unsafe fn attach(&mut self, sq: &DirectSq) -> Result<(), DirectError> {
        if sq.wrid.is_null() || !sq.wqe_cnt.is_power_of_two() {
            return Err(DirectError::Sq(
                "a NULL wrid table or wqe_cnt not a power of two",
            ));
        }
        let slot = QpSlot {
            qpn: sq.qp_num,
            mask: sq.wqe_cnt - 1,
            wrid: sq.wrid,
        };
        if let Some(s) = self.cq.qps.iter_mut().find(|s| s.qpn == sq.qp_num) {
            *s = slot;
            return Ok(());
        }
        match self.cq.qps.iter_mut().find(|s| s.wrid.is_null()) {
            Some(s) => {
                *s = slot;
                Ok(())
            }
            None => Err(DirectError::TooManyQps),
        }
    }

    /// Serves the receive queue `rq` of QP `qpn` from now on (issue 30): its responder CQEs
    /// (SEND, SEND with immediate or invalidate, RDMA WRITE with immediate, receive errors
    /// and flushes) become completions as `mlx5_poll_cq` makes them (`wr_id` from `rq.wrid`
    /// at the CQE's `wqe_counter`, [`RecvCqe`](super::rq::RecvCqe)'s fields), and a payload
    /// the device scattered into the CQE is copied into the receive's buffers, as libmlx5
    /// does. The [`DirectRq`](super::rq::DirectRq) posting to the queue retires its
    /// receives in order ([`complete`](super::rq::DirectRq::complete)) as their completions
    /// arrive. Receives of an SRQ are not served (refused as
    /// [`DirectError::CqeOpcode`]).
    ///
    /// # Safety
    /// While attached: `rq.wrid` and `rq.buf` stay valid and belong to the one
    /// `DirectRq` posting to that RQ; every buffer a posted receive names stays writable
    /// and is not accessed by anyone else until its completion is polled (a poll may copy
    /// into it).
    pub unsafe fn attach_rq(
        &mut self,
        qpn: u32,
        rq: &super::rq::DirectRqDesc,
    ) -> Result<(), DirectError> {
        if rq.wrid.is_null()
            || rq.buf.is_null()
            || !rq.wqe_cnt.is_power_of_two()
            || !rq.stride.is_power_of_two()
            || rq.stride < 16
        {
            return Err(DirectError::Sq(
                "a receive queue with a NULL buffer or wrid table, or a wqe_cnt or stride \
                 that is not a power of two",
            ));
        }
        let slot = RqSlot {
            qpn,
            mask: rq.wqe_cnt - 1,
            wrid: rq.wrid,
            buf: rq.buf,
            shift: rq.stride.trailing_zeros(),
            max_gs: rq.stride / 16,
        };
        let free = self
            .cq
            .rqs
            .iter()
            .position(|s| s.qpn == qpn)
            .or_else(|| self.cq.rqs.iter().position(|s| s.wrid.is_null()));
        match free {
            Some(i) => {
                self.cq.rqs[i] = slot;
                Ok(())
            }
            None => Err(DirectError::TooManyQps),
        }
    }

    /// Serves the SRQ `srqn` from now on (issue 30): its responder CQEs (`srqn` in the
    /// CQE) complete the receive at their `wqe_counter` (its `wr_id` from `srq.wrid`), free
    /// that WQE in `srq.free` (as `mlx5_poll_cq` calls `mlx5_free_srq_wqe`), and a payload
    /// scattered into the CQE is copied through the WQE's segments.
    ///
    /// # Safety
    /// While attached: `srq.wrid`, `srq.buf` and `srq.free` stay valid and belong to the
    /// one [`DirectSrq`](super::DirectSrq) posting to that SRQ (which may post from
    /// another thread: the bitmap is accessed atomically on both sides, and the poll reads
    /// only the `wrid` entries and WQEs of outstanding receives, which the queue does not
    /// write); every buffer a posted receive names stays writable and is not accessed by
    /// anyone else until its completion is polled.
    pub unsafe fn attach_srq(
        &mut self,
        srqn: u32,
        srq: &super::srq::DirectSrqDesc,
    ) -> Result<(), DirectError> {
        if srqn == 0
            || srq.wrid.is_null()
            || srq.buf.is_null()
            || srq.free.is_null()
            || !srq.nwqes.is_power_of_two()
            || !srq.stride.is_power_of_two()
            || srq.stride < 32
        {
            return Err(DirectError::Sq(
                "an SRQ numbered 0, with a NULL buffer, wrid table or bitmap, or an nwqes or \
                 stride that is not a power of two",
            ));
        }
        let slot = SrqSlot {
            srqn,
            nwqes: srq.nwqes,
            wrid: srq.wrid,
            buf: srq.buf,
            shift: srq.stride.trailing_zeros(),
            free: srq.free,
        };
        let at = self
            .cq
            .srqs
            .iter()
            .position(|s| s.srqn == srqn)
            .or_else(|| self.cq.srqs.iter().position(|s| s.wrid.is_null()));
        match at {
            Some(i) => {
                self.cq.srqs[i] = slot;
                Ok(())
            }
            None => Err(DirectError::TooManyQps),
        }
    }

    /// Stops serving the SRQ `srqn` (its CQEs become [`DirectError::UnknownSrq`]).
    pub fn detach_srq(&mut self, srqn: u32) {
        for s in self.cq.srqs.iter_mut().filter(|s| s.srqn == srqn) {
            *s = NO_SRQ;
        }
    }

    /// Stops serving the QP `qpn`, its send and its receive queue (its CQEs become
    /// [`DirectError::UnknownQp`]).
    pub fn detach(&mut self, qpn: u32) {
        for s in self.cq.qps.iter_mut().filter(|s| s.qpn == qpn) {
            *s = NO_QP;
        }
        for s in self.cq.rqs.iter_mut().filter(|s| s.qpn == qpn) {
            *s = NO_RQ;
        }
    }

    /// libmlx5's `cons_index`: CQEs consumed since the CQ was created.
    #[inline(always)]
    pub fn cons_index(&self) -> u32 {
        self.cq.cons
    }

    /// Removes the CQEs of QP `qpn` the poller has not consumed yet, as libmlx5's
    /// `__mlx5_cq_clean` does when a QP moves to RESET or is destroyed; returns how many.
    ///
    /// libmlx5 skips that clean on a CQ that went through `mlx5dv_init_obj(3)` (it marks
    /// the CQ `MLX5_CQ_FLAGS_DV_OWNED`: its own consumer index no longer follows the CQ),
    /// so after a direct poller the QP's CQEs stay in the CQ. Left there, the next polls
    /// would read them against the ring's `wrid` table, whose entries the reset ring
    /// reuses: a stale flush would retire a new WR. So: reset the QP, call this, then reset
    /// the ring ([`DirectRing::reset`](super::DirectRing::reset), whose contract asks for
    /// it; the setup layer's `DirectRing::reset_qp` does all three).
    ///
    /// The same walk as libmlx5's, from this poller's consumer index: find the run of
    /// software-owned CQEs, sweep it backwards moving every other QP's CQE over the freed
    /// ones (each keeps the owner bit of the slot it lands in), advance the consumer index
    /// by the number freed and write it to the doorbell record. `cargo xtask golden`
    /// compares the resulting CQ bytes, consumer index and doorbell record with libmlx5's
    /// own function. One difference: libmlx5 stops its scan one CQE short of a completely
    /// full CQ (`cqe_cnt` unconsumed entries), leaving the last one in place; this walks
    /// all of them.
    pub fn clean(&mut self, qpn: u32) -> u32 {
        self.cq.clean(qpn)
    }

    /// Up to `B` completions; an empty slice when the CQ is empty. An entry the poller
    /// does not model is an error once the completions before it were returned.
    #[inline]
    pub fn poll(&mut self) -> Result<&mut [Completion], DirectError> {
        let n = self.cq.poll_into(&mut self.wcs)?;
        // Unchecked: a clamp here (`n.min(B)`) was three instructions a poll (`cargo xtask
        // insn`, the direct poller's row).
        // SAFETY: `CqState::poll_into` writes at most `out.len()` (here B) entries and
        // returns how many it wrote, so `..n` is inside `wcs`.
        Ok(unsafe { self.wcs.get_unchecked_mut(..n) })
    }

    /// Up to `out.len()` completions into a caller-owned array; returns how many.
    #[inline]
    pub fn poll_into(&mut self, out: &mut [Completion]) -> Result<usize, DirectError> {
        self.cq.poll_into(out)
    }
}

/// The CQ as a [`RecvSession`](super::RecvSession) reads it: where CQE `cons` is, its
/// owner bit on that pass, and the doorbell record.
#[derive(Clone, Copy, Debug)]
pub(super) struct RxView {
    buf64: *const u8,
    shift: u32,
    mask: u32,
    /// `log2(cqe_cnt)`: the owner bit of index `cons` is `cons >> pass_shift & 1`.
    pass_shift: u32,
    dbrec: *mut u32,
}

impl RxView {
    /// The 64-byte half of CQE `cons` (inside the buffer: the index is masked).
    #[inline(always)]
    pub(super) fn cqe(&self, cons: u32) -> *const u8 {
        self.buf64
            .wrapping_add(((cons & self.mask) as usize) << self.shift)
    }

    /// True for 128-byte CQEs.
    pub(super) fn is_128(&self) -> bool {
        self.shift == 7
    }

    /// The owner bit software owns CQE `cons` with.
    #[inline(always)]
    pub(super) fn owner(&self, cons: u32) -> u8 {
        (cons >> self.pass_shift) as u8 & 1
    }

    /// Publishes the consumer index `cons` (`update_cons_index`).
    ///
    /// # Safety
    /// The CQ is live and this poller's (its `new` contract).
    #[inline(always)]
    pub(super) unsafe fn publish(&self, cons: u32) {
        // SAFETY: the CQ's doorbell record (the caller's contract).
        unsafe {
            self.dbrec
                .add(super::CQ_SET_CI)
                .write_volatile((cons & 0xff_ffff).to_be())
        };
    }
}

impl<const B: usize> DirectPoller<B> {
    /// The CQ's geometry for a receive session.
    pub(super) fn rx_view(&self) -> RxView {
        RxView {
            buf64: self.cq.buf64,
            shift: self.cq.shift,
            mask: self.cq.mask,
            pass_shift: self.cq.cqe_cnt.trailing_zeros(),
            dbrec: self.cq.dbrec,
        }
    }

    /// The consumer index.
    #[inline(always)]
    pub(super) fn rx_cons(&self) -> u32 {
        self.cq.cons
    }

    /// A session consumed up to `cons` (the doorbell record follows at its next publish).
    #[inline(always)]
    pub(super) fn set_rx_cons(&mut self, cons: u32) {
        self.cq.cons = cons;
    }

    /// True when the receive queue of QP `qpn` with this `wrid` table is attached.
    pub(super) fn serves_rq(&self, qpn: u32, wrid: *const u64) -> bool {
        self.cq
            .rqs
            .iter()
            .any(|s| s.qpn == qpn && core::ptr::eq(s.wrid, wrid))
    }
}

/// Per WQE opcode (the low 5 bits of a requester CQE's `sop_drop_qpn >> 24`), as libmlx5's
/// `handle_good_req`: `ibv_wc_opcode` in bits 0..8, `wc_flags` in 8..16, and the byte_len
/// rule in 16..24 (0: left 0; 1: the CQE's `byte_cnt` (READ); 2: 8 (atomics)).
const REQ_WC: [u32; 32] = {
    const fn e(op: u32, flags: u32, rule: u32) -> u32 {
        op | flags << 8 | rule << 16
    }
    let mut t = [e(IBV_WC_SEND, 0, 0); 32];
    t[super::opcode::RDMA_WRITE as usize] = e(IBV_WC_RDMA_WRITE, 0, 0);
    t[super::opcode::RDMA_WRITE_IMM as usize] = e(IBV_WC_RDMA_WRITE, IBV_WC_WITH_IMM, 0);
    t[super::opcode::SEND_IMM as usize] = e(IBV_WC_SEND, IBV_WC_WITH_IMM, 0);
    t[super::opcode::RDMA_READ as usize] = e(IBV_WC_RDMA_READ, 0, 1);
    t[super::opcode::ATOMIC_CS as usize] = e(IBV_WC_COMP_SWAP, 0, 2);
    t[super::opcode::ATOMIC_FA as usize] = e(IBV_WC_FETCH_ADD, 0, 2);
    t
};

/// `REQ_WC` entries whose `byte_len` rule is "the CQE's byte count" (READ).
const RULE_READ: u32 = 1 << 16;

/// The `ibv_wc` words a successful requester CQE of each WQE opcode gives, ready to store:
/// `[status | opcode << 32, vendor_err | byte_len << 32, src_qp | wc_flags << 32]` (the
/// words at offsets 8, 16 and 32; READ's byte_len comes from the CQE, on the slow path).
const REQ_WORDS: [[u64; 3]; 32] = {
    let mut t = [[0u64; 3]; 32];
    let mut i = 0;
    while i < 32 {
        let e = REQ_WC[i];
        let byte_len = if (e >> 16) == 2 { 8u64 } else { 0 };
        t[i] = [
            ((e & 0xff) as u64) << 32,
            byte_len << 32,
            (((e >> 8) & 0xff) as u64) << 32,
        ];
        i += 1;
    }
    t
};

/// Stores the five words of a successful send completion (fields a send completion does
/// not define, `imm_data` and those after `wc_flags`, are left as they are except
/// `imm_data`, zeroed, and `src_qp`, zeroed).
///
/// # Safety
/// `wc` is a valid, writable `ibv_wc` (48 bytes, 8-aligned).
#[inline(always)]
unsafe fn store_words(wc: *mut ibv_wc, wr_id: u64, w: &[u64; 3], qpn_hi: u64) {
    let p = wc.cast::<u64>();
    // SAFETY: the caller's contract; offsets 0, 8, 16, 24 and 32 are inside the struct
    // (the static asserts in `wc_layout` pin them).
    unsafe {
        p.write(wr_id);
        p.add(1).write(w[0]);
        p.add(2).write(w[1]);
        p.add(3).write(qpn_hi);
        p.add(4).write(w[2]);
    }
}

const _: () = {
    assert!(core::mem::size_of::<ibv_wc>() == 48);
    assert!(core::mem::offset_of!(ibv_wc, status) == 8);
    assert!(core::mem::offset_of!(ibv_wc, opcode) == 12);
    assert!(core::mem::offset_of!(ibv_wc, vendor_err) == 16);
    assert!(core::mem::offset_of!(ibv_wc, byte_len) == 20);
    assert!(core::mem::offset_of!(ibv_wc, qp_num) == 28);
    assert!(core::mem::offset_of!(ibv_wc, src_qp) == 32);
    assert!(core::mem::offset_of!(ibv_wc, wc_flags) == 36);
};

/// The CQE pointer wrapped to the start of the buffer: the next pass, the other owner bit.
/// Out of line so that the loop tests and branches (once per `cqe_cnt` CQEs) instead of
/// computing both outcomes.
#[cold]
#[inline(never)]
fn wrap(buf: *const u8, owner: u8) -> (*const u8, u8) {
    (buf, owner ^ 1)
}

impl CqState {
    /// The CQE at consumer index `cons` (its 64-byte half with the fields) and the owner
    /// bit software owns it with on this pass.
    #[inline(always)]
    fn cursor(&self, cons: u32) -> (*const u8, u8) {
        (
            self.buf64
                .wrapping_add(((cons & self.mask) as usize) << self.shift),
            ((cons & self.cqe_cnt) != 0) as u8,
        )
    }

    /// [`DirectPoller::clean`].
    #[cold]
    fn clean(&mut self, qpn: u32) -> u32 {
        let cons = self.cons;
        // The run of CQEs the device wrote and we did not consume: at most cqe_cnt.
        let mut prod = cons;
        while prod.wrapping_sub(cons) < self.cqe_cnt {
            let (c, owner) = self.cursor(prod);
            // SAFETY: a CQE of the buffer (new's contract).
            let op_own = unsafe { c.add(cqe::OFF_OP_OWN).read_volatile() };
            if op_own >> 4 == cqe::INVALID || op_own & cqe::OWNER_MASK != owner {
                break;
            }
            prod = prod.wrapping_add(1);
        }
        from_device_barrier();
        let mut freed = 0u32;
        while prod != cons {
            prod = prod.wrapping_sub(1);
            let (c, _) = self.cursor(prod);
            // SAFETY: inside the CQE, read after the barrier.
            let sop =
                u32::from_be(unsafe { c.add(cqe::OFF_SOP_DROP_QPN).cast::<u32>().read_volatile() });
            if sop & 0xff_ffff == qpn {
                freed += 1;
                // A receive of an attached SRQ: its WQE is free again (as libmlx5's
                // `free_res_cqe` with `cqe_version` 0: `srqn` non-zero).
                // SAFETY: inside the CQE, read after the barrier.
                let srqn =
                    u32::from_be(unsafe { c.add(32).cast::<u32>().read_volatile() }) & 0xff_ffff;
                if srqn != 0 {
                    if let Some(s) = self
                        .srqs
                        .iter()
                        .find(|s| s.srqn == srqn && !s.wrid.is_null())
                    {
                        // SAFETY: inside the CQE.
                        let ctr = u16::from_be(unsafe { c.add(60).cast::<u16>().read_volatile() });
                        if u32::from(ctr) < s.nwqes {
                            free_srq_wqe(s.free, u32::from(ctr));
                        }
                    }
                }
            } else if freed != 0 {
                let (d, _) = self.cursor(prod.wrapping_add(freed));
                // The whole CQE moves (both halves of a 128-byte one, as libmlx5's
                // `memcpy(dest, cqe, cqe_sz)`); the owner bit is the 64-byte half's.
                let back = self.stride - 64;
                let src = c.wrapping_sub(back).cast::<u64>();
                let dst = d.cast_mut().wrapping_sub(back).cast::<u64>();
                // SAFETY: two distinct CQEs of `stride` bytes in the buffer, 8-aligned (the
                // buffer is page-aligned, CQEs 64 or 128 bytes), the buffer writable (new's
                // contract); the slot `d` is one the device wrote and we did not consume, so
                // the device does not write it now.
                unsafe {
                    let owner = d.add(cqe::OFF_OP_OWN).read_volatile() & cqe::OWNER_MASK;
                    for i in 0..self.stride / 8 {
                        dst.add(i).write_volatile(src.add(i).read_volatile());
                    }
                    let op = d.cast_mut().add(cqe::OFF_OP_OWN);
                    op.write_volatile(op.read_volatile() & !cqe::OWNER_MASK | owner);
                }
            }
        }
        if freed != 0 {
            self.cons = cons.wrapping_add(freed);
            // The moved CQEs before the consumer index that frees their old slots.
            super::to_device_barrier();
            // SAFETY: the CQ's doorbell record (new's contract).
            unsafe {
                self.dbrec
                    .add(super::CQ_SET_CI)
                    .write_volatile((self.cons & 0xff_ffff).to_be())
            };
        }
        freed
    }

    /// The common case inline (a successful requester CQE of the cached QP that is not a
    /// READ); everything else, one CQE at a time, in [`slow_one`](Self::slow_one).
    ///
    /// Per CQE the fast path is: the owner byte (against the pass's owner bit, tracked with
    /// a CQE pointer that wraps, instead of recomputed from `cons`), the barrier, the raw
    /// big-endian `sop_drop_qpn` word compared with the one of the previous completion of
    /// this poll (same QP and WQE opcode: the same `ibv_wc` words, already in registers),
    /// the `wrid` table at `wqe_counter`, and five stores.
    ///
    /// Returns how many entries of `out` it wrote: at most `out.len()` (`DirectPoller::poll`
    /// relies on it).
    #[inline(always)]
    fn poll_into(&mut self, out: &mut [Completion]) -> Result<usize, DirectError> {
        let buf = self.buf64.cast_const();
        // `c` stays inside the buffer of `cqe_cnt` CQEs (new's contract), one CQE's 64-byte
        // half at a time, wrapping to `buf` at `end`.
        let (end, stride) = (self.end, self.stride);
        // `cons` is always `base + n`: the loop counts only `n`.
        let base = self.cons;
        let (mut c, mut owner) = self.cursor(base);
        let mut slot = self.qps[self.last % MAX_QPS];
        // The raw `sop_drop_qpn` of the last fast completion (u64::MAX: none yet; no u32
        // equals it) and its words.
        let mut hit_raw = u64::MAX;
        let mut words = [0u64; 3];
        let wcs = out.as_mut_ptr();
        // One past the last entry: the loop walks a pointer (`n` is `p - wcs`).
        let pend = wcs.wrapping_add(out.len());
        let mut p = wcs;
        let mut err = None;
        while p != pend {
            // SAFETY: `c` is a CQE of the buffer; the device writes op_own last, so read it
            // first.
            let op_own = unsafe { c.add(cqe::OFF_OP_OWN).read_volatile() };
            // Opcode REQ (high nibble 0), plain format (bits 2..3 clear) and the owner bit of
            // this pass, in one test.
            let x = op_own ^ owner;
            if x & 0xfd == 0 {
                from_device_barrier();
                // SAFETY: inside the CQE, read after the barrier.
                let (raw, ctr) = unsafe {
                    (
                        c.add(cqe::OFF_SOP_DROP_QPN).cast::<u32>().read_volatile(),
                        u16::from_be(c.add(cqe::OFF_WQE_COUNTER).cast::<u16>().read_volatile()),
                    )
                };
                let fast = raw as u64 == hit_raw || {
                    let sop = u32::from_be(raw);
                    let op = (sop >> 24) as usize & 31;
                    let ok = sop & 0xff_ffff == slot.qpn && REQ_WC[op] & RULE_READ == 0;
                    if ok {
                        hit_raw = raw as u64;
                        words = REQ_WORDS[op];
                    }
                    ok
                };
                if fast {
                    // SAFETY: `ctr & mask` < wqe_cnt entries of the attached table.
                    let wr_id = unsafe { slot.wrid.add((ctr as u32 & slot.mask) as usize).read() };
                    // SAFETY: p != pend: `p` is a valid Completion of `out`
                    // (repr(transparent) ibv_wc).
                    unsafe { store_words((*p).raw_mut(), wr_id, &words, (slot.qpn as u64) << 32) };
                    p = p.wrapping_add(1);
                    c = c.wrapping_add(stride);
                    if c == end {
                        (c, owner) = wrap(buf, owner);
                    }
                    continue;
                }
            } else if x & cqe::OWNER_MASK != 0 || x >> 4 == cqe::INVALID {
                // The device has not written this CQE: the end of what there is (how most
                // polls end), without the out-of-line slow path.
                break;
            }
            // SAFETY: `p` is inside `out` (p != pend), as is `wcs`.
            let n = unsafe { p.offset_from(wcs) } as u32;
            self.cons = base.wrapping_add(n);

            // SAFETY: p != pend, as above.
            match self.slow_one(unsafe { &mut *p }) {
                Ok(true) => {
                    (c, owner) = self.cursor(self.cons);
                    slot = self.qps[self.last % MAX_QPS];
                    hit_raw = u64::MAX;
                    p = p.wrapping_add(1);
                }
                Ok(false) => break,
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        // SAFETY: `p` is in `wcs ..= pend`, one allocation.
        let n = unsafe { p.offset_from(wcs) } as usize;
        let cons = base.wrapping_add(n as u32);
        self.cons = cons;
        // SAFETY: the CQ's doorbell record (new's contract).
        unsafe {
            self.dbrec
                .add(super::CQ_SET_CI)
                .write_volatile((cons & 0xff_ffff).to_be())
        };
        match err {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }

    /// A good responder CQE of an RQ this poller serves, at `self.cons` (`c`: its 64-byte
    /// half, written: its owner bit checked), completed into `out` with the fields
    /// `handle_responder` sets (as `RecvCqe::decode` reads them; the golden run compares
    /// both with libmlx5): `true`, the CQE consumed. `false` for anything else (an SRQ's, a
    /// QP no queue was attached for, a payload it cannot copy), left to the full path.
    ///
    /// # Safety
    /// `c` is the CQE at `self.cons`, inside the buffer, its opcode a good receive's.
    #[inline(always)]
    unsafe fn resp_fast(&mut self, c: *const u8, out: &mut Completion) -> bool {
        use super::rq::scatter_wqe;
        from_device_barrier();
        let rd = |o: usize| -> u32 {
            // SAFETY: a 4-byte field inside the CQE (the caller's contract), 4-aligned.
            u32::from_be(unsafe { c.add(o).cast::<u32>().read_volatile() })
        };
        let (srqn, sop) = (rd(32), rd(56));
        if srqn & 0xff_ffff != 0 {
            return false;
        }
        let qpn = sop & 0xff_ffff;
        let mut k = self.last_rq % MAX_QPS;
        if self.rqs[k].qpn != qpn || self.rqs[k].wrid.is_null() {
            match self
                .rqs
                .iter()
                .position(|s| s.qpn == qpn && !s.wrid.is_null())
            {
                Some(i) => {
                    self.last_rq = i;
                    k = i;
                }
                None => return false,
            }
        }
        let slot = self.rqs[k];
        // SAFETY: the op_own byte and the 2-byte counter inside the CQE.
        let (op_own, ctr) = unsafe {
            (
                c.add(cqe::OFF_OP_OWN).read_volatile(),
                u16::from_be(c.add(cqe::OFF_WQE_COUNTER).cast::<u16>().read_volatile()),
            )
        };
        let idx = u32::from(ctr) & slot.mask;
        let byte_len = rd(44);
        let mut status = IBV_WC_SUCCESS;
        if op_own & super::cqe::FORMAT_MASK != 0 {
            let mut data = [0u8; 32];
            for (i, x) in data.chunks_exact_mut(8).enumerate() {
                // SAFETY: the CQE's first 32 bytes, 8-aligned.
                let w = unsafe { c.cast::<u64>().add(i).read_volatile() };
                x.copy_from_slice(&w.to_ne_bytes());
            }
            let n = (byte_len as usize).min(32);
            // SAFETY: idx < wqe_cnt: a WQE of the attached queue, whose buffers are
            // writable and the device's until this completion (attach_rq's contract).
            let wqe = unsafe { slot.buf.add((idx as usize) << slot.shift) };
            // SAFETY: as above; `data` is ours.
            if let Err(e) = unsafe { scatter_wqe(wqe, slot.max_gs, &data[..n]) } {
                status = e;
            }
        }
        // SAFETY: idx < wqe_cnt entries of the attached table.
        let wr_id = unsafe { slot.wrid.add(idx as usize).read() };
        let (flags_rqpn, imm_raw) = (rd(24), rd(36).to_be());
        let opcode = op_own >> 4;
        let mut flags = if opcode == cqe::RESP_SEND {
            0
        } else {
            IBV_WC_WITH_IMM
        };
        if (flags_rqpn >> 28) & 3 != 0 {
            flags |= IBV_WC_GRH;
        }
        // SAFETY: the ml_path byte and the 2-byte slid inside the CQE.
        let (ml_path, slid) = unsafe {
            (
                c.add(17).read_volatile(),
                u16::from_be(c.add(22).cast::<u16>().read_volatile()),
            )
        };
        self.cons = self.cons.wrapping_add(1);
        let wc = out.raw_mut();
        wc.wr_id = wr_id;
        wc.status = status;
        wc.qp_num = qpn;
        wc.vendor_err = 0;
        wc.opcode = if opcode == cqe::RESP_WR_IMM {
            IBV_WC_RECV_RDMA_WITH_IMM
        } else {
            IBV_WC_RECV
        };
        wc.byte_len = byte_len;
        wc.wc_flags = flags;
        wc.__bindgen_anon_1.imm_data = imm_raw;
        wc.src_qp = flags_rqpn & 0xff_ffff;
        wc.slid = slid;
        wc.sl = ((flags_rqpn >> 24) & 0xf) as u8;
        wc.dlid_path_bits = ml_path & 0x7f;
        wc.pkey_index = (u32::from_be(imm_raw) & 0xffff) as u16;
        true
    }

    /// The CQE at `cons`, whatever it is: `Ok(false)` when the device has not written it,
    /// `Ok(true)` with `out` filled and the CQE consumed, or the refusal (CQE left in place).
    #[cold]
    #[inline(never)]
    fn slow_one(&mut self, out: &mut Completion) -> Result<bool, DirectError> {
        let cons = self.cons;
        // `cons & mask` < cqe_cnt: the CQE is inside the buffer (new's contract).
        let (c, _) = self.cursor(cons);
        // SAFETY: as above; the device writes op_own last, so read it first.
        let op_own = unsafe { c.add(cqe::OFF_OP_OWN).read_volatile() };
        let opcode = op_own >> 4;
        if opcode == cqe::INVALID
            || (op_own & cqe::OWNER_MASK) != ((cons & self.cqe_cnt) != 0) as u8
        {
            return Ok(false);
        }
        // A good receive of an attached RQ (SEND, SEND with immediate, WRITE with
        // immediate; in the slot or 32 bytes in the CQE): the receive path, without the
        // whole CQE's decode (issue 30's per-message target). Here rather than in the poll
        // loop, which it would slow for send completions.
        if matches!(op_own & 0xfc, 0x10 | 0x20 | 0x30 | 0x14 | 0x24 | 0x34) {
            // SAFETY: `c` is the CQE at `self.cons`, written (checked above).
            if unsafe { self.resp_fast(c, out) } {
                return Ok(true);
            }
        }
        from_device_barrier();
        if matches!(
            opcode,
            cqe::RESP_WR_IMM
                | cqe::RESP_SEND
                | cqe::RESP_SEND_IMM
                | cqe::RESP_SEND_INV
                | cqe::RESP_ERR
        ) {
            return self.responder(c, cons, out);
        }
        if op_own & cqe::FORMAT_MASK != 0 {
            return Err(DirectError::CqeFormat {
                op_own,
                index: cons,
            });
        }
        // SAFETY: the whole 64-byte CQE is inside the buffer; read after the barrier.
        let (sop, ctr) = unsafe {
            (
                u32::from_be(c.add(cqe::OFF_SOP_DROP_QPN).cast::<u32>().read_volatile()),
                u16::from_be(c.add(cqe::OFF_WQE_COUNTER).cast::<u16>().read_volatile()),
            )
        };
        let qpn = sop & 0xff_ffff;
        let Some(i) = self
            .qps
            .iter()
            .position(|s| s.qpn == qpn && !s.wrid.is_null())
        else {
            return Err(DirectError::UnknownQp(qpn));
        };
        self.last = i;
        let slot = self.qps[i];
        let (status, vendor_err, op, flags, byte_len) = if opcode == cqe::REQ {
            let e = REQ_WC[(sop >> 24) as usize & 31];
            let byte_len = match e >> 16 {
                // SAFETY: inside the CQE, read after the barrier.
                1 => unsafe {
                    u32::from_be(c.add(cqe::OFF_BYTE_CNT).cast::<u32>().read_volatile())
                },
                2 => 8,
                _ => 0,
            };
            (IBV_WC_SUCCESS, 0, e & 0xff, (e >> 8) & 0xff, byte_len)
        } else if opcode == cqe::REQ_ERR {
            // SAFETY: inside the CQE, read after the barrier.
            let (synd, vendor) = unsafe {
                (
                    c.add(cqe::OFF_SYNDROME).read_volatile(),
                    c.add(cqe::OFF_VENDOR_ERR).read_volatile(),
                )
            };
            (syndrome_status(synd), vendor as u32, IBV_WC_SEND, 0, 0)
        } else {
            return Err(DirectError::CqeOpcode {
                opcode,
                index: cons,
            });
        };
        // SAFETY: `ctr & mask` < wqe_cnt entries of the attached table (attach's contract).
        let wr_id = unsafe { slot.wrid.add((ctr as u32 & slot.mask) as usize).read() };
        self.cons = cons.wrapping_add(1);
        let wc = out.raw_mut();
        wc.wr_id = wr_id;
        wc.status = status;
        wc.opcode = op;
        wc.vendor_err = vendor_err;
        wc.byte_len = byte_len;
        wc.qp_num = qpn;
        wc.wc_flags = flags;
        // Undefined for a send completion: the CQE's `wqe_counter`, where a session's WR
        // is found when its `wrid` entry is not written yet (`DirectRing::on_completion`).
        wc.pkey_index = ctr;
        Ok(true)
    }

    /// The payload the device scattered into a responder CQE (`inline`: where), as
    /// bytes and how many the CQE holds: 32 from the 64-byte half `c` (its bytes `b`), or
    /// the 64 before it in a 128-byte CQE; a 64-byte scatter in a 64-byte CQE is refused.
    ///
    /// # Safety
    /// `c` is a CQE's 64-byte half inside the buffer, read after the barrier.
    unsafe fn inline_payload(
        &self,
        c: *const u8,
        b: &[u8; 64],
        inline: super::rq::InlineScatter,
        cons: u32,
    ) -> Result<([u8; 64], usize), DirectError> {
        let mut data = [0u8; 64];
        let len = match inline {
            super::rq::InlineScatter::In32 => {
                data[..32].copy_from_slice(&b[..32]);
                32
            }
            _ if self.stride == 128 => {
                for (i, x) in data.iter_mut().enumerate() {
                    // SAFETY: the first half of this 128-byte CQE, inside the buffer.
                    *x = unsafe { c.sub(64).add(i).read_volatile() };
                }
                64
            }
            _ => {
                return Err(DirectError::CqeFormat {
                    op_own: b[cqe::OFF_OP_OWN],
                    index: cons,
                })
            }
        };
        Ok((data, len))
    }

    /// A responder CQE of an SRQ: the WQE at `wqe_counter` (no mask: an SRQ index), its
    /// bit set in the free bitmap, a scattered payload copied through its segments.
    #[cold]
    #[inline(never)]
    fn responder_srq(
        &mut self,
        c: *const u8,
        b: &[u8; 64],
        r: &super::rq::RecvCqe,
        cons: u32,
        out: &mut Completion,
    ) -> Result<bool, DirectError> {
        use super::rq::{scatter_wqe, InlineScatter};
        let Some(slot) = self
            .srqs
            .iter()
            .find(|s| s.srqn == r.srqn && !s.wrid.is_null())
            .copied()
        else {
            return Err(DirectError::UnknownSrq(r.srqn));
        };
        let idx = u32::from(r.wqe_counter);
        if r.status == IBV_WC_REM_ABORT_ERR && r.vendor_err == 0x93 {
            // An ODP page fault on an SRQ WQE (`MLX5_CQE_VENDOR_SYNDROME_ODP_PFAULT`):
            // libmlx5 reposts the WQE through its wait queue inside the poll and reports
            // nothing; not modelled here: refused, left in place.
            return Err(DirectError::CqeOpcode {
                opcode: b[cqe::OFF_OP_OWN] >> 4,
                index: cons,
            });
        }
        if idx >= slot.nwqes {
            return Err(DirectError::CqeFormat {
                op_own: b[cqe::OFF_OP_OWN],
                index: cons,
            });
        }
        // SAFETY: idx < nwqes entries of the attached table.
        let wr_id = unsafe { slot.wrid.add(idx as usize).read() };
        free_srq_wqe(slot.free, idx);
        let mut status = r.status;
        if status == IBV_WC_SUCCESS && r.inline != InlineScatter::No {
            // SAFETY: `c` is this CQE's 64-byte half, read after the barrier.
            let (data, len) = unsafe { self.inline_payload(c, b, r.inline, cons)? };
            let n = (r.byte_len as usize).min(len);
            // SAFETY: idx < nwqes: a WQE of the attached SRQ; its data segments follow the
            // 16-byte next segment (attach_srq's contract: the buffers are writable).
            let segs = unsafe { slot.buf.add(((idx as usize) << slot.shift) + 16) };
            // SAFETY: as above; `data` is ours.
            if let Err(s) = unsafe { scatter_wqe(segs, (1 << slot.shift) / 16 - 1, &data[..n]) } {
                status = s;
            }
        }
        self.cons = cons.wrapping_add(1);
        recv_wc(out, wr_id, status, r);
        Ok(true)
    }

    /// A responder CQE at `cons` (`c`: its 64-byte half, read after the barrier): the
    /// completion of a receive of an attached RQ, as libmlx5's `handle_responder` and
    /// error path make it.
    #[cold]
    #[inline(never)]
    fn responder(
        &mut self,
        c: *const u8,
        cons: u32,
        out: &mut Completion,
    ) -> Result<bool, DirectError> {
        use super::rq::{scatter_wqe, InlineScatter, RecvCqe};
        let mut b = [0u8; 64];
        for (i, x) in b.chunks_exact_mut(8).enumerate() {
            // SAFETY: the CQE's 64 bytes are inside the buffer (new's contract), 8-aligned
            // (the buffer is page-aligned, CQEs 64 or 128 bytes): eight 8-byte reads.
            let w = unsafe { c.cast::<u64>().add(i).read_volatile() };
            x.copy_from_slice(&w.to_ne_bytes());
        }
        let op_own = b[cqe::OFF_OP_OWN];
        let Some(r) = RecvCqe::decode(&b) else {
            return Err(DirectError::CqeFormat {
                op_own,
                index: cons,
            });
        };
        if r.srqn != 0 {
            return self.responder_srq(c, &b, &r, cons, out);
        }
        let Some(slot) = self
            .rqs
            .iter()
            .find(|s| s.qpn == r.qpn && !s.wrid.is_null())
            .copied()
        else {
            return Err(DirectError::UnknownQp(r.qpn));
        };
        let idx = u32::from(r.wqe_counter) & slot.mask;
        let mut status = r.status;
        if status == IBV_WC_SUCCESS && r.inline != InlineScatter::No {
            // SAFETY: `c` is this CQE's 64-byte half, read after the barrier.
            let (data, len) = unsafe { self.inline_payload(c, &b, r.inline, cons)? };
            let n = (r.byte_len as usize).min(len);
            // SAFETY: idx < wqe_cnt: a WQE of the attached queue, whose buffers are
            // writable and the device's until this completion (attach_rq's contract).
            let wqe = unsafe { slot.buf.add((idx as usize) << slot.shift) };
            // SAFETY: as above; `data` is ours.
            if let Err(s) = unsafe { scatter_wqe(wqe, slot.max_gs, &data[..n]) } {
                status = s;
            }
        }
        // SAFETY: idx < wqe_cnt entries of the attached table.
        let wr_id = unsafe { slot.wrid.add(idx as usize).read() };
        self.cons = cons.wrapping_add(1);
        recv_wc(out, wr_id, status, &r);
        Ok(true)
    }
}
