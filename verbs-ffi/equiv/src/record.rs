//! The recording provider: one `extern "C"` function per provider slot and per exported
//! symbol the inlines can reach. Each appends a [`Call`] (slot name, arguments as `u64`)
//! to a thread-local log and returns a distinctive value ([`ret`]), so a wrong slot, a
//! dropped, reordered or truncated argument, or a lost return value all show up as a
//! difference between the C and the Rust side.

use core::ffi::{c_int, c_uint, c_void};
use std::cell::{Cell, RefCell};
use std::sync::Once;

use hotverbs_ffi::*;

/// One call the provider saw: which slot, with which arguments (each widened to `u64`;
/// pointers by address, signed values sign-extended).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The slot, e.g. `"ops.post_send"`, `"qp_ex.wr_set_sge"`, `"vctx.query_port"`,
    /// `"export.ibv_query_port"`.
    pub slot: &'static str,
    /// The arguments in order, plus (documented per slot) what the slot observed through
    /// its pointer arguments.
    pub args: Vec<u64>,
}

/// An argument value as the log stores it.
pub trait Arg {
    /// Widened to `u64`.
    fn arg(self) -> u64;
}

impl<T> Arg for *mut T {
    fn arg(self) -> u64 {
        self as usize as u64
    }
}
impl<T> Arg for *const T {
    fn arg(self) -> u64 {
        self as usize as u64
    }
}
macro_rules! unsigned_arg {
    ($($t:ty),*) => {$(
        impl Arg for $t {
            fn arg(self) -> u64 {
                self as u64
            }
        }
    )*};
}
unsigned_arg!(u8, u16, u32, u64, usize, bool);
impl Arg for i32 {
    fn arg(self) -> u64 {
        i64::from(self) as u64
    }
}

/// Builds a [`Call`]: `call!("ops.post_send", qp, wr, bad)`.
#[macro_export]
macro_rules! call {
    ($slot:expr $(, $a:expr)* $(,)?) => {
        $crate::Call { slot: $slot, args: vec![$($crate::Arg::arg($a)),*] }
    };
}

thread_local! {
    static FORWARD: Cell<Option<&'static IbvFns>> = const { Cell::new(None) };
    static LOG: RefCell<Vec<Call>> = const { RefCell::new(Vec::new()) };
    static RETS: RefCell<Vec<(&'static str, i64)>> = const { RefCell::new(Vec::new()) };
}

/// Makes this thread's exported-symbol stand-ins forward, after logging, to `table` (e.g.
/// softnic's `verbs_table()`) and return its answer; `None` (the default) makes them
/// answer themselves with [`ret`] values.
pub fn forward_exports_to(table: Option<&'static IbvFns>) {
    FORWARD.with(|f| f.set(table));
}

fn forward() -> Option<&'static IbvFns> {
    FORWARD.with(|f| f.get())
}

/// Appends a call to this thread's log.
pub fn log(call: Call) {
    LOG.with(|l| l.borrow_mut().push(call));
}

/// Takes (and clears) this thread's log.
pub fn take() -> Vec<Call> {
    LOG.with(|l| core::mem::take(&mut *l.borrow_mut()))
}

/// Makes `slot` return `value` on this thread from now on (until [`reset_rets`]).
pub fn set_ret(slot: &'static str, value: i64) {
    RETS.with(|r| {
        let mut r = r.borrow_mut();
        r.retain(|(s, _)| *s != slot);
        r.push((slot, value));
    });
}

/// Forgets every [`set_ret`] of this thread.
pub fn reset_rets() {
    RETS.with(|r| r.borrow_mut().clear());
}

/// What `slot` returns: the [`set_ret`] value, else a distinctive value derived from the
/// slot name (FNV-1a, so every slot returns something different and never 0).
pub fn ret(slot: &'static str) -> i64 {
    if let Some(v) = RETS.with(|r| r.borrow().iter().find(|(s, _)| *s == slot).map(|e| e.1)) {
        return v;
    }
    let mut h: u32 = 0x811c_9dc5;
    for b in slot.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    // Positive, far from any errno value, and distinct per slot.
    i64::from(h % 1_000_000) + 1_000
}

/// [`ret`] as a pointer a constructor returns (never dereferenced by the tests).
fn ret_ptr<T>(slot: &'static str) -> *mut T {
    (ret(slot) as usize * 64) as *mut T
}

/// True when the `len` bytes at `p` are all zero.
///
/// # Safety
/// `p` is valid for reading `len` bytes.
unsafe fn zeroed(p: *const c_void, len: usize) -> bool {
    // SAFETY: caller guarantees p..p+len is readable.
    unsafe { core::slice::from_raw_parts(p.cast::<u8>(), len) }
        .iter()
        .all(|&b| b == 0)
}

// ---- ibv_context.ops ------------------------------------------------------------------

/// `ops.post_send`: logs `(qp, wr, bad_wr)`; when returning non-zero, sets `*bad_wr` to
/// the second WR of the chain (or the first if alone), as a provider names the failed WR.
///
/// # Safety
/// `qp` is a QP of a fake device, `wr` a live chain, `bad_wr` writable.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    const SLOT: &str = "ops.post_send";
    log(crate::call!(SLOT, qp, wr, bad_wr));
    let r = ret(SLOT) as c_int;
    if r != 0 {
        // SAFETY: the tests pass a live WR chain and a writable bad_wr.
        unsafe {
            let next = (*wr).next;
            *bad_wr = if next.is_null() { wr } else { next };
        }
    }
    r
}

/// `ops.post_recv`: as [`post_send`] for receive WRs.
///
/// # Safety
/// `qp` is a QP of a fake device, `wr` a live chain, `bad_wr` writable.
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    const SLOT: &str = "ops.post_recv";
    log(crate::call!(SLOT, qp, wr, bad_wr));
    let r = ret(SLOT) as c_int;
    if r != 0 {
        // SAFETY: the tests pass a live WR chain and a writable bad_wr.
        unsafe {
            let next = (*wr).next;
            *bad_wr = if next.is_null() { wr } else { next };
        }
    }
    r
}

/// `ops.post_srq_recv`: as [`post_recv`] for an SRQ.
///
/// # Safety
/// `srq` is an SRQ of a fake device, `wr` a live chain, `bad_wr` writable.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    const SLOT: &str = "ops.post_srq_recv";
    log(crate::call!(SLOT, srq, wr, bad_wr));
    let r = ret(SLOT) as c_int;
    if r != 0 {
        // SAFETY: the tests pass a live WR chain and a writable bad_wr.
        unsafe {
            let next = (*wr).next;
            *bad_wr = if next.is_null() { wr } else { next };
        }
    }
    r
}

/// `ops.poll_cq`: logs `(cq, num_entries, wc)` and fills `min(num_entries, 2)` entries
/// (`wr_id` = 0xC0DE0 + i, `byte_len` = 100 + i).
///
/// # Safety
/// `wc` has room for `num_entries` completions.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    const SLOT: &str = "ops.poll_cq";
    log(crate::call!(SLOT, cq, num_entries, wc));
    for i in 0..num_entries.clamp(0, 2) as usize {
        // SAFETY: the tests pass room for num_entries completions.
        unsafe {
            let e = &mut *wc.add(i);
            e.wr_id = 0xC0DE0 + i as u64;
            e.byte_len = 100 + i as u32;
            e.status = IBV_WC_SUCCESS;
        }
    }
    ret(SLOT) as c_int
}

/// `ops.req_notify_cq`: logs `(cq, solicited_only)`.
///
/// # Safety
/// None beyond the slot's C signature (nothing is dereferenced).
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    const SLOT: &str = "ops.req_notify_cq";
    log(crate::call!(SLOT, cq, solicited_only));
    ret(SLOT) as c_int
}

// ---- ibv_qp_ex ------------------------------------------------------------------------

macro_rules! qp_ex_recorders {
    ($($name:ident ( $($arg:ident : $ty:ty),* ) $(-> $r:ty)?;)*) => {$(
        #[doc = concat!("`qp_ex.", stringify!($name), "`: logs `(qp", $(", ", stringify!($arg),)* ")`.")]
        ///
        /// # Safety
        /// None (nothing is dereferenced; pointer arguments are only logged).
        pub unsafe extern "C" fn $name(qp: *mut ibv_qp_ex $(, $arg: $ty)*) $(-> $r)? {
            const SLOT: &str = concat!("qp_ex.", stringify!($name));
            log(crate::call!(SLOT, qp $(, $arg)*));
            $( ret(SLOT) as $r )?
        }
    )*};
}

qp_ex_recorders! {
    wr_start();
    wr_complete() -> c_int;
    wr_abort();
    wr_send();
    wr_send_imm(imm_data: __be32);
    wr_send_inv(invalidate_rkey: u32);
    wr_send_tso(hdr: *mut c_void, hdr_sz: u16, mss: u16);
    wr_rdma_write(rkey: u32, remote_addr: u64);
    wr_rdma_write_imm(rkey: u32, remote_addr: u64, imm_data: __be32);
    wr_rdma_read(rkey: u32, remote_addr: u64);
    wr_atomic_cmp_swp(rkey: u32, remote_addr: u64, compare: u64, swap: u64);
    wr_atomic_fetch_add(rkey: u32, remote_addr: u64, add: u64);
    wr_atomic_write(rkey: u32, remote_addr: u64, atomic_wr: *const c_void);
    wr_bind_mw(mw: *mut ibv_mw, rkey: u32, bind_info: *const ibv_mw_bind_info);
    wr_local_inv(invalidate_rkey: u32);
    wr_set_sge(lkey: u32, addr: u64, length: u32);
    wr_set_sge_list(num_sge: usize, sg_list: *const ibv_sge);
    wr_set_inline_data(addr: *mut c_void, length: usize);
    wr_set_inline_data_list(num_buf: usize, buf_list: *const ibv_data_buf);
    wr_set_ud_addr(ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32);
    wr_set_xrc_srqn(remote_srqn: u32);
}

// ---- ibv_cq_ex ------------------------------------------------------------------------

macro_rules! cq_ex_recorders {
    ($($name:ident ( $($arg:ident : $ty:ty),* ) $(-> $r:ty)?;)*) => {$(
        #[doc = concat!("`cq_ex.", stringify!($name), "`: logs `(cq", $(", ", stringify!($arg),)* ")`.")]
        ///
        /// # Safety
        /// None (nothing is dereferenced; pointer arguments are only logged).
        pub unsafe extern "C" fn $name(cq: *mut ibv_cq_ex $(, $arg: $ty)*) $(-> $r)? {
            const SLOT: &str = concat!("cq_ex.", stringify!($name));
            log(crate::call!(SLOT, cq $(, $arg)*));
            $( ret(SLOT) as $r )?
        }
    )*};
}

cq_ex_recorders! {
    start_poll(attr: *mut ibv_poll_cq_attr) -> c_int;
    next_poll() -> c_int;
    end_poll();
    read_opcode() -> ibv_wc_opcode;
    read_vendor_err() -> u32;
    read_byte_len() -> u32;
    read_imm_data() -> __be32;
    read_qp_num() -> u32;
    read_src_qp() -> u32;
    read_wc_flags() -> c_uint;
    read_slid() -> u32;
    read_sl() -> u8;
    read_dlid_path_bits() -> u8;
    read_completion_ts() -> u64;
    read_completion_wallclock_ns() -> u64;
    read_cvlan() -> u16;
    read_flow_tag() -> u32;
    read_tm_info(tm_info: *mut ibv_wc_tm_info);
}

// ---- verbs_context ops ----------------------------------------------------------------

/// `vctx.query_port`: logs `(ctx, port_num, port_attr, port_attr_len, attr-was-all-zero)`
/// and writes `lid` / `state` / `gid_tbl_len` derived from the port number.
///
/// # Safety
/// `attr` is a writable, initialised `ibv_port_attr` of `len` bytes.
pub unsafe extern "C" fn vctx_query_port(
    ctx: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    const SLOT: &str = "vctx.query_port";
    // SAFETY: the tests pass a full ibv_port_attr of `len` bytes.
    let was_zero = unsafe { zeroed(attr.cast(), len) };
    log(crate::call!(SLOT, ctx, port_num, attr, len, was_zero));
    // SAFETY: as above, writable.
    unsafe {
        (*attr).lid = 0x4000 | u16::from(port_num);
        (*attr).state = IBV_PORT_ACTIVE;
        (*attr).gid_tbl_len = 17;
    }
    ret(SLOT) as c_int
}

/// `vctx.query_device_ex`: logs `(ctx, input, attr, attr_size, attr-was-all-zero)` and
/// writes `orig_attr.max_qp` and `max_dm_size`.
///
/// # Safety
/// `attr` is a writable, initialised `ibv_device_attr_ex` of `attr_size` bytes.
pub unsafe extern "C" fn vctx_query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    const SLOT: &str = "vctx.query_device_ex";
    // SAFETY: the tests pass a full ibv_device_attr_ex of `attr_size` bytes.
    let was_zero = unsafe { zeroed(attr.cast(), attr_size) };
    log(crate::call!(SLOT, ctx, input, attr, attr_size, was_zero));
    // SAFETY: as above, writable.
    unsafe {
        (*attr).orig_attr.max_qp = 4321;
        (*attr).max_dm_size = 0x1000;
    }
    ret(SLOT) as c_int
}

/// `vctx.create_qp_ex`: logs `(ctx, attr)`.
///
/// # Safety
/// None (nothing is dereferenced).
pub unsafe extern "C" fn vctx_create_qp_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    const SLOT: &str = "vctx.create_qp_ex";
    log(crate::call!(SLOT, ctx, attr));
    ret_ptr(SLOT)
}

/// `vctx.create_srq_ex`: logs `(ctx, attr)`.
///
/// # Safety
/// None (nothing is dereferenced).
pub unsafe extern "C" fn vctx_create_srq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    const SLOT: &str = "vctx.create_srq_ex";
    log(crate::call!(SLOT, ctx, attr));
    ret_ptr(SLOT)
}

/// `vctx.create_cq_ex`: logs `(ctx, attr)`.
///
/// # Safety
/// None (nothing is dereferenced).
pub unsafe extern "C" fn vctx_create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    const SLOT: &str = "vctx.create_cq_ex";
    log(crate::call!(SLOT, ctx, attr));
    ret_ptr(SLOT)
}

/// `vctx.alloc_td`: logs `(ctx, init_attr)`.
///
/// # Safety
/// None (nothing is dereferenced).
pub unsafe extern "C" fn vctx_alloc_td(
    ctx: *mut ibv_context,
    init_attr: *mut ibv_td_init_attr,
) -> *mut ibv_td {
    const SLOT: &str = "vctx.alloc_td";
    log(crate::call!(SLOT, ctx, init_attr));
    ret_ptr(SLOT)
}

/// `vctx.dealloc_td`: logs `(td)`.
///
/// # Safety
/// None (nothing is dereferenced).
pub unsafe extern "C" fn vctx_dealloc_td(td: *mut ibv_td) -> c_int {
    const SLOT: &str = "vctx.dealloc_td";
    log(crate::call!(SLOT, td));
    ret(SLOT) as c_int
}

/// `vctx.alloc_parent_domain`: logs `(ctx, attr)`.
///
/// # Safety
/// None (nothing is dereferenced).
pub unsafe extern "C" fn vctx_alloc_parent_domain(
    ctx: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    const SLOT: &str = "vctx.alloc_parent_domain";
    log(crate::call!(SLOT, ctx, attr));
    ret_ptr(SLOT)
}

/// `vctx.query_rt_values`: logs `(ctx, values)`.
///
/// # Safety
/// None (nothing is dereferenced).
pub unsafe extern "C" fn vctx_query_rt_values(
    ctx: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> c_int {
    const SLOT: &str = "vctx.query_rt_values";
    log(crate::call!(SLOT, ctx, values));
    ret(SLOT) as c_int
}

// ---- exported symbols (reached through csrc/equiv.c's stand-ins) ------------------------
//
// Each logs, then either answers itself (writing a recognisable field) or, when this thread
// called `forward_exports_to(Some(table))`, returns what `table`'s verb answers.

/// `ibv_query_port@IBVERBS_1.1`: logs `(ctx, port_num, attr, whole-ibv_port_attr-was-zero)`
/// (the header zeroes the new, larger struct before calling the compat prototype) and
/// writes `lid`.
///
/// # Safety
/// `attr` points to a writable, initialised, full (new) `ibv_port_attr`.
unsafe extern "C" fn export_query_port(
    ctx: *mut ibv_context,
    port_num: u8,
    attr: *mut _compat_ibv_port_attr,
) -> c_int {
    const SLOT: &str = "export.ibv_query_port";
    // SAFETY: the tests always pass a full (new) ibv_port_attr behind the compat pointer.
    let was_zero = unsafe { zeroed(attr.cast(), core::mem::size_of::<ibv_port_attr>()) };
    log(crate::call!(SLOT, ctx, port_num, attr, was_zero));
    if let Some(f) = forward().and_then(|t| t.ibv_query_port) {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { f(ctx, port_num, attr) };
    }
    // SAFETY: writable (as above); lid is in the common prefix of both layouts.
    unsafe { (*attr.cast::<ibv_port_attr>()).lid = 0x2000 | u16::from(port_num) };
    ret(SLOT) as c_int
}

/// `ibv_query_device`: logs `(ctx, attr, whole-ibv_device_attr_ex-was-zero)` (the header
/// zeroes all of the extended struct, whose first member this is) and writes `max_qp`.
///
/// # Safety
/// `attr` is `&orig_attr` of a writable, initialised `ibv_device_attr_ex`.
unsafe extern "C" fn export_query_device(
    ctx: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    const SLOT: &str = "export.ibv_query_device";
    // SAFETY: the tests always pass `&attr_ex.orig_attr` (offset 0) of a full attr_ex.
    let was_zero = unsafe { zeroed(attr.cast(), core::mem::size_of::<ibv_device_attr_ex>()) };
    log(crate::call!(SLOT, ctx, attr, was_zero));
    if let Some(f) = forward().and_then(|t| t.ibv_query_device) {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { f(ctx, attr) };
    }
    // SAFETY: writable (as above).
    unsafe { (*attr).max_qp = 1234 };
    ret(SLOT) as c_int
}

/// `ibv_create_qp`: logs `(pd, attr)`.
///
/// # Safety
/// None (nothing is dereferenced) unless forwarding: then as the forward table's verb.
unsafe extern "C" fn export_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    const SLOT: &str = "export.ibv_create_qp";
    log(crate::call!(SLOT, pd, attr));
    if let Some(f) = forward().and_then(|t| t.ibv_create_qp) {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { f(pd, attr) };
    }
    ret_ptr(SLOT)
}

/// `ibv_create_srq`: logs `(pd, attr)`.
///
/// # Safety
/// None (nothing is dereferenced) unless forwarding: then as the forward table's verb.
unsafe extern "C" fn export_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    const SLOT: &str = "export.ibv_create_srq";
    log(crate::call!(SLOT, pd, attr));
    if let Some(f) = forward().and_then(|t| t.ibv_create_srq) {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { f(pd, attr) };
    }
    ret_ptr(SLOT)
}

/// `_ibv_query_gid_ex`: logs `(ctx, port_num, gid_index, entry, flags, entry_size)` and
/// writes `entry.gid_index` / `port_num`.
///
/// # Safety
/// `entry` is a writable `ibv_gid_entry`.
unsafe extern "C" fn export_query_gid_ex(
    ctx: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    const SLOT: &str = "export._ibv_query_gid_ex";
    log(crate::call!(
        SLOT, ctx, port_num, gid_index, entry, flags, entry_size
    ));
    if let Some(f) = forward().and_then(|t| t._ibv_query_gid_ex) {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { f(ctx, port_num, gid_index, entry, flags, entry_size) };
    }
    // SAFETY: caller's contract.
    unsafe {
        (*entry).gid_index = gid_index;
        (*entry).port_num = port_num;
    }
    ret(SLOT) as c_int
}

/// `_ibv_query_gid_table`: logs `(ctx, entries, max_entries, flags, entry_size)`.
///
/// # Safety
/// None (nothing is dereferenced).
unsafe extern "C" fn export_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    const SLOT: &str = "export._ibv_query_gid_table";
    log(crate::call!(
        SLOT,
        ctx,
        entries,
        max_entries,
        flags,
        entry_size
    ));
    if let Some(f) = forward().and_then(|t| t._ibv_query_gid_table) {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { f(ctx, entries, max_entries, flags, entry_size) };
    }
    ret(SLOT) as isize
}

/// Points csrc/equiv.c's exported-symbol stand-ins at this module's recorders (once per
/// process; [`crate::run`] calls it).
pub fn install_export_hooks() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: plain stores of function pointers into the C file's statics, done once
        // before any stand-in can be called (every caller goes through this first).
        unsafe {
            crate::c::hv_c_set_export_hooks(
                export_query_port,
                export_query_device,
                export_create_qp,
                export_create_srq,
            );
            crate::c::hv_c_set_gid_hooks(export_query_gid_ex, export_query_gid_table);
        }
    });
}
