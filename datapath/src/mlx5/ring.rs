//! [`DirectRing`]: the [`Msg`] API writing mlx5 WQEs straight into the send queue.
//!
//! # Invariants (this module owns raw SQ, doorbell and register pointers)
//! - `staged`, `posted`, `retired` are free-running with `retired <= posted <= staged` and
//!   `staged - retired <= limit <= depth`; sequence `s` has `wr_id` `encode(ring_id, s)`,
//!   stored in `wrid[idx]` for the WQE starting at basic block `idx`.
//! - WQEs `posted..staged` are written to the SQ but not yet announced (the doorbell record
//!   still holds the `cur_post` of the last flush): the device does not read them.
//! - `depth * max_bbs <= wqe_cnt` (checked in `new`), so the WQEs of the at most `depth`
//!   staged-or-outstanding messages never overlap in the SQ.
//! - `event` is at most the sequence of the next WR that needs the slow path (the
//!   schedule's signal, the end of a batch, the WR that fills the ring, anything while full
//!   or in error), as for [`WrRing`](crate::WrRing).
//! - A message is checked completely before any byte of its WQE is written: a refused
//!   message leaves the SQ, `cur_post` and the counters as they were.
//! - While a lone run of `send_now` (or a leaked session) is open, `seq`, `posted` and
//!   `cur_post` lag the doorbell record by the run's posts since they were last written,
//!   each one block with its own doorbell: the record's `cur_post` minus the ring's, modulo
//!   2^16, is their number (at most `depth`), and `sess_cur0 - sess_s0` is `cur_post - seq`
//!   for every WR of the run. Entries of `wrid` from `sess_ids` on may be unwritten; every
//!   signaled one is written. Any call that reads or changes the counters catches up
//!   first (or computes the lag, for `&self` getters).

use core::marker::PhantomData;

use super::{DirectError, DirectSq, DirectUd, Doorbell, Mmio, AV_SIZE, CTRL_CQ_UPDATE, INLINE_SEG};
use crate::cq::Completion;
use crate::desc::{LocalBuf, RemoteBuf};
use crate::error::{ConfigError, SendError, WcError};
use crate::send::{Local, Msg, Opcode, SendConfig};
use crate::wr_id;

#[path = "session.rs"]
mod session;
pub use session::{DirectSession, DirectWindow};

/// The mlx5 opcode of each [`Opcode`] (`mlx5_ib_opcode[]` in libmlx5).
const MLX5_OP: [u8; 7] = [
    super::opcode::SEND,
    super::opcode::SEND_IMM,
    super::opcode::RDMA_WRITE,
    super::opcode::RDMA_WRITE_IMM,
    super::opcode::RDMA_READ,
    super::opcode::ATOMIC_FA,
    super::opcode::ATOMIC_CS,
];

/// A message's payload as the writer sees it.
#[derive(Clone, Copy)]
enum Payload<'a> {
    Empty,
    /// Copied into an inline segment (an inline message, or a registered buffer small
    /// enough to inline).
    Inline(&'a [u8]),
    /// One data segment.
    Buf(LocalBuf),
    /// Several inline pieces, one inline segment.
    InlineList(&'a [&'a [u8]]),
    /// Several data segments.
    Sges(&'a [LocalBuf]),
}

/// Extra payload forms beyond a [`Msg`]'s own [`Local`].
#[derive(Clone, Copy)]
enum Gather<'a> {
    /// The message's own payload.
    One,
    /// Inline pieces (the message's payload is empty).
    InlineList(&'a [&'a [u8]]),
    /// Data segments (the message's payload is empty).
    Sges(&'a [LocalBuf]),
}

/// What the fast path reads and writes, copied into a [`DirectBatch`] so that a push loop
/// keeps it in registers (the WQE stores go through raw pointers the compiler cannot tell
/// apart from the ring). Written back before anything else reads the ring.
#[derive(Clone, Copy, Debug)]
struct Fast {
    seq: u64,
    event: u64,
    /// The `wr_id` of sequence `seq` is `seq + id_off` (wrapping): the ring's id bits minus
    /// the start of `seq`'s epoch of 2^55 sequence numbers (the width of `wr_id`'s sequence
    /// field), so the fast path adds instead of masking. Set with the event
    /// ([`DirectRing::set_event`]) and before a slow-path build ([`Fast::set_epoch`]);
    /// `event` never passes the end of the epoch, so the fast path stays inside it.
    id_off: u64,
    /// libmlx5's `sq.cur_post`: the basic-block counter of the next WQE.
    cur: u32,
    mask: u32,
    /// `qp_num << 8`.
    qpn8: u32,
    max_inline: u32,
    /// A [`Local::Buf`] of `len < buf_inline` bytes goes inline
    /// ([`SendConfig::inline_bufs`]).
    buf_inline: u32,
    sq: *mut u8,
    wrid: *mut u64,
    remote: RemoteBuf,
    has_remote: bool,
    /// A UC QP: RDMA READ and atomics are refused ([`SendError::NotOnUc`]).
    uc: bool,
    ud: Option<DirectUd>,
    /// The ctrl segment of the newest staged WQE (for the doorbell), with its `ds` in the
    /// low 6 bits (free: WQEs start on 64 bytes) if it is inline (a BlueFlame candidate),
    /// else 0: one store per staged WQE instead of two. See `set_last`.
    last: *mut u8,
    /// The largest inline SEND that is one basic block: 44 or `max_inline` if smaller;
    /// 0 for UD (the datagram segment takes the room).
    one_max: u32,
}

#[derive(Debug)]
struct State {
    f: Fast,
    /// `wr_id::encode(ring_id, 0)`.
    id_bits: u64,
    batch_open: bool,
    /// A [`DirectSession`] is open (or was leaked): `batch_open` is set too, so that every
    /// call after a leak takes the slow path, which catches up from the doorbell record.
    session_open: bool,
    /// A lone run is open: `send_now`'s lone path posts without writing the ring's
    /// counters or `wrid` entries (see [`DirectRing::send_now`]). Like a session's, its
    /// WRs are one block each from `sess_s0` on, with `cur - seq` constant, and the
    /// doorbell record says how many it posted since the counters were last written.
    lone_run: bool,
    /// The sequence number of the open (or leaked) session's or lone run's first WR. Their
    /// fast paths write no `wrid` entry;
    /// [`write_session_ids`](DirectRing::write_session_ids) writes those of `sess_s0..`
    /// when the session or run ends or a completion needs one.
    sess_s0: u64,
    /// The session's WRs from `sess_s0` up to this one have their `wrid` entries (set by
    /// `write_session_ids`).
    sess_ids: u64,
    /// `cur_post` when the session opened: the ring's BlueFlame buffer is the one of that
    /// doorbell until the session gives the ring back.
    sess_cur0: u32,
    posted: u64,
    retired: u64,
    limit: u64,
    next_signal: u64,
    signal_every: u64,
    batch: u64,
    depth: u64,
    qp_num: u32,
    max_sge: u32,
    split_key: u64,
    dbrec: *mut u32,
    bf_reg: *mut u8,
    /// The BlueFlame buffer the next doorbell uses: `bf_reg + bf_offset`, alternating by
    /// XOR with `bf_size` (the register is aligned to its two buffers, checked by `new`).
    bf_cur: *mut u8,
    bf_size: u32,
    /// `bf_size / 16`: the largest `ds` BlueFlame takes (0 without BlueFlame).
    bf_max_ds: u32,
    /// BlueFlame takes a one-block WQE (`bf_max_ds >= 4`).
    bf_one: bool,
    /// `send_now`'s lone path exists (44: it takes inline SENDs of 1 to 44 bytes, one
    /// block), or not (0): a UD ring, no BlueFlame, or `max_inline` below 44. One bound
    /// for every ring, so that the lone path tests a message's length against a constant
    /// (nothing at all for a length known at compile time).
    lone_cap: usize,
    /// The doorbell record's send counter while the lone path is open (a lone run,
    /// nothing staged, no batch open), else [`LONE_CLOSED`]: reading `cur_post` from it
    /// is also the test of whether the lone path is open.
    lone_dbr: *mut u32,
    /// The lone path is open (`lone_dbr` is the doorbell record).
    lone_open: bool,
    /// While the lone path is open, it posts at `cur_post` `c` (read at `lone_dbr`, 16
    /// bits) iff `c != lone_stop`, the `cur_post` of the event: every lone post is one
    /// block, so the run reaches it exactly (see [`set_event`](DirectRing::set_event)).
    /// 0 while it is closed: `LONE_CLOSED` reads as 0, so a closed lone path stops at
    /// once. One test instead of four.
    lone_stop: u32,
    /// The ctrl segment's first word as stored for a SEND of `ds` 2, 3 and 4 at counter 0
    /// (`ctrl_word(0, SEND, qpn << 8 | ds)`).
    lone_w0: [u64; 3],
}

/// What the lone path reads its `cur_post` from while it is closed: 0, as `lone_stop` is
/// then (never written: the lone path writes the doorbell record only when open).
static LONE_CLOSED: u32 = 0;

/// The send counter at `dbr` (the doorbell record's, or [`LONE_CLOSED`]) as the record
/// holds it: `cur_post`'s low 16 bits, big-endian, in a 32-bit word, so its two low-order
/// bytes.
///
/// # Safety
/// `dbr` is `State::lone_dbr`.
#[inline(always)]
unsafe fn lone_counter_be(dbr: *const u32) -> u16 {
    // SAFETY: the caller's contract: the QP's doorbell record (new's contract) or the
    // static, 4 bytes either way.
    unsafe { dbr.cast::<u16>().add(1).read_volatile() }
}

impl State {
    /// Closes the lone path (see `lone_dbr`).
    #[inline(always)]
    fn close_lone(&mut self) {
        // One test when closed already (the common case of rings used without `send_now`).
        if self.lone_open {
            self.close_lone_now();
        }
    }

    /// [`close_lone`](Self::close_lone) without the test.
    #[inline(always)]
    fn close_lone_now(&mut self) {
        self.lone_dbr = core::ptr::addr_of!(LONE_CLOSED).cast_mut();
        self.lone_open = false;
        self.lone_stop = 0;
    }

    /// Writes the `wrid` entry of sequence number `seq` at `cur_post` `cur`: what the
    /// ring's own paths write there (`encode(ring, seq)`), for a session's WR.
    ///
    /// # Safety
    /// The entry at `cur & mask` (in the table: `new`'s contract) belongs to no
    /// outstanding WR but `seq`'s.
    #[inline(always)]
    pub(super) unsafe fn write_id(&self, cur: u32, seq: u64) {
        // SAFETY: `cur & mask` < wqe_cnt entries of the table; the caller's contract.
        unsafe {
            self.f
                .wrid
                .add((cur & self.f.mask) as usize)
                .write(self.id_bits.wrapping_add(seq & wr_id::SEQ_MASK))
        };
    }
}

impl Fast {
    /// Sets `id_off` for the epoch of `seq` (`id_bits`: the ring's, sequence 0).
    #[inline(always)]
    fn set_epoch(&mut self, id_bits: u64) {
        self.id_off = id_bits.wrapping_sub(self.seq & !wr_id::SEQ_MASK);
    }

    /// Copies what staging changes (the counters and the newest WQE) into the ring's own
    /// copy; the rest of a batch's copy is the ring's, unchanged while the batch is open.
    #[inline(always)]
    fn write_back(&self, to: &mut Fast) {
        to.seq = self.seq;
        to.event = self.event;
        to.cur = self.cur;
        to.last = self.last;
    }

    /// Records the newest staged WQE: its ctrl segment and, for a BlueFlame candidate, its
    /// `ds` (1 to 63; 0 otherwise, and for a `ds` the 6 bits cannot hold, which no
    /// BlueFlame buffer takes anyway).
    #[inline(always)]
    fn set_last(&mut self, ctrl: *mut u8, bf_ds: u32) {
        let tag = if bf_ds < 64 { bf_ds as usize } else { 0 };
        self.last = ctrl.map_addr(|a| a | tag);
    }

    /// The newest staged WQE's ctrl segment.
    #[inline(always)]
    fn last_ctrl(&self) -> *mut u8 {
        self.last.map_addr(|a| a & !63)
    }

    /// Its `ds` if it is a BlueFlame candidate, else 0.
    #[inline(always)]
    fn last_bf(&self) -> u32 {
        (self.last.addr() & 63) as u32
    }

    /// The end of the SQ (not a field: it would make the copy a [`DirectBatch`] takes
    /// larger than what the compiler moves inline).
    #[inline(always)]
    fn qend(&self) -> *mut u8 {
        self.sq.wrapping_add(((self.mask as usize) + 1) << 6)
    }

    /// Checks a message (payload `len` bytes, `inline` or not, `nsge` data segments)
    /// against the ring; returns its remote address (0 for SENDs). Nothing is changed.
    #[inline(always)]
    fn check(&self, msg: &Msg<'_>, len: u64, inline: bool) -> Result<u64, SendError> {
        if inline && len > self.max_inline as u64 {
            return Err(SendError::InlineTooLong {
                len: len as usize,
                max: self.max_inline,
            });
        }
        match msg.op {
            Opcode::Send | Opcode::SendImm => Ok(0),
            _ => self.check_remote(msg, len),
        }
    }

    #[inline(always)]
    fn check_remote(&self, msg: &Msg<'_>, len: u64) -> Result<u64, SendError> {
        if !self.has_remote {
            return Err(SendError::NoRemote);
        }
        if self.uc && matches!(msg.op, Opcode::Read | Opcode::FetchAdd | Opcode::CmpSwap) {
            return Err(SendError::NotOnUc(msg.op));
        }
        let atomic = matches!(msg.op, Opcode::FetchAdd | Opcode::CmpSwap);
        if atomic && (msg.remote_offset & 7 != 0 || len != 8) {
            return Err(SendError::AtomicMisaligned);
        }
        let r = self.remote;
        let addr = match msg.remote_offset.checked_add(len) {
            Some(end) if end <= r.len => r.addr.wrapping_add(msg.remote_offset),
            _ => {
                return Err(SendError::RemoteOutOfRange {
                    offset: msg.remote_offset,
                    len,
                })
            }
        };
        if atomic && addr & 7 != 0 {
            return Err(SendError::AtomicMisaligned);
        }
        Ok(addr)
    }

    /// The payload of a message with `gather`, its length, and whether it goes inline.
    #[inline(always)]
    fn payload<'a>(&self, msg: &Msg<'a>, gather: Gather<'a>) -> (Payload<'a>, u64, bool) {
        match gather {
            Gather::One => {}
            Gather::InlineList(parts) => {
                let len = parts.iter().map(|p| p.len() as u64).sum();
                return (Payload::InlineList(parts), len, true);
            }
            Gather::Sges(list) => {
                let len = list.iter().map(|b| b.len as u64).sum();
                return (Payload::Sges(list), len, false);
            }
        }
        match msg.local {
            Local::Empty => (Payload::Empty, 0, false),
            Local::Inline(d) => (Payload::Inline(d), d.len() as u64, true),
            Local::Buf(b) => {
                if b.len < self.buf_inline
                    && matches!(
                        msg.op,
                        Opcode::Send | Opcode::SendImm | Opcode::Write | Opcode::WriteImm
                    )
                {
                    // SAFETY: a registered buffer the caller keeps valid until the WR
                    // retires (`stage`'s contract); the CPU copies it now instead of the
                    // device reading it later.
                    let d = unsafe {
                        core::slice::from_raw_parts(b.addr as usize as *const u8, b.len as usize)
                    };
                    (Payload::Inline(d), b.len as u64, true)
                } else {
                    (Payload::Buf(b), b.len as u64, false)
                }
            }
        }
    }

    /// Copies `d` to `dst`, wrapping at the end of the SQ; returns the next free byte.
    ///
    /// # Safety
    /// `dst` is inside the SQ (or at its end) and the bytes fit the WQE's basic blocks.
    #[inline(always)]
    unsafe fn copy_wrapping(&self, mut dst: *mut u8, d: &[u8]) -> *mut u8 {
        let mut src = d.as_ptr();
        let mut len = d.len();
        // SAFETY: the caller's contract; `qend - dst` bytes are left before the end (the
        // comparison is on lengths: `dst + len` may lie past the SQ, where no pointer may be
        // formed).
        unsafe {
            let room = self.qend().offset_from(dst) as usize;
            if len > room {
                let first = room;
                core::ptr::copy_nonoverlapping(src, dst, first);
                src = src.add(first);
                len -= first;
                dst = self.sq;
            }
            copy_small(src, dst, len);
            dst.add(len)
        }
    }

    /// Writes the WQE of `msg` (checked, with remote address `remote`) at `cur` with the
    /// signal flag `signaled`, stores its `wr_id`, and advances `cur`. Returns true for a
    /// one-block inline WQE of more than one `ds` (what BlueFlame takes as one block).
    ///
    /// # Safety
    /// `msg` passed [`check`](Self::check) with this payload; the ring has room for it
    /// (the SQ basic blocks from `cur` on belong to no outstanding WQE).
    #[inline(always)]
    unsafe fn build(
        &mut self,
        msg: &Msg<'_>,
        payload: Payload<'_>,
        remote: u64,
        signaled: bool,
    ) -> bool {
        // The common case in one basic block: an RC SEND / WRITE with a small inline
        // payload. A block never crosses the end of the SQ, so nothing wraps.
        if let (Payload::Inline(d), None) = (payload, self.ud) {
            let raddr = matches!(msg.op, Opcode::Write | Opcode::WriteImm);
            if d.len() <= if raddr { 28 } else { 44 }
                && matches!(
                    msg.op,
                    Opcode::Send | Opcode::SendImm | Opcode::Write | Opcode::WriteImm
                )
            {
                // SAFETY: forwarded contract; the WQE is at most one block.
                let (ctrl, ds) = unsafe { self.build_one_block(msg, d, raddr, remote, signaled) };
                self.set_last(ctrl, ds);
                return raddr || !d.is_empty();
            }
        }
        // SAFETY: forwarded contract.
        unsafe { self.build_any(msg, payload, remote, signaled) };
        false
    }

    /// [`build`](Self::build) for an RC SEND / WRITE(_IMM) with at most 44 (SEND) or 28
    /// (WRITE) inline bytes: one basic block. Returns its ctrl segment and `ds` (not stored
    /// in `last`: the lone path rings at once and does not need it).
    ///
    /// # Safety
    /// As [`build`](Self::build).
    #[inline(always)]
    unsafe fn build_one_block(
        &mut self,
        msg: &Msg<'_>,
        d: &[u8],
        raddr: bool,
        remote: u64,
        signaled: bool,
    ) -> (*mut u8, u32) {
        let idx = self.cur & self.mask;
        // SAFETY: idx < wqe_cnt and the WQE fits the block (the caller's check).
        unsafe {
            let ctrl = self.sq.add((idx as usize) << 6);
            let mut seg = ctrl.add(16);
            let mut ds: u32 = 1;
            if raddr {
                raddr_seg(seg, remote, self.remote.rkey);
                seg = seg.add(16);
                ds = 2;
            }
            let len = d.len() as u32;
            if len != 0 {
                seg.cast::<u32>()
                    .write_unaligned((len | INLINE_SEG).to_be());
                copy_upto44(d.as_ptr(), seg.add(4), d.len());
                ds += (len + 19) >> 4;
            }
            let imm = if matches!(msg.op, Opcode::SendImm | Opcode::WriteImm) {
                msg.imm.to_be()
            } else {
                0
            };
            // The message's fence / solicited bits are already `fm_ce_se` bits (0 for a
            // message without them: folded away where the message is built in place).
            let fm = if signaled { CTRL_CQ_UPDATE } else { 0 } | msg.mlx5_flags();
            let w0 = ctrl_word(self.cur, MLX5_OP[msg.op as usize], self.qpn8 | ds);
            ctrl.cast::<u64>().write(w0);
            ctrl.add(8)
                .cast::<u64>()
                .write((fm as u64) << 24 | (imm as u64) << 32);
            self.wrid
                .add(idx as usize)
                .write(self.seq.wrapping_add(self.id_off));
            self.cur = self.cur.wrapping_add(1);
            (ctrl, ds)
        }
    }

    /// [`build`](Self::build) for any WQE.
    ///
    /// # Safety
    /// As [`build`](Self::build).
    #[inline(always)]
    unsafe fn build_any(
        &mut self,
        msg: &Msg<'_>,
        payload: Payload<'_>,
        remote: u64,
        signaled: bool,
    ) {
        let idx = self.cur & self.mask;
        // SAFETY: idx < wqe_cnt, so the ctrl segment and everything up to the end of its
        // basic block are inside the SQ; later segments wrap at `qend` (below).
        unsafe {
            let ctrl = self.sq.add((idx as usize) << 6);
            let mut seg = ctrl.add(16);
            let mut ds: u32 = 1;
            let mut imm: u32 = 0;
            match msg.op {
                Opcode::Send => {}
                Opcode::SendImm => imm = msg.imm.to_be(),
                Opcode::Write | Opcode::Read => {
                    raddr_seg(seg, remote, self.remote.rkey);
                    seg = seg.add(16);
                    ds += 1;
                }
                Opcode::WriteImm => {
                    imm = msg.imm.to_be();
                    raddr_seg(seg, remote, self.remote.rkey);
                    seg = seg.add(16);
                    ds += 1;
                }
                Opcode::FetchAdd => {
                    raddr_seg(seg, remote, self.remote.rkey);
                    // Only swap_add: libmlx5 leaves `compare` as it was for FETCH_AND_ADD.
                    seg.add(16)
                        .cast::<u64>()
                        .write_unaligned(msg.compare_add.to_be());
                    seg = seg.add(32);
                    ds += 2;
                }
                Opcode::CmpSwap => {
                    raddr_seg(seg, remote, self.remote.rkey);
                    seg.add(16).cast::<u64>().write_unaligned(msg.swap.to_be());
                    seg.add(24)
                        .cast::<u64>()
                        .write_unaligned(msg.compare_add.to_be());
                    seg = seg.add(32);
                    ds += 2;
                }
            }
            if let Some(ud) = self.ud {
                core::ptr::copy_nonoverlapping(ud.av, seg, AV_SIZE);
                seg.cast::<u32>().write_unaligned(ud.remote_qkey.to_be());
                seg.add(8)
                    .cast::<u32>()
                    .write_unaligned((ud.remote_qpn | super::EXTENDED_UD_AV).to_be());
                seg = seg.add(AV_SIZE);
                ds += (AV_SIZE / 16) as u32;
                if seg == self.qend() {
                    seg = self.sq;
                }
            }
            let atomic = matches!(msg.op, Opcode::FetchAdd | Opcode::CmpSwap);
            let mut inline = false;
            match payload {
                Payload::Empty => {}
                Payload::Inline(d) => {
                    inline = true;
                    if !d.is_empty() {
                        self.copy_wrapping(seg.add(4), d);
                        seg.cast::<u32>()
                            .write_unaligned((d.len() as u32 | INLINE_SEG).to_be());
                        ds += (d.len() as u32 + 4).div_ceil(16);
                    }
                }
                Payload::Buf(b) => {
                    if b.len != 0 {
                        data_seg(seg, b, atomic);
                        ds += 1;
                    }
                }
                Payload::InlineList(parts) => {
                    inline = true;
                    let mut dst = seg.add(4);
                    let mut total = 0u32;
                    for p in parts {
                        dst = self.copy_wrapping(dst, p);
                        total += p.len() as u32;
                    }
                    if total != 0 {
                        seg.cast::<u32>()
                            .write_unaligned((total | INLINE_SEG).to_be());
                        ds += (total + 4).div_ceil(16);
                    }
                }
                Payload::Sges(list) => {
                    for b in list {
                        if seg == self.qend() {
                            seg = self.sq;
                        }
                        if b.len != 0 {
                            data_seg(seg, *b, atomic);
                            seg = seg.add(16);
                            ds += 1;
                        }
                    }
                }
            }
            // The message's fence / solicited bits are already `fm_ce_se` bits (0 for a
            // message without them: folded away where the message is built in place).
            let fm = if signaled { CTRL_CQ_UPDATE } else { 0 } | msg.mlx5_flags();
            let w0 = ctrl_word(self.cur, MLX5_OP[msg.op as usize], self.qpn8 | ds);
            let w1 = (fm as u64) << 24 | (imm as u64) << 32;
            ctrl.cast::<u64>().write(w0);
            ctrl.add(8).cast::<u64>().write(w1);
            self.wrid
                .add(idx as usize)
                .write(self.seq.wrapping_add(self.id_off));
            self.cur = self.cur.wrapping_add(ds.div_ceil(4));
            self.set_last(ctrl, if inline { ds } else { 0 });
        }
    }
}

/// The ctrl segment's first 8 bytes as one native-endian word: `opmod_idx_opcode` (opmod 0,
/// the WQE index `cur` modulo 2^16, `op`) then `qpn_ds`, both big-endian. One byte swap of
/// one word, the constant part (`op`, `qpn_ds`) added as one term.
#[inline(always)]
fn ctrl_word(cur: u32, op: u8, qpn_ds: u32) -> u64 {
    (((cur & 0xffff) as u64) << 40 | ((op as u64) << 32 | qpn_ds as u64)).swap_bytes()
}

/// The remote-address segment.
///
/// # Safety
/// 16 writable bytes at `seg`.
#[inline(always)]
unsafe fn raddr_seg(seg: *mut u8, addr: u64, rkey: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        seg.cast::<u64>().write_unaligned(addr.to_be());
        seg.add(8)
            .cast::<u64>()
            .write_unaligned(rkey.to_be() as u64);
    }
}

/// A data-pointer segment (`byte_count` 8 for atomics, as libmlx5's
/// `set_data_ptr_seg_atomic`).
///
/// # Safety
/// 16 writable bytes at `seg`.
#[inline(always)]
pub(super) unsafe fn data_seg(seg: *mut u8, b: LocalBuf, atomic: bool) {
    let n = if atomic { 8 } else { b.len };
    // SAFETY: the caller's contract.
    unsafe {
        seg.cast::<u64>()
            .write_unaligned(n.to_be() as u64 | (b.lkey.to_be() as u64) << 32);
        seg.add(8).cast::<u64>().write_unaligned(b.addr.to_be());
    }
}

/// [`copy_small`] for the 1 to 44 bytes of a one-block inline segment: two tests for the
/// common 16 to 44.
///
/// # Safety
/// As [`copy_small`], with `1 <= len <= 44`.
#[inline(always)]
unsafe fn copy_upto44(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: every access is inside `0..len` of both buffers (the caller's contract);
    // the constant-size copies become single 16-byte moves.
    unsafe {
        if len >= 16 {
            core::ptr::copy_nonoverlapping(src, dst, 16);
            core::ptr::copy_nonoverlapping(src.add(len - 16), dst.add(len - 16), 16);
            if len > 32 {
                core::ptr::copy_nonoverlapping(src.add(16), dst.add(16), 16);
            }
        } else {
            copy_small(src, dst, len);
        }
    }
}

/// Copies exactly `len` bytes (no byte outside `dst..dst + len` is written: the WQE's
/// padding stays as it was, as libmlx5 leaves it). Small sizes use overlapping word
/// copies instead of a `memcpy` call.
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes, not overlapping.
#[inline(always)]
unsafe fn copy_small(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: every access is inside `0..len` of both buffers (the caller's contract).
    unsafe {
        if len > 32 && len <= 48 {
            let a = src.cast::<u128>().read_unaligned();
            let b = src.add(16).cast::<u128>().read_unaligned();
            let c = src.add(len - 16).cast::<u128>().read_unaligned();
            dst.cast::<u128>().write_unaligned(a);
            dst.add(16).cast::<u128>().write_unaligned(b);
            dst.add(len - 16).cast::<u128>().write_unaligned(c);
        } else if (16..=32).contains(&len) {
            let a = src.cast::<u128>().read_unaligned();
            let b = src.add(len - 16).cast::<u128>().read_unaligned();
            dst.cast::<u128>().write_unaligned(a);
            dst.add(len - 16).cast::<u128>().write_unaligned(b);
        } else if (8..16).contains(&len) {
            let a = src.cast::<u64>().read_unaligned();
            let b = src.add(len - 8).cast::<u64>().read_unaligned();
            dst.cast::<u64>().write_unaligned(a);
            dst.add(len - 8).cast::<u64>().write_unaligned(b);
        } else {
            core::ptr::copy_nonoverlapping(src, dst, len);
        }
    }
}

/// A send ring writing mlx5 WQEs directly: the [`SendRing`](crate::SendRing) API
/// (`send_now`, `batch`, `stage`, `flush`, `on_completion`, `progress`, `reset`, split
/// mode) with libmlx5's WQE layout and doorbell (see the [module docs](super)).
///
/// Completions come from a [`DirectPoller`](super::DirectPoller) the ring's SQ is attached
/// to. Another poller reading the same `wrid` table (libmlx5's `ibv_poll_cq`) names the
/// right WR in every successful completion, but not in the error completion of a WR that a
/// lone run or a session posted before its entry was written (see
/// [`send_now`](Self::send_now)), which `DirectPoller` resolves with the CQE's
/// `wqe_counter`.
///
/// # Per-message cost
/// No call into the provider: a message is a few stores into the SQ, its `wr_id` into the
/// `wrid` table, and per batch one doorbell record and one 8-byte doorbell (or the
/// BlueFlame copy of a lone inline WQE). `cargo xtask insn` measures it against libmlx5's
/// `ibv_post_send` and `ibv_wr_*` on the same workload.
pub struct DirectRing<D: Doorbell = Mmio> {
    st: State,
    db: D,
    error: Option<WcError>,
}

// SAFETY: the ring's pointers are to the QP's SQ, doorbell record and register, which the
// device and this ring alone use (new's contract); `&mut self` serialises every access.
unsafe impl<D: Doorbell + Send> Send for DirectRing<D> {}

impl<D: Doorbell> core::fmt::Debug for DirectRing<D> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DirectRing")
            .field("ring_id", &self.ring_id())
            .field("qp_num", &self.st.qp_num)
            .field("depth", &self.st.depth)
            .field("cur_post", &self.st.f.cur)
            .field("staged", &self.st.f.seq)
            .field("posted", &self.st.posted)
            .field("retired", &self.st.retired)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl DirectRing<Mmio> {
    /// A ring on the send queue `sq` with the hardware doorbell; see
    /// [`with_doorbell`](Self::with_doorbell).
    ///
    /// # Errors
    /// As `with_doorbell`, and [`DirectError::NoMmio`] on a target without the hardware
    /// doorbell ([`Mmio::available`]).
    ///
    /// # Safety
    /// As [`with_doorbell`](Self::with_doorbell).
    pub unsafe fn new(
        sq: DirectSq,
        cfg: SendConfig,
        ud: Option<DirectUd>,
    ) -> Result<Self, ConfigError> {
        let Some(db) = Mmio::available() else {
            return Err(ConfigError::Direct(DirectError::NoMmio));
        };
        // SAFETY: forwarded contract.
        unsafe { Self::with_doorbell(sq, cfg, ud, db) }
    }
}

impl<D: Doorbell> DirectRing<D> {
    /// A ring on the send queue `sq`, configured by `cfg` (as for a
    /// [`SendRing`](crate::SendRing); `cfg.ud` is not used: a UD ring takes its
    /// destination as `ud`, the AH's mlx5 address vector), ringing through `db`.
    ///
    /// Fails with [`ConfigError::Direct`] for a send queue the writer does not model or
    /// one too small for `depth` messages of the largest size `cfg` and `sq` allow.
    ///
    /// # Safety
    /// `sq` describes a live QP's send queue (`mlx5dv_init_obj(3)`), in RTS whenever the
    /// ring posts, created with `sq_sig_all = 0`, whose SQ, doorbell record and doorbell
    /// register only this ring uses (no `ibv_post_send`, no `ibv_wr_*`; a register no other
    /// thread rings: a QP of its own thread domain) and which outlives the ring; `sq.wrid`
    /// has `wqe_cnt` entries the ring owns (it writes each once here). Its send completions
    /// are given to [`on_completion`](Self::on_completion) (or a
    /// [`SendRetirer`](crate::SendRetirer)).
    /// `cfg.ring_id` is unique among the rings sharing the CQ; `cfg.remote`'s rkey and
    /// `ud.av` stay valid while the ring uses them.
    pub unsafe fn with_doorbell(
        sq: DirectSq,
        cfg: SendConfig,
        ud: Option<DirectUd>,
        db: D,
    ) -> Result<Self, ConfigError> {
        let cfg = cfg.checked()?;
        let depth = cfg.depth as u64;
        if cfg.remote.is_some() && sq.ud {
            return Err(ConfigError::RemoteAndUd);
        }
        if sq.ud != ud.is_some() || ud.is_some_and(|u| u.av.is_null()) {
            return Err(ConfigError::UdDest);
        }
        let bad = |what| Err(ConfigError::Direct(DirectError::Sq(what)));
        if sq.buf.is_null() || sq.dbrec.is_null() || sq.bf_reg.is_null() || sq.wrid.is_null() {
            return bad("a NULL buffer, doorbell record, register or wrid table");
        }
        if sq.stride != 64 {
            return bad("stride other than 64 bytes");
        }
        if sq.ud && sq.uc {
            return bad("a QP both UD and UC");
        }
        if !sq.wqe_cnt.is_power_of_two() || sq.wqe_cnt > 0x8000 {
            return bad("wqe_cnt not a power of two up to 32768");
        }
        if sq.bf_offset != 0 && sq.bf_offset != sq.bf_size {
            return bad("bf_offset other than 0 or bf_size");
        }
        // BlueFlame blocks are stored whole (`Doorbell::bf_block`, 16-byte stores on x86-64)
        // and the buffer alternates by XOR on the address: bf_size a power of two from 64
        // (or 0: no BlueFlame) and the register aligned to its pair of buffers, as libmlx5
        // lays them out (UAR page + 0x800 + k * 2 * bf_size).
        if sq.bf_size != 0
            && (!sq.bf_size.is_power_of_two()
                || sq.bf_size < 64
                || sq.bf_reg as usize % (2 * sq.bf_size as usize) != 0)
        {
            return bad(
                "a BlueFlame register not aligned to its two buffers (2 x bf_size), or a \
                 bf_size that is not a power of two from 64",
            );
        }
        if cfg.max_inline > sq.max_inline {
            return bad("max_inline above the QP's max_inline_data");
        }
        // The largest WQE: ctrl, then raddr + atomic (RC) or the datagram segment (UD),
        // then the larger of the inline segment and max_sge data segments.
        let addr = if sq.ud { AV_SIZE as u64 } else { 32 };
        let inline = if cfg.max_inline > 0 {
            (cfg.max_inline as u64 + 4).div_ceil(16) * 16
        } else {
            0
        };
        let data = (sq.max_sge.max(1) as u64 * 16).max(inline);
        let max_bbs = (16 + addr + data).div_ceil(64);
        if depth * max_bbs > sq.wqe_cnt as u64 {
            return Err(ConfigError::Direct(DirectError::SqTooSmall {
                need: depth * max_bbs,
                have: sq.wqe_cnt,
            }));
        }
        let mut ring = DirectRing {
            st: State {
                f: Fast {
                    seq: 0,
                    event: 0,
                    id_off: wr_id::encode(cfg.ring_id, 0),
                    cur: 0,
                    mask: sq.wqe_cnt - 1,
                    qpn8: sq.qp_num << 8,
                    max_inline: cfg.max_inline,
                    buf_inline: if cfg.inline_bufs {
                        cfg.max_inline.saturating_add(1)
                    } else {
                        0
                    },
                    sq: sq.buf,
                    wrid: sq.wrid,
                    remote: cfg.remote.unwrap_or_default(),
                    has_remote: cfg.remote.is_some(),
                    uc: sq.uc,
                    ud,
                    last: sq.buf,
                    one_max: if sq.ud { 0 } else { cfg.max_inline.min(44) },
                },
                id_bits: wr_id::encode(cfg.ring_id, 0),
                batch_open: false,
                session_open: false,
                lone_run: false,
                sess_s0: 0,
                sess_ids: 0,
                sess_cur0: 0,
                posted: 0,
                retired: 0,
                limit: depth,
                next_signal: cfg.signal_every as u64 - 1,
                signal_every: cfg.signal_every as u64,
                batch: cfg.batch as u64,
                depth,
                qp_num: sq.qp_num,
                max_sge: sq.max_sge,
                split_key: 0,
                dbrec: sq.dbrec,
                bf_reg: sq.bf_reg,
                bf_cur: sq.bf_reg.wrapping_add(sq.bf_offset as usize),
                bf_size: sq.bf_size,
                bf_max_ds: sq.bf_size / 16,
                bf_one: sq.bf_size >= 64,
                lone_cap: 0,
                lone_dbr: core::ptr::addr_of!(LONE_CLOSED).cast_mut(),
                lone_open: false,
                lone_stop: 0,
                lone_w0: [2, 3, 4].map(|ds| ctrl_word(0, super::opcode::SEND, sq.qp_num << 8 | ds)),
            },
            db,
            error: None,
        };
        ring.st.lone_cap = if ring.st.bf_one && ring.st.f.one_max == 44 {
            44
        } else {
            0
        };
        // Every entry starts as a receive `wr_id` of this ring's id, which names none of its
        // send WRs: an error CQE of a WR whose entry a lone run or session left unwritten
        // (see `write_session_ids`) then never passes for an outstanding WR before the
        // entries are written (a never-written entry could hold anything).
        for i in 0..sq.wqe_cnt as usize {
            // SAFETY: `sq.wrid` has `wqe_cnt` entries the ring owns (the caller's contract).
            unsafe { sq.wrid.add(i).write(ring.st.id_bits | wr_id::RECV_BIT) };
        }
        ring.set_event(ring.event_at());
        Ok(ring)
    }

    /// Sets `cur_post` (the basic-block counter of the next WQE), for a QP libmlx5 already
    /// posted on. Only while nothing is staged or outstanding.
    ///
    /// # Safety
    /// `cur` is the QP's current `sq.cur_post` (its doorbell record's last value, modulo
    /// 2^16, for a QP in RTS).
    pub unsafe fn set_cur_post(&mut self, cur: u32) {
        self.end_run();
        assert_eq!(
            self.st.f.seq, self.st.retired,
            "DirectRing::set_cur_post with WRs staged or outstanding"
        );
        self.st.f.cur = cur;
    }

    /// The doorbell (for tests: the recording one the golden comparison uses).
    pub fn doorbell(&mut self) -> &mut D {
        &mut self.db
    }

    /// Sets `event` (the next sequence number that must take the slow path) and, from it,
    /// the lone path's `lone_stop`: the event's `cur_post` while a lone run is open, nothing
    /// is staged and no batch is open, else closed. Every change of the ring's own
    /// `event` goes through here, except a batch's write-back, which its `finish` / `drop`
    /// follows with this. With a lone run open, the counters must be caught up
    /// ([`catch_up_session`](Self::catch_up_session)) first.
    #[inline(always)]
    fn set_event(&mut self, e: u64) {
        self.st.f.set_epoch(self.st.id_bits);
        self.set_event_in_epoch(e);
    }

    /// [`set_event`](Self::set_event) where `id_off` is already the epoch of `seq`: where
    /// a batch opens (nothing moved `seq` since the last `set_event`, and the batch copied
    /// `id_off` from the ring) and closes (a batch's slow path sets both copies' `id_off`
    /// as it crosses an epoch, and its fast path never does). Five instructions less per
    /// batch, twice (`cargo xtask insn`, direct batch 32).
    #[inline(always)]
    fn set_event_in_epoch(&mut self, e: u64) {
        debug_assert_eq!(self.st.f.id_off, {
            let mut f = self.st.f;
            f.set_epoch(self.st.id_bits);
            f.id_off
        });
        self.st.f.event = e;
        self.set_lone_stop();
    }

    /// `lone_stop` from the ring's event (see [`set_event`](Self::set_event)).
    #[inline(always)]
    fn set_lone_stop(&mut self) {
        let st = &mut self.st;
        debug_assert!(
            !st.lone_run || st.session_open || {
                // SAFETY: the QP's doorbell record (new's contract).
                let dbr = unsafe { st.dbrec.add(super::SND_DBR).read_volatile() };
                u32::from_be(dbr) == st.f.cur & 0xffff || st.f.seq != st.posted
            }
        );
        if !st.lone_run {
            // Closed already (`lone_open` only while a run is open): rings used without
            // `send_now` pay one test here.
            debug_assert!(!st.lone_open);
            return;
        }
        if st.f.seq == st.posted && !st.batch_open {
            // Every WR up to the event is one block: its `cur_post` is the event's
            // distance on (at most `depth` <= 2^15: no 16-bit wrap is ambiguous).
            st.lone_stop =
                st.f.cur
                    .wrapping_add(st.f.event.max(st.f.seq).wrapping_sub(st.f.seq) as u32)
                    & 0xffff;
            // SAFETY: the QP's doorbell record (new's contract).
            st.lone_dbr = unsafe { st.dbrec.add(super::SND_DBR) };
            st.lone_open = true;
        } else {
            st.close_lone();
        }
    }

    /// Sends the next lone post, batch post or session post to the slow path, which
    /// decides the event (and the `wr_id` epoch) itself before it writes a WQE: what
    /// [`set_event`](Self::set_event)`(0)` does, without computing an epoch nobody uses.
    #[inline(always)]
    pub(super) fn park_event(&mut self) {
        self.st.f.event = 0;
        // Without a test: the callers open a batch, window or session, whose loops the
        // branch would reach into.
        self.st.close_lone_now();
    }

    /// The sequence number of the next WR that must take the slow path.
    #[inline]
    fn event_at(&self) -> u64 {
        let st = &self.st;
        let cap = (st.retired + st.limit).saturating_sub(1);
        let batch_end = st.posted + st.batch - 1;
        // The first sequence number of the next epoch takes the slow path (see `id_off`).
        let epoch_end = (st.f.seq | wr_id::SEQ_MASK).wrapping_add(1);
        st.next_signal
            .min(cap)
            .min(batch_end)
            .min(epoch_end)
            .max(st.f.seq)
    }

    /// Stages one message through the fast-path copy `f`; the slow path otherwise.
    #[inline(always)]
    fn stage_fast<'a>(
        &mut self,
        f: &mut Fast,
        msg: Msg<'a>,
        gather: Gather<'a>,
    ) -> Result<u64, SendError> {
        let seq = f.seq;
        let (payload, len, inline) = f.payload(&msg, gather);
        let remote = match f.check(&msg, len, inline) {
            Ok(r) => r,
            Err(e) => return Err(self.refused(seq, e)),
        };
        if seq < f.event {
            // SAFETY: checked; `seq < event` means room, no signal, no batch end.
            let _ = unsafe { f.build(&msg, payload, remote, false) };
            f.seq = seq + 1;
        } else {
            let signaled = match self.slow_decide(seq) {
                Ok(s) => s,
                Err(e) => {
                    // slow_decide parked the ring's own `event` at `seq`; while the batch
                    // is open it stays 0 (see `batch`).
                    self.set_event(0);
                    return Err(e);
                }
            };
            f.set_epoch(self.st.id_bits);
            // SAFETY: checked, and slow_decide found room.
            let _ = unsafe { f.build(&msg, payload, remote, signaled) };
            f.seq = seq + 1;
            f.write_back(&mut self.st.f);
            self.slow_after(seq, false);
            f.event = self.st.f.event;
            f.id_off = self.st.f.id_off;
            // The batch is still open: the ring's own copy keeps sending lone calls to
            // the slow path (see `batch`).
            self.set_event(0);
        }
        Ok(seq)
    }

    /// [`stage_fast`](Self::stage_fast) on the ring's own fast-path state, for the lone
    /// calls: no copy to make and write back.
    #[inline(always)]
    fn stage_own<'a>(
        &mut self,
        msg: Msg<'a>,
        gather: Gather<'a>,
        post: bool,
    ) -> Result<u64, SendError> {
        let mut seq = self.st.f.seq;
        let (payload, len, inline) = self.st.f.payload(&msg, gather);
        let remote = match self.st.f.check(&msg, len, inline) {
            Ok(r) => r,
            Err(e) => return Err(self.refused(seq, e)),
        };
        if seq < self.st.f.event {
            // SAFETY: checked; `seq < event` means room, no signal, no batch end.
            let one = unsafe { self.st.f.build(&msg, payload, remote, false) };
            self.st.f.seq = seq + 1;
            if post {
                if self.lone_block(one, seq) {
                    self.bf_lone(self.st.f.last_ctrl());
                } else {
                    self.ring_doorbell();
                }
            } else {
                // Staged, not posted: no lone post until the doorbell (`flush`).
                self.st.close_lone();
            }
        } else {
            if self.st.batch_open {
                // A leaked batch (its `batch()` set `event` to 0 to bring us here).
                self.drop_leaked_batch();
                seq = self.st.f.seq;
            }
            let signaled = self.slow_decide(seq)?;
            self.st.f.set_epoch(self.st.id_bits);
            // SAFETY: checked, and slow_decide found room.
            let one = unsafe { self.st.f.build(&msg, payload, remote, signaled) };
            self.st.f.seq = seq + 1;
            if post && self.lone_block(one, seq) {
                // The signaled lone post (every `signal_every`-th `send_now`): the same
                // BlueFlame doorbell as the fast path, then the next event.
                self.bf_lone(self.st.f.last_ctrl());
                self.set_event(self.event_at());
            } else {
                self.slow_after(seq, post);
            }
        }
        Ok(seq)
    }

    /// A message failed validation: the error it gets, unless the ring is full or in the
    /// error state, which takes precedence.
    #[cold] // Not `#[inline(never)]`: see `slow_decide`.
    fn refused(&self, seq: u64, e: SendError) -> SendError {
        if !crate::split::has_room(seq, self.st.retired, self.st.limit) {
            self.blocked()
        } else {
            e
        }
    }

    #[cold]
    fn blocked(&self) -> SendError {
        match self.error {
            Some(e) => SendError::QpError(e),
            None => SendError::WouldBlock,
        }
    }

    /// The slow path, before the WQE of sequence `seq` is written (signals, the end of a
    /// batch, a full ring, the error state): whether there is room, and whether the WQE is
    /// signaled. The WR that fills the ring is signaled (and posted at once by
    /// [`slow_after`](Self::slow_after)), so a full ring always has a signaled WR in flight.
    /// It never sees the message, so the fast path never keeps one in memory for it.
    // `#[cold]` without `#[inline(never)]`: rustc links an `#[inline(never)]` generic to
    // an upstream crate's copy when there is one (hotverbs' `DirectRing` instantiates
    // `DirectRing<Mmio>`'s), and the caller's module then cannot see that it does not
    // unwind: every call in a batch loop becomes an invoke with a landing pad dropping the
    // batch, and the loop spills (+4.7 instructions per WR at post list 32).
    #[cold]
    fn slow_decide(&mut self, seq: u64) -> Result<bool, SendError> {
        if !crate::split::has_room(seq, self.st.retired, self.st.limit) {
            self.set_event(seq);
            return Err(self.blocked());
        }
        let full = seq + 1 - self.st.retired == self.st.limit;
        let scheduled = seq == self.st.next_signal;
        if scheduled {
            self.st.next_signal += self.st.signal_every;
        }
        Ok(scheduled || full)
    }

    /// The slow path after the WQE of `seq` was written: the doorbell when posting, at the
    /// end of a batch or when the ring is full; the next event.
    #[cold] // Not `#[inline(never)]`: see `slow_decide`.
    fn slow_after(&mut self, seq: u64, post: bool) {
        let full = seq + 1 - self.st.retired == self.st.limit;
        if post || full || seq + 1 - self.st.posted >= self.st.batch {
            self.ring_doorbell();
        }
        self.set_event(self.event_at());
    }

    /// Is the WQE just built for `seq` (`one`: one block, more than one `ds`) the only
    /// one staged, with BlueFlame taking a block? Then [`bf_lone`](Self::bf_lone) posts it.
    #[inline(always)]
    fn lone_block(&self, one: bool, seq: u64) -> bool {
        one && seq == self.st.posted && self.st.bf_one
    }

    /// [`ring_doorbell`](Self::ring_doorbell) for one staged WQE of one basic block that
    /// BlueFlame takes (more than one `ds`, inline, `bf_one`): the lone `send_now` of a
    /// small message, inline, with nothing to decide.
    #[inline(always)]
    fn bf_lone(&mut self, ctrl: *const u8) {
        let st = &mut self.st;
        let db = &mut self.db;
        // Read before the barriers (which make the compiler reload what it had).
        let (seq, cur) = (st.f.seq, st.f.cur);
        let dst = st.bf_cur;
        db.to_device_barrier();
        // SAFETY: the QP's doorbell record and register (new's contract); the BlueFlame
        // source is the WQE's one block in the SQ (the caller's check), the destination
        // the 64-byte aligned start of the current BlueFlame buffer.
        unsafe {
            db.write_dbr(st.dbrec.add(super::SND_DBR), (cur & 0xffff).to_be());
            db.wc_start();
            db.bf_block(dst.cast::<u64>(), ctrl.cast::<u64>());
        }
        db.flush_writes();
        st.bf_cur = st.bf_cur.map_addr(|a| a ^ st.bf_size as usize);
        st.posted = seq;
    }

    /// [`ring_doorbell`](Self::ring_doorbell) when the newest staged WQE is the one-block
    /// WQE at `last` (a window's or post list's): BlueFlame when it is the only one staged,
    /// else the 8-byte doorbell, as `ring_doorbell` decides for it, without reading the
    /// WQE's size back.
    #[inline(always)]
    pub(super) fn list_doorbell(&mut self, last: *mut u8) {
        if self.st.f.seq - self.st.posted == 1 && self.st.bf_one {
            self.bf_lone(last);
            return;
        }
        let st = &mut self.st;
        let db = &mut self.db;
        let (seq, cur, dst) = (st.f.seq, st.f.cur, st.bf_cur);
        db.to_device_barrier();
        // SAFETY: the QP's doorbell record and register (new's contract); `last` is the
        // newest staged WQE's ctrl segment (the caller's), in the SQ.
        unsafe {
            db.write_dbr(st.dbrec.add(super::SND_DBR), (cur & 0xffff).to_be());
            db.wc_start();
            db.write64(dst.cast::<u64>(), last.cast::<u64>().read());
        }
        db.flush_writes();
        st.bf_cur = st.bf_cur.map_addr(|a| a ^ st.bf_size as usize);
        st.posted = seq;
    }

    /// Announces the staged WQEs: doorbell record, then BlueFlame or the 8-byte doorbell,
    /// as `post_send_db()` (see the [module docs](super) for each barrier).
    #[inline]
    fn ring_doorbell(&mut self) {
        let n = self.st.f.seq - self.st.posted;
        if n == 0 {
            return;
        }
        let st = &mut self.st;
        let db = &mut self.db;
        db.to_device_barrier();
        // SAFETY: the QP's doorbell record and register (new's contract); the BlueFlame
        // source is the last WQE's `ceil(ds / 4)` basic blocks in the SQ, wrapping at its
        // end exactly where the WQE itself wrapped.
        unsafe {
            db.write_dbr(st.dbrec.add(super::SND_DBR), (st.f.cur & 0xffff).to_be());
            db.wc_start();
            let dst = st.bf_cur.cast::<u64>();
            let ds = st.f.last_bf();
            if n == 1 && ds > 1 && ds <= st.bf_max_ds {
                let mut src = st.f.last_ctrl().cast::<u64>().cast_const();
                let mut d = dst;
                for _ in 0..ds.div_ceil(4) {
                    db.bf_block(d, src);
                    d = d.add(8);
                    src = src.add(8);
                    if src == st.f.qend().cast::<u64>().cast_const() {
                        src = st.f.sq.cast::<u64>().cast_const();
                    }
                }
            } else {
                db.write64(dst, st.f.last_ctrl().cast::<u64>().read());
            }
        }
        db.flush_writes();
        st.bf_cur = st.bf_cur.map_addr(|a| a ^ st.bf_size as usize);
        st.posted = st.f.seq;
    }

    /// Stages one message, like [`SendRing::stage`](crate::SendRing::stage). Returns its
    /// sequence number.
    ///
    /// # Safety
    /// For a [`Local::Buf`] the NIC reads or writes: the memory stays registered and valid,
    /// and is not written (SEND / WRITE source) or not accessed (READ / atomic destination)
    /// until `self.is_retired(seq)` or the unsafe [`reset`](Self::reset) returned. A buffer
    /// of at most `max_inline` bytes for SEND / WRITE is, by default, copied during the call
    /// (read by the CPU at its `addr`): device memory (a dmabuf MR) needs
    /// [`SendConfig::inline_bufs`]`(false)`.
    #[inline(always)]
    pub unsafe fn stage(&mut self, msg: Msg<'_>) -> Result<u64, SendError> {
        self.end_run();
        self.stage_own(msg, Gather::One, false)
    }

    /// Stages `msg` and posts it at once with anything already staged (one doorbell). Only
    /// inline or empty payloads ([`SendError::NotInline`]).
    ///
    /// # The lone path
    /// A small inline SEND (1 to 44 bytes: one basic block) on a ring with BlueFlame and
    /// `max_inline >= 44`, not UD, not split, with nothing staged and nothing to decide (no
    /// signal due, room, no error) is a *lone post*: its WQE, the doorbell record, the
    /// BlueFlame copy and the buffer switch, and nothing else (`cargo xtask insn`: 46.9
    /// own instructions a message against the floor's 34.0, about 12 more before this
    /// path existed).
    ///
    /// The first such `send_now` opens a *lone run* (through the slow path). In a run the
    /// ring does not keep its counters, as a held [`DirectSession`] does not: every WQE of
    /// the run is one block with its own doorbell, so the doorbell record, which holds the
    /// last doorbell's `cur_post`, says how many the run posted since the ring last wrote
    /// its counters. The lone path reads its `cur_post` there (the record the doorbell
    /// writes anyway) instead of loading and storing `seq`, `cur_post` and `posted`, and
    /// stops at the `cur_post` of the next WR with something to decide (the signal every
    /// `signal_every`, the WR that fills the ring), which an out-of-line function decides
    /// as the session's does. The run writes no `wrid` entry on the lone path: only
    /// signaled WRs complete successfully, and the stops write theirs; the others are
    /// written when the run ends, or before an error CQE (the failing WR, then a flush of
    /// every later one) is resolved: [`DirectPoller`](super::DirectPoller) hands over the
    /// CQE's `wqe_counter`, and [`on_completion`](Self::on_completion) reads the entry there
    /// again (so completions of a ring with a lone run come from a `DirectPoller`). Every
    /// call other than `send_now` of such a message and `on_completion` ends the run first:
    /// the counters caught up from the doorbell record, the entries written, as if each
    /// post had written its own (the golden comparison checks the table against libmlx5's
    /// once the run ends). In split mode the poller thread reads the entries, which the ring
    /// cannot write for it first: no run opens there.
    #[inline(always)]
    pub fn send_now(&mut self, msg: Msg<'_>) -> Result<u64, SendError> {
        // The lone small inline SEND (the opcode and payload kind are known where the
        // message is built, so after inlining this is one length test, one counter test
        // and the WQE).
        if let (Local::Inline(d), Opcode::Send | Opcode::SendImm) = (msg.local, msg.op) {
            if d.len().wrapping_sub(1) < 44 {
                // SAFETY: `lone_dbr` itself.
                let c = u32::from(u16::from_be(unsafe { lone_counter_be(self.st.lone_dbr) }));
                let st = &self.st;
                let seq = st.f.seq + u64::from(c.wrapping_sub(st.f.cur) & 0xffff);
                if c == st.lone_stop {
                    if !st.lone_open {
                        // No lone run yet, something staged, a batch open, or no lone
                        // path on this ring.
                        let seq = self.lone_slow(msg)?;
                        return Ok(seq);
                    }
                    // The signal, a full ring or the error state: decided out of line,
                    // the post written again in this cold block (a signal bit chosen
                    // here would take a register on the fast path).
                    let fm = self.lone_decide(c)?;
                    // SAFETY: as below; lone_decide found room.
                    unsafe { self.lone_post(c, &msg, d, fm) };
                    return Ok(seq);
                }
                // SAFETY: an RC SEND of 1..=44 inline bytes (the lone path is open, so
                // the ring has one: max_inline >= 44, BlueFlame, not UD), one block, in a
                // lone run with nothing staged and no batch open; room (`c != lone_stop`).
                unsafe { self.lone_post(c, &msg, d, 0) };
                return Ok(seq);
            }
        }
        if !msg.is_borrow_free() {
            return Err(SendError::NotInline);
        }
        self.end_run();
        self.stage_own(msg, Gather::One, true)
    }

    /// A lone post at `cur_post` `c` (16 bits): the WQE of `msg` (an RC SEND / SEND_IMM of
    /// the inline bytes `d`) with the signal bits `fm` (`fm_ce_se << 24`), without a
    /// `wrid` entry, then its doorbell.
    ///
    /// # Safety
    /// As [`Fast::build_one_block`], at `c`, in a lone run, with room.
    #[inline(always)]
    unsafe fn lone_post(&mut self, c: u32, msg: &Msg<'_>, d: &[u8], fm: u64) {
        // Everything read before the WQE's stores, which the compiler cannot tell apart
        // from the ring's fields (it would load them again).
        let st = &self.st;
        let (sq, mask) = (st.f.sq, st.f.mask);
        let (dbr, dst, bf_size) = (st.lone_dbr, st.bf_cur, st.bf_size as usize);
        // `c` as the doorbell record holds it (big-endian), read again here rather than
        // kept in a register across the stops' test.
        // SAFETY: `lone_dbr` itself (the doorbell record: the lone path is open).
        let raw = unsafe { lone_counter_be(dbr) };
        let len = d.len() as u32;
        // 2 to 4: the ctrl segment and 1 to 3 of inline data.
        let ds = 1 + ((len + 19) >> 4);
        // `ctrl_word(c, op, qpn << 8 | ds)` as stored: the counter's two bytes are the
        // doorbell record's as it holds them (`raw`), in place; the rest is the ring's
        // constant for this `ds` (the opcode's difference from SEND is known where the
        // message is built, and lands in byte 3). No byte swap, no 64-bit constant.
        let op = u64::from(MLX5_OP[msg.op as usize] - MLX5_OP[Opcode::Send as usize]);
        let w = (u64::from(raw) << 8) | (st.lone_w0[(ds - 2) as usize] + (op << 24));
        let imm = if matches!(msg.op, Opcode::SendImm) {
            msg.imm.to_be()
        } else {
            0
        };
        // SAFETY: idx < wqe_cnt and the WQE fits the block (the caller's contract).
        let ctrl = unsafe {
            let ctrl = sq.add(((c & mask) as usize) << 6);
            // The ctrl segment first: `raw` and `w` end here (fewer registers live).
            ctrl.cast::<u64>().write(w);
            ctrl.add(8)
                .cast::<u64>()
                .write(fm | (msg.mlx5_flags() as u64) << 24 | (imm as u64) << 32);
            let seg = ctrl.add(16);
            seg.cast::<u32>()
                .write_unaligned((len | INLINE_SEG).to_be());
            copy_upto44(d.as_ptr(), seg.add(4), d.len());
            ctrl
        };
        let db = &mut self.db;
        db.to_device_barrier();
        // SAFETY: the QP's doorbell record and register (new's contract); the BlueFlame
        // source is the WQE's one block in the SQ, the destination the 64-byte aligned
        // start of the current BlueFlame buffer.
        unsafe {
            db.write_dbr(dbr, (c.wrapping_add(1) & 0xffff).to_be());
            db.wc_start();
            db.bf_block(dst.cast::<u64>(), ctrl.cast::<u64>());
        }
        db.flush_writes();
        self.st.bf_cur = dst.map_addr(|a| a ^ bf_size);
    }

    /// The lone path at its stop, `cur_post` `c` (a signal due, the WR that fills the
    /// ring, a full ring, the error state): the run's counters caught up (the posts since
    /// they were written: the doorbell record's `c` says how many), room, the signal, this
    /// WR's `wrid` entry, and the counters and next stop as they will be once it is posted
    /// (the caller posts it at once; nothing looks at the ring in between). Returns the
    /// signal bits. As a session's `session_decide`: takes and returns values.
    #[cold]
    #[inline(never)]
    fn lone_decide(&mut self, c: u32) -> Result<u64, SendError> {
        let st = &mut self.st;
        let seq = st.f.seq + u64::from(c.wrapping_sub(st.f.cur) & 0xffff);
        st.f.seq = seq;
        st.posted = seq;
        st.f.cur = c;
        if !crate::split::has_room(seq, st.retired, st.limit) {
            self.set_event(seq);
            return Err(self.blocked());
        }
        // One past the last sequence number with room (`seq < end`, checked above).
        let end = st.retired + st.limit;
        let ns = st.next_signal;
        let scheduled = seq >= ns;
        let fm = if scheduled || seq + 1 == end {
            u64::from(CTRL_CQ_UPDATE) << 24
        } else {
            0
        };
        let ns = if scheduled {
            let n = seq + st.signal_every;
            st.next_signal = n;
            n
        } else {
            ns
        };
        // SAFETY: `c & mask` < wqe_cnt: an entry of the table; the WR has room.
        unsafe { st.write_id(c, seq) };
        st.f.seq = seq + 1;
        st.posted = seq + 1;
        st.f.cur = c.wrapping_add(1);
        // The next stop: the next signal, or the WR that fills the ring, or the next WR
        // when this one fills it (no batch end: every lone post rings; no `wr_id` epoch:
        // every entry is computed for its own WR). The ring's own event is left to the
        // call that ends the run (`end_lone_run`): every other path starts there.
        let ev = ns.min(end - 1).max(seq + 1);
        st.lone_stop = c.wrapping_add(1).wrapping_add((ev - (seq + 1)) as u32) & 0xffff;
        st.f.event = 0;
        Ok(fm)
    }

    /// `send_now` of a message the lone path takes, while the lone path is closed (no lone
    /// run yet, something staged, a batch open): the slow path, then a lone run with its
    /// first stop.
    #[cold]
    #[inline(never)]
    fn lone_slow(&mut self, msg: Msg<'_>) -> Result<u64, SendError> {
        if self.st.lone_run {
            // The counters of the run's posts so far (the run goes on: this WR is one
            // block too, and the slow path writes its `wrid` entry).
            self.catch_up_session();
        }
        let r = self.stage_own(msg, Gather::One, true);
        let st = &mut self.st;
        // A run starts with nothing staged: the doorbell record then holds `cur_post`,
        // from which it counts its posts.
        if !st.lone_run
            && st.lone_cap != 0
            && st.f.seq == st.posted
            && !st.batch_open
            && !st.session_open
            && st.split_key == 0
        {
            st.lone_run = true;
            st.sess_s0 = st.f.seq;
            st.sess_ids = st.f.seq;
            st.sess_cur0 = st.f.cur;
        }
        self.set_lone_stop();
        r
    }

    /// Ends an open lone run: counters caught up from the doorbell record, the run's
    /// `wrid` entries written, the lone path closed until the next `send_now` opens a run.
    /// What every call but `send_now`'s lone path and `on_completion` does first.
    #[inline(always)]
    fn end_run(&mut self) {
        if self.st.lone_run {
            self.end_lone_run();
        }
    }

    /// [`end_run`](Self::end_run) and a leaked batch's or session's repair, out of line:
    /// what a call that opens something of its own (a session) does first.
    #[cold]
    #[inline(never)]
    pub(super) fn repair(&mut self) {
        self.end_run();
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
    }

    /// Writes back what a lone run of `send_now` (see its docs) or a leaked
    /// [`DirectSession`] posted without the ring's counters: counted from the doorbell
    /// record, with their `wrid` entries. Every call does this first when it needs to;
    /// [`reset`](Self::reset) needs it done before the QP's move to RESET, which clears the
    /// doorbell record. Posts nothing (a leaked batch stays as [`reset`](Self::reset) and
    /// the next call find it).
    pub fn settle(&mut self) {
        self.end_run();
        if self.st.session_open {
            self.drop_leaked_batch();
        }
    }

    #[cold]
    #[inline(never)]
    fn end_lone_run(&mut self) {
        self.catch_up_session();
        self.write_session_ids();
        self.st.close_lone();
        self.st.lone_run = false;
        // The event too (the run's stops left it to here: see `lone_decide`).
        self.set_event(self.event_at());
    }

    /// Stages `msg` (whose own payload must be [`Local::Empty`]) with the inline gather
    /// list `parts` (1 to the QP's `max_send_sge` pieces, as for SGEs), copied into one
    /// inline segment now. Returns its sequence number.
    pub fn stage_inline_gather(&mut self, msg: Msg<'_>, parts: &[&[u8]]) -> Result<u64, SendError> {
        if !matches!(msg.local, Local::Empty)
            || !matches!(
                msg.op,
                Opcode::Send | Opcode::SendImm | Opcode::Write | Opcode::WriteImm
            )
        {
            return Err(SendError::NotInline);
        }
        // Each piece is one SGE to the device's limit (libmlx5 refuses more with ENOMEM).
        if parts.is_empty() || parts.len() > self.st.max_sge as usize {
            return Err(SendError::Config(ConfigError::Slots));
        }
        self.end_run();
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
        self.stage_own(msg, Gather::InlineList(parts), false)
    }

    /// Stages `msg` with the scatter/gather list `sges` (1 to the QP's `max_send_sge`
    /// entries; zero-length entries get no segment, as in libmlx5) instead of its own
    /// payload, which must be empty ([`Local::Empty`], or a zero-length buffer for the
    /// READ / atomic constructors). Returns its sequence number.
    ///
    /// # Safety
    /// As [`stage`](Self::stage) for every buffer of `sges`.
    pub unsafe fn stage_gather(
        &mut self,
        msg: Msg<'_>,
        sges: &[LocalBuf],
    ) -> Result<u64, SendError> {
        if !matches!(msg.local, Local::Empty) && !matches!(msg.local, Local::Buf(b) if b.len == 0) {
            return Err(SendError::NotInline);
        }
        if sges.is_empty() || sges.len() > self.st.max_sge as usize {
            return Err(SendError::Config(ConfigError::Slots));
        }
        self.end_run();
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
        self.stage_own(msg, Gather::Sges(sges), false)
    }

    /// Opens a batch of inline messages, posted with one doorbell when the batch
    /// auto-flushes, on [`DirectBatch::finish`], or when it is dropped.
    #[inline]
    pub fn batch<'d>(&mut self) -> DirectBatch<'_, 'd, D> {
        if self.st.batch_open | self.st.lone_run {
            self.repair();
        }
        self.st.batch_open = true;
        let f = self.st.f;
        // While the batch is open the ring's own copy sends every lone call to the slow
        // path, which finds `batch_open` only if the batch was leaked (its drop or finish
        // writes its copy back, `event` included).
        self.set_event_in_epoch(0);
        DirectBatch {
            f,
            ring: self,
            _data: PhantomData,
        }
    }

    /// A dropped [`DirectBatch`]: takes back what its push loop changed (`seq`, `event`,
    /// `cur`, `last`: [`Fast::write_back`]'s fields) and posts what it staged. Out of line:
    /// see the batch's `Drop`.
    #[inline(never)]
    fn close_batch(&mut self, seq: u64, event: u64, cur: u32, last: *mut u8) {
        let f = &mut self.st.f;
        f.seq = seq;
        f.event = event;
        f.cur = cur;
        f.last = last;
        self.st.batch_open = false;
        self.ring_doorbell();
        self.set_event(event);
    }

    /// A [`DirectBatch`] was leaked (`mem::forget`): its WQEs were written but never
    /// announced, so the ring goes back to its posted count (the device never saw them).
    #[cold]
    #[inline(never)]
    fn drop_leaked_batch(&mut self) {
        self.st.batch_open = false;
        if self.st.session_open {
            // A leaked session posted every message it wrote: count them, drop nothing,
            // and write the `wrid` entries its fast path did not.
            self.end_leaked_session();
            self.set_event(self.event_at());
        } else {
            self.unstage_to_posted();
        }
    }

    /// Posts what is staged with one doorbell. Never fails: the device is told by plain
    /// stores.
    #[inline]
    pub fn flush(&mut self) -> Result<(), SendError> {
        self.end_run();
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
        self.ring_doorbell();
        // Nothing staged now: the lone path is open again.
        self.set_event(self.st.f.event);
        Ok(())
    }

    /// Drops the staged WRs (their WQE bytes stay in the SQ, unannounced) and rewinds
    /// the signal schedule and `cur_post` to the last doorbell.
    #[cold]
    fn unstage_to_posted(&mut self) {
        let seq = self.st.posted;
        self.st.f.seq = seq;
        // `cur_post` at the last doorbell is in the doorbell record (its low 16 bits; the
        // WQEs staged since span fewer than wqe_cnt <= 2^15 blocks). Kept nowhere else, so
        // that no post has to store it.
        // SAFETY: the QP's doorbell record (new's contract), which only this ring writes.
        let dbr = u32::from_be(unsafe { self.st.dbrec.add(super::SND_DBR).read_volatile() });
        let cur = self.st.f.cur;
        self.st.f.cur = cur.wrapping_sub(cur.wrapping_sub(dbr) & 0xffff);
        let st = &mut self.st;
        while st.next_signal >= st.signal_every && st.next_signal - st.signal_every >= seq {
            st.next_signal -= st.signal_every;
        }
        self.set_event(self.event_at());
    }

    /// Retires the WRs covered by a send completion of this ring, exactly as
    /// [`SendRing::on_completion`](crate::SendRing::on_completion).
    ///
    /// # Errors
    /// The completion's error status, or [`WcError::Misrouted`] for a completion that is
    /// not this ring's (another ring id, a receive, another QP; nothing changes).
    #[inline]
    pub fn on_completion(&mut self, c: &Completion) -> Result<u64, WcError> {
        if wr_id::foreign(c.wr_id(), c.qp_num(), self.st.id_bits, self.st.qp_num) {
            return self.refuse(c);
        }
        let st = &mut self.st;
        let Some(s) = wr_id::full_seq(st.posted, st.retired, c.seq()) else {
            return self.stale_or_session(c);
        };
        let n = s + 1 - st.retired;
        st.retired = s + 1;
        match c.status() {
            Ok(()) => Ok(n),
            Err(e) => {
                self.enter_error(e);
                Err(e)
            }
        }
    }

    /// [`on_completion`](Self::on_completion) of a completion that is not outstanding as
    /// the ring's counters say: stale (`Ok(0)`), unless a session (open or leaked) posted
    /// it since it last wrote the counters back (an error's flush of an unsignaled WR):
    /// then the ring catches up and retires it.
    #[cold]
    #[inline(never)]
    fn stale_or_session(&mut self, c: &Completion) -> Result<u64, WcError> {
        if !self.st.session_open && !self.st.lone_run {
            return Ok(0);
        }
        // Counters from the doorbell record, and the entries the session's fast path left
        // unwritten.
        self.catch_up_session();
        self.write_session_ids();
        // Only a signaled WR completes successfully, and the session's slow path wrote its
        // entry; an error CQE (the failing WR, then a flush of every later one) may be for
        // any WR: its entry is read again, at the CQE's `wqe_counter`.
        let seq55 = if c.status().is_ok() {
            c.seq()
        } else {
            let st = &self.st;
            // SAFETY: `wqe_counter & mask` < wqe_cnt: an entry of the table.
            let id = unsafe {
                st.f.wrid
                    .add((u32::from(c.sq_wqe_counter()) & st.f.mask) as usize)
                    .read()
            };
            if (id ^ st.id_bits) >> wr_id::KIND_SHIFT != 0 {
                return Ok(0);
            }
            wr_id::seq_of(id)
        };
        let st = &mut self.st;
        let Some(s) = wr_id::full_seq(st.posted, st.retired, seq55) else {
            return Ok(0);
        };
        let n = s + 1 - st.retired;
        st.retired = s + 1;
        match c.status() {
            Ok(()) => Ok(n),
            Err(e) => {
                self.enter_error(e);
                Err(e)
            }
        }
    }

    /// [`on_completion`](Self::on_completion) of a completion whose ring id, kind or QP is
    /// not this ring's: [`WcError::Misrouted`] (`Ok(0)` for a spent one). Out of line, on
    /// the ring and the completion only (see `cq::refuse_send`).
    #[cold]
    #[inline(never)]
    fn refuse(&mut self, c: &Completion) -> Result<u64, WcError> {
        // An error CQE for a session's WR whose entry was never written (another ring's,
        // or none yet): found at its `wqe_counter`.
        if (self.st.session_open || self.st.lone_run)
            && c.qp_num() == self.st.qp_num
            && c.status().is_err()
        {
            return self.stale_or_session(c);
        }
        crate::cq::refuse_send(c, self.ring_id())
    }

    #[cold]
    #[inline(never)]
    fn enter_error(&mut self, e: WcError) {
        if self.st.lone_run {
            // The event below is the run's true `seq` (see `set_event`).
            self.catch_up_session();
        }
        if self.error.is_none() {
            self.error = Some(e);
        }
        self.st.limit = 0;
        self.set_event(self.st.f.seq);
    }

    fn retire_to(&mut self, retired: u64) {
        if retired > self.st.retired && retired <= self.st.posted {
            self.st.retired = retired;
        }
    }

    /// Split mode: counters and a retirer for the poller thread, as
    /// [`SendRing::split`](crate::SendRing::split).
    pub fn split(&mut self) -> (crate::split::SendCounters, crate::split::SendRetirer) {
        self.end_run();
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
        let key = crate::split::new_key();
        self.st.split_key = key;
        (
            crate::split::SendCounters::keyed(key, self.st.posted, self.st.retired),
            crate::split::SendRetirer::keyed(
                key,
                self.ring_id(),
                self.st.qp_num,
                self.st.depth,
                self.st.retired,
            ),
        )
    }

    /// Split mode, poster side, as [`SendRing::sync`](crate::SendRing::sync).
    ///
    /// # Panics
    /// If `shared` are not the counters of this ring's latest [`split`](Self::split).
    #[inline]
    pub fn sync<O: crate::split::Orderings>(&mut self, shared: &crate::split::SendCounters<O>) {
        if shared.key() != self.st.split_key || shared.key() == 0 {
            panic!(
                "DirectRing::sync: counters of another ring or split (key {}, this ring's \
                 latest split has key {}): use the counters DirectRing::split returned",
                shared.key(),
                self.st.split_key
            );
        }
        self.retire_to(shared.observe_retired());
        if let Some(e) = shared.observe_error() {
            self.enter_error(e);
        }
        shared.publish_posted(self.st.posted);
    }

    /// Forgets every staged and outstanding WR and leaves the error state; `cur_post` goes
    /// back to 0, as libmlx5's `mlx5_init_qp_indices` on the move to RESET (the device's
    /// counter restarts there). Returns the number of WRs that never completed.
    ///
    /// # Safety
    /// As [`SendRing::reset`](crate::SendRing::reset): the QP went to RESET (the device no
    /// longer uses any WR of this ring, and libibverbs cleared the doorbell record), and in
    /// split mode no retirer is running. [`settle`](Self::settle) was called after the
    /// ring's last post and before that move (a lone run's and a leaked session's posts are
    /// counted from the doorbell record: after RESET the count would be wrong, though never
    /// unsound). Also: no CQE of this QP is left unconsumed in its
    /// send CQ. libmlx5 does not clean a CQ that went through `mlx5dv_init_obj` (see
    /// [`DirectPoller::clean`](super::DirectPoller::clean)), and a stale CQE read after
    /// the reset would name a `wrid` entry this ring reuses: call `clean` with the QP's
    /// number after the move to RESET and before this, unless every outstanding WR was
    /// retired.
    pub unsafe fn reset(&mut self) -> u64 {
        self.end_run();
        if self.st.session_open {
            self.end_leaked_session();
        }
        self.st.batch_open = false;
        let dropped = self.st.f.seq - self.st.retired;
        let posted = self.st.posted;
        self.st.f.seq = posted;
        self.st.retired = posted;
        self.st.f.cur = 0;
        self.error = None;
        self.st.limit = self.st.depth;
        self.st.next_signal = posted + self.st.signal_every - 1;
        self.set_event(self.event_at());
        dropped
    }

    /// Leaves split mode: the retirer comes back by value (the polling thread is done
    /// with it), the ring absorbs the counters' progress and error (as `sync`), and from
    /// then on it retires its own completions (`on_completion`) and takes no counters or
    /// retirer of that split. Its safe recovery (the setup layer's `reset_qp`) needs it.
    ///
    /// # Panics
    /// If `shared` and `retirer` are not the pair of this ring's latest split, or the
    /// ring is not in split mode.
    pub fn unsplit<O: crate::split::Orderings>(
        &mut self,
        shared: &crate::split::SendCounters<O>,
        retirer: crate::split::SendRetirer,
    ) {
        retirer.join("DirectRing::unsplit", self.st.split_key, shared);
        self.sync(shared);
        self.st.split_key = 0;
    }

    /// True once [`split`](Self::split) handed out counters and a retirer.
    #[inline]
    pub fn is_split(&self) -> bool {
        self.st.split_key != 0
    }

    /// Points the ring's RDMA WRITE / READ / atomic messages at `remote` from now on (a
    /// new peer after a recovery), as [`SendRing::set_remote`](crate::SendRing::set_remote):
    /// staged WQEs are rung first with the old one.
    ///
    /// # Errors
    /// `Config(RemoteAndUd)` on a UD ring; the errors of [`flush`](Self::flush).
    pub fn set_remote(&mut self, remote: RemoteBuf) -> Result<(), SendError> {
        if self.st.f.ud.is_some() {
            return Err(SendError::Config(ConfigError::RemoteAndUd));
        }
        self.flush()?;
        self.st.f.remote = remote;
        self.st.f.has_remote = true;
        Ok(())
    }

    /// Makes the next staged WR signaled, whatever the schedule says.
    #[inline]
    pub fn signal_next(&mut self) {
        self.end_run();
        self.st.next_signal = self.st.f.seq;
        self.set_event(self.st.f.seq);
    }

    /// True once the WR with sequence `seq` is retired.
    #[inline(always)]
    pub fn is_retired(&self, seq: u64) -> bool {
        seq < self.st.retired
    }
    /// WRs posted and not yet retired.
    #[inline(always)]
    pub fn outstanding(&self) -> u64 {
        self.st.posted + self.session_delta() - self.st.retired
    }
    /// Retired and outstanding counts for a [`StallWatch`](crate::StallWatch).
    #[inline(always)]
    pub fn progress(&self) -> crate::Progress {
        crate::Progress {
            retired: self.st.retired,
            outstanding: self.st.posted + self.session_delta() - self.st.retired,
        }
    }
    /// WRs staged and not yet posted.
    #[inline(always)]
    pub fn staged(&self) -> u64 {
        self.st.f.seq - self.st.posted
    }
    /// Messages that may still be staged (0 in the error state).
    #[inline(always)]
    pub fn free(&self) -> u64 {
        self.st
            .limit
            .saturating_sub(self.st.f.seq + self.session_delta() - self.st.retired)
    }
    /// Total WRs posted since creation.
    #[inline(always)]
    pub fn posted_total(&self) -> u64 {
        self.st.posted + self.session_delta()
    }
    /// Total WRs retired since creation.
    #[inline(always)]
    pub fn retired_total(&self) -> u64 {
        self.st.retired
    }
    /// The configured depth.
    #[inline(always)]
    pub fn depth(&self) -> u64 {
        self.st.depth
    }
    /// The signal period.
    #[inline(always)]
    pub fn signal_every(&self) -> u64 {
        self.st.signal_every
    }
    /// The first error completion seen since creation or the last reset.
    #[inline(always)]
    pub fn error(&self) -> Option<WcError> {
        self.error
    }
    /// The ring id in its `wr_id`s.
    #[inline(always)]
    pub fn ring_id(&self) -> u8 {
        wr_id::ring_of(self.st.id_bits)
    }
    /// libmlx5's `sq.cur_post`: the basic-block counter of the next WQE (after a leaked
    /// session, from the doorbell record, as the ring's next call takes it back).
    #[inline]
    pub fn cur_post(&self) -> u32 {
        if self.st.session_open || self.st.lone_run {
            return self.session_cur().wrapping_add(self.session_delta() as u32);
        }
        self.st.f.cur
    }
    /// True when the next `send_now` of a small inline SEND (1 to 44 bytes) takes the lone
    /// path without deciding anything: a lone run is open, nothing is staged, and the next
    /// WR needs no signal and has room (see [`send_now`](Self::send_now)). For tests and
    /// for checking that a ring is configured for it (`max_inline` >= 44, BlueFlame, not
    /// UD, not split).
    #[inline]
    pub fn lone_ready(&self) -> bool {
        // SAFETY: `lone_dbr` itself.
        let raw = unsafe { lone_counter_be(self.st.lone_dbr) };
        self.st.lone_open && u32::from(u16::from_be(raw)) != self.st.lone_stop
    }
    /// The BlueFlame buffer offset the next doorbell uses (after a leaked session: the
    /// session's first, switched once per doorbell it rang).
    #[inline]
    pub fn bf_offset(&self) -> u32 {
        let mut off = self.st.bf_cur.addr() - self.st.bf_reg.addr();
        if self.st.session_open {
            let rung = self.cur_post().wrapping_sub(self.st.sess_cur0);
            off ^= (rung as usize & 1) * self.st.bf_size as usize;
        }
        off as u32
    }
}

/// Inline messages staged for one doorbell; see [`DirectRing::batch`].
#[must_use = "a batch posts its messages on finish() or drop"]
pub struct DirectBatch<'r, 'd, D: Doorbell = Mmio> {
    ring: &'r mut DirectRing<D>,
    f: Fast,
    _data: PhantomData<&'d [u8]>,
}

impl<D: Doorbell> core::fmt::Debug for DirectBatch<'_, '_, D> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DirectBatch")
            .field("ring", &self.ring)
            .field("staged", &self.staged())
            .finish()
    }
}

impl<'d, D: Doorbell> DirectBatch<'_, 'd, D> {
    /// Stages one inline or empty message (auto-flushing at the batch size or when the ring
    /// fills). Returns its sequence number.
    #[inline(always)]
    pub fn push(&mut self, msg: Msg<'d>) -> Result<u64, SendError> {
        // The small inline SEND, as in `send_now`: one length test, one counter test.
        if let (Local::Inline(d), Opcode::Send | Opcode::SendImm) = (msg.local, msg.op) {
            let seq = self.f.seq;
            if d.len().wrapping_sub(1) < self.f.one_max as usize && seq < self.f.event {
                // SAFETY: an RC SEND of 1..=44 inline bytes within max_inline (one_max), one
                // block; `seq < event` means room, no signal, no batch end.
                let (ctrl, ds) = unsafe { self.f.build_one_block(&msg, d, false, 0, false) };
                self.f.set_last(ctrl, ds);
                self.f.seq = seq + 1;
                return Ok(seq);
            }
        }
        if !msg.is_borrow_free() {
            return Err(SendError::NotInline);
        }
        self.ring.stage_fast(&mut self.f, msg, Gather::One)
    }

    /// Number of messages staged and not yet posted.
    #[inline(always)]
    pub fn staged(&self) -> u64 {
        self.f.seq - self.ring.st.posted
    }

    /// `cur_post`: the basic-block counter of the next WQE (as
    /// [`DirectRing::cur_post`]).
    #[inline(always)]
    pub fn cur_post(&self) -> u32 {
        self.f.cur
    }

    /// Posts what is staged and closes the batch.
    #[inline(always)]
    pub fn finish(self) -> Result<(), SendError> {
        let mut this = core::mem::ManuallyDrop::new(self);
        let f = this.f;
        f.write_back(&mut this.ring.st.f);
        this.ring.st.batch_open = false;
        this.ring.ring_doorbell();
        let e = this.ring.st.f.event;
        this.ring.set_event_in_epoch(e);
        Ok(())
    }
}

impl<D: Doorbell> Drop for DirectBatch<'_, '_, D> {
    // Tiny, so that the compiler inlines the drop glue everywhere, error and unwind paths
    // included: glue called out of line would take the batch's address, and a batch whose
    // address escapes stays in memory, so its push loop loads and stores the counters at
    // every message (measured with `cargo xtask insn`, a push loop with an early
    // `return Err(..)`: 58.4 instructions per WR at post list 32 before, 51.6 after).
    // `finish` stays inline.
    #[inline(always)]
    fn drop(&mut self) {
        let f = &self.f;
        self.ring.close_batch(f.seq, f.event, f.cur, f.last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx5::{DirectCq, DirectPoller, RecordingDoorbell};
    use crate::{Local, Msg};
    use hotverbs_softnic::mlx5sim::Mlx5Sim;

    /// A ring (id 5, depth 16, a signal every 4, batches of 8) and its poller on a
    /// simulator of 64 blocks, its counters set as a ring that has retired everything has
    /// them 6 WRs before the end of the first `wr_id` epoch; and that sequence number.
    fn ring_before_the_epoch_end() -> (
        Mlx5Sim,
        DirectRing<RecordingDoorbell>,
        DirectPoller<16>,
        u64,
    ) {
        let mut sim = Mlx5Sim::new(64, 64, 0xabc);
        let p = sim.ptrs();
        let sq = DirectSq {
            buf: p.sq,
            wqe_cnt: sim.wqe_cnt,
            stride: 64,
            dbrec: p.qp_dbrec,
            bf_reg: p.bf_reg,
            bf_size: 256,
            bf_offset: 0,
            qp_num: 0xabc,
            ud: false,
            uc: false,
            max_inline: 64,
            max_sge: 1,
            wrid: p.wrid,
        };
        let cq = DirectCq {
            buf: p.cq,
            cqe_cnt: sim.cqe_cnt,
            cqe_size: 64,
            dbrec: p.cq_dbrec,
            cqn: 1,
            cons_index: 0,
        };
        let cfg = SendConfig::new(5, 16, 64).signal_every(4).batch(8);
        // SAFETY: the simulator's memory (heap regions, which stay where they are when the
        // simulator moves) outlives the ring and the poller; nothing else posts or polls.
        let (mut r, poll) = unsafe {
            let r = DirectRing::with_doorbell(sq, cfg, None, RecordingDoorbell::new(sq.bf_reg))
                .unwrap();
            let mut poll = DirectPoller::<16>::new(cq).unwrap();
            poll.attach(&sq).unwrap();
            (r, poll)
        };
        // The boundary (2^55) is start + 6; signals fall on start + 3, + 7, ...
        let start = wr_id::SEQ_MASK + 1 - 6;
        r.st.f.seq = start;
        r.st.posted = start;
        r.st.retired = start;
        r.st.next_signal = start + 3;
        let e = r.event_at();
        r.set_event(e);
        (sim, r, poll, start)
    }

    /// The `wrid` entry of sequence `s` on [`ring_before_the_epoch_end`]'s ring (`start`),
    /// whose WQEs are all one block: `s` is at block `s - start`.
    fn wrid_at(p: &hotverbs_softnic::mlx5sim::SimPtrs, start: u64, s: u64) -> u64 {
        // SAFETY: an entry of the simulator's 64-entry wrid table.
        unsafe { p.wrid.add(((s - start) & 63) as usize).read() }
    }

    /// The fast path's `wr_id` is `seq + id_off`, valid within one epoch of 2^55 sequence
    /// numbers: a ring started just before the end of the first epoch (counters set as a
    /// ring that has retired everything has them) crosses it, and every WQE's `wrid` entry
    /// is `encode(ring, seq)`: an unsignaled WQE in a batch at the boundary (which the
    /// epoch's event sends to the slow path), the posts after staged WRs that crossed it
    /// were rewound by a leaked batch (`set_event` resets the epoch), lone runs (whose
    /// entries are written when the run ends), and the completions, which retire exactly
    /// everything.
    #[test]
    fn sequence_numbers_cross_the_wr_id_epoch() {
        let (mut sim, mut r, mut poll, start) = ring_before_the_epoch_end();
        let p = sim.ptrs();
        let wrid = |s: u64| wrid_at(&p, start, s);
        let check = |from: u64, to: u64| {
            for s in from..=to {
                assert_eq!(wrid(s), wr_id::encode(5, s), "wrid of seq {s:#x}");
            }
        };
        let data = [0x33u8; 20];
        let msg = Msg::send(Local::Inline(&data));

        // Staged WRs crossing the boundary, then a leaked batch: never announced, all
        // rewound to `start`, back in the first epoch.
        for s in start..start + 7 {
            // SAFETY: inline payloads (copied now).
            assert_eq!(unsafe { r.stage(msg) }.unwrap(), s);
        }
        check(start, start + 6);
        core::mem::forget(r.batch());
        // A batch crossing the boundary, leaked too.
        let mut b = r.batch();
        for _ in 0..7 {
            b.push(msg).unwrap();
        }
        check(start, start + 6);
        core::mem::forget(b);

        let mut got = 0;
        let mut drain = |r: &mut DirectRing<RecordingDoorbell>| {
            sim.process();
            for c in poll.poll().unwrap().iter() {
                assert_eq!(c.ring(), 5, "{:#x}", c.wr_id());
                got += r.on_completion(c).unwrap();
            }
        };
        let mut last = start - 1;
        for round in 0..12u64 {
            let first = last + 1;
            if round % 3 == 2 {
                let mut b = r.batch();
                for _ in 0..3 {
                    last = b.push(msg).unwrap();
                }
                b.finish().unwrap();
            } else {
                // A lone run (the first post opens it): its entries are written when
                // the run ends, here at `flush`.
                for _ in 0..3 {
                    last = r.send_now(msg).unwrap();
                }
                assert_eq!(r.posted_total(), last + 1);
                r.flush().unwrap();
            }
            assert_eq!(r.posted_total(), last + 1);
            check(first, last);
            drain(&mut r);
        }
        assert!(
            last > wr_id::SEQ_MASK + 10,
            "the run crossed the epoch: {last:#x}"
        );
        r.signal_next();
        let end = r.send_now(Msg::send(Local::Empty)).unwrap();
        check(end, end);
        drain(&mut r);
        assert_eq!(
            got,
            end + 1 - start,
            "everything retired, by its own completions"
        );
        assert_eq!(r.outstanding(), 0);
    }

    /// A session across the end of a `wr_id` epoch: its fast path writes no `wrid` entry
    /// and its event does not stop at the boundary, yet every entry is `encode(ring, seq)`
    /// once the session closes, an error CQE past the boundary (of an unsignaled WR) is
    /// resolved to its WR, and everything retires exactly once.
    #[test]
    fn a_session_crosses_the_wr_id_epoch() {
        let (mut sim, mut r, mut poll, start) = ring_before_the_epoch_end();
        let p = sim.ptrs();
        let wrid = |s: u64| wrid_at(&p, start, s);
        let mut retired = 0;
        {
            let mut ses = r.session::<16>().unwrap();
            for i in 0..12u64 {
                assert_eq!(ses.send(&[i as u8; 16]).unwrap(), start + i);
                if i % 4 == 3 {
                    sim.process();
                    for c in poll.poll().unwrap().iter() {
                        retired += ses.on_completion(c).unwrap();
                    }
                }
            }
        }
        for s in start..start + 12 {
            assert_eq!(wrid(s), wr_id::encode(5, s), "wrid of seq {s:#x}");
        }
        assert_eq!(retired, 12);
        // Past the boundary: start + 14 (unsignaled, fast path) fails, the rest flush.
        let mut errors = 0;
        {
            let mut ses = r.session::<16>().unwrap();
            for i in 12..14u64 {
                ses.send(&[i as u8; 16]).unwrap();
            }
            sim.process();
            sim.fail_next(0x04, 0x51);
            for i in 14..18u64 {
                ses.send(&[i as u8; 16]).unwrap();
            }
            sim.process();
            for c in poll.poll().unwrap().iter() {
                match ses.on_completion(c) {
                    Ok(n) => panic!("a success after the failure ({n} retired)"),
                    Err(e) => {
                        if errors == 0 {
                            assert_eq!(e, WcError::LocProt, "the failing WR's status first");
                        }
                        errors += 1;
                    }
                }
            }
        }
        assert_eq!(errors, 4, "the failing WR and the three after it");
        assert_eq!(r.posted_total(), start + 18);
        assert_eq!(r.retired_total(), start + 18, "every WR retired once");
        assert_eq!(r.outstanding(), 0);
    }
}
