//! Issue 28: one surface over the three post paths ([`PostRing`] / [`PostBatch`] /
//! [`PollCq`]), and configuration said once ([`SendConfig::default`] derives depth and
//! inline limit from the QP; what is said is checked where the user says it, by name).

use std::time::{Duration, Instant};

use hotverbs::*;

fn softnic(name: &str, mlx5: bool) -> Context {
    Context::open_softnic_with(SoftnicConfig {
        name: name.into(),
        mlx5,
        ..Default::default()
    })
    .unwrap()
}

/// The engine, written once: `n` WRITEs of `i`'s bytes to offset `8 * (i % 64)`, half
/// alone and half in batches of 4, retiring through any poller; then it drains. Returns the
/// number of WRs retired.
fn engine<R: PostRing, P: PollCq>(ring: &mut R, poller: &mut P, n: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut retired = 0;
    let mut poll = |ring: &mut R| {
        for c in poller.poll().unwrap() {
            retired += ring.on_completion(c).unwrap();
        }
        assert!(Instant::now() < deadline, "stalled");
    };
    // A batch borrows its payloads until it is finished: they outlive it here.
    let payloads: Vec<[u8; 8]> = (0..n).map(u64::to_le_bytes).collect();
    let msg = |i: u64| Msg::write(Local::Inline(&payloads[i as usize]), 8 * (i % 64));
    let mut i = 0u64;
    while i < n {
        // Messages posted (or staged, then posted by finish) this round.
        let r = if i % 2 == 0 {
            ring.send_now(msg(i)).map(|_| 1)
        } else {
            let mut b = ring.batch();
            let mut pushed = 0;
            let mut r = Ok(0);
            while pushed < 4 && i + pushed < n {
                match b.push(msg(i + pushed)) {
                    Ok(_) => pushed += 1,
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                }
            }
            b.finish().unwrap();
            if pushed > 0 {
                Ok(pushed)
            } else {
                r
            }
        };
        match r {
            Ok(k) => i += k,
            Err(SendError::WouldBlock) => poll(ring),
            Err(e) => panic!("{e}"),
        }
    }
    ring.signal_next();
    let s = ring
        .send_now(Msg::write(Local::Inline(&[]), 0))
        .or_else(|_| {
            poll(ring);
            ring.signal_next();
            ring.send_now(Msg::write(Local::Inline(&[]), 0))
        })
        .unwrap();
    while !ring.is_retired(s) {
        poll(ring);
    }
    assert_eq!(ring.outstanding(), 0);
    assert_eq!(ring.posted_total(), ring.retired_total());
    assert!(ring.error().is_none());
    let _ = poll;
    retired
}

fn rc_pair(ctx: &Context, pd: &Pd, cq_a: &Cq, cq_b: &Cq, ops: Option<SendOps>) -> (Qp, Qp) {
    let mut a = QpBuilder::new(pd, cq_a, cq_a, QpType::Rc)
        .max_send_wr(32)
        .max_inline_data(64);
    if let Some(ops) = ops {
        a = a.send_ops(ops);
    }
    let a = a.build().unwrap();
    let b = QpBuilder::new(pd, cq_b, cq_b, QpType::Rc).build().unwrap();
    Qp::connect_pair(
        &a,
        &b,
        &ctx.port_info(None, None).unwrap(),
        &ConnectOptions::default(),
    )
    .unwrap();
    (a, b)
}

/// The same generic engine drives `SendRing`, `WrRing` and `DirectRing` (the last on the
/// simulated ConnectX), each with its own poller type, through the traits alone; every WR
/// is retired, and the last WRITE of each landed.
#[test]
fn one_engine_runs_on_every_post_path() {
    // Under miri (`cargo xtask miri`) a shorter run, and no simulated ConnectX: its device
    // thread is not what this test checks.
    const N: u64 = if cfg!(miri) { 96 } else { 1000 };
    let last = (N - 1).to_le_bytes();
    let landed = |dst: &Mr<'_>| {
        let mut got = [0u8; 8];
        dst.read_into(8 * ((N - 1) % 64) as usize, &mut got)
            .unwrap();
        got == last
    };
    let paths: &[&str] = if cfg!(miri) {
        &["legacy", "wr"]
    } else {
        &["legacy", "wr", "direct"]
    };
    for &path in paths {
        let ctx = softnic(&format!("surface_{path}"), path == "direct");
        let pd = ctx.alloc_pd().unwrap();
        let (cq_a, cq_b) = (
            ctx.create_cq(64, None).unwrap(),
            ctx.create_cq(64, None).unwrap(),
        );
        let ops = (path == "wr").then_some(SendOps::RDMA_WRITE);
        let (a, _b) = rc_pair(&ctx, &pd, &cq_a, &cq_b, ops);
        let dst = pd
            .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        // Depth and inline limit derived from the QP: said once, on the QpBuilder.
        let cfg = SendConfig::default()
            .signal_every(4)
            .batch(4)
            .remote(dst.remote().into());
        let retired = match path {
            "legacy" => {
                let mut p = cq_a.poller::<16>().unwrap();
                let mut r = a.send_ring::<64>(cfg).unwrap();
                engine(&mut r, &mut p, N)
            }
            "wr" => {
                let mut p = cq_a.poller::<16>().unwrap();
                let mut r = a.wr_ring(cfg).unwrap();
                engine(&mut r, &mut p, N)
            }
            _ => {
                let mut p = cq_a.direct_poller::<16>().unwrap();
                let mut r = a.direct_ring(&mut p, cfg).unwrap();
                engine(&mut r, &mut p, N)
            }
        };
        assert_eq!(retired, N + 1, "{path}: every WR retired once");
        assert!(landed(&dst), "{path}: the last WRITE landed");
    }
}

/// `SendConfig::default()` takes depth `min(N, max_send_wr)` and the QP's inline limit; a
/// said depth or inline limit is kept.
#[test]
fn unset_settings_come_from_the_qp() {
    let ctx = softnic("surface_derive", false);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    for (n_is_smaller, qp_wr) in [(true, 64), (false, 8)] {
        let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
            .max_send_wr(qp_wr)
            .max_inline_data(48)
            .build()
            .unwrap();
        let want_inline = qp.cap().max_inline_data;
        let want_depth = if n_is_smaller {
            16
        } else {
            qp.cap().max_send_wr
        };
        let ring = qp.send_ring::<16>(SendConfig::default()).unwrap();
        assert_eq!(ring.depth(), want_depth as u64);
        assert_eq!(ring.signal_every(), want_depth as u64 / 2);
        drop(ring);
        let qp2 = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
            .max_send_wr(qp_wr)
            .max_inline_data(48)
            .build()
            .unwrap();
        let ring = qp2
            .send_ring::<16>(SendConfig::default().depth(4).max_inline(8))
            .unwrap();
        assert_eq!((ring.depth(), ring.signal_every()), (4, 2));
        // The limit said (8), not the QP's (>= 48): 9 inline bytes are refused by name.
        assert!(want_inline >= 48);
        let mut ring = ring;
        assert!(matches!(
            ring.send_now(Msg::send(Local::Inline(&[0; 9]))),
            Err(SendError::InlineTooLong { len: 9, max: 8 })
        ));
        drop(ring);
    }
}

/// What the user says wrong is refused where they say it, naming the setting: a ring size
/// that is not a power of two (formerly a build error deep inside the datapath), a depth
/// above `N`, an inline limit above the QP's, a raw datapath ring left unresolved.
#[test]
fn a_wrong_setting_is_named_at_the_users_call() {
    let ctx = softnic("surface_refuse", false);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .max_send_wr(64)
        .max_inline_data(32)
        .build()
        .unwrap();
    let e = qp.send_ring::<100>(SendConfig::default()).unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("SendRing::<100>") && s.contains("power of two") && s.contains("128"),
        "{s}"
    );
    let e = qp
        .send_ring::<16>(SendConfig::default().depth(32))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("SendConfig::depth(32) > the ring's N = 16"),
        "{e}"
    );
    let e = qp
        .send_ring::<16>(SendConfig::default().max_inline(4096))
        .unwrap_err();
    assert!(
        e.to_string().contains("SendConfig::max_inline(4096)"),
        "{e}"
    );
    // The refusals left the send queue free: a good ring still builds.
    let ring = qp.send_ring::<64>(SendConfig::default()).unwrap();
    assert_eq!(ring.depth(), 64);
    // The datapath says what is missing when a raw ring is given the derived defaults.
    let e = datapath::ConfigError::Unresolved.to_string();
    assert!(e.contains("SendConfig::depth"), "{e}");
    let e = datapath::ConfigError::RingSize { n: 100 }.to_string();
    assert!(e.contains("N = 100") && e.contains("use 128"), "{e}");
}

/// A receive ring's count, said once: `RecvConfig::slots(len)` takes
/// `min(N, max_recv_wr, the slots the region holds after the offset)`; what is said wrong is
/// named at the call.
#[test]
fn a_receive_ring_derives_its_count() {
    let ctx = softnic("surface_recv", false);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let qp = |wr: u32| {
        QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
            .max_recv_wr(wr)
            .build()
            .unwrap()
    };
    // Limited by the region: 1024 bytes from offset 64 hold 15 slots of 64.
    let (q, mut mem) = (qp(64), pd.alloc_mr(1024, AccessFlags::LOCAL_WRITE).unwrap());
    let r = q
        .recv_ring::<64>(&mut mem, 64, RecvConfig::slots(64))
        .unwrap();
    assert_eq!(r.count(), 15);
    drop(r);
    // Limited by N, then by the QP's max_recv_wr.
    let (q, mut mem) = (
        qp(64),
        pd.alloc_mr(1 << 16, AccessFlags::LOCAL_WRITE).unwrap(),
    );
    let r = q
        .recv_ring::<32>(&mut mem, 0, RecvConfig::slots(64))
        .unwrap();
    assert_eq!(r.count(), 32);
    drop(r);
    let q = qp(8);
    let want = q.cap().max_recv_wr;
    let r = q
        .recv_ring::<64>(&mut mem, 0, RecvConfig::slots(64))
        .unwrap();
    assert_eq!(r.count(), want);
    drop(r);
    // Refused by name: N, a count above N, a region with no room.
    let q = qp(64);
    let e = q
        .recv_ring::<48>(&mut mem, 0, RecvConfig::slots(64))
        .unwrap_err();
    assert!(
        e.to_string().contains("RecvRing::<48>") && e.to_string().contains("use 64"),
        "{e}"
    );
    let e = q
        .recv_ring::<16>(&mut mem, 0, RecvConfig::slots(64).count(32))
        .unwrap_err();
    assert!(
        e.to_string().contains("count 32 > the ring's N = 16"),
        "{e}"
    );
    let e = q
        .recv_ring::<16>(&mut mem, (1 << 16) - 8, RecvConfig::slots(64))
        .unwrap_err();
    assert!(e.to_string().contains("no slot of 64 bytes fits"), "{e}");
    // Still free: a good ring builds.
    assert!(q
        .recv_ring::<16>(&mut mem, 0, RecvConfig::slots(64))
        .is_ok());
}

/// Sends one zero-copy WRITE of `src` through the trait's `stage` and waits for it.
///
/// # Safety
/// `src` stays registered and unwritten until the call returns (it waits for the WR).
unsafe fn stage_and_wait<R: PostRing, P: PollCq>(ring: &mut R, poller: &mut P, src: LocalBuf) {
    ring.signal_next();
    // SAFETY: the caller keeps `src` registered and unwritten; this waits for the WR.
    let seq = unsafe { ring.stage(Msg::write(Local::Buf(src), 0)) }.unwrap();
    ring.flush().unwrap();
    while !ring.is_retired(seq) {
        for c in poller.poll().unwrap() {
            ring.on_completion(c).unwrap();
        }
    }
}

/// Through the traits alone: `mem::swap` of two rings (each still posts to its own QP),
/// a batch leaked with `mem::forget` (its WRs never posted, the ring goes on), a panic
/// inside a generic engine's poll closure (the ring drains afterwards), and the trait's
/// `stage` (zero-copy from a registered buffer). In `cargo xtask miri`.
#[test]
fn the_surface_under_swap_forget_and_a_panic() {
    fn run<R: PostRing>(label: &str, r1: &mut R, r2: &mut R, p: &mut CqPoller<'_, 16>) {
        std::mem::swap(r1, r2);
        // r1 is now the ring of the second pair: its WRITE lands in the second target.
        r1.signal_next();
        let s1 = r1.send_now(Msg::write(Local::Inline(&[1; 8]), 0)).unwrap();
        r2.signal_next();
        let s2 = r2.send_now(Msg::write(Local::Inline(&[2; 8]), 0)).unwrap();
        while !(r1.is_retired(s1) && r2.is_retired(s2)) {
            for c in p.poll().unwrap() {
                let ring: &mut R = if c.ring() == r1.ring_id() { r1 } else { r2 };
                ring.on_completion(c).unwrap();
            }
        }
        // A leaked batch: what it staged is never posted; the ring stays usable.
        let posted = r1.posted_total();
        let mut b = r1.batch();
        b.push(Msg::write(Local::Inline(&[9; 8]), 8)).unwrap();
        std::mem::forget(b);
        assert_eq!(
            r1.posted_total(),
            posted,
            "{label}: a leaked batch posts nothing"
        );
        r1.signal_next();
        let s = r1.send_now(Msg::write(Local::Inline(&[3; 8]), 0)).unwrap();
        // A panic in the middle of a generic engine's poll loop.
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine(r1, p, 4);
            panic!("the engine's caller panics");
        }));
        assert!(unwound.is_err());
        while !r1.is_retired(s) || r1.outstanding() > 0 {
            for c in p.poll().unwrap() {
                let ring: &mut R = if c.ring() == r1.ring_id() { r1 } else { r2 };
                ring.on_completion(c).unwrap();
            }
        }
        assert!(r1.error().is_none() && r2.error().is_none(), "{label}");
    }
    let ctx = softnic("surface_swap", false);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(128, None).unwrap();
    let peer_cq = ctx.create_cq(128, None).unwrap();
    let flags = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let read8 = |m: &Mr<'_>, at: usize| {
        let mut b = [0u8; 8];
        m.read_into(at, &mut b).unwrap();
        b
    };
    for wr in [false, true] {
        let ops = wr.then_some(SendOps::RDMA_WRITE);
        let (a1, _b1) = rc_pair(&ctx, &pd, &cq, &peer_cq, ops);
        let (a2, _b2) = rc_pair(&ctx, &pd, &cq, &peer_cq, ops);
        let (t1, t2) = (
            pd.alloc_mr(64, flags).unwrap(),
            pd.alloc_mr(64, flags).unwrap(),
        );
        let mut src = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        src.as_mut_slice().unwrap()[..8].copy_from_slice(&[7; 8]);
        let cfg = |t: &Mr<'_>| SendConfig::default().remote(t.remote().into());
        let mut p = cq.poller::<16>().unwrap();
        let sge = src.local(0, 8).unwrap();
        if wr {
            let (mut r1, mut r2) = (a1.wr_ring(cfg(&t1)).unwrap(), a2.wr_ring(cfg(&t2)).unwrap());
            run("wr", &mut r1, &mut r2, &mut p);
            // SAFETY: `src` is owned here and not written until the WR is retired.
            unsafe { stage_and_wait(&mut r2, &mut p, sge.into()) };
        } else {
            let (mut r1, mut r2) = (
                a1.send_ring::<32>(cfg(&t1)).unwrap(),
                a2.send_ring::<32>(cfg(&t2)).unwrap(),
            );
            run("legacy", &mut r1, &mut r2, &mut p);
            // SAFETY: as above.
            unsafe { stage_and_wait(&mut r2, &mut p, sge.into()) };
        }
        // After the swap r1 is the second pair's ring: the engine it ran wrote 3u64 at
        // offset 24 of t2; r2, the first pair's, staged [7] into t1.
        assert_eq!(read8(&t2, 24), 3u64.to_le_bytes(), "wr {wr}");
        assert_eq!(read8(&t1, 24), [0; 8], "wr {wr}");
        assert_eq!(read8(&t1, 0), [7; 8], "wr {wr}");
    }
}
