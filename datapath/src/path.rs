//! One surface over the three post paths: [`PostRing`] (and its [`PostBatch`]) is what
//! [`SendRing`] (`ibv_post_send` of preformatted WRs), [`WrRing`] (`ibv_wr_*`) and
//! [`DirectRing`] (mlx5 WQEs written directly) share, and [`PollCq`] what [`CqPoller`],
//! [`ExCqPoller`] and [`DirectPoller`] share. An engine written once against them runs on
//! any path: legacy on rxe, `ibv_wr_*` elsewhere, direct on a ConnectX.
//!
//! **Free.** Every method is `#[inline(always)]` and forwards to the ring's inherent method
//! of the same name, and engines are generic (`fn run<R: PostRing>(r: &mut R)`), so each
//! path is compiled as if written for it: no vtable, no branch on the path
//! (`cargo xtask insn` rows `... via PostRing` measure it beside the inherent calls).
//! The traits are deliberately not object-safe (`stage` and `batch` take borrowed
//! payloads with their own lifetimes; a `dyn` ring would add an indirect call per message).
//!
//! The safe setup layer (`hotverbs`) implements both traits for its wrappers too, so the
//! same generic engine runs on safe rings.
//!
//! ```
//! use hotverbs_datapath::{Local, Msg, PostRing, SendError};
//! /// Sends `n` 8-byte messages on any post path, waiting out a full ring with `poll`.
//! fn burst<R: PostRing>(
//!     ring: &mut R,
//!     n: u64,
//!     mut poll: impl FnMut(&mut R),
//! ) -> Result<(), SendError> {
//!     for i in 0..n {
//!         let bytes = i.to_le_bytes();
//!         loop {
//!             match ring.send_now(Msg::send(Local::Inline(&bytes))) {
//!                 Err(SendError::WouldBlock) => poll(ring),
//!                 r => break r.map(drop)?,
//!             }
//!         }
//!     }
//!     Ok(())
//! }
//! ```

use crate::mlx5::Doorbell;
use crate::{
    Batch, Completion, CqPoller, DirectBatch, DirectPoller, DirectRing, ExCqPoller, ExPollError,
    Msg, PollError, Progress, RemoteBuf, SendError, SendRing, WcError, WrBatch, WrRing,
};

/// What every send ring does, whichever way it posts. See the [module](self) docs.
pub trait PostRing {
    /// The ring's batch: messages pushed into it go out as one chain (one doorbell) on
    /// [`PostBatch::finish`] or drop.
    type Batch<'r, 'd>: PostBatch<'d>
    where
        Self: 'r;

    /// Posts `msg` alone now (inline and empty payloads); returns its sequence number.
    ///
    /// # Errors
    /// `WouldBlock` when full, `QpError` after an error completion, a refused message by
    /// name ([`SendError`]).
    fn send_now(&mut self, msg: Msg<'_>) -> Result<u64, SendError>;

    /// Stages `msg` without posting (zero-copy from registered memory).
    ///
    /// # Safety
    /// Memory `msg` points at stays valid and unwritten (read-only for sends, untouched for
    /// READ / atomics) until its WR is retired; as each ring's inherent `stage`.
    unsafe fn stage(&mut self, msg: Msg<'_>) -> Result<u64, SendError>;

    /// Opens a batch.
    fn batch<'d>(&mut self) -> Self::Batch<'_, 'd>;

    /// Posts every staged WR.
    ///
    /// # Errors
    /// As the ring's `flush`.
    fn flush(&mut self) -> Result<(), SendError>;

    /// Retires the WRs a send completion of this ring covers; returns how many.
    ///
    /// # Errors
    /// The completion's error status, or a completion that is not this ring's.
    fn on_completion(&mut self, c: &Completion) -> Result<u64, WcError>;

    /// Points RDMA and atomic messages at `remote`.
    ///
    /// # Errors
    /// As the ring's `set_remote`.
    fn set_remote(&mut self, remote: RemoteBuf) -> Result<(), SendError>;

    /// Makes the next staged WR signaled.
    fn signal_next(&mut self);

    /// Posted and retired counts, for stall detection.
    fn progress(&self) -> Progress;
    /// WRs posted and not yet retired.
    fn outstanding(&self) -> u64;
    /// WRs that may still be staged before the ring is full.
    fn free(&self) -> u64;
    /// WRs staged and not yet posted.
    fn staged(&self) -> u64;
    /// Whether the WR of sequence number `seq` is retired.
    fn is_retired(&self, seq: u64) -> bool;
    /// WRs posted since creation.
    fn posted_total(&self) -> u64;
    /// WRs retired since creation.
    fn retired_total(&self) -> u64;
    /// The ring's depth (WRs outstanding at most).
    fn depth(&self) -> u64;
    /// Every how many WRs one is signaled.
    fn signal_every(&self) -> u64;
    /// The error completion that failed the ring, if any.
    fn error(&self) -> Option<WcError>;
    /// The ring id in this ring's `wr_id`s (route completions by it).
    fn ring_id(&self) -> u8;
}

/// A batch of a [`PostRing`].
pub trait PostBatch<'d> {
    /// Stages one inline or empty message (flushing at the batch size or when the ring
    /// fills); returns its sequence number.
    ///
    /// # Errors
    /// As the ring's `send_now`.
    fn push(&mut self, msg: Msg<'d>) -> Result<u64, SendError>;
    /// Messages staged by this batch and not posted yet.
    fn staged(&self) -> u64;
    /// Posts what the batch staged.
    ///
    /// # Errors
    /// As the ring's `flush`.
    fn finish(self) -> Result<(), SendError>;
}

/// What every completion poller does: one poll, a burst of [`Completion`]s.
pub trait PollCq {
    /// The poller's error.
    type Error: core::error::Error + 'static;
    /// Polls once: the completions found (possibly none).
    ///
    /// # Errors
    /// As the poller's inherent `poll`.
    fn poll(&mut self) -> Result<&mut [Completion], Self::Error>;
}

/// Implements [`PostRing`] for a ring type by forwarding to its inherent methods (which
/// take precedence over the trait's in method-call syntax, so `self.m()` is the inherent
/// one). Used here and by the setup layer's wrappers, which name the field holding their
/// datapath ring (`, ring`): the read-only accessors are read from it, the rest go through
/// the wrapper's own methods.
#[doc(hidden)]
#[macro_export]
macro_rules! forward_post_ring {
    ([$($gen:tt)*] $ring:ty, $batch:ty $(, $field:ident)?) => {
        impl<$($gen)*> $crate::PostRing for $ring {
            type Batch<'r, 'd> = $batch where Self: 'r;
            #[inline(always)]
            fn send_now(
                &mut self,
                msg: $crate::Msg<'_>,
            ) -> ::core::result::Result<u64, $crate::SendError> {
                self.send_now(msg)
            }
            #[inline(always)]
            unsafe fn stage(
                &mut self,
                msg: $crate::Msg<'_>,
            ) -> ::core::result::Result<u64, $crate::SendError> {
                // SAFETY: the trait's contract is the inherent method's.
                unsafe { self.stage(msg) }
            }
            #[inline(always)]
            fn batch<'d>(&mut self) -> Self::Batch<'_, 'd> {
                self.batch()
            }
            #[inline(always)]
            fn flush(&mut self) -> ::core::result::Result<(), $crate::SendError> {
                self.flush()
            }
            #[inline(always)]
            fn on_completion(
                &mut self,
                c: &$crate::Completion,
            ) -> ::core::result::Result<u64, $crate::WcError> {
                self.on_completion(c)
            }
            #[inline(always)]
            fn set_remote(
                &mut self,
                remote: $crate::RemoteBuf,
            ) -> ::core::result::Result<(), $crate::SendError> {
                self.set_remote(remote)
            }
            #[inline(always)]
            fn signal_next(&mut self) {
                self.signal_next()
            }
            #[inline(always)]
            fn progress(&self) -> $crate::Progress {
                self$(.$field)?.progress()
            }
            #[inline(always)]
            fn outstanding(&self) -> u64 {
                self$(.$field)?.outstanding()
            }
            #[inline(always)]
            fn free(&self) -> u64 {
                self$(.$field)?.free()
            }
            #[inline(always)]
            fn staged(&self) -> u64 {
                self$(.$field)?.staged()
            }
            #[inline(always)]
            fn is_retired(&self, seq: u64) -> bool {
                self$(.$field)?.is_retired(seq)
            }
            #[inline(always)]
            fn posted_total(&self) -> u64 {
                self$(.$field)?.posted_total()
            }
            #[inline(always)]
            fn retired_total(&self) -> u64 {
                self$(.$field)?.retired_total()
            }
            #[inline(always)]
            fn depth(&self) -> u64 {
                self$(.$field)?.depth()
            }
            #[inline(always)]
            fn signal_every(&self) -> u64 {
                self$(.$field)?.signal_every()
            }
            #[inline(always)]
            fn error(&self) -> Option<$crate::WcError> {
                self$(.$field)?.error()
            }
            #[inline(always)]
            fn ring_id(&self) -> u8 {
                self$(.$field)?.ring_id()
            }
        }
    };
}

/// Implements [`PostBatch`] for a batch type by forwarding to its inherent methods.
#[doc(hidden)]
#[macro_export]
macro_rules! forward_post_batch {
    ([$($gen:tt)*] $batch:ty) => {
        impl<$($gen)*> $crate::PostBatch<'d> for $batch {
            #[inline(always)]
            fn push(
                &mut self,
                msg: $crate::Msg<'d>,
            ) -> ::core::result::Result<u64, $crate::SendError> {
                self.push(msg)
            }
            #[inline(always)]
            fn staged(&self) -> u64 {
                self.staged()
            }
            #[inline(always)]
            fn finish(self) -> ::core::result::Result<(), $crate::SendError> {
                self.finish()
            }
        }
    };
}

/// Implements [`PollCq`] for a poller type by forwarding to its inherent `poll`.
#[doc(hidden)]
#[macro_export]
macro_rules! forward_poll_cq {
    ([$($gen:tt)*] $poller:ty, $err:ty) => {
        impl<$($gen)*> $crate::PollCq for $poller {
            type Error = $err;
            #[inline(always)]
            fn poll(
                &mut self,
            ) -> ::core::result::Result<&mut [$crate::Completion], Self::Error> {
                self.poll()
            }
        }
    };
}

forward_post_ring!([const N: usize] SendRing<N>, Batch<'r, 'd, N>);
forward_post_ring!([] WrRing, WrBatch<'r, 'd>);
forward_post_ring!([D: Doorbell] DirectRing<D>, DirectBatch<'r, 'd, D>);
forward_post_batch!(['r, 'd, const N: usize] Batch<'r, 'd, N>);
forward_post_batch!(['r, 'd] WrBatch<'r, 'd>);
forward_post_batch!(['r, 'd, D: Doorbell] DirectBatch<'r, 'd, D>);
forward_poll_cq!([const B: usize] CqPoller<B>, PollError);
forward_poll_cq!([const B: usize] ExCqPoller<B>, ExPollError);
forward_poll_cq!([const B: usize] DirectPoller<B>, crate::mlx5::DirectError);

// The three rings and three pollers have the one surface (a compile-time check).
const _: () = {
    const fn ring<R: PostRing>() {}
    const fn poller<P: PollCq>() {}
    ring::<SendRing<64>>();
    ring::<WrRing>();
    ring::<DirectRing>();
    poller::<CqPoller<32>>();
    poller::<ExCqPoller<32>>();
    poller::<DirectPoller<32>>();
};
