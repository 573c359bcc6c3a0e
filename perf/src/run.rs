//! The three ways to run: loopback (both sides in this process), server, client. Each
//! builds its side(s), then runs every size and hands results to the [`Output`].

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hotverbs::{LinkLayer, SOFTNIC};

use crate::cli::{Amount, Args, Params, TestKind};
use crate::control::{Control, Msg};
use crate::engine::{self, Engine, Measured};
use crate::error::PerfError;
use crate::progress::{Counter, Goal, Progress};
use crate::report::{self, Role, RunInfo, SizeResult};
use crate::setup::{self, Device, SideRes};
use crate::stats::{LatencySummary, Throughput};
use crate::svg;

/// The one line printed when the embedded default is used.
pub const FALLBACK_NOTE: &str = "hotverbs-perf: no RDMA device found: running loopback on \
softnic, hotverbs' in-process software device (name a device with -d for a real run)";

/// [`FALLBACK_NOTE`] for `--direct` / `--compare_direct`, which need a ConnectX: the
/// fallback is softnic's simulated one.
pub const FALLBACK_DIRECT_NOTE: &str = "hotverbs-perf: no RDMA device found: running loopback \
on softnic_mlx5, softnic's simulated ConnectX, for the mlx5 direct path (it shows the path \
working; the times are the simulator's; name a ConnectX with -d for a real run)";

/// What a server started with `-p 0` prints on stderr, followed by the port it listens on,
/// once it listens: a client started after this line connects at the first try.
pub const LISTENING: &str = "hotverbs-perf: listening on TCP port ";

/// How the loopback sides run (shown in the header and `--json`).
pub const LOOPBACK_NOTE: &str = "loopback: two QPs in this process connected to each other; \
the passive side runs on its own thread and both busy-poll, as two hosts would";

/// [`LOOPBACK_NOTE`] with `--events`.
pub const LOOPBACK_EVENTS_NOTE: &str = "loopback: two QPs in this process connected to each \
other; the passive side runs on its own thread and both sleep on completion events (-e)";

/// The note of a run on `softnic_mlx5`, softnic's simulated ConnectX.
pub const SIM_NOTE: &str = "softnic_mlx5 simulates a ConnectX in this process (the WQEs the \
direct path writes are parsed and executed by softnic at each poll): it shows the direct path \
working, not its speed; the times are the simulator's";

/// Where results go: the table as sizes finish, or one JSON document at the end; and the
/// latency samples for `--histogram`.
struct Output<'a> {
    args: &'a Args,
    results: Vec<SizeResult>,
    samples: Vec<(u32, Vec<(f64, u64)>)>,
}

impl<'a> Output<'a> {
    fn new(args: &'a Args) -> Self {
        Output {
            args,
            results: Vec::new(),
            samples: Vec::new(),
        }
    }

    fn header(&self, p: &Params, info: &RunInfo) {
        if !self.args.json {
            print!("{}", report::header(p, info));
            let _ = std::io::stdout().flush();
        }
    }

    fn size_done(&mut self, p: &Params, r: SizeResult, points: Option<Vec<(f64, u64)>>) {
        if !self.args.json {
            print!("{}", report::row(p.test, &r));
            if let Some(n) = report::nic_row(&r) {
                print!("{n}");
            }
            if let Some(q) = report::qp_row(&r) {
                print!("{q}");
            }
            let _ = std::io::stdout().flush();
        }
        if let Some(pts) = points {
            self.samples.push((r.bytes, pts));
        }
        self.results.push(r);
    }

    fn finish(self, p: &Params, info: &RunInfo) -> Result<Vec<SizeResult>, PerfError> {
        if self.args.json {
            let v = report::json(p, info, &self.results);
            let doc = serde_json::to_string_pretty(&v).map_err(|e| PerfError::Json {
                what: "encode the --json document".into(),
                source: e,
            })?;
            println!("{doc}");
        } else {
            print!("{}", report::footer());
        }
        if let Some(path) = &self.args.histogram {
            let series: Vec<svg::Series<'_>> = self
                .samples
                .iter()
                .map(|(b, pts)| svg::Series {
                    label: format!("{b} B"),
                    points: pts,
                })
                .collect();
            let markers: Vec<(&str, f64)> = match self.results.first().and_then(|r| r.latency) {
                Some(l) if self.results.len() == 1 => {
                    vec![
                        ("p50", l.p50),
                        ("p99", l.p99),
                        ("p99.9", l.p999),
                        ("max", l.max),
                    ]
                }
                _ => Vec::new(),
            };
            let what = if p.test.is_ping_pong() {
                "half round trip"
            } else {
                "operation latency"
            };
            let title = format!(
                "hotverbs-perf {} on {} ({}): {what}",
                p.test,
                info.device,
                info.role.name()
            );
            let doc = svg::render(&title, &series, &markers).ok_or_else(|| {
                PerfError::Internal("no latency samples to draw for --histogram".into())
            })?;
            std::fs::write(path, doc)
                .map_err(|e| PerfError::io(format!("write --histogram {}", path.display()), e))?;
            if !self.args.json {
                println!(" latency histogram written to {}", path.display());
            }
        }
        Ok(self.results)
    }
}

fn result_of(size: u32, m: &Measured) -> (SizeResult, Option<Vec<(f64, u64)>>) {
    let latency: Option<LatencySummary> = m.latency.as_ref().and_then(|l| l.summary());
    let r = SizeResult {
        bytes: size,
        iterations: m.iterations,
        latency,
        nic_latency: m.nic_latency.as_ref().and_then(|l| l.summary()),
        throughput: Throughput::new(size as u64, m.iterations, m.elapsed),
        per_qp: m.per_qp.clone(),
    };
    (r, m.latency.as_ref().map(|l| l.points()))
}

fn goal(p: &Params) -> Goal {
    match p.amount {
        Amount::Iters(n) => Goal::Iters(n),
        Amount::Seconds(s) => Goal::Time(Duration::from_secs_f64(s)),
    }
}

fn progress_enabled(args: &Args) -> bool {
    !args.no_progress && std::io::stderr().is_terminal()
}

/// Does the passive side of `t` do anything (answer pings, consume SENDs)?
pub(crate) fn passive_works(t: TestKind) -> bool {
    t.is_ping_pong() || t == TestKind::SendBw
}

/// Runs what `args` asks for.
pub fn run(args: &Args) -> Result<(), PerfError> {
    let params = args.params()?;
    crate::clock::init(args.clock);
    if args.histogram.is_some() && !params.test.is_latency() {
        return Err(PerfError::Usage(format!(
            "--histogram draws latency distributions, and {} is a bandwidth test: use it with a \
             *_lat test",
            params.test
        )));
    }
    let timeout = Duration::from_secs_f64(args.timeout);
    let mut choice = setup::choose(args.device.as_deref());
    let direct = args.direct || args.compare_direct;
    if choice.fallback && direct {
        choice.device = hotverbs::SOFTNIC_MLX5.to_string();
    }
    let softnic = choice.device == SOFTNIC || choice.device == hotverbs::SOFTNIC_MLX5;
    let role = if args.host.is_some() {
        Role::Client
    } else if args.loopback || softnic {
        Role::Loopback
    } else {
        Role::Server
    };
    if role == Role::Server && args.histogram.is_some() {
        return Err(PerfError::Usage(
            "the client measures latency: pass --histogram to the client, not the server".into(),
        ));
    }
    if role == Role::Client {
        // Connect first: an unreachable server is reported before anything else, and a
        // failure to set up the device afterwards is reported to the server too.
        let host = args.host.as_deref().unwrap_or("localhost");
        let mut ctl = Control::connect(host, args.port, timeout)?;
        let r = if softnic {
            Err(PerfError::Usage(format!(
                "{} (device {}): softnic lives inside one process and cannot reach a server on \
                 {host}: name an RDMA device with -d, or run without a host for loopback on \
                 softnic",
                if choice.fallback {
                    "no RDMA device found"
                } else {
                    "the client needs an RDMA device"
                },
                choice.device
            )))
        } else {
            open_device(args, &choice.device)
                .and_then(|dev| measure(args, &params, &dev, timeout, &mut ctl))
        };
        if let Err(e) = &r {
            ctl.fail(&e.to_string());
        }
        return r.map(drop);
    }
    if args.compare_direct {
        if role != Role::Loopback {
            return Err(PerfError::Usage(
                "--compare_direct runs both sides in this process: add --loopback (no \
                 server, no client)"
                    .into(),
            ));
        }
        if choice.fallback {
            eprintln!("{FALLBACK_DIRECT_NOTE}");
        }
        return compare_direct(args, &params, &choice.device, timeout);
    }
    if choice.fallback {
        eprintln!(
            "{}",
            if direct {
                FALLBACK_DIRECT_NOTE
            } else {
                FALLBACK_NOTE
            }
        );
    }
    let dev = open_device(args, &choice.device)?;
    match role {
        Role::Server => server(args, &params, &dev, timeout),
        _ => loopback(args, &params, &dev, timeout),
    }
    .map(drop)
}

/// `--compare_direct`: the test in loopback through the verbs path, then through the mlx5
/// direct path, on the same device; both tables, then the comparison.
fn compare_direct(args: &Args, p: &Params, name: &str, timeout: Duration) -> Result<(), PerfError> {
    let dev = open_device(args, name)?.with_direct(false);
    if !dev.ctx.is_mlx5() {
        return Err(PerfError::Usage(format!(
            "--compare_direct compares the verbs path with --direct, which writes mlx5 \
             (ConnectX) WQEs, and {} is not an mlx5 device: drop --compare_direct (or see \
             both paths run on softnic's simulated ConnectX with -d softnic_mlx5)",
            dev.name()
        )));
    }
    // Both passes with the direct path's inline default (send_bw's fixed-size post list
    // sends inline), so that they compare like with like.
    let p = &Params {
        inline_size: Some(
            p.inline_size
                .unwrap_or_else(|| setup::default_inline(p, true)),
        ),
        ..p.clone()
    };
    println!(" post path 1 of 2: verbs");
    let verbs = loopback(args, p, &dev, timeout)?;
    drop(dev);
    println!(" post path 2 of 2: --direct");
    let dev = open_device(args, name)?.with_direct(true);
    let direct = loopback(args, p, &dev, timeout)?;
    print!("{}", comparison(p, &verbs, &direct));
    Ok(())
}

/// The per-size comparison of `--compare_direct`: median latency (latency tests) or
/// messages per second (bandwidth tests), each path, and direct / verbs.
fn comparison(p: &Params, verbs: &[SizeResult], direct: &[SizeResult]) -> String {
    let lat = p.test.is_latency();
    let mut s = String::new();
    s.push_str(" direct vs verbs (same test, same device, one process):\n");
    s.push_str(if lat {
        " #bytes   verbs t_median[usec]   direct t_median[usec]   direct/verbs\n"
    } else {
        " #bytes   verbs MsgRate[Mpps]   direct MsgRate[Mpps]   direct/verbs\n"
    });
    for (v, d) in verbs.iter().zip(direct) {
        let (a, b) = if lat {
            (
                v.latency.as_ref().map_or(f64::NAN, |l| l.p50),
                d.latency.as_ref().map_or(f64::NAN, |l| l.p50),
            )
        } else {
            (v.throughput.mpps, d.throughput.mpps)
        };
        s.push_str(&format!(
            " {:<8} {:>20.3}   {:>21.3}   {:>12.3}\n",
            v.bytes,
            a,
            b,
            b / a
        ));
    }
    s
}

/// Opens the device with the run's post path and completion options.
fn open_device(args: &Args, name: &str) -> Result<Device, PerfError> {
    Ok(Device::open(name, args.ib_port, args.gid_index)?
        .with_paths(args.use_old_post_send, args.timestamps)
        .with_direct(args.direct)
        .with_events(args.events))
}

fn info(
    args: &Args,
    p: &Params,
    dev: &Device,
    role: Role,
    hot: &dyn Engine,
    note: Option<&str>,
) -> RunInfo {
    RunInfo {
        register: hot.register_use(),
        direct_paths: p
            .sizes
            .iter()
            .filter_map(|&s| hot.direct_path(p, s).map(|d| (s, d)))
            .collect(),
        device: dev.name().to_string(),
        ib_port: dev.port.port,
        gid_index: dev.port.gid_index.map(|g| g as u8).or(args.gid_index),
        mtu: dev.mtu(),
        link_layer: match dev.port.link_layer {
            LinkLayer::Ethernet => "Ethernet",
            _ => "IB",
        }
        .to_string(),
        role,
        inline_size: hot.max_inline(),
        signal_every: hot.signal_every(),
        clock: hot.clock().describe(),
        note: note.map(str::to_string),
        post_path: hot.post_path().to_string(),
        events: hot.sleeps_on_events(),
        nic_clock: hot.timestamp_clock().map(|c| {
            let (ns, cycles) = c.rate();
            format!(
                "completion timestamps, {:.1} MHz (mask {:#x})",
                cycles as f64 * 1e3 / ns.max(1) as f64,
                c.mask()
            )
        }),
    }
}

fn loopback(
    args: &Args,
    p: &Params,
    dev: &Device,
    timeout: Duration,
) -> Result<Vec<SizeResult>, PerfError> {
    let mut a = SideRes::new(dev, p)?;
    let mut b = SideRes::new(dev, p)?;
    let (ea, eb) = (a.endpoints(dev, p), b.endpoints(dev, p));
    a.connect(dev, &eb)?;
    b.connect(dev, &ea)?;
    // SAFETY: a and b (QPs, CQs, MR) outlive the engines (dropped at the end of this
    // function, after them); each CQ is polled by its engine only; QPs were built by
    // SideRes::new with sq_sig_all = 0 and the depths the engine needs, and are in RTS.
    let mut ha = unsafe { engine::build(a.side(&eb)?, p, timeout, a.events())? };
    // SAFETY: as above, for side b.
    let mut hb = unsafe { engine::build(b.side(&ea)?, p, timeout, b.events())? };
    let mut note = if dev.events {
        LOOPBACK_EVENTS_NOTE
    } else {
        LOOPBACK_NOTE
    }
    .to_string();
    if dev.name() == hotverbs::SOFTNIC_MLX5 {
        note = format!("{note}; {SIM_NOTE}");
    }
    let info = info(args, p, dev, Role::Loopback, &*ha, Some(&note));
    let mut out = Output::new(args);
    out.header(p, &info);
    for &size in &p.sizes {
        ha.clear_landing();
        hb.clear_landing();
        let abort = AtomicBool::new(false);
        let counter = Counter::default();
        let progress = Progress::start(
            progress_enabled(args),
            format!("{} {size} B", p.test),
            goal(p),
            counter.clone(),
        );
        let (active, passive) = std::thread::scope(|s| {
            let h = passive_works(p.test).then(|| {
                let (hb, abort) = (&mut hb, &abort);
                std::thread::Builder::new()
                    .name("passive".into())
                    .spawn_scoped(s, move || {
                        let r = hb.passive(p, size, abort);
                        if r.is_err() {
                            abort.store(true, Ordering::Relaxed);
                        }
                        r
                    })
            });
            let m = ha.active(p, size, &counter, &abort);
            if m.is_err() {
                abort.store(true, Ordering::Relaxed);
            }
            let pr = match h {
                None => Ok(0),
                Some(Err(e)) => Err(PerfError::io("spawn the passive thread", e)),
                Some(Ok(h)) => h.join().unwrap_or_else(|_| {
                    Err(PerfError::Internal("the passive thread panicked".into()))
                }),
            };
            (m, pr)
        });
        progress.finish();
        // The root cause first: a side that stopped because the other failed says so.
        let m = match (active, passive) {
            (Ok(m), Ok(_)) => m,
            (Err(a), Ok(_)) => return Err(a),
            (Ok(_), Err(b)) => return Err(PerfError::Passive(Box::new(b))),
            (Err(PerfError::Aborted), Err(b)) => return Err(PerfError::Passive(Box::new(b))),
            (Err(a), Err(_)) => return Err(a),
        };
        ha.settle()?;
        hb.settle()?;
        let (r, pts) = result_of(size, &m);
        out.size_done(p, r, pts);
    }
    out.finish(p, &info)
}

fn server(
    args: &Args,
    ours: &Params,
    dev: &Device,
    timeout: Duration,
) -> Result<Vec<SizeResult>, PerfError> {
    if !args.json {
        println!(
            "************************************\n* Waiting for client to connect... *\n************************************"
        );
    }
    let listener = Control::listen(args.port)?;
    if args.port == 0 {
        // The kernel picked the port: the client (or the script starting it) needs it.
        let port = listener
            .local_addr()
            .map_err(|e| PerfError::io("the port the kernel picked for -p 0", e))?
            .port();
        eprintln!("{LISTENING}{port}");
    }
    let mut ctl = Control::accept_on(
        &listener,
        Duration::from_secs_f64(args.server_wait),
        timeout,
    )?;
    let r = serve(args, ours, dev, timeout, &mut ctl);
    if let Err(e) = &r {
        ctl.fail(&e.to_string());
    }
    r
}

/// How long a passive server waits for the client to finish a size.
fn size_wait(p: &Params, timeout: Duration) -> Duration {
    match p.amount {
        Amount::Seconds(s) => Duration::from_secs_f64(s) + timeout * 2,
        // Unknown length: bounded anyway (a dead client closes the socket long before).
        Amount::Iters(_) => Duration::from_secs(3600).max(timeout),
    }
}

fn serve(
    args: &Args,
    ours: &Params,
    dev: &Device,
    timeout: Duration,
    ctl: &mut Control,
) -> Result<Vec<SizeResult>, PerfError> {
    let p = ctl.welcome(ours)?;
    let mut res = SideRes::new(dev, &p)?;
    let theirs = ctl.exchange_all(&res.endpoints(dev, &p))?;
    res.connect(dev, &theirs)?;
    // SAFETY: res outlives hot (declared before it, dropped after); the CQ is polled by
    // hot only; the QPs were built for these parameters and are in RTS.
    let mut hot = unsafe { engine::build(res.side(&theirs)?, &p, timeout, res.events())? };
    let info = info(args, &p, dev, Role::Server, &*hot, None);
    let mut out = Output::new(args);
    out.header(&p, &info);
    let abort = AtomicBool::new(false);
    for (i, &size) in p.sizes.iter().enumerate() {
        hot.clear_landing();
        ctl.barrier(i)?;
        hot.passive(&p, size, &abort)?;
        ctl.set_read_timeout(size_wait(&p, timeout))?;
        let r = ctl.expect(&format!("SizeDone({i})"), |m| match m {
            Msg::SizeDone(j, r) if j == i => Ok(r),
            m => Err(Box::new(m)),
        })?;
        ctl.set_read_timeout(timeout)?;
        hot.settle()?;
        out.size_done(&p, r, None);
    }
    out.finish(&p, &info)
}

fn measure(
    args: &Args,
    p: &Params,
    dev: &Device,
    timeout: Duration,
    ctl: &mut Control,
) -> Result<Vec<SizeResult>, PerfError> {
    ctl.hello(p)?;
    let mut res = SideRes::new(dev, p)?;
    let theirs = ctl.exchange_all(&res.endpoints(dev, p))?;
    res.connect(dev, &theirs)?;
    // SAFETY: as in serve().
    let mut hot = unsafe { engine::build(res.side(&theirs)?, p, timeout, res.events())? };
    let info = info(args, p, dev, Role::Client, &*hot, None);
    let mut out = Output::new(args);
    out.header(p, &info);
    let abort = AtomicBool::new(false);
    for (i, &size) in p.sizes.iter().enumerate() {
        hot.clear_landing();
        ctl.barrier(i)?;
        let counter = Counter::default();
        let progress = Progress::start(
            progress_enabled(args),
            format!("{} {size} B", p.test),
            goal(p),
            counter.clone(),
        );
        let m = hot.active(p, size, &counter, &abort);
        progress.finish();
        let m = m?;
        let (r, pts) = result_of(size, &m);
        ctl.send(&Msg::SizeDone(i, r.clone()))?;
        hot.settle()?;
        out.size_done(p, r, pts);
    }
    out.finish(p, &info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::net::TcpListener;

    fn args(v: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("hotverbs-perf").chain(v.iter().copied())).unwrap()
    }

    fn size_result(bytes: u32, p50: f64, mpps: f64) -> SizeResult {
        SizeResult {
            bytes,
            iterations: 1000,
            latency: Some(LatencySummary {
                min: p50,
                p50,
                p90: p50,
                p99: p50,
                p999: p50,
                max: p50,
                avg: p50,
                stdev: 0.0,
            }),
            nic_latency: None,
            throughput: Throughput {
                seconds: 1.0,
                mib_per_s: 0.0,
                gbps: 0.0,
                mpps,
            },
            per_qp: Vec::new(),
        }
    }

    /// `--compare_direct`'s table: one row per size, each path's median (latency tests)
    /// or message rate (bandwidth tests) and direct / verbs.
    #[test]
    fn compare_direct_rows_are_per_size_ratios() {
        let verbs = [size_result(2, 2.0, 4.0), size_result(64, 3.0, 2.0)];
        let direct = [size_result(2, 1.5, 6.0), size_result(64, 2.7, 3.0)];
        let lat = comparison(&args(&["send_lat"]).params().unwrap(), &verbs, &direct);
        let rows: Vec<Vec<&str>> = lat
            .lines()
            .skip(2)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows,
            [
                ["2", "2.000", "1.500", "0.750"],
                ["64", "3.000", "2.700", "0.900"]
            ],
            "{lat}"
        );
        assert!(lat.contains("t_median"), "{lat}");
        let bw = comparison(&args(&["send_bw"]).params().unwrap(), &verbs, &direct);
        assert!(bw.contains("MsgRate[Mpps]"), "{bw}");
        assert!(bw.lines().nth(2).unwrap().ends_with("1.500"), "{bw}");
    }

    /// The client/server path (handshake, endpoint exchange, barriers, results) with both
    /// roles in this process on softnic, whose objects are process-wide, over 127.0.0.1.
    #[test]
    fn server_and_client_roles_agree_on_softnic() {
        for test in [
            "send_lat",
            "write_lat",
            "read_lat",
            "atomic_lat",
            "send_bw",
            "write_bw",
            "read_bw",
        ] {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port().to_string();
            let mut common = vec![test, "-d", "softnic", "-n", "64", "--json", "--no-progress"];
            // A size above the inline limit (zero-copy); `-a` would register 256 MiB of
            // receive slots per side for the SEND tests.
            if test != "atomic_lat" {
                common.extend(["-s", "4096"]);
            }
            let t = Duration::from_secs(10);
            let sa = args(&[common.as_slice(), &["-p", &port]].concat());
            let srv = std::thread::spawn(move || {
                let dev = Device::open(SOFTNIC, 1, None)?;
                let mut ctl = Control::accept_on(&l, t, t)?;
                let p = sa.params()?;
                let r = serve(&sa, &p, &dev, t, &mut ctl);
                if let Err(e) = &r {
                    ctl.fail(&e.to_string());
                }
                r
            });
            let ca = args(&[common.as_slice(), &["127.0.0.1", "-p", &port]].concat());
            let dev = Device::open(SOFTNIC, 1, None).unwrap();
            let mut ctl = Control::connect("127.0.0.1", ca.port, t).unwrap();
            let p = ca.params().unwrap();
            let client = measure(&ca, &p, &dev, t, &mut ctl).unwrap();
            let server = srv.join().unwrap().unwrap();
            assert_eq!(client.len(), p.sizes.len(), "{test}");
            assert_eq!(
                server, client,
                "{test}: the server reports the client's results"
            );
            assert!(client.iter().all(|r| r.iterations >= 64), "{test}");
        }
    }

    /// `-q` between two processes: the client's QP count rules, every QP's endpoint goes
    /// through the exchange, and both roles report the same per-QP counts.
    #[test]
    fn server_and_client_run_several_qps() {
        for test in ["send_bw", "write_bw", "read_bw"] {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port().to_string();
            let t = Duration::from_secs(10);
            let srv = std::thread::spawn(move || {
                // The server's own -q is the default (1): the client's parameters rule.
                let sa = args(&[test, "-d", "softnic", "--json", "--no-progress"]);
                let dev = Device::open(SOFTNIC, 1, None)?;
                let mut ctl = Control::accept_on(&l, t, t)?;
                serve(&sa, &sa.params()?, &dev, t, &mut ctl)
            });
            let ca = args(&[
                test,
                "127.0.0.1",
                "-p",
                &port,
                "-d",
                "softnic",
                "-q",
                "3",
                "-n",
                "300",
                "-s",
                "1024",
                "--json",
                "--no-progress",
            ]);
            let dev = Device::open(SOFTNIC, 1, None).unwrap();
            let mut ctl = Control::connect("127.0.0.1", ca.port, t).unwrap();
            let client = measure(&ca, &ca.params().unwrap(), &dev, t, &mut ctl).unwrap();
            let server = srv.join().unwrap().unwrap();
            assert_eq!(server, client, "{test}");
            let per_qp = &client[0].per_qp;
            assert_eq!(per_qp.len(), 3, "{test}");
            assert!(per_qp.iter().all(|&c| c > 0), "{test}: {per_qp:?}");
            assert_eq!(per_qp.iter().sum::<u64>(), 300, "{test}: {per_qp:?}");
        }
    }

    #[test]
    fn a_server_refuses_another_test() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = Duration::from_secs(5);
        let srv = std::thread::spawn(move || {
            let sa = args(&["write_lat", "-d", "softnic", "--json"]);
            let dev = Device::open(SOFTNIC, 1, None)?;
            let mut ctl = Control::accept_on(&l, t, t)?;
            serve(&sa, &sa.params()?, &dev, t, &mut ctl)
        });
        let ca = args(&["send_lat", "-d", "softnic", "--json"]);
        let dev = Device::open(SOFTNIC, 1, None).unwrap();
        let mut ctl = Control::connect("127.0.0.1", port, t).unwrap();
        let e = measure(&ca, &ca.params().unwrap(), &dev, t, &mut ctl)
            .unwrap_err()
            .to_string();
        assert!(e.contains("refused") && e.contains("write_lat"), "{e}");
        assert!(srv.join().unwrap().is_err());
    }
}
