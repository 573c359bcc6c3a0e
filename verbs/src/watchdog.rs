//! [`Watchdog`]: a deadline on a ring's progress, with the standard clock.

use std::time::{Duration, Instant};

use hotverbs_datapath::{Progress, StallWatch};

use crate::{Error, Result};

/// Puts a deadline on a ring's progress: [`check`](Self::check) fails with `ETIMEDOUT`
/// once the ring has had work outstanding and retired nothing for longer than the limit.
/// A slow ring (completions arriving, however late) and an idle ring never trip it.
///
/// This is how a stuck ring is told apart from a slow one when a completion never comes:
/// rxe drops completions silently when a CQ overflows (fault-truth S15; rings built
/// through [`Qp::send_ring`](crate::Qp::send_ring) reserve their CQ capacity, so only raw
/// rings can get there), retries a dead peer for ever with `retry_cnt` 7 (S22), and holds
/// receives posted in ERR (G9). The recovery is the same for all three: move the QP to ERR
/// (the device flushes what it holds, which retires it), then RESET and reset the rings.
///
/// The datapath has no clock; [`hotverbs_datapath::StallWatch`] is the same check with a
/// caller-supplied one (TSC ticks, poll iterations).
///
/// ```
/// use std::time::Duration;
/// use hotverbs::{datapath::Progress, Watchdog};
///
/// let mut dog = Watchdog::new(Duration::from_secs(5));
/// // Idle or progressing rings pass.
/// dog.check(Progress { retired: 0, outstanding: 0 }).unwrap();
/// dog.check(Progress { retired: 3, outstanding: 1 }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Watchdog {
    watch: StallWatch,
    limit: Duration,
    epoch: Instant,
}

impl Watchdog {
    /// A watchdog that trips after `limit` without progress.
    pub fn new(limit: Duration) -> Self {
        Watchdog {
            watch: StallWatch::new(),
            limit,
            epoch: Instant::now(),
        }
    }

    /// How long the ring has had work outstanding with nothing retired, as of now.
    pub fn age(&mut self, p: Progress) -> Duration {
        Duration::from_nanos(self.watch.observe(p, self.now()))
    }

    /// `Ok` while the ring is idle or progressing; `ETIMEDOUT` (verb "ring progress") once it
    /// has had work outstanding and retired nothing for longer than the limit.
    pub fn check(&mut self, p: Progress) -> Result<()> {
        let age = self.age(p);
        if age > self.limit {
            return Err(
                Error::new("ring progress", libc::ETIMEDOUT).with_hint(format!(
                    "{} WRs outstanding and none retired for {:?} (limit {:?}): a completion \
                 was lost or never comes — a CQ overflow (rxe drops completions silently), a \
                 dead peer with retry_cnt 7, or receives posted in ERR; move the QP to ERR to \
                 flush what the device holds, then RESET and reset the rings",
                    p.outstanding, age, self.limit
                )),
            );
        }
        Ok(())
    }

    /// Forgets the current wait (after a recovery).
    pub fn clear(&mut self) {
        self.watch.clear();
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stuck_ring_trips_with_etimedout_and_a_hint() {
        let mut dog = Watchdog::new(Duration::ZERO);
        let stuck = Progress {
            retired: 4,
            outstanding: 2,
        };
        dog.check(stuck).unwrap(); // starts the wait
        std::thread::sleep(Duration::from_millis(1)); // any elapsed time exceeds ZERO
        let e = dog.check(stuck).unwrap_err();
        assert_eq!((e.verb(), e.errno()), ("ring progress", libc::ETIMEDOUT));
        assert!(e.to_string().contains("2 WRs outstanding"), "{e}");
        // Progress clears it.
        dog.check(Progress {
            retired: 5,
            outstanding: 1,
        })
        .unwrap();
        dog.clear();
        dog.check(Progress {
            retired: 5,
            outstanding: 1,
        })
        .unwrap();
    }
}
