//! `cargo xtask insn [--gate] [--filter S] [--n1 N] [--n2 N]`: instructions per message (or
//! completion, or round trip) under callgrind, hotverbs beside the naive baseline, each split
//! into our own code and the device's.
//!
//! The workloads live in `hotverbs-benches` (binary `insn-workload`, the same code the
//! criterion benches time). `insn-workload --list` prints the rows, one per line:
//! `row<TAB>baseline<TAB>hotverbs<TAB>ratio target<TAB>own target<TAB>unit` (ratio target:
//! the largest acceptable hotverbs/baseline ratio of the totals, or of the own-code counts
//! when written `o1.40` (against a floor row, whose device share is none); own target: the most
//! instructions of our own code per unit; `-` for none; a target written `~45` is a goal
//! not yet met: printed with its verdict, never failing `--gate`). Each workload runs twice under
//! `valgrind --tool=callgrind --toggle-collect=*hv_measured_*` (only the workloads'
//! `#[inline(never)] hv_measured_*` functions and their callees, device code included, are
//! counted), with N1 and N2 units; instructions per unit are
//! `(I(N2) - I(N1)) / (N2 - N1)`, which also cancels per-call constants (warm-up, the final
//! drain).
//!
//! **Own code and device.** The device is reached through its `ibv_context_ops` function
//! pointers, so callgrind's per-function attribution separates it exactly: everything executed
//! inside a device function (a function whose demangled name starts with
//! `hotverbs_softnic::`, or a trait method of one of its types), including whatever it calls,
//! is the device's; everything else inside `hv_measured_*` is ours (the workload loop, the
//! datapath, the inline verbs dispatch). [`attribute`] reads the call graph of a callgrind
//! output file (`fn=` / `cfn=` / `calls=` records): device instructions are the inclusive
//! costs of the calls from our code into device functions. A non-device function that the
//! device calls (a `std` lock, `memcpy`) and that calls back into the device is counted by
//! the share of its own callers' costs that is ours, so a callback is never counted twice.
//!
//! Instruction counts are deterministic, so the table is a regression gate: `--gate` exits
//! non-zero when a row misses a target.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::{self, cargo, root, show};

struct Opts {
    gate: bool,
    /// Skip the mlx5 golden table (it needs rdma-core's source prepared).
    no_golden: bool,
    filter: Option<String>,
    n1: u64,
    n2: u64,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        gate: false,
        no_golden: false,
        filter: None,
        n1: 20_000,
        n2: 120_000,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut num = |name: &str| -> Result<u64, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "--gate" => o.gate = true,
            "--no-golden" => o.no_golden = true,
            "--n1" => o.n1 = num("--n1")?,
            "--n2" => o.n2 = num("--n2")?,
            "--filter" => {
                o.filter = Some(
                    it.next()
                        .cloned()
                        .ok_or("--filter needs a substring of a workload name")?,
                )
            }
            "-h" | "--help" => {
                return Err(
                    "usage: cargo xtask insn [--gate] [--no-golden] [--filter S] [--n1 N] [--n2 N]"
                        .into(),
                )
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if o.n2 <= o.n1 {
        return Err(format!("--n2 ({}) must exceed --n1 ({})", o.n2, o.n1));
    }
    Ok(o)
}

/// One row of the table.
#[derive(Debug)]
struct Row {
    name: String,
    baseline: String,
    hotverbs: String,
    /// Largest acceptable hotverbs/baseline ratio of the totals.
    ratio: Option<f64>,
    /// The ratio target is a goal (`~` in the list): reported, not gated.
    ratio_goal: bool,
    /// The ratio is of the own-code counts (`o` before the target), not of the totals.
    ratio_own: bool,
    /// Most instructions of our own code per unit.
    own: Option<f64>,
    /// The own-code target is a goal (`~` in the list): reported, not gated.
    own_goal: bool,
    /// What one unit is ("msg", "completion", "round trip").
    unit: String,
}

fn parse_list(text: &str) -> Result<Vec<Row>, String> {
    let target = |t: &str, l: &str| -> Result<Option<f64>, String> {
        match t {
            "-" => Ok(None),
            t => t
                .parse::<f64>()
                .map(Some)
                .map_err(|_| format!("bad target {t:?} in {l:?}")),
        }
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            if f.len() != 6 {
                return Err(format!(
                    "bad workload line {l:?} (want 6 tab-separated fields: row, baseline, \
                     hotverbs, ratio target, own target, unit)"
                ));
            }
            let own_goal = f[4].starts_with('~');
            Ok(Row {
                name: f[0].into(),
                baseline: f[1].into(),
                hotverbs: f[2].into(),
                ratio: target(f[3].trim_start_matches('~').trim_start_matches('o'), l)?,
                ratio_goal: f[3].starts_with('~'),
                ratio_own: f[3].trim_start_matches('~').starts_with('o'),
                own: target(f[4].trim_start_matches('~'), l)?,
                own_goal,
                unit: f[5].into(),
            })
        })
        .collect()
}

/// Is `name` (demangled, as callgrind writes it) a function of the device?
fn is_device(name: &str) -> bool {
    name.starts_with("hotverbs_softnic::") || name.starts_with("<hotverbs_softnic::")
}

/// Instructions of one callgrind run: all of them, and the device's share.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Split {
    total: u64,
    device: f64,
}

impl Split {
    fn own(&self) -> f64 {
        self.total as f64 - self.device
    }
}

/// Reads a callgrind output file (`--dump-instr=no`, any `positions:`; the first event
/// must be `Ir`) and splits its instructions into the device's (functions for which
/// `device(name)` holds, inclusive of what they call) and the rest.
///
/// The file gives, per function, its self cost and one record per callee with the
/// inclusive cost of those calls. Device cost is the sum of the call costs from non-device
/// functions into device functions, each weighted by the share of its caller that runs
/// outside the device: 1 for a function only our code calls (or no one: the roots), 0 for
/// one only the device calls, the cost-weighted mean of its callers' shares otherwise.
fn attribute(text: &str, device: impl Fn(&str) -> bool) -> Result<Split, String> {
    let mut npos = 1usize;
    let mut total: Option<u64> = None;
    let mut names: HashMap<String, String> = HashMap::new();
    // (caller, callee) -> inclusive Ir of those calls.
    let mut edges: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut cur_fn: Option<String> = None;
    let mut pending_call: Option<String> = None;
    let mut sum_self: u64 = 0;
    // Resolves `(id) name` / `(id)` name compression for functions.
    let mut resolve = |spec: &str| -> Result<String, String> {
        let spec = spec.trim();
        if let Some(rest) = spec.strip_prefix('(') {
            let close = rest
                .find(')')
                .ok_or_else(|| format!("bad compressed name {spec:?}"))?;
            let id = &rest[..close];
            let name = rest[close + 1..].trim();
            if name.is_empty() {
                names
                    .get(id)
                    .cloned()
                    .ok_or_else(|| format!("undefined name id ({id})"))
            } else {
                names.insert(id.to_string(), name.to_string());
                Ok(name.to_string())
            }
        } else {
            Ok(spec.to_string())
        }
    };
    for (no, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let first = line.as_bytes()[0];
        if first.is_ascii_digit() || first == b'+' || first == b'-' || first == b'*' {
            // A cost line: positions, then events (Ir first; missing = 0).
            let mut tok = line.split_whitespace().skip(npos);
            let ir: u64 = match tok.next() {
                Some(t) => t
                    .parse()
                    .map_err(|_| format!("line {}: bad cost {t:?}", no + 1))?,
                None => 0,
            };
            match pending_call.take() {
                Some(callee) => {
                    let caller = cur_fn
                        .clone()
                        .ok_or_else(|| format!("line {}: a call outside a function", no + 1))?;
                    *edges.entry((caller, callee)).or_default() += ir;
                }
                None => sum_self += ir,
            }
            continue;
        }
        let Some((key, val)) = line.split_once(['=', ':']) else {
            continue;
        };
        match key {
            "positions" => npos = val.split_whitespace().count().max(1),
            "events" if val.split_whitespace().next() != Some("Ir") => {
                return Err(format!("first event is not Ir: {val:?}"));
            }
            "summary" | "totals" => {
                let v = val.split_whitespace().next().and_then(|n| n.parse().ok());
                if key == "summary" || total.is_none() {
                    total = v;
                }
            }
            "fn" => cur_fn = Some(resolve(val)?),
            "cfn" | "cfnc" => pending_call = Some(resolve(val)?),
            // `calls=` only announces the cost line that follows; the callee is `cfn`.
            _ => {}
        }
    }
    let total = total.unwrap_or(sum_self);
    if edges.is_empty() && total == 0 {
        return Ok(Split { total, device: 0.0 });
    }
    // Share of each non-device function that runs outside the device (fixed point over
    // the call graph; cycles converge because shares only move towards their callers').
    let mut callers: HashMap<&str, Vec<(&str, u64)>> = HashMap::new();
    for ((from, to), c) in &edges {
        if from != to {
            callers
                .entry(to.as_str())
                .or_default()
                .push((from.as_str(), *c));
        }
    }
    let mut share: HashMap<&str, f64> = HashMap::new();
    let share_of = |share: &HashMap<&str, f64>, f: &str| -> f64 {
        if device(f) {
            0.0
        } else {
            share.get(f).copied().unwrap_or(1.0)
        }
    };
    for _ in 0..64 {
        let mut changed = false;
        for (f, cs) in &callers {
            if device(f) {
                continue;
            }
            let all: u64 = cs.iter().map(|c| c.1).sum();
            let s = if all == 0 {
                1.0
            } else {
                cs.iter()
                    .map(|(c, w)| *w as f64 * share_of(&share, c))
                    .sum::<f64>()
                    / all as f64
            };
            if (share_of(&share, f) - s).abs() > 1e-12 {
                changed = true;
            }
            share.insert(f, s);
        }
        if !changed {
            break;
        }
    }
    let device_ir: f64 = edges
        .iter()
        .filter(|((from, to), _)| !device(from) && device(to))
        .map(|((from, _), c)| *c as f64 * share_of(&share, from))
        .sum();
    Ok(Split {
        total,
        device: device_ir,
    })
}

/// Only the workloads' measured functions (and what they call) are counted: device setup,
/// CQ filling in the poll workloads and teardown are not.
const MEASURED: &str = "*hv_measured_*";

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root().join(p) })
        .unwrap_or_else(|| root().join("target"))
}

fn instructions(
    bin: &Path,
    workload: &str,
    n: u64,
    scratch: &Path,
    device: &dyn Fn(&str) -> bool,
) -> Result<Split, String> {
    let out = scratch.join(format!("callgrind.{workload}.{n}"));
    let mut cmd = Command::new("valgrind");
    cmd.arg("--tool=callgrind")
        .arg(format!("--toggle-collect={MEASURED}"))
        .arg("--dump-instr=no")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(bin)
        .arg(workload)
        .arg(n.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    eprintln!("$ {}", show(&cmd));
    let o = cmd.output().map_err(|e| {
        format!(
            "{}: {e} (is valgrind installed? apt-get install valgrind)",
            show(&cmd)
        )
    })?;
    if !o.status.success() {
        return Err(format!(
            "`{}` failed ({}):\n{}",
            show(&cmd),
            o.status,
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let _ = std::fs::remove_file(&out);
    attribute(&text, device).map_err(|e| format!("{}: {e}", out.display()))
}

fn per_message(t1: f64, t2: f64, n1: u64, n2: u64) -> f64 {
    (t2 - t1) / (n2 - n1) as f64
}

/// Instructions per unit of one workload: own code, device, total.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PerUnit {
    own: f64,
    device: f64,
    total: f64,
}

fn per_unit(s1: Split, s2: Split, n1: u64, n2: u64) -> PerUnit {
    PerUnit {
        own: per_message(s1.own(), s2.own(), n1, n2),
        device: per_message(s1.device, s2.device, n1, n2),
        total: per_message(s1.total as f64, s2.total as f64, n1, n2),
    }
}

/// The row's ratio: of the totals, or of the own-code counts for an `o` target.
fn row_ratio(row: &Row, base: PerUnit, hot: PerUnit) -> f64 {
    let (h, b) = if row.ratio_own {
        (hot.own, base.own)
    } else {
        (hot.total, base.total)
    };
    if b > 0.0 {
        h / b
    } else {
        f64::NAN
    }
}

/// The verdicts of one row: `(ratio column, own column, misses)`.
fn verdicts(row: &Row, base: PerUnit, hot: PerUnit) -> (String, String, Vec<String>) {
    let ratio = row_ratio(row, base, hot);
    let mut missed = Vec::new();
    let r = match row.ratio {
        Some(t) if ratio <= t => format!("<= {t:.2} PASS"),
        Some(t) if row.ratio_goal => format!("<= {t:.2} goal MISS"),
        Some(t) => {
            missed.push(format!("{}: ratio {ratio:.2} > {t:.2}", row.name));
            format!("<= {t:.2} MISS")
        }
        None => "-".to_string(),
    };
    let o = match row.own {
        Some(t) if hot.own <= t => format!("<= {t:.0} PASS"),
        Some(t) if row.own_goal => format!("<= {t:.0} goal MISS"),
        Some(t) => {
            missed.push(format!(
                "{}: own {:.1} insn/{} > {t:.0}",
                row.name, hot.own, row.unit
            ));
            format!("<= {t:.0} MISS")
        }
        None => "-".to_string(),
    };
    (r, o, missed)
}

/// Entry point of `cargo xtask insn`.
pub fn run(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    util::run(cargo().args([
        "build",
        "--release",
        "-p",
        "hotverbs-benches",
        "--bin",
        "insn-workload",
    ]))?;
    let bin = target_dir().join("release").join("insn-workload");
    let mut missed = table(&o, &bin, &is_device, "the device is softnic's functions")?;
    if !o.no_golden {
        missed.extend(golden_table(&o)?);
    }
    if missed.is_empty() {
        Ok(())
    } else if o.gate {
        Err(format!("targets missed: {}", missed.join("; ")))
    } else {
        eprintln!(
            "targets missed (not gating; use --gate to fail): {}",
            missed.join("; ")
        );
        Ok(())
    }
}

/// The mlx5 table: hotverbs' rings and libmlx5's own code (rdma-core v55 `qp.c` / `cq.c`,
/// unpatched) on the golden model's fake objects, from the `golden-insn` binary. The device
/// is libmlx5 (every function of the golden library, listed by `golden-insn
/// --provider-symbols`) and softnic's simulated device that completes the WQEs.
fn golden_table(o: &Opts) -> Result<Vec<String>, String> {
    let (src, build) = crate::golden::prepare()?;
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--release",
        "--locked",
        "-p",
        "hotverbs-mlx5-golden",
        "--bin",
        "golden-insn",
    ]);
    crate::golden::env(&mut cmd, &src, &build);
    util::run(&mut cmd)?;
    let bin = target_dir().join("release").join("golden-insn");
    let syms = Command::new(&bin)
        .arg("--provider-symbols")
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    if !syms.status.success() {
        return Err(format!("{} --provider-symbols failed", bin.display()));
    }
    let provider: std::collections::HashSet<String> = String::from_utf8_lossy(&syms.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    if !provider.contains("mlx5_post_send") || !provider.contains("mlx5_poll_cq") {
        return Err("golden-insn lists no mlx5_post_send / mlx5_poll_cq".into());
    }
    let device = move |name: &str| {
        // callgrind suffixes recursion levels with `'N`.
        let base = name.split('\'').next().unwrap_or(name);
        is_device(name) || provider.contains(base) || base.contains("hv_golden_dev")
    };
    table(
        o,
        &bin,
        &device,
        "mlx5: hotverbs and libmlx5 (rdma-core v55 qp.c/cq.c) on the golden model's plain-memory \
         QP/CQ, 32-byte inline SENDs; the device is libmlx5's functions plus the simulated NIC",
    )
}

/// Measures and prints one table of rows from `bin --list`; returns the missed targets.
fn table(
    o: &Opts,
    bin: &Path,
    device: &dyn Fn(&str) -> bool,
    title: &str,
) -> Result<Vec<String>, String> {
    let list = Command::new(bin)
        .arg("--list")
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    if !list.status.success() {
        return Err(format!("{} --list failed ({})", bin.display(), list.status));
    }
    let mut rows = parse_list(&String::from_utf8_lossy(&list.stdout))?;
    if let Some(f) = &o.filter {
        rows.retain(|p| p.name.contains(f.as_str()));
    }
    if rows.is_empty() {
        eprintln!("insn: no row of {} matches the filter", bin.display());
        return Ok(Vec::new());
    }
    let scratch = target_dir().join("insn");
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;

    let mut cache: BTreeMap<String, PerUnit> = BTreeMap::new();
    let mut measure = |w: &str| -> Result<PerUnit, String> {
        if let Some(v) = cache.get(w) {
            return Ok(*v);
        }
        let s1 = instructions(bin, w, o.n1, &scratch, device)?;
        let s2 = instructions(bin, w, o.n2, &scratch, device)?;
        let v = per_unit(s1, s2, o.n1, o.n2);
        cache.insert(w.to_string(), v);
        Ok(v)
    };
    let mut results = Vec::new();
    for r in &rows {
        let b = measure(&r.baseline)?;
        let h = measure(&r.hotverbs)?;
        results.push((r, b, h));
    }

    println!();
    println!(
        "instructions per unit (callgrind, {MEASURED} only, (I(N2) - I(N1)) / (N2 - N1), \
         N1 = {}, N2 = {}); own = our code, dev = the device's functions and what they call; \
         {title}",
        o.n1, o.n2
    );
    println!(
        "| {:<40} | {:>10} | {:>9} | {:>9} | {:>10} | {:>9} | {:>9} | {:>10} | {:>5} | {:>15} | {:>15} |",
        "workload",
        "unit",
        "base own",
        "base dev",
        "base all",
        "hv own",
        "hv dev",
        "hv all",
        "ratio",
        "ratio target",
        "own target"
    );
    println!(
        "|{:-<42}|{:->12}|{:->11}|{:->11}|{:->12}|{:->11}|{:->11}|{:->12}|{:->7}|{:->17}|{:->17}|",
        "", "", "", "", "", "", "", "", "", "", ""
    );
    let mut missed = Vec::new();
    for (r, b, h) in &results {
        let (rv, ov, m) = verdicts(r, *b, *h);
        missed.extend(m);
        println!(
            "| {:<40} | {:>10} | {:>9.1} | {:>9.1} | {:>10.1} | {:>9.1} | {:>9.1} | {:>10.1} | {:>5.2} | {:>15} | {:>15} |",
            r.name,
            r.unit,
            b.own,
            b.device,
            b.total,
            h.own,
            h.device,
            h.total,
            row_ratio(r, *b, *h),
            rv,
            ov
        );
    }
    println!();
    against_069ddb0(&results);
    Ok(missed)
}

/// Own instructions per unit of the rows as 069ddb0 measured them (issue 27's start, the
/// same harness and toolchain, three decimals), by today's row names (069ddb0's
/// "direct send_now, mlx5 sim" is today's `&[u8]` row).
const AT_069DDB0: &[(&str, f64)] = &[
    ("stream, send_now, counting", 43.366),
    ("stream, batch 1, counting", 91.945),
    ("stream, batch 8, counting", 36.882),
    ("stream, batch 32, counting", 19.351),
    ("stream, send_now, softnic", 54.921),
    ("stream, batch 1, softnic", 112.398),
    ("stream, batch 8, softnic", 43.804),
    ("stream, batch 32, softnic", 24.304),
    ("poll per completion, counting", 7.699),
    ("stream, wr batch 32, counting", 46.952),
    ("stream, wr send_now, counting", 68.507),
    ("stream, wr batch 32, softnic", 57.343),
    ("stream, wr send_now, softnic", 78.929),
    ("poll ex per completion, counting", 24.980),
    ("direct send_now &[u8], mlx5 sim", 71.290),
    ("direct batch 32, mlx5 sim", 47.861),
    ("poll direct per completion, mlx5 sim", 34.394),
    ("ping-pong round trip, softnic", 350.375),
    ("lone post: direct vs libmlx5 post_send", 71.290),
    ("list 32: direct vs libmlx5 post_send", 47.861),
    ("lone post: direct vs libmlx5 ibv_wr_*", 71.290),
    ("list 32: direct vs libmlx5 ibv_wr_*", 47.861),
    ("lone post: floor vs libmlx5 post_send", 34.000),
    ("list 32: floor vs libmlx5 post_send", 20.594),
    ("completion: DirectPoller vs mlx5_poll_cq", 34.394),
    ("lone post: naive vs libmlx5 post_send", 94.000),
    ("lone post: SendRing vs post_send", 43.366),
    ("list 32: SendRing vs post_send", 19.351),
    ("lone post: WrRing vs ibv_wr_*", 64.749),
    ("list 32: WrRing vs ibv_wr_*", 45.241),
    ("completion: CqPoller vs mlx5_poll_cq", 7.699),
];

/// Rows (name, own instructions) against [`AT_069DDB0`]: how many of 069ddb0's rows are at
/// or under its figure, and the worse ones, described. Rows it did not have are skipped.
fn compare_069ddb0<'a>(rows: impl Iterator<Item = (&'a str, f64)>) -> (usize, Vec<String>) {
    let (mut at_or_under, mut worse) = (0, Vec::new());
    for (name, own) in rows {
        let Some(&(_, then)) = AT_069DDB0.iter().find(|(n, _)| *n == name) else {
            continue;
        };
        if own <= then + 0.0005 {
            at_or_under += 1;
        } else {
            worse.push(format!("{name} {then:.3} -> {own:.3}"));
        }
    }
    (at_or_under, worse)
}

/// The rows of `results` that 069ddb0 had, against it: "no row worse than 069ddb0's table"
/// is issue 27's; reported (to three decimals, the table rounds to one), not gating: a
/// zero-margin gate on rows a change elsewhere moves by register allocation would stop
/// unrelated work.
fn against_069ddb0(results: &[(&Row, PerUnit, PerUnit)]) {
    let (at_or_under, worse) = compare_069ddb0(results.iter().map(|(r, _, h)| (&*r.name, h.own)));
    if at_or_under + worse.len() > 0 {
        println!(
            "against 069ddb0 (own): {at_or_under} rows at or under, {} worse{}{}",
            worse.len(),
            if worse.is_empty() { "" } else { ": " },
            worse.join("; ")
        );
        println!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_compared_with_069ddb0_to_three_decimals() {
        let (ok, worse) = compare_069ddb0(
            [
                ("stream, send_now, counting", 43.3664),
                ("stream, batch 8, counting", 36.884),
                ("a row 069ddb0 did not have", 1e9),
            ]
            .into_iter(),
        );
        assert_eq!(ok, 1);
        assert_eq!(worse, ["stream, batch 8, counting 36.882 -> 36.884"]);
    }

    /// A small callgrind file in the shape `--dump-instr=no` writes: name compression,
    /// relative positions, inlined-file switches, a device that calls back into a `std`
    /// function which calls the device again, and a `std` function both sides call.
    const SYNTHETIC: &str = "\
# callgrind format
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir
summary: 1000

fl=(1) /work/benches/src/lib.rs
fn=(1) hotverbs_benches::hv_measured_stream_ring
10 100
+2 50
fi=(2) /work/datapath/src/send.rs
600 200
cfi=(3) /work/softnic/src/counting.rs
cfn=(2) hotverbs_softnic::counting::post_send
calls=10 421
* 400
fe=(1)
cfn=(3) core::ptr::copy_nonoverlapping
calls=5 0
-3 60
cfn=(5) <hotverbs_softnic::fabric::Qp as core::ops::Drop>::drop
calls=1 0
0 20

fl=(3)
fn=(2)
421 250
cfn=(4) std::sync::Once::call_once
calls=1 0
0 120
cfn=(3)
calls=2 0
0 30

fn=(4)
0 20
cfn=(6) hotverbs_softnic::counting::init::{{closure}}
calls=1 0
0 100

fn=(6)
0 100

fn=(3)
0 90

fn=(5)
0 20
totals: 1000
";

    #[test]
    fn attributes_synthetic_callgrind_file() {
        let s = attribute(SYNTHETIC, is_device).unwrap();
        assert_eq!(s.total, 1000);
        // Device: post_send (inclusive 400, including the callback through call_once and
        // its own copy) and the Drop impl (20), each counted once.
        assert_eq!(s.device, 420.0);
        assert_eq!(s.own(), 580.0);
    }

    #[test]
    fn a_function_only_the_device_calls_is_the_devices() {
        // `helper` is called only by the device; its call back into the device must not
        // count a second time.
        let f = "events: Ir\nsummary: 100\nfn=(1) ours\n0 10\ncfn=(2) hotverbs_softnic::x\ncalls=1 0\n0 90\nfn=(2)\n0 40\ncfn=(3) helper\ncalls=1 0\n0 50\nfn=(3)\n0 10\ncfn=(4) hotverbs_softnic::y\ncalls=1 0\n0 40\nfn=(4)\n0 40\n";
        let s = attribute(f, is_device).unwrap();
        assert_eq!((s.total, s.device), (100, 90.0));
    }

    #[test]
    fn shared_helpers_are_split_by_their_callers() {
        // `lock` is called by us (cost 30) and by the device (cost 10); it calls the device
        // (cost 8 in all): 3/4 of that is ours calling the device.
        let f = "events: Ir\nsummary: 100\nfn=(1) ours\n0 52\ncfn=(2) lock\ncalls=3 0\n0 30\ncfn=(3) hotverbs_softnic::dev\ncalls=1 0\n0 18\nfn=(3)\n0 8\ncfn=(2)\ncalls=1 0\n0 10\nfn=(2)\n0 32\ncfn=(4) hotverbs_softnic::cb\ncalls=4 0\n0 8\nfn=(4)\n0 8\n";
        let s = attribute(f, is_device).unwrap();
        assert_eq!(s.total, 100);
        assert!((s.device - (18.0 + 8.0 * 0.75)).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn positions_and_missing_costs() {
        // Two positions per cost line (`--dump-instr=yes`), an event list with Ir first,
        // a cost line without costs.
        let f = "positions: instr line\nevents: Ir Dr\nfn=(1) a\n0x10 5 7 1\n+4 +1 3\ncfn=(2) hotverbs_softnic::b\ncalls=1 0x20 9\n0x12 4 11 2\nfn=(2)\n0x20 9 11 0\n";
        let s = attribute(f, is_device).unwrap();
        // No summary line: the total is the sum of the self costs.
        assert_eq!((s.total, s.device), (7 + 3 + 11, 11.0));
        assert!(attribute("events: Dr Ir\n", is_device).is_err());
    }

    #[test]
    fn device_names() {
        assert!(is_device("hotverbs_softnic::counting::post_send"));
        assert!(is_device(
            "<hotverbs_softnic::fabric::Qp as core::ops::drop::Drop>::drop"
        ));
        assert!(!is_device("hotverbs_datapath::send::SendRing<128>::flush"));
        assert!(!is_device(
            "core::ptr::drop_in_place<hotverbs_softnic::fabric::Qp>"
        ));
    }

    #[test]
    fn per_unit_cancels_setup() {
        // setup 1_000_000 + 42 per message, of which 12 the device's
        let s = |n: u64| Split {
            total: 1_000_000 + 42 * n,
            device: 500.0 + 12.0 * n as f64,
        };
        let p = per_unit(s(1000), s(5000), 1000, 5000);
        assert_eq!((p.own, p.device, p.total), (30.0, 12.0, 42.0));
    }

    #[test]
    fn list_format_and_verdicts() {
        let rows = parse_list(
            "stream b32\tnaive\tring32\t0.5\t20\tmsg\npoll\tsingle\tbatch\t-\t-\tcompletion\n",
        )
        .unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].ratio, rows[0].own), (Some(0.5), Some(20.0)));
        assert_eq!((rows[1].ratio, rows[1].own), (None, None));
        assert_eq!(rows[1].unit, "completion");
        assert!(parse_list("a\tb\tc\t0.5\n").is_err());
        assert!(parse_list("a\tb\tc\tx\t-\tmsg\n").is_err());
        let u = |own: f64, device: f64| PerUnit {
            own,
            device,
            total: own + device,
        };
        let (_, _, m) = verdicts(&rows[0], u(100.0, 100.0), u(19.0, 20.0));
        assert!(m.is_empty(), "{m:?}");
        let (_, o, m) = verdicts(&rows[0], u(100.0, 100.0), u(21.0, 20.0));
        assert_eq!((o.as_str(), m.len()), ("<= 20 MISS", 1));
        let (r, _, m) = verdicts(&rows[0], u(20.0, 20.0), u(19.0, 20.0));
        assert_eq!((r.as_str(), m.len()), ("<= 0.50 MISS", 1));
        // A goal (`~`) is reported, never gated.
        let goal = parse_list("send_now\tnaive\tnow\t-\t~45\tmsg\n").unwrap();
        assert_eq!((goal[0].own, goal[0].own_goal), (Some(45.0), true));
        let (_, o, m) = verdicts(&goal[0], u(100.0, 100.0), u(50.0, 50.0));
        assert_eq!((o.as_str(), m.len()), ("<= 45 goal MISS", 0));
        let (_, o, _) = verdicts(&goal[0], u(100.0, 100.0), u(40.0, 50.0));
        assert_eq!(o, "<= 45 PASS");
    }

    #[test]
    fn options() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let o = parse(&s(&["--gate", "--n1", "10", "--n2", "20"])).unwrap();
        assert!(o.gate);
        assert_eq!((o.n1, o.n2), (10, 20));
        assert!(parse(&s(&["--n1", "20", "--n2", "10"])).is_err());
        assert!(parse(&s(&["--bogus"])).is_err());
    }
}
