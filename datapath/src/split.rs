//! Split mode: one thread posts (owns the [`SendRing`](crate::SendRing)), another polls the
//! CQ (owns the [`CqPoller`](crate::CqPoller) and a [`SendRetirer`]). They share only
//! [`SendCounters`]: single-writer counters, each on its own cache line.
//!
//! Protocol (model-checked in `tests/loom.rs`):
//! - poster: before reusing a slot (or a zero-copy buffer) it observes `retired` with
//!   Acquire; after posting it publishes `posted` with Release (progress information only).
//! - poller: after a completion it publishes `retired` with Release.
//!
//! The poller rebuilds a completion's full sequence number from its 55-bit `wr_id` part
//! against its own window `retired .. retired + depth` ([`wr_id::full_seq_in_window`]):
//! at most `depth` WRs are ever outstanding, so that window holds every WR that can
//! complete. It never needs the poster's `posted`, which matters because a device may
//! complete a WR before the poster has published it (softnic completes inside
//! `ibv_post_send`, and a NIC can be faster than the poster's next store).
//!
//! So everything the NIC (and the poller) did with a WR's memory before the completion
//! happens-before the poster's reuse of it.
//!
//! The poster trusts the published `retired` count to free zero-copy buffers, so only a
//! [`SendRetirer`] fed completions from the CQ can publish it:
//! ```compile_fail,E0624
//! let shared: hotverbs_datapath::SendCounters = hotverbs_datapath::SendCounters::new();
//! shared.publish_retired(5); // crate-private
//! ```
//! and a ring only trusts the counters and the retirer it made itself:
//! [`SendRing::split`](crate::SendRing::split) makes both with a key of their own (unique in
//! the process), [`SendRing::sync`](crate::SendRing::sync) refuses counters with another key
//! and [`SendRetirer::on_completion`] counters of another retirer. Counters from
//! [`SendCounters::new`] and retirers from [`SendRetirer::new`] (key 0, for models and
//! tests) are never accepted by a ring. A retirer also checks each completion's QP number
//! and kind (send, not receive), so completions of another QP or CQ retire nothing.

use core::marker::PhantomData;
// Plain core atomics: key allocation is not part of the modelled protocol.
use core::sync::atomic::AtomicU64 as KeySource;

use crate::cq::Completion;
use crate::error::WcError;
use crate::sync::{AtomicU32, AtomicU64, CachePadded, Ordering};
use crate::wr_id;

/// The memory orderings of the split protocol. [`Paired`] is the real one; the loom model
/// also builds a deliberately weakened variant to prove the model catches it.
pub trait Orderings {
    /// Ordering of a publishing store.
    const PUBLISH: Ordering;
    /// Ordering of an observing load.
    const OBSERVE: Ordering;
}

/// Release on publish, Acquire on observe.
#[derive(Debug)]
pub enum Paired {}

impl Orderings for Paired {
    const PUBLISH: Ordering = Ordering::Release;
    const OBSERVE: Ordering = Ordering::Acquire;
}

/// Test-only: Relaxed everywhere (the loom model's "should fail" case).
#[cfg(loom)]
#[doc(hidden)]
#[derive(Debug)]
pub enum RelaxedForModel {}

#[cfg(loom)]
impl Orderings for RelaxedForModel {
    const PUBLISH: Ordering = Ordering::Relaxed;
    const OBSERVE: Ordering = Ordering::Relaxed;
}

/// No error published yet.
const NO_ERROR: u32 = u32::MAX;

/// Source of split keys: one per [`SendRing::split`](crate::SendRing::split), never reused,
/// never 0.
static NEXT_KEY: KeySource = KeySource::new(1);

/// A fresh split key.
pub(crate) fn new_key() -> u64 {
    NEXT_KEY.fetch_add(1, core::sync::atomic::Ordering::Relaxed)
}

/// Counters shared by the poster and the poller of one send ring; made together with its
/// [`SendRetirer`] by [`SendRing::split`](crate::SendRing::split).
#[derive(Debug)]
pub struct SendCounters<O: Orderings = Paired> {
    /// The split key shared with the ring and the retirer (0: unpaired).
    key: u64,
    /// Written by the poster only.
    posted: CachePadded<AtomicU64>,
    /// Written by the poller only.
    retired: CachePadded<AtomicU64>,
    /// Written by the poller only: first error status, or NO_ERROR.
    error: AtomicU32,
    _o: PhantomData<O>,
}

impl<O: Orderings> Default for SendCounters<O> {
    fn default() -> Self {
        Self::new()
    }
}

impl<O: Orderings> SendCounters<O> {
    /// Zeroed counters of no ring (key 0): for models and tests; a ring's
    /// [`sync`](crate::SendRing::sync) never accepts them. Rings make theirs with
    /// [`SendRing::split`](crate::SendRing::split).
    pub fn new() -> Self {
        Self::keyed(0, 0, 0)
    }

    pub(crate) fn keyed(key: u64, posted: u64, retired: u64) -> Self {
        Self {
            key,
            posted: CachePadded(AtomicU64::new(posted)),
            retired: CachePadded(AtomicU64::new(retired)),
            error: AtomicU32::new(NO_ERROR),
            _o: PhantomData,
        }
    }

    /// The split key (0 for counters of no ring).
    #[inline(always)]
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Poster: WRs `..posted` are posted.
    #[inline(always)]
    pub fn publish_posted(&self, posted: u64) {
        // Release: pairs with the Acquire in `observe_posted` (poller) so the WRs' memory
        // written before the post is visible to whoever handles their completions.
        self.posted.store(posted, O::PUBLISH);
    }

    /// Poller: how many WRs the poster has posted.
    #[inline(always)]
    pub fn observe_posted(&self) -> u64 {
        // Acquire: pairs with the Release in `publish_posted`.
        self.posted.load(O::OBSERVE)
    }

    /// Poller: WRs `..retired` are complete (their slots and buffers are free). Crate
    /// private: the poster trusts it to free zero-copy buffers, so only a
    /// [`SendRetirer`] (fed completions from the CQ) publishes it.
    #[inline(always)]
    pub(crate) fn publish_retired(&self, retired: u64) {
        // Release: pairs with the Acquire in `observe_retired` (poster), so the NIC's and
        // the poller's last use of a slot happens-before the poster reuses it.
        self.retired.store(retired, O::PUBLISH);
    }

    /// Either side: retired and outstanding counts as last published, for a
    /// [`StallWatch`](crate::StallWatch) (the poster publishes `posted` after each post, the
    /// retirer `retired` after each completion).
    pub fn progress(&self) -> crate::Progress {
        let retired = self.observe_retired();
        crate::Progress {
            retired,
            outstanding: self.observe_posted().saturating_sub(retired),
        }
    }

    /// Poster: how many WRs are retired.
    #[inline(always)]
    pub fn observe_retired(&self) -> u64 {
        // Acquire: pairs with the Release in `publish_retired`.
        self.retired.load(O::OBSERVE)
    }

    /// Poller: the QP reported `e` (the first error is kept). A
    /// [`WcError::Misrouted`] is not the QP's error and is not published.
    #[cold]
    pub fn publish_error(&self, e: WcError) {
        if matches!(e, WcError::Misrouted(_)) {
            return;
        }
        if self.error.load(Ordering::Relaxed) == NO_ERROR {
            // Release: pairs with the Acquire in `observe_error`. Single writer (poller),
            // so the check-then-store is not a race.
            self.error.store(e.status(), O::PUBLISH);
        }
    }

    /// Poster: the first error the poller saw, if any.
    #[inline(always)]
    pub fn observe_error(&self) -> Option<WcError> {
        // Acquire: pairs with the Release in `publish_error`.
        match self.error.load(O::OBSERVE) {
            NO_ERROR => None,
            s => WcError::from_status(s),
        }
    }

    /// Both sides after a reset of the QP and the ring (no thread may be using them):
    /// clears the error and sets both counters to `posted`.
    ///
    /// # Safety
    /// `posted` is the ring's [`posted_total`](crate::SendRing::posted_total) right after
    /// its (unsafe) [`reset`](crate::SendRing::reset): the poster trusts `retired`, so a
    /// larger value would free buffers of WRs still in flight.
    pub unsafe fn reset(&mut self, posted: u64) {
        self.posted.store(posted, Ordering::Relaxed);
        self.retired.store(posted, Ordering::Relaxed);
        self.error.store(NO_ERROR, Ordering::Relaxed);
    }
}

/// True if a WR may be staged: fewer than `depth` staged-or-outstanding WRs. The one
/// capacity rule of [`SendRing`](crate::SendRing), shared with the loom model.
#[inline(always)]
pub const fn has_room(staged: u64, retired: u64, depth: u64) -> bool {
    staged - retired < depth
}

/// The poller side's view of one send ring in split mode; made with its counters by
/// [`SendRing::split`](crate::SendRing::split).
#[derive(Debug)]
pub struct SendRetirer {
    retired: u64,
    depth: u64,
    /// `wr_id >> KIND_SHIFT` of this ring's send WRs: ring id, kind bit clear.
    kind: u64,
    /// The ring's QP number (0: any, for an unpaired retirer).
    qp_num: u32,
    key: u64,
}

impl SendRetirer {
    /// An unpaired retirer (key 0) of ring `ring` (its id in `wr_id`s) with `depth` (its
    /// maximum number of outstanding WRs) that starts at `retired` retired WRs, for models
    /// and tests: it only publishes into counters from [`SendCounters::new`], which no ring
    /// accepts. Rings make theirs with [`SendRing::split`](crate::SendRing::split).
    pub const fn new(ring: u8, depth: u64, retired: u64) -> Self {
        Self::keyed(0, ring, 0, depth, retired)
    }

    pub(crate) const fn keyed(key: u64, ring: u8, qp_num: u32, depth: u64, retired: u64) -> Self {
        Self {
            retired,
            depth,
            kind: (ring as u64) << (wr_id::RING_SHIFT - wr_id::KIND_SHIFT),
            qp_num,
            key,
        }
    }

    /// Handles one send completion of the ring: publishes the new retired count (a
    /// completion for sequence `s` retires everything up to `s`) and any error. A
    /// completion of this ring outside the window of outstanding WRs (stale, from before a
    /// reset) is ignored: `Ok(0)`, whatever its status.
    ///
    /// # Errors
    /// The completion's error status (published for the poster), or
    /// [`WcError::Misrouted`] for a completion of another ring, kind (a receive) or QP:
    /// nothing is published, and the completion still belongs to the ring it names.
    ///
    /// # Panics
    /// If `shared` are not the counters made with this retirer (another ring's): publishing
    /// into them would free that ring's buffers.
    #[inline]
    pub fn on_completion<O: Orderings>(
        &mut self,
        c: &Completion,
        shared: &SendCounters<O>,
    ) -> Result<u64, WcError> {
        assert!(
            shared.key == self.key,
            "SendRetirer::on_completion: counters of another ring (key {} != {})",
            shared.key,
            self.key
        );
        if c.wr_id() >> wr_id::KIND_SHIFT != self.kind
            || (self.qp_num != 0 && c.qp_num() != self.qp_num)
        {
            return self.refuse(c);
        }
        let n = match wr_id::full_seq_in_window(self.retired, self.depth, c.seq()) {
            Some(s) => {
                let n = s + 1 - self.retired;
                self.retired = s + 1;
                shared.publish_retired(self.retired);
                n
            }
            None => return Ok(0),
        };
        match c.status() {
            Ok(()) => Ok(n),
            Err(e) => {
                shared.publish_error(e);
                Err(e)
            }
        }
    }

    /// [`on_completion`](Self::on_completion) of a completion of another ring, kind or QP
    /// (out of line, as the rings' own).
    #[cold]
    #[inline(never)]
    fn refuse(&self, c: &Completion) -> Result<u64, WcError> {
        crate::cq::refuse_send(c, self.ring())
    }

    /// WRs retired so far.
    #[inline(always)]
    pub fn retired(&self) -> u64 {
        self.retired
    }

    /// Ends split mode for the ring `key` names (the rings' `unsplit`):
    /// takes this retirer back (by value: its polling thread is done with it) and checks
    /// that it and `shared` are of that split.
    ///
    /// # Panics
    /// If either is of another ring or split (`what` names the caller), or `key` is 0
    /// (the ring is not in split mode).
    pub(crate) fn join<O: Orderings>(self, what: &str, key: u64, shared: &SendCounters<O>) {
        if key == 0 || self.key != key || shared.key != key {
            panic!(
                "{what}: the ring's latest split has key {key}, the counters {} and the \
                 retirer {}: pass the pair that split returned",
                shared.key, self.key
            );
        }
    }

    /// The ring id of the ring this retirer retires for.
    #[inline(always)]
    pub fn ring(&self) -> u8 {
        (self.kind >> (wr_id::RING_SHIFT - wr_id::KIND_SHIFT)) as u8
    }
}
