//! `cargo xtask golden [-- test args]`: the mlx5 direct path against libmlx5's own code.
//!
//! 1. installs what rdma-core's cmake needs (cmake, ninja, libnl, pkg-config), as the
//!    `packages` step does;
//! 2. fetches the `ibverbs-sys` crate (=0.3.2, which vendors rdma-core v55) **through
//!    cargo**, from a throw-away manifest under `target/golden/fetch` (`cargo fetch`), and
//!    finds its `vendor/rdma-core` in cargo's registry;
//! 3. configures that tree with cmake into `target/golden/rdma-core-build` and generates the
//!    two kernel-ABI headers `qp.c` needs (nothing else of rdma-core is built);
//! 4. runs `cargo test --release -p hotverbs-mlx5-golden` with `HOTVERBS_RDMA_CORE_SRC` /
//!    `HOTVERBS_RDMA_CORE_BUILD` set: its build script compiles `qp.c` and `cq.c` with our
//!    stubs and shim, and the tests compare our writer and poller with them
//!    (`golden: <N> WRs and <M> CQEs compared, <D> differences`).
//!
//! No rdma-core file is copied into the repository: the source stays in cargo's registry,
//! the build in `target/`.

use std::path::PathBuf;
use std::process::Command;

use crate::util::{cargo, root, run, show};

/// Runs `cmd` in `dir` (not the workspace root, which [`run`] always uses), echoing it.
fn run_in(dir: &std::path::Path, cmd: &mut Command) -> Result<(), String> {
    cmd.current_dir(dir);
    eprintln!("$ (cd {} && {})", dir.display(), show(cmd));
    let st = cmd.status().map_err(|e| format!("{}: {e}", show(cmd)))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("`{}` failed ({st})", show(cmd)))
    }
}

/// What rdma-core's cmake configuration needs.
pub const PACKAGES: &[&str] = &[
    "cmake",
    "ninja-build",
    "libnl-3-dev",
    "libnl-route-3-dev",
    "pkg-config",
];

/// The crate that vendors rdma-core, and the version its source is pinned to.
const CRATE: &str = "ibverbs-sys";
const VERSION: &str = "0.3.2+55.0";
/// The requirement written to the fetch manifest (cargo ignores `+build` metadata there).
const REQ: &str = "=0.3.2";

/// Prepares the rdma-core source and its cmake build directory; returns both.
pub fn prepare() -> Result<(PathBuf, PathBuf), String> {
    crate::ci::packages()?;
    let dir = root().join("target/golden");
    let fetch = dir.join("fetch");
    std::fs::create_dir_all(fetch.join("src")).map_err(|e| format!("{}: {e}", fetch.display()))?;
    std::fs::write(
        fetch.join("Cargo.toml"),
        format!(
            "# Written by `cargo xtask golden`: only to fetch {CRATE}'s vendored rdma-core.\n\
             [package]\nname = \"hotverbs-golden-fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             publish = false\n\n[dependencies]\n{CRATE} = \"{REQ}\"\n\n[workspace]\n"
        ),
    )
    .map_err(|e| format!("writing the fetch manifest: {e}"))?;
    std::fs::write(fetch.join("src/lib.rs"), "").map_err(|e| e.to_string())?;
    run(cargo()
        .args(["fetch", "--manifest-path"])
        .arg(fetch.join("Cargo.toml")))?;
    let src = find_source()?;
    let build = dir.join("rdma-core-build");
    let headers = [
        "include/kernel-abi/ib_user_verbs.h",
        "include/kernel-abi/mlx5-abi.h",
    ];
    if !headers.iter().all(|h| build.join(h).is_file()) {
        std::fs::create_dir_all(&build).map_err(|e| format!("{}: {e}", build.display()))?;
        run_in(
            &build,
            Command::new("cmake")
                .args([
                    "-GNinja",
                    "-DNO_MAN_PAGES=1",
                    "-DNO_PYVERBS=1",
                    "-DENABLE_STATIC=1",
                    "-DENABLE_RESOLVE_NEIGH=0",
                    "-DCMAKE_BUILD_TYPE=Debug",
                ])
                .arg(&src),
        )?;
        run_in(&build, Command::new("ninja").args(headers))?;
    }
    eprintln!("golden: rdma-core {} in {}", VERSION, src.display());
    Ok((src, build))
}

/// `$CARGO_HOME/registry/src/*/ibverbs-sys-<version>/vendor/rdma-core`.
fn find_source() -> Result<PathBuf, String> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let reg = home.join("registry/src");
    let entries = std::fs::read_dir(&reg).map_err(|e| format!("{}: {e}", reg.display()))?;
    for e in entries.flatten() {
        let cand = e
            .path()
            .join(format!("{CRATE}-{VERSION}"))
            .join("vendor/rdma-core");
        if cand.join("providers/mlx5/qp.c").is_file() {
            return Ok(cand);
        }
    }
    Err(format!(
        "cargo fetched {CRATE} {VERSION} but no registry directory under {} holds its \
         vendor/rdma-core/providers/mlx5/qp.c",
        reg.display()
    ))
}

/// The environment the golden crate's build script reads.
pub fn env(cmd: &mut Command, src: &std::path::Path, build: &std::path::Path) {
    cmd.env("HOTVERBS_RDMA_CORE_SRC", src)
        .env("HOTVERBS_RDMA_CORE_BUILD", build);
}

/// Entry point of `cargo xtask golden [-- args for the test binaries]`.
pub fn run_golden(args: &[String]) -> Result<(), String> {
    let extra: Vec<&String> = match args.split_first() {
        Some((sep, rest)) if sep == "--" => rest.iter().collect(),
        Some((a, _)) => return Err(format!("unknown argument {a:?} (pass test args after --)")),
        None => Vec::new(),
    };
    let (src, build) = prepare()?;
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--release",
        "--locked",
        "-p",
        "hotverbs-mlx5-golden",
        "--",
        "--nocapture",
    ]);
    cmd.args(extra);
    env(&mut cmd, &src, &build);
    run(&mut cmd)
}
