//! The safe bridge from setup objects to the datapath: rings and pollers built from a
//! [`Qp`] and a [`Cq`], with no `unsafe` in user code for inline sends, receives and polling.
//!
//! The datapath crate takes raw `*mut ibv_qp` / `*mut ibv_cq` (it is `no_std` and knows no
//! setup types), so its constructors are `unsafe` with contracts about lifetimes and
//! exclusivity. This module meets those contracts by construction:
//! - **Lifetimes**: [`SendRing<'q, N>`], [`RecvRing<'q, N>`] and [`CqPoller<'c, B>`] borrow
//!   the `Qp` / `Cq` (and the receive region, and a UD ring's [`Ah`]) they were built on, so
//!   none can outlive them.
//!   ```compile_fail,E0505
//!   # use hotverbs::{Context, QpBuilder, QpType, SendConfig};
//!   # let ctx = Context::open("softnic").unwrap();
//!   # let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(64, None).unwrap());
//!   let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).max_inline_data(64).build().unwrap();
//!   let ring = qp.send_ring::<16>(SendConfig::new(0, 16, 64)).unwrap();
//!   drop(qp); // the ring borrows it
//!   drop(ring);
//!   ```
//! - **One ring per queue**: a `Qp` hands out its send queue once and its receive queue
//!   once, for its whole life (a second ring would post into the same slots; a new ring
//!   after a dropped one would take the old ring's late completions for its own). A `Cq`
//!   has at most one [`CqPoller`] at a time, and [`Cq::poll`] refuses while it exists.
//! - **Completions cannot be lost to an overflow**: every ring reserves its worst case of
//!   completions (a send ring `depth` — every outstanding WR flushes with its own
//!   completion after an error; a receive ring its slot count) from its CQ's capacity, and
//!   a ring that does not fit is refused (`ENOSPC`): rxe drops completions silently when a
//!   CQ overflows (fault-truth S15), and a ring waiting for a dropped completion waits
//!   forever. Reservations are released when the QP is destroyed (its completions can
//!   arrive until then).
//! - **Ring ids**: assigned per CQ by the CQ (the id in `SendConfig`/`RecvConfig` is
//!   replaced), so rings sharing a CQ never share an id.
//! - **Receive regions**: leased to the QP ([`Qp::lease_recv`]), owned memory
//!   (`Mr<'static>`, so a leaked registration can never outlive its memory), borrowed by
//!   the ring.
//!
//! Zero-copy sends stay `unsafe` ([`hotverbs_datapath::SendRing::stage`]): the buffer must
//! not be touched until its WR is retired, which no type can express cheaply.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use hotverbs_datapath as dp;
use hotverbs_datapath::{
    ExFields, LocalBuf, RecvConfig, RecvTarget, RemoteBuf, SendConfig, UdDest,
};

use crate::ah::Ah;
use crate::cq::Cq;
use crate::error::{Error, Result};
use crate::mr::{Mr, RemoteMr, Sge};
use crate::qp::{Qp, QpType, SendOps};

/// An mlx5 CQ's doorbell record, CQ UAR page and number (`struct mlx5dv_cq`), for arming
/// it without libmlx5 (`hotverbs_datapath::mlx5::arm_cq`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DirectArm {
    pub(crate) dbrec: *mut u32,
    pub(crate) uar: *mut u8,
    pub(crate) cqn: u32,
}

// SAFETY: addresses of the CQ's doorbell record and UAR page, which live as long as the CQ
// (and so as the `CqRings` holding them); only `arm_cq` uses them, with volatile stores.
unsafe impl Send for DirectArm {}
// SAFETY: as above.
unsafe impl Sync for DirectArm {}

/// Per-CQ bookkeeping of the bridge: ring ids in use, completions reserved, the poller.
#[derive(Debug, Default)]
pub(crate) struct CqRings {
    state: Mutex<RingState>,
    poller: AtomicBool,
    /// A direct poller polled the CQ (`Cq::direct_poller`): libmlx5 must not poll it again
    /// (see `crate::direct`). Never cleared.
    direct: AtomicBool,
    /// What arming such a CQ takes (`Cq::req_notify`), set with `direct`.
    arm: std::sync::OnceLock<DirectArm>,
    /// QP numbers of destroyed QPs whose CQEs the direct poller is to clean, and whether
    /// there are any (one load per `DirectPoller::poll`).
    to_clean: Mutex<Vec<u32>>,
    clean_due: AtomicBool,
    /// The CQ is a softnic mlx5 personality's: `clean_due` stays set, so that every direct
    /// poll runs the simulated device first (`crate::direct`).
    sim: AtomicBool,
    /// `wrid` tables of the direct rings completing on this CQ (`crate::direct`): owned
    /// by the CQ so a direct poller never reads a freed one.
    wrid_tables: Mutex<Vec<Box<[u64]>>>,
}

#[derive(Debug, Default)]
struct RingState {
    /// Bit `i` set: ring id `i` is in use on this CQ.
    ids: [u64; 4],
    /// Completions reserved by rings.
    reserved: u64,
}

impl CqRings {
    /// A [`CqPoller`] exists.
    pub(crate) fn poller_taken(&self) -> bool {
        self.poller.load(Ordering::Acquire)
    }

    /// Allocates a ring id and reserves `n` completions of `capacity`.
    fn reserve(&self, what: &'static str, capacity: u32, n: u32) -> Result<u8> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.reserved + u64::from(n) > u64::from(capacity) {
            return Err(Error::new(what, libc::ENOSPC).with_hint(format!(
                "the CQ holds {capacity} completions and its rings already reserve {}: a ring \
                 of {n} more could overflow it (rxe then drops completions silently); create \
                 the CQ larger or the ring smaller",
                st.reserved
            )));
        }
        let Some(id) = (0..256u32).find(|&i| st.ids[(i / 64) as usize] & (1 << (i % 64)) == 0)
        else {
            return Err(Error::new(what, libc::ENOSPC)
                .with_hint("256 rings already complete on this CQ (one ring id each)"));
        };
        st.ids[(id / 64) as usize] |= 1 << (id % 64);
        st.reserved += u64::from(n);
        Ok(id as u8)
    }

    /// Marks the CQ as the mlx5 direct path's for good; `arm` is how to arm it.
    pub(crate) fn mark_direct(&self, arm: DirectArm) {
        let _ = self.arm.set(arm);
        self.direct.store(true, Ordering::Release);
    }

    /// A QP with a direct ring on this CQ was destroyed: its CQEs still in the CQ are to be
    /// cleaned by the direct poller, in its own thread, at its next poll or attach.
    pub(crate) fn defer_clean(&self, qpn: u32) {
        self.to_clean
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(qpn);
        self.clean_due.store(true, Ordering::Release);
    }

    /// True when destroyed QPs wait for [`take_clean`](Self::take_clean).
    #[inline(always)]
    pub(crate) fn clean_due(&self) -> bool {
        self.clean_due.load(Ordering::Acquire)
    }

    /// The QP numbers waiting to be cleaned (emptied).
    pub(crate) fn take_clean(&self) -> Vec<u32> {
        self.clean_due
            .store(self.sim.load(Ordering::Relaxed), Ordering::Release);
        std::mem::take(&mut *self.to_clean.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The CQ is simulated (softnic's mlx5 personality): every direct poll takes the
    /// cold path that runs the device.
    pub(crate) fn mark_sim(&self) {
        self.sim.store(true, Ordering::Relaxed);
        self.clean_due.store(true, Ordering::Release);
    }

    /// [`mark_sim`](Self::mark_sim) was called.
    pub(crate) fn is_sim(&self) -> bool {
        self.sim.load(Ordering::Relaxed)
    }

    /// How to arm the CQ if it is the direct path's.
    pub(crate) fn direct_arm(&self) -> Option<&DirectArm> {
        self.arm.get()
    }

    /// `Err` naming `verb` if the CQ is the direct path's: libmlx5 must not poll it.
    pub(crate) fn refuse_if_direct(&self, verb: &'static str) -> Result<()> {
        if self.direct.load(Ordering::Acquire) {
            return Err(Error::new(verb, libc::EBUSY).with_hint(
                "this CQ was handed to the mlx5 direct path (a direct poller over \
                 mlx5dv_init_obj): libmlx5 no longer follows its consumer index and would \
                 report consumed completions again, so it is polled only by a direct poller \
                 for the rest of its life (Cq::direct_poller)",
            ));
        }
        Ok(())
    }

    /// Takes the CQ's one poller slot; true if it was already taken.
    pub(crate) fn take_poller(&self) -> bool {
        self.poller.swap(true, Ordering::AcqRel)
    }

    /// Frees the poller slot.
    pub(crate) fn release_poller(&self) {
        self.poller.store(false, Ordering::Release);
    }

    /// A zeroed `wrid` table of `n` entries owned by the CQ (freed with it).
    pub(crate) fn wrid_table(&self, n: usize) -> *mut u64 {
        let mut t = vec![0u64; n].into_boxed_slice();
        let p = t.as_mut_ptr();
        self.wrid_tables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(t);
        p
    }

    /// Gives back a ring id and its reserved completions (a ring that was not built).
    pub(crate) fn release_ring(&self, id: u8, n: u32) {
        self.release(id, n);
    }

    fn release(&self, id: u8, n: u32) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.ids[usize::from(id / 64)] &= !(1 << (id % 64));
        st.reserved -= u64::from(n);
    }
}

/// A ring's claim on a CQ (its id and reserved completions), held by the QP until it is
/// destroyed.
#[derive(Debug)]
pub(crate) struct RingReservation {
    cq: Cq,
    id: u8,
    n: u32,
    /// A direct ring's QP number: its CQEs still in the CQ are cleaned by the CQ's direct
    /// poller once the QP is destroyed (libmlx5 skips that clean on such a CQ).
    clean_qpn: Option<u32>,
}

impl RingReservation {
    /// A direct ring's claim: on release (the QP destroyed), its QP's CQEs still in the
    /// CQ are handed to the direct poller to clean.
    pub(crate) fn direct(cq: Cq, id: u8, n: u32, qpn: u32) -> Self {
        RingReservation {
            cq,
            id,
            n,
            clean_qpn: Some(qpn),
        }
    }

    pub(crate) fn release(self) {
        if let Some(q) = self.clean_qpn {
            self.cq.inner.rings.defer_clean(q);
        }
        self.cq.inner.rings.release(self.id, self.n);
    }
}

fn config_error(verb: &'static str, e: dp::ConfigError) -> Error {
    Error::new(verb, libc::EINVAL).with_hint(e.to_string())
}

/// A [`hotverbs_datapath::SendRing`] on a [`Qp`]'s send queue, borrowing the QP; made by
/// [`Qp::send_ring`] / [`Qp::send_ring_ud`]. Derefs to the datapath ring: its whole API
/// (`send_now`, `batch`, `on_completion`, `split`, ...) is available.
pub struct SendRing<'q, const N: usize> {
    ring: dp::SendRing<N>,
    _qp: PhantomData<&'q Qp>,
}

impl<const N: usize> Deref for SendRing<'_, N> {
    type Target = dp::SendRing<N>;
    fn deref(&self) -> &dp::SendRing<N> {
        &self.ring
    }
}

impl<const N: usize> DerefMut for SendRing<'_, N> {
    fn deref_mut(&mut self) -> &mut dp::SendRing<N> {
        &mut self.ring
    }
}

impl<const N: usize> std::fmt::Debug for SendRing<'_, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendRing")
            .field("ring_id", &self.ring.ring_id())
            .field("depth", &self.ring.depth())
            .field("outstanding", &self.ring.outstanding())
            .field("staged", &self.ring.staged())
            .field("error", &self.ring.error())
            .finish()
    }
}

/// A [`hotverbs_datapath::RecvRing`] on a [`Qp`]'s receive queue over a leased region;
/// made by [`Qp::recv_ring`]. Derefs to the datapath ring.
pub struct RecvRing<'q, const N: usize> {
    ring: dp::RecvRing<N>,
    _qp: PhantomData<(&'q Qp, &'q Mr<'static>)>,
}

impl<const N: usize> Deref for RecvRing<'_, N> {
    type Target = dp::RecvRing<N>;
    fn deref(&self) -> &dp::RecvRing<N> {
        &self.ring
    }
}

impl<const N: usize> DerefMut for RecvRing<'_, N> {
    fn deref_mut(&mut self) -> &mut dp::RecvRing<N> {
        &mut self.ring
    }
}

impl<const N: usize> std::fmt::Debug for RecvRing<'_, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvRing")
            .field("ring_id", &self.ring.ring_id())
            .field("posted", &self.ring.posted())
            .field("held", &self.ring.held())
            .field("pending", &self.ring.pending())
            .finish()
    }
}

/// A [`hotverbs_datapath::CqPoller`] on a [`Cq`], borrowing it; made by [`Cq::poller`].
/// While it exists it is the CQ's only poller. Derefs to the datapath poller.
pub struct CqPoller<'c, const B: usize> {
    poller: dp::CqPoller<B>,
    cq: &'c Cq,
}

impl<const B: usize> Deref for CqPoller<'_, B> {
    type Target = dp::CqPoller<B>;
    fn deref(&self) -> &dp::CqPoller<B> {
        &self.poller
    }
}

impl<const B: usize> DerefMut for CqPoller<'_, B> {
    fn deref_mut(&mut self) -> &mut dp::CqPoller<B> {
        &mut self.poller
    }
}

impl<const B: usize> Drop for CqPoller<'_, B> {
    fn drop(&mut self) {
        // Release: pairs with the Acquire in Cq::poller / poller_taken.
        self.cq.inner.rings.poller.store(false, Ordering::Release);
    }
}

impl<const B: usize> std::fmt::Debug for CqPoller<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqPoller")
            .field("cq", &self.cq.as_raw())
            .field("batch", &B)
            .finish()
    }
}

/// A [`hotverbs_datapath::WrRing`] on an extended [`Qp`]'s send queue (posting through
/// `ibv_wr_start` / `ibv_wr_*` / `ibv_wr_complete`), borrowing the QP; made by
/// [`Qp::wr_ring`] / [`Qp::wr_ring_ud`]. Derefs to the datapath ring. It takes the send
/// queue exactly as a [`SendRing`] does: a QP has one ring of either kind.
pub struct WrRing<'q> {
    ring: dp::WrRing,
    _qp: PhantomData<&'q Qp>,
}

impl Deref for WrRing<'_> {
    type Target = dp::WrRing;
    fn deref(&self) -> &dp::WrRing {
        &self.ring
    }
}

impl DerefMut for WrRing<'_> {
    fn deref_mut(&mut self) -> &mut dp::WrRing {
        &mut self.ring
    }
}

impl std::fmt::Debug for WrRing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WrRing").field("ring", &self.ring).finish()
    }
}

/// A [`hotverbs_datapath::ExCqPoller`] on an extended [`Cq`], borrowing it; made by
/// [`Cq::ex_poller`]. While it exists it is the CQ's only poller (as a [`CqPoller`]).
/// Derefs to the datapath poller (`poll`, `poll_ts`).
pub struct ExCqPoller<'c, const B: usize> {
    poller: dp::ExCqPoller<B>,
    cq: &'c Cq,
}

impl<const B: usize> Deref for ExCqPoller<'_, B> {
    type Target = dp::ExCqPoller<B>;
    fn deref(&self) -> &dp::ExCqPoller<B> {
        &self.poller
    }
}

impl<const B: usize> DerefMut for ExCqPoller<'_, B> {
    fn deref_mut(&mut self) -> &mut dp::ExCqPoller<B> {
        &mut self.poller
    }
}

impl<const B: usize> Drop for ExCqPoller<'_, B> {
    fn drop(&mut self) {
        // Release: pairs with the Acquire in Cq::poller / Cq::ex_poller / poller_taken.
        self.cq.inner.rings.poller.store(false, Ordering::Release);
    }
}

impl<const B: usize> std::fmt::Debug for ExCqPoller<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExCqPoller")
            .field("cq", &self.cq.as_raw())
            .field("poller", &self.poller)
            .finish()
    }
}

/// The names of the [`ExFields`] in `f` that are completion fields (`wc_flags` bits).
fn ex_field_names(f: u64) -> String {
    let names: Vec<&str> = [
        (ExFields::BYTE_LEN, "BYTE_LEN"),
        (ExFields::IMM, "IMM"),
        (ExFields::QP_NUM, "QP_NUM"),
        (ExFields::SRC_QP, "SRC_QP"),
        (ExFields::SLID, "SLID"),
        (ExFields::SL, "SL"),
        (ExFields::COMPLETION_TS, "COMPLETION_TS"),
    ]
    .into_iter()
    .filter(|(x, _)| f & x.wc_flags() != 0)
    .map(|(_, n)| n)
    .collect();
    names.join(" | ")
}

impl Cq {
    /// The extended CQ's datapath poller (`B` completions per poll, reading `fields`),
    /// borrowing the CQ. One poller at a time, as [`poller`](Self::poller). On a device
    /// where batched extended polling is unsafe
    /// ([`Context::ex_cq_batch_poll_safe`](crate::Context::ex_cq_batch_poll_safe) false:
    /// rxe) the poller reads one completion per `ibv_start_poll` .. `ibv_end_poll` and
    /// never calls `ibv_next_poll` ([`hotverbs_datapath::ExCqPoller::one_per_poll`]).
    ///
    /// Rings check each completion's `qp_num` (and a receive ring its `byte_len`): ask for
    /// [`ExFields::QP_NUM`] (and [`ExFields::BYTE_LEN`]) when rings take this poller's
    /// completions; without `QP_NUM` every completion reads `qp_num` 0.
    ///
    /// # Errors
    /// `ExCqPoller: EINVAL` for a CQ from `ibv_create_cq` (build it with
    /// [`CqBuilder::wc_fields`](crate::CqBuilder::wc_fields)) or a field the CQ was not
    /// created with (named); `EBUSY` when a poller exists or the CQ was handed to the mlx5
    /// direct path.
    pub fn ex_poller<const B: usize>(&self, fields: ExFields) -> Result<ExCqPoller<'_, B>> {
        const VERB: &str = "ExCqPoller";
        let Some(cqx) = self.as_cq_ex() else {
            return Err(Error::new(VERB, libc::EINVAL).with_hint(
                "not an extended CQ: build it with CqBuilder::wc_fields (ibv_create_cq_ex)",
            ));
        };
        let have = self.wc_fields().bits();
        let missing = fields.wc_flags() & !have;
        if missing != 0 {
            return Err(Error::new(VERB, libc::EINVAL).with_hint(format!(
                "the CQ was not created with ExFields::{}: add the matching WcFields to \
                 CqBuilder::wc_fields (the CQ has {:?})",
                ex_field_names(missing),
                self.wc_fields()
            )));
        }
        let one_per_poll = !self.context().ex_cq_batch_poll_safe()?;
        self.inner.rings.refuse_if_direct(VERB)?;
        if self.inner.rings.poller.swap(true, Ordering::AcqRel) {
            return Err(Error::new(VERB, libc::EBUSY)
                .with_hint("this CQ already has a poller (one per CQ): use it, or drop it first"));
        }
        // SAFETY: a live extended CQ created with exactly `wc_fields()` (the CQ records
        // them), borrowed for the poller's life; the flag just taken makes this its only
        // poller (a second one and Cq::poll are refused).
        match unsafe { dp::ExCqPoller::new(cqx, fields, have) } {
            Ok(p) => Ok(ExCqPoller {
                poller: p.one_per_poll(one_per_poll),
                cq: self,
            }),
            Err(e) => {
                self.inner.rings.poller.store(false, Ordering::Release);
                Err(config_error(VERB, e))
            }
        }
    }

    /// Completions the rings built on this CQ have reserved ([`Qp::send_ring`],
    /// [`Qp::recv_ring`]): what is left of [`capacity`](Cq::capacity) is all that
    /// completions of raw posts ([`Qp::post_send`], [`Qp::post_recv`], the datapath's raw
    /// constructors) may use at any one time. Raw posts are not reserved: more of them
    /// overflow the CQ, and rxe then drops completions silently (fault-truth S15), so a ring
    /// on the same CQ may wait for one for ever — a [`Watchdog`](crate::Watchdog) on its
    /// progress detects that.
    pub fn reserved_by_rings(&self) -> u64 {
        self.inner
            .rings
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .reserved
    }

    /// The CQ's datapath poller (`B` completions per `ibv_poll_cq`), borrowing the CQ. One
    /// at a time: while it exists, a second poller and [`Cq::poll`] are refused (`EBUSY`).
    ///
    /// # Errors
    /// `CqPoller: EBUSY` when a poller exists, or when the CQ was handed to the mlx5 direct
    /// path ([`Cq::direct_poller`](crate::Cq::direct_poller)).
    pub fn poller<const B: usize>(&self) -> Result<CqPoller<'_, B>> {
        self.inner.rings.refuse_if_direct("CqPoller")?;
        if self.inner.rings.poller.swap(true, Ordering::AcqRel) {
            return Err(Error::new("CqPoller", libc::EBUSY)
                .with_hint("this CQ already has a poller (one per CQ): use it, or drop it first"));
        }
        // SAFETY: the CQ lives as long as the borrow the poller holds; the flag just taken
        // makes this the CQ's only poller (a second one and Cq::poll are refused).
        let poller = unsafe { dp::CqPoller::new(self.as_raw()) };
        Ok(CqPoller { poller, cq: self })
    }
}

impl Qp {
    /// Takes the send queue for a ring and reserves its completions on the send CQ.
    pub(crate) fn claim_send_queue(&self, verb: &'static str, depth: u32) -> Result<u8> {
        if self.sq_sig_all() {
            return Err(Error::new(verb, libc::EINVAL).with_hint(
                "the QP was built with sq_sig_all: rings signal selectively (sq_sig_all(false))",
            ));
        }
        let cap = self.cap();
        if depth > cap.max_send_wr {
            return Err(Error::new(verb, libc::EINVAL).with_hint(format!(
                "ring depth {depth} > the QP's max_send_wr {}",
                cap.max_send_wr
            )));
        }
        if self.sq_taken().swap(true, Ordering::AcqRel) {
            return Err(Error::new(verb, libc::EBUSY).with_hint(
                "this QP's send queue already has its ring (one ring per send queue, for the \
                 QP's life)",
            ));
        }
        let cq = self.send_cq();
        match cq.inner.rings.reserve(verb, cq.capacity(), depth) {
            Ok(id) => Ok(id),
            Err(e) => {
                self.sq_taken().store(false, Ordering::Release);
                Err(e)
            }
        }
    }

    fn finish_send_ring<const N: usize>(
        &self,
        verb: &'static str,
        id: u8,
        cfg: SendConfig,
    ) -> Result<dp::SendRing<N>> {
        let depth = cfg.depth_of();
        // SAFETY: the QP outlives the ring (the bridge type borrows it); its send queue is
        // this ring's alone (claim_send_queue); it was built without sq_sig_all, with
        // max_send_wr >= depth (checked) and max_inline_data >= the ring's (checked by the
        // callers); completions come only from CqPoller (unforgeable); the ring id is unique
        // on the CQ (allocated by it); a UD ring's AH is borrowed for the ring's life.
        match unsafe { dp::SendRing::new(self.as_raw(), cfg.with_ring_id(id)) } {
            Ok(r) => {
                self.keep_reservation(RingReservation {
                    cq: self.send_cq().clone(),
                    id,
                    n: depth,
                    clean_qpn: None,
                });
                Ok(r)
            }
            Err(e) => {
                self.send_cq().inner.rings.release(id, depth);
                self.sq_taken().store(false, Ordering::Release);
                Err(config_error(verb, e))
            }
        }
    }

    fn check_inline(&self, verb: &'static str, cfg: &SendConfig) -> Result<()> {
        let max = self.cap().max_inline_data;
        if cfg.max_inline_of() > max {
            return Err(Error::new(verb, libc::EINVAL).with_hint(format!(
                "ring max_inline {} > the QP's max_inline_data {max} (QpBuilder::max_inline_data)",
                cfg.max_inline_of()
            )));
        }
        Ok(())
    }

    /// A send ring on this QP's send queue (RC/UC), borrowing the QP. The QP's send queue is
    /// handed out once, for its life; the ring's `depth` completions are reserved on the
    /// send CQ; the ring id in `cfg` is replaced by one the CQ assigns.
    ///
    /// # Example
    /// ```
    /// use hotverbs::{ConnectOptions, Context, Local, Msg, Qp, QpBuilder, QpType, SendConfig};
    /// let ctx = Context::open("softnic")?;
    /// let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(64, None)?);
    /// let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).max_inline_data(64).build()?;
    /// let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
    /// Qp::connect_pair(&a, &b, &ctx.port_info(None, None)?, &ConnectOptions::default())?;
    /// let mut ring = a.send_ring::<16>(SendConfig::new(0, 16, 64).signal_every(1))?;
    /// let mut poller = cq.poller::<8>()?;
    /// let region = pd.alloc_mr(256, hotverbs::AccessFlags::LOCAL_WRITE)?;
    /// let mut rb = b.recv_ring::<4>(&region, 0, hotverbs::RecvConfig::new(0, 64, 4))?;
    /// rb.fill()?;
    /// ring.send_now(Msg::send(Local::Inline(b"hi")))?;
    /// let mut got = 0;
    /// while got < 2 {
    ///     for c in poller.poll()? {
    ///         if c.ring() == ring.ring_id() {
    ///             ring.on_completion(c)?; // ring ids are assigned per CQ: never the same
    ///         } else {
    ///             let m = rb.on_completion(c)?;
    ///             assert_eq!(rb.data(&m)?, b"hi");
    ///             rb.release(m)?;
    ///         }
    ///         got += 1;
    ///     }
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `SendRing: EBUSY` when the send queue already has a ring; `EINVAL` for a UD QP (use
    /// [`send_ring_ud`](Self::send_ring_ud)), a QP built with `sq_sig_all`, a depth above
    /// `max_send_wr` or an inline limit above `max_inline_data`, or a configuration the
    /// ring refuses; `ENOSPC` when the send CQ cannot take the ring's completions.
    pub fn send_ring<const N: usize>(&self, cfg: SendConfig) -> Result<SendRing<'_, N>> {
        const VERB: &str = "SendRing";
        if self.qp_type() == QpType::Ud || cfg.ud_dest().is_some() {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("UD rings take their address handle: use Qp::send_ring_ud"));
        }
        self.check_inline(VERB, &cfg)?;
        let id = self.claim_send_queue(VERB, cfg.depth_of())?;
        Ok(SendRing {
            ring: self.finish_send_ring(VERB, id, cfg)?,
            _qp: PhantomData,
        })
    }

    /// A send ring on this UD QP sending to `ah` / `remote_qpn` / `qkey` (borrowing the AH
    /// as long as the ring lives); otherwise as [`send_ring`](Self::send_ring).
    ///
    /// # Errors
    /// As `send_ring`, and `EINVAL` when the QP is not UD or the AH is of another PD.
    pub fn send_ring_ud<'q, const N: usize>(
        &'q self,
        ah: &'q Ah,
        remote_qpn: u32,
        qkey: u32,
        cfg: SendConfig,
    ) -> Result<SendRing<'q, N>> {
        const VERB: &str = "SendRing";
        if self.qp_type() != QpType::Ud {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("send_ring_ud is for UD QPs: use Qp::send_ring"));
        }
        // A parent domain and its protection domain are one scope (`protection_raw`).
        if ah.pd().protection_raw() != self.pd().protection_raw() {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("the address handle belongs to another PD than the QP"));
        }
        self.check_inline(VERB, &cfg)?;
        let cfg = cfg.ud(UdDest {
            ah: ah.as_raw(),
            remote_qpn,
            remote_qkey: qkey,
        });
        let id = self.claim_send_queue(VERB, cfg.depth_of())?;
        Ok(SendRing {
            ring: self.finish_send_ring(VERB, id, cfg)?,
            _qp: PhantomData,
        })
    }

    fn check_ex(
        &self,
        verb: &'static str,
        cfg: &SendConfig,
    ) -> Result<*mut hotverbs_ffi::ibv_qp_ex> {
        let Some(qpx) = self.as_qp_ex() else {
            return Err(Error::new(verb, libc::EINVAL)
                .with_hint("not an extended QP: build it with QpBuilder::send_ops"));
        };
        let ops = self.send_ops();
        if !ops.intersects(
            SendOps::SEND
                | SendOps::SEND_WITH_IMM
                | SendOps::RDMA_WRITE
                | SendOps::RDMA_WRITE_WITH_IMM
                | SendOps::RDMA_READ
                | SendOps::ATOMIC_CMP_AND_SWP
                | SendOps::ATOMIC_FETCH_AND_ADD,
        ) {
            return Err(Error::new(verb, libc::EINVAL).with_hint(format!(
                "the QP's send_ops {ops:?} hold no operation a WrRing posts (SEND, \
                 SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ, atomics)"
            )));
        }
        self.check_inline(verb, cfg)?;
        Ok(qpx)
    }

    fn finish_wr_ring(
        &self,
        verb: &'static str,
        qpx: *mut hotverbs_ffi::ibv_qp_ex,
        id: u8,
        cfg: SendConfig,
    ) -> Result<WrRing<'_>> {
        let depth = cfg.depth_of();
        // SAFETY: an extended QP of this Qp (as_qp_ex) that outlives the ring (the bridge
        // type borrows the Qp); its send queue is this ring's alone (claim_send_queue: no
        // SendRing, no second WrRing); built without sq_sig_all, with max_send_wr >= depth
        // and max_inline_data >= the ring's (checked); completions come only from the
        // bridge's pollers (unforgeable); the ring id is unique on the CQ (allocated by
        // it); a UD ring's AH is borrowed for the ring's life.
        match unsafe { dp::WrRing::new(qpx, cfg.with_ring_id(id)) } {
            Ok(ring) => {
                self.keep_reservation(RingReservation {
                    cq: self.send_cq().clone(),
                    id,
                    n: depth,
                    clean_qpn: None,
                });
                Ok(WrRing {
                    ring,
                    _qp: PhantomData,
                })
            }
            Err(e) => {
                self.send_cq().inner.rings.release(id, depth);
                self.sq_taken().store(false, Ordering::Release);
                Err(config_error(verb, e))
            }
        }
    }

    /// A [`WrRing`] (`ibv_wr_*` posting) on this extended QP's send queue (RC/UC),
    /// borrowing the QP; otherwise as [`send_ring`](Self::send_ring): the send queue is
    /// handed out once (to a `SendRing` or a `WrRing`), `depth` completions are reserved
    /// on the send CQ, the ring id is assigned by the CQ. Opcodes outside the QP's
    /// [`send_ops`](Self::send_ops) are refused per message (`OpNotEnabled`).
    ///
    /// # Example
    /// ```
    /// use hotverbs::{
    ///     ConnectOptions, Context, CqBuilder, ExFields, Local, Msg, Qp, QpBuilder, QpType,
    ///     SendConfig, SendOps, WcFields,
    /// };
    /// let ctx = Context::open("softnic")?;
    /// let pd = ctx.alloc_pd()?;
    /// let fields = WcFields::BYTE_LEN | WcFields::QP_NUM;
    /// let cq = CqBuilder::new(&ctx, 64).wc_fields(fields).build()?;
    /// let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
    ///     .send_ops(SendOps::SEND)
    ///     .max_inline_data(64)
    ///     .build()?;
    /// let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
    /// Qp::connect_pair(&a, &b, &ctx.port_info(None, None)?, &ConnectOptions::default())?;
    /// let mut ring = a.wr_ring(SendConfig::new(0, 16, 64).signal_every(1))?;
    /// // Rings check each completion's qp_num: read it (and byte_len for receives).
    /// let mut poller = cq.ex_poller::<8>(ExFields::BYTE_LEN | ExFields::QP_NUM)?;
    /// let region = pd.alloc_mr(256, hotverbs::AccessFlags::LOCAL_WRITE)?;
    /// let mut rb = b.recv_ring::<4>(&region, 0, hotverbs::RecvConfig::new(0, 64, 4))?;
    /// rb.fill()?;
    /// ring.send_now(Msg::send(Local::Inline(b"hi")))?;
    /// let mut got = 0;
    /// while got < 2 {
    ///     for c in poller.poll()? {
    ///         if c.ring() == ring.ring_id() {
    ///             ring.on_completion(c)?;
    ///         } else {
    ///             let m = rb.on_completion(c)?;
    ///             assert_eq!(rb.data(&m)?, b"hi");
    ///             rb.release(m)?;
    ///         }
    ///         got += 1;
    ///     }
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `WrRing: EINVAL` for a QP from `ibv_create_qp` ("not an extended QP: build it with
    /// QpBuilder::send_ops"), send_ops with no operation a ring posts, a UD QP (use
    /// [`wr_ring_ud`](Self::wr_ring_ud)), and the errors of `send_ring`: `EBUSY` when the
    /// send queue already has a ring (of either kind), `ENOSPC` when the send CQ cannot
    /// take the ring's completions.
    pub fn wr_ring(&self, cfg: SendConfig) -> Result<WrRing<'_>> {
        const VERB: &str = "WrRing";
        let qpx = self.check_ex(VERB, &cfg)?;
        if self.qp_type() == QpType::Ud || cfg.ud_dest().is_some() {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("UD rings take their address handle: use Qp::wr_ring_ud"));
        }
        let id = self.claim_send_queue(VERB, cfg.depth_of())?;
        self.finish_wr_ring(VERB, qpx, id, cfg)
    }

    /// A [`WrRing`] on this extended UD QP sending to `ah` / `remote_qpn` / `qkey`
    /// (borrowing the AH as long as the ring lives); otherwise as
    /// [`wr_ring`](Self::wr_ring).
    ///
    /// # Errors
    /// As `wr_ring`, and `EINVAL` when the QP is not UD or the AH is of another PD.
    pub fn wr_ring_ud<'q>(
        &'q self,
        ah: &'q Ah,
        remote_qpn: u32,
        qkey: u32,
        cfg: SendConfig,
    ) -> Result<WrRing<'q>> {
        const VERB: &str = "WrRing";
        let qpx = self.check_ex(VERB, &cfg)?;
        if self.qp_type() != QpType::Ud {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("wr_ring_ud is for UD QPs: use Qp::wr_ring"));
        }
        if ah.pd().protection_raw() != self.pd().protection_raw() {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("the address handle belongs to another PD than the QP"));
        }
        let cfg = cfg.ud(UdDest {
            ah: ah.as_raw(),
            remote_qpn,
            remote_qkey: qkey,
        });
        let id = self.claim_send_queue(VERB, cfg.depth_of())?;
        self.finish_wr_ring(VERB, qpx, id, cfg)
    }

    /// A receive ring on this QP's receive queue over `region[offset..]` (`cfg.count` slots
    /// of `cfg.slot_len` bytes), borrowing the QP and the region. The region is leased to
    /// the QP ([`Qp::lease_recv`]: no safe slice of it until the QP is reset or destroyed,
    /// whatever happens to the ring) and must be owned memory (`Mr<'static>`, from
    /// [`Pd::alloc_mr`](crate::Pd::alloc_mr)) with `LOCAL_WRITE`. Nothing is posted until
    /// `fill`. The receive queue is handed out once; `cfg.count` completions are reserved on
    /// the receive CQ; the ring id is assigned by the CQ.
    ///
    /// # Errors
    /// `RecvRing: EBUSY` when the receive queue already has a ring; `EINVAL` for a QP with
    /// an SRQ, more slots than `max_recv_wr`, a region outside the MR or without
    /// `LOCAL_WRITE`, or a configuration the ring refuses; `ENOSPC` when the receive CQ
    /// cannot take the ring's completions.
    pub fn recv_ring<'q, const N: usize>(
        &'q self,
        region: &'q Mr<'static>,
        offset: usize,
        cfg: RecvConfig,
    ) -> Result<RecvRing<'q, N>> {
        const VERB: &str = "RecvRing";
        if self.srq().is_some() {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("this QP receives through an SRQ: post receives to the SRQ"));
        }
        let count = cfg.count_of();
        if count > self.cap().max_recv_wr {
            return Err(Error::new(VERB, libc::EINVAL).with_hint(format!(
                "{count} slots > the QP's max_recv_wr {}",
                self.cap().max_recv_wr
            )));
        }
        let len = usize::try_from(cfg.region_len()).unwrap_or(usize::MAX);
        // Check the region before taking anything (lease_recv checks it again and leases).
        region.local(offset, len).map_err(|e| {
            Error::new(VERB, e.errno()).with_hint(format!(
                "{count} slots need {len} bytes at offset {offset}; the MR has {}",
                region.len()
            ))
        })?;
        if self.rq_taken().swap(true, Ordering::AcqRel) {
            return Err(Error::new(VERB, libc::EBUSY).with_hint(
                "this QP's receive queue already has its ring (one ring per receive queue, \
                 for the QP's life)",
            ));
        }
        let cq = self.recv_cq();
        let id = match cq.inner.rings.reserve(VERB, cq.capacity(), count) {
            Ok(id) => id,
            Err(e) => {
                self.rq_taken().store(false, Ordering::Release);
                return Err(e);
            }
        };
        let undo = |e: Error| {
            cq.inner.rings.release(id, count);
            self.rq_taken().store(false, Ordering::Release);
            e
        };
        let sge = self.lease_recv(region, offset, len).map_err(undo)?;
        let buf = LocalBuf::from(sge);
        // SAFETY: the QP outlives the ring (borrowed) and its receive queue is this ring's
        // alone (rq_taken); the region is registered owned memory with LOCAL_WRITE
        // (lease_recv checked it) borrowed for the ring's life, leased to the QP until it is
        // reset or destroyed (so no safe slice of it exists while receives may be posted,
        // even after the ring is dropped, and the memory itself lives as long as its
        // registration: Mr<'static>); completions come only from CqPoller; the ring id is
        // unique on the CQ.
        match unsafe { dp::RecvRing::new(RecvTarget::Qp(self.as_raw()), buf, cfg.with_ring_id(id)) }
        {
            Ok(ring) => {
                self.keep_reservation(RingReservation {
                    cq: cq.clone(),
                    id,
                    n: count,
                    clean_qpn: None,
                });
                Ok(RecvRing {
                    ring,
                    _qp: PhantomData,
                })
            }
            Err(e) => Err(undo(config_error(VERB, e))),
        }
    }
}

impl From<Sge> for LocalBuf {
    fn from(s: Sge) -> LocalBuf {
        LocalBuf::new(s.addr, s.length, s.lkey)
    }
}

impl From<LocalBuf> for Sge {
    fn from(b: LocalBuf) -> Sge {
        Sge {
            addr: b.addr,
            length: b.len,
            lkey: b.lkey,
        }
    }
}

impl From<RemoteMr> for RemoteBuf {
    fn from(r: RemoteMr) -> RemoteBuf {
        RemoteBuf::new(r.addr, r.len, r.rkey)
    }
}

impl From<RemoteBuf> for RemoteMr {
    fn from(r: RemoteBuf) -> RemoteMr {
        RemoteMr {
            addr: r.addr,
            len: r.len,
            rkey: r.rkey,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CqRings;

    /// A CQ handed to the direct path is refused to libmlx5 for good: the refusal names
    /// the verb, `EBUSY`, why and what to use; a released poller slot does not lift it.
    /// Destroyed QPs queue up for the direct poller's clean, each once.
    #[test]
    fn a_direct_cq_stays_direct() {
        let r = CqRings::default();
        assert!(r.refuse_if_direct("ibv_poll_cq").is_ok());
        r.mark_direct(super::DirectArm {
            dbrec: std::ptr::null_mut(),
            uar: std::ptr::null_mut(),
            cqn: 7,
        });
        assert_eq!(
            r.direct_arm().map(|a| a.cqn),
            Some(7),
            "kept for req_notify"
        );
        assert!(!r.clean_due());
        r.defer_clean(0x11);
        r.defer_clean(0x22);
        assert!(r.clean_due(), "a destroyed QP waits for the poller");
        assert_eq!(r.take_clean(), [0x11, 0x22]);
        assert!(!r.clean_due());
        assert!(r.take_clean().is_empty(), "each cleaned once");
        assert!(!r.take_poller(), "a direct poller may still take the slot");
        r.release_poller();
        let e = r.refuse_if_direct("ibv_poll_cq").unwrap_err();
        assert_eq!(e.errno(), libc::EBUSY);
        let msg = e.to_string();
        assert!(msg.contains("ibv_poll_cq"), "{msg}");
        assert!(msg.contains("mlx5dv_init_obj"), "{msg}");
        assert!(msg.contains("Cq::direct_poller"), "{msg}");
    }
}
