//! [`SendRing`]: preformatted send work requests, batching, selective signaling.
//!
//! # Invariants (this module owns raw pointers)
//! - `wrs[i].sg_list` points at slot `i`'s SGE, which lives inside `wrs[i]` (its
//!   `bind_mw`/`tso` union, unused by every opcode a ring sends), and
//!   `wrs[i].next == &wrs[(i + 1) & (N - 1)]` for every `i` but the one WR the last post cut
//!   (`cut_wr`, whose link is kept in `cut_next` and restored by the next post), whenever
//!   `linked_at` is the address of `wrs`; every post re-links (cold) if the ring moved.
//! - The lone WR (`lone`, outside the array) is never linked: its `next` is NULL from creation
//!   on, its `sg_list` is rewritten at each post (so a moved ring needs no re-link for it), and
//!   `lone_fmt` is the format it holds. `send_now` posts a message through it only when nothing
//!   is staged; the message's slot is then not written (an unsignaled lone post leaves the
//!   slot's format and unsignaled flags; a signaled one flags the slot signaled and tags it
//!   so), so `slot_wr(s).send_flags` says whether WR `s` was signaled either way.
//! - Tags: `tags[i]` is the format slot `i`'s WR holds (opcode, local kind, unsignaled
//!   flags, lkey/rkey), or a value no message has: never formatted, last WR signaled, or the
//!   event mark. At most one slot carries the mark, and it is on or before the slot of the
//!   next WR that must take the slow path (the schedule's next signal, the end of a batch,
//!   the WR that fills the ring, the next WR when the ring is full or in error, the end of a
//!   2^55 epoch of `wr_id`s); whatever moves that event earlier re-marks. So the fast path
//!   needs one compare per message, and a slot whose tag matches holds no staged WR.
//! - Aliasing: the provider follows the preformatted `next`/`sg_list` pointers long after
//!   they were written, so nothing may invalidate them in between (Rust's aliasing model,
//!   checked by `cargo xtask miri` under Stacked and Tree Borrows). The WR array (SGEs
//!   included) therefore lives in an `UnsafeCell` and are only ever accessed through raw pointers from
//!   `UnsafeCell::get` (never through a `&mut` to the arrays or their elements), and the
//!   ring is `!Unpin` (`PhantomPinned`), so a `&mut SendRing` is not a unique borrow of the
//!   arrays and calling a `&mut self` method does not invalidate the links either.
//! - Sequence counters are free-running `u64`s with `retired <= posted <= staged` and
//!   `staged - retired <= depth <= N`; slot of sequence `s` is `s & (N - 1)`. `staged` is
//!   kept as `next_id` (the next WR's `wr_id`) and `id_off` (see `staged_seq`); a [`Batch`]
//!   holds its own copy of `next_id` while open.
//! - A staged-but-unposted WR may hold an inline pointer into caller memory; such WRs are
//!   posted or dropped before that memory's borrow ends (a [`Batch`] holds the borrow).
//! - A provider reads an `ibv_send_wr` chain only during `ibv_post_send(3)`; so a slot may be
//!   rewritten as soon as its WR is posted, and the ring only limits *outstanding* WRs to
//!   `depth` (the SQ capacity). Zero-copy payload buffers are what stays borrowed until the
//!   covering completion.

use core::cell::UnsafeCell;
use core::marker::{PhantomData, PhantomPinned};
use core::mem::MaybeUninit;
use core::ptr::{self, addr_of_mut};

use hotverbs_ffi::inline::ibv_post_send;
use hotverbs_ffi::*;

use crate::cq::Completion;
use crate::desc::{LocalBuf, RemoteBuf, UdDest};
use crate::error::{ConfigError, PostError, SendError, WcError};
use crate::wr_id;

/// The operation of one message (`enum ibv_wr_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Opcode {
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`.
    SendImm,
    /// `IBV_WR_RDMA_WRITE`.
    Write,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    WriteImm,
    /// `IBV_WR_RDMA_READ`.
    Read,
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    FetchAdd,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    CmpSwap,
}

impl Opcode {
    /// SEND and WRITE variants carry their payload, so they may be sent inline.
    #[inline(always)]
    const fn may_inline(self) -> bool {
        matches!(
            self,
            Self::Send | Self::SendImm | Self::Write | Self::WriteImm
        )
    }

    #[inline(always)]
    const fn raw(self) -> ibv_wr_opcode {
        match self {
            Self::Send => IBV_WR_SEND,
            Self::SendImm => IBV_WR_SEND_WITH_IMM,
            Self::Write => IBV_WR_RDMA_WRITE,
            Self::WriteImm => IBV_WR_RDMA_WRITE_WITH_IMM,
            Self::Read => IBV_WR_RDMA_READ,
            Self::FetchAdd => IBV_WR_ATOMIC_FETCH_AND_ADD,
            Self::CmpSwap => IBV_WR_ATOMIC_CMP_AND_SWP,
        }
    }
}

/// The local side of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Local<'d> {
    /// A zero-byte message (`num_sge = 0`).
    Empty,
    /// Bytes sent with `IBV_SEND_INLINE`: copied by the provider during the post, so the
    /// slice is free as soon as the WR is posted.
    Inline(&'d [u8]),
    /// Registered memory (zero-copy): the NIC reads it (SEND/WRITE) or writes it
    /// (READ/atomic result) until the covering completion. Only the `unsafe`
    /// [`SendRing::stage`] accepts it. SEND / WRITE payloads up to `max_inline` are still
    /// sent inline (read by the CPU while posting) unless the ring was configured with
    /// [`SendConfig::inline_bufs`]`(false)`, which device memory (a dmabuf MR) needs.
    Buf(LocalBuf),
}

/// One message: opcode, local side and the per-message remote fields. Everything else
/// (`sg_list`, `rkey`, UD address, links) is preformatted in the ring.
#[derive(Clone, Copy, Debug)]
pub struct Msg<'d> {
    pub(crate) op: Opcode,
    pub(crate) local: Local<'d>,
    pub(crate) remote_offset: u64,
    pub(crate) imm: u32,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    /// The opcode (`op as u8`) with [`fence`](Self::fence) / [`solicited`](Self::solicited)
    /// as the bits of a [`SendRing`] slot format ([`MSG_FENCE`], [`MSG_SOLICITED`]): the
    /// verbs ring's format of the message is this byte OR its local kind (its event path
    /// reads messages from memory: one load there, as before the flags existed, where a
    /// separate flags byte cost every `signal_every`-th message two instructions); the
    /// direct ring moves the flags to the ctrl segment's `fm_ce_se` ([`Msg::mlx5_flags`]),
    /// where a message built in place folds them away. `op as u8` for a message built
    /// without them.
    pub(crate) op_flags: u8,
}

/// [`Msg::op_flags`] bit of [`Msg::fence`] (`IBV_SEND_FENCE`): the format bit `FMT_FENCE`.
pub(crate) const MSG_FENCE: u8 = 1 << 5;
/// [`Msg::op_flags`] bit of [`Msg::solicited`] (`IBV_SEND_SOLICITED`): the format bit
/// `FMT_SOLICITED`.
pub(crate) const MSG_SOLICITED: u8 = 1 << 6;

impl<'d> Msg<'d> {
    #[inline(always)]
    const fn new(op: Opcode, local: Local<'d>, remote_offset: u64) -> Self {
        Self {
            op,
            local,
            remote_offset,
            imm: 0,
            compare_add: 0,
            swap: 0,
            op_flags: op as u8,
        }
    }

    /// `IBV_SEND_FENCE`: the message waits until every RDMA READ and atomic posted before
    /// it on the QP has completed (RC). On every ring: the verbs rings set the flag, the
    /// mlx5 direct ring writes `MLX5_WQE_CTRL_FENCE` into the WQE, as libmlx5 does for it.
    #[inline(always)]
    pub const fn fence(mut self) -> Self {
        self.op_flags |= MSG_FENCE;
        self
    }

    /// `IBV_SEND_SOLICITED`: the receiver's completion is solicited (it wakes a CQ armed
    /// for solicited completions only, `ibv_req_notify_cq(cq, 1)`). SEND / WRITE with
    /// immediate.
    #[inline(always)]
    pub const fn solicited(mut self) -> Self {
        self.op_flags |= MSG_SOLICITED;
        self
    }

    /// Whether [`fence`](Self::fence) was set.
    #[inline(always)]
    pub const fn is_fenced(&self) -> bool {
        self.op_flags & MSG_FENCE != 0
    }

    /// Whether [`solicited`](Self::solicited) was set.
    #[inline(always)]
    pub const fn is_solicited(&self) -> bool {
        self.op_flags & MSG_SOLICITED != 0
    }

    /// The message's flags as an mlx5 ctrl segment's `fm_ce_se` bits:
    /// `MLX5_WQE_CTRL_FENCE` (`4 << 5`) and `MLX5_WQE_CTRL_SOLICITED` (`1 << 1`).
    #[inline(always)]
    pub(crate) const fn mlx5_flags(&self) -> u8 {
        (self.op_flags & MSG_FENCE) << 2 | (self.op_flags & MSG_SOLICITED) >> 5
    }

    /// The `IBV_SEND_FENCE` / `IBV_SEND_SOLICITED` bits of the message.
    #[inline(always)]
    pub(crate) const fn ibv_flags(&self) -> u32 {
        flag_bits(self.op_flags)
    }

    /// `IBV_WR_SEND` of `local`.
    #[inline(always)]
    pub const fn send(local: Local<'d>) -> Self {
        Self::new(Opcode::Send, local, 0)
    }

    /// `IBV_WR_SEND_WITH_IMM`; `imm` is in host order (sent big-endian, as `__be32`).
    #[inline(always)]
    pub const fn send_imm(local: Local<'d>, imm: u32) -> Self {
        let mut m = Self::new(Opcode::SendImm, local, 0);
        m.imm = imm;
        m
    }

    /// `IBV_WR_RDMA_WRITE` of `local` to the ring's remote buffer at `remote_offset`.
    #[inline(always)]
    pub const fn write(local: Local<'d>, remote_offset: u64) -> Self {
        Self::new(Opcode::Write, local, remote_offset)
    }

    /// `IBV_WR_RDMA_WRITE_WITH_IMM`; the peer consumes a receive and sees `imm`.
    #[inline(always)]
    pub const fn write_imm(local: Local<'d>, remote_offset: u64, imm: u32) -> Self {
        let mut m = Self::new(Opcode::WriteImm, local, remote_offset);
        m.imm = imm;
        m
    }

    /// `IBV_WR_RDMA_READ` of `dest.len` bytes at `remote_offset` into `dest`.
    #[inline(always)]
    pub const fn read(dest: LocalBuf, remote_offset: u64) -> Self {
        Self::new(Opcode::Read, Local::Buf(dest), remote_offset)
    }

    /// `IBV_WR_ATOMIC_FETCH_AND_ADD` of `add` on the 8 remote bytes at `remote_offset`;
    /// the old value lands in `dest` (8 bytes, big-endian on the wire as the NIC stores it).
    #[inline(always)]
    pub const fn fetch_add(dest: LocalBuf, remote_offset: u64, add: u64) -> Self {
        let mut m = Self::new(Opcode::FetchAdd, Local::Buf(dest), remote_offset);
        m.compare_add = add;
        m
    }

    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: if the remote 8 bytes equal `compare`, store `swap`;
    /// the old value lands in `dest`.
    #[inline(always)]
    pub const fn cmp_swap(dest: LocalBuf, remote_offset: u64, compare: u64, swap: u64) -> Self {
        let mut m = Self::new(Opcode::CmpSwap, Local::Buf(dest), remote_offset);
        m.compare_add = compare;
        m.swap = swap;
        m
    }

    /// The opcode.
    #[inline(always)]
    pub const fn opcode(&self) -> Opcode {
        self.op
    }

    /// True if the message borrows no registered memory (inline or empty), so the safe
    /// methods may post it.
    #[inline(always)]
    pub const fn is_borrow_free(&self) -> bool {
        !matches!(self.local, Local::Buf(_))
    }
}

/// Configuration of a [`SendRing`]; `new(required)` then chainable setters.
#[derive(Clone, Copy, Debug)]
pub struct SendConfig {
    pub(crate) ring_id: u8,
    pub(crate) depth: u32,
    pub(crate) max_inline: u32,
    pub(crate) signal_every: u32,
    pub(crate) batch: u32,
    pub(crate) remote: Option<RemoteBuf>,
    pub(crate) ud: Option<UdDest>,
    pub(crate) inline_bufs: bool,
}

impl Default for SendConfig {
    /// [`SendConfig::DERIVED`].
    fn default() -> Self {
        Self::DERIVED
    }
}

impl SendConfig {
    /// Every setting at its default, with `depth` and `max_inline` left for the setup layer
    /// to derive from the QP: `hotverbs`' `Qp::send_ring` / `wr_ring` / `direct_ring` set
    /// depth to `min(N, cap.max_send_wr)` (a `WrRing` or `DirectRing`: `cap.max_send_wr`)
    /// and max_inline to the QP's `cap.max_inline_data`, and assign the ring id. Raw
    /// datapath constructors need both said: [`depth`](Self::depth),
    /// [`max_inline`](Self::max_inline) (or [`new`](Self::new)).
    pub const DERIVED: Self = Self {
        ring_id: 0,
        depth: 0,
        max_inline: Self::UNSET,
        signal_every: 0,
        batch: 0,
        remote: None,
        ud: None,
        inline_bufs: true,
    };

    /// `max_inline` not said (derived from the QP by the setup layer).
    const UNSET: u32 = u32::MAX;

    /// All three said, for rings built on raw handles: `ring_id` goes into every `wr_id`
    /// (see [`crate::wr_id`]); `depth` is the number of WRs that may be outstanding, at most
    /// the QP's `cap.max_send_wr` and the ring's `N`; `max_inline` is the QP's
    /// `cap.max_inline_data` as `ibv_create_qp(3)` returned it. On the setup layer prefer
    /// [`SendConfig::default()`](Self::DERIVED) and the named setters: it derives `depth`
    /// and `max_inline` from the QP and assigns `ring_id` itself.
    /// Defaults: signal every `depth / 2` WRs, flush automatically every `depth / 2` staged
    /// WRs.
    pub const fn new(ring_id: u8, depth: u32, max_inline: u32) -> Self {
        Self::DERIVED
            .with_ring_id(ring_id)
            .depth(depth)
            .max_inline(max_inline)
    }

    /// At most `d` WRs outstanding (at most the QP's `cap.max_send_wr` and the ring's `N`).
    /// Unset, the setup layer derives it from the QP.
    pub const fn depth(mut self, d: u32) -> Self {
        self.depth = d;
        self
    }

    /// Payloads of at most `m` bytes may go inline (at most the QP's
    /// `cap.max_inline_data`). Unset, the setup layer takes the QP's.
    pub const fn max_inline(mut self, m: u32) -> Self {
        self.max_inline = m;
        self
    }

    /// Whether `max_inline` was said (else the setup layer derives it).
    pub const fn max_inline_is_set(&self) -> bool {
        self.max_inline != Self::UNSET
    }

    /// The settings a ring is built from: the defaults of `signal_every` and `batch`
    /// (half the depth) filled in, every range checked. One check for the three rings.
    pub(crate) const fn checked(mut self) -> Result<Self, ConfigError> {
        if self.depth == 0 || self.max_inline == Self::UNSET {
            return Err(ConfigError::Unresolved);
        }
        let half = if self.depth >= 2 { self.depth / 2 } else { 1 };
        if self.signal_every == 0 {
            self.signal_every = half;
        }
        if self.batch == 0 {
            self.batch = half;
        }
        if self.signal_every > half {
            return Err(ConfigError::SignalPeriod);
        }
        if self.batch > self.depth {
            return Err(ConfigError::Batch);
        }
        if self.remote.is_some() && self.ud.is_some() {
            return Err(ConfigError::RemoteAndUd);
        }
        Ok(self)
    }

    /// Signal every `k`-th WR (`1 <= k <= depth / 2`; default, or 0: `depth / 2`).
    pub const fn signal_every(mut self, k: u32) -> Self {
        self.signal_every = k;
        self
    }

    /// Flush automatically once `b` WRs are staged (`1 <= b <= depth`; default, or 0:
    /// `depth / 2`).
    pub const fn batch(mut self, b: u32) -> Self {
        self.batch = b;
        self
    }

    /// The remote buffer RDMA and atomic messages address (offsets are relative to it).
    pub const fn remote(mut self, remote: RemoteBuf) -> Self {
        self.remote = Some(remote);
        self
    }

    /// UD mode: every WR carries this AH, remote QPN and Q_Key (SEND / SEND_WITH_IMM only).
    pub const fn ud(mut self, dest: UdDest) -> Self {
        self.ud = Some(dest);
        self
    }

    /// Whether a registered buffer ([`Local::Buf`]) of at most `max_inline` bytes is sent
    /// inline (the default: the CPU copies it while posting, and the WR no longer needs the
    /// memory once posted). `false`: registered buffers always go by SGE, read by the NIC
    /// only. Required for device memory, which the CPU cannot read: a dmabuf registration
    /// (GPU memory, `hotverbs::Pd::reg_dmabuf_mr`), whose `addr` is an IOVA, not an address
    /// in this process. Inline payloads ([`Local::Inline`]) are inline either way.
    pub const fn inline_bufs(mut self, on: bool) -> Self {
        self.inline_bufs = on;
        self
    }

    /// The limit below which a [`Local::Buf`] goes inline: `len < limit` (0: never).
    pub(crate) const fn buf_inline_limit(&self) -> usize {
        if self.inline_bufs {
            self.max_inline as usize + 1
        } else {
            0
        }
    }

    /// The same configuration with another ring id (a setup layer that hands out ring ids
    /// per CQ sets it).
    pub const fn with_ring_id(mut self, ring_id: u8) -> Self {
        self.ring_id = ring_id;
        self
    }

    /// The maximum number of outstanding WRs.
    pub const fn depth_of(&self) -> u32 {
        self.depth
    }

    /// The inline limit.
    pub const fn max_inline_of(&self) -> u32 {
        self.max_inline
    }

    /// The UD destination, if any.
    pub const fn ud_dest(&self) -> Option<UdDest> {
        self.ud
    }
}

/// Counters and settings, kept apart from the WR arrays so the per-message path touches
/// one cache line of counters plus the slot's tag, WR and SGE. `repr(C)` with the fields every
/// message reads or writes first, then what the slow path, posts and completions read; the
/// cold error state lives in [`Cold`], after the arrays.
#[derive(Debug)]
#[repr(C)]
struct State {
    /// The `wr_id` of the next staged WR: `id_bits | (staged & SEQ_MASK)`. The staged count
    /// itself is `next_id - id_off` (see [`SendRing::staged_seq`]): per message the fast
    /// path only increments this one counter.
    next_id: u64,
    /// `next_id - staged`, constant within one 2^55 epoch of sequence numbers (the last WR
    /// of an epoch takes the slow path, which recomputes both).
    id_off: u64,
    /// The inline limit, as wide as a slice length (one compare per inline message).
    max_inline: usize,
    /// A [`Local::Buf`] of `len < buf_inline` bytes goes inline
    /// ([`SendConfig::inline_bufs`]).
    buf_inline: usize,
    has_remote: bool,
    /// A [`Batch`] is open (or was leaked with `mem::forget`).
    batch_open: bool,
    /// What [`send_now`](SendRing::send_now) compares a message's format with to post it
    /// through the lone WR: `lone_fmt` normally, [`tag::EVENT`] (no message's format)
    /// while a [`Batch`] is open, so the open-batch check costs the lone path nothing.
    lone_key: u8,
    /// The format the lone WR holds ([`tag::UNFORMATTED`] until the first lone post).
    lone_fmt: u8,
    remote: RemoteBuf,
    // --- the slow path (once per signal period / batch / ring-full), posts, completions.
    posted: u64,
    retired: u64,
    /// `depth` normally, 0 while the QP is in error (one compare serves both checks).
    limit: u64,
    next_signal: u64,
    id_bits: u64,
    signal_every: u64,
    batch: u64,
    qp: *mut ibv_qp,
    /// `qp->qp_num`: a completion of another QP is never this ring's.
    qp_num: u32,
    /// The address of `wrs` when the links were last written (0: never).
    linked_at: usize,
    /// The WR whose `next` the last post cut (set to NULL), and the link it had: every
    /// other WR links to its successor. The next post restores it before cutting its own.
    cut_wr: *mut ibv_send_wr,
    cut_next: *mut ibv_send_wr,
    /// `posted` before the post in progress (a failed post goes back to it).
    posting_from: u64,
    /// Split mode: the key shared with this ring's [`SendCounters`] and [`SendRetirer`]
    /// (0: not split). See [`SendRing::split`].
    ///
    /// [`SendCounters`]: crate::split::SendCounters
    /// [`SendRetirer`]: crate::split::SendRetirer
    split_key: u64,
    depth: u64,
    /// The slot tagged [`tag::EVENT`] (at most one is), and the tag it had before.
    mark_slot: usize,
    mark_saved: u8,
    /// The last staging attempt found the ring full: the mark sits on the next slot, and
    /// the next retirement moves it on.
    blocked: bool,
}

/// Slot tags (see [`SendRing`]'s "Per-message cost"): what the slot's WR is formatted for.
/// Values below 0x80 are formats ([`fmt_of`]); the others never match a message (their
/// opcode bits are 7, which no [`Opcode`] has, so no format, poisoned or not, equals one).
mod tag {
    /// Never formatted (a fresh ring).
    pub const UNFORMATTED: u8 = 0xEF;
    /// The slot's last WR was signaled: its `send_flags` must be rewritten.
    pub const SIGNALED: u8 = 0xF7;
    /// The next WR staged in this slot is an event: it is signaled, completes a batch, fills
    /// the ring, ends a 2^55 epoch of sequence numbers or meets the error state.
    pub const EVENT: u8 = 0xFF;
}

/// The ring settings the fast path reads (see [`SendRing::fast_params`]).
#[derive(Clone, Copy, Debug)]
struct FastParams {
    /// OR-ed into a message's format: [`FMT_POISON`] for a batch-1 ring's `push` / `stage`
    /// (every WR is posted, which the slow path does), 0 otherwise. Loop-invariant, like the
    /// format itself.
    fmt_poison: u8,
    max_inline: usize,
    buf_inline: usize,
    has_remote: bool,
    remote_addr: u64,
    remote_len: u64,
}

/// [`fmt_of`] an inline message too long for the QP: never a slot's tag (opcode bits 7).
const FMT_TOO_LONG: u8 = 0x07;

/// OR-ed into any format (below 0x80, or [`FMT_TOO_LONG`]), it gives a value no tag has
/// (tags are formats, below 0x80, or the [`tag`] values, whose opcode bits are 7).
const FMT_POISON: u8 = 0x80;

/// The local kind bits of a format.
const KIND_MASK: u8 = 3 << 3;
/// Format bits of [`Msg::fence`] and [`Msg::solicited`] (`IBV_SEND_FENCE`,
/// `IBV_SEND_SOLICITED`): a flagged message has a format of its own, so its slot (or the
/// lone WR) is rewritten with its flags, and the next unflagged one rewrites them back.
const FMT_FENCE: u8 = 1 << 5;
const FMT_SOLICITED: u8 = 1 << 6;

/// The `send_flags` of a format besides `IBV_SEND_SIGNALED`.
#[inline(always)]
fn fmt_send_flags(fmt: u8) -> u32 {
    // The inline kinds have the bit `IBV_SEND_INLINE` is: one `and`. (A 16-entry table of
    // every kind and flag cost the event paths, which read messages from memory, four more
    // instructions per format written: `cargo xtask insn`, `send_now` on the counting
    // device.) The flags' test is written out here, not left to `flag_bits`: the compiler
    // then keeps the `and` on both ways, and `inline | flag_bits(fmt)` measured 0.015
    // more per lone `send_now`.
    let inline = u32::from(fmt & KIND_INLINE_BIT);
    if fmt & (FMT_FENCE | FMT_SOLICITED) == 0 {
        inline
    } else {
        inline | flag_bits(fmt)
    }
}

/// `IBV_SEND_FENCE` / `IBV_SEND_SOLICITED` of the fence and solicited bits of a format or
/// of [`Msg::op_flags`] (the same bits): one test for the common case of neither (the
/// event paths and the `WrRing`'s slow path read messages from memory, where mapping the
/// two bits cost five instructions each).
#[inline(always)]
const fn flag_bits(bits: u8) -> u32 {
    if bits & (FMT_FENCE | FMT_SOLICITED) == 0 {
        return 0;
    }
    (if bits & FMT_FENCE != 0 {
        IBV_SEND_FENCE
    } else {
        0
    }) | if bits & FMT_SOLICITED != 0 {
        IBV_SEND_SOLICITED
    } else {
        0
    }
}

/// Local kinds of a format.
const KIND_EMPTY: u8 = 0;
const KIND_INLINE: u8 = 1 << 3;
const KIND_BUF: u8 = 2 << 3;
const KIND_BUF_INLINE: u8 = 3 << 3;
/// Set in exactly the kinds sent inline; equal to `IBV_SEND_INLINE`.
const KIND_INLINE_BIT: u8 = 1 << 3;
const _: () = assert!(
    KIND_INLINE & KIND_INLINE_BIT != 0
        && KIND_BUF_INLINE & KIND_INLINE_BIT != 0
        && KIND_BUF & KIND_INLINE_BIT == 0
        && KIND_EMPTY & KIND_INLINE_BIT == 0
        && KIND_INLINE_BIT as u32 == IBV_SEND_INLINE
);

/// The format of a message: opcode, local kind (empty, inline, registered memory sent
/// inline, registered memory) and the fence and solicited flags. Two messages of one format differ only in the per-message
/// fields: `wr_id`, the SGE's address and length (and lkey), remote address, immediate and
/// atomic operands. Everything else (`opcode`, `num_sge`, `send_flags` of an unsignaled WR,
/// `rkey`) is the format's.
///
/// An inline payload longer than `max_inline` has no format ([`FMT_TOO_LONG`] matches no
/// tag), so the fast path needs no length check of its own: the slow path refuses it. For a
/// message built outside a loop the whole function is loop-invariant and the compiler
/// hoists it.
#[inline(always)]
fn fmt_of(msg: &Msg<'_>, max_inline: usize, buf_inline: usize) -> u8 {
    let kind = match msg.local {
        Local::Empty => KIND_EMPTY,
        Local::Inline(data) => {
            if data.len() > max_inline {
                return FMT_TOO_LONG;
            }
            KIND_INLINE
        }
        Local::Buf(b) => {
            if (b.len as usize) < buf_inline && msg.op.may_inline() {
                KIND_BUF_INLINE
            } else {
                KIND_BUF
            }
        }
    };
    // The message's flags moved to the format's bits (constants fold for a message built in
    // place: a message without flags pays nothing).
    msg.op_flags | kind
}

/// What a format writes into a WR besides its kind, in one word for the out-of-line
/// formatters: the raw opcode (bits 0..16), `num_sge` (16..24) and the `send_flags` of an
/// unsignaled WR of format `fmt` (24..32). For a message built in place it is a constant,
/// and the formatters take the flags with one shift (computed from `fmt` in the cold
/// function, they cost the batch loops a register: `cargo xtask insn`, batch 8).
#[inline(always)]
fn op_word(msg: &Msg<'_>, fmt: u8) -> u32 {
    let num_sge = !matches!(msg.local, Local::Empty) as u32;
    msg.op.raw() | num_sge << 16 | fmt_send_flags(fmt) << 24
}

const _: () = assert!(
    MSG_FENCE == FMT_FENCE
        && MSG_SOLICITED == FMT_SOLICITED
        && MSG_FENCE << 2 == crate::mlx5::CTRL_FENCE
        && MSG_SOLICITED >> 5 == crate::mlx5::CTRL_SOLICITED
        // `Msg::op_flags`: the opcode in the format's opcode bits, below the kind and flags.
        && (Opcode::CmpSwap as u8) < KIND_INLINE
        && (Opcode::FetchAdd as u8) < KIND_INLINE
);

/// Error state, touched only when something went wrong.
#[derive(Debug)]
struct Cold {
    error: Option<WcError>,
    deferred: Option<PostError>,
    /// A post failed with an unknown set of accepted WRs (see `post_unknown`).
    unknown: Option<PostError>,
    /// The error of the `send_now` in progress, between its out-of-line part and its
    /// return (see [`SendRing::send_now`]).
    pending: Option<SendError>,
}

/// The sequence number no message has: `send_now`'s out-of-line parts return it for "the
/// error is in `Cold::pending`".
const NO_SEQ: u64 = u64::MAX;

/// A ring of `N` preformatted `ibv_send_wr`s (N a power of two) for one QP's send queue.
///
/// Per message only `wr_id`, the SGE's address and length (lkey for registered memory) and
/// the op-specific remote fields are written; opcode, flags, `num_sge`, lkey and rkey are
/// the slot's format, written when a message of another format (or a signaled one) uses the
/// slot; the chain links and `sg_list` are set once. Staged WRs go to the NIC as one chain
/// per [`flush`](Self::flush) (one doorbell); every `signal_every`-th WR is signaled and its
/// completion retires it and all earlier WRs.
///
/// # Per-message cost
/// The fast path is a compare of the slot's tag with the message's format (for a message
/// built outside the loop the format is hoisted), the per-message stores and one counter:
/// about a dozen instructions in a [`Batch`], whose copy of the cursor stays in a register.
/// Everything else (signals, the end of a batch, a full ring, errors, a slot formatted for
/// another kind of message) is marked in the tags and handled out of line; the signal
/// schedule and capacity are compared on 64-bit counters only there. `cargo xtask insn`
/// measures it (docs/benchmarks.md).
///
/// # Placement
/// The ring is big (`N * 129` bytes and change) and self-referential, but it checks its links at
/// every post and re-links if it was moved, so it may live anywhere: a `static` (behind
/// your own synchronisation), a stack frame of the thread that uses it, or a `Box`.
/// [`SendRing::init_in`] formats it in place in any `MaybeUninit` storage (a
/// `Box::new_uninit`, a `static`), which avoids a large stack copy; with the `std` feature
/// `SendRing::new_boxed` does exactly that. Keeping it in one place avoids the re-link.
///
/// # References
/// `ibv_post_send(3)`, `ibv_create_qp(3)` (`sq_sig_all = 0`, `cap.max_send_wr`,
/// `cap.max_inline_data`).
#[repr(C, align(64))]
pub struct SendRing<const N: usize> {
    st: State,
    /// Per slot: the format its WR holds, or a reason why the next message staged there
    /// must take the slow path (see [`tag`]). Bookkeeping only, never seen by the provider.
    tags: [u8; N],
    wrs: UnsafeCell<[ibv_send_wr; N]>,
    /// The lone WR: [`send_now`](Self::send_now) posts a message through it when nothing
    /// else is staged. It is never linked (`next` NULL), so a lone post needs no chain cut
    /// and restore; its SGE lives in its own union like the slots'. Raw access only, like
    /// `wrs`.
    lone: UnsafeCell<ibv_send_wr>,
    cold: Cold,
    /// See the module's aliasing invariant.
    _pinned: PhantomPinned,
}

// SAFETY: the ring owns its WR arrays; the raw QP pointer is only used through
// ibv_post_send, which providers allow from any thread (one poster at a time, which `&mut`
// guarantees).
unsafe impl<const N: usize> Send for SendRing<N> {}

impl<const N: usize> core::fmt::Debug for SendRing<N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SendRing")
            .field("ring_id", &self.ring_id())
            .field("qp_num", &self.st.qp_num)
            .field("depth", &self.st.depth)
            .field("staged", &self.staged_seq())
            .field("posted", &self.st.posted)
            .field("retired", &self.st.retired)
            .field("error", &self.cold.error)
            .finish_non_exhaustive()
    }
}

impl<const N: usize> SendRing<N> {
    const MASK: usize = {
        // A power of two is checked by the constructors (a named ConfigError at the
        // user's call, not a post-monomorphization build error); a ring of another N is
        // never built, so this mask is never used with one.
        // The SGE fits the WR's bind_mw / tso union (see `sge_of`).
        assert!(
            core::mem::offset_of!(ibv_send_wr, __bindgen_anon_2) % core::mem::align_of::<ibv_sge>()
                == 0
                && core::mem::size_of::<ibv_sge>()
                    <= core::mem::size_of::<ibv_send_wr__bindgen_ty_4>()
        );
        N.wrapping_sub(1)
    };

    /// A ring posting to `qp`, formatted from `cfg`.
    ///
    /// # Safety
    /// `qp` is a live QP (created with `sq_sig_all = 0`, `cap.max_send_wr >= cfg.depth`,
    /// `cap.max_inline_data >= cfg.max_inline`) that outlives the ring, its send queue is
    /// used by this ring only, and its send completions are given to
    /// [`on_completion`](Self::on_completion) (or, in split mode, to a
    /// [`SendRetirer`](crate::split::SendRetirer)). Every [`Completion`] given to them for
    /// as long as the ring lives was returned by `ibv_poll_cq(3)` (not made up: a completion
    /// retires WRs, which frees their zero-copy buffers). `cfg.ring_id` is unique among the
    /// rings whose completions share a CQ. `cfg.remote`'s rkey and `cfg.ud`'s AH stay
    /// valid while the ring uses them.
    pub unsafe fn new(qp: *mut ibv_qp, cfg: SendConfig) -> Result<Self, ConfigError> {
        let mut slot = MaybeUninit::uninit();
        // SAFETY: forwarded contract.
        unsafe { Self::init_in(&mut slot, qp, cfg)? };
        // SAFETY: init_in returned Ok, so every field is initialised.
        Ok(unsafe { slot.assume_init() })
    }

    /// [`new`](Self::new) on the heap: the ring is built in place in a
    /// `Box::new_uninit` with [`init_in`](Self::init_in), so a large ring never passes
    /// through the stack. `std` feature only (the datapath allocates nothing otherwise).
    ///
    /// # Safety
    /// As [`new`](Self::new).
    #[cfg(feature = "std")]
    pub unsafe fn new_boxed(
        qp: *mut ibv_qp,
        cfg: SendConfig,
    ) -> Result<std::boxed::Box<Self>, ConfigError> {
        let mut b = std::boxed::Box::<Self>::new_uninit();
        // SAFETY: forwarded contract.
        unsafe { Self::init_in(&mut b, qp, cfg)? };
        // SAFETY: init_in returned Ok, so every field is initialised.
        Ok(unsafe { b.assume_init() })
    }

    /// Formats a ring in place (for `Box::new_uninit`, a `static` or any other storage)
    /// and returns it.
    ///
    /// # Safety
    /// As [`new`](Self::new).
    pub unsafe fn init_in(
        slot: &mut MaybeUninit<Self>,
        qp: *mut ibv_qp,
        cfg: SendConfig,
    ) -> Result<&mut Self, ConfigError> {
        let _ = Self::MASK;
        // N is a constant: this folds away for every power of two.
        if !N.is_power_of_two() {
            return Err(ConfigError::RingSize { n: N });
        }
        if qp.is_null() {
            return Err(ConfigError::Null);
        }
        let cfg = cfg.checked()?;
        let depth = cfg.depth as u64;
        if depth > N as u64 {
            return Err(ConfigError::Depth);
        }
        // SAFETY: a live QP (the caller's contract).
        if unsafe { (*qp).qp_type } == IBV_QPT_UD {
            match cfg.ud {
                // SAFETY: a non-NULL AH is live (the caller's contract); the QP is live.
                Some(ud) if !ud.ah.is_null() && unsafe { (*ud.ah).context == (*qp).context } => {}
                _ => return Err(ConfigError::UdDest),
            }
        }
        // SAFETY: a live QP (the caller's contract); qp_num is set at creation.
        let qp_num = unsafe { (*qp).qp_num };
        let p = slot.as_mut_ptr();
        // SAFETY: p points to writable storage for Self; all-zero bytes are a valid
        // ibv_send_wr / ibv_sge (integers, NULL pointers, plain unions) and a valid
        // UnsafeCell of them, and `st` is written as a whole before the reference is made.
        let ring = unsafe {
            addr_of_mut!((*p).wrs).write_bytes(0, 1);
            addr_of_mut!((*p).lone).write_bytes(0, 1);
            addr_of_mut!((*p).tags).write([tag::UNFORMATTED; N]);
            addr_of_mut!((*p).st).write(State {
                next_id: wr_id::encode(cfg.ring_id, 0),
                id_off: wr_id::encode(cfg.ring_id, 0),
                posted: 0,
                retired: 0,
                limit: depth,
                next_signal: cfg.signal_every as u64 - 1,
                id_bits: wr_id::encode(cfg.ring_id, 0),
                depth,
                signal_every: cfg.signal_every as u64,
                batch: cfg.batch as u64,
                max_inline: cfg.max_inline as usize,
                buf_inline: cfg.buf_inline_limit(),
                batch_open: false,
                lone_key: tag::UNFORMATTED,
                lone_fmt: tag::UNFORMATTED,
                qp,
                qp_num,
                remote: cfg.remote.unwrap_or_default(),
                has_remote: cfg.remote.is_some(),
                linked_at: 0,
                cut_wr: ptr::null_mut(),
                cut_next: ptr::null_mut(),
                posting_from: 0,
                split_key: 0,
                mark_slot: 0,
                mark_saved: tag::UNFORMATTED,
                blocked: false,
            });
            addr_of_mut!((*p).cold).write(Cold {
                error: None,
                deferred: None,
                unknown: None,
                pending: None,
            });
            &mut *p
        };
        let wrs = ring.wrs_ptr();
        for i in 0..=N {
            // i == N is the lone WR (unlinked: its `next` stays NULL).
            let wr = if i < N {
                // SAFETY: i < N: inside the array (raw access, see the aliasing invariant).
                unsafe { wrs.add(i) }
            } else {
                ring.lone.get()
            };
            // SAFETY: a WR of the ring (raw access, see the aliasing invariant).
            unsafe {
                (*wr).num_sge = 1;
                (*wr).opcode = IBV_WR_SEND;
                if let Some(ud) = cfg.ud {
                    (*wr).wr.ud = ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                        ah: ud.ah,
                        remote_qpn: ud.remote_qpn,
                        remote_qkey: ud.remote_qkey,
                    };
                }
            }
        }
        ring.link();
        ring.mark_event();
        Ok(ring)
    }

    /// The sequence number of the next staged WR (the count of WRs staged since creation).
    #[inline(always)]
    fn staged_seq(&self) -> u64 {
        self.st.next_id.wrapping_sub(self.st.id_off)
    }

    /// Sets the staged count (and the `wr_id` of the next WR, starting a new epoch of
    /// `id_off` if the count crossed a 2^55 boundary).
    #[inline(always)]
    fn set_staged(&mut self, staged: u64) {
        let st = &mut self.st;
        st.next_id = st.id_bits | (staged & wr_id::SEQ_MASK);
        st.id_off = st.next_id.wrapping_sub(staged);
    }

    /// The sequence number of the next WR that must take the slow path: the next scheduled
    /// signal, the WR that completes a batch, the one that fills the ring, the last of a
    /// 2^55 epoch; the next WR itself when the ring is full or in the error state.
    #[inline]
    fn event_at(&self) -> u64 {
        let st = &self.st;
        let staged = self.staged_seq();
        let cap = (st.retired + st.limit).saturating_sub(1);
        // With batch 1 a batch's end is no event: `send_now` posts anyway, and `push` /
        // `stage` never match a tag (`fmt_poison`), so they take the slow path, which posts.
        let batch_end = if st.batch == 1 {
            u64::MAX
        } else {
            st.posted + st.batch - 1
        };
        let epoch_end = staged | wr_id::SEQ_MASK;
        st.next_signal
            .min(cap)
            .min(batch_end)
            .min(epoch_end)
            .max(staged)
    }

    /// Tags the slot of the next event so the fast path leaves it to the slow path. Called
    /// whenever the next event may have moved earlier (a mark that turned out early costs
    /// one slow-path message, one that is late would be a bug): the event is always within
    /// the next `N` sequence numbers (`limit <= N`), so its slot is unambiguous, and it is
    /// never a staged WR's slot.
    ///
    /// One slot at a time carries the mark: moving it gives the previous slot back the tag
    /// it had (its WR was not touched meanwhile: only the slow path writes WRs, and staging
    /// into the marked slot consumes the mark).
    #[inline]
    fn mark_event(&mut self) {
        let e = self.event_at() as usize & Self::MASK;
        let old = self.st.mark_slot & Self::MASK;
        if old != e {
            if self.tags[old] == tag::EVENT {
                self.tags[old] = self.st.mark_saved;
            }
            self.st.mark_saved = self.tags[e];
            self.st.mark_slot = e;
        } else if self.tags[e] != tag::EVENT {
            self.st.mark_saved = self.tags[e];
        }
        self.tags[e] = tag::EVENT;
    }

    /// The WR array, for raw access only (see the module's aliasing invariant).
    #[inline(always)]
    fn wrs_ptr(&self) -> *mut ibv_send_wr {
        self.wrs.get().cast()
    }

    /// The SGE of the WR at `wr`: it lives in the WR's own `bind_mw` / `tso` union, which
    /// providers read only for `IBV_WR_BIND_MW` and `IBV_WR_TSO` (opcodes a ring never
    /// sends), so one slot index addresses the WR and its SGE alike.
    ///
    /// # Safety
    /// `wr` points into the WR array.
    #[inline(always)]
    unsafe fn sge_of(wr: *mut ibv_send_wr) -> *mut ibv_sge {
        // SAFETY: a place projection inside the WR (the caller's contract); no reference.
        unsafe { addr_of_mut!((*wr).__bindgen_anon_2).cast() }
    }

    /// Sets `sg_list` and the ring `next` links (once, and again after a move).
    #[cold]
    fn link(&mut self) {
        let wrs = self.wrs_ptr();
        for i in 0..N {
            // SAFETY: i and (i + 1) & MASK are < N, inside the array.
            unsafe {
                let wr = wrs.add(i);
                (*wr).sg_list = Self::sge_of(wr);
                (*wr).next = wrs.add((i + 1) & Self::MASK);
            }
        }
        // No link is cut: "restoring" the first one is a no-op.
        self.st.cut_wr = wrs;
        // SAFETY: 1 & MASK < N.
        self.st.cut_next = unsafe { wrs.add(1 & Self::MASK) };
        self.st.linked_at = wrs as usize;
    }

    /// Stages one message. Flushes automatically when `batch` WRs are staged or the ring
    /// becomes full (that WR is then signaled, so the ring can always drain). Returns the
    /// message's sequence number; it is retired when [`is_retired`](Self::is_retired) says so.
    ///
    /// # Safety
    /// For a [`Local::Buf`]: the memory stays registered and valid, is not written (SEND /
    /// WRITE source) or not accessed at all (READ / atomic destination) until the device is
    /// done with the WR: until `self.is_retired(seq)` is true (retirement comes only from
    /// completions of this ring's QP, per [`new`](Self::new)'s contract) or the unsafe
    /// [`reset`](Self::reset) returned. For a
    /// [`Local::Inline`]: the bytes stay valid until the WR is posted (the next flush,
    /// automatic or explicit, or `reset`). A SEND / WRITE [`Local::Buf`] of at most
    /// `max_inline` bytes is, by default, sent inline: the CPU reads it at its `addr` when
    /// posting, so it must be memory of this process; device memory (a dmabuf MR, whose
    /// `addr` is an IOVA) needs [`SendConfig::inline_bufs`]`(false)`. Safe alternatives:
    /// [`send_now`](Self::send_now) and [`batch`](Self::batch).
    #[inline(always)]
    pub unsafe fn stage(&mut self, msg: Msg<'_>) -> Result<u64, SendError> {
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
        self.stage_inner(&msg)
    }

    /// What the fast path reads besides the slot: a [`Batch`] keeps a copy (with its own
    /// cursor) in registers for as long as it is open.
    #[inline(always)]
    fn fast_params(&self) -> FastParams {
        FastParams {
            fmt_poison: if self.st.batch == 1 { FMT_POISON } else { 0 },
            max_inline: self.st.max_inline,
            buf_inline: self.st.buf_inline,
            has_remote: self.st.has_remote,
            remote_addr: self.st.remote.addr,
            remote_len: self.st.remote.len,
        }
    }

    /// Staging through the ring's own cursor (`stage`, `send_now`).
    #[inline(always)]
    fn stage_inner(&mut self, msg: &Msg<'_>) -> Result<u64, SendError> {
        let id = self.st.next_id;
        let p = self.fast_params();
        if self.try_fast(id, &p, msg)? {
            self.st.next_id = id + 1;
            Ok(id.wrapping_sub(self.st.id_off))
        } else {
            self.stage_slow(msg, false)
        }
    }

    /// The fast path of staging, for the WR whose `wr_id` is `id` (the cursor; the ring's
    /// `next_id` or a [`Batch`]'s copy of it): a message whose format the slot's WR already
    /// has (its tag says so, and the tag is no event) writes only its per-message fields.
    /// `Ok(true)`: staged (the caller advances the cursor); `Ok(false)`: the slow path must
    /// stage it; `Err`: refused, nothing changed.
    #[inline(always)]
    fn try_fast(&mut self, id: u64, p: &FastParams, msg: &Msg<'_>) -> Result<bool, SendError> {
        let i = id as usize & Self::MASK;
        // A too-long inline payload has no format: it takes the slow path, which refuses it.
        if self.tags[i] != fmt_of(msg, p.max_inline, p.buf_inline) | p.fmt_poison {
            return Ok(false);
        }
        let remote = match msg.op {
            Opcode::Send | Opcode::SendImm => 0,
            _ => Self::check_remote(p, msg)?,
        };
        // SAFETY: i < N (masked); raw access only (the module's aliasing invariant); `&mut
        // self` excludes every other access to the slot, which holds no staged WR (a
        // matching tag is never an event, so the ring is not full).
        unsafe { self.write_per_message(i, msg, remote, id) };
        Ok(true)
    }

    /// Writes the per-message fields of slot `i`: `wr_id`, the SGE (address, length; lkey
    /// of registered memory), the remote address, immediate and atomic operands.
    ///
    /// # Safety
    /// `i < N`, and the slot holds no staged WR.
    #[inline(always)]
    unsafe fn write_per_message(&mut self, i: usize, msg: &Msg<'_>, remote: u64, id: u64) {
        // Raw pointers from `UnsafeCell::get`, never references: see the module's aliasing
        // invariant.
        // SAFETY: i < N (the caller's contract): inside the array (in-bounds offsets also
        // tell the optimiser these slots are not the counters it keeps in registers).
        unsafe { Self::write_fields(self.wrs_ptr().add(i), msg, remote, id) }
    }

    /// [`write_per_message`](Self::write_per_message) on any WR of the ring (a slot or the
    /// lone WR).
    ///
    /// # Safety
    /// `wr` is a WR of this ring (a slot or `lone`) that holds no staged WR, reached by a
    /// raw pointer (the aliasing invariant).
    #[inline(always)]
    unsafe fn write_fields(wr: *mut ibv_send_wr, msg: &Msg<'_>, remote: u64, id: u64) {
        // SAFETY: the caller's contract.
        let sge = unsafe { Self::sge_of(wr) };
        // SAFETY: a WR of the ring; plain integer fields and Copy unions.
        unsafe {
            match msg.local {
                Local::Empty => {}
                Local::Inline(data) => {
                    (*sge).addr = data.as_ptr() as u64;
                    (*sge).length = data.len() as u32;
                }
                Local::Buf(b) => {
                    *sge = ibv_sge {
                        addr: b.addr,
                        length: b.len,
                        lkey: b.lkey,
                    }
                }
            }
            match msg.op {
                Opcode::Send => {}
                Opcode::SendImm => (*wr).__bindgen_anon_1.imm_data = msg.imm.to_be(),
                Opcode::Write | Opcode::Read => (*wr).wr.rdma.remote_addr = remote,
                Opcode::WriteImm => {
                    (*wr).wr.rdma.remote_addr = remote;
                    (*wr).__bindgen_anon_1.imm_data = msg.imm.to_be();
                }
                Opcode::FetchAdd | Opcode::CmpSwap => {
                    (*wr).wr.atomic.remote_addr = remote;
                    (*wr).wr.atomic.compare_add = msg.compare_add;
                    (*wr).wr.atomic.swap = msg.swap;
                }
            }
            (*wr).wr_id = id;
        }
    }

    /// The remote address of an RDMA or atomic message, checked against the ring's remote
    /// buffer (and 8-byte alignment for atomics).
    #[inline(always)]
    fn check_remote(p: &FastParams, msg: &Msg<'_>) -> Result<u64, SendError> {
        let len = match msg.local {
            Local::Empty => 0,
            Local::Inline(d) => d.len() as u64,
            Local::Buf(b) => b.len as u64,
        };
        match msg.op {
            Opcode::FetchAdd | Opcode::CmpSwap => {
                if msg.remote_offset & 7 != 0 || len != 8 {
                    return Err(SendError::AtomicMisaligned);
                }
                let remote_addr = Self::remote_addr(p, msg.remote_offset, 8)?;
                if remote_addr & 7 != 0 {
                    return Err(SendError::AtomicMisaligned);
                }
                Ok(remote_addr)
            }
            _ => Self::remote_addr(p, msg.remote_offset, len),
        }
    }

    #[cold]
    fn inline_too_long(&self, len: usize) -> SendError {
        SendError::InlineTooLong {
            len,
            max: self.st.max_inline as u32,
        }
    }

    /// The slow path of staging: events (the signal schedule, the end of a batch, a full
    /// ring, the error state, an epoch boundary of `wr_id`s) and slots formatted for another
    /// kind of message. The message-specific part (validation, the per-message fields) is
    /// inlined where the message is built, so it folds to a few instructions for a known kind
    /// of message; the rest is one outlined cold call, [`slow_stage`](Self::slow_stage), which
    /// writes the format, tags the slot, runs the signal schedule, posts when due and marks
    /// the next event.
    #[inline(always)]
    fn stage_slow(&mut self, msg: &Msg<'_>, post: bool) -> Result<u64, SendError> {
        let max_inline = self.st.max_inline;
        if let Local::Inline(data) = msg.local {
            if data.len() > max_inline {
                return Err(self.refused(self.inline_too_long(data.len())));
            }
        }
        let remote = match msg.op {
            Opcode::Send | Opcode::SendImm => 0,
            _ => match Self::check_remote(&self.fast_params(), msg) {
                Ok(r) => r,
                Err(e) => return Err(self.refused(e)),
            },
        };
        let id = self.st.next_id;
        let i = id as usize & Self::MASK;
        // The per-message fields go in before the capacity check: the slot at the cursor
        // holds no staged WR (staged WRs are behind the cursor), and one the provider has
        // been given may be rewritten once the post returned (module invariants). Its
        // `send_flags`, which `signaled_in_flight` reads, are only written once there is
        // room.
        // SAFETY: i < N (masked); raw access only; as above.
        unsafe { self.write_per_message(i, msg, remote, id) };
        let fmt = fmt_of(msg, max_inline, self.st.buf_inline);
        self.slow_stage(fmt, op_word(msg, fmt), post)
    }

    /// A message failed validation: the error it gets, unless the ring is full or in the
    /// error state, which takes precedence (the order the checks had when they were all in
    /// one place: room first).
    #[cold]
    #[inline(never)]
    fn refused(&self, e: SendError) -> SendError {
        if self.staged_seq() - self.st.retired >= self.st.limit {
            self.blocked()
        } else {
            e
        }
    }

    /// The outlined part of the slow path: the WR at the cursor has its per-message fields;
    /// check for room (else mark the slot, remember the ring is blocked and say so), write
    /// the format (`op_sge`: [`op_word`]: opcode, `num_sge` and the format's `send_flags`;
    /// `fmt`'s kind gives the lkey) and the signal flag (the schedule's turn, or the WR fills the ring),
    /// tag the slot, advance the schedule and the cursor, post if the batch is complete, the
    /// ring full or the caller posts anyway (`post`: [`send_now`](Self::send_now)), and mark
    /// the next event (after the post, which moves the batch's end).
    #[cold]
    #[inline(never)]
    fn slow_stage(&mut self, fmt: u8, op_sge: u32, post: bool) -> Result<u64, SendError> {
        let seq = self.staged_seq();
        let i = seq as usize & Self::MASK;
        if self.st.batch == 1 && self.tags[i] == fmt {
            // A batch-1 ring's `push` / `stage`: their formats are poisoned, so every message
            // comes here, but this one's slot has its format and is no event (an event tag
            // never equals a format): stage it and post it alone, as `send_now`'s fast path
            // does. The next event does not move (a batch-1 ring has no batch end).
            self.st.next_id += 1;
            self.post_chain(seq + 1, i)?;
            return Ok(seq);
        }
        let st = &self.st;
        if seq - st.retired >= st.limit {
            // The mark stays on this slot: the next message comes back here.
            self.mark_event();
            self.st.blocked = true;
            return Err(self.blocked());
        }
        let full = seq + 1 - st.retired == st.limit;
        let scheduled = seq == st.next_signal;
        // The WR that fills the ring is always signaled and posted at once: a full ring
        // therefore always has a signaled WR in flight and drains by polling.
        let signaled = scheduled || full;
        let kind = fmt & KIND_MASK;
        let mut flags = op_sge >> 24;
        if signaled {
            flags |= IBV_SEND_SIGNALED;
        }
        // SAFETY: i < N (masked): inside the array; raw access only; the slot holds no
        // staged WR (room was checked).
        unsafe { self.write_format(self.wrs_ptr().add(i), kind, op_sge, flags) };
        self.tags[i] = if signaled { tag::SIGNALED } else { fmt };
        if i == self.st.mark_slot & Self::MASK {
            // Staging into the marked slot consumed the mark.
            self.st.mark_saved = self.tags[i];
        }
        if scheduled {
            self.st.next_signal += self.st.signal_every;
        }
        self.set_staged(seq + 1);
        if post || full || seq + 1 - self.st.posted >= self.st.batch {
            let r = self.flush_inner();
            self.mark_event();
            r?;
        } else {
            self.mark_event();
        }
        Ok(seq)
    }

    /// Writes a format into `wr`: `op_sge` (the raw opcode and `num_sge` of an [`op_word`]),
    /// the send flags, the lkey of an inline SGE (0) and the rkey of a remote operation.
    ///
    /// # Safety
    /// `wr` is a WR of this ring (a slot or `lone`) that holds no staged WR, reached by a
    /// raw pointer (the aliasing invariant).
    #[inline(always)]
    unsafe fn write_format(&self, wr: *mut ibv_send_wr, kind: u8, op_sge: u32, flags: u32) {
        let op = op_sge & 0xFFFF;
        // SAFETY: the caller's contract; plain integer fields and Copy unions.
        unsafe {
            (*wr).num_sge = ((op_sge >> 16) & 0xFF) as i32;
            (*wr).opcode = op;
            (*wr).send_flags = flags;
            if kind == KIND_INLINE {
                (*Self::sge_of(wr)).lkey = 0;
            }
            match op {
                IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM | IBV_WR_RDMA_READ => {
                    (*wr).wr.rdma.rkey = self.st.remote.rkey;
                }
                IBV_WR_ATOMIC_FETCH_AND_ADD | IBV_WR_ATOMIC_CMP_AND_SWP => {
                    (*wr).wr.atomic.rkey = self.st.remote.rkey;
                }
                _ => {}
            }
        }
    }

    #[inline(always)]
    fn remote_addr(p: &FastParams, offset: u64, len: u64) -> Result<u64, SendError> {
        if !p.has_remote {
            return Err(SendError::NoRemote);
        }
        match offset.checked_add(len) {
            Some(end) if end <= p.remote_len => Ok(p.remote_addr.wrapping_add(offset)),
            _ => Err(SendError::RemoteOutOfRange { offset, len }),
        }
    }

    #[cold]
    fn blocked(&self) -> SendError {
        match (self.cold.error, self.cold.unknown) {
            (Some(e), _) => SendError::QpError(e),
            (None, Some(e)) => SendError::Post(e),
            (None, None) => SendError::WouldBlock,
        }
    }

    /// Posts every staged WR as one chain with one `ibv_post_send` (cut after the last
    /// staged WR, post, restore the link). On failure the WRs before the rejected one are
    /// posted and the rest are dropped (their slots are free again).
    #[inline]
    pub fn flush(&mut self) -> Result<(), SendError> {
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
        if let Some(e) = self.cold.deferred.take() {
            return Err(SendError::Post(e));
        }
        self.flush_inner()
    }

    /// Posts the staged chain. The next event only moves later (the batch restarts), so the
    /// mark stays: at worst it sends one message through the slow path early.
    #[inline]
    fn flush_inner(&mut self) -> Result<(), SendError> {
        let staged = self.staged_seq();
        if staged == self.st.posted {
            return Ok(());
        }
        self.post_chain(staged, (staged - 1) as usize & Self::MASK)
    }

    /// Posts `posted..staged` (non-empty) as one chain; `last` is the slot of `staged - 1`.
    #[inline(always)]
    fn post_chain(&mut self, staged: u64, last: usize) -> Result<(), SendError> {
        let wrs = self.wrs_ptr();
        if self.st.linked_at != wrs as usize {
            self.link();
        }
        let posted = self.st.posted;
        let first = posted as usize & Self::MASK;
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // Counted as posted before the call (nothing reads the ring during it): nothing of
        // the ring stays live across the call but the ring itself. A failed post puts the
        // count back from `posting_from`.
        self.st.posting_from = posted;
        self.st.posted = staged;
        // SAFETY: first/last are masked indices inside `wrs`; the chain first..=last is
        // linked (checked above: the one link cut by the previous post is restored here) and
        // cut at `last`, once per post; every WR in it was formatted by the staging paths,
        // with inline pointers kept valid by the stage/Batch contracts; the QP is live per
        // `new`'s contract. `cut_wr` / `cut_next` point into `wrs` (set by `link` and here).
        let rc = unsafe {
            *addr_of_mut!((*self.st.cut_wr).next) = self.st.cut_next;
            let last_wr = wrs.add(last);
            self.st.cut_next = (*last_wr).next;
            self.st.cut_wr = last_wr;
            (*last_wr).next = ptr::null_mut();
            ibv_post_send(self.st.qp, wrs.add(first), &mut bad)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(SendError::Post(self.post_failed(rc, bad)))
        }
    }

    #[cold]
    fn post_failed(&mut self, rc: i32, bad: *mut ibv_send_wr) -> PostError {
        self.st.posted = self.st.posting_from;
        let first = self.st.posted as usize & Self::MASK;
        let n = (self.staged_seq() - self.st.posted) as usize;
        // Index of `bad` in the chain, if it points at a WR of the chain (wrapping: a
        // provider returning a pointer outside the chain must not panic here).
        let off = (bad as usize).wrapping_sub(self.wrs_ptr() as usize);
        let sz = core::mem::size_of::<ibv_send_wr>();
        let k = (off / sz).wrapping_sub(first) & Self::MASK;
        if bad.is_null() || off % sz != 0 || off / sz >= N || k >= n {
            return self.post_unknown(rc);
        }
        let rejected_seq = self.st.posted + k as u64;
        self.st.posted = rejected_seq;
        self.unstage_to(rejected_seq);
        PostError {
            verb: "ibv_post_send",
            errno: rc,
            first_rejected: k,
            first_rejected_seq: rejected_seq,
        }
    }

    /// The provider failed the post without naming a WR of the chain (`bad_wr` NULL, as rxe
    /// does before RTS, or outside the chain): which WRs it queued is unknown, so all of
    /// them count as outstanding (their buffers stay borrowed) and the ring refuses new WRs
    /// until [`reset`](Self::reset).
    #[cold]
    fn post_unknown(&mut self, rc: i32) -> PostError {
        let e = PostError {
            verb: "ibv_post_send",
            errno: rc,
            first_rejected: PostError::UNKNOWN,
            first_rejected_seq: self.st.posted,
        };
        self.st.posted = self.staged_seq();
        self.cold.unknown = Some(e);
        self.st.limit = 0;
        self.mark_event();
        e
    }

    /// Drops staged WRs from `seq` on and rewinds the signal schedule.
    #[cold]
    fn unstage_to(&mut self, seq: u64) {
        self.set_staged(seq);
        let st = &mut self.st;
        while st.next_signal >= st.signal_every && st.next_signal - st.signal_every >= seq {
            st.next_signal -= st.signal_every;
        }
        self.mark_event();
    }

    #[cold]
    fn drop_leaked_batch(&mut self) {
        // A Batch was forgotten: its unposted WRs may point at dead inline data.
        self.st.batch_open = false;
        self.st.lone_key = self.st.lone_fmt;
        let posted = self.st.posted;
        self.unstage_to(posted);
    }

    /// Stages `msg` and posts it at once together with anything already staged: the path
    /// for one latency-critical message (a lone inline WR is what mlx5 BlueFlames).
    /// Safe: only inline or empty payloads ([`SendError::NotInline`] otherwise).
    ///
    /// When nothing else is staged and the message is no event (not due for a signal, not
    /// filling the ring), it goes out through the ring's lone WR, which is never linked:
    /// the post needs no chain cut and restore (its slot keeps the format it had, and its
    /// unsignaled flags, so [`slot_wr`](Self::slot_wr) still tells signaled from not).
    #[inline(always)]
    pub fn send_now(&mut self, msg: Msg<'_>) -> Result<u64, SendError> {
        if !msg.is_borrow_free() {
            return Err(SendError::NotInline);
        }
        // Both ways end in a sequence number, or NO_SEQ with the error kept in the ring: the
        // 48-byte `Result` is built once, here, from one scalar, so the caller's test of it
        // folds into a compare of that scalar (a `Result` merged from two producers would be
        // built in memory and tested there, about eight instructions a message).
        let seq = if self.lone_ready(&msg) {
            self.lone_post::<false>(&msg)
        } else {
            self.send_now_event(msg)
        };
        if seq != NO_SEQ {
            Ok(seq)
        } else {
            Err(self.take_pending())
        }
    }

    /// The error `send_now`'s out-of-line part kept.
    #[cold]
    #[inline(never)]
    fn take_pending(&mut self) -> SendError {
        self.cold.pending.take().unwrap_or(SendError::WouldBlock)
    }

    /// Keeps `e` for [`take_pending`](Self::take_pending); returns [`NO_SEQ`].
    #[cold]
    #[inline(never)]
    fn pend(&mut self, e: SendError) -> u64 {
        self.cold.pending = Some(e);
        NO_SEQ
    }

    /// `send_now` at an event, out of line (`msg` by value: copied only here): the
    /// schedule's signal (or the WR that fills the ring) with nothing staged goes out
    /// through the lone WR, signaled ([`lone_post`](Self::lone_post) with `SIGNALED`);
    /// anything else through the ring's chain. A sequence number, or [`NO_SEQ`] with the
    /// error kept.
    #[inline(never)]
    fn send_now_event(&mut self, msg: Msg<'_>) -> u64 {
        if self.lone_signal_ready(&msg) {
            return self.lone_post::<true>(&msg);
        }
        match self.send_now_chain(msg) {
            Ok(s) => s,
            Err(e) => self.pend(e),
        }
    }

    /// The event at the cursor is only a signal: no batch is open, nothing is staged, the
    /// mark sits on the cursor's slot, the ring has room, the WR is the schedule's signal or
    /// the one that fills the ring (both are signaled and posted at once, which a lone post
    /// does), and it does not end a 2^55 epoch of `wr_id`s; and the lone WR takes the
    /// message (as [`lone_ready`](Self::lone_ready)).
    #[inline(always)]
    fn lone_signal_ready(&mut self, msg: &Msg<'_>) -> bool {
        let st = &self.st;
        let id = st.next_id;
        let seq = id.wrapping_sub(st.id_off);
        if st.batch_open
            || self.tags[id as usize & Self::MASK] != tag::EVENT
            || seq != st.posted
            || seq - st.retired >= st.limit
            || (seq != st.next_signal && seq + 1 - st.retired != st.limit)
            || seq & wr_id::SEQ_MASK == wr_id::SEQ_MASK
        {
            return false;
        }
        self.lone_takes(msg, self.st.lone_fmt)
    }

    /// Whether the lone WR can post `msg` now: nothing else is staged, no batch is open,
    /// the cursor's slot is no event (nor signaled or unformatted: its flags keep saying
    /// "unsignaled"), and the lone WR holds the message's format (formatting it, cold, if
    /// not). `msg` is inline or empty.
    #[inline(always)]
    fn lone_ready(&mut self, msg: &Msg<'_>) -> bool {
        let id = self.st.next_id;
        // Formats are below 0x80; events, signaled and unformatted slots are not.
        if self.tags[id as usize & Self::MASK] >= 0x80
            || id.wrapping_sub(self.st.id_off) != self.st.posted
        {
            return false;
        }
        self.lone_takes(msg, self.st.lone_key)
    }

    /// The lone WR takes `msg` (inline or empty): not too long for inline, and the WR holds
    /// its format, `key` (`lone_key`, poisoned while a batch is open; or `lone_fmt`),
    /// formatting it (cold) if not and no batch is open.
    #[inline(always)]
    fn lone_takes(&mut self, msg: &Msg<'_>, key: u8) -> bool {
        // The format without the length check (a constant for a message built in place),
        // then the length.
        let fmt = fmt_of(msg, usize::MAX, usize::MAX);
        if let Local::Inline(d) = msg.local {
            if d.len() > self.st.max_inline {
                return false;
            }
        }
        fmt == key || self.format_lone(fmt, op_word(msg, fmt))
    }

    /// Posts `msg` alone through the lone WR ([`lone_ready`](Self::lone_ready), or with
    /// `SIGNALED` [`lone_signal_ready`](Self::lone_signal_ready), said yes): its sequence
    /// number, or [`NO_SEQ`] with the error kept. `SIGNALED` (a constant, so the common
    /// path carries none of it) posts the WR signaled and then does what the slow path does
    /// for a signaled WR: advances the schedule, flags the message's slot signaled (its tag
    /// says so, so the slot's next message rewrites its flags, and `slot_wr` tells this WR
    /// was signaled) and marks the next event.
    #[inline(always)]
    fn lone_post<const SIGNALED: bool>(&mut self, msg: &Msg<'_>) -> u64 {
        let remote = match msg.op {
            Opcode::Send | Opcode::SendImm => 0,
            // The slot is no event (or only a signal): the ring has room, so a refusal is
            // the message's.
            _ => match Self::check_remote(&self.fast_params(), msg) {
                Ok(r) => r,
                Err(e) => return self.pend(e),
            },
        };
        let id = self.st.next_id;
        let seq = id.wrapping_sub(self.st.id_off);
        let wr = self.lone.get();
        // SAFETY: the lone WR, by raw pointer (aliasing invariant); it holds no staged WR
        // (the provider read the previous one during its post). `sg_list` is set at every
        // post, so a moved ring needs no re-link.
        let flags = unsafe {
            Self::write_fields(wr, msg, remote, id);
            (*wr).sg_list = Self::sge_of(wr);
            let f = (*wr).send_flags;
            if SIGNALED {
                (*wr).send_flags = f | IBV_SEND_SIGNALED;
            }
            f
        };
        self.st.next_id = id + 1;
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: the lone WR is formatted for this message (`lone_takes`), unlinked (`next`
        // is NULL from creation on), its SGE points at inline bytes (copied during the
        // post) or nothing; the QP is live per `new`'s contract.
        let rc = unsafe { ibv_post_send(self.st.qp, wr, &mut bad) };
        if SIGNALED {
            // SAFETY: the lone WR; the provider is done with it.
            unsafe { (*wr).send_flags = flags };
        }
        if rc != 0 {
            let e = self.lone_failed(rc, bad, seq);
            return self.pend(e);
        }
        self.st.posted = seq + 1;
        if SIGNALED {
            self.signaled_alone(seq);
        }
        seq
    }

    /// The slow path's bookkeeping for a WR posted signaled through the lone WR (see
    /// [`lone_post`](Self::lone_post)).
    #[inline(always)]
    fn signaled_alone(&mut self, seq: u64) {
        if seq == self.st.next_signal {
            self.st.next_signal += self.st.signal_every;
        }
        let i = seq as usize & Self::MASK;
        // SAFETY: i < N (masked); raw access only; the slot holds no staged WR (nothing is).
        unsafe { (*self.wrs_ptr().add(i)).send_flags |= IBV_SEND_SIGNALED };
        self.tags[i] = tag::SIGNALED;
        if i == self.st.mark_slot & Self::MASK {
            // The message consumed the mark (as in `slow_stage`).
            self.st.mark_saved = tag::SIGNALED;
        }
        self.mark_event();
    }

    /// Formats the lone WR for `fmt` (`op_sge`: its [`op_word`]) unless a
    /// batch is open (`lone_key` says which).
    #[cold]
    #[inline(never)]
    fn format_lone(&mut self, fmt: u8, op_sge: u32) -> bool {
        if self.st.batch_open {
            return false;
        }
        let kind = fmt & KIND_MASK;
        let flags = op_sge >> 24;
        // SAFETY: the lone WR by raw pointer; it holds no staged WR.
        unsafe { self.write_format(self.lone.get(), kind, op_sge, flags) };
        self.st.lone_fmt = fmt;
        self.st.lone_key = fmt;
        true
    }

    /// A lone post failed: `bad` the lone WR (rejected, nothing queued: the message is
    /// unstaged) or anything else (which WRs the provider queued is unknown: see
    /// `post_unknown`).
    #[cold]
    #[inline(never)]
    fn lone_failed(&mut self, rc: i32, bad: *mut ibv_send_wr, seq: u64) -> SendError {
        SendError::Post(if bad == self.lone.get() {
            self.unstage_to(seq);
            PostError {
                verb: "ibv_post_send",
                errno: rc,
                first_rejected: 0,
                first_rejected_seq: seq,
            }
        } else {
            self.post_unknown(rc)
        })
    }

    /// `send_now` through the ring: stage in the cursor's slot, post the chain. Out of
    /// line: the lone path is the one worth inlining, and a small caller lets the compiler
    /// branch straight from the lone post's success to the caller's next step.
    #[inline(never)]
    fn send_now_chain(&mut self, msg: Msg<'_>) -> Result<u64, SendError> {
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
        let id = self.st.next_id;
        let p = FastParams {
            // Posted below in any case.
            fmt_poison: 0,
            ..self.fast_params()
        };
        if !self.try_fast(id, &p, &msg)? {
            // Posts the chain too.
            return self.stage_slow(&msg, true);
        }
        self.st.next_id = id + 1;
        let staged = (id + 1).wrapping_sub(self.st.id_off);
        // The chain ends with this message's slot.
        self.post_chain(staged, id as usize & Self::MASK)?;
        Ok(staged - 1)
    }

    /// Opens a batch of inline messages whose bytes live for `'d`: pushed messages are
    /// posted when the batch auto-flushes, on [`Batch::finish`], or when it is dropped.
    #[inline]
    pub fn batch<'d>(&mut self) -> Batch<'_, 'd, N> {
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
        self.st.batch_open = true;
        self.st.lone_key = tag::EVENT;
        Batch {
            next_id: self.st.next_id,
            params: self.fast_params(),
            ring: self,
            _data: PhantomData,
        }
    }

    /// Retires the WRs covered by a send completion of this ring: a completion (success or
    /// error) for sequence `s` retires every WR up to and including `s`. Returns how many
    /// WRs it retired: 0 for a *stale* completion of this ring (its ring id, kind and QP,
    /// but not for an outstanding WR: e.g. a flush left in the CQ across a
    /// [`reset`](Self::reset)), which is ignored whatever its status. An error status of an
    /// outstanding WR also puts the ring in the error state.
    ///
    /// # Errors
    /// The completion's error status ([`WcError`]; the ring then refuses new WRs until
    /// reset), or [`WcError::Misrouted`] for a completion that is not this ring's at all
    /// (another ring id, a receive, another QP): nothing changes, and the completion still
    /// belongs to the ring the error names (route by [`Completion::ring`]).
    #[inline]
    pub fn on_completion(&mut self, c: &Completion) -> Result<u64, WcError> {
        // An outstanding WR of the current 2^55 epoch of `wr_id`s is `wr_id - id_off`;
        // everything else (another ring's, stale, a WR of the previous epoch) is decided
        // out of line.
        let st = &self.st;
        match wr_id::outstanding_in_epoch(
            c.wr_id(),
            c.qp_num(),
            st.id_bits,
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
        let retired = s + 1 - st.retired;
        st.retired = s + 1;
        if st.blocked {
            self.unblock();
        }
        match c.status() {
            Ok(()) => Ok(retired),
            Err(e) => {
                self.enter_error(e);
                Err(e)
            }
        }
    }

    /// [`on_completion`](Self::on_completion) of anything but an outstanding WR of the
    /// current epoch: another ring's completion ([`WcError::Misrouted`]), an outstanding WR
    /// of the previous epoch, or a stale one (`Ok(0)`: e.g. a flush left in the CQ across a
    /// reset, ignored whatever its status, so it cannot put a recovered ring back in the
    /// error state).
    #[cold]
    #[inline(never)]
    fn on_completion_odd(&mut self, c: &Completion) -> Result<u64, WcError> {
        if wr_id::foreign(c.wr_id(), c.qp_num(), self.st.id_bits, self.st.qp_num) {
            return self.refuse(c);
        }
        match wr_id::full_seq(self.st.posted, self.st.retired, c.seq()) {
            Some(s) => self.retire_through(s, c),
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

    /// Room was made while the mark sat on the slot the ring was full at: move it on.
    #[cold]
    #[inline(never)]
    fn unblock(&mut self) {
        self.st.blocked = false;
        self.mark_event();
    }

    #[cold]
    fn enter_error(&mut self, e: WcError) {
        // Keep the first error (flushes follow it).
        if self.cold.error.is_none() {
            self.cold.error = Some(e);
        }
        self.st.limit = 0;
        self.mark_event();
    }

    /// Retires everything before `retired` (split mode: the poller's published count).
    #[inline]
    pub(crate) fn retire_to(&mut self, retired: u64) {
        if retired > self.st.retired && retired <= self.st.posted {
            self.st.retired = retired;
            if self.st.blocked {
                self.unblock();
            }
        }
    }

    /// Split mode, poster side: absorbs the poller's progress (retired count, first error)
    /// from `shared`, then publishes this ring's posted count to it (progress information
    /// for the poller; it does not need it to handle completions). Call it after
    /// [`SendError::WouldBlock`] and after each flush.
    ///
    /// # Panics
    /// If `shared` are not the counters of this ring's latest [`split`](Self::split): their
    /// retired count would free this ring's buffers on another ring's completions.
    #[inline]
    pub fn sync<O: crate::split::Orderings>(&mut self, shared: &crate::split::SendCounters<O>) {
        if shared.key() != self.st.split_key || shared.key() == 0 {
            self.foreign_counters(shared.key());
        }
        self.retire_to(shared.observe_retired());
        if let Some(e) = shared.observe_error() {
            self.enter_error(e);
        }
        shared.publish_posted(self.st.posted);
    }

    #[cold]
    #[inline(never)]
    fn foreign_counters(&self, key: u64) -> ! {
        panic!(
            "SendRing::sync: counters of another ring or split (key {key}, this ring's latest \
             split has key {}): use the counters SendRing::split returned",
            self.st.split_key
        )
    }

    /// Split mode: the counters the poster and the poller share and the poller-side
    /// [`SendRetirer`](crate::split::SendRetirer) (this ring's id, QP number, depth and
    /// retired count), bound together and to this ring by a fresh key. Call it before
    /// handing the ring to the poster thread, and again after a [`reset`](Self::reset)
    /// (counters and retirers of an earlier split are refused from then on).
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

    /// Forgets every staged and outstanding WR and leaves the error state. Returns the
    /// number of WRs that never completed. Completions of them still in the CQ are
    /// recognised as stale and ignored. Call it after the setup layer moved the QP to
    /// RESET (which discards its WRs without completions) and before INIT -> RTR -> RTS.
    ///
    /// Calling it needs `unsafe`: on a live QP it would free buffers the NIC still reads.
    /// ```compile_fail,E0133
    /// # use hotverbs_datapath::{SendConfig, SendRing};
    /// # let dev = hotverbs_softnic::counting::CountingDevice::new(16);
    /// # let mut ring: SendRing<8> =
    /// #     unsafe { SendRing::new(dev.qp(), SendConfig::new(1, 8, 0)) }.unwrap();
    /// ring.reset();
    /// ```
    ///
    /// # Safety
    /// The device no longer uses any WR of this ring: the QP is in RESET (or in ERR with
    /// all its flush completions drained, then moved to RESET before reuse). Every
    /// zero-copy buffer of an outstanding WR counts as free once this returns, which is
    /// only true if the device dropped those WRs. In split mode no retirer may be running
    /// (make new counters and a new retirer with [`split`](Self::split)).
    pub unsafe fn reset(&mut self) -> u64 {
        let dropped = self.staged_seq() - self.st.retired;
        let posted = self.st.posted;
        self.set_staged(posted);
        let st = &mut self.st;
        st.batch_open = false;
        st.lone_key = st.lone_fmt;
        self.cold.deferred = None;
        self.cold.unknown = None;
        st.retired = posted;
        self.cold.error = None;
        st.limit = st.depth;
        // Restart the signal schedule relative to the new position.
        st.next_signal = posted + st.signal_every - 1;
        self.mark_event();
        dropped
    }

    /// Points the ring's RDMA WRITE / READ / atomic messages at `remote` from now on: a
    /// new peer's region after a recovery (`reset`, then the QP connected to another
    /// peer), or another region of the same peer. Staged WRs are posted first, so they
    /// keep the old remote; WRs already posted are the provider's copies and keep it too.
    /// Cold: every slot's preformatted key is dropped (the next message of each slot
    /// writes its whole format again, the new rkey with it).
    ///
    /// # Errors
    /// `Config(RemoteAndUd)` on a UD ring (UD has no remote memory); the errors of
    /// [`flush`](Self::flush) (nothing changed then).
    pub fn set_remote(&mut self, remote: RemoteBuf) -> Result<(), SendError> {
        // SAFETY: a live QP (new's contract).
        if unsafe { (*self.st.qp).qp_type } == IBV_QPT_UD {
            return Err(SendError::Config(ConfigError::RemoteAndUd));
        }
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
        self.flush()?;
        self.st.remote = remote;
        self.st.has_remote = true;
        // Every format holds the old rkey: forget them (event marks stay marks).
        for t in self.tags.iter_mut() {
            if *t != tag::EVENT {
                *t = tag::UNFORMATTED;
            }
        }
        self.st.mark_saved = tag::UNFORMATTED;
        self.st.lone_fmt = tag::UNFORMATTED;
        self.st.lone_key = tag::UNFORMATTED;
        Ok(())
    }

    /// UD mode: switches the preformatted destination (AH, remote QPN, Q_Key) of every slot,
    /// e.g. from a unicast peer to a multicast group. Cold (touches all `N` WRs); staged
    /// WRs are posted first so they keep their destination. One ring per send queue: this
    /// is how one UD QP talks to several destinations in turn.
    ///
    /// It takes a raw `ibv_ah` the provider dereferences, hence `unsafe`:
    /// ```compile_fail,E0133
    /// # use hotverbs_datapath::{SendConfig, SendRing, UdDest};
    /// # let dev = hotverbs_softnic::counting::CountingDevice::new(16);
    /// # let mut ring: SendRing<8> =
    /// #     unsafe { SendRing::new(dev.qp(), SendConfig::new(1, 8, 0)) }.unwrap();
    /// let dangling = UdDest { ah: 8 as *mut _, remote_qpn: 1, remote_qkey: 1 };
    /// ring.set_ud_dest(dangling);
    /// ```
    ///
    /// # Safety
    /// `dest.ah` is a live address handle of the QP's PD (`ibv_create_ah(3)`) that stays
    /// valid until every WR posted with it has completed and no later WR uses it (the
    /// provider dereferences it while posting and the device may use it until completion).
    pub unsafe fn set_ud_dest(&mut self, dest: UdDest) -> Result<(), SendError> {
        if self.st.has_remote {
            return Err(SendError::NoRemote);
        }
        // SAFETY: the QP is live (new's contract), a non-NULL AH too (this fn's contract).
        if dest.ah.is_null() || unsafe { (*dest.ah).context != (*self.st.qp).context } {
            return Err(SendError::Config(ConfigError::UdDest));
        }
        self.flush()?;
        let wrs = self.wrs_ptr();
        for i in 0..=N {
            // i == N is the lone WR.
            let wr = if i < N {
                // SAFETY: i < N: inside the array; raw access only (module invariant).
                unsafe { wrs.add(i) }
            } else {
                self.lone.get()
            };
            // SAFETY: a WR of the ring holding no staged WR (all were posted above); raw
            // access only (module invariant).
            unsafe {
                (*wr).wr.ud = ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                    ah: dest.ah,
                    remote_qpn: dest.remote_qpn,
                    remote_qkey: dest.remote_qkey,
                }
            };
        }
        Ok(())
    }

    /// Makes the next staged WR signaled, whatever the schedule says (the schedule then
    /// continues from it). For an idle ring: the last `< signal_every` WRs posted are
    /// retired only by a later signaled WR, so before going idle stage the last message
    /// after `signal_next()` (or use [`flush_signaled`](Self::flush_signaled)).
    #[inline]
    pub fn signal_next(&mut self) {
        self.st.next_signal = self.staged_seq();
        self.mark_event();
    }

    /// Marks the last staged WR signaled and posts the staged chain, so that every WR
    /// posted so far is retired by a completion (no idle tail). Returns `Ok(false)` if
    /// nothing was staged (nothing posted; if the last posted WR was unsignaled, send one
    /// more message after [`signal_next`](Self::signal_next)).
    #[inline]
    pub fn flush_signaled(&mut self) -> Result<bool, SendError> {
        if self.st.batch_open {
            self.drop_leaked_batch();
        }
        let staged = self.staged_seq();
        if staged == self.st.posted {
            return self.flush().map(|()| false);
        }
        let last = (staged - 1) as usize & Self::MASK;
        // SAFETY: last < N: inside the array; raw access only (module invariant).
        unsafe { (*self.wrs_ptr().add(last)).send_flags |= IBV_SEND_SIGNALED };
        self.tags[last] = tag::SIGNALED;
        // The schedule's next signal stays >= staged: runs only get shorter.
        self.flush().map(|()| true)
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
        retirer.join("SendRing::unsplit", self.st.split_key, shared);
        self.sync(shared);
        self.st.split_key = 0;
    }

    /// True once [`split`](Self::split) handed out counters and a retirer (a reset must
    /// then not run while the retirer may).
    #[inline]
    pub fn is_split(&self) -> bool {
        self.st.split_key != 0
    }

    /// True once the WR with sequence `seq` is retired (its buffers are free again).
    #[inline(always)]
    pub fn is_retired(&self, seq: u64) -> bool {
        seq < self.st.retired
    }
    /// WRs posted and not yet retired.
    #[inline(always)]
    pub fn outstanding(&self) -> u64 {
        self.st.posted - self.st.retired
    }
    /// Retired and outstanding counts for a [`StallWatch`](crate::StallWatch): a ring with
    /// WRs outstanding whose retired count stops moving is stuck, not slow (see
    /// [`progress`](crate::progress)). In split mode use [`SendCounters::progress`](crate::SendCounters::progress).
    #[inline(always)]
    pub fn progress(&self) -> crate::Progress {
        crate::Progress {
            retired: self.st.retired,
            outstanding: self.st.posted - self.st.retired,
        }
    }
    /// WRs staged and not yet posted.
    #[inline(always)]
    pub fn staged(&self) -> u64 {
        self.staged_seq() - self.st.posted
    }
    /// Slots available to [`stage`](Self::stage) (0 in the error state).
    #[inline(always)]
    pub fn free(&self) -> u64 {
        self.st
            .limit
            .saturating_sub(self.staged_seq() - self.st.retired)
    }
    /// Total WRs posted since creation (the next posted sequence number).
    #[inline(always)]
    pub fn posted_total(&self) -> u64 {
        self.st.posted
    }
    /// Total WRs retired since creation.
    #[inline(always)]
    pub fn retired_total(&self) -> u64 {
        self.st.retired
    }
    /// The configured depth (maximum outstanding WRs).
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
        self.cold.error
    }
    /// The ring id in its `wr_id`s.
    #[inline(always)]
    pub fn ring_id(&self) -> u8 {
        wr_id::ring_of(self.st.id_bits)
    }
    /// The preformatted WR that sequence `seq` uses (slot `seq & (N - 1)`), for inspection
    /// in tests and debuggers.
    pub fn slot_wr(&self, seq: u64) -> &ibv_send_wr {
        // SAFETY: the index is masked below N. The ring writes its WRs only through `&mut
        // self`, which cannot coexist with the returned `&self` borrow.
        unsafe { &*self.wrs_ptr().add(seq as usize & Self::MASK) }
    }

    /// Sequence numbers of the signaled WRs among the outstanding ones are those with
    /// `send_flags & IBV_SEND_SIGNALED`; this reports whether any posted, unretired WR is
    /// signaled (the no-deadlock invariant: true whenever the ring is full).
    pub fn signaled_in_flight(&self) -> bool {
        (self.st.retired..self.st.posted)
            .any(|s| self.slot_wr(s).send_flags & IBV_SEND_SIGNALED != 0)
    }
}

/// Inline messages staged under one borrow of their bytes; see [`SendRing::batch`].
#[must_use = "a batch posts its messages on finish() or drop"]
pub struct Batch<'r, 'd, const N: usize> {
    ring: &'r mut SendRing<N>,
    /// The ring's cursor (`next_id`) while the batch is open: the fast path advances this
    /// copy, which lives in a register of the caller's loop, and the ring's is brought up to
    /// date before the slow path, on `finish` and on drop. (A leaked batch leaves the
    /// ring's cursor behind: the ring drops the leaked batch's unposted WRs anyway.)
    next_id: u64,
    /// The ring settings the fast path reads, also kept in registers.
    params: FastParams,
    _data: PhantomData<&'d [u8]>,
}

impl<const N: usize> core::fmt::Debug for Batch<'_, '_, N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Batch")
            .field("ring", &self.ring)
            .field("staged", &self.staged())
            .finish()
    }
}

impl<'d, const N: usize> Batch<'_, 'd, N> {
    /// Stages one inline or empty message (auto-flushing at the batch size or when the ring
    /// fills). Returns its sequence number.
    #[inline(always)]
    pub fn push(&mut self, msg: Msg<'d>) -> Result<u64, SendError> {
        if !msg.is_borrow_free() {
            return Err(SendError::NotInline);
        }
        let id = self.next_id;
        if self.ring.try_fast(id, &self.params, &msg)? {
            self.next_id = id + 1;
            Ok(id.wrapping_sub(self.ring.st.id_off))
        } else {
            self.ring.st.next_id = id;
            let r = self.ring.stage_slow(&msg, false);
            self.next_id = self.ring.st.next_id;
            r
        }
    }

    /// Number of messages staged and not yet posted.
    #[inline(always)]
    pub fn staged(&self) -> u64 {
        self.next_id.wrapping_sub(self.ring.st.id_off) - self.ring.st.posted
    }

    /// Posts what is staged and closes the batch.
    #[inline]
    pub fn finish(self) -> Result<(), SendError> {
        let mut this = core::mem::ManuallyDrop::new(self);
        this.ring.st.next_id = this.next_id;
        this.ring.st.batch_open = false;
        this.ring.st.lone_key = this.ring.st.lone_fmt;
        this.ring.flush_inner()
    }
}

impl<const N: usize> Drop for Batch<'_, '_, N> {
    fn drop(&mut self) {
        self.ring.st.next_id = self.next_id;
        self.ring.st.batch_open = false;
        self.ring.st.lone_key = self.ring.st.lone_fmt;
        if let Err(SendError::Post(e)) = self.ring.flush_inner() {
            // Reported by the next SendRing::flush.
            self.ring.cold.deferred = Some(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cq::CqPoller;
    use hotverbs_softnic::counting::CountingDevice;

    impl<const N: usize> SendRing<N> {
        /// A fresh ring (nothing staged or outstanding) as if `seq` WRs had been posted
        /// and retired: the counters of a long-lived ring, e.g. near a 2^55 epoch end.
        fn jump_to(&mut self, seq: u64) {
            assert_eq!(self.outstanding(), 0);
            let st = &mut self.st;
            st.posted = seq;
            st.retired = seq;
            st.posting_from = seq;
            st.next_signal = seq + st.signal_every - 1;
            self.set_staged(seq);
            self.mark_event();
        }
    }

    /// WRs posted across the end of a 2^55 epoch of `wr_id`s retire on their completions,
    /// whichever epoch they were staged in: those of the ending epoch are decided out of
    /// line (`on_completion_odd`), those of the new one on the fast path; a completion
    /// seen again afterwards is stale.
    #[test]
    fn completions_across_the_wr_id_epoch_retire_their_wrs() {
        const N: usize = 16;
        let dev = CountingDevice::new(256);
        // SAFETY: the counting device's QP and CQ outlive the ring and poller; nothing else
        // uses them.
        let mut r: SendRing<N> = unsafe {
            SendRing::new(
                dev.qp(),
                SendConfig::new(3, N as u32, 64).signal_every(4).batch(16),
            )
        }
        .unwrap();
        // SAFETY: as above.
        let mut p: CqPoller<8> = unsafe { CqPoller::new(dev.cq()) };
        let epoch = wr_id::SEQ_MASK + 1;
        r.jump_to(epoch - 8);
        let data = [5u8; 8];
        let mut b = r.batch();
        for k in 0..12u64 {
            assert_eq!(
                b.push(Msg::send(Local::Inline(&data))),
                Ok(epoch - 8 + k),
                "message {k}"
            );
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
        // Seen again: stale, whatever the epoch it came from.
        for c in cs.iter() {
            assert_eq!(r.on_completion(c), Ok(0));
        }
        // The ring goes on in the new epoch.
        assert_eq!(r.send_now(Msg::send(Local::Inline(&data))), Ok(epoch + 4));
    }

    /// Drains the CQ into the ring; returns the completions seen.
    fn drain<const N: usize>(p: &mut CqPoller<8>, r: &mut SendRing<N>) -> usize {
        let mut seen = 0;
        loop {
            let cs = p.poll().unwrap();
            if cs.is_empty() {
                return seen;
            }
            for c in cs {
                r.on_completion(c).unwrap();
                seen += 1;
            }
        }
    }

    /// A batch-1 ring posts every message at once, through `push`, `stage` and `send_now`
    /// alike, and never stalls: its formats are poisoned for `push` / `stage` (whose slow path
    /// posts), a poisoned format never matches the event mark, and the signal schedule keeps a
    /// signaled WR in flight whenever the ring fills.
    #[test]
    fn batch_one_posts_every_message_and_drains() {
        const N: usize = 16;
        let dev = CountingDevice::new(256);
        // SAFETY: the counting device's QP and CQ outlive the ring and poller; nothing else
        // uses them.
        let mut r: SendRing<N> = unsafe {
            SendRing::new(
                dev.qp(),
                SendConfig::new(1, N as u32, 64).signal_every(4).batch(1),
            )
        }
        .unwrap();
        // SAFETY: as above.
        let mut p: CqPoller<8> = unsafe { CqPoller::new(dev.cq()) };
        let data = [7u8; 8];
        let mut sent = 0u64;
        for round in 0..(8 * N) {
            let d0 = dev.doorbells();
            let res = match round % 3 {
                0 => {
                    let mut b = r.batch();
                    let res = b.push(Msg::send(Local::Inline(&data)));
                    if res.is_ok() {
                        assert_eq!(b.staged(), 0, "posted at once");
                    }
                    b.finish().unwrap();
                    res
                }
                // SAFETY: inline bytes that outlive the post (which happens inside).
                1 => unsafe { r.stage(Msg::send(Local::Inline(&data))) },
                _ => r.send_now(Msg::send(Local::Inline(&data))),
            };
            match res {
                Ok(seq) => {
                    assert_eq!(seq, sent);
                    sent += 1;
                    assert_eq!(
                        dev.doorbells(),
                        d0 + 1,
                        "round {round}: one post per message"
                    );
                    assert_eq!(r.staged(), 0);
                }
                Err(SendError::WouldBlock) => {
                    assert!(r.signaled_in_flight());
                    assert!(
                        drain(&mut p, &mut r) > 0,
                        "round {round}: a full ring drains"
                    );
                }
                Err(e) => panic!("round {round}: {e}"),
            }
        }
        assert_eq!(dev.send_wrs(), sent);
        assert!(sent > 4 * N as u64);
    }

    #[test]
    fn poison_matches_no_tag() {
        // Every format a message can have (opcodes 0..=6, four kinds, both flags).
        let fmts = (0..0x80u8).filter(|f| f & 7 != 7).chain([FMT_TOO_LONG]);
        for fmt in fmts {
            let tags = [tag::EVENT, tag::SIGNALED, tag::UNFORMATTED];
            assert!(!tags.contains(&fmt), "{fmt:#x} is a tag");
            let v = fmt | FMT_POISON;
            assert!(v >= 0x80 && !tags.contains(&v), "{fmt:#x}");
        }
        // Tags are not formats: `lone_ready`'s `>= 0x80` test tells them apart.
        for t in [tag::EVENT, tag::SIGNALED, tag::UNFORMATTED] {
            assert!(t & 0x80 != 0 && t & 7 == 7, "{t:#x}");
        }
    }
}
