//! The process-wide state of every softnic device and the work-request engine.
//!
//! One [`Fabric`] behind one mutex holds every object of every softnic context; the ABI
//! structs handed to the application carry the object's slab index in their `handle` field
//! (contexts and completion channels, which have none, are wrapped in `#[repr(C)]` structs
//! whose first field is the ABI struct). Work is executed synchronously inside `post_send`
//! under that lock, so a QP delivers straight into its peer's receive queue and no second
//! lock order exists. The only shared user memory access goes through [`crate::mem`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use hotverbs_ffi::*;

use crate::mem::{self, Seg};

mod dv;
use crate::Config;
pub(crate) use dv::DV_QPS;

/// First QP number handed out (rxe starts at 17; QPNs 0 and 1 are special in IB).
pub(crate) const QPN_BASE: u32 = 17;
/// The multicast QPN of the IBA (`0xFFFFFF`).
pub(crate) const MCAST_QPN: u32 = 0x00ff_ffff;

/// A multicast GID: `ff..` (InfiniBand, RoCE over IPv6) or the IPv4-mapped address of an
/// IPv4 multicast group (`::ffff:224.0.0.0/100`, RoCE v2 over IPv4: what rxe attaches and
/// what rdma_cm's joins return).
pub(crate) fn is_mcast_gid(g: &[u8; 16]) -> bool {
    g[0] == 0xff || (g[..10] == [0; 10] && g[10..12] == [0xff; 2] && g[12] & 0xf0 == 0xe0)
}
/// Size of the GRH area at the start of every UD receive buffer.
pub(crate) const GRH_LEN: usize = 40;
/// Active path MTU of the port (rxe on a 1500-byte netdev: 1024).
pub(crate) const ACTIVE_MTU: usize = 1024;
/// Number of GID table entries reported by the port.
pub(crate) const GID_TBL_LEN: u32 = 16;
/// `accept_send`'s answer for a WR the Rxe profile queued on a QP before RTS (rxe S1): not
/// an errno, so the hot path tells it apart without a test of its own.
const QUEUED_BEFORE_RTS: i32 = -1;
/// The opcode an RDMA READ posted with IBV_SEND_INLINE gets in the Rxe profile (rxe S5: it
/// fails at execution); no real opcode, so it takes the invalid-opcode path.
const RXE_INLINE_READ: ibv_wr_opcode = 0x8000_0000 | IBV_WR_RDMA_READ;
/// Or'ed into the opcode of a WR built with `ibv_wr_set_inline_data(_list)` without
/// IBV_SEND_INLINE in `wr_flags`, in the Rxe profile: no real opcode, so it takes the
/// invalid-opcode path (LOC_QP_OP_ERR, the QP to ERR), as rxe does with such a WQE.
pub(crate) const RXE_INLINE_NO_FLAG: ibv_wr_opcode = 0x4000_0000;
/// `poll_cq` return value after a CQ overflow (negative, as `ibv_poll_cq(3)` says for errors).
pub(crate) const POLL_CQ_OVERFLOW: i32 = -libc::EOVERFLOW;

/// A raw pointer that may cross threads: it is only dereferenced under the fabric lock or
/// by the application that owns the object.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ptr<T>(pub(crate) *mut T);
// SAFETY: the pointee is an ABI struct owned by softnic; all softnic accesses happen under
// the fabric mutex.
unsafe impl<T> Send for Ptr<T> {}

/// A context as allocated by softnic: an extended `verbs_context` (whose last field is the
/// `ibv_context` handed to the application, as libibverbs lays it out), then our index.
#[repr(C)]
pub(crate) struct SoftContext {
    pub(crate) vctx: verbs_context,
    pub(crate) idx: u32,
}

/// A CQ as allocated by softnic: the extended ABI struct first (an `ibv_cq_ex` starts with
/// the `ibv_cq` fields, so every CQ is also a plain `ibv_cq`), then the number of
/// completions ready to poll, so polling an empty CQ takes no lock (`u32::MAX` after an
/// overflow), then the completion an extended poll is looking at.
#[repr(C)]
pub(crate) struct SoftCq {
    pub(crate) ibv: ibv_cq_ex,
    pub(crate) ready: AtomicU32,
    /// The completion between `start_poll`/`next_poll` and the next of them: written and
    /// read only by the thread polling the CQ (`ibv_create_cq_ex(3)`: one poller at a time).
    pub(crate) cur: core::cell::UnsafeCell<CurWc>,
}

/// The completion an extended CQ's `read_*` functions return.
#[derive(Clone, Copy, Default)]
pub(crate) struct CurWc {
    pub(crate) wc: ibv_wc,
    /// Completion time in HCA clock cycles ([`crate::ex::raw_clock`]).
    pub(crate) ts: u64,
    /// Completion time as `CLOCK_REALTIME` nanoseconds.
    pub(crate) wall: u64,
}

/// A completion channel as allocated by softnic.
#[repr(C)]
pub(crate) struct SoftChannel {
    pub(crate) ibv: ibv_comp_channel,
    pub(crate) idx: u32,
}

pub(crate) struct Device {
    pub(crate) config: Config,
    pub(crate) ibv: Ptr<ibv_device>,
    pub(crate) guid: u64,
    pub(crate) ipv4: [u8; 4],
    /// The default device is never freed; extra devices belong to one context.
    pub(crate) owned_by_ctx: bool,
}

impl Device {
    pub(crate) fn gid(&self, index: u32) -> Option<[u8; 16]> {
        let mut g = [0u8; 16];
        match index {
            0 => {
                g[0] = 0xfe;
                g[1] = 0x80;
                g[8..].copy_from_slice(&self.guid.to_be_bytes());
            }
            1 => {
                g[10] = 0xff;
                g[11] = 0xff;
                g[12..].copy_from_slice(&self.ipv4);
            }
            _ => return None,
        }
        Some(g)
    }
}

pub(crate) struct Ctx {
    pub(crate) dev: u32,
    pub(crate) ptr: Ptr<SoftContext>,
    pub(crate) async_q: VecDeque<(ibv_event_type, usize)>,
    pub(crate) async_wr: i32,
    pub(crate) objects: u32,
    pub(crate) qps: u32,
}

pub(crate) struct Pd {
    pub(crate) ctx: u32,
    pub(crate) users: u32,
    pub(crate) ptr: Ptr<ibv_pd>,
    /// The protection domain keys are checked against: this PD's own index, or for a
    /// parent domain the index of the PD it wraps (`ibv_alloc_parent_domain(3)`).
    pub(crate) prot: u32,
    /// A parent domain: its thread domain (if any); `None` for a plain PD.
    pub(crate) parent: Option<Option<u32>>,
}

pub(crate) struct Mr {
    pub(crate) pd: u32,
    /// The protection domain of `pd` ([`Pd::prot`]).
    pub(crate) prot: u32,
    pub(crate) addr: usize,
    pub(crate) iova: u64,
    pub(crate) len: u64,
    pub(crate) access: u32,
    pub(crate) key: u32,
    pub(crate) ptr: Ptr<ibv_mr>,
}

pub(crate) struct Cq {
    pub(crate) ctx: u32,
    pub(crate) ring: VecDeque<(ibv_wc, SqTag)>,
    pub(crate) cap: usize,
    /// Completions accepted before an overflow: `cap`, or 0 while `inject_overflow` > 0
    /// ([`Cq::set_limit`]).
    pub(crate) limit: usize,
    pub(crate) overflowed: bool,
    /// The device follows the Rxe profile (cached at creation: a cheap field read).
    pub(crate) rxe: bool,
    /// Completions still to be treated as overflowing ([`crate::inject_cq_overflow`]).
    pub(crate) inject_overflow: u32,
    /// An extended CQ created with a completion timestamp flag: every completion records
    /// the clocks when it is generated (no clock is read for other CQs).
    pub(crate) stamps: bool,
    /// The parent domain the CQ was created with (`IBV_CQ_INIT_ATTR_MASK_PD`), which it
    /// keeps busy until destroyed.
    pub(crate) parent_pd: Option<u32>,
    /// `Some(solicited_only)` while armed by `req_notify_cq`.
    pub(crate) armed: Option<bool>,
    pub(crate) channel: Option<u32>,
    pub(crate) users: u32,
    /// Completion events handed out for this CQ by `get_cq_event` (wrapping): destroy_cq
    /// waits until `ibv_cq.comp_events_completed` (bumped by `ack_cq_events`) reaches it.
    pub(crate) events_reported: u32,
    pub(crate) ptr: Ptr<SoftCq>,
    /// The mlx5 personality's CQ buffer, once `mlx5dv_init_obj` described the CQ: every
    /// completion goes there ([`dv`]).
    pub(crate) dv: Option<Box<dv::DvCq>>,
}

/// Which SQ slots a send-side completion covers: polling it releases every slot of QP `qp`
/// (in reset epoch `epoch`) up to and including WR `seq`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SqTag {
    qp: u32,
    epoch: u32,
    seq: u64,
    /// Completion time in HCA clock cycles, on a CQ that asked for timestamps (else 0).
    pub(crate) ts: u64,
    /// Completion time in `CLOCK_REALTIME` ns, on a CQ that asked for it (else 0).
    pub(crate) wall: u64,
}

impl SqTag {
    const NONE: SqTag = SqTag {
        qp: u32::MAX,
        epoch: 0,
        seq: 0,
        ts: 0,
        wall: 0,
    };
}

/// A thread domain (`ibv_alloc_td(3)`).
pub(crate) struct Td {
    pub(crate) ctx: u32,
    /// Parent domains using it.
    pub(crate) users: u32,
    pub(crate) ptr: Ptr<crate::ex::SoftTd>,
}

pub(crate) struct Channel {
    pub(crate) ctx: u32,
    pub(crate) wr: i32,
    pub(crate) events: VecDeque<u32>,
    pub(crate) users: u32,
    pub(crate) ptr: Ptr<SoftChannel>,
}

pub(crate) struct Ah {
    pub(crate) pd: u32,
    /// The protection domain of `pd` ([`Pd::prot`]).
    pub(crate) prot: u32,
    pub(crate) attr: ibv_ah_attr,
    pub(crate) ptr: Ptr<ibv_ah>,
    /// The mlx5 personality's address vector, once `mlx5dv_init_obj` described the AH.
    pub(crate) dv_av: Option<crate::mlx5sim::Region>,
}

#[derive(Default)]
pub(crate) struct RecvEntry {
    pub(crate) wr_id: u64,
    pub(crate) sges: Vec<ibv_sge>,
    /// Read from the mlx5 personality's receive queue in memory (`wr_id` is then the WQE
    /// counter): its message may be scattered into the CQE ([`dv`]).
    pub(crate) dv: bool,
}

/// A receive queue (of a QP or an SRQ); entries are recycled so steady-state posting does
/// not allocate.
#[derive(Default)]
pub(crate) struct RecvQueue {
    pub(crate) q: VecDeque<RecvEntry>,
    pub(crate) spare: Vec<RecvEntry>,
    pub(crate) cap: u32,
    pub(crate) max_sge: u32,
}

/// Work requests per queue that softnic provisions when the queue is created: the entries
/// (with room for the queue's SGE count and inline size) and the lists that hold them, so
/// posting and polling never allocate in the steady state. Deeper queues work the same but
/// grow past this on first use (a 4096-deep queue costs about 200 KiB up front).
pub(crate) const PREALLOC_WRS: usize = 4096;

impl RecvQueue {
    fn new(cap: u32, max_sge: u32) -> Self {
        let mut rq = RecvQueue {
            q: VecDeque::new(),
            spare: Vec::new(),
            cap,
            max_sge,
        };
        rq.provision();
        rq
    }

    /// Sizes the queue and its spare entries for `cap` receives (up to [`PREALLOC_WRS`]).
    pub(crate) fn provision(&mut self) {
        let n = (self.cap as usize).min(PREALLOC_WRS);
        self.q.reserve(n.saturating_sub(self.q.len()));
        let have = self.q.len() + self.spare.len();
        self.spare.reserve(n.saturating_sub(self.spare.len()));
        for _ in have..n {
            self.spare.push(RecvEntry {
                wr_id: 0,
                dv: false,
                sges: Vec::with_capacity(self.max_sge.max(1) as usize),
            });
        }
    }

    fn clear(&mut self) {
        while let Some(e) = self.q.pop_front() {
            self.spare.push(e);
        }
    }

    /// Validates and appends one receive WR.
    ///
    /// # Safety
    /// `wr` is a valid `ibv_recv_wr` whose `sg_list` holds `num_sge` entries.
    unsafe fn push(&mut self, wr: &ibv_recv_wr) -> Result<(), i32> {
        if wr.num_sge < 0 || wr.num_sge as u32 > self.max_sge {
            return Err(libc::EINVAL);
        }
        if self.q.len() >= self.cap as usize {
            return Err(libc::ENOMEM);
        }
        let mut e = self.spare.pop().unwrap_or_default();
        e.wr_id = wr.wr_id;
        e.dv = false;
        e.sges.clear();
        if wr.num_sge > 0 {
            // SAFETY: caller guarantees sg_list holds num_sge entries.
            let s = unsafe { core::slice::from_raw_parts(wr.sg_list, wr.num_sge as usize) };
            e.sges.extend_from_slice(s);
        }
        self.q.push_back(e);
        Ok(())
    }
}

pub(crate) struct Srq {
    pub(crate) ctx: u32,
    pub(crate) pd: u32,
    pub(crate) rq: RecvQueue,
    pub(crate) limit: u32,
    pub(crate) users: u32,
    pub(crate) ptr: Ptr<ibv_srq>,
    /// The mlx5 personality's SRQ in memory, once `mlx5dv_init_obj` described it.
    pub(crate) dv: Option<Box<dv::DvSrq>>,
}

/// A send WR copied at post time (its SGE list, and the data itself when inline).
#[derive(Default)]
pub(crate) struct SendEntry {
    seq: u64,
    wr_id: u64,
    opcode: ibv_wr_opcode,
    flags: u32,
    signaled: bool,
    imm: u32,
    remote_addr: u64,
    rkey: u32,
    compare_add: u64,
    swap: u64,
    ah: u32,
    remote_qpn: u32,
    remote_qkey: u32,
    sges: Vec<ibv_sge>,
    inline: bool,
    data: Vec<u8>,
    /// Total bytes of the SGE list (the sender's successful `byte_len`, rxe G6).
    len: u32,
}

pub(crate) struct Qp {
    pub(crate) ctx: u32,
    pub(crate) pd: u32,
    /// The protection domain of `pd` ([`Pd::prot`]): what MR and AH checks compare.
    pub(crate) prot: u32,
    pub(crate) send_cq: u32,
    pub(crate) recv_cq: u32,
    pub(crate) srq: Option<u32>,
    pub(crate) qpt: ibv_qp_type,
    pub(crate) state: ibv_qp_state,
    pub(crate) sq_sig_all: bool,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) attr: ibv_qp_attr,
    pub(crate) qp_context: usize,
    /// WRs accepted by post_send since the last reset (free-running sequence).
    pub(crate) sq_posted: u64,
    /// Slots released: every WR with `seq < sq_released` no longer occupies the SQ (a
    /// completion covering it was polled).
    pub(crate) sq_released: u64,
    /// Bumped on every reset: completions of an earlier epoch release nothing.
    epoch: u32,

    /// Entries are boxed so taking one from `spare` and giving it back moves a pointer,
    /// not the whole entry, on every post.
    pending: VecDeque<Box<SendEntry>>,
    #[allow(clippy::vec_box)] // on purpose: see above (measured: ~50 instructions per WR)
    spare: Vec<Box<SendEntry>>,
    pub(crate) rq: RecvQueue,
    pub(crate) mcast: u32,
    pub(crate) ptr: Ptr<ibv_qp>,
    /// Inline bytes accepted per WR: the device's and the QP's `max_inline_data`, whichever
    /// is smaller (cached at creation: the device config never changes).
    pub(crate) inline_limit: u32,
    /// The device supports atomics (cached from its config).
    pub(crate) atomics: bool,
    /// The device follows the Rxe profile (cached from its config: a cheap field read on
    /// the hot path).
    pub(crate) rxe: bool,
    /// Rxe profile: WRs were queued by a post_send before RTS; they run at the next
    /// post_send in RTS (rxe S1).
    held_pre_rts: bool,
    /// `wc_flags` of every successful receive: IBV_WC_GRH on UD, and on RC/UC in the Rxe
    /// profile (rxe G4); 0 otherwise. Set by [`Qp::set_profile`].
    recv_flags: u32,
    /// ANDed into a receive's `src_qp`: 0 on RC/UC in the Rxe profile (rxe G4), all ones
    /// otherwise.
    src_qp_mask: u32,
    /// The mlx5 personality's send queue, once `mlx5dv_init_obj` described the QP: its
    /// WQEs are what the device executes ([`dv`]).
    pub(crate) dv: Option<Box<dv::DvQp>>,
    /// The device has the mlx5 personality (cached from its config): its posts ring the
    /// QP's simulated register as libmlx5's would (`dv::reg`).
    pub(crate) mlx5: bool,
}

impl Cq {
    /// Recomputes `limit` after `cap` or `inject_overflow` changed.
    pub(crate) fn set_limit(&mut self) {
        self.limit = if self.inject_overflow > 0 {
            0
        } else {
            self.cap
        };
    }

    /// Publishes the ring's fill level to lock-free pollers.
    pub(crate) fn publish(&self) {
        let v = if self.overflowed {
            u32::MAX
        } else {
            self.ring.len() as u32
        };
        // SAFETY: the SoftCq lives until destroy_cq, which removes this Cq first (under the
        // fabric lock we hold).
        let ready = unsafe { &(*self.ptr.0).ready };
        // Release: pairs with the Acquire in poll_cq, so a poller that sees a non-zero count
        // and then takes the lock finds the entries.
        ready.store(v, Ordering::Release);
    }
}

impl Qp {
    fn qpn(idx: usize) -> u32 {
        idx as u32 + QPN_BASE
    }

    pub(crate) fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Caches the device's profile in the QP (at creation).
    pub(crate) fn set_profile(&mut self, rxe: bool) {
        self.rxe = rxe;
        let ud = self.qpt == IBV_QPT_UD;
        self.recv_flags = if ud || rxe { IBV_WC_GRH } else { 0 };
        self.src_qp_mask = if rxe && !ud { 0 } else { u32::MAX };
    }

    /// Rxe profile, RC: a request the responder never answers is retried forever
    /// (`retry_cnt` 7, rxe G11) or never times out (`timeout` 0, rxe S22), so the WR is
    /// held until the QP leaves RTS.
    fn retries_forever(&self) -> bool {
        self.rxe && self.qpt == IBV_QPT_RC && (self.attr.retry_cnt >= 7 || self.attr.timeout == 0)
    }

    /// The QP's path MTU in bytes (the active MTU when none was set).
    fn mtu(&self) -> usize {
        match self.attr.path_mtu {
            IBV_MTU_256 => 256,
            IBV_MTU_512 => 512,
            IBV_MTU_2048 => 2048,
            IBV_MTU_4096 => 4096,
            _ => ACTIVE_MTU,
        }
    }
}

/// rxe's queue and CQ sizes: the request rounded up to `2^k - 1` (rxe G12/S3/S4/S19;
/// 0 stays 0).
pub(crate) fn rxe_round(n: u32) -> u32 {
    if n == 0 {
        0
    } else {
        ((n as u64 + 1).next_power_of_two() - 1).min(u32::MAX as u64) as u32
    }
}

/// Why a QP is moved to ERR (selects the async event).
#[derive(Clone, Copy)]
pub(crate) enum ErrCause {
    /// A requester-side or receive completion error: `IBV_EVENT_QP_FATAL`.
    Fatal,
    /// Responder saw an invalid request: `IBV_EVENT_QP_REQ_ERR`.
    InvalidRequest,
    /// Responder saw an access violation: `IBV_EVENT_QP_ACCESS_ERR`.
    Access,
    /// The application asked (modify_qp): no event.
    Modify,
}

enum Outcome {
    Done(ibv_wc_status),
    Rnr,
}

/// What happened to a message offered to a receive queue.
enum Delivery {
    Ok,
    NoRecv,
    /// Receiver completed its WR with an error and must go to ERR.
    RecvError,
    /// Rxe profile: the receive completion was lost to a CQ overflow; the responder went
    /// to ERR without acknowledging the message (rxe S15).
    Overflow,
}

pub(crate) struct Fabric {
    pub(crate) devices: Vec<Option<Device>>,
    pub(crate) ctxs: Vec<Option<Ctx>>,
    pub(crate) pds: Vec<Option<Pd>>,
    pub(crate) mrs: Vec<Option<Mr>>,
    pub(crate) cqs: Vec<Option<Cq>>,
    pub(crate) channels: Vec<Option<Channel>>,
    pub(crate) qps: Vec<Option<Box<Qp>>>,
    pub(crate) srqs: Vec<Option<Srq>>,
    pub(crate) ahs: Vec<Option<Ah>>,
    pub(crate) tds: Vec<Option<Td>>,
    pub(crate) mcast: HashMap<[u8; 16], Vec<u32>>,
    /// QPs (indices) with WRs waiting for a receive (RNR with `rnr_retry` 7).
    rnr_waiting: Vec<u32>,
    scratch_waiters: Vec<u32>,
    src_segs: Vec<Seg>,
    dst_segs: Vec<Seg>,
    /// A receive's payload the mlx5 personality puts into its CQE instead of the buffer
    /// (responder scatter-to-CQE), from `deliver` to the CQE's write.
    pub(crate) dv_scatter: Option<(usize, [u8; 64])>,
    /// The SRQ number a receive's CQE names (the mlx5 personality's SRQs in memory), from
    /// `deliver` to the CQE's write.
    pub(crate) dv_srqn: u32,
}

static FABRIC: OnceLock<Mutex<Fabric>> = OnceLock::new();

/// Notified (with the fabric lock) whenever completion events are acknowledged; used only
/// with the fabric mutex.
static EVENTS_ACKED: Condvar = Condvar::new();

/// The fabric lock (poisoning is ignored: softnic never panics while holding it on purpose,
/// and a test that panicked elsewhere must not wedge the others).
pub(crate) fn lock() -> MutexGuard<'static, Fabric> {
    let m = FABRIC.get_or_init(|| Mutex::new(Fabric::new()));
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Releases the fabric lock until the next [`events_acked`] (or a spurious wake-up), then
/// takes it again.
pub(crate) fn wait_for_acks(f: MutexGuard<'static, Fabric>) -> MutexGuard<'static, Fabric> {
    EVENTS_ACKED.wait(f).unwrap_or_else(|e| e.into_inner())
}

/// Wakes every [`wait_for_acks`] (call with the fabric lock held, after the acknowledgement
/// is recorded).
pub(crate) fn events_acked() {
    EVENTS_ACKED.notify_all();
}

fn slab_insert<T>(v: &mut Vec<Option<T>>, t: T) -> usize {
    v.push(Some(t));
    v.len() - 1
}

/// Writes one byte to a non-blocking pipe: wakes `poll`/`epoll` and blocking readers.
pub(crate) fn ring_fd(fd: i32) {
    let b = 1u8;
    // SAFETY: writing one byte from a live local; fd is our own pipe's write end.
    let _ = unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
}

/// Reads one byte from a pipe (blocking unless the application made it non-blocking).
pub(crate) fn wait_fd(fd: i32) -> bool {
    let mut b = 0u8;
    loop {
        // SAFETY: reading one byte into a live local.
        let n = unsafe { libc::read(fd, (&mut b as *mut u8).cast(), 1) };
        if n == 1 {
            return true;
        }
        let e = hotverbs_ffi::errno();
        if n < 0 && e == libc::EINTR {
            continue;
        }
        // The verb reports why it could not wait (EAGAIN on a non-blocking channel fd).
        crate::errno::set_errno(if n == 0 { libc::EIO } else { e });
        return false;
    }
}

/// A pipe: (read end, blocking; write end, non-blocking), both close-on-exec.
pub(crate) fn make_pipe() -> Option<(i32, i32)> {
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: fds[1] is the pipe we just created.
    unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) };
    Some((fds[0], fds[1]))
}

/// rxe G2: an error or flush completion carries opcode 0 (SEND), byte_len 0 and no flags,
/// receives included; rxe fills nothing but `wr_id`, `status`, `qp_num` and `vendor_err`
/// there, so the source QP and the rest are 0 too (issue 31's differential: softnic named
/// the sender of a UD datagram that failed the receive).
#[cold]
fn rxe_error_wc(wc: &mut ibv_wc) {
    wc.opcode = IBV_WC_SEND;
    wc.byte_len = 0;
    wc.wc_flags = 0;
    wc.__bindgen_anon_1.imm_data = 0;
    wc.src_qp = 0;
    wc.pkey_index = 0;
    wc.slid = 0;
    wc.sl = 0;
    wc.dlid_path_bits = 0;
}

fn is_atomic_op(op: ibv_wr_opcode) -> bool {
    op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD
}

fn ok_state_for_recv(s: ibv_qp_state) -> bool {
    s == IBV_QPS_RTR || s == IBV_QPS_RTS
}

impl Fabric {
    fn new() -> Self {
        Fabric {
            devices: Vec::new(),
            ctxs: Vec::new(),
            pds: Vec::new(),
            mrs: Vec::new(),
            cqs: Vec::new(),
            channels: Vec::new(),
            qps: Vec::new(),
            srqs: Vec::new(),
            ahs: Vec::new(),
            tds: Vec::new(),
            mcast: HashMap::new(),
            rnr_waiting: Vec::new(),
            scratch_waiters: Vec::new(),
            src_segs: Vec::new(),
            dst_segs: Vec::new(),
            dv_scatter: None,
            dv_srqn: 0,
        }
    }

    pub(crate) fn add_device(&mut self, d: Device) -> usize {
        slab_insert(&mut self.devices, d)
    }

    pub(crate) fn add<T>(v: &mut Vec<Option<T>>, t: T) -> usize {
        slab_insert(v, t)
    }

    pub(crate) fn add_qp(&mut self, qp: Qp) -> usize {
        self.qps.push(Some(Box::new(qp)));
        self.qps.len() - 1
    }

    pub(crate) fn qp(&mut self, i: usize) -> &mut Qp {
        self.qps[i].as_mut().expect("live QP index")
    }

    pub(crate) fn qp_idx_by_qpn(&self, qpn: u32) -> Option<usize> {
        let i = qpn.checked_sub(QPN_BASE)? as usize;
        match self.qps.get(i) {
            Some(Some(_)) => Some(i),
            _ => None,
        }
    }

    pub(crate) fn ctx_dev(&self, ctx: u32) -> &Device {
        let d = self.ctxs[ctx as usize].as_ref().expect("live ctx").dev;
        self.devices[d as usize].as_ref().expect("live device")
    }

    pub(crate) fn cfg(&self, ctx: u32) -> &Config {
        &self.ctx_dev(ctx).config
    }

    /// Queues an async event on a context and wakes its `async_fd`.
    pub(crate) fn raise(&mut self, ctx: u32, ty: ibv_event_type, element: usize) {
        if let Some(Some(c)) = self.ctxs.get_mut(ctx as usize) {
            c.async_q.push_back((ty, element));
            ring_fd(c.async_wr);
        }
    }

    // ------------------------------------------------------------------ memory keys

    pub(crate) fn mr_key(idx: usize) -> u32 {
        // Low byte is a tag so random small integers are not valid keys.
        ((idx as u32 + 1) << 8) | 0x5a
    }

    fn mr_by_key(&self, key: u32) -> Option<&Mr> {
        if key & 0xff != 0x5a {
            return None;
        }
        let i = (key >> 8).checked_sub(1)? as usize;
        let mr = self.mrs.get(i)?.as_ref()?;
        (mr.key == key).then_some(mr)
    }

    /// Resolves `[addr, addr + len)` of the MR named by `key` in protection domain `pd`
    /// ([`Pd::prot`]) to host memory,
    /// requiring the `need` access bits: a segment that also carries the MR's bounds, which
    /// decide mem's access units. The pointer is derived from the one the application
    /// registered (`ibv_mr.addr`), so it carries that pointer's provenance over the MR.
    pub(crate) fn resolve(&self, key: u32, pd: u32, addr: u64, len: u64, need: u32) -> Option<Seg> {
        let mr = self.mr_by_key(key)?;
        if mr.prot != pd || mr.access & need != need {
            return None;
        }
        let off = addr.checked_sub(mr.iova)?;
        if off.checked_add(len)? > mr.len {
            return None;
        }
        // SAFETY: `mr.ptr` is the ibv_mr softnic allocated in reg_mr and frees only in
        // dereg_mr, which removes `mr` from the fabric first (we hold the fabric lock);
        // softnic never writes it after registration and the application only reads it.
        let base = unsafe { (*mr.ptr.0).addr }.cast::<u8>();
        debug_assert_eq!(base.addr(), mr.addr);
        // No access yet: the range [base + off, base + off + len) is inside the registered
        // region (checked above); wrapping_add only computes the address. The region's
        // bounds are the registration's, `[ibv_mr.addr, ibv_mr.addr + ibv_mr.length)`, as
        // `hotverbs::Mr` sees them (mem's module docs).
        Some(Seg::in_mr(
            base.wrapping_add(off as usize),
            len as usize,
            mr.addr,
            mr.addr.saturating_add(mr.len as usize),
        ))
    }

    /// Resolves an SGE list into `out` (zero-length SGEs are not checked: rxe S16).
    fn resolve_sges(&self, sges: &[ibv_sge], pd: u32, need: u32, out: &mut Vec<Seg>) -> bool {
        out.clear();
        for s in sges {
            if s.length == 0 {
                continue;
            }
            match self.resolve(s.lkey, pd, s.addr, s.length as u64, need) {
                Some(seg) => out.push(seg),
                None => return false,
            }
        }
        true
    }

    // ------------------------------------------------------------------ completions

    /// Appends a completion; handles overflow (CQ error + `IBV_EVENT_CQ_ERR`) and
    /// completion-channel notification.
    /// Returns whether the completion was queued (false: lost to an overflow).
    fn push_cqe(&mut self, cq: u32, wc: ibv_wc, solicited: bool) -> bool {
        self.push_cqe_tagged(cq, wc, solicited, SqTag::NONE)
    }

    fn push_cqe_tagged(&mut self, cq: u32, wc: ibv_wc, solicited: bool, tag: SqTag) -> bool {
        let Some(Some(c)) = self.cqs.get_mut(cq as usize) else {
            return false;
        };
        if c.dv.is_some() {
            // Send completions carry their QP in the tag (`push_send_cqe`).
            return self.dv_push(cq, &wc, solicited, tag.qp != u32::MAX);
        }
        if c.overflowed {
            return false;
        }
        // `limit` is the capacity, or 0 while an injected overflow is pending: one compare.
        if c.ring.len() >= c.limit {
            self.overflow(cq);
            return false;
        }
        let mut tag = tag;
        if c.stamps {
            tag.ts = crate::ex::raw_clock();
            tag.wall = crate::ex::wall_ns();
        }
        c.ring.push_back((wc, tag));
        c.publish();
        if let Some(sol_only) = c.armed {
            if !sol_only || solicited || wc.status != IBV_WC_SUCCESS {
                c.armed = None;
                if let Some(ch) = c.channel {
                    if let Some(Some(chan)) = self.channels.get_mut(ch as usize) {
                        chan.events.push_back(cq);
                        ring_fd(chan.wr);
                    }
                }
            }
        }
        true
    }

    /// A completion that does not fit CQ `cq` (or an injected overflow).
    #[cold]
    #[inline(never)]
    fn overflow(&mut self, cq: u32) {
        let Some(Some(c)) = self.cqs.get_mut(cq as usize) else {
            return;
        };
        if c.inject_overflow > 0 {
            c.inject_overflow -= 1;
            c.set_limit();
        }
        let (ctx, ptr) = (c.ctx, c.ptr.0 as usize);
        if !c.rxe {
            // The man page: the CQ enters the error state.
            c.overflowed = true;
            c.publish();
        }
        // rxe S15: the completion is silently dropped, one CQ_ERR per drop, and the CQ
        // stays usable.
        self.raise(ctx, IBV_EVENT_CQ_ERR, ptr);
    }

    pub(crate) fn poll(&mut self, cq: u32, n: i32, out: *mut ibv_wc) -> i32 {
        let Fabric { cqs, qps, .. } = self;
        let Some(Some(c)) = cqs.get_mut(cq as usize) else {
            return -libc::EINVAL;
        };
        if c.overflowed {
            return POLL_CQ_OVERFLOW;
        }
        let mut k = 0;
        while k < n {
            let Some((wc, tag)) = c.ring.pop_front() else {
                break;
            };
            // SAFETY: the caller of ibv_poll_cq provides room for n entries; k < n.
            unsafe { out.add(k as usize).write(wc) };
            k += 1;
            if tag.qp != u32::MAX {
                if let Some(Some(q)) = qps.get_mut(tag.qp as usize) {
                    if q.epoch == tag.epoch {
                        q.sq_released = q.sq_released.max(tag.seq + 1);
                    }
                }
            }
        }
        c.publish();
        k
    }

    /// Takes the oldest completion of CQ `cq` for an extended poll, releasing SQ slots as
    /// [`Fabric::poll`] does: `Ok(None)` when empty, `Err(EOVERFLOW)` after an overflow
    /// (Spec profile).
    pub(crate) fn pop_wc(&mut self, cq: u32) -> Result<Option<CurWc>, i32> {
        let Fabric { cqs, qps, .. } = self;
        let Some(Some(c)) = cqs.get_mut(cq as usize) else {
            return Err(libc::EINVAL);
        };
        if c.overflowed {
            return Err(libc::EOVERFLOW);
        }
        let Some((wc, tag)) = c.ring.pop_front() else {
            return Ok(None);
        };
        if tag.qp != u32::MAX {
            if let Some(Some(q)) = qps.get_mut(tag.qp as usize) {
                if q.epoch == tag.epoch {
                    q.sq_released = q.sq_released.max(tag.seq + 1);
                }
            }
        }
        c.publish();
        Ok(Some(CurWc {
            wc,
            ts: tag.ts,
            wall: tag.wall,
        }))
    }

    /// The protection domain PD `pd` belongs to ([`Pd::prot`]).
    pub(crate) fn prot_of(&self, pd: u32) -> u32 {
        self.pds
            .get(pd as usize)
            .and_then(|p| p.as_ref())
            .map_or(pd, |p| p.prot)
    }

    fn send_wc(qpn: u32, e: &SendEntry, status: ibv_wc_status, byte_len: u32) -> ibv_wc {
        let mut wc = ibv_wc {
            wr_id: e.wr_id,
            status,
            qp_num: qpn,
            byte_len: if status == IBV_WC_SUCCESS {
                byte_len
            } else {
                0
            },
            ..Default::default()
        };
        wc.opcode = match e.opcode {
            IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => IBV_WC_RDMA_WRITE,
            IBV_WR_RDMA_READ => IBV_WC_RDMA_READ,
            IBV_WR_ATOMIC_CMP_AND_SWP => IBV_WC_COMP_SWAP,
            IBV_WR_ATOMIC_FETCH_AND_ADD => IBV_WC_FETCH_ADD,
            _ => IBV_WC_SEND,
        };
        if status == IBV_WC_SUCCESS
            && (e.opcode == IBV_WR_SEND_WITH_IMM || e.opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
        {
            wc.wc_flags = IBV_WC_WITH_IMM;
        }
        wc
    }

    /// Records the end of send WR `e` of QP `qi`: a CQE if signaled or failed, and the SQ
    /// slots up to and including it are released when a CQE is generated.
    /// Records the end of send WR `e` of QP `qi`. An unsignaled success makes no completion
    /// (and is done: a later error does not flush it, as on rxe and mlx5); any other end
    /// makes one, which covers `e` and every earlier WR (their slots are released when it
    /// is polled).
    fn complete_send(&mut self, qi: usize, e: &SendEntry, status: ibv_wc_status) {
        let qp = self.qp(qi);
        let signaled = e.signaled || qp.sq_sig_all;
        if status == IBV_WC_SUCCESS && !signaled {
            return;
        }
        let mut wc = Self::send_wc(Qp::qpn(qi), e, status, e.len);
        if status != IBV_WC_SUCCESS && qp.rxe {
            rxe_error_wc(&mut wc);
        }
        self.push_send_cqe(qi, e.seq, wc);
    }

    fn push_send_cqe(&mut self, qi: usize, seq: u64, wc: ibv_wc) {
        let qp = self.qp(qi);
        let tag = SqTag {
            qp: qi as u32,
            epoch: qp.epoch,
            seq,
            ts: 0,
            wall: 0,
        };
        let cq = qp.send_cq;
        self.push_cqe_tagged(cq, wc, false, tag);
    }

    #[inline(always)]
    fn recycle(&mut self, qi: usize, e: Box<SendEntry>) {
        self.qp(qi).spare.push(e);
    }

    // ------------------------------------------------------------------ QP errors

    /// Moves a QP to ERR: its receive queue is flushed first, then its waiting send WRs in
    /// posting order (rxe G8); peers waiting on it are failed.
    pub(crate) fn qp_error(&mut self, qi: usize, cause: ErrCause) {
        let qpn = Qp::qpn(qi);
        {
            let qp = self.qp(qi);
            if qp.state == IBV_QPS_ERR {
                return;
            }
            qp.state = IBV_QPS_ERR;
            // SAFETY: the ABI struct lives until destroy_qp, which takes the fabric lock.
            unsafe { (*qp.ptr.0).state = IBV_QPS_ERR };
        }
        self.flush_rq(qi);
        self.flush_pending(qi);
        let (ctx, ptr, srq, rxe) = {
            let qp = self.qp(qi);
            (qp.ctx, qp.ptr.0 as usize, qp.srq, qp.rxe)
        };
        let ev = match cause {
            // rxe G7 (S9/S10 on the responder): a QP going to ERR raises no async event.
            _ if rxe => None,
            ErrCause::Fatal => Some(IBV_EVENT_QP_FATAL),
            ErrCause::InvalidRequest => Some(IBV_EVENT_QP_REQ_ERR),
            ErrCause::Access => Some(IBV_EVENT_QP_ACCESS_ERR),
            ErrCause::Modify => None,
        };
        if let Some(ev) = ev {
            self.raise(ctx, ev, ptr);
        }
        if srq.is_some() {
            self.raise(ctx, IBV_EVENT_QP_LAST_WQE_REACHED, ptr);
        }
        self.fail_waiters_on(qpn);
    }

    fn flush_rq(&mut self, qi: usize) {
        let qpn = Qp::qpn(qi);
        loop {
            let qp = self.qp(qi);
            let Some(r) = qp.rq.q.pop_front() else { break };
            let cq = qp.recv_cq;
            let mut wc = ibv_wc {
                wr_id: r.wr_id,
                status: IBV_WC_WR_FLUSH_ERR,
                opcode: IBV_WC_RECV,
                qp_num: qpn,
                ..Default::default()
            };
            if qp.rxe {
                rxe_error_wc(&mut wc);
            }
            qp.rq.spare.push(r);
            self.push_cqe(cq, wc, false);
        }
    }

    fn flush_pending(&mut self, qi: usize) {
        while let Some(e) = self.qp(qi).pending.pop_front() {
            self.complete_send(qi, &e, IBV_WC_WR_FLUSH_ERR);
            self.recycle(qi, e);
        }
        self.rnr_waiting.retain(|&w| w as usize != qi);
    }

    /// Requesters stuck in RNR on `qpn`, which can no longer answer: their head WR ends with
    /// `IBV_WC_RETRY_EXC_ERR` (rxe S14/S21), and they go to ERR.
    fn fail_waiters_on(&mut self, qpn: u32) {
        let mut w = std::mem::take(&mut self.scratch_waiters);
        w.clear();
        w.extend(self.rnr_waiting.iter().copied());
        for &qi in &w {
            let qi = qi as usize;
            if self.qps.get(qi).is_none_or(|q| q.is_none()) {
                continue;
            }
            let qp = self.qp(qi);
            if qp.attr.dest_qp_num != qpn || qp.state == IBV_QPS_ERR {
                continue;
            }
            if qp.retries_forever() {
                // rxe G11/S14/S22: retry_cnt 7 (or timeout 0) retries for ever; the WR is
                // held until the QP is moved to ERR (then flushed) or RESET.
                continue;
            }
            if let Some(e) = qp.pending.pop_front() {
                self.complete_send(qi, &e, IBV_WC_RETRY_EXC_ERR);
                self.recycle(qi, e);
                self.qp_error(qi, ErrCause::Fatal);
            }
        }
        self.scratch_waiters = w;
    }

    /// Retries the waiting WRs of requesters whose responder is QP `qpn` (or any QP using
    /// SRQ `srq`), after a receive was posted.
    pub(crate) fn kick_waiters(&mut self, qpn: Option<u32>, srq: Option<u32>) {
        if self.rnr_waiting.is_empty() {
            return;
        }
        let mut w = std::mem::take(&mut self.scratch_waiters);
        w.clear();
        w.extend(self.rnr_waiting.iter().copied());
        for &qi in &w {
            let qi = qi as usize;
            if self.qps.get(qi).is_none_or(|q| q.is_none()) {
                continue;
            }
            let dest = self.qp(qi).attr.dest_qp_num;
            let hit = Some(dest) == qpn
                || (srq.is_some()
                    && self
                        .qp_idx_by_qpn(dest)
                        .is_some_and(|d| self.qp(d).srq == srq));
            if hit {
                self.run_pending(qi);
            }
        }
        self.scratch_waiters = w;
    }

    /// Executes waiting send WRs of QP `qi` in order until one waits again.
    fn run_pending(&mut self, qi: usize) {
        loop {
            let qp = self.qp(qi);
            if qp.state != IBV_QPS_RTS {
                return;
            }
            let Some(e) = qp.pending.pop_front() else {
                break;
            };
            match self.execute(qi, &e, None) {
                Outcome::Rnr => {
                    self.qp(qi).pending.push_front(e);
                    if !self.rnr_waiting.contains(&(qi as u32)) {
                        self.rnr_waiting.push(qi as u32);
                    }
                    return;
                }
                Outcome::Done(_) => self.recycle(qi, e),
            }
        }
        self.rnr_waiting.retain(|&w| w as usize != qi);
    }

    // ------------------------------------------------------------------ posting

    /// `post_send`: validates each WR in chain order; the first invalid one is returned
    /// through `bad` with its errno and nothing from it onward is posted. On the mlx5
    /// personality, a post that took a WR rings the QP's register as libmlx5's
    /// `post_send_db` would (`dv::reg`).
    ///
    /// # Safety
    /// `wr` is a valid chain of `ibv_send_wr` (as `ibv_post_send(3)` requires); `bad` is
    /// writable.
    pub(crate) unsafe fn post_send(
        &mut self,
        qi: usize,
        wr: *mut ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
    ) -> i32 {
        // SAFETY: forwarded contract.
        let rc = unsafe { self.post_send_chain(qi, wr, bad) };
        if self.qp(qi).mlx5 {
            // SAFETY: forwarded contract (the chain is still valid, `bad` was written).
            unsafe { self.dv_libmlx5_post(qi, wr, bad, rc) };
        }
        rc
    }

    /// [`post_send`](Self::post_send) without the register (the simulated device's own
    /// execution of WQEs).
    ///
    /// # Safety
    /// As [`post_send`](Self::post_send).
    pub(crate) unsafe fn post_send_chain(
        &mut self,
        qi: usize,
        mut wr: *mut ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
    ) -> i32 {
        while !wr.is_null() {
            // SAFETY: a valid chain (caller).
            let w = unsafe { &*wr };
            // SAFETY: forwarded contract.
            if let Err(e) = unsafe { self.accept_send(qi, w) } {
                if e == QUEUED_BEFORE_RTS {
                    // SAFETY: forwarded contract; the rest of the chain.
                    return unsafe { self.post_send_before_rts(qi, w.next, bad) };
                }
                let q = self.qp(qi);
                if q.rxe && q.held_pre_rts && q.state == IBV_QPS_RTS {
                    // librxe rings the doorbell after its loop whatever became of the chain,
                    // so WRs queued before RTS (S1) run even when this post's first WR is
                    // refused (issue 31's differential, D10).
                    q.held_pre_rts = false;
                    self.run_pending(qi);
                }
                if !bad.is_null() {
                    // SAFETY: writable (caller).
                    unsafe { *bad = wr };
                }
                return e;
            }
            wr = w.next;
        }
        0
    }

    /// rxe S1/G1 (Rxe profile, QP in RESET/INIT/RTR, after the first WR was queued): the
    /// provider validates and queues the rest of the chain, then the kernel doorbell refuses
    /// a QP before RTS: EINVAL in the return value and in errno, `*bad_wr` NULL. A WR that
    /// fails validation is returned in `*bad_wr` with its errno, as usual.
    ///
    /// # Safety
    /// As [`Fabric::post_send`].
    #[cold]
    #[inline(never)]
    unsafe fn post_send_before_rts(
        &mut self,
        qi: usize,
        mut wr: *mut ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
    ) -> i32 {
        while !wr.is_null() {
            // SAFETY: a valid chain (caller).
            let w = unsafe { &*wr };
            // SAFETY: forwarded contract.
            match unsafe { self.accept_send(qi, w) } {
                Err(QUEUED_BEFORE_RTS) => {}
                Err(e) => {
                    if !bad.is_null() {
                        // SAFETY: writable (caller).
                        unsafe { *bad = wr };
                    }
                    return e;
                }
                Ok(()) => unreachable!("a QP before RTS queues every valid WR"),
            }
            wr = w.next;
        }
        if !bad.is_null() {
            // SAFETY: writable (caller).
            unsafe { *bad = core::ptr::null_mut() };
        }
        crate::errno::set_errno(libc::EINVAL);
        libc::EINVAL
    }

    /// `ibv_wr_complete`'s all-or-nothing check: whether [`Fabric::post_send`] would accept
    /// every WR of the chain (room in the send queue for all `n`, then each WR's SGE count,
    /// inline size, atomic operands and UD address), with no side effect. The first refusal's
    /// errno: `full` for a queue without room (the profile's builder errno), EINVAL else.
    ///
    /// # Safety
    /// As [`Fabric::post_send`].
    pub(crate) unsafe fn check_batch(
        &mut self,
        qi: usize,
        mut wr: *mut ibv_send_wr,
        n: usize,
        full: i32,
    ) -> Result<(), i32> {
        let qp = self.qp(qi);
        if qp.state != IBV_QPS_RTS && qp.state != IBV_QPS_ERR && !qp.rxe {
            return Err(libc::EINVAL);
        }
        let (n, max) = (n as u64, qp.cap.max_send_wr as u64);
        // As accept_send, for all n at once (rxe S3: only waiting WRs occupy the SQ).
        if qp.sq_posted - qp.sq_released + n > max && (!qp.rxe || qp.pending.len() as u64 + n > max)
        {
            return Err(full);
        }
        while !wr.is_null() {
            // SAFETY: a valid chain (caller).
            let w = unsafe { &*wr };
            if w.num_sge < 0 || w.num_sge as u32 > qp.cap.max_send_sge {
                return Err(libc::EINVAL);
            }
            let sges: &[ibv_sge] = if w.num_sge > 0 {
                // SAFETY: sg_list holds num_sge entries (caller).
                unsafe { core::slice::from_raw_parts(w.sg_list, w.num_sge as usize) }
            } else {
                &[]
            };
            let op = w.opcode;
            let total: u64 = sges.iter().map(|s| s.length as u64).sum();
            let inlined = matches!(
                op,
                IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM
            ) || (op == IBV_WR_RDMA_READ && qp.rxe);
            if w.send_flags & IBV_SEND_INLINE != 0 && inlined && total > qp.inline_limit as u64 {
                return Err(libc::EINVAL);
            }
            if op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD {
                // SAFETY: the atomic member is the one set for an atomic opcode.
                let a = unsafe { w.wr.atomic };
                if !qp.atomics || a.remote_addr % 8 != 0 || sges.len() != 1 || sges[0].length < 8 {
                    return Err(libc::EINVAL);
                }
            }
            // SAFETY: plain pointer read of the UD member (any bits are a valid pointer).
            if qp.qpt == IBV_QPT_UD && unsafe { w.wr.ud.ah }.is_null() {
                return Err(libc::EINVAL);
            }
            wr = w.next;
        }
        Ok(())
    }

    /// # Safety
    /// `w` is a valid WR; its `sg_list` holds `num_sge` entries; inline SGE addresses are
    /// readable.
    #[inline(always)]
    unsafe fn accept_send(&mut self, qi: usize, w: &ibv_send_wr) -> Result<(), i32> {
        let qp = self.qp(qi);
        let (max_inline, atomics) = (qp.inline_limit, qp.atomics);
        if qp.state != IBV_QPS_RTS && qp.state != IBV_QPS_ERR && !qp.rxe {
            // (rxe S1 queues the WR anyway: see post_send.)
            return Err(libc::EINVAL);
        }
        if qp.sq_posted - qp.sq_released >= qp.cap.max_send_wr as u64
            // rxe S3: a slot is free once the WR was acknowledged (executed), polled or
            // not; only WRs still waiting occupy the SQ (they are all unreleased).
            && (!qp.rxe || qp.pending.len() >= qp.cap.max_send_wr as usize)
        {
            return Err(libc::ENOMEM);
        }
        if w.num_sge < 0 || w.num_sge as u32 > qp.cap.max_send_sge {
            return Err(libc::EINVAL);
        }
        let sges: &[ibv_sge] = if w.num_sge > 0 {
            // SAFETY: caller guarantees sg_list holds num_sge entries.
            unsafe { core::slice::from_raw_parts(w.sg_list, w.num_sge as usize) }
        } else {
            &[]
        };
        let op = w.opcode;
        let is_atomic = op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
        let carries_data = matches!(
            op,
            IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM
        );
        let inline_flag = w.send_flags & IBV_SEND_INLINE != 0;
        let inline = inline_flag && carries_data;
        let total: u64 = sges.iter().map(|s| s.length as u64).sum();
        let mut stored_op = op;
        if inline_flag && !inline && op == IBV_WR_RDMA_READ && qp.rxe {
            // rxe S5: rxe applies IBV_SEND_INLINE to an RDMA READ too: size-checked here,
            // it fails at execution (`RXE_INLINE_READ`).
            if total > max_inline as u64 {
                return Err(libc::EINVAL);
            }
            stored_op = RXE_INLINE_READ;
        }
        if inline && total > max_inline as u64 {
            return Err(libc::EINVAL);
        }
        // SAFETY: the union member matching the opcode is the one the application set.
        let (remote_addr, rkey, compare_add, swap, ah, rqpn, rqkey) = unsafe {
            if is_atomic {
                let a = w.wr.atomic;
                (
                    a.remote_addr,
                    a.rkey,
                    a.compare_add,
                    a.swap,
                    core::ptr::null_mut(),
                    0,
                    0,
                )
            } else if qp.qpt == IBV_QPT_UD {
                let u = w.wr.ud;
                (0, 0, 0, 0, u.ah, u.remote_qpn, u.remote_qkey)
            } else {
                let r = w.wr.rdma;
                (r.remote_addr, r.rkey, 0, 0, core::ptr::null_mut(), 0, 0)
            }
        };
        if is_atomic {
            // ibv_post_send(3): atomics act on an aligned 64-bit remote word, and return it
            // into the local SGE (rxe S10: misaligned / short local buffer -> EINVAL).
            if !atomics || remote_addr % 8 != 0 || sges.len() != 1 || sges[0].length < 8 {
                return Err(libc::EINVAL);
            }
        }
        if qp.qpt == IBV_QPT_UD && ah.is_null() {
            return Err(libc::EINVAL);
        }
        // Accepted: it occupies a slot from here on.
        let mut e = qp.spare.pop().unwrap_or_default();
        e.seq = qp.sq_posted;
        qp.sq_posted += 1;
        e.wr_id = w.wr_id;
        e.opcode = stored_op;
        e.flags = w.send_flags;
        e.signaled = w.send_flags & IBV_SEND_SIGNALED != 0;
        // SAFETY: plain 32-bit union; either member is the same bits.
        e.imm = unsafe { w.__bindgen_anon_1.imm_data };
        e.remote_addr = remote_addr;
        e.rkey = rkey;
        e.compare_add = compare_add;
        e.swap = swap;
        e.ah = if ah.is_null() {
            u32::MAX
        } else {
            // SAFETY: non-null AH pointers come from ibv_create_ah, which softnic allocated.
            unsafe { (*ah).handle }
        };
        e.remote_qpn = rqpn;
        e.remote_qkey = rqkey;
        e.inline = inline;
        e.len = total as u32;
        e.data.clear();
        if inline && qp.state != IBV_QPS_ERR {
            // IBV_SEND_INLINE: the payload is taken now ("the data buffers can be reused
            // immediately after the call returns", ibv_post_send(3)), before anything is
            // written: the destination (a WRITE's remote range, a SEND's receive buffer) may
            // overlap the sources, and later pieces must still carry the posted bytes. The
            // entry's buffer holds max_inline_data bytes from QP creation (no allocation).
            for s in sges {
                // SAFETY: IBV_SEND_INLINE: the buffers are readable at post time (caller);
                // empty SGEs (any address, NULL included) are skipped by `read_inline`.
                unsafe { mem::read_inline(&mut e.data, s.addr as usize, s.length as usize) };
            }
        }
        if qp.state != IBV_QPS_RTS {
            if qp.state == IBV_QPS_ERR {
                // Posting to a QP in ERR: the WR completes at once with a flush (rxe G9).
                self.complete_send(qi, &e, IBV_WC_WR_FLUSH_ERR);
                self.recycle(qi, e);
            } else {
                // rxe S1 (only the Rxe profile gets here): queued before RTS, run by the
                // next post_send in RTS.
                Self::keep_sges(&mut e, sges);
                qp.pending.push_back(e);
                qp.held_pre_rts = true;
                return Err(QUEUED_BEFORE_RTS);
            }
        } else if !qp.pending.is_empty() {
            Self::keep_sges(&mut e, sges);
            qp.pending.push_back(e);
            if qp.held_pre_rts {
                // rxe S1: the WRs a post before RTS queued run at the next post in RTS,
                // before this one.
                qp.held_pre_rts = false;
                self.run_pending(qi);
            }
        } else {
            // Executed now, inside post_send: the SGE list is read straight from the
            // application's WR (inline bytes were captured above); it is copied only if the
            // WR has to wait.
            match self.execute(qi, &e, Some(sges)) {
                Outcome::Rnr => {
                    Self::keep_sges(&mut e, sges);
                    self.qp(qi).pending.push_back(e);
                    self.rnr_waiting.push(qi as u32);
                }
                Outcome::Done(_) => self.recycle(qi, e),
            }
        }
        Ok(())
    }

    /// Copies a WR's SGE list into the entry so it can execute after post_send returned
    /// (an inline WR's bytes are already in the entry: captured at post).
    fn keep_sges(e: &mut SendEntry, sges: &[ibv_sge]) {
        e.sges.clear();
        e.sges.extend_from_slice(sges);
    }

    /// Walks a receive chain, accepting each WR with `push` until one is refused: then
    /// `*bad` is that WR and nothing from it on is posted (`ibv_post_recv(3)`). Returns
    /// the errno (0 when all were posted) and whether any WR was posted.
    ///
    /// # Safety
    /// A valid chain; `bad` null or writable.
    unsafe fn push_recv_chain(
        &mut self,
        mut wr: *mut ibv_recv_wr,
        bad: *mut *mut ibv_recv_wr,
        mut push: impl FnMut(&mut Self, &ibv_recv_wr) -> Result<(), i32>,
    ) -> (i32, bool) {
        let mut posted = false;
        while !wr.is_null() {
            // SAFETY: valid chain (caller).
            let w = unsafe { &*wr };
            if let Err(e) = push(self, w) {
                if !bad.is_null() {
                    // SAFETY: writable (caller).
                    unsafe { *bad = wr };
                }
                return (e, posted);
            }
            posted = true;
            wr = w.next;
        }
        (0, posted)
    }

    /// `post_recv` on a QP.
    ///
    /// # Safety
    /// As `ibv_post_recv(3)`: a valid chain; `bad` writable.
    pub(crate) unsafe fn post_recv(
        &mut self,
        qi: usize,
        wr: *mut ibv_recv_wr,
        bad: *mut *mut ibv_recv_wr,
    ) -> i32 {
        let qp = self.qp(qi);
        if qp.rxe && qp.state == IBV_QPS_RESET && qp.srq.is_none() {
            // rxe S2: in RESET the kernel refuses the whole post: EINVAL with bad_wr NULL
            // (errno untouched, G1), nothing queued.
            if !bad.is_null() {
                // SAFETY: writable (caller).
                unsafe { *bad = core::ptr::null_mut() };
            }
            return libc::EINVAL;
        }
        // SAFETY: forwarded (caller); each WR is a valid receive WR of the chain.
        let (rc, posted) = unsafe {
            self.push_recv_chain(wr, bad, |f, w| {
                let qp = f.qp(qi);
                if qp.srq.is_some() || qp.state == IBV_QPS_RESET {
                    Err(libc::EINVAL)
                } else {
                    qp.rq.push(w)
                }
            })
        };
        if posted {
            let qp = self.qp(qi);
            if qp.state == IBV_QPS_ERR {
                // Receives posted in ERR are flushed (IBA). rxe G9/S2: they wait, without a
                // completion, for the next modify(ERR->ERR).
                if !qp.rxe {
                    self.flush_rq(qi);
                }
            } else {
                self.kick_waiters(Some(Qp::qpn(qi)), None);
            }
        }
        rc
    }

    /// `post_srq_recv`.
    ///
    /// # Safety
    /// As `ibv_post_srq_recv(3)`.
    pub(crate) unsafe fn post_srq_recv(
        &mut self,
        si: usize,
        wr: *mut ibv_recv_wr,
        bad: *mut *mut ibv_recv_wr,
    ) -> i32 {
        // SAFETY: forwarded (caller); each WR is a valid receive WR of the chain.
        let (rc, posted) = unsafe {
            self.push_recv_chain(wr, bad, |f, w| {
                f.srqs[si].as_mut().expect("live SRQ").rq.push(w)
            })
        };
        if posted {
            self.kick_waiters(None, Some(si as u32));
        }
        rc
    }

    // ------------------------------------------------------------------ execution

    /// Executes one send WR now; on `Done` the completion (and any error transition) has
    /// been recorded.
    ///
    /// `wr_sges` is the application's SGE list when called from inside post_send (the
    /// entry's copies are not made then), `None` for an entry that waited (it owns copies).
    fn execute(&mut self, qi: usize, e: &SendEntry, wr_sges: Option<&[ibv_sge]>) -> Outcome {
        let mut src = std::mem::take(&mut self.src_segs);
        let (out, peer_err) = self.execute_inner(qi, e, wr_sges, &mut src);
        self.src_segs = src;
        if let Outcome::Done(status) = out {
            self.complete_send(qi, e, status);
            if status != IBV_WC_SUCCESS {
                self.qp_error(qi, ErrCause::Fatal);
            }
            if let Some((pi, cause)) = peer_err {
                self.qp_error(pi, cause);
            }
        }
        out
    }

    fn execute_inner(
        &mut self,
        qi: usize,
        e: &SendEntry,
        wr_sges: Option<&[ibv_sge]>,
        src: &mut Vec<Seg>,
    ) -> (Outcome, Option<(usize, ErrCause)>) {
        let done = |s| (Outcome::Done(s), None);
        let (qpt, pd, dest, rnr_retry) = {
            let qp = self.qp(qi);
            (qp.qpt, qp.prot, qp.attr.dest_qp_num, qp.attr.rnr_retry)
        };
        // The profile is read only on the paths that need it (none of them hot).
        let rxe = |f: &mut Self| f.qp(qi).rxe;
        let op = e.opcode;
        let valid = match qpt {
            IBV_QPT_RC => {
                matches!(
                    op,
                    IBV_WR_SEND
                        | IBV_WR_SEND_WITH_IMM
                        | IBV_WR_RDMA_WRITE
                        | IBV_WR_RDMA_WRITE_WITH_IMM
                        | IBV_WR_RDMA_READ
                        | IBV_WR_ATOMIC_CMP_AND_SWP
                        | IBV_WR_ATOMIC_FETCH_AND_ADD
                ) || (op == IBV_WR_SEND_WITH_INV && rxe(self))
                // rxe S21: rxe executes SEND_WITH_INV on RC (softnic has no MWs or
                // fast-registration MRs, so every rkey it names is bogus).
            }
            IBV_QPT_UC => matches!(
                op,
                IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM
            ),
            _ => matches!(op, IBV_WR_SEND | IBV_WR_SEND_WITH_IMM),
        };
        if !valid {
            // rxe S18/S21: an opcode the QP type does not support completes with
            // LOC_QP_OP_ERR and moves the QP to ERR. rxe S5: an inline READ (marked at
            // post) loses its SGE list: LOC_PROT_ERR, nothing written.
            return done(if op == RXE_INLINE_READ {
                IBV_WC_LOC_PROT_ERR
            } else {
                IBV_WC_LOC_QP_OP_ERR
            });
        }
        if qpt == IBV_QPT_UD && self.qp(qi).rxe {
            // rxe drops a UD message above the MTU before it reads the gather list: success,
            // even with an lkey that names no MR (issue 31's differential; S18).
            let len: usize = if e.inline {
                e.data.len()
            } else {
                wr_sges
                    .unwrap_or(&e.sges)
                    .iter()
                    .map(|s| s.length as usize)
                    .sum()
            };
            let prot = self.qp(qi).prot;
            if len > ACTIVE_MTU
                && self
                    .ahs
                    .get(e.ah as usize)
                    .and_then(|a| a.as_ref())
                    .is_some_and(|ah| ah.prot == prot)
            {
                return done(IBV_WC_SUCCESS);
            }
        }
        // Local side: gather (or, for READ/atomics, scatter target needing LOCAL_WRITE).
        let mut local_fault = false;
        let local_write = op == IBV_WR_RDMA_READ
            || op == IBV_WR_ATOMIC_CMP_AND_SWP
            || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
        if e.inline {
            // The bytes captured at post time (softnic's own buffer: it cannot overlap the
            // destination).
            src.clear();
            // Only read (a source); the cast to *mut is for the Seg type. `Vec::as_ptr` makes
            // no reference, so the pointer keeps the buffer's own provenance, which mem's
            // atomic loads need (they may not go through a `&[u8]`). The buffer is its own
            // region (mem's module docs).
            src.push(Seg::own(e.data.as_ptr().cast_mut(), e.data.len()));
        } else {
            let need = if local_write {
                IBV_ACCESS_LOCAL_WRITE
            } else {
                0
            };
            let sges = wr_sges.unwrap_or(&e.sges);
            if !self.resolve_sges(sges, pd, need, src) {
                match self.local_fault(qi, e, sges, pd) {
                    Some(status) => return done(status),
                    None => {
                        src.clear();
                        local_fault = true;
                    }
                }
            }
        }
        let total: usize = src.iter().map(|s| s.len).sum();
        if qpt == IBV_QPT_UD {
            return done(self.ud_send(qi, e, src, total));
        }
        let reliable = qpt == IBV_QPT_RC;
        // A missing / not-ready responder never answers: RC retries run out (rxe S21/S22;
        // softnic does not wait for timeouts), UC loses the message silently.
        let peer = match self.qp_idx_by_qpn(dest) {
            Some(p) if ok_state_for_recv(self.qp(p).state) => p,
            _ => {
                if !reliable {
                    return done(IBV_WC_SUCCESS);
                }
                return self.no_answer(qi);
            }
        };
        let (ppd, paccess) = {
            let p = self.qp(peer);
            (p.prot, p.attr.qp_access_flags)
        };
        let drop_or = |s| {
            if reliable {
                s
            } else {
                IBV_WC_SUCCESS
            }
        };
        let rnr = || {
            if rnr_retry >= 7 {
                (Outcome::Rnr, None)
            } else {
                (Outcome::Done(IBV_WC_RNR_RETRY_EXC_ERR), None)
            }
        };
        match op {
            IBV_WR_SEND | IBV_WR_SEND_WITH_IMM => {
                let imm = (op == IBV_WR_SEND_WITH_IMM).then_some(e.imm);
                let sol = e.flags & IBV_SEND_SOLICITED != 0;
                match self.deliver(peer, Qp::qpn(qi), src, total, imm, IBV_WC_RECV, sol, false) {
                    (Delivery::Ok, _) => done(IBV_WC_SUCCESS),
                    (Delivery::NoRecv, _) if reliable => rnr(),
                    (Delivery::NoRecv, _) => done(IBV_WC_SUCCESS),
                    (Delivery::RecvError, status) => {
                        // Receiver: LOC_LEN_ERR / LOC_PROT_ERR on its receive, then ERR.
                        // Sender: REM_INV_REQ_ERR (too long) / REM_OP_ERR (receiver's
                        // buffer not writable) — IBA NAK codes. rxe S8/S11: the receiver
                        // reports LOC_QP_OP_ERR and the sender REM_OP_ERR in both cases.
                        let s = if status == IBV_WC_LOC_LEN_ERR {
                            IBV_WC_REM_INV_REQ_ERR
                        } else {
                            IBV_WC_REM_OP_ERR
                        };
                        (Outcome::Done(drop_or(s)), Some((peer, ErrCause::Fatal)))
                    }
                    (Delivery::Overflow, _) => self.lost_at(qi, peer, reliable),
                }
            }
            IBV_WR_SEND_WITH_INV => match self.rxe_send_with_inv(peer) {
                Some(out) => out,
                None => rnr(),
            },
            IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => {
                if paccess & IBV_ACCESS_REMOTE_WRITE == 0 {
                    return self.remote_fail(reliable, peer, IBV_WC_REM_INV_REQ_ERR);
                }
                if op == IBV_WR_RDMA_WRITE_WITH_IMM
                    && reliable
                    && self.qp(qi).rxe
                    && total <= self.qp(qi).mtu()
                    && !self.has_recv(peer)
                {
                    // rxe's responder looks for a receive before it checks the rkey, on
                    // the packet that needs one: the only packet of a message that fits
                    // the MTU (issue 31's differential, D8). A longer message's first
                    // packet is checked for its rkey first.
                    return rnr();
                }
                let dst = if total > 0 {
                    match self.resolve(
                        e.rkey,
                        ppd,
                        e.remote_addr,
                        total as u64,
                        IBV_ACCESS_REMOTE_WRITE,
                    ) {
                        Some(seg) => seg,
                        None => {
                            if op == IBV_WR_RDMA_WRITE_WITH_IMM
                                && reliable
                                && total <= self.qp(qi).mtu()
                            {
                                // D2 holds for a message of one packet, whose receive
                                // rxe takes before the rkey check; a longer one fails on
                                // its first packet, before any receive was taken, and
                                // the receive is flushed with the QP (issue 31's
                                // differential).
                                self.rxe_refused_write_imm(peer);
                            }
                            return self.remote_fail(reliable, peer, IBV_WC_REM_ACCESS_ERR);
                        }
                    }
                } else {
                    Seg::default()
                };
                if op == IBV_WR_RDMA_WRITE_WITH_IMM && !self.has_recv(peer) {
                    if !reliable {
                        return done(IBV_WC_SUCCESS);
                    }
                    let out = rnr();
                    if matches!(out.0, Outcome::Done(_)) && total > 0 {
                        // SAFETY: dst and src resolved and bounds-checked above, for
                        // `total` bytes.
                        unsafe { self.rxe_write_imm_prefix(qi, dst, src, total) };
                    }
                    return out;
                }
                if total > 0 {
                    // SAFETY: both sides resolved and bounds-checked above.
                    unsafe { mem::scatter(&[dst], 0, src, 0, total) };
                }
                if op == IBV_WR_RDMA_WRITE_WITH_IMM {
                    let sol = e.flags & IBV_SEND_SOLICITED != 0;
                    let (d, _) = self.deliver(
                        peer,
                        Qp::qpn(qi),
                        &[],
                        total,
                        Some(e.imm),
                        IBV_WC_RECV_RDMA_WITH_IMM,
                        sol,
                        true,
                    );
                    if let Delivery::Overflow = d {
                        return self.lost_at(qi, peer, reliable);
                    }
                }
                done(IBV_WC_SUCCESS)
            }
            IBV_WR_RDMA_READ => {
                if paccess & IBV_ACCESS_REMOTE_READ == 0 {
                    return self.remote_fail(true, peer, IBV_WC_REM_INV_REQ_ERR);
                }
                // A local fault deferred (Rxe profile, D7) left `src` empty: the remote
                // side is checked for the WR's own length.
                let len = if local_fault { e.len as usize } else { total };
                if len > 0 {
                    let Some(s) = self.resolve(
                        e.rkey,
                        ppd,
                        e.remote_addr,
                        len as u64,
                        IBV_ACCESS_REMOTE_READ,
                    ) else {
                        return self.remote_fail(true, peer, IBV_WC_REM_ACCESS_ERR);
                    };
                    if local_fault {
                        // rxe S7/S8: the response finds the local SGE bad; nothing written.
                        return done(IBV_WC_LOC_PROT_ERR);
                    }
                    // SAFETY: both sides resolved and bounds-checked above.
                    unsafe { mem::scatter(src, 0, &[s], 0, total) };
                } else if local_fault {
                    return done(IBV_WC_LOC_PROT_ERR);
                }
                done(IBV_WC_SUCCESS)
            }
            _ => {
                // Atomics (RC only; validated at post: aligned, one local SGE >= 8 bytes).
                if paccess & IBV_ACCESS_REMOTE_ATOMIC == 0 {
                    return self.remote_fail(true, peer, IBV_WC_REM_INV_REQ_ERR);
                }
                let Some(Seg { ptr: p, .. }) =
                    self.resolve(e.rkey, ppd, e.remote_addr, 8, IBV_ACCESS_REMOTE_ATOMIC)
                else {
                    return self.remote_fail(true, peer, IBV_WC_REM_ACCESS_ERR);
                };
                // SAFETY: resolved, bounds-checked and 8-byte aligned (post-time check; MR
                // addresses map 1:1 modulo the iova offset, which keeps alignment only if
                // the MR start is as aligned as its iova: checked here).
                // An aligned word inside the MR: an `AtomicU64`, the unit mem's rule gives
                // it for every access.
                let orig = if p.addr() % 8 != 0 {
                    return self.remote_fail(true, peer, IBV_WC_REM_ACCESS_ERR);
                } else if op == IBV_WR_ATOMIC_CMP_AND_SWP {
                    // SAFETY: as above.
                    unsafe { mem::atomic_cmp_swap(p, e.compare_add, e.swap) }
                } else {
                    // SAFETY: as above.
                    unsafe { mem::atomic_fetch_add(p, e.compare_add) }
                };
                // `mut` and `as_mut_ptr`: mem reads sources with atomics, which need a
                // pointer allowed to write (not one derived from `&[u8]`). softnic's own
                // buffer: its own region (mem's module docs).
                if local_fault {
                    // rxe S10: LOC_PROT_ERR after the remote operation executed; the local
                    // buffer is untouched.
                    return done(IBV_WC_LOC_PROT_ERR);
                }
                let mut bytes = orig.to_ne_bytes();
                let s = [Seg::own(bytes.as_mut_ptr(), 8)];
                // SAFETY: src is the checked local SGE (>= 8 bytes); `s` is a live local.
                unsafe { mem::scatter(src, 0, &s, 0, 8) };
                done(IBV_WC_SUCCESS)
            }
        }
    }

    /// An RC request the responder never answers (absent, not in RTR/RTS, or it lost the
    /// message): the transport retries run out, RETRY_EXC_ERR at once (softnic has no
    /// timers; rxe S14/S21/S22 after (retry_cnt+1) x timeout); in the Rxe profile with
    /// `retry_cnt` 7 or `timeout` 0 the WR is held for ever instead (rxe G11/S22): it
    /// waits like an RNR WR, is retried when the responder becomes ready, and is flushed
    /// when the QP goes to ERR.
    fn no_answer(&mut self, qi: usize) -> (Outcome, Option<(usize, ErrCause)>) {
        if self.qp(qi).retries_forever() {
            (Outcome::Rnr, None)
        } else {
            (Outcome::Done(IBV_WC_RETRY_EXC_ERR), None)
        }
    }

    /// A gather/scatter list that did not resolve: the status the WR ends with, or `None`
    /// when it goes on to fail later (rxe S10: an atomic executes remotely first).
    #[cold]
    #[inline(never)]
    fn local_fault(
        &mut self,
        qi: usize,
        e: &SendEntry,
        sges: &[ibv_sge],
        pd: u32,
    ) -> Option<ibv_wc_status> {
        let op = e.opcode;
        if !self.qp(qi).rxe {
            return Some(IBV_WC_LOC_PROT_ERR);
        }
        if is_atomic_op(op) {
            // rxe S10: the remote atomic executes first; the bad local SGE fails the WR
            // afterwards.
            return None;
        }
        if e.len >= 0x8000_0000 {
            // rxe S8: a message of 2^31 bytes or more fails with LOC_QP_OP_ERR.
            return Some(IBV_WC_LOC_QP_OP_ERR);
        }
        if op == IBV_WR_RDMA_READ {
            // rxe checks a READ's local SGEs when the response arrives: a remote fault is
            // reported first (issue 31's differential, D7), else LOC_PROT_ERR (S7, S8).
            return None;
        }
        if op != IBV_WR_RDMA_READ && self.bad_lkey(sges, pd) {
            // rxe S7: a gather-side lkey that names no MR of the PD gives LOC_QP_OP_ERR
            // (bounds and access faults stay LOC_PROT_ERR, S8).
            return Some(IBV_WC_LOC_QP_OP_ERR);
        }
        Some(IBV_WC_LOC_PROT_ERR)
    }

    /// rxe S21 (RC, Rxe profile only): SEND_WITH_INV. The responder consumes a receive,
    /// completes it with REM_INV_REQ_ERR (the rkey to invalidate is bogus) and goes to ERR;
    /// the requester was acknowledged and succeeds. `None`: no receive posted (RNR).
    #[cold]
    #[inline(never)]
    fn rxe_send_with_inv(&mut self, peer: usize) -> Option<(Outcome, Option<(usize, ErrCause)>)> {
        let r = self.take_recv(peer)?;
        let wc = ibv_wc {
            wr_id: r.wr_id,
            status: IBV_WC_REM_INV_REQ_ERR,
            qp_num: Qp::qpn(peer),
            ..Default::default()
        };
        let cq = self.qp(peer).recv_cq;
        self.give_back_recv(peer, r);
        self.push_cqe(cq, wc, false);
        Some((Outcome::Done(IBV_WC_SUCCESS), Some((peer, ErrCause::Fatal))))
    }

    /// rxe S17 (Rxe profile): a WRITE_WITH_IMM whose RNR retries ran out wrote every packet
    /// before the last (the one carrying the immediate, which needs the receive).
    ///
    /// # Safety
    /// `dst` and `src` are resolved and bounds-checked for `total` bytes.
    #[cold]
    #[inline(never)]
    unsafe fn rxe_write_imm_prefix(&mut self, qi: usize, dst: Seg, src: &[Seg], total: usize) {
        let qp = self.qp(qi);
        if !qp.rxe {
            return;
        }
        let mtu = qp.mtu();
        let w = (total - 1) / mtu * mtu;
        if w > 0 {
            // SAFETY: both sides hold `total` > w bytes (caller).
            unsafe { mem::scatter(&[dst], 0, src, 0, w) };
        }
    }

    /// rxe S15: the responder lost the receive completion to a full CQ and goes to ERR
    /// without acknowledging: RC ends as [`Fabric::no_answer`], UC succeeds.
    fn lost_at(
        &mut self,
        qi: usize,
        peer: usize,
        reliable: bool,
    ) -> (Outcome, Option<(usize, ErrCause)>) {
        if !reliable {
            return (Outcome::Done(IBV_WC_SUCCESS), Some((peer, ErrCause::Fatal)));
        }
        match self.no_answer(qi) {
            (Outcome::Rnr, _) => {
                // Held for ever (this QP retries for ever, so the responder's error does
                // not fail it).
                self.qp_error(peer, ErrCause::Fatal);
                (Outcome::Rnr, None)
            }
            (out, _) => (out, Some((peer, ErrCause::Fatal))),
        }
    }

    /// Whether a gather list that failed to resolve names an lkey that is no MR of `pd`
    /// (rather than an SGE outside its MR or an access fault): rxe S7.
    fn bad_lkey(&self, sges: &[ibv_sge], pd: u32) -> bool {
        sges.iter()
            .filter(|s| s.length != 0)
            .any(|s| self.mr_by_key(s.lkey).is_none_or(|m| m.prot != pd))
    }

    /// Rxe profile: an RC WRITE_WITH_IMM the responder refuses for access (a bad rkey, an
    /// address outside the MR, an MR without remote write) consumes the responder's next
    /// receive and completes it with REM_ACCESS_ERR before the QP goes to ERR and flushes
    /// the rest (issue 31, D2: what rxe0 reports). The Spec profile flushes that receive
    /// with the others (WR_FLUSH_ERR): the IBA gives the responder's receive no status of
    /// its own for a request it rejected.
    #[cold]
    fn rxe_refused_write_imm(&mut self, pi: usize) {
        if !self.qp(pi).rxe {
            return;
        }
        let Some(r) = self.take_recv(pi) else {
            return;
        };
        let cq = self.qp(pi).recv_cq;
        let mut wc = ibv_wc {
            wr_id: r.wr_id,
            status: IBV_WC_REM_ACCESS_ERR,
            qp_num: Qp::qpn(pi),
            ..Default::default()
        };
        rxe_error_wc(&mut wc);
        self.give_back_recv(pi, r);
        self.push_cqe(cq, wc, false);
    }

    /// A responder-side failure: RC gets the NAK status and the responder goes to ERR
    /// (rxe S9/S10); UC silently drops the message.
    fn remote_fail(
        &mut self,
        reliable: bool,
        peer: usize,
        status: ibv_wc_status,
    ) -> (Outcome, Option<(usize, ErrCause)>) {
        if !reliable {
            return (Outcome::Done(IBV_WC_SUCCESS), None);
        }
        let cause = if status == IBV_WC_REM_ACCESS_ERR {
            ErrCause::Access
        } else {
            ErrCause::InvalidRequest
        };
        (Outcome::Done(status), Some((peer, cause)))
    }

    fn has_recv(&mut self, pi: usize) -> bool {
        self.dv_sync_rq(pi);
        self.dv_sync_srq_of(pi);
        let qp = self.qp(pi);
        match qp.srq {
            Some(s) => self.srqs[s as usize]
                .as_ref()
                .is_some_and(|s| !s.rq.q.is_empty()),
            None => !qp.rq.q.is_empty(),
        }
    }

    #[inline(always)]
    fn take_recv(&mut self, pi: usize) -> Option<RecvEntry> {
        self.dv_sync_rq(pi);
        self.dv_sync_srq_of(pi);
        let qp = self.qp(pi);
        match qp.srq {
            None => qp.rq.q.pop_front(),
            Some(si) => {
                let srq = self.srqs[si as usize].as_mut()?;
                let r = srq.rq.q.pop_front()?;
                if srq.limit > 0 && (srq.rq.q.len() as u32) < srq.limit {
                    // ibv_modify_srq(3): the limit event fires once, then the SRQ is disarmed.
                    srq.limit = 0;
                    let (ctx, ptr) = (srq.ctx, srq.ptr.0 as usize);
                    self.raise(ctx, IBV_EVENT_SRQ_LIMIT_REACHED, ptr);
                }
                Some(r)
            }
        }
    }

    #[inline(always)]
    fn give_back_recv(&mut self, pi: usize, r: RecvEntry) {
        let qp = self.qp(pi);
        match qp.srq {
            None => qp.rq.spare.push(r),
            Some(si) => {
                if let Some(s) = self.srqs[si as usize].as_mut() {
                    s.rq.spare.push(r);
                }
            }
        }
    }

    /// Consumes the responder's next receive for a message of `len` bytes from `src`
    /// (`src` empty and `no_data` for WRITE_WITH_IMM, whose payload went to memory).
    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &mut self,
        pi: usize,
        src_qpn: u32,
        src: &[Seg],
        len: usize,
        imm: Option<u32>,
        opcode: ibv_wc_opcode,
        solicited: bool,
        no_data: bool,
    ) -> (Delivery, ibv_wc_status) {
        let Some(r) = self.take_recv(pi) else {
            return (Delivery::NoRecv, 0);
        };
        let (ppd, qpt, cq, rxe, recv_flags, src_qp_mask) = {
            let p = self.qp(pi);
            (p.prot, p.qpt, p.recv_cq, p.rxe, p.recv_flags, p.src_qp_mask)
        };
        let ud = qpt == IBV_QPT_UD;
        let mut status = IBV_WC_SUCCESS;
        let mut byte_len = len;
        if !no_data {
            let mut dst = std::mem::take(&mut self.dst_segs);
            if !self.resolve_sges(&r.sges, ppd, IBV_ACCESS_LOCAL_WRITE, &mut dst) {
                // rxe S8: a receive buffer the responder cannot write: LOC_QP_OP_ERR.
                status = if rxe {
                    IBV_WC_LOC_QP_OP_ERR
                } else {
                    IBV_WC_LOC_PROT_ERR
                };
            } else {
                let room: usize = dst.iter().map(|s| s.len).sum();
                let hdr = if ud { GRH_LEN } else { 0 };
                if len + hdr > room {
                    status = self.short_receive(rxe, ud, (src_qpn, pi, len, imm), &dst, src, room);
                } else {
                    if ud {
                        // `as_mut_ptr`: see the atomics' result bytes in execute_inner.
                        let mut grh = self.grh_bytes(src_qpn, pi, len, imm.is_some());
                        // softnic's own buffer: its own region (mem's module docs).
                        let s = [Seg::own(grh.as_mut_ptr(), GRH_LEN)];
                        // SAFETY: dst resolved and checked to hold hdr + len bytes.
                        unsafe { mem::scatter(&dst, 0, &s, 0, GRH_LEN) };
                    }
                    if let Some(limit) = self.dv_scatter_limit(pi, r.dv, qpt, len) {
                        // Responder scatter-to-CQE: the payload goes into the CQE, the
                        // receive buffer is not written (as a ConnectX does).
                        let mut b = [0u8; 64];
                        let s = [Seg::own(b.as_mut_ptr(), limit)];
                        // SAFETY: `b` holds `limit >= len` bytes; src checked by the caller.
                        unsafe { mem::scatter(&s, 0, src, 0, len) };
                        self.dv_scatter = Some((limit, b));
                    } else {
                        // SAFETY: dst resolved with room >= hdr + len; src checked by the
                        // caller.
                        unsafe { mem::scatter(&dst, hdr, src, 0, len) };
                    }
                    byte_len = len + hdr;
                }
            }
            self.dst_segs = dst;
        }
        let mut wc = ibv_wc {
            wr_id: r.wr_id,
            status,
            opcode,
            qp_num: Qp::qpn(pi),
            // rxe G4: src_qp 0 on RC/UC (the mask is 0 there in the Rxe profile).
            src_qp: src_qpn & src_qp_mask,
            ..Default::default()
        };
        if status == IBV_WC_SUCCESS {
            wc.byte_len = byte_len as u32;
            if let Some(i) = imm {
                wc.__bindgen_anon_1.imm_data = i;
                wc.wc_flags |= IBV_WC_WITH_IMM;
            }
            // IBV_WC_GRH on UD; rxe G4: on RC/UC too.
            wc.wc_flags |= recv_flags;
        } else if rxe {
            rxe_error_wc(&mut wc);
        }
        if r.dv {
            self.dv_srqn = self.dv_srqn_of(pi);
        }
        self.give_back_recv(pi, r);
        let kept = self.push_cqe(cq, wc, solicited);
        self.dv_srqn = 0;
        match status {
            IBV_WC_SUCCESS if kept || !rxe => (Delivery::Ok, status),
            // rxe S15: a receive completion lost to a full CQ moves the responder to ERR
            // (the caller does it; its flushes overflow too), and the message is not
            // acknowledged.
            IBV_WC_SUCCESS => (Delivery::Overflow, status),
            _ => (Delivery::RecvError, status),
        }
    }

    /// A message longer than the receive buffer (`room` bytes in `dst`; `msg`: the sender's
    /// QPN, the receiving QP, the length, the immediate): LOC_LEN_ERR, nothing written (man/IBA). rxe
    /// S11/S18: LOC_QP_OP_ERR, and on RC/UC the packets that fit whole (path MTU of the
    /// sender) were written before the one that did not; on UD the 40-byte GRH area is
    /// written when it fits, the payload not (issue 31, D4: rxe copies the GRH before it
    /// finds the payload too long). The man pages leave the buffer's contents undefined
    /// after an error completion: the Spec profile writes nothing, the Rxe profile what rxe
    /// writes.
    #[cold]
    #[inline(never)]
    fn short_receive(
        &self,
        rxe: bool,
        ud: bool,
        msg: (u32, usize, usize, Option<u32>),
        dst: &[Seg],
        src: &[Seg],
        room: usize,
    ) -> ibv_wc_status {
        let (src_qpn, pi, len, imm) = msg;
        if !rxe {
            return IBV_WC_LOC_LEN_ERR;
        }
        if ud && room >= GRH_LEN {
            let mut grh = self.grh_bytes(src_qpn, pi, len, imm.is_some());
            let s = [Seg::own(grh.as_mut_ptr(), GRH_LEN)];
            // SAFETY: dst resolved with room >= GRH_LEN bytes; `grh` is softnic's own buffer.
            unsafe { mem::scatter(dst, 0, &s, 0, GRH_LEN) };
        }
        if !ud {
            let mtu = self.qp_idx_by_qpn(src_qpn).map_or(ACTIVE_MTU, |s| {
                self.qps[s].as_ref().map_or(ACTIVE_MTU, |q| q.mtu())
            });
            let w = room / mtu * mtu;
            if w > 0 {
                // SAFETY: dst resolved with room >= w bytes; src holds more than room
                // bytes, checked by the caller.
                unsafe { mem::scatter(dst, 0, src, 0, w) };
            }
        }
        IBV_WC_LOC_QP_OP_ERR
    }

    /// The 40-byte GRH area of a UD receive: as rxe writes it for RoCE v2 over IPv4, 20
    /// zero bytes then the IPv4 header (rxe S18), in both profiles. The header is the
    /// packet's: its total length counts IPv4 (20) + UDP (8) + BTH (12) + DETH (8), the
    /// immediate (4) when there is one, the payload padded to 4 bytes, and the ICRC (4);
    /// don't-fragment is set (issue 31, D3: rxe0 wrote 52 + pad4(len) + 4 with immediate,
    /// DF set, where softnic had counted neither DETH nor the pad). The Spec profile writes
    /// the header checksum, as on the wire; the Rxe profile leaves it 0, as rxe0 does.
    fn grh_bytes(&self, src_qpn: u32, dst_qi: usize, len: usize, imm: bool) -> [u8; GRH_LEN] {
        let mut g = [0u8; GRH_LEN];
        let sip = self
            .qp_idx_by_qpn(src_qpn)
            .and_then(|i| self.qps[i].as_ref())
            .map_or([0; 4], |q| self.ctx_dev(q.ctx).ipv4);
        let dip = self.qps[dst_qi]
            .as_ref()
            .map_or([0; 4], |q| self.ctx_dev(q.ctx).ipv4);
        let ip = &mut g[20..];
        ip[0] = 0x45;
        // IPv4 + UDP + BTH + DETH (+ ImmDt) + payload and pad + ICRC.
        let tot = (20 + 8 + 12 + 8 + if imm { 4 } else { 0 } + len.next_multiple_of(4) + 4) as u16;
        ip[2..4].copy_from_slice(&tot.to_be_bytes());
        ip[6] = 0x40; // flags: don't fragment
        ip[8] = 64; // TTL
        ip[9] = 17; // UDP
        ip[12..16].copy_from_slice(&sip);
        ip[16..20].copy_from_slice(&dip);
        if self.qps[dst_qi].as_ref().is_some_and(|q| q.rxe) {
            // rxe leaves the header checksum 0 in the receive buffer (seen on rxe0), and
            // numbers its packets (the ID, here 0: it varies from packet to packet there).
            return g;
        }
        let mut sum = 0u32;
        for c in ip.chunks(2) {
            sum += u16::from_be_bytes([c[0], c[1]]) as u32;
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        g
    }

    /// UD send: resolves the AH, checks the Q_Key and delivers to one QP or to every member
    /// of a multicast group. Unreliable: the sender always succeeds.
    fn ud_send(&mut self, qi: usize, e: &SendEntry, src: &[Seg], total: usize) -> ibv_wc_status {
        let qpd = self.qp(qi).prot;
        let Some(ah) = self.ahs.get(e.ah as usize).and_then(|a| a.as_ref()) else {
            return IBV_WC_LOC_QP_OP_ERR;
        };
        if ah.prot != qpd {
            return IBV_WC_LOC_QP_OP_ERR;
        }
        // SAFETY: raw is always a valid view of the 16-byte union.
        let dgid = unsafe { ah.attr.grh.dgid.raw };
        if total > ACTIVE_MTU {
            // rxe S18: a UD message larger than the path MTU is silently dropped.
            return IBV_WC_SUCCESS;
        }
        let (own_qkey, rxe) = (self.qp(qi).attr.qkey, self.qp(qi).rxe);
        // IBA: a remote Q_Key with the high bit set means the sending QP's own. rxe sends the
        // value as it is, so such a datagram meets the target's Q_Key only if that is the
        // value itself (issue 31, D1: rxe0 dropped it, softnic delivered it).
        let qkey = if e.remote_qkey & 0x8000_0000 != 0 && !rxe {
            own_qkey
        } else {
            e.remote_qkey
        };
        let imm = (e.opcode == IBV_WR_SEND_WITH_IMM).then_some(e.imm);
        let sol = e.flags & IBV_SEND_SOLICITED != 0;
        let mut targets = std::mem::take(&mut self.scratch_waiters);
        targets.clear();
        if is_mcast_gid(&dgid) && e.remote_qpn == MCAST_QPN {
            if let Some(g) = self.mcast.get(&dgid) {
                targets.extend(g.iter().copied().filter(|&q| q != Qp::qpn(qi)));
            }
        } else if let Some(t) = self.qp_idx_by_qpn(e.remote_qpn) {
            // The AH must name the target's port (one of its GIDs).
            let tctx = self.qp(t).ctx;
            let dev = self.ctx_dev(tctx);
            if dev.gid(0) == Some(dgid) || dev.gid(1) == Some(dgid) {
                targets.push(e.remote_qpn);
            }
        }
        for &tq in &targets {
            let Some(t) = self.qp_idx_by_qpn(tq) else {
                continue;
            };
            let (tt, ts, tk) = {
                let q = self.qp(t);
                (q.qpt, q.state, q.attr.qkey)
            };
            if tt != IBV_QPT_UD || !ok_state_for_recv(ts) || tk != qkey {
                continue; // dropped (rxe S18: wrong Q_Key or QPN -> nothing)
            }
            if let (Delivery::RecvError | Delivery::Overflow, _) =
                self.deliver(t, Qp::qpn(qi), src, total, imm, IBV_WC_RECV, sol, false)
            {
                // rxe S18: a too-short UD receive completes in error and the UD QP goes to
                // ERR. (Rxe profile: a receive completion lost to a full CQ too, S15.)
                self.qp_error(t, ErrCause::Fatal);
            }
        }
        self.scratch_waiters = targets;
        IBV_WC_SUCCESS
    }

    // ------------------------------------------------------------------ modify_qp

    /// `ibv_modify_qp(3)`.
    pub(crate) fn modify_qp(&mut self, qi: usize, attr: &ibv_qp_attr, mask: u32) -> i32 {
        let (ctx, cur, qpt) = {
            let q = self.qp(qi);
            (q.ctx, q.state, q.qpt)
        };
        let (max_rd_atom, dev_gids) = (self.cfg(ctx).max_qp_rd_atom, GID_TBL_LEN);
        if mask & IBV_QP_CUR_STATE != 0 && attr.cur_qp_state != cur {
            return libc::EINVAL;
        }
        let next = if mask & IBV_QP_STATE != 0 {
            attr.qp_state
        } else {
            cur
        };
        let Some((req, opt)) = transition(cur, next, qpt) else {
            return libc::EINVAL;
        };
        let m = mask & !(IBV_QP_STATE | IBV_QP_CUR_STATE);
        if m & req != req || m & !(req | opt) != 0 {
            return libc::EINVAL;
        }
        if m & IBV_QP_PORT != 0 && attr.port_num != 1 {
            return libc::EINVAL;
        }
        if m & IBV_QP_AV != 0 {
            // RoCE: the address vector must carry a GRH (rxe S20: is_global=0 -> EINVAL).
            if attr.ah_attr.is_global == 0 {
                return libc::EINVAL;
            }
            if attr.ah_attr.grh.sgid_index as u32 >= dev_gids {
                return libc::ENODATA;
            }
        }
        if m & IBV_QP_TIMEOUT != 0 && attr.timeout > 31 {
            return libc::EINVAL;
        }
        if m & IBV_QP_MAX_QP_RD_ATOMIC != 0 && attr.max_rd_atomic as u32 > max_rd_atom {
            return libc::EINVAL;
        }
        // max_dest_rd_atomic is stored unvalidated, as rxe does (S20: 200 is accepted).
        {
            let a = &mut self.qp(qi).attr;
            macro_rules! take {
                ($bit:expr, $($f:ident),+) => {
                    if m & $bit != 0 { $(a.$f = attr.$f;)+ }
                };
            }
            take!(IBV_QP_ACCESS_FLAGS, qp_access_flags);
            take!(IBV_QP_PKEY_INDEX, pkey_index);
            take!(IBV_QP_PORT, port_num);
            take!(IBV_QP_QKEY, qkey);
            take!(IBV_QP_AV, ah_attr);
            take!(IBV_QP_PATH_MTU, path_mtu);
            take!(IBV_QP_TIMEOUT, timeout);
            take!(IBV_QP_RETRY_CNT, retry_cnt);
            take!(IBV_QP_RNR_RETRY, rnr_retry);
            take!(IBV_QP_RQ_PSN, rq_psn);
            take!(IBV_QP_MAX_QP_RD_ATOMIC, max_rd_atomic);
            take!(
                IBV_QP_ALT_PATH,
                alt_ah_attr,
                alt_pkey_index,
                alt_port_num,
                alt_timeout
            );
            take!(IBV_QP_MIN_RNR_TIMER, min_rnr_timer);
            take!(IBV_QP_SQ_PSN, sq_psn);
            take!(IBV_QP_MAX_DEST_RD_ATOMIC, max_dest_rd_atomic);
            take!(IBV_QP_PATH_MIG_STATE, path_mig_state);
            take!(IBV_QP_DEST_QPN, dest_qp_num);
        }
        if next == cur {
            if cur == IBV_QPS_ERR && self.qp(qi).rxe {
                // rxe G9/S2: receives posted in ERR are flushed by ERR->ERR.
                self.flush_rq(qi);
            }
            return 0;
        }
        match next {
            IBV_QPS_ERR => self.qp_error(qi, ErrCause::Modify),
            IBV_QPS_RESET => self.reset_qp(qi),
            _ => {
                let q = self.qp(qi);
                q.state = next;
                // SAFETY: the ABI struct lives until destroy_qp (which takes the lock).
                unsafe { (*q.ptr.0).state = next };
                if next == IBV_QPS_RTR {
                    // A responder that becomes ready may have waiters (loopback or re-setup).
                    self.kick_waiters(Some(Qp::qpn(qi)), None);
                }
            }
        }
        0
    }

    /// To RESET: queues emptied without completions (ibv_modify_qp(3), rxe S14).
    pub(crate) fn reset_qp(&mut self, qi: usize) {
        let qpn = Qp::qpn(qi);
        let q = self.qp(qi);
        q.state = IBV_QPS_RESET;
        // SAFETY: the ABI struct lives until destroy_qp.
        unsafe { (*q.ptr.0).state = IBV_QPS_RESET };
        q.rq.clear();
        while let Some(e) = q.pending.pop_front() {
            q.spare.push(e);
        }
        q.sq_posted = 0;
        q.sq_released = 0;
        q.held_pre_rts = false;
        q.epoch = q.epoch.wrapping_add(1);
        if let Some(d) = q.dv.as_deref_mut() {
            d.reset();
        }
        self.rnr_waiting.retain(|&w| w as usize != qi);
        self.fail_waiters_on(qpn);
    }

    /// Removes a QP: waiting requesters on it fail, CQEs it left are purged (as mlx5's
    /// `cq_clean`), multicast memberships dropped.
    pub(crate) fn remove_qp(&mut self, qi: usize) -> Box<Qp> {
        let qpn = Qp::qpn(qi);
        self.rnr_waiting.retain(|&w| w as usize != qi);
        let q = self.qps[qi].take().expect("live QP");
        self.fail_waiters_on(qpn);
        for g in self.mcast.values_mut() {
            g.retain(|&m| m != qpn);
        }
        self.mcast.retain(|_, g| !g.is_empty());
        for cq in [q.send_cq, q.recv_cq] {
            if let Some(Some(c)) = self.cqs.get_mut(cq as usize) {
                c.ring.retain(|(wc, _)| wc.qp_num != qpn);
                c.publish();
            }
        }
        q
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new_qp_struct(
        ctx: u32,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        srq: Option<u32>,
        init: &ibv_qp_init_attr,
        cap: ibv_qp_cap,
        ptr: *mut ibv_qp,
    ) -> Qp {
        Qp {
            ctx,
            pd,
            prot: pd,
            send_cq,
            recv_cq,
            srq,
            qpt: init.qp_type,
            state: IBV_QPS_RESET,
            sq_sig_all: init.sq_sig_all != 0,
            cap,
            attr: ibv_qp_attr::default(),
            qp_context: init.qp_context as usize,
            sq_posted: 0,
            sq_released: 0,
            epoch: 0,
            pending: VecDeque::with_capacity(Self::send_entries(&cap)),
            spare: (0..Self::send_entries(&cap))
                .map(|_| {
                    Box::new(SendEntry {
                        sges: Vec::with_capacity(cap.max_send_sge.max(1) as usize),
                        data: Vec::with_capacity(cap.max_inline_data as usize),
                        ..SendEntry::default()
                    })
                })
                .collect(),
            rq: RecvQueue::new(cap.max_recv_wr, cap.max_recv_sge),
            mcast: 0,
            ptr: Ptr(ptr),
            inline_limit: cap.max_inline_data,
            atomics: true,
            rxe: false,
            held_pre_rts: false,
            recv_flags: if init.qp_type == IBV_QPT_UD {
                IBV_WC_GRH
            } else {
                0
            },
            src_qp_mask: u32::MAX,
            dv: None,
            mlx5: false,
        }
    }

    /// Send entries a QP provisions at creation: one per SQ slot (up to [`PREALLOC_WRS`]),
    /// plus the one being executed.
    fn send_entries(cap: &ibv_qp_cap) -> usize {
        (cap.max_send_wr as usize).min(PREALLOC_WRS) + 1
    }

    pub(crate) fn new_srq_rq(max_wr: u32, max_sge: u32) -> RecvQueue {
        RecvQueue::new(max_wr, max_sge)
    }

    /// Sizes the shared gather/scatter scratch lists for WRs of up to `sges` SGEs, so that
    /// executing a WR never allocates (called when a QP or SRQ is created).
    pub(crate) fn provision_scratch(&mut self, sges: u32) {
        let n = sges.max(1) as usize;
        self.src_segs.reserve(n.saturating_sub(self.src_segs.len()));
        self.dst_segs.reserve(n.saturating_sub(self.dst_segs.len()));
    }
}

/// The QP state table of the IBA as the kernel's `ib_modify_qp_is_ok` encodes it (and rxe
/// enforces, fault-truth S20): `(required, optional)` attribute masks, without STATE /
/// CUR_STATE, or `None` for an invalid transition. SQD/SQE are not modelled.
fn transition(cur: ibv_qp_state, next: ibv_qp_state, qpt: ibv_qp_type) -> Option<(u32, u32)> {
    let ud = qpt == IBV_QPT_UD;
    let rc = qpt == IBV_QPT_RC;
    let init_attrs = if ud {
        IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY
    } else {
        IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
    };
    Some(match (cur, next) {
        (IBV_QPS_RESET, IBV_QPS_RESET) => (0, 0),
        (IBV_QPS_RESET, IBV_QPS_INIT) => (init_attrs, 0),
        (IBV_QPS_INIT, IBV_QPS_INIT) => (0, init_attrs),
        (IBV_QPS_INIT, IBV_QPS_RTR) => {
            if ud {
                (0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY)
            } else {
                let base = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
                let req = if rc {
                    base | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER
                } else {
                    base
                };
                (
                    req,
                    IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX,
                )
            }
        }
        (IBV_QPS_RTR, IBV_QPS_RTS) => {
            if ud {
                (IBV_QP_SQ_PSN, IBV_QP_QKEY)
            } else if rc {
                (
                    IBV_QP_SQ_PSN
                        | IBV_QP_TIMEOUT
                        | IBV_QP_RETRY_CNT
                        | IBV_QP_RNR_RETRY
                        | IBV_QP_MAX_QP_RD_ATOMIC,
                    IBV_QP_ALT_PATH
                        | IBV_QP_ACCESS_FLAGS
                        | IBV_QP_MIN_RNR_TIMER
                        | IBV_QP_PATH_MIG_STATE,
                )
            } else {
                (
                    IBV_QP_SQ_PSN,
                    IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE,
                )
            }
        }
        (IBV_QPS_RTS, IBV_QPS_RTS) => {
            if ud {
                (0, IBV_QP_QKEY)
            } else if rc {
                (
                    0,
                    IBV_QP_ACCESS_FLAGS
                        | IBV_QP_ALT_PATH
                        | IBV_QP_PATH_MIG_STATE
                        | IBV_QP_MIN_RNR_TIMER,
                )
            } else {
                (
                    0,
                    IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE,
                )
            }
        }
        (IBV_QPS_INIT | IBV_QPS_RTR | IBV_QPS_RTS | IBV_QPS_ERR, IBV_QPS_ERR) => (0, 0),
        (IBV_QPS_INIT | IBV_QPS_RTR | IBV_QPS_RTS | IBV_QPS_ERR, IBV_QPS_RESET) => (0, 0),
        _ => return None,
    })
}
