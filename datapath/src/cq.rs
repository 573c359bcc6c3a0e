//! [`CqPoller`]: drains a CQ in bursts, into an array it owns ([`CqPoller::poll`]) or one
//! the caller owns ([`CqPoller::poll_into`]); [`Completion`] reads a WC.
//!
//! # Invariants (this module owns a raw CQ pointer)
//! `wcs[..n]` is initialised by the provider for the `n` that `ibv_poll_cq(3)` returned;
//! only that prefix is ever exposed. `wcs[rest.lo..rest.hi]` (empty unless a
//! [`CqPoller::drain`] closure panicked) are completions of the last poll that nobody was
//! handed yet: every poll returns them before it polls the CQ again.

use core::hint::spin_loop;

use hotverbs_ffi::inline::ibv_poll_cq;
use hotverbs_ffi::*;

use crate::error::{Misrouted, PollError, WcError};
use crate::wr_id;

/// One work completion (`struct ibv_wc`) with cheap accessors.
///
/// Completions are proof that the device finished work: a ring that is given one retires
/// WRs (freeing their zero-copy buffers) or hands a receive slot to the caller. So safe
/// code cannot make one up: they come from a [`CqPoller`] (or the `unsafe`
/// [`from_raw`](Self::from_raw)), they are neither `Clone` nor `Copy`, and a receive ring
/// consumes the one it accepts, so the same completion cannot be given twice.
/// ```compile_fail,E0423
/// let forged = hotverbs_datapath::Completion(Default::default());
/// ```
#[repr(transparent)]
pub struct Completion(ibv_wc);

/// The `wr_id` of a consumed or placeholder completion: ring 255, receive bit set, slot
/// `u32::MAX` (no receive ring has that many slots), with `qp_num` 0 (no ring's QP).
const SPENT: u64 = u64::MAX;

impl Completion {
    /// An empty entry for a caller-owned [`CqPoller::poll_into`] array; no ring accepts it.
    pub const PLACEHOLDER: Completion = Completion(ibv_wc {
        wr_id: SPENT,
        status: IBV_WC_GENERAL_ERR,
        opcode: 0,
        vendor_err: 0,
        byte_len: 0,
        __bindgen_anon_1: ibv_wc__bindgen_ty_1 { imm_data: 0 },
        qp_num: 0,
        src_qp: 0,
        wc_flags: 0,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    });

    /// Wraps a work completion.
    ///
    /// # Safety
    /// `wc` was returned by `ibv_poll_cq(3)` (or the extended poll) for a WR posted by the
    /// ring it will be given to, and is given to rings only once: a ring trusts it to mean
    /// that the device is done with the WR's memory.
    #[inline(always)]
    pub const unsafe fn from_raw(wc: ibv_wc) -> Self {
        Completion(wc)
    }

    /// The raw `struct ibv_wc`.
    #[inline(always)]
    pub fn as_raw(&self) -> &ibv_wc {
        &self.0
    }

    /// The raw `struct ibv_wc`, for a poller in this crate to fill in place.
    #[inline(always)]
    pub(crate) fn raw_mut(&mut self) -> &mut ibv_wc {
        &mut self.0
    }

    /// Marks the completion consumed (a receive ring does this when it accepts it): no
    /// ring accepts it again.
    #[inline(always)]
    pub(crate) fn take(&mut self) {
        self.0.wr_id = SPENT;
        self.0.qp_num = 0;
    }

    /// How this completion, refused by ring `given_to` (a receive ring if `given_to_recv`)
    /// for its ring id, kind or QP, is misrouted; `None` for a spent one (consumed by the
    /// receive ring that accepted it, or a [`PLACEHOLDER`](Self::PLACEHOLDER)): that is
    /// nobody's work any more, so every ring takes it as stale.
    #[inline(always)]
    pub(crate) fn misrouted(&self, given_to: u8, given_to_recv: bool) -> Option<Misrouted> {
        if self.0.wr_id == SPENT && self.0.qp_num == 0 {
            return None;
        }
        Some(Misrouted::of(
            self.0.wr_id,
            self.0.qp_num,
            given_to,
            given_to_recv,
        ))
    }

    /// The raw `wr_id`.
    #[inline(always)]
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }
    /// The ring id part of `wr_id` (see [`crate::wr_id`]).
    #[inline(always)]
    pub fn ring(&self) -> u8 {
        wr_id::ring_of(self.0.wr_id)
    }
    /// The sequence / slot part of `wr_id`.
    #[inline(always)]
    pub fn seq(&self) -> u64 {
        wr_id::seq_of(self.0.wr_id)
    }
    /// `Ok` for `IBV_WC_SUCCESS`, else the named error. Success is one compare; the
    /// mapping of error statuses is out of line.
    #[inline(always)]
    pub fn status(&self) -> Result<(), WcError> {
        if self.0.status == IBV_WC_SUCCESS {
            Ok(())
        } else {
            status_error(self.0.status)
        }
    }
    /// `opcode` (`IBV_WC_SEND`, `IBV_WC_RECV`, ...; undefined for error completions).
    #[inline(always)]
    pub fn opcode(&self) -> ibv_wc_opcode {
        self.0.opcode
    }
    /// True for a successful receive completion: opcode exactly `IBV_WC_RECV` or
    /// `IBV_WC_RECV_RDMA_WITH_IMM`. Informational only: the opcode of an error completion
    /// is undefined (rxe reports 0, i.e. `IBV_WC_SEND`, for flushed receives), so dispatch
    /// completions to rings by [`ring`](Self::ring), never by opcode.
    #[inline(always)]
    pub fn is_recv(&self) -> bool {
        self.0.opcode == IBV_WC_RECV || self.0.opcode == IBV_WC_RECV_RDMA_WITH_IMM
    }
    /// `byte_len`.
    #[inline(always)]
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }
    /// The immediate data in host order, if the completion carries one.
    #[inline(always)]
    pub fn imm(&self) -> Option<u32> {
        if self.0.wc_flags & IBV_WC_WITH_IMM != 0 {
            // SAFETY: imm_data is the union member the provider fills when WITH_IMM is set;
            // both members are plain u32.
            Some(u32::from_be(unsafe { self.0.__bindgen_anon_1.imm_data }))
        } else {
            None
        }
    }
    /// `qp_num` of the local QP.
    #[inline(always)]
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }
    /// `src_qp` (UD / SRQ).
    #[inline(always)]
    pub fn src_qp(&self) -> u32 {
        self.0.src_qp
    }
    /// The `wqe_counter` of a send error completion from
    /// [`DirectPoller`](crate::DirectPoller) (which puts it in `pkey_index`, a field send
    /// completions do not define): where a [`DirectSession`](crate::DirectSession)'s WR
    /// whose `wrid` entry the fast path left unwritten is found again.
    #[inline(always)]
    pub(crate) fn sq_wqe_counter(&self) -> u16 {
        self.0.pkey_index
    }
}

/// What a send ring's `on_completion` (and the split-mode retirer's) returns for a
/// completion whose ring id, kind or QP is not the ring's: [`WcError::Misrouted`], or
/// `Ok(0)` for a spent one. Called from each ring's out-of-line `refuse`, which takes
/// only the ring and the completion: pointers the hot path holds anyway, so the cold exit
/// keeps no other value alive past the compare (of the variants measured with `cargo
/// xtask insn`, passing the ring id or building the error inline, this one disturbed the
/// inlined post loops least).
#[inline(always)]
pub(crate) fn refuse_send(c: &Completion, ring: u8) -> Result<u64, WcError> {
    match c.misrouted(ring, false) {
        None => Ok(0),
        // The `safe_api` fuzz target's planted bug (fuzz/README.md, "Planted bugs"): issue
        // 27's item 10 put back, a receive completion handed to a send ring answered
        // `Ok(0)` (its slot lost without a word). Only in a cargo-fuzz build (`fuzzing`)
        // with the feature on: no other build can enable it.
        #[cfg(all(fuzzing, feature = "fuzz-planted-item-10"))]
        Some(m) if m.recv() => Ok(0),
        Some(m) => Err(WcError::Misrouted(m)),
    }
}

/// [`Completion::status`] of a status other than `IBV_WC_SUCCESS`.
#[cold]
#[inline(never)]
fn status_error(status: ibv_wc_status) -> Result<(), WcError> {
    match WcError::from_status(status) {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

impl core::fmt::Debug for Completion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Completion")
            .field("ring", &self.ring())
            .field("seq", &self.seq())
            .field("status", &self.status())
            .field("opcode", &self.0.opcode)
            .field("byte_len", &self.0.byte_len)
            .finish()
    }
}

/// Polls one CQ, up to `B` completions per `ibv_poll_cq(3)` call.
///
/// # References
/// `ibv_poll_cq(3)`.
pub struct CqPoller<const B: usize> {
    cq: *mut ibv_cq,
    /// Completions a panicking [`drain`](Self::drain) closure left unhanded.
    rest: Rest,
    wcs: [Completion; B],
}

/// `wcs[lo..hi]` of a [`CqPoller`]: polled from the CQ, not yet handed to anyone. `hi == 0`
/// means none (the one compare a poll pays for it).
#[derive(Clone, Copy, Debug, Default)]
struct Rest {
    lo: usize,
    hi: usize,
}

/// Records how far a [`CqPoller::drain`] closure got: if it unwinds out of the closure,
/// the completions after the one it was handling stay in the poller for the next poll.
struct DrainGuard<'a> {
    rest: &'a mut Rest,
    /// The first completion not yet handed to the closure.
    next: usize,
    hi: usize,
}

impl Drop for DrainGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.next < self.hi {
            *self.rest = Rest {
                lo: self.next,
                hi: self.hi,
            };
        }
    }
}

// SAFETY: ibv_poll_cq may be called from any thread; `&mut self` makes this poller the CQ's
// only user on the Rust side, as the `new` contract requires.
unsafe impl<const B: usize> Send for CqPoller<B> {}

impl<const B: usize> core::fmt::Debug for CqPoller<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CqPoller")
            .field("cq", &self.cq)
            .field("batch", &B)
            .field("unhanded", &(self.rest.hi - self.rest.lo))
            .finish()
    }
}

impl<const B: usize> CqPoller<B> {
    const CHECK: () = assert!(B > 0 && B <= i32::MAX as usize, "CqPoller<B>: 0 < B");

    /// A poller of `cq`.
    ///
    /// # Safety
    /// `cq` is a live CQ that outlives the poller and is polled by no other thread at the
    /// same time.
    pub unsafe fn new(cq: *mut ibv_cq) -> Self {
        let () = Self::CHECK;
        Self {
            cq,
            rest: Rest::default(),
            wcs: [const { Completion::PLACEHOLDER }; B],
        }
    }

    /// One `ibv_poll_cq(cq, B, ..)`: the completions it returned (possibly none).
    ///
    /// If a [`drain`](Self::drain) closure panicked, the completions of its batch it was
    /// not handed yet come first: this poll returns them (and does not poll the CQ).
    #[inline]
    pub fn poll(&mut self) -> Result<&mut [Completion], PollError> {
        // Both ways end in a return code checked once, and one slice of `wcs`: the check of
        // `rest` is the only cost of the panic-safe `drain` here.
        let n = if self.rest.hi != 0 {
            self.take_rest()
        } else {
            self.poll_raw()
        };
        let n = Self::count(n)?;
        Ok(&mut self.wcs[..n])
    }

    /// `ibv_poll_cq(cq, B, wcs)`: how many completions it wrote to `wcs`.
    #[inline(always)]
    fn poll_cq(&mut self) -> Result<usize, PollError> {
        Self::count(self.poll_raw())
    }

    /// `ibv_poll_cq(cq, B, wcs)`'s return code.
    #[inline(always)]
    fn poll_raw(&mut self) -> i32 {
        // SAFETY: the CQ is live (new's contract) and `wcs` has room for B entries;
        // Completion is repr(transparent) over ibv_wc.
        unsafe { ibv_poll_cq(self.cq, B as i32, self.wcs.as_mut_ptr().cast()) }
    }

    /// `ibv_poll_cq`'s return code as a count of completions in `wcs`.
    #[inline(always)]
    fn count(n: i32) -> Result<usize, PollError> {
        // One unsigned compare for both rare cases, an error (negative) and more than B
        // (the provider returns at most B; clamped, so the compiler drops the bounds check).
        if n as u32 > B as u32 {
            return Self::poll_rc(n);
        }
        Ok(n as u32 as usize)
    }

    /// [`count`](Self::count) of a return code outside `0..=B`: the error, or `B`.
    #[cold]
    fn poll_rc(n: i32) -> Result<usize, PollError> {
        if n < 0 {
            Err(PollError { rc: n })
        } else {
            Ok(B)
        }
    }

    /// The completions a panicking [`drain`](Self::drain) closure was not handed, now
    /// handed out (out of line: only after a panic; not `#[inline(never)]`, which would let
    /// a downstream crate link an upstream copy whose unwinding it cannot see).
    #[cold]
    fn take_rest(&mut self) -> i32 {
        let Rest { lo, hi } = core::mem::take(&mut self.rest);
        // To the front of `wcs`, counted as a poll's return code: `poll` hands them out as
        // it does a fresh batch.
        self.wcs[..hi].rotate_left(lo);
        (hi - lo) as i32
    }

    /// One `ibv_poll_cq(cq, out.len(), out)` into a caller-owned array (e.g. one that
    /// outlives the borrow of the poller, or several pollers' results side by side);
    /// returns how many entries of `out` it filled (`out[..n]`; possibly 0). As for
    /// [`poll`](Self::poll), completions a panicking [`drain`](Self::drain) closure was
    /// not handed come first (moved into `out`, without polling the CQ).
    #[inline]
    pub fn poll_into(&mut self, out: &mut [Completion]) -> Result<usize, PollError> {
        if self.rest.hi != 0 {
            return Ok(self.move_rest_into(out));
        }
        let max = out.len().min(i32::MAX as usize);
        // SAFETY: the CQ is live (new's contract) and `out` has room for `max` entries;
        // Completion is repr(transparent) over ibv_wc, so the provider writes whole WCs.
        let n = unsafe { ibv_poll_cq(self.cq, max as i32, out.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(PollError { rc: n });
        }
        Ok((n as usize).min(max))
    }

    /// Polls until at least one completion arrives or `max_polls` empty polls went by,
    /// with `core::hint::spin_loop` between polls. Never blocks or sleeps.
    #[inline]
    pub fn poll_spin(&mut self, max_polls: u64) -> Result<&mut [Completion], PollError> {
        if self.rest.hi != 0 {
            let n = Self::count(self.take_rest())?;
            return Ok(&mut self.wcs[..n]);
        }
        let mut polls = 0u64;
        loop {
            let n = self.poll_cq()?;
            polls += 1;
            if n > 0 || polls >= max_polls {
                return Ok(&mut self.wcs[..n]);
            }
            spin_loop();
        }
    }

    /// Polls once and hands every completion to `f`; returns how many there were.
    ///
    /// # Panics in `f`
    /// If `f` panics, the completions of the batch it was not handed yet are not lost: they
    /// stay in the poller and the next [`poll`](Self::poll) (or `drain`, `poll_into`,
    /// `poll_spin`) returns them before it polls the CQ again. The completion `f` was
    /// handling when it panicked counts as handed (give a completion to its ring first,
    /// then do what may panic; a receive ring consumes the one it accepts either way).
    #[inline]
    pub fn drain<F: FnMut(&mut Completion)>(&mut self, mut f: F) -> Result<usize, PollError> {
        let (lo, hi) = if self.rest.hi != 0 {
            let Rest { lo, hi } = core::mem::take(&mut self.rest);
            (lo, hi)
        } else {
            (0, self.poll_cq()?)
        };
        let mut guard = DrainGuard {
            rest: &mut self.rest,
            next: lo,
            hi,
        };
        for c in &mut self.wcs[lo..hi] {
            guard.next += 1;
            f(c);
        }
        Ok(hi - lo)
    }

    /// Moves unhanded completions (see [`drain`](Self::drain)) into `out`; returns how
    /// many. Those that do not fit stay for the next poll.
    #[cold]
    #[inline(never)]
    fn move_rest_into(&mut self, out: &mut [Completion]) -> usize {
        let Rest { lo, hi } = self.rest;
        let k = out.len().min(hi - lo);
        for (o, w) in out.iter_mut().zip(&mut self.wcs[lo..lo + k]) {
            core::mem::swap(o, w);
        }
        self.rest = if lo + k < hi {
            Rest { lo: lo + k, hi }
        } else {
            Rest::default()
        };
        k
    }

    /// The CQ this poller drains.
    #[inline(always)]
    pub fn cq(&self) -> *mut ibv_cq {
        self.cq
    }
}
