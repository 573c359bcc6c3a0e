//! The device's free-running clock: `ibv_query_rt_values_ex`, the `ibv_query_device_ex`
//! fields that describe it (`completion_timestamp_mask`, `hca_core_clock`), and
//! [`TimestampClock`], which turns raw completion timestamps (`ibv_wc_read_completion_ts`)
//! into nanoseconds.
//!
//! Raw timestamps are counts of device clock cycles, `completion_timestamp_mask` wide
//! (they wrap at it). Two ways to convert them:
//! - the declared frequency, `hca_core_clock` (kHz): [`TimestampClock::from_hca_core_clock`],
//!   which [`Context::timestamp_clock`] builds — device time in ns, no epoch;
//! - two [`ClockSample`]s (the raw clock read with `ibv_query_rt_values_ex` next to the host's
//!   `CLOCK_MONOTONIC`), some time apart: [`TimestampClock::from_samples`] — host
//!   `CLOCK_MONOTONIC` nanoseconds, measuring the real rate instead of trusting the nominal.

use hotverbs_ffi::ibv_values_ex;

use crate::device::Context;
use crate::error::{Error, Result};

/// Real-time values of a device (`struct ibv_values_ex`), from [`Context::rt_values`].
///
/// # References
/// `ibv_query_rt_values_ex(3)`
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtValues {
    raw_clock: u64,
}

impl RtValues {
    /// The device's raw clock in cycles (`raw_clock`: mlx5 puts the cycle count in
    /// `tv_nsec` with `tv_sec` 0; a provider that splits it is read as
    /// `tv_sec * 10^9 + tv_nsec`, wrapping).
    ///
    /// # References
    /// `ibv_query_rt_values_ex(3)`
    pub fn raw_clock(&self) -> u64 {
        self.raw_clock
    }
}

/// One reading of the device's raw clock together with the host's `CLOCK_MONOTONIC`
/// (the midpoint of readings taken just before and after the device query), from
/// [`Context::clock_sample`]. Two of them make a [`TimestampClock`].
///
/// # References
/// `ibv_query_rt_values_ex(3)`, `clock_gettime(2)`
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockSample {
    /// The device's raw clock, in cycles ([`RtValues::raw_clock`]).
    pub raw: u64,
    /// The host's `CLOCK_MONOTONIC` at the same moment, in nanoseconds.
    pub host_ns: u64,
}

/// Converts raw completion timestamps (device clock cycles) into nanoseconds: a rational
/// rate `ns / cycles`, an origin (`raw0` cycles is `ns0` nanoseconds) and the width of the
/// device's counter (`completion_timestamp_mask`), all in exact integer arithmetic (128-bit
/// intermediates: no overflow for any 64-bit cycle count, no floating-point drift).
///
/// # Example
/// ```
/// use hotverbs::TimestampClock;
/// // A 1.5 GHz clock (hca_core_clock 1_500_000 kHz), 48-bit counter.
/// let c = TimestampClock::from_hca_core_clock(1_500_000, (1 << 48) - 1).unwrap();
/// assert_eq!(c.cycles_to_ns(3_000), 2_000);
/// assert_eq!(c.delta_ns(10, 1_510), 1_000);
/// // The counter wrapped between the two timestamps: still 1 µs.
/// assert_eq!(c.delta_ns((1 << 48) - 500, 1_000), 1_000);
/// ```
///
/// # References
/// `ibv_query_device_ex(3)` (`completion_timestamp_mask`, `hca_core_clock`),
/// `ibv_query_rt_values_ex(3)`, `ibv_create_cq_ex(3)` (`ibv_wc_read_completion_ts`)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimestampClock {
    /// Rate numerator: this many nanoseconds ...
    ns: u64,
    /// ... per this many cycles (never 0).
    cycles: u64,
    /// The origin: raw clock `raw0` is `ns0` nanoseconds.
    raw0: u64,
    ns0: u64,
    /// The counter's width (`completion_timestamp_mask`, all ones below its top bit).
    mask: u64,
}

impl TimestampClock {
    /// From the device's declared frequency `hca_core_clock` (kHz) and counter mask
    /// (`completion_timestamp_mask`): nanoseconds of device time (raw 0 is 0 ns). `None`
    /// when either is 0 (the device has no timestamps, or declares no frequency).
    ///
    /// # References
    /// `ibv_query_device_ex(3)`
    pub fn from_hca_core_clock(khz: u64, mask: u64) -> Option<TimestampClock> {
        if khz == 0 || mask == 0 {
            return None;
        }
        Some(TimestampClock {
            ns: 1_000_000,
            cycles: khz,
            raw0: 0,
            ns0: 0,
            mask,
        })
    }

    /// From two samples of the device clock and the host clock, `a` taken before `b`, and
    /// the counter mask: converts to the host's `CLOCK_MONOTONIC` nanoseconds at the rate
    /// measured between the samples (the farther apart, the more exact). `None` when no
    /// cycle or no nanosecond passed between them, the host clock went backwards, or the
    /// mask is 0.
    ///
    /// # Example
    /// ```
    /// use hotverbs::{ClockSample, TimestampClock};
    /// let a = ClockSample { raw: 1_000, host_ns: 5_000_000 };
    /// let b = ClockSample { raw: 1_000 + 2_000_000, host_ns: 6_000_000 }; // 2 GHz
    /// let c = TimestampClock::from_samples(a, b, u64::MAX).unwrap();
    /// assert_eq!(c.to_ns(1_000 + 4_000), 5_002_000);
    /// assert_eq!(c.to_ns(0), 4_999_500); // before the first sample
    /// ```
    ///
    /// # References
    /// `ibv_query_rt_values_ex(3)`
    pub fn from_samples(a: ClockSample, b: ClockSample, mask: u64) -> Option<TimestampClock> {
        if mask == 0 || b.host_ns <= a.host_ns {
            return None;
        }
        let cycles = b.raw.wrapping_sub(a.raw) & mask;
        if cycles == 0 {
            return None;
        }
        Some(TimestampClock {
            ns: b.host_ns - a.host_ns,
            cycles,
            raw0: a.raw & mask,
            ns0: a.host_ns,
            mask,
        })
    }

    /// `cycles` of the device clock in nanoseconds (rounded down; saturates at
    /// `u64::MAX`).
    ///
    /// # References
    /// `ibv_create_cq_ex(3)` (`ibv_wc_read_completion_ts`)
    pub fn cycles_to_ns(&self, cycles: u64) -> u64 {
        let ns = u128::from(cycles) * u128::from(self.ns) / u128::from(self.cycles);
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    /// Nanoseconds from raw timestamp `earlier` to `later`, across at most one wrap of the
    /// counter.
    ///
    /// # References
    /// `ibv_create_cq_ex(3)` (`ibv_wc_read_completion_ts`)
    pub fn delta_ns(&self, earlier: u64, later: u64) -> u64 {
        self.cycles_to_ns(later.wrapping_sub(earlier) & self.mask)
    }

    /// Raw timestamp `raw` in nanoseconds on this clock's scale (device time for
    /// [`from_hca_core_clock`](Self::from_hca_core_clock), host `CLOCK_MONOTONIC` for
    /// [`from_samples`](Self::from_samples)). A timestamp within half a counter period of
    /// the origin is placed before or after it accordingly (saturating at 0 and
    /// `u64::MAX`).
    ///
    /// # References
    /// `ibv_create_cq_ex(3)` (`ibv_wc_read_completion_ts`)
    pub fn to_ns(&self, raw: u64) -> u64 {
        let ahead = raw.wrapping_sub(self.raw0) & self.mask;
        if ahead <= self.mask / 2 {
            self.ns0.saturating_add(self.cycles_to_ns(ahead))
        } else {
            let behind = self.raw0.wrapping_sub(raw) & self.mask;
            self.ns0.saturating_sub(self.cycles_to_ns(behind))
        }
    }

    /// The counter mask (`completion_timestamp_mask`).
    ///
    /// # References
    /// `ibv_query_device_ex(3)` (`completion_timestamp_mask`)
    pub fn mask(&self) -> u64 {
        self.mask
    }

    /// The rate as `(nanoseconds, cycles)`: `nanoseconds` pass in `cycles` device cycles.
    ///
    /// # References
    /// `ibv_query_device_ex(3)` (`hca_core_clock`)
    pub fn rate(&self) -> (u64, u64) {
        (self.ns, self.cycles)
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is writable; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

impl Context {
    /// `ibv_query_rt_values_ex(3)`: the device's raw clock now.
    ///
    /// # Errors
    /// `ibv_query_rt_values_ex: EOPNOTSUPP` when the device cannot read its clock (no
    /// extended op, or it did not mark `IBV_VALUES_MASK_RAW_CLOCK`); the hint names the
    /// device.
    ///
    /// # References
    /// `ibv_query_rt_values_ex(3)`
    pub fn rt_values(&self) -> Result<RtValues> {
        const VERB: &str = "ibv_query_rt_values_ex";
        // SAFETY: plain C data; all-zero is valid.
        let mut v: ibv_values_ex = unsafe { crate::zeroed() };
        v.comp_mask = hotverbs_ffi::IBV_VALUES_MASK_RAW_CLOCK;
        // SAFETY: live context; v is writable.
        let ret = unsafe { hotverbs_ffi::inline::ibv_query_rt_values_ex(self.as_raw(), &mut v) };
        let no_clock = || {
            format!(
                "device {} cannot report its raw clock (IBV_VALUES_MASK_RAW_CLOCK): convert \
                 completion timestamps with Context::timestamp_clock (the declared \
                 hca_core_clock) instead",
                self.name()
            )
        };
        if ret != 0 {
            let e = Error::from_ret(VERB, ret);
            if crate::td::unsupported(e.errno()) {
                return Err(Error::new(VERB, e.errno()).with_hint(no_clock()));
            }
            return Err(e);
        }
        if v.comp_mask & hotverbs_ffi::IBV_VALUES_MASK_RAW_CLOCK == 0 {
            return Err(Error::new(VERB, libc::EOPNOTSUPP).with_hint(no_clock()));
        }
        let raw = (v.raw_clock.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(v.raw_clock.tv_nsec as u64);
        Ok(RtValues { raw_clock: raw })
    }

    /// The device's raw clock ([`rt_values`](Self::rt_values)) with the host's
    /// `CLOCK_MONOTONIC` read around it (the midpoint): one point for
    /// [`TimestampClock::from_samples`].
    ///
    /// # Errors
    /// As [`rt_values`](Self::rt_values).
    ///
    /// # References
    /// `ibv_query_rt_values_ex(3)`, `clock_gettime(2)`
    pub fn clock_sample(&self) -> Result<ClockSample> {
        let before = monotonic_ns();
        let raw = self.rt_values()?.raw_clock();
        let after = monotonic_ns();
        Ok(ClockSample {
            raw,
            host_ns: before + (after.saturating_sub(before)) / 2,
        })
    }

    /// Does the device put completion timestamps in CQEs
    /// (`WcFields::COMPLETION_TIMESTAMP`)? True when `ibv_query_device_ex` reports a
    /// non-zero `completion_timestamp_mask`. Check this before asking for timestamps.
    ///
    /// # References
    /// `ibv_query_device_ex(3)`
    pub fn supports_completion_timestamps(&self) -> Result<bool> {
        Ok(self.query_device()?.completion_timestamp_mask() != 0)
    }

    /// The converter for this device's completion timestamps from its declared frequency
    /// (`hca_core_clock`) and counter mask ([`TimestampClock::from_hca_core_clock`]).
    ///
    /// # Errors
    /// `ibv_query_device_ex: EOPNOTSUPP` when the device has no completion timestamps
    /// (mask 0: rxe) or declares no frequency; the hint names the device and the feature.
    ///
    /// # References
    /// `ibv_query_device_ex(3)`
    pub fn timestamp_clock(&self) -> Result<TimestampClock> {
        let a = self.query_device()?;
        let (mask, khz) = (a.completion_timestamp_mask(), a.hca_core_clock_khz());
        TimestampClock::from_hca_core_clock(khz, mask).ok_or_else(|| {
            let why = if mask == 0 {
                format!(
                    "completion timestamps are not supported by device {} \
                     (completion_timestamp_mask 0)",
                    self.name()
                )
            } else {
                format!(
                    "device {} declares no hca_core_clock: calibrate with \
                     TimestampClock::from_samples over two Context::clock_sample()s",
                    self.name()
                )
            };
            Error::new("ibv_query_device_ex", libc::EOPNOTSUPP).with_hint(why)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hca_core_clock_rates() {
        // 1 GHz: one cycle per ns.
        let c = TimestampClock::from_hca_core_clock(1_000_000, u64::MAX).unwrap();
        assert_eq!(c.cycles_to_ns(123_456_789), 123_456_789);
        // 156.25 MHz (a ConnectX-4 Lx): 6.4 ns per cycle.
        let c = TimestampClock::from_hca_core_clock(156_250, u64::MAX).unwrap();
        assert_eq!(c.cycles_to_ns(5), 32);
        assert_eq!(c.cycles_to_ns(1), 6); // rounded down
                                          // 1.1 GHz, not a divisor of 10^6 kHz: exact rational arithmetic.
        let c = TimestampClock::from_hca_core_clock(1_100_000, u64::MAX).unwrap();
        assert_eq!(c.cycles_to_ns(11_000_000_000), 10_000_000_000);
        assert_eq!(TimestampClock::from_hca_core_clock(0, u64::MAX), None);
        assert_eq!(TimestampClock::from_hca_core_clock(1_000, 0), None);
    }

    #[test]
    fn no_overflow_for_large_cycle_counts() {
        // u64::MAX cycles at 1 GHz: exactly u64::MAX ns, no intermediate overflow
        // (cycles * 10^6 alone is ~2^84).
        let c = TimestampClock::from_hca_core_clock(1_000_000, u64::MAX).unwrap();
        assert_eq!(c.cycles_to_ns(u64::MAX), u64::MAX);
        // At 500 MHz the result does not fit: saturates instead of wrapping.
        let c = TimestampClock::from_hca_core_clock(500_000, u64::MAX).unwrap();
        assert_eq!(c.cycles_to_ns(u64::MAX), u64::MAX);
        assert_eq!(c.cycles_to_ns(u64::MAX / 4), u64::MAX / 4 * 2);
        // A 3 GHz clock after ~195 years of cycles (2^64 - 1): exact.
        let c = TimestampClock::from_hca_core_clock(3_000_000, u64::MAX).unwrap();
        assert_eq!(c.cycles_to_ns(u64::MAX), u64::MAX / 3);
        // Samples an hour apart with a huge raw origin.
        let a = ClockSample {
            raw: u64::MAX - 1_000,
            host_ns: u64::MAX / 2,
        };
        let b = ClockSample {
            raw: (u64::MAX - 1_000).wrapping_add(3_600_000_000_000 * 2),
            host_ns: u64::MAX / 2 + 3_600_000_000_000,
        };
        let c = TimestampClock::from_samples(a, b, u64::MAX).unwrap();
        assert_eq!(c.rate(), (3_600_000_000_000, 7_200_000_000_000));
        assert_eq!(c.to_ns(b.raw), b.host_ns);
        assert_eq!(c.to_ns(a.raw.wrapping_add(2)), a.host_ns + 1);
    }

    #[test]
    fn wraps_at_the_mask() {
        let mask = (1u64 << 48) - 1;
        let c = TimestampClock::from_hca_core_clock(1_000_000, mask).unwrap();
        assert_eq!(c.delta_ns(mask - 9, 10), 20);
        assert_eq!(c.delta_ns(10, 10), 0);
        // Bits above the mask are ignored.
        assert_eq!(c.delta_ns(5 | (1 << 50), 25), 20);
        let a = ClockSample {
            raw: mask - 99,
            host_ns: 1_000,
        };
        let b = ClockSample {
            raw: 100,
            host_ns: 1_200,
        };
        let c = TimestampClock::from_samples(a, b, mask).unwrap();
        assert_eq!(c.rate(), (200, 200));
        assert_eq!(c.to_ns(0), 1_100);
        assert_eq!(c.to_ns(mask - 199), 900); // before the first sample
        assert_eq!(c.to_ns(mask - 99), 1_000);
    }

    #[test]
    fn bad_samples_are_refused() {
        let a = ClockSample {
            raw: 5,
            host_ns: 10,
        };
        assert_eq!(TimestampClock::from_samples(a, a, u64::MAX), None);
        let b = ClockSample { raw: 6, host_ns: 9 };
        assert_eq!(TimestampClock::from_samples(a, b, u64::MAX), None);
        let b = ClockSample {
            raw: 5,
            host_ns: 11,
        };
        assert_eq!(TimestampClock::from_samples(a, b, u64::MAX), None);
        let b = ClockSample {
            raw: 6,
            host_ns: 11,
        };
        assert_eq!(TimestampClock::from_samples(a, b, 0), None);
        assert!(TimestampClock::from_samples(a, b, u64::MAX).is_some());
    }

    #[test]
    fn to_ns_saturates_at_zero() {
        let c = TimestampClock::from_samples(
            ClockSample {
                raw: 1_000,
                host_ns: 10,
            },
            ClockSample {
                raw: 2_000,
                host_ns: 1_010,
            },
            u64::MAX,
        )
        .unwrap();
        assert_eq!(c.to_ns(500), 0);
        assert_eq!(c.to_ns(995), 5);
    }
}
