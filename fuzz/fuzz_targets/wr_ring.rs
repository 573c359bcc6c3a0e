//! `WrRing` (the `ibv_wr_start` / `ibv_wr_*` / `ibv_wr_complete` send ring) and
//! `ExCqPoller` on the counting device's extended QP and CQ, driven by arbitrary sequences
//! of stage / send_now / batch (finished, dropped or leaked) / flush / poll / refused
//! `ibv_wr_complete`s / error completions / QP reset / `signal_next`, with messages of every
//! kind (inline of any length, empty, WRITE in and out of the remote range, zero-copy READ),
//! compared step by step with a reference model of the ring's accounting.
//!
//! Invariants checked after every step:
//! - every return value equals the model's (sequence numbers, `WouldBlock`, `QpError`,
//!   `InlineTooLong`, `RemoteOutOfRange`, and `Post` naming `ibv_wr_complete` with the
//!   errno the device returned, `first_rejected` 0);
//! - the ring's staged / outstanding / posted counts, first error and region state equal
//!   the model's, and the device accepted exactly the posted WRs (a refused region posts
//!   nothing, `ibv_wr_post(3)`); the device's open region is the ring's;
//! - each completion retires what the model derives from it (stale ones nothing);
//! - a full ring in no error state retires something when polled (no deadlock), and at the
//!   end one signaled message retires everything posted (no idle tail, no WR lost).
//!
//! Planted bug (`--features planted-bug`): the model treats a refused `ibv_wr_complete` like
//! a partially rejected `ibv_post_send` chain, counting the WRs before the device's failure
//! index as posted (the legacy ring's `first_rejected` semantics carried over by mistake).
#![no_main]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use arbitrary::Arbitrary;
use hotverbs_datapath::*;
use hotverbs_ffi::*;
use hotverbs_softnic::counting::{CountingDevice, QP_NUM};
use libfuzzer_sys::fuzz_target;

const RING: u8 = 9;
const MAX_INLINE: usize = 32;
const REMOTE_LEN: u64 = 1024;
const MAX_OPS: usize = 200;

static PAYLOAD: [u8; 64] = [0x5a; 64];

#[derive(Arbitrary, Debug, Clone, Copy)]
enum MsgSpec {
    Inline(u8),
    Empty,
    Write { len: u8, off: u16 },
    Read { off: u16 },
}

#[derive(Arbitrary, Debug)]
enum Op {
    Stage(MsgSpec),
    SendNow(MsgSpec),
    Batch { msgs: Vec<MsgSpec>, end: u8 },
    Flush,
    Poll,
    FailNextComplete { errno: u8, index: u8 },
    FailNextWr,
    ResetQp,
    SignalNext,
}

#[derive(Arbitrary, Debug)]
struct Input {
    depth_log: u8,
    k: u8,
    batch: u8,
    ops: Vec<Op>,
}

struct Model {
    depth: u64,
    batch: u64,
    next: u64,
    posted: u64,
    retired: u64,
    error: Option<WcError>,
    /// The device refuses the next `ibv_wr_complete` with this errno (its index only
    /// matters to the planted bug).
    fail: Option<(i32, usize)>,
}

impl Model {
    /// The answer to a message that fails validation, if it does.
    fn invalid(&self, m: MsgSpec) -> Option<SendError> {
        let e = match m {
            MsgSpec::Inline(n) if n as usize > MAX_INLINE => SendError::InlineTooLong {
                len: n as usize,
                max: MAX_INLINE as u32,
            },
            MsgSpec::Write { len, off } if off as u64 + len as u64 > REMOTE_LEN => {
                SendError::RemoteOutOfRange {
                    offset: off as u64,
                    len: len as u64,
                }
            }
            MsgSpec::Read { off } if off as u64 + 8 > REMOTE_LEN => SendError::RemoteOutOfRange {
                offset: off as u64,
                len: 8,
            },
            _ => return None,
        };
        Some(e)
    }

    fn stage(&mut self, m: MsgSpec, post: bool) -> Result<u64, SendError> {
        // The error state (limit 0) and room are checked before the message itself.
        if let Some(e) = self.error {
            return Err(SendError::QpError(e));
        }
        if self.next - self.retired >= self.depth {
            return Err(SendError::WouldBlock);
        }
        if let Some(e) = self.invalid(m) {
            return Err(e);
        }
        let seq = self.next;
        self.next += 1;
        let full = self.next - self.retired == self.depth;
        if post || full || self.next - self.posted >= self.batch {
            self.complete().map(|()| seq)
        } else {
            Ok(seq)
        }
    }

    fn complete(&mut self) -> Result<(), SendError> {
        if self.next == self.posted {
            return Ok(());
        }
        if let Some((errno, index)) = self.fail.take() {
            let first = self.posted;
            if cfg!(feature = "planted-bug") {
                self.posted = (self.posted + index as u64).min(self.next);
            }
            self.next = self.posted;
            return Err(SendError::Post(PostError {
                verb: "ibv_wr_complete",
                errno,
                first_rejected: 0,
                first_rejected_seq: first,
            }));
        }
        self.posted = self.next;
        Ok(())
    }

    fn completed(&mut self, c: &Completion) -> u64 {
        if c.ring() != RING || c.qp_num() != QP_NUM {
            return 0;
        }
        let Some(s) = (self.retired..self.posted).find(|s| s & wr_id::SEQ_MASK == c.seq()) else {
            return 0;
        };
        let n = s + 1 - self.retired;
        self.retired = s + 1;
        if let Err(e) = c.status() {
            self.error.get_or_insert(e);
        }
        n
    }
}

struct Rig {
    dev: std::pin::Pin<Box<CountingDevice>>,
    local: Box<[u8; 4096]>,
}

fn msg(m: MsgSpec, local: &Rig) -> Msg<'static> {
    match m {
        MsgSpec::Inline(n) => Msg::send(Local::Inline(&PAYLOAD[..(n as usize).min(64)])),
        MsgSpec::Empty => Msg::send(Local::Empty),
        MsgSpec::Write { len, off } => Msg::write(
            Local::Inline(&PAYLOAD[..(len as usize).min(64)]),
            off as u64,
        ),
        MsgSpec::Read { off } => {
            Msg::read(LocalBuf::new(local.local.as_ptr() as u64, 8, 1), off as u64)
        }
    }
}

/// Clamps an arbitrary spec into the payload's range (`Inline` up to 64: some too long).
fn clamp(m: MsgSpec) -> MsgSpec {
    match m {
        MsgSpec::Inline(n) => MsgSpec::Inline(n % 65),
        MsgSpec::Write { len, off } => MsgSpec::Write {
            len: len % (MAX_INLINE as u8 + 1),
            off: off % 1100,
        },
        MsgSpec::Read { off } => MsgSpec::Read { off: off % 1100 },
        e => e,
    }
}

fn poll(p: &mut ExCqPoller<8>, r: &mut WrRing, m: &mut Model) -> u64 {
    let mut total = 0;
    loop {
        let cs = p.poll().expect("the counting device's polls never fail");
        if cs.is_empty() {
            return total;
        }
        for c in cs.iter() {
            let n = m.completed(c);
            match r.on_completion(c) {
                Ok(k) => assert_eq!(k, n, "retired by {c:?}"),
                Err(e) => {
                    assert_eq!(Err(e), c.status());
                    assert!(n > 0, "error of a stale WR taken: {c:?}");
                }
            }
            total += n;
        }
    }
}

fn check(m: &Model, r: &WrRing, dev: &CountingDevice, step: usize) {
    assert_eq!(r.staged(), m.next - m.posted, "step {step}: staged");
    assert_eq!(
        r.outstanding(),
        m.posted - m.retired,
        "step {step}: outstanding"
    );
    assert_eq!(
        dev.send_wrs(),
        m.posted,
        "step {step}: accepted by the device"
    );
    assert_eq!(r.error(), m.error, "step {step}: error");
    assert!(m.next - m.retired <= m.depth);
    assert_eq!(r.region_open(), m.next > m.posted, "step {step}: region");
    assert_eq!(
        dev.wr_region_open(),
        r.region_open(),
        "step {step}: device region"
    );
}

fuzz_target!(|input: Input| {
    let depth_log = 1 + input.depth_log as u32 % 5;
    let depth = 1u64 << depth_log;
    let k = 1 + input.k as u64 % (depth / 2).max(1);
    let batch = 1 + input.batch as u64 % depth;
    let rig = Rig {
        dev: CountingDevice::new(1024),
        local: Box::new([0; 4096]),
    };
    let remote = RemoteBuf::new(0x10_0000, REMOTE_LEN, 77);
    // SAFETY: the device outlives the ring and the poller (declared after it, dropped
    // first); nothing else uses its extended QP and CQ; the READ destination is `local`,
    // which the counting device never touches.
    let (mut r, mut p) = unsafe {
        (
            WrRing::new(
                rig.dev.qp_ex(),
                SendConfig::new(RING, depth as u32, MAX_INLINE as u32)
                    .signal_every(k as u32)
                    .batch(batch as u32)
                    .remote(remote),
            )
            .unwrap(),
            ExCqPoller::<8>::new(
                rig.dev.cq_ex(),
                ExFields::QP_NUM | ExFields::OPCODE,
                IBV_WC_EX_WITH_QP_NUM as u64,
            )
            .unwrap(),
        )
    };
    let mut m = Model {
        depth,
        batch,
        next: 0,
        posted: 0,
        retired: 0,
        error: None,
        fail: None,
    };
    let dev: &CountingDevice = &rig.dev;
    for (step, op) in input.ops.into_iter().take(MAX_OPS).enumerate() {
        match op {
            Op::Stage(s) => {
                let s = clamp(s);
                let want = m.stage(s, false);
                // SAFETY: inline payloads are static; the READ destination outlives the
                // ring and the device never writes it.
                let got = unsafe { r.stage(msg(s, &rig)) };
                assert_eq!(got, want, "step {step}: stage {s:?}");
            }
            Op::SendNow(s) => {
                let s = clamp(s);
                let got = r.send_now(msg(s, &rig));
                if matches!(s, MsgSpec::Read { .. }) {
                    assert_eq!(got, Err(SendError::NotInline));
                } else {
                    let want = m.stage(s, true);
                    assert_eq!(got, want, "step {step}: send_now {s:?}");
                }
            }
            Op::Batch { msgs, end } => {
                let mut b = r.batch();
                for s in msgs.into_iter().take(40).map(clamp) {
                    let got = b.push(msg(s, &rig));
                    if matches!(s, MsgSpec::Read { .. }) {
                        assert_eq!(got, Err(SendError::NotInline));
                        continue;
                    }
                    let want = m.stage(s, false);
                    assert_eq!(got, want, "step {step}: push {s:?}");
                }
                match end % 3 {
                    0 => {
                        let want = m.complete();
                        assert_eq!(b.finish(), want, "step {step}: finish");
                    }
                    1 => {
                        // Dropped: posts; a refusal is reported by the next flush.
                        let want = m.complete();
                        drop(b);
                        if let Err(e) = want {
                            assert_eq!(r.flush(), Err(e), "step {step}: deferred");
                        }
                    }
                    _ => {
                        // Leaked: the ring aborts its region at the next call.
                        core::mem::forget(b);
                        m.next = m.posted;
                        let want = m.complete();
                        assert_eq!(r.flush(), want, "step {step}: after a leaked batch");
                    }
                }
            }
            Op::Flush => {
                let want = m.complete();
                assert_eq!(r.flush(), want, "step {step}: flush");
            }
            Op::Poll => {
                poll(&mut p, &mut r, &mut m);
            }
            Op::FailNextComplete { errno, index } => {
                let errno = 1 + errno as i32 % 120;
                dev.fail_next_post(errno, index as usize);
                m.fail = Some((errno, index as usize));
            }
            Op::FailNextWr => dev.fail_next_wr(IBV_WC_REM_ACCESS_ERR),
            Op::ResetQp => {
                dev.reset_qp();
                // SAFETY: the counting device's reset drops every WR of the QP.
                let dropped = unsafe { r.reset() };
                assert_eq!(dropped, m.next - m.retired, "step {step}: dropped by reset");
                m.next = m.posted;
                m.retired = m.posted;
                m.error = None;
            }
            Op::SignalNext => r.signal_next(),
        }
        check(&m, &r, dev, step);
        if m.error.is_none() && r.staged() == 0 && r.outstanding() == depth {
            assert!(
                poll(&mut p, &mut r, &mut m) > 0,
                "step {step}: full ring without a signaled WR in flight"
            );
            check(&m, &r, dev, step);
        }
    }
    poll(&mut p, &mut r, &mut m);
    if m.error.is_none() {
        for _ in 0..3 {
            r.signal_next();
            let want = m.stage(MsgSpec::Empty, true);
            let got = r.send_now(Msg::send(Local::Empty));
            assert_eq!(got, want, "final send_now");
            poll(&mut p, &mut r, &mut m);
            if got.is_ok() {
                break;
            }
        }
        assert_eq!(r.outstanding(), 0, "idle tail: {r:?}");
    }
    drop(r);
});
