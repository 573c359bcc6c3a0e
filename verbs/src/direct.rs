//! The mlx5 direct path from setup objects: a [`DirectPoller`] on a [`Cq`] and
//! [`DirectRing`]s on the [`Qp`]s it completes, built from `mlx5dv_init_obj(3)`, with no
//! `unsafe` in user code for inline sends and polling.
//!
//! On a ConnectX the datapath's [`hotverbs_datapath::DirectRing`] writes WQEs straight into
//! the send queue (no `ibv_post_send`, no provider call at all) and
//! [`hotverbs_datapath::DirectPoller`] reads CQEs straight from the CQ. softnic's mlx5
//! personality (`SoftnicConfig::mlx5`) simulates a ConnectX for it, in memory, so all of
//! this runs without hardware (`tests/direct_softnic_mlx5.rs`). On any other device
//! (rxe, softnic, another vendor) both constructors fail with `EOPNOTSUPP` "not an mlx5
//! device" and the verbs rings ([`Qp::send_ring`], [`Cq::poller`]) remain the path.
//!
//! The bridge meets the datapath's contracts as the other rings do (lifetimes, one ring per
//! send queue, completions reserved on the CQ, ring ids from the CQ), plus:
//! - **The poller first**: a ring is built *with* the poller of its send CQ
//!   ([`Qp::direct_ring`] takes it), which attaches the ring's `wrid` table to it; the
//!   table is owned by the CQ and freed with it, so the poller never reads freed memory.
//! - **The CQ is the poller's alone**: `Cq::poll`, a `CqPoller` and an `ExCqPoller` are
//!   refused while it lives (libmlx5's own consumer index would fall behind). Its
//!   consumer index starts where libmlx5's left it (read from the CQ's doorbell record).
//! - **Receives too** (issue 30): [`Qp::direct_recv_ring`] and [`Srq::direct_recv_ring`]
//!   write receive WQEs directly and attach their queues to the poller, so one direct poller
//!   serves a CQ shared by sends and receives. Verbs rings (`recv_ring`, `send_ring`, ...)
//!   still need a verbs CQ.
//!
//! [`Srq::direct_recv_ring`]: crate::Srq::direct_recv_ring
//! - **A QP posted on before**: the ring starts at the QP's `cur_post` (its doorbell
//!   record).
//!
//! # A CQ of the direct path stays one
//! `mlx5dv_init_obj(3)` on a CQ ([`Cq::mlx5_cq`], which [`Cq::direct_poller`] calls)
//! marks it `MLX5_CQ_FLAGS_DV_OWNED` in libmlx5, and the direct poller advances a consumer
//! index libmlx5 never sees. Three consequences, all handled here:
//! - **libmlx5 must not poll it again**: its `ibv_poll_cq` would start from its own, stale,
//!   consumer index, report consumed CQEs a second time and write that index back to the
//!   doorbell record. So from the first direct poller on, [`Cq::poll`], [`Cq::poller`] and
//!   [`Cq::ex_poller`] are refused for the CQ's life (`EBUSY`); a new direct poller takes
//!   over where the last one stopped (the doorbell record holds its index).
//! - **libmlx5 must not arm it**: its arm would carry the stale index too; [`Cq::req_notify`]
//!   arms it as `mlx5_arm_cq` does, from the direct poller's index
//!   ([`arm_cq`](hotverbs_datapath::mlx5::arm_cq)).
//! - **libmlx5 no longer cleans it**: on a QP's move to RESET or its destruction libmlx5
//!   normally removes the QP's CQEs from its CQs (`__mlx5_cq_clean`); on a DV-owned CQ it
//!   skips that. A stale error or flush CQE left there would be read against the `wrid`
//!   entry the reset ring gives its next WR, and fail that WR. [`DirectRing::reset_qp`]
//!   resets the QP, cleans its CQEs with the poller ([`DirectPoller::clean`], proven equal
//!   to libmlx5's clean by `cargo xtask golden`) and resets the ring. A QP destroyed with
//!   CQEs unpolled leaves them behind too: its destruction hands its number to the CQ,
//!   and the direct poller cleans them (and stops serving it) at its next `poll` or
//!   `direct_ring`, in its own thread ([`DirectPoller::clean_destroyed`]).
//!
//! [`DirectPoller::clean`]: dp::DirectPoller::clean

use std::ops::Deref;

mod register;

use register::{register_use, RegisterFacts};
pub use register::{DoorbellOnly, RegisterUse};

use hotverbs_datapath as dp;
use hotverbs_datapath::mlx5::{DirectCq, DirectSq, DirectUd};
use hotverbs_datapath::SendConfig;
use hotverbs_ffi::mlx5dv::{
    mlx5dv_ah, mlx5dv_cq, mlx5dv_obj, mlx5dv_qp, MLX5DV_OBJ_AH, MLX5DV_OBJ_CQ, MLX5DV_OBJ_QP,
};

use crate::ah::Ah;
use crate::bridge::{
    forward_send_ring, refuse_recv_owned, refuse_split, DrainError, RingReservation, SignalAsked,
    Stall,
};
use crate::cq::Cq;
use crate::device::Context;
use crate::error::{Error, Result};
use crate::qp::{Qp, QpType};
use hotverbs_datapath::split::Orderings;
use hotverbs_datapath::{Completion, Local, Msg, SendCounters, SendError, SendRetirer, WcError};

/// `mlx5dv_init_obj` for one object kind, or the reason this is not an mlx5 device.
fn init_obj(verb: &'static str, ctx: &Context, obj: &mut mlx5dv_obj, kind: u32) -> Result<()> {
    if !ctx.is_mlx5() {
        return Err(not_mlx5(verb, ctx));
    }
    #[cfg(feature = "softnic")]
    if ctx.kind() == crate::DeviceKind::Softnic {
        // The mlx5 personality's simulated ConnectX (is_mlx5 held).
        // SAFETY: as below, for softnic's objects.
        let rc = unsafe { hotverbs_softnic::mlx5dv_init_obj(obj, u64::from(kind)) };
        if rc != 0 {
            return Err(Error::new("mlx5dv_init_obj", rc)
                .with_hint("softnic could not describe the object: use the verbs rings"));
        }
        return Ok(());
    }
    let fns = hotverbs_ffi::loader::mlx5().map_err(|e| {
        Error::new(verb, libc::EOPNOTSUPP).with_hint(format!(
            "not an mlx5 device: libmlx5 does not load ({e}); use the verbs rings"
        ))
    })?;
    let Some(f) = fns.mlx5dv_init_obj else {
        return Err(Error::new(verb, libc::EOPNOTSUPP)
            .with_hint("libmlx5 has no mlx5dv_init_obj: use the verbs rings"));
    };
    // SAFETY: `obj` holds live verbs objects of this mlx5 context in its `in` fields and
    // valid `out` structs for the kinds in `kind`.
    let rc = unsafe { f(obj, u64::from(kind)) };
    if rc != 0 {
        return Err(Error::new("mlx5dv_init_obj", rc.abs())
            .with_hint("libmlx5 could not describe the object: use the verbs rings"));
    }
    Ok(())
}

fn not_mlx5(verb: &'static str, ctx: &Context) -> Error {
    Error::new(verb, libc::EOPNOTSUPP).with_hint(format!(
        "not an mlx5 device ({}): the direct path writes ConnectX WQEs; use the verbs rings \
         (Qp::send_ring / Qp::wr_ring, Cq::poller)",
        ctx.name()
    ))
}

fn config_error(verb: &'static str, e: dp::ConfigError) -> Error {
    Error::new(verb, libc::EINVAL).with_hint(e.to_string())
}

/// The direct path on a target without the hardware doorbell.
pub(crate) fn no_mmio(verb: &'static str) -> Error {
    Error::new(verb, libc::EOPNOTSUPP).with_hint(dp::mlx5::DirectError::NoMmio.to_string())
}

/// A [`hotverbs_datapath::DirectPoller`] on an mlx5 [`Cq`], borrowing it; made by
/// [`Cq::direct_poller`]. While it exists it is the CQ's only poller. Derefs to the
/// datapath poller (`poll`, `poll_into`).
pub struct DirectPoller<'c, const B: usize> {
    poller: dp::DirectPoller<B>,
    cq: &'c Cq,
    /// The CQ serves direct receive queues: a poll may read a QP's receive WQEs and write
    /// its leased slots, so polls are guarded against the QP's destruction or reset on
    /// another thread (`CqRings::defer_clean_and_wait`).
    guard: bool,
}

impl<const B: usize> Deref for DirectPoller<'_, B> {
    type Target = dp::DirectPoller<B>;
    fn deref(&self) -> &dp::DirectPoller<B> {
        &self.poller
    }
}

impl<'c, const B: usize> DirectPoller<'c, B> {
    /// Arms the CQ (`ibv_req_notify_cq(3)`, as libmlx5's `mlx5_arm_cq` does) from the
    /// consumer index this poller keeps: the next completion (only solicited ones if
    /// `solicited_only`) raises an event on the CQ's channel. From the poller's thread: it
    /// reads the index the poller writes ([`Cq::req_notify`] is refused while a direct
    /// poller exists).
    ///
    /// # Errors
    /// None on the direct path today; `Result` for the verbs' shape.
    pub fn req_notify(&mut self, solicited_only: bool) -> Result<()> {
        self.cq.req_notify_unchecked(solicited_only)
    }

    /// [`hotverbs_datapath::DirectPoller::poll`], after cleaning the CQEs of QPs destroyed
    /// since the last call (one atomic load when there are none; see
    /// [`clean_destroyed`](Self::clean_destroyed)).
    #[inline]
    pub fn poll(&mut self) -> std::result::Result<&mut [dp::Completion], dp::mlx5::DirectError> {
        if self.guard {
            self.cq.inner.rings.enter_poll();
            self.clean_if_due();
            let r = self.poller.poll();
            self.cq.inner.rings.exit_poll();
            return r;
        }
        self.clean_if_due();
        self.poller.poll()
    }

    /// [`hotverbs_datapath::DirectPoller::poll_into`], after the same clean as
    /// [`poll`](Self::poll).
    #[inline]
    pub fn poll_into(
        &mut self,
        out: &mut [dp::Completion],
    ) -> std::result::Result<usize, dp::mlx5::DirectError> {
        if self.guard {
            self.cq.inner.rings.enter_poll();
            self.clean_if_due();
            let r = self.poller.poll_into(out);
            self.cq.inner.rings.exit_poll();
            return r;
        }
        self.clean_if_due();
        self.poller.poll_into(out)
    }

    /// `EINVAL` naming `verb` unless this is the direct poller of `qp`'s receive CQ.
    pub(crate) fn clean_recv_of(&self, verb: &'static str, qp: &Qp) -> Result<()> {
        if self.cq.as_raw() != qp.recv_cq().as_raw() {
            return Err(Error::new(verb, libc::EINVAL).with_hint(
                "the poller is not the direct poller of this QP's receive CQ: pass \
                 recv_cq().direct_poller()'s",
            ));
        }
        Ok(())
    }

    /// The CQ this poller polls.
    pub(crate) fn cq(&self) -> &'c Cq {
        self.cq
    }

    /// Attaches a direct SRQ ring's SRQ (as [`attach_rq`](Self::attach_rq)).
    ///
    /// # Safety
    /// As [`dp::DirectPoller::attach_srq`].
    pub(crate) unsafe fn attach_srq(
        &mut self,
        srqn: u32,
        srq: &dp::mlx5::DirectSrqDesc,
    ) -> std::result::Result<(), dp::mlx5::DirectError> {
        self.clean_if_due();
        self.guard = true;
        // SAFETY: the caller's contract.
        unsafe { self.poller.attach_srq(srqn, srq) }
    }

    /// Removes QP `qpn`'s unconsumed CQEs (after its move to RESET).
    pub(crate) fn clean_qp(&mut self, qpn: u32) {
        self.poller.clean(qpn);
    }

    /// Attaches a direct receive ring's queue (cleaning destroyed QPs' CQEs first, as
    /// `direct_ring` does).
    ///
    /// # Safety
    /// As [`dp::DirectPoller::attach_rq`].
    pub(crate) unsafe fn attach_rq(
        &mut self,
        qpn: u32,
        rq: &dp::mlx5::DirectRqDesc,
    ) -> std::result::Result<(), dp::mlx5::DirectError> {
        self.clean_if_due();
        self.guard = true;
        // SAFETY: the caller's contract.
        unsafe { self.poller.attach_rq(qpn, rq) }
    }

    /// [`clean_destroyed`](Self::clean_destroyed) when a destroyed QP waits for it.
    #[inline(always)]
    fn clean_if_due(&mut self) {
        if self.cq.inner.rings.clean_due() {
            self.clean_destroyed();
        }
    }

    /// A fused receive loop of `ring` (a direct receive ring of a QP whose receive CQ this
    /// poller polls): [`dp::mlx5::RecvSession`], issue 30's per-message path. Each
    /// [`recv`](dp::mlx5::RecvSession::recv) gives back the message before, then takes the
    /// next one where the device put it (in the slot, or in the CQE: no copy); completions
    /// that are not the ring's come out as [`Polled::Other`](dp::mlx5::Polled::Other) (a
    /// send's: give it to its ring). What is not the fast path runs under this poller's
    /// guard and clean, as [`poll`](Self::poll) does; on softnic's mlx5 personality an
    /// empty poll runs the simulated device.
    ///
    /// # Errors
    /// `EINVAL` (`DirectPoller::recv_session`) when `ring` is not a direct receive ring or
    /// this is not the poller of its QP's receive CQ; the ring's repost error when posting
    /// its released slots fails.
    pub fn recv_session<'s, const N: usize>(
        &'s mut self,
        ring: &'s mut crate::RecvRing<'_, N>,
    ) -> Result<DirectRecvSession<'s, 'c, N, B>> {
        const VERB: &str = "DirectPoller::recv_session";
        if !ring.is_direct() {
            return Err(Error::new(VERB, libc::EINVAL).with_hint(
                "not a direct receive ring: build it with Qp::direct_recv_ring, or poll and \
                 use on_completion",
            ));
        }
        self.clean_recv_of(VERB, ring.qp())?;
        self.clean_if_due();
        if let Err(e) = ring.dp_mut().repost() {
            return Err(ring.explain(e).into());
        }
        let hooks = SessionHooks {
            cq: self.cq,
            guard: self.guard,
        };
        ring.dp_mut()
            .session_with(&mut self.poller, hooks)
            .map_err(|e| Error::new(VERB, libc::EINVAL).with_hint(e.to_string()))
    }

    /// Removes from the CQ the CQEs of QPs with a direct ring that were destroyed since
    /// the last call ([`hotverbs_datapath::DirectPoller::clean`]; libmlx5 skips that clean
    /// on a CQ of the direct path) and stops serving them. Left there, a stale CQE would be
    /// read against the `wrid` table of a later QP given the same number. `poll`,
    /// `poll_into` and `Qp::direct_ring` call it; it runs in the poller's thread, since the
    /// QP may be destroyed in any.
    ///
    /// On softnic's mlx5 personality (`SoftnicConfig::mlx5`) it also runs the simulated
    /// device ([`hotverbs_softnic::mlx5_step`]), so every poll finds what the device did.
    #[cold]
    pub fn clean_destroyed(&mut self) {
        clean_destroyed_of(self.cq, &mut self.poller);
    }
}

/// Removes from `poller` the CQEs of the QPs destroyed since the last call (and SRQs
/// detached); on softnic's mlx5 personality runs the simulated device. The body of
/// [`DirectPoller::clean_destroyed`], shared with a receive session's hooks.
fn clean_destroyed_of<const B: usize>(cq: &Cq, poller: &mut dp::DirectPoller<B>) {
    for qpn in cq.inner.rings.take_clean() {
        poller.clean(qpn);
        poller.detach(qpn);
    }
    for srqn in cq.inner.rings.take_detach_srqs() {
        poller.detach_srq(srqn);
    }
    #[cfg(feature = "softnic")]
    if cq.inner.rings.is_sim() {
        hotverbs_softnic::mlx5_step();
    }
}

/// The fused receive loop [`DirectPoller::recv_session`] gives: a
/// [`dp::mlx5::RecvSession`] of a direct receive ring of `N` slots and a poller of `B`,
/// with the setup layer's hooks.
pub type DirectRecvSession<'s, 'c, const N: usize, const B: usize> =
    dp::mlx5::RecvSession<'s, N, B, SessionHooks<'c>>;

/// The setup layer's side of a [`dp::mlx5::RecvSession`] ([`DirectPoller::recv_session`]):
/// the CQ's poll guard and clean around the session's cold path, and softnic's device on
/// an empty poll.
#[derive(Debug)]
pub struct SessionHooks<'c> {
    cq: &'c Cq,
    guard: bool,
}

impl<const B: usize> dp::mlx5::RecvHooks<B> for SessionHooks<'_> {
    #[inline]
    fn enter_slow(&mut self, poller: &mut dp::DirectPoller<B>) {
        if self.guard {
            self.cq.inner.rings.enter_poll();
        }
        if self.cq.inner.rings.clean_due() {
            clean_destroyed_of(self.cq, poller);
        }
    }

    #[inline]
    fn exit_slow(&mut self) {
        if self.guard {
            self.cq.inner.rings.exit_poll();
        }
    }

    #[inline]
    fn empty(&mut self, poller: &mut dp::DirectPoller<B>) {
        // Only a simulated CQ keeps `clean_due` set: there it runs the device.
        if self.cq.inner.rings.clean_due() {
            if self.guard {
                self.cq.inner.rings.enter_poll();
            }
            clean_destroyed_of(self.cq, poller);
            if self.guard {
                self.cq.inner.rings.exit_poll();
            }
        }
    }
}

impl<const B: usize> Drop for DirectPoller<'_, B> {
    fn drop(&mut self) {
        // libmlx5 polls from here on: give it the consumer index we reached, as its own
        // polls would have (the doorbell record already holds it).
        self.cq.inner.rings.release_poller();
    }
}

impl<const B: usize> std::fmt::Debug for DirectPoller<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectPoller")
            .field("poller", &self.poller)
            .finish()
    }
}

/// A [`hotverbs_datapath::DirectRing`] on an mlx5 [`Qp`]'s send queue, borrowing the QP;
/// made by [`Qp::direct_ring`] / [`Qp::direct_ring_ud`]. Derefs to the datapath ring. It
/// takes the send queue as the other rings do: a QP has one ring of any kind.
pub struct DirectRing<'q> {
    ring: dp::DirectRing,
    qp: &'q Qp,
    register: RegisterUse,
}

impl Deref for DirectRing<'_> {
    type Target = dp::DirectRing;
    fn deref(&self) -> &dp::DirectRing {
        &self.ring
    }
}

dp::forward_post_ring!([] DirectRing<'_>, dp::DirectBatch<'r, 'd>, ring);
dp::forward_poll_cq!([const B: usize] DirectPoller<'_, B>, dp::mlx5::DirectError);

impl<'q> DirectRing<'q> {
    forward_send_ring!("DirectRing", dp::DirectBatch<'_, 'd>);

    /// The QP whose send queue this ring owns.
    pub fn qp(&self) -> &'q Qp {
        self.qp
    }

    /// How this ring rings its QP's doorbell register, decided when it was built: BlueFlame
    /// only on a thread domain's register whose alternation is known and where libmlx5
    /// would BlueFlame too, else the 8-byte doorbell alone, with the reason (see
    /// [`RegisterUse`]).
    pub fn register_use(&self) -> RegisterUse {
        self.register
    }

    /// Does this ring copy lone inline WQEs into a BlueFlame buffer
    /// ([`register_use`](Self::register_use) is [`RegisterUse::BlueFlame`])?
    pub fn blueflame(&self) -> bool {
        matches!(self.register, RegisterUse::BlueFlame { .. })
    }

    /// A held session of `LEN`-byte inline SENDs, one doorbell each, at the fewest
    /// instructions (see [`dp::DirectSession`]); completions go through the session's
    /// `on_completion` while it is open.
    ///
    /// # Errors
    /// As [`dp::DirectRing::session`].
    pub fn session<const LEN: usize>(
        &mut self,
    ) -> std::result::Result<dp::DirectSession<'_, dp::mlx5::Mmio, LEN>, SendError> {
        self.ring.session::<LEN>()
    }

    /// A post list of up to `max` `LEN`-byte inline SENDs with one doorbell, pushed one
    /// by one (see [`dp::DirectWindow`]).
    ///
    /// # Errors
    /// As [`dp::DirectRing::window`].
    pub fn window<const LEN: usize>(
        &mut self,
        max: usize,
    ) -> std::result::Result<dp::DirectWindow<'_, dp::mlx5::Mmio, LEN>, SendError> {
        self.ring.window::<LEN>(max)
    }

    /// Posts `msgs` (`LEN`-byte inline SENDs) with one doorbell, as many as there is room
    /// for; returns how many (see [`dp::DirectRing::post_list`]).
    ///
    /// # Errors
    /// As [`dp::DirectRing::post_list`].
    pub fn post_list<const LEN: usize>(
        &mut self,
        msgs: &[[u8; LEN]],
    ) -> std::result::Result<usize, SendError> {
        self.ring.post_list(msgs)
    }

    /// Stages an inline SEND/WRITE whose payload is gathered from `parts` (see the
    /// datapath ring's `stage_inline_gather`).
    ///
    /// # Errors
    /// As the datapath ring's.
    pub fn stage_inline_gather(
        &mut self,
        msg: Msg<'_>,
        parts: &[&[u8]],
    ) -> std::result::Result<u64, SendError> {
        self.ring.stage_inline_gather(msg, parts)
    }

    /// Stages a WR gathering from registered buffers.
    ///
    /// # Safety
    /// As the datapath ring's `stage_gather`: every buffer stays valid and unwritten until
    /// the WR is retired.
    pub unsafe fn stage_gather(
        &mut self,
        msg: Msg<'_>,
        sges: &[dp::LocalBuf],
    ) -> std::result::Result<u64, SendError> {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.ring.stage_gather(msg, sges) }
    }

    /// Recovery (after an error, or to reconnect): moves the QP to RESET, removes its
    /// CQEs the poller has not consumed from the send CQ ([`DirectPoller::clean`]; libmlx5
    /// does not clean a CQ of the direct path), and resets the ring
    /// ([`DirectRing::reset`](dp::DirectRing::reset)): `cur_post` 0, the error state left,
    /// every staged or outstanding WR forgotten. Returns how many WRs never completed.
    /// Connect the QP again ([`Qp::connect`]) before posting.
    ///
    /// [`DirectPoller::clean`]: dp::DirectPoller::clean
    ///
    /// # Errors
    /// `DirectRing::reset_qp: EINVAL` when `poller` is not the direct poller of the QP's
    /// send CQ; `EBUSY` for a ring in split mode (its retirer may be running: stop it, then
    /// use the unsafe `reset` as its contract says); the error of the move to RESET.
    pub fn reset_qp<const B: usize>(&mut self, poller: &mut DirectPoller<'_, B>) -> Result<u64> {
        const VERB: &str = "DirectRing::reset_qp";
        self.check_reset(VERB, poller)?;
        refuse_recv_owned(VERB, self.qp, "DirectRing")?;
        // A lone run's or leaked session's posts are counted from the doorbell record,
        // which the move to RESET clears.
        self.ring.settle();
        self.qp.reset_by_rings()?;
        poller.poller.clean(self.qp.qp_num());
        // SAFETY: the ring was settled, then the QP went to RESET (libmlx5 zeroed its
        // doorbell record, the device no longer uses its WRs), none of its CQEs is left
        // unconsumed in the send CQ (just cleaned), and the ring is not in split mode
        // (checked).
        Ok(unsafe { self.ring.reset() })
    }

    /// [`reset_qp`](Self::reset_qp) for a QP whose receive queue `recv` owns: both rings
    /// reset with one move to RESET. Returns (send WRs never completed, receive slots
    /// requeued).
    ///
    /// # Errors
    /// As `reset_qp`, and `EINVAL` when `recv` is not this QP's.
    pub fn reset_qp_with<const B: usize, const M: usize>(
        &mut self,
        poller: &mut DirectPoller<'_, B>,
        recv: &mut crate::RecvRing<'_, M>,
    ) -> Result<(u64, usize)> {
        const VERB: &str = "DirectRing::reset_qp_with";
        self.check_reset(VERB, poller)?;
        crate::bridge::same_qp(VERB, self.qp, recv.qp())?;
        if recv.is_direct() && self.qp.recv_cq().as_raw() != self.qp.send_cq().as_raw() {
            // One poller cleans one CQ: the receive CQ's stale CQEs would stay.
            return Err(Error::new(VERB, libc::EINVAL).with_hint(
                "the direct receive ring completes on another CQ than the send ring: reset \
                 needs both CQs cleaned; give the QP one CQ for both, or reset the receive \
                 side with RecvRing::reset_qp_direct after dropping the send ring",
            ));
        }
        self.ring.settle();
        self.qp.reset_by_rings()?;
        poller.poller.clean(self.qp.qp_num());
        // SAFETY: as in reset_qp; the receive ring's receives went with the RESET.
        Ok(unsafe { (self.ring.reset(), recv.reset_after_qp_reset()) })
    }

    fn check_reset<const B: usize>(
        &self,
        verb: &'static str,
        poller: &DirectPoller<'_, B>,
    ) -> Result<()> {
        if poller.cq.as_raw() != self.qp.send_cq().as_raw() {
            return Err(Error::new(verb, libc::EINVAL).with_hint(
                "the poller is not the direct poller of this QP's send CQ: pass the one the \
                 ring was built with",
            ));
        }
        refuse_split(verb, self.ring.is_split())
    }
}

impl Drop for DirectRing<'_> {
    fn drop(&mut self) {
        if let Some(td) = self.qp.thread_domain() {
            // The register goes on from where this ring stopped (td.rs `Register`); a
            // doorbell-only ring wrote one fixed buffer and leaves the alternation as it was.
            let mut r = td.register();
            r.direct = false;
            if self.blueflame() {
                r.next = Some(self.ring.bf_offset() != 0);
            }
        }
        self.qp.set_sq_owner(None);
    }
}

impl std::fmt::Debug for DirectRing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectRing")
            .field("ring", &self.ring)
            .field("register", &self.register)
            .finish()
    }
}

impl Cq {
    /// This mlx5 CQ as the datapath's [`DirectCq`] (`mlx5dv_init_obj(3)`), its consumer
    /// index where libmlx5 left it: for code that builds a
    /// [`hotverbs_datapath::DirectPoller`] itself (its constructor is `unsafe`; the safe
    /// way is [`direct_poller`](Self::direct_poller)). Such a poller's contract then rules
    /// out `Cq::poll` and the verbs pollers for the rest of the CQ's life, as
    /// `direct_poller` enforces.
    ///
    /// # Errors
    /// `mlx5dv_init_obj: EOPNOTSUPP` "not an mlx5 device" anywhere but on a ConnectX.
    pub fn mlx5_cq(&self) -> Result<DirectCq> {
        self.mlx5_cq_arm().map(|(cq, _)| cq)
    }

    /// [`mlx5_cq`](Self::mlx5_cq), and what arming the CQ without libmlx5 takes.
    fn mlx5_cq_arm(&self) -> Result<(DirectCq, crate::bridge::DirectArm)> {
        const VERB: &str = "mlx5dv_init_obj";
        // SAFETY: plain C structs; all-zero is valid (NULL pointers, 0 counts).
        let mut out: mlx5dv_cq = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut obj: mlx5dv_obj = unsafe { std::mem::zeroed() };
        obj.cq.in_ = self.as_raw();
        obj.cq.out = &mut out;
        init_obj(VERB, self.context(), &mut obj, MLX5DV_OBJ_CQ)?;
        // The consumer index libmlx5 reached (its doorbell record holds it, 24 bits).
        // SAFETY: libmlx5's CQ doorbell record, valid while the CQ lives.
        let ci = u32::from_be(unsafe { out.dbrec.cast::<u32>().read_volatile() });
        let desc = DirectCq {
            buf: out.buf.cast(),
            cqe_cnt: out.cqe_cnt,
            cqe_size: out.cqe_size,
            dbrec: out.dbrec.cast(),
            cqn: out.cqn,
            cons_index: ci,
        };
        let arm = crate::bridge::DirectArm {
            dbrec: out.dbrec.cast(),
            uar: out.cq_uar.cast(),
            cqn: out.cqn,
        };
        Ok((desc, arm))
    }

    /// The mlx5 direct poller of this CQ (`B` completions per poll), borrowing it. One
    /// poller at a time, of any kind.
    ///
    /// This hands the CQ to the direct path for good: libmlx5 never sees the consumer
    /// index a direct poller advances, so its `ibv_poll_cq` would report consumed
    /// completions again. [`Cq::poll`], [`Cq::poller`] and [`Cq::ex_poller`] are refused
    /// (`EBUSY`) from the first direct poller on; a new `direct_poller` takes over where the
    /// last one stopped, and [`Cq::req_notify`] arms the CQ from its consumer index. A
    /// refused `direct_poller` leaves the CQ to the verbs pollers: untouched when refused as
    /// not mlx5 or busy (checked before `mlx5dv_init_obj`); refused after it (a CQ it does
    /// not model: a CQE size other than 64 or 128 bytes), the CQ is DV-owned in libmlx5, which then no longer
    /// removes a reset or destroyed QP's completions from it: poll them before resetting.
    ///
    /// # Errors
    /// `DirectPoller: EOPNOTSUPP` "not an mlx5 device" anywhere but on a ConnectX (use
    /// [`poller`](Self::poller)); `EINVAL` for a CQ the direct path does not model (CQEs
    /// other than 64 or 128 bytes, named); `EBUSY` when the CQ already has a poller.
    pub fn direct_poller<const B: usize>(&self) -> Result<DirectPoller<'_, B>> {
        const VERB: &str = "DirectPoller";
        if !self.context().is_mlx5() {
            return Err(not_mlx5(VERB, self.context()));
        }
        if dp::mlx5::Mmio::available().is_none() {
            return Err(no_mmio(VERB));
        }
        // The slot first: a call refused because a verbs poller exists must leave the CQ
        // exactly as it was, and mlx5dv_init_obj would not (libmlx5 marks the CQ DV-owned
        // and stops cleaning it on a QP's reset or destruction, under that poller).
        if self.inner.rings.take_poller() {
            return Err(Error::new(VERB, libc::EBUSY)
                .with_hint("this CQ already has a poller (one per CQ): use it, or drop it first"));
        }
        // Verbs-path rings complete here: libmlx5 holds completions of theirs the direct
        // poller would never see (no receive queue is attached to it here), so they would wait
        // for ever. Once the CQ is direct, only direct rings reserve on it.
        if self.inner.rings.direct_arm().is_none() {
            if let Err(e) = self.inner.rings.refuse_if_rings(VERB) {
                self.inner.rings.release_poller();
                return Err(Error::new(VERB, e.errno()).with_hint(
                    "verbs-path rings (send_ring, wr_ring, recv_ring) complete on this CQ: \
                     their completions queued in libmlx5 would never reach them once the CQ \
                     is the direct path's; give the direct path a CQ of its own",
                ));
            }
        }
        let (desc, arm) = match self.mlx5_cq_arm() {
            Ok(d) => d,
            Err(e) => {
                self.inner.rings.release_poller();
                return Err(e);
            }
        };
        // SAFETY: libmlx5's description of this live CQ, borrowed for the poller's life;
        // the flag just taken makes this its only consumer (Cq::poll and other pollers
        // are refused); direct rings attach only their own wrid tables, owned by this CQ.
        match unsafe { dp::DirectPoller::new(desc) } {
            Ok(mut poller) => {
                // A poller made after an earlier one was dropped serves the rings the
                // earlier one served (their registrations are the CQ's).
                if let Err(e) = self.inner.rings.reattach_direct(&mut poller) {
                    self.inner.rings.release_poller();
                    return Err(config_error(VERB, dp::ConfigError::Direct(e)));
                }
                // From here on only direct pollers poll the CQ (see above).
                self.inner.rings.mark_direct(arm);
                if self.context().kind() == crate::DeviceKind::Softnic {
                    self.inner.rings.mark_sim();
                }
                Ok(DirectPoller {
                    poller,
                    cq: self,
                    guard: self.inner.rings.has_direct_rqs(),
                })
            }
            Err(e) => {
                self.inner.rings.release_poller();
                Err(config_error(VERB, dp::ConfigError::Direct(e)))
            }
        }
    }
}

impl Qp {
    /// This mlx5 QP's send queue as the datapath's [`DirectSq`] (`mlx5dv_init_obj(3)`),
    /// with `wrid` as its `wrid` table (`sq.wqe_cnt` entries, which the caller provides): for
    /// code that builds a [`hotverbs_datapath::DirectRing`] itself (its constructor is
    /// `unsafe`; the safe way is [`direct_ring`](Self::direct_ring)). `wqe_cnt` is known
    /// from a first call with a NULL table.
    ///
    /// The register is as mlx5dv reports it (`bf_size` its `bf.size`, `bf_offset` 0): such
    /// a ring BlueFlames whenever `bf_size` is non-zero, which is sound only on a register
    /// no one else rings, whose alternation starts at 0 (see [`RegisterUse`]); set
    /// `bf_size` to 0 for doorbells only.
    ///
    /// # Errors
    /// `mlx5dv_init_obj: EOPNOTSUPP` "not an mlx5 device" anywhere but on a ConnectX.
    pub fn mlx5_sq(&self, wrid: *mut u64) -> Result<DirectSq> {
        let out = self.mlx5_qp()?;
        Ok(DirectSq {
            buf: out.sq.buf.cast(),
            wqe_cnt: out.sq.wqe_cnt,
            stride: out.sq.stride,
            dbrec: out.dbrec.cast(),
            bf_reg: out.bf.reg.cast(),
            bf_size: out.bf.size,
            bf_offset: 0,
            qp_num: self.qp_num(),
            ud: self.qp_type() == QpType::Ud,
            uc: self.qp_type() == QpType::Uc,
            max_inline: self.cap().max_inline_data,
            max_sge: self.cap().max_send_sge,
            wrid,
        })
    }

    /// `mlx5dv_init_obj(3)` of this QP: libmlx5's description of its queues.
    fn mlx5_qp(&self) -> Result<mlx5dv_qp> {
        // SAFETY: plain C structs; all-zero is valid.
        let mut out: mlx5dv_qp = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut obj: mlx5dv_obj = unsafe { std::mem::zeroed() };
        obj.qp.in_ = self.as_raw();
        obj.qp.out = &mut out;
        init_obj(
            "mlx5dv_init_obj",
            self.pd().context(),
            &mut obj,
            MLX5DV_OBJ_QP,
        )?;
        Ok(out)
    }

    /// This mlx5 QP's receive queue as the datapath's
    /// [`DirectRqDesc`](dp::mlx5::DirectRqDesc) (`mlx5dv_init_obj(3)`), with `wrid` as its
    /// `wrid` table (`rq.wqe_cnt` entries, which the caller provides), and the receive
    /// counter its doorbell record holds now: for code that builds a
    /// [`dp::mlx5::DirectRq`] or a direct [`dp::RecvRing`] itself (both `unsafe`; the safe
    /// way is [`direct_recv_ring`](Self::direct_recv_ring)). `wqe_cnt` 0: the QP has no
    /// receive queue of its own (an SRQ's QP).
    ///
    /// # Errors
    /// `mlx5dv_init_obj: EOPNOTSUPP` "not an mlx5 device" anywhere but on a ConnectX.
    pub fn mlx5_rq(&self, wrid: *mut u64) -> Result<(dp::mlx5::DirectRqDesc, u32)> {
        let out = self.mlx5_qp()?;
        let dbrec: *mut u32 = out.dbrec.cast();
        // SAFETY: libmlx5's doorbell record of this live QP.
        let head = u32::from_be(unsafe { dbrec.add(dp::mlx5::rq::RCV_DBR).read_volatile() });
        Ok((
            dp::mlx5::DirectRqDesc {
                buf: out.rq.buf.cast(),
                wqe_cnt: out.rq.wqe_cnt,
                stride: out.rq.stride,
                dbrec,
                wrid,
            },
            head,
        ))
    }

    /// A [`DirectRing`] writing this mlx5 RC/UC QP's WQEs itself, its completions read by
    /// `poller` (the direct poller of the QP's send CQ, to which the ring's `wrid` table is
    /// attached). Otherwise as [`send_ring`](Self::send_ring): the send queue is handed out
    /// once, `depth` completions are reserved on the send CQ, the ring id is assigned by
    /// the CQ.
    ///
    /// The doorbell register: the ring copies lone inline WQEs into BlueFlame only on a
    /// register it alone rings, which means a QP created in a thread domain
    /// ([`Pd::alloc_parent_domain`](crate::Pd::alloc_parent_domain)); on any other QP it
    /// rings the 8-byte doorbell alone ([`DirectRing::register_use`] says which and why).
    /// While the ring lives, posts through libmlx5 on the thread domain's other QPs
    /// ([`post_send`](Self::post_send), [`post_send_inline`](Self::post_send_inline)) are
    /// refused (`EBUSY`): libmlx5 rings that register without a lock. Raw `ibv_wr_*` or
    /// `ibv_post_send` calls on such a QP through its raw handle must not be made then.
    ///
    /// # Errors
    /// `DirectRing: EOPNOTSUPP` "not an mlx5 device" elsewhere; `EINVAL` when `poller` is
    /// not the send CQ's, for a UD QP (use [`direct_ring_ud`](Self::direct_ring_ud)), a send
    /// queue the writer does not model or one too small for `depth` WQEs of the largest
    /// size (named); `EBUSY` / `ENOSPC` as `send_ring`.
    pub fn direct_ring<'q, const B: usize>(
        &'q self,
        poller: &mut DirectPoller<'_, B>,
        cfg: SendConfig,
    ) -> Result<DirectRing<'q>> {
        const VERB: &str = "DirectRing";
        if self.qp_type() == QpType::Ud || cfg.ud_dest().is_some() {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("UD rings take their address handle: use Qp::direct_ring_ud"));
        }
        self.finish_direct(VERB, poller, cfg, None)
    }

    /// A [`DirectRing`] on this mlx5 UD QP sending to `ah` / `remote_qpn` / `qkey`
    /// (borrowing the AH as long as the ring lives); otherwise as
    /// [`direct_ring`](Self::direct_ring).
    ///
    /// # Errors
    /// As `direct_ring`, and `EINVAL` when the QP is not UD or the AH is of another PD.
    pub fn direct_ring_ud<'q, const B: usize>(
        &'q self,
        poller: &mut DirectPoller<'_, B>,
        ah: &'q Ah,
        remote_qpn: u32,
        qkey: u32,
        cfg: SendConfig,
    ) -> Result<DirectRing<'q>> {
        const VERB: &str = "DirectRing";
        if self.qp_type() != QpType::Ud {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("direct_ring_ud is for UD QPs: use Qp::direct_ring"));
        }
        if ah.pd().protection_raw() != self.pd().protection_raw() {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("the address handle belongs to another PD than the QP"));
        }
        // SAFETY: plain C structs; all-zero is valid.
        let mut out: mlx5dv_ah = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut obj: mlx5dv_obj = unsafe { std::mem::zeroed() };
        obj.ah.in_ = ah.as_raw();
        obj.ah.out = &mut out;
        init_obj(VERB, self.pd().context(), &mut obj, MLX5DV_OBJ_AH)?;
        let ud = DirectUd {
            av: out.av.cast_const().cast(),
            remote_qpn,
            remote_qkey: qkey,
        };
        self.finish_direct(VERB, poller, cfg, Some(ud))
    }

    fn finish_direct<'q, const B: usize>(
        &'q self,
        verb: &'static str,
        poller: &mut DirectPoller<'_, B>,
        cfg: SendConfig,
        ud: Option<DirectUd>,
    ) -> Result<DirectRing<'q>> {
        if poller.cq.as_raw() != self.send_cq().as_raw() {
            return Err(Error::new(verb, libc::EINVAL).with_hint(
                "the poller is not the direct poller of this QP's send CQ: build the ring \
                 with send_cq().direct_poller()",
            ));
        }
        let cfg = self.resolve_send(verb, cfg, None)?;
        if !self.pd().context().is_mlx5() {
            return Err(not_mlx5(verb, self.pd().context()));
        }
        let probe = self.mlx5_sq(std::ptr::null_mut())?;
        let depth = cfg.depth_of();
        let id = self.claim_send_queue(verb, depth, true)?;
        let cq = self.send_cq();
        let wrid = cq.inner.rings.wrid_table(probe.wqe_cnt as usize);
        // After the claim: a thread domain's register is this ring's from here (td.rs).
        let register = self.take_register(&probe);
        let sq = match register {
            RegisterUse::BlueFlame { first_offset } => DirectSq {
                wrid,
                bf_offset: first_offset,
                ..probe
            },
            RegisterUse::DoorbellOnly(_) => DirectSq {
                wrid,
                bf_size: 0,
                bf_offset: 0,
                ..probe
            },
        };
        let undo = |e: Error| {
            if let Some(td) = self.thread_domain() {
                td.register().direct = false;
            }
            cq.inner.rings.release_ring(id, depth);
            self.unclaim_send_queue();
            e
        };
        // The QP may have been posted on through libmlx5: start at its cur_post.
        // SAFETY: libmlx5's doorbell record of this QP, valid while it lives.
        let cur = u32::from_be(unsafe { sq.dbrec.add(dp::mlx5::SND_DBR).read_volatile() });
        // SAFETY: libmlx5's description of this live QP (borrowed for the ring's life),
        // created with sq_sig_all = 0 (claim_send_queue), max_send_wr >= depth (checked
        // there) and max_inline_data >= the ring's (checked); its send queue is this ring's
        // alone (claim_send_queue); the wrid table is owned by the send CQ and outlives
        // every poller of it; completions come only from the direct poller (unforgeable);
        // the ring id is unique on the CQ; a UD ring's AH is borrowed for the ring's life.
        let ring = match unsafe { dp::DirectRing::new(sq, cfg.with_ring_id(id), ud) } {
            Ok(r) => r,
            Err(e) => return Err(undo(config_error(verb, e))),
        };
        // A destroyed QP of the same number may have left CQEs: cleaned before this one's
        // table is attached.
        poller.clean_if_due();
        // SAFETY: as above: the table is the CQ's and lives as long as the CQ.
        if let Err(e) = unsafe { poller.poller.attach(&sq) } {
            return Err(undo(config_error(verb, dp::ConfigError::Direct(e))));
        }
        let mut ring = ring;
        // SAFETY: nothing staged or outstanding on the new ring; `cur` is the QP's
        // doorbell record, libmlx5's cur_post modulo 2^16.
        unsafe { ring.set_cur_post(cur) };
        self.keep_reservation(RingReservation::direct(
            cq.clone(),
            id,
            depth,
            self.qp_num(),
        ));
        cq.inner.rings.register_direct(sq);
        self.set_sq_owner(Some(crate::qp::SqOwner::Direct));
        Ok(DirectRing {
            ring,
            qp: self,
            register,
        })
    }

    /// How a direct ring built on this QP now would ring its doorbell register (the rule
    /// [`Qp::direct_ring`] applies; see [`RegisterUse`]), without taking the register:
    /// for code that builds a datapath `DirectRing` from [`mlx5_sq`](Self::mlx5_sq) itself
    /// ([`RegisterUse::apply_to`]), which must then keep libmlx5 off the register as
    /// `direct_ring` does (no `ibv_post_send` / `ibv_wr_*` on the thread domain's QPs while
    /// the ring lives).
    ///
    /// # Errors
    /// `mlx5dv_init_obj: EOPNOTSUPP` "not an mlx5 device" anywhere but on a ConnectX.
    pub fn mlx5_register_use(&self) -> Result<RegisterUse> {
        let sq = self.mlx5_sq(std::ptr::null_mut())?;
        let shut_up_bf = crate::td::shut_up_bf_env() || self.softnic_shut_up_bf();
        Ok(match self.thread_domain() {
            None => register_use(&RegisterFacts {
                bf_size: sq.bf_size,
                thread_domain: false,
                shut_up_bf,
                next: None,
            }),
            Some(td) => register_use(&RegisterFacts {
                bf_size: sq.bf_size,
                thread_domain: true,
                shut_up_bf: shut_up_bf || td.shut_up_bf(),
                next: td.register().next,
            }),
        })
    }

    /// Decides how the ring to be built rings the register `sq` names
    /// ([`register::register_use`]) and, for a QP of a thread domain, marks the register
    /// the direct path's (libmlx5 posts on the thread domain's QPs are refused until the
    /// ring is dropped). Called with the send queue claimed.
    fn take_register(&self, sq: &DirectSq) -> RegisterUse {
        let shut_up_bf = crate::td::shut_up_bf_env() || self.softnic_shut_up_bf();
        let Some(td) = self.thread_domain() else {
            return register_use(&RegisterFacts {
                bf_size: sq.bf_size,
                thread_domain: false,
                shut_up_bf,
                next: None,
            });
        };
        let mut r = td.register();
        r.direct = true;
        register_use(&RegisterFacts {
            bf_size: sq.bf_size,
            thread_domain: true,
            shut_up_bf: shut_up_bf || td.shut_up_bf(),
            next: r.next,
        })
    }

    /// softnic's mlx5 personality stands in for `MLX5_SHUT_UP_BF` with a device setting
    /// (tests in one process must not race on the environment).
    fn softnic_shut_up_bf(&self) -> bool {
        #[cfg(feature = "softnic")]
        if self.pd().context().kind() == crate::DeviceKind::Softnic {
            // SAFETY: the live context of this QP.
            return unsafe { hotverbs_softnic::mlx5_shut_up_bf(self.pd().context().as_raw()) };
        }
        false
    }
}

/// `mlx5dv_init_obj(3)` of `srq`: its queue as the datapath's
/// [`DirectSrqDesc`](dp::mlx5::DirectSrqDesc) (`nwqes` from libmlx5's tail of a new SRQ,
/// `wrid` and `free` NULL for the caller to give) and its number. `EBUSY` when its list is
/// not a new one (receives were posted through libmlx5).
pub(crate) fn mlx5_srq(
    verb: &'static str,
    srq: &crate::Srq,
) -> Result<(dp::mlx5::DirectSrqDesc, u32)> {
    use hotverbs_ffi::mlx5dv::{mlx5dv_srq, MLX5DV_OBJ_SRQ, MLX5DV_SRQ_MASK_SRQN};
    if dp::mlx5::Mmio::available().is_none() {
        return Err(no_mmio(verb));
    }
    // SAFETY: plain C structs; all-zero is valid.
    let mut out: mlx5dv_srq = unsafe { std::mem::zeroed() };
    out.comp_mask = u64::from(MLX5DV_SRQ_MASK_SRQN);
    // SAFETY: as above.
    let mut obj: mlx5dv_obj = unsafe { std::mem::zeroed() };
    obj.srq.in_ = srq.as_raw();
    obj.srq.out = &mut out;
    init_obj(verb, srq.pd().context(), &mut obj, MLX5DV_OBJ_SRQ)?;
    let dbrec: *mut u32 = out.dbrec.cast();
    // SAFETY: libmlx5's doorbell record of this live SRQ.
    let counter = u32::from_be(unsafe { dbrec.read_volatile() });
    if out.head != 0 || counter != 0 || !(out.tail + 1).is_power_of_two() {
        return Err(Error::new(verb, libc::EBUSY).with_hint(
            "receives were posted to this SRQ through libmlx5 (its list is not a new one): a \
             direct SRQ ring takes over a new SRQ only",
        ));
    }
    if out.comp_mask & u64::from(MLX5DV_SRQ_MASK_SRQN) == 0 {
        return Err(Error::new(verb, libc::EOPNOTSUPP)
            .with_hint("libmlx5 does not report the SRQ's number (MLX5DV_SRQ_MASK_SRQN)"));
    }
    Ok((
        dp::mlx5::DirectSrqDesc {
            buf: out.buf.cast(),
            stride: out.stride,
            nwqes: out.tail + 1,
            dbrec,
            wrid: std::ptr::null_mut(),
            free: std::ptr::null_mut(),
        },
        out.srqn,
    ))
}
