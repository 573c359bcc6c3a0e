//! The counting test device: a minimal provider behind the verbs ABI for benches and unit
//! tests of the datapath.
//!
//! It owns a real `ibv_context` whose `ops.post_send` / `post_recv` / `post_srq_recv` /
//! `poll_cq` / `req_notify_cq` are this module's `extern "C"` functions, and one `ibv_qp`,
//! `ibv_cq` and `ibv_srq` pointing at it, so `hotverbs_ffi::inline::ibv_post_send` reaches it
//! exactly as it reaches a hardware provider. `post_send` walks the chain and queues one
//! `IBV_WC_SUCCESS` completion (with `wr_id` and opcode) per signaled WR (every WR with
//! `sq_sig_all`); it checks nothing else and moves no data. `poll_cq` hands completions back.
//! Receives are counted and remembered (their `wr_id`s) so tests can complete them.
//!
//! Nothing allocates after [`CountingDevice::new`]: completions and posted receives live in
//! fixed rings allocated there; state sits behind a tiny spin lock (uncontended: one CAS),
//! so a poster and a poller thread may use the device at once.
//!
//! Test hooks model what a real device does on errors: a rejected post at a chain index
//! ([`fail_next_post`](CountingDevice::fail_next_post)), an error completion that moves the
//! QP to the error state ([`fail_next_wr`](CountingDevice::fail_next_wr)), after which every
//! WR and every posted receive completes with `IBV_WC_WR_FLUSH_ERR`, and a RESET
//! ([`reset_qp`](CountingDevice::reset_qp)) that drops posted receives without completions and
//! leaves completions already queued in the CQ (a datapath must recognise them as stale).
//! A loopback mode makes each SEND / SEND_WITH_IMM / RDMA_WRITE_WITH_IMM consume the oldest
//! posted receive and queue its receive completion (`IBV_WC_RNR_RETRY_EXC_ERR` if none).
//!
//! The SRQ is a queue of its own, as in the IBA: receives posted to it are not flushed when
//! the QP enters the error state and survive a QP RESET. The QP consumes receives from its
//! own receive queue, or from the SRQ after [`use_srq`](CountingDevice::use_srq) (as a QP
//! created with `init_attr.srq`).
//!
//! # Invariants (raw pointers)
//! The device is one heap allocation that never moves (`Pin<Box<_>>`, `!Unpin`). Every
//! pointer it hands out or stores in its verbs structs (`qp->context`, `cq->context`,
//! `qp->send_cq`, the results of [`CountingDevice::qp`] etc.) is derived from a raw pointer
//! to the *whole* device (`Box::into_raw` in `new`, `ptr::from_ref(self)` in the getters),
//! never from a reference to one field, so the callbacks' `container_of` cast from
//! `context` back to the device keeps provenance over all of it (Stacked and Tree Borrows
//! alike; checked under miri by `tests/soundness.rs` and the datapath's counting tests).
//! After construction, the device is only written through `UnsafeCell`s and atomics, so
//! shared references to it may coexist with those pointers.

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use core::marker::PhantomPinned;
use core::ptr;
use std::boxed::Box;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::vec::Vec;

use hotverbs_ffi::*;

/// A fixed-capacity FIFO (allocated once).
struct Fifo<T: Copy> {
    buf: Vec<T>,
    head: usize,
    len: usize,
}

impl<T: Copy> Fifo<T> {
    fn new(cap: usize, fill: T) -> Self {
        Self {
            buf: std::vec![fill; cap.max(1)],
            head: 0,
            len: 0,
        }
    }
    fn push(&mut self, v: T) -> bool {
        if self.len == self.buf.len() {
            return false;
        }
        let i = (self.head + self.len) % self.buf.len();
        self.buf[i] = v;
        self.len += 1;
        true
    }
    fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let v = self.buf[self.head];
        self.head = (self.head + 1) % self.buf.len();
        self.len -= 1;
        Some(v)
    }
}

struct Inner {
    /// Completions and their raw timestamps (the device's completion ordinal, see
    /// [`CountingDevice::cq_ex`]).
    cqes: Fifo<(ibv_wc, u64)>,
    /// Completions made since creation: the raw timestamp of the next one.
    clock: u64,
    recvs: Fifo<u64>,
    srq_recvs: Fifo<u64>,
    /// The QP takes its receives from the SRQ.
    use_srq: bool,
    qp_error: bool,
    sq_sig_all: bool,
    loopback: bool,
    fail_post: Option<(c_int, usize)>,
    /// The next post verb fails with this errno and `bad_wr` NULL, queuing the chain anyway.
    fail_unnamed: Option<c_int>,
    fail_wr: Option<ibv_wc_status>,
    overflows: u64,
}

impl Inner {
    fn push_cqe(
        &mut self,
        wr_id: u64,
        status: ibv_wc_status,
        opcode: ibv_wc_opcode,
        byte_len: u32,
        imm: Option<u32>,
    ) {
        // SAFETY: ibv_wc is plain data; all-zero is valid.
        let mut wc: ibv_wc = unsafe { core::mem::zeroed() };
        wc.wr_id = wr_id;
        wc.status = status;
        wc.opcode = opcode;
        wc.byte_len = byte_len;
        wc.qp_num = QP_NUM;
        if let Some(imm) = imm {
            wc.wc_flags = IBV_WC_WITH_IMM;
            wc.__bindgen_anon_1.imm_data = imm.to_be();
        }
        self.clock += 1;
        if !self.cqes.push((wc, self.clock)) {
            self.overflows += 1;
        }
    }

    /// One send WR the device accepted (from `post_send` or `ibv_wr_complete`): queue its
    /// completions as the module docs say. `len` is the payload length (read only in
    /// loopback mode), `imm` the immediate of the `*_WITH_IMM` opcodes (host order).
    fn accept_send(
        &mut self,
        wr_id: u64,
        opcode: ibv_wr_opcode,
        send_flags: u32,
        len: u32,
        imm: Option<u32>,
    ) {
        if self.qp_error {
            self.push_cqe(wr_id, IBV_WC_WR_FLUSH_ERR, wc_opcode(opcode), 0, None);
            return;
        }
        if let Some(status) = self.fail_wr.take() {
            self.push_cqe(wr_id, status, wc_opcode(opcode), 0, None);
            self.enter_error();
            return;
        }
        if self.loopback
            && matches!(
                opcode,
                IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE_WITH_IMM
            )
        {
            let op = if opcode == IBV_WR_RDMA_WRITE_WITH_IMM {
                IBV_WC_RECV_RDMA_WITH_IMM
            } else {
                IBV_WC_RECV
            };
            match self.qp_recvs().pop() {
                Some(id) => self.push_cqe(id, IBV_WC_SUCCESS, op, len, imm),
                None => {
                    self.push_cqe(wr_id, IBV_WC_RNR_RETRY_EXC_ERR, wc_opcode(opcode), 0, None);
                    self.enter_error();
                    return;
                }
            }
        }
        if self.sq_sig_all || send_flags & IBV_SEND_SIGNALED != 0 {
            self.push_cqe(wr_id, IBV_WC_SUCCESS, wc_opcode(opcode), 0, None);
        }
    }

    /// The receive queue the QP consumes from.
    fn qp_recvs(&mut self) -> &mut Fifo<u64> {
        if self.use_srq {
            &mut self.srq_recvs
        } else {
            &mut self.recvs
        }
    }

    /// The QP enters the error state: receives posted to its own receive queue complete
    /// with FLUSH_ERR (the SRQ's stay posted).
    fn enter_error(&mut self) {
        self.qp_error = true;
        while let Some(id) = self.recvs.pop() {
            self.push_cqe(id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, None);
        }
    }
}

/// The QP number the device reports.
pub const QP_NUM: u32 = 0x11;

/// The counting device: one context, QP, CQ and SRQ. Always used pinned (the verbs
/// objects point at each other).
#[repr(C)]
#[allow(missing_debug_implementations)] // a test device of raw verbs objects; its counters have getters
pub struct CountingDevice {
    // Must stay the first field: `qp->context` etc. point here and the callbacks cast it
    // back to the device.
    ctx: UnsafeCell<ibv_context>,
    qp: UnsafeCell<ibv_qp>,
    cq: UnsafeCell<ibv_cq>,
    srq: UnsafeCell<ibv_srq>,
    /// The same QP as an extended QP (`ibv_qp_ex`, its own `qp_base`; see
    /// [`qp_ex`](Self::qp_ex)).
    qpx: UnsafeCell<ibv_qp_ex>,
    /// The same CQ as an extended CQ (see [`cq_ex`](Self::cq_ex)).
    cqx: UnsafeCell<ibv_cq_ex>,
    /// The open `ibv_wr_start` region: used only by the QP's poster (`ibv_wr_post(3)`: a
    /// region is single-threaded), never under the lock.
    ex_sq: UnsafeCell<ExSq>,
    /// The extended poll in progress: used only by the CQ's poller.
    ex_cq: UnsafeCell<ExCq>,
    lock: AtomicBool,
    inner: UnsafeCell<Inner>,
    send_wrs: AtomicU64,
    doorbells: AtomicU64,
    recv_wrs: AtomicU64,
    recv_doorbells: AtomicU64,
    polls: AtomicU64,
    next_polls: AtomicU64,
    wr_aborts: AtomicU64,
    _pin: PhantomPinned,
}

/// One WR built between `ibv_wr_start` and `ibv_wr_complete`.
#[derive(Clone, Copy)]
struct ExWr {
    wr_id: u64,
    opcode: ibv_wr_opcode,
    flags: u32,
    len: u32,
    imm: Option<u32>,
}

/// The poster's open region: the WRs built so far (room for as many as the CQ holds,
/// allocated once), and the first error a builder met (reported by `ibv_wr_complete`).
struct ExSq {
    wrs: Vec<ExWr>,
    open: bool,
    err: c_int,
}

/// The completion an extended poll is on, and its raw timestamp.
struct ExCq {
    cur: ibv_wc,
    ts: u64,
}

// SAFETY: all mutable state is behind the spin lock (`inner`) or atomic; the verbs structs
// are written only during construction.
unsafe impl Sync for CountingDevice {}
// SAFETY: as above; nothing is tied to the creating thread.
unsafe impl Send for CountingDevice {}

impl CountingDevice {
    /// A device whose CQ (and receive queue) hold `cq_capacity` entries.
    pub fn new(cq_capacity: usize) -> Pin<Box<Self>> {
        // SAFETY: ibv_wc is plain data; all-zero is valid. The verbs structs below are plain
        // C data too (integers, pointers, pthread objects whose all-zero pattern is their
        // static initialiser).
        let wc_fill: ibv_wc = unsafe { core::mem::zeroed() };
        let dev = Box::new(CountingDevice {
            // SAFETY: see above.
            ctx: UnsafeCell::new(unsafe { core::mem::zeroed() }),
            // SAFETY: see above.
            qp: UnsafeCell::new(unsafe { core::mem::zeroed() }),
            // SAFETY: see above.
            cq: UnsafeCell::new(unsafe { core::mem::zeroed() }),
            // SAFETY: see above.
            srq: UnsafeCell::new(unsafe { core::mem::zeroed() }),
            lock: AtomicBool::new(false),
            inner: UnsafeCell::new(Inner {
                cqes: Fifo::new(cq_capacity, (wc_fill, 0)),
                clock: 0,
                recvs: Fifo::new(cq_capacity, 0),
                srq_recvs: Fifo::new(cq_capacity, 0),
                use_srq: false,
                qp_error: false,
                sq_sig_all: false,
                loopback: false,
                fail_post: None,
                fail_unnamed: None,
                fail_wr: None,
                overflows: 0,
            }),
            send_wrs: AtomicU64::new(0),
            doorbells: AtomicU64::new(0),
            recv_wrs: AtomicU64::new(0),
            recv_doorbells: AtomicU64::new(0),
            polls: AtomicU64::new(0),
            next_polls: AtomicU64::new(0),
            wr_aborts: AtomicU64::new(0),
            // SAFETY: see above.
            qpx: UnsafeCell::new(unsafe { core::mem::zeroed() }),
            // SAFETY: see above.
            cqx: UnsafeCell::new(unsafe { core::mem::zeroed() }),
            ex_sq: UnsafeCell::new(ExSq {
                wrs: Vec::with_capacity(cq_capacity.max(1)),
                open: false,
                err: 0,
            }),
            ex_cq: UnsafeCell::new(ExCq {
                cur: wc_fill,
                ts: 0,
            }),
            _pin: PhantomPinned,
        });
        // The one raw pointer to the whole device every ABI pointer is derived from (see
        // the invariants above): its provenance covers the device, so the callbacks' cast
        // from `qp->context` back to the device stays inside it.
        let this = Box::into_raw(dev);
        // SAFETY: `this` is a fresh, unique heap allocation (nobody else can see it yet);
        // the field projections go through raw places, creating no references.
        unsafe {
            let ctx = Self::ctx_of(this);
            (*ctx).ops.post_send = Some(post_send);
            (*ctx).ops.post_recv = Some(post_recv);
            (*ctx).ops.post_srq_recv = Some(post_srq_recv);
            (*ctx).ops.poll_cq = Some(poll_cq);
            (*ctx).ops.req_notify_cq = Some(req_notify_cq);
            (*ctx).cmd_fd = -1;
            (*ctx).async_fd = -1;
            let cq = UnsafeCell::raw_get(ptr::addr_of!((*this).cq));
            (*cq).context = ctx;
            (*cq).cqe = cq_capacity as c_int;
            let qp = UnsafeCell::raw_get(ptr::addr_of!((*this).qp));
            (*qp).context = ctx;
            (*qp).send_cq = cq;
            (*qp).recv_cq = cq;
            (*qp).qp_num = QP_NUM;
            (*qp).state = IBV_QPS_RTS;
            (*qp).qp_type = IBV_QPT_RC;
            let srq = UnsafeCell::raw_get(ptr::addr_of!((*this).srq));
            (*srq).context = ctx;
            let qpx = UnsafeCell::raw_get(ptr::addr_of!((*this).qpx));
            (*qpx).qp_base.context = ctx;
            (*qpx).qp_base.send_cq = cq;
            (*qpx).qp_base.recv_cq = cq;
            (*qpx).qp_base.qp_num = QP_NUM;
            (*qpx).qp_base.state = IBV_QPS_RTS;
            (*qpx).qp_base.qp_type = IBV_QPT_RC;
            (*qpx).wr_start = Some(ex_wr_start);
            (*qpx).wr_complete = Some(ex_wr_complete);
            (*qpx).wr_abort = Some(ex_wr_abort);
            (*qpx).wr_send = Some(ex_wr_send);
            (*qpx).wr_send_imm = Some(ex_wr_send_imm);
            (*qpx).wr_rdma_write = Some(ex_wr_rdma_write);
            (*qpx).wr_rdma_write_imm = Some(ex_wr_rdma_write_imm);
            (*qpx).wr_rdma_read = Some(ex_wr_rdma_read);
            (*qpx).wr_atomic_fetch_add = Some(ex_wr_atomic_fetch_add);
            (*qpx).wr_atomic_cmp_swp = Some(ex_wr_atomic_cmp_swp);
            (*qpx).wr_set_sge = Some(ex_wr_set_sge);
            (*qpx).wr_set_sge_list = Some(ex_wr_set_sge_list);
            (*qpx).wr_set_inline_data = Some(ex_wr_set_inline_data);
            (*qpx).wr_set_ud_addr = Some(ex_wr_set_ud_addr);
            let cqx = UnsafeCell::raw_get(ptr::addr_of!((*this).cqx));
            (*cqx).context = ctx;
            (*cqx).cqe = cq_capacity as c_int;
            (*cqx).start_poll = Some(ex_start_poll);
            (*cqx).next_poll = Some(ex_next_poll);
            (*cqx).end_poll = Some(ex_end_poll);
            (*cqx).read_opcode = Some(ex_read_opcode);
            (*cqx).read_vendor_err = Some(ex_read_vendor_err);
            (*cqx).read_byte_len = Some(ex_read_byte_len);
            (*cqx).read_imm_data = Some(ex_read_imm_data);
            (*cqx).read_qp_num = Some(ex_read_qp_num);
            (*cqx).read_src_qp = Some(ex_read_src_qp);
            (*cqx).read_wc_flags = Some(ex_read_wc_flags);
            (*cqx).read_slid = Some(ex_read_slid);
            (*cqx).read_sl = Some(ex_read_sl);
            (*cqx).read_dlid_path_bits = Some(ex_read_dlid_path_bits);
            (*cqx).read_completion_ts = Some(ex_read_completion_ts);
        }
        // SAFETY: `this` came from `Box::into_raw` above and is turned back into a Box
        // once. The device is `!Unpin` (PhantomPinned), so it never moves out of this
        // allocation; and a `Box` of a `!Unpin` type asserts no uniqueness (it is not
        // `noalias`), so the pointers derived from `this` above stay valid alongside it.
        unsafe { Pin::new_unchecked(Box::from_raw(this)) }
    }

    /// `&(*this).ctx` as a raw pointer with `this`'s provenance (the whole device).
    ///
    /// # Safety
    /// `this` points to a live device.
    unsafe fn ctx_of(this: *const CountingDevice) -> *mut ibv_context {
        // SAFETY: in bounds of the live device (caller); no reference is created.
        UnsafeCell::raw_get(unsafe { ptr::addr_of!((*this).ctx) })
    }

    /// The QP (`sq_sig_all = 0` unless [`set_sq_sig_all`](Self::set_sq_sig_all)).
    pub fn qp(&self) -> *mut ibv_qp {
        // SAFETY: projection inside the live device; no reference is created.
        UnsafeCell::raw_get(unsafe { ptr::addr_of!((*ptr::from_ref(self)).qp) })
    }
    /// The CQ (send and receive completions).
    pub fn cq(&self) -> *mut ibv_cq {
        // SAFETY: projection inside the live device; no reference is created.
        UnsafeCell::raw_get(unsafe { ptr::addr_of!((*ptr::from_ref(self)).cq) })
    }
    /// The SRQ (a queue of its own; the QP consumes from it after
    /// [`use_srq`](Self::use_srq)).
    pub fn srq(&self) -> *mut ibv_srq {
        // SAFETY: projection inside the live device; no reference is created.
        UnsafeCell::raw_get(unsafe { ptr::addr_of!((*ptr::from_ref(self)).srq) })
    }
    /// The QP as an extended QP (`ibv_qp_ex`, as `ibv_qp_to_qp_ex` would return): the same
    /// send queue, counters and completions as [`qp`](Self::qp), posted through
    /// `ibv_wr_start` / `ibv_wr_*` / `ibv_wr_complete`. Every builder of the RC opcodes
    /// SEND, SEND_WITH_IMM, RDMA_WRITE(_WITH_IMM), RDMA_READ, ATOMIC_FETCH_AND_ADD and
    /// ATOMIC_CMP_AND_SWP is filled, plus `wr_set_sge`, `wr_set_sge_list`,
    /// `wr_set_inline_data` and `wr_set_ud_addr` (accepted, not checked); the others are
    /// NULL, as for a QP created without them in `send_ops_flags`.
    ///
    /// `ibv_wr_complete` is all or nothing, as `ibv_wr_post(3)` says: it counts one doorbell
    /// and accepts every WR of the region (each then completes as a `post_send` WR would),
    /// or none: after [`fail_next_post`](Self::fail_next_post) (whatever its index) or when
    /// the region held more WRs than the CQ's capacity (`ENOMEM`, as a full SQ).
    pub fn qp_ex(&self) -> *mut ibv_qp_ex {
        // SAFETY: projection inside the live device; no reference is created.
        UnsafeCell::raw_get(unsafe { ptr::addr_of!((*ptr::from_ref(self)).qpx) })
    }
    /// The CQ as an extended CQ (`ibv_cq_ex`): the same completions as [`cq`](Self::cq),
    /// polled with `ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll`; every reader is
    /// filled (as for a CQ created with all `wc_flags`) but `read_cvlan`, `read_flow_tag`,
    /// `read_tm_info` and `read_completion_wallclock_ns`. The device has no clock:
    /// `ibv_wc_read_completion_ts` returns the completion's ordinal (1 for the first
    /// completion the device made, 2 for the next, ...), a raw, monotonic timestamp.
    pub fn cq_ex(&self) -> *mut ibv_cq_ex {
        // SAFETY: projection inside the live device; no reference is created.
        UnsafeCell::raw_get(unsafe { ptr::addr_of!((*ptr::from_ref(self)).cqx) })
    }
    /// `ibv_wr_abort` calls since creation.
    pub fn wr_aborts(&self) -> u64 {
        self.wr_aborts.load(Ordering::Relaxed)
    }
    /// True while an `ibv_wr_start` region is open on [`qp_ex`](Self::qp_ex). Call it only
    /// from the thread that posts (the region is that thread's).
    pub fn wr_region_open(&self) -> bool {
        // SAFETY: the region state is the poster's (this method's contract: called from the
        // posting thread), read through the cell without a lasting reference.
        unsafe { (*self.ex_sq.get()).open }
    }

    /// The context.
    pub fn context(&self) -> *mut ibv_context {
        // SAFETY: self is a live device.
        unsafe { Self::ctx_of(ptr::from_ref(self)) }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
        // SAFETY: the lock is held (Acquire above pairs with the Release below), so this is
        // the only reference to `inner`.
        let r = f(unsafe { &mut *self.inner.get() });
        self.lock.store(false, Ordering::Release);
        r
    }

    /// Send WRs accepted by `post_send` since creation.
    pub fn send_wrs(&self) -> u64 {
        self.send_wrs.load(Ordering::Relaxed)
    }
    /// `post_send` calls (doorbells) since creation, including rejected ones.
    pub fn doorbells(&self) -> u64 {
        self.doorbells.load(Ordering::Relaxed)
    }
    /// Receive WRs accepted since creation (QP and SRQ).
    pub fn recv_wrs(&self) -> u64 {
        self.recv_wrs.load(Ordering::Relaxed)
    }
    /// `post_recv` + `post_srq_recv` calls since creation.
    pub fn recv_doorbells(&self) -> u64 {
        self.recv_doorbells.load(Ordering::Relaxed)
    }
    /// `poll_cq` calls since creation.
    pub fn polls(&self) -> u64 {
        self.polls.load(Ordering::Relaxed)
    }
    /// `ibv_next_poll` calls on the extended CQ since creation.
    pub fn next_polls(&self) -> u64 {
        self.next_polls.load(Ordering::Relaxed)
    }
    /// Completions dropped because the CQ was full (a real CQ would overrun).
    pub fn cq_overflows(&self) -> u64 {
        self.with(|i| i.overflows)
    }
    /// Completions waiting in the CQ.
    pub fn queued_cqes(&self) -> usize {
        self.with(|i| i.cqes.len)
    }
    /// Receives posted (to the QP's receive queue and to the SRQ) and not yet consumed.
    pub fn posted_recvs(&self) -> usize {
        self.with(|i| i.recvs.len + i.srq_recvs.len)
    }
    /// Receives posted to the SRQ and not yet consumed.
    pub fn posted_srq_recvs(&self) -> usize {
        self.with(|i| i.srq_recvs.len)
    }
    /// The QP takes its receives from the SRQ (`on`) or from its own receive queue.
    pub fn use_srq(&self, on: bool) {
        self.with(|i| i.use_srq = on)
    }
    /// True while the QP is in the error state.
    pub fn qp_in_error(&self) -> bool {
        self.with(|i| i.qp_error)
    }

    /// Signal every WR, as a QP created with `sq_sig_all = 1`.
    pub fn set_sq_sig_all(&self, on: bool) {
        self.with(|i| i.sq_sig_all = on)
    }
    /// Loopback: each SEND / SEND_WITH_IMM / RDMA_WRITE_WITH_IMM consumes a posted receive.
    pub fn set_loopback(&self, on: bool) {
        self.with(|i| i.loopback = on)
    }
    /// The next `post_send` rejects the WR at `index` of its chain with `errno` (the WRs
    /// before it are accepted), as a provider does for a full SQ (ENOMEM) or a bad WR.
    pub fn fail_next_post(&self, errno: c_int, index: usize) {
        self.with(|i| i.fail_post = Some((errno, index)))
    }
    /// The next post verb (`post_send`, `post_recv` or `post_srq_recv`) returns `errno` with
    /// `*bad_wr` NULL although it queued the whole chain, as rxe does before RTS
    /// (fault-truth S1): a caller cannot know which WRs the device took.
    pub fn fail_next_post_unnamed(&self, errno: c_int) {
        self.with(|i| i.fail_unnamed = Some(errno))
    }
    /// The next accepted send WR completes with `status` (signaled or not) and the QP
    /// enters the error state.
    pub fn fail_next_wr(&self, status: ibv_wc_status) {
        self.with(|i| i.fail_wr = Some(status))
    }
    /// Moves the QP to the error state now (receives posted to its own queue are flushed;
    /// the SRQ's stay posted).
    pub fn set_qp_error(&self) {
        self.with(|i| i.enter_error())
    }
    /// Moves the QP through RESET back to RTS: receives posted to its own queue vanish
    /// without completions (the SRQ's stay posted); completions already in the CQ stay.
    pub fn reset_qp(&self) {
        self.with(|i| {
            i.qp_error = false;
            while i.recvs.pop().is_some() {}
        })
    }
    /// Completes the oldest receive the QP consumes from (its own queue, or the SRQ after
    /// [`use_srq`](Self::use_srq)) as if a message of `byte_len` bytes (with `imm`)
    /// arrived. Returns false if no receive was posted there.
    pub fn complete_recv(&self, byte_len: u32, imm: Option<u32>) -> bool {
        self.with(|i| match i.qp_recvs().pop() {
            Some(id) => {
                i.push_cqe(id, IBV_WC_SUCCESS, IBV_WC_RECV, byte_len, imm);
                true
            }
            None => false,
        })
    }

    /// The device a `context` pointer of one of its objects belongs to (`container_of`).
    ///
    /// # Safety
    /// `p` is the `context` pointer of one of this module's objects (as stored by
    /// [`new`](Self::new), so its provenance is the whole device), and the device outlives
    /// the returned reference.
    unsafe fn from_ctx<'a>(p: *mut ibv_context) -> &'a CountingDevice {
        // SAFETY: `ctx` is the first field of the repr(C) device, so the context pointer
        // is the device's address; it was derived from the pointer to the whole device
        // (`new`), so the cast keeps provenance over all of it; the device is pinned and
        // outlives its verbs objects (caller's contract). Every field written after
        // construction is an UnsafeCell or atomic, so a shared reference is enough.
        unsafe { &*p.cast_const().cast::<CountingDevice>() }
    }
}

fn wc_opcode(op: ibv_wr_opcode) -> ibv_wc_opcode {
    match op {
        IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => IBV_WC_RDMA_WRITE,
        IBV_WR_RDMA_READ => IBV_WC_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP => IBV_WC_COMP_SWAP,
        IBV_WR_ATOMIC_FETCH_AND_ADD => IBV_WC_FETCH_ADD,
        _ => IBV_WC_SEND,
    }
}

/// `ops.post_send`.
///
/// # Safety
/// As `ibv_post_send(3)`: `qp` is this device's QP, `wr` a valid NULL-terminated chain
/// (each `sg_list` holding `num_sge` entries) and `bad` writable.
unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: qp is this device's QP (the ops table is only reachable through it).
    let dev = unsafe { CountingDevice::from_ctx((*qp).context) };
    dev.doorbells.fetch_add(1, Ordering::Relaxed);
    dev.with(|inner| {
        let mut index = 0usize;
        let mut accepted = 0u64;
        let rc = loop {
            if wr.is_null() {
                break 0;
            }
            if let Some((errno, at)) = inner.fail_post {
                if at == index {
                    inner.fail_post = None;
                    // SAFETY: `bad` is writable per ibv_post_send(3).
                    unsafe { *bad = wr };
                    break errno;
                }
            }
            // SAFETY: the caller passes a valid chain (ibv_post_send(3)).
            let w = unsafe { &*wr };
            accepted += 1;
            let mut len = 0u32;
            if inner.loopback {
                for s in 0..w.num_sge.max(0) as usize {
                    // SAFETY: sg_list holds num_sge entries.
                    len += unsafe { (*w.sg_list.add(s)).length };
                }
            }
            let imm = match w.opcode {
                IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE_WITH_IMM => {
                    // SAFETY: imm_data is the member used by the *_WITH_IMM opcodes.
                    Some(u32::from_be(unsafe { w.__bindgen_anon_1.imm_data }))
                }
                _ => None,
            };
            inner.accept_send(w.wr_id, w.opcode, w.send_flags, len, imm);
            wr = w.next;
            index += 1;
        };
        dev.send_wrs.fetch_add(accepted, Ordering::Relaxed);
        match inner.fail_unnamed.take() {
            Some(errno) if rc == 0 => {
                // SAFETY: `bad` is writable per ibv_post_send(3).
                unsafe { *bad = ptr::null_mut() };
                errno
            }
            other => {
                inner.fail_unnamed = other;
                rc
            }
        }
    })
}

fn post_recv_common(
    dev: &CountingDevice,
    srq: bool,
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    dev.recv_doorbells.fetch_add(1, Ordering::Relaxed);
    dev.with(|inner| {
        let mut accepted = 0;
        let rc = loop {
            if wr.is_null() {
                break 0;
            }
            // SAFETY: the caller passes a valid chain (ibv_post_recv(3)).
            let w = unsafe { &*wr };
            let queued = if srq {
                // The SRQ does not depend on any QP's state.
                inner.srq_recvs.push(w.wr_id)
            } else if inner.qp_error {
                inner.push_cqe(w.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, None);
                true
            } else {
                inner.recvs.push(w.wr_id)
            };
            if !queued {
                // SAFETY: `bad` is writable per ibv_post_recv(3).
                unsafe { *bad = wr };
                break libc::ENOMEM;
            }
            accepted += 1;
            wr = w.next;
        };
        dev.recv_wrs.fetch_add(accepted, Ordering::Relaxed);
        match inner.fail_unnamed.take() {
            Some(errno) if rc == 0 => {
                // SAFETY: `bad` is writable per ibv_post_recv(3).
                unsafe { *bad = ptr::null_mut() };
                errno
            }
            other => {
                inner.fail_unnamed = other;
                rc
            }
        }
    })
}

/// `ops.post_recv`.
///
/// # Safety
/// As `ibv_post_recv(3)`: `qp` is this device's QP, `wr` a valid NULL-terminated chain and
/// `bad` writable.
unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: qp is this device's QP (caller's contract).
    post_recv_common(
        unsafe { CountingDevice::from_ctx((*qp).context) },
        false,
        wr,
        bad,
    )
}

/// `ops.post_srq_recv`.
///
/// # Safety
/// As `ibv_post_srq_recv(3)`: `srq` is this device's SRQ, `wr` a valid NULL-terminated
/// chain and `bad` writable.
unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: srq is this device's SRQ (caller's contract).
    post_recv_common(
        unsafe { CountingDevice::from_ctx((*srq).context) },
        true,
        wr,
        bad,
    )
}

/// `ops.poll_cq`.
///
/// # Safety
/// As `ibv_poll_cq(3)`: `cq` is this device's CQ and `wc` has room for `n` entries.
unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: cq is this device's CQ.
    let dev = unsafe { CountingDevice::from_ctx((*cq).context) };
    dev.polls.fetch_add(1, Ordering::Relaxed);
    if n <= 0 {
        return 0;
    }
    dev.with(|inner| {
        let mut got = 0;
        while got < n {
            match inner.cqes.pop() {
                Some(c) => {
                    // SAFETY: `wc` has room for `n` entries (ibv_poll_cq(3)).
                    unsafe { ptr::write(wc.add(got as usize), c.0) };
                    got += 1;
                }
                None => break,
            }
        }
        got
    })
}

/// `ops.req_notify_cq` (no channel: nothing to arm).
///
/// # Safety
/// None beyond the C ABI: the arguments are not dereferenced.
unsafe extern "C" fn req_notify_cq(_cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    0
}

// ---------------------------------------------------------------------------------------
// The extended QP (`ibv_qp_ex`): `ibv_wr_post(3)`.
// ---------------------------------------------------------------------------------------

/// The device and its open region of an extended QP.
///
/// # Safety
/// `qp` is this device's extended QP ([`CountingDevice::qp_ex`]) and the caller is its
/// poster (a region is used by one thread at a time, `ibv_wr_post(3)`), so the returned
/// `&mut ExSq` is the only reference to the region while it is used.
unsafe fn ex_sq<'a>(qp: *mut ibv_qp_ex) -> (&'a CountingDevice, &'a mut ExSq) {
    // SAFETY: the QP's context is the device's (caller's contract).
    let dev = unsafe { CountingDevice::from_ctx((*qp).qp_base.context) };
    // SAFETY: the region is the poster's alone (caller's contract).
    let sq = unsafe { &mut *dev.ex_sq.get() };
    (dev, sq)
}

/// A builder: appends a WR with the QP's `wr_id` and `wr_flags` (ENOMEM once the region
/// holds as many WRs as the CQ, reported by `ibv_wr_complete`).
///
/// # Safety
/// As [`ex_sq`].
unsafe fn ex_build(qp: *mut ibv_qp_ex, opcode: ibv_wr_opcode, imm: Option<u32>) {
    // SAFETY: forwarded contract.
    let (_, sq) = unsafe { ex_sq(qp) };
    if sq.wrs.len() == sq.wrs.capacity() {
        sq.err = libc::ENOMEM;
        return;
    }
    sq.wrs.push(ExWr {
        // SAFETY: `qp` is live (contract); plain fields the caller set before building.
        wr_id: unsafe { (*qp).wr_id },
        opcode,
        // SAFETY: as above.
        flags: unsafe { (*qp).wr_flags },
        len: 0,
        imm,
    });
}

/// A data setter: the length of the last WR's payload.
///
/// # Safety
/// As [`ex_sq`].
unsafe fn ex_set_len(qp: *mut ibv_qp_ex, len: u32) {
    // SAFETY: forwarded contract.
    let (_, sq) = unsafe { ex_sq(qp) };
    if let Some(w) = sq.wrs.last_mut() {
        w.len = len;
    }
}

/// `qpx->wr_start`.
///
/// # Safety
/// `ibv_wr_start(3)` on this device's extended QP.
unsafe extern "C" fn ex_wr_start(qp: *mut ibv_qp_ex) {
    // SAFETY: forwarded contract.
    let (_, sq) = unsafe { ex_sq(qp) };
    sq.wrs.clear();
    sq.err = 0;
    sq.open = true;
}

/// `qpx->wr_complete`: all or nothing (see [`CountingDevice::qp_ex`]).
///
/// # Safety
/// `ibv_wr_complete(3)` on this device's extended QP.
unsafe extern "C" fn ex_wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    // SAFETY: forwarded contract.
    let (dev, sq) = unsafe { ex_sq(qp) };
    dev.doorbells.fetch_add(1, Ordering::Relaxed);
    sq.open = false;
    let rc = dev.with(|inner| {
        if let Some((errno, _)) = inner.fail_post.take() {
            return errno;
        }
        if sq.err != 0 {
            return sq.err;
        }
        for w in &sq.wrs {
            inner.accept_send(w.wr_id, w.opcode, w.flags, w.len, w.imm);
        }
        0
    });
    if rc == 0 {
        dev.send_wrs
            .fetch_add(sq.wrs.len() as u64, Ordering::Relaxed);
    }
    sq.wrs.clear();
    rc
}

/// `qpx->wr_abort`.
///
/// # Safety
/// `ibv_wr_abort(3)` on this device's extended QP.
unsafe extern "C" fn ex_wr_abort(qp: *mut ibv_qp_ex) {
    // SAFETY: forwarded contract.
    let (dev, sq) = unsafe { ex_sq(qp) };
    dev.wr_aborts.fetch_add(1, Ordering::Relaxed);
    sq.wrs.clear();
    sq.open = false;
}

/// `qpx->wr_send`.
///
/// # Safety
/// `ibv_wr_send(3)` inside a region of this device's extended QP.
unsafe extern "C" fn ex_wr_send(qp: *mut ibv_qp_ex) {
    // SAFETY: forwarded contract.
    unsafe { ex_build(qp, IBV_WR_SEND, None) }
}

/// `qpx->wr_send_imm`.
///
/// # Safety
/// `ibv_wr_send_imm(3)` inside a region of this device's extended QP.
unsafe extern "C" fn ex_wr_send_imm(qp: *mut ibv_qp_ex, imm: __be32) {
    // SAFETY: forwarded contract.
    unsafe { ex_build(qp, IBV_WR_SEND_WITH_IMM, Some(u32::from_be(imm))) }
}

/// `qpx->wr_rdma_write`.
///
/// # Safety
/// `ibv_wr_rdma_write(3)` inside a region of this device's extended QP.
unsafe extern "C" fn ex_wr_rdma_write(qp: *mut ibv_qp_ex, _rkey: u32, _addr: u64) {
    // SAFETY: forwarded contract.
    unsafe { ex_build(qp, IBV_WR_RDMA_WRITE, None) }
}

/// `qpx->wr_rdma_write_imm`.
///
/// # Safety
/// `ibv_wr_rdma_write_imm(3)` inside a region of this device's extended QP.
unsafe extern "C" fn ex_wr_rdma_write_imm(qp: *mut ibv_qp_ex, _rkey: u32, _addr: u64, imm: __be32) {
    // SAFETY: forwarded contract.
    unsafe { ex_build(qp, IBV_WR_RDMA_WRITE_WITH_IMM, Some(u32::from_be(imm))) }
}

/// `qpx->wr_rdma_read`.
///
/// # Safety
/// `ibv_wr_rdma_read(3)` inside a region of this device's extended QP.
unsafe extern "C" fn ex_wr_rdma_read(qp: *mut ibv_qp_ex, _rkey: u32, _addr: u64) {
    // SAFETY: forwarded contract.
    unsafe { ex_build(qp, IBV_WR_RDMA_READ, None) }
}

/// `qpx->wr_atomic_fetch_add`.
///
/// # Safety
/// `ibv_wr_atomic_fetch_add(3)` inside a region of this device's extended QP.
unsafe extern "C" fn ex_wr_atomic_fetch_add(qp: *mut ibv_qp_ex, _rkey: u32, _addr: u64, _add: u64) {
    // SAFETY: forwarded contract.
    unsafe { ex_build(qp, IBV_WR_ATOMIC_FETCH_AND_ADD, None) }
}

/// `qpx->wr_atomic_cmp_swp`.
///
/// # Safety
/// `ibv_wr_atomic_cmp_swp(3)` inside a region of this device's extended QP.
unsafe extern "C" fn ex_wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    _rkey: u32,
    _addr: u64,
    _compare: u64,
    _swap: u64,
) {
    // SAFETY: forwarded contract.
    unsafe { ex_build(qp, IBV_WR_ATOMIC_CMP_AND_SWP, None) }
}

/// `qpx->wr_set_sge`.
///
/// # Safety
/// `ibv_wr_set_sge(3)` after a builder of this device's extended QP.
unsafe extern "C" fn ex_wr_set_sge(qp: *mut ibv_qp_ex, _lkey: u32, _addr: u64, len: u32) {
    // SAFETY: forwarded contract.
    unsafe { ex_set_len(qp, len) }
}

/// `qpx->wr_set_sge_list`.
///
/// # Safety
/// `ibv_wr_set_sge_list(3)`: `sg` holds `n` entries.
unsafe extern "C" fn ex_wr_set_sge_list(qp: *mut ibv_qp_ex, n: usize, sg: *const ibv_sge) {
    let mut len = 0u32;
    for i in 0..n {
        // SAFETY: `sg` holds `n` entries (contract).
        len = len.wrapping_add(unsafe { (*sg.add(i)).length });
    }
    // SAFETY: forwarded contract.
    unsafe { ex_set_len(qp, len) }
}

/// `qpx->wr_set_inline_data` (the device moves no data: it keeps the length).
///
/// # Safety
/// `ibv_wr_set_inline_data(3)` after a builder of this device's extended QP.
unsafe extern "C" fn ex_wr_set_inline_data(qp: *mut ibv_qp_ex, _addr: *mut c_void, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { ex_set_len(qp, len as u32) }
}

/// `qpx->wr_set_ud_addr` (accepted, not checked: the device has one QP).
///
/// # Safety
/// None beyond the C ABI: nothing is dereferenced.
unsafe extern "C" fn ex_wr_set_ud_addr(
    _qp: *mut ibv_qp_ex,
    _ah: *mut ibv_ah,
    _qpn: u32,
    _qkey: u32,
) {
}

// ---------------------------------------------------------------------------------------
// The extended CQ (`ibv_cq_ex`): `ibv_create_cq_ex(3)`.
// ---------------------------------------------------------------------------------------

/// The device and its current extended-poll completion.
///
/// # Safety
/// `cq` is this device's extended CQ ([`CountingDevice::cq_ex`]) and the caller its only
/// poller (`ibv_create_cq_ex(3)`: start/next/end poll are not thread safe), so the returned
/// `&mut ExCq` is the only reference to the poll state while it is used.
unsafe fn ex_cq<'a>(cq: *mut ibv_cq_ex) -> (&'a CountingDevice, &'a mut ExCq) {
    // SAFETY: the CQ's context is the device's (caller's contract).
    let dev = unsafe { CountingDevice::from_ctx((*cq).context) };
    // SAFETY: the poll state is the poller's alone (caller's contract).
    let cur = unsafe { &mut *dev.ex_cq.get() };
    (dev, cur)
}

/// Takes the next completion into the poll state and the CQ's public fields.
///
/// # Safety
/// As [`ex_cq`].
unsafe fn ex_take(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: forwarded contract.
    let (dev, cur) = unsafe { ex_cq(cq) };
    match dev.with(|inner| inner.cqes.pop()) {
        Some((wc, ts)) => {
            cur.cur = wc;
            cur.ts = ts;
            // SAFETY: a live extended CQ (contract); plain fields of the public ABI.
            unsafe {
                (*cq).wr_id = wc.wr_id;
                (*cq).status = wc.status;
            }
            0
        }
        None => libc::ENOENT,
    }
}

/// `cq->start_poll`.
///
/// # Safety
/// `ibv_start_poll(3)` on this device's extended CQ.
unsafe extern "C" fn ex_start_poll(cq: *mut ibv_cq_ex, _attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: forwarded contract.
    let (dev, _) = unsafe { ex_cq(cq) };
    dev.polls.fetch_add(1, Ordering::Relaxed);
    // SAFETY: forwarded contract.
    unsafe { ex_take(cq) }
}

/// `cq->next_poll`.
///
/// # Safety
/// `ibv_next_poll(3)` on this device's extended CQ.
unsafe extern "C" fn ex_next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: forwarded contract.
    let (dev, _) = unsafe { ex_cq(cq) };
    dev.next_polls.fetch_add(1, Ordering::Relaxed);
    // SAFETY: forwarded contract.
    unsafe { ex_take(cq) }
}

/// `cq->end_poll` (nothing is held between polls).
///
/// # Safety
/// None beyond the C ABI: nothing is dereferenced.
unsafe extern "C" fn ex_end_poll(_cq: *mut ibv_cq_ex) {}

macro_rules! ex_reader {
    ($name:ident -> $ret:ty, |$c:ident| $e:expr) => {
        /// A reader of the current completion.
        ///
        /// # Safety
        /// The reader's verb on this device's extended CQ, between a successful start/next
        /// poll and end poll.
        unsafe extern "C" fn $name(cq: *mut ibv_cq_ex) -> $ret {
            // SAFETY: forwarded contract.
            let (_, $c) = unsafe { ex_cq(cq) };
            $e
        }
    };
}

ex_reader!(ex_read_opcode -> ibv_wc_opcode, |c| c.cur.opcode);
ex_reader!(ex_read_vendor_err -> u32, |c| c.cur.vendor_err);
ex_reader!(ex_read_byte_len -> u32, |c| c.cur.byte_len);
ex_reader!(ex_read_imm_data -> __be32, |c| {
    // SAFETY: both union members are plain u32.
    unsafe { c.cur.__bindgen_anon_1.imm_data }
});
ex_reader!(ex_read_qp_num -> u32, |c| c.cur.qp_num);
ex_reader!(ex_read_src_qp -> u32, |c| c.cur.src_qp);
ex_reader!(ex_read_wc_flags -> core::ffi::c_uint, |c| c.cur.wc_flags);
ex_reader!(ex_read_slid -> u32, |c| c.cur.slid as u32);
ex_reader!(ex_read_sl -> u8, |c| c.cur.sl);
ex_reader!(ex_read_dlid_path_bits -> u8, |c| c.cur.dlid_path_bits);
ex_reader!(ex_read_completion_ts -> u64, |c| c.ts);

#[cfg(test)]
mod tests {
    use super::*;
    use hotverbs_ffi::inline;

    #[test]
    fn counts_and_completes_signaled_wrs() {
        let dev = CountingDevice::new(16);
        // SAFETY: zeroed WRs are valid; we link three and sign the middle one.
        let mut wrs: [ibv_send_wr; 3] = unsafe { core::mem::zeroed() };
        for (i, w) in wrs.iter_mut().enumerate() {
            w.wr_id = i as u64;
            w.opcode = IBV_WR_RDMA_WRITE;
        }
        wrs[1].send_flags = IBV_SEND_SIGNALED;
        let base = wrs.as_mut_ptr();
        // SAFETY: indices inside the array.
        unsafe {
            (*base).next = base.add(1);
            (*base.add(1)).next = base.add(2);
        }
        let mut bad = ptr::null_mut();
        // SAFETY: live device QP, valid chain.
        let rc = unsafe { inline::ibv_post_send(dev.qp(), base, &mut bad) };
        assert_eq!(rc, 0);
        assert_eq!((dev.send_wrs(), dev.doorbells()), (3, 1));
        // SAFETY: zeroed WCs are valid.
        let mut wc: [ibv_wc; 4] = unsafe { core::mem::zeroed() };
        // SAFETY: live CQ, 4 entries of room.
        let n = unsafe { inline::ibv_poll_cq(dev.cq(), 4, wc.as_mut_ptr()) };
        assert_eq!(n, 1);
        assert_eq!(
            (wc[0].wr_id, wc[0].status, wc[0].opcode),
            (1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)
        );
        dev.fail_next_post(libc::EINVAL, 1);
        // SAFETY: as above.
        let rc = unsafe { inline::ibv_post_send(dev.qp(), base, &mut bad) };
        assert_eq!(rc, libc::EINVAL);
        assert_eq!(bad, base.wrapping_add(1));
        assert_eq!(dev.send_wrs(), 4);
    }
}
