//! The C model's Rust side (built only when the rdma-core source was prepared).

use std::ffi::c_void;

use hotverbs_ffi::{ibv_ah, ibv_cq, ibv_qp, ibv_qp_ex, ibv_sge, ibv_wc};

use crate::available;

/// One MMIO store libmlx5 made: offset from the BlueFlame register base, size in bytes,
/// the value as stored (bytes in memory order, as `u64::from_ne_bytes`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Store {
    /// Offset from the register base.
    pub off: i64,
    /// Bytes stored.
    pub size: u32,
    /// The stored bytes.
    pub raw: u64,
}

/// One barrier libmlx5 issued, with the send doorbell record (host order) at that moment.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Barrier {
    /// 1 `udma_to_device_barrier`, 2 `mmio_wc_start`, 3 `mmio_flush_writes`,
    /// 4 `udma_from_device_barrier`.
    pub kind: i32,
    /// The send doorbell record then.
    pub dbr: u32,
}

/// A work request in the C shim's form (`struct hv_wr`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Wr {
    /// `wr_id`.
    pub wr_id: u64,
    /// `enum ibv_wr_opcode`.
    pub opcode: u32,
    /// `IBV_SEND_*`.
    pub send_flags: u32,
    /// Immediate, big-endian as `ibv_send_wr::imm_data`.
    pub imm_be: u32,
    /// Remote key.
    pub rkey: u32,
    /// Remote address.
    pub remote_addr: u64,
    /// Atomic compare (CAS) or add (FAA).
    pub compare_add: u64,
    /// Atomic swap (CAS).
    pub swap: u64,
    /// Scatter/gather list (inline: the bytes at `addr`).
    pub sges: *const ibv_sge,
    /// Entries in `sges`.
    pub num_sge: u32,
    /// UD: remote QP number.
    pub remote_qpn: u32,
    /// UD: Q_Key.
    pub remote_qkey: u32,
    /// Padding.
    pub pad: u32,
    /// UD: the address handle ([`Model::new_ah`]); NULL otherwise.
    pub ah: *mut ibv_ah,
}

/// A `poll_cq` entry of a verbs context.
pub type PollFn = unsafe extern "C" fn(*mut ibv_cq, i32, *mut ibv_wc) -> i32;

#[repr(C)]
struct Env {
    _opaque: [u8; 0],
}

extern "C" {
    fn hv_env_new(
        qpt: i32,
        wqe_cnt: u32,
        max_gs: u32,
        max_inline: u32,
        qpn: u32,
        ncqe: u32,
        poison: u8,
        cqe_sz: u32,
    ) -> *mut Env;
    fn hv_new_ah(e: *mut Env, av: *const u8) -> *mut ibv_ah;
    fn hv_qp(e: *mut Env) -> *mut ibv_qp;
    fn hv_qp_ex(e: *mut Env) -> *mut ibv_qp_ex;
    fn hv_cq(e: *mut Env) -> *mut ibv_cq;
    fn hv_sq(e: *mut Env) -> *mut u8;
    fn hv_uar(e: *mut Env) -> *mut u8;
    fn hv_qp_dbrec(e: *mut Env) -> *mut u32;
    fn hv_cq_dbrec(e: *mut Env) -> *mut u32;
    fn hv_cq_buf(e: *mut Env) -> *mut u8;
    fn hv_sq_wrid(e: *mut Env) -> *mut u64;
    fn hv_bf_offset(e: *mut Env) -> u32;
    fn hv_cur_post(e: *mut Env) -> u32;
    fn hv_cq_cons(e: *mut Env) -> u32;
    fn hv_cq_clean(e: *mut Env, qpn: u32, cons: u32, dv_owned: i32);
    fn hv_arm_cq(e: *mut Env, cons: u32, sn: u32, solicited: i32, cqn: u32);
    fn hv_drain(e: *mut Env);
    fn hv_set_poll_cq(e: *mut Env, f: Option<PollFn>);
    fn hv_record(e: *mut Env);
    fn hv_stores(e: *mut Env, out: *mut *const Store) -> i32;
    fn hv_barriers(e: *mut Env, out: *mut *const Barrier) -> i32;
    fn hv_post_send(e: *mut Env, w: *const Wr, n: i32, bad: *mut i32) -> i32;
    fn hv_post_ex(e: *mut Env, w: *const Wr, n: i32) -> i32;
    fn hv_poll_cq(e: *mut Env, n: i32, wc: *mut ibv_wc) -> i32;
    fn hv_rq_init(e: *mut Env, wqe_cnt: u32, stride: u32, poison: u8);
    fn hv_post_recv(e: *mut Env, w: *const RecvWr, n: i32, bad: *mut i32) -> i32;
    fn hv_rq_buf(e: *mut Env) -> *mut u8;
    fn hv_rq_wrid(e: *mut Env) -> *mut u64;
    fn hv_rq_head(e: *mut Env) -> u32;
    fn hv_rq_set_tail(e: *mut Env, tail: u32);
    fn hv_srq_new(e: *mut Env, max_wr: u32, max_gs: i32, have_wq: i32) -> *mut SrqC;
    fn hv_post_srq_recv(s: *mut SrqC, w: *const RecvWr, n: i32, bad: *mut i32) -> i32;
    fn hv_srq_free_wqe(s: *mut SrqC, ind: i32);
    fn hv_srq_buf(s: *mut SrqC) -> *mut u8;
    fn hv_srq_wrid(s: *mut SrqC) -> *mut u64;
    fn hv_srq_bitmap(s: *mut SrqC) -> *mut u64;
    fn hv_srq_db(s: *mut SrqC) -> u32;
    fn hv_srq_state(s: *mut SrqC, out: *mut i32);
    fn hv_srq_store(e: *mut Env, s: *mut SrqC, srqn: u32);
    fn hv_measured_c_post_send(e: *mut Env, msg: *const u8, len: u32, n: u64, chain: u32) -> i32;
    fn hv_measured_c_post_wr(e: *mut Env, msg: *const u8, len: u32, n: u64, chain: u32) -> i32;
    fn hv_measured_c_poll(e: *mut Env, n: u64) -> i32;
    fn hv_measured_c_recv(e: *mut Env, n: u64, sges: *const ibv_sge, slots: u32) -> i32;
}

/// The shape of a fake QP / CQ.
#[derive(Clone, Copy, Debug)]
pub struct ModelCfg {
    /// UD (datagram segment in every WQE) instead of RC.
    pub ud: bool,
    /// UC instead of RC (libmlx5's `IBV_QPT_UC` case: an address segment for RDMA WRITE
    /// only).
    pub uc: bool,
    /// Basic blocks in the SQ (a power of two).
    pub wqe_cnt: u32,
    /// `max_send_sge`.
    pub max_gs: u32,
    /// `max_inline_data`.
    pub max_inline: u32,
    /// QP number.
    pub qpn: u32,
    /// CQEs in the CQ (a power of two).
    pub cqe_cnt: u32,
    /// The byte the SQ starts filled with.
    pub poison: u8,
    /// Bytes per CQE: 64 or 128 (`cq->cqe_sz`, libmlx5's `MLX5_CQE_SIZE`).
    pub cqe_size: u32,
}

/// One fake mlx5 environment driven by libmlx5's own code. Leaked on drop (a test's few).
#[derive(Debug)]
pub struct Model {
    e: *mut Env,
    /// Its shape.
    pub cfg: ModelCfg,
}

impl Model {
    /// A fresh environment.
    ///
    /// # Panics
    /// If the C model is not linked ([`available`] false).
    pub fn new(cfg: ModelCfg) -> Model {
        assert!(
            available(),
            "golden model not built: run `cargo xtask golden`"
        );
        assert!(cfg.wqe_cnt.is_power_of_two() && cfg.cqe_cnt.is_power_of_two());
        assert!(!(cfg.ud && cfg.uc), "a QP both UD and UC");
        assert!(cfg.cqe_size == 64 || cfg.cqe_size == 128);
        let qpt = if cfg.ud {
            hotverbs_ffi::IBV_QPT_UD
        } else if cfg.uc {
            hotverbs_ffi::IBV_QPT_UC
        } else {
            hotverbs_ffi::IBV_QPT_RC
        };
        // SAFETY: plain values; the shim allocates everything.
        let e = unsafe {
            hv_env_new(
                qpt as i32,
                cfg.wqe_cnt,
                cfg.max_gs,
                cfg.max_inline,
                cfg.qpn,
                cfg.cqe_cnt,
                cfg.poison,
                cfg.cqe_size,
            )
        };
        Model { e, cfg }
    }

    /// A fake `mlx5_ah` whose address vector is `av`.
    pub fn new_ah(&mut self, av: &[u8; 48]) -> *mut ibv_ah {
        // SAFETY: a live env; 48 readable bytes.
        unsafe { hv_new_ah(self.e, av.as_ptr()) }
    }

    /// The fake QP as libibverbs hands it out (its context's `post_send` is
    /// `mlx5_post_send`).
    pub fn qp(&self) -> *mut ibv_qp {
        // SAFETY: a live env.
        unsafe { hv_qp(self.e) }
    }
    /// The fake QP's `ibv_qp_ex` (libmlx5's `ibv_wr_*` table).
    pub fn qp_ex(&self) -> *mut ibv_qp_ex {
        // SAFETY: a live env.
        unsafe { hv_qp_ex(self.e) }
    }
    /// The fake CQ (its context's `poll_cq` is `mlx5_poll_cq`).
    pub fn cq(&self) -> *mut ibv_cq {
        // SAFETY: a live env.
        unsafe { hv_cq(self.e) }
    }

    /// The SQ buffer.
    pub fn sq(&self) -> &[u8] {
        // SAFETY: wqe_cnt * 64 bytes owned by the env.
        unsafe { std::slice::from_raw_parts(hv_sq(self.e), self.cfg.wqe_cnt as usize * 64) }
    }
    /// The SQ buffer, writable (to refill it with a pattern).
    pub fn sq_mut(&mut self) -> &mut [u8] {
        // SAFETY: as sq().
        unsafe { std::slice::from_raw_parts_mut(hv_sq(self.e), self.cfg.wqe_cnt as usize * 64) }
    }
    /// The BlueFlame register page (4 KiB).
    pub fn uar(&self) -> *mut u8 {
        // SAFETY: a live env.
        unsafe { hv_uar(self.e) }
    }
    /// The QP doorbell record (two big-endian u32: receive, send).
    pub fn qp_dbrec(&self) -> *mut u32 {
        // SAFETY: a live env.
        unsafe { hv_qp_dbrec(self.e) }
    }
    /// The send doorbell record, host order.
    pub fn dbr(&self) -> u32 {
        // SAFETY: the env's doorbell record.
        u32::from_be(unsafe { self.qp_dbrec().add(1).read_volatile() })
    }
    /// `bf->offset`.
    pub fn bf_offset(&self) -> u32 {
        // SAFETY: a live env.
        unsafe { hv_bf_offset(self.e) }
    }
    /// `sq.cur_post`.
    pub fn cur_post(&self) -> u32 {
        // SAFETY: a live env.
        unsafe { hv_cur_post(self.e) }
    }
    /// `sq.wrid`.
    pub fn wrid(&self) -> &[u64] {
        // SAFETY: wqe_cnt entries owned by the env.
        unsafe { std::slice::from_raw_parts(hv_sq_wrid(self.e), self.cfg.wqe_cnt as usize) }
    }
    /// `sq.wrid`, writable.
    pub fn wrid_mut(&mut self) -> &mut [u64] {
        // SAFETY: as wrid().
        unsafe { std::slice::from_raw_parts_mut(hv_sq_wrid(self.e), self.cfg.wqe_cnt as usize) }
    }
    /// libmlx5's `__mlx5_cq_clean` for QP `qpn` with its consumer index set to `cons`
    /// first; `dv_owned` marks the CQ as `mlx5dv_init_obj` does (`MLX5_CQ_FLAGS_DV_OWNED`),
    /// with which libmlx5 skips the clean.
    pub fn cq_clean(&mut self, qpn: u32, cons: u32, dv_owned: bool) {
        // SAFETY: a live env.
        unsafe { hv_cq_clean(self.e, qpn, cons, dv_owned as i32) }
    }

    /// libmlx5's `mlx5_arm_cq` of CQ number `cqn` with its consumer index `cons` and arm
    /// sequence number `sn` (`cq->arm_sn`); the CQ UAR page is [`uar`](Self::uar)` +
    /// 0x800`. Record first to see its stores.
    pub fn arm_cq(&mut self, cons: u32, sn: u32, solicited: bool, cqn: u32) {
        // SAFETY: a live env.
        unsafe { hv_arm_cq(self.e, cons, sn, solicited as i32, cqn) }
    }

    /// Pretends every posted WQE completed (`sq.tail = sq.head`).
    pub fn drain(&mut self) {
        // SAFETY: a live env.
        unsafe { hv_drain(self.e) }
    }
    /// Makes the context's `poll_cq` (what `ibv_poll_cq` calls) `f`, or `mlx5_poll_cq`
    /// with `None`.
    pub fn set_poll_cq(&mut self, f: Option<PollFn>) {
        // SAFETY: a live env; `f` has poll_cq's signature.
        unsafe { hv_set_poll_cq(self.e, f) }
    }

    /// `mlx5_poll_cq` itself, for a [`PollFn`] that wraps it.
    pub fn mlx5_poll_cq() -> PollFn {
        extern "C" {
            fn mlx5_poll_cq(cq: *mut ibv_cq, n: i32, wc: *mut ibv_wc) -> i32;
        }
        mlx5_poll_cq
    }

    /// The CQ buffer (`cqe_cnt * cqe_size` bytes).
    pub fn cq_buf(&self) -> *mut u8 {
        // SAFETY: a live env.
        unsafe { hv_cq_buf(self.e) }
    }
    /// The CQ doorbell record (consumer index, big-endian, at 0).
    pub fn cq_dbrec(&self) -> *mut u32 {
        // SAFETY: a live env.
        unsafe { hv_cq_dbrec(self.e) }
    }
    /// `cq->cons_index`.
    pub fn cons_index(&self) -> u32 {
        // SAFETY: a live env.
        unsafe { hv_cq_cons(self.e) }
    }

    /// Starts recording this env's stores and barriers (forgetting earlier ones).
    pub fn record(&mut self) {
        // SAFETY: a live env; the shim's hooks write into it.
        unsafe { hv_record(self.e) }
    }
    /// The stores recorded since [`record`](Self::record) (empty in the plain build).
    pub fn stores(&self) -> Vec<Store> {
        let mut p = std::ptr::null();
        // SAFETY: the shim returns its log and its length.
        let n = unsafe { hv_stores(self.e, &mut p) };
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(p, n as usize) }.to_vec()
    }
    /// The barriers recorded since [`record`](Self::record).
    pub fn barriers(&self) -> Vec<Barrier> {
        let mut p = std::ptr::null();
        // SAFETY: the shim returns its log and its length.
        let n = unsafe { hv_barriers(self.e, &mut p) };
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(p, n as usize) }.to_vec()
    }

    /// `mlx5_post_send` of the chain `wrs` (1 to 64): `Err((errno, index of bad_wr))`.
    ///
    /// # Safety
    /// Every SGE of an inline WR points at readable bytes; AHs came from this model.
    pub unsafe fn post_send(&mut self, wrs: &[Wr]) -> Result<(), (i32, i32)> {
        let mut bad = -1;
        // SAFETY: the caller's contract; the shim copies the chain into ibv_send_wrs.
        let rc = unsafe { hv_post_send(self.e, wrs.as_ptr(), wrs.len() as i32, &mut bad) };
        if rc == 0 {
            Ok(())
        } else {
            Err((rc, bad))
        }
    }

    /// The same chain through libmlx5's `ibv_wr_start` .. `ibv_wr_complete`.
    ///
    /// # Safety
    /// As [`post_send`](Self::post_send).
    pub unsafe fn post_ex(&mut self, wrs: &[Wr]) -> Result<(), i32> {
        // SAFETY: the caller's contract.
        match unsafe { hv_post_ex(self.e, wrs.as_ptr(), wrs.len() as i32) } {
            0 => Ok(()),
            rc => Err(rc),
        }
    }

    /// `mlx5_poll_cq` for up to `n` completions, each pre-filled with `0xa5` bytes (the
    /// fields libmlx5 leaves alone keep the pattern).
    pub fn poll_cq(&mut self, n: usize) -> Vec<ibv_wc> {
        // SAFETY: ibv_wc is plain integers; any bytes are valid.
        let mut wcs: Vec<ibv_wc> =
            vec![unsafe { std::mem::transmute::<[u8; 48], ibv_wc>([0xa5; 48]) }; n];
        // SAFETY: room for n completions.
        let k = unsafe { hv_poll_cq(self.e, n as i32, wcs.as_mut_ptr()) };
        assert!(k >= 0, "mlx5_poll_cq returned {k}");
        wcs.truncate(k as usize);
        wcs
    }

    /// Instruction workload: `n` 32-byte inline SENDs in chains of `chain` through
    /// `mlx5_post_send` (C loop, `hv_measured_c_post_send`).
    pub fn bench_post_send(&mut self, msg: &[u8], n: u64, chain: u32) {
        // SAFETY: msg readable for its length.
        let rc =
            unsafe { hv_measured_c_post_send(self.e, msg.as_ptr(), msg.len() as u32, n, chain) };
        assert_eq!(rc, 0);
    }
    /// Instruction workload: the same through `ibv_wr_*` (`hv_measured_c_post_wr`).
    pub fn bench_post_wr(&mut self, msg: &[u8], n: u64, chain: u32) {
        // SAFETY: msg readable for its length.
        let rc = unsafe { hv_measured_c_post_wr(self.e, msg.as_ptr(), msg.len() as u32, n, chain) };
        assert_eq!(rc, 0);
    }
    /// Instruction workload: drains `n` completions with `mlx5_poll_cq`, 32 per call.
    pub fn bench_poll(&mut self, n: u64) {
        // SAFETY: a live env.
        let rc = unsafe { hv_measured_c_poll(self.e, n) };
        assert_eq!(rc, 0);
    }

    /// Issue 30's receive baseline (`hv_measured_c_recv`): `n` times, `mlx5_poll_cq` of one
    /// completion, a read of its first byte, `mlx5_post_recv` of its buffer again (`sges`:
    /// slot `wr_id`'s buffer). Every poll must find a successful receive.
    pub fn bench_recv(&mut self, n: u64, sges: &[ibv_sge]) {
        // SAFETY: a live env with an RQ; the SGEs name live buffers.
        let rc = unsafe { hv_measured_c_recv(self.e, n, sges.as_ptr(), sges.len() as u32) };
        assert_eq!(rc, 0, "hv_measured_c_recv");
    }

    /// The raw env, for code that needs it as `*mut c_void`.
    pub fn raw(&self) -> *mut c_void {
        self.e.cast()
    }
}

/// One receive WR for [`Model::post_recv`] (`struct hv_rwr`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RecvWr {
    /// `wr_id`.
    pub wr_id: u64,
    /// `sg_list`.
    pub sges: *const hotverbs_ffi::ibv_sge,
    /// `num_sge`.
    pub num_sge: i32,
    /// Padding.
    pub pad: i32,
}

/// The receive queue (issue 30): `mlx5_post_recv` on a fake RQ of the env's QP.
impl Model {
    /// Gives the QP a receive queue: `wqe_cnt` WQEs of `stride` bytes (16 per scatter
    /// entry), filled with `poison`.
    pub fn rq_init(&mut self, wqe_cnt: u32, stride: u32, poison: u8) {
        assert!(wqe_cnt.is_power_of_two() && stride.is_power_of_two() && stride >= 16);
        // SAFETY: a live env; the shim allocates the queue.
        unsafe { hv_rq_init(self.e, wqe_cnt, stride, poison) }
    }
    /// `mlx5_post_recv` of the chain `wrs`: its return value and the index `*bad_wr`
    /// names (`None` when NULL).
    pub fn post_recv(&mut self, wrs: &[RecvWr]) -> (i32, Option<usize>) {
        let mut bad = -1;
        // SAFETY: a live env with an RQ; the WRs and their SGE lists are valid for the call.
        let rc = unsafe { hv_post_recv(self.e, wrs.as_ptr(), wrs.len() as i32, &mut bad) };
        (rc, usize::try_from(bad).ok())
    }
    /// The RQ buffer (`wqe_cnt * stride` bytes).
    pub fn rq_buf(&self) -> *mut u8 {
        // SAFETY: a live env with an RQ.
        unsafe { hv_rq_buf(self.e) }
    }
    /// The RQ's `wrid` array (`wqe_cnt` entries).
    pub fn rq_wrid(&self) -> *mut u64 {
        // SAFETY: a live env with an RQ.
        unsafe { hv_rq_wrid(self.e) }
    }
    /// `rq.head`: receives posted so far.
    pub fn rq_head(&self) -> u32 {
        // SAFETY: a live env.
        unsafe { hv_rq_head(self.e) }
    }
    /// Moves `rq.tail` (what `mlx5_poll_cq` does per completed receive).
    pub fn rq_set_tail(&mut self, tail: u32) {
        // SAFETY: a live env.
        unsafe { hv_rq_set_tail(self.e, tail) }
    }
}

/// The shim's `struct hv_srq`.
#[repr(C)]
#[derive(Debug)]
pub struct SrqC {
    _opaque: [u8; 0],
}

/// libmlx5's SRQ state after a call ([`Srq::state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqState {
    /// `head`.
    pub head: i32,
    /// `tail`.
    pub tail: i32,
    /// `nwqes`: the main queue.
    pub nwqes: i32,
    /// `max`: main and wait queue.
    pub max: i32,
    /// `max_gs`.
    pub max_gs: i32,
    /// `wqe_shift`.
    pub wqe_shift: i32,
    /// `waitq_head` (-1: no wait queue).
    pub waitq_head: i32,
    /// `counter`.
    pub counter: i32,
}

/// An SRQ laid out by libmlx5's own `mlx5_alloc_srq_buf` on the env's context (issue 30),
/// posted to with `mlx5_post_srq_recv` and freed with `mlx5_free_srq_wqe`. Lives as long
/// as the process (the shim does not free it).
#[derive(Debug)]
pub struct Srq {
    s: *mut SrqC,
    e: *mut Env,
}

impl Model {
    /// A new SRQ of `max_wr` receives of `max_gs` scatter entries (libmlx5 rounds both),
    /// with a wait queue when `have_wq`.
    pub fn srq_new(&mut self, max_wr: u32, max_gs: i32, have_wq: bool) -> Srq {
        // SAFETY: a live env; the shim allocates the SRQ.
        let s = unsafe { hv_srq_new(self.e, max_wr, max_gs, i32::from(have_wq)) };
        Srq { s, e: self.e }
    }
}

impl Srq {
    /// `mlx5_post_srq_recv` of the chain `wrs`: its return value and the index `*bad_wr`
    /// names (`None` when NULL). Barriers are recorded into the env's log (call
    /// [`Model::record`] first).
    pub fn post(&mut self, wrs: &[RecvWr]) -> (i32, Option<usize>) {
        let mut bad = -1;
        // SAFETY: a live SRQ; the WRs and their SGE lists are valid for the call.
        let rc = unsafe { hv_post_srq_recv(self.s, wrs.as_ptr(), wrs.len() as i32, &mut bad) };
        (rc, usize::try_from(bad).ok())
    }
    /// Registers the SRQ as number `srqn` of the env's context (`mlx5_store_srq`):
    /// `mlx5_poll_cq` then completes responder CQEs naming it.
    pub fn store(&mut self, srqn: u32) {
        // SAFETY: a live env and SRQ.
        unsafe { hv_srq_store(self.e, self.s, srqn) }
    }
    /// `mlx5_free_srq_wqe(ind)`: what `mlx5_poll_cq` does for each SRQ receive completed.
    pub fn free_wqe(&mut self, ind: u32) {
        // SAFETY: a live SRQ.
        unsafe { hv_srq_free_wqe(self.s, ind as i32) }
    }
    /// The buffer (`max << wqe_shift` bytes).
    pub fn buf(&self) -> *mut u8 {
        // SAFETY: a live SRQ.
        unsafe { hv_srq_buf(self.s) }
    }
    /// The `wrid` array (`max` entries).
    pub fn wrid(&self) -> *mut u64 {
        // SAFETY: a live SRQ.
        unsafe { hv_srq_wrid(self.s) }
    }
    /// The free-WQE bitmap (`max` bits in 64-bit words).
    pub fn bitmap(&self) -> *mut u64 {
        // SAFETY: a live SRQ.
        unsafe { hv_srq_bitmap(self.s) }
    }
    /// The doorbell record's first word, as stored (big-endian).
    pub fn db(&self) -> u32 {
        // SAFETY: a live SRQ.
        unsafe { hv_srq_db(self.s) }
    }
    /// `head`, `tail` and the rest of libmlx5's bookkeeping.
    pub fn state(&self) -> SrqState {
        let mut o = [0i32; 8];
        // SAFETY: a live SRQ; eight ints written.
        unsafe { hv_srq_state(self.s, o.as_mut_ptr()) };
        SrqState {
            head: o[0],
            tail: o[1],
            nwqes: o[2],
            max: o[3],
            max_gs: o[4],
            wqe_shift: o[5],
            waitq_head: o[6],
            counter: o[7],
        }
    }
}
