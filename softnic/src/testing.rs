//! Test support shared by the workspace's tests and fuzz targets: raw-verbs helpers that
//! build softnic objects only through [`verbs_table`] (the same [`IbvFns`] libibverbs is
//! loaded into), and [`CountingAlloc`], a global allocator that counts the allocations of
//! an armed thread.
//!
//! The helpers panic with the verb's name and errno name when a verb fails: they are for
//! tests that expect setup to succeed. Tests of failing verbs call the table directly.
//!
//! Every helper taking a raw verbs pointer is `unsafe`: the pointer must be a live object
//! made through [`verbs_table`] (not yet destroyed). softnic validates handles itself, so a
//! broken contract usually shows up as `EINVAL`, but these are test helpers, not a safe API.
//!
//! ```
//! use hotverbs_ffi::*;
//! use hotverbs_softnic::testing::*;
//!
//! // SAFETY: every pointer comes from the helpers above it and stays alive (the objects
//! // are never destroyed); `mem` outlives its registration (leaked).
//! unsafe {
//!     let (ctx, _devices) = open_listed_device();
//!     let pd = alloc_pd(ctx);
//!     let cq = create_cq(ctx, 64);
//!     let cap = ibv_qp_cap {
//!         max_send_wr: 16,
//!         max_recv_wr: 16,
//!         max_send_sge: 1,
//!         max_recv_sge: 1,
//!         max_inline_data: 64,
//!     };
//!     let a = create_qp(pd, IBV_QPT_RC, cq, cq, cap, core::ptr::null_mut());
//!     let b = create_qp(pd, IBV_QPT_RC, cq, cq, cap, core::ptr::null_mut());
//!     let gid = query_gid(ctx, 1);
//!     connect_qp(a, &ConnectAttr::new((*b).qp_num, gid));
//!     connect_qp(b, &ConnectAttr::new((*a).qp_num, gid));
//!     assert_eq!((*a).state, IBV_QPS_RTS);
//!     let mem: &'static mut [u8] = Box::leak(vec![0u8; 4096].into_boxed_slice());
//!     let mr = reg_mr(pd, mem.as_mut_ptr(), mem.len(), ALL_ACCESS);
//!     assert_eq!((*mr).length, 4096);
//! }
//! ```

use core::ffi::c_int;
use core::ptr;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use hotverbs_ffi::*;

use crate::verbs_table;

/// Every access right: local write, remote write, remote read, remote atomic.
pub const ALL_ACCESS: u32 = IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC;

/// `attr_mask` of the RESET -> INIT transition of an RC/UC QP (a UD QP sets
/// `IBV_QP_QKEY` instead of `IBV_QP_ACCESS_FLAGS`).
pub const INIT_MASK: u32 = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;

/// `attr_mask` of the INIT -> RTR transition of an RC QP.
pub const RC_RTR_MASK: u32 = IBV_QP_STATE
    | IBV_QP_AV
    | IBV_QP_PATH_MTU
    | IBV_QP_DEST_QPN
    | IBV_QP_RQ_PSN
    | IBV_QP_MAX_DEST_RD_ATOMIC
    | IBV_QP_MIN_RNR_TIMER;

/// `attr_mask` of the INIT -> RTR transition of a UC QP.
pub const UC_RTR_MASK: u32 =
    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;

/// `attr_mask` of the RTR -> RTS transition of an RC QP (UC and UD: state and SQ PSN).
pub const RC_RTS_MASK: u32 = IBV_QP_STATE
    | IBV_QP_SQ_PSN
    | IBV_QP_TIMEOUT
    | IBV_QP_RETRY_CNT
    | IBV_QP_RNR_RETRY
    | IBV_QP_MAX_QP_RD_ATOMIC;

/// Opens the first device of softnic's device list; returns it and the number of devices
/// listed (tests assert on it).
///
/// # Panics
/// When the list is empty or `ibv_open_device` fails.
pub fn open_listed_device() -> (*mut ibv_context, i32) {
    let f = verbs_table();
    let mut n = 0;
    // SAFETY: softnic's own device list, read while live and freed once; the device pointer
    // stays valid after the list is freed (as in libibverbs).
    unsafe {
        let list = f.ibv_get_device_list.expect("ibv_get_device_list")(&mut n);
        assert!(!list.is_null() && n >= 1, "softnic lists a device");
        let ctx = f.ibv_open_device.expect("ibv_open_device")(*list);
        f.ibv_free_device_list.expect("ibv_free_device_list")(list);
        assert!(!ctx.is_null(), "ibv_open_device: {}", errno_name(errno()));
        (ctx, n)
    }
}

/// `ibv_alloc_pd(ctx)`.
///
/// # Safety
/// `ctx` is a live softnic context.
///
/// # Panics
/// When the verb fails.
pub unsafe fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    // SAFETY: caller's contract.
    let pd = unsafe { verbs_table().ibv_alloc_pd.expect("ibv_alloc_pd")(ctx) };
    assert!(!pd.is_null(), "ibv_alloc_pd: {}", errno_name(errno()));
    pd
}

/// `ibv_create_cq(ctx, cqe)` without a channel or context pointer.
///
/// # Safety
/// `ctx` is a live softnic context.
///
/// # Panics
/// When the verb fails.
pub unsafe fn create_cq(ctx: *mut ibv_context, cqe: i32) -> *mut ibv_cq {
    // SAFETY: caller's contract; NULL channel and context pointer are allowed.
    let cq = unsafe {
        verbs_table().ibv_create_cq.expect("ibv_create_cq")(
            ctx,
            cqe,
            ptr::null_mut(),
            ptr::null_mut(),
            0,
        )
    };
    assert!(!cq.is_null(), "ibv_create_cq: {}", errno_name(errno()));
    cq
}

/// `ibv_create_qp` of `qp_type` in `pd` with `cap`, receiving through `srq` if it is not
/// NULL, `sq_sig_all` off. The QP is in RESET.
///
/// # Safety
/// `pd` is a live softnic PD; `send_cq`, `recv_cq` (and `srq` unless NULL) are live objects
/// of the same context.
///
/// # Panics
/// When the verb fails.
pub unsafe fn create_qp(
    pd: *mut ibv_pd,
    qp_type: ibv_qp_type,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    cap: ibv_qp_cap,
    srq: *mut ibv_srq,
) -> *mut ibv_qp {
    let mut ia = ibv_qp_init_attr {
        send_cq,
        recv_cq,
        srq,
        cap,
        qp_type,
        sq_sig_all: 0,
        ..Default::default()
    };
    // SAFETY: caller's contract; `ia` is fully initialised.
    let qp = unsafe { verbs_table().ibv_create_qp.expect("ibv_create_qp")(pd, &mut ia) };
    assert!(!qp.is_null(), "ibv_create_qp: {}", errno_name(errno()));
    qp
}

/// Registers `len` bytes at `addr` in `pd` with `access` (`IBV_ACCESS_*` bits).
///
/// # Safety
/// `pd` is a live softnic PD and `addr..addr + len` stays valid memory for as long as the
/// MR is registered (the device reads and writes it behind the compiler's back).
///
/// # Panics
/// When the verb fails.
pub unsafe fn reg_mr(pd: *mut ibv_pd, addr: *mut u8, len: usize, access: u32) -> *mut ibv_mr {
    // SAFETY: caller's contract.
    let mr = unsafe {
        verbs_table().ibv_reg_mr.expect("ibv_reg_mr")(pd, addr.cast(), len, access as c_int)
    };
    assert!(!mr.is_null(), "ibv_reg_mr: {}", errno_name(errno()));
    mr
}

/// GID `index` of port 1 of `ctx`.
///
/// # Safety
/// `ctx` is a live softnic context.
///
/// # Panics
/// When the verb fails.
pub unsafe fn query_gid(ctx: *mut ibv_context, index: i32) -> ibv_gid {
    let mut g = ibv_gid::default();
    // SAFETY: caller's contract; `g` is a valid out-parameter.
    let rc = unsafe { verbs_table().ibv_query_gid.expect("ibv_query_gid")(ctx, 1, index, &mut g) };
    assert_eq!(rc, 0, "ibv_query_gid: {}", errno_name(rc));
    g
}

/// `ibv_modify_qp(qp, attr, mask)`; returns the verb's result (0 or an errno value).
///
/// # Safety
/// `qp` is a live softnic QP.
pub unsafe fn modify_qp(qp: *mut ibv_qp, attr: &mut ibv_qp_attr, mask: u32) -> c_int {
    // SAFETY: caller's contract; `attr` is a valid ibv_qp_attr.
    unsafe { verbs_table().ibv_modify_qp.expect("ibv_modify_qp")(qp, attr, mask as c_int) }
}

/// As [`modify_qp`], panicking (with the target state and errno name) unless it succeeds.
///
/// # Safety
/// `qp` is a live softnic QP.
pub unsafe fn must_modify_qp(qp: *mut ibv_qp, attr: &mut ibv_qp_attr, mask: u32) {
    // SAFETY: caller's contract.
    let rc = unsafe { modify_qp(qp, attr, mask) };
    assert_eq!(
        rc,
        0,
        "ibv_modify_qp to state {}: {}",
        attr.qp_state,
        errno_name(rc)
    );
}

/// What [`connect_qp`] brings a QP up with, on port 1 through GID index 1 (softnic's
/// RoCE v2 IPv4 GID), PSNs 0, path MTU 1024, `timeout` 14, `retry_cnt` 7.
/// [`ConnectAttr::new`] gives the values the datapath tests and fuzz targets use.
#[derive(Clone, Copy)]
#[allow(missing_debug_implementations)] // ibv_gid (generated) has no Debug
pub struct ConnectAttr {
    /// The peer's QP number (RC/UC; ignored for UD).
    pub dest_qpn: u32,
    /// The peer's GID (RC/UC).
    pub dgid: ibv_gid,
    /// `qp_access_flags` (RC/UC).
    pub access: u32,
    /// Q_Key (UD).
    pub qkey: u32,
    /// `rnr_retry` (RC; 7 = retry forever).
    pub rnr_retry: u8,
    /// `max_dest_rd_atomic` and `max_rd_atomic` (RC).
    pub rd_atomic: u8,
    /// `min_rnr_timer` (RC).
    pub min_rnr_timer: u8,
    /// GRH hop limit of the path.
    pub hop_limit: u8,
}

impl ConnectAttr {
    /// Towards `dest_qpn` at `dgid`: [`ALL_ACCESS`], Q_Key 0, `rnr_retry` 7, 16 RDMA
    /// READ/atomics in flight, `min_rnr_timer` 1, hop limit 1.
    pub fn new(dest_qpn: u32, dgid: ibv_gid) -> Self {
        ConnectAttr {
            dest_qpn,
            dgid,
            access: ALL_ACCESS,
            qkey: 0,
            rnr_retry: 7,
            rd_atomic: 16,
            min_rnr_timer: 1,
            hop_limit: 1,
        }
    }
}

/// RESET -> INIT: port 1, P_Key index 0, access flags (RC/UC) or Q_Key (UD).
///
/// # Safety
/// `qp` is a live softnic QP.
///
/// # Panics
/// When the verb fails.
pub unsafe fn qp_to_init(qp: *mut ibv_qp, c: &ConnectAttr) {
    // SAFETY: caller's contract.
    let ud = unsafe { (*qp).qp_type } == IBV_QPT_UD;
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        port_num: 1,
        qp_access_flags: c.access,
        qkey: c.qkey,
        ..Default::default()
    };
    let mask = if ud {
        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY
    } else {
        INIT_MASK
    };
    // SAFETY: caller's contract.
    unsafe { must_modify_qp(qp, &mut a, mask) }
}

/// The INIT -> RTR attributes of `c` (GRH-routed path on port 1, source GID index 1).
pub fn rtr_attr(c: &ConnectAttr) -> ibv_qp_attr {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTR,
        path_mtu: IBV_MTU_1024,
        dest_qp_num: c.dest_qpn,
        rq_psn: 0,
        max_dest_rd_atomic: c.rd_atomic,
        min_rnr_timer: c.min_rnr_timer,
        ..Default::default()
    };
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = c.dgid;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = c.hop_limit;
    a
}

/// INIT -> RTR with [`rtr_attr`] and the mask of the QP's type ([`RC_RTR_MASK`],
/// [`UC_RTR_MASK`], state only for UD).
///
/// # Safety
/// `qp` is a live softnic QP.
///
/// # Panics
/// When the verb fails.
pub unsafe fn qp_to_rtr(qp: *mut ibv_qp, c: &ConnectAttr) {
    let mut a = rtr_attr(c);
    // SAFETY: caller's contract.
    let mask = match unsafe { (*qp).qp_type } {
        IBV_QPT_RC => RC_RTR_MASK,
        IBV_QPT_UC => UC_RTR_MASK,
        _ => IBV_QP_STATE,
    };
    // SAFETY: caller's contract.
    unsafe { must_modify_qp(qp, &mut a, mask) }
}

/// RTR -> RTS: SQ PSN 0, and for RC `timeout` 14, `retry_cnt` 7, `c.rnr_retry`,
/// `c.rd_atomic` ([`RC_RTS_MASK`]).
///
/// # Safety
/// `qp` is a live softnic QP.
///
/// # Panics
/// When the verb fails.
pub unsafe fn qp_to_rts(qp: *mut ibv_qp, c: &ConnectAttr) {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        sq_psn: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: c.rnr_retry,
        max_rd_atomic: c.rd_atomic,
        ..Default::default()
    };
    // SAFETY: caller's contract.
    let mask = if unsafe { (*qp).qp_type } == IBV_QPT_RC {
        RC_RTS_MASK
    } else {
        IBV_QP_STATE | IBV_QP_SQ_PSN
    };
    // SAFETY: caller's contract.
    unsafe { must_modify_qp(qp, &mut a, mask) }
}

/// Brings `qp` (in RESET) to RTS: connected to `c.dest_qpn` (RC/UC) or ready (UD), through
/// [`qp_to_init`], [`qp_to_rtr`] and [`qp_to_rts`].
///
/// # Safety
/// `qp` is a live softnic QP.
///
/// # Panics
/// When a transition fails.
pub unsafe fn connect_qp(qp: *mut ibv_qp, c: &ConnectAttr) {
    // SAFETY: caller's contract.
    unsafe {
        qp_to_init(qp, c);
        qp_to_rtr(qp, c);
        qp_to_rts(qp, c);
    }
}

/// Moves `qp` to RESET (its outstanding WRs vanish without completions).
///
/// # Safety
/// `qp` is a live softnic QP.
///
/// # Panics
/// When the verb fails.
pub unsafe fn qp_to_reset(qp: *mut ibv_qp) {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RESET,
        ..Default::default()
    };
    // SAFETY: caller's contract.
    unsafe { must_modify_qp(qp, &mut a, IBV_QP_STATE) }
}

/// Allocations by all threads since the process started.
static ALLOCS_ALL: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    /// Whether this thread's allocations are counted ...
    static ARMED: Cell<bool> = const { Cell::new(false) };
    /// ... and how many were, while armed (tests run on parallel threads, so each test
    /// counts its own thread only).
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

/// A global allocator that forwards to [`System`] and counts allocations (`alloc` and
/// `realloc`; `dealloc` is free): per thread while the thread is armed, and in total.
///
/// A test binary installs it and counts a closure:
///
/// ```
/// use hotverbs_softnic::testing::CountingAlloc;
///
/// #[global_allocator]
/// static GLOBAL: CountingAlloc = CountingAlloc;
///
/// fn main() {
///     let (allocs, v) = CountingAlloc::count(|| vec![1u8; 16]);
///     assert_eq!(allocs, 1);
///     let (allocs, sum) = CountingAlloc::count(|| v.iter().map(|&x| u32::from(x)).sum::<u32>());
///     assert_eq!((allocs, sum), (0, 16));
/// }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct CountingAlloc;

impl CountingAlloc {
    /// Starts counting this thread's allocations.
    pub fn arm() {
        ARMED.with(|a| a.set(true));
    }

    /// Stops counting this thread's allocations.
    pub fn disarm() {
        ARMED.with(|a| a.set(false));
    }

    /// Allocations counted on this thread so far (while armed).
    pub fn thread_allocs() -> u64 {
        ALLOCS.with(|n| n.get())
    }

    /// Allocations by all threads, armed or not, so far.
    pub fn total_allocs() -> u64 {
        ALLOCS_ALL.load(Ordering::Relaxed)
    }

    /// Runs `f` armed; returns the allocations this thread made meanwhile, and `f`'s value.
    pub fn count<R>(f: impl FnOnce() -> R) -> (u64, R) {
        let before = Self::thread_allocs();
        Self::arm();
        let r = f();
        Self::disarm();
        (Self::thread_allocs() - before, r)
    }

    fn note_alloc() {
        ALLOCS_ALL.fetch_add(1, Ordering::Relaxed);
        // try_with: the allocator may run while thread-locals are being torn down.
        let _ = ARMED.try_with(|a| {
            if a.get() {
                let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
            }
        });
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::note_alloc();
        // SAFETY: the caller's contract is forwarded unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::note_alloc();
        // SAFETY: the caller's contract is forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
