//! Compiles `csrc/equiv.c`: non-inline C wrappers around verbs.h's own static inlines, plus
//! recording stand-ins for the exported libibverbs symbols their fallbacks call (libibverbs
//! itself is never linked). Needs `infiniband/verbs.h` (Debian/Ubuntu: libibverbs-dev).

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=csrc/equiv.c");
    println!("cargo:rerun-if-changed=build.rs");
    let header_dirs = ["/usr/include", "/usr/local/include"];
    if !header_dirs
        .iter()
        .any(|d| Path::new(d).join("infiniband/verbs.h").exists())
        && std::env::var_os("CPATH").is_none()
    {
        println!(
            "cargo:warning=infiniband/verbs.h not found: hotverbs-ffi-equiv compiles verbs.h's \
             inlines in C; install libibverbs-dev (Debian/Ubuntu) or rdma-core-devel (Fedora)"
        );
    }
    cc::Build::new()
        .file("csrc/equiv.c")
        .warnings(true)
        .extra_warnings(true)
        .flag_if_supported("-Wno-unused-parameter")
        .std("gnu11")
        .compile("hotverbs_ffi_equiv_c");
}
