//! The drift check: `rxe_faults.c`, the program that measured the rxe failure truth table
//! (`shared/rxe-vm/fault-truth.md`, scenarios S1..S22), built on the host, run in the guest,
//! and its output compared with the committed `xtask/rxe/rxe_faults.truth` once what
//! legitimately varies between runs is normalised away (see [`normalise`]). Any other
//! difference means rxe (a new Debian kernel, a new rdma-core) no longer behaves as the table
//! says, and the table, softnic and the datapath's assumptions need a look.
//!
//! The C file is not ours: it lives with the rxe-vm recipe, `../shared/rxe-vm/` next to the
//! repository (override: `HOTVERBS_RXE_VM_DIR`), and is compiled from there on every run.
//! `cargo xtask rxe --bless-faults` rewrites the truth file from the run's output.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::guest::Step;
use super::rel;
use crate::util;

/// Overrides the folder of the rxe-vm recipe (default `../shared/rxe-vm` from the repo).
pub(super) const RECIPE_ENV: &str = "HOTVERBS_RXE_VM_DIR";
/// The committed normalised output, relative to the workspace root.
pub(super) const TRUTH: &str = "xtask/rxe/rxe_faults.truth";
/// The step's name in the report.
pub(super) const STEP: &str = "rxe_faults drift";
/// Seconds the guest gives the program: its own budget (270 s before it skips the remaining
/// scenarios) plus the longest scenario timeout (60 s), plus slack.
const TIMEOUT: u32 = 400;

/// The rxe-vm recipe folder: `$HOTVERBS_RXE_VM_DIR`, else `../shared/rxe-vm` beside the
/// repository.
pub(super) fn recipe_dir() -> PathBuf {
    match std::env::var_os(RECIPE_ENV) {
        Some(dir) if !dir.is_empty() => dir.into(),
        _ => util::root().join("../shared/rxe-vm"),
    }
}

pub(super) fn truth_path() -> PathBuf {
    util::root().join(TRUTH)
}

/// The committed truth, read before the VM boots so that a missing file fails at once.
pub(super) fn read_truth() -> Result<String, String> {
    let path = truth_path();
    fs::read_to_string(&path).map_err(|e| {
        format!(
            "the rxe_faults drift check needs its truth file {}: {e}\n\
             (produce it from a VM run with `cargo xtask rxe --bless-faults`)",
            rel(&path).display()
        )
    })
}

/// Compiles `rxe_faults.c` into `<target>/rxe/rxe_faults` and returns the executable.
pub(super) fn build_faults(rxe_dir: &Path) -> Result<PathBuf, String> {
    let source = recipe_dir().join("rxe_faults.c");
    if !source.is_file() {
        return Err(format!(
            "the rxe_faults drift check needs {} (the rxe-vm recipe's fault probe; \
             set {RECIPE_ENV} to the folder holding rxe_faults.c)",
            source.display()
        ));
    }
    let exe = rxe_dir.join("rxe_faults");
    let mut cmd = Command::new("cc");
    cmd.args(["-O2", "-std=gnu11", "-o"])
        .arg(&exe)
        .arg(&source)
        .arg("-libverbs");
    util::run(&mut cmd).map_err(|e| {
        format!("building the rxe_faults drift probe failed: {e} (needs gcc and libibverbs-dev)")
    })?;
    Ok(exe)
}

/// The guest step; `truth` (normalised) is what its output must match, `None` when blessing.
pub(super) fn step(guest: String, truth: Option<String>) -> Step {
    Step {
        timeout: TIMEOUT,
        env: vec![("LD_LIBRARY_PATH".into(), "/host/lib".into())],
        truth,
        ..Step::program(STEP, vec![guest])
    }
}

// ---------------------------------------------------------------------------------------
// Normalising
// ---------------------------------------------------------------------------------------

/// The program's output with what varies between runs replaced by placeholders, one line per
/// output line (trailing blanks trimmed, blank lines dropped).
///
/// What varies, found by comparing the raw output of six boots (everything else was
/// identical, line for line):
/// - the kernel line: the harness boots Debian's *current* kernel, and a new release alone
///   is no drift (a behaviour change it brings shows up in the scenarios);
/// - measured times: `WC cqA +   66.2ms`, `+101.8ms: B posts`, `polled 412ms`,
///   `S3 end: exit 0, 2.1 s`, `total 66.9 s`. Times the program chose (`quiet window 200ms`,
///   `after 500ms without polling`, the `[12b] ... (40.96ms)` sub-case headers) are kept;
/// - QP numbers (`qpn=`, `qp_num=`, a non-zero `src_qp=`), lkeys and rkeys: rxe allocates
///   them from pools shared with everything that ran before in the same boot. Each distinct
///   value becomes `Q1`, `Q2`, ... (`K1`, ... for keys) in order of first appearance within
///   its scenario, so "the completion came from the QP created second" still compares;
/// - hardware counters that follow timing (see [`normalise_counters`]): the counters of
///   retransmission timers and the packet counts are dropped (whether they move at all in
///   a window varies), RNR NAK counts of unbounded RNR loops become `+n`. Event counts
///   (`rdma_sends`, `rdma_recvs`, `retry_exceeded_err`, `retry_rnr_exceeded_err`) stay
///   exact;
/// - the IPv4 header inside the UD GRH dump (`[18a]`): its identification field counts
///   packets and its checksum follows it; both become `....`.
///
/// The program prints no pointers, addresses or PIDs. Kept exactly: statuses, return codes,
/// errnos, bad_wr indices, wr_ids, opcodes, byte_lens, flags, states, event names,
/// capacities, buffer contents and everything else.
pub(super) fn normalise(output: &str) -> String {
    let mut out = String::new();
    let mut names = Names::default();
    for line in output.lines() {
        let line = line.trim_end();
        if line.trim().is_empty() {
            continue;
        }
        if scenario_of(line).is_some() && !line.contains(" end: ") {
            // A new scenario: its own QPN and key numbering.
            names = Names::default();
        }
        out.push_str(&normalise_line(line, &mut names));
        out.push('\n');
    }
    out
}

/// Per-scenario symbolic names for QP numbers and keys.
#[derive(Default)]
struct Names {
    qpns: Vec<String>,
    keys: Vec<String>,
}

impl Names {
    fn name(list: &mut Vec<String>, prefix: &str, value: &str) -> String {
        let i = list.iter().position(|v| v == value).unwrap_or_else(|| {
            list.push(value.to_string());
            list.len() - 1
        });
        format!("{prefix}{}", i + 1)
    }
}

fn normalise_line(line: &str, names: &mut Names) -> String {
    if line.starts_with("rxe_faults: kernel ") {
        return "rxe_faults: kernel <version>".into();
    }
    if line.starts_with("rxe_faults: total ") {
        return "rxe_faults: total <time>".into();
    }
    let mut s = line.to_string();
    // `===== S3 end: exit 0, 2.1 s`, `===== S3 end: KILLED by signal 9, 3.0 s`
    if scenario_of(&s).is_some() && s.contains(" end: ") && s.ends_with(" s") {
        if let Some(comma) = s.rfind(", ") {
            s.truncate(comma);
            s.push_str(", <time>");
        }
    }
    let s = replace_values(&s, names);
    let s = if s.trim_start().starts_with('[') {
        // A sub-case header: its times are the program's own parameters.
        s
    } else {
        replace_times(&s)
    };
    let s = normalise_counters(&s);
    mask_grh(&s)
}

/// Names whose values [`replace_values`] renames: QP numbers, then keys.
const QPN_KEYS: &[&str] = &["qpn=", "qp_num=", "src_qp="];
const MR_KEYS: &[&str] = &["lkey=", "rkey="];

/// `qpn=17` -> `qpn=Q1`, `lkey=0x66a` -> `lkey=K1` (`src_qp=0`, "none", stays).
fn replace_values(line: &str, names: &mut Names) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some((at, key)) = next_key(rest) {
        out.push_str(&rest[..at + key.len()]);
        rest = &rest[at + key.len()..];
        let len = rest
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        let value = &rest[..len];
        let renamed = if value.is_empty() || (key == "src_qp=" && value == "0") {
            value.to_string()
        } else if QPN_KEYS.contains(&key) {
            Names::name(&mut names.qpns, "Q", value)
        } else {
            Names::name(&mut names.keys, "K", value)
        };
        out.push_str(&renamed);
        rest = &rest[len..];
    }
    out.push_str(rest);
    out
}

/// The first whole-word `name=` of [`QPN_KEYS`] or [`MR_KEYS`] in `s`, with its offset.
fn next_key(s: &str) -> Option<(usize, &'static str)> {
    QPN_KEYS
        .iter()
        .chain(MR_KEYS)
        .filter_map(|&k| {
            let mut from = 0;
            while let Some(i) = s[from..].find(k) {
                let at = from + i;
                // Whole names only: `qpn=` must not match inside `dest_qpn=`.
                let before = s[..at].chars().next_back();
                if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Some((at, k));
                }
                from = at + k.len();
            }
            None
        })
        .min_by_key(|&(at, _)| at)
}

/// Measured times: `+   66.2ms` (after the post) -> `+<t>`, `polled 412ms` -> `polled <t>`.
fn replace_times(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    loop {
        let plus = rest.find('+');
        let polled = rest.find("polled ");
        let (at, skip) = match (plus, polled) {
            (Some(p), Some(q)) if q < p => (q, "polled ".len()),
            (Some(p), _) => (p, 1),
            (None, Some(q)) => (q, "polled ".len()),
            (None, None) => break,
        };
        let after = &rest[at + skip..];
        let number = after.trim_start_matches(' ');
        let digits = number
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(number.len());
        if digits > 0 && number[digits..].starts_with("ms") {
            out.push_str(&rest[..at + skip]);
            out.push_str("<t>");
            rest = &number[digits + 2..];
        } else {
            out.push_str(&rest[..at + skip]);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Counters a retransmission timer moves (an ACK timeout, and what a retransmitted request
/// X
/// `completer_retry_err=+1` in one boot, absent in the next).
const TIMING_COUNTERS: &[&str] = &[
    "completer_retry_err",
    "out_of_seq_request",
    "duplicate_request",
    "rcvd_seq_err",
    "ack_deferred",
];
/// RNR NAKs sent and received: exact while `rnr_retry` bounds them (the loop ends in
/// `retry_rnr_exceeded_err`), as many as fit in the wait otherwise (`rnr_retry=7` retries
/// until the peer posts a receive; seen: 116 vs 125 for a 1000 ms wait).
const RNR_COUNTERS: &[&str] = &["send_rnr_err", "rcvd_rnr_err"];
/// Packets, retransmitted ones included. Whether any moved in a window follows timing too:
/// a retransmission still in flight from the previous sub-case lands in the next one's
/// window (seen: sub-case `[22e]`'s baseline with `sent_pkts=+2` in one boot of six, absent in five).
const PACKET_COUNTERS: &[&str] = &["sent_pkts", "rcvd_pkts"];

/// A `HW counters delta:` line without what follows timing: [`TIMING_COUNTERS`] and
/// [`PACKET_COUNTERS`] go, [`RNR_COUNTERS`] become `+n` unless the RNR retries ran out.
/// The event counts (`rdma_sends`, `rdma_recvs`, `retry_exceeded_err`,
/// `retry_rnr_exceeded_err`) stay exact.
fn normalise_counters(line: &str) -> String {
    const LABEL: &str = "HW counters delta:";
    let Some(at) = line.find(LABEL) else {
        return line.to_string();
    };
    let (head, counts) = line.split_at(at + LABEL.len());
    let name = |word: &str| word.split_once('=').map_or(word, |(n, _)| n).to_string();
    let bounded_rnr = counts
        .split_whitespace()
        .any(|w| name(w) == "retry_rnr_exceeded_err");
    let words: Vec<String> = counts
        .split_whitespace()
        .filter(|w| {
            let n = name(w);
            !TIMING_COUNTERS.contains(&n.as_str()) && !PACKET_COUNTERS.contains(&n.as_str())
        })
        .map(|w| {
            let n = name(w);
            let varies = RNR_COUNTERS.contains(&n.as_str()) && !bounded_rnr;
            if varies && w.contains('=') {
                format!("{n}=+n")
            } else {
                w.to_string()
            }
        })
        .collect();
    if words.is_empty() {
        // Only counters that follow timing moved.
        format!("{head} (none)")
    } else {
        format!("{head} {}", words.join(" "))
    }
}

/// `... (GRH area): <80 hex digits>`: bytes 20..40 are the IPv4 header; its identification
/// (bytes 24-25) and checksum (30-31) differ per packet.
fn mask_grh(line: &str) -> String {
    const LABEL: &str = "(GRH area): ";
    let Some(at) = line.find(LABEL) else {
        return line.to_string();
    };
    let start = at + LABEL.len();
    let hex = &line[start..];
    if hex.len() < 64
        || !hex.is_char_boundary(64)
        || !hex[..64].bytes().all(|b| b.is_ascii_hexdigit())
    {
        return line.to_string();
    }
    let mut s = line.to_string();
    for byte in [24, 30] {
        let from = start + 2 * byte;
        s.replace_range(from..from + 4, "....");
    }
    s
}

/// A truth file: a comment saying what it is and where it came from, then the normalised
/// output of `raw`.
pub(super) fn truth_file(raw: &str) -> String {
    let kernel = raw
        .lines()
        .find_map(|l| l.strip_prefix("rxe_faults: kernel "))
        .unwrap_or("unknown");
    format!(
        "# The normalised output of rxe_faults.c (../shared/rxe-vm/, the probe behind\n\
         # fault-truth.md) on rxe0 in the `cargo xtask rxe` VM. Every `cargo xtask rxe` run\n\
         # compares its own against this file; xtask/src/rxe/faults.rs says what is\n\
         # normalised and why. Rewrite it with `cargo xtask rxe --bless-faults`.\n\
         # Written from a run on kernel {kernel}\n{}",
        normalise(raw)
    )
}

// ---------------------------------------------------------------------------------------
// Comparing
// ---------------------------------------------------------------------------------------

/// A scenario's lines (`S15`, or `start` for the lines before S1).
struct Section<'a> {
    name: String,
    /// How many lines of the whole text precede this section.
    offset: usize,
    lines: Vec<&'a str>,
}

/// The text's scenarios; comment lines (`# ...`) at the top of a truth file are skipped but
/// counted, so that line numbers stay the file's.
fn sections(text: &str) -> Vec<Section<'_>> {
    let comments = text.lines().take_while(|l| l.starts_with('#')).count();
    let mut out = vec![Section {
        name: "start".into(),
        offset: comments,
        lines: Vec::new(),
    }];
    for (index, line) in text.lines().enumerate().skip(comments) {
        if let Some(name) = scenario_of(line) {
            if out.last().is_some_and(|s| s.name != name) {
                out.push(Section {
                    name,
                    offset: index,
                    lines: Vec::new(),
                });
            }
        }
        out.last_mut().expect("never empty").lines.push(line);
    }
    out
}

/// `S15` for `===== S15: CQ overflow =====` (and `===== S15 end: ...`, `===== S15 SKIPPED`).
fn scenario_of(line: &str) -> Option<String> {
    let rest = line.strip_prefix("===== S")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    (!digits.is_empty()).then(|| format!("S{digits}"))
}

/// The differences between the truth and this run's normalised output, grouped by scenario
/// in the truth's order: (scenario, named differences).
pub(super) fn differences(truth: &str, now: &str) -> Vec<(String, Vec<String>)> {
    let (truth, now) = (sections(truth), sections(now));
    let mut out = Vec::new();
    for t in &truth {
        let diffs = match now.iter().find(|n| n.name == t.name) {
            Some(n) => diff_lines(&t.name, t.offset, &t.lines, &n.lines),
            None if t.lines.is_empty() => continue,
            None => vec![format!(
                "{}: in the truth ({} lines), missing now",
                t.name,
                t.lines.len()
            )],
        };
        if !diffs.is_empty() {
            out.push((t.name.clone(), diffs));
        }
    }
    for n in &now {
        if !truth.iter().any(|t| t.name == n.name) && !n.lines.is_empty() {
            out.push((
                n.name.clone(),
                vec![format!(
                    "{}: not in the truth ({} lines now, first '{}')",
                    n.name,
                    n.lines.len(),
                    n.lines[0]
                )],
            ));
        }
    }
    out
}

/// Completions of two CQs drained in one pass arrive in whichever order the device finished
/// them (S12 `[12e]` printed B's RECV before A's SEND in one boot of six): within each run of
/// consecutive `WC` lines, the lines are ordered by CQ name, stably, so each CQ keeps its
/// own completion order (which is meaningful) and only the interleaving across CQs (timing)
/// is dropped.
fn cq_order<'a>(lines: &[&'a str]) -> Vec<&'a str> {
    let cq = |l: &str| {
        l.trim_start()
            .strip_prefix("WC ")
            .map(|r| r.split_whitespace().next().unwrap_or("").to_string())
    };
    let mut out: Vec<&str> = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        if cq(lines[i]).is_none() {
            out.push(lines[i]);
            i += 1;
            continue;
        }
        let start = i;
        while i < lines.len() && cq(lines[i]).is_some() {
            i += 1;
        }
        let mut run: Vec<&str> = lines[start..i].to_vec();
        run.sort_by_key(|l| cq(l));
        out.extend(run);
    }
    out
}

/// Named differences of one scenario: a longest-common-subsequence alignment, with each run
/// of removed and added lines paired up as changes.
/// Line numbers are the truth file's (`offset` of its lines precede the scenario).
fn diff_lines(scenario: &str, offset: usize, truth: &[&str], now: &[&str]) -> Vec<String> {
    let (truth, now) = (cq_order(truth), cq_order(now));
    let (truth, now) = (&truth[..], &now[..]);
    let (n, m) = (truth.len(), now.len());
    // lcs[i][j]: common length of truth[i..] and now[j..].
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if truth[i] == now[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // Walk the alignment; a hunk is the removed (truth) and added (now) lines between two
    // common ones, paired up in order.
    let mut out = Vec::new();
    let mut hunk = |gone: &[usize], added: &[usize], next: usize| {
        for k in 0..gone.len().max(added.len()) {
            out.push(match (gone.get(k), added.get(k)) {
                (Some(&g), Some(&a)) => format!(
                    "{} line {}: truth '{}', now '{}'",
                    place(scenario, truth, g),
                    offset + g + 1,
                    truth[g],
                    now[a]
                ),
                (Some(&g), None) => format!(
                    "{} line {}: truth '{}', now missing",
                    place(scenario, truth, g),
                    offset + g + 1,
                    truth[g]
                ),
                (None, Some(&a)) => format!(
                    "{} after line {}: now '{}', not in the truth",
                    place(scenario, truth, next.saturating_sub(1)),
                    offset + next,
                    now[a]
                ),
                (None, None) => unreachable!("k < the longer list's length"),
            });
        }
    };
    let (mut i, mut j) = (0, 0);
    let (mut gone, mut added) = (Vec::new(), Vec::new());
    while i < n || j < m {
        if i < n && j < m && truth[i] == now[j] {
            hunk(&gone, &added, i);
            gone.clear();
            added.clear();
            i += 1;
            j += 1;
        } else if j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j]) {
            added.push(j);
            j += 1;
        } else {
            gone.push(i);
            i += 1;
        }
    }
    hunk(&gone, &added, i);
    out
}

/// `S15` or `S15 [15b]`: the scenario and the sub-case (`  [15b] ...` header) line `index`
/// of the truth is in.
fn place(scenario: &str, truth: &[&str], index: usize) -> String {
    let upto = truth.len().min(index + 1);
    let case = truth[..upto].iter().rev().find_map(|l| {
        let rest = l.strip_prefix("  [")?;
        Some(&rest[..rest.find(']')?])
    });
    match case {
        Some(c) => format!("{scenario} [{c}]"),
        None => scenario.to_string(),
    }
}

/// The report of a drift: a heading and the differences, grouped by scenario.
pub(super) fn describe(diffs: &[(String, Vec<String>)]) -> String {
    let total: usize = diffs.iter().map(|(_, d)| d.len()).sum();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{total} difference(s) from {TRUTH} (line numbers are that file's) in {}:",
        diffs
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (name, lines) in diffs {
        let _ = writeln!(s, "  {name}:");
        for line in lines {
            let _ = writeln!(s, "    {line}");
        }
    }
    s
}

/// The line a run without drift reports: how many scenarios ran and how they ended.
pub(super) fn matched(raw: &str, normalised: &str) -> String {
    let ends: Vec<&str> = raw
        .lines()
        .filter(|l| scenario_of(l).is_some() && l.contains(" end: "))
        .collect();
    let clean = ends.iter().filter(|l| l.contains(" end: exit 0,")).count();
    let mut s = format!(
        "{} scenarios ran, {clean} exited 0; the normalised output ({} lines) equals {TRUTH}",
        ends.len(),
        normalised.lines().count()
    );
    for l in ends.iter().filter(|l| !l.contains(" end: exit 0,")) {
        let _ = write!(s, "; {}", l.trim_start_matches("===== "));
    }
    s
}

/// The one-line verdict of a drift.
pub(super) fn summary(diffs: &[(String, Vec<String>)]) -> String {
    let total: usize = diffs.iter().map(|(_, d)| d.len()).sum();
    format!(
        "{total} difference(s) from {TRUTH} in {}",
        diffs
            .iter()
            .map(|(n, d)| format!("{n} ({})", d.len()))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raw output of two boots, trimmed from real runs: what differs between them is what
    /// the normaliser must absorb.
    const BOOT_1: &str = "\
rxe_faults: kernel 6.1.0-56-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.192-2 (2026-11-16)

===== S1: post_send in RESET / INIT / RTR =====
  [setup] hw_counters: 16 files
  [setup] amr lkey=0x66a rkey=0x66a, bmr lkey=0x71e rkey=0x71e (each 131072 bytes)
    create_qp A RC qpn=21 req(swr=16 rwr=16 ssge=4 rsge=4 inl=0) -> cap(swr=16 rwr=16 ssge=4 rsge=4 inl=64)
    create_qp B RC qpn=22 req(swr=16 rwr=16 ssge=4 rsge=4 inl=0) -> cap(swr=16 rwr=16 ssge=4 rsge=4 inl=64)
  [1a] A in RESET: post_send SEND signaled wr_id=11
    post_send A SEND wr_id=11: ret=22(Invalid argument) errno=22 bad_wr=NULL
    (drain: 0 completion(s); polled 200ms, quiet window 200ms)
    WC cqA    +     1.1ms wr_id=11 status=0(success) opcode=0(SEND) byte_len=32 wc_flags=0x0 vendor_err=0x0 qp_num=21 src_qp=0 pkey_index=0
    WC cqB    +   211.6ms wr_id=1000 status=0(success) opcode=128(RECV) byte_len=32 wc_flags=0x1 vendor_err=0x0 qp_num=22 src_qp=21 pkey_index=0
    (drain: 2 completion(s); polled 207ms, quiet window 200ms)
    HW counters delta: rdma_recvs=+4 rcvd_pkts=+8 sent_pkts=+8 rdma_sends=+4
===== S1 end: exit 0, 1.4 s

===== S12: RNR =====
  [12b] A rnr_retry=3, B min_rnr_timer=24 (40.96ms): expect >= ~123ms
    pairb: Ab(qpn=128) <-> Bb(qpn=129) connected, RTS
    +101.8ms: B posts a receive now
    HW counters delta: rdma_recvs=+1 completer_retry_err=+3 send_rnr_err=+116 rcvd_pkts=+234 sent_pkts=+234 rcvd_rnr_err=+116 rdma_sends=+1
    A qpn=174. B slot0 first 40 bytes (GRH area): 000000000000000000000000000000000000000045000098d5234000401100000a4d00010a4d0001
      after 500ms without polling:
    HW counters delta: rdma_sends=+1
===== S12 end: exit 0, 7.4 s

rxe_faults: total 66.9 s
";

    const BOOT_2: &str = "\
rxe_faults: kernel 6.1.0-57-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.199-1 (2027-01-02)

===== S1: post_send in RESET / INIT / RTR =====
  [setup] hw_counters: 16 files
  [setup] amr lkey=0x81f rkey=0x81f, bmr lkey=0x9a8 rkey=0x9a8 (each 131072 bytes)
    create_qp A RC qpn=340 req(swr=16 rwr=16 ssge=4 rsge=4 inl=0) -> cap(swr=16 rwr=16 ssge=4 rsge=4 inl=64)
    create_qp B RC qpn=341 req(swr=16 rwr=16 ssge=4 rsge=4 inl=0) -> cap(swr=16 rwr=16 ssge=4 rsge=4 inl=64)
  [1a] A in RESET: post_send SEND signaled wr_id=11
    post_send A SEND wr_id=11: ret=22(Invalid argument) errno=22 bad_wr=NULL
    (drain: 0 completion(s); polled 201ms, quiet window 200ms)
    WC cqA    +    12.0ms wr_id=11 status=0(success) opcode=0(SEND) byte_len=32 wc_flags=0x0 vendor_err=0x0 qp_num=340 src_qp=0 pkey_index=0
    WC cqB    +    13.9ms wr_id=1000 status=0(success) opcode=128(RECV) byte_len=32 wc_flags=0x1 vendor_err=0x0 qp_num=341 src_qp=340 pkey_index=0
    (drain: 2 completion(s); polled 214ms, quiet window 200ms)
    HW counters delta: rdma_recvs=+4 rcvd_pkts=+8 sent_pkts=+8 rdma_sends=+4
===== S1 end: exit 0, 2.9 s

===== S12: RNR =====
  [12b] A rnr_retry=3, B min_rnr_timer=24 (40.96ms): expect >= ~123ms
    pairb: Ab(qpn=12) <-> Bb(qpn=13) connected, RTS
    +100.3ms: B posts a receive now
    HW counters delta: rdma_recvs=+1 send_rnr_err=+125 rcvd_pkts=+252 sent_pkts=+252 rcvd_rnr_err=+125 rdma_sends=+1
    A qpn=14. B slot0 first 40 bytes (GRH area): 0000000000000000000000000000000000000000450000985e294000401100000a4d00010a4d0001
      after 500ms without polling:
    HW counters delta: completer_retry_err=+1 sent_pkts=+2 rdma_sends=+1
===== S12 end: exit 0, 9.0 s

rxe_faults: total 71.5 s
";

    #[test]
    fn normalising_absorbs_what_varies_between_boots() {
        let (one, two) = (normalise(BOOT_1), normalise(BOOT_2));
        assert_eq!(one, two);
        assert!(differences(&one, &two).is_empty());
        let lines: Vec<&str> = one.lines().collect();
        // Kernel and times go; blank lines go.
        assert_eq!(lines[0], "rxe_faults: kernel <version>");
        assert_eq!(lines[1], "===== S1: post_send in RESET / INIT / RTR =====");
        assert_eq!(lines.last(), Some(&"rxe_faults: total <time>"));
        assert!(lines.contains(&"===== S1 end: exit 0, <time>"));
        assert!(lines.contains(&"    (drain: 2 completion(s); polled <t>, quiet window 200ms)"));
        // QP numbers and keys become names in order of appearance, per scenario.
        assert!(lines
            .contains(&"  [setup] amr lkey=K1 rkey=K1, bmr lkey=K2 rkey=K2 (each 131072 bytes)"));
        assert!(lines.contains(
            &"    WC cqB    +<t> wr_id=1000 status=0(success) opcode=128(RECV) byte_len=32 \
              wc_flags=0x1 vendor_err=0x0 qp_num=Q2 src_qp=Q1 pkey_index=0"
        ));
        assert!(lines.contains(&"    pairb: Ab(qpn=Q1) <-> Bb(qpn=Q2) connected, RTS"));
        assert!(lines.contains(&"    +<t>: B posts a receive now"));
        // The program's own durations stay.
        assert!(lines
            .contains(&"  [12b] A rnr_retry=3, B min_rnr_timer=24 (40.96ms): expect >= ~123ms"));
        assert!(lines.contains(&"      after 500ms without polling:"));
        // Retransmission counts go, event counts stay; lines without retransmissions stay.
        assert!(lines.contains(
            &"    HW counters delta: rdma_recvs=+1 send_rnr_err=+n rcvd_rnr_err=+n rdma_sends=+1"
        ));
        assert!(lines.contains(&"    HW counters delta: rdma_recvs=+4 rdma_sends=+4"));
        assert!(lines.contains(
            &"    A qpn=Q3. B slot0 first 40 bytes (GRH area): 0000000000000000000000000000000000000000\
              45000098....40004011....0a4d00010a4d0001"
        ));
    }

    #[test]
    fn normalising_keeps_what_matters() {
        let names = &mut Names::default();
        // Statuses, errnos, bad_wr, opcodes, byte_len, flags and states are untouched.
        for line in [
            "    post_send A2 chain of 2: ret=12(Cannot allocate memory) errno=0 bad_wr=idx 1 (wr_id=361)",
            "    STATE A2(qpn) query_qp ret=0 qp_state=ERR cur_qp_state=RESET [cached ibv_qp.state=ERR]",
            "    ASYNC CQ error(0) cq=cqAs",
            "    create_ah(sgid_index=200): FAILED errno=61(No data available)",
            "    max_send_wr req=4 create-cap=4 query-cap=7: chain of 70 -> ret=12(Cannot allocate memory) bad_wr idx=7 => usable SQ slots=7",
            "  [9a] RDMA_WRITE 64B with bad rkey 0xdead00 (B has 1 recv posted, A has 1 recv posted)",
            "    C+2=6 +5 =+1",
            "===== S3 SKIPPED: global time budget exhausted",
            "  !!! S3 TIMEOUT after 30s: child killed",
        ] {
            assert_eq!(normalise_line(line, names), line);
        }
        // A QP number that comes back is the same name; `dest_qpn=` is not `qpn=`.
        let names = &mut Names::default();
        assert_eq!(
            normalise_line(
                "qpn=7 qp_num=9 src_qp=7 dest_qpn=9 lkey=0x10 rkey=0x10",
                names
            ),
            "qpn=Q1 qp_num=Q2 src_qp=Q1 dest_qpn=9 lkey=K1 rkey=K1"
        );
        // RNR NAKs bounded by rnr_retry stay exact; timer-driven and packet counters go.
        assert_eq!(
            normalise_counters(
                "    HW counters delta: completer_retry_err=+1 retry_rnr_exceeded_err=+1 \
                 send_rnr_err=+4 rcvd_pkts=+8 sent_pkts=+8 rcvd_rnr_err=+4 rdma_sends=+1"
            ),
            "    HW counters delta: retry_rnr_exceeded_err=+1 send_rnr_err=+4 rcvd_rnr_err=+4 \
             rdma_sends=+1"
        );
        assert_eq!(
            normalise_counters("    HW counters delta: completer_retry_err=+2"),
            "    HW counters delta: (none)"
        );
        assert_eq!(
            normalise_counters("    HW counters delta: (none)"),
            "    HW counters delta: (none)"
        );
        assert_eq!(
            normalise_counters("    HW counters delta: retry_exceeded_err=+1 sent_pkts=+3"),
            "    HW counters delta: retry_exceeded_err=+1"
        );
        // A different outcome stays different.
        assert_ne!(
            normalise(
                "    WC cqA +  1.0ms wr_id=5 status=5(Work Request Flushed Error) opcode=0(SEND)\n"
            ),
            normalise("    WC cqA +  1.0ms wr_id=5 status=0(success) opcode=0(SEND)\n")
        );
        // A scenario that ends killed keeps how it ended.
        assert_eq!(
            normalise("===== S22 end: KILLED by signal 9, 3.0 s\n"),
            "===== S22 end: KILLED by signal 9, <time>\n"
        );
    }

    #[test]
    fn completions_of_two_cqs_in_one_drain_compare_in_any_interleaving() {
        let truth = "===== S12: x =====\n  [12e] y\n    WC cqAe   +<t> wr_id=120\n    WC cqBe   +<t> wr_id=1000\n    (drain: 2)\n";
        let swapped = "===== S12: x =====\n  [12e] y\n    WC cqBe   +<t> wr_id=1000\n    WC cqAe   +<t> wr_id=120\n    (drain: 2)\n";
        assert!(differences(truth, swapped).is_empty());
        // One CQ's own order still counts.
        let t2 = "===== S12: x =====\n    WC cqAe   +<t> wr_id=1\n    WC cqAe   +<t> wr_id=2\n";
        let n2 = "===== S12: x =====\n    WC cqAe   +<t> wr_id=2\n    WC cqAe   +<t> wr_id=1\n";
        assert!(!differences(t2, n2).is_empty());
        // A changed completion still counts.
        let changed = swapped.replace("wr_id=1000", "wr_id=1001");
        assert!(!differences(truth, &changed).is_empty());
    }

    #[test]
    fn differences_are_named_and_grouped_by_scenario() {
        let truth = "\
rxe_faults: kernel <version>
===== S1: post before RTS =====
  [1a] A in RESET
    post_send A: ret=22(Invalid argument) errno=22 bad_wr=NULL
    (drain: 0 completion(s))
  [1b] A in INIT
    post_send A: ret=22(Invalid argument) errno=22 bad_wr=NULL
===== S1 end: exit 0, <time>
===== S2: post_recv =====
    post_recv A: ret=22(Invalid argument) errno=0 bad_wr=NULL
===== S2 end: exit 0, <time>
===== S3: SQ depth =====
    usable SQ slots=7
===== S3 end: exit 0, <time>
";
        assert!(differences(truth, truth).is_empty());
        // Comment lines at the top of a truth file do not compare but count as lines.
        let commented = format!("# one\n# two\n{truth}");
        assert!(differences(&commented, truth).is_empty());
        assert_eq!(
            differences(&commented, &truth.replace("slots=7", "slots=8"))[0].1,
            ["S3 line 15: truth '    usable SQ slots=7', now '    usable SQ slots=8'"]
        );
        assert_eq!(
            matched(
                "===== S1: x =====\n===== S1 end: exit 0, 1.4 s\n===== S2: y =====\n\
                 ===== S2 end: KILLED by signal 9, 3.0 s\n",
                "a\nb\n"
            ),
            "2 scenarios ran, 1 exited 0; the normalised output (2 lines) equals \
             xtask/rxe/rxe_faults.truth; S2 end: KILLED by signal 9, 3.0 s"
        );
        assert!(truth_file("rxe_faults: kernel 6.1.0-56-amd64 #1 SMP\n")
            .ends_with("# Written from a run on kernel 6.1.0-56-amd64 #1 SMP\nrxe_faults: kernel <version>\n"));
        let now = "\
rxe_faults: kernel <version>
===== S1: post before RTS =====
  [1a] A in RESET
    post_send A: ret=22(Invalid argument) errno=22 bad_wr=NULL
    (drain: 0 completion(s))
  [1b] A in INIT
    post_send A: ret=0(ok) errno=0 bad_wr=NULL
    WC cqA +<t> wr_id=12 status=0(success)
===== S1 end: exit 0, <time>
===== S2: post_recv =====
===== S2 end: exit 0, <time>
===== S4: new =====
===== S4 end: exit 0, <time>
";
        let diffs = differences(truth, now);
        assert_eq!(
            diffs,
            [
                (
                    "S1".to_string(),
                    vec![
                        "S1 [1b] line 7: truth '    post_send A: ret=22(Invalid argument) \
                         errno=22 bad_wr=NULL', now '    post_send A: ret=0(ok) errno=0 bad_wr=NULL'"
                            .to_string(),
                        "S1 [1b] after line 7: now '    WC cqA +<t> wr_id=12 status=0(success)', \
                         not in the truth"
                            .to_string(),
                    ]
                ),
                (
                    "S2".to_string(),
                    vec![
                        "S2 line 10: truth '    post_recv A: ret=22(Invalid argument) errno=0 \
                         bad_wr=NULL', now missing"
                            .to_string()
                    ]
                ),
                (
                    "S3".to_string(),
                    vec!["S3: in the truth (3 lines), missing now".to_string()]
                ),
                (
                    "S4".to_string(),
                    vec![
                        "S4: not in the truth (2 lines now, first '===== S4: new =====')"
                            .to_string()
                    ]
                ),
            ]
        );
        assert_eq!(
            summary(&diffs),
            "5 difference(s) from xtask/rxe/rxe_faults.truth in S1 (2), S2 (1), S3 (1), S4 (1)"
        );
        let text = describe(&diffs);
        assert!(text.starts_with(
            "5 difference(s) from xtask/rxe/rxe_faults.truth (line numbers are that file's) \
             in S1, S2, S3, S4:\n  S1:\n    S1 [1b] line 7: "
        ));
        // A changed header line of the program (a new rxe_faults.c) is a difference too.
        let renamed = truth.replace("===== S2: post_recv", "===== S2: post_recv by state");
        assert_eq!(
            differences(truth, &renamed),
            [(
                "S2".to_string(),
                vec!["S2 line 9: truth '===== S2: post_recv =====', now '===== S2: post_recv by state ====='".to_string()]
            )]
        );
    }
}
