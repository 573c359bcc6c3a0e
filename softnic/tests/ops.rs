//! The opcode x QP-type matrix of ibv_post_send(3), data movement and completion fields.

mod common;
use common::*;

const SIG: u32 = IBV_SEND_SIGNALED;

fn recv_one(p: &mut Pair, len: u32) {
    let mut s = [p.buf_b.sge(1024, len)];
    assert_eq!(post_recv(p.b, 900, &mut s), 0);
}

/// RC and UC: SEND and SEND_WITH_IMM move the data, both sides complete with the right
/// opcode, byte_len, imm and flags.
#[test]
fn send_and_send_imm_rc_uc() {
    for qpt in [IBV_QPT_RC, IBV_QPT_UC] {
        let mut p = Pair::new(qpt);
        p.buf_a.fill(0, b"hello softnic");
        recv_one(&mut p, 64);
        recv_one(&mut p, 64);
        let mut s = [p.buf_a.sge(0, 13)];
        let mut wr = send_wr(1, IBV_WR_SEND, &mut s, SIG);
        assert_eq!(post(p.a, &mut wr), 0);
        let mut s = [p.buf_a.sge(0, 5)];
        let mut wr = send_wr(2, IBV_WR_SEND_WITH_IMM, &mut s, SIG);
        wr.__bindgen_anon_1.imm_data = 0xdead_beefu32.to_be();
        assert_eq!(post(p.a, &mut wr), 0);

        let a = drain(p.cq_a);
        assert_eq!(ids(&a), vec![(1, IBV_WC_SUCCESS), (2, IBV_WC_SUCCESS)]);
        assert_eq!(a[0].opcode, IBV_WC_SEND);
        assert_eq!(a[0].byte_len, 13);
        assert_eq!(a[0].wc_flags, 0);
        assert_eq!(a[0].qp_num, qpn(p.a));
        assert_eq!(a[1].wc_flags, IBV_WC_WITH_IMM);

        let b = drain(p.cq_b);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].opcode, IBV_WC_RECV);
        assert_eq!(b[0].byte_len, 13);
        assert_eq!(b[0].qp_num, qpn(p.b));
        if p.dev.profile() == hotverbs_softnic::Profile::Rxe {
            // rxe G4: GRH flag and src_qp 0 on connected QPs.
            assert_eq!(b[0].src_qp, 0);
            assert_eq!(b[0].wc_flags, IBV_WC_GRH, "GRH flag on {qpt} (rxe G4)");
            assert_eq!(b[1].wc_flags, IBV_WC_GRH | IBV_WC_WITH_IMM);
        } else {
            assert_eq!(b[0].src_qp, qpn(p.a));
            assert_eq!(b[0].wc_flags, 0, "no GRH flag on {qpt}");
            assert_eq!(b[1].wc_flags, IBV_WC_WITH_IMM);
        }
        assert_eq!(imm(&b[1]), 0xdead_beefu32.to_be());
        assert_eq!(p.buf_b.bytes(1024, 5), b"hello");
    }
}

/// RDMA_WRITE on RC and UC writes remote memory without consuming a receive;
/// RDMA_WRITE_WITH_IMM consumes one and reports RECV_RDMA_WITH_IMM with the write length.
#[test]
fn write_and_write_imm_rc_uc() {
    for qpt in [IBV_QPT_RC, IBV_QPT_UC] {
        let mut p = Pair::new(qpt);
        p.buf_a.fill(0, &[7u8; 100]);
        let (raddr, rkey) = (p.buf_b.addr() + 200, p.buf_b.rkey());
        let mut s = [p.buf_a.sge(0, 100)];
        let mut wr = rdma(send_wr(1, IBV_WR_RDMA_WRITE, &mut s, SIG), raddr, rkey);
        assert_eq!(post(p.a, &mut wr), 0);
        assert_eq!(p.buf_b.bytes(200, 100), vec![7u8; 100]);
        assert!(drain(p.cq_b).is_empty(), "plain WRITE consumes no receive");

        recv_one(&mut p, 16);
        p.buf_a.fill(0, &[9u8; 30]);
        let mut s = [p.buf_a.sge(0, 30)];
        let mut wr = rdma(
            send_wr(2, IBV_WR_RDMA_WRITE_WITH_IMM, &mut s, SIG),
            raddr,
            rkey,
        );
        wr.__bindgen_anon_1.imm_data = 42u32.to_be();
        assert_eq!(post(p.a, &mut wr), 0);
        assert_eq!(p.buf_b.bytes(200, 30), vec![9u8; 30]);
        let a = drain(p.cq_a);
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].opcode, IBV_WC_RDMA_WRITE);
        assert_eq!(a[0].byte_len, 100);
        assert_eq!(a[1].opcode, IBV_WC_RDMA_WRITE);
        assert_eq!(a[1].wc_flags, IBV_WC_WITH_IMM);
        let b = drain(p.cq_b);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
        assert_eq!(b[0].byte_len, 30);
        assert_eq!(imm(&b[0]), 42u32.to_be());
        assert_eq!(
            p.buf_b.bytes(1024, 16),
            vec![0u8; 16],
            "receive buffer untouched"
        );
    }
}

/// RC: RDMA_READ, ATOMIC_CMP_AND_SWP and ATOMIC_FETCH_AND_ADD.
#[test]
fn read_and_atomics_rc() {
    let mut p = Pair::new(IBV_QPT_RC);
    p.buf_b.fill(64, b"remote bytes");
    let mut s = [p.buf_a.sge(0, 12)];
    let mut wr = rdma(
        send_wr(1, IBV_WR_RDMA_READ, &mut s, SIG),
        p.buf_b.addr() + 64,
        p.buf_b.rkey(),
    );
    assert_eq!(post(p.a, &mut wr), 0);
    assert_eq!(p.buf_a.bytes(0, 12), b"remote bytes");

    p.buf_b.fill(512, &100u64.to_ne_bytes());
    let target = p.buf_b.addr() + 512;
    let mut s = [p.buf_a.sge(256, 8)];
    let mut wr = atomic(
        send_wr(2, IBV_WR_ATOMIC_FETCH_AND_ADD, &mut s, SIG),
        target,
        p.buf_b.rkey(),
        5,
        0,
    );
    assert_eq!(post(p.a, &mut wr), 0);
    assert_eq!(
        u64::from_ne_bytes(p.buf_a.bytes(256, 8).try_into().unwrap()),
        100
    );
    assert_eq!(
        u64::from_ne_bytes(p.buf_b.bytes(512, 8).try_into().unwrap()),
        105
    );

    // CAS that fails (compare 1 != 105) leaves memory, returns the original.
    let mut s = [p.buf_a.sge(264, 8)];
    let mut wr = atomic(
        send_wr(3, IBV_WR_ATOMIC_CMP_AND_SWP, &mut s, SIG),
        target,
        p.buf_b.rkey(),
        1,
        77,
    );
    assert_eq!(post(p.a, &mut wr), 0);
    assert_eq!(
        u64::from_ne_bytes(p.buf_a.bytes(264, 8).try_into().unwrap()),
        105
    );
    assert_eq!(
        u64::from_ne_bytes(p.buf_b.bytes(512, 8).try_into().unwrap()),
        105
    );
    // CAS that succeeds.
    let mut s = [p.buf_a.sge(272, 8)];
    let mut wr = atomic(
        send_wr(4, IBV_WR_ATOMIC_CMP_AND_SWP, &mut s, SIG),
        target,
        p.buf_b.rkey(),
        105,
        77,
    );
    assert_eq!(post(p.a, &mut wr), 0);
    assert_eq!(
        u64::from_ne_bytes(p.buf_b.bytes(512, 8).try_into().unwrap()),
        77
    );

    let a = drain(p.cq_a);
    assert_eq!(
        a.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        vec![
            (1, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, 12),
            (2, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, 8),
            (3, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, 8),
            (4, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, 8),
        ]
    );
    assert!(drain(p.cq_b).is_empty());
}

/// UC has no READ or atomics: they complete with LOC_QP_OP_ERR and the QP goes to ERR
/// (rxe S21 for unsupported opcodes).
#[test]
fn uc_rejects_read_and_atomics() {
    for op in [
        IBV_WR_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP,
        IBV_WR_ATOMIC_FETCH_AND_ADD,
    ] {
        let p = Pair::new(IBV_QPT_UC);
        let mut s = [p.buf_a.sge(0, 8)];
        let wr = send_wr(5, op, &mut s, 0);
        let mut wr = if op == IBV_WR_RDMA_READ {
            rdma(wr, p.buf_b.addr(), p.buf_b.rkey())
        } else {
            atomic(wr, p.buf_b.addr(), p.buf_b.rkey(), 0, 0)
        };
        assert_eq!(post(p.a, &mut wr), 0);
        assert_eq!(ids(&drain(p.cq_a)), vec![(5, IBV_WC_LOC_QP_OP_ERR)]);
        assert_eq!(state(p.a), IBV_QPS_ERR);
        assert_eq!(state(p.b), IBV_QPS_RTS);
    }
}

/// UD supports only SEND and SEND_WITH_IMM.
#[test]
fn ud_rejects_rdma_and_atomics() {
    for op in [
        IBV_WR_RDMA_WRITE,
        IBV_WR_RDMA_WRITE_WITH_IMM,
        IBV_WR_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP,
        IBV_WR_ATOMIC_FETCH_AND_ADD,
    ] {
        let dev = Dev::new();
        let cq = dev.cq(16);
        let qp = dev.qp(IBV_QPT_UD, cq, cq, cap(4));
        connect(qp, dev.ctx, 0, 0, 0);
        let buf = dev.buf(64, ALL_ACCESS);
        let mut ah_attr = ibv_ah_attr {
            is_global: 1,
            port_num: 1,
            ..Default::default()
        };
        ah_attr.grh.dgid = gid(dev.ctx, 1);
        ah_attr.grh.sgid_index = 1;
        let ah = create_ah(dev.pd, &mut ah_attr);
        assert!(!ah.is_null());
        let mut s = [buf.sge(0, 8)];
        let mut wr = send_wr(6, op, &mut s, 0);
        if op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD {
            // The atomic union member overlaps ud.ah: set the UD address after.
            wr = atomic(wr, 0, 0, 0, 0);
        }
        wr.wr.ud.ah = ah;
        wr.wr.ud.remote_qpn = qpn(qp);
        wr.wr.ud.remote_qkey = 0x1111;
        let rc = post(qp, &mut wr);
        if rc == 0 {
            assert_eq!(
                ids(&drain(cq)),
                vec![(6, IBV_WC_LOC_QP_OP_ERR)],
                "opcode {op}"
            );
            assert_eq!(state(qp), IBV_QPS_ERR);
        } else {
            // An atomic WR's alignment/length checks read the atomic member; either way the
            // WR must not execute.
            assert_eq!(rc, libc::EINVAL);
            assert!(drain(cq).is_empty());
        }
    }
}

/// SGE lists gather on send and scatter on receive; zero-byte messages complete with
/// byte_len 0 (rxe S16).
#[test]
fn sge_lists_and_zero_bytes() {
    let mut p = Pair::new(IBV_QPT_RC);
    p.buf_a.fill(0, b"abc");
    p.buf_a.fill(100, b"defg");
    p.buf_a.fill(200, b"hi");
    let mut r = [p.buf_b.sge(0, 4), p.buf_b.sge(50, 2), p.buf_b.sge(60, 10)];
    assert_eq!(post_recv(p.b, 1, &mut r), 0);
    let mut s = [p.buf_a.sge(0, 3), p.buf_a.sge(100, 4), p.buf_a.sge(200, 2)];
    let mut wr = send_wr(2, IBV_WR_SEND, &mut s, SIG);
    assert_eq!(post(p.a, &mut wr), 0);
    assert_eq!(p.buf_b.bytes(0, 4), b"abcd");
    assert_eq!(p.buf_b.bytes(50, 2), b"ef");
    assert_eq!(p.buf_b.bytes(60, 3), b"ghi");
    assert_eq!(drain(p.cq_b)[0].byte_len, 9);

    // Zero-byte SEND (num_sge 0) and zero-byte WRITE with a bogus rkey.
    let mut r = [p.buf_b.sge(0, 4)];
    assert_eq!(post_recv(p.b, 3, &mut r), 0);
    let mut wr = send_wr(4, IBV_WR_SEND, &mut [], SIG);
    assert_eq!(post(p.a, &mut wr), 0);
    let mut wr = rdma(send_wr(5, IBV_WR_RDMA_WRITE, &mut [], SIG), 0, 0xdead00);
    assert_eq!(post(p.a, &mut wr), 0);
    let a = drain(p.cq_a);
    assert_eq!(ids(&a), vec![(2, 0), (4, 0), (5, 0)]);
    assert_eq!(a[1].byte_len, 0);
    let b = drain(p.cq_b);
    assert_eq!(ids(&b), vec![(3, 0)]);
    assert_eq!(b[0].byte_len, 0);
}

/// Inline data is copied at post time: changing the buffer afterwards changes nothing; an
/// inline buffer need not be registered.
#[test]
fn inline_copied_at_post() {
    let p = Pair::new(IBV_QPT_RC);
    let mut r = [p.buf_b.sge(0, 64)];
    assert_eq!(post_recv(p.b, 1, &mut r), 0);
    let mut local = *b"inline!!";
    let mut s = [ibv_sge {
        addr: local.as_mut_ptr() as u64,
        length: 8,
        lkey: 0,
    }];
    let mut wr = send_wr(2, IBV_WR_SEND, &mut s, SIG | IBV_SEND_INLINE);
    assert_eq!(post(p.a, &mut wr), 0);
    local.fill(0);
    assert_eq!(p.buf_b.bytes(0, 8), b"inline!!");
    assert_eq!(drain(p.cq_a)[0].byte_len, 8);

    // Inline RDMA_WRITE.
    let mut data = [5u8; 64];
    let mut s = [ibv_sge {
        addr: data.as_mut_ptr() as u64,
        length: 64,
        lkey: 0,
    }];
    let mut wr = rdma(
        send_wr(3, IBV_WR_RDMA_WRITE, &mut s, SIG | IBV_SEND_INLINE),
        p.buf_b.addr() + 128,
        p.buf_b.rkey(),
    );
    assert_eq!(post(p.a, &mut wr), 0);
    assert_eq!(p.buf_b.bytes(128, 64), vec![5u8; 64]);
}

/// Loopback: a QP connected to itself.
#[test]
fn loopback_rc() {
    let dev = Dev::new();
    let cq = dev.cq(16);
    let qp = dev.qp(IBV_QPT_RC, cq, cq, cap(8));
    connect(qp, dev.ctx, qpn(qp), ALL_ACCESS, 7);
    let mut buf = dev.buf(256, ALL_ACCESS);
    buf.fill(0, b"self");
    let mut r = [buf.sge(100, 16)];
    assert_eq!(post_recv(qp, 1, &mut r), 0);
    let mut s = [buf.sge(0, 4)];
    let mut wr = send_wr(2, IBV_WR_SEND, &mut s, SIG);
    assert_eq!(post(qp, &mut wr), 0);
    assert_eq!(buf.bytes(100, 4), b"self");
    let w = drain(cq);
    assert_eq!(w.len(), 2);
    assert!(w.iter().any(|w| w.opcode == IBV_WC_RECV && w.wr_id == 1));
    assert!(w.iter().any(|w| w.opcode == IBV_WC_SEND && w.wr_id == 2));
}

/// Across two contexts (one an `open_device` device with its own config).
#[test]
fn across_contexts() {
    let d1 = Dev::new();
    let ctx2 = hotverbs_softnic::open_device(hotverbs_softnic::Config {
        name: "softnic-x".into(),
        ..Default::default()
    });
    let d2 = Dev::with_ctx(ctx2);
    let (c1, c2) = (d1.cq(8), d2.cq(8));
    let q1 = d1.qp(IBV_QPT_RC, c1, c1, cap(4));
    let q2 = d2.qp(IBV_QPT_RC, c2, c2, cap(4));
    connect(q1, d2.ctx, qpn(q2), ALL_ACCESS, 7);
    connect(q2, d1.ctx, qpn(q1), ALL_ACCESS, 7);
    let mut b1 = d1.buf(64, ALL_ACCESS);
    let b2 = d2.buf(64, ALL_ACCESS);
    b1.fill(0, b"xctx");
    let mut s = [b1.sge(0, 4)];
    let mut wr = rdma(
        send_wr(1, IBV_WR_RDMA_WRITE, &mut s, SIG),
        b2.addr(),
        b2.rkey(),
    );
    assert_eq!(post(q1, &mut wr), 0);
    assert_eq!(b2.bytes(0, 4), b"xctx");
    assert_eq!(ids(&drain(c1)), vec![(1, 0)]);
    // An rkey of the other device's PD does not work on this one.
    let mut wr = rdma(
        send_wr(2, IBV_WR_RDMA_WRITE, &mut s, SIG),
        b1.addr(),
        b1.rkey(),
    );
    assert_eq!(post(q1, &mut wr), 0);
    assert_eq!(ids(&drain(c1)), vec![(2, IBV_WC_REM_ACCESS_ERR)]);
}

/// Signaling: unsignaled successes make no CQE; sq_sig_all signals everything.
#[test]
fn signaling() {
    let p = Pair::new(IBV_QPT_RC);
    let mut s = [p.buf_a.sge(0, 8)];
    for i in 0..4 {
        let flags = if i == 3 { SIG } else { 0 };
        let mut wr = rdma(
            send_wr(i, IBV_WR_RDMA_WRITE, &mut s, flags),
            p.buf_b.addr(),
            p.buf_b.rkey(),
        );
        assert_eq!(post(p.a, &mut wr), 0);
    }
    assert_eq!(ids(&drain(p.cq_a)), vec![(3, 0)]);

    let dev = Dev::new();
    let cq = dev.cq(16);
    let mut ia = ibv_qp_init_attr {
        send_cq: cq,
        recv_cq: cq,
        cap: cap(4),
        qp_type: IBV_QPT_RC,
        sq_sig_all: 1,
        ..Default::default()
    };
    let qp = create_qp(dev.pd, &mut ia);
    assert!(!qp.is_null());
    connect(qp, dev.ctx, qpn(qp), ALL_ACCESS, 7);
    let buf = dev.buf(64, ALL_ACCESS);
    let mut s = [buf.sge(0, 8)];
    for i in 0..3 {
        let mut wr = rdma(
            send_wr(i, IBV_WR_RDMA_WRITE, &mut s, 0),
            buf.addr() + 32,
            buf.rkey(),
        );
        assert_eq!(post(qp, &mut wr), 0);
    }
    assert_eq!(ids(&drain(cq)), vec![(0, 0), (1, 0), (2, 0)]);
}

/// Fence and solicited flags are accepted; a solicited SEND wakes a CQ armed with
/// solicited_only, an unsolicited one does not.
#[test]
fn fence_and_solicited() {
    let dev = Dev::new();
    // SAFETY: dev.ctx is live.
    let ch = unsafe { fns().ibv_create_comp_channel.unwrap()(dev.ctx) };
    assert!(!ch.is_null());
    let cq_a = dev.cq(16);
    // SAFETY: dev.ctx and ch are live; the cq_context is an opaque tag softnic only
    // hands back, never dereferences.
    let cq_b = unsafe { fns().ibv_create_cq.unwrap()(dev.ctx, 16, 0x55 as *mut _, ch, 0) };
    let a = dev.qp(IBV_QPT_RC, cq_a, cq_a, cap(8));
    let b = dev.qp(IBV_QPT_RC, cq_b, cq_b, cap(8));
    connect(a, dev.ctx, qpn(b), ALL_ACCESS, 7);
    connect(b, dev.ctx, qpn(a), ALL_ACCESS, 7);
    let buf = dev.buf(256, ALL_ACCESS);
    for i in 0..2 {
        let mut r = [buf.sge(128, 16)];
        assert_eq!(post_recv(b, i, &mut r), 0);
    }
    assert_eq!(req_notify(cq_b, true), 0);
    // SAFETY: ch is live until the end of the test.
    let fd = unsafe { (*ch).fd };
    let notified = || readable(fd);
    let mut s = [buf.sge(0, 4)];
    let mut wr = send_wr(10, IBV_WR_SEND, &mut s, IBV_SEND_FENCE);
    assert_eq!(post(a, &mut wr), 0);
    assert!(
        !notified(),
        "unsolicited completion must not notify a solicited-only CQ"
    );
    let mut wr = send_wr(11, IBV_WR_SEND, &mut s, IBV_SEND_SOLICITED);
    assert_eq!(post(a, &mut wr), 0);
    assert!(notified());
    let mut cq = core::ptr::null_mut();
    let mut cqc = core::ptr::null_mut();
    assert_eq!(
        // SAFETY: ch is live and readable (checked), so this does not block.
        unsafe { fns().ibv_get_cq_event.unwrap()(ch, &mut cq, &mut cqc) },
        0
    );
    assert_eq!(cq, cq_b);
    assert_eq!(cqc as usize, 0x55);
    // SAFETY: cq (== cq_b) is live; acks the one event just taken.
    unsafe { fns().ibv_ack_cq_events.unwrap()(cq, 1) };
    // SAFETY: cq_b is live.
    assert_eq!(unsafe { (*cq_b).comp_events_completed }, 1);
    assert_eq!(drain(cq_b).len(), 2);
    // Not re-armed: no further event.
    let mut r = [buf.sge(128, 16)];
    assert_eq!(post_recv(b, 3, &mut r), 0);
    let mut wr = send_wr(12, IBV_WR_SEND, &mut s, IBV_SEND_SOLICITED);
    assert_eq!(post(a, &mut wr), 0);
    assert!(!notified());
    // Destroying the channel while a CQ uses it is EBUSY.
    assert_eq!(
        // SAFETY: ch is live; softnic refuses (EBUSY) as cq_b uses it, so it stays live.
        unsafe { fns().ibv_destroy_comp_channel.unwrap()(ch) },
        libc::EBUSY
    );
}
