//! `hotverbs-perf`: perftest-style RDMA latency and bandwidth on hotverbs' setup layer and
//! datapath.
//!
//! ```text
//! cargo run --release -p hotverbs-perf -- send_lat            # softnic loopback if no RDMA device
//! hotverbs-perf write_bw -d rxe0 -x 1                         # server
//! hotverbs-perf write_bw -d rxe0 -x 1 127.0.0.1 --json        # client
//! ```
//!
//! # Tour
//! - `cli`: the options (perftest's letters) and their validation into `Params`.
//! - `setup`: device choice (the softnic fallback), CQ/QPs/MR creation, connection — all
//!   through `hotverbs`.
//! - `control`: client/server handshake, endpoint exchange and barriers over TCP with
//!   timeouts (`hotverbs::exchange`).
//! - `engine`: the measured loops on `hotverbs-datapath`, written once over its
//!   `PostRing` surface and compiled per post path (`SendRing`, `WrRing`, `DirectRing`),
//!   on one QP or `-q` of them sharing the CQ.
//! - `clock`: the TSC (calibrated) or the monotonic clock for latency samples.
//! - `stats`, `report`, `svg`, `progress`: percentiles, the table and `--json`, the
//!   `--histogram` SVG, the progress line.
//! - `error`: `PerfError`, every failure with its cause (the verb and errno, the socket
//!   error, the completion status) and what to try.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs)]

use std::process::ExitCode;

use clap::Parser;

mod cli;
mod clock;
mod control;
mod engine;
mod error;
mod progress;
mod report;
mod run;
mod setup;
mod stats;
mod svg;

fn main() -> ExitCode {
    // clap prints usage errors itself and exits with status 2.
    let args = cli::Args::parse();
    match run::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hotverbs-perf: error: {e}");
            ExitCode::FAILURE
        }
    }
}
