//! Host-built programs the guest runs after the tests (the perf tool, each next to its
//! perftest baseline), and building them.

use super::guest::{expand, Step};

/// A host-built program run in the VM when it has been built (skipped with a note when not).
pub(super) struct HostProgram {
    /// Step name.
    pub(super) name: &'static str,
    /// Path below the target directory.
    pub(super) binary: &'static str,
    /// Arguments; `{dev}`, `{gid}` and `{ip}` are replaced (see [`expand`]).
    args: &'static str,
    /// The perftest command measuring the same thing, run as a server/client pair on
    /// loopback right before the program: TCG timings drift between boots, so only numbers
    /// taken side by side in one boot compare.
    pub(super) baseline: Option<&'static str>,
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
pub(super) const HOST_PROGRAMS: &[HostProgram] = &[
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

impl HostProgram {
    /// The baseline pair (if any) and the program itself, found in the guest at `guest`.
    pub(super) fn steps(&self, guest: &str) -> Vec<Step> {
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
