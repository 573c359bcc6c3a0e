//! The out-of-band control channel between client and server, on hotverbs' endpoint
//! exchange ([`hotverbs::exchange::Session`]): every connect, read and write is bounded by
//! `--timeout`, so an unreachable or silent peer is an error after a known time, never a
//! hang.
//!
//! The client connects and sends [`Msg::Hello`] with its parameters; the server checks they
//! name the same test and adopts them (like perftest, the client's sizes and iteration counts
//! rule) or answers [`Msg::Reject`]. The QP endpoints (with the landing-zone MR window) then
//! go through [`Session::exchange`] in hotverbs' binary format, one exchange per QP (`-q`);
//! after that the sides meet at a barrier before every size, and the client reports each
//! finished size. Control messages are JSON frames (4-byte big-endian length, then the
//! text).

use std::io::{ErrorKind, Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use hotverbs::exchange::{Endpoint, ExchangeError, Session};
use serde::{Deserialize, Serialize};

use crate::cli::Params;
use crate::error::PerfError;
use crate::report::SizeResult;

/// Version of this protocol; both sides must speak the same. 2: `-q` (the parameters carry
/// the number of QPs, and that many endpoints are exchanged).
pub const PROTOCOL: u32 = 2;
/// Largest control frame accepted.
const MAX_FRAME: usize = 1 << 20;

/// Messages on the control channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Msg {
    /// Client -> server: the run's parameters.
    Hello {
        /// [`PROTOCOL`].
        protocol: u32,
        /// The client's parameters.
        params: Params,
    },
    /// Server -> client: parameters adopted.
    Accept,
    /// Server -> client: refused, with the reason.
    Reject(String),
    /// Barrier: ready for the size with this index.
    Ready(usize),
    /// Client -> server: the size with this index is over; its result.
    SizeDone(usize, SizeResult),
    /// A side failed; the text says why.
    Failed(String),
}

/// A connected control channel.
pub struct Control {
    session: Session,
    peer: String,
    timeout: Duration,
}

impl Control {
    /// Client: connects to `host:port` within `timeout` (refused connections are retried
    /// until then: the server may still be starting).
    pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<Control, PerfError> {
        let target = format!("{host}:{port}");
        let session = Session::connect((host, port), timeout)
            .map_err(|e| PerfError::exchange(format!("connect to {target}"), e))?;
        Ok(Control {
            session,
            peer: target,
            timeout,
        })
    }

    /// Server: listens on `port` (all addresses); port 0 picks a free one (the listener's
    /// `local_addr` tells which). Accept the client with [`Control::accept_on`].
    pub fn listen(port: u16) -> Result<TcpListener, PerfError> {
        TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
            let hint = if e.kind() == ErrorKind::AddrInUse {
                "another process holds this port: pick another with -p (-p 0: any free port)"
            } else {
                "check the port number and permissions"
            };
            PerfError::Io {
                what: format!("listen on TCP port {port}"),
                source: e,
                hint: Some(hint),
            }
        })
    }

    /// Accepts one client on an existing listener within `wait`.
    pub fn accept_on(
        l: &TcpListener,
        wait: Duration,
        timeout: Duration,
    ) -> Result<Control, PerfError> {
        let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
        let mut session = Session::accept(l, wait).map_err(|e| match e {
            ExchangeError::Timeout { .. } => PerfError::NoClient {
                port,
                wait,
                source: e,
            },
            e => PerfError::exchange(format!("accept on TCP port {port}"), e),
        })?;
        let peer = session
            .stream()
            .peer_addr()
            .map_or_else(|_| "the client".to_string(), |a| a.to_string());
        let session = Session::from_stream(
            session
                .stream()
                .try_clone()
                .map_err(|e| PerfError::io("control connection", e))?,
            timeout,
        )
        .map_err(|e| PerfError::exchange("configure the control connection", e))?;
        Ok(Control {
            session,
            peer,
            timeout,
        })
    }

    /// Changes the read timeout (a passive side waits as long as the active side runs).
    pub fn set_read_timeout(&mut self, t: Duration) -> Result<(), PerfError> {
        self.timeout = t;
        self.session
            .stream()
            .set_read_timeout(Some(t))
            .map_err(|e| PerfError::io("set the read timeout", e))
    }

    /// Sends one message.
    pub fn send(&mut self, m: &Msg) -> Result<(), PerfError> {
        let body = serde_json::to_vec(m).map_err(|e| PerfError::Json {
            what: format!("encode {m:?}"),
            source: e,
        })?;
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        let peer = self.peer.clone();
        self.session
            .stream()
            .write_all(&frame)
            .map_err(|e| PerfError::Io {
                what: format!("send to {peer}"),
                source: e,
                hint: Some("the peer closed the connection or stopped reading"),
            })
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), PerfError> {
        let mut got = 0;
        while got < buf.len() {
            match self.session.stream().read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(PerfError::PeerClosed {
                        peer: self.peer.clone(),
                    })
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(PerfError::PeerSilent {
                        peer: self.peer.clone(),
                        after: self.timeout,
                        source: e,
                    })
                }
                Err(e) => return Err(PerfError::io(format!("receive from {}", self.peer), e)),
            }
        }
        Ok(())
    }

    /// Receives one message (within the read timeout). A [`Msg::Failed`] from the peer
    /// becomes an error carrying its text.
    pub fn recv(&mut self) -> Result<Msg, PerfError> {
        let mut len = [0u8; 4];
        self.read_exact(&mut len)?;
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(PerfError::Protocol(format!(
                "the peer {} sent a {len}-byte frame: it is not hotverbs-perf of this version",
                self.peer
            )));
        }
        let mut body = vec![0u8; len];
        self.read_exact(&mut body)?;
        let m: Msg = serde_json::from_slice(&body).map_err(|e| PerfError::Garbled {
            peer: self.peer.clone(),
            source: e,
        })?;
        match m {
            Msg::Failed(why) => Err(PerfError::PeerFailed {
                peer: self.peer.clone(),
                why,
            }),
            m => Ok(m),
        }
    }

    /// Receives and checks that the message is `what` (by a predicate).
    pub fn expect<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(Msg) -> Result<T, Box<Msg>>,
    ) -> Result<T, PerfError> {
        let m = self.recv()?;
        f(m).map_err(|m| {
            PerfError::Protocol(format!(
                "protocol error: expected {what} from the peer, got {m:?}"
            ))
        })
    }

    /// Tells the peer this side failed (best effort) and closes.
    pub fn fail(&mut self, why: &str) {
        let _ = self.send(&Msg::Failed(why.to_string()));
        let _ = self.session.stream().shutdown(std::net::Shutdown::Both);
    }

    /// Client handshake: Hello -> Accept.
    pub fn hello(&mut self, params: &Params) -> Result<(), PerfError> {
        self.send(&Msg::Hello {
            protocol: PROTOCOL,
            params: params.clone(),
        })?;
        match self.recv()? {
            Msg::Accept => Ok(()),
            Msg::Reject(why) => Err(PerfError::Refused {
                peer: self.peer.clone(),
                why,
            }),
            m => Err(PerfError::Protocol(format!(
                "protocol error: expected Accept, got {m:?}"
            ))),
        }
    }

    /// Server handshake: receives Hello, checks it against `ours`, and returns the
    /// parameters to run with (the client's).
    pub fn welcome(&mut self, ours: &Params) -> Result<Params, PerfError> {
        let (protocol, theirs) = self.expect("Hello", |m| match m {
            Msg::Hello { protocol, params } => Ok((protocol, params)),
            m => Err(Box::new(m)),
        })?;
        let reject = |c: &mut Control, why: String| {
            let _ = c.send(&Msg::Reject(why.clone()));
            Err(PerfError::Protocol(why))
        };
        if protocol != PROTOCOL {
            return reject(
                self,
                format!(
                    "protocol {protocol} != {PROTOCOL}: run the same hotverbs-perf version on \
                     both sides"
                ),
            );
        }
        if theirs.test != ours.test {
            return reject(
                self,
                format!(
                    "the client runs {} but the server runs {}: start both with the same test",
                    theirs.test, ours.test
                ),
            );
        }
        self.send(&Msg::Accept)?;
        Ok(theirs)
    }

    /// Exchanges endpoints through hotverbs' exchange (binary format, with the MR window).
    pub fn exchange(&mut self, ours: &Endpoint) -> Result<Endpoint, PerfError> {
        self.session
            .exchange(ours)
            .map_err(|e| PerfError::exchange(format!("endpoint exchange with {}", self.peer), e))
    }

    /// Exchanges every QP's endpoint, in order (both sides have the same number: the
    /// parameters agreed on say how many).
    pub fn exchange_all(&mut self, ours: &[Endpoint]) -> Result<Vec<Endpoint>, PerfError> {
        ours.iter().map(|e| self.exchange(e)).collect()
    }

    /// Barrier before size `i`.
    pub fn barrier(&mut self, i: usize) -> Result<(), PerfError> {
        self.send(&Msg::Ready(i))?;
        self.expect(&format!("Ready({i})"), |m| match m {
            Msg::Ready(j) if j == i => Ok(()),
            m => Err(Box::new(m)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Amount, AtomicKind, TestKind};
    use hotverbs::RemoteMr;

    fn params(test: TestKind) -> Params {
        Params {
            test,
            sizes: vec![2, 4],
            amount: Amount::Iters(10),
            warmup: 1,
            inline_size: None,
            cq_mod: 1,
            post_list: 1,
            tx_depth: 8,
            rx_depth: 8,
            atomic: AtomicKind::FetchAndAdd,
            connection: Default::default(),
            qps: 1,
            write_imm: false,
        }
    }

    fn pair() -> (Control, std::thread::JoinHandle<Result<Control, PerfError>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            Control::accept_on(&l, Duration::from_secs(5), Duration::from_secs(5))
        });
        let c = Control::connect("127.0.0.1", port, Duration::from_secs(5)).unwrap();
        (c, t)
    }

    fn ep(qpn: u32) -> Endpoint {
        Endpoint {
            lid: 0,
            qpn,
            psn: qpn * 10,
            gid: [qpn as u8; 16],
            mr: Some(RemoteMr {
                addr: 0x1000 * qpn as u64,
                len: 64,
                rkey: qpn + 100,
            }),
        }
    }

    #[test]
    fn handshake_exchange_and_barriers() {
        let (mut c, t) = pair();
        let mut s = t.join().unwrap().unwrap();
        let p = params(TestKind::SendLat);
        let srv = std::thread::spawn(move || {
            let got = s.welcome(&params(TestKind::SendLat)).unwrap();
            let peer = s.exchange(&ep(2)).unwrap();
            let more = s.exchange_all(&[ep(4), ep(6), ep(8)]).unwrap();
            assert_eq!(more, [ep(3), ep(5), ep(7)]);
            s.barrier(0).unwrap();
            s.barrier(1).unwrap();
            (got, peer)
        });
        c.hello(&p).unwrap();
        let theirs = c.exchange(&ep(1)).unwrap();
        assert_eq!(theirs, ep(2));
        let more = c.exchange_all(&[ep(3), ep(5), ep(7)]).unwrap();
        assert_eq!(more, [ep(4), ep(6), ep(8)], "in order");
        c.barrier(0).unwrap();
        c.barrier(1).unwrap();
        let (got, peer) = srv.join().unwrap();
        assert_eq!(got, p);
        assert_eq!(peer, ep(1));
    }

    #[test]
    fn mismatched_test_is_refused_on_both_sides() {
        let (mut c, t) = pair();
        let mut s = t.join().unwrap().unwrap();
        let srv = std::thread::spawn(move || s.welcome(&params(TestKind::WriteLat)));
        let e = c.hello(&params(TestKind::SendLat)).unwrap_err().to_string();
        assert!(e.contains("refused") && e.contains("send_lat"), "{e}");
        let e = srv.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("write_lat"), "{e}");
    }

    #[test]
    fn refused_connection_is_a_clear_error_within_the_timeout() {
        // Bound, never listening, held until the end: refused every time.
        let (_refusing, addr) = hotverbs::testing::refusing_addr();
        let port = addr.port();
        let e = Control::connect("127.0.0.1", port, Duration::from_millis(500))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(&format!("connect to 127.0.0.1:{port}")), "{e}");
        assert!(e.contains("start the server first"), "{e}");
    }

    #[test]
    fn silent_peer_times_out() {
        let (mut c, t) = pair();
        let _s = t.join().unwrap().unwrap(); // accepted, says nothing
        c.set_read_timeout(Duration::from_millis(200)).unwrap();
        let e = c.recv().unwrap_err().to_string();
        assert!(e.contains("timed out"), "{e}");
    }

    #[test]
    fn server_gives_up_without_a_client() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = Control::accept_on(&l, Duration::from_millis(100), Duration::from_secs(1))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("no client connected"), "{e}");
    }

    #[test]
    fn peer_failure_and_close_are_reported() {
        let (mut c, t) = pair();
        let mut s = t.join().unwrap().unwrap();
        s.fail("ibv_modify_qp(RTR) failed: EINVAL");
        let e = c.recv().unwrap_err().to_string();
        assert!(e.contains("peer") && e.contains("EINVAL"), "{e}");
        let e = c.recv().unwrap_err().to_string();
        assert!(e.contains("closed"), "{e}");
    }
}
