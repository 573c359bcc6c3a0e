//! Helpers for softnic's integration tests: everything goes through `verbs_table()` and
//! `hotverbs_ffi::inline::*`, as the real stack drives a device.
#![allow(
    dead_code,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

use core::ptr::null_mut;

pub use hotverbs_ffi::*;
pub use hotverbs_softnic::verbs_table;

pub fn fns() -> &'static IbvFns {
    verbs_table()
}

/// Opens the listed default device.
pub fn open_default() -> *mut ibv_context {
    let f = fns();
    unsafe {
        let mut n = 0;
        let list = f.ibv_get_device_list.unwrap()(&mut n);
        assert_eq!(n, 1);
        let ctx = f.ibv_open_device.unwrap()(*list);
        f.ibv_free_device_list.unwrap()(list);
        assert!(!ctx.is_null());
        ctx
    }
}

pub struct Dev {
    pub ctx: *mut ibv_context,
    pub pd: *mut ibv_pd,
}

impl Dev {
    pub fn new() -> Dev {
        let ctx = open_default();
        let pd = unsafe { fns().ibv_alloc_pd.unwrap()(ctx) };
        assert!(!pd.is_null());
        Dev { ctx, pd }
    }

    pub fn with_ctx(ctx: *mut ibv_context) -> Dev {
        let pd = unsafe { fns().ibv_alloc_pd.unwrap()(ctx) };
        assert!(!pd.is_null());
        Dev { ctx, pd }
    }

    pub fn cq(&self, cqe: i32) -> *mut ibv_cq {
        let cq = unsafe { fns().ibv_create_cq.unwrap()(self.ctx, cqe, null_mut(), null_mut(), 0) };
        assert!(!cq.is_null(), "create_cq errno {}", errno());
        cq
    }

    /// Registers a zeroed buffer of `len` bytes.
    pub fn buf(&self, len: usize, access: u32) -> Buf {
        let mut mem = vec![0u8; len.max(8)].into_boxed_slice();
        let mr = unsafe {
            fns().ibv_reg_mr.unwrap()(self.pd, mem.as_mut_ptr().cast(), len, access as i32)
        };
        assert!(!mr.is_null(), "reg_mr errno {}", errno());
        Buf { mem, mr }
    }

    pub fn qp(
        &self,
        qpt: ibv_qp_type,
        scq: *mut ibv_cq,
        rcq: *mut ibv_cq,
        cap: ibv_qp_cap,
    ) -> *mut ibv_qp {
        let mut ia = ibv_qp_init_attr {
            send_cq: scq,
            recv_cq: rcq,
            cap,
            qp_type: qpt,
            ..Default::default()
        };
        let qp = unsafe { fns().ibv_create_qp.unwrap()(self.pd, &mut ia) };
        assert!(!qp.is_null(), "create_qp errno {}", errno());
        qp
    }
}

pub const ALL_ACCESS: u32 = IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC;

pub fn cap(depth: u32) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

pub struct Buf {
    pub mem: Box<[u8]>,
    pub mr: *mut ibv_mr,
}

impl Buf {
    pub fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }
    pub fn lkey(&self) -> u32 {
        unsafe { (*self.mr).lkey }
    }
    pub fn rkey(&self) -> u32 {
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
    let mut g = ibv_gid::default();
    assert_eq!(
        unsafe { fns().ibv_query_gid.unwrap()(ctx, 1, index, &mut g) },
        0
    );
    g
}

pub fn modify(qp: *mut ibv_qp, attr: &mut ibv_qp_attr, mask: u32) -> i32 {
    unsafe { fns().ibv_modify_qp.unwrap()(qp, attr, mask as i32) }
}

pub fn state(qp: *mut ibv_qp) -> ibv_qp_state {
    unsafe { (*qp).state }
}

pub fn qpn(qp: *mut ibv_qp) -> u32 {
    unsafe { (*qp).qp_num }
}

pub fn to_init(qp: *mut ibv_qp, access: u32) {
    let ud = unsafe { (*qp).qp_type } == IBV_QPT_UD;
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        port_num: 1,
        qp_access_flags: access,
        qkey: 0x1111,
        ..Default::default()
    };
    let mask = IBV_QP_STATE
        | IBV_QP_PKEY_INDEX
        | IBV_QP_PORT
        | if ud { IBV_QP_QKEY } else { IBV_QP_ACCESS_FLAGS };
    assert_eq!(modify(qp, &mut a, mask), 0);
}

pub fn rtr_attr(ctx: *mut ibv_context, dest: u32) -> ibv_qp_attr {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTR,
        path_mtu: IBV_MTU_1024,
        dest_qp_num: dest,
        rq_psn: 0,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 12,
        ..Default::default()
    };
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.dgid = gid(ctx, 1);
    a
}

pub const RC_RTR_MASK: u32 = IBV_QP_STATE
    | IBV_QP_AV
    | IBV_QP_PATH_MTU
    | IBV_QP_DEST_QPN
    | IBV_QP_RQ_PSN
    | IBV_QP_MAX_DEST_RD_ATOMIC
    | IBV_QP_MIN_RNR_TIMER;
pub const UC_RTR_MASK: u32 =
    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
pub const RC_RTS_MASK: u32 = IBV_QP_STATE
    | IBV_QP_SQ_PSN
    | IBV_QP_TIMEOUT
    | IBV_QP_RETRY_CNT
    | IBV_QP_RNR_RETRY
    | IBV_QP_MAX_QP_RD_ATOMIC;

pub fn to_rtr(qp: *mut ibv_qp, ctx: *mut ibv_context, dest: u32) {
    let t = unsafe { (*qp).qp_type };
    let mut a = rtr_attr(ctx, dest);
    let mask = match t {
        IBV_QPT_RC => RC_RTR_MASK,
        IBV_QPT_UC => UC_RTR_MASK,
        _ => IBV_QP_STATE,
    };
    assert_eq!(modify(qp, &mut a, mask), 0);
}

pub fn to_rts(qp: *mut ibv_qp, rnr_retry: u8) {
    let t = unsafe { (*qp).qp_type };
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        sq_psn: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry,
        max_rd_atomic: 4,
        ..Default::default()
    };
    let mask = if t == IBV_QPT_RC {
        RC_RTS_MASK
    } else {
        IBV_QP_STATE | IBV_QP_SQ_PSN
    };
    assert_eq!(modify(qp, &mut a, mask), 0);
}

/// Brings `qp` to RTS connected to `dest` (RC/UC) or ready (UD).
pub fn connect(qp: *mut ibv_qp, ctx: *mut ibv_context, dest: u32, access: u32, rnr_retry: u8) {
    to_init(qp, access);
    to_rtr(qp, ctx, dest);
    to_rts(qp, rnr_retry);
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
        let dev = Dev::new();
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
    unsafe { inline::ibv_post_send(qp, wr, &mut bad) }
}

/// Links `wrs` into a chain and posts it; returns (rc, index of bad_wr).
pub fn post_chain(qp: *mut ibv_qp, wrs: &mut [ibv_send_wr]) -> (i32, Option<usize>) {
    let n = wrs.len();
    let base = wrs.as_mut_ptr();
    for i in 0..n {
        let next = if i + 1 < n {
            unsafe { base.add(i + 1) }
        } else {
            null_mut()
        };
        unsafe { (*base.add(i)).next = next };
    }
    let mut bad: *mut ibv_send_wr = null_mut();
    let rc = unsafe { inline::ibv_post_send(qp, base, &mut bad) };
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
    unsafe { inline::ibv_post_recv(qp, &mut wr, &mut bad) }
}

/// Everything currently in the CQ.
pub fn drain(cq: *mut ibv_cq) -> Vec<ibv_wc> {
    let mut out = Vec::new();
    let mut wc = [ibv_wc::default(); 16];
    loop {
        let n = unsafe { inline::ibv_poll_cq(cq, 16, wc.as_mut_ptr()) };
        assert!(n >= 0, "poll_cq returned {n}");
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&wc[..n as usize]);
    }
}

/// (wr_id, status) of each completion.
pub fn ids(wcs: &[ibv_wc]) -> Vec<(u64, u32)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

pub fn imm(wc: &ibv_wc) -> u32 {
    unsafe { wc.__bindgen_anon_1.imm_data }
}

/// Pops the next async event of `ctx` without blocking, if any.
pub fn async_event(ctx: *mut ibv_context) -> Option<(ibv_event_type, usize)> {
    let fd = unsafe { (*ctx).async_fd };
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    if unsafe { libc::poll(&mut p, 1, 0) } != 1 {
        return None;
    }
    let mut ev = ibv_async_event::default();
    assert_eq!(
        unsafe { fns().ibv_get_async_event.unwrap()(ctx, &mut ev) },
        0
    );
    let el = unsafe { ev.element.qp } as usize;
    unsafe { fns().ibv_ack_async_event.unwrap()(&mut ev) };
    Some((ev.event_type, el))
}

pub fn all_async_events(ctx: *mut ibv_context) -> Vec<(ibv_event_type, usize)> {
    std::iter::from_fn(|| async_event(ctx)).collect()
}
