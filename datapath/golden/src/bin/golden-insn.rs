//! Instruction-count workloads of the golden environment, for `cargo xtask insn` (under
//! callgrind): libmlx5's own post and poll paths (rdma-core v55 `qp.c` / `cq.c`, linked
//! without the recording hooks) and hotverbs' rings on the same fake objects, all on the
//! 32-byte inline SEND stream of issue 16's anchors.
//!
//! ```text
//! golden-insn --list                # rows: name<TAB>baseline<TAB>hotverbs<TAB>ratio target<TAB>own target<TAB>unit
//! golden-insn --provider-symbols    # the functions of qp.c / cq.c / stubs / shim (the "device")
//! golden-insn <workload> <n>        # run it
//! ```
//!
//! A simulated device (softnic's `SimDevice`) completes the signaled WQEs of the verbs
//! workloads inside `ibv_poll_cq` (the context's `poll_cq` runs it, then `mlx5_poll_cq`),
//! so completions arrive as on hardware; it counts as the device, as libmlx5 does. The C
//! anchors drain the SQ by hand (`sq.tail = sq.head`) and poll nothing, as the spike did.

#[cfg(golden_missing)]
fn main() -> std::process::ExitCode {
    eprintln!("{}", hotverbs_mlx5_golden::SKIPPED);
    std::process::ExitCode::from(2)
}

#[cfg(not(golden_missing))]
fn main() -> std::process::ExitCode {
    real::main()
}

#[cfg(not(golden_missing))]
mod real {
    use std::process::ExitCode;

    use hotverbs_benches::direct::{
        hv_measured_floor_32, hv_measured_floor_now, hv_measured_stream_direct,
        hv_measured_stream_direct_list, hv_measured_stream_direct_now,
        hv_measured_stream_direct_now_fixed, hv_measured_stream_direct_session,
        hv_measured_stream_direct_window, poll_direct, recv_cqe, recv_direct, DirectStream, Floor,
    };
    use hotverbs_benches::naive::NaivePoster;
    use hotverbs_benches::{
        hv_measured_drain_batch, hv_measured_stream_naive, hv_measured_stream_ring,
        hv_measured_stream_send_now, RingStream, BURST, DEPTH, FILL, MSG, SIGNAL_EVERY,
    };
    use hotverbs_datapath::{CqPoller, Local, Msg, SendConfig, SendError, WrRing};
    use hotverbs_ffi::{ibv_cq, ibv_wc};
    use hotverbs_mlx5_golden::{Model, ModelCfg};
    use hotverbs_softnic::mlx5sim::SimDevice;

    const QPN: u32 = 0xabc;

    /// `(row, baseline, hotverbs, ratio target, own target, unit)`; a target written `~t`
    /// is a goal (reported, not gated).
    const ROWS: &[(&str, &str, &str, &str, &str, &str)] = &[
        (
            "lone post: direct vs libmlx5 post_send",
            "c-post-1",
            "direct-now",
            "-",
            "-",
            "msg",
        ),
        (
            "list 32: direct vs libmlx5 post_send",
            "c-post-32",
            "direct-32",
            "-",
            "-",
            "msg",
        ),
        // Issue 29's targets against the floor rows of the same run (goals, `~`, until
        // met): a held fixed-size session <= 40 own instructions per lone post (met,
        // gated), the generic send_now(Msg) <= 1.4x the floor (met with lone runs, gated),
        // a post list of 32 <= 1.25x the floor (met by post_list, gated; the window row
        // stays a goal).
        (
            "lone post: direct session vs floor",
            "floor-now",
            "direct-session",
            "-",
            "40",
            "msg",
        ),
        (
            "lone post: send_now [u8; 32] vs floor",
            "floor-now",
            "direct-now-fixed",
            "o1.40",
            "-",
            "msg",
        ),
        (
            "list 32: post_list vs floor",
            "floor-32",
            "direct-list",
            "o1.25",
            "-",
            "msg",
        ),
        (
            "list 32: window vs floor",
            "floor-32",
            "direct-window",
            "~o1.25",
            "-",
            "msg",
        ),
        (
            "lone post: direct vs libmlx5 ibv_wr_*",
            "c-wr-1",
            "direct-now",
            "-",
            "-",
            "msg",
        ),
        (
            "list 32: direct vs libmlx5 ibv_wr_*",
            "c-wr-32",
            "direct-32",
            "-",
            "-",
            "msg",
        ),
        (
            "lone post: floor vs libmlx5 post_send",
            "c-post-1",
            "floor-now",
            "-",
            "-",
            "msg",
        ),
        (
            "list 32: floor vs libmlx5 post_send",
            "c-post-32",
            "floor-32",
            "-",
            "-",
            "msg",
        ),
        (
            "completion: DirectPoller vs mlx5_poll_cq",
            "c-poll",
            "direct-poll",
            "0.334",
            "-",
            "completion",
        ),
        // Issue 30's receive target: per received message (poll it, hand it on, repost
        // its buffer) <= 1/3 of libmlx5's mlx5_poll_cq + mlx5_post_recv, for a 16-byte
        // SEND in the CQE (scatter-to-CQE) and a 256-byte one in the slot, on the fused
        // RecvSession; the general RecvRing + DirectPoller path beside it, reported.
        (
            "receive 16 B (CQE): RecvSession vs libmlx5",
            "c-recv-16",
            "session-recv-16",
            "0.334",
            "-",
            "msg",
        ),
        (
            "receive 256 B (slot): RecvSession vs libmlx5",
            "c-recv-256",
            "session-recv-256",
            "0.334",
            "-",
            "msg",
        ),
        (
            "receive 16 B (CQE): ring + poller vs libmlx5",
            "c-recv-16",
            "direct-recv-16",
            "-",
            "-",
            "msg",
        ),
        (
            "receive 256 B (slot): ring + poller vs libmlx5",
            "c-recv-256",
            "direct-recv-256",
            "-",
            "-",
            "msg",
        ),
        (
            "lone post: naive vs libmlx5 post_send",
            "c-post-1",
            "naive-1",
            "-",
            "-",
            "msg",
        ),
        (
            "lone post: SendRing vs post_send",
            "c-post-1",
            "ring-now",
            "-",
            "-",
            "msg",
        ),
        (
            "list 32: SendRing vs post_send",
            "c-post-32",
            "ring-32",
            "-",
            "-",
            "msg",
        ),
        (
            "lone post: WrRing vs ibv_wr_*",
            "c-wr-1",
            "wr-now",
            "-",
            "-",
            "msg",
        ),
        (
            "list 32: WrRing vs ibv_wr_*",
            "c-wr-32",
            "wr-32",
            "-",
            "-",
            "msg",
        ),
        (
            "completion: CqPoller vs mlx5_poll_cq",
            "c-poll",
            "cqpoller",
            "-",
            "-",
            "completion",
        ),
    ];

    const WORKLOADS: &[(&str, &str)] = &[
        (
            "c-post-1",
            "libmlx5 mlx5_post_send, one WR per call (C loop)",
        ),
        ("c-post-32", "libmlx5 mlx5_post_send, chains of 32 (C loop)"),
        (
            "c-wr-1",
            "libmlx5 ibv_wr_start/send/set_inline_data/complete, one WR (C loop)",
        ),
        (
            "c-wr-32",
            "libmlx5 ibv_wr_*, 32 WRs per wr_complete (C loop)",
        ),
        ("c-poll", "libmlx5 mlx5_poll_cq, 32 per call (C loop)"),
        ("naive-1", "hotverbs-benches' naive poster on libmlx5"),
        ("ring-now", "SendRing::send_now on libmlx5's post_send"),
        ("ring-32", "SendRing post list 32 on libmlx5's post_send"),
        ("wr-now", "WrRing::send_now on libmlx5's ibv_wr_*"),
        ("wr-32", "WrRing post list 32 on libmlx5's ibv_wr_*"),
        (
            "cqpoller",
            "CqPoller on libmlx5's mlx5_poll_cq, 32 per call",
        ),
        ("direct-now", "DirectRing::send_now (BlueFlame per message)"),
        ("direct-32", "DirectRing post list 32"),
        (
            "direct-session",
            "DirectSession::<32>::send per message (BlueFlame), held",
        ),
        (
            "direct-now-fixed",
            "DirectRing::send_now per message, [u8; 32]",
        ),
        ("direct-list", "DirectRing::post_list of 32 [u8; 32]"),
        ("direct-window", "DirectWindow::<32> of 32"),
        ("direct-poll", "DirectPoller, 32 per poll"),
        (
            "c-recv-16",
            "libmlx5 mlx5_poll_cq (1) + read + mlx5_post_recv (1), 16 B in the CQE (C loop)",
        ),
        (
            "c-recv-256",
            "libmlx5 mlx5_poll_cq (1) + read + mlx5_post_recv (1), 256 B in the slot (C loop)",
        ),
        (
            "direct-recv-16",
            "DirectPoller::poll_into (1) + RecvRing on_completion/data/release, 16 B in the CQE",
        ),
        (
            "direct-recv-256",
            "DirectPoller::poll_into (1) + RecvRing on_completion/data/release, 256 B in the slot",
        ),
        (
            "session-recv-16",
            "RecvSession::recv per message (bytes read in the CQE), 16 B in the CQE",
        ),
        (
            "session-recv-256",
            "RecvSession::recv per message (bytes read in the slot), 256 B in the slot",
        ),
        (
            "floor-now",
            "the direct lone post's stores alone: no check, no counter, no completion",
        ),
        (
            "floor-32",
            "the direct post list 32's stores alone: no check, no counter, no completion",
        ),
    ];

    fn model() -> Model {
        Model::new(ModelCfg {
            ud: false,
            uc: false,
            wqe_cnt: 256,
            max_gs: 1,
            max_inline: 64,
            qpn: QPN,
            cqe_cnt: FILL as u32,
            poison: 0,
            cqe_size: 64,
        })
    }

    static mut DEV: *mut SimDevice = std::ptr::null_mut();

    /// The context's `poll_cq` of the verbs workloads: the simulated device completes what
    /// was announced, then libmlx5 polls. Named `hv_golden_dev_*`: counted as the device.
    ///
    /// # Safety
    /// `DEV` is set to the model's device.
    unsafe extern "C" fn hv_golden_dev_poll_cq(cq: *mut ibv_cq, n: i32, wc: *mut ibv_wc) -> i32 {
        // SAFETY: set before any poll (see `with_device`); single-threaded binary.
        unsafe {
            (*DEV).process();
            (Model::mlx5_poll_cq())(cq, n, wc)
        }
    }

    /// `m` with the simulated device behind its `poll_cq`.
    fn with_device(m: &mut Model) -> Box<SimDevice> {
        // SAFETY: the model's memory lives as long as `m`, which outlives the device's use.
        let mut dev = Box::new(unsafe {
            SimDevice::new(
                m.sq().as_ptr(),
                m.cfg.wqe_cnt,
                m.qp_dbrec(),
                m.cq_buf(),
                m.cfg.cqe_cnt,
                QPN,
            )
        });
        // SAFETY: single-threaded; the box outlives every poll of this run.
        unsafe { DEV = &mut *dev };
        m.set_poll_cq(Some(hv_golden_dev_poll_cq));
        dev
    }

    fn retire(r: &mut WrRing, p: &mut CqPoller<BURST>) -> Result<(), String> {
        for c in p.poll().map_err(|e| e.to_string())? {
            r.on_completion(c).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// WrRing on libmlx5's `ibv_wr_*`: `n` messages, lone (`send_now`) or in batches.
    #[inline(never)]
    fn hv_measured_wr(
        r: &mut WrRing,
        p: &mut CqPoller<BURST>,
        n: u64,
        now: bool,
    ) -> Result<u64, String> {
        if n % SIGNAL_EVERY as u64 != 0 {
            // The last WR must be a signaled one, or the final drain never ends.
            return Err(format!("n = {n} must be a multiple of {SIGNAL_EVERY}"));
        }
        let m = Msg::send(Local::Inline(&MSG));
        let mut left = n;
        while left > 0 {
            if now {
                match r.send_now(m) {
                    Ok(_) => left -= 1,
                    Err(SendError::WouldBlock) => retire(r, p)?,
                    Err(e) => return Err(e.to_string()),
                }
            } else {
                let mut b = r.batch();
                while left > 0 {
                    match b.push(m) {
                        Ok(_) => left -= 1,
                        Err(SendError::WouldBlock) => break,
                        Err(e) => return Err(e.to_string()),
                    }
                }
                b.finish().map_err(|e| e.to_string())?;
                retire(r, p)?;
            }
        }
        while r.outstanding() > 0 {
            retire(r, p)?;
        }
        Ok(n)
    }

    /// Issue 30's receive baseline: libmlx5's RQ and CQ on the golden model, every slot
    /// posted, the "device" writing responder SEND CQEs ([`FILL`] at a time, outside the
    /// measured C loop) with 16 bytes in the CQE (`scatter`) or 256 in the slot.
    fn c_recv(n: u64, scatter: bool) -> Result<u64, String> {
        use hotverbs_ffi::ibv_sge;
        use hotverbs_mlx5_golden::RecvWr;
        let mut m = model();
        m.rq_init(FILL as u32, 16, 0);
        let mut bufs = vec![0u8; FILL * 256];
        let sges: Vec<ibv_sge> = (0..FILL)
            .map(|i| ibv_sge {
                addr: bufs[i * 256..].as_mut_ptr() as u64,
                length: 256,
                lkey: 1,
            })
            .collect();
        for (i, g) in sges.iter().enumerate() {
            let (rc, _) = m.post_recv(&[RecvWr {
                wr_id: i as u64,
                sges: g,
                num_sge: 1,
                pad: 0,
            }]);
            if rc != 0 {
                return Err(format!("mlx5_post_recv: {rc}"));
            }
        }
        let mut prod = 0u32;
        let mut done = 0u64;
        while done < n {
            let k = FILL.min((n - done) as usize);
            for _ in 0..k {
                let at = (prod as usize % FILL) * 64;
                // SAFETY: the model's CQ holds FILL CQEs of 64 bytes.
                let c = unsafe { std::slice::from_raw_parts_mut(m.cq_buf().add(at), 64) };
                c.copy_from_slice(&recv_cqe(prod, scatter, QPN));
                prod = prod.wrapping_add(1);
            }
            m.bench_recv(k as u64, &sges);
            done += k as u64;
        }
        drop(bufs);
        Ok(done)
    }

    fn run(w: &str, n: u64) -> Result<u64, String> {
        let warm = SIGNAL_EVERY as u64 * 4;
        match w {
            "c-post-1" | "c-post-32" | "c-wr-1" | "c-wr-32" => {
                let mut m = model();
                let chain = if w.ends_with("32") { 32 } else { 1 };
                let f = if w.starts_with("c-post") {
                    Model::bench_post_send
                } else {
                    Model::bench_post_wr
                };
                f(&mut m, &MSG, warm, chain);
                f(&mut m, &MSG, n, chain);
                Ok(n)
            }
            "c-poll" | "cqpoller" => {
                let mut m = model();
                // SAFETY: the model's memory outlives the device.
                let mut dev = unsafe {
                    SimDevice::new(
                        m.sq().as_ptr(),
                        m.cfg.wqe_cnt,
                        m.qp_dbrec(),
                        m.cq_buf(),
                        m.cfg.cqe_cnt,
                        QPN,
                    )
                };
                // SAFETY: the model's CQ, polled only here (its poll_cq is mlx5_poll_cq).
                let mut p = unsafe { CqPoller::<BURST>::new(m.cq()) };
                let mut done = 0u64;
                let mut ctr = 0u16;
                while done < n {
                    let k = FILL.min((n - done) as usize);
                    for _ in 0..k {
                        dev.write_cqe(0, 0x0a, ctr, 0, 0);
                        ctr = ctr.wrapping_add(1);
                    }
                    if w == "c-poll" {
                        m.bench_poll(k as u64);
                    } else {
                        hv_measured_drain_batch(&mut p, k)?;
                    }
                    done += k as u64;
                }
                Ok(done)
            }
            "naive-1" => {
                let mut m = model();
                let _dev = with_device(&mut m);
                // SAFETY: the model's QP and CQ live as long as `m`; nothing else uses them.
                let mut p = unsafe { NaivePoster::new(m.qp(), m.cq(), DEPTH) };
                hv_measured_stream_naive(&mut p, &MSG, warm)?;
                hv_measured_stream_naive(&mut p, &MSG, n)
            }
            "ring-now" | "ring-32" => {
                let mut m = model();
                let _dev = with_device(&mut m);
                let batch = if w == "ring-32" { 32 } else { SIGNAL_EVERY };
                // SAFETY: as above; the QP has max_inline 64 and room for DEPTH WRs.
                let mut r = unsafe { RingStream::new(m.qp(), m.cq(), batch, None) }?;
                if w == "ring-32" {
                    hv_measured_stream_ring(&mut r, &MSG, warm)?;
                    hv_measured_stream_ring(&mut r, &MSG, n)
                } else {
                    hv_measured_stream_send_now(&mut r, &MSG, warm)?;
                    hv_measured_stream_send_now(&mut r, &MSG, n)
                }
            }
            "wr-now" | "wr-32" => {
                let mut m = model();
                let _dev = with_device(&mut m);
                let batch = if w == "wr-32" { 32 } else { SIGNAL_EVERY };
                let cfg = SendConfig::new(1, DEPTH, 64)
                    .signal_every(SIGNAL_EVERY)
                    .batch(batch);
                // SAFETY: the model's extended QP (libmlx5's ibv_wr_* table) and CQ live as
                // long as `m`; nothing else posts or polls.
                let (mut r, mut p) = unsafe {
                    (
                        WrRing::new(m.qp_ex(), cfg).map_err(|e| e.to_string())?,
                        CqPoller::<BURST>::new(m.cq()),
                    )
                };
                let now = w == "wr-now";
                hv_measured_wr(&mut r, &mut p, warm, now)?;
                hv_measured_wr(&mut r, &mut p, n, now)
            }
            "direct-now" | "direct-32" => {
                let mut r = DirectStream::new(if w == "direct-32" { 32 } else { SIGNAL_EVERY })?;
                if w == "direct-32" {
                    hv_measured_stream_direct(&mut r, &MSG, warm)?;
                    hv_measured_stream_direct(&mut r, &MSG, n)
                } else {
                    hv_measured_stream_direct_now(&mut r, &MSG, warm)?;
                    hv_measured_stream_direct_now(&mut r, &MSG, n)
                }
            }
            "direct-session" | "direct-now-fixed" => {
                let mut r = DirectStream::new(SIGNAL_EVERY)?;
                let f = if w == "direct-session" {
                    hv_measured_stream_direct_session
                } else {
                    hv_measured_stream_direct_now_fixed
                };
                f(&mut r, &MSG, warm)?;
                f(&mut r, &MSG, n)
            }
            "direct-list" => {
                let mut r = DirectStream::new(32)?;
                let msgs = [MSG; 32];
                hv_measured_stream_direct_list(&mut r, &msgs, warm)?;
                hv_measured_stream_direct_list(&mut r, &msgs, n)
            }
            "direct-window" => {
                let mut r = DirectStream::new(32)?;
                hv_measured_stream_direct_window(&mut r, &MSG, warm)?;
                hv_measured_stream_direct_window(&mut r, &MSG, n)
            }
            "direct-poll" => poll_direct(n),
            "direct-recv-16" => recv_direct(n, true, false),
            "direct-recv-256" => recv_direct(n, false, false),
            "session-recv-16" => recv_direct(n, true, true),
            "session-recv-256" => recv_direct(n, false, true),
            "c-recv-16" | "c-recv-256" => c_recv(n, w == "c-recv-16"),
            "floor-now" | "floor-32" => {
                let mut f = Floor::new(0);
                let g = if w == "floor-now" {
                    hv_measured_floor_now
                } else {
                    hv_measured_floor_32
                };
                g(&mut f, &MSG, warm);
                Ok(g(&mut f, &MSG, n))
            }
            other => Err(format!("unknown workload {other:?}")),
        }
    }

    pub fn main() -> ExitCode {
        let args: Vec<String> = std::env::args().skip(1).collect();
        match args.as_slice() {
            [f] if f == "--list" => {
                for r in ROWS {
                    println!("{}\t{}\t{}\t{}\t{}\t{}", r.0, r.1, r.2, r.3, r.4, r.5);
                }
                ExitCode::SUCCESS
            }
            [f] if f == "--provider-symbols" => {
                print!(
                    "{}",
                    include_str!(concat!(env!("OUT_DIR"), "/provider-symbols.txt"))
                );
                ExitCode::SUCCESS
            }
            [w, n] => match n
                .parse::<u64>()
                .map_err(|e| e.to_string())
                .and_then(|n| run(w, n))
            {
                Ok(done) => {
                    println!("{w}: {done}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("golden-insn: {w}: {e}");
                    ExitCode::FAILURE
                }
            },
            _ => {
                eprintln!("usage: golden-insn --list | --provider-symbols | <workload> <n>");
                for (w, d) in WORKLOADS {
                    eprintln!("  {w:<12} {d}");
                }
                ExitCode::from(2)
            }
        }
    }
}
