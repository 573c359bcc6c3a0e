//! The mlx5 direct path's setup-layer entry points on devices that are not mlx5: softnic
//! (both behaviour profiles) says "not an mlx5 device" by name, leaves the CQ usable and
//! takes nothing. The direct path on a ConnectX is `tests/real_device_mlx5.rs`.

use hotverbs::*;

#[test]
fn softnic_is_not_mlx5_and_the_direct_path_says_so() {
    let ctx = Context::open("softnic").unwrap();
    assert!(!ctx.is_mlx5());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let e = cq.direct_poller::<16>().unwrap_err();
    assert_eq!(e.errno(), libc::EOPNOTSUPP, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("DirectPoller"), "{msg}");
    assert!(msg.contains("not an mlx5 device"), "{msg}");
    assert!(msg.contains("softnic"), "{msg}");
    assert!(msg.contains("Cq::poller"), "the verbs path is named: {msg}");
    // Nothing was taken: the CQ still gets its verbs poller, the QP its ring.
    let p = cq.poller::<8>().unwrap();
    drop(p);
    let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .max_inline_data(64)
        .build()
        .unwrap();
    let ring = qp.send_ring::<16>(SendConfig::new(0, 16, 64)).unwrap();
    assert_eq!(ring.depth(), 16);
}
