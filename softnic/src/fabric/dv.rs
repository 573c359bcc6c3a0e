//! softnic's mlx5 personality ([`Config::mlx5`](crate::Config::mlx5)): a device whose QPs,
//! CQs and AHs `mlx5dv_init_obj(3)` describes, so hotverbs' mlx5 direct path (the setup
//! layer's `Cq::direct_poller`, `Qp::direct_ring`, `DirectRing::reset_qp`, the deferred
//! clean of destroyed QPs, `Cq::req_notify` on a direct CQ) runs end to end with no
//! ConnectX.
//!
//! What it simulates, and how:
//! - **Objects**: [`init_obj`] gives a QP a send queue of 64-byte basic blocks, a doorbell
//!   record and a BlueFlame page (buffers of 256 bytes at `+0x800`, as libmlx5 lays them
//!   out), a CQ a buffer of 64-byte CQEs (or 128-byte ones, the fields in the second half,
//!   with [`Config::mlx5_cqe_size`](crate::Config::mlx5_cqe_size) 128, as libmlx5 makes
//!   them with `MLX5_CQE_SIZE=128`; all `INVALID`, owned by hardware), a doorbell
//!   record and a UAR page, and an AH a 48-byte address vector. From then on the QP's send
//!   queue is the one in memory, and every completion of the CQ is written there as an
//!   mlx5 CQE instead of into softnic's own queue (`ibv_poll_cq` finds nothing more: the CQ
//!   is the direct path's, as libmlx5 leaves a `DV_OWNED` CQ).
//! - **The device** ([`Fabric::dv_step`]): for every such QP, the WQEs its doorbell record
//!   announced since the last step are parsed (ctrl, remote address, atomic, datagram,
//!   inline or data segments, wrapping at the end of the queue) and executed by softnic's
//!   own engine as the equivalent `ibv_send_wr` (`wr_id` = the mlx5 opcode and WQE
//!   counter): data really moves, to the peer's receive queue or memory, with softnic's
//!   checks and errors. A QP in ERR flushes each WQE, as the hardware does; before RTS
//!   the WQEs wait. The step runs at every poll of the direct poller (the setup layer's
//!   `DirectPoller::poll`), at every `ibv_poll_cq` of the fabric, every millisecond while
//!   a thread waits on a softnic completion channel ([`crate::wait_fd_stepping`]: a
//!   blocking `ibv_get_cq_event`, `CompChannel::wait_cq_event`), and from
//!   [`crate::mlx5_step`]: no thread of its own.
//! - **CQEs**: requester CQEs (opcode, WQE counter, QP number, byte count; error CQEs with
//!   the syndrome of the status), responder CQEs for receives, the owner bit of each pass;
//!   a CQE with no room (the consumer index in the doorbell record) overflows the CQ
//!   (`IBV_EVENT_CQ_ERR`).
//! - **Arming**: `mlx5_arm_cq`'s UAR doorbell (`cq_uar + 0x20`) is read back at each step
//!   and CQE; the completion event goes to the CQ's channel once a CQE exists at or after
//!   the armed consumer index (solicited-only: a solicited or error CQE).
//! - **RESET** clears the doorbell record's send counter and restarts the device's (as
//!   libmlx5 and the hardware do); destroying the QP frees its queue. Softnic's own clean of
//!   a destroyed QP's completions does not reach the mlx5 CQ, as libmlx5 skips a `DV_OWNED`
//!   CQ: that is the setup layer's job, which is what this lets us test.
//!
//! **Memory ordering.** The device reads the send queue and doorbell record the ring writes
//! with plain stores from its own thread, as a NIC's DMA does: the doorbell record is read
//! first (volatile), then the WQEs it announces, which the ring wrote before it (x86-64
//! keeps stores in order and loads in order). The simulator relies on that, as the
//! hardware does; it is not a data-race-free program in the Rust model's sense, and it is
//! not run under Miri.
//!
//! - **Doorbell registers** ([`reg`]): QPs of one context share one register page, a
//!   thread domain's QPs the thread domain's own, as libmlx5 assigns them; what was
//!   written there (doorbell or BlueFlame copy, which buffer, which QP and WQE, and the
//!   simulated libmlx5's own posts) is logged for tests
//!   ([`crate::mlx5sim::register_writes`]).
//!
//! - **Receive queues and SRQs in memory** (issue 30): `init_obj` gives a QP without an SRQ a
//!   receive queue (`max_recv_wr` WQEs of `max_recv_sge` segments, rounded up to powers of
//!   two, as libmlx5) and an SRQ its WQEs, linked in order. The device takes the WQEs the
//!   receive counter (dword 0 of the QP's doorbell record) or the SRQ's post counter
//!   announced, an SRQ's by walking its list from its head, when a message arrives and at
//!   every step (waking sends that waited for a receive); a receive's CQE carries the WQE's
//!   counter or index, the SRQ's number, the sender's QP and the GRH flag; an RC or UC
//!   message of up to 32 bytes (64 with 128-byte CQEs) goes into the CQE instead of the
//!   buffer (responder scatter-to-CQE, `docs/mlx5-receive.md` §1). Receives posted with
//!   `ibv_post_recv` go to softnic's own queue, as before.
//!
//! Not modelled: BlueFlame execution (the device reads WQEs from the send queue the doorbell
//! record announces; the register is only observed), an SRQ's wait queue, CQE compression.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use hotverbs_ffi::mlx5dv::{
    mlx5dv_ah, mlx5dv_cq, mlx5dv_obj, mlx5dv_qp, mlx5dv_srq, MLX5DV_OBJ_AH, MLX5DV_OBJ_CQ,
    MLX5DV_OBJ_QP, MLX5DV_OBJ_SRQ, MLX5DV_SRQ_MASK_SRQN,
};
use hotverbs_ffi::*;

use super::{ring_fd, Fabric, Qp, SqTag};

pub(crate) mod reg;
use crate::mlx5sim::Region;

/// QPs with a simulated mlx5 send queue, process-wide: the poll hooks do nothing (one
/// relaxed load) while it is 0.
pub(crate) static DV_QPS: AtomicUsize = AtomicUsize::new(0);

const BB: usize = 64;
const CQE: usize = 64;
/// `bf.reg`: the first BlueFlame buffer of the page, as libmlx5's UAR layout.
const BF_OFFSET: usize = 0x800;
const BF_SIZE: u32 = 256;
/// The CQ doorbell in the UAR page (`MLX5_CQ_DOORBELL`).
const CQ_DOORBELL: usize = 0x20;
/// The lkey that ends a receive WQE shorter than its stride (`MLX5_INVALID_LKEY`).
const RQ_INVALID_LKEY: u32 = 0x100;
/// `op_own`'s scatter-to-CQE formats (`MLX5_INLINE_SCATTER_32` / `_64`).
const INLINE_SCATTER_32: u8 = 0x4;
const INLINE_SCATTER_64: u8 = 0x8;
/// Marks the AH index softnic keeps in an address vector's reserved bytes.
const AV_TAG: u32 = 0x5f00_0000;

/// The opcodes and CQE kinds of `mlx5dv.h` (the generated bindings), as bytes.
mod op {
    use hotverbs_ffi::mlx5dv as h;
    pub const RDMA_WRITE: u8 = h::MLX5_OPCODE_RDMA_WRITE as u8;
    pub const RDMA_WRITE_IMM: u8 = h::MLX5_OPCODE_RDMA_WRITE_IMM as u8;
    pub const SEND: u8 = h::MLX5_OPCODE_SEND as u8;
    pub const SEND_IMM: u8 = h::MLX5_OPCODE_SEND_IMM as u8;
    pub const RDMA_READ: u8 = h::MLX5_OPCODE_RDMA_READ as u8;
    pub const ATOMIC_CS: u8 = h::MLX5_OPCODE_ATOMIC_CS as u8;
    pub const ATOMIC_FA: u8 = h::MLX5_OPCODE_ATOMIC_FA as u8;
}

mod cqe_op {
    use hotverbs_ffi::mlx5dv as h;
    pub const REQ: u8 = h::MLX5_CQE_REQ as u8;
    pub const RESP_WR_IMM: u8 = h::MLX5_CQE_RESP_WR_IMM as u8;
    pub const RESP_SEND: u8 = h::MLX5_CQE_RESP_SEND as u8;
    pub const RESP_SEND_IMM: u8 = h::MLX5_CQE_RESP_SEND_IMM as u8;
    pub const REQ_ERR: u8 = h::MLX5_CQE_REQ_ERR as u8;
    pub const RESP_ERR: u8 = h::MLX5_CQE_RESP_ERR as u8;
    pub const INVALID: u8 = h::MLX5_CQE_INVALID as u8;
}

/// The simulated send queue of a QP.
pub(crate) struct DvQp {
    sq: Region,
    db: Region,
    /// The doorbell register the QP rings (shared, or its thread domain's).
    reg: std::sync::Arc<reg::DvReg>,
    wqe_cnt: u32,
    /// `cur_post` up to which the device has read WQEs.
    dev_cur: u32,
    /// The receive queue in memory (none for a QP of an SRQ, as libmlx5 gives it none).
    rq: Option<DvRq>,
}

/// The simulated receive queue of a QP: WQEs of `stride` bytes (data segments, ended by
/// one with the `MLX5_INVALID_LKEY` lkey when shorter), announced by the receive counter
/// (dword 0 of the doorbell record), as `mlx5_post_recv` writes them.
pub(crate) struct DvRq {
    buf: Region,
    wqe_cnt: u32,
    stride: u32,
    /// Receive WQEs the device has taken into its queue (free-running).
    dev_head: u32,
}

impl Drop for DvQp {
    fn drop(&mut self) {
        DV_QPS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The simulated SRQ: WQEs of `stride` bytes (a next segment, then data segments), a linked
/// list the device walks from `dev_head` along each WQE's `next_wqe_index` as the post
/// counter (the doorbell record) announces them, as a ConnectX does; `mlx5dv_init_obj`
/// hands it out with every WQE linked to the next (libmlx5's `set_srq_buf_ll`).
pub(crate) struct DvSrq {
    buf: Region,
    db: Region,
    stride: u32,
    nwqes: u32,
    /// The SRQ number its CQEs carry (never 0).
    pub(crate) srqn: u32,
    /// The next WQE the device takes.
    dev_head: u32,
    /// Posts the device has taken (16 bits, as the counter).
    dev_count: u16,
}

impl Drop for DvSrq {
    fn drop(&mut self) {
        DV_QPS.fetch_sub(1, Ordering::Relaxed);
    }
}

impl DvSrq {
    fn counter(&self) -> u16 {
        // SAFETY: the doorbell region's first u32.
        u32::from_be(unsafe { self.db.ptr.cast::<u32>().read_volatile() }) as u16
    }

    fn byte(&self, off: usize) -> u8 {
        // SAFETY: callers read inside the queue (an index < nwqes times the stride plus an
        // offset below the stride).
        unsafe { self.buf.ptr.add(off).read_volatile() }
    }

    /// WQE `idx`'s scatter entries, and the index it links to.
    fn wqe(&self, idx: u32, out: &mut Vec<ibv_sge>) -> u32 {
        let base = (idx * self.stride) as usize;
        let next = u32::from(u16::from_be_bytes([
            self.byte(base + 2),
            self.byte(base + 3),
        ]));
        read_segs(
            |o| self.byte(o),
            base + 16,
            (self.stride / 16 - 1) as usize,
            out,
        );
        next
    }
}

impl DvQp {
    fn dbr(&self) -> u32 {
        // SAFETY: the doorbell region holds two u32 (receive, send).
        u32::from_be(unsafe { self.db.ptr.cast::<u32>().add(1).read_volatile() })
    }

    /// The receive counter (dword 0 of the doorbell record).
    fn rcv_dbr(&self) -> u32 {
        // SAFETY: the doorbell region holds two u32 (receive, send).
        u32::from_be(unsafe { self.db.ptr.cast::<u32>().read_volatile() })
    }

    /// The device's side of a move to RESET (libmlx5 zeroes both counters of the record).
    pub(crate) fn reset(&mut self) {
        self.dev_cur = 0;
        if let Some(rq) = self.rq.as_mut() {
            rq.dev_head = 0;
        }
        // SAFETY: as in `dbr`.
        unsafe {
            self.db.ptr.cast::<u32>().add(1).write_volatile(0);
            self.db.ptr.cast::<u32>().write_volatile(0);
        }
    }

    /// The scatter entries of receive WQE `ctr` (its data segments up to the terminator).
    fn rq_wqe(&self, ctr: u32, out: &mut Vec<ibv_sge>) {
        let Some(rq) = self.rq.as_ref() else {
            return;
        };
        let base = ((ctr & (rq.wqe_cnt - 1)) * rq.stride) as usize;
        // SAFETY: inside WQE `ctr`'s stride bytes of the queue (read_segs reads below
        // base + stride).
        let byte = |o: usize| unsafe { rq.buf.ptr.add(o).read_volatile() };
        read_segs(byte, base, (rq.stride / 16) as usize, out);
    }

    /// `n` bytes of the SQ from byte `off` (modulo its size), wrapping at its end.
    fn read(&self, off: usize, out: &mut [u8]) {
        let size = self.wqe_cnt as usize * BB;
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: the index is reduced modulo the SQ's size.
            *b = unsafe { self.sq.ptr.add((off + i) % size).read_volatile() };
        }
    }
}

/// The scatter entries of a receive WQE's `n` data segments from byte `first` (`byte`
/// reads the queue), up to the one with the `MLX5_INVALID_LKEY` lkey that ends a shorter
/// list.
fn read_segs(byte: impl Fn(usize) -> u8, first: usize, n: usize, out: &mut Vec<ibv_sge>) {
    out.clear();
    for k in 0..n {
        let seg: [u8; 16] = std::array::from_fn(|i| byte(first + k * 16 + i));
        let lkey = u32::from_be_bytes(seg[4..8].try_into().expect("4 bytes"));
        if lkey == RQ_INVALID_LKEY {
            break;
        }
        out.push(ibv_sge {
            length: u32::from_be_bytes(seg[0..4].try_into().expect("4 bytes")),
            lkey,
            addr: u64::from_be_bytes(seg[8..16].try_into().expect("8 bytes")),
        });
    }
}

/// The simulated CQ buffer of a CQ.
pub(crate) struct DvCq {
    buf: Region,
    db: Region,
    uar: Region,
    cqe_cnt: u32,
    /// Bytes per CQE: 64 or 128 (the 64-byte CQE in the second half).
    cqe_size: usize,
    cqn: u32,
    /// CQEs written (free-running).
    pi: u32,
    /// Armed: the consumer index of the arm and whether solicited-only.
    arm: Option<(u32, bool)>,
}

impl DvCq {
    /// The consumer index the poller published (24 bits).
    fn ci(&self) -> u32 {
        // SAFETY: the doorbell region's first u32.
        u32::from_be(unsafe { self.db.ptr.cast::<u32>().read_volatile() }) & 0xff_ffff
    }

    /// Takes an arm request from the UAR doorbell, if one was rung since the last look.
    fn take_arm(&mut self) {
        // SAFETY: the UAR page is 4 KiB, 8-aligned at CQ_DOORBELL; AtomicU64 has u64's
        // layout. The direct path rings it with a plain 8-byte store from the thread that
        // arms; softnic reads it under the fabric lock (see the module docs: arming and
        // polling happen in the poller's thread in the tests that use events).
        let v = unsafe { &*self.uar.ptr.add(CQ_DOORBELL).cast::<AtomicU64>() }
            .swap(0, Ordering::AcqRel);
        if v != 0 {
            let word = (u64::from_be(v) >> 32) as u32;
            self.arm = Some((word & 0xff_ffff, word & (1 << 24) != 0));
        }
    }

    /// Whether an armed CQ fires now: a CQE exists at or after the armed index (the last
    /// one written `urgent`: solicited or an error, for a solicited-only arm).
    fn fires(&mut self, urgent: bool) -> bool {
        self.take_arm();
        let Some((ci, sol)) = self.arm else {
            return false;
        };
        let ahead = self.pi.wrapping_sub(ci) & 0xff_ffff;
        if ahead == 0 || ahead > self.cqe_cnt || (sol && !urgent) {
            return false;
        }
        self.arm = None;
        true
    }

    /// Writes the CQE of `wc`, a requester CQE if `send` (else a responder one, whatever
    /// `wc.opcode` says: the Rxe profile gives error completions opcode 0); false when the
    /// CQ has no room (an overflow).
    fn write(
        &mut self,
        wc: &ibv_wc,
        send: bool,
        scatter: Option<(usize, [u8; 64])>,
        srqn: u32,
    ) -> bool {
        if self.pi.wrapping_sub(self.ci()) & 0xff_ffff >= self.cqe_cnt {
            return false;
        }
        let ok = wc.status == IBV_WC_SUCCESS;
        let mut c = [0u8; CQE];
        let (opcode, wqe_op, ctr) = if send {
            let op = if ok { cqe_op::REQ } else { cqe_op::REQ_ERR };
            (op, (wc.wr_id >> 16) as u8, wc.wr_id as u16)
        } else {
            let op = if !ok {
                cqe_op::RESP_ERR
            } else if wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM {
                cqe_op::RESP_WR_IMM
            } else if wc.wc_flags & IBV_WC_WITH_IMM != 0 {
                cqe_op::RESP_SEND_IMM
            } else {
                cqe_op::RESP_SEND
            };
            // The receive WQE's counter (a receive of the queue in memory carries it as
            // its `wr_id`; one posted with `ibv_post_recv` has none the poller reads).
            (op, 0, wc.wr_id as u16)
        };
        if wc.wc_flags & IBV_WC_WITH_IMM != 0 {
            // SAFETY: plain union of u32s.
            let imm = unsafe { wc.__bindgen_anon_1.imm_data };
            c[36..40].copy_from_slice(&imm.to_ne_bytes());
        }
        c[44..48].copy_from_slice(&wc.byte_len.to_be_bytes());
        // srqn_uidx: the SRQ a receive of an SRQ in memory came from.
        c[32..36].copy_from_slice(&(srqn & 0xff_ffff).to_be_bytes());
        if !send && ok {
            // flags_rqpn: GRH present (bits 28..29), the sender's QP.
            let g = u32::from(wc.wc_flags & IBV_WC_GRH != 0) << 28;
            c[24..28].copy_from_slice(&(g | (wc.src_qp & 0xff_ffff)).to_be_bytes());
        }
        let mut format = 0u8;
        let mut first_half = None;
        if let (false, true, Some((limit, data))) = (send, ok, scatter) {
            if self.cqe_size == 128 {
                format = INLINE_SCATTER_64;
                first_half = Some(data);
            } else {
                format = INLINE_SCATTER_32;
                c[..limit.min(32)].copy_from_slice(&data[..limit.min(32)]);
            }
        }
        if !ok {
            c[54] = wc.vendor_err as u8;
            c[55] = syndrome(wc.status);
        }
        c[56..60].copy_from_slice(&((wqe_op as u32) << 24 | (wc.qp_num & 0xff_ffff)).to_be_bytes());
        c[60..62].copy_from_slice(&ctr.to_be_bytes());
        c[63] = opcode << 4 | format | (self.pi & self.cqe_cnt != 0) as u8;
        let i = (self.pi & (self.cqe_cnt - 1)) as usize;
        if let Some(d) = first_half {
            // SAFETY: a 128-byte CQE: its first half, inside the buffer.
            unsafe {
                std::ptr::copy_nonoverlapping(d.as_ptr(), self.buf.ptr.add(i * self.cqe_size), 64)
            };
        }
        // SAFETY: CQE `i` is inside the buffer, its fields in its last 64 bytes; the owner
        // byte is written last, after a release fence, as the device's DMA orders it.
        unsafe {
            let p = self.buf.ptr.add(i * self.cqe_size + self.cqe_size - CQE);
            std::ptr::copy_nonoverlapping(c.as_ptr(), p, CQE - 1);
            std::sync::atomic::fence(Ordering::Release);
            p.add(CQE - 1).write_volatile(c[CQE - 1]);
        }
        self.pi = self.pi.wrapping_add(1);
        true
    }
}

/// The mlx5 syndrome of an error status (the inverse of libmlx5's `mlx5_handle_error_cqe`).
fn syndrome(s: ibv_wc_status) -> u8 {
    use hotverbs_ffi::mlx5dv as h;
    (match s {
        IBV_WC_LOC_LEN_ERR => h::MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR,
        IBV_WC_LOC_QP_OP_ERR => h::MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR,
        IBV_WC_LOC_PROT_ERR => h::MLX5_CQE_SYNDROME_LOCAL_PROT_ERR,
        IBV_WC_WR_FLUSH_ERR => h::MLX5_CQE_SYNDROME_WR_FLUSH_ERR,
        IBV_WC_MW_BIND_ERR => h::MLX5_CQE_SYNDROME_MW_BIND_ERR,
        IBV_WC_BAD_RESP_ERR => h::MLX5_CQE_SYNDROME_BAD_RESP_ERR,
        IBV_WC_LOC_ACCESS_ERR => h::MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR,
        IBV_WC_REM_INV_REQ_ERR => h::MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR,
        IBV_WC_REM_ACCESS_ERR => h::MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR,
        IBV_WC_REM_OP_ERR => h::MLX5_CQE_SYNDROME_REMOTE_OP_ERR,
        IBV_WC_RETRY_EXC_ERR => h::MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR,
        IBV_WC_RNR_RETRY_EXC_ERR => h::MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR,
        IBV_WC_REM_ABORT_ERR => h::MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR,
        // No syndrome of its own: libmlx5 reads an unknown one as IBV_WC_GENERAL_ERR.
        _ => 0xff,
    }) as u8
}

/// One WQE as the device reads it.
struct Wqe {
    op: u8,
    ctr: u16,
    bbs: u32,
    flags: u32,
    imm: u32,
    raddr: u64,
    rkey: u32,
    swap_add: u64,
    compare: u64,
    /// UD: (AH index, remote QPN, qkey).
    ud: Option<(usize, u32, u32)>,
    inline: Option<Vec<u8>>,
    sges: Vec<ibv_sge>,
}

impl Wqe {
    /// Parses the WQE at basic block `cur` of `q` (`ud`: a datagram segment follows ctrl).
    fn parse(q: &DvQp, cur: u32, ud: bool) -> Result<Wqe, &'static str> {
        let base = (cur & (q.wqe_cnt - 1)) as usize * BB;
        let mut ctrl = [0u8; 16];
        q.read(base, &mut ctrl);
        let be32 = |b: &[u8]| u32::from_be_bytes(b[..4].try_into().unwrap());
        let be64 = |b: &[u8]| u64::from_be_bytes(b[..8].try_into().unwrap());
        let oio = be32(&ctrl[0..]);
        let ds = (be32(&ctrl[4..]) & 0x3f) as usize;
        let fm = ctrl[11];
        let mut w = Wqe {
            op: oio as u8,
            ctr: (oio >> 8) as u16,
            bbs: (ds.div_ceil(4) as u32).max(1),
            flags: 0,
            imm: u32::from_ne_bytes(ctrl[12..16].try_into().unwrap()),
            raddr: 0,
            rkey: 0,
            swap_add: 0,
            compare: 0,
            ud: None,
            inline: None,
            sges: Vec::new(),
        };
        if w.ctr != cur as u16 {
            return Err("WQE counter out of order");
        }
        if ds == 0 {
            return Err("ds 0");
        }
        if fm & 0x08 != 0 {
            w.flags |= IBV_SEND_SIGNALED;
        }
        if fm & 0x02 != 0 {
            w.flags |= IBV_SEND_SOLICITED;
        }
        if fm & 0x80 != 0 {
            w.flags |= IBV_SEND_FENCE;
        }
        let mut off = 16usize;
        let mut seg = [0u8; 16];
        if ud {
            let mut av = [0u8; 48];
            q.read(base + off, &mut av);
            let tag = be32(&av[16..]);
            if tag & 0xff00_0000 != AV_TAG {
                return Err("an address vector softnic did not make");
            }
            w.ud = Some((
                (tag & 0xff_ffff) as usize,
                be32(&av[8..]) & 0xff_ffff,
                be32(&av[0..]),
            ));
            off += 48;
        }
        match w.op {
            op::SEND | op::SEND_IMM => {}
            op::RDMA_WRITE | op::RDMA_WRITE_IMM | op::RDMA_READ | op::ATOMIC_CS | op::ATOMIC_FA => {
                q.read(base + off, &mut seg);
                w.raddr = be64(&seg[0..]);
                w.rkey = be32(&seg[8..]);
                off += 16;
                if matches!(w.op, op::ATOMIC_CS | op::ATOMIC_FA) {
                    q.read(base + off, &mut seg);
                    w.swap_add = be64(&seg[0..]);
                    w.compare = be64(&seg[8..]);
                    off += 16;
                }
            }
            _ => return Err("an opcode the direct ring does not write"),
        }
        let end = ds * 16;
        if off < end {
            q.read(base + off, &mut seg[..4]);
            let bc = be32(&seg[0..]);
            if bc & 0x8000_0000 != 0 {
                let len = (bc & 0x3ff_ffff) as usize;
                if off + 4 + len > end {
                    return Err("inline data beyond ds");
                }
                let mut d = vec![0u8; len];
                q.read(base + off + 4, &mut d);
                w.inline = Some(d);
                w.flags |= IBV_SEND_INLINE;
            } else {
                while off < end {
                    q.read(base + off, &mut seg);
                    w.sges.push(ibv_sge {
                        length: be32(&seg[0..]),
                        lkey: be32(&seg[4..]),
                        addr: be64(&seg[8..]),
                    });
                    off += 16;
                }
            }
        }
        Ok(w)
    }

    fn wr_opcode(&self) -> ibv_wr_opcode {
        match self.op {
            op::RDMA_WRITE => IBV_WR_RDMA_WRITE,
            op::RDMA_WRITE_IMM => IBV_WR_RDMA_WRITE_WITH_IMM,
            op::SEND_IMM => IBV_WR_SEND_WITH_IMM,
            op::RDMA_READ => IBV_WR_RDMA_READ,
            op::ATOMIC_CS => IBV_WR_ATOMIC_CMP_AND_SWP,
            op::ATOMIC_FA => IBV_WR_ATOMIC_FETCH_AND_ADD,
            _ => IBV_WR_SEND,
        }
    }

    fn wc_opcode(&self) -> ibv_wc_opcode {
        match self.op {
            op::RDMA_WRITE | op::RDMA_WRITE_IMM => IBV_WC_RDMA_WRITE,
            op::RDMA_READ => IBV_WC_RDMA_READ,
            op::ATOMIC_CS => IBV_WC_COMP_SWAP,
            op::ATOMIC_FA => IBV_WC_FETCH_ADD,
            _ => IBV_WC_SEND,
        }
    }

    fn wr_id(&self) -> u64 {
        (self.op as u64) << 16 | self.ctr as u64
    }
}

/// The CQE size of a device's mlx5 CQs ([`Config::mlx5_cqe_size`](crate::Config::mlx5_cqe_size)):
/// 64 or 128, anything else `EINVAL` (as libmlx5 refuses an `MLX5_CQE_SIZE` it does not
/// know).
fn dv_cqe_size(cfg: &crate::Config) -> Result<usize, i32> {
    match cfg.mlx5_cqe_size {
        64 => Ok(64),
        128 => Ok(128),
        _ => Err(libc::EINVAL),
    }
}

/// `x` rounded up to a power of two (at least 1).
fn pow2(x: u64) -> u32 {
    x.max(1).next_power_of_two().min(1 << 30) as u32
}

impl Fabric {
    /// Whether context `ci`'s device has the mlx5 personality.
    pub(crate) fn dv_ctx(&self, ci: u32) -> bool {
        self.cfg(ci).mlx5
    }

    /// `mlx5dv_init_obj` for the kinds in `kind`; an errno on failure.
    ///
    /// # Safety
    /// `obj`'s `in` fields of those kinds are live softnic objects and its `out` pointers
    /// writable.
    pub(crate) unsafe fn dv_init_obj(&mut self, obj: &mut mlx5dv_obj, kind: u64) -> i32 {
        if kind & !u64::from(MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ | MLX5DV_OBJ_AH | MLX5DV_OBJ_SRQ) != 0 {
            return libc::EOPNOTSUPP;
        }
        if kind & u64::from(MLX5DV_OBJ_SRQ) != 0 {
            // SAFETY: the caller's contract.
            let (srq, out) = unsafe { (&*obj.srq.in_, &mut *obj.srq.out) };
            if let Err(e) = self.dv_srq(srq.handle as usize, out) {
                return e;
            }
        }
        if kind & u64::from(MLX5DV_OBJ_QP) != 0 {
            // SAFETY: the caller's contract.
            let (qp, out) = unsafe { (&*obj.qp.in_, &mut *obj.qp.out) };
            if let Err(e) = self.dv_qp(qp.handle as usize, out) {
                return e;
            }
        }
        if kind & u64::from(MLX5DV_OBJ_CQ) != 0 {
            // SAFETY: the caller's contract.
            let (cq, out) = unsafe { (&*obj.cq.in_, &mut *obj.cq.out) };
            if let Err(e) = self.dv_cq(cq.handle, out) {
                return e;
            }
        }
        if kind & u64::from(MLX5DV_OBJ_AH) != 0 {
            // SAFETY: the caller's contract.
            let (ah, out) = unsafe { (&*obj.ah.in_, &mut *obj.ah.out) };
            if let Err(e) = self.dv_ah(ah.handle as usize, out) {
                return e;
            }
        }
        0
    }

    fn dv_qp(&mut self, qi: usize, out: &mut mlx5dv_qp) -> Result<(), i32> {
        let Some(Some(_)) = self.qps.get(qi) else {
            return Err(libc::EINVAL);
        };
        let register = self.dv_reg(qi);
        let q = self.qp(qi);
        if !matches!(q.qpt, IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_UD) {
            return Err(libc::EOPNOTSUPP);
        }
        if q.dv.is_none() {
            // The largest WQE: ctrl, the address segments (RC: remote address + atomic; UD:
            // the datagram), then the larger of the inline segment and the data segments;
            // libmlx5 sizes its queue the same way.
            let addr = if q.qpt == IBV_QPT_UD { 48 } else { 32 };
            let inline = (q.cap.max_inline_data as u64 + 4).div_ceil(16) * 16;
            let data = (q.cap.max_send_sge.max(1) as u64 * 16).max(inline);
            let bbs = (16 + addr + data).div_ceil(BB as u64);
            let wqe_cnt = pow2(q.cap.max_send_wr as u64 * bbs);
            if wqe_cnt > 0x8000 {
                return Err(libc::ENOMEM);
            }
            // The receive queue: max_recv_wr WQEs of max_recv_sge data segments, both
            // rounded up to powers of two (as libmlx5's `mlx5_calc_rq_size`); none for a QP
            // of an SRQ.
            let rq = (q.srq.is_none() && q.cap.max_recv_wr > 0).then(|| {
                let rq_cnt = pow2(q.cap.max_recv_wr as u64);
                let stride = pow2(q.cap.max_recv_sge.max(1) as u64 * 16);
                DvRq {
                    buf: Region::new(rq_cnt as usize * stride as usize, 0),
                    wqe_cnt: rq_cnt,
                    stride,
                    dev_head: 0,
                }
            });
            q.dv = Some(Box::new(DvQp {
                sq: Region::new(wqe_cnt as usize * BB, 0),
                db: Region::new(64, 0),
                reg: register,
                wqe_cnt,
                dev_cur: 0,
                rq,
            }));
            DV_QPS.fetch_add(1, Ordering::Relaxed);
        }
        let dv = q.dv.as_ref().expect("just made");
        out.dbrec = dv.db.ptr.cast();
        out.sq.buf = dv.sq.ptr.cast();
        out.sq.wqe_cnt = dv.wqe_cnt;
        out.sq.stride = BB as u32;
        match dv.rq.as_ref() {
            Some(rq) => {
                out.rq.buf = rq.buf.ptr.cast();
                out.rq.wqe_cnt = rq.wqe_cnt;
                out.rq.stride = rq.stride;
            }
            None => {
                out.rq.buf = std::ptr::null_mut();
                out.rq.wqe_cnt = 0;
                out.rq.stride = 0;
            }
        }
        out.bf.reg = dv.reg.reg().cast();
        out.bf.size = dv.reg.bf_size;
        out.comp_mask = 0;
        Ok(())
    }

    fn dv_srq(&mut self, si: usize, out: &mut mlx5dv_srq) -> Result<(), i32> {
        let Some(Some(srq)) = self.srqs.get_mut(si) else {
            return Err(libc::EINVAL);
        };
        if srq.dv.is_none() {
            // libmlx5's geometry (`mlx5_alloc_srq_buf`, without the wait queue): a next
            // segment and max_sge data segments, at least 32 bytes, rounded up to a power
            // of two; max_wr + 1 WQEs rounded up, every one linked to the next.
            let stride = pow2((16 + 16 * u64::from(srq.rq.max_sge)).max(32));
            let nwqes = pow2(u64::from(srq.rq.cap) + 1);
            if nwqes > 1 << 16 {
                return Err(libc::ENOMEM);
            }
            let buf = Region::new(nwqes as usize * stride as usize, 0);
            for i in 0..nwqes - 1 {
                let b = ((i + 1) as u16).to_be_bytes();
                // SAFETY: bytes 2..4 of WQE i, inside the buffer.
                unsafe {
                    buf.ptr.add((i * stride) as usize + 2).write(b[0]);
                    buf.ptr.add((i * stride) as usize + 3).write(b[1]);
                }
            }
            srq.dv = Some(Box::new(DvSrq {
                buf,
                db: Region::new(64, 0),
                stride,
                nwqes,
                srqn: si as u32 + 1,
                dev_head: 0,
                dev_count: 0,
            }));
            DV_QPS.fetch_add(1, Ordering::Relaxed);
        }
        let dv = srq.dv.as_ref().expect("just made");
        out.buf = dv.buf.ptr.cast();
        out.dbrec = dv.db.ptr.cast();
        out.stride = dv.stride;
        out.head = 0;
        out.tail = dv.nwqes - 1;
        if out.comp_mask & u64::from(MLX5DV_SRQ_MASK_SRQN) != 0 {
            out.srqn = dv.srqn;
            out.comp_mask = u64::from(MLX5DV_SRQ_MASK_SRQN);
        } else {
            out.comp_mask = 0;
        }
        Ok(())
    }

    /// The SRQ number a receive of QP `pi`'s SRQ in memory carries (0: none).
    pub(crate) fn dv_srqn_of(&self, pi: usize) -> u32 {
        let Some(Some(q)) = self.qps.get(pi) else {
            return 0;
        };
        q.srq
            .and_then(|s| {
                self.srqs
                    .get(s as usize)?
                    .as_ref()?
                    .dv
                    .as_ref()
                    .map(|d| d.srqn)
            })
            .unwrap_or(0)
    }

    /// [`dv_sync_srq`](Self::dv_sync_srq) of QP `pi`'s SRQ, if it has one.
    pub(crate) fn dv_sync_srq_of(&mut self, pi: usize) {
        if let Some(Some(q)) = self.qps.get(pi) {
            if let Some(s) = q.srq {
                self.dv_sync_srq(s as usize);
            }
        }
    }

    /// Takes the WQEs the SRQ's post counter announced since the last look into the
    /// device's queue, walking the list from its head (each WQE's index as its `wr_id`).
    /// Returns whether it took any.
    pub(crate) fn dv_sync_srq(&mut self, si: usize) -> bool {
        let Some(Some(srq)) = self.srqs.get_mut(si) else {
            return false;
        };
        let Some(dv) = srq.dv.as_deref_mut() else {
            return false;
        };
        let target = dv.counter();
        if dv.dev_count == target {
            return false;
        }
        while dv.dev_count != target {
            let mut e = srq.rq.spare.pop().unwrap_or_default();
            let idx = dv.dev_head;
            let next = dv.wqe(idx, &mut e.sges);
            e.wr_id = u64::from(idx);
            e.dv = true;
            srq.rq.q.push_back(e);
            dv.dev_head = next % dv.nwqes;
            dv.dev_count = dv.dev_count.wrapping_add(1);
        }
        true
    }

    fn dv_cq(&mut self, i: u32, out: &mut mlx5dv_cq) -> Result<(), i32> {
        let ctx = match self.cqs.get(i as usize) {
            Some(Some(c)) => c.ctx,
            _ => return Err(libc::EINVAL),
        };
        let sz = dv_cqe_size(self.cfg(ctx))?;
        let Some(Some(c)) = self.cqs.get_mut(i as usize) else {
            return Err(libc::EINVAL);
        };
        if c.dv.is_none() {
            let cqe_cnt = pow2(c.cap as u64 + 1);
            let buf = Region::new(cqe_cnt as usize * sz, 0);
            for k in 0..cqe_cnt as usize {
                // SAFETY: inside the buffer: every CQE invalid, owned by hardware (the
                // owner byte ends the CQE).
                unsafe { buf.ptr.add(k * sz + sz - 1).write(cqe_op::INVALID << 4) };
            }
            c.dv = Some(Box::new(DvCq {
                buf,
                db: Region::new(64, 0),
                uar: Region::new(4096, 0),
                cqe_cnt,
                cqe_size: sz,
                // Never 0, so the UAR doorbell of an arm is never all zeros.
                cqn: i + 1,
                pi: 0,
                arm: None,
            }));
        }
        let dv = c.dv.as_ref().expect("just made");
        out.buf = dv.buf.ptr.cast();
        out.dbrec = dv.db.ptr.cast();
        out.cqe_cnt = dv.cqe_cnt;
        out.cqe_size = dv.cqe_size as u32;
        out.cq_uar = dv.uar.ptr.cast();
        out.cqn = dv.cqn;
        out.comp_mask = 0;
        Ok(())
    }

    fn dv_ah(&mut self, i: usize, out: &mut mlx5dv_ah) -> Result<(), i32> {
        let Some(Some(a)) = self.ahs.get_mut(i) else {
            return Err(libc::EINVAL);
        };
        if i > 0xff_ffff {
            return Err(libc::ENOMEM);
        }
        let av = a.dv_av.get_or_insert_with(|| {
            let r = Region::new(64, 0);
            // SAFETY: 64 bytes: the AV's reserved bytes carry our tag and index, its
            // remote GID the AH's destination (as mlx5's `rgid`).
            unsafe {
                r.ptr
                    .add(16)
                    .cast::<[u8; 4]>()
                    .write((AV_TAG | i as u32).to_be_bytes());
                r.ptr.add(32).cast::<[u8; 16]>().write(a.attr.grh.dgid.raw);
            }
            r
        });
        out.av = av.ptr.cast();
        out.comp_mask = 0;
        Ok(())
    }

    /// Runs the simulated device: executes the WQEs every mlx5 QP's doorbell record
    /// announced since the last step, then fires armed CQs that have something. Returns
    /// how many WQEs it read.
    pub(crate) fn dv_step(&mut self) -> u32 {
        if DV_QPS.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.dv_scan_regs();
        for si in 0..self.srqs.len() {
            if self.dv_sync_srq(si) {
                self.kick_waiters(None, Some(si as u32));
            }
        }
        for qi in 0..self.qps.len() {
            if self.dv_sync_rq(qi) {
                // Sends waiting for a receive (RNR with rnr_retry 7) go on, as after a
                // post_recv.
                self.kick_waiters(Some(Qp::qpn(qi)), None);
            }
        }
        let mut n = 0;
        for qi in 0..self.qps.len() {
            while let Some(Some(q)) = self.qps.get(qi) {
                let Some(dv) = q.dv.as_deref() else {
                    break;
                };
                let target = dv.dbr() & 0xffff;
                let cur = dv.dev_cur;
                // The send queue is processed in RTS, and flushed in ERR; before RTS the
                // WQEs wait, as the hardware leaves them (RESET also clears the record).
                if cur & 0xffff == target || !matches!(q.state, IBV_QPS_RTS | IBV_QPS_ERR) {
                    break;
                }
                let parsed = Wqe::parse(dv, cur, q.qpt == IBV_QPT_UD);
                let bbs = parsed.as_ref().map_or(1, |w| w.bbs);
                if let Some(dv) = self.qp(qi).dv.as_deref_mut() {
                    dv.dev_cur = cur.wrapping_add(bbs);
                }
                self.dv_execute(qi, cur as u16, parsed);
                n += 1;
            }
        }
        for ci in 0..self.cqs.len() {
            let fire = match self.cqs.get_mut(ci) {
                Some(Some(c)) => c.dv.as_mut().is_some_and(|d| d.fires(false)),
                _ => false,
            };
            if fire {
                self.dv_event(ci as u32);
            }
        }
        n
    }

    /// Takes the receive WQEs QP `qi`'s receive counter announced since the last look into
    /// the device's receive queue (a WQE counter as each one's `wr_id`); in ERR they are
    /// flushed at once, as the hardware flushes what it finds. Nothing for a QP without a
    /// receive queue in memory, or in RESET (the counter is 0 there). Returns whether the
    /// queue gained receives (not in ERR).
    pub(crate) fn dv_sync_rq(&mut self, qi: usize) -> bool {
        let Some(Some(q)) = self.qps.get_mut(qi) else {
            return false;
        };
        let Some(dv) = q.dv.as_deref() else {
            return false;
        };
        let Some(rq) = dv.rq.as_ref() else {
            return false;
        };
        if q.state == IBV_QPS_RESET {
            return false;
        }
        let target = dv.rcv_dbr() & 0xffff;
        let mut head = rq.dev_head;
        if head & 0xffff == target {
            return false;
        }
        while head & 0xffff != target {
            let mut e = q.rq.spare.pop().unwrap_or_default();
            dv.rq_wqe(head, &mut e.sges);
            e.wr_id = u64::from(head & 0xffff);
            e.dv = true;
            q.rq.q.push_back(e);
            head = head.wrapping_add(1);
        }
        let err = q.state == IBV_QPS_ERR;
        if let Some(rq) = q.dv.as_deref_mut().and_then(|d| d.rq.as_mut()) {
            rq.dev_head = head;
        }
        if err {
            self.flush_rq(qi);
        }
        !err
    }

    /// The bytes of a `len`-byte message QP `pi` receives that its receive CQ's CQE holds
    /// instead of the buffer (responder scatter-to-CQE), or `None` when it goes to the
    /// buffer: RC and UC QPs only (the kernel configures it for those), a receive of the
    /// queue in memory, a CQ of the personality, 1 to 32 bytes with 64-byte CQEs, 1 to 64
    /// with 128-byte ones (`docs/mlx5-receive.md` §1).
    pub(crate) fn dv_scatter_limit(
        &mut self,
        pi: usize,
        dv: bool,
        qpt: ibv_qp_type,
        len: usize,
    ) -> Option<usize> {
        if !dv || len == 0 || !matches!(qpt, IBV_QPT_RC | IBV_QPT_UC) {
            return None;
        }
        let cq = self.qp(pi).recv_cq;
        let limit = match self.cqs.get(cq as usize) {
            Some(Some(c)) => c.dv.as_ref()?.cqe_size / 2,
            _ => return None,
        };
        (len <= limit).then_some(limit)
    }

    /// Executes one WQE of QP `qi` through softnic's engine (or flushes it in ERR).
    fn dv_execute(&mut self, qi: usize, ctr: u16, w: Result<Wqe, &'static str>) {
        let (state, qpn) = (self.qp(qi).state, Qp::qpn(qi));
        let mut w = match w {
            Ok(w) => w,
            Err(why) => {
                // A malformed WQE: the hardware's local QP operation error.
                eprintln!("softnic mlx5: QP {qpn:#x} WQE {ctr}: {why}");
                self.dv_complete(qi, ctr as u64, IBV_WC_SEND, IBV_WC_LOC_QP_OP_ERR);
                self.qp_error(qi, super::ErrCause::Fatal);
                return;
            }
        };
        if state == IBV_QPS_ERR {
            self.dv_complete(qi, w.wr_id(), w.wc_opcode(), IBV_WC_WR_FLUSH_ERR);
            return;
        }
        let sge;
        let (sg_list, num_sge) = match &w.inline {
            Some(d) => {
                sge = ibv_sge {
                    addr: d.as_ptr() as u64,
                    length: d.len() as u32,
                    lkey: 0,
                };
                (&sge as *const ibv_sge, (!d.is_empty()) as i32)
            }
            None => (w.sges.as_ptr(), w.sges.len() as i32),
        };
        // SAFETY: plain C struct; all-zero is valid.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = w.wr_id();
        wr.opcode = w.wr_opcode();
        wr.send_flags = w.flags;
        wr.sg_list = sg_list.cast_mut();
        wr.num_sge = num_sge;
        wr.__bindgen_anon_1.imm_data = w.imm;
        match w.op {
            op::ATOMIC_CS | op::ATOMIC_FA => {
                wr.wr.atomic.remote_addr = w.raddr;
                wr.wr.atomic.rkey = w.rkey;
                wr.wr.atomic.compare_add = if w.op == op::ATOMIC_FA {
                    w.swap_add
                } else {
                    w.compare
                };
                wr.wr.atomic.swap = w.swap_add;
            }
            _ => {
                wr.wr.rdma.remote_addr = w.raddr;
                wr.wr.rdma.rkey = w.rkey;
            }
        }
        if let Some((ah, rqpn, qkey)) = w.ud.take() {
            let ah = match self.ahs.get(ah) {
                Some(Some(a)) => a.ptr.0,
                _ => std::ptr::null_mut(),
            };
            wr.wr.ud.ah = ah;
            wr.wr.ud.remote_qpn = rqpn;
            wr.wr.ud.remote_qkey = qkey;
        }
        // The mlx5 ring bounds the WRs in flight itself: softnic's SQ accounting (slots
        // released when a completion is polled from its own queue) must not refuse it. Only
        // WRs still waiting (RNR) occupy slots; ones a receive released since the last
        // WQE (kick_waiters) are free again.
        let q = self.qp(qi);
        q.sq_released = q.sq_posted - q.pending.len() as u64;
        let mut bad = std::ptr::null_mut();
        // SAFETY: a one-WR chain of live locals (the inline bytes and SGEs outlive the
        // call, which copies what it keeps).
        let rc = unsafe { self.post_send_chain(qi, &mut wr, &mut bad) };
        if rc != 0 {
            // Refused as a post would be: the hardware reports a local QP operation error.
            self.dv_complete(qi, w.wr_id(), w.wc_opcode(), IBV_WC_LOC_QP_OP_ERR);
            self.qp_error(qi, super::ErrCause::Fatal);
        }
        // The mlx5 ring bounds the WRs in flight itself: softnic's SQ accounting (slots
        // released when a completion is polled from its own queue) must not refuse it.
        let q = self.qp(qi);
        q.sq_released = q.sq_posted - q.pending.len() as u64;
    }

    /// A completion the device makes itself (a flush in ERR, a refused WQE).
    fn dv_complete(&mut self, qi: usize, wr_id: u64, opcode: ibv_wc_opcode, status: u32) {
        let wc = ibv_wc {
            wr_id,
            status,
            opcode,
            qp_num: Qp::qpn(qi),
            ..Default::default()
        };
        let cq = self.qp(qi).send_cq;
        let tag = SqTag {
            qp: qi as u32,
            ..SqTag::NONE
        };
        self.push_cqe_tagged(cq, wc, false, tag);
    }

    /// [`Fabric::push_cqe_tagged`] on a CQ with the mlx5 personality: the CQE (a requester
    /// one if `send`) goes to its buffer. Returns false when it overflowed.
    pub(crate) fn dv_push(&mut self, cq: u32, wc: &ibv_wc, solicited: bool, send: bool) -> bool {
        let scatter = if send { None } else { self.dv_scatter.take() };
        let srqn = if send { 0 } else { self.dv_srqn };
        let Some(Some(c)) = self.cqs.get_mut(cq as usize) else {
            return false;
        };
        let Some(d) = c.dv.as_mut() else {
            return false;
        };
        if !d.write(wc, send, scatter, srqn) {
            let ctx = c.ctx;
            let ptr = c.ptr.0 as usize;
            self.raise(ctx, IBV_EVENT_CQ_ERR, ptr);
            return false;
        }
        if d.fires(solicited || wc.status != IBV_WC_SUCCESS) {
            self.dv_event(cq);
        }
        true
    }

    /// A completion event of CQ `cq` on its channel.
    fn dv_event(&mut self, cq: u32) {
        let Some(Some(c)) = self.cqs.get(cq as usize) else {
            return;
        };
        if let Some(ch) = c.channel {
            if let Some(Some(chan)) = self.channels.get_mut(ch as usize) {
                chan.events.push_back(cq);
                ring_fd(chan.wr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cq(cqe_cnt: u32) -> DvCq {
        let buf = Region::new(cqe_cnt as usize * CQE, 0);
        for k in 0..cqe_cnt as usize {
            // SAFETY: inside the buffer.
            unsafe { buf.ptr.add(k * CQE + CQE - 1).write(cqe_op::INVALID << 4) };
        }
        DvCq {
            buf,
            db: Region::new(64, 0),
            uar: Region::new(4096, 0),
            cqe_cnt,
            cqe_size: CQE,
            cqn: 1,
            pi: 0,
            arm: None,
        }
    }

    fn cqe(c: &DvCq, i: usize) -> [u8; CQE] {
        let mut out = [0u8; CQE];
        // SAFETY: CQE `i` is inside the buffer.
        unsafe { std::ptr::copy_nonoverlapping(c.buf.ptr.add(i * CQE), out.as_mut_ptr(), CQE) };
        out
    }

    /// The kind of CQE follows where the completion came from, not `wc.opcode`: the Rxe
    /// profile gives every error completion opcode 0 (IBV_WC_SEND), a flushed receive
    /// included, which must still be a responder CQE (the direct poller refuses those by
    /// name) and never a requester one naming a WQE of the send queue.
    #[test]
    fn a_flushed_receive_is_a_responder_cqe_whatever_its_opcode() {
        let mut c = cq(4);
        let wc = ibv_wc {
            wr_id: 0x0a_0003,
            status: IBV_WC_WR_FLUSH_ERR,
            opcode: 0,
            qp_num: 0x11,
            ..Default::default()
        };
        assert!(c.write(&wc, false, None, 0));
        assert!(c.write(&wc, true, None, 0));
        let (recv, send) = (cqe(&c, 0), cqe(&c, 1));
        assert_eq!(recv[63] >> 4, cqe_op::RESP_ERR);
        assert_eq!(send[63] >> 4, cqe_op::REQ_ERR);
        assert_eq!(send[60..62], [0, 3], "the WQE counter from the wr_id");
        assert_eq!(send[56], op::SEND, "the WQE opcode from the wr_id");
        assert_eq!(send[55], 0x05, "WR_FLUSH_ERR's syndrome");
        assert_eq!(recv[63] & 1, 0, "first pass: owner bit 0");
    }

    /// Whatever bytes a send queue holds (a buggy ring, stale blocks), parsing a WQE never
    /// panics or reads outside the queue, and what it accepts stays within its `ds`.
    #[test]
    fn random_send_queue_bytes_parse_or_are_refused() {
        let wqe_cnt = 8u32;
        DV_QPS.fetch_add(1, Ordering::Relaxed); // the DvQp's drop takes it back
        let q = DvQp {
            sq: Region::new(wqe_cnt as usize * BB, 0),
            db: Region::new(64, 0),
            reg: std::sync::Arc::new(reg::DvReg::new(BF_SIZE)),
            wqe_cnt,
            dev_cur: 0,
            rq: None,
        };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut ok, mut refused) = (0, 0);
        for round in 0..20_000u32 {
            for i in 0..wqe_cnt as usize * BB {
                // SAFETY: inside the SQ.
                unsafe { q.sq.ptr.add(i).write(next() as u8) };
            }
            let cur = round % 64;
            // Half the rounds name the right WQE counter, so parsing goes past the ctrl.
            if round % 2 == 0 {
                let base = (cur & (wqe_cnt - 1)) as usize * BB;
                let oio = (cur << 8)
                    | [op::SEND, op::RDMA_WRITE, op::ATOMIC_CS][round as usize % 3] as u32;
                // SAFETY: inside the SQ.
                unsafe {
                    q.sq.ptr
                        .add(base)
                        .cast::<[u8; 4]>()
                        .write(oio.to_be_bytes())
                };
            }
            match Wqe::parse(&q, cur, round % 5 == 0) {
                Ok(w) => {
                    ok += 1;
                    assert!(w.bbs >= 1 && w.bbs <= 16, "{}", w.bbs);
                    let len = w.inline.as_ref().map_or(0, Vec::len);
                    assert!(
                        len <= w.bbs as usize * BB,
                        "inline {len} in {} blocks",
                        w.bbs
                    );
                    assert!(w.sges.len() <= 63);
                }
                Err(_) => refused += 1,
            }
        }
        assert!(
            ok > 1000 && refused > 1000,
            "both kinds seen: {ok} / {refused}"
        );
    }

    /// A full CQ refuses the next CQE (the caller raises CQ_ERR), and the consumer index in
    /// the doorbell record makes room again.
    #[test]
    fn a_full_cq_overflows_until_the_consumer_index_moves() {
        let mut c = cq(2);
        let wc = ibv_wc::default();
        assert!(c.write(&wc, true, None, 0));
        assert!(c.write(&wc, true, None, 0));
        assert!(!c.write(&wc, true, None, 0), "no room");
        // SAFETY: the doorbell record's first u32.
        unsafe { c.db.ptr.cast::<u32>().write_volatile(1u32.to_be()) };
        assert!(c.write(&wc, true, None, 0), "one consumed, one free");
        assert_eq!(cqe(&c, 0)[63] & 1, 1, "second pass: owner bit 1");
    }
}
