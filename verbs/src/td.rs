//! Thread domains and parent domains (`ibv_alloc_td`, `ibv_dealloc_td`,
//! `ibv_alloc_parent_domain`).
//!
//! A thread domain tells the provider that every object made with it is used by one thread
//! at a time, so it may skip its locks (mlx5 drops the QP and CQ spinlocks, and gives the QP
//! a doorbell of its own). It reaches objects through a parent domain: a PD that wraps a
//! protection domain and, optionally, a thread domain, and stands in for the PD wherever a
//! PD is taken (`ibv_reg_mr`, `ibv_create_qp_ex`, `ibv_create_cq_ex` with
//! `IBV_CQ_INIT_ATTR_MASK_PD`).
//!
//! # Invariants
//! A [`ThreadDomain`] is an `Arc<TdInner>`; every parent domain made with it holds a clone,
//! so `ibv_dealloc_td` runs after the last of them (the verb answers EBUSY otherwise). A
//! [`ParentDomain`] *is* a [`Pd`] (its `ibv_pd` comes from `ibv_alloc_parent_domain` and is
//! freed by `ibv_dealloc_pd`), whose inner value also holds the protection domain and the
//! thread domain it was made from: MRs, QPs and CQs made with it hold that `Pd`, so the
//! order of destruction is objects, then parent domain, then the protection domain and the
//! thread domain.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use hotverbs_ffi::{ibv_pd, ibv_td};

use crate::device::Context;
use crate::error::{record_drop_error, Error, Result};
use crate::pd::{Pd, PdInner};

pub(crate) struct TdInner {
    ctx: Context,
    td: *mut ibv_td,
    /// A send ring (any kind) lives on a QP of this thread domain. The QPs of one thread
    /// domain share its doorbell / BlueFlame register without a lock (that is the
    /// promise), and rings are `Send`: two rings on two of its QPs could ring it from two
    /// threads at once. So a thread domain has one send ring at a time.
    send_ring: std::sync::atomic::AtomicBool,
    /// The BlueFlame alternation of the thread domain's register (see [`Register`]).
    reg: std::sync::Mutex<Register>,
    /// `MLX5_SHUT_UP_BF` was set when the thread domain was allocated.
    shut_up_bf: bool,
}

/// What hotverbs knows of a thread domain's doorbell register (libmlx5 gives every thread
/// domain a register of its own, `mlx5_alloc_td` -> `mlx5_attach_dedicated_uar`, shared by
/// the thread domain's QPs without a lock).
///
/// libmlx5 keeps one `bf->offset` per register and toggles it (`offset ^= buf_size`) at
/// every `post_send_db` that announces at least one WR (`mlx5_post_send`, and
/// `mlx5_send_wr_complete` for `ibv_wr_*`), BlueFlame copy or plain doorbell alike
/// (`providers/mlx5/qp.c`). mlx5dv does not expose it and nothing can set it, so:
/// - `lib` mirrors it: 0 for a fresh register, toggled by each post hotverbs makes through
///   libmlx5 on a QP of the thread domain ([`ThreadDomain::libmlx5_posted`]); unknown once
///   a verbs ring (whose posts the datapath makes, uncounted) took a QP of it, or when the
///   register may have been another thread domain's (libmlx5 recycles a freed thread
///   domain's register, offset and all: `mlx5_detach_dedicated_uar`).
/// - `next` is the buffer the register's next write must use to alternate with its last
///   one: `lib` after a libmlx5 post, where a direct ring stopped after a direct ring.
///
/// A direct ring BlueFlames only when `next` is known, starting there; libmlx5 may post
/// again only while `next == lib` (in step): a direct ring that rang an odd number of
/// times leaves libmlx5 one buffer behind, which nothing can correct, so the register
/// stays the direct path's until another direct ring evens it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Register {
    /// libmlx5's `bf->offset` is its second buffer (`Some(true)`), its first, or unknown.
    pub(crate) lib: Option<bool>,
    /// The buffer the next write must use: the second, the first, or unknown.
    pub(crate) next: Option<bool>,
    /// A direct ring rings the register now.
    pub(crate) direct: bool,
}

impl Register {
    /// A register libmlx5 has not rung since it mapped it (`known`), or one of unknown
    /// alternation.
    fn new(known: bool) -> Register {
        let p = known.then_some(false);
        Register {
            lib: p,
            next: p,
            direct: false,
        }
    }

    /// Known and out of step: libmlx5's next write would land on the buffer written last.
    pub(crate) fn out_of_step(&self) -> bool {
        matches!((self.lib, self.next), (Some(l), Some(n)) if l != n)
    }
}

/// Contexts on which a thread domain was deallocated: a later thread domain there may get
/// that register back from libmlx5 (`mlx5_detach_dedicated_uar` puts it back on the list
/// `mlx5_alloc_td` takes from) with its `bf->offset` odd. Weak references: each keeps its
/// context's allocation, so its address names no later context; dead ones are pruned.
type Recycled = Vec<std::sync::Weak<crate::device::CtxInner>>;
static RECYCLED: std::sync::Mutex<Recycled> = std::sync::Mutex::new(Vec::new());

fn recycled_list() -> std::sync::MutexGuard<'static, Recycled> {
    RECYCLED.lock().unwrap_or_else(|e| e.into_inner())
}

fn recycled(ctx: &Context) -> bool {
    let me = Arc::as_ptr(&ctx.inner);
    recycled_list().iter().any(|w| std::ptr::eq(w.as_ptr(), me))
}

/// libmlx5's `get_shut_up_bf()`: `MLX5_SHUT_UP_BF` set to anything but `"0"`.
pub(crate) fn shut_up_bf_env() -> bool {
    std::env::var_os("MLX5_SHUT_UP_BF").is_some_and(|v| v != "0")
}

// SAFETY: a TD is an identifier handed to verbs, all of which are thread-safe to call; the
// single-thread promise it carries is about the objects made with it, not about the handle.
unsafe impl Send for TdInner {}
// SAFETY: see Send.
unsafe impl Sync for TdInner {}

impl TdInner {
    fn dealloc(&mut self) -> Result<()> {
        let td = std::mem::replace(&mut self.td, std::ptr::null_mut());
        if td.is_null() {
            return Ok(());
        }
        // SAFETY: td was allocated on this live context (we hold it) and no parent domain
        // made with it remains (each holds an Arc of us).
        let ret = unsafe { hotverbs_ffi::inline::ibv_dealloc_td(td) };
        if ret != 0 {
            return Err(Error::from_ret("ibv_dealloc_td", ret));
        }
        let me = Arc::as_ptr(&self.ctx.inner);
        let mut r = recycled_list();
        r.retain(|w| w.strong_count() > 0);
        if !r.iter().any(|w| std::ptr::eq(w.as_ptr(), me)) {
            r.push(Arc::downgrade(&self.ctx.inner));
        }
        Ok(())
    }
}

impl Drop for TdInner {
    fn drop(&mut self) {
        if let Err(e) = self.dealloc() {
            record_drop_error(e);
        }
    }
}

/// A thread domain (`struct ibv_td`): a promise to the provider that the objects made with
/// it (through a [`ParentDomain`]) are used by a single thread at a time, so it may leave out
/// its locks.
///
/// Cheap to clone. Parent domains made with it keep it alive; [`ThreadDomain::destroy`]
/// deallocates now and returns the verb's error.
///
/// Keeping the promise: the safe calls that reach the provider's hot locks serialise
/// themselves on such objects ([`Cq::poll`](crate::Cq::poll) and
/// [`Cq::req_notify`](crate::Cq::req_notify) of a CQ in the domain); posting
/// ([`Qp::post_send`](crate::Qp::post_send), [`Qp::post_recv`](crate::Qp::post_recv), the
/// datapath rings, `ibv_wr_*`) is already `unsafe` or single-owner, and their contracts
/// say that posts to one such QP must not overlap.
///
/// # Example
/// ```
/// // softnic's Spec profile (in its Rxe profile, as on rxe, alloc_td is EOPNOTSUPP).
/// let ctx = hotverbs::Context::open_softnic_with(hotverbs::SoftnicConfig {
///     profile: hotverbs_softnic::Profile::Spec,
///     ..Default::default()
/// })?;
/// let td = ctx.alloc_td()?;
/// let pd = ctx.alloc_pd()?;
/// let pdom = pd.alloc_parent_domain(Some(&td))?;
/// assert!(td.clone().destroy().is_err()); // EBUSY: `pdom` (and the clone) use it
/// drop(pdom);
/// td.destroy()?;
/// # Ok::<(), hotverbs::Error>(())
/// ```
///
/// # References
/// `ibv_alloc_td(3)`, `ibv_alloc_parent_domain(3)`
#[derive(Clone)]
pub struct ThreadDomain {
    inner: Arc<TdInner>,
}

impl fmt::Debug for ThreadDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadDomain")
            .field("handle", &self.inner.td)
            .finish()
    }
}

impl ThreadDomain {
    /// Takes the thread domain's one send-ring slot; false if a send ring already has it.
    fn claim_send_ring(&self) -> bool {
        !self
            .inner
            .send_ring
            .swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// Frees the slot (the ring was dropped, or not built).
    pub(crate) fn release_send_ring(&self) {
        self.inner
            .send_ring
            .store(false, std::sync::atomic::Ordering::Release);
    }

    /// Takes the send-ring slot for a ring (`direct`: a `DirectRing`) on a QP of this
    /// thread domain. A verbs ring posts through libmlx5 uncounted: refused while the
    /// register is out of step (see [`Register`]), and the alternation is unknown after.
    pub(crate) fn claim_ring_slot(&self, verb: &'static str, direct: bool) -> Result<()> {
        if !self.claim_send_ring() {
            return Err(Error::new(verb, libc::EBUSY).with_hint(
                "another QP of this thread domain has a send ring: the QPs of a thread \
                 domain share its doorbell register without a lock, and two rings could \
                 ring it from two threads; give each QP with a ring its own thread domain \
                 (ctx.alloc_td(), pd.alloc_parent_domain(Some(&td)))",
            ));
        }
        if !direct {
            let mut r = self.register();
            if r.out_of_step() {
                drop(r);
                self.release_send_ring();
                return Err(out_of_step(verb));
            }
            // Its posts go through libmlx5 uncounted: the alternation is unknown from here
            // on (a later direct ring on this thread domain rings the doorbell alone).
            *r = Register::new(false);
        }
        Ok(())
    }

    pub(crate) fn register(&self) -> std::sync::MutexGuard<'_, Register> {
        self.inner.reg.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `MLX5_SHUT_UP_BF` was set when the thread domain was allocated.
    pub(crate) fn shut_up_bf(&self) -> bool {
        self.inner.shut_up_bf
    }

    /// Before hotverbs posts through libmlx5 on a QP of this thread domain
    /// (`ibv_post_send`): refused while a direct ring rings the register (libmlx5 takes no
    /// lock on a thread domain's register) or while its alternation is out of step.
    pub(crate) fn before_libmlx5_post(&self, verb: &'static str) -> Result<()> {
        let r = self.register();
        if r.direct {
            return Err(Error::new(verb, libc::EBUSY).with_hint(
                "a DirectRing on a QP of this thread domain rings its doorbell register, \
                 which libmlx5 would write without a lock: post through that ring, drop it \
                 first, or give this QP a thread domain of its own",
            ));
        }
        if r.out_of_step() {
            return Err(out_of_step(verb));
        }
        Ok(())
    }

    /// After a post through libmlx5 on a QP of this thread domain announced its WR
    /// (`post_send_db` toggled the register's offset).
    pub(crate) fn libmlx5_posted(&self) {
        let mut r = self.register();
        r.lib = r.lib.map(|l| !l);
        r.next = r.lib;
    }
}

fn out_of_step(verb: &'static str) -> Error {
    Error::new(verb, libc::EBUSY).with_hint(
        "a DirectRing on this thread domain rang its register an odd number of times, so \
         libmlx5's BlueFlame alternation is one buffer behind and cannot be set: post on \
         this thread domain's QPs through a DirectRing, or use a QP of another thread \
         domain for libmlx5 posts",
    )
}

impl Context {
    /// `ibv_alloc_td(3)`: a thread domain of this device.
    ///
    /// # Errors
    /// `ibv_alloc_td: EOPNOTSUPP` when the device has no thread domains (rxe); the hint
    /// names the device and says to go on without one (objects then keep the provider's
    /// locks).
    ///
    /// # References
    /// `ibv_alloc_td(3)`
    pub fn alloc_td(&self) -> Result<ThreadDomain> {
        // SAFETY: plain C data; all-zero is a valid init attr (comp_mask 0).
        let mut attr: hotverbs_ffi::ibv_td_init_attr = unsafe { crate::zeroed() };
        // SAFETY: live context; attr valid.
        let td = unsafe { hotverbs_ffi::inline::ibv_alloc_td(self.as_raw(), &mut attr) };
        if td.is_null() {
            let e = hotverbs_ffi::errno();
            return Err(Error::new("ibv_alloc_td", e).or_hint(|| {
                unsupported(e).then(|| {
                    format!(
                        "thread domains are not supported by device {}: create objects \
                         without one (they keep the provider's locks)",
                        self.name()
                    )
                })
            }));
        }
        Ok(ThreadDomain {
            inner: Arc::new(TdInner {
                ctx: self.clone(),
                td,
                send_ring: std::sync::atomic::AtomicBool::new(false),
                reg: std::sync::Mutex::new(Register::new(!recycled(self))),
                shut_up_bf: shut_up_bf_env(),
            }),
        })
    }
}

impl ThreadDomain {
    /// The context it belongs to.
    ///
    /// # References
    /// `ibv_alloc_td(3)`
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The raw `ibv_td`, valid while this `ThreadDomain` (or a parent domain made with it)
    /// lives.
    ///
    /// # References
    /// `ibv_alloc_td(3)`
    pub fn as_raw(&self) -> *mut ibv_td {
        self.inner.td
    }

    /// `ibv_dealloc_td(3)` now, returning its error.
    ///
    /// # Errors
    /// `EBUSY` while clones or parent domains made with it are alive; the verb's error
    /// otherwise.
    ///
    /// # References
    /// `ibv_alloc_td(3)`
    pub fn destroy(self) -> Result<()> {
        let n = Arc::strong_count(&self.inner) - 1;
        let mut inner = Arc::try_unwrap(self.inner).map_err(|_| {
            Error::new("ibv_dealloc_td", libc::EBUSY).with_hint(format!(
                "{n} parent domains or ThreadDomain clones still use this thread domain: \
                 drop them first"
            ))
        })?;
        inner.dealloc()
    }
}

/// What a parent domain holds besides its own handle: the objects it was made from, kept
/// alive until it is deallocated.
pub(crate) struct ParentLinks {
    /// The protection domain it wraps (`ibv_parent_domain_init_attr.pd`).
    ///
    /// # References
    /// `ibv_alloc_parent_domain(3)`
    pub(crate) pd: Pd,
    /// The thread domain, if any.
    pub(crate) td: Option<ThreadDomain>,
}

/// A parent domain (`ibv_alloc_parent_domain`): a [`Pd`] that wraps a protection domain and
/// optionally a [`ThreadDomain`], usable wherever a PD is: it dereferences to its [`Pd`], so
/// `pdom.reg_mr(..)`, `QpBuilder::new(&pdom, ..)` and `CqBuilder::parent_domain(&pdom)` all
/// take it. Objects made with it use the thread domain's single-thread promise.
///
/// Cheap to clone (clones share the handle, like [`Pd`]'s). Objects made with it keep it
/// alive; it keeps its protection domain and thread domain alive.
///
/// # Example
/// ```
/// use hotverbs::{AccessFlags, Context, QpBuilder, QpType, SendOps};
/// let ctx = Context::open_softnic_with(hotverbs::SoftnicConfig {
///     profile: hotverbs_softnic::Profile::Spec, // rxe has no thread/parent domains
///     ..Default::default()
/// })?;
/// let td = ctx.alloc_td()?;
/// let pdom = ctx.alloc_pd()?.alloc_parent_domain(Some(&td))?;
/// let cq = ctx.create_cq(16, None)?;
/// let mr = pdom.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
/// let qp = QpBuilder::new(&pdom, &cq, &cq, QpType::Rc)
///     .send_ops(SendOps::SEND | SendOps::RDMA_WRITE)
///     .build()?;
/// assert!(qp.as_qp_ex().is_some());
/// # drop((mr, qp));
/// # Ok::<(), hotverbs::Error>(())
/// ```
///
/// # References
/// `ibv_alloc_parent_domain(3)`, `ibv_alloc_td(3)`
#[derive(Clone)]
pub struct ParentDomain {
    pd: Pd,
}

impl fmt::Debug for ParentDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParentDomain")
            .field("handle", &self.pd.as_raw())
            .field("protection_domain", &self.protection_domain().as_raw())
            .field("thread_domain", &self.thread_domain().map(|t| t.as_raw()))
            .finish()
    }
}

impl Deref for ParentDomain {
    type Target = Pd;
    fn deref(&self) -> &Pd {
        &self.pd
    }
}

impl AsRef<Pd> for ParentDomain {
    fn as_ref(&self) -> &Pd {
        &self.pd
    }
}

impl Pd {
    /// `ibv_alloc_parent_domain(3)`: a parent domain over this protection domain, with the
    /// thread domain `td` if given.
    ///
    /// # Errors
    /// `ibv_alloc_parent_domain: EINVAL` when this `Pd` is itself a parent domain or `td`
    /// belongs to another context (checked before the verb); `EOPNOTSUPP` when the device
    /// has no parent domains (the hint names the device).
    ///
    /// # References
    /// `ibv_alloc_parent_domain(3)`
    pub fn alloc_parent_domain(&self, td: Option<&ThreadDomain>) -> Result<ParentDomain> {
        const VERB: &str = "ibv_alloc_parent_domain";
        let ctx = self.context();
        if self.inner.parent.is_some() {
            return Err(Error::new(VERB, libc::EINVAL).with_hint(
                "this Pd is a parent domain: make parent domains from a protection domain \
                 (ParentDomain::protection_domain)",
            ));
        }
        if td.is_some_and(|t| t.context().as_raw() != ctx.as_raw()) {
            return Err(Error::new(VERB, libc::EINVAL)
                .with_hint("the thread domain belongs to another device context"));
        }
        // SAFETY: plain C data; all-zero is valid (no allocators, comp_mask 0).
        let mut attr: hotverbs_ffi::ibv_parent_domain_init_attr = unsafe { crate::zeroed() };
        attr.pd = self.as_raw();
        attr.td = td.map_or(std::ptr::null_mut(), ThreadDomain::as_raw);
        // SAFETY: live context; attr names a live PD and TD (or none) of this context.
        let raw: *mut ibv_pd =
            unsafe { hotverbs_ffi::inline::ibv_alloc_parent_domain(ctx.as_raw(), &mut attr) };
        if raw.is_null() {
            let e = hotverbs_ffi::errno();
            return Err(Error::new(VERB, e).or_hint(|| {
                unsupported(e).then(|| {
                    format!(
                        "parent domains are not supported by device {}: use the protection \
                         domain itself",
                        ctx.name()
                    )
                })
            }));
        }
        Ok(ParentDomain {
            pd: Pd {
                inner: Arc::new(PdInner {
                    ctx: ctx.clone(),
                    pd: raw,
                    parent: Some(ParentLinks {
                        pd: self.clone(),
                        td: td.cloned(),
                    }),
                }),
            },
        })
    }

    /// Is this a parent domain (made by [`Pd::alloc_parent_domain`])?
    ///
    /// # References
    /// `ibv_alloc_parent_domain(3)`
    pub fn is_parent_domain(&self) -> bool {
        self.inner.parent.is_some()
    }
}

impl ParentDomain {
    /// The parent domain as a [`Pd`] (what `Deref` gives).
    ///
    /// # References
    /// `ibv_alloc_parent_domain(3)`
    pub fn as_pd(&self) -> &Pd {
        &self.pd
    }

    /// The protection domain it wraps.
    pub fn protection_domain(&self) -> &Pd {
        match &self.pd.inner.parent {
            Some(p) => &p.pd,
            None => unreachable!("a ParentDomain's Pd always has parent links"),
        }
    }

    /// The thread domain it was made with (`ibv_parent_domain_init_attr.td`), if any.
    ///
    /// # References
    /// `ibv_alloc_parent_domain(3)`, `ibv_alloc_td(3)`
    pub fn thread_domain(&self) -> Option<&ThreadDomain> {
        self.pd.inner.parent.as_ref().and_then(|p| p.td.as_ref())
    }

    /// `ibv_dealloc_pd(3)` on the parent domain now, returning its error; the protection
    /// domain and thread domain are released (and deallocated if this held the last
    /// reference).
    ///
    /// # Errors
    /// `EBUSY` while clones or objects made with it (MRs, QPs, CQs) are alive; the verb's
    /// error otherwise.
    ///
    /// # References
    /// `ibv_alloc_parent_domain(3)`
    pub fn destroy(self) -> Result<()> {
        self.pd.destroy()
    }
}

/// Does `errno` mean "the device does not do this"?
pub(crate) fn unsupported(errno: i32) -> bool {
    errno == libc::EOPNOTSUPP || errno == libc::ENOSYS
}
