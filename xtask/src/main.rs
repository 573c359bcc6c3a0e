//! `cargo xtask`: the project's automation. Every check CI runs lives here so that the same
//! steps run on a laptop and in `.ci/run`.
//!
//! - `codegen [--check]`: regenerate `verbs-ffi/src/generated/` (or verify it is current)
//! - `ci`: everything (packages, fmt, clippy, docs, package, tests, codegen drift, no_std, loom,
//!   fuzz, rxe)
//! - `package`: the publishable crates as `cargo publish` would upload them (file lists, sizes,
//!   licences, a verified build of each `.crate`, docs as docs.rs builds them)
//! - `rxe [--filter S]`: the real-device suite on Soft-RoCE inside a QEMU VM
//! - `loom`, `miri [--list]`, `fuzz [--seconds N]`, `bench`, `insn`
//! - `golden [-- test args]`: the mlx5 direct path against libmlx5's own `qp.c` / `cq.c`

use std::process::ExitCode;

mod ci;
mod golden;
mod insn;
mod miri;
mod package;
mod rxe;
mod util;
mod verify;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => ("help", &[][..]),
    };
    let result = match cmd {
        "codegen" => util::codegen(rest),
        "ci" => ci::run_ci(rest),
        "rxe" => rxe::run(rest),
        "loom" => verify::loom(rest),
        "miri" => miri::run_miri(rest),
        "fuzz" => verify::fuzz(rest),
        "insn" => insn::run(rest),
        "golden" => golden::run_golden(rest),
        "package" => package::run_package(rest),
        "help" | "-h" | "--help" => {
            println!("usage: cargo xtask <codegen [--check] | ci | rxe [--filter S] | loom | miri [--list] | fuzz [--seconds N] | bench | insn | golden | package>");
            Ok(())
        }
        other => Err(format!(
            "unknown xtask command {other:?} (try `cargo xtask help`)"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {cmd}: {e}");
            ExitCode::FAILURE
        }
    }
}
