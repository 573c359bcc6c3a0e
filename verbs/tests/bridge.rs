//! The safe bridge: rings and pollers from `Qp`/`Cq` with no `unsafe` here, and each misuse
//! the raw datapath constructors leave to their contracts refused with a named error (a
//! ring outliving its QP does not compile: see the `compile_fail` example in `bridge.rs`).

use hotverbs::*;

struct Setup {
    ctx: Context,
    pd: Pd,
    cq: Cq,
}

fn setup(cqe: u32) -> Setup {
    let ctx = Context::open("softnic").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(cqe, None).unwrap();
    Setup { ctx, pd, cq }
}

fn rc(s: &Setup) -> Qp {
    QpBuilder::new(&s.pd, &s.cq, &s.cq, QpType::Rc)
        .max_send_wr(64)
        .max_recv_wr(64)
        .max_inline_data(64)
        .build()
        .unwrap()
}

fn connected(s: &Setup) -> (Qp, Qp) {
    let (a, b) = (rc(s), rc(s));
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
    let s = setup(256);
    let (a, b) = connected(&s);
    let mut region = s.pd.alloc_mr(64 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut tx = a
        .send_ring::<64>(SendConfig::new(0, 64, 64).signal_every(16).batch(16))
        .unwrap();
    let mut rx = b
        .recv_ring::<64>(&mut region, 0, RecvConfig::new(0, 64, 64))
        .unwrap();
    assert_ne!(
        tx.ring_id(),
        rx.ring_id(),
        "ids assigned per CQ never collide"
    );
    rx.fill().unwrap();
    let mut poller = s.cq.poller::<32>().unwrap();
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
                let m = rx.on_completion(c).unwrap();
                got.push(u32::from_le_bytes(rx.data(&m).unwrap().try_into().unwrap()));
                rx.release(m).unwrap();
            }
        }
    }
    assert_eq!(got, (0..1000).collect::<Vec<_>>(), "in order, each once");
    // The ring borrows the region exclusively (no slice of it while the ring lives); once
    // the ring is gone the region stays leased to b while its receives may be posted.
    drop(rx);
    assert_eq!(region.as_slice().unwrap_err().errno(), libc::EBUSY);
}

#[test]
fn one_ring_per_send_queue_and_per_receive_queue() {
    let s = setup(256);
    let (a, _b) = connected(&s);
    {
        let _first = a.send_ring::<16>(SendConfig::new(0, 16, 64)).unwrap();
        errno(
            a.send_ring::<16>(SendConfig::new(0, 16, 64)),
            "SendRing",
            libc::EBUSY,
        );
    }
    // For the QP's life: a new ring would take the old one's late completions for its own.
    errno(
        a.send_ring::<16>(SendConfig::new(0, 16, 64)),
        "SendRing",
        libc::EBUSY,
    );
    let mut region = s.pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    // The first ring borrows its region exclusively: the second one asks with another.
    let mut other = s.pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let _rx = a
        .recv_ring::<8>(&mut region, 0, RecvConfig::new(0, 64, 8))
        .unwrap();
    errno(
        a.recv_ring::<8>(&mut other, 0, RecvConfig::new(0, 64, 8)),
        "RecvRing",
        libc::EBUSY,
    );
}

#[test]
fn an_oversubscribed_cq_is_refused() {
    // 63 = 2^6 - 1: the same capacity on every softnic profile (rxe rounds a CQ up to
    // 2^k - 1, fault-truth G12, so a CQ of 40 would hold 63 there).
    let s = setup(63);
    let (a, b) = connected(&s);
    {
        let _ra = a.send_ring::<32>(SendConfig::new(0, 32, 64)).unwrap();
        // 32 of 63 reserved: a second ring of 32 could overflow the CQ.
        let e = errno(
            b.send_ring::<32>(SendConfig::new(0, 32, 64)),
            "SendRing",
            libc::ENOSPC,
        );
        assert!(e.to_string().contains("63"), "{e}");
        // The refusal took nothing: a ring that fits still goes through.
        let _rb = b.send_ring::<8>(SendConfig::new(0, 8, 64)).unwrap();
    }
    // Reservations end with the QP.
    drop(a);
    let c = rc(&s);
    let _rc = c.send_ring::<32>(SendConfig::new(0, 32, 64)).unwrap();
}

#[test]
fn one_poller_per_cq_and_no_setup_polling_beside_it() {
    let s = setup(16);
    let p = s.cq.poller::<8>().unwrap();
    errno(s.cq.poller::<8>(), "CqPoller", libc::EBUSY);
    let mut wc = [Wc::default(); 4];
    errno(s.cq.poll(&mut wc), "ibv_poll_cq", libc::EBUSY);
    drop(p);
    assert_eq!(s.cq.poll(&mut wc).unwrap(), 0);
    let _again = s.cq.poller::<8>().unwrap();
}

#[test]
fn rings_check_what_the_raw_contracts_assume() {
    let s = setup(256);
    let signal_all = QpBuilder::new(&s.pd, &s.cq, &s.cq, QpType::Rc)
        .sq_sig_all(true)
        .build()
        .unwrap();
    errno(
        signal_all.send_ring::<8>(SendConfig::new(0, 8, 0)),
        "SendRing",
        libc::EINVAL,
    );
    let small = QpBuilder::new(&s.pd, &s.cq, &s.cq, QpType::Rc)
        .max_send_wr(8)
        .max_inline_data(16)
        .build()
        .unwrap();
    errno(
        small.send_ring::<16>(SendConfig::new(0, 16, 0)),
        "SendRing",
        libc::EINVAL,
    );
    errno(
        small.send_ring::<8>(SendConfig::new(0, 8, 64)),
        "SendRing",
        libc::EINVAL,
    );
    // A refused ring leaves the queue free.
    let _ok = small.send_ring::<8>(SendConfig::new(0, 8, 16)).unwrap();
    let ud = QpBuilder::new(&s.pd, &s.cq, &s.cq, QpType::Ud)
        .build()
        .unwrap();
    errno(
        ud.send_ring::<8>(SendConfig::new(0, 8, 0)),
        "SendRing",
        libc::EINVAL,
    );
    let mut region = s.pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
    errno(
        rc(&s).recv_ring::<8>(&mut region, 0, RecvConfig::new(0, 64, 8)),
        "RecvRing",
        libc::EINVAL,
    );
}

#[test]
fn ud_ring_sends_to_its_address_handle() {
    let s = setup(64);
    let port = s.ctx.port_info(None, None).unwrap();
    let ud = |inline| {
        let q = QpBuilder::new(&s.pd, &s.cq, &s.cq, QpType::Ud)
            .max_inline_data(inline)
            .build()
            .unwrap();
        q.connect(&port, &q.endpoint(&port), &ConnectOptions::default())
            .unwrap();
        q
    };
    let (a, b) = (ud(64), ud(0));
    let mut region = s.pd.alloc_mr(8 * 1100, AccessFlags::LOCAL_WRITE).unwrap();
    let mut rx = b
        .recv_ring::<8>(&mut region, 0, RecvConfig::new(0, 1100, 8))
        .unwrap();
    rx.fill().unwrap();
    let ah =
        s.pd.create_ah(&AhAttr::gid(
            port.gid,
            port.gid_index.unwrap_or(0) as u8,
            port.port,
        ))
        .unwrap();
    let qkey = b.query().unwrap().qkey();
    let mut tx = a
        .send_ring_ud::<8>(
            &ah,
            b.qp_num(),
            qkey,
            SendConfig::new(0, 8, 64).signal_every(1),
        )
        .unwrap();
    tx.send_now(Msg::send(Local::Inline(b"datagram"))).unwrap();
    let mut poller = s.cq.poller::<8>().unwrap();
    let mut seen = 0;
    while seen < 2 {
        for c in poller.poll().unwrap() {
            if c.ring() == tx.ring_id() {
                assert_eq!(tx.on_completion(c), Ok(1));
            } else {
                let m = rx.on_completion(c).unwrap();
                assert_eq!(
                    &rx.data(&m).unwrap()[40..],
                    b"datagram",
                    "after the 40-byte GRH"
                );
                rx.release(m).unwrap();
            }
            seen += 1;
        }
    }
}

#[test]
fn reservations_are_visible_to_raw_posters() {
    let s = setup(64);
    let (a, b) = connected(&s);
    assert_eq!(s.cq.reserved_by_rings(), 0);
    let mut region = s.pd.alloc_mr(16 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let after_tx = {
        let _tx = a
            .send_ring::<16>(SendConfig::new(0, 16, 64).signal_every(4))
            .unwrap();
        let after_tx = s.cq.reserved_by_rings();
        assert!(after_tx > 0 && after_tx <= 16, "{after_tx}");
        let _rx = b
            .recv_ring::<16>(&mut region, 0, RecvConfig::new(0, 64, 16))
            .unwrap();
        assert_eq!(s.cq.reserved_by_rings(), after_tx + 16);
        after_tx
    };
    // Reservations live as long as the QPs (one ring per queue for the QP's life).
    assert_eq!(s.cq.reserved_by_rings(), after_tx + 16);
    drop((a, b));
    assert_eq!(s.cq.reserved_by_rings(), 0);
}
