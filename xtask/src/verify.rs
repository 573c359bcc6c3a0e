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

/// Executions CI requires from one run, summed over the targets. CI gives every target a
/// fixed number of runs ([`FuzzTuning::ci_runs`], libFuzzer's `-runs`), not a time: the
/// count is then reached on a busy machine too — it just takes longer — so the floor can
/// never fail because of load.
const FUZZ_CI_MIN_EXECS: u64 = 10_000_000;
/// Targets fuzzed at once (one libFuzzer process each): the CI machine has two cores.
const FUZZ_LANES: usize = 2;

/// What one target gets: a time, or (CI) a number of executions.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Budget {
    Seconds(u32),
    Runs(u64),
}

impl Budget {
    /// Expected seconds on this 2-core machine (for balancing the lanes).
    fn est_seconds(self, rate: u64) -> f64 {
        match self {
            Budget::Seconds(s) => f64::from(s),
            Budget::Runs(n) => n as f64 / rate.max(1) as f64,
        }
    }
}

/// How one target is run: its executions in a CI run, its expected rate, libFuzzer's
/// `-max_len`, and whether it is built with AddressSanitizer.
struct FuzzTuning {
    /// Executions in a CI run (`-runs`). The sum over the targets is at least
    /// [`FUZZ_CI_MIN_EXECS`] (a unit test checks it).
    ci_runs: u64,
    /// Executions per second measured with two targets at a time on the 2-core CI machine
    /// under load (`fuzz/README.md`), for balancing the lanes only.
    rate: u64,
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
/// most of the time (about 40–60 s each); the two that decode operation lists are capped at
/// 384 bytes (their 48 or 64 operations).
fn fuzz_tuning(target: &str) -> FuzzTuning {
    let (ci_runs, rate, max_len, plain) = match target {
        "exchange" => (7_300_000, 440_000, Some(64), true),
        "completions" => (2_400_000, 160_000, Some(64), true),
        "recv_ring" => (150_000, 2_500, Some(384), false),
        "split" => (200_000, 4_500, Some(384), false),
        "ring" => (150_000, 4_000, None, false),
        "softnic_post" => (100_000, 2_300, None, false),
        "wr_ring" => (150_000, 10_000, Some(384), false),
        "direct_ring" => (150_000, 8_000, Some(384), false),
        // The direct receive side (issue 30): 7,000/s measured, planted bug found in about
        // 4,000 runs; 80,000 (recv_session shares its ground) keeps the lanes under two minutes.
        "direct_recv" => (80_000, 7_000, Some(384), false),
        // The direct receive ring (RQ or SRQ), poller and RecvSession (issue 30): 4,500 to
        // 7,300/s measured, planted bug found in 7 k-12 k runs; about 7 s (the lanes are
        // full).
        "recv_session" => (50_000, 7_000, Some(384), false),
        // The safe API on softnic (a world of QPs, rings and pollers per input): slow per
        // execution, and slower as the process ages (softnic's mlx5 simulation scans every
        // QP slot ever made at each poll), so a short share: about 25 s (two full CI runs:
        // 615/s from a small corpus, 245/s from the committed seeds on a busy machine).
        "safe_api" => (10_000, 400, Some(512), false),
        // A new target: a share like the stateful ones until it is measured.
        _ => (100_000, 2_500, None, false),
    };
    FuzzTuning {
        ci_runs,
        rate,
        max_len,
        plain,
    }
}

/// `cargo xtask fuzz [--seconds N] [--min-execs N] [target...]`: builds the targets (or the
/// named ones), then runs them [`FUZZ_LANES`] at a time, each from the committed seeds in
/// `fuzz/corpus/<target>`. New corpus entries go to `target/fuzz-corpus/<target>`, never
/// into the repository; crashes to `fuzz/artifacts/<target>/`.
///
/// Without arguments (what `cargo xtask ci` runs) every target runs its
/// [`FuzzTuning::ci_runs`] executions (about 2 minutes in all on the idle 2-core machine,
/// longer when it is busy) and the run fails below [`FUZZ_CI_MIN_EXECS`] executions in
/// total. `--seconds N` gives every target N seconds instead (no floor unless
/// `--min-execs` is given); named targets without `--seconds` get 20 s. Prints one line per target from
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
    let plan: Vec<(String, Budget)> = targets
        .iter()
        .map(|t| {
            let b = match seconds {
                Some(s) => Budget::Seconds(s),
                None if ci => Budget::Runs(fuzz_tuning(t).ci_runs),
                None => Budget::Seconds(20),
            };
            (t.clone(), b)
        })
        .collect();
    let lanes = fuzz_lanes(&plan);
    eprintln!(
        "fuzz: {} targets, {} at a time: {}",
        plan.len(),
        lanes.len(),
        plan.iter()
            .map(|(t, b)| match b {
                Budget::Seconds(s) => format!("{t} {s} s"),
                Budget::Runs(n) => format!("{t} {n} runs"),
            })
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
                        .map(|(t, b)| {
                            let bin_dir = fuzz_target_dir(fuzz_tuning(t).plain)
                                .join(host)
                                .join("release");
                            fuzz_one(&bin_dir, fuzz_dir, t, *b)
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
    if ci {
        planted_library_bug(&fuzz_dir, &host)?;
    }
    Ok(())
}

/// CI's proof that `safe_api` finds a bug in the library itself, not only in its own
/// harness: built with `--features planted-library-bug` (issue 27's item 10 put back in
/// `hotverbs-datapath`: a receive completion handed to a send ring answered `Ok(0)`), the
/// target must fail on its committed corpus. Builds into the same target dir as the plain
/// run (the feature set differs, so only the crates above the datapath are rebuilt; the next
/// `cargo xtask fuzz` builds the ordinary binary again before it runs).
fn planted_library_bug(fuzz_dir: &Path, host: &str) -> Result<(), String> {
    const TARGET: &str = "safe_api";
    let start = std::time::Instant::now();
    let mut build = cargo();
    build
        .args([
            "fuzz",
            "build",
            "--release",
            "--features",
            "planted-library-bug",
            TARGET,
        ])
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_TARGET_DIR", fuzz_target_dir(false));
    run_in(&mut build, fuzz_dir)?;
    let scratch = root().join("target/fuzz-planted");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(scratch.join("artifacts")).map_err(|e| e.to_string())?;
    let bin = fuzz_target_dir(false)
        .join(host)
        .join("release")
        .join(TARGET);
    let out = Command::new(&bin)
        .arg(fuzz_dir.join("corpus").join(TARGET))
        .arg(format!(
            "-artifact_prefix={}/",
            scratch.join("artifacts").display()
        ))
        .arg("-runs=0")
        .env_remove("HOTVERBS_SOFTNIC_PROFILE")
        .current_dir(fuzz_dir)
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stderr);
    let found = !out.status.success() && text.contains("took a completion that is not its own");
    if !found {
        let lines: Vec<&str> = text.lines().collect();
        return Err(format!(
            "fuzz: {TARGET} built with its planted library bug (issue 27 item 10) ran its corpus \
             without finding it ({}); the target no longer reaches a receive completion \
             handed to a send ring. Last lines:\n{}",
            out.status,
            lines[lines.len().saturating_sub(40)..].join("\n")
        ));
    }
    let why = text
        .lines()
        .find(|l| l.contains("took a completion that is not its own"))
        .unwrap_or_default();
    eprintln!(
        "fuzz: {TARGET} with issue 27's item 10 planted in the library: found on its corpus in \
         {:.0} s (build included): {why}",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One target's run: its executions and wall-clock seconds.
struct FuzzRun {
    target: String,
    execs: u64,
    secs: f64,
}

/// Splits the plan into at most [`FUZZ_LANES`] lanes of about equal expected time (longest
/// first, each to the lane with the least so far).
fn fuzz_lanes(plan: &[(String, Budget)]) -> Vec<Vec<(String, Budget)>> {
    let est = |(t, b): &(String, Budget)| b.est_seconds(fuzz_tuning(t).rate);
    let mut sorted = plan.to_vec();
    sorted.sort_by(|a, b| est(b).total_cmp(&est(a)).then(a.0.cmp(&b.0)));
    let mut lanes: Vec<Vec<(String, Budget)>> = vec![Vec::new(); FUZZ_LANES.min(plan.len())];
    for item in sorted {
        let lane = lanes
            .iter_mut()
            .min_by(|x, y| {
                let sx: f64 = x.iter().map(est).sum();
                let sy: f64 = y.iter().map(est).sum();
                sx.total_cmp(&sy)
            })
            .expect("at least one lane");
        lane.push(item);
    }
    lanes
}

/// Runs one built target for its budget (its libFuzzer output goes to
/// `target/fuzz-logs/<target>.log`; on a failure its tail is printed) and reads the
/// number of executions from its final stats.
fn fuzz_one(
    bin_dir: &Path,
    fuzz_dir: &Path,
    target: &str,
    budget: Budget,
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
        .arg(match budget {
            Budget::Seconds(s) => format!("-max_total_time={s}"),
            Budget::Runs(n) => format!("-runs={n}"),
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The fuzz targets in `fuzz/fuzz_targets/`.
    fn targets() -> Vec<String> {
        let dir = root().join("fuzz/fuzz_targets");
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                Some(name.strip_suffix(".rs")?.to_string())
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn ci_runs_reach_the_floor_by_construction() {
        let t = targets();
        assert!(t.len() >= 6, "{t:?}");
        let total: u64 = t.iter().map(|t| fuzz_tuning(t).ci_runs).sum();
        assert!(total >= FUZZ_CI_MIN_EXECS, "{total} < {FUZZ_CI_MIN_EXECS}");
    }

    #[test]
    fn lanes_are_balanced_by_expected_time() {
        let plan: Vec<(String, Budget)> = targets()
            .into_iter()
            .map(|t| {
                let n = fuzz_tuning(&t).ci_runs;
                (t, Budget::Runs(n))
            })
            .collect();
        let lanes = fuzz_lanes(&plan);
        assert_eq!(lanes.len(), FUZZ_LANES);
        assert_eq!(lanes.iter().map(Vec::len).sum::<usize>(), plan.len());
        let secs: Vec<f64> = lanes
            .iter()
            .map(|l| {
                l.iter()
                    .map(|(t, b)| b.est_seconds(fuzz_tuning(t).rate))
                    .sum()
            })
            .collect();
        let (lo, hi) = (secs[0].min(secs[1]), secs[0].max(secs[1]));
        assert!(hi - lo <= 0.5 * hi, "unbalanced lanes: {secs:?}");
        assert!(
            hi < 150.0,
            "a CI fuzz lane should take ~2 minutes: {secs:?}"
        );
    }
}
