//! The rdma_cm path (librdmacm, loaded at run time): event channel, IDs, address and
//! route resolution, a typed [`Qp`] on the ID, connect/accept, disconnect — with every
//! event surfaced by name (`RDMA_CM_EVENT_ESTABLISHED`).
//!
//! librdmacm opens its own device contexts; [`CmId::context`] wraps the ID's context (not
//! owned by us) so the ordinary [`Pd`](crate::Pd)/[`Cq`](crate::Cq) types work on it, and
//! [`CmId::create_qp`] takes the same [`QpBuilder`] as `ibv_create_qp` (caps, inline
//! data, `sq_sig_all`, SRQ). rdma_cm needs a real device with an IP address: softnic has
//! no rdma_cm.
//!
//! Port spaces ([`PortSpace`]): an ID in `RDMA_PS_TCP` ([`CmId::new`]) connects RC QPs
//! with CM REQ/REP; one in `RDMA_PS_UDP` ([`CmId::with_port_space`]) carries a UD QP and
//! "connects" by service ID resolution (SIDR), which hands the client the server's QPN,
//! Q_Key and address ([`CmId::connect_ud`]), or joins multicast groups
//! ([`CmId::join_multicast`]: the ID's UD QP receives the group, and the join returns the
//! address that sends to it). UC has no rdma_cm port space here and is refused.
//!
//! Invariants: a [`CmId`] holds its [`EventChannel`] (the channel outlives its IDs) and
//! owns the [`Qp`] made on it, which holds its PD and CQs; the QP is destroyed
//! (`rdma_destroy_qp`, by the `Qp`'s destroy) before the ID (`rdma_destroy_id`), and
//! callers only ever borrow it ([`CmId::qp`]), so it cannot outlive the ID.
//!
//! # Events on a shared channel
//!
//! Several IDs may share one [`EventChannel`] (an ID made by [`CmId::get_request`] always
//! shares its listener's), and each event belongs to one of them: `rdma_cm_event.id`, or
//! for `RDMA_CM_EVENT_CONNECT_REQUEST` the listener, `listen_id`. A [`CmId`] that waits
//! (`connect`, `accept`, `get_request`, `join_multicast`, ...) takes only its own events:
//! an event it reads for another live ID is *parked* on the channel for that ID, which
//! finds it there when it next waits; an event of an ID no [`CmId`] holds any more is
//! dropped, and for a connect request its new ID is refused (`rdma_reject(3)`) and
//! destroyed, never leaked. One waiter at a time reads the channel; the others wait for it
//! to park their event or give the reading up, each until its own deadline: a timeout
//! bounds the whole wait, however many other IDs' events arrive meanwhile.
//!
//! Invariants of that routing, which hold the raw pointers in it to their meaning:
//! - Every event is copied out (private data included) and acknowledged
//!   (`rdma_ack_cm_event(3)`) right after it is read and routed, so no unacknowledged
//!   event ever blocks `rdma_destroy_id` or `rdma_leave_multicast`, and none is acked
//!   twice (the read, the routing and the ack are one reader's, holding the reading role).
//! - An ID is keyed by its address. An event is routed *before* it is acknowledged, and
//!   librdmacm frees an ID only after every event of it that was read is acknowledged, so
//!   the ID an event names is not freed (and its address not reused) while the event is
//!   routed. A [`CmId`] leaves the routing table, dropping what was parked for it, before
//!   `rdma_destroy_id`: a later ID at the same address never receives an older ID's event.
//! - A parked connect request owns its new ID until its listener takes it (then a
//!   [`CmId`] owns it) or is dropped (then it is refused and destroyed).
//! - The routing table's lock is never held across a librdmacm call that can block.
//!
//! # Example (needs an RDMA device with an IP; prints why not otherwise)
//! ```no_run
//! use std::time::Duration;
//! use hotverbs::cm::{CmId, ConnParam, EventChannel};
//! use hotverbs::{CqOptions, QpBuilder, QpType};
//! let t = Duration::from_secs(5);
//! let ch = EventChannel::new()?;
//! let mut id = CmId::new(&ch)?;
//! id.resolve_addr(None, "10.77.0.1:7471".parse().unwrap(), t)?;
//! id.resolve_route(t)?;
//! let ctx = id.context()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq_with(64, None, CqOptions { comp_vector: 0, user_context: 7 })?;
//! let qp = id.create_qp(
//!     QpBuilder::new(&pd, &cq, &cq, QpType::Rc).max_send_wr(16).max_inline_data(64),
//! )?;
//! assert!(qp.cap().max_inline_data >= 64);
//! id.connect(&ConnParam::default(), t)?;
//! id.disconnect()?;
//! # Ok::<(), hotverbs::Error>(())
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use hotverbs_ffi::{
    ibv_qp, rdma_cm_event, rdma_cm_id, rdma_conn_param, rdma_event_channel, RdmaCmFns,
};

use crate::ah::AhAttr;
use crate::cq::{poll_readable, set_nonblocking};
use crate::device::Context;
use crate::error::{record_drop_error, Error, Result};
use crate::qp::{Qp, QpBuilder, QpDestroy, QpType};

mod router;
use router::{EventSource, Router, Taker};

fn cm() -> Result<&'static RdmaCmFns> {
    hotverbs_ffi::rdmacm()
        .map_err(|e| Error::new("rdma_create_event_channel", libc::ENOSYS).with_hint(e.to_string()))
}

/// The name of an `rdma_cm_event_type`, as `rdma_event_str(3)` gives it.
///
/// # Example
/// ```
/// assert_eq!(hotverbs::cm::event_name(hotverbs_ffi::RDMA_CM_EVENT_ESTABLISHED),
///            "RDMA_CM_EVENT_ESTABLISHED");
/// ```
pub fn event_name(t: u32) -> &'static str {
    use hotverbs_ffi::*;
    match t {
        RDMA_CM_EVENT_ADDR_RESOLVED => "RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => "RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => "RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => "RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => "RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => "RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => "RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => "RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => "RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => "RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => "RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => "RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => "RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => "RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => "RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => "RDMA_CM_EVENT_<unknown>",
    }
}

struct ChannelInner {
    fns: &'static RdmaCmFns,
    ch: *mut rdma_event_channel,
    /// Which IDs live on the channel and the events parked for them (module docs).
    router: Router<Parked>,
}

// SAFETY: an event channel is an fd; librdmacm's calls on it are thread-safe; the router
// is behind its own lock.
unsafe impl Send for ChannelInner {}
// SAFETY: see Send.
unsafe impl Sync for ChannelInner {}

impl ChannelInner {
    fn new(fns: &'static RdmaCmFns, ch: *mut rdma_event_channel) -> ChannelInner {
        ChannelInner {
            fns,
            ch,
            router: Router::new(),
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: live channel while self lives; librdmacm never writes `fd` after creation;
        // not -1 (checked in `EventChannel::new`), open until the channel is destroyed.
        unsafe { BorrowedFd::borrow_raw((*self.ch).fd) }
    }
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // Every CmId on the channel is gone (each holds an Arc of us) and took its parked
        // events with it; whatever is left (nothing, today) still owns new IDs to refuse
        // before their channel goes.
        for ev in self.router.drain() {
            self.discard(ev);
        }
        if let Some(f) = self.fns.rdma_destroy_event_channel {
            // SAFETY: ch came from rdma_create_event_channel; every ID on it is destroyed
            // (they hold Arcs of us).
            unsafe { f(self.ch) };
        }
    }
}

/// An rdma_cm event channel (`rdma_create_event_channel(3)`); its fd ([`AsFd`],
/// [`AsRawFd`]) can go into epoll or an async runtime's fd wrapper (after
/// [`set_nonblocking`](Self::set_nonblocking)).
///
/// # Example
/// ```
/// use std::os::fd::AsRawFd;
/// match hotverbs::cm::EventChannel::new() {
///     Ok(ch) => assert!(ch.as_raw_fd() >= 0),
///     Err(e) => println!("no rdma_cm here: {e}"),
/// }
/// ```
#[derive(Clone)]
pub struct EventChannel {
    inner: Arc<ChannelInner>,
}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

/// An rdma_cm event, copied out and already acknowledged.
///
/// # Example
/// ```no_run
/// # let ch = hotverbs::cm::EventChannel::new()?;
/// let ev = ch.get_event(std::time::Duration::from_secs(1))?;
/// println!("{} status {}", ev.name, ev.status);
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CmEvent {
    /// `RDMA_CM_EVENT_*`.
    pub kind: u32,
    /// Its name, e.g. `RDMA_CM_EVENT_ESTABLISHED`.
    pub name: &'static str,
    /// The event's status (negative errno for errors, reject reason for REJECTED).
    pub status: i32,
    /// The ID it is about (for CONNECT_REQUEST: the new ID of the incoming connection).
    pub id: *mut rdma_cm_id,
    /// The listening ID (CONNECT_REQUEST only).
    pub listen_id: *mut rdma_cm_id,
    /// Private data the peer sent with connect/accept.
    pub private_data: Vec<u8>,
    /// On a UD ID's `RDMA_CM_EVENT_ESTABLISHED` (the client's end of SIDR): where the
    /// server's QP is. `None` otherwise.
    pub ud: Option<UdParam>,
}

/// The peer of a UD ID, as service ID resolution (SIDR) reports it: the remote QPN and
/// Q_Key a datagram must carry and the address to reach it (make an [`Ah`](crate::Ah)
/// from it with [`Pd::create_ah`](crate::Pd::create_ah)).
///
/// # Example
/// ```no_run
/// # use std::time::Duration;
/// # use hotverbs::cm::{CmId, ConnParam, EventChannel, PortSpace};
/// # let (ch, t) = (EventChannel::new()?, Duration::from_secs(5));
/// # let id = CmId::with_port_space(&ch, PortSpace::Udp)?;
/// # let pd = id.context()?.alloc_pd()?;
/// let (peer, _private) = id.connect_ud(&ConnParam::default(), t)?;
/// let ah = pd.create_ah(&peer.ah)?;
/// // post UD sends with `ah`, `peer.qp_num`, `peer.qkey`
/// # let _ = ah;
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UdParam {
    /// The remote QP number.
    pub qp_num: u32,
    /// The Q_Key the remote QP accepts (`RDMA_UDP_QKEY` for rdma_cm's UD QPs).
    pub qkey: u32,
    /// The address of the remote port.
    pub ah: AhAttr,
}

impl EventChannel {
    /// `rdma_create_event_channel(3)`.
    ///
    /// # Errors
    /// `ENOSYS` with the loader's message when librdmacm is not installed; the verb's
    /// error otherwise (e.g. no `/dev/infiniband/rdma_cm`).
    pub fn new() -> Result<EventChannel> {
        let fns = cm()?;
        let f = fns
            .rdma_create_event_channel
            .ok_or_else(|| Error::missing("rdma_create_event_channel"))?;
        // SAFETY: no arguments.
        let ch = unsafe { f() };
        if ch.is_null() {
            return Err(
                Error::new("rdma_create_event_channel", hotverbs_ffi::errno()).with_hint(
                    "no usable /dev/infiniband/rdma_cm: no RDMA device, or rdma_ucm not loaded \
                     (`modprobe rdma_ucm`)",
                ),
            );
        }
        let inner = ChannelInner::new(fns, ch);
        // `AsFd` hands out the fd as a `BorrowedFd`, which must not be -1: a channel
        // without one is refused (dropping `inner` destroys it).
        // SAFETY: ch is the live channel just created.
        if unsafe { (*ch).fd } < 0 {
            drop(inner);
            return Err(Error::new("rdma_create_event_channel", libc::EBADF)
                .with_hint("librdmacm returned an event channel without an fd"));
        }
        Ok(EventChannel {
            inner: Arc::new(inner),
        })
    }

    /// Puts the channel's fd in non-blocking mode (`O_NONBLOCK`) or back: needed under a
    /// readiness-based waiter such as tokio's `AsyncFd` (a stale readiness notice must not
    /// block the runtime's thread). [`get_event`](Self::get_event) polls before it reads,
    /// so it works either way. The flag belongs to the open file: every clone shares it.
    ///
    /// # References
    /// `rdma_create_event_channel(3)`, `rdma_get_cm_event(3)`
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        set_nonblocking(self.as_fd(), nonblocking)
    }

    /// Waits up to `timeout` for the next event of the channel, whichever ID it is about
    /// (`rdma_get_cm_event(3)`), copies it and acknowledges it (`rdma_ack_cm_event(3)`).
    ///
    /// This is the channel's view, for a channel you drive yourself (e.g. from an fd
    /// readiness loop): it also takes events parked for a [`CmId`] (oldest first), which
    /// that ID then never sees — on a channel whose IDs wait in their own methods
    /// (`connect`, `get_request`, ...), let them take their events. The new ID of a
    /// `RDMA_CM_EVENT_CONNECT_REQUEST` ([`CmEvent::id`]) is then the caller's to accept or
    /// reject and destroy.
    ///
    /// # Errors
    /// `ETIMEDOUT` when nothing arrives in time.
    pub fn get_event(&self, timeout: Duration) -> Result<CmEvent> {
        let inner = &*self.inner;
        match inner.router.wait(inner, Taker::Any, timeout)? {
            Some(Parked(ev)) => Ok(ev),
            None => Err(Error::new("rdma_get_cm_event", libc::ETIMEDOUT)
                .with_hint(format!("no rdma_cm event within {timeout:?}"))),
        }
    }
}

/// An event read from the channel by `rdma_get_cm_event` and not yet acknowledged: the
/// event, its ID (and for a connect request its listener) are valid until
/// [`EventSource::ack`] consumes it. Made only by [`ChannelInner`]'s `read`.
struct ReadEvent(*mut rdma_cm_event);

/// A copied, acknowledged event on its way to (or parked for) the ID it belongs to.
struct Parked(CmEvent);

// SAFETY: the pointers in a CmEvent are identifiers of IDs, only compared while routing;
// the one a Parked owns (a connect request's new ID) is used from whichever thread takes
// or drops it, and librdmacm's calls on an ID are thread-safe.
unsafe impl Send for Parked {}

impl EventSource for ChannelInner {
    type Raw = ReadEvent;
    type Event = Parked;

    fn read(&self, timeout: Duration) -> Result<Option<ReadEvent>> {
        let get = self
            .fns
            .rdma_get_cm_event
            .ok_or_else(|| Error::missing("rdma_get_cm_event"))?;
        if !poll_readable(self.fd(), timeout)? {
            return Ok(None);
        }
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointer.
        let ret = unsafe { get(self.ch, &mut ev) };
        if ret != 0 {
            let e = Error::from_ret("rdma_get_cm_event", ret);
            // A non-blocking channel whose event someone outside this crate read first:
            // nothing this time (the caller's deadline decides whether to read again).
            if e.errno() == libc::EAGAIN || e.errno() == libc::EINTR {
                return Ok(None);
            }
            return Err(e);
        }
        Ok(Some(ReadEvent(ev)))
    }

    fn copy(&self, raw: &ReadEvent) -> (usize, Parked) {
        let ev = raw.0;
        // SAFETY: ev is a valid event until acked, and so is the ID it names (librdmacm
        // keeps an ID with unacknowledged events alive); private data (if any) is
        // private_data_len bytes; librdmacm fills the union member `ud` for IDs of a UD QP
        // type (RDMA_PS_UDP/IPOIB) and `conn` for the others, for connection events; both
        // start with the private data pointer and length.
        let out = unsafe {
            let e = &*ev;
            let ud_id = !e.id.is_null() && (*e.id).qp_type == hotverbs_ffi::IBV_QPT_UD;
            let (data, data_len) = if ud_id {
                (e.param.ud.private_data, e.param.ud.private_data_len)
            } else {
                (e.param.conn.private_data, e.param.conn.private_data_len)
            };
            let private_data = if data.is_null() || !is_conn_event(e.event) {
                Vec::new()
            } else {
                std::slice::from_raw_parts(data.cast::<u8>(), data_len as usize).to_vec()
            };
            // librdmacm fills `ud` for a UD ID's ESTABLISHED (SIDR reply) and for a join
            // (the group's QPN 0xFFFFFF, Q_Key and address).
            let ud_event = matches!(
                e.event,
                hotverbs_ffi::RDMA_CM_EVENT_ESTABLISHED
                    | hotverbs_ffi::RDMA_CM_EVENT_MULTICAST_JOIN
            );
            let ud = (ud_id && ud_event).then(|| {
                let p = e.param.ud;
                UdParam {
                    qp_num: p.qp_num,
                    qkey: p.qkey,
                    ah: AhAttr::from_raw(&p.ah_attr),
                }
            });
            CmEvent {
                kind: e.event,
                name: event_name(e.event),
                status: e.status,
                id: e.id,
                listen_id: e.listen_id,
                private_data,
                ud,
            }
        };
        (owner_key(&out), Parked(out))
    }

    fn ack(&self, raw: ReadEvent) {
        if let Some(ack) = self.fns.rdma_ack_cm_event {
            // SAFETY: raw came from rdma_get_cm_event and is consumed here: acked once.
            unsafe { ack(raw.0) };
        }
    }

    fn discard(&self, Parked(ev): Parked) {
        if ev.kind == hotverbs_ffi::RDMA_CM_EVENT_CONNECT_REQUEST && !ev.id.is_null() {
            // SAFETY: a connect request's new ID, live (nothing destroyed it: no CmId holds
            // it, and the event owning it is being dropped here, once), its event acked.
            unsafe { refuse_request(self.fns, ev.id) };
        }
    }
}

/// The routing key of the ID `ev` belongs to: the listener of a connect request, the
/// event's ID otherwise.
fn owner_key(ev: &CmEvent) -> usize {
    if ev.kind == hotverbs_ffi::RDMA_CM_EVENT_CONNECT_REQUEST {
        ev.listen_id as usize
    } else {
        ev.id as usize
    }
}

/// Refuses a connect request no live listener will take: `rdma_reject(3)` (the peer hears
/// a reject now, not a timeout) and `rdma_destroy_id(3)` of its new ID. Failures are
/// recorded as drop errors ([`take_drop_errors`](crate::take_drop_errors)).
///
/// # Safety
/// `id` is the live new ID of an acknowledged connect request, without a QP, that nothing
/// else holds or destroys.
unsafe fn refuse_request(fns: &RdmaCmFns, id: *mut rdma_cm_id) {
    const WHY: &str = "refusing a connect request no live listener took (its CmId was dropped, \
                       or it was waiting for another event)";
    if let Some(reject) = fns.rdma_reject {
        // SAFETY: live ID (the caller's contract); no private data.
        let ret = unsafe { reject(id, std::ptr::null(), 0) };
        if ret != 0 {
            record_drop_error(Error::from_ret("rdma_reject", ret).with_hint(WHY));
        }
    }
    let Some(destroy) = fns.rdma_destroy_id else {
        return record_drop_error(Error::missing("rdma_destroy_id"));
    };
    // SAFETY: live ID without a QP or unacknowledged events, destroyed once (the caller's
    // contract).
    let ret = unsafe { destroy(id) };
    if ret != 0 {
        record_drop_error(Error::from_ret("rdma_destroy_id", ret).with_hint(WHY));
    }
}

/// The channel's fd (`rdma_event_channel.fd`), readable while an event is pending; open as
/// long as the channel lives (closed by `rdma_destroy_event_channel`, after the last clone
/// and the last [`CmId`] on it). Non-negative (checked at creation).
impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: live channel while self lives; librdmacm never writes `fd` after creation.
        unsafe { (*self.inner.ch).fd }
    }
}

/// The channel's fd as a [`BorrowedFd`].
impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: not -1 (checked in `EventChannel::new`) and open while the channel lives,
        // at least as long as the borrow of self.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

fn is_conn_event(t: u32) -> bool {
    use hotverbs_ffi::*;
    matches!(
        t,
        RDMA_CM_EVENT_CONNECT_REQUEST
            | RDMA_CM_EVENT_CONNECT_RESPONSE
            | RDMA_CM_EVENT_ESTABLISHED
            | RDMA_CM_EVENT_REJECTED
    )
}

/// Connection parameters (`struct rdma_conn_param`).
///
/// # Example
/// ```
/// let p = hotverbs::cm::ConnParam { private_data: b"hi".to_vec(), ..Default::default() };
/// assert_eq!(p.retry_count, 6); // finite: rxe retries forever at 7
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnParam {
    /// Bytes for the peer (e.g. an [`Endpoint`](crate::Endpoint) with an MR), as many as
    /// the CM message has room for: 56 on an RC connect, 196 on an RC accept, 180 on a UD
    /// connect, 136 on a UD accept.
    pub private_data: Vec<u8>,
    /// Outstanding RDMA reads/atomics we answer.
    pub responder_resources: u8,
    /// Outstanding RDMA reads/atomics we initiate.
    pub initiator_depth: u8,
    /// Transport retries (default 6: finite; rxe retries forever at 7).
    pub retry_count: u8,
    /// RNR retries (7 = infinite; default 6, finite: see [`ConnectOptions`](crate::ConnectOptions)).
    pub rnr_retry_count: u8,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 6,
            rnr_retry_count: 6,
        }
    }
}

/// Private data room of the CM message `verb` sends on an ID of port space `ps` (IB CM:
/// REQ 92 bytes less rdma_cm's 36-byte header, REP 196, SIDR REQ 216 less the header,
/// SIDR REP 136).
fn private_data_max(verb: &str, ps: PortSpace) -> usize {
    match (ps, verb) {
        (PortSpace::Tcp, "rdma_connect") => 56,
        (PortSpace::Tcp, _) => 196,
        (PortSpace::Udp, "rdma_connect") => 180,
        (PortSpace::Udp, _) => 136,
    }
}

impl ConnParam {
    fn to_raw(&self, verb: &'static str, ps: PortSpace) -> Result<rdma_conn_param> {
        let max = private_data_max(verb, ps);
        if self.private_data.len() > max {
            return Err(Error::new(verb, libc::EINVAL).with_hint(format!(
                "{} bytes of private data: {verb} on an {} ID carries at most {max}",
                self.private_data.len(),
                ps.name()
            )));
        }
        // SAFETY: plain C data.
        let mut p: rdma_conn_param = unsafe { crate::zeroed() };
        p.private_data = if self.private_data.is_empty() {
            std::ptr::null()
        } else {
            self.private_data.as_ptr().cast()
        };
        p.private_data_len = self.private_data.len() as u8;
        p.responder_resources = self.responder_resources;
        p.initiator_depth = self.initiator_depth;
        p.retry_count = self.retry_count;
        p.rnr_retry_count = self.rnr_retry_count;
        Ok(p)
    }
}

/// An rdma_cm identifier (`struct rdma_cm_id`), the rdma_cm's "socket".
///
/// The port space of an rdma_cm ID (`enum rdma_port_space`): which QP type its
/// connections carry.
///
/// # Example
/// ```
/// use hotverbs::cm::PortSpace;
/// use hotverbs::QpType;
/// assert_eq!(PortSpace::Tcp.qp_type(), QpType::Rc);
/// assert_eq!(PortSpace::Udp.raw(), hotverbs_ffi::RDMA_PS_UDP);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connected (RC) QPs, connected with CM REQ/REP/RTU.
    Tcp,
    /// `RDMA_PS_UDP`: unreliable datagram (UD) QPs; "connecting" resolves the server's QPN
    /// and Q_Key (SIDR), see [`CmId::connect_ud`].
    Udp,
}

impl PortSpace {
    /// The raw `RDMA_PS_*`.
    pub fn raw(self) -> u32 {
        match self {
            PortSpace::Tcp => hotverbs_ffi::RDMA_PS_TCP,
            PortSpace::Udp => hotverbs_ffi::RDMA_PS_UDP,
        }
    }

    /// The QP type IDs of this port space carry.
    pub fn qp_type(self) -> QpType {
        match self {
            PortSpace::Tcp => QpType::Rc,
            PortSpace::Udp => QpType::Ud,
        }
    }

    /// `"RDMA_PS_TCP"` or `"RDMA_PS_UDP"`.
    pub fn name(self) -> &'static str {
        match self {
            PortSpace::Tcp => "RDMA_PS_TCP",
            PortSpace::Udp => "RDMA_PS_UDP",
        }
    }
}

/// Why `rdma_create_qp` on an ID of port space `ps` refuses a QP of type `qp_type` (raw
/// `IBV_QPT_*`), if it does.
fn qp_type_refusal(ps: PortSpace, qp_type: u32) -> Option<String> {
    if qp_type == ps.qp_type().raw() {
        return None;
    }
    Some(if qp_type == QpType::Uc.raw() {
        "rdma_cm connects RC QPs (RDMA_PS_TCP) and resolves UD QPs (RDMA_PS_UDP); it has no \
         port space for UC here: set a UC QP up with QpBuilder::build and Qp::connect over \
         an out-of-band exchange (hotverbs::exchange)"
            .to_string()
    } else if qp_type == QpType::Ud.raw() {
        format!(
            "a UD QP needs an ID in RDMA_PS_UDP (CmId::with_port_space(&channel, \
             PortSpace::Udp)); this ID is in {}",
            ps.name()
        )
    } else if qp_type == QpType::Rc.raw() {
        format!(
            "an RC QP needs an ID in RDMA_PS_TCP (CmId::new); this ID is in {}",
            ps.name()
        )
    } else {
        format!("QP type {qp_type} is not one rdma_cm sets up")
    })
}

/// An rdma_cm identifier (`struct rdma_cm_id`), the rdma_cm's "socket".
///
/// Active side: [`new`](Self::new), [`resolve_addr`](Self::resolve_addr),
/// [`resolve_route`](Self::resolve_route), [`create_qp`](Self::create_qp),
/// [`connect`](Self::connect) ([`connect_ud`](Self::connect_ud) in `RDMA_PS_UDP`).
/// Passive side: [`bind`](Self::bind), [`listen`](Self::listen),
/// [`get_request`](Self::get_request) (a new `CmId`), `create_qp`,
/// [`accept`](Self::accept). Both: [`disconnect`](Self::disconnect) (RC).
///
/// The ID owns the [`Qp`] made on it and lends it out ([`qp`](Self::qp)): post, poll and
/// build datapath rings through it like any other QP. rdma_cm moves it through the
/// states (INIT at creation, RTR/RTS on connect/accept for RC; RTS at creation for UD),
/// so its [`tracked_state`](Qp::tracked_state) stays RESET; [`Qp::query`] tells.
///
/// # Example
/// ```no_run
/// use std::time::Duration;
/// use hotverbs::cm::{CmId, ConnParam, EventChannel};
/// use hotverbs::{QpBuilder, QpType};
/// let t = Duration::from_secs(5);
/// let ch = EventChannel::new()?;
/// let listener = CmId::new(&ch)?;
/// listener.bind("0.0.0.0:7471".parse().unwrap())?;
/// listener.listen(8)?;
/// let (mut conn, _private) = listener.get_request(t)?;
/// let ctx = conn.context()?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64, None)?;
/// conn.create_qp(QpBuilder::new(&pd, &cq, &cq, QpType::Rc).sq_sig_all(true))?;
/// conn.accept(&ConnParam::default(), t)?;
/// let qp = conn.qp().expect("made above");
/// # let _ = qp;
/// # Ok::<(), hotverbs::Error>(())
/// ```
pub struct CmId {
    fns: &'static RdmaCmFns,
    id: *mut rdma_cm_id,
    channel: EventChannel,
    ps: PortSpace,
    /// The QP made on the ID: destroyed (through `rdma_destroy_qp` on `id`) before the ID.
    qp: Option<Qp>,
}

// SAFETY: librdmacm calls on an ID are thread-safe; the struct holds identifiers and a
// `Qp`, which is Send.
unsafe impl Send for CmId {}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("id", &self.id)
            .field("port_space", &self.ps)
            .field("qp", &self.qp)
            .finish()
    }
}

fn sockaddr_of(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain C data.
    let mut ss: libc::sockaddr_storage = unsafe { crate::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            (
                ss,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            (
                ss,
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        }
    }
}

impl CmId {
    /// `rdma_create_id(3)` on `channel`, port space TCP (RC QPs).
    pub fn new(channel: &EventChannel) -> Result<CmId> {
        Self::with_port_space(channel, PortSpace::Tcp)
    }

    /// `rdma_create_id(3)` on `channel` in port space `ps`: [`PortSpace::Tcp`] for RC QPs,
    /// [`PortSpace::Udp`] for a UD QP.
    pub fn with_port_space(channel: &EventChannel, ps: PortSpace) -> Result<CmId> {
        let fns = channel.inner.fns;
        let f = fns
            .rdma_create_id
            .ok_or_else(|| Error::missing("rdma_create_id"))?;
        let mut id: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointer.
        let ret = unsafe { f(channel.inner.ch, &mut id, std::ptr::null_mut(), ps.raw()) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_create_id", ret));
        }
        Ok(CmId::adopt(channel, id, ps))
    }

    /// Wraps the live ID `id` of `channel` (a new one, or a connect request's, not yet
    /// accepted: no event of it was read) and routes its events to it from now on.
    fn adopt(channel: &EventChannel, id: *mut rdma_cm_id, ps: PortSpace) -> CmId {
        channel.inner.router.register(id as usize);
        CmId {
            fns: channel.inner.fns,
            id,
            channel: channel.clone(),
            ps,
            qp: None,
        }
    }

    /// The ID's port space.
    pub fn port_space(&self) -> PortSpace {
        self.ps
    }

    /// The raw `rdma_cm_id`.
    pub fn as_raw(&self) -> *mut rdma_cm_id {
        self.id
    }

    /// Waits for this ID's next event (events of other IDs on the channel are parked for
    /// them meanwhile: module docs) and checks it is `want`; `timeout` bounds the whole
    /// wait.
    fn expect(&self, verb: &'static str, want: u32, timeout: Duration) -> Result<CmEvent> {
        let inner = &*self.channel.inner;
        let Some(Parked(ev)) = inner
            .router
            .wait(inner, Taker::Id(self.id as usize), timeout)?
        else {
            return Err(Error::new(verb, libc::ETIMEDOUT)
                .with_hint(format!("no {} within {timeout:?}", event_name(want))));
        };
        if ev.kind != want {
            let errno = if ev.status < 0 {
                -ev.status
            } else {
                libc::ECONNREFUSED
            };
            let mut hint = format!(
                "expected {}, got {} (status {})",
                event_name(want),
                ev.name,
                ev.status
            );
            if ev.kind == hotverbs_ffi::RDMA_CM_EVENT_CONNECT_REQUEST {
                hint.push_str(
                    ": that connect request was rejected (take requests with get_request)",
                );
            }
            // A connect request taken here is refused, not leaked.
            inner.discard(Parked(ev));
            return Err(Error::new(verb, errno).with_hint(hint));
        }
        Ok(ev)
    }

    /// `rdma_resolve_addr(3)` and wait for `RDMA_CM_EVENT_ADDR_RESOLVED`.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let f = self
            .fns
            .rdma_resolve_addr
            .ok_or_else(|| Error::missing("rdma_resolve_addr"))?;
        let mut src_ss = src.map(|a| sockaddr_of(&a).0);
        let (mut dst_ss, _) = sockaddr_of(&dst);
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: live ID; the sockaddrs are valid for the call (librdmacm copies them).
        let ret = unsafe {
            f(
                self.id,
                src_ss.as_mut().map_or(std::ptr::null_mut(), |s| {
                    (s as *mut libc::sockaddr_storage).cast()
                }),
                (&mut dst_ss as *mut libc::sockaddr_storage).cast(),
                ms,
            )
        };
        if ret != 0 {
            return Err(Error::from_ret("rdma_resolve_addr", ret)
                .or_hint(|| Some(format!("{dst} not reachable through an RDMA device?"))));
        }
        self.expect(
            "rdma_resolve_addr",
            hotverbs_ffi::RDMA_CM_EVENT_ADDR_RESOLVED,
            timeout,
        )
        .map(drop)
    }

    /// `rdma_resolve_route(3)` and wait for `RDMA_CM_EVENT_ROUTE_RESOLVED`.
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        let f = self
            .fns
            .rdma_resolve_route
            .ok_or_else(|| Error::missing("rdma_resolve_route"))?;
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: live ID with a resolved address.
        let ret = unsafe { f(self.id, ms) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_resolve_route", ret));
        }
        self.expect(
            "rdma_resolve_route",
            hotverbs_ffi::RDMA_CM_EVENT_ROUTE_RESOLVED,
            timeout,
        )
        .map(drop)
    }

    /// `rdma_bind_addr(3)`. Port 0 has the kernel pick a free port:
    /// [`local_port`](Self::local_port) tells which.
    pub fn bind(&self, addr: SocketAddr) -> Result<()> {
        let f = self
            .fns
            .rdma_bind_addr
            .ok_or_else(|| Error::missing("rdma_bind_addr"))?;
        let (mut ss, _) = sockaddr_of(&addr);
        // SAFETY: live ID; valid sockaddr.
        let ret = unsafe { f(self.id, (&mut ss as *mut libc::sockaddr_storage).cast()) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_bind_addr", ret)
                .or_hint(|| Some(format!("{addr} is not an address of an RDMA device?"))));
        }
        Ok(())
    }

    /// The ID's local port, host byte order: `rdma_get_src_port(3)`. After
    /// [`bind`](Self::bind) to port 0 this is the port the kernel picked — what a client
    /// must be told to connect to.
    pub fn local_port(&self) -> Result<u16> {
        let f = self
            .fns
            .rdma_get_src_port
            .ok_or_else(|| Error::missing("rdma_get_src_port"))?;
        // SAFETY: live ID; the call reads its route's source address.
        Ok(u16::from_be(unsafe { f(self.id) }))
    }

    /// `rdma_listen(3)`.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        let f = self
            .fns
            .rdma_listen
            .ok_or_else(|| Error::missing("rdma_listen"))?;
        // SAFETY: live, bound ID.
        let ret = unsafe { f(self.id, backlog) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_listen", ret));
        }
        Ok(())
    }

    /// Waits for `RDMA_CM_EVENT_CONNECT_REQUEST` on a listening ID: the new ID of the
    /// incoming connection, and the private data the client sent. Requests that other IDs
    /// of the channel read while they waited were kept for this listener and come first,
    /// in arrival order; the new ID shares the listener's channel. A request still waiting
    /// when the listener is dropped is rejected (`rdma_reject(3)`) and its ID destroyed.
    pub fn get_request(&self, timeout: Duration) -> Result<(CmId, Vec<u8>)> {
        let ev = self.expect(
            "rdma_get_cm_event",
            hotverbs_ffi::RDMA_CM_EVENT_CONNECT_REQUEST,
            timeout,
        )?;
        // The new ID is on the listener's channel; no event of it is read before accept.
        Ok((CmId::adopt(&self.channel, ev.id, self.ps), ev.private_data))
    }

    /// The ID's device context (after address resolution, or for an incoming request),
    /// for allocating the PD/CQs/MRs its QP uses.
    pub fn context(&self) -> Result<Context> {
        // SAFETY: live ID.
        let verbs = unsafe { (*self.id).verbs };
        if verbs.is_null() {
            return Err(Error::new("rdma_cm_id.verbs", libc::ENODEV)
                .with_hint("resolve the address (or bind to a device address) first"));
        }
        let fns = hotverbs_ffi::ibverbs()
            .map_err(|e| Error::new("ibv_open_device", libc::ENOSYS).with_hint(e.to_string()))?;
        // librdmacm opened the context itself: refuse it, as Context::open refuses a real
        // device, while MLX5_SINGLE_THREADED=1 removes the provider's locks.
        crate::device::check_provider_locks(crate::DeviceKind::Real, "rdma_cm device")?;
        // SAFETY: librdmacm keeps its device contexts open for the life of the process
        // (they are closed only when librdmacm is unloaded, which never happens); a real
        // provider fills the hot ops; its locks are on (checked above).
        Ok(unsafe { Context::from_raw_borrowed(fns, verbs) })
    }

    /// `rdma_create_qp(3)`: the QP `builder` describes (caps, inline data, `sq_sig_all`,
    /// SRQ), made on this ID and owned by it; returns it borrowed ([`qp`](Self::qp) lends it
    /// again later). rdma_cm moves it through the states: an RC QP to INIT now and to
    /// RTR/RTS on connect/accept, a UD QP straight to RTS (Q_Key `RDMA_UDP_QKEY`). The
    /// builder's PD and CQs (and SRQ) must be of [`context`](Self::context); its QP type
    /// must be the port space's ([`PortSpace::qp_type`]). One QP per ID.
    ///
    /// # Errors
    /// `rdma_create_qp: EBUSY` when the ID already has a QP; `ENODEV` before the ID has a
    /// device (resolve the address, or take a request, first); `EINVAL` for a PD/CQ/SRQ of
    /// another context or a QP type the port space does not carry (UC: never); the verb's
    /// error otherwise, with a hint naming the device limit a cap exceeds.
    ///
    /// # References
    /// `rdma_create_qp(3)`, `rdma_destroy_qp(3)`
    pub fn create_qp(&mut self, builder: QpBuilder<'_>) -> Result<&Qp> {
        const VERB: &str = "rdma_create_qp";
        if self.qp.is_some() {
            return Err(Error::new(VERB, libc::EBUSY)
                .with_hint("this ID already has its QP (one per ID): use CmId::qp"));
        }
        let f = self
            .fns
            .rdma_create_qp
            .ok_or_else(|| Error::missing("rdma_create_qp"))?;
        let destroy_qp = self
            .fns
            .rdma_destroy_qp
            .ok_or_else(|| Error::missing("rdma_destroy_qp"))?;
        let (id, ps) = (self.id, self.ps);
        // SAFETY: live ID.
        let verbs = unsafe { (*id).verbs };
        if verbs.is_null() {
            return Err(Error::new(VERB, libc::ENODEV).with_hint(
                "the ID has no device yet: resolve the address (or take a connect request) first",
            ));
        }
        // What the closure refuses before calling the verb, with its own hint.
        let mut refused: Option<Error> = None;
        let built = builder.build_with(VERB, QpDestroy::RdmaCm { id, destroy_qp }, |pd, init| {
            // build_with checked that the CQs and SRQ are of the PD's context; the PD must
            // be of the ID's (a provider misreads objects of another context).
            // SAFETY: pd is live: the builder borrows its Pd.
            if unsafe { (*pd).context } != verbs {
                refused = Some(Error::new(VERB, libc::EINVAL).with_hint(
                    "the PD and CQs must be of this ID's device context (CmId::context)",
                ));
                return Err(libc::EINVAL);
            }
            if let Some(why) = qp_type_refusal(ps, init.qp_type) {
                refused = Some(Error::new(VERB, libc::EINVAL).with_hint(why));
                return Err(libc::EINVAL);
            }
            // SAFETY: live ID with a device; the PD, CQs and SRQ are live (the builder
            // borrows them, the Qp keeps clones) and of the ID's context (checked above);
            // init is valid and writable (librdmacm writes the actual caps back).
            let ret = unsafe { f(id, pd, init) };
            if ret != 0 {
                return Err(Error::from_ret(VERB, ret).errno());
            }
            // SAFETY: live ID; rdma_create_qp succeeded, so `qp` is the QP it made.
            let qp = unsafe { (*id).qp };
            if qp.is_null() {
                return Err(libc::EIO);
            }
            Ok(qp)
        });
        let qp = built.map_err(|e| refused.take().unwrap_or(e))?;
        Ok(self.qp.insert(qp))
    }

    /// The QP made by [`create_qp`](Self::create_qp), if any: post, poll and build rings
    /// through it. It lives as long as the ID.
    pub fn qp(&self) -> Option<&Qp> {
        self.qp.as_ref()
    }

    /// The raw QP made by [`create_qp`](Self::create_qp) (null before), valid while this
    /// ID lives: [`Qp::as_raw`] of [`qp`](Self::qp).
    pub fn qp_raw(&self) -> *mut ibv_qp {
        self.qp.as_ref().map_or(std::ptr::null_mut(), Qp::as_raw)
    }

    /// `rdma_connect(3)` and wait for `RDMA_CM_EVENT_ESTABLISHED`; returns the private
    /// data the server sent with its accept. On a UD ID use
    /// [`connect_ud`](Self::connect_ud), which also returns where the server's QP is.
    pub fn connect(&self, param: &ConnParam, timeout: Duration) -> Result<Vec<u8>> {
        Ok(self.connect_event(param, timeout)?.private_data)
    }

    /// On an ID in [`PortSpace::Udp`]: `rdma_connect(3)` (a SIDR request) and wait for
    /// `RDMA_CM_EVENT_ESTABLISHED`; returns the server's QPN, Q_Key and address, and the
    /// private data it sent with its accept.
    ///
    /// # Errors
    /// `rdma_connect: EINVAL` on an RC ID; as [`connect`](Self::connect) otherwise
    /// (`RDMA_CM_EVENT_UNREACHABLE` when the server rejects).
    pub fn connect_ud(&self, param: &ConnParam, timeout: Duration) -> Result<(UdParam, Vec<u8>)> {
        if self.ps != PortSpace::Udp {
            return Err(Error::new("rdma_connect", libc::EINVAL).with_hint(
                "connect_ud is for IDs in RDMA_PS_UDP (CmId::with_port_space); an RC ID \
                 connects with CmId::connect",
            ));
        }
        let ev = self.connect_event(param, timeout)?;
        let ud = ev.ud.ok_or_else(|| {
            Error::new("rdma_connect", libc::EPROTO)
                .with_hint("RDMA_CM_EVENT_ESTABLISHED of a UD ID without the peer's UD parameters")
        })?;
        Ok((ud, ev.private_data))
    }

    fn connect_event(&self, param: &ConnParam, timeout: Duration) -> Result<CmEvent> {
        let f = self
            .fns
            .rdma_connect
            .ok_or_else(|| Error::missing("rdma_connect"))?;
        let mut p = param.to_raw("rdma_connect", self.ps)?;
        // SAFETY: live ID with a resolved route; p and its private data valid for the call.
        let ret = unsafe { f(self.id, &mut p) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_connect", ret));
        }
        self.expect(
            "rdma_connect",
            hotverbs_ffi::RDMA_CM_EVENT_ESTABLISHED,
            timeout,
        )
    }

    /// On an ID in [`PortSpace::Udp`] with its UD QP ([`create_qp`](Self::create_qp)) and
    /// an address on a device (`resolve_addr` to the group, or `bind` to a local IP):
    /// `rdma_join_multicast(3)` for the multicast address `group`, then wait for
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`. librdmacm attaches the ID's QP to the group when the
    /// join completes, so receives posted on it take the group's datagrams (after a 40-byte
    /// GRH, as every UD receive); on RoCE the kernel also joins the IP group (IGMP), so the
    /// network delivers it. Returns what sending to the group takes: QPN `0xFFFFFF`, the
    /// group's Q_Key (`RDMA_UDP_QKEY`) and its address (the MGID; an AH made from it sends
    /// to every member). Leave with [`leave_multicast`](Self::leave_multicast), or by
    /// destroying the ID.
    ///
    /// # Errors
    /// `EINVAL` before the verb for a non-multicast `group`, an RC ID or an ID without its
    /// QP; the verb's errno otherwise (`ENODEV` / `EINVAL` when the ID has no device yet);
    /// `RDMA_CM_EVENT_MULTICAST_ERROR` as the event's status, named.
    pub fn join_multicast(&self, group: SocketAddr, timeout: Duration) -> Result<UdParam> {
        self.check_multicast("rdma_join_multicast", group)?;
        if self.qp.is_none() {
            return Err(Error::new("rdma_join_multicast", libc::EINVAL).with_hint(
                "create the ID's UD QP first (CmId::create_qp): librdmacm attaches it to the \
                 group when the join completes",
            ));
        }
        let f = self
            .fns
            .rdma_join_multicast
            .ok_or_else(|| Error::missing("rdma_join_multicast"))?;
        let (mut ss, _) = sockaddr_of(&group);
        // SAFETY: live ID; the sockaddr is valid for the call (librdmacm copies it); the
        // context pointer is only handed back in the join's event, which we do not read.
        let ret = unsafe {
            f(
                self.id,
                (&mut ss as *mut libc::sockaddr_storage).cast(),
                std::ptr::null_mut(),
            )
        };
        if ret != 0 {
            return Err(Error::from_ret("rdma_join_multicast", ret).or_hint(|| {
                Some(format!(
                    "joining {}: the ID needs an address on a device first (resolve_addr to \
                     the group, or bind to a local IP)",
                    group.ip()
                ))
            }));
        }
        let ev = self.expect(
            "rdma_join_multicast",
            hotverbs_ffi::RDMA_CM_EVENT_MULTICAST_JOIN,
            timeout,
        )?;
        ev.ud.ok_or_else(|| {
            Error::new("rdma_join_multicast", libc::EPROTO)
                .with_hint("RDMA_CM_EVENT_MULTICAST_JOIN without the group's UD parameters")
        })
    }

    /// `rdma_leave_multicast(3)`: detaches the ID's QP from `group` and leaves it.
    ///
    /// # Errors
    /// `EINVAL` before the verb as for [`join_multicast`](Self::join_multicast); the
    /// verb's errno otherwise (`EADDRNOTAVAIL`: this ID has not joined `group`).
    pub fn leave_multicast(&self, group: SocketAddr) -> Result<()> {
        self.check_multicast("rdma_leave_multicast", group)?;
        let f = self
            .fns
            .rdma_leave_multicast
            .ok_or_else(|| Error::missing("rdma_leave_multicast"))?;
        let (mut ss, _) = sockaddr_of(&group);
        // SAFETY: live ID; the sockaddr is valid for the call.
        let ret = unsafe { f(self.id, (&mut ss as *mut libc::sockaddr_storage).cast()) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_leave_multicast", ret).or_hint(|| {
                Some(format!(
                    "this ID has not joined {} (join_multicast)",
                    group.ip()
                ))
            }));
        }
        Ok(())
    }

    fn check_multicast(&self, verb: &'static str, group: SocketAddr) -> Result<()> {
        if !group.ip().is_multicast() {
            return Err(Error::new(verb, libc::EINVAL).with_hint(format!(
                "{} is not a multicast address (IPv4 224.0.0.0/4, IPv6 ff00::/8)",
                group.ip()
            )));
        }
        if self.ps != PortSpace::Udp {
            return Err(Error::new(verb, libc::EINVAL).with_hint(
                "multicast groups carry UD datagrams: join on an ID in RDMA_PS_UDP \
                 (CmId::with_port_space(&channel, PortSpace::Udp))",
            ));
        }
        Ok(())
    }

    /// `rdma_accept(3)`; on an RC ID, then wait for `RDMA_CM_EVENT_ESTABLISHED`. On a UD ID
    /// the accept is the SIDR reply (with this ID's QP's number and Q_Key): nothing follows
    /// on this side, so it returns at once (`timeout` unused).
    pub fn accept(&self, param: &ConnParam, timeout: Duration) -> Result<()> {
        let f = self
            .fns
            .rdma_accept
            .ok_or_else(|| Error::missing("rdma_accept"))?;
        let mut p = param.to_raw("rdma_accept", self.ps)?;
        // SAFETY: live ID from a connect request; p valid for the call.
        let ret = unsafe { f(self.id, &mut p) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_accept", ret).or_hint(|| {
                self.qp
                    .is_none()
                    .then(|| "create the ID's QP (CmId::create_qp) before accepting".into())
            }));
        }
        if self.ps == PortSpace::Udp {
            return Ok(());
        }
        self.expect(
            "rdma_accept",
            hotverbs_ffi::RDMA_CM_EVENT_ESTABLISHED,
            timeout,
        )
        .map(drop)
    }

    /// `rdma_disconnect(3)`.
    pub fn disconnect(&self) -> Result<()> {
        let f = self
            .fns
            .rdma_disconnect
            .ok_or_else(|| Error::missing("rdma_disconnect"))?;
        // SAFETY: live ID.
        let ret = unsafe { f(self.id) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_disconnect", ret));
        }
        Ok(())
    }

    /// Waits for `RDMA_CM_EVENT_DISCONNECTED` (after either side disconnected).
    pub fn wait_disconnected(&self, timeout: Duration) -> Result<()> {
        self.expect(
            "rdma_disconnect",
            hotverbs_ffi::RDMA_CM_EVENT_DISCONNECTED,
            timeout,
        )
        .map(drop)
    }

    fn destroy_inner(&mut self) -> Result<()> {
        let id = std::mem::replace(&mut self.id, std::ptr::null_mut());
        if id.is_null() {
            return Ok(());
        }
        // Out of the routing table before rdma_destroy_id (module docs): events of this ID
        // read from now on are discarded by their reader; those parked for it go now (a
        // connect request's new ID refused).
        let inner = &*self.channel.inner;
        for ev in inner.router.deregister(id as usize) {
            inner.discard(ev);
        }
        // The QP first: its destroy is rdma_destroy_qp on the ID, which is still live. Only
        // the ID ever held it (callers borrow it), so nothing uses it any more.
        let qp_destroyed = self.qp.take().map_or(Ok(()), Qp::destroy);
        let f = self
            .fns
            .rdma_destroy_id
            .ok_or_else(|| Error::missing("rdma_destroy_id"))?;
        // SAFETY: live ID, its QP destroyed, all its events acked.
        let ret = unsafe { f(id) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_destroy_id", ret));
        }
        qp_destroyed
    }

    /// `rdma_destroy_qp(3)` + `rdma_destroy_id(3)` now, returning the error.
    pub fn destroy(mut self) -> Result<()> {
        self.destroy_inner()
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        if let Err(e) = self.destroy_inner() {
            record_drop_error(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::time::Instant;

    #[test]
    fn event_channel_opens_or_says_why() {
        // Here (no RDMA device) it fails with a hint; with a device it opens.
        match EventChannel::new() {
            Ok(ch) => {
                assert!(ch.as_raw_fd() >= 0);
                assert_eq!(ch.as_fd().as_raw_fd(), ch.as_raw_fd());
            }
            Err(e) => {
                assert_eq!(e.verb(), "rdma_create_event_channel");
                let msg = e.to_string();
                assert!(
                    msg.contains("rdma_cm") || msg.contains("librdmacm"),
                    "{msg}"
                );
            }
        }
    }

    #[test]
    fn every_event_has_a_name() {
        for t in 0..=hotverbs_ffi::RDMA_CM_EVENT_TIMEWAIT_EXIT {
            assert!(event_name(t).starts_with("RDMA_CM_EVENT_"));
            assert_ne!(event_name(t), "RDMA_CM_EVENT_<unknown>", "{t}");
        }
    }

    #[test]
    fn private_data_is_limited_per_message() {
        for (verb, ps, max) in [
            ("rdma_connect", PortSpace::Tcp, 56),
            ("rdma_accept", PortSpace::Tcp, 196),
            ("rdma_connect", PortSpace::Udp, 180),
            ("rdma_accept", PortSpace::Udp, 136),
        ] {
            let p = ConnParam {
                private_data: vec![7; max],
                ..Default::default()
            };
            assert_eq!(p.to_raw(verb, ps).unwrap().private_data_len as usize, max);
            let p = ConnParam {
                private_data: vec![0; max + 1],
                ..Default::default()
            };
            let e = p.to_raw(verb, ps).err().expect("over the limit");
            assert_eq!((e.verb(), e.errno()), (verb, libc::EINVAL));
            assert!(e.to_string().contains(&format!("at most {max}")), "{e}");
        }
    }

    #[test]
    fn port_spaces_carry_their_qp_type_only() {
        assert_eq!(PortSpace::Tcp.raw(), hotverbs_ffi::RDMA_PS_TCP);
        assert_eq!(PortSpace::Udp.raw(), hotverbs_ffi::RDMA_PS_UDP);
        assert_eq!(qp_type_refusal(PortSpace::Tcp, QpType::Rc.raw()), None);
        assert_eq!(qp_type_refusal(PortSpace::Udp, QpType::Ud.raw()), None);
        let ud_on_tcp = qp_type_refusal(PortSpace::Tcp, QpType::Ud.raw()).unwrap();
        assert!(ud_on_tcp.contains("RDMA_PS_UDP"), "{ud_on_tcp}");
        let rc_on_udp = qp_type_refusal(PortSpace::Udp, QpType::Rc.raw()).unwrap();
        assert!(rc_on_udp.contains("RDMA_PS_TCP"), "{rc_on_udp}");
        for ps in [PortSpace::Tcp, PortSpace::Udp] {
            let uc = qp_type_refusal(ps, QpType::Uc.raw()).unwrap();
            assert!(uc.contains("UC"), "{uc}");
        }
    }

    /// A stand-in for librdmacm's QP verbs over softnic, so `CmId::create_qp` and the
    /// ID's teardown run for real without an rdma_cm device: `rdma_create_qp` is
    /// `ibv_create_qp` storing the QP in `id->qp`, `rdma_destroy_qp` destroys it.
    ///
    /// [`EV_FNS`](fake::EV_FNS) adds an event channel: the test [`push`](fake::push)es
    /// events as the kernel would report them; `rdma_get_cm_event` hands them out in order
    /// through an eventfd (so `poll(2)` sees them as it sees librdmacm's fd),
    /// `rdma_ack_cm_event` frees them, and what the channel's IDs were told (acks, rejects,
    /// destroys) is logged per channel ([`take_log`](fake::take_log)), whichever thread
    /// did it.
    mod fake {
        use std::cell::RefCell;
        use std::collections::VecDeque;
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::sync::Mutex;

        use hotverbs_ffi::*;

        thread_local! {
            /// What the fake verbs were asked to do, in order.
            pub static CALLS: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
        }

        fn log(what: &'static str) {
            CALLS.with(|c| c.borrow_mut().push(what));
        }

        pub fn calls() -> Vec<&'static str> {
            CALLS.with(|c| c.borrow_mut().drain(..).collect())
        }

        unsafe extern "C" fn create_qp(
            id: *mut rdma_cm_id,
            pd: *mut ibv_pd,
            init: *mut ibv_qp_init_attr,
        ) -> i32 {
            log("rdma_create_qp");
            let f = hotverbs_softnic::verbs_table().ibv_create_qp.unwrap();
            // SAFETY: a softnic PD and init attributes (the caller, CmId::create_qp).
            let qp = unsafe { f(pd, init) };
            if qp.is_null() {
                return -1;
            }
            // SAFETY: the test's live, boxed ID.
            unsafe { (*id).qp = qp };
            0
        }

        unsafe extern "C" fn destroy_qp(id: *mut rdma_cm_id) {
            log("rdma_destroy_qp");
            let f = hotverbs_softnic::verbs_table().ibv_destroy_qp.unwrap();
            // SAFETY: the test's live ID, whose QP the fake create_qp made.
            unsafe {
                assert_eq!(f((*id).qp), 0);
                (*id).qp = std::ptr::null_mut();
            }
        }

        unsafe extern "C" fn destroy_id(id: *mut rdma_cm_id) -> i32 {
            log("rdma_destroy_id");
            // SAFETY: the live ID being destroyed.
            channel_log(unsafe { (*id).channel }, format!("destroy_id {id:p}"));
            // SAFETY: allocated by `id` below, destroyed once.
            drop(unsafe { Box::from_raw(id) });
            0
        }

        /// A fake event channel: the `rdma_event_channel` its users hold (first, so the
        /// pointers convert), over an eventfd in semaphore mode that counts the queue.
        #[repr(C)]
        struct Channel {
            ch: rdma_event_channel,
            /// Pushed, not yet read events (`*mut Event`).
            queue: Mutex<VecDeque<usize>>,
            log: Mutex<Vec<String>>,
        }

        impl Drop for Channel {
            fn drop(&mut self) {
                for ev in self.queue.get_mut().unwrap().drain(..) {
                    // SAFETY: pushed and never read, so never acked: freed once, here.
                    drop(unsafe { Box::from_raw(ev as *mut Event) });
                }
                // SAFETY: the eventfd `channel` opened, closed once.
                unsafe { libc::close(self.ch.fd) };
            }
        }

        /// A pushed event: the `rdma_cm_event` handed out (first), its channel, its
        /// number, and the private data it points into.
        #[repr(C)]
        struct Event {
            ev: rdma_cm_event,
            ch: *mut Channel,
            serial: u32,
            _private: Vec<u8>,
        }

        fn channel_log(ch: *mut rdma_event_channel, what: String) {
            if !ch.is_null() {
                // SAFETY: a live channel of `channel`: the test holds its EventChannel.
                unsafe { &*ch.cast::<Channel>() }
                    .log
                    .lock()
                    .unwrap()
                    .push(what);
            }
        }

        unsafe extern "C" fn destroy_event_channel(ch: *mut rdma_event_channel) {
            // SAFETY: allocated by `channel` below, destroyed once.
            drop(unsafe { Box::from_raw(ch.cast::<Channel>()) });
        }

        unsafe extern "C" fn create_id(
            ch: *mut rdma_event_channel,
            out: *mut *mut rdma_cm_id,
            _context: *mut std::ffi::c_void,
            ps: rdma_port_space,
        ) -> i32 {
            let qp_type = if ps == RDMA_PS_UDP {
                IBV_QPT_UD
            } else {
                IBV_QPT_RC
            };
            // SAFETY: valid out-pointer (CmId::with_port_space).
            unsafe { *out = id_on(ch, std::ptr::null_mut(), qp_type) };
            0
        }

        unsafe extern "C" fn get_cm_event(
            ch: *mut rdma_event_channel,
            out: *mut *mut rdma_cm_event,
        ) -> i32 {
            // SAFETY: a live channel of `channel`.
            let c = unsafe { &*ch.cast::<Channel>() };
            let mut n = 0u64;
            // SAFETY: 8 writable bytes; a non-blocking eventfd: EAGAIN when empty.
            if unsafe { libc::read(c.ch.fd, (&mut n as *mut u64).cast(), 8) } != 8 {
                return -1;
            }
            let ev = c
                .queue
                .lock()
                .unwrap()
                .pop_front()
                .expect("counted by the fd");
            // SAFETY: valid out-pointer.
            unsafe { *out = ev as *mut rdma_cm_event };
            0
        }

        unsafe extern "C" fn ack_cm_event(ev: *mut rdma_cm_event) -> i32 {
            // SAFETY: made by `push` and read once; a second ack would free it twice.
            let e = unsafe { Box::from_raw(ev.cast::<Event>()) };
            channel_log(e.ch.cast(), format!("ack #{}", e.serial));
            0
        }

        unsafe extern "C" fn reject(id: *mut rdma_cm_id, _: *const std::ffi::c_void, _: u8) -> i32 {
            // SAFETY: a live ID (refuse_request's contract).
            channel_log(unsafe { (*id).channel }, format!("reject {id:p}"));
            0
        }

        unsafe extern "C" fn connect_or_accept(_: *mut rdma_cm_id, _: *mut rdma_conn_param) -> i32 {
            0
        }

        unsafe extern "C" fn join(
            _: *mut rdma_cm_id,
            _: *mut sockaddr,
            _: *mut std::ffi::c_void,
        ) -> i32 {
            0
        }

        const BASE: RdmaCmFns = RdmaCmFns {
            rdma_create_qp: Some(create_qp),
            rdma_destroy_qp: Some(destroy_qp),
            rdma_destroy_id: Some(destroy_id),
            rdma_destroy_event_channel: Some(destroy_event_channel),
            ..RdmaCmFns::EMPTY
        };

        pub static FNS: RdmaCmFns = BASE;

        /// [`FNS`] with events: IDs are made on a channel, connect, accept and join
        /// succeed, and their events are the test's to [`push`].
        pub static EV_FNS: RdmaCmFns = RdmaCmFns {
            rdma_create_id: Some(create_id),
            rdma_get_cm_event: Some(get_cm_event),
            rdma_ack_cm_event: Some(ack_cm_event),
            rdma_reject: Some(reject),
            rdma_connect: Some(connect_or_accept),
            rdma_accept: Some(connect_or_accept),
            rdma_join_multicast: Some(join),
            ..BASE
        };

        pub fn channel() -> *mut rdma_event_channel {
            // SAFETY: no pointers.
            let fd = unsafe {
                libc::eventfd(
                    0,
                    libc::EFD_SEMAPHORE | libc::EFD_NONBLOCK | libc::EFD_CLOEXEC,
                )
            };
            assert!(fd >= 0, "eventfd");
            let c = Channel {
                ch: rdma_event_channel { fd },
                queue: Mutex::default(),
                log: Mutex::default(),
            };
            Box::into_raw(Box::new(c)).cast()
        }

        /// An ID on `verbs` (a softnic context) as librdmacm would hand it out.
        pub fn id(verbs: *mut ibv_context, qp_type: u32) -> *mut rdma_cm_id {
            id_on(std::ptr::null_mut(), verbs, qp_type)
        }

        /// An ID on channel `ch` (its rejects and destroys logged there).
        pub fn id_on(
            ch: *mut rdma_event_channel,
            verbs: *mut ibv_context,
            qp_type: u32,
        ) -> *mut rdma_cm_id {
            // SAFETY: rdma_cm_id is plain C data; all-zero is valid.
            let mut id: rdma_cm_id = unsafe { std::mem::zeroed() };
            id.channel = ch;
            id.verbs = verbs;
            id.qp_type = qp_type;
            Box::into_raw(Box::new(id))
        }

        /// Queues an event of kind `kind` about `id` (for a connect request: the new ID,
        /// of listener `listen_id`) with `private` data; on a UD ID the event carries UD
        /// parameters with Q_Key `qkey`. Returns its number (`ack #n` in the log).
        pub fn push(
            ch: *mut rdma_event_channel,
            kind: u32,
            id: *mut rdma_cm_id,
            listen_id: *mut rdma_cm_id,
            private: &[u8],
            qkey: u32,
        ) -> u32 {
            static SERIAL: AtomicU32 = AtomicU32::new(1);
            let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
            // SAFETY: plain C data; all-zero is valid.
            let mut ev: rdma_cm_event = unsafe { std::mem::zeroed() };
            ev.event = kind;
            ev.id = id;
            ev.listen_id = listen_id;
            let private = private.to_vec();
            // SAFETY: a live fake ID.
            if unsafe { (*id).qp_type } == IBV_QPT_UD {
                ev.param.ud.private_data = private.as_ptr().cast();
                ev.param.ud.private_data_len = private.len() as u8;
                ev.param.ud.qp_num = 0xff_ffff;
                ev.param.ud.qkey = qkey;
            } else {
                ev.param.conn.private_data = private.as_ptr().cast();
                ev.param.conn.private_data_len = private.len() as u8;
            }
            let c = ch.cast::<Channel>();
            let e = Box::new(Event {
                ev,
                ch: c,
                serial,
                _private: private,
            });
            // SAFETY: a live channel of `channel`.
            let c = unsafe { &*c };
            c.queue.lock().unwrap().push_back(Box::into_raw(e) as usize);
            let one = 1u64;
            // SAFETY: 8 readable bytes; the channel's open eventfd.
            let written = unsafe { libc::write(c.ch.fd, (&one as *const u64).cast(), 8) };
            assert_eq!(written, 8);
            serial
        }

        /// What happened on `ch` since the last call: `ack #n`, `reject 0x..`,
        /// `destroy_id 0x..`, in order.
        pub fn take_log(ch: *mut rdma_event_channel) -> Vec<String> {
            // SAFETY: a live channel of `channel`.
            std::mem::take(&mut *unsafe { &*ch.cast::<Channel>() }.log.lock().unwrap())
        }
    }

    fn fake_channel(fns: &'static RdmaCmFns) -> EventChannel {
        EventChannel {
            inner: Arc::new(ChannelInner::new(fns, fake::channel())),
        }
    }

    fn fake_cm_id(ctx: &Context, ps: PortSpace) -> CmId {
        let channel = fake_channel(&fake::FNS);
        CmId::adopt(&channel, fake::id(ctx.as_raw(), ps.qp_type().raw()), ps)
    }

    #[test]
    fn create_qp_makes_a_typed_qp_destroyed_before_the_id() {
        let ctx = Context::open("softnic").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let mut id = fake_cm_id(&ctx, PortSpace::Tcp);
        assert!(id.qp().is_none() && id.qp_raw().is_null());
        let qp = id
            .create_qp(
                QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
                    .max_send_wr(32)
                    .max_send_sge(2)
                    .max_inline_data(64)
                    .sq_sig_all(true),
            )
            .unwrap();
        assert_eq!(qp.qp_type(), QpType::Rc);
        assert!(qp.cap().max_inline_data >= 64);
        assert!(qp.cap().max_send_wr >= 32 && qp.cap().max_send_sge >= 2);
        let raw = qp.as_raw();
        // SAFETY: the fake ID is live.
        assert_eq!(raw, unsafe { (*id.as_raw()).qp });
        assert_eq!(id.qp_raw(), raw);
        // SAFETY: the QP is live (the ID holds it).
        assert_eq!(id.qp().map(Qp::qp_num), Some(unsafe { (*raw).qp_num }));
        assert_eq!(fake::calls(), ["rdma_create_qp"]);

        // One QP per ID.
        let e = id
            .create_qp(QpBuilder::new(&pd, &cq, &cq, QpType::Rc))
            .unwrap_err();
        assert_eq!((e.verb(), e.errno()), ("rdma_create_qp", libc::EBUSY));
        assert!(fake::calls().is_empty());

        // The QP is a first-class one: it connects and sends like any other.
        let peer = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
        let qp = id.qp().unwrap();
        let port = ctx.port_info(None, None).unwrap();
        let opts = crate::ConnectOptions::default();
        qp.connect(&port, &peer.endpoint(&port), &opts).unwrap();
        peer.connect(&port, &qp.endpoint(&port), &opts).unwrap();
        let mut tx = pd.alloc_mr(64, crate::AccessFlags::LOCAL_WRITE).unwrap();
        let rx = pd.alloc_mr(64, crate::AccessFlags::LOCAL_WRITE).unwrap();
        tx.write_from(0, b"over a cm qp").unwrap();
        // SAFETY: rx and tx stay registered and untouched until their completions.
        unsafe {
            peer.post_recv(1, &[rx.local(0, 64).unwrap()]).unwrap();
            // Unsignaled WR: sq_sig_all makes it complete anyway.
            qp.post_send(&crate::SendWr::send(2, &[tx.local(0, 12).unwrap()]))
                .unwrap();
        }
        let mut ids = [0; 2];
        for i in &mut ids {
            *i = cq
                .wait_one(Duration::from_secs(5))
                .unwrap()
                .ok()
                .unwrap()
                .wr_id();
        }
        ids.sort();
        assert_eq!(ids, [1, 2]);
        assert_eq!(rx.read_vec(0, 12).unwrap(), b"over a cm qp");
        drop(peer);

        // The ID destroys its QP (rdma_destroy_qp) before itself, and with it the QP's
        // hold on the PD and CQ.
        id.destroy().unwrap();
        assert_eq!(fake::calls(), ["rdma_destroy_qp", "rdma_destroy_id"]);
        drop((tx, rx));
        cq.destroy().unwrap();
        pd.destroy().unwrap();
    }

    #[test]
    fn create_qp_on_a_udp_id_makes_a_ud_qp() {
        let ctx = Context::open("softnic").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let mut id = fake_cm_id(&ctx, PortSpace::Udp);
        assert_eq!(id.port_space(), PortSpace::Udp);
        let qp = id
            .create_qp(QpBuilder::new(&pd, &cq, &cq, QpType::Ud).max_recv_wr(4))
            .unwrap();
        assert_eq!(qp.qp_type(), QpType::Ud);
        drop(id);
        assert_eq!(
            fake::calls(),
            ["rdma_create_qp", "rdma_destroy_qp", "rdma_destroy_id"]
        );
    }

    #[test]
    fn create_qp_refuses_another_context_and_other_qp_types() {
        let ctx = Context::open("softnic").unwrap();
        let other = Context::open_softnic_with(crate::SoftnicConfig {
            name: "softnic-cm-other".into(),
            ..Default::default()
        })
        .unwrap();
        let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(16, None).unwrap());
        let (opd, ocq) = (
            other.alloc_pd().unwrap(),
            other.create_cq(16, None).unwrap(),
        );
        let mut id = fake_cm_id(&ctx, PortSpace::Tcp);

        let e = id
            .create_qp(QpBuilder::new(&opd, &ocq, &ocq, QpType::Rc))
            .unwrap_err();
        assert_eq!((e.verb(), e.errno()), ("rdma_create_qp", libc::EINVAL));
        assert!(e.to_string().contains("CmId::context"), "{e}");
        // Mixed contexts: build_with's own check.
        let e = id
            .create_qp(QpBuilder::new(&pd, &ocq, &cq, QpType::Rc))
            .unwrap_err();
        assert_eq!((e.verb(), e.errno()), ("rdma_create_qp", libc::EINVAL));

        let e = id
            .create_qp(QpBuilder::new(&pd, &cq, &cq, QpType::Ud))
            .unwrap_err();
        assert_eq!((e.verb(), e.errno()), ("rdma_create_qp", libc::EINVAL));
        assert!(e.to_string().contains("RDMA_PS_UDP"), "{e}");
        let e = id
            .create_qp(QpBuilder::new(&pd, &cq, &cq, QpType::Uc))
            .unwrap_err();
        assert!(e.to_string().contains("UC"), "{e}");
        // Refused before the verb: nothing was created, the ID is still free for its QP.
        assert!(fake::calls().is_empty());
        assert!(id.qp().is_none());
        id.create_qp(QpBuilder::new(&pd, &cq, &cq, QpType::Rc))
            .unwrap();
        drop(id);
        assert_eq!(
            fake::calls(),
            ["rdma_create_qp", "rdma_destroy_qp", "rdma_destroy_id"]
        );
    }

    #[test]
    fn create_qp_reports_the_verbs_errno_with_the_cap_hint() {
        let ctx = Context::open_softnic_with(crate::SoftnicConfig {
            name: "softnic-cm-small".into(),
            max_qp_wr: 8,
            ..Default::default()
        })
        .unwrap();
        let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(64, None).unwrap());
        let mut id = fake_cm_id(&ctx, PortSpace::Tcp);
        let e = id
            .create_qp(QpBuilder::new(&pd, &cq, &cq, QpType::Rc).max_send_wr(9))
            .unwrap_err();
        assert_eq!((e.verb(), e.errno()), ("rdma_create_qp", libc::EINVAL));
        assert!(e.to_string().contains("max_qp_wr 8"), "{e}");
        assert!(id.qp().is_none());
        drop(id);
        assert_eq!(fake::calls(), ["rdma_create_qp", "rdma_destroy_id"]);
    }

    #[test]
    fn multicast_joins_are_checked_before_the_verb() {
        let ctx = Context::open("softnic").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let group: SocketAddr = "239.1.2.3:0".parse().unwrap();
        let t = Duration::from_secs(1);
        // Not a multicast address.
        let mut id = fake_cm_id(&ctx, PortSpace::Udp);
        for a in ["10.77.0.1:0", "[fe80::1]:0"] {
            let e = id.join_multicast(a.parse().unwrap(), t).unwrap_err();
            assert_eq!((e.verb(), e.errno()), ("rdma_join_multicast", libc::EINVAL));
            assert!(e.to_string().contains("not a multicast address"), "{e}");
            let e = id.leave_multicast(a.parse().unwrap()).unwrap_err();
            assert_eq!(
                (e.verb(), e.errno()),
                ("rdma_leave_multicast", libc::EINVAL)
            );
        }
        // No QP yet: librdmacm would join without attaching anything.
        let e = id.join_multicast(group, t).unwrap_err();
        assert_eq!((e.verb(), e.errno()), ("rdma_join_multicast", libc::EINVAL));
        assert!(e.to_string().contains("CmId::create_qp"), "{e}");
        // With its QP, an IPv4 or IPv6 group reaches the verb (the fake has none: ENOSYS).
        id.create_qp(QpBuilder::new(&pd, &cq, &cq, QpType::Ud))
            .unwrap();
        for g in [group, "[ff0e::1:2]:0".parse().unwrap()] {
            let e = id.join_multicast(g, t).unwrap_err();
            assert_eq!((e.verb(), e.errno()), ("rdma_join_multicast", libc::ENOSYS));
            let e = id.leave_multicast(g).unwrap_err();
            assert_eq!(
                (e.verb(), e.errno()),
                ("rdma_leave_multicast", libc::ENOSYS)
            );
        }
        // An RC ID never joins.
        let rc = fake_cm_id(&ctx, PortSpace::Tcp);
        let e = rc.join_multicast(group, t).unwrap_err();
        assert_eq!((e.verb(), e.errno()), ("rdma_join_multicast", libc::EINVAL));
        assert!(e.to_string().contains("RDMA_PS_UDP"), "{e}");
        let e = rc.leave_multicast(group).unwrap_err();
        assert!(e.to_string().contains("RDMA_PS_UDP"), "{e}");
        drop((id, rc));
        assert_eq!(
            fake::calls(),
            [
                "rdma_create_qp",
                "rdma_destroy_qp",
                "rdma_destroy_id",
                "rdma_destroy_id"
            ]
        );
    }

    #[test]
    fn sockaddr_v4_layout() {
        let (ss, len) = sockaddr_of(&"10.77.0.1:7471".parse().unwrap());
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in>());
        // SAFETY: sockaddr_of wrote a sockaddr_in at the start.
        let sin: libc::sockaddr_in =
            unsafe { std::ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
        assert_eq!(sin.sin_family as i32, libc::AF_INET);
        assert_eq!(u16::from_be(sin.sin_port), 7471);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 77, 0, 1]);
    }

    const T: Duration = Duration::from_secs(5);

    // ----------------------------------------------------------------------------------
    // Routing through CmId, over the fake librdmacm's event channel
    // ----------------------------------------------------------------------------------

    fn ev_channel() -> EventChannel {
        fake_channel(&fake::EV_FNS)
    }

    /// A raw ID on `ch` no CmId holds yet (a connect request's new ID, or a stray).
    fn raw_id(ch: &EventChannel, qp_type: u32) -> *mut rdma_cm_id {
        fake::id_on(ch.inner.ch, std::ptr::null_mut(), qp_type)
    }

    fn count(log: &[String], what: &str) -> usize {
        log.iter().filter(|l| *l == what).count()
    }

    #[test]
    fn join_multicast_returns_its_own_group_when_another_ids_join_comes_first() {
        let ctx = Context::open("softnic").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let ch = ev_channel();
        let group: SocketAddr = "239.1.2.3:0".parse().unwrap();
        let mut ids = [0, 1].map(|_| {
            let id = fake::id_on(ch.inner.ch, ctx.as_raw(), hotverbs_ffi::IBV_QPT_UD);
            CmId::adopt(&ch, id, PortSpace::Udp)
        });
        for id in &mut ids {
            id.create_qp(QpBuilder::new(&pd, &cq, &cq, QpType::Ud))
                .unwrap();
        }
        let [a, b] = &ids;
        let join = hotverbs_ffi::RDMA_CM_EVENT_MULTICAST_JOIN;
        let nb = fake::push(
            ch.inner.ch,
            join,
            b.as_raw(),
            std::ptr::null_mut(),
            &[],
            0xb,
        );
        let na = fake::push(
            ch.inner.ch,
            join,
            a.as_raw(),
            std::ptr::null_mut(),
            &[],
            0xa,
        );
        assert_eq!(
            a.join_multicast(group, T).unwrap().qkey,
            0xa,
            "a's own join"
        );
        // b's join was parked for it.
        let g = b.join_multicast(group, Duration::ZERO).unwrap();
        assert_eq!((g.qp_num, g.qkey), (0xff_ffff, 0xb));
        let log = fake::take_log(ch.inner.ch);
        assert_eq!(log, [format!("ack #{nb}"), format!("ack #{na}")]);
        drop(ids);
        let log = fake::take_log(ch.inner.ch);
        assert_eq!(log.len(), 2, "two destroys, nothing else: {log:?}");
    }

    #[test]
    fn a_connect_request_read_by_a_connecting_id_waits_for_its_listener() {
        let ch = ev_channel();
        let listener = CmId::new(&ch).unwrap();
        let client = CmId::new(&ch).unwrap();
        let new = raw_id(&ch, hotverbs_ffi::IBV_QPT_RC);
        use hotverbs_ffi::{RDMA_CM_EVENT_CONNECT_REQUEST as REQ, RDMA_CM_EVENT_ESTABLISHED};
        let n1 = fake::push(ch.inner.ch, REQ, new, listener.as_raw(), b"hello", 0);
        let n2 = fake::push(
            ch.inner.ch,
            RDMA_CM_EVENT_ESTABLISHED,
            client.as_raw(),
            std::ptr::null_mut(),
            b"welcome",
            0,
        );
        let reply = client.connect(&ConnParam::default(), T).unwrap();
        assert_eq!(reply, b"welcome");
        let (conn, private) = listener.get_request(Duration::ZERO).unwrap();
        assert_eq!((conn.as_raw(), private.as_slice()), (new, &b"hello"[..]));
        assert_eq!(
            fake::take_log(ch.inner.ch),
            [format!("ack #{n1}"), format!("ack #{n2}")]
        );
        // The taken request's ID is the CmId's: destroyed once, when it goes, not refused.
        drop(conn);
        assert_eq!(fake::take_log(ch.inner.ch), [format!("destroy_id {new:p}")]);
    }

    #[test]
    fn a_connect_request_of_no_live_listener_is_refused_not_leaked() {
        use hotverbs_ffi::{RDMA_CM_EVENT_CONNECT_REQUEST as REQ, RDMA_CM_EVENT_ESTABLISHED};
        let ch = ev_channel();
        let client = CmId::new(&ch).unwrap();
        // A listener no CmId holds (as after its CmId went while the request was queued).
        let stray = raw_id(&ch, hotverbs_ffi::IBV_QPT_RC);
        let new = raw_id(&ch, hotverbs_ffi::IBV_QPT_RC);
        let n1 = fake::push(ch.inner.ch, REQ, new, stray, b"anyone?", 0);
        let n2 = fake::push(
            ch.inner.ch,
            RDMA_CM_EVENT_ESTABLISHED,
            client.as_raw(),
            std::ptr::null_mut(),
            &[],
            0,
        );
        client.connect(&ConnParam::default(), T).unwrap();
        assert_eq!(
            fake::take_log(ch.inner.ch),
            [
                format!("ack #{n1}"),
                format!("reject {new:p}"),
                format!("destroy_id {new:p}"),
                format!("ack #{n2}"),
            ]
        );
        // SAFETY: the stray's box, never handed to anything that frees it.
        drop(unsafe { Box::from_raw(stray) });
    }

    #[test]
    fn a_listener_dropped_with_a_parked_request_refuses_it() {
        use hotverbs_ffi::{RDMA_CM_EVENT_CONNECT_REQUEST as REQ, RDMA_CM_EVENT_ESTABLISHED};
        let ch = ev_channel();
        let listener = CmId::new(&ch).unwrap();
        let client = CmId::new(&ch).unwrap();
        let new = raw_id(&ch, hotverbs_ffi::IBV_QPT_RC);
        fake::push(ch.inner.ch, REQ, new, listener.as_raw(), &[], 0);
        fake::push(
            ch.inner.ch,
            RDMA_CM_EVENT_ESTABLISHED,
            client.as_raw(),
            std::ptr::null_mut(),
            &[],
            0,
        );
        client.connect(&ConnParam::default(), T).unwrap();
        let l = listener.as_raw();
        let log = fake::take_log(ch.inner.ch);
        assert_eq!(log.iter().filter(|l| l.starts_with("ack")).count(), 2);
        drop(listener);
        assert_eq!(
            fake::take_log(ch.inner.ch),
            [
                format!("reject {new:p}"),
                format!("destroy_id {new:p}"),
                format!("destroy_id {l:p}"),
            ]
        );
    }

    #[test]
    fn a_request_read_while_its_listener_waits_for_another_event_is_refused() {
        let ch = ev_channel();
        let listener = CmId::new(&ch).unwrap();
        let new = raw_id(&ch, hotverbs_ffi::IBV_QPT_RC);
        let n = fake::push(
            ch.inner.ch,
            hotverbs_ffi::RDMA_CM_EVENT_CONNECT_REQUEST,
            new,
            listener.as_raw(),
            &[],
            0,
        );
        let e = listener.wait_disconnected(T).unwrap_err();
        assert_eq!(
            (e.verb(), e.errno()),
            ("rdma_disconnect", libc::ECONNREFUSED)
        );
        let msg = e.to_string();
        assert!(
            msg.contains("expected RDMA_CM_EVENT_DISCONNECTED, got RDMA_CM_EVENT_CONNECT_REQUEST")
                && msg.contains("rejected"),
            "{msg}"
        );
        assert_eq!(
            fake::take_log(ch.inner.ch),
            [
                format!("ack #{n}"),
                format!("reject {new:p}"),
                format!("destroy_id {new:p}"),
            ]
        );
    }

    #[test]
    fn a_cm_wait_times_out_on_time_while_other_ids_events_arrive() {
        let ch = ev_channel();
        let listener = CmId::new(&ch).unwrap();
        let client = CmId::new(&ch).unwrap();
        const N: usize = 50;
        let (raw_ch, l) = (ch.inner.ch as usize, listener.as_raw() as usize);
        let feeder = std::thread::spawn(move || {
            for _ in 0..N {
                fake::push(
                    raw_ch as *mut rdma_event_channel,
                    hotverbs_ffi::RDMA_CM_EVENT_DISCONNECTED,
                    l as *mut rdma_cm_id,
                    std::ptr::null_mut(),
                    &[],
                    0,
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let wait = Duration::from_millis(300);
        let t0 = Instant::now();
        let e = client.connect(&ConnParam::default(), wait).unwrap_err();
        let took = t0.elapsed();
        assert_eq!((e.verb(), e.errno()), ("rdma_connect", libc::ETIMEDOUT));
        assert!(
            e.to_string()
                .contains("no RDMA_CM_EVENT_ESTABLISHED within 300ms"),
            "{e}"
        );
        // (A timeout per read would end only after the last of the listener's events.)
        assert!(
            took >= wait && took < wait + Duration::from_millis(400),
            "{took:?}"
        );
        feeder.join().unwrap();
        // None of the listener's events was lost to the client's wait.
        for _ in 0..N {
            listener.wait_disconnected(T).unwrap();
        }
        let log = fake::take_log(ch.inner.ch);
        assert_eq!(log.len(), N, "{log:?}");
        assert_eq!(
            ch.get_event(Duration::ZERO).unwrap_err().errno(),
            libc::ETIMEDOUT
        );
    }

    #[test]
    fn two_threads_waiting_on_one_channel_each_get_their_ids_events() {
        use hotverbs_ffi::{RDMA_CM_EVENT_CONNECT_REQUEST as REQ, RDMA_CM_EVENT_DISCONNECTED};
        let ch = ev_channel();
        let listener = CmId::new(&ch).unwrap();
        let client = CmId::new(&ch).unwrap();
        let (l, c) = (listener.as_raw(), client.as_raw());
        const N: u32 = 200;
        let server = std::thread::spawn(move || {
            // Kept until the end: a new ID's address is reused once it is destroyed.
            let mut conns = Vec::new();
            for i in 0..N {
                let (conn, private) = listener.get_request(T).unwrap();
                assert_eq!(private, i.to_le_bytes(), "requests in order");
                conns.push(conn);
            }
            (listener, conns)
        });
        let disconnects = std::thread::spawn(move || {
            for _ in 0..N {
                client.wait_disconnected(T).unwrap();
            }
            client
        });
        let mut news = Vec::new();
        for i in 0..N {
            let new = raw_id(&ch, hotverbs_ffi::IBV_QPT_RC);
            news.push(new as usize);
            fake::push(ch.inner.ch, REQ, new, l, &i.to_le_bytes(), 0);
            fake::push(
                ch.inner.ch,
                RDMA_CM_EVENT_DISCONNECTED,
                c,
                std::ptr::null_mut(),
                &[],
                0,
            );
            if i % 8 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let (listener, conns) = server.join().unwrap();
        let taken: Vec<usize> = conns.iter().map(|c| c.as_raw() as usize).collect();
        assert_eq!(taken, news, "each request to the listener, in order");
        let client = disconnects.join().unwrap();
        let log = fake::take_log(ch.inner.ch);
        let acks: HashSet<&String> = log.iter().filter(|l| l.starts_with("ack")).collect();
        assert_eq!(acks.len(), 2 * N as usize, "every event acked");
        assert_eq!(log.len(), 2 * N as usize, "once, and nothing else: {log:?}");
        drop(conns);
        let log = fake::take_log(ch.inner.ch);
        for new in news {
            let destroyed = format!("destroy_id {:p}", new as *mut rdma_cm_id);
            assert_eq!(count(&log, &destroyed), 1, "{destroyed}");
        }
        assert_eq!(log.len(), N as usize, "{log:?}");
        drop((listener, client));
        assert_eq!(
            fake::take_log(ch.inner.ch),
            [format!("destroy_id {l:p}"), format!("destroy_id {c:p}")]
        );
    }
}
