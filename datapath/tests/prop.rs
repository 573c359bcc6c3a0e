//! Property test: random operation sequences (stage, batch, flush, send_now, poll, injected
//! post failures and error completions, QP reset) drive a SendRing on the counting device
//! and, step by step, a simple reference model of the ring and the device. After every step
//! the ring's counters must equal the model's and the invariants must hold: outstanding <=
//! depth, a full ring always has a signaled WR in flight, and every WR is either staged,
//! outstanding, retired or reported dropped (no slot leaks).

mod common;

use std::collections::VecDeque;

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

/// The reference: plain counters and a model of the counting device's CQ.
struct Model {
    depth: u64,
    k: u64,
    batch: u64,
    staged: u64,
    posted: u64,
    retired: u64,
    next_signal: u64,
    error: Option<WcError>,
    /// Staged WRs' signal bits (index = seq - posted).
    staged_signaled: VecDeque<bool>,
    // Device.
    cq: VecDeque<(u64, Option<WcError>)>,
    dev_error: bool,
    fail_post: Option<usize>,
    fail_wr: bool,
    accepted: u64,
    dropped_by_reset: u64,
    dropped_by_post: u64,
}

impl Model {
    fn limit(&self) -> u64 {
        if self.error.is_some() {
            0
        } else {
            self.depth
        }
    }

    /// Returns the expected result of staging one empty SEND.
    fn stage(&mut self) -> Result<u64, SendError> {
        if self.staged - self.retired >= self.limit() {
            return Err(match self.error {
                Some(e) => SendError::QpError(e),
                None => SendError::WouldBlock,
            });
        }
        let seq = self.staged;
        let full = seq + 1 - self.retired == self.limit();
        let sig = if seq == self.next_signal {
            self.next_signal += self.k;
            true
        } else {
            full
        };
        self.staged_signaled.push_back(sig);
        self.staged += 1;
        if full || self.staged - self.posted >= self.batch {
            self.flush()?;
        }
        Ok(seq)
    }

    fn flush(&mut self) -> Result<(), SendError> {
        let n = (self.staged - self.posted) as usize;
        if n == 0 {
            return Ok(());
        }
        let mut accept = n;
        if let Some(i) = self.fail_post {
            if i < n {
                accept = i;
                self.fail_post = None;
            }
        }
        for j in 0..accept {
            let seq = self.posted + j as u64;
            let sig = self.staged_signaled[j];
            if self.dev_error {
                self.cq.push_back((seq, Some(WcError::WrFlush)));
            } else if self.fail_wr {
                self.fail_wr = false;
                self.cq.push_back((seq, Some(WcError::RemAccess)));
                self.dev_error = true;
            } else if sig {
                self.cq.push_back((seq, None));
            }
        }
        self.accepted += accept as u64;
        self.staged_signaled.drain(..);
        self.posted += accept as u64;
        if accept < n {
            self.dropped_by_post += (n - accept) as u64;
            self.staged = self.posted;
            while self.next_signal >= self.k && self.next_signal - self.k >= self.staged {
                self.next_signal -= self.k;
            }
            return Err(SendError::Post(PostError {
                verb: "ibv_post_send",
                errno: 12,
                first_rejected: accept,
                first_rejected_seq: self.posted,
            }));
        }
        Ok(())
    }

    fn poll(&mut self) {
        while let Some((seq, status)) = self.cq.pop_front() {
            // Stale completions (before a reset) are ignored entirely.
            if seq >= self.retired && seq < self.posted {
                self.retired = seq + 1;
                if self.error.is_none() {
                    self.error = status;
                }
            }
        }
    }

    fn reset(&mut self) -> u64 {
        let dropped = self.staged - self.retired;
        self.dropped_by_reset += dropped;
        self.staged_signaled.clear();
        self.staged = self.posted;
        self.retired = self.posted;
        self.error = None;
        self.next_signal = self.posted + self.k - 1;
        self.dev_error = false;
        dropped
    }
}

fn run(depth_log: u32, k_sel: u64, batch: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    const N: usize = 16;
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
    let mut m = Model {
        depth,
        k,
        batch,
        staged: 0,
        posted: 0,
        retired: 0,
        next_signal: k - 1,
        error: None,
        staged_signaled: VecDeque::new(),
        cq: VecDeque::new(),
        dev_error: false,
        fail_post: None,
        fail_wr: false,
        accepted: 0,
        dropped_by_reset: 0,
        dropped_by_post: 0,
    };
    for op in ops {
        match op {
            Op::Stage => {
                // SAFETY: empty message.
                let got = unsafe { ring.stage(Msg::send(Local::Empty)) };
                prop_assert_eq!(got, m.stage(), "stage");
            }
            Op::Batch(n) => {
                let mut b = ring.batch();
                for _ in 0..n {
                    let got = b.push(Msg::send(Local::Inline(b"x")));
                    let want = m.stage();
                    prop_assert_eq!(got, want, "batch push");
                    if got.is_err() {
                        break;
                    }
                }
                prop_assert_eq!(b.finish(), m.flush(), "batch finish");
            }
            Op::Flush => prop_assert_eq!(ring.flush(), m.flush(), "flush"),
            Op::SendNow => {
                let got = ring.send_now(Msg::send(Local::Empty));
                let want = m.stage().and_then(|s| m.flush().map(|_| s));
                prop_assert_eq!(got, want, "send_now");
            }
            Op::Poll => {
                for c in common::poll_all(&mut poller) {
                    let _ = ring.on_completion(&c);
                }
                m.poll();
            }
            Op::FailNextPost(i) => {
                dev.fail_next_post(12, i as usize);
                m.fail_post = Some(i as usize);
            }
            Op::FailNextWr => {
                dev.fail_next_wr(IBV_WC_REM_ACCESS_ERR);
                m.fail_wr = true;
            }
            Op::ResetQp => {
                dev.reset_qp();
                prop_assert_eq!(ring.reset(), m.reset(), "reset");
            }
        }
        // Counters equal the model's.
        prop_assert_eq!(ring.posted_total(), m.posted);
        prop_assert_eq!(ring.retired_total(), m.retired);
        prop_assert_eq!(ring.staged(), m.staged - m.posted);
        prop_assert_eq!(ring.error(), m.error);
        prop_assert_eq!(dev.send_wrs(), m.accepted);
        // Invariants.
        prop_assert!(ring.outstanding() + ring.staged() <= depth);
        if ring.error().is_none() && ring.free() == 0 {
            prop_assert!(
                ring.signaled_in_flight(),
                "full ring without a signaled WR in flight"
            );
            prop_assert_eq!(ring.staged(), 0, "a full ring has flushed");
        }
        prop_assert_eq!(dev.cq_overflows(), 0);
    }
    // Drain: everything posted is retired by completions or was dropped by a reset.
    if m.error.is_none() && !dev.qp_in_error() {
        ring.flush().ok();
        m.flush().ok();
        // Pad with empty messages until the last one is signaled, then everything retires.
        while ring.outstanding() > 0 {
            for c in common::poll_all(&mut poller) {
                let _ = ring.on_completion(&c);
            }
            m.poll();
            if ring.outstanding() > 0 {
                if ring.error().is_some() {
                    break;
                }
                let _ = ring.send_now(Msg::send(Local::Empty));
                let _ = m.stage().and_then(|_| m.flush());
            }
        }
        prop_assert_eq!(ring.retired_total(), m.retired);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn send_ring_matches_model(
        depth_log in 1u32..=4,
        k_sel in 1u64..=8,
        batch in 1u64..=16,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run(depth_log, k_sel, batch, ops)?;
    }
}
