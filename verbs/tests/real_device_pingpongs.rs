//! `examples/pingpong.rs` against rdma-core's own tools, both directions, on the device of
//! `cargo xtask rxe` (issue 31): `ibv_ud_pingpong` (1024 B, and 16 B, which goes inline),
//! `ibv_srq_pingpong` (16 QPs on one SRQ, 4096 B; the 256-line exchange) and
//! `ibv_rc_pingpong`, 1000 iterations each. Without a device, each says "skipped: no RDMA
//! device"; the example then runs against itself on softnic in every mode.
//!
//! Ports: where the C tool is the server it listens on a fixed port,
//! `$HOTVERBS_PINGPONG_PORT` (else 18526) plus an offset per test, since tests of this
//! binary run at once; where the example is the server it binds port 0 and the tool is
//! told the port it got.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hotverbs::testing::{gid_index, real_device, rxe_required};

// The example's command-line half (`main`, argument parsing) is not used here.
#[allow(dead_code)]
#[path = "../examples/pingpong.rs"]
mod pingpong;

use pingpong::{Mode, Opts, Peer};

/// How long a side waits for the other: only a failure waits this long.
const PEER_WAIT: Duration = Duration::from_secs(120);
const ITERS: usize = 1000;

fn base_port() -> u16 {
    match std::env::var("HOTVERBS_PINGPONG_PORT") {
        Ok(p) => p
            .parse()
            .unwrap_or_else(|e| panic!("HOTVERBS_PINGPONG_PORT={p:?}: {e}")),
        Err(_) => 18515 + 11,
    }
}

/// The C tool of `mode` with the same settings as `o`, or `None` (after a skip line) when
/// it is not installed outside the VM.
fn tool(o: &Opts, port: u16) -> Option<Command> {
    let bin = match o.mode {
        Mode::Rc => "ibv_rc_pingpong",
        Mode::Ud => "ibv_ud_pingpong",
        Mode::Srq => "ibv_srq_pingpong",
    };
    if Command::new(bin)
        .arg("-h")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        assert!(!rxe_required(), "HOTVERBS_RXE=1 but {bin} is not installed");
        println!("skipped: {bin} not installed");
        return None;
    }
    let mut c = Command::new(bin);
    c.args([
        "-d",
        o.device.as_deref().expect("a device"),
        "-p",
        &port.to_string(),
    ]);
    c.args(["-s", &o.size.to_string(), "-n", &o.iters.to_string()]);
    c.args(["-r", &o.rx_depth.to_string()]);
    if o.mode != Mode::Ud {
        c.args(["-m", "1024"]);
    }
    if o.mode == Mode::Srq {
        c.args(["-q", &o.num_qp.to_string()]);
    }
    if let Some(g) = o.gid_index {
        c.args(["-g", &g.to_string()]);
    }
    Some(c)
}

fn finish(mut child: Child, what: &str) {
    let deadline = Instant::now() + PEER_WAIT;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{what}:\n{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(status.success(), "{what} exited with {status}");
    assert!(
        stdout.contains(&format!("{ITERS} iters in")),
        "{what} did not report its iterations"
    );
}

/// The example against the C tool: `we_serve` says which side is the server.
fn interop(mode: Mode, size: usize, we_serve: bool, port_offset: u16) {
    let Some(ctx) = real_device() else { return };
    let mut o = Opts::new(mode);
    o.device = Some(ctx.name().to_string());
    o.gid_index = gid_index();
    o.size = size;
    o.iters = ITERS;
    o.stall = PEER_WAIT;
    drop(ctx);
    let what = format!(
        "{mode:?} {size} B, the C tool as the {}",
        if we_serve { "client" } else { "server" }
    );
    let report = if we_serve {
        let listener = TcpListener::bind(("0.0.0.0", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let Some(mut cmd) = tool(&o, port) else {
            return;
        };
        let child = cmd
            .arg("127.0.0.1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let r = pingpong::run(&o, Peer::Accept(listener));
        finish(child, &what);
        r
    } else {
        let port = base_port() + port_offset;
        let Some(mut cmd) = tool(&o, port) else {
            return;
        };
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The tool listens once its device is set up: connect retries until then.
        o.tcp_port = port;
        let r = pingpong::run(&o, Peer::Connect("127.0.0.1".into()));
        finish(child, &what);
        r
    };
    let report = report.unwrap_or_else(|e| panic!("{what}: the example failed: {e}"));
    assert!(
        report.sent >= ITERS && report.received >= ITERS,
        "{what}: {report:?}"
    );
}

#[test]
fn ud_pingpong_1024_we_serve() {
    interop(Mode::Ud, 1024, true, 0);
}

#[test]
fn ud_pingpong_1024_we_connect() {
    interop(Mode::Ud, 1024, false, 1);
}

#[test]
fn ud_pingpong_16_inline_we_serve() {
    interop(Mode::Ud, 16, true, 0);
}

#[test]
fn ud_pingpong_16_inline_we_connect() {
    interop(Mode::Ud, 16, false, 2);
}

#[test]
fn srq_pingpong_we_serve() {
    interop(Mode::Srq, 4096, true, 0);
}

#[test]
fn srq_pingpong_we_connect() {
    interop(Mode::Srq, 4096, false, 3);
}

#[test]
fn rc_pingpong_we_serve() {
    interop(Mode::Rc, 4096, true, 0);
}

#[test]
fn rc_pingpong_we_connect() {
    interop(Mode::Rc, 4096, false, 4);
}

/// The example against itself on softnic, every mode: the host's check that its exchange
/// and lockstep hold together (the C tools are the device run's).
#[test]
fn the_example_against_itself_on_softnic() {
    for (mode, size) in [
        (Mode::Rc, 4096),
        (Mode::Ud, 1024),
        (Mode::Ud, 16),
        (Mode::Srq, 4096),
    ] {
        let mut o = Opts::new(mode);
        o.device = Some("softnic".into());
        o.size = size;
        o.iters = 200;
        o.rx_depth = 64;
        let (s, c) = pingpong::loopback(&o).unwrap_or_else(|e| panic!("{mode:?} {size}: {e}"));
        for r in [&s, &c] {
            assert!(r.sent >= 200 && r.received >= 200, "{mode:?} {size}: {r:?}");
            // The lockstep: each side sends at most one message per QP ahead of what it got.
            assert!(r.sent <= r.received + o.num_qp, "{mode:?} {size}: {r:?}");
        }
    }
}
