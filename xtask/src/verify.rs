//! `cargo xtask loom` and `cargo xtask fuzz`: the machine-checked parts of verification.

use std::path::Path;
use std::process::Command;

use crate::util::{cargo, root, run};

/// Default preemption bound of the loom models (each model may be exhaustive up to it).
const LOOM_MAX_PREEMPTIONS: &str = "3";

/// Workspace packages that carry a `tests/loom.rs` model, as (package, directory).
fn loom_crates() -> Vec<(String, String)> {
    let mut v = Vec::new();
    for (pkg, dir) in [
        ("hotverbs-datapath", "datapath"),
        ("hotverbs-softnic", "softnic"),
        ("hotverbs-ffi", "verbs-ffi"),
        ("hotverbs", "verbs"),
    ] {
        if root().join(dir).join("tests/loom.rs").exists() {
            v.push((pkg.to_string(), dir.to_string()));
        }
    }
    v
}

/// `cargo xtask loom`: every loom model, release mode, bounded preemptions, own target dir
/// (the `--cfg loom` build must not invalidate the normal one).
pub fn loom(_args: &[String]) -> Result<(), String> {
    let crates = loom_crates();
    if crates.is_empty() {
        return Err("no tests/loom.rs found in any crate".into());
    }
    let preempt =
        std::env::var("LOOM_MAX_PREEMPTIONS").unwrap_or_else(|_| LOOM_MAX_PREEMPTIONS.into());
    for (pkg, _) in crates {
        run(cargo()
            .args([
                "test",
                "--locked",
                "--release",
                "-p",
                &pkg,
                "--test",
                "loom",
            ])
            .env("RUSTFLAGS", "--cfg loom")
            .env("CARGO_TARGET_DIR", root().join("target/loom"))
            .env("LOOM_MAX_PREEMPTIONS", &preempt))?;
    }
    Ok(())
}

fn have_cargo_fuzz() -> bool {
    cargo()
        .args(["fuzz", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// `cargo xtask fuzz [--seconds N] [target...]`: every target (or the named ones) for N
/// seconds each (default 20), starting from the committed seeds in `fuzz/corpus/<target>`.
/// New corpus entries go to `target/fuzz-corpus/<target>`, not into the repository.
/// cargo-fuzz needs nightly flags: `RUSTC_BOOTSTRAP=1` lets stable accept them.
pub fn fuzz(args: &[String]) -> Result<(), String> {
    let mut seconds = 20u32;
    let mut targets: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .ok_or("--seconds needs a number")?
            }
            t => targets.push(t.to_string()),
        }
    }
    if !have_cargo_fuzz() {
        eprintln!("cargo-fuzz not found: installing it (cargo install cargo-fuzz --locked)");
        run(cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let fuzz_dir = root().join("fuzz");
    if targets.is_empty() {
        let out = cargo()
            .args(["fuzz", "list"])
            .current_dir(&fuzz_dir)
            .output()
            .map_err(|e| format!("cargo fuzz list: {e}"))?;
        targets = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
    }
    if targets.is_empty() {
        return Err("no fuzz targets found (cargo fuzz list in fuzz/)".into());
    }
    for t in &targets {
        let scratch = root().join("target/fuzz-corpus").join(t);
        std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
        let seeds = fuzz_dir.join("corpus").join(t);
        let mut cmd = cargo();
        cmd.args(["fuzz", "run", "--release", t])
            .arg(&scratch)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("CARGO_TARGET_DIR", root().join("target/fuzz"));
        if Path::new(&seeds).is_dir() {
            cmd.arg(&seeds);
        }
        cmd.args([
            "--",
            &format!("-max_total_time={seconds}"),
            "-print_final_stats=1",
        ]);
        run_in(&mut cmd, &fuzz_dir)?;
    }
    eprintln!(
        "fuzz: {} targets ran {seconds} s each without a finding",
        targets.len()
    );
    Ok(())
}

fn run_in(cmd: &mut Command, dir: &Path) -> Result<(), String> {
    eprintln!("$ (cd {}) {}", dir.display(), crate::util::show(cmd));
    let status = cmd
        .current_dir(dir)
        .status()
        .map_err(|e| format!("{}: {e}", crate::util::show(cmd)))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{}` failed ({status})", crate::util::show(cmd)))
    }
}
