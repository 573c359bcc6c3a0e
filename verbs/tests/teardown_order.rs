//! Parents outlive their children whatever order the handles are dropped in, and the
//! teardown through `Drop` is clean. Its own test binary: [`take_drop_errors`] reads a
//! process-wide record, which another test running alongside could add to or empty.

use hotverbs::*;

#[test]
fn parents_outlive_children_and_destroy_reports_ebusy() {
    let c = Context::open("softnic").expect("softnic always opens");
    let pd = c.alloc_pd().unwrap();
    let ch = c.create_comp_channel().unwrap();
    let cq = c.create_cq(16, Some(&ch)).unwrap();
    let srq = pd.create_srq(16, 1).unwrap();
    let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .srq(&srq)
        .build()
        .unwrap();

    let e = pd.clone().destroy().unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_dealloc_pd", libc::EBUSY));
    assert!(e.to_string().contains("drop them first"), "{e}");
    let e = cq.clone().destroy().unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_destroy_cq", libc::EBUSY));
    let e = srq.clone().destroy().unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_destroy_srq", libc::EBUSY));
    let e = ch.clone().destroy().unwrap_err();
    assert_eq!(
        (e.verb(), e.errno()),
        ("ibv_destroy_comp_channel", libc::EBUSY)
    );
    let e = c.clone().close().unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_close_device", libc::EBUSY));

    // Dropping the handles in the "wrong" order is fine: the QP keeps the rest alive.
    drop(pd);
    drop(cq);
    drop(srq);
    drop(ch);
    assert!(qp.query().is_ok());
    qp.destroy().unwrap();
    mr.destroy().unwrap();
    c.close().unwrap();
    let errs = take_drop_errors();
    assert!(errs.is_empty(), "{errs:?}");
}
