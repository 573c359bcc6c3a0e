//! `cargo xtask rxe [--filter S] [--keep] [--timeout SECS] [--bless-faults]`: the
//! real-device suite on Soft-RoCE.
//!
//! The host kernel has no RDMA, so the harness boots Debian's own kernel (the package
//! `linux-image-amd64` depends on; downloaded and unpacked, never installed) under QEMU TCG
//! with a busybox initramfs, loads `rdma_rxe`, creates `rxe0` on a guest-only dummy netdev
//! and runs, all in one boot (a boot costs about 10 s):
//!
//! 1. sanity steps: `ibv_devices` must list rxe0; an `ibv_rc_pingpong` and an `ib_send_lat`
//!    server/client pair on loopback;
//! 2. the drift check: `rxe_faults.c`, the program that measured the failure truth table
//!    (`shared/rxe-vm/fault-truth.md`, scenarios S1..S22), compiled on the host from
//!    `../shared/rxe-vm/` and run in the guest; its output, with timings, QP numbers, keys
//!    and timing-driven counters normalised, must equal the committed
//!    `xtask/rxe/rxe_faults.truth`. Each difference is named by scenario and line and fails
//!    the step (see `faults`);
//! 3. every integration-test target named `real_device*` (convention: `tests/real_device.rs`)
//!    or `fault_scenarios` (the truth table's scenarios replayed through hotverbs), built on
//!    the host and run with `HOTVERBS_RXE=1` so that a missing device fails instead of
//!    skipping. Among them the differential (`real_device_differential`: seeded operation
//!    sequences on rxe0 and softnic's Rxe profile, traces compared; its `differential: `
//!    lines reach the summary) and the pingpong interop (`real_device_pingpongs`:
//!    `examples/pingpong.rs` against `ibv_rc_pingpong`, `ibv_ud_pingpong` and
//!    `ibv_srq_pingpong`, both ways);
//! 4. the host-built programs of [`HOST_PROGRAMS`] that have been built: each row of the
//!    perf tool and its perftest baseline both as a server and a client process over
//!    127.0.0.1, [`REPEATS`] times interleaved, reported as medians and their ratio, with the
//!    row's probes (see `host_programs`: the tick, the clock).
//!
//! The host writes the run as a shell script into a folder shared over 9p; the guest leaves
//! every step's output, exit status and times there; the host prints them and decides.
//!
//! Files under `target/rxe/`:
//! - `kernel/<package>/`: the unpacked kernel package (the .deb is deleted once unpacked)
//! - `initramfs/`, `initramfs.cpio.gz`, `initramfs.manifest`: the guest's root, rebuilt
//!   whenever the manifest (every file's source, size and mtime, or content hash) changes
//! - `runs/<id>/`: the share of one run (`run.sh`, `bin/`, `lib/`, `out/<step>/`,
//!   `console.log`); kept on failure or with `--keep`
//! - `console.log`: the last run's VM console
//! - `rxe_faults`: the drift check's probe, compiled from the recipe's `rxe_faults.c`
//!
//! Guest side: `xtask/rxe/init` (the VM's /init) and `xtask/rxe/lib.sh` (the step helpers
//! run.sh sources), both compiled in.
//!
//! Host side, one concern per file:
//! - `prerequisites`: the host programs and files the harness needs, checked up front
//! - `workspace`: the target directory, the device test targets and their binaries
//! - `kernel`: Debian's current kernel package, downloaded and unpacked
//! - `modules` (with `elf`): the kernel modules the guest loads, in dependency order
//! - `initramfs`: the guest's root and its cpio image, rebuilt when its manifest changes
//! - `guest`: the steps, the run script the guest executes, the folder shared with it
//! - `host_programs`: host-built programs run on rxe (EDIT HERE to add one)
//! - `faults`: the rxe_faults drift check: building the probe, normalising, comparing
//! - `vm`: booting QEMU and following its console
//! - `report`: the steps' records read back, judged and summarized
//! - `json`: just enough JSON for cargo's messages

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util;

mod elf;
mod faults;
mod guest;
mod host_programs;
mod initramfs;
mod json;
mod kernel;
mod modules;
mod prerequisites;
mod report;
mod vm;
mod workspace;

use guest::{default_timeout, sanity_steps, Share, Step};
use host_programs::{build_host_programs, Tool, HOST_PROGRAMS, PROBES, REPEATS};
use initramfs::{build_initramfs, initramfs_plan, Plan};
use kernel::kernel;
use prerequisites::check_prerequisites;
use report::{
    compare_rows, guest_problems, print_console_tail, print_kernel_warnings, probe_lines,
    read_record, report_steps, Report,
};
use vm::boot;
pub(crate) use workspace::workspace_test_executables;
use workspace::{build_device_tests, workspace};

/// What the guest's init sets up (tests get them through the environment).
const DEVICE: &str = "rxe0";
const GID_INDEX: &str = "1";
const GUEST_IP: &str = "10.77.0.1";
/// The TCP port perftest and the ibv_*_pingpong tools exchange connection data on.
const PAIR_PORT: u16 = 18515;
/// Seconds a pair's server gets to start listening; past that its client is not run.
const LISTEN_WAIT: u32 = 60;
/// Seconds a pair's server may run on after its client ended; past that it is killed.
const REAP_WAIT: u32 = 60;
/// Extra seconds a pair's server gets over its client: it starts first (listening within
/// [`LISTEN_WAIT`]) and ends last (within [`REAP_WAIT`]), so its own timeout never cuts
/// either short. Both are generous for QEMU TCG on a loaded host: they only lengthen
/// failure paths.
const SERVER_GRACE: u32 = LISTEN_WAIT + REAP_WAIT;
/// Seconds from QEMU start to the first step, generously (measured: about 10).
const BOOT_ALLOWANCE: u32 = 90;
/// Per-binary limit for device test binaries, in seconds.
const TEST_TIMEOUT: u32 = 300;

const USAGE: &str = "\
usage: cargo xtask rxe [--filter S] [--keep] [--timeout SECS] [--bless-faults] [--repeats N]

Boots Debian's kernel under QEMU, creates the Soft-RoCE device rxe0 and runs in it: the
sanity steps; the rxe_faults drift check; every `real_device*` and `fault_scenarios`
integration-test binary; the registered host programs.

The drift check compiles ../shared/rxe-vm/rxe_faults.c (the probe behind fault-truth.md;
folder overridable with HOTVERBS_RXE_VM_DIR), runs it in the guest, normalises its output
(timings, QP numbers, keys, timing-driven counters) and compares it with
xtask/rxe/rxe_faults.truth: every difference is named by scenario, sub-case and line of that
file (\"S15 [15a] line 1100: truth '...', now '...'\") and fails the run. A missing truth
file or a failed compile fails before the VM boots.

  --filter S      libtest filter passed to every device test binary
  --keep          keep the run's share folder (outputs, console log) even on success
  --timeout SECS  wall-clock limit for the VM (default: boot allowance + step timeouts)
  --bless-faults  do not compare: write this run's normalised rxe_faults output to
                  xtask/rxe/rxe_faults.truth (when the probe exited 0)
  --repeats N     runs of each perf row beside perftest (default 3, docs/perf.md's medians;
                  `cargo xtask ci` runs 1: the rows are measurements, not gates, and one
                  run each still proves every row works against perftest)";

/// Debian packages the harness needs on the host (`cargo xtask ci` installs them).
pub fn packages() -> &'static [&'static str] {
    &[
        "qemu-system-x86",
        "busybox-static",
        "cpio",
        "gzip",
        "xz-utils",
        "libc-bin",
        "iproute2",
        "libgcc-s1",
        "libibverbs1",
        "librdmacm1",
        "ibverbs-providers",
        "ibverbs-utils",
        "rdmacm-utils",
        "perftest",
        "gcc",
        "libibverbs-dev",
    ]
}

/// Entry point of `cargo xtask rxe`.
pub fn run(args: &[String]) -> Result<(), String> {
    let opts = parse_args(args)?;
    if opts.help {
        println!("{USAGE}");
        return Ok(());
    }
    let started = Instant::now();
    let host = check_prerequisites()?;
    let workspace = workspace()?;
    let rxe_dir = workspace.target_dir.join("rxe");
    fs::create_dir_all(&rxe_dir).map_err(|e| format!("{}: {e}", rxe_dir.display()))?;

    let kernel = kernel(&rxe_dir)?;
    let plan = initramfs_plan(&kernel, &host)?;
    let initrd = build_initramfs(&rxe_dir, &plan)?;
    // Without a truth there is nothing to check against: fail before the VM, not after.
    let truth = if opts.bless_faults {
        None
    } else {
        Some(faults::read_truth()?)
    };
    let faults_exe = faults::build_faults(&rxe_dir)?;
    let tests = build_device_tests(&workspace.device_test_targets)?;
    build_host_programs()?;
    println!(
        "rxe: {} device test binar{}",
        tests.len(),
        if tests.len() == 1 { "y" } else { "ies" }
    );

    prune_runs(&rxe_dir.join("runs"));
    let mut share = Share::create(&rxe_dir)?;
    let mut run = Run {
        steps: sanity_steps(),
        ..Run::default()
    };
    // Tests that drive the perf tool as a process find it through HOTVERBS_PERF_BIN: the
    // host path cargo bakes into them (CARGO_BIN_EXE_*) does not exist in the guest.
    let perf = workspace.target_dir.join("release/hotverbs-perf");
    let mut test_env = Vec::new();
    if perf.is_file() {
        test_env.push(("HOTVERBS_PERF_BIN".to_string(), share.ship(&perf, &plan)?));
    }
    // Early, right after the sanity steps: the fewer objects rxe has seen in this boot,
    // the less there is to normalise.
    let faults_step = run.steps.len();
    run.steps
        .push(faults::step(share.ship(&faults_exe, &plan)?, truth));
    for test in &tests {
        let guest = share.ship(&test.path, &plan)?;
        let mut step = test.step(guest, opts.filter.as_deref());
        step.env.extend(test_env.iter().cloned());
        run.steps.push(step);
    }
    let hz = kernel.hz();
    run.add_host_programs(
        &workspace.target_dir,
        &mut share,
        &plan,
        &hz,
        opts.repeats.unwrap_or(REPEATS),
    )?;
    for note in &run.skipped {
        println!("rxe: skipping {note}");
    }
    share.write_script(&run.steps)?;
    let prepared = started.elapsed();

    let timeout = opts
        .timeout
        .unwrap_or_else(|| Duration::from_secs(default_timeout(&run.steps).into()));
    println!(
        "rxe: booting {} with {} steps (prepared in {:.1} s, VM limit {} s)",
        kernel.package,
        run.steps.len(),
        prepared.as_secs_f64(),
        timeout.as_secs()
    );
    let vm_started = Instant::now();
    let vm = boot(&kernel, &initrd, &share.dir, &share.console_log(), timeout);
    let vm_time = vm_started.elapsed();

    let out = share.dir.join("out");
    let mut problems = guest_problems(&vm, timeout, &out);
    if !problems.is_empty() {
        print_console_tail(&share.console_log(), 40);
    }
    let report = report_steps(&run.steps, &out);
    problems.extend(report.problems.iter().cloned());
    if opts.bless_faults {
        match bless_faults(&out.join(run.steps[faults_step].dir(faults_step))) {
            Ok(note) => println!("rxe: {note}"),
            Err(e) => problems.push(e),
        }
    }
    print_kernel_warnings(&out.join("dmesg"));
    run.print_summary(&report, &out, tests.len(), &hz);
    println!(
        "rxe: total {:.1} s (prepare {:.1} s, VM {:.1} s)",
        started.elapsed().as_secs_f64(),
        prepared.as_secs_f64(),
        vm_time.as_secs_f64()
    );

    let last_console = rxe_dir.join("console.log");
    // Best effort: the authoritative log is the one in the share.
    let _ = fs::copy(share.console_log(), &last_console);
    if problems.is_empty() && !opts.keep {
        let _ = fs::remove_dir_all(&share.dir);
        println!("rxe: console log {}", rel(&last_console).display());
    } else {
        println!(
            "rxe: console log {}; share dir {} (kept)",
            rel(&share.console_log()).display(),
            rel(&share.dir).display()
        );
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} problem(s):\n  {}",
            problems.len(),
            problems.join("\n  ")
        ))
    }
}

/// The steps of one run, and what the summary needs to know about them.
#[derive(Default)]
struct Run {
    steps: Vec<Step>,
    /// Notes on host programs that are not built, one per binary.
    skipped: Vec<String>,
    /// Each perf row compared with perftest.
    comparisons: Vec<Comparison>,
    /// (name, row, steps) of each probe of the tick.
    probes: Vec<(&'static str, &'static str, Vec<usize>)>,
}

/// The steps of one perf row.
struct Comparison {
    name: &'static str,
    perftest: Vec<usize>,
    hotverbs: Vec<usize>,
}

impl Run {
    /// Adds the steps of every built program of [`HOST_PROGRAMS`]: each row `repeats`
    /// times ([`REPEATS`] unless `--repeats`), interleaved with its baseline, each repeat
    /// followed by the row's [`PROBES`].
    fn add_host_programs(
        &mut self,
        target_dir: &Path,
        share: &mut Share,
        plan: &Plan,
        hz: &str,
        repeats: usize,
    ) -> Result<(), String> {
        let mut not_built: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for program in HOST_PROGRAMS {
            let path = target_dir.join(program.binary);
            if !path.is_file() {
                not_built
                    .entry(program.binary)
                    .or_default()
                    .push(program.name);
                continue;
            }
            let guest = share.ship(&path, plan)?;
            let mut row = Comparison {
                name: program.name,
                perftest: Vec::new(),
                hotverbs: Vec::new(),
            };
            let probes: Vec<_> = PROBES.iter().filter(|p| p.row == program.name).collect();
            let first_probe = self.probes.len();
            self.probes
                .extend(probes.iter().map(|p| (p.name, program.name, Vec::new())));
            for rep in 1..=repeats {
                for (tool, step) in program.steps(&guest, rep, hz) {
                    match tool {
                        Tool::Perftest => row.perftest.push(self.steps.len()),
                        Tool::Hotverbs => row.hotverbs.push(self.steps.len()),
                    }
                    self.steps.push(step);
                }
                for (i, probe) in probes.iter().enumerate() {
                    self.probes[first_probe + i].2.push(self.steps.len());
                    self.steps.push(probe.step(&guest, rep, hz));
                }
            }
            if !row.perftest.is_empty() {
                self.comparisons.push(row);
            }
        }
        for (binary, names) in not_built {
            self.skipped.push(format!(
                "{} ({} is not built)",
                names.join(", "),
                rel(&target_dir.join(binary)).display()
            ));
        }
        Ok(())
    }

    fn print_summary(&self, report: &Report, out: &Path, binaries: usize, hz: &str) {
        println!("\n==== rxe: summary");
        for line in &report.lines {
            println!("  {line}");
        }
        for note in &self.skipped {
            println!("  skipped  {note}");
        }
        for line in &report.summaries {
            println!("  {line}");
        }
        let stdout = |i: usize| read_record(&out.join(self.steps[i].dir(i))).stdout;
        let stdouts = |list: &[usize]| list.iter().map(|&i| stdout(i)).collect::<Vec<_>>();
        let rows: Vec<(&str, Vec<String>, Vec<String>)> = self
            .comparisons
            .iter()
            .map(|c| (c.name, stdouts(&c.perftest), stdouts(&c.hotverbs)))
            .collect();
        let compared = compare_rows(&rows);
        if !compared.is_empty() {
            println!(
                "rxe: hotverbs-perf vs perftest, both as server + client processes, {} \
                 interleaved runs each in this boot; ratio of the medians, above 1 = hotverbs \
                 slower (latency hotverbs / perftest, bandwidth and rate perftest / hotverbs):",
                self.comparisons.first().map_or(0, |c| c.hotverbs.len())
            );
            for line in compared {
                println!("  {line}");
            }
        }
        // The probed row's two runs beside the --loopback probes, with their counters.
        let both = |list: &[usize]| {
            list.iter()
                .map(|&i| {
                    let r = read_record(&out.join(self.steps[i].dir(i)));
                    format!("{}{}", r.stdout, r.stderr)
                })
                .collect::<Vec<_>>()
        };
        let mut probes: Vec<(String, Vec<String>)> = Vec::new();
        for c in &self.comparisons {
            if !self.probes.iter().any(|p| p.1 == c.name) {
                continue;
            }
            probes.push((format!("{} (perftest)", c.name), both(&c.perftest)));
            probes.push((format!("{} (hotverbs)", c.name), both(&c.hotverbs)));
            for (name, _, steps) in self.probes.iter().filter(|p| p.1 == c.name) {
                probes.push((name.to_string(), both(steps)));
            }
        }
        if !probes.is_empty() {
            println!(
                "rxe: probes (hotverbs-perf --loopback, --clock auto) beside their \
                 rows, same boot; kernel CONFIG_HZ {hz}:"
            );
            let probes: Vec<(&str, Vec<String>)> = probes
                .iter()
                .map(|(n, r)| (n.as_str(), r.clone()))
                .collect();
            for line in probe_lines(&probes) {
                println!("  {line}");
            }
        }
        println!(
            "rxe: {} device tests passed, {} failed, {} ignored in {binaries} binaries",
            report.tests.passed, report.tests.failed, report.tests.ignored,
        );
    }
}

/// `--bless-faults`: the drift step's normalised output becomes the truth file.
fn bless_faults(record: &Path) -> Result<String, String> {
    let rec = read_record(record);
    if rec.rc != Some(0) {
        return Err(format!(
            "--bless-faults: {} did not exit 0 ({:?}); truth file left alone",
            faults::STEP,
            rec.rc
        ));
    }
    let truth = faults::truth_file(&rec.stdout);
    let path = faults::truth_path();
    fs::write(&path, &truth).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(format!(
        "wrote {} ({} lines) from this run's rxe_faults output",
        rel(&path).display(),
        truth.lines().count()
    ))
}

/// Keeps the newest kept runs (failed or `--keep`) and removes older ones.
fn prune_runs(runs: &Path) {
    const KEEP: usize = 10;
    let mut dirs: Vec<PathBuf> = fs::read_dir(runs)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    // Names start with the Unix time, so they sort by age.
    dirs.sort();
    let excess = dirs.len().saturating_sub(KEEP - 1);
    for old in dirs.into_iter().take(excess) {
        let _ = fs::remove_dir_all(old);
    }
}

// ---------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------

#[derive(Debug, Default, PartialEq)]
struct Options {
    filter: Option<String>,
    keep: bool,
    timeout: Option<Duration>,
    bless_faults: bool,
    help: bool,
    /// `--repeats N`: runs of each perf row (default [`REPEATS`]).
    repeats: Option<usize>,
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut opts = Options::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{name} needs a value\n{USAGE}"))
        };
        match flag {
            "--filter" => opts.filter = Some(value("--filter")?),
            "--timeout" => {
                let v = value("--timeout")?;
                let secs: u64 = v
                    .parse()
                    .map_err(|_| format!("--timeout wants whole seconds, not {v:?}"))?;
                opts.timeout = Some(Duration::from_secs(secs));
            }
            "--repeats" => {
                let v = value("--repeats")?;
                match v.parse::<usize>() {
                    Ok(n) if n > 0 => opts.repeats = Some(n),
                    _ => return Err(format!("--repeats wants a count of 1 or more, not {v:?}")),
                }
            }
            "--keep" => opts.keep = true,
            "--bless-faults" => opts.bless_faults = true,
            "-h" | "--help" => opts.help = true,
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(opts)
}

// ---------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------

/// Runs `cmd` in the workspace root and returns its stdout (stderr passes through).
fn capture(cmd: &mut Command) -> Result<String, String> {
    cmd.current_dir(util::root()).stderr(Stdio::inherit());
    let out = cmd
        .output()
        .map_err(|e| format!("{}: {e}", util::show(cmd)))?;
    if !out.status.success() {
        return Err(format!("`{}` failed ({})", util::show(cmd), out.status));
    }
    String::from_utf8(out.stdout).map_err(|_| format!("`{}`: output is not UTF-8", util::show(cmd)))
}

/// `path` relative to the workspace root when it is inside it (for shorter messages).
fn rel(path: &Path) -> &Path {
    let root = util::root();
    path.strip_prefix(&root).unwrap_or(path)
}
#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_arguments() {
        let o = parse_args(&args(&["--filter", "qp::rc", "--keep", "--timeout=90"])).unwrap();
        assert_eq!(o.filter.as_deref(), Some("qp::rc"));
        assert!(o.keep);
        assert!(!o.bless_faults);
        assert!(parse_args(&args(&["--bless-faults"])).unwrap().bless_faults);
        assert_eq!(
            parse_args(&args(&["--repeats", "1"])).unwrap().repeats,
            Some(1)
        );
        assert!(parse_args(&args(&["--repeats=0"])).is_err());
        assert_eq!(o.timeout, Some(Duration::from_secs(90)));
        assert_eq!(
            parse_args(&args(&["--filter=x"]))
                .unwrap()
                .filter
                .as_deref(),
            Some("x")
        );
        assert!(parse_args(&args(&["--filter"])).is_err());
        assert!(parse_args(&args(&["--timeout", "soon"])).is_err());
        assert!(parse_args(&args(&["--bogus"])).is_err());
        assert_eq!(parse_args(&[]).unwrap(), Options::default());
    }
}
