//! hotverbs-datapath: the `#![no_std]`, allocation-free RDMA hot path.
//!
//! The setup layer (`hotverbs`) creates the device objects and hands this crate raw
//! `*mut ibv_qp` / `*mut ibv_cq` / `*mut ibv_srq` plus plain memory descriptors. From then on
//! the datapath reaches the device only through the four hot inline verbs of verbs.h
//! (`ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`, `ibv_poll_cq`, via
//! `hotverbs_ffi::inline`, and the extended `ibv_wr_*` / `ibv_start_poll` ones): it never
//! calls a setup verb and never allocates, so the same code runs on mlx5, rxe and the
//! software device. The one exception is [`mlx5`], ConnectX only: it calls no verb at all
//! and writes the send queue, the doorbell record and the doorbell register itself, from
//! the `mlx5dv_init_obj(3)` descriptors the setup layer hands it.
//!
//! # Tour
//! - [`send`]: [`SendRing<N>`] — preformatted `ibv_send_wr`s; [`Msg`] for SEND, SEND_WITH_IMM,
//!   RDMA_WRITE(_WITH_IMM), RDMA_READ, FETCH_AND_ADD, CMP_AND_SWP and zero-byte messages;
//!   staged WRs go out as one chain per `post_send`; every K-th WR is signaled; a full ring is
//!   [`SendError::WouldBlock`], never a spin. UD mode through [`SendConfig::ud`].
//!   Inline messages are safe ([`SendRing::send_now`], [`SendRing::batch`]); zero-copy ones go
//!   through the `unsafe` [`SendRing::stage`].
//! - [`recv`]: [`RecvRing<N>`] — receives in fixed slots of one registered region, read in
//!   place, released and re-posted in chains; on a QP or an SRQ.
//! - [`cq`]: [`CqPoller<B>`] — up to B completions per `poll_cq`; [`Completion`] accessors.
//! - [`wr`]: [`WrRing`] — the same [`Msg`] API on an extended QP, posting through
//!   `ibv_wr_start` / `ibv_wr_*` / `ibv_wr_complete` (chosen when the ring is built: switching
//!   is a type change); batching, selective signaling, split mode and failure accounting as
//!   for [`SendRing`]; a failed `ibv_wr_complete` posted nothing and is rewound.
//! - [`cq_ex`]: [`ExCqPoller<B>`] — an extended CQ drained with `ibv_start_poll` /
//!   `ibv_next_poll` / `ibv_end_poll`, reading only the [`ExFields`] asked for (completion
//!   timestamps into a parallel array), into the same [`Completion`]s.
//! - [`mlx5`]: [`DirectRing`] and [`DirectPoller`] — on ConnectX, the same [`Msg`] API
//!   writing mlx5 WQEs into the send queue and reading CQEs straight from the CQ, with
//!   libmlx5's byte layout, doorbell and BlueFlame policy (proven equal to libmlx5's own
//!   `qp.c` / `cq.c` by `cargo xtask golden`), and no provider call at all.
//! - [`wr_id`]: the encoding (ring id in bits 63..56, sequence or slot below) that makes
//!   dispatch a shift and a compare.
//! - [`credits`]: SEND/RECV credit flow control so a sender never causes RNR.
//! - [`split`]: poster and poller on two threads, sharing only single-writer counters
//!   (model-checked with loom, see `tests/loom.rs`).
//! - [`error`]: a named [`WcError`] per `ibv_wc_status`, [`PostError`] with errno and the
//!   index of the first rejected WR.
//! - [`progress`]: [`Progress`] and [`StallWatch`]: a stuck ring (a completion that never
//!   comes: a CQ overflow on rxe, a dead peer with `retry_cnt` 7) told apart from a slow one.
//! - [`desc`]: [`LocalBuf`], [`RemoteBuf`], [`UdDest`] — what the setup layer produces.
//!
//! `unsafe` lives in `send`, `recv`, `cq`, `wr`, `cq_ex` and `mlx5` (ring storage and ffi dispatch); the rest is
//! safe code.
//!
//! # Error recovery
//! An error completion puts a [`SendRing`] in the error state (new messages get
//! [`SendError::QpError`]). Every WR still outstanding completes with a flush error (each
//! retires exactly itself and the WRs before it), or the setup layer moves the QP to RESET,
//! which discards them; then the `unsafe` [`SendRing::reset`] / [`RecvRing::reset`] account
//! for whatever never completed (their contract: the device no longer holds those WRs),
//! and after RESET -> INIT -> RTR -> RTS the rings are usable again with no slot leaked.
//! Completions left in the CQ from before the reset are recognised as stale. Receives on
//! an SRQ survive a QP reset (IBA): [`RecvRing::reset`] leaves them posted.
//!
//! # Dispatch
//! Give each completion to the ring named by [`Completion::ring`] (the ring id in
//! `wr_id`; ids are unique per CQ). The opcode cannot tell sends from receives: it is
//! undefined for error completions and rxe reports 0 (`IBV_WC_SEND`) for flushed receives.
//! Every ring also checks the ring id, kind (send or receive) and QP number itself: a
//! completion that is not its own is an error naming where it belongs
//! ([`WcError::Misrouted`] from send rings, [`RecvError::Misrouted`] from receive rings),
//! never `Ok`, so a dispatch bug cannot drop a receive slot or a send's retirement
//! silently. Only a *stale* completion of the ring itself (not for an outstanding WR or a
//! posted slot, e.g. a flush left in the CQ across a reset) is ignored: `Ok(0)` from send
//! rings, [`RecvError::Stale`] from receive rings.
//!
//! # A post the provider refuses without naming the WR
//! rxe refuses `ibv_post_send` before RTS with `EINVAL` and `bad_wr` NULL, yet queues the
//! WRs anyway and runs them after the QP reaches RTS with the next post (fault-truth S1).
//! So a failed post whose `bad_wr` is NULL (or outside the chain) has an unknown outcome:
//! the ring reports [`PostError::UNKNOWN`] as `first_rejected`, counts the whole chain as
//! posted (zero-copy buffers stay borrowed), and a [`SendRing`] refuses new WRs until the
//! QP went through RESET (which discards what the provider queued) and the ring was reset.
//! Only a QP reset recovers. Post only in RTS.
//!
//! # Example
//! A ping through the counting test device (any provider works the same way):
//! ```
//! use hotverbs_datapath::{CqPoller, Local, Msg, SendConfig, SendRing};
//! use hotverbs_softnic::counting::CountingDevice;
//!
//! let dev = CountingDevice::new(64);
//! // SAFETY: the device's QP and CQ outlive the ring and the poller.
//! let mut ring: SendRing<16> =
//!     unsafe { SendRing::new(dev.qp(), SendConfig::new(1, 16, 64).signal_every(4)) }.unwrap();
//! let mut poller: CqPoller<8> = unsafe { CqPoller::new(dev.cq()) };
//!
//! // Eight inline messages in one batch (the default batch size is depth / 2 = 8):
//! // one chain, one doorbell.
//! let msgs = [*b"ping-000"; 8];
//! let mut batch = ring.batch();
//! for m in &msgs {
//!     batch.push(Msg::send(Local::Inline(m))).unwrap();
//! }
//! batch.finish().unwrap();
//! assert_eq!(dev.doorbells(), 1);
//! assert_eq!(ring.outstanding(), 8);
//!
//! // Every 4th WR is signaled: two completions retire all eight.
//! for c in poller.poll().unwrap() {
//!     assert_eq!(c.ring(), 1);
//!     ring.on_completion(c).unwrap();
//! }
//! assert_eq!(ring.outstanding(), 0);
//! ```
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs)]
#![warn(clippy::std_instead_of_core)]

pub mod cq;
pub mod cq_ex;
pub mod credits;
pub mod desc;
pub mod error;
pub mod mlx5;
pub mod path;
pub mod progress;
pub mod recv;
pub mod send;
pub mod split;
mod sync;
pub mod wr;
pub mod wr_id;

pub use cq::{Completion, CqPoller};
pub use cq_ex::{ExCqPoller, ExFields, ExPollError};
pub use credits::{CreditReturn, Credits};
pub use desc::{LocalBuf, RemoteBuf, UdDest};
pub use error::{
    ConfigError, Misrouted, PollError, PostError, RecvError, ReleaseError, SendError, WcError,
};
pub use mlx5::{DirectBatch, DirectPoller, DirectRing, DirectSession, DirectWindow};
pub use path::{PollCq, PostBatch, PostRing};
pub use progress::{Progress, StallWatch, Stalled};
pub use recv::{Received, RecvConfig, RecvRing, RecvTarget};
pub use send::{Batch, Local, Msg, Opcode, SendConfig, SendRing};
pub use split::{SendCounters, SendRetirer};
pub use wr::{WrBatch, WrRing};
