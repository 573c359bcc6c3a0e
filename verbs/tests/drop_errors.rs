//! A destroy that fails inside `Drop` is reported (stderr + `take_drop_errors`), not
//! ignored. Its own test binary: the record is process-wide.

use hotverbs::*;

#[test]
fn failed_destroy_in_drop_is_recorded() {
    let ctx = Context::open("softnic").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    // A QP made behind the crate's back (raw verb): the Cq's Arc does not know about it,
    // so the device refuses ibv_destroy_cq when the Cq is dropped.
    let fns = ctx.fns();
    // SAFETY: plain C data.
    let mut init: hotverbs_ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    init.send_cq = cq.as_raw();
    init.recv_cq = cq.as_raw();
    init.cap.max_send_wr = 1;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.qp_type = hotverbs_ffi::IBV_QPT_RC;
    // SAFETY: live PD and CQ of this context; init valid.
    let raw = unsafe { fns.ibv_create_qp.unwrap()(pd.as_raw(), &mut init) };
    assert!(!raw.is_null());
    assert!(take_drop_errors().is_empty());

    drop(cq);
    let errs = take_drop_errors();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        (errs[0].verb(), errs[0].errno()),
        ("ibv_destroy_cq", libc::EBUSY)
    );
    assert!(
        errs[0].to_string().contains("a QP still uses this CQ"),
        "{}",
        errs[0]
    );
    assert!(take_drop_errors().is_empty(), "taken once");

    // SAFETY: the raw QP is ours and destroyed once.
    assert_eq!(unsafe { fns.ibv_destroy_qp.unwrap()(raw) }, 0);
}
