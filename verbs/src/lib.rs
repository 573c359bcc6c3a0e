//! hotverbs: the setup layer of an RDMA library for people who count nanoseconds —
//! "normal verbs" as a safe Rust API, verb by verb.
//!
//! One set of types runs over two kinds of device: real ones through the run-time loaded
//! `libibverbs.so.1` (mlx5, rxe, ...) and the in-process software device `softnic`. A
//! [`Context`] holds the function table it was opened through and calls every verb via
//! that table, so the same program runs on either, chosen by device name.
//!
//! # Tour
//! - [`devices()`], [`Context`]: list and open devices; [`Context::query_device`],
//!   [`Context::query_port`], [`Context::gid_table`], [`Context::query_pkey`];
//!   [`Context::port_info`] picks the first active port and, on RoCE, the RoCE v2 IPv4 GID.
//! - [`Pd`], [`Mr`]: protection domains and memory regions (over borrowed caller memory
//!   or owned page-aligned/huge-page buffers), with [`Sge`] and [`RemoteMr`] descriptors.
//! - [`Cq`], [`CompChannel`], [`Wc`]: completion queues, event channels (fd for epoll),
//!   [`AsyncEvent`]s; [`CqBuilder`] for extended CQs (`ibv_create_cq_ex`) carrying the
//!   [`WcFields`] asked for, completion timestamps included ([`TimestampClock`],
//!   [`Context::rt_values`], [`Context::supports_completion_timestamps`]); whether its
//!   completions may be drained in batches: [`Context::ex_cq_batch_poll_safe`] (not on rxe).
//! - [`QpBuilder`], [`Qp`]: RC/UC/UD QPs; typed transitions [`Qp::to_init`],
//!   [`Qp::to_rtr`], [`Qp::to_rts`], [`Qp::to_error`], [`Qp::reset`], [`Qp::query`],
//!   and [`Qp::connect`] for all of RESET->INIT->RTR->RTS; [`QpBuilder::send_ops`] for
//!   extended QPs (`ibv_create_qp_ex`, posted through `ibv_wr_*` on [`Qp::as_qp_ex`]).
//! - [`ThreadDomain`], [`ParentDomain`]: `ibv_alloc_td` / `ibv_alloc_parent_domain`, so a
//!   single-threaded QP or CQ can skip the provider's locks.
//! - [`Srq`], [`Ah`]: shared receive queues, address handles (also from a received
//!   [`Wc`]), multicast with [`Qp::attach_mcast`].
//! - [`exchange`]: endpoint exchange over TCP in our format and `ibv_rc_pingpong`'s.
//! - [`cm`]: the rdma_cm path (librdmacm, loaded at run time).
//! - [`Error`]: every failure names the verb, the errno and a hint.
//!
//! # Lifetimes
//! Objects hold their parents (`Arc`s inside): a PD lives until its MRs, QPs, SRQs and AHs
//! are gone, a CQ until its QPs are, a context until everything made from it is. Dropping
//! destroys; a destroy that fails in `Drop` is logged (`log::warn!`) and recorded
//! ([`take_drop_errors`]). Each type also has `destroy(self) -> Result<()>`, which returns
//! the verb's error — or `EBUSY` while children still hold the object.
//!
//! # Hand-off to the datapath
//! [`Qp::as_raw`], [`Cq::as_raw`], [`Srq::as_raw`] give the raw pointers, valid while the
//! owning object lives; [`Mr::local`] / [`Mr::sge`] give `(addr, length, lkey)` and
//! [`Mr::remote`] gives `(addr, len, rkey)`.
//!
//! The safe bridge builds the datapath's rings and pollers from these objects, borrowing
//! them, with no `unsafe` in user code: [`Qp::send_ring`] / [`Qp::send_ring_ud`]
//! (`ibv_post_send`), [`Qp::recv_ring`], [`Cq::poller`] (`ibv_poll_cq`); for extended
//! objects [`Qp::wr_ring`] / [`Qp::wr_ring_ud`] (a [`WrRing`] posting through
//! `ibv_wr_start` / `ibv_wr_*` / `ibv_wr_complete` on a QP built with
//! [`QpBuilder::send_ops`]) and [`Cq::ex_poller`] (an [`ExCqPoller`] reading the
//! [`ExFields`] asked for, timestamps included, on a CQ from [`CqBuilder`]; on rxe it reads
//! one completion per `ibv_start_poll` .. `ibv_end_poll`, see
//! [`Context::ex_cq_batch_poll_safe`]). A send queue has one ring of either kind; every
//! ring reserves its completions on its CQ (`ENOSPC` when they do not fit); a CQ has one
//! poller at a time.
//!
//! # Example: a connected RC pair, one send
//! ```
//! use std::time::Duration;
//! use hotverbs::*;
//!
//! let ctx = Context::open("softnic")?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(64, None)?;
//! let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
//! let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
//! let port = ctx.port_info(None, None)?;
//! a.connect(&port, &b.endpoint(&port), &ConnectOptions::default())?;
//! b.connect(&port, &a.endpoint(&port), &ConnectOptions::default())?;
//!
//! let mut tx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE)?;
//! let rx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE)?;
//! tx.as_mut_slice()?[..5].copy_from_slice(b"hello");
//! // SAFETY: rx and tx stay registered and untouched until their completions are polled.
//! unsafe {
//!     b.post_recv(1, &[rx.local(0, 64)?])?;
//!     a.post_send(&SendWr::send(2, &[tx.local(0, 5)?]).signaled())?;
//! }
//! let mut got = Vec::new();
//! while got.len() < 2 {
//!     got.push(cq.wait_one(Duration::from_secs(5))?.ok()?.wr_id());
//! }
//! got.sort();
//! assert_eq!(got, [1, 2]);
//! assert_eq!(&rx.as_slice()?[..5], b"hello");
//! # Ok::<(), hotverbs::Error>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs)]

mod ah;
mod bridge;
mod clock;
pub mod cm;
mod cq;
mod device;
mod direct;
mod error;
pub mod exchange;
mod mr;
mod pd;
mod post;
mod qp;
mod srq;
mod td;
pub mod testing;
mod watchdog;

pub use ah::{Ah, AhAttr};
pub use bridge::{
    CqPoller, DrainError, ExCqPoller, RecvRing, SendRing, SignalAsked, SrqRing, Stall, WrRing,
};
pub use clock::{ClockSample, RtValues, TimestampClock};
pub use cq::{
    async_event_name, AsyncElement, AsyncEvent, AsyncEvents, CompChannel, Cq, CqBuilder, CqEvent,
    CqOptions, Wc, WcFields,
};
pub use device::{
    devices, devices_report, Context, DeviceAttr, DeviceInfo, DeviceKind, DevicesReport, Gid,
    GidEntry, GidType, LinkLayer, Mtu, PortAttr, PortInfo, SOFTNIC, SOFTNIC_MLX5,
};
pub use direct::{
    DirectPoller, DirectRecvSession, DirectRing, DoorbellOnly, RegisterUse, SessionHooks,
};
pub use error::{take_drop_errors, ChainError, Error, RecvPostError, Result};
pub use exchange::{Endpoint, ExchangeError};
/// The datapath crate (`no_std` rings and poller), re-exported for its message and
/// configuration types; build its rings safely with [`Qp::send_ring`], [`Qp::recv_ring`],
/// [`Qp::wr_ring`], [`Cq::poller`] and [`Cq::ex_poller`].
pub use hotverbs_datapath as datapath;
pub use hotverbs_datapath::mlx5::{Delivered, Polled, RecvSessionError};
pub use hotverbs_datapath::{
    Completion, ConfigError, ExFields, ExPollError, Local, LocalBuf, Misrouted, Msg, Opcode,
    PollCq, PollError, PostBatch, PostError, PostRing, Progress, Received, RecvConfig, RecvError,
    ReleaseError, RemoteBuf, SendConfig, SendError, UdDest, WcError,
};
pub use hotverbs_ffi;
pub use hotverbs_ffi::flags::{QpAttrMask, SendFlags};
#[cfg(feature = "softnic")]
pub use hotverbs_softnic::Config as SoftnicConfig;
pub use mr::{AccessFlags, Mr, OwnedBuf, RemoteMr, Sge};
pub use pd::Pd;
pub use post::SendWr;
pub use qp::{
    ConnectOptions, Grh, InitAttr, Qp, QpAttr, QpBuilder, QpCaps, QpState, QpType, RtrAttr,
    RtsAttr, SendOps, DEFAULT_QKEY,
};
pub use srq::{Srq, SrqAttr};
pub use td::{ParentDomain, ThreadDomain};
pub use watchdog::Watchdog;

/// An all-zero value of a C struct.
///
/// # Safety
/// `T` must be plain C data for which all-zero bytes are a valid value (the verbs structs:
/// integers, raw pointers, unions of those).
pub(crate) unsafe fn zeroed<T>() -> T {
    // SAFETY: forwarded to the caller's contract.
    unsafe { std::mem::zeroed() }
}
