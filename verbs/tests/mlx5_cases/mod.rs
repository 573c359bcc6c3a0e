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

/// A PD and two CQs of `cqe` entries (no channel).
pub fn setup(ctx: &Context, cqe: u32) -> (Pd, Cq, Cq) {
    (
        ctx.alloc_pd().unwrap(),
        ctx.create_cq(cqe, None).unwrap(),
        ctx.create_cq(cqe, None).unwrap(),
    )
}

/// Two connected RC QPs of the device, each with its own CQ; `a` sends inline up to 64 bytes.
pub fn pair(ctx: &Context, pd: &Pd, cq_a: &Cq, cq_b: &Cq) -> (Qp, Qp) {
    pair_with(ctx, pd, cq_a, cq_b, 1, &ConnectOptions::default())
}

/// [`pair`] with `sges` send SGEs on `a` and the connection options `o`.
pub fn pair_with(
    ctx: &Context,
    pd: &Pd,
    cq_a: &Cq,
    cq_b: &Cq,
    sges: u32,
    o: &ConnectOptions,
) -> (Qp, Qp) {
    let info = ctx.port_info(None, gid_index()).unwrap();
    let a = QpBuilder::new(pd, cq_a, cq_a, QpType::Rc)
        .max_send_wr(64)
        .max_send_sge(sges)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(pd, cq_b, cq_b, QpType::Rc).build().unwrap();
    a.connect(&info, &b.endpoint(&info), o).unwrap();
    b.connect(&info, &a.endpoint(&info), o).unwrap();
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
    let (pd, cq_a, cq_b) = setup(ctx, 256);
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
    // 10,000 inline WRITEs: lone ones and batches of 8, each post one 8-byte doorbell (this
    // QP is in no thread domain, so its ring never BlueFlames: `register_use`; the thread
    // domain case below is the BlueFlame one).
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
    let (pd, cq_a, cq_b) = setup(ctx, 256);
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
    let (pd, cq_a, cq_b) = setup(ctx, 256);
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
/// from the poller's consumer index (libmlx5's own one falls behind), four rounds of arm,
/// signaled send, event, poll; the sequence number follows the events taken. Nobody polls
/// or runs the device between the send and the event: the device runs by itself (softnic's
/// simulated one while a thread waits on the channel). Odd rounds wait in a blocking
/// `get_cq_event` on another thread (a minute's guard turns a hang into a failure).
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
    for round in 0..4u64 {
        // Armed from the poller's consumer index, after the last round's completion
        // (through the poller: `Cq::req_notify` would race its writes, and is refused).
        assert_eq!(
            cq_a.req_notify(false).unwrap_err().errno(),
            libc::EBUSY,
            "round {round}"
        );
        poller.req_notify(false).unwrap();
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
        let ev = if round % 2 == 0 {
            ch.wait_cq_event(Duration::from_secs(10))
                .unwrap()
                .unwrap_or_else(|| panic!("round {round}: no event"))
        } else {
            let (tx, rx) = std::sync::mpsc::channel();
            let waiter = ch.clone();
            std::thread::spawn(move || {
                let _ = tx.send(waiter.get_cq_event());
            });
            rx.recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("round {round}: get_cq_event still blocked"))
                .unwrap()
        };
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
    let (pd, cq_a, cq_b) = setup(ctx, 256);
    let mut poller = cq_a.direct_poller::<32>().unwrap();
    {
        let (a, _b) = pair(ctx, &pd, &cq_a, &cq_b);
        let ring = failing_writes(&a, &mut poller);
        // Let the device fail them (the assertions hold either way; on softnic the CQEs
        // are certainly there).
        let_device_run(ctx);
        // The ring (which borrows the QP, and gives up its send queue when dropped) goes
        // first; its CQEs stay unpolled in the CQ.
        drop(ring);
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

/// A UD direct ring (`direct_ring_ud`: the AH's mlx5 address vector in every WQE) sending
/// to a UD peer: 16 SENDs of 1 to 46 bytes, lone and batched, each arriving whole after its
/// GRH, from the ring's QP, in order.
pub fn direct_ring_ud_reaches_a_ud_peer(ctx: &Context) {
    let info = ctx.port_info(None, gid_index()).unwrap();
    let (pd, cq_a, cq_b) = setup(ctx, 64);
    let a = QpBuilder::new(&pd, &cq_a, &cq_a, QpType::Ud)
        .max_send_wr(32)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &cq_b, &cq_b, QpType::Ud)
        .max_recv_wr(32)
        .build()
        .unwrap();
    let o = ConnectOptions::default();
    a.connect(&info, &Endpoint::default(), &o).unwrap();
    b.connect(&info, &Endpoint::default(), &o).unwrap();
    let attr = AhAttr::from_port(&info, info.gid, info.lid);
    let ah = pd.create_ah(&attr).unwrap();
    let rx = pd.alloc_mr(16 * 128, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..16u64 {
        // SAFETY: `rx` outlives the receives, all polled below.
        unsafe { b.post_recv(i, &[rx.local(i as usize * 128, 128).unwrap()]) }.unwrap();
    }
    let mut poller = cq_a.direct_poller::<32>().unwrap();
    let mut ring = a
        .direct_ring_ud(
            &mut poller,
            &ah,
            b.qp_num(),
            DEFAULT_QKEY,
            SendConfig::new(0, 16, 64).signal_every(4),
        )
        .unwrap();
    let msg = |i: usize| -> Vec<u8> { (0..1 + i * 3).map(|k| (i * 16 + k) as u8).collect() };
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0..16usize {
        let m = msg(i);
        if i % 2 == 0 {
            ring.send_now(Msg::send(Local::Inline(&m))).unwrap();
        } else {
            let mut batch = ring.batch();
            batch.push(Msg::send(Local::Inline(&m))).unwrap();
            batch.finish().unwrap();
        }
    }
    while ring.outstanding() > 0 {
        for c in poller.poll().unwrap() {
            ring.on_completion(c).unwrap();
        }
        assert!(Instant::now() < deadline, "stuck: {ring:?}");
    }
    let mut wc = [Wc::default(); 16];
    let mut got = 0usize;
    while got < 16 {
        let n = cq_b.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert!(w.is_ok(), "{w:?}");
            let i = w.wr_id() as usize;
            assert_eq!(i, got, "in order");
            let m = msg(i);
            assert_eq!(w.byte_len() as usize, 40 + m.len(), "GRH + message {i}");
            assert_eq!(w.src_qp(), a.qp_num());
            assert_eq!(
                rx.read_vec(i * 128 + 40, m.len()).unwrap(),
                m,
                "message {i}"
            );
            got += 1;
        }
        assert!(Instant::now() < deadline, "the peer received {got} of 16");
    }
}

/// The other WQE kinds end to end: fetch-and-add and compare-and-swap (a match and a
/// miss), SEND and WRITE with immediate data, a WRITE gathered from registered SGEs and one
/// from inline pieces; the results read back on both sides.
pub fn direct_ring_atomics_immediates_and_gathers(ctx: &Context) {
    let (pd, cq_a, cq_b) = setup(ctx, 64);
    let (a, b) = pair_with(ctx, &pd, &cq_a, &cq_b, 4, &ConnectOptions::default());
    let flags = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mut dst = pd.alloc_mr(4096, flags).unwrap();
    dst.write_from(0, &100u64.to_ne_bytes()).unwrap();
    let mut loc = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    loc.write_from(100, b"abc").unwrap();
    loc.write_from(200, b"defg").unwrap();
    let rx = pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..2u64 {
        // SAFETY: `rx` outlives the receives, both polled below.
        unsafe { b.post_recv(10 + i, &[rx.local(i as usize * 128, 128).unwrap()]) }.unwrap();
    }
    let mut poller = cq_a.direct_poller::<32>().unwrap();
    let mut ring = a
        .direct_ring(
            &mut poller,
            SendConfig::new(0, 16, 64)
                .signal_every(4)
                .remote(dst.remote().into()),
        )
        .unwrap();
    // SAFETY: `loc` outlives every WR (all retired below) and is not touched meanwhile.
    unsafe {
        ring.stage(Msg::fetch_add(loc.local(0, 8).unwrap().into(), 0, 5))
            .unwrap();
        ring.stage(Msg::cmp_swap(loc.local(8, 8).unwrap().into(), 0, 105, 7))
            .unwrap();
        ring.stage(Msg::cmp_swap(loc.local(16, 8).unwrap().into(), 0, 999, 1))
            .unwrap();
        ring.stage_gather(
            Msg::write(Local::Empty, 512),
            &[
                loc.local(100, 3).unwrap().into(),
                loc.local(200, 4).unwrap().into(),
            ],
        )
        .unwrap();
    }
    ring.stage_inline_gather(Msg::write(Local::Empty, 768), &[b"12", b"345"])
        .unwrap();
    ring.flush().unwrap();
    ring.send_now(Msg::send_imm(Local::Inline(b"imm"), 0xabcd))
        .unwrap();
    ring.signal_next();
    ring.send_now(Msg::write_imm(Local::Inline(b"wimm"), 256, 0x1234))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while ring.outstanding() > 0 {
        for c in poller.poll().unwrap() {
            ring.on_completion(c).unwrap();
        }
        assert!(Instant::now() < deadline, "stuck: {ring:?}");
    }
    assert_eq!(
        loc.read_u64(0).unwrap(),
        100,
        "fetch-add returns the old value"
    );
    assert_eq!(
        loc.read_u64(8).unwrap(),
        105,
        "compare-swap (match) returns it"
    );
    assert_eq!(
        loc.read_u64(16).unwrap(),
        7,
        "compare-swap (miss) returns it"
    );
    assert_eq!(dst.read_u64(0).unwrap(), 7, "100 + 5, swapped to 7, kept");
    let mut got = [0u8; 7];
    dst.read_into(512, &mut got).unwrap();
    assert_eq!(&got, b"abcdefg", "the SGE gather");
    dst.read_into(768, &mut got[..5]).unwrap();
    assert_eq!(&got[..5], b"12345", "the inline gather");
    dst.read_into(256, &mut got[..4]).unwrap();
    assert_eq!(&got[..4], b"wimm");
    let mut wc = [Wc::default(); 2];
    let mut seen = 0;
    while seen < 2 {
        let n = cq_b.poll(&mut wc[seen..]).unwrap();
        seen += n;
        assert!(Instant::now() < deadline, "the peer completed {seen} of 2");
    }
    assert!(wc.iter().all(|w| w.is_ok()), "{wc:?}");
    assert_eq!(wc[0].imm_data(), Some(0xabcd));
    assert_eq!(wc[0].byte_len(), 3);
    assert_eq!(rx.read_vec(0, 3).unwrap(), b"imm");
    assert_eq!(wc[1].imm_data(), Some(0x1234));
    assert_eq!(wc[1].opcode(), hotverbs_ffi::IBV_WC_RECV_RDMA_WITH_IMM);
}

/// Two direct rings on one send CQ and its one direct poller: interleaved WRITEs, every
/// completion offered to both rings, each retiring exactly its own (the `wr_id` tables are
/// per QP, the ring ids per CQ).
pub fn two_direct_rings_share_one_direct_poller(ctx: &Context) {
    let (pd, cq_a, cq_b) = setup(ctx, 256);
    let (a1, _b1) = pair(ctx, &pd, &cq_a, &cq_b);
    let (a2, _b2) = pair(ctx, &pd, &cq_a, &cq_b);
    let flags = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let dst = pd.alloc_mr(4096, flags).unwrap();
    let mut poller = cq_a.direct_poller::<32>().unwrap();
    let cfg = SendConfig::new(0, 32, 64)
        .signal_every(8)
        .remote(dst.remote().into());
    let mut rings = [
        a1.direct_ring(&mut poller, cfg).unwrap(),
        a2.direct_ring(&mut poller, cfg).unwrap(),
    ];
    assert_ne!(rings[0].ring_id(), rings[1].ring_id(), "ring ids per CQ");
    let qpn = [a1.qp_num(), a2.qp_num()];
    let n = 1000u64;
    let mut sent = [0u64; 2];
    let mut retired = [0u64; 2];
    let deadline = Instant::now() + Duration::from_secs(30);
    while sent[0] < n || sent[1] < n || rings.iter().any(|r| r.outstanding() > 0) {
        for (k, ring) in rings.iter_mut().enumerate() {
            if sent[k] < n {
                if sent[k] == n - 1 {
                    ring.signal_next();
                }
                let byte = [k as u8 + 1];
                let off = k as u64 * 2048 + sent[k] % 2048;
                match ring.send_now(Msg::write(Local::Inline(&byte), off)) {
                    Ok(_) => sent[k] += 1,
                    Err(SendError::WouldBlock) => {}
                    Err(e) => panic!("ring {k}: {e}"),
                }
            }
        }
        for c in poller.poll().unwrap() {
            let mut owners = 0;
            for (k, ring) in rings.iter_mut().enumerate() {
                // Offered to both: the other ring names the completion as not its own.
                match ring.on_completion(c) {
                    Ok(got) if got > 0 => {
                        assert_eq!(c.qp_num(), qpn[k], "ring {k} retired another QP's WRs");
                        retired[k] += got;
                        owners += 1;
                    }
                    Ok(_) => {}
                    Err(WcError::Misrouted(m)) => {
                        assert_ne!(c.qp_num(), qpn[k], "ring {k} refused its own: {m:?}")
                    }
                    Err(e) => panic!("ring {k}: {e}"),
                }
            }
            assert_eq!(owners, 1, "exactly one ring owns each completion");
        }
        assert!(Instant::now() < deadline, "stuck: {sent:?} {retired:?}");
    }
    assert_eq!(retired, [n, n], "every WR retired once, by its own ring");
    let mut got = vec![0u8; 4096];
    dst.read_into(0, &mut got).unwrap();
    assert!(got[..1000].iter().all(|&b| b == 1), "ring 0's bytes");
    assert!(got[2048..3048].iter().all(|&b| b == 2), "ring 1's bytes");
}

/// No silent hang, no lost WR: a SEND to a peer with no receive posted (`rnr_retry` 7:
/// the sender retries for ever) stays outstanding, whatever the polls; once the peer posts
/// a receive it completes, successfully, and the message is there.
pub fn a_send_waiting_for_a_receive_completes_once_one_is_posted(ctx: &Context) {
    let (pd, cq_a, cq_b) = setup(ctx, 64);
    let forever = ConnectOptions {
        rnr_retry: 7,
        ..Default::default()
    };
    let (a, b) = pair_with(ctx, &pd, &cq_a, &cq_b, 1, &forever);
    let mut poller = cq_a.direct_poller::<32>().unwrap();
    let mut ring = a
        .direct_ring(&mut poller, SendConfig::new(0, 8, 64).signal_every(4))
        .unwrap();
    ring.signal_next();
    let seq = ring.send_now(Msg::send(Local::Inline(b"hold"))).unwrap();
    for _ in 0..100 {
        let_device_run(ctx);
        let early = poller.poll().unwrap();
        assert!(
            early.is_empty(),
            "completed with no receive posted: {early:?}"
        );
        if ctx.kind() != DeviceKind::Softnic {
            break; // one 200 ms pause is enough on hardware
        }
    }
    assert_eq!(ring.outstanding(), 1, "waiting, not lost");
    let rx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    // SAFETY: `rx` outlives the receive, polled below.
    unsafe { b.post_recv(1, &[rx.local(0, 64).unwrap()]) }.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ring.is_retired(seq) {
        for c in poller.poll().unwrap() {
            ring.on_completion(c).unwrap();
        }
        assert!(Instant::now() < deadline, "never completed: {ring:?}");
    }
    let mut wc = [Wc::default()];
    while cq_b.poll(&mut wc).unwrap() == 0 {
        assert!(Instant::now() < deadline, "the peer never completed");
    }
    assert!(wc[0].is_ok(), "{:?}", wc[0]);
    assert_eq!(rx.read_vec(0, 4).unwrap(), b"hold");
}

/// A `direct_poller` refused because the CQ already has a verbs poller leaves the CQ as it
/// was: the verbs poller keeps receiving the completions (the refusal comes before
/// `mlx5dv_init_obj`, which would make the CQ the direct path's).
pub fn a_refused_direct_poller_leaves_the_verbs_poller_working(ctx: &Context) {
    let (pd, cq_a, cq_b) = setup(ctx, 64);
    let (a, _b) = pair(ctx, &pd, &cq_a, &cq_b);
    let dst = pd
        .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let mut vp = cq_a.poller::<8>().unwrap();
    let e = cq_a.direct_poller::<8>().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "{e}");
    let mut ring = a
        .send_ring::<16>(SendConfig::new(0, 16, 64).remote(dst.remote().into()))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    for round in 0..4u64 {
        ring.signal_next();
        let seq = ring
            .send_now(Msg::write(Local::Inline(b"verbs"), round * 8))
            .unwrap();
        while !ring.is_retired(seq) {
            for c in vp.poll().unwrap() {
                ring.on_completion(c).unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: the verbs poller got nothing"
            );
        }
    }
    drop(vp);
    // Still a verbs CQ: a new verbs poller is accepted (refused for good on a CQ of the
    // direct path). `Cq::poll` is refused too, but for the ring completing on the CQ
    // (its completions are the ring's), not for the direct path.
    let e = cq_a.poll(&mut [Wc::default()]).unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "{e}");
    assert!(
        e.to_string().contains("rings") && !e.to_string().contains("direct path"),
        "refused for the ring, not as a direct CQ: {e}"
    );
    assert!(cq_a.poller::<8>().is_ok(), "still a verbs CQ");
}

/// A direct ring on a UC QP: SENDs (one solicited, one fenced) reach the peer's receives,
/// RDMA WRITEs (with immediate too) its memory; RDMA READ and atomics, which UC does not
/// carry, are refused by name before any byte is written.
pub fn direct_ring_on_uc_sends_and_writes(ctx: &Context) {
    let (pd, cq_a, cq_b) = setup(ctx, 64);
    let info = ctx.port_info(None, gid_index()).unwrap();
    let a = QpBuilder::new(&pd, &cq_a, &cq_a, QpType::Uc)
        .max_send_wr(64)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &cq_b, &cq_b, QpType::Uc)
        .build()
        .unwrap();
    let o = ConnectOptions::default();
    a.connect(&info, &b.endpoint(&info), &o).unwrap();
    b.connect(&info, &a.endpoint(&info), &o).unwrap();
    let dst = pd
        .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let rx = pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..3u64 {
        // SAFETY: `rx` outlives the receives, polled below.
        unsafe { b.post_recv(i, &[rx.local(i as usize * 64, 64).unwrap()]) }.unwrap();
    }
    let mut poller = cq_a.direct_poller::<32>().unwrap();
    let mut ring = a
        .direct_ring(
            &mut poller,
            SendConfig::new(0, 16, 64)
                .signal_every(1)
                .remote(dst.remote().into()),
        )
        .unwrap();
    let local = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let dest = local.local(0, 8).unwrap();
    for m in [
        Msg::read(dest.into(), 0),
        Msg::fetch_add(dest.into(), 0, 1),
        Msg::cmp_swap(dest.into(), 0, 0, 1),
    ] {
        // SAFETY: refused before anything is posted.
        let e = unsafe { ring.stage(m) }.unwrap_err();
        assert_eq!(e, SendError::NotOnUc(m.opcode()), "{e}");
    }
    assert_eq!(ring.staged(), 0);
    let msgs = [
        Msg::send(Local::Inline(b"uc send")).solicited(),
        Msg::write(Local::Inline(b"uc write"), 0),
        Msg::send_imm(Local::Inline(b"uc imm"), 0x1234).fence(),
        Msg::write_imm(Local::Inline(b"uc write imm"), 64, 0x5678),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    for m in msgs {
        let seq = ring.send_now(m).unwrap();
        while !ring.is_retired(seq) {
            for c in poller.poll().unwrap() {
                ring.on_completion(c).unwrap();
            }
            assert!(Instant::now() < deadline, "never completed: {ring:?}");
        }
    }
    // Three receives consumed: two SENDs and the WRITE with immediate.
    let mut wcs = Vec::new();
    while wcs.len() < 3 {
        let mut wc = [Wc::default(); 4];
        let n = cq_b.poll(&mut wc).unwrap();
        wcs.extend_from_slice(&wc[..n]);
        assert!(Instant::now() < deadline, "the peer got {wcs:?}");
    }
    assert!(wcs.iter().all(|w| w.is_ok()), "{wcs:?}");
    assert_eq!(rx.read_vec(0, 7).unwrap(), b"uc send");
    assert_eq!(rx.read_vec(64, 6).unwrap(), b"uc imm");
    assert_eq!(dst.read_vec(0, 8).unwrap(), b"uc write");
    assert_eq!(dst.read_vec(64, 12).unwrap(), b"uc write imm");
}

/// The peer of [`fixed_size_apis_on_a_thread_domain_ring`]: receives posted ahead of the
/// sender (message `i` into slot `i % RX`, `wr_id` `i`), each completion checked in order.
struct Peer {
    rx: Mr<'static>,
    posted: u64,
    got: u64,
}

/// Receive slots of [`Peer`] (64 bytes each).
const RX: u64 = 32;

/// The `i`th message of the stream: its index, then a pattern of it.
fn fixed_msg(i: u64) -> [u8; 32] {
    let mut m = [0u8; 32];
    m[..8].copy_from_slice(&i.to_le_bytes());
    for (k, b) in m[8..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(7).wrapping_add(k as u8);
    }
    m
}

impl Peer {
    /// Polls the peer's CQ, checking each message (in order, whole, as sent), and keeps
    /// `RX` receives posted ahead, up to `total`.
    fn pump(&mut self, b: &Qp, cq_b: &Cq, total: u64) {
        let mut wc = [Wc::default(); 16];
        let n = cq_b.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert!(w.is_ok(), "message {}: {w:?}", self.got);
            assert_eq!(w.wr_id(), self.got, "in order");
            assert_eq!(w.byte_len(), 32, "message {}", self.got);
            let slot = (self.got % RX) as usize * 64;
            assert_eq!(
                self.rx.read_vec(slot, 32).unwrap(),
                fixed_msg(self.got),
                "message {}",
                self.got
            );
            self.got += 1;
        }
        while self.posted < (self.got + RX).min(total) {
            let slot = (self.posted % RX) as usize * 64;
            // SAFETY: `rx` outlives the receive (every one is polled before the case ends)
            // and its slot is not reposted before this receive completed (`got + RX`).
            unsafe { b.post_recv(self.posted, &[self.rx.local(slot, 64).unwrap()]) }.unwrap();
            self.posted += 1;
        }
    }
}

/// An RC pair whose sender `a` is in a thread domain of its own (a parent domain over the
/// PD: its register BlueFlames) with 64 send WRs and 64 inline bytes, and a receiver `b`
/// with `RX` receive WRs, connected with `o`.
struct TdPair {
    pd: Pd,
    cq_a: Cq,
    cq_b: Cq,
    a: Qp,
    b: Qp,
    /// Kept alive for `a`.
    _pdom: ParentDomain,
    _td: ThreadDomain,
}

fn td_pair(ctx: &Context, o: &ConnectOptions) -> TdPair {
    let info = ctx.port_info(None, gid_index()).unwrap();
    let (pd, cq_a, cq_b) = setup(ctx, 256);
    let td = ctx.alloc_td().unwrap();
    let pdom = pd.alloc_parent_domain(Some(&td)).unwrap();
    let a = QpBuilder::new(&pdom, &cq_a, &cq_a, QpType::Rc)
        .max_send_wr(64)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &cq_b, &cq_b, QpType::Rc)
        .max_recv_wr(RX as u32)
        .build()
        .unwrap();
    a.connect(&info, &b.endpoint(&info), o).unwrap();
    b.connect(&info, &a.endpoint(&info), o).unwrap();
    TdPair {
        pd,
        cq_a,
        cq_b,
        a,
        b,
        _pdom: pdom,
        _td: td,
    }
}

/// A held session's unsignaled WRs flushed by the QP's move to ERR: the peer posted no
/// receive and the sender retries RNR for ever (`rnr_retry` 7), so the session's SENDs
/// wait; `to_error` then flushes them, each with an error CQE whose `wrid` entry the
/// session's fast path never wrote (a ring that BlueFlames, in a thread domain, so the
/// fast path runs). Every WR retires exactly once, through the session, each error a
/// flush, and the ring counts them all.
pub fn a_sessions_unsignaled_wrs_retire_once_when_flushed(ctx: &Context) {
    unsignaled_wrs_retire_once_when_flushed(ctx, false);
}

/// [`a_sessions_unsignaled_wrs_retire_once_when_flushed`] through `send_now`: a lone run,
/// whose lone path writes no `wrid` entry either, flushed while the run is open (only
/// polls and `on_completion` between the posts and the flush).
pub fn a_lone_runs_unsignaled_wrs_retire_once_when_flushed(ctx: &Context) {
    unsignaled_wrs_retire_once_when_flushed(ctx, true);
}

fn unsignaled_wrs_retire_once_when_flushed(ctx: &Context, lone: bool) {
    const N: u64 = 6;
    let o = ConnectOptions {
        rnr_retry: 7,
        ..ConnectOptions::default()
    };
    // Everything of the pair lives to the end (the peer with it: RNR, not a departure;
    // `_`-prefixed bindings still hold their values).
    let TdPair {
        cq_a,
        a,
        pd: _pd,
        cq_b: _cq_b,
        b: _b,
        _pdom,
        _td,
    } = td_pair(ctx, &o);
    let mut poller = cq_a.direct_poller::<32>().unwrap();
    let mut ring = a
        .direct_ring(&mut poller, SendConfig::new(0, 32, 64).signal_every(16))
        .unwrap();
    let (posted0, retired0) = (ring.posted_total(), ring.retired_total());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut flushed = 0u64;
    let mut retire =
        |c: &Completion, r: &mut dyn FnMut(&Completion) -> Result<u64, WcError>| match r(c) {
            Ok(n) => panic!("{n} retired by a success after the move to ERR"),
            Err(e) => {
                assert_eq!(e, WcError::WrFlush, "a flushed WR's error");
                flushed += 1;
            }
        };
    if lone {
        // All unsignaled (the first signal is the 16th); the first opens the run (its
        // `wrid` entry written), the others take the lone path when the ring BlueFlames.
        for i in 0..N {
            if i > 0 && ring.blueflame() {
                assert!(ring.lone_ready(), "wr {i} on the lone path");
            }
            let m = fixed_msg(i);
            assert_eq!(
                ring.send_now(Msg::send(Local::Inline(&m))).unwrap(),
                posted0 + i
            );
        }
        for _ in 0..4 {
            let cs = poller.poll().unwrap();
            assert!(cs.is_empty(), "a completion before the flush: {cs:?}");
        }
        a.to_error().unwrap();
        while ring.outstanding() > 0 {
            for c in poller.poll().unwrap() {
                retire(c, &mut |c| ring.on_completion(c));
            }
            assert!(
                Instant::now() < deadline,
                "the flush never retired the run's WRs: {ring:?}"
            );
        }
        let m = fixed_msg(N);
        assert!(matches!(
            ring.send_now(Msg::send(Local::Inline(&m))),
            Err(SendError::QpError(_))
        ));
    } else {
        let mut s = ring.session::<32>().unwrap();
        // All unsignaled (the first signal is the 16th); only the first goes through the
        // session's slow path, which writes its `wrid` entry.
        for i in 0..N {
            assert_eq!(s.send(&fixed_msg(i)).unwrap(), posted0 + i);
        }
        // The device runs (softnic: in the poll) and finds no receive at the peer.
        for _ in 0..4 {
            let cs = poller.poll().unwrap();
            assert!(cs.is_empty(), "a completion before the flush: {cs:?}");
        }
        a.to_error().unwrap();
        while s.outstanding() > 0 {
            for c in poller.poll().unwrap() {
                retire(c, &mut |c| s.on_completion(c));
            }
            assert!(
                Instant::now() < deadline,
                "the flush never retired the session's WRs: {s:?}"
            );
        }
        assert!(matches!(s.send(&fixed_msg(N)), Err(SendError::QpError(_))));
    }
    assert!(flushed >= 1, "at least the WR the others follow is flushed");
    assert_eq!(ring.posted_total() - posted0, N);
    assert_eq!(ring.retired_total() - retired0, N, "every WR retired once");
    assert_eq!(ring.outstanding(), 0);
}

/// The fixed-size APIs on a ring that BlueFlames: an RC QP in a thread domain of its own
/// (a parent domain over the PD) gets a ring whose `register_use` is BlueFlame (doorbell
/// only under `MLX5_SHUT_UP_BF`, saying so), and a stream of 32-byte SENDs goes through
/// `session::<32>()` (retiring through the session's `on_completion`), then `post_list`,
/// then `window`, then one signaled `send_now` that retires the rest: every message
/// arrives at the peer whole and in order, every WR retires exactly once, and the
/// sequence numbers run on without a gap across the three APIs.
pub fn fixed_size_apis_on_a_thread_domain_ring(ctx: &Context) {
    const PHASE: u64 = 300;
    const TOTAL: u64 = 3 * PHASE + 1;
    let TdPair {
        pd,
        cq_a,
        cq_b,
        a,
        b,
        _pdom,
        _td,
    } = td_pair(ctx, &ConnectOptions::default());
    let mut peer = Peer {
        rx: pd
            .alloc_mr(RX as usize * 64, AccessFlags::LOCAL_WRITE)
            .unwrap(),
        posted: 0,
        got: 0,
    };
    peer.pump(&b, &cq_b, TOTAL);
    let mut poller = cq_a.direct_poller::<32>().unwrap();
    let mut ring = a
        .direct_ring(&mut poller, SendConfig::new(0, 32, 64).signal_every(8))
        .unwrap();
    let shut_up_bf = std::env::var_os("MLX5_SHUT_UP_BF").is_some_and(|v| v != "0");
    if shut_up_bf {
        assert_eq!(
            ring.register_use(),
            RegisterUse::DoorbellOnly(DoorbellOnly::ShutUpBf),
            "{}",
            ring.register_use()
        );
    } else {
        assert!(
            ring.blueflame(),
            "a thread domain's register is the ring's own: {}",
            ring.register_use()
        );
        assert_eq!(
            ring.register_use(),
            RegisterUse::BlueFlame { first_offset: 0 },
            "a fresh thread domain's register starts at its first buffer"
        );
    }
    let (posted0, retired0) = (ring.posted_total(), ring.retired_total());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut sent = 0u64;
    let mut retired = 0u64;
    // 1. A held session: one doorbell per message, its completions through it.
    {
        let mut s = ring.session::<32>().unwrap();
        let first = s.next_seq();
        assert_eq!(
            first, posted0,
            "a WR's sequence number is its place in the ring"
        );
        while sent < PHASE {
            peer.pump(&b, &cq_b, TOTAL);
            if sent < peer.posted {
                match s.send(&fixed_msg(sent)) {
                    Ok(seq) => {
                        assert_eq!(seq, posted0 + sent, "sequence numbers run on");
                        sent += 1;
                    }
                    Err(SendError::WouldBlock) => {}
                    Err(e) => panic!("session send {sent}: {e}"),
                }
            }
            for c in poller.poll().unwrap() {
                retired += s.on_completion(c).unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "session stalled at {sent}: {s:?}"
            );
        }
        assert_eq!(s.next_seq(), posted0 + PHASE);
    }
    assert_eq!(
        ring.posted_total() - posted0,
        PHASE,
        "the session's WRs are the ring's"
    );
    // 2. Post lists of up to 8, one doorbell each.
    while sent < 2 * PHASE {
        peer.pump(&b, &cq_b, TOTAL);
        let k = (2 * PHASE).min(peer.posted).saturating_sub(sent).min(8);
        if k > 0 {
            let list: Vec<[u8; 32]> = (sent..sent + k).map(fixed_msg).collect();
            assert_eq!(ring.posted_total(), posted0 + sent);
            match ring.post_list(&list) {
                Ok(m) => {
                    assert!(m >= 1 && m as u64 <= k, "{m} of {k}");
                    assert_eq!(ring.posted_total(), posted0 + sent + m as u64);
                    sent += m as u64;
                }
                Err(SendError::WouldBlock) => {}
                Err(e) => panic!("post_list at {sent}: {e}"),
            }
        }
        for c in poller.poll().unwrap() {
            retired += ring.on_completion(c).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "post_list stalled at {sent}: {ring:?}"
        );
    }
    // 3. Windows of up to 8, pushed one by one, one doorbell at finish.
    while sent < 3 * PHASE {
        peer.pump(&b, &cq_b, TOTAL);
        let k = (3 * PHASE).min(peer.posted).saturating_sub(sent).min(8);
        if k > 0 {
            let mut w = ring.window::<32>(k as usize).unwrap();
            while w.room() > 0 {
                let seq = w.push(&fixed_msg(sent)).unwrap();
                assert_eq!(seq, posted0 + sent, "sequence numbers run on");
                sent += 1;
            }
            w.finish();
        }
        for c in poller.poll().unwrap() {
            retired += ring.on_completion(c).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "window stalled at {sent}: {ring:?}"
        );
    }
    // 4. The last one signaled, which retires everything before it.
    while peer.posted <= sent {
        peer.pump(&b, &cq_b, TOTAL);
        assert!(Instant::now() < deadline, "the peer posted no receive");
    }
    ring.signal_next();
    loop {
        match ring.send_now(Msg::send(Local::Inline(&fixed_msg(sent)))) {
            Ok(_) => break,
            Err(SendError::WouldBlock) => {
                for c in poller.poll().unwrap() {
                    retired += ring.on_completion(c).unwrap();
                }
            }
            Err(e) => panic!("the last send: {e}"),
        }
        assert!(Instant::now() < deadline, "no room for the last send");
    }
    sent += 1;
    while ring.outstanding() > 0 || peer.got < TOTAL {
        for c in poller.poll().unwrap() {
            retired += ring.on_completion(c).unwrap();
        }
        peer.pump(&b, &cq_b, TOTAL);
        assert!(
            Instant::now() < deadline,
            "retired {retired} of {sent}, the peer got {}: {ring:?}",
            peer.got
        );
    }
    assert_eq!(sent, TOTAL);
    assert_eq!(retired, TOTAL, "every WR retired exactly once");
    assert_eq!(ring.posted_total() - posted0, TOTAL);
    assert_eq!(ring.retired_total() - retired0, TOTAL);
    assert_eq!(peer.got, TOTAL, "every message arrived, in order");
    assert!(poller.poll().unwrap().is_empty(), "no completion left over");
}

/// An RC QP of `ctx` whose sends and receives complete on `cq`, inline up to 256 bytes.
fn direct_qp(pd: &Pd, cq: &Cq) -> Qp {
    QpBuilder::new(pd, cq, cq, QpType::Rc)
        .max_send_wr(64)
        .max_recv_wr(16)
        .max_inline_data(256)
        .build()
        .unwrap()
}

/// One side of a fully direct ping-pong: its direct poller's completions, each given to
/// the ring it is for (receive ring first: `Misrouted` names a send ring's).
struct Side<'q, 'c> {
    poller: DirectPoller<'c, 16>,
    send: DirectRing<'q>,
    recv: RecvRing<'q, 16>,
    received: Vec<(Vec<u8>, Option<u32>)>,
}

impl Side<'_, '_> {
    /// Polls once: receives are copied out and released (reposted in batches), sends
    /// retired.
    fn poll(&mut self) {
        let Side {
            poller,
            send,
            recv,
            received,
        } = self;
        for c in poller.poll().unwrap() {
            if c.is_recv() {
                let m = recv.on_completion(c).expect("a good receive");
                received.push((recv.data(&m).unwrap().to_vec(), m.imm()));
                recv.release(m).unwrap();
            } else {
                send.on_completion(c).expect("a good send");
            }
        }
    }
}

/// Issue 30: a ping-pong where nothing goes through libmlx5 on either side: sends from
/// `DirectRing`s, receives posted by direct `RecvRing`s (`Qp::direct_recv_ring`), one
/// direct poller per side for a CQ that takes both. Messages of 0 to 256 bytes, with and
/// without immediate: those of 1 to 32 bytes arrive in the CQE (scatter-to-CQE) and are
/// copied into the slot by the poll, the others in the slot; each arrives once, in order,
/// with its bytes and immediate; every send retires; nothing is left outstanding.
pub fn fully_direct_ping_pong(ctx: &Context) {
    direct_ping_pong(ctx, false);
}

/// Issue 30: the same ping-pong on `RecvSession`s (`DirectPoller::recv_session`), the
/// fused receive loop: each side's session takes its messages where the device put them,
/// in the CQE when they fit (no copy; at least one does on an mlx5 CQ, which has
/// scatter-to-CQE) or in the slot; send completions come out of the same session and
/// retire their ring. After the sessions close every slot is posted again and the plain
/// poller path goes on where they stopped. A session is refused for a verbs ring and on
/// the poller of another CQ.
pub fn recv_session_ping_pong(ctx: &Context) {
    direct_ping_pong(ctx, true);
}

/// The `i`-th ping of the direct ping-pongs: its bytes (0 to 256) and immediate.
fn ping_of(i: usize) -> (Vec<u8>, Option<u32>) {
    let sizes = [0usize, 1, 8, 31, 32, 33, 64, 100, 255, 256];
    let len = sizes[i % sizes.len()];
    let msg = (0..len).map(|k| (i * 7 + k) as u8).collect();
    (msg, (i % 3 == 0).then_some(i as u32))
}

/// Posts `msg` (with `imm`) now, signaled.
fn send_signaled(send: &mut DirectRing<'_>, msg: &[u8], imm: Option<u32>) {
    send.signal_next();
    send.send_now(match imm {
        Some(v) => Msg::send_imm(Local::Inline(msg), v),
        None => Msg::send(Local::Inline(msg)),
    })
    .unwrap();
}

fn direct_ping_pong(ctx: &Context, sessions: bool) {
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (
        ctx.create_cq(64, None).unwrap(),
        ctx.create_cq(64, None).unwrap(),
    );
    let (a, b) = (direct_qp(&pd, &cq_a), direct_qp(&pd, &cq_b));
    let info = ctx.port_info(None, gid_index()).unwrap();
    let mut pa = cq_a.direct_poller::<16>().unwrap();
    let mut pb = cq_b.direct_poller::<16>().unwrap();
    let mut ra = pd.alloc_mr(16 * 256, AccessFlags::LOCAL_WRITE).unwrap();
    let mut rb = pd.alloc_mr(16 * 256, AccessFlags::LOCAL_WRITE).unwrap();
    let recv_a = a
        .direct_recv_ring::<16, 16>(&mut pa, &mut ra, 0, RecvConfig::new(0, 256, 16))
        .unwrap();
    let recv_b = b
        .direct_recv_ring::<16, 16>(&mut pb, &mut rb, 0, RecvConfig::new(0, 256, 16))
        .unwrap();
    assert!(recv_a.is_direct());
    a.init(&info, &ConnectOptions::default()).unwrap();
    b.init(&info, &ConnectOptions::default()).unwrap();
    let mut sa = Side {
        send: a
            .direct_ring(&mut pa, SendConfig::new(0, 32, 256).signal_every(4))
            .unwrap(),
        recv: recv_a,
        poller: pa,
        received: Vec::new(),
    };
    let mut sb = Side {
        send: b
            .direct_ring(&mut pb, SendConfig::new(0, 32, 256).signal_every(4))
            .unwrap(),
        recv: recv_b,
        poller: pb,
        received: Vec::new(),
    };
    assert_eq!(sa.recv.fill().unwrap(), 16);
    assert_eq!(sb.recv.fill().unwrap(), 16);
    a.connect(&info, &b.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    b.connect(&info, &a.endpoint(&info), &ConnectOptions::default())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let rounds = 200;
    if sessions {
        session_rounds(ctx, &pd, &mut sa, &mut sb, rounds, deadline);
    } else {
        for i in 0..rounds {
            let (msg, imm) = ping_of(i);
            send_signaled(&mut sa.send, &msg, imm);
            while sb.received.len() <= i {
                sb.poll();
                assert!(Instant::now() < deadline, "ping {i} never arrived");
            }
            assert_eq!(sb.received[i], (msg.clone(), imm), "ping {i}");
            // The pong: the same bytes back.
            send_signaled(&mut sb.send, &msg, None);
            while sa.received.len() <= i {
                sa.poll();
                assert!(Instant::now() < deadline, "pong {i} never arrived");
            }
            assert_eq!(sa.received[i], (msg, None), "pong {i}");
        }
        assert_eq!((sa.received.len(), sb.received.len()), (rounds, rounds));
    }
    while sa.send.outstanding() > 0 || sb.send.outstanding() > 0 {
        sa.poll();
        sb.poll();
        assert!(Instant::now() < deadline, "sends never retired");
    }
    // Every slot is posted again (released ones reposted), none held.
    assert_eq!(sa.recv.held() + sb.recv.held(), 0);
    assert_eq!(sa.recv.posted() + sa.recv.pending(), 16);
    assert_eq!(sb.recv.posted() + sb.recv.pending(), 16);
    if sessions {
        // The plain path goes on after the sessions.
        send_signaled(&mut sa.send, b"after", None);
        while sb.received.is_empty() {
            sb.poll();
            assert!(
                Instant::now() < deadline,
                "the message after the sessions never came"
            );
        }
        assert_eq!(sb.received[0], (b"after".to_vec(), None));
    }
}

/// Waits on a receive session for the next message of its ring (copied out with its
/// immediate and where it was), giving the send completions that come out of it to `send`.
fn session_next<const N: usize, const B: usize, H: hotverbs_datapath::mlx5::RecvHooks<B>>(
    s: &mut hotverbs_datapath::mlx5::RecvSession<'_, N, B, H>,
    send: &mut DirectRing<'_>,
    deadline: Instant,
    what: &str,
) -> (Vec<u8>, Option<u32>, bool) {
    use hotverbs_datapath::mlx5::Polled;
    loop {
        match s.recv().unwrap() {
            Polled::Msg(m) => return (m.bytes().to_vec(), m.imm(), m.in_cqe()),
            Polled::Other(c) => {
                send.on_completion(&c).expect("a good send");
            }
            Polled::Empty => assert!(Instant::now() < deadline, "{what} never arrived"),
        }
    }
}

/// [`recv_session_ping_pong`]'s rounds, each side receiving through a session, and its
/// refusals.
fn session_rounds(
    ctx: &Context,
    pd: &Pd,
    sa: &mut Side<'_, '_>,
    sb: &mut Side<'_, '_>,
    rounds: usize,
    deadline: Instant,
) {
    // Refusals: the poller of the other side's CQ, and a verbs receive ring.
    let e = sb.poller.recv_session(&mut sa.recv).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    {
        let cq_c = ctx.create_cq(8, None).unwrap();
        let c = direct_qp(pd, &cq_c);
        let mut rc = pd.alloc_mr(4 * 64, AccessFlags::LOCAL_WRITE).unwrap();
        let mut verbs_ring = c
            .recv_ring::<4>(&mut rc, 0, RecvConfig::new(0, 64, 4))
            .unwrap();
        // (A verbs ring's CQ never has a direct poller: the setup layer refuses one.)
        let e = sa.poller.recv_session(&mut verbs_ring).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
    }
    let mut in_cqe = 0;
    let mlx5 = ctx.is_mlx5();
    let Side {
        poller: pa,
        send: send_a,
        recv: recv_a,
        ..
    } = sa;
    let Side {
        poller: pb,
        send: send_b,
        recv: recv_b,
        ..
    } = sb;
    let mut xa = pa.recv_session(recv_a).unwrap();
    let mut xb = pb.recv_session(recv_b).unwrap();
    for i in 0..rounds {
        let (msg, imm) = ping_of(i);
        send_signaled(send_a, &msg, imm);
        let (got, got_imm, cqe) = session_next(&mut xb, send_b, deadline, "a ping");
        assert_eq!((got, got_imm), (msg.clone(), imm), "ping {i}");
        assert!(!cqe || msg.len() <= 64, "only what fits a CQE is in one");
        in_cqe += usize::from(cqe);
        send_signaled(send_b, &msg, None);
        let (got, got_imm, cqe) = session_next(&mut xa, send_a, deadline, "a pong");
        assert_eq!((got, got_imm), (msg, None), "pong {i}");
        in_cqe += usize::from(cqe);
    }
    assert_eq!(xa.ring().progress().retired, rounds as u64);
    if mlx5 {
        // Scatter-to-CQE is on for RC by default: the short messages came in their CQEs.
        assert!(in_cqe > 0, "no message was handed out from its CQE");
    }
}

/// Issue 30: a direct receive ring through an error and a recovery. The QP goes to ERR:
/// every posted receive comes back flushed through the direct poller, once. Then
/// `DirectRing::reset_qp_with` resets both rings with one RESET (the poller cleans the
/// CQ), the ring refills from INIT, the QP reconnects and traffic resumes. The misuses
/// are refused with named errors: a reset without the poller, a verbs send ring on the
/// QP, the poller of another CQ.
pub fn direct_recv_ring_flushes_and_recovers(ctx: &Context) {
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (
        ctx.create_cq(64, None).unwrap(),
        ctx.create_cq(64, None).unwrap(),
    );
    let (a, b) = (direct_qp(&pd, &cq_a), direct_qp(&pd, &cq_b));
    let info = ctx.port_info(None, gid_index()).unwrap();
    let mut pa = cq_a.direct_poller::<16>().unwrap();
    let mut pb = cq_b.direct_poller::<16>().unwrap();
    let mut rb = pd.alloc_mr(8 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let wrong = b
        .direct_recv_ring::<8, 16>(&mut pa, &mut rb, 0, RecvConfig::new(0, 64, 8))
        .unwrap_err();
    assert_eq!(wrong.errno(), libc::EINVAL, "{wrong}");
    assert!(wrong.to_string().contains("receive CQ"), "{wrong}");
    let mut recv = b
        .direct_recv_ring::<8, 16>(&mut pb, &mut rb, 0, RecvConfig::new(0, 64, 8))
        .unwrap();
    let verbs = b.send_ring::<8>(SendConfig::new(0, 8, 64)).unwrap_err();
    assert_eq!(verbs.errno(), libc::EBUSY, "{verbs}");
    let mut send_b = b
        .direct_ring(&mut pb, SendConfig::new(0, 8, 64).signal_every(1))
        .unwrap();
    let mut send_a = a
        .direct_ring(&mut pa, SendConfig::new(0, 8, 64).signal_every(1))
        .unwrap();
    b.init(&info, &ConnectOptions::default()).unwrap();
    assert_eq!(recv.fill().unwrap(), 8);
    let o = ConnectOptions::default();
    a.connect(&info, &b.endpoint(&info), &o).unwrap();
    b.connect(&info, &a.endpoint(&info), &o).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    // One message through, to show the ring works before the error.
    send_a
        .send_now(Msg::send(Local::Inline(b"before")))
        .unwrap();
    let mut got = Vec::new();
    let mut flushed = 0;
    let drain = |poller: &mut DirectPoller<'_, 16>,
                 recv: &mut RecvRing<'_, 8>,
                 got: &mut Vec<Vec<u8>>,
                 flushed: &mut u32| {
        for c in poller.poll().unwrap() {
            match recv.on_completion(c) {
                Ok(m) => {
                    got.push(recv.data(&m).unwrap().to_vec());
                    recv.release(m).unwrap();
                }
                Err(RecvError::Completion { error, .. }) => {
                    assert_eq!(error, WcError::WrFlush, "{error:?}");
                    *flushed += 1;
                }
                Err(e) => panic!("{e:?}"),
            }
        }
    };
    while got.is_empty() {
        drain(&mut pb, &mut recv, &mut got, &mut flushed);
        assert!(Instant::now() < deadline);
    }
    assert_eq!(got, [b"before".to_vec()]);
    while send_a.outstanding() > 0 {
        for c in pa.poll().unwrap() {
            send_a.on_completion(c).unwrap();
        }
    }
    // ERR: the 8 posted receives (7 never used + the one reposted... all posted) flush.
    let posted = recv.posted() + recv.pending();
    recv.repost().unwrap();
    let posted_now = recv.posted();
    assert_eq!(posted, 8);
    b.to_error().unwrap();
    while flushed < posted_now {
        drain(&mut pb, &mut recv, &mut got, &mut flushed);
        assert!(
            Instant::now() < deadline,
            "flushed {flushed} of {posted_now}"
        );
    }
    let_device_run(ctx);
    drain(&mut pb, &mut recv, &mut got, &mut flushed);
    assert_eq!(flushed, posted_now, "each posted receive flushed once");
    assert_eq!(recv.posted(), 0);
    // Recovery: the verbs reset is refused (the poller must clean the CQ).
    let e = recv.reset_qp().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "{e}");
    assert!(e.to_string().contains("reset_qp_direct"), "{e}");
    let (lost, requeued) = send_b.reset_qp_with(&mut pb, &mut recv).unwrap();
    assert_eq!((lost, requeued), (0, 8));
    // The peer reconnects too (its QP saw nothing wrong, but B's state is new).
    let (_, _) = (send_a.reset_qp(&mut pa).unwrap(), ());
    a.init(&info, &ConnectOptions::default()).unwrap();
    b.init(&info, &ConnectOptions::default()).unwrap();
    assert_eq!(recv.fill().unwrap(), 8);
    a.connect(&info, &b.endpoint(&info), &o).unwrap();
    b.connect(&info, &a.endpoint(&info), &o).unwrap();
    for i in 0..20u8 {
        send_a.send_now(Msg::send(Local::Inline(&[i; 40]))).unwrap();
        while got.len() < 2 + i as usize {
            drain(&mut pb, &mut recv, &mut got, &mut flushed);
            for c in pa.poll().unwrap() {
                send_a.on_completion(c).unwrap();
            }
            assert!(Instant::now() < deadline, "message {i} after recovery");
        }
        assert_eq!(got[1 + i as usize], [i; 40]);
    }
    assert_eq!(flushed, posted_now, "nothing flushed after the recovery");
}

/// Issue 30: a QP with a direct receive ring destroyed with receive CQEs unpolled: the
/// direct poller cleans them (the CQ is the direct path's, libmlx5 would not) and goes on
/// serving another QP's receives on the same CQ; the region is free again.
pub fn destroying_a_direct_receiver_cleans_its_cqes(ctx: &Context) {
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (
        ctx.create_cq(64, None).unwrap(),
        ctx.create_cq(64, None).unwrap(),
    );
    let info = ctx.port_info(None, gid_index()).unwrap();
    let o = ConnectOptions::default();
    let (a, a2) = (direct_qp(&pd, &cq_a), direct_qp(&pd, &cq_a));
    let b2 = direct_qp(&pd, &cq_b);
    let mut pa = cq_a.direct_poller::<16>().unwrap();
    let mut pb = cq_b.direct_poller::<16>().unwrap();
    let mut r1 = pd.alloc_mr(8 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut r2 = pd.alloc_mr(8 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut send = a
        .direct_ring(&mut pa, SendConfig::new(0, 8, 64).signal_every(1))
        .unwrap();
    {
        let b = direct_qp(&pd, &cq_b);
        let mut recv = b
            .direct_recv_ring::<8, 16>(&mut pb, &mut r1, 0, RecvConfig::new(0, 64, 8))
            .unwrap();
        b.init(&info, &ConnectOptions::default()).unwrap();
        recv.fill().unwrap();
        a.connect(&info, &b.endpoint(&info), &o).unwrap();
        b.connect(&info, &a.endpoint(&info), &o).unwrap();
        for i in 0..3u8 {
            send.send_now(Msg::send(Local::Inline(&[i; 8]))).unwrap();
        }
        while send.outstanding() > 0 {
            for c in pa.poll().unwrap() {
                send.on_completion(c).unwrap();
            }
            assert!(Instant::now() < deadline);
        }
        // b, with three receive CQEs unpolled in cq_b, is destroyed here.
    }
    // Its region came back with the destruction.
    r1.as_mut_slice().unwrap().fill(0xee);
    let mut recv2 = b2
        .direct_recv_ring::<8, 16>(&mut pb, &mut r2, 0, RecvConfig::new(0, 64, 8))
        .unwrap();
    b2.init(&info, &ConnectOptions::default()).unwrap();
    recv2.fill().unwrap();
    let mut send2 = a2
        .direct_ring(&mut pa, SendConfig::new(0, 8, 64).signal_every(1))
        .unwrap();
    a2.connect(&info, &b2.endpoint(&info), &o).unwrap();
    b2.connect(&info, &a2.endpoint(&info), &o).unwrap();
    send2.send_now(Msg::send(Local::Inline(b"after"))).unwrap();
    let mut got = Vec::new();
    while got.is_empty() {
        for c in pb.poll().expect("the destroyed QP's CQEs were cleaned") {
            let m = recv2.on_completion(c).unwrap();
            got.push(recv2.data(&m).unwrap().to_vec());
            recv2.release(m).unwrap();
        }
        assert!(Instant::now() < deadline);
    }
    assert_eq!(got, [b"after".to_vec()]);
    assert!(
        r1.as_slice().unwrap().iter().all(|&x| x == 0xee),
        "nothing wrote the old region"
    );
}

/// Issue 30: UD datagrams into a direct receive ring: each arrives once, in order, with
/// the 40-byte GRH area before its payload, its byte count and the sender's QP number (the
/// responder CQE's `flags_rqpn`); UD gets no scatter-to-CQE, even for a few bytes.
pub fn direct_recv_ring_on_ud(ctx: &Context) {
    let info = ctx.port_info(None, gid_index()).unwrap();
    let (pd, cq_a, cq_b) = setup(ctx, 64);
    let a = QpBuilder::new(&pd, &cq_a, &cq_a, QpType::Ud)
        .max_send_wr(32)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &cq_b, &cq_b, QpType::Ud)
        .max_recv_wr(16)
        .build()
        .unwrap();
    let mut pa = cq_a.direct_poller::<16>().unwrap();
    let mut pb = cq_b.direct_poller::<16>().unwrap();
    let mut region = pd.alloc_mr(8 * 128, AccessFlags::LOCAL_WRITE).unwrap();
    let mut recv = b
        .direct_recv_ring::<8, 16>(&mut pb, &mut region, 0, RecvConfig::new(0, 128, 8))
        .unwrap();
    let o = ConnectOptions::default();
    b.init(&info, &o).unwrap();
    assert_eq!(recv.fill().unwrap(), 8);
    a.connect(&info, &Endpoint::default(), &o).unwrap();
    b.connect(&info, &Endpoint::default(), &o).unwrap();
    let ah = pd
        .create_ah(&AhAttr::from_port(&info, info.gid, info.lid))
        .unwrap();
    let mut ring = a
        .direct_ring_ud(
            &mut pa,
            &ah,
            b.qp_num(),
            DEFAULT_QKEY,
            SendConfig::new(0, 16, 64).signal_every(1),
        )
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0..24usize {
        let m: Vec<u8> = (0..1 + i * 2).map(|k| (i + k) as u8).collect();
        ring.send_now(Msg::send(Local::Inline(&m))).unwrap();
        let got = loop {
            for c in pa.poll().unwrap() {
                ring.on_completion(c).unwrap();
            }
            if let Some(c) = pb.poll().unwrap().first_mut() {
                let r = recv.on_completion(c).expect("a good datagram");
                assert_eq!(r.src_qp(), a.qp_num(), "datagram {i}");
                assert_eq!(r.byte_len() as usize, 40 + m.len(), "GRH + datagram {i}");
                let d = recv.data(&r).unwrap()[40..].to_vec();
                recv.release(r).unwrap();
                break d;
            }
            assert!(Instant::now() < deadline, "datagram {i} never arrived");
        };
        assert_eq!(got, m, "datagram {i}");
    }
}

/// Issue 30: a receive error through the direct poller: an RC message longer than the
/// slot fails the receive (`LOC_LEN_ERR`; `LOC_QP_OP_ERR` in softnic's Rxe profile; the
/// slot idle, the QP in error) and the sender's
/// WR with a remote error; the receives still posted come back flushed, each once.
pub fn a_too_long_message_fails_the_direct_receive(ctx: &Context) {
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (
        ctx.create_cq(64, None).unwrap(),
        ctx.create_cq(64, None).unwrap(),
    );
    let (a, b) = (direct_qp(&pd, &cq_a), direct_qp(&pd, &cq_b));
    let info = ctx.port_info(None, gid_index()).unwrap();
    let mut pa = cq_a.direct_poller::<16>().unwrap();
    let mut pb = cq_b.direct_poller::<16>().unwrap();
    let mut region = pd.alloc_mr(4 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut recv = b
        .direct_recv_ring::<4, 16>(&mut pb, &mut region, 0, RecvConfig::new(0, 64, 4))
        .unwrap();
    let o = ConnectOptions::default();
    b.init(&info, &o).unwrap();
    assert_eq!(recv.fill().unwrap(), 4);
    a.connect(&info, &b.endpoint(&info), &o).unwrap();
    b.connect(&info, &a.endpoint(&info), &o).unwrap();
    let mut ring = a
        .direct_ring(&mut pa, SendConfig::new(0, 8, 256).signal_every(1))
        .unwrap();
    ring.send_now(Msg::send(Local::Inline(&[7u8; 100])))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut len_err, mut flushed) = (0, 0);
    while len_err + flushed < 4 {
        for c in pb.poll().unwrap() {
            match recv.on_completion(c) {
                // The device's length error: LOC_LEN_ERR as the man pages and a ConnectX
                // say, LOC_QP_OP_ERR in softnic's Rxe profile (rxe S11).
                Err(RecvError::Completion {
                    error: WcError::LocLen | WcError::LocQpOp,
                    ..
                }) => len_err += 1,
                Err(RecvError::Completion {
                    error: WcError::WrFlush,
                    ..
                }) => flushed += 1,
                other => panic!("{other:?}"),
            }
        }
        assert!(Instant::now() < deadline, "{len_err} + {flushed} of 4");
    }
    assert_eq!((len_err, flushed), (1, 3));
    assert_eq!(recv.posted(), 0);
    let e = loop {
        if let Some(c) = pa.poll().unwrap().first_mut() {
            break ring.on_completion(c).unwrap_err();
        }
        assert!(Instant::now() < deadline, "the sender never heard");
    };
    assert_ne!(e, WcError::WrFlush, "the sender's own error first: {e:?}");
}

/// Issue 30: a direct SRQ ring (`Srq::direct_recv_ring`) serving three RC QPs, on one CQ
/// read by one direct poller: messages from three direct senders, interleaved, each
/// delivered once to the right QP (its `qp_num`) with its bytes (those of up to 32 bytes
/// through the CQE); the SRQ's WQEs, freed by the poll in whatever order the QPs took them,
/// are reposted by the ring; destroying the SRQ with the poller alive detaches it first.
pub fn direct_srq_ring_serves_several_qps(ctx: &Context) {
    let info = ctx.port_info(None, gid_index()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (
        ctx.create_cq(128, None).unwrap(),
        ctx.create_cq(128, None).unwrap(),
    );
    let srq = pd.create_srq(16, 1).unwrap();
    let mut pa = cq_a.direct_poller::<16>().unwrap();
    let mut pb = cq_b.direct_poller::<16>().unwrap();
    let mut region = pd.alloc_mr(8 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let senders: Vec<Qp> = (0..3).map(|_| direct_qp(&pd, &cq_a)).collect();
    let receivers: Vec<Qp> = (0..3)
        .map(|_| {
            QpBuilder::new(&pd, &cq_b, &cq_b, QpType::Rc)
                .srq(&srq)
                .build()
                .unwrap()
        })
        .collect();
    let mut ring = srq
        .direct_recv_ring::<8, 16>(&mut pb, &mut region, 0, RecvConfig::new(0, 64, 8))
        .unwrap();
    assert_eq!(ring.fill().unwrap(), 8);
    let o = ConnectOptions {
        rnr_retry: 7,
        ..Default::default()
    };
    for (a, b) in senders.iter().zip(&receivers) {
        a.connect(&info, &b.endpoint(&info), &o).unwrap();
        b.connect(&info, &a.endpoint(&info), &o).unwrap();
    }
    let mut rings: Vec<DirectRing<'_>> = senders
        .iter()
        .map(|a| {
            a.direct_ring(&mut pa, SendConfig::new(0, 16, 64).signal_every(1))
                .unwrap()
        })
        .collect();
    let msg = |q: usize, i: usize| -> Vec<u8> {
        (0..1 + (i * 7 + q) % 60)
            .map(|k| (q * 50 + i + k) as u8)
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 3];
    let rounds = 40;
    for i in 0..rounds {
        for (q, r) in rings.iter_mut().enumerate() {
            r.send_now(Msg::send(Local::Inline(&msg(q, i)))).unwrap();
        }
        while got.iter().map(Vec::len).sum::<usize>() < 3 * (i + 1) {
            for c in pa.poll().unwrap() {
                let ring = rings
                    .iter_mut()
                    .find(|r| r.qp().qp_num() == c.qp_num())
                    .unwrap();
                ring.on_completion(c).unwrap();
            }
            for c in pb.poll().unwrap() {
                let q = receivers
                    .iter()
                    .position(|b| b.qp_num() == c.qp_num())
                    .expect("a receiver's completion");
                let m = ring.on_completion(c).expect("a good receive");
                got[q].push(ring.data(&m).unwrap().to_vec());
                ring.release(m).unwrap();
            }
            assert!(Instant::now() < deadline, "round {i}: {got:?}");
        }
    }
    for (q, g) in got.iter().enumerate() {
        assert_eq!(g.len(), rounds, "QP {q}");
        for (i, m) in g.iter().enumerate() {
            assert_eq!(m, &msg(q, i), "QP {q} message {i}");
        }
    }
    let _ = ring; // SrqRing has no Drop: its receives stay posted until the SRQ goes
    drop(rings);
    drop(receivers);
    srq.destroy().unwrap();
    assert!(
        pb.poll().unwrap().is_empty(),
        "the SRQ detached, the CQ empty"
    );
}
