//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod mlx5;
pub mod nic;

use hotverbs_datapath::{Completion, CqPoller, SendRing, WcError};

/// Polls until the CQ is empty, feeding send completions of `ring` to it; returns
/// (completions seen, WRs retired, errors seen).
pub fn drain_send<const N: usize, const B: usize>(
    poller: &mut CqPoller<B>,
    ring: &mut SendRing<N>,
) -> (usize, u64, Vec<WcError>) {
    let mut seen = 0;
    let mut retired = 0;
    let mut errors = Vec::new();
    loop {
        let batch = poller.poll().expect("poll_cq");
        if batch.is_empty() {
            return (seen, retired, errors);
        }
        for c in batch {
            assert_eq!(c.ring(), ring.ring_id(), "foreign completion {c:?}");
            seen += 1;
            match ring.on_completion(c) {
                Ok(n) => retired += n,
                Err(e) => errors.push(e),
            }
        }
    }
}

/// Copies the completions out (tests that need both the poller and the rings mutably).
pub fn poll_all<const B: usize>(poller: &mut CqPoller<B>) -> Vec<Completion> {
    let mut v = Vec::new();
    loop {
        let b = poller.poll().expect("poll_cq");
        if b.is_empty() {
            return v;
        }
        v.extend(b.iter().map(dup));
    }
}

/// A copy of a polled completion, for tests that collect them before handing them out.
pub fn dup(c: &Completion) -> Completion {
    // SAFETY: `c` came from ibv_poll_cq; the tests give each copy to a ring once (the
    // original stays in the poller's buffer, which they do not hand out).
    unsafe { Completion::from_raw(*c.as_raw()) }
}
