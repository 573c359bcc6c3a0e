//! The extended verbs on softnic, in both profiles: `ibv_create_qp_ex` with
//! `send_ops_flags` and the `ibv_wr_*` builders (`ibv_wr_post(3)`), `ibv_create_cq_ex` with
//! its `wc_flags` readers and completion timestamps, `ibv_query_device_ex`,
//! `ibv_query_rt_values_ex`, thread domains and parent domains, and their EOPNOTSUPP paths.
//! Everything goes through `hotverbs_ffi::inline`, as an application reaches a provider.

mod common;
use common::*;

use core::ptr::null_mut;
use hotverbs_softnic::Profile;

const PROFILES: [Profile; 2] = [Profile::Spec, Profile::Rxe];

const RC_OPS: u64 = (IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) as u64;

const ALL_WC: u64 = (IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

const STAMPS: u64 =
    (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK) as u64;

/// `ibv_create_cq_ex` with `wc_flags` (and optionally a parent domain): the CQ or the errno.
fn cq_ex(
    ctx: *mut ibv_context,
    cqe: u32,
    wc_flags: u64,
    pd: *mut ibv_pd,
) -> Result<*mut ibv_cq_ex, i32> {
    let mut a = ibv_cq_init_attr_ex {
        cqe,
        wc_flags,
        ..Default::default()
    };
    if !pd.is_null() {
        a.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
        a.parent_domain = pd;
    }
    // SAFETY: a live softnic context; a valid attr.
    let cq = unsafe { inline::ibv_create_cq_ex(ctx, &mut a) };
    if cq.is_null() {
        Err(errno())
    } else {
        Ok(cq)
    }
}

/// `ibv_create_qp_ex` with PD (or parent domain) and `send_ops_flags`.
fn qp_ex(
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    qpt: ibv_qp_type,
    cq: *mut ibv_cq,
    depth: u32,
    mask: u32,
    ops: u64,
) -> Result<*mut ibv_qp, i32> {
    let mut a = ibv_qp_init_attr_ex {
        send_cq: cq,
        recv_cq: cq,
        cap: cap(depth),
        qp_type: qpt,
        comp_mask: mask,
        pd,
        send_ops_flags: ops,
        ..Default::default()
    };
    // SAFETY: live softnic objects; a valid attr.
    let qp = unsafe { inline::ibv_create_qp_ex(fns(), ctx, &mut a) };
    if qp.is_null() {
        Err(errno())
    } else {
        Ok(qp)
    }
}

fn to_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // SAFETY: a live softnic QP.
    unsafe { fns().ibv_qp_to_qp_ex.expect("ibv_qp_to_qp_ex")(qp) }
}

fn cq_of(cq: *mut ibv_cq_ex) -> *mut ibv_cq {
    inline::ibv_cq_ex_to_cq(cq)
}

/// Two connected extended RC (or UC/UD-less) QPs, each on its own extended CQ.
struct ExPair {
    /// Keeps the device's PD (and the profile) with the pair.
    #[allow(dead_code)]
    dev: Dev,
    cq_a: *mut ibv_cq_ex,
    cq_b: *mut ibv_cq_ex,
    a: *mut ibv_qp,
    b: *mut ibv_qp,
    xa: *mut ibv_qp_ex,
    buf_a: Buf,
    buf_b: Buf,
}

impl ExPair {
    fn new(profile: Profile, qpt: ibv_qp_type, depth: u32, wc: u64) -> ExPair {
        let dev = Dev::with_profile(profile);
        let ops = if qpt == IBV_QPT_RC {
            RC_OPS
        } else {
            RC_OPS
                & (IBV_QP_EX_WITH_SEND
                    | IBV_QP_EX_WITH_SEND_WITH_IMM
                    | IBV_QP_EX_WITH_RDMA_WRITE
                    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) as u64
        };
        let cq_a = cq_ex(dev.ctx, 256, wc, null_mut()).expect("create_cq_ex a");
        let cq_b = cq_ex(dev.ctx, 256, wc, null_mut()).expect("create_cq_ex b");
        let mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        let a = qp_ex(dev.ctx, dev.pd, qpt, cq_of(cq_a), depth, mask, ops).expect("qp a");
        let b = qp_ex(dev.ctx, dev.pd, qpt, cq_of(cq_b), depth, mask, ops).expect("qp b");
        connect(a, dev.ctx, qpn(b), ALL_ACCESS, 7);
        connect(b, dev.ctx, qpn(a), ALL_ACCESS, 7);
        let buf_a = dev.buf(4096, ALL_ACCESS);
        let buf_b = dev.buf(4096, ALL_ACCESS);
        let xa = to_ex(a);
        assert!(!xa.is_null());
        ExPair {
            dev,
            cq_a,
            cq_b,
            a,
            b,
            xa,
            buf_a,
            buf_b,
        }
    }

    fn recv(&mut self, wr_id: u64, off: usize, len: u32) {
        let mut s = [self.buf_b.sge(off, len)];
        assert_eq!(post_recv(self.b, wr_id, &mut s), 0);
    }
}

/// One completion as the extended poll reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cqe {
    wr_id: u64,
    status: u32,
    opcode: u32,
    byte_len: u32,
    imm: u32,
    qp_num: u32,
    wc_flags: u32,
}

/// Drains `cq` with start/next/end poll, reading the fields requested by `ALL_WC`.
fn drain_ex(cq: *mut ibv_cq_ex) -> Vec<Cqe> {
    let mut out = Vec::new();
    let mut attr = ibv_poll_cq_attr::default();
    // SAFETY: a live softnic extended CQ created with ALL_WC, polled by this thread; the
    // readers are called only after a successful start/next poll.
    unsafe {
        let mut r = inline::ibv_start_poll(cq, &mut attr);
        if r == libc::ENOENT {
            return out;
        }
        while r == 0 {
            out.push(Cqe {
                wr_id: (*cq).wr_id,
                status: (*cq).status,
                opcode: inline::ibv_wc_read_opcode(cq),
                byte_len: inline::ibv_wc_read_byte_len(cq),
                imm: inline::ibv_wc_read_imm_data(cq),
                qp_num: inline::ibv_wc_read_qp_num(cq),
                wc_flags: inline::ibv_wc_read_wc_flags(cq),
            });
            r = inline::ibv_next_poll(cq);
        }
        assert_eq!(r, libc::ENOENT, "next_poll");
        inline::ibv_end_poll(cq);
    }
    out
}

/// `wr_start`, `build` the batch, `wr_complete`: its return value.
fn batch(qx: *mut ibv_qp_ex, build: impl FnOnce(*mut ibv_qp_ex)) -> i32 {
    // SAFETY: a live softnic extended QP; the builders run inside start .. complete.
    unsafe {
        inline::ibv_wr_start(qx);
        build(qx);
        inline::ibv_wr_complete(qx)
    }
}

/// Sets `qpx->wr_id` and `qpx->wr_flags` for the next builder.
fn next(qx: *mut ibv_qp_ex, wr_id: u64, flags: u32) {
    // SAFETY: a live extended QP; plain field writes.
    unsafe {
        (*qx).wr_id = wr_id;
        (*qx).wr_flags = flags;
    }
}

const SIG: u32 = IBV_SEND_SIGNALED;

#[test]
fn send_write_read_atomics_and_imm_round_trip() {
    for profile in PROFILES {
        let mut p = ExPair::new(profile, IBV_QPT_RC, 16, ALL_WC);
        p.buf_a.fill(0, b"extended send!");
        p.buf_a.fill(100, b"written");
        p.buf_b.fill(200, b"remote bytes");
        p.buf_b.fill(512, &7u64.to_ne_bytes());
        p.buf_b.fill(520, &40u64.to_ne_bytes());
        p.recv(900, 1024, 64);
        p.recv(901, 1024 + 64, 64);
        p.recv(902, 1024 + 128, 64);
        let (la, lb) = (p.buf_a.lkey(), p.buf_b.rkey());
        let (aa, ab) = (p.buf_a.addr(), p.buf_b.addr());
        // SAFETY: inside start .. complete; the buffers are registered.
        let r = batch(p.xa, |q| unsafe {
            next(q, 1, SIG);
            inline::ibv_wr_send(q);
            inline::ibv_wr_set_sge(q, la, aa, 14);
            next(q, 2, SIG);
            inline::ibv_wr_send_imm(q, 0x1122_3344u32.to_be());
            inline::ibv_wr_set_sge(q, la, aa, 8);
            next(q, 3, SIG);
            inline::ibv_wr_rdma_write(q, lb, ab + 300);
            inline::ibv_wr_set_sge(q, la, aa + 100, 7);
            next(q, 4, SIG);
            inline::ibv_wr_rdma_write_imm(q, lb, ab + 400, 0x5566_7788u32.to_be());
            inline::ibv_wr_set_sge(q, la, aa + 100, 3);
            next(q, 5, SIG);
            inline::ibv_wr_rdma_read(q, lb, ab + 200);
            inline::ibv_wr_set_sge(q, la, aa + 600, 12);
            next(q, 6, SIG);
            inline::ibv_wr_atomic_cmp_swp(q, lb, ab + 512, 7, 99);
            inline::ibv_wr_set_sge(q, la, aa + 700, 8);
            next(q, 7, SIG);
            inline::ibv_wr_atomic_fetch_add(q, lb, ab + 520, 2);
            let list = [p.buf_a.sge(708, 8)];
            inline::ibv_wr_set_sge_list(q, 1, list.as_ptr());
        });
        assert_eq!(r, 0, "{profile:?}");
        let a = drain_ex(p.cq_a);
        let ids: Vec<_> = a.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            ids,
            (1..=7).map(|i| (i, IBV_WC_SUCCESS)).collect::<Vec<_>>(),
            "{profile:?}"
        );
        let ops: Vec<_> = a.iter().map(|c| c.opcode).collect();
        assert_eq!(
            ops,
            [
                IBV_WC_SEND,
                IBV_WC_SEND,
                IBV_WC_RDMA_WRITE,
                IBV_WC_RDMA_WRITE,
                IBV_WC_RDMA_READ,
                IBV_WC_COMP_SWAP,
                IBV_WC_FETCH_ADD
            ]
        );
        assert!(a.iter().all(|c| c.qp_num == qpn(p.a)));
        assert_eq!(a[0].byte_len, 14);
        let b = drain_ex(p.cq_b);
        assert_eq!(b.len(), 3, "{b:?}");
        assert_eq!(
            (b[0].wr_id, b[0].opcode, b[0].byte_len),
            (900, IBV_WC_RECV, 14)
        );
        assert_eq!((b[1].wr_id, b[1].imm), (901, 0x1122_3344u32.to_be()));
        assert_ne!(b[1].wc_flags & IBV_WC_WITH_IMM, 0);
        assert_eq!(
            (b[2].wr_id, b[2].opcode, b[2].imm, b[2].byte_len),
            (902, IBV_WC_RECV_RDMA_WITH_IMM, 0x5566_7788u32.to_be(), 3)
        );
        assert_eq!(p.buf_b.bytes(1024, 14), b"extended send!");
        assert_eq!(p.buf_b.bytes(300, 7), b"written");
        assert_eq!(p.buf_b.bytes(400, 3), b"wri");
        assert_eq!(p.buf_a.bytes(600, 12), b"remote bytes");
        // CAS: 7 == 7 -> 99, old value returned; FAA: 40 + 2, old value returned.
        assert_eq!(p.buf_a.bytes(700, 8), 7u64.to_ne_bytes());
        assert_eq!(p.buf_b.bytes(512, 8), 99u64.to_ne_bytes());
        assert_eq!(p.buf_a.bytes(708, 8), 40u64.to_ne_bytes());
        assert_eq!(p.buf_b.bytes(520, 8), 42u64.to_ne_bytes());
        // The legacy ibv_poll_cq works on an extended CQ too.
        let mut wc = [ibv_wc::default(); 4];
        assert_eq!(poll(cq_of(p.cq_a), &mut wc), 0);
    }
}

#[test]
fn qp_to_qp_ex_and_legacy_poll_on_an_extended_cq() {
    for profile in PROFILES {
        let dev = Dev::with_profile(profile);
        let cq = dev.cq(16);
        let legacy = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
        assert!(to_ex(legacy).is_null(), "a legacy QP has no ibv_qp_ex");
        let x = qp_ex(
            dev.ctx,
            dev.pd,
            IBV_QPT_RC,
            cq,
            4,
            IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            IBV_QP_EX_WITH_SEND as u64,
        )
        .expect("create_qp_ex");
        let xe = to_ex(x);
        assert_eq!(xe.cast::<ibv_qp>(), x, "qp_base is the QP");
        // SAFETY: a live extended QP: read its function table.
        unsafe {
            assert!((*xe).wr_send.is_some() && (*xe).wr_start.is_some());
            assert!((*xe).wr_complete.is_some() && (*xe).wr_abort.is_some());
            assert!((*xe).wr_set_sge.is_some() && (*xe).wr_set_inline_data_list.is_some());
            assert!((*xe).wr_rdma_write.is_none(), "only the requested ops");
            assert!((*xe).wr_send_imm.is_none() && (*xe).wr_atomic_fetch_add.is_none());
            assert_eq!((*xe).qp_base.qp_num, qpn(x));
        }
        // Legacy post_send keeps working on an extended QP and on an extended CQ.
        let xcq = cq_ex(dev.ctx, 16, 0, null_mut()).expect("cq ex");
        let q2 = qp_ex(
            dev.ctx,
            dev.pd,
            IBV_QPT_RC,
            cq_of(xcq),
            4,
            IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            RC_OPS,
        )
        .expect("qp");
        let peer = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
        connect(q2, dev.ctx, qpn(peer), ALL_ACCESS, 7);
        connect(peer, dev.ctx, qpn(q2), ALL_ACCESS, 7);
        let buf = dev.buf(64, ALL_ACCESS);
        let mut s = [buf.sge(0, 8)];
        let mut wr = rdma(
            send_wr(5, IBV_WR_RDMA_WRITE, &mut s, SIG),
            buf.addr() + 32,
            buf.rkey(),
        );
        assert_eq!(post(q2, &mut wr), 0);
        let wcs = drain(cq_of(xcq));
        assert_eq!(ids(&wcs), vec![(5, IBV_WC_SUCCESS)]);
    }
}

fn mono_ns(id: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock and a writable timespec.
    assert_eq!(unsafe { libc::clock_gettime(id, &mut t) }, 0);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn device_ex(ctx: *mut ibv_context) -> ibv_device_attr_ex {
    // SAFETY: all-zero is a valid ibv_device_attr_ex.
    let mut a: ibv_device_attr_ex = unsafe { core::mem::zeroed() };
    // SAFETY: a live context; a writable attr.
    let r = unsafe { inline::ibv_query_device_ex(fns(), ctx, core::ptr::null(), &mut a) };
    assert_eq!(r, 0);
    a
}

fn rt_raw(ctx: *mut ibv_context) -> Result<u64, i32> {
    let mut v = ibv_values_ex {
        comp_mask: IBV_VALUES_MASK_RAW_CLOCK,
        ..Default::default()
    };
    // SAFETY: a live context; a writable values struct.
    match unsafe { inline::ibv_query_rt_values_ex(ctx, &mut v) } {
        0 => {
            assert_eq!(v.comp_mask, IBV_VALUES_MASK_RAW_CLOCK);
            assert_eq!(v.raw_clock.tv_sec, 0, "cycles in tv_nsec, as mlx5");
            Ok(v.raw_clock.tv_nsec as u64)
        }
        e => Err(e),
    }
}

/// Spec: completion timestamps in HCA cycles at the declared `hca_core_clock`, between the
/// raw clock read before posting and after polling, non-decreasing, convertible to
/// `CLOCK_MONOTONIC` ns; the wall-clock flavour in `CLOCK_REALTIME` ns.
#[test]
fn completion_timestamps_are_monotonic_and_convertible() {
    let dev = Dev::with_profile(Profile::Spec);
    let attr = device_ex(dev.ctx);
    assert_eq!(attr.hca_core_clock, hotverbs_softnic::HCA_CORE_CLOCK_KHZ);
    assert_ne!(attr.completion_timestamp_mask, 0);
    assert_eq!(attr.orig_attr.max_qp_wr, 1_048_576);
    let khz = attr.hca_core_clock as u128;
    let to_ns = |cycles: u64| (cycles as u128 * 1_000_000 / khz) as u64;

    let cq = cq_ex(dev.ctx, 64, STAMPS | ALL_WC, null_mut()).expect("create_cq_ex");
    // SAFETY: a live CQ: the readers for the requested flags are set.
    unsafe {
        assert!((*cq).read_completion_ts.is_some());
        assert!((*cq).read_completion_wallclock_ns.is_some());
        assert!((*cq).read_cvlan.is_none() && (*cq).read_flow_tag.is_none());
    }
    let mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    let a = qp_ex(dev.ctx, dev.pd, IBV_QPT_RC, cq_of(cq), 16, mask, RC_OPS).expect("qp");
    let b = qp_ex(dev.ctx, dev.pd, IBV_QPT_RC, cq_of(cq), 16, mask, RC_OPS).expect("qp");
    connect(a, dev.ctx, qpn(b), ALL_ACCESS, 7);
    connect(b, dev.ctx, qpn(a), ALL_ACCESS, 7);
    let buf = dev.buf(256, ALL_ACCESS);
    let (raw0, mono0, wall0) = (
        rt_raw(dev.ctx).expect("rt"),
        mono_ns(libc::CLOCK_MONOTONIC),
        mono_ns(libc::CLOCK_REALTIME),
    );
    let (lkey, addr) = (buf.lkey(), buf.addr());
    for i in 0..4u64 {
        let r = batch(to_ex(a), |q| {
            next(q, i, SIG);
            // SAFETY: inside start .. complete; the buffer is registered.
            unsafe {
                inline::ibv_wr_rdma_write(q, lkey, addr + 128);
                inline::ibv_wr_set_sge(q, lkey, addr, 16);
            }
        });
        assert_eq!(r, 0);
    }
    let mut stamps = Vec::new();
    let mut attr = ibv_poll_cq_attr::default();
    // SAFETY: a live extended CQ polled by this thread; readers after a successful poll.
    unsafe {
        let mut r = inline::ibv_start_poll(cq, &mut attr);
        while r == 0 {
            assert_eq!((*cq).status, IBV_WC_SUCCESS);
            stamps.push((
                inline::ibv_wc_read_completion_ts(cq),
                inline::ibv_wc_read_completion_wallclock_ns(cq),
            ));
            r = inline::ibv_next_poll(cq);
        }
        inline::ibv_end_poll(cq);
    }
    let (raw1, mono1, wall1) = (
        rt_raw(dev.ctx).expect("rt"),
        mono_ns(libc::CLOCK_MONOTONIC),
        mono_ns(libc::CLOCK_REALTIME),
    );
    assert_eq!(stamps.len(), 4);
    let mut prev = (raw0, wall0);
    for &(ts, wall) in &stamps {
        assert!(prev.0 <= ts && ts <= raw1, "{raw0} <= {ts} <= {raw1}");
        assert!(
            prev.1 <= wall && wall <= wall1,
            "{wall0} <= {wall} <= {wall1}"
        );
        prev = (ts, wall);
        // Converted with hca_core_clock, the raw value is CLOCK_MONOTONIC (to one cycle).
        let ns = to_ns(ts);
        assert!(
            mono0.saturating_sub(8) <= ns && ns <= mono1 + 8,
            "{mono0} <= {ns} <= {mono1}"
        );
    }
}

/// Rxe: no completion timestamps (EOPNOTSUPP at create_cq_ex, mask and clock 0) and no
/// query_rt_values (libibverbs' dummy op: EOPNOTSUPP).
#[test]
fn rxe_has_no_completion_timestamps() {
    let dev = Dev::with_profile(Profile::Rxe);
    let attr = device_ex(dev.ctx);
    assert_eq!(
        (attr.completion_timestamp_mask, attr.hca_core_clock),
        (0, 0)
    );
    for flag in [
        IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
        IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
    ] {
        assert_eq!(
            cq_ex(dev.ctx, 16, ALL_WC | flag as u64, null_mut()),
            Err(libc::EOPNOTSUPP)
        );
    }
    assert_eq!(rt_raw(dev.ctx), Err(libc::EOPNOTSUPP));
    // Without them, an extended CQ is fine.
    let cq = cq_ex(dev.ctx, 16, ALL_WC, null_mut()).expect("create_cq_ex");
    // SAFETY: a live CQ, never used again.
    assert_eq!(unsafe { fns().ibv_destroy_cq.unwrap()(cq_of(cq)) }, 0);
}
