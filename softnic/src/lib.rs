//! hotverbs-softnic: an in-process RDMA device behind the verbs ABI (being built).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs)]

pub mod counting;
