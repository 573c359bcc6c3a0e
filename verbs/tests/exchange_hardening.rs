//! Endpoint exchange against peers that misbehave: trickling or silent peers (one deadline
//! per call), peers that never stop sending or are out of step (the lockstep check),
//! endpoints no peer can use (validation on parse), and timeouts too large for `Instant`.
//!
//! Nothing here depends on timing. Short timeouts appear only where the peer misbehaves
//! for ever (until the test ends), so the call can only end in the error asserted; where a
//! test needs bytes to have arrived before a call, it waits for them with a blocking peek.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use hotverbs::exchange::{
    self, Endpoint, ExchangeError, Session, PINGPONG_LEN, WIRE_LEN, WIRE_LEN_MR,
};
use hotverbs::*;

/// Bounds success paths (never reached unless something is broken).
const T: Duration = Duration::from_secs(30);
/// The timeout of calls whose peer never completes: they can only time out.
const SHORT: Duration = Duration::from_millis(100);

fn ep(qpn: u32) -> Endpoint {
    Endpoint {
        lid: 0,
        qpn,
        psn: 0x00ab_cdef,
        gid: Gid::from_ipv4([10, 77, 0, qpn as u8]).0,
        mr: None,
    }
}

fn window() -> RemoteMr {
    RemoteMr {
        addr: 0x1000,
        len: 4096,
        rkey: 0x77,
    }
}

fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

/// A raw peer on 127.0.0.1: does `act` on its end of the connection, then holds the
/// connection open, silent, until dropped (were it closed, our reads would end in EOF
/// rather than wait). Drop the session on our end first when `act` only returns once our
/// end is gone (a peer that writes for ever).
struct Peer {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.stop.take());
        let r = self.thread.take().unwrap().join();
        if !thread::panicking() {
            r.expect("the peer thread panicked");
        }
    }
}

/// A peer doing `act`, and our end of the connection to it as a session with `timeout`.
fn peer(timeout: Duration, act: impl FnOnce(&mut TcpStream) + Send + 'static) -> (Peer, Session) {
    let (l, addr) = listener();
    let (stop, stopped) = mpsc::channel::<()>();
    let thread = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        act(&mut s);
        // Err once the test dropped `stop`: either way the connection closes now.
        let _ = stopped.recv();
    });
    // A plain connect: a listening socket completes it from its backlog, so no deadline
    // is involved in setting the test up.
    let ours = TcpStream::connect(addr).unwrap();
    let session = Session::from_stream(ours, timeout).unwrap();
    let peer = Peer {
        stop: Some(stop),
        thread: Some(thread),
    };
    (peer, session)
}

/// Blocks until at least `n` bytes from the peer wait to be read on `s`.
fn wait_pending(s: &mut Session, n: usize) {
    let mut buf = vec![0u8; n];
    while s.stream().peek(&mut buf).unwrap() < n {
        thread::yield_now();
    }
}

fn assert_timeout(e: ExchangeError, expected_during: &str) {
    match &e {
        ExchangeError::Timeout { during, .. } if *during == expected_during => {}
        _ => panic!("expected a timeout while {expected_during}, got {e:?}: {e}"),
    }
    let io: std::io::Error = e.into();
    assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
}

fn assert_trailing(e: ExchangeError, expected_during: &str, expected_allowed: usize) {
    match &e {
        ExchangeError::Trailing { during, allowed }
            if *during == expected_during && *allowed == expected_allowed => {}
        _ => panic!(
            "expected Trailing {{ during: {expected_during:?}, allowed: {expected_allowed} }}, got {e:?}: {e}"
        ),
    }
    assert!(e.to_string().contains("out of step"), "{e}");
}

// ---- 1. One deadline per call: trickling and silent peers ----

#[test]
fn peer_that_sends_one_byte_and_stops_times_out() {
    let (_peer, mut s) = peer(SHORT, |p| p.write_all(b"H").unwrap());
    assert_timeout(s.recv().unwrap_err(), "reading the peer's endpoint");
}

#[test]
fn peer_that_trickles_all_but_the_last_byte_times_out() {
    // All but the last byte of its endpoint, one write (one segment: TCP_NODELAY) per
    // byte, then silence.
    let (_peer, mut s) = peer(SHORT, |p| {
        p.set_nodelay(true).unwrap();
        let mut ours = [0u8; WIRE_LEN];
        p.read_exact(&mut ours).unwrap();
        for b in &ep(2).to_bytes()[..WIRE_LEN - 1] {
            p.write_all(std::slice::from_ref(b)).unwrap();
        }
    });
    assert_timeout(
        s.exchange(&ep(1)).unwrap_err(),
        "reading the peer's endpoint",
    );
}

#[test]
fn peer_that_never_answers_a_sync_or_a_pingpong_line_times_out() {
    let (_peer, mut s) = peer(SHORT, |p| {
        let mut tag = [0u8];
        p.read_exact(&mut tag).unwrap();
    });
    assert_timeout(s.sync(b'R').unwrap_err(), "synchronising");

    let (_peer, mut s) = peer(SHORT, |p| {
        let mut line = [0u8; PINGPONG_LEN];
        p.read_exact(&mut line).unwrap();
        p.write_all(&ep(2).to_pingpong()[..20]).unwrap();
    });
    assert_timeout(
        s.pingpong_client(&ep(1)).unwrap_err(),
        "reading the server's pingpong line",
    );
}

// ---- 2. Lockstep: peers that never stop, or are more than one message ahead ----

#[test]
fn peer_that_never_stops_sending_syncs_is_an_error_not_success() {
    let (peer, mut s) = peer(T, |p| while p.write_all(&[b'R'; 4096]).is_ok() {});
    let e = loop {
        if let Err(e) = s.sync(b'R') {
            break e;
        }
    };
    assert_trailing(e, "synchronising", 1);
    drop(s); // ends the peer's writing
    drop(peer);
}

#[test]
fn peer_that_never_stops_sending_endpoints_is_an_error_not_success() {
    let (peer, mut s) = peer(T, |p| {
        let mut stream = Vec::new();
        for _ in 0..64 {
            stream.extend_from_slice(&ep(2).to_bytes());
        }
        while p.write_all(&stream).is_ok() {}
    });
    let e = loop {
        if let Err(e) = s.exchange(&ep(1)) {
            break e;
        }
    };
    assert_trailing(e, "exchanging endpoints", WIRE_LEN);
    drop(s);
    drop(peer);
}

#[test]
fn trailing_bytes_after_a_valid_sync_fail_the_next_step() {
    let (_peer, mut s) = peer(T, |p| {
        p.write_all(b"R").unwrap();
        let mut tag = [0u8];
        p.read_exact(&mut tag).unwrap();
        // A valid sync, then bytes of no step at all.
        p.write_all(b"junk").unwrap();
    });
    // The junk follows our tag, which we send after the check: this sync is in step.
    s.sync(b'R').unwrap();
    wait_pending(&mut s, 4);
    assert_trailing(s.sync(b'R').unwrap_err(), "synchronising", 1);
}

#[test]
fn more_than_one_endpoint_waiting_is_an_error() {
    // Two messages without waiting for ours.
    let (_peer, mut s) = peer(T, |p| {
        p.write_all(&[ep(2).to_bytes(), ep(3).to_bytes()].concat())
            .unwrap()
    });
    wait_pending(&mut s, 2 * WIRE_LEN);
    assert_trailing(
        s.exchange(&ep(1)).unwrap_err(),
        "exchanging endpoints",
        WIRE_LEN,
    );

    // The limit is the length the waiting message's header announces.
    let (_peer, mut s) = peer(T, |p| {
        p.write_all(&ep(2).with_mr(window()).to_bytes()).unwrap();
        p.write_all(b"R").unwrap();
    });
    wait_pending(&mut s, WIRE_LEN_MR + 1);
    assert_trailing(s.recv().unwrap_err(), "receiving an endpoint", WIRE_LEN_MR);
}

#[test]
fn pingpong_peers_out_of_order_are_an_error() {
    // A client that sends "done" before reading our line.
    let (_peer, mut s) = peer(T, |p| {
        p.write_all(&[&ep(2).to_pingpong()[..], b"done\0"].concat())
            .unwrap()
    });
    wait_pending(&mut s, PINGPONG_LEN + 1);
    assert_trailing(
        s.pingpong_server_recv().unwrap_err(),
        "reading the client's pingpong line",
        PINGPONG_LEN,
    );

    // A server that speaks before reading our line.
    let (_peer, mut s) = peer(T, |p| p.write_all(&ep(2).to_pingpong()).unwrap());
    wait_pending(&mut s, PINGPONG_LEN);
    assert_trailing(
        s.pingpong_client(&ep(1)).unwrap_err(),
        "sending our pingpong line",
        0,
    );

    // A server that sends more than its line.
    let (_peer, mut s) = peer(T, |p| {
        let mut line = [0u8; PINGPONG_LEN];
        p.read_exact(&mut line).unwrap();
        p.write_all(&[&ep(2).to_pingpong()[..], b"x"].concat())
            .unwrap();
    });
    // The extra byte goes out with the line, but may still arrive after the check that
    // follows reading the line; then this call cannot see it. If it is seen, it is named.
    match s.pingpong_client(&ep(1)) {
        Ok(theirs) => assert_eq!(theirs, ep(2)),
        Err(e) => assert_trailing(e, "reading the server's pingpong line", 0),
    }
}

#[test]
fn a_peer_one_message_ahead_is_in_step() {
    // The peer moves on as soon as it has our message; we look only once its next
    // message is already waiting, the case a check at the end of a step would reject.
    let (l, addr) = listener();
    let peer = thread::spawn(move || -> Result<(), ExchangeError> {
        let mut p = Session::accept(&l, T)?;
        assert_eq!(p.exchange(&ep(2))?, ep(1));
        p.sync(b'R')?;
        assert_eq!(p.exchange(&ep(4).with_mr(window()))?, ep(3));
        p.sync(b'W')
    });
    let mut s = Session::connect(addr, T).unwrap();
    let kept = Some(Duration::from_secs(77));
    s.stream().set_read_timeout(kept).unwrap();
    assert_eq!(s.exchange(&ep(1)).unwrap(), ep(2));
    wait_pending(&mut s, 1);
    s.sync(b'R').unwrap();
    wait_pending(&mut s, WIRE_LEN_MR);
    assert_eq!(s.exchange(&ep(3)).unwrap(), ep(4).with_mr(window()));
    wait_pending(&mut s, 1);
    s.sync(b'W').unwrap();
    peer.join().unwrap().unwrap();
    // What the caller set on the stream survives the calls (they use their own deadline).
    assert_eq!(s.stream().read_timeout().unwrap(), kept);
}

// ---- 3. Validation on parse ----

#[test]
fn qpn_0_is_rejected_in_both_formats() {
    let zero = Endpoint { qpn: 0, ..ep(1) };
    let e = exchange::parse(&zero.to_bytes()).unwrap_err();
    assert!(matches!(e, ExchangeError::ZeroQpn), "{e:?}");
    assert!(e.to_string().contains("QPN 0"), "{e}");
    let e = exchange::parse_pingpong(&zero.to_pingpong()).unwrap_err();
    assert!(matches!(e, ExchangeError::ZeroQpn), "{e:?}");
    let e = exchange::parse_pingpong(b"0001:000000:000002:fe800000000000000000000000000001\0")
        .unwrap_err();
    assert!(matches!(e, ExchangeError::ZeroQpn), "{e:?}");
    let io: std::io::Error = e.into();
    assert_eq!(io.kind(), std::io::ErrorKind::InvalidData);
}

#[test]
fn lid_0_with_a_zero_gid_is_rejected_a_lid_without_gid_is_not() {
    let nowhere = Endpoint {
        lid: 0,
        gid: [0; 16],
        ..ep(1)
    };
    let e = exchange::parse(&nowhere.to_bytes()).unwrap_err();
    assert!(matches!(e, ExchangeError::NoAddress), "{e:?}");
    // What ibv_rc_pingpong sends on RoCE without -g.
    let e = exchange::parse_pingpong(b"0000:000011:000022:00000000000000000000000000000000\0")
        .unwrap_err();
    assert!(matches!(e, ExchangeError::NoAddress), "{e:?}");
    assert!(e.to_string().contains("-g"), "{e}");
    // InfiniBand addressed by LID: the GID may be zero.
    let by_lid = Endpoint { lid: 7, ..nowhere };
    assert_eq!(exchange::parse(&by_lid.to_bytes()).unwrap(), by_lid);
    assert_eq!(
        exchange::parse_pingpong(&by_lid.to_pingpong()).unwrap(),
        by_lid
    );
}

#[test]
fn mr_windows_no_rdma_operation_can_use_are_rejected() {
    for (mr, expected) in [
        (RemoteMr { len: 0, ..window() }, "length 0"),
        (RemoteMr::default(), "length 0"),
        (
            RemoteMr {
                rkey: 0,
                ..window()
            },
            "rkey 0",
        ),
        (
            RemoteMr {
                addr: u64::MAX - 1,
                ..window()
            },
            "addr + len overflows",
        ),
    ] {
        let e = exchange::parse(&ep(1).with_mr(mr).to_bytes()).unwrap_err();
        match &e {
            ExchangeError::BadWindow { mr: got, reason } => {
                assert_eq!((*got, *reason), (mr, expected), "{e}")
            }
            _ => panic!("{mr:?}: expected BadWindow({expected}), got {e:?}"),
        }
        assert!(e.to_string().contains(expected), "{e}");
    }
    // One byte with a key is a window.
    let one = ep(1).with_mr(RemoteMr { len: 1, ..window() });
    assert_eq!(exchange::parse(&one.to_bytes()).unwrap(), one);
}

#[test]
fn an_unusable_endpoint_over_the_wire_is_named() {
    let (_peer, mut s) = peer(T, |p| {
        p.write_all(&Endpoint { qpn: 0, ..ep(2) }.to_bytes())
            .unwrap()
    });
    let e = s.exchange(&ep(1)).unwrap_err();
    assert!(matches!(e, ExchangeError::ZeroQpn), "{e:?}");
}

// ---- 4. Timeouts beyond Instant: no deadline, no panic ----

#[test]
fn duration_max_means_no_deadline_and_does_not_panic() {
    let (l, addr) = listener();
    let server = thread::spawn(move || -> Result<Endpoint, ExchangeError> {
        let mut s = Session::accept(&l, Duration::MAX)?;
        assert_eq!(s.stream().read_timeout().unwrap(), None);
        let theirs = s.exchange(&ep(2))?;
        s.sync(b'M')?;
        Ok(theirs)
    });
    let mut c = Session::connect(addr, Duration::MAX).unwrap();
    assert_eq!(c.stream().read_timeout().unwrap(), None);
    assert_eq!(c.exchange(&ep(1)).unwrap(), ep(2));
    c.sync(b'M').unwrap();
    assert_eq!(server.join().unwrap().unwrap(), ep(1));

    // Not only MAX: anything past what Instant holds.
    let (l, addr) = listener();
    let huge = Duration::from_secs(u64::MAX / 2);
    let client = thread::spawn(move || Session::connect(addr, huge).map(drop));
    Session::accept(&l, huge).unwrap();
    client.join().unwrap().unwrap();
}

// ---- 5. ConnectOptions: finite transport retries ----

#[test]
fn connect_options_default_retries_are_finite() {
    let o = ConnectOptions::default();
    // rxe takes retry_cnt 7 as "for ever": a dead peer would never be reported.
    assert_eq!((o.timeout, o.retry_cnt), (14, 6));
    let ctx = Context::open("softnic").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    Qp::connect_pair(&a, &b, &ctx.port_info(None, None).unwrap(), &o).unwrap();
    let attr = a.query().unwrap();
    assert_eq!(
        (attr.timeout(), attr.retry_cnt(), attr.rnr_retry()),
        (14, 6, o.rnr_retry)
    );
}
