//! `cargo xtask insn [--gate] [--filter S] [--n1 N] [--n2 N]`: instructions per message under
//! callgrind, hotverbs beside the baseline, as a table with ratios.
//!
//! The workloads live in `hotverbs-benches` (binary `insn-workload`, the same code the
//! criterion benches time). `insn-workload --list` prints the pairs, one per line:
//! `name<TAB>baseline<TAB>hotverbs<TAB>target` (target: the largest acceptable
//! hotverbs/baseline ratio, or `-`). Each workload runs twice under
//! `valgrind --tool=callgrind --toggle-collect=*hv_measured_*` (only the workloads'
//! `#[inline(never)] hv_measured_*` functions and their callees, provider code included,
//! are counted), with N1 and N2 messages; instructions per message are
//! `(total(N2) - total(N1)) / (N2 - N1)`, which also cancels per-call constants (warm-up,
//! the final drain). Instruction counts are deterministic, so the table is usable as a regression
//! gate: `--gate` exits non-zero when a pair misses its target.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::{self, cargo, root, show};

struct Opts {
    gate: bool,
    filter: Option<String>,
    n1: u64,
    n2: u64,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        gate: false,
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
                    "usage: cargo xtask insn [--gate] [--filter S] [--n1 N] [--n2 N]".into(),
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

/// One pair of the table.
struct Pair {
    name: String,
    baseline: String,
    hotverbs: String,
    target: Option<f64>,
}

fn parse_list(text: &str) -> Result<Vec<Pair>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            if f.len() != 4 {
                return Err(format!(
                    "bad workload line {l:?} (want 4 tab-separated fields)"
                ));
            }
            let target = match f[3] {
                "-" => None,
                t => Some(
                    t.parse::<f64>()
                        .map_err(|_| format!("bad target {t:?} in {l:?}"))?,
                ),
            };
            Ok(Pair {
                name: f[0].into(),
                baseline: f[1].into(),
                hotverbs: f[2].into(),
                target,
            })
        })
        .collect()
}

/// The `summary:` (or `totals:`) line of a callgrind output file: instructions executed.
fn callgrind_total(out: &str) -> Option<u64> {
    let mut total = None;
    for l in out.lines() {
        if let Some(v) = l
            .strip_prefix("summary:")
            .or_else(|| l.strip_prefix("totals:"))
        {
            total = v.split_whitespace().next().and_then(|n| n.parse().ok());
        }
    }
    total
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

fn instructions(bin: &Path, workload: &str, n: u64, scratch: &Path) -> Result<u64, String> {
    let out = scratch.join(format!("callgrind.{workload}.{n}"));
    let mut cmd = Command::new("valgrind");
    cmd.arg("--tool=callgrind")
        .arg(format!("--toggle-collect={MEASURED}"))
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
    callgrind_total(&text).ok_or_else(|| format!("no summary line in {}", out.display()))
}

fn per_message(t1: u64, t2: u64, n1: u64, n2: u64) -> f64 {
    (t2 as f64 - t1 as f64) / (n2 - n1) as f64
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
    let list = Command::new(&bin)
        .arg("--list")
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    if !list.status.success() {
        return Err(format!("{} --list failed ({})", bin.display(), list.status));
    }
    let mut pairs = parse_list(&String::from_utf8_lossy(&list.stdout))?;
    if let Some(f) = &o.filter {
        pairs.retain(|p| p.name.contains(f.as_str()));
    }
    if pairs.is_empty() {
        return Err("no workload matches the filter".into());
    }
    let scratch = target_dir().join("insn");
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;

    let mut cache: BTreeMap<String, f64> = BTreeMap::new();
    let mut measure = |w: &str| -> Result<f64, String> {
        if let Some(v) = cache.get(w) {
            return Ok(*v);
        }
        let t1 = instructions(&bin, w, o.n1, &scratch)?;
        let t2 = instructions(&bin, w, o.n2, &scratch)?;
        let v = per_message(t1, t2, o.n1, o.n2);
        cache.insert(w.to_string(), v);
        Ok(v)
    };
    let mut rows = Vec::new();
    for p in &pairs {
        let b = measure(&p.baseline)?;
        let h = measure(&p.hotverbs)?;
        rows.push((p, b, h));
    }

    println!();
    println!(
        "instructions per message (callgrind, {MEASURED} only, (I(N2) - I(N1)) / (N2 - N1), \
         N1 = {}, N2 = {})",
        o.n1, o.n2
    );
    println!(
        "| {:<34} | {:>14} | {:>17} | {:>6} | {:>13} |",
        "workload", "naive insn/msg", "hotverbs insn/msg", "ratio", "target"
    );
    println!(
        "|{:-<36}|{:->16}|{:->19}|{:->8}|{:->15}|",
        "", "", "", "", ""
    );
    let mut missed = Vec::new();
    for (p, b, h) in &rows {
        let ratio = if *b > 0.0 { h / b } else { f64::NAN };
        let verdict = match p.target {
            Some(t) if ratio <= t => format!("<= {t:.2} PASS"),
            Some(t) => {
                missed.push(format!("{}: {ratio:.2} > {t:.2}", p.name));
                format!("<= {t:.2} MISS")
            }
            None => "-".to_string(),
        };
        println!(
            "| {:<34} | {:>14.1} | {:>17.1} | {:>6.2} | {:>13} |",
            p.name, b, h, ratio, verdict
        );
    }
    println!();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_callgrind_summary() {
        let out = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 123456\n\nfn=main\n3 4\ntotals: 123456\n";
        assert_eq!(callgrind_total(out), Some(123456));
        assert_eq!(callgrind_total("events: Ir\n"), None);
    }

    #[test]
    fn per_message_cancels_setup() {
        // setup 1_000_000 + 42 per message
        let t = |n: u64| 1_000_000 + 42 * n;
        assert_eq!(per_message(t(1000), t(5000), 1000, 5000), 42.0);
    }

    #[test]
    fn list_format() {
        let p = parse_list("stream b32\tnaive\tring32\t0.5\npoll\tsingle\tbatch\t-\n").unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].target, Some(0.5));
        assert_eq!(p[1].target, None);
        assert!(parse_list("a\tb\n").is_err());
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
