//! Compiles rdma-core's `providers/mlx5/qp.c` and `cq.c` with our stubs and shim, twice:
//! `hv_golden_hooked` against `util/mmio.h` and `util/udma_barrier.h` patched (into
//! `OUT_DIR`, never into the source) to report every MMIO store and barrier, linked into
//! the tests; `hv_golden_plain` as rdma-core ships them, linked into the `golden-insn`
//! binary whose instruction counts must not include the hooks.
//!
//! The source comes from `HOTVERBS_RDMA_CORE_SRC` (the `vendor/rdma-core` of the
//! `ibverbs-sys` crate, fetched through cargo) and `HOTVERBS_RDMA_CORE_BUILD` (its cmake
//! build directory with the generated headers), both set by `cargo xtask golden`. Without
//! them nothing is compiled and the crate builds with `cfg(golden_missing)`: its tests say
//! they were skipped.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rustc-check-cfg=cfg(golden_missing)");
    println!("cargo:rerun-if-env-changed=HOTVERBS_RDMA_CORE_SRC");
    println!("cargo:rerun-if-env-changed=HOTVERBS_RDMA_CORE_BUILD");
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-changed=csrc/stubs.c");
    let (Some(src), Some(build)) = (
        std::env::var_os("HOTVERBS_RDMA_CORE_SRC").map(PathBuf::from),
        std::env::var_os("HOTVERBS_RDMA_CORE_BUILD").map(PathBuf::from),
    ) else {
        println!("cargo:rustc-cfg=golden_missing");
        return;
    };
    let mlx5 = src.join("providers/mlx5");
    // A missing file counts as changed: the script runs again once `cargo xtask golden`
    // has generated the headers.
    println!("cargo:rerun-if-changed={}", mlx5.join("qp.c").display());
    println!(
        "cargo:rerun-if-changed={}",
        build.join("include/kernel-abi/mlx5-abi.h").display()
    );
    if !mlx5.join("qp.c").is_file() || !build.join("include/kernel-abi/mlx5-abi.h").is_file() {
        println!(
            "cargo:warning=HOTVERBS_RDMA_CORE_SRC/BUILD do not hold a configured rdma-core \
             ({} / {}): golden tests skipped; run `cargo xtask golden`",
            src.display(),
            build.display()
        );
        println!("cargo:rustc-cfg=golden_missing");
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let hooked = out.join("hooked");
    std::fs::create_dir_all(hooked.join("util")).expect("create override dir");
    patch_mmio(&src.join("util/mmio.h"), &hooked.join("util/mmio.h"));
    patch_barriers(
        &src.join("util/udma_barrier.h"),
        &hooked.join("util/udma_barrier.h"),
    );
    for f in ["qp.c", "cq.c", "srq.c"] {
        println!("cargo:rerun-if-changed={}", mlx5.join(f).display());
    }
    let libs = [
        ("hv_golden_hooked", Some(&hooked)),
        ("hv_golden_plain", None),
    ];
    for (name, over) in libs {
        let mut b = cc::Build::new();
        if let Some(o) = over {
            b.include(o);
        }
        b.include(build.join("include"))
            .include(&mlx5)
            .define("VERBS_DEBUG", None)
            .flag("-std=gnu11")
            .opt_level(2)
            .warnings(false)
            .cargo_metadata(false)
            .file(mlx5.join("qp.c"))
            .file(mlx5.join("cq.c"))
            .file(mlx5.join("srq.c"))
            .file("csrc/stubs.c")
            .file("csrc/shim.c")
            .compile(name);
    }
    let a = |n: &str| out.join(format!("lib{n}.a")).display().to_string();
    // The provider's functions (and our stubs and shim), for `cargo xtask insn` to count
    // as the device.
    let nm = std::process::Command::new("nm")
        .args(["--defined-only", &a("hv_golden_plain")])
        .output()
        .expect("nm (binutils)");
    assert!(nm.status.success(), "nm failed on the golden library");
    let mut syms: Vec<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && matches!(f[1], "T" | "t")).then(|| f[2].to_string())
        })
        .filter(|n| !n.starts_with("hv_measured_"))
        .collect();
    syms.sort();
    syms.dedup();
    std::fs::write(out.join("provider-symbols.txt"), syms.join("\n") + "\n")
        .expect("write provider-symbols.txt");
    // The tests record stores and barriers; the instruction counts run libmlx5 unpatched.
    println!("cargo:rustc-link-arg-tests={}", a("hv_golden_hooked"));
    println!("cargo:rustc-link-arg-tests=-lpthread");
    println!("cargo:rustc-link-arg-bins={}", a("hv_golden_plain"));
    println!("cargo:rustc-link-arg-bins=-lpthread");
}

/// `util/mmio.h` with a call to `hv_mmio_hook(addr, bytes, raw)` before each store.
fn patch_mmio(from: &Path, to: &Path) {
    let text = std::fs::read_to_string(from).expect("read util/mmio.h");
    let store = "\t{                                                                      \\\n\t\tatomic_store_explicit((_Atomic(uint##_SZ_##_t) *)addr,         \\\n";
    let hooked = "\t{                                                                      \\\n\t\thv_mmio_hook(addr, (_SZ_) / 8, (uint64_t)(__force uint##_SZ_##_t)value); \\\n\t\tatomic_store_explicit((_Atomic(uint##_SZ_##_t) *)addr,         \\\n";
    let n = text.matches(store).count();
    assert_eq!(
        n, 2,
        "util/mmio.h: expected the be and le store bodies of MAKE_WRITE, found {n}: the \
         patch must be updated for this rdma-core"
    );
    let text = text.replace(store, hooked);
    let decl = "#include <stdint.h>\nvoid hv_mmio_hook(void *addr, unsigned size, uint64_t raw);\n";
    std::fs::write(to, format!("{decl}{text}")).expect("write patched mmio.h");
}

/// `util/udma_barrier.h` whose x86-64 barriers also call `hv_barrier_hook(kind)`.
fn patch_barriers(from: &Path, to: &Path) {
    let mut text = std::fs::read_to_string(from).expect("read util/udma_barrier.h");
    let subs = [
        (
            "#elif defined(__x86_64__)\n#define udma_to_device_barrier() asm volatile(\"\" ::: \"memory\")",
            "#elif defined(__x86_64__)\n#define udma_to_device_barrier() hv_barrier_hook(1)",
        ),
        (
            "#elif defined(__x86_64__)\n#define udma_from_device_barrier() asm volatile(\"lfence\" ::: \"memory\")",
            "#elif defined(__x86_64__)\n#define udma_from_device_barrier() hv_barrier_hook(4)",
        ),
        (
            "#define mmio_flush_writes() asm volatile(\"sfence\" ::: \"memory\")",
            "#define mmio_flush_writes() hv_barrier_hook(3)",
        ),
        (
            "#define mmio_wc_start() mmio_flush_writes()",
            "#define mmio_wc_start() hv_barrier_hook(2)",
        ),
    ];
    for (a, b) in subs {
        let n = text.matches(a).count();
        assert_eq!(
            n, 1,
            "util/udma_barrier.h: expected one {a:?}, found {n}: update the patch for this \
             rdma-core"
        );
        text = text.replace(a, b);
    }
    std::fs::write(to, format!("void hv_barrier_hook(int kind);\n{text}"))
        .expect("write patched udma_barrier.h");
}
