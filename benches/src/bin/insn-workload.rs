//! Runs one workload for a fixed count, for `cargo xtask insn` (under callgrind).
//!
//! ```text
//! insn-workload --list          # the rows: name<TAB>baseline<TAB>hotverbs<TAB>ratio target<TAB>own target<TAB>unit
//! insn-workload <workload> <n>  # run it
//! ```

use std::process::ExitCode;

use hotverbs_benches::{run_workload, ROWS, WORKLOADS};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag] if flag == "--list" => {
            let t = |v: Option<f64>| v.map_or("-".to_string(), |t| t.to_string());
            for r in ROWS {
                println!(
                    "{}\t{}\t{}\t{}{}{}\t{}\t{}",
                    r.name,
                    r.baseline,
                    r.hotverbs,
                    if r.ratio_goal { "~" } else { "" },
                    if r.ratio_own { "o" } else { "" },
                    t(r.ratio),
                    if r.own_goal {
                        format!("~{}", t(r.own))
                    } else {
                        t(r.own)
                    },
                    r.unit
                );
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
