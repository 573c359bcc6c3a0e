//! The safe bridge for extended verbs: `Qp::wr_ring` and `Cq::ex_poller` on softnic (both
//! profiles: run with `HOTVERBS_SOFTNIC_PROFILE=rxe` too), with no `unsafe` here.

use hotverbs::*;

struct Setup {
    ctx: Context,
    pd: Pd,
    cq: Cq,
}

fn setup(cqe: u32, fields: WcFields) -> Setup {
    let ctx = Context::open("softnic").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = CqBuilder::new(&ctx, cqe).wc_fields(fields).build().unwrap();
    Setup { ctx, pd, cq }
}

fn ex_rc(s: &Setup) -> Qp {
    QpBuilder::new(&s.pd, &s.cq, &s.cq, QpType::Rc)
        .send_ops(SendOps::SEND | SendOps::RDMA_WRITE)
        .max_send_wr(64)
        .max_recv_wr(64)
        .max_inline_data(64)
        .build()
        .unwrap()
}

fn connected(s: &Setup) -> (Qp, Qp) {
    let (a, b) = (ex_rc(s), ex_rc(s));
    let port = s.ctx.port_info(None, None).unwrap();
    Qp::connect_pair(&a, &b, &port, &ConnectOptions::default()).unwrap();
    (a, b)
}

fn errno<T: std::fmt::Debug>(r: Result<T>, verb: &str, errno: i32) -> Error {
    let e = r.expect_err("must be refused");
    assert_eq!((e.verb(), e.errno()), (verb, errno), "{e}");
    assert!(e.hint().is_some(), "the error says what to do: {e}");
    e
}

#[test]
fn inline_traffic_end_to_end_without_unsafe() {
    let s = setup(256, WcFields::BYTE_LEN | WcFields::QP_NUM);
    let (a, b) = connected(&s);
    let mut region = s.pd.alloc_mr(64 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut tx = a
        .wr_ring(SendConfig::new(0, 64, 64).signal_every(16).batch(16))
        .unwrap();
    let mut rx = b
        .recv_ring::<64>(&mut region, 0, RecvConfig::new(0, 64, 64))
        .unwrap();
    assert_ne!(tx.ring_id(), rx.ring_id());
    rx.fill().unwrap();
    let mut poller =
        s.cq.ex_poller::<32>(ExFields::BYTE_LEN | ExFields::QP_NUM)
            .unwrap();
    assert!(!poller.is_one_per_poll(), "softnic polls in batches");
    let mut sent = 0u32;
    let mut got = Vec::new();
    while got.len() < 1000 {
        if sent < 1000 && rx.posted() > 0 {
            let msg = sent.to_le_bytes();
            match tx.send_now(Msg::send(Local::Inline(&msg))) {
                Ok(_) => sent += 1,
                Err(SendError::WouldBlock) => {}
                Err(e) => panic!("{e}"),
            }
        }
        for c in poller.poll().unwrap() {
            if c.ring() == tx.ring_id() {
                tx.on_completion(c).unwrap();
            } else {
                assert_eq!(c.qp_num(), b.qp_num());
                let m = rx.on_completion(c).unwrap();
                got.push(u32::from_le_bytes(rx.data(&m).unwrap().try_into().unwrap()));
                rx.release(m).unwrap();
            }
        }
    }
    assert_eq!(got, (0..1000).collect::<Vec<_>>(), "in order, each once");
}

#[test]
fn a_send_ring_and_a_wr_ring_cannot_share_a_send_queue() {
    let s = setup(256, WcFields::BYTE_LEN);
    let (a, b) = connected(&s);
    {
        let _w = a.wr_ring(SendConfig::new(0, 16, 64)).unwrap();
        errno(
            a.send_ring::<16>(SendConfig::new(0, 16, 64)),
            "SendRing",
            libc::EBUSY,
        );
        errno(a.wr_ring(SendConfig::new(0, 16, 64)), "WrRing", libc::EBUSY);
    }
    let _s = b.send_ring::<16>(SendConfig::new(0, 16, 64)).unwrap();
    errno(b.wr_ring(SendConfig::new(0, 16, 64)), "WrRing", libc::EBUSY);
}

#[test]
fn an_oversubscribed_cq_is_refused_and_a_legacy_qp_or_cq_named() {
    let s = setup(48, WcFields::BYTE_LEN);
    let (a, b) = connected(&s);
    let cap = s.cq.capacity();
    let _w = a.wr_ring(SendConfig::new(0, 32, 64)).unwrap();
    assert_eq!(s.cq.reserved_by_rings(), 32);
    let e = errno(
        b.wr_ring(SendConfig::new(0, cap - 31, 64)),
        "WrRing",
        libc::ENOSPC,
    );
    assert!(e.to_string().contains("reserve"), "{e}");
    // Refused without taking the send queue: a fitting ring is still accepted.
    let _w2 = b.wr_ring(SendConfig::new(0, 8, 64)).unwrap();

    let legacy = QpBuilder::new(&s.pd, &s.cq, &s.cq, QpType::Rc)
        .build()
        .unwrap();
    let e = errno(
        legacy.wr_ring(SendConfig::new(0, 8, 0)),
        "WrRing",
        libc::EINVAL,
    );
    assert!(e.to_string().contains("QpBuilder::send_ops"), "{e}");
    let plain = s.ctx.create_cq(16, None).unwrap();
    let e = errno(
        plain.ex_poller::<4>(ExFields::NONE),
        "ExCqPoller",
        libc::EINVAL,
    );
    assert!(e.to_string().contains("CqBuilder::wc_fields"), "{e}");
    // The send queue stays with its ring.
    errno(a.wr_ring(SendConfig::new(0, 8, 64)), "WrRing", libc::EBUSY);
}

#[test]
fn inline_above_the_qps_limit_is_refused() {
    let s = setup(256, WcFields::BYTE_LEN);
    let (a, _b) = connected(&s);
    let e = errno(
        a.wr_ring(SendConfig::new(0, 8, 4096)),
        "WrRing",
        libc::EINVAL,
    );
    assert!(e.to_string().contains("max_inline_data"), "{e}");
    // The refusal took nothing.
    let _w = a.wr_ring(SendConfig::new(0, 8, 64)).unwrap();
}

#[test]
fn wrong_fields_are_refused_by_name_and_one_poller_per_cq() {
    // Rings check every completion's QP number: a CQ without it is refused by name.
    let no_qpn = setup(64, WcFields::BYTE_LEN);
    let e = errno(
        no_qpn.cq.ex_poller::<4>(ExFields::BYTE_LEN),
        "ExCqPoller",
        libc::EINVAL,
    );
    assert!(e.to_string().contains("QP_NUM"), "{e}");
    let s = setup(64, WcFields::BYTE_LEN | WcFields::QP_NUM);
    let e = errno(
        s.cq.ex_poller::<4>(ExFields::BYTE_LEN | ExFields::SRC_QP),
        "ExCqPoller",
        libc::EINVAL,
    );
    assert!(e.to_string().contains("SRC_QP"), "{e}");
    let msg = e.to_string();
    let named = msg.split("(the CQ has").next().unwrap();
    assert!(!named.contains("BYTE_LEN"), "only the missing ones: {e}");
    let p = s.cq.ex_poller::<4>(ExFields::BYTE_LEN).unwrap();
    errno(
        s.cq.ex_poller::<4>(ExFields::BYTE_LEN),
        "ExCqPoller",
        libc::EBUSY,
    );
    errno(s.cq.poller::<4>(), "CqPoller", libc::EBUSY);
    drop(p);
    let _p = s.cq.poller::<4>().unwrap();
}

#[test]
fn timestamps_readable_in_spec_and_refused_by_name_in_rxe() {
    let ctx = Context::open("softnic").unwrap();
    let r = CqBuilder::new(&ctx, 64)
        .wc_fields(WcFields::COMPLETION_TIMESTAMP | WcFields::QP_NUM)
        .build();
    if !ctx.supports_completion_timestamps().unwrap() {
        let e = r.expect_err("rxe has no completion timestamps");
        assert_eq!(e.errno(), libc::EOPNOTSUPP, "{e}");
        assert!(e.to_string().contains("COMPLETION_TIMESTAMP"), "{e}");
        // And a poller asking for them on a CQ without them names them.
        let cq = CqBuilder::new(&ctx, 64)
            .wc_fields(WcFields::QP_NUM)
            .build()
            .unwrap();
        let e = errno(
            cq.ex_poller::<4>(ExFields::COMPLETION_TS),
            "ExCqPoller",
            libc::EINVAL,
        );
        assert!(e.to_string().contains("COMPLETION_TS"), "{e}");
        return;
    }
    let cq = r.unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mk = || {
        QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
            .send_ops(SendOps::SEND)
            .max_inline_data(64)
            .build()
            .unwrap()
    };
    let (a, b) = (mk(), mk());
    Qp::connect_pair(
        &a,
        &b,
        &ctx.port_info(None, None).unwrap(),
        &ConnectOptions::default(),
    )
    .unwrap();
    let mut region = pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
    let mut rx = b
        .recv_ring::<4>(&mut region, 0, RecvConfig::new(0, 64, 4))
        .unwrap();
    rx.fill().unwrap();
    let mut tx = a
        .wr_ring(SendConfig::new(0, 8, 64).signal_every(1))
        .unwrap();
    let mut p = cq
        .ex_poller::<8>(ExFields::COMPLETION_TS | ExFields::QP_NUM)
        .unwrap();
    tx.send_now(Msg::send(Local::Inline(b"ts"))).unwrap();
    let mut stamps = Vec::new();
    while stamps.len() < 2 {
        let (wcs, ts) = p.poll_ts().unwrap();
        for (c, t) in wcs.iter_mut().zip(ts) {
            stamps.push(*t);
            if c.ring() == tx.ring_id() {
                tx.on_completion(c).unwrap();
            } else {
                let m = rx.on_completion(c).unwrap();
                rx.release(m).unwrap();
            }
        }
    }
    assert!(stamps.iter().all(|&t| t != 0), "{stamps:?}");
}
