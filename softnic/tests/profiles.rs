//! The two behaviour profiles, side by side: every row of `shared/rxe-vm/fault-truth.md`
//! where rxe departs from the man pages, run on a device opened with `Profile::Spec` and
//! one opened with `Profile::Rxe` (explicit configs, so these tests pass whatever
//! `HOTVERBS_SOFTNIC_PROFILE` says). Each test names its rows.

mod common;

use core::ptr::null_mut;

use common::*;
use hotverbs_softnic::testing::{self as t, ConnectAttr};
use hotverbs_softnic::Profile::{self, Rxe, Spec};

const PROFILES: [Profile; 2] = [Spec, Rxe];

// ------------------------------------------------------------------ helpers

fn pair(p: Profile, qpt: ibv_qp_type, depth: u32, rnr_retry: u8) -> Pair {
    let dev = Dev::with_profile(p);
    assert_eq!(dev.profile(), p);
    Pair::on(dev, qpt, depth, rnr_retry)
}

/// Brings `qp` to RTS towards `dest` with the given transport retry attributes.
fn connect_retry(qp: *mut ibv_qp, ctx: *mut ibv_context, dest: u32, retry_cnt: u8, timeout: u8) {
    let c = ConnectAttr {
        rnr_retry: 0,
        ..ConnectAttr::new(dest, gid(ctx, 1))
    };
    // SAFETY: qp is live (module contract).
    unsafe {
        t::qp_to_init(qp, &c);
        t::qp_to_rtr(qp, &c);
    }
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        timeout,
        retry_cnt,
        rnr_retry: 0,
        max_rd_atomic: 1,
        ..Default::default()
    };
    assert_eq!(modify(qp, &mut a, RC_RTS_MASK), 0);
}

fn to_state(qp: *mut ibv_qp, s: ibv_qp_state) -> i32 {
    let mut a = ibv_qp_attr {
        qp_state: s,
        ..Default::default()
    };
    modify(qp, &mut a, IBV_QP_STATE)
}

fn signaled_send(wr_id: u64, sge: &mut [ibv_sge]) -> ibv_send_wr {
    send_wr(wr_id, IBV_WR_SEND, sge, IBV_SEND_SIGNALED)
}

/// The async events of `ctx` (type only).
fn events(ctx: *mut ibv_context) -> Vec<ibv_event_type> {
    all_async_events(ctx).into_iter().map(|(e, _)| e).collect()
}

// ------------------------------------------------------------------ tests

#[test]
fn profile_names_and_device_query() {
    assert_eq!(Profile::parse("spec"), Some(Spec));
    assert_eq!(Profile::parse("RXE"), Some(Rxe));
    assert_eq!(Profile::parse("Rxe"), Some(Rxe));
    assert_eq!(Profile::parse(""), Some(Spec));
    assert_eq!(Profile::parse("mlx5"), None);
    assert_eq!(Profile::default(), Spec);
    for p in PROFILES {
        assert_eq!(Dev::with_profile(p).profile(), p);
    }
    // The listed device follows the environment.
    let listed = Dev::new();
    assert_eq!(listed.profile(), Profile::from_env());
}

/// rxe S1 / G1: post_send before RTS returns EINVAL with bad_wr NULL (errno 22) but queues
/// the WRs, which run at the next valid post_send after RTS.
#[test]
fn s1_post_send_before_rts() {
    for p in PROFILES {
        let dev = Dev::with_profile(p);
        let (cq_a, cq_b) = (dev.cq(64), dev.cq(64));
        let a = dev.qp(IBV_QPT_RC, cq_a, cq_a, cap(16));
        let b = dev.qp(IBV_QPT_RC, cq_b, cq_b, cap(16));
        connect(b, dev.ctx, qpn(a), ALL_ACCESS, 7);
        let buf_a = dev.buf(64, ALL_ACCESS);
        let buf_b = dev.buf(4096, ALL_ACCESS);
        for i in 0..4 {
            assert_eq!(
                post_recv(b, 100 + i, &mut [buf_b.sge(64 * i as usize, 64)]),
                0
            );
        }
        let mut sge = [buf_a.sge(0, 8)];
        // RESET, INIT, RTR: one signaled SEND each.
        let steps: [&dyn Fn(); 3] = [
            &|| to_init(a, ALL_ACCESS),
            &|| to_rtr(a, dev.ctx, qpn(b)),
            &|| to_rts(a, 7),
        ];
        for (i, step) in steps.iter().enumerate() {
            let mut wr = signaled_send(11 + i as u64, &mut sge);
            let mut bad = &mut wr as *mut ibv_send_wr;
            hotverbs_ffi::set_errno(0);
            // SAFETY: a live QP; wr and its SGE are valid for the call.
            let rc = unsafe { inline::ibv_post_send(a, &mut wr, &mut bad) };
            let e = errno();
            assert_eq!(rc, libc::EINVAL, "{p:?}");
            match p {
                Spec => assert_eq!((bad, e), (&mut wr as *mut _, 0), "man: bad_wr is the WR"),
                _ => assert_eq!((bad, e), (null_mut(), libc::EINVAL), "rxe S1/G1"),
            }
            assert!(drain(cq_a).is_empty());
            step();
        }
        // In RTS nothing has run yet; the next valid post runs the queued WRs first.
        assert!(drain(cq_a).is_empty());
        assert!(drain(cq_b).is_empty());
        assert_eq!(post(a, &mut signaled_send(14, &mut sge)), 0);
        let want_a: Vec<(u64, u32)> = match p {
            Spec => vec![(14, IBV_WC_SUCCESS)],
            _ => (11..=14).map(|i| (i, IBV_WC_SUCCESS)).collect(),
        };
        assert_eq!(ids(&drain(cq_a)), want_a, "{p:?}");
        assert_eq!(drain(cq_b).len(), want_a.len(), "{p:?}");
    }
}

/// rxe S2: post_recv in RESET returns EINVAL with bad_wr NULL (Spec: the first WR) and
/// queues nothing.
#[test]
fn s2_post_recv_in_reset() {
    for p in PROFILES {
        let dev = Dev::with_profile(p);
        let cq = dev.cq(16);
        let qp = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
        let buf = dev.buf(64, ALL_ACCESS);
        let mut sge = [buf.sge(0, 8)];
        let mut wr = ibv_recv_wr {
            wr_id: 1,
            next: null_mut(),
            sg_list: sge.as_mut_ptr(),
            num_sge: 1,
        };
        let mut bad = null_mut();
        hotverbs_ffi::set_errno(0);
        // SAFETY: a live QP; wr and its SGE are valid for the call.
        let rc = unsafe { inline::ibv_post_recv(qp, &mut wr, &mut bad) };
        assert_eq!((rc, errno()), (libc::EINVAL, 0));
        let want = if p == Spec {
            &mut wr as *mut _
        } else {
            null_mut()
        };
        assert_eq!(bad, want, "{p:?}");
        assert_eq!(rq_outstanding(qp), 0);
    }
}

/// rxe G9 / S2: post_recv in ERR returns 0; Spec flushes it at once, rxe holds it until
/// modify(ERR->ERR) flushes it, and ->RESET discards it.
#[test]
fn g9_post_recv_in_err() {
    for p in PROFILES {
        let x = pair(p, IBV_QPT_RC, 16, 7);
        assert_eq!(to_state(x.b, IBV_QPS_ERR), 0);
        assert_eq!(post_recv(x.b, 1, &mut [x.buf_b.sge(0, 64)]), 0);
        // A send doorbell does not move it either.
        assert_eq!(
            post(x.b, &mut signaled_send(2, &mut [x.buf_b.sge(64, 8)])),
            0
        );
        let wcs = drain(x.cq_b);
        match p {
            Spec => {
                assert_eq!(
                    ids(&wcs),
                    [(1, IBV_WC_WR_FLUSH_ERR), (2, IBV_WC_WR_FLUSH_ERR)]
                );
                assert_eq!(rq_outstanding(x.b), 0);
            }
            _ => {
                assert_eq!(ids(&wcs), [(2, IBV_WC_WR_FLUSH_ERR)]);
                assert_eq!(rq_outstanding(x.b), 1);
                assert_eq!(to_state(x.b, IBV_QPS_ERR), 0);
                assert_eq!(ids(&drain(x.cq_b)), [(1, IBV_WC_WR_FLUSH_ERR)]);
                assert_eq!(rq_outstanding(x.b), 0);
                // ->RESET discards a receive posted in ERR without a completion.
                assert_eq!(post_recv(x.b, 3, &mut [x.buf_b.sge(0, 64)]), 0);
                assert_eq!(to_state(x.b, IBV_QPS_RESET), 0);
                assert!(drain(x.cq_b).is_empty());
                assert_eq!(rq_outstanding(x.b), 0);
            }
        }
    }
}

/// rxe G2: error and flush completions carry opcode 0, byte_len 0, wc_flags 0, receives
/// included; Spec keeps the WR's opcode.
#[test]
fn g2_error_completion_fields() {
    for p in PROFILES {
        let x = pair(p, IBV_QPT_RC, 16, 7);
        assert_eq!(post_recv(x.a, 50, &mut [x.buf_a.sge(0, 64)]), 0);
        // A receive at the responder: without one, rxe answers a one-packet
        // WRITE_WITH_IMM with RNR before it looks at the rkey (issue 31, D8).
        assert_eq!(post_recv(x.b, 60, &mut [x.buf_b.sge(0, 64)]), 0);
        let mut sge = [x.buf_a.sge(64, 16)];
        let mut wr = rdma(
            send_wr(7, IBV_WR_RDMA_WRITE_WITH_IMM, &mut sge, IBV_SEND_SIGNALED),
            x.buf_b.addr(),
            0x1234_5600,
        );
        assert_eq!(post(x.a, &mut wr), 0);
        let wcs = drain(x.cq_a);
        assert_eq!(
            ids(&wcs),
            [(7, IBV_WC_REM_ACCESS_ERR), (50, IBV_WC_WR_FLUSH_ERR)],
            "{p:?}"
        );
        let (op_send, op_recv) = match p {
            Spec => (IBV_WC_RDMA_WRITE, IBV_WC_RECV),
            _ => (IBV_WC_SEND, IBV_WC_SEND),
        };
        assert_eq!((wcs[0].opcode, wcs[1].opcode), (op_send, op_recv), "{p:?}");
        for w in &wcs {
            assert_eq!((w.byte_len, w.wc_flags, w.qp_num), (0, 0, qpn(x.a)));
        }
    }
}

/// rxe G4: a successful RC receive has IBV_WC_GRH and src_qp 0; Spec: no GRH, src_qp is
/// the sender.
#[test]
fn g4_rc_receive_flags() {
    for p in PROFILES {
        let x = pair(p, IBV_QPT_RC, 16, 7);
        assert_eq!(post_recv(x.b, 1, &mut [x.buf_b.sge(0, 64)]), 0);
        assert_eq!(post_recv(x.b, 2, &mut [x.buf_b.sge(64, 64)]), 0);
        let mut sge = [x.buf_a.sge(0, 8)];
        assert_eq!(post(x.a, &mut send_wr(1, IBV_WR_SEND, &mut sge, 0)), 0);
        let mut wr = send_wr(2, IBV_WR_SEND_WITH_IMM, &mut sge, 0);
        wr.__bindgen_anon_1.imm_data = 0x0102_0304;
        assert_eq!(post(x.a, &mut wr), 0);
        let wcs = drain(x.cq_b);
        assert_eq!(ids(&wcs), [(1, 0), (2, 0)]);
        let flags: Vec<u32> = wcs.iter().map(|w| w.wc_flags).collect();
        let src: Vec<u32> = wcs.iter().map(|w| w.src_qp).collect();
        match p {
            Spec => {
                assert_eq!(flags, [0, IBV_WC_WITH_IMM]);
                assert_eq!(src, [qpn(x.a), qpn(x.a)]);
            }
            _ => {
                assert_eq!(flags, [IBV_WC_GRH, IBV_WC_GRH | IBV_WC_WITH_IMM]);
                assert_eq!(src, [0, 0]);
            }
        }
    }
}

/// rxe G7, S9, S10: no async event when a QP goes to ERR, requester or responder; Spec
/// raises QP_FATAL on the requester and QP_ACCESS_ERR on the responder.
#[test]
fn g7_no_async_event_on_err() {
    for p in PROFILES {
        let x = pair(p, IBV_QPT_RC, 16, 7);
        let mut sge = [x.buf_a.sge(0, 8)];
        let mut wr = rdma(send_wr(1, IBV_WR_RDMA_WRITE, &mut sge, 0), 0, 0xdead_0000);
        assert_eq!(post(x.a, &mut wr), 0);
        assert_eq!(ids(&drain(x.cq_a)), [(1, IBV_WC_REM_ACCESS_ERR)]);
        assert_eq!((state(x.a), state(x.b)), (IBV_QPS_ERR, IBV_QPS_ERR));
        let ev = events(x.dev.ctx);
        match p {
            Spec => assert_eq!(ev, [IBV_EVENT_QP_FATAL, IBV_EVENT_QP_ACCESS_ERR]),
            _ => assert_eq!(ev, [], "rxe G7"),
        }
        // The test hook follows the profile too.
        let y = pair(p, IBV_QPT_RC, 16, 7);
        inject_qp_error(y.a);
        assert_eq!(state(y.a), IBV_QPS_ERR);
        let ev = events(y.dev.ctx);
        match p {
            Spec => assert_eq!(ev, [IBV_EVENT_QP_FATAL]),
            _ => assert_eq!(ev, []),
        }
    }
}

/// rxe G10: query_qp reports cur_qp_state 0.
#[test]
fn g10_query_qp_cur_state() {
    for p in PROFILES {
        let x = pair(p, IBV_QPT_RC, 16, 7);
        let mut a = ibv_qp_attr::default();
        let mut init = ibv_qp_init_attr::default();
        assert_eq!(
            query_qp(x.a, &mut a, IBV_QP_STATE | IBV_QP_CUR_STATE, &mut init),
            0
        );
        assert_eq!(a.qp_state, IBV_QPS_RTS);
        let want = if p == Spec {
            IBV_QPS_RTS
        } else {
            IBV_QPS_RESET
        };
        assert_eq!(a.cur_qp_state, want, "{p:?}");
    }
}

/// rxe G11 / S22 / S14: with retry_cnt 7 (or timeout 0) a request the responder never
/// answers is held for ever, until the QP goes to ERR (flushed); Spec and retry_cnt < 7
/// end with RETRY_EXC_ERR at once.
#[test]
fn g11_retry_forever_against_a_dead_peer() {
    // (retry_cnt, timeout, rxe holds?)
    for (retry, timeout, held) in [(7, 14, true), (1, 0, true), (2, 14, false)] {
        for p in PROFILES {
            let dev = Dev::with_profile(p);
            let cq = dev.cq(64);
            let a = dev.qp(IBV_QPT_RC, cq, cq, cap(16));
            let b = dev.qp(IBV_QPT_RC, cq, cq, cap(16));
            connect_retry(a, dev.ctx, qpn(b), retry, timeout);
            // b is left in RESET (not RTR: S22 "left in INIT" / destroyed).
            let buf = dev.buf(64, ALL_ACCESS);
            let mut sge = [buf.sge(0, 8)];
            assert_eq!(post(a, &mut send_wr(1, IBV_WR_SEND, &mut sge, 0)), 0);
            assert_eq!(post(a, &mut signaled_send(2, &mut sge)), 0);
            let wcs = drain(cq);
            if p == Rxe && held {
                assert!(
                    wcs.is_empty(),
                    "rxe G11: never completes ({retry}, {timeout})"
                );
                assert_eq!(send_wrs_waiting(a), 2);
                assert_eq!(state(a), IBV_QPS_RTS);
                assert_eq!(sq_outstanding(a), 2);
                // Destroying the peer changes nothing; modify(ERR) flushes.
                // SAFETY: b is live and unused from here on.
                assert_eq!(unsafe { fns().ibv_destroy_qp.unwrap()(b) }, 0);
                assert!(drain(cq).is_empty());
                assert_eq!(to_state(a, IBV_QPS_ERR), 0);
                assert_eq!(
                    ids(&drain(cq)),
                    [(1, IBV_WC_WR_FLUSH_ERR), (2, IBV_WC_WR_FLUSH_ERR)]
                );
            } else {
                assert_eq!(
                    ids(&wcs),
                    [(1, IBV_WC_RETRY_EXC_ERR), (2, IBV_WC_WR_FLUSH_ERR)],
                    "{p:?} ({retry}, {timeout})"
                );
                assert_eq!(state(a), IBV_QPS_ERR);
            }
        }
    }
}

/// rxe S14: an RNR-waiting requester whose responder goes to ERR: retry_cnt 7 never
/// completes; Spec ends it with RETRY_EXC_ERR.
#[test]
fn s14_rnr_waiter_whose_responder_dies() {
    for p in PROFILES {
        let x = pair(p, IBV_QPT_RC, 16, 7); // retry_cnt 7, rnr_retry 7
        assert_eq!(
            post(x.a, &mut signaled_send(1, &mut [x.buf_a.sge(0, 8)])),
            0
        );
        assert_eq!(send_wrs_waiting(x.a), 1);
        assert_eq!(to_state(x.b, IBV_QPS_ERR), 0);
        match p {
            Spec => assert_eq!(ids(&drain(x.cq_a)), [(1, IBV_WC_RETRY_EXC_ERR)]),
            _ => {
                assert!(drain(x.cq_a).is_empty());
                assert_eq!(send_wrs_waiting(x.a), 1);
                assert_eq!(to_state(x.a, IBV_QPS_ERR), 0);
                assert_eq!(ids(&drain(x.cq_a)), [(1, IBV_WC_WR_FLUSH_ERR)]);
            }
        }
    }
}

/// rxe G12 / S3 / S4 / S19: depths rounded up to 2^k-1 (create echoes the request,
/// query_qp reports the rounded depth, which is what can be posted); CQs likewise, and
/// S5/S19: the returned inline size and SGE count follow the WQE size.
#[test]
fn g12_rounded_depths_and_caps() {
    let rounded = [
        (0, 0),
        (1, 1),
        (2, 3),
        (3, 3),
        (4, 7),
        (5, 7),
        (8, 15),
        (16, 31),
        (31, 31),
        (32, 63),
    ];
    for p in PROFILES {
        let dev = Dev::with_profile(p);
        let cq = dev.cq(64);
        for (req, rxe) in rounded {
            let mut init = ibv_qp_init_attr {
                send_cq: cq,
                recv_cq: cq,
                qp_type: IBV_QPT_RC,
                cap: ibv_qp_cap {
                    max_send_wr: req,
                    max_recv_wr: req,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                ..Default::default()
            };
            let qp = create_qp(dev.pd, &mut init);
            assert!(!qp.is_null());
            assert_eq!(
                (init.cap.max_send_wr, init.cap.max_recv_wr),
                (req, req),
                "echo"
            );
            let mut a = ibv_qp_attr::default();
            let mut qi = ibv_qp_init_attr::default();
            assert_eq!(query_qp(qp, &mut a, IBV_QP_CAP, &mut qi), 0);
            let want = if p == Spec { req } else { rxe };
            assert_eq!(
                (a.cap.max_send_wr, a.cap.max_recv_wr),
                (want, want),
                "{p:?} {req}"
            );
            assert_eq!(qi.cap.max_send_wr, want);
            // S19 1,1,1,1,0 -> inline 16 on rxe.
            let inl = if p == Spec { 0 } else { 16 };
            assert_eq!(init.cap.max_inline_data, inl);
            assert_eq!(a.cap.max_inline_data, inl);
        }
        // S19: (ssge, inline) requested -> returned.
        for ((ssge, inl), rxe) in [
            ((2, 64), (4, 64)),
            ((1, 17), (1, 17)),
            ((1, 100), (6, 100)),
            ((3, 0), (3, 48)),
            ((1, 512), (32, 512)),
        ] {
            let mut init = ibv_qp_init_attr {
                send_cq: cq,
                recv_cq: cq,
                qp_type: IBV_QPT_RC,
                cap: ibv_qp_cap {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: ssge,
                    max_recv_sge: 2,
                    max_inline_data: inl,
                },
                ..Default::default()
            };
            assert!(!create_qp(dev.pd, &mut init).is_null());
            let got = (init.cap.max_send_sge, init.cap.max_inline_data);
            let want = if p == Spec { (ssge, inl) } else { rxe };
            assert_eq!(got, want, "{p:?} ssge {ssge} inline {inl}");
        }
        // CQs: create_cq(4) -> 7, resize 16 -> 31, 1 -> 1; 32768 -> EINVAL either way.
        let c = dev.cq(4);
        // SAFETY: c is live.
        let cqe = |c: *mut ibv_cq| unsafe { (*c).cqe };
        assert_eq!(cqe(c), if p == Spec { 4 } else { 7 });
        // SAFETY: c is live and empty.
        let resize = |n| unsafe { fns().ibv_resize_cq.unwrap()(c, n) };
        assert_eq!(resize(16), 0);
        assert_eq!(cqe(c), if p == Spec { 16 } else { 31 });
        assert_eq!(resize(1), 0);
        assert_eq!(cqe(c), 1);
        // SAFETY: a live context.
        let big =
            unsafe { fns().ibv_create_cq.unwrap()(dev.ctx, 32768, null_mut(), null_mut(), 0) };
        assert!(big.is_null());
        let c100 = dev.cq(100);
        assert_eq!(cqe(c100), if p == Spec { 100 } else { 127 });
    }
}

/// rxe S3 / S4: the usable SQ and RQ capacity is the rounded depth (requested 4 -> 7),
/// measured against a requester whose WRs are never acknowledged.
#[test]
fn s3_s4_usable_capacity() {
    for p in PROFILES {
        let dev = Dev::with_profile(p);
        let cq = dev.cq(256);
        let a = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
        let b = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
        connect_retry(a, dev.ctx, qpn(b), 7, 14); // b stays in RESET: no ACK ever
        let buf = dev.buf(64, ALL_ACCESS);
        let mut sge = [buf.sge(0, 8)];
        let mut wrs: Vec<ibv_send_wr> = (0..9)
            .map(|i| send_wr(i, IBV_WR_SEND, &mut sge, 0))
            .collect();
        let (rc, bad) = post_chain(a, &mut wrs);
        match p {
            // Spec: the first WR fails at once (RETRY_EXC_ERR), the QP is in ERR and the
            // rest flush; the SQ fills at the requested 4 (slots are freed by polling).
            Spec => assert_eq!((rc, bad), (libc::ENOMEM, Some(4))),
            // rxe S3: 7 slots, the 8th WR is refused (ENOMEM, errno 0).
            _ => {
                assert_eq!((rc, bad), (libc::ENOMEM, Some(7)));
                assert_eq!(send_wrs_waiting(a), 7);
            }
        }
        // RQ: rxe takes 7 separate receives on a depth-4 QP.
        let r = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
        to_init(r, ALL_ACCESS);
        let n_ok = (0..8)
            .take_while(|&i| post_recv(r, i, &mut [buf.sge(0, 8)]) == 0)
            .count();
        assert_eq!(n_ok, if p == Spec { 4 } else { 7 }, "{p:?}");
        assert_eq!(rq_outstanding(r), n_ok as u32);
    }
}

/// rxe S3: a slot is freed when the ACK arrives, polled or not, signaled or not; Spec
/// (as libmlx5) frees it only when a covering completion is polled. `sq_outstanding`
/// reports the same quantity in both profiles: posted WRs not yet released by a polled
/// completion.
#[test]
fn s3_slot_release_on_ack() {
    for p in PROFILES {
        let x = pair(p, IBV_QPT_RC, 1, 7); // SQ and RQ depth 1
        let mut sge = [x.buf_a.sge(0, 8)];
        let send = |wr: &mut ibv_send_wr| {
            assert_eq!(post_recv(x.b, wr.wr_id, &mut [x.buf_b.sge(0, 64)]), 0);
            post(x.a, wr)
        };
        assert_eq!(send(&mut send_wr(1, IBV_WR_SEND, &mut sge, 0)), 0);
        let rc = send(&mut send_wr(2, IBV_WR_SEND, &mut sge, 0));
        assert_eq!(rc, if p == Spec { libc::ENOMEM } else { 0 }, "{p:?}");
        assert_eq!(sq_outstanding(x.a), if p == Spec { 1 } else { 2 });
        if p == Rxe {
            assert_eq!(send(&mut signaled_send(3, &mut sge)), 0);
            assert_eq!(sq_outstanding(x.a), 3);
            assert_eq!(ids(&drain(x.cq_a)), [(3, 0)]);
            assert_eq!(
                sq_outstanding(x.a),
                0,
                "the polled completion covers all three"
            );
        }
    }
}

/// rxe S5: IBV_SEND_INLINE on an RDMA READ: size-checked at post (cap + 1 -> EINVAL),
/// then LOC_PROT_ERR with the local buffer untouched, requester ERR, responder RTS. Spec
/// ignores the flag on READ.
#[test]
fn s5_inline_read() {
    for p in PROFILES {
        let mut x = pair(p, IBV_QPT_RC, 16, 7);
        x.buf_b.fill(0, &[0xab; 16]);
        let mut big = [x.buf_a.sge(0, 65)];
        let mut wr = rdma(
            send_wr(
                1,
                IBV_WR_RDMA_READ,
                &mut big,
                IBV_SEND_SIGNALED | IBV_SEND_INLINE,
            ),
            x.buf_b.addr(),
            x.buf_b.rkey(),
        );
        let rc = post(x.a, &mut wr);
        let mut sge = [x.buf_a.sge(0, 16)];
        let mut wr = rdma(
            send_wr(
                2,
                IBV_WR_RDMA_READ,
                &mut sge,
                IBV_SEND_SIGNALED | IBV_SEND_INLINE,
            ),
            x.buf_b.addr(),
            x.buf_b.rkey(),
        );
        assert_eq!(post(x.a, &mut wr), 0);
        let wcs = drain(x.cq_a);
        match p {
            Spec => {
                assert_eq!(rc, 0);
                assert_eq!(ids(&wcs), [(1, 0), (2, 0)]);
                assert_eq!(x.buf_a.bytes(0, 16), [0xab; 16]);
            }
            _ => {
                assert_eq!(rc, libc::EINVAL, "rxe S5: READ + INLINE beyond the cap");
                assert_eq!(ids(&wcs), [(2, IBV_WC_LOC_PROT_ERR)]);
                assert_eq!(x.buf_a.bytes(0, 16), [0; 16], "local buffer untouched");
                assert_eq!((state(x.a), state(x.b)), (IBV_QPS_ERR, IBV_QPS_RTS));
            }
        }
    }
}

/// rxe S7: a gather-side bad lkey gives LOC_QP_OP_ERR (Spec: LOC_PROT_ERR); a READ into a
/// bad lkey is LOC_PROT_ERR in both.
#[test]
fn s7_bad_lkey() {
    for p in PROFILES {
        for (op, want_rxe) in [
            (IBV_WR_SEND, IBV_WC_LOC_QP_OP_ERR),
            (IBV_WR_RDMA_WRITE, IBV_WC_LOC_QP_OP_ERR),
            (IBV_WR_RDMA_READ, IBV_WC_LOC_PROT_ERR),
        ] {
            let x = pair(p, IBV_QPT_RC, 16, 7);
            assert_eq!(post_recv(x.b, 9, &mut [x.buf_b.sge(0, 64)]), 0);
            let mut sge = [ibv_sge {
                addr: x.buf_a.addr(),
                length: 8,
                lkey: 0x1234_5678,
            }];
            let mut wr = rdma(send_wr(1, op, &mut sge, 0), x.buf_b.addr(), x.buf_b.rkey());
            assert_eq!(post(x.a, &mut wr), 0);
            let want = if p == Spec {
                IBV_WC_LOC_PROT_ERR
            } else {
                want_rxe
            };
            assert_eq!(ids(&drain(x.cq_a)), [(1, want)], "{p:?} op {op}");
            assert_eq!((state(x.a), state(x.b)), (IBV_QPS_ERR, IBV_QPS_RTS));
            assert!(drain(x.cq_b).is_empty());
        }
    }
}

/// rxe S10: a FETCH_ADD with a bad local lkey: rxe executes the remote add, then fails the
/// WR with LOC_PROT_ERR; Spec fails it before touching the remote word.
#[test]
fn s10_atomic_with_bad_local_lkey() {
    for p in PROFILES {
        let mut x = pair(p, IBV_QPT_RC, 16, 7);
        x.buf_b.fill(0, &5u64.to_ne_bytes());
        let mut sge = [ibv_sge {
            addr: x.buf_a.addr(),
            length: 8,
            lkey: 0x1234_5678,
        }];
        let mut wr = atomic(
            send_wr(1, IBV_WR_ATOMIC_FETCH_AND_ADD, &mut sge, 0),
            x.buf_b.addr(),
            x.buf_b.rkey(),
            3,
            0,
        );
        assert_eq!(post(x.a, &mut wr), 0);
        assert_eq!(ids(&drain(x.cq_a)), [(1, IBV_WC_LOC_PROT_ERR)]);
        assert_eq!((state(x.a), state(x.b)), (IBV_QPS_ERR, IBV_QPS_RTS));
        let remote = u64::from_ne_bytes(x.buf_b.bytes(0, 8).try_into().unwrap());
        assert_eq!(remote, if p == Spec { 5 } else { 8 }, "{p:?}");
        assert_eq!(x.buf_a.bytes(0, 8), [0; 8]);
    }
}

/// rxe S8: a receive buffer without LOCAL_WRITE: sender REM_OP_ERR, receiver
/// LOC_QP_OP_ERR (Spec: LOC_PROT_ERR), both ERR; an SGE of 0x80000000 bytes:
/// LOC_QP_OP_ERR (Spec: LOC_PROT_ERR, outside the MR).
#[test]
fn s8_receive_buffer_not_writable_and_huge_sge() {
    for p in PROFILES {
        let x = pair(p, IBV_QPT_RC, 16, 7);
        let ro = x.dev.buf(64, 0);
        assert_eq!(post_recv(x.b, 9, &mut [ro.sge(0, 64)]), 0);
        assert_eq!(
            post(
                x.a,
                &mut send_wr(1, IBV_WR_SEND, &mut [x.buf_a.sge(0, 8)], 0)
            ),
            0
        );
        assert_eq!(ids(&drain(x.cq_a)), [(1, IBV_WC_REM_OP_ERR)]);
        let want_b = if p == Spec {
            IBV_WC_LOC_PROT_ERR
        } else {
            IBV_WC_LOC_QP_OP_ERR
        };
        assert_eq!(ids(&drain(x.cq_b)), [(9, want_b)], "{p:?}");
        assert_eq!((state(x.a), state(x.b)), (IBV_QPS_ERR, IBV_QPS_ERR));

        let y = pair(p, IBV_QPT_RC, 16, 7);
        assert_eq!(post_recv(y.b, 9, &mut [y.buf_b.sge(0, 64)]), 0);
        let mut sge = [ibv_sge {
            length: 0x8000_0000,
            ..y.buf_a.sge(0, 0)
        }];
        assert_eq!(post(y.a, &mut send_wr(1, IBV_WR_SEND, &mut sge, 0)), 0);
        let want = if p == Spec {
            IBV_WC_LOC_PROT_ERR
        } else {
            IBV_WC_LOC_QP_OP_ERR
        };
        assert_eq!(ids(&drain(y.cq_a)), [(1, want)], "{p:?}");
        assert!(drain(y.cq_b).is_empty());
        assert_eq!((state(y.a), state(y.b)), (IBV_QPS_ERR, IBV_QPS_RTS));
    }
}

/// rxe S11: a SEND larger than the receive buffer: sender REM_OP_ERR, receiver
/// LOC_QP_OP_ERR, both ERR, and the packets (path MTU 1024) that fit whole are written;
/// Spec: REM_INV_REQ_ERR / LOC_LEN_ERR, nothing written.
#[test]
fn s11_send_longer_than_the_receive() {
    for (len, room, written) in [(3000, 2048, 2048), (64, 16, 0)] {
        for p in PROFILES {
            let mut x = pair(p, IBV_QPT_RC, 16, 7);
            x.buf_a.fill(0, &vec![0x5a; len]);
            assert_eq!(post_recv(x.b, 9, &mut [x.buf_b.sge(0, room)]), 0);
            assert_eq!(post_recv(x.b, 10, &mut [x.buf_b.sge(0, room)]), 0);
            let mut sge = [x.buf_a.sge(0, len as u32)];
            assert_eq!(post(x.a, &mut send_wr(1, IBV_WR_SEND, &mut sge, 0)), 0);
            let (sa, sb) = match p {
                Spec => (IBV_WC_REM_INV_REQ_ERR, IBV_WC_LOC_LEN_ERR),
                _ => (IBV_WC_REM_OP_ERR, IBV_WC_LOC_QP_OP_ERR),
            };
            assert_eq!(ids(&drain(x.cq_a)), [(1, sa)], "{p:?}");
            assert_eq!(ids(&drain(x.cq_b)), [(9, sb), (10, IBV_WC_WR_FLUSH_ERR)]);
            assert_eq!((state(x.a), state(x.b)), (IBV_QPS_ERR, IBV_QPS_ERR));
            let n = if p == Spec { 0 } else { written };
            let got = x.buf_b.bytes(0, room as usize);
            assert!(got[..n].iter().all(|&b| b == 0x5a), "{p:?} prefix");
            assert!(
                got[n..].iter().all(|&b| b == 0),
                "{p:?} {len} into {room}: {n} written"
            );
        }
    }
}

/// rxe S18: a UD message into a too-short receive: LOC_QP_OP_ERR (Spec: LOC_LEN_ERR), the
/// UD QP goes to ERR in both.
#[test]
fn s18_short_ud_receive() {
    for p in PROFILES {
        let x = pair(p, IBV_QPT_UD, 16, 7);
        assert_eq!(post_recv(x.b, 9, &mut [x.buf_b.sge(0, 64)]), 0);
        let mut ah_attr = ibv_ah_attr {
            is_global: 1,
            port_num: 1,
            ..Default::default()
        };
        ah_attr.grh.dgid = gid(x.dev.ctx, 1);
        ah_attr.grh.sgid_index = 1;
        let ah = create_ah(x.dev.pd, &mut ah_attr);
        assert!(!ah.is_null());
        let mut sge = [x.buf_a.sge(0, 100)];
        let mut wr = send_wr(1, IBV_WR_SEND, &mut sge, IBV_SEND_SIGNALED);
        wr.wr.ud.ah = ah;
        wr.wr.ud.remote_qpn = qpn(x.b);
        wr.wr.ud.remote_qkey = 0x1111;
        assert_eq!(post(x.a, &mut wr), 0);
        assert_eq!(ids(&drain(x.cq_a)), [(1, 0)]);
        let want = if p == Spec {
            IBV_WC_LOC_LEN_ERR
        } else {
            IBV_WC_LOC_QP_OP_ERR
        };
        assert_eq!(ids(&drain(x.cq_b)), [(9, want)], "{p:?}");
        assert_eq!(state(x.b), IBV_QPS_ERR);
    }
}

/// rxe S15: send-CQ overflow drops the completion with one CQ_ERR each and the CQ stays
/// usable (poll never errors); Spec: the CQ enters the error state (-EOVERFLOW).
#[test]
fn s15_send_cq_overflow() {
    for p in PROFILES {
        let dev = Dev::with_profile(p);
        let cq_a = dev.cq(4);
        let cq_b = dev.cq(64);
        let a = dev.qp(IBV_QPT_RC, cq_a, cq_a, cap(16));
        let b = dev.qp(IBV_QPT_RC, cq_b, cq_b, cap(16));
        connect(a, dev.ctx, qpn(b), ALL_ACCESS, 7);
        connect(b, dev.ctx, qpn(a), ALL_ACCESS, 7);
        let buf_a = dev.buf(64, ALL_ACCESS);
        let buf_b = dev.buf(64, ALL_ACCESS);
        let mut sge = [buf_a.sge(0, 8)];
        let mut wc = [ibv_wc::default(); 16];
        match p {
            Spec => {
                for i in 0..5 {
                    assert_eq!(post_recv(b, i, &mut [buf_b.sge(0, 8)]), 0);
                    assert_eq!(post(a, &mut signaled_send(i, &mut sge)), 0);
                }
                assert_eq!(poll(cq_a, &mut wc), -libc::EOVERFLOW);
                assert_eq!(events(dev.ctx), [IBV_EVENT_CQ_ERR]);
            }
            _ => {
                for i in 0..12 {
                    assert_eq!(post_recv(b, i, &mut [buf_b.sge(0, 8)]), 0);
                    assert_eq!(post(a, &mut signaled_send(i, &mut sge)), 0);
                }
                assert_eq!(drain(cq_b).len(), 12, "B got all 12");
                assert_eq!(events(dev.ctx), [IBV_EVENT_CQ_ERR; 5]);
                let got = drain(cq_a);
                assert_eq!(ids(&got), (0..7).map(|i| (i, 0)).collect::<Vec<_>>());
                assert_eq!((state(a), state(b)), (IBV_QPS_RTS, IBV_QPS_RTS));
                // Usable afterwards.
                assert_eq!(post_recv(b, 20, &mut [buf_b.sge(0, 8)]), 0);
                assert_eq!(post(a, &mut signaled_send(20, &mut sge)), 0);
                assert_eq!(ids(&drain(cq_a)), [(20, 0)]);
            }
        }
    }
}

/// rxe S15: a receive completion lost to a full CQ moves the responder to ERR without an
/// ACK: the requester (retry_cnt < 7) gets RETRY_EXC_ERR; the responder's flushes are
/// lost too (one CQ_ERR each). Spec: the receive CQ enters the error state, the message
/// counts as delivered.
#[test]
fn s15_receive_cq_overflow() {
    for p in PROFILES {
        let dev = Dev::with_profile(p);
        let cq_a = dev.cq(64);
        let cq_b = dev.cq(4);
        let a = dev.qp(IBV_QPT_RC, cq_a, cq_a, cap(16));
        let b = dev.qp(IBV_QPT_RC, cq_b, cq_b, cap(16));
        connect_retry(a, dev.ctx, qpn(b), 2, 14);
        connect(b, dev.ctx, qpn(a), ALL_ACCESS, 7);
        let buf_a = dev.buf(64, ALL_ACCESS);
        let buf_b = dev.buf(64, ALL_ACCESS);
        let cap_b = if p == Spec { 4 } else { 7 };
        for i in 0..12 {
            assert_eq!(post_recv(b, 100 + i, &mut [buf_b.sge(0, 8)]), 0);
        }
        let mut sge = [buf_a.sge(0, 8)];
        for i in 0..cap_b + 1 {
            assert_eq!(post(a, &mut signaled_send(i, &mut sge)), 0);
        }
        let mut wc = [ibv_wc::default(); 16];
        match p {
            Spec => {
                assert_eq!(
                    ids(&drain(cq_a)),
                    (0..5).map(|i| (i, 0)).collect::<Vec<_>>()
                );
                assert_eq!(poll(cq_b, &mut wc), -libc::EOVERFLOW);
                assert_eq!(state(b), IBV_QPS_RTS);
                assert_eq!(events(dev.ctx), [IBV_EVENT_CQ_ERR]);
            }
            _ => {
                let mut want: Vec<(u64, u32)> = (0..7).map(|i| (i, 0)).collect();
                want.push((7, IBV_WC_RETRY_EXC_ERR));
                assert_eq!(ids(&drain(cq_a)), want);
                assert_eq!((state(a), state(b)), (IBV_QPS_ERR, IBV_QPS_ERR));
                // 1 for the message + 4 failed flushes of B's remaining receives.
                assert_eq!(events(dev.ctx), [IBV_EVENT_CQ_ERR; 5]);
                assert_eq!(
                    ids(&drain(cq_b)),
                    (100..107).map(|i| (i, 0)).collect::<Vec<_>>()
                );
                assert_eq!(rq_outstanding(b), 0, "lost for good");
                assert_eq!(to_state(b, IBV_QPS_ERR), 0);
                assert!(drain(cq_b).is_empty());
            }
        }
    }
}

/// The `inject_cq_overflow` hook: Spec -> the CQ's error state; Rxe -> n completions
/// dropped with a CQ_ERR each, the CQ keeps working.
#[test]
fn inject_cq_overflow_hook() {
    for p in PROFILES {
        let x = pair(p, IBV_QPT_RC, 16, 7);
        for i in 0..4 {
            assert_eq!(post_recv(x.b, i, &mut [x.buf_b.sge(0, 8)]), 0);
        }
        let mut sge = [x.buf_a.sge(0, 8)];
        assert_eq!(post(x.a, &mut signaled_send(0, &mut sge)), 0);
        inject_cq_overflow(x.cq_a, 2);
        for i in 1..4 {
            assert_eq!(post(x.a, &mut signaled_send(i, &mut sge)), 0);
        }
        let mut wc = [ibv_wc::default(); 16];
        match p {
            Spec => {
                assert_eq!(poll(x.cq_a, &mut wc), -libc::EOVERFLOW);
                assert_eq!(events(x.dev.ctx), [IBV_EVENT_CQ_ERR]);
            }
            _ => {
                assert_eq!(ids(&drain(x.cq_a)), [(0, 0), (3, 0)]);
                assert_eq!(events(x.dev.ctx), [IBV_EVENT_CQ_ERR; 2]);
                assert_eq!(state(x.a), IBV_QPS_RTS);
            }
        }
    }
}

/// rxe S17: WRITE_WITH_IMM with no receive and rnr_retry 0: RNR_RETRY_EXC_ERR, and every
/// packet before the last (path MTU 1024) was written (3000 B -> 2048; 100 B -> 0). Spec
/// writes nothing.
#[test]
fn s17_write_with_imm_without_receive() {
    for (len, written) in [(3000, 2048), (100, 0)] {
        for p in PROFILES {
            let mut x = pair(p, IBV_QPT_RC, 16, 0);
            x.buf_a.fill(0, &vec![0x77; len]);
            let mut sge = [x.buf_a.sge(0, len as u32)];
            let mut wr = rdma(
                send_wr(1, IBV_WR_RDMA_WRITE_WITH_IMM, &mut sge, 0),
                x.buf_b.addr(),
                x.buf_b.rkey(),
            );
            assert_eq!(post(x.a, &mut wr), 0);
            assert_eq!(ids(&drain(x.cq_a)), [(1, IBV_WC_RNR_RETRY_EXC_ERR)]);
            assert!(drain(x.cq_b).is_empty());
            assert_eq!(state(x.b), IBV_QPS_RTS);
            let n = if p == Spec { 0 } else { written };
            let got = x.buf_b.bytes(0, len);
            assert!(got[..n].iter().all(|&b| b == 0x77), "{p:?}");
            assert!(
                got[n..].iter().all(|&b| b == 0),
                "{p:?}: {len} B, {n} written"
            );
        }
    }
}

/// rxe S21: SEND_WITH_INV with a bogus rkey: the sender succeeds, the receive completes
/// with REM_INV_REQ_ERR and the receiver goes to ERR. Spec (no memory windows) refuses
/// the opcode at execution: LOC_QP_OP_ERR, sender ERR.
#[test]
fn s21_send_with_inv() {
    for p in PROFILES {
        let x = pair(p, IBV_QPT_RC, 16, 7);
        assert_eq!(post_recv(x.b, 9, &mut [x.buf_b.sge(0, 64)]), 0);
        let mut sge = [x.buf_a.sge(0, 8)];
        let mut wr = send_wr(1, IBV_WR_SEND_WITH_INV, &mut sge, IBV_SEND_SIGNALED);
        wr.__bindgen_anon_1.invalidate_rkey = 0xdead_beef;
        assert_eq!(post(x.a, &mut wr), 0);
        match p {
            Spec => {
                assert_eq!(ids(&drain(x.cq_a)), [(1, IBV_WC_LOC_QP_OP_ERR)]);
                assert_eq!((state(x.a), state(x.b)), (IBV_QPS_ERR, IBV_QPS_RTS));
            }
            _ => {
                assert_eq!(ids(&drain(x.cq_a)), [(1, IBV_WC_SUCCESS)]);
                assert_eq!(ids(&drain(x.cq_b)), [(9, IBV_WC_REM_INV_REQ_ERR)]);
                assert_eq!((state(x.a), state(x.b)), (IBV_QPS_RTS, IBV_QPS_ERR));
            }
        }
    }
}

// ------------------------------------------------ issue 31: departures rxe0 showed

/// A UD pair on a device of profile `p` ([`Ud`]) and an AH to its own port's GID.
struct UdPair {
    u: Ud,
    ah: *mut ibv_ah,
}

impl std::ops::Deref for UdPair {
    type Target = Ud;
    fn deref(&self) -> &Ud {
        &self.u
    }
}

impl std::ops::DerefMut for UdPair {
    fn deref_mut(&mut self) -> &mut Ud {
        &mut self.u
    }
}

fn ud_pair(p: Profile) -> UdPair {
    let u = Ud::on(Dev::with_profile(p));
    let ah = ah_to(&u.dev, gid(u.dev.ctx, 1));
    UdPair { u, ah }
}

/// A signaled UD WR from `u.a` to `u.b` with Q_Key `qkey`.
fn ud_to_b(u: &UdPair, id: u64, sge: &mut [ibv_sge], qkey: u32, op: ibv_wr_opcode) -> ibv_send_wr {
    let mut wr = send_wr(id, op, sge, IBV_SEND_SIGNALED);
    wr.wr.ud.ah = u.ah;
    wr.wr.ud.remote_qpn = qpn(u.b);
    wr.wr.ud.remote_qkey = qkey;
    wr
}

/// The Q_Key `common::connect` gives UD QPs.
fn ud_qkey(qp: *mut ibv_qp) -> u32 {
    let mut attr = ibv_qp_attr::default();
    let mut init = ibv_qp_init_attr::default();
    assert_eq!(query_qp(qp, &mut attr, IBV_QP_QKEY, &mut init), 0);
    attr.qkey
}

/// D1: a remote Q_Key with the high bit set. IBA (Spec): the sending QP's own Q_Key is
/// used, so the datagram arrives; rxe sends the value as it is, which is not the target's
/// Q_Key: dropped, the receive still posted (flushed by the reset here).
#[test]
fn d1_remote_qkey_with_the_high_bit() {
    for p in PROFILES {
        let mut u = ud_pair(p);
        u.buf.fill(0, &[7; 16]);
        assert_eq!(post_recv(u.b, 1, &mut [u.buf.sge(1024, 256)]), 0);
        let mut sge = [u.buf.sge(0, 16)];
        let mut wr = ud_to_b(&u, 2, &mut sge, 0x8000_0000, IBV_WR_SEND);
        assert_eq!(post(u.a, &mut wr), 0);
        let wcs = drain(u.cq);
        let recv: Vec<_> = wcs.iter().filter(|w| w.opcode == IBV_WC_RECV).collect();
        match p {
            Spec => {
                assert_eq!(recv.len(), 1, "{p:?}");
                assert_eq!((recv[0].wr_id, recv[0].byte_len), (1, 56), "{p:?}");
            }
            _ => assert!(recv.is_empty(), "{p:?}: rxe drops it ({:?})", ids(&wcs)),
        }
        let sends: Vec<_> = wcs
            .iter()
            .filter(|w| w.opcode == IBV_WC_SEND)
            .copied()
            .collect();
        assert_eq!(
            ids(&sends),
            [(2, IBV_WC_SUCCESS)],
            "{p:?}: the sender succeeds"
        );
        // The QPs' own Q_Key is an ordinary one (the high bit is the WR's meaning only).
        assert_eq!(ud_qkey(u.a) & 0x8000_0000, 0);
    }
}

/// D2: an RC WRITE_WITH_IMM refused for access (a bad rkey, before the MR, across its end,
/// an MR without remote write), with a receive posted at the responder. Both profiles: the
/// requester gets REM_ACCESS_ERR. The responder's receive: flushed with the rest in Spec;
/// rxe completes it with REM_ACCESS_ERR itself, then flushes the rest.
#[test]
fn d2_refused_write_with_imm_and_the_responders_receive() {
    for p in PROFILES {
        for case in 0..4 {
            let mut x = pair(p, IBV_QPT_RC, 16, 7);
            let ro = x.dev.buf(256, IBV_ACCESS_LOCAL_WRITE);
            let (addr, rkey) = match case {
                0 => (x.buf_b.addr(), 0x1234_5600),
                1 => (x.buf_b.addr() - 64, x.buf_b.rkey()),
                2 => (x.buf_b.addr() + 4096 - 32, x.buf_b.rkey()),
                _ => (ro.addr(), ro.rkey()),
            };
            assert_eq!(post_recv(x.b, 50, &mut [x.buf_b.sge(0, 64)]), 0);
            assert_eq!(post_recv(x.b, 51, &mut [x.buf_b.sge(64, 64)]), 0);
            x.buf_a.fill(0, &[9; 64]);
            let mut sge = [x.buf_a.sge(0, 64)];
            let mut wr = rdma(
                send_wr(7, IBV_WR_RDMA_WRITE_WITH_IMM, &mut sge, IBV_SEND_SIGNALED),
                addr,
                rkey,
            );
            wr.__bindgen_anon_1.imm_data = 5u32.to_be();
            assert_eq!(post(x.a, &mut wr), 0);
            assert_eq!(
                ids(&drain(x.cq_a)),
                [(7, IBV_WC_REM_ACCESS_ERR)],
                "{p:?} {case}"
            );
            let first = match p {
                Spec => IBV_WC_WR_FLUSH_ERR,
                _ => IBV_WC_REM_ACCESS_ERR,
            };
            assert_eq!(
                ids(&drain(x.cq_b)),
                [(50, first), (51, IBV_WC_WR_FLUSH_ERR)],
                "{p:?} case {case}"
            );
            assert_eq!(state(x.b), IBV_QPS_ERR, "{p:?} {case}");
            assert_eq!(
                x.buf_b.bytes(0, 128),
                vec![0; 128],
                "{p:?} {case}: nothing written"
            );
        }
    }
}

/// D3: the IPv4 header in a UD receive's GRH area is the RoCE v2 packet's, in both
/// profiles: total length 20 (IPv4) + 8 (UDP) + 12 (BTH) + 8 (DETH) [+ 4 immediate] +
/// payload padded to 4 + 4 (ICRC), don't-fragment set; the checksum valid (Spec) or left
/// 0 (Rxe, as rxe0 leaves it).
#[test]
fn d3_the_grh_areas_ipv4_header_is_the_packets() {
    for p in PROFILES {
        for (len, with_imm) in [
            (1usize, false),
            (8, false),
            (100, false),
            (1, true),
            (8, true),
        ] {
            let u = ud_pair(p);
            assert_eq!(post_recv(u.b, 1, &mut [u.buf.sge(1024, 512)]), 0);
            let op = if with_imm {
                IBV_WR_SEND_WITH_IMM
            } else {
                IBV_WR_SEND
            };
            let mut sge = [u.buf.sge(0, len as u32)];
            let mut wr = ud_to_b(&u, 2, &mut sge, ud_qkey(u.b), op);
            assert_eq!(post(u.a, &mut wr), 0);
            let wcs = drain(u.cq);
            assert!(
                wcs.iter().any(|w| w.wr_id == 1 && w.status == 0),
                "{p:?} {:?}",
                ids(&wcs)
            );
            let ip = u.buf.bytes(1024 + 20, 20);
            let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
            let want = 52 + len.next_multiple_of(4) + if with_imm { 4 } else { 0 };
            assert_eq!(total, want, "{p:?} len {len} imm {with_imm}");
            assert_eq!(ip[6] & 0x40, 0x40, "{p:?}: don't fragment");
            let sum: u32 = ip
                .chunks(2)
                .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
                .sum();
            let folded = (sum & 0xffff) + (sum >> 16);
            if p == Spec {
                assert_eq!(folded, 0xffff, "{p:?}: the header checksum");
            } else {
                assert_eq!(ip[10..12], [0, 0], "{p:?}: rxe leaves the checksum 0");
            }
        }
    }
}

/// D4: a UD SEND of 16 bytes into a 41-byte receive (the GRH fits, the payload not). Spec:
/// LOC_LEN_ERR, nothing written (the man pages leave the buffer undefined after an error;
/// Spec writes nothing). rxe: LOC_QP_OP_ERR with the 40-byte GRH area written.
#[test]
fn d4_a_ud_receive_too_short_for_the_payload() {
    for p in PROFILES {
        let mut u = ud_pair(p);
        u.buf.fill(1024, &[0xee; 64]);
        assert_eq!(post_recv(u.b, 1, &mut [u.buf.sge(1024, 41)]), 0);
        let mut sge = [u.buf.sge(0, 16)];
        let mut wr = ud_to_b(&u, 2, &mut sge, ud_qkey(u.b), IBV_WR_SEND);
        assert_eq!(post(u.a, &mut wr), 0);
        let wcs = drain(u.cq);
        let (status, grh_written) = match p {
            Spec => (IBV_WC_LOC_LEN_ERR, false),
            _ => (IBV_WC_LOC_QP_OP_ERR, true),
        };
        assert!(
            wcs.iter().any(|w| w.wr_id == 1 && w.status == status),
            "{p:?} {:?}",
            ids(&wcs)
        );
        let area = u.buf.bytes(1024, 41);
        if grh_written {
            assert_eq!(area[..20], [0; 20], "{p:?}");
            assert_eq!(area[20], 0x45, "{p:?}: the IPv4 header");
        } else {
            assert_eq!(area, vec![0xee; 41], "{p:?}");
        }
        assert_eq!(area[40], 0xee, "{p:?}: no payload byte");
    }
}
