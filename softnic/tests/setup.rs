//! Device, port, GID queries, caps checks, object lifetimes and the QP state machine.

mod common;
use common::*;
use core::ffi::CStr;
use core::ptr::null_mut;
use hotverbs_softnic::{open_device, Config};

#[test]
fn device_list_and_queries() {
    let f = fns();
    // SAFETY: the device list is read while live (n entries plus the NULL terminator) and
    // freed once; ctx is opened from it and used until it is closed on the last line;
    // every out-parameter is a valid local; the *_str verbs return static C strings.
    unsafe {
        let mut n = -1;
        let list = f.ibv_get_device_list.unwrap()(&mut n);
        assert_eq!(n, 1);
        assert!((*list.add(1)).is_null());
        let name = CStr::from_ptr(f.ibv_get_device_name.unwrap()(*list));
        assert_eq!(name.to_str().unwrap(), "softnic");
        assert_ne!(f.ibv_get_device_guid.unwrap()(*list), 0);
        let ctx = f.ibv_open_device.unwrap()(*list);
        f.ibv_free_device_list.unwrap()(list);

        let mut a = ibv_device_attr::default();
        assert_eq!(f.ibv_query_device.unwrap()(ctx, &mut a), 0);
        assert_eq!(a.max_qp_wr, 1_048_576);
        assert_eq!(a.max_sge, 32);
        assert_eq!(a.max_cqe, 32767);
        assert_eq!(a.atomic_cap, IBV_ATOMIC_HCA);
        assert_eq!(a.phys_port_cnt, 1);

        // Through verbs-ffi's ibv_query_port, as the hotverbs layer calls it.
        let mut p = ibv_port_attr::default();
        assert_eq!(inline::ibv_query_port(f, ctx, 1, &mut p), 0);
        assert_eq!(p.state, IBV_PORT_ACTIVE);
        assert_eq!(p.active_mtu, IBV_MTU_1024);
        assert_eq!(p.max_mtu, IBV_MTU_4096);
        assert_eq!(p.link_layer as u32, IBV_LINK_LAYER_ETHERNET);
        assert_eq!(p.lid, 0);
        assert!(p.gid_tbl_len >= 2);
        assert_eq!(inline::ibv_query_port(f, ctx, 2, &mut p), libc::EINVAL);

        let g1 = gid(ctx, 1);
        assert_eq!(&g1.raw[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(&g1.raw[12..], &[10, 77, 0, 1]);
        let g0 = gid(ctx, 0);
        assert_eq!(&g0.raw[..2], &[0xfe, 0x80]);
        let mut e = ibv_gid_entry::default();
        assert_eq!(inline::ibv_query_gid_ex(f, ctx, 1, 1, &mut e, 0), 0);
        assert_eq!(e.gid_type, IBV_GID_TYPE_ROCE_V2);
        assert_eq!(e.gid.raw, g1.raw);
        assert_eq!(
            inline::ibv_query_gid_ex(f, ctx, 1, 5, &mut e, 0),
            libc::ENODATA
        );
        let mut pk = 0u16;
        assert_eq!(f.ibv_query_pkey.unwrap()(ctx, 1, 0, &mut pk), 0);
        assert_eq!(pk, 0xffff);

        let s = |p: *const core::ffi::c_char| CStr::from_ptr(p).to_str().unwrap().to_string();
        assert_eq!(
            s(f.ibv_wc_status_str.unwrap()(IBV_WC_WR_FLUSH_ERR)),
            "Work Request Flushed Error"
        );
        assert_eq!(s(f.ibv_wc_status_str.unwrap()(999)), "unknown");
        assert_eq!(
            s(f.ibv_event_type_str.unwrap()(IBV_EVENT_QP_FATAL)),
            "local work queue catastrophic error"
        );
        assert_eq!(
            s(f.ibv_port_state_str.unwrap()(IBV_PORT_ACTIVE)),
            "PORT_ACTIVE"
        );
        assert_eq!(f.ibv_close_device.unwrap()(ctx), 0);
    }
}

/// ibv_create_qp(3): actual caps >= requested; beyond device limits EINVAL. An
/// open_device config changes the limits.
#[test]
fn qp_caps() {
    let ctx = open_device(Config {
        max_qp_wr: 64,
        max_sge: 4,
        max_inline_data: 128,
        max_cqe: 100,
        max_qp: 2,
        ..Default::default()
    });
    let dev = Dev::with_ctx(ctx);
    let f = fns();
    // SAFETY: ctx is live; these creations fail (the point), so nothing leaks.
    unsafe {
        assert!(f.ibv_create_cq.unwrap()(ctx, 101, null_mut(), null_mut(), 0).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(f.ibv_create_cq.unwrap()(ctx, 0, null_mut(), null_mut(), 0).is_null());
        assert_eq!(errno(), libc::EINVAL);
    }
    let cq = dev.cq(100);
    let try_cap = |c: ibv_qp_cap| {
        let mut ia = ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            cap: c,
            qp_type: IBV_QPT_RC,
            ..Default::default()
        };
        let qp = create_qp(dev.pd, &mut ia);
        (qp, ia.cap, errno())
    };
    let ok = ibv_qp_cap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 128,
    };
    for bad in [
        ibv_qp_cap {
            max_send_wr: 65,
            ..ok
        },
        ibv_qp_cap {
            max_recv_wr: 65,
            ..ok
        },
        ibv_qp_cap {
            max_send_sge: 5,
            ..ok
        },
        ibv_qp_cap {
            max_recv_sge: 5,
            ..ok
        },
        ibv_qp_cap {
            max_inline_data: 129,
            ..ok
        },
    ] {
        let (qp, _, e) = try_cap(bad);
        assert!(qp.is_null());
        assert_eq!(e, libc::EINVAL);
    }
    let (qp, got, _) = try_cap(ok);
    assert!(!qp.is_null());
    assert!(got.max_send_wr >= 64 && got.max_recv_wr >= 64 && got.max_inline_data >= 128);
    let mut attr = ibv_qp_attr::default();
    let mut init = ibv_qp_init_attr::default();
    assert_eq!(query_qp(qp, &mut attr, IBV_QP_CAP, &mut init), 0);
    let queried = if dev.profile() == hotverbs_softnic::Profile::Rxe {
        127 // rxe G12/S19: query_qp reports the depth rounded up to 2^k - 1
    } else {
        got.max_send_wr
    };
    assert_eq!(attr.cap.max_send_wr, queried);
    assert_eq!(init.qp_type, IBV_QPT_RC);
    assert_eq!(init.send_cq, cq);
    // max_qp 2.
    let (q2, _, _) = try_cap(ok);
    assert!(!q2.is_null());
    let (q3, _, e) = try_cap(ok);
    assert!(q3.is_null());
    assert_eq!(e, libc::ENOMEM);
    // NULL CQ.
    let mut ia = ibv_qp_init_attr {
        send_cq: null_mut(),
        recv_cq: cq,
        cap: ok,
        qp_type: IBV_QPT_RC,
        ..Default::default()
    };
    assert!(create_qp(dev.pd, &mut ia).is_null());
    assert_eq!(errno(), libc::EINVAL);
    // QPNs are distinct.
    assert_ne!(qpn(qp), qpn(q2));
}

/// Object lifetimes: EBUSY while in use (rxe S21), access-flag rule of ibv_reg_mr(3).
#[test]
fn lifetimes_and_ebusy() {
    let f = fns();
    let dev = Dev::new();
    let cq = dev.cq(8);
    let qp = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
    let buf = dev.buf(64, IBV_ACCESS_LOCAL_WRITE);
    // SAFETY: all objects are live until destroyed here, each exactly once (the refused
    // destroys leave them live); the refused registrations are over buf's own memory.
    unsafe {
        assert!(f.ibv_reg_mr.unwrap()(
            dev.pd,
            buf.mem.as_ptr() as *mut _,
            8,
            IBV_ACCESS_REMOTE_WRITE as i32
        )
        .is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(f.ibv_reg_mr.unwrap()(
            dev.pd,
            buf.mem.as_ptr() as *mut _,
            8,
            IBV_ACCESS_REMOTE_ATOMIC as i32
        )
        .is_null());
        assert_eq!(f.ibv_dealloc_pd.unwrap()(dev.pd), libc::EBUSY);
        assert_eq!(f.ibv_destroy_cq.unwrap()(cq), libc::EBUSY);
        assert_eq!(f.ibv_destroy_qp.unwrap()(qp), 0);
        assert_eq!(f.ibv_destroy_cq.unwrap()(cq), 0);
        assert_eq!(
            f.ibv_dealloc_pd.unwrap()(dev.pd),
            libc::EBUSY,
            "MR still registered"
        );
        assert_eq!(f.ibv_dereg_mr.unwrap()(buf.mr), 0);
        assert_eq!(f.ibv_dealloc_pd.unwrap()(dev.pd), 0);
        assert_eq!(f.ibv_close_device.unwrap()(dev.ctx), 0);
    }
}

/// The standard RC/UC/UD paths, plus missing required attributes at every step (EINVAL,
/// state unchanged) — ibv_modify_qp(3), rxe S20.
#[test]
fn state_machine_required_masks() {
    for qpt in [IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD] {
        let dev = Dev::new();
        let cq = dev.cq(8);
        let qp = dev.qp(qpt, cq, cq, cap(4));
        let ud = qpt == IBV_QPT_UD;
        // RESET -> INIT
        let init_mask = IBV_QP_STATE
            | IBV_QP_PKEY_INDEX
            | IBV_QP_PORT
            | if ud { IBV_QP_QKEY } else { IBV_QP_ACCESS_FLAGS };
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            port_num: 1,
            qkey: 1,
            ..Default::default()
        };
        for bit in [
            IBV_QP_PKEY_INDEX,
            IBV_QP_PORT,
            if ud { IBV_QP_QKEY } else { IBV_QP_ACCESS_FLAGS },
        ] {
            assert_eq!(
                modify(qp, &mut a, init_mask & !bit),
                libc::EINVAL,
                "{qpt} init without {bit:#x}"
            );
            assert_eq!(state(qp), IBV_QPS_RESET);
        }
        // An attribute the transition does not take.
        let extra = if ud { IBV_QP_ACCESS_FLAGS } else { IBV_QP_QKEY };
        assert_eq!(modify(qp, &mut a, init_mask | extra), libc::EINVAL);
        a.port_num = 2;
        assert_eq!(modify(qp, &mut a, init_mask), libc::EINVAL, "port 2");
        a.port_num = 1;
        assert_eq!(modify(qp, &mut a, init_mask), 0);
        assert_eq!(state(qp), IBV_QPS_INIT);
        // INIT -> RTR
        let mut r = rtr_attr(dev.ctx, qpn(qp));
        let rtr_mask = match qpt {
            IBV_QPT_RC => RC_RTR_MASK,
            IBV_QPT_UC => UC_RTR_MASK,
            _ => IBV_QP_STATE,
        };
        for bit in [
            IBV_QP_AV,
            IBV_QP_PATH_MTU,
            IBV_QP_DEST_QPN,
            IBV_QP_RQ_PSN,
            IBV_QP_MAX_DEST_RD_ATOMIC,
            IBV_QP_MIN_RNR_TIMER,
        ] {
            if rtr_mask & bit != 0 {
                assert_eq!(
                    modify(qp, &mut r, rtr_mask & !bit),
                    libc::EINVAL,
                    "{qpt} rtr without {bit:#x}"
                );
                assert_eq!(state(qp), IBV_QPS_INIT);
            }
        }
        if !ud {
            r.ah_attr.is_global = 0;
            assert_eq!(
                modify(qp, &mut r, rtr_mask),
                libc::EINVAL,
                "RoCE AV needs a GRH"
            );
            r.ah_attr.is_global = 1;
            r.ah_attr.grh.sgid_index = 200;
            assert_eq!(modify(qp, &mut r, rtr_mask), libc::ENODATA);
            r.ah_attr.grh.sgid_index = 1;
        }
        assert_eq!(modify(qp, &mut r, rtr_mask | IBV_QP_SQ_PSN), libc::EINVAL);
        assert_eq!(modify(qp, &mut r, rtr_mask), 0);
        assert_eq!(state(qp), IBV_QPS_RTR);
        // RTR -> RTS
        let mut s = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let rts_mask = if qpt == IBV_QPT_RC {
            RC_RTS_MASK
        } else {
            IBV_QP_STATE | IBV_QP_SQ_PSN
        };
        for bit in [
            IBV_QP_SQ_PSN,
            IBV_QP_TIMEOUT,
            IBV_QP_RETRY_CNT,
            IBV_QP_RNR_RETRY,
            IBV_QP_MAX_QP_RD_ATOMIC,
        ] {
            if rts_mask & bit != 0 {
                assert_eq!(
                    modify(qp, &mut s, rts_mask & !bit),
                    libc::EINVAL,
                    "{qpt} rts without {bit:#x}"
                );
                assert_eq!(state(qp), IBV_QPS_RTR);
            }
        }
        if qpt == IBV_QPT_RC {
            s.timeout = 40;
            assert_eq!(modify(qp, &mut s, rts_mask), libc::EINVAL);
            s.timeout = 14;
            s.max_rd_atomic = 200;
            assert_eq!(modify(qp, &mut s, rts_mask), libc::EINVAL);
            s.max_rd_atomic = 1;
        }
        assert_eq!(modify(qp, &mut s, rts_mask), 0);
        assert_eq!(state(qp), IBV_QPS_RTS);
        let mut q = ibv_qp_attr::default();
        let mut ini = ibv_qp_init_attr::default();
        assert_eq!(query_qp(qp, &mut q, IBV_QP_STATE, &mut ini), 0);
        assert_eq!(q.qp_state, IBV_QPS_RTS);
        if !ud {
            assert_eq!(q.dest_qp_num, qpn(qp));
            assert_eq!(q.qp_access_flags, 0);
        }
    }
}

/// Invalid transitions are EINVAL and leave the state; allowed ones work (rxe S20).
#[test]
fn state_machine_transitions() {
    let dev = Dev::new();
    let cq = dev.cq(8);
    let qp = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
    let go = |st: ibv_qp_state| {
        let mut a = ibv_qp_attr {
            qp_state: st,
            ..Default::default()
        };
        modify(qp, &mut a, IBV_QP_STATE)
    };
    for bad in [IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_ERR, IBV_QPS_SQD, 9] {
        assert_eq!(go(bad), libc::EINVAL, "RESET -> {bad}");
        assert_eq!(state(qp), IBV_QPS_RESET);
    }
    assert_eq!(go(IBV_QPS_RESET), 0);
    to_init(qp, ALL_ACCESS);
    assert_eq!(go(IBV_QPS_RTS), libc::EINVAL, "INIT -> RTS");
    assert_eq!(go(IBV_QPS_INIT), 0, "INIT -> INIT");
    to_rtr(qp, dev.ctx, qpn(qp));
    assert_eq!(go(IBV_QPS_RTR), libc::EINVAL, "RTR -> RTR");
    to_rts(qp, 7);
    for bad in [IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_SQE] {
        assert_eq!(go(bad), libc::EINVAL, "RTS -> {bad}");
        assert_eq!(state(qp), IBV_QPS_RTS);
    }
    // RTS -> RTS: MIN_RNR_TIMER / ACCESS_FLAGS fine, TIMEOUT / DEST_QPN not.
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        min_rnr_timer: 3,
        ..Default::default()
    };
    assert_eq!(modify(qp, &mut a, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER), 0);
    assert_eq!(
        modify(qp, &mut a, IBV_QP_STATE | IBV_QP_TIMEOUT),
        libc::EINVAL
    );
    assert_eq!(
        modify(qp, &mut a, IBV_QP_STATE | IBV_QP_DEST_QPN),
        libc::EINVAL
    );
    assert_eq!(
        modify(qp, &mut a, IBV_QP_TIMEOUT),
        libc::EINVAL,
        "TIMEOUT without STATE"
    );
    assert_eq!(modify(qp, &mut a, 0), 0, "mask 0");
    // CUR_STATE must match.
    let mut c = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        cur_qp_state: IBV_QPS_INIT,
        ..Default::default()
    };
    assert_eq!(
        modify(qp, &mut c, IBV_QP_STATE | IBV_QP_CUR_STATE),
        libc::EINVAL
    );
    assert_eq!(go(IBV_QPS_ERR), 0);
    assert_eq!(go(IBV_QPS_ERR), 0, "ERR -> ERR");
    assert_eq!(go(IBV_QPS_RTS), libc::EINVAL);
    assert_eq!(go(IBV_QPS_INIT), libc::EINVAL);
    assert_eq!(go(IBV_QPS_RESET), 0);
    to_init(qp, ALL_ACCESS);
    assert_eq!(
        // SAFETY: qp is live.
        unsafe { (*qp).state },
        IBV_QPS_INIT,
        "ibv_qp.state mirrors the state"
    );
}

/// To RESET drops receives without completions (rxe S14); the QP is reusable.
#[test]
fn reset_drops_queues() {
    let p = Pair::new(IBV_QPT_RC);
    let mut r = [p.buf_b.sge(0, 8)];
    assert_eq!(post_recv(p.b, 1, &mut r), 0);
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RESET,
        ..Default::default()
    };
    assert_eq!(modify(p.b, &mut a, IBV_QP_STATE), 0);
    assert!(drain(p.cq_b).is_empty());
    connect(p.b, p.dev.ctx, qpn(p.a), ALL_ACCESS, 7);
    // The dropped receive is gone: with rnr_retry 0 the send gets RNR.
    let dev2 = &p.dev;
    let cq = dev2.cq(4);
    let c = dev2.qp(IBV_QPT_RC, cq, cq, cap(4));
    connect(c, dev2.ctx, qpn(p.b), ALL_ACCESS, 0);
    let mut s = [p.buf_a.sge(0, 8)];
    let mut wr = send_wr(5, IBV_WR_SEND, &mut s, IBV_SEND_SIGNALED);
    assert_eq!(post(c, &mut wr), 0);
    assert_eq!(ids(&drain(cq)), vec![(5, IBV_WC_RNR_RETRY_EXC_ERR)]);
}

/// The completion channel and async fds are real fds: epoll sees them.
#[test]
fn fds_work_with_epoll() {
    let dev = Dev::new();
    let f = fns();
    // SAFETY: dev.ctx is live.
    let ch = unsafe { f.ibv_create_comp_channel.unwrap()(dev.ctx) };
    assert!(!ch.is_null());
    // SAFETY: dev.ctx and ch are live.
    let cq = unsafe { f.ibv_create_cq.unwrap()(dev.ctx, 8, null_mut(), ch, 0) };
    assert!(!cq.is_null());
    let qp = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
    connect(qp, dev.ctx, qpn(qp), ALL_ACCESS, 7);
    // SAFETY: no preconditions; the fd is closed at the end.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0);
    // SAFETY: ch and dev.ctx are live (never destroyed in this test).
    let (ch_fd, async_fd) = unsafe { ((*ch).fd, (*dev.ctx).async_fd) };
    for (fd, tag) in [(ch_fd, 1u64), (async_fd, 2)] {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: tag,
        };
        assert_eq!(
            // SAFETY: ep and fd are open; ev is a valid event.
            unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) },
            0
        );
    }
    let wait = || {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: ep is open; evs has room for 4 events; zero timeout.
        let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 4, 0) };
        let mut tags: Vec<u64> = evs[..n.max(0) as usize].iter().map(|e| e.u64).collect();
        tags.sort();
        tags
    };
    assert!(wait().is_empty());
    assert_eq!(req_notify(cq, false), 0);
    let buf = dev.buf(64, ALL_ACCESS);
    let mut s = [buf.sge(0, 8)];
    let mut wr = rdma(
        send_wr(1, IBV_WR_RDMA_WRITE, &mut s, IBV_SEND_SIGNALED),
        buf.addr() + 16,
        buf.rkey(),
    );
    assert_eq!(post(qp, &mut wr), 0);
    assert_eq!(wait(), vec![1]);
    if dev.profile() == hotverbs_softnic::Profile::Rxe {
        // rxe G7: a QP going to ERR raises no async event; a CQ overflow raises CQ_ERR.
        inject_cq_overflow(cq, 1);
        assert_eq!(post(qp, &mut wr), 0);
    } else {
        inject_qp_error(qp);
    }
    assert_eq!(wait(), vec![1, 2]);
    // SAFETY: ep is ours and closed once.
    unsafe { libc::close(ep) };
}

/// libibverbs' `ibv_cmd_query_qp` / `ibv_cmd_modify_qp` (the path rxe and mlx5 take) refuse
/// mask bits from IBV_QP_RATE_LIMIT on with EOPNOTSUPP; softnic answers the same, and the
/// QP is left untouched.
#[test]
fn query_and_modify_qp_refuse_extended_mask_bits_with_eopnotsupp() {
    let dev = Dev::new();
    let cq = dev.cq(16);
    let qp = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
    let mut a = ibv_qp_attr::default();
    let mut ini = ibv_qp_init_attr::default();
    let query =
        |a: &mut ibv_qp_attr, ini: &mut ibv_qp_init_attr, mask: u32| query_qp(qp, a, mask, ini);
    for bit in [IBV_QP_RATE_LIMIT, 1 << 26, 1 << 30] {
        assert_eq!(
            query(&mut a, &mut ini, IBV_QP_STATE | bit),
            libc::EOPNOTSUPP,
            "query_qp with {bit:#x}"
        );
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.rate_limit = 1000;
        let init = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        assert_eq!(
            modify(qp, &mut a, init | bit),
            libc::EOPNOTSUPP,
            "modify_qp with {bit:#x}"
        );
        assert_eq!(state(qp), IBV_QPS_RESET);
    }
    // Every standard bit below IBV_QP_RATE_LIMIT is fine for a query.
    assert_eq!(query(&mut a, &mut ini, IBV_QP_RATE_LIMIT - 1), 0);
    assert_eq!(a.qp_state, IBV_QPS_RESET);
}

/// rxe S20: max_dest_rd_atomic is not validated (200 is accepted), unlike max_rd_atomic.
#[test]
fn max_dest_rd_atomic_is_not_validated_as_on_rxe() {
    let dev = Dev::new();
    let cq = dev.cq(16);
    let qp = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
    to_init(qp, ALL_ACCESS);
    let mut r = rtr_attr(dev.ctx, qpn(qp));
    r.max_dest_rd_atomic = 200;
    assert_eq!(modify(qp, &mut r, RC_RTR_MASK), 0);
    assert_eq!(state(qp), IBV_QPS_RTR);
    let mut a = ibv_qp_attr::default();
    let mut ini = ibv_qp_init_attr::default();
    let rc = query_qp(qp, &mut a, IBV_QP_STATE, &mut ini);
    assert_eq!(rc, 0);
    assert_eq!(a.max_dest_rd_atomic, 200);
}
