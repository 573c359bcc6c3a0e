//! The mlx5 direct path's end-to-end cases, shared by `real_device_mlx5` (a real
//! ConnectX, when there is one) and `direct_softnic_mlx5` (softnic's simulated ConnectX,
//! `SoftnicConfig::mlx5`, always): the same code, so what runs here on every `cargo test`
//! is what a ConnectX runs.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use hotverbs::testing::gid_index;
use hotverbs::*;

/// Lets the device work on what was posted without polling: on softnic's simulated
/// ConnectX, one run of it (deterministic); on hardware, a pause.
pub fn let_device_run(ctx: &Context) {
    if ctx.kind() == DeviceKind::Softnic {
        hotverbs_softnic::mlx5_step();
    } else {
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Two connected RC QPs of the device, each with its own CQ; `a` sends inline up to 64 bytes.
pub fn pair(ctx: &Context, pd: &Pd, cq_a: &Cq, cq_b: &Cq) -> (Qp, Qp) {
    let info = ctx.port_info(None, gid_index()).unwrap();
    let a = QpBuilder::new(pd, cq_a, cq_a, QpType::Rc)
        .max_send_wr(64)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(pd, cq_b, cq_b, QpType::Rc).build().unwrap();
    a.connect(&info, &b.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    b.connect(&info, &a.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    (a, b)
}

/// A direct ring on `a` that has posted 8 inline WRITEs to a remote range the peer never
/// registered: REM_ACCESS_ERR, then flushes.
pub fn failing_writes<'q>(
    a: &'q Qp,
    poller: &mut hotverbs::DirectPoller<'_, 32>,
) -> DirectRing<'q> {
    let bogus = RemoteBuf::new(0x1000, 1 << 20, 0xdead_beef);
    let mut ring = a
        .direct_ring(
            poller,
            SendConfig::new(0, 16, 64).signal_every(4).remote(bogus),
        )
        .unwrap();
    for i in 0..8u64 {
        ring.send_now(Msg::write(Local::Inline(b"x"), i * 8))
            .unwrap();
    }
    ring
}

pub fn direct_ring_writes_reads_and_polls(ctx: &Context) {
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (
        ctx.create_cq(256, None).unwrap(),
        ctx.create_cq(256, None).unwrap(),
    );
    let (a, _b) = pair(ctx, &pd, &cq_a, &cq_b);
    let flags = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let dst = pd.alloc_mr(1 << 16, flags).unwrap();
    let remote = dst.remote();
    let mut poller = cq_a.direct_poller::<32>().unwrap();
    let mut ring = a
        .direct_ring(
            &mut poller,
            SendConfig::new(0, 32, 64)
                .signal_every(8)
                .remote(remote.into()),
        )
        .unwrap();
    // 10,000 inline WRITEs: lone ones (BlueFlame) and batches of 8 (doorbells).
    let payload: Vec<u8> = (0..64u8).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut sent = 0u64;
    while sent < 10_000 {
        let off = (sent % 1000) * 64;
        let m = Msg::write(Local::Inline(&payload[..(sent % 65) as usize]), off);
        let r = if sent % 2 == 0 {
            ring.send_now(m)
        } else {
            let mut b = ring.batch();
            let r = b.push(m);
            b.finish().unwrap();
            r
        };
        match r {
            Ok(_) => sent += 1,
            Err(SendError::WouldBlock) => {}
            Err(e) => panic!("{e}"),
        }
        for c in poller.poll().unwrap() {
            ring.on_completion(c).unwrap();
        }
        assert!(Instant::now() < deadline, "stalled at {sent}: {ring:?}");
    }
    ring.signal_next();
    ring.send_now(Msg::write(Local::Inline(&payload), 0))
        .unwrap();
    while ring.outstanding() > 0 {
        for c in poller.poll().unwrap() {
            ring.on_completion(c).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "last completions never came: {ring:?}"
        );
    }
    // (`as_slice` is refused on an MR a peer may write: copy out.)
    let mut got = [0u8; 64];
    dst.read_into(0, &mut got).unwrap();
    assert_eq!(&got[..], &payload[..]);
    // An RDMA READ into a registered buffer.
    let src = pd.alloc_mr(4096, flags).unwrap();
    let seq = {
        let buf = src.local(0, 64).unwrap();
        ring.signal_next();
        // SAFETY: `src` outlives the WR, untouched until it retires (checked below).
        unsafe { ring.stage(Msg::read(buf.into(), 0)) }.unwrap()
    };
    ring.flush().unwrap();
    while !ring.is_retired(seq) {
        for c in poller.poll().unwrap() {
            ring.on_completion(c).unwrap();
        }
        assert!(Instant::now() < deadline, "READ never completed");
    }
    src.read_into(0, &mut got).unwrap();
    assert_eq!(
        &got[..],
        &payload[..],
        "the READ brought the written bytes back"
    );
}

pub fn direct_path_error_completion_retires_everything(ctx: &Context) {
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (
        ctx.create_cq(256, None).unwrap(),
        ctx.create_cq(256, None).unwrap(),
    );
    let (a, _b) = pair(ctx, &pd, &cq_a, &cq_b);
    let mut poller = cq_a.direct_poller::<32>().unwrap();
    let mut ring = failing_writes(&a, &mut poller);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut err = None;
    while ring.outstanding() > 0 {
        for c in poller.poll().unwrap() {
            if let Err(e) = ring.on_completion(c) {
                err.get_or_insert(e);
            }
        }
        assert!(Instant::now() < deadline, "stuck: {ring:?}");
    }
    assert!(err.is_some(), "the bad rkey must fail");
    assert!(matches!(
        ring.send_now(Msg::write(Local::Inline(b"y"), 0)),
        Err(SendError::QpError(_))
    ));
}

/// Recovery on the direct path: `reset_qp` with the error CQE and flushes still unpolled
/// (libmlx5 does not clean a direct CQ; the poller does), reconnect, send again, and every
/// WR of the second round (which succeeds) is accounted exactly once, none failed by a
/// stale CQE of the first; afterwards libmlx5 may not poll the CQ.
pub fn direct_ring_reset_qp_cleans_the_cq_and_recovers(ctx: &Context) {
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (
        ctx.create_cq(256, None).unwrap(),
        ctx.create_cq(256, None).unwrap(),
    );
    let (a, b) = pair(ctx, &pd, &cq_a, &cq_b);
    let info = ctx.port_info(None, gid_index()).unwrap();
    let mut poller = cq_a.direct_poller::<32>().unwrap();
    let mut ring = failing_writes(&a, &mut poller);
    // Let the device fail them, polling nothing (the count below holds either way: nothing
    // was retired; on hardware the pause only makes it likely that the CQEs are there to
    // clean, on softnic they are).
    let_device_run(ctx);
    assert_eq!(ring.reset_qp(&mut poller).unwrap(), 8, "none was retired");
    assert_eq!(ring.cur_post(), 0);
    assert_eq!(ring.outstanding(), 0);
    b.connect(&info, &a.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    a.connect(&info, &b.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    // The second round succeeds (SENDs to posted receives), so a stale error or flush CQE
    // of the first round read against the reset ring's reused `wrid` entries would show
    // as an error here.
    let rx = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..8u64 {
        // SAFETY: `rx` outlives the receives, which complete (polled below) before it drops.
        unsafe { b.post_recv(i, &[rx.local(i as usize * 64, 64).unwrap()]) }.unwrap();
    }
    let first = ring.posted_total();
    for _ in 0..8 {
        ring.send_now(Msg::send(Local::Inline(b"y"))).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut errors = Vec::new();
    while ring.outstanding() > 0 {
        for c in poller.poll().unwrap() {
            if let Err(e) = ring.on_completion(c) {
                errors.push(e);
            }
        }
        assert!(Instant::now() < deadline, "stuck: {ring:?}");
    }
    assert!(
        errors.is_empty(),
        "stale CQEs of the first round: {errors:?}"
    );
    let mut got = 0;
    let mut wc = [Wc::default(); 8];
    while got < 8 {
        let n = cq_b.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert!(w.status().is_ok(), "{w:?}");
            assert_eq!(w.byte_len(), 1);
            got += 1;
        }
        assert!(Instant::now() < deadline, "the peer received {got} of 8");
    }
    assert_eq!(ring.retired_total(), first + 8, "exactly the second round");
    drop(poller);
    let e = cq_a.poll(&mut [Wc::default()]).unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "{e}");
    assert!(
        e.to_string().contains("mlx5dv_init_obj"),
        "the direct path's refusal: {e}"
    );
    assert!(
        cq_a.direct_poller::<8>().is_ok(),
        "a direct poller takes over"
    );
}

/// Event-driven use of the direct path: `req_notify` on a CQ a direct poller polls arms it
/// from the poller's consumer index (libmlx5's own one falls behind), three rounds of arm,
/// signaled send, event, poll; the sequence number follows the events taken.
pub fn req_notify_on_a_direct_cq_wakes_for_each_new_completion(ctx: &Context) {
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let (cq_a, cq_b) = (
        ctx.create_cq(256, Some(&ch)).unwrap(),
        ctx.create_cq(256, None).unwrap(),
    );
    let (a, _b) = pair(ctx, &pd, &cq_a, &cq_b);
    let flags = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let dst = pd.alloc_mr(4096, flags).unwrap();
    let mut poller = cq_a.direct_poller::<32>().unwrap();
    let mut ring = a
        .direct_ring(
            &mut poller,
            SendConfig::new(0, 16, 64).remote(dst.remote().into()),
        )
        .unwrap();
    for round in 0..3u64 {
        // Armed from the poller's consumer index, after the last round's completion.
        cq_a.req_notify(false).unwrap();
        // Armed at the poller's consumer index: nothing new yet, so no event (an arm from
        // a stale index would fire at once, for CQEs already consumed).
        let_device_run(ctx);
        assert!(
            ch.wait_cq_event(Duration::ZERO).unwrap().is_none(),
            "round {round}: an event before any new completion"
        );
        ring.signal_next();
        let seq = ring
            .send_now(Msg::write(Local::Inline(b"wake"), round * 8))
            .unwrap();
        // Nobody polls while we wait for the event: softnic's device must be run.
        let_device_run(ctx);
        let ev = ch
            .wait_cq_event(Duration::from_secs(10))
            .unwrap()
            .unwrap_or_else(|| panic!("round {round}: no event"));
        assert!(ev.is_for(&cq_a));
        cq_a.ack_events(1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ring.is_retired(seq) {
            for c in poller.poll().unwrap() {
                ring.on_completion(c).unwrap();
            }
            assert!(Instant::now() < deadline, "round {round}: no completion");
        }
    }
}

/// A QP with a direct ring destroyed with its error and flushes unpolled: libmlx5 does not
/// clean a direct CQ, so the direct poller does at its next poll. Nothing of the dead QP
/// comes out, and a new QP on the same CQ works.
pub fn destroying_a_qp_cleans_its_cqes_from_the_direct_cq(ctx: &Context) {
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (
        ctx.create_cq(256, None).unwrap(),
        ctx.create_cq(256, None).unwrap(),
    );
    let mut poller = cq_a.direct_poller::<32>().unwrap();
    {
        let (a, _b) = pair(ctx, &pd, &cq_a, &cq_b);
        let _ring = failing_writes(&a, &mut poller);
        // Let the device fail them (the assertions hold either way; on softnic the CQEs
        // are certainly there).
        let_device_run(ctx);
        a.destroy().unwrap();
    }
    assert!(
        poller.poll().unwrap().is_empty(),
        "no CQE of the destroyed QP"
    );
    let (a2, _b2) = pair(ctx, &pd, &cq_a, &cq_b);
    let mut ring = failing_writes(&a2, &mut poller);
    let deadline = Instant::now() + Duration::from_secs(30);
    while ring.outstanding() > 0 {
        for c in poller.poll().unwrap() {
            assert_eq!(c.qp_num(), a2.qp_num(), "only the new QP's completions");
            let _ = ring.on_completion(c);
        }
        assert!(Instant::now() < deadline, "stuck: {ring:?}");
    }
}
