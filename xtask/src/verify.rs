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

/// Wall-clock seconds of fuzzing in a CI run (`cargo xtask fuzz` without arguments), split
/// over the targets by [`fuzz_tuning`] and run [`FUZZ_LANES`] at a time.
const FUZZ_CI_SECONDS: u32 = 150;
/// Executions CI requires from one run, summed over the targets.
const FUZZ_CI_MIN_EXECS: u64 = 10_000_000;
/// Targets fuzzed at once (one libFuzzer process each): the CI machine has two cores.
const FUZZ_LANES: usize = 2;
/// No target gets less than this in a CI run.
const FUZZ_MIN_SECONDS: u32 = 15;

/// How one target is run: its share of the CI fuzzing time, libFuzzer's `-max_len`, and
/// whether it is built with AddressSanitizer.
struct FuzzTuning {
    /// Relative share of [`FUZZ_CI_SECONDS`] x [`FUZZ_LANES`].
    weight: u32,
    /// Input size cap (None: libFuzzer's default, 4096 bytes).
    max_len: Option<u32>,
    /// Built with `--sanitizer none` into `target/fuzz-plain` (else AddressSanitizer, into
    /// `target/fuzz`).
    plain: bool,
}

/// Per-target tuning (measured in `fuzz/README.md`, "Executions"). The two decoders read at
/// most 64 bytes and reach no unsafe code but two `u32` union reads, so AddressSanitizer
/// would watch nothing there: they are built without it (debug assertions and overflow
/// checks stay on), which makes them four to five times faster, and they carry most of the
/// execution count in a fraction of the time. The four stateful targets keep
/// AddressSanitizer (rings, providers and shims there hand raw pointers around) and get
/// most of the time; the two that decode operation lists are capped at 384 bytes (their 48
/// or 64 operations).
fn fuzz_tuning(target: &str) -> FuzzTuning {
    let (weight, max_len, plain) = match target {
        "exchange" | "completions" => (7, Some(64), true),
        "recv_ring" | "split" => (13, Some(384), false),
        _ => (10, None, false),
    };
    FuzzTuning {
        weight,
        max_len,
        plain,
    }
}

/// `cargo xtask fuzz [--seconds N] [--min-execs N] [target...]`: builds the targets (or the
/// named ones), then runs them [`FUZZ_LANES`] at a time, each from the committed seeds in
/// `fuzz/corpus/<target>`. New corpus entries go to `target/fuzz-corpus/<target>`, never
/// into the repository; crashes to `fuzz/artifacts/<target>/`.
///
/// Without arguments (what `cargo xtask ci` runs) the targets share
/// [`FUZZ_CI_SECONDS`] of wall-clock time by [`fuzz_tuning`] and the run fails below
/// [`FUZZ_CI_MIN_EXECS`] executions in total. `--seconds N` gives every target N seconds
/// instead (no floor unless `--min-execs` is given). Prints one line per target from
/// libFuzzer's final stats (`-print_final_stats=1`) and a total.
///
/// cargo-fuzz needs nightly flags: `RUSTC_BOOTSTRAP=1` lets stable accept them.
pub fn fuzz(args: &[String]) -> Result<(), String> {
    let mut seconds: Option<u32> = None;
    let mut min_execs: Option<u64> = None;
    let mut targets: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = Some(
                    it.next()
                        .and_then(|s| s.parse().ok())
                        .ok_or("--seconds needs a number")?,
                )
            }
            "--min-execs" => {
                min_execs = Some(
                    it.next()
                        .and_then(|s| s.replace('_', "").parse().ok())
                        .ok_or("--min-execs needs a number")?,
                )
            }
            t if t.starts_with('-') => return Err(format!("cargo xtask fuzz: unknown flag {t}")),
            t => targets.push(t.to_string()),
        }
    }
    let ci = args.is_empty();
    let min_execs = min_execs.unwrap_or(if ci { FUZZ_CI_MIN_EXECS } else { 0 });
    if !have_cargo_fuzz() {
        eprintln!("cargo-fuzz not found: installing it (cargo install cargo-fuzz --locked)");
        run(cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let fuzz_dir = root().join("fuzz");
    let named = !targets.is_empty();
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
    // Build first, so the timed runs are only fuzzing: the AddressSanitizer targets (all of
    // them in one cargo call, or the named ones) into target/fuzz, the plain ones one by one
    // into target/fuzz-plain (another target dir: different flags would rebuild each other).
    let mut builds: Vec<(Option<&String>, bool)> = Vec::new();
    if named {
        builds.extend(targets.iter().map(|t| (Some(t), fuzz_tuning(t).plain)));
    } else {
        builds.push((None, false));
        builds.extend(
            targets
                .iter()
                .filter(|t| fuzz_tuning(t).plain)
                .map(|t| (Some(t), true)),
        );
    }
    for (t, plain) in builds {
        let mut build = cargo();
        build
            .args(["fuzz", "build", "--release"])
            .args(if plain {
                &["--sanitizer", "none"][..]
            } else {
                &[]
            })
            .args(t)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("CARGO_TARGET_DIR", fuzz_target_dir(plain));
        run_in(&mut build, &fuzz_dir)?;
    }
    let host = host_triple()?;
    let plan: Vec<(String, u32)> = match seconds {
        Some(s) => targets.iter().map(|t| (t.clone(), s)).collect(),
        None if ci => fuzz_shares(&targets, FUZZ_CI_SECONDS),
        None => targets.iter().map(|t| (t.clone(), 20)).collect(),
    };
    let lanes = fuzz_lanes(&plan);
    eprintln!(
        "fuzz: {} targets, {} at a time: {}",
        plan.len(),
        lanes.len(),
        plan.iter()
            .map(|(t, s)| format!("{t} {s} s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let wall = std::time::Instant::now();
    let results: Vec<Result<Vec<FuzzRun>, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = lanes
            .iter()
            .map(|lane| {
                let (host, fuzz_dir) = (&host, &fuzz_dir);
                scope.spawn(move || {
                    lane.iter()
                        .map(|(t, s)| {
                            let bin_dir = fuzz_target_dir(fuzz_tuning(t).plain)
                                .join(host)
                                .join("release");
                            fuzz_one(&bin_dir, fuzz_dir, t, *s)
                        })
                        .collect::<Result<Vec<_>, String>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("fuzz lane panicked".into()))
            })
            .collect()
    });
    let wall = wall.elapsed().as_secs_f64();
    let mut runs = Vec::new();
    let mut failures = Vec::new();
    for r in results {
        match r {
            Ok(v) => runs.extend(v),
            Err(e) => failures.push(e),
        }
    }
    runs.sort_by(|a, b| a.target.cmp(&b.target));
    let mut total = 0u64;
    let mut busy = 0f64;
    for r in &runs {
        eprintln!(
            "fuzz: {} {} execs in {:.0} s ({:.0}/s)",
            r.target,
            r.execs,
            r.secs,
            r.execs as f64 / r.secs.max(1e-9)
        );
        total += r.execs;
        busy += r.secs;
    }
    eprintln!(
        "fuzz: total {total} execs in {wall:.0} s wall, {busy:.0} s of target runs ({:.0}/s)",
        total as f64 / wall.max(1e-9)
    );
    if !failures.is_empty() {
        return Err(failures.join("\n"));
    }
    if total < min_execs {
        return Err(format!(
            "fuzz: {total} executions in total, below the required {min_execs} \
             (--min-execs): a target got slower, or the machine is busy"
        ));
    }
    eprintln!(
        "fuzz: {} targets ran without a finding{}",
        runs.len(),
        if min_execs > 0 {
            format!(", {total} >= {min_execs} executions")
        } else {
            String::new()
        }
    );
    Ok(())
}

/// One target's run: its executions and wall-clock seconds.
struct FuzzRun {
    target: String,
    execs: u64,
    secs: f64,
}

/// Seconds per target: `total * lanes` shared by weight, at least [`FUZZ_MIN_SECONDS`].
fn fuzz_shares(targets: &[String], total: u32) -> Vec<(String, u32)> {
    let lanes = FUZZ_LANES.min(targets.len()) as u32;
    let sum: u32 = targets.iter().map(|t| fuzz_tuning(t).weight).sum();
    targets
        .iter()
        .map(|t| {
            let s = total * lanes * fuzz_tuning(t).weight / sum.max(1);
            (t.clone(), s.max(FUZZ_MIN_SECONDS))
        })
        .collect()
}

/// Splits the plan into at most [`FUZZ_LANES`] lanes of about equal time (longest first,
/// each to the lane with the least so far).
fn fuzz_lanes(plan: &[(String, u32)]) -> Vec<Vec<(String, u32)>> {
    let mut sorted = plan.to_vec();
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut lanes: Vec<Vec<(String, u32)>> = vec![Vec::new(); FUZZ_LANES.min(plan.len())];
    for item in sorted {
        let lane = lanes
            .iter_mut()
            .min_by_key(|l| l.iter().map(|(_, s)| s).sum::<u32>())
            .expect("at least one lane");
        lane.push(item);
    }
    lanes
}

/// Runs one built target for `seconds` (its libFuzzer output goes to
/// `target/fuzz-logs/<target>.log`; on a failure its tail is printed) and reads the
/// number of executions from its final stats.
fn fuzz_one(
    bin_dir: &Path,
    fuzz_dir: &Path,
    target: &str,
    seconds: u32,
) -> Result<FuzzRun, String> {
    let scratch = root().join("target/fuzz-corpus").join(target);
    let artifacts = fuzz_dir.join("artifacts").join(target);
    let logs = root().join("target/fuzz-logs");
    for d in [&scratch, &artifacts, &logs] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let log_path = logs.join(format!("{target}.log"));
    let log =
        std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let mut cmd = Command::new(bin_dir.join(target));
    // libFuzzer writes new inputs into the first directory only: the scratch one. The
    // committed seeds are read, never written.
    cmd.arg(&scratch);
    let seeds = fuzz_dir.join("corpus").join(target);
    if seeds.is_dir() {
        cmd.arg(&seeds);
    }
    let tuning = fuzz_tuning(target);
    if let Some(n) = tuning.max_len {
        cmd.arg(format!("-max_len={n}"));
    }
    cmd.arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg(format!("-max_total_time={seconds}"))
        .arg("-print_final_stats=1")
        // `ring` and `softnic_post` model softnic's Spec profile on the default device;
        // targets that fuzz both profiles pick them per input.
        .env_remove("HOTVERBS_SOFTNIC_PROFILE")
        .current_dir(fuzz_dir)
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    eprintln!(
        "$ (cd {}) {} 2> {}",
        fuzz_dir.display(),
        crate::util::show(&cmd),
        log_path.display()
    );
    let start = std::time::Instant::now();
    let status = cmd
        .status()
        .map_err(|e| format!("{}: {e}", crate::util::show(&cmd)))?;
    let secs = start.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    if !status.success() {
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(80)..].join("\n");
        return Err(format!(
            "fuzz target {target} failed ({status}); last lines of {}:\n{tail}",
            log_path.display()
        ));
    }
    let execs = text
        .lines()
        .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| {
            format!(
                "fuzz target {target}: no stat::number_of_executed_units in {}",
                log_path.display()
            )
        })?;
    Ok(FuzzRun {
        target: target.to_string(),
        execs,
        secs,
    })
}

/// Where cargo-fuzz builds AddressSanitizer targets, or `plain` (`--sanitizer none`) ones.
fn fuzz_target_dir(plain: bool) -> std::path::PathBuf {
    root().join(if plain {
        "target/fuzz-plain"
    } else {
        "target/fuzz"
    })
}

/// The host's target triple (`rustc -vV`), under which cargo-fuzz puts its binaries.
fn host_triple() -> Result<String, String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .arg("-vV")
        .output()
        .map_err(|e| format!("{rustc} -vV: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
        .ok_or_else(|| format!("{rustc} -vV: no host line"))
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
