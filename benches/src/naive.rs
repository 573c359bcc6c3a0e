//! The baseline: how most RDMA crates and examples drive a QP.
//!
//! Per message it builds a fresh `ibv_send_wr` and `ibv_sge` on the stack, signals every WR,
//! posts it alone through `ibv_post_send`, and reaps completions with `ibv_poll_cq` asking for
//! one CQE per call. It is not a straw man: it keeps a window of `depth` WRs in flight and
//! polls only when the window is full (steady state: one post and one successful poll per
//! message), as a careful user of a thin wrapper would.
//!
//! # Safety (whole module)
//! The QP and CQ pointers handed to [`NaivePoster::new`] must stay live objects of an open
//! device for the poster's lifetime, the QP's send queue must report its completions to that
//! CQ, and the QP must be able to hold `depth` outstanding WRs.

use core::ptr;

use hotverbs_ffi::inline::{ibv_poll_cq, ibv_post_recv, ibv_post_send};
use hotverbs_ffi::{
    ibv_cq, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc, IBV_SEND_INLINE, IBV_SEND_SIGNALED,
    IBV_WC_SUCCESS, IBV_WR_RDMA_WRITE, IBV_WR_SEND,
};

/// A failure of the baseline (a benchmark stops on it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NaiveError {
    /// `ibv_post_send` returned this errno.
    Post(i32),
    /// `ibv_poll_cq` returned a negative value.
    Poll(i32),
    /// A completion had this `ibv_wc_status`.
    Completion(u32),
}

impl core::fmt::Display for NaiveError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            NaiveError::Post(e) => write!(
                f,
                "ibv_post_send failed: {} (is the QP in RTS and the window within its depth?)",
                hotverbs_ffi::errno_name(e)
            ),
            NaiveError::Poll(e) => write!(f, "ibv_poll_cq failed: {e} (is the CQ live?)"),
            NaiveError::Completion(s) => write!(
                f,
                "completion with {} (the QP is in error; see ibv_poll_cq(3))",
                hotverbs_ffi::wc_status_name(s)
            ),
        }
    }
}

impl std::error::Error for NaiveError {}

/// One signaled, inline SEND (or RDMA WRITE) per post; one CQE per poll.
pub struct NaivePoster {
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
    depth: u32,
    outstanding: u32,
    next_id: u64,
    /// `Some((remote_addr, rkey))`: RDMA WRITEs there instead of SENDs.
    write_to: Option<(u64, u32)>,
}

impl NaivePoster {
    /// A poster over `qp` (send completions on `cq`) keeping at most `depth` WRs in flight.
    ///
    /// # Safety
    /// See the module's safety section.
    pub unsafe fn new(qp: *mut ibv_qp, cq: *mut ibv_cq, depth: u32) -> Self {
        NaivePoster {
            qp,
            cq,
            depth: depth.max(1),
            outstanding: 0,
            next_id: 0,
            write_to: None,
        }
    }

    /// Posts RDMA WRITEs to `remote_addr` under `rkey` instead of SENDs.
    pub fn writes_to(mut self, remote_addr: u64, rkey: u32) -> Self {
        self.write_to = Some((remote_addr, rkey));
        self
    }

    /// WRs posted and not yet completed.
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }

    /// Posts one inline SEND (or WRITE) of `msg`, signaled, alone.
    pub fn post(&mut self, msg: &[u8]) -> Result<(), NaiveError> {
        while self.outstanding >= self.depth {
            self.reap_one()?;
        }
        let mut sge = ibv_sge {
            addr: msg.as_ptr() as u64,
            length: msg.len() as u32,
            lkey: 0,
        };
        // SAFETY: ibv_send_wr is a plain C struct for which all-zero is a valid value.
        let mut wr: ibv_send_wr = unsafe { core::mem::zeroed() };
        wr.wr_id = self.next_id;
        wr.next = ptr::null_mut();
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        if let Some((remote_addr, rkey)) = self.write_to {
            wr.opcode = IBV_WR_RDMA_WRITE;
            wr.wr.rdma.remote_addr = remote_addr;
            wr.wr.rdma.rkey = rkey;
        }
        wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
        let mut bad = ptr::null_mut();
        // SAFETY: the module contract makes qp live; wr and sge live on this stack frame for
        // the call, and the payload is inline so msg is not referenced after it returns.
        let rc = unsafe { ibv_post_send(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(NaiveError::Post(rc));
        }
        self.next_id += 1;
        self.outstanding += 1;
        Ok(())
    }

    /// Polls (one CQE per `ibv_poll_cq` call) until one completion arrives.
    pub fn reap_one(&mut self) -> Result<(), NaiveError> {
        // SAFETY: ibv_wc is a plain C struct for which all-zero is a valid value.
        let mut wc: ibv_wc = unsafe { core::mem::zeroed() };
        loop {
            // SAFETY: the module contract makes cq live; wc has room for one entry.
            let n = unsafe { ibv_poll_cq(self.cq, 1, &mut wc) };
            if n < 0 {
                return Err(NaiveError::Poll(n));
            }
            if n == 1 {
                if wc.status != IBV_WC_SUCCESS {
                    return Err(NaiveError::Completion(wc.status));
                }
                self.outstanding -= 1;
                return Ok(());
            }
            core::hint::spin_loop();
        }
    }

    /// Reaps every outstanding completion.
    pub fn drain(&mut self) -> Result<(), NaiveError> {
        while self.outstanding > 0 {
            self.reap_one()?;
        }
        Ok(())
    }

    /// The streaming loop: posts `n` messages and reaps every completion. Returns `n`.
    pub fn stream(&mut self, msg: &[u8], n: u64) -> Result<u64, NaiveError> {
        for _ in 0..n {
            self.post(msg)?;
        }
        self.drain()?;
        Ok(n)
    }
}

/// Builds a fresh WR and SGE on the stack for one inline SEND (or RDMA WRITE to
/// `write_to`) of `msg`, signaled, and posts it alone: [`NaivePoster::post`]'s WR (which
/// keeps its own copy, so its rows' code stays as measured).
///
/// # Safety
/// `qp` is a live QP in RTS.
#[inline(always)]
unsafe fn post_fresh(
    qp: *mut ibv_qp,
    msg: &[u8],
    wr_id: u64,
    write_to: Option<(u64, u32)>,
) -> Result<(), NaiveError> {
    let mut sge = ibv_sge {
        addr: msg.as_ptr() as u64,
        length: msg.len() as u32,
        lkey: 0,
    };
    // SAFETY: ibv_send_wr is a plain C struct for which all-zero is a valid value.
    let mut wr: ibv_send_wr = unsafe { core::mem::zeroed() };
    wr.wr_id = wr_id;
    wr.next = ptr::null_mut();
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    if let Some((remote_addr, rkey)) = write_to {
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.wr.rdma.remote_addr = remote_addr;
        wr.wr.rdma.rkey = rkey;
    }
    wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    let mut bad = ptr::null_mut();
    // SAFETY: qp is live (caller); wr and sge live on this stack frame for the call, and the
    // payload is inline so msg is not referenced after it returns.
    let rc = unsafe { ibv_post_send(qp, &mut wr, &mut bad) };
    if rc != 0 {
        return Err(NaiveError::Post(rc));
    }
    Ok(())
}

/// [`NaivePoster`] over several QPs whose send completions share one CQ: per message a
/// fresh WR, signaled, posted alone on the next QP in turn (its `wr_id` is the QP's index),
/// at most `depth` WRs in flight per QP; when the next QP's window is full it reaps one CQE
/// per `ibv_poll_cq` call, each counted against the QP its `wr_id` names, until the window
/// has room. Steady state: one post and one successful poll per message, as for one QP.
pub struct NaiveFan {
    /// Per QP: the QP and its WRs in flight.
    qps: Vec<(*mut ibv_qp, u32)>,
    cq: *mut ibv_cq,
    depth: u32,
    /// Sum of the per-QP counts.
    outstanding: u64,
    /// `Some((remote_addr, rkey))`: RDMA WRITEs there instead of SENDs.
    write_to: Option<(u64, u32)>,
}

impl NaiveFan {
    /// A poster over `qps`, all reporting send completions to `cq`, keeping at most `depth`
    /// WRs in flight on each.
    ///
    /// # Safety
    /// See the module's safety section (for every QP), and `cq` holds
    /// `qps.len() * depth` completions.
    pub unsafe fn new(qps: &[*mut ibv_qp], cq: *mut ibv_cq, depth: u32) -> Self {
        NaiveFan {
            qps: qps.iter().map(|&q| (q, 0)).collect(),
            cq,
            depth: depth.max(1),
            outstanding: 0,
            write_to: None,
        }
    }

    /// Posts RDMA WRITEs to `remote_addr` under `rkey` instead of SENDs.
    pub fn writes_to(mut self, remote_addr: u64, rkey: u32) -> Self {
        self.write_to = Some((remote_addr, rkey));
        self
    }

    /// WRs posted and not yet completed, over all QPs.
    pub fn outstanding(&self) -> u64 {
        self.outstanding
    }

    /// Polls (one CQE per `ibv_poll_cq` call) until one completion arrives, and counts it
    /// against the QP its `wr_id` names.
    pub fn reap_one(&mut self) -> Result<(), NaiveError> {
        // SAFETY: ibv_wc is a plain C struct for which all-zero is a valid value.
        let mut wc: ibv_wc = unsafe { core::mem::zeroed() };
        loop {
            // SAFETY: the module contract makes cq live; wc has room for one entry.
            let n = unsafe { ibv_poll_cq(self.cq, 1, &mut wc) };
            if n < 0 {
                return Err(NaiveError::Poll(n));
            }
            if n == 1 {
                if wc.status != IBV_WC_SUCCESS {
                    return Err(NaiveError::Completion(wc.status));
                }
                // Indexing panics on a wr_id no QP of this poster posted (a bug).
                self.qps[wc.wr_id as usize].1 -= 1;
                self.outstanding -= 1;
                return Ok(());
            }
            core::hint::spin_loop();
        }
    }

    /// The streaming loop: posts `n` messages round-robin over the QPs (starting with the
    /// first) and reaps every completion. Returns `n`.
    pub fn stream(&mut self, msg: &[u8], n: u64) -> Result<u64, NaiveError> {
        let mut i = 0;
        for _ in 0..n {
            while self.qps[i].1 >= self.depth {
                self.reap_one()?;
            }
            // SAFETY: the module contract makes every QP live.
            unsafe { post_fresh(self.qps[i].0, msg, i as u64, self.write_to) }?;
            self.qps[i].1 += 1;
            self.outstanding += 1;
            i += 1;
            if i == self.qps.len() {
                i = 0;
            }
        }
        while self.outstanding > 0 {
            self.reap_one()?;
        }
        Ok(n)
    }
}

/// The naive ping-pong steps: a fresh WR per call, one CQE per poll.
///
/// # Safety
/// `qp` is a live QP in RTS; `msg` is sent inline.
pub unsafe fn post_send_inline(qp: *mut ibv_qp, msg: &[u8], wr_id: u64) -> Result<(), NaiveError> {
    let mut sge = ibv_sge {
        addr: msg.as_ptr() as u64,
        length: msg.len() as u32,
        lkey: 0,
    };
    // SAFETY: plain C struct, all-zero is valid.
    let mut wr: ibv_send_wr = unsafe { core::mem::zeroed() };
    wr.wr_id = wr_id;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    let mut bad = ptr::null_mut();
    // SAFETY: qp is live (caller); wr and sge live for the call; the payload is inline.
    match unsafe { ibv_post_send(qp, &mut wr, &mut bad) } {
        0 => Ok(()),
        e => Err(NaiveError::Post(e)),
    }
}

/// Posts one receive of `len` bytes at `addr` (lkey `lkey`).
///
/// # Safety
/// `qp` is a live QP (INIT or later); the buffer is registered with local write and stays
/// valid and unread until the receive completes.
pub unsafe fn post_recv(
    qp: *mut ibv_qp,
    addr: u64,
    len: u32,
    lkey: u32,
    wr_id: u64,
) -> Result<(), NaiveError> {
    let mut sge = ibv_sge {
        addr,
        length: len,
        lkey,
    };
    // SAFETY: plain C struct, all-zero is valid.
    let mut wr: ibv_recv_wr = unsafe { core::mem::zeroed() };
    wr.wr_id = wr_id;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    let mut bad = ptr::null_mut();
    // SAFETY: qp is live (caller); wr and sge live for the call.
    match unsafe { ibv_post_recv(qp, &mut wr, &mut bad) } {
        0 => Ok(()),
        e => Err(NaiveError::Post(e)),
    }
}

/// One `ibv_poll_cq(cq, 1, ..)`.
///
/// # Safety
/// `cq` is a live CQ.
pub unsafe fn poll_one(cq: *mut ibv_cq) -> Result<Option<ibv_wc>, NaiveError> {
    // SAFETY: plain C struct, all-zero is valid.
    let mut wc: ibv_wc = unsafe { core::mem::zeroed() };
    // SAFETY: cq is live (caller); wc has room for one entry.
    match unsafe { ibv_poll_cq(cq, 1, &mut wc) } {
        0 => Ok(None),
        1 if wc.status == IBV_WC_SUCCESS => Ok(Some(wc)),
        1 => Err(NaiveError::Completion(wc.status)),
        n => Err(NaiveError::Poll(n)),
    }
}
