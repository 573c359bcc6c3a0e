//! Shared receive queues (`ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`,
//! `ibv_post_srq_recv`, `ibv_destroy_srq`).
//!
//! Invariants: an [`Srq`] is an `Arc<SrqInner>`; QPs attached to it hold clones, so it is
//! destroyed after them; it holds a clone of its PD.

use std::fmt;
use std::sync::{Arc, Mutex};

use hotverbs_ffi::{ibv_cq, ibv_srq, ibv_srq_attr, ibv_srq_init_attr};

use crate::bridge::RingReservation;
use crate::error::{record_drop_error, Error, Result};
use crate::mr::{Lease, Mr, Sge};
use crate::pd::Pd;

pub(crate) struct SrqInner {
    srq: *mut ibv_srq,
    pd: Pd,
    /// Receive leases ([`Srq::lease_recv`]): released when the SRQ is destroyed (a QP
    /// reset leaves an SRQ's receives posted).
    leases: Mutex<Vec<Lease>>,
    /// Which CQs the SRQ's receives complete on (see [`SrqCqs`]).
    cqs: Mutex<SrqCqs>,
    /// The SRQ's number when a direct SRQ ring writes it (`Srq::direct_recv_ring`), else 0:
    /// its destruction first detaches it from the direct poller of the ring's CQ.
    direct_srqn: std::sync::atomic::AtomicU32,
}

/// The receive CQs of the QPs attached to an SRQ, and the CQ of its ring: a ring reserves
/// room for its receives' completions on one CQ, so while it exists every attached QP
/// completes its receives there (else another CQ could overflow, or a poller that knows no
/// such ring would be handed them).
#[derive(Default)]
struct SrqCqs {
    /// One entry per live attached QP: its receive CQ.
    attached: Vec<*mut ibv_cq>,
    /// The ring's claim on its CQ (kept until the SRQ is destroyed: the ring's receives
    /// stay posted). One ring per SRQ, for the SRQ's life.
    ring: Option<RingReservation>,
}

// SAFETY: SRQ verbs are thread-safe; the struct is an identifier.
unsafe impl Send for SrqInner {}
// SAFETY: see Send.
unsafe impl Sync for SrqInner {}

impl SrqInner {
    fn destroy(&mut self) -> Result<()> {
        let srq = std::mem::replace(&mut self.srq, std::ptr::null_mut());
        if srq.is_null() {
            return Ok(());
        }
        let f = self
            .pd
            .context()
            .fns()
            .ibv_destroy_srq
            .ok_or_else(|| Error::missing("ibv_destroy_srq"))?;
        let srqn = *self.direct_srqn.get_mut();
        if srqn != 0 {
            // The direct poller reads this SRQ's WQEs and writes its leased slots: it stops
            // serving it (and no poll of it is running) before the memory goes.
            let cqs = self.cqs.get_mut().unwrap_or_else(|e| e.into_inner());
            if let Some(r) = cqs.ring.as_ref() {
                r.cq().inner.rings.defer_detach_srq_and_wait(srqn);
            }
        }
        // SAFETY: srq came from this table; no QP uses it any more.
        let ret = unsafe { f(srq) };
        if ret != 0 {
            // The SRQ may live on with its receives: its leases stay held for good.
            return Err(Error::from_ret("ibv_destroy_srq", ret));
        }
        for l in self
            .leases
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            l.release();
        }
        let cqs = self.cqs.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = cqs.ring.take() {
            r.release();
        }
        Ok(())
    }
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            record_drop_error(e);
        }
    }
}

/// An SRQ's attributes (`struct ibv_srq_attr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SrqAttr {
    /// Receives it can hold.
    pub max_wr: u32,
    /// SGEs per receive.
    pub max_sge: u32,
    /// The limit that raises `IBV_EVENT_SRQ_LIMIT_REACHED` (0: disarmed).
    pub srq_limit: u32,
}

/// A shared receive queue (`struct ibv_srq`): one pool of receives for many QPs.
///
/// # Example
/// ```
/// use hotverbs::{Context, QpBuilder, QpType};
/// let ctx = Context::open("softnic")?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64, None)?;
/// let srq = pd.create_srq(64, 1)?;
/// let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).srq(&srq).build()?;
/// assert!(qp.srq().is_some());
/// assert!(srq.query()?.max_wr >= 64);
/// # Ok::<(), hotverbs::Error>(())
/// ```
///
/// # References
/// `ibv_create_srq(3)`, `ibv_modify_srq(3)`, `ibv_post_srq_recv(3)`
#[derive(Clone)]
pub struct Srq {
    inner: Arc<SrqInner>,
}

impl fmt::Debug for Srq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Srq")
            .field("handle", &self.inner.srq)
            .finish()
    }
}

impl Pd {
    /// `ibv_create_srq(3)` with room for `max_wr` receives of up to `max_sge` SGEs.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let f = self
            .context()
            .fns()
            .ibv_create_srq
            .ok_or_else(|| Error::missing("ibv_create_srq"))?;
        let mut init = ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: live PD; init valid and writable.
        let srq = unsafe { f(self.as_raw(), &mut init) };
        if srq.is_null() {
            let ctx = self.context().clone();
            return Err(Error::from_errno("ibv_create_srq").or_hint(|| {
                let d = ctx.query_device().ok()?;
                Some(format!(
                    "max_wr {max_wr} (device max_srq_wr {}), max_sge {max_sge} (device max_srq_sge {})",
                    d.max_srq_wr(),
                    d.max_srq_sge()
                ))
            }));
        }
        Ok(Srq {
            inner: Arc::new(SrqInner {
                srq,
                pd: self.clone(),
                leases: Mutex::new(Vec::new()),
                cqs: Mutex::new(SrqCqs::default()),
                direct_srqn: std::sync::atomic::AtomicU32::new(0),
            }),
        })
    }
}

impl Srq {
    /// The raw `ibv_srq` for the datapath (valid while this `Srq` or a QP using it lives).
    pub fn as_raw(&self) -> *mut ibv_srq {
        self.inner.srq
    }

    /// The PD.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }

    /// A receive SGE over `[offset, offset + len)` of `mr` for receives posted to this SRQ
    /// (e.g. the region of a datapath `RecvRing`), leasing `mr` to the SRQ: from now until
    /// the SRQ is destroyed, [`Mr::as_slice`]/[`Mr::as_mut_slice`] refuse it (`EBUSY`),
    /// because posted receives stay on the SRQ whatever happens to the code that posted
    /// them (a QP reset does not remove them either).
    ///
    /// # Errors
    /// `Srq::lease_recv: EINVAL` when `mr` lacks `LOCAL_WRITE`, is in another PD, or the
    /// range is outside it.
    pub fn lease_recv(&self, mr: &Mr<'_>, offset: usize, len: usize) -> Result<Sge> {
        self.lease_as("Srq::lease_recv", mr, offset, len)
    }

    /// [`lease_recv`](Self::lease_recv), its errors naming `verb`.
    pub(crate) fn lease_as(
        &self,
        verb: &'static str,
        mr: &Mr<'_>,
        offset: usize,
        len: usize,
    ) -> Result<Sge> {
        let (sge, lease) = mr.lease(verb, &self.inner.pd, offset, len)?;
        self.inner
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(lease);
        Ok(sge)
    }

    /// A QP whose receives complete on `cq` is being attached: refused (`EINVAL`, naming
    /// `verb`) when the SRQ's ring completes on another CQ. Undone by [`detach`](Self::detach).
    pub(crate) fn attach(&self, verb: &'static str, cq: *mut ibv_cq) -> Result<()> {
        let mut c = self.inner.cqs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = &c.ring {
            if r.cq().as_raw() != cq {
                return Err(Error::new(verb, libc::EINVAL).with_hint(
                    "this SRQ has a ring (Srq::recv_ring), which reserved room for its \
                     completions on another CQ: give the QP that CQ as its receive CQ",
                ));
            }
        }
        c.attached.push(cq);
        Ok(())
    }

    /// A QP attached with receive CQ `cq` is gone.
    pub(crate) fn detach(&self, cq: *mut ibv_cq) {
        let mut c = self.inner.cqs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = c.attached.iter().position(|&a| a == cq) {
            c.attached.swap_remove(i);
        }
    }

    /// Takes the SRQ's one ring: `EBUSY` when it had one; `EINVAL` when a QP attached to
    /// it completes its receives on another CQ than `cq`. `reserve` makes the ring's claim
    /// on `cq`, kept until the SRQ is destroyed; it runs under the lock that
    /// [`attach`](Self::attach) takes, so no QP with another CQ slips in.
    /// Records that a direct SRQ ring writes this SRQ, numbered `srqn`.
    pub(crate) fn set_direct_srqn(&self, srqn: u32) {
        self.inner
            .direct_srqn
            .store(srqn, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn take_ring(
        &self,
        verb: &'static str,
        cq: *mut ibv_cq,
        reserve: impl FnOnce() -> Result<RingReservation>,
    ) -> Result<()> {
        let mut c = self.inner.cqs.lock().unwrap_or_else(|e| e.into_inner());
        if c.ring.is_some() {
            return Err(Error::new(verb, libc::EBUSY).with_hint(
                "this SRQ already has its ring (one ring per SRQ, for the SRQ's life: its \
                 receives stay posted after the ring is dropped)",
            ));
        }
        if c.attached.iter().any(|&a| a != cq) {
            return Err(Error::new(verb, libc::EINVAL).with_hint(
                "a QP attached to this SRQ completes its receives on another CQ: the ring \
                 reserves room on one CQ, so every attached QP must use the ring's CQ",
            ));
        }
        c.ring = Some(reserve()?);
        Ok(())
    }

    /// Undoes [`take_ring`](Self::take_ring) when building the ring failed after it
    /// (nothing was posted).
    pub(crate) fn untake_ring(&self) {
        let mut c = self.inner.cqs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = c.ring.take() {
            r.release();
        }
    }

    /// `ibv_query_srq(3)`: max_wr, max_sge, srq_limit.
    pub fn query(&self) -> Result<SrqAttr> {
        let a = self.query_raw()?;
        Ok(SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        })
    }

    /// `ibv_query_srq(3)` as the raw `struct ibv_srq_attr`.
    pub fn query_raw(&self) -> Result<ibv_srq_attr> {
        let f = self
            .inner
            .pd
            .context()
            .fns()
            .ibv_query_srq
            .ok_or_else(|| Error::missing("ibv_query_srq"))?;
        let mut a = ibv_srq_attr::default();
        // SAFETY: live SRQ, writable attr.
        let ret = unsafe { f(self.inner.srq, &mut a) };
        if ret != 0 {
            return Err(Error::from_ret("ibv_query_srq", ret));
        }
        Ok(a)
    }

    /// `ibv_modify_srq(3)` with `IBV_SRQ_LIMIT`: arm the limit event
    /// (`IBV_EVENT_SRQ_LIMIT_REACHED` when fewer than `limit` receives remain).
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        let f = self
            .inner
            .pd
            .context()
            .fns()
            .ibv_modify_srq
            .ok_or_else(|| Error::missing("ibv_modify_srq"))?;
        let mut a = ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: live SRQ, valid attr.
        let ret = unsafe { f(self.inner.srq, &mut a, hotverbs_ffi::IBV_SRQ_LIMIT as i32) };
        if ret != 0 {
            return Err(Error::from_ret("ibv_modify_srq", ret)
                .or_hint(|| Some("srq_limit must be below max_wr".into())));
        }
        Ok(())
    }

    /// `ibv_post_srq_recv(3)` of one receive.
    ///
    /// # Safety
    /// As [`Qp::post_recv`](crate::Qp::post_recv): the memory stays registered, valid and
    /// untouched by Rust code until the receive's completion is polled.
    pub unsafe fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        // SAFETY: live SRQ; the WR and its SGE list are valid for the call (post_one_recv);
        // the memory's validity is the caller's contract.
        let ret = unsafe {
            crate::qp::post_one_recv(wr_id, sges, |wr, bad| {
                hotverbs_ffi::inline::ibv_post_srq_recv(self.inner.srq, wr, bad)
            })
        };
        if ret != 0 {
            return Err(Error::from_ret("ibv_post_srq_recv", ret)
                .or_hint(|| Some("SRQ full (max_wr) or too many SGEs".into())));
        }
        Ok(())
    }

    /// `ibv_destroy_srq(3)` now, returning its error (`EBUSY` while QPs or clones use it).
    pub fn destroy(self) -> Result<()> {
        let mut inner = Arc::try_unwrap(self.inner).map_err(|_| {
            Error::new("ibv_destroy_srq", libc::EBUSY)
                .with_hint("QPs attached to this SRQ (or clones of it) are still alive")
        })?;
        inner.destroy()
    }
}
