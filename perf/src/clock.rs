//! The timestamp of the measured loops.
//!
//! `Instant::now()` (clock_gettime through the vDSO) costs about 50 ns on the VMs this is
//! developed on — a fifth of a softnic half round trip — so on x86-64 with an invariant TSC
//! (`constant_tsc` and `nonstop_tsc` in /proc/cpuinfo) the loops read the TSC (about 18 ns
//! there), as perftest does, calibrated once against the monotonic clock. Anywhere else, or
//! when the calibration is not self-consistent (emulated TSCs under TCG can be), they use
//! `Instant`. `--clock tsc` reads the TSC whatever the flags say, as perftest always does:
//! under QEMU TCG the guest's clocksource is the emulated HPET (its TSC is "unstable"), and a
//! `clock_gettime` there is a system call and an emulated device read of several
//! microseconds, which every latency sample carries once. The header and `--json` say which
//! clock was used and what one reading costs.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Ticks and how to turn them into time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    kind: Kind,
    /// What one reading costs, measured at calibration (nanoseconds).
    read_ns: f64,
}

/// Which clock the loops read (`--clock`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ClockChoice {
    /// The TSC when it is invariant and calibrates consistently, else the monotonic clock.
    #[default]
    Auto,
    /// The TSC, calibrated against the monotonic clock, even when the CPU does not claim an
    /// invariant one (perftest's choice; readings taken on one thread stay comparable).
    Tsc,
    /// `clock_gettime(CLOCK_MONOTONIC)`.
    Mono,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// TSC ticks; nanoseconds per tick.
    Tsc { ns_per_tick: f64 },
    /// Nanoseconds since `base`.
    Mono { base: Instant },
}

static CLOCK: OnceLock<Clock> = OnceLock::new();

/// The process-wide clock (calibrated on first use, about 40 ms): the one [`init`] chose,
/// or [`ClockChoice::Auto`]'s.
pub fn clock() -> &'static Clock {
    CLOCK.get_or_init(Clock::calibrate)
}

/// Chooses the process-wide clock; call before anything reads [`clock`] (later choices
/// are ignored).
pub fn init(choice: ClockChoice) -> &'static Clock {
    CLOCK.get_or_init(|| match choice {
        ClockChoice::Auto => Clock::calibrate(),
        ClockChoice::Tsc => Clock::tsc(),
        ClockChoice::Mono => Clock::mono(),
    })
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rdtsc() -> u64 {
    // SAFETY: RDTSC is available on every x86-64 CPU and has no memory effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn rdtsc() -> u64 {
    0
}

fn invariant_tsc() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    info.lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.contains(&"constant_tsc") && f.contains(&"nonstop_tsc")
        })
}

/// A monotonic reading and the TSC at the same moment: the TSC is read on both sides of
/// `Instant::now()` and the tightest of a few tries is kept, so a preemption in between
/// cannot skew the calibration.
fn paired() -> (Instant, f64) {
    let mut best: Option<(u64, Instant, f64)> = None;
    for _ in 0..16 {
        let a = rdtsc();
        let t = Instant::now();
        let b = rdtsc();
        let width = b.wrapping_sub(a);
        let mid = a as f64 + width as f64 / 2.0;
        if best.is_none_or(|(w, _, _)| width < w) {
            best = Some((width, t, mid));
        }
    }
    let (_, t, mid) = best.expect("at least one try");
    (t, mid)
}

/// Ticks per nanosecond over a `d`-long interval.
fn tsc_rate(d: Duration) -> f64 {
    let (t0, c0) = paired();
    while t0.elapsed() < d {
        std::hint::spin_loop();
    }
    let (t1, c1) = paired();
    (c1 - c0) / (t1 - t0).as_nanos() as f64
}

impl Clock {
    /// The monotonic clock.
    pub fn mono() -> Clock {
        Clock {
            kind: Kind::Mono {
                base: Instant::now(),
            },
            read_ns: 0.0,
        }
        .timed()
    }

    /// The TSC, calibrated (two 20 ms runs averaged) whatever the CPU flags say.
    pub fn tsc() -> Clock {
        let a = tsc_rate(Duration::from_millis(20));
        let b = tsc_rate(Duration::from_millis(20));
        Clock {
            kind: Kind::Tsc {
                ns_per_tick: 2.0 / (a + b),
            },
            read_ns: 0.0,
        }
        .timed()
    }

    /// With `read_ns` measured: the cheapest of a few runs of 64 readings.
    fn timed(mut self) -> Clock {
        const N: u32 = 64;
        let mut best = f64::MAX;
        for _ in 0..8 {
            let t = Instant::now();
            let mut sink = 0u64;
            for _ in 0..N {
                sink = sink.wrapping_add(self.now());
            }
            std::hint::black_box(sink);
            best = best.min(t.elapsed().as_nanos() as f64 / f64::from(N));
        }
        self.read_ns = best;
        self
    }

    /// The TSC when it is invariant and two 20 ms calibrations agree within 0.5%, else the
    /// monotonic clock.
    pub fn calibrate() -> Clock {
        if !invariant_tsc() {
            return Clock::mono();
        }
        let a = tsc_rate(Duration::from_millis(20));
        let b = tsc_rate(Duration::from_millis(20));
        let sane = (0.1..=10.0).contains(&a) && ((a - b) / a).abs() < 0.005;
        if sane {
            Clock {
                kind: Kind::Tsc {
                    ns_per_tick: 2.0 / (a + b),
                },
                read_ns: 0.0,
            }
            .timed()
        } else {
            Clock::mono()
        }
    }

    /// Now, in ticks.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        match self.kind {
            Kind::Tsc { .. } => rdtsc(),
            Kind::Mono { base } => base.elapsed().as_nanos() as u64,
        }
    }

    /// The time between two readings.
    #[inline(always)]
    pub fn between(&self, start: u64, end: u64) -> Duration {
        let ticks = end.saturating_sub(start);
        match self.kind {
            Kind::Tsc { ns_per_tick } => Duration::from_nanos((ticks as f64 * ns_per_tick) as u64),
            Kind::Mono { .. } => Duration::from_nanos(ticks),
        }
    }

    /// What it is and what a reading costs, for the header and `--json`
    /// (`"TSC 2595.9 MHz, 18 ns a read"`, `"clock_gettime (monotonic), 52 ns a read"`).
    pub fn describe(&self) -> String {
        let what = match self.kind {
            Kind::Tsc { ns_per_tick } => format!("TSC {:.1} MHz", 1e3 / ns_per_tick),
            Kind::Mono { .. } => "clock_gettime (monotonic)".to_string(),
        };
        format!("{what}, {:.0} ns a read", self.read_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_clocks_measure_a_known_interval() {
        for c in [Clock::mono(), Clock::calibrate(), Clock::tsc()] {
            // Bracket each reading with monotonic ones, so preemption cannot fake an error.
            let i0 = Instant::now();
            let t0 = c.now();
            let i1 = Instant::now();
            std::thread::sleep(Duration::from_millis(30));
            let i2 = Instant::now();
            let t1 = c.now();
            let i3 = Instant::now();
            let d = c.between(t0, t1).as_secs_f64();
            let (inner, outer) = ((i2 - i1).as_secs_f64(), (i3 - i0).as_secs_f64());
            // 2% covers the calibration error (two 20 ms runs agreeing within 0.5%).
            assert!(
                d >= inner * 0.98 && d <= outer * 1.02,
                "{}: {d} s outside [{inner}, {outer}]",
                c.describe()
            );
        }
    }

    #[test]
    fn backwards_readings_are_zero_not_huge() {
        let c = clock();
        assert_eq!(c.between(10, 5), Duration::ZERO);
        assert!(!c.describe().is_empty());
    }
}
