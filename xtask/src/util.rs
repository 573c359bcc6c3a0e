//! Shared helpers: running commands with echo, locating the workspace.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Runs `cmd` in the workspace root, echoing it; an unsuccessful exit is an error.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    cmd.current_dir(root());
    eprintln!("$ {}", show(cmd));
    let status = cmd.status().map_err(|e| format!("{}: {e}", show(cmd)))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{}` failed ({status})", show(cmd)))
    }
}

/// `program arg arg ...` for messages.
pub fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// A `cargo` command.
pub fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// `cargo xtask codegen [--check]`: runs the generator crate.
pub fn codegen(args: &[String]) -> Result<(), String> {
    let mut cmd = cargo();
    // Debug build: it shares artifacts with `cargo test --workspace`, and generation
    // itself takes about two seconds either way.
    cmd.args(["run", "--quiet", "-p", "hotverbs-codegen", "--"]);
    cmd.args(args);
    run(&mut cmd)
}
