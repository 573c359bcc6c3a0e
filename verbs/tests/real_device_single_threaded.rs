//! `MLX5_SINGLE_THREADED=1` switches libmlx5's CQ/QP/SRQ locks off process-wide, which the
//! `Sync` of hotverbs' setup objects relies on: `Context::open` refuses real devices while it
//! is set, and softnic (its own locking) still opens. Its own test binary, with one test: it
//! changes the process environment. Named `real_device*` so that `cargo xtask rxe` runs it
//! against rxe0 (where a missing device fails instead of skipping).

use hotverbs::{devices, Context, DeviceKind};

#[test]
fn mlx5_single_threaded_refuses_real_devices_and_spares_softnic() {
    let saved = std::env::var_os("MLX5_SINGLE_THREADED");
    std::env::set_var("MLX5_SINGLE_THREADED", "1");

    // softnic: opens and works as usual.
    let ctx = Context::open("softnic").expect("softnic must open with MLX5_SINGLE_THREADED=1");
    assert_eq!(ctx.kind(), DeviceKind::Softnic);
    ctx.query_device().expect("query_device");
    let cq = ctx.create_cq(16, None).expect("create_cq");
    let mut wcs = [hotverbs::Wc::default(); 4];
    assert_eq!(cq.poll(&mut wcs).expect("poll"), 0);

    // A name that is no device is still ENODEV (the check is made on the device found).
    let e = Context::open("no-such-device").unwrap_err();
    assert_eq!(e.errno_name(), "ENODEV", "{e}");

    // Real devices: refused, each one, before ibv_open_device.
    let real: Vec<_> = devices()
        .into_iter()
        .filter(|d| d.kind == DeviceKind::Real)
        .collect();
    for d in &real {
        let e = Context::open(&d.name).expect_err("a real device must be refused");
        let msg = e.to_string();
        // ENOTSUP is EOPNOTSUPP on Linux, and named so.
        assert_eq!(e.errno_name(), "EOPNOTSUPP", "{}: {msg}", d.name);
        assert!(msg.starts_with("ibv_open_device: "), "{msg}");
        assert!(msg.contains("MLX5_SINGLE_THREADED=1"), "{msg}");
        assert!(msg.contains("unset it"), "{msg}");
    }

    // Any other value leaves libmlx5's locks on: real devices open again.
    std::env::set_var("MLX5_SINGLE_THREADED", "0");
    for d in &real {
        Context::open(&d.name).unwrap_or_else(|e| panic!("{}: {e}", d.name));
    }
    if real.is_empty() {
        assert!(
            std::env::var_os("HOTVERBS_RXE").is_none(),
            "inside the rxe VM rxe0 must be listed"
        );
        eprintln!("real-device half skipped: no RDMA device (the decision is unit-tested)");
    }

    match saved {
        Some(v) => std::env::set_var("MLX5_SINGLE_THREADED", v),
        None => std::env::remove_var("MLX5_SINGLE_THREADED"),
    }
}
