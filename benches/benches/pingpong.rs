//! A full ping-pong round trip on softnic (both QPs driven in turn by one thread: the
//! software cost of a round trip): hotverbs (send_now, RecvRing, CqPoller) beside the naive
//! way (fresh WRs, a receive re-posted per message, one CQE per poll). Prints
//! "ratio hotverbs/naive".

use std::time::Duration;

use criterion::{Criterion, Throughput};
use hotverbs_benches::{
    hv_measured_pingpong_naive, hv_measured_pingpong_ring, ns_per_op, ratio_line, timed,
    NaivePingPong, RingPingPong, SoftnicPair, MSG,
};

/// Round trips per measured call.
const N: u64 = 512;

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    // One pair each: their receive queues hold differently numbered receives.
    let pn = SoftnicPair::new().expect("softnic pair");
    let pr = SoftnicPair::new().expect("softnic pair");
    let mut naive = NaivePingPong::new(&pn).expect("naive receives");
    let mut ring = RingPingPong::new(&pr).expect("rings");
    let mut run_naive = || {
        // SAFETY: `pn`, whose QPs and CQs `naive` uses, outlives every call.
        unsafe { hv_measured_pingpong_naive(&mut naive, &MSG, N) }.unwrap()
    };
    let mut run_ring = || hv_measured_pingpong_ring(&mut ring, &MSG, N).unwrap();
    let mut g = c.benchmark_group("pingpong/softnic");
    g.throughput(Throughput::Elements(N));
    g.bench_function("naive", |b| b.iter(&mut run_naive));
    g.bench_function("hotverbs", |b| b.iter(&mut run_ring));
    g.finish();
    let base = ns_per_op(15, N, || timed(&mut run_naive));
    let hot = ns_per_op(15, N, || timed(&mut run_ring));
    c.final_summary();
    println!();
    println!("{}", ratio_line("ping-pong round trip, softnic", base, hot));
}
