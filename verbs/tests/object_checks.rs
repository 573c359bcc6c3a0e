//! Checks the setup layer makes before a provider sees an object it would misread (soundness
//! review): objects of another device context, an AH of another PD or a UD QP without one,
//! and INLINE on an opcode whose result lands in the SGE after the call. Each used to reach
//! the provider: a provider casts every object to its own type, and an "inline" RDMA READ
//! wrote into memory a safe `Mr::as_slice` borrow was reading.

use hotverbs::*;

fn softnic() -> Context {
    Context::open("softnic").expect("softnic always opens")
}

fn einval<T: std::fmt::Debug>(r: Result<T>, verb: &str) {
    let e = r.expect_err("must be refused");
    assert_eq!((e.verb(), e.errno()), (verb, libc::EINVAL), "{e}");
    assert!(e.hint().is_some(), "the error says what to fix: {e}");
}

#[test]
fn objects_of_another_context_are_refused() {
    let (c1, c2) = (softnic(), softnic());
    assert_ne!(c1.as_raw(), c2.as_raw(), "two contexts");
    let pd = c1.alloc_pd().unwrap();
    let (cq1, cq2) = (
        c1.create_cq(16, None).unwrap(),
        c2.create_cq(16, None).unwrap(),
    );
    einval(
        QpBuilder::new(&pd, &cq2, &cq1, QpType::Rc).build(),
        "ibv_create_qp",
    );
    einval(
        QpBuilder::new(&pd, &cq1, &cq2, QpType::Rc).build(),
        "ibv_create_qp",
    );
    let srq2 = c2.alloc_pd().unwrap().create_srq(16, 1).unwrap();
    einval(
        QpBuilder::new(&pd, &cq1, &cq1, QpType::Rc)
            .srq(&srq2)
            .build(),
        "ibv_create_qp",
    );
    let ch2 = c2.create_comp_channel().unwrap();
    einval(c1.create_cq(16, Some(&ch2)), "ibv_create_cq");
    // The same objects of one context are fine.
    QpBuilder::new(&pd, &cq1, &cq1, QpType::Rc).build().unwrap();
    let ch1 = c1.create_comp_channel().unwrap();
    c1.create_cq(16, Some(&ch1)).unwrap();
}

#[test]
fn inline_is_refused_where_the_result_lands_later() {
    let ctx = softnic();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .max_inline_data(64)
        .build()
        .unwrap();
    let port = ctx.port_info(None, None).unwrap();
    qp.connect(&port, &qp.endpoint(&port), &ConnectOptions::default())
        .unwrap();
    let mr = pd
        .alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    let sges = [mr.local(0, 8).unwrap()];
    let remote = mr.remote().slice(8, 8).unwrap();
    for wr in [
        SendWr::read(1, &sges, remote).inline(),
        SendWr::fetch_add(2, &sges, remote, 1).inline(),
        SendWr::compare_swap(3, &sges, remote, 0, 1).inline(),
    ] {
        // SAFETY: refused before the provider sees it (asserted).
        einval(unsafe { qp.post_send(&wr) }, "ibv_post_send");
    }
    assert!(mr.as_slice().is_ok(), "nothing was posted into it");
}

#[test]
fn ud_needs_an_ah_of_its_pd_and_only_ud_takes_one() {
    let ctx = softnic();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let port = ctx.port_info(None, None).unwrap();
    let ud = QpBuilder::new(&pd, &cq, &cq, QpType::Ud)
        .max_inline_data(64)
        .build()
        .unwrap();
    ud.connect(&port, &ud.endpoint(&port), &ConnectOptions::default())
        .unwrap();
    let rc = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .max_inline_data(64)
        .build()
        .unwrap();
    let data = *b"hello";
    let sges = [Sge {
        addr: data.as_ptr() as u64,
        length: 5,
        lkey: 0,
    }];
    let attr = AhAttr::gid(port.gid, port.gid_index.unwrap_or(0) as u8, port.port);
    let ah = pd.create_ah(&attr).unwrap();
    let other_pd = ctx.alloc_pd().unwrap();
    let foreign_ah = other_pd.create_ah(&attr).unwrap();
    // SAFETY: inline payloads (copied during each call), most refused before the provider.
    unsafe {
        einval(
            ud.post_send(&SendWr::send(1, &sges).inline()),
            "ibv_post_send",
        );
        einval(
            ud.post_send(&SendWr::ud(2, &sges, &foreign_ah, 1, 1).inline()),
            "ibv_post_send",
        );
        einval(
            rc.post_send(&SendWr::ud(3, &sges, &ah, 1, 1).inline()),
            "ibv_post_send",
        );
        // The right AH goes through.
        ud.post_send(
            &SendWr::ud(4, &sges, &ah, ud.qp_num(), 0x1111)
                .inline()
                .signaled(),
        )
        .unwrap();
    }
}
