//! Poll cost per completion on the counting device: CqPoller draining 32 per
//! `ibv_poll_cq` beside one CQE per call. Only the drain is timed (the CQ is refilled
//! outside the measurement). Prints "ratio hotverbs/naive".

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use hotverbs_benches::{
    fill_chain, fill_counting_cq, hv_measured_drain_batch, hv_measured_drain_single, ns_per_op,
    ratio_line, BURST, FILL,
};
use hotverbs_datapath::CqPoller;
use hotverbs_softnic::counting::CountingDevice;

/// The device, a chain to refill its CQ, and hotverbs' poller of that CQ.
struct Fixture {
    dev: std::pin::Pin<Box<CountingDevice>>,
    chain: Vec<hotverbs_ffi::ibv_send_wr>,
    poller: CqPoller<BURST>,
}

/// Refills and drains `iters` times one CQE per call; returns the drain time only.
fn single(f: &mut Fixture, iters: u64) -> Duration {
    let mut t = Duration::ZERO;
    for _ in 0..iters {
        fill_counting_cq(&f.dev, &mut f.chain).unwrap();
        let t0 = Instant::now();
        // SAFETY: the CQ holds FILL completions and lives as long as `f.dev`.
        unsafe { hv_measured_drain_single(f.dev.cq(), FILL) }.unwrap();
        t += t0.elapsed();
    }
    t
}

/// Refills and drains `iters` times with the CqPoller; returns the drain time only.
fn batch(f: &mut Fixture, iters: u64) -> Duration {
    let mut t = Duration::ZERO;
    for _ in 0..iters {
        fill_counting_cq(&f.dev, &mut f.chain).unwrap();
        let t0 = Instant::now();
        hv_measured_drain_batch(&mut f.poller, FILL).unwrap();
        t += t0.elapsed();
    }
    t
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    let dev = CountingDevice::new(FILL * 2);
    // SAFETY: the device's CQ lives as long as `dev` (moved into the fixture with the
    // poller), and only this poller and the single-CQE drain, never at once, poll it.
    let poller = unsafe { CqPoller::<BURST>::new(dev.cq()) };
    let mut fx = Fixture {
        dev,
        chain: fill_chain(),
        poller,
    };
    let mut g = c.benchmark_group("poll/counting");
    g.throughput(Throughput::Elements(FILL as u64));
    g.bench_function("naive_one_per_call", |b| {
        b.iter_custom(|n| single(&mut fx, n))
    });
    g.bench_function("hotverbs_cqpoller32", |b| {
        b.iter_custom(|n| batch(&mut fx, n))
    });
    g.finish();
    let base = ns_per_op(31, FILL as u64 * 16, || single(&mut fx, 16));
    let hot = ns_per_op(31, FILL as u64 * 16, || batch(&mut fx, 16));
    c.final_summary();
    println!();
    println!("{}", ratio_line("poll per completion, counting", base, hot));
}
