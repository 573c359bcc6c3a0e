//! A plain-memory stand-in for a ConnectX send queue and CQ, for testing and measuring
//! `hotverbs-datapath`'s mlx5 direct path (`DirectRing` / `DirectPoller`) with no device.
//!
//! [`Mlx5Sim`] owns what `mlx5dv_init_obj(3)` would point at: the SQ (basic blocks filled
//! with a poison byte), the QP and CQ doorbell records, a BlueFlame register page, the
//! `wrid` table and the CQ (every CQE `INVALID`, owned by hardware). Its "device"
//! ([`Mlx5Sim::process`]) reads the doorbell record, walks the announced WQEs by their
//! ctrl segments and writes a requester CQE for every WQE with `CQ_UPDATE` (or, after
//! [`fail_next`](Mlx5Sim::fail_next), an error CQE then a flush CQE per later WQE, as a
//! QP in error does), with the owner bit of each pass over the CQ.
//!
//! The datapath's `mlx5::RecordingDoorbell` (feature `std`) records what a ring stores.

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// One page-aligned zeroed allocation (also the memory of softnic's mlx5 personality).
pub(crate) struct Region {
    pub(crate) ptr: *mut u8,
    layout: Layout,
}

// SAFETY: owned heap memory; whoever holds the region serialises access to it.
unsafe impl Send for Region {}

impl Region {
    /// `len` bytes (at least 64), page-aligned, filled with `fill`.
    pub(crate) fn new(len: usize, fill: u8) -> Region {
        let layout = Layout::from_size_align(len.max(64), 4096).expect("layout");
        // SAFETY: a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        // SAFETY: `len` bytes were just allocated.
        unsafe { ptr.write_bytes(fill, len) };
        Region { ptr, layout }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// The byte every SQ basic block starts as.
pub const POISON: u8 = 0xcc;

/// A simulated mlx5 SQ + CQ pair; see the [module docs](self).
pub struct Mlx5Sim {
    sq: Region,
    qp_db: Region,
    bf: Region,
    wrid: Vec<u64>,
    cq: Region,
    cq_db: Region,
    /// Basic blocks in the SQ.
    pub wqe_cnt: u32,
    /// CQEs in the CQ.
    pub cqe_cnt: u32,
    /// Bytes per CQE: 64, or 128 ([`with_cqe_size`](Self::with_cqe_size)).
    pub cqe_size: u32,
    /// QP number.
    pub qpn: u32,
    dev: SimDevice,
}

// SAFETY: the regions are owned heap memory; &mut self serialises access.
unsafe impl Send for Mlx5Sim {}

impl std::fmt::Debug for Mlx5Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mlx5Sim")
            .field("wqe_cnt", &self.wqe_cnt)
            .field("cqe_cnt", &self.cqe_cnt)
            .field("qpn", &self.qpn)
            .field("dev", &self.dev)
            .finish_non_exhaustive()
    }
}

/// Raw pointers of a [`Mlx5Sim`], for building the datapath's `DirectSq` / `DirectCq`.
#[derive(Clone, Copy, Debug)]
pub struct SimPtrs {
    /// SQ buffer (`wqe_cnt * 64` bytes).
    pub sq: *mut u8,
    /// QP doorbell record (two big-endian u32: receive, send).
    pub qp_dbrec: *mut u32,
    /// BlueFlame register page (4 KiB; buffers of 256 bytes at 0 and 256).
    pub bf_reg: *mut u8,
    /// `wrid` table (`wqe_cnt` entries).
    pub wrid: *mut u64,
    /// CQ buffer (`cqe_cnt * cqe_size` bytes).
    pub cq: *mut u8,
    /// CQ doorbell record (big-endian consumer index at 0).
    pub cq_dbrec: *mut u32,
}

impl Mlx5Sim {
    /// A simulated SQ of `wqe_cnt` basic blocks and CQ of `cqe_cnt` 64-byte CQEs (powers of
    /// two).
    pub fn new(wqe_cnt: u32, cqe_cnt: u32, qpn: u32) -> Mlx5Sim {
        Self::with_cqe_size(wqe_cnt, cqe_cnt, qpn, 64)
    }

    /// [`new`](Self::new) with CQEs of `cqe_size` bytes: 64, or 128 (`MLX5_CQE_SIZE=128`:
    /// the 64-byte CQE's fields in the second half of each, the first half zero).
    pub fn with_cqe_size(wqe_cnt: u32, cqe_cnt: u32, qpn: u32, cqe_size: u32) -> Mlx5Sim {
        assert!(wqe_cnt.is_power_of_two() && cqe_cnt.is_power_of_two());
        assert!(cqe_size == 64 || cqe_size == 128, "CQE size {cqe_size}");
        let sz = cqe_size as usize;
        let cq = Region::new(cqe_cnt as usize * sz, 0);
        for i in 0..cqe_cnt as usize {
            // SAFETY: inside the CQ region (the owner byte ends each CQE).
            unsafe { cq.ptr.add(i * sz + sz - 1).write(0xf0) };
        }
        let sq = Region::new(wqe_cnt as usize * 64, POISON);
        let qp_db = Region::new(64, 0);
        // SAFETY: the regions live as long as the simulator, which owns the device.
        let dev =
            unsafe { SimDevice::new(sq.ptr, wqe_cnt, qp_db.ptr.cast(), cq.ptr, cqe_cnt, qpn) }
                .cqe_size(cqe_size);
        Mlx5Sim {
            sq,
            qp_db,
            bf: Region::new(4096, 0),
            wrid: vec![0; wqe_cnt as usize],
            cq,
            cq_db: Region::new(64, 0),
            wqe_cnt,
            cqe_cnt,
            cqe_size,
            qpn,
            dev,
        }
    }

    /// The raw pointers.
    pub fn ptrs(&mut self) -> SimPtrs {
        SimPtrs {
            sq: self.sq.ptr,
            qp_dbrec: self.qp_db.ptr.cast(),
            bf_reg: self.bf.ptr,
            wrid: self.wrid.as_mut_ptr(),
            cq: self.cq.ptr,
            cq_dbrec: self.cq_db.ptr.cast(),
        }
    }

    /// The SQ bytes.
    pub fn sq(&self) -> &[u8] {
        // SAFETY: the region holds wqe_cnt * 64 initialised bytes.
        unsafe { std::slice::from_raw_parts(self.sq.ptr, self.wqe_cnt as usize * 64) }
    }

    /// The send doorbell record, host order.
    pub fn sq_dbr(&self) -> u32 {
        // SAFETY: inside the doorbell region.
        u32::from_be(unsafe { self.qp_db.ptr.cast::<u32>().add(1).read_volatile() })
    }

    /// The CQ consumer index the poller published, host order.
    pub fn cq_ci(&self) -> u32 {
        // SAFETY: inside the doorbell region.
        u32::from_be(unsafe { self.cq_db.ptr.cast::<u32>().read_volatile() })
    }

    /// The BlueFlame register page.
    pub fn bf_page(&self) -> &[u8] {
        // SAFETY: 4096 initialised bytes.
        unsafe { std::slice::from_raw_parts(self.bf.ptr, 4096) }
    }

    /// The next WQE the device reads completes with `syndrome` (vendor syndrome `vendor`),
    /// and every later one is flushed.
    pub fn fail_next(&mut self, syndrome: u8, vendor: u8) {
        self.dev.fail_next(syndrome, vendor);
    }

    /// The device's QP went back to RESET: counters restart at 0 (the CQ keeps going).
    pub fn reset_qp(&mut self) {
        self.dev.reset_qp();
        // SAFETY: inside the doorbell region.
        unsafe { self.qp_db.ptr.cast::<u32>().add(1).write_volatile(0) };
    }

    /// Writes one CQE at the device's producer index.
    pub fn write_cqe(&mut self, op: u8, wqe_op: u8, wqe_counter: u16, syndrome: u8, vendor: u8) {
        self.dev
            .write_cqe(op, wqe_op, wqe_counter, syndrome, vendor);
    }

    /// [`write_cqe`](Self::write_cqe) for the QP `qpn` (a CQ several QPs share).
    pub fn write_cqe_of(&mut self, qpn: u32, op: u8, wqe_op: u8, wqe_counter: u16) {
        self.dev.write_cqe_of(qpn, op, wqe_op, wqe_counter, 0, 0);
    }

    /// Runs the device ([`SimDevice::process`]). Never inlined, so instruction counts
    /// attribute it to the device.
    #[inline(never)]
    pub fn process(&mut self) -> u32 {
        self.dev.process()
    }
}

/// The simulated device side over memory someone else owns (a [`Mlx5Sim`]'s, or the fake
/// objects of libmlx5's golden model): reads announced WQEs, writes CQEs.
#[derive(Debug)]
pub struct SimDevice {
    sq: *const u8,
    wqe_cnt: u32,
    sq_dbrec: *const u32,
    cq: *mut u8,
    cqe_cnt: u32,
    /// Bytes per CQE (64 or 128).
    cqe_size: usize,
    qpn: u32,
    /// `cur_post` up to which the device has read WQEs.
    dev_cur: u32,
    /// CQEs the device has written.
    dev_pi: u32,
    fail: Option<(u8, u8)>,
    in_error: bool,
}

// SAFETY: raw pointers to memory the owner keeps alive; &mut self serialises access.
unsafe impl Send for SimDevice {}

impl SimDevice {
    /// A device over an SQ of `wqe_cnt` basic blocks at `sq` with the QP doorbell record
    /// `sq_dbrec` (send counter at index 1), and a CQ of `cqe_cnt` 64-byte CQEs at `cq`.
    ///
    /// # Safety
    /// The memory is valid (and the CQ writable) for as long as the device is used.
    pub unsafe fn new(
        sq: *const u8,
        wqe_cnt: u32,
        sq_dbrec: *const u32,
        cq: *mut u8,
        cqe_cnt: u32,
        qpn: u32,
    ) -> SimDevice {
        SimDevice {
            sq,
            wqe_cnt,
            sq_dbrec,
            cq,
            cqe_cnt,
            cqe_size: 64,
            qpn,
            dev_cur: 0,
            dev_pi: 0,
            fail: None,
            in_error: false,
        }
    }

    /// The same device over a CQ of `bytes`-byte CQEs (64 or 128: the 64-byte CQE in the
    /// second half of each, as the hardware writes them with `MLX5_CQE_SIZE=128`); the CQ
    /// memory must hold `cqe_cnt * bytes` bytes.
    pub fn cqe_size(mut self, bytes: u32) -> SimDevice {
        assert!(bytes == 64 || bytes == 128, "CQE size {bytes}");
        self.cqe_size = bytes as usize;
        self
    }

    /// The next WQE the device reads completes with `syndrome` (vendor syndrome `vendor`),
    /// and every later one is flushed.
    pub fn fail_next(&mut self, syndrome: u8, vendor: u8) {
        self.fail = Some((syndrome, vendor));
    }

    /// The QP went back to RESET: the WQE counter restarts at 0.
    pub fn reset_qp(&mut self) {
        self.dev_cur = 0;
        self.in_error = false;
        self.fail = None;
    }

    /// Writes one CQE at the device's producer index.
    pub fn write_cqe(&mut self, op: u8, wqe_op: u8, wqe_counter: u16, syndrome: u8, vendor: u8) {
        self.write_cqe_of(self.qpn, op, wqe_op, wqe_counter, syndrome, vendor);
    }

    /// [`write_cqe`](Self::write_cqe) for the QP `qpn`.
    pub fn write_cqe_of(
        &mut self,
        qpn: u32,
        op: u8,
        wqe_op: u8,
        wqe_counter: u16,
        syndrome: u8,
        vendor: u8,
    ) {
        let i = (self.dev_pi & (self.cqe_cnt - 1)) as usize;
        let mut c = [0u8; 64];
        c[56..60].copy_from_slice(&((wqe_op as u32) << 24 | qpn).to_be_bytes());
        c[60..62].copy_from_slice(&wqe_counter.to_be_bytes());
        c[44..48].copy_from_slice(&32u32.to_be_bytes());
        if op == 13 {
            c[54] = vendor;
            c[55] = syndrome;
        }
        c[63] = op << 4 | ((self.dev_pi & self.cqe_cnt) != 0) as u8;
        // SAFETY: CQE i is inside the CQ (new's contract), its fields in its last 64 bytes;
        // the owner byte is written last.
        unsafe {
            let p = self.cq.add(i * self.cqe_size + self.cqe_size - 64);
            std::ptr::copy_nonoverlapping(c.as_ptr(), p, 63);
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
            p.add(63).write_volatile(c[63]);
        }
        self.dev_pi = self.dev_pi.wrapping_add(1);
    }

    /// Runs the device: every WQE announced by the doorbell record since the last call
    /// is "executed" and completed (see the [module docs](self)). Returns how many CQEs it
    /// wrote.
    #[inline(never)]
    pub fn process(&mut self) -> u32 {
        // SAFETY: the doorbell record (new's contract).
        let target = u32::from_be(unsafe { self.sq_dbrec.add(1).read_volatile() }) & 0xffff;
        let mut n = 0;
        while self.dev_cur & 0xffff != target {
            let idx = (self.dev_cur & (self.wqe_cnt - 1)) as usize;
            let mut w = [0u8; 16];
            // SAFETY: a ctrl segment inside the SQ (new's contract).
            unsafe { std::ptr::copy_nonoverlapping(self.sq.add(idx * 64), w.as_mut_ptr(), 16) };
            let oio = u32::from_be_bytes(w[0..4].try_into().unwrap());
            let ds = u32::from_be_bytes(w[4..8].try_into().unwrap()) & 0x3f;
            let signaled = w[11] & 0x08 != 0;
            let wqe_op = (oio & 0xff) as u8;
            let ctr = ((oio >> 8) & 0xffff) as u16;
            assert_eq!(
                ctr,
                (self.dev_cur & 0xffff) as u16,
                "WQE index out of order"
            );
            if let Some((s, v)) = self.fail.take() {
                self.write_cqe(13, wqe_op, ctr, s, v);
                self.in_error = true;
                n += 1;
            } else if self.in_error {
                self.write_cqe(13, wqe_op, ctr, 0x05, 0);
                n += 1;
            } else if signaled {
                self.write_cqe(0, wqe_op, ctr, 0, 0);
                n += 1;
            }
            self.dev_cur = self.dev_cur.wrapping_add(ds.div_ceil(4).max(1));
        }
        n
    }
}

/// One write to a doorbell register of softnic's mlx5 personality
/// ([`Config::mlx5`](crate::Config::mlx5)), as the device saw it; see
/// [`register_writes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisterWrite {
    /// The BlueFlame buffer written: 0 or 256 (`bf.size`) from `bf.reg`.
    pub offset: u32,
    /// The QP number the doorbell's ctrl segment names (for a libmlx5 post, its QP).
    pub qp_num: u32,
    /// The WQE counter the ctrl segment names (0 for a libmlx5 post, which softnic's
    /// verbs make without a WQE).
    pub wqe_counter: u16,
    /// A BlueFlame copy (the WQE past its first 16 bytes), not the 8-byte doorbell alone.
    pub blueflame: bool,
    /// For a BlueFlame copy: its bytes equal the WQE in the QP's send queue.
    pub copy_matches: bool,
    /// The QP named is one that rings this register.
    pub qp_of_register: bool,
    /// Made by a post through softnic's verbs (standing for libmlx5's `post_send_db`),
    /// not by a direct ring's stores.
    pub by_libmlx5: bool,
}

/// The writes to `qp`'s doorbell register (shared with the other QPs of its context, or
/// its thread domain's) since the last call, in order, after reading the register once
/// more. Only writes the device saw are there: two writes to one buffer between two steps
/// of the device ([`crate::mlx5_step`], every direct poll) show as the second alone.
///
/// # Safety
/// `qp` is a live QP of a softnic context with the mlx5 personality.
pub unsafe fn register_writes(qp: *mut hotverbs_ffi::ibv_qp) -> Vec<RegisterWrite> {
    let f = crate::fabric::lock();
    // SAFETY: a live softnic QP (caller): its handle is its index.
    let qi = unsafe { (*qp).handle } as usize;
    if !matches!(f.qps.get(qi), Some(Some(q)) if q.mlx5) {
        return Vec::new();
    }
    f.dv_scan_regs();
    f.dv_reg(qi).take_log()
}
