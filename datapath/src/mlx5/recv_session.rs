//! [`RecvSession`]: a direct receive ring and the direct poller of its CQ, fused into one
//! receive loop at the instruction floor (issue 30's per-message target), with the payload
//! handed out where the device put it: in the slot, or in the CQE itself (responder
//! scatter-to-CQE), without the copy libmlx5 makes.
//!
//! # Why this exists beside `poll_into` + `on_completion` + `release`
//! The general path builds a 48-byte [`Completion`] per CQE (every `ibv_wc` field
//! `handle_responder` sets), hands it to the ring, which decodes it again into a
//! [`Received`](crate::Received), checks its brand when the bytes are read and when the
//! slot is released, and reposts through the queue's generic post. Per message that is
//! about 440 instructions where libmlx5's `mlx5_post_recv` + `mlx5_poll_cq` take 380 to
//! 480 (`cargo xtask insn --filter receive`). A session knows, when it opens, the one QP
//! whose receives it takes, the CQ's and the queue's geometry and the ring's slots: per
//! message it reads four CQE fields and the `wrid` entry, and gives back a
//! [`Delivered`] whose other fields are read from the CQE only if asked.
//!
//! # The protocol
//! [`recv`](RecvSession::recv) first gives back the message the previous call delivered
//! (a [`Delivered`] borrows the session, so it is gone by then): its WQE is posted again
//! (preformatted: the slot's WQE is normally still at the head, so only the receive
//! counter moves) and the CQ's consumer index is published. Then it looks at the next CQE:
//! - a good SEND, SEND with immediate or RDMA WRITE with immediate of the ring's QP, in
//!   the slot or in the CQE (32 bytes, or 64 in the first half of a 128-byte CQE):
//!   [`Polled::Msg`], on the fast path;
//! - nothing written yet: [`Polled::Empty`];
//! - anything else goes through the poller's general path (one CQE): another ring's or a
//!   send's completion is [`Polled::Other`] (give it to its ring), a failed receive of
//!   this ring is [`RecvSessionError::Recv`] (its slot idle, as `on_completion` leaves
//!   it), a stale one is skipped, and a receive the general path completes (a SEND with
//!   invalidate, whose payload in the CQE it copies into the slot as libmlx5 does) is a
//!   [`Polled::Msg`] too.
//!
//! While a message is out its CQE is not released to the device (the CQ's doorbell record
//! stops before it), so a payload in the CQE stays put until the next `recv`.
//!
//! # State, and leaks
//! The poller's consumer index and the ring's completed count are written as each message
//! is taken; the ring's slots keep their states (a message the session holds stays
//! `POSTED` in the ring's books: it is posted again before anything else can look). The
//! receive counter lives in the session and goes back to the queue when the session ends.
//! If a session is leaked (`mem::forget`), the ring finds it open at its next repost and
//! takes the counter from the doorbell record (every counter the session stored, it
//! published there); the message the session held then, if any, stays out of circulation
//! until the ring's next [`reset`](crate::RecvRing::reset). Nothing is posted twice and
//! no slot is handed out while the device owns it.

use core::marker::PhantomData;

use hotverbs_ffi::*;

use super::cq::RxView;
use super::{cqe, from_device_barrier, to_device_barrier, DirectError, DirectPoller};
use crate::cq::Completion;
use crate::error::{PostError, RecvError};
use crate::recv::RecvRing;

/// No message held.
const NONE: u32 = u32::MAX;

/// `op_own ^ owner` values the fast path takes on a CQ of 64-byte CQEs (`FAST[0]`) and of
/// 128-byte ones (`FAST[1]`): owner bit of this pass (bit 0 clear), opcode RDMA WRITE
/// with immediate, SEND or SEND with immediate, solicited or not (bit 1), the payload in
/// the slot or 32 bytes in the CQE (bits 3..2: 0 or 1), or 64 bytes in the first half of
/// a 128-byte CQE (2, on 128-byte CQEs only: elsewhere that half is the CQE before).
static FAST: [[bool; 256]; 2] = {
    let mut t = [[false; 256]; 2];
    let mut x = 0;
    while x < 256 {
        let op = (x >> 4) as u8;
        let fmt = (x >> 2) & 3;
        let ok = x & 1 == 0
            && (op == cqe::RESP_WR_IMM || op == cqe::RESP_SEND || op == cqe::RESP_SEND_IMM);
        t[0][x] = ok && fmt <= 1;
        t[1][x] = ok && fmt <= 2;
        x += 1;
    }
    t
};

/// Bytes of a 64-byte CQE the slow path fills for a message it completed (the fields
/// [`Delivered`] reads, where a CQE has them).
const META: usize = 64;

/// What a [`RecvSession`] does around its cold path: the setup layer's guard against a
/// QP destroyed on another thread, its clean of destroyed QPs' CQEs, and softnic's
/// simulated device. `()` does nothing (the datapath alone).
pub trait RecvHooks<const B: usize> {
    /// Before the poller's general path polls one CQE.
    #[inline(always)]
    fn enter_slow(&mut self, poller: &mut DirectPoller<B>) {
        let _ = poller;
    }
    /// After it.
    #[inline(always)]
    fn exit_slow(&mut self) {}
    /// The CQ had nothing.
    #[inline(always)]
    fn empty(&mut self, poller: &mut DirectPoller<B>) {
        let _ = poller;
    }
}

impl<const B: usize> RecvHooks<B> for () {}

/// Why a session did not open, or a receive failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecvSessionError {
    /// The ring does not write a ConnectX receive queue of its own
    /// ([`RecvTarget::Mlx5`](crate::RecvTarget::Mlx5)): sessions take a QP's RQ, not an
    /// SRQ nor a verbs queue.
    NotDirect,
    /// The poller does not serve the ring's queue (`attach_rq` with its QP and `wrid`
    /// table): the session would never see its completions.
    NotServed,
    /// Posting the ring's released slots when the session opened failed.
    Post(PostError),
    /// A receive of the ring failed (its slot is idle, as
    /// [`RecvRing::on_completion`](crate::RecvRing::on_completion) leaves it).
    Recv(RecvError),
    /// The poller refused a CQE (left in place).
    Poll(DirectError),
}

impl core::fmt::Display for RecvSessionError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NotDirect => f.write_str(
                "RecvSession: the ring is not a direct receive ring of a QP (RecvTarget::Mlx5): \
                 use the poller and on_completion, or build the ring with direct_recv_ring",
            ),
            Self::NotServed => f.write_str(
                "RecvSession: this poller does not serve the ring's receive queue: open the \
                 session on the poller of the QP's receive CQ, the one attach_rq was called on",
            ),
            Self::Post(e) => write!(f, "RecvSession: reposting released slots: {e}"),
            Self::Recv(e) => write!(f, "RecvSession: {e}"),
            Self::Poll(e) => write!(f, "RecvSession: {e}"),
        }
    }
}

impl core::error::Error for RecvSessionError {}

/// One poll of a [`RecvSession`].
#[derive(Debug)]
#[must_use = "a message is delivered, or a completion is to be routed"]
pub enum Polled<'s> {
    /// The CQ had nothing.
    Empty,
    /// A message of the ring, valid until the next [`recv`](RecvSession::recv).
    Msg(Delivered<'s>),
    /// A completion that is not the ring's (a send's, another ring's): consumed from the
    /// CQ, for the caller to give to its ring.
    Other(Completion),
}

/// A message received by a [`RecvSession`], where the device put it: in the ring's slot,
/// or in the CQE (scatter-to-CQE; no copy). The bytes and the CQE stay the caller's until
/// the next [`recv`](RecvSession::recv) (the borrow ends there), when the slot is posted
/// again and the CQE given back to the device.
#[derive(Debug)]
pub struct Delivered<'s> {
    data: *const u8,
    len: u32,
    slot: u32,
    /// The CQE's 64-byte half (or the session's copy of the fields, for a message of the
    /// slow path).
    cqe: *const u8,
    _s: PhantomData<&'s [u8]>,
}

impl<'s> Delivered<'s> {
    /// Reads the big-endian 32-bit field at `off` of the CQE.
    #[inline(always)]
    fn field(&self, off: usize) -> u32 {
        // SAFETY: `cqe` is 64 readable bytes (a CQE the device does not write while the
        // message is out, or the session's copy), 4-aligned at these offsets.
        u32::from_be(unsafe { self.cqe.add(off).cast::<u32>().read_volatile() })
    }

    /// The message's bytes: in the slot, or in the CQE (32 bytes in a 64-byte CQE, 64 in
    /// the first half of a 128-byte one). Empty for an RDMA WRITE with
    /// immediate (its data went to the remote buffer). For UD, the 40-byte GRH first.
    #[inline(always)]
    pub fn bytes(&self) -> &'s [u8] {
        // SAFETY: `data .. + len` is inside the slot (len <= slot_len) or the CQE's 32 or
        // 64 payload bytes (len <= 32 or 64, the latter only in a 128-byte CQE), neither written by the device while the message is
        // out (the slot is not posted again nor the CQE released until the next recv,
        // which ends `'s`).
        unsafe { core::slice::from_raw_parts(self.data, self.len as usize) }
    }

    /// The slot index.
    #[inline(always)]
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// `byte_len` of the completion (for RDMA WRITE with immediate, the length written to
    /// the remote buffer; for UD it includes the GRH).
    #[inline(always)]
    pub fn byte_len(&self) -> u32 {
        self.field(cqe::OFF_BYTE_CNT)
    }

    /// The immediate, host order, for SEND with immediate and RDMA WRITE with immediate.
    #[inline(always)]
    pub fn imm(&self) -> Option<u32> {
        // SAFETY: as `field`.
        let op = unsafe { self.cqe.add(cqe::OFF_OP_OWN).read_volatile() } >> 4;
        (op == cqe::RESP_SEND_IMM || op == cqe::RESP_WR_IMM).then(|| self.field(36))
    }

    /// True for an RDMA WRITE with immediate.
    #[inline(always)]
    pub fn is_write_imm(&self) -> bool {
        // SAFETY: as `field`.
        (unsafe { self.cqe.add(cqe::OFF_OP_OWN).read_volatile() } >> 4) == cqe::RESP_WR_IMM
    }

    /// The sending QP (meaningful for UD).
    #[inline(always)]
    pub fn src_qp(&self) -> u32 {
        self.field(24) & 0xff_ffff
    }

    /// True when the bytes are in the CQE (responder scatter-to-CQE), not in the slot.
    #[inline(always)]
    pub fn in_cqe(&self) -> bool {
        core::ptr::eq(self.data, self.cqe) || core::ptr::eq(self.data, self.cqe.wrapping_sub(64))
    }
}

/// What the fast path reads: copies of the CQ's, the queue's and the ring's geometry,
/// fixed while the session is open.
#[derive(Clone, Copy, Debug)]
struct Hot {
    cq: RxView,
    /// `FAST[0]` or `FAST[1]`, by the CQE size.
    fast: &'static [bool; 256],
    /// The receive queue: `wqe_cnt - 1`, its `wrid` table and the QP's doorbell record.
    rq_mask: u32,
    wrid: *mut u64,
    rq_dbr: *mut u32,
    /// `sop_drop_qpn`'s QP bits of the ring's QP as they are in memory, and their mask.
    qpn_raw: u32,
    qpn_mask_raw: u32,
    slots: u64,
    slot_len: u32,
    count: u32,
}

impl Hot {
    /// The first byte of `slot` (< `count`) in the region.
    #[inline(always)]
    fn slot_ptr(&self, slot: u32) -> *const u8 {
        (self.slots + u64::from(slot) * u64::from(self.slot_len)) as usize as *const u8
    }
}

/// A [`RecvRing`] on a direct receive queue and the [`DirectPoller`] serving it, held
/// together for a receive loop: [`RecvRing::session`]. See the module documentation.
pub struct RecvSession<'a, const N: usize, const B: usize, H: RecvHooks<B> = ()> {
    ring: &'a mut RecvRing<N>,
    poller: &'a mut DirectPoller<B>,
    hooks: H,
    h: Hot,
    /// The receive counter (the queue's `head`).
    head: u32,
    /// The slot of the message out, or [`NONE`].
    held: u32,
    /// The fields of a message the slow path completed, laid out as in a CQE.
    meta: [u32; META / 4],
}

impl<const N: usize, const B: usize, H: RecvHooks<B>> core::fmt::Debug
    for RecvSession<'_, N, B, H>
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RecvSession")
            .field("ring", &self.ring)
            .field("head", &self.head)
            .field("held", &(self.held != NONE))
            .finish_non_exhaustive()
    }
}

impl<const N: usize> RecvRing<N> {
    /// Opens a [`RecvSession`] of this ring and `poller`, the direct poller of its QP's
    /// receive CQ (serving its queue: `attach_rq`). Released slots are posted first.
    ///
    /// # Errors
    /// [`RecvSessionError::NotDirect`] unless the ring is a
    /// [`RecvTarget::Mlx5`](crate::RecvTarget::Mlx5) ring; [`RecvSessionError::NotServed`]
    /// when `poller` does not serve its queue; [`RecvSessionError::Post`] when posting the
    /// released slots failed.
    pub fn session<'a, const B: usize>(
        &'a mut self,
        poller: &'a mut DirectPoller<B>,
    ) -> Result<RecvSession<'a, N, B>, RecvSessionError> {
        self.session_with(poller, ())
    }

    /// [`session`](Self::session) with hooks around the cold path (the setup layer's).
    ///
    /// # Errors
    /// As [`session`](Self::session).
    pub fn session_with<'a, const B: usize, H: RecvHooks<B>>(
        &'a mut self,
        poller: &'a mut DirectPoller<B>,
        hooks: H,
    ) -> Result<RecvSession<'a, N, B, H>, RecvSessionError> {
        let Some(rq) = self.direct_rq() else {
            return Err(RecvSessionError::NotDirect);
        };
        let desc = rq.geometry();
        if !poller.serves_rq(self.qp_num(), desc.wrid) {
            return Err(RecvSessionError::NotServed);
        }
        self.repost().map_err(RecvSessionError::Post)?;
        let head = self.open_session();
        let qpn_mask_raw = 0x00ff_ffffu32.to_be();
        let cq = poller.rx_view();
        let h = Hot {
            fast: &FAST[usize::from(cq.is_128())],
            cq,
            rq_mask: desc.wqe_cnt - 1,
            wrid: desc.wrid,
            rq_dbr: desc.dbrec,
            qpn_raw: self.qp_num().to_be() & qpn_mask_raw,
            qpn_mask_raw,
            slots: self.region_addr(),
            slot_len: self.slot_len(),
            count: self.count(),
        };
        Ok(RecvSession {
            ring: self,
            poller,
            hooks,
            h,
            head,
            held: NONE,
            meta: [0; META / 4],
        })
    }
}

impl<'a, const N: usize, const B: usize, H: RecvHooks<B>> RecvSession<'a, N, B, H> {
    /// Gives back the message the last call delivered, then polls one CQE: see the module
    /// documentation.
    ///
    /// # Errors
    /// [`RecvSessionError::Recv`] for a failed receive of the ring (a flush after a QP
    /// error: the slot is idle until the ring's reset), [`RecvSessionError::Poll`] for a
    /// CQE the poller refuses (left in place).
    #[inline]
    pub fn recv(&mut self) -> Result<Polled<'_>, RecvSessionError> {
        if self.held != NONE {
            self.give_back();
        }
        let h = &self.h;
        let cons = self.poller.rx_cons();
        let c = h.cq.cqe(cons);
        // SAFETY: `c` is the 64-byte half of a CQE of the poller's buffer (`cqe` masks the
        // index); the device writes op_own last, so it is read first.
        let op_own = unsafe { c.add(cqe::OFF_OP_OWN).read_volatile() };
        let x = op_own ^ h.cq.owner(cons);
        if h.fast[x as usize] {
            from_device_barrier();
            // SAFETY: fields inside the CQE, read after the barrier; 4- and 2-aligned.
            let (sop, ctr) = unsafe {
                (
                    c.add(cqe::OFF_SOP_DROP_QPN).cast::<u32>().read_volatile(),
                    u16::from_be(c.add(cqe::OFF_WQE_COUNTER).cast::<u16>().read_volatile()),
                )
            };
            let idx = u32::from(ctr) & h.rq_mask;
            // SAFETY: idx < wqe_cnt entries of the queue's `wrid` table, which only the
            // ring writes (the ring's contract).
            let wr_id = unsafe { h.wrid.add(idx as usize).read() };
            let slot = wr_id as u32;
            if sop & h.qpn_mask_raw == h.qpn_raw && self.ring.is_current(wr_id) && slot < h.count {
                // SAFETY: inside the CQE, after the barrier.
                let byte_len =
                    u32::from_be(unsafe { c.add(cqe::OFF_BYTE_CNT).cast::<u32>().read_volatile() });
                let (data, cap) = match op_own & cqe::FORMAT_MASK {
                    0 => (h.slot_ptr(slot), h.slot_len),
                    4 => (c, 32),
                    // 64 bytes in the first half of this 128-byte CQE (`fast` takes format
                    // 2 on 128-byte CQEs only).
                    _ => (c.wrapping_sub(64), 64),
                };
                let len = if x >> 4 == cqe::RESP_WR_IMM {
                    0
                } else {
                    byte_len.min(cap)
                };
                self.poller.set_rx_cons(cons.wrapping_add(1));
                self.ring.count_completed();
                self.held = slot;
                return Ok(Polled::Msg(Delivered {
                    data,
                    len,
                    slot,
                    cqe: c,
                    _s: PhantomData,
                }));
            }
        } else if x & cqe::OWNER_MASK != 0 || x >> 4 == cqe::INVALID {
            self.hooks.empty(self.poller);
            return Ok(Polled::Empty);
        }
        self.recv_slow()
    }

    /// Posts the held slot's receive again and publishes the consumer index (the message's
    /// CQE goes back to the device).
    #[inline(always)]
    fn give_back(&mut self) {
        let slot = self.held;
        self.held = NONE;
        let h = self.h;
        let idx = self.head & h.rq_mask;
        let wr_id = self.ring.slot_wr_id(slot);
        // SAFETY: idx < wqe_cnt entries of the `wrid` table.
        if unsafe { h.wrid.add(idx as usize).read() } != wr_id {
            // The head WQE describes another slot (slots released out of order, or fewer
            // slots than WQEs): written for this one, as `DirectRq::post` writes it.
            // SAFETY: `head` is this session's counter.
            unsafe { self.ring.session_rewrite(self.head, slot) };
        }
        self.head = self.head.wrapping_add(1);
        to_device_barrier();
        // SAFETY: the receive counter of the QP's doorbell record (the ring's contract),
        // and the CQ's consumer counter (the poller's).
        unsafe {
            h.rq_dbr
                .add(super::rq::RCV_DBR)
                .write_volatile((self.head & 0xffff).to_be());
            h.cq.publish(self.poller.rx_cons());
        }
    }

    /// Everything but a good receive of the ring's QP or an empty CQ, through the poller's
    /// general path one CQE at a time.
    #[cold]
    #[inline(never)]
    fn recv_slow(&mut self) -> Result<Polled<'_>, RecvSessionError> {
        loop {
            let mut one = [Completion::PLACEHOLDER];
            self.hooks.enter_slow(self.poller);
            let r = self.poller.poll_into(&mut one);
            self.hooks.exit_slow();
            match r {
                Err(e) => return Err(RecvSessionError::Poll(e)),
                Ok(0) => {
                    self.hooks.empty(self.poller);
                    return Ok(Polled::Empty);
                }
                Ok(_) => {}
            }
            let [mut wc] = one;
            match self.ring.on_completion_cold(&mut wc) {
                Ok(m) => {
                    let slot = m.slot();
                    let in_slot = self.ring.session_take(m);
                    self.held = slot;
                    let raw = wc.as_raw();
                    let op = if raw.opcode == IBV_WC_RECV_RDMA_WITH_IMM {
                        cqe::RESP_WR_IMM
                    } else if raw.wc_flags & IBV_WC_WITH_IMM != 0 {
                        cqe::RESP_SEND_IMM
                    } else {
                        cqe::RESP_SEND
                    };
                    self.meta = [0; META / 4];
                    self.meta[6] = raw.src_qp.to_be();
                    // SAFETY: a receive completion's immediate (network order as it is).
                    self.meta[9] = unsafe { raw.__bindgen_anon_1.imm_data };
                    self.meta[11] = raw.byte_len.to_be();
                    self.meta[15] = u32::from_ne_bytes([0, 0, 0, op << 4]);
                    let h = &self.h;
                    return Ok(Polled::Msg(Delivered {
                        data: h.slot_ptr(slot),
                        len: in_slot.min(h.slot_len),
                        slot,
                        cqe: self.meta.as_ptr().cast(),
                        _s: PhantomData,
                    }));
                }
                Err(RecvError::Stale { .. }) => continue,
                Err(RecvError::Misrouted(_)) => return Ok(Polled::Other(wc)),
                Err(e) => return Err(RecvSessionError::Recv(e)),
            }
        }
    }

    /// The ring, between receives (its counters, `progress`).
    pub fn ring(&self) -> &RecvRing<N> {
        self.ring
    }

    /// Ends the session (as dropping it does): the held message's slot is posted again
    /// and the receive counter goes back to the ring.
    pub fn finish(self) {}
}

impl<const N: usize, const B: usize, H: RecvHooks<B>> Drop for RecvSession<'_, N, B, H> {
    fn drop(&mut self) {
        if self.held != NONE {
            self.give_back();
        }
        self.ring.close_session(self.head);
    }
}
