//! A TCP port on 127.0.0.1 with nothing listening, for "the server is not there" tests.
//! Shared by `tests/cli.rs` and the unit tests of `src/control.rs` (`#[path]` modules).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
