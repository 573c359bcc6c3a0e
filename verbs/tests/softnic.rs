//! The setup layer on the software device: every builder path and transition (valid and
//! invalid, with the error each returns), MR access violations, UD with AHs, SRQ,
//! multicast, completion channels, async events and object lifetimes. (Teardown in any drop
//! order, checked through the process-wide `take_drop_errors`, is in its own binary:
//! `tests/teardown_order.rs`.)

use std::time::Duration;

use hotverbs::*;

const T: Duration = Duration::from_secs(5);

fn ctx() -> Context {
    Context::open("softnic").expect("softnic always opens")
}

/// A softnic device with the man-page behaviour whatever `HOTVERBS_SOFTNIC_PROFILE` says:
/// for tests of what hotverbs makes of a Spec-only event or status (softnic's own
/// `tests/profiles.rs` checks rxe's side of each row).
fn spec_ctx() -> Context {
    Context::open_softnic_with(SoftnicConfig {
        profile: hotverbs_softnic::Profile::Spec,
        ..Default::default()
    })
    .expect("softnic always opens")
}

struct Pair {
    ctx: Context,
    pd: Pd,
    cq_a: Cq,
    cq_b: Cq,
    a: Qp,
    b: Qp,
}

fn pair(ty: QpType) -> Pair {
    pair_on(ctx(), ty)
}

fn pair_on(ctx: Context, ty: QpType) -> Pair {
    let pd = ctx.alloc_pd().unwrap();
    let cq_a = ctx.create_cq(64, None).unwrap();
    let cq_b = ctx.create_cq(64, None).unwrap();
    let a = QpBuilder::new(&pd, &cq_a, &cq_a, ty)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &cq_b, &cq_b, ty)
        .max_inline_data(64)
        .build()
        .unwrap();
    let port = ctx.port_info(None, None).unwrap();
    a.connect(&port, &b.endpoint(&port), &ConnectOptions::default())
        .unwrap();
    b.connect(&port, &a.endpoint(&port), &ConnectOptions::default())
        .unwrap();
    Pair {
        ctx,
        pd,
        cq_a,
        cq_b,
        a,
        b,
    }
}

fn rw() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

fn no_completion(cq: &Cq) {
    let mut wc = [Wc::default(); 4];
    assert_eq!(
        cq.poll(&mut wc).unwrap(),
        0,
        "unexpected completion {:?}",
        wc[0]
    );
}

// ---------------------------------------------------------------------------------------
// Devices, ports, GIDs
// ---------------------------------------------------------------------------------------

#[test]
fn softnic_is_listed_and_opens_by_name() {
    let report = devices_report();
    let soft: Vec<_> = report
        .devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Softnic)
        .collect();
    assert_eq!(soft.len(), 1);
    assert_eq!(soft[0].name, "softnic");
    // This machine's kernel has no RDMA: libibverbs (if installed) lists nothing and that
    // is not an error.
    if hotverbs_ffi::ibverbs().is_ok() {
        assert!(
            report.real_unavailable.is_none(),
            "{:?}",
            report.real_unavailable
        );
    } else {
        assert!(report.real_unavailable.unwrap().contains("libibverbs.so.1"));
    }
    let c = ctx();
    assert_eq!(c.name(), "softnic");
    assert_eq!(c.kind(), DeviceKind::Softnic);
    assert!(!c.as_raw().is_null());
    c.close().unwrap();
}

#[test]
fn unknown_device_is_enodev_listing_the_devices() {
    let e = Context::open("mlx5_99").unwrap_err();
    assert_eq!(e.errno(), libc::ENODEV);
    assert_eq!(e.verb(), "ibv_open_device");
    let msg = e.to_string();
    assert!(msg.contains("mlx5_99") && msg.contains("softnic"), "{msg}");
}

#[test]
fn query_device_port_gid_pkey() {
    let c = ctx();
    let d = c.query_device().unwrap();
    assert_eq!(d.phys_port_cnt(), 1);
    assert!(d.max_qp_wr() > 0 && d.max_sge() > 0 && d.max_cqe() > 0);
    let p = c.query_port(1).unwrap();
    assert!(p.is_active());
    assert_eq!(p.active_mtu(), Mtu::Mtu1024);
    assert_eq!(p.link_layer(), LinkLayer::Ethernet);
    assert!(c.query_port(2).is_err(), "softnic has one port");
    assert_eq!(c.default_port().unwrap(), 1);
    assert_eq!(c.query_pkey(1, 0).unwrap(), 0xffff);

    let table = c.gid_table(1).unwrap();
    let v2 = table
        .iter()
        .find(|e| e.index == 1)
        .expect("GID 1 is the RoCE v2 IPv4 GID");
    assert_eq!(v2.gid_type, GidType::RoceV2);
    assert!(v2.gid.ipv4().is_some(), "{}", v2.gid);
    assert_eq!(c.query_gid(1, 1).unwrap(), v2.gid);
    assert_eq!(c.query_gid_entry(1, 1).unwrap().gid, v2.gid);
    // The default on Ethernet is the RoCE v2 IPv4-mapped GID.
    assert_eq!(c.default_gid_index(1).unwrap(), Some(1));
    let info = c.port_info(None, None).unwrap();
    assert_eq!((info.port, info.gid_index, info.gid), (1, Some(1), v2.gid));
    assert_eq!(info.active_mtu, Mtu::Mtu1024);
    // An empty or out-of-range entry is an error naming the verb.
    let e = c.query_gid_entry(1, 15).unwrap_err();
    assert_eq!(e.verb(), "ibv_query_gid_ex");
}

#[test]
fn custom_softnic_limits_show_in_errors() {
    let c = Context::open_softnic_with(SoftnicConfig {
        name: "softnic-small".into(),
        max_qp_wr: 32,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(c.query_device().unwrap().max_qp_wr(), 32);
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(64, None).unwrap();
    let e = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .max_send_wr(64)
        .build()
        .unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_create_qp", libc::EINVAL));
    assert!(
        e.to_string()
            .contains("max_send_wr 64 > device max_qp_wr 32"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------
// PD, MR, lifetimes
// ---------------------------------------------------------------------------------------

/// No safe slice over memory a peer can write; the copy helpers work on every MR.
#[test]
fn mr_slices_only_without_remote_write_and_copy_helpers() {
    let c = ctx();
    let pd = c.alloc_pd().unwrap();
    for access in [
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
    ] {
        let mut mr = pd.alloc_mr(64, access).unwrap();
        assert!(mr.is_remote_writable());
        let e = mr.as_slice().unwrap_err();
        assert_eq!((e.verb(), e.errno()), ("Mr::as_slice", libc::EACCES));
        assert!(e.to_string().contains("read_into"), "{e}");
        assert_eq!(mr.as_mut_slice().unwrap_err().errno(), libc::EACCES);
    }
    let mut local = pd
        .alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    assert!(!local.is_remote_writable());
    local.as_mut_slice().unwrap()[5] = 9;
    assert_eq!(local.as_slice().unwrap()[5], 9);

    // Copies straddling the 8-byte words, both ways, agree with the slice view.
    let data: Vec<u8> = (1..=29).collect();
    local.write_from(3, &data).unwrap();
    assert_eq!(&local.as_slice().unwrap()[3..32], &data[..]);
    assert_eq!(local.read_vec(3, 29).unwrap(), data);
    let mut out = [0u8; 10];
    local.read_into(0, &mut out).unwrap();
    assert_eq!(out, [0, 0, 0, 1, 2, 3, 4, 5, 6, 7]);
    assert!(local.read_into(60, &mut out).is_err());
    assert!(local.write_from(usize::MAX, b"x").is_err());
    assert!(local.read_vec(64, 1).is_err());
    assert!(local.read_vec(64, 0).unwrap().is_empty());

    // Atomic words: aligned and in bounds only.
    local.write_u64(56, 0x0102_0304_0506_0708).unwrap();
    assert_eq!(local.read_u64(56).unwrap(), 0x0102_0304_0506_0708);
    assert_eq!(
        &local.as_slice().unwrap()[56..64],
        &0x0102_0304_0506_0708u64.to_ne_bytes()
    );
    assert_eq!(local.read_u64(4).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(local.read_u64(64).unwrap_err().errno(), libc::EINVAL);
    assert!(local.write_u64(60, 1).is_err());
}

#[test]
fn mr_over_borrowed_and_owned_memory() {
    let c = ctx();
    let pd = c.alloc_pd().unwrap();
    let mut mem = vec![7u8; 1000];
    // Remote access over borrowed memory only for the length of a scope (a forgotten Mr
    // would leave the rkey live after the borrow ended).
    assert_eq!(pd.reg_mr(&mut mem, rw()).unwrap_err().errno(), libc::EINVAL);
    let rkey = pd
        .scoped_mr(&mut mem, rw(), |mr| {
            assert_eq!(mr.len(), 1000);
            assert_eq!(mr.read_vec(999, 1).unwrap(), [7]);
            assert_eq!(mr.remote().rkey, mr.rkey());
            assert_eq!(mr.local(10, 20).unwrap().addr, mr.addr() + 10);
            assert!(mr.local(990, 11).is_err());
            assert!(mr.local(usize::MAX, 2).is_err());
            mr.rkey()
        })
        .unwrap();
    assert_ne!(rkey, 0);
    mem[0] = 1; // borrow ended with the scope
    let mr = pd.reg_mr(&mut mem, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(mr.as_slice().unwrap()[0], 1);
    mr.destroy().unwrap();

    let owned = pd.alloc_mr(5000, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(owned.addr() % 4096, 0);
    assert!(owned.as_slice().unwrap().iter().all(|&b| b == 0));
    // Huge pages when available, normal pages with the flag saying so otherwise.
    let huge = pd
        .alloc_mr_with(4096, AccessFlags::LOCAL_WRITE, true)
        .unwrap();
    assert_eq!(huge.addr() % 4096, 0);
    if huge.is_huge() {
        assert_eq!(huge.addr() % (2 << 20), 0);
    }
}

#[test]
fn remote_write_without_local_write_is_einval_with_hint() {
    let c = ctx();
    let pd = c.alloc_pd().unwrap();
    let e = pd.alloc_mr(64, AccessFlags::REMOTE_WRITE).unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_reg_mr", libc::EINVAL));
    assert!(e.to_string().contains("need LOCAL_WRITE"), "{e}");
}

// ---------------------------------------------------------------------------------------
// QP builder
// ---------------------------------------------------------------------------------------

#[test]
fn builder_every_type_and_cap() {
    let c = ctx();
    let pd = c.alloc_pd().unwrap();
    let scq = c.create_cq(128, None).unwrap();
    let rcq = c.create_cq(128, None).unwrap();
    for ty in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let qp = QpBuilder::new(&pd, &scq, &rcq, ty)
            .max_send_wr(100)
            .max_recv_wr(50)
            .max_send_sge(3)
            .max_recv_sge(2)
            .max_inline_data(128)
            .build()
            .unwrap();
        let cap = qp.cap();
        assert!(cap.max_send_wr >= 100 && cap.max_recv_wr >= 50);
        assert!(cap.max_send_sge >= 3 && cap.max_recv_sge >= 2);
        assert!(cap.max_inline_data >= 128);
        assert_eq!(qp.qp_type(), ty);
        assert_eq!(qp.send_cq().as_raw(), scq.as_raw());
        assert_eq!(qp.recv_cq().as_raw(), rcq.as_raw());
        let a = qp.query().unwrap();
        assert_eq!(a.state(), QpState::Reset);
        assert_eq!(a.qp_type(), Some(ty));
        assert!(!a.sq_sig_all(), "selective signaling by default");
        assert!(qp.local_psn() <= 0xff_ffff);
    }
    let sig = QpBuilder::new(&pd, &scq, &rcq, QpType::Rc)
        .sq_sig_all(true)
        .build()
        .unwrap();
    assert!(sig.query().unwrap().sq_sig_all());
}

#[test]
fn builder_rejects_caps_beyond_the_device() {
    let c = ctx();
    let max_sge = c.query_device().unwrap().max_sge() as u32;
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(16, None).unwrap();
    let e = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .max_send_sge(max_sge + 1)
        .build()
        .unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_create_qp", libc::EINVAL));
    assert!(e.to_string().contains("max_sge"), "{e}");
    let e = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .max_inline_data(1 << 20)
        .build()
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(e.to_string().contains("max_inline_data"), "{e}");
    let e = c.create_cq(0, None).unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_create_cq", libc::EINVAL));
    assert!(e.to_string().contains("max_cqe"), "{e}");
}

#[test]
fn srq_attachment_routes_receives_to_the_srq() {
    let c = ctx();
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(64, None).unwrap();
    let srq = pd.create_srq(32, 1).unwrap();
    assert!(srq.query().unwrap().max_wr >= 32);
    // Two senders, two receivers sharing one SRQ.
    let port = c.port_info(None, None).unwrap();
    let r1 = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .srq(&srq)
        .build()
        .unwrap();
    let r2 = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .srq(&srq)
        .build()
        .unwrap();
    assert_eq!(r1.cap().max_recv_wr, 0);
    let s1 = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    let s2 = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    let o = ConnectOptions::default();
    for (s, r) in [(&s1, &r1), (&s2, &r2)] {
        s.connect(&port, &r.endpoint(&port), &o).unwrap();
        r.connect(&port, &s.endpoint(&port), &o).unwrap();
    }
    let rx = pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
    let mut tx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    tx.write_from(0, b"s1").unwrap();
    tx.write_from(32, b"s2").unwrap();
    // SAFETY: rx/tx stay registered and unread until the completions below.
    unsafe {
        let e = r1.post_recv(9, &[rx.local(0, 64).unwrap()]).unwrap_err();
        assert!(e.to_string().contains("post receives to the SRQ"), "{e}");
        srq.post_recv(100, &[rx.local(0, 128).unwrap()]).unwrap();
        srq.post_recv(101, &[rx.local(128, 128).unwrap()]).unwrap();
        s1.post_send(&SendWr::send(1, &[tx.local(0, 2).unwrap()]).signaled())
            .unwrap();
        s2.post_send(&SendWr::send(2, &[tx.local(32, 2).unwrap()]).signaled())
            .unwrap();
    }
    let mut recvs = Vec::new();
    for _ in 0..4 {
        let wc = cq.wait_one(T).unwrap().ok().unwrap();
        if wc.opcode() == hotverbs_ffi::IBV_WC_RECV {
            recvs.push((wc.wr_id(), wc.qp_num()));
        }
    }
    recvs.sort();
    assert_eq!(recvs, [(100, r1.qp_num()), (101, r2.qp_num())]);
    assert_eq!(rx.read_vec(0, 2).unwrap(), b"s1");
    assert_eq!(rx.read_vec(128, 2).unwrap(), b"s2");
}

#[test]
fn srq_limit_raises_async_event() {
    let c = ctx();
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(64, None).unwrap();
    let srq = pd.create_srq(16, 1).unwrap();
    let port = c.port_info(None, None).unwrap();
    let r = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .srq(&srq)
        .build()
        .unwrap();
    let s = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    s.connect(&port, &r.endpoint(&port), &ConnectOptions::default())
        .unwrap();
    r.connect(&port, &s.endpoint(&port), &ConnectOptions::default())
        .unwrap();
    let rx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let tx = pd.alloc_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
    // SAFETY: buffers untouched until completions.
    unsafe {
        srq.post_recv(1, &[rx.local(0, 32).unwrap()]).unwrap();
        srq.post_recv(2, &[rx.local(32, 32).unwrap()]).unwrap();
    }
    assert!(srq.arm_limit(100).is_err(), "limit above max_wr");
    srq.arm_limit(2).unwrap();
    assert!(c
        .wait_async_event(Duration::from_millis(10))
        .unwrap()
        .is_none());
    // SAFETY: as above.
    unsafe {
        s.post_send(&SendWr::send(3, &[tx.sge()]).signaled())
            .unwrap()
    };
    let ev = c.wait_async_event(T).unwrap().expect("SRQ limit event");
    assert_eq!(ev.name, "IBV_EVENT_SRQ_LIMIT_REACHED");
    assert_eq!(ev.element, AsyncElement::Srq(srq.as_raw()));
}

// ---------------------------------------------------------------------------------------
// State machine
// ---------------------------------------------------------------------------------------

#[test]
fn rc_transitions_carry_every_parameter() {
    let c = ctx();
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(16, None).unwrap();
    let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    let peer = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    let info = c.port_info(None, None).unwrap();

    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    qp.to_init(&InitAttr {
        port: 1,
        pkey_index: 0,
        access,
        qkey: 0,
    })
    .unwrap();
    let a = qp.query().unwrap();
    assert_eq!(a.state(), QpState::Init);
    assert_eq!(a.port(), 1);
    assert_eq!(a.access(), access);

    qp.to_rtr(&RtrAttr {
        path_mtu: Mtu::Mtu512,
        dest_qpn: peer.qp_num(),
        rq_psn: 0x1234,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 9,
        ah: AhAttr::gid(info.gid, 1, 1),
    })
    .unwrap();
    let a = qp.query().unwrap();
    assert_eq!(a.state(), QpState::Rtr);
    assert_eq!(a.path_mtu(), Some(Mtu::Mtu512));
    assert_eq!(a.dest_qpn(), peer.qp_num());
    assert_eq!(a.rq_psn(), 0x1234);
    assert_eq!(a.max_dest_rd_atomic(), 4);
    assert_eq!(a.min_rnr_timer(), 9);
    assert_eq!(
        AhAttr::from_raw(&a.as_raw().ah_attr).grh.unwrap().dgid,
        info.gid
    );

    qp.to_rts(&RtsAttr {
        timeout: 10,
        retry_cnt: 5,
        rnr_retry: 3,
        sq_psn: 0x4321,
        max_rd_atomic: 2,
    })
    .unwrap();
    let a = qp.query().unwrap();
    assert_eq!(a.state(), QpState::Rts);
    assert_eq!((a.timeout(), a.retry_cnt(), a.rnr_retry()), (10, 5, 3));
    assert_eq!((a.sq_psn(), a.max_rd_atomic()), (0x4321, 2));
    assert_eq!(qp.tracked_state(), QpState::Rts);

    qp.to_error().unwrap();
    assert_eq!(qp.query().unwrap().state(), QpState::Err);
    qp.reset().unwrap();
    assert_eq!(qp.query().unwrap().state(), QpState::Reset);
    // And it connects again after a reset.
    qp.connect(&info, &peer.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    assert_eq!(qp.query().unwrap().state(), QpState::Rts);
    // connect() from a non-RESET state resets first.
    qp.connect(&info, &peer.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    assert_eq!(qp.query().unwrap().sq_psn(), qp.local_psn());
}

#[test]
fn uc_and_ud_transitions() {
    let c = ctx();
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(16, None).unwrap();
    let info = c.port_info(None, None).unwrap();

    let uc = QpBuilder::new(&pd, &cq, &cq, QpType::Uc).build().unwrap();
    uc.to_init(&InitAttr {
        access: AccessFlags::REMOTE_WRITE,
        ..Default::default()
    })
    .unwrap();
    uc.to_rtr(&RtrAttr {
        dest_qpn: 0x42,
        rq_psn: 7,
        ah: AhAttr::gid(info.gid, 1, 1),
        ..Default::default()
    })
    .unwrap();
    uc.to_rts(&RtsAttr {
        sq_psn: 9,
        ..Default::default()
    })
    .unwrap();
    let a = uc.query().unwrap();
    assert_eq!(
        (a.state(), a.dest_qpn(), a.sq_psn()),
        (QpState::Rts, 0x42, 9)
    );

    let ud = QpBuilder::new(&pd, &cq, &cq, QpType::Ud).build().unwrap();
    ud.to_init(&InitAttr {
        qkey: 0xabcd,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(ud.query().unwrap().qkey(), 0xabcd);
    ud.to_rtr(&RtrAttr::default()).unwrap();
    ud.to_rts(&RtsAttr {
        sq_psn: 5,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(ud.query().unwrap().state(), QpState::Rts);
}

#[test]
fn invalid_transitions_name_the_transition_and_the_fix() {
    let c = ctx();
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(16, None).unwrap();
    let info = c.port_info(None, None).unwrap();
    let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    let rtr = RtrAttr {
        dest_qpn: 1,
        ah: AhAttr::gid(info.gid, 1, 1),
        ..Default::default()
    };

    let e = qp.to_rtr(&rtr).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert_eq!(e.verb(), "ibv_modify_qp(RESET->RTR)");
    assert!(e.to_string().contains("must come from INIT"), "{e}");
    let e = qp.to_rts(&RtsAttr::default()).unwrap_err();
    assert_eq!(e.verb(), "ibv_modify_qp(RESET->RTS)");
    let e = qp.to_error().unwrap_err();
    assert_eq!(e.verb(), "ibv_modify_qp(RESET->ERR)");
    assert!(e.to_string().contains("not a valid transition"), "{e}");
    assert_eq!(
        qp.query().unwrap().state(),
        QpState::Reset,
        "state unchanged"
    );

    let e = qp
        .to_init(&InitAttr {
            port: 2,
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(e.verb(), "ibv_modify_qp(RESET->INIT)");
    assert!(e.to_string().contains("port 2 does not exist"), "{e}");

    qp.to_init(&InitAttr::default()).unwrap();
    let e = qp.to_rts(&RtsAttr::default()).unwrap_err();
    assert_eq!(
        e.to_string().split(':').next().unwrap(),
        "ibv_modify_qp(INIT->RTS)"
    );
    assert!(
        e.to_string()
            .contains("QP is in INIT: RTS must come from RTR"),
        "{e}"
    );

    // Path MTU above the active MTU but within max_mtu (4096) is accepted, as rxe does;
    // the device keeps what was asked.
    qp.to_rtr(&RtrAttr {
        path_mtu: Mtu::Mtu4096,
        ..rtr
    })
    .unwrap();
    assert_eq!(qp.query().unwrap().path_mtu(), Some(Mtu::Mtu4096));
    qp.reset().unwrap();
    qp.to_init(&InitAttr::default()).unwrap();
    // RoCE needs a GRH.
    let e = qp
        .to_rtr(&RtrAttr {
            ah: AhAttr::lid(1, 1),
            ..rtr
        })
        .unwrap_err();
    assert!(e.to_string().contains("needs a GRH"), "{e}");
    // A source GID index beyond the table.
    let e = qp
        .to_rtr(&RtrAttr {
            ah: AhAttr::gid(info.gid, 200, 1),
            ..rtr
        })
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENODATA);
    assert!(e.to_string().contains("sgid_index 200"), "{e}");
    assert_eq!(qp.query().unwrap().state(), QpState::Init);

    qp.to_rtr(&rtr).unwrap();
    let e = qp.to_rtr(&rtr).unwrap_err();
    assert_eq!(e.verb(), "ibv_modify_qp(RTR->RTR)");
    let e = qp
        .to_rts(&RtsAttr {
            timeout: 40,
            ..Default::default()
        })
        .unwrap_err();
    assert!(e.to_string().contains("timeout is 5-bit"), "{e}");
    let e = qp
        .to_rts(&RtsAttr {
            max_rd_atomic: 200,
            ..Default::default()
        })
        .unwrap_err();
    assert!(e.to_string().contains("max_qp_init_rd_atom"), "{e}");
    qp.to_rts(&RtsAttr::default()).unwrap();
    let e = qp.to_init(&InitAttr::default()).unwrap_err();
    assert_eq!(e.verb(), "ibv_modify_qp(RTS->INIT)");
    assert!(e.to_string().contains("must come from RESET"), "{e}");
}

// ---------------------------------------------------------------------------------------
// RC data and access violations
// ---------------------------------------------------------------------------------------

#[test]
fn rc_send_write_read_atomics() {
    let p = pair(QpType::Rc);
    let mut local = p.pd.alloc_mr(4096, rw()).unwrap();
    let remote = p.pd.alloc_mr(4096, rw()).unwrap();
    local.write_from(0, b"hello write").unwrap();
    let rwin = remote.remote();
    // SAFETY: every buffer is left alone until its completion is polled below.
    unsafe {
        // send / recv with immediate
        p.b.post_recv(50, &[remote.local(1024, 64).unwrap()])
            .unwrap();
        p.a.post_send(
            &SendWr::send(1, &[local.local(0, 5).unwrap()])
                .imm(0xfeed)
                .signaled(),
        )
        .unwrap();
    }
    let s = p.cq_a.wait_one(T).unwrap().ok().unwrap();
    assert_eq!((s.wr_id(), s.opcode()), (1, hotverbs_ffi::IBV_WC_SEND));
    let r = p.cq_b.wait_one(T).unwrap().ok().unwrap();
    assert_eq!(
        (r.wr_id(), r.byte_len(), r.imm_data()),
        (50, 5, Some(0xfeed))
    );
    assert_eq!(remote.read_vec(1024, 5).unwrap(), b"hello");

    // RDMA write, RDMA read back
    // SAFETY: as above.
    unsafe {
        p.a.post_send(
            &SendWr::write(
                2,
                &[local.local(0, 11).unwrap()],
                rwin.slice(0, 11).unwrap(),
            )
            .signaled(),
        )
        .unwrap();
    }
    assert_eq!(
        p.cq_a.wait_one(T).unwrap().ok().unwrap().opcode(),
        hotverbs_ffi::IBV_WC_RDMA_WRITE
    );
    assert_eq!(remote.read_vec(0, 11).unwrap(), b"hello write");
    // SAFETY: as above.
    unsafe {
        p.a.post_send(
            &SendWr::read(
                3,
                &[local.local(100, 11).unwrap()],
                rwin.slice(0, 11).unwrap(),
            )
            .signaled(),
        )
        .unwrap();
    }
    assert_eq!(
        p.cq_a.wait_one(T).unwrap().ok().unwrap().opcode(),
        hotverbs_ffi::IBV_WC_RDMA_READ
    );
    assert_eq!(local.read_vec(100, 11).unwrap(), b"hello write");

    // atomics on an 8-byte aligned word
    let word = rwin.slice(2048, 8).unwrap();
    // SAFETY: as above.
    unsafe {
        p.a.post_send(&SendWr::fetch_add(4, &[local.local(200, 8).unwrap()], word, 5).signaled())
            .unwrap();
    }
    p.cq_a.wait_one(T).unwrap().ok().unwrap();
    assert_eq!(local.read_u64(200).unwrap(), 0);
    // SAFETY: as above.
    unsafe {
        p.a.post_send(
            &SendWr::compare_swap(5, &[local.local(208, 8).unwrap()], word, 5, 99).signaled(),
        )
        .unwrap();
    }
    p.cq_a.wait_one(T).unwrap().ok().unwrap();
    assert_eq!(local.read_u64(208).unwrap(), 5);
    assert_eq!(remote.read_u64(2048).unwrap(), 99);

    // write with immediate consumes a receive
    // SAFETY: as above.
    unsafe {
        p.b.post_recv(51, &[]).unwrap();
        p.a.post_send(
            &SendWr::write(
                6,
                &[local.local(0, 4).unwrap()],
                rwin.slice(3000, 4).unwrap(),
            )
            .imm(7)
            .signaled(),
        )
        .unwrap();
    }
    p.cq_a.wait_one(T).unwrap().ok().unwrap();
    let r = p.cq_b.wait_one(T).unwrap().ok().unwrap();
    assert_eq!(r.opcode(), hotverbs_ffi::IBV_WC_RECV_RDMA_WITH_IMM);
    assert_eq!(r.imm_data(), Some(7));
    assert_eq!(remote.read_vec(3000, 4).unwrap(), b"hell");
}

#[test]
fn inline_send_and_selective_signaling() {
    let p = pair(QpType::Rc);
    let rx = p.pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
    let msg = *b"inline!";
    let sge = Sge {
        addr: msg.as_ptr() as u64,
        length: msg.len() as u32,
        lkey: 0,
    };
    // SAFETY: inline data is copied during the call; rx is untouched until its completion.
    unsafe {
        p.b.post_recv(1, &[rx.local(0, 64).unwrap()]).unwrap();
        p.b.post_recv(2, &[rx.local(64, 64).unwrap()]).unwrap();
        // Unsignaled: no send completion.
        p.a.post_send(&SendWr::send(10, &[sge]).inline()).unwrap();
    }
    assert_eq!(p.cq_b.wait_one(T).unwrap().ok().unwrap().wr_id(), 1);
    no_completion(&p.cq_a);
    // SAFETY: as above.
    unsafe {
        p.a.post_send(&SendWr::send(11, &[sge]).inline().signaled())
            .unwrap()
    };
    assert_eq!(p.cq_a.wait_one(T).unwrap().ok().unwrap().wr_id(), 11);
    assert_eq!(rx.read_vec(64, 7).unwrap(), b"inline!");
    // Too much inline data: EINVAL with a hint naming max_inline_data.
    let big = [0u8; 1000];
    let sge = Sge {
        addr: big.as_ptr() as u64,
        length: 1000,
        lkey: 0,
    };
    // SAFETY: inline, copied during the call (and rejected here anyway).
    let e = unsafe { p.a.post_send(&SendWr::send(12, &[sge]).inline()) }.unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_post_send", libc::EINVAL));
    assert!(e.to_string().contains("max_inline_data"), "{e}");
}

#[test]
fn sq_sig_all_signals_every_wr() {
    let c = ctx();
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(16, None).unwrap();
    let info = c.port_info(None, None).unwrap();
    let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .sq_sig_all(true)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    a.connect(&info, &b.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    b.connect(&info, &a.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    let mr = pd.alloc_mr(64, rw()).unwrap();
    // SAFETY: buffers untouched until completions.
    unsafe {
        a.post_send(&SendWr::write(
            1,
            &[mr.local(0, 8).unwrap()],
            mr.remote().slice(32, 8).unwrap(),
        ))
        .unwrap();
    }
    assert_eq!(cq.wait_one(T).unwrap().ok().unwrap().wr_id(), 1);
}

#[test]
fn posting_in_the_wrong_state_is_einval_with_state_hint() {
    let c = ctx();
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(16, None).unwrap();
    let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    // SAFETY: rejected at post; nothing is in flight.
    let e = unsafe { qp.post_recv(1, &[mr.sge()]) }.unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_post_recv", libc::EINVAL));
    assert!(
        e.to_string()
            .contains("QP is in RESET: receives can be posted from INIT"),
        "{e}"
    );
    qp.to_init(&InitAttr::default()).unwrap();
    // SAFETY: rejected at post; nothing is in flight.
    let e = unsafe { qp.post_send(&SendWr::send(1, &[mr.sge()])) }.unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_post_send", libc::EINVAL));
    assert!(
        e.to_string().contains("QP is in INIT: sends need RTS"),
        "{e}"
    );
}

#[test]
fn write_into_mr_without_remote_write_is_rem_access_err() {
    let p = pair(QpType::Rc);
    let local = p.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let read_only =
        p.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
    // SAFETY: buffers untouched until completions.
    unsafe {
        p.a.post_send(
            &SendWr::write(1, &[local.local(0, 8).unwrap()], read_only.remote()).signaled(),
        )
        .unwrap();
    }
    let wc = p.cq_a.wait_one(T).unwrap();
    assert_eq!(wc.status_name(), "IBV_WC_REM_ACCESS_ERR");
    let e = wc.ok().unwrap_err();
    assert!(e.to_string().contains("lacks the access flag"), "{e}");
    assert!(
        read_only.as_slice().unwrap().iter().all(|&b| b == 0),
        "nothing written"
    );
    assert_eq!(p.a.query().unwrap().state(), QpState::Err);
}

#[test]
fn read_with_bad_rkey_and_bad_lkey() {
    let p = pair(QpType::Rc);
    let local = p.pd.alloc_mr(64, rw()).unwrap();
    let remote = p.pd.alloc_mr(64, rw()).unwrap();
    let mut bad = remote.remote();
    bad.rkey ^= 0x5a5a;
    // SAFETY: buffers untouched until completions.
    unsafe {
        p.a.post_send(&SendWr::read(1, &[local.local(0, 8).unwrap()], bad).signaled())
            .unwrap();
    }
    assert_eq!(
        p.cq_a.wait_one(T).unwrap().status_name(),
        "IBV_WC_REM_ACCESS_ERR"
    );

    // An SGE outside its MR (crafted: Mr::local refuses to make one).
    let q = pair(QpType::Rc);
    let mr = q.pd.alloc_mr(64, rw()).unwrap();
    let sge = Sge {
        addr: mr.addr() + 60,
        length: 64,
        lkey: mr.lkey(),
    };
    // SAFETY: the device rejects the out-of-bounds SGE before touching memory.
    unsafe {
        q.a.post_send(&SendWr::write(2, &[sge], mr.remote()).signaled())
            .unwrap();
    }
    let wc = q.cq_a.wait_one(T).unwrap();
    assert_eq!(wc.status_name(), "IBV_WC_LOC_PROT_ERR");
    assert!(wc.ok().unwrap_err().to_string().contains("outside its MR"));
}

#[test]
fn receive_too_small_is_loc_len_err() {
    // Spec: rxe reports LOC_QP_OP_ERR here (fault-truth S11).
    let p = pair_on(spec_ctx(), QpType::Rc);
    let mr = p.pd.alloc_mr(128, AccessFlags::LOCAL_WRITE).unwrap();
    // SAFETY: buffers untouched until completions.
    unsafe {
        p.b.post_recv(1, &[mr.local(0, 4).unwrap()]).unwrap();
        p.a.post_send(&SendWr::send(2, &[mr.local(64, 32).unwrap()]).signaled())
            .unwrap();
    }
    let r = p.cq_b.wait_one(T).unwrap();
    assert_eq!(r.status_name(), "IBV_WC_LOC_LEN_ERR");
    assert!(r
        .ok()
        .unwrap_err()
        .to_string()
        .contains("smaller than the message"));
    assert!(!p.cq_a.wait_one(T).unwrap().is_ok());
}

// ---------------------------------------------------------------------------------------
// UD, AH, multicast
// ---------------------------------------------------------------------------------------

#[test]
fn ud_send_with_ah_and_reply_with_ah_from_wc() {
    let p = pair(QpType::Ud);
    let info = p.ctx.port_info(None, None).unwrap();
    let ah = p.pd.create_ah(&AhAttr::gid(info.gid, 1, 1)).unwrap();
    let mut tx = p.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let rx = p.pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
    tx.write_from(0, b"ping").unwrap();
    // SAFETY: buffers untouched until completions.
    unsafe {
        p.b.post_recv(1, &[rx.local(0, 128).unwrap()]).unwrap();
        p.a.post_send(
            &SendWr::ud(
                2,
                &[tx.local(0, 4).unwrap()],
                &ah,
                p.b.qp_num(),
                DEFAULT_QKEY,
            )
            .signaled(),
        )
        .unwrap();
    }
    assert!(p.cq_a.wait_one(T).unwrap().is_ok());
    let wc = p.cq_b.wait_one(T).unwrap().ok().unwrap();
    assert!(wc.has_grh());
    assert_eq!(wc.byte_len(), 40 + 4);
    assert_eq!(wc.src_qp(), p.a.qp_num());
    assert_eq!(rx.read_vec(40, 4).unwrap(), b"ping");

    // Reply to the sender using an AH made from the completion and its GRH.
    let back =
        p.pd.create_ah_from_wc(&wc, &rx.read_vec(0, 40).unwrap(), 1)
            .unwrap();
    assert!(p
        .pd
        .create_ah_from_wc(&wc, &rx.read_vec(0, 39).unwrap(), 1)
        .is_err());
    tx.write_from(0, b"pong").unwrap();
    // SAFETY: as above.
    unsafe {
        p.a.post_recv(3, &[rx.local(128, 128).unwrap()]).unwrap();
        p.b.post_send(
            &SendWr::ud(
                4,
                &[tx.local(0, 4).unwrap()],
                &back,
                wc.src_qp(),
                DEFAULT_QKEY,
            )
            .signaled(),
        )
        .unwrap();
    }
    assert!(p.cq_b.wait_one(T).unwrap().is_ok());
    let wc = p.cq_a.wait_one(T).unwrap().ok().unwrap();
    assert_eq!(wc.wr_id(), 3);
    assert_eq!(rx.read_vec(168, 4).unwrap(), b"pong");
}

#[test]
fn ah_without_grh_on_roce_is_einval_with_hint() {
    let c = ctx();
    let pd = c.alloc_pd().unwrap();
    let e = pd.create_ah(&AhAttr::lid(1, 1)).unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_create_ah", libc::EINVAL));
    assert!(e.to_string().contains("needs a GRH"), "{e}");
}

#[test]
fn multicast_attach_send_detach() {
    let p = pair(QpType::Ud);
    // A third UD QP joins too; the sender does not receive its own message.
    let cq_c = p.ctx.create_cq(16, None).unwrap();
    let c = QpBuilder::new(&p.pd, &cq_c, &cq_c, QpType::Ud)
        .build()
        .unwrap();
    let info = p.ctx.port_info(None, None).unwrap();
    c.connect(&info, &Endpoint::default(), &ConnectOptions::default())
        .unwrap();
    let mut g = [0u8; 16];
    g[0] = 0xff;
    g[1] = 0x0e;
    g[15] = 0x41; // unique to this test (multicast groups are process-wide in softnic)
    let group = Gid(g);
    p.b.attach_mcast(&group, 0).unwrap();
    c.attach_mcast(&group, 0).unwrap();
    let e =
        p.b.attach_mcast(&Gid::from_ipv4([1, 2, 3, 4]), 0)
            .unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_attach_mcast", libc::EINVAL));
    assert!(e.to_string().contains("not a multicast GID"), "{e}");

    let ah = p.pd.create_ah(&AhAttr::gid(group, 1, 1)).unwrap();
    let rx = p.pd.alloc_mr(512, AccessFlags::LOCAL_WRITE).unwrap();
    let mut tx = p.pd.alloc_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
    tx.write_from(0, b"quote").unwrap();
    // SAFETY: buffers untouched until completions.
    unsafe {
        p.b.post_recv(1, &[rx.local(0, 128).unwrap()]).unwrap();
        c.post_recv(2, &[rx.local(128, 128).unwrap()]).unwrap();
        p.a.post_recv(3, &[rx.local(256, 128).unwrap()]).unwrap();
        p.a.post_send(
            &SendWr::ud(9, &[tx.local(0, 5).unwrap()], &ah, 0xff_ffff, DEFAULT_QKEY).signaled(),
        )
        .unwrap();
    }
    assert!(p.cq_a.wait_one(T).unwrap().is_ok());
    assert_eq!(p.cq_b.wait_one(T).unwrap().ok().unwrap().wr_id(), 1);
    assert_eq!(cq_c.wait_one(T).unwrap().ok().unwrap().wr_id(), 2);
    assert_eq!(rx.read_vec(40, 5).unwrap(), b"quote");
    assert_eq!(rx.read_vec(168, 5).unwrap(), b"quote");
    no_completion(&p.cq_a);

    p.b.detach_mcast(&group, 0).unwrap();
    let e = p.b.detach_mcast(&group, 0).unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_detach_mcast", libc::EINVAL));
    c.detach_mcast(&group, 0).unwrap();
    // After detaching, nobody receives.
    // SAFETY: as above.
    unsafe {
        p.b.post_recv(4, &[rx.local(0, 128).unwrap()]).unwrap();
        p.a.post_send(
            &SendWr::ud(10, &[tx.local(0, 5).unwrap()], &ah, 0xff_ffff, DEFAULT_QKEY).signaled(),
        )
        .unwrap();
    }
    assert!(p.cq_a.wait_one(T).unwrap().is_ok());
    no_completion(&p.cq_b);
}

/// RoCE v2 over IPv4 names a group by its IPv4-mapped address (`::ffff:239.77.0.3`), as
/// rxe and rdma_cm's joins do: softnic attaches and delivers to it like an `ff..` GID, and
/// still refuses a unicast IPv4-mapped one (the test above).
#[test]
fn multicast_to_an_ipv4_mapped_group() {
    let p = pair(QpType::Ud);
    // 239.77.0.3: unique to this test (groups are process-wide in softnic).
    let group = Gid::from_ipv4([239, 77, 0, 3]);
    p.b.attach_mcast(&group, 0).unwrap();
    for unicast in [[10, 77, 0, 1], [223, 255, 255, 255], [240, 0, 0, 1]] {
        let e = p.b.attach_mcast(&Gid::from_ipv4(unicast), 0).unwrap_err();
        assert_eq!(
            (e.verb(), e.errno()),
            ("ibv_attach_mcast", libc::EINVAL),
            "{unicast:?}"
        );
    }
    let ah = p.pd.create_ah(&AhAttr::gid(group, 1, 1)).unwrap();
    let rx = p.pd.alloc_mr(128, AccessFlags::LOCAL_WRITE).unwrap();
    let mut tx = p.pd.alloc_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
    tx.write_from(0, b"v4 feed").unwrap();
    // SAFETY: buffers untouched until completions.
    unsafe {
        p.b.post_recv(1, &[rx.local(0, 128).unwrap()]).unwrap();
        p.a.post_send(
            &SendWr::ud(2, &[tx.local(0, 7).unwrap()], &ah, 0xff_ffff, DEFAULT_QKEY).signaled(),
        )
        .unwrap();
    }
    assert!(p.cq_a.wait_one(T).unwrap().is_ok());
    assert_eq!(p.cq_b.wait_one(T).unwrap().ok().unwrap().wr_id(), 1);
    assert_eq!(rx.read_vec(40, 7).unwrap(), b"v4 feed");
    p.b.detach_mcast(&group, 0).unwrap();
}

#[test]
fn multicast_on_rc_is_rejected() {
    let p = pair(QpType::Rc);
    let mut g = [0u8; 16];
    g[0] = 0xff;
    g[15] = 0x42;
    let e = p.a.attach_mcast(&Gid(g), 0).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    assert!(e.to_string().contains("only UD QPs"), "{e}");
}

// ---------------------------------------------------------------------------------------
// Completion channel, async events
// ---------------------------------------------------------------------------------------

#[test]
fn completion_channel_events_through_the_fd() {
    let c = ctx();
    let pd = c.alloc_pd().unwrap();
    let ch = c.create_comp_channel().unwrap();
    let cq = c.create_cq(16, Some(&ch)).unwrap();
    let other = c.create_cq(16, None).unwrap();
    let info = c.port_info(None, None).unwrap();
    let a = QpBuilder::new(&pd, &other, &other, QpType::Rc)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    a.connect(&info, &b.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    b.connect(&info, &a.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    let mr = pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).unwrap();

    // Not armed: a completion raises no event.
    // SAFETY: buffers untouched until completions.
    unsafe {
        b.post_recv(1, &[mr.local(0, 64).unwrap()]).unwrap();
        a.post_send(&SendWr::send(2, &[mr.local(128, 8).unwrap()]))
            .unwrap();
    }
    assert_eq!(cq.wait_one(T).unwrap().wr_id(), 1);
    assert!(ch
        .wait_cq_event(Duration::from_millis(20))
        .unwrap()
        .is_none());

    // Armed: the fd becomes readable (as epoll would see it), the event names our CQ.
    cq.req_notify(false).unwrap();
    // SAFETY: as above.
    unsafe {
        b.post_recv(3, &[mr.local(0, 64).unwrap()]).unwrap();
        a.post_send(&SendWr::send(4, &[mr.local(128, 8).unwrap()]))
            .unwrap();
    }
    let mut pfd = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&ch),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, 5000) }, 1);
    let ev = ch.get_cq_event().unwrap();
    assert!(ev.is_for(&cq));
    assert!(!ev.is_for(&other));
    assert_eq!(cq.unacked_events(), 1);
    cq.ack_events(1);
    assert_eq!(cq.unacked_events(), 0);
    assert_eq!(cq.wait_one(T).unwrap().wr_id(), 3);
    // One arm, one event.
    // SAFETY: as above.
    unsafe {
        b.post_recv(5, &[mr.local(0, 64).unwrap()]).unwrap();
        a.post_send(&SendWr::send(6, &[mr.local(128, 8).unwrap()]))
            .unwrap();
    }
    assert!(ch
        .wait_cq_event(Duration::from_millis(20))
        .unwrap()
        .is_none());
    // An event left unacknowledged is acknowledged by the CQ's destruction.
    cq.req_notify(false).unwrap();
    assert_eq!(cq.wait_one(T).unwrap().wr_id(), 5);
    // SAFETY: as above.
    unsafe {
        b.post_recv(7, &[mr.local(0, 64).unwrap()]).unwrap();
        a.post_send(&SendWr::send(8, &[mr.local(128, 8).unwrap()]))
            .unwrap();
    }
    assert!(ch.wait_cq_event(T).unwrap().is_some());
    assert_eq!(cq.unacked_events(), 1);
    drop(b);
    cq.destroy().unwrap();
    ch.destroy().unwrap();
}

#[test]
fn injected_qp_error_raises_qp_fatal_and_flushes() {
    // Spec: rxe raises no async event when a QP goes to ERR (fault-truth G7).
    let p = pair_on(spec_ctx(), QpType::Rc);
    let mr = p.pd.alloc_mr(128, AccessFlags::LOCAL_WRITE).unwrap();
    // SAFETY: buffers untouched until completions.
    unsafe { p.b.post_recv(77, &[mr.local(0, 64).unwrap()]).unwrap() };
    assert!(p
        .ctx
        .wait_async_event(Duration::from_millis(10))
        .unwrap()
        .is_none());
    // SAFETY: a live softnic QP.
    unsafe { hotverbs_softnic::inject_qp_error(p.b.as_raw()) };
    let ev = p.ctx.wait_async_event(T).unwrap().expect("QP_FATAL");
    assert_eq!(ev.name, "IBV_EVENT_QP_FATAL");
    assert_eq!(ev.event_type, hotverbs_ffi::IBV_EVENT_QP_FATAL);
    match ev.element {
        AsyncElement::Qp { qp, qp_num } => {
            assert_eq!(qp, p.b.as_raw());
            assert_eq!(qp_num, p.b.qp_num());
        }
        other => panic!("wrong element {other:?}"),
    }
    let wc = p.cq_b.wait_one(T).unwrap();
    assert_eq!((wc.wr_id(), wc.status_name()), (77, "IBV_WC_WR_FLUSH_ERR"));
    assert_eq!(p.b.query().unwrap().state(), QpState::Err);
    // The tracked state is stale, the query is not; reconnecting recovers.
    assert_eq!(p.b.tracked_state(), QpState::Rts);
    let info = p.ctx.port_info(None, None).unwrap();
    p.b.connect(&info, &p.a.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    assert_eq!(p.b.query().unwrap().state(), QpState::Rts);
}

#[test]
fn cq_overrun_raises_cq_err() {
    // Spec: rxe drops the completion and the CQ stays usable (fault-truth S15).
    let c = spec_ctx();
    let pd = c.alloc_pd().unwrap();
    let small = c.create_cq(2, None).unwrap();
    let big = c.create_cq(16, None).unwrap();
    let info = c.port_info(None, None).unwrap();
    let a = QpBuilder::new(&pd, &small, &small, QpType::Rc)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &big, &big, QpType::Rc).build().unwrap();
    a.connect(&info, &b.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    b.connect(&info, &a.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    let mr = pd.alloc_mr(64, rw()).unwrap();
    for i in 0..3 {
        // SAFETY: local write of a registered buffer into itself.
        unsafe {
            a.post_send(
                &SendWr::write(
                    i,
                    &[mr.local(0, 8).unwrap()],
                    mr.remote().slice(8, 8).unwrap(),
                )
                .signaled(),
            )
            .unwrap();
        }
    }
    let ev = c.wait_async_event(T).unwrap().expect("CQ_ERR");
    assert_eq!(ev.name, "IBV_EVENT_CQ_ERR");
    assert_eq!(ev.element, AsyncElement::Cq(small.as_raw()));
    let mut wc = [Wc::default(); 4];
    let e = small.poll(&mut wc).unwrap_err();
    assert_eq!(e.verb(), "ibv_poll_cq");
    assert!(e.to_string().contains("overran"), "{e}");
}
