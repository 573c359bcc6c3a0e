//! The mlx5 direct path on plain memory (softnic's `Mlx5Sim`): known WQE bytes and doorbell
//! sequences, ring semantics (batching, signals, back-pressure, errors, reset, leaked
//! batches) and the poller's refusals. Byte equality with libmlx5 itself is the golden
//! test's (`cargo xtask golden`).

use hotverbs_datapath::mlx5::{
    DirectCq, DirectError, DirectSq, Mmio, MmioEvent, RecordingDoorbell, CTRL_CQ_UPDATE,
};
use hotverbs_datapath::{
    ConfigError, DirectPoller, DirectRing, Local, LocalBuf, Msg, RemoteBuf, SendConfig, SendError,
    WcError,
};
use hotverbs_softnic::mlx5sim::{Mlx5Sim, POISON};

mod common;

const QPN: u32 = 0xabc;

fn sq_of(sim: &mut Mlx5Sim, max_inline: u32) -> DirectSq {
    common::mlx5::sim_sq(sim, QPN, max_inline, 4)
}

fn cq_of(sim: &mut Mlx5Sim) -> DirectCq {
    common::mlx5::sim_cq(sim, 0x77)
}

fn ring(sim: &mut Mlx5Sim, cfg: SendConfig) -> DirectRing<RecordingDoorbell> {
    let sq = sq_of(sim, cfg.max_inline_of());
    // SAFETY: the simulator's memory outlives the ring; nothing else posts.
    unsafe { DirectRing::with_doorbell(sq, cfg, None, RecordingDoorbell::new(sq.bf_reg)) }.unwrap()
}

fn poller(sim: &mut Mlx5Sim) -> DirectPoller<16> {
    let sq = sq_of(sim, 0);
    let cq = cq_of(sim);
    // SAFETY: the simulator's CQ and wrid table outlive the poller.
    let mut p = unsafe { DirectPoller::<16>::new(cq) }.unwrap();
    // SAFETY: as above.
    unsafe { p.attach(&sq) }.unwrap();
    p
}

fn payload() -> [u8; 64] {
    std::array::from_fn(|i| 0x40 + i as u8)
}

#[test]
fn lone_inline_send_is_libmlx5s_wqe_and_a_blueflame_copy() {
    // The bytes libmlx5 v55 wrote for this WR in the golden spike (mlx5-golden's output (a)).
    let mut sim = Mlx5Sim::new(64, 16, QPN);
    let mut r = ring(&mut sim, SendConfig::new(1, 8, 64).signal_every(1));
    let data = payload();
    let seq = r.send_now(Msg::send(Local::Inline(&data[..32]))).unwrap();
    assert_eq!(seq, 0);
    let sq = sim.sq();
    let mut want = vec![
        0x00, 0x00, 0x00, 0x0a, 0x00, 0x0a, 0xbc, 0x04, 0x00, 0x00, 0x00, 0x08, 0, 0, 0, 0, 0x80,
        0x00, 0x00, 0x20,
    ];
    want.extend_from_slice(&data[..32]);
    want.extend_from_slice(&[POISON; 12]);
    assert_eq!(&sq[..64], &want[..]);
    assert!(
        sq[64..].iter().all(|&b| b == POISON),
        "nothing past the WQE"
    );
    assert_eq!(sim.sq_dbr(), 1);
    let ev = &r.doorbell().events;
    assert_eq!(
        ev[..3],
        [
            MmioEvent::ToDeviceBarrier,
            MmioEvent::Dbr(1),
            MmioEvent::WcStart
        ]
    );
    assert_eq!(*ev.last().unwrap(), MmioEvent::FlushWrites);
    let stores = r.doorbell().stores();
    assert_eq!(
        stores.len(),
        8,
        "the whole 64-byte WQE goes through BlueFlame"
    );
    for (i, (off, raw)) in stores.iter().enumerate() {
        assert_eq!(*off, i * 8);
        assert_eq!(raw.to_ne_bytes(), want[i * 8..i * 8 + 8]);
    }
    assert_eq!(&sim.bf_page()[..64], &want[..]);
    assert_eq!(r.bf_offset(), 256, "BlueFlame buffers alternate");
}

#[test]
fn a_batch_rings_one_8_byte_doorbell_with_the_last_ctrl() {
    let mut sim = Mlx5Sim::new(64, 16, QPN);
    let remote = RemoteBuf::new(0x55_0000_0000, 1 << 20, 0x3330);
    let mut r = ring(
        &mut sim,
        SendConfig::new(1, 8, 16)
            .signal_every(4)
            .batch(8)
            .remote(remote),
    );
    let buf = vec![0u8; 4096];
    for i in 0..4u64 {
        let b = LocalBuf::new(buf.as_ptr() as u64 + i * 0x100, 0x100 + i as u32, 0x2220);
        // SAFETY: `buf` outlives the test; the simulated device never reads it.
        unsafe { r.stage(Msg::write(Local::Buf(b), i * 0x1000)) }.unwrap();
    }
    assert!(r.doorbell().events.is_empty(), "staged, not announced");
    assert_eq!(sim.sq_dbr(), 0);
    r.flush().unwrap();
    assert_eq!(sim.sq_dbr(), 4);
    let stores = r.doorbell().stores();
    assert_eq!(stores.len(), 1, "no BlueFlame for a list");
    let sq = sim.sq();
    assert_eq!(
        stores[0],
        (0, u64::from_ne_bytes(sq[192..200].try_into().unwrap()))
    );
    for i in 0..4 {
        let w = &sq[i * 64..i * 64 + 64];
        assert_eq!(
            w[..8],
            [0, 0, i as u8, 0x08, 0x00, 0x0a, 0xbc, 0x03],
            "WQE {i}"
        );
        assert_eq!(w[11], if i == 3 { CTRL_CQ_UPDATE } else { 0 });
        // raddr: be64 addr, be32 rkey, 0
        let raddr = 0x55_0000_0000u64 + i as u64 * 0x1000;
        assert_eq!(w[16..24], raddr.to_be_bytes());
        assert_eq!(w[24..32], [0, 0, 0x33, 0x30, 0, 0, 0, 0]);
        // data: be32 len, be32 lkey, be64 addr
        assert_eq!(w[32..36], (0x100 + i as u32).to_be_bytes());
        assert_eq!(w[36..40], 0x2220u32.to_be_bytes());
        assert_eq!(
            w[48..64],
            [POISON; 16],
            "the rest of the block is not written"
        );
    }
}

#[test]
fn inline_data_wraps_at_the_end_of_the_sq() {
    let mut sim = Mlx5Sim::new(64, 64, QPN);
    let mut r = ring(
        &mut sim,
        SendConfig::new(1, 16, 188).signal_every(8).batch(16),
    );
    let mut p = poller(&mut sim);
    let data: Vec<u8> = (0..188u32).map(|i| i as u8).collect();
    // 63 one-block WQEs, then a 188-byte inline SEND (ds 13, 4 blocks) from block 63.
    let mut sent = 0;
    while r.cur_post() < 63 {
        match r.send_now(Msg::send(Local::Inline(&data[..8]))) {
            Ok(_) => sent += 1,
            Err(SendError::WouldBlock) => {}
            Err(e) => panic!("{e}"),
        }
        sim.process();
        for c in p.poll().unwrap().iter() {
            r.on_completion(c).unwrap();
        }
    }
    assert!(sent >= 63);
    r.signal_next();
    r.send_now(Msg::send(Local::Inline(&data))).unwrap();
    let sq = sim.sq();
    let w = &sq[63 * 64..];
    assert_eq!(w[4..8], [0x00, 0x0a, 0xbc, 13]);
    assert_eq!(w[16..20], (188u32 | 0x8000_0000).to_be_bytes());
    assert_eq!(w[20..64], data[..44]);
    assert_eq!(sq[..144], data[44..188], "the rest continues at block 0");
    assert_eq!(r.cur_post(), 67);
    // The BlueFlame copy follows the WQE across the wrap: 4 blocks, 256 bytes.
    let stores = r.doorbell().stores();
    let last: Vec<_> = stores[stores.len() - 32..].to_vec();
    assert_eq!(
        last[8].1.to_ne_bytes(),
        sq[..8],
        "block 2 of the copy is SQ block 0"
    );
}

#[test]
fn ten_thousand_messages_round_trip_through_the_simulated_device() {
    let mut sim = Mlx5Sim::new(256, 64, QPN);
    let remote = RemoteBuf::new(0x1000, 1 << 20, 7);
    let mut r = ring(
        &mut sim,
        SendConfig::new(3, 32, 100).signal_every(8).remote(remote),
    );
    let mut p = poller(&mut sim);
    let data = [0x5au8; 100];
    let mut next = 0u64;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    while r.retired_total() < 10_000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let len = (rng % 101) as usize;
        let m = match rng >> 60 {
            0..=5 => Msg::send(Local::Inline(&data[..len])),
            6..=9 => Msg::write(Local::Inline(&data[..len]), rng % 1000),
            10 => Msg::send_imm(Local::Empty, 9),
            _ => Msg::write_imm(Local::Inline(&data[..len]), 0, 1),
        };
        let res = if rng & 1 == 0 {
            r.send_now(m)
        } else {
            let mut b = r.batch();
            let x = b
                .push(m)
                .and_then(|s| b.push(Msg::send(Local::Inline(&data[..4]))).map(|_| s));
            b.finish().unwrap();
            x
        };
        match res {
            Ok(s) => assert!(s >= next),
            Err(SendError::WouldBlock) => {}
            Err(e) => panic!("{e}"),
        }
        next = r.posted_total();
        sim.process();
        for c in p.poll().unwrap().iter() {
            assert_eq!(c.ring(), 3);
            r.on_completion(c).unwrap();
        }
    }
    assert_eq!(sim.cq_ci(), p.cons_index());
    assert!(r.outstanding() <= 32);
}

#[test]
fn an_error_completion_retires_exactly_and_flushes_the_rest() {
    let mut sim = Mlx5Sim::new(64, 64, QPN);
    let mut r = ring(&mut sim, SendConfig::new(1, 16, 32).signal_every(4));
    let mut p = poller(&mut sim);
    for _ in 0..3 {
        r.send_now(Msg::send(Local::Inline(b"ok"))).unwrap();
    }
    assert_eq!(sim.process(), 0, "unsignaled, no CQE");
    sim.fail_next(0x13, 0x88); // REMOTE_ACCESS_ERR on the 4th
    for _ in 0..3 {
        // The 4th is signaled by the schedule; the 5th and 6th are flushed.
        r.send_now(Msg::send(Local::Inline(b"x"))).unwrap();
    }
    assert_eq!(sim.process(), 3, "one error CQE, two flush CQEs");
    let mut cs = [hotverbs_datapath::Completion::PLACEHOLDER; 4];
    assert_eq!(p.poll_into(&mut cs).unwrap(), 3);
    assert_eq!(cs[0].as_raw().vendor_err, 0x88);
    assert_eq!(r.on_completion(&cs[0]), Err(WcError::RemAccess));
    assert_eq!(r.outstanding(), 2, "the error CQE retired WRs 0..=3");
    assert!(matches!(
        r.send_now(Msg::send(Local::Inline(b"no"))),
        Err(SendError::QpError(WcError::RemAccess))
    ));
    assert!(r.on_completion(&cs[1]).is_err());
    assert!(r.on_completion(&cs[2]).is_err());
    assert_eq!(r.outstanding(), 0, "every WR accounted");
    // RESET -> RTS: the device restarts at index 0, and so does the ring.
    r.settle();
    sim.reset_qp();
    // SAFETY: the ring was settled, then the simulated QP went to RESET.
    assert_eq!(unsafe { r.reset() }, 0);
    assert_eq!(r.cur_post(), 0);
    r.signal_next();
    r.send_now(Msg::send(Local::Inline(b"again"))).unwrap();
    assert_eq!(sim.process(), 1);
    let c = &p.poll().unwrap()[0];
    assert_eq!(r.on_completion(c), Ok(1));
}

#[test]
fn refused_messages_leave_the_sq_untouched() {
    let mut sim = Mlx5Sim::new(64, 16, QPN);
    let mut r = ring(&mut sim, SendConfig::new(1, 8, 16));
    let before = sim.sq().to_vec();
    let big = [1u8; 17];
    assert!(matches!(
        r.send_now(Msg::send(Local::Inline(&big))),
        Err(SendError::InlineTooLong { len: 17, max: 16 })
    ));
    assert!(matches!(
        r.send_now(Msg::write(Local::Inline(b"x"), 0)),
        Err(SendError::NoRemote)
    ));
    assert_eq!(sim.sq(), &before[..]);
    assert_eq!((r.cur_post(), r.posted_total(), sim.sq_dbr()), (0, 0, 0));
    assert!(r.doorbell().events.is_empty());
}

#[test]
fn a_leaked_batch_is_never_announced_and_its_blocks_are_reused() {
    let mut sim = Mlx5Sim::new(64, 16, QPN);
    let mut r = ring(
        &mut sim,
        SendConfig::new(1, 16, 16).batch(16).signal_every(8),
    );
    let mut b = r.batch();
    b.push(Msg::send(Local::Inline(b"lost"))).unwrap();
    b.push(Msg::send(Local::Inline(b"lost"))).unwrap();
    std::mem::forget(b);
    assert_eq!(sim.sq_dbr(), 0);
    r.send_now(Msg::send(Local::Inline(b"kept"))).unwrap();
    assert_eq!((r.cur_post(), r.posted_total(), sim.sq_dbr()), (1, 1, 1));
}

/// A batch leaked after a signaled WR took the slow path mid-batch (which writes the
/// batch's counters back to the ring while it stays open): the staged WQEs are still never
/// announced, and the next lone send takes their blocks.
#[test]
fn a_batch_leaked_after_a_mid_batch_signal_is_never_announced() {
    let mut sim = Mlx5Sim::new(64, 16, QPN);
    let mut r = ring(
        &mut sim,
        SendConfig::new(1, 16, 16).batch(16).signal_every(2),
    );
    let mut b = r.batch();
    for _ in 0..4 {
        b.push(Msg::send(Local::Inline(b"lost"))).unwrap();
    }
    std::mem::forget(b);
    assert_eq!(sim.sq_dbr(), 0);
    assert!(r.doorbell().events.is_empty(), "nothing rang");
    r.send_now(Msg::send(Local::Inline(b"kept"))).unwrap();
    assert_eq!((r.cur_post(), r.posted_total(), sim.sq_dbr()), (1, 1, 1));
}

#[test]
fn a_too_small_sq_and_unmodelled_queues_are_refused_by_name() {
    let mut sim = Mlx5Sim::new(16, 16, QPN);
    let sq = sq_of(&mut sim, 256);
    // SAFETY: never posts (construction fails).
    let e = unsafe { DirectRing::new(sq, SendConfig::new(1, 16, 256), None) }.unwrap_err();
    assert!(matches!(
        e,
        ConfigError::Direct(DirectError::SqTooSmall { have: 16, .. })
    ));
    assert!(e.to_string().contains("basic blocks"), "{e}");
    let mut sq3 = sq_of(&mut sim, 0);
    // SAFETY: a pointer 8 bytes into the simulator's register page; never stored to (the
    // construction fails).
    sq3.bf_reg = unsafe { sq3.bf_reg.add(8) };
    // SAFETY: as above.
    let e = unsafe { DirectRing::new(sq3, SendConfig::new(1, 4, 0), None) }.unwrap_err();
    assert!(
        e.to_string().contains("not aligned to its two buffers"),
        "{e}"
    );
    let mut sq2 = sq_of(&mut sim, 0);
    sq2.stride = 128;
    // SAFETY: as above.
    let e = unsafe { DirectRing::new(sq2, SendConfig::new(1, 4, 0), None) }.unwrap_err();
    assert!(e.to_string().contains("stride"), "{e}");
    let mut cq = cq_of(&mut sim);
    cq.cqe_size = 256;
    // SAFETY: construction fails.
    let e = unsafe { DirectPoller::<4>::new(cq) }.unwrap_err();
    assert!(e.to_string().contains("64 or 128 bytes"), "{e}");
    let mut sq4 = sq_of(&mut sim, 0);
    sq4.ud = true;
    sq4.uc = true;
    let av = [0u8; 48];
    let ud = hotverbs_datapath::mlx5::DirectUd {
        av: av.as_ptr(),
        remote_qpn: 1,
        remote_qkey: 2,
    };
    // SAFETY: construction fails.
    let e = unsafe { DirectRing::new(sq4, SendConfig::new(1, 4, 0), Some(ud)) }.unwrap_err();
    assert!(e.to_string().contains("both UD and UC"), "{e}");
}

/// `fm_ce_se` of every WQE: `MLX5_WQE_CTRL_FENCE` (0x80) for a fenced message,
/// `MLX5_WQE_CTRL_SOLICITED` (0x02) for a solicited one, with `CQ_UPDATE` (0x08) when
/// signaled, as libmlx5's `_mlx5_post_send` computes it (the golden test compares whole
/// streams with libmlx5's bytes). Every way in: the lone `send_now`, a batch, `stage`,
/// gather lists; the flags of one message never leak into the next.
#[test]
fn fence_and_solicited_are_the_ctrl_bits_of_their_message_only() {
    let mut sim = Mlx5Sim::new(64, 64, QPN);
    let remote = RemoteBuf::new(0x1000, 1 << 20, 7);
    let mut r = ring(
        &mut sim,
        SendConfig::new(1, 16, 64).signal_every(8).remote(remote),
    );
    let data = payload();
    let fm = |sim: &Mlx5Sim, cur: u32| sim.sq()[(cur as usize & 63) * 64 + 11];
    let plain = Msg::send(Local::Inline(&data[..20]));
    assert!(!plain.is_fenced() && !plain.is_solicited());
    assert!(plain.fence().is_fenced() && plain.solicited().is_solicited());
    // The lone path, then an unflagged lone post: its own bits only.
    let cur = r.cur_post();
    r.send_now(plain.fence()).unwrap();
    assert_eq!(fm(&sim, cur), 0x80);
    let cur = r.cur_post();
    r.send_now(plain).unwrap();
    assert_eq!(fm(&sim, cur), 0);
    let cur = r.cur_post();
    r.send_now(Msg::write_imm(Local::Inline(&data[..8]), 64, 5).solicited())
        .unwrap();
    assert_eq!(fm(&sim, cur), 0x02);
    // A batch: fence + solicited, plain, solicited on a multi-block WQE.
    let mut curs = Vec::new();
    let mut b = r.batch();
    curs.push(b.cur_post());
    b.push(plain.fence().solicited()).unwrap();
    curs.push(b.cur_post());
    b.push(plain).unwrap();
    curs.push(b.cur_post());
    b.push(Msg::send(Local::Inline(&data)).solicited()).unwrap();
    b.finish().unwrap();
    let got: Vec<u8> = curs.iter().map(|&c| fm(&sim, c)).collect();
    assert_eq!(got, [0x82, 0, 0x02]);
    // The schedule's signal (sequence 7) on a fenced READ through `stage`, and a gather list.
    // SAFETY: inline.
    assert_eq!(unsafe { r.stage(plain) }, Ok(6));
    let cur = r.cur_post();
    // SAFETY: a READ destination nobody reads; the simulated device moves no data.
    let seq = unsafe { r.stage(Msg::read(LocalBuf::new(0x8000, 64, 3), 0).fence()) }.unwrap();
    assert_eq!(seq, 7);
    assert_eq!(fm(&sim, cur), 0x80 | CTRL_CQ_UPDATE);
    let cur = r.cur_post();
    r.stage_inline_gather(
        Msg::send(Local::Empty).solicited(),
        &[&data[..3], &data[..5]],
    )
    .unwrap();
    assert_eq!(fm(&sim, cur), 0x02);
    r.flush().unwrap();
    // The simulated device completes the signaled one; nothing else changed.
    assert_eq!(sim.process(), 1);
}

/// A UC QP's ring: SEND and RDMA WRITE (with immediate too) post the RC WQEs, RDMA READ and
/// atomics are refused by name, leaving the SQ, `cur_post` and the counters as they were.
#[test]
fn a_uc_ring_posts_send_and_write_and_refuses_read_and_atomics() {
    let mut sim = Mlx5Sim::new(64, 64, QPN);
    let remote = RemoteBuf::new(0x1000, 1 << 20, 7);
    let sq = DirectSq {
        uc: true,
        ..sq_of(&mut sim, 64)
    };
    let cfg = SendConfig::new(1, 16, 64).signal_every(1).remote(remote);
    // SAFETY: the simulator's memory outlives the ring; nothing else posts.
    let mut r =
        unsafe { DirectRing::with_doorbell(sq, cfg, None, RecordingDoorbell::new(sq.bf_reg)) }
            .unwrap();
    let mut p = poller(&mut sim);
    let data = payload();
    let dest = LocalBuf::new(0x8000, 8, 3);
    let before = sim.sq().to_vec();
    for m in [
        Msg::read(dest, 0),
        Msg::fetch_add(dest, 8, 1),
        Msg::cmp_swap(dest, 16, 1, 2),
    ] {
        // SAFETY: refused before any byte is written.
        let e = unsafe { r.stage(m) }.unwrap_err();
        assert_eq!(e, SendError::NotOnUc(m.opcode()));
        assert!(e.to_string().contains("UC"), "{e}");
    }
    assert_eq!(sim.sq(), &before[..], "a refused message writes nothing");
    assert_eq!((r.cur_post(), r.staged()), (0, 0));
    let msgs = [
        Msg::send(Local::Inline(&data[..20])),
        Msg::send_imm(Local::Inline(&data), 9),
        Msg::write(Local::Inline(&data[..30]), 128),
        Msg::write_imm(Local::Empty, 256, 4),
    ];
    for m in msgs {
        let cur = r.cur_post() as usize & 63;
        r.send_now(m).unwrap();
        let w = &sim.sq()[cur * 64..cur * 64 + 32];
        let raddr = matches!(
            m.opcode(),
            hotverbs_datapath::Opcode::Write | hotverbs_datapath::Opcode::WriteImm
        );
        if raddr {
            // The remote-address segment, as for RC.
            let addr = u64::from_be_bytes(w[16..24].try_into().unwrap());
            let rkey = u32::from_be_bytes(w[24..28].try_into().unwrap());
            assert_eq!((addr, rkey), (0x1000 + m_offset(&m), 7));
        } else {
            // A SEND's first segment is its inline data.
            assert_eq!(w[16] & 0x80, 0x80, "inline segment");
        }
        assert_eq!(sim.process(), 1);
        let c = p.poll().unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(r.on_completion(&c[0]), Ok(1));
    }
    assert_eq!(r.retired_total(), 4);
}

fn m_offset(m: &Msg<'_>) -> u64 {
    match m.opcode() {
        hotverbs_datapath::Opcode::Write => 128,
        _ => 256,
    }
}

/// CQEs of 128 bytes (`MLX5_CQE_SIZE=128`): the 64-byte CQE is each entry's second half.
/// Ten thousand messages round trip over many passes of a small CQ, an error CQE is read
/// with its syndrome, and a clean moves whole 128-byte entries. The simulator leaves each
/// first half zero: read by mistake, it would be a requester CQE of owner 0 (caught by
/// the counts).
#[test]
fn cqes_of_128_bytes_are_read_from_their_second_half() {
    let mut sim = Mlx5Sim::with_cqe_size(256, 16, QPN, 128);
    let mut r = ring(&mut sim, SendConfig::new(3, 32, 64).signal_every(4));
    let sq = sq_of(&mut sim, 0);
    let cq = DirectCq {
        cqe_size: 128,
        ..cq_of(&mut sim)
    };
    // SAFETY: the simulator's CQ and wrid table outlive the poller.
    let mut p = unsafe { DirectPoller::<16>::new(cq) }.unwrap();
    // SAFETY: as above.
    unsafe { p.attach(&sq) }.unwrap();
    let data = payload();
    let mut cqes = 0u32;
    // Under miri (which runs this for the poller's 128-byte pointer arithmetic) a tenth:
    // still 150 passes of the 16-entry CQ.
    let total = if cfg!(miri) { 1_000 } else { 10_000 };
    while r.posted_total() < total {
        match r.send_now(Msg::send(Local::Inline(
            &data[..(r.posted_total() % 45) as usize],
        ))) {
            Ok(_) | Err(SendError::WouldBlock) => {}
            Err(e) => panic!("{e}"),
        }
        sim.process();
        for c in p.poll().unwrap().iter() {
            assert_eq!(c.qp_num(), QPN);
            r.on_completion(c).unwrap();
            cqes += 1;
        }
    }
    assert_eq!(cqes, p.cons_index());
    assert_eq!(sim.cq_ci(), p.cons_index());
    assert!(cqes as u64 >= total * 6 / 25, "{cqes}");
    // An error CQE: its syndrome, from the second half.
    sim.fail_next(0x13, 0x42);
    r.signal_next();
    r.send_now(Msg::send(Local::Empty)).unwrap();
    sim.process();
    let c = p.poll().unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].as_raw().status, hotverbs_ffi::IBV_WC_REM_ACCESS_ERR);
    assert_eq!(c[0].as_raw().vendor_err, 0x42);
    // Clean: another QP's CQE between two of ours moves, whole, over the freed slot.
    let at = p.cons_index();
    sim.write_cqe(13, 0x0a, 1, 5, 0);
    sim.write_cqe_of(0x555, 0, 0x0a, 2);
    sim.write_cqe(13, 0x0a, 3, 5, 0);
    let base = sim.ptrs().cq;
    let slot = |i: u32| (i & 15) as usize * 128;
    // Mark the other QP's first half: it must travel with the CQE.
    // SAFETY: inside the simulator's 16 x 128-byte CQ.
    unsafe { base.add(slot(at + 1)).write_bytes(0x5a, 64) };
    assert_eq!(p.clean(QPN), 2);
    assert_eq!(p.cons_index(), at + 2);
    // SAFETY: as above.
    let moved = unsafe { std::slice::from_raw_parts(base.add(slot(at + 2)), 128) };
    assert!(
        moved[..64].iter().all(|&b| b == 0x5a),
        "the first half moved too"
    );
    assert_eq!(
        u32::from_be_bytes(moved[120..124].try_into().unwrap()) & 0xff_ffff,
        0x555
    );
}

#[test]
fn the_poller_refuses_cqes_it_does_not_model_and_leaves_them() {
    let mut sim = Mlx5Sim::new(64, 16, QPN);
    let mut p = poller(&mut sim);
    sim.write_cqe(0, 0x0a, 0, 0, 0);
    // Responder CQE (RESP_SEND) next, for a QP whose receive queue nobody attached.
    sim.write_cqe(2, 0, 0, 0, 0);
    assert_eq!(p.poll().unwrap().len(), 1, "the requester CQE before it");
    for _ in 0..2 {
        assert_eq!(p.poll().unwrap_err(), DirectError::UnknownQp(QPN));
    }
    assert_eq!(p.cons_index(), 1);
    // A resize CQE.
    let mut sim = Mlx5Sim::new(64, 16, QPN);
    let mut p = poller(&mut sim);
    sim.write_cqe(5, 0, 0, 0, 0);
    for _ in 0..2 {
        assert_eq!(
            p.poll().unwrap_err(),
            DirectError::CqeOpcode {
                opcode: 5,
                index: 0
            }
        );
    }
    assert_eq!(p.cons_index(), 0);
    // Compressed format bits.
    let mut sim = Mlx5Sim::new(64, 16, QPN);
    let mut p = poller(&mut sim);
    sim.write_cqe(0, 0x0a, 0, 0, 0);
    let c = sim.ptrs().cq;
    // SAFETY: CQE 0's op_own byte in the simulator's CQ.
    unsafe { *c.add(63) |= 0x0c };
    assert!(matches!(
        p.poll(),
        Err(DirectError::CqeFormat { index: 0, .. })
    ));
    // A QP nobody attached.
    let mut sim = Mlx5Sim::new(64, 16, 0x999);
    let cq = cq_of(&mut sim);
    // SAFETY: the simulator outlives the poller.
    let mut p = unsafe { DirectPoller::<4>::new(cq) }.unwrap();
    sim.write_cqe(0, 0x0a, 0, 0, 0);
    assert_eq!(p.poll().unwrap_err(), DirectError::UnknownQp(0x999));
    assert!(p.poll().unwrap_err().to_string().contains("attach"));
}

#[test]
fn owner_bit_wraps_over_many_passes() {
    let mut sim = Mlx5Sim::new(64, 4, QPN);
    let mut r = ring(&mut sim, SendConfig::new(1, 2, 8).signal_every(1));
    let mut p = poller(&mut sim);
    for i in 0..1000u32 {
        r.send_now(Msg::send(Local::Inline(&i.to_le_bytes())))
            .unwrap();
        assert_eq!(sim.process(), 1);
        let cs = p.poll().unwrap();
        assert_eq!(cs.len(), 1, "message {i}");
        assert_eq!(r.on_completion(&cs[0]), Ok(1));
        assert!(
            p.poll().unwrap().is_empty(),
            "a stale CQE of the last pass is not new"
        );
    }
    assert_eq!(p.cons_index(), 1000);
}

#[test]
fn split_mode_retires_through_the_shared_counters() {
    // Poster and poller roles interleaved on one thread (the threads' protocol is the
    // other rings', model-checked with loom): completions go to the retirer, the ring
    // learns of them at sync.
    let mut sim = Mlx5Sim::new(256, 64, QPN);
    let mut r = ring(
        &mut sim,
        SendConfig::new(5, 32, 16).signal_every(8).batch(4),
    );
    let mut p = poller(&mut sim);
    let (shared, mut retirer) = r.split();
    let mut sent = 0u64;
    while sent < 10_000 {
        match r.send_now(Msg::send(Local::Inline(b"split"))) {
            Ok(_) => sent += 1,
            Err(SendError::WouldBlock) => {}
            Err(e) => panic!("{e}"),
        }
        sim.process();
        for c in p.poll().unwrap().iter() {
            assert_eq!(c.ring(), 5);
            retirer.on_completion(c, &shared).unwrap();
        }
        r.sync(&shared);
        assert!(r.outstanding() <= 32);
    }
    assert_eq!(r.retired_total(), retirer.retired());
    assert!(r.retired_total() > 9_900, "{}", r.retired_total());
}

/// Two QPs on one CQ, every requester opcode mixed within one poll (the poller's fast path
/// reuses the words of the previous completion while QP and opcode repeat, and must not
/// when either changes), polls that cross the end of the CQ (the owner bit flips in the
/// middle of a poll): each completion has its own QP's `wr_id`, opcode, flags and length.
#[test]
fn mixed_qps_and_opcodes_in_one_poll_across_the_cq_wrap() {
    use hotverbs_datapath::mlx5::opcode as op;
    use hotverbs_ffi::*;
    const QPN_B: u32 = 0x5b5;
    let mut sim = Mlx5Sim::new(64, 8, QPN);
    let sq_a = sq_of(&mut sim, 0);
    let mut wrid_b: Vec<u64> = (0..64).map(|i| 0xb000 + i).collect();
    let sq_b = DirectSq {
        qp_num: QPN_B,
        wrid: wrid_b.as_mut_ptr(),
        ..sq_a
    };
    for i in 0..64 {
        // SAFETY: the simulator's wrid table has wqe_cnt (64) entries.
        unsafe { *sim.ptrs().wrid.add(i) = 0xa000 + i as u64 };
    }
    let cq = cq_of(&mut sim);
    // SAFETY: the simulator's CQ and both wrid tables outlive the poller.
    let mut p = unsafe { DirectPoller::<16>::new(cq) }.unwrap();
    // SAFETY: as above.
    unsafe { p.attach(&sq_a) }.unwrap();
    // SAFETY: as above.
    unsafe { p.attach(&sq_b) }.unwrap();

    // (wqe opcode, ibv_wc opcode, wc_flags, byte_len): byte_len is the CQE's 32 for READ,
    // 8 for atomics, 0 otherwise (libmlx5's handle_good_req).
    let kinds = [
        (op::SEND, IBV_WC_SEND, 0, 0),
        (op::SEND, IBV_WC_SEND, 0, 0),
        (op::RDMA_WRITE, IBV_WC_RDMA_WRITE, 0, 0),
        (op::SEND_IMM, IBV_WC_SEND, IBV_WC_WITH_IMM, 0),
        (op::RDMA_READ, IBV_WC_RDMA_READ, 0, 32),
        (op::SEND, IBV_WC_SEND, 0, 0),
        (op::ATOMIC_FA, IBV_WC_FETCH_ADD, 0, 8),
        (op::RDMA_WRITE_IMM, IBV_WC_RDMA_WRITE, IBV_WC_WITH_IMM, 0),
        (op::ATOMIC_CS, IBV_WC_COMP_SWAP, 0, 8),
    ];
    let mut k = 0usize;
    let mut seen = 0u32;
    for round in 0..40u32 {
        // 6 CQEs per round on a CQ of 8: most polls cross its end.
        let mut want = Vec::new();
        for j in 0..6u32 {
            let (wqe_op, wc_op, flags, len) = kinds[k % kinds.len()];
            // QP runs of 1 to 3 CQEs: A A B A B B A ...
            let qpn = if (k / 2 + k / 5) % 2 == 0 { QPN } else { QPN_B };
            let ctr = (round * 6 + j) as u16;
            sim.write_cqe_of(qpn, 0, wqe_op, ctr);
            let base = if qpn == QPN { 0xa000 } else { 0xb000 };
            want.push((base + (ctr as u64 & 63), qpn, wc_op, flags, len));
            k += 1;
        }
        let got: Vec<_> = p
            .poll()
            .unwrap()
            .iter()
            .map(|c| {
                let imm = if c.imm().is_some() {
                    IBV_WC_WITH_IMM
                } else {
                    0
                };
                (c.wr_id(), c.qp_num(), c.opcode(), imm, c.byte_len())
            })
            .collect();
        assert_eq!(got, want, "round {round}");
        seen += 6;
        assert_eq!(p.cons_index(), seen);
        // SAFETY: the CQ's doorbell record in the simulator.
        let dbr = unsafe { *sim.ptrs().cq_dbrec };
        assert_eq!(
            u32::from_be(dbr),
            seen,
            "the consumer index reaches the device"
        );
        assert!(p.poll().unwrap().is_empty(), "round {round}: stale CQEs");
    }
}

/// libmlx5 skips its CQ clean on a CQ that went through `mlx5dv_init_obj`, so a QP reset
/// with its error and flushes still unpolled leaves them in the CQ. Without a clean the
/// stale error CQE is read against the `wrid` entry the reset ring gave its next WR and
/// fails that WR; `DirectPoller::clean` removes exactly that QP's CQEs (another QP's stay,
/// in order), and the reset ring then retires only what it posted since.
#[test]
fn clean_after_a_reset_removes_that_qps_stale_cqes_and_nothing_else() {
    for clean in [false, true] {
        let mut sim = Mlx5Sim::new(64, 64, QPN);
        let mut r = ring(&mut sim, SendConfig::new(1, 16, 32).signal_every(4));
        let mut p = poller(&mut sim);
        // A second QP completing on the same CQ (its CQEs written by hand).
        let mut other_wrid = [0u64; 64];
        other_wrid[5] = 0x55;
        let mut sq2 = sq_of(&mut sim, 0);
        sq2.qp_num = QPN + 1;
        sq2.wrid = other_wrid.as_mut_ptr();
        // SAFETY: `other_wrid` (64 entries, the SQ's wqe_cnt) outlives the poller.
        unsafe { p.attach(&sq2) }.unwrap();
        sim.fail_next(0x13, 0x88);
        sim.write_cqe_of(QPN + 1, 0, 0x0a, 5);
        for _ in 0..3 {
            r.send_now(Msg::send(Local::Inline(b"x"))).unwrap();
        }
        assert_eq!(sim.process(), 3, "an error CQE and two flushes");
        sim.write_cqe_of(QPN + 1, 0, 0x0a, 5);
        // Nothing polled: the QP goes to RESET with its three CQEs in the CQ (the ring
        // settled first: the lone run's posts are counted from the doorbell record).
        r.settle();
        sim.reset_qp();
        if clean {
            assert_eq!(p.clean(QPN + 7), 0, "no CQE of an unknown QP");
            assert_eq!(p.clean(QPN), 3);
            assert_eq!(p.cons_index(), 3, "the freed CQEs count as consumed");
            assert_eq!(sim.cq_ci(), 3, "and the doorbell record says so");
        }
        // SAFETY: the ring was settled, the simulated QP went to RESET (and, with `clean`,
        // its CQEs are gone).
        assert_eq!(unsafe { r.reset() }, 3, "three WRs never completed");
        r.signal_next();
        let seq = r.send_now(Msg::send(Local::Inline(b"again"))).unwrap();
        assert_eq!(sim.process(), 1);
        let mut cs = [hotverbs_datapath::Completion::PLACEHOLDER; 8];
        let n = p.poll_into(&mut cs).unwrap();
        let ours: Vec<_> = cs[..n].iter().filter(|c| c.qp_num() == QPN).collect();
        let other: Vec<_> = cs[..n]
            .iter()
            .filter(|c| c.qp_num() == QPN + 1)
            .map(|c| c.wr_id())
            .collect();
        assert_eq!(other, [0x55, 0x55], "the other QP's CQEs stay");
        if clean {
            assert_eq!(n, 3);
            assert_eq!(
                cs[2].qp_num(),
                QPN,
                "order kept: the other QP's two, then ours"
            );
            assert_eq!(r.on_completion(ours[0]), Ok(1), "the new WR, retired");
            assert!(r.is_retired(seq));
            assert_eq!(r.outstanding(), 0);
        } else {
            assert_eq!(n, 6, "the stale error and flushes come back");
            // The stale error CQE names WQE 0, whose wrid entry is now the new WR's.
            assert_eq!(ours[0].wr_id(), ours[3].wr_id());
            assert_eq!(r.on_completion(ours[0]), Err(WcError::RemAccess));
            assert!(r.is_retired(seq), "the new WR failed by a stale CQE");
        }
    }
}

/// A completely full CQ (`cqe_cnt` unconsumed CQEs): every one of them is examined
/// (libmlx5's walk stops one short).
#[test]
fn clean_walks_a_completely_full_cq() {
    let mut sim = Mlx5Sim::new(64, 16, QPN);
    let mut p = poller(&mut sim);
    for i in 0..16u16 {
        let qpn = if i % 3 == 0 { QPN } else { QPN + 1 };
        sim.write_cqe_of(qpn, 0, 0x0a, i);
    }
    assert_eq!(p.clean(QPN), 6, "0, 3, 6, 9, 12 and 15");
    assert_eq!(p.cons_index(), 6);
    assert_eq!(p.clean(QPN), 0, "nothing left of it");
    assert_eq!(p.clean(QPN + 1), 10);
    assert_eq!((p.cons_index(), sim.cq_ci()), (16, 16));
    assert!(p.poll().unwrap().is_empty());
}

/// A leaked batch rewinds `cur_post` to the last doorbell, which the ring reads back from
/// the doorbell record: also across the record's 16-bit wrap.
#[test]
fn a_leaked_batch_rewinds_to_the_doorbell_across_its_16_bit_wrap() {
    let mut sim = Mlx5Sim::new(64, 16, QPN);
    let mut r = ring(
        &mut sim,
        SendConfig::new(1, 16, 16).batch(16).signal_every(8),
    );
    // A QP libmlx5 posted 0xfffe blocks on: its doorbell record says so.
    // SAFETY: the simulator's doorbell record (send counter at index 1).
    unsafe { sim.ptrs().qp_dbrec.add(1).write_volatile(0xfffeu32.to_be()) };
    // SAFETY: nothing staged or outstanding; 0xfffe is the record's value.
    unsafe { r.set_cur_post(0xfffe) };
    for _ in 0..3 {
        r.send_now(Msg::send(Local::Inline(b"x"))).unwrap();
    }
    assert_eq!((r.cur_post(), sim.sq_dbr()), (0x1_0001, 0x0001));
    let mut b = r.batch();
    for _ in 0..2 {
        b.push(Msg::send(Local::Inline(b"lost"))).unwrap();
    }
    std::mem::forget(b);
    r.send_now(Msg::send(Local::Inline(b"kept"))).unwrap();
    assert_eq!(
        (r.cur_post(), r.posted_total(), sim.sq_dbr()),
        (0x1_0002, 4, 0x0002),
        "the leaked WQEs' blocks are reused"
    );
}

mod prop {
    //! Random operation sequences on a `DirectRing` and `DirectPoller` over the simulated
    //! ConnectX queues: lone and general `send_now`, `stage`, batches (finished, dropped or
    //! leaked), `flush`, the device running, polls, injected error completions (then
    //! flushes), QP resets (with `DirectPoller::clean`), `signal_next`. After every step:
    //! - sequence numbers are consecutive from the posted count plus the staged ones (a
    //!   leaked batch hands its numbers back), refusals only when full (`WouldBlock`) or
    //!   failed (`QpError`, always once the ring knows the error);
    //! - nothing staged means everything was announced: the doorbell record is `cur_post`;
    //! - never more than `depth` staged or outstanding; nothing retired before the device
    //!   ran after it was posted (a stale CQE read after a reset would break this);
    //! - at the end, draining (with one signaled message as padding, or a reset after an
    //!   error) retires or drops every posted WR: no deadlock, nothing lost.
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        SendNow(u8),
        Stage(u8),
        /// Messages, then 0 finish, 1 drop, 2 leak.
        Batch(u8, u8),
        Flush,
        Process,
        Poll,
        FailNext,
        Reset,
        SignalNext,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u8..=64).prop_map(Op::SendNow),
            4 => (0u8..=64).prop_map(Op::Stage),
            3 => (1u8..20, 0u8..3).prop_map(|(k, e)| Op::Batch(k, e)),
            2 => Just(Op::Flush),
            4 => Just(Op::Process),
            4 => Just(Op::Poll),
            1 => Just(Op::FailNext),
            1 => Just(Op::Reset),
            1 => Just(Op::SignalNext),
        ]
    }

    struct World {
        sim: Box<Mlx5Sim>,
        r: DirectRing<RecordingDoorbell>,
        p: DirectPoller<16>,
        depth: u64,
        /// `posted_total` when the device last ran.
        processed: u64,
        /// `retired_total` after the last reset (which drops what never completed).
        floor: u64,
        /// A batch was leaked (`mem::forget`) and the ring has not been used since.
        leaked: bool,
        data: [u8; 64],
    }

    impl World {
        fn check(&self) -> Result<(), TestCaseError> {
            let r = &self.r;
            prop_assert!(r.retired_total() <= r.posted_total());
            prop_assert!(r.outstanding() + r.staged() <= self.depth);
            prop_assert!(
                r.retired_total() <= self.processed.max(self.floor),
                "retired {} but the device ran with {} posted (reset at {})",
                r.retired_total(),
                self.processed,
                self.floor
            );
            if r.staged() == 0 {
                prop_assert_eq!(self.sim.sq_dbr(), r.cur_post() & 0xffff, "announced");
            }
            Ok(())
        }

        /// One message's outcome: `got` from a post whose expected sequence number was
        /// `want`, on a ring with `room` and the error `err` before it.
        fn outcome(
            got: Result<u64, SendError>,
            want: u64,
            room: bool,
            err: Option<WcError>,
        ) -> Result<bool, TestCaseError> {
            match (got, err) {
                (Err(SendError::QpError(e)), Some(x)) => {
                    prop_assert_eq!(e, x);
                    Ok(false)
                }
                (r, Some(x)) => Err(TestCaseError::fail(format!(
                    "{r:?} from a ring in error {x:?}"
                ))),
                (Ok(s), None) => {
                    prop_assert!(room, "accepted beyond depth");
                    prop_assert_eq!(s, want, "consecutive sequence numbers");
                    Ok(true)
                }
                (Err(SendError::WouldBlock), None) => {
                    prop_assert!(!room, "refused with room");
                    Ok(false)
                }
                (Err(e), None) => Err(TestCaseError::fail(format!("post: {e}"))),
            }
        }

        fn poll(&mut self) -> Result<(), TestCaseError> {
            loop {
                let cs = self
                    .p
                    .poll()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                if cs.is_empty() {
                    return Ok(());
                }
                for c in cs.iter() {
                    let _ = self.r.on_completion(c);
                }
            }
        }

        fn reset(&mut self) {
            self.r.settle();
            let never = self.r.staged() + self.r.outstanding();
            self.sim.reset_qp();
            self.p.clean(QPN);
            // SAFETY: the ring was settled, the simulated QP went to RESET and its CQEs
            // were cleaned.
            let dropped = unsafe { self.r.reset() };
            assert_eq!(dropped, never, "reset drops what never completed");
            self.floor = self.r.retired_total();
        }

        fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
            // After a leaked batch the ring's next use drops everything staged (it was
            // never announced) and hands those sequence numbers out again.
            let staged = if self.leaked { 0 } else { self.r.staged() };
            if matches!(
                op,
                Op::SendNow(_) | Op::Stage(_) | Op::Batch(..) | Op::Flush
            ) {
                self.leaked = false;
            }
            let in_flight = self.r.outstanding() + staged;
            let want = self.r.posted_total() + staged;
            let err = self.r.error();
            let room = in_flight < self.depth;
            match *op {
                Op::SendNow(n) => {
                    let got = self
                        .r
                        .send_now(Msg::send(Local::Inline(&self.data[..n as usize])));
                    if Self::outcome(got, want, room, err)? {
                        prop_assert_eq!(self.r.staged(), 0, "send_now posts everything staged");
                    }
                }
                Op::Stage(n) => {
                    // SAFETY: inline (copied now).
                    let got = unsafe {
                        self.r
                            .stage(Msg::send(Local::Inline(&self.data[..n as usize])))
                    };
                    Self::outcome(got, want, room, err)?;
                }
                Op::Batch(k, end) => {
                    let data = self.data;
                    let mut b = self.r.batch();
                    let mut accepted = 0u64;
                    for i in 0..k as usize {
                        let got = b.push(Msg::send(Local::Inline(&data[..(i * 7) % 65])));
                        let room = in_flight + accepted < self.depth;
                        if Self::outcome(got, want + accepted, room, err)? {
                            accepted += 1;
                        }
                    }
                    match end {
                        0 => b.finish().unwrap(),
                        1 => drop(b),
                        _ => {
                            std::mem::forget(b);
                            self.leaked = true;
                        }
                    }
                }
                Op::Flush => self.r.flush().unwrap(),
                Op::Process => {
                    self.sim.process();
                    self.processed = self.r.posted_total();
                }
                Op::Poll => self.poll()?,
                Op::FailNext => self.sim.fail_next(0x13, 0),
                Op::Reset => self.reset(),
                Op::SignalNext => self.r.signal_next(),
            }
            self.check()
        }

        fn drain(&mut self) -> Result<(), TestCaseError> {
            self.r.flush().unwrap();
            for round in 0..4 {
                if self.r.error().is_some() {
                    self.reset();
                }
                if self.r.outstanding() > 0 {
                    self.r.signal_next();
                    let _ = self.r.send_now(Msg::send(Local::Inline(b"pad")));
                }
                self.sim.process();
                self.processed = self.r.posted_total();
                self.poll()?;
                self.check()?;
                if self.r.outstanding() == 0 && self.r.error().is_none() {
                    return Ok(());
                }
                prop_assert!(round < 3, "stuck: {:?}", self.r);
            }
            Ok(())
        }
    }

    fn run(depth_log: u32, k_sel: u64, batch_sel: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let depth = 1u64 << depth_log;
        let k = 1 + (k_sel - 1) % (depth / 2).max(1);
        let batch = 1 + (batch_sel - 1) % depth;
        let mut sim = Box::new(Mlx5Sim::new(64, 64, QPN));
        let cfg = SendConfig::new(1, depth as u32, 64)
            .signal_every(k as u32)
            .batch(batch as u32);
        let r = ring(&mut sim, cfg);
        let p = poller(&mut sim);
        let mut w = World {
            sim,
            r,
            p,
            depth,
            processed: 0,
            floor: 0,
            leaked: false,
            data: payload(),
        };
        for op in &ops {
            w.step(op)?;
        }
        w.drain()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]
        #[test]
        fn direct_ring_keeps_its_promises(
            depth_log in 1u32..=4,
            k_sel in 1u64..=8,
            batch_sel in 1u64..=16,
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            run(depth_log, k_sel, batch_sel, ops)?;
        }
    }
}

/// The hardware doorbell is there on the three targets with rdma-core's barriers written
/// here, and `DirectRing::new` rings with it; elsewhere it is `None` and the ring is refused
/// by name (`cargo xtask ci` checks that hotverbs builds for POWER, where this runs).
#[test]
fn the_hardware_doorbell_is_there_only_where_its_barriers_are() {
    let supported = cfg!(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    ));
    assert_eq!(Mmio::available().is_some(), supported);
    let msg = DirectError::NoMmio.to_string();
    assert!(
        msg.contains("no MMIO doorbell") && msg.contains("SendRing, WrRing, CqPoller"),
        "{msg}"
    );
    let mut sim = Mlx5Sim::new(64, 64, 0x77);
    let sq = sq_of(&mut sim, 44);
    // SAFETY: the simulator's send queue, used by this ring only, outliving it.
    let r = unsafe { DirectRing::new(sq, SendConfig::new(1, 8, 44), None) };
    if supported {
        assert!(r.is_ok(), "{:?}", r.err());
    } else {
        assert_eq!(r.err(), Some(ConfigError::Direct(DirectError::NoMmio)));
    }
}
