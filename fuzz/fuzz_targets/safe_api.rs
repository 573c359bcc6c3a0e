//! Random sequences of **safe** calls of the `hotverbs` API on softnic (issue 27): both
//! profiles (`Spec`, `Rxe`), with and without the mlx5 personality, under AddressSanitizer.
//!
//! Each input builds a world of its own: one of four process-wide softnic devices (profile x
//! mlx5), a PD, two CQs (plain, extended, or extended without `QP_NUM`, sizes from the
//! input), one to three RC QP pairs (plain or extended QPs, send queues 2..=16 deep, a CQ
//! layout from the input: sends on one CQ and receives on the other, each pair on its own
//! CQ, or any), each pair made and connected when an operation first needs one of its QPs,
//! a receive region per QP made with its ring, and one write target. Then up to 48
//! operations, in any order:
//! - rings: `Qp::send_ring`, `Qp::wr_ring`, `Qp::direct_ring` (with the send CQ's direct
//!   poller), `Qp::recv_ring` (over the QP's region, borrowed exclusively), any
//!   configuration (depth, `signal_every`, batch, inline limit, remote or none); dropped in
//!   any order with WRs outstanding; `std::mem::swap` of two rings of one kind;
//! - pollers: `Cq::poller`, `Cq::ex_poller` (any field set), `Cq::direct_poller`, dropped
//!   and made again; `Cq::poll` beside them;
//! - posting: `send_now`, batches (finished, dropped, `mem::forget`ten), `DirectRing`'s
//!   inline gathers, `flush`, `flush_signaled`, `signal_next`; SEND / SEND_WITH_IMM /
//!   WRITE / WRITE_WITH_IMM, inline or empty, too long or out of range; `fill`, `repost`,
//!   `release` (to its ring or to another: `Foreign`);
//! - polling through every poller kind (`poll`, `poll_spin`, `poll_into`, `CqPoller::drain`
//!   with a panic inside the closure, caught), each completion first handed to a wrong ring
//!   when the input says so (a send ring's `on_completion` takes `&Completion`, so it is
//!   still there), then to its own, sometimes a second time;
//! - recovery: `Qp::to_error`, `Qp::reset`, `Qp::connect` (to the peer or another QP),
//!   the rings' `reset_qp`, `reset_qp_with` (with the right receive ring or another),
//!   `DirectRing::reset_qp(&mut poller)` (with the right poller or another CQ's),
//!   `set_remote` (another QP's region, or a key nobody registered); `drain` with a zero
//!   timeout (one poll round, deterministic), a panic inside its closure;
//! - transient QPs: a QP (pair, or one connected to a QP of the world) made in the middle
//!   of the input on the world's CQs or on a CQ of its own (with a verbs or direct poller of
//!   its own, or none), with its own rings, traffic, optionally an error, then destroyed in
//!   any order (poller, rings, QPs, the receive region, the CQ handle) while the world's
//!   pollers and rings live on: its leftover completions must be refused by every ring of
//!   the world, and its ring ids are given to later rings.
//!
//! What is checked (a failed `assert!` is a crash):
//! - **every WR is retired exactly once or refused with a named error**: per send ring a
//!   ledger of the sequence numbers it handed out (each the next one expected), what
//!   completions retired (`on_completion`'s count; for an error completion the ring's
//!   retired count moved to exactly the completion's sequence), what resets dropped
//!   (`reset_qp`'s count) and what posts refused (`SendError::Post`, from the ring's end
//!   moving back, the refusal naming exactly the first WR not posted); the ring's retired
//!   count equals completions + resets after every call; a completion that retires
//!   anything retires exactly up to its own sequence. Per receive ring: receives posted =
//!   accepted + failed + discarded by a reset + still posted, `held()` = the `Received`s the
//!   harness holds, a reset requeues exactly the slots not held. At the end of every input
//!   everything is brought to rest (flush; `drain`, which asks for the signal an unsignaled
//!   tail needs, issue 27 item 11, and when it says it cannot, the last message after
//!   `signal_next`; QPs to ERR and every CQ polled until the flushes come, rounds bounded)
//!   and every ring must balance exactly: nothing outstanding, nothing posted, handed out =
//!   retired + dropped + refused (+ what a `mem::forget`ten batch leaked, which the ring
//!   says it drops);
//! - **a completion that is not a ring's is an error, never `Ok`**: a completion handed to a
//!   wrong ring (another ring, another kind, another QP, a destroyed QP's) is `Misrouted`
//!   and changes nothing; handed to its own ring it is never `Misrouted`; a consumed receive
//!   completion given again is `Stale` (receive ring) or `Ok(0)` (send ring);
//! - **received data**: every message a receive ring hands out is one the harness sent to
//!   that QP, byte for byte, and none is received twice (a replayed WQE would be);
//! - **named errors, and the right ones**: every `hotverbs::Error` has an errno of the
//!   call's documented set and formats; `Cq::poll` is `EBUSY` exactly while rings reserve
//!   the CQ, a poller exists or the CQ went to the direct path, else it returns nothing;
//!   `Qp::reset` / `Qp::connect` are `EBUSY` exactly while a ring owns the QP (connect from
//!   RESET is the reconnect after `reset_qp`); a second ring on a queue is `EBUSY`;
//!   `RecvRing::reset_qp` is `EBUSY` while a send ring owns the QP and vice versa;
//!   `reset_qp_with` another QP's receive ring is `EINVAL`; `to_error` fails exactly in
//!   RESET; pollers: `EBUSY` while one exists or (verbs pollers) after a direct one,
//!   `EINVAL` for an extended poller on a plain CQ, one without `QP_NUM` or with fields the
//!   CQ lacks, `EOPNOTSUPP` for a direct poller off mlx5; no `WcError::Unknown`;
//! - **nothing waits forever**: every loop is bounded by a count (`drain` has a zero
//!   timeout); at the end a ring may stay unretired after the bounded rounds only for a
//!   reason the API named (its CQ jammed by a poll error, its QP left in RESET, a post whose
//!   outcome the provider did not name), and then its `reset_qp` accounts for it. (And,
//!   while `DIRECT_OVER_VERBS_LOSES` says so, a CQ handed to the direct path with verbs-path
//!   rings on it: README finding 4.)
//!
//! Planted bug (`--features planted-bug`): the harness ignores the count `reset_qp` returns
//! (as if the dropped WRs would still be retired by completions, the recovery accounting of
//! issue 27 gone wrong): the ledger no longer balances as soon as a reset drops a WR.
#![no_main]

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use hotverbs::datapath::mlx5::DirectError;
use hotverbs::datapath::wr_id;
use hotverbs::*;
use hotverbs_softnic::Profile;
use libfuzzer_sys::fuzz_target;

/// Send ring slots (`SendRing<N>`).
const N: usize = 16;
/// Receive ring slots (`RecvRing<RN>`).
const RN: usize = 16;
/// Poller batch.
const PB: usize = 8;
/// Every QP's `max_inline_data`.
const QP_INLINE: u32 = 64;
const MAX_OPS: usize = 48;
/// Slots for rings of each kind (send-side, receive).
const SLOTS: usize = 4;
const N_CQS: usize = 2;
/// Bytes of the write target per QP.
const TARGET_STRIDE: u64 = 256;
const MAX_QPS: usize = 6;
/// Receive region per QP.
const REGION: usize = 2048;
/// Polls per CQ in one round of the final rest (a poll returns up to `PB`).
const REST_POLLS: usize = 64;
/// Rounds of the final rest (each: QPs to ERR, poll every CQ).
const REST_ROUNDS: usize = 6;
const PLANTED: bool = cfg!(feature = "planted-bug");

// ---------------------------------------------------------------------------------------
// Panics the input asks for (inside poll closures) are caught; any other panic is a finding.

thread_local! {
    static EXPECT_PANIC: Cell<bool> = const { Cell::new(false) };
}

/// The payload of a planned panic.
struct Planned;

fn install_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // libfuzzer-sys' hook aborts the process: keep it for every panic but ours.
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if EXPECT_PANIC.with(Cell::get) {
                return;
            }
            prev(info);
        }));
    });
}

fn planned_panic() -> ! {
    EXPECT_PANIC.with(|e| e.set(true));
    std::panic::panic_any(Planned)
}

/// Runs `f`; `None` if it made a planned panic (any other panic goes on, to the hook).
fn catching<R>(f: impl FnOnce() -> R) -> Option<R> {
    let r = catch_unwind(AssertUnwindSafe(f));
    EXPECT_PANIC.with(|e| e.set(false));
    match r {
        Ok(v) => Some(v),
        Err(p) if p.downcast_ref::<Planned>().is_some() => None,
        Err(p) => std::panic::resume_unwind(p),
    }
}

// ---------------------------------------------------------------------------------------
// Statistics (`HOTVERBS_FUZZ_STATS=1`: printed every 20 000 inputs), to see what the inputs
// reach.

thread_local! {
    static STATS: RefCell<std::collections::BTreeMap<&'static str, u64>> = RefCell::new(Default::default());
    static STATS_ON: bool = std::env::var_os("HOTVERBS_FUZZ_STATS").is_some();
}

fn stat(k: &'static str) {
    if STATS_ON.with(|s| *s) {
        STATS.with(|m| *m.borrow_mut().entry(k).or_default() += 1);
    }
}

// ---------------------------------------------------------------------------------------
// Devices: four per process (softnic never reuses object slots; a device per input would
// grow without bound).

struct Dev {
    ctx: Context,
    port: PortInfo,
}

thread_local! {
    static DEVS: RefCell<Vec<Option<Dev>>> = RefCell::new((0..4).map(|_| None).collect());
}

/// Device `i`: bit 0 the Rxe profile, bit 1 the mlx5 personality.
fn device(i: usize) -> (Context, PortInfo) {
    DEVS.with(|d| {
        let mut d = d.borrow_mut();
        let slot = &mut d[i];
        if slot.is_none() {
            let ctx = Context::open_softnic_with(SoftnicConfig {
                name: format!("fuzz_safe_api_{i}"),
                profile: if i & 1 != 0 {
                    Profile::Rxe
                } else {
                    Profile::Spec
                },
                mlx5: i & 2 != 0,
                ..Default::default()
            })
            .expect("open softnic");
            let port = ctx.port_info(None, None).expect("port_info");
            *slot = Some(Dev { ctx, port });
        }
        let dev = slot.as_ref().expect("just made");
        (dev.ctx.clone(), dev.port)
    })
}

// ---------------------------------------------------------------------------------------
// The input.

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum CqKind {
    Plain,
    Ex,
    ExNoQpn,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct CqSpec {
    kind: CqKind,
    size: u8,
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum Ext {
    No,
    All,
    /// SEND and SEND_WITH_IMM only: a WrRing's WRITEs are `OpNotEnabled`.
    SendOnly,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct QpSpec {
    send_cq: bool,
    recv_cq: bool,
    ext: Ext,
    sq: u8,
}

#[derive(Debug, Clone, Copy)]
struct Setup {
    rxe: bool,
    mlx5: bool,
    pairs: u8,
    /// < 128: send queues on CQ 0, receive queues on CQ 1 (the direct path's layout);
    /// < 176: QP k's queues both on CQ k % 2; else each QP's own choice.
    layout: u8,
    cqs: [CqSpec; N_CQS],
    qps: [QpSpec; MAX_QPS],
    /// `rnr_retry` 7 (wait for a receive for ever) instead of 6 (RNR error at once).
    rnr_wait: bool,
    /// `retry_cnt` 7 (rxe holds a WR nobody answers for ever) instead of 6.
    retry_hold: bool,
}

/// Nine bytes (short inputs reach the operations): flags, two CQs, six QPs.
impl<'a> Arbitrary<'a> for Setup {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let f: u8 = u.arbitrary()?;
        let c: [u8; N_CQS] = u.arbitrary()?;
        let q: [u8; MAX_QPS] = u.arbitrary()?;
        let cq = |x: u8| CqSpec {
            kind: [CqKind::Plain, CqKind::Plain, CqKind::Ex, CqKind::ExNoQpn][usize::from(x & 3)],
            size: x >> 2,
        };
        let qp = |x: u8| QpSpec {
            ext: [Ext::No, Ext::No, Ext::All, Ext::SendOnly][usize::from(x & 3)],
            send_cq: x & 4 != 0,
            recv_cq: x & 8 != 0,
            sq: if x >> 4 < 12 { 255 } else { x >> 4 },
        };
        Ok(Setup {
            rxe: f & 1 != 0,
            mlx5: f & 2 != 0,
            rnr_wait: f & 4 != 0,
            retry_hold: f & 8 != 0,
            pairs: (f >> 4) & 3,
            layout: [0, 64, 150, 200][usize::from(f >> 6)],
            cqs: c.map(cq),
            qps: q.map(qp),
        })
    }
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum SKind {
    Verbs,
    Wr,
    Direct,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct RingCfg {
    /// < 24: signal and batch taken as they come (maybe invalid: EINVAL), depth not capped
    /// at the QP's.
    wild: u8,
    depth: u8,
    signal: u8,
    batch: u8,
    /// 0: 64 (the QP's), 1: 32, 2: 65 (more than the QP's: EINVAL), 3: 0.
    inline: u8,
    remote: bool,
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum MOp {
    Send,
    SendImm,
    Write,
    WriteImm,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct MsgSpec {
    op: MOp,
    /// Inline length (0..=80; above the ring's limit: `InlineTooLong`); 0xff: `Local::Empty`.
    len: u8,
    /// Remote offset in 8-byte units (out of range past the target).
    off: u8,
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum BatchEnd {
    Finish,
    Drop,
    Forget,
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum PKind {
    Verbs,
    Ex,
    Direct,
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum PollHow {
    Poll,
    Spin,
    Into,
    /// `CqPoller::drain`, panicking after the completion at this index (if there is one).
    Drain(u8),
}

/// How polled completions are handed out.
#[derive(Arbitrary, Debug, Clone, Copy, Default)]
struct Route {
    /// Bit `k % 8`: completion `k` goes to a wrong ring first.
    wrong: u8,
    /// Which wrong ring.
    pick: u8,
    /// A consumed receive completion (and any send completion) is handed to its ring again.
    again: bool,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct TransientSpec {
    send_cq: bool,
    recv_cq: bool,
    /// Connect the transient sender to this QP of the world instead of a transient peer.
    to_world: Option<u8>,
    kind: SKind,
    msgs: u8,
    poll: bool,
    error: bool,
    /// Drop the receive ring before the send ring.
    recv_first: bool,
    /// Destroy the receiver QP before the sender.
    qp_order: bool,
    /// Drop the receive region before the QPs.
    region_first: bool,
    route: Route,
    /// `% 4`: 0 the world's CQs; else a CQ of its own for both QPs (made here, its handle
    /// dropped before or after the QPs: `cq_first`), with 2 a verbs poller, 3 a direct
    /// poller on it (mlx5), polled here and dropped before or after the rings.
    own_cq: u8,
    cq_first: bool,
    poller_first: bool,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    SendRing {
        qp: u8,
        kind: SKind,
        cfg: RingCfg,
    },
    RecvRing {
        qp: u8,
        count: u8,
        slot_len: u8,
        repost: u8,
        offset: u8,
    },
    DropSend(u8),
    DropRecv(u8),
    SwapSend(u8, u8),
    SwapRecv(u8, u8),
    Poller {
        cq: u8,
        kind: PKind,
        fields: u8,
    },
    DropPoller(u8),
    SendNow {
        ring: u8,
        msg: MsgSpec,
        signal: bool,
    },
    Batch {
        ring: u8,
        msgs: [MsgSpec; 4],
        n: u8,
        end: BatchEnd,
    },
    Gather {
        ring: u8,
        msg: MsgSpec,
        cuts: [u8; 2],
    },
    Flush {
        ring: u8,
        signaled: bool,
    },
    Fill(u8),
    Repost(u8),
    Release {
        ring: u8,
        idx: u8,
        to: Option<u8>,
    },
    Poll {
        cq: u8,
        how: PollHow,
        rounds: u8,
        route: Route,
    },
    CqPoll(u8),
    ToError(u8),
    QpReset(u8),
    Connect {
        qp: u8,
        to: u8,
    },
    RingReset {
        ring: u8,
        with_recv: Option<u8>,
        wrong_poller: bool,
    },
    RecvReset(u8),
    Drain {
        ring: u8,
        panic_round: Option<u8>,
        route: Route,
    },
    Transient(TransientSpec),
    /// `set_remote` to QP `to`'s part of the write target (a new peer's region after a
    /// reconnect), or with a key nobody registered.
    SetRemote {
        ring: u8,
        to: u8,
        bad_key: bool,
    },
}

/// Operations are drawn with weights (posting and polling most): one byte picks the kind.
impl<'a> Arbitrary<'a> for Op {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let k: u8 = u.arbitrary()?;
        Ok(match k {
            0..=19 | 182..=214 => Op::SendNow {
                ring: u.arbitrary()?,
                msg: u.arbitrary()?,
                signal: u.arbitrary()?,
            },
            20..=33 | 215..=249 => Op::Poll {
                cq: u.arbitrary()?,
                how: u.arbitrary()?,
                rounds: u.arbitrary()?,
                route: u.arbitrary()?,
            },
            34..=45 => Op::SendRing {
                qp: u.arbitrary()?,
                kind: u.arbitrary()?,
                cfg: u.arbitrary()?,
            },
            46..=55 => Op::Batch {
                ring: u.arbitrary()?,
                msgs: u.arbitrary()?,
                n: u.arbitrary()?,
                end: u.arbitrary()?,
            },
            56..=63 => Op::RecvRing {
                qp: u.arbitrary()?,
                count: u.arbitrary()?,
                slot_len: u.arbitrary()?,
                repost: u.arbitrary()?,
                offset: u.arbitrary()?,
            },
            64..=71 => Op::Fill(u.arbitrary()?),
            72..=79 => Op::Release {
                ring: u.arbitrary()?,
                idx: u.arbitrary()?,
                to: u.arbitrary()?,
            },
            80..=87 => Op::Drain {
                ring: u.arbitrary()?,
                panic_round: u.arbitrary()?,
                route: u.arbitrary()?,
            },
            88..=95 => Op::RingReset {
                ring: u.arbitrary()?,
                with_recv: u.arbitrary()?,
                wrong_poller: u.arbitrary()?,
            },
            96..=103 => Op::Poller {
                cq: u.arbitrary()?,
                kind: u.arbitrary()?,
                fields: u.arbitrary()?,
            },
            104..=109 => Op::Connect {
                qp: u.arbitrary()?,
                to: u.arbitrary()?,
            },
            110..=115 => Op::ToError(u.arbitrary()?),
            116..=121 => Op::Flush {
                ring: u.arbitrary()?,
                signaled: u.arbitrary()?,
            },
            122..=127 => Op::Repost(u.arbitrary()?),
            128..=133 => Op::RecvReset(u.arbitrary()?),
            134..=139 => Op::QpReset(u.arbitrary()?),
            140..=145 => Op::CqPoll(u.arbitrary()?),
            146..=151 => Op::SwapSend(u.arbitrary()?, u.arbitrary()?),
            152..=155 => Op::SwapRecv(u.arbitrary()?, u.arbitrary()?),
            156..=161 => Op::DropSend(u.arbitrary()?),
            162..=165 => Op::DropRecv(u.arbitrary()?),
            166..=171 => Op::DropPoller(u.arbitrary()?),
            172..=177 => Op::Gather {
                ring: u.arbitrary()?,
                msg: u.arbitrary()?,
                cuts: u.arbitrary()?,
            },
            178..=181 => Op::SetRemote {
                ring: u.arbitrary()?,
                to: u.arbitrary()?,
                bad_key: u.arbitrary()?,
            },
            _ => Op::Transient(u.arbitrary()?),
        })
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    setup: Setup,
    /// The order things are dropped at the end.
    teardown: u8,
    /// The rest of the input, op after op.
    ops: Vec<Op>,
}

// ---------------------------------------------------------------------------------------
// Rings and pollers behind one face each.

/// What the harness needs of every send-side ring kind (their methods have the same names
/// but no common trait).
trait AnySend {
    fn complete(&mut self, c: &Completion) -> Result<u64, WcError>;
    fn posted(&self) -> u64;
    fn retired(&self) -> u64;
    fn staged_n(&self) -> u64;
    fn out(&self) -> u64;
    fn id(&self) -> u8;
    fn err(&self) -> Option<WcError>;
}

macro_rules! any_send {
    ($t:ty) => {
        impl AnySend for $t {
            fn complete(&mut self, c: &Completion) -> Result<u64, WcError> {
                self.on_completion(c)
            }
            fn posted(&self) -> u64 {
                self.posted_total()
            }
            fn retired(&self) -> u64 {
                self.retired_total()
            }
            fn staged_n(&self) -> u64 {
                self.staged()
            }
            fn out(&self) -> u64 {
                self.outstanding()
            }
            fn id(&self) -> u8 {
                self.ring_id()
            }
            fn err(&self) -> Option<WcError> {
                self.error()
            }
        }
    };
}
any_send!(SendRing<'_, N>);
any_send!(WrRing<'_>);
any_send!(DirectRing<'_>);

#[allow(clippy::large_enum_variant)] // One per slot; boxing would add nothing to check.
enum SendSlot<'a> {
    V(SendRing<'a, N>),
    W(WrRing<'a>),
    D(DirectRing<'a>),
}

/// `$body` once per ring kind, with `$r` the concrete ring.
macro_rules! on_ring {
    ($slot:expr, $r:ident => $body:expr) => {
        match $slot {
            SendSlot::V($r) => $body,
            SendSlot::W($r) => $body,
            SendSlot::D($r) => $body,
        }
    };
}

impl SendSlot<'_> {
    fn any(&mut self) -> &mut dyn AnySend {
        on_ring!(self, r => r)
    }
    fn any_ref(&self) -> &dyn AnySend {
        on_ring!(self, r => r)
    }
}

/// A send ring's ledger (moves with the ring: `mem::swap` swaps whole entries).
#[derive(Debug)]
struct SendLedger {
    qp: usize,
    qpn: u32,
    cq: usize,
    kind: SKind,
    ring_id: u8,
    depth: u64,
    /// The ring's inline limit and whether it has a remote.
    max_inline: u32,
    remote: bool,
    /// The next sequence number the ring should hand out (its end: posted + staged).
    end: u64,
    /// Sequence numbers handed out (to the harness, or to `drain`'s own signal).
    handed: u64,
    /// Retired by completions.
    retired: u64,
    /// Dropped by resets (`reset_qp`'s count).
    dropped: u64,
    /// Of those, staged (never posted) when the reset came.
    dropped_staged: u64,
    /// Refused by a post (`SendError::Post`, or a dropped batch's deferred refusal).
    refused: u64,
    /// Dropped with a `mem::forget`ten batch.
    leaked: u64,
    /// A post failed without naming a WR: only a reset brings the ring back.
    unknown_post: bool,
    /// A batch was `mem::forget`ten: the ring drops its staged WRs at its next call
    /// (`drop_leaked_batch`), and sequence numbers go back then.
    leak_pending: bool,
}

struct SendEntry<'a> {
    ring: SendSlot<'a>,
    led: SendLedger,
}

#[derive(Debug)]
struct RecvLedger {
    qp: usize,
    qpn: u32,
    cq: usize,
    ring_id: u8,
    count: u32,
    /// Receives posted (fill / repost / release's own re-post).
    posted: u64,
    /// Completions accepted (`Ok(Received)`).
    accepted: u64,
    /// Completions with an error status (`RecvError::Completion`).
    failed: u64,
    /// Posted receives a reset discarded.
    discarded: u64,
    unknown_post: bool,
}

struct RecvEntry<'a> {
    ring: RecvRing<'a, RN>,
    led: RecvLedger,
    held: Vec<Received>,
}

enum Poller<'a> {
    V(CqPoller<'a, PB>),
    X(ExCqPoller<'a, PB>),
    D(DirectPoller<'a, PB>),
}

// ---------------------------------------------------------------------------------------
// The model of the world.

#[derive(Debug, Clone)]
struct QpInfo {
    qpn: u32,
    send_cq: usize,
    recv_cq: usize,
    ext: Ext,
    max_send_wr: u32,
    max_sge: u32,
    /// In RESET (after `Qp::reset` or a ring's `reset_qp`, until `connect`).
    in_reset: bool,
    /// The QP its messages go to (connect's remote).
    peer_qpn: u32,
    /// A ring was made on the queue once: a second one is refused for the QP's life.
    sq_spent: bool,
    rq_spent: bool,
}

#[derive(Debug, Clone, Default)]
struct CqInfo {
    kind: Option<CqKind>,
    /// Ring reservations on this CQ (held until the ring's QP is destroyed).
    reservations: u32,
    /// A direct poller was made on it: it is the direct path's for good.
    direct: bool,
    /// A poll failed (the provider's error, or a CQE the direct poller does not parse, which
    /// it leaves in place): its completions may never come.
    jammed: bool,
    /// Rings of the verbs path (send, WR and receive rings) reserved on the CQ.
    verbs_rings: u32,
    /// A direct poller was made while verbs-path rings were reserved on the CQ: their
    /// completions still queued were lost (softnic's mlx5 personality; see the README's
    /// findings), so they may never come. Only with [`DIRECT_OVER_VERBS_LOSES`].
    lossy: bool,
}

/// Finding (README, "Findings"): `Cq::direct_poller` on a CQ where verbs-path rings complete
/// is accepted, and on softnic's mlx5 personality the completions already queued in the CQ
/// are never seen again (the simulated CQ buffer starts empty; `Cq::poll` and the verbs
/// pollers are refused from then on): those rings wait for ever, and nothing says why.
/// `true` tolerates it (such rings are reset at the end), so the target keeps looking for
/// other bugs; `false` makes it a crash.
const DIRECT_OVER_VERBS_LOSES: bool = false;

#[derive(Debug)]
struct Sent {
    /// `None`: a WR whose post failed without naming it (rxe before RTS): it may run after
    /// a reconnect to another peer.
    dest_qpn: Option<u32>,
    len: usize,
    received: bool,
}

struct Model {
    mlx5: bool,
    qps: Vec<QpInfo>,
    cqs: Vec<CqInfo>,
    msgs: HashMap<u64, Sent>,
    next_msg: u64,
    target: RemoteBuf,
    opts: ConnectOptions,
    port: PortInfo,
}

struct World<'a> {
    /// The QPs, made in pairs when an operation first needs one of them.
    qps: &'a [OnceCell<Qp>],
    specs: [QpSpec; MAX_QPS],
    cqs: &'a [Cq],
    pd: &'a Pd,
    /// Each QP's receive region, allocated when its ring is made (a `&mut` for the ring's
    /// life: one per QP).
    regions: Vec<Option<&'a mut Option<Mr<'static>>>>,
    sends: Vec<Option<SendEntry<'a>>>,
    recvs: Vec<Option<RecvEntry<'a>>>,
    pollers: Vec<Option<Poller<'a>>>,
    m: Model,
}

/// The `x % live`-th live slot.
fn live<T>(v: &[Option<T>], x: u8) -> Option<usize> {
    let n = v.iter().flatten().count();
    if n == 0 {
        return None;
    }
    let k = usize::from(x) % n;
    v.iter()
        .enumerate()
        .filter(|(_, e)| e.is_some())
        .nth(k)
        .map(|(i, _)| i)
}

/// A lazily formatted description (built only when an assertion fails).
struct Lazy<F: Fn(&mut std::fmt::Formatter<'_>) -> std::fmt::Result>(F);

impl<F: Fn(&mut std::fmt::Formatter<'_>) -> std::fmt::Result> std::fmt::Display for Lazy<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (self.0)(f)
    }
}

macro_rules! what {
    ($($t:tt)*) => {
        Lazy(move |f: &mut std::fmt::Formatter<'_>| write!(f, $($t)*))
    };
}

fn errno_in(e: &Error, ok: &[i32], what: &dyn std::fmt::Display) {
    assert!(
        ok.contains(&e.errno()),
        "{what}: unexpected errno {} ({e}); expected one of {ok:?}",
        e.errno()
    );
    let text = e.to_string();
    assert!(!text.is_empty(), "{what}: an error that does not format");
}

/// A WcError the devices produce: never `Unknown`.
fn known_wc(e: WcError, what: &dyn std::fmt::Display) {
    assert!(
        !matches!(e, WcError::Unknown(_)),
        "{what}: unknown completion status {e:?}"
    );
    let _ = e.to_string();
}

fn payload(id: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|i| (id as u8).wrapping_mul(31).wrapping_add(i as u8))
        .collect();
    if len >= 8 {
        v[..8].copy_from_slice(&id.to_le_bytes());
    }
    v
}

impl Model {
    fn new_msg(&mut self, len: usize) -> (u64, Vec<u8>) {
        let id = self.next_msg;
        self.next_msg += 1;
        (id, payload(id, len))
    }

    /// Records a message handed to a ring (a SEND reaches the sender's peer).
    fn record(&mut self, id: u64, dest_qpn: Option<u32>, op: MOp, len: usize) {
        if matches!(op, MOp::Send | MOp::SendImm) && len >= 8 {
            self.msgs.insert(
                id,
                Sent {
                    dest_qpn,
                    len,
                    received: false,
                },
            );
        }
    }

    /// A receive ring handed out `data` on QP `qpn`: one message sent there, once, intact.
    fn received(&mut self, qpn: u32, data: &[u8], byte_len: u32) {
        if data.len() < 8 {
            return;
        }
        assert_eq!(
            data.len(),
            byte_len as usize,
            "data() is the message's bytes"
        );
        let id = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
        let Some(s) = self.msgs.get_mut(&id) else {
            panic!(
                "QP {qpn:#x} received a message nobody sent (tag {id:#x}, {} bytes)",
                data.len()
            );
        };
        if let Some(d) = s.dest_qpn {
            assert_eq!(
                d, qpn,
                "message {id} was sent to QP {d:#x}, received at {qpn:#x}"
            );
        }
        assert!(!s.received, "message {id} received twice (a replayed WR?)");
        assert_eq!(s.len, data.len(), "message {id}: length");
        assert_eq!(data, &payload(id, s.len)[..], "message {id}: bytes");
        s.received = true;
    }
}

fn msg_of<'d>(spec: &MsgSpec, data: &'d [u8]) -> Msg<'d> {
    let local = if spec.len == 0xff {
        Local::Empty
    } else {
        Local::Inline(data)
    };
    let off = u64::from(spec.off) * 8;
    match spec.op {
        MOp::Send => Msg::send(local),
        MOp::SendImm => Msg::send_imm(local, u32::from(spec.off)),
        MOp::Write => Msg::write(local, off),
        MOp::WriteImm => Msg::write_imm(local, off, u32::from(spec.len)),
    }
}

fn msg_len(spec: &MsgSpec) -> usize {
    if spec.len == 0xff {
        0
    } else {
        usize::from(spec.len) % 81
    }
}

// ---------------------------------------------------------------------------------------
// Ledgers.

/// The ring agrees with its ledger: its end is the next sequence expected, its retired
/// count is what completions retired plus what resets dropped of the posted WRs.
fn check_send(r: &dyn AnySend, l: &SendLedger, what: &dyn std::fmt::Display) {
    assert_eq!(r.id(), l.ring_id, "{what}: ring id changed");
    assert_eq!(
        r.posted() + r.staged_n(),
        l.end,
        "{what}: ring's end vs ledger {l:?}"
    );
    assert_eq!(
        r.retired() + l.dropped_staged,
        l.retired + l.dropped,
        "{what}: retired count vs ledger {l:?}"
    );
    assert!(r.retired() <= r.posted(), "{what}: retired past posted");
    assert!(
        r.out() + r.staged_n() <= l.depth,
        "{what}: {} outstanding + {} staged > depth {}",
        r.out(),
        r.staged_n(),
        l.depth
    );
    assert_eq!(
        l.handed,
        l.end + l.refused + l.leaked + l.dropped_staged,
        "{what}: handed out vs end + refused + leaked + unstaged: {l:?}"
    );
}

/// Reconciles the ring's end after a call: WRs it handed out (`got` sequence numbers,
/// checked in order by the caller), WRs refused (`post`: the call's `SendError::Post`, or
/// a dropped batch's deferred refusal), WRs a forgotten batch leaked, and (drain) its own
/// signal WR.
fn reconcile(
    r: &dyn AnySend,
    l: &mut SendLedger,
    post: Option<&PostError>,
    shrink_ok: Shrink,
    hidden_ok: bool,
    what: &dyn std::fmt::Display,
) {
    let end = r.posted() + r.staged_n();
    if end > l.end {
        let extra = end - l.end;
        assert!(
            hidden_ok && extra == 1,
            "{what}: ring end {end} > expected {} ({l:?}, {post:?})",
            l.end
        );
        l.handed += extra;
        l.end = end;
    } else if end < l.end {
        let gone = l.end - end;
        let shrink_ok = if l.leak_pending {
            Shrink::Leaked
        } else {
            shrink_ok
        };
        match shrink_ok {
            Shrink::Refused => {
                if let Some(pe) = post {
                    if pe.first_rejected != PostError::UNKNOWN {
                        assert_eq!(
                            pe.first_rejected_seq & wr_id::SEQ_MASK,
                            end & wr_id::SEQ_MASK,
                            "{what}: the refusal names the first WR not posted ({pe:?})"
                        );
                    }
                }
                l.refused += gone;
            }
            Shrink::Leaked => {
                l.leaked += gone;
                l.leak_pending = false;
            }
            Shrink::No => panic!("{what}: {gone} WRs vanished without an error ({l:?})"),
        }
        l.end = end;
    }
    if let Some(pe) = post {
        if pe.first_rejected == PostError::UNKNOWN {
            l.unknown_post = true;
        }
        assert!(pe.errno != 0, "{what}: a post error without errno");
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Shrink {
    No,
    Refused,
    Leaked,
}

/// A sequence number handed out by a post.
fn took_seq(l: &mut SendLedger, seq: u64, what: &dyn std::fmt::Display) {
    if l.leak_pending && seq < l.end {
        // The ring dropped a forgotten batch's WRs first.
        l.leaked += l.end - seq;
        l.end = seq;
        l.leak_pending = false;
    }
    assert_eq!(
        seq, l.end,
        "{what}: sequence {seq}, expected {} ({l:?})",
        l.end
    );
    l.end += 1;
    l.handed += 1;
}

fn check_recv(e: &RecvEntry<'_>, what: &dyn std::fmt::Display) {
    let l = &e.led;
    assert_eq!(e.ring.ring_id(), l.ring_id, "{what}: ring id changed");
    assert_eq!(
        u64::from(e.ring.posted()),
        l.posted - l.accepted - l.failed - l.discarded,
        "{what}: receives on the device vs ledger {l:?}"
    );
    assert_eq!(e.ring.held() as usize, e.held.len(), "{what}: held slots");
    assert!(
        e.ring.posted() + e.ring.held() + e.ring.pending() <= l.count,
        "{what}: more slots in use than the ring has"
    );
}

fn send_err_name(e: &SendError) -> &'static str {
    match e {
        SendError::WouldBlock => "send err WouldBlock",
        SendError::QpError(_) => "send err QpError",
        SendError::InlineTooLong { .. } => "send err InlineTooLong",
        SendError::RemoteOutOfRange { .. } => "send err RemoteOutOfRange",
        SendError::NoRemote => "send err NoRemote",
        SendError::Post(_) => "send err Post",
        SendError::OpNotEnabled(_) => "send err OpNotEnabled",
        _ => "send err other",
    }
}

/// Takes a send-side error of a post call: named, and its refusal accounted.
fn send_err(e: &SendError, what: &dyn std::fmt::Display) {
    match e {
        SendError::QpError(w) => known_wc(*w, what),
        SendError::Post(pe) => assert!(pe.errno != 0, "{what}: {pe:?}"),
        SendError::WouldBlock
        | SendError::InlineTooLong { .. }
        | SendError::RemoteOutOfRange { .. }
        | SendError::NoRemote
        | SendError::OpNotEnabled(_) => {}
        other => panic!("{what}: unexpected send error {other:?}"),
    }
    let _ = e.to_string();
}

// ---------------------------------------------------------------------------------------
// Handing out completions.

/// Gives `c` to a send ring. `own`: it is this ring's (its QP, ring id, a send).
fn to_send(
    r: &mut dyn AnySend,
    l: &mut SendLedger,
    c: &Completion,
    own: bool,
    what: &dyn std::fmt::Display,
) {
    let before = (r.posted(), r.retired(), r.staged_n(), r.err());
    let res = r.complete(c);
    let spent = c.wr_id() == u64::MAX && c.qp_num() == 0;
    if !own {
        match res {
            Ok(0) if spent => {}
            Err(WcError::Misrouted(m)) if !spent => {
                assert_eq!(m.ring(), c.ring(), "{what}: Misrouted names the completion's ring");
                assert_eq!(m.given_to(), l.ring_id, "{what}: Misrouted names the ring given to");
            }
            other => panic!(
                "{what}: ring {} (QP {:#x}) took a completion that is not its own ({c:?}, QP {:#x}): {other:?}",
                l.ring_id,
                l.qpn,
                c.qp_num()
            ),
        }
        assert_eq!(
            before,
            (r.posted(), r.retired(), r.staged_n(), r.err()),
            "{what}: a refused completion changed the ring"
        );
        return;
    }
    let n = match res {
        Ok(n) => {
            assert_eq!(
                r.retired(),
                before.1 + n,
                "{what}: Ok({n}) but retired moved otherwise"
            );
            n
        }
        Err(WcError::Misrouted(m)) => panic!("{what}: its own ring refused it: {m:?} ({c:?})"),
        Err(e) => {
            known_wc(e, what);
            assert!(
                r.err().is_some(),
                "{what}: an error completion left no error state"
            );
            r.retired() - before.1
        }
    };
    if n > 0 {
        assert_eq!(
            (r.retired() - 1) & wr_id::SEQ_MASK,
            c.seq(),
            "{what}: a completion retires exactly up to its own WR"
        );
    }
    l.retired += n;
    check_send(r, l, what);
}

/// Gives `c` to a receive ring; the harness takes what it hands out. `own`: the ring is
/// the completion's and this is its first delivery. `again`: the ring is the completion's
/// and has seen it once already, so whatever the first delivery did (took it, or refused a
/// completion of an earlier generation as stale) the answer is `Stale` now, never
/// `Misrouted`.
fn to_recv(
    m: &mut Model,
    e: &mut RecvEntry<'_>,
    c: &mut Completion,
    own: bool,
    again: bool,
    what: &dyn std::fmt::Display,
) {
    let before = (e.ring.posted(), e.ring.held(), e.ring.pending());
    let spent = c.wr_id() == u64::MAX && c.qp_num() == 0;
    let wid = c.wr_id();
    let res = e.ring.on_completion(c);
    if !own || spent {
        match res {
            Err(RecvError::Misrouted(mr)) if !spent && !again => {
                assert_eq!(
                    mr.ring(),
                    c.ring(),
                    "{what}: Misrouted names the completion's ring"
                );
            }
            Err(RecvError::Stale { .. }) if spent || again => {}
            other => panic!(
                "{what}: receive ring {} took a completion not its own: {other:?}",
                e.led.ring_id
            ),
        }
        assert_eq!(
            before,
            (e.ring.posted(), e.ring.held(), e.ring.pending()),
            "{what}: refused, yet changed"
        );
        return;
    }
    match res {
        Ok(got) => {
            assert_eq!(
                u64::from(got.slot()),
                wid & 0xffff_ffff,
                "{what}: the slot of the completion"
            );
            assert!(
                !e.held.iter().any(|h| h.slot() == got.slot()),
                "{what}: slot {} handed out while held",
                got.slot()
            );
            e.led.accepted += 1;
            stat(if got.byte_len() >= 8 {
                "received tagged message"
            } else {
                "received short/imm"
            });
            let data = e.ring.data(&got).expect("data of a Received of this ring");
            m.received(e.led.qpn, data, got.byte_len());
            e.held.push(got);
        }
        Err(RecvError::Completion { error, .. }) => {
            known_wc(error, what);
            e.led.failed += 1;
        }
        Err(RecvError::Stale { .. }) => {
            assert_eq!(
                before,
                (e.ring.posted(), e.ring.held(), e.ring.pending()),
                "{what}: stale, yet changed"
            );
        }
        Err(other) => panic!("{what}: its own receive ring refused it: {other:?}"),
    }
    check_recv(e, what);
}

/// Which ring `c` belongs to: (send slot, recv slot).
fn owner_of(
    sends: &[Option<SendEntry<'_>>],
    recvs: &[Option<RecvEntry<'_>>],
    c: &Completion,
) -> (Option<usize>, Option<usize>) {
    let recv = wr_id::is_recv(c.wr_id());
    let (q, id) = (c.qp_num(), c.ring());
    if recv {
        let i = recvs.iter().position(|e| {
            e.as_ref()
                .is_some_and(|e| e.led.qpn == q && e.led.ring_id == id)
        });
        (None, i)
    } else {
        let i = sends.iter().position(|e| {
            e.as_ref()
                .is_some_and(|e| e.led.qpn == q && e.led.ring_id == id)
        });
        (i, None)
    }
}

/// A ring that is out of its slot (in `drain`): it gets its own completions.
struct Held<'r> {
    ring: &'r mut dyn AnySend,
    led: &'r mut SendLedger,
}

/// Hands one polled completion out: maybe to a wrong ring first, then to its own (if it
/// still exists), maybe again.
#[allow(clippy::too_many_arguments)]
fn route(
    m: &mut Model,
    sends: &mut [Option<SendEntry<'_>>],
    recvs: &mut [Option<RecvEntry<'_>>],
    mut held: Option<&mut Held<'_>>,
    cq: usize,
    c: &mut Completion,
    r: &Route,
    k: usize,
) {
    let (wid, qpn, st) = (c.wr_id(), c.qp_num(), c.as_raw().status);
    let what = what!("completion wr_id {wid:#x} status {st} (QP {qpn:#x}) from CQ {cq}");
    let what = &what;
    let (mut s_own, r_own) = owner_of(sends, recvs, c);
    let held_own = held.as_ref().is_some_and(|h| {
        !wr_id::is_recv(c.wr_id()) && h.led.qpn == c.qp_num() && h.led.ring_id == c.ring()
    });
    if held_own {
        s_own = None;
    }
    if let Some(i) = s_own {
        let l = &sends[i].as_ref().expect("found").led;
        assert_eq!(
            l.cq, cq,
            "{what}: a send completion on another CQ than its ring's"
        );
    }
    if let Some(i) = r_own {
        let l = &recvs[i].as_ref().expect("found").led;
        assert_eq!(
            l.cq, cq,
            "{what}: a receive completion on another CQ than its ring's"
        );
    }
    stat(if held_own || s_own.is_some() {
        "completion to send ring"
    } else if r_own.is_some() {
        "completion to recv ring"
    } else {
        "completion orphan"
    });
    if let Err(e) = c.status() {
        stat(e.name());
    }
    if r.wrong & (1 << (k % 8)) != 0 {
        // A wrong ring: any live ring but the owner.
        let mut cands: Vec<(bool, usize)> = Vec::new();
        for (i, e) in sends.iter().enumerate() {
            if e.is_some() && Some(i) != s_own {
                cands.push((true, i));
            }
        }
        for (i, e) in recvs.iter().enumerate() {
            if e.is_some() && Some(i) != r_own {
                cands.push((false, i));
            }
        }
        if !cands.is_empty() {
            let (send, i) = cands[usize::from(r.pick) % cands.len()];
            stat("completion to a wrong ring");
            if send {
                let e = sends[i].as_mut().expect("live");
                to_send(
                    e.ring.any(),
                    &mut e.led,
                    c,
                    false,
                    &what!("{what} to the wrong send ring {i}"),
                );
            } else {
                let e = recvs[i].as_mut().expect("live");
                to_recv(
                    m,
                    e,
                    c,
                    false,
                    false,
                    &what!("{what} to the wrong receive ring {i}"),
                );
            }
        }
    }
    let times = if r.again { 2 } else { 1 };
    for t in 0..times {
        let what = what!("{what}, delivery {t}");
        if held_own {
            let h = held.as_deref_mut().expect("held");
            if t == 0 {
                to_send(h.ring, h.led, c, true, &what);
            } else {
                again_send(h.ring, h.led, c, &what);
            }
        } else if let Some(i) = s_own {
            let e = sends[i].as_mut().expect("live");
            if t == 0 {
                to_send(e.ring.any(), &mut e.led, c, true, &what);
            } else {
                again_send(e.ring.any(), &mut e.led, c, &what);
            }
        } else if let Some(i) = r_own {
            let e = recvs[i].as_mut().expect("live");
            // The second time, an accepted completion is spent: Stale.
            let own = t == 0;
            to_recv(m, e, c, own, !own, &what);
        }
    }
}

/// A send completion given to its ring a second time: stale now, nothing retired.
fn again_send(
    r: &mut dyn AnySend,
    l: &mut SendLedger,
    c: &Completion,
    what: &dyn std::fmt::Display,
) {
    let before = r.retired();
    match r.complete(c) {
        Ok(0) => {}
        // An error completion given again: the ring is in error already; still nothing
        // retired.
        Err(e) if !matches!(e, WcError::Misrouted(_)) => {}
        other => panic!("{what}: given again: {other:?}"),
    }
    assert_eq!(
        r.retired(),
        before,
        "{what}: a completion given twice retired again"
    );
    check_send(r, l, what);
}

// ---------------------------------------------------------------------------------------
// Polling.

/// One poll of CQ `cq` (if it has a poller), handing everything out. Returns how many
/// completions came.
#[allow(clippy::too_many_arguments)]
fn poll_cq<'a>(
    m: &mut Model,
    pollers: &mut [Option<Poller<'a>>],
    sends: &mut [Option<SendEntry<'a>>],
    recvs: &mut [Option<RecvEntry<'a>>],
    mut held: Option<&mut Held<'_>>,
    cq: usize,
    how: PollHow,
    r: &Route,
) -> usize {
    let Some(p) = pollers[cq].as_mut() else {
        return 0;
    };
    match p {
        Poller::V(p) => match how {
            PollHow::Drain(at) => {
                let mut k = 0usize;
                let res = catching(|| {
                    p.drain(|c| {
                        route(m, sends, recvs, held.as_deref_mut(), cq, c, r, k);
                        k += 1;
                        if k == usize::from(at) + 1 {
                            planned_panic();
                        }
                    })
                });
                match res {
                    Some(Ok(n)) => n,
                    Some(Err(e)) => {
                        let _ = e.to_string();
                        m.cqs[cq].jammed = true;
                        stat("cq jammed");
                        0
                    }
                    None => {
                        stat("poller drain panicked");
                        k
                    }
                }
            }
            PollHow::Into => {
                let mut out = [
                    Completion::PLACEHOLDER,
                    Completion::PLACEHOLDER,
                    Completion::PLACEHOLDER,
                ];
                match p.poll_into(&mut out) {
                    Ok(n) => {
                        for (k, c) in out[..n].iter_mut().enumerate() {
                            route(m, sends, recvs, held.as_deref_mut(), cq, c, r, k);
                        }
                        n
                    }
                    Err(e) => {
                        let _ = e.to_string();
                        m.cqs[cq].jammed = true;
                        stat("cq jammed");
                        0
                    }
                }
            }
            PollHow::Poll | PollHow::Spin => {
                let res = if how == PollHow::Spin {
                    p.poll_spin(2)
                } else {
                    p.poll()
                };
                match res {
                    Ok(cs) => {
                        let n = cs.len();
                        for (k, c) in cs.iter_mut().enumerate() {
                            route(m, sends, recvs, held.as_deref_mut(), cq, c, r, k);
                        }
                        n
                    }
                    Err(e) => {
                        let _ = e.to_string();
                        m.cqs[cq].jammed = true;
                        stat("cq jammed");
                        0
                    }
                }
            }
        },
        Poller::X(p) => match p.poll() {
            Ok(cs) => {
                let n = cs.len();
                for (k, c) in cs.iter_mut().enumerate() {
                    route(m, sends, recvs, held.as_deref_mut(), cq, c, r, k);
                }
                n
            }
            Err(e) => {
                let _ = e.to_string();
                m.cqs[cq].jammed = true;
                0
            }
        },
        Poller::D(p) => {
            let res = if matches!(how, PollHow::Into) {
                let mut out = [
                    Completion::PLACEHOLDER,
                    Completion::PLACEHOLDER,
                    Completion::PLACEHOLDER,
                ];
                p.poll_into(&mut out).inspect(|&n| {
                    for (k, c) in out[..n].iter_mut().enumerate() {
                        route(m, sends, recvs, held.as_deref_mut(), cq, c, r, k);
                    }
                })
            } else {
                p.poll().map(|cs| {
                    let n = cs.len();
                    for (k, c) in cs.iter_mut().enumerate() {
                        route(m, sends, recvs, held.as_deref_mut(), cq, c, r, k);
                    }
                    n
                })
            };
            match res {
                Ok(n) => n,
                Err(e) => {
                    // A CQE this poller does not parse (a receive's, or of a QP no direct
                    // ring registered): left in place, so the CQ is stuck at it.
                    assert!(
                        matches!(e, DirectError::UnknownQp(_) | DirectError::CqeOpcode { .. }),
                        "direct poll of CQ {cq}: {e:?}"
                    );
                    let _ = e.to_string();
                    m.cqs[cq].jammed = true;
                    stat("cq jammed direct");
                    0
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Operations.

impl<'a> World<'a> {
    fn qp_idx(&self, x: u8) -> usize {
        usize::from(x) % self.qps.len()
    }

    /// QP `k`, made (with its pair's other QP, and connected to it) if it was not yet.
    fn qp(&mut self, k: usize) -> &'a Qp {
        let cells: &'a [OnceCell<Qp>] = self.qps;
        if cells[k].get().is_none() {
            stat("qp pair made");
            let pair = [k & !1, k | 1];
            for j in pair {
                let (sc, rc) = (self.m.qps[j].send_cq, self.m.qps[j].recv_cq);
                let q = &self.specs[j];
                let b = QpBuilder::new(self.pd, &self.cqs[sc], &self.cqs[rc], QpType::Rc)
                    .max_send_wr(if q.sq == 255 { 16 } else { 2 + u32::from(q.sq) })
                    .max_send_sge(3)
                    .max_recv_wr(16)
                    .max_inline_data(QP_INLINE);
                let qp = match q.ext {
                    Ext::No => b.build(),
                    Ext::All => b
                        .send_ops(
                            SendOps::SEND
                                | SendOps::SEND_WITH_IMM
                                | SendOps::RDMA_WRITE
                                | SendOps::RDMA_WRITE_WITH_IMM,
                        )
                        .build(),
                    Ext::SendOnly => b.send_ops(SendOps::SEND | SendOps::SEND_WITH_IMM).build(),
                }
                .expect("qp");
                self.m.qps[j].qpn = qp.qp_num();
                self.m.qps[j].max_send_wr = qp.cap().max_send_wr;
                self.m.qps[j].max_sge = qp.cap().max_send_sge;
                assert!(cells[j].set(qp).is_ok(), "made once");
            }
            let (a, b) = (
                cells[pair[0]].get().expect("made"),
                cells[pair[1]].get().expect("made"),
            );
            Qp::connect_pair(a, b, &self.m.port, &self.m.opts).expect("connect");
            self.m.qps[pair[0]].peer_qpn = b.qp_num();
            self.m.qps[pair[1]].peer_qpn = a.qp_num();
        }
        cells[k].get().expect("made")
    }

    /// The QPs made so far.
    fn made(&self) -> Vec<usize> {
        (0..self.qps.len())
            .filter(|&k| self.qps[k].get().is_some())
            .collect()
    }

    fn send_owner(&self, qp: usize) -> bool {
        self.sends.iter().flatten().any(|e| e.led.qp == qp)
    }

    fn recv_owner(&self, qp: usize) -> bool {
        self.recvs.iter().flatten().any(|e| e.led.qp == qp)
    }

    fn send_cfg(&self, qp: usize, c: &RingCfg, max_send_wr: u32) -> (SendConfig, u32, bool) {
        let wild = c.wild < 24;
        let mut depth = 2 + u32::from(c.depth) % 15;
        if !wild {
            depth = depth.min(max_send_wr).max(2);
        }
        let (signal, batch) = if wild {
            (
                1 + u32::from(c.signal) % (depth / 2 + 1),
                1 + u32::from(c.batch) % (depth + 1),
            )
        } else {
            (
                1 + u32::from(c.signal) % (depth / 2),
                1 + u32::from(c.batch) % depth,
            )
        };
        let max_inline = if wild {
            [QP_INLINE, 32, QP_INLINE + 1, 0][usize::from(c.inline) % 4]
        } else {
            [QP_INLINE, QP_INLINE, QP_INLINE, 32][usize::from(c.inline) % 4]
        };
        let mut cfg = SendConfig::new(0, depth, max_inline)
            .signal_every(signal)
            .batch(batch);
        if c.remote {
            let peer = self.m.qps[qp].peer_qpn;
            let off =
                self.m.qps.iter().position(|q| q.qpn == peer).unwrap_or(0) as u64 * TARGET_STRIDE;
            cfg = cfg.remote(RemoteBuf::new(
                self.m.target.addr + off,
                TARGET_STRIDE,
                self.m.target.rkey,
            ));
        }
        (cfg, max_inline, c.remote)
    }

    fn new_send_ring(&mut self, qp_x: u8, kind: SKind, c: &RingCfg) {
        let Some(slot) = self.sends.iter().position(Option::is_none) else {
            return;
        };
        let qp = self.qp_idx(qp_x);
        let q: &'a Qp = self.qp(qp);
        let info = self.m.qps[qp].clone();
        let (cfg, max_inline, remote) = self.send_cfg(qp, c, info.max_send_wr);
        if kind == SKind::Direct && self.m.mlx5 && self.pollers[info.send_cq].is_none() {
            // The ring is built with its send CQ's direct poller: make it first.
            self.new_poller(info.send_cq as u8, PKind::Direct, 0);
        }
        let what = what!("{kind:?} ring on QP {qp}");
        let res: std::result::Result<SendSlot<'a>, Error> = match kind {
            SKind::Verbs => q.send_ring::<N>(cfg).map(SendSlot::V),
            SKind::Wr => q.wr_ring(cfg).map(SendSlot::W),
            SKind::Direct => match self.pollers[info.send_cq].as_mut() {
                Some(Poller::D(p)) => q.direct_ring(p, cfg).map(SendSlot::D),
                _ => return,
            },
        };
        match res {
            Ok(ring) => {
                assert!(!info.sq_spent, "{what}: a second ring on one send queue");
                assert!(
                    kind == SKind::Direct || !self.m.cqs[info.send_cq].direct,
                    "{what}: a verbs-path ring accepted on a CQ of the direct path"
                );
                self.m.qps[qp].sq_spent = true;
                self.m.cqs[info.send_cq].reservations += 1;
                if kind != SKind::Direct {
                    self.m.cqs[info.send_cq].verbs_rings += 1;
                }
                let r = ring.any_ref();
                assert_eq!(r.out() + r.staged_n(), 0, "{what}: a new ring with WRs");
                let led = SendLedger {
                    qp,
                    qpn: info.qpn,
                    cq: info.send_cq,
                    kind,
                    ring_id: r.id(),
                    depth: u64::from(cfg.depth_of()),
                    max_inline,
                    remote,
                    end: r.posted() + r.staged_n(),
                    handed: r.posted(),
                    retired: r.retired(),
                    dropped: 0,
                    dropped_staged: 0,
                    refused: 0,
                    leaked: 0,
                    unknown_post: false,
                    leak_pending: false,
                };
                // Ring ids are per CQ: no live ring on this CQ has the same one.
                for e in self.sends.iter().flatten() {
                    assert!(
                        !(e.led.cq == led.cq && e.led.ring_id == led.ring_id),
                        "{what}: ring id {} given twice on CQ {}",
                        led.ring_id,
                        led.cq
                    );
                }
                for e in self.recvs.iter().flatten() {
                    assert!(
                        !(e.led.cq == led.cq && e.led.ring_id == led.ring_id),
                        "{what}: ring id {} given twice on CQ {}",
                        led.ring_id,
                        led.cq
                    );
                }
                stat(match kind {
                    SKind::Verbs => "ring made Verbs",
                    SKind::Wr => "ring made Wr",
                    SKind::Direct => "ring made Direct",
                });
                self.sends[slot] = Some(SendEntry { ring, led });
            }
            Err(e) => {
                errno_in(
                    &e,
                    &[libc::EBUSY, libc::EINVAL, libc::ENOSPC, libc::EOPNOTSUPP],
                    &what,
                );
                stat(errno_stat("ring refused", e.errno()));
                let direct_cq = self.m.cqs[info.send_cq].direct;
                if info.sq_spent {
                    // Refused; which check comes first is the ring's business.
                } else if direct_cq && kind != SKind::Direct {
                    // A verbs-path ring on a CQ of the direct path: refused (the direct
                    // poller would never hand it its completions).
                    // (EBUSY, or a configuration check that comes first.)
                } else if e.errno() == libc::EBUSY {
                    panic!("{what}: EBUSY on a send queue no ring ever had: {e}");
                }
                if kind == SKind::Wr && info.ext == Ext::No {
                    assert_eq!(e.errno(), libc::EINVAL, "{what}: WrRing on a plain QP");
                }
            }
        }
    }

    fn new_recv_ring(&mut self, qp_x: u8, count: u8, slot_len: u8, repost: u8, offset: u8) {
        let Some(slot) = self.recvs.iter().position(Option::is_none) else {
            return;
        };
        let qp = self.qp_idx(qp_x);
        let count = 1 + u32::from(count) % 16;
        // Mostly 64 bytes (every inline message fits); sometimes smaller (LOC_LEN errors).
        let slot_len = if slot_len < 200 {
            64 + u32::from(slot_len % 4) * 8
        } else {
            1 + u32::from(slot_len % 64)
        };
        let cfg = RecvConfig::new(0, slot_len, count).repost_batch(1 + u32::from(repost) % count);
        let offset = usize::from(offset) * 8;
        let q: &'a Qp = self.qp(qp);
        let info = self.m.qps[qp].clone();
        let what = what!("receive ring on QP {qp}");
        let Some(cell) = self.regions[qp].take() else {
            // The region went to an earlier ring (for its life: one ring per receive queue).
            return;
        };
        *cell = Some(
            self.pd
                .alloc_mr(REGION, AccessFlags::LOCAL_WRITE)
                .expect("region"),
        );
        let region = cell.as_mut().expect("just made");
        match q.recv_ring::<RN>(region, offset, cfg) {
            Ok(ring) => {
                assert!(!info.rq_spent, "{what}: a second ring on one receive queue");
                self.m.qps[qp].rq_spent = true;
                self.m.cqs[info.recv_cq].reservations += 1;
                self.m.cqs[info.recv_cq].verbs_rings += 1;
                let led = RecvLedger {
                    qp,
                    qpn: info.qpn,
                    cq: info.recv_cq,
                    ring_id: ring.ring_id(),
                    count,
                    posted: 0,
                    accepted: 0,
                    failed: 0,
                    discarded: 0,
                    unknown_post: false,
                };
                let e = RecvEntry {
                    ring,
                    led,
                    held: Vec::new(),
                };
                check_recv(&e, &what);
                stat("ring made Recv");
                self.recvs[slot] = Some(e);
            }
            Err(e) => {
                errno_in(&e, &[libc::EBUSY, libc::EINVAL, libc::ENOSPC], &what);
                stat(errno_stat("ring refused", e.errno()));
                if e.errno() == libc::EBUSY {
                    assert!(
                        info.rq_spent || self.m.cqs[info.recv_cq].direct,
                        "{what}: EBUSY on a receive queue no ring ever had: {e}"
                    );
                }
                // The borrow of the region ended with the refused call: nothing to give back
                // (the `&mut` was moved in), so this QP's region is spent too.
            }
        }
    }

    fn new_poller(&mut self, cq_x: u8, kind: PKind, fields: u8) {
        let cq = usize::from(cq_x) % self.cqs.len();
        let c: &'a Cq = &self.cqs[cq];
        let info = self.m.cqs[cq].clone();
        let occupied = self.pollers[cq].is_some();
        let ik = info.kind;
        let what = what!("{kind:?} poller on CQ {cq} ({ik:?})");
        match kind {
            PKind::Verbs => match c.poller::<PB>() {
                Ok(p) => {
                    assert!(!occupied && !info.direct, "{what}: made while busy");
                    stat("poller made Verbs");
                    self.pollers[cq] = Some(Poller::V(p));
                }
                Err(e) => {
                    errno_in(&e, &[libc::EBUSY], &what);
                    assert!(
                        occupied || info.direct,
                        "{what}: EBUSY without a poller: {e}"
                    );
                }
            },
            PKind::Ex => {
                let mut f = ExFields::NONE;
                if fields & 1 != 0 {
                    f = f.with(ExFields::BYTE_LEN);
                }
                if fields & 2 != 0 {
                    f = f.with(ExFields::QP_NUM);
                }
                if fields & 4 != 0 {
                    f = f.with(ExFields::IMM);
                }
                let ext = matches!(info.kind, Some(CqKind::Ex | CqKind::ExNoQpn));
                let has_qpn = info.kind == Some(CqKind::Ex);
                // The extended CQs are built with BYTE_LEN | QP_NUM (or BYTE_LEN only).
                let missing = fields & 4 != 0;
                match c.ex_poller::<PB>(f) {
                    Ok(p) => {
                        assert!(ext && has_qpn && !missing, "{what}: accepted fields {f:?}");
                        assert!(!occupied && !info.direct, "{what}: made while busy");
                        stat("poller made Ex");
                        self.pollers[cq] = Some(Poller::X(p));
                    }
                    Err(e) => {
                        errno_in(&e, &[libc::EBUSY, libc::EINVAL], &what);
                        if !ext || !has_qpn || missing {
                            assert_eq!(e.errno(), libc::EINVAL, "{what}: {e}");
                        } else {
                            assert_eq!(e.errno(), libc::EBUSY, "{what}: {e}");
                            assert!(occupied || info.direct, "{what}: EBUSY without a poller");
                        }
                    }
                }
            }
            PKind::Direct => match c.direct_poller::<PB>() {
                Ok(p) => {
                    assert!(self.m.mlx5, "{what}: a direct poller off mlx5");
                    assert!(!occupied, "{what}: made while busy");
                    assert!(
                        self.m.cqs[cq].direct || self.m.cqs[cq].verbs_rings == 0,
                        "{what}: a direct poller accepted over verbs-path rings"
                    );
                    self.m.cqs[cq].direct = true;
                    stat("poller made Direct");
                    if self.m.cqs[cq].verbs_rings > 0 && DIRECT_OVER_VERBS_LOSES {
                        self.m.cqs[cq].lossy = true;
                    }
                    self.pollers[cq] = Some(Poller::D(p));
                }
                Err(e) => {
                    errno_in(&e, &[libc::EBUSY, libc::EOPNOTSUPP, libc::EINVAL], &what);
                    if !self.m.mlx5 {
                        assert_eq!(e.errno(), libc::EOPNOTSUPP, "{what}: {e}");
                    } else if occupied {
                        assert_eq!(e.errno(), libc::EBUSY, "{what}: {e}");
                    }
                }
            },
        }
    }

    fn send_now(&mut self, i: usize, spec: &MsgSpec, signal: bool) {
        let Some(e) = self.sends[i].as_mut() else {
            return;
        };
        let len = msg_len(spec);
        let (id, data) = self.m.new_msg(len);
        let msg = msg_of(spec, &data);
        let what = what!("send_now on send ring {i}");
        let res = on_ring!(&mut e.ring, r => {
            if signal {
                r.signal_next();
            }
            r.send_now(msg)
        });
        if std::env::var_os("HOTVERBS_FUZZ_TRACE").is_some() {
            eprintln!("{what}: {res:?}");
        }
        let post = match &res {
            Err(SendError::Post(pe)) => Some(*pe),
            _ => None,
        };
        match &res {
            Ok(seq) => {
                stat("send_now ok");
                took_seq(&mut e.led, *seq, &what);
                let dest = self.m.qps[e.led.qp].peer_qpn;
                self.m.record(id, Some(dest), spec.op, len);
            }
            Err(err) => {
                stat(send_err_name(err));
                send_err(err, &what)
            }
        }
        check_refusal(&e.ring, &e.led, &res, spec, &what);
        // A post the provider failed without naming a WR (rxe before RTS) may still run the
        // WR: the ring counts it as posted although send_now returned the error.
        let unknown = post.is_some_and(|p| p.first_rejected == PostError::UNKNOWN);
        if unknown {
            self.m.record(id, None, spec.op, len);
        }
        reconcile(
            e.ring.any_ref(),
            &mut e.led,
            post.as_ref(),
            Shrink::Refused,
            unknown,
            &what,
        );
        check_send(e.ring.any_ref(), &e.led, &what);
    }

    fn batch(&mut self, i: usize, specs: &[MsgSpec], end: BatchEnd) {
        let Some(e) = self.sends[i].as_mut() else {
            return;
        };
        let what = what!("batch on send ring {i} ({end:?})");
        let datas: Vec<(u64, Vec<u8>)> = specs.iter().map(|s| self.m.new_msg(msg_len(s))).collect();
        let mut got: Vec<std::result::Result<u64, SendError>> = Vec::new();
        let mut fin: Option<std::result::Result<(), SendError>> = None;
        on_ring!(&mut e.ring, r => {
            let mut b = r.batch();
            for (s, (_, d)) in specs.iter().zip(&datas) {
                got.push(b.push(msg_of(s, d)));
            }
            match end {
                BatchEnd::Finish => fin = Some(b.finish()),
                BatchEnd::Drop => drop(b),
                BatchEnd::Forget => std::mem::forget(b),
            }
        });
        let mut post: Option<PostError> = None;
        for (k, res) in got.iter().enumerate() {
            match res {
                Ok(seq) => {
                    // A push that auto-flushed and had its chain refused rewinds the ring:
                    // sequence numbers are then given again.
                    if *seq < e.led.end && !e.led.leak_pending {
                        let gone = e.led.end - seq;
                        assert!(
                            post.is_some(),
                            "{what}: push {k} went back to {seq} without a refusal"
                        );
                        e.led.refused += gone;
                        e.led.end = *seq;
                    }
                    took_seq(&mut e.led, *seq, &what);
                    let dest = self.m.qps[e.led.qp].peer_qpn;
                    self.m
                        .record(datas[k].0, Some(dest), specs[k].op, msg_len(&specs[k]));
                }
                Err(err) => {
                    send_err(err, &what);
                    if let SendError::Post(pe) = err {
                        post = Some(*pe);
                        if pe.first_rejected == PostError::UNKNOWN {
                            // The ring counts this message as posted (it may run).
                            self.m
                                .record(datas[k].0, None, specs[k].op, msg_len(&specs[k]));
                        }
                    }
                }
            }
        }
        if let Some(Err(err)) = &fin {
            send_err(err, &what);
            if let SendError::Post(pe) = err {
                post = Some(*pe);
            }
        }
        let shrink = match end {
            BatchEnd::Forget => Shrink::Leaked,
            // A dropped batch's refusal is deferred to the next flush; a finished one's is
            // returned.
            _ => Shrink::Refused,
        };
        let post_named = if end == BatchEnd::Drop { None } else { post };
        let unknown = post.is_some_and(|p| p.first_rejected == PostError::UNKNOWN);
        reconcile(
            e.ring.any_ref(),
            &mut e.led,
            post_named.as_ref(),
            shrink,
            unknown,
            &what,
        );
        if end == BatchEnd::Forget && got.iter().any(Result::is_ok) {
            // What the batch staged after its last slow path is not in the ring's count
            // yet: the ring drops it at its next call.
            e.led.leak_pending = true;
        }
        if post.is_some_and(|p| p.first_rejected == PostError::UNKNOWN) {
            e.led.unknown_post = true;
        }
        check_send(e.ring.any_ref(), &e.led, &what);
    }

    fn gather(&mut self, i: usize, spec: &MsgSpec, cuts: [u8; 2]) {
        let Some(e) = self.sends[i].as_mut() else {
            return;
        };
        let SendSlot::D(r) = &mut e.ring else {
            return;
        };
        let what = what!("stage_inline_gather on send ring {i}");
        let len = msg_len(spec);
        let (id, data) = self.m.new_msg(len);
        let a = usize::from(cuts[0]) % (len + 1);
        let b = a + usize::from(cuts[1]) % (len - a + 1);
        let all = [&data[..a], &data[a..b], &data[b..]];
        // 1 to 5 pieces (the QPs are made with max_send_sge 3, which rxe raises to 4: more
        // is Config(Slots)).
        let n = 1 + usize::from(cuts[0] ^ cuts[1]) % 5;
        let parts: Vec<&[u8]> = if n <= 3 {
            let mut v = all[..n - 1].to_vec();
            v.push(&data[all[..n - 1].iter().map(|p| p.len()).sum::<usize>()..]);
            v
        } else {
            let mut v = all.to_vec();
            v.resize(n, &[]);
            v
        };
        let max_sge = self.m.qps[e.led.qp].max_sge as usize;
        // The message's own payload is empty: the gather list is the payload.
        let empty = MsgSpec { len: 0xff, ..*spec };
        let res = r.stage_inline_gather(msg_of(&empty, &[]), &parts);
        match &res {
            Ok(seq) => {
                assert!(
                    n <= max_sge,
                    "{what}: {n} pieces accepted, max_send_sge {max_sge}"
                );
                took_seq(&mut e.led, *seq, &what);
                let dest = self.m.qps[e.led.qp].peer_qpn;
                self.m.record(id, Some(dest), spec.op, len);
            }
            Err(SendError::Config(ConfigError::Slots)) => {
                assert!(
                    n > max_sge,
                    "{what}: {n} pieces refused, max_send_sge {max_sge}"
                )
            }
            Err(err) => send_err(err, &what),
        }
        let res = r.flush();
        let post = match &res {
            Err(SendError::Post(pe)) => Some(*pe),
            Err(err) => {
                send_err(err, &what);
                None
            }
            Ok(()) => None,
        };
        reconcile(
            e.ring.any_ref(),
            &mut e.led,
            post.as_ref(),
            Shrink::Refused,
            false,
            &what,
        );
        check_send(e.ring.any_ref(), &e.led, &what);
    }

    fn flush(&mut self, i: usize, signaled: bool) {
        let Some(e) = self.sends[i].as_mut() else {
            return;
        };
        let what = what!("flush on send ring {i}");
        let res = on_ring!(&mut e.ring, r => {
            if signaled {
                r.signal_next();
            }
            r.flush()
        });
        let post = match &res {
            Err(SendError::Post(pe)) => Some(*pe),
            Err(err) => {
                send_err(err, &what);
                None
            }
            Ok(()) => None,
        };
        reconcile(
            e.ring.any_ref(),
            &mut e.led,
            post.as_ref(),
            Shrink::Refused,
            false,
            &what,
        );
        // flush drops a forgotten batch first.
        e.led.leak_pending = false;
        check_send(e.ring.any_ref(), &e.led, &what);
    }

    fn set_remote(&mut self, i: usize, to: u8, bad_key: bool) {
        let to = self.qp_idx(to);
        let Some(e) = self.sends[i].as_mut() else {
            return;
        };
        let what = what!("set_remote on send ring {i} (to QP {to}'s region, bad key {bad_key})");
        let t = self.m.target;
        let rkey = if bad_key {
            t.rkey ^ 0x5a5a_0000
        } else {
            t.rkey
        };
        let remote = RemoteBuf::new(t.addr + to as u64 * TARGET_STRIDE, TARGET_STRIDE, rkey);
        let res = on_ring!(&mut e.ring, r => r.set_remote(remote));
        let post = match &res {
            Ok(()) => {
                e.led.remote = true;
                None
            }
            Err(SendError::Post(pe)) => Some(*pe),
            Err(err) => {
                send_err(err, &what);
                None
            }
        };
        reconcile(
            e.ring.any_ref(),
            &mut e.led,
            post.as_ref(),
            Shrink::Refused,
            false,
            &what,
        );
        check_send(e.ring.any_ref(), &e.led, &what);
    }

    fn recv_post(&mut self, i: usize, fill: bool) {
        let Some(e) = self.recvs[i].as_mut() else {
            return;
        };
        let what = what!(
            "{} on receive ring {i}",
            if fill { "fill" } else { "repost" }
        );
        let before = e.ring.posted();
        let res = if fill {
            e.ring.fill().map_err(PostError::from)
        } else {
            e.ring.repost()
        };
        let delta = u64::from(e.ring.posted()) - u64::from(before);
        match res {
            Ok(n) => assert_eq!(n as u64, delta, "{what}: returned {n}, posted {delta}"),
            Err(pe) => {
                assert!(pe.errno != 0, "{what}: {pe:?}");
                if pe.first_rejected == PostError::UNKNOWN {
                    e.led.unknown_post = true;
                }
                let _ = pe.to_string();
            }
        }
        e.led.posted += delta;
        check_recv(e, &what);
    }

    fn release(&mut self, i: usize, idx: u8, to: Option<u8>) {
        let target = to.and_then(|t| live(&self.recvs, t)).filter(|&t| t != i);
        let Some(e) = self.recvs[i].as_mut() else {
            return;
        };
        if e.held.is_empty() {
            return;
        }
        let got = e.held.swap_remove(usize::from(idx) % e.held.len());
        let what = what!("release on receive ring {i}");
        if let Some(t) = target {
            // Another ring's Received: Foreign, nothing changes there, and `try_release`
            // hands it back (`release` would drop it, its slot held in ring i for good).
            let slot = got.slot();
            let o = self.recvs[t].as_mut().expect("live");
            let before = (o.ring.posted(), o.ring.held(), o.ring.pending());
            let back = match o.ring.try_release(got) {
                Err(ReleaseError::Foreign(m)) => m,
                other => panic!("{what}: a Received given to receive ring {t}: {other:?}"),
            };
            assert_eq!(
                before,
                (o.ring.posted(), o.ring.held(), o.ring.pending()),
                "{what}: Foreign, yet changed"
            );
            assert_eq!(back.slot(), slot, "{what}: handed back another Received");
            self.recvs[i].as_mut().expect("live").held.push(back);
            return;
        }
        let before = e.ring.posted();
        let res = e.ring.release(got);
        let delta = u64::from(e.ring.posted()) - u64::from(before);
        match res {
            Ok(()) => {}
            Err(RecvError::Post(pe)) => {
                if pe.first_rejected == PostError::UNKNOWN {
                    e.led.unknown_post = true;
                }
            }
            Err(other) => panic!("{what}: {other:?}"),
        }
        e.led.posted += delta;
        check_recv(e, &what);
    }
}

/// A refused message got the ring's first refusal (a full or failed ring answers before
/// the message is looked at).
fn check_refusal(
    ring: &SendSlot<'_>,
    l: &SendLedger,
    res: &std::result::Result<u64, SendError>,
    spec: &MsgSpec,
    what: &dyn std::fmt::Display,
) {
    let Err(e) = res else { return };
    let r = ring.any_ref();
    match e {
        SendError::InlineTooLong { len, max } => {
            assert_eq!(*len, msg_len(spec), "{what}");
            assert_eq!(*max, l.max_inline, "{what}");
            assert!(*len > l.max_inline as usize, "{what}: {len} <= {max}");
        }
        SendError::NoRemote => {
            assert!(
                !l.remote && matches!(spec.op, MOp::Write | MOp::WriteImm),
                "{what}: NoRemote"
            );
        }
        SendError::RemoteOutOfRange { .. } => assert!(l.remote, "{what}"),
        SendError::QpError(_) => {
            assert!(r.err().is_some(), "{what}: QpError without an error state")
        }
        _ => {}
    }
}

impl<'a> World<'a> {
    fn cq_poll(&mut self, cq_x: u8) {
        let cq = usize::from(cq_x) % self.cqs.len();
        let info = &self.m.cqs[cq];
        let busy = info.reservations > 0 || self.pollers[cq].is_some() || info.direct;
        let has_poller = self.pollers[cq].is_some();
        let what = what!("Cq::poll of CQ {cq} ({info:?}, poller {has_poller})");
        let mut wcs = [Wc::default(); 4];
        match self.cqs[cq].poll(&mut wcs) {
            Ok(n) => {
                assert!(!busy, "{what}: polled while rings or a poller own the CQ");
                assert_eq!(n, 0, "{what}: completions of nobody's WRs");
            }
            Err(e) => {
                errno_in(&e, &[libc::EBUSY], &what);
                assert!(busy, "{what}: EBUSY with no ring or poller: {e}");
            }
        }
    }

    fn qp_to_error(&mut self, qp_x: u8) {
        let qp = self.qp_idx(qp_x);
        let what = what!("to_error of QP {qp}");
        match self.qp(qp).to_error() {
            Ok(()) => assert!(!self.m.qps[qp].in_reset, "{what}: RESET -> ERR accepted"),
            Err(e) => {
                errno_in(&e, &[libc::EINVAL], &what);
                assert!(
                    self.m.qps[qp].in_reset,
                    "{what}: refused outside RESET: {e}"
                );
            }
        }
    }

    fn qp_reset(&mut self, qp_x: u8) {
        let qp = self.qp_idx(qp_x);
        let owned = self.send_owner(qp) || self.recv_owner(qp);
        let what = what!("Qp::reset of QP {qp} (owned {owned})");
        match self.qp(qp).reset() {
            Ok(()) => {
                assert!(!owned, "{what}: a QP a ring owns went to RESET behind it");
                self.m.qps[qp].in_reset = true;
            }
            Err(e) => {
                errno_in(&e, &[libc::EBUSY], &what);
                assert!(owned, "{what}: EBUSY with no ring: {e}");
            }
        }
    }

    fn connect(&mut self, qp_x: u8, to_x: u8) {
        let qp = self.qp_idx(qp_x);
        let to = self.qp_idx(to_x);
        let owned = self.send_owner(qp) || self.recv_owner(qp);
        let in_reset = self.m.qps[qp].in_reset;
        let what = what!("connect of QP {qp} to QP {to} (owned {owned}, in RESET {in_reset})");
        let port = self.m.port;
        let ep = self.qp(to).endpoint(&port);
        match self.qp(qp).connect(&port, &ep, &self.m.opts) {
            Ok(()) => {
                assert!(in_reset || !owned, "{what}: a reconnect behind a ring");
                self.m.qps[qp].in_reset = false;
                self.m.qps[qp].peer_qpn = self.m.qps[to].qpn;
            }
            Err(e) => {
                errno_in(&e, &[libc::EBUSY], &what);
                assert!(owned && !in_reset, "{what}: refused: {e}");
            }
        }
    }

    fn ring_reset(&mut self, i: usize, with_recv: Option<usize>, wrong_poller: bool) {
        let Some(e) = self.sends[i].as_mut() else {
            return;
        };
        let qp = e.led.qp;
        let j = with_recv.filter(|&j| self.recvs[j].is_some());
        let recv_owned = self.recvs.iter().flatten().any(|r| r.led.qp == qp);
        let what = what!("reset_qp of send ring {i} (QP {qp}, with receive ring {j:?})");
        let (out, staged) = (e.ring.any_ref().out(), e.ring.any_ref().staged_n());
        let recv = j.map(|j| self.recvs[j].as_mut().expect("live"));
        let same_qp = recv.as_ref().is_some_and(|r| r.led.qp == qp);
        let recv_before = recv
            .as_ref()
            .map(|r| r.led.posted - r.led.accepted - r.led.failed - r.led.discarded);
        let res: std::result::Result<(u64, Option<usize>), Error> = match &mut e.ring {
            SendSlot::V(r) => match recv {
                Some(rx) => r.reset_qp_with(&mut rx.ring).map(|(a, b)| (a, Some(b))),
                None => r.reset_qp().map(|a| (a, None)),
            },
            SendSlot::W(r) => match recv {
                Some(rx) => r.reset_qp_with(&mut rx.ring).map(|(a, b)| (a, Some(b))),
                None => r.reset_qp().map(|a| (a, None)),
            },
            SendSlot::D(r) => {
                let cq = e.led.cq;
                let pi = if wrong_poller {
                    (0..self.pollers.len())
                        .find(|&c| c != cq && matches!(self.pollers[c], Some(Poller::D(_))))
                } else {
                    Some(cq)
                };
                let Some(pi) = pi else { return };
                let Some(Poller::D(p)) = self.pollers[pi].as_mut() else {
                    // No direct poller of the send CQ now (dropped): nothing to reset with.
                    return;
                };
                match recv {
                    Some(rx) => r.reset_qp_with(p, &mut rx.ring).map(|(a, b)| (a, Some(b))),
                    None => r.reset_qp(p).map(|a| (a, None)),
                }
            }
        };
        let wrong_p = wrong_poller && e.led.kind == SKind::Direct;
        match res {
            Ok((n, rq)) => {
                stat(if n > 0 {
                    "reset_qp dropped WRs"
                } else {
                    "reset_qp dropped none"
                });
                if rq.is_some() {
                    stat("reset_qp_with ok");
                }
                assert!(!wrong_p, "{what}: reset with another CQ's poller");
                assert_eq!(
                    n,
                    out + staged,
                    "{what}: dropped {n}, had {out} outstanding + {staged} staged"
                );
                if !PLANTED {
                    e.led.dropped += n;
                }
                e.led.dropped_staged += staged;
                e.led.end -= staged;
                let r_end = e.ring.any_ref().posted() + e.ring.any_ref().staged_n();
                if e.led.leak_pending && e.led.end > r_end {
                    // A forgotten batch's tail the ring never counted.
                    e.led.leaked += e.led.end - r_end;
                    e.led.end = r_end;
                }
                e.led.unknown_post = false;
                e.led.leak_pending = false;
                let r = e.ring.any_ref();
                assert!(r.err().is_none(), "{what}: still in error after reset");
                check_send(r, &e.led, &what);
                match (j, rq) {
                    (None, None) => assert!(!recv_owned, "{what}: reset behind a receive ring"),
                    (Some(j), Some(k)) => {
                        assert!(same_qp, "{what}: reset_qp_with another QP's receive ring");
                        let rx = self.recvs[j].as_mut().expect("live");
                        rx.led.discarded += recv_before.expect("recv");
                        rx.led.unknown_post = false;
                        let not_held = rx.led.count as usize - rx.held.len();
                        assert_eq!(k, not_held, "{what}: receive slots requeued");
                        check_recv(rx, &what);
                    }
                    _ => unreachable!(),
                }
                self.m.qps[qp].in_reset = true;
            }
            Err(err) => {
                stat("reset_qp refused");
                errno_in(&err, &[libc::EBUSY, libc::EINVAL], &what);
                if wrong_p {
                    assert_eq!(err.errno(), libc::EINVAL, "{what}: {err}");
                } else if j.is_some() {
                    assert!(!same_qp, "{what}: refused with its own receive ring: {err}");
                    assert_eq!(err.errno(), libc::EINVAL, "{what}: {err}");
                } else {
                    assert!(recv_owned, "{what}: refused: {err}");
                    assert_eq!(err.errno(), libc::EBUSY, "{what}: {err}");
                }
                check_send(e.ring.any_ref(), &e.led, &what);
            }
        }
    }

    fn recv_reset(&mut self, i: usize) {
        let Some(qp) = self.recvs[i].as_ref().map(|e| e.led.qp) else {
            return;
        };
        let send_owned = self.send_owner(qp);
        let e = self.recvs[i].as_mut().expect("live");
        let what = what!("RecvRing::reset_qp of receive ring {i} (QP {qp})");
        let before = e.led.posted - e.led.accepted - e.led.failed - e.led.discarded;
        match e.ring.reset_qp() {
            Ok(k) => {
                assert!(!send_owned, "{what}: reset behind a send ring");
                e.led.discarded += before;
                e.led.unknown_post = false;
                let not_held = e.led.count as usize - e.held.len();
                assert_eq!(k, not_held, "{what}: slots requeued");
                check_recv(e, &what);
                self.m.qps[qp].in_reset = true;
            }
            Err(err) => {
                errno_in(&err, &[libc::EBUSY], &what);
                assert!(send_owned, "{what}: refused: {err}");
            }
        }
    }

    /// `drain` with a zero timeout; what it said about the signal when it stalled.
    fn drain(&mut self, i: usize, panic_round: Option<u8>, route: &Route) -> Option<SignalAsked> {
        let mut e = self.sends[i].take()?;
        let what = what!("drain of send ring {i}");
        let mut stalled = None;
        let World {
            m,
            pollers,
            sends,
            recvs,
            ..
        } = self;
        let SendEntry { ring, led } = &mut e;
        let ncq = pollers.len();
        let mut round = 0u8;
        macro_rules! run {
            ($r:ident) => {
                catching(|| {
                    $r.drain(Duration::ZERO, |r2| {
                        let mut h = Held {
                            ring: r2,
                            led: &mut *led,
                        };
                        // drain's own signal WR, if it posted one.
                        reconcile(&*h.ring, h.led, None, Shrink::No, true, &"drain's signal");
                        for cq in 0..ncq {
                            for _ in 0..4 {
                                if poll_cq(
                                    m,
                                    pollers,
                                    sends,
                                    recvs,
                                    Some(&mut h),
                                    cq,
                                    PollHow::Poll,
                                    route,
                                ) == 0
                                {
                                    break;
                                }
                            }
                        }
                        round += 1;
                        if panic_round == Some(round) {
                            planned_panic();
                        }
                        Ok::<(), std::convert::Infallible>(())
                    })
                })
            };
        }
        let res = match ring {
            SendSlot::V(r) => run!(r),
            SendSlot::W(r) => run!(r),
            SendSlot::D(r) => run!(r),
        };
        let r = ring.any_ref();
        stat(match &res {
            None => "drain panicked",
            Some(Ok(())) => "drain ok",
            Some(Err(DrainError::Stalled(_))) => "drain stalled",
            Some(Err(_)) => "drain post error",
        });
        match res {
            None => reconcile(r, led, None, Shrink::No, true, &what),
            Some(Ok(())) => {
                reconcile(r, led, None, Shrink::No, true, &what);
                assert_eq!(r.out() + r.staged_n(), 0, "{what}: Ok with WRs left");
            }
            Some(Err(DrainError::Stalled(s))) => {
                reconcile(r, led, None, Shrink::No, true, &what);
                assert_eq!(s.outstanding, r.out(), "{what}: Stalled's count");
                assert!(
                    s.outstanding > 0,
                    "{what}: stalled with nothing outstanding"
                );
                let _ = s.to_string();
                stalled = Some(s.signal);
            }
            Some(Err(DrainError::Post(se))) => {
                send_err(&se, &what);
                let post = match &se {
                    SendError::Post(pe) => Some(*pe),
                    _ => None,
                };
                reconcile(r, led, post.as_ref(), Shrink::Refused, true, &what);
            }
            Some(Err(DrainError::Poll(never))) => match never {},
        }
        check_send(r, led, &what);
        self.sends[i] = Some(e);
        stalled
    }

    fn poll(&mut self, cq_x: u8, how: PollHow, rounds: u8, route: &Route) {
        let cq = usize::from(cq_x) % self.cqs.len();
        if self.pollers[cq].is_none() && rounds & 0x80 == 0 {
            let kind = if self.m.cqs[cq].direct {
                PKind::Direct
            } else {
                PKind::Verbs
            };
            self.new_poller(cq as u8, kind, 0);
        }
        let World {
            m,
            pollers,
            sends,
            recvs,
            ..
        } = self;
        for _ in 0..1 + rounds % 4 {
            if poll_cq(m, pollers, sends, recvs, None, cq, how, route) == 0 {
                break;
            }
        }
    }

    fn transient(&mut self, t: &TransientSpec) {
        let (sc, rc) = (usize::from(t.send_cq), usize::from(t.recv_cq));
        let (sc, rc) = (sc % N_CQS, rc % N_CQS);
        let (pd, cqs) = (self.pd, self.cqs);
        let ext = t.kind == SKind::Wr;
        let own: Option<Cq> = match t.own_cq % 4 {
            0 => None,
            _ => Some(pd.context().create_cq(64, None).expect("transient CQ")),
        };
        let (scq, rcq) = match &own {
            Some(c) => (c, c),
            None => (&cqs[sc], &cqs[rc]),
        };
        let build = || {
            let b = QpBuilder::new(pd, scq, rcq, QpType::Rc)
                .max_send_wr(16)
                .max_recv_wr(16)
                .max_inline_data(QP_INLINE);
            if ext {
                b.send_ops(SendOps::SEND | SendOps::SEND_WITH_IMM | SendOps::RDMA_WRITE)
                    .build()
            } else {
                b.build()
            }
        };
        let ta = build().expect("transient QP");
        let to_world = t.to_world.map(|x| self.qp_idx(x));
        let tb = if to_world.is_none() {
            Some(build().expect("transient peer"))
        } else {
            None
        };
        let port = self.m.port;
        let dest = match (to_world, &tb) {
            (Some(j), _) => self.qp(j).endpoint(&port),
            (None, Some(b)) => b.endpoint(&port),
            _ => unreachable!(),
        };
        let dest_qpn = dest.qpn;
        ta.connect(&port, &dest, &self.m.opts)
            .expect("connect transient");
        if let Some(b) = &tb {
            b.connect(&port, &ta.endpoint(&port), &self.m.opts)
                .expect("connect transient peer");
        }
        let mut region = pd
            .alloc_mr(REGION, AccessFlags::LOCAL_WRITE)
            .expect("region");
        let mut reserved = Vec::new();
        // A poller of the transient CQ, if it has one.
        let mut lp: Option<Poller<'_>> = match (own.as_ref(), t.own_cq % 4) {
            (Some(c), 2) => c.poller::<PB>().ok().map(Poller::V),
            (Some(c), 3) if self.m.mlx5 => c.direct_poller::<PB>().ok().map(Poller::D),
            _ => None,
        };
        {
            let cfg = SendConfig::new(0, 8, QP_INLINE).signal_every(2);
            let tx: Option<SendSlot<'_>> = match t.kind {
                SKind::Verbs => ta.send_ring::<N>(cfg).ok().map(SendSlot::V),
                SKind::Wr => ta.wr_ring(cfg).ok().map(SendSlot::W),
                SKind::Direct if own.is_some() => match lp.as_mut() {
                    Some(Poller::D(p)) => ta.direct_ring(p, cfg).ok().map(SendSlot::D),
                    _ => None,
                },
                SKind::Direct => match self.pollers[sc].as_mut() {
                    Some(Poller::D(p)) => ta.direct_ring(p, cfg).ok().map(SendSlot::D),
                    _ => None,
                },
            };
            if tx.is_some() && own.is_none() {
                reserved.push((sc, t.kind != SKind::Direct));
                self.m.cqs[sc].reservations += 1;
                if t.kind != SKind::Direct {
                    self.m.cqs[sc].verbs_rings += 1;
                }
            }
            let rx = match &tb {
                Some(b) => b
                    .recv_ring::<RN>(&mut region, 0, RecvConfig::new(0, 64, 8))
                    .ok(),
                None => None,
            };
            let mut rx = rx;
            if let Some(rx) = rx.as_mut() {
                if own.is_none() {
                    reserved.push((rc, true));
                    self.m.cqs[rc].reservations += 1;
                    self.m.cqs[rc].verbs_rings += 1;
                }
                let _ = rx.fill();
            }
            let mut tx = tx;
            if let Some(tx) = tx.as_mut() {
                for _ in 0..t.msgs % 8 {
                    let (id, data) = self.m.new_msg(16);
                    if on_ring!(tx, r => r.send_now(Msg::send(Local::Inline(&data)))).is_ok() {
                        self.m.record(id, Some(dest_qpn), MOp::Send, 16);
                    }
                }
            }
            if t.poll && own.is_none() {
                let World {
                    m,
                    pollers,
                    sends,
                    recvs,
                    ..
                } = self;
                for cq in 0..N_CQS {
                    poll_cq(m, pollers, sends, recvs, None, cq, PollHow::Poll, &t.route);
                }
            }
            if t.error {
                ta.to_error().expect("to_error");
            }
            if t.poll {
                // The transient CQ's own poller: every completion to its ring (or, for
                // a WR of a dropped ring, nowhere), every answer named.
                for _ in 0..4 {
                    let res = match lp.as_mut() {
                        Some(Poller::V(p)) => p.poll().map_err(|e| e.to_string()),
                        Some(Poller::D(p)) => p.poll().map_err(|e| e.to_string()),
                        _ => break,
                    };
                    let Ok(cs) = res else { break };
                    if cs.is_empty() {
                        break;
                    }
                    for c in cs.iter_mut() {
                        if wr_id::is_recv(c.wr_id()) {
                            if let Some(rx) = rx.as_mut() {
                                match rx.on_completion(c) {
                                    Ok(got) => {
                                        let data = rx.data(&got).expect("data");
                                        self.m.received(rx.qp().qp_num(), data, got.byte_len());
                                        rx.release(got).expect("release");
                                    }
                                    Err(RecvError::Completion { error, .. }) => {
                                        known_wc(error, &"transient receive")
                                    }
                                    Err(e) => panic!("transient receive ring: {e:?}"),
                                }
                            }
                        } else if let Some(tx) = tx.as_mut() {
                            match tx.any().complete(c) {
                                Ok(_) => {}
                                Err(WcError::Misrouted(m)) => panic!("transient send ring: {m:?}"),
                                Err(e) => known_wc(e, &"transient send"),
                            }
                        }
                    }
                }
            }
            if t.poller_first {
                drop(lp.take());
            }
            if t.recv_first {
                drop(rx);
                drop(tx);
            } else {
                drop(tx);
                drop(rx);
            }
        }
        drop(lp);
        if t.cq_first {
            drop(own);
        }
        if t.region_first {
            drop(region);
            if t.qp_order {
                drop(tb);
                drop(ta);
            } else {
                drop(ta);
                drop(tb);
            }
        } else {
            if t.qp_order {
                drop(tb);
                drop(ta);
            } else {
                drop(ta);
                drop(tb);
            }
            drop(region);
        }
        for (c, verbs) in reserved {
            self.m.cqs[c].reservations -= 1;
            if verbs {
                self.m.cqs[c].verbs_rings -= 1;
            }
        }
        let errs = take_drop_errors();
        assert!(errs.is_empty(), "transient teardown: drop errors {errs:?}");
    }

    fn swap_send(&mut self, a: u8, b: u8) {
        let (Some(a), Some(b)) = (live(&self.sends, a), live(&self.sends, b)) else {
            return;
        };
        if a == b {
            return;
        }
        let (lo, hi) = (a.min(b), a.max(b));
        let (x, y) = self.sends.split_at_mut(hi);
        let (Some(ea), Some(eb)) = (x[lo].as_mut(), y[0].as_mut()) else {
            return;
        };
        // Swap the rings themselves (with their QPs), when they are of one type; the
        // ledgers go with them.
        match (&mut ea.ring, &mut eb.ring) {
            (SendSlot::V(p), SendSlot::V(q)) => std::mem::swap(p, q),
            (SendSlot::W(p), SendSlot::W(q)) => std::mem::swap(p, q),
            (SendSlot::D(p), SendSlot::D(q)) => std::mem::swap(p, q),
            _ => std::mem::swap(&mut ea.ring, &mut eb.ring),
        }
        std::mem::swap(&mut ea.led, &mut eb.led);
        check_send(ea.ring.any_ref(), &ea.led, &"swapped ring");
        check_send(eb.ring.any_ref(), &eb.led, &"swapped ring");
    }

    fn swap_recv(&mut self, a: u8, b: u8) {
        let (Some(a), Some(b)) = (live(&self.recvs, a), live(&self.recvs, b)) else {
            return;
        };
        if a == b {
            return;
        }
        let (lo, hi) = (a.min(b), a.max(b));
        let (x, y) = self.recvs.split_at_mut(hi);
        let (Some(ea), Some(eb)) = (x[lo].as_mut(), y[0].as_mut()) else {
            return;
        };
        std::mem::swap(&mut ea.ring, &mut eb.ring);
        std::mem::swap(&mut ea.led, &mut eb.led);
        std::mem::swap(&mut ea.held, &mut eb.held);
        check_recv(ea, &"swapped receive ring");
        check_recv(eb, &"swapped receive ring");
    }

    fn step(&mut self, op: &Op) {
        stat(op_name(op));
        let s = |x: u8| live(&self.sends, x);
        let r = |x: u8| live(&self.recvs, x);
        match *op {
            Op::SendRing { qp, kind, cfg } => self.new_send_ring(qp, kind, &cfg),
            Op::RecvRing {
                qp,
                count,
                slot_len,
                repost,
                offset,
            } => self.new_recv_ring(qp, count, slot_len, repost, offset),
            Op::DropSend(x) => {
                if let Some(i) = s(x) {
                    drop(self.sends[i].take());
                }
            }
            Op::DropRecv(x) => {
                if let Some(i) = r(x) {
                    drop(self.recvs[i].take());
                }
            }
            Op::SwapSend(a, b) => self.swap_send(a, b),
            Op::SwapRecv(a, b) => self.swap_recv(a, b),
            Op::Poller { cq, kind, fields } => self.new_poller(cq, kind, fields),
            Op::DropPoller(cq) => drop(self.pollers[usize::from(cq) % N_CQS].take()),
            Op::SendNow { ring, msg, signal } => {
                if let Some(i) = s(ring) {
                    self.send_now(i, &msg, signal)
                }
            }
            Op::Batch { ring, msgs, n, end } => {
                if let Some(i) = s(ring) {
                    self.batch(i, &msgs[..usize::from(n) % 5], end)
                }
            }
            Op::Gather { ring, msg, cuts } => {
                if let Some(i) = s(ring) {
                    self.gather(i, &msg, cuts)
                }
            }
            Op::Flush { ring, signaled } => {
                if let Some(i) = s(ring) {
                    self.flush(i, signaled)
                }
            }
            Op::Fill(x) => {
                if let Some(i) = r(x) {
                    self.recv_post(i, true)
                }
            }
            Op::Repost(x) => {
                if let Some(i) = r(x) {
                    self.recv_post(i, false)
                }
            }
            Op::Release { ring, idx, to } => {
                if let Some(i) = r(ring) {
                    self.release(i, idx, to)
                }
            }
            Op::Poll {
                cq,
                how,
                rounds,
                route,
            } => self.poll(cq, how, rounds, &route),
            Op::CqPoll(cq) => self.cq_poll(cq),
            Op::ToError(qp) => self.qp_to_error(qp),
            Op::QpReset(qp) => self.qp_reset(qp),
            Op::Connect { qp, to } => self.connect(qp, to),
            Op::RingReset {
                ring,
                with_recv,
                wrong_poller,
            } => {
                if let Some(i) = s(ring) {
                    self.ring_reset(i, with_recv.and_then(r), wrong_poller)
                }
            }
            Op::RecvReset(x) => {
                if let Some(i) = r(x) {
                    self.recv_reset(i)
                }
            }
            Op::Drain {
                ring,
                panic_round,
                route,
            } => {
                if let Some(i) = s(ring) {
                    self.drain(i, panic_round, &route);
                }
            }
            Op::Transient(t) => self.transient(&t),
            Op::SetRemote { ring, to, bad_key } => {
                if let Some(i) = s(ring) {
                    self.set_remote(i, to, bad_key)
                }
            }
        }
    }

    /// Brings every ring to rest and checks its ledger balances exactly.
    fn rest(&mut self) {
        // Post what is staged.
        for i in 0..SLOTS {
            if self.sends[i].is_some() {
                self.flush(i, false);
            }
        }
        let route = Route::default();
        // Pollers everywhere, then the API's way to retire an unsignaled tail (issue 27 item
        // 11): `drain`, which asks for the signal; a ring without a remote sends its last
        // message after `signal_next`.
        for cq in 0..self.cqs.len() {
            if self.pollers[cq].is_none() {
                let kind = if self.m.cqs[cq].direct {
                    PKind::Direct
                } else {
                    PKind::Verbs
                };
                self.new_poller(cq as u8, kind, 0);
            }
        }
        for i in 0..SLOTS {
            let Some(e) = self.sends[i].as_mut() else {
                continue;
            };
            if e.ring.any_ref().out() == 0 {
                continue;
            }
            if self.drain(i, None, &route) == Some(SignalAsked::NoRemote) {
                // No zero-length WRITE possible (no remote, or WRITE not enabled on the
                // QP): the last message goes signaled, as the Stall says.
                let spec = MsgSpec {
                    op: MOp::Send,
                    len: 0xff,
                    off: 0,
                };
                self.send_now(i, &spec, true);
                self.drain(i, None, &route);
            }
        }
        for round in 0..REST_ROUNDS {
            if self.at_rest() {
                break;
            }
            for qp in self.made() {
                // The first round only polls: what completed successfully is retired as such.
                if round > 0 && !self.m.qps[qp].in_reset {
                    self.qp(qp).to_error().expect("to_error outside RESET");
                }
            }
            for cq in 0..self.cqs.len() {
                if self.pollers[cq].is_none() {
                    let kind = if self.m.cqs[cq].direct {
                        PKind::Direct
                    } else {
                        PKind::Verbs
                    };
                    self.new_poller(cq as u8, kind, 0);
                }
                let World {
                    m,
                    pollers,
                    sends,
                    recvs,
                    ..
                } = self;
                for _ in 0..REST_POLLS {
                    if poll_cq(m, pollers, sends, recvs, None, cq, PollHow::Poll, &route) == 0 {
                        break;
                    }
                }
            }
        }
        // What is still outstanding must have a reason the API named; reset those rings.
        for i in 0..SLOTS {
            let Some(e) = self.sends[i].as_ref() else {
                continue;
            };
            let r = e.ring.any_ref();
            if r.out() + r.staged_n() == 0 {
                continue;
            }
            let l = &e.led;
            let why = self.m.cqs[l.cq].jammed
                || self.m.cqs[l.cq].lossy
                || self.m.qps[l.qp].in_reset
                || l.unknown_post;
            assert!(
                why,
                "send ring {i} waits for ever: {} outstanding, {} staged after {REST_ROUNDS} rounds \
                 of to_error + polling, no named reason ({l:?}, CQ {:?}, QP {:?})",
                r.out(),
                r.staged_n(),
                self.m.cqs[l.cq],
                self.m.qps[l.qp]
            );
            stat("rest: send ring reset");
            let qp = l.qp;
            let with = (0..SLOTS).find(|&j| self.recvs[j].as_ref().is_some_and(|x| x.led.qp == qp));
            if e.led.kind == SKind::Direct {
                let cq = e.led.cq;
                if !matches!(self.pollers[cq], Some(Poller::D(_))) {
                    drop(self.pollers[cq].take());
                    self.new_poller(cq as u8, PKind::Direct, 0);
                }
            }
            self.ring_reset(i, with, false);
        }
        for i in 0..SLOTS {
            let Some(e) = self.recvs[i].as_ref() else {
                continue;
            };
            if e.ring.posted() == 0 {
                continue;
            }
            let l = &e.led;
            let why = self.m.cqs[l.cq].jammed
                || self.m.cqs[l.cq].lossy
                || self.m.qps[l.qp].in_reset
                || l.unknown_post;
            assert!(
                why,
                "receive ring {i} waits for ever: {} receives posted after {REST_ROUNDS} rounds, no \
                 named reason ({l:?}, CQ {:?}, QP {:?})",
                e.ring.posted(),
                self.m.cqs[l.cq],
                self.m.qps[l.qp]
            );
            stat("rest: recv ring reset");
            let qp = l.qp;
            if let Some(s) =
                (0..SLOTS).find(|&s| self.sends[s].as_ref().is_some_and(|x| x.led.qp == qp))
            {
                self.ring_reset(s, Some(i), false);
            } else {
                self.recv_reset(i);
            }
        }
        // Exactly once.
        for (i, e) in self.sends.iter().enumerate() {
            let Some(e) = e else { continue };
            let r = e.ring.any_ref();
            let l = &e.led;
            let what = what!("send ring {i} at rest");
            assert_eq!(r.out() + r.staged_n(), 0, "{what}: not at rest ({l:?})");
            check_send(r, l, &what);
            stat("rest: send ring balanced");
            if l.handed > 0 {
                stat("rest: send ring balanced with WRs");
            }
            assert_eq!(
                l.handed,
                l.retired + l.dropped + l.refused + l.leaked,
                "{what}: handed out != retired + dropped by resets + refused + leaked ({l:?})"
            );
        }
        for (i, e) in self.recvs.iter().enumerate() {
            let Some(e) = e else { continue };
            let what = what!("receive ring {i} at rest");
            assert_eq!(e.ring.posted(), 0, "{what}: receives still posted");
            check_recv(e, &what);
            let l = &e.led;
            assert_eq!(
                l.posted,
                l.accepted + l.failed + l.discarded,
                "{what}: {l:?}"
            );
            stat("rest: recv ring balanced");
        }
    }

    fn at_rest(&self) -> bool {
        self.sends.iter().flatten().all(|e| {
            let r = e.ring.any_ref();
            r.out() + r.staged_n() == 0
        }) && self.recvs.iter().flatten().all(|e| e.ring.posted() == 0)
    }
}

fn op_name(op: &Op) -> &'static str {
    match op {
        Op::SendRing { .. } => "op SendRing",
        Op::RecvRing { .. } => "op RecvRing",
        Op::DropSend(_) => "op DropSend",
        Op::DropRecv(_) => "op DropRecv",
        Op::SwapSend(..) => "op SwapSend",
        Op::SwapRecv(..) => "op SwapRecv",
        Op::Poller { .. } => "op Poller",
        Op::DropPoller(_) => "op DropPoller",
        Op::SendNow { .. } => "op SendNow",
        Op::Batch { .. } => "op Batch",
        Op::Gather { .. } => "op Gather",
        Op::Flush { .. } => "op Flush",
        Op::Fill(_) => "op Fill",
        Op::Repost(_) => "op Repost",
        Op::Release { .. } => "op Release",
        Op::Poll { .. } => "op Poll",
        Op::CqPoll(_) => "op CqPoll",
        Op::ToError(_) => "op ToError",
        Op::QpReset(_) => "op QpReset",
        Op::Connect { .. } => "op Connect",
        Op::RingReset { .. } => "op RingReset",
        Op::RecvReset(_) => "op RecvReset",
        Op::Drain { .. } => "op Drain",
        Op::Transient(_) => "op Transient",
        Op::SetRemote { .. } => "op SetRemote",
    }
}

fn errno_stat(prefix: &'static str, e: i32) -> &'static str {
    match (prefix, e) {
        ("ring refused", libc::EBUSY) => "ring refused EBUSY",
        ("ring refused", libc::EINVAL) => "ring refused EINVAL",
        ("ring refused", libc::ENOSPC) => "ring refused ENOSPC",
        ("ring refused", _) => "ring refused other",
        ("poller refused", libc::EBUSY) => "poller refused EBUSY",
        ("poller refused", libc::EINVAL) => "poller refused EINVAL",
        ("poller refused", _) => "poller refused other",
        _ => "other errno",
    }
}

fn run(input: &Input) {
    let s = &input.setup;
    let dev_i = usize::from(s.rxe) | usize::from(s.mlx5) << 1;
    let (ctx, port) = device(dev_i);
    let pd = ctx.alloc_pd().expect("pd");
    let cqs: Vec<Cq> = s
        .cqs
        .iter()
        .map(|c| {
            let n = 8 + 2 * u32::from(c.size);
            match c.kind {
                CqKind::Plain => ctx.create_cq(n, None),
                CqKind::Ex => CqBuilder::new(&ctx, n)
                    .wc_fields(WcFields::BYTE_LEN | WcFields::QP_NUM)
                    .build(),
                CqKind::ExNoQpn => CqBuilder::new(&ctx, n)
                    .wc_fields(WcFields::BYTE_LEN)
                    .build(),
            }
            .expect("cq")
        })
        .collect();
    let nqp = 2 * (1 + usize::from(s.pairs) % 3);
    let cq_of = |k: usize| -> (usize, usize) {
        match s.layout {
            0..=127 => (0, 1),
            128..=175 => (k % 2, k % 2),
            _ => (usize::from(s.qps[k].send_cq), usize::from(s.qps[k].recv_cq)),
        }
    };
    let opts = ConnectOptions {
        rnr_retry: if s.rnr_wait { 7 } else { 6 },
        retry_cnt: if s.retry_hold { 7 } else { 6 },
        ..Default::default()
    };
    let qps: Vec<OnceCell<Qp>> = (0..nqp).map(|_| OnceCell::new()).collect();
    let target = pd
        .alloc_mr(
            MAX_QPS * TARGET_STRIDE as usize,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .expect("target");
    let mut regions: Vec<Option<Mr<'static>>> = (0..nqp).map(|_| None).collect();
    let m = Model {
        mlx5: s.mlx5,
        qps: (0..nqp)
            .map(|k| QpInfo {
                // Set when the QP is made (softnic's QP numbers start at 17).
                qpn: 0,
                send_cq: cq_of(k).0,
                recv_cq: cq_of(k).1,
                ext: s.qps[k].ext,
                max_send_wr: 0,
                max_sge: 0,
                in_reset: false,
                peer_qpn: 0,
                sq_spent: false,
                rq_spent: false,
            })
            .collect(),
        cqs: s
            .cqs
            .iter()
            .map(|c| CqInfo {
                kind: Some(c.kind),
                ..Default::default()
            })
            .collect(),
        msgs: HashMap::new(),
        next_msg: 1,
        target: target.remote().into(),
        opts,
        port,
    };
    {
        let mut w = World {
            qps: &qps,
            specs: s.qps,
            cqs: &cqs,
            pd: &pd,
            regions: regions.iter_mut().map(Some).collect(),
            sends: (0..SLOTS).map(|_| None).collect(),
            recvs: (0..SLOTS).map(|_| None).collect(),
            pollers: (0..N_CQS).map(|_| None).collect(),
            m,
        };
        for op in input.ops.iter().take(MAX_OPS) {
            w.step(op);
        }
        w.rest();
        // Teardown in the order the input picks: pollers first or rings first.
        let World {
            sends,
            recvs,
            pollers,
            ..
        } = w;
        match input.teardown % 3 {
            0 => {
                drop(pollers);
                drop(sends);
                drop(recvs);
            }
            1 => {
                drop(recvs);
                drop(pollers);
                drop(sends);
            }
            _ => {
                drop(sends);
                drop(recvs);
                drop(pollers);
            }
        }
    }
    if input.teardown & 4 != 0 {
        drop(cqs);
        drop(regions);
        drop(qps);
    } else {
        drop(qps);
        drop(regions);
        drop(cqs);
    }
    drop(target);
    drop(pd);
    let errs = take_drop_errors();
    assert!(errs.is_empty(), "teardown: drop errors {errs:?}");
}

fuzz_target!(|input: Input| {
    install_hook();
    if std::env::var_os("HOTVERBS_FUZZ_TRACE").is_some() {
        eprintln!("{input:#?}");
    }
    run(&input);
    if STATS_ON.with(|s| *s) {
        stat("inputs");
        STATS.with(|m| {
            let m = m.borrow();
            if m["inputs"] % 20_000 == 0 {
                eprintln!("safe_api stats: {m:?}");
            }
        });
    }
});
