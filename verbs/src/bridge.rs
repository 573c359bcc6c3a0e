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
//! - **While a ring or poller exists, it owns its queue.** The wrappers forward the
//!   datapath's methods instead of `DerefMut` (a `&mut` to the datapath value, which holds
//!   raw queue pointers and no lifetime, could be `mem::swap`ped under a wrapper whose QP
//!   outlives it); swapping the wrappers themselves unifies their lifetimes, so the
//!   shorter-lived QP must outlive both:
//!   ```compile_fail,E0505
//!   # use hotverbs::{Context, QpBuilder, QpType, SendConfig};
//!   # let ctx = Context::open("softnic").unwrap();
//!   # let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(64, None).unwrap());
//!   let long = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).max_inline_data(64).build().unwrap();
//!   let mut a = long.send_ring::<16>(SendConfig::new(0, 16, 64)).unwrap();
//!   let short = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).max_inline_data(64).build().unwrap();
//!   let mut b = short.send_ring::<16>(SendConfig::new(0, 16, 64)).unwrap();
//!   std::mem::swap(&mut a, &mut b);
//!   drop(b);
//!   drop(short); // `a` now posts into `short`'s queue: refused at compile time
//!   a.flush().unwrap();
//!   ```
//!   and the datapath ring inside cannot be reached mutably at all:
//!   ```compile_fail,E0596
//!   # use hotverbs::{Context, QpBuilder, QpType, SendConfig};
//!   # let ctx = Context::open("softnic").unwrap();
//!   # let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(64, None).unwrap());
//!   # let q1 = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).max_inline_data(64).build().unwrap();
//!   # let q2 = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).max_inline_data(64).build().unwrap();
//!   let mut a = q1.send_ring::<16>(SendConfig::new(0, 16, 64)).unwrap();
//!   let mut b = q2.send_ring::<16>(SendConfig::new(0, 16, 64)).unwrap();
//!   std::mem::swap(&mut *a, &mut *b); // the datapath rings: no DerefMut
//!   ```
//!   The move to RESET of an owned QP ([`Qp::reset`], [`Qp::connect`] from another state,
//!   a raw modify) is refused (`EBUSY`, naming the ring): it is the ring's `reset_qp`
//!   (`reset_qp_with` when a [`RecvRing`] owns the receive queue too), which accounts every
//!   WR, resets the ring(s) and keeps the receive lease; then `connect` again.
//! - **Completions belong to rings**: [`Cq::poll`] is refused while rings complete on the
//!   CQ; a completion handed to the wrong ring is an error, never `Ok`.
//!
//! Zero-copy sends stay `unsafe` ([`hotverbs_datapath::SendRing::stage`]): the buffer must
//! not be touched until its WR is retired, which no type can express cheaply.

use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use hotverbs_datapath as dp;
use hotverbs_datapath::split::Orderings;
use hotverbs_datapath::{
    Completion, ExFields, ExPollError, Local, LocalBuf, Msg, PollError, PostError, Received,
    RecvConfig, RecvError, RecvTarget, ReleaseError, RemoteBuf, SendConfig, SendCounters,
    SendError, SendRetirer, UdDest, WcError,
};

use crate::ah::Ah;
use crate::cq::Cq;
use crate::error::{Error, RecvPostError, Result};
use crate::mr::{Mr, RemoteMr, Sge};
use crate::qp::{Qp, QpType, SendOps, SqOwner};
use crate::srq::Srq;

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
    /// by the CQ so a direct poller never reads a freed one. Raw (from `Box::into_raw`,
    /// freed in `Drop`): a `Box` moved into the `Vec` would be retagged as unique and
    /// invalidate the pointer the ring and poller write and read through.
    wrid_tables: Mutex<Vec<WridTable>>,
    /// The send queues direct rings attached to this CQ's poller, so that a poller made
    /// after the last one was dropped serves them too (removed when the QP is destroyed).
    direct_sqs: Mutex<Vec<AttachedSq>>,
    /// The receive queues direct receive rings attached (`Qp::direct_recv_ring`), for the
    /// same reason.
    direct_rqs: Mutex<Vec<AttachedRq>>,
    /// A direct poller of a CQ with direct receive queues is inside a poll (see
    /// [`defer_clean_and_wait`](CqRings::defer_clean_and_wait)).
    polling: AtomicBool,
    /// The SRQs direct SRQ rings attached (`Srq::direct_recv_ring`), for later pollers.
    direct_srqs: Mutex<Vec<AttachedSrq>>,
    /// SRQs destroyed since the last poll: the direct poller stops serving them.
    to_detach_srq: Mutex<Vec<u32>>,
}

/// A direct SRQ ring's SRQ, as attached to the CQ's poller: its number and description.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttachedSrq(
    pub(crate) u32,
    pub(crate) hotverbs_datapath::mlx5::DirectSrqDesc,
);

// SAFETY: as AttachedRq's: addresses of a live SRQ's queue and of a wrid table and bitmap
// the CqRings owns, only handed to `DirectPoller::attach_srq` under the poller slot.
unsafe impl Send for AttachedSrq {}
// SAFETY: as above.
unsafe impl Sync for AttachedSrq {}

/// A direct receive ring's queue, as attached to the CQ's poller: its QP and description.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttachedRq(
    pub(crate) u32,
    pub(crate) hotverbs_datapath::mlx5::DirectRqDesc,
);

// SAFETY: as AttachedSq's: addresses of a live QP's receive queue and of a wrid table the
// CqRings owns, only handed to `DirectPoller::attach_rq` under the CQ's poller slot.
unsafe impl Send for AttachedRq {}
// SAFETY: as above.
unsafe impl Sync for AttachedRq {}

/// A `wrid` table allocated by [`CqRings::wrid_table`].
#[derive(Debug)]
struct WridTable(*mut [u64]);

// SAFETY: a heap allocation owned by the CqRings; only freed in its Drop.
unsafe impl Send for WridTable {}
// SAFETY: as above (the CqRings never reads through it).
unsafe impl Sync for WridTable {}

/// A direct ring's send queue, as attached to the CQ's poller.
#[derive(Debug, Clone, Copy)]
struct AttachedSq(DirectSqDesc);

type DirectSqDesc = hotverbs_datapath::mlx5::DirectSq;

// SAFETY: addresses of a live QP's queue and of a wrid table the CqRings owns; only handed
// to `DirectPoller::attach` under the CQ's poller slot.
unsafe impl Send for AttachedSq {}
// SAFETY: as above.
unsafe impl Sync for AttachedSq {}

impl Drop for CqRings {
    fn drop(&mut self) {
        let tables = self
            .wrid_tables
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        for t in tables.drain(..) {
            // SAFETY: from Box::into_raw in wrid_table, freed once (drained); the CQ is
            // being destroyed, so no poller or ring uses it any more.
            drop(unsafe { Box::from_raw(t.0) });
        }
    }
}

#[derive(Debug, Default)]
struct RingState {
    /// Bit `i` set: ring id `i` is in use on this CQ.
    ids: [u64; 4],
    /// Completions reserved by rings.
    reserved: u64,
}

impl CqRings {
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

    /// `EBUSY` naming `verb` while rings complete on this CQ (a completion taken by
    /// `Cq::poll` would never reach its ring).
    pub(crate) fn refuse_if_rings(&self, verb: &'static str) -> Result<()> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.ids.iter().any(|w| *w != 0) {
            return Err(Error::new(verb, libc::EBUSY).with_hint(
                "rings built by the bridge (send_ring, recv_ring, wr_ring, direct_ring) \
                 complete on this CQ until their QPs are destroyed: poll it with \
                 Cq::poller and hand each completion to its ring (Completion::ring)",
            ));
        }
        Ok(())
    }

    /// Marks the CQ as the mlx5 direct path's for good; `arm` is how to arm it.
    pub(crate) fn mark_direct(&self, arm: DirectArm) {
        let _ = self.arm.set(arm);
        self.direct.store(true, Ordering::Release);
    }

    /// A QP with a direct ring on this CQ was destroyed: its CQEs still in the CQ are to be
    /// cleaned by the direct poller, in its own thread, at its next poll or attach.
    pub(crate) fn defer_clean(&self, qpn: u32) {
        self.direct_sqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|a| a.0.qp_num != qpn);
        self.direct_rqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|a| a.0 != qpn);
        self.to_clean
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(qpn);
        self.clean_due.store(true, Ordering::Release);
    }

    /// [`defer_clean`](Self::defer_clean), then waits until no direct poll that began
    /// before it is still running: for a QP with a direct receive queue, whose poll reads
    /// the QP's receive WQEs and writes its leased slots (scatter-to-CQE), before the QP's
    /// memory or leases go. A poll that starts after sees the clean due and detaches the QP
    /// first. (Dekker's handshake: this stores `clean_due` and reads `polling`, the poll
    /// stores `polling` and reads `clean_due`, both sequentially consistent.)
    pub(crate) fn defer_clean_and_wait(&self, qpn: u32) {
        self.defer_clean(qpn);
        self.wait_for_polls();
    }

    /// After `clean_due` was set: waits until no guarded poll that may not have seen it is
    /// still running (the Dekker handshake with [`enter_poll`](Self::enter_poll)).
    fn wait_for_polls(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        while self.polling.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
    }

    /// A guarded direct poll begins (see [`defer_clean_and_wait`](Self::defer_clean_and_wait)).
    #[inline(always)]
    pub(crate) fn enter_poll(&self) {
        self.polling.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// A guarded direct poll ended.
    #[inline(always)]
    pub(crate) fn exit_poll(&self) {
        self.polling.store(false, Ordering::Release);
    }

    /// Direct receive queues or SRQs were registered on this CQ: its pollers guard their
    /// polls.
    pub(crate) fn has_direct_rqs(&self) -> bool {
        !self
            .direct_rqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
            || !self
                .direct_srqs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
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
        let t: *mut [u64] = Box::into_raw(vec![0u64; n].into_boxed_slice());
        self.wrid_tables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(WridTable(t));
        t.cast()
    }

    /// Remembers a direct ring's send queue (attached to the current poller) for the
    /// pollers made after it.
    pub(crate) fn register_direct(&self, sq: DirectSqDesc) {
        let mut sqs = self.direct_sqs.lock().unwrap_or_else(|e| e.into_inner());
        sqs.retain(|a| a.0.qp_num != sq.qp_num);
        sqs.push(AttachedSq(sq));
    }

    /// Attaches every registered send queue to a new direct poller.
    pub(crate) fn reattach_direct<const B: usize>(
        &self,
        poller: &mut hotverbs_datapath::DirectPoller<B>,
    ) -> std::result::Result<(), hotverbs_datapath::mlx5::DirectError> {
        let sqs = self.direct_sqs.lock().unwrap_or_else(|e| e.into_inner());
        for a in sqs.iter() {
            // SAFETY: the queue of a live QP (removed at its destruction, defer_clean) and
            // its wrid table, owned by this CQ and freed only with it.
            unsafe { poller.attach(&a.0)? };
        }
        drop(sqs);
        let rqs = self.direct_rqs.lock().unwrap_or_else(|e| e.into_inner());
        for a in rqs.iter() {
            // SAFETY: as above, for a receive queue (removed at its QP's destruction).
            unsafe { poller.attach_rq(a.0, &a.1)? };
        }
        drop(rqs);
        let srqs = self.direct_srqs.lock().unwrap_or_else(|e| e.into_inner());
        for a in srqs.iter() {
            // SAFETY: as above, for an SRQ (removed at its destruction).
            unsafe { poller.attach_srq(a.0, &a.1)? };
        }
        Ok(())
    }

    /// Remembers a direct SRQ ring's SRQ (attached to the current poller) for the pollers
    /// made after it.
    pub(crate) fn register_direct_srq(&self, a: AttachedSrq) {
        let mut v = self.direct_srqs.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|x| x.0 != a.0);
        v.push(a);
    }

    /// An SRQ with a direct ring on this CQ is about to be destroyed: the direct poller
    /// stops serving it at its next poll, and this waits until no poll that began before
    /// is still running (the poll reads the SRQ's WQEs and writes its leased slots; see
    /// [`defer_clean_and_wait`](Self::defer_clean_and_wait)).
    pub(crate) fn defer_detach_srq_and_wait(&self, srqn: u32) {
        self.direct_srqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|a| a.0 != srqn);
        self.to_detach_srq
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(srqn);
        self.clean_due.store(true, Ordering::Release);
        self.wait_for_polls();
    }

    /// The SRQs waiting to be detached (emptied).
    pub(crate) fn take_detach_srqs(&self) -> Vec<u32> {
        std::mem::take(&mut *self.to_detach_srq.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Remembers a direct receive ring's queue (attached to the current poller) for the
    /// pollers made after it.
    pub(crate) fn register_direct_rq(&self, rq: AttachedRq) {
        let mut rqs = self.direct_rqs.lock().unwrap_or_else(|e| e.into_inner());
        rqs.retain(|a| a.0 != rq.0);
        rqs.push(rq);
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

    /// The CQ the claim is on.
    pub(crate) fn cq(&self) -> &Cq {
        &self.cq
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

/// Forwards the send-ring methods every post path shares (the `Msg` API, completions,
/// split mode, draining) from a bridge wrapper to its datapath ring.
///
/// The wrappers forward instead of `DerefMut`: a `&mut` to the datapath ring would let
/// `mem::swap` move it under another wrapper whose QP lives longer (the datapath value
/// carries raw queue pointers and no lifetime), and would reach its `unsafe`-free but
/// queue-changing methods around the owner. `Deref` stays: a shared reference cannot be
/// swapped, and the read-only accessors (`outstanding`, `free`, `ring_id`, `error`, ...)
/// come through it.
macro_rules! forward_send_ring {
    ($name:literal, $batch:ty) => {
        /// `e`, an error of this ring (`send_now`, `flush`, a batch's `finish`, ...), as an
        /// [`Error`] saying what to do, with the QP's state (queried now) where it is the
        /// cause (`ibv_post_send: EINVAL — QP is in RESET: connect it first ...`, where the
        /// datapath can only say "the QP state does not allow posting"). The ring's methods
        /// return the datapath's `SendError` as it is (their success path stays as the
        /// instruction gate measured it); call this on the error path:
        /// `ring.send_now(msg).map_err(|e| ring.explain(&e))`.
        #[cold]
        pub fn explain(&self, e: &SendError) -> Error {
            self.qp.explain_send($name, e)
        }

        /// Posts `msg` alone now (inline payloads only; see the datapath ring's
        /// `send_now`). Returns its sequence number.
        ///
        /// # Errors
        /// As the datapath ring's: `WouldBlock` when full, `Failed` after an error
        /// completion, a refused message by name.
        #[inline(always)]
        pub fn send_now(&mut self, msg: Msg<'_>) -> std::result::Result<u64, SendError> {
            self.ring.send_now(msg)
        }

        /// Stages `msg` without posting (zero-copy from registered memory).
        ///
        /// # Safety
        /// As the datapath ring's `stage`: memory `msg` points at stays valid and unwritten
        /// (read-only for sends, untouched for READ/atomics) until its WR is retired.
        #[inline(always)]
        pub unsafe fn stage(&mut self, msg: Msg<'_>) -> std::result::Result<u64, SendError> {
            // SAFETY: the caller's contract, passed on unchanged.
            unsafe { self.ring.stage(msg) }
        }

        /// Opens a batch: messages pushed into it go out as one chain, one doorbell, on
        /// `finish` (or drop).
        #[inline(always)]
        pub fn batch<'d>(&mut self) -> $batch {
            self.ring.batch()
        }

        /// Posts every staged WR.
        ///
        /// # Errors
        /// As the datapath ring's `flush`.
        #[inline(always)]
        pub fn flush(&mut self) -> std::result::Result<(), SendError> {
            self.ring.flush()
        }

        /// Retires the WRs a completion of this ring covers; returns how many (0 for a
        /// stale completion of this ring, left in the CQ across a reset).
        ///
        /// # Errors
        /// The completion's error status (the ring then fails until reset), or a
        /// completion that is not this ring's (another ring's, or a receive): route by
        /// [`Completion::ring`](hotverbs_datapath::Completion::ring).
        #[inline(always)]
        pub fn on_completion(&mut self, c: &Completion) -> std::result::Result<u64, WcError> {
            self.ring.on_completion(c)
        }

        /// Points the ring's WRITE / READ / atomic messages at `remote` (a peer's
        /// [`RemoteMr`](crate::RemoteMr), e.g. a new peer's after `reset_qp` and
        /// `Qp::connect`); staged WRs are posted first with the old one.
        ///
        /// # Errors
        /// `Config(RemoteAndUd)` on a UD ring; the errors of `flush`.
        pub fn set_remote(
            &mut self,
            remote: impl Into<hotverbs_datapath::RemoteBuf>,
        ) -> std::result::Result<(), SendError> {
            self.ring.set_remote(remote.into())
        }

        /// Makes the next staged WR signaled whatever the schedule says.
        #[inline(always)]
        pub fn signal_next(&mut self) {
            self.ring.signal_next()
        }

        /// Split mode: counters for this (posting) thread and a retirer for the polling
        /// thread (see the datapath ring's `split`).
        pub fn split(&mut self) -> (SendCounters, SendRetirer) {
            self.ring.split()
        }

        /// Split mode, poster side: absorbs the retirer's progress.
        ///
        /// # Panics
        /// If `shared` are not the counters of this ring's latest `split`.
        #[inline(always)]
        pub fn sync<O: Orderings>(&mut self, shared: &SendCounters<O>) {
            self.ring.sync(shared)
        }

        /// Leaves split mode (see the datapath ring's `unsplit`): the retirer comes back
        /// by value once the polling thread is done with it; then `reset_qp` works again.
        ///
        /// # Panics
        /// If `shared` and `retirer` are not the pair of this ring's latest `split`.
        pub fn unsplit<O: Orderings>(&mut self, shared: &SendCounters<O>, retirer: SendRetirer) {
            self.ring.unsplit(shared, retirer)
        }

        /// Posts what is staged and waits, up to `timeout`, until every WR is retired,
        /// calling `poll` to poll the CQ and hand completions to their rings (this one
        /// included: `poll` gets the ring back). The natural
        /// `while ring.outstanding() > 0 { poll }` never ends when the last WRs posted
        /// were unsignaled (only a later signaled WR retires them), so `drain` first asks
        /// for that signal: a zero-length signaled RDMA WRITE to the ring's remote (RC/UC
        /// rings with a remote; a zero-length WRITE checks no key, IBTA C9-88). A ring
        /// without a remote cannot post one by itself: send its last message after
        /// [`signal_next`](Self::signal_next), and `drain` then only waits.
        ///
        /// # Errors
        /// `DrainError::Stalled` when WRs are still outstanding at the deadline, saying
        /// why ([`DrainError`]); `DrainError::Post` when the signal could not be posted;
        /// `DrainError::Poll` with `poll`'s error.
        pub fn drain<E>(
            &mut self,
            timeout: std::time::Duration,
            mut poll: impl FnMut(&mut Self) -> std::result::Result<(), E>,
        ) -> std::result::Result<(), DrainError<E>> {
            let deadline = std::time::Instant::now() + timeout;
            self.ring.flush().map_err(DrainError::Post)?;
            let mut signal = SignalAsked::No;
            if self.ring.outstanding() > 0 && self.ring.error().is_none() {
                signal = self.ask_signal().map_err(DrainError::Post)?;
            }
            while self.ring.outstanding() > 0 {
                poll(self).map_err(DrainError::Poll)?;
                if self.ring.outstanding() > 0 && std::time::Instant::now() >= deadline {
                    return Err(DrainError::Stalled(Stall {
                        outstanding: self.ring.outstanding(),
                        error: self.ring.error(),
                        signal,
                    }));
                }
            }
            Ok(())
        }

        /// Posts a zero-length signaled WRITE so every earlier WR is retired by its
        /// completion; `NoRemote` (nothing posted) when the ring has none.
        fn ask_signal(&mut self) -> std::result::Result<SignalAsked, SendError> {
            self.ring.signal_next();
            match self.ring.send_now(Msg::write(Local::Inline(&[]), 0)) {
                Ok(_) => Ok(SignalAsked::Posted),
                // The ring is full: a signaled WR is in flight (a full ring always has
                // one), so nothing needs asking.
                Err(SendError::WouldBlock) => Ok(SignalAsked::RingFull),
                // Failed meanwhile: the flushes retire everything.
                Err(SendError::QpError(_)) => Ok(SignalAsked::No),
                Err(SendError::NoRemote | SendError::OpNotEnabled(_) | SendError::Config(_)) => {
                    Ok(SignalAsked::NoRemote)
                }
                Err(e) => Err(e),
            }
        }
    };
}

pub(crate) use forward_send_ring;

/// How [`drain`](SendRing::drain) made sure the ring's last WRs are retired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalAsked {
    /// Nothing was outstanding, or the ring had failed (flushes retire everything).
    No,
    /// A zero-length signaled RDMA WRITE was posted after the last WR.
    Posted,
    /// The ring was full, so a signaled WR was already in flight.
    RingFull,
    /// The ring has no remote (a SEND-only or UD ring), so nothing could be posted: its
    /// last WR retires only if it was signaled.
    NoRemote,
}

/// Why a ring's WRs were not all retired by [`SendRing::drain`]'s deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stall {
    /// WRs still outstanding.
    pub outstanding: u64,
    /// The ring's first error completion, if it failed (then the rest come as flushes).
    pub error: Option<WcError>,
    /// What the drain did about an unsignaled tail.
    pub signal: SignalAsked,
}

impl std::fmt::Display for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} WRs still outstanding: ", self.outstanding)?;
        match (self.error, self.signal) {
            (Some(e), _) => write!(
                f,
                "the ring failed ({e:?}) and the rest have not flushed yet: keep polling, or \
                 move the QP to ERR (Qp::to_error) so the device flushes them"
            ),
            (None, SignalAsked::NoRemote) => f.write_str(
                "the last WRs were unsignaled and the ring has no remote to post a \
                 zero-length signaled WRITE to: send the last message after signal_next()",
            ),
            (None, _) => f.write_str(
                "their completions have not come: the peer may be dead (retry_cnt 7 retries \
                 for ever), the CQ may have overflowed (rxe drops completions), or a \
                 completion went to another ring; move the QP to ERR to flush, then reset_qp",
            ),
        }
    }
}

/// The error of a ring's `drain`.
#[derive(Debug)]
pub enum DrainError<E> {
    /// The deadline passed with WRs outstanding.
    Stalled(Stall),
    /// Posting what was staged, or the signal, failed.
    Post(SendError),
    /// The caller's poll failed.
    Poll(E),
}

impl<E: std::fmt::Display> std::fmt::Display for DrainError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DrainError::Stalled(s) => write!(f, "drain: {s}"),
            DrainError::Post(e) => write!(f, "drain: posting failed: {e}"),
            DrainError::Poll(e) => write!(f, "drain: polling failed: {e}"),
        }
    }
}

impl<E: std::fmt::Debug + std::fmt::Display> std::error::Error for DrainError<E> {}

/// The safe recovery of a verbs-path send ring (`SendRing`, `WrRing`): `reset_qp` and
/// `reset_qp_with`, their errors naming `$name`.
macro_rules! verbs_ring_recovery {
    ($name:literal) => {
        /// Recovery: moves the QP to RESET (its WRs discarded by the device) and resets the
        /// ring: every staged or outstanding WR is accounted as never completed (returned),
        /// the error state left; completions of them still in the CQ are ignored as stale
        /// (for a `WrRing`, an open `ibv_wr_*` region is aborted). Then [`Qp::connect`]
        /// again, to the same peer or a new one, and post. With a [`RecvRing`] on the QP
        /// ([`reset_qp_with`](Self::reset_qp_with)): [`Qp::init`], the receive ring's
        /// `fill`, then `connect` (which keeps the QP's INIT and its receives), so they are
        /// posted before the peer sends; a `fill` in RESET is refused.
        ///
        /// # Errors
        #[doc = concat!("`", $name, "::reset_qp: EBUSY` when a [`RecvRing`] owns the QP's")]
        /// receive queue (use [`reset_qp_with`](Self::reset_qp_with), which resets both) or
        /// the ring is in split mode (a retirer may be running: `unsplit` first); the move's
        /// error.
        pub fn reset_qp(&mut self) -> Result<u64> {
            const VERB: &str = concat!($name, "::reset_qp");
            refuse_split(VERB, self.ring.is_split())?;
            refuse_recv_owned(VERB, self.qp, $name)?;
            self.qp.reset_by_rings()?;
            // SAFETY: the QP just went to RESET: the device uses none of the ring's WRs;
            // not in split mode (checked).
            Ok(unsafe { self.ring.reset() })
        }

        /// [`reset_qp`](Self::reset_qp) for a QP whose receive queue `recv` owns: both
        /// rings reset with one move to RESET. Returns (send WRs never completed, receive
        /// slots requeued for the next `fill`).
        ///
        /// # Errors
        #[doc = concat!("`", $name, "::reset_qp_with: EINVAL` when `recv` is not this QP's;")]
        /// `EBUSY` in split mode; the move's error.
        pub fn reset_qp_with<const M: usize>(
            &mut self,
            recv: &mut RecvRing<'_, M>,
        ) -> Result<(u64, usize)> {
            const VERB: &str = concat!($name, "::reset_qp_with");
            refuse_split(VERB, self.ring.is_split())?;
            same_qp(VERB, self.qp, recv.qp)?;
            recv.refuse_direct(VERB)?;
            self.qp.reset_by_rings()?;
            // SAFETY: the QP just went to RESET: the device holds none of either ring's
            // WRs; not in split mode (checked).
            Ok(unsafe { (self.ring.reset(), recv.ring.reset()) })
        }
    };
}

/// A [`hotverbs_datapath::SendRing`] on a [`Qp`]'s send queue, borrowing the QP; made by
/// [`Qp::send_ring`] / [`Qp::send_ring_ud`]. While it lives it owns the send queue: the
/// QP's move to RESET goes through [`reset_qp`](Self::reset_qp). Its methods forward to
/// the datapath ring; `Deref` gives the read-only accessors (`outstanding`, `free`,
/// `ring_id`, `error`, ...).
pub struct SendRing<'q, const N: usize> {
    ring: dp::SendRing<N>,
    qp: &'q Qp,
}

impl<const N: usize> Deref for SendRing<'_, N> {
    type Target = dp::SendRing<N>;
    fn deref(&self) -> &dp::SendRing<N> {
        &self.ring
    }
}

// The common surface of the three post paths (`hotverbs_datapath::path`): a generic engine
// runs on the safe rings as on the raw ones.
dp::forward_post_ring!([const N: usize] SendRing<'_, N>, dp::send::Batch<'r, 'd, N>, ring);
dp::forward_post_ring!([] WrRing<'_>, dp::wr::WrBatch<'r, 'd>, ring);
dp::forward_poll_cq!([const B: usize] CqPoller<'_, B>, PollError);
dp::forward_poll_cq!([const B: usize] ExCqPoller<'_, B>, ExPollError);

impl<'q, const N: usize> SendRing<'q, N> {
    forward_send_ring!("SendRing", dp::send::Batch<'_, 'd, N>);

    /// The QP whose send queue this ring owns.
    pub fn qp(&self) -> &'q Qp {
        self.qp
    }

    /// Marks the last staged WR signaled and posts the chain (see the datapath ring's
    /// `flush_signaled`).
    ///
    /// # Errors
    /// As `flush`.
    pub fn flush_signaled(&mut self) -> std::result::Result<bool, SendError> {
        self.ring.flush_signaled()
    }

    /// Switches a UD ring's destination to `ah` / `remote_qpn` / `qkey`, borrowing the
    /// new AH for the ring's life.
    ///
    /// # Errors
    /// `SendRing::set_ud_dest: EINVAL` for an AH of another PD or an RC/UC ring; the
    /// datapath's refusal (staged WRs are posted first).
    pub fn set_ud_dest(&mut self, ah: &'q Ah, remote_qpn: u32, qkey: u32) -> Result<()> {
        const VERB: &str = "SendRing::set_ud_dest";
        if self.qp.qp_type() != QpType::Ud {
            return Err(Error::new(VERB, libc::EINVAL).with_hint("not a UD ring"));
        }
        if ah.pd().protection_raw() != self.qp.pd().protection_raw() {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("the address handle belongs to another PD than the QP"));
        }
        let dest = UdDest {
            ah: ah.as_raw(),
            remote_qpn,
            remote_qkey: qkey,
        };
        // SAFETY: a live AH of the QP's PD, borrowed for 'q (the ring's life), so it
        // outlives every WR posted with it.
        unsafe { self.ring.set_ud_dest(dest) }
            .map_err(|e| Error::new(VERB, libc::EINVAL).with_hint(e.to_string()))
    }

    verbs_ring_recovery!("SendRing");
}

impl<const N: usize> Drop for SendRing<'_, N> {
    fn drop(&mut self) {
        self.qp.set_sq_owner(None);
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

/// `EBUSY` for a ring in split mode (its retirer may be running on another thread).
pub(crate) fn refuse_split(verb: &'static str, split: bool) -> Result<()> {
    if split {
        return Err(Error::new(verb, libc::EBUSY).with_hint(
            "the ring is in split mode and its retirer may be running on another thread: \
             move the QP to ERR (Qp::to_error), let the retirer retire the flushes, take it \
             back from its thread, ring.unsplit(&counters, retirer), then reset_qp",
        ));
    }
    Ok(())
}

/// `EBUSY` when a `RecvRing` owns `qp`'s receive queue (a send ring's lone `reset_qp`
/// would discard its receives behind its back).
pub(crate) fn refuse_recv_owned(verb: &'static str, qp: &Qp, ring: &str) -> Result<()> {
    if qp.rq_owned() {
        return Err(Error::new(verb, libc::EBUSY).with_hint(format!(
            "a RecvRing owns this QP's receive queue, and RESET discards its receives: reset \
             both with {ring}::reset_qp_with(&mut recv_ring)"
        )));
    }
    Ok(())
}

/// `EINVAL` unless both rings are on the same QP.
pub(crate) fn same_qp(verb: &'static str, a: &Qp, b: &Qp) -> Result<()> {
    if a.as_raw() != b.as_raw() {
        return Err(Error::new(verb, libc::EINVAL).with_hint(format!(
            "the receive ring is on QP {:#x}, the send ring on QP {:#x}: pass the RecvRing of \
             this ring's QP",
            b.qp_num(),
            a.qp_num()
        )));
    }
    Ok(())
}

/// The bytes a receive ring of `cfg` takes at `offset` of `region`: `EINVAL` (or the
/// MR's errno), naming `verb`, when they are not inside it.
/// Said once, for a receive ring: a count `cfg` leaves unset is `min(N, max_wr, the slots
/// the region holds after offset)`; a ring size that is not a power of two, or a count above
/// `N` or the queue's `max_wr`, is refused naming the setting.
fn resolve_recv(
    verb: &'static str,
    cfg: RecvConfig,
    n: usize,
    (max_wr, queue): (u32, &str),
    region: &Mr<'_>,
    offset: usize,
) -> Result<RecvConfig> {
    if !n.is_power_of_two() {
        return Err(Error::new(verb, libc::EINVAL).with_hint(format!(
            "{verb}::<{n}>: N must be a power of two (the ring indexes its slots by masking): \
             use {}",
            n.checked_next_power_of_two().unwrap_or(1 << 16)
        )));
    }
    let count = match cfg.count_of() {
        0 => {
            let slot = cfg.slot_len_of().max(1) as usize;
            let room = region.len().saturating_sub(offset) / slot;
            let c = (n as u32)
                .min(max_wr)
                .min(room.min(u32::MAX as usize) as u32);
            if c == 0 {
                return Err(Error::new(verb, libc::EINVAL).with_hint(format!(
                    "no slot of {slot} bytes fits the region after offset {offset} (the MR has \
                     {} bytes)",
                    region.len()
                )));
            }
            c
        }
        c if c as usize > n => {
            return Err(Error::new(verb, libc::EINVAL).with_hint(format!(
                "RecvConfig count {c} > the ring's N = {n} slots: raise N or lower the count \
                 (RecvConfig::slots leaves it to min(N, {queue}, the region))"
            )))
        }
        c if c > max_wr => {
            return Err(Error::new(verb, libc::EINVAL)
                .with_hint(format!("{c} slots > the {queue} {max_wr}")))
        }
        c => c,
    };
    Ok(cfg.count(count))
}

fn recv_region(
    verb: &'static str,
    region: &Mr<'_>,
    offset: usize,
    cfg: &RecvConfig,
) -> Result<usize> {
    let len = usize::try_from(cfg.region_len()).unwrap_or(usize::MAX);
    region.local(offset, len).map_err(|e| {
        Error::new(verb, e.errno()).with_hint(format!(
            "{} slots need {len} bytes at offset {offset}; the MR has {}",
            cfg.count_of(),
            region.len()
        ))
    })?;
    Ok(len)
}

/// `Deref` to the datapath ring (its read-only methods: `data`, `posted`, `held`, ...)
/// and `Debug`, for the receive-ring wrappers ([`RecvRing`], [`SrqRing`]).
macro_rules! recv_ring_views {
    ($t:ident) => {
        impl<const N: usize> Deref for $t<'_, N> {
            type Target = dp::RecvRing<N>;
            fn deref(&self) -> &dp::RecvRing<N> {
                &self.ring
            }
        }

        impl<const N: usize> std::fmt::Debug for $t<'_, N> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("ring_id", &self.ring.ring_id())
                    .field("posted", &self.ring.posted())
                    .field("held", &self.ring.held())
                    .field("pending", &self.ring.pending())
                    .finish()
            }
        }
    };
}

/// Forwards the receive-ring methods ([`RecvRing`] and [`SrqRing`] share them; each has
/// its own `fill`: a `RecvRing`'s error carries its QP's state).
macro_rules! forward_recv_ring {
    () => {
        /// Takes a receive completion of this ring: the slot is held (read it with `data`)
        /// until [`release`](Self::release).
        ///
        /// # Errors
        /// As the datapath ring's `on_completion`: `Misrouted` for another ring's, a send's or
        /// another QP's completion (still somebody's: hand it to the ring it names), `Stale`
        /// for one of this ring's own that no longer counts (left in the CQ across a reset:
        /// ignore it), or the receive's error status.
        #[inline(always)]
        pub fn on_completion(
            &mut self,
            c: &mut Completion,
        ) -> std::result::Result<Received, RecvError> {
            self.ring.on_completion(c)
        }

        /// Gives a held slot back (reposted at the next `repost`/`fill`).
        ///
        /// # Errors
        /// As the datapath ring's `release`: `RecvError::Foreign` for a `Received` of
        /// another ring, which is dropped (its slot stays held on its own ring): where one
        /// may be another ring's, use [`try_release`](Self::try_release).
        #[inline(always)]
        pub fn release(&mut self, m: Received) -> std::result::Result<(), RecvError> {
            self.ring.release(m)
        }

        /// [`release`](Self::release) that hands a `Received` of another ring back
        /// (`ReleaseError::Foreign`), untouched, to be released on its own ring.
        ///
        /// # Errors
        /// As the datapath ring's `try_release`.
        #[inline]
        pub fn try_release(&mut self, m: Received) -> std::result::Result<(), ReleaseError> {
            self.ring.try_release(m)
        }

        /// Reposts the released slots in one chain.
        ///
        /// # Errors
        /// As the datapath ring's `repost`.
        #[inline(always)]
        pub fn repost(&mut self) -> std::result::Result<usize, PostError> {
            self.ring.repost()
        }
    };
}

/// A [`hotverbs_datapath::RecvRing`] on a [`Qp`]'s receive queue over a leased region;
/// made by [`Qp::recv_ring`]. While it lives it owns the receive queue (and the region
/// stays leased whatever happens to the QP). Its methods forward to the datapath ring;
/// `Deref` gives the read-only ones (`data`, `posted`, `held`, ...).
pub struct RecvRing<'q, const N: usize> {
    ring: dp::RecvRing<N>,
    qp: &'q Qp,
    /// Made by [`Qp::direct_recv_ring`]: its queue is written directly and its completions
    /// come from a direct poller, which a reset must clean.
    direct: bool,
    _region: PhantomData<&'q mut Mr<'static>>,
}

recv_ring_views!(RecvRing);

impl<'q, const N: usize> RecvRing<'q, N> {
    /// The QP whose receive queue this ring owns.
    pub fn qp(&self) -> &'q Qp {
        self.qp
    }

    /// Whether this ring writes its QP's mlx5 receive queue directly
    /// ([`Qp::direct_recv_ring`]).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// `EBUSY` naming `verb` for a direct ring: its reset needs the direct poller, which
    /// must clean the CQ of the QP's completions (libmlx5 does not clean a CQ of the
    /// direct path, and a stale receive CQE would be read against the `wrid` its slot has
    /// after the reset).
    pub(crate) fn refuse_direct(&self, verb: &'static str) -> Result<()> {
        if self.direct {
            return Err(Error::new(verb, libc::EBUSY).with_hint(
                "a direct receive ring (Qp::direct_recv_ring): its reset must clean the \
                 receive CQ with the direct poller: use RecvRing::reset_qp_direct(&mut \
                 poller), or DirectRing::reset_qp_with(&mut poller, &mut recv_ring)",
            ));
        }
        Ok(())
    }

    /// [`reset_qp`](Self::reset_qp) for a direct receive ring ([`Qp::direct_recv_ring`])
    /// on a QP with no send ring: the QP to RESET, its CQEs the poller has not consumed
    /// removed from the receive CQ, every slot not held requeued for the next `fill`.
    ///
    /// # Errors
    /// `RecvRing::reset_qp_direct: EINVAL` for a ring that is not direct or a poller that
    /// is not the receive CQ's; `EBUSY` as [`reset_qp`](Self::reset_qp); the move's error.
    pub fn reset_qp_direct<const B: usize>(
        &mut self,
        poller: &mut crate::DirectPoller<'_, B>,
    ) -> Result<usize> {
        const VERB: &str = "RecvRing::reset_qp_direct";
        if !self.direct {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("not a direct receive ring: use RecvRing::reset_qp"));
        }
        if let Some(k) = self.qp.sq_owner() {
            return Err(Error::new(VERB, libc::EBUSY).with_hint(format!(
                "a {} owns this QP's send queue: reset both with {}::reset_qp_with",
                k.name(),
                k.name()
            )));
        }
        poller.clean_recv_of(VERB, self.qp)?;
        self.qp.reset_by_rings()?;
        poller.clean_qp(self.qp.qp_num());
        // SAFETY: the QP just went to RESET (its receives discarded, the receive counter
        // zeroed) and none of its CQEs is left unconsumed in the receive CQ (cleaned).
        Ok(unsafe { self.ring.reset() })
    }

    /// Resets the datapath ring after its QP went to RESET.
    ///
    /// # Safety
    /// The QP went through RESET since the ring last posted.
    pub(crate) unsafe fn reset_after_qp_reset(&mut self) -> usize {
        // SAFETY: the caller's contract.
        unsafe { self.ring.reset() }
    }

    /// The datapath ring, for a direct receive session ([`crate::DirectPoller::recv_session`]).
    pub(crate) fn dp_mut(&mut self) -> &mut dp::RecvRing<N> {
        &mut self.ring
    }

    /// Posts every free slot (one chained post). Returns how many were posted. Receives
    /// can be posted from INIT on: fill after [`Qp::init`] and before [`Qp::connect`] (which
    /// keeps them), so the first message finds them.
    ///
    /// # Errors
    /// As the datapath ring's `fill`, with the QP's state (queried on the error path) in
    /// the message when it is the cause: in RESET, `ibv_post_recv failed with EINVAL ...:
    /// QP is in RESET: receives can be posted from INIT on — call Qp::init() (or connect)
    /// first`. The [`RecvPostError`] derefs to the datapath's `PostError` and converts into
    /// an [`Error`]. When the provider did not name the rejected receive (rxe in RESET),
    /// the ring counts the chain as posted until [`reset_qp`](Self::reset_qp).
    #[inline(always)]
    pub fn fill(&mut self) -> std::result::Result<usize, RecvPostError> {
        match self.ring.fill() {
            Ok(n) => Ok(n),
            Err(e) => Err(self.qp.explain_recv_post(e)),
        }
    }

    /// `e`, a `PostError` of this ring's [`repost`](Self::repost) (which returns the
    /// datapath's error as it is: mapping it there would keep the ring's QP live across
    /// the post, a register saved and restored on every successful repost of a caller
    /// that does not need the ring afterwards), with the QP's state as
    /// [`fill`](Self::fill) gives it: `ring.repost().map_err(|e| ring.explain(e))`.
    #[cold]
    pub fn explain(&self, e: PostError) -> RecvPostError {
        self.qp.explain_recv_post(e)
    }

    forward_recv_ring!();

    /// Recovery of a QP with no send ring: moves it to RESET (its receives discarded) and
    /// requeues every posted slot for the next [`fill`](Self::fill); held slots stay held.
    /// The region stays leased. Returns how many slots were requeued. Receives are posted
    /// again from INIT on: [`Qp::init`], `fill`, then [`Qp::connect`].
    ///
    /// # Errors
    /// `RecvRing::reset_qp: EBUSY` when a send ring owns the QP's send queue (reset
    /// through it: `reset_qp_with(&mut this)`); the move's error.
    pub fn reset_qp(&mut self) -> Result<usize> {
        const VERB: &str = "RecvRing::reset_qp";
        self.refuse_direct(VERB)?;
        if let Some(k) = self.qp.sq_owner() {
            return Err(Error::new(VERB, libc::EBUSY).with_hint(format!(
                "a {} owns this QP's send queue, and RESET discards its WRs: reset both with \
                 {}::reset_qp_with(&mut recv_ring)",
                k.name(),
                k.name()
            )));
        }
        self.qp.reset_by_rings()?;
        // SAFETY: the QP just went to RESET: none of this ring's receives is posted.
        Ok(unsafe { self.ring.reset() })
    }
}

impl<const N: usize> Drop for RecvRing<'_, N> {
    fn drop(&mut self) {
        // The region stays leased until the QP is reset or destroyed (receives stay
        // posted); only the ownership of the queue ends.
        self.qp.set_rq_owned(false);
    }
}

/// A [`hotverbs_datapath::RecvRing`] on an [`Srq`] over a leased region; made by
/// [`Srq::recv_ring`]. Its receives complete on one CQ, for every QP attached to the SRQ
/// (a QP with another receive CQ is refused while the ring exists). A QP's reset, error or
/// reconnect leaves the SRQ's receives posted, so the ring needs no recovery of its own:
/// a receive a dying QP had taken comes back as a flushed completion through
/// [`on_completion`](Self::on_completion) and the slot is free again for the next
/// [`fill`](Self::fill). The region stays leased until the SRQ is destroyed. Its methods
/// forward to the datapath ring; `Deref` gives the read-only ones.
pub struct SrqRing<'q, const N: usize> {
    ring: dp::RecvRing<N>,
    srq: &'q Srq,
    _region: PhantomData<&'q mut Mr<'static>>,
}

recv_ring_views!(SrqRing);

impl<'q, const N: usize> SrqRing<'q, N> {
    /// The SRQ this ring posts to.
    pub fn srq(&self) -> &'q Srq {
        self.srq
    }

    /// Posts every free slot (one chained post). Returns how many were posted.
    ///
    /// # Errors
    /// As the datapath ring's `fill`.
    #[inline(always)]
    pub fn fill(&mut self) -> std::result::Result<usize, PostError> {
        self.ring.fill()
    }

    forward_recv_ring!();
}

impl Srq {
    /// Takes the SRQ's one ring slot, with `count` completions reserved on `cq` (where
    /// every attached QP completes from then on), and leases `len` bytes of `region` at
    /// `offset` to the SRQ; returns the ring id and the lease. Undone (the slot given back)
    /// when the lease is refused.
    fn claim_ring(
        &self,
        verb: &'static str,
        cq: &Cq,
        count: u32,
        region: &Mr<'static>,
        offset: usize,
        len: usize,
    ) -> Result<(u8, Sge)> {
        let mut id = 0;
        self.take_ring(verb, cq.as_raw(), || {
            id = cq.inner.rings.reserve(verb, cq.capacity(), count)?;
            Ok(RingReservation {
                cq: cq.clone(),
                id,
                n: count,
                clean_qpn: None,
            })
        })?;
        match self.lease_as(verb, region, offset, len) {
            Ok(sge) => Ok((id, sge)),
            Err(e) => {
                self.untake_ring();
                Err(e)
            }
        }
    }

    /// A receive ring of `N` slots on this SRQ over `[offset, offset + cfg.region_len())`
    /// of `region`, its completions on `cq`: the receive CQ of every QP attached to the
    /// SRQ, now and while the SRQ lives. The region is leased to the SRQ until the SRQ is
    /// destroyed (its receives stay posted whatever happens to the ring or the QPs) and
    /// must be owned memory (`Mr<'static>`) with `LOCAL_WRITE`. Nothing is posted until
    /// `fill`. One ring per SRQ, for the SRQ's life; `cfg.count` completions are reserved
    /// on `cq`, the ring id assigned by it.
    ///
    /// # Errors
    /// `SrqRing: EBUSY` when the SRQ had a ring; `EINVAL` when an attached QP completes
    /// its receives on another CQ, `cq` or `region` belongs to another device, for more
    /// slots than the SRQ's `max_wr`, a region outside the MR or without `LOCAL_WRITE`,
    /// or a configuration the ring refuses; `ENOSPC` when `cq` cannot take the ring's
    /// completions.
    pub fn recv_ring<'q, const N: usize>(
        &'q self,
        cq: &'q Cq,
        region: &'q mut Mr<'static>,
        offset: usize,
        cfg: RecvConfig,
    ) -> Result<SrqRing<'q, N>> {
        const VERB: &str = "SrqRing";
        if cq.context().as_raw() != self.pd().context().as_raw() {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("the CQ belongs to another device context than the SRQ"));
        }
        let max_wr = self.query()?.max_wr;
        let cfg = resolve_recv(VERB, cfg, N, (max_wr, "SRQ's max_wr"), region, offset)?;
        let count = cfg.count_of();
        let len = recv_region(VERB, region, offset, &cfg)?;
        // The direct poller parses no responder CQEs: receives need a verbs CQ.
        cq.inner.rings.refuse_if_direct(VERB)?;
        let (id, sge) = self.claim_ring(VERB, cq, count, region, offset, len)?;
        // SAFETY: the SRQ outlives the ring (borrowed) and this is its one ring (take_ring),
        // so no other code posts into it safely; the region is registered owned memory with
        // LOCAL_WRITE (lease_as checked it) borrowed for the ring's life and leased to the
        // SRQ until it is destroyed (its receives outlive the ring and every QP reset), so
        // no safe slice of it exists while receives may be posted; every attached QP
        // completes on `cq` (take_ring / Srq::attach), where the ring id is unique and
        // completions are reached only through pollers.
        match unsafe {
            dp::RecvRing::new(
                RecvTarget::Srq(self.as_raw()),
                LocalBuf::from(sge),
                cfg.with_ring_id(id),
            )
        } {
            Ok(ring) => Ok(SrqRing {
                ring,
                srq: self,
                _region: PhantomData,
            }),
            // The lease stays (harmless: nothing was posted; released with the SRQ), the
            // ring is given back.
            Err(e) => {
                self.untake_ring();
                Err(config_error(VERB, e))
            }
        }
    }
}

impl Srq {
    /// An [`SrqRing`] on this mlx5 SRQ that writes the SRQ's WQEs itself (no
    /// `ibv_post_srq_recv`; issue 30): the linked list and free bitmap as libmlx5 keeps
    /// them ([`dp::mlx5::DirectSrq`]), one barrier and one counter store per repost. Its
    /// completions come from `poller`, the direct poller of the CQ every attached QP
    /// completes its receives on (the SRQ is attached to it: the poll takes each
    /// receive's `wr_id` and frees its WQE); otherwise as [`recv_ring`](Self::recv_ring):
    /// the region is leased to the SRQ until it is destroyed, one ring per SRQ, for its
    /// life. At most the SRQ's WQEs less one slots (the device never takes the last linked
    /// WQE). Destroying the SRQ detaches it from the poller first.
    ///
    /// # Errors
    /// `DirectSrqRing: EOPNOTSUPP` "not an mlx5 device" elsewhere; `EBUSY` when receives
    /// were posted to the SRQ through libmlx5 (its list is not a new one) or as
    /// `recv_ring`; `EINVAL` / `ENOSPC` as `recv_ring`.
    pub fn direct_recv_ring<'q, const N: usize, const B: usize>(
        &'q self,
        poller: &mut crate::DirectPoller<'_, B>,
        region: &'q mut Mr<'static>,
        offset: usize,
        cfg: RecvConfig,
    ) -> Result<SrqRing<'q, N>> {
        const VERB: &str = "DirectSrqRing";
        let cq: Cq = poller.cq().clone();
        let cq = &cq;
        if cq.context().as_raw() != self.pd().context().as_raw() {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("the poller's CQ belongs to another device context than the SRQ"));
        }
        let (probe, srqn) = crate::direct::mlx5_srq(VERB, self)?;
        let max_wr = self.query()?.max_wr.min(probe.nwqes - 1);
        let cfg = resolve_recv(VERB, cfg, N, (max_wr, "SRQ's max_wr"), region, offset)?;
        let count = cfg.count_of();
        let len = recv_region(VERB, region, offset, &cfg)?;
        let (id, sge) = self.claim_ring(VERB, cq, count, region, offset, len)?;
        let desc = dp::mlx5::DirectSrqDesc {
            wrid: cq.inner.rings.wrid_table(probe.nwqes as usize),
            free: cq
                .inner
                .rings
                .wrid_table((probe.nwqes as usize).div_ceil(64)),
            ..probe
        };
        let target = RecvTarget::Mlx5Srq {
            srq: self.as_raw(),
            desc,
            head: 0,
            tail: probe.nwqes - 1,
            counter: 0,
        };
        // SAFETY: as in recv_ring, with the SRQ's queue written by this ring alone (nothing
        // was posted through libmlx5: its list is new, checked by mlx5_srq) and the wrid
        // table and bitmap owned by the CQ, which outlives every poller of it.
        let ring =
            match unsafe { dp::RecvRing::new(target, LocalBuf::from(sge), cfg.with_ring_id(id)) } {
                Ok(r) => r,
                Err(e) => {
                    self.untake_ring();
                    return Err(config_error(VERB, e));
                }
            };
        // SAFETY: the SRQ's queue and the CQ's tables; every buffer a receive names is a
        // slot of the leased region, which only the ring's held slots expose.
        if let Err(e) = unsafe { poller.attach_srq(srqn, &desc) } {
            return Err(config_error(VERB, dp::ConfigError::Direct(e)));
        }
        cq.inner.rings.register_direct_srq(AttachedSrq(srqn, desc));
        self.set_direct_srqn(srqn);
        Ok(SrqRing {
            ring,
            srq: self,
            _region: PhantomData,
        })
    }
}

/// A [`hotverbs_datapath::CqPoller`] on a [`Cq`], borrowing it; made by [`Cq::poller`].
/// While it exists it is the CQ's only poller. Its methods forward to the datapath poller.
///
/// **Replying from inside the poll loop.** The batch [`poll`](Self::poll) returns borrows
/// the poller, not the rings: walk it and send replies as you go. Where sends and
/// receives share the CQ, retire the batch's send completions first (`c.ring() ==
/// ring.ring_id()`), so a reply finds every slot the batch frees; a reply that still meets
/// `SendError::WouldBlock` cannot be waited for inside the batch (only the next poll frees
/// slots): keep it in a bounded queue and send it first on the next poll.
/// `examples/order_gateway.rs` (the exchange's `serve`) is the pattern in full.
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

impl<const B: usize> CqPoller<'_, B> {
    /// Polls up to `B` completions (one `ibv_poll_cq`).
    ///
    /// # Errors
    /// The provider's error (`ibv_poll_cq` < 0: e.g. a CQ overrun).
    #[inline(always)]
    pub fn poll(&mut self) -> std::result::Result<&mut [Completion], PollError> {
        self.poller.poll()
    }

    /// Polls into `out`; returns how many were written.
    ///
    /// # Errors
    /// As [`poll`](Self::poll).
    #[inline(always)]
    pub fn poll_into(&mut self, out: &mut [Completion]) -> std::result::Result<usize, PollError> {
        self.poller.poll_into(out)
    }

    /// Polls until something arrives or `max_polls` polls found nothing.
    ///
    /// # Errors
    /// As [`poll`](Self::poll).
    #[inline(always)]
    pub fn poll_spin(
        &mut self,
        max_polls: u64,
    ) -> std::result::Result<&mut [Completion], PollError> {
        self.poller.poll_spin(max_polls)
    }

    /// Polls once and hands every completion to `f`.
    ///
    /// # Errors
    /// As [`poll`](Self::poll).
    #[inline(always)]
    pub fn drain<F: FnMut(&mut Completion)>(
        &mut self,
        f: F,
    ) -> std::result::Result<usize, PollError> {
        self.poller.drain(f)
    }

    /// `ibv_req_notify_cq(3)` from the poller's own thread: the way to arm a CQ made
    /// without the provider's locks (a thread domain, `MLX5_SINGLE_THREADED`), where
    /// [`Cq::req_notify`] is refused while a poller exists (arming reads the consumer
    /// index the poller writes).
    ///
    /// # Errors
    /// `ibv_req_notify_cq` with the provider's errno.
    pub fn req_notify(&mut self, solicited_only: bool) -> Result<()> {
        self.cq.req_notify_unchecked(solicited_only)
    }
}

impl<const B: usize> Drop for CqPoller<'_, B> {
    fn drop(&mut self) {
        // Release: pairs with the AcqRel swap in take_poller.
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
/// [`Qp::wr_ring`] / [`Qp::wr_ring_ud`]. It owns the send queue exactly as a [`SendRing`]
/// does: a QP has one ring of either kind, and the move to RESET goes through it.
pub struct WrRing<'q> {
    ring: dp::WrRing,
    qp: &'q Qp,
}

impl Deref for WrRing<'_> {
    type Target = dp::WrRing;
    fn deref(&self) -> &dp::WrRing {
        &self.ring
    }
}

impl<'q> WrRing<'q> {
    forward_send_ring!("WrRing", dp::wr::WrBatch<'_, 'd>);

    /// The QP whose send queue this ring owns.
    pub fn qp(&self) -> &'q Qp {
        self.qp
    }

    verbs_ring_recovery!("WrRing");
}

impl Drop for WrRing<'_> {
    fn drop(&mut self) {
        self.qp.set_sq_owner(None);
    }
}

impl std::fmt::Debug for WrRing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WrRing").field("ring", &self.ring).finish()
    }
}

/// A [`hotverbs_datapath::ExCqPoller`] on an extended [`Cq`], borrowing it; made by
/// [`Cq::ex_poller`]. While it exists it is the CQ's only poller (as a [`CqPoller`]).
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

impl<const B: usize> ExCqPoller<'_, B> {
    /// Polls up to `B` completions (`ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll`).
    ///
    /// # Errors
    /// The provider's error.
    #[inline(always)]
    pub fn poll(&mut self) -> std::result::Result<&mut [Completion], ExPollError> {
        self.poller.poll()
    }

    /// [`poll`](Self::poll) with each completion's raw timestamp (`COMPLETION_TS`).
    ///
    /// # Errors
    /// As `poll`.
    #[inline(always)]
    pub fn poll_ts(&mut self) -> std::result::Result<(&mut [Completion], &[u64]), ExPollError> {
        self.poller.poll_ts()
    }

    /// `ibv_req_notify_cq(3)` from the poller's thread, as [`CqPoller::req_notify`].
    ///
    /// # Errors
    /// The provider's errno.
    pub fn req_notify(&mut self, solicited_only: bool) -> Result<()> {
        self.cq.req_notify_unchecked(solicited_only)
    }
}

impl<const B: usize> Drop for ExCqPoller<'_, B> {
    fn drop(&mut self) {
        // Release: pairs with the AcqRel swap in take_poller.
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
    /// Rings check each completion's `qp_num` (and a receive ring its `byte_len`): the
    /// poller always reads [`ExFields::QP_NUM`] (added to `fields`), so the CQ must have
    /// been created with `WcFields::QP_NUM`; ask for [`ExFields::BYTE_LEN`] when receive
    /// rings take its completions.
    ///
    /// # Errors
    /// `ExCqPoller: EINVAL` for a CQ from `ibv_create_cq` (build it with
    /// [`CqBuilder::wc_fields`](crate::CqBuilder::wc_fields)), a CQ without
    /// `WcFields::QP_NUM`, or a field the CQ was not created with (named); `EBUSY` when a poller exists or the CQ was handed to the mlx5
    /// direct path.
    pub fn ex_poller<const B: usize>(&self, fields: ExFields) -> Result<ExCqPoller<'_, B>> {
        const VERB: &str = "ExCqPoller";
        let Some(cqx) = self.as_cq_ex() else {
            return Err(Error::new(VERB, libc::EINVAL).with_hint(
                "not an extended CQ: build it with CqBuilder::wc_fields (ibv_create_cq_ex)",
            ));
        };
        let have = self.wc_fields().bits();
        if have & ExFields::QP_NUM.wc_flags() == 0 {
            return Err(Error::new(VERB, libc::EINVAL).with_hint(format!(
                "the CQ was not created with WcFields::QP_NUM, which rings need: each checks a \
                 completion's QP number (without it every completion reads QP 0 and no ring \
                 takes any); add it to CqBuilder::wc_fields (the CQ has {:?})",
                self.wc_fields()
            )));
        }
        // Always read: rings route and check by it.
        let fields = fields | ExFields::QP_NUM;
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
    /// `direct`: for a `DirectRing` (else a verbs-path ring, refused on a CQ of the direct
    /// path).
    pub(crate) fn claim_send_queue(
        &self,
        verb: &'static str,
        depth: u32,
        direct: bool,
    ) -> Result<u8> {
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
        if !direct {
            self.send_cq().inner.rings.refuse_if_direct(verb)?;
            if self.rq_direct().load(Ordering::Acquire) {
                return Err(Error::new(verb, libc::EBUSY).with_hint(
                    "this QP's receive queue is a direct receive ring's, whose reset must clean \
                     its CQ with the direct poller: send with Qp::direct_ring",
                ));
            }
        }
        if self.sq_taken().swap(true, Ordering::AcqRel) {
            return Err(Error::new(verb, libc::EBUSY).with_hint(
                "this QP's send queue already has its ring (one ring per send queue, for the \
                 QP's life)",
            ));
        }
        if let Some(td) = self.thread_domain() {
            if let Err(e) = td.claim_ring_slot(verb, direct) {
                self.sq_taken().store(false, Ordering::Release);
                return Err(e);
            }
        }
        let cq = self.send_cq();
        match cq.inner.rings.reserve(verb, cq.capacity(), depth) {
            Ok(id) => Ok(id),
            Err(e) => {
                self.unclaim_send_queue();
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
                self.unclaim_send_queue();
                Err(config_error(verb, e))
            }
        }
    }

    /// Said once: the settings `cfg` leaves unset come from the QP (`depth`:
    /// `min(N, cap.max_send_wr)`, `max_inline`: `cap.max_inline_data`), and what is said is
    /// checked against the QP and the ring's `N` here, naming the setting, instead of as a
    /// bare datapath `ConfigError` (or, for a non-power-of-two `N`, a build error inside the
    /// datapath).
    pub(crate) fn resolve_send(
        &self,
        verb: &'static str,
        cfg: SendConfig,
        n: Option<usize>,
    ) -> Result<SendConfig> {
        let cap = self.cap();
        if let Some(n) = n {
            if !n.is_power_of_two() {
                return Err(Error::new(verb, libc::EINVAL).with_hint(format!(
                    "{verb}::<{n}>: N must be a power of two (the ring indexes its slots by \
                     masking): use {}",
                    n.checked_next_power_of_two().unwrap_or(1 << 16)
                )));
            }
        }
        let depth = match cfg.depth_of() {
            0 => n.map_or(cap.max_send_wr, |n| cap.max_send_wr.min(n as u32)),
            d => {
                if let Some(n) = n.filter(|&n| d as usize > n) {
                    return Err(Error::new(verb, libc::EINVAL).with_hint(format!(
                        "SendConfig::depth({d}) > the ring's N = {n} slots: raise N or lower \
                         the depth (left unset it is min(N, the QP's max_send_wr))"
                    )));
                }
                d
            }
        };
        let max = cap.max_inline_data;
        let max_inline = if cfg.max_inline_is_set() {
            if cfg.max_inline_of() > max {
                return Err(Error::new(verb, libc::EINVAL).with_hint(format!(
                    "SendConfig::max_inline({}) > the QP's max_inline_data {max} (raise it with \
                     QpBuilder::max_inline_data, or leave max_inline unset: it is the QP's)",
                    cfg.max_inline_of()
                )));
            }
            cfg.max_inline_of()
        } else {
            max
        };
        Ok(cfg.depth(depth).max_inline(max_inline))
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
    /// let mut ring = a.send_ring::<16>(SendConfig::default().signal_every(1))?;
    /// let mut poller = cq.poller::<8>()?;
    /// let mut region = pd.alloc_mr(256, hotverbs::AccessFlags::LOCAL_WRITE)?;
    /// let mut rb = b.recv_ring::<4>(&mut region, 0, hotverbs::RecvConfig::new(0, 64, 4))?;
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
        let cfg = self.resolve_send(VERB, cfg, Some(N))?;
        let id = self.claim_send_queue(VERB, cfg.depth_of(), false)?;
        let ring = self.finish_send_ring(VERB, id, cfg)?;
        self.set_sq_owner(Some(SqOwner::Send));
        Ok(SendRing { ring, qp: self })
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
        let cfg = self.resolve_send(VERB, cfg, Some(N))?.ud(UdDest {
            ah: ah.as_raw(),
            remote_qpn,
            remote_qkey: qkey,
        });
        let id = self.claim_send_queue(VERB, cfg.depth_of(), false)?;
        let ring = self.finish_send_ring(VERB, id, cfg)?;
        self.set_sq_owner(Some(SqOwner::Send));
        Ok(SendRing { ring, qp: self })
    }

    fn check_ex(
        &self,
        verb: &'static str,
        cfg: SendConfig,
    ) -> Result<(*mut hotverbs_ffi::ibv_qp_ex, SendConfig)> {
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
        Ok((qpx, self.resolve_send(verb, cfg, None)?))
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
                self.set_sq_owner(Some(SqOwner::Wr));
                Ok(WrRing { ring, qp: self })
            }
            Err(e) => {
                self.send_cq().inner.rings.release(id, depth);
                self.unclaim_send_queue();
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
    /// let mut ring = a.wr_ring(SendConfig::default().signal_every(1))?;
    /// // Rings check each completion's qp_num: read it (and byte_len for receives).
    /// let mut poller = cq.ex_poller::<8>(ExFields::BYTE_LEN | ExFields::QP_NUM)?;
    /// let mut region = pd.alloc_mr(256, hotverbs::AccessFlags::LOCAL_WRITE)?;
    /// let mut rb = b.recv_ring::<4>(&mut region, 0, hotverbs::RecvConfig::new(0, 64, 4))?;
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
        let (qpx, cfg) = self.check_ex(VERB, cfg)?;
        if self.qp_type() == QpType::Ud || cfg.ud_dest().is_some() {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("UD rings take their address handle: use Qp::wr_ring_ud"));
        }
        let id = self.claim_send_queue(VERB, cfg.depth_of(), false)?;
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
        let (qpx, cfg) = self.check_ex(VERB, cfg)?;
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
        let id = self.claim_send_queue(VERB, cfg.depth_of(), false)?;
        self.finish_wr_ring(VERB, qpx, id, cfg)
    }

    /// A receive ring on this QP's receive queue over `region[offset..]` (`cfg.count` slots
    /// of `cfg.slot_len` bytes), borrowing the QP, and the region exclusively (so no slice
    /// of it taken before can live on while the device writes it). The region is leased to
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
        region: &'q mut Mr<'static>,
        offset: usize,
        cfg: RecvConfig,
    ) -> Result<RecvRing<'q, N>> {
        const VERB: &str = "RecvRing";
        if self.srq().is_some() {
            return Err(Error::new(VERB, libc::EINVAL).with_hint(
                "this QP receives through an SRQ: make the ring on the SRQ (Srq::recv_ring)",
            ));
        }
        let max_wr = self.cap().max_recv_wr;
        let cfg = resolve_recv(VERB, cfg, N, (max_wr, "QP's max_recv_wr"), region, offset)?;
        let count = cfg.count_of();
        // Checked before taking anything (lease_recv checks it again and leases).
        let len = recv_region(VERB, region, offset, &cfg)?;
        // The direct poller parses no responder CQEs: receives need a verbs CQ.
        self.recv_cq().inner.rings.refuse_if_direct(VERB)?;
        let cq = self.recv_cq();
        let id = self.claim_recv_queue(VERB, count)?;
        let undo = |e: Error| {
            self.unclaim_recv_queue(id, count);
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
                self.set_rq_owned(true);
                Ok(RecvRing {
                    ring,
                    qp: self,
                    direct: false,
                    _region: PhantomData,
                })
            }
            Err(e) => Err(undo(config_error(VERB, e))),
        }
    }
}

impl Qp {
    /// A [`RecvRing`] on this mlx5 QP's receive queue that writes the receive WQEs itself
    /// (no `ibv_post_recv`; issue 30): each `fill`/`repost` writes one WQE per slot into
    /// the queue libmlx5 allocated and publishes them with one store barrier and one
    /// doorbell-record store. Its completions come from `poller`, the direct poller of the
    /// QP's receive CQ (the ring's `wrid` table, owned by the CQ, is attached to it), and
    /// are given to the ring as any receive ring's are: `on_completion`, `data`,
    /// `release`. A payload the device scattered into the CQE (RC/UC messages of up to 32
    /// bytes, 64 with 128-byte CQEs) is copied into the slot by the poll, so `data` reads
    /// it in place as any other. Otherwise as [`recv_ring`](Self::recv_ring): the region is
    /// leased to the QP, the receive queue handed out once, `cfg.count` completions
    /// reserved on the receive CQ.
    ///
    /// Recovery: [`DirectRing::reset_qp_with`](crate::DirectRing::reset_qp_with) when a
    /// direct ring owns the send queue (one CQ for both), else
    /// [`RecvRing::reset_qp_direct`]; the poller cleans the CQ of the QP's completions,
    /// which libmlx5 does not do on a CQ of the direct path. Verbs send rings are refused
    /// on the QP from here on (their resets cannot clean that CQ).
    ///
    /// # Errors
    /// `DirectRecvRing: EOPNOTSUPP` "not an mlx5 device" elsewhere; `EINVAL` when `poller`
    /// is not the receive CQ's, for a QP with an SRQ, more slots than the receive queue's
    /// WQEs, or as `recv_ring`; `EBUSY` when the receive queue already had a ring, a verbs
    /// send ring owns the send queue, or receives were posted through libmlx5 (its receive
    /// counter is not 0: reset the QP first); `ENOSPC` as `recv_ring`.
    pub fn direct_recv_ring<'q, const N: usize, const B: usize>(
        &'q self,
        poller: &mut crate::DirectPoller<'_, B>,
        region: &'q mut Mr<'static>,
        offset: usize,
        cfg: RecvConfig,
    ) -> Result<RecvRing<'q, N>> {
        const VERB: &str = "DirectRecvRing";
        if self.srq().is_some() {
            return Err(Error::new(VERB, libc::EINVAL).with_hint(
                "this QP receives through an SRQ: direct SRQs are not built yet; use \
                 Srq::recv_ring on a verbs CQ",
            ));
        }
        poller.clean_recv_of(VERB, self)?;
        if matches!(self.sq_owner(), Some(SqOwner::Send | SqOwner::Wr)) {
            return Err(Error::new(VERB, libc::EBUSY).with_hint(
                "a verbs send ring owns this QP's send queue, and its reset cannot clean a \
                 direct CQ: send with Qp::direct_ring",
            ));
        }
        let (probe, head) = self.mlx5_rq(std::ptr::null_mut())?;
        if probe.wqe_cnt == 0 || probe.buf.is_null() {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("the QP has no receive queue of its own (max_recv_wr 0)"));
        }
        if head & 0xffff != 0 {
            return Err(Error::new(VERB, libc::EBUSY).with_hint(
                "receives were posted to this QP through libmlx5 (its receive counter is not \
                 0): their completions would be read against the ring's wrid table; reset \
                 the QP (Qp::reset) first",
            ));
        }
        let max_wr = self.cap().max_recv_wr.min(probe.wqe_cnt);
        let cfg = resolve_recv(VERB, cfg, N, (max_wr, "QP's max_recv_wr"), region, offset)?;
        let count = cfg.count_of();
        let len = recv_region(VERB, region, offset, &cfg)?;
        let cq = self.recv_cq();
        let id = self.claim_recv_queue(VERB, count)?;
        let undo = |e: Error| {
            self.unclaim_recv_queue(id, count);
            e
        };
        let sge = self.lease_recv(region, offset, len).map_err(undo)?;
        let desc = dp::mlx5::DirectRqDesc {
            wrid: cq.inner.rings.wrid_table(probe.wqe_cnt as usize),
            ..probe
        };
        let target = RecvTarget::Mlx5 {
            qp: self.as_raw(),
            desc,
            head: 0,
        };
        // SAFETY: the QP outlives the ring (borrowed) and its receive queue is this ring's
        // alone (rq_taken; nothing was posted through libmlx5: its counter is 0); the wrid
        // table is the CQ's and outlives every poller of it; the region is leased as in
        // recv_ring; completions come only from the direct poller; the ring id is unique
        // on the CQ.
        let ring =
            match unsafe { dp::RecvRing::new(target, LocalBuf::from(sge), cfg.with_ring_id(id)) } {
                Ok(r) => r,
                Err(e) => return Err(undo(config_error(VERB, e))),
            };
        // SAFETY: the queue of this live QP and the CQ's wrid table; every buffer a receive
        // names is a slot of the leased region, which only the ring's held slots expose.
        if let Err(e) = unsafe { poller.attach_rq(self.qp_num(), &desc) } {
            return Err(undo(config_error(VERB, dp::ConfigError::Direct(e))));
        }
        cq.inner
            .rings
            .register_direct_rq(AttachedRq(self.qp_num(), desc));
        self.keep_reservation(RingReservation::direct(
            cq.clone(),
            id,
            count,
            self.qp_num(),
        ));
        self.rq_direct().store(true, Ordering::Release);
        self.set_rq_owned(true);
        Ok(RecvRing {
            ring,
            qp: self,
            direct: true,
            _region: PhantomData,
        })
    }
}

impl Qp {
    /// Takes the receive queue for a ring (once for the QP's life) and reserves `count`
    /// completions on the receive CQ; returns the ring id. Undone by
    /// [`unclaim_recv_queue`](Self::unclaim_recv_queue) if the ring is not built.
    fn claim_recv_queue(&self, verb: &'static str, count: u32) -> Result<u8> {
        if self.rq_taken().swap(true, Ordering::AcqRel) {
            return Err(Error::new(verb, libc::EBUSY).with_hint(
                "this QP's receive queue already has its ring (one ring per receive queue, \
                 for the QP's life)",
            ));
        }
        let cq = self.recv_cq();
        match cq.inner.rings.reserve(verb, cq.capacity(), count) {
            Ok(id) => Ok(id),
            Err(e) => {
                self.rq_taken().store(false, Ordering::Release);
                Err(e)
            }
        }
    }

    /// Gives back what [`claim_recv_queue`](Self::claim_recv_queue) took.
    fn unclaim_recv_queue(&self, id: u8, count: u32) {
        self.recv_cq().inner.rings.release(id, count);
        self.rq_taken().store(false, Ordering::Release);
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
