//! mlx5 direct path: WQEs written straight into a ConnectX send queue and CQEs (64 or 128
//! bytes) read straight from its CQ, without libmlx5's generic `mlx5_post_send` / `mlx5_poll_cq`.
//!
//! - [`DirectRing`]: the [`Msg`](crate::Msg) API of [`SendRing`](crate::SendRing) and
//!   [`WrRing`](crate::WrRing) (batching, signal schedule, back-pressure, split mode, exact
//!   retirement on errors), writing control, remote-address, atomic, datagram, data-pointer
//!   and inline segments itself and ringing the doorbell as libmlx5 does.
//! - [`DirectPoller`]: reads requester CQEs (owner bit, opcode, syndrome, `wqe_counter`) into
//!   the same [`Completion`](crate::Completion)s, which the ring retires as any other.
//!
//! The setup layer (`hotverbs`' `Qp::direct_ring` / `Cq::direct_poller`) fills
//! [`DirectSq`] and [`DirectCq`] from `mlx5dv_init_obj(3)`; anything else works on plain
//! memory (the golden test runs the ring against libmlx5's own `qp.c` / `cq.c` on fake
//! objects and compares every byte, doorbell record and UAR store).
//!
//! # What is written, and why it equals libmlx5 (rdma-core 44..55, `providers/mlx5/qp.c`)
//! Per WR at `idx = cur_post & (wqe_cnt - 1)`:
//! - ctrl (16 B): `opmod_idx_opcode = be32(cur_post & 0xffff) << 8 | opcode)`,
//!   `qpn_ds = be32(qpn << 8 | ds)`, bytes 8..11 zero then `fm_ce_se` (`CQ_UPDATE` when
//!   signaled), `imm` (big-endian immediate for the `_WITH_IMM` opcodes, else 0);
//!   `fm_ce_se` also carries a message's [`fence`](crate::Msg::fence)
//!   (`MLX5_WQE_CTRL_FENCE`) and [`solicited`](crate::Msg::solicited)
//!   (`MLX5_WQE_CTRL_SOLICITED`), as libmlx5's `_mlx5_post_send` sets them for
//!   `IBV_SEND_FENCE` / `IBV_SEND_SOLICITED` (its other fence, the small initiator fence
//!   after a memory-window bind or local invalidate, `fm_cache`, never arises: the ring
//!   posts neither);
//! - RC and UC READ / WRITE(_IMM): raddr segment (`be64 addr`, `be32 rkey`, 4 zero bytes;
//!   UC has no READ: refused);
//! - RC atomics: raddr, then atomic segment (`swap_add`, `compare`; FETCH_AND_ADD writes
//!   only `swap_add`, as libmlx5: the device ignores `compare` there);
//! - UD: the 48-byte address vector of the destination's AH with `dqp_dct =
//!   be32(remote_qpn | 1 << 31)` and `qkey`; a datagram segment that ends the SQ wraps the
//!   next segment to its start;
//! - payload: an inline segment (`be32(len | 1 << 31)` and the bytes, which wrap at the end
//!   of the SQ; no segment at all for zero bytes) or one data segment per non-empty buffer
//!   (`be32 len` (8 for atomics), `be32 lkey`, `be64 addr`; a zero-length buffer gets none).
//!
//! `ds` counts 16-byte units; the WQE takes `ceil(ds * 16 / 64)` basic blocks and
//! `cur_post` advances by that many. Bytes the WQE does not cover (inline padding, the
//! unused tail of its last basic block) are left as they were, as libmlx5 leaves them.
//!
//! # Doorbell ([`Doorbell`], `post_send_db()` in libmlx5)
//! After a batch of `n` WQEs, in this order:
//! 1. `udma_to_device_barrier()`: the WQE stores before the doorbell record (x86: compiler
//!    barrier; arm64: `dmb oshst`; riscv64: `fence ow,ow`);
//! 2. the doorbell record: `dbrec[MLX5_SND_DBR] = be32(cur_post & 0xffff)`;
//! 3. `mmio_wc_start()`: the record before the write-combining stores (x86: `sfence`;
//!    arm64: `dsb st`; riscv64: `fence ow,ow`);
//! 4. BlueFlame, when `n == 1`, the WQE is inline, `1 < ds <= bf_size / 16` and the QP has
//!    a BlueFlame register (`bf_size > 0`): the WQE's `align(ds * 16, 64)` bytes copied to
//!    `bf_reg + offset` 64 bytes at a time in ascending order (libmlx5's
//!    `mmio_memcpy_x64`; [`Mmio`] stores a block with one `st4` on arm64 as rdma-core
//!    does, with four 16-byte stores on x86-64, see [`Doorbell::bf_block`]), the source
//!    wrapping at the end of the SQ;
//!    otherwise one 8-byte store of the last WQE's first ctrl qword to `bf_reg + offset`;
//! 5. `mmio_flush_writes()`: flush the write-combining buffer (as step 3);
//! 6. `offset ^= bf_size`: BlueFlame buffers alternate.
//!
//! This is libmlx5's policy with its defaults (`MLX5_SHUT_UP_BF` and
//! `MLX5_POST_SEND_PREFER_BF` unset) and an unshared doorbell register (`need_lock` 0: a QP
//! created in a thread domain, or a low-latency UAR).
//!
//! # Not modelled, refused
//! Compressed CQEs and CQEs with scatter-to-CQE data ([`DirectError`]);
//! responder CQEs (a direct poller serves send CQs); send queues whose stride is not 64.

mod cq;
pub mod recv_session;
mod ring;
pub mod rq;
pub mod srq;

pub use cq::DirectPoller;
pub use recv_session::{Delivered, Polled, RecvHooks, RecvSession, RecvSessionError};
pub use ring::{DirectBatch, DirectRing, DirectSession, DirectWindow};
pub use rq::{DirectRq, DirectRqDesc};
pub use srq::{DirectSrq, DirectSrqDesc, SrqError};

/// mlx5 send opcodes (`MLX5_OPCODE_*`, PRM "Send WQE opcodes").
pub mod opcode {
    /// RDMA WRITE.
    pub const RDMA_WRITE: u8 = 0x08;
    /// RDMA WRITE with immediate.
    pub const RDMA_WRITE_IMM: u8 = 0x09;
    /// SEND.
    pub const SEND: u8 = 0x0a;
    /// SEND with immediate.
    pub const SEND_IMM: u8 = 0x0b;
    /// RDMA READ.
    pub const RDMA_READ: u8 = 0x10;
    /// Atomic compare and swap.
    pub const ATOMIC_CS: u8 = 0x11;
    /// Atomic fetch and add.
    pub const ATOMIC_FA: u8 = 0x12;
}

/// `fm_ce_se` bit: generate a CQE (`MLX5_WQE_CTRL_CQ_UPDATE`).
pub const CTRL_CQ_UPDATE: u8 = 2 << 2;
/// `fm_ce_se` bit: solicited event (`MLX5_WQE_CTRL_SOLICITED`).
pub const CTRL_SOLICITED: u8 = 1 << 1;
/// `fm_ce_se` bit: fence (`MLX5_WQE_CTRL_FENCE`).
pub const CTRL_FENCE: u8 = 4 << 5;
/// Inline segment marker in its byte count (`MLX5_INLINE_SEG`).
pub const INLINE_SEG: u32 = 0x8000_0000;
/// Extended UD address vector marker in `dqp_dct` (`MLX5_EXTENDED_UD_AV`).
pub const EXTENDED_UD_AV: u32 = 0x8000_0000;
/// The send counter's index in a QP's doorbell record (`MLX5_SND_DBR`).
pub const SND_DBR: usize = 1;
/// The consumer counter's index in a CQ's doorbell record (`MLX5_CQ_SET_CI`).
pub const CQ_SET_CI: usize = 0;
/// The arm word's index in a CQ's doorbell record (`MLX5_CQ_ARM_DB`).
pub const CQ_ARM_DB: usize = 1;
/// The CQ doorbell's offset in the CQ UAR page (`MLX5_CQ_DOORBELL`).
pub const CQ_DOORBELL: usize = 0x20;
/// Arm command: an event for the next solicited completion only
/// (`MLX5_CQ_DB_REQ_NOT_SOL`); 0 (`MLX5_CQ_DB_REQ_NOT`) for any completion.
pub const CQ_DB_REQ_NOT_SOL: u32 = 1 << 24;

/// Arms a CQ the mlx5 direct path polls, as libmlx5's `mlx5_arm_cq` does for the CQs it
/// polls itself, but from the consumer index the direct poller keeps in the CQ's doorbell
/// record (libmlx5's own one falls behind once a direct poller polls: arming with it would
/// raise events for completions already consumed). `sn` is the arm sequence number: the
/// CQ's completion events so far (libmlx5 counts them in `mlx5_cq_event`), modulo 4.
///
/// The stores and barriers, as libmlx5's: the arm word `sn << 28 | cmd | ci` to the
/// doorbell record, `mmio_wc_start`, the 64-bit doorbell `(arm word) << 32 | cqn`
/// (big-endian) to `cq_uar + 0x20`, `mmio_flush_writes`. `cargo xtask golden` compares
/// them with `mlx5_arm_cq`'s.
///
/// # Safety
/// `dbrec` is the CQ's doorbell record and `cq_uar` its UAR page (`struct mlx5dv_cq`'s
/// `dbrec` and `cq_uar`), both live; `cqn` is its number.
pub unsafe fn arm_cq<D: Doorbell>(
    db: &mut D,
    dbrec: *mut u32,
    cq_uar: *mut u8,
    cqn: u32,
    sn: u32,
    solicited: bool,
) {
    // SAFETY: the CQ's doorbell record (the caller's contract).
    let ci = u32::from_be(unsafe { dbrec.add(CQ_SET_CI).read_volatile() }) & 0xff_ffff;
    let cmd = if solicited { CQ_DB_REQ_NOT_SOL } else { 0 };
    let word = (sn & 3) << 28 | cmd | ci;
    // SAFETY: the doorbell record and the CQ doorbell in the UAR page (the caller's
    // contract; the doorbell is 8-byte aligned in the page).
    unsafe {
        db.write_dbr(dbrec.add(CQ_ARM_DB), word.to_be());
        db.wc_start();
        db.write64(
            cq_uar.add(CQ_DOORBELL).cast::<u64>(),
            ((word as u64) << 32 | cqn as u64).to_be(),
        );
    }
    db.flush_writes();
}
/// Bytes of a send basic block (`MLX5_SEND_WQE_BB`).
pub const SEND_WQE_BB: usize = 64;
/// Bytes of an mlx5 address vector (`struct mlx5_wqe_av`).
pub const AV_SIZE: usize = 48;

/// CQE opcodes (the high nibble of `op_own`, `MLX5_CQE_*`).
pub mod cqe {
    /// Requester completion.
    pub const REQ: u8 = 0;
    /// Responder: RDMA WRITE with immediate.
    pub const RESP_WR_IMM: u8 = 1;
    /// Responder: SEND.
    pub const RESP_SEND: u8 = 2;
    /// Responder: SEND with immediate.
    pub const RESP_SEND_IMM: u8 = 3;
    /// Responder: SEND with invalidate.
    pub const RESP_SEND_INV: u8 = 4;
    /// CQ resize marker.
    pub const RESIZE_CQ: u8 = 5;
    /// Signature error.
    pub const SIG_ERR: u8 = 12;
    /// Requester error.
    pub const REQ_ERR: u8 = 13;
    /// Responder error.
    pub const RESP_ERR: u8 = 14;
    /// Not yet written by the device.
    pub const INVALID: u8 = 15;
    /// `op_own` bit: the owner (toggles on every pass over the CQ).
    pub const OWNER_MASK: u8 = 1;
    /// `op_own` bits 2..3: the CQE format (0 = plain, 1/2 = inline scatter 32/64,
    /// 3 = compressed).
    pub const FORMAT_MASK: u8 = 0x0c;
    /// Byte offsets in a 64-byte CQE (`struct mlx5_cqe64` / `struct mlx5_err_cqe`).
    pub const OFF_BYTE_CNT: usize = 44;
    /// `sop_drop_qpn`: the WQE opcode in bits 31..24, the QP number in 23..0.
    pub const OFF_SOP_DROP_QPN: usize = 56;
    /// `wqe_counter`: the index of the (last) WQE this CQE completes.
    pub const OFF_WQE_COUNTER: usize = 60;
    /// `op_own`.
    pub const OFF_OP_OWN: usize = 63;
    /// `vendor_err_synd` of an error CQE.
    pub const OFF_VENDOR_ERR: usize = 54;
    /// `syndrome` of an error CQE.
    pub const OFF_SYNDROME: usize = 55;
}

/// Error syndromes of `struct mlx5_err_cqe` (`MLX5_CQE_SYNDROME_*`).
pub mod syndrome {
    /// Local length error.
    pub const LOCAL_LENGTH_ERR: u8 = 0x01;
    /// Local QP operation error.
    pub const LOCAL_QP_OP_ERR: u8 = 0x02;
    /// Local protection error.
    pub const LOCAL_PROT_ERR: u8 = 0x04;
    /// Flushed.
    pub const WR_FLUSH_ERR: u8 = 0x05;
    /// Memory window bind error.
    pub const MW_BIND_ERR: u8 = 0x06;
    /// Bad response.
    pub const BAD_RESP_ERR: u8 = 0x10;
    /// Local access error.
    pub const LOCAL_ACCESS_ERR: u8 = 0x11;
    /// Remote invalid request.
    pub const REMOTE_INVAL_REQ_ERR: u8 = 0x12;
    /// Remote access error.
    pub const REMOTE_ACCESS_ERR: u8 = 0x13;
    /// Remote operation error.
    pub const REMOTE_OP_ERR: u8 = 0x14;
    /// Transport retry counter exceeded.
    pub const TRANSPORT_RETRY_EXC_ERR: u8 = 0x15;
    /// RNR retry counter exceeded.
    pub const RNR_RETRY_EXC_ERR: u8 = 0x16;
    /// Remote aborted.
    pub const REMOTE_ABORTED_ERR: u8 = 0x22;
}

/// The `ibv_wc_status` of an error CQE's syndrome, as libmlx5's `mlx5_handle_error_cqe`
/// maps it (unknown syndromes are `IBV_WC_GENERAL_ERR`).
#[inline]
pub const fn syndrome_status(s: u8) -> hotverbs_ffi::ibv_wc_status {
    use hotverbs_ffi::*;
    match s {
        syndrome::LOCAL_LENGTH_ERR => IBV_WC_LOC_LEN_ERR,
        syndrome::LOCAL_QP_OP_ERR => IBV_WC_LOC_QP_OP_ERR,
        syndrome::LOCAL_PROT_ERR => IBV_WC_LOC_PROT_ERR,
        syndrome::WR_FLUSH_ERR => IBV_WC_WR_FLUSH_ERR,
        syndrome::MW_BIND_ERR => IBV_WC_MW_BIND_ERR,
        syndrome::BAD_RESP_ERR => IBV_WC_BAD_RESP_ERR,
        syndrome::LOCAL_ACCESS_ERR => IBV_WC_LOC_ACCESS_ERR,
        syndrome::REMOTE_INVAL_REQ_ERR => IBV_WC_REM_INV_REQ_ERR,
        syndrome::REMOTE_ACCESS_ERR => IBV_WC_REM_ACCESS_ERR,
        syndrome::REMOTE_OP_ERR => IBV_WC_REM_OP_ERR,
        syndrome::TRANSPORT_RETRY_EXC_ERR => IBV_WC_RETRY_EXC_ERR,
        syndrome::RNR_RETRY_EXC_ERR => IBV_WC_RNR_RETRY_EXC_ERR,
        syndrome::REMOTE_ABORTED_ERR => IBV_WC_REM_ABORT_ERR,
        _ => IBV_WC_GENERAL_ERR,
    }
}

/// A ConnectX send queue as `mlx5dv_init_obj(3)` describes it (`struct mlx5dv_qp`), plus
/// the QP facts the writer needs and the `wrid` table the [`DirectPoller`] reads.
#[derive(Clone, Copy, Debug)]
pub struct DirectSq {
    /// `sq.buf`: the first basic block.
    pub buf: *mut u8,
    /// `sq.wqe_cnt`: basic blocks in the SQ (a power of two).
    pub wqe_cnt: u32,
    /// `sq.stride`: must be 64.
    pub stride: u32,
    /// `dbrec`: the QP's doorbell record; the send counter is element [`SND_DBR`].
    pub dbrec: *mut u32,
    /// `bf.reg`: the BlueFlame / doorbell register (write-combining MMIO).
    pub bf_reg: *mut u8,
    /// `bf.size`: bytes of one BlueFlame buffer; 0 = no BlueFlame (doorbells only).
    pub bf_size: u32,
    /// The BlueFlame buffer the first doorbell uses (0 or `bf_size`; libmlx5 starts at 0).
    pub bf_offset: u32,
    /// The QP number.
    pub qp_num: u32,
    /// True for a UD QP (datagram segment in every WQE), false for RC / UC.
    pub ud: bool,
    /// True for a UC QP: the WQEs are RC's (a SEND has no address segment, an RDMA WRITE
    /// the remote-address one), and RDMA READ and atomics, which UC does not carry, are
    /// refused ([`SendError::NotOnUc`](crate::SendError::NotOnUc)) where libmlx5 would
    /// post a WQE the device fails.
    pub uc: bool,
    /// `cap.max_inline_data` the QP was created with.
    pub max_inline: u32,
    /// `cap.max_send_sge` the QP was created with.
    pub max_sge: u32,
    /// `wqe_cnt` entries the ring owns: the `wr_id` of the WQE starting at each index, read
    /// by the [`DirectPoller`] the QP's send CQ is polled with.
    pub wrid: *mut u64,
}

/// A ConnectX CQ as `mlx5dv_init_obj(3)` describes it (`struct mlx5dv_cq`).
#[derive(Clone, Copy, Debug)]
pub struct DirectCq {
    /// `buf`: the first CQE.
    pub buf: *mut u8,
    /// `cqe_cnt`: CQEs in the buffer (a power of two).
    pub cqe_cnt: u32,
    /// `cqe_size`: 64 or 128 (`MLX5_CQE_SIZE`; a 128-byte CQE has the 64-byte CQE's
    /// fields in its second half).
    pub cqe_size: u32,
    /// `dbrec`: the consumer index goes to element [`CQ_SET_CI`].
    pub dbrec: *mut u32,
    /// `cqn`.
    pub cqn: u32,
    /// The consumer index to start at (0 for a CQ nothing was polled from).
    pub cons_index: u32,
}

/// UD destination of a [`DirectRing`]: the AH's address vector as `mlx5dv_init_obj(3)`
/// gives it (`struct mlx5dv_ah`'s `av`, [`AV_SIZE`] bytes), with the remote QP and Q_Key.
#[derive(Clone, Copy, Debug)]
pub struct DirectUd {
    /// The AH's `struct mlx5_wqe_av`; it must outlive the ring.
    pub av: *const u8,
    /// Remote QP number.
    pub remote_qpn: u32,
    /// Q_Key.
    pub remote_qkey: u32,
}

/// A configuration or CQE the direct path does not model: refused, never guessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectError {
    /// SQ stride other than 64 bytes, a `wqe_cnt` that is not a power of two, or a NULL
    /// buffer, doorbell record, register or `wrid` table.
    Sq(&'static str),
    /// The ring's depth times its largest WQE does not fit the SQ.
    SqTooSmall {
        /// Basic blocks the ring may need.
        need: u64,
        /// Basic blocks the SQ has.
        have: u32,
    },
    /// CQE size other than 64 or 128 bytes (`cqe_size`), or a bad CQ descriptor.
    Cq(&'static str),
    /// A compressed or scatter-to-CQE entry (`op_own` format bits), at this CQ index.
    CqeFormat {
        /// The CQE's `op_own`.
        op_own: u8,
        /// Its consumer index.
        index: u32,
    },
    /// A CQE this poller does not parse (a responder, resize or signature CQE).
    CqeOpcode {
        /// The CQE opcode.
        opcode: u8,
        /// Its consumer index.
        index: u32,
    },
    /// A requester CQE for a QP no ring registered with the poller.
    UnknownQp(u32),
    /// The poller already serves its maximum number of send queues.
    TooManyQps,
    /// A responder CQE for an SRQ no queue was attached for
    /// ([`DirectPoller::attach_srq`](cq::DirectPoller::attach_srq)).
    UnknownSrq(u32),
    /// This target has no [`Mmio`] doorbell (hotverbs writes rdma-core's MMIO barriers for
    /// x86-64, arm64 and riscv64 only): the direct path is refused here, the verbs rings
    /// work.
    NoMmio,
}

/// The target's architecture, for [`DirectError::NoMmio`]'s message.
const TARGET_ARCH: &str = if cfg!(target_arch = "x86_64") {
    "x86-64"
} else if cfg!(target_arch = "aarch64") {
    "arm64"
} else if cfg!(target_arch = "riscv64") {
    "riscv64"
} else if cfg!(target_arch = "powerpc64") {
    "powerpc64"
} else if cfg!(target_arch = "s390x") {
    "s390x"
} else if cfg!(target_arch = "loongarch64") {
    "loongarch64"
} else {
    "this target"
};

impl core::fmt::Display for DirectError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            DirectError::Sq(what) => write!(f, "mlx5 direct ring: unsupported send queue: {what}"),
            DirectError::SqTooSmall { need, have } => write!(
                f,
                "mlx5 direct ring: depth x largest WQE needs {need} basic blocks, the SQ has \
                 {have}: lower the depth or max_inline, or create the QP with more max_send_wr"
            ),
            DirectError::Cq(what) => write!(f, "mlx5 direct poller: unsupported CQ: {what}"),
            DirectError::CqeFormat { op_own, index } => write!(
                f,
                "mlx5 direct poller: CQE {index} has format bits {:#x} (op_own {op_own:#04x}): \
                 compressed or scatter-to-CQE entries are not modelled; create the CQ without \
                 CQE compression and the QP with sq_sig_all = 0",
                (op_own & cqe::FORMAT_MASK) >> 2
            ),
            DirectError::CqeOpcode { opcode, index } => write!(
                f,
                "mlx5 direct poller: CQE {index} has opcode {opcode} (not a requester CQE): a \
                 direct poller serves send CQs only; poll receive CQs with CqPoller"
            ),
            DirectError::UnknownQp(qpn) => write!(
                f,
                "mlx5 direct poller: CQE for QP {qpn:#x}, which no direct ring registered \
                 (DirectPoller::attach)"
            ),
            DirectError::UnknownSrq(srqn) => write!(
                f,
                "mlx5 direct poller: CQE for SRQ {srqn:#x}, which no direct SRQ registered \
                 (DirectPoller::attach_srq)"
            ),
            DirectError::TooManyQps => write!(
                f,
                "mlx5 direct poller: already serves {} send queues",
                cq::MAX_QPS
            ),
            DirectError::NoMmio => write!(
                f,
                "mlx5 direct path: no MMIO doorbell on {}: hotverbs rings a ConnectX with \
                 rdma-core's barriers on x86-64, arm64 and riscv64 only; use the verbs rings \
                 (SendRing, WrRing, CqPoller), which libmlx5 drives",
                TARGET_ARCH
            ),
        }
    }
}

impl core::error::Error for DirectError {}

/// How a [`DirectRing`] reaches the device: the doorbell record, the UAR / BlueFlame
/// register and the barriers between them. [`Mmio`] is the real one; the golden test
/// records the same calls to compare them with libmlx5's.
///
/// # Safety
/// An implementation performs the stores it is given (the device reads them) and its
/// barriers order memory at least as rdma-core's `util/udma_barrier.h` does on the target
/// (the instructions are listed at [`Mmio`]).
pub unsafe trait Doorbell {
    /// `udma_to_device_barrier()`: WQE stores before the doorbell record.
    fn to_device_barrier(&mut self);
    /// `mmio_wc_start()`: the doorbell record before the write-combining stores.
    fn wc_start(&mut self);
    /// `mmio_flush_writes()`: push the write-combining buffer out.
    fn flush_writes(&mut self);
    /// The 32-bit doorbell record store (`val` already big-endian).
    ///
    /// # Safety
    /// `dst` is the QP's doorbell record entry.
    unsafe fn write_dbr(&mut self, dst: *mut u32, val: u32);
    /// One 8-byte MMIO store of `val` (the bytes as they are in memory) to `dst`.
    ///
    /// # Safety
    /// `dst` is an 8-byte aligned address in the QP's doorbell / BlueFlame register.
    unsafe fn write64(&mut self, dst: *mut u64, val: u64);
    /// One 64-byte BlueFlame block: the eight words at `src`, in order, to `dst`. The
    /// default is eight [`write64`](Self::write64)s, rdma-core's generic
    /// `mmio_memcpy_x64`; an implementation may use wider stores that reach the device as
    /// the same 64-byte write ([`Mmio`] does on x86-64 and arm64).
    ///
    /// # Safety
    /// `dst` is a 64-byte aligned block of the QP's BlueFlame register; `src` is 64
    /// readable, 8-aligned bytes.
    #[inline(always)]
    unsafe fn bf_block(&mut self, dst: *mut u64, src: *const u64) {
        for i in 0..8 {
            // SAFETY: the caller's contract; i < 8 words of both blocks.
            unsafe { self.write64(dst.add(i), src.add(i).read()) };
        }
    }
}

/// The hardware [`Doorbell`]: volatile stores and the CPU's barriers, as rdma-core v55
/// issues them (`util/udma_barrier.h`, `util/mmio.h`, `providers/mlx5/qp.c`'s
/// `post_send_db` and `mlx5_bf_copy`).
///
/// | target | to device | wc start, flush | 8-byte store | 64-byte BlueFlame block |
/// |---|---|---|---|---|
/// | x86-64 | compiler barrier | `sfence` | `mov` | four 16-byte SSE stores (libmlx5: eight `mov`) |
/// | arm64 | `dmb oshst` | `dsb st` | `str` | one `ld4` + `st4` of four q registers |
/// | riscv64 | `fence ow,ow` | `fence ow,ow` | `sd` | eight `sd` |
///
/// Each is one `asm!` (never elided, split or merged by the compiler); the poller's
/// `udma_from_device_barrier()` is `lfence` / `dmb oshld` / `fence ir,ir`.
///
/// **Other targets have no hardware doorbell**: `Mmio` is an empty enum there (no value:
/// [`Mmio::available`] is `None` and `DirectRing::new` refuses with
/// [`DirectError::NoMmio`]), so nothing rings a ConnectX with the wrong barriers. rdma-core
/// needs more than plain stores elsewhere (s390x
/// stores to PCI memory with `pcistg` or a system call; a 32-bit CPU has no 64-bit store
/// and takes a lock) or other barriers (POWER `sync` / `lwsync`, LoongArch `dbar`); none
/// of these is written here. The rest of the mlx5 module still builds everywhere: a
/// [`DirectRing`] with another [`Doorbell`] (`RecordingDoorbell`, a simulation's) and a
/// [`DirectPoller`] on plain memory, whose barriers there are `fence(SeqCst)`.
///
/// Under miri the barriers are `fence(SeqCst)` and the BlueFlame block eight 8-byte
/// stores (miri runs no `asm!`).
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
#[derive(Clone, Copy, Debug, Default)]
pub struct Mmio;

impl Mmio {
    /// The hardware doorbell, where this target has one (x86-64, arm64, riscv64): code
    /// that rings a ConnectX on any target asks for it and refuses the direct path with
    /// [`DirectError::NoMmio`] where it is `None`.
    #[inline(always)]
    pub const fn available() -> Option<Mmio> {
        #[cfg(any(
            target_arch = "x86_64",
            target_arch = "aarch64",
            target_arch = "riscv64"
        ))]
        return Some(Mmio);
        #[cfg(not(any(
            target_arch = "x86_64",
            target_arch = "aarch64",
            target_arch = "riscv64"
        )))]
        return None;
    }
}

/// The hardware [`Doorbell`], which this target does not have: no value exists, and no
/// `DirectRing::new`. It exists on x86-64, arm64 and riscv64 only (the documentation
/// built for those targets lists the instructions it uses there).
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
#[derive(Clone, Copy, Debug)]
pub enum Mmio {}

#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
// SAFETY: every store is a volatile store of exactly the given width to the given address
// (the BlueFlame block: four volatile 16-byte stores on x86-64, one `st4` of all 64 bytes
// on arm64); the barriers are the instructions rdma-core uses on these targets (a compiler
// barrier is an `asm!` without `nomem`, which the compiler must assume reads and writes
// memory), `fence(SeqCst)` under miri.
unsafe impl Doorbell for Mmio {
    #[inline(always)]
    fn to_device_barrier(&mut self) {
        to_device_barrier();
    }
    #[inline(always)]
    fn wc_start(&mut self) {
        // `mmio_wc_start()` is `mmio_flush_writes()` on every target.
        flush_writes();
    }
    #[inline(always)]
    fn flush_writes(&mut self) {
        flush_writes();
    }
    #[inline(always)]
    unsafe fn write_dbr(&mut self, dst: *mut u32, val: u32) {
        // SAFETY: the caller's contract.
        unsafe { dst.write_volatile(val) }
    }
    #[inline(always)]
    unsafe fn write64(&mut self, dst: *mut u64, val: u64) {
        // SAFETY: the caller's contract (8-byte aligned; a 64-bit target, one store).
        unsafe { dst.write_volatile(val) }
    }
    /// x86-64: four 16-byte SSE stores instead of eight 8-byte ones (UCX copies its
    /// BlueFlame blocks the same way). The register is write-combining memory: the stores
    /// of one 64-byte block merge in the WC buffer and leave it, after the `sfence` of
    /// [`flush_writes`](Doorbell::flush_writes), as one 64-byte write either way; the
    /// device sees the same bytes. Half the instructions of the copy.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    #[inline(always)]
    unsafe fn bf_block(&mut self, dst: *mut u64, src: *const u64) {
        use core::arch::x86_64::__m128i;
        let (d, s) = (dst.cast::<__m128i>(), src.cast::<__m128i>());
        for i in 0..4 {
            // SAFETY: the caller's contract: `dst` is 64-byte aligned, so each 16-byte
            // store is aligned; `src` has 64 readable bytes (read unaligned: it is only
            // 8-aligned).
            unsafe { d.add(i).write_volatile(s.add(i).read_unaligned()) };
        }
    }
    /// arm64: the 64 bytes in one store instruction, as rdma-core's `mmio_memcpy_x64`
    /// (`vst4q_u64(dest, vld4q_u64(src))`, since v39): eight 8-byte stores are eight
    /// writes the CPU need not combine into the one 64-byte write BlueFlame wants.
    ///
    /// `ld4 {v0.2d-v3.2d}` de-interleaves the 64 bytes (word `i` goes to lane `i / 4` of
    /// `v(i % 4)`), `st4` interleaves them back: the pair copies the bytes unchanged, in
    /// one load and one store instruction. `st4` after an `ld1` would scramble them
    /// (words 0, 2, 4, 6, 1, 3, 5, 7); `ld1` + `st1` of four registers would store the
    /// same bytes too. The instructions are written out rather than taken from the
    /// `vld4q_u64` / `vst4q_u64` intrinsics: an intrinsic store is not volatile, and
    /// LLVM may rewrite `st4` into `zip` + `stp` pairs for CPUs where `st4` is slow
    /// (its SIMD-instruction optimisation pass), which is two stores again.
    #[cfg(all(target_arch = "aarch64", not(miri)))]
    #[inline(always)]
    unsafe fn bf_block(&mut self, dst: *mut u64, src: *const u64) {
        // SAFETY: the caller's contract: 64 readable bytes at `src` (8-aligned; `ld4` of
        // 8-byte elements needs no more on normal memory), 64 writable bytes at the
        // 64-byte aligned `dst`. The asm writes only v0-v3, declared clobbered, and no
        // stack or flags; without `nomem` the compiler keeps it in order with the
        // surrounding memory accesses.
        unsafe {
            core::arch::asm!(
                "ld4 {{v0.2d, v1.2d, v2.2d, v3.2d}}, [{src}]",
                "st4 {{v0.2d, v1.2d, v2.2d, v3.2d}}, [{dst}]",
                src = in(reg) src,
                dst = in(reg) dst,
                out("v0") _,
                out("v1") _,
                out("v2") _,
                out("v3") _,
                options(nostack, preserves_flags),
            )
        };
    }
}

#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
// SAFETY: `Mmio` has no value on this target, so none of these methods can be called.
unsafe impl Doorbell for Mmio {
    fn to_device_barrier(&mut self) {
        match *self {}
    }
    fn wc_start(&mut self) {
        match *self {}
    }
    fn flush_writes(&mut self) {
        match *self {}
    }
    unsafe fn write_dbr(&mut self, _: *mut u32, _: u32) {
        match *self {}
    }
    unsafe fn write64(&mut self, _: *mut u64, _: u64) {
        match *self {}
    }
}

/// A barrier function: the instruction rdma-core's `util/udma_barrier.h` uses on each
/// supported target (an empty `asm!` is a compiler barrier), `fence(SeqCst)` under miri and
/// on any other target.
macro_rules! barrier {
    ($(#[$doc:meta])* fn $name:ident: x86_64 $x:literal, aarch64 $a:literal, riscv64 $r:literal $(,)?) => {
        $(#[$doc])*
        #[inline(always)]
        fn $name() {
            #[cfg(all(target_arch = "x86_64", not(miri)))]
            // SAFETY: a barrier instruction (or none: a compiler barrier), no other effect.
            unsafe {
                core::arch::asm!($x, options(nostack, preserves_flags))
            };
            #[cfg(all(target_arch = "aarch64", not(miri)))]
            // SAFETY: a barrier instruction, no other effect.
            unsafe {
                core::arch::asm!($a, options(nostack, preserves_flags))
            };
            #[cfg(all(target_arch = "riscv64", not(miri)))]
            // SAFETY: a fence instruction, no other effect.
            unsafe {
                core::arch::asm!($r, options(nostack, preserves_flags))
            };
            #[cfg(any(
                miri,
                not(any(
                    target_arch = "x86_64",
                    target_arch = "aarch64",
                    target_arch = "riscv64"
                ))
            ))]
            core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
        }
    };
}

barrier! {
    /// `udma_to_device_barrier()`: memory stores before the doorbell record and MMIO stores
    /// that follow (x86-64: compiler barrier; arm64: `dmb oshst`; riscv64: `fence ow,ow`).
    fn to_device_barrier: x86_64 "", aarch64 "dmb oshst", riscv64 "fence ow, ow",
}

barrier! {
    /// `mmio_flush_writes()` (and `mmio_wc_start()`, the same): write-combining stores out,
    /// in order with the other stores (x86-64: `sfence`; arm64: `dsb st`; riscv64:
    /// `fence ow,ow`). Only [`Mmio`] uses it: no other target has one.
    #[cfg(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    ))]
    fn flush_writes: x86_64 "sfence", aarch64 "dsb st", riscv64 "fence ow, ow",
}

barrier! {
    /// `udma_from_device_barrier()`: the CQE's contents after its owner byte (x86-64:
    /// `lfence`; arm64: `dmb oshld`; riscv64: `fence ir,ir`).
    fn from_device_barrier: x86_64 "lfence", aarch64 "dmb oshld", riscv64 "fence ir, ir",
}

/// One store or barrier seen by a [`RecordingDoorbell`].
#[cfg(feature = "std")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmioEvent {
    /// `udma_to_device_barrier()`.
    ToDeviceBarrier,
    /// `mmio_wc_start()`.
    WcStart,
    /// `mmio_flush_writes()`.
    FlushWrites,
    /// The doorbell record store (host-order value).
    Dbr(u32),
    /// An 8-byte store at `offset` from the register base; `raw` is the value as the bytes
    /// are in memory (`u64::from_ne_bytes`).
    Store64 {
        /// Offset from the register base.
        offset: usize,
        /// The stored bytes.
        raw: u64,
    },
}

/// A [`Doorbell`] that stores as [`Mmio`] does (plain memory stands in for the register)
/// and records every store and barrier in order: the golden test compares the record with
/// libmlx5's, and tests assert on it. Feature `std`.
#[cfg(feature = "std")]
#[derive(Debug)]
pub struct RecordingDoorbell {
    /// The register base the offsets are taken from.
    pub base: *mut u8,
    /// What was done, in order.
    pub events: std::vec::Vec<MmioEvent>,
}

#[cfg(feature = "std")]
impl RecordingDoorbell {
    /// A recorder for the register at `base`.
    pub fn new(base: *mut u8) -> Self {
        RecordingDoorbell {
            base,
            events: std::vec::Vec::new(),
        }
    }

    /// The recorded 8-byte stores as `(offset, raw)`.
    pub fn stores(&self) -> std::vec::Vec<(usize, u64)> {
        self.events
            .iter()
            .filter_map(|e| match *e {
                MmioEvent::Store64 { offset, raw } => Some((offset, raw)),
                _ => None,
            })
            .collect()
    }

    /// Replays the recorded 8-byte stores, in order, into `reg`, a buffer standing for
    /// the register at [`base`](Self::base): what the register holds after them
    /// (`tests/mmio_doorbell.rs` compares it with what [`Mmio`] stored).
    ///
    /// # Panics
    /// If a store falls outside `reg`.
    pub fn replay(&self, reg: &mut [u8]) {
        for e in &self.events {
            if let MmioEvent::Store64 { offset, raw } = *e {
                reg[offset..offset + 8].copy_from_slice(&raw.to_ne_bytes());
            }
        }
    }
}

// SAFETY: the stores are performed exactly as Mmio performs them (volatile, same width);
// plain memory needs no barrier beyond program order, which a single thread has.
#[cfg(feature = "std")]
unsafe impl Doorbell for RecordingDoorbell {
    fn to_device_barrier(&mut self) {
        self.events.push(MmioEvent::ToDeviceBarrier);
    }
    fn wc_start(&mut self) {
        self.events.push(MmioEvent::WcStart);
    }
    fn flush_writes(&mut self) {
        self.events.push(MmioEvent::FlushWrites);
    }
    unsafe fn write_dbr(&mut self, dst: *mut u32, val: u32) {
        self.events.push(MmioEvent::Dbr(u32::from_be(val)));
        // SAFETY: the caller's contract.
        unsafe { dst.write_volatile(val) }
    }
    unsafe fn write64(&mut self, dst: *mut u64, val: u64) {
        self.events.push(MmioEvent::Store64 {
            offset: dst as usize - self.base as usize,
            raw: val,
        });
        // SAFETY: the caller's contract.
        unsafe { dst.write_volatile(val) }
    }
}
