//! rdma-core's three pingpongs, as a hotverbs peer: `ibv_rc_pingpong`, `ibv_ud_pingpong`
//! and `ibv_srq_pingpong`, wire-compatible with each (same TCP exchange, same message
//! sizes and Q_Key, the same lockstep), so either side can be the C tool.
//!
//! ```text
//! cargo run -p hotverbs --example pingpong -- rc  -d rxe0 -g 1              # server
//! ibv_rc_pingpong -d rxe0 -g 1 127.0.0.1                                     # its client
//! cargo run -p hotverbs --example pingpong -- ud  -d rxe0 -g 1 127.0.0.1    # client
//! cargo run -p hotverbs --example pingpong -- srq -d rxe0 -g 1 -q 16 127.0.0.1
//! cargo run -p hotverbs --example pingpong -- ud --loopback                  # both, softnic
//! ```
//! Options, with the C tools' defaults: `-p` TCP port (18515), `-d` device (default:
//! `$HOTVERBS_DEVICE`, else the first real device), `-g` GID index (needed on RoCE), `-s`
//! message size (rc and srq 4096, ud 1024, at most the path MTU for ud), `-n` iterations
//! (1000), `-r` receive depth (500), `-q` QPs (srq, 16; both sides must agree: the count is
//! not exchanged), `-m` path MTU (1024). A host name makes this side the client.
//!
//! # The exchange (`hotverbs::exchange`)
//! The client sends one `ibv_rc_pingpong` line (`LID:QPN:PSN:GID`, 52 bytes), the server
//! answers with its own once its QP is connected, the client says `"done"`.
//! `ibv_srq_pingpong` sends 256 lines each way, one per QP then all zeros
//! ([`Session::pingpong_client_lines`]). Receives are posted before the exchange: the peer
//! may send as soon as it has our line, and a UD datagram without a receive is dropped.
//!
//! # The lockstep (the tools' own)
//! Per QP, a side sends only once its previous send completed and a message arrived; the
//! client sends first, on every QP. `-n` counts sends and receives over all QPs. Each
//! completion's QP is found by its `qp_num` (one CQ serves every QP, and with an SRQ a
//! receive says nothing else about its QP). A UD receive holds the 40-byte GRH area first,
//! so its buffer is `size + 40` and its `byte_len` is too.
//!
//! [`run`] is the whole program; `tests/real_device_pingpongs.rs` runs it against the C
//! tools in `cargo xtask rxe`, and against itself on softnic.

use std::error::Error as StdError;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use hotverbs::exchange::{Session, SRQ_PINGPONG_LINES};
use hotverbs::*;

type Res<T> = std::result::Result<T, Box<dyn StdError + Send + Sync>>;

/// Which tool this side speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Rc,
    Ud,
    Srq,
}

#[derive(Clone, Debug)]
pub struct Opts {
    pub mode: Mode,
    pub device: Option<String>,
    pub gid_index: Option<u32>,
    pub tcp_port: u16,
    pub size: usize,
    pub iters: usize,
    pub rx_depth: usize,
    pub num_qp: usize,
    pub mtu: Mtu,
    /// How long nothing may complete before the run fails (the C tools wait for ever).
    pub stall: Duration,
    /// Both sides are this program: at the end, wait for our own sends and meet the peer
    /// over TCP before tearing down (see [`run`]). The C tools just exit.
    pub barrier: bool,
}

impl Opts {
    pub fn new(mode: Mode) -> Opts {
        Opts {
            mode,
            device: None,
            gid_index: None,
            tcp_port: 18515,
            size: if mode == Mode::Ud { 1024 } else { 4096 },
            iters: 1000,
            rx_depth: 500,
            num_qp: if mode == Mode::Srq { 16 } else { 1 },
            mtu: Mtu::Mtu1024,
            stall: Duration::from_secs(60),
            barrier: false,
        }
    }
}

/// Who the other side is.
#[derive(Debug)]
pub enum Peer {
    /// We are the server: accept one client here.
    Accept(TcpListener),
    /// We are the client of `host:tcp_port`.
    Connect(String),
}

#[derive(Debug)]
pub struct Report {
    pub sent: usize,
    pub received: usize,
    pub elapsed: Duration,
}

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// The GRH area in front of every UD receive.
const GRH: usize = 40;

/// Runs one side to the end: exchange, `iters` sends and receives, the tools' lockstep.
pub fn run(o: &Opts, peer: Peer) -> Res<Report> {
    if o.mode != Mode::Srq && o.num_qp != 1 {
        return Err("-q is for srq only".into());
    }
    if o.num_qp == 0 || o.num_qp > o.rx_depth || o.num_qp >= SRQ_PINGPONG_LINES {
        return Err(format!(
            "-q {}: 1 to {} QPs, and no more than -r",
            o.num_qp,
            SRQ_PINGPONG_LINES - 1
        )
        .into());
    }
    let ctx = match &o.device {
        Some(d) => Context::open(d)?,
        None => Context::open_default()?,
    };
    let port = ctx.port_info(None, o.gid_index)?;
    if o.mode == Mode::Ud && o.size > port.active_mtu.bytes() as usize {
        return Err(format!(
            "-s {}: a UD message must fit the port's MTU ({})",
            o.size,
            port.active_mtu.bytes()
        )
        .into());
    }
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq((o.rx_depth + o.num_qp) as u32, None)?;
    // Receive slots (one per receive, so a message is never overwritten before it is
    // looked at) and the message we send; `size + 40` per UD slot. Made before the SRQ
    // and the QPs, so that those go first when `run` returns: no receive ever points into
    // a deregistered MR.
    let slot = if o.mode == Mode::Ud {
        o.size + GRH
    } else {
        o.size
    };
    let rx = pd.alloc_mr(slot * o.rx_depth, AccessFlags::LOCAL_WRITE)?;
    let mut tx = pd.alloc_mr(o.size.max(1), AccessFlags::LOCAL_WRITE)?;
    tx.write_from(0, &vec![0x7b; o.size.max(1)])?;
    let srq = match o.mode {
        Mode::Srq => Some(pd.create_srq(o.rx_depth as u32, 1)?),
        _ => None,
    };
    let qp_type = if o.mode == Mode::Ud {
        QpType::Ud
    } else {
        QpType::Rc
    };
    let qps: Vec<Qp> = (0..o.num_qp)
        .map(|_| {
            let mut b = QpBuilder::new(&pd, &cq, &cq, qp_type)
                .max_send_wr(1)
                .max_recv_wr(o.rx_depth as u32);
            if let Some(srq) = &srq {
                b = b.srq(srq);
            }
            b.build()
        })
        .collect::<Result<_>>()?;

    // The opts are needed for INIT already: receives are posted from INIT on.
    let opts = ConnectOptions {
        mtu: Some(o.mtu),
        retry_cnt: 7,
        rnr_retry: 7,
        ..ConnectOptions::default()
    };
    for q in &qps {
        match qp_type {
            QpType::Ud => q.to_init(&InitAttr {
                port: port.port,
                qkey: DEFAULT_QKEY,
                ..InitAttr::default()
            })?,
            _ => q.init(&port, &opts)?,
        }
    }
    let rq = Receives {
        qps: &qps,
        srq: srq.as_ref(),
        rx: &rx,
        slot,
    };
    for i in 0..o.rx_depth {
        rq.post(i)?;
    }

    // The exchange; the server connects before it answers.
    let ours: Vec<Endpoint> = qps.iter().map(|q| q.endpoint(&port)).collect();
    let lines = if o.mode == Mode::Srq {
        SRQ_PINGPONG_LINES
    } else {
        1
    };
    let client = matches!(peer, Peer::Connect(_));
    let exchange_timeout = o.stall;
    let (theirs, ah, mut session) = match peer {
        Peer::Connect(host) => {
            let mut s = Session::connect((host.as_str(), o.tcp_port), exchange_timeout)?;
            let theirs = if lines == 1 {
                vec![s.pingpong_client(&ours[0])?]
            } else {
                s.pingpong_client_lines(&ours, lines)?
            };
            check_count(&theirs, o.num_qp)?;
            let ah = connect(&pd, &qps, &theirs, &port, &opts)?;
            (theirs, ah, s)
        }
        Peer::Accept(listener) => {
            let mut s = Session::accept(&listener, exchange_timeout)?;
            let theirs = if lines == 1 {
                vec![s.pingpong_server_recv()?]
            } else {
                s.pingpong_server_recv_lines(lines)?
            };
            check_count(&theirs, o.num_qp)?;
            let ah = connect(&pd, &qps, &theirs, &port, &opts)?;
            if lines == 1 {
                s.pingpong_server_reply(&ours[0])?;
            } else {
                s.pingpong_server_reply_lines(&ours, lines)?;
            }
            (theirs, ah, s)
        }
    };
    for (q, t) in [("local", &ours), ("remote", &theirs)] {
        for ep in t.iter() {
            println!(
                "  {q} address:  LID {:#06x}, QPN {:#08x}, PSN {:#08x}, GID {}",
                ep.lid,
                ep.qpn,
                ep.psn,
                Gid(ep.gid)
            );
        }
    }

    // UD: inline when the QP takes the whole message inline, as ibv_ud_pingpong does.
    let inline_max = qps[0].query()?.cap().max_inline_data as usize;
    let bytes = tx.read_vec(0, o.size)?;
    let sge = [tx.local(0, o.size)?];
    let send = |i: usize| -> Res<()> {
        let wr = match &ah {
            Some(ah) if o.size <= inline_max => {
                let wr = SendWr::ud_inline(SEND_WRID, &bytes, ah, theirs[i].qpn, DEFAULT_QKEY);
                return Ok(qps[i].post_send_inline(&wr.signaled())?);
            }
            Some(ah) => SendWr::ud(SEND_WRID, &sge, ah, theirs[i].qpn, DEFAULT_QKEY),
            None => SendWr::send(SEND_WRID, &sge),
        };
        // SAFETY: `tx` is registered for the whole run and never written after the fill
        // above; the AH outlives the call.
        unsafe { qps[i].post_send(&wr.signaled()) }?;
        Ok(())
    };

    // The lockstep: a QP's `pending` bits are the send and the receive it waits for.
    let mut pending = vec![RECV_WRID; o.num_qp];
    if client {
        for (i, p) in pending.iter_mut().enumerate() {
            send(i)?;
            *p = RECV_WRID | SEND_WRID;
        }
    }
    let started = Instant::now();
    let (mut sent, mut received) = (0, 0);
    let mut wcs = [Wc::default(); 16];
    let mut last_progress = Instant::now();
    while received < o.iters || sent < o.iters {
        let n = cq.poll(&mut wcs)?;
        if n == 0 {
            if last_progress.elapsed() > o.stall {
                return Err(format!(
                    "no completion for {:?}: {sent} sends and {received} receives of {} done",
                    o.stall, o.iters
                )
                .into());
            }
            std::hint::spin_loop();
            continue;
        }
        last_progress = Instant::now();
        for wc in &wcs[..n] {
            let wc = wc.ok()?;
            let i = qps
                .iter()
                .position(|q| q.qp_num() == wc.qp_num())
                .ok_or_else(|| format!("a completion for QP {:#x}, not ours", wc.qp_num()))?;
            let kind = wc.wr_id() & 3;
            if kind == SEND_WRID {
                sent += 1;
            } else {
                let expect = if o.mode == Mode::Ud {
                    o.size + GRH
                } else {
                    o.size
                };
                if wc.byte_len() as usize != expect {
                    return Err(format!(
                        "received {} bytes, expected {expect}: is the peer's -s {}?",
                        wc.byte_len(),
                        o.size
                    )
                    .into());
                }
                received += 1;
                rq.post((wc.wr_id() >> 2) as usize)?;
            }
            pending[i] &= !kind;
            if sent < o.iters && pending[i] == 0 {
                send(i)?;
                pending[i] = RECV_WRID | SEND_WRID;
            }
        }
    }
    let elapsed = started.elapsed();
    if o.barrier {
        // The tools' lockstep ends a side once its counts are reached, with up to one send
        // per QP still in flight; the C tools exit then, and a late send meets a peer that
        // is gone (on hardware it retries unseen; softnic, which has no timers, fails it at
        // once). Between two of ours: finish our sends, then meet before either tears down.
        let since = Instant::now();
        while pending.iter().any(|p| p & SEND_WRID != 0) {
            let n = cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                let wc = wc.ok()?;
                let i = qps
                    .iter()
                    .position(|q| q.qp_num() == wc.qp_num())
                    .unwrap_or(0);
                if wc.wr_id() & 3 == SEND_WRID {
                    pending[i] &= !SEND_WRID;
                } else {
                    rq.post((wc.wr_id() >> 2) as usize)?;
                }
            }
            if since.elapsed() > o.stall {
                return Err("our last sends did not complete".into());
            }
        }
        session.sync(b'E')?;
    }
    let bytes = (o.size * o.iters * 2) as f64;
    let secs = elapsed.as_secs_f64();
    println!(
        "{} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as u64,
        bytes * 8.0 / secs / 1e6
    );
    println!(
        "{} iters in {secs:.2} seconds = {:.2} usec/iter",
        o.iters,
        secs * 1e6 / o.iters as f64
    );
    Ok(Report {
        sent,
        received,
        elapsed,
    })
}

fn check_count(theirs: &[Endpoint], num_qp: usize) -> Res<()> {
    if theirs.len() != num_qp {
        return Err(format!(
            "the peer has {} QPs and we have {num_qp}: start both sides with the same -q",
            theirs.len()
        )
        .into());
    }
    Ok(())
}

/// From INIT: RC, each QP to its peer's; UD, RTR and RTS, and an address handle to the
/// peer.
fn connect(
    pd: &Pd,
    qps: &[Qp],
    theirs: &[Endpoint],
    port: &PortInfo,
    opts: &ConnectOptions,
) -> Res<Option<Ah>> {
    if qps[0].qp_type() != QpType::Ud {
        for (q, t) in qps.iter().zip(theirs) {
            q.connect(port, t, opts)?;
        }
        return Ok(None);
    }
    qps[0].ud_to_rtr()?;
    qps[0].ud_to_rts(qps[0].local_psn())?;
    Ok(Some(pd.create_ah(&AhAttr::from_port(
        port,
        Gid(theirs[0].gid),
        theirs[0].lid,
    ))?))
}

/// The receive queue (the QP's, or the SRQ) and its slots; `wr_id` carries the slot.
struct Receives<'a> {
    qps: &'a [Qp],
    srq: Option<&'a Srq>,
    rx: &'a Mr<'static>,
    slot: usize,
}

impl Receives<'_> {
    fn post(&self, i: usize) -> Res<()> {
        let sge = [self.rx.local(i * self.slot, self.slot)?];
        let wr_id = (i as u64) << 2 | RECV_WRID;
        match self.srq {
            // SAFETY: slot `i` is registered for the whole run and read by nothing but the
            // device until its completion is polled (this side looks only at its length).
            Some(srq) => unsafe { srq.post_recv(wr_id, &sge) }?,
            // SAFETY: as above.
            None => unsafe { self.qps[0].post_recv(wr_id, &sge) }?,
        }
        Ok(())
    }
}

/// Both sides in this process, over 127.0.0.1 (softnic unless `-d` names a device).
pub fn loopback(o: &Opts) -> Res<(Report, Report)> {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let client = Opts {
        tcp_port: listener.local_addr()?.port(),
        barrier: true,
        ..o.clone()
    };
    let server_opts = Opts {
        barrier: true,
        ..o.clone()
    };
    let server = std::thread::spawn(move || {
        run(&server_opts, Peer::Accept(listener)).map_err(|e| e.to_string())
    });
    let c = run(&client, Peer::Connect("127.0.0.1".into()));
    let s = server.join().map_err(|_| "the server side panicked")??;
    Ok((s, c?))
}

fn parse_args() -> Res<(Opts, Option<String>, bool)> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: pingpong <rc|ud|srq> [-p port] [-d dev] [-g gid] [-s size] [-n iters] \
                 [-r rx_depth] [-q num_qp] [-m mtu] [--loopback | host]";
    let mode = match args.next().as_deref() {
        Some("rc") => Mode::Rc,
        Some("ud") => Mode::Ud,
        Some("srq") => Mode::Srq,
        _ => return Err(usage.into()),
    };
    let mut o = Opts::new(mode);
    let (mut host, mut loopback) = (None, false);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{a} needs a value\n{usage}"))
        };
        match a.as_str() {
            "-p" => o.tcp_port = value()?.parse()?,
            "-d" => o.device = Some(value()?),
            "-g" => o.gid_index = Some(value()?.parse()?),
            "-s" => o.size = value()?.parse()?,
            "-n" => o.iters = value()?.parse()?,
            "-r" => o.rx_depth = value()?.parse()?,
            "-q" => o.num_qp = value()?.parse()?,
            "-m" => {
                o.mtu = match value()?.as_str() {
                    "256" => Mtu::Mtu256,
                    "512" => Mtu::Mtu512,
                    "1024" => Mtu::Mtu1024,
                    "2048" => Mtu::Mtu2048,
                    "4096" => Mtu::Mtu4096,
                    m => return Err(format!("-m {m}: 256, 512, 1024, 2048 or 4096").into()),
                }
            }
            "--loopback" => loopback = true,
            "-h" | "--help" => return Err(usage.into()),
            h if !h.starts_with('-') && host.is_none() => host = Some(h.to_string()),
            other => return Err(format!("unknown argument {other}\n{usage}").into()),
        }
    }
    Ok((o, host, loopback))
}

fn main() -> Res<()> {
    let (mut o, host, loopback_mode) = parse_args()?;
    if loopback_mode {
        if o.device.is_none() {
            o.device = Some("softnic".into());
        }
        let (s, c) = loopback(&o)?;
        println!(
            "loopback OK: server {}/{} and client {}/{} sends/receives",
            s.sent, s.received, c.sent, c.received
        );
        return Ok(());
    }
    let peer = match host {
        Some(h) => Peer::Connect(h),
        None => Peer::Accept(TcpListener::bind(SocketAddr::from((
            [0, 0, 0, 0],
            o.tcp_port,
        )))?),
    };
    run(&o, peer)?;
    Ok(())
}
