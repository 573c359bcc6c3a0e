//! `cargo xtask insn`: callgrind instruction counts per message (being built).

/// Entry point of `cargo xtask insn`.
pub fn run(_args: &[String]) -> Result<(), String> {
    Err("xtask insn is not built yet".into())
}
