//! The workloads shared by the criterion benches (`benches/*.rs`) and by
//! `cargo xtask insn` (the `insn-workload` binary runs them under callgrind).
//!
//! Every workload exists twice: hotverbs' datapath and the [`naive`] baseline, on the same
//! device, so a run always measures both and reports the ratio.
//!
//! - **streaming**: post N inline 32-byte messages and reap every completion. hotverbs:
//!   [`SendRing`] (depth 128, signal every 32, post lists of 1, 8 or 32) + [`CqPoller`]
//!   (32 per poll). Naive: a fresh WR per message, every WR signaled, one post per WR, one
//!   CQE per poll. On the counting device (SENDs; isolates our code from any provider) and
//!   on softnic (RDMA WRITEs into the peer, so the receiver's work, the same for both, stays
//!   out of the measurement).
//! - **many rings on one CQ** on softnic: K = 1, 16 or 256 connected RC QP pairs, the K
//!   senders' send completions on ONE shared CQ. hotverbs: a [`SendRing`] per QP (depth 64,
//!   signal every 32, ring ids 0..K), [`SendRing::send_now`] round-robin over the rings (one
//!   message per ring in turn), one [`CqPoller`] (32 per poll) whose completions go to
//!   their ring by [`Completion::ring`](hotverbs_datapath::Completion::ring). Naive
//!   ([`naive::NaiveFan`]): the same K QPs and CQ, a fresh WR per message, every WR
//!   signaled, one post per WR, one CQE per poll, counted against its QP by `wr_id`. RDMA
//!   WRITEs of 32 bytes inline, as the softnic streams.
//! - **poll**: drain N completions: [`CqPoller`] 32 per call vs one per call.
//! - **extended verbs** on the counting device: the same streams through [`WrRing`]
//!   (`ibv_wr_start` / `ibv_wr_*` / `ibv_wr_complete`) and [`ExCqPoller`] (`ibv_start_poll` /
//!   `ibv_next_poll` / `ibv_end_poll`, no field readers: the CQ serves one QP), and the
//!   extended poll alone.
//! - **ping-pong** on softnic, both QPs driven by one thread in turn (the software cost of a
//!   round trip, without cross-thread noise): hotverbs `send_now` + [`RecvRing`] +
//!   [`CqPoller`] vs fresh WRs, one receive re-posted per message, one CQE per poll.
//!
//! Measured parts are `#[inline(never)]` functions named `hv_measured_*`, so callgrind can
//! count them alone (`--toggle-collect`).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs)]
// Bench and test harness types, not an API: no Debug needed.
#![allow(missing_debug_implementations)]

pub mod direct;
pub mod naive;

use std::mem::MaybeUninit;
use std::pin::Pin;
use std::ptr;
use std::time::{Duration, Instant};

use hotverbs::{AccessFlags, Context, Cq, Mr, Pd, Qp, QpBuilder, QpType, SOFTNIC};
use hotverbs_datapath::{
    CqPoller, ExCqPoller, ExFields, Local, LocalBuf, Msg, PollCq, PostBatch, PostRing, RecvConfig,
    RecvRing, RecvTarget, RemoteBuf, SendConfig, SendError, SendRing, WrRing,
};
use hotverbs_ffi::inline::ibv_post_send;
use hotverbs_ffi::{
    ibv_cq, ibv_qp, ibv_send_wr, IBV_SEND_INLINE, IBV_SEND_SIGNALED, IBV_WC_RECV, IBV_WR_SEND,
};
use hotverbs_softnic::counting::CountingDevice;

use crate::naive::{NaiveError, NaiveFan, NaivePoster};

/// The message of every workload (an order-sized payload, sent inline).
pub const MSG: [u8; 32] = [0x5a; 32];
/// Send queue depth / window of the streaming workloads.
pub const DEPTH: u32 = 128;
/// hotverbs' signal period in the streaming workloads.
pub const SIGNAL_EVERY: u32 = 32;
/// Ring capacity (>= [`DEPTH`], a power of two).
pub const RING_N: usize = 128;
/// Completions per poll for hotverbs.
pub const BURST: usize = 32;
/// Completions queued per fill in the poll workloads.
pub const FILL: usize = 256;
/// Ring ids.
const SEND_ID: u8 = 1;
const RECV_ID: u8 = 2;
/// Receive slots per side in the ping-pong.
pub const RX: u32 = 32;
/// Send queue depth (and window) of each ring in the many-rings workloads.
pub const FAN_DEPTH: u32 = 64;
/// Their signal period (the streams' [`SIGNAL_EVERY`]): at most `FAN_DEPTH / FAN_SIGNAL`
/// signaled WRs in flight per ring.
pub const FAN_SIGNAL: u32 = SIGNAL_EVERY;
/// Their ring capacity (= [`FAN_DEPTH`]).
pub const FAN_N: usize = 64;
/// The ring counts of the many-rings workloads.
pub const FAN_KS: [usize; 3] = [1, 16, 256];

fn s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl From<NaiveError> for String {
    fn from(e: NaiveError) -> String {
        e.to_string()
    }
}

/// Two connected RC QPs on softnic, each with its own CQ and a 64 KiB buffer.
/// Field order is drop order (QPs before CQs and MRs).
pub struct SoftnicPair {
    /// QP A.
    pub a: Qp,
    /// QP B (connected to A).
    pub b: Qp,
    /// A's CQ (sends and receives).
    pub cq_a: Cq,
    /// B's CQ.
    pub cq_b: Cq,
    /// A's buffer.
    pub mr_a: Mr<'static>,
    /// B's buffer.
    pub mr_b: Mr<'static>,
    _pd: Pd,
    _ctx: Context,
}

impl SoftnicPair {
    /// Opens softnic and connects two QPs (depth [`DEPTH`], inline 64, [`RX`] receives).
    pub fn new() -> Result<SoftnicPair, String> {
        let ctx = Context::open(SOFTNIC).map_err(s)?;
        let pd = ctx.alloc_pd().map_err(s)?;
        let cq_a = ctx.create_cq(1024, None).map_err(s)?;
        let cq_b = ctx.create_cq(1024, None).map_err(s)?;
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr_a = pd.alloc_mr(64 << 10, access).map_err(s)?;
        let mr_b = pd.alloc_mr(64 << 10, access).map_err(s)?;
        let (a, b) = (
            rc_qp(&pd, &cq_a, DEPTH, RX * 2)?,
            rc_qp(&pd, &cq_b, DEPTH, RX * 2)?,
        );
        connect_rc(&ctx, &a, &b)?;
        Ok(SoftnicPair {
            a,
            b,
            cq_a,
            cq_b,
            mr_a,
            mr_b,
            _pd: pd,
            _ctx: ctx,
        })
    }

    /// B's buffer as a WRITE target for A.
    pub fn b_window(&self) -> RemoteBuf {
        RemoteBuf::new(self.mr_b.addr(), self.mr_b.len() as u64, self.mr_b.rkey())
    }
}

/// An RC QP on softnic completing on `cq` (sends and receives), 64 bytes of inline data,
/// `sq_sig_all = 0`.
fn rc_qp(pd: &Pd, cq: &Cq, max_send_wr: u32, max_recv_wr: u32) -> Result<Qp, String> {
    QpBuilder::new(pd, cq, cq, QpType::Rc)
        .max_send_wr(max_send_wr)
        .max_recv_wr(max_recv_wr)
        .max_inline_data(64)
        .build()
        .map_err(s)
}

/// Connects `a` and `b` (loopback, port 1 of `ctx`).
fn connect_rc(ctx: &Context, a: &Qp, b: &Qp) -> Result<(), String> {
    let port = ctx.port_info(None, None).map_err(s)?;
    let opts = hotverbs::ConnectOptions::default();
    a.connect(&port, &b.endpoint(&port), &opts).map_err(s)?;
    b.connect(&port, &a.endpoint(&port), &opts).map_err(s)?;
    Ok(())
}

/// Where a streaming workload runs.
pub enum Target {
    /// The counting device: SENDs, completions queued by `post_send`, no data moved.
    Counting(Pin<Box<CountingDevice>>),
    /// softnic: RDMA WRITEs from A into B.
    Softnic(Box<SoftnicPair>),
}

impl Target {
    /// A fresh counting device.
    pub fn counting() -> Target {
        Target::Counting(CountingDevice::new(4096))
    }

    /// A fresh softnic pair.
    pub fn softnic() -> Result<Target, String> {
        Ok(Target::Softnic(Box::new(SoftnicPair::new()?)))
    }

    /// The posting QP.
    pub fn qp(&self) -> *mut ibv_qp {
        match self {
            Target::Counting(d) => d.qp(),
            Target::Softnic(p) => p.a.as_raw(),
        }
    }

    /// Its CQ.
    pub fn cq(&self) -> *mut ibv_cq {
        match self {
            Target::Counting(d) => d.cq(),
            Target::Softnic(p) => p.cq_a.as_raw(),
        }
    }

    /// The WRITE target (softnic) or `None` (SENDs on the counting device).
    pub fn remote(&self) -> Option<RemoteBuf> {
        match self {
            Target::Counting(_) => None,
            Target::Softnic(p) => Some(p.b_window()),
        }
    }

    /// The naive poster for this target.
    pub fn naive(&self) -> NaivePoster {
        // SAFETY: the QP and CQ belong to self, which outlives the poster in every workload
        // (they are used together and dropped after); the QP holds DEPTH WRs.
        let p = unsafe { NaivePoster::new(self.qp(), self.cq(), DEPTH) };
        match self.remote() {
            Some(r) => p.writes_to(r.addr, r.rkey),
            None => p,
        }
    }

    /// hotverbs' streamer with post lists of `batch`.
    pub fn ring(&self, batch: u32) -> Result<RingStream, String> {
        // SAFETY: as for `naive`: the QP (sq_sig_all = 0, DEPTH WRs, 64 B inline) and CQ
        // outlive the streamer and nothing else posts to or polls them meanwhile.
        unsafe { RingStream::new(self.qp(), self.cq(), batch, self.remote()) }
    }
}

/// hotverbs' streaming side: a send ring and a poller.
pub struct RingStream {
    ring: Box<SendRing<RING_N>>,
    poller: CqPoller<BURST>,
    write: bool,
}

impl RingStream {
    /// # Safety
    /// `qp` and `cq` are live, the QP was created with `sq_sig_all = 0`, at least [`DEPTH`]
    /// send WRs and 64 bytes of inline data, and nothing else uses them while the streamer
    /// lives.
    pub unsafe fn new(
        qp: *mut ibv_qp,
        cq: *mut ibv_cq,
        batch: u32,
        remote: Option<RemoteBuf>,
    ) -> Result<RingStream, String> {
        let mut cfg = SendConfig::new(SEND_ID, DEPTH, 64)
            .signal_every(SIGNAL_EVERY)
            .batch(batch);
        if let Some(r) = remote {
            cfg = cfg.remote(r);
        }
        let mut slot: Box<MaybeUninit<SendRing<RING_N>>> = Box::new_uninit();
        // SAFETY: forwarded contract.
        unsafe { SendRing::init_in(&mut slot, qp, cfg) }.map_err(s)?;
        // SAFETY: init_in succeeded, so the ring is initialised.
        let ring = unsafe { slot.assume_init() };
        Ok(RingStream {
            ring,
            // SAFETY: forwarded contract (the CQ is polled only here).
            poller: unsafe { CqPoller::new(cq) },
            write: remote.is_some(),
        })
    }
}

/// The streams drain by polling until nothing is outstanding, so their last WR must be a
/// signaled one: `n` a multiple of [`SIGNAL_EVERY`] (else they would wait forever).
pub fn whole_stream(n: u64) -> Result<(), String> {
    if n % SIGNAL_EVERY as u64 == 0 {
        Ok(())
    } else {
        Err(format!(
            "a stream of {n} messages: the count must be a multiple of {SIGNAL_EVERY} (its last WR signaled) to drain"
        ))
    }
}

/// Streaming, naive: `n` messages, every completion reaped.
#[inline(never)]
pub fn hv_measured_stream_naive(p: &mut NaivePoster, msg: &[u8], n: u64) -> Result<u64, String> {
    Ok(p.stream(msg, n)?)
}

/// Streaming, hotverbs: `n` messages (a multiple of [`SIGNAL_EVERY`], so the last one is
/// signaled), every completion reaped.
#[inline(never)]
pub fn hv_measured_stream_ring(r: &mut RingStream, msg: &[u8], n: u64) -> Result<u64, String> {
    whole_stream(n)?;
    if n % SIGNAL_EVERY as u64 != 0 {
        return Err(format!("n = {n} must be a multiple of {SIGNAL_EVERY}"));
    }
    // One loop per opcode, as an application with a known message kind would write it.
    if r.write {
        stream_ring(r, Msg::write(Local::Inline(msg), 0), n)
    } else {
        stream_ring(r, Msg::send(Local::Inline(msg)), n)
    }
}

#[inline(always)]
fn stream_ring(r: &mut RingStream, m: Msg<'_>, n: u64) -> Result<u64, String> {
    let RingStream { ring, poller, .. } = r;
    let ring: &mut SendRing<RING_N> = ring;
    let mut left = n;
    while left > 0 {
        let mut b = ring.batch();
        while left > 0 {
            match b.push(m) {
                Ok(_) => left -= 1,
                Err(SendError::WouldBlock) => break,
                Err(e) => return Err(s(e)),
            }
        }
        b.finish().map_err(s)?;
        for c in poller.poll().map_err(s)? {
            ring.on_completion(c).map_err(s)?;
        }
    }
    while ring.outstanding() > 0 {
        for c in poller.poll().map_err(s)? {
            ring.on_completion(c).map_err(s)?;
        }
    }
    Ok(n)
}

/// Streaming, hotverbs, one latency-critical message at a time: `n` messages (a multiple
/// of [`SIGNAL_EVERY`]), each posted alone by [`SendRing::send_now`] (stage and post: one
/// doorbell per message), every completion reaped.
#[inline(never)]
pub fn hv_measured_stream_send_now(r: &mut RingStream, msg: &[u8], n: u64) -> Result<u64, String> {
    whole_stream(n)?;
    if n % SIGNAL_EVERY as u64 != 0 {
        return Err(format!("n = {n} must be a multiple of {SIGNAL_EVERY}"));
    }
    if r.write {
        stream_send_now(r, Msg::write(Local::Inline(msg), 0), n)
    } else {
        stream_send_now(r, Msg::send(Local::Inline(msg)), n)
    }
}

#[inline(always)]
fn stream_send_now(r: &mut RingStream, m: Msg<'_>, n: u64) -> Result<u64, String> {
    let RingStream { ring, poller, .. } = r;
    let ring: &mut SendRing<RING_N> = ring;
    let mut left = n;
    while left > 0 {
        match ring.send_now(m) {
            Ok(_) => left -= 1,
            Err(SendError::WouldBlock) => {
                for c in poller.poll().map_err(s)? {
                    ring.on_completion(c).map_err(s)?;
                }
            }
            Err(e) => return Err(s(e)),
        }
    }
    while ring.outstanding() > 0 {
        for c in poller.poll().map_err(s)? {
            ring.on_completion(c).map_err(s)?;
        }
    }
    Ok(n)
}

/// hotverbs' streaming side on the extended verbs: a [`WrRing`] and an [`ExCqPoller`] on
/// the counting device's `ibv_qp_ex` / `ibv_cq_ex`.
pub struct WrStream {
    ring: WrRing,
    poller: ExCqPoller<BURST>,
    /// RDMA WRITEs (softnic) instead of SENDs (the counting device).
    write: bool,
}

impl WrStream {
    /// A stream with post lists of `batch` on `dev`.
    pub fn counting(dev: &CountingDevice, batch: u32) -> Result<WrStream, String> {
        let cfg = SendConfig::new(SEND_ID, DEPTH, 64)
            .signal_every(SIGNAL_EVERY)
            .batch(batch);
        // SAFETY: the device's extended QP and CQ outlive the stream (every workload drops
        // the stream before the device) and nothing else posts to or polls them meanwhile;
        // the CQ serves this one QP (with_qp_num) and has every reader.
        unsafe {
            Ok(WrStream {
                ring: WrRing::new(dev.qp_ex(), cfg).map_err(s)?,
                poller: ExCqPoller::new(dev.cq_ex(), ExFields::NONE, 0)
                    .map_err(s)?
                    .with_qp_num(hotverbs_softnic::counting::QP_NUM),
                write: false,
            })
        }
    }
}

impl WrStream {
    /// A stream with post lists of `batch` on softnic (the profile
    /// `HOTVERBS_SOFTNIC_PROFILE` selects): RDMA WRITEs from an extended RC QP into its
    /// connected peer's registered buffer, through raw verbs (`ibv_create_qp_ex` with
    /// `send_ops_flags`, `ibv_create_cq_ex`). The verbs objects are never destroyed (a bench
    /// process makes a few).
    pub fn softnic(batch: u32) -> Result<WrStream, String> {
        use hotverbs_ffi::inline::{ibv_cq_ex_to_cq, ibv_create_cq_ex, ibv_create_qp_ex};
        use hotverbs_ffi::*;
        use hotverbs_softnic::testing as t;
        let fns = hotverbs_softnic::verbs_table();
        // SAFETY: softnic's verbs called as their man pages say on objects made here, which
        // live until the process ends (leaked on purpose), as do the registered buffers.
        unsafe {
            let (ctx, _) = t::open_listed_device();
            let pd = t::alloc_pd(ctx);
            let gid = t::query_gid(ctx, 1);
            let side = || -> Result<(*mut ibv_cq_ex, *mut ibv_qp), String> {
                let mut ca = ibv_cq_init_attr_ex {
                    cqe: 4 * DEPTH,
                    wc_flags: IBV_WC_EX_WITH_QP_NUM as u64,
                    ..Default::default()
                };
                let cq = ibv_create_cq_ex(ctx, &mut ca);
                if cq.is_null() {
                    return Err(format!("ibv_create_cq_ex: errno {}", errno()));
                }
                let mut qa = ibv_qp_init_attr_ex {
                    send_cq: ibv_cq_ex_to_cq(cq),
                    recv_cq: ibv_cq_ex_to_cq(cq),
                    cap: ibv_qp_cap {
                        max_send_wr: DEPTH,
                        max_recv_wr: 1,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 64,
                    },
                    qp_type: IBV_QPT_RC,
                    comp_mask: IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                    pd,
                    send_ops_flags: (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND) as u64,
                    ..Default::default()
                };
                let qp = ibv_create_qp_ex(fns, ctx, &mut qa);
                if qp.is_null() {
                    return Err(format!("ibv_create_qp_ex: errno {}", errno()));
                }
                Ok((cq, qp))
            };
            let (cq_a, qp_a) = side()?;
            let (_, qp_b) = side()?;
            t::connect_qp(qp_a, &t::ConnectAttr::new((*qp_b).qp_num, gid));
            t::connect_qp(qp_b, &t::ConnectAttr::new((*qp_a).qp_num, gid));
            let buf: &'static mut [u8] = Box::leak(vec![0u8; 1 << 16].into_boxed_slice());
            let mr = t::reg_mr(pd, buf.as_mut_ptr(), buf.len(), t::ALL_ACCESS);
            let remote = RemoteBuf::new(buf.as_ptr() as u64, buf.len() as u64, (*mr).rkey);
            let qpx = fns.ibv_qp_to_qp_ex.ok_or("ibv_qp_to_qp_ex missing")?(qp_a);
            let cfg = SendConfig::new(SEND_ID, DEPTH, 64)
                .signal_every(SIGNAL_EVERY)
                .batch(batch)
                .remote(remote);
            Ok(WrStream {
                ring: WrRing::new(qpx, cfg).map_err(s)?,
                poller: ExCqPoller::new(cq_a, ExFields::QP_NUM, IBV_WC_EX_WITH_QP_NUM as u64)
                    .map_err(s)?,
                write: true,
            })
        }
    }
}

/// Streaming through [`WrRing`] batches: `n` messages (a multiple of [`SIGNAL_EVERY`]),
/// every completion reaped with the [`ExCqPoller`].
#[inline(never)]
pub fn hv_measured_stream_wr(r: &mut WrStream, msg: &[u8], n: u64) -> Result<u64, String> {
    whole_stream(n)?;
    if n % SIGNAL_EVERY as u64 != 0 {
        return Err(format!("n = {n} must be a multiple of {SIGNAL_EVERY}"));
    }
    if r.write {
        stream_wr(r, Msg::write(Local::Inline(msg), 0), n)
    } else {
        stream_wr(r, Msg::send(Local::Inline(msg)), n)
    }
}

#[inline(always)]
fn stream_wr(r: &mut WrStream, m: Msg<'_>, n: u64) -> Result<u64, String> {
    let WrStream { ring, poller, .. } = r;
    let mut left = n;
    while left > 0 {
        let mut b = ring.batch();
        while left > 0 {
            match b.push(m) {
                Ok(_) => left -= 1,
                Err(SendError::WouldBlock) => break,
                Err(e) => return Err(s(e)),
            }
        }
        b.finish().map_err(s)?;
        for c in poller.poll().map_err(s)? {
            ring.on_completion(c).map_err(s)?;
        }
    }
    while ring.outstanding() > 0 {
        for c in poller.poll().map_err(s)? {
            ring.on_completion(c).map_err(s)?;
        }
    }
    Ok(n)
}

/// The common surface ([`PostRing`] / [`PostBatch`] / [`PollCq`], issue 28): the same
/// streams as [`hv_measured_stream_send_now`] and [`hv_measured_stream_wr`], their loops
/// written once, generic over the ring and the poller. The `... via PostRing` rows measure
/// them against the inherent-method workloads (ratio of the totals).
#[inline(never)]
pub fn hv_measured_generic_send_now(r: &mut RingStream, msg: &[u8], n: u64) -> Result<u64, String> {
    whole_stream(n)?;
    if n % SIGNAL_EVERY as u64 != 0 {
        return Err(format!("n = {n} must be a multiple of {SIGNAL_EVERY}"));
    }
    if r.write {
        generic_stream_send_now(r, Msg::write(Local::Inline(msg), 0), n)
    } else {
        generic_stream_send_now(r, Msg::send(Local::Inline(msg)), n)
    }
}

#[inline(always)]
fn generic_stream_send_now(r: &mut RingStream, m: Msg<'_>, n: u64) -> Result<u64, String> {
    let RingStream { ring, poller, .. } = r;
    let ring: &mut SendRing<RING_N> = ring;
    send_now_loop(ring, poller, m, n)
}

/// [`hv_measured_stream_wr`] through the common surface.
#[inline(never)]
pub fn hv_measured_generic_wr(r: &mut WrStream, msg: &[u8], n: u64) -> Result<u64, String> {
    whole_stream(n)?;
    if n % SIGNAL_EVERY as u64 != 0 {
        return Err(format!("n = {n} must be a multiple of {SIGNAL_EVERY}"));
    }
    if r.write {
        generic_stream_wr(r, Msg::write(Local::Inline(msg), 0), n)
    } else {
        generic_stream_wr(r, Msg::send(Local::Inline(msg)), n)
    }
}

#[inline(always)]
fn generic_stream_wr(r: &mut WrStream, m: Msg<'_>, n: u64) -> Result<u64, String> {
    let WrStream { ring, poller, .. } = r;
    batch_loop(ring, poller, m, n)
}

/// `send_now` per message on any post path, every completion reaped.
#[inline(always)]
fn send_now_loop<R: PostRing, P: PollCq>(
    ring: &mut R,
    poller: &mut P,
    m: Msg<'_>,
    n: u64,
) -> Result<u64, String> {
    let mut left = n;
    while left > 0 {
        match ring.send_now(m) {
            Ok(_) => left -= 1,
            Err(SendError::WouldBlock) => {
                for c in poller.poll().map_err(s)? {
                    ring.on_completion(c).map_err(s)?;
                }
            }
            Err(e) => return Err(s(e)),
        }
    }
    while ring.outstanding() > 0 {
        for c in poller.poll().map_err(s)? {
            ring.on_completion(c).map_err(s)?;
        }
    }
    Ok(n)
}

/// Batches until full on any post path, every completion reaped.
#[inline(always)]
fn batch_loop<R: PostRing, P: PollCq>(
    ring: &mut R,
    poller: &mut P,
    m: Msg<'_>,
    n: u64,
) -> Result<u64, String> {
    let mut left = n;
    while left > 0 {
        let mut b = ring.batch();
        while left > 0 {
            match b.push(m) {
                Ok(_) => left -= 1,
                Err(SendError::WouldBlock) => break,
                Err(e) => return Err(s(e)),
            }
        }
        b.finish().map_err(s)?;
        for c in poller.poll().map_err(s)? {
            ring.on_completion(c).map_err(s)?;
        }
    }
    while ring.outstanding() > 0 {
        for c in poller.poll().map_err(s)? {
            ring.on_completion(c).map_err(s)?;
        }
    }
    Ok(n)
}

/// Streaming through [`WrRing::send_now`]: one region (one `ibv_wr_complete`) per message.
#[inline(never)]
pub fn hv_measured_stream_wr_now(r: &mut WrStream, msg: &[u8], n: u64) -> Result<u64, String> {
    whole_stream(n)?;
    if n % SIGNAL_EVERY as u64 != 0 {
        return Err(format!("n = {n} must be a multiple of {SIGNAL_EVERY}"));
    }
    if r.write {
        stream_wr_now(r, Msg::write(Local::Inline(msg), 0), n)
    } else {
        stream_wr_now(r, Msg::send(Local::Inline(msg)), n)
    }
}

#[inline(always)]
fn stream_wr_now(r: &mut WrStream, m: Msg<'_>, n: u64) -> Result<u64, String> {
    let WrStream { ring, poller, .. } = r;
    let mut left = n;
    while left > 0 {
        match ring.send_now(m) {
            Ok(_) => left -= 1,
            Err(SendError::WouldBlock) => {
                for c in poller.poll().map_err(s)? {
                    ring.on_completion(c).map_err(s)?;
                }
            }
            Err(e) => return Err(s(e)),
        }
    }
    while ring.outstanding() > 0 {
        for c in poller.poll().map_err(s)? {
            ring.on_completion(c).map_err(s)?;
        }
    }
    Ok(n)
}

/// Poll cost, extended CQ: reaps `n` completions, up to [`BURST`] per start/end poll.
#[inline(never)]
pub fn hv_measured_drain_ex(p: &mut ExCqPoller<BURST>, n: usize) -> Result<usize, String> {
    let mut got = 0;
    while got < n {
        for c in p.poll().map_err(s)? {
            c.status().map_err(s)?;
            got += 1;
        }
    }
    Ok(got)
}

/// Queues [`FILL`] successful completions on the counting device with one chained post
/// (not measured: the poll workloads' setup).
pub fn fill_counting_cq(dev: &CountingDevice, chain: &mut [ibv_send_wr]) -> Result<(), String> {
    let n = chain.len();
    let base = chain.as_mut_ptr();
    for (i, wr) in chain.iter_mut().enumerate() {
        wr.wr_id = i as u64;
        wr.opcode = IBV_WR_SEND;
        wr.num_sge = 0;
        wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
        wr.next = if i + 1 < n {
            // SAFETY: i + 1 < n: inside the slice.
            unsafe { base.add(i + 1) }
        } else {
            ptr::null_mut()
        };
    }
    let mut bad = ptr::null_mut();
    // SAFETY: the device's QP is live while `dev` is; the chain is NULL-terminated inside
    // `chain`, which outlives the call; no SGEs are referenced (num_sge = 0).
    match unsafe { ibv_post_send(dev.qp(), base, &mut bad) } {
        0 => Ok(()),
        e => Err(format!("ibv_post_send (fill) failed: errno {e}")),
    }
}

/// A zeroed chain for [`fill_counting_cq`].
pub fn fill_chain() -> Vec<ibv_send_wr> {
    // SAFETY: ibv_send_wr is plain C data; all-zero is valid.
    (0..FILL).map(|_| unsafe { std::mem::zeroed() }).collect()
}

/// Poll cost, naive: reaps `n` completions, one `ibv_poll_cq(cq, 1)` each.
///
/// # Safety
/// `cq` is a live CQ holding at least `n` completions.
#[inline(never)]
pub unsafe fn hv_measured_drain_single(cq: *mut ibv_cq, n: usize) -> Result<usize, String> {
    let mut got = 0;
    while got < n {
        // SAFETY: forwarded contract.
        if unsafe { naive::poll_one(cq) }?.is_some() {
            got += 1;
        }
    }
    Ok(got)
}

/// Poll cost, hotverbs: reaps `n` completions, up to [`BURST`] per call.
#[inline(never)]
pub fn hv_measured_drain_batch(p: &mut CqPoller<BURST>, n: usize) -> Result<usize, String> {
    let mut got = 0;
    while got < n {
        for c in p.poll().map_err(s)? {
            c.status().map_err(s)?;
            got += 1;
        }
    }
    Ok(got)
}

/// One side of the hotverbs ping-pong.
pub struct PingSide {
    send: Box<SendRing<RING_N>>,
    recv: Box<RecvRing<64>>,
    poller: CqPoller<8>,
}

impl PingSide {
    /// # Safety
    /// `qp`/`cq` are live and used only by this side; `buf` is registered with local write,
    /// at least `RX * 64` bytes, and used only by this side's receive ring.
    unsafe fn new(qp: *mut ibv_qp, cq: *mut ibv_cq, buf: LocalBuf) -> Result<PingSide, String> {
        let cfg = SendConfig::new(SEND_ID, 32, 64).signal_every(16).batch(1);
        let mut slot: Box<MaybeUninit<SendRing<RING_N>>> = Box::new_uninit();
        // SAFETY: forwarded contract.
        unsafe { SendRing::init_in(&mut slot, qp, cfg) }.map_err(s)?;
        // SAFETY: initialised by init_in.
        let send = unsafe { slot.assume_init() };
        // SAFETY: forwarded contract.
        let mut recv =
            unsafe { RecvRing::new(RecvTarget::Qp(qp), buf, RecvConfig::new(RECV_ID, 64, RX)) }
                .map_err(s)?;
        recv.fill().map_err(s)?;
        Ok(PingSide {
            send,
            recv: Box::new(recv),
            // SAFETY: forwarded contract.
            poller: unsafe { CqPoller::new(cq) },
        })
    }

    #[inline(always)]
    fn send(&mut self, msg: &[u8]) -> Result<(), String> {
        loop {
            match self.send.send_now(Msg::send(Local::Inline(msg))) {
                Ok(_) => return Ok(()),
                Err(SendError::WouldBlock) => {
                    self.wait_recv_or_retire(false)?;
                }
                Err(e) => return Err(s(e)),
            }
        }
    }

    /// Polls until a message arrives (`want_recv`) or until one poll returned anything.
    #[inline(always)]
    fn wait_recv_or_retire(&mut self, want_recv: bool) -> Result<(), String> {
        loop {
            let mut got_recv = false;
            let batch = self.poller.poll().map_err(s)?;
            let any = !batch.is_empty();
            for c in batch {
                if c.ring() == SEND_ID {
                    self.send.on_completion(c).map_err(s)?;
                } else {
                    let m = self.recv.on_completion(c).map_err(s)?;
                    self.recv.release(m).map_err(s)?;
                    got_recv = true;
                }
            }
            if got_recv || (!want_recv && any) {
                return Ok(());
            }
            std::hint::spin_loop();
        }
    }
}

/// K connected RC QP pairs on one softnic context: every sender's send completions go to
/// one shared CQ; the receivers (targets of RDMA WRITEs, so they see no completions) share
/// another. Field order is drop order (QPs before CQs and the MR).
pub struct SoftnicFan {
    /// The K posting QPs (depth [`FAN_DEPTH`], 64 B inline).
    pub senders: Vec<Qp>,
    /// Their peers.
    pub receivers: Vec<Qp>,
    /// The senders' shared CQ: `K * FAN_DEPTH` entries, enough for the naive poster's
    /// every-WR-signaled window on every QP (hotverbs needs `K * FAN_DEPTH / FAN_SIGNAL`).
    pub cq: Cq,
    /// The receivers' CQ (stays empty).
    pub cq_rx: Cq,
    /// The WRITE target, registered in the receivers' PD (one for all pairs).
    pub mr_rx: Mr<'static>,
    _pd: Pd,
    _ctx: Context,
}

impl SoftnicFan {
    /// Opens softnic and connects `k` pairs (`1 <= k <= 256`: one ring id each on the CQ).
    pub fn new(k: usize) -> Result<SoftnicFan, String> {
        if !(1..=256).contains(&k) {
            return Err(format!(
                "{k} rings on one CQ: 1..=256 (a ring id is a u8, unique per CQ)"
            ));
        }
        let ctx = Context::open(SOFTNIC).map_err(s)?;
        let pd = ctx.alloc_pd().map_err(s)?;
        let cq = ctx.create_cq(k as u32 * FAN_DEPTH, None).map_err(s)?;
        let cq_rx = ctx.create_cq(64, None).map_err(s)?;
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr_rx = pd.alloc_mr(64 << 10, access).map_err(s)?;
        let mut senders = Vec::with_capacity(k);
        let mut receivers = Vec::with_capacity(k);
        for _ in 0..k {
            let a = rc_qp(&pd, &cq, FAN_DEPTH, 1)?;
            let b = rc_qp(&pd, &cq_rx, 1, 1)?;
            connect_rc(&ctx, &a, &b)?;
            senders.push(a);
            receivers.push(b);
        }
        Ok(SoftnicFan {
            senders,
            receivers,
            cq,
            cq_rx,
            mr_rx,
            _pd: pd,
            _ctx: ctx,
        })
    }

    /// The WRITE target of every sender.
    pub fn remote(&self) -> RemoteBuf {
        RemoteBuf::new(
            self.mr_rx.addr(),
            self.mr_rx.len() as u64,
            self.mr_rx.rkey(),
        )
    }

    /// The naive poster over all K senders.
    pub fn naive(&self) -> NaiveFan {
        let qps: Vec<*mut ibv_qp> = self.senders.iter().map(|q| q.as_raw()).collect();
        let r = self.remote();
        // SAFETY: the QPs and CQ belong to self, which outlives the poster in every workload;
        // each QP holds FAN_DEPTH WRs and the CQ K * FAN_DEPTH completions.
        unsafe { NaiveFan::new(&qps, self.cq.as_raw(), FAN_DEPTH) }.writes_to(r.addr, r.rkey)
    }

    /// hotverbs' side: a ring per sender (ring id = its index), one poller on the CQ.
    pub fn rings(&self) -> Result<FanStream, String> {
        let mut rings = Vec::with_capacity(self.senders.len());
        for (id, qp) in self.senders.iter().enumerate() {
            let cfg = SendConfig::new(id as u8, FAN_DEPTH, 64)
                .signal_every(FAN_SIGNAL)
                .remote(self.remote());
            let mut slot: Box<MaybeUninit<SendRing<FAN_N>>> = Box::new_uninit();
            // SAFETY: the QP (sq_sig_all = 0, FAN_DEPTH WRs, 64 B inline) and the CQ outlive
            // the rings (every workload drops them first) and nothing else posts to the QP
            // or polls the CQ meanwhile; the ring id is unique on the CQ (k <= 256).
            unsafe { SendRing::init_in(&mut slot, qp.as_raw(), cfg) }.map_err(s)?;
            // SAFETY: init_in succeeded, so the ring is initialised.
            rings.push(unsafe { slot.assume_init() });
        }
        Ok(FanStream {
            rings,
            // SAFETY: as above: the CQ is polled only by this poller.
            poller: unsafe { CqPoller::new(self.cq.as_raw()) },
        })
    }
}

/// hotverbs' many-rings side: ring `i` posts on sender `i` with ring id `i`; one poller
/// drains the shared CQ.
pub struct FanStream {
    rings: Vec<Box<SendRing<FAN_N>>>,
    poller: CqPoller<BURST>,
}

/// Polls one burst from the shared CQ and hands each completion to its ring, found by its
/// ring id (an index: ring ids are 0..K). Returns how many it polled.
#[inline(always)]
fn fan_poll(
    rings: &mut [Box<SendRing<FAN_N>>],
    poller: &mut CqPoller<BURST>,
) -> Result<usize, String> {
    let batch = poller.poll().map_err(s)?;
    let got = batch.len();
    for c in batch {
        let Some(ring) = rings.get_mut(c.ring() as usize) else {
            return Err(format!(
                "a completion of ring {}, which is not ours",
                c.ring()
            ));
        };
        ring.on_completion(c).map_err(s)?;
    }
    Ok(got)
}

/// Posts `m` on ring `i` with [`SendRing::send_now`]; while the ring is full, polls and
/// routes bursts.
#[inline(always)]
fn fan_send(
    rings: &mut [Box<SendRing<FAN_N>>],
    poller: &mut CqPoller<BURST>,
    i: usize,
    m: Msg<'_>,
) -> Result<(), String> {
    loop {
        match rings[i].send_now(m) {
            Ok(_) => return Ok(()),
            Err(SendError::WouldBlock) => {
                fan_poll(rings, poller)?;
            }
            Err(e) => return Err(s(e)),
        }
    }
}

/// Many rings on one CQ, hotverbs: `n` messages (any count), [`SendRing::send_now`]
/// round-robin over the rings starting with ring 0; when the next ring is full, one burst is
/// polled and routed. Each ring's last message of the call is signaled
/// ([`SendRing::signal_next`]), so the final drain retires everything whatever `n` is (a
/// per-call constant of K extra signals, which `cargo xtask insn`'s difference cancels).
#[inline(never)]
pub fn hv_measured_fan_ring(f: &mut FanStream, msg: &[u8], n: u64) -> Result<u64, String> {
    let m = Msg::write(Local::Inline(msg), 0);
    let FanStream { rings, poller } = f;
    let k = rings.len();
    // The last `tail` messages of the call are each their ring's last.
    let tail = n.min(k as u64);
    let mut i = 0;
    for _ in 0..n - tail {
        fan_send(rings, poller, i, m)?;
        i += 1;
        if i == k {
            i = 0;
        }
    }
    for _ in 0..tail {
        rings[i].signal_next();
        fan_send(rings, poller, i, m)?;
        i += 1;
        if i == k {
            i = 0;
        }
    }
    // softnic completes a WR as it is posted, so a run of empty polls with WRs
    // outstanding means an unsignaled tail: an error, not a hang.
    let mut empty = 0u32;
    for i in 0..k {
        while rings[i].outstanding() > 0 {
            if fan_poll(rings, poller)? > 0 {
                empty = 0;
            } else if empty == 1 << 20 {
                return Err(format!(
                    "ring {i}: {} WRs outstanding and no completion comes (unsignaled tail?)",
                    rings[i].outstanding()
                ));
            } else {
                empty += 1;
            }
        }
    }
    Ok(n)
}

/// Many rings on one CQ, naive: `n` messages round-robin over the QPs, every completion
/// reaped.
#[inline(never)]
pub fn hv_measured_fan_naive(p: &mut NaiveFan, msg: &[u8], n: u64) -> Result<u64, String> {
    Ok(p.stream(msg, n)?)
}

/// Both sides of the hotverbs ping-pong on a [`SoftnicPair`].
pub struct RingPingPong {
    a: PingSide,
    b: PingSide,
}

impl RingPingPong {
    /// Builds both sides' rings (receives posted).
    pub fn new(p: &SoftnicPair) -> Result<RingPingPong, String> {
        let buf = |mr: &Mr<'static>| LocalBuf::new(mr.addr(), RX * 64, mr.lkey());
        // SAFETY: the pair's QPs, CQs and MRs outlive this struct in every workload (created
        // before, dropped after) and are used by it alone.
        unsafe {
            Ok(RingPingPong {
                a: PingSide::new(p.a.as_raw(), p.cq_a.as_raw(), buf(&p.mr_a))?,
                b: PingSide::new(p.b.as_raw(), p.cq_b.as_raw(), buf(&p.mr_b))?,
            })
        }
    }
}

/// Ping-pong, hotverbs: `n` round trips.
#[inline(never)]
pub fn hv_measured_pingpong_ring(pp: &mut RingPingPong, msg: &[u8], n: u64) -> Result<u64, String> {
    for _ in 0..n {
        pp.a.send(msg)?;
        pp.b.wait_recv_or_retire(true)?;
        pp.b.send(msg)?;
        pp.a.wait_recv_or_retire(true)?;
    }
    Ok(n)
}

/// The naive ping-pong's state: receives to re-post.
pub struct NaivePingPong {
    a: (*mut ibv_qp, *mut ibv_cq, u64, u32),
    b: (*mut ibv_qp, *mut ibv_cq, u64, u32),
}

impl NaivePingPong {
    /// Posts [`RX`] receives on each side.
    pub fn new(p: &SoftnicPair) -> Result<NaivePingPong, String> {
        let side =
            |qp: &Qp, cq: &Cq, mr: &Mr<'static>| (qp.as_raw(), cq.as_raw(), mr.addr(), mr.lkey());
        let pp = NaivePingPong {
            a: side(&p.a, &p.cq_a, &p.mr_a),
            b: side(&p.b, &p.cq_b, &p.mr_b),
        };
        for (qp, _, addr, lkey) in [pp.a, pp.b] {
            for i in 0..RX {
                // SAFETY: the pair's QP and MR are live; slot i of 64 bytes lies inside it.
                unsafe { naive::post_recv(qp, addr + i as u64 * 64, 64, lkey, i as u64) }?;
            }
        }
        Ok(pp)
    }
}

/// Waits for a receive completion, one CQE per poll (send completions are consumed on
/// the way), and re-posts a fresh receive for the slot.
///
/// # Safety
/// The side's handles are live.
#[inline(always)]
unsafe fn naive_wait_recv(side: (*mut ibv_qp, *mut ibv_cq, u64, u32)) -> Result<(), String> {
    let (qp, cq, addr, lkey) = side;
    loop {
        // SAFETY: live CQ (contract).
        if let Some(wc) = unsafe { naive::poll_one(cq) }? {
            if wc.opcode & IBV_WC_RECV != 0 {
                let slot = wc.wr_id;
                // SAFETY: live QP and MR (contract); the slot was just completed.
                unsafe { naive::post_recv(qp, addr + slot * 64, 64, lkey, slot) }?;
                return Ok(());
            }
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Ping-pong, naive: `n` round trips.
///
/// # Safety
/// The pair the state was made from is live.
#[inline(never)]
pub unsafe fn hv_measured_pingpong_naive(
    pp: &mut NaivePingPong,
    msg: &[u8],
    n: u64,
) -> Result<u64, String> {
    for i in 0..n {
        // SAFETY: live handles (contract).
        unsafe {
            naive::post_send_inline(pp.a.0, msg, i)?;
            naive_wait_recv(pp.b)?;
            naive::post_send_inline(pp.b.0, msg, i)?;
            naive_wait_recv(pp.a)?;
        }
    }
    Ok(n)
}

/// Median wall time per operation of `f`, which performs `n` operations per call, over
/// `reps` calls (after one unmeasured call): the benches' own side-by-side timing, from which
/// they print the ratio (criterion reports each function alone).
pub fn ns_per_op(reps: usize, n: u64, mut f: impl FnMut() -> Duration) -> f64 {
    let _ = f();
    let mut v: Vec<f64> = (0..reps.max(1))
        .map(|_| f().as_nanos() as f64 / n as f64)
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times one call of `f` (for [`ns_per_op`]).
pub fn timed<T>(f: impl FnOnce() -> T) -> Duration {
    let t = Instant::now();
    std::hint::black_box(f());
    t.elapsed()
}

/// The line every bench prints for a pair.
pub fn ratio_line(label: &str, naive_ns: f64, hotverbs_ns: f64) -> String {
    format!(
        "{label}: naive {naive_ns:.1} ns/op, hotverbs {hotverbs_ns:.1} ns/op, ratio hotverbs/naive = {:.2}",
        hotverbs_ns / naive_ns
    )
}

/// Every workload `insn-workload` knows: `(name, description)`.
pub const WORKLOADS: &[(&str, &str)] = &[
    ("stream-naive-counting", "naive poster, counting device"),
    (
        "stream-sendnow-counting",
        "SendRing::send_now per message, counting device",
    ),
    (
        "stream-ring1-counting",
        "SendRing post list 1, counting device",
    ),
    (
        "stream-ring8-counting",
        "SendRing post list 8, counting device",
    ),
    (
        "stream-ring32-counting",
        "SendRing post list 32, counting device",
    ),
    ("stream-naive-softnic", "naive poster, softnic"),
    (
        "stream-sendnow-softnic",
        "SendRing::send_now per message, softnic",
    ),
    ("stream-ring1-softnic", "SendRing post list 1, softnic"),
    ("stream-ring8-softnic", "SendRing post list 8, softnic"),
    ("stream-ring32-softnic", "SendRing post list 32, softnic"),
    ("poll-single-counting", "one CQE per ibv_poll_cq"),
    ("poll-batch-counting", "CqPoller, 32 per ibv_poll_cq"),
    (
        "stream-wr32-counting",
        "WrRing post list 32 + ExCqPoller, counting device",
    ),
    (
        "stream-sendnow-generic-counting",
        "stream-sendnow-counting written against PostRing / PollCq",
    ),
    (
        "stream-wr32-generic-counting",
        "stream-wr32-counting written against PostRing / PostBatch / PollCq",
    ),
    (
        "stream-wrnow-counting",
        "WrRing::send_now per message + ExCqPoller, counting device",
    ),
    (
        "stream-wr32-softnic",
        "WrRing post list 32 + ExCqPoller, softnic",
    ),
    (
        "stream-wrnow-softnic",
        "WrRing::send_now per message + ExCqPoller, softnic",
    ),
    (
        "poll-ex-counting",
        "ExCqPoller, 32 per ibv_start_poll..ibv_end_poll",
    ),
    (
        "stream-directnow-sim",
        "DirectRing::send_now per message (BlueFlame), simulated mlx5 queues",
    ),
    (
        "stream-direct32-sim",
        "DirectRing post list 32, simulated mlx5 queues",
    ),
    ("poll-direct-sim", "DirectPoller, 32 CQEs per poll"),
    (
        "stream-directnowfixed-sim",
        "DirectRing::send_now per message, [u8; 32] (length known at compile time)",
    ),
    (
        "stream-directsession-sim",
        "DirectSession::<32>::send per message (BlueFlame), held",
    ),
    (
        "stream-directlist-sim",
        "DirectRing::post_list of 32 [u8; 32] messages per call",
    ),
    (
        "stream-directwindow-sim",
        "DirectWindow::<32>, post lists of 32",
    ),
    (
        "floor-now-sim",
        "the direct lone post's stores alone: no check, no counter, no completion",
    ),
    (
        "floor-32-sim",
        "the direct post list 32's stores alone: no check, no counter, no completion",
    ),
    (
        "fan1-naive-softnic",
        "naive poster, 1 QP on one CQ, every WR signaled, softnic",
    ),
    (
        "fan1-ring-softnic",
        "SendRing::send_now, 1 ring on one CqPoller, routed by Completion::ring, softnic",
    ),
    (
        "fan16-naive-softnic",
        "naive poster round-robin over 16 QPs on one CQ (one CQE per poll, routed by wr_id), softnic",
    ),
    (
        "fan16-ring-softnic",
        "SendRing::send_now round-robin over 16 rings on one CqPoller, routed by Completion::ring, softnic",
    ),
    (
        "fan256-naive-softnic",
        "naive poster round-robin over 256 QPs on one CQ (one CQE per poll, routed by wr_id), softnic",
    ),
    (
        "fan256-ring-softnic",
        "SendRing::send_now round-robin over 256 rings (ring ids 0..=255) on one CqPoller, routed by Completion::ring, softnic",
    ),
    (
        "pingpong-naive-softnic",
        "naive ping-pong round trip, softnic",
    ),
    (
        "pingpong-ring-softnic",
        "hotverbs ping-pong round trip, softnic",
    ),
];

/// One row of `cargo xtask insn`'s table: hotverbs beside the naive baseline.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    /// What the row measures.
    pub name: &'static str,
    /// The naive workload.
    pub baseline: &'static str,
    /// hotverbs' workload.
    pub hotverbs: &'static str,
    /// Largest acceptable hotverbs/naive ratio of the total instructions.
    pub ratio: Option<f64>,
    /// Most instructions of our own code (the device's excluded) per unit.
    pub own: Option<f64>,
    /// `own` is a goal not yet met: `cargo xtask insn` reports it and does not gate on it.
    pub own_goal: bool,
    /// `ratio` is of the own-code counts, not the totals (against a floor row: no device).
    pub ratio_own: bool,
    /// `ratio` is a goal not yet met: reported, not gated.
    pub ratio_goal: bool,
    /// One unit of the workload's count: "msg", "completion" or "round trip".
    pub unit: &'static str,
}

const fn row(
    name: &'static str,
    baseline: &'static str,
    hotverbs: &'static str,
    ratio: Option<f64>,
    own: Option<f64>,
    unit: &'static str,
) -> Row {
    Row {
        name,
        baseline,
        hotverbs,
        ratio,
        own,
        own_goal: false,
        ratio_own: false,
        ratio_goal: false,
        unit,
    }
}

/// The rows `cargo xtask insn` tabulates (and gates on, where a target is set): our own code
/// at most 20 instructions per message at post list 32, at most 10 per completion polled, on
/// the counting device, and at most 45 for a lone `send_now` (its post included); the whole
/// at post list 32 at most half the naive poster's. The extended verbs (`WrRing`, `ExCqPoller`) make
/// one provider call per builder and setter (two per message, plus `ibv_wr_start` and
/// `ibv_wr_complete` per region) and one `ibv_next_poll` per completion, so their ceilings
/// are the measured cost with a little room (46.8 per message at post list 32, 68.5 per lone
/// `send_now`, 24.9 per completion when this was written), to catch regressions.
pub const ROWS: &[Row] = &[
    row(
        "stream, send_now, counting",
        "stream-naive-counting",
        "stream-sendnow-counting",
        None,
        Some(45.0),
        "msg",
    ),
    row(
        "stream, batch 1, counting",
        "stream-naive-counting",
        "stream-ring1-counting",
        None,
        None,
        "msg",
    ),
    row(
        "stream, batch 8, counting",
        "stream-naive-counting",
        "stream-ring8-counting",
        None,
        None,
        "msg",
    ),
    row(
        "stream, batch 32, counting",
        "stream-naive-counting",
        "stream-ring32-counting",
        Some(0.5),
        Some(20.0),
        "msg",
    ),
    row(
        "stream, send_now, softnic",
        "stream-naive-softnic",
        "stream-sendnow-softnic",
        None,
        None,
        "msg",
    ),
    row(
        "stream, batch 1, softnic",
        "stream-naive-softnic",
        "stream-ring1-softnic",
        None,
        None,
        "msg",
    ),
    row(
        "stream, batch 8, softnic",
        "stream-naive-softnic",
        "stream-ring8-softnic",
        None,
        None,
        "msg",
    ),
    row(
        "stream, batch 32, softnic",
        "stream-naive-softnic",
        "stream-ring32-softnic",
        None,
        None,
        "msg",
    ),
    row(
        "poll per completion, counting",
        "poll-single-counting",
        "poll-batch-counting",
        None,
        Some(10.0),
        "completion",
    ),
    row(
        "stream, wr batch 32, counting",
        "stream-naive-counting",
        "stream-wr32-counting",
        Some(0.5),
        Some(50.0),
        "msg",
    ),
    row(
        "stream, wr send_now, counting",
        "stream-naive-counting",
        "stream-wrnow-counting",
        None,
        Some(75.0),
        "msg",
    ),
    // The common surface costs nothing: the same loop through the traits against the
    // inherent calls (ratio of the totals, so the device's share cancels).
    row(
        "stream, send_now via PostRing, counting",
        "stream-sendnow-counting",
        "stream-sendnow-generic-counting",
        Some(1.0),
        None,
        "msg",
    ),
    row(
        "wr batch 32 via PostRing, counting",
        "stream-wr32-counting",
        "stream-wr32-generic-counting",
        Some(1.0),
        None,
        "msg",
    ),
    row(
        "stream, wr batch 32, softnic",
        "stream-naive-softnic",
        "stream-wr32-softnic",
        None,
        None,
        "msg",
    ),
    row(
        "stream, wr send_now, softnic",
        "stream-naive-softnic",
        "stream-wrnow-softnic",
        None,
        None,
        "msg",
    ),
    row(
        "poll ex per completion, counting",
        "poll-single-counting",
        "poll-ex-counting",
        None,
        Some(28.0),
        "completion",
    ),
    // The direct path (issue 29), against the floor rows (the direct ring's stores alone,
    // measured in the same run): a held fixed-size session at most 40 own instructions per
    // lone post (doorbell record, both sfences and the BlueFlame copy included); the
    // generic `send_now(Msg)` at most 1.4x the floor; a post list of 32 through a window
    // at most 1.25x the floor. The mlx5 table has the same rows beside libmlx5's code.
    // The session's and send_now's targets are met and gated (send_now since its lone
    // runs); the window row is a goal (reported with its verdict, never failing --gate:
    // `post_list` meets the post-list target).
    row(
        "direct session [u8; 32], mlx5 sim",
        "floor-now-sim",
        "stream-directsession-sim",
        None,
        Some(40.0),
        "msg",
    ),
    Row {
        ratio_own: true,
        ..row(
            "direct send_now [u8; 32], mlx5 sim",
            "floor-now-sim",
            "stream-directnowfixed-sim",
            Some(1.4),
            None,
            "msg",
        )
    },
    Row {
        ratio_own: true,
        ratio_goal: true,
        ..row(
            "direct window 32, mlx5 sim",
            "floor-32-sim",
            "stream-directwindow-sim",
            Some(1.25),
            None,
            "msg",
        )
    },
    Row {
        ratio_own: true,
        ..row(
            "direct post_list 32, mlx5 sim",
            "floor-32-sim",
            "stream-directlist-sim",
            Some(1.25),
            None,
            "msg",
        )
    },
    // The generic paths: a run-time length (`&[u8]`) and `DirectBatch` (no targets).
    row(
        "direct send_now &[u8], mlx5 sim",
        "stream-sendnow-counting",
        "stream-directnow-sim",
        None,
        None,
        "msg",
    ),
    row(
        "direct batch 32, mlx5 sim",
        "stream-ring32-counting",
        "stream-direct32-sim",
        None,
        None,
        "msg",
    ),
    row(
        "poll direct per completion, mlx5 sim",
        "poll-batch-counting",
        "poll-direct-sim",
        None,
        None,
        "completion",
    ),
    // Issue 28: K rings completing on one CQ, measured, not gated.
    row(
        "stream per message, 1 ring on one CQ",
        "fan1-naive-softnic",
        "fan1-ring-softnic",
        None,
        None,
        "msg",
    ),
    row(
        "stream per message, 16 rings on one CQ",
        "fan16-naive-softnic",
        "fan16-ring-softnic",
        None,
        None,
        "msg",
    ),
    row(
        "stream per message, 256 rings on one CQ",
        "fan256-naive-softnic",
        "fan256-ring-softnic",
        None,
        None,
        "msg",
    ),
    row(
        "ping-pong round trip, softnic",
        "pingpong-naive-softnic",
        "pingpong-ring-softnic",
        None,
        None,
        "round trip",
    ),
];

/// Runs workload `name` for `n` messages (or completions, or round trips) after a warm-up
/// of one batch, and returns the count. Used by `insn-workload` and the tests.
pub fn run_workload(name: &str, n: u64) -> Result<u64, String> {
    let warm = SIGNAL_EVERY as u64 * 4;
    let stream = |t: Target, batch: Option<u32>| -> Result<u64, String> {
        match batch {
            None => {
                let mut p = t.naive();
                hv_measured_stream_naive(&mut p, &MSG, warm)?;
                hv_measured_stream_naive(&mut p, &MSG, n)
            }
            Some(b) => {
                let mut r = t.ring(b)?;
                hv_measured_stream_ring(&mut r, &MSG, warm)?;
                hv_measured_stream_ring(&mut r, &MSG, n)
            }
        }
    };
    let stream_now = |t: Target| -> Result<u64, String> {
        let mut r = t.ring(SIGNAL_EVERY)?;
        hv_measured_stream_send_now(&mut r, &MSG, warm)?;
        hv_measured_stream_send_now(&mut r, &MSG, n)
    };
    match name {
        "stream-naive-counting" => stream(Target::counting(), None),
        "stream-sendnow-counting" => stream_now(Target::counting()),
        "stream-sendnow-generic-counting" => {
            // The device outlives the ring (a temporary would not).
            let t = Target::counting();
            let mut r = t.ring(SIGNAL_EVERY)?;
            hv_measured_generic_send_now(&mut r, &MSG, warm)?;
            hv_measured_generic_send_now(&mut r, &MSG, n)
        }
        "stream-wr32-generic-counting" => {
            let dev = CountingDevice::new(4096);
            let mut r = WrStream::counting(&dev, SIGNAL_EVERY)?;
            hv_measured_generic_wr(&mut r, &MSG, warm)?;
            hv_measured_generic_wr(&mut r, &MSG, n)
        }
        "stream-ring1-counting" => stream(Target::counting(), Some(1)),
        "stream-ring8-counting" => stream(Target::counting(), Some(8)),
        "stream-ring32-counting" => stream(Target::counting(), Some(32)),
        "stream-naive-softnic" => stream(Target::softnic()?, None),
        "stream-sendnow-softnic" => stream_now(Target::softnic()?),
        "stream-ring1-softnic" => stream(Target::softnic()?, Some(1)),
        "stream-ring8-softnic" => stream(Target::softnic()?, Some(8)),
        "stream-ring32-softnic" => stream(Target::softnic()?, Some(32)),
        "stream-wr32-softnic" | "stream-wrnow-softnic" => {
            let mut r = WrStream::softnic(SIGNAL_EVERY)?;
            if name == "stream-wr32-softnic" {
                hv_measured_stream_wr(&mut r, &MSG, warm)?;
                hv_measured_stream_wr(&mut r, &MSG, n)
            } else {
                hv_measured_stream_wr_now(&mut r, &MSG, warm)?;
                hv_measured_stream_wr_now(&mut r, &MSG, n)
            }
        }
        "stream-wr32-counting" | "stream-wrnow-counting" => {
            let dev = CountingDevice::new(4096);
            let mut r = WrStream::counting(&dev, SIGNAL_EVERY)?;
            if name == "stream-wr32-counting" {
                hv_measured_stream_wr(&mut r, &MSG, warm)?;
                hv_measured_stream_wr(&mut r, &MSG, n)
            } else {
                hv_measured_stream_wr_now(&mut r, &MSG, warm)?;
                hv_measured_stream_wr_now(&mut r, &MSG, n)
            }
        }
        "poll-single-counting" | "poll-batch-counting" | "poll-ex-counting" => {
            let dev = CountingDevice::new(FILL * 2);
            let mut chain = fill_chain();
            // SAFETY: the device's CQ lives as long as `dev`, polled only here.
            let mut poller = unsafe { CqPoller::<BURST>::new(dev.cq()) };
            // SAFETY: the same CQ as an extended CQ (every reader filled); it is polled by
            // one of the two pollers at a time, on this thread.
            let mut ex = unsafe { ExCqPoller::<BURST>::new(dev.cq_ex(), ExFields::NONE, 0) }
                .map_err(s)?
                .with_qp_num(hotverbs_softnic::counting::QP_NUM);
            let mut done = 0u64;
            while done < n {
                fill_counting_cq(&dev, &mut chain)?;
                let k = FILL.min((n - done) as usize);
                if name == "poll-single-counting" {
                    // SAFETY: the CQ holds FILL >= k completions.
                    unsafe { hv_measured_drain_single(dev.cq(), k) }?;
                } else if name == "poll-ex-counting" {
                    hv_measured_drain_ex(&mut ex, k)?;
                } else {
                    hv_measured_drain_batch(&mut poller, k)?;
                }
                // Drop what a partial last round left.
                while !poller.poll().map_err(s)?.is_empty() {}
                done += k as u64;
            }
            Ok(done)
        }
        "stream-directnow-sim" => {
            let mut r = direct::DirectStream::new(SIGNAL_EVERY)?;
            direct::hv_measured_stream_direct_now(&mut r, &MSG, warm)?;
            direct::hv_measured_stream_direct_now(&mut r, &MSG, n)
        }
        "stream-direct32-sim" => {
            let mut r = direct::DirectStream::new(32)?;
            direct::hv_measured_stream_direct(&mut r, &MSG, warm)?;
            direct::hv_measured_stream_direct(&mut r, &MSG, n)
        }
        "stream-directnowfixed-sim" | "stream-directsession-sim" => {
            let mut r = direct::DirectStream::new(SIGNAL_EVERY)?;
            let f = if name == "stream-directsession-sim" {
                direct::hv_measured_stream_direct_session
            } else {
                direct::hv_measured_stream_direct_now_fixed
            };
            f(&mut r, &MSG, warm)?;
            f(&mut r, &MSG, n)
        }
        "stream-directlist-sim" => {
            let mut r = direct::DirectStream::new(32)?;
            let msgs = [MSG; 32];
            direct::hv_measured_stream_direct_list(&mut r, &msgs, warm)?;
            direct::hv_measured_stream_direct_list(&mut r, &msgs, n)
        }
        "stream-directwindow-sim" => {
            let mut r = direct::DirectStream::new(32)?;
            direct::hv_measured_stream_direct_window(&mut r, &MSG, warm)?;
            direct::hv_measured_stream_direct_window(&mut r, &MSG, n)
        }
        "floor-now-sim" | "floor-32-sim" => {
            let mut f = direct::Floor::new(0);
            let g = if name == "floor-now-sim" {
                direct::hv_measured_floor_now
            } else {
                direct::hv_measured_floor_32
            };
            g(&mut f, &MSG, warm);
            Ok(g(&mut f, &MSG, n))
        }
        "poll-direct-sim" => direct::poll_direct(n),
        "fan1-naive-softnic"
        | "fan1-ring-softnic"
        | "fan16-naive-softnic"
        | "fan16-ring-softnic"
        | "fan256-naive-softnic"
        | "fan256-ring-softnic" => {
            let (k, kind) = name
                .strip_prefix("fan")
                .and_then(|r| r.strip_suffix("-softnic"))
                .and_then(|r| r.split_once('-'))
                .ok_or("bad fan workload name")?;
            let fan = SoftnicFan::new(k.parse().map_err(s)?)?;
            if kind == "naive" {
                let mut p = fan.naive();
                hv_measured_fan_naive(&mut p, &MSG, warm)?;
                hv_measured_fan_naive(&mut p, &MSG, n)
            } else {
                let mut r = fan.rings()?;
                hv_measured_fan_ring(&mut r, &MSG, warm)?;
                hv_measured_fan_ring(&mut r, &MSG, n)
            }
        }
        "pingpong-naive-softnic" => {
            let pair = SoftnicPair::new()?;
            let mut pp = NaivePingPong::new(&pair)?;
            // SAFETY: `pair` outlives these calls.
            unsafe {
                hv_measured_pingpong_naive(&mut pp, &MSG, warm)?;
                hv_measured_pingpong_naive(&mut pp, &MSG, n)
            }
        }
        "pingpong-ring-softnic" => {
            let pair = SoftnicPair::new()?;
            let mut pp = RingPingPong::new(&pair)?;
            hv_measured_pingpong_ring(&mut pp, &MSG, warm)?;
            hv_measured_pingpong_ring(&mut pp, &MSG, n)
        }
        other => Err(format!(
            "unknown workload {other:?}; known: {}",
            WORKLOADS.iter().map(|w| w.0).collect::<Vec<_>>().join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_streams_post_what_they_claim() {
        // Naive: one doorbell and one signaled WR per message.
        let t = Target::counting();
        let Target::Counting(dev) = &t else {
            unreachable!()
        };
        let mut p = t.naive();
        hv_measured_stream_naive(&mut p, &MSG, 256).unwrap();
        assert_eq!(dev.send_wrs(), 256);
        assert_eq!(dev.doorbells(), 256);
        assert_eq!(p.outstanding(), 0);
        assert_eq!(dev.queued_cqes(), 0, "every completion reaped");
    }

    #[test]
    fn ring_stream_batches_doorbells_and_reaps_everything() {
        for batch in [1u32, 8, 32] {
            let t = Target::counting();
            let Target::Counting(dev) = &t else {
                unreachable!()
            };
            let mut r = t.ring(batch).unwrap();
            hv_measured_stream_ring(&mut r, &MSG, 1024).unwrap();
            assert_eq!(dev.send_wrs(), 1024, "batch {batch}");
            assert_eq!(dev.doorbells(), 1024 / batch as u64, "batch {batch}");
            assert_eq!(r.ring.outstanding(), 0);
            assert_eq!(dev.queued_cqes(), 0, "batch {batch}");
            // Selective signaling: far fewer polls than messages.
            assert!(
                dev.polls() < 1024 / 4,
                "batch {batch}: {} polls",
                dev.polls()
            );
        }
        assert!(
            hv_measured_stream_ring(&mut Target::counting().ring(1).unwrap(), &MSG, 33).is_err()
        );
    }

    #[test]
    fn poll_workloads_reap_exactly_n() {
        assert_eq!(run_workload("poll-single-counting", 600).unwrap(), 600);
        assert_eq!(run_workload("poll-batch-counting", 600).unwrap(), 600);
        assert_eq!(run_workload("poll-ex-counting", 600).unwrap(), 600);
    }

    #[test]
    fn wr_streams_batch_doorbells_and_reap_everything() {
        let dev = CountingDevice::new(4096);
        let mut r = WrStream::counting(&dev, SIGNAL_EVERY).unwrap();
        hv_measured_stream_wr(&mut r, &MSG, 1024).unwrap();
        assert_eq!(dev.send_wrs(), 1024);
        assert_eq!(dev.doorbells(), 1024 / SIGNAL_EVERY as u64);
        assert_eq!(r.ring.outstanding(), 0);
        assert_eq!(dev.queued_cqes(), 0);
        hv_measured_stream_wr_now(&mut r, &MSG, 256).unwrap();
        assert_eq!(dev.send_wrs(), 1024 + 256);
        assert_eq!(dev.doorbells(), 1024 / SIGNAL_EVERY as u64 + 256);
        assert_eq!(dev.queued_cqes(), 0);
        for w in [
            "stream-wr32-counting",
            "stream-wrnow-counting",
            "stream-wr32-softnic",
            "stream-wrnow-softnic",
        ] {
            assert_eq!(run_workload(w, 256).unwrap(), 256, "{w}");
        }
    }

    #[test]
    fn softnic_workloads_run() {
        for w in [
            "stream-naive-softnic",
            "stream-sendnow-softnic",
            "stream-sendnow-counting",
            "stream-sendnow-generic-counting",
            "stream-wr32-generic-counting",
            "stream-ring8-softnic",
            "pingpong-naive-softnic",
            "pingpong-ring-softnic",
        ] {
            assert_eq!(run_workload(w, 256).unwrap(), 256, "{w}");
        }
    }

    #[test]
    fn fan_workloads_run() {
        for w in [
            "fan1-naive-softnic",
            "fan1-ring-softnic",
            "fan16-naive-softnic",
            "fan16-ring-softnic",
            "fan256-naive-softnic",
            "fan256-ring-softnic",
        ] {
            assert_eq!(run_workload(w, 600).unwrap(), 600, "{w}");
        }
    }

    #[test]
    fn fan_rings_share_one_cq_and_retire_everything() {
        for k in FAN_KS {
            let fan = SoftnicFan::new(k).unwrap();
            let mut r = fan.rings().unwrap();
            // Fewer messages than rings, then enough to fill every ring several times, then
            // a count no signal period divides: each call leaves nothing outstanding.
            for n in [k as u64 / 2, k as u64 * FAN_DEPTH as u64 * 3 + 7, 5] {
                assert_eq!(hv_measured_fan_ring(&mut r, &MSG, n).unwrap(), n, "k {k}");
                for (i, ring) in r.rings.iter().enumerate() {
                    assert_eq!(ring.ring_id() as usize, i);
                    assert_eq!(ring.outstanding(), 0, "k {k}, ring {i}, n {n}");
                }
            }
            let total: u64 = r.rings.iter().map(|g| g.posted_total()).sum();
            assert_eq!(
                total,
                k as u64 / 2 + k as u64 * FAN_DEPTH as u64 * 3 + 7 + 5
            );
            assert!(r.poller.poll().unwrap().is_empty(), "k {k}: CQ drained");
            let mut p = fan.naive();
            hv_measured_fan_naive(&mut p, &MSG, k as u64 * FAN_DEPTH as u64 * 2 + 3).unwrap();
            assert_eq!(p.outstanding(), 0);
        }
        assert!(SoftnicFan::new(0).is_err());
        assert!(SoftnicFan::new(257).is_err());
    }

    #[test]
    fn every_pair_names_known_workloads() {
        for r in ROWS {
            assert!(
                WORKLOADS.iter().any(|w| w.0 == r.baseline),
                "{}",
                r.baseline
            );
            assert!(
                WORKLOADS.iter().any(|w| w.0 == r.hotverbs),
                "{}",
                r.hotverbs
            );
        }
        assert!(run_workload("nope", 1).is_err());
    }
}
