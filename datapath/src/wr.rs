//! [`WrRing`]: the [`Msg`] API posting through the extended work-request verbs
//! (`ibv_wr_start` / `ibv_wr_*` / `ibv_wr_complete`) instead of `ibv_post_send` chains.
//!
//! The ring has no WR array: per message it sets `qpx->wr_id` (the same encoding as a
//! [`SendRing`](crate::SendRing), so [`Completion`]s dispatch the same way) and
//! `qpx->wr_flags` (`IBV_SEND_SIGNALED` on the schedule's turn, `IBV_SEND_INLINE` for inline
//! payloads: rxe inlines only with it; `IBV_SEND_FENCE` / `IBV_SEND_SOLICITED` of a
//! [`Msg::fence`] / [`Msg::solicited`]), calls the opcode's builder (`ibv_wr_send`,
//! `ibv_wr_send_imm`, `ibv_wr_rdma_write(_imm)`, `ibv_wr_rdma_read`,
//! `ibv_wr_atomic_fetch_add`, `ibv_wr_atomic_cmp_swp`), then `ibv_wr_set_ud_addr` in UD mode
//! and `ibv_wr_set_inline_data` or `ibv_wr_set_sge` (`ibv_wr_set_sge_list` with no entries for
//! a zero-byte message). The first staged message opens the region (`ibv_wr_start`), a flush
//! closes it (`ibv_wr_complete`): one batch, one doorbell.
//!
//! # Refusals and failures
//! - A message the ring refuses (ring full, QP error, inline payload too long, remote range,
//!   an opcode the QP was not created for) is refused *before* any builder is called, so the
//!   provider's open region holds only accepted WRs: the region stays open and those WRs go
//!   out with the next flush, as staged WRs of a `SendRing` do. Aborting there would drop
//!   messages the caller was told were staged.
//! - `ibv_wr_complete` failing in RTS means none of the region was posted
//!   (`ibv_wr_post(3)`: "No work is executed to the queue until ibv_wr_complete() returns
//!   success"; mlx5 and rxe refuse a region from their builders' checks, e.g. a full SQ,
//!   before they publish anything). The ring rewinds: nothing of the batch is outstanding or
//!   retired, the signal schedule goes back, and the error is [`SendError::Post`] naming
//!   `ibv_wr_complete`, its errno and `first_rejected` 0 (the batch's first WR). Outside RTS
//!   the outcome is unknown (rxe publishes the region before its doorbell syscall, which
//!   the kernel refuses before RTS, and runs it later): as for `ibv_post_send` with `bad_wr`
//!   NULL, the region counts as posted, `first_rejected` is
//!   [`PostError::UNKNOWN`](crate::PostError::UNKNOWN) and the ring refuses new WRs until
//!   the QP went through RESET and [`WrRing::reset`].
//! - `ibv_wr_abort` discards the open region when the ring itself drops its staged WRs:
//!   [`WrRing::reset`] and dropping the ring (a region left open would keep mlx5's SQ lock).
//!
//! # Invariants (this module owns a raw QP pointer)
//! - `staged`, `posted`, `retired` are free-running with `retired <= posted <= staged` and
//!   `staged - retired <= limit <= depth`; sequence `s` has `wr_id` `encode(ring_id, s)`.
//! - `open` is true exactly when `ibv_wr_start` was called and neither `ibv_wr_complete` nor
//!   `ibv_wr_abort` since; then `staged > posted` (the region holds `posted..staged`).
//! - `event` is at most the sequence of the next WR that needs the slow path (the
//!   schedule's signal, the end of a batch, the WR that fills the ring, anything while full
//!   or in error): whatever moves that earlier lowers `event` (an early `event` costs one slow
//!   message, a late one would be a bug).
//! - Inline payloads are copied by the provider in `ibv_wr_set_inline_data`
//!   (`ibv_wr_post(3)`: "Copy send data"), so a staged inline WR holds no pointer into
//!   caller memory; registered buffers stay borrowed until the covering completion.

use core::ffi::c_void;
use core::marker::PhantomData;

use hotverbs_ffi::inline::*;
use hotverbs_ffi::*;

use crate::cq::Completion;
use crate::desc::RemoteBuf;
use crate::error::{ConfigError, PostError, SendError, WcError};
use crate::send::{Local, Msg, Opcode, SendConfig};
use crate::wr_id;

/// The bit of an [`Opcode`] in [`State::ops`].
#[inline(always)]
const fn op_bit(op: Opcode) -> u8 {
    1 << (op as u8)
}

/// Declares [`Slots`] (the `ibv_qp_ex` functions a [`WrRing`] calls, read once in
/// [`WrRing::new`]), their stand-ins for slots a QP does not fill, and `Slots::read`.
macro_rules! slots {
    ($($name:ident => $slot:ident ( $($arg:ident : $ty:ty),* ) $(-> $ret:ty)?;)*) => {
        /// The provider's `ibv_qp_ex` functions the ring calls, read from the QP once, in
        /// [`WrRing::new`] (which refuses a QP without the ones every ring needs): each call
        /// is then one indirect call, where `ibv_wr_*` reads the slot and tests it for NULL
        /// on every call (3 to 15 instructions per message in the `WrRing` rows of `cargo
        /// xtask insn`, the tests' abort paths holding registers in the callers' loops).
        /// Providers fill these slots when they create the QP and never change them
        /// (rdma-core's mlx5, rxe, efa, softnic), so these are the functions `ibv_wr_*`
        /// would call. A slot the QP left NULL holds a stand-in that aborts naming the
        /// slot, as `ibv_wr_*` does: a builder the QP lacks is never called (its opcode bit
        /// is clear in `ops`, which `check` tests first).
        #[derive(Clone, Copy, Debug)]
        struct Slots {
            $($name: unsafe extern "C" fn(*mut ibv_qp_ex $(, $ty)*) $(-> $ret)?,)*
        }

        /// Stand-ins for NULL slots: abort (a panic cannot unwind out of an `extern "C"`
        /// function) with the slot's name.
        mod absent {
            use super::*;
            $(
                pub(super) unsafe extern "C" fn $name(_: *mut ibv_qp_ex $(, _: $ty)*) $(-> $ret)? {
                    panic!(concat!("ibv_qp_ex.", stringify!($slot), " is NULL: the QP was not created with this op"))
                }
            )*
        }

        impl Slots {
            /// The QP's slots, NULL ones replaced by their stand-ins.
            fn read(q: &ibv_qp_ex) -> Self {
                Self {
                    $($name: q.$slot.unwrap_or(absent::$name),)*
                }
            }
        }
    };
}

slots! {
    start => wr_start();
    complete => wr_complete() -> core::ffi::c_int;
    send => wr_send();
    send_imm => wr_send_imm(imm: __be32);
    rdma_write => wr_rdma_write(rkey: u32, addr: u64);
    rdma_write_imm => wr_rdma_write_imm(rkey: u32, addr: u64, imm: __be32);
    rdma_read => wr_rdma_read(rkey: u32, addr: u64);
    fetch_add => wr_atomic_fetch_add(rkey: u32, addr: u64, add: u64);
    cmp_swp => wr_atomic_cmp_swp(rkey: u32, addr: u64, compare: u64, swap: u64);
    set_ud_addr => wr_set_ud_addr(ah: *mut ibv_ah, qpn: u32, qkey: u32);
    set_sge_list => wr_set_sge_list(n: usize, list: *const ibv_sge);
    set_inline_data => wr_set_inline_data(addr: *mut c_void, len: usize);
    set_sge => wr_set_sge(lkey: u32, addr: u64, len: u32);
}

/// What the fast path reads: copied out of the ring into a [`WrBatch`] (or a local of
/// [`WrRing::stage`] / [`WrRing::send_now`]), so a caller's loop keeps it in registers
/// across the provider calls, which the compiler must assume may write any memory they can
/// reach (the ring included). Only `seq` changes on the fast path; it is written back before
/// anything else reads the ring.
#[derive(Clone, Copy, Debug)]
struct Fast {
    /// The sequence number of the next staged WR.
    seq: u64,
    /// See the module invariants: `seq < event` is the fast path.
    event: u64,
    id_bits: u64,
    qpx: *mut ibv_qp_ex,
    max_inline: usize,
    /// A [`Local::Buf`] of `len < buf_inline` bytes goes inline
    /// ([`SendConfig::inline_bufs`]).
    buf_inline: usize,
    remote: RemoteBuf,
    has_remote: bool,
    /// Builders the QP has, one bit per [`Opcode`].
    ops: u8,
    /// UD: the destination set on every WR.
    ud: Option<crate::desc::UdDest>,
    /// The QP's `ibv_qp_ex` functions (only those a message uses are read: the copy is
    /// per field).
    slots: Slots,
}

#[derive(Debug)]
#[repr(C)]
struct State {
    f: Fast,
    /// A region is open (`ibv_wr_start` called). Kept in the ring, never in a copy, so a
    /// leaked [`WrBatch`] cannot leave the ring unaware of a region it opened.
    open: bool,
    /// A [`WrBatch`] is open (or was leaked with `mem::forget`).
    batch_open: bool,
    // --- the slow path, posts, completions.
    posted: u64,
    retired: u64,
    /// `depth`, or 0 in the error state.
    limit: u64,
    next_signal: u64,
    signal_every: u64,
    batch: u64,
    depth: u64,
    qp_num: u32,
    split_key: u64,
    /// `wr_id - seq` for the WRs of the 2^55 epoch of sequence numbers the last completion
    /// decided out of line was in (`id_bits` at first): [`WrRing::on_completion`]'s fast
    /// path. Set by its out-of-line path, so a ring past 2^55 WRs finds it again.
    id_off: u64,
}

impl Fast {
    /// Checks a message against the ring's settings; returns its remote address (0 for
    /// SENDs). Nothing is changed.
    #[inline(always)]
    fn check(&self, msg: &Msg<'_>) -> Result<u64, SendError> {
        if self.ops & op_bit(msg.op) == 0 {
            return Err(SendError::OpNotEnabled(msg.op));
        }
        if let Local::Inline(d) = msg.local {
            if d.len() > self.max_inline {
                return Err(SendError::InlineTooLong {
                    len: d.len(),
                    max: self.max_inline as u32,
                });
            }
        }
        match msg.op {
            Opcode::Send | Opcode::SendImm => Ok(0),
            _ => self.check_remote(msg),
        }
    }

    #[inline(always)]
    fn check_remote(&self, msg: &Msg<'_>) -> Result<u64, SendError> {
        if !self.has_remote {
            return Err(SendError::NoRemote);
        }
        let len = match msg.local {
            Local::Empty => 0,
            Local::Inline(d) => d.len() as u64,
            Local::Buf(b) => b.len as u64,
        };
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

    /// Builds the WR of `msg` as sequence `self.seq` with the signal flag `signaled` (opening
    /// the region first if `*open` is false: `open` is the ring's flag).
    ///
    /// # Safety
    /// `msg` passed [`check`](Self::check) (its builder exists, it fits) with remote address
    /// `remote`; there is room for it.
    #[inline(always)]
    unsafe fn build(&self, open: &mut bool, msg: &Msg<'_>, remote: u64, signaled: bool) {
        let qp = self.qpx;
        let buf_inline = self.buf_inline;
        let seq = self.seq;
        // SAFETY: the QP is live with the ops `new` checked and `check` found; the region is
        // this ring's (new's contract); inline data is copied by the provider during the call,
        // registered buffers are the caller's contract (`stage`).
        unsafe {
            if !*open {
                (self.slots.start)(qp);
                *open = true;
            }
            // `src` is the payload's address: its own pointer for `Local::Inline` (provenance
            // kept, no round trip through an integer, so miri checks the provider's copy
            // exactly), the registered buffer's address for a `Local::Buf` (the API carries
            // it as an integer, like `ibv_sge.addr`; the CPU reads it only for a small buffer
            // sent inline).
            let (inline, src, len, lkey): (bool, *const u8, u32, u32) = match msg.local {
                Local::Empty => (false, core::ptr::null(), 0, 0),
                Local::Inline(d) => (true, d.as_ptr(), d.len() as u32, 0),
                Local::Buf(b) => (
                    (b.len as usize) < buf_inline
                        && matches!(
                            msg.op,
                            Opcode::Send | Opcode::SendImm | Opcode::Write | Opcode::WriteImm
                        ),
                    b.addr as usize as *const u8,
                    b.len,
                    b.lkey,
                ),
            };
            (*qp).wr_id = self.id_bits | (seq & wr_id::SEQ_MASK);
            (*qp).wr_flags = if inline { IBV_SEND_INLINE } else { 0 }
                | if signaled { IBV_SEND_SIGNALED } else { 0 }
                | msg.ibv_flags();
            let rkey = self.remote.rkey;
            match msg.op {
                Opcode::Send => (self.slots.send)(qp),
                Opcode::SendImm => (self.slots.send_imm)(qp, msg.imm.to_be()),
                Opcode::Write => (self.slots.rdma_write)(qp, rkey, remote),
                Opcode::WriteImm => (self.slots.rdma_write_imm)(qp, rkey, remote, msg.imm.to_be()),
                Opcode::Read => (self.slots.rdma_read)(qp, rkey, remote),
                Opcode::FetchAdd => (self.slots.fetch_add)(qp, rkey, remote, msg.compare_add),
                Opcode::CmpSwap => {
                    (self.slots.cmp_swp)(qp, rkey, remote, msg.compare_add, msg.swap)
                }
            }
            if let Some(ud) = self.ud {
                (self.slots.set_ud_addr)(qp, ud.ah, ud.remote_qpn, ud.remote_qkey);
            }
            if matches!(msg.local, Local::Empty) {
                (self.slots.set_sge_list)(qp, 0, core::ptr::null());
            } else if inline {
                (self.slots.set_inline_data)(qp, src as *mut c_void, len as usize);
            } else {
                (self.slots.set_sge)(qp, lkey, src as u64, len);
            }
        }
    }
}

/// A send ring on an extended QP (`ibv_qp_ex`): the [`SendRing`](crate::SendRing) API
/// (`send_now`, `batch`, `stage`, `flush`, `on_completion`, `progress`, `reset`, split
/// mode) posting through `ibv_wr_start` / `ibv_wr_*` / `ibv_wr_complete`. See the
/// [module docs](self) for what happens on refusals and failed posts.
///
/// Switching from the legacy ring is a type change: the same [`SendConfig`], [`Msg`]s and
/// [`Completion`]s (from a [`CqPoller`](crate::CqPoller) or an
/// [`ExCqPoller`](crate::ExCqPoller)). The ring is small (no WR array) and may move freely.
///
/// # Example
/// On the counting test device's extended QP and CQ (any provider's `ibv_qp_ex` /
/// `ibv_cq_ex` work the same way):
/// ```
/// use hotverbs_datapath::{ExCqPoller, ExFields, Local, Msg, SendConfig, WrRing};
/// use hotverbs_ffi::IBV_WC_EX_WITH_QP_NUM;
/// use hotverbs_softnic::counting::CountingDevice;
///
/// let dev = CountingDevice::new(64);
/// // SAFETY: the device's QP and CQ outlive the ring and the poller; the CQ was created
/// // with (at least) IBV_WC_EX_WITH_QP_NUM.
/// let (mut ring, mut poller) = unsafe {
///     (
///         WrRing::new(dev.qp_ex(), SendConfig::new(1, 16, 64).signal_every(4)).unwrap(),
///         ExCqPoller::<8>::new(dev.cq_ex(), ExFields::QP_NUM, IBV_WC_EX_WITH_QP_NUM as u64)
///             .unwrap(),
///     )
/// };
/// let msgs = [*b"ping-000"; 8];
/// let mut batch = ring.batch();
/// for m in &msgs {
///     batch.push(Msg::send(Local::Inline(m))).unwrap();
/// }
/// batch.finish().unwrap(); // one ibv_wr_start .. ibv_wr_complete region
/// assert_eq!((dev.doorbells(), ring.outstanding()), (1, 8));
/// for c in poller.poll().unwrap().iter() {
///     ring.on_completion(c).unwrap();
/// }
/// assert_eq!(ring.outstanding(), 0);
/// ```
///
/// # Per-message cost
/// One compare of the sequence number with the next event decides the path; the fast path
/// stores `wr_id` and `wr_flags` and makes the builder and setter calls (two indirect calls
/// into the provider, which is where the time goes: `cargo xtask insn` prints our share and
/// the device's apart).
///
/// # References
/// `ibv_wr_post(3)`, `ibv_create_qp_ex(3)` (`send_ops_flags`, `sq_sig_all = 0`).
pub struct WrRing {
    st: State,
    error: Option<WcError>,
    deferred: Option<PostError>,
    /// An `ibv_wr_complete` failed outside RTS: what the provider queued is unknown (see
    /// `complete_failed`).
    unknown: Option<PostError>,
}

// SAFETY: the ring only uses its QP through the ibv_wr_* verbs, which providers allow from
// any thread as long as one thread at a time runs a region (`&mut self` guarantees it).
unsafe impl Send for WrRing {}

impl core::fmt::Debug for WrRing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("WrRing")
            .field("ring_id", &self.ring_id())
            .field("qp_num", &self.st.qp_num)
            .field("depth", &self.st.depth)
            .field("staged", &self.st.f.seq)
            .field("posted", &self.st.posted)
            .field("retired", &self.st.retired)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl WrRing {
    /// A ring posting to the extended QP `qpx`, configured by `cfg` (as for a
    /// [`SendRing`](crate::SendRing); `depth` is limited by the QP only).
    ///
    /// Fails with [`ConfigError::ExtendedOps`] if the QP lacks `wr_start`, `wr_complete`,
    /// `wr_abort`, `wr_set_sge`, `wr_set_sge_list` (or `wr_set_inline_data` with
    /// `max_inline > 0`, `wr_set_ud_addr` for UD). Opcodes whose builder is missing are
    /// refused per message with [`SendError::OpNotEnabled`].
    ///
    /// # Safety
    /// `qpx` is a live extended QP (`ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`,
    /// `sq_sig_all = 0`, `cap.max_send_wr >= cfg.depth`, `cap.max_inline_data >=
    /// cfg.max_inline`) that outlives the ring; its send queue is used by this ring only
    /// (no `ibv_post_send`, no other region); its send completions are given to
    /// [`on_completion`](Self::on_completion) (or a [`SendRetirer`](crate::SendRetirer)) and
    /// every [`Completion`] given to them came from the CQ. `cfg.ring_id` is unique among
    /// the rings sharing the CQ; `cfg.remote`'s rkey and `cfg.ud`'s AH stay valid while the
    /// ring uses them.
    pub unsafe fn new(qpx: *mut ibv_qp_ex, cfg: SendConfig) -> Result<Self, ConfigError> {
        if qpx.is_null() {
            return Err(ConfigError::Null);
        }
        let cfg = cfg.checked()?;
        let depth = cfg.depth as u64;
        // SAFETY: a live extended QP (the caller's contract); plain reads of its table.
        let q = unsafe { &*qpx };
        if q.wr_start.is_none()
            || q.wr_complete.is_none()
            || q.wr_abort.is_none()
            || q.wr_set_sge.is_none()
            || q.wr_set_sge_list.is_none()
            || (cfg.max_inline > 0 && q.wr_set_inline_data.is_none())
            || (cfg.ud.is_some() && q.wr_set_ud_addr.is_none())
        {
            return Err(ConfigError::ExtendedOps);
        }
        if q.qp_base.qp_type == IBV_QPT_UD {
            let ok = match cfg.ud {
                Some(ud) if !ud.ah.is_null() => {
                    // SAFETY: a non-NULL AH is live (the caller's contract).
                    unsafe { (*ud.ah).context == q.qp_base.context }
                }
                _ => false,
            };
            if !ok {
                return Err(ConfigError::UdDest);
            }
        }
        let mut ops = 0u8;
        for (op, present) in [
            (Opcode::Send, q.wr_send.is_some()),
            (Opcode::SendImm, q.wr_send_imm.is_some()),
            (Opcode::Write, q.wr_rdma_write.is_some()),
            (Opcode::WriteImm, q.wr_rdma_write_imm.is_some()),
            (Opcode::Read, q.wr_rdma_read.is_some()),
            (Opcode::FetchAdd, q.wr_atomic_fetch_add.is_some()),
            (Opcode::CmpSwap, q.wr_atomic_cmp_swp.is_some()),
        ] {
            if present {
                ops |= op_bit(op);
            }
        }
        let mut ring = WrRing {
            st: State {
                f: Fast {
                    seq: 0,
                    event: 0,
                    id_bits: wr_id::encode(cfg.ring_id, 0),
                    qpx,
                    max_inline: cfg.max_inline as usize,
                    buf_inline: cfg.buf_inline_limit(),
                    remote: cfg.remote.unwrap_or_default(),
                    has_remote: cfg.remote.is_some(),
                    ops,
                    ud: cfg.ud,
                    slots: Slots::read(q),
                },
                open: false,
                batch_open: false,
                posted: 0,
                retired: 0,
                limit: depth,
                next_signal: cfg.signal_every as u64 - 1,
                signal_every: cfg.signal_every as u64,
                batch: cfg.batch as u64,
                depth,
                qp_num: q.qp_base.qp_num,
                split_key: 0,
                id_off: wr_id::encode(cfg.ring_id, 0),
            },
            error: None,
            deferred: None,
            unknown: None,
        };
        ring.st.f.event = ring.event_at();
        Ok(ring)
    }

    /// The sequence number of the next WR that must take the slow path.
    #[inline]
    fn event_at(&self) -> u64 {
        let st = &self.st;
        let cap = (st.retired + st.limit).saturating_sub(1);
        let batch_end = st.posted + st.batch - 1;
        st.next_signal.min(cap).min(batch_end).max(st.f.seq)
    }

    /// Stages one message through the fast-path copy `f` (a batch's, or the ring's own for
    /// a lone call): no signal, no batch end, room. Anything else goes to the slow path,
    /// with `f.seq` written back first and `f` reloaded after. Posts at once with `post`.
    #[inline(always)]
    fn stage_fast(&mut self, f: &mut Fast, msg: &Msg<'_>, post: bool) -> Result<u64, SendError> {
        let seq = f.seq;
        if seq < f.event {
            let remote = match f.check(msg) {
                Ok(r) => r,
                Err(e) => {
                    self.st.f.seq = seq;
                    return Err(self.refused(e));
                }
            };
            // SAFETY: checked; `seq < event` means room, no signal, no batch end.
            unsafe { f.build(&mut self.st.open, msg, remote, false) };
            f.seq = seq + 1;
            if post {
                self.st.f.seq = seq + 1;
                let r = self.flush_inner();
                *f = self.st.f;
                r?;
            }
            Ok(seq)
        } else {
            self.st.f.seq = seq;
            let r = self.stage_slow(*msg, post);
            *f = self.st.f;
            r
        }
    }

    /// [`stage_fast`](Self::stage_fast) on the ring's own fast-path state, for the lone
    /// calls ([`stage`](Self::stage), [`send_now`](Self::send_now)): no copy to make and
    /// write back.
    #[inline(always)]
    fn stage_own(&mut self, msg: Msg<'_>, post: bool) -> Result<u64, SendError> {
        let seq = self.st.f.seq;
        if seq < self.st.f.event {
            let remote = match self.st.f.check(&msg) {
                Ok(r) => r,
                Err(e) => return Err(self.refused(e)),
            };
            // SAFETY: checked; `seq < event` means room, no signal, no batch end.
            unsafe { self.st.f.build(&mut self.st.open, &msg, remote, false) };
            self.st.f.seq = seq + 1;
            if post {
                self.flush_inner()?;
            }
            Ok(seq)
        } else {
            self.stage_slow(msg, post)
        }
    }

    /// A message failed validation: the error it gets, unless the ring is full or in the
    /// error state, which takes precedence (as for a [`SendRing`](crate::SendRing)).
    #[cold]
    #[inline(never)]
    fn refused(&self, e: SendError) -> SendError {
        if !crate::split::has_room(self.st.f.seq, self.st.retired, self.st.limit) {
            self.blocked()
        } else {
            e
        }
    }

    #[cold]
    fn blocked(&self) -> SendError {
        match (self.error, self.unknown) {
            (Some(e), _) => SendError::QpError(e),
            (None, Some(e)) => SendError::Post(e),
            (None, None) => SendError::WouldBlock,
        }
    }

    /// The slow path: signals, the end of a batch, a full ring, the error state.
    #[cold]
    #[inline(never)]
    /// It takes the message by value: a reference would make the caller keep the message
    /// in memory, rebuilt after every provider call.
    fn stage_slow(&mut self, msg: Msg<'_>, post: bool) -> Result<u64, SendError> {
        let msg = &msg;
        let seq = self.st.f.seq;
        // The capacity rule the split-mode loom model checks (`tests/loom.rs`).
        if !crate::split::has_room(seq, self.st.retired, self.st.limit) {
            self.st.f.event = seq;
            return Err(self.blocked());
        }
        let remote = self.st.f.check(msg)?;
        let full = seq + 1 - self.st.retired == self.st.limit;
        let scheduled = seq == self.st.next_signal;
        // The WR that fills the ring is signaled and posted at once, so a full ring always
        // has a signaled WR in flight.
        // SAFETY: checked above, with room.
        let f = self.st.f;
        // SAFETY: as above.
        unsafe { f.build(&mut self.st.open, msg, remote, scheduled || full) };
        if scheduled {
            self.st.next_signal += self.st.signal_every;
        }
        self.st.f.seq = seq + 1;
        let r = if post || full || seq + 1 - self.st.posted >= self.st.batch {
            self.flush_inner()
        } else {
            Ok(())
        };
        self.st.f.event = self.event_at();
        r.map(|()| seq)
    }

    /// Stages one message, like [`SendRing::stage`](crate::SendRing::stage). Returns its
    /// sequence number.
    ///
    /// # Safety
    /// For a [`Local::Buf`]: the memory stays registered and valid, and is not written (SEND
    /// / WRITE source) or not accessed (READ / atomic destination) until
    /// `self.is_retired(seq)` or the unsafe [`reset`](Self::reset) returned. Inline payloads
    /// are copied during the call (no contract), and so, by default, is a SEND / WRITE
    /// buffer of at most `max_inline` bytes, read by the CPU at its `addr`: device memory (a
    /// dmabuf MR) needs [`SendConfig::inline_bufs`]`(false)`. Safe alternatives:
    /// [`send_now`](Self::send_now), [`batch`](Self::batch).
    #[inline(always)]
    pub unsafe fn stage(&mut self, msg: Msg<'_>) -> Result<u64, SendError> {
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
        self.stage_own(msg, false)
    }

    /// Stages `msg` and posts it at once with anything already staged (one
    /// `ibv_wr_complete`). Only inline or empty payloads ([`SendError::NotInline`]).
    #[inline(always)]
    pub fn send_now(&mut self, msg: Msg<'_>) -> Result<u64, SendError> {
        if !msg.is_borrow_free() {
            return Err(SendError::NotInline);
        }
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
        self.stage_own(msg, true)
    }

    /// Opens a batch of inline messages: pushed messages are posted when the batch
    /// auto-flushes, on [`WrBatch::finish`], or when it is dropped.
    #[inline]
    pub fn batch<'d>(&mut self) -> WrBatch<'_, 'd> {
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
        self.st.batch_open = true;
        WrBatch {
            f: self.st.f,
            ring: self,
            _data: PhantomData,
        }
    }

    /// A [`WrBatch`] was leaked (`mem::forget`): the ring does not know how many WRs it
    /// built, so the open region is discarded with `ibv_wr_abort` and the ring goes back to
    /// its posted count (as a [`SendRing`](crate::SendRing) drops a leaked batch's WRs).
    #[cold]
    #[inline(never)]
    fn drop_leaked_batch(&mut self) {
        self.st.batch_open = false;
        if self.st.open {
            // SAFETY: a region is open on the live QP (new's contract).
            unsafe { ibv_wr_abort(self.st.f.qpx) };
            self.st.open = false;
        }
        let posted = self.st.posted;
        self.unstage_to(posted);
    }

    /// Posts what is staged with one `ibv_wr_complete`. On failure nothing of the batch was
    /// posted: its WRs are dropped (not outstanding, not retired) and the error names
    /// `ibv_wr_complete` and its errno.
    #[inline]
    pub fn flush(&mut self) -> Result<(), SendError> {
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
        if let Some(e) = self.deferred.take() {
            return Err(SendError::Post(e));
        }
        self.flush_inner()
    }

    #[inline]
    fn flush_inner(&mut self) -> Result<(), SendError> {
        if !self.st.open {
            return Ok(());
        }
        self.st.open = false;
        // SAFETY: a region is open on the live QP (module invariant, new's contract).
        let rc = unsafe { (self.st.f.slots.complete)(self.st.f.qpx) };
        if rc == 0 {
            self.st.posted = self.st.f.seq;
            Ok(())
        } else {
            Err(SendError::Post(self.complete_failed(rc)))
        }
    }

    /// `ibv_wr_complete` failed. In RTS (or SQD) a provider refuses a region only from its
    /// builders' checks, before it publishes anything (mlx5, rxe, softnic): none of the
    /// region was posted, so the ring rewinds to `posted`. In any other state the outcome is
    /// unknown: rxe publishes the region (stores its producer index) before its doorbell
    /// syscall, which the kernel refuses before RTS, and then runs the WRs after the next
    /// doorbell in RTS (fault-truth S1, as for `ibv_post_send` with `bad_wr` NULL). The
    /// region then counts as posted (its zero-copy buffers stay borrowed) and the ring
    /// refuses new WRs until the QP went through RESET and [`reset`](Self::reset), as a
    /// [`SendRing`](crate::SendRing) does.
    #[cold]
    #[inline(never)]
    fn complete_failed(&mut self, rc: i32) -> PostError {
        let first = self.st.posted;
        // SAFETY: a live QP (new's contract); `state` is kept by libibverbs' modify_qp.
        let state = unsafe { (*self.st.f.qpx).qp_base.state };
        if state == IBV_QPS_RTS || state == IBV_QPS_SQD {
            self.unstage_to(first);
            return PostError {
                verb: "ibv_wr_complete",
                errno: rc,
                first_rejected: 0,
                first_rejected_seq: first,
            };
        }
        let e = PostError {
            verb: "ibv_wr_complete",
            errno: rc,
            first_rejected: PostError::UNKNOWN,
            first_rejected_seq: first,
        };
        self.st.posted = self.st.f.seq;
        self.unknown = Some(e);
        self.st.limit = 0;
        self.st.f.event = self.st.f.seq;
        e
    }

    /// Drops staged WRs from `seq` on and rewinds the signal schedule.
    #[cold]
    fn unstage_to(&mut self, seq: u64) {
        self.st.f.seq = seq;
        let st = &mut self.st;
        while st.next_signal >= st.signal_every && st.next_signal - st.signal_every >= seq {
            st.next_signal -= st.signal_every;
        }
        self.st.f.event = self.event_at();
    }

    /// Retires the WRs covered by a send completion of this ring, exactly as
    /// [`SendRing::on_completion`](crate::SendRing::on_completion): returns how many it
    /// retired (0 for a stale completion of this ring), and an error status of an
    /// outstanding WR puts the ring in the error state.
    ///
    /// # Errors
    /// The completion's error status, or [`WcError::Misrouted`] for a completion that is
    /// not this ring's (another ring id, a receive, another QP; nothing changes).
    #[inline]
    pub fn on_completion(&mut self, c: &Completion) -> Result<u64, WcError> {
        // As `SendRing::on_completion`: an outstanding WR of the epoch `id_off` is for is
        // `wr_id - id_off`; anything else out of line.
        let st = &self.st;
        match wr_id::outstanding_in_epoch(
            c.wr_id(),
            c.qp_num(),
            st.f.id_bits,
            st.qp_num,
            st.id_off,
            st.posted,
            st.retired,
        ) {
            Some(s) => self.retire_through(s, c),
            None => self.on_completion_odd(c),
        }
    }

    /// Retires every WR up to and including sequence `s`, the outstanding WR `c` completes.
    #[inline(always)]
    fn retire_through(&mut self, s: u64, c: &Completion) -> Result<u64, WcError> {
        let st = &mut self.st;
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

    /// [`on_completion`](Self::on_completion) of anything but an outstanding WR of the
    /// epoch `id_off` is for: another ring's completion ([`WcError::Misrouted`]), a stale
    /// one (`Ok(0)`), or an outstanding WR of another epoch (`id_off` moves to it).
    #[cold]
    #[inline(never)]
    fn on_completion_odd(&mut self, c: &Completion) -> Result<u64, WcError> {
        if wr_id::foreign(c.wr_id(), c.qp_num(), self.st.f.id_bits, self.st.qp_num) {
            return self.refuse(c);
        }
        match wr_id::full_seq(self.st.posted, self.st.retired, c.seq()) {
            Some(s) => {
                self.st.id_off = c.wr_id().wrapping_sub(s);
                self.retire_through(s, c)
            }
            None => Ok(0),
        }
    }

    /// [`on_completion`](Self::on_completion) of a completion whose ring id, kind or QP is
    /// not this ring's: [`WcError::Misrouted`] (`Ok(0)` for a spent one). Out of line, on
    /// the ring and the completion only (see `cq::refuse_send`).
    #[cold]
    #[inline(never)]
    fn refuse(&self, c: &Completion) -> Result<u64, WcError> {
        crate::cq::refuse_send(c, self.ring_id())
    }

    #[cold]
    fn enter_error(&mut self, e: WcError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
        self.st.limit = 0;
        self.st.f.event = self.st.f.seq;
    }

    fn retire_to(&mut self, retired: u64) {
        if retired > self.st.retired && retired <= self.st.posted {
            self.st.retired = retired;
        }
    }

    /// Split mode: counters and a retirer for the poller thread, as
    /// [`SendRing::split`](crate::SendRing::split).
    pub fn split(&mut self) -> (crate::split::SendCounters, crate::split::SendRetirer) {
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
                "WrRing::sync: counters of another ring or split (key {}, this ring's latest \
                 split has key {}): use the counters WrRing::split returned",
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

    /// Forgets every staged and outstanding WR and leaves the error state; an open region
    /// is discarded with `ibv_wr_abort`. Returns the number of WRs that never completed
    /// (staged ones included). Completions of them still in the CQ are ignored as stale.
    ///
    /// # Safety
    /// As [`SendRing::reset`](crate::SendRing::reset): the device no longer uses any WR of
    /// this ring (the QP is in RESET), and in split mode no retirer is running.
    pub unsafe fn reset(&mut self) -> u64 {
        self.st.batch_open = false;
        if self.st.open {
            // SAFETY: a region is open on the live QP.
            unsafe { ibv_wr_abort(self.st.f.qpx) };
            self.st.open = false;
        }
        let dropped = self.st.f.seq - self.st.retired;
        let posted = self.st.posted;
        self.st.f.seq = posted;
        self.st.retired = posted;
        self.error = None;
        self.deferred = None;
        self.unknown = None;
        self.st.limit = self.st.depth;
        self.st.next_signal = posted + self.st.signal_every - 1;
        self.st.f.event = self.event_at();
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
        retirer.join("WrRing::unsplit", self.st.split_key, shared);
        self.sync(shared);
        self.st.split_key = 0;
    }

    /// True once [`split`](Self::split) handed out counters and a retirer (a reset must
    /// then not run while the retirer may).
    #[inline]
    pub fn is_split(&self) -> bool {
        self.st.split_key != 0
    }

    /// Points the ring's RDMA WRITE / READ / atomic messages at `remote` from now on (a
    /// new peer after a recovery), as [`SendRing::set_remote`](crate::SendRing::set_remote):
    /// staged WRs are posted first with the old one.
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
        self.st.next_signal = self.st.f.seq;
        self.st.f.event = self.st.f.seq;
    }

    /// True once the WR with sequence `seq` is retired.
    #[inline(always)]
    pub fn is_retired(&self, seq: u64) -> bool {
        seq < self.st.retired
    }
    /// WRs posted and not yet retired.
    #[inline(always)]
    pub fn outstanding(&self) -> u64 {
        self.st.posted - self.st.retired
    }
    /// Retired and outstanding counts for a [`StallWatch`](crate::StallWatch).
    #[inline(always)]
    pub fn progress(&self) -> crate::Progress {
        crate::Progress {
            retired: self.st.retired,
            outstanding: self.st.posted - self.st.retired,
        }
    }
    /// WRs staged (in the open region) and not yet posted.
    #[inline(always)]
    pub fn staged(&self) -> u64 {
        self.st.f.seq - self.st.posted
    }
    /// Messages that may still be staged (0 in the error state).
    #[inline(always)]
    pub fn free(&self) -> u64 {
        self.st
            .limit
            .saturating_sub(self.st.f.seq - self.st.retired)
    }
    /// Total WRs posted since creation.
    #[inline(always)]
    pub fn posted_total(&self) -> u64 {
        self.st.posted
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
        wr_id::ring_of(self.st.f.id_bits)
    }
    /// True while a region (`ibv_wr_start` .. `ibv_wr_complete`) is open.
    #[inline(always)]
    pub fn region_open(&self) -> bool {
        self.st.open
    }
}

impl Drop for WrRing {
    fn drop(&mut self) {
        if self.st.open {
            // SAFETY: a region is open on the QP, which outlives the ring (new's contract);
            // closing it without posting releases what the provider holds for it.
            unsafe { ibv_wr_abort(self.st.f.qpx) };
        }
    }
}

/// Inline messages staged in one region; see [`WrRing::batch`]. It keeps the ring's
/// fast-path state in a copy of its own (see `Fast`), so a push loop runs from registers.
#[must_use = "a batch posts its messages on finish() or drop"]
pub struct WrBatch<'r, 'd> {
    ring: &'r mut WrRing,
    f: Fast,
    _data: PhantomData<&'d [u8]>,
}

impl core::fmt::Debug for WrBatch<'_, '_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("WrBatch")
            .field("ring", &self.ring)
            .field("staged", &self.staged())
            .finish()
    }
}

impl<'d> WrBatch<'_, 'd> {
    /// Stages one inline or empty message (auto-flushing at the batch size or when the ring
    /// fills). Returns its sequence number.
    #[inline(always)]
    pub fn push(&mut self, msg: Msg<'d>) -> Result<u64, SendError> {
        if !msg.is_borrow_free() {
            return Err(SendError::NotInline);
        }
        self.ring.stage_fast(&mut self.f, &msg, false)
    }

    /// Number of messages staged and not yet posted.
    #[inline(always)]
    pub fn staged(&self) -> u64 {
        self.f.seq - self.ring.st.posted
    }

    /// Posts what is staged and closes the batch.
    #[inline]
    pub fn finish(self) -> Result<(), SendError> {
        let mut this = core::mem::ManuallyDrop::new(self);
        let seq = this.f.seq;
        this.ring.st.f.seq = seq;
        this.ring.st.batch_open = false;
        this.ring.flush_inner()
    }
}

impl Drop for WrBatch<'_, '_> {
    fn drop(&mut self) {
        self.ring.st.f.seq = self.f.seq;
        self.ring.st.batch_open = false;
        if let Err(SendError::Post(e)) = self.ring.flush_inner() {
            // Reported by the next WrRing::flush.
            self.ring.deferred = Some(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cq::CqPoller;
    use hotverbs_softnic::counting::CountingDevice;

    impl WrRing {
        /// A fresh ring (nothing staged or outstanding) as if `seq` WRs had been posted and
        /// retired: the counters of a long-lived ring.
        fn jump_to(&mut self, seq: u64) {
            assert_eq!(self.outstanding(), 0);
            let st = &mut self.st;
            st.f.seq = seq;
            st.posted = seq;
            st.retired = seq;
            st.next_signal = seq + st.signal_every - 1;
            self.st.f.event = self.event_at();
        }
    }

    /// WRs posted across the end of a 2^55 epoch of `wr_id`s retire on their completions:
    /// `id_off` (the fast path's) is for the first epoch until a completion of the second
    /// comes, which the out-of-line path decides and moves it to; a completion seen again
    /// is stale either way.
    #[test]
    fn completions_across_the_wr_id_epoch_retire_their_wrs() {
        let dev = CountingDevice::new(256);
        // SAFETY: the counting device's extended QP and CQ outlive the ring and poller;
        // nothing else uses them.
        let mut r = unsafe {
            WrRing::new(
                dev.qp_ex(),
                SendConfig::new(2, 16, 64).signal_every(4).batch(16),
            )
        }
        .unwrap();
        // SAFETY: as above (the extended CQ is an ibv_cq too).
        let mut p: CqPoller<8> =
            unsafe { CqPoller::new(hotverbs_ffi::inline::ibv_cq_ex_to_cq(dev.cq_ex())) };
        let epoch = wr_id::SEQ_MASK + 1;
        r.jump_to(epoch - 8);
        let data = [6u8; 8];
        let mut b = r.batch();
        for k in 0..12u64 {
            assert_eq!(b.push(Msg::send(Local::Inline(&data))), Ok(epoch - 8 + k));
        }
        b.finish().unwrap();
        assert_eq!(r.outstanding(), 12);
        let cs = p.poll().unwrap();
        // Signaled: epoch - 5 and epoch - 1 (the ending epoch), epoch + 3 (the new one).
        let seqs: Vec<u64> = cs.iter().map(|c| c.seq()).collect();
        assert_eq!(seqs, [wr_id::SEQ_MASK - 4, wr_id::SEQ_MASK, 3]);
        let retired: Vec<u64> = cs.iter().map(|c| r.on_completion(c).unwrap()).collect();
        assert_eq!(retired, [4, 4, 4]);
        assert_eq!(r.outstanding(), 0);
        assert_eq!(r.st.id_off, wr_id::encode(2, 0).wrapping_sub(epoch));
        for c in cs.iter() {
            assert_eq!(r.on_completion(c), Ok(0));
        }
        // The ring goes on in the new epoch, on the fast path.
        let mut b = r.batch();
        for k in 0..4u64 {
            assert_eq!(b.push(Msg::send(Local::Inline(&data))), Ok(epoch + 4 + k));
        }
        b.finish().unwrap();
        let n: u64 = p
            .poll()
            .unwrap()
            .iter()
            .map(|c| r.on_completion(c).unwrap())
            .sum();
        assert_eq!((n, r.outstanding()), (4, 0));
    }
}
