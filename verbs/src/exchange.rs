//! Endpoint exchange over TCP: our own versioned binary format, and the text format of
//! rdma-core's `ibv_rc_pingpong` (`%04x:%06x:%06x:%s` = LID:QPN:PSN:GID), both as client
//! and as server. Every socket operation has a timeout: nothing here can hang.
//!
//! # Our format (version 1, all integers big-endian)
//! ```text
//! offset size field
//!      0    4 magic "HVEP"
//!      4    1 version (1)
//!      5    1 flags (bit 0: an MR window follows; other bits must be 0)
//!      6    2 reserved (0)
//!      8    2 LID
//!     10    2 reserved (0)
//!     12    4 QPN (24-bit)
//!     16    4 PSN (24-bit)
//!     20   16 GID (network order)
//!     36    8 MR addr      } only with flag bit 0
//!     44    8 MR len       }
//!     52    4 MR rkey      }
//! ```
//! 36 bytes without an MR window, 56 with.
//!
//! # The `ibv_rc_pingpong` format
//! 52 bytes: `"%04x:%06x:%06x:"` and the GID as 32 hex digits, NUL-terminated
//! (`sizeof "0000:000000:000000:00000000000000000000000000000000"`). rdma-core's
//! `gid_to_wire_gid` prints each 32-bit word of the GID with `htobe32` and `%08x`, which on
//! any host yields the 16 GID bytes in network order as hex; `wire_gid_to_gid` undoes it.
//! The client sends its line, reads the server's, then sends `"done"` (5 bytes with the
//! NUL). The server reads the client's line, connects its QP, answers with its line and
//! reads `"done"`.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::device::Gid;
use crate::mr::RemoteMr;

/// One side of a connection: what the peer needs to reach our QP (and, for one-sided
/// operations, our memory).
///
/// # Example
/// ```
/// use hotverbs::exchange::{self, Endpoint};
/// let ep = Endpoint { lid: 1, qpn: 0x11, psn: 0x22, gid: [0; 16], mr: None };
/// let bytes = ep.to_bytes();
/// assert_eq!(exchange::parse(&bytes)?, ep);
/// let text = ep.to_pingpong();
/// assert_eq!(&text[..19], b"0001:000011:000022:");
/// assert_eq!(exchange::parse_pingpong(&text)?, ep);
/// # Ok::<(), exchange::ExchangeError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number (24-bit).
    pub qpn: u32,
    /// First send PSN (24-bit).
    pub psn: u32,
    /// GID in network order (zero when addressing by LID).
    pub gid: [u8; 16],
    /// A remote window for RDMA read/write/atomics, if offered.
    pub mr: Option<RemoteMr>,
}

impl Endpoint {
    /// The GID as a [`Gid`].
    pub fn gid(&self) -> Gid {
        Gid(self.gid)
    }

    /// The same endpoint offering `mr`.
    pub fn with_mr(mut self, mr: RemoteMr) -> Self {
        self.mr = Some(mr);
        self
    }
}

/// Why parsing or exchanging failed.
///
/// # Example
/// ```
/// use hotverbs::exchange::{parse_pingpong, ExchangeError};
/// match parse_pingpong(b"0001:000002:000003") {
///     Err(ExchangeError::Length { expected: 52, got: 18, .. }) => {}
///     other => panic!("{other:?}"),
/// }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ExchangeError {
    /// The message has the wrong size.
    Length {
        /// Which format.
        format: &'static str,
        /// Bytes expected.
        expected: usize,
        /// Bytes received.
        got: usize,
    },
    /// Not our magic `HVEP`.
    BadMagic([u8; 4]),
    /// A version we do not speak.
    Version(u8),
    /// A field is malformed or out of range.
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The peer closed the connection in the middle of a message.
    Truncated {
        /// Doing what.
        during: &'static str,
        /// Bytes of the message expected.
        expected: usize,
        /// Bytes received before the connection closed.
        got: usize,
    },
    /// The peer did not answer in time.
    Timeout {
        /// Doing what.
        during: &'static str,
        /// After how long.
        after: Duration,
    },
    /// A socket error.
    Io {
        /// Doing what.
        during: &'static str,
        /// The error.
        source: io::Error,
    },
}

impl fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExchangeError::Length { format, expected, got } => write!(
                f,
                "{format} endpoint message: expected {expected} bytes, got {got} (peer speaks another format or version?)"
            ),
            ExchangeError::BadMagic(m) => write!(
                f,
                "endpoint message: bad magic {m:02x?}, expected \"HVEP\" (is the peer ibv_rc_pingpong? use the pingpong format)"
            ),
            ExchangeError::Version(v) => {
                write!(f, "endpoint message: version {v}, this build speaks version {VERSION}")
            }
            ExchangeError::Field { field, reason } => {
                write!(f, "endpoint message: field {field}: {reason}")
            }
            ExchangeError::Truncated { during, expected, got } => write!(
                f,
                "endpoint exchange: {during}: the peer closed the connection after {got} of {expected} bytes"
            ),
            ExchangeError::Timeout { during, after } => {
                write!(f, "endpoint exchange: timed out after {after:?} while {during} (peer not running, or firewall?)")
            }
            ExchangeError::Io { during, source } => {
                write!(f, "endpoint exchange: {during}: {source}")
            }
        }
    }
}

impl std::error::Error for ExchangeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExchangeError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<ExchangeError> for io::Error {
    fn from(e: ExchangeError) -> Self {
        let kind = match &e {
            ExchangeError::Timeout { .. } => io::ErrorKind::TimedOut,
            ExchangeError::Io { source, .. } => source.kind(),
            _ => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, e)
    }
}

const MAGIC: [u8; 4] = *b"HVEP";
/// The version of our binary format.
pub const VERSION: u8 = 1;
/// Size of our message without an MR window.
pub const WIRE_LEN: usize = 36;
/// Size of our message with an MR window.
pub const WIRE_LEN_MR: usize = 56;
/// Size of an `ibv_rc_pingpong` message, NUL included.
pub const PINGPONG_LEN: usize = 52;
const FLAG_MR: u8 = 1;

fn field(field: &'static str, reason: impl Into<String>) -> ExchangeError {
    ExchangeError::Field {
        field,
        reason: reason.into(),
    }
}

impl Endpoint {
    /// Our binary format (36 or 56 bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(WIRE_LEN_MR);
        v.extend_from_slice(&MAGIC);
        v.push(VERSION);
        v.push(if self.mr.is_some() { FLAG_MR } else { 0 });
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(&self.lid.to_be_bytes());
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(&self.qpn.to_be_bytes());
        v.extend_from_slice(&self.psn.to_be_bytes());
        v.extend_from_slice(&self.gid);
        if let Some(m) = self.mr {
            v.extend_from_slice(&m.addr.to_be_bytes());
            v.extend_from_slice(&m.len.to_be_bytes());
            v.extend_from_slice(&m.rkey.to_be_bytes());
        }
        v
    }

    /// The `ibv_rc_pingpong` format (52 bytes, NUL-terminated). The MR window is not part
    /// of that format and is left out.
    ///
    /// QPN and PSN are masked to 24 bits as the format's `%06x` fields hold them.
    pub fn to_pingpong(&self) -> [u8; PINGPONG_LEN] {
        let mut s = format!(
            "{:04x}:{:06x}:{:06x}:",
            self.lid,
            self.qpn & 0x00ff_ffff,
            self.psn & 0x00ff_ffff
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}"));
        }
        let mut out = [0u8; PINGPONG_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// Parses our binary format. Rejects wrong lengths, magic, version, unknown flags,
/// non-zero reserved bytes and QPN/PSN beyond 24 bits.
///
/// # Example
/// ```
/// use hotverbs::exchange::{parse, ExchangeError};
/// assert!(matches!(parse(b"HVEP"), Err(ExchangeError::Length { .. })));
/// ```
pub fn parse(b: &[u8]) -> Result<Endpoint, ExchangeError> {
    if b.len() < 8 {
        return Err(ExchangeError::Length {
            format: "hotverbs",
            expected: WIRE_LEN,
            got: b.len(),
        });
    }
    if b[..4] != MAGIC {
        return Err(ExchangeError::BadMagic([b[0], b[1], b[2], b[3]]));
    }
    if b[4] != VERSION {
        return Err(ExchangeError::Version(b[4]));
    }
    let flags = b[5];
    if flags & !FLAG_MR != 0 {
        return Err(field("flags", format!("unknown bits {flags:#04x}")));
    }
    let expected = if flags & FLAG_MR != 0 {
        WIRE_LEN_MR
    } else {
        WIRE_LEN
    };
    if b.len() != expected {
        return Err(ExchangeError::Length {
            format: "hotverbs",
            expected,
            got: b.len(),
        });
    }
    if b[6..8] != [0, 0] || b[10..12] != [0, 0] {
        return Err(field("reserved", "must be zero"));
    }
    let qpn = be32(&b[12..16]);
    if qpn > 0x00ff_ffff {
        return Err(field("qpn", format!("{qpn:#x} is wider than 24 bits")));
    }
    let psn = be32(&b[16..20]);
    if psn > 0x00ff_ffff {
        return Err(field("psn", format!("{psn:#x} is wider than 24 bits")));
    }
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&b[20..36]);
    let mr = if flags & FLAG_MR != 0 {
        let m = RemoteMr {
            addr: be64(&b[36..44]),
            len: be64(&b[44..52]),
            rkey: be32(&b[52..56]),
        };
        if m.addr.checked_add(m.len).is_none() {
            return Err(field("mr", "addr + len overflows"));
        }
        Some(m)
    } else {
        None
    };
    Ok(Endpoint {
        lid: be16(&b[8..10]),
        qpn,
        psn,
        gid,
        mr,
    })
}

fn hex_field(s: &[u8], name: &'static str) -> Result<u32, ExchangeError> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_hexdigit) {
        return Err(field(
            name,
            format!(
                "{:?} is not {} hex digits",
                String::from_utf8_lossy(s),
                s.len()
            ),
        ));
    }
    let text = std::str::from_utf8(s).map_err(|_| field(name, "not ASCII"))?;
    u32::from_str_radix(text, 16).map_err(|e| field(name, e.to_string()))
}

/// Parses an `ibv_rc_pingpong` message: exactly 52 bytes, `LLLL:QQQQQQ:PPPPPP:` + 32 hex
/// digits + NUL (upper- or lower-case hex).
///
/// # Example
/// ```
/// use hotverbs::exchange::parse_pingpong;
/// let mut msg = *b"0011:000abc:123456:fe800000000000000000000000000001\0";
/// let ep = parse_pingpong(&msg)?;
/// assert_eq!((ep.lid, ep.qpn, ep.psn), (0x11, 0xabc, 0x123456));
/// assert_eq!(ep.gid[0], 0xfe);
/// msg[4] = b'-';
/// assert!(parse_pingpong(&msg).is_err());
/// # Ok::<(), hotverbs::exchange::ExchangeError>(())
/// ```
pub fn parse_pingpong(b: &[u8]) -> Result<Endpoint, ExchangeError> {
    if b.len() != PINGPONG_LEN {
        return Err(ExchangeError::Length {
            format: "ibv_rc_pingpong",
            expected: PINGPONG_LEN,
            got: b.len(),
        });
    }
    if b[51] != 0 {
        return Err(field("terminator", "byte 51 must be NUL"));
    }
    for (i, name) in [
        (4usize, "separator after LID"),
        (11, "separator after QPN"),
        (18, "separator after PSN"),
    ] {
        if b[i] != b':' {
            return Err(field(
                name,
                format!("expected ':' at byte {i}, got {:?}", b[i] as char),
            ));
        }
    }
    let lid = hex_field(&b[0..4], "lid")? as u16;
    let qpn = hex_field(&b[5..11], "qpn")?;
    let psn = hex_field(&b[12..18], "psn")?;
    let mut gid = [0u8; 16];
    for (i, g) in gid.iter_mut().enumerate() {
        *g = hex_field(&b[19 + 2 * i..21 + 2 * i], "gid")? as u8;
    }
    Ok(Endpoint {
        lid,
        qpn,
        psn,
        gid,
        mr: None,
    })
}

fn io_err(during: &'static str, timeout: Duration) -> impl Fn(io::Error) -> ExchangeError {
    move |e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ExchangeError::Timeout {
            during,
            after: timeout,
        },
        _ => ExchangeError::Io { during, source: e },
    }
}

/// A TCP connection for exchanging endpoints (and small synchronisation messages), with
/// a read/write timeout on every operation.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use hotverbs::exchange::{Endpoint, Session};
/// let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
/// let addr = listener.local_addr().unwrap();
/// let t = Duration::from_secs(5);
/// let server = std::thread::spawn(move || {
///     let mut s = Session::accept(&listener, t)?;
///     s.exchange(&Endpoint { qpn: 2, ..Default::default() })
/// });
/// let mut c = Session::connect(addr, t)?;
/// let theirs = c.exchange(&Endpoint { qpn: 1, ..Default::default() })?;
/// assert_eq!(theirs.qpn, 2);
/// assert_eq!(server.join().unwrap()?.qpn, 1);
/// # Ok::<(), hotverbs::exchange::ExchangeError>(())
/// ```
#[derive(Debug)]
pub struct Session {
    stream: TcpStream,
    timeout: Duration,
}

impl Session {
    /// Connects to `addr`, retrying refused connections until `timeout` (the server may
    /// not be listening yet).
    pub fn connect(addr: impl ToSocketAddrs, timeout: Duration) -> Result<Session, ExchangeError> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| ExchangeError::Io {
                during: "resolving the server address",
                source: e,
            })?
            .collect();
        let deadline = Instant::now() + timeout;
        let mut last: Option<io::Error> = None;
        loop {
            for a in &addrs {
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1));
                match TcpStream::connect_timeout(a, left) {
                    Ok(stream) => return Session::from_stream(stream, timeout),
                    Err(e) => last = Some(e),
                }
            }
            if Instant::now() >= deadline {
                return Err(match last {
                    Some(e)
                        if e.kind() != io::ErrorKind::TimedOut
                            && e.kind() != io::ErrorKind::ConnectionRefused =>
                    {
                        ExchangeError::Io {
                            during: "connecting",
                            source: e,
                        }
                    }
                    _ => ExchangeError::Timeout {
                        during: "connecting",
                        after: timeout,
                    },
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Accepts one connection on `listener` within `timeout`.
    pub fn accept(listener: &TcpListener, timeout: Duration) -> Result<Session, ExchangeError> {
        listener
            .set_nonblocking(true)
            .map_err(io_err("accepting", timeout))?;
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let _ = listener.set_nonblocking(false);
                        return Err(ExchangeError::Timeout {
                            during: "waiting for a client",
                            after: timeout,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => {
                    let _ = listener.set_nonblocking(false);
                    return Err(ExchangeError::Io {
                        during: "accepting",
                        source: e,
                    });
                }
            }
        };
        let _ = listener.set_nonblocking(false);
        stream
            .set_nonblocking(false)
            .map_err(io_err("accepting", timeout))?;
        Session::from_stream(stream, timeout)
    }

    /// Wraps a connected stream, setting its timeouts.
    pub fn from_stream(stream: TcpStream, timeout: Duration) -> Result<Session, ExchangeError> {
        let t = Some(timeout.max(Duration::from_millis(1)));
        stream
            .set_read_timeout(t)
            .map_err(io_err("configuring the socket", timeout))?;
        stream
            .set_write_timeout(t)
            .map_err(io_err("configuring the socket", timeout))?;
        let _ = stream.set_nodelay(true);
        Ok(Session { stream, timeout })
    }

    /// The underlying stream.
    pub fn stream(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    fn write_all(&mut self, b: &[u8], during: &'static str) -> Result<(), ExchangeError> {
        self.stream
            .write_all(b)
            .map_err(io_err(during, self.timeout))
    }

    fn read_exact(&mut self, b: &mut [u8], during: &'static str) -> Result<(), ExchangeError> {
        self.read_range(b, 0, during)
    }

    /// Fills `b[from..]`; `from` bytes of the message were read before.
    fn read_range(
        &mut self,
        b: &mut [u8],
        from: usize,
        during: &'static str,
    ) -> Result<(), ExchangeError> {
        let mut got = from;
        while got < b.len() {
            match self.stream.read(&mut b[got..]) {
                Ok(0) => {
                    return Err(ExchangeError::Truncated {
                        during,
                        expected: b.len(),
                        got,
                    })
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(during, self.timeout)(e)),
            }
        }
        Ok(())
    }

    /// Sends ours, receives theirs (our binary format; symmetric, so both sides call it).
    pub fn exchange(&mut self, ours: &Endpoint) -> Result<Endpoint, ExchangeError> {
        self.write_all(&ours.to_bytes(), "sending our endpoint")?;
        self.recv()
    }

    /// Receives one endpoint in our format.
    pub fn recv(&mut self) -> Result<Endpoint, ExchangeError> {
        let mut head = [0u8; WIRE_LEN_MR];
        self.read_exact(&mut head[..8], "reading the peer's endpoint")?;
        if head[..4] != MAGIC {
            return Err(ExchangeError::BadMagic([
                head[0], head[1], head[2], head[3],
            ]));
        }
        if head[4] != VERSION {
            return Err(ExchangeError::Version(head[4]));
        }
        let len = if head[5] & FLAG_MR != 0 {
            WIRE_LEN_MR
        } else {
            WIRE_LEN
        };
        self.read_range(&mut head[..len], 8, "reading the peer's endpoint")?;
        parse(&head[..len])
    }

    /// A barrier: both sides send `tag` and wait for the other's (the manual's
    /// `sock_sync_data`). Fails if the peer sent a different tag.
    pub fn sync(&mut self, tag: u8) -> Result<(), ExchangeError> {
        self.write_all(&[tag], "synchronising")?;
        let mut b = [0u8];
        self.read_exact(&mut b, "synchronising")?;
        if b[0] != tag {
            return Err(field(
                "sync tag",
                format!("expected {:?}, got {:?}", tag as char, b[0] as char),
            ));
        }
        Ok(())
    }

    /// `ibv_rc_pingpong` client side: send our line, read the server's, send `"done"`.
    pub fn pingpong_client(&mut self, ours: &Endpoint) -> Result<Endpoint, ExchangeError> {
        self.write_all(&ours.to_pingpong(), "sending our pingpong line")?;
        let mut msg = [0u8; PINGPONG_LEN];
        self.read_exact(&mut msg, "reading the server's pingpong line")?;
        let theirs = parse_pingpong(&msg)?;
        self.write_all(b"done\0", "sending \"done\"")?;
        Ok(theirs)
    }

    /// `ibv_rc_pingpong` server side, step 1: read the client's line. Connect the QP, then
    /// call [`pingpong_server_reply`](Self::pingpong_server_reply).
    pub fn pingpong_server_recv(&mut self) -> Result<Endpoint, ExchangeError> {
        let mut msg = [0u8; PINGPONG_LEN];
        self.read_exact(&mut msg, "reading the client's pingpong line")?;
        parse_pingpong(&msg)
    }

    /// `ibv_rc_pingpong` server side, step 2: send our line and wait for `"done"`.
    pub fn pingpong_server_reply(&mut self, ours: &Endpoint) -> Result<(), ExchangeError> {
        self.write_all(&ours.to_pingpong(), "sending our pingpong line")?;
        let mut done = [0u8; 5];
        self.read_exact(&mut done, "reading \"done\"")?;
        if &done != b"done\0" {
            return Err(field(
                "done",
                format!("expected \"done\\0\", got {done:02x?}"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(mr: bool) -> Endpoint {
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = (i as u8) * 17;
        }
        Endpoint {
            lid: 0xbeef,
            qpn: 0xabcdef,
            psn: 0x123456,
            gid,
            mr: mr.then_some(RemoteMr {
                addr: 0x7fff_0000_1000,
                len: 8192,
                rkey: 0xdead_beef,
            }),
        }
    }

    #[test]
    fn binary_roundtrip_and_lengths() {
        for with_mr in [false, true] {
            let e = ep(with_mr);
            let b = e.to_bytes();
            assert_eq!(b.len(), if with_mr { WIRE_LEN_MR } else { WIRE_LEN });
            assert_eq!(parse(&b).unwrap(), e);
            // Every truncation is rejected, never a panic.
            for n in 0..b.len() {
                assert!(parse(&b[..n]).is_err(), "len {n}");
            }
            let mut longer = b.clone();
            longer.push(0);
            assert!(matches!(parse(&longer), Err(ExchangeError::Length { .. })));
        }
    }

    #[test]
    fn pingpong_gid_is_bytes_in_network_order() {
        let e = ep(false);
        let t = e.to_pingpong();
        assert_eq!(
            std::str::from_utf8(&t[..51]).unwrap(),
            "beef:abcdef:123456:00112233445566778899aabbccddeeff"
        );
        assert_eq!(t[51], 0);
        assert_eq!(parse_pingpong(&t).unwrap(), e);
    }

    #[test]
    fn pingpong_rejects_each_malformed_kind() {
        let good = ep(false).to_pingpong();
        let mut bad = good;
        bad[2] = b'g';
        assert!(parse_pingpong(&bad)
            .unwrap_err()
            .to_string()
            .contains("lid"));
        let mut bad = good;
        bad[11] = b'.';
        assert!(parse_pingpong(&bad)
            .unwrap_err()
            .to_string()
            .contains("separator after QPN"));
        let mut bad = good;
        bad[51] = b'0';
        assert!(parse_pingpong(&bad)
            .unwrap_err()
            .to_string()
            .contains("NUL"));
        let mut bad = good;
        bad[40] = b' ';
        assert!(parse_pingpong(&bad)
            .unwrap_err()
            .to_string()
            .contains("gid"));
        assert!(matches!(
            parse_pingpong(&good[..51]),
            Err(ExchangeError::Length {
                expected: 52,
                got: 51,
                ..
            })
        ));
    }
}
