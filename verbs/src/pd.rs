//! Protection domains (`ibv_alloc_pd`, `ibv_dealloc_pd`); parent domains are `Pd`s too
//! (`crate::td`).
//!
//! Invariants: a [`Pd`] is an `Arc<PdInner>`; every MR, QP, SRQ and AH made from it holds a
//! clone, so `ibv_dealloc_pd` runs only after the last of them is destroyed (libibverbs
//! would answer EBUSY otherwise).

use std::fmt;
use std::sync::Arc;

use hotverbs_ffi::ibv_pd;

use crate::device::Context;
use crate::error::{record_drop_error, Error, Result};

pub(crate) struct PdInner {
    pub(crate) ctx: Context,
    pub(crate) pd: *mut ibv_pd,
    /// For a parent domain ([`crate::ParentDomain`]): the protection domain and thread
    /// domain it was made from, released after the parent domain is deallocated (`Drop`
    /// deallocates before the fields drop).
    pub(crate) parent: Option<crate::td::ParentLinks>,
}

// SAFETY: a PD is only an identifier for verbs, all of which are thread-safe.
unsafe impl Send for PdInner {}
// SAFETY: see Send.
unsafe impl Sync for PdInner {}

impl PdInner {
    fn dealloc(&mut self) -> Result<()> {
        let pd = std::mem::replace(&mut self.pd, std::ptr::null_mut());
        if pd.is_null() {
            return Ok(());
        }
        let f = self
            .ctx
            .fns()
            .ibv_dealloc_pd
            .ok_or_else(|| Error::missing("ibv_dealloc_pd"))?;
        // SAFETY: pd was allocated through this table and no child object remains (each
        // holds an Arc of us).
        let ret = unsafe { f(pd) };
        if ret != 0 {
            return Err(Error::from_ret("ibv_dealloc_pd", ret));
        }
        Ok(())
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        if let Err(e) = self.dealloc() {
            record_drop_error(e);
        }
    }
}

/// A protection domain (`struct ibv_pd`).
///
/// Cheap to clone. MRs, QPs, SRQs and AHs keep it alive: it is deallocated after the last
/// of them. [`Pd::destroy`] deallocates now and returns the verb's error.
///
/// A [`ParentDomain`](crate::ParentDomain) is a `Pd` too (it dereferences to one): MRs and
/// QPs made with it use its thread domain, and it keeps the protection domain it wraps
/// alive. It shares that domain's protection scope: an MR of either serves a QP of either.
///
/// # Example
/// ```
/// use hotverbs::{AccessFlags, Context};
/// let ctx = Context::open("softnic")?;
/// let pd = ctx.alloc_pd()?;
/// let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
/// assert!(pd.clone().destroy().is_err()); // still used by `mr` (and the clone)
/// drop(mr);
/// pd.destroy()?;
/// # Ok::<(), hotverbs::Error>(())
/// ```
///
/// # References
/// `ibv_alloc_pd(3)`
#[derive(Clone)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

impl fmt::Debug for Pd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pd")
            .field("handle", &self.inner.pd)
            .finish()
    }
}

impl Context {
    /// `ibv_alloc_pd(3)`.
    pub fn alloc_pd(&self) -> Result<Pd> {
        let f = self
            .fns()
            .ibv_alloc_pd
            .ok_or_else(|| Error::missing("ibv_alloc_pd"))?;
        // SAFETY: live context.
        let pd = unsafe { f(self.as_raw()) };
        if pd.is_null() {
            return Err(Error::from_errno("ibv_alloc_pd"));
        }
        Ok(Pd {
            inner: Arc::new(PdInner {
                ctx: self.clone(),
                pd,
                parent: None,
            }),
        })
    }
}

impl Pd {
    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The raw `ibv_pd`, valid while this `Pd` (or any object made from it) lives.
    pub fn as_raw(&self) -> *mut ibv_pd {
        self.inner.pd
    }

    /// The protection domain this PD stands for: itself, or for a parent domain the
    /// protection domain it wraps. Objects of a parent domain and of its protection domain
    /// share one protection scope (keys, address handles).
    pub(crate) fn protection_raw(&self) -> *mut ibv_pd {
        match &self.inner.parent {
            Some(p) => p.pd.as_raw(),
            None => self.inner.pd,
        }
    }

    /// `ibv_dealloc_pd(3)` now, returning its error.
    ///
    /// # Errors
    /// `EBUSY` while clones or child objects (MRs, QPs, SRQs, AHs) are alive; the verb's
    /// error otherwise.
    pub fn destroy(self) -> Result<()> {
        let n = Arc::strong_count(&self.inner) - 1;
        let mut inner = Arc::try_unwrap(self.inner).map_err(|_| {
            Error::new("ibv_dealloc_pd", libc::EBUSY).with_hint(format!(
                "{n} MRs, QPs, CQs, SRQs, AHs, parent domains or Pd clones still use this PD: \
                 drop them first"
            ))
        })?;
        inner.dealloc()
    }
}
