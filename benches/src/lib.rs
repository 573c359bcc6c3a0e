//! Shared code of the benches and `cargo xtask insn` (being built).
