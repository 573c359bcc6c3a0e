//! Setup-side posting: the work request [`SendWr`] that `Qp::post_send` /
//! `Qp::post_send_inline` take, and the hints a refused post gets (the QP's state when it
//! explains the refusal). Split from `qp.rs` (the package caps a source file at 100 KiB).

use std::fmt;

use hotverbs_datapath::PostError;
use hotverbs_ffi::flags::SendFlags;

use crate::ah::Ah;
use crate::mr::{RemoteMr, Sge};
use crate::qp::QpState;

/// What to do about the refused post `p` (made by `ring`, e.g. `"SendRing"`) on a QP in
/// `state`: the state when it explains the refusal, else the errno's usual cause; and, when
/// the provider did not name the rejected WR, the recovery the ring needs.
#[cold]
pub(crate) fn post_hint(state: QpState, p: &PostError, send: bool, ring: &str) -> String {
    let cause = match state.post_hint(send) {
        Some(h) => h,
        None => match (p.errno, send) {
            (libc::ENOMEM, true) => {
                "the send queue is full: the QP's max_send_wr is below the ring's depth, or raw \
                 posts share the queue"
            }
            (libc::ENOMEM, false) => {
                "the receive queue is full: the QP's max_recv_wr is below the ring's slots, or \
                 raw posts share the queue"
            }
            (libc::EINVAL, _) => {
                "a WR field is invalid for this QP (opcode, num_sge, inline size against the \
                 QP's caps: Qp::cap)"
            }
            _ => "check the QP's state and capabilities (Qp::query)",
        },
    };
    if p.first_rejected != PostError::UNKNOWN {
        return cause.to_string();
    }
    if send {
        format!(
            "{cause}; the provider did not name the rejected WR (rxe queues a chain posted \
             before RTS anyway, to run in RTS), so the ring counts the chain from seq {} as \
             posted and refuses new WRs until {ring}::reset_qp() (reset_qp_with when a RecvRing \
             owns the receive queue)",
            p.first_rejected_seq
        )
    } else {
        format!(
            "{cause}; the provider did not name the rejected WR, so the ring counts the chain \
             from slot {} as posted until {ring}::reset_qp() requeues it (the move to RESET \
             discards whatever the provider queued)",
            p.first_rejected_seq
        )
    }
}

/// The hint for an inline payload of `len` bytes over the limit `max`.
#[cold]
pub(crate) fn inline_too_long_hint(len: u64, max: u32) -> String {
    format!(
        "inline payload of {len} bytes > max_inline_data {max}: raise the limit \
         (QpBuilder::max_inline_data, SendConfig::max_inline) or split the message, or send \
         it from a registered buffer with the unsafe stage (Msg with Local::Buf). No safe call \
         sends from a registered buffer: the NIC reads it after the post returns, until the \
         WR's completion, and a borrow cannot be held that long; stage's contract is that the \
         buffer stays registered and unwritten until is_retired(seq)"
    )
}

/// The hint for [`SendError::NotInline`].
pub(crate) const NOT_INLINE_HINT: &str =
    "a zero-copy payload (Local::Buf) given to a safe method: the \
     NIC reads the buffer after the post returns, until the WR's completion, which a borrow \
     cannot promise, so only the unsafe stage takes one (its contract: the buffer stays \
     registered and unwritten, for READ and atomics untouched, until is_retired(seq)); or \
     send the bytes as Local::Inline (at most max_inline)";

#[derive(Clone, Copy)]
pub(crate) enum WrKind<'a> {
    Plain,
    Rdma(RemoteMr),
    Atomic {
        remote: RemoteMr,
        compare_add: u64,
        swap: u64,
    },
    Ud {
        ah: &'a Ah,
        qpn: u32,
        qkey: u32,
    },
}

/// The local side of a [`SendWr`].
#[derive(Clone, Copy)]
pub(crate) enum Payload<'a> {
    /// Registered memory the NIC reads (or, for READ/atomics, writes) after the post.
    Sges(&'a [Sge]),
    /// Bytes copied during the post (`IBV_SEND_INLINE`).
    Inline(&'a [u8]),
}

/// A send work request for [`Qp::post_send`](crate::Qp::post_send) (and, when its payload is inline bytes,
/// the safe [`Qp::post_send_inline`](crate::Qp::post_send_inline)): `new`-style constructors per opcode, then
/// chainable flags.
///
/// # Example
/// ```
/// use hotverbs::{RemoteMr, Sge, SendWr};
/// let sge = Sge { addr: 0x1000, length: 64, lkey: 7 };
/// let remote = RemoteMr { addr: 0x2000, len: 64, rkey: 9 };
/// let sges = [sge];
/// let wr = SendWr::write(1, &sges, remote).imm(42).signaled();
/// assert_eq!(wr.wr_id(), 1);
/// assert!(!wr.is_inline());
/// assert!(SendWr::send_inline(2, b"hi").is_inline());
/// ```
#[derive(Clone)]
pub struct SendWr<'a> {
    pub(crate) wr_id: u64,
    pub(crate) opcode: u32,
    pub(crate) payload: Payload<'a>,
    pub(crate) flags: SendFlags,
    pub(crate) imm: Option<u32>,
    pub(crate) kind: WrKind<'a>,
}

impl fmt::Debug for SendWr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("SendWr");
        d.field("wr_id", &self.wr_id).field("opcode", &self.opcode);
        match self.payload {
            Payload::Sges(s) => d.field("sges", &s),
            Payload::Inline(b) => d.field("inline_len", &b.len()),
        };
        d.field("flags", &self.flags)
            .field("imm", &self.imm)
            .finish_non_exhaustive()
    }
}

impl<'a> SendWr<'a> {
    fn new(wr_id: u64, opcode: u32, sges: &'a [Sge], kind: WrKind<'a>) -> Self {
        SendWr {
            wr_id,
            opcode,
            payload: Payload::Sges(sges),
            flags: SendFlags::empty(),
            imm: None,
            kind,
        }
    }
    /// A WR of `bytes` sent inline (`IBV_SEND_INLINE`, set for good).
    fn new_inline(wr_id: u64, opcode: u32, bytes: &'a [u8], kind: WrKind<'a>) -> Self {
        SendWr {
            wr_id,
            opcode,
            payload: Payload::Inline(bytes),
            flags: SendFlags::INLINE,
            imm: None,
            kind,
        }
    }
    /// `IBV_WR_SEND` of `bytes` inline (with `imm`, `IBV_WR_SEND_WITH_IMM`): the provider
    /// copies them during the post, so they need no registration and are free when the
    /// call returns; postable safely with [`Qp::post_send_inline`](crate::Qp::post_send_inline) (at most the QP's
    /// `max_inline_data` bytes).
    pub fn send_inline(wr_id: u64, bytes: &'a [u8]) -> Self {
        Self::new_inline(wr_id, hotverbs_ffi::IBV_WR_SEND, bytes, WrKind::Plain)
    }
    /// `IBV_WR_RDMA_WRITE` of `bytes` inline into `remote` (with `imm`,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`); as [`send_inline`](Self::send_inline).
    pub fn write_inline(wr_id: u64, bytes: &'a [u8], remote: RemoteMr) -> Self {
        Self::new_inline(
            wr_id,
            hotverbs_ffi::IBV_WR_RDMA_WRITE,
            bytes,
            WrKind::Rdma(remote),
        )
    }
    /// A UD send of `bytes` inline to `qpn` (Q_Key `qkey`) through `ah`; as
    /// [`send_inline`](Self::send_inline).
    pub fn ud_inline(wr_id: u64, bytes: &'a [u8], ah: &'a Ah, qpn: u32, qkey: u32) -> Self {
        Self::new_inline(
            wr_id,
            hotverbs_ffi::IBV_WR_SEND,
            bytes,
            WrKind::Ud { ah, qpn, qkey },
        )
    }
    /// Is the payload inline bytes ([`send_inline`](Self::send_inline) and its kin)?
    pub fn is_inline(&self) -> bool {
        matches!(self.payload, Payload::Inline(_))
    }
    /// `IBV_WR_SEND` (with `imm`, `IBV_WR_SEND_WITH_IMM`).
    pub fn send(wr_id: u64, sges: &'a [Sge]) -> Self {
        Self::new(wr_id, hotverbs_ffi::IBV_WR_SEND, sges, WrKind::Plain)
    }
    /// `IBV_WR_RDMA_WRITE` into `remote` (with `imm`, `IBV_WR_RDMA_WRITE_WITH_IMM`).
    pub fn write(wr_id: u64, sges: &'a [Sge], remote: RemoteMr) -> Self {
        Self::new(
            wr_id,
            hotverbs_ffi::IBV_WR_RDMA_WRITE,
            sges,
            WrKind::Rdma(remote),
        )
    }
    /// `IBV_WR_RDMA_READ` from `remote` into `sges`.
    pub fn read(wr_id: u64, sges: &'a [Sge], remote: RemoteMr) -> Self {
        Self::new(
            wr_id,
            hotverbs_ffi::IBV_WR_RDMA_READ,
            sges,
            WrKind::Rdma(remote),
        )
    }
    /// `IBV_WR_ATOMIC_CMP_AND_SWP` on the 8 bytes at `remote.addr`; the old value lands
    /// in `sge` (8 bytes).
    pub fn compare_swap(
        wr_id: u64,
        sge: &'a [Sge],
        remote: RemoteMr,
        compare: u64,
        swap: u64,
    ) -> Self {
        Self::new(
            wr_id,
            hotverbs_ffi::IBV_WR_ATOMIC_CMP_AND_SWP,
            sge,
            WrKind::Atomic {
                remote,
                compare_add: compare,
                swap,
            },
        )
    }
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD` on the 8 bytes at `remote.addr`; the old value
    /// lands in `sge` (8 bytes).
    pub fn fetch_add(wr_id: u64, sge: &'a [Sge], remote: RemoteMr, add: u64) -> Self {
        Self::new(
            wr_id,
            hotverbs_ffi::IBV_WR_ATOMIC_FETCH_AND_ADD,
            sge,
            WrKind::Atomic {
                remote,
                compare_add: add,
                swap: 0,
            },
        )
    }
    /// A UD send to `qpn` (Q_Key `qkey`) through `ah`.
    pub fn ud(wr_id: u64, sges: &'a [Sge], ah: &'a Ah, qpn: u32, qkey: u32) -> Self {
        Self::new(
            wr_id,
            hotverbs_ffi::IBV_WR_SEND,
            sges,
            WrKind::Ud { ah, qpn, qkey },
        )
    }
    /// Adds immediate data (SEND -> SEND_WITH_IMM, WRITE -> WRITE_WITH_IMM).
    pub fn imm(mut self, imm: u32) -> Self {
        self.imm = Some(imm);
        if self.opcode == hotverbs_ffi::IBV_WR_SEND {
            self.opcode = hotverbs_ffi::IBV_WR_SEND_WITH_IMM;
        } else if self.opcode == hotverbs_ffi::IBV_WR_RDMA_WRITE {
            self.opcode = hotverbs_ffi::IBV_WR_RDMA_WRITE_WITH_IMM;
        }
        self
    }
    /// `IBV_SEND_SIGNALED`: produce a completion.
    pub fn signaled(mut self) -> Self {
        self.flags |= SendFlags::SIGNALED;
        self
    }
    /// `IBV_SEND_INLINE` on a WR of SGEs: the provider copies the data they describe at
    /// post time (still posted with the unsafe [`Qp::post_send`](crate::Qp::post_send): the SGEs are raw
    /// addresses; for bytes, [`send_inline`](Self::send_inline) and the safe
    /// [`Qp::post_send_inline`](crate::Qp::post_send_inline)).
    pub fn inline(mut self) -> Self {
        self.flags |= SendFlags::INLINE;
        self
    }
    /// Adds raw send flags.
    pub fn flags(mut self, f: SendFlags) -> Self {
        self.flags |= f;
        self
    }
    /// The WR id.
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }
}
