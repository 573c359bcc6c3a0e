//! `Context::open_default` and `$HOTVERBS_DEVICE` (its own test binary: it changes the
//! process environment, so it runs alone).

use hotverbs::{devices, Context, DeviceKind};

#[test]
fn default_device_follows_env_then_real_never_softnic_by_surprise() {
    let saved = std::env::var("HOTVERBS_DEVICE").ok();

    std::env::set_var("HOTVERBS_DEVICE", "softnic");
    assert_eq!(Context::open_default().unwrap().name(), "softnic");

    std::env::set_var("HOTVERBS_DEVICE", "no-such-device");
    let e = Context::open_default().unwrap_err();
    assert_eq!(e.errno(), libc::ENODEV);
    assert!(e.to_string().contains("no-such-device"), "{e}");

    std::env::remove_var("HOTVERBS_DEVICE");
    match devices().into_iter().find(|d| d.kind == DeviceKind::Real) {
        Some(real) => {
            let ctx = Context::open_default().unwrap();
            assert_eq!(ctx.name(), real.name);
            assert_eq!(ctx.kind(), DeviceKind::Real);
        }
        None => {
            // No NIC: an error that says so, never the software device in its place.
            let e = Context::open_default().unwrap_err();
            assert_eq!(
                (e.verb(), e.errno()),
                ("ibv_open_device", libc::ENODEV),
                "{e}"
            );
            let msg = e.to_string();
            assert!(msg.contains("no RDMA device"), "{msg}");
            assert!(
                msg.contains("HOTVERBS_DEVICE=softnic"),
                "says how to ask: {msg}"
            );
            // Asked for by name, it opens.
            assert_eq!(Context::open_softnic().unwrap().kind(), DeviceKind::Softnic);
        }
    }
    if let Some(v) = saved {
        std::env::set_var("HOTVERBS_DEVICE", v);
    }
}
