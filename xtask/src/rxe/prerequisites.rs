//! Prerequisites: the host programs the harness runs and the host files that go into the
//! guest (busybox, the RDMA tools, their libraries, the rxe provider), all checked up front
//! so that a missing one names its Debian package.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::elf::elf_is_static;
use super::packages;

/// Host programs the harness itself runs, with their Debian package.
const HOST_TOOLS: &[(&str, &str)] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("cpio", "cpio"),
    ("gzip", "gzip"),
    ("ldd", "libc-bin"),
    ("apt-cache", "apt"),
    ("apt-get", "apt"),
    ("dpkg", "dpkg"),
    // Compiles the drift check's probe, rxe_faults.c (see `faults`).
    ("cc", "gcc"),
];

/// Host files the harness builds against, with their Debian package.
const HOST_DEV_FILES: &[(&str, &str)] = &[
    ("/usr/include/infiniband/verbs.h", "libibverbs-dev"),
    ("/usr/lib/x86_64-linux-gnu/libibverbs.so", "libibverbs-dev"),
];

/// Programs copied into the guest's /usr/bin (with the libraries `ldd` lists for them).
const GUEST_PROGRAMS: &[(&str, &str)] = &[
    ("ibv_devices", "ibverbs-utils"),
    ("ibv_devinfo", "ibverbs-utils"),
    ("ibv_rc_pingpong", "ibverbs-utils"),
    ("ibv_ud_pingpong", "ibverbs-utils"),
    ("ibv_srq_pingpong", "ibverbs-utils"),
    ("rdma", "iproute2"),
    ("rping", "rdmacm-utils"),
    ("ib_send_lat", "perftest"),
    ("ib_send_bw", "perftest"),
    ("ib_write_lat", "perftest"),
    ("ib_write_bw", "perftest"),
    ("ib_read_lat", "perftest"),
    ("ib_read_bw", "perftest"),
    ("ib_atomic_lat", "perftest"),
];

/// Libraries no guest program links but the guest needs: our tests dlopen() libibverbs and
/// librdmacm; glibc dlopen()s libgcc_s for pthread_exit (rping aborts without it) and every
/// Rust binary links it.
const GUEST_LIBS: &[(&str, &str)] = &[
    ("libibverbs.so.1", "libibverbs1"),
    ("librdmacm.so.1", "librdmacm1"),
    ("libgcc_s.so.1", "libgcc-s1"),
];

/// The statically linked busybox of `busybox-static`: the guest's shell and small tools.
const BUSYBOX: &str = "/bin/busybox";
/// Makes libibverbs load the rxe provider.
pub(super) const RXE_DRIVER: &str = "/etc/libibverbs.d/rxe.driver";
/// Where Debian keeps libraries (x86_64 multiarch first).
const LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib64",
];

/// The host files that go into the guest.
pub(super) struct HostFiles {
    pub(super) busybox: PathBuf,
    pub(super) programs: Vec<(&'static str, PathBuf)>,
    pub(super) libs: Vec<PathBuf>,
    pub(super) provider: PathBuf,
}

pub(super) fn check_prerequisites() -> Result<HostFiles, String> {
    let mut missing: Vec<(String, &str)> = Vec::new();
    for &(tool, package) in HOST_TOOLS {
        if find_program(tool).is_none() {
            missing.push((format!("program {tool}"), package));
        }
    }
    for &(file, package) in HOST_DEV_FILES {
        if !Path::new(file).exists() {
            missing.push((file.to_string(), package));
        }
    }
    match fs::read(BUSYBOX) {
        Ok(data) if elf_is_static(&data) == Some(true) => {}
        Ok(_) => missing.push((
            format!("{BUSYBOX} is not statically linked"),
            "busybox-static",
        )),
        Err(_) => missing.push((BUSYBOX.to_string(), "busybox-static")),
    }
    let mut programs = Vec::new();
    for &(name, package) in GUEST_PROGRAMS {
        match find_program(name) {
            Some(path) => programs.push((name, path)),
            None => missing.push((format!("program {name}"), package)),
        }
    }
    let mut libs = Vec::new();
    for &(name, package) in GUEST_LIBS {
        match find_library(name) {
            Some(path) => libs.push(path),
            None => missing.push((format!("library {name}"), package)),
        }
    }
    if !Path::new(RXE_DRIVER).is_file() {
        missing.push((RXE_DRIVER.to_string(), "ibverbs-providers"));
    }
    let provider = find_rxe_provider();
    if provider.is_none() {
        missing.push((
            "the rxe provider librxe-rdmav*.so".to_string(),
            "ibverbs-providers",
        ));
    }
    if !missing.is_empty() {
        let mut msg = String::from("missing prerequisites:\n");
        let mut to_install = BTreeSet::new();
        for (what, package) in &missing {
            let _ = writeln!(msg, "  {what} (Debian package {package})");
            to_install.insert(*package);
        }
        let _ = write!(
            msg,
            "install them with: apt-get install -y {}\n(everything the harness uses: {})",
            to_install.into_iter().collect::<Vec<_>>().join(" "),
            packages().join(" ")
        );
        return Err(msg);
    }
    Ok(HostFiles {
        busybox: BUSYBOX.into(),
        programs,
        libs,
        provider: provider.expect("checked above"),
    })
}

/// `name` on `PATH`, or in the sbin folders (an ordinary user's `PATH` may lack them).
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .filter(|d| !d.is_empty())
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"])
        .map(|dir| Path::new(dir).join(name))
        .find(|p| {
            fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        });
    found
}

fn find_library(name: &str) -> Option<PathBuf> {
    LIB_DIRS
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.exists())
}

fn find_rxe_provider() -> Option<PathBuf> {
    LIB_DIRS.iter().find_map(|dir| {
        let mut found: Vec<PathBuf> = fs::read_dir(Path::new(dir).join("libibverbs"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let name = p.file_name().unwrap_or_default().to_string_lossy();
                name.starts_with("librxe-rdmav") && name.ends_with(".so")
            })
            .collect();
        found.sort();
        found.pop()
    })
}
