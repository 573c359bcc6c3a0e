//! The progress line: drawn on stderr when it is a terminal and a size runs longer than two
//! seconds, by a separate thread, so the measured loop only does one relaxed store per
//! iteration into a counter.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Runs shorter than this never draw.
pub const QUIET_FOR: Duration = Duration::from_secs(2);

/// The measured loop's side: a counter of completed iterations.
#[derive(Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Publishes the number of completed iterations (relaxed: the reader only displays it).
    #[inline(always)]
    pub fn set(&self, done: u64) {
        self.0.store(done, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What a full run is: a number of iterations or a time.
#[derive(Clone, Copy, Debug)]
pub enum Goal {
    /// Iterations.
    Iters(u64),
    /// Time.
    Time(Duration),
}

/// The line drawn at `elapsed` with `done` iterations towards `goal`.
pub fn line(label: &str, done: u64, goal: Goal, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
    match goal {
        Goal::Iters(total) => {
            let pct = if total > 0 {
                (done.min(total) as f64 * 100.0 / total as f64).floor()
            } else {
                100.0
            };
            format!("{label}: {done}/{total} iterations ({pct:.0}%), {secs:.1} s, {rate:.0}/s")
        }
        Goal::Time(t) => format!(
            "{label}: {secs:.1}/{:.1} s, {done} iterations, {rate:.0}/s",
            t.as_secs_f64()
        ),
    }
}

/// A running progress display; dropping (or [`Progress::finish`]) clears the line.
pub struct Progress {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts the display thread when `enabled` (stderr is a terminal and not `--no-progress`);
    /// otherwise a no-op.
    pub fn start(enabled: bool, label: String, goal: Goal, counter: Counter) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        if !enabled {
            return Progress { stop, thread: None };
        }
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || {
                let t0 = Instant::now();
                let mut drawn = false;
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                    let el = t0.elapsed();
                    if el < QUIET_FOR {
                        continue;
                    }
                    let mut err = std::io::stderr().lock();
                    let _ = write!(err, "\r\x1b[2K{}", line(&label, counter.get(), goal, el));
                    let _ = err.flush();
                    drawn = true;
                }
                if drawn {
                    let mut err = std::io::stderr().lock();
                    let _ = write!(err, "\r\x1b[2K");
                    let _ = err.flush();
                }
            })
            .ok();
        Progress { stop, thread }
    }

    /// Stops and clears the line.
    pub fn finish(mut self) {
        self.end();
    }

    fn end(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iteration_line() {
        let l = line(
            "send_lat 2 B",
            250,
            Goal::Iters(1000),
            Duration::from_secs(5),
        );
        assert_eq!(l, "send_lat 2 B: 250/1000 iterations (25%), 5.0 s, 50/s");
    }

    #[test]
    fn time_line() {
        let l = line(
            "send_bw 64 B",
            10,
            Goal::Time(Duration::from_secs(4)),
            Duration::from_secs(2),
        );
        assert_eq!(l, "send_bw 64 B: 2.0/4.0 s, 10 iterations, 5/s");
    }

    #[test]
    fn disabled_progress_draws_nothing_and_stops() {
        let c = Counter::default();
        let p = Progress::start(false, "x".into(), Goal::Iters(1), c.clone());
        c.set(1);
        assert!(p.thread.is_none());
        p.finish();
    }
}
