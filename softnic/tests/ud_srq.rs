//! UD with AH, remote QPN and Q_Key; the GRH area; multicast; SRQ.

mod common;
use common::*;
use core::ptr::null_mut;

const QKEY: u32 = 0x1111; // common::to_init's Q_Key

fn ud_wr(
    id: u64,
    s: &mut [ibv_sge],
    ah: *mut ibv_ah,
    qpn: u32,
    qkey: u32,
    op: ibv_wr_opcode,
) -> ibv_send_wr {
    let mut wr = send_wr(id, op, s, IBV_SEND_SIGNALED);
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = qpn;
    wr.wr.ud.remote_qkey = qkey;
    wr
}

fn ud_pair() -> Ud {
    Ud::on(Dev::new())
}

/// UD SEND and SEND_WITH_IMM: 40-byte GRH area, byte_len = 40 + payload, GRH flag, src_qp,
/// the IPv4 header in bytes 20..40 (rxe S18); init_ah_from_wc/create_ah_from_wc answer.
#[test]
fn ud_send_grh_and_reply() {
    let mut u = ud_pair();
    let ah = ah_to(&u.dev, gid(u.dev.ctx, 1));
    u.buf.fill(0, &[0xab; 100]);
    let mut r = [u.buf.sge(1000, 200)];
    assert_eq!(post_recv(u.b, 1, &mut r), 0);
    let mut r2 = [u.buf.sge(2000, 40)];
    assert_eq!(post_recv(u.b, 2, &mut r2), 0);
    let mut s = [u.buf.sge(0, 100)];
    let mut wr = ud_wr(10, &mut s, ah, qpn(u.b), QKEY, IBV_WR_SEND);
    assert_eq!(post(u.a, &mut wr), 0);
    let mut wr = ud_wr(11, &mut [], ah, qpn(u.b), QKEY, IBV_WR_SEND_WITH_IMM);
    wr.__bindgen_anon_1.imm_data = 77u32.to_be();
    assert_eq!(post(u.a, &mut wr), 0);
    let w = drain(u.cq);
    let send: Vec<_> = w
        .iter()
        .filter(|w| w.opcode == IBV_WC_SEND)
        .map(|w| (w.wr_id, w.status, w.byte_len))
        .collect();
    assert_eq!(send, vec![(10, 0, 100), (11, 0, 0)]);
    let recv: Vec<_> = w.iter().filter(|w| w.opcode == IBV_WC_RECV).collect();
    assert_eq!(recv.len(), 2);
    assert_eq!(recv[0].byte_len, 140);
    assert_eq!(recv[0].wc_flags, IBV_WC_GRH);
    assert_eq!(recv[0].src_qp, qpn(u.a));
    assert_eq!(recv[0].qp_num, qpn(u.b));
    assert_eq!(recv[1].byte_len, 40);
    assert_eq!(recv[1].wc_flags, IBV_WC_GRH | IBV_WC_WITH_IMM);
    assert_eq!(imm(recv[1]), 77u32.to_be());
    assert_eq!(u.buf.bytes(1000, 20), vec![0u8; 20]);
    assert_eq!(u.buf.get(1020), 0x45, "IPv4 header");
    assert_eq!(u.buf.bytes(1032, 4), vec![10, 77, 0, 1], "source address");
    assert_eq!(u.buf.bytes(1040, 100), vec![0xab; 100]);

    // Answer the sender from the completion.
    let mut wc = *recv[0];
    assert!(u.buf.mem.len() >= 1000 + 40);
    // SAFETY: offset 1000 is in bounds (checked); the GRH area of the completed receive.
    let grh = unsafe { u.buf.mem.as_mut_ptr().add(1000) }.cast::<ibv_grh>();
    // SAFETY: live PD; wc is the receive's completion; grh points at its 40-byte GRH.
    let reply = unsafe { fns().ibv_create_ah_from_wc.unwrap()(u.dev.pd, &mut wc, grh, 1) };
    assert!(!reply.is_null());
    let mut attr = ibv_ah_attr::default();
    assert_eq!(
        // SAFETY: as above; attr is a valid out-parameter.
        unsafe { fns().ibv_init_ah_from_wc.unwrap()(u.dev.ctx, 1, &mut wc, grh, &mut attr) },
        0
    );
    // SAFETY: every bit pattern of the gid union is a valid [u8; 16].
    let (dgid, own) = unsafe { (attr.grh.dgid.raw, gid(u.dev.ctx, 1).raw) };
    assert_eq!(dgid, own);
    let mut r = [u.buf.sge(3000, 100)];
    assert_eq!(post_recv(u.a, 3, &mut r), 0);
    let mut s = [u.buf.sge(0, 4)];
    let mut wr = ud_wr(12, &mut s, reply, wc.src_qp, QKEY, IBV_WR_SEND);
    assert_eq!(post(u.b, &mut wr), 0);
    let w = drain(u.cq);
    assert!(w
        .iter()
        .any(|w| w.wr_id == 3 && w.status == 0 && w.byte_len == 44));
    // SAFETY: reply is live and destroyed once; the send using it has completed.
    assert_eq!(unsafe { fns().ibv_destroy_ah.unwrap()(reply) }, 0);
}

/// Wrong Q_Key, unknown QPN, a GID of no device, or a message above the MTU: dropped, the
/// sender succeeds (rxe S18). Q_Key with the high bit takes the sender QP's own Q_Key
/// (Spec; rxe sends it as it is: `profiles.rs`, D1).
#[test]
fn ud_drops() {
    let u = ud_pair();
    let ah = ah_to(&u.dev, gid(u.dev.ctx, 1));
    let mut other_gid = gid(u.dev.ctx, 1);
    // SAFETY: every bit pattern of the gid union is a valid [u8; 16].
    unsafe { other_gid.raw[15] = 250 };
    let ah_nowhere = ah_to(&u.dev, other_gid);
    for i in 0..4 {
        let mut r = [u.buf.sge(4096, 2048)];
        assert_eq!(post_recv(u.b, 100 + i, &mut r), 0);
    }
    let mut s = [u.buf.sge(0, 16)];
    let mut big = [u.buf.sge(0, 1025)];
    let mut wrs = [
        ud_wr(1, &mut s, ah, qpn(u.b), 0x2222, IBV_WR_SEND),
        ud_wr(2, &mut s, ah, 0xabcdef, QKEY, IBV_WR_SEND),
        ud_wr(3, &mut s, ah_nowhere, qpn(u.b), QKEY, IBV_WR_SEND),
        ud_wr(4, &mut big, ah, qpn(u.b), QKEY, IBV_WR_SEND),
        ud_wr(5, &mut s, ah, qpn(u.b), 0x8000_0000, IBV_WR_SEND),
    ];
    assert_eq!(post_chain(u.a, &mut wrs), (0, None));
    let w = drain(u.cq);
    assert_eq!(
        ids(&w
            .iter()
            .filter(|w| w.opcode == IBV_WC_SEND)
            .copied()
            .collect::<Vec<_>>()),
        vec![(1, 0), (2, 0), (3, 0), (4, 0), (5, 0)]
    );
    let recv: Vec<u64> = w
        .iter()
        .filter(|w| w.opcode == IBV_WC_RECV)
        .map(|w| w.wr_id)
        .collect();
    // IBA: the high bit means the sender's own Q_Key; rxe sends the value as it is (issue
    // 31, D1), so in the Rxe profile nothing arrives.
    let want: Vec<u64> = if u.dev.profile() == hotverbs_softnic::Profile::Rxe {
        vec![]
    } else {
        vec![100]
    };
    assert_eq!(recv, want, "only the own-Q_Key send arrives (Spec)");
    // A NULL AH is rejected at post.
    let mut wr = ud_wr(6, &mut s, null_mut(), qpn(u.b), QKEY, IBV_WR_SEND);
    assert_eq!(post(u.a, &mut wr), libc::EINVAL);
    // create_ah without GRH -> EINVAL (RoCE).
    let mut a = ibv_ah_attr {
        is_global: 0,
        port_num: 1,
        ..Default::default()
    };
    assert!(create_ah(u.dev.pd, &mut a).is_null());
    assert_eq!(errno(), libc::EINVAL);
}

/// A UD receive shorter than 40 + payload: LOC_LEN_ERR and that UD QP goes to ERR (rxe S18);
/// the sender succeeds.
#[test]
fn ud_short_receive() {
    let u = ud_pair();
    let ah = ah_to(&u.dev, gid(u.dev.ctx, 1));
    let mut r = [u.buf.sge(4096, 64)];
    assert_eq!(post_recv(u.b, 1, &mut r), 0);
    assert_eq!(post_recv(u.b, 2, &mut r), 0);
    let mut s = [u.buf.sge(0, 100)];
    let mut wr = ud_wr(3, &mut s, ah, qpn(u.b), QKEY, IBV_WR_SEND);
    assert_eq!(post(u.a, &mut wr), 0);
    let w = drain(u.cq);
    let short = if u.dev.profile() == hotverbs_softnic::Profile::Rxe {
        IBV_WC_LOC_QP_OP_ERR // rxe S18
    } else {
        IBV_WC_LOC_LEN_ERR
    };
    assert_eq!(ids(&w), vec![(1, short), (2, IBV_WC_WR_FLUSH_ERR), (3, 0)]);
    assert_eq!(state(u.b), IBV_QPS_ERR);
    assert_eq!(state(u.a), IBV_QPS_RTS);
}

/// Multicast: every attached QP (with the right Q_Key) but the sender receives; detach
/// stops delivery; attach on RC or to a unicast GID is EINVAL.
#[test]
fn multicast() {
    let dev = Dev::new();
    let cq = dev.cq(64);
    let qps: Vec<_> = (0..4).map(|_| dev.qp(IBV_QPT_UD, cq, cq, cap(8))).collect();
    for &q in &qps {
        connect(q, dev.ctx, 0, 0, 0);
    }
    let buf = dev.buf(8192, ALL_ACCESS);
    let mut raw = [0u8; 16];
    raw[0] = 0xff;
    raw[1] = 0x0e;
    raw[15] = 7;
    let mgid = ibv_gid { raw };
    // SAFETY: q is a live QP of this test; mgid is a valid gid.
    let attach = |q: *mut ibv_qp| unsafe { fns().ibv_attach_mcast.unwrap()(q, &mgid, 0) };
    // SAFETY: as for attach.
    let detach = |q: *mut ibv_qp| unsafe { fns().ibv_detach_mcast.unwrap()(q, &mgid, 0) };
    for &q in &qps[..3] {
        assert_eq!(attach(q), 0);
    }
    for (i, &q) in qps.iter().enumerate() {
        for k in 0..2 {
            let mut r = [buf.sge(1024 * i + 512 * k, 512)];
            assert_eq!(post_recv(q, (i * 10 + k) as u64, &mut r), 0);
        }
    }
    let ah = ah_to(&dev, mgid);
    let mut s = [buf.sge(0, 8)];
    let mut wr = ud_wr(99, &mut s, ah, 0xff_ffff, QKEY, IBV_WR_SEND);
    assert_eq!(post(qps[0], &mut wr), 0);
    let mut got: Vec<u32> = drain(cq)
        .iter()
        .filter(|w| w.opcode == IBV_WC_RECV)
        .map(|w| w.qp_num)
        .collect();
    got.sort();
    let mut want = vec![qpn(qps[1]), qpn(qps[2])];
    want.sort();
    assert_eq!(got, want, "attached QPs except the sender");

    assert_eq!(detach(qps[1]), 0);
    assert_eq!(detach(qps[1]), libc::EINVAL, "not attached");
    assert_eq!(post(qps[0], &mut wr), 0);
    let got: Vec<u32> = drain(cq)
        .iter()
        .filter(|w| w.opcode == IBV_WC_RECV)
        .map(|w| w.qp_num)
        .collect();
    assert_eq!(got, vec![qpn(qps[2])]);

    let rc_cq = dev.cq(4);
    let rc = dev.qp(IBV_QPT_RC, rc_cq, rc_cq, cap(2));
    assert_eq!(attach(rc), libc::EINVAL);
    let g1 = gid(dev.ctx, 1);
    assert_eq!(
        // SAFETY: qps[3] is live; g1 is a valid gid.
        unsafe { fns().ibv_attach_mcast.unwrap()(qps[3], &g1, 0) },
        libc::EINVAL
    );
}

/// SRQ: two QPs consume one shared queue in order; post_recv on an SRQ QP is EINVAL; the
/// limit event fires once; RNR waiters resume on post_srq_recv; EBUSY while attached.
#[test]
fn srq() {
    let f = fns();
    let dev = Dev::new();
    let cq = dev.cq(64);
    let mut sia = ibv_srq_init_attr {
        srq_context: null_mut(),
        attr: ibv_srq_attr {
            max_wr: 8,
            max_sge: 2,
            srq_limit: 0,
        },
    };
    // SAFETY: dev.pd is live; sia is valid.
    let srq = unsafe { f.ibv_create_srq.unwrap()(dev.pd, &mut sia) };
    assert!(!srq.is_null());
    let mk = |with_srq: bool| {
        let mut ia = ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            srq: if with_srq { srq } else { null_mut() },
            cap: cap(8),
            qp_type: IBV_QPT_RC,
            ..Default::default()
        };
        let q = create_qp(dev.pd, &mut ia);
        assert!(!q.is_null());
        if with_srq {
            assert_eq!(ia.cap.max_recv_wr, 0);
        }
        q
    };
    let (r1, r2, s1, s2) = (mk(true), mk(true), mk(false), mk(false));
    connect(r1, dev.ctx, qpn(s1), ALL_ACCESS, 7);
    connect(s1, dev.ctx, qpn(r1), ALL_ACCESS, 7);
    connect(r2, dev.ctx, qpn(s2), ALL_ACCESS, 7);
    connect(s2, dev.ctx, qpn(r2), ALL_ACCESS, 7);
    let buf = dev.buf(4096, ALL_ACCESS);
    let mut r = [buf.sge(1024, 64)];
    assert_eq!(
        post_recv(r1, 1, &mut r),
        libc::EINVAL,
        "use ibv_post_srq_recv"
    );

    let post_srq = |id: u64| {
        let mut sge = [buf.sge(1024 + 64 * id as usize, 64)];
        let mut wr = ibv_recv_wr {
            wr_id: id,
            next: null_mut(),
            sg_list: sge.as_mut_ptr(),
            num_sge: 1,
        };
        let mut bad = null_mut();
        // SAFETY: srq is live; wr and its SGE are valid for the call (softnic copies
        // them) and describe buf's registered memory, which outlives the SRQ's use.
        unsafe { inline::ibv_post_srq_recv(srq, &mut wr, &mut bad) }
    };
    for id in 0..4 {
        assert_eq!(post_srq(id), 0);
    }
    let mut la = ibv_srq_attr {
        max_wr: 0,
        max_sge: 0,
        srq_limit: 3,
    };
    assert_eq!(
        // SAFETY: srq is live; la is valid.
        unsafe { f.ibv_modify_srq.unwrap()(srq, &mut la, IBV_SRQ_LIMIT as i32) },
        0
    );
    let mut q = ibv_srq_attr::default();
    // SAFETY: srq is live; q is a valid out-parameter.
    assert_eq!(unsafe { f.ibv_query_srq.unwrap()(srq, &mut q) }, 0);
    assert_eq!((q.max_wr, q.srq_limit), (8, 3));

    let mut s = [buf.sge(0, 8)];
    let mut wr = send_wr(50, IBV_WR_SEND, &mut s, IBV_SEND_SIGNALED);
    assert_eq!(post(s1, &mut wr), 0);
    let mut wr = send_wr(51, IBV_WR_SEND, &mut s, IBV_SEND_SIGNALED);
    assert_eq!(post(s2, &mut wr), 0);
    assert_eq!(post(s1, &mut wr), 0);
    let w = drain(cq);
    let recv: Vec<(u64, u32)> = w
        .iter()
        .filter(|w| w.opcode == IBV_WC_RECV)
        .map(|w| (w.wr_id, w.qp_num))
        .collect();
    assert_eq!(recv, vec![(0, qpn(r1)), (1, qpn(r2)), (2, qpn(r1))]);
    // 4 -> 1 posted: below the limit 3 once -> exactly one event, then disarmed.
    let ev = all_async_events(dev.ctx);
    assert_eq!(ev, vec![(IBV_EVENT_SRQ_LIMIT_REACHED, srq as usize)]);
    // SAFETY: srq is live; q is a valid out-parameter.
    assert_eq!(unsafe { f.ibv_query_srq.unwrap()(srq, &mut q) }, 0);
    assert_eq!(q.srq_limit, 0);

    // Drain the SRQ, then an RNR-waiting SEND resumes on post_srq_recv.
    assert_eq!(post(s2, &mut wr), 0);
    assert_eq!(post(s2, &mut wr), 0);
    assert_eq!(send_wrs_waiting(s2), 1);
    assert_eq!(post_srq(9), 0);
    assert_eq!(send_wrs_waiting(s2), 0);
    // Full SRQ: ENOMEM.
    for id in 10..18 {
        assert_eq!(post_srq(id), 0);
    }
    assert_eq!(post_srq(18), libc::ENOMEM);
    // SAFETY: srq is live; softnic refuses (EBUSY: QPs use it), so it stays live.
    assert_eq!(unsafe { f.ibv_destroy_srq.unwrap()(srq) }, libc::EBUSY);
    // limit above max_wr -> EINVAL
    let mut bad = ibv_srq_attr {
        max_wr: 0,
        max_sge: 0,
        srq_limit: 100,
    };
    assert_eq!(
        // SAFETY: srq is live; bad is a valid (refused) attribute.
        unsafe { f.ibv_modify_srq.unwrap()(srq, &mut bad, IBV_SRQ_LIMIT as i32) },
        libc::EINVAL
    );
}
