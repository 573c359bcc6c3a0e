//! The mlx5 direct path on a real ConnectX: runs when `HOTVERBS_DEVICE` names an mlx5
//! device (or, without it, when the first real device is one), and prints
//! "skipped: no mlx5 device" otherwise (here: no RDMA at all; in `cargo xtask rxe`: rxe).
//!
//! What only hardware shows: the device executing the WQEs this ring wrote (the golden test
//! proved them equal to libmlx5's bytes and stores), BlueFlame over write-combining MMIO (a
//! QP in a thread domain: `fixed_size_apis_on_a_thread_domain_ring`, whose session and
//! post lists are the fixed-size fast path), the CQEs the device writes, and an error
//! CQE's retirement, also of a session's unsignaled WRs flushed by a move to ERR
//! (`a_sessions_unsignaled_wrs_retire_once_when_flushed`: their flush CQEs' `wqe_counter`
//! names WRs whose `wrid` entry the session's fast path never wrote).

mod mlx5_cases;

use hotverbs::testing::real_device;
use hotverbs::*;

fn mlx5() -> Option<Context> {
    let ctx = real_device()?;
    if !ctx.is_mlx5() {
        println!("skipped: no mlx5 device ({} is not one)", ctx.name());
        return None;
    }
    Some(ctx)
}

#[test]
fn direct_ring_writes_reads_and_polls_on_connectx() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::direct_ring_writes_reads_and_polls(&ctx);
    }
}

#[test]
fn direct_path_error_completion_retires_everything() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::direct_path_error_completion_retires_everything(&ctx);
    }
}

#[test]
fn direct_ring_reset_qp_cleans_the_cq_and_recovers() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::direct_ring_reset_qp_cleans_the_cq_and_recovers(&ctx);
    }
}

#[test]
fn req_notify_on_a_direct_cq_wakes_for_each_new_completion() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::req_notify_on_a_direct_cq_wakes_for_each_new_completion(&ctx);
    }
}

#[test]
fn destroying_a_qp_cleans_its_cqes_from_the_direct_cq() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::destroying_a_qp_cleans_its_cqes_from_the_direct_cq(&ctx);
    }
}

#[test]
fn direct_ring_ud_reaches_a_ud_peer() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::direct_ring_ud_reaches_a_ud_peer(&ctx);
    }
}

#[test]
fn direct_ring_atomics_immediates_and_gathers() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::direct_ring_atomics_immediates_and_gathers(&ctx);
    }
}

#[test]
fn two_direct_rings_share_one_direct_poller() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::two_direct_rings_share_one_direct_poller(&ctx);
    }
}

#[test]
fn a_send_waiting_for_a_receive_completes_once_one_is_posted() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::a_send_waiting_for_a_receive_completes_once_one_is_posted(&ctx);
    }
}

#[test]
fn a_refused_direct_poller_leaves_the_verbs_poller_working() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::a_refused_direct_poller_leaves_the_verbs_poller_working(&ctx);
    }
}

#[test]
fn direct_ring_on_uc_sends_and_writes() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::direct_ring_on_uc_sends_and_writes(&ctx);
    }
}

#[test]
fn fixed_size_apis_on_a_thread_domain_ring() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::fixed_size_apis_on_a_thread_domain_ring(&ctx);
    }
}

#[test]
fn a_sessions_unsignaled_wrs_retire_once_when_flushed() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::a_sessions_unsignaled_wrs_retire_once_when_flushed(&ctx);
    }
}

#[test]
fn a_lone_runs_unsignaled_wrs_retire_once_when_flushed() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::a_lone_runs_unsignaled_wrs_retire_once_when_flushed(&ctx);
    }
}

#[test]
fn fully_direct_ping_pong_on_connectx() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::fully_direct_ping_pong(&ctx);
    }
}

#[test]
fn recv_session_ping_pong_on_connectx() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::recv_session_ping_pong(&ctx);
    }
}

#[test]
fn direct_recv_ring_flushes_and_recovers_on_connectx() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::direct_recv_ring_flushes_and_recovers(&ctx);
    }
}

#[test]
fn destroying_a_direct_receiver_cleans_its_cqes_on_connectx() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::destroying_a_direct_receiver_cleans_its_cqes(&ctx);
    }
}

#[test]
fn direct_recv_ring_on_ud_on_connectx() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::direct_recv_ring_on_ud(&ctx);
    }
}

#[test]
fn a_too_long_message_fails_the_direct_receive_on_connectx() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::a_too_long_message_fails_the_direct_receive(&ctx);
    }
}

#[test]
fn direct_srq_ring_serves_several_qps_on_connectx() {
    if let Some(ctx) = mlx5() {
        mlx5_cases::direct_srq_ring_serves_several_qps(&ctx);
    }
}
