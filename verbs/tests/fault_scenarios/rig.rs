//! The rig of the fault-scenario suite: which device and which expectations (`World`), a
//! connected RC pair on one CQ, a completion pump that hands every completion to the ring it
//! belongs to and logs it, and the documented recovery (ERR -> drain -> RESET through the
//! rings that own the queues, `reset_qp` / `reset_qp_with`, no `unsafe` -> reconnect).

use std::time::{Duration, Instant};

use hotverbs::datapath as dp;
use hotverbs::testing::{gid_index, rxe_required, Probe};
use hotverbs::*;

/// Which measured behaviour a device follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum World {
    /// The man pages (softnic's `Spec` profile, the default).
    Spec,
    /// rdma_rxe as measured in `rxe-vm/fault-truth.md`: real rxe, and softnic's `Rxe`
    /// profile (`HOTVERBS_SOFTNIC_PROFILE=rxe`), which imitates it without timers.
    Rxe,
}

/// The device under test and what to expect from it.
pub struct Env {
    pub ctx: Context,
    pub port: PortInfo,
    pub world: World,
    /// `softnic-spec`, `softnic-rxe` or the real device's name.
    pub label: String,
    /// A real device (completions take time; "never" is watched for a while).
    pub real: bool,
}

impl Env {
    /// Inside the rxe VM (`HOTVERBS_RXE=1`) or with `HOTVERBS_DEVICE` naming a real device:
    /// that device (the `hotverbs::testing` probe). Otherwise softnic's default device, whose
    /// profile follows `HOTVERBS_SOFTNIC_PROFILE=spec|rxe` (default spec).
    pub fn open(test: &str) -> Env {
        let named_real =
            std::env::var("HOTVERBS_DEVICE").is_ok_and(|d| !d.is_empty() && d != hotverbs::SOFTNIC);
        if rxe_required() || named_real {
            if let Some(ctx) = Probe::new().test(test).open() {
                let port = ctx.port_info(None, gid_index()).expect("port_info");
                let world = if ctx.name().starts_with("rxe") {
                    World::Rxe
                } else {
                    World::Spec
                };
                let label = ctx.name().to_string();
                return Env {
                    ctx,
                    port,
                    world,
                    label,
                    real: true,
                };
            }
        }
        // softnic's own rule (`Profile::from_env`): `rxe` in any case is Rxe, anything else
        // (unset, empty, `spec`, a typo softnic warns about) is Spec.
        let world = match std::env::var("HOTVERBS_SOFTNIC_PROFILE") {
            Ok(v) if v.trim().eq_ignore_ascii_case("rxe") => World::Rxe,
            _ => World::Spec,
        };
        let ctx = Context::open_softnic().expect("open softnic");
        let port = ctx.port_info(None, None).expect("port_info");
        let label = match world {
            World::Spec => "softnic-spec",
            World::Rxe => "softnic-rxe",
        }
        .to_string();
        Env {
            ctx,
            port,
            world,
            label,
            real: false,
        }
    }

    /// The value for this world.
    pub fn pick<T>(&self, spec: T, rxe: T) -> T {
        match self.world {
            World::Spec => spec,
            World::Rxe => rxe,
        }
    }

    /// Bound on waiting for something that must happen (only a failure waits this long).
    pub fn deadline(&self) -> Duration {
        if self.real {
            Duration::from_secs(20)
        } else {
            Duration::from_secs(2)
        }
    }

    /// How long "nothing happens" is watched: softnic is synchronous, so polling a few
    /// times is enough; on a real device a few hundred ms (the things watched never
    /// happen there at all).
    pub fn quiet(&self) -> Duration {
        if self.real {
            Duration::from_millis(300)
        } else {
            Duration::from_millis(5)
        }
    }

    /// The line the closing table is built from.
    ///
    /// Inside the rxe VM (`HOTVERBS_RXE=1`) the line also goes straight to stderr, past
    /// libtest's capture, so the harness's log carries the rxe column of the table.
    pub fn report(&self, scenario: &str, what: impl std::fmt::Display) {
        let line = format!("scenario {scenario}: {}: {what}", self.label);
        println!("{line}");
        if rxe_required() {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{line}");
        }
    }

    /// Connection options of the suite: MTU 1024 (rxe's), otherwise the defaults
    /// (timeout 14, retry_cnt 6, rnr_retry 7).
    pub fn opts(&self) -> ConnectOptions {
        ConnectOptions {
            mtu: Some(Mtu::Mtu1024),
            // fault-truth's RC setup: RNR waits for ever (the library's default is 6, a
            // bounded wait), so the scenarios that park a send in an RNR loop can.
            rnr_retry: 7,
            ..ConnectOptions::default()
        }
    }

    /// Options for a peer that is expected to fail: short timeout, few retries (about
    /// 3 x 16.8 ms on rxe).
    pub fn failing_opts(&self) -> ConnectOptions {
        ConnectOptions {
            timeout: 12,
            retry_cnt: 2,
            ..self.opts()
        }
    }

    /// A CQ, a PD and two RC QPs sharing it (not connected).
    pub fn pair(&self, shape: Shape) -> Pair {
        let pd = self.ctx.alloc_pd().expect("alloc_pd");
        let cq = self.ctx.create_cq(shape.cqe, None).expect("create_cq");
        let a = self.rc(&pd, &cq, shape);
        let b = self.rc(&pd, &cq, shape);
        Pair { pd, cq, a, b }
    }

    /// An RC QP of `shape`.
    pub fn rc(&self, pd: &Pd, cq: &Cq, shape: Shape) -> Qp {
        QpBuilder::new(pd, cq, cq, QpType::Rc)
            .max_send_wr(shape.send_wr)
            .max_recv_wr(shape.recv_wr)
            .max_inline_data(shape.inline)
            .build()
            .expect("create RC QP")
    }

    /// Connects `a` (with `oa`) and `b` (with `ob`) to each other.
    pub fn connect2(&self, a: &Qp, b: &Qp, oa: &ConnectOptions, ob: &ConnectOptions) {
        a.connect(&self.port, &b.endpoint(&self.port), oa)
            .expect("connect A");
        b.connect(&self.port, &a.endpoint(&self.port), ob)
            .expect("connect B");
    }

    /// Connects `a` and `b` to each other with `opts`.
    pub fn connect(&self, p: &Pair, opts: &ConnectOptions) {
        Qp::connect_pair(&p.a, &p.b, &self.port, opts).expect("connect_pair");
    }
}

/// Queue sizes of a pair.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub send_wr: u32,
    pub recv_wr: u32,
    pub inline: u32,
    pub cqe: u32,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            send_wr: 16,
            recv_wr: 16,
            inline: 64,
            cqe: 128,
        }
    }
}

/// Two RC QPs on one CQ (one poller; ring ids are unique per CQ, so they dispatch).
pub struct Pair {
    pub pd: Pd,
    pub cq: Cq,
    pub a: Qp,
    pub b: Qp,
}

/// One completion as the pump saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct Ev {
    /// The sink that took it (`A.sq`, `B.rq`, ...).
    pub who: &'static str,
    pub qp: u32,
    /// Send: the sequence number; receive: the slot.
    pub seq: u64,
    pub status: Result<(), WcError>,
    pub opcode: u32,
    pub byte_len: u32,
    pub imm: Option<u32>,
    pub src_qp: u32,
    /// Send: WRs this completion retired (0: stale). Receive: 1 if a message was handed out.
    pub retired: u64,
    /// Receive: the bytes in the slot (copied, then the slot released).
    pub data: Vec<u8>,
    /// A completion from before a ring reset, which the ring ignored (send) or refused as
    /// stale (receive). Left out of [`Log::of`] and everything built on it.
    pub stale: bool,
}

impl Ev {
    fn of(who: &'static str, c: &dp::Completion) -> Ev {
        Ev {
            who,
            qp: c.qp_num(),
            seq: c.seq() & 0xFFFF_FFFF,
            status: c.status(),
            opcode: c.opcode(),
            byte_len: c.byte_len(),
            imm: c.imm(),
            src_qp: c.src_qp(),
            retired: 0,
            data: Vec::new(),
            stale: false,
        }
    }

    /// `who:seq:STATUS`, e.g. `A.sq:1:IBV_WC_LOC_PROT_ERR`.
    pub fn short(&self) -> String {
        let s = match self.status {
            Ok(()) => "ok",
            Err(e) => e.name().trim_start_matches("IBV_WC_"),
        };
        format!("{}:{}:{}", self.who, self.seq, s)
    }
}

/// Every completion the pump handed out, in order.
#[derive(Debug, Default)]
pub struct Log(pub Vec<Ev>);

impl Log {
    pub fn of(&self, who: &str) -> Vec<&Ev> {
        self.0.iter().filter(|e| e.who == who && !e.stale).collect()
    }
    pub fn statuses(&self, who: &str) -> Vec<Result<(), WcError>> {
        self.of(who).iter().map(|e| e.status).collect()
    }
    pub fn received(&self, who: &str) -> Vec<Vec<u8>> {
        self.of(who)
            .iter()
            .filter(|e| e.status.is_ok())
            .map(|e| e.data.clone())
            .collect()
    }
    pub fn count(&self, who: &str) -> usize {
        self.of(who).len()
    }
    /// The sequence of `who:seq:STATUS` of the given sinks.
    pub fn trace(&self, whos: &[&str]) -> Vec<String> {
        self.0
            .iter()
            .filter(|e| whos.contains(&e.who) && !e.stale)
            .map(Ev::short)
            .collect()
    }
    /// Completions that were not stale.
    pub fn live(&self) -> usize {
        self.0.iter().filter(|e| !e.stale).count()
    }
    pub fn clear(&mut self) {
        self.0.clear();
    }
}

/// A ring the pump can give completions to.
pub trait Sink {
    fn who(&self) -> &'static str;
    fn id(&self) -> u8;
    /// Takes a completion of this ring and returns what it was.
    fn take(&mut self, c: &mut dp::Completion) -> Ev;
    /// Work the device holds: outstanding send WRs, posted receives.
    fn busy(&self) -> u64;
    /// The ring's progress counters, for a [`Watchdog`].
    fn progress(&self) -> Progress;
    /// posted_total == retired_total (send), no slot lost (receive).
    fn balanced(&self) -> bool;
}

/// The rings that own one QP's queues, which the recovery resets the QP through (a move to
/// RESET under a live ring is refused, `EBUSY`: the ring accounts for its WRs and resets
/// itself): a lone [`Tx`] or [`Rx`] (the QP's other queue has no ring), a `(Tx, Rx)` pair
/// of one QP (`reset_qp_with`), or [`Raw`] (no ring at all).
pub trait QpRings {
    /// The rings, as the pump's sinks.
    fn sinks(&mut self) -> Vec<&mut dyn Sink>;
    /// The QP to RESET through its rings; returns (send WRs that never completed, receive
    /// slots queued again).
    fn reset_qp(&mut self) -> (u64, u64);
    /// After reconnecting: receive rings post their slots again.
    fn refill(&mut self);
}

/// A send ring named for the log.
pub struct Tx<'r, 'q, const N: usize>(pub &'static str, pub &'r mut SendRing<'q, N>);
/// A receive ring named for the log; every message is copied into the log and released.
pub struct Rx<'r, 'q, const N: usize>(pub &'static str, pub &'r mut RecvRing<'q, N>);

impl<const N: usize> QpRings for Tx<'_, '_, N> {
    fn sinks(&mut self) -> Vec<&mut dyn Sink> {
        vec![self]
    }
    fn reset_qp(&mut self) -> (u64, u64) {
        let n = self
            .1
            .reset_qp()
            .unwrap_or_else(|e| panic!("{}: SendRing::reset_qp: {e}", self.0));
        (n, 0)
    }
    fn refill(&mut self) {}
}

impl<const N: usize> QpRings for Rx<'_, '_, N> {
    fn sinks(&mut self) -> Vec<&mut dyn Sink> {
        vec![self]
    }
    fn reset_qp(&mut self) -> (u64, u64) {
        let n = self
            .1
            .reset_qp()
            .unwrap_or_else(|e| panic!("{}: RecvRing::reset_qp: {e}", self.0));
        (0, n as u64)
    }
    fn refill(&mut self) {
        self.1.fill().expect("RecvRing::fill");
    }
}

impl<const N: usize, const M: usize> QpRings for (Tx<'_, '_, N>, Rx<'_, '_, M>) {
    fn sinks(&mut self) -> Vec<&mut dyn Sink> {
        vec![&mut self.0, &mut self.1]
    }
    fn reset_qp(&mut self) -> (u64, u64) {
        let (send, recv) = self
            .0
             .1
            .reset_qp_with(&mut *self.1 .1)
            .unwrap_or_else(|e| panic!("{}: SendRing::reset_qp_with: {e}", self.0 .0));
        (send, recv as u64)
    }
    fn refill(&mut self) {
        self.1.refill();
    }
}

/// A receive ring the recovery resets (its QP goes to RESET through it) but leaves
/// unfilled: for a test that posts the receives itself, later.
pub struct Unfilled<'r, 'q, const N: usize>(pub Rx<'r, 'q, N>);

impl<const N: usize> QpRings for Unfilled<'_, '_, N> {
    fn sinks(&mut self) -> Vec<&mut dyn Sink> {
        self.0.sinks()
    }
    fn reset_qp(&mut self) -> (u64, u64) {
        self.0.reset_qp()
    }
    fn refill(&mut self) {}
}

impl QpRings for Raw {
    fn sinks(&mut self) -> Vec<&mut dyn Sink> {
        vec![self]
    }
    fn reset_qp(&mut self) -> (u64, u64) {
        (0, 0)
    }
    fn refill(&mut self) {}
}

impl<const N: usize> Sink for Tx<'_, '_, N> {
    fn who(&self) -> &'static str {
        self.0
    }
    fn id(&self) -> u8 {
        self.1.ring_id()
    }
    fn take(&mut self, c: &mut dp::Completion) -> Ev {
        let mut ev = Ev::of(self.0, c);
        let before = self.1.retired_total();
        let r = self.1.on_completion(c);
        ev.retired = self.1.retired_total() - before;
        match r {
            Ok(0) => ev.stale = true,
            Ok(n) => assert_eq!(n, ev.retired),
            Err(e) => assert_eq!(Err(e), ev.status, "on_completion names the status"),
        }
        ev
    }
    fn busy(&self) -> u64 {
        self.1.outstanding()
    }
    fn progress(&self) -> Progress {
        self.1.progress()
    }
    fn balanced(&self) -> bool {
        self.1.outstanding() == 0 && self.1.retired_total() == self.1.posted_total()
    }
}

impl<const N: usize> Sink for Rx<'_, '_, N> {
    fn who(&self) -> &'static str {
        self.0
    }
    fn id(&self) -> u8 {
        self.1.ring_id()
    }
    fn take(&mut self, c: &mut dp::Completion) -> Ev {
        let mut ev = Ev::of(self.0, c);
        match self.1.on_completion(c) {
            Ok(m) => {
                assert!(
                    ev.status.is_ok(),
                    "a message only from a successful receive"
                );
                ev.data = self.1.data(&m).expect("data").to_vec();
                assert_eq!(m.byte_len(), ev.byte_len);
                ev.retired = 1;
                self.1.release(m).expect("release");
            }
            Err(dp::RecvError::Completion { slot, error }) => {
                assert_eq!(u64::from(slot), ev.seq);
                assert_eq!(Err(error), ev.status, "the receive error names the status");
            }
            Err(dp::RecvError::Stale { .. }) => ev.stale = true,
            Err(e) => panic!("{}: {e}", self.0),
        }
        ev
    }
    fn busy(&self) -> u64 {
        u64::from(self.1.posted())
    }
    fn progress(&self) -> Progress {
        self.1.progress()
    }
    fn balanced(&self) -> bool {
        self.1.held() == 0 && self.1.posted() + self.1.pending() <= self.1.count()
    }
}

/// Completions of WRs posted with the setup layer's `Qp::post_send` / `post_recv`, whose
/// `wr_id` carries ring id [`RAW`] (no ring on a CQ of the suite gets that far).
pub struct Raw(pub &'static str);

/// The ring-id byte of raw WRs' `wr_id`s.
pub const RAW: u8 = 200;

/// A `wr_id` for a raw WR: ring id [`RAW`], then `n`.
pub fn raw_id(n: u64) -> u64 {
    (u64::from(RAW) << 56) | n
}

impl Sink for Raw {
    fn who(&self) -> &'static str {
        self.0
    }
    fn id(&self) -> u8 {
        RAW
    }
    fn take(&mut self, c: &mut dp::Completion) -> Ev {
        Ev::of(self.0, c)
    }
    fn busy(&self) -> u64 {
        0
    }
    fn progress(&self) -> Progress {
        Progress::default()
    }
    fn balanced(&self) -> bool {
        true
    }
}

/// Polls until `until` holds (true) or the deadline passed (false), giving each completion
/// to its ring (by ring id: unique on the CQ) and logging it. A completion of no ring fails
/// the test; a poll error is returned.
pub fn try_pump<const B: usize>(
    p: &mut CqPoller<'_, B>,
    sinks: &mut [&mut dyn Sink],
    log: &mut Log,
    limit: Duration,
    mut until: impl FnMut(&Log, &[&mut dyn Sink]) -> bool,
) -> Result<bool, dp::PollError> {
    let deadline = Instant::now() + limit;
    loop {
        if until(log, sinks) {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        if poll_once(p, sinks, log)? == 0 {
            std::thread::yield_now();
        }
    }
}

/// One `poll_cq`: each completion to its ring (by ring id: unique on the CQ), logged.
pub fn poll_once<const B: usize>(
    p: &mut CqPoller<'_, B>,
    sinks: &mut [&mut dyn Sink],
    log: &mut Log,
) -> Result<usize, dp::PollError> {
    let cs = p.poll()?;
    let got = cs.len();
    for c in cs.iter_mut() {
        let s = sinks
            .iter_mut()
            .find(|s| s.id() == c.ring())
            .unwrap_or_else(|| panic!("a completion of no ring: {c:?}"));
        log.0.push(s.take(c));
    }
    Ok(got)
}

/// The stall watch on `sinks[which]` for a scenario whose outcome is "nothing happens":
/// pumps completions (any would be logged) until a [`Watchdog`] (50 ms on softnic, which
/// is synchronous; 300 ms on a real device, where what is watched never completes) reports
/// the ring stuck, and returns its error and the ring's progress then. Fails the test if
/// the ring goes idle or the watchdog does not fire within the deadline.
pub fn stall<const B: usize>(
    env: &Env,
    p: &mut CqPoller<'_, B>,
    sinks: &mut [&mut dyn Sink],
    log: &mut Log,
    which: usize,
) -> (Error, Progress) {
    let limit = if env.real {
        Duration::from_millis(300)
    } else {
        Duration::from_millis(50)
    };
    let mut dog = Watchdog::new(limit);
    let deadline = Instant::now() + env.deadline();
    loop {
        poll_once(p, sinks, log).expect("ibv_poll_cq");
        let pr = sinks[which].progress();
        assert!(
            pr.outstanding > 0,
            "{}: idle, not stalled",
            sinks[which].who()
        );
        if let Err(e) = dog.check(pr) {
            assert_eq!(
                (e.verb(), e.errno()),
                ("ring progress", libc::ETIMEDOUT),
                "{e}"
            );
            return (e, pr);
        }
        assert!(
            Instant::now() < deadline,
            "the watchdog never fired: {pr:?}"
        );
        std::thread::yield_now();
    }
}

/// [`try_pump`] within [`Env::deadline`], failing the test on a poll error.
pub fn pump<const B: usize>(
    env: &Env,
    p: &mut CqPoller<'_, B>,
    sinks: &mut [&mut dyn Sink],
    log: &mut Log,
    until: impl FnMut(&Log, &[&mut dyn Sink]) -> bool,
) -> bool {
    try_pump(p, sinks, log, env.deadline(), until).expect("ibv_poll_cq")
}

/// Pumps until `n` more completions were logged; fails the test otherwise.
pub fn expect_n<const B: usize>(
    env: &Env,
    p: &mut CqPoller<'_, B>,
    sinks: &mut [&mut dyn Sink],
    log: &mut Log,
    n: usize,
) {
    let want = log.live() + n;
    assert!(
        pump(env, p, sinks, log, |l, _| l.live() >= want),
        "expected {n} more completions, got {:?}",
        log.trace(&["A.sq", "A.rq", "B.sq", "B.rq", "C.sq", "C.rq"])
    );
}

/// Watches for [`Env::quiet`]: returns how many completions arrived meanwhile.
pub fn quiet<const B: usize>(
    env: &Env,
    p: &mut CqPoller<'_, B>,
    sinks: &mut [&mut dyn Sink],
    log: &mut Log,
) -> usize {
    let before = log.live();
    try_pump(p, sinks, log, env.quiet(), |_, _| false).expect("ibv_poll_cq");
    log.live() - before
}

/// Pumps until no sink holds work (every send WR retired, every receive completed).
pub fn drained<const B: usize>(
    env: &Env,
    p: &mut CqPoller<'_, B>,
    sinks: &mut [&mut dyn Sink],
    log: &mut Log,
) -> bool {
    pump(env, p, sinks, log, |_, s| s.iter().all(|s| s.busy() == 0))
}

/// Pumps until no sink holds work, or until nothing arrived for a quiet period (a second
/// on a real device, whose flushes come within milliseconds). Returns whether all drained.
pub fn drain_or_quiet<const B: usize>(
    env: &Env,
    p: &mut CqPoller<'_, B>,
    sinks: &mut [&mut dyn Sink],
    log: &mut Log,
) -> bool {
    let window = if env.real {
        Duration::from_secs(1)
    } else {
        env.quiet()
    };
    let deadline = Instant::now() + env.deadline();
    loop {
        let before = log.0.len();
        let done = try_pump(p, sinks, log, window, |_, s| {
            s.iter().all(|s| s.busy() == 0)
        })
        .expect("ibv_poll_cq");
        if done {
            return true;
        }
        if log.0.len() == before || Instant::now() >= deadline {
            return false;
        }
    }
}

/// What the recovery saw.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Completions drained after the modify to ERR.
    pub flushed: usize,
    /// WRs / receive slots the ring resets accounted for that never completed.
    pub unknown: u64,
}

/// The documented recovery of a pair: both QPs to ERR, drain every flush (every WR retires
/// exactly once), RESET through the rings that own each QP's queues (`owners`: each QP's
/// rings together, [`QpRings`]; a QP no ring owns is reset by hand), reconnect, re-post
/// receives. No `unsafe`: the rings' `reset_qp` / `reset_qp_with`.
pub fn recover<const B: usize>(
    env: &Env,
    (a, b): (&Qp, &Qp),
    opts: &ConnectOptions,
    p: &mut CqPoller<'_, B>,
    owners: &mut [&mut dyn QpRings],
    log: &mut Log,
) -> Recovered {
    for (q, name) in [(a, "A"), (b, "B")] {
        // RESET -> ERR is no transition; a QP in RESET holds no WRs anyway.
        if state(q) != QpState::Reset {
            q.to_error()
                .unwrap_or_else(|e| panic!("{name} -> ERR: {e}"));
        }
    }
    let before = log.0.len();
    // Everything outstanding completes with a flush (G8/G9), at once. What never completes
    // (an unsignaled WR that completed silently before the error, a completion the CQ
    // dropped) is accounted for by the ring resets below: drain until every ring is idle
    // or nothing arrived for a quiet period.
    {
        let mut sinks: Vec<&mut dyn Sink> = Vec::new();
        for o in owners.iter_mut() {
            sinks.extend(o.sinks());
        }
        drain_or_quiet(env, p, &mut sinks, log);
    }
    for e in log.0[before..].iter().filter(|e| !e.stale) {
        assert_eq!(
            e.status,
            Err(WcError::WrFlush),
            "after modify(ERR) only flushes: {e:?}"
        );
        assert_eq!(e.data, b"", "no buffer handed out by a flush");
    }
    let flushed = log.0[before..].iter().filter(|e| !e.stale).count();
    let mut unknown = 0;
    for o in owners.iter_mut() {
        // The rings move their QP to RESET (the device drops every WR) and account for
        // what never completed.
        let (send, _requeued) = o.reset_qp();
        unknown += send;
    }
    for (q, name) in [(a, "A"), (b, "B")] {
        // A QP no ring owns (raw posts only): by hand (refused, EBUSY, under a ring that
        // was not passed in `owners`).
        if state(q) != QpState::Reset {
            q.reset().unwrap_or_else(|e| panic!("{name} -> RESET: {e}"));
        }
    }
    env.connect2(a, b, opts, opts);
    for o in owners.iter_mut() {
        o.refill();
    }
    Recovered { flushed, unknown }
}

/// Sends `msg` from `tx` signaled and waits for its completion and its arrival at `rx_who`;
/// returns the bytes received.
pub fn ping<const N: usize, const B: usize>(
    env: &Env,
    p: &mut CqPoller<'_, B>,
    tx: &mut Tx<'_, '_, N>,
    others: &mut [&mut dyn Sink],
    rx_who: &str,
    log: &mut Log,
    msg: &[u8],
) -> Vec<u8> {
    tx.1.signal_next();
    tx.1.send_now(Msg::send(Local::Inline(msg)))
        .expect("send after recovery");
    let n_rx = log.received(rx_who).len();
    let mut sinks: Vec<&mut dyn Sink> = vec![tx];
    for s in others.iter_mut() {
        sinks.push(&mut **s);
    }
    assert!(
        pump(env, p, &mut sinks, log, |l, s| {
            l.received(rx_who).len() > n_rx && s[0].busy() == 0
        }),
        "the message after recovery did not arrive: {:?}",
        log.0.last()
    );
    assert!(sinks.iter().all(|s| s.balanced()), "rings balanced");
    log.received(rx_who).last().cloned().unwrap()
}

/// An owned region for receive rings.
pub fn region(pd: &Pd, len: usize) -> Mr<'static> {
    pd.alloc_mr(len, AccessFlags::LOCAL_WRITE)
        .expect("alloc_mr")
}

/// All remote rights.
pub fn rw() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// The QP's state as `ibv_query_qp` reports it.
pub fn state(q: &Qp) -> QpState {
    q.query().expect("query_qp").state()
}

/// Asserts a `hotverbs::Error` names `verb` and `errno`.
pub fn assert_err<T: std::fmt::Debug>(r: Result<T>, verb: &str, errno: i32) -> Error {
    let e = r.expect_err("must fail");
    assert_eq!((e.verb(), e.errno()), (verb, errno), "{e}");
    e
}
