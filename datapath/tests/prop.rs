//! Property test: random operation sequences (stage, batch, flush, send_now, poll, injected
//! post failures and error completions, QP reset) drive a SendRing on the counting device.
//!
//! The checker does not re-implement the ring (no counters or signal schedule of its own):
//! it records what happened to every sequence number, from the ring's answers and the
//! completions the device produced, and checks the outcomes the ring promises:
//! - `stage` hands out consecutive sequence numbers (reusing exactly those a failed post
//!   rejected) and refuses a WR only when `depth` WRs are staged or outstanding
//!   (`WouldBlock`) or the QP failed (`QpError`);
//! - staged WRs are posted when `batch` are staged or the ring becomes full, and a failed
//!   post accepts exactly the WRs before `first_rejected`;
//! - every posted WR is retired exactly once, in order, by a completion of it or of a later
//!   WR, or dropped by a reset; stale completions (from before a reset) retire nothing and
//!   leave the error state alone; the ring's first error is the first error completion;
//! - never more than `depth` WRs staged or outstanding;
//! - no signal period is skipped: among posted WRs, never `signal_every` unsignaled ones in
//!   a row (a wrong rewind of the schedule after a failed post shows up here);
//! - no deadlock: a full ring always has a signaled WR in flight, and polling then
//!   retires something; at the end, padding with messages retires everything posted.

mod common;

use hotverbs_datapath::*;
use hotverbs_ffi::*;
use hotverbs_softnic::counting::CountingDevice;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Stage,
    Batch(u8),
    Flush,
    SendNow,
    Poll,
    FailNextPost(u8),
    FailNextWr,
    ResetQp,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => Just(Op::Stage),
        3 => (1u8..20).prop_map(Op::Batch),
        2 => Just(Op::Flush),
        3 => Just(Op::SendNow),
        4 => Just(Op::Poll),
        1 => (0u8..6).prop_map(Op::FailNextPost),
        1 => Just(Op::FailNextWr),
        1 => Just(Op::ResetQp),
    ]
}

/// What happened to one sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    Staged,
    Posted {
        signaled: bool,
    },
    Retired,
    /// Posted, then forgotten by a reset (never completed as far as the ring knows).
    Dropped,
}

const N: usize = 16;

/// The record of outcomes, indexed by sequence number. Sequence numbers past `life.len()`
/// were never handed out (or were handed back by a failed post or a reset).
struct Checker {
    depth: u64,
    k: u64,
    batch: u64,
    life: Vec<Life>,
    /// The error the ring must report: the first error completion of a live WR since the
    /// last reset.
    error: Option<WcError>,
    /// Injected: the next post rejects the WR at this chain index.
    fail_post: Option<usize>,
    /// Unsignaled WRs posted in a row (since the last signaled one or reset).
    run: u64,
    /// Posted during the current step; their signal flags are read from the ring after it.
    newly_posted: Vec<u64>,
}

impl Checker {
    fn count(&self, f: impl Fn(Life) -> bool) -> u64 {
        self.life.iter().filter(|l| f(**l)).count() as u64
    }
    fn staged(&self) -> u64 {
        self.count(|l| l == Life::Staged)
    }
    fn posted(&self) -> u64 {
        self.count(|l| matches!(l, Life::Posted { .. }))
    }
    fn first_staged(&self) -> u64 {
        self.life
            .iter()
            .position(|l| *l == Life::Staged)
            .unwrap_or(self.life.len()) as u64
    }

    /// The staged WRs up to (excluding) `end` were accepted by the device.
    fn mark_posted(&mut self, end: u64) -> Result<(), TestCaseError> {
        for s in self.first_staged()..end {
            prop_assert_eq!(self.life[s as usize], Life::Staged);
            self.life[s as usize] = Life::Posted { signaled: false };
            self.newly_posted.push(s);
        }
        Ok(())
    }

    /// After a step: reads the signal flag of each WR posted during it (its slot is not
    /// reused before it retires, and nothing retires within a posting step) and checks
    /// that no signal period was skipped.
    fn settle(&mut self, ring: &SendRing<N>) -> Result<(), TestCaseError> {
        for s in core::mem::take(&mut self.newly_posted) {
            let signaled = ring.slot_wr(s).send_flags & IBV_SEND_SIGNALED != 0;
            if let Life::Posted { signaled: f } = &mut self.life[s as usize] {
                *f = signaled;
            }
            self.run = if signaled { 0 } else { self.run + 1 };
            prop_assert!(
                self.run < self.k,
                "{} unsignaled WRs in a row (signal_every {}) up to seq {}",
                self.run,
                self.k,
                s
            );
        }
        Ok(())
    }

    /// A post (of the staged WRs) happened: `r` is its result.
    fn posted_with(&mut self, r: Result<(), SendError>) -> Result<(), TestCaseError> {
        let first = self.first_staged();
        let n = self.life.len() as u64 - first;
        match r {
            Ok(()) => {
                prop_assert!(
                    !matches!(self.fail_post, Some(i) if (i as u64) < n),
                    "an injected rejection inside the chain was not reported"
                );
                self.mark_posted(first + n)
            }
            Err(SendError::Post(e)) => {
                let at = self.fail_post.take();
                prop_assert_eq!(at, Some(e.first_rejected), "{}", e);
                prop_assert!((e.first_rejected as u64) < n);
                prop_assert_eq!(e.first_rejected_seq, first + e.first_rejected as u64);
                self.mark_posted(e.first_rejected_seq)?;
                // The rejected WRs are handed back.
                self.life.truncate(e.first_rejected_seq as usize);
                Ok(())
            }
            Err(e) => Err(TestCaseError::fail(format!("post: {e}"))),
        }
    }

    /// One message through `stage` / `Batch::push` (`send_now`: `then_flush`), with the
    /// ring's count of staged WRs right after it.
    fn staged_with(
        &mut self,
        got: Result<u64, SendError>,
        then_flush: bool,
        ring_staged: u64,
    ) -> Result<(), TestCaseError> {
        let in_flight = self.staged() + self.posted();
        if let Some(e) = self.error {
            prop_assert_eq!(got, Err(SendError::QpError(e)));
            return Ok(());
        }
        if in_flight >= self.depth {
            prop_assert_eq!(got, Err(SendError::WouldBlock));
            return Ok(());
        }
        prop_assert!(in_flight < self.depth);
        let seq = self.life.len() as u64;
        self.life.push(Life::Staged);
        let must_flush = then_flush || self.staged() >= self.batch || in_flight + 1 == self.depth;
        match got {
            Ok(s) => {
                prop_assert_eq!(s, seq, "consecutive sequence numbers");
                if must_flush {
                    self.posted_with(Ok(()))?;
                }
            }
            Err(SendError::Post(e)) => {
                prop_assert!(must_flush, "a post where none was due: {}", e);
                self.posted_with(Err(SendError::Post(e)))?;
            }
            Err(e) => return Err(TestCaseError::fail(format!("stage: {e}"))),
        }
        prop_assert_eq!(ring_staged, self.staged(), "auto-flush at batch or full");
        Ok(())
    }

    /// One completion handed to the ring, with the ring's answer.
    fn completed(
        &mut self,
        c: &Completion,
        got: Result<u64, WcError>,
    ) -> Result<(), TestCaseError> {
        let s = c.seq() as usize;
        match self.life.get(s) {
            Some(Life::Posted { .. }) => {
                let mut n = 0;
                for l in &mut self.life[..=s] {
                    if matches!(l, Life::Posted { .. }) {
                        *l = Life::Retired;
                        n += 1;
                    }
                }
                match c.status() {
                    Ok(()) => prop_assert_eq!(got, Ok(n)),
                    Err(e) => {
                        prop_assert_eq!(got, Err(e));
                        self.error.get_or_insert(e);
                    }
                }
            }
            // Stale (dropped by a reset): ignored, whatever its status.
            Some(Life::Dropped) => prop_assert_eq!(got, Ok(0)),
            other => {
                return Err(TestCaseError::fail(format!(
                    "completion of seq {s} in state {other:?}"
                )))
            }
        }
        Ok(())
    }

    fn poll(
        &mut self,
        ring: &mut SendRing<N>,
        poller: &mut CqPoller<8>,
    ) -> Result<(), TestCaseError> {
        let full = self.error.is_none() && self.staged() + self.posted() == self.depth;
        let before = ring.retired_total();
        for c in common::poll_all(poller) {
            prop_assert_eq!(c.ring(), 1);
            let got = ring.on_completion(&c);
            self.completed(&c, got)?;
        }
        if full {
            prop_assert!(
                ring.retired_total() > before,
                "deadlock: a full ring and polling retires nothing"
            );
        }
        Ok(())
    }

    fn reset(&mut self, got: u64) -> Result<(), TestCaseError> {
        let staged = self.staged();
        let mut dropped = staged;
        self.life.truncate(self.first_staged() as usize);
        for l in &mut self.life {
            if matches!(l, Life::Posted { .. }) {
                *l = Life::Dropped;
                dropped += 1;
            }
        }
        prop_assert_eq!(got, dropped, "reset reports every WR that never completed");
        self.error = None;
        self.run = 0;
        Ok(())
    }

    /// The invariants after every step.
    fn check(&self, ring: &SendRing<N>, dev: &CountingDevice) -> Result<(), TestCaseError> {
        let (staged, posted) = (self.staged(), self.posted());
        prop_assert_eq!(ring.staged(), staged);
        prop_assert_eq!(ring.outstanding(), posted);
        prop_assert!(staged + posted <= self.depth, "over depth");
        prop_assert_eq!(ring.error(), self.error);
        prop_assert_eq!(ring.posted_total(), self.first_staged());
        // Everything below the ring's retired count is retired or dropped; nothing above.
        let r = ring.retired_total() as usize;
        let done_below = self.life[..r]
            .iter()
            .all(|l| matches!(l, Life::Retired | Life::Dropped));
        let live_above = self.life[r..]
            .iter()
            .all(|l| matches!(l, Life::Posted { .. } | Life::Staged));
        prop_assert!(done_below, "retired count ahead of the WRs' fates");
        prop_assert!(live_above, "retired count behind the WRs' fates");
        prop_assert_eq!(
            dev.send_wrs(),
            self.count(|l| l != Life::Staged),
            "the device accepted exactly the posted WRs"
        );
        if self.error.is_none() && staged + posted == self.depth {
            prop_assert_eq!(staged, 0, "a full ring has flushed");
            prop_assert!(
                self.life.contains(&Life::Posted { signaled: true }),
                "full ring without a signaled WR in flight"
            );
        }
        prop_assert_eq!(dev.cq_overflows(), 0);
        Ok(())
    }
}

fn run(depth_log: u32, k_sel: u64, batch: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let depth = 1u64 << depth_log; // 2..=16
                                   // Any period 1..=depth/2, not only divisors of depth: then the WR that fills the ring is
                                   // often off the schedule and must be force-signaled.
    let k = k_sel.clamp(1, (depth / 2).max(1));
    let batch = batch.clamp(1, depth);
    let dev = CountingDevice::new(1 << 12);
    // SAFETY: the device outlives the ring and poller.
    let mut ring: SendRing<N> = unsafe {
        SendRing::new(
            dev.qp(),
            SendConfig::new(1, depth as u32, 16)
                .signal_every(k as u32)
                .batch(batch as u32),
        )
    }
    .unwrap();
    // SAFETY: as above.
    let mut poller: CqPoller<8> = unsafe { CqPoller::new(dev.cq()) };
    let mut m = Checker {
        depth,
        k,
        batch,
        life: Vec::new(),
        error: None,
        fail_post: None,
        run: 0,
        newly_posted: Vec::new(),
    };
    for op in ops {
        match op {
            Op::Stage => {
                // SAFETY: empty message.
                let got = unsafe { ring.stage(Msg::send(Local::Empty)) };
                m.staged_with(got, false, ring.staged())?;
            }
            Op::Batch(n) => {
                let mut b = ring.batch();
                for _ in 0..n {
                    let got = b.push(Msg::send(Local::Inline(b"x")));
                    m.staged_with(got, false, b.staged())?;
                    if got.is_err() {
                        break;
                    }
                }
                m.posted_with(b.finish())?;
            }
            Op::Flush => m.posted_with(ring.flush())?,
            Op::SendNow => {
                let got = ring.send_now(Msg::send(Local::Empty));
                m.staged_with(got, true, ring.staged())?;
            }
            Op::Poll => m.poll(&mut ring, &mut poller)?,
            Op::FailNextPost(i) => {
                dev.fail_next_post(12, i as usize);
                m.fail_post = Some(i as usize);
            }
            Op::FailNextWr => dev.fail_next_wr(IBV_WC_REM_ACCESS_ERR),
            Op::ResetQp => {
                dev.reset_qp();
                // SAFETY: the counting QP went through RESET.
                let got = unsafe { ring.reset() };
                m.reset(got)?;
            }
        }
        m.settle(&ring)?;
        m.check(&ring, &dev)?;
    }
    // Drain: everything posted is retired by completions (padding with messages until a
    // signaled one covers the tail), unless the QP failed.
    if m.error.is_none() && !dev.qp_in_error() {
        m.posted_with(ring.flush())?;
        m.settle(&ring)?;
        for _ in 0..4 * depth {
            m.poll(&mut ring, &mut poller)?;
            m.check(&ring, &dev)?;
            if ring.outstanding() == 0 || m.error.is_some() {
                break;
            }
            let got = ring.send_now(Msg::send(Local::Empty));
            m.staged_with(got, true, ring.staged())?;
            m.settle(&ring)?;
            m.check(&ring, &dev)?;
        }
        if m.error.is_none() {
            prop_assert_eq!(ring.outstanding(), 0, "padding retires everything posted");
            let all_done = m
                .life
                .iter()
                .all(|l| matches!(l, Life::Retired | Life::Dropped));
            prop_assert!(all_done, "a posted WR never retired");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn send_ring_keeps_its_promises(
        depth_log in 1u32..=4,
        k_sel in 1u64..=8,
        batch in 1u64..=16,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run(depth_log, k_sel, batch, ops)?;
    }
}
