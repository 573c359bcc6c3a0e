//! Completion queues, completion channels and asynchronous events: `ibv_create_cq`,
//! `ibv_create_comp_channel`, `ibv_req_notify_cq`, `ibv_get_cq_event`,
//! `ibv_ack_cq_events`, `ibv_poll_cq`, `ibv_get_async_event`, `ibv_ack_async_event`.
//!
//! # Invariants
//! A [`Cq`] is an `Arc<CqInner>`; QPs hold clones, so the CQ is destroyed after them.
//!
//! `cq_context` of every CQ we create points to its *event word*, the `AtomicU64` at the
//! start of a [`CqWord`] allocated once and turned into a raw pointer (`Box::leak`) before
//! the CQ exists: its address never changes, and no `Box` or `&mut` that moves with
//! [`CqInner`] owns it. The word counts the events taken from the channel for the CQ and
//! not yet acknowledged, plus a [`DYING`] bit. Next to it sits the application's
//! [`CqOptions::user_context`], written before the CQ exists and never after, so
//! `get_cq_event` reads it without synchronisation (the application's own value never
//! takes the word's place: `cq_context` stays ours). The allocation is freed only after
//! `ibv_destroy_cq` succeeded; if destruction fails, the CQ lives on and the word is
//! leaked with it, so a later event for that CQ still finds it.
//!
//! Events and destruction follow libibverbs: `ibv_destroy_cq` blocks until every event
//! taken with `ibv_get_cq_event` for the CQ is acknowledged (`ibv_get_cq_event(3)`; softnic
//! does the same). [`CompChannel::get_cq_event`] may take an event for a CQ whose last
//! [`Cq`] is being dropped on another thread (all safe code), so the drop cannot simply
//! acknowledge what it counted and destroy: an event taken but not yet counted would be
//! left unacknowledged (libibverbs: destroy waits forever) and counted after the word is
//! freed (use-after-free). Instead:
//! - the destroying thread sets [`DYING`] with one `fetch_or` and acknowledges the events
//!   counted before it; then calls `ibv_destroy_cq`, which waits for the rest;
//! - `get_cq_event` counts with one `fetch_add`; if that shows [`DYING`], the destroyer has
//!   already acknowledged what it saw, so `get_cq_event` acknowledges this event itself,
//!   at once (the CQ is still alive: the destroyer is waiting for exactly this ack).
//!
//! The two read-modify-writes on one word are totally ordered, so every taken event is
//! acknowledged exactly once, destruction never waits on a user, and the word is freed only
//! after the last `get_cq_event` that touches it is done with it (it either happened before
//! the `fetch_or`, which acquires it, or acknowledged before `ibv_destroy_cq` returned).

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hotverbs_ffi::{ibv_comp_channel, ibv_cq, ibv_cq_ex, ibv_wc};

use crate::device::Context;
use crate::error::{record_drop_error, Error, Result};
use crate::pd::Pd;
use crate::td::ParentDomain;

/// Set in a CQ's event word when its destruction starts (module invariants); the low bits
/// count events taken and not yet acknowledged.
const DYING: u64 = 1 << 63;

/// What the `cq_context` of our CQs points to (module invariants).
struct CqWord {
    /// The event word: events taken and not yet acknowledged, plus [`DYING`].
    events: AtomicU64,
    /// [`CqOptions::user_context`]; immutable once the CQ exists.
    user_context: u64,
    /// Events taken for this CQ since it was created, as libmlx5's `arm_sn` counts them
    /// (`mlx5_cq_event`): the arm sequence number of a CQ the mlx5 direct path arms.
    arm_sn: std::sync::atomic::AtomicU32,
}

/// Options of [`Context::create_cq_with`]: the completion vector the CQ's events are
/// raised on, and a value of the application's that comes back with every event.
///
/// # Example
/// ```
/// use hotverbs::CqOptions;
/// let o = CqOptions { user_context: 42, ..Default::default() };
/// assert_eq!((o.comp_vector, o.user_context), (0, 42));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CqOptions {
    /// The completion vector (an interrupt / event queue of the device) the CQ signals
    /// on: `0..num_comp_vectors` ([`Context::num_comp_vectors`]). Spreading CQs over the
    /// vectors spreads their interrupts over CPUs. Default 0.
    pub comp_vector: u32,
    /// The application's value for this CQ (an index, a pointer cast to an integer),
    /// handed back by [`CqEvent::user_context`] and [`Cq::user_context`]. It is not the
    /// verbs `cq_context` (that one points to hotverbs' event word), so it never needs to
    /// be a valid pointer. Default 0.
    pub user_context: u64,
}

/// Acknowledges `n` events of `cq` (`ibv_ack_cq_events` takes a `c_uint`).
///
/// # Safety
/// `cq` is live and `n` events were taken for it and not yet acknowledged.
unsafe fn ack_cq_events(ctx: &Context, cq: *mut ibv_cq, mut n: u64) {
    let Some(ack) = ctx.fns().ibv_ack_cq_events else {
        return;
    };
    while n > 0 {
        let k = n.min(u32::MAX as u64);
        // SAFETY: live CQ; k of the n unacknowledged events (caller).
        unsafe { ack(cq, k as u32) };
        n -= k;
    }
}

pub(crate) struct ChanInner {
    ctx: Context,
    ch: *mut ibv_comp_channel,
}

// SAFETY: a completion channel is an fd plus a struct libibverbs only reads; its verbs are
// thread-safe.
unsafe impl Send for ChanInner {}
// SAFETY: see Send.
unsafe impl Sync for ChanInner {}

impl ChanInner {
    fn destroy(&mut self) -> Result<()> {
        let ch = std::mem::replace(&mut self.ch, std::ptr::null_mut());
        if ch.is_null() {
            return Ok(());
        }
        let f = self
            .ctx
            .fns()
            .ibv_destroy_comp_channel
            .ok_or_else(|| Error::missing("ibv_destroy_comp_channel"))?;
        // SAFETY: ch came from this table and no CQ uses it any more (they hold Arcs of us).
        let ret = unsafe { f(ch) };
        if ret != 0 {
            return Err(Error::from_ret("ibv_destroy_comp_channel", ret));
        }
        Ok(())
    }
}

impl Drop for ChanInner {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            record_drop_error(e);
        }
    }
}

/// A completion event channel (`struct ibv_comp_channel`): CQs created with it signal
/// completions (after [`Cq::req_notify`]) on its file descriptor, which `epoll` can watch.
///
/// The fd is available as [`AsFd`]/[`AsRawFd`]; it stays open as long as any clone of the
/// channel (or a CQ created on it) lives, and is readable while an event is pending. To
/// wait on it from an async runtime, make it non-blocking
/// ([`set_nonblocking`](Self::set_nonblocking)) and hand a clone to the runtime's fd
/// wrapper (tokio's `AsyncFd`; `examples/tokio_channel.rs`).
///
/// # Example
/// ```
/// use std::os::fd::{AsFd, AsRawFd};
/// use std::time::Duration;
/// let ctx = hotverbs::Context::open("softnic")?;
/// let ch = ctx.create_comp_channel()?;
/// let cq = ctx.create_cq(16, Some(&ch))?;
/// cq.req_notify(false)?;
/// // Nothing completed yet: no event within 10 ms.
/// assert!(ch.wait_cq_event(Duration::from_millis(10))?.is_none());
/// assert!(ch.as_raw_fd() >= 0);
/// assert_eq!(ch.as_fd().as_raw_fd(), ch.as_raw_fd());
/// # Ok::<(), hotverbs::Error>(())
/// ```
///
/// # References
/// `ibv_create_comp_channel(3)`, `ibv_get_cq_event(3)`
#[derive(Clone)]
pub struct CompChannel {
    inner: Arc<ChanInner>,
}

impl fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

/// One completion event taken from a channel: which CQ it was for. The event is counted
/// against that CQ and must be acknowledged with [`Cq::ack_events`] (or is acknowledged
/// when the CQ is destroyed).
///
/// # Example
/// ```
/// # use std::time::Duration;
/// # let ctx = hotverbs::Context::open("softnic")?;
/// # let ch = ctx.create_comp_channel()?;
/// # let cq = ctx.create_cq(16, Some(&ch))?;
/// if let Some(ev) = ch.wait_cq_event(Duration::from_millis(1))? {
///     assert!(ev.is_for(&cq));
///     cq.ack_events(1);
/// }
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqEvent {
    cq: *mut ibv_cq,
    user_context: u64,
}

// SAFETY: the pointer is only compared (`is_for`) or handed out raw (`cq_raw`, whose use
// is the caller's unsafe business); nothing here dereferences it, so an event can be taken
// on one thread and dispatched on another.
unsafe impl Send for CqEvent {}
// SAFETY: as above; the event is immutable.
unsafe impl Sync for CqEvent {}

impl CqEvent {
    /// The raw CQ the event is for.
    pub fn cq_raw(&self) -> *mut ibv_cq {
        self.cq
    }
    /// The [`CqOptions::user_context`] the CQ was created with (0 for a CQ created on the
    /// channel outside hotverbs, see [`CompChannel::as_raw`]): tells CQs apart without a
    /// lookup by pointer.
    pub fn user_context(&self) -> u64 {
        self.user_context
    }
    /// Is it for `cq`?
    pub fn is_for(&self, cq: &Cq) -> bool {
        self.cq == cq.as_raw()
    }
}

impl Context {
    /// `ibv_create_comp_channel(3)`.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        let f = self
            .fns()
            .ibv_create_comp_channel
            .ok_or_else(|| Error::missing("ibv_create_comp_channel"))?;
        // SAFETY: live context.
        let ch = unsafe { f(self.as_raw()) };
        if ch.is_null() {
            return Err(Error::from_errno("ibv_create_comp_channel"));
        }
        let inner = ChanInner {
            ctx: self.clone(),
            ch,
        };
        // `AsFd` hands out the fd as a `BorrowedFd`, which must not be -1: a channel
        // without an fd is refused here (dropping `inner` destroys it).
        // SAFETY: ch is the live channel just created.
        if unsafe { (*ch).fd } < 0 {
            drop(inner);
            return Err(Error::new("ibv_create_comp_channel", libc::EBADF)
                .with_hint("the provider returned a completion channel without an fd"));
        }
        Ok(CompChannel {
            inner: Arc::new(inner),
        })
    }

    /// `ibv_create_cq(3)` with room for at least `cqe` completions, signalling on `channel`
    /// if given, on completion vector 0: [`create_cq_with`](Self::create_cq_with) with the
    /// default [`CqOptions`].
    ///
    /// # Errors
    /// `EINVAL` when `cqe` exceeds the device's `max_cqe` (the hint says the limit).
    pub fn create_cq(&self, cqe: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        self.create_cq_with(cqe, channel, CqOptions::default())
    }

    /// The number of completion vectors (`ibv_context.num_comp_vectors`): the valid
    /// [`CqOptions::comp_vector`]s are `0..num_comp_vectors` (vector 0 always works).
    pub fn num_comp_vectors(&self) -> u32 {
        // SAFETY: live context; the field is set when the context is opened and read-only.
        let n = unsafe { (*self.as_raw()).num_comp_vectors };
        u32::try_from(n).unwrap_or(0)
    }

    /// `ibv_create_cq(3)` with room for at least `cqe` completions, signalling on `channel`
    /// if given, with `opts`: the completion vector, and the application's context value
    /// that [`CqEvent::user_context`] and [`Cq::user_context`] give back.
    ///
    /// # Example
    /// ```
    /// use hotverbs::{Context, CqOptions};
    /// let ctx = Context::open_softnic_with(hotverbs::SoftnicConfig {
    ///     num_comp_vectors: 4,
    ///     ..Default::default()
    /// })?;
    /// let ch = ctx.create_comp_channel()?;
    /// let cq = ctx.create_cq_with(64, Some(&ch), CqOptions { comp_vector: 3, user_context: 7 })?;
    /// assert_eq!((cq.comp_vector(), cq.user_context()), (3, 7));
    /// let e = ctx.create_cq_with(64, None, CqOptions { comp_vector: 4, ..Default::default() })
    ///     .unwrap_err();
    /// assert_eq!((e.verb(), e.errno()), ("ibv_create_cq", libc::EINVAL));
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    ///
    /// # Errors
    /// `ibv_create_cq: EINVAL` when `opts.comp_vector` is not below the context's
    /// [`num_comp_vectors`](Self::num_comp_vectors) (checked before the verb; the hint
    /// names the range), when `channel` is of another context, or when `cqe` exceeds the
    /// device's `max_cqe` (the hint says the limit).
    ///
    /// # References
    /// `ibv_create_cq(3)`
    pub fn create_cq_with(
        &self,
        cqe: u32,
        channel: Option<&CompChannel>,
        opts: CqOptions,
    ) -> Result<Cq> {
        let f = self
            .fns()
            .ibv_create_cq
            .ok_or_else(|| Error::missing("ibv_create_cq"))?;
        self.create_cq_inner(
            "ibv_create_cq",
            cqe,
            channel,
            opts,
            |cq_context, ch, vector| {
                let n = i32::try_from(cqe).unwrap_or(i32::MAX);
                // SAFETY: live context; ch null or a live channel of this context; cq_context
                // points to the event word, which outlives the CQ; vector is one of the
                // context's (all checked by create_cq_inner).
                let cq = unsafe { f(self.as_raw(), n, cq_context, ch, vector) };
                if cq.is_null() {
                    Err(hotverbs_ffi::errno())
                } else {
                    Ok((cq, std::ptr::null_mut()))
                }
            },
        )
        .map(|inner| Cq {
            inner: Arc::new(inner),
        })
    }

    /// The common part of [`create_cq_with`](Self::create_cq_with) and
    /// [`CqBuilder::build`]: checks the channel and vector, makes the event word, calls
    /// `create(cq_context, channel, comp_vector)` (returning the `ibv_cq`, the `ibv_cq_ex`
    /// or null, or the errno) and wraps the result.
    fn create_cq_inner(
        &self,
        verb: &'static str,
        cqe: u32,
        channel: Option<&CompChannel>,
        opts: CqOptions,
        create: impl FnOnce(
            *mut std::ffi::c_void,
            *mut ibv_comp_channel,
            i32,
        ) -> std::result::Result<(*mut ibv_cq, *mut ibv_cq_ex), i32>,
    ) -> Result<CqInner> {
        if let Some(c) = channel {
            if c.inner.ctx.as_raw() != self.as_raw() {
                return Err(Error::new(verb, libc::EINVAL)
                    .with_hint("the completion channel belongs to another device context"));
            }
        }
        let vectors = self.num_comp_vectors();
        let comp_vector = match i32::try_from(opts.comp_vector) {
            Ok(v) if opts.comp_vector == 0 || opts.comp_vector < vectors => v,
            _ => {
                return Err(Error::new(verb, libc::EINVAL).with_hint(format!(
                    "comp_vector {} is not a completion vector of {}: it has {vectors} \
                         (num_comp_vectors), pick one of 0..{}",
                    opts.comp_vector,
                    self.name(),
                    vectors.max(1)
                )))
            }
        };
        // The event word, at its final address before the CQ can see it (module invariants).
        let events = NonNull::from(Box::leak(Box::new(CqWord {
            events: AtomicU64::new(0),
            user_context: opts.user_context,
            arm_sn: std::sync::atomic::AtomicU32::new(0),
        })));
        let ch = channel.map_or(std::ptr::null_mut(), |c| c.inner.ch);
        let (cq, cq_ex) = match create(events.as_ptr().cast(), ch, comp_vector) {
            Ok(made) => made,
            Err(errno) => {
                // SAFETY: no CQ was made, so nothing else has the word: freed once, here.
                drop(unsafe { Box::from_raw(events.as_ptr()) });
                let ctx = self.clone();
                return Err(Error::from_ret(verb, errno).or_hint(|| {
                    let max = ctx.query_device().ok()?.max_cqe();
                    (cqe as i64 > max as i64 || cqe == 0)
                        .then(|| format!("cqe {cqe} outside 1..=max_cqe {max}"))
                }));
            }
        };
        Ok(CqInner {
            ctx: self.clone(),
            _channel: channel.map(|c| c.inner.clone()),
            cq,
            cq_ex,
            wc_fields: WcFields::empty(),
            _parent_domain: None,
            serial: None,
            events,
            comp_vector: opts.comp_vector,
            rings: crate::bridge::CqRings::default(),
        })
    }
}

bitflags::bitflags! {
    /// The fields an extended CQ's completions carry (`wc_flags` of
    /// `ibv_create_cq_ex`, `IBV_WC_EX_WITH_*`): only these `ibv_wc_read_*` readers may be
    /// called on it. wr_id, status, opcode and vendor_err are always there.
    ///
    /// # Example
    /// ```
    /// use hotverbs::WcFields;
    /// assert!(WcFields::STANDARD.contains(WcFields::BYTE_LEN | WcFields::IMM));
    /// assert!(!WcFields::STANDARD.contains(WcFields::COMPLETION_TIMESTAMP));
    /// assert_eq!(WcFields::COMPLETION_TIMESTAMP.bits(), 1 << 7);
    /// ```
    ///
    /// # References
    /// `ibv_create_cq_ex(3)`
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub struct WcFields: u64 {
        /// `ibv_wc_read_byte_len` (`IBV_WC_EX_WITH_BYTE_LEN`).
        const BYTE_LEN = hotverbs_ffi::IBV_WC_EX_WITH_BYTE_LEN as u64;
        /// `ibv_wc_read_imm_data` / `ibv_wc_read_invalidated_rkey` (`IBV_WC_EX_WITH_IMM`).
        const IMM = hotverbs_ffi::IBV_WC_EX_WITH_IMM as u64;
        /// `ibv_wc_read_qp_num` (`IBV_WC_EX_WITH_QP_NUM`).
        const QP_NUM = hotverbs_ffi::IBV_WC_EX_WITH_QP_NUM as u64;
        /// `ibv_wc_read_src_qp` (`IBV_WC_EX_WITH_SRC_QP`).
        const SRC_QP = hotverbs_ffi::IBV_WC_EX_WITH_SRC_QP as u64;
        /// `ibv_wc_read_slid` (`IBV_WC_EX_WITH_SLID`).
        const SLID = hotverbs_ffi::IBV_WC_EX_WITH_SLID as u64;
        /// `ibv_wc_read_sl` (`IBV_WC_EX_WITH_SL`).
        const SL = hotverbs_ffi::IBV_WC_EX_WITH_SL as u64;
        /// `ibv_wc_read_dlid_path_bits` (`IBV_WC_EX_WITH_DLID_PATH_BITS`).
        const DLID_PATH_BITS = hotverbs_ffi::IBV_WC_EX_WITH_DLID_PATH_BITS as u64;
        /// `ibv_wc_read_completion_ts`: the device clock when the completion was made
        /// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`); see [`crate::TimestampClock`] and
        /// [`Context::supports_completion_timestamps`].
        const COMPLETION_TIMESTAMP = hotverbs_ffi::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP as u64;
        /// `ibv_wc_read_cvlan` (`IBV_WC_EX_WITH_CVLAN`).
        const CVLAN = hotverbs_ffi::IBV_WC_EX_WITH_CVLAN as u64;
        /// `ibv_wc_read_flow_tag` (`IBV_WC_EX_WITH_FLOW_TAG`).
        const FLOW_TAG = hotverbs_ffi::IBV_WC_EX_WITH_FLOW_TAG as u64;
        /// `ibv_wc_read_tm_info` (`IBV_WC_EX_WITH_TM_INFO`).
        const TM_INFO = hotverbs_ffi::IBV_WC_EX_WITH_TM_INFO as u64;
        /// `ibv_wc_read_completion_wallclock_ns`: the completion time in wall-clock ns
        /// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`).
        const COMPLETION_TIMESTAMP_WALLCLOCK =
            hotverbs_ffi::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK as u64;
        /// `IBV_WC_STANDARD_FLAGS`: byte_len, imm, qp_num, src_qp, slid, sl and
        /// dlid_path_bits — what an `ibv_wc` of `ibv_poll_cq` has, and the default of
        /// [`CqBuilder`].
        const STANDARD = hotverbs_ffi::IBV_WC_STANDARD_FLAGS as u64;
    }
}

impl WcFields {
    /// What a single field is called in an error message, and whether that name is plural.
    fn feature(self) -> (String, bool) {
        if self == WcFields::COMPLETION_TIMESTAMP {
            return ("completion timestamps".into(), true);
        }
        if self == WcFields::COMPLETION_TIMESTAMP_WALLCLOCK {
            return ("wall-clock completion timestamps".into(), true);
        }
        let names: Vec<&str> = self.iter_names().map(|(n, _)| n).collect();
        (format!("completion field {}", names.join(" | ")), false)
    }
}

/// A builder for an extended CQ (`ibv_create_cq_ex`): the completion fields it carries
/// ([`WcFields`], read with `ibv_start_poll` / `ibv_next_poll` / `ibv_wc_read_*` on
/// [`Cq::as_cq_ex`]), an optional parent domain (its thread domain lets the provider skip
/// the CQ's lock), and the same channel, vector and user context as
/// [`Context::create_cq_with`]. The resulting [`Cq`] is a full `Cq`: [`Cq::poll`],
/// [`Cq::req_notify`], channels and the datapath bridge all work on it as on any CQ.
///
/// # Example
/// ```
/// use hotverbs::{Context, CqBuilder, WcFields};
/// let ctx = Context::open("softnic")?;
/// let cq = CqBuilder::new(&ctx, 64)
///     .wc_fields(WcFields::BYTE_LEN | WcFields::QP_NUM)
///     .build()?;
/// assert!(cq.as_cq_ex().is_some());
/// assert_eq!(cq.wc_fields(), WcFields::BYTE_LEN | WcFields::QP_NUM);
/// let mut wcs = [hotverbs::Wc::default(); 4];
/// assert_eq!(cq.poll(&mut wcs)?, 0); // ibv_poll_cq works on it too
/// # Ok::<(), hotverbs::Error>(())
/// ```
///
/// # References
/// `ibv_create_cq_ex(3)`, `ibv_alloc_parent_domain(3)`
#[derive(Clone, Debug)]
pub struct CqBuilder<'a> {
    ctx: &'a Context,
    cqe: u32,
    channel: Option<&'a CompChannel>,
    opts: CqOptions,
    wc_fields: WcFields,
    parent_domain: Option<&'a ParentDomain>,
    single_threaded: bool,
}

impl<'a> CqBuilder<'a> {
    /// An extended CQ of `ctx` with room for at least `cqe` completions, carrying
    /// [`WcFields::STANDARD`], without channel, on vector 0.
    ///
    /// # References
    /// `ibv_create_cq_ex(3)`
    pub fn new(ctx: &'a Context, cqe: u32) -> Self {
        CqBuilder {
            ctx,
            cqe,
            channel: None,
            opts: CqOptions::default(),
            wc_fields: WcFields::STANDARD,
            parent_domain: None,
            single_threaded: false,
        }
    }

    /// Raise completion events on `channel` ([`Cq::req_notify`]).
    ///
    /// # References
    /// `ibv_create_cq_ex(3)`, `ibv_get_cq_event(3)`
    pub fn channel(mut self, channel: &'a CompChannel) -> Self {
        self.channel = Some(channel);
        self
    }

    /// Completion vector and user context ([`CqOptions`]).
    ///
    /// # References
    /// `ibv_create_cq_ex(3)`
    pub fn options(mut self, opts: CqOptions) -> Self {
        self.opts = opts;
        self
    }

    /// The completion fields to carry (`wc_flags`); default [`WcFields::STANDARD`].
    /// Ask only for what you read: each field costs the provider work per completion.
    ///
    /// # References
    /// `ibv_create_cq_ex(3)`
    pub fn wc_fields(mut self, fields: WcFields) -> Self {
        self.wc_fields = fields;
        self
    }

    /// Make the CQ in `pd` (`IBV_CQ_INIT_ATTR_MASK_PD`): with a thread domain, the
    /// provider may drop the CQ's lock. [`Cq::poll`] and [`Cq::req_notify`] then take a
    /// lock of hotverbs' own; raw polling through [`Cq::as_raw`] / [`Cq::as_cq_ex`] must
    /// come from one thread at a time (the datapath's poller is single-owner).
    ///
    /// # References
    /// `ibv_create_cq_ex(3)`, `ibv_alloc_parent_domain(3)`
    pub fn parent_domain(mut self, pd: &'a ParentDomain) -> Self {
        self.parent_domain = Some(pd);
        self
    }

    /// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`: a promise that one thread at a time uses the
    /// CQ, so the provider may skip its lock. Default false. As with a thread domain,
    /// [`Cq::poll`] and [`Cq::req_notify`] then serialise themselves; raw polling is the
    /// caller's to keep single-threaded.
    ///
    /// # References
    /// `ibv_create_cq_ex(3)`
    pub fn single_threaded(mut self, yes: bool) -> Self {
        self.single_threaded = yes;
        self
    }

    /// The `ibv_cq_init_attr_ex` of this builder, with `wc_flags` `fields` and the given
    /// context word, channel and vector.
    fn attr(
        &self,
        fields: WcFields,
        cq_context: *mut std::ffi::c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: u32,
    ) -> hotverbs_ffi::ibv_cq_init_attr_ex {
        // SAFETY: plain C data; all-zero is valid.
        let mut attr: hotverbs_ffi::ibv_cq_init_attr_ex = unsafe { crate::zeroed() };
        attr.cqe = self.cqe;
        attr.cq_context = cq_context;
        attr.channel = channel;
        attr.comp_vector = comp_vector;
        attr.wc_flags = fields.bits();
        if self.single_threaded {
            attr.comp_mask |= hotverbs_ffi::IBV_CQ_INIT_ATTR_MASK_FLAGS;
            attr.flags |= hotverbs_ffi::IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
        }
        if let Some(pd) = self.parent_domain {
            attr.comp_mask |= hotverbs_ffi::IBV_CQ_INIT_ATTR_MASK_PD;
            attr.parent_domain = pd.as_raw();
        }
        attr
    }

    /// `ibv_create_cq_ex(3)`.
    ///
    /// # Errors
    /// `ibv_create_cq_ex: EOPNOTSUPP` (or the device's errno) when the device refuses a
    /// requested field, naming it and the device: `completion timestamps are not supported
    /// by device rxe0` (check [`Context::supports_completion_timestamps`] first); when it
    /// has no extended CQs at all, the hint says so. `EINVAL` when the channel or parent
    /// domain belongs to another context, for a bad `comp_vector`, or a `cqe` above the
    /// device's `max_cqe`.
    ///
    /// # References
    /// `ibv_create_cq_ex(3)`
    pub fn build(self) -> Result<Cq> {
        const VERB: &str = "ibv_create_cq_ex";
        let ctx = self.ctx;
        if self
            .parent_domain
            .is_some_and(|p| p.context().as_raw() != ctx.as_raw())
        {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("the parent domain belongs to another device context"));
        }
        // Set when the verb itself refused (not one of the checks before it).
        let refused = std::cell::Cell::new(false);
        let made = ctx.create_cq_inner(VERB, self.cqe, self.channel, self.opts, |word, ch, v| {
            let mut attr = self.attr(self.wc_fields, word, ch, v as u32);
            // SAFETY: live context; attr is valid: ch null or a live channel, the parent
            // domain (if any) live and of this context, cq_context the event word.
            let cq_ex = unsafe { hotverbs_ffi::inline::ibv_create_cq_ex(ctx.as_raw(), &mut attr) };
            if cq_ex.is_null() {
                refused.set(true);
                Err(hotverbs_ffi::errno())
            } else {
                Ok((hotverbs_ffi::inline::ibv_cq_ex_to_cq(cq_ex), cq_ex))
            }
        });
        match made {
            Ok(mut inner) => {
                inner.wc_fields = self.wc_fields;
                inner._parent_domain = self.parent_domain.map(|p| p.as_pd().clone());
                let lockless = self.single_threaded
                    || self
                        .parent_domain
                        .is_some_and(|p| p.thread_domain().is_some());
                inner.serial = lockless.then(|| std::sync::Mutex::new(()));
                Ok(Cq {
                    inner: Arc::new(inner),
                })
            }
            Err(e)
                if refused.get()
                    && (crate::td::unsupported(e.errno()) || e.errno() == libc::EINVAL) =>
            {
                match self.refused_fields() {
                    Some(hint) => Err(Error::new(VERB, e.errno()).with_hint(hint)),
                    None => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// After a refusal: which requested fields does the device refuse on their own? Tries
    /// a bare extended CQ per field (destroyed at once) and names the refused ones and the
    /// device; `None` when each works alone (the combination, a flag or the parent domain
    /// was refused: the verb's own error stands).
    fn refused_fields(&self) -> Option<String> {
        let ctx = self.ctx;
        let destroy = ctx.fns().ibv_destroy_cq?;
        let try_fields = |fields: WcFields| -> bool {
            // SAFETY: plain C data; all-zero is valid.
            let mut attr: hotverbs_ffi::ibv_cq_init_attr_ex = unsafe { crate::zeroed() };
            attr.cqe = self.cqe.clamp(1, 64);
            attr.wc_flags = fields.bits();
            // SAFETY: live context; attr valid (no channel, no context word, no PD).
            let cq = unsafe { hotverbs_ffi::inline::ibv_create_cq_ex(ctx.as_raw(), &mut attr) };
            if cq.is_null() {
                return false;
            }
            // SAFETY: the probe CQ was just made on this context and nothing else uses it.
            unsafe { destroy(hotverbs_ffi::inline::ibv_cq_ex_to_cq(cq)) };
            true
        };
        if !try_fields(WcFields::empty()) && !try_fields(WcFields::STANDARD) {
            return Some(format!(
                "extended CQs (ibv_create_cq_ex) are not supported by device {}: use \
                 Context::create_cq",
                ctx.name()
            ));
        }
        let refused = self
            .wc_fields
            .iter()
            .filter(|&f| !try_fields(f))
            .fold(WcFields::empty(), |a, f| a | f);
        if refused.is_empty() {
            return None;
        }
        Some(refused_fields_hint(refused, ctx.name()))
    }
}

/// `vendor_id` of Soft-RoCE (rxe) devices.
const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

impl Context {
    /// May an extended CQ of this device be drained several completions per
    /// `ibv_start_poll`, calling `ibv_next_poll` until it answers ENOENT and then
    /// `ibv_end_poll` as `ibv_create_cq_ex(3)` says?
    ///
    /// False on rxe (`vendor_id` 0xffffff): librxe up to rdma-core 54 (Debian bookworm ships
    /// 44) stores the consumer index past the last completion when `ibv_next_poll` answers
    /// ENOENT, and `ibv_end_poll` advances it once more: the CQ then reads stale slots and
    /// the kernel sees it full (fixed in rdma-core 55, "rxe: fix completion queue consumer
    /// index overrun"; the spinlock it also unlocked twice, in 59). There, read one
    /// completion per `ibv_start_poll` / `ibv_end_poll` and never call `ibv_next_poll`.
    /// True for every other device (softnic included).
    ///
    /// # Example
    /// ```
    /// let ctx = hotverbs::Context::open("softnic")?;
    /// assert!(ctx.ex_cq_batch_poll_safe()?);
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    ///
    /// # References
    /// `ibv_create_cq_ex(3)` (`ibv_start_poll`, `ibv_next_poll`, `ibv_end_poll`),
    /// `ibv_query_device(3)` (`vendor_id`)
    pub fn ex_cq_batch_poll_safe(&self) -> Result<bool> {
        if self.kind() == crate::DeviceKind::Softnic {
            return Ok(true);
        }
        Ok(self.query_device()?.vendor_id() != RXE_VENDOR_ID)
    }

    /// True when this is a ConnectX (mlx5) device, on which the direct path
    /// ([`Qp::direct_ring`](crate::Qp::direct_ring), [`Cq::direct_poller`]) works:
    /// `mlx5dv_is_supported(3)`. False for rxe and any other provider, and when libmlx5 is
    /// not installed; never an error. True for a softnic device with the mlx5 personality
    /// (`SoftnicConfig::mlx5`), false for other softnic devices.
    pub fn is_mlx5(&self) -> bool {
        if self.kind() == crate::DeviceKind::Softnic {
            // Not a libibverbs device: mlx5dv_is_supported would read a verbs_device
            // softnic does not have. A softnic device with the mlx5 personality
            // (`SoftnicConfig::mlx5`) simulates one.
            #[cfg(feature = "softnic")]
            // SAFETY: a live softnic context.
            return unsafe { hotverbs_softnic::is_mlx5(self.as_raw()) };
            #[cfg(not(feature = "softnic"))]
            return false;
        }
        let Ok(fns) = hotverbs_ffi::loader::mlx5() else {
            return false;
        };
        let Some(f) = fns.mlx5dv_is_supported else {
            return false;
        };
        // SAFETY: a live context opened through libibverbs; its device is a verbs_device
        // of whatever provider drives it, which is what mlx5dv_is_supported inspects.
        unsafe { f((*self.as_raw()).device) }
    }
}

/// The hint for completion fields `refused` (non-empty) by device `device`.
fn refused_fields_hint(refused: WcFields, device: &str) -> String {
    let features: Vec<(String, bool)> = refused.iter().map(WcFields::feature).collect();
    let plural = features.len() > 1 || features.first().is_some_and(|f| f.1);
    let names: Vec<String> = refused
        .iter_names()
        .map(|(n, _)| format!("WcFields::{n}"))
        .collect();
    let timestamps = WcFields::COMPLETION_TIMESTAMP | WcFields::COMPLETION_TIMESTAMP_WALLCLOCK;
    format!(
        "{} {} not supported by device {device}: leave {} out{}",
        features
            .iter()
            .map(|(f, _)| f.as_str())
            .collect::<Vec<_>>()
            .join(" and "),
        if plural { "are" } else { "is" },
        names.join(" | "),
        if refused.intersects(timestamps) {
            " (check Context::supports_completion_timestamps() first)"
        } else {
            ""
        },
    )
}

/// The channel's fd (`ibv_comp_channel.fd`), readable when an event is pending; open as
/// long as the channel lives (it is closed by `ibv_destroy_comp_channel`, after the last
/// clone and the last CQ on the channel are gone). Non-negative (checked at creation).
impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: the channel is live while self lives; libibverbs never writes `fd` after
        // creating the channel.
        unsafe { (*self.inner.ch).fd }
    }
}

/// The channel's fd as a [`BorrowedFd`]: for `poll`/`epoll` wrappers and async runtimes.
impl AsFd for CompChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd is not -1 (checked in `create_comp_channel`) and stays open while
        // the channel lives, which is at least as long as the borrow of self.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl CompChannel {
    /// Puts the channel's fd in non-blocking mode (`O_NONBLOCK`) or back.
    ///
    /// Non-blocking, [`get_cq_event`](Self::get_cq_event) returns `EAGAIN` (an error whose
    /// [`kind`](Error::kind) is `WouldBlock`) instead of blocking when no event is pending.
    /// Readiness-based waiters need that: tokio's `AsyncFd` requires a non-blocking fd,
    /// since a readiness notice may be stale (another thread took the event, or the
    /// notice was spurious), and a blocking read would then block the runtime's thread.
    ///
    /// The flag belongs to the open file, so it applies to every clone of this channel.
    ///
    /// # Example
    /// ```
    /// let ctx = hotverbs::Context::open("softnic")?;
    /// let ch = ctx.create_comp_channel()?;
    /// ch.set_nonblocking(true)?;
    /// let e = ch.get_cq_event().unwrap_err();
    /// assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    ///
    /// # References
    /// `ibv_get_cq_event(3)` (its example makes the fd non-blocking with `fcntl(2)`)
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        set_nonblocking(self.as_fd(), nonblocking)
    }

    /// The raw `ibv_comp_channel`.
    ///
    /// # Safety
    /// A CQ created on it outside this crate must have a NULL `cq_context`:
    /// [`get_cq_event`](Self::get_cq_event) treats a non-NULL one as this crate's event
    /// word and updates it atomically. (Getting the pointer is harmless; the contract is
    /// what makes handing it to `ibv_create_cq` yourself sound.)
    pub unsafe fn as_raw(&self) -> *mut ibv_comp_channel {
        self.inner.ch
    }

    /// `ibv_get_cq_event(3)`: blocks until the next completion event (unless the fd was
    /// made non-blocking with [`set_nonblocking`](Self::set_nonblocking), then `EAGAIN`).
    /// The event counts against its CQ until [`Cq::ack_events`] or the CQ's destruction;
    /// if the CQ's last handle is being dropped meanwhile, the event is acknowledged here
    /// at once (module invariants) and the returned [`CqEvent`] only names a CQ that is
    /// going away.
    pub fn get_cq_event(&self) -> Result<CqEvent> {
        let f = self
            .inner
            .ctx
            .fns()
            .ibv_get_cq_event
            .ok_or_else(|| Error::missing("ibv_get_cq_event"))?;
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut cq_ctx: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointers.
        let ret = unsafe { f(self.inner.ch, &mut cq, &mut cq_ctx) };
        if ret != 0 {
            return Err(Error::from_ret("ibv_get_cq_event", ret));
        }
        let mut user_context = 0;
        if !cq_ctx.is_null() {
            let word = cq_ctx.cast::<CqWord>();
            // SAFETY: a CQ on our channel with a non-NULL cq_context is ours (see `as_raw`),
            // so cq_ctx is its CqWord; it is freed only after ibv_destroy_cq returns, which
            // waits for the event we hold to be acknowledged, so it is live until our ack.
            // user_context was written before the CQ existed and is never written again.
            // AcqRel: pairs with the fetch_or of `CqInner::destroy` (whichever comes second
            // sees the other), and orders our count before the word is freed.
            let prev = unsafe {
                user_context = (*word).user_context;
                (*word).arm_sn.fetch_add(1, Ordering::Relaxed);
                (*word).events.fetch_add(1, Ordering::AcqRel)
            };
            if prev & DYING != 0 {
                // The CQ's destruction acknowledged what it counted before ours and waits
                // in ibv_destroy_cq for this event: acknowledge it now. The word (and the
                // CQ) may be freed as soon as this returns; neither is touched again.
                // SAFETY: the CQ is live (destroy waits for this ack); we took one event.
                unsafe { ack_cq_events(&self.inner.ctx, cq, 1) };
            }
        }
        Ok(CqEvent { cq, user_context })
    }

    /// Waits up to `timeout` for the fd to become readable (`poll(2)`), then takes the
    /// event. `Ok(None)` on timeout: never hangs (on a blocking fd, unless another thread
    /// takes the event between the poll and the read). On a non-blocking fd an event
    /// taken by another thread in between (`EAGAIN`) means waiting on until the deadline.
    pub fn wait_cq_event(&self, timeout: Duration) -> Result<Option<CqEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if !self
                .readable(left)
                .map_err(|e| e.with_hint("poll on the channel fd"))?
            {
                return Ok(None);
            }
            match self.get_cq_event() {
                Err(e) if e.errno() == libc::EAGAIN && !left.is_zero() => continue,
                Err(e) if e.errno() == libc::EAGAIN => return Ok(None),
                r => return r.map(Some),
            }
        }
    }

    /// `poll(2)` on the fd for up to `timeout`. On softnic while its simulated ConnectX has
    /// queues, the device runs meanwhile (`hotverbs_softnic::wait_fd_stepping`): a direct
    /// ring's WQEs complete and raise their events with nobody polling, as on hardware.
    fn readable(&self, timeout: Duration) -> Result<bool> {
        #[cfg(feature = "softnic")]
        if self.inner.ctx.kind() == crate::device::DeviceKind::Softnic
            && hotverbs_softnic::mlx5_active()
        {
            let deadline = Instant::now() + timeout;
            if hotverbs_softnic::wait_fd_stepping(self.as_raw_fd(), Some(timeout))
                .map_err(|e| Error::new("poll", e.raw_os_error().unwrap_or(libc::EIO)))?
            {
                return Ok(true);
            }
            // The simulated queues went away meanwhile: wait the rest as usual.
            let left = deadline.saturating_duration_since(Instant::now());
            return poll_readable(self.as_fd(), left);
        }
        poll_readable(self.as_fd(), timeout)
    }

    /// `ibv_destroy_comp_channel(3)` now, returning its error (`EBUSY` while CQs use it).
    pub fn destroy(self) -> Result<()> {
        let mut inner = Arc::try_unwrap(self.inner).map_err(|_| {
            Error::new("ibv_destroy_comp_channel", libc::EBUSY)
                .with_hint("CQs created on this channel (or clones of it) are still alive")
        })?;
        inner.destroy()
    }
}

/// `poll(2)` for readability with a timeout; Ok(false) on timeout.
pub(crate) fn poll_readable(fd: BorrowedFd<'_>, timeout: Duration) -> Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 {
            return Ok(true);
        }
        if n == 0 {
            return Ok(false);
        }
        let e = hotverbs_ffi::errno();
        if e != libc::EINTR {
            return Err(Error::new("poll", e));
        }
    }
}

/// Sets or clears `O_NONBLOCK` on an event fd (completion channel, async events, rdma_cm
/// event channel): `fcntl(2)` `F_GETFL` then `F_SETFL`, skipped when already so.
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>, nonblocking: bool) -> Result<()> {
    // SAFETY: F_GETFL on an fd that is open for the borrow; no pointers involved.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(Error::new("fcntl(F_GETFL)", hotverbs_ffi::errno()));
    }
    let want = if nonblocking {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    if want == flags {
        return Ok(());
    }
    // SAFETY: F_SETFL with an int argument on an fd that is open for the borrow.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, want) } < 0 {
        return Err(Error::new(
            "fcntl(F_SETFL, O_NONBLOCK)",
            hotverbs_ffi::errno(),
        ));
    }
    Ok(())
}

pub(crate) struct CqInner {
    ctx: Context,
    /// Held so the channel outlives the CQ (libibverbs: EBUSY otherwise).
    _channel: Option<Arc<ChanInner>>,
    cq: *mut ibv_cq,
    /// The same CQ as an `ibv_cq_ex` when made by `ibv_create_cq_ex`, else null.
    cq_ex: *mut ibv_cq_ex,
    /// The fields its extended completions carry ([`CqBuilder::wc_fields`]); empty for a
    /// CQ from `ibv_create_cq`.
    wc_fields: WcFields,
    /// The parent domain it was made in (held so it outlives the CQ).
    _parent_domain: Option<Pd>,
    /// For a CQ the provider may leave unlocked (a thread domain, or
    /// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`): serialises [`Cq::poll`] and
    /// [`Cq::req_notify`], which safe code may call from several threads at once.
    serial: Option<std::sync::Mutex<()>>,
    /// The event word and user context (module invariants): from `Box::leak`, freed only
    /// after a successful destroy.
    events: NonNull<CqWord>,
    /// [`CqOptions::comp_vector`].
    comp_vector: u32,
    /// The safe bridge's bookkeeping: ring ids, reserved capacity, the poller.
    pub(crate) rings: crate::bridge::CqRings,
}

// SAFETY: CQ verbs are thread-safe; polling from several threads at once is the caller's
// business (the datapath is single-owner), the setup layer only polls through &self
// which libibverbs providers lock internally. The event word is only accessed atomically.
unsafe impl Send for CqInner {}
// SAFETY: see Send.
unsafe impl Sync for CqInner {}

impl CqInner {
    /// The event word.
    fn events(&self) -> &AtomicU64 {
        &self.word().events
    }

    /// The CQ's [`CqWord`].
    fn word(&self) -> &CqWord {
        // SAFETY: allocated in create_cq and freed only by `destroy` after the CQ is gone,
        // which happens at most once, from `&mut self` (no `&self` borrow is alive then).
        unsafe { self.events.as_ref() }
    }

    fn destroy(&mut self) -> Result<()> {
        let cq = std::mem::replace(&mut self.cq, std::ptr::null_mut());
        if cq.is_null() {
            return Ok(());
        }
        // From here every get_cq_event for this CQ acknowledges its event itself; the ones
        // counted before are ours to acknowledge. AcqRel: pairs with get_cq_event's
        // fetch_add (module invariants).
        let counted = self.events().fetch_or(DYING, Ordering::AcqRel) & !DYING;
        // SAFETY: live CQ; `counted` events were taken for it and not acknowledged.
        unsafe { ack_cq_events(&self.ctx, cq, counted) };
        let f = self
            .ctx
            .fns()
            .ibv_destroy_cq
            .ok_or_else(|| Error::missing("ibv_destroy_cq"))?;
        // SAFETY: cq came from this table; no QP uses it any more (they hold Arcs of us).
        // It returns once every event taken for the CQ is acknowledged (libibverbs, softnic).
        let ret = unsafe { f(cq) };
        if ret != 0 {
            // The CQ lives on, and with it the word its cq_context points to: leaked (as
            // are the error paths above), never freed while the CQ may report events.
            return Err(Error::from_ret("ibv_destroy_cq", ret));
        }
        // SAFETY: the CQ is destroyed: no new event can name the word, and every
        // get_cq_event that counted into it is done with it (module invariants). It came
        // from Box::leak in create_cq and is freed once (cq is now null).
        drop(unsafe { Box::from_raw(self.events.as_ptr()) });
        Ok(())
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            record_drop_error(e);
        }
    }
}

/// A completion queue (`struct ibv_cq`).
///
/// Cheap to clone; QPs that use it keep it alive. For the hot path, hand
/// [`as_raw`](Self::as_raw) to the datapath's poller; [`poll`](Self::poll) and
/// [`wait_one`](Self::wait_one) are for setup code, tests and examples.
///
/// # Example
/// ```
/// let ctx = hotverbs::Context::open("softnic")?;
/// let cq = ctx.create_cq(64, None)?;
/// assert!(cq.capacity() >= 64);
/// let mut wcs = [hotverbs::Wc::default(); 8];
/// assert_eq!(cq.poll(&mut wcs)?, 0);
/// # Ok::<(), hotverbs::Error>(())
/// ```
///
/// # References
/// `ibv_create_cq(3)`, `ibv_poll_cq(3)`, `ibv_req_notify_cq(3)`
#[derive(Clone)]
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
}

impl fmt::Debug for Cq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cq")
            .field("handle", &self.inner.cq)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl Cq {
    /// The raw `ibv_cq` for the datapath.
    ///
    /// # Safety contract for users of the pointer
    /// Valid while this `Cq` (or a clone, or a QP using it) lives. Polling it from the
    /// datapath while also calling [`Cq::poll`] from another thread is a data race on the
    /// provider's CQ state unless the provider locks (libibverbs providers do; the
    /// datapath should be the only poller).
    pub fn as_raw(&self) -> *mut ibv_cq {
        self.inner.cq
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The raw `ibv_cq_ex` of a CQ made by [`CqBuilder`] (`ibv_create_cq_ex`), for
    /// `ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll` and the `ibv_wc_read_*` readers
    /// of its [`wc_fields`](Self::wc_fields); `None` for a CQ from `ibv_create_cq`.
    /// [`as_raw`](Self::as_raw) is the same CQ as an `ibv_cq` (`ibv_cq_ex_to_cq`).
    ///
    /// Same validity and single-poller contract as [`as_raw`](Self::as_raw); reading a
    /// field that was not requested is undefined (providers leave its reader NULL).
    ///
    /// # References
    /// `ibv_create_cq_ex(3)`
    pub fn as_cq_ex(&self) -> Option<*mut ibv_cq_ex> {
        (!self.inner.cq_ex.is_null()).then_some(self.inner.cq_ex)
    }

    /// The completion fields of an extended CQ ([`CqBuilder::wc_fields`]); empty for a CQ
    /// from `ibv_create_cq` (whose `ibv_wc`s of [`poll`](Self::poll) have every standard
    /// field).
    ///
    /// # References
    /// `ibv_create_cq_ex(3)`
    pub fn wc_fields(&self) -> WcFields {
        self.inner.wc_fields
    }

    /// Actual number of entries (`cq->cqe`; at least what was asked).
    pub fn capacity(&self) -> u32 {
        // SAFETY: live CQ.
        unsafe { (*self.inner.cq).cqe.max(0) as u32 }
    }

    /// The [`CqOptions::user_context`] it was created with (0 by default), as its events
    /// carry it ([`CqEvent::user_context`]).
    pub fn user_context(&self) -> u64 {
        self.inner.word().user_context
    }

    /// The completion vector it signals on ([`CqOptions::comp_vector`]).
    pub fn comp_vector(&self) -> u32 {
        self.inner.comp_vector
    }

    /// `ibv_poll_cq(3)` into `wcs`; returns how many were written.
    ///
    /// # Errors
    /// `ibv_poll_cq: EBUSY` while a datapath poller polls the CQ, while bridge rings
    /// complete on it (their completions are theirs: poll with [`Cq::poller`] and hand each
    /// to its ring), and for good once the CQ was handed to the mlx5 direct path
    /// ([`Cq::direct_poller`]); the provider's error.
    pub fn poll(&self, wcs: &mut [Wc]) -> Result<usize> {
        const VERB: &str = "ibv_poll_cq";
        self.inner.rings.refuse_if_direct(VERB)?;
        // Completions of ring WRs belong to their rings: taken here they would never
        // retire (a ring waiting on them waits for ever).
        self.inner.rings.refuse_if_rings(VERB)?;
        // The poller slot for the duration of the poll: a datapath poller cannot be made
        // between the check and the poll (the slot is the check).
        if self.inner.rings.take_poller() {
            return Err(Error::new(VERB, libc::EBUSY).with_hint(
                "a datapath CqPoller polls this CQ: poll through it (one poller per CQ)",
            ));
        }
        let _slot = PollerSlot(&self.inner.rings);
        // Checked again with the slot held: a ring made meanwhile reserved before.
        self.inner.rings.refuse_if_rings(VERB)?;
        let n = i32::try_from(wcs.len()).unwrap_or(i32::MAX);
        let _serial = self.inner.serial.as_ref().map(|m| m.lock());
        // SAFETY: live CQ (serialised above if the provider may not lock it, and no
        // datapath poller exists: the slot is held); Wc is repr(transparent) over ibv_wc
        // so the slice is n writable ibv_wc entries.
        let ret =
            unsafe { hotverbs_ffi::inline::ibv_poll_cq(self.inner.cq, n, wcs.as_mut_ptr().cast()) };
        if ret < 0 {
            return Err(Error::from_ret(VERB, ret).or_hint(|| {
                Some(
                    "the CQ overran (more completions than its capacity) or the device failed"
                        .into(),
                )
            }));
        }
        Ok(ret as usize)
    }

    /// Busy-polls until one completion arrives or `timeout` passes (`ETIMEDOUT`). For
    /// setup, tests and examples; never hangs.
    pub fn wait_one(&self, timeout: Duration) -> Result<Wc> {
        let deadline = Instant::now() + timeout;
        let mut wc = [Wc::default()];
        loop {
            if self.poll(&mut wc)? == 1 {
                return Ok(wc[0]);
            }
            if Instant::now() >= deadline {
                return Err(
                    Error::new("ibv_poll_cq", libc::ETIMEDOUT).with_hint(format!(
                        "no completion within {timeout:?}: was the WR signaled, the QP in RTS, \
                     the peer's receive posted?"
                    )),
                );
            }
            std::thread::yield_now();
        }
    }

    /// `ibv_req_notify_cq(3)`: arm the CQ so the next completion (only solicited ones if
    /// `solicited_only`) raises an event on its channel. A CQ handed to the mlx5 direct
    /// path ([`Cq::direct_poller`]) is armed as libmlx5 would, from the consumer index the
    /// direct poller keeps (`hotverbs_datapath::mlx5::arm_cq`).
    ///
    /// # Errors
    /// `ibv_req_notify_cq: EBUSY` on a CQ without the provider's lock (a thread domain or
    /// single-threaded CQ) or of the direct path while a datapath poller exists: arm it
    /// with the poller's `req_notify`, in its thread; the provider's errno.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let direct = self.inner.rings.direct_arm().is_some();
        if self.inner.serial.is_none() && !direct {
            // The provider's lock serialises the arm with any poll.
            return self.req_notify_unchecked(solicited_only);
        }
        // Without the provider's lock (or on the direct path, where the consumer index
        // is the direct poller's), arming reads the consumer index the poller's thread
        // writes: only the poller may arm, and no poller may start meanwhile (the slot is
        // held for the arm).
        if self.inner.rings.take_poller() {
            return Err(
                Error::new("ibv_req_notify_cq", libc::EBUSY).with_hint(if direct {
                    "a direct poller polls this CQ, and arming reads the consumer index it \
                 writes: arm it from the poller's thread with poller.req_notify()"
                } else {
                    "this CQ runs without the provider's lock (thread domain or single-threaded) \
                 and a datapath poller polls it: arm it from the poller's thread with \
                 poller.req_notify()"
                }),
            );
        }
        let _slot = PollerSlot(&self.inner.rings);
        self.req_notify_unchecked(solicited_only)
    }

    /// [`req_notify`](Self::req_notify) without the lock-free CQ's poller check: for the
    /// pollers, which hold the CQ's only poller slot.
    pub(crate) fn req_notify_unchecked(&self, solicited_only: bool) -> Result<()> {
        if let Some(arm) = self.inner.rings.direct_arm() {
            // A CQ of the mlx5 direct path: libmlx5's arm would use its own consumer
            // index, which no longer follows the CQ.
            let sn = self.inner.word().arm_sn.load(Ordering::Relaxed);
            // A direct CQ exists only where the doorbell does (Cq::direct_poller).
            let Some(mut db) = hotverbs_datapath::mlx5::Mmio::available() else {
                return Err(crate::direct::no_mmio("ibv_req_notify_cq"));
            };
            // SAFETY: the doorbell record and UAR page mlx5dv_init_obj gave for this live
            // CQ; arming writes only them (as libmlx5's arm does, which we replace).
            unsafe {
                hotverbs_datapath::mlx5::arm_cq(
                    &mut db,
                    arm.dbrec,
                    arm.uar,
                    arm.cqn,
                    sn,
                    solicited_only,
                )
            };
            return Ok(());
        }
        let _serial = self.inner.serial.as_ref().map(|m| m.lock());
        // SAFETY: live CQ (serialised above if the provider may not lock it).
        let ret = unsafe {
            hotverbs_ffi::inline::ibv_req_notify_cq(self.inner.cq, solicited_only as i32)
        };
        if ret != 0 {
            return Err(Error::from_ret("ibv_req_notify_cq", ret));
        }
        Ok(())
    }

    /// `ibv_ack_cq_events(3)`: acknowledge `n` events taken from the channel for this CQ.
    /// Acknowledging more than were taken is clamped.
    pub fn ack_events(&self, n: u32) {
        // DYING is never set while a Cq exists (it is set by the last one's destruction),
        // so the word is just the count here.
        let word = self.inner.events();
        let mut counted = word.load(Ordering::Relaxed);
        let n = loop {
            let n = counted.min(n.into());
            match word.compare_exchange_weak(
                counted,
                counted - n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break n,
                Err(now) => counted = now,
            }
        };
        // SAFETY: live CQ; n events were taken for it and not yet acked.
        unsafe { ack_cq_events(&self.inner.ctx, self.inner.cq, n) };
    }

    /// Events taken from the channel for this CQ and not yet acknowledged (saturated at
    /// `u32::MAX`).
    pub fn unacked_events(&self) -> u32 {
        let n = self.inner.events().load(Ordering::Relaxed) & !DYING;
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// `ibv_destroy_cq(3)` now, returning its error (`EBUSY` while QPs or clones use it).
    /// Events taken through [`CompChannel::get_cq_event`] and not acknowledged are
    /// acknowledged first. Like the verb, it blocks while an event taken for this CQ with
    /// the raw `ibv_get_cq_event` is unacknowledged. On failure the CQ is leaked, never
    /// half-freed.
    pub fn destroy(self) -> Result<()> {
        let mut inner = Arc::try_unwrap(self.inner).map_err(|_| {
            Error::new("ibv_destroy_cq", libc::EBUSY)
                .with_hint("QPs using this CQ (or clones of it) are still alive")
        })?;
        inner.destroy()
    }
}

/// A work completion (`struct ibv_wc`), `repr(transparent)` so slices of it are what
/// `ibv_poll_cq` fills. Its status is the datapath's [`WcError`](crate::WcError), the one
/// completion-status type of both layers; the raw struct is behind
/// [`as_raw`](Self::as_raw) / [`from_raw`](Self::from_raw).
///
/// # Example
/// ```
/// let wc = hotverbs::Wc::default();
/// assert!(wc.is_ok());
/// assert_eq!(wc.status(), Ok(()));
/// assert_eq!(wc.status_name(), "IBV_WC_SUCCESS");
/// ```
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Wc(ibv_wc);

impl Default for Wc {
    fn default() -> Self {
        // SAFETY: ibv_wc is plain C data; all-zero is valid.
        Wc(unsafe { crate::zeroed() })
    }
}

impl Wc {
    /// The WR id given at post time.
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }
    /// The raw `struct ibv_wc`.
    pub fn as_raw(&self) -> &ibv_wc {
        &self.0
    }
    /// Wraps a raw `struct ibv_wc` (a setup-layer completion is informational: nothing
    /// retires work or frees memory on its word).
    pub fn from_raw(wc: ibv_wc) -> Wc {
        Wc(wc)
    }
    /// `Ok` for `IBV_WC_SUCCESS`, else the named error (the datapath's type).
    pub fn status(&self) -> std::result::Result<(), crate::WcError> {
        match crate::WcError::from_status(self.0.status) {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
    /// The raw `IBV_WC_*` status.
    pub fn status_raw(&self) -> u32 {
        self.0.status
    }
    /// Status name, e.g. `IBV_WC_REM_ACCESS_ERR`.
    pub fn status_name(&self) -> &'static str {
        hotverbs_ffi::wc_status_name(self.0.status)
    }
    /// Success?
    pub fn is_ok(&self) -> bool {
        self.0.status == hotverbs_ffi::IBV_WC_SUCCESS
    }
    /// `IBV_WC_SEND`, `IBV_WC_RECV`, ... (valid only on success).
    pub fn opcode(&self) -> u32 {
        self.0.opcode
    }
    /// The name of [`opcode`](Self::opcode) (`"IBV_WC_RECV_RDMA_WITH_IMM"`); as the
    /// opcode, meaningful on a successful completion only.
    pub fn opcode_name(&self) -> &'static str {
        hotverbs_ffi::wc_opcode_name(self.0.opcode)
    }
    /// Bytes received (receives) or transferred.
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }
    /// Immediate data (host order), if the completion carries one.
    pub fn imm_data(&self) -> Option<u32> {
        if self.0.wc_flags & hotverbs_ffi::IBV_WC_WITH_IMM != 0 {
            // SAFETY: WITH_IMM says the union holds imm_data.
            Some(u32::from_be(unsafe { self.0.__bindgen_anon_1.imm_data }))
        } else {
            None
        }
    }
    /// Local QP number.
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }
    /// Source QP (UD receives).
    pub fn src_qp(&self) -> u32 {
        self.0.src_qp
    }
    /// Source LID (UD receives).
    pub fn slid(&self) -> u16 {
        self.0.slid
    }
    /// Carries a GRH in the first 40 bytes of the receive buffer (UD)?
    pub fn has_grh(&self) -> bool {
        self.0.wc_flags & hotverbs_ffi::IBV_WC_GRH != 0
    }
    /// `Ok(self)` on success, else an error naming the status.
    pub fn ok(self) -> Result<Wc> {
        if self.is_ok() {
            return Ok(self);
        }
        Err(Error::new("ibv_poll_cq", libc::EIO).with_hint(format!(
            "{} (wr_id {}, vendor_err {:#x}){}",
            self.status_name(),
            self.wr_id(),
            self.0.vendor_err,
            wc_hint(self.0.status)
        )))
    }
}

fn wc_hint(status: u32) -> &'static str {
    match status {
        hotverbs_ffi::IBV_WC_REM_ACCESS_ERR => {
            ": the remote MR lacks the access flag, or addr/len/rkey are outside it"
        }
        hotverbs_ffi::IBV_WC_LOC_PROT_ERR => ": an SGE's lkey/addr/len is outside its MR",
        hotverbs_ffi::IBV_WC_LOC_LEN_ERR => ": the receive buffer is smaller than the message",
        hotverbs_ffi::IBV_WC_RNR_RETRY_EXC_ERR => ": the peer had no receive posted",
        hotverbs_ffi::IBV_WC_RETRY_EXC_ERR => {
            ": the peer did not answer (wrong LID/GID/QPN, or it is down)"
        }
        hotverbs_ffi::IBV_WC_WR_FLUSH_ERR => {
            ": the QP is in the error state; earlier completion has the cause"
        }
        _ => "",
    }
}

impl fmt::Debug for Wc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wc")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status_name())
            .field("opcode", &self.opcode_name())
            .field("byte_len", &self.byte_len())
            .field("qp_num", &self.qp_num())
            .finish_non_exhaustive()
    }
}

/// What an asynchronous event is about.
///
/// # Example
/// ```
/// use hotverbs::{AsyncElement, AsyncEvent};
/// fn describe(ev: &AsyncEvent) -> String {
///     match ev.element {
///         AsyncElement::Qp { qp_num, .. } => format!("{} on QP {qp_num:#x}", ev.name),
///         AsyncElement::Port(p) => format!("{} on port {p}", ev.name),
///         _ => ev.name.to_string(),
///     }
/// }
/// # let _ = describe;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncElement {
    /// A CQ (raw pointer, for identification only).
    Cq(*mut ibv_cq),
    /// A QP, with its number.
    Qp {
        /// The raw QP (identification only; it may be destroyed by now).
        qp: *mut hotverbs_ffi::ibv_qp,
        /// Its QP number.
        qp_num: u32,
    },
    /// An SRQ.
    Srq(*mut hotverbs_ffi::ibv_srq),
    /// A port.
    Port(u8),
    /// The whole device.
    Device,
}

/// An asynchronous event (`struct ibv_async_event`), already acknowledged; its element is
/// copied out.
///
/// # Example
/// ```
/// use std::time::Duration;
/// let ctx = hotverbs::Context::open("softnic")?;
/// // Nothing happened: no event.
/// assert!(ctx.wait_async_event(Duration::from_millis(5))?.is_none());
/// assert_eq!(hotverbs::async_event_name(hotverbs_ffi::IBV_EVENT_QP_FATAL), "IBV_EVENT_QP_FATAL");
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AsyncEvent {
    /// `IBV_EVENT_*`.
    pub event_type: u32,
    /// Its name, e.g. `IBV_EVENT_QP_FATAL`.
    pub name: &'static str,
    /// What it is about.
    pub element: AsyncElement,
}

/// The name of an `ibv_event_type` (as `ibv_event_type_str(3)` would describe it).
pub fn async_event_name(t: u32) -> &'static str {
    use hotverbs_ffi::*;
    match t {
        IBV_EVENT_CQ_ERR => "IBV_EVENT_CQ_ERR",
        IBV_EVENT_QP_FATAL => "IBV_EVENT_QP_FATAL",
        IBV_EVENT_QP_REQ_ERR => "IBV_EVENT_QP_REQ_ERR",
        IBV_EVENT_QP_ACCESS_ERR => "IBV_EVENT_QP_ACCESS_ERR",
        IBV_EVENT_COMM_EST => "IBV_EVENT_COMM_EST",
        IBV_EVENT_SQ_DRAINED => "IBV_EVENT_SQ_DRAINED",
        IBV_EVENT_PATH_MIG => "IBV_EVENT_PATH_MIG",
        IBV_EVENT_PATH_MIG_ERR => "IBV_EVENT_PATH_MIG_ERR",
        IBV_EVENT_DEVICE_FATAL => "IBV_EVENT_DEVICE_FATAL",
        IBV_EVENT_PORT_ACTIVE => "IBV_EVENT_PORT_ACTIVE",
        IBV_EVENT_PORT_ERR => "IBV_EVENT_PORT_ERR",
        IBV_EVENT_LID_CHANGE => "IBV_EVENT_LID_CHANGE",
        IBV_EVENT_PKEY_CHANGE => "IBV_EVENT_PKEY_CHANGE",
        IBV_EVENT_SM_CHANGE => "IBV_EVENT_SM_CHANGE",
        IBV_EVENT_SRQ_ERR => "IBV_EVENT_SRQ_ERR",
        IBV_EVENT_SRQ_LIMIT_REACHED => "IBV_EVENT_SRQ_LIMIT_REACHED",
        IBV_EVENT_QP_LAST_WQE_REACHED => "IBV_EVENT_QP_LAST_WQE_REACHED",
        IBV_EVENT_CLIENT_REREGISTER => "IBV_EVENT_CLIENT_REREGISTER",
        IBV_EVENT_GID_CHANGE => "IBV_EVENT_GID_CHANGE",
        IBV_EVENT_WQ_FATAL => "IBV_EVENT_WQ_FATAL",
        _ => "IBV_EVENT_<unknown>",
    }
}

impl Context {
    /// `ibv_get_async_event(3)` + `ibv_ack_async_event(3)`: blocks for the next
    /// asynchronous event and acknowledges it.
    pub fn get_async_event(&self) -> Result<AsyncEvent> {
        let get = self
            .fns()
            .ibv_get_async_event
            .ok_or_else(|| Error::missing("ibv_get_async_event"))?;
        // SAFETY: plain C data.
        let mut ev: hotverbs_ffi::ibv_async_event = unsafe { crate::zeroed() };
        // SAFETY: live context, writable event.
        let ret = unsafe { get(self.as_raw(), &mut ev) };
        if ret != 0 {
            return Err(Error::from_ret("ibv_get_async_event", ret));
        }
        use hotverbs_ffi::*;
        // SAFETY: the event type says which union member is valid; for QP events the QP is
        // live until we ack (libibverbs' destroy waits for the ack).
        let element = unsafe {
            match ev.event_type {
                IBV_EVENT_CQ_ERR => AsyncElement::Cq(ev.element.cq),
                IBV_EVENT_QP_FATAL
                | IBV_EVENT_QP_REQ_ERR
                | IBV_EVENT_QP_ACCESS_ERR
                | IBV_EVENT_COMM_EST
                | IBV_EVENT_SQ_DRAINED
                | IBV_EVENT_PATH_MIG
                | IBV_EVENT_PATH_MIG_ERR
                | IBV_EVENT_QP_LAST_WQE_REACHED => AsyncElement::Qp {
                    qp: ev.element.qp,
                    qp_num: if ev.element.qp.is_null() {
                        0
                    } else {
                        (*ev.element.qp).qp_num
                    },
                },
                IBV_EVENT_SRQ_ERR | IBV_EVENT_SRQ_LIMIT_REACHED => {
                    AsyncElement::Srq(ev.element.srq)
                }
                IBV_EVENT_PORT_ACTIVE
                | IBV_EVENT_PORT_ERR
                | IBV_EVENT_LID_CHANGE
                | IBV_EVENT_PKEY_CHANGE
                | IBV_EVENT_SM_CHANGE
                | IBV_EVENT_CLIENT_REREGISTER
                | IBV_EVENT_GID_CHANGE => AsyncElement::Port(ev.element.port_num as u8),
                _ => AsyncElement::Device,
            }
        };
        if let Some(ack) = self.fns().ibv_ack_async_event {
            // SAFETY: the event was just returned by ibv_get_async_event and is acked once.
            unsafe { ack(&mut ev) };
        }
        Ok(AsyncEvent {
            event_type: ev.event_type,
            name: async_event_name(ev.event_type),
            element,
        })
    }

    /// The context's asynchronous-event fd (`ibv_context.async_fd`) as an [`AsyncEvents`]
    /// handle: [`AsFd`]/[`AsRawFd`] for `epoll` or an async runtime, and
    /// [`get`](AsyncEvents::get)/[`wait`](AsyncEvents::wait) for the events.
    ///
    /// # Errors
    /// `EBADF` when the provider opened the context without an async fd.
    pub fn async_events(&self) -> Result<AsyncEvents> {
        // SAFETY: live context; `async_fd` is set when the context is opened and never
        // written afterwards.
        if unsafe { (*self.as_raw()).async_fd } < 0 {
            return Err(Error::new("ibv_get_async_event", libc::EBADF)
                .with_hint("the device context has no async event fd"));
        }
        Ok(AsyncEvents { ctx: self.clone() })
    }

    /// Waits up to `timeout` for an asynchronous event (`poll(2)` on the async fd).
    /// `Ok(None)` on timeout: never hangs.
    pub fn wait_async_event(&self, timeout: Duration) -> Result<Option<AsyncEvent>> {
        self.async_events()?.wait(timeout)
    }
}

/// A context's asynchronous-event fd (`ibv_context.async_fd`, readable while an
/// `ibv_get_async_event(3)` event is pending), from [`Context::async_events`].
///
/// Why a handle rather than `AsFd for Context`: a context owns two fds (`cmd_fd`, the
/// device's command fd, and `async_fd`), and a context is used for many things besides
/// events, so `ctx.as_fd()` would not say which fd it is. `ctx.async_events().as_fd()`
/// does. The handle holds a clone of the [`Context`] (one `Arc`), so it is `'static` and
/// can move into a spawned task with tokio's `AsyncFd`, and the fd stays open while it
/// lives.
///
/// # Example
/// ```
/// use std::os::fd::{AsFd, AsRawFd};
/// use std::time::Duration;
/// let ctx = hotverbs::Context::open("softnic")?;
/// let events = ctx.async_events()?;
/// assert!(events.as_raw_fd() >= 0);
/// assert_eq!(events.as_fd().as_raw_fd(), events.as_raw_fd());
/// // Nothing happened: no event.
/// assert!(events.wait(Duration::from_millis(5))?.is_none());
/// events.set_nonblocking(true)?;
/// assert_eq!(events.get().unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
/// # Ok::<(), hotverbs::Error>(())
/// ```
///
/// # References
/// `ibv_get_async_event(3)`
#[derive(Clone, Debug)]
pub struct AsyncEvents {
    ctx: Context,
}

impl AsyncEvents {
    /// The context the events are of.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// [`Context::get_async_event`]: the next event, acknowledged. Blocks, unless the fd
    /// was made non-blocking ([`set_nonblocking`](Self::set_nonblocking)): then `EAGAIN`
    /// (kind `WouldBlock`) when none is pending.
    pub fn get(&self) -> Result<AsyncEvent> {
        self.ctx.get_async_event()
    }

    /// Waits up to `timeout` for the next event (`poll(2)` on the fd). `Ok(None)` on
    /// timeout; on a non-blocking fd, an event another thread took first means waiting on.
    pub fn wait(&self, timeout: Duration) -> Result<Option<AsyncEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if !poll_readable(self.as_fd(), left)
                .map_err(|e| e.with_hint("poll on the async event fd"))?
            {
                return Ok(None);
            }
            match self.get() {
                Err(e) if e.errno() == libc::EAGAIN && !left.is_zero() => continue,
                Err(e) if e.errno() == libc::EAGAIN => return Ok(None),
                r => return r.map(Some),
            }
        }
    }

    /// Puts the fd in non-blocking mode (`O_NONBLOCK`) or back, as
    /// [`CompChannel::set_nonblocking`] does for a channel: needed under a readiness-based
    /// waiter such as tokio's `AsyncFd`. The flag is the context's: it applies to every
    /// handle and to [`Context::get_async_event`].
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        set_nonblocking(self.as_fd(), nonblocking)
    }
}

/// The context's async event fd; open as long as the context (which this handle keeps
/// alive). Non-negative (checked by [`Context::async_events`]).
impl AsRawFd for AsyncEvents {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: live context (we hold a clone); `async_fd` is never written after open.
        unsafe { (*self.ctx.as_raw()).async_fd }
    }
}

/// The context's async event fd as a [`BorrowedFd`].
impl AsFd for AsyncEvents {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: not -1 (checked in `Context::async_events`); closed only by
        // `ibv_close_device`, after the last clone of the context, one of which we hold for
        // at least the borrow of self.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

/// The poller slot held by a verb on the CQ for its duration ([`Cq::poll`],
/// [`Cq::req_notify`]): released on drop.
struct PollerSlot<'a>(&'a crate::bridge::CqRings);

impl Drop for PollerSlot<'_> {
    fn drop(&mut self) {
        self.0.release_poller();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_fields_are_named_with_the_device() {
        assert_eq!(
            refused_fields_hint(WcFields::COMPLETION_TIMESTAMP, "rxe0"),
            "completion timestamps are not supported by device rxe0: leave \
             WcFields::COMPLETION_TIMESTAMP out (check \
             Context::supports_completion_timestamps() first)"
        );
        assert_eq!(
            refused_fields_hint(WcFields::FLOW_TAG, "softnic"),
            "completion field FLOW_TAG is not supported by device softnic: leave \
             WcFields::FLOW_TAG out"
        );
        let h = refused_fields_hint(
            WcFields::CVLAN | WcFields::COMPLETION_TIMESTAMP_WALLCLOCK,
            "mlx5_0",
        );
        assert_eq!(
            h,
            "completion field CVLAN and wall-clock completion timestamps are not supported \
             by device mlx5_0: leave WcFields::CVLAN | WcFields::COMPLETION_TIMESTAMP_WALLCLOCK \
             out (check Context::supports_completion_timestamps() first)"
        );
    }

    #[test]
    fn wc_fields_mirror_the_header() {
        assert_eq!(
            WcFields::STANDARD,
            WcFields::BYTE_LEN
                | WcFields::IMM
                | WcFields::QP_NUM
                | WcFields::SRC_QP
                | WcFields::SLID
                | WcFields::SL
                | WcFields::DLID_PATH_BITS
        );
        assert_eq!(WcFields::COMPLETION_TIMESTAMP_WALLCLOCK.bits(), 1 << 11);
        // Iterating yields single fields only (STANDARD is a union, not a field).
        assert_eq!(WcFields::STANDARD.iter().count(), 7);
    }
}
