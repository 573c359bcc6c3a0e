//! Issue 27's fault scenario through the public API only, no `unsafe`: a stream of SENDs
//! to a peer that dies mid-stream, the error and flush completions, the ring's safe
//! recovery (`reset_qp`), a connection to a new peer with the same ring, traffic resumed;
//! every WR retired exactly once.
//!
//! On softnic in both profiles on every `cargo test`; on rxe0 inside `cargo xtask rxe`
//! (the `real_device*` convention), where the dead peer is a destroyed QP whose packets
//! rxe drops, so the WRs end with `RETRY_EXC_ERR` after the transport retries.

use std::time::Duration;

use hotverbs::testing::{device_or_softnic_profiles, gid_index};
use hotverbs::*;

/// Receive slots per peer.
const SLOTS: u32 = 64;

struct Stream<'q> {
    ring: SendRing<'q, 16>,
    /// `send_now` answers that posted a WR.
    posted: u64,
    /// WRs retired by completions (measured on the ring's retired count, per completion).
    retired_by_completions: u64,
    /// WRs a reset accounted as never completed.
    dropped_by_reset: u64,
    /// Error statuses seen, in order.
    errors: Vec<WcError>,
}

impl Stream<'_> {
    /// Sends `seq` (8 bytes inline); `last` asks for a signal (the stream's ring has no
    /// remote, so `drain` cannot post one itself).
    fn send(&mut self, seq: u64, last: bool) {
        if last {
            self.ring.signal_next();
        }
        let r = self
            .ring
            .send_now(Msg::send(Local::Inline(&seq.to_le_bytes())));
        match r {
            Ok(_) => self.posted += 1,
            Err(e) => panic!("send_now({seq}): {e}"),
        }
    }

    /// Polls until nothing is outstanding (the ring asks for the signal its unsignaled
    /// tail needs), counting what each completion retires.
    fn drain(&mut self, p: &mut CqPoller<'_, 16>, timeout: Duration) {
        let Stream {
            ring,
            retired_by_completions,
            errors,
            posted,
            ..
        } = self;
        let before = ring.posted_total();
        let r = ring.drain(timeout, |r| {
            for c in p.poll()? {
                let was = r.retired_total();
                if let Err(e) = r.on_completion(c) {
                    errors.push(e);
                }
                let now = r.retired_total();
                assert!(
                    now >= was && now <= r.posted_total(),
                    "retired within posted"
                );
                *retired_by_completions += now - was;
            }
            Ok::<_, PollError>(())
        });
        // The zero-length signaled WRITE drain may post is a WR too.
        *posted += ring.posted_total() - before;
        r.unwrap_or_else(|e| panic!("drain: {e}"));
    }
}

fn open() -> Vec<(String, Context)> {
    device_or_softnic_profiles("real_device_reconnect", "reconnect")
}

#[test]
fn peer_dies_mid_stream_then_the_same_ring_serves_a_new_peer() {
    for (label, ctx) in open() {
        run(&label, &ctx);
    }
}

fn run(label: &str, ctx: &Context) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let peer_cq = ctx.create_cq(256, None).unwrap();
    let port = ctx.port_info(None, gid_index()).unwrap();
    // timeout 12 (16.8 ms per attempt) and retry_cnt 6: a dead peer fails a WR after
    // about 120 ms on rxe; softnic fails it at once.
    let opts = ConnectOptions {
        timeout: 12,
        ..ConnectOptions::default()
    };
    let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .max_send_wr(16)
        .max_inline_data(64)
        .build()
        .unwrap();
    let peer = || {
        QpBuilder::new(&pd, &peer_cq, &peer_cq, QpType::Rc)
            .max_recv_wr(SLOTS)
            .build()
            .unwrap()
    };
    let region = || {
        pd.alloc_mr(SLOTS as usize * 64, AccessFlags::LOCAL_WRITE)
            .unwrap()
    };
    let (mut b_mem, mut c_mem) = (region(), region());
    let b = peer();
    a.connect(&port, &b.endpoint(&port), &opts).unwrap();
    b.connect(&port, &a.endpoint(&port), &opts).unwrap();

    let mut s = Stream {
        ring: a
            .send_ring::<16>(SendConfig::new(0, 16, 64).signal_every(4))
            .unwrap(),
        posted: 0,
        retired_by_completions: 0,
        dropped_by_reset: 0,
        errors: Vec::new(),
    };
    let mut p = cq.poller::<16>().unwrap();
    let mut pp = peer_cq.poller::<16>().unwrap();
    let patience = Duration::from_secs(10);

    // 1. Healthy stream to B.
    {
        let mut rb = b
            .recv_ring::<64>(&mut b_mem, 0, RecvConfig::new(0, 64, SLOTS))
            .unwrap();
        rb.fill().unwrap();
        for seq in 0..10 {
            s.send(seq, seq == 9);
        }
        s.drain(&mut p, patience);
        assert!(s.errors.is_empty(), "{label}: {:?}", s.errors);
        assert_eq!(
            receive(&mut pp, &mut rb, 10),
            (0..10).collect::<Vec<_>>(),
            "{label}"
        );
    }

    // 2. B dies mid-stream: its QP is destroyed; A keeps sending.
    b.destroy().unwrap();
    for seq in 10..18 {
        s.send(seq, seq == 17);
    }
    s.drain(&mut p, patience);
    assert!(
        matches!(s.errors.first(), Some(WcError::RetryExc)),
        "{label}: a dead peer ends the first WR with RETRY_EXC_ERR: {:?}",
        s.errors
    );
    assert!(
        s.errors[1..].iter().all(|e| *e == WcError::WrFlush),
        "{label}: the rest flush: {:?}",
        s.errors
    );
    assert_eq!(s.ring.error(), Some(WcError::RetryExc));
    assert_eq!(
        s.ring
            .send_now(Msg::send(Local::Inline(&[0; 8])))
            .unwrap_err(),
        SendError::QpError(WcError::RetryExc),
        "{label}: a failed ring refuses until it is recovered"
    );
    // Behind the ring's back, nothing: the QP is the ring's.
    assert_eq!(a.reset().unwrap_err().errno(), libc::EBUSY, "{label}");

    // 3. Safe recovery, then a new peer C with the same ring.
    s.dropped_by_reset += s.ring.reset_qp().unwrap();
    assert_eq!(s.ring.outstanding(), 0);
    let c = peer();
    a.connect(&port, &c.endpoint(&port), &opts).unwrap();
    c.connect(&port, &a.endpoint(&port), &opts).unwrap();
    let mut rc = c
        .recv_ring::<64>(&mut c_mem, 0, RecvConfig::new(0, 64, SLOTS))
        .unwrap();
    rc.fill().unwrap();
    let errors_before = s.errors.len();
    for seq in 18..40 {
        // In bursts of 8 (the ring holds 16), each ending signaled and drained.
        let last = seq == 39 || (seq - 18) % 8 == 7;
        s.send(seq, last);
        if last {
            s.drain(&mut p, patience);
        }
    }
    assert_eq!(s.errors.len(), errors_before, "{label}: {:?}", s.errors);
    assert_eq!(
        receive(&mut pp, &mut rc, 22),
        (18..40).collect::<Vec<_>>(),
        "{label}"
    );

    // Every WR exactly once: retired by a completion or accounted by the reset.
    assert_eq!(s.ring.outstanding(), 0);
    assert_eq!(
        s.retired_by_completions + s.dropped_by_reset,
        s.posted,
        "{label}: posted {} = retired {} + dropped {}",
        s.posted,
        s.retired_by_completions,
        s.dropped_by_reset
    );
    assert_eq!(s.ring.posted_total(), s.posted, "{label}");
    eprintln!(
        "{label}: {} WRs posted, {} retired by completions, {} dropped by the reset, errors {:?}",
        s.posted, s.retired_by_completions, s.dropped_by_reset, s.errors
    );
}

/// The next `n` messages of `rx` (their sequence numbers), bounded by polls.
fn receive(p: &mut CqPoller<'_, 16>, rx: &mut RecvRing<'_, 64>, n: usize) -> Vec<u64> {
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while got.len() < n && std::time::Instant::now() < deadline {
        for c in p.poll().unwrap() {
            let m = rx.on_completion(c).unwrap();
            let d = rx.data(&m).unwrap();
            got.push(u64::from_le_bytes(d[..8].try_into().unwrap()));
            rx.release(m).unwrap();
        }
        rx.repost().unwrap();
    }
    got
}

/// The same with RDMA WRITEs: after the recovery the ring is pointed at the new peer's
/// region (`set_remote`), and the new messages land there and only there.
#[test]
fn a_write_ring_follows_its_new_peers_region() {
    for (label, ctx) in open() {
        run_writes(&label, &ctx);
    }
}

fn run_writes(label: &str, ctx: &Context) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let peer_cq = ctx.create_cq(64, None).unwrap();
    let port = ctx.port_info(None, gid_index()).unwrap();
    let opts = ConnectOptions {
        timeout: 12,
        ..ConnectOptions::default()
    };
    let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .max_send_wr(16)
        .max_inline_data(64)
        .build()
        .unwrap();
    let peer = || {
        QpBuilder::new(&pd, &peer_cq, &peer_cq, QpType::Rc)
            .build()
            .unwrap()
    };
    let region = || {
        pd.alloc_mr(512, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap()
    };
    let (b_mem, c_mem) = (region(), region());
    let b = peer();
    a.connect(&port, &b.endpoint(&port), &opts).unwrap();
    b.connect(&port, &a.endpoint(&port), &opts).unwrap();
    let mut ring = a
        .send_ring::<16>(
            SendConfig::new(0, 16, 64)
                .signal_every(4)
                .remote(b_mem.remote().into()),
        )
        .unwrap();
    let mut p = cq.poller::<16>().unwrap();
    let mut errors = Vec::new();
    let mut drain = |ring: &mut SendRing<'_, 16>, errors: &mut Vec<WcError>| {
        ring.drain(Duration::from_secs(10), |r| {
            for c in p.poll()? {
                if let Err(e) = r.on_completion(c) {
                    errors.push(e);
                }
            }
            Ok::<_, PollError>(())
        })
        .unwrap_or_else(|e| panic!("{label}: drain: {e}"));
    };
    for i in 0..8u64 {
        ring.send_now(Msg::write(Local::Inline(&(i + 1).to_le_bytes()), i * 8))
            .unwrap();
    }
    drain(&mut ring, &mut errors);
    assert!(errors.is_empty(), "{label}: {errors:?}");
    b.destroy().unwrap();
    ring.send_now(Msg::write(Local::Inline(&[9; 8]), 64))
        .unwrap();
    drain(&mut ring, &mut errors);
    assert_eq!(
        errors.first(),
        Some(&WcError::RetryExc),
        "{label}: {errors:?}"
    );
    let dropped = ring.reset_qp().unwrap();
    let c = peer();
    a.connect(&port, &c.endpoint(&port), &opts).unwrap();
    c.connect(&port, &a.endpoint(&port), &opts).unwrap();
    ring.set_remote(c_mem.remote()).unwrap();
    errors.clear();
    for i in 0..8u64 {
        ring.send_now(Msg::write(Local::Inline(&(100 + i).to_le_bytes()), i * 8))
            .unwrap();
    }
    drain(&mut ring, &mut errors);
    assert!(errors.is_empty(), "{label}: {errors:?}");
    for i in 0..8u64 {
        assert_eq!(
            c_mem.read_u64(i as usize * 8).unwrap(),
            100 + i,
            "{label}: C got it"
        );
        assert_eq!(
            b_mem.read_u64(i as usize * 8).unwrap(),
            i + 1,
            "{label}: B untouched"
        );
    }
    assert_eq!(ring.outstanding(), 0);
    assert_eq!(
        ring.retired_total(),
        ring.posted_total(),
        "{label}: dropped {dropped}"
    );
}

/// The receive side on an SRQ: two QPs share one `SrqRing`; one of them loses its peer
/// (its own SEND to the dead peer fails), is recovered through its send ring and connected
/// to a new peer, while the other's traffic goes on. The SRQ's receives are untouched by
/// the QP's error and reset (no slot lost, none reposted twice): every slot is posted,
/// held or pending at each step, and every message arrives exactly once.
#[test]
fn an_srq_ring_serves_on_while_one_of_its_qps_is_recovered() {
    for (label, ctx) in open() {
        run_srq(&label, &ctx);
    }
}

fn run_srq(label: &str, ctx: &Context) {
    let pd = ctx.alloc_pd().unwrap();
    let rcq = ctx.create_cq(256, None).unwrap();
    let scq = ctx.create_cq(256, None).unwrap();
    let port = ctx.port_info(None, gid_index()).unwrap();
    let opts = ConnectOptions {
        timeout: 12,
        ..ConnectOptions::default()
    };
    let srq = pd.create_srq(SLOTS, 1).unwrap();
    let mut mem = pd
        .alloc_mr(SLOTS as usize * 64, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let receiver = || {
        QpBuilder::new(&pd, &scq, &rcq, QpType::Rc)
            .srq(&srq)
            .max_send_wr(16)
            .max_inline_data(64)
            .build()
            .unwrap()
    };
    let sender = || {
        QpBuilder::new(&pd, &scq, &scq, QpType::Rc)
            .max_send_wr(16)
            .max_inline_data(64)
            .build()
            .unwrap()
    };
    let (r1, r2) = (receiver(), receiver());
    let (s1, s2) = (sender(), sender());
    for (r, s) in [(&r1, &s1), (&r2, &s2)] {
        r.connect(&port, &s.endpoint(&port), &opts).unwrap();
        s.connect(&port, &r.endpoint(&port), &opts).unwrap();
    }
    let mut ring = srq
        .recv_ring::<64>(&rcq, &mut mem, 0, RecvConfig::new(0, 64, SLOTS))
        .unwrap();
    assert_eq!(ring.fill().unwrap(), SLOTS as usize, "{label}");
    let mut rp = rcq.poller::<16>().unwrap();
    let mut sp = scq.poller::<16>().unwrap();
    let patience = Duration::from_secs(10);
    let cfg = |id| SendConfig::new(id, 16, 64).signal_every(4);
    let mut tx1 = s1.send_ring::<16>(cfg(1)).unwrap();
    let mut tx2 = s2.send_ring::<16>(cfg(2)).unwrap();
    let mut back = r1.send_ring::<16>(cfg(3)).unwrap();
    let all_accounted = |ring: &SrqRing<'_, 64>, what: &str| {
        assert_eq!(
            ring.posted() + ring.held() + ring.pending(),
            SLOTS,
            "{label}: {what}: every slot posted, held or pending"
        );
    };
    let send = |tx: &mut SendRing<'_, 16>, sp: &mut CqPoller<'_, 16>, seqs| {
        send_drained(label, tx, sp, seqs)
    };

    // 1. Both peers stream.
    send(&mut tx1, &mut sp, 0..10);
    send(&mut tx2, &mut sp, 100..110);
    let got = srq_receive(&mut rp, &mut ring, 20);
    assert_eq!(got.get(&r1.qp_num()), Some(&(0..10).collect()), "{label}");
    assert_eq!(
        got.get(&r2.qp_num()),
        Some(&(100..110).collect()),
        "{label}"
    );
    all_accounted(&ring, "after the first stream");

    // 2. S1 dies; R1 finds out when its own SEND to it fails.
    drop(tx1);
    s1.destroy().unwrap();
    back.signal_next();
    back.send_now(Msg::send(Local::Inline(&[0; 8]))).unwrap();
    let mut errors = Vec::new();
    back.drain(patience, |r| {
        for c in sp.poll()? {
            if let Err(e) = r.on_completion(c) {
                errors.push(e);
            }
        }
        Ok::<_, PollError>(())
    })
    .unwrap_or_else(|e| panic!("{label}: drain: {e}"));
    assert_eq!(errors, [WcError::RetryExc], "{label}");
    // The SRQ's receives are not R1's: its error flushed none of them.
    assert!(
        srq_receive(&mut rp, &mut ring, 0).is_empty(),
        "{label}: no receive completion from R1's error"
    );
    all_accounted(&ring, "after R1's error");

    // 3. R1 recovered through its send ring, connected to a new peer S3; S2 went on.
    assert_eq!(
        back.reset_qp().unwrap(),
        0,
        "{label}: the failed WR retired"
    );
    let s3 = sender();
    r1.connect(&port, &s3.endpoint(&port), &opts).unwrap();
    s3.connect(&port, &r1.endpoint(&port), &opts).unwrap();
    let mut tx3 = s3.send_ring::<16>(cfg(4)).unwrap();
    send(&mut tx3, &mut sp, 200..220);
    send(&mut tx2, &mut sp, 110..130);
    let got = srq_receive(&mut rp, &mut ring, 40);
    assert_eq!(
        got.get(&r1.qp_num()),
        Some(&(200..220).collect()),
        "{label}"
    );
    assert_eq!(
        got.get(&r2.qp_num()),
        Some(&(110..130).collect()),
        "{label}"
    );
    all_accounted(&ring, "after the recovery");
    assert_eq!(ring.progress().retired, 60, "{label}: each message once");
}

/// Sends `seqs` on `tx` in bursts of 8 (the ring holds 16), each ending signaled and
/// drained; panics on any error.
fn send_drained(
    label: &str,
    tx: &mut SendRing<'_, 16>,
    sp: &mut CqPoller<'_, 16>,
    seqs: std::ops::Range<u64>,
) {
    for seq in seqs.clone() {
        let last = seq + 1 == seqs.end || (seq - seqs.start) % 8 == 7;
        if last {
            tx.signal_next();
        }
        tx.send_now(Msg::send(Local::Inline(&seq.to_le_bytes())))
            .unwrap();
        if last {
            tx.drain(Duration::from_secs(10), |r| {
                for c in sp.poll()? {
                    r.on_completion(c).unwrap();
                }
                Ok::<_, PollError>(())
            })
            .unwrap_or_else(|e| panic!("{label}: drain: {e}"));
        }
    }
}

/// The next `n` messages of `rx`, by receiving QP, in order; with `n == 0`, whatever a
/// few polls bring.
fn srq_receive(
    p: &mut CqPoller<'_, 16>,
    rx: &mut SrqRing<'_, 64>,
    n: usize,
) -> std::collections::BTreeMap<u32, Vec<u64>> {
    let mut got = std::collections::BTreeMap::<u32, Vec<u64>>::new();
    let mut count = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut polls = 0;
    while (count < n && std::time::Instant::now() < deadline) || (n == 0 && polls < 100) {
        polls += 1;
        for c in p.poll().unwrap() {
            let qpn = c.qp_num();
            let m = rx.on_completion(c).unwrap();
            let d = rx.data(&m).unwrap();
            got.entry(qpn)
                .or_default()
                .push(u64::from_le_bytes(d[..8].try_into().unwrap()));
            count += 1;
            rx.release(m).unwrap();
        }
        rx.repost().unwrap();
    }
    got
}
