//! An order gateway and the exchange it talks to, on the public API only, no `unsafe`:
//! what an HFT engineer copies first.
//!
//! The gateway sends 64-byte orders inline through a send ring (selective signaling: one
//! WR in `depth / 2` asks for a completion), keeping a window of them in flight; the
//! exchange takes each order from its receive ring and answers with a 16-byte ack, sent
//! from **inside its poll loop**; the gateway matches acks to orders and records each
//! round trip. Halfway, the exchange dies: the gateway's next orders fail, it recovers its
//! rings without `unsafe` (`reset_qp_with`), connects to a new exchange, re-sends what was
//! not acked, and goes on. At the end both sides drain, and the round-trip percentiles are
//! printed.
//!
//! The idioms it shows:
//! - **One engine for every post path.** [`Gateway`], [`Exchange`] and [`run_on`] are
//!   generic over the post path: `--wr` runs them on `ibv_wr_*` rings ([`Qp::wr_ring`])
//!   instead of `ibv_post_send` ones ([`Qp::send_ring`]). The rings meet in [`PostRing`];
//!   [`Path`] is the few lines that say how a path builds and recovers its ring (a
//!   ConnectX's [`DirectRing`] fits too, with a [`DirectPoller`] on a send CQ of its own).
//! - **Configuration said once.** Depth and inline limit are said on the `QpBuilder`;
//!   `SendConfig::default()` takes them from the QP.
//! - **Completion routing on one CQ.** Each side's sends and receives complete on one CQ;
//!   a completion goes to the ring whose id it carries ([`Completion::ring`]).
//! - **Replies inside the poll loop.** The poller's batch borrows the poller, not the send
//!   ring, so the exchange acks while it walks the batch. It retires the batch's send
//!   completions first, so a reply finds every slot the batch frees; a reply that still
//!   meets a full ring (`WouldBlock`) waits in a bounded queue (`heapless::Deque`, no
//!   allocation) and goes out first on the next poll. Never spin on `WouldBlock` inside the
//!   batch: only the next poll frees slots.
//! - **Receives before the first message.** Receive rings are filled while their QP is in
//!   INIT ([`Qp::init`]), before `connect`, so the first message never meets an RNR.
//! - **Recovery without `unsafe`.** `reset_qp_with` moves the QP to RESET and accounts every
//!   WR: posted = retired by completions + dropped by the reset.
//!
//! `cargo run --release -p hotverbs --example order_gateway [-- --orders N] [--window W] [--wr]`
//! (`--window`: orders in flight, 1 to 16, default 1: a round trip is then one order's)
//! (softnic when no RDMA device exists; `HOTVERBS_DEVICE=mlx5_0` picks a device).

use std::time::{Duration, Instant};

use heapless::Deque;
use hotverbs::*;

/// Orders in flight at most (the gateway's window).
pub const WINDOW: usize = 16;
/// Receive slots per side (each holds one order or one ack).
const SLOTS: u32 = 64;
/// Bytes per receive slot.
const SLOT_LEN: u32 = 64;
/// Send ring slots; the depth is `min(RING, max_send_wr)`.
const RING: usize = 32;
/// The longest any wait may take before the run gives up, saying what it waited for.
const PATIENCE: Duration = Duration::from_secs(20);

type BoxError = Box<dyn std::error::Error>;

/// How a post path builds its ring on a QP and recovers it: the only per-path code.
pub trait Path {
    /// The ring on a QP that lives for `'q`.
    type Ring<'q>: PostRing;
    /// Its name, for the report.
    const NAME: &'static str;
    /// A QP this path can post on.
    fn qp(pd: &Pd, cq: &Cq) -> Result<Qp> {
        QpBuilder::new(pd, cq, cq, QpType::Rc)
            .max_send_wr(RING as u32)
            .max_recv_wr(SLOTS)
            .max_inline_data(64)
            .build()
    }
    /// The ring (`SendConfig::default()`: depth and inline limit from the QP).
    fn ring(qp: &Qp, cfg: SendConfig) -> Result<Self::Ring<'_>>;
    /// Safe recovery: the QP to RESET, both rings reset; (send WRs dropped, receive
    /// slots requeued).
    fn recover<const M: usize>(
        ring: &mut Self::Ring<'_>,
        recv: &mut RecvRing<'_, M>,
    ) -> Result<(u64, usize)>;
}

/// `ibv_post_send` of preformatted WRs ([`SendRing`]).
#[derive(Debug)]
pub struct Legacy;
impl Path for Legacy {
    type Ring<'q> = SendRing<'q, RING>;
    const NAME: &'static str = "ibv_post_send";
    fn ring(qp: &Qp, cfg: SendConfig) -> Result<Self::Ring<'_>> {
        qp.send_ring::<RING>(cfg)
    }
    fn recover<const M: usize>(
        ring: &mut Self::Ring<'_>,
        recv: &mut RecvRing<'_, M>,
    ) -> Result<(u64, usize)> {
        ring.reset_qp_with(recv)
    }
}

/// `ibv_wr_start` / `ibv_wr_*` / `ibv_wr_complete` ([`WrRing`]).
#[derive(Debug)]
pub struct Wr;
impl Path for Wr {
    type Ring<'q> = WrRing<'q>;
    const NAME: &'static str = "ibv_wr_*";
    fn qp(pd: &Pd, cq: &Cq) -> Result<Qp> {
        QpBuilder::new(pd, cq, cq, QpType::Rc)
            .max_send_wr(RING as u32)
            .max_recv_wr(SLOTS)
            .max_inline_data(64)
            .send_ops(SendOps::SEND)
            .build()
    }
    fn ring(qp: &Qp, cfg: SendConfig) -> Result<Self::Ring<'_>> {
        qp.wr_ring(cfg)
    }
    fn recover<const M: usize>(
        ring: &mut Self::Ring<'_>,
        recv: &mut RecvRing<'_, M>,
    ) -> Result<(u64, usize)> {
        ring.reset_qp_with(recv)
    }
}

/// An order on the wire: 64 bytes, little-endian.
fn order(seq: u64) -> [u8; 64] {
    let mut o = [0u8; 64];
    o[..8].copy_from_slice(&seq.to_le_bytes());
    o[8..16].copy_from_slice(&(10_000 + seq % 100).to_le_bytes()); // price
    o[16..20].copy_from_slice(&(1 + (seq % 7) as u32).to_le_bytes()); // quantity
    o[20..24].copy_from_slice(b"HVX1"); // instrument
    o
}

/// An ack: the order's sequence number and the exchange's id for it.
fn ack(seq: u64, exchange_id: u64) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..8].copy_from_slice(&seq.to_le_bytes());
    a[8..].copy_from_slice(&exchange_id.to_le_bytes());
    a
}

fn seq_of(b: &[u8]) -> Result<u64, BoxError> {
    Ok(u64::from_le_bytes(
        b.get(..8).ok_or("short message")?.try_into()?,
    ))
}

/// The exchange: a send ring for acks and a receive ring for orders, on one CQ.
struct Exchange<'q, R: PostRing> {
    send: R,
    recv: RecvRing<'q, 64>,
    /// Acks that met a full send ring, sent first on the next poll (at most one per
    /// order in flight).
    deferred: Deque<[u8; 16], WINDOW>,
    /// The last order of the session: its ack is signaled, so the ring drains to empty.
    last: u64,
    taken: u64,
    /// Acks that had to wait for a slot.
    waited: u64,
}

impl<'q, R: PostRing> Exchange<'q, R> {
    fn new(send: R, recv: RecvRing<'q, 64>, last: u64) -> Self {
        Exchange {
            send,
            recv,
            deferred: Deque::new(),
            last,
            taken: 0,
            waited: 0,
        }
    }

    /// One poll of the exchange's CQ, acking what arrived from inside the loop.
    fn serve<P: PollCq>(&mut self, poller: &mut P) -> Result<(), BoxError> {
        // What waited for a slot goes first, in order.
        while let Some(a) = self.deferred.front() {
            if !self.try_ack(*a)? {
                break;
            }
            self.deferred.pop_front();
        }
        let batch = poller.poll()?;
        let me = self.send.ring_id();
        // Send completions first: every slot this batch frees is free before any reply.
        for c in batch.iter().filter(|c| c.ring() == me) {
            self.send.on_completion(c)?;
        }
        for c in batch.iter_mut().filter(|c| c.ring() != me) {
            let m = self.recv.on_completion(c)?;
            let seq = seq_of(self.recv.data(&m)?)?;
            self.recv.release(m)?;
            self.taken += 1;
            let a = ack(seq, 1_000_000 + self.taken);
            // Behind any that wait (acks keep the orders' order), else now.
            if !self.deferred.is_empty() || !self.try_ack(a)? {
                self.waited += 1;
                self.deferred
                    .push_back(a)
                    .map_err(|_| "more acks waiting than orders may be in flight")?;
            }
        }
        Ok(())
    }

    /// Sends one ack; `false` when the ring is full.
    fn try_ack(&mut self, a: [u8; 16]) -> Result<bool, BoxError> {
        if seq_of(&a)? == self.last {
            self.send.signal_next();
        }
        match self.send.send_now(Msg::send(Local::Inline(&a))) {
            Ok(_) => Ok(true),
            Err(SendError::WouldBlock) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// The gateway: a send ring for orders and a receive ring for acks, on one CQ.
struct Gateway<'q, R: PostRing> {
    send: R,
    recv: RecvRing<'q, 64>,
    /// Orders sent and not acked, oldest first, with their send time (RC delivers in
    /// order, so acks come in this order).
    in_flight: Deque<(u64, Instant), WINDOW>,
    next_seq: u64,
    /// Orders in flight at most (`1..=WINDOW`).
    window: usize,
    /// Round trips in nanoseconds (allocated once, before the loop).
    rtt_ns: Vec<u64>,
    /// WRs retired by completions (error completions included).
    retired: u64,
    /// Error completions seen.
    errors: Vec<WcError>,
}

impl<'q, R: PostRing> Gateway<'q, R> {
    /// Sends orders until the window is full or `end` is reached; the last order of the
    /// session is signaled so the ring can drain to empty.
    fn send_orders(&mut self, end: u64, last: u64) -> Result<(), BoxError> {
        while self.in_flight.len() < self.window && self.next_seq < end {
            let seq = self.next_seq;
            if seq == last {
                self.send.signal_next();
            }
            match self.send.send_now(Msg::send(Local::Inline(&order(seq)))) {
                Ok(_) => {}
                Err(SendError::WouldBlock) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            self.in_flight
                .push_back((seq, Instant::now()))
                .map_err(|_| "checked: the window is not full")?;
            self.next_seq += 1;
        }
        Ok(())
    }

    /// One poll: send completions retire the ring (an error one is counted and fails
    /// the ring until recovery), acks close their orders.
    fn poll<P: PollCq>(&mut self, poller: &mut P) -> Result<(), BoxError> {
        for c in poller.poll()? {
            if c.ring() == self.send.ring_id() {
                let was = self.send.retired_total();
                if let Err(e) = self.send.on_completion(c) {
                    self.errors.push(e);
                }
                self.retired += self.send.retired_total() - was;
                continue;
            }
            let m = match self.recv.on_completion(c) {
                Ok(m) => m,
                // A receive the QP's error flushed: it carried nothing; the slot is
                // reposted after recovery.
                Err(RecvError::Completion { .. }) => continue,
                // One of this ring's left in the CQ across the recovery's reset.
                Err(RecvError::Stale { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let seq = seq_of(self.recv.data(&m)?)?;
            self.recv.release(m)?;
            let (want, sent) = self
                .in_flight
                .pop_front()
                .ok_or_else(|| format!("ack {seq} with no order in flight"))?;
            if seq != want {
                return Err(format!("ack {seq}, expected {want}").into());
            }
            self.rtt_ns.push(sent.elapsed().as_nanos() as u64);
        }
        Ok(())
    }

    /// Orders acked so far.
    fn acked(&self) -> u64 {
        self.next_seq - self.in_flight.len() as u64
    }
}

/// Round trips until `end` orders are acked (`last`: the session's last order).
fn trade<RG: PostRing, RX: PostRing, PG: PollCq, PX: PollCq>(
    gw: &mut Gateway<'_, RG>,
    g_poll: &mut PG,
    x: &mut Exchange<'_, RX>,
    x_poll: &mut PX,
    end: u64,
    last: u64,
) -> Result<(), BoxError> {
    let mut idle = Idle::new("acks");
    while gw.acked() < end {
        let before = gw.acked();
        gw.send_orders(end, last)?;
        x.serve(x_poll)?;
        gw.poll(g_poll)?;
        idle.check(gw.acked() != before)?;
    }
    Ok(())
}

/// Bounds a wait: an error saying what was awaited once nothing moved for [`PATIENCE`].
struct Idle {
    what: &'static str,
    since: Instant,
}

impl Idle {
    fn new(what: &'static str) -> Self {
        Idle {
            what,
            since: Instant::now(),
        }
    }
    fn check(&mut self, moved: bool) -> Result<(), BoxError> {
        if moved {
            self.since = Instant::now();
        } else if self.since.elapsed() > PATIENCE {
            return Err(format!("no progress for {PATIENCE:?} waiting for {}", self.what).into());
        }
        Ok(())
    }
}

/// What a run did.
#[derive(Debug)]
pub struct Report {
    /// The post path.
    pub path: &'static str,
    /// Orders acked (every one).
    pub acked: u64,
    /// Orders re-sent to the second exchange (sent to the dead one, never acked).
    pub resent: u64,
    /// Gateway send WRs: posted, retired by completions, dropped by the recovery.
    pub posted: u64,
    /// See `posted`.
    pub retired: u64,
    /// See `posted`.
    pub dropped: u64,
    /// The error completions the dead exchange caused.
    pub errors: Vec<WcError>,
    /// Acks the exchanges deferred (a full send ring inside the poll loop).
    pub deferred_acks: u64,
    /// Round-trip percentiles (p50, p99, p99.9, max) in nanoseconds, from an order's
    /// post to its ack's poll (behind up to `window - 1` orders queued before it).
    pub rtt_ns: [u64; 4],
    /// Orders acked per second over the whole run (setup and recovery included).
    pub rate: f64,
}

fn receive_region(pd: &Pd) -> Result<Mr<'static>> {
    pd.alloc_mr((SLOTS * SLOT_LEN) as usize, AccessFlags::LOCAL_WRITE)
}

/// An exchange's own objects: its CQ, its QP (in INIT) and its receive region.
struct Venue {
    cq: Cq,
    qp: Qp,
    mem: Mr<'static>,
}

impl Venue {
    fn open<P: Path>(
        ctx: &Context,
        pd: &Pd,
        port: &PortInfo,
        opts: &ConnectOptions,
    ) -> Result<Venue> {
        let cq = ctx.create_cq(256, None)?;
        let qp = P::qp(pd, &cq)?;
        qp.init(port, opts)?;
        Ok(Venue {
            qp,
            cq,
            mem: receive_region(pd)?,
        })
    }

    /// Posts the exchange's receives (its QP is in INIT), connects it and the gateway's QP
    /// `g` to each other, and returns the exchange and its poller.
    fn connect<'v, P: Path>(
        &'v mut self,
        g: &Qp,
        port: &PortInfo,
        opts: &ConnectOptions,
        last: u64,
    ) -> Result<(Exchange<'v, P::Ring<'v>>, CqPoller<'v, 32>), BoxError> {
        let Venue { cq, qp, mem } = self;
        let (cq, qp): (&'v Cq, &'v Qp) = (cq, qp);
        let mut recv = qp.recv_ring::<64>(mem, 0, RecvConfig::slots(SLOT_LEN))?;
        recv.fill()?;
        g.connect(port, &qp.endpoint(port), opts)?;
        qp.connect(port, &g.endpoint(port), opts)?;
        // The exchange answers from a small ring (8 acks outstanding): a window of orders
        // can fill it inside one poll, and the deferral path runs.
        let ring = P::ring(qp, SendConfig::default().depth(8))?;
        Ok((Exchange::new(ring, recv, last), cq.poller::<32>()?))
    }
}

/// `orders` round trips on path `P`, the exchange dying after half of them.
pub fn run_on<P: Path>(ctx: &Context, orders: u64, window: usize) -> Result<Report, BoxError> {
    if orders < 2 * WINDOW as u64 || !(1..=WINDOW).contains(&window) {
        return Err(format!("orders >= {} and window in 1..={WINDOW}", 2 * WINDOW).into());
    }
    let start = Instant::now();
    let pd = ctx.alloc_pd()?;
    let port = ctx.port_info(None, None)?;
    // A dead peer fails a WR after timeout x retries: short ones, so the run does not wait
    // long for it on a real device (softnic fails it at once).
    let opts = ConnectOptions {
        timeout: 12,
        retry_cnt: 2,
        ..ConnectOptions::default()
    };
    let last = orders - 1;
    let half = orders / 2;

    // The gateway: its receive ring filled in INIT, before any exchange exists.
    let g_cq = ctx.create_cq(256, None)?;
    let g = P::qp(&pd, &g_cq)?;
    g.init(&port, &opts)?;
    let mut g_mem = receive_region(&pd)?;
    // As many slots as the QP and the region hold (64): the count said once, by the QP.
    let mut recv = g.recv_ring::<64>(&mut g_mem, 0, RecvConfig::slots(SLOT_LEN))?;
    recv.fill()?;
    let mut gw = Gateway {
        send: P::ring(&g, SendConfig::default())?,
        recv,
        in_flight: Deque::new(),
        next_seq: 0,
        window,
        rtt_ns: Vec::with_capacity(orders as usize + WINDOW),
        retired: 0,
        errors: Vec::new(),
    };
    let mut g_poll = g_cq.poller::<32>()?;
    let mut deferred_acks = 0;

    // The first exchange, for half the orders.
    {
        let mut venue = Venue::open::<P>(ctx, &pd, &port, &opts)?;
        let (mut ex, mut x_poll) = venue.connect::<P>(&g, &port, &opts, last)?;
        trade(&mut gw, &mut g_poll, &mut ex, &mut x_poll, half, last)?;
        deferred_acks += ex.waited;
        // The exchange dies: its QP is gone (a crashed process, a pulled cable).
    }

    // The gateway's next orders fail: the first with RETRY_EXC_ERR, the rest flush.
    gw.send_orders(half + WINDOW as u64, last)?;
    let mut idle = Idle::new("the dead exchange's error completion");
    while gw.send.error().is_none() {
        let before = gw.retired;
        gw.poll(&mut g_poll)?;
        idle.check(gw.retired != before)?;
    }

    // Recovery, no unsafe: the QP to RESET, every WR accounted, receives requeued; INIT
    // again and the receive ring refilled before the new exchange can send.
    let (dropped, _requeued) = P::recover(&mut gw.send, &mut gw.recv)?;
    g.init(&port, &opts)?;
    gw.recv.fill()?;
    let mut venue = Venue::open::<P>(ctx, &pd, &port, &opts)?;
    let (mut ex, mut x_poll) = venue.connect::<P>(&g, &port, &opts, last)?;

    // What the dead exchange never acked goes again, in order, then the rest.
    let resent = gw.in_flight.len() as u64;
    gw.next_seq -= resent;
    gw.in_flight.clear();
    trade(&mut gw, &mut g_poll, &mut ex, &mut x_poll, orders, last)?;

    // Graceful drain: both last messages were signaled, so both rings empty out.
    let mut idle = Idle::new("the last completions");
    while gw.send.outstanding() > 0 || ex.send.outstanding() > 0 {
        let before = gw.retired + ex.send.retired_total();
        ex.serve(&mut x_poll)?;
        gw.poll(&mut g_poll)?;
        idle.check(gw.retired + ex.send.retired_total() != before)?;
    }
    deferred_acks += ex.waited;

    let mut rtt = std::mem::take(&mut gw.rtt_ns);
    rtt.sort_unstable();
    let pct = |p: f64| rtt[((rtt.len() - 1) as f64 * p) as usize];
    Ok(Report {
        path: P::NAME,
        acked: gw.acked(),
        resent,
        posted: gw.send.posted_total(),
        retired: gw.retired,
        dropped,
        errors: std::mem::take(&mut gw.errors),
        deferred_acks,
        rtt_ns: [pct(0.5), pct(0.99), pct(0.999), pct(1.0)],
        rate: orders as f64 / start.elapsed().as_secs_f64(),
    })
}

pub fn main() -> std::result::Result<(), BoxError> {
    let mut orders = 100_000u64;
    let mut wr = false;
    let mut window = 1;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--orders" => orders = args.next().ok_or("--orders N")?.parse()?,
            "--wr" => wr = true,
            "--window" => window = args.next().ok_or("--window W")?.parse()?,
            other => {
                return Err(
                    format!("unknown argument {other:?}: [--orders N] [--window W] [--wr]").into(),
                )
            }
        }
    }
    // $HOTVERBS_DEVICE, else the first RDMA device; with none, the software device, said so.
    let ctx = Context::open_default().or_else(|e| {
        eprintln!("{e}: running on softnic, the in-process software device");
        Context::open_softnic()
    })?;
    let r = if wr {
        run_on::<Wr>(&ctx, orders, window)?
    } else {
        run_on::<Legacy>(&ctx, orders, window)?
    };
    let [p50, p99, p999, max] = r.rtt_ns;
    println!(
        "{} orders acked on {} over {} ({} re-sent after the exchange died; {} acks deferred \
         inside the poll loop)",
        r.acked,
        ctx.name(),
        r.path,
        r.resent,
        r.deferred_acks
    );
    println!(
        "gateway send WRs: {} posted = {} retired by completions + {} dropped by the \
         recovery; error completions: {:?}",
        r.posted, r.retired, r.dropped, r.errors
    );
    println!(
        "round trip ns (window {window}): p50 {p50}  p99 {p99}  p99.9 {p999}  max {max}; \
         {:.0} orders/s",
        r.rate
    );
    Ok(())
}
