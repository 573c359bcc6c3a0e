//! Endpoint exchange: both formats, both roles, over TCP on 127.0.0.1, with malformed
//! input and timeouts (nothing may hang), and a real connection set up through it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use hotverbs::exchange::{self, Endpoint, ExchangeError, Session, PINGPONG_LEN};
use hotverbs::*;

const T: Duration = Duration::from_secs(5);

fn ep(qpn: u32) -> Endpoint {
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&[10, 77, 0, qpn as u8]);
    Endpoint {
        lid: 0,
        qpn,
        psn: 0x00ab_cdef,
        gid,
        mr: None,
    }
}

fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

use hotverbs::testing::refusing_addr;

#[test]
fn our_format_roundtrip_both_roles_with_and_without_mr() {
    let (l, addr) = listener();
    let server_ep = ep(2).with_mr(RemoteMr {
        addr: 0x1000,
        len: 4096,
        rkey: 0x77,
    });
    let s = thread::spawn(move || {
        let mut s = Session::accept(&l, T).unwrap();
        let got = s.exchange(&server_ep).unwrap();
        s.sync(b'Q').unwrap();
        got
    });
    let mut c = Session::connect(addr, T).unwrap();
    let got = c.exchange(&ep(1)).unwrap();
    c.sync(b'Q').unwrap();
    assert_eq!(got, server_ep);
    assert_eq!(s.join().unwrap(), ep(1));
}

#[test]
fn pingpong_format_we_are_client() {
    // A server speaking exactly ibv_rc_pingpong's bytes.
    let (l, addr) = listener();
    let s = thread::spawn(move || {
        let (mut sock, _) = l.accept().unwrap();
        let mut msg = [0u8; PINGPONG_LEN];
        sock.read_exact(&mut msg).unwrap();
        let line = b"0000:000042:0abcde:00000000000000000000ffff0a4d0001\0";
        sock.write_all(line).unwrap();
        let mut done = [0u8; 5];
        sock.read_exact(&mut done).unwrap();
        (msg, done)
    });
    let mut c = Session::connect(addr, T).unwrap();
    let theirs = c.pingpong_client(&ep(1)).unwrap();
    assert_eq!((theirs.lid, theirs.qpn, theirs.psn), (0, 0x42, 0x0abcde));
    assert_eq!(theirs.gid(), Gid::from_ipv4([10, 77, 0, 1]));
    let (msg, done) = s.join().unwrap();
    assert_eq!(
        std::str::from_utf8(&msg[..51]).unwrap(),
        "0000:000001:abcdef:00000000000000000000ffff0a4d0001"
    );
    assert_eq!(msg[51], 0);
    assert_eq!(&done, b"done\0");
}

#[test]
fn pingpong_format_we_are_server() {
    let (l, addr) = listener();
    let s = thread::spawn(move || {
        let mut s = Session::accept(&l, T).unwrap();
        let client = s.pingpong_server_recv().unwrap();
        // (the QP would be connected here, before answering)
        s.pingpong_server_reply(&ep(9)).unwrap();
        client
    });
    // A client speaking exactly ibv_rc_pingpong's bytes.
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.write_all(b"0001:000033:000044:fe800000000000000000000000000001\0")
        .unwrap();
    let mut msg = [0u8; PINGPONG_LEN];
    sock.read_exact(&mut msg).unwrap();
    sock.write_all(b"done\0").unwrap();
    let client = s.join().unwrap();
    assert_eq!((client.lid, client.qpn, client.psn), (1, 0x33, 0x44));
    assert_eq!(client.gid[0], 0xfe);
    assert_eq!(client.gid[15], 1);
    assert_eq!(exchange::parse_pingpong(&msg).unwrap(), ep(9));
}

#[test]
fn malformed_input_over_the_wire_is_a_clear_error() {
    let (l, addr) = listener();
    let s = thread::spawn(move || {
        let mut out = Vec::new();
        for _ in 0..3 {
            let mut s = Session::accept(&l, T).unwrap();
            out.push(s.recv().unwrap_err().to_string());
        }
        let mut s = Session::accept(&l, T).unwrap();
        out.push(s.pingpong_server_recv().unwrap_err().to_string());
        out
    });
    // 1: the peer speaks pingpong to our server
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"0001:000033:000044:fe800000000000000000000000000001\0")
        .unwrap();
    // 2: a future version
    let mut c2 = TcpStream::connect(addr).unwrap();
    let mut b = ep(1).to_bytes();
    b[4] = 9;
    c2.write_all(&b).unwrap();
    // 3: truncated, then closed
    {
        let mut c3 = TcpStream::connect(addr).unwrap();
        c3.write_all(&ep(1).to_bytes()[..20]).unwrap();
    }
    // 4: pingpong with a bad separator
    let mut c4 = TcpStream::connect(addr).unwrap();
    c4.write_all(b"0001-000033:000044:fe800000000000000000000000000001\0")
        .unwrap();
    let msgs = s.join().unwrap();
    assert!(
        msgs[0].contains("bad magic") && msgs[0].contains("pingpong"),
        "{}",
        msgs[0]
    );
    assert!(msgs[1].contains("version 9"), "{}", msgs[1]);
    assert!(
        msgs[2].contains("closed the connection after 20 of 36 bytes"),
        "{}",
        msgs[2]
    );
    assert!(msgs[3].contains("separator after LID"), "{}", msgs[3]);
    drop((c, c2, c4));
}

#[test]
fn nothing_hangs_connect_accept_and_read_time_out() {
    // Nobody listens on this port (bound, never listening): connect gives up.
    let (_refusing, addr) = refusing_addr();
    let e = Session::connect(addr, Duration::from_millis(200)).unwrap_err();
    assert!(
        matches!(
            e,
            ExchangeError::Timeout {
                during: "connecting",
                ..
            }
        ),
        "{e}"
    );

    let (l, addr) = listener();
    let e = Session::accept(&l, Duration::from_millis(100)).unwrap_err();
    assert!(e.to_string().contains("timed out"), "{e}");

    // A silent peer: the read times out. The peer holds the connection open until the
    // client has seen its timeout (were it closed earlier, the read would end in EOF).
    let (done, wait_done) = mpsc::channel::<()>();
    let s = thread::spawn(move || {
        let (sock, _) = l.accept().unwrap();
        // Err only when the client side panicked and dropped `done`: close either way.
        let _ = wait_done.recv();
        drop(sock);
    });
    let mut c = Session::connect(addr, Duration::from_millis(200)).unwrap();
    let e = c.exchange(&ep(1)).unwrap_err();
    assert!(matches!(e, ExchangeError::Timeout { .. }), "{e}");
    let io: std::io::Error = e.into();
    assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
    done.send(()).unwrap();
    s.join().unwrap();
}

#[test]
fn parsers_never_panic_on_arbitrary_bytes() {
    // A cheap deterministic sweep (the fuzz targets do the rest).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let good = ep(5)
        .with_mr(RemoteMr {
            addr: 0x1000,
            len: 64,
            rkey: 0x5a,
        })
        .to_bytes();
    assert!(
        exchange::parse(&good).is_ok(),
        "the sweep starts from a valid message"
    );
    for i in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut b = if i % 2 == 0 {
            good.clone()
        } else {
            ep(5).to_pingpong().to_vec()
        };
        let pos = (x as usize) % b.len();
        b[pos] = (x >> 32) as u8;
        b.truncate(b.len() - ((x >> 40) as usize % 3));
        let _ = exchange::parse(&b);
        let _ = exchange::parse_pingpong(&b);
    }
}

#[test]
fn rc_connection_set_up_through_the_tcp_exchange() {
    // Two threads, two contexts, as two processes would do it.
    let (l, addr) = listener();
    let server = thread::spawn(move || -> Result<Vec<u8>> {
        let ctx = Context::open("softnic")?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(16, None)?;
        let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
        let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
        let port = ctx.port_info(None, None)?;
        let mut s = Session::accept(&l, T).unwrap();
        let theirs = s
            .exchange(&qp.endpoint(&port).with_mr(mr.remote()))
            .unwrap();
        qp.connect(&port, &theirs, &ConnectOptions::default())?;
        s.sync(b'R').unwrap(); // both in RTS
        s.sync(b'W').unwrap(); // client wrote
        mr.read_vec(0, 6)
    });
    let ctx = Context::open("softnic").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    let mut mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    mr.write_from(0, b"remote").unwrap();
    let port = ctx.port_info(None, None).unwrap();
    let mut c = Session::connect(addr, T).unwrap();
    let theirs = c.exchange(&qp.endpoint(&port)).unwrap();
    let window = theirs.mr.expect("server offered its MR");
    qp.connect(&port, &theirs, &ConnectOptions::default())
        .unwrap();
    c.sync(b'R').unwrap();
    // SAFETY: mr is not touched until the completion below.
    unsafe {
        qp.post_send(&SendWr::write(1, &[mr.local(0, 6).unwrap()], window).signaled())
            .unwrap();
    }
    cq.wait_one(T).unwrap().ok().unwrap();
    c.sync(b'W').unwrap();
    assert_eq!(server.join().unwrap().unwrap(), b"remote");
}
