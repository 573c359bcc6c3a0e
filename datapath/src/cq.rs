//! [`CqPoller`]: drains a CQ in bursts, into an array it owns ([`CqPoller::poll`]) or one
//! the caller owns ([`CqPoller::poll_into`]); [`Completion`] reads a WC.
//!
//! # Invariants (this module owns a raw CQ pointer)
//! `wcs[..n]` is initialised by the provider for the `n` that `ibv_poll_cq(3)` returned;
//! only that prefix is ever exposed.

use core::hint::spin_loop;

use hotverbs_ffi::inline::ibv_poll_cq;
use hotverbs_ffi::*;

use crate::error::{PollError, WcError};
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
    wcs: [Completion; B],
}

// SAFETY: ibv_poll_cq may be called from any thread; `&mut self` makes this poller the CQ's
// only user on the Rust side, as the `new` contract requires.
unsafe impl<const B: usize> Send for CqPoller<B> {}

impl<const B: usize> core::fmt::Debug for CqPoller<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CqPoller")
            .field("cq", &self.cq)
            .field("batch", &B)
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
            wcs: [const { Completion::PLACEHOLDER }; B],
        }
    }

    /// One `ibv_poll_cq(cq, B, ..)`: the completions it returned (possibly none).
    #[inline]
    pub fn poll(&mut self) -> Result<&mut [Completion], PollError> {
        // SAFETY: the CQ is live (new's contract) and `wcs` has room for B entries;
        // Completion is repr(transparent) over ibv_wc.
        let n = unsafe { ibv_poll_cq(self.cq, B as i32, self.wcs.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(PollError { rc: n });
        }
        // The provider returns at most B; min() lets the compiler drop the bounds check.
        Ok(&mut self.wcs[..(n as usize).min(B)])
    }

    /// One `ibv_poll_cq(cq, out.len(), out)` into a caller-owned array (e.g. one that
    /// outlives the borrow of the poller, or several pollers' results side by side);
    /// returns how many entries of `out` it filled (`out[..n]`; possibly 0).
    #[inline]
    pub fn poll_into(&mut self, out: &mut [Completion]) -> Result<usize, PollError> {
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
        let mut polls = 0u64;
        loop {
            // SAFETY: as in `poll`.
            let n = unsafe { ibv_poll_cq(self.cq, B as i32, self.wcs.as_mut_ptr().cast()) };
            if n < 0 {
                return Err(PollError { rc: n });
            }
            polls += 1;
            if n > 0 || polls >= max_polls {
                return Ok(&mut self.wcs[..(n as usize).min(B)]);
            }
            spin_loop();
        }
    }

    /// Polls once and hands every completion to `f`; returns how many there were.
    #[inline]
    pub fn drain<F: FnMut(&mut Completion)>(&mut self, mut f: F) -> Result<usize, PollError> {
        let batch = self.poll()?;
        let n = batch.len();
        for c in batch {
            f(c);
        }
        Ok(n)
    }

    /// The CQ this poller drains.
    #[inline(always)]
    pub fn cq(&self) -> *mut ibv_cq {
        self.cq
    }
}
