//! [`RecvRing`]: receives preposted into fixed-size slots of one registered region.
//!
//! # Invariants (this module owns raw pointers)
//! - Slot `i` is `region.addr + i * slot_len .. + slot_len`; `wrs[i].sg_list` is rewritten
//!   to `&sges[i]` at every re-post, so the ring may move between calls.
//! - Every slot `< count` is in exactly one state: `POSTED` (owned by the NIC), `HELD`
//!   (a [`Received`] exists for it), `PENDING` (in `pending[..npending]`, to be re-posted)
//!   or `IDLE` (its receive failed, e.g. flushed; re-posted by [`RecvRing::reset`]).
//! - The region's bytes of a slot are read (as `&[u8]`) only while it is `HELD`: the NIC
//!   writes only `POSTED` slots.
//! - A [`Received`] carries the brand of the ring that made it (unique per ring in the
//!   process) and exists only for a `HELD` slot; `data` and `release` check both, so a
//!   `Received` of another ring can neither read nor re-post anything.
//! - A completion is accepted only if its `wr_id` bits 63..32 equal the ring's id, the
//!   receive kind bit and the current generation, its QP number is the ring's QP (for a
//!   QP target), and its slot is `POSTED`; an accepted completion is consumed
//!   ([`Completion`]s are not `Copy`), so it cannot be given twice.
//! - The NIC owns a `POSTED` slot until its completion or until the target QP is reset or
//!   destroyed, whatever happens to the ring: dropping the ring does not take receives
//!   back, so [`RecvRing::new`]'s contract on the region lasts until then (the setup
//!   layer's safe bridge models that as a lease of the region to the QP).

use core::mem::MaybeUninit;
use core::ptr::{self, addr_of_mut};
use core::sync::atomic::{AtomicUsize, Ordering};

use hotverbs_ffi::inline::{ibv_post_recv, ibv_post_srq_recv};
use hotverbs_ffi::*;

use crate::cq::Completion;
use crate::desc::LocalBuf;
use crate::error::{ConfigError, PostError, RecvError, ReleaseError};
use crate::wr_id;

const IDLE: u8 = 0;
const POSTED: u8 = 1;
const HELD: u8 = 2;
const PENDING: u8 = 3;

/// Source of ring brands (see [`Received`]): one per ring built, never reused.
static NEXT_BRAND: AtomicUsize = AtomicUsize::new(1);

/// Where receives are posted.
///
/// `repr(C, u8)`: the QP (or SRQ) pointer is the first field of every variant, at one
/// offset, so the verbs post finds it without a branch per variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[repr(C, u8)]
pub enum RecvTarget {
    /// A QP's receive queue (`ibv_post_recv(3)`).
    Qp(*mut ibv_qp),
    /// A shared receive queue (`ibv_post_srq_recv(3)`).
    Srq(*mut ibv_srq),
    /// A ConnectX receive queue written directly (issue 30): each repost writes receive
    /// WQEs into the queue `desc` describes ([`DirectRq`](crate::mlx5::DirectRq)) and
    /// publishes them with one store barrier and one doorbell-record store, no
    /// `ibv_post_recv`. `qp` is the QP (its number, for routing), `head` where its
    /// receive counter stands (libmlx5's `rq.head`: 0 for a QP nothing posted receives
    /// to). The completions come from a [`DirectPoller`](crate::mlx5::DirectPoller) the
    /// queue is [`attach_rq`](crate::mlx5::DirectPoller::attach_rq)ed to, with the
    /// `wr_id`s this ring wrote into `desc.wrid`. Only where the target has the hardware
    /// doorbell ([`Mmio::available`](crate::mlx5::Mmio::available)): elsewhere the ring
    /// refuses it ([`ConfigError::Null`]).
    Mlx5 {
        /// The QP.
        qp: *mut ibv_qp,
        /// Its receive queue, as `mlx5dv_init_obj(3)` describes it.
        desc: crate::mlx5::DirectRqDesc,
        /// Receives posted to it so far (wrapping).
        head: u32,
    },
    /// A ConnectX SRQ written directly (issue 30): each repost writes SRQ WQEs
    /// ([`DirectSrq`](crate::mlx5::DirectSrq): the linked list and free bitmap) and
    /// publishes them with one barrier and one counter store. The completions come from a
    /// [`DirectPoller`](crate::mlx5::DirectPoller) the SRQ is
    /// [`attach_srq`](crate::mlx5::DirectPoller::attach_srq)ed to, which frees each
    /// completed WQE in the bitmap. At most `nwqes - 1` slots (the device never takes the
    /// last linked WQE). Only where the target has the hardware doorbell.
    Mlx5Srq {
        /// The SRQ.
        srq: *mut ibv_srq,
        /// Its queue, as `mlx5dv_init_obj(3)` describes it, with the owner's `wrid` table
        /// and bitmap.
        desc: crate::mlx5::DirectSrqDesc,
        /// libmlx5's `head`, `tail` and post counter when the ring takes over.
        head: u32,
        /// See `head`.
        tail: u32,
        /// See `head`.
        counter: u16,
    },
}

/// The queue a direct [`RecvRing`] writes.
#[derive(Debug)]
enum DirectQueue {
    Rq(crate::mlx5::DirectRq<crate::mlx5::Mmio>),
    Srq(crate::mlx5::DirectSrq<crate::mlx5::Mmio>),
}

/// Configuration of a [`RecvRing`].
#[derive(Clone, Copy, Debug)]
pub struct RecvConfig {
    ring_id: u8,
    slot_len: u32,
    count: u32,
    repost_batch: u32,
}

impl RecvConfig {
    /// `count` slots (at most the RQ/SRQ's `max_wr` and the ring's `N`) of `slot_len` bytes
    /// each; released slots are re-posted in chains of 16 (or `count`, if smaller). On the
    /// setup layer prefer [`slots`](Self::slots): it assigns the ring id and can derive the
    /// count.
    pub const fn new(ring_id: u8, slot_len: u32, count: u32) -> Self {
        Self::slots(slot_len).with_ring_id(ring_id).count(count)
    }

    /// Slots of `slot_len` bytes, as many as the setup layer finds room for: `hotverbs`'
    /// `Qp::recv_ring::<N>` / `Srq::recv_ring::<N>` take `min(N, the queue's max_wr, the
    /// slots the region holds after the offset)` and assign the ring id. A raw datapath
    /// ring needs the count said ([`count`](Self::count)).
    pub const fn slots(slot_len: u32) -> Self {
        Self {
            ring_id: 0,
            slot_len,
            count: 0,
            repost_batch: 0,
        }
    }

    /// `c` slots (at most the queue's `max_wr` and the ring's `N`).
    pub const fn count(mut self, c: u32) -> Self {
        self.count = c;
        self
    }

    /// The settings a ring is built from: the re-post chain's default (16, or the count if
    /// smaller) filled in.
    pub(crate) const fn resolved(mut self) -> Self {
        if self.repost_batch == 0 {
            self.repost_batch = if self.count < 16 { self.count } else { 16 };
        }
        self
    }

    /// The slot size.
    pub const fn slot_len_of(&self) -> u32 {
        self.slot_len
    }

    /// Re-post once `b` slots are released (`1..=count`; 1 re-posts each release; default,
    /// or 0: 16, or the count if smaller).
    pub const fn repost_batch(mut self, b: u32) -> Self {
        self.repost_batch = b;
        self
    }

    /// The same configuration with another ring id (a setup layer that hands out ring ids
    /// per CQ sets it).
    pub const fn with_ring_id(mut self, ring_id: u8) -> Self {
        self.ring_id = ring_id;
        self
    }

    /// Bytes the slots need: `count * slot_len`.
    pub const fn region_len(&self) -> u64 {
        self.count as u64 * self.slot_len as u64
    }

    /// The number of slots.
    pub const fn count_of(&self) -> u32 {
        self.count
    }
}

/// A message received in place; give it back with [`RecvRing::release`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "release the slot or it is never re-posted"]
pub struct Received {
    /// The brand of the ring that made it.
    brand: usize,
    slot: u32,
    byte_len: u32,
    /// Bytes of this message in the slot (0 for RDMA WRITE_WITH_IMM, whose data went to the
    /// remote buffer and not to the receive).
    in_slot: u32,
    imm: Option<u32>,
    src_qp: u32,
}

impl Received {
    /// The slot index.
    #[inline(always)]
    pub fn slot(&self) -> u32 {
        self.slot
    }
    /// `byte_len` of the completion: the message length (for RDMA WRITE_WITH_IMM the length
    /// written to the remote buffer, while the slot itself holds nothing). For UD it
    /// includes the 40-byte GRH.
    #[inline(always)]
    pub fn byte_len(&self) -> u32 {
        self.byte_len
    }
    /// Immediate data in host order, if any.
    #[inline(always)]
    pub fn imm(&self) -> Option<u32> {
        self.imm
    }
    /// The sending QP (meaningful for UD and SRQ).
    #[inline(always)]
    pub fn src_qp(&self) -> u32 {
        self.src_qp
    }
}

/// `N` receive slots (N a power of two; `count <= N` are used) of one registered region.
///
/// # References
/// `ibv_post_recv(3)`, `ibv_post_srq_recv(3)`.
pub struct RecvRing<const N: usize> {
    wrs: [ibv_recv_wr; N],
    sges: [ibv_sge; N],
    state: [u8; N],
    pending: [u32; N],
    npending: u32,
    posted: u32,
    held: u32,
    /// Receives the device gave back (completions accepted, plus the ones a QP reset
    /// discarded): the `retired` of [`progress`](RecvRing::progress).
    completed: u64,
    count: u32,
    repost_batch: u32,
    slot_len: u32,
    /// Ring id (63..56), receive bit (55) and generation (54..32): the high half of every
    /// `wr_id` this ring posts now. `reset` (on a QP) bumps the generation: completions of
    /// receives posted before it carry an older value and are recognised as stale although
    /// their slot is reused. The first generation is drawn from the ring's brand, so rings
    /// that share a ring id (on different CQs) differ in it too.
    tag: u64,
    /// The QP's number for a QP target (a completion of another QP is never this ring's);
    /// 0 for an SRQ, whose receives complete on any QP attached to it.
    qp_num: u32,
    /// Unique per ring: stamps every [`Received`] it makes.
    brand: usize,
    region: LocalBuf,
    target: RecvTarget,
    /// The queue a [`RecvTarget::Mlx5`] / [`RecvTarget::Mlx5Srq`] ring writes; `None` for
    /// the others.
    direct: Option<DirectQueue>,
}

/// `wr_id` layout of a receive: ring id (63..56), receive bit (55), generation (54..32),
/// slot (31..0).
const GEN_SHIFT: u32 = 32;
const GEN_MASK: u64 = (1 << 23) - 1;
/// The generation bits in place.
const GEN_BITS: u64 = GEN_MASK << GEN_SHIFT;

// SAFETY: the ring owns its arrays; the QP/SRQ pointer is used only through the post verbs,
// which may be called from any thread (one caller at a time: `&mut self`).
unsafe impl<const N: usize> Send for RecvRing<N> {}

impl<const N: usize> core::fmt::Debug for RecvRing<N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RecvRing")
            .field("ring_id", &self.ring_id())
            .field("qp_num", &self.qp_num)
            .field("count", &self.count)
            .field("slot_len", &self.slot_len)
            .field("posted", &self.posted)
            .field("held", &self.held)
            .field("pending", &self.npending)
            .finish_non_exhaustive()
    }
}

/// The body of [`RecvRing::on_completion`] on ring `$s` and completion `$c` (see
/// `on_completion_cold` for why it is a macro).
macro_rules! accept {
    ($s:ident, $c:ident) => {{
        let slot = $c.wr_id() & 0xFFFF_FFFF;
        // One compare for ring id, kind and generation, one for the QP: another ring's
        // completion (send or receive, this CQ or another) or a stale one never turns a
        // slot the NIC still owns into a HELD one.
        if ($c.wr_id() ^ $s.tag) >> GEN_SHIFT != 0
            || ($s.qp_num != 0 && $c.qp_num() != $s.qp_num)
            || slot >= $s.count as u64
            || $s.state[slot as usize & Self::MASK] != POSTED
        {
            return Err($s.refuse($c));
        }
        $c.take();
        let i = slot as usize & Self::MASK;
        $s.posted -= 1;
        $s.completed += 1;
        match $c.status() {
            Ok(()) => {
                $s.state[i] = HELD;
                $s.held += 1;
                Ok(Received {
                    brand: $s.brand,
                    slot: slot as u32,
                    byte_len: $c.byte_len(),
                    in_slot: if $c.opcode() == IBV_WC_RECV_RDMA_WITH_IMM {
                        0
                    } else {
                        $c.byte_len()
                    },
                    imm: $c.imm(),
                    src_qp: $c.src_qp(),
                })
            }
            Err(error) => {
                $s.state[i] = IDLE;
                Err(RecvError::Completion {
                    slot: slot as u32,
                    error,
                })
            }
        }
    }};
}

impl<const N: usize> RecvRing<N> {
    const MASK: usize = {
        // Checked by the constructor (a named ConfigError, see SendRing's MASK).
        N.wrapping_sub(1)
    };

    /// A ring whose slots cut `region` into `cfg.count` pieces of `cfg.slot_len` bytes.
    /// Nothing is posted until [`fill`](Self::fill).
    ///
    /// # Safety
    /// `target` is a live QP or SRQ that outlives the ring and whose receives are posted by
    /// this ring only; `region` is registered memory with `IBV_ACCESS_LOCAL_WRITE` that
    /// nothing else reads or writes, and that stays valid, for as long as the device may
    /// write it: while the ring lives (it hands out `&[u8]` views of held slots) **and
    /// after it is dropped, until every receive it posted has completed or the target QP
    /// (every QP using the SRQ) has been reset or destroyed** — dropping the ring does not
    /// take its posted receives back. `cfg`'s ring id is unique among the rings (send and
    /// receive) whose completions share a CQ: it is what tells this ring's completions
    /// from the others' (a flushed receive has opcode 0 on rxe, so the opcode cannot).
    pub unsafe fn new(
        target: RecvTarget,
        region: LocalBuf,
        cfg: RecvConfig,
    ) -> Result<Self, ConfigError> {
        let mut slot = MaybeUninit::uninit();
        // SAFETY: forwarded contract.
        unsafe { Self::init_in(&mut slot, target, region, cfg)? };
        // SAFETY: init_in returned Ok, so every field is initialised.
        Ok(unsafe { slot.assume_init() })
    }

    /// [`new`](Self::new) on the heap: the ring is built in place in a
    /// `Box::new_uninit` with [`init_in`](Self::init_in), so a large ring never passes
    /// through the stack. `std` feature only (the datapath allocates nothing otherwise).
    ///
    /// # Safety
    /// As [`new`](Self::new).
    #[cfg(feature = "std")]
    pub unsafe fn new_boxed(
        target: RecvTarget,
        region: LocalBuf,
        cfg: RecvConfig,
    ) -> Result<std::boxed::Box<Self>, ConfigError> {
        let mut b = std::boxed::Box::<Self>::new_uninit();
        // SAFETY: forwarded contract.
        unsafe { Self::init_in(&mut b, target, region, cfg)? };
        // SAFETY: init_in returned Ok, so every field is initialised.
        Ok(unsafe { b.assume_init() })
    }

    /// Builds the ring in place (a `Box::new_uninit`, a `static`, ...): large rings never
    /// pass through the stack.
    ///
    /// # Safety
    /// As [`new`](Self::new).
    pub unsafe fn init_in(
        slot: &mut MaybeUninit<Self>,
        target: RecvTarget,
        region: LocalBuf,
        cfg: RecvConfig,
    ) -> Result<&mut Self, ConfigError> {
        let _ = Self::MASK;
        // N is a constant: this folds away for every power of two.
        if !N.is_power_of_two() {
            return Err(ConfigError::RingSize { n: N });
        }
        let null = match target {
            RecvTarget::Qp(q) | RecvTarget::Mlx5 { qp: q, .. } => q.is_null(),
            RecvTarget::Srq(s) | RecvTarget::Mlx5Srq { srq: s, .. } => s.is_null(),
        };
        if null {
            return Err(ConfigError::Null);
        }
        let direct = match target {
            RecvTarget::Mlx5 { desc, head, .. } => {
                let Some(mmio) = crate::mlx5::Mmio::available() else {
                    return Err(ConfigError::Null);
                };
                // SAFETY: the caller's contract (`new`): the queue is live, this ring's
                // alone, and outlives the ring.
                let rq = unsafe { crate::mlx5::DirectRq::new(desc, head, mmio) }
                    .map_err(|_| ConfigError::Null)?;
                // A slot per WQE at most: the queue never holds more than the ring posts.
                if cfg.count > rq.capacity() || rq.max_segs() == 0 {
                    return Err(ConfigError::Slots);
                }
                Some(DirectQueue::Rq(rq))
            }
            RecvTarget::Mlx5Srq {
                desc,
                head,
                tail,
                counter,
                ..
            } => {
                let Some(mmio) = crate::mlx5::Mmio::available() else {
                    return Err(ConfigError::Null);
                };
                // SAFETY: the caller's contract (`new`): the SRQ is live, this ring's alone
                // (its wrid table and bitmap too), and outlives the ring.
                let q = unsafe { crate::mlx5::DirectSrq::new(desc, head, tail, counter, mmio) }
                    .map_err(|_| ConfigError::Null)?;
                // The device never takes the last linked WQE: nwqes - 1 receives at most.
                if cfg.count >= desc.nwqes || q.max_segs() == 0 {
                    return Err(ConfigError::Slots);
                }
                Some(DirectQueue::Srq(q))
            }
            _ => None,
        };
        if cfg.count == 0 {
            return Err(ConfigError::Unresolved);
        }
        let cfg = cfg.resolved();
        if cfg.slot_len == 0
            || cfg.count as usize > N
            || cfg.count as u64 * cfg.slot_len as u64 > region.len as u64
        {
            return Err(ConfigError::Slots);
        }
        if cfg.repost_batch == 0 || cfg.repost_batch > cfg.count {
            return Err(ConfigError::Batch);
        }
        let qp_num = match target {
            // SAFETY: a live QP (the caller's contract); qp_num is set at creation.
            RecvTarget::Qp(q) | RecvTarget::Mlx5 { qp: q, .. } => unsafe { (*q).qp_num },
            _ => 0,
        };
        let brand = NEXT_BRAND.fetch_add(1, Ordering::Relaxed);
        // Spread consecutive brands over the generation space (a 23-bit Weyl sequence), so
        // a ring's first generations are far from the next ring's.
        let generation = (brand as u64).wrapping_mul(0x0029_E377) as u32;
        let p = slot.as_mut_ptr();
        // SAFETY: p points to writable storage for Self. The arrays are zeroed in place
        // (all-zero is a valid ibv_recv_wr / ibv_sge / IDLE state / slot index) and every
        // other field is written before the reference is made, so no large value passes
        // through the stack.
        let ring = unsafe {
            addr_of_mut!((*p).wrs).write_bytes(0, 1);
            addr_of_mut!((*p).sges).write_bytes(0, 1);
            addr_of_mut!((*p).state).write_bytes(IDLE, 1);
            addr_of_mut!((*p).pending).write_bytes(0, 1);
            addr_of_mut!((*p).npending).write(0);
            addr_of_mut!((*p).posted).write(0);
            addr_of_mut!((*p).held).write(0);
            addr_of_mut!((*p).completed).write(0);
            addr_of_mut!((*p).count).write(cfg.count);
            addr_of_mut!((*p).repost_batch).write(cfg.repost_batch);
            addr_of_mut!((*p).slot_len).write(cfg.slot_len);
            addr_of_mut!((*p).tag).write(wr_id::encode_recv(cfg.ring_id, generation, 0));
            addr_of_mut!((*p).qp_num).write(qp_num);
            addr_of_mut!((*p).brand).write(brand);
            addr_of_mut!((*p).region).write(region);
            addr_of_mut!((*p).target).write(target);
            addr_of_mut!((*p).direct).write(direct);
            &mut *p
        };
        for i in 0..cfg.count as usize {
            ring.wrs[i].wr_id = ring.tag | i as u64;
            ring.wrs[i].num_sge = 1;
            ring.sges[i] = ibv_sge {
                addr: region.addr + i as u64 * cfg.slot_len as u64,
                length: cfg.slot_len,
                lkey: region.lkey,
            };
        }
        Ok(ring)
    }

    /// Queues every idle slot and posts them all (initially: all `count` slots).
    pub fn fill(&mut self) -> Result<usize, PostError> {
        for i in 0..self.count {
            if self.state[i as usize] == IDLE {
                self.queue(i);
            }
        }
        self.repost()
    }

    #[inline(always)]
    fn queue(&mut self, slot: u32) {
        self.state[slot as usize & Self::MASK] = PENDING;
        self.pending[self.npending as usize & Self::MASK] = slot;
        self.npending += 1;
    }

    /// Turns a receive completion of this ring into a [`Received`] (the slot is now held by
    /// the caller), or an error: a failed receive leaves its slot idle. The completion is
    /// consumed when accepted (given again, it is [`RecvError::Stale`]).
    ///
    /// # Errors
    /// - [`RecvError::Completion`]: the receive failed (its slot is idle).
    /// - [`RecvError::Stale`]: a completion of this ring (its ring id, kind and QP) that is
    ///   not for a posted slot: from an earlier generation (left in the CQ across a
    ///   [`reset`](Self::reset)) or given a second time. Ignore it.
    /// - [`RecvError::Misrouted`]: not this ring's at all (another ring id, a send
    ///   completion, another QP): nothing changes; give it to the ring the error names.
    #[inline]
    pub fn on_completion(&mut self, c: &mut Completion) -> Result<Received, RecvError> {
        accept!(self, c)
    }

    /// [`on_completion`](Self::on_completion) out of line, for a receive session's cold
    /// path. A copy (one macro, `accept!`), not a call: a second caller of
    /// `on_completion` changes LLVM's inlining of it into receive loops, which costs the
    /// verbs ping-pong (336.8 -> 358.8 instructions per round trip with it always inlined)
    /// or the direct ring + poller receive rows (441.1 -> 467.2 without).
    #[inline(never)]
    pub(crate) fn on_completion_cold(&mut self, c: &mut Completion) -> Result<Received, RecvError> {
        accept!(self, c)
    }

    /// Why [`on_completion`](Self::on_completion) refuses `c`: misrouted if its ring id,
    /// kind or QP is not this ring's (unless it is spent), else stale. Out of line: the
    /// accepting path is the hot one.
    #[cold]
    #[inline(never)]
    fn refuse(&self, c: &Completion) -> RecvError {
        if (c.wr_id() ^ self.tag) >> wr_id::KIND_SHIFT != 0
            || (self.qp_num != 0 && c.qp_num() != self.qp_num)
        {
            if let Some(m) = c.misrouted(wr_id::ring_of(self.tag), true) {
                return RecvError::Misrouted(m);
            }
        }
        RecvError::Stale { wr_id: c.wr_id() }
    }

    /// True if `m` was made by this ring (its slot is then HELD).
    #[inline(always)]
    fn owns(&self, m: &Received) -> bool {
        m.brand == self.brand
            && m.slot < self.count
            && self.state[m.slot as usize & Self::MASK] == HELD
    }

    /// The message bytes, in place in the registered region (empty for an RDMA
    /// WRITE_WITH_IMM), or [`RecvError::Foreign`] for a [`Received`] of another ring.
    #[inline]
    pub fn data(&self, m: &Received) -> Result<&[u8], RecvError> {
        if !self.owns(m) {
            return Err(RecvError::Foreign { slot: m.slot });
        }
        let len = m.in_slot.min(self.slot_len) as usize;
        let addr = self.region.addr + m.slot as u64 * self.slot_len as u64;
        // SAFETY: `m` is this ring's and its slot (< count) is HELD (checked above): it lies
        // inside the region (checked in `init_in`), the region is valid for the ring's
        // lifetime (new's contract), and the NIC does not write a HELD slot until `release`
        // (which takes `&mut self`, ending this borrow).
        Ok(unsafe { core::slice::from_raw_parts(addr as *const u8, len) })
    }

    /// Gives a slot back; released slots are re-posted as one chain once `repost_batch`
    /// of them are waiting.
    ///
    /// # Errors
    /// [`RecvError::Foreign`] for a [`Received`] of another ring: nothing happens here, and
    /// `m` is dropped, so its slot stays held on the ring that made it; where a `Received`
    /// may be another ring's, use [`try_release`](Self::try_release), which hands it back.
    /// [`RecvError::Post`] if the re-post failed (the slot was released; the slots not
    /// posted stay pending).
    #[inline(always)]
    pub fn release(&mut self, m: Received) -> Result<(), RecvError> {
        // Always inlined, the repost out of line: the hot path is a check, two stores and
        // a compare. (Handing a foreign `Received` back would make the `Result` carry a
        // whole `Received`: 30 instructions more per round trip in `cargo xtask insn`'s
        // ping-pong, so that is `try_release`'s job.)
        if !self.owns(&m) {
            return Err(RecvError::Foreign { slot: m.slot });
        }
        self.release_owned(m.slot).map_err(RecvError::Post)
    }

    /// [`release`](Self::release) that hands a [`Received`] of another ring back
    /// ([`ReleaseError::Foreign`]), untouched, to be released on the ring that made it: for
    /// code that routes `Received`s between rings.
    ///
    /// # Errors
    /// [`ReleaseError::Foreign`] (nothing happens here), [`ReleaseError::Post`] as
    /// `release`'s `RecvError::Post`.
    #[inline]
    pub fn try_release(&mut self, m: Received) -> Result<(), ReleaseError> {
        if !self.owns(&m) {
            return Err(ReleaseError::Foreign(m));
        }
        self.release_owned(m.slot).map_err(ReleaseError::Post)
    }

    /// Releases `slot`, held by the caller (checked by `owns`), reposting once
    /// `repost_batch` slots wait.
    #[inline(always)]
    fn release_owned(&mut self, slot: u32) -> Result<(), PostError> {
        self.held -= 1;
        self.queue(slot);
        if self.npending >= self.repost_batch {
            return self.repost_released();
        }
        Ok(())
    }

    /// [`release`](Self::release)'s repost once `repost_batch` slots wait.
    #[inline(never)]
    fn repost_released(&mut self) -> Result<(), PostError> {
        self.repost().map(|_| ())
    }

    /// Posts every released slot now as one chain. Returns how many were posted. On failure
    /// the slots before the rejected one are posted and the rest stay pending.
    pub fn repost(&mut self) -> Result<usize, PostError> {
        let n = self.npending as usize;
        if n == 0 {
            return Ok(0);
        }
        // One test of the direct queue on the verbs path (None).
        match self.direct.as_mut() {
            None => {}
            Some(DirectQueue::Rq(rq)) if n == 1 => {
                // One slot released in the order it was posted (a receive ring's steady
                // state): its WQE is at the head, already written, so the repost is the
                // counter alone.
                let i = self.pending[0] as usize & Self::MASK;
                let wr_id = self.tag | i as u64;
                // Room is the ring's invariant (no more slots than WQEs); a session's
                // counter (`in_session`) takes the general path.
                if !rq.repost_same_in_ring(wr_id) {
                    return self.repost_direct(n);
                }
                rq.publish();
                self.state[i] = POSTED;
                self.posted += 1;
                self.npending = 0;
                return Ok(1);
            }
            Some(_) => return self.repost_direct(n),
        }
        let wrs = self.wrs.as_mut_ptr();
        let sges = self.sges.as_mut_ptr();
        for j in 0..n {
            let i = self.pending[j & Self::MASK] as usize & Self::MASK;
            let next = if j + 1 < n {
                // SAFETY: masked index inside `wrs`.
                unsafe { wrs.add(self.pending[(j + 1) & Self::MASK] as usize & Self::MASK) }
            } else {
                ptr::null_mut()
            };
            // SAFETY: i < N: inside both arrays.
            unsafe {
                (*wrs.add(i)).wr_id = self.tag | i as u64;
                (*wrs.add(i)).next = next;
                (*wrs.add(i)).sg_list = sges.add(i);
            }
        }
        let head = self.pending[0] as usize & Self::MASK;
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: the chain links pending slots only (built above, NULL-terminated), each
        // with a valid SGE inside the registered region; the target is live (new's contract).
        let rc = unsafe {
            match self.target {
                RecvTarget::Srq(srq) | RecvTarget::Mlx5Srq { srq, .. } => {
                    ibv_post_srq_recv(srq, wrs.add(head), &mut bad)
                }
                RecvTarget::Qp(qp) | RecvTarget::Mlx5 { qp, .. } => {
                    ibv_post_recv(qp, wrs.add(head), &mut bad)
                }
            }
        };
        let sz = core::mem::size_of::<ibv_recv_wr>();
        let off = (bad as usize).wrapping_sub(wrs as usize);
        let named = if rc == 0 || bad.is_null() || off % sz != 0 {
            None
        } else {
            (0..n).position(|j| self.pending[j & Self::MASK] as usize == off / sz)
        };
        let accepted = match named {
            _ if rc == 0 => n,
            Some(k) => k,
            // The provider did not name a WR of the chain: it may have queued any of them,
            // so all count as posted (never posted twice); only a reset (after the QP went
            // through RESET) takes them back.
            None => n,
        };
        for j in 0..accepted {
            self.state[self.pending[j] as usize & Self::MASK] = POSTED;
        }
        self.posted += accepted as u32;
        if accepted < n {
            self.pending.copy_within(accepted..n, 0);
        }
        self.npending = (n - accepted) as u32;
        if rc == 0 {
            Ok(n)
        } else {
            Err(PostError {
                verb: match self.target {
                    RecvTarget::Srq(_) | RecvTarget::Mlx5Srq { .. } => "ibv_post_srq_recv",
                    _ => "ibv_post_recv",
                },
                errno: rc,
                first_rejected: if named.is_some() {
                    accepted
                } else {
                    PostError::UNKNOWN
                },
                first_rejected_seq: if named.is_some() {
                    self.pending[0] as u64
                } else {
                    head as u64
                },
            })
        }
    }

    /// [`repost`](Self::repost) on a [`RecvTarget::Mlx5`] queue: one WQE per pending
    /// slot, then one barrier and counter store. The queue's own count of outstanding
    /// receives is set from the ring's (`posted`) first: the ring accounts for every
    /// receive, the queue only needs room, which `count <= wqe_cnt` guarantees.
    #[inline(never)]
    fn repost_direct(&mut self, n: usize) -> Result<usize, PostError> {
        let rq = match self.direct.as_mut() {
            Some(DirectQueue::Rq(rq)) => rq,
            Some(DirectQueue::Srq(_)) => return self.repost_direct_srq(n),
            None => return Ok(0),
        };
        rq.end_leaked_session();
        rq.set_outstanding(self.posted);
        for j in 0..n {
            let i = self.pending[j & Self::MASK] as usize & Self::MASK;
            let wr_id = self.tag | i as u64;
            // Slots released in the order they were posted find their own WQE at the
            // head, already written (a preformatted ring): only the head moves. Otherwise
            // the WQE is written. (Room is the ring's invariant; no session holds the
            // counter after `end_leaked_session`.)
            if !rq.repost_same_in_ring(wr_id) {
                let s = self.sges[i];
                // One entry of at least one byte (slot_len > 0) into a queue with room for
                // every slot (checked in init_in): `post` cannot refuse it.
                if rq
                    .post(wr_id, &[LocalBuf::new(s.addr, s.length, s.lkey)])
                    .is_err()
                {
                    unreachable!("a direct receive queue with fewer WQEs than the ring's slots");
                }
            }
            self.state[i] = POSTED;
        }
        rq.publish();
        self.posted += n as u32;
        self.npending = 0;
        Ok(n)
    }

    /// [`repost`](Self::repost) on a [`RecvTarget::Mlx5Srq`]: one SRQ WQE per pending slot
    /// (each takes a WQE the poller freed), then one barrier and counter store. A refusal
    /// (no free WQE: completions not polled yet) posts the slots before it and leaves the
    /// rest pending, named as `ibv_post_srq_recv`'s ENOMEM would be.
    fn repost_direct_srq(&mut self, n: usize) -> Result<usize, PostError> {
        let Some(DirectQueue::Srq(q)) = self.direct.as_mut() else {
            return Ok(0);
        };
        let mut done = 0usize;
        let mut refused = None;
        for j in 0..n {
            let i = self.pending[j & Self::MASK] as usize & Self::MASK;
            let s = self.sges[i];
            match q.post(
                self.tag | i as u64,
                &[LocalBuf::new(s.addr, s.length, s.lkey)],
            ) {
                Ok(_) => {
                    self.state[i] = POSTED;
                    done += 1;
                }
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        q.publish();
        self.posted += done as u32;
        if done < n {
            self.pending.copy_within(done..n, 0);
        }
        self.npending = (n - done) as u32;
        match refused {
            None => Ok(n),
            Some(e) => Err(PostError {
                verb: "mlx5 SRQ post (direct)",
                errno: match e {
                    crate::mlx5::SrqError::Full => 12,
                    _ => 22,
                },
                first_rejected: done,
                first_rejected_seq: self.pending[0] as u64,
            }),
        }
    }

    /// Takes back the slots the device no longer holds and queues them (with the idle
    /// ones) for [`repost`](Self::repost), to be called once the QP is back in INIT or
    /// later. Slots held by the caller stay held. Returns how many slots were queued.
    ///
    /// - [`RecvTarget::Qp`]: after the setup layer moved the QP to RESET (its posted
    ///   receives are gone without completions) or after all flush completions were
    ///   drained: every slot not held becomes pending, and completions still in the CQ from
    ///   before are recognised as stale (the generation in `wr_id` changes).
    /// - [`RecvTarget::Srq`]: a QP going to ERR or RESET leaves the SRQ's receives posted
    ///   (IBA; softnic and rxe do so), so `POSTED` slots stay posted and only idle ones
    ///   (whose receive completed in error) are queued; the generation is kept so the
    ///   receives still on the SRQ are accepted when they complete.
    ///
    /// Calling it needs `unsafe`: with receives still posted it would post buffers twice.
    /// ```compile_fail,E0133
    /// # use hotverbs_datapath::{LocalBuf, RecvConfig, RecvRing, RecvTarget};
    /// # let dev = hotverbs_softnic::counting::CountingDevice::new(16);
    /// # let region = [0u8; 64];
    /// # let mut ring: RecvRing<4> = unsafe { RecvRing::new(RecvTarget::Qp(dev.qp()),
    /// #     LocalBuf::new(region.as_ptr() as u64, 64, 1), RecvConfig::new(2, 16, 4)) }.unwrap();
    /// ring.reset();
    /// ```
    ///
    /// # Safety
    /// No receive of this ring that this call queues is still posted on the device: for a
    /// QP target, the QP went through RESET (or is in ERR and every flush completion of its
    /// receives was given to [`on_completion`](Self::on_completion)); for an SRQ target,
    /// every receive the device took off the SRQ for a QP that was reset has completed and
    /// its completion was given to `on_completion`. Otherwise a buffer would be posted
    /// twice and the device could write a slot the caller holds.
    pub unsafe fn reset(&mut self) -> usize {
        let srq = matches!(self.target, RecvTarget::Srq(_) | RecvTarget::Mlx5Srq { .. });
        if !srq {
            if let Some(DirectQueue::Rq(rq)) = self.direct.as_mut() {
                // SAFETY: the QP went through RESET (this function's contract), which
                // zeroed its receive counter.
                unsafe { rq.reset_after_qp_reset() };
            }
            let generation = ((self.tag >> GEN_SHIFT) + 1) & GEN_MASK;
            self.tag = (self.tag & !GEN_BITS) | (generation << GEN_SHIFT);
            self.completed += self.posted as u64;
            self.posted = 0;
        }
        self.npending = 0;
        let mut n = 0;
        for i in 0..self.count {
            let st = self.state[i as usize];
            if st != HELD && !(srq && st == POSTED) {
                self.queue(i);
                n += 1;
            }
        }
        n
    }

    /// Slots owned by the NIC.
    #[inline(always)]
    pub fn posted(&self) -> u32 {
        self.posted
    }
    /// Receives given back so far and receives posted now, for a
    /// [`StallWatch`](crate::StallWatch). A receive ring with receives posted is normally
    /// just waiting for messages; an age is meaningful when completions are owed: after
    /// the QP was moved to ERR (rxe holds receives posted in ERR, fault-truth G9) or when
    /// the peer says it has sent.
    #[inline(always)]
    pub fn progress(&self) -> crate::Progress {
        crate::Progress {
            retired: self.completed,
            outstanding: self.posted as u64,
        }
    }
    /// Slots held by the caller.
    #[inline(always)]
    pub fn held(&self) -> u32 {
        self.held
    }
    /// Slots released and waiting to be re-posted.
    #[inline(always)]
    pub fn pending(&self) -> u32 {
        self.npending
    }
    /// Slots in use (`count`).
    #[inline(always)]
    pub fn count(&self) -> u32 {
        self.count
    }
    /// Bytes per slot.
    #[inline(always)]
    pub fn slot_len(&self) -> u32 {
        self.slot_len
    }
    /// The ring id in its `wr_id`s.
    #[inline(always)]
    pub fn ring_id(&self) -> u8 {
        wr_id::ring_of(self.tag)
    }
    /// The `wr_id` the receive in `slot` carries when posted now (ring id, receive bit,
    /// generation, slot), for inspection in tests and debuggers.
    #[inline(always)]
    pub fn slot_wr_id(&self, slot: u32) -> u64 {
        self.tag | slot as u64
    }

    // What a `RecvSession` (`crate::mlx5::recv_session`) needs of the ring.

    /// The direct RQ a [`RecvTarget::Mlx5`] ring writes.
    pub(crate) fn direct_rq(&self) -> Option<&crate::mlx5::DirectRq<crate::mlx5::Mmio>> {
        match self.direct.as_ref() {
            Some(DirectQueue::Rq(rq)) => Some(rq),
            _ => None,
        }
    }

    /// The QP number of a QP target (0 for an SRQ).
    #[inline(always)]
    pub(crate) fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The region's first byte and lkey.
    pub(crate) fn region_addr(&self) -> u64 {
        self.region.addr
    }

    /// True when `wr_id` carries this ring's id, kind and current generation.
    #[inline(always)]
    pub(crate) fn is_current(&self, wr_id: u64) -> bool {
        (wr_id ^ self.tag) >> GEN_SHIFT == 0
    }

    /// One more receive given back by the device (a session's message).
    #[inline(always)]
    pub(crate) fn count_completed(&mut self) {
        self.completed += 1;
    }

    /// A session opens: it keeps the receive counter, returned here, until
    /// [`close_session`](Self::close_session). Only for a ring with a direct RQ and
    /// nothing pending (the session reposts first).
    pub(crate) fn open_session(&mut self) -> u32 {
        match self.direct.as_mut() {
            Some(DirectQueue::Rq(rq)) => rq.open_session(),
            _ => 0,
        }
    }

    /// The session ends with the receive counter at `head` (every receive it posted was
    /// published).
    pub(crate) fn close_session(&mut self, head: u32) {
        if let Some(DirectQueue::Rq(rq)) = self.direct.as_mut() {
            rq.close_session(head);
        }
    }

    /// A session gives `slot` back at receive counter `head` and the WQE there describes
    /// another slot: it is written for this one (segment, terminator, `wrid` entry).
    ///
    /// # Safety
    /// `head` is the counter of an open session of this ring (the session posts no more
    /// receives than the ring has slots, so that WQE holds no posted receive).
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn session_rewrite(&mut self, head: u32, slot: u32) {
        let i = slot as usize & Self::MASK;
        let s = self.sges[i];
        let wr_id = self.tag | i as u64;
        if let Some(DirectQueue::Rq(rq)) = self.direct.as_mut() {
            // SAFETY: the caller's contract; one entry, and every WQE holds one.
            unsafe { rq.write_at(head, wr_id, &[LocalBuf::new(s.addr, s.length, s.lkey)]) };
        }
    }

    /// A session takes a message the general path completed (`m`, its slot now HELD): the
    /// slot goes back to `POSTED` in the books (the session posts it again before anything
    /// else can look). Returns the bytes of the message in the slot.
    pub(crate) fn session_take(&mut self, m: Received) -> u32 {
        let i = m.slot as usize & Self::MASK;
        self.state[i] = POSTED;
        self.held -= 1;
        self.posted += 1;
        m.in_slot
    }
}
