//! Runs one workload for a fixed count, for `cargo xtask insn` (under callgrind).
//!
//! ```text
//! insn-workload --list          # the pairs: name<TAB>baseline<TAB>hotverbs<TAB>target
//! insn-workload <workload> <n>  # run it
//! ```

use std::process::ExitCode;

use hotverbs_benches::{run_workload, PAIRS, WORKLOADS};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag] if flag == "--list" => {
            for (name, base, hot, target) in PAIRS {
                let t = target.map_or("-".to_string(), |t| t.to_string());
                println!("{name}\t{base}\t{hot}\t{t}");
            }
            ExitCode::SUCCESS
        }
        [w, n] => {
            let Ok(n) = n.parse::<u64>() else {
                eprintln!("insn-workload: {n:?} is not a count");
                return ExitCode::from(2);
            };
            match run_workload(w, n) {
                Ok(done) => {
                    println!("{w}: {done}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("insn-workload: {w}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!("usage: insn-workload --list | <workload> <n>");
            for (w, d) in WORKLOADS {
                eprintln!("  {w:<24} {d}");
            }
            ExitCode::from(2)
        }
    }
}
