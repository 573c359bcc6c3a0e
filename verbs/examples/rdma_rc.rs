//! The RDMA Aware Networks Programming manual's `RDMA_RC_example`, ported: an RC QP
//! pair set up over a TCP exchange, then SEND/RECEIVE, RDMA READ and RDMA WRITE.
//!
//! ```text
//! cargo run -p hotverbs --example rdma_rc -- --loopback            # both sides, softnic
//! cargo run -p hotverbs --example rdma_rc -- -d rxe0 -g 1            # server
//! cargo run -p hotverbs --example rdma_rc -- -d rxe0 -g 1 10.77.0.1  # client
//! ```
//! Options (as the manual's): `-p` TCP port (19875), `-d` device (default: the first real
//! device, else softnic; `$HOTVERBS_DEVICE` overrides), `-i` IB port (first active),
//! `-g` GID index (the RoCE v2 IPv4 GID on Ethernet).
//!
//! The flow is the manual's: the server fills its buffer with "SEND operation " and posts
//! a SEND; the client, whose receive was posted between INIT and RTR, prints it. The
//! server then puts "RDMA read operation " in its buffer; the client reads it with RDMA
//! READ and overwrites it with "RDMA write operation" by RDMA WRITE; the server, which
//! saw none of this, prints its buffer after the last sync.
//!
//! The buffer is registered with `REMOTE_WRITE`, so it is read and written with
//! [`Mr::read_vec`]/[`Mr::write_from`] (atomic copies), never through a slice.
//!
//! [`loopback`] runs both sides in one process; `tests/examples.rs` (softnic) and
//! `tests/real_device.rs` (a real device) call it and check the data exchanged.

use std::error::Error as StdError;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use hotverbs::exchange::Session;
use hotverbs::*;

const MSG: &str = "SEND operation ";
const RDMAMSGR: &str = "RDMA read operation ";
const RDMAMSGW: &str = "RDMA write operation";
const MSG_SIZE: usize = 64;
const TIMEOUT: Duration = Duration::from_secs(30);

type Res<T> = std::result::Result<T, Box<dyn StdError + Send + Sync>>;

struct Config {
    device: Option<String>,
    tcp_port: u16,
    ib_port: Option<u8>,
    gid_index: Option<u32>,
    server: Option<String>,
    loopback: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: rdma_rc [--loopback] [-p tcp_port] [-d device] [-i ib_port] [-g gid_index] [server]"
    );
    std::process::exit(2)
}

fn parse_args() -> Config {
    let mut c = Config {
        device: None,
        tcp_port: 19875,
        ib_port: None,
        gid_index: None,
        server: None,
        loopback: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--loopback" => c.loopback = true,
            "-p" | "--port" => c.tcp_port = val().parse().unwrap_or_else(|_| usage()),
            "-d" | "--ib-dev" => c.device = Some(val()),
            "-i" | "--ib-port" => c.ib_port = Some(val().parse().unwrap_or_else(|_| usage())),
            "-g" | "--gid-idx" => c.gid_index = Some(val().parse().unwrap_or_else(|_| usage())),
            "-h" | "--help" => usage(),
            s if !s.starts_with('-') && c.server.is_none() => c.server = Some(s.to_string()),
            _ => usage(),
        }
    }
    c
}

fn open(device: &Option<String>) -> Result<Context> {
    match device {
        Some(d) => Context::open(d),
        // No device named: the first RDMA device, else the software device, said out loud.
        None => Context::open_default().or_else(|e| {
            eprintln!("{e}: using softnic, the in-process software device");
            Context::open_softnic()
        }),
    }
}

fn text(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// This side's buffer as text (up to the first NUL).
fn contents(mr: &Mr<'_>) -> Res<String> {
    Ok(text(&mr.read_vec(0, MSG_SIZE)?))
}

/// Replaces this side's buffer with `s`, NUL-padded.
fn put(mr: &mut Mr<'_>, s: &str) -> Res<()> {
    let mut b = [0u8; MSG_SIZE];
    b[..s.len()].copy_from_slice(s.as_bytes());
    mr.write_from(0, &b)?;
    Ok(())
}

/// What one side saw: the data exchanged, as the example prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Client: the message its receive got from the server's SEND.
    pub received: Option<String>,
    /// Client: the server's buffer as fetched by RDMA READ.
    pub read: Option<String>,
    /// This side's buffer after the last sync.
    pub final_contents: String,
}

/// One side of the example. `session` is the connected TCP exchange.
fn run(cfg: &Config, is_client: bool, mut session: Session) -> Res<Outcome> {
    let who = if is_client { "client" } else { "server" };
    // resources_create: device, PD, CQ, MR, QP
    let ctx = open(&cfg.device)?;
    println!("[{who}] device {} ({:?})", ctx.name(), ctx.kind());
    let port = ctx.port_info(cfg.ib_port, cfg.gid_index)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(1, None)?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let mut mr = pd.alloc_mr(MSG_SIZE, access)?;
    if !is_client {
        put(&mut mr, MSG)?;
    }
    let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .max_send_wr(1)
        .max_recv_wr(1)
        .build()?;
    println!(
        "[{who}] QP {:#x} created, MR addr {:#x} rkey {:#x}",
        qp.qp_num(),
        mr.addr(),
        mr.rkey()
    );

    // connect_qp: exchange (addr, rkey, QPN, LID, GID), then INIT -> (receive) -> RTR -> RTS
    let local = qp.endpoint(&port).with_mr(mr.remote());
    let remote = session.exchange(&local)?;
    let window = remote.mr.ok_or("the peer sent no MR")?;
    println!(
        "[{who}] remote QP {:#x} LID {:#x} GID {} MR {:#x}/{:#x}",
        remote.qpn,
        remote.lid,
        remote.gid(),
        window.addr,
        window.rkey
    );
    qp.to_init(&InitAttr {
        port: port.port,
        pkey_index: 0,
        access,
        qkey: 0,
    })?;
    if is_client {
        // SAFETY: the buffer is not touched until the receive completes (poll below).
        unsafe { qp.post_recv(0, &[mr.sge()])? };
    }
    let ah = AhAttr::to_endpoint(&port, &remote);
    qp.to_rtr(&RtrAttr {
        path_mtu: port.active_mtu.min(Mtu::Mtu1024),
        dest_qpn: remote.qpn,
        rq_psn: remote.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 0x12,
        ah,
    })?;
    qp.to_rts(&RtsAttr {
        timeout: 0x12,
        retry_cnt: 6,
        rnr_retry: 7,
        sq_psn: qp.local_psn(),
        max_rd_atomic: 1,
    })?;
    session.sync(b'Q')?;
    println!("[{who}] QP state {:?}", qp.query()?.state());

    // the server posts the SEND; both sides expect one completion
    if !is_client {
        // SAFETY: the buffer is not written until the send completes.
        unsafe { qp.post_send(&SendWr::send(1, &[mr.sge()]).signaled())? };
    }
    cq.wait_one(TIMEOUT)?.ok()?;
    let mut received = None;
    if is_client {
        let msg = contents(&mr)?;
        println!("[{who}] Message is: '{msg}'");
        received = Some(msg);
    } else {
        put(&mut mr, RDMAMSGR)?;
    }
    session.sync(b'R')?;

    let mut read = None;
    if is_client {
        // SAFETY: the buffer is not accessed until the read completes.
        unsafe {
            qp.post_send(
                &SendWr::read(2, &[mr.sge()], window.slice(0, MSG_SIZE as u64)?).signaled(),
            )?
        };
        cq.wait_one(TIMEOUT)?.ok()?;
        let fetched = contents(&mr)?;
        println!("[{who}] Contents of server's buffer: '{fetched}'");
        read = Some(fetched);
        put(&mut mr, RDMAMSGW)?;
        println!("[{who}] Now replacing it with: '{}'", contents(&mr)?);
        // SAFETY: the buffer is not written until the write completes.
        unsafe {
            qp.post_send(
                &SendWr::write(3, &[mr.sge()], window.slice(0, MSG_SIZE as u64)?).signaled(),
            )?
        };
        cq.wait_one(TIMEOUT)?.ok()?;
    }
    session.sync(b'W')?;
    let final_contents = contents(&mr)?;
    if !is_client {
        println!("[{who}] Contents of server buffer: '{final_contents}'");
    }
    // resources_destroy: explicit, so failures are reported
    qp.destroy()?;
    mr.destroy()?;
    cq.destroy()?;
    pd.destroy()?;
    Ok(Outcome {
        received,
        read,
        final_contents,
    })
}

/// Runs server and client in one process over a local TCP exchange, on `device` (softnic
/// when `None`) with GID index `gid_index` (the default when `None`); returns what the
/// (server, client) saw.
pub fn loopback(device: Option<String>, gid_index: Option<u32>) -> Res<(Outcome, Outcome)> {
    let cfg = Config {
        device: device.or_else(|| Some(SOFTNIC.to_string())),
        tcp_port: 0,
        ib_port: None,
        gid_index,
        server: None,
        loopback: true,
    };
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let (server, client) = std::thread::scope(|s| {
        let cfg = &cfg;
        let server = s.spawn(move || run(cfg, false, Session::accept(&listener, TIMEOUT)?));
        let client = s.spawn(move || run(cfg, true, Session::connect(addr, TIMEOUT)?));
        (server.join(), client.join())
    });
    let server = server.map_err(|_| "server thread panicked")??;
    let client = client.map_err(|_| "client thread panicked")??;
    Ok((server, client))
}

fn main() -> Res<()> {
    let cfg = parse_args();
    if cfg.loopback {
        let (server, client) = loopback(cfg.device, cfg.gid_index)?;
        let expected = (Some(MSG), Some(RDMAMSGR), RDMAMSGW, RDMAMSGW);
        let got = (
            client.received.as_deref(),
            client.read.as_deref(),
            client.final_contents.as_str(),
            server.final_contents.as_str(),
        );
        if got != expected {
            return Err(format!("unexpected data: server {server:?}, client {client:?}").into());
        }
        println!("loopback OK: SEND, RDMA READ and RDMA WRITE all arrived");
        return Ok(());
    }
    let session = match &cfg.server {
        Some(host) => Session::connect((host.as_str(), cfg.tcp_port), TIMEOUT)?,
        None => {
            let listener = TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], cfg.tcp_port)))?;
            println!("[server] waiting on TCP port {}", cfg.tcp_port);
            Session::accept(&listener, Duration::from_secs(600))?
        }
    };
    run(&cfg, cfg.server.is_some(), session)?;
    Ok(())
}
