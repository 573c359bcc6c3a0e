//! The mlx5 direct path's workloads on softnic's simulated ConnectX queues
//! ([`Mlx5Sim`]): the same 32-byte inline SEND stream as the other rows, with the
//! simulator's device step (reading the doorbell record, writing CQEs) counted as the
//! device. The same ring against libmlx5's own code is `cargo xtask golden`'s table.

use hotverbs_datapath::mlx5::{DirectCq, DirectSq};
use hotverbs_datapath::{DirectPoller, DirectRing, Local, Msg, SendConfig, SendError};
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
        sim.process();
        for c in poller.poll().map_err(s)? {
            ring.on_completion(c).map_err(s)?;
        }
    }
    while ring.outstanding() > 0 {
        sim.process();
        for c in poller.poll().map_err(s)? {
            ring.on_completion(c).map_err(s)?;
        }
    }
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
    let DirectStream { sim, ring, poller } = r;
    let m = Msg::send(Local::Inline(msg));
    let mut left = n;
    while left > 0 {
        match ring.send_now(m) {
            Ok(_) => left -= 1,
            Err(SendError::WouldBlock) => {
                sim.process();
                for c in poller.poll().map_err(s)? {
                    ring.on_completion(c).map_err(s)?;
                }
            }
            Err(e) => return Err(s(e)),
        }
    }
    while ring.outstanding() > 0 {
        sim.process();
        for c in poller.poll().map_err(s)? {
            ring.on_completion(c).map_err(s)?;
        }
    }
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
