//! Receive WQEs written straight into a ConnectX receive queue: what `mlx5_post_recv`
//! writes, without libmlx5 (issue 30's first part; `docs/mlx5-receive.md` §3 has the
//! format as rdma-core v55 writes it).
//!
//! An RQ WQE is `stride` bytes of 16-byte data segments (`struct mlx5_wqe_data_seg`:
//! byte count, lkey, address, big-endian), `max_gs = stride / 16` of them. One segment is
//! written per scatter entry of non-zero length, in order; when fewer than `max_gs` were
//! written, one terminator follows (byte count 0, lkey [`INVALID_LKEY`], address 0). There
//! is no control segment and no register write: WQE `n` lives at slot `n & (wqe_cnt - 1)`,
//! its `wr_id` in `wrid[slot]`, and a post publishes its WQEs with a store barrier
//! (`udma_to_device_barrier`) and one store of the receive counter, `head & 0xffff`
//! big-endian, into element [`RCV_DBR`] of the QP's doorbell record.
//!
//! [`DirectRq::post`] writes one WQE, [`DirectRq::publish`] is the barrier and the counter:
//! a chain of `mlx5_post_recv` is several posts and one publish. `cargo xtask golden`
//! compares the queue bytes, the doorbell record, the `wrid` array and the refusals with
//! `mlx5_post_recv` itself (`datapath/golden/tests/golden.rs`, receive queue).
//!
//! The SRQ's WQEs are [`super::srq`]; the responder CQEs (scatter-to-CQE included) are
//! read by [`DirectPoller`](super::DirectPoller) (`attach_rq`, `attach_srq`); the ring over
//! either is the datapath's [`RecvRing`](crate::RecvRing) with
//! [`RecvTarget::Mlx5`](crate::RecvTarget::Mlx5) / `Mlx5Srq`.

use super::ring::data_seg;
use super::Doorbell;
use crate::LocalBuf;

/// The receive counter's element of a QP's doorbell record (`MLX5_RCV_DBR`).
pub const RCV_DBR: usize = 0;
/// The lkey of the segment that ends a WQE with fewer than `max_gs` entries
/// (`MLX5_INVALID_LKEY`).
pub const INVALID_LKEY: u32 = 0x100;

/// A ConnectX receive queue as `mlx5dv_init_obj(3)` describes it (`struct mlx5dv_qp`'s
/// `rq` and `dbrec`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectRqDesc {
    /// `rq.buf`: the first WQE.
    pub buf: *mut u8,
    /// `rq.wqe_cnt`: WQEs in the queue (a power of two).
    pub wqe_cnt: u32,
    /// `rq.stride`: bytes per WQE (a power of two, at least 16).
    pub stride: u32,
    /// `dbrec`: the QP's doorbell record; the receive counter is element [`RCV_DBR`].
    pub dbrec: *mut u32,
    /// `wqe_cnt` entries the queue owns: the `wr_id` of the WQE at each slot.
    pub wrid: *mut u64,
}

/// Why a receive was not posted. The queue is unchanged by a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RqError {
    /// `wqe_cnt` receives are outstanding (`mlx5_post_recv`: ENOMEM); complete some first.
    Full,
    /// More scatter entries than a WQE holds (`mlx5_post_recv`: EINVAL).
    TooManySegs {
        /// Entries given.
        got: usize,
        /// `stride / 16`.
        max: u32,
    },
    /// The description is not a queue: `wqe_cnt` or `stride` not a power of two, a stride
    /// under 16 bytes, or a null pointer.
    Geometry,
}

impl core::fmt::Display for RqError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            RqError::Full => write!(
                f,
                "mlx5 receive queue full (ENOMEM as mlx5_post_recv): complete receives first"
            ),
            RqError::TooManySegs { got, max } => write!(
                f,
                "{got} scatter entries > the WQE's {max} (EINVAL as mlx5_post_recv): create \
                 the QP with a larger max_recv_sge"
            ),
            RqError::Geometry => write!(
                f,
                "not an mlx5 receive queue: wqe_cnt and stride must be powers of two, the \
                 stride at least 16, the pointers non-null"
            ),
        }
    }
}

impl core::error::Error for RqError {}

/// A ConnectX receive queue this value alone posts to.
#[derive(Debug)]
pub struct DirectRq<D: Doorbell> {
    buf: *mut u8,
    mask: u32,
    shift: u32,
    max_gs: u32,
    dbrec: *mut u32,
    wrid: *mut u64,
    /// Receives written (wrapping, as libmlx5's `rq.head`).
    head: u32,
    /// Receives completed.
    tail: u32,
    /// `head` when the counter was last stored.
    published: u32,
    /// A [`RecvSession`](super::RecvSession) keeps the counter (`head` is stale until it
    /// closes; leaked, until [`end_leaked_session`](Self::end_leaked_session) takes it
    /// from the doorbell record).
    in_session: bool,
    db: D,
}

impl<D: Doorbell> DirectRq<D> {
    /// The queue `desc` describes, posted to from `head` on (0 for a QP libmlx5 has not
    /// posted receives to; its `rq.head` otherwise), with nothing outstanding.
    ///
    /// # Safety
    /// For as long as the value lives: `desc` describes a live receive queue (`buf` holds
    /// `wqe_cnt * stride` writable bytes, `dbrec` the QP's doorbell record, `wrid`
    /// `wqe_cnt` writable entries) that nothing else posts to or reads `wrid` of, and
    /// `db` performs stores and barriers as [`Doorbell`] says.
    ///
    /// # Errors
    /// [`RqError::Geometry`] for a description that is not a queue.
    pub unsafe fn new(desc: DirectRqDesc, head: u32, db: D) -> Result<Self, RqError> {
        if !desc.wqe_cnt.is_power_of_two()
            || !desc.stride.is_power_of_two()
            || desc.stride < 16
            || desc.buf.is_null()
            || desc.dbrec.is_null()
            || desc.wrid.is_null()
        {
            return Err(RqError::Geometry);
        }
        Ok(DirectRq {
            buf: desc.buf,
            mask: desc.wqe_cnt - 1,
            shift: desc.stride.trailing_zeros(),
            max_gs: desc.stride / 16,
            dbrec: desc.dbrec,
            wrid: desc.wrid,
            head,
            tail: head,
            published: head,
            in_session: false,
            db,
        })
    }

    /// Receives posted and not yet completed.
    pub fn outstanding(&self) -> u32 {
        self.head.wrapping_sub(self.tail)
    }

    /// WQEs in the queue.
    pub fn capacity(&self) -> u32 {
        self.mask + 1
    }

    /// Scatter entries a WQE holds.
    pub fn max_segs(&self) -> u32 {
        self.max_gs
    }

    /// Receives posted so far (libmlx5's `rq.head`).
    pub fn head(&self) -> u32 {
        self.head
    }

    /// The doorbell this queue publishes through.
    pub fn doorbell(&self) -> &D {
        &self.db
    }

    /// Writes one receive WQE for `segs` with `wr_id`; it reaches the device at the next
    /// [`publish`](Self::publish).
    ///
    /// # Errors
    /// [`RqError::Full`], [`RqError::TooManySegs`]; nothing is written then.
    #[inline]
    pub fn post(&mut self, wr_id: u64, segs: &[LocalBuf]) -> Result<(), RqError> {
        if self.outstanding() > self.mask {
            return Err(RqError::Full);
        }
        if segs.len() > self.max_gs as usize {
            return Err(RqError::TooManySegs {
                got: segs.len(),
                max: self.max_gs,
            });
        }
        // SAFETY: the head's WQE holds no outstanding receive (room, checked above), and
        // the entries fit (checked above).
        unsafe { self.write_at(self.head, wr_id, segs) };
        self.head = self.head.wrapping_add(1);
        Ok(())
    }

    /// Writes the WQE of receive counter `counter` for `segs` (data segments, then the
    /// terminator when fewer than `max_gs`) and its `wrid` entry: what [`post`](Self::post)
    /// writes once it found room, and what a [`RecvSession`](super::RecvSession) rewrites
    /// at its own counter.
    ///
    /// # Safety
    /// That WQE holds no posted receive, and `segs.len() <= max_gs`.
    #[inline(always)]
    pub(crate) unsafe fn write_at(&mut self, counter: u32, wr_id: u64, segs: &[LocalBuf]) {
        let slot = counter & self.mask;
        // SAFETY: `slot < wqe_cnt`, so the WQE's `stride` bytes are inside `buf` (`new`'s
        // contract); a WQE is 16-byte aligned (the queue is page-aligned, the stride a
        // power of two >= 16).
        let wqe = unsafe { self.buf.add((slot as usize) << self.shift) };
        let mut j = 0usize;
        // An entry of no bytes is skipped, as libmlx5 skips it.
        for &s in segs.iter().filter(|s| s.len != 0) {
            // SAFETY: j < max_gs entries of 16 bytes fit the stride.
            unsafe { data_seg(wqe.add(j * 16), s, false) };
            j += 1;
        }
        if j < self.max_gs as usize {
            let end = LocalBuf {
                addr: 0,
                len: 0,
                lkey: INVALID_LKEY,
            };
            // SAFETY: as above.
            unsafe { data_seg(wqe.add(j * 16), end, false) };
        }
        // SAFETY: slot < wqe_cnt entries of `wrid` (`new`'s contract).
        unsafe { self.wrid.add(slot as usize).write(wr_id) };
    }

    /// Posts again the receive the WQE at the head last held, if its `wrid` entry is
    /// `wr_id` (and there is room): no byte of the WQE is written, only the head moves. For
    /// an owner whose `wr_id`s name their buffers (a [`RecvRing`](crate::RecvRing) slot
    /// and its generation): the same `wr_id` at the same index means the WQE already
    /// describes that buffer, as this queue wrote it. `false`: nothing done (post it).
    #[inline(always)]
    pub fn repost_same(&mut self, wr_id: u64) -> bool {
        self.outstanding() <= self.mask && self.repost_same_in_ring(wr_id)
    }

    /// Hands the WQEs posted since the last call to the device: a store barrier, then the
    /// receive counter. Nothing when none were posted (as `mlx5_post_recv` with `nreq` 0).
    #[inline]
    pub fn publish(&mut self) {
        if self.head == self.published {
            return;
        }
        self.db.to_device_barrier();
        // SAFETY: element RCV_DBR of the QP's doorbell record (`new`'s contract).
        unsafe {
            self.db
                .write_dbr(self.dbrec.add(RCV_DBR), (self.head & 0xffff).to_be())
        };
        self.published = self.head;
    }

    /// The queue's description (`wrid` and doorbell record included).
    pub(crate) fn geometry(&self) -> DirectRqDesc {
        DirectRqDesc {
            buf: self.buf,
            wqe_cnt: self.mask + 1,
            stride: 1 << self.shift,
            dbrec: self.dbrec,
            wrid: self.wrid,
        }
    }

    /// A [`RecvSession`](super::RecvSession) takes the counter; returns it.
    pub(crate) fn open_session(&mut self) -> u32 {
        // A session leaked before this one left its counter in the doorbell record.
        self.end_leaked_session();
        self.in_session = true;
        self.head
    }

    /// The session ends with the counter at `head`, every receive published.
    pub(crate) fn close_session(&mut self, head: u32) {
        self.tail = self.tail.wrapping_add(head.wrapping_sub(self.head));
        self.head = head;
        self.published = head;
        self.in_session = false;
    }

    /// If a session was leaked (`mem::forget`), its counter is the one it last published
    /// in the doorbell record: the low 16 bits, all the device and the WQE index use.
    #[inline(always)]
    pub(crate) fn end_leaked_session(&mut self) {
        if self.in_session {
            // SAFETY: element RCV_DBR of the QP's doorbell record (`new`'s contract).
            let db = u32::from_be(unsafe { self.dbrec.add(RCV_DBR).read_volatile() });
            let head = self.head.wrapping_add(db.wrapping_sub(self.head) & 0xffff);
            self.close_session(head);
        }
    }

    /// [`repost_same`](Self::repost_same) for a [`RecvRing`](crate::RecvRing), whose
    /// slots never outnumber the WQEs (room is its invariant): the `wrid` entry at the
    /// head alone decides, unless a session holds the counter (`false`: the ring's general
    /// path catches up first).
    #[inline(always)]
    pub(crate) fn repost_same_in_ring(&mut self, wr_id: u64) -> bool {
        let slot = self.head & self.mask;
        // SAFETY: slot < wqe_cnt entries of `wrid` (`new`'s contract).
        if self.in_session || unsafe { self.wrid.add(slot as usize).read() } != wr_id {
            return false;
        }
        self.head = self.head.wrapping_add(1);
        true
    }

    /// Sets how many receives are outstanding to `n` (at most those posted): for an owner
    /// that accounts for its receives itself ([`RecvRing`](crate::RecvRing) with
    /// [`RecvTarget::Mlx5`](crate::RecvTarget::Mlx5)) instead of calling
    /// [`complete`](Self::complete) per completion. Only room is at stake: the `wrid` of a
    /// slot is read by the poller from the CQE's counter, not from the tail.
    pub fn set_outstanding(&mut self, n: u32) {
        self.tail = self.head.wrapping_sub(n.min(self.outstanding()));
    }

    /// Starts over from an empty queue at counter 0, as libmlx5 does when the QP moves to
    /// RESET (`mlx5_init_qp_indices`; the doorbell record's receive counter is zeroed).
    ///
    /// # Safety
    /// The QP went through RESET since the last post: the device holds none of the
    /// queue's receives.
    pub unsafe fn reset_after_qp_reset(&mut self) {
        self.head = 0;
        self.tail = 0;
        self.published = 0;
        self.in_session = false;
    }

    /// Retires the oldest outstanding receive and returns its `wr_id` (the poller's side:
    /// a receive CQE completes the receives in order), or `None` when none is outstanding.
    pub fn complete(&mut self) -> Option<u64> {
        if self.outstanding() == 0 {
            return None;
        }
        let slot = self.tail & self.mask;
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: slot < wqe_cnt entries of `wrid`.
        Some(unsafe { self.wrid.add(slot as usize).read() })
    }
}

/// Where a receive's payload is when the device scattered it into the CQE (responder
/// scatter-to-CQE, `op_own` bits 2..3; `docs/mlx5-receive.md` §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InlineScatter {
    /// Not in the CQE: in the receive's buffers.
    No,
    /// In the first 32 bytes of this 64-byte CQE (`MLX5_INLINE_SCATTER_32`).
    In32,
    /// In the 64 bytes before this 64-byte CQE: the first half of a 128-byte CQE
    /// (`MLX5_INLINE_SCATTER_64`).
    In64,
}

/// A responder CQE (a receive's completion), decoded as libmlx5's `mlx5_parse_cqe` and
/// `handle_responder` read it into an `ibv_wc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvCqe {
    /// `sop_drop_qpn & 0xffffff`: the QP it is for.
    pub qpn: u32,
    /// `srqn_uidx & 0xffffff`: the SRQ it is for (0: the QP's own RQ, with `cqe_version` 0).
    pub srqn: u32,
    /// `wqe_counter`: the receive WQE it completes.
    pub wqe_counter: u16,
    /// `IBV_WC_SUCCESS`, or the error CQE's syndrome as `ibv_wc_status`.
    pub status: hotverbs_ffi::ibv_wc_status,
    /// The error CQE's `vendor_err_synd` (0 on success).
    pub vendor_err: u32,
    /// `IBV_WC_RECV` or `IBV_WC_RECV_RDMA_WITH_IMM` (success only).
    pub opcode: hotverbs_ffi::ibv_wc_opcode,
    /// `byte_cnt` (success only).
    pub byte_len: u32,
    /// `IBV_WC_GRH`, `IBV_WC_WITH_IMM`, `IBV_WC_WITH_INV` (success only).
    pub wc_flags: u32,
    /// `imm_inval_pkey` as the CQE holds it (network order): the immediate as
    /// `ibv_wc.imm_data` carries it; `u32::from_be` of it is the invalidated rkey of a
    /// SEND_WITH_INV.
    pub imm_raw: u32,
    /// Sender's QP (`flags_rqpn & 0xffffff`).
    pub src_qp: u32,
    /// Sender's LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// `ml_path & 0x7f`.
    pub dlid_path_bits: u8,
    /// `imm_inval_pkey & 0xffff` (host order), as libmlx5 reports the P_Key index.
    pub pkey_index: u16,
    /// Whether the payload is in the CQE.
    pub inline: InlineScatter,
}

impl RecvCqe {
    /// Decodes `cqe`, the 64-byte CQE (of a 128-byte entry: its second half). `None` for a
    /// CQE that is not a receive's: a requester's (success or error), a resize, or a format
    /// this decoder does not read (compressed CQEs).
    pub fn decode(cqe: &[u8; 64]) -> Option<RecvCqe> {
        use hotverbs_ffi::*;
        let be32 = |o: usize| u32::from_be_bytes([cqe[o], cqe[o + 1], cqe[o + 2], cqe[o + 3]]);
        let op_own = cqe[63];
        let opcode = op_own >> 4;
        let inline = match op_own & super::cqe::FORMAT_MASK {
            0 => InlineScatter::No,
            0x4 => InlineScatter::In32,
            0x8 => InlineScatter::In64,
            _ => return None,
        };
        let mut c = RecvCqe {
            qpn: be32(56) & 0x00ff_ffff,
            srqn: be32(32) & 0x00ff_ffff,
            wqe_counter: u16::from_be_bytes([cqe[60], cqe[61]]),
            status: IBV_WC_SUCCESS,
            vendor_err: 0,
            opcode: IBV_WC_RECV,
            byte_len: 0,
            wc_flags: 0,
            imm_raw: 0,
            src_qp: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
            pkey_index: 0,
            inline: InlineScatter::No,
        };
        match opcode {
            super::cqe::RESP_ERR => {
                c.status = super::syndrome_status(cqe[super::cqe::OFF_SYNDROME]);
                c.vendor_err = u32::from(cqe[super::cqe::OFF_VENDOR_ERR]);
                return Some(c);
            }
            super::cqe::RESP_WR_IMM
            | super::cqe::RESP_SEND
            | super::cqe::RESP_SEND_IMM
            | super::cqe::RESP_SEND_INV => {}
            _ => return None,
        }
        c.inline = inline;
        c.byte_len = be32(44);
        let imm = u32::from_ne_bytes([cqe[36], cqe[37], cqe[38], cqe[39]]);
        match opcode {
            super::cqe::RESP_WR_IMM => {
                c.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
                c.wc_flags |= IBV_WC_WITH_IMM;
                c.imm_raw = imm;
            }
            super::cqe::RESP_SEND_IMM => {
                c.wc_flags |= IBV_WC_WITH_IMM;
                c.imm_raw = imm;
            }
            super::cqe::RESP_SEND_INV => {
                c.wc_flags |= IBV_WC_WITH_INV;
                c.imm_raw = imm;
            }
            _ => {}
        }
        let flags_rqpn = be32(24);
        c.slid = u16::from_be_bytes([cqe[22], cqe[23]]);
        c.sl = ((flags_rqpn >> 24) & 0xf) as u8;
        c.src_qp = flags_rqpn & 0x00ff_ffff;
        c.dlid_path_bits = cqe[17] & 0x7f;
        if (flags_rqpn >> 28) & 3 != 0 {
            c.wc_flags |= IBV_WC_GRH;
        }
        c.pkey_index = (be32(36) & 0xffff) as u16;
        Some(c)
    }
}

impl<D: Doorbell> DirectRq<D> {
    /// The `wr_id` of the receive WQE a CQE's `wqe_counter` names, retiring the oldest
    /// outstanding receive (libmlx5 v55's `handle_responder`: the slot from the counter,
    /// `rq.tail` moved on by one). `None` when no receive is outstanding.
    pub fn complete_at(&mut self, wqe_counter: u16) -> Option<u64> {
        if self.outstanding() == 0 {
            return None;
        }
        self.tail = self.tail.wrapping_add(1);
        let slot = u32::from(wqe_counter) & self.mask;
        // SAFETY: slot < wqe_cnt entries of `wrid`.
        Some(unsafe { self.wrid.add(slot as usize).read() })
    }

    /// Copies a payload the device scattered into the CQE into the buffers of the receive
    /// WQE at `wqe_counter`, segment by segment as `mlx5_copy_to_recv_wqe` does (the
    /// segments are read back from the queue), up to the WQE's terminator (libmlx5 reads on
    /// past it into stale segments; a device never sends more than the receive holds).
    /// `Err(IBV_WC_LOC_LEN_ERR)` when the WQE's segments hold less than `data`.
    ///
    /// # Safety
    /// Every buffer the WQE's segments name is writable for its byte count and is not
    /// accessed otherwise meanwhile (the receive's memory, which the device would write);
    /// `data` does not overlap them.
    pub unsafe fn scatter(
        &self,
        wqe_counter: u16,
        data: &[u8],
    ) -> Result<(), hotverbs_ffi::ibv_wc_status> {
        let slot = u32::from(wqe_counter) & self.mask;
        // SAFETY: slot < wqe_cnt: inside the queue (`new`'s contract); the WQE's buffers are
        // the caller's contract.
        unsafe {
            scatter_wqe(
                self.buf.add((slot as usize) << self.shift),
                self.max_gs,
                data,
            )
        }
    }
}

/// Copies `data` over the buffers of the receive WQE at `wqe` (`max_gs` segments), up to
/// its terminator, as `mlx5_copy_to_recv_wqe` does; `Err(IBV_WC_LOC_LEN_ERR)` when they
/// hold less. (libmlx5 reads on past the terminator into whatever segments the slot held
/// before; a device never scatters more than the receive holds, it reports a length error
/// instead, so the two part only where libmlx5 would write through stale addresses.)
///
/// # Safety
/// `wqe` is a receive WQE of `max_gs` 16-byte segments; every buffer its segments name is
/// writable for its byte count, accessed by nothing else meanwhile, and does not overlap
/// `data`.
pub(super) unsafe fn scatter_wqe(
    wqe: *const u8,
    max_gs: u32,
    data: &[u8],
) -> Result<(), hotverbs_ffi::ibv_wc_status> {
    let mut left = data;
    if left.is_empty() {
        return Ok(());
    }
    let wqe = wqe.cast::<[u32; 4]>();
    for j in 0..max_gs as usize {
        // SAFETY: j < max_gs segments of the WQE (the caller's contract).
        let [len, lkey, hi, lo] = unsafe { wqe.add(j).read() };
        if lkey == INVALID_LKEY.to_be() {
            break;
        }
        let n = (u32::from_be(len) as usize).min(left.len());
        if n == 0 {
            continue;
        }
        let addr = u64::from(u32::from_be(hi)) << 32 | u64::from(u32::from_be(lo));
        // SAFETY: the segment's buffer is writable for its byte count (the caller's
        // contract) and 0 < n <= that count.
        unsafe { core::ptr::copy_nonoverlapping(left.as_ptr(), addr as *mut u8, n) };
        left = &left[n..];
        if left.is_empty() {
            return Ok(());
        }
    }
    Err(hotverbs_ffi::IBV_WC_LOC_LEN_ERR)
}
