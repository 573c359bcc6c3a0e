//! Property test: random operation sequences (stage, batch, flush, send_now, poll, a failed
//! `ibv_wr_complete`, error completions, QP reset) drive a [`WrRing`] on the counting
//! device's extended QP, against a reference model of what the ring promises.
//!
//! The model keeps the accounting the API defines (`next` sequence, `posted`, `retired`,
//! the first error) and derives retirement from the completions the device actually
//! produced, not from a copy of the ring's signal schedule. After every operation:
//! - the ring's answer is the model's (consecutive sequence numbers; `WouldBlock` exactly
//!   when `depth` WRs are staged or outstanding; `QpError` exactly after an error completion;
//!   `Post` naming `ibv_wr_complete` exactly when the device refused the region, which then
//!   drops the whole region);
//! - `staged`, `outstanding`, the device's accepted-WR count and the first error agree;
//! - staged WRs are posted when `batch` are staged or the ring fills;
//! - no deadlock: a full ring (not in error) retires something when polled, and at the end
//!   one signaled message retires everything posted.

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
    FailNextComplete,
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
        1 => Just(Op::FailNextComplete),
        1 => Just(Op::FailNextWr),
        1 => Just(Op::ResetQp),
    ]
}

const RING: u8 = 5;

struct Model {
    depth: u64,
    batch: u64,
    next: u64,
    posted: u64,
    retired: u64,
    error: Option<WcError>,
    /// The device refuses the next `ibv_wr_complete`.
    fail_pending: bool,
}

impl Model {
    /// Expected answer to staging one message; updates the model. `post`: send_now.
    fn stage(&mut self, post: bool) -> Result<u64, SendError> {
        if let Some(e) = self.error {
            return Err(SendError::QpError(e));
        }
        if self.next - self.retired >= self.depth {
            return Err(SendError::WouldBlock);
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

    /// Expected answer to a flush.
    fn complete(&mut self) -> Result<(), SendError> {
        if self.next == self.posted {
            return Ok(());
        }
        if self.fail_pending {
            self.fail_pending = false;
            let first = self.posted;
            self.next = self.posted;
            return Err(SendError::Post(PostError {
                verb: "ibv_wr_complete",
                errno: 12,
                first_rejected: 0,
                first_rejected_seq: first,
            }));
        }
        self.posted = self.next;
        Ok(())
    }

    /// A completion the device produced: the full sequence it retires up to, if it is for an
    /// outstanding WR (else stale).
    fn completed(&mut self, c: &Completion) {
        if c.ring() != RING || c.qp_num() != hotverbs_softnic::counting::QP_NUM {
            return;
        }
        let Some(s) = (self.retired..self.posted).find(|s| s & wr_id::SEQ_MASK == c.seq()) else {
            return;
        };
        self.retired = s + 1;
        if let Err(e) = c.status() {
            self.error.get_or_insert(e);
        }
    }
}

fn check(m: &Model, r: &WrRing, dev: &CountingDevice) -> Result<(), TestCaseError> {
    prop_assert_eq!(r.staged(), m.next - m.posted, "staged");
    prop_assert_eq!(r.outstanding(), m.posted - m.retired, "outstanding");
    prop_assert_eq!(r.posted_total(), m.posted);
    prop_assert_eq!(
        dev.send_wrs(),
        m.posted,
        "the device accepted exactly the posted WRs"
    );
    prop_assert_eq!(r.error(), m.error);
    prop_assert!(m.next - m.retired <= m.depth);
    prop_assert_eq!(r.region_open(), m.next > m.posted);
    prop_assert_eq!(dev.wr_region_open(), m.next > m.posted);
    Ok(())
}

/// Drains the CQ through the model and the ring; returns how many WRs the ring retired.
fn poll(p: &mut ExCqPoller<8>, r: &mut WrRing, m: &mut Model) -> Result<u64, TestCaseError> {
    let mut retired = 0;
    loop {
        let cs = p.poll().unwrap();
        if cs.is_empty() {
            return Ok(retired);
        }
        for c in cs.iter() {
            let before = m.retired;
            m.completed(c);
            let got = r.on_completion(c);
            let n = m.retired - before;
            match got {
                Ok(k) => prop_assert_eq!(k, n),
                Err(e) => {
                    prop_assert_eq!(Err(e), c.status());
                    prop_assert!(n > 0, "an error of a stale WR must be ignored");
                }
            }
            retired += n;
        }
    }
}

fn run(depth_log: u32, k_sel: u64, batch_sel: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let depth = 1u64 << depth_log;
    let k = 1 + k_sel % (depth / 2).max(1);
    let batch = 1 + batch_sel % depth;
    let dev = CountingDevice::new(4096);
    // SAFETY: the device outlives the ring and poller; nothing else uses its extended QP/CQ.
    let (mut r, mut p) = unsafe {
        (
            WrRing::new(
                dev.qp_ex(),
                SendConfig::new(RING, depth as u32, 16)
                    .signal_every(k as u32)
                    .batch(batch as u32),
            )
            .unwrap(),
            ExCqPoller::<8>::new(dev.cq_ex(), ExFields::QP_NUM, IBV_WC_EX_WITH_QP_NUM as u64)
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
        fail_pending: false,
    };
    let d = [1u8; 8];
    for op in ops {
        match op {
            Op::Stage => {
                let want = m.stage(false);
                // SAFETY: inline bytes, copied during the call.
                let got = unsafe { r.stage(Msg::send(Local::Inline(&d))) };
                prop_assert_eq!(got, want);
            }
            Op::SendNow => {
                let want = m.stage(true);
                prop_assert_eq!(r.send_now(Msg::send(Local::Inline(&d))), want);
            }
            Op::Batch(n) => {
                let mut b = r.batch();
                for _ in 0..n {
                    let want = m.stage(false);
                    prop_assert_eq!(b.push(Msg::send(Local::Inline(&d))), want);
                }
                let want = m.complete();
                prop_assert_eq!(b.finish(), want);
            }
            Op::Flush => {
                let want = m.complete();
                prop_assert_eq!(r.flush(), want);
            }
            Op::Poll => {
                poll(&mut p, &mut r, &mut m)?;
            }
            Op::FailNextComplete => {
                dev.fail_next_post(12, 0);
                m.fail_pending = true;
            }
            Op::FailNextWr => dev.fail_next_wr(IBV_WC_REM_ACCESS_ERR),
            Op::ResetQp => {
                dev.reset_qp();
                // SAFETY: the counting device's reset drops every WR; none is in use.
                let dropped = unsafe { r.reset() };
                prop_assert_eq!(dropped, m.next - m.retired);
                m.next = m.posted;
                m.retired = m.posted;
                m.error = None;
            }
        }
        check(&m, &r, &dev)?;
        if r.outstanding() + r.staged() == depth && m.error.is_none() && r.staged() == 0 {
            // Full: a signaled WR is in flight, so polling retires something.
            prop_assert!(poll(&mut p, &mut r, &mut m)? > 0, "deadlock: full ring");
            check(&m, &r, &dev)?;
        }
    }
    // The end: drain, then one signaled message retires everything (unless in error).
    poll(&mut p, &mut r, &mut m)?;
    if m.error.is_none() {
        for _ in 0..3 {
            // Again after a refused region: it dropped the WR signal_next had marked.
            r.signal_next();
            let want = m.stage(true);
            let got = r.send_now(Msg::send(Local::Inline(&d)));
            prop_assert_eq!(got, want);
            poll(&mut p, &mut r, &mut m)?;
            check(&m, &r, &dev)?;
            if got.is_ok() {
                break;
            }
        }
        prop_assert_eq!(r.outstanding(), 0, "an idle tail: {:?}", r);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn wr_ring_keeps_its_promises(
        depth_log in 1u32..6,
        k_sel in 0u64..64,
        batch_sel in 0u64..64,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run(depth_log, k_sel, batch_sel, ops)?;
    }
}
