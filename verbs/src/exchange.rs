//! Endpoint exchange over TCP: our own versioned binary format, and the text format of
//! rdma-core's `ibv_rc_pingpong` (`%04x:%06x:%06x:%s` = LID:QPN:PSN:GID), both as client
//! and as server. Every call has a deadline (unless told to have none): nothing here hangs.
//!
//! # Deadlines
//! Each call of a [`Session`] — `connect`, `accept`, `exchange`, `recv`, `sync`, each
//! pingpong step — computes one deadline, `now + timeout`, when it starts, and every read
//! and write it makes waits only for the time left until then. A peer that trickles a
//! message byte by byte therefore cannot stretch a call beyond its timeout (with a timeout
//! per `read(2)` it could, by as many timeouts as the message has bytes). A timeout too large
//! for [`Instant`] (`Duration::MAX`) means no deadline: the call blocks until the peer
//! answers or the connection fails.
//!
//! # Lockstep: what the peer may have in flight
//! Both protocols are lockstep. In ours ([`Session::exchange`], [`Session::sync`]) each
//! step has both sides send one message and then wait for the other's; in
//! `ibv_rc_pingpong`'s the sides take turns, and each waits for the other's answer. A peer
//! that keeps to this is at most one message ahead of us: when we start step k it may have
//! sent its message k, but not k + 1, which it sends only after reading our message k —
//! and we have not sent that yet. So each step first checks, without waiting, what the
//! peer has sent that we have not read: more than one message of the step's kind (one
//! byte for `sync`, the length its header announces for an endpoint, a pingpong line, or
//! nothing at all where it is our turn to speak) is [`ExchangeError::Trailing`]. A peer
//! that streams `R`s no longer makes a later `sync(b'R')` succeed.
//!
//! In our symmetric steps the check cannot run at the end of a step instead: once we have
//! read the peer's message k, its message k + 1 may rightly be there already (it read our
//! k and moved on while we were still reading), and its kind depends on what the caller
//! does next. So bytes a peer sends beyond a message are caught at the next step, and
//! after the last step not at all. Only where the protocol has the peer wait for us after
//! its message (`ibv_rc_pingpong`: every message) is the check also made right after
//! reading it. Callers that mix their own messages into the stream (through
//! [`Session::stream`], as `hotverbs-perf` does) must keep to lockstep as well.
//!
//! # Validation
//! Besides the format, both parsers reject endpoints no peer can be connected to, each with
//! its own [`ExchangeError`] variant: QPN 0 ([`ZeroQpn`](ExchangeError::ZeroQpn)), LID 0
//! with an all-zero GID ([`NoAddress`](ExchangeError::NoAddress)), and an MR window that no
//! RDMA operation can use ([`BadWindow`](ExchangeError::BadWindow): length 0, rkey 0, or
//! `addr + len` past 2^64).
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
//! reads `"done"`. `ibv_ud_pingpong` exchanges the same way.
//!
//! `ibv_srq_pingpong` sends [`SRQ_PINGPONG_LINES`] (256) lines each way instead of one:
//! one per QP, then all-zero lines ([`PINGPONG_PADDING`]) up to 256. The number of QPs is
//! not sent: both sides must be started with the same `-q`. The `*_lines` calls of
//! [`Session`] speak it ([`parse_pingpong_lines`] drops the padding).

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
    /// QPN 0: QP0 is the subnet management QP, never one a peer connects to. (An
    /// [`Endpoint`] left at its `Default`?)
    ZeroQpn,
    /// LID 0 and an all-zero GID: the endpoint names no port. On RoCE (where the LID is
    /// always 0) the GID is the address; `ibv_rc_pingpong` sends a zero GID unless it is
    /// given `-g <GID index>`.
    NoAddress,
    /// An MR window no RDMA operation can use. A window is offered to be read, written or
    /// used for atomics; one that cannot be is a peer's bug (a [`RemoteMr`] left at its
    /// `Default`, a length or key never filled in), better named here than as a remote
    /// access error on the first RDMA operation.
    BadWindow {
        /// The window as received.
        mr: RemoteMr,
        /// What is wrong: `"length 0"` (clear the MR flag instead of offering an empty
        /// window), `"rkey 0"` (no provider we support hands out key 0 for a user MR, so
        /// it is an unset key) or `"addr + len overflows"`.
        reason: &'static str,
    },
    /// The peer is out of step: it has sent more than the one message lockstep allows to
    /// be in flight (see the module docs). It does not wait for our messages, or does not
    /// speak this protocol.
    Trailing {
        /// Doing what.
        during: &'static str,
        /// Bytes the peer may have sent that we have not read yet, at this point.
        allowed: usize,
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
            ExchangeError::ZeroQpn => write!(
                f,
                "endpoint message: QPN 0 is the subnet management QP, not a peer's QP (an endpoint left at its default?)"
            ),
            ExchangeError::NoAddress => write!(
                f,
                "endpoint message: LID 0 and an all-zero GID name no port (on RoCE the GID is the address: ibv_rc_pingpong needs -g <GID index>)"
            ),
            ExchangeError::BadWindow { mr, reason } => write!(
                f,
                "endpoint message: MR window addr {:#x} len {} rkey {:#x}: {reason}",
                mr.addr, mr.len, mr.rkey
            ),
            ExchangeError::Trailing { during, allowed } => write!(
                f,
                "endpoint exchange: {during}: the peer is out of step: it has sent more than the {allowed} bytes it may have in flight (it does not wait for our messages, or does not speak this protocol)"
            ),
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
/// The lines `ibv_srq_pingpong` sends each way (its `MAX_QP`), whatever its `-q`.
pub const SRQ_PINGPONG_LINES: usize = 256;
/// The line `ibv_srq_pingpong` sends for each QP it does not have: all zeros.
pub const PINGPONG_PADDING: [u8; PINGPONG_LEN] =
    *b"0000:000000:000000:00000000000000000000000000000000\0";
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

/// Checks what both formats must satisfy beyond their syntax (see the module docs,
/// "Validation").
fn validate(ep: Endpoint) -> Result<Endpoint, ExchangeError> {
    if ep.qpn == 0 {
        return Err(ExchangeError::ZeroQpn);
    }
    if ep.lid == 0 && ep.gid == [0; 16] {
        return Err(ExchangeError::NoAddress);
    }
    if let Some(mr) = ep.mr {
        let reason = if mr.len == 0 {
            Some("length 0")
        } else if mr.rkey == 0 {
            Some("rkey 0")
        } else if mr.addr.checked_add(mr.len).is_none() {
            Some("addr + len overflows")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(ExchangeError::BadWindow { mr, reason });
        }
    }
    Ok(ep)
}

/// Parses our binary format. Rejects wrong lengths, magic, version, unknown flags,
/// non-zero reserved bytes, QPN/PSN beyond 24 bits, and endpoints no peer can connect to
/// (QPN 0, no address, an unusable MR window: see the module docs).
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
    let mr = (flags & FLAG_MR != 0).then(|| RemoteMr {
        addr: be64(&b[36..44]),
        len: be64(&b[44..52]),
        rkey: be32(&b[52..56]),
    });
    validate(Endpoint {
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
/// digits + NUL (upper- or lower-case hex). Rejects QPN 0 and LID 0 with a zero GID (see
/// the module docs).
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
    validate(Endpoint {
        lid,
        qpn,
        psn,
        gid,
        mr: None,
    })
}

/// Parses the lines of a pingpong exchange of several QPs (`ibv_srq_pingpong`): whole
/// [`PINGPONG_LEN`]-byte lines, endpoints first, then [`PINGPONG_PADDING`] lines, which are
/// dropped. A real line after padding is an error, as is any line [`parse_pingpong`]
/// refuses.
///
/// # Example
/// ```
/// use hotverbs::exchange::{parse_pingpong_lines, Endpoint, PINGPONG_PADDING};
/// let ep = Endpoint { lid: 1, qpn: 0x11, psn: 7, gid: [0; 16], mr: None };
/// let mut wire = ep.to_pingpong().to_vec();
/// wire.extend_from_slice(&PINGPONG_PADDING);
/// wire.extend_from_slice(&PINGPONG_PADDING);
/// assert_eq!(parse_pingpong_lines(&wire)?, [ep]);
/// wire.extend_from_slice(&ep.to_pingpong()); // after padding
/// assert!(parse_pingpong_lines(&wire).is_err());
/// # Ok::<(), hotverbs::exchange::ExchangeError>(())
/// ```
pub fn parse_pingpong_lines(b: &[u8]) -> Result<Vec<Endpoint>, ExchangeError> {
    if b.is_empty() || b.len() % PINGPONG_LEN != 0 {
        return Err(ExchangeError::Length {
            format: "ibv_srq_pingpong lines",
            expected: (b.len() / PINGPONG_LEN).max(1) * PINGPONG_LEN,
            got: b.len(),
        });
    }
    let mut out = Vec::new();
    let mut padding = false;
    for (i, line) in b.chunks(PINGPONG_LEN).enumerate() {
        if line == PINGPONG_PADDING {
            padding = true;
        } else if padding {
            return Err(field(
                "pingpong lines",
                format!(
                    "line {i} is an endpoint after padding lines (all-zero lines end the list)"
                ),
            ));
        } else {
            out.push(parse_pingpong(line)?);
        }
    }
    Ok(out)
}

/// `lines` pingpong lines: `ours`, then padding.
fn pingpong_lines(ours: &[Endpoint], lines: usize) -> Result<Vec<u8>, ExchangeError> {
    if ours.len() > lines {
        return Err(field(
            "pingpong lines",
            format!("{} endpoints do not fit in {lines} lines", ours.len()),
        ));
    }
    let mut v = Vec::with_capacity(lines * PINGPONG_LEN);
    for ep in ours {
        v.extend_from_slice(&ep.to_pingpong());
    }
    for _ in ours.len()..lines {
        v.extend_from_slice(&PINGPONG_PADDING);
    }
    Ok(v)
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

/// The deadline of a call that starts now; `None` when `timeout` reaches beyond what
/// [`Instant`] can hold (`Duration::MAX`): no deadline.
fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// Time left until `deadline` (`Some`, never zero); `None` when there is no deadline;
/// `Err(Timeout)` once it has passed.
fn time_left(
    deadline: Option<Instant>,
    timeout: Duration,
    during: &'static str,
) -> Result<Option<Duration>, ExchangeError> {
    let Some(d) = deadline else { return Ok(None) };
    let left = d.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(ExchangeError::Timeout {
            during,
            after: timeout,
        })
    } else {
        Ok(Some(left))
    }
}

/// The longest an endpoint message of ours can be, by its header (`None` when the bytes
/// are not our header: the read that follows names what they are).
fn announced_len(head: &[u8]) -> Option<usize> {
    (head.len() >= 8 && head[..4] == MAGIC && head[4] == VERSION).then(|| {
        if head[5] & FLAG_MR != 0 {
            WIRE_LEN_MR
        } else {
            WIRE_LEN
        }
    })
}

/// A TCP connection for exchanging endpoints (and small synchronisation messages) in
/// lockstep, with one deadline per call (see the module docs).
///
/// # Example
/// ```
/// use std::time::Duration;
/// use hotverbs::exchange::{Endpoint, Session};
/// use hotverbs::Gid;
/// let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
/// let addr = listener.local_addr().unwrap();
/// let t = Duration::from_secs(5);
/// // RoCE-style: LID 0, the GID is the address.
/// let gid = Gid::from_ipv4([10, 0, 0, 1]).0;
/// let ep = move |qpn| Endpoint { qpn, gid, ..Default::default() };
/// let server = std::thread::spawn(move || {
///     let mut s = Session::accept(&listener, t)?;
///     s.exchange(&ep(2))
/// });
/// let mut c = Session::connect(addr, t)?;
/// let theirs = c.exchange(&ep(1))?;
/// assert_eq!(theirs.qpn, 2);
/// assert_eq!(server.join().unwrap()?.qpn, 1);
/// # Ok::<(), hotverbs::exchange::ExchangeError>(())
/// ```
#[derive(Debug)]
pub struct Session {
    stream: TcpStream,
    timeout: Duration,
}

/// One call's use of the socket: a single deadline for all it reads and writes, and the
/// socket's own timeouts put back when the call ends, so that what a caller set through
/// [`Session::stream`] stays in force between calls.
struct Step<'a> {
    stream: &'a TcpStream,
    deadline: Option<Instant>,
    timeout: Duration,
    saved: (Option<Duration>, Option<Duration>),
}

impl<'a> Step<'a> {
    fn new(stream: &'a TcpStream, timeout: Duration) -> Result<Step<'a>, ExchangeError> {
        let during = "configuring the socket";
        let saved = (
            stream.read_timeout().map_err(io_err(during, timeout))?,
            stream.write_timeout().map_err(io_err(during, timeout))?,
        );
        Ok(Step {
            stream,
            deadline: deadline_after(timeout),
            timeout,
            saved,
        })
    }

    fn left(&self, during: &'static str) -> Result<Option<Duration>, ExchangeError> {
        time_left(self.deadline, self.timeout, during)
    }

    fn write_all(&self, b: &[u8], during: &'static str) -> Result<(), ExchangeError> {
        let mut sent = 0;
        while sent < b.len() {
            self.stream
                .set_write_timeout(self.left(during)?)
                .map_err(io_err(during, self.timeout))?;
            match (&mut &*self.stream).write(&b[sent..]) {
                Ok(0) => {
                    return Err(ExchangeError::Io {
                        during,
                        source: io::ErrorKind::WriteZero.into(),
                    })
                }
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(during, self.timeout)(e)),
            }
        }
        Ok(())
    }

    /// Fills `b[from..]`; `from` bytes of the message were read before.
    fn read_range(
        &self,
        b: &mut [u8],
        from: usize,
        during: &'static str,
    ) -> Result<(), ExchangeError> {
        let mut got = from;
        while got < b.len() {
            self.stream
                .set_read_timeout(self.left(during)?)
                .map_err(io_err(during, self.timeout))?;
            match (&mut &*self.stream).read(&mut b[got..]) {
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

    fn read_exact(&self, b: &mut [u8], during: &'static str) -> Result<(), ExchangeError> {
        self.read_range(b, 0, during)
    }

    /// Copies into `buf`, without waiting and without consuming, what the peer has sent
    /// that we have not read; returns how many bytes that is (at most `buf.len()`). A
    /// socket error or the peer's close count as nothing pending: the read that follows
    /// reports them.
    fn pending(&self, buf: &mut [u8], during: &'static str) -> Result<usize, ExchangeError> {
        self.stream
            .set_nonblocking(true)
            .map_err(io_err(during, self.timeout))?;
        let n = loop {
            match self.stream.peek(buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break 0,
            }
        };
        // Not a timeout if this fails: a socket left non-blocking would turn the next read
        // into one.
        self.stream
            .set_nonblocking(false)
            .map_err(|source| ExchangeError::Io { during, source })?;
        Ok(n)
    }

    /// Lockstep check: at most `allowed` bytes may be waiting to be read.
    fn at_most(&self, allowed: usize, during: &'static str) -> Result<(), ExchangeError> {
        let mut buf = [0u8; PINGPONG_LEN + 1];
        debug_assert!(allowed < buf.len());
        if self.pending(&mut buf[..allowed + 1], during)? > allowed {
            return Err(ExchangeError::Trailing { during, allowed });
        }
        Ok(())
    }

    /// Lockstep check before an endpoint step: at most the one message the peer's header
    /// announces may be waiting.
    fn at_most_one_endpoint(&self, during: &'static str) -> Result<(), ExchangeError> {
        let mut buf = [0u8; WIRE_LEN_MR + 1];
        let n = self.pending(&mut buf, during)?;
        match announced_len(&buf[..n]) {
            Some(allowed) if n > allowed => Err(ExchangeError::Trailing { during, allowed }),
            _ => Ok(()),
        }
    }

    /// Reads one endpoint message of ours.
    fn recv(&self) -> Result<Endpoint, ExchangeError> {
        let during = "reading the peer's endpoint";
        let mut head = [0u8; WIRE_LEN_MR];
        self.read_exact(&mut head[..8], during)?;
        if head[..4] != MAGIC {
            return Err(ExchangeError::BadMagic([
                head[0], head[1], head[2], head[3],
            ]));
        }
        let len = announced_len(&head[..8]).ok_or(ExchangeError::Version(head[4]))?;
        self.read_range(&mut head[..len], 8, during)?;
        parse(&head[..len])
    }
}

impl Drop for Step<'_> {
    fn drop(&mut self) {
        // Best effort: these only fail on a socket that is gone, whose next use fails anyway.
        let _ = self.stream.set_read_timeout(self.saved.0);
        let _ = self.stream.set_write_timeout(self.saved.1);
    }
}

impl Session {
    /// Connects to `addr`, retrying refused connections until `timeout` (the server may
    /// not be listening yet). `Duration::MAX`: no deadline, retry until the server listens.
    pub fn connect(addr: impl ToSocketAddrs, timeout: Duration) -> Result<Session, ExchangeError> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| ExchangeError::Io {
                during: "resolving the server address",
                source: e,
            })?
            .collect();
        let deadline = deadline_after(timeout);
        let timed_out = || ExchangeError::Timeout {
            during: "connecting",
            after: timeout,
        };
        let mut last: Option<io::Error> = None;
        loop {
            for a in &addrs {
                // The last attempt may start at the deadline: give it a moment.
                let attempt = match deadline {
                    Some(d) => TcpStream::connect_timeout(
                        a,
                        d.saturating_duration_since(Instant::now())
                            .max(Duration::from_millis(1)),
                    ),
                    None => TcpStream::connect(a),
                };
                match attempt {
                    Ok(stream) => return Session::from_stream(stream, timeout),
                    Err(e) => last = Some(e),
                }
            }
            let left = match time_left(deadline, timeout, "connecting") {
                Ok(left) => left,
                Err(_) => {
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
                        _ => timed_out(),
                    })
                }
            };
            // Refused: the server is not listening yet. Poll, but not past the deadline.
            let pause = Duration::from_millis(20);
            std::thread::sleep(left.map_or(pause, |l| l.min(pause)));
        }
    }

    /// Accepts one connection on `listener` within `timeout`. `Duration::MAX`: no
    /// deadline, wait for a client.
    pub fn accept(listener: &TcpListener, timeout: Duration) -> Result<Session, ExchangeError> {
        let Some(deadline) = deadline_after(timeout) else {
            let (stream, _) = listener
                .set_nonblocking(false)
                .and_then(|()| listener.accept())
                .map_err(|e| ExchangeError::Io {
                    during: "accepting",
                    source: e,
                })?;
            return Session::from_stream(stream, timeout);
        };
        listener
            .set_nonblocking(true)
            .map_err(io_err("accepting", timeout))?;
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        let _ = listener.set_nonblocking(false);
                        return Err(ExchangeError::Timeout {
                            during: "waiting for a client",
                            after: timeout,
                        });
                    }
                    std::thread::sleep(left.min(Duration::from_millis(5)));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
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
        Session::from_stream(stream, timeout)
    }

    /// Wraps a connected stream: makes it blocking and sets its read and write timeouts to
    /// `timeout` (`None`, no timeout, for `Duration::MAX`). Those are what plain reads and
    /// writes on [`stream`](Self::stream) get; the calls of a session use their own
    /// deadline and put the socket's timeouts back when they return.
    pub fn from_stream(stream: TcpStream, timeout: Duration) -> Result<Session, ExchangeError> {
        let during = "configuring the socket";
        stream
            .set_nonblocking(false)
            .map_err(io_err(during, timeout))?;
        let t = deadline_after(timeout).map(|_| timeout.max(Duration::from_millis(1)));
        stream
            .set_read_timeout(t)
            .map_err(io_err(during, timeout))?;
        stream
            .set_write_timeout(t)
            .map_err(io_err(during, timeout))?;
        let _ = stream.set_nodelay(true);
        Ok(Session { stream, timeout })
    }

    /// The underlying stream. What is written and read on it directly must keep the
    /// session's lockstep (see the module docs).
    pub fn stream(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    fn step(&self) -> Result<Step<'_>, ExchangeError> {
        Step::new(&self.stream, self.timeout)
    }

    /// Sends ours, receives theirs (our binary format; symmetric, so both sides call it).
    /// Fails with [`ExchangeError::Trailing`] if the peer has sent more than its one
    /// endpoint message when the call starts.
    pub fn exchange(&mut self, ours: &Endpoint) -> Result<Endpoint, ExchangeError> {
        let step = self.step()?;
        step.at_most_one_endpoint("exchanging endpoints")?;
        step.write_all(&ours.to_bytes(), "sending our endpoint")?;
        step.recv()
    }

    /// Receives one endpoint in our format (the peer sends it, then waits for us: more
    /// than that one message waiting is [`ExchangeError::Trailing`]).
    pub fn recv(&mut self) -> Result<Endpoint, ExchangeError> {
        let step = self.step()?;
        step.at_most_one_endpoint("receiving an endpoint")?;
        step.recv()
    }

    /// A barrier: both sides send `tag` and wait for the other's (the manual's
    /// `sock_sync_data`). Fails if the peer sent a different tag, or, as
    /// [`ExchangeError::Trailing`], if it has sent more than one byte when the call starts
    /// (it did not wait for our previous message).
    pub fn sync(&mut self, tag: u8) -> Result<(), ExchangeError> {
        let during = "synchronising";
        let step = self.step()?;
        step.at_most(1, during)?;
        step.write_all(&[tag], during)?;
        let mut b = [0u8];
        step.read_exact(&mut b, during)?;
        if b[0] != tag {
            return Err(field(
                "sync tag",
                format!("expected {:?}, got {:?}", tag as char, b[0] as char),
            ));
        }
        Ok(())
    }

    /// `ibv_rc_pingpong` client side: send our line, read the server's, send `"done"`.
    /// The server speaks only after reading our line and sends nothing after its own:
    /// anything else waiting is [`ExchangeError::Trailing`].
    pub fn pingpong_client(&mut self, ours: &Endpoint) -> Result<Endpoint, ExchangeError> {
        let step = self.step()?;
        step.at_most(0, "sending our pingpong line")?;
        step.write_all(&ours.to_pingpong(), "sending our pingpong line")?;
        let mut msg = [0u8; PINGPONG_LEN];
        let during = "reading the server's pingpong line";
        step.read_exact(&mut msg, during)?;
        step.at_most(0, during)?;
        let theirs = parse_pingpong(&msg)?;
        step.write_all(b"done\0", "sending \"done\"")?;
        Ok(theirs)
    }

    /// `ibv_rc_pingpong` server side, step 1: read the client's line. Connect the QP, then
    /// call [`pingpong_server_reply`](Self::pingpong_server_reply). The client waits for
    /// our answer: anything beyond its line is [`ExchangeError::Trailing`].
    pub fn pingpong_server_recv(&mut self) -> Result<Endpoint, ExchangeError> {
        let during = "reading the client's pingpong line";
        let step = self.step()?;
        step.at_most(PINGPONG_LEN, during)?;
        let mut msg = [0u8; PINGPONG_LEN];
        step.read_exact(&mut msg, during)?;
        step.at_most(0, during)?;
        parse_pingpong(&msg)
    }

    /// `ibv_srq_pingpong` client side (any pingpong of several QPs): send `lines` lines
    /// (ours, then padding; the tool sends and expects [`SRQ_PINGPONG_LINES`]), read as
    /// many, send `"done"`. Returns the server's endpoints, padding dropped.
    pub fn pingpong_client_lines(
        &mut self,
        ours: &[Endpoint],
        lines: usize,
    ) -> Result<Vec<Endpoint>, ExchangeError> {
        let msg = pingpong_lines(ours, lines)?;
        let step = self.step()?;
        step.at_most(0, "sending our pingpong lines")?;
        step.write_all(&msg, "sending our pingpong lines")?;
        let mut theirs = vec![0u8; lines * PINGPONG_LEN];
        let during = "reading the server's pingpong lines";
        step.read_exact(&mut theirs, during)?;
        step.at_most(0, during)?;
        let theirs = parse_pingpong_lines(&theirs)?;
        step.write_all(b"done\0", "sending \"done\"")?;
        Ok(theirs)
    }

    /// `ibv_srq_pingpong` server side, step 1: read the client's `lines` lines (padding
    /// dropped). Connect the QPs, then call
    /// [`pingpong_server_reply_lines`](Self::pingpong_server_reply_lines).
    pub fn pingpong_server_recv_lines(
        &mut self,
        lines: usize,
    ) -> Result<Vec<Endpoint>, ExchangeError> {
        let during = "reading the client's pingpong lines";
        let step = self.step()?;
        let mut msg = vec![0u8; lines * PINGPONG_LEN];
        step.read_exact(&mut msg, during)?;
        step.at_most(0, during)?;
        parse_pingpong_lines(&msg)
    }

    /// `ibv_srq_pingpong` server side, step 2: send our `lines` lines and wait for
    /// `"done"`.
    pub fn pingpong_server_reply_lines(
        &mut self,
        ours: &[Endpoint],
        lines: usize,
    ) -> Result<(), ExchangeError> {
        let msg = pingpong_lines(ours, lines)?;
        let step = self.step()?;
        step.at_most(0, "sending our pingpong lines")?;
        step.write_all(&msg, "sending our pingpong lines")?;
        let mut done = [0u8; 5];
        let during = "reading \"done\"";
        step.read_exact(&mut done, during)?;
        if &done != b"done\0" {
            return Err(field(
                "done",
                format!("expected \"done\\0\", got {done:02x?}"),
            ));
        }
        step.at_most(0, during)
    }

    /// `ibv_rc_pingpong` server side, step 2: send our line and wait for `"done"`, the
    /// client's last message (anything else waiting is [`ExchangeError::Trailing`]).
    pub fn pingpong_server_reply(&mut self, ours: &Endpoint) -> Result<(), ExchangeError> {
        let step = self.step()?;
        step.at_most(0, "sending our pingpong line")?;
        step.write_all(&ours.to_pingpong(), "sending our pingpong line")?;
        let mut done = [0u8; 5];
        let during = "reading \"done\"";
        step.read_exact(&mut done, during)?;
        if &done != b"done\0" {
            return Err(field(
                "done",
                format!("expected \"done\\0\", got {done:02x?}"),
            ));
        }
        step.at_most(0, during)
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

    /// A connected pair of sockets on 127.0.0.1.
    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn no_deadline_for_a_timeout_beyond_instant_and_none_left_past_it() {
        assert_eq!(deadline_after(Duration::MAX), None);
        assert!(matches!(time_left(None, Duration::MAX, "x"), Ok(None)));
        let e = time_left(Some(Instant::now()), Duration::ZERO, "x").unwrap_err();
        assert!(
            matches!(e, ExchangeError::Timeout { during: "x", .. }),
            "{e}"
        );
    }

    #[test]
    fn one_deadline_spans_every_read_of_a_message() {
        // The whole message is there, but the call's deadline passes after its first read:
        // the call times out instead of granting the next read a fresh timeout (which is
        // how a trickling peer used to stretch a call to many timeouts).
        let (mut a, b) = pair();
        a.write_all(&ep(false).to_bytes()).unwrap();
        let mut step = Step::new(&b, Duration::from_secs(60)).unwrap();
        let mut msg = [0u8; WIRE_LEN];
        step.read_exact(&mut msg[..8], "reading").unwrap();
        step.deadline = Some(Instant::now()); // as if the 60 s had gone by meanwhile
        let e = step.read_range(&mut msg, 8, "reading").unwrap_err();
        assert!(
            matches!(
                e,
                ExchangeError::Timeout {
                    during: "reading",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_step_puts_the_socket_timeouts_back() {
        let (mut a, b) = pair();
        let t = Some(Duration::from_secs(77));
        b.set_read_timeout(t).unwrap();
        b.set_write_timeout(None).unwrap();
        a.write_all(b"y").unwrap();
        {
            let step = Step::new(&b, Duration::from_secs(5)).unwrap();
            step.write_all(b"x", "writing").unwrap();
            let mut one = [0u8];
            step.read_exact(&mut one, "reading").unwrap();
            step.at_most(0, "peeking").unwrap();
            assert_ne!(b.read_timeout().unwrap(), t, "the step set its own");
        }
        assert_eq!(b.read_timeout().unwrap(), t);
        assert_eq!(b.write_timeout().unwrap(), None);
    }

    #[test]
    fn lockstep_check_counts_what_is_waiting() {
        let (mut a, b) = pair();
        let step = Step::new(&b, Duration::from_secs(5)).unwrap();
        step.at_most(0, "idle").unwrap();
        a.write_all(b"RR").unwrap();
        // Wait (blocking) until both bytes are there; the check itself never waits.
        let mut two = [0u8; 2];
        while b.peek(&mut two).unwrap() < 2 {
            std::thread::yield_now();
        }
        step.at_most(2, "two allowed").unwrap();
        let e = step.at_most(1, "one allowed").unwrap_err();
        assert!(
            matches!(
                e,
                ExchangeError::Trailing {
                    during: "one allowed",
                    allowed: 1
                }
            ),
            "{e}"
        );
        // Before an endpoint step, the header of the waiting message sets the limit.
        assert_eq!(announced_len(&ep(false).to_bytes()[..8]), Some(WIRE_LEN));
        assert_eq!(announced_len(&ep(true).to_bytes()[..8]), Some(WIRE_LEN_MR));
        assert_eq!(announced_len(b"HVEP"), None);
        assert_eq!(announced_len(b"0001:000033:"), None);
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
