//! Results: the guest's records read back, each step judged and printed, libtest's counts
//! summed, perf figures compared with perftest's, and what went wrong with the VM itself.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::Duration;

use super::faults;
use super::guest::{sh_words, Step};
use super::vm::VmEnd;
use super::{rel, REAP_WAIT, SERVER_GRACE};

/// What went wrong with the VM itself: QEMU, the timeout, rxe0 setup, the run script.
pub(super) fn guest_problems(
    vm: &Result<VmEnd, String>,
    timeout: Duration,
    out: &Path,
) -> Vec<String> {
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

/// What one program left in its record folder.
#[derive(Debug, Default)]
pub(super) struct Record {
    pub(super) rc: Option<i32>,
    /// A server that outlived its client and was killed.
    killed: bool,
    /// A client that was not run, and why (its server never listened).
    not_run: Option<String>,
    seconds: Option<f64>,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

pub(super) fn read_record(dir: &Path) -> Record {
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
pub(super) struct TestCounts {
    pub(super) passed: u64,
    pub(super) failed: u64,
    pub(super) ignored: u64,
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
        } else if line.starts_with(DIFFERENTIAL) && !line.starts_with("differential: seed ") {
            // real_device_differential's own summary (seeds, steps, differences) and each
            // difference's first line, written past libtest's capture so that a passing run
            // shows it too (the per-seed timings stay in the step's output).
            lines.push(line.trim());
        }
    }
    (lines, total)
}

/// The prefix of the differential test's summary lines.
const DIFFERENTIAL: &str = "differential: ";

#[derive(Default)]
pub(super) struct Report {
    /// One line per step for the summary.
    pub(super) lines: Vec<String>,
    /// The test binaries' libtest summary lines.
    pub(super) summaries: Vec<String>,
    pub(super) tests: TestCounts,
    pub(super) problems: Vec<String>,
}

/// Prints every step's record under a header and judges it.
pub(super) fn report_steps(steps: &[Step], out: &Path) -> Report {
    let mut report = Report::default();
    for (i, step) in steps.iter().enumerate() {
        let dir = out.join(step.dir(i));
        let client = read_record(&dir);
        let server = step
            .server
            .as_ref()
            .map(|_| read_record(&dir.join("server")));
        let mut verdict = verdict(step, &client, server.as_ref());
        let mut drift = None;
        let mut matched = None;
        if let (Ok(()), Some(truth)) = (&verdict, &step.truth) {
            let now = faults::normalise(&client.stdout);
            // Beside the raw output, for a look or for accepting it as the new truth.
            let _ = fs::write(dir.join("normalised"), &now);
            let diffs = faults::differences(truth, &now);
            if diffs.is_empty() {
                matched = Some(faults::matched(&client.stdout, &now));
            } else {
                verdict = Err(faults::summary(&diffs));
                drift = Some(diffs);
            }
        }
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
        if step.truth.is_some() {
            // Some 1800 lines: the drift below says what matters, the record keeps them all.
            let (lines, dir) = (client.stdout.lines().count(), step.dir(i));
            println!(
                "---- stdout: {lines} lines in out/{dir}/stdout (normalised: out/{dir}/normalised)"
            );
        } else {
            print_output("stdout", &client.stdout);
        }
        print_output("stderr", &client.stderr);
        if let Some(server) = &server {
            print_output("server stdout", &server.stdout);
            print_output("server stderr", &server.stderr);
        }
        if let Some(diffs) = &drift {
            print_output("drift", &faults::describe(diffs));
        }
        if let Some(line) = &matched {
            println!("---- drift: none\n{line}");
            report.summaries.push(format!("{}: {line}", step.name));
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
        if let Some(diffs) = &drift {
            // Named, so the final error says what drifted without scrolling back.
            const SHOWN: usize = 30;
            let named: Vec<&String> = diffs.iter().flat_map(|(_, d)| d).collect();
            report.problems.extend(
                named
                    .iter()
                    .take(SHOWN)
                    .map(|d| format!("{}: {d}", step.name)),
            );
            if named.len() > SHOWN {
                report.problems.push(format!(
                    "{}: ... and {} more difference(s) (see its section above)",
                    step.name,
                    named.len() - SHOWN
                ));
            }
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

/// Figures compared between perftest and hotverbs-perf: (label, perftest column prefix,
/// ours, whether higher is better). Latency: perftest's "t_typical" is its median.
/// perftest's "MB/sec" is 2^20 bytes a second, like our MiB/s.
const COMPARED_COLUMNS: &[(&str, &str, &str, bool)] = &[
    ("p50 [usec]", "t_typical", "t_p50[", false),
    ("p99 [usec]", "99% percentile", "t_p99[", false),
    ("BW [MiB/s]", "BW average", "BW average", true),
    ("rate [Mpps]", "MsgRate", "MsgRate", true),
];

/// The value of the first column of `row` starting with `prefix`, when it is a number
/// (perftest prints `inf` when it could not read the CPU's frequency, as under TCG it
/// sometimes cannot).
fn column(row: &BTreeMap<String, f64>, prefix: &str) -> Option<f64> {
    row.iter()
        .find(|(c, _)| c.starts_with(prefix))
        .map(|(_, v)| *v)
        .filter(|v| v.is_finite())
}

/// The median of `v` (the mean of the middle two for an even count).
pub(super) fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// A figure with at least three significant digits (message rates are around 0.01 Mpps).
fn figure(x: f64) -> String {
    if x != 0.0 && x.abs() < 1.0 {
        format!("{x:.4}")
    } else {
        format!("{x:.2}")
    }
}

fn figures(v: &[Option<f64>]) -> String {
    v.iter()
        .map(|x| x.map_or_else(|| "-".to_string(), figure))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One line per figure both tools report for a row, from every run of each: the figures in
/// run order, their medians and the ratio of the medians, oriented so that above 1 means
/// hotverbs-perf is slower (hotverbs / perftest for latency, perftest / hotverbs for
/// bandwidth and message rate).
pub(super) fn compare_row(name: &str, perftest: &[String], hotverbs: &[String]) -> Vec<String> {
    let (theirs, ours): (Vec<_>, Vec<_>) = (
        perftest.iter().map(|t| perf_row(t)).collect(),
        hotverbs.iter().map(|t| perf_row(t)).collect(),
    );
    COMPARED_COLUMNS
        .iter()
        .filter_map(|&(label, theirs_prefix, ours_prefix, higher_is_better)| {
            let t: Vec<Option<f64>> = theirs.iter().map(|r| column(r, theirs_prefix)).collect();
            let o: Vec<Option<f64>> = ours.iter().map(|r| column(r, ours_prefix)).collect();
            let (tm, om) = (
                median(&t.iter().flatten().copied().collect::<Vec<_>>())?,
                median(&o.iter().flatten().copied().collect::<Vec<_>>())?,
            );
            let (slow, fast) = if higher_is_better { (tm, om) } else { (om, tm) };
            let ratio = if fast > 0.0 {
                format!("{:.2}", slow / fast)
            } else {
                "-".into()
            };
            Some(format!(
                "{name} {label}: hotverbs {} (median {}) vs perftest {} (median {}): ratio \
                 {ratio}",
                figures(&o),
                figure(om),
                figures(&t),
                figure(tm)
            ))
        })
        .collect()
}

/// [`compare_row`] for every (name, perftest outputs, hotverbs outputs).
pub(super) fn compare_rows(rows: &[(&str, Vec<String>, Vec<String>)]) -> Vec<String> {
    rows.iter()
        .flat_map(|(name, perftest, hotverbs)| compare_row(name, perftest, hotverbs))
        .collect()
}

/// What `counted` (xtask/rxe/lib.sh) printed.
const COUNTERS: &str = "kernel counters during the run";

/// For each (name, outputs of its runs): the p50 of every run and its median, and the
/// kernel counters each run printed.
pub(super) fn probe_lines(probes: &[(&str, Vec<String>)]) -> Vec<String> {
    let mut lines = Vec::new();
    for (name, runs) in probes {
        let p50: Vec<Option<f64>> = runs
            .iter()
            .map(|r| {
                let row = perf_row(r);
                column(&row, "t_p50[").or_else(|| column(&row, "t_typical"))
            })
            .collect();
        let med = median(&p50.iter().flatten().copied().collect::<Vec<_>>());
        lines.push(format!(
            "{name}: p50 [usec] {} (median {})",
            figures(&p50),
            med.map_or_else(|| "-".into(), figure)
        ));
        for (i, run) in runs.iter().enumerate() {
            if let Some(c) = run.lines().find(|l| l.starts_with(COUNTERS)) {
                lines.push(format!("  #{}: {c}", i + 1));
            }
        }
    }
    lines
}

pub(super) fn print_console_tail(log: &Path, lines: usize) {
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
pub(super) fn print_kernel_warnings(dmesg: &Path) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_summaries_are_parsed_and_summed() {
        let out = "running 4 tests\ntest a ... ok\n\
                   test result: FAILED. 2 passed; 1 failed; 1 ignored; 0 measured; 3 filtered out; finished in 0.52s\n\
                   \n  test result: ok. 5 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 1.00s\n\
                   test result of something else\n\
                   differential: seed 3: 1443 lines, softnic 0.8 s, rxe0 0.9 s\n\
                   differential: 25 seeds, 3750 steps, 0 difference(s)\n";
        let (lines, total) = test_summaries(out);
        assert_eq!(lines.len(), 3);
        assert!(lines[2].starts_with("differential: 25 seeds"));
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
    fn perf_reports_compare_side_by_side() {
        let perftest = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 2       1000          13.41          336.18       16.15    \t       19.22       \t22.67  \t\t181.27  \t\t336.18 \n-----\n";
        let row = perf_row(perftest);
        assert_eq!(row.get("t_typical[usec]"), Some(&16.15));
        assert_eq!(row.get("99% percentile[usec]"), Some(&181.27));
        assert_eq!(row.get("99.9% percentile[usec]"), Some(&336.18));
        let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 65536      1000             120.50             118.25               0.001892\n";
        assert_eq!(perf_row(bw).get("BW average[MB/sec]"), Some(&118.25));
        let ours = |p50: f64| {
            format!("#bytes #iterations t_min[usec] t_p50[usec] t_p99[usec] t_p99.9[usec]\n2 1000 1.0 {p50} 20.0 90.0\n")
        };
        let runs = [ours(8.1), ours(8.0), ours(f64::INFINITY)];
        let theirs = [
            perftest.to_string(),
            perftest.to_string(),
            perftest.to_string(),
        ];
        assert_eq!(
            compare_row("send_lat", &theirs, &runs),
            [
                "send_lat p50 [usec]: hotverbs 8.10 8.00 - (median 8.05) vs perftest 16.15 \
                 16.15 16.15 (median 16.15): ratio 0.50",
                "send_lat p99 [usec]: hotverbs 20.00 20.00 20.00 (median 20.00) vs perftest 181.27 \
                 181.27 181.27 (median 181.27): ratio 0.11"
            ]
        );
        // Bandwidth: perftest / hotverbs, so that above 1 still means hotverbs is slower.
        let bw = |mib: f64, mpps: f64| {
            format!(" #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n 64 1000 3.0 {mib} {mpps}\n")
        };
        let ours_bw = |mib: f64, mpps: f64| {
            format!("#bytes #iterations BW average[MiB/sec] BW[Gb/sec] MsgRate[Mpps]\n64 1000 {mib} 0.1 {mpps}\n")
        };
        assert_eq!(
            compare_row("bw", &[bw(2.0, 0.03)], &[ours_bw(1.0, 0.015)]),
            [
                "bw BW [MiB/s]: hotverbs 1.00 (median 1.00) vs perftest 2.00 (median 2.00): ratio 2.00",
                "bw rate [Mpps]: hotverbs 0.0150 (median 0.0150) vs perftest 0.0300 (median 0.0300): ratio 2.00"
            ]
        );
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[]), None);
        let probe = format!("{}{COUNTERS} (HZ 250): tasklet +5\n", ours(4000.0));
        assert_eq!(
            probe_lines(&[("lb", vec![probe])]),
            [
                "lb: p50 [usec] 4000.00 (median 4000.00)",
                "  #1: kernel counters during the run (HZ 250): tasklet +5"
            ]
        );
        assert!(compare_row("x", &theirs, &["no table here".into()]).is_empty());
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
}
