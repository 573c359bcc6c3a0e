//! softnic's simulated ConnectX queues (`Mlx5Sim`) as `mlx5dv_init_obj(3)` would describe
//! them: the direct path's integration tests build their rings and pollers from these.

use hotverbs_datapath::mlx5::{DirectCq, DirectSq};
use hotverbs_softnic::mlx5sim::Mlx5Sim;

/// The simulator's RC send queue for QP `qpn`: BlueFlame buffers of 256 bytes from the
/// first, `max_inline` and `max_sge` as the QP was created with.
pub fn sim_sq(sim: &mut Mlx5Sim, qpn: u32, max_inline: u32, max_sge: u32) -> DirectSq {
    let p = sim.ptrs();
    DirectSq {
        buf: p.sq,
        wqe_cnt: sim.wqe_cnt,
        stride: 64,
        dbrec: p.qp_dbrec,
        bf_reg: p.bf_reg,
        bf_size: 256,
        bf_offset: 0,
        qp_num: qpn,
        ud: false,
        uc: false,
        max_inline,
        max_sge,
        wrid: p.wrid,
    }
}

/// The simulator's CQ (64-byte CQEs, nothing polled yet) as CQ `cqn`.
pub fn sim_cq(sim: &mut Mlx5Sim, cqn: u32) -> DirectCq {
    let p = sim.ptrs();
    DirectCq {
        buf: p.cq,
        cqe_cnt: sim.cqe_cnt,
        cqe_size: 64,
        dbrec: p.cq_dbrec,
        cqn,
        cons_index: 0,
    }
}

/// A poller of a test's CQ on plain memory: `cqe_cnt` 64-byte CQEs at `buf`, doorbell
/// record `dbrec`.
///
/// # Safety
/// As `DirectPoller::new`: the memory outlives the poller, the CQ's only consumer.
pub unsafe fn cq_poller<const B: usize>(
    buf: *mut u8,
    dbrec: *mut u32,
    cqe_cnt: u32,
) -> hotverbs_datapath::DirectPoller<B> {
    let cq = hotverbs_datapath::mlx5::DirectCq {
        buf,
        cqe_cnt,
        cqe_size: 64,
        dbrec,
        cqn: 1,
        cons_index: 0,
    };
    // SAFETY: the caller's contract.
    unsafe { hotverbs_datapath::DirectPoller::new(cq) }.unwrap()
}
