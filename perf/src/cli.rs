//! Command line, in perftest's spirit: the same letters where perftest has one
//! (`-d -i -x -s -a -n -D -I -Q -l -t -r -q -p -A`), a test name instead of one binary per test,
//! and the peer's host as the optional positional argument (no host = server).

use std::fmt;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::clock::ClockChoice;
use crate::error::PerfError;

/// The tests, named like perftest's binaries (`ib_send_lat` is `send_lat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[clap(rename_all = "snake_case")]
pub enum TestKind {
    /// SEND/RECV ping-pong; reports half the round trip.
    SendLat,
    /// RDMA WRITE ping-pong (each side polls its buffer); reports half the round trip.
    WriteLat,
    /// RDMA READ, one at a time; reports the full operation latency.
    ReadLat,
    /// Atomic (fetch-and-add or compare-and-swap), one at a time; full operation latency.
    AtomicLat,
    /// SEND streaming with a window of `--tx-depth`; MiB/s, Gb/s, Mpps.
    SendBw,
    /// RDMA WRITE streaming.
    WriteBw,
    /// RDMA READ streaming.
    ReadBw,
}

impl TestKind {
    /// Latency test (one operation or round trip at a time)?
    pub fn is_latency(self) -> bool {
        matches!(
            self,
            TestKind::SendLat | TestKind::WriteLat | TestKind::ReadLat | TestKind::AtomicLat
        )
    }

    /// Ping-pong test, whose samples are half round trips (as perftest reports them)?
    pub fn is_ping_pong(self) -> bool {
        matches!(self, TestKind::SendLat | TestKind::WriteLat)
    }

    /// The name on the command line and in `--json`.
    pub fn name(self) -> &'static str {
        match self {
            TestKind::SendLat => "send_lat",
            TestKind::WriteLat => "write_lat",
            TestKind::ReadLat => "read_lat",
            TestKind::AtomicLat => "atomic_lat",
            TestKind::SendBw => "send_bw",
            TestKind::WriteBw => "write_bw",
            TestKind::ReadBw => "read_bw",
        }
    }

    /// The title line of the report, as perftest words it.
    pub fn title(self) -> &'static str {
        match self {
            TestKind::SendLat => "Send Latency Test",
            TestKind::WriteLat => "RDMA_Write Latency Test",
            TestKind::ReadLat => "RDMA_Read Latency Test",
            TestKind::AtomicLat => "Atomic Latency Test",
            TestKind::SendBw => "Send BW Test",
            TestKind::WriteBw => "RDMA_Write BW Test",
            TestKind::ReadBw => "RDMA_Read BW Test",
        }
    }

    /// Does the passive side of this test consume receive WRs?
    pub fn uses_recv(self) -> bool {
        matches!(self, TestKind::SendLat | TestKind::SendBw)
    }
}

impl fmt::Display for TestKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The transport of the QPs (perftest's `-c`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[clap(rename_all = "UPPER")]
pub enum Connection {
    /// Reliable connection: every test.
    #[default]
    Rc,
    /// Unreliable connection (no ACKs, no READ or atomics): send_lat, write_lat, write_bw.
    Uc,
    /// Unreliable datagram (SENDs of at most one MTU, addressed per WR): send_lat.
    Ud,
}

impl Connection {
    /// As perftest prints it.
    pub fn name(self) -> &'static str {
        match self {
            Connection::Rc => "RC",
            Connection::Uc => "UC",
            Connection::Ud => "UD",
        }
    }
}

/// The atomic of `atomic_lat` (perftest's `-A`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[clap(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AtomicKind {
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    FetchAndAdd,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    CmpAndSwap,
}

/// The largest message of `-a` (perftest's 8 MiB).
pub const MAX_ALL_SIZE: u32 = 8 << 20;

/// `hotverbs-perf`: RDMA latency and bandwidth, perftest-style, on hotverbs.
///
/// With no host the tool is the server and waits for a client; with a host it is the client.
/// With no `-d` and no RDMA device on the machine it runs both sides in this process on
/// softnic, hotverbs' software device (say `-d softnic` to ask for that explicitly).
#[derive(Debug, Clone, Parser)]
#[command(name = "hotverbs-perf", version, about, long_about = None)]
pub struct Args {
    /// Test to run.
    #[arg(value_enum)]
    pub test: TestKind,

    /// Peer to connect to (client role). Without it: server, or softnic loopback when no
    /// RDMA device exists.
    pub host: Option<String>,

    /// RDMA device (`mlx5_0`, `rxe0`, or `softnic`). Default: the first device, or softnic
    /// loopback when there is none.
    #[arg(short = 'd', long = "ib-dev")]
    pub device: Option<String>,

    /// Device port.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..))]
    pub ib_port: u8,

    /// GID index (RoCE needs one: rxe's IPv4-mapped GID is usually 1).
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<u8>,

    /// Message size in bytes (default 2 for latency tests, 65536 for bandwidth tests).
    #[arg(short = 's', long = "size", conflicts_with = "all")]
    pub size: Option<u32>,

    /// Every size from 2 B to 8 MiB (powers of two).
    #[arg(short = 'a', long = "all")]
    pub all: bool,

    /// Measured iterations per size (default 1000 for latency, 5000 for bandwidth).
    #[arg(short = 'n', long = "iters", conflicts_with = "duration",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: Option<u64>,

    /// Run each size for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration", value_parser = parse_duration_secs)]
    pub duration: Option<f64>,

    /// Unmeasured warm-up iterations before each size.
    #[arg(long = "warmup", default_value_t = 100)]
    pub warmup: u64,

    /// Largest message sent inline (`IBV_SEND_INLINE`). Default: 220 for latency tests
    /// (stepped down when the device refuses), 0 for bandwidth tests, as perftest does.
    #[arg(short = 'I', long = "inline-size")]
    pub inline_size: Option<u32>,

    /// Signal every Q-th WR (bandwidth tests; perftest's CQ moderation).
    #[arg(short = 'Q', long = "cq-mod", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub cq_mod: u32,

    /// WRs per `ibv_post_send` (post list / batch).
    #[arg(short = 'l', long = "post-list", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub post_list: u32,

    /// Send queue depth (the bandwidth window).
    #[arg(short = 't', long = "tx-depth", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub tx_depth: u32,

    /// Receive queue depth.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub rx_depth: u32,

    /// QPs per side (perftest's `-q`), bandwidth tests only: they share the side's CQ, the
    /// stream posts round-robin to the ones with room, and the report is the aggregate
    /// (`-n` counts messages over all QPs) with each QP's share and their fairness.
    #[arg(short = 'q', long = "qp", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=crate::engine::MAX_QPS as i64))]
    pub qps: u32,

    /// TCP port of the endpoint exchange (server listens, client connects). Server: 0 picks
    /// a free port and prints "hotverbs-perf: listening on TCP port N" on stderr.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,

    /// Run both sides in this process (two QPs connected to each other, the passive side on
    /// its own thread; both busy-poll). On a machine with no CPU to spare (rxe in a 2-vCPU
    /// VM on a loaded host) any run, loopback, a server/client pair or perftest, can fall
    /// into a regime where each message waits for the scheduler tick (p50 about 4 ms at HZ
    /// 250 instead of 10 us) and flip back in the next run: there, compare repeated,
    /// interleaved runs, never one run per tool.
    #[arg(long = "loopback", conflicts_with = "host")]
    pub loopback: bool,

    /// The clock of the latency samples: the TSC when it is invariant (`auto`), always the
    /// TSC (`tsc`, as perftest does: under QEMU TCG `clock_gettime` is an emulated HPET read
    /// costing microseconds, which every sample carries), or `clock_gettime` (`mono`). The
    /// header says which, and what one reading costs.
    #[arg(long = "clock", value_enum, default_value_t = ClockChoice::Auto)]
    pub clock: ClockChoice,

    /// Seconds to wait for the peer (connect, exchange, and any stalled completion).
    #[arg(long = "timeout", default_value_t = 10.0, value_parser = parse_duration_secs)]
    pub timeout: f64,

    /// Server: seconds to wait for a client to connect.
    #[arg(long = "server-wait", default_value_t = 120.0, value_parser = parse_duration_secs)]
    pub server_wait: f64,

    /// The atomic of `atomic_lat`.
    #[arg(short = 'A', long = "atomic-type", value_enum, default_value_t = AtomicKind::FetchAndAdd)]
    pub atomic: AtomicKind,

    /// Connection type: RC (every test), UC (send_lat, write_lat, write_bw) or UD (send_lat,
    /// messages of at most one MTU). The unreliable transports drop a SEND that finds no
    /// receive, so send_bw, which counts every message at the receiver, is RC only.
    #[arg(short = 'c', long = "connection", value_enum, ignore_case = true, default_value_t = Connection::Rc)]
    pub connection: Connection,

    /// Post with the legacy `ibv_post_send` (hotverbs' preformatted `SendRing`) instead of
    /// the extended `ibv_wr_*` API on an extended QP (`ibv_create_qp_ex`), which is the
    /// default, as in perftest since 2020 (same flag name). A device without extended QPs
    /// fails with a message that names this flag.
    #[arg(long = "use_old_post_send")]
    pub use_old_post_send: bool,

    /// Also time each latency iteration with the device's completion timestamps (an
    /// extended CQ with `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`, converted with the device's
    /// `hca_core_clock`): a second row, "(NIC clock)", under each size. A sample is the
    /// interval between the completions that end two consecutive iterations (the receive of
    /// the reply for `send_lat`, halved like the host figure; the READ's or atomic's own
    /// completion for `read_lat` / `atomic_lat`), so it counts the host's turnaround but not
    /// the host clock's reading cost. `send_lat`, `read_lat` and `atomic_lat` only
    /// (`write_lat` sees its reply in memory, not in a completion). A device without
    /// completion timestamps (rxe) fails fast, naming the device.
    #[arg(long = "timestamps")]
    pub timestamps: bool,

    /// ConnectX only: post by writing mlx5 WQEs straight into the send queue and read the
    /// send CQ's CQEs directly (hotverbs' `DirectRing` / `DirectPoller`, no provider call),
    /// instead of `ibv_wr_*` / `ibv_post_send`. Run the same test with and without it to
    /// compare the two paths on your NIC. Sends and receives get a CQ each; each QP gets
    /// a thread domain of its own (its doorbell register: BlueFlame). send_lat / send_bw
    /// of 2, 4, 8, 16, 32 or 44 bytes use the fixed-size session / post list (send_lat's
    /// receives: a receive session, the payload read where the device put it). RC or UC.
    /// Any other device fails fast, naming it; not with --timestamps or
    /// --use_old_post_send.
    #[arg(long = "direct")]
    pub direct: bool,

    /// ConnectX only, loopback: both post paths in one command. Runs the test through the
    /// verbs path, then again with --direct on the same device, prints both tables and
    /// a per-size comparison (median latency, or messages per second, direct / verbs).
    /// Not with --direct, --timestamps, --use_old_post_send, --json or --histogram.
    #[arg(long = "compare_direct")]
    pub compare_direct: bool,

    /// write_lat only (perftest's `--write_with_imm`): each WRITE carries an immediate,
    /// so it consumes a receive on the peer and raises a receive completion there; each
    /// side waits for that completion instead of watching memory. With --direct the whole
    /// round trip skips libmlx5: the WRITE posted as an mlx5 WQE, the receive posted
    /// directly, its responder CQE read directly.
    #[arg(long = "write_with_imm")]
    pub write_with_imm: bool,

    /// Sleep on completion events instead of busy polling (perftest's `-e`): after a poll
    /// that finds nothing, arm the CQ (`ibv_req_notify_cq`), poll once more, then block in
    /// `ibv_get_cq_event` on its completion channel. Latency then includes the interrupt
    /// (or, on softnic, the channel's wake-up). Each side decides for itself. Not with
    /// write_lat (it waits for the peer's WRITE in memory, which raises no completion) or
    /// --direct / --compare_direct.
    #[arg(short = 'e', long = "events")]
    pub events: bool,

    /// Print one JSON document instead of the table.
    #[arg(long = "json")]
    pub json: bool,

    /// Write the latency distribution as an SVG histogram (log-scale latency axis).
    #[arg(long = "histogram", value_name = "FILE.svg")]
    pub histogram: Option<PathBuf>,

    /// Never draw the progress line (it is drawn only on a terminal, for runs over 2 s).
    #[arg(long = "no-progress")]
    pub no_progress: bool,
}

fn parse_duration_secs(s: &str) -> Result<f64, PerfError> {
    let v: f64 = s
        .parse()
        .map_err(|_| PerfError::Usage(format!("{s:?} is not a number of seconds")))?;
    if v.is_finite() && v > 0.0 && v <= 86_400.0 {
        Ok(v)
    } else {
        Err(PerfError::Usage(format!(
            "{s} s is out of range (0 < seconds <= 86400)"
        )))
    }
}

/// How long each size runs.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Amount {
    /// A fixed number of measured iterations.
    Iters(u64),
    /// A fixed time (seconds); the active side decides when it is over.
    Seconds(f64),
}

/// The validated parameters of a run, as both sides must agree on them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Params {
    /// The test.
    pub test: TestKind,
    /// Message sizes, in run order.
    pub sizes: Vec<u32>,
    /// Iterations or duration per size.
    pub amount: Amount,
    /// Warm-up iterations per size.
    pub warmup: u64,
    /// Requested inline threshold (`None`: the default for the test).
    pub inline_size: Option<u32>,
    /// Signal period of the bandwidth tests.
    pub cq_mod: u32,
    /// WRs per post.
    pub post_list: u32,
    /// Send queue depth.
    pub tx_depth: u32,
    /// Receive queue depth.
    pub rx_depth: u32,
    /// Atomic kind for `atomic_lat`.
    pub atomic: AtomicKind,
    /// The QPs' transport (`-c`).
    #[serde(default)]
    pub connection: Connection,
    /// QPs per side (`-q`).
    #[serde(default = "one_qp")]
    pub qps: u32,
    /// `write_lat --write_with_imm`: WRITEs with immediate, each side waiting for the
    /// receive completion the peer's raises.
    #[serde(default)]
    pub write_imm: bool,
}

impl Params {
    /// The test posts receives: SENDs, or WRITEs with immediate.
    pub fn uses_recv(&self) -> bool {
        self.test.uses_recv() || self.write_imm
    }
}

fn one_qp() -> u32 {
    1
}

impl Args {
    /// Checks what clap cannot and derives the run's parameters.
    pub fn params(&self) -> Result<Params, PerfError> {
        let test = self.test;
        if self.timestamps
            && !matches!(
                test,
                TestKind::SendLat | TestKind::ReadLat | TestKind::AtomicLat
            )
        {
            return Err(PerfError::Usage(format!(
                "--timestamps times latency iterations by their completions: send_lat, \
                 read_lat and atomic_lat have one per iteration, {test} does not"
            )));
        }
        if self.compare_direct
            && (self.direct
                || self.timestamps
                || self.use_old_post_send
                || self.json
                || self.histogram.is_some())
        {
            return Err(PerfError::Usage(
                "--compare_direct runs the verbs path and then --direct and prints both \
                 tables: drop --direct / --timestamps / --use_old_post_send / --json / \
                 --histogram (or run one path with --direct alone)"
                    .into(),
            ));
        }
        match (self.connection, test) {
            (Connection::Rc, _)
            | (Connection::Uc, TestKind::SendLat | TestKind::WriteLat | TestKind::WriteBw)
            | (Connection::Ud, TestKind::SendLat) => {}
            (c, _) => {
                return Err(PerfError::Usage(format!(
                    "{test} is not offered over {}: {}",
                    c.name(),
                    if c == Connection::Ud {
                        "UD carries SENDs only, and its bandwidth test needs a flow control \
                         it does not have; run send_lat -c UD, or -c RC"
                    } else {
                        "UC has no READ or atomics, and send_bw needs a flow control it does \
                         not have; run send_lat, write_lat or write_bw -c UC, or -c RC"
                    }
                )));
            }
        }
        if self.connection == Connection::Ud && self.all {
            return Err(PerfError::Usage(
                "-a runs up to 8 MiB and a UD message fits one MTU: give the size with -s".into(),
            ));
        }
        if self.connection == Connection::Ud && (self.direct || self.compare_direct) {
            return Err(PerfError::Usage(
                "--direct runs over RC or UC (a UD direct ring carries an address handle this \
                 tool does not build): use -c RC or -c UC, or drop --direct / --compare_direct"
                    .into(),
            ));
        }
        if self.write_with_imm && test != TestKind::WriteLat {
            return Err(PerfError::Usage(format!(
                "--write_with_imm makes write_lat wait for a receive completion instead of \
                 memory; {test} does not WRITE that way: drop --write_with_imm or run \
                 write_lat"
            )));
        }
        if self.events && test == TestKind::WriteLat && !self.write_with_imm {
            return Err(PerfError::Usage(
                "--events sleeps on completions, and write_lat waits for the peer's WRITE in \
                 memory, which raises none: drop -e, or measure event-driven latency with \
                 send_lat"
                    .into(),
            ));
        }
        if self.events && (self.direct || self.compare_direct) {
            return Err(PerfError::Usage(
                "--events arms the CQ through the verbs path, and --direct reads the send CQ \
                 behind it: drop -e or --direct / --compare_direct"
                    .into(),
            ));
        }
        if self.qps > 1 && test.is_latency() {
            return Err(PerfError::Usage(format!(
                "-q {}: {test} is a latency test, one operation in flight on one QP; several \
                 QPs sharing a CQ measure aggregate bandwidth and message rate: drop -q, or \
                 run send_bw, write_bw or read_bw -q {}",
                self.qps, self.qps
            )));
        }
        if self.qps > crate::engine::DIRECT_MAX_QPS && (self.direct || self.compare_direct) {
            return Err(PerfError::Usage(format!(
                "-q {}: --direct reads the send CQ of at most {} QPs (one DirectPoller); \
                 lower -q to {} or drop --direct",
                self.qps,
                crate::engine::DIRECT_MAX_QPS,
                crate::engine::DIRECT_MAX_QPS
            )));
        }
        if let (Some(n), true) = (self.iters, self.qps > 1) {
            if n < self.qps as u64 {
                return Err(PerfError::Usage(format!(
                    "-n {n} counts messages over all QPs, and each of the -q {} QPs ends the \
                     stream with one of its own: use -n {} or more",
                    self.qps, self.qps
                )));
            }
        }
        if self.direct && (self.timestamps || self.use_old_post_send) {
            return Err(PerfError::Usage(
                "--direct is its own post path (mlx5 WQEs written directly): drop \
                 --timestamps / --use_old_post_send"
                    .into(),
            ));
        }
        let sizes = if self.all {
            let mut v = Vec::new();
            let mut s = 2u32;
            while s <= MAX_ALL_SIZE {
                v.push(s);
                s *= 2;
            }
            v
        } else {
            let default = if test.is_latency() { 2 } else { 65536 };
            vec![self.size.unwrap_or(default)]
        };
        for &s in &sizes {
            if s == 0 {
                return Err(PerfError::Usage(
                    "message size 0 is not supported: use -s 1 or more".into(),
                ));
            }
            if s > 1 << 30 {
                return Err(PerfError::Usage(format!(
                    "message size {s} is larger than 1 GiB: use a smaller -s"
                )));
            }
        }
        if test == TestKind::AtomicLat {
            if let Some(s) = self.size.filter(|&s| s != 8) {
                return Err(PerfError::Usage(format!(
                    "atomic_lat moves 8 bytes, not {s}: drop -s or use -s 8"
                )));
            }
        }
        let sizes = if test == TestKind::AtomicLat {
            vec![8]
        } else {
            sizes
        };
        let amount = match (self.iters, self.duration) {
            (Some(n), _) => Amount::Iters(n),
            (None, Some(d)) => Amount::Seconds(d),
            (None, None) => Amount::Iters(if test.is_latency() { 1000 } else { 5000 }),
        };
        if self.post_list > self.tx_depth {
            return Err(PerfError::Usage(format!(
                "post list -l {} exceeds the send queue depth -t {}: lower -l or raise -t",
                self.post_list, self.tx_depth
            )));
        }
        if !test.is_latency() && self.cq_mod > self.tx_depth {
            return Err(PerfError::Usage(format!(
                "signal period -Q {} exceeds the send queue depth -t {}: no completion would \
                 ever free the queue; lower -Q or raise -t",
                self.cq_mod, self.tx_depth
            )));
        }
        if self.port == 0 && self.host.is_some() {
            return Err(PerfError::Usage(
                "-p 0 lets a server pick a free port: give the client the port the server \
                 printed"
                    .into(),
            ));
        }
        if self.tx_depth > 4096 || self.rx_depth > 4096 {
            return Err(PerfError::Usage(
                "queue depths above 4096 are not supported: lower -t / -r".into(),
            ));
        }
        if !test.is_latency() && self.cq_mod > (self.tx_depth / 2).max(1) {
            return Err(PerfError::Usage(format!(
                "signal period -Q {} exceeds half the send queue depth -t {}: a signaled WR \
                 must always be in flight before the queue fills; lower -Q or raise -t",
                self.cq_mod, self.tx_depth
            )));
        }
        Ok(Params {
            test,
            sizes,
            amount,
            warmup: self.warmup,
            inline_size: self.inline_size,
            cq_mod: self.cq_mod,
            post_list: self.post_list,
            tx_depth: self.tx_depth,
            rx_depth: self.rx_depth,
            atomic: self.atomic,
            connection: self.connection,
            qps: self.qps,
            write_imm: self.write_with_imm,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("hotverbs-perf").chain(args.iter().copied()))
    }

    #[test]
    fn post_path_and_timestamp_flags() {
        let a = parse(&["send_lat"]).unwrap();
        assert!(
            !a.use_old_post_send && !a.timestamps,
            "extended path by default"
        );
        let a = parse(&["send_lat", "--use_old_post_send", "--timestamps"]).unwrap();
        assert!(a.use_old_post_send && a.timestamps);
        assert!(a.params().is_ok());
        for t in ["read_lat", "atomic_lat"] {
            assert!(parse(&[t, "--timestamps"]).unwrap().params().is_ok(), "{t}");
        }
        for t in ["write_lat", "send_bw", "write_bw", "read_bw"] {
            let e = parse(&[t, "--timestamps"]).unwrap().params().unwrap_err();
            assert!(e.to_string().contains("--timestamps"), "{t}: {e}");
        }
    }

    #[test]
    fn perftest_letters_parse() {
        let a = parse(&[
            "write_bw", "10.0.0.1", "-d", "rxe0", "-x", "1", "-s", "4096", "-n", "77", "-I", "64",
            "-Q", "8", "-l", "4", "-t", "64", "-r", "32", "-p", "20000",
        ])
        .unwrap();
        assert_eq!(a.test, TestKind::WriteBw);
        assert_eq!(a.host.as_deref(), Some("10.0.0.1"));
        assert_eq!(a.device.as_deref(), Some("rxe0"));
        assert_eq!(a.gid_index, Some(1));
        let p = a.params().unwrap();
        assert_eq!(p.sizes, vec![4096]);
        assert_eq!(p.amount, Amount::Iters(77));
        assert_eq!(
            (p.cq_mod, p.post_list, p.tx_depth, p.rx_depth),
            (8, 4, 64, 32)
        );
        assert_eq!(p.inline_size, Some(64));
        assert_eq!(a.port, 20000);
    }

    #[test]
    fn defaults_follow_perftest() {
        let lat = parse(&["send_lat"]).unwrap().params().unwrap();
        assert_eq!(lat.sizes, vec![2]);
        assert_eq!(lat.amount, Amount::Iters(1000));
        let bw = parse(&["send_bw"]).unwrap().params().unwrap();
        assert_eq!(bw.sizes, vec![65536]);
        assert_eq!(bw.amount, Amount::Iters(5000));
        assert_eq!(parse(&["send_bw"]).unwrap().port, 18515);
    }

    #[test]
    fn all_sizes_are_powers_of_two_to_8mib() {
        let p = parse(&["read_lat", "-a"]).unwrap().params().unwrap();
        assert_eq!(p.sizes.first(), Some(&2));
        assert_eq!(p.sizes.last(), Some(&(8 << 20)));
        assert_eq!(p.sizes.len(), 23);
        assert!(p.sizes.windows(2).all(|w| w[1] == 2 * w[0]));
    }

    #[test]
    fn atomics_are_eight_bytes() {
        assert_eq!(
            parse(&["atomic_lat"]).unwrap().params().unwrap().sizes,
            vec![8]
        );
        assert_eq!(
            parse(&["atomic_lat", "-a"])
                .unwrap()
                .params()
                .unwrap()
                .sizes,
            vec![8]
        );
        let e = parse(&["atomic_lat", "-s", "64"])
            .unwrap()
            .params()
            .unwrap_err();
        assert!(e.to_string().contains("8 bytes"), "{e}");
    }

    #[test]
    fn bad_arguments_are_rejected_with_reasons() {
        assert!(parse(&["sned_lat"]).is_err());
        assert!(parse(&["send_lat", "-n", "0"]).is_err());
        assert!(parse(&["send_lat", "-n", "abc"]).is_err());
        assert!(parse(&["send_lat", "-s", "8", "-a"]).is_err());
        assert!(parse(&["send_lat", "-n", "5", "-D", "1"]).is_err());
        assert!(parse(&["send_lat", "-D", "-1"]).is_err());
        assert!(parse(&["send_lat", "--loopback", "host"]).is_err());
        let e = parse(&["send_lat", "-s", "0"])
            .unwrap()
            .params()
            .unwrap_err();
        assert!(e.to_string().contains("size 0"), "{e}");
        let e = parse(&["send_bw", "-l", "64", "-t", "16"])
            .unwrap()
            .params()
            .unwrap_err();
        assert!(e.to_string().contains("-l 64"), "{e}");
        let e = parse(&["send_bw", "-Q", "64", "-t", "16"])
            .unwrap()
            .params()
            .unwrap_err();
        assert!(e.to_string().contains("-Q 64"), "{e}");
        let e = parse(&["send_lat", "host", "-p", "0"])
            .unwrap()
            .params()
            .unwrap_err();
        assert!(e.to_string().contains("-p 0"), "{e}");
        assert!(parse(&["send_lat", "-p", "0"]).unwrap().params().is_ok());
    }

    #[test]
    fn duration_mode() {
        let p = parse(&["send_bw", "-D", "2.5"]).unwrap().params().unwrap();
        assert_eq!(p.amount, Amount::Seconds(2.5));
    }
}
