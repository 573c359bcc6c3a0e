//! [`DirectSession`](hotverbs_datapath::DirectSession) and
//! [`DirectWindow`](hotverbs_datapath::DirectWindow): the same bytes, doorbells and
//! retirement as the ring's own lone path and batches, back-pressure, the error state,
//! refused sizes, and leaks (`mem::forget`) repaired by the ring.

use hotverbs_datapath::mlx5::{MmioEvent, RecordingDoorbell};
use hotverbs_datapath::{ConfigError, DirectPoller, DirectRing, Local, Msg, SendConfig, SendError};
use hotverbs_softnic::mlx5sim::Mlx5Sim;

mod common;

const QPN: u32 = 0xabc;

/// A ring and its poller on a simulator of `wqe_cnt` blocks.
struct Bed {
    sim: Box<Mlx5Sim>,
    ring: DirectRing<RecordingDoorbell>,
    poller: DirectPoller<16>,
}

fn bed(wqe_cnt: u32, cfg: SendConfig) -> Bed {
    bed_inline(wqe_cnt, cfg, 64)
}

/// [`bed`] on a QP whose `max_inline` is `max_inline`.
fn bed_inline(wqe_cnt: u32, cfg: SendConfig, max_inline: u32) -> Bed {
    let mut sim = Box::new(Mlx5Sim::new(wqe_cnt, 256, QPN));
    let sq = common::mlx5::sim_sq(&mut sim, QPN, max_inline, 1);
    let cq = common::mlx5::sim_cq(&mut sim, 1);
    // SAFETY: the boxed simulator outlives the ring and the poller, its only users.
    let (ring, poller) = unsafe {
        let ring =
            DirectRing::with_doorbell(sq, cfg, None, RecordingDoorbell::new(sq.bf_reg)).unwrap();
        let mut poller = DirectPoller::<16>::new(cq).unwrap();
        poller.attach(&sq).unwrap();
        (ring, poller)
    };
    Bed { sim, ring, poller }
}

fn cfg() -> SendConfig {
    SendConfig::new(1, 32, 64).signal_every(8).batch(8)
}

fn msg(i: u64) -> [u8; 32] {
    std::array::from_fn(|k| (i as u8).wrapping_mul(7).wrapping_add(k as u8))
}

impl Bed {
    /// Runs the device and retires what it completed through the ring; returns how many.
    fn reap(&mut self) -> u64 {
        self.sim.process();
        let mut n = 0;
        for c in self.poller.poll().unwrap() {
            n += self.ring.on_completion(c).unwrap();
        }
        n
    }

    /// [`reap`](Self::reap) until nothing is outstanding; returns how many retired.
    fn drain(&mut self) -> u64 {
        let mut n = 0;
        while self.ring.outstanding() > 0 {
            n += self.reap();
        }
        n
    }
}

/// The two beds wrote the same bytes: every SQ block, `wrid` entry, the doorbell record, and
/// the same register stores and barriers in the same order.
fn assert_same(a: &mut Bed, b: &mut Bed) {
    let (sa, sb) = (snapshot(a), snapshot(b));
    for (blk, (x, y)) in sa.0.chunks(64).zip(sb.0.chunks(64)).enumerate() {
        assert_eq!(x, y, "SQ block {blk}");
    }
    assert_eq!(sa.1, sb.1, "wrid tables");
    assert_eq!(sa.2, sb.2, "doorbell records");
    assert_eq!(sa.3, sb.3, "register stores and barriers");
}

/// The `wrid` entries of WRs `0..n` of a bed's ring (id 1) whose WQEs are all one block
/// (WR `s` at block `s`): `encode(1, s)`, for the newest `wqe_cnt` of them, also those a
/// session's fast path left to be written later.
fn assert_ids(b: &mut Bed, n: u64) {
    let p = b.sim.ptrs();
    let cnt = u64::from(b.sim.wqe_cnt);
    for s in n.saturating_sub(cnt)..n {
        // SAFETY: an entry of the simulator's table of wqe_cnt entries.
        let id = unsafe { p.wrid.add((s % cnt) as usize).read() };
        assert_eq!(id, hotverbs_datapath::wr_id::encode(1, s), "wrid of WR {s}");
    }
}

/// SQ, `wrid` table, send doorbell record and every register store and barrier.
fn snapshot(b: &mut Bed) -> (Vec<u8>, Vec<u64>, u32, Vec<MmioEvent>) {
    // `send_now`'s lone run writes its `wrid` entries when it ends, as a session does when
    // it closes: `flush` ends it (nothing is staged, so it rings nothing).
    b.ring.flush().unwrap();
    let p = b.sim.ptrs();
    let n = b.sim.wqe_cnt as usize;
    // SAFETY: the simulator's regions, of these sizes, not written meanwhile.
    unsafe {
        (
            std::slice::from_raw_parts(p.sq, n * 64).to_vec(),
            std::slice::from_raw_parts(p.wrid, n).to_vec(),
            p.qp_dbrec.add(1).read(),
            b.ring.doorbell().events.clone(),
        )
    }
}

#[test]
fn a_session_writes_what_send_now_writes_and_retires_everything_once() {
    let n = 300u64;
    let (mut a, mut b) = (bed(64, cfg()), bed(64, cfg()));
    let mut retired_a = 0;
    let mut i = 0;
    while i < n {
        match a.ring.send_now(Msg::send(Local::Inline(&msg(i)))) {
            Ok(seq) => {
                assert_eq!(seq, i);
                i += 1;
            }
            Err(SendError::WouldBlock) => {
                retired_a += a.reap();
            }
            Err(e) => panic!("{e}"),
        }
    }
    let mut retired_b = 0;
    {
        let Bed { sim, ring, poller } = &mut b;
        let mut s = ring.session::<32>().unwrap();
        let mut i = 0;
        while i < n {
            match s.send(&msg(i)) {
                Ok(seq) => {
                    assert_eq!(seq, i);
                    assert_eq!(s.next_seq(), i + 1);
                    i += 1;
                }
                Err(SendError::WouldBlock) => {
                    assert_eq!(
                        s.outstanding(),
                        32,
                        "WouldBlock only with depth outstanding"
                    );
                    sim.process();
                    for c in poller.poll().unwrap() {
                        retired_b += s.on_completion(c).unwrap();
                    }
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    // The same stream, the same bytes: every WQE, wrid entry, doorbell record and
    // register store (BlueFlame copies and their alternation), and the same barriers.
    assert_same(&mut a, &mut b);
    assert_eq!(b.ring.posted_total(), n);
    assert_eq!(b.ring.bf_offset(), a.ring.bf_offset());
    // Everything retires, exactly once, on both (a last signaled WR: 300 is not a
    // multiple of the signal period).
    a.ring.signal_next();
    a.ring
        .send_now(Msg::send(Local::Inline(&[1u8; 8])))
        .unwrap();
    retired_a += a.drain();
    b.ring.signal_next();
    b.ring
        .send_now(Msg::send(Local::Inline(&[1u8; 8])))
        .unwrap();
    retired_b += b.drain();
    assert_eq!(retired_a, n + 1);
    assert_eq!(retired_b, n + 1);
    assert_eq!(b.ring.retired_total(), n + 1);
}

#[test]
fn a_window_writes_what_a_batch_writes() {
    let n = 640u64;
    let c = SendConfig::new(1, 64, 64).signal_every(16).batch(16);
    let (mut a, mut b) = (bed(128, c), bed(128, c));
    let (mut ra, mut rb) = (0, 0);
    let msgs: Vec<[u8; 32]> = (0..n).map(msg).collect();
    let mut i = 0;
    while i < n {
        let mut bt = a.ring.batch();
        for _ in 0..16 {
            bt.push(Msg::send(Local::Inline(&msgs[i as usize])))
                .unwrap();
            i += 1;
        }
        bt.finish().unwrap();
        ra += a.reap();
    }
    let mut i = 0;
    while i < n {
        let mut w = b.ring.window::<32>(16).unwrap();
        assert_eq!(w.room(), 16);
        for _ in 0..16 {
            assert_eq!(w.push(&msg(i)).unwrap(), i);
            i += 1;
        }
        assert!(matches!(w.push(&msg(i)), Err(SendError::WouldBlock)));
        w.finish();
        rb += b.reap();
    }
    assert_same(&mut a, &mut b);
    ra += a.drain();
    rb += b.drain();
    assert_eq!((ra, rb), (n, n), "every WR retired once");
}

#[test]
fn a_window_holds_the_rings_room_and_signals_the_wr_that_fills_it() {
    let mut b = bed(64, cfg());
    let mut w = b.ring.window::<32>(1000).unwrap();
    assert_eq!(w.room(), 32, "the ring's depth");
    for i in 0..32 {
        w.push(&msg(i)).unwrap();
    }
    assert!(matches!(w.push(&msg(0)), Err(SendError::WouldBlock)));
    w.finish();
    assert_eq!(b.ring.outstanding(), 32);
    let w = b.ring.window::<32>(8).unwrap();
    assert_eq!(w.room(), 0, "full");
    drop(w);
    // The WR that filled the ring (and the schedule's every 8th) is signaled: all retire.
    let mut n = 0;
    n += b.reap();
    assert_eq!(n, 32);
    assert_eq!(b.ring.outstanding(), 0);
}

#[test]
fn sizes_a_session_cannot_send_are_named() {
    let mut b = bed(64, cfg());
    assert!(matches!(
        b.ring.session::<45>().map(|_| ()),
        Err(SendError::InlineTooLong { len: 45, max: 44 })
    ));
    assert!(matches!(
        b.ring.session::<0>().map(|_| ()),
        Err(SendError::InlineTooLong { len: 0, .. })
    ));
    assert!(matches!(
        b.ring.window::<64>(4).map(|_| ()),
        Err(SendError::InlineTooLong { len: 64, max: 44 })
    ));
    let _ = b.ring.split();
    match b.ring.session::<8>().map(|_| ()) {
        Err(SendError::Config(ConfigError::Fixed(why))) => assert!(why.contains("split")),
        other => panic!("{other:?}"),
    }
    // An RC QP without inline data (max_inline 0): the inline limit, not UD's refusal
    // (found by the direct_ring fuzz target's sessions).
    let mut b = bed_inline(64, SendConfig::new(1, 32, 0), 0);
    assert_eq!(
        b.ring.session::<16>().map(|_| ()),
        Err(SendError::InlineTooLong { len: 16, max: 0 })
    );
}

#[test]
fn an_error_completion_stops_the_session() {
    let mut b = bed(64, cfg());
    let Bed { sim, ring, poller } = &mut b;
    let mut s = ring.session::<16>().unwrap();
    for i in 0..8 {
        s.send(&[i as u8; 16]).unwrap();
    }
    sim.fail_next(0x04, 0x51); // local protection error, then everything flushed
    for i in 0..8 {
        s.send(&[i as u8; 16]).unwrap();
    }
    sim.process();
    let mut errs = 0;
    for c in poller.poll().unwrap() {
        if s.on_completion(c).is_err() {
            errs += 1;
        }
    }
    assert!(errs > 0);
    assert!(matches!(s.send(&[0; 16]), Err(SendError::QpError(_))));
    drop(s);
    assert!(ring.error().is_some());
}

#[test]
fn a_leaked_session_is_caught_up_from_the_doorbell_record() {
    let mut b = bed(64, cfg());
    {
        let mut s = b.ring.session::<32>().unwrap();
        for i in 0..13 {
            assert_eq!(s.send(&msg(i)).unwrap(), i);
        }
        std::mem::forget(s);
    }
    // Posted, never written back by the session: the ring counts them from the record,
    // and its `cur_post` and BlueFlame buffer are the session's (13 doorbells: odd).
    assert_eq!(b.ring.outstanding(), 13);
    assert_eq!(b.ring.posted_total(), 13);
    assert_eq!(b.ring.cur_post(), 13);
    assert_eq!(b.ring.bf_offset(), 256);
    // The next post continues after them (no WQE overwritten, sequence numbers go on).
    assert_eq!(
        b.ring.send_now(Msg::send(Local::Inline(&msg(13)))).unwrap(),
        13
    );
    // Its repair wrote the entries the leaked session's fast path had not.
    assert_ids(&mut b, 14);
    b.ring.signal_next();
    b.ring.send_now(Msg::send(Local::Inline(&msg(14)))).unwrap();
    let mut n = 0;
    n += b.drain();
    assert_eq!(n, 15, "every WR retired once");
    // A session after a leaked one starts where the ring is.
    let mut s = b.ring.session::<32>().unwrap();
    assert_eq!(s.send(&msg(15)).unwrap(), 15);
}

#[test]
fn a_completion_for_a_leaked_sessions_wr_is_not_lost() {
    let mut b = bed(64, cfg());
    {
        let mut s = b.ring.session::<32>().unwrap();
        for i in 0..10 {
            s.send(&msg(i)).unwrap();
        }
        std::mem::forget(s);
    }
    // The device completes the 8th (wqe_counter 7, the first signaled: `signal_every(8)`)
    // before any ring call: the ring's counters say only what the session wrote back at
    // its last slow path; the doorbell record says 10.
    b.sim
        .write_cqe(0, hotverbs_datapath::mlx5::opcode::SEND, 7, 0, 0);
    let Bed { ring, poller, .. } = &mut b;
    let c = &poller.poll().unwrap()[0];
    assert_eq!(ring.on_completion(c).unwrap(), 8);
    assert_eq!(b.ring.outstanding(), 2);
    assert_eq!(b.ring.posted_total(), 10);
}

/// The session's fast path writes no `wrid` entry: an error CQE for one of its unsignaled
/// WRs, and the flush of every later one, find their WRs at the CQE's `wqe_counter` (open,
/// closed and leaked sessions), and every WR retires exactly once with the error named.
#[test]
fn error_completions_of_unsignaled_session_wrs_name_their_wrs() {
    for end in ["open", "closed", "leaked"] {
        let mut b = bed(64, cfg());
        let Bed { sim, ring, poller } = &mut b;
        // A WR the ring posted before the session, so the session's entries are not the
        // table's first: wr 0 (send_now, unsignaled), then the session from wr 1.
        ring.send_now(Msg::send(Local::Inline(&msg(0)))).unwrap();
        let mut s = ring.session::<32>().unwrap();
        for i in 1..5 {
            s.send(&msg(i)).unwrap();
        }
        // The device executes 0..=4 (none signaled: no CQE), then wr 5 (unsignaled, fast
        // path) fails and 6..=11 are flushed.
        sim.process();
        sim.fail_next(0x04, 0x51);
        for i in 5..12 {
            s.send(&msg(i)).unwrap();
        }
        sim.process();
        let mut retired = 0;
        let mut errors = Vec::new();
        let mut seen = 0;
        match end {
            "open" => {
                for c in poller.poll().unwrap() {
                    seen += 1;
                    match s.on_completion(c) {
                        Ok(n) => retired += n,
                        Err(e) => errors.push(e),
                    }
                }
                assert!(matches!(s.send(&msg(12)), Err(SendError::QpError(_))));
                drop(s);
            }
            "closed" => {
                drop(s);
            }
            _ => std::mem::forget(s),
        }
        if end != "open" {
            retire_polled(poller, ring, &mut seen, &mut retired, &mut errors);
        }
        assert_failed_at_5(ring, end, seen, retired, &errors);
        assert!(ring.error().is_some(), "{end}");
    }
}

/// One poll's completions given to `ring`: counted in `seen`, successes' WRs in `retired`,
/// errors in `errors`.
fn retire_polled(
    poller: &mut DirectPoller<16>,
    ring: &mut DirectRing<RecordingDoorbell>,
    seen: &mut u64,
    retired: &mut u64,
    errors: &mut Vec<hotverbs_datapath::WcError>,
) {
    for c in poller.poll().unwrap() {
        *seen += 1;
        match ring.on_completion(c) {
            Ok(n) => *retired += n,
            Err(e) => errors.push(e),
        }
    }
}

/// What the completions of WRs 0..=11, of which WR 5 failed (`LocProt`) and 6..=11 were
/// flushed, did to `ring`: `seen` CQEs gave `retired` by successes and `errors`.
fn assert_failed_at_5(
    ring: &DirectRing<RecordingDoorbell>,
    end: &str,
    seen: u64,
    retired: u64,
    errors: &[hotverbs_datapath::WcError],
) {
    // wr 7 was signaled and is flushed like the rest: one CQE per WR from 5 (the failing
    // one) to 11, and the first names the protection error.
    assert_eq!(
        seen, 7,
        "{end}: CQEs (errors {errors:?}, retired {retired})"
    );
    assert_eq!(
        errors.first().copied(),
        Some(hotverbs_datapath::WcError::LocProt),
        "{end}: the first error names the failing WR's status"
    );
    assert_eq!(retired, 0, "{end}: nothing completed successfully");
    // Every WR is accounted: 0..=11 retired by the error CQEs (the one of wr 5 retires
    // 0..=5), nothing left outstanding, nothing retired twice.
    assert_eq!(ring.posted_total(), 12, "{end}");
    assert_eq!(ring.retired_total(), 12, "{end}: every WR retired once");
    assert_eq!(ring.outstanding(), 0, "{end}");
}

#[test]
fn a_leaked_window_announces_nothing() {
    let mut b = bed(64, cfg());
    {
        let mut w = b.ring.window::<32>(8).unwrap();
        for i in 0..5 {
            w.push(&msg(i)).unwrap();
        }
        std::mem::forget(w);
    }
    b.ring.flush().unwrap();
    assert_eq!(b.ring.posted_total(), 0, "nothing announced");
    // SAFETY: the simulator's doorbell record.
    assert_eq!(b.sim.sq_dbr(), 0);
    assert_eq!(
        b.ring.send_now(Msg::send(Local::Inline(&msg(9)))).unwrap(),
        0
    );
    assert_eq!(b.ring.posted_total(), 1);
}

#[test]
fn a_post_list_writes_what_a_window_writes_across_the_sq_wrap() {
    // 96 blocks are not a multiple of the lists' 20: lists straddle the SQ's end.
    let c = SendConfig::new(1, 32, 64).signal_every(16).batch(16);
    let (mut a, mut b) = (bed(64, c), bed(64, c));
    let msgs: Vec<[u8; 32]> = (0..20).map(msg).collect();
    let (mut ra, mut rb) = (0, 0);
    for round in 0..15u64 {
        let mut w = a.ring.window::<32>(20).unwrap();
        for m in &msgs {
            w.push(m).unwrap();
        }
        w.finish();
        assert_eq!(b.ring.post_list(&msgs).unwrap(), 20, "round {round}");
        ra += a.reap();
        rb += b.reap();
    }
    assert_same(&mut a, &mut b);
    // Room: a list longer than the free room posts what fits, then WouldBlock.
    let long: Vec<[u8; 32]> = (0..40).map(msg).collect();
    let free = b.ring.free() as usize;
    assert_eq!(b.ring.post_list(&long).unwrap(), free);
    assert!(matches!(
        b.ring.post_list(&long),
        Err(SendError::WouldBlock)
    ));
    assert_eq!(b.ring.post_list::<32>(&[]).unwrap(), 0);
    ra += a.drain();
    rb += b.drain();
    assert_eq!(ra, 300);
    assert_eq!(rb, 300 + free as u64);
}

#[test]
fn sessions_swapped_between_rings_stay_with_their_rings() {
    let (mut a, mut b) = (bed(64, cfg()), bed(64, cfg()));
    {
        let mut sa = a.ring.session::<32>().unwrap();
        let mut sb = b.ring.session::<32>().unwrap();
        for i in 0..3 {
            assert_eq!(sa.send(&msg(i)).unwrap(), i);
        }
        for i in 0..5 {
            assert_eq!(sb.send(&msg(i)).unwrap(), i);
        }
        // The sessions carry their rings with them: after the swap `sa` sends on b's ring.
        std::mem::swap(&mut sa, &mut sb);
        assert_eq!(sa.send(&msg(5)).unwrap(), 5);
        assert_eq!(sb.send(&msg(3)).unwrap(), 3);
    }
    assert_eq!((a.ring.posted_total(), b.ring.posted_total()), (4, 6));
    // Each ring has the entries of its own WRs, the swapped session's included.
    assert_ids(&mut a, 4);
    assert_ids(&mut b, 6);
    for x in [&mut a, &mut b] {
        x.ring.signal_next();
        x.ring
            .send_now(Msg::send(Local::Inline(&[7u8; 8])))
            .unwrap();
    }
    assert_eq!((a.drain(), b.drain()), (5, 7), "every WR retired once");
}

#[test]
fn a_panic_with_a_window_or_session_open_leaves_the_ring_consistent() {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let mut b = bed(64, cfg());
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut w = b.ring.window::<32>(8).unwrap();
        for i in 0..3 {
            w.push(&msg(i)).unwrap();
        }
        panic!("in the middle of a window");
    }));
    assert!(r.is_err());
    // The window's drop ran during the unwind: its three WRs are posted, once.
    assert_eq!(b.ring.posted_total(), 3);
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut s = b.ring.session::<32>().unwrap();
        for i in 3..5 {
            assert_eq!(s.send(&msg(i)).unwrap(), i);
        }
        panic!("in the middle of a session");
    }));
    assert!(r.is_err());
    assert_eq!(b.ring.posted_total(), 5);
    // The session's drop wrote the entries its fast path had not.
    assert_ids(&mut b, 5);
    assert_eq!(
        b.ring.send_now(Msg::send(Local::Inline(&msg(5)))).unwrap(),
        5
    );
    b.ring.signal_next();
    b.ring.send_now(Msg::send(Local::Inline(&msg(6)))).unwrap();
    assert_eq!(b.drain(), 7, "every WR retired once");
}

/// `send_now`'s lone run: unsignaled WRs the lone path posted (no `wrid` entry written)
/// fail and are flushed while the run is still open (completions only, no other call), or
/// after a call ended it: every error CQE names its WR (the first the failing WR's own
/// status, never a flush), every WR retires exactly once, and the ring refuses the next
/// post with the error.
#[test]
fn error_completions_of_a_lone_runs_wrs_name_their_wrs() {
    for end in ["open", "ended"] {
        let mut b = bed(64, cfg());
        let Bed { sim, ring, .. } = &mut b;
        let send = |r: &mut DirectRing<RecordingDoorbell>, i: u64| {
            r.send_now(Msg::send(Local::Inline(&msg(i)))).unwrap()
        };
        // wr 0 opens the run (the slow path); 1..=4 take the lone path.
        assert!(!ring.lone_ready());
        send(ring, 0);
        for i in 1..5 {
            assert!(ring.lone_ready(), "{end}: wr {i} on the lone path");
            assert_eq!(send(ring, i), i);
        }
        sim.process();
        // wr 5 (unsignaled, lone) fails; 6..=11 are flushed (wr 7 is the signal's stop).
        sim.fail_next(0x04, 0x51);
        for i in 5..12 {
            assert_eq!(send(ring, i), i);
        }
        assert_eq!(
            ring.posted_total(),
            12,
            "{end}: counted from the doorbell record"
        );
        assert_eq!(ring.cur_post(), 12, "{end}");
        sim.process();
        if end == "ended" {
            ring.flush().unwrap();
            assert_ids(&mut b, 12);
        }
        let Bed { ring, poller, .. } = &mut b;
        let mut retired = 0;
        let mut errors = Vec::new();
        let mut seen = 0;
        retire_polled(poller, ring, &mut seen, &mut retired, &mut errors);
        assert_failed_at_5(ring, end, seen, retired, &errors);
        assert!(matches!(
            ring.send_now(Msg::send(Local::Inline(&msg(12)))),
            Err(SendError::QpError(hotverbs_datapath::WcError::LocProt))
        ));
        assert_eq!(
            ring.posted_total(),
            12,
            "{end}: the refused post counts nothing"
        );
    }
}

/// A lone run long enough that `cur_post`'s low 16 bits (what the doorbell record holds,
/// and the lone path counts from) wrap twice: every WR is posted, signaled on schedule,
/// retired exactly once, and the `wrid` table is right when the run ends.
#[test]
fn a_lone_run_counts_across_the_16_bit_wrap() {
    let mut b = bed(64, cfg());
    let n = 140_000u64;
    let (mut sent, mut retired, mut lone) = (0u64, 0u64, 0u64);
    while sent < n {
        lone += u64::from(b.ring.lone_ready());
        match b.ring.send_now(Msg::send(Local::Inline(&msg(sent)))) {
            Ok(s) => {
                assert_eq!(s, sent);
                sent += 1;
            }
            Err(SendError::WouldBlock) => retired += b.reap(),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(b.ring.posted_total(), n);
    assert_eq!(b.ring.cur_post(), n as u32);
    assert_eq!(b.sim.sq_dbr(), (n & 0xffff) as u32);
    retired += b.drain();
    assert_eq!(retired, n, "every WR retired once");
    // The stops: one in signal_every (8), and the WR that fills the ring (depth 32) and
    // its retry; the others take the lone path (27 of 32).
    assert!(lone >= n * 26 / 32, "{lone} of {n} on the lone path");
    b.ring.flush().unwrap();
    assert_ids(&mut b, n);
}

/// Every call but `send_now` and `on_completion` ends an open lone run first: the counters
/// caught up from the doorbell record, the run's `wrid` entries written, the lone path
/// closed; the call then does what it does on a ring that never had a run, and a later
/// `send_now` opens a new run. Checked against a ring that posts the same WRs with
/// `stage` and `flush` (no run): the same bytes, entries, doorbell record and register
/// stores.
#[test]
fn every_other_call_ends_a_lone_run() {
    type Call = fn(&mut DirectRing<RecordingDoorbell>);
    let calls: [(&str, Call); 8] = [
        ("stage", |r| {
            // SAFETY: an inline payload.
            unsafe { r.stage(Msg::send(Local::Inline(&msg(5)))) }.unwrap();
            r.flush().unwrap();
        }),
        ("flush", |r| r.flush().unwrap()),
        ("batch", |r| {
            let m = msg(5);
            let mut b = r.batch();
            b.push(Msg::send(Local::Inline(&m))).unwrap();
            b.finish().unwrap();
        }),
        ("session", |r| {
            r.session::<32>().unwrap().send(&msg(5)).unwrap();
        }),
        ("window", |r| {
            let mut w = r.window::<32>(1).unwrap();
            w.push(&msg(5)).unwrap();
            w.finish();
        }),
        ("post_list", |r| {
            assert_eq!(r.post_list(&[msg(5)]).unwrap(), 1);
        }),
        ("signal_next", |r| r.signal_next()),
        ("inline gather", |r| {
            let m = msg(5);
            r.stage_inline_gather(Msg::send(Local::Empty), &[&m[..]])
                .unwrap();
            r.flush().unwrap();
        }),
    ];
    for (name, call) in calls {
        let mut b = bed(64, cfg());
        for i in 0..5 {
            b.ring.send_now(Msg::send(Local::Inline(&msg(i)))).unwrap();
        }
        assert!(b.ring.lone_ready(), "{name}: a lone run is open");
        call(&mut b.ring);
        assert!(!b.ring.lone_ready(), "{name}: the call ended the run");
        let posted = b.ring.posted_total();
        assert_eq!(
            posted,
            if name == "signal_next" || name == "flush" {
                5
            } else {
                6
            }
        );
        assert_eq!(b.ring.cur_post(), posted as u32, "{name}");
        assert_eq!(b.sim.sq_dbr(), posted as u32, "{name}");
        assert_ids(&mut b, posted);
        // The ring goes on: a new run, then everything retires (the last WR signaled, so
        // that a completion covers it).
        let total = posted + 20;
        for i in posted..total {
            if i == total - 1 {
                b.ring.signal_next();
            }
            match b.ring.send_now(Msg::send(Local::Inline(&msg(i)))) {
                Ok(s) => assert_eq!(s, i, "{name}"),
                Err(e) => panic!("{name}: {e}"),
            }
        }
        assert_eq!(b.drain(), total, "{name}: every WR retired once");
        b.ring.flush().unwrap();
        assert_ids(&mut b, total);

        // The same WRs staged and flushed one at a time on a ring that never opens a run.
        let mut c = bed(64, cfg());
        for i in 0..total {
            let m = msg(i);
            if (name == "signal_next" && i == 5) || i == total - 1 {
                c.ring.signal_next();
            }
            // SAFETY: an inline payload.
            unsafe { c.ring.stage(Msg::send(Local::Inline(&m))) }.unwrap();
            c.ring.flush().unwrap();
            if i % 8 == 7 {
                c.reap();
            }
        }
        c.drain();
        let (sa, sb) = (snapshot(&mut b), snapshot(&mut c));
        assert_eq!(sa.0, sb.0, "{name}: SQ bytes");
        assert_eq!(sa.1, sb.1, "{name}: wrid tables");
        assert_eq!(sa.2, sb.2, "{name}: doorbell records");
    }
}

/// Lone runs under `mem::swap` and a panic: two rings with runs open swap places (each
/// keeps its own QP: the run's counter is the ring's own doorbell record), post through
/// the other's handle, swap back; a panic between lone posts unwinds past the ring. Every
/// WR retires exactly once on its own ring, and each ring's table and doorbell record are
/// its own posts'.
#[test]
fn lone_runs_survive_swap_and_a_panic() {
    let (mut a, mut b) = (bed(64, cfg()), bed(64, cfg()));
    let send = |r: &mut DirectRing<RecordingDoorbell>, i: u64| {
        r.send_now(Msg::send(Local::Inline(&msg(i)))).unwrap()
    };
    for i in 0..3 {
        send(&mut a.ring, i);
    }
    for i in 0..5 {
        send(&mut b.ring, i);
    }
    assert!(a.ring.lone_ready() && b.ring.lone_ready());
    std::mem::swap(&mut a.ring, &mut b.ring);
    // `a.ring` is b's ring now (b's SQ and record): its next sequence number is b's.
    assert_eq!(send(&mut a.ring, 5), 5);
    assert_eq!(send(&mut b.ring, 3), 3);
    std::mem::swap(&mut a.ring, &mut b.ring);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        send(&mut a.ring, 4);
        panic!("between lone posts");
    }));
    assert!(r.is_err());
    assert_eq!(send(&mut a.ring, 5), 5, "the run goes on after the panic");
    for (name, bd, n) in [("a", &mut a, 6u64), ("b", &mut b, 6)] {
        assert_eq!(bd.ring.posted_total(), n, "{name}");
        assert_eq!(bd.sim.sq_dbr(), n as u32, "{name}: its own doorbell record");
        bd.ring.signal_next();
        assert_eq!(send(&mut bd.ring, n), n);
        assert_eq!(bd.drain(), n + 1, "{name}: every WR retired once");
        bd.ring.flush().unwrap();
        assert_ids(bd, n + 1);
    }
}
