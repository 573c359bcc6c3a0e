//! The mlx5 direct path's workloads on softnic's simulated ConnectX queues
//! ([`Mlx5Sim`]): the same 32-byte inline SEND stream as the other rows, with the
//! simulator's device step (reading the doorbell record, writing CQEs) counted as the
//! device. The same ring against libmlx5's own code is `cargo xtask golden`'s table.

use hotverbs_datapath::mlx5::{DirectCq, DirectSq};
use hotverbs_datapath::{
    Completion, DirectPoller, DirectRing, Local, Msg, SendConfig, SendError, WcError,
};
use hotverbs_softnic::mlx5sim::Mlx5Sim;

use crate::{s, BURST, DEPTH, FILL, SIGNAL_EVERY};

/// Basic blocks of the simulated SQ: DEPTH messages of up to two blocks (64 bytes inline).
const WQE_CNT: u32 = 256;
const QPN: u32 = 0xabc;

/// A [`DirectRing`] and [`DirectPoller`] on a [`Mlx5Sim`].
#[derive(Debug)]
pub struct DirectStream {
    sim: Box<Mlx5Sim>,
    ring: DirectRing,
    poller: DirectPoller<BURST>,
}

/// The simulator's SQ as `mlx5dv_init_obj` would describe it.
pub fn sim_sq(sim: &mut Mlx5Sim, max_inline: u32) -> DirectSq {
    let p = sim.ptrs();
    DirectSq {
        buf: p.sq,
        wqe_cnt: sim.wqe_cnt,
        stride: 64,
        dbrec: p.qp_dbrec,
        bf_reg: p.bf_reg,
        bf_size: 256,
        bf_offset: 0,
        qp_num: sim.qpn,
        ud: false,
        uc: false,
        max_inline,
        max_sge: 1,
        wrid: p.wrid,
    }
}

/// The simulator's CQ as `mlx5dv_init_obj` would describe it.
pub fn sim_cq(sim: &mut Mlx5Sim) -> DirectCq {
    let p = sim.ptrs();
    DirectCq {
        buf: p.cq,
        cqe_cnt: sim.cqe_cnt,
        cqe_size: 64,
        dbrec: p.cq_dbrec,
        cqn: 1,
        cons_index: 0,
    }
}

impl DirectStream {
    /// A stream posting `batch` messages per doorbell.
    pub fn new(batch: u32) -> Result<DirectStream, String> {
        let mut sim = Box::new(Mlx5Sim::new(WQE_CNT, FILL as u32, QPN));
        let sq = sim_sq(&mut sim, 64);
        let cfg = SendConfig::new(1, DEPTH, 64)
            .signal_every(SIGNAL_EVERY)
            .batch(batch);
        // SAFETY: the simulator is boxed (stable addresses) and outlives the ring and the
        // poller, which are its only users.
        let (ring, poller) = unsafe {
            let ring = DirectRing::new(sq, cfg, None).map_err(s)?;
            let mut poller = DirectPoller::new(sim_cq(&mut sim)).map_err(s)?;
            poller.attach(&sq).map_err(s)?;
            (ring, poller)
        };
        Ok(DirectStream { sim, ring, poller })
    }
}

/// Streaming on the direct path: `n` messages in batches of the ring's batch size (one
/// doorbell each), the simulated device run after each, every completion reaped.
#[inline(never)]
pub fn hv_measured_stream_direct(r: &mut DirectStream, msg: &[u8], n: u64) -> Result<u64, String> {
    crate::whole_stream(n)?;
    let DirectStream { sim, ring, poller } = r;
    let m = Msg::send(Local::Inline(msg));
    let mut left = n;
    while left > 0 {
        let mut b = ring.batch();
        while left > 0 {
            match b.push(m) {
                Ok(_) => left -= 1,
                Err(SendError::WouldBlock) => break,
                Err(e) => return Err(s(e)),
            }
        }
        b.finish().map_err(s)?;
        reap(sim, poller, |c| ring.on_completion(c))?;
    }
    drain(sim, poller, ring)?;
    Ok(n)
}

/// Streaming on the direct path, one doorbell (BlueFlame) per message:
/// [`DirectRing::send_now`], the simulated device run when the ring is full.
#[inline(never)]
pub fn hv_measured_stream_direct_now(
    r: &mut DirectStream,
    msg: &[u8],
    n: u64,
) -> Result<u64, String> {
    stream_now(r, msg, n)
}

/// [`hv_measured_stream_direct_now`] with a message whose size is known at compile time
/// (`&[u8; 32]`, as a fixed-size order is, and as the floor rows take it): the same generic
/// `send_now(Msg)`, its length tests folded (the loop is inlined where the length is known).
#[inline(never)]
pub fn hv_measured_stream_direct_now_fixed(
    r: &mut DirectStream,
    msg: &[u8; 32],
    n: u64,
) -> Result<u64, String> {
    stream_now(r, msg, n)
}

/// The loop of the two `send_now` rows.
#[inline(always)]
fn stream_now(r: &mut DirectStream, msg: &[u8], n: u64) -> Result<u64, String> {
    crate::whole_stream(n)?;
    let DirectStream { sim, ring, poller } = r;
    let m = Msg::send(Local::Inline(msg));
    let mut left = n;
    while left > 0 {
        match ring.send_now(m) {
            Ok(_) => left -= 1,
            Err(SendError::WouldBlock) => reap(sim, poller, |c| ring.on_completion(c))?,
            Err(e) => return Err(s(e)),
        }
    }
    drain(sim, poller, ring)?;
    Ok(n)
}

/// Runs the simulated device and gives every completion it wrote to `retire` (a ring's or
/// a session's `on_completion`).
#[inline(always)]
fn reap(
    sim: &mut Mlx5Sim,
    poller: &mut DirectPoller<BURST>,
    mut retire: impl FnMut(&Completion) -> Result<u64, WcError>,
) -> Result<(), String> {
    sim.process();
    for c in poller.poll().map_err(s)? {
        if let Err(e) = retire(c) {
            return Err(refused(e));
        }
    }
    Ok(())
}

/// A completion a ring refused, as the workload's error: out of line and by value, so the
/// reap loop keeps the `Result` in registers (formatting takes the error's address; this
/// is worth 1.1 instructions per WR in the direct batch row, 0.1 in `post_list`'s).
#[cold]
#[inline(never)]
fn refused(e: WcError) -> String {
    s(e)
}

/// [`reap`] into `ring` until nothing is outstanding.
#[inline(always)]
fn drain(
    sim: &mut Mlx5Sim,
    poller: &mut DirectPoller<BURST>,
    ring: &mut DirectRing,
) -> Result<(), String> {
    while ring.outstanding() > 0 {
        reap(sim, poller, |c| ring.on_completion(c))?;
    }
    Ok(())
}

/// Streaming through a held [`DirectSession`](hotverbs_datapath::DirectSession) of 32-byte
/// messages: one BlueFlame doorbell per message, the simulated device run when the ring is
/// full, every completion retired through the session.
#[inline(never)]
pub fn hv_measured_stream_direct_session(
    r: &mut DirectStream,
    msg: &[u8; 32],
    n: u64,
) -> Result<u64, String> {
    crate::whole_stream(n)?;
    let DirectStream { sim, ring, poller } = r;
    let mut sess = ring.session::<32>().map_err(s)?;
    let mut left = n;
    while left > 0 {
        match sess.send(msg) {
            Ok(_) => left -= 1,
            Err(SendError::WouldBlock) => reap(sim, poller, |c| sess.on_completion(c))?,
            Err(e) => return Err(s(e)),
        }
    }
    while sess.outstanding() > 0 {
        reap(sim, poller, |c| sess.on_completion(c))?;
    }
    Ok(n)
}

/// Streaming in post lists of 32 through [`DirectWindow`](hotverbs_datapath::DirectWindow)s
/// of 32-byte messages: room and signal decided once per list, one doorbell each, the
/// simulated device run after each, every completion reaped.
#[inline(never)]
pub fn hv_measured_stream_direct_window(
    r: &mut DirectStream,
    msg: &[u8; 32],
    n: u64,
) -> Result<u64, String> {
    crate::whole_stream(n)?;
    let DirectStream { sim, ring, poller } = r;
    let mut left = n;
    while left > 0 {
        let mut w = ring.window::<32>(32).map_err(s)?;
        let k = w.room().min(left as usize);
        for _ in 0..k {
            w.push(msg).map_err(s)?;
        }
        w.finish();
        left -= k as u64;
        reap(sim, poller, |c| ring.on_completion(c))?;
    }
    drain(sim, poller, ring)?;
    Ok(n)
}

/// Streaming in post lists of 32 through [`DirectRing::post_list`]: an array of 32
/// messages per call (room, signal and counters decided once, one doorbell); when the ring
/// is full, the simulated device runs and every completion is reaped.
#[inline(never)]
pub fn hv_measured_stream_direct_list(
    r: &mut DirectStream,
    msgs: &[[u8; 32]; 32],
    n: u64,
) -> Result<u64, String> {
    crate::whole_stream(n)?;
    let DirectStream { sim, ring, poller } = r;
    let mut left = n;
    while left > 0 {
        let k = (left as usize).min(msgs.len());
        match ring.post_list(&msgs[..k]) {
            Ok(done) => left -= done as u64,
            Err(SendError::WouldBlock) => reap(sim, poller, |c| ring.on_completion(c))?,
            Err(e) => return Err(s(e)),
        }
    }
    drain(sim, poller, ring)?;
    Ok(n)
}

/// Poll cost, direct: reaps `n` completions, up to [`BURST`] per poll.
#[inline(never)]
pub fn hv_measured_drain_direct(p: &mut DirectPoller<BURST>, n: usize) -> Result<usize, String> {
    let mut got = 0;
    while got < n {
        for c in p.poll().map_err(s)? {
            c.status().map_err(s)?;
            got += 1;
        }
    }
    Ok(got)
}

/// The poll workload: [`FILL`] CQEs written by the simulated device (not measured), then
/// drained by [`hv_measured_drain_direct`].
pub fn poll_direct(n: u64) -> Result<u64, String> {
    let mut sim = Box::new(Mlx5Sim::new(WQE_CNT, FILL as u32, QPN));
    let sq = sim_sq(&mut sim, 0);
    // SAFETY: the simulator outlives the poller, its only consumer.
    let mut p = unsafe { DirectPoller::<BURST>::new(sim_cq(&mut sim)) }.map_err(s)?;
    // SAFETY: as above (the wrid table is the simulator's).
    unsafe { p.attach(&sq) }.map_err(s)?;
    let mut done = 0u64;
    let mut ctr = 0u16;
    while done < n {
        let k = FILL.min((n - done) as usize);
        for _ in 0..k {
            sim.write_cqe(0, hotverbs_datapath::mlx5::opcode::SEND, ctr, 0, 0);
            ctr = ctr.wrapping_add(1);
        }
        hv_measured_drain_direct(&mut p, k)?;
        done += k as u64;
    }
    Ok(done)
}

/// The floor: the stores of the direct ring's 32-byte inline SEND and nothing else, for
/// `cargo xtask insn`'s floor rows. No check, no signal schedule, no completion, no
/// sequence number beyond libmlx5's `cur_post`, every piece of state in a local: what any
/// writer of these bytes executes at the least (x86-64 baseline: SSE2, as the crate is
/// built). The same bytes, doorbell record and register stores as [`DirectRing`] (a unit
/// test compares them); the SQ is never drained (nothing reads it: no device runs).
#[derive(Debug)]
pub struct Floor {
    sim: Box<Mlx5Sim>,
    cur: u32,
    bf_off: usize,
    /// The `wrid` entry of `cur_post` 0 (the ring's id bits).
    id_off: u64,
}

impl Floor {
    /// A floor writer on its own simulated SQ whose `wrid` entries carry `id_off` (the
    /// ring id bits of the ring it is compared with).
    pub fn new(id_off: u64) -> Floor {
        Floor {
            sim: Box::new(Mlx5Sim::new(WQE_CNT, FILL as u32, QPN)),
            cur: 0,
            bf_off: 0,
            id_off,
        }
    }

    /// The SQ, `wrid` table, doorbell record and current BlueFlame buffer.
    fn queues(&mut self) -> (*mut u8, *mut u64, *mut u32, *mut u8) {
        let p = self.sim.ptrs();
        (p.sq, p.wrid, p.qp_dbrec, p.bf_reg.wrapping_add(self.bf_off))
    }
}

/// One WQE of the floor: ctrl segment, inline header, 32 bytes, `wrid`. Returns its ctrl.
///
/// # Safety
/// `sq` holds `mask + 1` basic blocks and `wrid` as many entries.
#[inline(always)]
unsafe fn floor_wqe(
    sq: *mut u8,
    wrid: *mut u64,
    mask: u32,
    cur: u32,
    id_off: u64,
    msg: &[u8; 32],
) -> *mut u8 {
    use hotverbs_datapath::mlx5::{opcode, INLINE_SEG};
    // The constant half of the ctrl word: opcode and `qpn_ds` (ds 4: ctrl + 3 inline).
    const W0: u64 = (opcode::SEND as u64) << 32 | (QPN << 8 | 4) as u64;
    let idx = (cur & mask) as usize;
    // SAFETY: idx < wqe_cnt (the caller's contract); the WQE is one 64-byte block.
    unsafe {
        let ctrl = sq.add(idx << 6);
        ctrl.add(16).cast::<u32>().write((32 | INLINE_SEG).to_be());
        let m = msg.as_ptr().cast::<u128>();
        ctrl.add(20)
            .cast::<u128>()
            .write_unaligned(m.read_unaligned());
        ctrl.add(36)
            .cast::<u128>()
            .write_unaligned(m.add(1).read_unaligned());
        ctrl.cast::<u64>()
            .write((((cur & 0xffff) as u64) << 40 | W0).swap_bytes());
        ctrl.add(8).cast::<u64>().write(0);
        wrid.add(idx).write((cur as u64).wrapping_add(id_off));
        ctrl
    }
}

/// The floor of a lone post: `floor_wqe`, the doorbell record, the BlueFlame copy, the
/// barriers of [`DirectRing::send_now`]'s lone path; `n` times.
#[inline(never)]
pub fn hv_measured_floor_now(f: &mut Floor, msg: &[u8; 32], n: u64) -> u64 {
    use hotverbs_datapath::mlx5::{Doorbell, Mmio, SND_DBR};
    let (sq, wrid, dbrec, mut bf) = f.queues();
    let (mask, id_off, mut cur, mut db) = (WQE_CNT - 1, f.id_off, f.cur, Mmio);
    for _ in 0..n {
        // SAFETY: the simulator's SQ, wrid table, doorbell record and BlueFlame page (its
        // buffer of 256 bytes at `bf`, 64-byte aligned), used by nothing else.
        unsafe {
            let ctrl = floor_wqe(sq, wrid, mask, cur, id_off, msg);
            cur = cur.wrapping_add(1);
            db.to_device_barrier();
            db.write_dbr(dbrec.add(SND_DBR), (cur & 0xffff).to_be());
            db.wc_start();
            db.bf_block(bf.cast(), ctrl.cast());
            db.flush_writes();
        }
        bf = bf.map_addr(|a| a ^ 256);
    }
    f.cur = cur;
    f.bf_off ^= (n as usize & 1) * 256;
    n
}

/// The floor of a post list of 32: 32 `floor_wqe`s, then the doorbell record and the
/// 8-byte doorbell of [`DirectRing`]'s batches; `n` WQEs (a multiple of 32).
#[inline(never)]
pub fn hv_measured_floor_32(f: &mut Floor, msg: &[u8; 32], n: u64) -> u64 {
    use hotverbs_datapath::mlx5::{Doorbell, Mmio, SND_DBR};
    let (sq, wrid, dbrec, mut bf) = f.queues();
    let (mask, id_off, mut cur, mut db) = (WQE_CNT - 1, f.id_off, f.cur, Mmio);
    for _ in 0..n / 32 {
        let mut last = sq;
        for _ in 0..32 {
            // SAFETY: as in hv_measured_floor_now.
            last = unsafe { floor_wqe(sq, wrid, mask, cur, id_off, msg) };
            cur = cur.wrapping_add(1);
        }
        // SAFETY: as in hv_measured_floor_now.
        unsafe {
            db.to_device_barrier();
            db.write_dbr(dbrec.add(SND_DBR), (cur & 0xffff).to_be());
            db.wc_start();
            db.write64(bf.cast(), last.cast::<u64>().read());
            db.flush_writes();
        }
        bf = bf.map_addr(|a| a ^ 256);
    }
    f.cur = cur;
    f.bf_off ^= ((n / 32) as usize & 1) * 256;
    n
}

/// Issue 30's receive rows: a [`RecvRing`](hotverbs_datapath::RecvRing) on a direct
/// receive queue (`RecvTarget::Mlx5`, repost batch 1) and a [`DirectPoller`] serving it,
/// on plain memory: a CQ of [`FILL`] 64-byte CQEs and an RQ of [`FILL`] one-segment WQEs,
/// its slots of 256 bytes. The "device" ([`DirectRecv::deliver`], outside the measured
/// function) writes responder SEND CQEs in order: with `scatter`, 16 bytes in the CQE
/// (`MLX5_INLINE_SCATTER_32`), else 256 bytes said to be in the slot.
pub struct DirectRecv {
    cq: Vec<u128>,
    _cq_db: Box<[u32; 2]>,
    _rq: Vec<u128>,
    _rq_db: Box<[u32; 2]>,
    _wrid: Vec<u64>,
    _slots: Vec<u64>,
    _qp: Box<hotverbs_ffi::ibv_qp>,
    poller: DirectPoller<1>,
    ring: hotverbs_datapath::RecvRing<FILL>,
    out: [Completion; 1],
    /// CQEs written (the next one's index and owner pass).
    prod: u32,
    scatter: bool,
}

impl DirectRecv {
    /// A filled ring (every slot posted) with nothing delivered yet.
    pub fn new(scatter: bool) -> Result<Box<DirectRecv>, String> {
        use hotverbs_datapath::mlx5::DirectRqDesc;
        use hotverbs_datapath::{LocalBuf, RecvConfig, RecvRing, RecvTarget};
        let n = FILL as u32;
        let mut cq = vec![0u128; FILL * 4];
        for e in cq.chunks_mut(4) {
            e[3] = u128::from(0xf0u8) << 120; // INVALID, owner 0: the device's
        }
        let mut cq_db = Box::new([0u32; 2]);
        let mut rq = vec![0u128; FILL];
        let mut rq_db = Box::new([0u32; 2]);
        let mut wrid = vec![0u64; FILL];
        let mut slots = vec![0u64; FILL * 32];
        // SAFETY: plain C struct; all-zero is valid. Only `qp_num` is read.
        let mut qp: Box<hotverbs_ffi::ibv_qp> = Box::new(unsafe { core::mem::zeroed() });
        qp.qp_num = QPN;
        let desc = DirectRqDesc {
            buf: rq.as_mut_ptr().cast(),
            wqe_cnt: n,
            stride: 16,
            dbrec: rq_db.as_mut_ptr(),
            wrid: wrid.as_mut_ptr(),
        };
        // SAFETY: the vectors and boxes move into the returned value with their heap
        // memory in place, outliving the poller and the ring, which alone use them.
        let mut poller = unsafe {
            DirectPoller::<1>::new(DirectCq {
                buf: cq.as_mut_ptr().cast(),
                cqe_cnt: n,
                cqe_size: 64,
                dbrec: cq_db.as_mut_ptr(),
                cqn: 1,
                cons_index: 0,
            })
        }
        .map_err(s)?;
        // SAFETY: as above.
        unsafe { poller.attach_rq(QPN, &desc) }.map_err(s)?;
        let region = LocalBuf::new(slots.as_mut_ptr() as u64, n * 256, 1);
        let target = RecvTarget::Mlx5 {
            qp: &mut *qp,
            desc,
            head: 0,
        };
        // SAFETY: as above; completions come only from `poller`.
        let mut ring = unsafe {
            RecvRing::<FILL>::new(
                target,
                region,
                RecvConfig::new(0x81, 256, n).repost_batch(1),
            )
        }
        .map_err(s)?;
        ring.fill().map_err(s)?;
        Ok(Box::new(DirectRecv {
            cq,
            _cq_db: cq_db,
            _rq: rq,
            _rq_db: rq_db,
            _wrid: wrid,
            _slots: slots,
            _qp: qp,
            poller,
            ring,
            out: [Completion::PLACEHOLDER; 1],
            prod: 0,
            scatter,
        }))
    }

    /// The device: `k` responder CQEs, one per receive posted, in order.
    pub fn deliver(&mut self, k: usize) {
        for _ in 0..k {
            let c = recv_cqe(self.prod, self.scatter, QPN);
            let at = (self.prod as usize % FILL) * 4;
            for (w, b) in self.cq[at..at + 4].iter_mut().zip(c.chunks(16)) {
                *w = u128::from_ne_bytes(b.try_into().expect("16 bytes"));
            }
            self.prod = self.prod.wrapping_add(1);
        }
    }
}

/// The 64-byte responder SEND CQE (`MLX5_CQE_RESP_SEND`) the receive rows' device writes
/// for the `prod`-th receive of QP `qpn` on a CQ of [`FILL`] CQEs: 16 bytes in the CQE
/// (`MLX5_INLINE_SCATTER_32`) with `scatter`, else 256 bytes said to be in the slot; the
/// WQE counter `prod`, the owner bit of its pass. Shared with the libmlx5 side of the rows
/// (`golden-insn`), so both receive the same messages.
pub fn recv_cqe(prod: u32, scatter: bool, qpn: u32) -> [u8; 64] {
    let mut c = [0u8; 64];
    let (format, len) = if scatter {
        c[..16].copy_from_slice(&[0x5a; 16]);
        (0x4u8, 16u32)
    } else {
        (0, 256)
    };
    c[44..48].copy_from_slice(&len.to_be_bytes());
    c[56..60].copy_from_slice(&qpn.to_be_bytes());
    c[60..62].copy_from_slice(&(prod as u16).to_be_bytes());
    let owner = ((prod / FILL as u32) & 1) as u8;
    c[63] = 2 << 4 | format | owner;
    c
}

/// Issue 30's receive rows, hotverbs' side: `k` received messages, each polled alone
/// (`DirectPoller::poll_into` of one), taken by the ring (`on_completion`), its first
/// byte read in place (`data`), and released (the slot reposted as a WQE at once).
#[inline(never)]
pub fn hv_measured_recv_direct(r: &mut DirectRecv, k: usize) -> Result<u64, String> {
    for _ in 0..k {
        let n = r.poller.poll_into(&mut r.out).map_err(s)?;
        if n != 1 {
            return Err(format!("polled {n} completions, 1 expected"));
        }
        let m = r.ring.on_completion(&mut r.out[0]).map_err(s)?;
        let first = r.ring.data(&m).map_err(s)?.first().copied();
        core::hint::black_box(first);
        r.ring.release(m).map_err(s)?;
    }
    Ok(k as u64)
}

/// Issue 30's receive rows on the fused path: `k` received messages through one
/// [`RecvSession`](hotverbs_datapath::mlx5::RecvSession) of the same ring and poller (opened
/// and closed inside the measured function), each message's first byte read where it is
/// (in the CQE for 16 bytes, in the slot for 256) and given back at the next `recv`.
#[inline(never)]
pub fn hv_measured_recv_session(r: &mut DirectRecv, k: usize) -> Result<u64, String> {
    use hotverbs_datapath::mlx5::Polled;
    let mut ses = r.ring.session(&mut r.poller).map_err(s)?;
    for _ in 0..k {
        match ses.recv().map_err(s)? {
            Polled::Msg(m) => {
                core::hint::black_box(m.bytes().first().copied());
            }
            other => return Err(format!("{other:?}, a message expected")),
        }
    }
    Ok(k as u64)
}

/// `n` received messages through [`hv_measured_recv_direct`] (or, with `session`,
/// [`hv_measured_recv_session`]), the device delivering [`FILL`] at a time between calls.
pub fn recv_direct(n: u64, scatter: bool, session: bool) -> Result<u64, String> {
    let mut r = DirectRecv::new(scatter)?;
    let f = if session {
        hv_measured_recv_session
    } else {
        hv_measured_recv_direct
    };
    let mut done = 0u64;
    while done < n {
        let k = FILL.min((n - done) as usize);
        r.deliver(k);
        f(&mut r, k)?;
        done += k as u64;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MSG;
    use hotverbs_datapath::wr_id;

    /// The simulator's SQ, `wrid` table, send doorbell record and both BlueFlame buffers,
    /// the ctrl segments' `fm_ce_se` bytes cleared (the ring signals every 32nd WR, the
    /// floor none).
    fn snapshot(sim: &mut Mlx5Sim) -> (Vec<u8>, Vec<u64>, u32, Vec<u8>) {
        let p = sim.ptrs();
        let n = sim.wqe_cnt as usize;
        // SAFETY: the simulator's regions, of these sizes, not written meanwhile.
        unsafe {
            let mut sq = core::slice::from_raw_parts(p.sq, n * 64).to_vec();
            for b in 0..n {
                sq[b * 64 + 11] = 0;
            }
            let mut bf = core::slice::from_raw_parts(p.bf_reg, 512).to_vec();
            bf[11] = 0;
            bf[256 + 11] = 0;
            (
                sq,
                core::slice::from_raw_parts(p.wrid, n).to_vec(),
                p.qp_dbrec.add(1).read(),
                bf,
            )
        }
    }

    /// The floor rows measure the same stores as the direct rows: equal SQ bytes, `wrid`
    /// entries, doorbell record and BlueFlame buffers after a stream that wraps the SQ.
    #[test]
    fn the_floor_writes_what_the_direct_ring_writes() {
        for (lone, n) in [(true, 288u64), (false, 320)] {
            let mut r = DirectStream::new(if lone { SIGNAL_EVERY } else { 32 }).unwrap();
            let mut f = Floor::new(wr_id::encode(r.ring.ring_id(), 0));
            if lone {
                hv_measured_stream_direct_now(&mut r, &MSG, n).unwrap();
                hv_measured_floor_now(&mut f, &MSG, n);
            } else {
                hv_measured_stream_direct(&mut r, &MSG, n).unwrap();
                hv_measured_floor_32(&mut f, &MSG, n);
            }
            // A lone run writes its `wrid` entries when it ends (the floor writes each with
            // its WQE): `flush` ends it, posting nothing.
            r.ring.flush().unwrap();
            let (a, b) = (snapshot(&mut r.sim), snapshot(&mut f.sim));
            assert_eq!(a.2, (n as u32).to_be(), "lone {lone}: doorbell record");
            for (blk, (x, y)) in a.0.chunks(64).zip(b.0.chunks(64)).enumerate() {
                assert_eq!(x, y, "lone {lone}: SQ block {blk}");
            }
            assert_eq!(a.1, b.1, "lone {lone}: wrid table");
            assert_eq!(a.2, b.2, "lone {lone}: doorbell record");
            assert_eq!(a.3, b.3, "lone {lone}: BlueFlame buffers");
        }
    }
}
