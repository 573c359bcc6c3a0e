//! [`ExCqPoller`]: drains an extended CQ (`ibv_cq_ex`) with `ibv_start_poll` /
//! `ibv_next_poll` / `ibv_end_poll` into [`Completion`]s, the type a
//! [`CqPoller`](crate::CqPoller) produces, so rings take them unchanged.
//!
//! `wr_id` and `status` come from the CQ's public fields; every other field is read only if
//! it was asked for ([`ExFields`]), each costing one `ibv_wc_read_*` call into the provider.
//! Fields not read are 0 in the [`Completion`]. Raw completion timestamps
//! (`ibv_wc_read_completion_ts`) go into a parallel array ([`ExCqPoller::poll_ts`]).
//!
//! # Invariants (this module owns a raw CQ pointer)
//! `wcs[..n]` and `ts[..n]` are written for the `n` completions of the last poll; only that
//! prefix is exposed. Every reader called was checked non-NULL at construction.

use hotverbs_ffi::inline::*;
use hotverbs_ffi::*;

use crate::cq::Completion;
use crate::error::ConfigError;

/// `ENOENT`: `ibv_start_poll` / `ibv_next_poll` found no completion.
const ENOENT: i32 = 2;

/// The completion fields an [`ExCqPoller`] reads. The `IBV_WC_EX_WITH_*` ones must be in
/// the CQ's `wc_flags`; [`OPCODE`](Self::OPCODE), [`WC_FLAGS`](Self::WC_FLAGS) and
/// [`VENDOR_ERR`](Self::VENDOR_ERR) have readers on every extended CQ.
///
/// Send rings ([`SendRing`](crate::SendRing), [`WrRing`](crate::WrRing)) need only `wr_id`,
/// `status` and `qp_num` ([`QP_NUM`](Self::QP_NUM) or [`ExCqPoller::with_qp_num`]); a
/// [`RecvRing`](crate::RecvRing) also reads the message length ([`BYTE_LEN`](Self::BYTE_LEN))
/// and, for immediates, [`IMM`](Self::IMM).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ExFields(u64);

impl ExFields {
    /// Nothing beyond `wr_id` and `status`.
    pub const NONE: Self = Self(0);
    /// `byte_len` (`IBV_WC_EX_WITH_BYTE_LEN`).
    pub const BYTE_LEN: Self = Self(IBV_WC_EX_WITH_BYTE_LEN as u64);
    /// The immediate (`IBV_WC_EX_WITH_IMM`); implies [`WC_FLAGS`](Self::WC_FLAGS), which
    /// says whether a completion carries one.
    pub const IMM: Self = Self(IBV_WC_EX_WITH_IMM as u64);
    /// `qp_num` (`IBV_WC_EX_WITH_QP_NUM`): rings check it, so ask for it or give the QP
    /// number with [`ExCqPoller::with_qp_num`].
    pub const QP_NUM: Self = Self(IBV_WC_EX_WITH_QP_NUM as u64);
    /// `src_qp` (`IBV_WC_EX_WITH_SRC_QP`).
    pub const SRC_QP: Self = Self(IBV_WC_EX_WITH_SRC_QP as u64);
    /// `slid` (`IBV_WC_EX_WITH_SLID`).
    pub const SLID: Self = Self(IBV_WC_EX_WITH_SLID as u64);
    /// `sl` (`IBV_WC_EX_WITH_SL`).
    pub const SL: Self = Self(IBV_WC_EX_WITH_SL as u64);
    /// The raw completion timestamp (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`), in the
    /// device's clock (`hca_core_clock`); see [`ExCqPoller::poll_ts`].
    pub const COMPLETION_TS: Self = Self(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP as u64);
    /// `opcode` (always available).
    pub const OPCODE: Self = Self(1 << 62);
    /// `wc_flags` (always available).
    pub const WC_FLAGS: Self = Self(1 << 63);
    /// `vendor_err`, read for error completions only (always available).
    pub const VENDOR_ERR: Self = Self(1 << 61);

    const ALWAYS: u64 = Self::OPCODE.0 | Self::WC_FLAGS.0 | Self::VENDOR_ERR.0;

    /// Both sets.
    pub const fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
    /// True if every field of `other` is in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
    /// The `IBV_WC_EX_WITH_*` bits these fields need in the CQ's `wc_flags`.
    pub const fn wc_flags(self) -> u64 {
        self.0 & !Self::ALWAYS
    }
}

impl core::ops::BitOr for ExFields {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.with(rhs)
    }
}

/// A failed `ibv_start_poll` / `ibv_next_poll` (anything but `ENOENT`, which means empty).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExPollError {
    /// The verb that failed.
    pub verb: &'static str,
    /// The errno it returned.
    pub errno: i32,
}

impl core::fmt::Display for ExPollError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} failed with errno {}: the CQ is in error (overrun?): recreate it",
            self.verb, self.errno
        )
    }
}

impl core::error::Error for ExPollError {}

/// Polls one extended CQ, up to `B` completions per `ibv_start_poll` .. `ibv_end_poll`.
///
/// # One completion per poll (rxe)
/// By default one [`poll`](Self::poll) is one `ibv_start_poll`, up to `B - 1`
/// `ibv_next_poll`s and one `ibv_end_poll`. librxe (rdma-core 44) corrupts the CQ when an
/// `ibv_next_poll` that returns `ENOENT` is followed by the `ibv_end_poll` the verbs
/// contract requires: its `next_poll` publishes the consumer index on `ENOENT` and its
/// `end_poll` advances it once more, past the producer. A plain `ibv_start_poll` ..
/// `ibv_end_poll` (which consumes exactly the one completion `start_poll` returned) is
/// correct there. [`one_per_poll(true)`](Self::one_per_poll) selects that pattern: each
/// poll loops `ibv_start_poll` .. `ibv_end_poll` up to `B` times, one completion each,
/// stopping at the first `ENOENT`, and never calls `ibv_next_poll`. The setup layer's
/// `Cq::ex_poller` chooses it when `Context::ex_cq_batch_poll_safe` is false.
///
/// # References
/// `ibv_create_cq_ex(3)` (the poll functions and `ibv_wc_read_*`).
pub struct ExCqPoller<const B: usize> {
    cq: *mut ibv_cq_ex,
    fields: ExFields,
    /// `qp_num` of every completion when [`ExFields::QP_NUM`] is not read.
    qp_num: u32,
    /// An error of `ibv_next_poll` after some completions were read: returned by the next
    /// poll (the completions read are returned first).
    pending: Option<ExPollError>,
    /// [`one_per_poll`](Self::one_per_poll): never `ibv_next_poll`.
    one_per_poll: bool,
    /// The CQ's poll functions, read once in [`new`](Self::new) (which refuses a CQ
    /// without them), as `WrRing` reads its QP's (`wr.rs`, `Slots`): the calls skip
    /// `ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll`'s per-call slot load and NULL
    /// test. Providers fill these slots when they create the CQ and never change them.
    polls: PollFns,
    wcs: [Completion; B],
    ts: [u64; B],
}

/// An extended CQ's `start_poll`, `next_poll` and `end_poll`.
#[derive(Clone, Copy, Debug)]
struct PollFns {
    start: unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> core::ffi::c_int,
    next: unsafe extern "C" fn(*mut ibv_cq_ex) -> core::ffi::c_int,
    end: unsafe extern "C" fn(*mut ibv_cq_ex),
}

// SAFETY: the poll verbs may be called from any thread; `&mut self` makes this poller the
// CQ's only user on the Rust side, as `new`'s contract requires.
unsafe impl<const B: usize> Send for ExCqPoller<B> {}

impl<const B: usize> core::fmt::Debug for ExCqPoller<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ExCqPoller")
            .field("cq", &self.cq)
            .field("fields", &self.fields)
            .field("batch", &B)
            .field("one_per_poll", &self.one_per_poll)
            .finish()
    }
}

impl<const B: usize> ExCqPoller<B> {
    const CHECK: () = assert!(B > 0, "ExCqPoller<B>: 0 < B");

    /// A poller of `cq` reading `fields`. Fails with [`ConfigError::WcFields`] if a field is
    /// not in `cq_wc_flags` or its reader is NULL, [`ConfigError::Null`] for a NULL CQ.
    ///
    /// # Safety
    /// `cq` is a live extended CQ created with `wc_flags == cq_wc_flags` (the CQ does not
    /// record them, and a provider's reader of a field it was not asked for may read
    /// garbage), that outlives the poller and is polled by no one else meanwhile.
    pub unsafe fn new(
        cq: *mut ibv_cq_ex,
        fields: ExFields,
        cq_wc_flags: u64,
    ) -> Result<Self, ConfigError> {
        let () = Self::CHECK;
        if cq.is_null() {
            return Err(ConfigError::Null);
        }
        let fields = if fields.contains(ExFields::IMM) {
            fields.with(ExFields::WC_FLAGS)
        } else {
            fields
        };
        if fields.wc_flags() & !cq_wc_flags != 0 {
            return Err(ConfigError::WcFields);
        }
        // SAFETY: a live extended CQ (the caller's contract); plain reads of its table.
        let c = unsafe { &*cq };
        let needs = [
            (ExFields::OPCODE, c.read_opcode.is_some()),
            (ExFields::WC_FLAGS, c.read_wc_flags.is_some()),
            (ExFields::VENDOR_ERR, c.read_vendor_err.is_some()),
            (ExFields::BYTE_LEN, c.read_byte_len.is_some()),
            (ExFields::IMM, c.read_imm_data.is_some()),
            (ExFields::QP_NUM, c.read_qp_num.is_some()),
            (ExFields::SRC_QP, c.read_src_qp.is_some()),
            (ExFields::SLID, c.read_slid.is_some()),
            (ExFields::SL, c.read_sl.is_some()),
            (ExFields::COMPLETION_TS, c.read_completion_ts.is_some()),
        ];
        let polls = match (c.start_poll, c.next_poll, c.end_poll) {
            (Some(start), Some(next), Some(end)) => PollFns { start, next, end },
            _ => return Err(ConfigError::WcFields),
        };
        for (f, present) in needs {
            if fields.contains(f) && !present {
                return Err(ConfigError::WcFields);
            }
        }
        Ok(Self {
            cq,
            fields,
            qp_num: 0,
            pending: None,
            one_per_poll: false,
            polls,
            wcs: [const { Completion::PLACEHOLDER }; B],
            ts: [0; B],
        })
    }

    /// Without [`ExFields::QP_NUM`]: every completion gets `qp_num` (saves a reader call per
    /// completion). Only for a CQ that serves this one QP (rings check `qp_num` and the ring
    /// id in `wr_id`).
    pub fn with_qp_num(mut self, qp_num: u32) -> Self {
        self.qp_num = qp_num;
        self
    }

    /// With `true`, every completion is read in its own `ibv_start_poll` ..
    /// `ibv_end_poll` and `ibv_next_poll` is never called (see the type's docs: the only
    /// safe pattern on librxe of rdma-core 44). A poll still returns up to `B`
    /// completions. Default `false`.
    pub fn one_per_poll(mut self, on: bool) -> Self {
        self.one_per_poll = on;
        self
    }

    /// Whether this poller reads one completion per `ibv_start_poll` ..
    /// `ibv_end_poll` ([`one_per_poll`](Self::one_per_poll)).
    pub fn is_one_per_poll(&self) -> bool {
        self.one_per_poll
    }

    /// The fields this poller reads.
    pub fn fields(&self) -> ExFields {
        self.fields
    }

    /// One `ibv_start_poll` .. `ibv_end_poll`: up to `B` completions (possibly none).
    #[inline]
    pub fn poll(&mut self) -> Result<&mut [Completion], ExPollError> {
        let n = self.poll_inner()?;
        Ok(&mut self.wcs[..n])
    }

    /// As [`poll`](Self::poll), with the raw completion timestamps of the same completions
    /// (all 0 unless [`ExFields::COMPLETION_TS`] is read). Convert them to ns with
    /// `ibv_query_rt_values_ex` / `hca_core_clock` (the setup layer does).
    #[inline]
    pub fn poll_ts(&mut self) -> Result<(&mut [Completion], &[u64]), ExPollError> {
        let n = self.poll_inner()?;
        Ok((&mut self.wcs[..n], &self.ts[..n]))
    }

    #[inline]
    fn poll_inner(&mut self) -> Result<usize, ExPollError> {
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        if self.one_per_poll {
            return self.poll_one_each();
        }
        let (cq, polls) = (self.cq, self.polls);
        let mut attr = ibv_poll_cq_attr { comp_mask: 0 };
        // SAFETY: a live extended CQ, polled only here (new's contract); `start` is its
        // `start_poll`.
        let rc = unsafe { (polls.start)(cq, &mut attr) };
        if rc != 0 {
            return if rc == ENOENT {
                Ok(0)
            } else {
                Err(ExPollError {
                    verb: "ibv_start_poll",
                    errno: rc,
                })
            };
        }
        // Locals, not fields: the provider calls below may write any memory the compiler
        // cannot rule out (this poller included), so fields would be reloaded per completion.
        let (fields, qp_num) = (self.fields, self.qp_num);
        let mut n = 0;
        loop {
            // SAFETY: between a successful start/next poll and end poll; readers were
            // checked at construction.
            unsafe { self.read(cq, fields, qp_num, n) };
            n += 1;
            if n == B {
                break;
            }
            // SAFETY: as above; `next` is the CQ's `next_poll`.
            let rc = unsafe { (polls.next)(cq) };
            if rc != 0 {
                if rc != ENOENT {
                    self.pending = Some(ExPollError {
                        verb: "ibv_next_poll",
                        errno: rc,
                    });
                }
                break;
            }
        }
        // SAFETY: closes the poll started above (`end` is the CQ's `end_poll`).
        unsafe { (polls.end)(cq) };
        Ok(n)
    }

    /// [`one_per_poll`](Self::one_per_poll): up to `B` rounds of `ibv_start_poll`, read,
    /// `ibv_end_poll`; no `ibv_next_poll`.
    #[inline(never)]
    fn poll_one_each(&mut self) -> Result<usize, ExPollError> {
        let (cq, polls) = (self.cq, self.polls);
        let (fields, qp_num) = (self.fields, self.qp_num);
        let mut n = 0;
        while n < B {
            let mut attr = ibv_poll_cq_attr { comp_mask: 0 };
            // SAFETY: a live extended CQ, polled only here (new's contract); the previous
            // round's poll was closed by its end poll; `start` is the CQ's `start_poll`.
            let rc = unsafe { (polls.start)(cq, &mut attr) };
            if rc != 0 {
                if rc == ENOENT {
                    break;
                }
                let e = ExPollError {
                    verb: "ibv_start_poll",
                    errno: rc,
                };
                if n == 0 {
                    return Err(e);
                }
                self.pending = Some(e);
                break;
            }
            // SAFETY: after a successful start poll, before its end poll; readers were
            // checked at construction; n < B.
            unsafe { self.read(cq, fields, qp_num, n) };
            n += 1;
            // SAFETY: closes the poll started above (`end` is the CQ's `end_poll`).
            unsafe { (polls.end)(cq) };
        }
        Ok(n)
    }

    /// Reads the current completion into slot `n`: `wr_id`, `status` and `qp_num` always,
    /// the requested fields through their readers. Fields never requested are never
    /// written, so they keep the 0 of [`Completion::PLACEHOLDER`] (a requested field is
    /// written for every completion, so nothing stale survives).
    ///
    /// # Safety
    /// Between a successful start/next poll and end poll of `cq` (this poller's CQ, polled
    /// with its `fields` and `qp_num`); `n < B`.
    #[inline(always)]
    unsafe fn read(&mut self, cq: *mut ibv_cq_ex, f: ExFields, qp_num: u32, n: usize) {
        // One raw pointer to the poller, taken first; the slot pointer (here) and the
        // timestamp's (in `read_fields`) derive from it, and nothing reborrows `self` until
        // the writes through them are done: `read_fields` takes the raw pointer, not
        // `&mut self`, whose retag (Unique for the whole poller under Stacked Borrows, a
        // write under Tree Borrows) would invalidate `wc` (issue 27 item 5;
        // `tests/wr_ring.rs` under miri). Passing the poller, the slot and `n` keeps the
        // cold call's arguments in the registers the loop already has.
        let this: *mut Self = self;
        // SAFETY: the caller's contract; `this` is the live poller and n < B; `wc` points at
        // slot n (Completion is repr(transparent) over ibv_wc).
        unsafe {
            let wc: *mut ibv_wc = (&raw mut (*this).wcs[n]).cast();
            (*wc).wr_id = (*cq).wr_id;
            (*wc).status = (*cq).status;
            (*wc).qp_num = qp_num;
            if f.0 != 0 {
                Self::read_fields(this, wc, n);
            }
        }
    }

    /// The requested readers of the current completion (out of line: a poller that reads
    /// none, the common case of a CQ serving one QP, pays one compare). An associated fn
    /// on a raw pointer, not a `&mut self` method: see [`read`](Self::read).
    ///
    /// # Safety
    /// As [`read`](Self::read); `this` is the poller, valid for reads and writes, `wc` its
    /// slot `n` (derived from `this`), and nothing else accesses them meanwhile.
    #[inline(never)]
    unsafe fn read_fields(this: *mut Self, wc: *mut ibv_wc, n: usize) {
        // SAFETY: the caller's contract: plain field reads through the raw pointer.
        let (cq, f) = unsafe { ((*this).cq, (*this).fields) };
        // SAFETY: the caller's contract.
        unsafe {
            let status = (*wc).status;
            if f.contains(ExFields::OPCODE) {
                (*wc).opcode = ibv_wc_read_opcode(cq);
            }
            if f.contains(ExFields::VENDOR_ERR) {
                (*wc).vendor_err = if status != IBV_WC_SUCCESS {
                    ibv_wc_read_vendor_err(cq)
                } else {
                    0
                };
            }
            if f.contains(ExFields::WC_FLAGS) {
                (*wc).wc_flags = ibv_wc_read_wc_flags(cq);
            }
            if f.contains(ExFields::BYTE_LEN) {
                (*wc).byte_len = ibv_wc_read_byte_len(cq);
            }
            if f.contains(ExFields::IMM) {
                (*wc).__bindgen_anon_1.imm_data = if (*wc).wc_flags & IBV_WC_WITH_IMM != 0 {
                    ibv_wc_read_imm_data(cq)
                } else {
                    0
                };
            }
            if f.contains(ExFields::QP_NUM) {
                (*wc).qp_num = ibv_wc_read_qp_num(cq);
            }
            if f.contains(ExFields::SRC_QP) {
                (*wc).src_qp = ibv_wc_read_src_qp(cq);
            }
            if f.contains(ExFields::SLID) {
                (*wc).slid = ibv_wc_read_slid(cq) as u16;
            }
            if f.contains(ExFields::SL) {
                (*wc).sl = ibv_wc_read_sl(cq);
            }
            if f.contains(ExFields::COMPLETION_TS) {
                (*this).ts[n] = ibv_wc_read_completion_ts(cq);
            }
        }
    }

    /// The CQ this poller drains.
    #[inline(always)]
    pub fn cq(&self) -> *mut ibv_cq_ex {
        self.cq
    }
}
