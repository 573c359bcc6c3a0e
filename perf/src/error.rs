//! The tool's one error type, [`PerfError`]: a variant per way a run fails, each keeping
//! its cause as a value — the [`hotverbs::Error`] of a verb (verb, errno, hint), the
//! [`ExchangeError`] or `io::Error` of the control connection, the datapath's
//! [`WcError`]/[`SendError`]/[`PostError`] — with the context this tool adds (which port,
//! which peer, what was being waited for, what to try).
//!
//! # Display and `source()`
//! `Display` is the whole one-line message `main` prints after `hotverbs-perf: error:`:
//! context, the cause's own text and the hint. [`source`](std::error::Error::source) hands
//! out the same cause as a value, for code that needs more than text (the errno of a
//! failed verb, the status of a failed completion). The API guidelines suggest one or the
//! other; both is what hotverbs' own [`ExchangeError::Io`] does, and it lets the hint follow
//! the cause it is about. So print an error with `{}`, not by walking the chain (each level
//! would repeat the one below).

use std::fmt;
use std::io::{self, ErrorKind};
use std::time::Duration;

use hotverbs::exchange::ExchangeError;
use hotverbs_datapath::{ConfigError, PollError, PostError, RecvError, SendError, WcError};

/// Why a run failed.
#[derive(Debug)]
pub enum PerfError {
    /// Options that cannot work, together or on this device (`-s 0`, `-l` above `-t`, an
    /// empty GID at `-x`, `--histogram` with a bandwidth test, ...). The text says which
    /// option to change.
    Usage(String),
    /// A verb of the setup layer failed (open, PD, CQ, MR, QP, connect).
    Verbs {
        /// The verb, its errno and hotverbs' hint.
        source: hotverbs::Error,
        /// What this tool was doing, when the verb alone does not say (`registering 4096
        /// bytes`).
        context: Option<String>,
    },
    /// Connecting, accepting or exchanging endpoints over the control connection failed.
    Exchange {
        /// What was being done (`connect to host:18515`).
        what: String,
        /// hotverbs' exchange error.
        source: ExchangeError,
    },
    /// A server waited `--server-wait` and no client came.
    NoClient {
        /// The TCP port listened on.
        port: u16,
        /// How long it waited.
        wait: Duration,
        /// The exchange's timeout error.
        source: ExchangeError,
    },
    /// A socket or file operation failed.
    Io {
        /// What was being done (`listen on TCP port 18515`, `write --histogram x.svg`).
        what: String,
        /// The OS error.
        source: io::Error,
        /// What to try, when this tool can tell.
        hint: Option<&'static str>,
    },
    /// Encoding JSON (a control message, the `--json` document) failed.
    Json {
        /// What was being encoded.
        what: String,
        /// serde_json's error.
        source: serde_json::Error,
    },
    /// The peer closed the control connection.
    PeerClosed {
        /// The peer's address.
        peer: String,
    },
    /// The peer did not answer within the read timeout.
    PeerSilent {
        /// The peer's address.
        peer: String,
        /// The timeout in force.
        after: Duration,
        /// The socket's `WouldBlock`/`TimedOut` error.
        source: io::Error,
    },
    /// The peer reported that it failed, with its own message.
    PeerFailed {
        /// The peer's address.
        peer: String,
        /// The peer's error message.
        why: String,
    },
    /// The server refused the client's parameters.
    Refused {
        /// The server's address.
        peer: String,
        /// The server's reason.
        why: String,
    },
    /// The peer sent a control frame that is not JSON of this protocol.
    Garbled {
        /// The peer's address.
        peer: String,
        /// serde_json's error.
        source: serde_json::Error,
    },
    /// The two sides do not agree: another protocol version or test, an unexpected
    /// message, an endpoint without a memory window. The text is the whole message.
    Protocol(String),
    /// The datapath refused a ring configuration.
    Ring {
        /// The ring and the settings it was given.
        what: String,
        /// The datapath's reason.
        source: ConfigError,
    },
    /// The send ring could not take a message.
    Send(SendError),
    /// Posting receives failed.
    Post {
        /// What was being posted.
        what: &'static str,
        /// The verb, errno and first rejected WR.
        source: PostError,
    },
    /// A receive completion did not yield a message (error status, stale completion).
    Recv(RecvError),
    /// A send-side completion carried an error status.
    Completion {
        /// The queue (`send queue`).
        queue: &'static str,
        /// The status.
        error: WcError,
    },
    /// `ibv_poll_cq` failed.
    Poll(PollError),
    /// No completion and no message for `--timeout`.
    Stall {
        /// What was awaited (`a send completion`).
        waiting_for: &'static str,
        /// The stall timeout.
        after: Duration,
    },
    /// This side stopped because the other side (loopback thread) failed.
    Aborted,
    /// The passive side of a loopback run failed.
    Passive(Box<PerfError>),
    /// A size or buffer beyond what this machine or the datapath can address.
    Limit(String),
    /// An invariant of this tool does not hold (a bug, or a device breaking the rules).
    Internal(String),
}

impl PerfError {
    /// A failed verb with what this tool was doing.
    pub fn verbs(source: hotverbs::Error, context: impl Into<String>) -> Self {
        PerfError::Verbs {
            source,
            context: Some(context.into()),
        }
    }

    /// An I/O error while doing `what`.
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        PerfError::Io {
            what: what.into(),
            source,
            hint: None,
        }
    }

    /// An exchange error while doing `what`.
    pub fn exchange(what: impl Into<String>, source: ExchangeError) -> Self {
        PerfError::Exchange {
            what: what.into(),
            source,
        }
    }
}

/// What to try after an exchange error.
fn exchange_hint(e: &ExchangeError) -> &'static str {
    match e {
        ExchangeError::Timeout { .. } => {
            "start the server first (the same command without a host), check -p, or raise \
             --timeout"
        }
        ExchangeError::Io { source, .. } => match source.kind() {
            ErrorKind::ConnectionRefused => {
                "is the server running (the same command without a host) on this port?"
            }
            ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::UnexpectedEof => {
                "the peer closed the connection: see its own error output"
            }
            _ => "check the host name, the port and the network",
        },
        ExchangeError::Length { .. } => "the peer closed the connection: see its own error output",
        _ => "is the peer hotverbs-perf of the same version?",
    }
}

impl fmt::Display for PerfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PerfError::Usage(s)
            | PerfError::Protocol(s)
            | PerfError::Limit(s)
            | PerfError::Internal(s) => f.write_str(s),
            PerfError::Verbs { source, context } => {
                write!(f, "{source}")?;
                match context {
                    Some(c) => write!(f, " ({c})"),
                    None => Ok(()),
                }
            }
            PerfError::Exchange { what, source } => {
                write!(f, "{what}: {source}")?;
                // The errno's name too: `io::Error` shows the OS's sentence and number.
                if let ExchangeError::Io { source: io, .. } = source {
                    if let Some(n) = io.raw_os_error() {
                        write!(f, " ({})", hotverbs_ffi::errno_name(n))?;
                    }
                }
                write!(f, ": {}", exchange_hint(source))
            }
            PerfError::NoClient { port, wait, .. } => write!(
                f,
                "no client connected to TCP port {port} within {:.0} s: start the client (the \
                 same command with this host's name), or raise --server-wait",
                wait.as_secs_f64()
            ),
            PerfError::Io { what, source, hint } => {
                write!(f, "{what}: {source}")?;
                match hint {
                    Some(h) => write!(f, ": {h}"),
                    None => Ok(()),
                }
            }
            PerfError::Json { what, source } => write!(f, "{what}: {source}"),
            PerfError::PeerClosed { peer } => write!(
                f,
                "the peer {peer} closed the control connection: see its own error output"
            ),
            PerfError::PeerSilent { peer, after, .. } => write!(
                f,
                "timed out after {:.1} s waiting for the peer {peer}: it stopped answering \
                 (raise --timeout for slow peers)",
                after.as_secs_f64()
            ),
            PerfError::PeerFailed { peer, why } => write!(f, "the peer {peer} failed: {why}"),
            PerfError::Refused { peer, why } => write!(f, "the server {peer} refused: {why}"),
            PerfError::Garbled { peer, source } => write!(
                f,
                "the peer {peer} sent something that is not hotverbs-perf's protocol \
                 ({source}): is it hotverbs-perf of the same version?"
            ),
            PerfError::Ring { what, source } => write!(f, "{what}: {source}"),
            PerfError::Send(e) => write!(f, "{e}"),
            PerfError::Post { what, source } => write!(f, "{what}: {source}"),
            PerfError::Recv(e) => write!(f, "{e}"),
            PerfError::Completion { queue, error } => write!(f, "{queue}: {error}"),
            PerfError::Poll(e) => write!(f, "{e}"),
            PerfError::Stall { waiting_for, after } => write!(
                f,
                "no progress for {:.1} s while waiting for {waiting_for}: the peer stopped or \
                 the connection is broken (raise --timeout for very slow links)",
                after.as_secs_f64()
            ),
            PerfError::Aborted => f.write_str("stopped: the other side failed"),
            PerfError::Passive(e) => write!(f, "passive side: {e}"),
        }
    }
}

impl std::error::Error for PerfError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PerfError::Verbs { source, .. } => Some(source),
            PerfError::Exchange { source, .. } | PerfError::NoClient { source, .. } => Some(source),
            PerfError::Io { source, .. } | PerfError::PeerSilent { source, .. } => Some(source),
            PerfError::Json { source, .. } | PerfError::Garbled { source, .. } => Some(source),
            PerfError::Ring { source, .. } => Some(source),
            PerfError::Send(e) => Some(e),
            PerfError::Post { source, .. } => Some(source),
            PerfError::Recv(e) => Some(e),
            PerfError::Completion { error, .. } => Some(error),
            PerfError::Poll(e) => Some(e),
            PerfError::Passive(e) => Some(&**e),
            PerfError::Usage(_)
            | PerfError::PeerClosed { .. }
            | PerfError::PeerFailed { .. }
            | PerfError::Refused { .. }
            | PerfError::Protocol(_)
            | PerfError::Stall { .. }
            | PerfError::Aborted
            | PerfError::Limit(_)
            | PerfError::Internal(_) => None,
        }
    }
}

impl From<hotverbs::Error> for PerfError {
    fn from(source: hotverbs::Error) -> Self {
        PerfError::Verbs {
            source,
            context: None,
        }
    }
}

impl From<SendError> for PerfError {
    fn from(e: SendError) -> Self {
        PerfError::Send(e)
    }
}

impl From<RecvError> for PerfError {
    fn from(e: RecvError) -> Self {
        PerfError::Recv(e)
    }
}

impl From<PollError> for PerfError {
    fn from(e: PollError) -> Self {
        PerfError::Poll(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// The first error of type `T` in `e`'s `source()` chain (`e` itself excluded).
    fn cause<T: std::error::Error + 'static>(e: &PerfError) -> Option<&T> {
        let mut s = e.source();
        while let Some(x) = s {
            if let Some(t) = x.downcast_ref::<T>() {
                return Some(t);
            }
            s = x.source();
        }
        None
    }

    #[test]
    fn the_source_chain_reaches_the_failed_verb_and_its_errno() {
        // A real failure of the setup layer: a device that does not exist.
        let e = crate::setup::Device::open("no_such_dev0", 1, None)
            .err()
            .expect("no_such_dev0 opened");
        let v = cause::<hotverbs::Error>(&e).expect("hotverbs::Error in the chain");
        assert_eq!(v.verb(), "ibv_open_device");
        assert_eq!(hotverbs_ffi::errno_name(v.errno()), "ENODEV", "{v}");
        // The message is the verb's, unchanged.
        assert_eq!(e.to_string(), v.to_string());

        // Through a level of this tool's own wrapping, and with context added.
        let inner = PerfError::verbs(
            hotverbs::Error::new("ibv_reg_mr", 12).with_hint("raise `ulimit -l`"),
            "registering 4096 bytes",
        );
        let e = PerfError::Passive(Box::new(inner));
        let v = cause::<hotverbs::Error>(&e).expect("hotverbs::Error in the chain");
        assert_eq!(
            (v.verb(), v.errno(), v.errno_name()),
            ("ibv_reg_mr", 12, "ENOMEM")
        );
        assert_eq!(v.hint(), Some("raise `ulimit -l`"));
        assert_eq!(
            e.to_string(),
            "passive side: ibv_reg_mr: ENOMEM — raise `ulimit -l` (registering 4096 bytes)"
        );
    }

    #[test]
    fn datapath_and_socket_causes_are_kept() {
        let e = PerfError::Completion {
            queue: "send queue",
            error: WcError::RemAccess,
        };
        assert_eq!(cause::<WcError>(&e), Some(&WcError::RemAccess));
        assert!(e.to_string().contains("IBV_WC_REM_ACCESS_ERR"), "{e}");

        let e = PerfError::exchange(
            "connect to h:1",
            ExchangeError::Io {
                during: "connecting",
                // ECONNREFUSED (Linux's number; this crate has no libc dependency).
                source: io::Error::from_raw_os_error(111),
            },
        );
        let io = cause::<io::Error>(&e).expect("io::Error in the chain");
        assert_eq!(io.raw_os_error(), Some(111));
        assert!(cause::<ExchangeError>(&e).is_some());
        let s = e.to_string();
        assert!(
            s.starts_with("connect to h:1: ") && s.contains("(ECONNREFUSED)"),
            "{s}"
        );
        assert!(s.ends_with("on this port?"), "{s}");
    }

    #[test]
    fn leaf_errors_have_no_source() {
        for e in [
            PerfError::Usage("x".into()),
            PerfError::Aborted,
            PerfError::Stall {
                waiting_for: "a send completion",
                after: Duration::from_secs(1),
            },
        ] {
            assert!(e.source().is_none(), "{e}");
        }
    }
}
