//! The streaming loop: post N inline messages and reap every completion. hotverbs'
//! SendRing + CqPoller at post lists 1, 8 and 32 beside the naive poster, on the counting
//! device and on softnic. Prints "ratio hotverbs/naive" per pair.

use std::time::Duration;

use criterion::{Criterion, Throughput};
use hotverbs_benches::{
    hv_measured_stream_naive, hv_measured_stream_ring, ns_per_op, ratio_line, timed, Target, MSG,
};

/// Messages per measured call (a multiple of the signal period).
const N: u64 = 4096;

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    let mut lines = Vec::new();
    for dev in ["counting", "softnic"] {
        let t = match dev {
            "counting" => Target::counting(),
            _ => Target::softnic().expect("open softnic"),
        };
        let mut naive = t.naive();
        let mut rings: Vec<_> = [1u32, 8, 32]
            .into_iter()
            .map(|b| (b, t.ring(b).expect("send ring")))
            .collect();
        let mut g = c.benchmark_group(format!("stream/{dev}"));
        g.throughput(Throughput::Elements(N));
        g.bench_function("naive", |b| {
            b.iter(|| hv_measured_stream_naive(&mut naive, &MSG, N).unwrap())
        });
        for (batch, r) in rings.iter_mut() {
            g.bench_function(format!("hotverbs_batch{batch}"), |b| {
                b.iter(|| hv_measured_stream_ring(r, &MSG, N).unwrap())
            });
        }
        g.finish();
        // Side by side, same process, same device: the ratio.
        let base = ns_per_op(15, N, || {
            timed(|| hv_measured_stream_naive(&mut naive, &MSG, N).unwrap())
        });
        for (batch, r) in rings.iter_mut() {
            let hot = ns_per_op(15, N, || {
                timed(|| hv_measured_stream_ring(r, &MSG, N).unwrap())
            });
            lines.push(ratio_line(
                &format!("stream {dev} batch {batch:>2}"),
                base,
                hot,
            ));
        }
    }
    c.final_summary();
    println!();
    for l in lines {
        println!("{l}");
    }
}
