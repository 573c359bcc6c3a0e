//! The rdma_cm path (librdmacm, loaded at run time): event channel, IDs, address and
//! route resolution, an RC QP on the ID, connect/accept, disconnect — with every event
//! surfaced by name (`RDMA_CM_EVENT_ESTABLISHED`).
//!
//! librdmacm opens its own device contexts; [`CmId::context`] wraps the ID's context (not
//! owned by us) so the ordinary [`Pd`]/[`Cq`] types work on it. rdma_cm needs a real
//! device with an IP address: softnic has no rdma_cm.
//!
//! Invariants: a [`CmId`] holds its [`EventChannel`] (the channel outlives its IDs) and,
//! once it has a QP, clones of the PD and CQs the QP uses; the QP is destroyed
//! (`rdma_destroy_qp`) before the ID (`rdma_destroy_id`). Events are copied out and
//! acknowledged immediately, so no unacknowledged event ever blocks `rdma_destroy_id`.
//!
//! # Example (needs an RDMA device with an IP; prints why not otherwise)
//! ```no_run
//! use std::time::Duration;
//! use hotverbs::cm::{CmId, ConnParam, EventChannel};
//! let t = Duration::from_secs(5);
//! let ch = EventChannel::new()?;
//! let mut id = CmId::new(&ch)?;
//! id.resolve_addr(None, "10.77.0.1:7471".parse().unwrap(), t)?;
//! id.resolve_route(t)?;
//! let ctx = id.context()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(64, None)?;
//! id.create_qp(&pd, &cq, &cq, 16, 16)?;
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
    ibv_qp, ibv_qp_init_attr, rdma_cm_event, rdma_cm_id, rdma_conn_param, rdma_event_channel,
    RdmaCmFns,
};

use crate::cq::{poll_readable, set_nonblocking, Cq};
use crate::device::Context;
use crate::error::{record_drop_error, Error, Result};
use crate::pd::Pd;

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
}

// SAFETY: an event channel is an fd; librdmacm's calls on it are thread-safe.
unsafe impl Send for ChannelInner {}
// SAFETY: see Send.
unsafe impl Sync for ChannelInner {}

impl Drop for ChannelInner {
    fn drop(&mut self) {
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
        let inner = ChannelInner { fns, ch };
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

    /// Waits up to `timeout` for the next event (`rdma_get_cm_event(3)`), copies it and
    /// acknowledges it (`rdma_ack_cm_event(3)`).
    ///
    /// # Errors
    /// `ETIMEDOUT` when nothing arrives in time.
    pub fn get_event(&self, timeout: Duration) -> Result<CmEvent> {
        if !poll_readable(self.as_fd(), timeout)? {
            return Err(Error::new("rdma_get_cm_event", libc::ETIMEDOUT)
                .with_hint(format!("no rdma_cm event within {timeout:?}")));
        }
        let fns = self.inner.fns;
        let get = fns
            .rdma_get_cm_event
            .ok_or_else(|| Error::missing("rdma_get_cm_event"))?;
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointer.
        let ret = unsafe { get(self.inner.ch, &mut ev) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_get_cm_event", ret));
        }
        // SAFETY: ev is a valid event until acked; private data (if any) is
        // private_data_len bytes; the union member `conn` is valid for connection events
        // and otherwise zero-length.
        let out = unsafe {
            let e = &*ev;
            let conn = e.param.conn;
            let private_data = if conn.private_data.is_null() || !is_conn_event(e.event) {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    conn.private_data_len as usize,
                )
                .to_vec()
            };
            CmEvent {
                kind: e.event,
                name: event_name(e.event),
                status: e.status,
                id: e.id,
                listen_id: e.listen_id,
                private_data,
            }
        };
        if let Some(ack) = fns.rdma_ack_cm_event {
            // SAFETY: ev came from rdma_get_cm_event and is acked once.
            unsafe { ack(ev) };
        }
        Ok(out)
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
/// assert_eq!(p.retry_count, 7);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnParam {
    /// Up to 56 bytes for the peer (e.g. an [`Endpoint`](crate::Endpoint) with an MR).
    pub private_data: Vec<u8>,
    /// Outstanding RDMA reads/atomics we answer.
    pub responder_resources: u8,
    /// Outstanding RDMA reads/atomics we initiate.
    pub initiator_depth: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry_count: u8,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

impl ConnParam {
    fn to_raw(&self) -> Result<rdma_conn_param> {
        if self.private_data.len() > 56 {
            return Err(Error::new("rdma_connect", libc::EINVAL)
                .with_hint("private data is limited to 56 bytes (RC connect)"));
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
/// Active side: [`new`](Self::new), [`resolve_addr`](Self::resolve_addr),
/// [`resolve_route`](Self::resolve_route), [`create_qp`](Self::create_qp),
/// [`connect`](Self::connect). Passive side: [`bind`](Self::bind),
/// [`listen`](Self::listen), [`get_request`](Self::get_request) (a new `CmId`),
/// `create_qp`, [`accept`](Self::accept). Both: [`disconnect`](Self::disconnect).
///
/// # Example
/// ```no_run
/// use std::time::Duration;
/// use hotverbs::cm::{CmId, ConnParam, EventChannel};
/// let t = Duration::from_secs(5);
/// let ch = EventChannel::new()?;
/// let listener = CmId::new(&ch)?;
/// listener.bind("0.0.0.0:7471".parse().unwrap())?;
/// listener.listen(8)?;
/// let (mut conn, _private) = listener.get_request(t)?;
/// let ctx = conn.context()?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64, None)?;
/// conn.create_qp(&pd, &cq, &cq, 16, 16)?;
/// conn.accept(&ConnParam::default(), t)?;
/// # Ok::<(), hotverbs::Error>(())
/// ```
pub struct CmId {
    fns: &'static RdmaCmFns,
    id: *mut rdma_cm_id,
    channel: EventChannel,
    qp_parts: Option<(Pd, Cq, Cq)>,
}

// SAFETY: librdmacm calls on an ID are thread-safe; the struct holds identifiers.
unsafe impl Send for CmId {}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("id", &self.id)
            .field("has_qp", &self.qp_parts.is_some())
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
    /// `rdma_create_id(3)` on `channel`, port space TCP (reliable connected).
    pub fn new(channel: &EventChannel) -> Result<CmId> {
        let fns = channel.inner.fns;
        let f = fns
            .rdma_create_id
            .ok_or_else(|| Error::missing("rdma_create_id"))?;
        let mut id: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointer.
        let ret = unsafe {
            f(
                channel.inner.ch,
                &mut id,
                std::ptr::null_mut(),
                hotverbs_ffi::RDMA_PS_TCP,
            )
        };
        if ret != 0 {
            return Err(Error::from_ret("rdma_create_id", ret));
        }
        Ok(CmId {
            fns,
            id,
            channel: channel.clone(),
            qp_parts: None,
        })
    }

    /// The raw `rdma_cm_id`.
    pub fn as_raw(&self) -> *mut rdma_cm_id {
        self.id
    }

    /// Waits for the next event on the channel and checks it is `want`.
    fn expect(&self, verb: &'static str, want: u32, timeout: Duration) -> Result<CmEvent> {
        let ev = self.channel.get_event(timeout).map_err(|e| {
            if e.errno == libc::ETIMEDOUT {
                Error::new(verb, libc::ETIMEDOUT)
                    .with_hint(format!("no {} within {timeout:?}", event_name(want)))
            } else {
                e
            }
        })?;
        if ev.kind != want {
            let errno = if ev.status < 0 {
                -ev.status
            } else {
                libc::ECONNREFUSED
            };
            return Err(Error::new(verb, errno).with_hint(format!(
                "expected {}, got {} (status {})",
                event_name(want),
                ev.name,
                ev.status
            )));
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
    /// incoming connection, and the private data the client sent.
    pub fn get_request(&self, timeout: Duration) -> Result<(CmId, Vec<u8>)> {
        let ev = self.expect(
            "rdma_get_cm_event",
            hotverbs_ffi::RDMA_CM_EVENT_CONNECT_REQUEST,
            timeout,
        )?;
        Ok((
            CmId {
                fns: self.fns,
                id: ev.id,
                channel: self.channel.clone(),
                qp_parts: None,
            },
            ev.private_data,
        ))
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
        // SAFETY: librdmacm keeps its device contexts open for the life of the process
        // (they are closed only when librdmacm is unloaded, which never happens).
        Ok(unsafe { Context::from_raw_borrowed(fns, verbs) })
    }

    /// `rdma_create_qp(3)`: an RC QP owned by this ID (rdma_cm moves it through the
    /// states on connect/accept). `pd` and the CQs must be of [`context`](Self::context).
    pub fn create_qp(
        &mut self,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        max_send_wr: u32,
        max_recv_wr: u32,
    ) -> Result<()> {
        let f = self
            .fns
            .rdma_create_qp
            .ok_or_else(|| Error::missing("rdma_create_qp"))?;
        // SAFETY: live ID.
        let verbs = unsafe { (*self.id).verbs };
        if [pd.context(), send_cq.context(), recv_cq.context()]
            .iter()
            .any(|c| c.as_raw() != verbs)
        {
            return Err(Error::new("rdma_create_qp", libc::EINVAL)
                .with_hint("the PD and CQs must be of this ID's device context (CmId::context)"));
        }
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.as_raw(),
            recv_cq: recv_cq.as_raw(),
            srq: std::ptr::null_mut(),
            cap: hotverbs_ffi::ibv_qp_cap {
                max_send_wr,
                max_recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: hotverbs_ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live ID; PD and CQs live (we keep clones) and of the ID's context.
        let ret = unsafe { f(self.id, pd.as_raw(), &mut init) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_create_qp", ret));
        }
        self.qp_parts = Some((pd.clone(), send_cq.clone(), recv_cq.clone()));
        Ok(())
    }

    /// The raw QP made by [`create_qp`](Self::create_qp) (null before), valid while this
    /// ID lives. Post and poll through it as with [`Qp::as_raw`](crate::Qp::as_raw).
    pub fn qp_raw(&self) -> *mut ibv_qp {
        // SAFETY: live ID.
        unsafe { (*self.id).qp }
    }

    /// `rdma_connect(3)` and wait for `RDMA_CM_EVENT_ESTABLISHED`; returns the private
    /// data the server sent with its accept.
    pub fn connect(&self, param: &ConnParam, timeout: Duration) -> Result<Vec<u8>> {
        let f = self
            .fns
            .rdma_connect
            .ok_or_else(|| Error::missing("rdma_connect"))?;
        let mut p = param.to_raw()?;
        // SAFETY: live ID with a resolved route; p and its private data valid for the call.
        let ret = unsafe { f(self.id, &mut p) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_connect", ret));
        }
        Ok(self
            .expect(
                "rdma_connect",
                hotverbs_ffi::RDMA_CM_EVENT_ESTABLISHED,
                timeout,
            )?
            .private_data)
    }

    /// `rdma_accept(3)` and wait for `RDMA_CM_EVENT_ESTABLISHED`.
    pub fn accept(&self, param: &ConnParam, timeout: Duration) -> Result<()> {
        let f = self
            .fns
            .rdma_accept
            .ok_or_else(|| Error::missing("rdma_accept"))?;
        let mut p = param.to_raw()?;
        // SAFETY: live ID from a connect request; p valid for the call.
        let ret = unsafe { f(self.id, &mut p) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_accept", ret));
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
        if self.qp_parts.is_some() {
            if let Some(f) = self.fns.rdma_destroy_qp {
                // SAFETY: the ID owns a QP made by rdma_create_qp.
                unsafe { f(id) };
            }
        }
        let f = self
            .fns
            .rdma_destroy_id
            .ok_or_else(|| Error::missing("rdma_destroy_id"))?;
        // SAFETY: live ID, its QP destroyed, all its events acked.
        let ret = unsafe { f(id) };
        self.qp_parts = None;
        if ret != 0 {
            return Err(Error::from_ret("rdma_destroy_id", ret));
        }
        Ok(())
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

    #[test]
    fn event_channel_opens_or_says_why() {
        // Here (no RDMA device) it fails with a hint; with a device it opens.
        match EventChannel::new() {
            Ok(ch) => {
                assert!(ch.as_raw_fd() >= 0);
                assert_eq!(ch.as_fd().as_raw_fd(), ch.as_raw_fd());
            }
            Err(e) => {
                assert_eq!(e.verb, "rdma_create_event_channel");
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
    fn private_data_is_limited() {
        let p = ConnParam {
            private_data: vec![0; 57],
            ..Default::default()
        };
        assert_eq!(p.to_raw().err().map(|e| e.errno), Some(libc::EINVAL));
        let p = ConnParam {
            private_data: vec![7; 56],
            ..Default::default()
        };
        assert_eq!(p.to_raw().unwrap().private_data_len, 56);
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
}
