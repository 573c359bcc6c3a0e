//! Receive WQEs written straight into a ConnectX receive queue: what `mlx5_post_recv`
//! writes, without libmlx5 (issue 30's first part; `docs/mlx5-receive.md` §3 has the
//! format as rdma-core v55 writes it).
//!
//! An RQ WQE is `stride` bytes of 16-byte data segments (`struct mlx5_wqe_data_seg`:
//! byte count, lkey, address, big-endian), `max_gs = stride / 16` of them. One segment is
//! written per scatter entry of non-zero length, in order; when fewer than `max_gs` were
//! written, one terminator follows (byte count 0, lkey [`INVALID_LKEY`], address 0). There
//! is no control segment and no register write: WQE `n` lives at slot `n & (wqe_cnt - 1)`,
//! its `wr_id` in `wrid[slot]`, and a post publishes its WQEs with a store barrier
//! (`udma_to_device_barrier`) and one store of the receive counter, `head & 0xffff`
//! big-endian, into element [`RCV_DBR`] of the QP's doorbell record.
//!
//! [`DirectRq::post`] writes one WQE, [`DirectRq::publish`] is the barrier and the counter:
//! a chain of `mlx5_post_recv` is several posts and one publish. `cargo xtask golden`
//! compares the queue bytes, the doorbell record, the `wrid` array and the refusals with
//! `mlx5_post_recv` itself (`datapath/golden/tests/golden.rs`, receive queue).
//!
//! Not built yet (issue 30): the SRQ's WQEs and free list, the responder CQEs on the
//! direct poller, scatter-to-CQE, and the safe ring over this queue.

use super::Doorbell;

/// The receive counter's element of a QP's doorbell record (`MLX5_RCV_DBR`).
pub const RCV_DBR: usize = 0;
/// The lkey of the segment that ends a WQE with fewer than `max_gs` entries
/// (`MLX5_INVALID_LKEY`).
pub const INVALID_LKEY: u32 = 0x100;

/// One scatter entry of a receive (`struct ibv_sge`'s fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvSeg {
    /// Address.
    pub addr: u64,
    /// Length in bytes; a zero-length entry is skipped, as libmlx5 skips it.
    pub length: u32,
    /// The MR's lkey.
    pub lkey: u32,
}

/// A ConnectX receive queue as `mlx5dv_init_obj(3)` describes it (`struct mlx5dv_qp`'s
/// `rq` and `dbrec`).
#[derive(Clone, Copy, Debug)]
pub struct DirectRqDesc {
    /// `rq.buf`: the first WQE.
    pub buf: *mut u8,
    /// `rq.wqe_cnt`: WQEs in the queue (a power of two).
    pub wqe_cnt: u32,
    /// `rq.stride`: bytes per WQE (a power of two, at least 16).
    pub stride: u32,
    /// `dbrec`: the QP's doorbell record; the receive counter is element [`RCV_DBR`].
    pub dbrec: *mut u32,
    /// `wqe_cnt` entries the queue owns: the `wr_id` of the WQE at each slot.
    pub wrid: *mut u64,
}

/// Why a receive was not posted. The queue is unchanged by a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RqError {
    /// `wqe_cnt` receives are outstanding (`mlx5_post_recv`: ENOMEM); complete some first.
    Full,
    /// More scatter entries than a WQE holds (`mlx5_post_recv`: EINVAL).
    TooManySegs {
        /// Entries given.
        got: usize,
        /// `stride / 16`.
        max: u32,
    },
    /// The description is not a queue: `wqe_cnt` or `stride` not a power of two, a stride
    /// under 16 bytes, or a null pointer.
    Geometry,
}

impl core::fmt::Display for RqError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            RqError::Full => write!(
                f,
                "mlx5 receive queue full (ENOMEM as mlx5_post_recv): complete receives first"
            ),
            RqError::TooManySegs { got, max } => write!(
                f,
                "{got} scatter entries > the WQE's {max} (EINVAL as mlx5_post_recv): create \
                 the QP with a larger max_recv_sge"
            ),
            RqError::Geometry => write!(
                f,
                "not an mlx5 receive queue: wqe_cnt and stride must be powers of two, the \
                 stride at least 16, the pointers non-null"
            ),
        }
    }
}

impl core::error::Error for RqError {}

/// A ConnectX receive queue this value alone posts to.
#[derive(Debug)]
pub struct DirectRq<D: Doorbell> {
    buf: *mut u8,
    mask: u32,
    shift: u32,
    max_gs: u32,
    dbrec: *mut u32,
    wrid: *mut u64,
    /// Receives written (wrapping, as libmlx5's `rq.head`).
    head: u32,
    /// Receives completed.
    tail: u32,
    /// `head` when the counter was last stored.
    published: u32,
    db: D,
}

impl<D: Doorbell> DirectRq<D> {
    /// The queue `desc` describes, posted to from `head` on (0 for a QP libmlx5 has not
    /// posted receives to; its `rq.head` otherwise), with nothing outstanding.
    ///
    /// # Safety
    /// For as long as the value lives: `desc` describes a live receive queue (`buf` holds
    /// `wqe_cnt * stride` writable bytes, `dbrec` the QP's doorbell record, `wrid`
    /// `wqe_cnt` writable entries) that nothing else posts to or reads `wrid` of, and
    /// `db` performs stores and barriers as [`Doorbell`] says.
    ///
    /// # Errors
    /// [`RqError::Geometry`] for a description that is not a queue.
    pub unsafe fn new(desc: DirectRqDesc, head: u32, db: D) -> Result<Self, RqError> {
        if !desc.wqe_cnt.is_power_of_two()
            || !desc.stride.is_power_of_two()
            || desc.stride < 16
            || desc.buf.is_null()
            || desc.dbrec.is_null()
            || desc.wrid.is_null()
        {
            return Err(RqError::Geometry);
        }
        Ok(DirectRq {
            buf: desc.buf,
            mask: desc.wqe_cnt - 1,
            shift: desc.stride.trailing_zeros(),
            max_gs: desc.stride / 16,
            dbrec: desc.dbrec,
            wrid: desc.wrid,
            head,
            tail: head,
            published: head,
            db,
        })
    }

    /// Receives posted and not yet completed.
    pub fn outstanding(&self) -> u32 {
        self.head.wrapping_sub(self.tail)
    }

    /// WQEs in the queue.
    pub fn capacity(&self) -> u32 {
        self.mask + 1
    }

    /// Scatter entries a WQE holds.
    pub fn max_segs(&self) -> u32 {
        self.max_gs
    }

    /// Receives posted so far (libmlx5's `rq.head`).
    pub fn head(&self) -> u32 {
        self.head
    }

    /// The doorbell this queue publishes through.
    pub fn doorbell(&self) -> &D {
        &self.db
    }

    /// Writes one receive WQE for `segs` with `wr_id`; it reaches the device at the next
    /// [`publish`](Self::publish).
    ///
    /// # Errors
    /// [`RqError::Full`], [`RqError::TooManySegs`]; nothing is written then.
    #[inline]
    pub fn post(&mut self, wr_id: u64, segs: &[RecvSeg]) -> Result<(), RqError> {
        if self.outstanding() > self.mask {
            return Err(RqError::Full);
        }
        if segs.len() > self.max_gs as usize {
            return Err(RqError::TooManySegs {
                got: segs.len(),
                max: self.max_gs,
            });
        }
        let slot = self.head & self.mask;
        // SAFETY: `slot < wqe_cnt`, so the WQE's `stride` bytes are inside `buf` (`new`'s
        // contract); a WQE is 16-byte aligned (the queue is page-aligned, the stride a
        // power of two >= 16).
        let wqe = unsafe { self.buf.add((slot as usize) << self.shift) }.cast::<[u32; 4]>();
        let mut j = 0usize;
        for s in segs.iter().filter(|s| s.length != 0) {
            // SAFETY: j < max_gs entries of 16 bytes fit the stride.
            unsafe { wqe.add(j).write(data_seg(s.length, s.lkey, s.addr)) };
            j += 1;
        }
        if j < self.max_gs as usize {
            // SAFETY: as above.
            unsafe { wqe.add(j).write(data_seg(0, INVALID_LKEY, 0)) };
        }
        // SAFETY: slot < wqe_cnt entries of `wrid` (`new`'s contract).
        unsafe { self.wrid.add(slot as usize).write(wr_id) };
        self.head = self.head.wrapping_add(1);
        Ok(())
    }

    /// Hands the WQEs posted since the last call to the device: a store barrier, then the
    /// receive counter. Nothing when none were posted (as `mlx5_post_recv` with `nreq` 0).
    #[inline]
    pub fn publish(&mut self) {
        if self.head == self.published {
            return;
        }
        self.db.to_device_barrier();
        // SAFETY: element RCV_DBR of the QP's doorbell record (`new`'s contract).
        unsafe {
            self.db
                .write_dbr(self.dbrec.add(RCV_DBR), (self.head & 0xffff).to_be())
        };
        self.published = self.head;
    }

    /// Retires the oldest outstanding receive and returns its `wr_id` (the poller's side:
    /// a receive CQE completes the receives in order), or `None` when none is outstanding.
    pub fn complete(&mut self) -> Option<u64> {
        if self.outstanding() == 0 {
            return None;
        }
        let slot = self.tail & self.mask;
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: slot < wqe_cnt entries of `wrid`.
        Some(unsafe { self.wrid.add(slot as usize).read() })
    }
}

/// A data segment as the device reads it: byte count, lkey, address, big-endian.
#[inline(always)]
fn data_seg(len: u32, lkey: u32, addr: u64) -> [u32; 4] {
    let a = addr.to_be_bytes();
    [
        len.to_be(),
        lkey.to_be(),
        u32::from_ne_bytes([a[0], a[1], a[2], a[3]]),
        u32::from_ne_bytes([a[4], a[5], a[6], a[7]]),
    ]
}
