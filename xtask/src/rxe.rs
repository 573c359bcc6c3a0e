//! `cargo xtask rxe [--filter S] [--keep] [--timeout SECS]`: the real-device suite on
//! Soft-RoCE.
//!
//! The host kernel has no RDMA, so the harness boots Debian's own kernel (the package
//! `linux-image-amd64` depends on; downloaded and unpacked, never installed) under QEMU TCG
//! with a busybox initramfs, loads `rdma_rxe`, creates `rxe0` on a guest-only dummy netdev
//! and runs, all in one boot (a boot costs about 10 s):
//!
//! 1. sanity steps: `ibv_devices` must list rxe0; an `ibv_rc_pingpong` and an `ib_send_lat`
//!    server/client pair on loopback;
//! 2. every integration-test target named `real_device*` (convention: `tests/real_device.rs`),
//!    built on the host and run with `HOTVERBS_RXE=1` so that a missing device fails instead
//!    of skipping;
//! 3. the host-built programs of [`HOST_PROGRAMS`] (the perf tool next to perftest) that
//!    have been built.
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
//!
//! Guest side: `xtask/rxe/init` (the VM's /init) and `xtask/rxe/lib.sh` (the step helpers
//! run.sh sources), both compiled in.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, UNIX_EPOCH};

use crate::util;

/// The guest's /init and the step helpers of its run script.
const INIT: &str = include_str!("../rxe/init");
const LIB_SH: &str = include_str!("../rxe/lib.sh");

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
/// Per-binary limit for real-device test binaries, in seconds.
const TEST_TIMEOUT: u32 = 300;

const USAGE: &str = "\
usage: cargo xtask rxe [--filter S] [--keep] [--timeout SECS]

Boots Debian's kernel under QEMU, creates the Soft-RoCE device rxe0 and runs the sanity
steps, every `real_device*` integration-test binary and the registered host programs in it.

  --filter S      libtest filter passed to every real-device test binary
  --keep          keep the run's share folder (outputs, console log) even on success
  --timeout SECS  wall-clock limit for the VM (default: boot allowance + step timeouts)";

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
    ]
}

/// Host programs the harness itself runs, with their Debian package.
const HOST_TOOLS: &[(&str, &str)] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("cpio", "cpio"),
    ("gzip", "gzip"),
    ("ldd", "libc-bin"),
    ("apt-cache", "apt"),
    ("apt-get", "apt"),
    ("dpkg", "dpkg"),
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
const RXE_DRIVER: &str = "/etc/libibverbs.d/rxe.driver";
/// Where Debian keeps libraries (x86_64 multiarch first).
const LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib64",
];

/// Kernel modules the guest loads, with parameters. Their dependencies come from each
/// module's modinfo `depends=` and are loaded first; built-in ones are skipped.
const MODULES: &[(&str, &str)] = &[
    // rxe computes the RoCEv2 ICRC with the crypto API's "crc32", which nothing would
    // modprobe for it here.
    ("crc32_generic", ""),
    ("rdma_rxe", ""),
    // the rdma_cm stack: rping, perftest -R, the library's rdma_cm endpoints
    ("configfs", ""),
    ("ib_cm", ""),
    ("iw_cm", ""),
    ("rdma_cm", ""),
    ("rdma_ucm", ""),
    // dummy0, the guest-only netdev under rxe0
    ("dummy", "numdummies=1"),
    // the 9p host share
    ("virtio_pci", ""),
    ("9pnet_virtio", ""),
    ("9p", ""),
];

/// A host-built program run in the VM when it has been built (skipped with a note when not).
struct HostProgram {
    /// Step name.
    name: &'static str,
    /// Path below the target directory.
    binary: &'static str,
    /// Arguments; `{dev}`, `{gid}` and `{ip}` are replaced (see [`expand`]).
    args: &'static str,
    /// The perftest command measuring the same thing, run as a server/client pair on
    /// loopback right before the program: TCG timings drift between boots, so only numbers
    /// taken side by side in one boot compare.
    baseline: Option<&'static str>,
    /// Whether a failure fails the run.
    required: bool,
}

// ---------------------------------------------------------------------------------------
// EDIT HERE: programs other parts of the project run on rxe.
//
// These templates are the only place the harness knows the perf tool's command line. Each
// row runs perftest's equivalent right before it in the same boot (small and 64 KiB sizes,
// as issue #8 asks) and prints both figures and the ratio. Examples worth running on a real
// device get a row too (`binary: "release/examples/<name>"`).
// ---------------------------------------------------------------------------------------
const HOST_PROGRAMS: &[HostProgram] = &[
    HostProgram {
        name: "perf send_lat 2B",
        binary: "release/hotverbs-perf",
        args: "send_lat -d {dev} -x {gid} -s 2 -n 1000 --loopback",
        baseline: Some("ib_send_lat -d {dev} -x {gid} -F -s 2 -n 1000"),
        required: true,
    },
    HostProgram {
        name: "perf send_lat 64K",
        binary: "release/hotverbs-perf",
        args: "send_lat -d {dev} -x {gid} -s 65536 -n 1000 --loopback",
        baseline: Some("ib_send_lat -d {dev} -x {gid} -F -s 65536 -n 1000"),
        required: true,
    },
    HostProgram {
        name: "perf write_lat 2B",
        binary: "release/hotverbs-perf",
        args: "write_lat -d {dev} -x {gid} -s 2 -n 1000 --loopback",
        baseline: Some("ib_write_lat -d {dev} -x {gid} -F -s 2 -n 1000"),
        required: true,
    },
    HostProgram {
        name: "perf write_lat 64K",
        binary: "release/hotverbs-perf",
        args: "write_lat -d {dev} -x {gid} -s 65536 -n 1000 --loopback",
        baseline: Some("ib_write_lat -d {dev} -x {gid} -F -s 65536 -n 1000"),
        required: true,
    },
    HostProgram {
        name: "perf send_bw 64B",
        binary: "release/hotverbs-perf",
        args: "send_bw -d {dev} -x {gid} -s 64 -n 1000 --loopback",
        baseline: Some("ib_send_bw -d {dev} -x {gid} -F -s 64 -n 1000"),
        required: true,
    },
    HostProgram {
        name: "perf send_bw 64K",
        binary: "release/hotverbs-perf",
        args: "send_bw -d {dev} -x {gid} -s 65536 -n 1000 --loopback",
        baseline: Some("ib_send_bw -d {dev} -x {gid} -F -s 65536 -n 1000"),
        required: true,
    },
    HostProgram {
        name: "perf write_bw 64B",
        binary: "release/hotverbs-perf",
        args: "write_bw -d {dev} -x {gid} -s 64 -n 1000 --loopback",
        baseline: Some("ib_write_bw -d {dev} -x {gid} -F -s 64 -n 1000"),
        required: true,
    },
    HostProgram {
        name: "perf write_bw 64K",
        binary: "release/hotverbs-perf",
        args: "write_bw -d {dev} -x {gid} -s 65536 -n 1000 --loopback",
        baseline: Some("ib_write_bw -d {dev} -x {gid} -F -s 65536 -n 1000"),
        required: true,
    },
    HostProgram {
        name: "perf read_lat 2B",
        binary: "release/hotverbs-perf",
        args: "read_lat -d {dev} -x {gid} -s 2 -n 1000 --loopback",
        baseline: Some("ib_read_lat -d {dev} -x {gid} -F -s 2 -n 1000"),
        required: true,
    },
    HostProgram {
        name: "perf atomic_lat 8B",
        binary: "release/hotverbs-perf",
        args: "atomic_lat -d {dev} -x {gid} -s 8 -n 1000 --loopback",
        baseline: Some("ib_atomic_lat -d {dev} -x {gid} -F -s 8 -n 1000"),
        required: true,
    },
];

/// Builds the release binaries [`HOST_PROGRAMS`] name (the perf tool), so a fresh clone runs
/// the perftest comparison without a separate build step.
fn build_host_programs() -> Result<(), String> {
    let mut packages: Vec<&str> = Vec::new();
    for p in HOST_PROGRAMS {
        if p.binary == "release/hotverbs-perf" && !packages.contains(&"hotverbs-perf") {
            packages.push("hotverbs-perf");
        }
    }
    for pkg in packages {
        crate::util::run(crate::util::cargo().args(["build", "--release", "--locked", "-p", pkg]))?;
    }
    Ok(())
}

/// The sanity steps every run starts with: the device exists and carries traffic.
fn sanity_steps() -> Vec<Step> {
    vec![
        Step {
            timeout: 30,
            expect: Some(DEVICE),
            ..Step::program("ibv_devices", vec!["ibv_devices".into()])
        },
        Step::pair("rc_pingpong", "ibv_rc_pingpong -d {dev} -g {gid} -n 1000"),
        Step::pair("send_lat", "ib_send_lat -d {dev} -x {gid} -F -n 1000"),
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
    let tests = build_real_device_tests(&workspace.real_device_targets)?;
    build_host_programs()?;
    println!(
        "rxe: {} real-device test binar{}",
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
    for test in &tests {
        let guest = share.ship(&test.path, &plan)?;
        let mut step = test.step(guest, opts.filter.as_deref());
        step.env.extend(test_env.iter().cloned());
        run.steps.push(step);
    }
    run.add_host_programs(&workspace.target_dir, &mut share, &plan)?;
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
    print_kernel_warnings(&out.join("dmesg"));
    run.print_summary(&report, &out, tests.len());
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
    /// (name, baseline step, program step) of each perf comparison.
    comparisons: Vec<(&'static str, usize, usize)>,
}

impl Run {
    /// Adds the steps of every built program of [`HOST_PROGRAMS`].
    fn add_host_programs(
        &mut self,
        target_dir: &Path,
        share: &mut Share,
        plan: &Plan,
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
            if program.baseline.is_some() {
                let at = self.steps.len();
                self.comparisons.push((program.name, at, at + 1));
            }
            self.steps.extend(program.steps(&guest));
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

    fn print_summary(&self, report: &Report, out: &Path, binaries: usize) {
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
        let compared: Vec<String> = self
            .comparisons
            .iter()
            .flat_map(|&(name, baseline, program)| {
                let stdout = |i: usize| read_record(&out.join(self.steps[i].dir(i))).stdout;
                compare_perf(name, &stdout(baseline), &stdout(program))
            })
            .collect();
        if !compared.is_empty() {
            println!("rxe: hotverbs-perf vs perftest, same boot (ratio = hotverbs / perftest):");
            for line in compared {
                println!("  {line}");
            }
        }
        println!(
            "rxe: {} real-device tests passed, {} failed, {} ignored in {binaries} binaries",
            report.tests.passed, report.tests.failed, report.tests.ignored,
        );
    }
}

/// What went wrong with the VM itself: QEMU, the timeout, rxe0 setup, the run script.
fn guest_problems(vm: &Result<VmEnd, String>, timeout: Duration, out: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    match vm {
        Ok(VmEnd::Exited(status)) if !status.success() => {
            problems.push(format!("qemu exited with {status}"))
        }
        Ok(VmEnd::Exited(_)) => {}
        Ok(VmEnd::TimedOut) => problems.push(format!(
            "the VM timed out after {} s and was killed",
            timeout.as_secs()
        )),
        Err(e) => problems.push(e.clone()),
    }
    match fs::read_to_string(out.join("setup")) {
        Ok(s) if s.trim() == "ok" => {}
        Ok(s) => problems.push(format!("rxe0 setup {}", s.trim().trim_end_matches(';'))),
        Err(_) => problems.push("the guest never reported its setup (see the console log)".into()),
    }
    if !out.join("done").exists() {
        problems.push("the guest's run script did not finish".into());
    }
    problems
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
    help: bool,
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
            "--keep" => opts.keep = true,
            "-h" | "--help" => opts.help = true,
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(opts)
}

// ---------------------------------------------------------------------------------------
// Prerequisites
// ---------------------------------------------------------------------------------------

/// The host files that go into the guest.
struct HostFiles {
    busybox: PathBuf,
    programs: Vec<(&'static str, PathBuf)>,
    libs: Vec<PathBuf>,
    provider: PathBuf,
}

fn check_prerequisites() -> Result<HostFiles, String> {
    let mut missing: Vec<(String, &str)> = Vec::new();
    for &(tool, package) in HOST_TOOLS {
        if find_program(tool).is_none() {
            missing.push((format!("program {tool}"), package));
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

// ---------------------------------------------------------------------------------------
// The workspace: target directory, real-device test targets, their binaries
// ---------------------------------------------------------------------------------------

struct Workspace {
    target_dir: PathBuf,
    /// (package, target) of every integration test named `real_device*`.
    real_device_targets: Vec<(String, String)>,
}

fn workspace() -> Result<Workspace, String> {
    let mut cmd = util::cargo();
    cmd.args(["metadata", "--no-deps", "--format-version", "1"]);
    let text = capture(&mut cmd)?;
    let meta = json::parse(&text).map_err(|e| format!("cargo metadata: {e}"))?;
    let target_dir = meta
        .get("target_directory")
        .and_then(json::Value::as_str)
        .ok_or("cargo metadata: no target_directory")?
        .into();
    Ok(Workspace {
        target_dir,
        real_device_targets: real_device_targets(&meta),
    })
}

/// The (package, target) pairs of integration tests named `real_device*`.
fn real_device_targets(meta: &json::Value) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for package in meta.get("packages").map_or(&[][..], json::Value::items) {
        let Some(pname) = package.get("name").and_then(json::Value::as_str) else {
            continue;
        };
        for target in package.get("targets").map_or(&[][..], json::Value::items) {
            if let Some(tname) = real_device_target(target) {
                found.push((pname.to_string(), tname.to_string()));
            }
        }
    }
    found.sort();
    found
}

/// The name of `target` (cargo's JSON for a build target) if it is a real-device test.
fn real_device_target(target: &json::Value) -> Option<&str> {
    let is_test = target
        .get("kind")
        .map_or(&[][..], json::Value::items)
        .iter()
        .any(|k| k.as_str() == Some("test"));
    let name = target.get("name")?.as_str()?;
    (is_test && name.starts_with("real_device")).then_some(name)
}

/// A built real-device test binary.
#[derive(Debug, PartialEq)]
struct TestBinary {
    package: String,
    target: String,
    path: PathBuf,
}

impl TestBinary {
    fn step(&self, guest: String, filter: Option<&str>) -> Step {
        let mut cmd = vec![guest, "--test-threads=1".to_string()];
        cmd.extend(filter.map(str::to_string));
        Step {
            env: vec![
                ("HOTVERBS_RXE".into(), "1".into()),
                ("HOTVERBS_DEVICE".into(), DEVICE.into()),
                ("HOTVERBS_GID_INDEX".into(), GID_INDEX.into()),
                ("RUST_BACKTRACE".into(), "1".into()),
                ("LD_LIBRARY_PATH".into(), "/host/lib".into()),
            ],
            timeout: TEST_TIMEOUT,
            tests: true,
            ..Step::program(&format!("test {}/{}", self.package, self.target), cmd)
        }
    }
}

/// Builds the real-device test targets (only those: an unrelated crate's tests need not
/// build for this suite) and returns their executables.
fn build_real_device_tests(targets: &[(String, String)]) -> Result<Vec<TestBinary>, String> {
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let mut cmd = util::cargo();
    cmd.args([
        "test",
        "--workspace",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    let names: BTreeSet<&str> = targets.iter().map(|(_, t)| t.as_str()).collect();
    for name in names {
        cmd.args(["--test", name]);
    }
    let text = capture(&mut cmd)?;
    let mut found = Vec::new();
    for line in text.lines().filter(|l| l.starts_with('{')) {
        let msg = json::parse(line).map_err(|e| format!("cargo's JSON: {e}: {line}"))?;
        found.extend(real_device_executable(&msg));
    }
    found.sort_by(|a, b| (&a.package, &a.target).cmp(&(&b.package, &b.target)));
    found.dedup_by(|a, b| a.path == b.path);
    Ok(found)
}

/// The test binary a `compiler-artifact` message of `cargo --message-format=json` names,
/// if it is a real-device test.
fn real_device_executable(msg: &json::Value) -> Option<TestBinary> {
    if msg.get("reason")?.as_str()? != "compiler-artifact" {
        return None;
    }
    let target = real_device_target(msg.get("target")?)?;
    Some(TestBinary {
        package: package_name(msg.get("package_id")?.as_str()?),
        target: target.to_string(),
        path: msg.get("executable")?.as_str()?.into(),
    })
}

/// The package name in a cargo package id, old (`name 0.1.0 (path+file://...)`) or new
/// (`path+file:///dir#name@0.1.0`, or `path+file:///dir/name#0.1.0` when the name is the
/// folder's).
fn package_name(id: &str) -> String {
    match id.split_once('#') {
        Some((url, fragment)) => match fragment.split_once('@') {
            Some((name, _)) => name.to_string(),
            None => url.rsplit('/').next().unwrap_or(url).to_string(),
        },
        None => id.split_whitespace().next().unwrap_or(id).to_string(),
    }
}

// ---------------------------------------------------------------------------------------
// The kernel: Debian's current one, downloaded and unpacked (never installed)
// ---------------------------------------------------------------------------------------

struct Kernel {
    package: String,
    vmlinuz: PathBuf,
    /// `lib/modules/<version>` of the unpacked package.
    modules: PathBuf,
}

fn kernel(rxe_dir: &Path) -> Result<Kernel, String> {
    let kernels = rxe_dir.join("kernel");
    let package = match current_kernel_package().or_else(|e| {
        // A fresh machine whose packages were all present may never have fetched apt's
        // lists (the ci packages step only updates when it installs something).
        if cached_kernels(&kernels).is_empty() && is_root() {
            println!("rxe: {e}\nrxe: running apt-get update");
            let _ = Command::new("apt-get")
                .args(["update", "-q"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status();
            current_kernel_package()
        } else {
            Err(e)
        }
    }) {
        Ok(p) => p,
        Err(e) => {
            // Offline or without apt lists: a cached kernel still does the job.
            let cached = cached_kernels(&kernels);
            match cached.as_slice() {
                [one] => {
                    println!("rxe: {e}\nrxe: using the cached {one}");
                    one.clone()
                }
                _ => return Err(e),
            }
        }
    };
    let dir = kernels.join(&package);
    let stamp = dir.join(".unpacked");
    if stamp.exists() {
        println!("rxe: kernel {package} (cached)");
    } else {
        download_kernel(rxe_dir, &kernels, &package)?;
    }
    let boot = dir.join("boot");
    let vmlinuz = fs::read_dir(&boot)
        .map_err(|e| format!("{}: {e}", boot.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .starts_with("vmlinuz-")
        })
        .ok_or_else(|| format!("no vmlinuz-* in {}", boot.display()))?;
    let version =
        vmlinuz.file_name().unwrap_or_default().to_string_lossy()["vmlinuz-".len()..].to_string();
    let modules = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|m| dir.join(m).join(&version))
        .find(|p| p.is_dir())
        .ok_or_else(|| format!("no lib/modules/{version} in {}", dir.display()))?;
    Ok(Kernel {
        package,
        vmlinuz,
        modules,
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The kernel image package `linux-image-amd64` currently depends on.
fn current_kernel_package() -> Result<String, String> {
    let mut cmd = Command::new("apt-cache");
    cmd.args(["depends", "linux-image-amd64"]);
    let hint = "run `apt-get update` (as root) so apt knows Debian's current kernel";
    let text = capture(&mut cmd).map_err(|e| format!("{e}\n{hint}"))?;
    parse_apt_depends(&text).ok_or_else(|| {
        format!("`apt-cache depends linux-image-amd64` names no linux-image-*; {hint}")
    })
}

/// The first `linux-image-*` dependency in `apt-cache depends` output.
fn parse_apt_depends(text: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.trim().trim_start_matches('|').strip_prefix("Depends:"))
        .map(|d| d.trim().trim_start_matches('<').trim_end_matches('>'))
        .find(|d| {
            d.starts_with("linux-image-")
                && d.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-+.".contains(&b))
        })
        .map(str::to_string)
}

fn cached_kernels(kernels: &Path) -> Vec<String> {
    let mut found: Vec<String> = fs::read_dir(kernels)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join(".unpacked").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    found
}

fn download_kernel(rxe_dir: &Path, kernels: &Path, package: &str) -> Result<(), String> {
    let debs = rxe_dir.join("deb");
    fs::create_dir_all(&debs).map_err(|e| format!("{}: {e}", debs.display()))?;
    let find_deb = || {
        fs::read_dir(&debs).ok().and_then(|rd| {
            rd.flatten().map(|e| e.path()).find(|p| {
                let n = p.file_name().unwrap_or_default().to_string_lossy();
                n.starts_with(&format!("{package}_")) && n.ends_with(".deb")
            })
        })
    };
    let deb = match find_deb() {
        Some(deb) => deb,
        None => {
            println!("rxe: downloading {package} (about 70 MB, once)");
            let mut cmd = Command::new("apt-get");
            // As root apt would sandbox the download as _apt, who cannot write here.
            cmd.args(["-o", "APT::Sandbox::User=root", "download", package])
                .current_dir(&debs);
            eprintln!("$ (cd {} && {})", debs.display(), util::show(&cmd));
            let status = cmd.status().map_err(|e| format!("apt-get: {e}"))?;
            if !status.success() {
                return Err(format!(
                    "`apt-get download {package}` failed ({status}); `apt-get update` may help"
                ));
            }
            find_deb()
                .ok_or_else(|| format!("apt-get left no {package}_*.deb in {}", debs.display()))?
        }
    };
    println!("rxe: unpacking {} (once)", rel(&deb).display());
    let partial = kernels.join(format!("{package}.partial"));
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    util::run(Command::new("dpkg").arg("-x").arg(&deb).arg(&partial))?;
    let dir = kernels.join(package);
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&partial, &dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    fs::write(
        dir.join(".unpacked"),
        deb.file_name().unwrap_or_default().as_encoded_bytes(),
    )
    .map_err(|e| format!("{}: {e}", dir.display()))?;
    // The unpacked tree is the cache; the .deb and older kernels (400 MB each) go.
    let _ = fs::remove_file(&deb);
    let _ = fs::remove_dir(&debs);
    for old in cached_kernels(kernels).into_iter().filter(|k| k != package) {
        println!("rxe: removing the cached {old}");
        let _ = fs::remove_dir_all(kernels.join(old));
    }
    Ok(())
}

/// One module for the guest: its name, where it came from, its (decompressed) contents.
struct Module {
    name: String,
    params: String,
    source: PathBuf,
    data: Vec<u8>,
}

/// The modules of [`MODULES`] and everything they depend on, in load order.
fn kernel_modules(modules_dir: &Path) -> Result<Vec<Module>, String> {
    let mut index = BTreeMap::new();
    index_modules(&modules_dir.join("kernel"), &mut index)?;
    let builtin: BTreeSet<String> = fs::read_to_string(modules_dir.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.rsplit('/').next().and_then(module_name))
        .collect();
    let mut loaded: BTreeMap<String, (PathBuf, Vec<u8>)> = BTreeMap::new();
    let roots: Vec<&str> = MODULES.iter().map(|(m, _)| *m).collect();
    let order = load_order(&roots, |name| {
        if builtin.contains(name) {
            return Ok(None);
        }
        let path = index.get(name).ok_or_else(|| {
            format!(
                "kernel module {name} is neither in {} nor built in",
                modules_dir.display()
            )
        })?;
        let data = read_module(path)?;
        let section = elf_section(&data, ".modinfo")
            .ok_or_else(|| format!("{}: no .modinfo section", path.display()))?;
        let deps = modinfo_depends(section);
        loaded.insert(name.to_string(), (path.clone(), data));
        Ok(Some(deps))
    })?;
    Ok(order
        .into_iter()
        .map(|name| {
            let (source, data) = loaded
                .remove(&name)
                .expect("load_order only returns loaded modules");
            let params = MODULES
                .iter()
                .find(|(m, _)| *m == name)
                .map_or("", |(_, p)| *p)
                .to_string();
            Module {
                name,
                params,
                source,
                data,
            }
        })
        .collect())
}

/// Maps module names to files for every module below `dir`.
fn index_modules(dir: &Path, index: &mut BTreeMap<String, PathBuf>) -> Result<(), String> {
    for entry in fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = entry.path();
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            index_modules(&path, index)?;
        } else if let Some(name) = module_name(&entry.file_name().to_string_lossy()) {
            index.insert(name, path);
        }
    }
    Ok(())
}

/// The module name of a module file (`9pnet_virtio.ko.xz` -> `9pnet_virtio`); the kernel
/// treats `-` and `_` alike and so does this.
fn module_name(file: &str) -> Option<String> {
    let stem = [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
        .iter()
        .find_map(|ext| file.strip_suffix(ext))?;
    (!stem.is_empty()).then(|| stem.replace('-', "_"))
}

/// A module's contents, decompressed (Debian 6.1 ships plain .ko; newer kernels .ko.xz).
fn read_module(path: &Path) -> Result<Vec<u8>, String> {
    let name = path.to_string_lossy();
    let tool = [
        (".xz", "xz", "xz-utils"),
        (".zst", "zstd", "zstd"),
        (".gz", "gzip", "gzip"),
    ]
    .into_iter()
    .find(|(ext, _, _)| name.ends_with(ext));
    match tool {
        None => fs::read(path).map_err(|e| format!("{}: {e}", path.display())),
        Some((_, program, package)) => {
            let out = Command::new(program)
                .arg("-dc")
                .arg(path)
                .output()
                .map_err(|e| {
                    format!("{program} (Debian package {package}) to unpack {name}: {e}")
                })?;
            if !out.status.success() {
                return Err(format!("{program} -dc {name} failed ({})", out.status));
            }
            Ok(out.stdout)
        }
    }
}

/// The `depends=` list of a `.modinfo` section (NUL-separated `key=value` strings).
fn modinfo_depends(modinfo: &[u8]) -> Vec<String> {
    modinfo
        .split(|&b| b == 0)
        .filter_map(|kv| kv.strip_prefix(b"depends="))
        .flat_map(|v| v.split(|&b| b == b','))
        .filter(|d| !d.is_empty())
        .map(|d| String::from_utf8_lossy(d).replace('-', "_"))
        .collect()
}

/// `roots` and their dependencies, every module after the ones it depends on, each once.
/// `deps(name)` is `None` for a module that needs no loading (built in).
fn load_order<F>(roots: &[&str], mut deps: F) -> Result<Vec<String>, String>
where
    F: FnMut(&str) -> Result<Option<Vec<String>>, String>,
{
    fn visit<F>(
        name: &str,
        deps: &mut F,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
        order: &mut Vec<String>,
    ) -> Result<(), String>
    where
        F: FnMut(&str) -> Result<Option<Vec<String>>, String>,
    {
        if done.contains(name) {
            return Ok(());
        }
        if path.iter().any(|p| p == name) {
            path.push(name.to_string());
            return Err(format!("module dependency cycle: {}", path.join(" -> ")));
        }
        let Some(list) = deps(name)? else {
            done.insert(name.to_string());
            return Ok(());
        };
        path.push(name.to_string());
        for dep in &list {
            visit(dep, deps, done, path, order)?;
        }
        path.pop();
        done.insert(name.to_string());
        order.push(name.to_string());
        Ok(())
    }
    let (mut done, mut path, mut order) = (BTreeSet::new(), Vec::new(), Vec::new());
    for root in roots {
        visit(root, &mut deps, &mut done, &mut path, &mut order)?;
    }
    Ok(order)
}

// ---------------------------------------------------------------------------------------
// ELF (little-endian ELF64 only: x86_64 modules and binaries)
// ---------------------------------------------------------------------------------------

/// `len` bytes at `at`, little-endian.
fn le(data: &[u8], at: usize, len: usize) -> Option<usize> {
    let bytes = data.get(at..at.checked_add(len)?)?;
    let v = bytes
        .iter()
        .rev()
        .fold(0u64, |v, &b| (v << 8) | u64::from(b));
    usize::try_from(v).ok()
}

fn is_elf64_le(data: &[u8]) -> bool {
    data.starts_with(b"\x7fELF") && data.get(4) == Some(&2) && data.get(5) == Some(&1)
}

/// The contents of the section called `wanted`.
fn elf_section<'a>(data: &'a [u8], wanted: &str) -> Option<&'a [u8]> {
    if !is_elf64_le(data) {
        return None;
    }
    let (shoff, shentsize, shnum, shstrndx) = (
        le(data, 0x28, 8)?,
        le(data, 0x3a, 2)?,
        le(data, 0x3c, 2)?,
        le(data, 0x3e, 2)?,
    );
    let header = |i: usize| -> Option<(usize, &'a [u8])> {
        let h = shoff.checked_add(i.checked_mul(shentsize)?)?;
        let (name, offset, size) = (
            le(data, h, 4)?,
            le(data, h + 0x18, 8)?,
            le(data, h + 0x20, 8)?,
        );
        Some((name, data.get(offset..offset.checked_add(size)?)?))
    };
    let (_, names) = header(shstrndx)?;
    (0..shnum).find_map(|i| {
        let (name, contents) = header(i)?;
        let name = names.get(name..)?;
        let name = &name[..name.iter().position(|&b| b == 0)?];
        (name == wanted.as_bytes()).then_some(contents)
    })
}

/// Whether an ELF executable is statically linked (has no `PT_INTERP` program header).
fn elf_is_static(data: &[u8]) -> Option<bool> {
    const PT_INTERP: usize = 3;
    if !is_elf64_le(data) {
        return None;
    }
    let (phoff, phentsize, phnum) = (le(data, 0x20, 8)?, le(data, 0x36, 2)?, le(data, 0x38, 2)?);
    for i in 0..phnum {
        if le(data, phoff.checked_add(i.checked_mul(phentsize)?)?, 4)? == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

// ---------------------------------------------------------------------------------------
// The initramfs
// ---------------------------------------------------------------------------------------

enum Content {
    Dir,
    Link(String),
    File(PathBuf),
    Bytes(Vec<u8>),
}

struct Entry {
    content: Content,
    mode: u32,
    /// What identifies the content in the manifest (source, size, mtime; or a hash).
    key: String,
}

/// Everything that goes into the initramfs, by path inside it.
#[derive(Default)]
struct Plan {
    entries: BTreeMap<String, Entry>,
}

impl Plan {
    fn add(&mut self, path: &str, content: Content, mode: u32, key: String) {
        self.entries
            .insert(path.to_string(), Entry { content, mode, key });
    }

    fn dir(&mut self, path: &str) {
        self.add(path, Content::Dir, 0o755, "dir".into());
    }

    fn link(&mut self, path: &str, target: &str) {
        self.add(
            path,
            Content::Link(target.into()),
            0o777,
            format!("-> {target}"),
        );
    }

    fn file(&mut self, path: &str, source: &Path, mode: u32) -> Result<(), String> {
        let key = file_key(source)?;
        self.add(path, Content::File(source.into()), mode, key);
        Ok(())
    }

    fn text(&mut self, path: &str, text: &str, mode: u32) {
        let key = format!("fnv1a64 {:016x}", fnv1a64(text.as_bytes()));
        self.add(path, Content::Bytes(text.as_bytes().to_vec()), mode, key);
    }

    fn has(&self, path: &str) -> bool {
        self.entries.contains_key(path)
    }

    /// Adds a host library at its canonical path (merged /usr: `/lib/x/libc.so.6` lands in
    /// `usr/lib/x/libc.so.6`, and the guest's `/lib` links there), keeping its soname.
    fn library(&mut self, host: &Path) -> Result<(), String> {
        let path = guest_path(host)?;
        if !self.has(&path) {
            self.file(&path, host, 0o755)?;
        }
        Ok(())
    }

    /// Adds the libraries `ldd` lists for `binary`.
    fn libraries_of(&mut self, binary: &Path) -> Result<(), String> {
        for lib in ldd(binary)? {
            self.library(&lib)?;
        }
        Ok(())
    }

    /// The manifest: one line per entry; equal manifests mean equal initramfs contents.
    fn manifest(&self) -> String {
        let mut m = String::from("# cargo xtask rxe initramfs manifest v1\n");
        for (path, e) in &self.entries {
            let _ = writeln!(m, "{:o} {path} {}", e.mode, e.key);
        }
        m
    }

    /// Writes the tree under `root` (which must not exist).
    fn materialize(&self, root: &Path) -> Result<(), String> {
        let err = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
        for (path, e) in &self.entries {
            let dst = root.join(path);
            if let Some(parent) = dst.parent() {
                fs::create_dir_all(parent).map_err(|x| err(parent, x))?;
            }
            match &e.content {
                Content::Dir => fs::create_dir_all(&dst).map_err(|x| err(&dst, x))?,
                Content::Link(target) => symlink(target, &dst).map_err(|x| err(&dst, x))?,
                Content::File(src) => {
                    fs::copy(src, &dst).map_err(|x| err(src, x))?;
                }
                Content::Bytes(data) => fs::write(&dst, data).map_err(|x| err(&dst, x))?,
            }
            if !matches!(e.content, Content::Link(_)) {
                fs::set_permissions(&dst, fs::Permissions::from_mode(e.mode))
                    .map_err(|x| err(&dst, x))?;
            }
        }
        Ok(())
    }
}

fn file_key(path: &Path) -> Result<String, String> {
    let m = fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mtime = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    Ok(format!("{} {} {mtime}", path.display(), m.len()))
}

/// FNV-1a, 64 bit: a stable content hash for the manifest (std's hasher may change).
fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Where a host library goes in the guest: its canonical folder, its own (soname) name.
fn guest_path(host: &Path) -> Result<String, String> {
    let (Some(dir), Some(name)) = (host.parent(), host.file_name()) else {
        return Err(format!("not a library path: {}", host.display()));
    };
    let dir = fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir
        .join(name)
        .to_string_lossy()
        .trim_start_matches('/')
        .to_string())
}

/// The libraries `ldd` lists for `binary` (none for a static one).
fn ldd(binary: &Path) -> Result<Vec<PathBuf>, String> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| format!("ldd: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if text.contains("not a dynamic executable") || err.contains("not a dynamic executable") {
            return Ok(Vec::new());
        }
        return Err(format!("ldd {} failed: {}", binary.display(), err.trim()));
    }
    parse_ldd(&text).map_err(|e| format!("ldd {}: {e}", binary.display()))
}

/// Library paths in `ldd` output; an unresolved library is an error.
fn parse_ldd(text: &str) -> Result<Vec<PathBuf>, String> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let path = match line.split_once("=>") {
            Some((name, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    return Err(format!("{} not found", name.trim()));
                }
                rest.split_whitespace().next().unwrap_or("")
            }
            None => line.split_whitespace().next().unwrap_or(""),
        };
        // linux-vdso.so.1 and friends have no file.
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

fn busybox_applets(busybox: &Path) -> Result<Vec<String>, String> {
    let text = capture(Command::new(busybox).arg("--list"))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && !a.contains('/'))
        .map(str::to_string)
        .collect())
}

fn initramfs_plan(kernel: &Kernel, host: &HostFiles) -> Result<Plan, String> {
    let mut plan = Plan::default();
    for dir in [
        "dev", "proc", "sys", "tmp", "run", "root", "host", "usr/sbin",
    ] {
        plan.dir(dir);
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        plan.link(link, target);
    }
    plan.file("usr/bin/busybox", &host.busybox, 0o755)?;
    for applet in busybox_applets(&host.busybox)? {
        // (the list names busybox itself)
        let path = format!("usr/bin/{applet}");
        if !plan.has(&path) {
            plan.link(&path, "busybox");
        }
    }
    // Real programs replace busybox applets of the same name.
    for (name, path) in &host.programs {
        plan.file(&format!("usr/bin/{name}"), path, 0o755)?;
        plan.libraries_of(path)?;
    }
    for lib in host.libs.iter().chain([&host.provider]) {
        plan.library(lib)?;
        plan.libraries_of(lib)?;
    }
    plan.file("etc/libibverbs.d/rxe.driver", Path::new(RXE_DRIVER), 0o644)?;
    plan.text("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644);
    plan.text("etc/group", "root:x:0:\n", 0o644);
    plan.text(
        "etc/hosts",
        &format!("127.0.0.1 localhost\n{GUEST_IP} vm\n"),
        0o644,
    );
    plan.text("etc/nsswitch.conf", "hosts: files\n", 0o644);

    let mut order = String::new();
    for m in kernel_modules(&kernel.modules)? {
        let _ = writeln!(order, "{} {}", m.name, m.params);
        let key = file_key(&m.source)?;
        plan.add(
            &format!("usr/lib/rxe/modules/{}.ko", m.name),
            Content::Bytes(m.data),
            0o644,
            key,
        );
    }
    plan.text("usr/lib/rxe/modules.order", &order, 0o644);
    plan.text("usr/lib/rxe/lib.sh", LIB_SH, 0o644);
    plan.text("init", INIT, 0o755);
    Ok(plan)
}

/// `target/rxe/initramfs.cpio.gz`, rebuilt when the plan's manifest changed.
fn build_initramfs(rxe_dir: &Path, plan: &Plan) -> Result<PathBuf, String> {
    let image = rxe_dir.join("initramfs.cpio.gz");
    let manifest_path = rxe_dir.join("initramfs.manifest");
    let manifest = plan.manifest();
    if image.exists() && fs::read_to_string(&manifest_path).ok().as_deref() == Some(&*manifest) {
        println!("rxe: initramfs up to date ({} entries)", plan.entries.len());
        return Ok(image);
    }
    let started = Instant::now();
    let root = rxe_dir.join("initramfs");
    let _ = fs::remove_file(&manifest_path);
    if root.exists() {
        fs::remove_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    }
    plan.materialize(&root)?;
    let tmp = rxe_dir.join("initramfs.cpio.gz.tmp");
    pack(&root, &tmp)?;
    fs::rename(&tmp, &image).map_err(|e| format!("{}: {e}", image.display()))?;
    fs::write(&manifest_path, manifest).map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    let size = fs::metadata(&image).map(|m| m.len()).unwrap_or(0);
    println!(
        "rxe: built {} ({} entries, {:.1} MB) in {:.1} s",
        rel(&image).display(),
        plan.entries.len(),
        size as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    Ok(image)
}

/// `cpio -o -H newc | gzip` of everything below `root`, owned by root.
fn pack(root: &Path, out: &Path) -> Result<(), String> {
    let mut names = Vec::new();
    walk(root, Path::new(""), &mut names)?;
    let file = fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut gzip = Command::new("gzip")
        .args(["-1", "-n"])
        .stdin(Stdio::piped())
        .stdout(file)
        .spawn()
        .map_err(|e| format!("gzip: {e}"))?;
    let gzip_in = gzip.stdin.take().expect("piped");
    let mut cpio = Command::new("cpio")
        .args(["-o", "-H", "newc", "--quiet", "-R", "0:0"])
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(gzip_in)
        .spawn()
        .map_err(|e| format!("cpio: {e}"))?;
    let mut list = String::new();
    for name in &names {
        list.push_str(&name.to_string_lossy());
        list.push('\n');
    }
    // cpio streams into gzip while it reads the list, so writing it all first cannot block
    // for good.
    let written = cpio.stdin.take().expect("piped").write_all(list.as_bytes());
    let cpio_status = cpio.wait().map_err(|e| format!("cpio: {e}"))?;
    let gzip_status = gzip.wait().map_err(|e| format!("gzip: {e}"))?;
    written.map_err(|e| format!("feeding cpio: {e}"))?;
    if !cpio_status.success() || !gzip_status.success() {
        return Err(format!("cpio | gzip failed ({cpio_status}, {gzip_status})"));
    }
    Ok(())
}

/// Relative paths of everything below `root`, parents before children, sorted.
fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let dir = root.join(rel);
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = rel.join(entry.file_name());
        out.push(path.clone());
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            walk(root, &path, out)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Steps and the run script
// ---------------------------------------------------------------------------------------

/// One thing the guest runs; its record comes back through the share.
#[derive(Debug, Clone)]
struct Step {
    name: String,
    /// Started in the background first (the server half of a pair); the step waits until it
    /// listens on [`PAIR_PORT`], then runs `cmd` (the client).
    server: Option<Vec<String>>,
    cmd: Vec<String>,
    env: Vec<(String, String)>,
    /// Seconds before the guest kills the program.
    timeout: u32,
    /// Whether a failure fails the run.
    required: bool,
    /// The step's stdout must contain this.
    expect: Option<&'static str>,
    /// A libtest binary: its summary lines count.
    tests: bool,
}

impl Step {
    fn program(name: &str, cmd: Vec<String>) -> Step {
        Step {
            name: name.to_string(),
            server: None,
            cmd,
            env: Vec::new(),
            timeout: 60,
            required: true,
            expect: None,
            tests: false,
        }
    }

    /// `template` as a server and, with the server's address appended, as its client.
    fn pair(name: &str, template: &str) -> Step {
        let server = expand(template);
        let mut client = server.clone();
        client.push("127.0.0.1".into());
        Step {
            server: Some(server),
            ..Step::program(name, client)
        }
    }

    /// The folder of the step's record below `out/`.
    fn dir(&self, index: usize) -> String {
        let name: String = self
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("{:02}-{name}", index + 1)
    }

    /// The longest the step can take in the guest.
    fn limit(&self) -> u32 {
        match self.server {
            // The server's own limit, plus slack for the helpers around it.
            Some(_) => self.timeout + SERVER_GRACE + 10,
            None => self.timeout,
        }
    }
}

impl HostProgram {
    /// The baseline pair (if any) and the program itself, found in the guest at `guest`.
    fn steps(&self, guest: &str) -> Vec<Step> {
        let mut steps = Vec::new();
        if let Some(baseline) = self.baseline {
            steps.push(Step {
                required: self.required,
                ..Step::pair(&format!("{} (perftest)", self.name), baseline)
            });
        }
        let mut cmd = vec![guest.to_string()];
        cmd.extend(expand(self.args));
        steps.push(Step {
            required: self.required,
            timeout: 120,
            env: vec![("LD_LIBRARY_PATH".into(), "/host/lib".into())],
            ..Step::program(self.name, cmd)
        });
        steps
    }
}

/// A command template split into words, with `{dev}`, `{gid}` and `{ip}` filled in.
fn expand(template: &str) -> Vec<String> {
    template
        .split_whitespace()
        .map(|w| {
            w.replace("{dev}", DEVICE)
                .replace("{gid}", GID_INDEX)
                .replace("{ip}", GUEST_IP)
        })
        .collect()
}

/// `s` as one POSIX shell word.
fn sh_quote(s: &str) -> String {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b);
    if !s.is_empty() && s.bytes().all(plain) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn sh_words<'a>(words: impl IntoIterator<Item = &'a str>) -> String {
    words
        .into_iter()
        .map(sh_quote)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The guest's `/host/run.sh`: every step, in order, recorded under `/host/out/`.
fn run_script(steps: &[Step]) -> String {
    let mut s = String::from(
        "#!/bin/sh\n\
         # Generated by `cargo xtask rxe` (xtask/src/rxe.rs) for one run. Each step leaves\n\
         # stdout, stderr, rc, start and end in /host/out/<step>/ (see /usr/lib/rxe/lib.sh).\n\
         . /usr/lib/rxe/lib.sh\n\
         cd /tmp\n",
    );
    for (i, step) in steps.iter().enumerate() {
        let dir = step.dir(i);
        let mut env = Vec::new();
        if !step.env.is_empty() {
            env.push("env".to_string());
            env.extend(step.env.iter().map(|(k, v)| format!("{k}={v}")));
        }
        let command = |cmd: &[String]| sh_words(env.iter().chain(cmd).map(String::as_str));
        let _ = writeln!(
            s,
            "\nbegin {}",
            sh_quote(&format!("step {}/{} {}", i + 1, steps.len(), step.name))
        );
        if let Some(server) = &step.server {
            let _ = writeln!(
                s,
                "server {dir}/server {} {}",
                step.timeout + SERVER_GRACE,
                command(server)
            );
            // A server that never listens: the client is not run (await_listen says why).
            let _ = writeln!(
                s,
                "await_listen {dir} {PAIR_PORT} {LISTEN_WAIT} && step {dir} {} {}",
                step.timeout,
                command(&step.cmd)
            );
            let _ = writeln!(s, "reap {dir}/server {REAP_WAIT}");
        } else {
            let _ = writeln!(s, "step {dir} {} {}", step.timeout, command(&step.cmd));
        }
    }
    s
}

/// The VM's wall-clock limit: boot, plus every step running into its own limit.
fn default_timeout(steps: &[Step]) -> u32 {
    BOOT_ALLOWANCE + steps.iter().map(Step::limit).sum::<u32>()
}

/// The folder shared with the guest for one run.
struct Share {
    dir: PathBuf,
    /// Host program -> its path in the guest, for programs already copied.
    shipped: BTreeMap<PathBuf, String>,
}

impl Share {
    fn create(rxe_dir: &Path) -> Result<Share, String> {
        let stamp = std::time::SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let dir = rxe_dir
            .join("runs")
            .join(format!("{stamp}-{}", std::process::id()));
        for sub in ["bin", "lib", "out"] {
            let d = dir.join(sub);
            fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        Ok(Share {
            dir,
            shipped: BTreeMap::new(),
        })
    }

    fn console_log(&self) -> PathBuf {
        self.dir.join("console.log")
    }

    /// Copies a host-built program into `bin/`, and the libraries it links that the
    /// initramfs lacks into `lib/`; returns the program's path in the guest.
    fn ship(&mut self, program: &Path, plan: &Plan) -> Result<String, String> {
        if let Some(guest) = self.shipped.get(program) {
            return Ok(guest.clone());
        }
        let name = program
            .file_name()
            .ok_or_else(|| format!("not a program: {}", program.display()))?;
        let dst = self.dir.join("bin").join(name);
        fs::copy(program, &dst).map_err(|e| format!("{}: {e}", program.display()))?;
        for lib in ldd(program)? {
            if !plan.has(&guest_path(&lib)?) {
                let dst = self
                    .dir
                    .join("lib")
                    .join(lib.file_name().unwrap_or_default());
                fs::copy(&lib, &dst).map_err(|e| format!("{}: {e}", lib.display()))?;
            }
        }
        let guest = format!("/host/bin/{}", name.to_string_lossy());
        self.shipped.insert(program.to_path_buf(), guest.clone());
        Ok(guest)
    }

    fn write_script(&self, steps: &[Step]) -> Result<(), String> {
        let path = self.dir.join("run.sh");
        fs::write(&path, run_script(steps)).map_err(|e| format!("{}: {e}", path.display()))
    }
}

// ---------------------------------------------------------------------------------------
// The VM
// ---------------------------------------------------------------------------------------

enum VmEnd {
    Exited(ExitStatus),
    TimedOut,
}

/// Boots the guest, logs its console to `log` (printing its `@rxe` progress lines) and
/// waits for it to power off, at most `timeout`.
fn boot(
    kernel: &Kernel,
    initrd: &Path,
    share: &Path,
    log: &Path,
    timeout: Duration,
) -> Result<VmEnd, String> {
    // QEMU option values escape a comma by doubling it.
    let share_opt = share.to_string_lossy().replace(',', ",,");
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args([
        "-accel",
        "tcg,thread=multi",
        "-cpu",
        "max",
        "-m",
        "2G",
        "-smp",
        "2",
    ])
    .args(["-nographic", "-no-reboot"])
    .arg("-kernel")
    .arg(&kernel.vmlinuz)
    .arg("-initrd")
    .arg(initrd)
    .args(["-append", "console=ttyS0 quiet panic=-1", "-nic", "none"])
    .arg("-virtfs")
    .arg(format!(
        "local,path={share_opt},mount_tag=host,security_model=none,id=host"
    ))
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    eprintln!("$ {}", util::show(&cmd));
    let mut log_file = fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("qemu-system-x86_64: {e}"))?;
    let (tx, rx) = mpsc::channel::<String>();
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|stream| {
        let tx = tx.clone();
        thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut line = Vec::new();
            while reader.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
                let text = String::from_utf8_lossy(&line);
                if tx.send(plain(&text)).is_err() {
                    break;
                }
                line.clear();
            }
        })
    })
    .collect();
    drop(tx);

    let mut timed_out = false;
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        match rx.recv_timeout(left.min(Duration::from_millis(500))) {
            Ok(line) => {
                let t = started.elapsed().as_secs_f64();
                let _ = writeln!(log_file, "[{t:8.3}] {line}");
                if let Some(at) = line.find("@rxe ") {
                    println!("  vm {t:6.1}s  {}", &line[at + 5..]);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if started.elapsed() >= timeout {
            timed_out = true;
            let _ = child.kill();
            break;
        }
    }
    let status = child.wait().map_err(|e| format!("qemu: {e}"))?;
    for reader in readers {
        let _ = reader.join();
    }
    for line in rx.try_iter() {
        let _ = writeln!(log_file, "{line}");
    }
    let _ = writeln!(
        log_file,
        "[{:8.3}] host: qemu {}",
        started.elapsed().as_secs_f64(),
        if timed_out {
            "killed (timeout)".to_string()
        } else {
            status.to_string()
        }
    );
    Ok(if timed_out {
        VmEnd::TimedOut
    } else {
        VmEnd::Exited(status)
    })
}

/// A console line without terminal control sequences (SeaBIOS clears the screen, and a
/// printed log must not) or other control characters.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                // CSI: ESC [ parameters final-byte; anything else: ESC and one character.
                if chars.next_if_eq(&'[').is_some() {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            }
            '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------------------

/// What one program left in its record folder.
#[derive(Debug, Default)]
struct Record {
    rc: Option<i32>,
    /// A server that outlived its client and was killed.
    killed: bool,
    /// A client that was not run, and why (its server never listened).
    not_run: Option<String>,
    seconds: Option<f64>,
    stdout: String,
    stderr: String,
}

fn read_record(dir: &Path) -> Record {
    let read =
        |name: &str| fs::read(dir.join(name)).map(|b| String::from_utf8_lossy(&b).into_owned());
    let number = |name: &str| read(name).ok().and_then(|s| s.trim().parse::<f64>().ok());
    Record {
        rc: read("rc").ok().and_then(|s| s.trim().parse().ok()),
        killed: dir.join("killed").exists(),
        not_run: read("not-run").ok().map(|s| s.trim().to_string()),
        seconds: number("start").zip(number("end")).map(|(a, b)| b - a),
        stdout: read("stdout").unwrap_or_default(),
        stderr: read("stderr").unwrap_or_default(),
    }
}

/// Why a step failed, if it did.
fn verdict(step: &Step, client: &Record, server: Option<&Record>) -> Result<(), String> {
    let status = |who: &str, r: &Record, limit: u32| match r.rc {
        None => Err(format!("{who}did not finish")),
        Some(_) if r.killed => Err(format!(
            "{who}still running {REAP_WAIT} s after the client, killed"
        )),
        Some(0) => Ok(()),
        // timeout -s KILL: the shell sees 128 + 9
        Some(137) if r.seconds.is_some_and(|s| s + 0.5 >= f64::from(limit)) => {
            Err(format!("{who}timed out after {limit} s"))
        }
        Some(rc) => Err(format!("{who}exit status {rc}")),
    };
    if let Some(why) = &client.not_run {
        return Err(format!("not run: {why}"));
    }
    status("", client, step.timeout)?;
    if let Some(server) = server {
        status("server: ", server, step.timeout + SERVER_GRACE)?;
    }
    match step.expect {
        Some(text) if !client.stdout.contains(text) => Err(format!("stdout lacks {text:?}")),
        _ => Ok(()),
    }
}

/// libtest's counts from its summary line(s).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct TestCounts {
    passed: u64,
    failed: u64,
    ignored: u64,
    measured: u64,
    filtered_out: u64,
}

impl std::ops::AddAssign for TestCounts {
    fn add_assign(&mut self, o: TestCounts) {
        self.passed += o.passed;
        self.failed += o.failed;
        self.ignored += o.ignored;
        self.measured += o.measured;
        self.filtered_out += o.filtered_out;
    }
}

/// `test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 2 filtered out; finished
/// in 0.01s`.
fn parse_summary(line: &str) -> Option<TestCounts> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let (_, counts) = rest.split_once(". ")?;
    let mut c = TestCounts::default();
    let mut any = false;
    for part in counts.split(';') {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        let slot = match what {
            "passed" => &mut c.passed,
            "failed" => &mut c.failed,
            "ignored" => &mut c.ignored,
            "measured" => &mut c.measured,
            "filtered" => &mut c.filtered_out,
            _ => continue,
        };
        *slot += n;
        any = true;
    }
    any.then_some(c)
}

/// The summary lines of a libtest binary's output and their summed counts.
fn test_summaries(stdout: &str) -> (Vec<&str>, TestCounts) {
    let mut total = TestCounts::default();
    let mut lines = Vec::new();
    for line in stdout.lines() {
        if let Some(c) = parse_summary(line) {
            total += c;
            lines.push(line.trim());
        }
    }
    (lines, total)
}

#[derive(Default)]
struct Report {
    /// One line per step for the summary.
    lines: Vec<String>,
    /// The test binaries' libtest summary lines.
    summaries: Vec<String>,
    tests: TestCounts,
    problems: Vec<String>,
}

/// Prints every step's record under a header and judges it.
fn report_steps(steps: &[Step], out: &Path) -> Report {
    let mut report = Report::default();
    for (i, step) in steps.iter().enumerate() {
        let dir = out.join(step.dir(i));
        let client = read_record(&dir);
        let server = step
            .server
            .as_ref()
            .map(|_| read_record(&dir.join("server")));
        let verdict = verdict(step, &client, server.as_ref());
        let state = match (&verdict, step.required) {
            (Ok(()), _) => "ok".to_string(),
            (Err(e), true) => format!("FAILED ({e})"),
            (Err(e), false) => format!("failed, not required ({e})"),
        };
        let took = client
            .seconds
            .map_or_else(|| "-".to_string(), |s| format!("{s:.1} s"));
        println!(
            "\n==== [{}/{}] {}: {state}, {took}",
            i + 1,
            steps.len(),
            step.name
        );
        if let Some(server) = &step.server {
            println!("server$ {}", sh_words(server.iter().map(String::as_str)));
        }
        println!("$ {}", sh_words(step.cmd.iter().map(String::as_str)));
        print_output("stdout", &client.stdout);
        print_output("stderr", &client.stderr);
        if let Some(server) = &server {
            print_output("server stdout", &server.stdout);
            print_output("server stderr", &server.stderr);
        }
        if step.tests {
            let (lines, counts) = test_summaries(&client.stdout);
            report.tests += counts;
            for line in lines {
                report.summaries.push(format!("{}: {line}", step.name));
            }
        }
        report.lines.push(format!(
            "{:<8} {:<40} {took:>9}{}",
            if verdict.is_ok() {
                "ok"
            } else if step.required {
                "FAILED"
            } else {
                "failed"
            },
            step.name,
            match &verdict {
                Err(e) => format!(
                    "  {e}{}",
                    if step.required { "" } else { " (not required)" }
                ),
                Ok(()) => String::new(),
            }
        ));
        if let (Err(e), true) = (&verdict, step.required) {
            report.problems.push(format!("{}: {e}", step.name));
        }
    }
    report
}

/// The first data row of a perftest-style report: column header -> value. Headers are
/// split into words, and a word without a `[unit]` joins the next one (`BW peak[MB/sec]`,
/// `99% percentile[usec]`).
fn perf_row(text: &str) -> BTreeMap<String, f64> {
    let mut lines = text.lines().map(str::trim);
    let Some(header) = lines.find(|l| l.starts_with("#bytes")) else {
        return BTreeMap::new();
    };
    let mut columns = Vec::new();
    let mut pending = String::new();
    for word in header.split_whitespace() {
        if !pending.is_empty() {
            pending.push(' ');
        }
        pending.push_str(word);
        if word.starts_with('#') || word.contains('[') {
            columns.push(std::mem::take(&mut pending));
        }
    }
    let Some(row) = lines.find(|l| !l.is_empty()) else {
        return BTreeMap::new();
    };
    columns
        .into_iter()
        .zip(row.split_whitespace())
        .filter_map(|(c, v)| Some((c, v.parse().ok()?)))
        .collect()
}

/// Columns compared between perftest and hotverbs-perf: (perftest prefix, ours).
const COMPARED_COLUMNS: &[(&str, &str)] = &[
    ("t_typical", "t_p50"),
    ("t_avg", "t_avg"),
    ("BW average", "BW average"),
];

/// One line per column both reports have, with the ratio hotverbs / perftest.
fn compare_perf(name: &str, perftest: &str, hotverbs: &str) -> Vec<String> {
    let (ours, theirs) = (perf_row(hotverbs), perf_row(perftest));
    let find = |row: &BTreeMap<String, f64>, prefix: &str| {
        row.iter()
            .find(|(c, _)| c.starts_with(prefix))
            .map(|(c, v)| (c.clone(), *v))
    };
    COMPARED_COLUMNS
        .iter()
        .filter_map(|(theirs_prefix, ours_prefix)| {
            let (tc, tv) = find(&theirs, theirs_prefix)?;
            let (oc, ov) = find(&ours, ours_prefix)?;
            let ratio = if tv > 0.0 {
                format!("{:.2}x", ov / tv)
            } else {
                "-".into()
            };
            Some(format!(
                "{name}: {oc} {ov:.2} vs perftest {tc} {tv:.2}: {ratio}"
            ))
        })
        .collect()
}

fn print_console_tail(log: &Path, lines: usize) {
    let text = fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    println!(
        "\n==== last {lines} lines of the VM console ({})",
        rel(log).display()
    );
    for line in &all[all.len().saturating_sub(lines)..] {
        println!("{line}");
    }
}

fn print_output(label: &str, text: &str) {
    if !text.trim().is_empty() {
        println!("---- {label}");
        print!("{text}");
        if !text.ends_with('\n') {
            println!();
        }
    }
}

/// Kernel warnings of the run (a rxe bug shows up here first).
fn print_kernel_warnings(dmesg: &Path) {
    let text = fs::read_to_string(dmesg).unwrap_or_default();
    let bad: Vec<&str> = text
        .lines()
        .filter(|l| {
            ["WARNING", "BUG", "Oops", "Call Trace", "general protection"]
                .iter()
                .any(|w| l.contains(w))
        })
        .collect();
    if !bad.is_empty() {
        println!(
            "\n==== kernel warnings (full log: {})",
            rel(dmesg).display()
        );
        for line in bad.iter().take(40) {
            println!("{line}");
        }
    }
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

/// Just enough JSON for cargo's messages (`cargo metadata`, `--message-format=json`).
mod json {
    #[derive(Debug, Clone, PartialEq)]
    pub enum Value {
        Null,
        Bool(bool),
        Number(f64),
        String(String),
        Array(Vec<Value>),
        Object(Vec<(String, Value)>),
    }

    impl Value {
        pub fn get(&self, key: &str) -> Option<&Value> {
            match self {
                Value::Object(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
                _ => None,
            }
        }

        pub fn as_str(&self) -> Option<&str> {
            match self {
                Value::String(s) => Some(s),
                _ => None,
            }
        }

        /// The elements of an array (none for anything else).
        pub fn items(&self) -> &[Value] {
            match self {
                Value::Array(items) => items,
                _ => &[],
            }
        }
    }

    pub fn parse(text: &str) -> Result<Value, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("trailing characters at {}", p.i));
        }
        Ok(v)
    }

    struct Parser<'a> {
        s: &'a [u8],
        i: usize,
    }

    impl Parser<'_> {
        fn ws(&mut self) {
            while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
                self.i += 1;
            }
        }

        fn err<T>(&self, what: &str) -> Result<T, String> {
            Err(format!("{what} at byte {}", self.i))
        }

        fn eat(&mut self, word: &str) -> bool {
            let hit = self.s[self.i..].starts_with(word.as_bytes());
            if hit {
                self.i += word.len();
            }
            hit
        }

        fn value(&mut self) -> Result<Value, String> {
            self.ws();
            match self.s.get(self.i) {
                None => self.err("unexpected end"),
                Some(b'{') => {
                    self.i += 1;
                    let mut fields = Vec::new();
                    self.ws();
                    if self.eat("}") {
                        return Ok(Value::Object(fields));
                    }
                    loop {
                        self.ws();
                        let key = self.string()?;
                        self.ws();
                        if !self.eat(":") {
                            return self.err("expected ':'");
                        }
                        fields.push((key, self.value()?));
                        self.ws();
                        if self.eat("}") {
                            return Ok(Value::Object(fields));
                        }
                        if !self.eat(",") {
                            return self.err("expected ',' or '}'");
                        }
                    }
                }
                Some(b'[') => {
                    self.i += 1;
                    let mut items = Vec::new();
                    self.ws();
                    if self.eat("]") {
                        return Ok(Value::Array(items));
                    }
                    loop {
                        items.push(self.value()?);
                        self.ws();
                        if self.eat("]") {
                            return Ok(Value::Array(items));
                        }
                        if !self.eat(",") {
                            return self.err("expected ',' or ']'");
                        }
                    }
                }
                Some(b'"') => Ok(Value::String(self.string()?)),
                Some(_) if self.eat("true") => Ok(Value::Bool(true)),
                Some(_) if self.eat("false") => Ok(Value::Bool(false)),
                Some(_) if self.eat("null") => Ok(Value::Null),
                Some(_) => {
                    let start = self.i;
                    while self
                        .s
                        .get(self.i)
                        .is_some_and(|b| b.is_ascii_digit() || b"+-.eE".contains(b))
                    {
                        self.i += 1;
                    }
                    std::str::from_utf8(&self.s[start..self.i])
                        .ok()
                        .and_then(|n| n.parse().ok())
                        .map(Value::Number)
                        .map_or_else(|| self.err("bad value"), Ok)
                }
            }
        }

        fn hex4(&mut self) -> Result<u32, String> {
            let digits = self
                .s
                .get(self.i..self.i + 4)
                .and_then(|h| std::str::from_utf8(h).ok());
            match digits.and_then(|h| u32::from_str_radix(h, 16).ok()) {
                Some(v) => {
                    self.i += 4;
                    Ok(v)
                }
                None => self.err("bad \\u escape"),
            }
        }

        fn string(&mut self) -> Result<String, String> {
            if !self.eat("\"") {
                return self.err("expected a string");
            }
            let mut out = Vec::new();
            loop {
                let Some(&b) = self.s.get(self.i) else {
                    return self.err("unterminated string");
                };
                self.i += 1;
                match b {
                    b'"' => break,
                    b'\\' => {
                        let Some(&e) = self.s.get(self.i) else {
                            return self.err("unterminated escape");
                        };
                        self.i += 1;
                        let c = match e {
                            b'"' => '"',
                            b'\\' => '\\',
                            b'/' => '/',
                            b'b' => '\u{8}',
                            b'f' => '\u{c}',
                            b'n' => '\n',
                            b'r' => '\r',
                            b't' => '\t',
                            b'u' => {
                                let hi = self.hex4()?;
                                let code = if (0xd800..0xdc00).contains(&hi) && self.eat("\\u") {
                                    let lo = self.hex4()?;
                                    0x10000
                                        + ((hi - 0xd800) << 10)
                                        + (lo.wrapping_sub(0xdc00) & 0x3ff)
                                } else {
                                    hi
                                };
                                char::from_u32(code).unwrap_or('\u{fffd}')
                            }
                            _ => return self.err("bad escape"),
                        };
                        out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                    }
                    _ => out.push(b),
                }
            }
            // Only ASCII was split off, so the bytes are the input's UTF-8.
            String::from_utf8(out).map_err(|_| "invalid UTF-8 in a string".to_string())
        }
    }
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

    #[test]
    fn apt_depends_names_the_kernel_package() {
        let out = "linux-image-amd64\n  Depends: linux-image-6.1.0-56-amd64\n";
        assert_eq!(
            parse_apt_depends(out).as_deref(),
            Some("linux-image-6.1.0-56-amd64")
        );
        let alternatives = "linux-image-amd64\n |Depends: <linux-image-6.12.9-amd64>\n  Depends: linux-image-6.1.0-1-amd64\n  Recommends: firmware-linux-free\n";
        assert_eq!(
            parse_apt_depends(alternatives).as_deref(),
            Some("linux-image-6.12.9-amd64")
        );
        assert_eq!(
            parse_apt_depends("linux-image-amd64\n  Depends: initramfs-tools\n"),
            None
        );
        assert_eq!(
            parse_apt_depends("  Depends: linux-image-../../etc\n"),
            None
        );
        assert_eq!(parse_apt_depends(""), None);
    }

    #[test]
    fn libtest_summaries_are_parsed_and_summed() {
        let out = "running 4 tests\ntest a ... ok\n\
                   test result: FAILED. 2 passed; 1 failed; 1 ignored; 0 measured; 3 filtered out; finished in 0.52s\n\
                   \n  test result: ok. 5 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 1.00s\n\
                   test result of something else\n";
        let (lines, total) = test_summaries(out);
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("test result: FAILED. 2 passed"));
        assert_eq!(
            total,
            TestCounts {
                passed: 7,
                failed: 1,
                ignored: 3,
                measured: 0,
                filtered_out: 3
            }
        );
        assert_eq!(parse_summary("test result: ok."), None);
        assert_eq!(parse_summary("running 0 tests"), None);
    }

    #[test]
    fn shell_quoting_survives_the_shell() {
        assert_eq!(sh_quote("ib_send_lat"), "ib_send_lat");
        assert_eq!(sh_quote("HOTVERBS_RXE=1"), "HOTVERBS_RXE=1");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote("$HOME;rm"), "'$HOME;rm'");
        // The real shell agrees: echo every word back, one per line.
        let words = [
            "plain",
            "two words",
            "it's",
            "$x `y` \"z\"",
            "",
            "*",
            "a\nb",
        ];
        let script = format!("printf '%s\\n' {}", sh_words(words));
        let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            words.map(|w| format!("{w}\n")).concat()
        );
    }

    #[test]
    fn ldd_output_gives_library_paths() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibibverbs.so.1 => /lib/x86_64-linux-gnu/libibverbs.so.1 (0x00007f1)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n";
        assert_eq!(
            parse_ldd(out).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libibverbs.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(parse_ldd("\tlibfoo.so.1 => not found\n")
            .unwrap_err()
            .contains("libfoo.so.1"));
    }

    #[test]
    fn module_names_and_load_order() {
        assert_eq!(module_name("rdma_rxe.ko").as_deref(), Some("rdma_rxe"));
        assert_eq!(
            module_name("9pnet_virtio.ko.xz").as_deref(),
            Some("9pnet_virtio")
        );
        assert_eq!(
            module_name("crc32-generic.ko.zst").as_deref(),
            Some("crc32_generic")
        );
        assert_eq!(module_name("modules.order"), None);
        assert_eq!(module_name(".ko"), None);

        let deps: BTreeMap<&str, Option<Vec<&str>>> = [
            ("rdma_rxe", Some(vec!["ib_uverbs", "ib_core", "udp_tunnel"])),
            ("ib_uverbs", Some(vec!["ib_core"])),
            ("ib_core", Some(vec![])),
            ("udp_tunnel", Some(vec![])),
            ("rdma_ucm", Some(vec!["ib_core", "builtin_thing"])),
            ("builtin_thing", None),
        ]
        .into_iter()
        .collect();
        let lookup = |n: &str| {
            deps.get(n)
                .map(|d| {
                    d.as_ref()
                        .map(|v| v.iter().map(|s| s.to_string()).collect())
                })
                .ok_or_else(|| format!("no {n}"))
        };
        assert_eq!(
            load_order(&["rdma_rxe", "rdma_ucm", "ib_core"], lookup).unwrap(),
            ["ib_core", "ib_uverbs", "udp_tunnel", "rdma_rxe", "rdma_ucm"]
        );
        assert!(load_order(&["missing"], lookup)
            .unwrap_err()
            .contains("no missing"));
        let cyclic = |n: &str| Ok(Some(vec![if n == "a" { "b" } else { "a" }.to_string()]));
        assert!(load_order(&["a"], cyclic)
            .unwrap_err()
            .contains("a -> b -> a"));
    }

    /// A minimal ELF64 with a `.modinfo` section and no program headers.
    fn tiny_elf(modinfo: &[u8]) -> Vec<u8> {
        let names = b"\0.shstrtab\0.modinfo\0";
        let mut f = vec![0u8; 64];
        f[..6].copy_from_slice(b"\x7fELF\x02\x01");
        let names_at = f.len();
        f.extend_from_slice(names);
        let modinfo_at = f.len();
        f.extend_from_slice(modinfo);
        while f.len() % 8 != 0 {
            f.push(0);
        }
        let shoff = f.len();
        // (name offset, data offset, size) for: null, .shstrtab, .modinfo
        for (name, at, size) in [
            (0, 0, 0),
            (1, names_at, names.len()),
            (11, modinfo_at, modinfo.len()),
        ] {
            let mut h = [0u8; 64];
            h[..4].copy_from_slice(&(name as u32).to_le_bytes());
            h[0x18..0x20].copy_from_slice(&(at as u64).to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            f.extend_from_slice(&h);
        }
        f[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        f[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        f[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        f[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        f
    }

    #[test]
    fn modinfo_depends_from_an_elf_section() {
        let elf =
            tiny_elf(b"license=GPL\0depends=ib_uverbs,ib_core,ip6-udp-tunnel\0name=rdma_rxe\0");
        let section = elf_section(&elf, ".modinfo").unwrap();
        assert_eq!(
            modinfo_depends(section),
            ["ib_uverbs", "ib_core", "ip6_udp_tunnel"]
        );
        assert_eq!(elf_section(&elf, ".text"), None);
        assert_eq!(
            modinfo_depends(b"depends=\0name=dummy\0"),
            Vec::<String>::new()
        );
        assert_eq!(elf_section(b"not an elf", ".modinfo"), None);
        // No program headers: static. This test binary itself: dynamic.
        assert_eq!(elf_is_static(&elf), Some(true));
        let me = fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(elf_is_static(&me), Some(false));
    }

    #[test]
    fn cargo_json_finds_real_device_tests() {
        let line = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/verbs#hotverbs@0.1.0","manifest_path":"/w/verbs/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"real_device","src_path":"/w/verbs/tests/real_device.rs","edition":"2021","doc":false,"doctest":false,"test":true},"profile":{"opt_level":"0","debug_assertions":true,"test":true},"features":[],"filenames":["/w/target/debug/deps/real_device-0123abcd"],"executable":"/w/target/debug/deps/real_device-0123abcd","fresh":false}"#;
        let msg = json::parse(line).unwrap();
        assert_eq!(
            real_device_executable(&msg),
            Some(TestBinary {
                package: "hotverbs".into(),
                target: "real_device".into(),
                path: "/w/target/debug/deps/real_device-0123abcd".into(),
            })
        );
        let lib = line.replace(r#""kind":["test"]"#, r#""kind":["lib"]"#);
        assert_eq!(real_device_executable(&json::parse(&lib).unwrap()), None);
        let other = line.replace(r#""name":"real_device""#, r#""name":"softnic""#);
        assert_eq!(real_device_executable(&json::parse(&other).unwrap()), None);

        let meta = json::parse(
            r#"{"packages":[{"name":"hotverbs","targets":[{"kind":["lib"],"name":"hotverbs"},{"kind":["test"],"name":"real_device_qp"}]},
                {"name":"hotverbs-ffi","targets":[{"kind":["test"],"name":"layout"}]}],
               "target_directory":"/w/target","esc":"a\"b\\c\u00e9\ud83d\ude00","n":[1,-2.5e3,true,null]}"#,
        )
        .unwrap();
        assert_eq!(
            real_device_targets(&meta),
            [("hotverbs".to_string(), "real_device_qp".to_string())]
        );
        assert_eq!(
            meta.get("esc").and_then(json::Value::as_str),
            Some("a\"b\\cé😀")
        );
        assert_eq!(
            meta.get("n").unwrap().items(),
            [
                json::Value::Number(1.0),
                json::Value::Number(-2500.0),
                json::Value::Bool(true),
                json::Value::Null
            ]
        );
        assert!(json::parse(r#"{"a":1"#).is_err());
        assert!(json::parse(r#"{"a":1} x"#).is_err());
    }

    #[test]
    fn package_names_from_ids() {
        assert_eq!(
            package_name("path+file:///w/verbs#hotverbs@0.1.0"),
            "hotverbs"
        );
        assert_eq!(package_name("path+file:///w/xtask#0.1.0"), "xtask");
        assert_eq!(
            package_name("hotverbs-ffi 0.1.0 (path+file:///w/verbs-ffi)"),
            "hotverbs-ffi"
        );
    }

    #[test]
    fn run_script_records_every_step() {
        let mut steps = sanity_steps();
        steps.push(
            TestBinary {
                package: "hotverbs".into(),
                target: "real_device".into(),
                path: "/x".into(),
            }
            .step("/host/bin/real_device-1".into(), Some("qp state")),
        );
        let s = run_script(&steps);
        assert!(s.starts_with("#!/bin/sh\n"));
        assert!(s.contains("\nstep 01-ibv_devices 30 ibv_devices\n"));
        assert!(s.contains(
            "\nserver 02-rc_pingpong/server 180 ibv_rc_pingpong -d rxe0 -g 1 -n 1000\n\
             await_listen 02-rc_pingpong 18515 60 && \
             step 02-rc_pingpong 60 ibv_rc_pingpong -d rxe0 -g 1 -n 1000 127.0.0.1\n\
             reap 02-rc_pingpong/server 60\n"
        ));
        assert!(s.contains(
            " 60 && step 03-send_lat 60 ib_send_lat -d rxe0 -x 1 -F -n 1000 127.0.0.1\n"
        ));
        assert!(s.contains(
            "\nstep 04-test_hotverbs_real_device 300 env HOTVERBS_RXE=1 HOTVERBS_DEVICE=rxe0 \
             HOTVERBS_GID_INDEX=1 RUST_BACKTRACE=1 LD_LIBRARY_PATH=/host/lib \
             /host/bin/real_device-1 --test-threads=1 'qp state'\n"
        ));
        // The script is valid shell.
        let out = Command::new("sh")
            .arg("-n")
            .arg("-c")
            .arg(&s)
            .status()
            .unwrap();
        assert!(out.success());
        assert_eq!(
            default_timeout(&steps),
            BOOT_ALLOWANCE + 30 + 190 + 190 + 300
        );
    }

    #[test]
    fn perf_reports_compare_side_by_side() {
        let perftest = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 2       1000          13.41          336.18       16.15    \t       19.22       \t22.67  \t\t181.27  \t\t336.18 \n-----\n";
        let row = perf_row(perftest);
        assert_eq!(row.get("t_typical[usec]"), Some(&16.15));
        assert_eq!(row.get("99% percentile[usec]"), Some(&181.27));
        assert_eq!(row.get("99.9% percentile[usec]"), Some(&336.18));
        let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 65536      1000             120.50             118.25               0.001892\n";
        assert_eq!(perf_row(bw).get("BW average[MB/sec]"), Some(&118.25));
        let ours = "#bytes #iterations t_min[usec] t_p50[usec] t_avg[usec]\n2 1000 10.0 8.1 9.61\n";
        assert_eq!(
            compare_perf("send_lat", perftest, ours),
            [
                "send_lat: t_p50[usec] 8.10 vs perftest t_typical[usec] 16.15: 0.50x",
                "send_lat: t_avg[usec] 9.61 vs perftest t_avg[usec] 19.22: 0.50x"
            ]
        );
        assert!(compare_perf("x", perftest, "no table here").is_empty());
    }

    #[test]
    fn console_lines_lose_control_sequences() {
        assert_eq!(
            plain("\u{1b}c\u{1b}[?7l\u{1b}[2J\u{1b}[0mSeaBIOS (version 1.16)\r\n"),
            "SeaBIOS (version 1.16)"
        );
        assert_eq!(
            plain("@rxe step 1/3\tibv_devices\r"),
            "@rxe step 1/3\tibv_devices"
        );
        assert_eq!(plain("plain"), "plain");
    }

    #[test]
    fn guest_scripts_are_valid_shell() {
        for (name, script) in [("init", INIT), ("lib.sh", LIB_SH)] {
            let ok = Command::new("sh")
                .args(["-n", "-c", script])
                .status()
                .unwrap();
            assert!(ok.success(), "xtask/rxe/{name} has a syntax error");
        }
    }

    #[test]
    fn verdicts() {
        let step = Step {
            expect: Some("rxe0"),
            ..Step::program("x", vec![])
        };
        let rec = |rc: Option<i32>, seconds: f64, stdout: &str| Record {
            rc,
            killed: false,
            not_run: None,
            seconds: Some(seconds),
            stdout: stdout.into(),
            stderr: String::new(),
        };
        assert_eq!(verdict(&step, &rec(Some(0), 1.0, "rxe0 ..."), None), Ok(()));
        assert_eq!(
            verdict(&step, &rec(Some(0), 1.0, "none"), None),
            Err("stdout lacks \"rxe0\"".into())
        );
        assert_eq!(
            verdict(&step, &rec(Some(1), 1.0, "rxe0"), None),
            Err("exit status 1".into())
        );
        assert_eq!(
            verdict(&step, &rec(Some(137), 60.0, ""), None),
            Err("timed out after 60 s".into())
        );
        assert_eq!(
            verdict(&step, &rec(Some(137), 2.0, ""), None),
            Err("exit status 137".into())
        );
        assert_eq!(
            verdict(&step, &rec(None, 0.0, ""), None),
            Err("did not finish".into())
        );
        assert_eq!(
            verdict(
                &step,
                &rec(Some(0), 1.0, "rxe0"),
                Some(&rec(Some(1), 1.0, ""))
            ),
            Err("server: exit status 1".into())
        );
        let killed = Record {
            killed: true,
            ..rec(Some(137), 5.0, "")
        };
        assert_eq!(
            verdict(&step, &rec(Some(0), 1.0, "rxe0"), Some(&killed)),
            Err("server: still running 60 s after the client, killed".into())
        );
        let not_run = Record {
            not_run: Some("the server exited before listening on TCP port 18515".into()),
            ..rec(None, 0.0, "")
        };
        assert_eq!(
            verdict(&step, &not_run, Some(&rec(Some(1), 1.0, ""))),
            Err("not run: the server exited before listening on TCP port 18515".into())
        );
    }

    #[test]
    fn templates_expand_and_manifests_track_content() {
        assert_eq!(
            expand("x -d {dev} -x {gid} {ip}"),
            ["x", "-d", "rxe0", "-x", "1", "10.77.0.1"]
        );
        let mut a = Plan::default();
        a.text("init", "echo one\n", 0o755);
        let mut b = Plan::default();
        b.text("init", "echo two\n", 0o755);
        assert_ne!(a.manifest(), b.manifest());
        b.text("init", "echo one\n", 0o755);
        assert_eq!(a.manifest(), b.manifest());
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
