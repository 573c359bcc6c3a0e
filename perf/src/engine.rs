//! The measured loops, on hotverbs' datapath: a send ring posts (batching, selective
//! signaling), a reaper drains completions in bursts, and a [`RecvRing`] keeps receives
//! posted. Setup (device, PD, MR, CQ, QPs, connection) is done elsewhere and arrives here as
//! raw handles in a [`Side`].
//!
//! # One engine, every post path
//! The loops are written once, in `impl<R: PostPath, C: Reap> Hot<R, C>`:
//! - `R` is the send ring, any of the datapath's [`PostRing`]s: `SendRing`
//!   (`ibv_post_send` of preformatted WRs, `--use_old_post_send`), `WrRing` (`ibv_wr_*`, the
//!   default) or `DirectRing` (mlx5 WQEs, `--direct`). [`PostPath`] adds what the datapath's
//!   trait leaves to the caller: the path's name and how a QP's ring is built.
//! - `C` is how the side reaps completions ([`Reap`]): one CQ through `ibv_poll_cq`
//!   (`CqPoller`), the extended CQ with each completion's timestamp (`--timestamps`,
//!   [`Stamped`](path::Stamped)), or `--direct`'s two CQs (the send CQ read directly, the
//!   receives through `ibv_poll_cq`, [`DirectCqs`](path::DirectCqs)). A perf-local trait rather than the datapath's
//!   [`PollCq`](hotverbs_datapath::PollCq) alone: `PollCq::poll` carries no timestamps and
//!   polls one CQ; the one-CQ reapers go through `PollCq::poll`, the other two wrap what
//!   `PollCq` cannot say.
//!
//! Everything that names a post path (the ring constructors, the reapers, the dispatch)
//! is in the `path` submodule; this file is the engine, written once. The `fixed` submodule
//! adds the direct path's fixed-size loops, where they apply: `send_lat` through a
//! [`DirectSession`](hotverbs_datapath::DirectSession) (one held session of `LEN`-byte
//! inline SENDs, one doorbell each) and `send_bw` through
//! [`DirectRing::post_list`](hotverbs_datapath::DirectRing::post_list) (one doorbell per
//! list), for the message sizes of `fixed::FIXED_LENS`; the header names the path that ran
//! ([`direct_path`]).
//!
//! [`build`] is the one place the run's post path is looked at: a five-arm `match` picks
//! `R` and `C` and boxes the engine as a [`dyn Engine`](Engine). Each `Hot<R, C>` is
//! compiled for its path (no branch on the path in any loop: the datapath's traits are
//! `#[inline(always)]` forwarding), and the caller crosses one vtable per call of
//! [`Engine::active`] / [`Engine::passive`], that is once per size, never per message.
//!
//! # Several QPs (`-q`)
//! A side has `-q` QPs (bandwidth tests; latency tests run one), each a [`Lane`]: its own
//! send ring and, for `send_bw`, its own receive ring, all sharing the side's CQ(s) (with
//! `--direct`, one send CQ whose poller serves every QP's SQ). Ring ids are distinct per
//! CQ: QP q's send ring is [`SEND_RING`]` + q` (1..=64), its receive ring
//! [`RECV_RING`]` | q` (128..=191): bit 7 tells the two kinds apart, the rest is the QP's
//! index, so routing a completion ([`Completion::ring`]) is a test and an index.
//!
//! The stream posts round-robin and work-conserving: the next QP with room takes the next
//! message (a full one is skipped, not waited for), so the per-QP counts show which QPs the
//! device kept busy. `-n` counts messages over all QPs. The last `-q` messages of a phase
//! (the final round) go one to each QP in turn, waiting for room if need be, each signaled
//! (so every ring drains to empty) and, for `send_bw`, each carrying [`LAST`]: the
//! receiver stops once it has seen one on every QP (QPs are not ordered with respect to
//! each other). Each QP's completed messages (its retired count) are reported per size, with
//! their fairness ([`crate::stats::Fairness`]).
//!
//! # Memory layout of a side's registered buffer
//! ```text
//! 0 .. S               source of SENDs/WRITEs, destination of READs and atomics
//! S .. 2S              landing zone: the peer WRITEs/READs/atomics here (advertised to it)
//! 2S .. 2S + Q*R*S     receive slots (R per QP, QP q's from 2S + q*R*S), for SEND tests
//! ```
//! where S is the largest message size rounded up to 64 bytes and Q the number of QPs. The
//! QPs of a side share the source and the landing zone (nobody reads what a bandwidth test
//! lands).
//!
//! # Who stops
//! The active side (client, or the main thread in loopback) decides when a size is over
//! (iterations or time). A passive side that takes part (the ping-pong partner, the receiver
//! of `send_bw`) learns it in band: the last SEND (of each QP) carries immediate data
//! [`LAST`], the last WRITE of `write_lat` carries [`LAST`] in its final byte. Every wait is
//! bounded by the stall timeout, so a dead peer is an error, not a hang.
//!
//! # Safety (module)
//! The raw handles of a [`Side`] must be live objects of one open device for the side's
//! lifetime; `mr` must lie in a registered MR with local write access; `remote` must be the
//! peer's landing zone. [`build`] (and `Hot::new`) is `unsafe` with that contract; all
//! other unsafe blocks in this module rely on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hotverbs::TimestampClock;
use hotverbs_datapath::mlx5::{DirectCq, DirectSq};
use hotverbs_datapath::{
    Completion, ExFields, Local, LocalBuf, Msg, PostRing, RecvConfig, RecvRing, RecvTarget,
    RemoteBuf, SendConfig, SendError, UdDest,
};
use hotverbs_ffi::{ibv_cq, ibv_cq_ex, ibv_qp, ibv_qp_ex};

use crate::cli::{Amount, AtomicKind, Connection, Params, TestKind};
use crate::clock::{clock, Clock};
use crate::error::PerfError;
use crate::progress::Counter;
use crate::stats::Latency;

#[macro_use]
mod fixed;
mod path;
pub use fixed::direct_path;
pub use path::{build, PostPath, Reap};

/// Ring id of the send ring of QP 0 in `wr_id`s; QP q's is `SEND_RING + q`.
pub const SEND_RING: u8 = 1;
/// Ring id of the receive ring of QP 0; QP q's is `RECV_RING | q` (bit 7: a receive ring).
pub const RECV_RING: u8 = 0x80;
/// Most QPs per side (`-q`): ring ids 1..=64 and 128..=191.
pub const MAX_QPS: u32 = 64;
/// Most QPs per side with `--direct`: the send queues one
/// [`DirectPoller`](hotverbs_datapath::DirectPoller) serves.
pub const DIRECT_MAX_QPS: u32 = 8;
/// Capacity of the rings (the largest `-t` / `-r`).
pub const RING_N: usize = 4096;
/// Completions per `ibv_poll_cq`.
pub const POLL_BURST: usize = 32;
/// Immediate data / final byte that marks a size's last message.
pub const LAST: u8 = 0xff;
/// Receive slots are capped so that `-a` (8 MiB messages) stays within this many bytes
/// (over all QPs of a side).
pub const RECV_BUDGET: u64 = 256 << 20;

/// The send ring id of QP `q` (`q < MAX_QPS`).
pub fn send_ring_id(q: usize) -> u8 {
    debug_assert!(q < MAX_QPS as usize);
    SEND_RING + q as u8
}

/// The receive ring id of QP `q` (`q < MAX_QPS`).
pub fn recv_ring_id(q: usize) -> u8 {
    debug_assert!(q < MAX_QPS as usize);
    RECV_RING | q as u8
}

/// Rounds a message size up to the slot granularity.
pub fn slot_size(max_size: u32) -> u32 {
    max_size.div_ceil(64).max(1) * 64
}

/// Bytes a UD receive adds before the message: the GRH slot (`ibv_post_recv(3)`).
pub const GRH: u32 = 40;

/// The slot of a run: its largest message, after the GRH over UD.
pub fn run_slot(p: &Params) -> u32 {
    let max = p.sizes.iter().copied().max().unwrap_or(1);
    slot_size(if p.connection == Connection::Ud {
        max + GRH
    } else {
        max
    })
}

/// Receive slots per QP for a run: `rx_depth`, capped by [`RING_N`] and by [`RECV_BUDGET`]
/// shared among the QPs, at least 2.
pub fn recv_count(p: &Params) -> u32 {
    if !p.uses_recv() {
        return 0;
    }
    let s = run_slot(p) as u64;
    let by_budget = (RECV_BUDGET / (s * p.qps.max(1) as u64)).max(2);
    (p.rx_depth as u64).min(by_budget).min(RING_N as u64) as u32
}

/// Bytes of registered memory a side needs.
pub fn buffer_len(p: &Params) -> u64 {
    let s = run_slot(p) as u64;
    2 * s + p.qps.max(1) as u64 * recv_count(p) as u64 * s
}

/// Released receive slots are re-posted in chains of this many (a quarter of the slots, at
/// most 16): one doorbell per chain, and never so many held back that the sender stalls.
pub fn recv_repost_batch(rx: u32) -> u32 {
    (rx / 4).clamp(1, 16)
}

/// Send queue depth each QP must grant (and its streaming window). For `send_bw` the
/// window is also kept below the receiver's slot count less one re-post chain, so a
/// receiver that re-posts in chains never runs dry (no RNR).
pub fn send_depth(p: &Params) -> u32 {
    let d = p.tx_depth.clamp(2, RING_N as u32);
    if p.test == TestKind::SendBw {
        let rx = recv_count(p);
        d.min(rx.saturating_sub(recv_repost_batch(rx)).max(1))
    } else {
        d
    }
}

/// Raw handles of one side, produced by the setup layer.
#[derive(Clone, Debug)]
pub struct Side {
    /// The QPs (`-q`; one for latency tests), in RTS, in the order the peer's are.
    pub qps: Vec<QpSide>,
    /// The CQ of every QP's send and receive completions (receives only with `--direct`).
    pub cq: *mut ibv_cq,
    /// The whole registered buffer ([`buffer_len`] bytes).
    pub mr: LocalBuf,
    /// The peer's landing zone.
    pub remote: RemoteBuf,
    /// The QPs' `max_inline_data`.
    pub max_inline: u32,
    /// Completion timestamps (`--timestamps`): the extended CQ (created with
    /// [`TS_FIELDS`]), the clock that turns its cycles into time, and whether the provider
    /// may be drained with `ibv_next_poll` (false on rxe; see
    /// `hotverbs::Context::ex_cq_batch_poll_safe`).
    pub timestamps: Option<(*mut ibv_cq_ex, TimestampClock, bool)>,
    /// `--direct`: the send CQ of every QP, read by the direct poller.
    pub direct_cq: Option<DirectCq>,
    /// `--direct`: [`cq`](Self::cq) (the receives') as the direct path reads it: a second
    /// direct poller, to which every QP's receive queue is attached.
    pub direct_recv_cq: Option<DirectCq>,
    /// The device is softnic's simulated ConnectX: with `--direct` nothing else runs it
    /// (no `ibv_poll_cq` reaches softnic), so the reaper runs it at every poll
    /// (`hotverbs_softnic::mlx5_step`), as the setup layer's direct poller does.
    pub sim: bool,
}

/// Raw handles of one QP of a [`Side`].
#[derive(Clone, Copy, Debug)]
pub struct QpSide {
    /// The QP (RC, or UC / UD with `-c`), in RTS.
    pub qp: *mut ibv_qp,
    /// The extended QP (`ibv_qp_ex`) to post through with `ibv_wr_*`; `None`: the legacy
    /// `ibv_post_send` ring (`--use_old_post_send`).
    pub qpx: Option<*mut ibv_qp_ex>,
    /// `--direct`: the mlx5 send queue, with its `wrid` table (its register as
    /// `register` says).
    pub sq: Option<DirectSq>,
    /// `--direct`: the mlx5 receive queue (its `wrid` table the side's), written directly
    /// by the QP's receive ring ([`RecvTarget::Mlx5`]); `None`: `ibv_post_recv`.
    pub rq: Option<hotverbs_datapath::mlx5::DirectRqDesc>,
    /// `--direct`: how the ring rings the QP's doorbell register
    /// ([`hotverbs::Qp::mlx5_register_use`]).
    pub register: Option<hotverbs::RegisterUse>,
    /// `-c UD`: the peer's address (an AH the setup layer keeps) every SEND carries.
    pub ud: Option<UdDest>,
}

// SAFETY: the handles are plain pointers to device objects, which verbs allow to be used
// from any thread; a Side is used by one thread at a time (it is moved, not shared).
unsafe impl Send for Side {}

/// The completion fields a `--timestamps` run reads from its extended CQ: what the rings
/// need (`byte_len`, immediate, QP number) and the timestamp.
pub const TS_FIELDS: ExFields = ExFields::BYTE_LEN
    .with(ExFields::IMM)
    .with(ExFields::QP_NUM)
    .with(ExFields::COMPLETION_TS);

/// Aborts a wait when the peer makes no progress (or when another thread says so).
struct Watchdog<'a> {
    spins: u32,
    seen: u64,
    since: Instant,
    timeout: Duration,
    abort: &'a AtomicBool,
}

impl<'a> Watchdog<'a> {
    fn new(timeout: Duration, abort: &'a AtomicBool) -> Self {
        Watchdog {
            spins: 0,
            seen: 0,
            since: Instant::now(),
            timeout,
            abort,
        }
    }

    /// One empty poll; `progress` is any counter that moves when work completes. Checks the
    /// clock every 2^14 empty polls only.
    #[inline(always)]
    fn idle(&mut self, progress: u64, what: &'static str) -> Result<(), PerfError> {
        self.spins = self.spins.wrapping_add(1);
        if self.spins & 0x3fff != 0 {
            core::hint::spin_loop();
            return Ok(());
        }
        self.check(progress, what)
    }

    #[cold]
    fn check(&mut self, progress: u64, what: &'static str) -> Result<(), PerfError> {
        if self.abort.load(Ordering::Relaxed) {
            return Err(PerfError::Aborted);
        }
        let now = Instant::now();
        if progress != self.seen {
            self.seen = progress;
            self.since = now;
            return Ok(());
        }
        if now - self.since > self.timeout {
            return Err(PerfError::Stall {
                waiting_for: what,
                after: self.timeout,
            });
        }
        Ok(())
    }
}

/// One measured size.
pub struct Measured {
    /// Latency samples (latency tests).
    pub latency: Option<Latency>,
    /// `--timestamps`: the same iterations timed by the device's completion timestamps
    /// (from one iteration's final completion to the next one's, so each sample is one
    /// iteration as the NIC saw it: the round trip plus the host's turnaround).
    pub nic_latency: Option<Latency>,
    /// Measured iterations (messages, over all QPs).
    pub iterations: u64,
    /// Bandwidth tests: the measured messages each QP completed (retired by a completion),
    /// in QP order; they add up to `iterations`. Empty for latency tests.
    pub per_qp: Vec<u64>,
    /// Measured time.
    pub elapsed: Duration,
}

/// `--events` (perftest's `-e`): the completion channel of a side's CQ and the CQ, armed
/// and slept on whenever a poll finds nothing.
pub struct Events {
    /// The channel the CQ was created on.
    pub ch: hotverbs::CompChannel,
    /// The CQ (send and receive completions).
    pub cq: hotverbs::Cq,
}

/// A side's engine, whatever its post path: what the runner calls, once per size or once
/// per run. Built by [`build`]; implemented by every `Hot<R, C>`.
pub trait Engine: Send {
    /// Runs one size as the active side.
    fn active(
        &mut self,
        p: &Params,
        size: u32,
        counter: &Counter,
        abort: &AtomicBool,
    ) -> Result<Measured, PerfError>;
    /// Runs one size as the passive side: answers pings, or consumes SENDs until the last
    /// one of every QP. Tests in which the passive side does nothing return at once.
    /// Returns the messages it handled.
    fn passive(&mut self, p: &Params, size: u32, abort: &AtomicBool) -> Result<u64, PerfError>;
    /// Reaps what the last size left in the CQ (send completions of the unsignaled tail are
    /// retired by later signaled ones; receives are re-posted).
    fn settle(&mut self) -> Result<(), PerfError>;
    /// Zeroes the landing zone (before a size, while the peer is not writing to it).
    fn clear_landing(&mut self);
    /// Whether this side sleeps on completion events (`--events`).
    fn sleeps_on_events(&self) -> bool;
    /// The signal period the send rings use.
    fn signal_every(&self) -> u32;
    /// The clock of the latency samples.
    fn clock(&self) -> &'static Clock;
    /// The inline threshold in force.
    fn max_inline(&self) -> u32;
    /// The device clock of a `--timestamps` run.
    fn timestamp_clock(&self) -> Option<TimestampClock>;
    /// Which post path the send rings take.
    fn post_path(&self) -> &'static str;
    /// `--direct`: which of the direct path's APIs posts `p.test`'s messages of `size`
    /// bytes ([`direct_path`]); `None` on the other post paths.
    fn direct_path(&self, p: &Params, size: u32) -> Option<&'static str>;
    /// `--direct`: how QP 0's ring rings its doorbell register.
    fn register_use(&self) -> Option<hotverbs::RegisterUse>;
    /// WRs posted and not yet retired, over all QPs.
    #[cfg(test)]
    fn outstanding(&self) -> u64;
}

/// One QP of a side: its send ring and (SEND tests) its receive ring.
struct Lane<R> {
    send: Box<R>,
    recv: Option<Box<RecvRing<RING_N>>>,
}

/// What the receive side of the completions has seen.
#[derive(Default)]
struct Tally {
    /// Receives consumed since creation (ping-pong and send_bw bookkeeping).
    received: u64,
    /// The immediate of the last receive that carried one.
    last_imm: Option<u32>,
    /// Receives that carried [`LAST`] (one per QP ends a `send_bw` size).
    lasts: u64,
    /// `--timestamps`: the raw timestamp of the last completion of the kind a latency
    /// iteration ends with (a receive for `send_lat`, a send completion otherwise).
    last_ts: Option<u64>,
}

/// A side's datapath objects, kept across sizes: the engine on post path `R`, reaping
/// with `C`.
pub struct Hot<R: PostPath, C: Reap> {
    side: Side,
    lanes: Vec<Lane<R>>,
    reaper: C,
    tally: Tally,
    payload: Vec<u8>,
    slot: u32,
    signal_every: u32,
    /// WRs per post (`-l`, within the depth; 1 for latency tests).
    batch: u32,
    /// The QPs' transport (`-c`).
    side_conn: Connection,
    timeout: Duration,
    clock: &'static Clock,
    /// `--events`: sleep on the CQ's completion channel instead of spinning.
    events: Option<Events>,
    /// `--events`: waits on the channel so far (each after an arm and an empty poll).
    sleeps: u64,
}

// SAFETY: every raw pointer inside (the Side's handles, the rings' links) refers to objects
// that may be used from any thread; Hot is moved between threads, never shared.
unsafe impl<R: PostPath, C: Reap> Send for Hot<R, C> {}

impl<R: PostPath, C: Reap> Hot<R, C> {
    /// Builds the rings for `p` on every QP of `side`, and posts the receives.
    ///
    /// # Safety
    /// As [`build`]'s; `R` and `C` are the side's post path and CQ layout.
    unsafe fn new(
        side: Side,
        p: &Params,
        timeout: Duration,
        events: Option<Events>,
    ) -> Result<Self, PerfError> {
        let max_size = p.sizes.iter().copied().max().unwrap_or(1);
        let slot = run_slot(p);
        if (side.mr.len as u64) < buffer_len(p) {
            return Err(PerfError::Internal(format!(
                "registered buffer of {} bytes is smaller than the {} the run needs",
                side.mr.len,
                buffer_len(p)
            )));
        }
        if side.qps.len() != p.qps as usize || side.qps.len() > MAX_QPS as usize {
            return Err(PerfError::Internal(format!(
                "{} QPs built for -q {}",
                side.qps.len(),
                p.qps
            )));
        }
        let depth = send_depth(p);
        let signal_every = match p.test {
            // Every READ / atomic is waited for: each one is signaled.
            TestKind::ReadLat | TestKind::AtomicLat => 1,
            // write_lat rewrites its source between WRITEs: a zero-copy (non-inline) WRITE
            // must be retired before that, so each is signaled.
            TestKind::WriteLat if max_size > side.max_inline => 1,
            TestKind::SendLat | TestKind::WriteLat => (depth / 2).max(1),
            _ => p.cq_mod.min(depth / 2).max(1),
        };
        let batch = if p.test.is_latency() {
            1
        } else {
            p.post_list.min(depth)
        };
        let rx = recv_count(p);
        let mut lanes = Vec::with_capacity(side.qps.len());
        for (q, h) in side.qps.iter().enumerate() {
            let cfg = SendConfig::new(send_ring_id(q), depth, side.max_inline)
                .signal_every(signal_every)
                .batch(batch);
            let cfg = match h.ud {
                Some(dest) => cfg.ud(dest),
                None => cfg.remote(side.remote),
            };
            let what = format!(
                "send ring of QP {q} (depth {depth}, signal every {signal_every}, batch {batch})"
            );
            // SAFETY: forwarded from this function's contract.
            let send = unsafe { R::build(h, cfg, &what) }?;
            let recv = if rx > 0 {
                let region = side
                    .mr
                    .slice(2 * slot + q as u32 * rx * slot, rx * slot)
                    .ok_or_else(|| {
                        PerfError::Internal("receive slots do not fit the registered buffer".into())
                    })?;
                // SAFETY: the QP is live and only this ring posts its receives; the region
                // is registered with local write, lives as long as the side, and only this
                // ring touches it (each QP's slots are its own).
                let mut r = unsafe {
                    RecvRing::new(
                        match h.rq {
                            Some(desc) => RecvTarget::Mlx5 {
                                qp: h.qp,
                                desc,
                                head: 0,
                            },
                            None => RecvTarget::Qp(h.qp),
                        },
                        region,
                        RecvConfig::new(recv_ring_id(q), slot, rx)
                            .repost_batch(recv_repost_batch(rx)),
                    )
                }
                .map_err(|e| PerfError::Ring {
                    what: format!("receive ring of QP {q} ({rx} slots of {slot} B)"),
                    source: e,
                })?;
                r.fill().map_err(|e| PerfError::Post {
                    what: "post the receive ring",
                    source: e,
                })?;
                Some(Box::new(r))
            } else {
                None
            };
            lanes.push(Lane { send, recv });
        }
        // SAFETY: forwarded from this function's contract (the CQs are polled by this
        // engine only; the wrid tables are the rings' just built).
        let reaper = unsafe { C::build(&side) }?;
        let mut payload = vec![0u8; slot as usize];
        for (i, b) in payload.iter_mut().enumerate() {
            *b = i as u8;
        }
        Ok(Hot {
            side,
            lanes,
            reaper,
            tally: Tally::default(),
            payload,
            slot,
            signal_every,
            batch,
            side_conn: p.connection,
            timeout,
            // Calibrated here, before anything is timed.
            clock: clock(),
            events,
            sleeps: 0,
        })
    }

    /// After an empty poll: spin on (the watchdog counts), or with `--events` arm the CQ and
    /// sleep until its next completion event.
    #[inline(always)]
    fn idle(&mut self, wd: &mut Watchdog<'_>, what: &'static str) -> Result<(), PerfError> {
        if self.events.is_some() {
            return self.sleep(wd, what);
        }
        wd.idle(self.progress_mark(), what)
    }

    /// `--events`: `ibv_req_notify_cq`, one more poll (a completion that arrived between
    /// the empty poll and the arm raises no event), then `ibv_get_cq_event` and its ack.
    /// The wait is cut in 100 ms slices for the watchdog (a stalled peer, an abort). The
    /// completions are left to the caller's next poll.
    #[inline(never)]
    fn sleep(&mut self, wd: &mut Watchdog<'_>, what: &'static str) -> Result<(), PerfError> {
        let ev = self.events.take().expect("events mode");
        let r = self.sleep_on(&ev, wd, what);
        self.events = Some(ev);
        r
    }

    fn sleep_on(
        &mut self,
        ev: &Events,
        wd: &mut Watchdog<'_>,
        what: &'static str,
    ) -> Result<(), PerfError> {
        ev.cq.req_notify(false)?;
        if self.poll()? > 0 {
            return Ok(());
        }
        self.sleeps += 1;
        loop {
            if let Some(e) = ev.ch.wait_cq_event(Duration::from_millis(100))? {
                if e.is_for(&ev.cq) {
                    ev.cq.ack_events(1);
                }
                return Ok(());
            }
            wd.check(self.progress_mark(), what)?;
        }
    }

    fn local(&self, len: u32) -> LocalBuf {
        LocalBuf::new(self.side.mr.addr, len, self.side.mr.lkey)
    }

    fn landing(&self) -> *mut u8 {
        (self.side.mr.addr + self.slot as u64) as *mut u8
    }

    #[inline(always)]
    fn landing_byte(&self, size: u32) -> u8 {
        // SAFETY: size <= slot, so the byte is inside the landing zone; volatile because the
        // NIC writes it behind the compiler's back (as perftest polls its buffer).
        unsafe { std::ptr::read_volatile(self.landing().add(size as usize - 1)) }
    }

    /// Polls once and routes: send completions retire their QP's ring, receive completions
    /// release their slot at once (the payload is not inspected) and count. Returns the
    /// number of completions.
    #[inline(always)]
    fn poll(&mut self) -> Result<usize, PerfError> {
        let (lanes, tally) = (&mut self.lanes, &mut self.tally);
        self.reaper.reap(|c, ts| {
            if let Some(t) = ts {
                // A ping-pong iteration ends with a receive; a READ / atomic one with its
                // own send completion.
                if c.ring() & RECV_RING != 0 || lanes.first().is_some_and(|l| l.recv.is_none()) {
                    tally.last_ts = Some(t);
                }
            }
            route(lanes, tally, c)
        })
    }

    fn progress_mark(&self) -> u64 {
        self.lanes
            .iter()
            .map(|l| l.send.retired_total())
            .sum::<u64>()
            + self.tally.received
    }

    /// Waits until `received` reaches `target`.
    #[inline(always)]
    fn wait_recv(&mut self, target: u64, wd: &mut Watchdog<'_>) -> Result<(), PerfError> {
        while self.tally.received < target {
            if self.poll()? == 0 {
                self.idle(wd, "a message from the peer")?;
            }
        }
        Ok(())
    }

    /// Waits until the send with sequence `seq` of QP 0 is retired.
    #[inline(always)]
    fn wait_retired(&mut self, seq: u64, wd: &mut Watchdog<'_>) -> Result<(), PerfError> {
        while !self.lanes[0].send.is_retired(seq) {
            if self.poll()? == 0 {
                self.idle(wd, "a send completion")?;
            }
        }
        Ok(())
    }

    /// Posts one SEND of `size` bytes on QP 0 now (inline when it fits); `last` marks the
    /// final one.
    #[inline(always)]
    fn send_one(&mut self, size: u32, last: bool, wd: &mut Watchdog<'_>) -> Result<u64, PerfError> {
        self.post_retrying(wd, "a send completion", |h| {
            if size <= h.side.max_inline {
                let local = Local::Inline(&h.payload[..size as usize]);
                h.lanes[0].send.send_now(if last {
                    Msg::send_imm(local, LAST as u32)
                } else {
                    Msg::send(local)
                })
            } else {
                let local = Local::Buf(h.local(size));
                let msg = if last {
                    Msg::send_imm(local, LAST as u32)
                } else {
                    Msg::send(local)
                };
                // SAFETY: the source is the registered buffer's first slot, which this side
                // never writes during SEND tests; it stays valid for the Hot's lifetime.
                unsafe { h.stage_and_flush(msg) }
            }
        })
    }

    /// Posts one WRITE with immediate of `size` bytes on QP 0 (`write_lat
    /// --write_with_imm`), the immediate [`LAST`] for the final one, 0 otherwise: the peer
    /// learns of it from the receive completion it raises. The source (the payload, or the
    /// registered buffer's first slot) is never written in this mode.
    #[inline(always)]
    fn write_imm_one(
        &mut self,
        size: u32,
        last: bool,
        wd: &mut Watchdog<'_>,
    ) -> Result<u64, PerfError> {
        let imm = if last { LAST as u32 } else { 0 };
        self.post_retrying(wd, "a send completion", |h| {
            if size <= h.side.max_inline {
                h.lanes[0].send.send_now(Msg::write_imm(
                    Local::Inline(&h.payload[..size as usize]),
                    0,
                    imm,
                ))
            } else {
                let msg = Msg::write_imm(Local::Buf(h.local(size)), 0, imm);
                // SAFETY: the source is the registered buffer's first slot, which this side
                // never writes in this mode; it stays valid for the Hot's lifetime.
                unsafe { h.stage_and_flush(msg) }
            }
        })
    }

    /// Posts one WRITE of `size` bytes on QP 0 whose final byte is `mark`; waits for the
    /// previous zero-copy WRITE to retire before rewriting the source.
    #[inline(always)]
    fn write_one(
        &mut self,
        size: u32,
        mark: u8,
        prev: Option<u64>,
        wd: &mut Watchdog<'_>,
    ) -> Result<u64, PerfError> {
        let inline = size <= self.side.max_inline;
        if inline {
            self.payload[size as usize - 1] = mark;
        } else {
            if let Some(s) = prev {
                self.wait_retired(s, wd)?;
            }
            // SAFETY: byte size-1 of the source slot; the previous WRITE from it is retired
            // (above), so the NIC no longer reads it.
            unsafe { *((self.side.mr.addr + size as u64 - 1) as *mut u8) = mark };
        }
        self.post_retrying(wd, "a send completion", |h| {
            if inline {
                h.lanes[0]
                    .send
                    .send_now(Msg::write(Local::Inline(&h.payload[..size as usize]), 0))
            } else {
                let msg = Msg::write(Local::Buf(h.local(size)), 0);
                // SAFETY: the source slot is not written again before this WRITE retires
                // (each zero-copy WRITE is signaled and waited for above).
                unsafe { h.stage_and_flush(msg) }
            }
        })
    }

    /// Posts one READ or atomic on QP 0 and returns its sequence.
    #[inline(always)]
    fn remote_op(
        &mut self,
        test: TestKind,
        size: u32,
        atomic: AtomicKind,
        i: u64,
        wd: &mut Watchdog<'_>,
    ) -> Result<u64, PerfError> {
        let msg = if test == TestKind::ReadLat {
            Msg::read(self.local(size), 0)
        } else {
            match atomic {
                AtomicKind::FetchAndAdd => Msg::fetch_add(self.local(8), 0, 1),
                AtomicKind::CmpAndSwap => Msg::cmp_swap(self.local(8), 0, i, i + 1),
            }
        };
        self.post_retrying(wd, "a completion", |h| {
            // SAFETY: the destination is the first slot of the registered buffer, which this
            // side neither reads nor writes during READ/atomic tests.
            unsafe { h.stage_and_flush(msg) }
        })
    }

    /// Stages `msg` zero-copy on QP 0 and posts it at once.
    ///
    /// # Safety
    /// As [`PostRing::stage`]: the local buffer stays valid and is not written (for a send
    /// or WRITE) or read (for a READ/atomic) until the WR retires.
    #[inline(always)]
    unsafe fn stage_and_flush(&mut self, msg: Msg<'_>) -> Result<u64, SendError> {
        let ring = &mut self.lanes[0].send;
        // SAFETY: forwarded contract.
        let seq = unsafe { ring.stage(msg) }?;
        ring.flush().map(|()| seq)
    }

    /// Retries `post` while the ring is full (`WouldBlock`), reaping completions in between;
    /// the watchdog turns a stall into an error naming `what` was awaited.
    #[inline(always)]
    fn post_retrying(
        &mut self,
        wd: &mut Watchdog<'_>,
        what: &'static str,
        mut post: impl FnMut(&mut Self) -> Result<u64, SendError>,
    ) -> Result<u64, PerfError> {
        loop {
            match post(self) {
                Ok(seq) => return Ok(seq),
                Err(SendError::WouldBlock) => {
                    if self.poll()? == 0 {
                        self.idle(wd, what)?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn ping(
        &mut self,
        p: &Params,
        size: u32,
        counter: &Counter,
        wd: &mut Watchdog<'_>,
    ) -> Result<Measured, PerfError> {
        let mut prev = None;
        self.measure_latency(p, counter, true, |h, i, last| {
            if p.test == TestKind::SendLat {
                let want = h.tally.received + 1;
                h.send_one(size, last, wd)?;
                h.wait_recv(want, wd)
            } else if p.write_imm {
                let want = h.tally.received + 1;
                h.write_imm_one(size, last, wd)?;
                h.wait_recv(want, wd)
            } else {
                let mark = if last { LAST } else { mark_of(i) };
                prev = Some(h.write_one(size, mark, prev, wd)?);
                while h.landing_byte(size) != mark {
                    // Keep the send ring retiring while we spin on memory.
                    if h.poll()? == 0 {
                        wd.idle(
                            h.progress_mark() + h.landing_byte(size) as u64,
                            "the peer's WRITE",
                        )?;
                    }
                }
                Ok(())
            }
        })
    }

    fn one_by_one(
        &mut self,
        p: &Params,
        size: u32,
        counter: &Counter,
        wd: &mut Watchdog<'_>,
    ) -> Result<Measured, PerfError> {
        self.measure_latency(p, counter, false, |h, i, _last| {
            let seq = h.remote_op(p.test, size, p.atomic, i, wd)?;
            h.wait_retired(seq, wd)
        })
    }

    /// The latency loop: runs `op(self, i, last)` for the warm-up and then the measured
    /// iterations (count or duration from `p`), timing each with the calibrated clock and
    /// recording it after the warm-up (`half`: report half the round trip).
    #[inline(always)]
    fn measure_latency(
        &mut self,
        p: &Params,
        counter: &Counter,
        half: bool,
        mut op: impl FnMut(&mut Self, u64, bool) -> Result<(), PerfError>,
    ) -> Result<Measured, PerfError> {
        let (clock, ts_clock) = (self.clock, self.reaper.timestamp_clock());
        latency_loop(clock, ts_clock, p, counter, half, |i, last| {
            op(self, i, last)?;
            Ok(self.tally.last_ts)
        })
    }

    /// Streams `n` messages over the QPs keeping every window full (with `until` instead:
    /// until that time, plus one final round). The next QP with room takes the next
    /// message; the final round, the last message of each QP, goes one to each in turn,
    /// signaled whatever the schedule says ([`PostRing::signal_next`]), so every ring drains
    /// to empty, and with `mark_last` each final SEND carries [`LAST`]. Returns the number
    /// of messages.
    #[allow(clippy::too_many_arguments)]
    fn stream_phase(
        &mut self,
        test: TestKind,
        size: u32,
        n: Option<u64>,
        until: Option<Instant>,
        mark_last: bool,
        counter: Option<&Counter>,
        wd: &mut Watchdog<'_>,
    ) -> Result<u64, PerfError> {
        if test == TestKind::SendBw && self.fixed_applies(test, size) {
            // The direct path's post list of fixed-size inline SENDs.
            return with_fixed_len!(size, L => {
                self.stream_list::<L>(size, n, until, mark_last, counter, wd)
            });
        }
        let buf = self.local(size);
        let inline_send = test == TestKind::SendBw && size <= self.side.max_inline;
        let qps = self.lanes.len();
        let mut posted = 0u64;
        let mut end = n;
        // The QP that takes the next message.
        let mut k = 0usize;
        loop {
            if end.is_none() {
                if let Some(t) = until {
                    if Instant::now() >= t {
                        // One more round: the final one, signaled and marked.
                        end = Some(posted + qps as u64);
                    }
                }
            }
            let target = end.unwrap_or(u64::MAX);
            let final_round = target.saturating_sub(qps as u64);
            // QPs found full in a row: all of them, and the windows wait for completions.
            let mut full = 0usize;
            while posted < target {
                let fin = posted >= final_round;
                let lane = &mut self.lanes[k];
                if lane.send.free() == 0 {
                    full += 1;
                    // In the final round each QP takes its own turn: wait for room on it.
                    if fin || full == qps {
                        break;
                    }
                    k = if k + 1 == qps { 0 } else { k + 1 };
                    continue;
                }
                full = 0;
                if fin {
                    lane.send.signal_next();
                }
                let last = mark_last && fin;
                let msg = match test {
                    TestKind::SendBw => {
                        let l = if inline_send {
                            Local::Inline(&self.payload[..size as usize])
                        } else {
                            Local::Buf(buf)
                        };
                        if last {
                            Msg::send_imm(l, LAST as u32)
                        } else {
                            Msg::send(l)
                        }
                    }
                    TestKind::WriteBw => Msg::write(Local::Buf(buf), 0),
                    _ => Msg::read(buf, 0),
                };
                // SAFETY: sources (the payload Vec, the first slot of the registered buffer)
                // are never written while streaming and outlive the ring's use of them (this
                // phase drains every WR before returning); READ destinations are never read.
                unsafe { lane.send.stage(msg) }?;
                posted += 1;
                k = if k + 1 == qps { 0 } else { k + 1 };
            }
            // The rings post every `post_list` staged WRs themselves; this posts the rest.
            for lane in &mut self.lanes {
                lane.send.flush()?;
            }
            if let Some(c) = counter {
                c.set(posted);
            }
            if posted == target {
                break;
            }
            // Windows full: wait for a signaled completion to open one.
            if self.poll()? == 0 {
                self.idle(wd, "send completions")?;
            }
        }
        while self.outstanding_wrs() > 0 {
            if self.poll()? == 0 {
                self.idle(wd, "the last send completions")?;
            }
        }
        Ok(posted)
    }

    fn stream(
        &mut self,
        p: &Params,
        size: u32,
        counter: &Counter,
        wd: &mut Watchdog<'_>,
    ) -> Result<Measured, PerfError> {
        if p.warmup > 0 {
            self.stream_phase(p.test, size, Some(p.warmup), None, false, None, wd)?;
        }
        let before: Vec<u64> = self.lanes.iter().map(|l| l.send.retired_total()).collect();
        let t0 = Instant::now();
        let n = match p.amount {
            Amount::Iters(n) => {
                self.stream_phase(p.test, size, Some(n), None, true, Some(counter), wd)?
            }
            Amount::Seconds(s) => self.stream_phase(
                p.test,
                size,
                None,
                Some(t0 + Duration::from_secs_f64(s)),
                true,
                Some(counter),
                wd,
            )?,
        };
        let elapsed = t0.elapsed();
        // Each QP's messages of this phase, as its completions retired them (the phase
        // drained every ring).
        let per_qp = self
            .lanes
            .iter()
            .zip(before)
            .map(|(l, b)| l.send.retired_total() - b)
            .collect();
        Ok(Measured {
            latency: None,
            nic_latency: None,
            iterations: n,
            per_qp,
            elapsed,
        })
    }

    fn outstanding_wrs(&self) -> u64 {
        self.lanes.iter().map(|l| l.send.outstanding()).sum()
    }
}

impl<R: PostPath, C: Reap> Engine for Hot<R, C> {
    fn active(
        &mut self,
        p: &Params,
        size: u32,
        counter: &Counter,
        abort: &AtomicBool,
    ) -> Result<Measured, PerfError> {
        if size > self.slot {
            return Err(PerfError::Internal(format!(
                "size {size} exceeds the buffer slot {}",
                self.slot
            )));
        }
        let mut wd = Watchdog::new(self.timeout, abort);
        match p.test {
            TestKind::SendLat if self.fixed_applies(p.test, size) => {
                with_fixed_len!(size, L => self.ping_session::<L>(p, counter, &mut wd))
            }
            TestKind::SendLat | TestKind::WriteLat => self.ping(p, size, counter, &mut wd),
            TestKind::ReadLat | TestKind::AtomicLat => self.one_by_one(p, size, counter, &mut wd),
            TestKind::SendBw | TestKind::WriteBw | TestKind::ReadBw => {
                self.stream(p, size, counter, &mut wd)
            }
        }
    }

    fn passive(&mut self, p: &Params, size: u32, abort: &AtomicBool) -> Result<u64, PerfError> {
        let mut wd = Watchdog::new(self.timeout, abort);
        let mut n = 0u64;
        match p.test {
            TestKind::SendLat if self.fixed_applies(p.test, size) => {
                n = with_fixed_len!(size, L => self.pong_session::<L>(&mut wd))?;
            }
            TestKind::SendLat => loop {
                let want = self.tally.received + 1;
                self.tally.last_imm = None;
                self.wait_recv(want, &mut wd)?;
                let last = self.tally.last_imm == Some(LAST as u32);
                self.send_one(size, false, &mut wd)?;
                n += 1;
                if last {
                    break;
                }
            },
            TestKind::WriteLat if p.write_imm => loop {
                let want = self.tally.received + 1;
                self.tally.last_imm = None;
                self.wait_recv(want, &mut wd)?;
                let last = self.tally.last_imm == Some(LAST as u32);
                self.write_imm_one(size, false, &mut wd)?;
                n += 1;
                if last {
                    break;
                }
            },
            TestKind::WriteLat => {
                let mut seen = 0u8;
                let mut prev = None;
                loop {
                    let mut b = self.landing_byte(size);
                    while b == seen {
                        if self.poll()? == 0 {
                            wd.idle(self.progress_mark() + n, "the peer's WRITE")?;
                        }
                        b = self.landing_byte(size);
                    }
                    seen = b;
                    prev = Some(self.write_one(size, b, prev, &mut wd)?);
                    n += 1;
                    if b == LAST {
                        break;
                    }
                }
            }
            TestKind::SendBw => {
                // One poll may bring many messages: count receives, not polls. Every QP's
                // last SEND carries LAST, and QPs are not ordered with each other: the size
                // is over once each has delivered its own.
                let start = self.tally.received;
                let qps = self.lanes.len() as u64;
                self.tally.lasts = 0;
                while self.tally.lasts < qps {
                    let want = self.tally.received + 1;
                    self.wait_recv(want, &mut wd)?;
                }
                n = self.tally.received - start;
            }
            TestKind::ReadLat | TestKind::AtomicLat | TestKind::WriteBw | TestKind::ReadBw => {}
        }
        Ok(n)
    }

    fn settle(&mut self) -> Result<(), PerfError> {
        while self.poll()? > 0 {}
        for r in self.lanes.iter_mut().filter_map(|l| l.recv.as_mut()) {
            r.repost().map_err(|e| PerfError::Post {
                what: "re-post released receives",
                source: e,
            })?;
        }
        Ok(())
    }

    fn clear_landing(&mut self) {
        // SAFETY: the landing zone is slot bytes inside the registered buffer (checked in
        // new); the peer writes it only after the barrier that follows this call.
        unsafe { std::ptr::write_bytes(self.landing(), 0, self.slot as usize) };
    }

    fn sleeps_on_events(&self) -> bool {
        self.events.is_some()
    }

    fn signal_every(&self) -> u32 {
        self.signal_every
    }

    fn clock(&self) -> &'static Clock {
        self.clock
    }

    fn max_inline(&self) -> u32 {
        self.side.max_inline
    }

    fn timestamp_clock(&self) -> Option<TimestampClock> {
        self.reaper.timestamp_clock()
    }

    fn post_path(&self) -> &'static str {
        R::NAME
    }

    fn direct_path(&self, p: &Params, size: u32) -> Option<&'static str> {
        R::DIRECT.then(|| direct_path(p.test, p.connection, size, self.side.max_inline))
    }

    fn register_use(&self) -> Option<hotverbs::RegisterUse> {
        self.side.qps.first().and_then(|q| q.register)
    }

    #[cfg(test)]
    fn outstanding(&self) -> u64 {
        self.outstanding_wrs()
    }
}

/// The ping of iteration `i` carries this final byte (never 0, the cleared value, nor
/// [`LAST`]).
fn mark_of(i: u64) -> u8 {
    (i % 254) as u8 + 1
}

/// When an active loop ends.
struct Plan {
    amount: Amount,
    warmup: u64,
}

impl Plan {
    fn new(amount: Amount, warmup: u64) -> Self {
        Plan { amount, warmup }
    }

    /// Is iteration `i` the last one? `t_start` is when measuring began.
    #[inline(always)]
    fn is_last(&self, i: u64, t_start: Option<Instant>) -> bool {
        match self.amount {
            Amount::Iters(n) => i + 1 == self.warmup + n,
            Amount::Seconds(s) => match t_start {
                Some(t) => (i & 63) == 63 && t.elapsed().as_secs_f64() >= s,
                None => false,
            },
        }
    }
}

/// The latency loop: runs `op(i, last)` for the warm-up and then the measured iterations
/// (count or duration from `p`), timing each with `clock` and recording it after the
/// warm-up (`half`: report half the round trip). `op` returns the raw completion timestamp
/// the iteration ended with, which `ts_clock` (`--timestamps`) turns into the NIC-clock
/// samples.
#[inline(always)]
fn latency_loop(
    clock: &Clock,
    ts_clock: Option<TimestampClock>,
    p: &Params,
    counter: &Counter,
    half: bool,
    mut op: impl FnMut(u64, bool) -> Result<Option<u64>, PerfError>,
) -> Result<Measured, PerfError> {
    let mut lat = Latency::new(half);
    let mut nic = ts_clock.map(|_| Latency::new(half));
    let mut prev_ts: Option<u64> = None;
    let plan = Plan::new(p.amount, p.warmup);
    let mut i = 0u64;
    let mut t_start = None;
    loop {
        let last = plan.is_last(i, t_start);
        if i == p.warmup {
            t_start = Some(Instant::now());
        }
        let t0 = clock.now();
        let last_ts = op(i, last)?;
        let t = clock.between(t0, clock.now());
        if let (Some(tc), Some(ts)) = (ts_clock, last_ts) {
            if let (Some(nic), Some(prev), true) = (nic.as_mut(), prev_ts, i >= p.warmup) {
                nic.record(Duration::from_nanos(tc.delta_ns(prev, ts)));
            }
            prev_ts = Some(ts);
        }
        if i >= p.warmup {
            lat.record(t);
            counter.set(i + 1 - p.warmup);
        }
        i += 1;
        if last {
            break;
        }
    }
    let elapsed = t_start.map_or(Duration::ZERO, |t| t.elapsed());
    Ok(Measured {
        iterations: lat.count(),
        latency: Some(lat),
        nic_latency: nic,
        per_qp: Vec::new(),
        elapsed,
    })
}

/// Routes one completion to its QP's ring by its ring id: bit 7 clear, a send ring
/// ([`SEND_RING`]` + q`); set, a receive ring ([`RECV_RING`]` | q`).
#[inline(always)]
fn route<R: PostRing>(
    lanes: &mut [Lane<R>],
    tally: &mut Tally,
    c: &mut Completion,
) -> Result<(), PerfError> {
    let id = c.ring();
    if id & RECV_RING == 0 {
        if let Some(lane) = lanes.get_mut(id.wrapping_sub(SEND_RING) as usize) {
            lane.send
                .on_completion(c)
                .map_err(|error| PerfError::Completion {
                    queue: "send queue",
                    error,
                })?;
            return Ok(());
        }
    } else if let Some(r) = lanes
        .get_mut((id & !RECV_RING) as usize)
        .and_then(|l| l.recv.as_mut())
    {
        return on_recv(r, tally, c);
    }
    Err(unknown_ring(c))
}

/// A receive completion of `r`: its slot released at once (the payload is not inspected),
/// counted, its immediate noted.
#[inline(always)]
fn on_recv(
    r: &mut RecvRing<RING_N>,
    tally: &mut Tally,
    c: &mut Completion,
) -> Result<(), PerfError> {
    let m = r.on_completion(c)?;
    if let Some(imm) = m.imm() {
        tally.last_imm = Some(imm);
        if imm == LAST as u32 {
            tally.lasts += 1;
        }
    }
    r.release(m)?;
    tally.received += 1;
    Ok(())
}

#[cold]
fn unknown_ring(c: &Completion) -> PerfError {
    PerfError::Internal(format!(
        "completion for unknown ring {} (wr_id {:#x})",
        c.ring(),
        c.wr_id()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::AtomicKind;
    use crate::setup::{Device, SideRes};
    use hotverbs_datapath::{CqPoller, WrRing};

    fn params(test: TestKind, sizes: Vec<u32>, rx: u32) -> Params {
        Params {
            test,
            sizes,
            amount: Amount::Iters(10),
            warmup: 0,
            inline_size: None,
            cq_mod: 16,
            post_list: 1,
            tx_depth: 128,
            rx_depth: rx,
            atomic: AtomicKind::FetchAndAdd,
            connection: Default::default(),
            qps: 1,
            write_imm: false,
        }
    }

    #[test]
    fn buffer_layout() {
        assert_eq!(slot_size(1), 64);
        assert_eq!(slot_size(64), 64);
        assert_eq!(slot_size(65), 128);
        let p = params(TestKind::SendBw, vec![65536], 512);
        assert_eq!(recv_count(&p), 512);
        assert_eq!(buffer_len(&p), 2 * 65536 + 512 * 65536);
        // -a: 8 MiB slots are capped by the budget.
        let p = params(TestKind::SendBw, vec![2, 8 << 20], 512);
        assert_eq!(recv_count(&p), (RECV_BUDGET / (8 << 20)) as u32);
        // READ tests post no receives.
        assert_eq!(recv_count(&params(TestKind::ReadBw, vec![64], 512)), 0);
        // -q: slots per QP, the budget shared among the QPs.
        let mut p = params(TestKind::SendBw, vec![65536], 512);
        p.qps = 8;
        assert_eq!(recv_count(&p), (RECV_BUDGET / 65536 / 8) as u32);
        assert_eq!(buffer_len(&p), 2 * 65536 + RECV_BUDGET);
        p.qps = 64;
        assert_eq!(recv_count(&p), 64);
        assert!(buffer_len(&p) <= 2 * 65536 + RECV_BUDGET);
    }

    /// Every QP's send and receive ring ids are distinct (ids are unique per CQ), and
    /// route back to the QP.
    #[test]
    fn ring_ids_of_every_qp_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for q in 0..MAX_QPS as usize {
            let (s, r) = (send_ring_id(q), recv_ring_id(q));
            assert!(seen.insert(s) && seen.insert(r), "QP {q}: {s} {r}");
            assert_eq!((s & RECV_RING, s.wrapping_sub(SEND_RING)), (0, q as u8));
            assert_eq!((r & RECV_RING, r & !RECV_RING), (RECV_RING, q as u8));
        }
        assert_eq!(seen.len(), 2 * MAX_QPS as usize);
    }

    #[test]
    fn marks_avoid_cleared_and_last() {
        for i in 0..2000 {
            let m = mark_of(i);
            assert!(m != 0 && m != LAST);
            assert_ne!(m, mark_of(i + 1));
        }
    }

    #[test]
    fn plan_counts_warmup_and_iterations() {
        let p = Plan::new(Amount::Iters(5), 3);
        let lasts: Vec<u64> = (0..20).filter(|&i| p.is_last(i, None)).collect();
        assert_eq!(lasts, vec![7]);
    }

    /// Two connected softnic sides for `p` (its `-q` QPs each), with their objects.
    fn sides(p: &Params, old: bool, timestamps: bool, events: bool) -> (Device, SideRes, SideRes) {
        let dev = Device::open("softnic", 1, None)
            .unwrap()
            .with_paths(old, timestamps)
            .with_events(events);
        let mut a = SideRes::new(&dev, p).unwrap();
        let mut b = SideRes::new(&dev, p).unwrap();
        let (ea, eb) = (a.endpoints(&dev, p), b.endpoints(&dev, p));
        a.connect(&dev, &eb).unwrap();
        b.connect(&dev, &ea).unwrap();
        (dev, a, b)
    }

    /// Two connected softnic sides for `p`, with their objects (kept alive by the caller),
    /// on the default (extended) post path.
    fn softnic_pair(
        p: &Params,
        timeout: Duration,
    ) -> (Device, SideRes, SideRes, Box<dyn Engine>, Box<dyn Engine>) {
        softnic_pair_with(p, timeout, false, false, false)
    }

    /// [`softnic_pair`] with the post path (`old`: `--use_old_post_send`), completion
    /// timestamps and completion events (`--events`) chosen, built as the tool builds
    /// them ([`build`]).
    fn softnic_pair_with(
        p: &Params,
        timeout: Duration,
        old: bool,
        timestamps: bool,
        events: bool,
    ) -> (Device, SideRes, SideRes, Box<dyn Engine>, Box<dyn Engine>) {
        let (dev, mut a, mut b) = sides(p, old, timestamps, events);
        let (ea, eb) = (a.endpoints(&dev, p), b.endpoints(&dev, p));
        // SAFETY: the SideRes outlive the engines in every test (returned together and the
        // engines are dropped first: they are declared after them in the callers'
        // patterns).
        let ha = unsafe { build(a.side(&eb).unwrap(), p, timeout, a.events()) }.unwrap();
        // SAFETY: as above.
        let hb = unsafe { build(b.side(&ea).unwrap(), p, timeout, b.events()) }.unwrap();
        (dev, a, b, ha, hb)
    }

    /// The default path's engine as its type (`ibv_wr_*`, one CQ), for tests that look
    /// inside.
    type WrHot = Hot<WrRing, CqPoller<POLL_BURST>>;

    /// [`softnic_pair`] as [`WrHot`]s.
    fn wr_pair(
        p: &Params,
        timeout: Duration,
        events: bool,
    ) -> (Device, SideRes, SideRes, WrHot, WrHot) {
        let (dev, mut a, mut b) = sides(p, false, false, events);
        let (ea, eb) = (a.endpoints(&dev, p), b.endpoints(&dev, p));
        // SAFETY: as in softnic_pair_with.
        let ha = unsafe { WrHot::new(a.side(&eb).unwrap(), p, timeout, a.events()) }.unwrap();
        // SAFETY: as above.
        let hb = unsafe { WrHot::new(b.side(&ea).unwrap(), p, timeout, b.events()) }.unwrap();
        (dev, a, b, ha, hb)
    }

    /// `-c`: each transport gets its QP type (UD: an address handle to the peer, and
    /// receive slots with room for the GRH before the message), and a SEND goes through.
    #[test]
    fn each_connection_type_builds_its_qps_and_carries_a_send() {
        use hotverbs::QpType;
        for (c, t) in [
            (Connection::Rc, QpType::Rc),
            (Connection::Uc, QpType::Uc),
            (Connection::Ud, QpType::Ud),
        ] {
            let mut p = params(TestKind::SendLat, vec![100], 64);
            p.connection = c;
            let (_dev, a, b, mut ha, mut hb) = wr_pair(&p, Duration::from_secs(10), false);
            assert_eq!((a.qps[0].qp_type(), b.qps[0].qp_type()), (t, t));
            assert_eq!(a.ahs.len(), usize::from(c == Connection::Ud), "{c:?}");
            assert_eq!(ha.slot, if c == Connection::Ud { 192 } else { 128 });
            let abort = AtomicBool::new(false);
            let mut wd = Watchdog::new(Duration::from_secs(10), &abort);
            hb.send_one(100, false, &mut wd).unwrap();
            ha.wait_recv(1, &mut wd).unwrap();
            ha.send_one(100, true, &mut wd).unwrap();
            hb.wait_recv(1, &mut wd).unwrap();
            assert_eq!(hb.tally.last_imm, Some(LAST as u32), "{c:?}");
        }
    }

    /// `--events`: a side with nothing coming arms its CQ and sleeps on the channel, in
    /// slices, until the watchdog calls the stall (no hang, no busy loop needed); a message
    /// from the peer then wakes it. Every test kind that polls a CQ runs to the end, on
    /// both post paths, with both sides sleeping.
    #[test]
    fn events_mode_sleeps_until_a_completion_and_runs_every_cq_test() {
        let mut p = params(TestKind::SendLat, vec![8], 64);
        p.warmup = 0;
        let (_dev, _a, _b, mut ha, mut hb) = wr_pair(&p, Duration::from_millis(300), true);
        assert!(ha.sleeps_on_events() && hb.sleeps_on_events());
        let abort = AtomicBool::new(false);
        let mut wd = Watchdog::new(Duration::from_millis(300), &abort);
        match ha.wait_recv(1, &mut wd) {
            Err(PerfError::Stall { waiting_for, .. }) => {
                assert_eq!(waiting_for, "a message from the peer")
            }
            other => panic!("nothing was sent, yet {:?}", other.map(|_| ())),
        }
        assert_eq!(
            ha.sleeps, 1,
            "armed, polled nothing, slept (and no busy loop)"
        );
        // Woken by the peer's message: usually while asleep (the send comes a moment after
        // the wait starts); either order ends the same way.
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                let mut wd = Watchdog::new(Duration::from_secs(20), &abort);
                ha.wait_recv(1, &mut wd)
            });
            std::thread::sleep(Duration::from_millis(50));
            let mut wd = Watchdog::new(Duration::from_secs(20), &abort);
            hb.send_one(8, false, &mut wd).unwrap();
            h.join().unwrap().unwrap();
        });
        assert_eq!(ha.tally.received, 1);

        for test in [
            TestKind::SendLat,
            TestKind::ReadLat,
            TestKind::AtomicLat,
            TestKind::SendBw,
            TestKind::WriteBw,
            TestKind::ReadBw,
        ] {
            for old in [false, true] {
                let mut p = params(test, vec![8], 64);
                p.warmup = 3;
                p.amount = Amount::Iters(40);
                if test == TestKind::AtomicLat {
                    p.sizes = vec![8];
                }
                let (_dev, _a, _b, mut ha, mut hb) =
                    softnic_pair_with(&p, Duration::from_secs(20), old, false, true);
                let abort = AtomicBool::new(false);
                let m = std::thread::scope(|s| {
                    let h = crate::run::passive_works(test)
                        .then(|| s.spawn(|| hb.passive(&p, 8, &abort)));
                    let m = ha.active(&p, 8, &Counter::default(), &abort).unwrap();
                    if let Some(h) = h {
                        h.join().unwrap().unwrap();
                    }
                    m
                });
                assert_eq!(m.iterations, 40, "{test} old={old}");
                ha.settle().unwrap();
            }
        }
    }

    #[test]
    fn passive_side_sees_exactly_what_the_active_side_sent() {
        for (test, old) in [TestKind::SendLat, TestKind::WriteLat, TestKind::SendBw]
            .into_iter()
            .flat_map(|t| [(t, false), (t, true)])
        {
            let mut p = params(test, vec![8, 300], 64);
            p.warmup = 3;
            p.amount = Amount::Iters(50);
            let (_dev, _a, _b, mut ha, mut hb) =
                softnic_pair_with(&p, Duration::from_secs(10), old, false, false);
            assert_eq!(
                ha.post_path(),
                if old { "ibv_post_send" } else { "ibv_wr_*" }
            );
            for &size in &p.sizes {
                ha.clear_landing();
                hb.clear_landing();
                let abort = AtomicBool::new(false);
                let (m, n) = std::thread::scope(|s| {
                    let h = s.spawn(|| hb.passive(&p, size, &abort));
                    let m = ha.active(&p, size, &Counter::default(), &abort).unwrap();
                    (m, h.join().unwrap().unwrap())
                });
                ha.settle().unwrap();
                hb.settle().unwrap();
                if test == TestKind::SendBw {
                    // Exactly -n measured, plus the warm-up, all received; the ring drained.
                    assert_eq!(m.iterations, 50, "{test} {size}");
                    assert_eq!(m.per_qp, [50], "{test} {size}");
                    assert_eq!(n, 53, "{test} {size}");
                    assert_eq!(ha.outstanding(), 0, "{test} {size}");
                } else {
                    assert_eq!(m.iterations, 50, "{test} {size}");
                    assert_eq!(n, 53, "{test} {size}: every ping answered");
                    assert_eq!(m.latency.as_ref().unwrap().count(), 50);
                    assert!(m.per_qp.is_empty(), "{test} {size}");
                }
                assert!(ha.outstanding() < ha.signal_every() as u64, "{test} {size}");
            }
        }
    }

    /// `-q`: every QP streams (round-robin over the QPs with room), each completion goes
    /// back to its own QP's ring, every ring drains, the per-QP counts add up to the total,
    /// and the receiver of `send_bw` stops after the last SEND of every QP (it counts them
    /// all: warm-up and measured). On each post path, by count and by time.
    #[test]
    fn several_qps_share_the_cq_and_each_completes_its_share() {
        for (test, old) in [TestKind::SendBw, TestKind::WriteBw, TestKind::ReadBw]
            .into_iter()
            .flat_map(|t| [(t, false), (t, true)])
        {
            let mut p = params(test, vec![64, 4096], 64);
            p.qps = 4;
            p.warmup = 2; // fewer than the QPs: a final round of two
            p.amount = Amount::Iters(203);
            p.tx_depth = 16;
            p.cq_mod = 4;
            p.post_list = 2;
            let (_dev, a, _b, mut ha, mut hb) =
                softnic_pair_with(&p, Duration::from_secs(20), old, false, false);
            assert_eq!(a.qps.len(), 4);
            for (i, amount) in [Amount::Iters(203), Amount::Seconds(0.05)]
                .into_iter()
                .enumerate()
            {
                p.amount = amount;
                let size = p.sizes[i];
                let abort = AtomicBool::new(false);
                let (m, n) = std::thread::scope(|s| {
                    let h = crate::run::passive_works(test)
                        .then(|| s.spawn(|| hb.passive(&p, size, &abort)));
                    let m = ha.active(&p, size, &Counter::default(), &abort).unwrap();
                    (m, h.map(|h| h.join().unwrap().unwrap()))
                });
                ha.settle().unwrap();
                hb.settle().unwrap();
                let what = format!("{test} old={old} {amount:?}");
                if let Amount::Iters(k) = amount {
                    assert_eq!(m.iterations, k, "{what}");
                }
                assert_eq!(m.per_qp.len(), 4, "{what}");
                assert!(m.per_qp.iter().all(|&c| c > 0), "{what}: {:?}", m.per_qp);
                assert_eq!(m.per_qp.iter().sum::<u64>(), m.iterations, "{what}");
                assert_eq!(ha.outstanding(), 0, "{what}: every ring drained");
                if test == TestKind::SendBw {
                    assert_eq!(n, Some(m.iterations + 2), "{what}: all received");
                }
            }
        }
    }

    #[test]
    fn a_silent_peer_is_an_error_not_a_hang() {
        let p = params(TestKind::SendLat, vec![8], 16);
        let (_dev, _a, _b, _ha, mut hb) = softnic_pair(&p, Duration::from_millis(200));
        let abort = AtomicBool::new(false);
        let e = hb.passive(&p, 8, &abort).unwrap_err().to_string();
        assert!(e.contains("no progress"), "{e}");
    }

    #[test]
    fn abort_stops_a_waiting_side() {
        let p = params(TestKind::WriteLat, vec![8], 16);
        let (_dev, _a, _b, _ha, mut hb) = softnic_pair(&p, Duration::from_secs(3600));
        let abort = AtomicBool::new(true);
        let e = hb.passive(&p, 8, &abort).unwrap_err().to_string();
        assert!(e.contains("other side failed"), "{e}");
    }

    #[test]
    fn one_sided_tests_complete_every_operation() {
        for (test, old) in [
            TestKind::ReadLat,
            TestKind::AtomicLat,
            TestKind::WriteBw,
            TestKind::ReadBw,
        ]
        .into_iter()
        .flat_map(|t| [(t, false), (t, true)])
        {
            let mut p = params(test, vec![8], 16);
            p.amount = Amount::Iters(64);
            p.post_list = 4;
            let (_dev, _a, _b, mut ha, _hb) =
                softnic_pair_with(&p, Duration::from_secs(10), old, false, false);
            let m = ha
                .active(&p, 8, &Counter::default(), &AtomicBool::new(false))
                .unwrap();
            assert!(m.iterations >= 64, "{test}");
            assert_eq!(ha.outstanding(), 0, "{test}: every WR retired");
        }
    }

    /// `--timestamps`: on a device with completion timestamps (softnic's Spec profile)
    /// every measured iteration also gets a NIC-clock sample; on one without (the Rxe
    /// profile, as rxe) the side is refused at setup, naming the feature and the device.
    #[test]
    fn timestamps_time_every_iteration_or_are_refused_by_name() {
        let rxe = hotverbs_softnic::Profile::from_env() == hotverbs_softnic::Profile::Rxe;
        for test in [TestKind::SendLat, TestKind::ReadLat, TestKind::AtomicLat] {
            let mut p = params(test, vec![8], 16);
            p.amount = Amount::Iters(40);
            p.warmup = 3;
            let dev = Device::open("softnic", 1, None)
                .unwrap()
                .with_paths(false, true);
            assert_eq!(dev.ctx.supports_completion_timestamps().unwrap(), !rxe);
            if rxe {
                let e = SideRes::new(&dev, &p).err().expect("refused").to_string();
                assert!(
                    e.contains("completion timestamps are not supported by device softnic"),
                    "{e}"
                );
                continue;
            }
            let (_dev, _a, _b, mut ha, mut hb) =
                softnic_pair_with(&p, Duration::from_secs(10), false, true, false);
            assert!(ha.timestamp_clock().is_some());
            let abort = AtomicBool::new(false);
            let m = std::thread::scope(|s| {
                let h = s.spawn(|| hb.passive(&p, 8, &abort));
                let m = ha.active(&p, 8, &Counter::default(), &abort).unwrap();
                h.join().unwrap().unwrap();
                m
            });
            let host = m.latency.as_ref().unwrap();
            let nic = m.nic_latency.as_ref().expect("NIC-clock samples");
            assert_eq!(host.count(), 40, "{test}");
            assert_eq!(
                nic.count(),
                40,
                "{test}: one NIC sample per measured iteration"
            );
            assert!(nic.summary().unwrap().min > 0.0, "{test}");
        }
    }

    #[test]
    fn atomics_really_add() {
        let mut p = params(TestKind::AtomicLat, vec![8], 16);
        p.amount = Amount::Iters(40);
        p.warmup = 2;
        let (_dev, _a, b, mut ha, mut hb) = softnic_pair(&p, Duration::from_secs(10));
        hb.clear_landing();
        ha.active(&p, 8, &Counter::default(), &AtomicBool::new(false))
            .unwrap();
        // The landing zone of b holds the 64-bit counter fetch-and-added 42 times.
        let landing = b.landing(&p).addr as *const u64;
        // SAFETY: the landing zone is 8-byte aligned inside b's live MR; no WR is in flight.
        let v = unsafe { std::ptr::read_volatile(landing) };
        // (host order, or big-endian if the device stores atomics in wire order)
        assert!(v == 42 || v == 42u64.swap_bytes(), "{v:#x}");
    }
}
