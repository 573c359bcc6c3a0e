//! Helpers for softnic's integration tests: everything goes through `verbs_table()` and
//! `hotverbs_ffi::inline::*`, as the real stack drives a device.
//!
//! The unsafety lives here once. The contract of every helper taking raw verbs objects
//! (`*mut ibv_context`/`ibv_qp`/`ibv_cq`/...): they were made by these helpers or through
//! `verbs_table()` and are not yet destroyed — the tests keep their objects alive for the
//! whole test (a [`Pair`]/[`Dev`] is never torn down) and only destroy them as the last use.
//! softnic validates handles itself, so a broken contract shows up as EINVAL, not as
//! corrupted memory; still, these are test helpers, not a safe API.
// Not every test binary uses every helper.
#![allow(dead_code)]

use core::ptr::null_mut;

pub use hotverbs_ffi::*;
pub use hotverbs_softnic::testing::ALL_ACCESS;
use hotverbs_softnic::testing::{self, ConnectAttr};
// Not every test binary uses every mask.
#[allow(unused_imports)]
pub use hotverbs_softnic::testing::{RC_RTR_MASK, RC_RTS_MASK, UC_RTR_MASK};
pub use hotverbs_softnic::verbs_table;

pub fn fns() -> &'static IbvFns {
    verbs_table()
}

/// Opens the listed default device.
pub fn open_default() -> *mut ibv_context {
    let (ctx, n) = testing::open_listed_device();
    assert_eq!(n, 1);
    ctx
}

pub struct Dev {
    pub ctx: *mut ibv_context,
    pub pd: *mut ibv_pd,
}

impl Dev {
    pub fn new() -> Dev {
        Dev::with_ctx(open_default())
    }

    /// A PD on a new device of `profile` (explicit: whatever `HOTVERBS_SOFTNIC_PROFILE`
    /// says).
    pub fn with_profile(profile: hotverbs_softnic::Profile) -> Dev {
        let ctx = hotverbs_softnic::open_device(hotverbs_softnic::Config {
            profile,
            ..Default::default()
        });
        assert!(!ctx.is_null(), "open_device: {}", errno());
        Dev::with_ctx(ctx)
    }

    /// A PD on a new Spec-profile device: for tests of the man-page behaviour, which
    /// `tests/profiles.rs` checks side by side with rxe's.
    pub fn spec() -> Dev {
        Dev::with_profile(hotverbs_softnic::Profile::Spec)
    }

    /// The profile of this device (`hotverbs_softnic::device_profile`).
    pub fn profile(&self) -> hotverbs_softnic::Profile {
        // SAFETY: self.ctx is live (module contract).
        unsafe { hotverbs_softnic::device_profile(self.ctx) }
    }

    pub fn with_ctx(ctx: *mut ibv_context) -> Dev {
        // SAFETY: ctx is live (module contract).
        let pd = unsafe { testing::alloc_pd(ctx) };
        Dev { ctx, pd }
    }

    pub fn cq(&self, cqe: i32) -> *mut ibv_cq {
        // SAFETY: self.ctx is live.
        unsafe { testing::create_cq(self.ctx, cqe) }
    }

    /// Registers a zeroed buffer of `len` bytes.
    pub fn buf(&self, len: usize, access: u32) -> Buf {
        let mut mem = vec![0u8; len.max(8)].into_boxed_slice();
        // SAFETY: mem is a heap allocation of at least len bytes owned by the returned Buf,
        // so it stays put for as long as the registration (Buf never deregisters).
        let mr = unsafe { testing::reg_mr(self.pd, mem.as_mut_ptr(), len, access) };
        Buf { mem, mr }
    }

    pub fn qp(
        &self,
        qpt: ibv_qp_type,
        scq: *mut ibv_cq,
        rcq: *mut ibv_cq,
        cap: ibv_qp_cap,
    ) -> *mut ibv_qp {
        // SAFETY: self.pd is live and the CQs are live (module contract).
        unsafe { testing::create_qp(self.pd, qpt, scq, rcq, cap, null_mut()) }
    }
}

pub fn cap(depth: u32) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

/// A registered heap buffer. The device writes `mem` behind the compiler's back, so the
/// test reads it with [`Buf::get`]/[`Buf::bytes`] (volatile) after the completion, and
/// writes it with [`Buf::fill`] only while no work request covers it.
pub struct Buf {
    pub mem: Box<[u8]>,
    pub mr: *mut ibv_mr,
}

impl Buf {
    pub fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }
    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR was registered in Dev::buf and is deregistered only by tests
        // that then stop using the Buf.
        unsafe { (*self.mr).lkey }
    }
    pub fn rkey(&self) -> u32 {
        // SAFETY: as in lkey.
        unsafe { (*self.mr).rkey }
    }
    pub fn sge(&self, off: usize, len: u32) -> ibv_sge {
        ibv_sge {
            addr: self.addr() + off as u64,
            length: len,
            lkey: self.lkey(),
        }
    }
    /// Reads memory the device may have written (volatile: the compiler cannot see the
    /// device's writes through the raw pointer).
    pub fn get(&self, i: usize) -> u8 {
        assert!(i < self.mem.len(), "Buf::get({i}) out of bounds");
        // SAFETY: i is in bounds (checked) of the live allocation.
        unsafe { core::ptr::read_volatile(self.mem.as_ptr().add(i)) }
    }
    pub fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        (off..off + len).map(|i| self.get(i)).collect()
    }
    pub fn fill(&mut self, off: usize, data: &[u8]) {
        self.mem[off..off + data.len()].copy_from_slice(data);
    }
}

pub fn gid(ctx: *mut ibv_context, index: i32) -> ibv_gid {
    // SAFETY: ctx is live (module contract).
    unsafe { testing::query_gid(ctx, index) }
}

pub fn modify(qp: *mut ibv_qp, attr: &mut ibv_qp_attr, mask: u32) -> i32 {
    // SAFETY: qp is live (module contract).
    unsafe { testing::modify_qp(qp, attr, mask) }
}

pub fn state(qp: *mut ibv_qp) -> ibv_qp_state {
    // SAFETY: qp is live (module contract).
    unsafe { (*qp).state }
}

pub fn qpn(qp: *mut ibv_qp) -> u32 {
    // SAFETY: qp is live (module contract).
    unsafe { (*qp).qp_num }
}

/// The connection attributes these tests use: Q_Key 0x1111, 4 RDMA READ/atomics in
/// flight, `min_rnr_timer` 12, hop limit 64.
pub fn attrs(dgid: ibv_gid, dest: u32, access: u32, rnr_retry: u8) -> ConnectAttr {
    ConnectAttr {
        access,
        qkey: 0x1111,
        rnr_retry,
        rd_atomic: 4,
        min_rnr_timer: 12,
        hop_limit: 64,
        ..ConnectAttr::new(dest, dgid)
    }
}

pub fn to_init(qp: *mut ibv_qp, access: u32) {
    // SAFETY: qp is live (module contract).
    unsafe { testing::qp_to_init(qp, &attrs(ibv_gid::default(), 0, access, 7)) }
}

pub fn rtr_attr(ctx: *mut ibv_context, dest: u32) -> ibv_qp_attr {
    testing::rtr_attr(&attrs(gid(ctx, 1), dest, ALL_ACCESS, 7))
}

/// The QP's transport type.
pub fn qp_type(qp: *mut ibv_qp) -> ibv_qp_type {
    // SAFETY: qp is live (module contract).
    unsafe { (*qp).qp_type }
}

pub fn to_rtr(qp: *mut ibv_qp, ctx: *mut ibv_context, dest: u32) {
    // SAFETY: qp is live (module contract).
    unsafe { testing::qp_to_rtr(qp, &attrs(gid(ctx, 1), dest, ALL_ACCESS, 7)) }
}

pub fn to_rts(qp: *mut ibv_qp, rnr_retry: u8) {
    // SAFETY: qp is live (module contract).
    unsafe { testing::qp_to_rts(qp, &attrs(ibv_gid::default(), 0, ALL_ACCESS, rnr_retry)) }
}

/// Brings `qp` to RTS connected to `dest` (RC/UC) or ready (UD).
pub fn connect(qp: *mut ibv_qp, ctx: *mut ibv_context, dest: u32, access: u32, rnr_retry: u8) {
    // SAFETY: qp is live (module contract).
    unsafe { testing::connect_qp(qp, &attrs(gid(ctx, 1), dest, access, rnr_retry)) }
}

/// Two connected QPs `a` and `b`, each with its own CQ (send and receive share it) and a
/// 4 KiB buffer with every access right.
pub struct Pair {
    pub dev: Dev,
    pub cq_a: *mut ibv_cq,
    pub cq_b: *mut ibv_cq,
    pub a: *mut ibv_qp,
    pub b: *mut ibv_qp,
    pub buf_a: Buf,
    pub buf_b: Buf,
}

impl Pair {
    pub fn new(qpt: ibv_qp_type) -> Pair {
        Pair::with(qpt, 16, 7)
    }

    pub fn with(qpt: ibv_qp_type, depth: u32, rnr_retry: u8) -> Pair {
        Pair::on(Dev::new(), qpt, depth, rnr_retry)
    }

    /// [`Pair::with`] on a Spec-profile device ([`Dev::spec`]).
    pub fn spec_with(qpt: ibv_qp_type, depth: u32, rnr_retry: u8) -> Pair {
        Pair::on(Dev::spec(), qpt, depth, rnr_retry)
    }

    /// [`Pair::new`] on a Spec-profile device ([`Dev::spec`]).
    pub fn spec(qpt: ibv_qp_type) -> Pair {
        Pair::spec_with(qpt, 16, 7)
    }

    /// A pair on `dev` (e.g. [`Dev::with_profile`]).
    pub fn on(dev: Dev, qpt: ibv_qp_type, depth: u32, rnr_retry: u8) -> Pair {
        let cq_a = dev.cq(256);
        let cq_b = dev.cq(256);
        let a = dev.qp(qpt, cq_a, cq_a, cap(depth));
        let b = dev.qp(qpt, cq_b, cq_b, cap(depth));
        connect(a, dev.ctx, qpn(b), ALL_ACCESS, rnr_retry);
        connect(b, dev.ctx, qpn(a), ALL_ACCESS, rnr_retry);
        let buf_a = dev.buf(4096, ALL_ACCESS);
        let buf_b = dev.buf(4096, ALL_ACCESS);
        Pair {
            dev,
            cq_a,
            cq_b,
            a,
            b,
            buf_a,
            buf_b,
        }
    }
}

/// A send WR with the given opcode and SGEs (kept alive by the caller).
pub fn send_wr(wr_id: u64, opcode: ibv_wr_opcode, sges: &mut [ibv_sge], flags: u32) -> ibv_send_wr {
    ibv_send_wr {
        wr_id,
        sg_list: if sges.is_empty() {
            null_mut()
        } else {
            sges.as_mut_ptr()
        },
        num_sge: sges.len() as i32,
        opcode,
        send_flags: flags,
        ..Default::default()
    }
}

pub fn rdma(mut wr: ibv_send_wr, remote_addr: u64, rkey: u32) -> ibv_send_wr {
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    wr
}

pub fn atomic(
    mut wr: ibv_send_wr,
    remote_addr: u64,
    rkey: u32,
    compare_add: u64,
    swap: u64,
) -> ibv_send_wr {
    wr.wr.atomic.remote_addr = remote_addr;
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.compare_add = compare_add;
    wr.wr.atomic.swap = swap;
    wr
}

/// Posts one WR; returns the result.
pub fn post(qp: *mut ibv_qp, wr: &mut ibv_send_wr) -> i32 {
    let mut bad = null_mut();
    wr.next = null_mut();
    // SAFETY: qp is live (module contract); wr is a single valid WR whose SGEs the caller
    // keeps alive; softnic copies the WR during the call and checks every SGE against
    // its MR, so memory outside registered buffers is never touched.
    unsafe { inline::ibv_post_send(qp, wr, &mut bad) }
}

/// Links `wrs` into a chain and posts it; returns (rc, index of bad_wr).
pub fn post_chain(qp: *mut ibv_qp, wrs: &mut [ibv_send_wr]) -> (i32, Option<usize>) {
    let n = wrs.len();
    let base = wrs.as_mut_ptr();
    for i in 0..n {
        let next = if i + 1 < n {
            // SAFETY: i + 1 < n, so the pointer is inside wrs.
            unsafe { base.add(i + 1) }
        } else {
            null_mut()
        };
        // SAFETY: i < n, in bounds of wrs, which we borrow mutably.
        unsafe { (*base.add(i)).next = next };
    }
    let mut bad: *mut ibv_send_wr = null_mut();
    // SAFETY: as in post; the chain is linked inside wrs and ends with NULL.
    let rc = unsafe { inline::ibv_post_send(qp, base, &mut bad) };
    // SAFETY: a non-NULL bad_wr points to one of the WRs of the chain, i.e. into wrs.
    let idx = (!bad.is_null()).then(|| unsafe { bad.offset_from(base) } as usize);
    (rc, idx)
}

/// Posts one receive of the given SGEs.
pub fn post_recv(qp: *mut ibv_qp, wr_id: u64, sges: &mut [ibv_sge]) -> i32 {
    let mut wr = ibv_recv_wr {
        wr_id,
        next: null_mut(),
        sg_list: sges.as_mut_ptr(),
        num_sge: sges.len() as i32,
    };
    let mut bad = null_mut();
    // SAFETY: qp is live (module contract); wr and its SGE list are valid for the call
    // (softnic copies them); the memory is checked against the MRs.
    unsafe { inline::ibv_post_recv(qp, &mut wr, &mut bad) }
}

/// Everything currently in the CQ.
pub fn drain(cq: *mut ibv_cq) -> Vec<ibv_wc> {
    let mut out = Vec::new();
    let mut wc = [ibv_wc::default(); 16];
    loop {
        let n = poll(cq, &mut wc);
        assert!(n >= 0, "poll_cq returned {n}");
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&wc[..n as usize]);
    }
}

/// `ibv_poll_cq` into `wc` (up to its length); returns the count or the negative error.
pub fn poll(cq: *mut ibv_cq, wc: &mut [ibv_wc]) -> i32 {
    let n = i32::try_from(wc.len()).unwrap_or(i32::MAX);
    // SAFETY: cq is live (module contract); wc has room for n entries.
    unsafe { inline::ibv_poll_cq(cq, n, wc.as_mut_ptr()) }
}

/// (wr_id, status) of each completion.
pub fn ids(wcs: &[ibv_wc]) -> Vec<(u64, u32)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

pub fn imm(wc: &ibv_wc) -> u32 {
    // SAFETY: both union members (imm_data, invalidated_rkey) are plain u32s.
    unsafe { wc.__bindgen_anon_1.imm_data }
}

/// Is `fd` readable right now (`poll` with a zero timeout)?
pub fn readable(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; zero timeout, so it never blocks.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// Pops the next async event of `ctx` without blocking, if any.
pub fn async_event(ctx: *mut ibv_context) -> Option<(ibv_event_type, usize)> {
    // SAFETY: ctx is live (module contract).
    let fd = unsafe { (*ctx).async_fd };
    if !readable(fd) {
        return None;
    }
    let mut ev = ibv_async_event::default();
    assert_eq!(
        // SAFETY: ctx is live; the fd is readable, so this does not block.
        unsafe { fns().ibv_get_async_event.unwrap()(ctx, &mut ev) },
        0
    );
    // SAFETY: every member of the element union is a pointer (or an int of the same
    // size, port_num, zero-extended); reading it as a pointer only records the address.
    let el = unsafe { ev.element.qp } as usize;
    // SAFETY: ev was returned by ibv_get_async_event and is acked once.
    unsafe { fns().ibv_ack_async_event.unwrap()(&mut ev) };
    Some((ev.event_type, el))
}

pub fn all_async_events(ctx: *mut ibv_context) -> Vec<(ibv_event_type, usize)> {
    std::iter::from_fn(|| async_event(ctx)).collect()
}

/// Posted-but-unreleased SQ slots of `qp` (`hotverbs_softnic::sq_outstanding`).
pub fn sq_outstanding(qp: *mut ibv_qp) -> u32 {
    // SAFETY: qp is a live softnic QP (module contract).
    unsafe { hotverbs_softnic::sq_outstanding(qp) }
}

/// Send WRs of `qp` waiting in RNR retry (`hotverbs_softnic::send_wrs_waiting`).
pub fn send_wrs_waiting(qp: *mut ibv_qp) -> usize {
    // SAFETY: qp is a live softnic QP (module contract).
    unsafe { hotverbs_softnic::send_wrs_waiting(qp) }
}

/// Posted receives of `qp` not yet consumed (`hotverbs_softnic::rq_outstanding`).
pub fn rq_outstanding(qp: *mut ibv_qp) -> u32 {
    // SAFETY: qp is a live softnic QP (module contract).
    unsafe { hotverbs_softnic::rq_outstanding(qp) }
}

/// The next `n` completions pushed to `cq` overflow it
/// (`hotverbs_softnic::inject_cq_overflow`).
pub fn inject_cq_overflow(cq: *mut ibv_cq, n: u32) {
    // SAFETY: cq is a live softnic CQ (module contract).
    unsafe { hotverbs_softnic::inject_cq_overflow(cq, n) }
}

/// Moves `qp` to ERR as a fatal error would (`hotverbs_softnic::inject_qp_error`).
pub fn inject_qp_error(qp: *mut ibv_qp) {
    // SAFETY: qp is a live softnic QP (module contract).
    unsafe { hotverbs_softnic::inject_qp_error(qp) }
}

/// `ibv_query_qp` of `mask` into `attr`/`init`; returns the verb's result.
pub fn query_qp(
    qp: *mut ibv_qp,
    attr: &mut ibv_qp_attr,
    mask: u32,
    init: &mut ibv_qp_init_attr,
) -> i32 {
    // SAFETY: qp is live (module contract); attr and init are valid out-parameters.
    unsafe { fns().ibv_query_qp.unwrap()(qp, attr, mask as i32, init) }
}

/// `ibv_create_qp` in `pd`; NULL (errno set) on failure.
pub fn create_qp(pd: *mut ibv_pd, init: &mut ibv_qp_init_attr) -> *mut ibv_qp {
    // SAFETY: pd and the CQs/SRQ in init are live (module contract); init is valid.
    unsafe { fns().ibv_create_qp.unwrap()(pd, init) }
}

/// `ibv_create_ah` in `pd`; NULL (errno set) on failure.
pub fn create_ah(pd: *mut ibv_pd, attr: &mut ibv_ah_attr) -> *mut ibv_ah {
    // SAFETY: pd is live (module contract); attr is valid.
    unsafe { fns().ibv_create_ah.unwrap()(pd, attr) }
}

/// `ibv_req_notify_cq(cq, solicited_only)`.
pub fn req_notify(cq: *mut ibv_cq, solicited_only: bool) -> i32 {
    // SAFETY: cq is live (module contract).
    unsafe { inline::ibv_req_notify_cq(cq, i32::from(solicited_only)) }
}

/// Two UD QPs on one CQ, brought to RTS by [`connect`] (Q_Key 0x1111), and a registered
/// buffer of 8 KiB.
pub struct Ud {
    pub dev: Dev,
    pub cq: *mut ibv_cq,
    pub a: *mut ibv_qp,
    pub b: *mut ibv_qp,
    pub buf: Buf,
}

impl Ud {
    pub fn on(dev: Dev) -> Ud {
        let cq = dev.cq(64);
        let a = dev.qp(IBV_QPT_UD, cq, cq, cap(8));
        let b = dev.qp(IBV_QPT_UD, cq, cq, cap(8));
        connect(a, dev.ctx, 0, 0, 0);
        connect(b, dev.ctx, 0, 0, 0);
        let buf = dev.buf(8192, ALL_ACCESS);
        Ud { dev, cq, a, b, buf }
    }
}

/// A RoCE AH on `dev`'s port 1 to `dgid`, from GID index 1.
pub fn ah_to(dev: &Dev, dgid: ibv_gid) -> *mut ibv_ah {
    let mut a = ibv_ah_attr {
        is_global: 1,
        port_num: 1,
        ..Default::default()
    };
    a.grh.dgid = dgid;
    a.grh.sgid_index = 1;
    a.grh.hop_limit = 64;
    let ah = create_ah(dev.pd, &mut a);
    assert!(!ah.is_null(), "create_ah errno {}", errno());
    ah
}
