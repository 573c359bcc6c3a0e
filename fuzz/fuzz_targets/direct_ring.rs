//! `DirectRing` (mlx5 WQEs written straight into the send queue) and `DirectPoller` on
//! softnic's simulated ConnectX queues (`Mlx5Sim`), driven by arbitrary sequences of
//! `send_now` / `stage` / batches (finished, dropped or leaked) / inline gathers / SGE
//! gathers / flush / device runs / polls / injected error completions / QP reset /
//! `signal_next`, with messages of every kind the ring writes: SEND and SEND_WITH_IMM
//! (inline of any length, empty, registered buffers that go inline or by SGE), WRITE and
//! WRITE_WITH_IMM in and out of the remote range, READ, FETCH_AND_ADD and CMP_AND_SWP
//! (aligned, misaligned, out of range), on a ring with or without a remote buffer and with
//! `inline_bufs` on or off.
//!
//! Invariants checked after every step:
//! - every return value equals the model's: the sequence number, `WouldBlock` / `QpError`
//!   when the ring is full or in error (before any check of the message), otherwise the
//!   message's own refusal (`InlineTooLong`, `RemoteOutOfRange`, `AtomicMisaligned`,
//!   `NoRemote`), and `NotInline` / `Config(Slots)` for what a call never accepts;
//! - a refused message changes nothing: staged, posted and retired counts as before;
//! - retired <= posted, staged + outstanding <= depth, nothing retired before the device
//!   ran after it was posted, and with nothing staged the doorbell record is `cur_post`;
//! - the simulated device reads every announced WQE in order (its own assertion: each
//!   ctrl segment carries the WQE index the device expects, so a WQE of the wrong size or
//!   a doorbell past what was written aborts the run);
//! - at the end one signaled message (or a reset after an error) retires every posted WR:
//!   no deadlock, nothing lost;
//! - a session's sends get the model's answers too (`WouldBlock` at depth, `QpError` once
//!   an error completion came back), its completions (error CQEs of WRs whose `wrid` entry
//!   its fast path never wrote among them) retire what the ring counts, and after it ends
//!   (finished, dropped or leaked) the ring's counters, `cur_post` and doorbell record
//!   agree.
//!
//! Planted bug (`--features planted-bug`): the model checks the message before the ring's
//! room, so a bad message on a full ring is expected to get its own error instead of
//! `WouldBlock` (`SendRing`'s order, `refused()`, got backwards).
#![no_main]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use arbitrary::Arbitrary;
use hotverbs_benches::direct::{sim_cq, sim_sq};
use hotverbs_datapath::mlx5::{DirectSq, RecordingDoorbell};
use hotverbs_datapath::*;
use hotverbs_softnic::mlx5sim::Mlx5Sim;
use libfuzzer_sys::fuzz_target;

const QPN: u32 = 0xabc;
const MAX_SGE: u32 = 3;
const REMOTE_LEN: u64 = 1024;
const REMOTE_ADDR: u64 = 0x7000_0000;
const LKEY: u32 = 0x1234;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum MsgSpec {
    /// SEND (odd `imm`: SEND_WITH_IMM) of `len` inline bytes (0 to 80 around the caps).
    Inline { len: u8, imm: u8 },
    /// SEND of nothing.
    Empty,
    /// SEND of a registered buffer of `len` bytes (inline when small and `inline_bufs`).
    Buf { len: u8 },
    /// WRITE (odd `imm`: WRITE_WITH_IMM) of `len` inline bytes at `off`.
    Write { len: u8, off: u16, imm: u8 },
    /// WRITE of a registered buffer.
    WriteBuf { len: u8, off: u16 },
    /// READ of `len` bytes at `off`.
    Read { len: u8, off: u16 },
    /// FETCH_AND_ADD (even `kind`) or CMP_AND_SWP of a `len`-byte destination at `off`.
    Atomic { kind: u8, len: u8, off: u16 },
}

#[derive(Arbitrary, Debug)]
enum Op {
    SendNow(MsgSpec),
    Stage(MsgSpec),
    /// Messages, then `end % 3`: 0 finish, 1 drop, 2 leak (`mem::forget`).
    Batch {
        msgs: Vec<MsgSpec>,
        end: u8,
    },
    /// SEND (or WRITE at `off`) of inline pieces of these lengths, one inline segment.
    InlineGather {
        lens: Vec<u8>,
        write: Option<u16>,
    },
    /// SEND (or READ at `off`) of registered pieces of these lengths, one SGE each.
    SgeGather {
        lens: Vec<u8>,
        read: Option<u16>,
    },
    Flush,
    Process,
    Poll,
    FailNext(u8),
    Reset,
    SignalNext,
    /// A held `DirectSession::<16>`: `count` SENDs (SEND_WITH_IMM for odd `imm`), the
    /// device run and the poller reaped through the session after every `(every % 8) + 1`
    /// (an injected error first when `fail` is odd), then `end % 3`: 0 finish, 1 drop,
    /// 2 leak (`mem::forget`).
    Session {
        count: u8,
        every: u8,
        imm: u8,
        fail: u8,
        end: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    depth_log: u8,
    k: u8,
    batch: u8,
    max_inline: u8,
    remote: bool,
    inline_bufs: bool,
    ops: Vec<Op>,
}

/// The error syndromes the simulated device may inject (`mlx5` requester syndromes).
const SYNDROMES: [u8; 6] = [0x01, 0x02, 0x04, 0x10, 0x13, 0x15];

/// The registered memory every `Local::Buf` points into: never written (the simulated
/// device moves no data), read by the CPU when a small buffer goes inline.
static DATA: [u8; 256] = {
    let mut d = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        d[i] = i as u8;
        i += 1;
    }
    d
};

fn buf(len: u8) -> LocalBuf {
    LocalBuf::new(DATA.as_ptr() as u64, u32::from(len), LKEY)
}

/// Inline lengths run to 80, past every `max_inline` the target configures.
fn inline(len: u8) -> Local<'static> {
    Local::Inline(&DATA[..len as usize % 81])
}

/// Remote offsets run to 1099, past the end of the 1024-byte remote buffer.
fn offset(off: u16) -> u64 {
    u64::from(off % 1100)
}

/// The atomic's destination: 8 bytes, or (one in four) another length.
fn atomic_len(len: u8) -> u8 {
    if len % 4 == 0 {
        len
    } else {
        8
    }
}

fn build(m: MsgSpec) -> Msg<'static> {
    match m {
        MsgSpec::Inline { len, imm } if imm % 2 == 1 => Msg::send_imm(inline(len), u32::from(imm)),
        MsgSpec::Inline { len, .. } => Msg::send(inline(len)),
        MsgSpec::Empty => Msg::send(Local::Empty),
        MsgSpec::Buf { len } => Msg::send(Local::Buf(buf(len))),
        MsgSpec::Write { len, off, imm } if imm % 2 == 1 => {
            Msg::write_imm(inline(len), offset(off), u32::from(imm))
        }
        MsgSpec::Write { len, off, .. } => Msg::write(inline(len), offset(off)),
        MsgSpec::WriteBuf { len, off } => Msg::write(Local::Buf(buf(len)), offset(off)),
        MsgSpec::Read { len, off } => Msg::read(buf(len), offset(off)),
        MsgSpec::Atomic { kind, len, off } if kind % 2 == 0 => {
            Msg::fetch_add(buf(atomic_len(len)), offset(off), 1)
        }
        MsgSpec::Atomic { len, off, .. } => Msg::cmp_swap(buf(atomic_len(len)), offset(off), 2, 3),
    }
}

/// A message's payload as the ring judges it.
#[derive(Clone, Copy)]
struct Shape {
    len: u64,
    inline: bool,
    atomic: bool,
    /// The remote offset, for the operations that have one.
    off: Option<u64>,
}

/// The ring's configuration, judging messages (kept apart from the ring so that a batch,
/// which borrows the ring, can be judged too).
#[derive(Clone, Copy)]
struct Judge {
    depth: u64,
    max_inline: u64,
    remote: bool,
    inline_bufs: bool,
}

struct World {
    sim: Box<Mlx5Sim>,
    r: DirectRing<RecordingDoorbell>,
    p: DirectPoller<16>,
    j: Judge,
    /// `posted_total` when the device last ran.
    processed: u64,
    /// `retired_total` after the last reset (which drops what never completed).
    floor: u64,
    /// A batch was leaked and the ring has not dropped it yet.
    leaked: bool,
}

impl Judge {
    fn shape(&self, m: MsgSpec) -> Shape {
        // A registered SEND / WRITE buffer of at most max_inline bytes goes inline.
        let small = |len: u8| self.inline_bufs && u64::from(len) <= self.max_inline;
        let (len, inline, atomic, off) = match m {
            MsgSpec::Inline { len, .. } => (len % 81, true, false, None),
            MsgSpec::Empty => (0, false, false, None),
            MsgSpec::Buf { len } => (len, small(len), false, None),
            MsgSpec::Write { len, off, .. } => (len % 81, true, false, Some(off)),
            MsgSpec::WriteBuf { len, off } => (len, small(len), false, Some(off)),
            MsgSpec::Read { len, off } => (len, false, false, Some(off)),
            MsgSpec::Atomic { len, off, .. } => (atomic_len(len), false, true, Some(off)),
        };
        Shape {
            len: u64::from(len),
            inline,
            atomic,
            off: off.map(offset),
        }
    }

    /// The message's own refusal on a ring with room, if it is refused.
    fn invalid(&self, s: Shape) -> Option<SendError> {
        if s.inline && s.len > self.max_inline {
            return Some(SendError::InlineTooLong {
                len: s.len as usize,
                max: self.max_inline as u32,
            });
        }
        let off = s.off?;
        if !self.remote {
            return Some(SendError::NoRemote);
        }
        if s.atomic && (off % 8 != 0 || s.len != 8) {
            return Some(SendError::AtomicMisaligned);
        }
        if off + s.len > REMOTE_LEN {
            return Some(SendError::RemoteOutOfRange {
                offset: off,
                len: s.len,
            });
        }
        None
    }

    /// The answer to a message `s` that passed the call's own checks, as sequence `want`
    /// on a ring in `error` with `in_flight` staged or outstanding after a leaked batch's
    /// drop, or `raw` before it (a refused message is judged against the ring as it is);
    /// and whether the call dropped a leaked batch (a valid message does).
    fn expect(
        &self,
        s: Shape,
        error: Option<WcError>,
        want: u64,
        in_flight: u64,
        raw: u64,
    ) -> (Result<u64, SendError>, bool) {
        let invalid = self.invalid(s);
        if cfg!(feature = "planted-bug") {
            if let Some(e) = invalid {
                return (Err(e), false);
            }
        }
        let answer = match (invalid, error) {
            (_, Some(e)) => Err(SendError::QpError(e)),
            (Some(_), None) if raw >= self.depth => Err(SendError::WouldBlock),
            (Some(e), None) => Err(e),
            (None, None) if in_flight >= self.depth => Err(SendError::WouldBlock),
            (None, None) => Ok(want),
        };
        (answer, invalid.is_none())
    }
}

impl World {
    /// [`Judge::expect`] on the ring as it is; clears `leaked` when the call drops it.
    fn expect(&mut self, s: Shape, want: u64, in_flight: u64, raw: u64) -> Result<u64, SendError> {
        let (answer, drops) = self.j.expect(s, self.r.error(), want, in_flight, raw);
        if drops {
            self.leaked = false;
        }
        answer
    }

    fn counts(&self) -> (u64, u64, u64) {
        (
            self.r.staged(),
            self.r.posted_total(),
            self.r.retired_total(),
        )
    }

    fn check(&self) {
        let r = &self.r;
        assert!(r.retired_total() <= r.posted_total());
        assert!(r.outstanding() + r.staged() <= self.j.depth, "over depth");
        assert!(
            r.retired_total() <= self.processed.max(self.floor),
            "retired {} but the device ran with {} posted (reset at {})",
            r.retired_total(),
            self.processed,
            self.floor
        );
        if r.staged() == 0 {
            assert_eq!(self.sim.sq_dbr(), r.cur_post() & 0xffff, "announced");
        }
    }

    fn poll(&mut self) {
        for _ in 0..64 {
            let cs = self.p.poll().expect("poll");
            if cs.is_empty() {
                return;
            }
            for c in cs.iter() {
                let first = self.r.error().is_none();
                if let Err(e) = self.r.on_completion(c) {
                    // The failing WR's CQE comes before the flushes of the WRs after it:
                    // the ring's first error is its status, whoever posted the WR (a lone
                    // run's WRs have no `wrid` entry until the ring resolves the CQE).
                    assert!(
                        !first || e != WcError::WrFlush,
                        "the first error completion is a flush: the failing WR's was lost"
                    );
                }
            }
        }
        panic!("the poller never ran dry");
    }

    fn reset(&mut self) {
        // What the reset must drop: everything staged or posted and not retired (a lone
        // run's posts counted from the doorbell record, which the QP's reset clears).
        self.r.settle();
        let never = self.r.staged() + self.r.outstanding();
        self.sim.reset_qp();
        self.p.clean(QPN);
        // SAFETY: the ring was settled, the simulated QP went to RESET and its CQEs were
        // cleaned.
        let dropped = unsafe { self.r.reset() };
        assert_eq!(dropped, never, "reset drops what never completed");
        self.floor = self.r.retired_total();
    }

    /// `got` is `want`; a refusal changed no count (but the staged count when a leaked
    /// batch was pending: the call may have dropped it before refusing).
    fn answer(
        &self,
        got: Result<u64, SendError>,
        want: Result<u64, SendError>,
        before: (u64, u64, u64),
        was_leaked: bool,
        what: &str,
    ) {
        assert_eq!(got, want, "{what}");
        if got.is_err() {
            let now = self.counts();
            if was_leaked {
                assert_eq!(
                    (now.1, now.2),
                    (before.1, before.2),
                    "{what}: a refusal posted or retired"
                );
            } else {
                assert_eq!(now, before, "{what}: a refusal changed the ring");
            }
        }
    }

    fn step(&mut self, op: &Op) {
        // After a leaked batch the ring's next use drops everything staged (never
        // announced) and hands those sequence numbers out again.
        let raw = self.r.outstanding() + self.r.staged();
        let staged = if self.leaked { 0 } else { self.r.staged() };
        let in_flight = self.r.outstanding() + staged;
        let want = self.r.posted_total() + staged;
        let before = self.counts();
        let was_leaked = self.leaked;
        match op {
            Op::SendNow(m) => {
                let msg = build(*m);
                let expected = if msg.is_borrow_free() {
                    self.expect(self.j.shape(*m), want, in_flight, raw)
                } else {
                    Err(SendError::NotInline)
                };
                let got = self.r.send_now(msg);
                if got.is_ok() {
                    assert_eq!(self.r.staged(), 0, "send_now posts everything staged");
                }
                self.answer(got, expected, before, was_leaked, "send_now");
            }
            Op::Stage(m) => {
                let expected = self.expect(self.j.shape(*m), want, in_flight, raw);
                // SAFETY: the registered buffers are in DATA (static); the simulated
                // device never reads or writes them.
                let got = unsafe { self.r.stage(build(*m)) };
                self.answer(got, expected, before, was_leaked, "stage");
            }
            Op::Batch { msgs, end } => {
                // Opening a batch drops a leaked one.
                self.leaked = false;
                let (j, error) = (self.j, self.r.error());
                let mut accepted = 0u64;
                let mut b = self.r.batch();
                for m in msgs.iter().take(24) {
                    let msg = build(*m);
                    let expected = if msg.is_borrow_free() {
                        let n = in_flight + accepted;
                        j.expect(j.shape(*m), error, want + accepted, n, n).0
                    } else {
                        Err(SendError::NotInline)
                    };
                    let got = b.push(msg);
                    assert_eq!(got, expected, "batch push of {m:?}");
                    if got.is_ok() {
                        accepted += 1;
                    }
                }
                match end % 3 {
                    0 => b.finish().expect("finish"),
                    1 => drop(b),
                    _ => {
                        std::mem::forget(b);
                        self.leaked = true;
                    }
                }
            }
            Op::InlineGather { lens, write } => {
                let parts: Vec<&[u8]> = lens
                    .iter()
                    .take(5)
                    .map(|&l| &DATA[..(l % 40) as usize])
                    .collect();
                let off = write.map(offset);
                let msg = match off {
                    Some(o) => Msg::write(Local::Empty, o),
                    None => Msg::send(Local::Empty),
                };
                let shape = Shape {
                    len: parts.iter().map(|p| p.len() as u64).sum(),
                    inline: true,
                    atomic: false,
                    off,
                };
                let expected = if parts.is_empty() || parts.len() > MAX_SGE as usize {
                    Err(SendError::Config(ConfigError::Slots))
                } else {
                    // The call drops a leaked batch before judging the message.
                    self.leaked = false;
                    self.expect(shape, want, in_flight, in_flight)
                };
                let got = self.r.stage_inline_gather(msg, &parts);
                self.answer(got, expected, before, was_leaked, "stage_inline_gather");
            }
            Op::SgeGather { lens, read } => {
                let sges: Vec<LocalBuf> = lens.iter().take(5).map(|&l| buf(l)).collect();
                let off = read.map(offset);
                let msg = match off {
                    Some(o) => Msg::read(buf(0), o),
                    None => Msg::send(Local::Empty),
                };
                let shape = Shape {
                    len: sges.iter().map(|b| u64::from(b.len)).sum(),
                    inline: false,
                    atomic: false,
                    off,
                };
                let expected = if sges.is_empty() || sges.len() > MAX_SGE as usize {
                    Err(SendError::Config(ConfigError::Slots))
                } else {
                    self.leaked = false;
                    self.expect(shape, want, in_flight, in_flight)
                };
                // SAFETY: as for Stage.
                let got = unsafe { self.r.stage_gather(msg, &sges) };
                self.answer(got, expected, before, was_leaked, "stage_gather");
            }
            Op::Flush => {
                self.leaked = false;
                self.r.flush().expect("flush");
            }
            Op::Process => {
                self.sim.process();
                self.processed = self.r.posted_total();
            }
            Op::Poll => self.poll(),
            Op::FailNext(s) => self
                .sim
                .fail_next(SYNDROMES[*s as usize % SYNDROMES.len()], 0),
            Op::Reset => self.reset(),
            Op::SignalNext => self.r.signal_next(),
            Op::Session {
                count,
                every,
                imm,
                fail,
                end,
            } => self.session(*count, *every, *imm, *fail, *end),
        }
        self.check();
    }

    /// [`Op::Session`].
    fn session(&mut self, count: u8, every: u8, imm: u8, fail: u8, end: u8) {
        let World {
            sim,
            r,
            p,
            j,
            processed,
            leaked,
            ..
        } = self;
        let mut error = r.error();
        let mut s = match r.session::<16>() {
            // Opening a session drops a leaked batch and posts what is staged (a refused
            // size changes nothing).
            Ok(s) => {
                *leaked = false;
                s
            }
            Err(e) => {
                assert!(
                    j.max_inline < 16,
                    "session::<16> with max_inline {}: {e}",
                    j.max_inline
                );
                assert_eq!(
                    e,
                    SendError::InlineTooLong {
                        len: 16,
                        max: j.max_inline as u32
                    }
                );
                return;
            }
        };
        let every = 1 + u64::from(every % 8);
        for i in 0..u64::from(count % 48) {
            let want = s.next_seq();
            let expected = match error {
                Some(e) => Err(SendError::QpError(e)),
                None if s.outstanding() >= j.depth => Err(SendError::WouldBlock),
                None => Ok(want),
            };
            let data = [i as u8; 16];
            let got = if imm % 2 == 1 {
                s.send_imm(&data, u32::from(imm))
            } else {
                s.send(&data)
            };
            assert_eq!(got, expected, "session send {i}");
            assert!(s.outstanding() <= j.depth, "session over depth");
            if (i + 1) % every == 0 {
                if fail % 2 == 1 && i / every == 1 {
                    sim.fail_next(SYNDROMES[fail as usize / 2 % SYNDROMES.len()], 0);
                }
                sim.process();
                *processed = s.next_seq();
                for _ in 0..64 {
                    let cs = p.poll().expect("poll");
                    if cs.is_empty() {
                        break;
                    }
                    for c in cs.iter() {
                        let before = s.outstanding();
                        match s.on_completion(c) {
                            Ok(n) => assert_eq!(s.outstanding() + n, before, "retired"),
                            Err(e) => {
                                // The first error is the failing WR's own status (an
                                // injected syndrome is never a flush), also when that WR
                                // is one whose `wrid` entry the session's fast path left
                                // unwritten: its error CQE is not lost as stale.
                                if error.is_none() {
                                    assert_ne!(e, WcError::WrFlush, "the failure's own CQE lost");
                                }
                                error.get_or_insert(e);
                            }
                        }
                    }
                }
            }
        }
        match end % 3 {
            0 => s.finish(),
            1 => drop(s),
            _ => std::mem::forget(s),
        }
        // Open, closed or leaked, the ring counts what the session posted: its doorbell
        // record holds `cur_post`.
        assert_eq!(sim.sq_dbr(), r.cur_post() & 0xffff, "session announced");
    }

    /// The device runs and the poller reaps until nothing is outstanding; a signaled
    /// empty SEND (`signal_next`) pads a tail of unsignaled WRs once there is room (a full
    /// ring always has a signaled WR in flight, so a run of the device makes room).
    fn drain(&mut self) {
        self.r.flush().expect("flush");
        self.leaked = false;
        for round in 0..4 {
            if self.r.error().is_some() {
                self.reset();
            }
            self.sim.process();
            self.processed = self.r.posted_total();
            self.poll();
            self.check();
            if self.r.outstanding() == 0 && self.r.error().is_none() {
                return;
            }
            if self.r.error().is_none() {
                assert!(
                    self.r.free() > 0,
                    "full after a run of the device: {:?}",
                    self.r
                );
                self.r.signal_next();
                self.r.send_now(Msg::send(Local::Empty)).expect("pad");
            }
            assert!(round < 3, "stuck: {:?}", self.r);
        }
    }
}

fuzz_target!(|input: Input| {
    let depth = 1u64 << (1 + input.depth_log % 4);
    let k = 1 + u64::from(input.k) % (depth / 2).max(1);
    let batch = 1 + u64::from(input.batch) % depth;
    let max_inline = [0u32, 16, 28, 44, 64][input.max_inline as usize % 5];
    let mut sim = Box::new(Mlx5Sim::new(128, 64, QPN));
    let mut cfg = SendConfig::new(1, depth as u32, max_inline)
        .signal_every(k as u32)
        .batch(batch as u32)
        .inline_bufs(input.inline_bufs);
    if input.remote {
        cfg = cfg.remote(RemoteBuf::new(REMOTE_ADDR, REMOTE_LEN, 0x99));
    }
    // The simulator's queues as `mlx5dv_init_obj` would describe them (hotverbs-benches'),
    // with this target's SGE limit.
    let sq = DirectSq {
        max_sge: MAX_SGE,
        ..sim_sq(&mut sim, max_inline)
    };
    let cq = sim_cq(&mut sim);
    // SAFETY: the simulator's memory is boxed and outlives the ring and the poller, its
    // only users.
    let (r, p) = unsafe {
        let r = DirectRing::with_doorbell(sq, cfg, None, RecordingDoorbell::new(sq.bf_reg))
            .expect("ring");
        let mut p = DirectPoller::<16>::new(cq).expect("poller");
        p.attach(&sq).expect("attach");
        (r, p)
    };
    let mut w = World {
        sim,
        r,
        p,
        j: Judge {
            depth,
            max_inline: u64::from(max_inline),
            remote: input.remote,
            inline_bufs: input.inline_bufs,
        },
        processed: 0,
        floor: 0,
        leaked: false,
    };
    for op in input.ops.iter().take(64) {
        w.step(op);
    }
    w.drain();
});
