//! The extended verbs: the `verbs_context` ops (`query_device_ex`, `create_qp_ex`,
//! `create_cq_ex`, `alloc_td`, `dealloc_td`, `alloc_parent_domain`, `query_rt_values`),
//! the `ibv_qp_ex` work-request builders (`ibv_wr_post(3)`) and the `ibv_cq_ex` poll and
//! read functions (`ibv_create_cq_ex(3)`), with libibverbs' conventions.
//!
//! # Safety (whole module)
//! Every `extern "C"` function has the contract of the verb or slot of the same name:
//! object pointers were returned by softnic and are live; out-pointers are writable. An
//! extended QP is a [`SoftQp`] (its `ibv_qp_ex`, which starts with the `ibv_qp`, first); a
//! CQ is a [`SoftCq`] (its `ibv_cq_ex` first). A QP's staged batch is touched only between
//! `wr_start` and `wr_complete`/`wr_abort`, which hold the QP's builder lock (skipped for
//! a QP of a thread domain, whose user promises one thread); a CQ's current completion only
//! by its one polling thread (`ibv_create_cq_ex(3)`).
#![allow(clippy::missing_safety_doc)] // one contract for the module, stated above.

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use core::ptr::null_mut;
use core::sync::atomic::{AtomicBool, Ordering};

use hotverbs_ffi::*;

use crate::errno::{set_errno, ErrnoScope};
use crate::fabric::{lock, CurWc, Fabric, Pd, Ptr, SoftCq, Td, RXE_INLINE_NO_FLAG};
use crate::verbs::{self, ctx_idx};
use crate::Profile;

/// The HCA clock softnic declares (`ibv_device_attr_ex.hca_core_clock`, kHz): 156.25 MHz,
/// so a raw completion timestamp is `CLOCK_MONOTONIC` ns x 5 / 32.
pub const HCA_CORE_CLOCK_KHZ: u64 = 156_250;

/// libibverbs' `VERBS_QP_EX` bit of `verbs_qp.comp_mask`: the QP has an `ibv_qp_ex`.
const VERBS_QP_EX: u32 = 1;

fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a writable timespec.
    unsafe { libc::clock_gettime(id, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The device's free-running clock in HCA cycles (`CLOCK_MONOTONIC` at
/// [`HCA_CORE_CLOCK_KHZ`]).
pub(crate) fn raw_clock() -> u64 {
    (clock_ns(libc::CLOCK_MONOTONIC) as u128 * HCA_CORE_CLOCK_KHZ as u128 / 1_000_000) as u64
}

/// Wall-clock time (`CLOCK_REALTIME`) in ns.
pub(crate) fn wall_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn fail<T>(errno: i32) -> *mut T {
    set_errno(errno);
    null_mut()
}

fn profile(f: &Fabric, ctx: *mut ibv_context) -> Profile {
    // SAFETY: a live softnic context (callers' contract).
    f.cfg(unsafe { ctx_idx(ctx) }).profile
}

/// The `verbs_context` of a new softnic context: the extended ops filled, `sz` and the
/// `ibv_context` set by the caller.
pub(crate) fn verbs_context_ops() -> verbs_context {
    // SAFETY: verbs_context is C data; all-zero is valid (every op NULL).
    let mut v: verbs_context = unsafe { core::mem::zeroed() };
    v.query_device_ex = Some(query_device_ex);
    v.create_qp_ex = Some(create_qp_ex);
    v.create_cq_ex = Some(create_cq_ex);
    v.alloc_td = Some(alloc_td);
    v.dealloc_td = Some(dealloc_td);
    v.alloc_parent_domain = Some(alloc_parent_domain);
    v.query_rt_values = Some(query_rt_values);
    v
}

// ------------------------------------------------------------------ device

unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    let _errno = ErrnoScope::enter();
    // SAFETY: input null or readable (caller).
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return libc::EINVAL;
    }
    if attr_size < core::mem::size_of::<ibv_device_attr>() {
        return libc::EINVAL;
    }
    // SAFETY: all-zero is a valid ibv_device_attr_ex.
    let mut x: ibv_device_attr_ex = unsafe { core::mem::zeroed() };
    // SAFETY: live context; a local out-struct.
    let r = unsafe { verbs::query_device(ctx, &mut x.orig_attr) };
    if r != 0 {
        return r;
    }
    let rxe = profile(&lock(), ctx) == Profile::Rxe;
    if !rxe {
        // rxe has no completion timestamps: mask and clock 0 (rxe's query_device_ex).
        x.completion_timestamp_mask = u64::MAX;
        x.hca_core_clock = HCA_CORE_CLOCK_KHZ;
    }
    x.device_cap_flags_ex = x.orig_attr.device_cap_flags as u64;
    x.phys_port_cnt_ex = 1;
    let n = attr_size.min(core::mem::size_of::<ibv_device_attr_ex>());
    // SAFETY: the caller's struct holds attr_size bytes; we copy at most ours.
    unsafe {
        core::ptr::copy_nonoverlapping((&raw const x).cast::<u8>(), attr.cast::<u8>(), n);
    }
    0
}

unsafe extern "C" fn query_rt_values(ctx: *mut ibv_context, values: *mut ibv_values_ex) -> c_int {
    let _errno = ErrnoScope::enter();
    if profile(&lock(), ctx) == Profile::Rxe {
        // rxe has no query_rt_values: libibverbs' dummy op answers EOPNOTSUPP.
        return libc::EOPNOTSUPP;
    }
    // SAFETY: readable and writable (caller).
    let v = unsafe { &mut *values };
    let mut done = 0;
    if v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK != 0 {
        // As mlx5: the raw cycle count in tv_nsec, tv_sec 0.
        v.raw_clock.tv_sec = 0;
        v.raw_clock.tv_nsec = raw_clock() as _;
        done |= IBV_VALUES_MASK_RAW_CLOCK;
    }
    v.comp_mask = done;
    0
}

// ------------------------------------------------------------------ thread / parent domains

/// A thread domain as softnic allocates it: the ABI struct first, then its slab index.
#[repr(C)]
pub(crate) struct SoftTd {
    ibv: ibv_td,
    idx: u32,
}

unsafe extern "C" fn alloc_td(ctx: *mut ibv_context, attr: *mut ibv_td_init_attr) -> *mut ibv_td {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    if profile(&f, ctx) == Profile::Rxe {
        // librxe has no alloc_td: libibverbs' dummy op (EOPNOTSUPP).
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: attr null or readable (caller).
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return fail(libc::EINVAL);
    }
    // SAFETY: live context.
    let ci = unsafe { ctx_idx(ctx) };
    let idx = f.tds.len() as u32;
    let p = Box::into_raw(Box::new(SoftTd {
        ibv: ibv_td { context: ctx },
        idx,
    }));
    Fabric::add(
        &mut f.tds,
        Td {
            ctx: ci,
            users: 0,
            ptr: Ptr(p),
        },
    );
    f.ctxs[ci as usize].as_mut().expect("ctx").objects += 1;
    p.cast()
}

unsafe extern "C" fn dealloc_td(td: *mut ibv_td) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live td (caller).
    let ctx = unsafe { (*td).context };
    if profile(&f, ctx) == Profile::Rxe {
        return libc::EOPNOTSUPP;
    }
    // SAFETY: softnic thread domains are SoftTd.
    let i = unsafe { (*td.cast::<SoftTd>()).idx } as usize;
    match f.tds.get(i) {
        Some(Some(t)) if t.users > 0 => return libc::EBUSY,
        Some(Some(_)) => {}
        _ => return libc::EINVAL,
    }
    let t = f.tds[i].take().expect("td");
    if let Some(Some(c)) = f.ctxs.get_mut(t.ctx as usize) {
        c.objects -= 1;
    }
    // SAFETY: allocated by alloc_td; removed from the fabric above.
    drop(unsafe { Box::from_raw(t.ptr.0) });
    0
}

unsafe extern "C" fn alloc_parent_domain(
    ctx: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    if profile(&f, ctx) == Profile::Rxe {
        // librxe has no alloc_parent_domain: libibverbs' dummy op (EOPNOTSUPP).
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: readable (caller).
    let a = unsafe { &*attr };
    let known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    if a.comp_mask & !known != 0 || a.pd.is_null() {
        return fail(libc::EINVAL);
    }
    if a.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS != 0 {
        // softnic provisions its queues itself; custom allocators are not supported.
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: live PD (caller).
    let (base, pd_ctx) = unsafe { ((*a.pd).handle, (*a.pd).context) };
    if pd_ctx != ctx {
        return fail(libc::EINVAL);
    }
    match f.pds.get(base as usize) {
        Some(Some(p)) if p.parent.is_none() => {}
        // A parent domain cannot wrap another (mlx5: EINVAL), nor a dead PD.
        _ => return fail(libc::EINVAL),
    }
    let td = if a.td.is_null() {
        None
    } else {
        // SAFETY: a live softnic thread domain (caller).
        let t = unsafe { (*a.td.cast::<SoftTd>()).idx };
        match f.tds.get_mut(t as usize) {
            Some(Some(td)) => td.users += 1,
            _ => return fail(libc::EINVAL),
        }
        Some(t)
    };
    f.pds[base as usize].as_mut().expect("pd").users += 1;
    // SAFETY: live context.
    let ci = unsafe { ctx_idx(ctx) };
    let idx = f.pds.len() as u32;
    let ibv = Box::into_raw(Box::new(ibv_pd {
        context: ctx,
        handle: idx,
    }));
    Fabric::add(
        &mut f.pds,
        Pd {
            ctx: ci,
            users: 0,
            ptr: Ptr(ibv),
            prot: base,
            parent: Some(td),
        },
    );
    f.ctxs[ci as usize].as_mut().expect("ctx").objects += 1;
    ibv
}

/// The thread domain of PD `pd` if it is a parent domain with one.
fn td_of(f: &Fabric, pd: *mut ibv_pd) -> Option<u32> {
    if pd.is_null() {
        return None;
    }
    // SAFETY: a live softnic PD (callers' contract).
    let i = unsafe { (*pd).handle } as usize;
    f.pds.get(i)?.as_ref()?.parent.flatten()
}

// ------------------------------------------------------------------ extended QP

/// One staged work request: the `ibv_send_wr` handed to the engine at `wr_complete`, and
/// the storage its pointers refer to.
struct Staged {
    wr: ibv_send_wr,
    sges: Vec<ibv_sge>,
    /// `ibv_wr_set_inline_data(_list)`'s bytes, copied at the call (the buffers may be
    /// reused at once, `ibv_wr_post(3)`).
    inline: Vec<u8>,
    is_inline: bool,
    inline_sge: ibv_sge,
}

impl Staged {
    fn new(max_sge: u32, max_inline: u32) -> Staged {
        Staged {
            // SAFETY: ibv_send_wr is C data; all-zero is valid.
            wr: unsafe { core::mem::zeroed() },
            sges: Vec::with_capacity(max_sge.max(1) as usize),
            inline: Vec::with_capacity(max_inline as usize),
            is_inline: false,
            inline_sge: ibv_sge::default(),
        }
    }
}

/// The WRs staged between `wr_start` and `wr_complete`, provisioned at creation (one entry
/// per SQ slot, up to [`crate::fabric::PREALLOC_WRS`]): building a batch allocates nothing.
#[derive(Default)]
pub(crate) struct Batch {
    wrs: Vec<Staged>,
    n: usize,
    /// The first builder error of the batch (`wr_complete` returns it, posting nothing).
    err: c_int,
    max_wr: u32,
    max_sge: u32,
    max_inline: u32,
    rxe: bool,
    /// Between `wr_start` and `wr_complete`/`wr_abort`: a second `wr_abort` (say, after a
    /// refused `wr_complete`) must not release a lock it no longer holds.
    open: bool,
}

/// A QP as softnic allocates it, laid out as libibverbs' `verbs_qp`: the `ibv_qp_ex`
/// (whose first field is the `ibv_qp` handed out), then `comp_mask`, then softnic's
/// builder state.
#[repr(C)]
pub(crate) struct SoftQp {
    ex: ibv_qp_ex,
    comp_mask: u32,
    batch: UnsafeCell<Batch>,
    /// The builder lock, held from `wr_start` to `wr_complete`/`wr_abort`.
    busy: AtomicBool,
    /// Created with a thread domain: the builders take no lock.
    lockless: bool,
}

impl SoftQp {
    pub(crate) fn new(qp: ibv_qp) -> SoftQp {
        // SAFETY: ibv_qp_ex is C data; all-zero is valid (every op NULL).
        let mut ex: ibv_qp_ex = unsafe { core::mem::zeroed() };
        ex.qp_base = qp;
        SoftQp {
            ex,
            comp_mask: 0,
            batch: UnsafeCell::new(Batch::default()),
            busy: AtomicBool::new(false),
            lockless: false,
        }
    }
}

/// `ibv_qp_to_qp_ex`: the QP's `ibv_qp_ex` if it was created by `ibv_create_qp_ex`, else
/// NULL (errno untouched), as libibverbs answers.
pub(crate) unsafe extern "C" fn qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    let q = qp.cast::<SoftQp>();
    // SAFETY: softnic QPs are SoftQp (caller: a live softnic QP).
    if unsafe { (*q).comp_mask } & VERBS_QP_EX != 0 {
        qp.cast()
    } else {
        null_mut()
    }
}

/// Opcodes softnic executes, per QP type (`IBV_QP_EX_WITH_*`).
fn supported_send_ops(qpt: ibv_qp_type) -> u64 {
    let send = (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM) as u64;
    let write = (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) as u64;
    let rc_only = (IBV_QP_EX_WITH_RDMA_READ
        | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
        | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) as u64;
    match qpt {
        IBV_QPT_RC => send | write | rc_only,
        IBV_QPT_UC => send | write,
        IBV_QPT_UD => send,
        _ => 0,
    }
}

unsafe extern "C" fn create_qp_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    let _errno = ErrnoScope::enter();
    // SAFETY: readable and writable (caller).
    let a = unsafe { &mut *attr };
    let known =
        IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    // As rxe's check_qp_init_attr: unknown attributes, any create flag, or an op the QP
    // type cannot execute -> EOPNOTSUPP.
    if a.comp_mask & !known != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    let ops = if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
        if a.send_ops_flags & !supported_send_ops(a.qp_type) != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        Some(a.send_ops_flags)
    } else {
        None
    };
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: live PD (caller).
    if unsafe { (*a.pd).context } != ctx {
        return fail(libc::EINVAL);
    }
    let mut init = ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    // SAFETY: live PD; a valid init attr.
    let qp = unsafe { verbs::create_qp(a.pd, &mut init) };
    if qp.is_null() {
        return qp;
    }
    a.cap = init.cap;
    let f = lock();
    // SAFETY: just created; nobody else has the pointer yet.
    let q = unsafe { &mut *qp.cast::<SoftQp>() };
    // Every QP made by create_qp_ex has an ibv_qp_ex (rxe sets VERBS_QP_EX for all).
    q.comp_mask |= VERBS_QP_EX;
    q.lockless = td_of(&f, a.pd).is_some();
    if let Some(ops) = ops {
        // SAFETY: the QP is live; its handle is its fabric index.
        let fq = f.qps[unsafe { (*qp).handle } as usize]
            .as_ref()
            .expect("new QP");
        let b = q.batch.get_mut();
        b.max_wr = fq.cap.max_send_wr;
        b.max_sge = fq.cap.max_send_sge;
        b.max_inline = fq.inline_limit;
        b.rxe = fq.rxe;
        let n = (fq.cap.max_send_wr as usize).min(crate::fabric::PREALLOC_WRS);
        b.wrs = (0..n)
            .map(|_| Staged::new(b.max_sge, b.max_inline))
            .collect();
        fill_send_ops(&mut q.ex, ops);
    }
    qp
}

fn fill_send_ops(x: &mut ibv_qp_ex, ops: u64) {
    let has = |bit: u32| ops & bit as u64 != 0;
    x.wr_start = Some(wr_start);
    x.wr_complete = Some(wr_complete);
    x.wr_abort = Some(wr_abort);
    x.wr_set_sge = Some(wr_set_sge);
    x.wr_set_sge_list = Some(wr_set_sge_list);
    x.wr_set_inline_data = Some(wr_set_inline_data);
    x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    x.wr_set_ud_addr = Some(wr_set_ud_addr);
    if has(IBV_QP_EX_WITH_SEND) {
        x.wr_send = Some(wr_send);
    }
    if has(IBV_QP_EX_WITH_SEND_WITH_IMM) {
        x.wr_send_imm = Some(wr_send_imm);
    }
    if has(IBV_QP_EX_WITH_RDMA_WRITE) {
        x.wr_rdma_write = Some(wr_rdma_write);
    }
    if has(IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) {
        x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    }
    if has(IBV_QP_EX_WITH_RDMA_READ) {
        x.wr_rdma_read = Some(wr_rdma_read);
    }
    if has(IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP) {
        x.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    }
    if has(IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) {
        x.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    }
}

/// The QP's staged batch.
///
/// # Safety
/// `qp` is a live softnic extended QP inside `wr_start` .. `wr_complete`/`wr_abort` (the
/// builder lock, or a thread domain's single thread, makes the access exclusive).
unsafe fn batch<'a>(qp: *mut ibv_qp_ex) -> &'a mut Batch {
    // SAFETY: caller's contract.
    unsafe { &mut *(*qp.cast::<SoftQp>()).batch.get() }
}

/// The errno a builder latches when a limit is exceeded: rxe's ENOSPC, else mlx5's ENOMEM.
fn limit_errno(b: &Batch) -> c_int {
    if b.rxe {
        libc::ENOSPC
    } else {
        libc::ENOMEM
    }
}

/// Starts a new WR with `qpx->wr_id` and `qpx->wr_flags`; `None` after a builder error.
///
/// # Safety
/// As [`batch`].
unsafe fn stage<'a>(qp: *mut ibv_qp_ex, opcode: ibv_wr_opcode) -> Option<&'a mut ibv_send_wr> {
    // SAFETY: caller's contract.
    let b = unsafe { batch(qp) };
    if b.err != 0 {
        return None;
    }
    if b.n >= b.max_wr as usize {
        // More WRs than the send queue holds: the batch cannot be posted (rxe's
        // check_qp_queue_full).
        b.err = limit_errno(b);
        return None;
    }
    if b.n == b.wrs.len() {
        // Beyond the provisioned entries (a queue deeper than PREALLOC_WRS): first use only.
        b.wrs.push(Staged::new(b.max_sge, b.max_inline));
    }
    let s = &mut b.wrs[b.n];
    b.n += 1;
    s.sges.clear();
    s.inline.clear();
    s.is_inline = false;
    // SAFETY: all-zero is a valid ibv_send_wr.
    s.wr = unsafe { core::mem::zeroed() };
    // SAFETY: a live ibv_qp_ex (caller); read at the builder call (ibv_wr_post(3)).
    unsafe {
        s.wr.wr_id = (*qp).wr_id;
        s.wr.send_flags = (*qp).wr_flags;
    }
    s.wr.opcode = opcode;
    Some(&mut s.wr)
}

/// The WR being built (the last staged); `None` after an error or before any WR (then
/// EINVAL is latched).
///
/// # Safety
/// As [`batch`].
unsafe fn current<'a>(qp: *mut ibv_qp_ex) -> Option<&'a mut Staged> {
    // SAFETY: caller's contract.
    let b = unsafe { batch(qp) };
    if b.err != 0 {
        return None;
    }
    if b.n == 0 {
        b.err = libc::EINVAL;
        return None;
    }
    Some(&mut b.wrs[b.n - 1])
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    // SAFETY: a live softnic extended QP (caller).
    let q = unsafe { &*qp.cast::<SoftQp>() };
    if !q.lockless {
        // Acquire: pairs with the Release in `unlock`, so this thread sees the batch the
        // previous holder left.
        while q
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
    }
    // SAFETY: the builder lock is ours now.
    let b = unsafe { batch(qp) };
    b.n = 0;
    b.err = 0;
    b.open = true;
}

/// Releases the builder lock taken by `wr_start`.
///
/// # Safety
/// As [`batch`].
unsafe fn unlock(qp: *mut ibv_qp_ex) {
    // SAFETY: a live softnic extended QP (caller).
    let q = unsafe { &*qp.cast::<SoftQp>() };
    if !q.lockless {
        // Release: pairs with the Acquire in wr_start.
        q.busy.store(false, Ordering::Release);
    }
}

/// `ibv_wr_abort`: discards the batch and ends it. Outside `wr_start` .. (e.g. after a
/// `wr_complete` that failed, which already discarded the batch) it does nothing.
unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    // SAFETY: a live extended QP; the batch is ours inside wr_start .., and `open` tells
    // whether we are (the application does not race its own wr_* calls on one QP).
    let b = unsafe { batch(qp) };
    if !b.open {
        return;
    }
    b.n = 0;
    b.err = 0;
    b.open = false;
    // SAFETY: as above.
    unsafe { unlock(qp) };
}

/// `ibv_wr_complete`: posts the batch (all or nothing, see the crate docs) and ends it;
/// EINVAL outside `wr_start` ...
unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    let _errno = ErrnoScope::enter();
    // SAFETY: as in wr_abort.
    let b = unsafe { batch(qp) };
    if !b.open {
        return libc::EINVAL;
    }
    let (n, err) = (b.n, b.err);
    b.n = 0;
    b.err = 0;
    b.open = false;
    let ret = if err != 0 {
        err
    } else if n == 0 {
        0
    } else {
        // SAFETY: the batch is exclusively ours; the chain points into it.
        unsafe { post_batch(qp, b, n) }
    };
    // SAFETY: as above.
    unsafe { unlock(qp) };
    ret
}

/// Links the `n` staged WRs into a chain, checks that the engine accepts all of them, then
/// posts them through the same path as `ibv_post_send`.
///
/// # Safety
/// `b` is `qp`'s batch, exclusively ours.
unsafe fn post_batch(qp: *mut ibv_qp_ex, b: &mut Batch, n: usize) -> c_int {
    let base = b.wrs.as_mut_ptr();
    for i in 0..n {
        // SAFETY: i < n <= wrs.len(); each entry is visited once.
        let s = unsafe { &mut *base.add(i) };
        if s.is_inline {
            s.inline_sge = ibv_sge {
                addr: s.inline.as_ptr() as u64,
                length: s.inline.len() as u32,
                lkey: 0,
            };
            if s.wr.send_flags & IBV_SEND_INLINE != 0 || !b.rxe {
                s.wr.send_flags |= IBV_SEND_INLINE;
                s.wr.sg_list = &mut s.inline_sge;
                s.wr.num_sge = !s.inline.is_empty() as c_int;
            } else {
                // rxe: inline data without IBV_SEND_INLINE in wr_flags -> the WR fails
                // at execution with LOC_QP_OP_ERR and the QP goes to ERR (rxe README).
                s.wr.opcode |= RXE_INLINE_NO_FLAG;
                s.wr.num_sge = 0;
                s.wr.sg_list = null_mut();
            }
        } else {
            // ibv_wr_post(3) lists no IBV_SEND_INLINE among the `wr_flags`: data set by
            // `wr_set_sge(_list)` is gathered from its SGEs (as mlx5 does), whatever the flag.
            s.wr.send_flags &= !IBV_SEND_INLINE;
            s.wr.sg_list = s.sges.as_mut_ptr();
            s.wr.num_sge = s.sges.len() as c_int;
        }
        s.wr.next = if i + 1 < n {
            // SAFETY: i + 1 < n: in bounds.
            unsafe { &raw mut (*base.add(i + 1)).wr }
        } else {
            null_mut()
        };
    }
    // SAFETY: a live QP (caller).
    let qi = unsafe { (*qp).qp_base.handle } as usize;
    // SAFETY: n > 0 entries, so the first is initialised.
    let first = unsafe { &raw mut (*base).wr };
    let mut f = lock();
    // SAFETY: a valid chain of n WRs whose SGE lists and inline bytes live in the batch.
    if let Err(e) = unsafe { f.check_batch(qi, first, n, limit_errno(b)) } {
        return e;
    }
    let mut bad = null_mut();
    // SAFETY: as above; `bad` is a local.
    unsafe { f.post_send(qi, first, &mut bad) }
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    // SAFETY: inside wr_start .. (caller).
    unsafe { stage(qp, IBV_WR_SEND) };
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: __be32) {
    // SAFETY: inside wr_start .. (caller).
    if let Some(w) = unsafe { stage(qp, IBV_WR_SEND_WITH_IMM) } {
        w.__bindgen_anon_1.imm_data = imm;
    }
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: inside wr_start .. (caller).
    if let Some(w) = unsafe { stage(qp, IBV_WR_RDMA_WRITE) } {
        w.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
    }
}

unsafe extern "C" fn wr_rdma_write_imm(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm: __be32,
) {
    // SAFETY: inside wr_start .. (caller).
    if let Some(w) = unsafe { stage(qp, IBV_WR_RDMA_WRITE_WITH_IMM) } {
        w.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        w.__bindgen_anon_1.imm_data = imm;
    }
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: inside wr_start .. (caller).
    if let Some(w) = unsafe { stage(qp, IBV_WR_RDMA_READ) } {
        w.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
    }
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    // SAFETY: inside wr_start .. (caller).
    if let Some(w) = unsafe { stage(qp, IBV_WR_ATOMIC_CMP_AND_SWP) } {
        w.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
            remote_addr,
            compare_add: compare,
            swap,
            rkey,
        };
    }
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    // SAFETY: inside wr_start .. (caller).
    if let Some(w) = unsafe { stage(qp, IBV_WR_ATOMIC_FETCH_AND_ADD) } {
        w.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
            remote_addr,
            compare_add: add,
            swap: 0,
            rkey,
        };
    }
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: inside wr_start .. (caller).
    if let Some(s) = unsafe { current(qp) } {
        s.is_inline = false;
        s.sges.clear();
        // As rxe and mlx5: a zero length means no SGE at all.
        if length != 0 {
            s.sges.push(ibv_sge { addr, length, lkey });
        }
    }
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, list: *const ibv_sge) {
    // SAFETY: inside wr_start .. (caller).
    let max = unsafe { batch(qp) }.max_sge as usize;
    // SAFETY: as above.
    if let Some(s) = unsafe { current(qp) } {
        if num_sge > max {
            // SAFETY: as above.
            let b = unsafe { batch(qp) };
            b.err = limit_errno(b);
            return;
        }
        s.is_inline = false;
        s.sges.clear();
        if num_sge > 0 {
            // SAFETY: `list` holds num_sge entries (ibv_wr_post(3)).
            s.sges
                .extend_from_slice(unsafe { core::slice::from_raw_parts(list, num_sge) });
        }
    }
}

/// Copies inline pieces into the current WR, latching the limit errno past `max_inline`.
///
/// # Safety
/// As [`batch`]; each piece is readable for its length.
unsafe fn set_inline(qp: *mut ibv_qp_ex, pieces: &[ibv_data_buf]) {
    // SAFETY: caller's contract.
    let max = unsafe { batch(qp) }.max_inline as usize;
    // SAFETY: as above.
    let Some(s) = (unsafe { current(qp) }) else {
        return;
    };
    // ibv_wr_post(3): inline data is "valid only for SEND and RDMA_WRITE".
    if !matches!(
        s.wr.opcode,
        IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM
    ) {
        // SAFETY: as above.
        unsafe { batch(qp) }.err = libc::EINVAL;
        return;
    }
    let total: usize = pieces.iter().map(|p| p.length).sum();
    if total > max {
        // SAFETY: as above.
        let b = unsafe { batch(qp) };
        b.err = limit_errno(b);
        return;
    }
    s.inline.clear();
    for p in pieces {
        if p.length > 0 {
            // SAFETY: readable for its length (caller); `inline` holds max_inline bytes
            // from creation, so this does not allocate.
            s.inline.extend_from_slice(unsafe {
                core::slice::from_raw_parts(p.addr.cast::<u8>(), p.length)
            });
        }
    }
    s.sges.clear();
    s.is_inline = true;
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // SAFETY: inside wr_start ..; addr readable for length (caller).
    unsafe { set_inline(qp, &[ibv_data_buf { addr, length }]) };
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    list: *const ibv_data_buf,
) {
    let pieces = if num_buf == 0 {
        &[][..]
    } else {
        // SAFETY: `list` holds num_buf entries (ibv_wr_post(3)).
        unsafe { core::slice::from_raw_parts(list, num_buf) }
    };
    // SAFETY: inside wr_start ..; each buffer readable (caller).
    unsafe { set_inline(qp, pieces) };
}

unsafe extern "C" fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    // SAFETY: inside wr_start .. (caller).
    if let Some(s) = unsafe { current(qp) } {
        s.wr.wr.ud = ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah,
            remote_qpn: qpn,
            remote_qkey: qkey,
        };
    }
}

// ------------------------------------------------------------------ extended CQ

/// `wc_flags` softnic can report; the Rxe profile drops the timestamps (rxe's
/// RXE_SUP_WC_EX_FLAGS).
const WC_FLAGS_RXE: u64 = (IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;
const WC_FLAGS_STAMPS: u64 =
    (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK) as u64;

unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    let _errno = ErrnoScope::enter();
    // SAFETY: readable (caller).
    let a = unsafe { &*attr };
    let mut f = lock();
    let rxe = profile(&f, ctx) == Profile::Rxe;
    let supported = if rxe {
        WC_FLAGS_RXE
    } else {
        WC_FLAGS_RXE | WC_FLAGS_STAMPS
    };
    if a.wc_flags & !supported != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    if a.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0 {
        return fail(libc::EINVAL);
    }
    if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
        && a.flags & !IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0
    {
        return fail(libc::EOPNOTSUPP);
    }
    let parent = if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
        if a.parent_domain.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: live PD (caller).
        let i = unsafe { (*a.parent_domain).handle };
        match f.pds.get(i as usize) {
            // Only a parent domain may be given (ibv_create_cq_ex(3)).
            Some(Some(p)) if p.parent.is_some() => Some(i),
            _ => return fail(libc::EINVAL),
        }
    } else {
        None
    };
    if a.cqe > i32::MAX as u32 {
        return fail(libc::EINVAL);
    }
    // SAFETY: live context; channel null or live (caller).
    let p = match unsafe {
        verbs::new_cq(
            &mut f,
            ctx,
            a.cqe as c_int,
            a.cq_context,
            a.channel,
            a.comp_vector as c_int,
        )
    } {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    // SAFETY: just created; nobody else has the pointer yet.
    let i = unsafe { (*p).ibv.handle } as usize;
    let c = f.cqs[i].as_mut().expect("new CQ");
    c.stamps = a.wc_flags & WC_FLAGS_STAMPS != 0;
    c.parent_pd = parent;
    if let Some(Some(p)) = parent.and_then(|p| f.pds.get_mut(p as usize)) {
        p.users += 1;
    }
    // SAFETY: as above.
    fill_cq_ops(unsafe { &mut (*p).ibv }, a.wc_flags);
    p.cast()
}

fn fill_cq_ops(x: &mut ibv_cq_ex, flags: u64) {
    let has = |bit: u32| flags & bit as u64 != 0;
    x.start_poll = Some(start_poll);
    x.next_poll = Some(next_poll);
    x.end_poll = Some(end_poll);
    x.read_opcode = Some(read_opcode);
    x.read_vendor_err = Some(read_vendor_err);
    x.read_wc_flags = Some(read_wc_flags);
    if has(IBV_WC_EX_WITH_BYTE_LEN) {
        x.read_byte_len = Some(read_byte_len);
    }
    if has(IBV_WC_EX_WITH_IMM) {
        x.read_imm_data = Some(read_imm_data);
    }
    if has(IBV_WC_EX_WITH_QP_NUM) {
        x.read_qp_num = Some(read_qp_num);
    }
    if has(IBV_WC_EX_WITH_SRC_QP) {
        x.read_src_qp = Some(read_src_qp);
    }
    if has(IBV_WC_EX_WITH_SLID) {
        x.read_slid = Some(read_slid);
    }
    if has(IBV_WC_EX_WITH_SL) {
        x.read_sl = Some(read_sl);
    }
    if has(IBV_WC_EX_WITH_DLID_PATH_BITS) {
        x.read_dlid_path_bits = Some(read_dlid_path_bits);
    }
    if has(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) {
        x.read_completion_ts = Some(read_completion_ts);
    }
    if has(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK) {
        x.read_completion_wallclock_ns = Some(read_completion_wallclock_ns);
    }
}

/// Moves the CQ's next completion into its current slot and `cq->wr_id`/`cq->status`:
/// 0, ENOENT when empty, or EOVERFLOW after an overflow (Spec profile).
///
/// # Safety
/// A live softnic CQ, polled by this thread only.
unsafe fn advance(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: softnic CQs are SoftCq (caller).
    let s = unsafe { &*cq.cast::<SoftCq>() };
    // Fast path, as poll_cq: Acquire pairs with the Release in Cq::publish.
    if s.ready.load(Ordering::Acquire) == 0 {
        return libc::ENOENT;
    }
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live CQ.
    let i = unsafe { (*cq).handle };
    match f.pop_wc(i) {
        Ok(Some(w)) => {
            // SAFETY: only the polling thread touches `cur` and these two fields.
            unsafe {
                *s.cur.get() = w;
                (*cq).wr_id = w.wc.wr_id;
                (*cq).status = w.wc.status;
            }
            0
        }
        Ok(None) => libc::ENOENT,
        Err(e) => e,
    }
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, _attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: caller's contract.
    unsafe { advance(cq) }
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: caller's contract.
    unsafe { advance(cq) }
}

unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}

/// The completion `start_poll`/`next_poll` last returned.
///
/// # Safety
/// A live softnic CQ, read by its polling thread.
unsafe fn cur<'a>(cq: *mut ibv_cq_ex) -> &'a CurWc {
    // SAFETY: caller's contract.
    unsafe { &*(*cq.cast::<SoftCq>()).cur.get() }
}

/// The immediate (or invalidated rkey) of a completion.
fn imm_of(wc: &ibv_wc) -> __be32 {
    // SAFETY: a plain 32-bit union; either member is the same bits.
    unsafe { wc.__bindgen_anon_1.imm_data }
}

macro_rules! reader {
    ($name:ident -> $t:ty, |$c:ident| $e:expr) => {
        unsafe extern "C" fn $name(cq: *mut ibv_cq_ex) -> $t {
            // SAFETY: a live softnic CQ read by its poller (ibv_create_cq_ex(3)).
            let $c = unsafe { cur(cq) };
            $e
        }
    };
}

reader!(read_opcode -> ibv_wc_opcode, |c| c.wc.opcode);
reader!(read_vendor_err -> u32, |c| c.wc.vendor_err);
reader!(read_wc_flags -> core::ffi::c_uint, |c| c.wc.wc_flags);
reader!(read_byte_len -> u32, |c| c.wc.byte_len);
reader!(read_imm_data -> __be32, |c| imm_of(&c.wc));
reader!(read_qp_num -> u32, |c| c.wc.qp_num);
reader!(read_src_qp -> u32, |c| c.wc.src_qp);
reader!(read_slid -> u32, |c| c.wc.slid as u32);
reader!(read_sl -> u8, |c| c.wc.sl);
reader!(read_dlid_path_bits -> u8, |c| c.wc.dlid_path_bits);
reader!(read_completion_ts -> u64, |c| c.ts);
reader!(read_completion_wallclock_ns -> u64, |c| c.wall);
