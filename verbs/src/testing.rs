//! Test support: the real-device probe policy shared by every crate's `tests/real_device.rs`.
//!
//! A test that needs a real RDMA device asks [`real_device`] (or a [`Probe`]) for one. The
//! policy, implemented here once:
//!
//! - The device is `$HOTVERBS_DEVICE` if set and non-empty, else the first real device that
//!   [`devices_report`] lists (softnic is never picked by default).
//! - `HOTVERBS_DEVICE=softnic` is ignored (the first real device is used instead) unless the
//!   probe [allows softnic](Probe::allow_softnic); then it runs the suite on the software
//!   device — outside the rxe VM only.
//! - When there is no device, the probe prints `skipped: no RDMA device (<why>)` to stderr
//!   and returns `None`, so the test returns early — unless `HOTVERBS_RXE=1` (inside the rxe
//!   VM, see [`rxe_required`]), where a missing device is a failure: the probe panics.
//! - The GID index is `$HOTVERBS_GID_INDEX` ([`gid_index`]), else the default.
//!
//! Also [`refusing_addr`]: a loopback port with nothing listening, for "the peer is not
//! there" tests that must not race other tests for a free port.
//!
//! ```
//! use hotverbs::testing;
//!
//! // In a `#[test]` of tests/real_device.rs:
//! let Some(ctx) = testing::real_device() else {
//!     return Ok(()); // no device here: "skipped: no RDMA device" was printed
//! };
//! let port = ctx.port_info(None, testing::gid_index())?;
//! assert!(port.port >= 1);
//! # Ok::<(), hotverbs::Error>(())
//! ```

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::{devices_report, Context, DeviceKind, SOFTNIC, SOFTNIC_MLX5};

/// Whether `HOTVERBS_RXE=1` is set: the tests run inside the rxe VM, where a missing device
/// (or a test run on softnic) is a failure rather than a skip.
pub fn rxe_required() -> bool {
    std::env::var("HOTVERBS_RXE").is_ok_and(|v| v == "1")
}

/// The GID index from `$HOTVERBS_GID_INDEX` (`1` on rxe), or `None` when unset or not a
/// number (the caller then uses its default, the RoCE v2 IPv4 GID).
pub fn gid_index() -> Option<u32> {
    std::env::var("HOTVERBS_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// The device under test per the [module](self)'s policy, or `None` after printing
/// `skipped: no RDMA device (<why>)` to stderr. `HOTVERBS_DEVICE=softnic` is ignored.
///
/// # Panics
/// When `HOTVERBS_RXE=1` and no device can be opened.
pub fn real_device() -> Option<Context> {
    Probe::new().open()
}

/// A device probe with options; [`real_device`] is `Probe::new().open()`.
///
/// ```
/// let ctx = hotverbs::testing::Probe::new()
///     .test("ring_on_device")
///     .allow_softnic()
///     .open();
/// # drop(ctx);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Probe<'a> {
    test: Option<&'a str>,
    allow_softnic: bool,
}

impl<'a> Probe<'a> {
    /// The default probe: no test name, `HOTVERBS_DEVICE=softnic` ignored.
    pub const fn new() -> Self {
        Probe {
            test: None,
            allow_softnic: false,
        }
    }

    /// Names the test in the skip line (`skipped: no RDMA device (<why>) in <test>`) and in
    /// the panic message.
    pub const fn test(mut self, name: &'a str) -> Self {
        self.test = Some(name);
        self
    }

    /// Honours `HOTVERBS_DEVICE=softnic` (or `softnic_mlx5`, the simulated ConnectX: running
    /// a suite on the software device while developing it). Under `HOTVERBS_RXE=1` softnic is refused: the probe panics.
    pub const fn allow_softnic(mut self) -> Self {
        self.allow_softnic = true;
        self
    }

    /// Opens the device under test, or returns `None` after printing the skip line.
    ///
    /// # Panics
    /// When `HOTVERBS_RXE=1` and no device can be opened, or softnic was selected.
    pub fn open(self) -> Option<Context> {
        let report = devices_report();
        let wanted = std::env::var("HOTVERBS_DEVICE").ok().filter(|n| {
            !n.is_empty() && (self.allow_softnic || (n != SOFTNIC && n != SOFTNIC_MLX5))
        });
        let name = wanted.or_else(|| {
            report
                .devices
                .iter()
                .find(|d| d.kind == DeviceKind::Real)
                .map(|d| d.name.clone())
        });
        let in_test = self.test.map(|t| format!(" in {t}")).unwrap_or_default();
        match name.as_deref().map(Context::open) {
            Some(Ok(c)) => {
                if rxe_required() {
                    assert_ne!(
                        c.kind(),
                        DeviceKind::Softnic,
                        "HOTVERBS_RXE=1 must test a real device{in_test}"
                    );
                }
                Some(c)
            }
            other => {
                let why = match other {
                    Some(Err(e)) => e.to_string(),
                    _ => report
                        .real_unavailable
                        .unwrap_or_else(|| "libibverbs lists no device".into()),
                };
                if rxe_required() {
                    panic!("HOTVERBS_RXE=1 but no RDMA device{in_test}: {why}");
                }
                eprintln!("skipped: no RDMA device ({why}){in_test}");
                None
            }
        }
    }
}

/// The devices a `real_device*` scenario runs on: the device under test inside `cargo xtask
/// rxe` (or the one `HOTVERBS_DEVICE` names), probed as [`Probe::test`]`(test)` does;
/// otherwise softnic in both behaviour profiles, `("softnic-spec", ..)` and
/// `("softnic-rxe", ..)`, each a device of its own named `<label>-<tag>` (tests run in
/// parallel). Empty after a skip line when a device was asked for and none opened.
#[cfg(feature = "softnic")]
pub fn device_or_softnic_profiles(test: &str, tag: &str) -> Vec<(String, Context)> {
    let named = std::env::var("HOTVERBS_DEVICE").is_ok_and(|d| !d.is_empty() && d != SOFTNIC);
    if rxe_required() || named {
        return Probe::new()
            .test(test)
            .open()
            .map(|ctx| (ctx.name().to_string(), ctx))
            .into_iter()
            .collect();
    }
    [
        ("softnic-spec", hotverbs_softnic::Profile::Spec),
        ("softnic-rxe", hotverbs_softnic::Profile::Rxe),
    ]
    .into_iter()
    .map(|(label, profile)| {
        let ctx = Context::open_softnic_with(crate::SoftnicConfig {
            name: format!("{label}-{tag}"),
            profile,
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("softnic {label}: {e}"));
        (label.to_string(), ctx)
    })
    .collect()
}

/// An address on 127.0.0.1 that refuses connections for as long as the returned socket
/// lives: the socket is bound but never listens, so a SYN to it is answered with RST
/// (ECONNREFUSED), no other socket can bind the port meanwhile, and connect(2) never picks
/// an explicitly bound port as its source port. (Binding a port and closing it again would
/// leave it free for anyone — another test, another process — before we connect.)
pub fn refusing_addr() -> (OwnedFd, SocketAddr) {
    // SAFETY: socket(2) with constant arguments; the result is checked before use.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(raw >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: `raw` is a descriptor we just opened and own; nothing else closes it.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0, // the kernel picks a free port
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
        },
        sin_zero: [0; 8],
    };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `sin` is a valid sockaddr_in and `len` its size, for the duration of the call.
    let r = unsafe { libc::bind(fd.as_raw_fd(), (&raw const sin).cast(), len) };
    assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
    // SAFETY: `sin` and `len` are writable and `len` holds the size of `sin`.
    let r = unsafe { libc::getsockname(fd.as_raw_fd(), (&raw mut sin).cast(), &mut len) };
    assert_eq!(r, 0, "getsockname: {}", std::io::Error::last_os_error());
    let port = u16::from_be(sin.sin_port);
    (fd, SocketAddr::from(([127, 0, 0, 1], port)))
}
