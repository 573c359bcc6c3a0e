//! Receive WQEs written straight into a ConnectX shared receive queue: what
//! `mlx5_post_srq_recv` (rdma-core v55, `providers/mlx5/srq.c`) writes, without libmlx5
//! (issue 30).
//!
//! An SRQ WQE is `stride` bytes: a 16-byte *next segment* (`struct mlx5_wqe_srq_next_seg`:
//! two reserved bytes, `next_wqe_index` big-endian, a signature byte, eleven reserved),
//! then `max_gs = stride / 16 - 1` data segments as an RQ WQE's (byte count, lkey,
//! address), ended by one with the lkey [`INVALID_LKEY`] when shorter. Unlike an RQ, an
//! SRQ completes its receives in any order (each QP takes the next one), so its WQEs form
//! a linked list: the device takes them from `head` along `next_wqe_index`, and software
//! links freed ones back in at `tail`.
//!
//! The free list, as v55 keeps it: a WQE whose receive completed is marked in a *free
//! bitmap* ([`DirectSrq::free`], what `mlx5_free_srq_wqe` does when `mlx5_poll_cq` reads
//! its CQE); a post that finds `head == tail` (one WQE left: the device never takes the
//! last) links the WQE after `tail` if it is free, or else the run of free WQEs nearest
//! after `head` (wrapping to 0 once), renumbering its links in order; with none, the SRQ
//! is full (`ENOMEM`). Indexes `nwqes..` (libmlx5's wait queue, for ODP page faults) are
//! never posted to. Each post stores the `wr_id` at the WQE's index; a batch is published
//! with one store barrier and one store of the 16-bit post counter into the doorbell
//! record. `cargo xtask golden` compares all of it (queue bytes, `wrid`, counter, `head`,
//! `tail`, bitmap, refusals) with `mlx5_post_srq_recv` and `mlx5_free_srq_wqe`.
//!
//! Its completions: [`DirectPoller::attach_srq`](super::DirectPoller::attach_srq); its ring:
//! [`RecvTarget::Mlx5Srq`](crate::RecvTarget::Mlx5Srq); the setup layer's
//! `Srq::direct_recv_ring`. Not modelled: libmlx5's wait queue (ODP page faults).

use core::sync::atomic::{AtomicU64, Ordering};

use super::ring::data_seg;
use super::rq::INVALID_LKEY;
use super::Doorbell;
use crate::LocalBuf;

/// A ConnectX SRQ as `mlx5dv_init_obj(3)` describes it (`struct mlx5dv_srq`: `buf`,
/// `stride`, `dbrec`) with the state libmlx5 keeps for it (`head`, `tail`, `nwqes`) and the
/// memory this queue's owner provides (`wrid`, `free`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectSrqDesc {
    /// The first WQE.
    pub buf: *mut u8,
    /// Bytes per WQE (a power of two, at least 32).
    pub stride: u32,
    /// WQEs of the main queue (a power of two: libmlx5's `tail + 1` of a new SRQ); the
    /// WQEs after them (the wait queue) are never posted to.
    pub nwqes: u32,
    /// The SRQ's doorbell record (the post counter).
    pub dbrec: *mut u32,
    /// `nwqes` entries: the `wr_id` of the WQE at each index.
    pub wrid: *mut u64,
    /// `nwqes.div_ceil(64)` words, zeroed for a new SRQ, 8-aligned: the free-WQE bitmap
    /// (bit `i % 64` of word `i / 64` for WQE `i`), accessed atomically only (the poller
    /// that completes the SRQ's receives sets bits while the queue posts).
    pub free: *mut u64,
}

/// Why a receive was not posted to the SRQ. The queue is unchanged by a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SrqError {
    /// No free WQE (`mlx5_post_srq_recv`: ENOMEM); complete receives first.
    Full,
    /// More scatter entries than a WQE holds (`mlx5_post_srq_recv`: EINVAL).
    TooManySegs {
        /// Entries given.
        got: usize,
        /// `stride / 16 - 1`.
        max: u32,
    },
    /// The description is not an SRQ: a stride not a power of two or under 32 bytes,
    /// `nwqes` not a power of two or over 2^16, an index out of range, or a null pointer.
    Geometry,
}

impl core::fmt::Display for SrqError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            SrqError::Full => write!(
                f,
                "mlx5 SRQ full (ENOMEM as mlx5_post_srq_recv): complete receives first"
            ),
            SrqError::TooManySegs { got, max } => write!(
                f,
                "{got} scatter entries > the SRQ WQE's {max} (EINVAL as mlx5_post_srq_recv): \
                 create the SRQ with a larger max_sge"
            ),
            SrqError::Geometry => write!(
                f,
                "not an mlx5 SRQ: the stride and nwqes must be powers of two (stride at \
                 least 32, nwqes at most 65536), head and tail below nwqes, the pointers \
                 non-null"
            ),
        }
    }
}

impl core::error::Error for SrqError {}

/// A ConnectX SRQ this value alone posts to.
#[derive(Debug)]
pub struct DirectSrq<D: Doorbell> {
    buf: *mut u8,
    shift: u32,
    max_gs: u32,
    nwqes: u32,
    dbrec: *mut u32,
    wrid: *mut u64,
    free: *mut u64,
    head: u32,
    tail: u32,
    /// Posts so far (libmlx5's 16-bit `counter`), published or not.
    counter: u16,
    /// `counter` when it was last stored.
    published: u16,
    db: D,
}

/// Bytes of the next segment before a WQE's data segments.
const NEXT_SEG: usize = 16;

impl<D: Doorbell> DirectSrq<D> {
    /// The SRQ `desc` describes, its list at `head` and `tail` and its post counter at
    /// `counter` (a new SRQ: 0, `nwqes - 1`, 0, the WQEs linked in order: libmlx5's
    /// `set_srq_buf_ll`, or [`link_all`](Self::link_all)).
    ///
    /// # Safety
    /// For as long as the value lives: `desc` describes a live SRQ (`buf` holds
    /// `nwqes * stride` writable bytes, `dbrec` its doorbell record, `wrid` `nwqes` writable
    /// entries, `free` `nwqes.div_ceil(64)` writable words) that nothing else posts to or
    /// whose `wrid` and bitmap nothing else writes, and `db` performs stores and barriers as
    /// [`Doorbell`] says.
    ///
    /// # Errors
    /// [`SrqError::Geometry`] for a description that is not an SRQ.
    pub unsafe fn new(
        desc: DirectSrqDesc,
        head: u32,
        tail: u32,
        counter: u16,
        db: D,
    ) -> Result<Self, SrqError> {
        if !desc.stride.is_power_of_two()
            || desc.stride < 32
            || !desc.nwqes.is_power_of_two()
            || desc.nwqes > 1 << 16
            || head >= desc.nwqes
            || tail >= desc.nwqes
            || desc.buf.is_null()
            || desc.dbrec.is_null()
            || desc.wrid.is_null()
            || desc.free.is_null()
        {
            return Err(SrqError::Geometry);
        }
        Ok(DirectSrq {
            buf: desc.buf,
            shift: desc.stride.trailing_zeros(),
            max_gs: desc.stride / 16 - 1,
            nwqes: desc.nwqes,
            dbrec: desc.dbrec,
            wrid: desc.wrid,
            free: desc.free,
            head,
            tail,
            counter,
            published: counter,
            db,
        })
    }

    /// Links every WQE of the main queue to the next (`set_srq_buf_ll(0, nwqes - 1)`), as
    /// libmlx5 does for a new SRQ, for an owner that makes the SRQ's memory itself.
    pub fn link_all(&mut self) {
        for i in 0..self.nwqes - 1 {
            self.set_link(i, i + 1);
        }
    }

    /// The WQE at `idx`.
    #[inline(always)]
    fn wqe(&self, idx: u32) -> *mut u8 {
        // SAFETY: callers pass idx < nwqes: inside `buf` (`new`'s contract).
        unsafe { self.buf.add((idx as usize) << self.shift) }
    }

    /// `next_wqe_index` of WQE `idx`.
    #[inline(always)]
    fn link(&self, idx: u32) -> u32 {
        let p = self.wqe(idx);
        // SAFETY: the next segment's bytes 2..4, inside the WQE.
        u32::from(u16::from_be_bytes(unsafe {
            [p.add(2).read(), p.add(3).read()]
        }))
    }

    #[inline(always)]
    fn set_link(&mut self, idx: u32, next: u32) {
        let p = self.wqe(idx);
        let b = (next as u16).to_be_bytes();
        // SAFETY: as in `link`.
        unsafe {
            p.add(2).write(b[0]);
            p.add(3).write(b[1]);
        }
    }

    /// Word `i / 64` of the free bitmap, as an atomic: a poller on another thread sets
    /// bits of it while this queue posts (libmlx5 takes the SRQ's lock for both; an atomic
    /// word makes the two sound without one).
    #[inline(always)]
    fn word(&self, i: u32) -> &AtomicU64 {
        // SAFETY: i < nwqes: word i / 64 of the bitmap (`new`'s contract), 8-aligned;
        // AtomicU64 has u64's layout, and every access to the bitmap is atomic.
        unsafe { AtomicU64::from_ptr(self.free.add(i as usize / 64)) }
    }

    #[inline(always)]
    fn is_free(&self, i: u32) -> bool {
        // Acquire: the receive of a WQE the poller freed is over before it is rewritten.
        self.word(i).load(Ordering::Acquire) >> (i % 64) & 1 != 0
    }

    #[inline(always)]
    fn set_free(&mut self, i: u32, on: bool) {
        let bit = 1u64 << (i % 64);
        if on {
            self.word(i).fetch_or(bit, Ordering::Release);
        } else {
            self.word(i).fetch_and(!bit, Ordering::Relaxed);
        }
    }

    /// Links `next` after the tail (`set_next_tail`).
    fn set_next_tail(&mut self, next: u32) {
        self.set_link(self.tail, next);
        self.tail = next;
        self.set_free(next, false);
    }

    /// Links in the run of free WQEs nearest after `head` (wrapping once), renumbered in
    /// order (`set_next_contig_wqes`); false when there is none.
    fn set_next_contig(&mut self) -> bool {
        let run = |s: &Self, first: u32, last: u32| {
            let mut count = 0;
            let mut i = first;
            while i < last {
                if s.is_free(i) {
                    count += 1;
                } else if count > 0 {
                    break;
                }
                i += 1;
            }
            (i - count, count)
        };
        let (mut start, mut count) = run(self, self.head + 1, self.nwqes);
        if count == 0 {
            (start, count) = run(self, 0, self.head);
            if count == 0 {
                return false;
            }
        }
        self.set_link(self.tail, start);
        self.tail = start + count - 1;
        self.set_free(self.tail, false);
        for i in start..self.tail {
            self.set_link(i, i + 1);
            self.set_free(i, false);
        }
        true
    }

    /// Writes one receive WQE for `segs` with `wr_id` at the head of the list; it reaches
    /// the device at the next [`publish`](Self::publish). Returns the WQE's index (what
    /// its completion's `wqe_counter` will name).
    ///
    /// # Errors
    /// [`SrqError::TooManySegs`], [`SrqError::Full`]; nothing is written then.
    pub fn post(&mut self, wr_id: u64, segs: &[LocalBuf]) -> Result<u32, SrqError> {
        if segs.len() > self.max_gs as usize {
            return Err(SrqError::TooManySegs {
                got: segs.len(),
                max: self.max_gs,
            });
        }
        if self.head == self.tail {
            let next = (self.tail + 1) % self.nwqes;
            if self.is_free(next) {
                self.set_next_tail(next);
            } else if !self.set_next_contig() {
                return Err(SrqError::Full);
            }
        }
        let idx = self.head;
        // SAFETY: idx < nwqes entries of `wrid` (`new`'s contract).
        unsafe { self.wrid.add(idx as usize).write(wr_id) };
        self.head = self.link(idx);
        let wqe = self.wqe(idx);
        // Every entry, a zero-length one too (as mlx5_post_srq_recv; an RQ skips those).
        for (j, &s) in segs.iter().enumerate() {
            // SAFETY: j < max_gs segments after the next segment fit the stride.
            unsafe { data_seg(wqe.add(NEXT_SEG + j * 16), s, false) };
        }
        if segs.len() < self.max_gs as usize {
            let end = LocalBuf {
                addr: 0,
                len: 0,
                lkey: INVALID_LKEY,
            };
            // SAFETY: as above.
            unsafe { data_seg(wqe.add(NEXT_SEG + segs.len() * 16), end, false) };
        }
        self.counter = self.counter.wrapping_add(1);
        Ok(idx)
    }

    /// Hands the WQEs posted since the last call to the device: a store barrier, then the
    /// post counter. Nothing when none were posted.
    pub fn publish(&mut self) {
        if self.counter == self.published {
            return;
        }
        self.db.to_device_barrier();
        // SAFETY: the SRQ's doorbell record (`new`'s contract).
        unsafe {
            self.db
                .write_dbr(self.dbrec, u32::from(self.counter).to_be())
        };
        self.published = self.counter;
    }

    /// Gives WQE `idx` back to software once its receive completed
    /// (`mlx5_free_srq_wqe`: a bit in the free bitmap; a later post links it in). An index
    /// outside the main queue is ignored.
    pub fn free(&mut self, idx: u32) {
        if idx < self.nwqes {
            self.set_free(idx, true);
        }
    }

    /// The `wr_id` of WQE `idx` (a completion's `wqe_counter`), or `None` outside the
    /// queue.
    pub fn wr_id(&self, idx: u32) -> Option<u64> {
        // SAFETY: idx < nwqes entries of `wrid`.
        (idx < self.nwqes).then(|| unsafe { self.wrid.add(idx as usize).read() })
    }

    /// The next WQE the device takes (libmlx5's `head`).
    pub fn head(&self) -> u32 {
        self.head
    }

    /// The last linked WQE (libmlx5's `tail`).
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// Posts so far, modulo 2^16 (libmlx5's `counter`).
    pub fn counter(&self) -> u16 {
        self.counter
    }

    /// Scatter entries a WQE holds.
    pub fn max_segs(&self) -> u32 {
        self.max_gs
    }

    /// The doorbell this queue publishes through.
    pub fn doorbell(&self) -> &D {
        &self.db
    }
}
