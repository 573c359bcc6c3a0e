//! `cargo xtask rxe`: the Soft-RoCE harness (being built).

/// Entry point of `cargo xtask rxe`.
pub fn run(_args: &[String]) -> Result<(), String> {
    Err("the rxe harness is not built yet".into())
}
