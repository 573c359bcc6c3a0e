//! Queue pairs: the builder (`ibv_create_qp`), the state machine (`ibv_modify_qp` with
//! the attributes the manual lists per transition), `ibv_query_qp`, multicast attach and
//! detach, and setup-side posting for tests and examples.
//!
//! Invariants: a [`Qp`] holds clones of its PD, both CQs and its SRQ, so none of them can
//! be destroyed while it lives; `qp` is non-null until destroy; the tracked state is only
//! a hint source (the device's answer to `ibv_query_qp` is authoritative).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::Mutex;

use hotverbs_datapath::{PostError, SendError};
use hotverbs_ffi::flags::{QpAttrMask, SendFlags};
use hotverbs_ffi::{
    ibv_qp, ibv_qp_attr, ibv_qp_ex, ibv_qp_init_attr, ibv_recv_wr, ibv_send_wr, ibv_sge,
};

use crate::ah::AhAttr;
use crate::cq::Cq;
use crate::device::{Gid, LinkLayer, Mtu, PortInfo};
use crate::error::{record_drop_error, ChainError, Error, RecvPostError, Result};
use crate::exchange::Endpoint;
use crate::mr::{AccessFlags, Lease, Mr, Sge};
use crate::pd::Pd;
pub(crate) use crate::post::post_hint;
use crate::post::{inline_too_long_hint, Payload, SendWr, WrKind, NOT_INLINE_HINT};
use crate::srq::Srq;
use crate::zeroed;

/// Transport type (`enum ibv_qp_type`).
///
/// # Example
/// ```
/// assert_eq!(hotverbs::QpType::Rc.raw(), hotverbs_ffi::IBV_QPT_RC);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QpType {
    /// Reliable connected: send/recv, RDMA write/read, atomics.
    Rc,
    /// Unreliable connected: send/recv, RDMA write.
    Uc,
    /// Unreliable datagram: send/recv with an address handle per message, multicast.
    Ud,
}

impl QpType {
    /// The raw `IBV_QPT_*`.
    pub fn raw(self) -> u32 {
        match self {
            QpType::Rc => hotverbs_ffi::IBV_QPT_RC,
            QpType::Uc => hotverbs_ffi::IBV_QPT_UC,
            QpType::Ud => hotverbs_ffi::IBV_QPT_UD,
        }
    }
    /// From a raw `IBV_QPT_*` (`None` for types hotverbs does not build).
    pub fn from_raw(v: u32) -> Option<QpType> {
        match v {
            hotverbs_ffi::IBV_QPT_RC => Some(QpType::Rc),
            hotverbs_ffi::IBV_QPT_UC => Some(QpType::Uc),
            hotverbs_ffi::IBV_QPT_UD => Some(QpType::Ud),
            _ => None,
        }
    }
}

/// QP state (`enum ibv_qp_state`).
///
/// # Example
/// ```
/// use hotverbs::QpState;
/// assert_eq!(QpState::from_raw(hotverbs_ffi::IBV_QPS_RTR), QpState::Rtr);
/// assert_eq!(QpState::Rts.name(), "RTS");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QpState {
    /// RESET: just created, or reset.
    Reset,
    /// INIT: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error (UC/UD).
    Sqe,
    /// Error: everything outstanding is flushed.
    Err,
}

impl QpState {
    /// From `IBV_QPS_*` (unknown values map to `Err`).
    pub fn from_raw(v: u32) -> QpState {
        match v {
            hotverbs_ffi::IBV_QPS_RESET => QpState::Reset,
            hotverbs_ffi::IBV_QPS_INIT => QpState::Init,
            hotverbs_ffi::IBV_QPS_RTR => QpState::Rtr,
            hotverbs_ffi::IBV_QPS_RTS => QpState::Rts,
            hotverbs_ffi::IBV_QPS_SQD => QpState::Sqd,
            hotverbs_ffi::IBV_QPS_SQE => QpState::Sqe,
            _ => QpState::Err,
        }
    }
    /// The raw `IBV_QPS_*`.
    pub fn raw(self) -> u32 {
        self as u32
    }
    /// `"RESET"`, `"INIT"`, ...
    pub fn name(self) -> &'static str {
        ["RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"][self as usize]
    }

    /// Why a post refused in this state was refused and what to do, or `None` when the
    /// state allows the post (the refusal has another cause). `send`: a send post (RTS,
    /// and SQD), else a receive post (INIT on). ERR accepts posts (they flush) but is
    /// named all the same: nothing posted there runs until the QP is reset and connected.
    #[cold]
    pub(crate) fn post_hint(self, send: bool) -> Option<&'static str> {
        Some(match (self, send) {
            (QpState::Reset, true) => {
                "QP is in RESET: connect it first (Qp::connect, or to_init, to_rtr and to_rts): \
                 sends need RTS"
            }
            (QpState::Reset, false) => {
                "QP is in RESET: receives can be posted from INIT on — call Qp::init() (or \
                 connect) first"
            }
            (QpState::Init, true) => {
                "QP is in INIT: sends need RTS: finish connecting it (Qp::connect keeps the \
                 INIT attributes and receives posted; or to_rtr then to_rts)"
            }
            (QpState::Rtr, true) => {
                "QP is in RTR: sends need RTS: move it on with Qp::to_rts (or Qp::connect)"
            }
            (QpState::Sqe, true) => {
                "QP is in SQE (a send failed on a UC/UD QP): reset_qp() on its ring (Qp::reset \
                 without one), then connect again"
            }
            (QpState::Err, _) => {
                "QP is in ERR: reset_qp() on its ring (Qp::reset without one), or reconnect \
                 (Qp::connect resets it first)"
            }
            _ => return None,
        })
    }
}

static TRANSITIONS: [[&str; 7]; 7] = [
    [
        "ibv_modify_qp(RESET->RESET)",
        "ibv_modify_qp(RESET->INIT)",
        "ibv_modify_qp(RESET->RTR)",
        "ibv_modify_qp(RESET->RTS)",
        "ibv_modify_qp(RESET->SQD)",
        "ibv_modify_qp(RESET->SQE)",
        "ibv_modify_qp(RESET->ERR)",
    ],
    [
        "ibv_modify_qp(INIT->RESET)",
        "ibv_modify_qp(INIT->INIT)",
        "ibv_modify_qp(INIT->RTR)",
        "ibv_modify_qp(INIT->RTS)",
        "ibv_modify_qp(INIT->SQD)",
        "ibv_modify_qp(INIT->SQE)",
        "ibv_modify_qp(INIT->ERR)",
    ],
    [
        "ibv_modify_qp(RTR->RESET)",
        "ibv_modify_qp(RTR->INIT)",
        "ibv_modify_qp(RTR->RTR)",
        "ibv_modify_qp(RTR->RTS)",
        "ibv_modify_qp(RTR->SQD)",
        "ibv_modify_qp(RTR->SQE)",
        "ibv_modify_qp(RTR->ERR)",
    ],
    [
        "ibv_modify_qp(RTS->RESET)",
        "ibv_modify_qp(RTS->INIT)",
        "ibv_modify_qp(RTS->RTR)",
        "ibv_modify_qp(RTS->RTS)",
        "ibv_modify_qp(RTS->SQD)",
        "ibv_modify_qp(RTS->SQE)",
        "ibv_modify_qp(RTS->ERR)",
    ],
    [
        "ibv_modify_qp(SQD->RESET)",
        "ibv_modify_qp(SQD->INIT)",
        "ibv_modify_qp(SQD->RTR)",
        "ibv_modify_qp(SQD->RTS)",
        "ibv_modify_qp(SQD->SQD)",
        "ibv_modify_qp(SQD->SQE)",
        "ibv_modify_qp(SQD->ERR)",
    ],
    [
        "ibv_modify_qp(SQE->RESET)",
        "ibv_modify_qp(SQE->INIT)",
        "ibv_modify_qp(SQE->RTR)",
        "ibv_modify_qp(SQE->RTS)",
        "ibv_modify_qp(SQE->SQD)",
        "ibv_modify_qp(SQE->SQE)",
        "ibv_modify_qp(SQE->ERR)",
    ],
    [
        "ibv_modify_qp(ERR->RESET)",
        "ibv_modify_qp(ERR->INIT)",
        "ibv_modify_qp(ERR->RTR)",
        "ibv_modify_qp(ERR->RTS)",
        "ibv_modify_qp(ERR->SQD)",
        "ibv_modify_qp(ERR->SQE)",
        "ibv_modify_qp(ERR->ERR)",
    ],
];

/// Builds one `ibv_recv_wr` over `sges` (an SGE list that lives for the call) and hands it to
/// `post` (`ibv_post_recv` or `ibv_post_srq_recv`); returns the verb's return value.
///
/// # Safety
/// `post` must be a receive-posting verb on a live queue; the memory the SGEs describe is
/// the caller's contract as for [`Qp::post_recv`].
pub(crate) unsafe fn post_one_recv(
    wr_id: u64,
    sges: &[Sge],
    post: impl FnOnce(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32,
) -> i32 {
    let mut s: Vec<ibv_sge> = sges.iter().map(|&x| x.into()).collect();
    let mut raw = ibv_recv_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: s.as_mut_ptr(),
        num_sge: s.len() as i32,
    };
    let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
    post(&mut raw, &mut bad)
}

fn transition_verb(from: QpState, to: QpState) -> &'static str {
    TRANSITIONS[from as usize][to as usize]
}

bitflags::bitflags! {
    /// The operations an extended QP may post (`send_ops_flags` of `ibv_create_qp_ex`,
    /// `IBV_QP_EX_WITH_*`): only these `ibv_wr_*` builders may be called on its
    /// [`Qp::as_qp_ex`] (providers fill only the requested ones).
    ///
    /// # Example
    /// ```
    /// use hotverbs::SendOps;
    /// let ops = SendOps::SEND | SendOps::RDMA_WRITE;
    /// assert_eq!(ops.bits(), (hotverbs_ffi::IBV_QP_EX_WITH_SEND
    ///     | hotverbs_ffi::IBV_QP_EX_WITH_RDMA_WRITE) as u64);
    /// ```
    ///
    /// # References
    /// `ibv_create_qp_ex(3)`, `ibv_wr_post(3)`
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub struct SendOps: u64 {
        /// `ibv_wr_rdma_write` (`IBV_QP_EX_WITH_RDMA_WRITE`).
        const RDMA_WRITE = hotverbs_ffi::IBV_QP_EX_WITH_RDMA_WRITE as u64;
        /// `ibv_wr_rdma_write_imm` (`IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM`).
        const RDMA_WRITE_WITH_IMM = hotverbs_ffi::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM as u64;
        /// `ibv_wr_send` (`IBV_QP_EX_WITH_SEND`).
        const SEND = hotverbs_ffi::IBV_QP_EX_WITH_SEND as u64;
        /// `ibv_wr_send_imm` (`IBV_QP_EX_WITH_SEND_WITH_IMM`).
        const SEND_WITH_IMM = hotverbs_ffi::IBV_QP_EX_WITH_SEND_WITH_IMM as u64;
        /// `ibv_wr_rdma_read` (`IBV_QP_EX_WITH_RDMA_READ`).
        const RDMA_READ = hotverbs_ffi::IBV_QP_EX_WITH_RDMA_READ as u64;
        /// `ibv_wr_atomic_cmp_swp` (`IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP`).
        const ATOMIC_CMP_AND_SWP = hotverbs_ffi::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP as u64;
        /// `ibv_wr_atomic_fetch_add` (`IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD`).
        const ATOMIC_FETCH_AND_ADD = hotverbs_ffi::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD as u64;
        /// `ibv_wr_local_inv` (`IBV_QP_EX_WITH_LOCAL_INV`).
        const LOCAL_INV = hotverbs_ffi::IBV_QP_EX_WITH_LOCAL_INV as u64;
        /// `ibv_wr_bind_mw` (`IBV_QP_EX_WITH_BIND_MW`).
        const BIND_MW = hotverbs_ffi::IBV_QP_EX_WITH_BIND_MW as u64;
        /// `ibv_wr_send_inv` (`IBV_QP_EX_WITH_SEND_WITH_INV`).
        const SEND_WITH_INV = hotverbs_ffi::IBV_QP_EX_WITH_SEND_WITH_INV as u64;
        /// `ibv_wr_send_tso` (`IBV_QP_EX_WITH_TSO`).
        const TSO = hotverbs_ffi::IBV_QP_EX_WITH_TSO as u64;
        /// `ibv_wr_atomic_write` (`IBV_QP_EX_WITH_ATOMIC_WRITE`).
        const ATOMIC_WRITE = hotverbs_ffi::IBV_QP_EX_WITH_ATOMIC_WRITE as u64;
    }
}

/// Builds a QP: `QpBuilder::new(&pd, &send_cq, &recv_cq, QpType::Rc)` then setters, then
/// [`build`](Self::build). Defaults: 16 send and 16 receive WRs, 1 SGE each, no inline
/// data, `sq_sig_all = false` (selective signaling), no SRQ.
///
/// # Example
/// ```
/// use hotverbs::{Context, QpBuilder, QpType, QpState};
/// let ctx = Context::open("softnic")?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(256, None)?;
/// let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
///     .max_send_wr(128)
///     .max_recv_wr(128)
///     .max_inline_data(64)
///     .build()?;
/// assert_eq!(qp.query()?.state(), QpState::Reset);
/// assert!(qp.cap().max_inline_data >= 64);
/// # Ok::<(), hotverbs::Error>(())
/// ```
///
/// # References
/// `ibv_create_qp(3)`, `ibv_create_qp_ex(3)` (extended mode: [`QpBuilder::send_ops`])
#[derive(Clone)]
pub struct QpBuilder<'a> {
    pd: &'a Pd,
    send_cq: &'a Cq,
    recv_cq: &'a Cq,
    qp_type: QpType,
    cap: hotverbs_ffi::ibv_qp_cap,
    sq_sig_all: bool,
    srq: Option<&'a Srq>,
    /// Extended mode: the ops of `ibv_create_qp_ex`.
    send_ops: Option<SendOps>,
}

impl fmt::Debug for QpBuilder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QpBuilder")
            .field("qp_type", &self.qp_type)
            .field("max_send_wr", &self.cap.max_send_wr)
            .field("max_recv_wr", &self.cap.max_recv_wr)
            .field("max_send_sge", &self.cap.max_send_sge)
            .field("max_recv_sge", &self.cap.max_recv_sge)
            .field("max_inline_data", &self.cap.max_inline_data)
            .field("sq_sig_all", &self.sq_sig_all)
            .field("srq", &self.srq.is_some())
            .field("send_ops", &self.send_ops)
            .finish()
    }
}

impl<'a> QpBuilder<'a> {
    /// A builder for a QP of `qp_type` in `pd`, completing sends on `send_cq` and receives
    /// on `recv_cq` (which may be the same CQ).
    pub fn new(pd: &'a Pd, send_cq: &'a Cq, recv_cq: &'a Cq, qp_type: QpType) -> Self {
        QpBuilder {
            pd,
            send_cq,
            recv_cq,
            qp_type,
            cap: hotverbs_ffi::ibv_qp_cap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
            srq: None,
            send_ops: None,
        }
    }
    /// Send queue depth.
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.cap.max_send_wr = n;
        self
    }
    /// Receive queue depth (ignored with an SRQ).
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.cap.max_recv_wr = n;
        self
    }
    /// SGEs per send WR.
    pub fn max_send_sge(mut self, n: u32) -> Self {
        self.cap.max_send_sge = n;
        self
    }
    /// SGEs per receive WR.
    pub fn max_recv_sge(mut self, n: u32) -> Self {
        self.cap.max_recv_sge = n;
        self
    }
    /// Bytes that may be sent inline (`IBV_SEND_INLINE`).
    pub fn max_inline_data(mut self, n: u32) -> Self {
        self.cap.max_inline_data = n;
        self
    }
    /// Signal every send WR (`sq_sig_all = 1`). Default false: only WRs posted with
    /// `IBV_SEND_SIGNALED` complete visibly.
    pub fn sq_sig_all(mut self, yes: bool) -> Self {
        self.sq_sig_all = yes;
        self
    }
    /// Take receives from `srq` instead of a receive queue of its own.
    pub fn srq(mut self, srq: &'a Srq) -> Self {
        self.srq = Some(srq);
        self
    }

    /// Extended mode: create the QP with `ibv_create_qp_ex(3)` (`comp_mask` PD |
    /// SEND_OPS_FLAGS) so it can post through `ibv_wr_start` / `ibv_wr_*` /
    /// `ibv_wr_complete` on [`Qp::as_qp_ex`], with exactly the operations in `ops`. The
    /// `ibv_post_send` path ([`Qp::post_send`], the legacy rings) keeps working. With a
    /// [`ParentDomain`](crate::ParentDomain) as the PD, the QP uses its thread domain.
    ///
    /// # Example
    /// ```
    /// use hotverbs::{Context, QpBuilder, QpType, SendOps};
    /// let ctx = Context::open("softnic")?;
    /// let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(16, None)?);
    /// let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
    ///     .send_ops(SendOps::SEND | SendOps::SEND_WITH_IMM | SendOps::RDMA_WRITE)
    ///     .build()?;
    /// assert!(qp.as_qp_ex().is_some());
    /// assert_eq!(qp.send_ops(), SendOps::SEND | SendOps::SEND_WITH_IMM | SendOps::RDMA_WRITE);
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    ///
    /// # References
    /// `ibv_create_qp_ex(3)`, `ibv_wr_post(3)`
    pub fn send_ops(mut self, ops: SendOps) -> Self {
        self.send_ops = Some(ops);
        self
    }

    /// `ibv_create_qp(3)`, or `ibv_create_qp_ex(3)` in extended mode
    /// ([`send_ops`](Self::send_ops)). The QP starts in RESET.
    ///
    /// # Errors
    /// The verb's error with a hint naming the device limit a cap exceeds. In extended
    /// mode, a device that refuses an operation gives `ibv_create_qp_ex: EOPNOTSUPP` (or
    /// its errno) naming the operations and the device (`send op RDMA_WRITE_WITH_IMM is not
    /// supported by device rxe0 for UD QPs`), or saying that it has no extended QPs.
    ///
    /// # References
    /// `ibv_create_qp(3)`, `ibv_create_qp_ex(3)`
    pub fn build(self) -> Result<Qp> {
        if let Some(ops) = self.send_ops {
            return self.build_ex(ops);
        }
        let f = self
            .pd
            .context()
            .fns()
            .ibv_create_qp
            .ok_or_else(|| Error::missing("ibv_create_qp"))?;
        self.build_with("ibv_create_qp", QpDestroy::Verbs, |pd, init| {
            // SAFETY: live PD and CQs/SRQ of the same context (checked by build_with); init
            // is valid and writable (the provider writes the actual caps back).
            let qp = unsafe { f(pd, init) };
            if qp.is_null() {
                Err(hotverbs_ffi::errno())
            } else {
                Ok(qp)
            }
        })
    }

    /// The QP of this builder, created by `create` (`ibv_create_qp`, or rdma_cm's
    /// `rdma_create_qp`, which makes it on an ID) and destroyed by `destroy`. `create` gets
    /// the PD and the init attributes and returns the QP or the errno.
    pub(crate) fn build_with(
        self,
        verb: &'static str,
        destroy: QpDestroy,
        create: impl FnOnce(
            *mut hotverbs_ffi::ibv_pd,
            &mut ibv_qp_init_attr,
        ) -> std::result::Result<*mut ibv_qp, i32>,
    ) -> Result<Qp> {
        let ctx = self.pd.context();
        // A provider casts every object it is handed to its own type: objects of another
        // context (softnic's next to a NIC's, two NICs) would be misread.
        let foreign = self.send_cq.context().as_raw() != ctx.as_raw()
            || self.recv_cq.context().as_raw() != ctx.as_raw()
            || self
                .srq
                .is_some_and(|s| s.pd().context().as_raw() != ctx.as_raw());
        if foreign {
            return Err(Error::new(verb, libc::EINVAL)
                .with_hint("the PD, CQs and SRQ must all belong to one device context (Context)"));
        }
        if self.send_ops.is_some() && matches!(destroy, QpDestroy::RdmaCm { .. }) {
            return Err(Error::new(verb, libc::EINVAL).with_hint(
                "rdma_create_qp makes plain QPs: extended mode (QpBuilder::send_ops) is only \
                 available through QpBuilder::build",
            ));
        }
        let mut cap = self.cap;
        if self.srq.is_some() {
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
        }
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: self.send_cq.as_raw(),
            recv_cq: self.recv_cq.as_raw(),
            srq: self.srq.map_or(std::ptr::null_mut(), Srq::as_raw),
            cap,
            qp_type: self.qp_type.raw(),
            sq_sig_all: self.sq_sig_all as i32,
        };
        if let Some(srq) = self.srq {
            srq.attach(verb, self.recv_cq.as_raw())?;
        }
        let qp = match create(self.pd.as_raw(), &mut init) {
            Ok(qp) => qp,
            Err(errno) => {
                if let Some(srq) = self.srq {
                    srq.detach(self.recv_cq.as_raw());
                }
                return Err(Error::new(verb, errno).or_hint(|| self.cap_hint()));
            }
        };
        Ok(Qp {
            qp,
            qp_ex: std::ptr::null_mut(),
            send_ops: SendOps::empty(),
            destroy,
            sq_sig_all: self.sq_sig_all,
            sq_taken: AtomicBool::new(false),
            rq_taken: AtomicBool::new(false),
            sq_owner: AtomicU8::new(0),
            rq_owner: AtomicBool::new(false),
            rq_direct: AtomicBool::new(false),
            sq_unnamed: AtomicBool::new(false),
            post_lock: Mutex::new(()),
            qp_type: self.qp_type,
            cap: init.cap,
            pd: self.pd.clone(),
            send_cq: self.send_cq.clone(),
            recv_cq: self.recv_cq.clone(),
            srq: self.srq.cloned(),
            state: AtomicU32::new(hotverbs_ffi::IBV_QPS_RESET),
            port: AtomicU8::new(0),
            local_psn: random_psn(),
            leases: Mutex::new(Vec::new()),
            reservations: Mutex::new(Vec::new()),
        })
    }

    /// `ibv_create_qp_ex` with `ops` as `send_ops_flags`, returning the QP or the errno.
    fn create_ex(
        ctx: &crate::Context,
        pd: *mut hotverbs_ffi::ibv_pd,
        init: &mut ibv_qp_init_attr,
        ops: SendOps,
    ) -> std::result::Result<*mut ibv_qp, i32> {
        // SAFETY: plain C data; all-zero is valid.
        let mut attr: hotverbs_ffi::ibv_qp_init_attr_ex = unsafe { zeroed() };
        attr.qp_context = init.qp_context;
        attr.send_cq = init.send_cq;
        attr.recv_cq = init.recv_cq;
        attr.srq = init.srq;
        attr.cap = init.cap;
        attr.qp_type = init.qp_type;
        attr.sq_sig_all = init.sq_sig_all;
        attr.comp_mask =
            hotverbs_ffi::IBV_QP_INIT_ATTR_PD | hotverbs_ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        attr.pd = pd;
        attr.send_ops_flags = ops.bits();
        // SAFETY: live context; attr names a live PD and CQs/SRQ of this context (checked
        // by build_with / the probe's caller) and is writable (the provider writes caps).
        let qp =
            unsafe { hotverbs_ffi::inline::ibv_create_qp_ex(ctx.fns(), ctx.as_raw(), &mut attr) };
        if qp.is_null() {
            return Err(hotverbs_ffi::errno());
        }
        init.cap = attr.cap;
        Ok(qp)
    }

    fn build_ex(self, ops: SendOps) -> Result<Qp> {
        const VERB: &str = "ibv_create_qp_ex";
        let ctx = self.pd.context().clone();
        let to_qp_ex = ctx
            .fns()
            .ibv_qp_to_qp_ex
            .ok_or_else(|| Error::missing("ibv_qp_to_qp_ex"))?;
        let probe = self.clone();
        // Set when the verb itself refused (not one of the checks before it).
        let refused = std::cell::Cell::new(false);
        let made = self.build_with(VERB, QpDestroy::Verbs, |pd, init| {
            let r = QpBuilder::create_ex(&ctx, pd, init, ops);
            refused.set(r.is_err());
            r
        });
        let mut qp = match made {
            Ok(qp) => qp,
            Err(e)
                if refused.get()
                    && (crate::td::unsupported(e.errno()) || e.errno() == libc::EINVAL) =>
            {
                return Err(match probe.refused_ops(ops, e.errno()) {
                    Some(hint) => Error::new(VERB, e.errno()).with_hint(hint),
                    None => e,
                })
            }
            Err(e) => return Err(e),
        };
        // SAFETY: qp is a live QP made by ibv_create_qp_ex of this context's table.
        let qp_ex = unsafe { to_qp_ex(qp.qp) };
        if qp_ex.is_null() {
            // `qp` is dropped (destroyed) on return.
            return Err(
                Error::new("ibv_qp_to_qp_ex", libc::EOPNOTSUPP).with_hint(format!(
                    "device {} made the QP but gives no ibv_qp_ex for it",
                    ctx.name()
                )),
            );
        }
        qp.qp_ex = qp_ex;
        qp.send_ops = ops;
        Ok(qp)
    }

    /// After `ibv_create_qp_ex` refused `ops` with `errno`: which operations does the
    /// device refuse on their own for this QP type? Creates a QP per operation (destroyed
    /// at once) and names the refused ones and the device; `None` when each works alone
    /// (the combination or a cap was refused: the verb's own error stands).
    fn refused_ops(&self, ops: SendOps, errno: i32) -> Option<String> {
        let ctx = self.pd.context();
        let destroy = ctx.fns().ibv_destroy_qp?;
        let try_ops = |ops: SendOps| -> bool {
            let mut init = ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: self.send_cq.as_raw(),
                recv_cq: self.recv_cq.as_raw(),
                srq: self.srq.map_or(std::ptr::null_mut(), Srq::as_raw),
                cap: hotverbs_ffi::ibv_qp_cap {
                    max_send_wr: 1,
                    max_recv_wr: if self.srq.is_some() { 0 } else { 1 },
                    max_send_sge: 1,
                    max_recv_sge: if self.srq.is_some() { 0 } else { 1 },
                    max_inline_data: 0,
                },
                qp_type: self.qp_type.raw(),
                sq_sig_all: 0,
            };
            match QpBuilder::create_ex(ctx, self.pd.as_raw(), &mut init, ops) {
                Ok(qp) => {
                    // SAFETY: the probe QP was just made and nothing else uses it.
                    unsafe { destroy(qp) };
                    true
                }
                Err(_) => false,
            }
        };
        let refused = ops
            .iter()
            .filter(|&op| !try_ops(op))
            .fold(SendOps::empty(), |a, op| a | op);
        let qp_type = format!("{:?}", self.qp_type).to_uppercase();
        if refused == ops && !ops.is_empty() && errno != libc::EINVAL && !try_ops(SendOps::SEND) {
            return Some(format!(
                "extended QPs (ibv_create_qp_ex with send_ops_flags) are not supported by \
                 device {} for {qp_type} QPs: build without QpBuilder::send_ops",
                ctx.name()
            ));
        }
        if refused.is_empty() || (refused == ops && errno == libc::EINVAL) {
            return None;
        }
        Some(refused_ops_hint(refused, ctx.name(), &qp_type))
    }

    fn cap_hint(&self) -> Option<String> {
        let dev = self.pd.context().query_device().ok()?;
        let c = &self.cap;
        let max_wr = dev.max_qp_wr().max(0) as u32;
        let max_sge = dev.max_sge().max(0) as u32;
        let mut v = Vec::new();
        if c.max_send_wr > max_wr {
            v.push(format!(
                "max_send_wr {} > device max_qp_wr {max_wr}",
                c.max_send_wr
            ));
        }
        if c.max_recv_wr > max_wr && self.srq.is_none() {
            v.push(format!(
                "max_recv_wr {} > device max_qp_wr {max_wr}",
                c.max_recv_wr
            ));
        }
        if c.max_send_sge > max_sge || c.max_recv_sge > max_sge {
            v.push(format!(
                "SGEs {}/{} > device max_sge {max_sge}",
                c.max_send_sge, c.max_recv_sge
            ));
        }
        if c.max_send_wr > self.send_cq.capacity() {
            v.push(format!(
                "max_send_wr {} > send CQ capacity {} (risk of CQ overrun)",
                c.max_send_wr,
                self.send_cq.capacity()
            ));
        }
        if c.max_inline_data > 0 && v.is_empty() {
            v.push(format!(
                "max_inline_data {} may exceed what the device supports",
                c.max_inline_data
            ));
        }
        if v.is_empty() {
            None
        } else {
            Some(v.join("; "))
        }
    }
}

/// The hint for send operations `refused` (non-empty) by device `device` on QPs of
/// `qp_type`.
fn refused_ops_hint(refused: SendOps, device: &str, qp_type: &str) -> String {
    let names: Vec<&str> = refused.iter_names().map(|(n, _)| n).collect();
    let many = names.len() > 1;
    format!(
        "send op{} {} {} not supported by device {device} for {qp_type} QPs: leave {} out \
         of the SendOps",
        if many { "s" } else { "" },
        names.join(", "),
        if many { "are" } else { "is" },
        if many { "them" } else { "it" },
    )
}

/// The RESET->INIT attributes of [`Qp::connect`] and [`Qp::init`].
fn connect_init_attr(local: &PortInfo, opts: &ConnectOptions) -> InitAttr {
    InitAttr {
        port: local.port,
        pkey_index: opts.pkey_index,
        access: opts.access,
        qkey: opts.qkey,
    }
}

/// A PSN from the process's random hasher keys (no extra dependency): 24 bits.
fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() as u32) & 0x00ff_ffff
}

/// The GRH part of an address: where a routed (RoCE, or IB across subnets) packet goes.
///
/// # Example
/// ```
/// let grh = hotverbs::Grh::to(hotverbs::Gid::from_ipv4([10, 0, 0, 2]), 1);
/// assert_eq!(grh.hop_limit, 64);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grh {
    /// Destination GID.
    pub dgid: Gid,
    /// Local GID index to send from.
    pub sgid_index: u8,
    /// Hop limit (IP TTL).
    pub hop_limit: u8,
    /// Traffic class (IP DSCP/ECN).
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
}

impl Grh {
    /// A GRH to `dgid` from local GID `sgid_index`, hop limit 64.
    pub fn to(dgid: Gid, sgid_index: u8) -> Grh {
        Grh {
            dgid,
            sgid_index,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        }
    }
}

/// RESET->INIT attributes (`IBV_QP_STATE | PKEY_INDEX | PORT | ACCESS_FLAGS`, or `QKEY`
/// instead of access flags for UD).
///
/// # Example
/// ```
/// let a = hotverbs::InitAttr { port: 1, ..Default::default() };
/// assert_eq!(a.pkey_index, 0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitAttr {
    /// Physical port (from 1).
    pub port: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// Remote access the QP allows (RC/UC): REMOTE_WRITE/READ/ATOMIC.
    pub access: AccessFlags,
    /// Q_Key (UD only).
    pub qkey: u32,
}

/// The Q_Key [`InitAttr::default`] and [`ConnectOptions::default`] use for UD QPs.
pub const DEFAULT_QKEY: u32 = 0x1111_1111;

impl Default for InitAttr {
    fn default() -> Self {
        InitAttr {
            port: 1,
            pkey_index: 0,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            qkey: DEFAULT_QKEY,
        }
    }
}

/// INIT->RTR attributes. RC: `STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN |
/// MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER`; UC: the first five; UD: state only.
///
/// # Example
/// ```
/// use hotverbs::{AhAttr, Mtu, RtrAttr};
/// let a = RtrAttr { path_mtu: Mtu::Mtu1024, dest_qpn: 0x12, rq_psn: 0x345,
///                   ah: AhAttr::lid(0x7, 1), ..Default::default() };
/// assert_eq!(a.max_dest_rd_atomic, 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrAttr {
    /// Path MTU (at most the port's active MTU).
    pub path_mtu: Mtu,
    /// The remote QP number.
    pub dest_qpn: u32,
    /// The first PSN expected from the remote (its send PSN).
    pub rq_psn: u32,
    /// Outstanding RDMA reads/atomics this QP answers (RC).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (RC; 12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// Address of the remote port.
    pub ah: AhAttr,
}

impl Default for RtrAttr {
    fn default() -> Self {
        RtrAttr {
            path_mtu: Mtu::Mtu1024,
            dest_qpn: 0,
            rq_psn: 0,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah: AhAttr::lid(0, 1),
        }
    }
}

/// RTR->RTS attributes. RC: `STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN |
/// MAX_QP_RD_ATOMIC`; UC/UD: `STATE | SQ_PSN`.
///
/// # Example
/// ```
/// let a = hotverbs::RtsAttr { sq_psn: 0x345, ..Default::default() };
/// assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (14, 6, 6)); // both finite: 7 is "for ever"
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsAttr {
    /// Local ACK timeout code (4.096 µs * 2^timeout; 14 ≈ 67 ms).
    pub timeout: u8,
    /// Transport retries (max 7; the default 6 is finite everywhere: rxe treats 7 as
    /// "retry forever", so a dead peer would never complete).
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite; the default 6 is finite, see [`ConnectOptions`]).
    pub rnr_retry: u8,
    /// Our first send PSN.
    pub sq_psn: u32,
    /// Outstanding RDMA reads/atomics this QP initiates.
    pub max_rd_atomic: u8,
}

impl Default for RtsAttr {
    fn default() -> Self {
        RtsAttr {
            timeout: 14,
            retry_cnt: 6,
            rnr_retry: 6,
            sq_psn: 0,
            max_rd_atomic: 1,
        }
    }
}

/// Options of [`Qp::connect`] (sensible defaults: MTU = the port's active MTU capped at
/// 4096, timeout 14, retry_cnt 6, rnr_retry 6, min_rnr_timer 12, one outstanding
/// read/atomic each way, all remote access allowed).
///
/// # How long until a dead or stuck peer is reported
/// Both retry counts default to 6, not 7: 7 means "retry for ever" (rxe takes it so for
/// `retry_cnt` too), so a WR could wait for ever. With the defaults no WR does:
/// - **A dead peer** (no ACK at all): with the local ACK timeout code `timeout` = t, each
///   attempt waits 4.096 µs × 2^t, and the WR completes with `IBV_WC_RETRY_EXC_ERR` after
///   about (retry_cnt + 1) × 4.096 µs × 2^t: with the defaults (t = 14: 67.1 ms per
///   attempt) 7 × 67.1 ms ≈ 0.47 s, plus the kernel's timer slack on rxe (509 ms measured
///   in the TCG VM).
/// - **A live peer with no receive posted** (RNR NAKs): the WR completes with
///   `IBV_WC_RNR_RETRY_EXC_ERR` after about rnr_retry × the peer's `min_rnr_timer` (12:
///   0.64 ms), so ≈ 3.8 ms with the defaults (rxe rounds each wait up to its timer tick).
///   Flow control ([`hotverbs_datapath::credits`]) keeps a sender from causing RNR at all.
///   Set `rnr_retry` 7 to wait for ever, as `ibv_rc_pingpong` and perftest (and
///   `hotverbs-perf`, to compare like with like) do; a [`Watchdog`](crate::Watchdog) then
///   tells the stuck ring from a slow one.
///
/// softnic has no timers: it reports a missing peer, and RNR with `rnr_retry` below 7, at
/// once.
///
/// # Example
/// ```
/// let o = hotverbs::ConnectOptions { mtu: Some(hotverbs::Mtu::Mtu1024), ..Default::default() };
/// assert_eq!((o.timeout, o.retry_cnt, o.rnr_retry), (14, 6, 6));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Path MTU cap; `None` = the local port's active MTU. `ibv_rc_pingpong` uses 1024.
    pub mtu: Option<Mtu>,
    /// See [`RtsAttr::timeout`].
    pub timeout: u8,
    /// See [`RtsAttr::retry_cnt`].
    pub retry_cnt: u8,
    /// See [`RtsAttr::rnr_retry`].
    pub rnr_retry: u8,
    /// See [`RtrAttr::min_rnr_timer`].
    pub min_rnr_timer: u8,
    /// See [`RtsAttr::max_rd_atomic`].
    pub max_rd_atomic: u8,
    /// See [`RtrAttr::max_dest_rd_atomic`].
    pub max_dest_rd_atomic: u8,
    /// See [`InitAttr::access`].
    pub access: AccessFlags,
    /// Service level.
    pub sl: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// Q_Key (UD).
    pub qkey: u32,
    /// GRH hop limit (RoCE / routed).
    pub hop_limit: u8,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            mtu: None,
            timeout: 14,
            retry_cnt: 6,
            rnr_retry: 6,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            access: InitAttr::default().access,
            sl: 0,
            pkey_index: 0,
            qkey: DEFAULT_QKEY,
            hop_limit: 64,
        }
    }
}

/// What `ibv_query_qp(3)` answered: the attributes and the creation caps.
///
/// # Example
/// ```
/// # use hotverbs::*;
/// # let ctx = Context::open("softnic")?;
/// # let pd = ctx.alloc_pd()?;
/// # let cq = ctx.create_cq(16, None)?;
/// let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
/// qp.to_init(&InitAttr::default())?;
/// let a = qp.query()?;
/// assert_eq!(a.state(), QpState::Init);
/// assert_eq!(a.port(), 1);
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone, Copy)]
pub struct QpAttr {
    attr: ibv_qp_attr,
    init: ibv_qp_init_attr,
}

/// A QP's capabilities (`struct ibv_qp_cap`): what `ibv_create_qp(3)` granted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (0 with an SRQ).
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Bytes a send WR may carry inline.
    pub max_inline_data: u32,
}

impl From<hotverbs_ffi::ibv_qp_cap> for QpCaps {
    fn from(c: hotverbs_ffi::ibv_qp_cap) -> QpCaps {
        QpCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }
}

impl QpAttr {
    /// The raw attributes (`struct ibv_qp_attr`).
    pub fn as_raw(&self) -> &ibv_qp_attr {
        &self.attr
    }
    /// The raw init attributes (`struct ibv_qp_init_attr`: caps, type, sq_sig_all).
    pub fn init_raw(&self) -> &ibv_qp_init_attr {
        &self.init
    }
    /// The QP type.
    pub fn qp_type(&self) -> Option<QpType> {
        QpType::from_raw(self.init.qp_type)
    }
    /// Every send WR signaled (`sq_sig_all`)?
    pub fn sq_sig_all(&self) -> bool {
        self.init.sq_sig_all != 0
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        QpState::from_raw(self.attr.qp_state)
    }
    /// Path MTU.
    pub fn path_mtu(&self) -> Option<Mtu> {
        Mtu::from_raw(self.attr.path_mtu)
    }
    /// Remote QP number.
    pub fn dest_qpn(&self) -> u32 {
        self.attr.dest_qp_num
    }
    /// Receive PSN.
    pub fn rq_psn(&self) -> u32 {
        self.attr.rq_psn
    }
    /// Send PSN.
    pub fn sq_psn(&self) -> u32 {
        self.attr.sq_psn
    }
    /// Q_Key (UD).
    pub fn qkey(&self) -> u32 {
        self.attr.qkey
    }
    /// Port.
    pub fn port(&self) -> u8 {
        self.attr.port_num
    }
    /// Remote access flags.
    pub fn access(&self) -> AccessFlags {
        AccessFlags::from_bits_truncate(self.attr.qp_access_flags)
    }
    /// ACK timeout code.
    pub fn timeout(&self) -> u8 {
        self.attr.timeout
    }
    /// Retry count.
    pub fn retry_cnt(&self) -> u8 {
        self.attr.retry_cnt
    }
    /// RNR retry count.
    pub fn rnr_retry(&self) -> u8 {
        self.attr.rnr_retry
    }
    /// Outstanding reads/atomics initiated.
    pub fn max_rd_atomic(&self) -> u8 {
        self.attr.max_rd_atomic
    }
    /// Outstanding reads/atomics answered.
    pub fn max_dest_rd_atomic(&self) -> u8 {
        self.attr.max_dest_rd_atomic
    }
    /// RNR timer code.
    pub fn min_rnr_timer(&self) -> u8 {
        self.attr.min_rnr_timer
    }
    /// Capabilities.
    pub fn cap(&self) -> QpCaps {
        self.attr.cap.into()
    }
}

impl fmt::Debug for QpAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QpAttr")
            .field("state", &self.state())
            .field("path_mtu", &self.path_mtu())
            .field("dest_qpn", &self.dest_qpn())
            .field("rq_psn", &self.rq_psn())
            .field("sq_psn", &self.sq_psn())
            .field("port", &self.port())
            .finish_non_exhaustive()
    }
}

/// A queue pair (`struct ibv_qp`).
///
/// Holds its PD, CQs and SRQ alive. Move it through the states with
/// [`to_init`](Self::to_init), [`to_rtr`](Self::to_rtr), [`to_rts`](Self::to_rts),
/// [`to_error`](Self::to_error), [`reset`](Self::reset) — or all at once with
/// [`connect`](Self::connect), after [`init`](Self::init) when receives are to be posted
/// before the peer can send. Hand [`as_raw`](Self::as_raw) to the datapath.
///
/// # Example: a connected RC pair in one process
/// ```
/// use hotverbs::*;
/// let ctx = Context::open("softnic")?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64, None)?;
/// let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
/// let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
/// let port = ctx.port_info(None, None)?;
/// a.connect(&port, &b.endpoint(&port), &ConnectOptions::default())?;
/// b.connect(&port, &a.endpoint(&port), &ConnectOptions::default())?;
/// assert_eq!(a.query()?.state(), QpState::Rts);
/// assert_eq!(a.query()?.dest_qpn(), b.qp_num());
/// # Ok::<(), hotverbs::Error>(())
/// ```
///
/// # References
/// `ibv_create_qp(3)`, `ibv_modify_qp(3)`, `ibv_query_qp(3)`
pub struct Qp {
    qp: *mut ibv_qp,
    /// The same QP as an `ibv_qp_ex` in extended mode ([`QpBuilder::send_ops`]), else null.
    qp_ex: *mut ibv_qp_ex,
    /// The operations of an extended QP (empty otherwise).
    send_ops: SendOps,
    /// How the QP is destroyed (its own verb, or rdma_cm's on the ID that made it).
    destroy: QpDestroy,
    /// Created with `sq_sig_all` (every send WR signaled).
    sq_sig_all: bool,
    /// The send queue was handed out ([`Qp::take_send_queue`]): one ring per SQ.
    sq_taken: AtomicBool,
    /// The receive queue was handed out ([`Qp::take_recv_queue`]).
    rq_taken: AtomicBool,
    /// Which ring owns the send queue now ([`SqOwner`] as `u8`; 0: none alive). While one
    /// does, a move to RESET is the ring's operation (`reset_qp`), refused elsewhere.
    sq_owner: AtomicU8,
    /// A `RecvRing` owns the receive queue now.
    rq_owner: AtomicBool,
    /// The receive queue was given to a direct receive ring (`Qp::direct_recv_ring`), for
    /// the QP's life: verbs send rings, whose resets cannot clean a direct CQ, are refused.
    rq_direct: AtomicBool,
    /// A send post through this `Qp` failed without the provider naming the WR (rxe before
    /// RTS queues it anyway, to run once the QP is in RTS): [`connect`](Qp::connect) from
    /// INIT then goes through RESET, which discards it, instead of keeping the QP's INIT.
    /// Cleared by every move to RESET.
    sq_unnamed: AtomicBool,
    /// Serialises [`Qp::post_send_inline`] on a QP of a thread domain (whose provider may
    /// not lock the send queue); unused otherwise.
    post_lock: Mutex<()>,
    qp_type: QpType,
    cap: hotverbs_ffi::ibv_qp_cap,
    pd: Pd,
    send_cq: Cq,
    recv_cq: Cq,
    srq: Option<Srq>,
    state: AtomicU32,
    port: AtomicU8,
    local_psn: u32,
    /// Receive leases ([`Qp::lease_recv`]), released by a reset or the destroy.
    leases: Mutex<Vec<Lease>>,
    /// The bridge rings' claims on the CQs (ids, reserved completions), released by the
    /// destroy: completions of the QP's WRs can arrive until then.
    reservations: Mutex<Vec<crate::bridge::RingReservation>>,
}

// SAFETY: QP verbs are thread-safe; the struct holds only identifiers and atomics.
unsafe impl Send for Qp {}
// SAFETY: see Send.
unsafe impl Sync for Qp {}

impl fmt::Debug for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qp")
            .field("qp_num", &self.qp_num())
            .field("type", &self.qp_type)
            .field("state", &self.tracked_state())
            .finish()
    }
}

impl Qp {
    /// The raw `ibv_qp` for the datapath.
    ///
    /// # Safety contract for users of the pointer
    /// Valid while this `Qp` lives (its PD, CQs and SRQ live at least as long). Posting
    /// through it is the datapath's business; state changes must go through this `Qp`
    /// (or the tracked state used for error hints goes stale — harmless, but confusing).
    pub fn as_raw(&self) -> *mut ibv_qp {
        self.qp
    }

    /// The raw `ibv_qp_ex` of a QP built in extended mode ([`QpBuilder::send_ops`]), for
    /// `ibv_wr_start` / `ibv_wr_*` / `ibv_wr_complete` (the datapath's extended ring takes
    /// it); `None` for a QP from `ibv_create_qp`.
    ///
    /// Same validity contract as [`as_raw`](Self::as_raw); only the operations in
    /// [`send_ops`](Self::send_ops) may be posted (the provider leaves the others NULL).
    ///
    /// # References
    /// `ibv_create_qp_ex(3)`, `ibv_wr_post(3)`
    pub fn as_qp_ex(&self) -> Option<*mut ibv_qp_ex> {
        (!self.qp_ex.is_null()).then_some(self.qp_ex)
    }

    /// The operations an extended QP was created with (empty for a QP from
    /// `ibv_create_qp`).
    ///
    /// # References
    /// `ibv_create_qp_ex(3)`
    pub fn send_ops(&self) -> SendOps {
        self.send_ops
    }

    /// QP number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: live QP.
        unsafe { (*self.qp).qp_num }
    }

    /// Transport type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The capabilities `ibv_create_qp` returned: at least what was asked, and what the
    /// rings and the setup layer's checks use.
    ///
    /// A provider may grant more than it returns here. rxe returns the requested queue
    /// depths (4 asked, 4 returned, 7 usable) and SGE counts, while `ibv_query_qp` reports
    /// what the queues really hold (fault-truth S3, S19): for the device's own figures,
    /// inline limit included, read [`query`](Self::query)`()?.`[`cap`](QpAttr::cap)`()`.
    /// Posting within `cap()` is always within the device's limits.
    pub fn cap(&self) -> QpCaps {
        self.cap.into()
    }

    /// The PD.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The send CQ.
    pub fn send_cq(&self) -> &Cq {
        &self.send_cq
    }

    /// The receive CQ.
    pub fn recv_cq(&self) -> &Cq {
        &self.recv_cq
    }

    /// The SRQ, if attached.
    pub fn srq(&self) -> Option<&Srq> {
        self.srq.as_ref()
    }

    /// The random 24-bit PSN this QP sends from when connected with
    /// [`connect`](Self::connect) (and advertises in [`endpoint`](Self::endpoint)).
    pub fn local_psn(&self) -> u32 {
        self.local_psn
    }

    /// The state as last set through this `Qp` (the device may have moved it to ERR since;
    /// [`query`](Self::query) is authoritative).
    pub fn tracked_state(&self) -> QpState {
        QpState::from_raw(self.state.load(Ordering::Relaxed))
    }

    /// The state the device reports now (`ibv_query_qp(3)`, read for the state alone).
    ///
    /// # Example
    /// ```
    /// # use hotverbs::*;
    /// # let ctx = Context::open("softnic")?;
    /// # let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(16, None)?);
    /// let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
    /// assert_eq!(qp.state()?, QpState::Reset);
    /// qp.init(&ctx.port_info(None, None)?, &ConnectOptions::default())?;
    /// assert_eq!(qp.state()?, QpState::Init);
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    ///
    /// # Errors
    /// `ibv_query_qp` with the provider's errno.
    pub fn state(&self) -> Result<QpState> {
        self.query().map(|a| a.state())
    }

    /// The state for an error message: the device's answer, else the tracked state.
    #[cold]
    fn state_for_hint(&self) -> QpState {
        self.state().unwrap_or_else(|_| self.tracked_state())
    }

    /// `e`, an error of the ring `ring` (`"SendRing"`, `"WrRing"`) on this QP's send queue,
    /// as an [`Error`] saying what to do, with the QP's state (queried now) where it
    /// explains the refusal. Cold: only error paths call it.
    #[cold]
    pub(crate) fn explain_send(&self, ring: &'static str, e: &SendError) -> Error {
        match *e {
            SendError::Post(p) => Error::new(p.verb, p.errno).with_hint(post_hint(
                self.state_for_hint(),
                &p,
                true,
                ring,
            )),
            SendError::QpError(wc) => {
                // Only ERR/SQE say it all: in another state the ring still needs its reset.
                let what = match self.state_for_hint() {
                    st @ (QpState::Err | QpState::Sqe) => st.post_hint(true),
                    _ => None,
                }
                .unwrap_or(
                    "reset the QP through the ring (reset_qp(), or reset_qp_with(&mut \
                     recv_ring) when a RecvRing owns the receive queue) and connect again",
                );
                Error::new(ring, libc::EIO).with_hint(format!(
                    "the ring failed at a completion ({wc}) and refuses new WRs: {what}"
                ))
            }
            SendError::WouldBlock => Error::new(ring, libc::EAGAIN).with_hint(e.to_string()),
            SendError::InlineTooLong { len, max } => {
                Error::new(ring, libc::EINVAL).with_hint(inline_too_long_hint(len as u64, max))
            }
            SendError::NotInline => Error::new(ring, libc::EINVAL).with_hint(NOT_INLINE_HINT),
            _ => Error::new(ring, libc::EINVAL).with_hint(e.to_string()),
        }
    }

    /// A receive ring's refused post `e` on this QP, with the QP's state (queried now).
    #[cold]
    pub(crate) fn explain_recv_post(&self, e: PostError) -> RecvPostError {
        RecvPostError::new(e, self.state_for_hint())
    }

    /// Our endpoint for the peer: LID, QPN, PSN and GID of `local`, no MR.
    pub fn endpoint(&self, local: &PortInfo) -> Endpoint {
        Endpoint {
            lid: local.lid,
            qpn: self.qp_num(),
            psn: self.local_psn,
            gid: local.gid.0,
            mr: None,
        }
    }

    /// `ibv_query_qp(3)`.
    pub fn query(&self) -> Result<QpAttr> {
        let f = self
            .pd
            .context()
            .fns()
            .ibv_query_qp
            .ok_or_else(|| Error::missing("ibv_query_qp"))?;
        // SAFETY: plain C data.
        let mut attr: ibv_qp_attr = unsafe { zeroed() };
        // SAFETY: plain C data.
        let mut init: ibv_qp_init_attr = unsafe { zeroed() };
        // Every standard attribute (bits 0..=20); rxe answers EOPNOTSUPP when a mask
        // holds anything beyond them, e.g. IBV_QP_RATE_LIMIT.
        let mask = (QpAttrMask::all() - QpAttrMask::RATE_LIMIT).bits() as i32;
        // SAFETY: live QP, writable out-structs.
        let ret = unsafe { f(self.qp, &mut attr, mask, &mut init) };
        if ret != 0 {
            return Err(Error::from_ret("ibv_query_qp", ret));
        }
        Ok(QpAttr { attr, init })
    }

    /// Modifies with a raw attribute struct and mask (`ibv_modify_qp(3)`), for
    /// transitions the typed methods do not cover (e.g. SQD). The error names the
    /// transition.
    pub fn modify_raw(&self, attr: &mut ibv_qp_attr, mask: QpAttrMask) -> Result<()> {
        self.modify_to(attr, mask, |_, _| None)
    }

    fn modify_to(
        &self,
        attr: &mut ibv_qp_attr,
        mask: QpAttrMask,
        hint: impl FnOnce(&Qp, QpState) -> Option<String>,
    ) -> Result<()> {
        if mask.contains(QpAttrMask::STATE) && attr.qp_state == hotverbs_ffi::IBV_QPS_RESET {
            self.refuse_if_owned()?;
        }
        self.modify_state(attr, mask, hint)
    }

    /// `EBUSY` naming the ring when a ring owns one of this QP's queues: a move to RESET
    /// would zero the device's counters and discard posted WRs under it (a direct ring
    /// would then re-announce old WQEs; a receive ring would repost into memory no longer
    /// leased), so it is the ring's operation.
    fn refuse_if_owned(&self) -> Result<()> {
        let sq = SqOwner::from_u8(self.sq_owner.load(Ordering::Acquire));
        let rq = self.rq_owner.load(Ordering::Acquire);
        let hint = match (sq, rq) {
            (None, false) => return Ok(()),
            (Some(k), false) => format!(
                "a {} owns this QP's send queue: reset the QP through it ({}::reset_qp), \
                 which accounts every WR and resets the ring, then connect again",
                k.name(),
                k.name()
            ),
            (None, true) => "a RecvRing owns this QP's receive queue: reset the QP through it \
                             (RecvRing::reset_qp), then connect again"
                .to_string(),
            (Some(k), true) => format!(
                "a {} and a RecvRing own this QP's queues: reset the QP through both \
                 ({}::reset_qp_with(&mut recv_ring)), then connect again",
                k.name(),
                k.name()
            ),
        };
        Err(Error::new("ibv_modify_qp(RESET)", libc::EBUSY).with_hint(hint))
    }

    /// RESET on behalf of the rings that own the queues (they reset themselves after).
    pub(crate) fn reset_by_rings(&self) -> Result<()> {
        // SAFETY: plain C data.
        let mut attr: ibv_qp_attr = unsafe { zeroed() };
        attr.qp_state = hotverbs_ffi::IBV_QPS_RESET;
        self.modify_state(&mut attr, QpAttrMask::STATE, |_, _| None)
    }

    /// The ring that owns the send queue now, if any.
    pub(crate) fn sq_owner(&self) -> Option<SqOwner> {
        SqOwner::from_u8(self.sq_owner.load(Ordering::Acquire))
    }

    /// Records (or, with `None`, clears) the ring owning the send queue; clearing it also
    /// frees the thread domain's send-ring slot.
    pub(crate) fn set_sq_owner(&self, k: Option<SqOwner>) {
        self.sq_owner
            .store(k.map_or(0, |k| k as u8), Ordering::Release);
        if k.is_none() {
            if let Some(td) = self.thread_domain() {
                td.release_send_ring();
            }
        }
    }

    /// The thread domain the QP was made in (through a parent domain), if any.
    pub(crate) fn thread_domain(&self) -> Option<&crate::ThreadDomain> {
        self.pd.inner.parent.as_ref().and_then(|p| p.td.as_ref())
    }

    /// Gives the send queue back after a ring could not be built.
    pub(crate) fn unclaim_send_queue(&self) {
        if let Some(td) = self.thread_domain() {
            td.release_send_ring();
        }
        self.sq_taken.store(false, Ordering::Release);
    }

    /// A `RecvRing` owns the receive queue now.
    pub(crate) fn rq_owned(&self) -> bool {
        self.rq_owner.load(Ordering::Acquire)
    }

    /// Records whether a `RecvRing` owns the receive queue.
    pub(crate) fn set_rq_owned(&self, yes: bool) {
        self.rq_owner.store(yes, Ordering::Release);
    }

    /// The receive queue is a direct receive ring's (for the QP's life).
    pub(crate) fn rq_direct(&self) -> &AtomicBool {
        &self.rq_direct
    }

    fn modify_state(
        &self,
        attr: &mut ibv_qp_attr,
        mask: QpAttrMask,
        hint: impl FnOnce(&Qp, QpState) -> Option<String>,
    ) -> Result<()> {
        let f = self
            .pd
            .context()
            .fns()
            .ibv_modify_qp
            .ok_or_else(|| Error::missing("ibv_modify_qp"))?;
        // SAFETY: live QP; attr is a valid, initialised struct.
        let ret = unsafe { f(self.qp, attr, mask.bits() as i32) };
        let to = QpState::from_raw(attr.qp_state);
        if ret == 0 {
            if mask.contains(QpAttrMask::STATE) {
                self.state.store(attr.qp_state, Ordering::Relaxed);
                if attr.qp_state == hotverbs_ffi::IBV_QPS_RESET {
                    // RESET discarded whatever a refused post left queued.
                    self.sq_unnamed.store(false, Ordering::Relaxed);
                }
                if attr.qp_state == hotverbs_ffi::IBV_QPS_RESET && !self.rq_owned() {
                    // RESET removes the receive queue's WRs without completions; a live
                    // RecvRing keeps its lease (it posts into the region again).
                    if self.rq_direct.load(Ordering::Acquire) {
                        // A direct poll may still copy a stale CQE's payload into a slot:
                        // the CQ is cleaned of the QP first (crate::direct).
                        self.recv_cq.inner.rings.defer_clean_and_wait(self.qp_num());
                    }
                    self.release_leases();
                }
            }
            if mask.contains(QpAttrMask::PORT) {
                self.port.store(attr.port_num, Ordering::Relaxed);
            }
            return Ok(());
        }
        let from = self
            .query()
            .map(|a| a.state())
            .unwrap_or_else(|_| self.tracked_state());
        let verb = if mask.contains(QpAttrMask::STATE) {
            transition_verb(from, to)
        } else {
            "ibv_modify_qp"
        };
        let e = Error::from_ret(verb, ret);
        let expected = match to {
            QpState::Init => Some(QpState::Reset),
            QpState::Rtr => Some(QpState::Init),
            QpState::Rts => Some(QpState::Rtr),
            _ => None,
        };
        let e = match expected {
            Some(exp) if from != exp && !(to == QpState::Init && from == QpState::Init) => e
                .with_hint(format!(
                    "QP is in {}: {} must come from {} (RESET->INIT->RTR->RTS)",
                    from.name(),
                    to.name(),
                    exp.name()
                )),
            _ if to == QpState::Err && from == QpState::Reset => {
                e.with_hint("RESET->ERR is not a valid transition: move to INIT first")
            }
            _ => e,
        };
        Err(e.or_hint(|| hint(self, from)))
    }

    /// RESET->INIT with port, P_Key index and access flags (RC/UC) or Q_Key (UD).
    pub fn to_init(&self, a: &InitAttr) -> Result<()> {
        // SAFETY: plain C data.
        let mut attr: ibv_qp_attr = unsafe { zeroed() };
        attr.qp_state = hotverbs_ffi::IBV_QPS_INIT;
        attr.port_num = a.port;
        attr.pkey_index = a.pkey_index;
        let mut mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
        if self.qp_type == QpType::Ud {
            attr.qkey = a.qkey;
            mask |= QpAttrMask::QKEY;
        } else {
            attr.qp_access_flags = a.access.bits();
            mask |= QpAttrMask::ACCESS_FLAGS;
        }
        self.modify_to(&mut attr, mask, |qp, _| {
            let ctx = qp.pd.context();
            let ports = ctx.query_device().ok()?.phys_port_cnt();
            if a.port == 0 || a.port > ports {
                return Some(format!(
                    "port {} does not exist (device has {ports})",
                    a.port
                ));
            }
            let pk = ctx.query_port(a.port).ok()?.pkey_tbl_len();
            if a.pkey_index >= pk {
                return Some(format!(
                    "pkey_index {} >= P_Key table size {pk}",
                    a.pkey_index
                ));
            }
            if qp.qp_type == QpType::Uc
                && a.access
                    .intersects(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC)
            {
                return Some("UC QPs allow only REMOTE_WRITE".into());
            }
            None
        })
    }

    /// INIT->RTR for a UD QP: the state alone. A UD QP has no fixed peer (each WR names
    /// its address handle, QPN and Q_Key), so nothing else is set; [`to_rtr`](Self::to_rtr)
    /// takes an [`RtrAttr`] whose fields a UD QP ignores.
    ///
    /// # Example
    /// ```
    /// use hotverbs::*;
    /// let ctx = Context::open("softnic")?;
    /// let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(16, None)?);
    /// let ud = QpBuilder::new(&pd, &cq, &cq, QpType::Ud).build()?;
    /// ud.to_init(&InitAttr { qkey: 0x1111_1111, ..InitAttr::default() })?;
    /// ud.ud_to_rtr()?;
    /// ud.ud_to_rts(ud.local_psn())?;
    /// assert_eq!(ud.state()?, QpState::Rts);
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    ///
    /// # Errors
    /// `Qp::ud_to_rtr: EINVAL` on a QP that is not UD (it needs [`to_rtr`](Self::to_rtr)'s
    /// peer); `ibv_modify_qp(INIT->RTR)` with the provider's errno.
    pub fn ud_to_rtr(&self) -> Result<()> {
        self.only_ud("Qp::ud_to_rtr")?;
        // SAFETY: plain C data.
        let mut attr: ibv_qp_attr = unsafe { zeroed() };
        attr.qp_state = hotverbs_ffi::IBV_QPS_RTR;
        self.modify_to(&mut attr, QpAttrMask::STATE, |_, _| None)
    }

    /// RTR->RTS for a UD QP: the send PSN alone (see [`ud_to_rtr`](Self::ud_to_rtr)).
    ///
    /// # Errors
    /// `Qp::ud_to_rts: EINVAL` on a QP that is not UD, or a PSN above 24 bits;
    /// `ibv_modify_qp(RTR->RTS)` with the provider's errno.
    pub fn ud_to_rts(&self, sq_psn: u32) -> Result<()> {
        self.only_ud("Qp::ud_to_rts")?;
        if sq_psn > 0x00ff_ffff {
            return Err(Error::new("Qp::ud_to_rts", libc::EINVAL)
                .with_hint(format!("sq_psn {sq_psn:#x}: PSNs are 24-bit")));
        }
        // SAFETY: plain C data.
        let mut attr: ibv_qp_attr = unsafe { zeroed() };
        attr.qp_state = hotverbs_ffi::IBV_QPS_RTS;
        attr.sq_psn = sq_psn;
        self.modify_to(&mut attr, QpAttrMask::STATE | QpAttrMask::SQ_PSN, |_, _| {
            None
        })
    }

    fn only_ud(&self, verb: &'static str) -> Result<()> {
        if self.qp_type == QpType::Ud {
            return Ok(());
        }
        Err(Error::new(verb, libc::EINVAL).with_hint(format!(
            "a {:?} QP connects to one peer: use to_rtr / to_rts (or connect) with its \
             endpoint",
            self.qp_type
        )))
    }

    /// INIT->RTR: path MTU, remote QPN, receive PSN, address, and for RC
    /// `max_dest_rd_atomic` and `min_rnr_timer`. For UD only the state changes (say so
    /// with [`ud_to_rtr`](Self::ud_to_rtr)).
    pub fn to_rtr(&self, a: &RtrAttr) -> Result<()> {
        // SAFETY: plain C data.
        let mut attr: ibv_qp_attr = unsafe { zeroed() };
        attr.qp_state = hotverbs_ffi::IBV_QPS_RTR;
        let mut mask = QpAttrMask::STATE;
        if self.qp_type != QpType::Ud {
            attr.path_mtu = a.path_mtu.raw();
            attr.dest_qp_num = a.dest_qpn;
            attr.rq_psn = a.rq_psn;
            attr.ah_attr = a.ah.to_raw();
            mask |=
                QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN;
            if self.qp_type == QpType::Rc {
                attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
                attr.min_rnr_timer = a.min_rnr_timer;
                mask |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
            }
        }
        self.modify_to(&mut attr, mask, |qp, _| {
            if a.dest_qpn > 0x00ff_ffff || a.rq_psn > 0x00ff_ffff {
                return Some("QPNs and PSNs are 24-bit".into());
            }
            let ctx = qp.pd.context();
            let port = match a.ah.port {
                0 => qp.port.load(Ordering::Relaxed),
                p => p,
            };
            let pa = ctx.query_port(port).ok()?;
            if a.path_mtu > pa.active_mtu() {
                return Some(format!(
                    "path_mtu {} above port's active_mtu {}?",
                    a.path_mtu.bytes(),
                    pa.active_mtu().bytes()
                ));
            }
            if pa.link_layer() == LinkLayer::Ethernet && a.ah.grh.is_none() {
                return Some(
                    "RoCE port: the address needs a GRH (ah.grh with the peer's GID)".into(),
                );
            }
            if let Some(g) = a.ah.grh {
                if u32::from(g.sgid_index) >= pa.gid_tbl_len() {
                    return Some(format!(
                        "sgid_index {} >= GID table size {}",
                        g.sgid_index,
                        pa.gid_tbl_len()
                    ));
                }
            }
            let dev = ctx.query_device().ok()?;
            if i32::from(a.max_dest_rd_atomic) > dev.max_qp_rd_atom() {
                return Some(format!(
                    "max_dest_rd_atomic {} > device max_qp_rd_atom {}",
                    a.max_dest_rd_atomic,
                    dev.max_qp_rd_atom()
                ));
            }
            None
        })
    }

    /// RTR->RTS: send PSN, and for RC timeout, retries and `max_rd_atomic` (for UD only
    /// the PSN: [`ud_to_rts`](Self::ud_to_rts)).
    pub fn to_rts(&self, a: &RtsAttr) -> Result<()> {
        // SAFETY: plain C data.
        let mut attr: ibv_qp_attr = unsafe { zeroed() };
        attr.qp_state = hotverbs_ffi::IBV_QPS_RTS;
        attr.sq_psn = a.sq_psn;
        let mut mask = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
        if self.qp_type == QpType::Rc {
            attr.timeout = a.timeout;
            attr.retry_cnt = a.retry_cnt;
            attr.rnr_retry = a.rnr_retry;
            attr.max_rd_atomic = a.max_rd_atomic;
            mask |= QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC;
        }
        self.modify_to(&mut attr, mask, |qp, _| {
            if a.sq_psn > 0x00ff_ffff {
                return Some("PSNs are 24-bit".into());
            }
            if a.retry_cnt > 7 || a.rnr_retry > 7 {
                return Some("retry_cnt and rnr_retry are 3-bit (0..=7)".into());
            }
            if a.timeout > 31 {
                return Some("timeout is 5-bit (0..=31)".into());
            }
            let dev = qp.pd.context().query_device().ok()?;
            if i32::from(a.max_rd_atomic) > dev.max_qp_init_rd_atom() {
                return Some(format!(
                    "max_rd_atomic {} > device max_qp_init_rd_atom {}",
                    a.max_rd_atomic,
                    dev.max_qp_init_rd_atom()
                ));
            }
            None
        })
    }

    /// Any state -> ERR: outstanding WRs complete with `IBV_WC_WR_FLUSH_ERR`.
    pub fn to_error(&self) -> Result<()> {
        // SAFETY: plain C data.
        let mut attr: ibv_qp_attr = unsafe { zeroed() };
        attr.qp_state = hotverbs_ffi::IBV_QPS_ERR;
        self.modify_to(&mut attr, QpAttrMask::STATE, |_, _| None)
    }

    /// Any state -> RESET: queues emptied; the QP can be connected again.
    ///
    /// # Errors
    /// `ibv_modify_qp(RESET): EBUSY` while a ring owns one of the QP's queues: the reset is
    /// the ring's (`SendRing::reset_qp`, `reset_qp_with`, `RecvRing::reset_qp`,
    /// `DirectRing::reset_qp`), which accounts its WRs; the provider's errno.
    pub fn reset(&self) -> Result<()> {
        // SAFETY: plain C data.
        let mut attr: ibv_qp_attr = unsafe { zeroed() };
        attr.qp_state = hotverbs_ffi::IBV_QPS_RESET;
        self.modify_to(&mut attr, QpAttrMask::STATE, |_, _| None)
    }

    /// RESET->INIT with the attributes [`connect`](Self::connect) uses: `local`'s port,
    /// `opts.pkey_index`, and `opts.access` (RC/UC) or `opts.qkey` (UD). Receives can be
    /// posted from INIT on, so a receive ring filled now is ready before the peer can send:
    /// `init`, fill, then `connect`, which keeps a QP in INIT as it is (its attributes and
    /// its posted receives), and the first message never meets RNR. On a QP already in
    /// INIT it is an INIT->INIT move with these attributes (posted receives stay).
    ///
    /// # Example
    /// ```
    /// use hotverbs::*;
    /// let ctx = Context::open("softnic")?;
    /// let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(64, None)?);
    /// let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).max_inline_data(64).build()?;
    /// let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
    /// let (port, opts) = (ctx.port_info(None, None)?, ConnectOptions::default());
    /// b.init(&port, &opts)?;
    /// let mut region = pd.alloc_mr(256, AccessFlags::LOCAL_WRITE)?;
    /// let mut rx = b.recv_ring::<4>(&mut region, 0, RecvConfig::new(0, 64, 4))?;
    /// assert_eq!(rx.fill()?, 4); // before the peer exists
    /// Qp::connect_pair(&a, &b, &port, &opts)?;
    /// assert_eq!(rx.posted(), 4, "connect kept them");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`to_init`](Self::to_init): `ibv_modify_qp(RTS->INIT): EINVAL` and the like from
    /// another state (the hint names it: reset the QP first, through its ring if one owns
    /// a queue), or a port / P_Key index the device does not have.
    ///
    /// # References
    /// `ibv_modify_qp(3)`
    pub fn init(&self, local: &PortInfo, opts: &ConnectOptions) -> Result<()> {
        self.to_init(&connect_init_attr(local, opts))
    }

    /// RESET->INIT->RTR->RTS in one call, towards `remote`, from `local` (see
    /// [`Context::port_info`](crate::Context::port_info)), sending from
    /// [`local_psn`](Self::local_psn). For UD the remote is ignored (addresses go in each
    /// WR).
    ///
    /// A QP in INIT ([`init`](Self::init), [`to_init`](Self::to_init)) stays as it is —
    /// its INIT attributes and the receives posted to it are kept — and goes on to RTR and
    /// RTS: so receives filled before `connect` are there for the first message. A QP in
    /// any other state is reset first (refused while a ring owns one of its queues: reset
    /// through the ring), then moved to INIT with `local.port` and `opts`; so is a QP in
    /// INIT that a send was refused on without the provider naming the WR (rxe queues such
    /// a WR anyway, to run in RTS: the reset discards it).
    ///
    /// The address uses a GRH when `local.gid_index` is set (always on RoCE) or the remote
    /// has no LID; the MTU is the local active MTU capped by `opts.mtu`.
    ///
    /// # Errors
    /// `Qp::connect: EINVAL` for a QP in INIT on another port than `local.port` (init it
    /// with the same [`PortInfo`]); the transitions' errors, each naming its move.
    pub fn connect(
        &self,
        local: &PortInfo,
        remote: &Endpoint,
        opts: &ConnectOptions,
    ) -> Result<()> {
        match self.query() {
            Ok(a) if a.state() == QpState::Init && !self.sq_unnamed.load(Ordering::Relaxed) => {
                if a.port() != 0 && a.port() != local.port {
                    return Err(Error::new("Qp::connect", libc::EINVAL).with_hint(format!(
                        "the QP is in INIT on port {} but connect's local port is {}: init it \
                         with the PortInfo connect gets (Qp::init), or reset it",
                        a.port(),
                        local.port
                    )));
                }
            }
            Ok(a) if a.state() == QpState::Reset => {
                self.to_init(&connect_init_attr(local, opts))?
            }
            _ => {
                self.reset()?;
                self.to_init(&connect_init_attr(local, opts))?;
            }
        }
        let mtu = match opts.mtu {
            Some(m) => m.min(local.active_mtu),
            None => local.active_mtu,
        };
        let mut ah = AhAttr::to_endpoint(local, remote);
        ah.sl = opts.sl;
        if let Some(g) = ah.grh.as_mut() {
            g.hop_limit = opts.hop_limit;
        }
        self.to_rtr(&RtrAttr {
            path_mtu: mtu,
            dest_qpn: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: opts.max_dest_rd_atomic,
            min_rnr_timer: opts.min_rnr_timer,
            ah,
        })?;
        self.to_rts(&RtsAttr {
            timeout: opts.timeout,
            retry_cnt: opts.retry_cnt,
            rnr_retry: opts.rnr_retry,
            sq_psn: self.local_psn,
            max_rd_atomic: opts.max_rd_atomic,
        })
    }

    /// Connects two QPs of this process to each other (both through RESET->INIT->RTR->RTS),
    /// e.g. for a loopback benchmark or test; `local` is the port both use.
    ///
    /// # Example
    /// ```
    /// use hotverbs::*;
    /// let ctx = Context::open("softnic")?;
    /// let pd = ctx.alloc_pd()?;
    /// let cq = ctx.create_cq(64, None)?;
    /// let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
    /// let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
    /// Qp::connect_pair(&a, &b, &ctx.port_info(None, None)?, &ConnectOptions::default())?;
    /// assert_eq!(b.query()?.dest_qpn(), a.qp_num());
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    pub fn connect_pair(a: &Qp, b: &Qp, local: &PortInfo, opts: &ConnectOptions) -> Result<()> {
        a.connect(local, &b.endpoint(local), opts)?;
        b.connect(local, &a.endpoint(local), opts)
    }

    /// `ibv_attach_mcast(3)`: receive the multicast group `gid`/`lid` on this UD QP. The
    /// GID is `ff..` (InfiniBand, RoCE over IPv6) or, for RoCE v2 over IPv4, the group's
    /// IPv4-mapped address (`::ffff:239.1.2.3`); `lid` is 0 on RoCE.
    ///
    /// On RoCE this attaches the QP only: the host must also be a member of the IP group
    /// (a UDP socket's `join_multicast_v4` / `IP_ADD_MEMBERSHIP` on the port's interface)
    /// or the network, and on rxe the local stack, never hands it the group's datagrams
    /// (measured on rxe: nothing arrives without it).
    /// [`CmId::join_multicast`](crate::cm::CmId::join_multicast) does both.
    pub fn attach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        let f = self
            .pd
            .context()
            .fns()
            .ibv_attach_mcast
            .ok_or_else(|| Error::missing("ibv_attach_mcast"))?;
        let g = gid.to_raw();
        // SAFETY: live QP; g is a valid GID.
        let ret = unsafe { f(self.qp, &g, lid) };
        if ret != 0 {
            let ud = self.qp_type == QpType::Ud;
            return Err(Error::from_ret("ibv_attach_mcast", ret).or_hint(|| {
                (!ud)
                    .then(|| "only UD QPs can join multicast groups".into())
                    .or_else(|| {
                        (!is_multicast_gid(gid)).then(|| {
                            format!(
                                "{gid} is not a multicast GID (ff..:: or an IPv4-mapped \
                                 224.0.0.0/4 address)"
                            )
                        })
                    })
            }));
        }
        Ok(())
    }

    /// `ibv_detach_mcast(3)`.
    pub fn detach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        let f = self
            .pd
            .context()
            .fns()
            .ibv_detach_mcast
            .ok_or_else(|| Error::missing("ibv_detach_mcast"))?;
        let g = gid.to_raw();
        // SAFETY: live QP; g is a valid GID.
        let ret = unsafe { f(self.qp, &g, lid) };
        if ret != 0 {
            return Err(Error::from_ret("ibv_detach_mcast", ret)
                .or_hint(|| Some("the QP is not attached to this group?".into())));
        }
        Ok(())
    }

    /// `ibv_post_send(3)` of one work request (setup-side posting for tests, examples
    /// and warm-up; the hot path is the datapath crate). WRs whose payload is all inline
    /// ([`SendWr::send_inline`] and its kin) have a safe post:
    /// [`post_send_inline`](Self::post_send_inline).
    ///
    /// Checked before the provider sees the WR (each `EINVAL` with a hint): `INLINE` only on
    /// SEND, SEND_WITH_IMM, RDMA_WRITE and RDMA_WRITE_WITH_IMM (providers ignore it on
    /// READ and atomics and write the result into the SGE later, so an "inline" READ would
    /// not be done when the call returns); a UD QP needs [`SendWr::ud`] and only a UD QP
    /// takes one; the AH is of this QP's PD (a provider reads it as its own type).
    ///
    /// # Safety
    /// The memory every SGE describes must stay registered, valid and not be written
    /// (for sends/writes) or accessed at all (for reads/atomics, whose results land there)
    /// by Rust code until the WR's completion (possibly a flush completion) is polled or the
    /// QP has been reset or destroyed — except with [`SendWr::inline`] (SENDs and WRITEs
    /// only, checked), where the data is copied during the call. The same holds for the
    /// remote window on the peer's side. The AH of a UD WR is only read during the call.
    /// On a QP of a [`ParentDomain`](crate::ParentDomain) with a thread domain, the
    /// provider may not lock the send queue: no other post to this QP (this call, a ring,
    /// `ibv_wr_*` on [`as_qp_ex`](Self::as_qp_ex), [`post_send_inline`](Self::post_send_inline))
    /// may run at the same time. A post refused with the WR unnamed (rxe before RTS, the
    /// hint says so) may still run once the QP is in RTS: its memory stays in use until
    /// the QP is reset ([`connect`](Self::connect) from INIT then resets it first).
    ///
    /// # CQ capacity
    /// Completions of raw posts are not reserved on the CQ the way rings reserve theirs: keep
    /// them within the CQ's [`capacity`](Cq::capacity) minus
    /// [`reserved_by_rings`](Cq::reserved_by_rings). An overflow on rxe silently drops
    /// completions, possibly a ring's (fault-truth S15).
    pub unsafe fn post_send(&self, wr: &SendWr<'_>) -> Result<()> {
        self.check_send_wr("ibv_post_send", wr)?;
        // SAFETY: the memory of the WR's payload and remote window is the caller's contract.
        unsafe { self.post_send_wr(wr) }
    }

    /// `ibv_post_send(3)` of a WR whose payload is all inline ([`SendWr::send_inline`],
    /// [`SendWr::write_inline`], [`SendWr::ud_inline`], with `imm`, `signaled` and flags
    /// as for any WR), safe: the provider copies the bytes during the call
    /// (`IBV_SEND_INLINE`), so nothing is read after it returns, and an RDMA WRITE lands
    /// in the peer's memory, which the peer exposed with its remote access (an MR with
    /// `REMOTE_WRITE` is not handed out as a slice on either side).
    ///
    /// Setup-side posting, like [`post_send`](Self::post_send): the send queue must not be
    /// a ring's (a post beside a ring would take its slots, and a completion whose `wr_id`
    /// looks like the ring's would be taken for its own); a signaled WR's completion goes
    /// to the send CQ unreserved (see "CQ capacity" at [`post_send`](Self::post_send)),
    /// and an unsignaled one's slot is released only by a later signaled completion.
    ///
    /// # Example
    /// ```
    /// use hotverbs::*;
    /// let ctx = Context::open("softnic")?;
    /// let pd = ctx.alloc_pd()?;
    /// let (cqa, cqb) = (ctx.create_cq(16, None)?, ctx.create_cq(16, None)?);
    /// let a = QpBuilder::new(&pd, &cqa, &cqa, QpType::Rc).max_inline_data(64).build()?;
    /// let b = QpBuilder::new(&pd, &cqb, &cqb, QpType::Rc).build()?;
    /// let (port, opts) = (ctx.port_info(None, None)?, ConnectOptions::default());
    /// b.init(&port, &opts)?;
    /// let mut region = pd.alloc_mr(256, AccessFlags::LOCAL_WRITE)?;
    /// let mut rx = b.recv_ring::<4>(&mut region, 0, RecvConfig::new(0, 64, 4))?;
    /// rx.fill()?;
    /// Qp::connect_pair(&a, &b, &port, &opts)?;
    /// a.post_send_inline(&SendWr::send_inline(7, b"hello").signaled())?;
    /// assert_eq!(cqa.wait_one(std::time::Duration::from_secs(5))?.wr_id(), 7);
    /// let e = a.post_send_inline(&SendWr::send_inline(8, &[0; 65])).unwrap_err();
    /// assert!(e.to_string().contains("max_inline_data"), "{e}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `Qp::post_send_inline: EINVAL` for a WR with an SGE payload (post it with the unsafe
    /// `post_send`), more bytes than the QP's `max_inline_data`, or what `post_send`
    /// refuses before the provider (a UD WR on an RC QP, ...); `EBUSY` when the QP's send
    /// queue was handed to a ring (for the QP's life); `ibv_post_send` with the provider's
    /// errno and a hint naming the QP's state when it is the cause (`QP is in RESET:
    /// connect it first`).
    ///
    /// # References
    /// `ibv_post_send(3)`
    pub fn post_send_inline(&self, wr: &SendWr<'_>) -> Result<()> {
        const VERB: &str = "Qp::post_send_inline";
        let Payload::Inline(bytes) = wr.payload else {
            return Err(Error::new(VERB, libc::EINVAL).with_hint(
                "the WR gathers from registered memory (an Sge payload), which the NIC reads \
                 after the call returns: build it with SendWr::send_inline / write_inline / \
                 ud_inline, or post it with the unsafe Qp::post_send",
            ));
        };
        let max = self.cap.max_inline_data;
        if bytes.len() > max as usize {
            return Err(Error::new(VERB, libc::EINVAL).with_hint(format!(
                "{} inline bytes > the QP's max_inline_data {max}: build the QP with a larger \
                 QpBuilder::max_inline_data, or send from a registered buffer with the unsafe \
                 Qp::post_send (no safe call can: the NIC reads the buffer after the post \
                 returns, until the completion)",
                bytes.len()
            )));
        }
        if self.sq_taken().load(Ordering::Acquire) {
            return Err(Error::new(VERB, libc::EBUSY).with_hint(
                "this QP's send queue was handed to a ring (for the QP's life): post through \
                 the ring (send_now), whose completions and slots it accounts",
            ));
        }
        self.check_send_wr(VERB, wr)?;
        // Providers lock the send queue themselves, except in a thread domain.
        let _serial = self
            .thread_domain()
            .map(|_| self.post_lock.lock().unwrap_or_else(|e| e.into_inner()));
        // SAFETY: the payload is inline bytes only (Payload::Inline, made by the inline
        // constructors together with IBV_SEND_INLINE, which no setter clears) on a SEND or
        // RDMA WRITE (the only opcodes those constructors and `imm` make): the provider
        // copies them during the call and reads no local memory after it; a remote WRITE
        // target is the peer's exposed memory, never a live slice (MRs with remote access
        // are not handed out as slices); a UD WR's AH (of this PD, checked) is read during
        // the call only; the send queue is no ring's (checked), and in a thread domain the
        // lock keeps this post from racing another (the unsafe post_send's callers promise
        // not to post concurrently).
        unsafe { self.post_send_wr(wr) }
    }

    /// Builds `wr`'s `ibv_send_wr` and posts it; on a refusal, the error names the QP's
    /// state when it is the cause.
    ///
    /// # Safety
    /// As [`post_send`](Self::post_send) for the memory the WR's payload and remote window
    /// describe.
    unsafe fn post_send_wr(&self, wr: &SendWr<'_>) -> Result<()> {
        // SAFETY: the caller's contract, for a chain of one.
        unsafe { self.post_send_raw(std::slice::from_ref(wr)) }.map_err(|e| e.error)
    }

    /// Builds the chain's `ibv_send_wr`s, linked in order, and posts them in one call.
    ///
    /// # Safety
    /// As [`post_send`](Self::post_send), for every WR of `wrs`.
    unsafe fn post_send_raw(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), ChainError> {
        // Every SGE list is built before any pointer to one is taken.
        let mut sges: Vec<Vec<ibv_sge>> = wrs
            .iter()
            .map(|wr| match wr.payload {
                Payload::Sges(s) => s.iter().map(|&s| s.into()).collect(),
                Payload::Inline([]) => Vec::new(),
                Payload::Inline(b) => vec![ibv_sge {
                    addr: b.as_ptr() as u64,
                    length: b.len() as u32,
                    lkey: 0,
                }],
            })
            .collect();
        let mut raws: Vec<ibv_send_wr> = wrs
            .iter()
            .zip(&mut sges)
            .map(|(wr, sges)| raw_send_wr(wr, sges))
            .collect();
        let base = raws.as_mut_ptr();
        for i in 1..raws.len() {
            // SAFETY: `i` is in bounds; `raws` is not resized after this.
            raws[i - 1].next = unsafe { base.add(i) };
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // libmlx5 rings a thread domain's register unlocked and toggles its BlueFlame offset:
        // td.rs `Register`.
        let td = self.thread_domain();
        if let Some(td) = td {
            td.before_libmlx5_post("ibv_post_send")
                .map_err(|error| ChainError {
                    error,
                    first_rejected: Some(0),
                })?;
        }
        // SAFETY: live QP; the WRs and their SGE lists are valid for the call (`raws` and
        // `sges` live to its end, each `next` points into `raws`); the memory they describe
        // is the caller's contract.
        let ret = unsafe { hotverbs_ffi::inline::ibv_post_send(self.qp, base, &mut bad) };
        if ret == 0 {
            if let Some(td) = td {
                td.libmlx5_posted();
            }
            return Ok(());
        }
        // A non-null `bad` is one of the WRs the provider was given; anything else names
        // no WR of ours.
        let first_rejected = (!bad.is_null())
            .then(|| (bad as usize).wrapping_sub(base as usize) / size_of::<ibv_send_wr>())
            .filter(|&i| i < wrs.len() && base.wrapping_add(i) == bad);
        if let (Some(td), Some(1..)) = (td, first_rejected) {
            // The WRs before the refused one were posted: libmlx5 rang the register.
            td.libmlx5_posted();
        }
        if first_rejected.is_none() {
            self.sq_unnamed.store(true, Ordering::Relaxed);
        }
        let wr = &wrs[first_rejected.unwrap_or(0)];
        Err(ChainError {
            error: self.post_send_error(wr, ret, first_rejected.is_none()),
            first_rejected,
        })
    }

    /// `ibv_post_send(3)` of a chain of WRs in one call (one doorbell), in order.
    ///
    /// Each WR is checked as [`post_send`](Self::post_send) checks one before the provider
    /// sees any: a WR refused there is named by its index and nothing was posted. The
    /// provider may refuse a WR of the chain (`*bad_wr`): every WR before it was posted
    /// (and runs), none from it on; [`ChainError::first_rejected`] is its index. `None`
    /// there means the provider named none (rxe before RTS, fault-truth S1, returns EINVAL
    /// with `bad_wr` NULL and queues the whole chain anyway): any WR may still run, so all
    /// their memory stays in use until the QP is reset.
    ///
    /// # Safety
    /// As [`post_send`](Self::post_send), for every WR of `wrs`.
    ///
    /// # Example
    /// ```
    /// use hotverbs::*;
    /// let ctx = Context::open("softnic")?;
    /// let pd = ctx.alloc_pd()?;
    /// let (cqa, cqb) = (ctx.create_cq(16, None)?, ctx.create_cq(16, None)?);
    /// let a = QpBuilder::new(&pd, &cqa, &cqa, QpType::Rc).max_inline_data(16).build()?;
    /// let b = QpBuilder::new(&pd, &cqb, &cqb, QpType::Rc).build()?;
    /// let (port, opts) = (ctx.port_info(None, None)?, ConnectOptions::default());
    /// let target = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    /// Qp::connect_pair(&a, &b, &port, &opts)?;
    /// let remote = target.remote();
    /// let chain = [
    ///     SendWr::write_inline(1, b"first", remote),
    ///     SendWr::write_inline(2, &[7; 17], remote.slice(8, 17)?), // above max_inline_data
    ///     SendWr::write_inline(3, b"third", remote).signaled(),
    /// ];
    /// // SAFETY: inline payloads only; `target` outlives the WRs.
    /// let e = unsafe { a.post_send_chain(&chain) }.unwrap_err();
    /// assert_eq!(e.first_rejected, Some(1)); // WR 0 was posted, WRs 1 and 2 were not
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`ChainError`]: the [`Error`] (as [`post_send`](Self::post_send)'s, for the refused
    /// WR) and the index of the first WR not posted.
    ///
    /// # References
    /// `ibv_post_send(3)`
    pub unsafe fn post_send_chain(
        &self,
        wrs: &[SendWr<'_>],
    ) -> std::result::Result<(), ChainError> {
        const VERB: &str = "Qp::post_send_chain";
        if wrs.is_empty() {
            return Ok(());
        }
        for (i, wr) in wrs.iter().enumerate() {
            self.check_send_wr(VERB, wr).map_err(|error| ChainError {
                error,
                first_rejected: Some(i),
            })?;
        }
        // SAFETY: the caller's contract, for every WR.
        unsafe { self.post_send_raw(wrs) }
    }

    /// The error of a refused `ibv_post_send` of `wr`: the QP's state (queried now) when it
    /// explains the refusal, else the cap the WR exceeds, else a full queue.
    #[cold]
    fn post_send_error(&self, wr: &SendWr<'_>, ret: i32, unnamed: bool) -> Error {
        let cap = self.cap;
        let (len, n_sge) = match wr.payload {
            Payload::Sges(s) => (s.iter().map(|s| u64::from(s.length)).sum(), s.len()),
            Payload::Inline(b) => (b.len() as u64, usize::from(!b.is_empty())),
        };
        let hint = match self.state_for_hint().post_hint(true) {
            Some(h) => h.to_string(),
            None if wr.flags.contains(SendFlags::INLINE)
                && len > u64::from(cap.max_inline_data) =>
            {
                format!(
                    "{len} inline bytes > max_inline_data {}",
                    cap.max_inline_data
                )
            }
            None if n_sge > cap.max_send_sge as usize => {
                format!("{n_sge} SGEs > max_send_sge {}", cap.max_send_sge)
            }
            None => format!(
                "send queue full? (max_send_wr {}; poll completions: unsignaled WRs are \
                 released by a later signaled one)",
                cap.max_send_wr
            ),
        };
        let hint = if unnamed {
            format!(
                "{hint}; the provider did not name the WR (rxe queues a WR posted before RTS \
                 anyway): it may still run once the QP is in RTS, so its memory stays in use \
                 until the QP is reset (Qp::reset; connect resets first)"
            )
        } else {
            hint
        };
        Error::from_ret("ibv_post_send", ret).with_hint(hint)
    }

    fn check_send_wr(&self, verb: &'static str, wr: &SendWr<'_>) -> Result<()> {
        use hotverbs_ffi::{
            IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND, IBV_WR_SEND_WITH_IMM,
        };
        let bad = |hint: &'static str| Err(Error::new(verb, libc::EINVAL).with_hint(hint));
        let carries_data = matches!(
            wr.opcode,
            IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM
        );
        if wr.flags.contains(SendFlags::INLINE) && !carries_data {
            return bad(
                "INLINE applies to SEND and RDMA WRITE only: READ and atomic results \
                        land in the SGE after the call",
            );
        }
        match (wr.kind, self.qp_type) {
            (WrKind::Ud { ah, .. }, QpType::Ud)
                if ah.pd().protection_raw() != self.pd.protection_raw() =>
            {
                return bad("the address handle belongs to another PD than the QP")
            }
            (WrKind::Ud { .. }, QpType::Ud) => {}
            (WrKind::Ud { .. }, _) => return bad("an address handle is for UD QPs only"),
            (_, QpType::Ud) => {
                return bad("a UD QP needs SendWr::ud / ud_inline (address handle, QPN, Q_Key)")
            }
            _ => {}
        }
        Ok(())
    }

    /// `ibv_post_recv(3)` of one receive into `sges`.
    ///
    /// # Safety
    /// The memory the SGEs describe must stay registered and valid, and must not be
    /// accessed by Rust code, until the receive's completion is polled or the QP is
    /// flushed/destroyed. On a QP of a [`ParentDomain`](crate::ParentDomain) with a thread
    /// domain, no other receive post to this QP may run at the same time (the provider may
    /// not lock it).
    ///
    /// # CQ capacity
    /// As for [`post_send`](Self::post_send): raw receives' completions are not reserved
    /// on the receive CQ; keep them within [`Cq::reserved_by_rings`]'s remainder.
    pub unsafe fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        // SAFETY: live QP; the WR and its SGE list are valid for the call (post_one_recv);
        // the memory's validity is the caller's contract.
        let ret = unsafe {
            post_one_recv(wr_id, sges, |wr, bad| {
                hotverbs_ffi::inline::ibv_post_recv(self.qp, wr, bad)
            })
        };
        if ret != 0 {
            return Err(self.post_recv_error(ret));
        }
        Ok(())
    }

    /// The error of a refused `ibv_post_recv`: an SRQ, the QP's state (queried now) when it
    /// explains the refusal, else a full queue or too many SGEs.
    #[cold]
    fn post_recv_error(&self, ret: i32) -> Error {
        let cap = self.cap;
        let hint = if self.srq.is_some() {
            "this QP uses an SRQ: post receives to the SRQ".into()
        } else if let Some(h) = self.state_for_hint().post_hint(false) {
            h.to_string()
        } else {
            format!(
                "receive queue full (max_recv_wr {}) or too many SGEs (max {})",
                cap.max_recv_wr, cap.max_recv_sge
            )
        };
        Error::from_ret("ibv_post_recv", ret).with_hint(hint)
    }

    fn destroy_inner(&mut self) -> Result<()> {
        if !self.qp.is_null() && self.rq_direct.load(Ordering::Acquire) {
            // A direct poll reads this QP's receive WQEs and writes its leased slots: the
            // CQ is cleaned of it before its memory and leases go (crate::direct).
            let qpn = self.qp_num();
            self.recv_cq.inner.rings.defer_clean_and_wait(qpn);
        }
        let qp = std::mem::replace(&mut self.qp, std::ptr::null_mut());
        if qp.is_null() {
            return Ok(());
        }
        match self.destroy {
            QpDestroy::Verbs => {
                let f = self
                    .pd
                    .context()
                    .fns()
                    .ibv_destroy_qp
                    .ok_or_else(|| Error::missing("ibv_destroy_qp"))?;
                // SAFETY: qp came from this table and is destroyed once.
                let ret = unsafe { f(qp) };
                if ret != 0 {
                    // The QP may live on with its receives: its leases stay held for good.
                    return Err(Error::from_ret("ibv_destroy_qp", ret));
                }
            }
            QpDestroy::RdmaCm { id, destroy_qp } => {
                // SAFETY: the QP was made by rdma_create_qp on `id`, which outlives it (the
                // CmId destroys its QP before itself), and is destroyed once.
                unsafe { destroy_qp(id) };
            }
        }
        self.release_leases();
        if let Some(srq) = &self.srq {
            srq.detach(self.recv_cq.as_raw());
        }
        let reservations =
            std::mem::take(&mut *self.reservations.lock().unwrap_or_else(|e| e.into_inner()));
        for r in reservations {
            r.release();
        }
        Ok(())
    }

    /// Created with `sq_sig_all`?
    pub(crate) fn sq_sig_all(&self) -> bool {
        self.sq_sig_all
    }

    /// The send queue's "handed out" flag (the bridge).
    pub(crate) fn sq_taken(&self) -> &AtomicBool {
        &self.sq_taken
    }

    /// The receive queue's "handed out" flag (the bridge).
    pub(crate) fn rq_taken(&self) -> &AtomicBool {
        &self.rq_taken
    }

    /// Keeps a bridge ring's claim on a CQ until the QP is destroyed.
    pub(crate) fn keep_reservation(&self, r: crate::bridge::RingReservation) {
        self.reservations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(r);
    }

    fn release_leases(&self) {
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        for l in leases.drain(..) {
            l.release();
        }
    }

    /// A receive SGE over `[offset, offset + len)` of `mr` for receives posted to this QP
    /// (e.g. the region of a datapath `RecvRing`), leasing `mr` to the QP: from now until
    /// the QP is reset ([`reset`](Self::reset) or a raw `modify` to RESET) or destroyed,
    /// [`Mr::as_slice`]/[`Mr::as_mut_slice`] refuse it (`EBUSY`), because posted receives
    /// stay posted whatever happens to the code that posted them — a dropped receive ring
    /// does not take them back, and the NIC writes the next incoming message there. A ring
    /// that is still alive after the reset may post into the region again: reset (or drop)
    /// it before reading the region through a slice.
    ///
    /// # Example
    /// ```
    /// use hotverbs::{AccessFlags, Context, QpBuilder, QpType};
    /// let ctx = Context::open("softnic")?;
    /// let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(16, None)?);
    /// let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
    /// let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
    /// let sge = qp.lease_recv(&mr, 0, 4096)?; // post receives into it, e.g. a RecvRing
    /// assert!(mr.as_slice().is_err());
    /// qp.reset()?; // the receives are gone
    /// assert!(mr.as_slice().is_ok());
    /// # let _ = sge;
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    ///
    /// # Errors
    /// `Qp::lease_recv: EINVAL` when the QP uses an SRQ (lease from the SRQ), `mr` lacks
    /// `LOCAL_WRITE`, is in another PD, or the range is outside it.
    pub fn lease_recv(&self, mr: &Mr<'_>, offset: usize, len: usize) -> Result<Sge> {
        if self.srq.is_some() {
            return Err(Error::new("Qp::lease_recv", libc::EINVAL)
                .with_hint("this QP uses an SRQ: lease the region with Srq::lease_recv"));
        }
        let (sge, lease) = mr.lease("Qp::lease_recv", &self.pd, offset, len)?;
        self.leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(lease);
        Ok(sge)
    }

    /// `ibv_destroy_qp(3)` now, returning its error.
    pub fn destroy(mut self) -> Result<()> {
        self.destroy_inner()
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        if let Err(e) = self.destroy_inner() {
            record_drop_error(e);
        }
    }
}

/// The kind of ring that owns a QP's send queue (for the messages that name it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum SqOwner {
    Send = 1,
    Wr = 2,
    Direct = 3,
}

impl SqOwner {
    fn from_u8(v: u8) -> Option<SqOwner> {
        match v {
            1 => Some(SqOwner::Send),
            2 => Some(SqOwner::Wr),
            3 => Some(SqOwner::Direct),
            _ => None,
        }
    }

    /// The ring type's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SqOwner::Send => "SendRing",
            SqOwner::Wr => "WrRing",
            SqOwner::Direct => "DirectRing",
        }
    }
}

/// How a [`Qp`] is destroyed.
#[derive(Clone, Copy)]
pub(crate) enum QpDestroy {
    /// `ibv_destroy_qp(3)`.
    Verbs,
    /// `rdma_destroy_qp(3)` on the ID that made it (it returns nothing).
    RdmaCm {
        id: *mut hotverbs_ffi::rdma_cm_id,
        destroy_qp: unsafe extern "C" fn(*mut hotverbs_ffi::rdma_cm_id),
    },
}

/// A multicast GID: `ff..` (IB / IPv6) or an IPv4-mapped multicast address (RoCE v2).
fn is_multicast_gid(gid: &Gid) -> bool {
    gid.0[0] == 0xff || gid.ipv4().is_some_and(|a| a[0] & 0xf0 == 0xe0)
}

/// The `ibv_send_wr` of `wr`, gathering from `sges` (which must outlive its use).
fn raw_send_wr(wr: &SendWr<'_>, sges: &mut [ibv_sge]) -> ibv_send_wr {
    // SAFETY: plain C data.
    let mut raw: ibv_send_wr = unsafe { zeroed() };
    raw.wr_id = wr.wr_id;
    raw.sg_list = sges.as_mut_ptr();
    raw.num_sge = sges.len() as i32;
    raw.opcode = wr.opcode;
    raw.send_flags = wr.flags.bits();
    if let Some(imm) = wr.imm {
        raw.__bindgen_anon_1.imm_data = imm.to_be();
    }
    match wr.kind {
        WrKind::Plain => {}
        WrKind::Rdma(r) => {
            raw.wr.rdma.remote_addr = r.addr;
            raw.wr.rdma.rkey = r.rkey;
        }
        WrKind::Atomic {
            remote,
            compare_add,
            swap,
        } => {
            raw.wr.atomic.remote_addr = remote.addr;
            raw.wr.atomic.rkey = remote.rkey;
            raw.wr.atomic.compare_add = compare_add;
            raw.wr.atomic.swap = swap;
        }
        WrKind::Ud { ah, qpn, qkey } => {
            raw.wr.ud.ah = ah.as_raw();
            raw.wr.ud.remote_qpn = qpn;
            raw.wr.ud.remote_qkey = qkey;
        }
    }
    raw
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_ops_are_named_with_the_device_and_type() {
        assert_eq!(
            refused_ops_hint(SendOps::RDMA_WRITE_WITH_IMM, "softnic", "UD"),
            "send op RDMA_WRITE_WITH_IMM is not supported by device softnic for UD QPs: \
             leave it out of the SendOps"
        );
        assert_eq!(
            refused_ops_hint(SendOps::RDMA_READ | SendOps::TSO, "rxe0", "RC"),
            "send ops RDMA_READ, TSO are not supported by device rxe0 for RC QPs: leave \
             them out of the SendOps"
        );
    }

    #[test]
    fn extended_mode_is_refused_on_the_rdma_cm_path() {
        unsafe extern "C" fn never(_: *mut hotverbs_ffi::rdma_cm_id) {
            unreachable!("no QP is made")
        }
        let ctx = crate::Context::open_softnic().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(4, None).unwrap();
        let destroy = QpDestroy::RdmaCm {
            id: std::ptr::null_mut(),
            destroy_qp: never,
        };
        let e = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
            .send_ops(SendOps::SEND)
            .build_with("rdma_create_qp", destroy, |_, _| {
                unreachable!("refused before the verb")
            })
            .unwrap_err();
        assert_eq!((e.verb(), e.errno()), ("rdma_create_qp", libc::EINVAL));
        assert!(e.to_string().contains("QpBuilder::send_ops"), "{e}");
    }

    #[test]
    fn send_ops_mirror_the_header() {
        assert_eq!(
            SendOps::SEND.bits(),
            u64::from(hotverbs_ffi::IBV_QP_EX_WITH_SEND)
        );
        assert_eq!(
            SendOps::ATOMIC_WRITE.bits(),
            u64::from(hotverbs_ffi::IBV_QP_EX_WITH_ATOMIC_WRITE)
        );
        assert_eq!(SendOps::all().iter().count(), 12);
    }
}
