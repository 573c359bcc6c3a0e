//! How a direct ring rings its QP's doorbell register (`DirectRing::register_use`), end to
//! end on softnic's simulated ConnectX, which assigns registers as libmlx5 does (one page
//! shared by a context's QPs, one per thread domain) and logs every write the device sees
//! on them (`hotverbs_softnic::mlx5sim::register_writes`): BlueFlame only on a register
//! the ring alone rings, its buffers alternating in step with libmlx5's posts; the
//! doorbell alone everywhere else, and that mode carrying traffic through SQ wraps.
//!
//! What this cannot show: a ConnectX's handling of those stores over write-combining MMIO.

use hotverbs::testing::gid_index;
use hotverbs::*;
use hotverbs_softnic::mlx5sim::{register_writes, RegisterWrite};

fn sim(shut_up_bf: bool) -> Context {
    Context::open_softnic_with(SoftnicConfig {
        name: "softnic_mlx5_reg".into(),
        mlx5: true,
        mlx5_shut_up_bf: shut_up_bf,
        // Thread domains (the Rxe profile has none, as rxe).
        profile: hotverbs_softnic::Profile::Spec,
        ..Default::default()
    })
    .unwrap()
}

/// An RC QP of `pd` on `cq` (64 WRs, 64 inline bytes) connected to a fresh peer of `peer_pd`.
fn connected(ctx: &Context, pd: &Pd, cq: &Cq, peer_pd: &Pd, peer_cq: &Cq) -> (Qp, Qp) {
    let info = ctx.port_info(None, gid_index()).unwrap();
    let a = QpBuilder::new(pd, cq, cq, QpType::Rc)
        .max_send_wr(64)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(peer_pd, peer_cq, peer_cq, QpType::Rc)
        .build()
        .unwrap();
    let o = ConnectOptions::default();
    a.connect(&info, &b.endpoint(&info), &o).unwrap();
    b.connect(&info, &a.endpoint(&info), &o).unwrap();
    (a, b)
}

fn flags() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
}

fn writes(qp: &Qp) -> Vec<RegisterWrite> {
    // SAFETY: a live QP of a softnic mlx5 context.
    unsafe { register_writes(qp.as_raw()) }
}

/// Consecutive writes to a register land in alternate buffers.
fn assert_alternates(log: &[RegisterWrite]) {
    for w in log.windows(2) {
        assert_ne!(
            w[0].offset, w[1].offset,
            "two writes in a row to one buffer: {log:#?}"
        );
    }
}

/// Posts one lone inline WRITE and polls until the ring has nothing outstanding (each
/// poll runs the device, which reads the register).
fn lone(ring: &mut DirectRing<'_>, poller: &mut DirectPoller<'_, 32>, tag: u8) {
    ring.signal_next();
    ring.send_now(Msg::write(Local::Inline(&[tag; 5]), 0))
        .unwrap();
    drain(ring, poller);
}

fn drain(ring: &mut DirectRing<'_>, poller: &mut DirectPoller<'_, 32>) {
    for _ in 0..1000 {
        for c in poller.poll().unwrap() {
            ring.on_completion(c).unwrap();
        }
        if ring.outstanding() == 0 {
            return;
        }
    }
    panic!("the device never completed: {ring:?}");
}

fn cfg(remote: RemoteBuf) -> SendConfig {
    SendConfig::new(0, 16, 64).signal_every(4).remote(remote)
}

#[test]
fn qps_without_a_thread_domain_share_a_register_and_ring_the_doorbell_only() {
    let ctx = sim(false);
    let pd = ctx.alloc_pd().unwrap();
    let (cq1, cq2, cqp) = (
        ctx.create_cq(64, None).unwrap(),
        ctx.create_cq(64, None).unwrap(),
        ctx.create_cq(64, None).unwrap(),
    );
    let (a1, _b1) = connected(&ctx, &pd, &cq1, &pd, &cqp);
    let (a2, _b2) = connected(&ctx, &pd, &cq2, &pd, &cqp);
    let dst = pd.alloc_mr(4096, flags()).unwrap();
    let r1 = a1.mlx5_sq(std::ptr::null_mut()).unwrap();
    let r2 = a2.mlx5_sq(std::ptr::null_mut()).unwrap();
    assert_eq!(r1.bf_reg, r2.bf_reg, "one register for the context's QPs");
    assert_eq!(r1.bf_size, 256, "mlx5dv reports BlueFlame buffers");
    let (mut p1, mut p2) = (
        cq1.direct_poller::<32>().unwrap(),
        cq2.direct_poller::<32>().unwrap(),
    );
    let mut g1 = a1.direct_ring(&mut p1, cfg(dst.remote().into())).unwrap();
    let mut g2 = a2.direct_ring(&mut p2, cfg(dst.remote().into())).unwrap();
    for g in [&g1, &g2] {
        assert_eq!(
            g.register_use(),
            RegisterUse::DoorbellOnly(DoorbellOnly::SharedRegister)
        );
        assert!(!g.blueflame());
        assert!(g.register_use().to_string().contains("thread domain"));
    }
    for i in 0..6u8 {
        lone(&mut g1, &mut p1, i);
        lone(&mut g2, &mut p2, i);
    }
    let log = writes(&a1);
    assert_eq!(log.len(), 12, "{log:#?}");
    for w in &log {
        assert!(!w.blueflame, "a BlueFlame copy on a shared register: {w:?}");
        assert!(w.qp_of_register && !w.by_libmlx5, "{w:?}");
        assert_eq!(w.offset, 0, "bf_size 0: one fixed buffer");
    }
    let qpns: Vec<u32> = log.iter().map(|w| w.qp_num).collect();
    assert_eq!(qpns.iter().filter(|&&n| n == a1.qp_num()).count(), 6);
    assert_eq!(qpns.iter().filter(|&&n| n == a2.qp_num()).count(), 6);
}

#[test]
fn a_qp_in_a_thread_domain_blueflames_on_its_own_register_in_alternate_buffers() {
    let ctx = sim(false);
    let pd = ctx.alloc_pd().unwrap();
    let td = ctx.alloc_td().unwrap();
    let pdom = pd.alloc_parent_domain(Some(&td)).unwrap();
    let (cq, cqp, cq_other) = (
        ctx.create_cq(64, None).unwrap(),
        ctx.create_cq(64, None).unwrap(),
        ctx.create_cq(64, None).unwrap(),
    );
    let (a, _b) = connected(&ctx, &pdom, &cq, &pd, &cqp);
    let (other, _ob) = connected(&ctx, &pd, &cq_other, &pd, &cqp);
    let dst = pd.alloc_mr(4096, flags()).unwrap();
    assert_ne!(
        a.mlx5_sq(std::ptr::null_mut()).unwrap().bf_reg,
        other.mlx5_sq(std::ptr::null_mut()).unwrap().bf_reg,
        "a thread domain has a register of its own"
    );
    let mut poller = cq.direct_poller::<32>().unwrap();
    let mut ring = a
        .direct_ring(&mut poller, cfg(dst.remote().into()))
        .unwrap();
    assert_eq!(
        ring.register_use(),
        RegisterUse::BlueFlame { first_offset: 0 }
    );
    assert!(ring.blueflame());
    for i in 0..5u8 {
        lone(&mut ring, &mut poller, i);
    }
    // A batch of 3: one doorbell, no copy, in the next buffer.
    let mut b = ring.batch();
    for _ in 0..3 {
        b.push(Msg::write(Local::Inline(b"batch"), 64)).unwrap();
    }
    b.finish().unwrap();
    for c in poller.poll().unwrap() {
        ring.on_completion(c).unwrap();
    }
    let log = writes(&a);
    assert_eq!(log.len(), 6, "{log:#?}");
    assert_alternates(&log);
    assert_eq!(log[0].offset, 0);
    for w in &log[..5] {
        assert!(
            w.blueflame && w.copy_matches,
            "a lone inline WRITE is copied whole: {w:?}"
        );
        assert_eq!(w.qp_num, a.qp_num());
    }
    assert!(!log[5].blueflame, "a batch rings the doorbell alone");
    assert_eq!(ring.bf_offset(), 0, "six writes from 0: back at 0");
    let mut got = [0u8; 5];
    dst.read_into(0, &mut got).unwrap();
    assert_eq!(got, [4; 5], "the device executed the WQEs");
}

#[test]
fn libmlx5_posts_and_direct_rings_keep_one_alternation_on_a_thread_domains_register() {
    let ctx = sim(false);
    let pd = ctx.alloc_pd().unwrap();
    let td = ctx.alloc_td().unwrap();
    let pdom = pd.alloc_parent_domain(Some(&td)).unwrap();
    let cqp = ctx.create_cq(256, None).unwrap();
    let cqs: Vec<Cq> = (0..3).map(|_| ctx.create_cq(64, None).unwrap()).collect();
    let (q1, _b1) = connected(&ctx, &pdom, &cqs[0], &pd, &cqp);
    let (q2, _b2) = connected(&ctx, &pdom, &cqs[1], &pd, &cqp);
    let (q3, _b3) = connected(&ctx, &pdom, &cqs[2], &pd, &cqp);
    let dst = pd.alloc_mr(4096, flags()).unwrap();
    let remote: RemoteBuf = dst.remote().into();
    let lib_write = |q: &Qp| q.post_send_inline(&SendWr::write_inline(1, b"libmlx5", dst.remote()));
    // libmlx5 first: its offset goes to 256, so the ring starts there.
    lib_write(&q3).unwrap();
    {
        let mut poller = cqs[0].direct_poller::<32>().unwrap();
        let mut ring = q1.direct_ring(&mut poller, cfg(remote)).unwrap();
        assert_eq!(
            ring.register_use(),
            RegisterUse::BlueFlame { first_offset: 256 }
        );
        // While it lives, libmlx5 must not ring the register (no lock on a thread domain's).
        let e = lib_write(&q3).unwrap_err();
        assert_eq!(e.errno(), libc::EBUSY, "{e}");
        assert!(e.to_string().contains("DirectRing"), "{e}");
        for i in 0..3u8 {
            lone(&mut ring, &mut poller, i);
        }
    }
    // Three ring writes after one of libmlx5's: libmlx5 is one buffer behind, for good.
    let e = lib_write(&q3).unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "{e}");
    assert!(e.to_string().contains("odd number"), "{e}");
    // A verbs ring would post through libmlx5 too: refused the same way.
    let e = q3
        .send_ring::<4>(SendConfig::new(0, 4, 64).remote(remote))
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "{e}");
    assert!(e.to_string().contains("odd number"), "{e}");
    // Another direct ring goes on from where the first stopped, and one write evens it.
    {
        let mut poller = cqs[1].direct_poller::<32>().unwrap();
        let mut ring = q2.direct_ring(&mut poller, cfg(remote)).unwrap();
        // The first ring wrote 256, 0, 256.
        assert_eq!(
            ring.register_use(),
            RegisterUse::BlueFlame { first_offset: 0 }
        );
        lone(&mut ring, &mut poller, 9);
    }
    lib_write(&q3).unwrap();
    lib_write(&q3).unwrap();
    let log = writes(&q3);
    let by: Vec<bool> = log.iter().map(|w| w.by_libmlx5).collect();
    assert_eq!(
        by,
        [true, false, false, false, false, true, true],
        "{log:#?}"
    );
    assert_alternates(&log);
    assert!(log
        .iter()
        .filter(|w| !w.by_libmlx5)
        .all(|w| w.blueflame && w.copy_matches));
    assert!(
        log.iter().filter(|w| w.by_libmlx5).all(|w| w.blueflame),
        "libmlx5 BlueFlames a lone inline WR"
    );
}

#[test]
fn a_verbs_ring_or_a_recycled_register_leaves_the_alternation_unknown() {
    let ctx = sim(false);
    let pd = ctx.alloc_pd().unwrap();
    let cqp = ctx.create_cq(64, None).unwrap();
    let dst = pd.alloc_mr(4096, flags()).unwrap();
    let remote: RemoteBuf = dst.remote().into();
    {
        let td = ctx.alloc_td().unwrap();
        let pdom = pd.alloc_parent_domain(Some(&td)).unwrap();
        let (cq1, cq2) = (
            ctx.create_cq(64, None).unwrap(),
            ctx.create_cq(64, None).unwrap(),
        );
        let (q1, _b1) = connected(&ctx, &pdom, &cq1, &pd, &cqp);
        let (q2, _b2) = connected(&ctx, &pdom, &cq2, &pd, &cqp);
        drop(
            q1.send_ring::<4>(SendConfig::new(0, 4, 64).remote(remote))
                .unwrap(),
        );
        let mut poller = cq2.direct_poller::<32>().unwrap();
        let ring = q2.direct_ring(&mut poller, cfg(remote)).unwrap();
        assert_eq!(
            ring.register_use(),
            RegisterUse::DoorbellOnly(DoorbellOnly::AlternationUnknown)
        );
    }
    // That thread domain was freed: libmlx5 may hand its register to the next one.
    let td = ctx.alloc_td().unwrap();
    let pdom = pd.alloc_parent_domain(Some(&td)).unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let (q, _b) = connected(&ctx, &pdom, &cq, &pd, &cqp);
    let mut poller = cq.direct_poller::<32>().unwrap();
    let mut ring = q.direct_ring(&mut poller, cfg(remote)).unwrap();
    assert_eq!(
        ring.register_use(),
        RegisterUse::DoorbellOnly(DoorbellOnly::AlternationUnknown)
    );
    lone(&mut ring, &mut poller, 1);
    assert!(writes(&q).iter().all(|w| !w.blueflame));
}

/// The device stands for libmlx5 under `MLX5_SHUT_UP_BF` (a device setting: no
/// environment variable in a test process).
#[test]
fn shut_up_bf_means_the_doorbell_only_everywhere() {
    let ctx = sim(true);
    let pd = ctx.alloc_pd().unwrap();
    let td = ctx.alloc_td().unwrap();
    let pdom = pd.alloc_parent_domain(Some(&td)).unwrap();
    let (cq1, cq2, cqp) = (
        ctx.create_cq(64, None).unwrap(),
        ctx.create_cq(64, None).unwrap(),
        ctx.create_cq(64, None).unwrap(),
    );
    let (shared, _b1) = connected(&ctx, &pd, &cq1, &pd, &cqp);
    let (in_td, _b2) = connected(&ctx, &pdom, &cq2, &pd, &cqp);
    let dst = pd.alloc_mr(4096, flags()).unwrap();
    assert_eq!(
        shared.mlx5_sq(std::ptr::null_mut()).unwrap().bf_size,
        0,
        "libmlx5's non-cached UAR: no BlueFlame buffers"
    );
    assert_eq!(
        in_td.mlx5_sq(std::ptr::null_mut()).unwrap().bf_size,
        256,
        "a thread domain's register keeps its buffers"
    );
    in_td
        .post_send_inline(&SendWr::write_inline(1, b"libmlx5", dst.remote()))
        .unwrap();
    let (mut p1, mut p2) = (
        cq1.direct_poller::<32>().unwrap(),
        cq2.direct_poller::<32>().unwrap(),
    );
    let g1 = shared
        .direct_ring(&mut p1, cfg(dst.remote().into()))
        .unwrap();
    let mut g2 = in_td
        .direct_ring(&mut p2, cfg(dst.remote().into()))
        .unwrap();
    assert_eq!(
        g1.register_use(),
        RegisterUse::DoorbellOnly(DoorbellOnly::SharedRegister)
    );
    assert_eq!(
        g2.register_use(),
        RegisterUse::DoorbellOnly(DoorbellOnly::ShutUpBf)
    );
    for i in 0..4u8 {
        lone(&mut g2, &mut p2, i);
    }
    let log = writes(&in_td);
    assert_eq!(log.len(), 5, "{log:#?}");
    assert!(log.iter().all(|w| !w.blueflame), "{log:#?}");
}

/// The doorbell-only mode (`bf_size` 0) carries everything: lone posts and batches, many
/// passes over the SQ, every message in place and every WR retired exactly once.
#[test]
fn doorbell_only_ring_delivers_everything_through_sq_wraps() {
    let ctx = sim(false);
    let pd = ctx.alloc_pd().unwrap();
    let (cq, cqp) = (
        ctx.create_cq(64, None).unwrap(),
        ctx.create_cq(64, None).unwrap(),
    );
    let (a, _b) = connected(&ctx, &pd, &cq, &pd, &cqp);
    const N: u64 = 1200;
    let dst = pd.alloc_mr(N as usize * 8, flags()).unwrap();
    let wqe_cnt = a.mlx5_sq(std::ptr::null_mut()).unwrap().wqe_cnt as u64;
    let mut poller = cq.direct_poller::<32>().unwrap();
    let mut ring = a
        .direct_ring(
            &mut poller,
            SendConfig::new(0, 16, 64)
                .signal_every(4)
                .remote(dst.remote().into()),
        )
        .unwrap();
    assert!(!ring.blueflame());
    let (mut sent, mut retired, mut polls) = (0u64, 0u64, 0u64);
    let msg = |i: u64| i.to_le_bytes();
    while sent < N {
        let before = sent;
        if sent % 3 == 0 {
            let m = msg(sent);
            if ring
                .send_now(Msg::write(Local::Inline(&m), sent * 8))
                .is_ok()
            {
                sent += 1;
            }
        } else {
            let k = (N - sent).min(1 + sent % 5);
            let bufs: Vec<[u8; 8]> = (sent..sent + k).map(msg).collect();
            let mut b = ring.batch();
            let mut n = 0;
            for (j, m) in bufs.iter().enumerate() {
                if b.push(Msg::write(Local::Inline(m), (sent + j as u64) * 8))
                    .is_err()
                {
                    break;
                }
                n += 1;
            }
            b.finish().unwrap();
            sent += n;
        }
        for c in poller.poll().unwrap() {
            retired += ring.on_completion(c).unwrap();
        }
        polls += 1;
        assert!(
            polls < 100 * N,
            "stalled at {sent} (was {before}): {ring:?}"
        );
    }
    ring.signal_next();
    ring.send_now(Msg::write(Local::Inline(&[0xee]), N * 8 - 1))
        .ok();
    let total = ring.posted_total();
    for _ in 0..10_000 {
        if ring.outstanding() == 0 {
            break;
        }
        for c in poller.poll().unwrap() {
            retired += ring.on_completion(c).unwrap();
        }
    }
    assert_eq!(ring.outstanding(), 0, "{ring:?}");
    assert_eq!(retired, total, "every WR retired exactly once");
    assert_eq!(ring.retired_total(), total);
    assert!(
        ring.cur_post() as u64 > 4 * wqe_cnt,
        "the SQ ({wqe_cnt} blocks) wrapped several times: cur_post {}",
        ring.cur_post()
    );
    let mut got = vec![0u8; N as usize * 8];
    dst.read_into(0, &mut got).unwrap();
    for i in 0..N - 1 {
        assert_eq!(
            got[i as usize * 8..i as usize * 8 + 8],
            msg(i),
            "message {i}"
        );
    }
    let log = writes(&a);
    assert!(!log.is_empty() && log.iter().all(|w| !w.blueflame && w.qp_num == a.qp_num()));
}
