//! The mlx5 direct path end to end on softnic's simulated ConnectX
//! (`SoftnicConfig::mlx5`): the cases `real_device_mlx5` runs on hardware, here on every
//! `cargo test`. What this shows: the setup layer's direct path (`Cq::direct_poller`,
//! `Qp::direct_ring`, `DirectRing::reset_qp`, the clean of a destroyed QP's CQEs,
//! `Cq::req_notify` on a direct CQ, the CQ staying direct) over a device that reads the
//! WQEs the ring wrote, executes them (data moves, errors are softnic's) and writes mlx5
//! CQEs. What it cannot show: a ConnectX's own reading of those bytes (the golden test
//! proves them equal to libmlx5's) and BlueFlame over write-combining MMIO.

mod mlx5_cases;

use hotverbs::*;

/// A softnic device with the mlx5 personality, of its own (tests run in parallel).
fn sim() -> Context {
    let ctx = Context::open_softnic_with(SoftnicConfig {
        name: "softnic_mlx5".into(),
        mlx5: true,
        ..Default::default()
    })
    .unwrap();
    assert!(ctx.is_mlx5(), "the mlx5 personality is an mlx5 device");
    ctx
}

#[test]
fn direct_ring_writes_reads_and_polls() {
    mlx5_cases::direct_ring_writes_reads_and_polls(&sim());
}

#[test]
fn direct_path_error_completion_retires_everything() {
    mlx5_cases::direct_path_error_completion_retires_everything(&sim());
}

#[test]
fn direct_ring_reset_qp_cleans_the_cq_and_recovers() {
    mlx5_cases::direct_ring_reset_qp_cleans_the_cq_and_recovers(&sim());
}

#[test]
fn req_notify_on_a_direct_cq_wakes_for_each_new_completion() {
    mlx5_cases::req_notify_on_a_direct_cq_wakes_for_each_new_completion(&sim());
}

#[test]
fn destroying_a_qp_cleans_its_cqes_from_the_direct_cq() {
    mlx5_cases::destroying_a_qp_cleans_its_cqes_from_the_direct_cq(&sim());
}

#[test]
fn direct_ring_ud_reaches_a_ud_peer() {
    mlx5_cases::direct_ring_ud_reaches_a_ud_peer(&sim());
}

#[test]
fn direct_ring_atomics_immediates_and_gathers() {
    mlx5_cases::direct_ring_atomics_immediates_and_gathers(&sim());
}

#[test]
fn two_direct_rings_share_one_direct_poller() {
    mlx5_cases::two_direct_rings_share_one_direct_poller(&sim());
}

#[test]
fn a_send_waiting_for_a_receive_completes_once_one_is_posted() {
    mlx5_cases::a_send_waiting_for_a_receive_completes_once_one_is_posted(&sim());
}

#[test]
fn fully_direct_ping_pong() {
    mlx5_cases::fully_direct_ping_pong(&sim());
}

#[test]
fn recv_session_ping_pong() {
    mlx5_cases::recv_session_ping_pong(&sim());
}

#[test]
fn direct_recv_ring_flushes_and_recovers() {
    mlx5_cases::direct_recv_ring_flushes_and_recovers(&sim());
}

#[test]
fn direct_recv_ring_on_ud() {
    mlx5_cases::direct_recv_ring_on_ud(&sim());
}

#[test]
fn a_too_long_message_fails_the_direct_receive() {
    mlx5_cases::a_too_long_message_fails_the_direct_receive(&sim());
}

#[test]
fn direct_srq_ring_serves_several_qps() {
    mlx5_cases::direct_srq_ring_serves_several_qps(&sim());
}

#[test]
fn destroying_a_direct_receiver_cleans_its_cqes() {
    mlx5_cases::destroying_a_direct_receiver_cleans_its_cqes(&sim());
}

#[test]
fn a_refused_direct_poller_leaves_the_verbs_poller_working() {
    mlx5_cases::a_refused_direct_poller_leaves_the_verbs_poller_working(&sim());
}

/// A non-blocking channel on the simulated ConnectX: each `get_cq_event` runs the device
/// once, so a signaled WQE rung since the last try completes and its event is there at
/// once (one try, deterministic); with nothing rung, `EAGAIN`.
#[test]
fn a_non_blocking_get_cq_event_runs_the_simulated_device_once() {
    let ctx = sim();
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    ch.set_nonblocking(true).unwrap();
    let cq_a = ctx.create_cq(64, Some(&ch)).unwrap();
    let cq_b = ctx.create_cq(64, None).unwrap();
    let (a, _b) = mlx5_cases::pair(&ctx, &pd, &cq_a, &cq_b);
    let dst = pd
        .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let mut poller = cq_a.direct_poller::<8>().unwrap();
    let mut ring = a
        .direct_ring(
            &mut poller,
            SendConfig::new(0, 8, 64).remote(dst.remote().into()),
        )
        .unwrap();
    // The arm reads the consumer index the direct poller writes: through the poller.
    let busy = cq_a.req_notify(false).unwrap_err();
    assert_eq!(busy.errno(), libc::EBUSY, "{busy}");
    assert!(busy.to_string().contains("poller.req_notify()"), "{busy}");
    poller.req_notify(false).unwrap();
    let e = ch.get_cq_event().unwrap_err();
    assert_eq!(
        e.kind(),
        std::io::ErrorKind::WouldBlock,
        "nothing rung: {e}"
    );
    ring.signal_next();
    let seq = ring.send_now(Msg::write(Local::Inline(b"now"), 0)).unwrap();
    let ev = ch
        .get_cq_event()
        .expect("the try ran the device: the event is there");
    assert!(ev.is_for(&cq_a));
    cq_a.ack_events(1);
    for c in poller.poll().unwrap() {
        ring.on_completion(c).unwrap();
    }
    assert!(ring.is_retired(seq), "{ring:?}");
    let mut got = [0u8; 3];
    dst.read_into(0, &mut got).unwrap();
    assert_eq!(&got, b"now");
}

#[test]
fn direct_ring_on_uc_sends_and_writes() {
    mlx5_cases::direct_ring_on_uc_sends_and_writes(&sim());
}

/// On the simulated ConnectX in softnic's Spec profile (the Rxe profile has no thread
/// domains, as rxe), whatever `HOTVERBS_SOFTNIC_PROFILE` says: a thread domain's register
/// BlueFlames there, as on a ConnectX.
#[test]
fn fixed_size_apis_on_a_thread_domain_ring() {
    mlx5_cases::fixed_size_apis_on_a_thread_domain_ring(&spec_sim("softnic_mlx5_td"));
}

/// A simulated ConnectX named `name` in softnic's Spec profile (which has thread domains).
fn spec_sim(name: &str) -> Context {
    Context::open_softnic_with(SoftnicConfig {
        name: name.into(),
        mlx5: true,
        profile: hotverbs_softnic::Profile::Spec,
        ..Default::default()
    })
    .unwrap()
}

/// On the simulated ConnectX (Spec profile, for the thread domain whose register
/// BlueFlames): a session's unsignaled WRs, flushed by the QP's move to ERR, retire once.
#[test]
fn a_sessions_unsignaled_wrs_retire_once_when_flushed() {
    mlx5_cases::a_sessions_unsignaled_wrs_retire_once_when_flushed(&spec_sim(
        "softnic_mlx5_td_flush",
    ));
}

/// The same through `send_now`: a lone run's unsignaled WRs (no `wrid` entry written on the
/// lone path), flushed while the run is open, retire once.
#[test]
fn a_lone_runs_unsignaled_wrs_retire_once_when_flushed() {
    mlx5_cases::a_lone_runs_unsignaled_wrs_retire_once_when_flushed(&spec_sim(
        "softnic_mlx5_td_lone_flush",
    ));
}

/// A softnic device whose mlx5 CQs have 128-byte CQEs (`SoftnicConfig::mlx5_cqe_size`,
/// what libmlx5 makes with `MLX5_CQE_SIZE=128`): the direct poller reads them (the
/// 64-byte CQE in each entry's second half) through writes and READs, errors and flushes,
/// a reset with its clean, and a UC pair.
#[test]
fn the_direct_path_on_128_byte_cqes() {
    let ctx = || {
        Context::open_softnic_with(SoftnicConfig {
            name: "softnic_mlx5_cqe128".into(),
            mlx5: true,
            mlx5_cqe_size: 128,
            ..Default::default()
        })
        .unwrap()
    };
    {
        let c = ctx();
        let cq = c.create_cq(16, None).unwrap();
        let d = cq.mlx5_cq().unwrap();
        assert_eq!(d.cqe_size, 128, "the CQ's CQEs are 128 bytes: {d:?}");
    }
    mlx5_cases::direct_ring_writes_reads_and_polls(&ctx());
    mlx5_cases::direct_path_error_completion_retires_everything(&ctx());
    mlx5_cases::direct_ring_reset_qp_cleans_the_cq_and_recovers(&ctx());
    mlx5_cases::destroying_a_qp_cleans_its_cqes_from_the_direct_cq(&ctx());
    mlx5_cases::direct_ring_on_uc_sends_and_writes(&ctx());
    // Receives: payloads up to 64 bytes arrive in the CQE's first half (scatter-to-CQE,
    // `MLX5_INLINE_SCATTER_64`).
    mlx5_cases::fully_direct_ping_pong(&ctx());
    mlx5_cases::recv_session_ping_pong(&ctx());
    mlx5_cases::direct_recv_ring_flushes_and_recovers(&ctx());
    mlx5_cases::direct_srq_ring_serves_several_qps(&ctx());
}

/// A CQE size libmlx5 does not make is refused when the CQ is described, not guessed.
#[test]
fn an_unknown_cqe_size_is_refused() {
    let ctx = Context::open_softnic_with(SoftnicConfig {
        name: "softnic_mlx5_cqe96".into(),
        mlx5: true,
        mlx5_cqe_size: 96,
        ..Default::default()
    })
    .unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let e = cq.mlx5_cq().unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
}
