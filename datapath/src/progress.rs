//! Telling a stuck ring from a slow one.
//!
//! A ring waits on completions, and some faults mean a completion never comes: rxe drops
//! CQEs silently when a CQ overflows (fault-truth S15), retries a dead peer for ever with
//! `retry_cnt` 7 (S22), and holds receives posted in ERR without flushing them (G9). The
//! ring cannot know by itself — the datapath has no clock — so it reports its
//! [`Progress`] (how many WRs it has retired in total, how many are outstanding) and a
//! [`StallWatch`] turns snapshots of it, stamped with any monotonic clock the caller has
//! (nanoseconds, TSC ticks, or poll iterations in a deterministic test), into an *age*:
//! how long work has been outstanding with nothing retired. The caller puts a deadline on
//! the age ([`StallWatch::check`]); `hotverbs::Watchdog` does this with `Instant`.
//!
//! A slow ring makes progress (its retired count moves), so its age keeps going back to 0;
//! an idle ring (nothing outstanding) has age 0; only a ring with work outstanding and no
//! retirement for the whole deadline is reported as [`Stalled`]. Typical recovery: move
//! the QP to ERR (which flushes everything the device still holds, retiring it), then
//! RESET and the rings' `reset`.
//!
//! ```
//! use hotverbs_datapath::{Progress, StallWatch};
//!
//! let mut w = StallWatch::new();
//! // t=0: 4 outstanding. t=10: one retired (progress). t=50: still 3 outstanding.
//! assert_eq!(w.observe(Progress { retired: 0, outstanding: 4 }, 0), 0);
//! assert_eq!(w.observe(Progress { retired: 1, outstanding: 3 }, 10), 0);
//! assert_eq!(w.observe(Progress { retired: 1, outstanding: 3 }, 50), 40);
//! let stalled = w.check(Progress { retired: 1, outstanding: 3 }, 120, 100).unwrap_err();
//! assert_eq!((stalled.outstanding, stalled.age), (3, 110));
//! ```

use core::fmt;

/// A ring's progress counters: a snapshot for [`StallWatch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Progress {
    /// Work requests retired since the ring was made (monotonic; a reset counts what it
    /// discarded as retired).
    pub retired: u64,
    /// Work requests the device holds and the ring waits on.
    pub outstanding: u64,
}

/// Watches a ring's [`Progress`] over time; see the [module docs](self).
#[derive(Clone, Copy, Debug, Default)]
pub struct StallWatch {
    /// `retired` at the last change.
    retired: u64,
    /// When the current wait began (the last progress, or the first snapshot with work
    /// outstanding), if one is under way.
    since: Option<u64>,
}

/// A ring with work outstanding and nothing retired for longer than the caller's deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stalled {
    /// WRs outstanding when the stall was detected.
    pub outstanding: u64,
    /// The ring's total retired count (unchanged for `age`).
    pub retired: u64,
    /// How long nothing was retired, in the caller's clock units.
    pub age: u64,
}

impl fmt::Display for Stalled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ring stalled: {} WRs outstanding and none retired for {} clock units; a \
             completion was lost (CQ overflow: rxe drops CQEs silently) or never comes (a \
             dead peer with retry_cnt 7, receives posted in ERR): move the QP to ERR to \
             flush what the device holds, then RESET and reset the ring",
            self.outstanding, self.age
        )
    }
}

impl StallWatch {
    /// A watch that has seen nothing yet.
    pub const fn new() -> Self {
        StallWatch {
            retired: 0,
            since: None,
        }
    }

    /// Feeds a snapshot taken at `now` and returns the ring's age: how long (in `now`'s
    /// units) it has had work outstanding with nothing retired; 0 when it is idle or has
    /// just made progress. `now` must not go backwards (a smaller `now` counts as no time).
    pub fn observe(&mut self, p: Progress, now: u64) -> u64 {
        if p.outstanding == 0 {
            self.retired = p.retired;
            self.since = None;
            return 0;
        }
        match self.since {
            Some(since) if p.retired == self.retired => now.saturating_sub(since),
            _ => {
                self.retired = p.retired;
                self.since = Some(now);
                0
            }
        }
    }

    /// [`observe`](Self::observe), then [`Stalled`] if the age exceeds `limit`.
    pub fn check(&mut self, p: Progress, now: u64, limit: u64) -> Result<(), Stalled> {
        let age = self.observe(p, now);
        if age > limit {
            Err(Stalled {
                outstanding: p.outstanding,
                retired: p.retired,
                age,
            })
        } else {
            Ok(())
        }
    }

    /// Forgets the current wait (after a recovery).
    pub fn clear(&mut self) {
        self.since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(retired: u64, outstanding: u64) -> Progress {
        Progress {
            retired,
            outstanding,
        }
    }

    #[test]
    fn idle_ring_never_stalls() {
        let mut w = StallWatch::new();
        for t in 0..1000 {
            assert_eq!(w.check(p(5, 0), t * 1000, 1), Ok(()));
        }
    }

    #[test]
    fn slow_ring_is_not_stuck() {
        let mut w = StallWatch::new();
        // One retirement every 90 units under a limit of 100: never stalled.
        for i in 0..100u64 {
            assert_eq!(w.check(p(i, 10), i * 90, 100), Ok(()));
        }
    }

    #[test]
    fn stuck_ring_is_reported_with_its_age() {
        let mut w = StallWatch::new();
        assert_eq!(w.observe(p(7, 2), 1000), 0);
        assert_eq!(w.check(p(7, 2), 1100, 100), Ok(()));
        let s = w.check(p(7, 2), 1101, 100).unwrap_err();
        assert_eq!(
            s,
            Stalled {
                outstanding: 2,
                retired: 7,
                age: 101
            }
        );
        // Progress resets the age; so does going idle.
        assert_eq!(w.observe(p(8, 1), 5000), 0);
        assert_eq!(w.observe(p(8, 1), 5050), 50);
        assert_eq!(w.observe(p(9, 0), 6000), 0);
        assert_eq!(w.observe(p(9, 3), 7000), 0);
        assert_eq!(w.observe(p(9, 3), 7001), 1);
        w.clear();
        assert_eq!(w.observe(p(9, 3), 9000), 0);
    }

    #[test]
    fn clock_going_backwards_is_no_time() {
        let mut w = StallWatch::new();
        w.observe(p(0, 1), 100);
        assert_eq!(w.observe(p(0, 1), 50), 0);
    }
}
