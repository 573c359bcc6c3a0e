//! Host-built programs the guest runs after the tests (the perf tool, each row next to its
//! perftest baseline), and building them.
//!
//! # How a row is measured
//! TCG timings drift between boots and with the host's load, so only figures taken side by
//! side in one boot compare, and one pair of figures is still noisy. Each row therefore runs
//! [`REPEATS`] times, interleaved (perftest, hotverbs-perf, perftest, hotverbs-perf, ...),
//! both tools as a server process and a client process over 127.0.0.1, the way perftest
//! always runs; the report prints every figure, the medians and the ratio of the medians.
//!
//! # The tick
//! On a loaded host, a run can fall into a regime where every message waits for the guest's
//! scheduler tick (4 ms at the kernel's HZ 250): p50 3,975-3,999 us instead of 10 us. It is
//! neither hotverbs' nor `--loopback`'s: in one such boot perftest's own `send_lat 64K`
//! had p50 3,999 us in two of three runs and its 2 B p99 was 4,040 us in all three, while
//! hotverbs-perf as two processes and as `--loopback` each hit it in one run of three. The
//! regime flips between consecutive runs, so one run per tool compares nothing; hence
//! [`REPEATS`] interleaved runs and medians. The kernel counters rule out rxe's deferred
//! work (100-200 tasklet softirqs and no ksoftirqd time for 2,200 messages, no retries),
//! and a `sched_yield` in the poll loop did not remove it. [`PROBES`] keep measuring
//! `--loopback` beside its rows, with the counters (`counted` in `xtask/rxe/lib.sh`).
//! In quiet boots all three agree within 1 us at p50.
//!
//! # The clock
//! Under TCG the guest's TSC is "unstable" and its clocksource is the emulated HPET: a
//! `clock_gettime` costs about 1.2 us there (22 ns for the TSC). hotverbs-perf's default
//! reads `clock_gettime` when the TSC is not invariant, and every latency sample carries one
//! reading's cost; perftest always reads the TSC. The latency rows therefore pass
//! `--clock tsc`, and `--clock auto` probes show what the default adds (measured: read_lat
//! 2 B p50 28.2-30.5 us with it, 27.2-27.5 us with the TSC, perftest 27.4-27.5 us).
//!

use super::guest::{expand, Step};

/// How often each row runs, interleaved with its baseline.
pub(super) const REPEATS: usize = 3;

/// The guest helper that prints how the kernel's counters moved during a program.
const COUNTED: [&str; 4] = [
    "sh",
    "-c",
    ". /usr/lib/rxe/lib.sh; counted \"$@\"",
    "counted",
];

/// A host-built program run in the VM when it has been built (skipped with a note when not).
pub(super) struct HostProgram {
    /// Step name.
    pub(super) name: &'static str,
    /// Path below the target directory.
    pub(super) binary: &'static str,
    /// Arguments of the server; the client gets the same plus the server's address.
    /// `{dev}`, `{gid}`, `{ip}` and `{port}` are replaced (see [`expand`]).
    args: &'static str,
    /// The perftest command measuring the same thing, run as a server/client pair the same
    /// way, interleaved with the program.
    pub(super) baseline: Option<&'static str>,
    /// Clients run under `counted` (kernel counters on stderr).
    counted: bool,
    /// Whether a failure fails the run.
    required: bool,
}

/// Which tool a step of a row runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tool {
    Perftest,
    Hotverbs,
}

// ---------------------------------------------------------------------------------------
// EDIT HERE: programs other parts of the project run on rxe.
//
// These templates are the only place the harness knows the perf tool's command line. Every
// row runs as a server/client pair beside perftest's equivalent, REPEATS times interleaved,
// and the report prints the medians and their ratio. Sizes: small and 64 KiB (issue #8),
// plus a message-rate pair (post list 32, CQ moderation 32; issue #15). `-n`: 1000 for the
// small latency rows (p99 is the 10th-worst sample), 300 for the 64 KiB ones (at rxe's TCG
// speed a 64 KiB round trip takes 2-8 ms: 1000 of them cost 10-20 s a run, and the medians
// of three runs of 300 stay within the boot-to-boot spread), 1000 for the streams (64 MiB
// at 64 KiB, about 2 s), 4096 for the message-rate rows (a multiple of the post list).
// Examples worth running on a real device get a row too
// (`binary: "release/examples/<name>"`).
// ---------------------------------------------------------------------------------------
pub(super) const HOST_PROGRAMS: &[HostProgram] = &[
    HostProgram {
        name: "perf send_lat 2B",
        binary: "release/hotverbs-perf",
        args: "send_lat -d {dev} -x {gid} -p {port} -s 2 -n 1000 --clock tsc",
        baseline: Some("ib_send_lat -d {dev} -x {gid} -p {port} -F -s 2 -n 1000"),
        counted: true,
        required: true,
    },
    HostProgram {
        name: "perf send_lat 64K",
        binary: "release/hotverbs-perf",
        args: "send_lat -d {dev} -x {gid} -p {port} -s 65536 -n 300 --clock tsc",
        baseline: Some("ib_send_lat -d {dev} -x {gid} -p {port} -F -s 65536 -n 300"),
        counted: true,
        required: true,
    },
    HostProgram {
        name: "perf write_lat 2B",
        binary: "release/hotverbs-perf",
        args: "write_lat -d {dev} -x {gid} -p {port} -s 2 -n 1000 --clock tsc",
        baseline: Some("ib_write_lat -d {dev} -x {gid} -p {port} -F -s 2 -n 1000"),
        counted: false,
        required: true,
    },
    HostProgram {
        name: "perf write_lat 64K",
        binary: "release/hotverbs-perf",
        args: "write_lat -d {dev} -x {gid} -p {port} -s 65536 -n 300 --clock tsc",
        baseline: Some("ib_write_lat -d {dev} -x {gid} -p {port} -F -s 65536 -n 300"),
        counted: false,
        required: true,
    },
    HostProgram {
        name: "perf read_lat 2B",
        binary: "release/hotverbs-perf",
        args: "read_lat -d {dev} -x {gid} -p {port} -s 2 -n 1000 --clock tsc",
        baseline: Some("ib_read_lat -d {dev} -x {gid} -p {port} -F -s 2 -n 1000"),
        counted: false,
        required: true,
    },
    HostProgram {
        name: "perf atomic_lat 8B",
        binary: "release/hotverbs-perf",
        args: "atomic_lat -d {dev} -x {gid} -p {port} -s 8 -n 1000 --clock tsc",
        baseline: Some("ib_atomic_lat -d {dev} -x {gid} -p {port} -F -s 8 -n 1000"),
        counted: false,
        required: true,
    },
    HostProgram {
        name: "perf send_bw 64B",
        binary: "release/hotverbs-perf",
        args: "send_bw -d {dev} -x {gid} -p {port} -s 64 -n 1000",
        baseline: Some("ib_send_bw -d {dev} -x {gid} -p {port} -F -s 64 -n 1000"),
        counted: false,
        required: true,
    },
    HostProgram {
        name: "perf send_bw 64K",
        binary: "release/hotverbs-perf",
        args: "send_bw -d {dev} -x {gid} -p {port} -s 65536 -n 1000",
        baseline: Some("ib_send_bw -d {dev} -x {gid} -p {port} -F -s 65536 -n 1000"),
        counted: false,
        required: true,
    },
    HostProgram {
        name: "perf write_bw 64B",
        binary: "release/hotverbs-perf",
        args: "write_bw -d {dev} -x {gid} -p {port} -s 64 -n 1000",
        baseline: Some("ib_write_bw -d {dev} -x {gid} -p {port} -F -s 64 -n 1000"),
        counted: false,
        required: true,
    },
    HostProgram {
        name: "perf write_bw 64K",
        binary: "release/hotverbs-perf",
        args: "write_bw -d {dev} -x {gid} -p {port} -s 65536 -n 1000",
        baseline: Some("ib_write_bw -d {dev} -x {gid} -p {port} -F -s 65536 -n 1000"),
        counted: false,
        required: true,
    },
    // Message rate: 32 WRs per ibv_post_send, one completion per 32.
    HostProgram {
        name: "perf send_bw 64B -l32 -Q32",
        binary: "release/hotverbs-perf",
        args: "send_bw -d {dev} -x {gid} -p {port} -s 64 -n 4096 -l 32 -Q 32",
        baseline: Some("ib_send_bw -d {dev} -x {gid} -p {port} -F -s 64 -n 4096 -l 32 -Q 32"),
        counted: false,
        required: true,
    },
    HostProgram {
        name: "perf write_bw 64B -l32 -Q32",
        binary: "release/hotverbs-perf",
        args: "write_bw -d {dev} -x {gid} -p {port} -s 64 -n 4096 -l 32 -Q 32",
        baseline: Some("ib_write_bw -d {dev} -x {gid} -p {port} -F -s 64 -n 4096 -l 32 -Q 32"),
        counted: false,
        required: true,
    },
    // The rows above run both tools on their default post path, the extended `ibv_wr_*`
    // (issue 16: hotverbs-perf defaults to it as perftest does). These two run both on the
    // legacy `ibv_post_send` (`--use_old_post_send`, the same flag in both tools).
    HostProgram {
        name: "perf send_lat 2B old post",
        binary: "release/hotverbs-perf",
        args: "send_lat -d {dev} -x {gid} -p {port} -s 2 -n 1000 --clock tsc --use_old_post_send",
        baseline: Some(
            "ib_send_lat -d {dev} -x {gid} -p {port} -F -s 2 -n 1000 --use_old_post_send",
        ),
        counted: false,
        required: true,
    },
    HostProgram {
        name: "perf write_bw 64B -l32 -Q32 old post",
        binary: "release/hotverbs-perf",
        args: "write_bw -d {dev} -x {gid} -p {port} -s 64 -n 4096 -l 32 -Q 32 --use_old_post_send",
        baseline: Some(
            "ib_write_bw -d {dev} -x {gid} -p {port} -F -s 64 -n 4096 -l 32 -Q 32 \
             --use_old_post_send",
        ),
        counted: false,
        required: true,
    },
    // Completion events (`-e` in both tools): each side arms its CQ and sleeps in
    // `ibv_get_cq_event` whenever a poll finds nothing.
    HostProgram {
        name: "perf send_lat 2B events",
        binary: "release/hotverbs-perf",
        args: "send_lat -d {dev} -x {gid} -p {port} -s 2 -n 1000 --clock tsc -e",
        baseline: Some("ib_send_lat -d {dev} -x {gid} -p {port} -F -s 2 -n 1000 -e"),
        counted: false,
        required: true,
    },
    // The unreliable datagram transport (`-c UD` in both tools): SENDs addressed through an
    // AH to the peer's GID, each receive preceded by its GRH.
    HostProgram {
        name: "perf send_lat 2B UD",
        binary: "release/hotverbs-perf",
        args: "send_lat -d {dev} -x {gid} -p {port} -s 2 -n 1000 --clock tsc -c UD",
        baseline: Some("ib_send_lat -d {dev} -x {gid} -p {port} -F -s 2 -n 1000 -c UD"),
        counted: false,
        required: true,
    },
    // The unreliable connection (`-c UC` in both tools): WRITEs with no ACK.
    HostProgram {
        name: "perf write_lat 2B UC",
        binary: "release/hotverbs-perf",
        args: "write_lat -d {dev} -x {gid} -p {port} -s 2 -n 1000 --clock tsc -c UC",
        baseline: Some("ib_write_lat -d {dev} -x {gid} -p {port} -F -s 2 -n 1000 -c UC"),
        counted: false,
        required: true,
    },
    HostProgram {
        name: "perf write_bw 64B UC",
        binary: "release/hotverbs-perf",
        args: "write_bw -d {dev} -x {gid} -p {port} -s 64 -n 1000 -c UC",
        baseline: Some("ib_write_bw -d {dev} -x {gid} -p {port} -F -s 64 -n 1000 -c UC"),
        counted: false,
        required: true,
    },
];

/// A probe of the tick (see the module docs): a hotverbs-perf variant run once per repeat
/// right after the pairs of its row, in the same boot, under `counted`; not required (it
/// documents a limit, it does not judge the library).
pub(super) struct Probe {
    pub(super) name: &'static str,
    /// The row it runs beside.
    pub(super) row: &'static str,
    /// hotverbs-perf's arguments; with `--loopback` one process, else a server/client pair.
    args: &'static str,
}

pub(super) const PROBES: &[Probe] = &[
    // The case: 2 B ping-pong, both sides as two threads of one process.
    Probe {
        name: "perf send_lat 2B --loopback",
        row: "perf send_lat 2B",
        args: "send_lat -d {dev} -x {gid} -s 2 -n 1000 --loopback --clock tsc",
    },
    // 64 KiB is 64 packets, which rxe's responder defers to its tasklet, and retries
    // (completer_retry_err) set the tail: the row where the tick shows most.
    Probe {
        name: "perf send_lat 64K --loopback",
        row: "perf send_lat 64K",
        args: "send_lat -d {dev} -x {gid} -s 65536 -n 300 --loopback --clock tsc",
    },
    // The clock: the rows read the TSC, as perftest does; hotverbs-perf's default reads
    // clock_gettime where the TSC is not invariant, as under TCG (guest clocksource: the
    // emulated HPET, about 1.2 us a read). What that default adds to a sample:
    Probe {
        name: "perf write_lat 2B --clock auto",
        row: "perf write_lat 2B",
        args: "write_lat -d {dev} -x {gid} -p {port} -s 2 -n 1000",
    },
    Probe {
        name: "perf read_lat 2B --clock auto",
        row: "perf read_lat 2B",
        args: "read_lat -d {dev} -x {gid} -p {port} -s 2 -n 1000",
    },
];

/// Builds the release binaries [`HOST_PROGRAMS`] name (the perf tool), so a fresh clone runs
/// the perftest comparison without a separate build step.
pub(super) fn build_host_programs() -> Result<(), String> {
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

/// `cmd` run under the guest's `counted` helper.
fn counted(cmd: Vec<String>) -> Vec<String> {
    COUNTED.iter().map(|s| s.to_string()).chain(cmd).collect()
}

impl HostProgram {
    /// Repeat `rep` (1-based) of the row: the baseline pair (if any), then the program's
    /// pair, found in the guest at `guest`; `hz` is the guest kernel's tick rate.
    pub(super) fn steps(&self, guest: &str, rep: usize, hz: &str) -> Vec<(Tool, Step)> {
        let mut steps = Vec::new();
        let env = vec![
            ("LD_LIBRARY_PATH".to_string(), "/host/lib".to_string()),
            ("HZ".to_string(), hz.to_string()),
        ];
        let wrap = |mut step: Step| {
            if self.counted {
                step.cmd = counted(step.cmd);
            }
            Step {
                required: self.required,
                timeout: 120,
                env: env.clone(),
                ..step
            }
        };
        if let Some(baseline) = self.baseline {
            let name = format!("{} #{rep} (perftest)", self.name);
            steps.push((Tool::Perftest, wrap(Step::pair(&name, &expand(baseline)))));
        }
        let mut server = vec![guest.to_string()];
        server.extend(expand(self.args));
        let name = format!("{} #{rep}", self.name);
        steps.push((Tool::Hotverbs, wrap(Step::pair(&name, &server))));
        steps
    }
}

impl Probe {
    pub(super) fn step(&self, guest: &str, rep: usize, hz: &str) -> Step {
        let mut cmd = vec![guest.to_string()];
        cmd.extend(expand(self.args));
        let name = format!("{} #{rep}", self.name);
        let mut step = if self.args.contains("--loopback") {
            Step::program(&name, cmd)
        } else {
            Step::pair(&name, &cmd)
        };
        step.cmd = counted(step.cmd);
        Step {
            required: false,
            timeout: 120,
            env: vec![
                ("LD_LIBRARY_PATH".to_string(), "/host/lib".to_string()),
                ("HZ".to_string(), hz.to_string()),
            ],
            ..step
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_two_server_client_pairs_on_the_pair_port() {
        let row = HOST_PROGRAMS
            .iter()
            .find(|p| p.name == "perf send_lat 2B")
            .unwrap();
        let steps = row.steps("/host/bin/hotverbs-perf", 2, "250");
        let tools: Vec<Tool> = steps.iter().map(|(t, _)| *t).collect();
        assert_eq!(tools, [Tool::Perftest, Tool::Hotverbs]);
        let (_, ours) = &steps[1];
        assert_eq!(ours.name, "perf send_lat 2B #2");
        let server = ours.server.as_ref().unwrap();
        assert_eq!(server[0], "/host/bin/hotverbs-perf");
        assert!(server.windows(2).any(|w| w == ["-p", "18515"]));
        // The client is the server's command plus its address, under `counted`.
        assert_eq!(&ours.cmd[..4], COUNTED);
        assert_eq!(ours.cmd[4..ours.cmd.len() - 1], server[..]);
        assert_eq!(ours.cmd.last().unwrap(), "127.0.0.1");
        assert!(ours.env.contains(&("HZ".into(), "250".into())));
        let (_, theirs) = &steps[0];
        assert_eq!(theirs.name, "perf send_lat 2B #2 (perftest)");
        assert_eq!(theirs.server.as_ref().unwrap()[0], "ib_send_lat");
    }

    #[test]
    fn every_row_has_a_baseline_with_the_same_settings() {
        for p in HOST_PROGRAMS {
            let baseline = p.baseline.unwrap();
            for flag in ["-s", "-n", "-l", "-Q"] {
                let value = |cmd: &str| {
                    let w: Vec<&str> = cmd.split_whitespace().collect();
                    w.windows(2)
                        .find(|w| w[0] == flag)
                        .map(|w| w[1].to_string())
                };
                assert_eq!(value(p.args), value(baseline), "{} {flag}", p.name);
            }
            assert!(!p.args.contains("--loopback"), "{}", p.name);
        }
        for probe in PROBES {
            let row = HOST_PROGRAMS.iter().find(|p| p.name == probe.row);
            assert!(row.is_some(), "{}", probe.name);
            let step = probe.step("/host/bin/hotverbs-perf", 1, "250");
            assert_eq!(step.server.is_some(), !probe.args.contains("--loopback"));
            assert_eq!(&step.cmd[..4], COUNTED);
        }
    }
}
