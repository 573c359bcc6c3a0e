//! Every failure of issue #3: post errors with bad_wr, local/remote protection, length,
//! RNR, flush accounting, CQ overflow, injected errors.
//!
//! These are the man-page (Spec profile) semantics, so every test runs on an explicitly
//! opened Spec device, whatever `HOTVERBS_SOFTNIC_PROFILE` says; `tests/profiles.rs`
//! checks each rxe departure side by side with its Spec equivalent.

mod common;
use common::*;

const SIG: u32 = IBV_SEND_SIGNALED;

fn write_wr(p: &Pair, id: u64, s: &mut [ibv_sge], flags: u32) -> ibv_send_wr {
    rdma(
        send_wr(id, IBV_WR_RDMA_WRITE, s, flags),
        p.buf_b.addr(),
        p.buf_b.rkey(),
    )
}

/// ibv_post_send(3) before RTS: EINVAL, bad_wr = the first WR, nothing queued (man page;
/// rxe S1 queues anyway).
#[test]
fn post_send_before_rts() {
    let dev = Dev::spec();
    let cq = dev.cq(16);
    let qp = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
    let buf = dev.buf(64, ALL_ACCESS);
    let mut s = [buf.sge(0, 8)];
    for step in 0..3 {
        let mut wrs = [
            send_wr(1, IBV_WR_SEND, &mut s, SIG),
            send_wr(2, IBV_WR_SEND, &mut s, SIG),
        ];
        assert_eq!(
            post_chain(qp, &mut wrs),
            (libc::EINVAL, Some(0)),
            "step {step}"
        );
        match step {
            0 => to_init(qp, ALL_ACCESS),
            1 => to_rtr(qp, dev.ctx, qpn(qp)),
            _ => {}
        }
    }
    // Once in RTS nothing from before shows up.
    to_rts(qp, 7);
    assert_eq!(sq_outstanding(qp), 0);
    assert!(drain(cq).is_empty());
}

/// post_recv: EINVAL in RESET; accepted in INIT and RTR (rxe S2).
#[test]
fn post_recv_by_state() {
    let dev = Dev::spec();
    let cq = dev.cq(16);
    let qp = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
    let buf = dev.buf(64, ALL_ACCESS);
    let mut s = [buf.sge(0, 8)];
    assert_eq!(post_recv(qp, 1, &mut s), libc::EINVAL);
    to_init(qp, ALL_ACCESS);
    assert_eq!(post_recv(qp, 2, &mut s), 0);
    to_rtr(qp, dev.ctx, qpn(qp));
    assert_eq!(post_recv(qp, 3, &mut s), 0);
    to_rts(qp, 7);
    // Both receives are consumed in order by loopback sends.
    let mut wrs = [
        send_wr(10, IBV_WR_SEND, &mut s, SIG),
        send_wr(11, IBV_WR_SEND, &mut s, SIG),
    ];
    assert_eq!(post_chain(qp, &mut wrs), (0, None));
    let w = drain(cq);
    let recvs: Vec<u64> = w
        .iter()
        .filter(|w| w.opcode == IBV_WC_RECV)
        .map(|w| w.wr_id)
        .collect();
    assert_eq!(recvs, vec![2, 3]);
}

/// SQ full: ENOMEM at the first WR beyond capacity; earlier ones posted and executed
/// (rxe S3). Unsignaled WRs keep their slots until a later signaled completion.
#[test]
fn sq_full_and_slot_release() {
    let p = Pair::spec_with(IBV_QPT_RC, 4, 7);
    let mut s = [p.buf_a.sge(0, 8)];
    let mut wrs: Vec<ibv_send_wr> = (0..6).map(|i| write_wr(&p, i, &mut s, 0)).collect();
    assert_eq!(post_chain(p.a, &mut wrs), (libc::ENOMEM, Some(4)));
    assert_eq!(sq_outstanding(p.a), 4);
    assert!(drain(p.cq_a).is_empty());
    let mut wr = write_wr(&p, 9, &mut s, SIG);
    assert_eq!(
        post(p.a, &mut wr),
        libc::ENOMEM,
        "still full: unsignaled WRs hold slots"
    );

    // Start over with 3 unsignaled + 1 signaled: the slots stay taken until the signaled
    // CQE is polled (as libmlx5 reclaims SQ space in poll_cq), then all 4 are free.
    let p = Pair::spec_with(IBV_QPT_RC, 4, 7);
    let mut s = [p.buf_a.sge(0, 8)];
    let mut wrs: Vec<ibv_send_wr> = (0..4)
        .map(|i| write_wr(&p, i, &mut s, if i == 3 { SIG } else { 0 }))
        .collect();
    assert_eq!(post_chain(p.a, &mut wrs), (0, None));
    assert_eq!(sq_outstanding(p.a), 4);
    let mut wr = write_wr(&p, 8, &mut s, SIG);
    assert_eq!(post(p.a, &mut wr), libc::ENOMEM, "not polled yet");
    assert_eq!(ids(&drain(p.cq_a)), vec![(3, 0)]);
    assert_eq!(sq_outstanding(p.a), 0);
    let mut wrs: Vec<ibv_send_wr> = (0..4).map(|i| write_wr(&p, i, &mut s, 0)).collect();
    assert_eq!(post_chain(p.a, &mut wrs), (0, None));
    // A completion polled after a reset releases nothing of the new epoch.
    let mut wr = write_wr(&p, 9, &mut s, SIG);
    let mut attr = ibv_qp_attr {
        qp_state: IBV_QPS_RESET,
        ..Default::default()
    };
    assert_eq!(modify(p.a, &mut attr, IBV_QP_STATE), 0);
    connect(p.a, p.dev.ctx, qpn(p.b), ALL_ACCESS, 7);
    assert_eq!(sq_outstanding(p.a), 0, "reset restarts SQ accounting");
    assert_eq!(post(p.a, &mut wr), 0);
    assert_eq!(modify(p.a, &mut attr, IBV_QP_STATE), 0);
    connect(p.a, p.dev.ctx, qpn(p.b), ALL_ACCESS, 7);
    let mut wrs: Vec<ibv_send_wr> = (0..3).map(|i| write_wr(&p, 20 + i, &mut s, 0)).collect();
    assert_eq!(post_chain(p.a, &mut wrs), (0, None));
    assert_eq!(
        ids(&drain(p.cq_a)),
        vec![(9, 0)],
        "the stale completion is still delivered"
    );
    assert_eq!(
        sq_outstanding(p.a),
        3,
        "but released nothing of the new epoch"
    );
}

/// modify(ERR) / inject_qp_error after unsignaled WRs that already executed: they are done,
/// no flush names them (rxe S13/S14, mlx5); their slots stay taken until a reset.
#[test]
fn executed_unsignaled_are_not_flushed() {
    let p = Pair::spec_with(IBV_QPT_RC, 8, 7);
    let mut s = [p.buf_a.sge(0, 8)];
    let mut wrs: Vec<ibv_send_wr> = (0..5)
        .map(|i| write_wr(&p, i, &mut s, if i == 1 { SIG } else { 0 }))
        .collect();
    assert_eq!(post_chain(p.a, &mut wrs), (0, None));
    inject_qp_error(p.a);
    assert_eq!(ids(&drain(p.cq_a)), vec![(1, 0)]);
    assert_eq!(sq_outstanding(p.a), 3);
    let mut attr = ibv_qp_attr {
        qp_state: IBV_QPS_RESET,
        ..Default::default()
    };
    assert_eq!(modify(p.a, &mut attr, IBV_QP_STATE), 0);
    assert_eq!(sq_outstanding(p.a), 0);
}

/// RQ full: ENOMEM with bad_wr at the first WR beyond capacity (rxe S4); too many SGEs:
/// EINVAL.
#[test]
fn rq_full_and_sge_limits() {
    let p = Pair::spec_with(IBV_QPT_RC, 2, 7);
    let mut s = [p.buf_b.sge(0, 8)];
    assert_eq!(post_recv(p.b, 1, &mut s), 0);
    assert_eq!(post_recv(p.b, 2, &mut s), 0);
    assert_eq!(post_recv(p.b, 3, &mut s), libc::ENOMEM);
    let mut five = [p.buf_b.sge(0, 1); 5];
    assert_eq!(post_recv(p.a, 4, &mut five), libc::EINVAL);
    // num_sge > max_send_sge in the middle of a chain: bad_wr = that WR, WR0 executed.
    let mut ok = [p.buf_a.sge(0, 8)];
    let mut bad = [p.buf_a.sge(0, 1); 5];
    let mut wrs = [
        write_wr(&p, 1, &mut ok, SIG),
        write_wr(&p, 2, &mut bad, SIG),
        write_wr(&p, 3, &mut ok, SIG),
    ];
    assert_eq!(post_chain(p.a, &mut wrs), (libc::EINVAL, Some(1)));
    assert_eq!(ids(&drain(p.cq_a)), vec![(1, 0)]);
    assert_eq!(state(p.a), IBV_QPS_RTS);
}

/// Inline above max_inline_data: EINVAL, bad_wr at that WR, QP stays RTS (rxe S5).
#[test]
fn inline_too_big() {
    let p = Pair::spec(IBV_QPT_RC); // max_inline_data 64
    let mut data = [0u8; 65];
    let mut ok = [ibv_sge {
        addr: data.as_mut_ptr() as u64,
        length: 64,
        lkey: 0,
    }];
    let mut big = [ibv_sge {
        addr: data.as_mut_ptr() as u64,
        length: 65,
        lkey: 0,
    }];
    let f = SIG | IBV_SEND_INLINE;
    let mut wrs = [
        write_wr(&p, 1, &mut ok, f),
        write_wr(&p, 2, &mut big, f),
        write_wr(&p, 3, &mut ok, f),
    ];
    assert_eq!(post_chain(p.a, &mut wrs), (libc::EINVAL, Some(1)));
    assert_eq!(ids(&drain(p.cq_a)), vec![(1, 0)]);
    assert_eq!(state(p.a), IBV_QPS_RTS);
}

/// Atomics: misaligned remote address or a short local SGE -> EINVAL at post (rxe S10).
#[test]
fn atomic_post_checks() {
    let p = Pair::spec(IBV_QPT_RC);
    let mut s8 = [p.buf_a.sge(0, 8)];
    let mut s4 = [p.buf_a.sge(0, 4)];
    let mut wr = atomic(
        send_wr(1, IBV_WR_ATOMIC_FETCH_AND_ADD, &mut s8, SIG),
        p.buf_b.addr() + 4,
        p.buf_b.rkey(),
        1,
        0,
    );
    assert_eq!(post(p.a, &mut wr), libc::EINVAL);
    let mut wr = atomic(
        send_wr(2, IBV_WR_ATOMIC_CMP_AND_SWP, &mut s4, SIG),
        p.buf_b.addr(),
        p.buf_b.rkey(),
        1,
        0,
    );
    assert_eq!(post(p.a, &mut wr), libc::EINVAL);
    assert!(drain(p.cq_a).is_empty());
    // A device without atomics rejects them.
    let ctx = hotverbs_softnic::open_device(hotverbs_softnic::Config {
        atomics: false,
        profile: hotverbs_softnic::Profile::Spec,
        ..Default::default()
    });
    let mut attr = ibv_device_attr::default();
    assert_eq!(
        // SAFETY: ctx was just opened; attr is a valid out-parameter.
        unsafe { fns().ibv_query_device.unwrap()(ctx, &mut attr) },
        0
    );
    assert_eq!(attr.atomic_cap, IBV_ATOMIC_NONE);
    let d = Dev::with_ctx(ctx);
    let cq = d.cq(4);
    let qp = d.qp(IBV_QPT_RC, cq, cq, cap(4));
    connect(qp, ctx, qpn(qp), ALL_ACCESS, 7);
    let b = d.buf(64, ALL_ACCESS);
    let mut s = [b.sge(0, 8)];
    let mut wr = atomic(
        send_wr(3, IBV_WR_ATOMIC_FETCH_AND_ADD, &mut s, SIG),
        b.addr() + 8,
        b.rkey(),
        1,
        0,
    );
    assert_eq!(post(qp, &mut wr), libc::EINVAL);
}

/// Bad lkey / SGE outside its MR / deregistered MR -> LOC_PROT_ERR, requester to ERR,
/// responder untouched.
#[test]
fn local_protection() {
    for case in 0..4 {
        let p = Pair::spec(IBV_QPT_RC);
        let mut r = [p.buf_b.sge(0, 64)];
        assert_eq!(post_recv(p.b, 50, &mut r), 0);
        let mut s = match case {
            0 => [ibv_sge {
                addr: p.buf_a.addr(),
                length: 8,
                lkey: 0x1234_5678,
            }],
            1 => [p.buf_a.sge(4090, 8)],
            2 => [ibv_sge {
                addr: p.buf_a.addr() - 8,
                length: 16,
                lkey: p.buf_a.lkey(),
            }],
            _ => {
                let b = p.dev.buf(64, ALL_ACCESS);
                let s = b.sge(0, 8);
                // SAFETY: b.mr is live and deregistered once; b is only used for the
                // stale SGE afterwards, which is the point of the test.
                assert_eq!(unsafe { fns().ibv_dereg_mr.unwrap()(b.mr) }, 0);
                [s]
            }
        };
        let mut wr = send_wr(1, IBV_WR_SEND, &mut s, 0);
        assert_eq!(post(p.a, &mut wr), 0);
        assert_eq!(
            ids(&drain(p.cq_a)),
            vec![(1, IBV_WC_LOC_PROT_ERR)],
            "case {case}"
        );
        assert_eq!(state(p.a), IBV_QPS_ERR);
        assert_eq!(state(p.b), IBV_QPS_RTS);
        assert!(drain(p.cq_b).is_empty());
    }
    // READ into an MR without LOCAL_WRITE.
    let p = Pair::spec(IBV_QPT_RC);
    let ro = p.dev.buf(64, IBV_ACCESS_REMOTE_READ);
    let mut s = [ro.sge(0, 8)];
    let mut wr = rdma(
        send_wr(2, IBV_WR_RDMA_READ, &mut s, SIG),
        p.buf_b.addr(),
        p.buf_b.rkey(),
    );
    assert_eq!(post(p.a, &mut wr), 0);
    assert_eq!(ids(&drain(p.cq_a)), vec![(2, IBV_WC_LOC_PROT_ERR)]);
}

/// Remote errors: bad rkey, out of bounds, MR without the right -> REM_ACCESS_ERR; QP
/// without the right -> REM_INV_REQ_ERR. Nothing written; both QPs in ERR (rxe S9/S10).
#[test]
fn remote_access() {
    for case in 0..6 {
        let p = Pair::spec(IBV_QPT_RC);
        let mut r = [p.buf_b.sge(0, 64)];
        assert_eq!(post_recv(p.b, 50, &mut r), 0);
        let lw = p.dev.buf(64, IBV_ACCESS_LOCAL_WRITE);
        let mut s = [p.buf_a.sge(0, 64)];
        let (op, addr, rkey, expect) = match case {
            0 => (
                IBV_WR_RDMA_WRITE,
                p.buf_b.addr(),
                0x1234_5678,
                IBV_WC_REM_ACCESS_ERR,
            ),
            1 => (
                IBV_WR_RDMA_WRITE,
                p.buf_b.addr() + 4090,
                p.buf_b.rkey(),
                IBV_WC_REM_ACCESS_ERR,
            ),
            2 => (
                IBV_WR_RDMA_WRITE,
                lw.addr(),
                lw.rkey(),
                IBV_WC_REM_ACCESS_ERR,
            ),
            3 => (
                IBV_WR_RDMA_READ,
                lw.addr(),
                lw.rkey(),
                IBV_WC_REM_ACCESS_ERR,
            ),
            4 => (
                IBV_WR_RDMA_READ,
                p.buf_b.addr() - 8,
                p.buf_b.rkey(),
                IBV_WC_REM_ACCESS_ERR,
            ),
            _ => (
                IBV_WR_ATOMIC_FETCH_AND_ADD,
                p.buf_b.addr(),
                0x1234_5678,
                IBV_WC_REM_ACCESS_ERR,
            ),
        };
        let wr = send_wr(1, op, &mut s, 0);
        let mut wr = if op == IBV_WR_ATOMIC_FETCH_AND_ADD {
            atomic(wr, addr, rkey, 1, 0)
        } else {
            rdma(wr, addr, rkey)
        };
        assert_eq!(post(p.a, &mut wr), 0);
        assert_eq!(drain(p.cq_a)[0].status, expect, "case {case}");
        assert_eq!(state(p.a), IBV_QPS_ERR);
        assert_eq!(state(p.b), IBV_QPS_ERR);
        assert_eq!(ids(&drain(p.cq_b)), vec![(50, IBV_WC_WR_FLUSH_ERR)]);
        assert_eq!(lw.bytes(0, 64), vec![0u8; 64]);
        let ev = all_async_events(p.dev.ctx);
        assert!(
            ev.contains(&(IBV_EVENT_QP_ACCESS_ERR, p.b as usize)),
            "{ev:?}"
        );
        assert!(ev.contains(&(IBV_EVENT_QP_FATAL, p.a as usize)), "{ev:?}");
    }
    // Responder QP access flags lack the right -> REM_INV_REQ_ERR.
    for (op, access) in [
        (
            IBV_WR_RDMA_WRITE,
            IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
        ),
        (IBV_WR_RDMA_READ, IBV_ACCESS_REMOTE_WRITE),
        (IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_ACCESS_REMOTE_READ),
    ] {
        let dev = Dev::spec();
        let cq = dev.cq(16);
        let a = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
        let b = dev.qp(IBV_QPT_RC, cq, cq, cap(4));
        connect(a, dev.ctx, qpn(b), ALL_ACCESS, 7);
        connect(b, dev.ctx, qpn(a), access, 7);
        let buf = dev.buf(64, ALL_ACCESS);
        let mut s = [buf.sge(0, 8)];
        let mut wr = if op == IBV_WR_ATOMIC_FETCH_AND_ADD {
            atomic(send_wr(1, op, &mut s, 0), buf.addr() + 16, buf.rkey(), 1, 0)
        } else {
            rdma(send_wr(1, op, &mut s, 0), buf.addr() + 16, buf.rkey())
        };
        assert_eq!(post(a, &mut wr), 0);
        assert_eq!(
            ids(&drain(cq)),
            vec![(1, IBV_WC_REM_INV_REQ_ERR)],
            "op {op}"
        );
        assert_eq!(state(b), IBV_QPS_ERR);
        let ev = all_async_events(dev.ctx);
        assert!(ev.contains(&(IBV_EVENT_QP_REQ_ERR, b as usize)), "{ev:?}");
    }
}

/// Receive buffer too small: LOC_LEN_ERR at the receiver, REM_INV_REQ_ERR at the sender,
/// nothing written; a receive buffer without LOCAL_WRITE: LOC_PROT_ERR / REM_OP_ERR.
#[test]
fn receive_too_small_and_unwritable() {
    let mut p = Pair::spec(IBV_QPT_RC);
    let mut r = [p.buf_b.sge(0, 16)];
    assert_eq!(post_recv(p.b, 1, &mut r), 0);
    assert_eq!(post_recv(p.b, 2, &mut r), 0);
    let mut s = [p.buf_a.sge(0, 64)];
    let mut wr = send_wr(3, IBV_WR_SEND, &mut s, SIG);
    p.buf_a.fill(0, &[0xee; 64]);
    assert_eq!(post(p.a, &mut wr), 0);
    assert_eq!(ids(&drain(p.cq_a)), vec![(3, IBV_WC_REM_INV_REQ_ERR)]);
    assert_eq!(
        ids(&drain(p.cq_b)),
        vec![(1, IBV_WC_LOC_LEN_ERR), (2, IBV_WC_WR_FLUSH_ERR)]
    );
    assert_eq!(p.buf_b.bytes(0, 16), vec![0u8; 16]);
    assert_eq!((state(p.a), state(p.b)), (IBV_QPS_ERR, IBV_QPS_ERR));

    let p = Pair::spec(IBV_QPT_RC);
    let ro = p.dev.buf(64, 0);
    let mut r = [ro.sge(0, 64)];
    assert_eq!(post_recv(p.b, 1, &mut r), 0);
    let mut s = [p.buf_a.sge(0, 8)];
    let mut wr = send_wr(3, IBV_WR_SEND, &mut s, SIG);
    assert_eq!(post(p.a, &mut wr), 0);
    assert_eq!(ids(&drain(p.cq_a)), vec![(3, IBV_WC_REM_OP_ERR)]);
    assert_eq!(ids(&drain(p.cq_b)), vec![(1, IBV_WC_LOC_PROT_ERR)]);
}

/// RNR with rnr_retry 7: the SEND and everything after it wait, then run in order when the
/// receive is posted (rxe S12).
#[test]
fn rnr_waits_with_retry_7() {
    let p = Pair::spec_with(IBV_QPT_RC, 8, 7);
    let mut s = [p.buf_a.sge(0, 8)];
    let mut wrs = [
        send_wr(1, IBV_WR_SEND, &mut s, SIG),
        write_wr(&p, 2, &mut s, SIG),
        send_wr(3, IBV_WR_SEND, &mut s, SIG),
    ];
    assert_eq!(post_chain(p.a, &mut wrs), (0, None));
    assert!(drain(p.cq_a).is_empty());
    assert_eq!(send_wrs_waiting(p.a), 3);
    assert_eq!(sq_outstanding(p.a), 3);
    let mut r = [p.buf_b.sge(0, 64)];
    assert_eq!(post_recv(p.b, 10, &mut r), 0);
    // WR 1 and 2 ran, 3 waits for a second receive.
    assert_eq!(ids(&drain(p.cq_a)), vec![(1, 0), (2, 0)]);
    assert_eq!(send_wrs_waiting(p.a), 1);
    assert_eq!(post_recv(p.b, 11, &mut r), 0);
    assert_eq!(ids(&drain(p.cq_a)), vec![(3, 0)]);
    assert_eq!(ids(&drain(p.cq_b)), vec![(10, 0), (11, 0)]);
    assert_eq!(state(p.a), IBV_QPS_RTS);
}

/// RNR with rnr_retry < 7: RNR_RETRY_EXC_ERR, requester to ERR, responder stays RTS.
/// WRITE_WITH_IMM needs a receive too (rxe S17) and writes nothing then.
#[test]
fn rnr_retry_exceeded() {
    for op in [IBV_WR_SEND, IBV_WR_RDMA_WRITE_WITH_IMM] {
        let mut p = Pair::spec_with(IBV_QPT_RC, 8, 3);
        let mut s = [p.buf_a.sge(0, 8)];
        p.buf_a.fill(0, &[1; 8]);
        let mut wr = rdma(send_wr(1, op, &mut s, 0), p.buf_b.addr(), p.buf_b.rkey());
        assert_eq!(post(p.a, &mut wr), 0);
        assert_eq!(ids(&drain(p.cq_a)), vec![(1, IBV_WC_RNR_RETRY_EXC_ERR)]);
        assert_eq!((state(p.a), state(p.b)), (IBV_QPS_ERR, IBV_QPS_RTS));
        assert_eq!(p.buf_b.bytes(0, 8), vec![0u8; 8]);
    }
}

/// Flush accounting, rxe S13: chain of 5 where #1 has a bad lkey; A has two receives.
/// CQ order: the error, then the receives flushed, then the rest of the SQ, signaled or
/// not; the unsignaled success #0 has no CQE but was delivered. Later posts are flushed.
#[test]
fn flush_accounting() {
    let p = Pair::spec_with(IBV_QPT_RC, 8, 7);
    let mut r = [p.buf_a.sge(2048, 64)];
    assert_eq!(post_recv(p.a, 2000, &mut r), 0);
    assert_eq!(post_recv(p.a, 2001, &mut r), 0);
    let mut rb = [p.buf_b.sge(0, 64)];
    assert_eq!(post_recv(p.b, 3000, &mut rb), 0);
    let mut good = [p.buf_a.sge(0, 8)];
    let mut bad = [ibv_sge {
        addr: p.buf_a.addr(),
        length: 8,
        lkey: 0x1234_5678,
    }];
    let mut wrs = [
        send_wr(130, IBV_WR_SEND, &mut good, 0),
        send_wr(131, IBV_WR_SEND, &mut bad, SIG),
        write_wr(&p, 132, &mut good, 0),
        rdma(
            send_wr(133, IBV_WR_RDMA_READ, &mut good, SIG),
            p.buf_b.addr(),
            p.buf_b.rkey(),
        ),
        send_wr(134, IBV_WR_SEND, &mut good, 0),
    ];
    // #1 fails at execution, so the post of the whole chain succeeds... but #2.. are posted
    // to a QP already in ERR, and flushed at once.
    assert_eq!(post_chain(p.a, &mut wrs), (0, None));
    assert_eq!(
        ids(&drain(p.cq_a)),
        vec![
            (131, IBV_WC_LOC_PROT_ERR),
            (2000, IBV_WC_WR_FLUSH_ERR),
            (2001, IBV_WC_WR_FLUSH_ERR),
            (132, IBV_WC_WR_FLUSH_ERR),
            (133, IBV_WC_WR_FLUSH_ERR),
            (134, IBV_WC_WR_FLUSH_ERR),
        ]
    );
    assert_eq!(
        ids(&drain(p.cq_b)),
        vec![(3000, 0)],
        "the unsignaled #0 was delivered"
    );
    assert_eq!(state(p.b), IBV_QPS_RTS);
    assert_eq!(sq_outstanding(p.a), 0, "every slot retired");
    // Later posts: flushed at once, even unsignaled.
    let mut wr = send_wr(140, IBV_WR_SEND, &mut good, 0);
    assert_eq!(post(p.a, &mut wr), 0);
    assert_eq!(post_recv(p.a, 2002, &mut r), 0);
    assert_eq!(
        ids(&drain(p.cq_a)),
        vec![(140, IBV_WC_WR_FLUSH_ERR), (2002, IBV_WC_WR_FLUSH_ERR)]
    );
    // The requester got QP_FATAL.
    assert!(all_async_events(p.dev.ctx).contains(&(IBV_EVENT_QP_FATAL, p.a as usize)));
}

/// Waiting (RNR) WRs are flushed, signaled or not, when the QP goes to ERR; modify(ERR)
/// flushes receives first (rxe S14).
#[test]
fn flush_waiting_on_modify_err() {
    let p = Pair::spec_with(IBV_QPT_RC, 8, 7);
    let mut s = [p.buf_a.sge(0, 8)];
    let mut wrs = [
        send_wr(141, IBV_WR_SEND, &mut s, SIG),
        send_wr(142, IBV_WR_SEND, &mut s, 0),
        write_wr(&p, 143, &mut s, 0),
        send_wr(144, IBV_WR_SEND, &mut s, SIG),
    ];
    assert_eq!(post_chain(p.a, &mut wrs), (0, None));
    let mut r = [p.buf_a.sge(2048, 8)];
    assert_eq!(post_recv(p.a, 2000, &mut r), 0);
    assert_eq!(post_recv(p.a, 2001, &mut r), 0);
    let mut attr = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    assert_eq!(modify(p.a, &mut attr, IBV_QP_STATE), 0);
    assert_eq!(
        ids(&drain(p.cq_a)),
        vec![(2000, 5), (2001, 5), (141, 5), (142, 5), (143, 5), (144, 5)]
    );
    assert_eq!(state(p.b), IBV_QPS_RTS);
    assert!(
        all_async_events(p.dev.ctx).is_empty(),
        "modify(ERR) raises no event"
    );
    // ERR -> ERR is fine and produces nothing.
    assert_eq!(modify(p.a, &mut attr, IBV_QP_STATE), 0);
    assert!(drain(p.cq_a).is_empty());
}

/// A requester waiting in RNR fails with RETRY_EXC_ERR when its responder goes to ERR or
/// is destroyed (rxe S14/S21).
#[test]
fn waiter_fails_when_responder_dies() {
    for destroy in [false, true] {
        let p = Pair::spec_with(IBV_QPT_RC, 8, 7);
        let mut s = [p.buf_a.sge(0, 8)];
        let mut wrs = [
            send_wr(1, IBV_WR_SEND, &mut s, 0),
            send_wr(2, IBV_WR_SEND, &mut s, 0),
        ];
        assert_eq!(post_chain(p.a, &mut wrs), (0, None));
        if destroy {
            // SAFETY: p.b is live and destroyed once; the test does not use it again.
            assert_eq!(unsafe { fns().ibv_destroy_qp.unwrap()(p.b) }, 0);
        } else {
            let mut attr = ibv_qp_attr {
                qp_state: IBV_QPS_ERR,
                ..Default::default()
            };
            assert_eq!(modify(p.b, &mut attr, IBV_QP_STATE), 0);
        }
        assert_eq!(
            ids(&drain(p.cq_a)),
            vec![(1, IBV_WC_RETRY_EXC_ERR), (2, IBV_WC_WR_FLUSH_ERR)]
        );
        assert_eq!(state(p.a), IBV_QPS_ERR);
    }
}

/// A responder that is not ready (INIT) or absent: RC gets RETRY_EXC_ERR; UC succeeds
/// silently.
#[test]
fn responder_not_ready() {
    for qpt in [IBV_QPT_RC, IBV_QPT_UC] {
        let dev = Dev::spec();
        let cq = dev.cq(8);
        let a = dev.qp(qpt, cq, cq, cap(4));
        let b = dev.qp(qpt, cq, cq, cap(4));
        connect(a, dev.ctx, qpn(b), ALL_ACCESS, 7);
        to_init(b, ALL_ACCESS);
        let buf = dev.buf(64, ALL_ACCESS);
        let mut s = [buf.sge(0, 8)];
        let mut wr = send_wr(1, IBV_WR_SEND, &mut s, SIG);
        assert_eq!(post(a, &mut wr), 0);
        let expect = if qpt == IBV_QPT_RC {
            IBV_WC_RETRY_EXC_ERR
        } else {
            IBV_WC_SUCCESS
        };
        assert_eq!(ids(&drain(cq)), vec![(1, expect)]);
    }
}

/// CQ overflow: the CQ goes to error, poll_cq returns a negative value, CQ_ERR is raised.
#[test]
fn cq_overflow() {
    let dev = Dev::spec();
    let cq = dev.cq(4);
    // SAFETY: cq was just created and is live.
    assert_eq!(unsafe { (*cq).cqe }, 4);
    let qp = dev.qp(IBV_QPT_RC, cq, cq, cap(16));
    connect(qp, dev.ctx, qpn(qp), ALL_ACCESS, 7);
    let buf = dev.buf(64, ALL_ACCESS);
    let mut s = [buf.sge(0, 8)];
    for i in 0..4 {
        let mut wr = rdma(
            send_wr(i, IBV_WR_RDMA_WRITE, &mut s, SIG),
            buf.addr() + 32,
            buf.rkey(),
        );
        assert_eq!(post(qp, &mut wr), 0);
    }
    assert!(all_async_events(dev.ctx).is_empty());
    let mut wr = rdma(
        send_wr(4, IBV_WR_RDMA_WRITE, &mut s, SIG),
        buf.addr() + 32,
        buf.rkey(),
    );
    assert_eq!(post(qp, &mut wr), 0);
    let mut wc = [ibv_wc::default(); 8];
    assert!(poll(cq, &mut wc) < 0);
    assert_eq!(
        all_async_events(dev.ctx),
        vec![(IBV_EVENT_CQ_ERR, cq as usize)]
    );
    assert!(poll(cq, &mut wc) < 0, "stays in error");
}

/// inject_qp_error: flushes outstanding work, raises QP_FATAL.
#[test]
fn injected_error() {
    let p = Pair::spec_with(IBV_QPT_RC, 8, 7);
    let mut r = [p.buf_b.sge(0, 8)];
    assert_eq!(post_recv(p.b, 7, &mut r), 0);
    let mut s = [p.buf_b.sge(0, 8)];
    let mut wr = send_wr(8, IBV_WR_SEND, &mut s, 0);
    // b -> a: a has no receive, so it waits.
    assert_eq!(post(p.b, &mut wr), 0);
    inject_qp_error(p.b);
    assert_eq!(state(p.b), IBV_QPS_ERR);
    assert_eq!(ids(&drain(p.cq_b)), vec![(7, 5), (8, 5)]);
    assert_eq!(
        all_async_events(p.dev.ctx),
        vec![(IBV_EVENT_QP_FATAL, p.b as usize)]
    );
    // And the QP can be recycled: ERR -> RESET -> INIT -> RTR -> RTS.
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RESET,
        ..Default::default()
    };
    assert_eq!(modify(p.b, &mut a, IBV_QP_STATE), 0);
    assert_eq!(sq_outstanding(p.b), 0);
    connect(p.b, p.dev.ctx, qpn(p.a), ALL_ACCESS, 7);
    let mut s = [p.buf_b.sge(0, 8)];
    let mut wr = rdma(
        send_wr(9, IBV_WR_RDMA_WRITE, &mut s, SIG),
        p.buf_a.addr(),
        p.buf_a.rkey(),
    );
    assert_eq!(post(p.b, &mut wr), 0);
    assert_eq!(ids(&drain(p.cq_b)), vec![(9, 0)]);
}

/// Inline data is captured at post time even when the WR cannot run then: an inline SEND
/// that waits in RNR (rnr_retry 7), and one queued behind it, deliver the bytes their
/// (two-SGE) buffers held during post_send, not what the application wrote there after.
#[test]
fn inline_sends_waiting_in_rnr_keep_their_bytes() {
    let p = Pair::spec_with(IBV_QPT_RC, 8, 7);
    let mut first = *b"abcdefgh";
    let mut second = *b"12345678";
    let mut s = [
        ibv_sge {
            addr: first.as_mut_ptr() as u64,
            length: 4,
            lkey: 0,
        },
        ibv_sge {
            addr: second.as_mut_ptr() as u64,
            length: 8,
            lkey: 0,
        },
    ];
    let mut wrs = [
        send_wr(1, IBV_WR_SEND, &mut s, SIG | IBV_SEND_INLINE),
        send_wr(2, IBV_WR_SEND, &mut s[1..], SIG | IBV_SEND_INLINE),
    ];
    assert_eq!(post_chain(p.a, &mut wrs), (0, None));
    assert_eq!(send_wrs_waiting(p.a), 2);
    first.fill(b'x');
    second.fill(b'y');
    let mut r = [p.buf_b.sge(0, 64)];
    assert_eq!(post_recv(p.b, 10, &mut r), 0);
    let mut r = [p.buf_b.sge(64, 64)];
    assert_eq!(post_recv(p.b, 11, &mut r), 0);
    let a = drain(p.cq_a);
    assert_eq!(ids(&a), vec![(1, 0), (2, 0)]);
    assert_eq!((a[0].byte_len, a[1].byte_len), (12, 8));
    let b = drain(p.cq_b);
    assert_eq!((b[0].byte_len, b[1].byte_len), (12, 8));
    assert_eq!(p.buf_b.bytes(0, 12), b"abcd12345678");
    assert_eq!(p.buf_b.bytes(64, 8), b"12345678");
}

/// An empty inline message needs no buffer: an inline WRITE or SEND whose only SGE is
/// `{addr: 0, length: 0}` is legal (fuzz finding 1: softnic built a slice from the NULL
/// address, undefined behaviour that the debug precondition check turns into an abort).
/// Covered on both paths: executed at once inside post_send, and copied to wait in RNR
/// (rnr_retry 7), both as the WR that meets RNR and as one queued behind it.
#[test]
fn inline_empty_sge_at_null_address() {
    let null_sge = || ibv_sge {
        addr: 0,
        length: 0,
        lkey: 0,
    };
    let f = SIG | IBV_SEND_INLINE;
    // Immediate path: a zero-byte inline WRITE, and a zero-byte inline SEND to a posted
    // receive.
    let p = Pair::spec_with(IBV_QPT_RC, 8, 7);
    let mut s = [null_sge()];
    let mut wr = write_wr(&p, 1, &mut s, f);
    assert_eq!(post(p.a, &mut wr), 0);
    let mut r = [p.buf_b.sge(0, 64)];
    assert_eq!(post_recv(p.b, 10, &mut r), 0);
    let mut s = [null_sge()];
    let mut wr = send_wr(2, IBV_WR_SEND, &mut s, f);
    assert_eq!(post(p.a, &mut wr), 0);
    let a = drain(p.cq_a);
    assert_eq!(ids(&a), vec![(1, IBV_WC_SUCCESS), (2, IBV_WC_SUCCESS)]);
    assert_eq!((a[0].byte_len, a[1].byte_len), (0, 0));
    let b = drain(p.cq_b);
    assert_eq!(ids(&b), vec![(10, IBV_WC_SUCCESS)]);
    assert_eq!(b[0].byte_len, 0);

    // Waiting path: no receive posted, so the SEND waits in RNR and the WRITE queues
    // behind it; both keep their (empty) payload and run once a receive arrives.
    let p = Pair::spec_with(IBV_QPT_RC, 8, 7);
    let mut s1 = [null_sge()];
    let mut s2 = [null_sge()];
    let mut wrs = [
        send_wr(3, IBV_WR_SEND, &mut s1, f),
        write_wr(&p, 4, &mut s2, f),
    ];
    assert_eq!(post_chain(p.a, &mut wrs), (0, None));
    assert_eq!(send_wrs_waiting(p.a), 2);
    let mut r = [p.buf_b.sge(0, 64)];
    assert_eq!(post_recv(p.b, 11, &mut r), 0);
    let a = drain(p.cq_a);
    assert_eq!(ids(&a), vec![(3, IBV_WC_SUCCESS), (4, IBV_WC_SUCCESS)]);
    assert_eq!((a[0].byte_len, a[1].byte_len), (0, 0));
    let b = drain(p.cq_b);
    assert_eq!(ids(&b), vec![(11, IBV_WC_SUCCESS)]);
    assert_eq!(b[0].byte_len, 0);
}

/// IBV_SEND_INLINE takes the payload at post time ("the data buffers can be reused
/// immediately after the call returns", ibv_post_send(3)), so a destination that overlaps
/// the inline sources receives the bytes they held when the WR was posted (fuzz finding 2:
/// softnic gathered piece by piece while writing and delivered bytes it had just
/// overwritten). Three inline SGEs of 16, 16 and 32 bytes all name the start of the peer's
/// buffer, and the WRITE targets that same address (RC and UC); likewise an inline SEND
/// whose receive buffer is that address.
#[test]
fn inline_write_overlapping_its_source_writes_the_posted_bytes() {
    let pattern: Vec<u8> = (0..64u8)
        .map(|i| i.wrapping_mul(7).wrapping_add(1))
        .collect();
    let mut expect = Vec::new();
    expect.extend_from_slice(&pattern[..16]);
    expect.extend_from_slice(&pattern[..16]);
    expect.extend_from_slice(&pattern[..32]);
    let mut wrong = Vec::new();
    for qpt in [IBV_QPT_RC, IBV_QPT_UC] {
        for send in [false, true] {
            let what = format!("qpt {qpt} send {send}");
            let mut p = Pair::spec_with(qpt, 8, 7);
            p.buf_b.fill(0, &pattern);
            let base = p.buf_b.addr();
            let sge = |length| ibv_sge {
                addr: base,
                length,
                lkey: 0,
            };
            let mut s = [sge(16), sge(16), sge(32)];
            let f = SIG | IBV_SEND_INLINE;
            let mut wr = if send {
                let mut r = [p.buf_b.sge(0, 64)];
                assert_eq!(post_recv(p.b, 10, &mut r), 0, "{what}");
                send_wr(1, IBV_WR_SEND, &mut s, f)
            } else {
                write_wr(&p, 1, &mut s, f)
            };
            assert_eq!(post(p.a, &mut wr), 0, "{what}");
            let a = drain(p.cq_a);
            assert_eq!(ids(&a), vec![(1, IBV_WC_SUCCESS)], "{what}");
            assert_eq!(a[0].byte_len, 64, "{what}");
            if send {
                let b = drain(p.cq_b);
                assert_eq!(ids(&b), vec![(10, IBV_WC_SUCCESS)], "{what}");
                assert_eq!(b[0].byte_len, 64, "{what}");
            }
            let got = p.buf_b.bytes(0, 64);
            if got != expect {
                wrong.push(format!("{what}: got {got:?}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "expected {expect:?}\n{}",
        wrong.join("\n")
    );
}
