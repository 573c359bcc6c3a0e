//! The golden model: rdma-core's own mlx5 provider (`qp.c`, `cq.c`) driven on fake QP / CQ
//! objects in plain memory, to compare hotverbs' direct path with byte for byte.
//!
//! Nothing here ships: the C code is compiled at test time from the `ibverbs-sys` crate's
//! vendored rdma-core (`cargo xtask golden` fetches it through cargo and configures it).
//! Without it the crate builds with `cfg(golden_missing)` and [`available`] is false.
//!
//! `Model` owns one fake environment (context, QP, CQ, BlueFlame register) and posts
//! through `mlx5_post_send` or the `ibv_wr_*` table libmlx5 fills, polls with
//! `mlx5_poll_cq`, and (in the test build) records every MMIO store and barrier the
//! provider makes.

/// True when the rdma-core source was prepared and the C model is linked.
pub const fn available() -> bool {
    !cfg!(golden_missing)
}

#[cfg(not(golden_missing))]
mod model;
#[cfg(not(golden_missing))]
pub use model::*;

/// What a test prints when the model is not built.
pub const SKIPPED: &str =
    "skipped: rdma-core source not prepared (the golden model needs it); run `cargo xtask golden`";
