//! The extended verbs on softnic, in both profiles: `ibv_create_qp_ex` with
//! `send_ops_flags` and the `ibv_wr_*` builders (`ibv_wr_post(3)`), `ibv_create_cq_ex` with
//! its `wc_flags` readers and completion timestamps, `ibv_query_device_ex`,
//! `ibv_query_rt_values_ex`, thread domains and parent domains, and their EOPNOTSUPP paths.
//! Everything goes through `hotverbs_ffi::inline`, as an application reaches a provider.

mod common;
use common::*;

use core::ptr::null_mut;
use hotverbs_softnic::testing::CountingAlloc;
use hotverbs_softnic::Profile;

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

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

fn sq_outstanding(qp: *mut ibv_qp) -> u32 {
    // SAFETY: a live softnic QP.
    unsafe { hotverbs_softnic::sq_outstanding(qp) }
}

/// The usable send queue depth (rxe rounds it up: query_qp reports it).
fn send_depth(qp: *mut ibv_qp) -> u32 {
    let mut attr = ibv_qp_attr::default();
    let mut init = ibv_qp_init_attr::default();
    // SAFETY: a live QP; writable out-structs.
    let r = unsafe { fns().ibv_query_qp.unwrap()(qp, &mut attr, IBV_QP_CAP as i32, &mut init) };
    assert_eq!(r, 0);
    attr.cap.max_send_wr
}

/// One `wr_complete` posts a whole batch: every WR executes, in order, through the same
/// engine as `ibv_post_send` (selective signaling included).
#[test]
fn a_batch_of_many_wrs_posts_them_all_in_order() {
    for profile in PROFILES {
        let mut p = ExPair::new(profile, IBV_QPT_RC, 64, ALL_WC);
        for i in 0..48u8 {
            p.buf_a.fill(i as usize, &[i + 1]);
        }
        for i in 0..16 {
            p.recv(2000 + i, 1024 + 16 * i as usize, 16);
        }
        let (la, rb) = (p.buf_a.lkey(), p.buf_b.rkey());
        let (aa, ab) = (p.buf_a.addr(), p.buf_b.addr());
        let r = batch(p.xa, |q| {
            for i in 0..48u64 {
                // Every 8th WR signaled; SENDs for i % 3 == 0 (16 of them), WRITEs else.
                next(q, i, if i % 8 == 7 { SIG } else { 0 });
                // SAFETY: inside start .. complete; registered buffers.
                unsafe {
                    if i % 3 == 0 {
                        inline::ibv_wr_send(q);
                    } else {
                        inline::ibv_wr_rdma_write(q, rb, ab + 512 + i);
                    }
                    inline::ibv_wr_set_sge(q, la, aa + i, 1);
                }
            }
        });
        assert_eq!(r, 0, "{profile:?}");
        let a = drain_ex(p.cq_a);
        let ids: Vec<_> = a.iter().map(|c| (c.wr_id, c.status)).collect();
        let want: Vec<_> = (0..48u64)
            .filter(|i| i % 8 == 7)
            .map(|i| (i, IBV_WC_SUCCESS))
            .collect();
        assert_eq!(ids, want, "{profile:?}");
        let b = drain_ex(p.cq_b);
        assert_eq!(b.len(), 16);
        for (k, c) in b.iter().enumerate() {
            assert_eq!((c.wr_id, c.byte_len), (2000 + k as u64, 1));
            assert_eq!(p.buf_b.get(1024 + 16 * k), (3 * k) as u8 + 1);
        }
        for i in (0..48usize).filter(|i| i % 3 != 0) {
            assert_eq!(p.buf_b.get(512 + i), i as u8 + 1, "WRITE {i}");
        }
        assert_eq!(sq_outstanding(p.a), 0);
    }
}

/// `wr_abort` discards the staged WRs; the QP's next batch (and legacy posts) work.
#[test]
fn wr_abort_discards_the_batch() {
    for profile in PROFILES {
        let mut p = ExPair::new(profile, IBV_QPT_RC, 16, ALL_WC);
        p.buf_a.fill(0, b"abcdefgh");
        let (la, rb) = (p.buf_a.lkey(), p.buf_b.rkey());
        let (aa, ab) = (p.buf_a.addr(), p.buf_b.addr());
        // SAFETY: a live extended QP; builders inside start .. abort.
        unsafe {
            inline::ibv_wr_start(p.xa);
            for i in 0..3 {
                next(p.xa, i, SIG);
                inline::ibv_wr_rdma_write(p.xa, rb, ab + 8 * i);
                inline::ibv_wr_set_sge(p.xa, la, aa, 8);
            }
            inline::ibv_wr_abort(p.xa);
        }
        assert!(drain_ex(p.cq_a).is_empty());
        assert_eq!(sq_outstanding(p.a), 0);
        assert_eq!(p.buf_b.bytes(0, 24), [0u8; 24]);
        let r = batch(p.xa, |q| {
            next(q, 9, SIG);
            // SAFETY: inside start .. complete.
            unsafe {
                inline::ibv_wr_rdma_write(q, rb, ab + 100);
                inline::ibv_wr_set_sge(q, la, aa, 8);
            }
        });
        assert_eq!(r, 0);
        let a = drain_ex(p.cq_a);
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].wr_id, a[0].status), (9, IBV_WC_SUCCESS));
        assert_eq!(p.buf_b.bytes(100, 8), b"abcdefgh");
        assert_eq!(p.buf_b.bytes(0, 24), [0u8; 24]);
    }
}

/// A step that adds WRs to a batch.
type Builder<'a> = Box<dyn Fn(*mut ibv_qp_ex) + 'a>;

/// A `wr_complete` that fails posts none of the batch: builder limits (SGE count, inline
/// size, more WRs than the queue holds: ENOMEM as mlx5 in Spec, ENOSPC as rxe in Rxe), and
/// WRs the engine refuses (misaligned atomic: EINVAL). The valid WR before the bad one
/// never executes.
#[test]
fn a_failed_wr_complete_posts_nothing() {
    for profile in PROFILES {
        let mut p = ExPair::new(profile, IBV_QPT_RC, 8, ALL_WC);
        p.buf_a.fill(0, b"payload!");
        let limit = if profile == Profile::Rxe {
            libc::ENOSPC
        } else {
            libc::ENOMEM
        };
        let (la, rb) = (p.buf_a.lkey(), p.buf_b.rkey());
        let (aa, ab) = (p.buf_a.addr(), p.buf_b.addr());
        let depth = send_depth(p.a) as u64;
        let big = vec![7u8; 1000];
        let sges: Vec<ibv_sge> = (0..8).map(|i| p.buf_a.sge(i, 1)).collect();
        let cases: [(&str, i32, Builder); 4] = [
            (
                "too many SGEs",
                limit,
                Box::new(|q| {
                    // SAFETY: inside start .. complete; sges holds 8 entries.
                    unsafe { inline::ibv_wr_set_sge_list(q, 8, sges.as_ptr()) }
                }),
            ),
            (
                "inline too large",
                limit,
                Box::new(|q| {
                    // SAFETY: inside start .. complete; `big` is readable.
                    unsafe { inline::ibv_wr_set_inline_data(q, big.as_ptr() as *mut _, 1000) }
                }),
            ),
            (
                "more WRs than the queue",
                limit,
                Box::new(|q| {
                    for i in 0..depth {
                        next(q, 100 + i, SIG);
                        // SAFETY: inside start .. complete.
                        unsafe {
                            inline::ibv_wr_rdma_write(q, rb, ab + 64);
                            inline::ibv_wr_set_sge(q, la, aa, 8);
                        }
                    }
                }),
            ),
            (
                "misaligned atomic",
                libc::EINVAL,
                Box::new(|q| {
                    next(q, 50, SIG);
                    // SAFETY: inside start .. complete.
                    unsafe {
                        inline::ibv_wr_atomic_fetch_add(q, rb, ab + 513, 1);
                        inline::ibv_wr_set_sge(q, la, aa + 256, 8);
                    }
                }),
            ),
        ];
        for (what, errno, bad) in &cases {
            let r = batch(p.xa, |q| {
                // A valid WRITE first: it must not execute either.
                next(q, 1, SIG);
                // SAFETY: inside start .. complete.
                unsafe {
                    inline::ibv_wr_rdma_write(q, rb, ab);
                    inline::ibv_wr_set_sge(q, la, aa, 8);
                }
                next(q, 2, SIG);
                // SAFETY: as above.
                unsafe { inline::ibv_wr_rdma_write(q, rb, ab + 8) };
                bad(q);
            });
            assert_eq!(r, *errno, "{profile:?} {what}");
            assert!(drain_ex(p.cq_a).is_empty(), "{profile:?} {what}");
            assert_eq!(sq_outstanding(p.a), 0, "{profile:?} {what}");
            assert_eq!(p.buf_b.bytes(0, 72), [0u8; 72], "{profile:?} {what}");
            assert_eq!(state(p.a), IBV_QPS_RTS, "{profile:?} {what}");
        }
        // A refused batch is over: an abort after it changes nothing (the datapath aborts
        // refused batches), a second complete is EINVAL.
        // SAFETY: a live extended QP.
        unsafe {
            inline::ibv_wr_abort(p.xa);
            assert_eq!(inline::ibv_wr_complete(p.xa), libc::EINVAL);
        }
        // The QP is unharmed: the next batch goes through.
        let r = batch(p.xa, |q| {
            next(q, 3, SIG);
            // SAFETY: inside start .. complete.
            unsafe {
                inline::ibv_wr_rdma_write(q, rb, ab);
                inline::ibv_wr_set_sge(q, la, aa, 8);
            }
        });
        assert_eq!(r, 0);
        assert_eq!(drain_ex(p.cq_a).len(), 1);
        assert_eq!(p.buf_b.bytes(0, 8), b"payload!");
    }
}

/// Before RTS: Spec refuses the batch (EINVAL, nothing posted); rxe's doorbell answers
/// EINVAL but the WRs stay queued and run at the next post in RTS (rxe S1).
#[test]
fn wr_complete_before_rts_follows_the_profile() {
    for profile in PROFILES {
        let dev = Dev::with_profile(profile);
        let cq = cq_ex(dev.ctx, 64, ALL_WC, null_mut()).expect("cq");
        let mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        let a = qp_ex(dev.ctx, dev.pd, IBV_QPT_RC, cq_of(cq), 8, mask, RC_OPS).expect("a");
        let buf = dev.buf(64, ALL_ACCESS);
        let (lkey, addr) = (buf.lkey(), buf.addr());
        let r = batch(to_ex(a), |q| {
            next(q, 1, SIG);
            // SAFETY: inside start .. complete.
            unsafe {
                inline::ibv_wr_send(q);
                inline::ibv_wr_set_sge(q, lkey, addr, 4);
            }
        });
        assert_eq!(r, libc::EINVAL, "{profile:?}");
        // SAFETY: a live QP.
        let waiting = unsafe { hotverbs_softnic::send_wrs_waiting(a) };
        if profile == Profile::Rxe {
            assert_eq!(waiting, 1);
        } else {
            assert_eq!((waiting, sq_outstanding(a)), (0, 0));
        }
    }
}

/// Inline data is copied at the builder call (the buffer may be reused at once). Spec:
/// `wr_set_inline_data(_list)` inlines whatever `wr_flags` says. Rxe: only with
/// IBV_SEND_INLINE in `wr_flags`; without it the WR fails with LOC_QP_OP_ERR and the QP
/// goes to ERR (rxe README, "Facts about rxe").
#[test]
fn inline_data_and_the_rxe_inline_flag_quirk() {
    for profile in PROFILES {
        for flag in [IBV_SEND_INLINE, 0] {
            let mut p = ExPair::new(profile, IBV_QPT_RC, 16, ALL_WC);
            p.recv(77, 1024, 64);
            let rb = p.buf_b.rkey();
            let ab = p.buf_b.addr();
            let r = batch(p.xa, |q| {
                let mut src = *b"inline-one";
                next(q, 1, SIG | flag);
                // SAFETY: inside start .. complete; src readable for its length.
                unsafe {
                    inline::ibv_wr_rdma_write(q, rb, ab + 200);
                    inline::ibv_wr_set_inline_data(q, src.as_mut_ptr().cast(), src.len());
                }
                src.copy_from_slice(b"OVERWRITE!");
                let mut x = *b"list-";
                let mut y = *b"two";
                let list = [
                    ibv_data_buf {
                        addr: x.as_mut_ptr().cast(),
                        length: 5,
                    },
                    ibv_data_buf {
                        addr: y.as_mut_ptr().cast(),
                        length: 3,
                    },
                ];
                next(q, 2, SIG | flag);
                // SAFETY: as above; the list and its buffers are readable.
                unsafe {
                    inline::ibv_wr_send(q);
                    inline::ibv_wr_set_inline_data_list(q, 2, list.as_ptr());
                }
                x.fill(0);
                y.fill(0);
            });
            assert_eq!(r, 0, "{profile:?} flag={flag}");
            let a = drain_ex(p.cq_a);
            if profile == Profile::Rxe && flag == 0 {
                assert_eq!(a[0].wr_id, 1);
                assert_eq!(a[0].status, IBV_WC_LOC_QP_OP_ERR, "{a:?}");
                assert_eq!(a[1].status, IBV_WC_WR_FLUSH_ERR, "{a:?}");
                assert_eq!(state(p.a), IBV_QPS_ERR);
                assert_eq!(p.buf_b.bytes(200, 10), [0u8; 10]);
            } else {
                let ids: Vec<_> = a.iter().map(|c| (c.wr_id, c.status)).collect();
                assert_eq!(
                    ids,
                    [(1, IBV_WC_SUCCESS), (2, IBV_WC_SUCCESS)],
                    "{profile:?}"
                );
                assert_eq!(p.buf_b.bytes(200, 10), b"inline-one");
                let b = drain_ex(p.cq_b);
                assert_eq!((b[0].wr_id, b[0].byte_len), (77, 8));
                assert_eq!(p.buf_b.bytes(1024, 8), b"list-two");
            }
        }
    }
}

/// What softnic refuses at creation, in both profiles (rxe's `check_qp_init_attr` and
/// `RXE_SUP_WC_EX_FLAGS`): ops it cannot execute, create flags, unknown attributes and
/// CQ fields -> EOPNOTSUPP; no PD, or a plain PD where a parent domain is required -> EINVAL.
#[test]
fn unsupported_extended_requests_are_refused() {
    for profile in PROFILES {
        let dev = Dev::with_profile(profile);
        let cq = dev.cq(16);
        let pdm = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        let cases: [(ibv_qp_type, u32, u64, i32); 7] = [
            (IBV_QPT_RC, pdm, IBV_QP_EX_WITH_TSO as u64, libc::EOPNOTSUPP),
            (
                IBV_QPT_RC,
                pdm,
                IBV_QP_EX_WITH_LOCAL_INV as u64,
                libc::EOPNOTSUPP,
            ),
            (
                IBV_QPT_UC,
                pdm,
                IBV_QP_EX_WITH_RDMA_READ as u64,
                libc::EOPNOTSUPP,
            ),
            (
                IBV_QPT_UD,
                pdm,
                IBV_QP_EX_WITH_RDMA_WRITE as u64,
                libc::EOPNOTSUPP,
            ),
            (IBV_QPT_RC, pdm | IBV_QP_INIT_ATTR_XRCD, 0, libc::EOPNOTSUPP),
            (
                IBV_QPT_RC,
                IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                RC_OPS,
                libc::EINVAL,
            ),
            (IBV_QPT_RC, pdm, 1 << 40, libc::EOPNOTSUPP),
        ];
        for (qpt, mask, ops, errno) in cases {
            let pd = if mask & IBV_QP_INIT_ATTR_PD != 0 {
                dev.pd
            } else {
                null_mut()
            };
            assert_eq!(
                qp_ex(dev.ctx, pd, qpt, cq, 4, mask, ops),
                Err(errno),
                "{profile:?} qpt={qpt} mask={mask:#x} ops={ops:#x}"
            );
        }
        let mut a = ibv_qp_init_attr_ex {
            send_cq: cq,
            recv_cq: cq,
            cap: cap(4),
            qp_type: IBV_QPT_RC,
            comp_mask: IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS,
            pd: dev.pd,
            create_flags: IBV_QP_CREATE_SCATTER_FCS,
            ..Default::default()
        };
        // SAFETY: live objects; a valid attr.
        assert!(unsafe { inline::ibv_create_qp_ex(fns(), dev.ctx, &mut a) }.is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);

        for flag in [
            IBV_WC_EX_WITH_CVLAN,
            IBV_WC_EX_WITH_FLOW_TAG,
            IBV_WC_EX_WITH_TM_INFO,
        ] {
            assert_eq!(
                cq_ex(dev.ctx, 16, flag as u64, null_mut()),
                Err(libc::EOPNOTSUPP)
            );
        }
        // A plain PD is not a parent domain.
        assert_eq!(cq_ex(dev.ctx, 16, 0, dev.pd), Err(libc::EINVAL));
        let mut c = ibv_cq_init_attr_ex {
            cqe: 16,
            comp_mask: IBV_CQ_INIT_ATTR_MASK_FLAGS,
            flags: IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN,
            ..Default::default()
        };
        // SAFETY: a live context; a valid attr.
        assert!(unsafe { inline::ibv_create_cq_ex(dev.ctx, &mut c) }.is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        c.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
        // SAFETY: as above.
        let ok = unsafe { inline::ibv_create_cq_ex(dev.ctx, &mut c) };
        assert!(!ok.is_null(), "SINGLE_THREADED is accepted");
    }
}

/// An extended CQ fills exactly the readers of the requested `wc_flags` (opcode,
/// vendor_err and wc_flags always) and reports the same completion `ibv_poll_cq` would.
#[test]
fn cq_readers_follow_wc_flags() {
    for profile in PROFILES {
        let dev = Dev::with_profile(profile);
        for flags in [0u64, IBV_WC_EX_WITH_BYTE_LEN as u64, ALL_WC] {
            let cq = cq_ex(dev.ctx, 8, flags, null_mut()).expect("cq");
            // SAFETY: a live CQ: read its function table.
            let x = unsafe { &*cq };
            assert!(x.start_poll.is_some() && x.next_poll.is_some() && x.end_poll.is_some());
            assert!(x.read_opcode.is_some() && x.read_vendor_err.is_some());
            assert!(x.read_wc_flags.is_some());
            let has = |f: u32| flags & f as u64 != 0;
            assert_eq!(x.read_byte_len.is_some(), has(IBV_WC_EX_WITH_BYTE_LEN));
            assert_eq!(x.read_imm_data.is_some(), has(IBV_WC_EX_WITH_IMM));
            assert_eq!(x.read_qp_num.is_some(), has(IBV_WC_EX_WITH_QP_NUM));
            assert_eq!(x.read_src_qp.is_some(), has(IBV_WC_EX_WITH_SRC_QP));
            assert_eq!(x.read_slid.is_some(), has(IBV_WC_EX_WITH_SLID));
            assert_eq!(x.read_sl.is_some(), has(IBV_WC_EX_WITH_SL));
            assert_eq!(
                x.read_dlid_path_bits.is_some(),
                has(IBV_WC_EX_WITH_DLID_PATH_BITS)
            );
            assert!(x.read_completion_ts.is_none() && x.read_completion_wallclock_ns.is_none());
            assert!(x.read_cvlan.is_none() && x.read_flow_tag.is_none());
            assert!(x.read_tm_info.is_none());
        }
        // The values: a SEND's receive completion read both ways.
        let mut p = ExPair::new(profile, IBV_QPT_RC, 8, ALL_WC);
        p.recv(5, 0, 32);
        p.recv(6, 32, 32);
        let (la, aa) = (p.buf_a.lkey(), p.buf_a.addr());
        for id in [1, 2] {
            let r = batch(p.xa, |q| {
                next(q, id, SIG);
                // SAFETY: inside start .. complete.
                unsafe {
                    inline::ibv_wr_send_imm(q, 0xABCDu32.to_be());
                    inline::ibv_wr_set_sge(q, la, aa, 12);
                }
            });
            assert_eq!(r, 0);
        }
        let legacy = {
            let mut wc = [ibv_wc::default(); 1];
            assert_eq!(poll(cq_of(p.cq_b), &mut wc), 1);
            wc[0]
        };
        let mut attr = ibv_poll_cq_attr::default();
        // SAFETY: a live extended CQ, polled by this thread.
        unsafe {
            assert_eq!(inline::ibv_start_poll(p.cq_b, &mut attr), 0);
            let c = p.cq_b;
            assert_eq!(((*c).wr_id, (*c).status), (6, IBV_WC_SUCCESS));
            assert_eq!(inline::ibv_wc_read_opcode(c), legacy.opcode);
            assert_eq!(inline::ibv_wc_read_byte_len(c), legacy.byte_len);
            assert_eq!(inline::ibv_wc_read_imm_data(c), imm(&legacy));
            assert_eq!(inline::ibv_wc_read_qp_num(c), legacy.qp_num);
            assert_eq!(inline::ibv_wc_read_src_qp(c), legacy.src_qp);
            assert_eq!(inline::ibv_wc_read_wc_flags(c), legacy.wc_flags);
            assert_eq!(inline::ibv_wc_read_slid(c), legacy.slid as u32);
            assert_eq!(inline::ibv_wc_read_sl(c), legacy.sl);
            assert_eq!(inline::ibv_wc_read_dlid_path_bits(c), legacy.dlid_path_bits);
            assert_eq!(inline::ibv_wc_read_vendor_err(c), 0);
            assert_eq!(legacy.wr_id, 5);
            assert_eq!(inline::ibv_next_poll(c), libc::ENOENT);
            inline::ibv_end_poll(c);
            assert_eq!(inline::ibv_start_poll(c, &mut attr), libc::ENOENT);
        }
    }
}

fn alloc_td(ctx: *mut ibv_context) -> Result<*mut ibv_td, i32> {
    let mut a = ibv_td_init_attr::default();
    // SAFETY: a live context; a valid attr.
    let td = unsafe { inline::ibv_alloc_td(ctx, &mut a) };
    if td.is_null() {
        Err(errno())
    } else {
        Ok(td)
    }
}

fn parent_domain(
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    td: *mut ibv_td,
) -> Result<*mut ibv_pd, i32> {
    let mut a = ibv_parent_domain_init_attr {
        pd,
        td,
        ..Default::default()
    };
    // SAFETY: live objects; a valid attr.
    let p = unsafe { inline::ibv_alloc_parent_domain(ctx, &mut a) };
    if p.is_null() {
        Err(errno())
    } else {
        Ok(p)
    }
}

/// Thread and parent domains (Spec): a parent domain is a PD for MRs, QPs (create_qp_ex
/// with IBV_QP_INIT_ATTR_PD) and extended CQs, shares its PD's protection domain (an MR
/// registered through it serves a QP of the plain PD and vice versa), keeps its PD and
/// thread domain busy (EBUSY) until `ibv_dealloc_pd`, and is itself busy while used.
#[test]
fn thread_and_parent_domain_lifecycle() {
    let dev = Dev::with_profile(Profile::Spec);
    let td = alloc_td(dev.ctx).expect("alloc_td");
    let mut bad = ibv_td_init_attr { comp_mask: 1 };
    // SAFETY: a live context; a valid attr.
    assert!(unsafe { inline::ibv_alloc_td(dev.ctx, &mut bad) }.is_null());
    assert_eq!(errno(), libc::EINVAL);
    let par = parent_domain(dev.ctx, dev.pd, td).expect("alloc_parent_domain");
    // SAFETY: a live PD.
    assert_eq!(unsafe { (*par).context }, dev.ctx);
    assert_eq!(
        parent_domain(dev.ctx, par, null_mut()),
        Err(libc::EINVAL),
        "no nesting"
    );
    assert_eq!(parent_domain(dev.ctx, null_mut(), td), Err(libc::EINVAL));
    // SAFETY: live objects.
    unsafe {
        assert_eq!(inline::ibv_dealloc_td(td), libc::EBUSY);
        assert_eq!(fns().ibv_dealloc_pd.unwrap()(dev.pd), libc::EBUSY);
    }

    let cq = cq_ex(dev.ctx, 32, ALL_WC, par).expect("cq on the parent domain");
    let mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    let a = qp_ex(dev.ctx, par, IBV_QPT_RC, cq_of(cq), 8, mask, RC_OPS).expect("qp on parent");
    let b = qp_ex(dev.ctx, dev.pd, IBV_QPT_RC, cq_of(cq), 8, mask, RC_OPS).expect("qp on pd");
    connect(a, dev.ctx, qpn(b), ALL_ACCESS, 7);
    connect(b, dev.ctx, qpn(a), ALL_ACCESS, 7);
    // SAFETY: a live QP.
    assert_eq!(unsafe { (*a).pd }, par);
    let mut src = vec![0u8; 64].into_boxed_slice();
    src[..6].copy_from_slice(b"via pd");
    // SAFETY: `src` outlives the registration (deregistered below).
    let mr = unsafe { hotverbs_softnic::testing::reg_mr(par, src.as_mut_ptr(), 64, ALL_ACCESS) };
    let dst = dev.buf(64, ALL_ACCESS);
    // a (parent domain) gathers from an MR of the parent domain and writes an MR of the PD.
    // SAFETY: a live MR.
    let (lkey, addr) = unsafe { ((*mr).lkey, (*mr).addr as u64) };
    let (rkey, raddr) = (dst.rkey(), dst.addr());
    let r = batch(to_ex(a), |q| {
        next(q, 1, SIG);
        // SAFETY: inside start .. complete.
        unsafe {
            inline::ibv_wr_rdma_write(q, rkey, raddr);
            inline::ibv_wr_set_sge(q, lkey, addr, 6);
        }
    });
    assert_eq!(r, 0);
    let c = drain_ex(cq);
    assert_eq!((c[0].wr_id, c[0].status), (1, IBV_WC_SUCCESS));
    assert_eq!(dst.bytes(0, 6), b"via pd");
    // b (plain PD) reads the parent domain's MR: same protection domain.
    let r = batch(to_ex(b), |q| {
        next(q, 2, SIG);
        // SAFETY: inside start .. complete.
        unsafe {
            inline::ibv_wr_rdma_read(q, lkey, addr);
            inline::ibv_wr_set_sge(q, dst.lkey(), raddr + 32, 6);
        }
    });
    assert_eq!(r, 0);
    assert_eq!(drain_ex(cq)[0].status, IBV_WC_SUCCESS);
    assert_eq!(dst.bytes(32, 6), b"via pd");

    // SAFETY: live objects, each destroyed once, users first.
    unsafe {
        let f = fns();
        assert_eq!(
            f.ibv_dealloc_pd.unwrap()(par),
            libc::EBUSY,
            "QP, MR, CQ use it"
        );
        assert_eq!(f.ibv_destroy_qp.unwrap()(a), 0);
        assert_eq!(f.ibv_dereg_mr.unwrap()(mr), 0);
        assert_eq!(
            f.ibv_dealloc_pd.unwrap()(par),
            libc::EBUSY,
            "the CQ uses it"
        );
        assert_eq!(f.ibv_destroy_qp.unwrap()(b), 0);
        assert_eq!(f.ibv_destroy_cq.unwrap()(cq_of(cq)), 0);
        assert_eq!(f.ibv_dealloc_pd.unwrap()(par), 0);
        assert_eq!(inline::ibv_dealloc_td(td), 0);
        assert_eq!(f.ibv_dereg_mr.unwrap()(dst.mr), 0);
        assert_eq!(f.ibv_dealloc_pd.unwrap()(dev.pd), 0);
    }
}

/// Rxe: librxe has no alloc_td / alloc_parent_domain, so libibverbs' dummy ops answer
/// EOPNOTSUPP (NULL + errno), and ibv_dealloc_td EOPNOTSUPP.
#[test]
fn rxe_has_no_thread_or_parent_domains() {
    let dev = Dev::with_profile(Profile::Rxe);
    assert_eq!(alloc_td(dev.ctx).err(), Some(libc::EOPNOTSUPP));
    assert_eq!(
        parent_domain(dev.ctx, dev.pd, null_mut()).err(),
        Some(libc::EOPNOTSUPP)
    );
}

/// A UD extended QP: `wr_set_ud_addr` addresses each SEND.
#[test]
fn ud_send_with_set_ud_addr() {
    for profile in PROFILES {
        let dev = Dev::with_profile(profile);
        let cq = cq_ex(dev.ctx, 32, ALL_WC, null_mut()).expect("cq");
        let mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        let ops = IBV_QP_EX_WITH_SEND as u64;
        let a = qp_ex(dev.ctx, dev.pd, IBV_QPT_UD, cq_of(cq), 8, mask, ops).expect("a");
        let b = qp_ex(dev.ctx, dev.pd, IBV_QPT_UD, cq_of(cq), 8, mask, ops).expect("b");
        for q in [a, b] {
            connect(q, dev.ctx, 0, 0, 7);
        }
        let buf = dev.buf(256, ALL_ACCESS);
        let mut s = [buf.sge(64, 128)];
        assert_eq!(post_recv(b, 40, &mut s), 0);
        let mut ah_attr = ibv_ah_attr {
            is_global: 1,
            port_num: 1,
            ..Default::default()
        };
        ah_attr.grh.dgid = gid(dev.ctx, 1);
        ah_attr.grh.sgid_index = 1;
        ah_attr.grh.hop_limit = 1;
        // SAFETY: a live PD; a valid attr.
        let ah = unsafe { fns().ibv_create_ah.unwrap()(dev.pd, &mut ah_attr) };
        assert!(!ah.is_null());
        let (lkey, addr, dqpn) = (buf.lkey(), buf.addr(), qpn(b));
        let r = batch(to_ex(a), |q| {
            next(q, 4, SIG);
            // SAFETY: inside start .. complete; ah live.
            unsafe {
                inline::ibv_wr_send(q);
                inline::ibv_wr_set_ud_addr(q, ah, dqpn, 0x1111);
                inline::ibv_wr_set_sge(q, lkey, addr, 16);
            }
        });
        assert_eq!(r, 0, "{profile:?}");
        let c = drain_ex(cq);
        let ids: Vec<_> = c.iter().map(|c| (c.wr_id, c.status)).collect();
        assert!(ids.contains(&(4, IBV_WC_SUCCESS)), "{ids:?}");
        let recv = c.iter().find(|c| c.wr_id == 40).expect("UD receive");
        assert_eq!(recv.byte_len, 40 + 16, "GRH + payload");
    }
}

/// Polls `cq` with start/next/end until `want` completions arrived, reading every requested
/// field (timestamps too when `stamps`), without allocating; returns how many failed.
fn poll_ex_n(cq: *mut ibv_cq_ex, want: usize, stamps: bool) -> usize {
    let (mut got, mut failed, mut sum) = (0, 0, 0u64);
    let mut attr = ibv_poll_cq_attr::default();
    while got < want {
        // SAFETY: a live extended CQ created with ALL_WC (and STAMPS when `stamps`),
        // polled by this thread; readers only after a successful poll.
        unsafe {
            let mut r = inline::ibv_start_poll(cq, &mut attr);
            let started = r == 0;
            while r == 0 {
                got += 1;
                failed += ((*cq).status != IBV_WC_SUCCESS) as usize;
                sum = sum
                    .wrapping_add(inline::ibv_wc_read_byte_len(cq) as u64)
                    .wrapping_add(inline::ibv_wc_read_qp_num(cq) as u64)
                    .wrapping_add(inline::ibv_wc_read_opcode(cq) as u64);
                if stamps {
                    sum = sum.wrapping_add(inline::ibv_wc_read_completion_ts(cq));
                }
                r = inline::ibv_next_poll(cq);
            }
            if started {
                inline::ibv_end_poll(cq);
            }
            assert_eq!(r, libc::ENOENT);
        }
    }
    assert_ne!(sum, 0);
    failed
}

/// The extended datapath allocates nothing from the first batch on: staging (SGE lists and
/// inline bytes), `wr_complete`, execution and the extended poll all use storage
/// provisioned at creation.
#[test]
fn extended_posting_and_polling_allocate_nothing() {
    for profile in PROFILES {
        let stamps = profile == Profile::Spec;
        let wc = if stamps { ALL_WC | STAMPS } else { ALL_WC };
        let mut p = ExPair::new(profile, IBV_QPT_RC, 64, wc);
        p.buf_a.fill(256, &[7u8; 128]);
        let (la, rb) = (p.buf_a.lkey(), p.buf_b.rkey());
        let (aa, ab) = (p.buf_a.addr(), p.buf_b.addr());
        let (b, lb) = (p.b, p.buf_b.lkey());
        let xa = p.xa;
        const ROUNDS: u64 = 500;
        let (allocs, failed) = CountingAlloc::count(|| {
            let mut failed = 0;
            for i in 0..ROUNDS {
                for r in 0..2u64 {
                    let mut rs = [ibv_sge {
                        addr: ab + 1024 + r * 64,
                        length: 64,
                        lkey: lb,
                    }];
                    assert_eq!(post_recv(b, i * 2 + r, &mut rs), 0);
                }
                let msg = i.to_le_bytes();
                let sges = [p.buf_a.sge(256, 32), p.buf_a.sge(300, 32)];
                let r = batch(xa, |q| {
                    // SAFETY: inside start .. complete; buffers registered / readable.
                    unsafe {
                        next(q, i, IBV_SEND_INLINE);
                        inline::ibv_wr_send_imm(q, 5u32.to_be());
                        inline::ibv_wr_set_inline_data(q, msg.as_ptr() as *mut _, 8);
                        next(q, i, 0);
                        inline::ibv_wr_rdma_write(q, rb, ab);
                        inline::ibv_wr_set_sge_list(q, 2, sges.as_ptr());
                        next(q, i, 0);
                        inline::ibv_wr_rdma_read(q, rb, ab + 512);
                        inline::ibv_wr_set_sge(q, la, aa + 512, 16);
                        next(q, i, 0);
                        inline::ibv_wr_atomic_fetch_add(q, rb, ab + 2048, 1);
                        inline::ibv_wr_set_sge(q, la, aa + 2048, 8);
                        next(q, i, SIG);
                        inline::ibv_wr_rdma_write_imm(q, rb, ab + 64, 9u32.to_be());
                        inline::ibv_wr_set_sge(q, la, aa, 8);
                    }
                });
                assert_eq!(r, 0);
                failed += poll_ex_n(p.cq_a, 1, stamps);
                failed += poll_ex_n(p.cq_b, 2, stamps);
            }
            failed
        });
        assert_eq!(failed, 0, "{profile:?}");
        assert_eq!(
            allocs, 0,
            "{profile:?}: allocations in the extended hot loop"
        );
    }
}

/// A raw QP pointer handed to another thread (softnic's verbs are thread-safe; the builder
/// lock serialises batches on one QP).
#[derive(Clone, Copy)]
struct SendQp(*mut ibv_qp_ex);
// SAFETY: the QP outlives the threads (joined before the test ends) and every access goes
// through softnic's thread-safe entry points.
unsafe impl Send for SendQp {}

/// Two threads building batches on one QP: the builder lock (`wr_start` .. `wr_complete`)
/// keeps each batch whole, so each thread's two WRs complete back to back.
#[test]
fn concurrent_batches_on_one_qp_stay_whole() {
    for profile in PROFILES {
        let dev = Dev::with_profile(profile);
        let cq = cq_ex(dev.ctx, 2048, ALL_WC, null_mut()).expect("cq");
        let mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        let a = qp_ex(dev.ctx, dev.pd, IBV_QPT_RC, cq_of(cq), 1024, mask, RC_OPS).expect("a");
        let b = qp_ex(dev.ctx, dev.pd, IBV_QPT_RC, cq_of(cq), 1024, mask, RC_OPS).expect("b");
        connect(a, dev.ctx, qpn(b), ALL_ACCESS, 7);
        connect(b, dev.ctx, qpn(a), ALL_ACCESS, 7);
        let buf = dev.buf(256, ALL_ACCESS);
        let (lkey, rkey, addr) = (buf.lkey(), buf.rkey(), buf.addr());
        let qx = SendQp(to_ex(a));
        const BATCHES: u64 = 200;
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                std::thread::spawn(move || {
                    let qx = qx;
                    for i in 0..BATCHES {
                        let r = batch(qx.0, |q| {
                            for k in 0..2 {
                                next(q, (t << 32) | (i << 1) | k, SIG);
                                // SAFETY: inside start .. complete; registered buffer.
                                unsafe {
                                    inline::ibv_wr_rdma_write(q, rkey, addr + 128 + 8 * t);
                                    inline::ibv_wr_set_sge(q, lkey, addr + 8 * t, 8);
                                }
                            }
                        });
                        assert_eq!(r, 0);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("builder thread");
        }
        let c = drain_ex(cq);
        assert_eq!(c.len(), 2 * 2 * BATCHES as usize, "{profile:?}");
        for pair in c.chunks(2) {
            assert_eq!(pair[0].status, IBV_WC_SUCCESS);
            assert_eq!(pair[0].wr_id & 1, 0, "{pair:?}");
            assert_eq!(
                pair[1].wr_id,
                pair[0].wr_id + 1,
                "a batch was split: {pair:?}"
            );
        }
    }
}

/// CQ overflow on an extended CQ (S15): Spec — the CQ is in error, `start_poll` answers
/// EOVERFLOW (as `ibv_poll_cq` answers -EOVERFLOW); Rxe — the completion is dropped and
/// the CQ stays usable (ENOENT, then later completions as usual).
#[test]
fn overflow_on_an_extended_cq_follows_the_profile() {
    for profile in PROFILES {
        let mut p = ExPair::new(profile, IBV_QPT_RC, 8, ALL_WC);
        p.buf_a.fill(0, b"12345678");
        // SAFETY: a live softnic CQ.
        unsafe { hotverbs_softnic::inject_cq_overflow(cq_of(p.cq_a), 1) };
        let (la, rb) = (p.buf_a.lkey(), p.buf_b.rkey());
        let (aa, ab) = (p.buf_a.addr(), p.buf_b.addr());
        let write = |id: u64| {
            batch(p.xa, |q| {
                next(q, id, SIG);
                // SAFETY: inside start .. complete.
                unsafe {
                    inline::ibv_wr_rdma_write(q, rb, ab);
                    inline::ibv_wr_set_sge(q, la, aa, 8);
                }
            })
        };
        assert_eq!(write(1), 0);
        let mut attr = ibv_poll_cq_attr::default();
        // SAFETY: a live extended CQ polled by this thread.
        let r = unsafe { inline::ibv_start_poll(p.cq_a, &mut attr) };
        if profile == Profile::Rxe {
            assert_eq!(r, libc::ENOENT);
            assert_eq!(write(2), 0);
            let c = drain_ex(p.cq_a);
            assert_eq!((c.len(), c[0].wr_id), (1, 2));
        } else {
            assert_eq!(r, libc::EOVERFLOW);
        }
    }
}

/// `ibv_wr_post(3)`: inline setters are "valid only for SEND and RDMA_WRITE" (on a READ:
/// EINVAL at `wr_complete`, nothing posted), and IBV_SEND_INLINE is no `wr_flags` flag: a
/// WR whose data comes from `wr_set_sge` is gathered from the SGE even with the flag and
/// more bytes than `max_inline_data` (64 here).
#[test]
fn inline_setters_and_the_inline_flag_per_the_man_page() {
    for profile in PROFILES {
        let mut p = ExPair::new(profile, IBV_QPT_RC, 8, ALL_WC);
        let big: Vec<u8> = (0..200u8).collect();
        p.buf_a.fill(0, &big);
        let (la, rb) = (p.buf_a.lkey(), p.buf_b.rkey());
        let (aa, ab) = (p.buf_a.addr(), p.buf_b.addr());
        let mut word = 5u64.to_ne_bytes();
        let r = batch(p.xa, |q| {
            next(q, 1, SIG);
            // SAFETY: inside start .. complete; `word` readable.
            unsafe {
                inline::ibv_wr_rdma_write(q, rb, ab);
                inline::ibv_wr_set_sge(q, la, aa, 8);
                inline::ibv_wr_rdma_read(q, rb, ab + 512);
                inline::ibv_wr_set_inline_data(q, word.as_mut_ptr().cast(), 8);
            }
        });
        assert_eq!(r, libc::EINVAL, "{profile:?}: inline data on a READ");
        assert!(drain_ex(p.cq_a).is_empty());
        assert_eq!(p.buf_b.bytes(0, 8), [0u8; 8]);
        let r = batch(p.xa, |q| {
            next(q, 2, SIG | IBV_SEND_INLINE);
            // SAFETY: inside start .. complete.
            unsafe {
                inline::ibv_wr_rdma_write(q, rb, ab + 1024);
                inline::ibv_wr_set_sge(q, la, aa, 200);
            }
        });
        assert_eq!(
            r, 0,
            "{profile:?}: the flag does not make an SGE's data inline"
        );
        let c = drain_ex(p.cq_a);
        assert_eq!((c[0].wr_id, c[0].status), (2, IBV_WC_SUCCESS));
        assert_eq!(p.buf_b.bytes(1024, 200), big);
    }
}
