//! Measurements: latency samples in an HDR histogram (percentiles without keeping every
//! sample), bandwidth from bytes, messages and elapsed time, and how evenly `-q` QPs shared
//! it.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Latency samples of one message size.
///
/// Samples are recorded in nanoseconds as measured (a full round trip for ping-pong tests)
/// and scaled on report (`scale` 0.5 turns a round trip into perftest's half round trip),
/// so halving loses no resolution.
pub struct Latency {
    hist: Histogram<u64>,
    scale: f64,
}

impl Latency {
    /// An empty record; `half_round_trip` reports every sample halved.
    pub fn new(half_round_trip: bool) -> Self {
        // 1 ns .. 1 hour at 3 significant figures: every latency a network can produce.
        let hist = Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
            .expect("static histogram bounds are valid");
        Latency {
            hist,
            scale: if half_round_trip { 0.5 } else { 1.0 },
        }
    }

    /// Records one measured operation (or round trip).
    #[inline]
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
        // saturating_record clamps to the histogram's range instead of failing.
        self.hist.saturating_record(ns);
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// Summary in microseconds (after scaling).
    pub fn summary(&self) -> Option<LatencySummary> {
        if self.hist.is_empty() {
            return None;
        }
        let us = |ns: f64| ns * self.scale / 1000.0;
        let q = |p: f64| us(self.hist.value_at_quantile(p) as f64);
        Some(LatencySummary {
            min: us(self.hist.min() as f64),
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            p999: q(0.999),
            max: us(self.hist.max() as f64),
            avg: us(self.hist.mean()),
            stdev: us(self.hist.stdev()),
        })
    }

    /// Every distinct recorded value (microseconds, scaled) with its count, ascending: what
    /// the SVG histogram bins.
    pub fn points(&self) -> Vec<(f64, u64)> {
        self.hist
            .iter_recorded()
            .map(|v| {
                (
                    self.hist.median_equivalent(v.value_iterated_to()) as f64 * self.scale / 1000.0,
                    v.count_at_value(),
                )
            })
            .collect()
    }
}

/// Latency percentiles of one size, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencySummary {
    /// Smallest sample.
    pub min: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
}

/// Throughput of one size: `messages` of `bytes` each in `elapsed`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Throughput {
    /// Seconds measured.
    pub seconds: f64,
    /// Mebibytes (2^20 B) per second, perftest's "MB/sec".
    pub mib_per_s: f64,
    /// Gigabits (10^9 bit) per second of payload.
    pub gbps: f64,
    /// Million messages per second.
    pub mpps: f64,
}

impl Throughput {
    /// Computes rates; zero elapsed time gives zero rates rather than infinities.
    pub fn new(bytes: u64, messages: u64, elapsed: Duration) -> Self {
        let s = elapsed.as_secs_f64();
        if s <= 0.0 {
            return Throughput {
                seconds: 0.0,
                mib_per_s: 0.0,
                gbps: 0.0,
                mpps: 0.0,
            };
        }
        let total = bytes as f64 * messages as f64;
        Throughput {
            seconds: s,
            mib_per_s: total / s / (1u64 << 20) as f64,
            gbps: total * 8.0 / s / 1e9,
            mpps: messages as f64 / s / 1e6,
        }
    }
}

/// How evenly the QPs of a `-q` run shared a bandwidth test, from each QP's completed
/// messages.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fairness {
    /// Jain's fairness index, (sum x)^2 / (n * sum x^2): 1 when every QP completed as many
    /// messages, 1/n when one QP completed them all.
    pub jain: f64,
    /// The least busy QP's count over the busiest's: 1 when even, 0 when a QP completed
    /// nothing.
    pub min_max: f64,
}

impl Fairness {
    /// The fairness of `counts` (one per QP); `None` when there is nothing to share (no QP,
    /// or no message).
    pub fn of(counts: &[u64]) -> Option<Fairness> {
        let sum: f64 = counts.iter().map(|&c| c as f64).sum();
        let squares: f64 = counts.iter().map(|&c| c as f64 * c as f64).sum();
        let (min, max) = (counts.iter().min()?, counts.iter().max()?);
        if *max == 0 {
            return None;
        }
        Some(Fairness {
            jain: sum * sum / (counts.len() as f64 * squares),
            min_max: *min as f64 / *max as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut l = Latency::new(false);
        for ns in 1..=1000u64 {
            l.record(Duration::from_nanos(ns * 1000)); // 1 us .. 1000 us
        }
        let s = l.summary().unwrap();
        assert_eq!(l.count(), 1000);
        assert!((s.min - 1.0).abs() < 0.01, "{s:?}");
        assert!((s.p50 - 500.0).abs() / 500.0 < 0.002, "{s:?}");
        assert!((s.p90 - 900.0).abs() / 900.0 < 0.002, "{s:?}");
        assert!((s.p99 - 990.0).abs() / 990.0 < 0.002, "{s:?}");
        assert!((s.max - 1000.0).abs() / 1000.0 < 0.002, "{s:?}");
        assert!((s.avg - 500.5).abs() / 500.5 < 0.002, "{s:?}");
        assert!(s.min <= s.p50 && s.p50 <= s.p90 && s.p90 <= s.p99);
        assert!(s.p99 <= s.p999 && s.p999 <= s.max);
    }

    #[test]
    fn half_round_trip_halves_everything() {
        let mut full = Latency::new(false);
        let mut half = Latency::new(true);
        for ns in [3000u64, 5000, 7000, 100_000] {
            full.record(Duration::from_nanos(ns));
            half.record(Duration::from_nanos(ns));
        }
        let (f, h) = (full.summary().unwrap(), half.summary().unwrap());
        assert!((f.p50 / 2.0 - h.p50).abs() < 1e-9);
        assert!((f.max / 2.0 - h.max).abs() < 1e-9);
        assert!((f.min / 2.0 - h.min).abs() < 1e-9);
        assert!((f.avg / 2.0 - h.avg).abs() < 1e-9);
    }

    #[test]
    fn empty_has_no_summary_and_zero_is_clamped() {
        let mut l = Latency::new(false);
        assert!(l.summary().is_none());
        l.record(Duration::ZERO);
        assert_eq!(l.count(), 1);
        assert!(l.summary().unwrap().min > 0.0);
    }

    #[test]
    fn points_cover_all_samples() {
        let mut l = Latency::new(true);
        for _ in 0..10 {
            l.record(Duration::from_micros(2));
        }
        l.record(Duration::from_micros(200));
        let p = l.points();
        assert_eq!(p.iter().map(|x| x.1).sum::<u64>(), 11);
        assert!((p[0].0 - 1.0).abs() < 0.01, "{p:?}");
        assert!((p.last().unwrap().0 - 100.0).abs() < 0.1, "{p:?}");
    }

    #[test]
    fn fairness_of_even_skewed_and_empty_shares() {
        assert_eq!(
            Fairness::of(&[250, 250, 250, 250]),
            Some(Fairness {
                jain: 1.0,
                min_max: 1.0
            })
        );
        // One QP did everything: 1/n, and the idle one makes min/max 0.
        let f = Fairness::of(&[100, 0, 0, 0]).unwrap();
        assert!((f.jain - 0.25).abs() < 1e-12 && f.min_max == 0.0, "{f:?}");
        // 1 and 3: (4^2) / (2 * 10) = 0.8; 1/3.
        let f = Fairness::of(&[1, 3]).unwrap();
        assert!((f.jain - 0.8).abs() < 1e-12, "{f:?}");
        assert!((f.min_max - 1.0 / 3.0).abs() < 1e-12, "{f:?}");
        assert_eq!(Fairness::of(&[]), None);
        assert_eq!(Fairness::of(&[0, 0]), None);
    }

    #[test]
    fn throughput_units() {
        // 1000 messages of 1 MiB in one second.
        let t = Throughput::new(1 << 20, 1000, Duration::from_secs(1));
        assert!((t.mib_per_s - 1000.0).abs() < 1e-9);
        assert!((t.gbps - 1000.0 * 8.0 * (1u64 << 20) as f64 / 1e9).abs() < 1e-9);
        assert!((t.mpps - 0.001).abs() < 1e-12);
        assert_eq!(Throughput::new(1, 1, Duration::ZERO).mpps, 0.0);
    }
}
