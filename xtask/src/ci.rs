//! `cargo xtask ci`: the one place the checks live. `.ci/run` calls it on a fresh clone.
//!
//! Steps, in order (each prints a `==> step` header and its duration; the first failure
//! stops the run with a non-zero exit):
//! 1. `packages`  apt-get install what is missing (root only; otherwise say what to install)
//! 2. `fmt`       cargo fmt --all --check
//! 3. `clippy`    cargo clippy --workspace --all-targets -D warnings
//! 4. `docs`      cargo doc --workspace --no-deps with RUSTDOCFLAGS=-D warnings
//! 5. `package`   the publishable crates as `cargo publish` would upload them: file lists
//!    and sizes, licences, each `.crate` built, docs as docs.rs builds them
//!    (`cargo xtask package`; not to be confused with `packages`, the Debian ones)
//! 6. `codegen`   regenerate the bindings and diff (drift), plus a self-check that a
//!    hand-edited generated file is caught
//! 7. `no_std`    the no_std crates built with --no-default-features, and hotverbs checked
//!    for arm64, riscv64 and POWER Linux (`rustup target add` when missing)
//! 8. `test`      cargo test --workspace (summary lines reach the output)
//! 9. `faults`    the datapath, setup-layer and perf suites again on softnic's Rxe
//!    behaviour profile (`HOTVERBS_SOFTNIC_PROFILE=rxe`), the fault-scenario suite
//!    (`--release --test fault_scenarios`) in both profiles, and the soak under faults
//!    (`--release --test soak`: 10 million messages per profile)
//! 10. `golden`    the mlx5 direct path against libmlx5's own `qp.c` / `cq.c` (compiled from
//!     the rdma-core the `ibverbs-sys` crate vendors, fetched through cargo): 1 M random
//!     WRs and the CQE streams compared byte for byte (`cargo xtask golden`)
//! 11. `insn`      callgrind instructions per message vs the naive baseline, our own code
//!     and the device apart, gated on the own-code and ratio targets; and the mlx5 table
//!     (our rings and libmlx5 in the golden environment)
//!     (`cargo xtask insn --gate`; deterministic, so a regression gate)
//! 12. `loom`     the loom models (`cargo xtask loom`)
//! 13. `miri`     the soundness tests under miri, Stacked and Tree Borrows
//!     (`cargo xtask miri`; installs the nightly toolchain with miri if missing)
//! 14. `fuzz`     a time-boxed smoke run of every fuzz target (`cargo xtask fuzz`)
//! 15. `rxe`      the real-device suite on Soft-RoCE in QEMU (`cargo xtask rxe`)
//!
//! `--skip a,b` and `--only a,b` select steps for local loops; CI runs them all.

use std::process::Command;
use std::time::Instant;

use crate::util::{cargo, root, run};

/// Debian packages the checks need (headers + libclang for codegen, rdma-core libraries for
/// the run-time loader tests, valgrind for `xtask insn`); the rxe harness adds its own.
const PACKAGES: &[&str] = &[
    "libibverbs-dev",
    "librdmacm-dev",
    "ibverbs-providers",
    "rdma-core",
    "ibverbs-utils",
    "rdmacm-utils",
    "perftest",
    "libclang-dev",
    "clang",
    "valgrind",
    "binutils",
];

const STEPS: &[&str] = &[
    "packages", "fmt", "clippy", "docs", "package", "codegen", "no_std", "test", "faults",
    "golden", "insn", "loom", "miri", "fuzz", "rxe",
];

/// Entry point of `cargo xtask ci [--skip a,b] [--only a,b]`.
pub fn run_ci(args: &[String]) -> Result<(), String> {
    let mut skip: Vec<String> = Vec::new();
    let mut only: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--skip" => skip.extend(list(it.next())?),
            "--only" => only.extend(list(it.next())?),
            other => return Err(format!("unknown option {other:?} (use --skip/--only)")),
        }
    }
    for s in skip.iter().chain(&only) {
        if !STEPS.contains(&s.as_str()) {
            return Err(format!("unknown step {s:?}; steps: {}", STEPS.join(", ")));
        }
    }
    let t0 = Instant::now();
    for step in STEPS {
        let selected =
            (only.is_empty() || only.iter().any(|s| s == step)) && !skip.iter().any(|s| s == step);
        if !selected {
            eprintln!("==> {step}: skipped (--skip/--only)");
            continue;
        }
        eprintln!("==> {step}");
        let t = Instant::now();
        let r = match *step {
            "packages" => packages(),
            "fmt" => run(cargo().args(["fmt", "--all", "--check"])),
            "clippy" => run(cargo()
                .args(["clippy", "--workspace", "--all-targets", "--locked", "--"])
                .args(["-D", "warnings"])),
            "docs" => run(cargo()
                .args(["doc", "--workspace", "--no-deps", "--locked"])
                .env("RUSTDOCFLAGS", "-D warnings")),
            "package" => crate::package::run_package(&[]),
            "codegen" => codegen_checks(),
            "no_std" => no_std(),
            "test" => run(cargo().args(["test", "--workspace", "--locked"])),
            "faults" => faults(),
            "golden" => crate::golden::run_golden(&[]),
            "insn" => crate::insn::run(&["--gate".to_string()]),
            "loom" => crate::verify::loom(&[]),
            "miri" => crate::miri::run_miri(&[]),
            "fuzz" => crate::verify::fuzz(&[]),
            // One run per perf row: CI proves each works beside perftest; docs/perf.md's
            // medians come from `cargo xtask rxe` (3 runs each).
            "rxe" => crate::rxe::run(&["--repeats".to_string(), "1".to_string()]),
            _ => unreachable!("step list and match agree"),
        };
        eprintln!("<== {step}: {:.1} s", t.elapsed().as_secs_f64());
        r.map_err(|e| format!("step {step} failed: {e}"))?;
    }
    eprintln!(
        "ci: all steps passed in {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The `faults` step: the suites on softnic's Rxe profile, the fault scenarios in both
/// profiles, the soak.
///
/// The suites run as `cargo test --workspace` built them (after the `test` step, nothing
/// is compiled): their executables, each in its package's directory as `cargo test` runs
/// it, then the workspace's doctests. `cargo test -p` of the three packages would select a
/// smaller feature set (the workspace turns on, for one, `hotverbs-ffi`'s `default`) and
/// rebuild most of the dependency tree for it (about 100 s of a fresh clone's CI). Other
/// packages' tests are not for this profile (`hotverbs-ffi-equiv` compares the Spec
/// profile's answers with the header's).
fn faults() -> Result<(), String> {
    const PROFILE: &str = "HOTVERBS_SOFTNIC_PROFILE";
    eprintln!("faults: datapath, setup-layer and perf suites on softnic's Rxe profile");
    let exes = crate::rxe::workspace_test_executables(&[
        "hotverbs-datapath",
        "hotverbs",
        "hotverbs-perf",
    ])?;
    for (package, dir, exe) in &exes {
        // In the package's directory, as `cargo test` runs it.
        eprintln!(
            "$ (cd {} && {PROFILE}=rxe {})",
            dir.display(),
            exe.display()
        );
        let status = Command::new(exe)
            .current_dir(dir)
            .env(PROFILE, "rxe")
            .status()
            .map_err(|e| format!("{}: {e}", exe.display()))?;
        if !status.success() {
            return Err(format!("{package}: `{}` failed ({status})", exe.display()));
        }
    }
    run(cargo()
        .args(["test", "--locked", "--workspace", "--doc"])
        .env(PROFILE, "rxe"))?;
    for profile in ["spec", "rxe"] {
        eprintln!("faults: fault_scenarios on softnic's {profile} profile");
        run(cargo()
            .args(["test", "--release", "--locked", "--test", "fault_scenarios"])
            .args(["--", "--nocapture"])
            .env(PROFILE, profile))?;
    }
    eprintln!("faults: soak under faults, both profiles");
    run(cargo()
        .args(["test", "--release", "--locked", "--test", "soak"])
        .args(["--", "--nocapture"]))
}

fn list(v: Option<&String>) -> Result<Vec<String>, String> {
    let v = v.ok_or("--skip/--only need a comma-separated list")?;
    Ok(v.split(',').map(str::to_string).collect())
}

/// Installed Debian packages among `pkgs` that are missing.
pub fn missing_packages(pkgs: &[&str]) -> Vec<String> {
    pkgs.iter()
        .filter(|p| {
            let out = Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output();
            !matches!(out, Ok(o) if String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .map(|p| p.to_string())
        .collect()
}

/// Installs the missing packages (ours and the rxe harness's) with apt-get when root.
pub fn packages() -> Result<(), String> {
    let mut all: Vec<&str> = PACKAGES.to_vec();
    for p in crate::rxe::packages().iter().chain(crate::golden::PACKAGES) {
        if !all.contains(p) {
            all.push(p);
        }
    }
    let missing = missing_packages(&all);
    if missing.is_empty() {
        eprintln!("all {} packages present", all.len());
        return Ok(());
    }
    let root_user = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !root_user {
        return Err(format!(
            "missing packages (run as root or install them): sudo apt-get install -y {}",
            missing.join(" ")
        ));
    }
    run(Command::new("apt-get")
        .args(["update", "-q"])
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// Drift check, then proof that the drift check bites: a copy of the generated files with
/// one hand edit must be reported out of date.
fn codegen_checks() -> Result<(), String> {
    crate::util::codegen(&["--check".to_string()])?;
    let tmp = root().join("target/codegen-selfcheck");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    let gen = root().join("verbs-ffi/src/generated");
    for entry in std::fs::read_dir(&gen).map_err(|e| format!("{}: {e}", gen.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        std::fs::copy(entry.path(), tmp.join(entry.file_name())).map_err(|e| e.to_string())?;
    }
    let victim = tmp.join("types.rs");
    let text = std::fs::read_to_string(&victim).map_err(|e| e.to_string())?;
    let edited = text.replacen("pub wr_id: u64,", "pub wr_id: u32,", 1);
    if edited == text {
        return Err("self-check: could not find a line to hand-edit in types.rs".into());
    }
    std::fs::write(&victim, edited).map_err(|e| e.to_string())?;
    // Run the check against the tampered copy and require the drift message itself: any
    // other failure (a build error, a missing header) must not pass as "caught".
    let out = cargo()
        .args([
            "run",
            "--quiet",
            "-p",
            "hotverbs-codegen",
            "--",
            "--check",
            "--against",
        ])
        .arg(&tmp)
        .current_dir(root())
        .output()
        .map_err(|e| format!("running codegen --check: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.contains("out of date: run `cargo xtask codegen` and commit")
    {
        eprintln!(
            "codegen self-check: a hand-edited generated file is reported out of date (good)"
        );
        Ok(())
    } else if out.status.success() {
        Err("codegen --check accepted a hand-edited generated file".into())
    } else {
        Err(format!(
            "codegen self-check failed for another reason:\n{stderr}"
        ))
    }
}

fn no_std() -> Result<(), String> {
    for p in ["hotverbs-ffi", "hotverbs-datapath"] {
        run(cargo().args(["build", "--locked", "-p", p, "--no-default-features"]))?;
    }
    // hotverbs without its default `softnic` feature builds, and softnic is not in its tree:
    // a production build never carries the software device.
    run(cargo().args([
        "build",
        "--locked",
        "-p",
        "hotverbs",
        "--no-default-features",
    ]))?;
    let out = cargo()
        .args([
            "tree",
            "--locked",
            "-p",
            "hotverbs",
            "--no-default-features",
        ])
        .current_dir(root())
        .output()
        .map_err(|e| format!("cargo tree: {e}"))?;
    let tree = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || tree.contains("hotverbs-softnic") {
        return Err(format!(
            "`cargo tree -p hotverbs --no-default-features` must succeed without \
             hotverbs-softnic:\n{tree}"
        ));
    }
    eprintln!("hotverbs --no-default-features: builds, no hotverbs-softnic in its tree");
    cross_check()
}

/// Targets hotverbs builds for besides the host: arm64 and riscv64 (the direct path's own
/// `asm!`) and POWER (no hardware doorbell there: the direct path refuses by name, the rest
/// must build).
const CROSS_TARGETS: &[&str] = &[
    "aarch64-unknown-linux-gnu",
    "riscv64gc-unknown-linux-gnu",
    "powerpc64le-unknown-linux-gnu",
];

/// `cargo check` of hotverbs (and so the datapath, the bindings and softnic) for each of
/// [`CROSS_TARGETS`], adding the target's standard library with rustup when it is missing.
/// Its own target directory: the host's artifacts stay as they are.
fn cross_check() -> Result<(), String> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map_err(|e| format!("rustup target list: {e} (the cross checks need rustup)"))?;
    let installed = String::from_utf8_lossy(&installed.stdout).into_owned();
    for t in CROSS_TARGETS {
        if !installed.lines().any(|l| l.trim() == *t) {
            run(Command::new("rustup").args(["target", "add", t]))?;
        }
        run(cargo()
            .args(["check", "--locked", "-p", "hotverbs", "--target", t])
            .env("CARGO_TARGET_DIR", root().join("target").join("cross")))?;
    }
    eprintln!("cross: hotverbs checks for {}", CROSS_TARGETS.join(", "));
    Ok(())
}
