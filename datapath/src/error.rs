//! Errors: a named variant for every `ibv_wc_status`, post failures with the errno and the
//! index of the first rejected WR, and the ring-level conditions (back-pressure, limits).
//! Messages name the verb, the errno or status name and what to do.

use core::fmt;

use hotverbs_ffi::*;

macro_rules! wc_errors {
    ($($(#[$m:meta])* $name:ident = $c:ident, $hint:literal;)*) => {
        /// A completion with a status other than `IBV_WC_SUCCESS` (`ibv_poll_cq(3)`), one
        /// variant per `enum ibv_wc_status` value; and, from a send ring's
        /// `on_completion` only, [`Misrouted`](Self::Misrouted): a completion that is not
        /// the ring's at all (never made by [`from_status`](Self::from_status)).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum WcError {
            $($(#[$m])* $name,)*
            /// A status this version does not know.
            Unknown(u32),
            /// Not a status: a send ring's `on_completion` (or a
            /// [`SendRetirer`](crate::SendRetirer)'s) was given a completion of another
            /// ring, another kind (a receive) or another QP. Nothing was retired and the
            /// ring's state is unchanged (it is not in the error state); the completion is
            /// still unhandled: give it to the ring it names (see [`Misrouted`]).
            Misrouted(Misrouted),
        }

        impl WcError {
            /// The error for `status`, or `None` for `IBV_WC_SUCCESS`.
            #[inline]
            pub const fn from_status(status: ibv_wc_status) -> Option<Self> {
                match status {
                    IBV_WC_SUCCESS => None,
                    $($c => Some(Self::$name),)*
                    other => Some(Self::Unknown(other)),
                }
            }

            /// The raw `ibv_wc_status` ([`Misrouted::STATUS`] for
            /// [`Misrouted`](Self::Misrouted), which is not a status).
            pub const fn status(self) -> ibv_wc_status {
                match self {
                    $(Self::$name => $c,)*
                    Self::Unknown(s) => s,
                    Self::Misrouted(_) => Misrouted::STATUS,
                }
            }

            /// What usually causes this status and what to do.
            pub const fn hint(self) -> &'static str {
                match self {
                    $(Self::$name => $hint,)*
                    Self::Unknown(_) => "unknown status: check the provider's documentation",
                    Self::Misrouted(_) => "a completion of another ring, kind or QP: route completions by Completion::ring()",
                }
            }
        }
    };
}

wc_errors! {
    /// `IBV_WC_LOC_LEN_ERR`.
    LocLen = IBV_WC_LOC_LEN_ERR, "message longer than the receive buffer or the port MTU (UD)";
    /// `IBV_WC_LOC_QP_OP_ERR`.
    LocQpOp = IBV_WC_LOC_QP_OP_ERR, "malformed WR: check opcode, num_sge and inline size against the QP caps";
    /// `IBV_WC_LOC_EEC_OP_ERR`.
    LocEecOp = IBV_WC_LOC_EEC_OP_ERR, "EE context error (RD only)";
    /// `IBV_WC_LOC_PROT_ERR`.
    LocProt = IBV_WC_LOC_PROT_ERR, "local buffer outside its MR or wrong lkey/PD";
    /// `IBV_WC_WR_FLUSH_ERR`.
    WrFlush = IBV_WC_WR_FLUSH_ERR, "flushed because the QP is in the error state: find the first error, then reset the QP";
    /// `IBV_WC_MW_BIND_ERR`.
    MwBind = IBV_WC_MW_BIND_ERR, "memory-window bind failed";
    /// `IBV_WC_BAD_RESP_ERR`.
    BadResp = IBV_WC_BAD_RESP_ERR, "unexpected transport response from the peer";
    /// `IBV_WC_LOC_ACCESS_ERR`.
    LocAccess = IBV_WC_LOC_ACCESS_ERR, "local MR lacks the access right (LOCAL_WRITE for receives/READ)";
    /// `IBV_WC_REM_INV_REQ_ERR`.
    RemInvReq = IBV_WC_REM_INV_REQ_ERR, "peer rejected the request: opcode not allowed or message too long for its receive";
    /// `IBV_WC_REM_ACCESS_ERR`.
    RemAccess = IBV_WC_REM_ACCESS_ERR, "bad rkey, remote range outside the MR, or missing remote access right";
    /// `IBV_WC_REM_OP_ERR`.
    RemOp = IBV_WC_REM_OP_ERR, "the peer could not complete the operation (its receive failed)";
    /// `IBV_WC_RETRY_EXC_ERR`.
    RetryExc = IBV_WC_RETRY_EXC_ERR, "transport retries exhausted: peer down or path broken";
    /// `IBV_WC_RNR_RETRY_EXC_ERR`.
    RnrRetryExc = IBV_WC_RNR_RETRY_EXC_ERR, "receiver not ready: the peer had no receive posted; use credits or raise rnr_retry";
    /// `IBV_WC_LOC_RDD_VIOL_ERR`.
    LocRddViol = IBV_WC_LOC_RDD_VIOL_ERR, "RD domain violation (RD only)";
    /// `IBV_WC_REM_INV_RD_REQ_ERR`.
    RemInvRdReq = IBV_WC_REM_INV_RD_REQ_ERR, "invalid RD request (RD only)";
    /// `IBV_WC_REM_ABORT_ERR`.
    RemAbort = IBV_WC_REM_ABORT_ERR, "the peer aborted the operation";
    /// `IBV_WC_INV_EECN_ERR`.
    InvEecn = IBV_WC_INV_EECN_ERR, "invalid EE context number (RD only)";
    /// `IBV_WC_INV_EEC_STATE_ERR`.
    InvEecState = IBV_WC_INV_EEC_STATE_ERR, "invalid EE context state (RD only)";
    /// `IBV_WC_FATAL_ERR`.
    Fatal = IBV_WC_FATAL_ERR, "fatal device error: the device must be reopened";
    /// `IBV_WC_RESP_TIMEOUT_ERR`.
    RespTimeout = IBV_WC_RESP_TIMEOUT_ERR, "response timeout";
    /// `IBV_WC_GENERAL_ERR`.
    General = IBV_WC_GENERAL_ERR, "general provider error";
    /// `IBV_WC_TM_ERR`.
    Tm = IBV_WC_TM_ERR, "tag-matching error";
    /// `IBV_WC_TM_RNDV_INCOMPLETE`.
    TmRndvIncomplete = IBV_WC_TM_RNDV_INCOMPLETE, "tag-matching rendezvous incomplete";
}

impl WcError {
    /// The status name (`"IBV_WC_REM_ACCESS_ERR"`; `"misrouted completion"` for
    /// [`Misrouted`](Self::Misrouted)).
    pub fn name(self) -> &'static str {
        match self {
            Self::Misrouted(_) => "misrouted completion",
            _ => wc_status_name(self.status()),
        }
    }
}

// A send ring's `on_completion` returns `Result<u64, WcError>` in two registers: the
// `Misrouted` variant must not make the error larger than the status it sits beside.
const _: () = assert!(core::mem::size_of::<WcError>() == 8);
const _: () = assert!(core::mem::size_of::<Result<u64, WcError>>() == 16);

/// A completion handed to a ring it does not belong to: another ring's (its ring id in
/// `wr_id`), another kind's (a receive completion given to a send ring, or a send
/// completion to a receive ring) or another QP's (same ring id and kind, other `qp_num`:
/// it came from a CQ this ring does not use, or from a poller that does not read QP
/// numbers). Carried by [`WcError::Misrouted`] (send rings, the
/// [`SendRetirer`](crate::SendRetirer)) and [`RecvError::Misrouted`] (receive rings).
///
/// Unlike a *stale* completion of the ring (same ring, kind and QP, but not for an
/// outstanding WR or posted slot, e.g. a flush left in the CQ across a reset), which rings
/// ignore, a misrouted completion is still somebody's work: dropping it would lose a
/// receive slot or leave a ring waiting for ever, so rings refuse it as an error. The
/// [`Display`](fmt::Display) text says where it belongs.
///
/// Packed in 32 bits with no invalid values (accessors below), so that [`WcError`] keeps the
/// layout it has without it (a `u32` tag and a `u32` payload) and the rings' hot paths,
/// which return `Result<u64, WcError>` or carry it in [`SendError`], compile as before:
/// a payload with `bool` fields gave the enums a byte-sized niche tag instead, and the
/// mlx5 direct ring's post-list-32 loop 6.7 more instructions per WR.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Misrouted(u32);

impl Misrouted {
    /// What [`WcError::status`] returns for [`WcError::Misrouted`]: no `ibv_wc_status` has
    /// this value (the completion's own status is unchanged in the completion).
    pub const STATUS: ibv_wc_status = u32::MAX;

    const RECV: u32 = 1 << 16;
    const GIVEN_TO_RECV: u32 = 1 << 17;
    const NO_QP_NUM: u32 = 1 << 18;

    /// A completion of ring `ring` (a receive's if `recv`) given to ring `given_to` (a
    /// receive ring if `given_to_recv`); `no_qp_num`: its `qp_num` was 0 (a poller that
    /// reads no QP numbers).
    pub const fn new(
        ring: u8,
        recv: bool,
        given_to: u8,
        given_to_recv: bool,
        no_qp_num: bool,
    ) -> Self {
        Self(
            ring as u32
                | (given_to as u32) << 8
                | if recv { Self::RECV } else { 0 }
                | if given_to_recv {
                    Self::GIVEN_TO_RECV
                } else {
                    0
                }
                | if no_qp_num { Self::NO_QP_NUM } else { 0 },
        )
    }

    /// The misrouting of a completion with `wr_id` and `qp_num` given to ring `given_to`
    /// (a receive ring if `given_to_recv`).
    pub(crate) const fn of(wr_id: u64, qp_num: u32, given_to: u8, given_to_recv: bool) -> Self {
        Self::new(
            crate::wr_id::ring_of(wr_id),
            crate::wr_id::is_recv(wr_id),
            given_to,
            given_to_recv,
            qp_num == 0,
        )
    }

    /// The completion's ring id ([`Completion::ring`](crate::Completion::ring)).
    pub const fn ring(self) -> u8 {
        self.0 as u8
    }
    /// The completion is a receive's (the receive bit of its `wr_id`).
    pub const fn recv(self) -> bool {
        self.0 & Self::RECV != 0
    }
    /// The id of the ring it was given to.
    pub const fn given_to(self) -> u8 {
        (self.0 >> 8) as u8
    }
    /// The ring it was given to is a receive ring.
    pub const fn given_to_recv(self) -> bool {
        self.0 & Self::GIVEN_TO_RECV != 0
    }
    /// The completion's `qp_num` was 0: its poller reads no QP numbers (an
    /// [`ExCqPoller`](crate::ExCqPoller) without `QP_NUM`).
    pub const fn no_qp_num(self) -> bool {
        self.0 & Self::NO_QP_NUM != 0
    }
}

impl fmt::Debug for Misrouted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Misrouted")
            .field("ring", &self.ring())
            .field("recv", &self.recv())
            .field("given_to", &self.given_to())
            .field("given_to_recv", &self.given_to_recv())
            .field("no_qp_num", &self.no_qp_num())
            .finish()
    }
}

impl fmt::Display for Misrouted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = |recv: bool| if recv { "receive" } else { "send" };
        let ring_type = |recv: bool| if recv { "RecvRing" } else { "send ring" };
        if self.recv() != self.given_to_recv() {
            write!(
                f,
                "a {} completion (ring id {}) was given to the {} with ring id {}: hand it to \
                 the {} with ring id {} (route by Completion::ring())",
                kind(self.recv()),
                self.ring(),
                ring_type(self.given_to_recv()),
                self.given_to(),
                ring_type(self.recv()),
                self.ring()
            )
        } else if self.ring() != self.given_to() {
            write!(
                f,
                "ring id {} is another ring's (a {} completion given to the {} with ring id \
                 {}): route by Completion::ring()",
                self.ring(),
                kind(self.recv()),
                ring_type(self.given_to_recv()),
                self.given_to()
            )
        } else if self.no_qp_num() {
            write!(
                f,
                "a completion with qp_num 0 given to the {} with ring id {}: its poller reads \
                 no QP numbers (an ExCqPoller without ExFields::QP_NUM or with_qp_num): ask \
                 for ExFields::QP_NUM",
                ring_type(self.given_to_recv()),
                self.given_to()
            )
        } else {
            write!(
                f,
                "a completion of another QP (Completion::qp_num) given to the {} with ring id \
                 {}: ring ids are unique per CQ only, so it was polled from a CQ this ring \
                 does not use: give each CQ's completions to that CQ's rings",
                ring_type(self.given_to_recv()),
                self.given_to()
            )
        }
    }
}

impl fmt::Display for WcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Self::Misrouted(m) = self {
            return m.fmt(f);
        }
        write!(
            f,
            "completion failed with {} ({}): {}",
            self.name(),
            self.status(),
            self.hint()
        )
    }
}

/// A post verb (`ibv_post_send(3)`, `ibv_post_recv(3)`, `ibv_post_srq_recv(3)`) refused part
/// of a chain. WRs before `first_rejected` were accepted; the rest were not and the ring has
/// already dropped them (their slots are free again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostError {
    /// The verb that failed.
    pub verb: &'static str,
    /// The errno value it returned.
    pub errno: i32,
    /// Index in the posted chain of the first WR not accepted (`*bad_wr`).
    pub first_rejected: usize,
    /// The ring sequence number (SendRing) or slot (RecvRing) of that WR.
    pub first_rejected_seq: u64,
}

impl PostError {
    /// `first_rejected` when the provider did not name a WR of the chain (`bad_wr` NULL or
    /// outside it; rxe returns EINVAL with `bad_wr` NULL before RTS and queues the WRs
    /// anyway). The ring then counts every WR of the chain as posted, since the device may
    /// run them, and (send rings) refuses new WRs until the QP went through RESET and the
    /// ring was reset; `first_rejected_seq` is the first WR of the chain.
    pub const UNKNOWN: usize = usize::MAX;
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first_rejected == Self::UNKNOWN {
            return write!(
                f,
                "{} failed with {} ({}) without naming the rejected WR (chain from seq/slot {}): \
                 the device may still run the chain; move the QP to RESET and reset the ring",
                self.verb,
                errno_name(self.errno),
                self.errno,
                self.first_rejected_seq
            );
        }
        write!(
            f,
            "{} failed with {} ({}) at WR {} of the chain (seq {}): {}",
            self.verb,
            errno_name(self.errno),
            self.errno,
            self.first_rejected,
            self.first_rejected_seq,
            match self.errno {
                libc_errno::ENOMEM => "the work queue is full: the QP's depth is smaller than the ring's",
                libc_errno::EINVAL => "a WR field is invalid for this QP (opcode, num_sge, inline size), or the QP state does not allow posting (sends need RTS, receives INIT or later: the setup layer's rings say which with explain)",
                _ => "check the QP state and capabilities",
            }
        )
    }
}

/// errno values used in messages (no libc dependency in the datapath).
mod libc_errno {
    pub const ENOMEM: i32 = 12;
    pub const EINVAL: i32 = 22;
}

/// Why a [`SendRing`](crate::SendRing) could not take a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError {
    /// Back-pressure: all `depth` slots are staged or outstanding. Poll the CQ (a signaled
    /// WR is always in flight when this happens), then retry.
    WouldBlock,
    /// The QP reported an error completion; the ring refuses new WRs until
    /// [`SendRing::reset`](crate::SendRing::reset) after the QP went through RESET.
    QpError(WcError),
    /// Inline payload longer than the QP's `max_inline_data`.
    InlineTooLong {
        /// Payload length.
        len: usize,
        /// The ring's inline limit.
        max: u32,
    },
    /// The remote range `offset .. offset + len` is outside the ring's [`RemoteBuf`](crate::RemoteBuf).
    RemoteOutOfRange {
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
    },
    /// Atomic operations need an 8-byte aligned remote address and an 8-byte local buffer.
    AtomicMisaligned,
    /// An RDMA/atomic message on a ring configured without a remote buffer, or with UD.
    NoRemote,
    /// A safe send method was given a zero-copy [`Local::Buf`](crate::Local::Buf) payload,
    /// which must go through the `unsafe` [`SendRing::stage`](crate::SendRing::stage).
    NotInline,
    /// The post verb refused part of the chain.
    Post(PostError),
    /// A setting the ring refused (e.g. [`ConfigError::UdDest`] from
    /// [`SendRing::set_ud_dest`](crate::SendRing::set_ud_dest)).
    Config(ConfigError),
    /// A [`WrRing`](crate::WrRing) message whose `ibv_wr_*` builder the extended QP does not
    /// have (its opcode was not in the `send_ops_flags` the QP was created with).
    OpNotEnabled(crate::send::Opcode),
    /// An RDMA READ or atomic message on an mlx5 direct ring of a UC QP: the UC transport
    /// carries SEND and RDMA WRITE (with or without immediate) only.
    NotOnUc(crate::send::Opcode),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WouldBlock => write!(f, "send ring full: poll the CQ to retire completions, then retry"),
            Self::QpError(e) => write!(f, "QP in error after {e}; move the QP to RESET, call SendRing::reset, then INIT -> RTR -> RTS"),
            Self::InlineTooLong { len, max } => write!(f, "inline payload of {len} bytes exceeds max_inline {max}: raise the QP's max_inline_data (and the ring's max_inline), or send it zero-copy with the unsafe stage and Local::Buf (the NIC reads that buffer until the completion, which no borrow can promise)"),
            Self::RemoteOutOfRange { offset, len } => write!(f, "remote range {offset}+{len} outside the ring's remote buffer"),
            Self::AtomicMisaligned => write!(f, "atomics need an 8-byte aligned remote offset and an 8-byte local buffer"),
            Self::NoRemote => write!(f, "RDMA/atomic operation on a ring without a remote buffer (configure SendConfig::remote)"),
            Self::NotInline => write!(f, "zero-copy payload (Local::Buf) given to a safe method: the NIC reads the buffer until the WR's completion, which no borrow can promise; copy it inline (Local::Inline, up to max_inline bytes) or use the unsafe stage"),
            Self::Post(e) => e.fmt(f),
            Self::Config(e) => e.fmt(f),
            Self::OpNotEnabled(op) => write!(f, "the extended QP has no ibv_wr_* builder for {op:?}: create it with that opcode in send_ops_flags (ibv_create_qp_ex)"),
            Self::NotOnUc(op) => write!(f, "{op:?} on a UC QP: the UC transport carries SEND and RDMA WRITE (with or without immediate) only; use an RC QP for RDMA READ and atomics"),
        }
    }
}

impl From<PostError> for SendError {
    fn from(e: PostError) -> Self {
        Self::Post(e)
    }
}

/// A ring configuration that cannot work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `depth` is larger than the ring's `N` slots.
    Depth,
    /// `depth` or `max_inline` ([`SendConfig::DERIVED`](crate::SendConfig::DERIVED)), or a
    /// receive ring's `count` ([`RecvConfig::slots`](crate::RecvConfig::slots)), was not said:
    /// those leave it to the setup layer, which derives it from the QP.
    Unresolved,
    /// The ring type's `N` is not a power of two (slots are indexed by masking).
    RingSize {
        /// The `N` asked for.
        n: usize,
    },
    /// `signal_every` is 0 or larger than `depth / 2`.
    SignalPeriod,
    /// `batch` is 0 or larger than `depth`.
    Batch,
    /// Both a remote buffer and a UD destination were given.
    RemoteAndUd,
    /// Receive slots: `slot_len` is 0, `count * slot_len` exceeds the region, or `count > N`.
    Slots,
    /// A NULL QP, CQ or SRQ pointer.
    Null,
    /// A UD QP without a UD destination, or one whose AH is NULL or of another device
    /// context (the provider reads the AH as its own type while posting).
    UdDest,
    /// A [`WrRing`](crate::WrRing) on a QP without the `ibv_wr_*` ops it needs
    /// (`wr_start`, `wr_complete`, `wr_abort`, `wr_set_sge`, `wr_set_sge_list`, and
    /// `wr_set_inline_data` / `wr_set_ud_addr` when it sends inline / UD).
    ExtendedOps,
    /// An [`ExCqPoller`](crate::ExCqPoller) asked for a field the extended CQ was not created
    /// with (not in its `wc_flags`, or the provider left the reader NULL).
    WcFields,
    /// A [`DirectRing`](crate::DirectRing) or [`DirectPoller`](crate::DirectPoller) on a
    /// send queue or CQ the mlx5 direct path does not model.
    Direct(crate::mlx5::DirectError),
    /// A [`DirectSession`](crate::mlx5::DirectSession) or
    /// [`DirectWindow`](crate::mlx5::DirectWindow) the ring cannot give: what is missing.
    Fixed(&'static str),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Direct(e) => return fmt::Display::fmt(e, f),
            Self::Fixed(what) => return write!(f, "mlx5 direct session / window: {what}"),
            Self::RingSize { n } => {
                return write!(
                    f,
                    "the ring's N = {n} is not a power of two (its slots are indexed by \
                     masking): use {}",
                    n.checked_next_power_of_two().unwrap_or(1 << 16)
                )
            }
            _ => {}
        }
        f.write_str(match self {
            Self::Depth => "depth must be in 1..=N and not above the QP's max_send_wr/max_recv_wr",
            Self::Unresolved => {
                "a setting left for the setup layer is not set: say it on a raw ring \
                 (SendConfig::depth and max_inline, or SendConfig::new; RecvConfig::count, or \
                 RecvConfig::new); hotverbs' Qp::send_ring / recv_ring derive them from the QP"
            }
            Self::SignalPeriod => {
                "signal_every must be in 1..=depth/2 so a signaled WR is always in flight"
            }
            Self::Batch => "batch must be in 1..=depth",
            Self::RemoteAndUd => {
                "a ring is either RC/UC with a remote buffer or UD with a destination, not both"
            }
            Self::Slots => {
                "receive slots: slot_len > 0, count <= N and count * slot_len <= region length"
            }
            Self::Null => "NULL QP/CQ/SRQ pointer",
            Self::UdDest => {
                "a UD QP needs SendConfig::ud with a live AH of the QP's device context"
            }
            Self::ExtendedOps => {
                "the QP has no ibv_wr_* ops: create it with ibv_create_qp_ex and \
                 IBV_QP_INIT_ATTR_SEND_OPS_FLAGS (inline sends need max_inline_data > 0)"
            }
            Self::WcFields => {
                "a requested completion field is not in the extended CQ's wc_flags: \
                 add it to ibv_create_cq_ex's wc_flags or do not ask for it"
            }
            Self::Direct(_) | Self::Fixed(_) | Self::RingSize { .. } => {
                unreachable!("formatted above")
            }
        })
    }
}

/// Why a receive completion did not yield a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecvError {
    /// The receive in `slot` completed with an error (e.g. `WrFlush` after a QP error).
    /// The slot is idle: it is re-posted by [`RecvRing::reset`](crate::RecvRing::reset).
    Completion {
        /// The slot.
        slot: u32,
        /// The status.
        error: WcError,
    },
    /// A completion of this ring (its ring id, kind and QP) that is not for a slot it has
    /// posted: stale (left in the CQ across a reset, or given a second time). Ignore it.
    Stale {
        /// Its `wr_id`.
        wr_id: u64,
    },
    /// A completion that is not this ring's at all: another ring's, a send completion, or
    /// another QP's. Nothing changed; give it to the ring it names (see [`Misrouted`]).
    Misrouted(Misrouted),
    /// A [`Received`](crate::Received) of another ring was given to this one.
    Foreign {
        /// Its slot.
        slot: u32,
    },
    /// Re-posting released slots failed.
    Post(PostError),
}

impl From<PostError> for RecvError {
    fn from(e: PostError) -> Self {
        Self::Post(e)
    }
}

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Completion { slot, error } => write!(f, "receive slot {slot}: {error}"),
            Self::Stale { wr_id } => write!(f, "completion wr_id {wr_id:#x} is not a posted slot of this ring (stale: left across a reset, or given twice)"),
            Self::Misrouted(m) => m.fmt(f),
            Self::Foreign { slot } => write!(f, "Received of slot {slot} belongs to another RecvRing: give it back to the ring that produced it"),
            Self::Post(e) => e.fmt(f),
        }
    }
}

/// [`RecvRing::try_release`](crate::RecvRing::try_release) refused or could not finish.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseError {
    /// A [`Received`](crate::Received) of another ring, handed back untouched: release it
    /// on the ring that made it (its slot is held there until then).
    Foreign(crate::Received),
    /// The slot was released, but re-posting the released slots failed: the ones not
    /// posted stay pending for the next `repost`.
    Post(PostError),
}

impl fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Foreign(m) => write!(
                f,
                "RecvRing::try_release: the Received of slot {} belongs to another RecvRing (handed \
                 back: release it on the ring that produced it)",
                m.slot()
            ),
            Self::Post(e) => e.fmt(f),
        }
    }
}

impl core::error::Error for ReleaseError {}

/// `ibv_poll_cq(3)` returned a negative value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollError {
    /// The return value of `ibv_poll_cq`.
    pub rc: i32,
}

impl fmt::Display for PollError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ibv_poll_cq failed with {}: the CQ is in error (overrun?): recreate it",
            self.rc
        )
    }
}

impl core::error::Error for WcError {}
impl core::error::Error for PostError {}
impl core::error::Error for SendError {}
impl core::error::Error for ConfigError {}
impl core::error::Error for RecvError {}
impl core::error::Error for PollError {}
impl core::error::Error for Misrouted {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_maps_to_a_named_error() {
        assert_eq!(WcError::from_status(IBV_WC_SUCCESS), None);
        for s in IBV_WC_LOC_LEN_ERR..=IBV_WC_TM_RNDV_INCOMPLETE {
            let e = WcError::from_status(s).unwrap();
            assert!(!matches!(e, WcError::Unknown(_)), "status {s}");
            assert_eq!(e.status(), s);
            assert_eq!(e.name(), wc_status_name(s));
        }
        assert_eq!(
            WcError::from_status(IBV_WC_REM_ACCESS_ERR),
            Some(WcError::RemAccess)
        );
        assert_eq!(WcError::from_status(999), Some(WcError::Unknown(999)));
        assert_eq!(
            WcError::from_status(Misrouted::STATUS),
            Some(WcError::Unknown(Misrouted::STATUS)),
            "no status decodes as Misrouted"
        );
    }

    #[test]
    fn misrouted_says_where_the_completion_belongs() {
        let m = |ring, recv, given_to, given_to_recv, no_qp| {
            std::format!(
                "{}",
                WcError::Misrouted(Misrouted::new(ring, recv, given_to, given_to_recv, no_qp))
            )
        };
        let s = m(7, true, 1, false, false);
        assert!(s.contains("hand it to the RecvRing with ring id 7"), "{s}");
        let s = m(1, false, 2, true, false);
        assert!(s.contains("hand it to the send ring with ring id 1"), "{s}");
        let s = m(3, false, 1, false, false);
        assert!(
            s.contains("ring id 3 is another ring's") && s.contains("Completion::ring()"),
            "{s}"
        );
        let s = m(1, false, 1, false, true);
        assert!(s.contains("ExFields::QP_NUM"), "{s}");
        let s = m(1, false, 1, false, false);
        assert!(s.contains("another QP"), "{s}");
        let x = Misrouted::new(200, true, 17, false, true);
        assert_eq!(
            (
                x.ring(),
                x.recv(),
                x.given_to(),
                x.given_to_recv(),
                x.no_qp_num()
            ),
            (200, true, 17, false, true)
        );
        let e = WcError::Misrouted(Misrouted::new(0, false, 1, false, false));
        assert_eq!(e.status(), Misrouted::STATUS);
        assert_eq!(e.name(), "misrouted completion");
    }

    #[test]
    fn messages_name_verb_and_errno() {
        let e = PostError {
            verb: "ibv_post_send",
            errno: 12,
            first_rejected: 3,
            first_rejected_seq: 40,
        };
        let s = std::format!("{e}");
        assert!(
            s.contains("ibv_post_send") && s.contains("ENOMEM") && s.contains("WR 3"),
            "{s}"
        );
        let s = std::format!("{}", WcError::RnrRetryExc);
        assert!(
            s.contains("IBV_WC_RNR_RETRY_EXC_ERR") && s.contains("credits"),
            "{s}"
        );
    }
}
