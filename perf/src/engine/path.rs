//! Everything that names a post path: how a QP's send ring is built on each ([`PostPath`]),
//! how a side reaps its CQ(s) ([`Reap`]), and [`build`], the one `match` from the run's
//! choice to the engine compiled for it. The engine itself ([`Hot`]) never names a path.

use std::mem::MaybeUninit;
use std::time::Duration;

use hotverbs::TimestampClock;
use hotverbs_datapath::{
    Completion, CqPoller, DirectPoller, DirectRing, ExCqPoller, PollCq, PostRing, SendConfig,
    SendRing, WrRing,
};

use super::{Engine, Events, Hot, QpSide, Side, POLL_BURST, RING_N, TS_FIELDS};
use crate::cli::Params;
use crate::error::PerfError;

/// Builds the engine of `side` for `p`: the one place the post path is looked at. The
/// `match` picks the ring and reaper types; from here on each engine is compiled for its
/// path. With `events` (`--events`) the engine sleeps on the CQ's channel instead of
/// spinning.
///
/// # Safety
/// See the [engine](super)'s safety section; every QP was created with `sq_sig_all = 0`,
/// at least [`send_depth`](super::send_depth) send WRs and
/// [`recv_count`](super::recv_count) receive WRs, and its completions go to
/// `side.cq` (sends to `side.direct_cq` with `--direct`), which nothing else polls.
pub unsafe fn build(
    side: Side,
    p: &Params,
    timeout: Duration,
    events: Option<Events>,
) -> Result<Box<dyn Engine>, PerfError> {
    let first = side
        .qps
        .first()
        .ok_or_else(|| PerfError::Internal("a side without a QP".into()))?;
    let (direct, extended, stamped) = (
        side.direct_cq.is_some(),
        first.qpx.is_some(),
        side.timestamps.is_some(),
    );
    type Legacy = SendRing<RING_N>;
    type OneCq = CqPoller<POLL_BURST>;
    // SAFETY: forwarded from this function's contract; each arm's types are the post path
    // and CQ layout the side's handles were built for.
    unsafe {
        match (direct, extended, stamped) {
            (true, _, _) => boxed::<DirectRing, DirectCqs>(side, p, timeout, events),
            (false, true, false) => boxed::<WrRing, OneCq>(side, p, timeout, events),
            (false, true, true) => boxed::<WrRing, Stamped>(side, p, timeout, events),
            (false, false, false) => boxed::<Legacy, OneCq>(side, p, timeout, events),
            (false, false, true) => boxed::<Legacy, Stamped>(side, p, timeout, events),
        }
    }
}

/// `Hot<R, C>` for `side`, boxed as an [`Engine`].
///
/// # Safety
/// As [`build`]'s; `R` and `C` are the side's post path and CQ layout.
unsafe fn boxed<R: PostPath + 'static, C: Reap + 'static>(
    side: Side,
    p: &Params,
    timeout: Duration,
    events: Option<Events>,
) -> Result<Box<dyn Engine>, PerfError> {
    // SAFETY: forwarded contract.
    Ok(Box::new(unsafe {
        Hot::<R, C>::new(side, p, timeout, events)
    }?))
}

/// A post path as a type: a datapath [`PostRing`], its name, and how one QP's ring is
/// built on it.
pub trait PostPath: PostRing + Sized {
    /// The post path in the header and `--json` (`post_path`).
    const NAME: &'static str;
    /// The mlx5 direct path, whose fixed-size APIs ([`as_direct`](Self::as_direct)) the
    /// engine uses where they apply.
    const DIRECT: bool = false;

    /// This ring as the datapath's [`DirectRing`], on the direct path (for its session and
    /// post list); `None` elsewhere (a constant: the branch on it is compiled out).
    #[inline(always)]
    fn as_direct(&mut self) -> Option<&mut DirectRing> {
        None
    }

    /// The send ring of `qp`, configured by `cfg`; `what` names it in errors.
    ///
    /// # Safety
    /// The [engine](super)'s contract for `qp`; the QP was created for this path (an extended QP
    /// for [`WrRing`], with its mlx5 SQ description for [`DirectRing`]) with
    /// `sq_sig_all = 0` and at least `cfg`'s depth of send WRs, only this ring posts to it,
    /// and its send completions reach this ring's `on_completion` (through the side's
    /// [`Reap`]er).
    unsafe fn build(qp: &QpSide, cfg: SendConfig, what: &str) -> Result<Box<Self>, PerfError>;
}

fn ring_err(what: &str) -> impl FnOnce(hotverbs_datapath::ConfigError) -> PerfError + '_ {
    move |e| PerfError::Ring {
        what: what.to_string(),
        source: e,
    }
}

impl PostPath for SendRing<RING_N> {
    const NAME: &'static str = "ibv_post_send";

    unsafe fn build(qp: &QpSide, cfg: SendConfig, what: &str) -> Result<Box<Self>, PerfError> {
        let mut boxed: Box<MaybeUninit<SendRing<RING_N>>> = Box::new_uninit();
        // SAFETY: forwarded from this function's contract (live QP with enough send WRs
        // and sq_sig_all = 0; its completions reach on_completion through the reaper).
        unsafe { SendRing::init_in(&mut boxed, qp.qp, cfg) }.map_err(ring_err(what))?;
        // SAFETY: init_in returned Ok, so the ring is fully initialised.
        Ok(unsafe { boxed.assume_init() })
    }
}

impl PostPath for WrRing {
    const NAME: &'static str = "ibv_wr_*";

    unsafe fn build(qp: &QpSide, cfg: SendConfig, what: &str) -> Result<Box<Self>, PerfError> {
        let qpx = qp.qpx.ok_or_else(|| {
            PerfError::Internal(format!("{what}: the QP is not an extended QP (ibv_qp_ex)"))
        })?;
        // SAFETY: forwarded from this function's contract (live extended QP with enough
        // send WRs, the ops the tests use and sq_sig_all = 0; its completions reach
        // on_completion through the reaper).
        Ok(Box::new(
            unsafe { WrRing::new(qpx, cfg) }.map_err(ring_err(what))?,
        ))
    }
}

impl PostPath for DirectRing {
    const NAME: &'static str = "mlx5 direct WQEs";
    const DIRECT: bool = true;

    #[inline(always)]
    fn as_direct(&mut self) -> Option<&mut DirectRing> {
        Some(self)
    }

    unsafe fn build(qp: &QpSide, cfg: SendConfig, what: &str) -> Result<Box<Self>, PerfError> {
        let sq = qp.sq.ok_or_else(|| {
            PerfError::Internal(format!("{what}: no mlx5 send queue description"))
        })?;
        // SAFETY: forwarded from this function's contract: libmlx5's description of the
        // live QP (built without sq_sig_all, with the depth's send WRs and the inline
        // size), used by this ring only; its wrid table lives in the SideRes as long as the
        // QP; completions come from the side's DirectCqs.
        Ok(Box::new(
            unsafe { DirectRing::new(sq, cfg, None) }.map_err(ring_err(what))?,
        ))
    }
}

/// How a side reaps its completions: one poll of its CQ(s), each completion handed on with
/// its raw completion timestamp when the reaper reads them. See the [engine](super)'s docs.
pub trait Reap: Sized {
    /// The reaper of `side`'s CQ(s).
    ///
    /// # Safety
    /// The [engine](super)'s contract; the side's CQs are polled by this reaper only; with
    /// `--direct`, each QP's `sq.wrid` table is its ring's and outlives the reaper.
    unsafe fn build(side: &Side) -> Result<Self, PerfError>;

    /// Polls once and hands every completion, with its raw timestamp (`None` unless this
    /// reaper reads them), to `each`; returns how many.
    fn reap(
        &mut self,
        each: impl FnMut(&mut Completion, Option<u64>) -> Result<(), PerfError>,
    ) -> Result<usize, PerfError>;

    /// The device clock of the timestamps, when this reaper reads them.
    fn timestamp_clock(&self) -> Option<TimestampClock> {
        None
    }

    /// `--direct`'s two pollers, for a fixed-size loop that takes QP 0's receives through
    /// a [`RecvSession`](hotverbs_datapath::mlx5::RecvSession) (issue 30) and its send
    /// completions from the send CQ alone. `None` for the other reapers.
    fn direct_split(&mut self) -> Option<DirectSplit<'_>> {
        None
    }
}

/// [`Reap::direct_split`]: the send CQ's poller, the receive CQ's, and whether softnic's
/// simulated ConnectX runs before each poll.
pub struct DirectSplit<'a> {
    pub send: &'a mut DirectPoller<POLL_BURST>,
    pub recv: &'a mut DirectPoller<POLL_BURST>,
    pub sim: bool,
}

/// One poll of `p` through the datapath's [`PollCq`], each completion to `each`.
#[inline(always)]
fn burst<P: PollCq>(
    p: &mut P,
    err: impl FnOnce(P::Error) -> PerfError,
    mut each: impl FnMut(&mut Completion, Option<u64>) -> Result<(), PerfError>,
) -> Result<usize, PerfError> {
    let batch = p.poll().map_err(err)?;
    let n = batch.len();
    for c in batch {
        each(c, None)?;
    }
    Ok(n)
}

impl Reap for CqPoller<POLL_BURST> {
    unsafe fn build(side: &Side) -> Result<Self, PerfError> {
        // SAFETY: the CQ is live and polled only by this reaper (contract).
        Ok(unsafe { CqPoller::new(side.cq) })
    }

    #[inline(always)]
    fn reap(
        &mut self,
        each: impl FnMut(&mut Completion, Option<u64>) -> Result<(), PerfError>,
    ) -> Result<usize, PerfError> {
        burst(self, PerfError::Poll, each)
    }
}

/// `--timestamps`: the extended CQ, drained with `ibv_start_poll` and friends, each
/// completion with its raw timestamp; and the clock that converts them.
pub struct Stamped {
    poller: ExCqPoller<POLL_BURST>,
    clock: TimestampClock,
}

impl Reap for Stamped {
    unsafe fn build(side: &Side) -> Result<Self, PerfError> {
        let (cq, clock, batch_safe) = side
            .timestamps
            .ok_or_else(|| PerfError::Internal("--timestamps without an extended CQ".into()))?;
        // SAFETY: the extended CQ is live, was created with TS_FIELDS' readers (setup),
        // and is polled only by this reaper (contract).
        let poller = unsafe { ExCqPoller::new(cq, TS_FIELDS, TS_FIELDS.wc_flags()) }
            .map_err(|e| PerfError::Ring {
                what: "extended CQ poller (completion timestamps)".into(),
                source: e,
            })?
            .one_per_poll(!batch_safe);
        Ok(Stamped { poller, clock })
    }

    #[inline(always)]
    fn reap(
        &mut self,
        mut each: impl FnMut(&mut Completion, Option<u64>) -> Result<(), PerfError>,
    ) -> Result<usize, PerfError> {
        let (batch, ts) = self
            .poller
            .poll_ts()
            .map_err(|e| PerfError::Internal(format!("polling the extended CQ: {e}")))?;
        let n = batch.len();
        for (c, &t) in batch.iter_mut().zip(ts) {
            each(c, Some(t))?;
        }
        Ok(n)
    }

    fn timestamp_clock(&self) -> Option<TimestampClock> {
        Some(self.clock)
    }
}

/// `--direct`: the send CQ read directly (one poller serving every QP's SQ), the receive
/// CQ through `ibv_poll_cq`.
pub struct DirectCqs {
    send: Box<DirectPoller<POLL_BURST>>,
    recv: Box<DirectPoller<POLL_BURST>>,
    /// Runs softnic's simulated ConnectX before each poll ([`Side::sim`]).
    sim: bool,
}

impl Reap for DirectCqs {
    unsafe fn build(side: &Side) -> Result<Self, PerfError> {
        let direct_err = |e| PerfError::Ring {
            what: "mlx5 direct poller".into(),
            source: hotverbs_datapath::ConfigError::Direct(e),
        };
        let cq = side
            .direct_cq
            .ok_or_else(|| PerfError::Internal("--direct without its send CQ".into()))?;
        // SAFETY: libmlx5's description of the side's send CQ, polled only by this reaper
        // (contract).
        let mut send = Box::new(unsafe { DirectPoller::new(cq) }.map_err(direct_err)?);
        for q in &side.qps {
            let sq =
                q.sq.ok_or_else(|| PerfError::Internal("--direct QP without its SQ".into()))?;
            // SAFETY: the wrid table is the QP's ring's and lives as long as the QP
            // (contract).
            unsafe { send.attach(&sq) }.map_err(direct_err)?;
        }
        let rcq = side
            .direct_recv_cq
            .ok_or_else(|| PerfError::Internal("--direct without its receive CQ".into()))?;
        // SAFETY: libmlx5's description of the side's receive CQ, polled only by this
        // reaper (contract).
        let mut recv = Box::new(unsafe { DirectPoller::new(rcq) }.map_err(direct_err)?);
        for q in &side.qps {
            if let Some(rq) = &q.rq {
                // SAFETY: the receive queue of a live QP, posted to only by its receive
                // ring; its wrid table is the side's and outlives the reaper; the slots
                // its receives name are the ring's (contract).
                unsafe { recv.attach_rq((*q.qp).qp_num, rq) }.map_err(direct_err)?;
            }
        }
        Ok(DirectCqs {
            send,
            recv,
            sim: side.sim,
        })
    }

    #[inline(always)]
    fn reap(
        &mut self,
        mut each: impl FnMut(&mut Completion, Option<u64>) -> Result<(), PerfError>,
    ) -> Result<usize, PerfError> {
        if self.sim {
            hotverbs_softnic::mlx5_step();
        }
        let n = burst(
            &mut *self.send,
            |e| PerfError::Internal(format!("polling the send CQ directly: {e}")),
            &mut each,
        )?;
        Ok(n + burst(
            &mut *self.recv,
            |e| PerfError::Internal(format!("polling the receive CQ directly: {e}")),
            each,
        )?)
    }

    fn direct_split(&mut self) -> Option<DirectSplit<'_>> {
        Some(DirectSplit {
            send: &mut self.send,
            recv: &mut self.recv,
            sim: self.sim,
        })
    }
}
