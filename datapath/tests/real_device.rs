//! The datapath on a real RDMA device (rxe in `cargo xtask rxe`, or any mlx5/rxe host):
//! SendRing streaming with batching and selective signaling (inline SEND into a RecvRing,
//! WRITE, WRITE_WITH_IMM, READ, FETCH_AND_ADD, CMP_AND_SWP), ping-pong, send-queue
//! back-pressure, a bad-rkey error with exact slot accounting then QP reset and traffic
//! again, a RecvRing on an SRQ, CqPoller batch draining, and a UD SendRing.
//!
//! The setup layer (`hotverbs`, a dev-dependency only) creates the objects; the datapath
//! gets raw pointers and plain descriptors, as in production.
//!
//! Each test probes for a device and prints "skipped: no RDMA device" when there is none —
//! unless `HOTVERBS_RXE=1` (inside the rxe VM), where a missing device is a failure.
//! Device: `$HOTVERBS_DEVICE` (`rxe0` in the VM; `softnic` runs the suite on the software
//! device, which is how it is developed), else the first real device. GID index:
//! `$HOTVERBS_GID_INDEX` (`1` on rxe), else the RoCE v2 IPv4 GID. The policy is
//! [`hotverbs::testing`]'s.
//!
//! Where rxe departs from the man pages (`/work/shared/rxe-vm/fault-truth.md`), the
//! assertions accept what both rxe and softnic do: error completions carry opcode 0 and
//! byte_len 0 (only `wr_id` and status are relied on), queue sizes are rounded up (the rings
//! use the requested depth, never the rounded one).

use std::time::{Duration, Instant};

use hotverbs::{
    testing, AccessFlags, AhAttr, ConnectOptions, Context, Cq, Endpoint, Mr, Pd, PortInfo, Qp,
    QpBuilder, QpType, DEFAULT_QKEY,
};
use hotverbs_datapath::{
    Completion, CqPoller, Credits, Local, LocalBuf, Msg, PostError, RecvConfig, RecvError,
    RecvRing, RecvTarget, RemoteBuf, SendConfig, SendError, SendRing, UdDest, WcError,
};
use hotverbs_ffi::IBV_WC_RECV;

/// How long a test waits for progress before failing (generous: rxe under TCG is slow).
const T: Duration = Duration::from_secs(20);

/// The device under test, or None (after printing the skip line): the shared probe policy,
/// with `HOTVERBS_DEVICE=softnic` allowed outside the rxe VM.
fn device() -> Option<Context> {
    testing::Probe::new().allow_softnic().open()
}

fn port_info(ctx: &Context) -> PortInfo {
    ctx.port_info(None, testing::gid_index()).unwrap()
}

fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// The bytes of a test MR. The MRs are registered with remote access, so `Mr::as_slice`
/// refuses them; the tests read (and write) them only after every WR touching them has
/// completed and while the peer posts nothing that writes them.
fn bytes<'m>(mr: &'m Mr<'_>) -> &'m [u8] {
    // SAFETY: see above: no device or peer write is in flight when the tests look.
    unsafe { mr.as_slice_unchecked() }
}

/// As [`bytes`], mutably (tests fill a source buffer before posting).
fn bytes_mut<'m>(mr: &'m mut Mr<'_>) -> &'m mut [u8] {
    // SAFETY: as in `bytes`.
    unsafe { mr.as_mut_slice_unchecked() }
}

fn local_of(mr: &Mr<'_>, offset: usize, len: usize) -> LocalBuf {
    let s = mr.local(offset, len).unwrap();
    LocalBuf::new(s.addr, s.length, s.lkey)
}

fn remote_of(mr: &Mr<'_>, offset: u64, len: u64) -> RemoteBuf {
    let r = mr.remote().slice(offset, len).unwrap();
    RemoteBuf::new(r.addr, r.len, r.rkey)
}

/// Two connected RC QPs on one device (A sends, B receives), each with its own CQ and a
/// 64 KiB MR. rxe rounds the queue sizes up to 2^k - 1; the rings use the requested ones.
struct RcPair {
    info: PortInfo,
    cq_a: Cq,
    cq_b: Cq,
    a: Qp,
    b: Qp,
    mr_a: Mr<'static>,
    mr_b: Mr<'static>,
    pd: Pd,
}

const SQ: u32 = 32;
const RQ: u32 = 32;
const INLINE: u32 = 64;

impl RcPair {
    fn new(ctx: &Context) -> Self {
        let info = port_info(ctx);
        let pd = ctx.alloc_pd().unwrap();
        let cq_a = ctx.create_cq(256, None).unwrap();
        let cq_b = ctx.create_cq(256, None).unwrap();
        let build = |cq: &Cq| {
            QpBuilder::new(&pd, cq, cq, QpType::Rc)
                .max_send_wr(SQ)
                .max_recv_wr(RQ)
                .max_inline_data(INLINE)
                .build()
                .unwrap()
        };
        let a = build(&cq_a);
        let b = build(&cq_b);
        Qp::connect_pair(&a, &b, &info, &ConnectOptions::default()).unwrap();
        assert!(a.cap().max_send_wr >= SQ && a.cap().max_inline_data >= INLINE);
        let mr_a = pd.alloc_mr(1 << 16, all_access()).unwrap();
        let mr_b = pd.alloc_mr(1 << 16, all_access()).unwrap();
        RcPair {
            info,
            cq_a,
            cq_b,
            a,
            b,
            mr_a,
            mr_b,
            pd,
        }
    }

    /// Moves both QPs through RESET -> INIT -> RTR -> RTS again.
    fn reconnect(&self) {
        self.a.reset().unwrap();
        self.b.reset().unwrap();
        Qp::connect_pair(&self.a, &self.b, &self.info, &ConnectOptions::default()).unwrap();
    }
}

/// Waits (busy-polling with a deadline) until `done` says so; `step` does one poll round.
fn spin_until(what: &str, mut step: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !step() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::hint::spin_loop();
    }
}

const S: u8 = 1;
const R: u8 = 2;

/// A sender ring + poller on A and a receive ring + poller on B, with credits.
struct Stream<'p> {
    send: Box<SendRing<64>>,
    recv: Box<RecvRing<64>>,
    sp: CqPoller<16>,
    rp: CqPoller<16>,
    credits: Credits,
    returned: u64,
    received: Vec<(u32, Vec<u8>, Option<u32>)>,
    send_completions: u64,
    _pair: &'p RcPair,
}

impl<'p> Stream<'p> {
    /// Send ring: depth SQ, every `k`-th WR signaled, batches of `batch`; remote window:
    /// B's MR from 32 KiB on. Receive ring: RQ slots of 128 B at the start of B's MR.
    fn new(p: &'p RcPair, k: u32, batch: u32) -> Self {
        let cfg = SendConfig::new(S, SQ, p.a.cap().max_inline_data)
            .signal_every(k)
            .batch(batch)
            .remote(remote_of(&p.mr_b, 32 << 10, 32 << 10));
        // SAFETY: the pair (QPs, CQs, MRs) outlives the stream (borrowed for 'p); A's send
        // queue and B's receive queue are used by these rings only, and their completions
        // go to them; the receive region (B's MR, first RQ * 128 bytes) is touched by
        // nothing else.
        unsafe {
            let send = Box::new(SendRing::new(p.a.as_raw(), cfg).unwrap());
            let mut recv = Box::new(
                RecvRing::new(
                    RecvTarget::Qp(p.b.as_raw()),
                    local_of(&p.mr_b, 0, (RQ * 128) as usize),
                    RecvConfig::new(R, 128, RQ).repost_batch(8),
                )
                .unwrap(),
            );
            assert_eq!(recv.fill().unwrap(), RQ as usize);
            Stream {
                send,
                recv,
                sp: CqPoller::new(p.cq_a.as_raw()),
                rp: CqPoller::new(p.cq_b.as_raw()),
                credits: Credits::new(RQ),
                returned: 0,
                received: Vec::new(),
                send_completions: 0,
                _pair: p,
            }
        }
    }

    /// One poll of each CQ: send completions retire WRs, receives are copied out and
    /// released; credits come back for re-posted receives.
    fn poll(&mut self) {
        for c in self.sp.poll().unwrap() {
            assert_eq!(c.ring(), S, "{c:?}");
            self.send.on_completion(c).unwrap();
            self.send_completions += 1;
        }
        for c in self.rp.poll().unwrap() {
            assert_eq!(c.ring(), R, "{c:?}");
            let m = self.recv.on_completion(c).unwrap();
            let data = self.recv.data(&m).unwrap().to_vec();
            self.received.push((m.byte_len(), data, m.imm()));
            self.recv.release(m).unwrap();
        }
        let reposted = self.received.len() as u64 - self.recv.pending() as u64;
        self.credits.grant((reposted - self.returned) as u32);
        self.returned = reposted;
    }

    fn drain_sends(&mut self) {
        spin_until("the send ring to drain", || {
            self.poll();
            self.send.outstanding() == 0
        });
    }
}

fn payload(i: u64) -> [u8; 24] {
    let mut p = [0u8; 24];
    p[..8].copy_from_slice(&i.to_le_bytes());
    p[8..16].copy_from_slice(&(!i).to_le_bytes());
    p[16..].copy_from_slice(b"hotverbs");
    p
}

fn is_signaled<const N: usize>(ring: &SendRing<N>, seq: u64) -> bool {
    ring.slot_wr(seq).send_flags & hotverbs_ffi::IBV_SEND_SIGNALED != 0
}

/// Posts zero-byte RDMA WRITEs until one is signaled, so every earlier WR retires when it
/// completes (the tail of a stream may be unsignaled). While the ring or the provider's
/// queue is full it polls `poller` (a CQ carrying only this ring's completions). Returns
/// the completions it consumed.
fn post_signaled_filler<const N: usize, const B: usize>(
    ring: &mut SendRing<N>,
    poller: &mut CqPoller<B>,
) -> u64 {
    let mut seen = 0;
    let deadline = Instant::now() + T;
    loop {
        assert!(
            Instant::now() < deadline,
            "could not post a signaled filler"
        );
        match ring.send_now(Msg::write(Local::Empty, 0)) {
            Ok(seq) if is_signaled(ring, seq) => return seen,
            Ok(_) => {}
            Err(SendError::WouldBlock) => {}
            Err(SendError::Post(e)) if e.errno == ENOMEM => {}
            Err(e) => panic!("{e}"),
        }
        for c in poller.poll().unwrap() {
            assert_eq!(c.ring(), ring.ring_id(), "{c:?}");
            ring.on_completion(c).unwrap();
            seen += 1;
        }
    }
}

const ENOMEM: i32 = 12;

#[test]
fn dp_stream_inline_send_and_write_batched_selectively_signaled() {
    let Some(ctx) = device() else { return };
    let p = RcPair::new(&ctx);
    const K: u32 = 8;
    let mut s = Stream::new(&p, K, 16);
    const MESSAGES: u64 = 2000;
    let mut sent = 0u64;
    let mut writes = 0u64;
    let mut full_stops = 0u64;
    let mut progress = Progress::new();
    while (s.received.len() as u64) < MESSAGES {
        progress.check(s.received.len() as u64, || {
            format!("stalled at {sent} sent")
        });
        let payloads: Vec<[u8; 24]> = (sent..sent + 16).map(payload).collect();
        let mut b = s.send.batch();
        for pl in &payloads {
            if sent == MESSAGES || !s.credits.try_take() {
                break;
            }
            // Every 4th message is also written inline into slot (i % 64) of the remote
            // window, in the same chain as the SENDs.
            let wrote = if sent % 4 == 3 {
                b.push(Msg::write(Local::Inline(pl), (sent % 64) * 32))
                    .map(|_| writes += 1)
            } else {
                Ok(())
            };
            match wrote.and_then(|()| b.push(Msg::send(Local::Inline(pl)))) {
                Ok(_) => sent += 1,
                Err(SendError::WouldBlock) => {
                    s.credits.grant(1);
                    full_stops += 1;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        b.finish().unwrap();
        assert!(s.send.outstanding() <= SQ as u64, "ring exceeded its depth");
        s.poll();
    }
    // Every message arrived once, in order, intact, read in place from its slot.
    for (i, (len, data, imm)) in s.received.iter().enumerate() {
        assert_eq!((*len, &data[..], *imm), (24, &payload(i as u64)[..], None));
    }
    assert_eq!(s.send.posted_total(), MESSAGES + writes);
    s.send_completions += post_signaled_filler(&mut s.send, &mut s.sp);
    let posted = s.send.posted_total();
    s.drain_sends();
    assert_eq!(s.send.retired_total(), posted);
    // Selective signaling: one completion per K WRs, plus at most one for each time the
    // ring filled (that WR is always signaled) and the filler.
    assert!(s.send_completions >= posted / K as u64);
    assert!(
        s.send_completions <= posted / K as u64 + full_stops + 2,
        "{} completions for {posted} WRs",
        s.send_completions
    );
    // RC WRITEs execute in order: slot j holds the last message i < MESSAGES with
    // i % 64 == j if j % 4 == 3, and nothing otherwise.
    let window = &bytes(&p.mr_b)[32 << 10..];
    for (j, slot) in window[..64 * 32].chunks(32).enumerate() {
        if j % 4 == 3 {
            let last = j as u64 + 64 * ((MESSAGES - 1 - j as u64) / 64);
            assert_eq!(&slot[..24], &payload(last)[..], "window slot {j}");
        } else {
            assert!(slot.iter().all(|&x| x == 0), "window slot {j} written");
        }
    }
    println!(
        "{MESSAGES} SENDs + {writes} WRITEs in {posted} WRs: {} send completions, \
         {full_stops} ring-full stops",
        s.send_completions
    );
}

#[test]
fn dp_zero_copy_write_write_imm_read_and_atomics_in_one_chain() {
    let Some(ctx) = device() else { return };
    let mut p = RcPair::new(&ctx);
    // Local layout in A's MR: 0..512 WRITE source, 1024..1536 READ destination,
    // 2048/2056 atomic results. Remote (B's MR from 32 KiB): 0..512 WRITE target,
    // 1024..1124 WRITE_WITH_IMM target, 4096 the atomic word.
    for (i, b) in bytes_mut(&mut p.mr_a)[..512].iter_mut().enumerate() {
        *b = (i * 7 + 1) as u8;
    }
    bytes_mut(&mut p.mr_b)[(32 << 10) + 4096..(32 << 10) + 4104]
        .copy_from_slice(&40u64.to_ne_bytes());
    let mut s = Stream::new(&p, 4, 4);
    let src = local_of(&p.mr_a, 0, 512);
    let imm_src = local_of(&p.mr_a, 0, 100);
    let read_dst = local_of(&p.mr_a, 1024, 512);
    let faa_dst = local_of(&p.mr_a, 2048, 8);
    let cas_dst = local_of(&p.mr_a, 2056, 8);
    // First chain: WRITE (zero-copy, 512 B > max_inline), WRITE_WITH_IMM, READ back what
    // the WRITE wrote, FETCH_AND_ADD. Batch 4 = one doorbell; only the 4th is signaled and
    // its completion retires all four.
    let seqs: Vec<u64> = [
        Msg::write(Local::Buf(src), 0),
        Msg::write_imm(Local::Buf(imm_src), 1024, 0xC0FFEE),
        Msg::read(read_dst, 0),
        Msg::fetch_add(faa_dst, 4096, 2),
    ]
    .into_iter()
    // SAFETY: the source and destination ranges of A's MR are not touched until
    // `is_retired` says so (checked below before reading them).
    .map(|m| unsafe { s.send.stage(m) }.unwrap())
    .collect();
    assert_eq!(s.send.staged(), 0, "batch of 4 flushed itself");
    assert_eq!(
        seqs.iter()
            .map(|&q| is_signaled(&s.send, q))
            .collect::<Vec<_>>(),
        [false, false, false, true]
    );
    spin_until("the first chain to retire", || {
        s.poll();
        s.send.is_retired(seqs[3])
    });
    assert_eq!(s.send_completions, 1, "one completion retired four WRs");
    assert!(seqs.iter().all(|&q| s.send.is_retired(q)));
    let remote = &bytes(&p.mr_b)[32 << 10..];
    assert_eq!(&remote[..512], &bytes(&p.mr_a)[..512]);
    assert_eq!(&remote[1024..1124], &bytes(&p.mr_a)[..100]);
    assert_eq!(&bytes(&p.mr_a)[1024..1536], &bytes(&p.mr_a)[..512]);
    assert_eq!(
        u64::from_ne_bytes(bytes(&p.mr_a)[2048..2056].try_into().unwrap()),
        40
    );
    assert_eq!(
        u64::from_ne_bytes(remote[4096..4104].try_into().unwrap()),
        42
    );
    // WRITE_WITH_IMM consumed one receive: byte_len is the write length, the slot is empty.
    spin_until("the WRITE_WITH_IMM receive", || {
        s.poll();
        !s.received.is_empty()
    });
    assert_eq!(s.received, [(100, Vec::new(), Some(0xC0FFEE))]);
    // Second chain: CMP_AND_SWP that fails (compare 40), one that succeeds (compare 42),
    // and two inline SENDs; the last one is signaled.
    let seqs: Vec<u64> = [
        Msg::cmp_swap(cas_dst, 4096, 40, 7),
        Msg::cmp_swap(faa_dst, 4096, 42, 77),
        Msg::send(Local::Inline(b"after-atomics")),
        Msg::send_imm(Local::Empty, 5),
    ]
    .into_iter()
    // SAFETY: as above.
    .map(|m| unsafe { s.send.stage(m) }.unwrap())
    .collect();
    spin_until("the second chain", || {
        s.poll();
        s.send.is_retired(seqs[3]) && s.received.len() == 3
    });
    assert_eq!(s.send_completions, 2);
    assert_eq!(
        u64::from_ne_bytes(bytes(&p.mr_a)[2056..2064].try_into().unwrap()),
        42,
        "failed CAS returns the current value"
    );
    assert_eq!(
        u64::from_ne_bytes(bytes(&p.mr_a)[2048..2056].try_into().unwrap()),
        42
    );
    let remote = &bytes(&p.mr_b)[32 << 10..];
    assert_eq!(
        u64::from_ne_bytes(remote[4096..4104].try_into().unwrap()),
        77
    );
    assert_eq!(s.received[1], (13, b"after-atomics".to_vec(), None));
    assert_eq!(s.received[2], (0, Vec::new(), Some(5)));
}

#[test]
fn dp_ping_pong_send_now_both_directions() {
    let Some(ctx) = device() else { return };
    let p = RcPair::new(&ctx);
    // A: send ring 1, receive ring 2 on CQ A; B: send ring 3, receive ring 4 on CQ B.
    let region_a = local_of(&p.mr_a, 0, 16 * 64);
    let region_b = local_of(&p.mr_b, 0, 16 * 64);
    let inline = p.a.cap().max_inline_data;
    // SAFETY: the pair outlives the rings; each queue is used by one ring; the receive
    // regions are touched by nothing else.
    let (mut sa, mut ra, mut sb, mut rb, mut pa, mut pb) = unsafe {
        let sa: SendRing<16> =
            SendRing::new(p.a.as_raw(), SendConfig::new(1, 16, inline).signal_every(8)).unwrap();
        let sb: SendRing<16> =
            SendRing::new(p.b.as_raw(), SendConfig::new(3, 16, inline).signal_every(8)).unwrap();
        let mut ra: RecvRing<16> = RecvRing::new(
            RecvTarget::Qp(p.a.as_raw()),
            region_a,
            RecvConfig::new(2, 64, 16).repost_batch(1),
        )
        .unwrap();
        let mut rb: RecvRing<16> = RecvRing::new(
            RecvTarget::Qp(p.b.as_raw()),
            region_b,
            RecvConfig::new(4, 64, 16).repost_batch(1),
        )
        .unwrap();
        ra.fill().unwrap();
        rb.fill().unwrap();
        (
            sa,
            ra,
            sb,
            rb,
            CqPoller::<8>::new(p.cq_a.as_raw()),
            CqPoller::<8>::new(p.cq_b.as_raw()),
        )
    };
    const ROUNDS: u64 = 500;
    let start = Instant::now();
    for i in 0..ROUNDS {
        let ping = payload(i);
        sa.send_now(Msg::send(Local::Inline(&ping))).unwrap();
        // B: wait for the ping, answer with its bytes reversed.
        let mut got = None;
        spin_until("ping", || {
            for c in pb.poll().unwrap() {
                match c.ring() {
                    3 => {
                        sb.on_completion(c).unwrap();
                    }
                    4 => {
                        let m = rb.on_completion(c).unwrap();
                        got = Some(rb.data(&m).unwrap().to_vec());
                        rb.release(m).unwrap();
                    }
                    r => panic!("ring {r} on B's CQ"),
                }
            }
            got.is_some()
        });
        let mut pong = got.unwrap();
        assert_eq!(pong, ping);
        pong.reverse();
        sb.send_now(Msg::send(Local::Inline(&pong))).unwrap();
        let mut back = None;
        spin_until("pong", || {
            for c in pa.poll().unwrap() {
                match c.ring() {
                    1 => {
                        sa.on_completion(c).unwrap();
                    }
                    2 => {
                        let m = ra.on_completion(c).unwrap();
                        back = Some(ra.data(&m).unwrap().to_vec());
                        ra.release(m).unwrap();
                    }
                    r => panic!("ring {r} on A's CQ"),
                }
            }
            back.is_some()
        });
        assert_eq!(back.unwrap(), pong);
        assert!(sa.outstanding() <= 16 && sb.outstanding() <= 16);
    }
    // Selective signaling kept both send rings flowing: 500 WRs each, one completion per 8
    // (WR 495 is the last signaled one: everything up to it retires).
    assert_eq!((sa.posted_total(), sb.posted_total()), (ROUNDS, ROUNDS));
    let last_signaled = ROUNDS - ROUNDS % 8;
    spin_until("the last signaled WRs", || {
        for c in pa.poll().unwrap() {
            assert_eq!(c.ring(), 1, "{c:?}");
            sa.on_completion(c).unwrap();
        }
        for c in pb.poll().unwrap() {
            assert_eq!(c.ring(), 3, "{c:?}");
            sb.on_completion(c).unwrap();
        }
        sa.retired_total() == last_signaled && sb.retired_total() == last_signaled
    });
    assert_eq!(
        (ra.held(), rb.held(), ra.posted(), rb.posted()),
        (0, 0, 16, 16)
    );
    println!(
        "{ROUNDS} round trips, {:.1} us each",
        start.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64
    );
}

#[test]
fn dp_back_pressure_ring_full_and_provider_queue_full() {
    let Some(ctx) = device() else { return };
    let p = RcPair::new(&ctx);
    // Ring level: depth 16, every 5th WR signaled. Zero-byte WRITEs, never polled, until
    // the ring refuses: exactly 16 go out, the 16th is signaled because it fills the ring.
    let cfg = SendConfig::new(1, 16, 0)
        .signal_every(5)
        .batch(4)
        .remote(remote_of(&p.mr_b, 0, 64));
    // SAFETY: the pair outlives the ring; A's send queue and CQ serve this ring only.
    let (mut ring, mut poller) = unsafe {
        (
            SendRing::<16>::new(p.a.as_raw(), cfg).unwrap(),
            CqPoller::<1>::new(p.cq_a.as_raw()),
        )
    };
    let mut accepted = Vec::new();
    loop {
        // SAFETY: a zero-byte message borrows nothing.
        match unsafe { ring.stage(Msg::write(Local::Empty, 0)) } {
            Ok(seq) => accepted.push(seq),
            Err(SendError::WouldBlock) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(accepted, (0..16).collect::<Vec<u64>>());
    assert_eq!((ring.outstanding(), ring.staged(), ring.free()), (16, 0, 0));
    assert!(ring.signaled_in_flight());
    assert_eq!(
        ring.send_now(Msg::write(Local::Empty, 0)),
        Err(SendError::WouldBlock)
    );
    // Signaled: 4, 9, 14 (every 5th) and 15 (filled the ring). Each completion retires
    // itself and every WR before it.
    let mut retired = Vec::new();
    spin_until("the full ring to drain", || {
        for c in poller.poll().unwrap() {
            retired.push((c.seq(), ring.on_completion(c).unwrap()));
        }
        ring.outstanding() == 0
    });
    assert_eq!(retired, [(4, 5), (9, 5), (14, 5), (15, 1)]);
    assert_eq!(ring.free(), 16);

    // Provider level: a QP whose send queue is smaller than the ring (a contract breach
    // the ring must still account for exactly). One chain of 16: the provider takes the
    // WRs it has room for and rejects the rest with ENOMEM; the ring keeps the accepted
    // ones outstanding and frees the rejected slots; retrying after completions gets all
    // 16 through.
    let small = QpBuilder::new(&p.pd, &p.cq_a, &p.cq_a, QpType::Rc)
        .max_send_wr(4)
        .max_recv_wr(4)
        .build()
        .unwrap();
    let small_peer = QpBuilder::new(&p.pd, &p.cq_b, &p.cq_b, QpType::Rc)
        .max_send_wr(4)
        .max_recv_wr(4)
        .build()
        .unwrap();
    Qp::connect_pair(&small, &small_peer, &p.info, &ConnectOptions::default()).unwrap();
    let cfg = SendConfig::new(2, 16, 0)
        .signal_every(8)
        .batch(16)
        .remote(remote_of(&p.mr_b, 0, 64));
    // SAFETY: as above (this ring breaches only the depth part of the contract, on
    // purpose; the provider's ENOMEM is the expected outcome).
    let mut ring: SendRing<16> = unsafe { SendRing::new(small.as_raw(), cfg) }.unwrap();
    let mut b = ring.batch();
    let mut first_err = None;
    for _ in 0..16 {
        match b.push(Msg::write(Local::Empty, 0)) {
            Ok(_) => {}
            Err(SendError::Post(e)) => {
                first_err = Some(e);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    drop(b);
    let e = first_err.expect("a 16-WR chain on a 4-WR send queue was accepted whole");
    assert_eq!(e.errno, ENOMEM, "{e}");
    let k = e.first_rejected as u64;
    assert!((4..16).contains(&k), "{e}");
    assert_eq!(e.first_rejected_seq, k);
    assert_eq!((ring.posted_total(), ring.staged()), (k, 0));
    assert_eq!(ring.free(), 16 - k);
    println!("provider took {k} of 16 WRs: {e}");
    // The accepted WRs are all unsignaled (the first signaled one is seq 7; softnic takes
    // 4 WRs, rxe 7 — its 4-WR queue has 7 slots): a provider that frees send-queue slots
    // only when a later completion is polled (softnic, as mlx5) can never complete them,
    // so the way out is the reset path. RESET discards them; `reset` reports exactly the
    // k WRs that never retired; a ring no deeper than the queue then works on the same QP.
    assert!(!(0..k).any(|q| is_signaled(&ring, q)));
    Qp::connect_pair(&small, &small_peer, &p.info, &ConnectOptions::default()).unwrap();
    // SAFETY: the QP went through RESET (reconnect / connect_pair): none of the ring's WRs is posted.
    assert_eq!(unsafe { ring.reset() }, k);
    assert_eq!((ring.outstanding(), ring.free()), (0, 16));
    let depth = small.cap().max_send_wr.min(16);
    let cfg = SendConfig::new(3, depth, 0)
        .signal_every((depth / 2).max(1))
        .remote(remote_of(&p.mr_b, 0, 64));
    // SAFETY: as above, now within the queue's depth.
    let mut ring: SendRing<16> = unsafe { SendRing::new(small.as_raw(), cfg) }.unwrap();
    let deadline = Instant::now() + T;
    while ring.posted_total() < 64 {
        assert!(Instant::now() < deadline, "no progress on the small queue");
        match ring.send_now(Msg::write(Local::Empty, 0)) {
            Ok(_) | Err(SendError::WouldBlock) => {}
            Err(e) => panic!("{e}"),
        }
        for c in poller.poll().unwrap() {
            assert_eq!(c.ring(), 3, "{c:?}");
            ring.on_completion(c).unwrap();
        }
        assert!(ring.outstanding() <= depth as u64);
    }
    post_signaled_filler(&mut ring, &mut poller);
    spin_until("the small queue to drain", || {
        for c in poller.poll().unwrap() {
            assert_eq!(c.ring(), 3, "{c:?}");
            ring.on_completion(c).unwrap();
        }
        ring.outstanding() == 0
    });
    assert_eq!(ring.retired_total(), ring.posted_total());
    assert!(ring.error().is_none());
}

/// Classifies one send completion of `ring`: (seq, status, WRs retired).
fn send_event<const N: usize>(
    ring: &mut SendRing<N>,
    c: &Completion,
) -> (u64, Result<(), WcError>, u64) {
    let seq = c.seq();
    match ring.on_completion(c) {
        Ok(n) => (seq, Ok(()), n),
        Err(e) => (seq, Err(e), ring.retired_total()),
    }
}

#[test]
fn dp_bad_rkey_exact_slot_accounting_then_reset_and_traffic_again() {
    let Some(ctx) = device() else { return };
    let p = RcPair::new(&ctx);
    let good = remote_of(&p.mr_b, 32 << 10, 4096);
    // An rkey that names no MR (high bits changed: another MR index on every provider).
    let bad = RemoteBuf::new(good.addr, good.len, good.rkey ^ 0x5a00_0000);
    let cfg = SendConfig::new(S, SQ, p.a.cap().max_inline_data)
        .signal_every(4)
        .batch(8)
        .remote(bad);
    let mut s = Stream::new(&p, 4, 8);
    // SAFETY: replaces the stream's ring on the same QP (the old one had posted nothing).
    *s.send = unsafe { SendRing::new(p.a.as_raw(), cfg) }.unwrap();

    // Round 1: one chain [SEND, SEND, SEND, WRITE(bad rkey, signaled), SEND x4].
    let msgs: Vec<[u8; 24]> = (0..8).map(payload).collect();
    let mut b = s.send.batch();
    for (i, m) in msgs.iter().enumerate() {
        let msg = if i == 3 {
            Msg::write(Local::Inline(m), 0)
        } else {
            Msg::send(Local::Inline(m))
        };
        b.push(msg).unwrap();
    }
    b.finish().unwrap();
    assert_eq!(s.send.posted_total(), 8);
    // A: the WRITE fails with REM_ACCESS_ERR and retires WRs 0..=3 (the three SENDs before
    // it succeeded unsignaled); WRs 4..=7 are flushed one by one, signaled or not. On rxe
    // these completions carry opcode 0 and byte_len 0; only wr_id and status are used.
    let mut events = Vec::new();
    let mut recv_errors = Vec::new();
    let mut recv_ok = Vec::new();
    spin_until("the error and its flushes", || {
        for c in s.sp.poll().unwrap() {
            events.push(send_event(&mut s.send, c));
        }
        for c in s.rp.poll().unwrap() {
            match s.recv.on_completion(c) {
                Ok(m) => {
                    recv_ok.push(s.recv.data(&m).unwrap().to_vec());
                    s.recv.release(m).unwrap();
                }
                Err(RecvError::Completion { error, .. }) => recv_errors.push(error),
                Err(e) => panic!("{e}"),
            }
        }
        s.send.outstanding() == 0 && recv_ok.len() + recv_errors.len() == RQ as usize
    });
    let flush = Err(WcError::WrFlush);
    assert_eq!(
        events,
        [
            (3, Err(WcError::RemAccess), 4),
            (4, flush, 5),
            (5, flush, 6),
            (6, flush, 7),
            (7, flush, 8),
        ]
    );
    assert_eq!(s.send.retired_total(), 8, "every slot accounted for");
    assert_eq!(s.send.error(), Some(WcError::RemAccess));
    assert_eq!(s.send.free(), 0);
    assert_eq!(
        s.send.send_now(Msg::send(Local::Inline(b"x"))),
        Err(SendError::QpError(WcError::RemAccess))
    );
    // B got the three SENDs before the bad WRITE; the responder then went to the error
    // state (rxe, and the IBA for a remote access error) and flushed its other receives.
    assert_eq!(
        recv_ok,
        msgs[..3].iter().map(|m| m.to_vec()).collect::<Vec<_>>()
    );
    assert!(recv_errors.iter().all(|&e| e == WcError::WrFlush));
    assert_eq!(s.recv.posted(), 0);

    // Reset: both QPs to RESET, the rings forget, RESET -> INIT -> RTR -> RTS, re-post.
    p.reconnect();
    // SAFETY: the QP went through RESET (reconnect / connect_pair): none of the ring's WRs is posted.
    assert_eq!(unsafe { s.send.reset() }, 0, "nothing was left outstanding");
    // SAFETY: the QP went through RESET (reconnect / connect_pair): none of the ring's WRs is posted.
    let marked = unsafe { s.recv.reset() };
    assert_eq!(marked, RQ as usize - s.recv.held() as usize);
    assert_eq!(s.recv.repost().unwrap(), RQ as usize);
    assert_eq!(s.send.free(), SQ as u64);

    // Round 2: the same failure, but the QPs are reset as soon as the error is seen
    // (a poller of one completion at a time): the four flushed WRs never complete for the
    // ring, `reset` reports them, and any flush completions still in the CQs afterwards
    // are recognised as stale.
    let base = s.send.posted_total();
    let mut b = s.send.batch();
    for (i, m) in msgs.iter().enumerate() {
        b.push(if i == 3 {
            Msg::write(Local::Inline(m), 0)
        } else {
            Msg::send(Local::Inline(m))
        })
        .unwrap();
    }
    b.finish().unwrap();
    // SAFETY: A's CQ outlives the poller, which replaces the stream's one for a while.
    let mut one = unsafe { CqPoller::<1>::new(p.cq_a.as_raw()) };
    let mut first = None;
    spin_until("the second error", || {
        if let Some(c) = one.poll().unwrap().first() {
            first = Some(send_event(&mut s.send, c));
        }
        first.is_some()
    });
    assert_eq!(first, Some((base + 3, Err(WcError::RemAccess), base + 4)));
    p.reconnect();
    // SAFETY: the QP went through RESET (reconnect / connect_pair): none of the ring's WRs is posted.
    let dropped = unsafe { s.send.reset() };
    assert_eq!(dropped, 4, "WRs 4..=7 of the chain never completed");
    assert_eq!(s.send.outstanding(), 0);
    // SAFETY: the QP went through RESET (reconnect / connect_pair): none of the ring's WRs is posted.
    let marked = unsafe { s.recv.reset() };
    assert_eq!(marked + s.recv.held() as usize, RQ as usize);
    // Whatever the CQs still hold from before the reset is stale for both rings.
    let mut stale = 0;
    for c in std::iter::from_fn(|| one.poll().unwrap().first().map(dup)) {
        assert_eq!(s.send.on_completion(&c), Ok(0), "{c:?}");
        stale += 1;
    }
    for mut c in std::iter::from_fn(|| s.rp.poll().unwrap().first().map(dup)) {
        match s.recv.on_completion(&mut c) {
            Err(RecvError::Stale { .. }) => stale += 1,
            // Receives completed before the error (the three SENDs).
            Ok(m) => panic!("message after reset: {m:?}"),
            Err(e) => panic!("{e}"),
        }
    }
    println!("round 2: {stale} stale completions after the reset");
    s.recv.repost().unwrap();
    assert_eq!(s.recv.posted(), RQ);

    // Traffic again: 100 SENDs arrive intact, the ring drains to zero.
    s.received.clear();
    s.credits = Credits::new(RQ);
    s.returned = 0;
    let mut sent = 0u64;
    let deadline = Instant::now() + T;
    while (s.received.len() as u64) < 100 {
        assert!(Instant::now() < deadline, "no traffic after reset");
        if sent < 100 && s.credits.try_take() {
            let m = payload(1000 + sent);
            match s.send.send_now(Msg::send(Local::Inline(&m))) {
                Ok(_) => sent += 1,
                Err(SendError::WouldBlock) => s.credits.grant(1),
                Err(e) => panic!("{e}"),
            }
        }
        s.poll();
    }
    for (i, (_, data, _)) in s.received.iter().enumerate() {
        assert_eq!(&data[..], &payload(1000 + i as u64)[..]);
    }
    assert!(s.send.error().is_none());
}

#[test]
fn dp_recv_ring_on_an_srq_shared_by_two_qps() {
    let Some(ctx) = device() else { return };
    let info = port_info(&ctx);
    let pd = ctx.alloc_pd().unwrap();
    let scq = ctx.create_cq(256, None).unwrap();
    let rcq = ctx.create_cq(256, None).unwrap();
    const SLOTS: u32 = 32;
    let srq = pd.create_srq(SLOTS, 1).unwrap();
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..2 {
        let r = QpBuilder::new(&pd, &rcq, &rcq, QpType::Rc)
            .srq(&srq)
            .build()
            .unwrap();
        let s = QpBuilder::new(&pd, &scq, &scq, QpType::Rc)
            .max_send_wr(16)
            .max_inline_data(INLINE)
            .build()
            .unwrap();
        Qp::connect_pair(&s, &r, &info, &ConnectOptions::default()).unwrap();
        senders.push(s);
        receivers.push(r);
    }
    let mr = pd
        .alloc_mr(SLOTS as usize * 64, AccessFlags::LOCAL_WRITE)
        .unwrap();
    // Rings 1 and 2 send (one per sender QP); ring 9 receives on the SRQ.
    // SAFETY: the QPs, SRQ, CQs and MR outlive the rings; each queue is used by one ring;
    // the MR is touched by the receive ring only.
    let (mut rings, mut recv, mut sp, mut rp) = unsafe {
        let rings: Vec<SendRing<16>> = senders
            .iter()
            .enumerate()
            .map(|(i, q)| {
                SendRing::new(
                    q.as_raw(),
                    SendConfig::new(1 + i as u8, 16, q.cap().max_inline_data).signal_every(4),
                )
                .unwrap()
            })
            .collect();
        let mut recv: RecvRing<64> = RecvRing::new(
            RecvTarget::Srq(srq.as_raw()),
            local_of(&mr, 0, SLOTS as usize * 64),
            RecvConfig::new(9, 64, SLOTS).repost_batch(4),
        )
        .unwrap();
        assert_eq!(recv.fill().unwrap(), SLOTS as usize);
        (
            rings,
            recv,
            CqPoller::<16>::new(scq.as_raw()),
            CqPoller::<16>::new(rcq.as_raw()),
        )
    };
    // Both senders share the SRQ's receives: one credit pool for both.
    const PER_SENDER: u64 = 300;
    let mut credits = Credits::new(SLOTS);
    let mut sent = [0u64; 2];
    let mut got: Vec<(u32, [u8; 24])> = Vec::new();
    let mut returned = 0u64;
    let mut progress = Progress::new();
    while (got.len() as u64) < 2 * PER_SENDER {
        progress.check(got.len() as u64, || {
            format!("stalled: {sent:?} sent, {} got", got.len())
        });
        for (i, ring) in rings.iter_mut().enumerate() {
            if sent[i] < PER_SENDER && credits.try_take() {
                let mut m = payload(sent[i]);
                m[16] = b'0' + i as u8;
                match ring.send_now(Msg::send(Local::Inline(&m))) {
                    Ok(_) => sent[i] += 1,
                    Err(SendError::WouldBlock) => credits.grant(1),
                    Err(e) => panic!("{e}"),
                }
            }
        }
        for c in sp.poll().unwrap() {
            let r = c.ring() as usize;
            assert!(r == 1 || r == 2, "{c:?}");
            rings[r - 1].on_completion(c).unwrap();
        }
        for c in rp.poll().unwrap() {
            assert_eq!(c.ring(), 9, "{c:?}");
            let qpn = c.qp_num();
            let m = recv.on_completion(c).unwrap();
            got.push((qpn, recv.data(&m).unwrap().try_into().unwrap()));
            recv.release(m).unwrap();
        }
        let reposted = got.len() as u64 - recv.pending() as u64;
        credits.grant((reposted - returned) as u32);
        returned = reposted;
    }
    // Each sender's messages arrived in order, on its own receiver QP, through the SRQ.
    for (i, receiver) in receivers.iter().enumerate() {
        let mine: Vec<&(u32, [u8; 24])> = got
            .iter()
            .filter(|(_, m)| m[16] == b'0' + i as u8)
            .collect();
        assert_eq!(mine.len() as u64, PER_SENDER);
        for (n, (qpn, m)) in mine.into_iter().enumerate() {
            assert_eq!(*qpn, receiver.qp_num());
            assert_eq!(m[..16], payload(n as u64)[..16]);
        }
    }
    assert_eq!(recv.posted() + recv.pending(), SLOTS);
}

#[test]
fn dp_cq_poller_drains_in_batches_of_b() {
    let Some(ctx) = device() else { return };
    let p = RcPair::new(&ctx);
    // Every WR signaled, 32 SENDs: A gets 32 completions and B 32 receives.
    let mut s = Stream::new(&p, 1, 8);
    let msgs: Vec<[u8; 24]> = (0..RQ as u64).map(payload).collect();
    let mut b = s.send.batch();
    for m in &msgs {
        b.push(Msg::send(Local::Inline(m))).unwrap();
    }
    b.finish().unwrap();
    // A's completions, drained with a poller of 8: never more than 8 per poll_cq.
    // SAFETY: A's CQ outlives the poller; the stream's pollers are not used meanwhile.
    let mut pa = unsafe { CqPoller::<8>::new(p.cq_a.as_raw()) };
    let mut sizes = Vec::new();
    let mut seqs = Vec::new();
    spin_until("32 send completions", || {
        let batch = pa.poll().unwrap();
        if !batch.is_empty() {
            sizes.push(batch.len());
        }
        for c in batch {
            seqs.push(c.seq());
            assert_eq!(s.send.on_completion(c), Ok(1));
        }
        seqs.len() == 32
    });
    assert!(sizes.iter().all(|&n| (1..=8).contains(&n)), "{sizes:?}");
    assert_eq!(seqs, (0..32).collect::<Vec<u64>>());
    // Each send completed after its receive completion was written (the ACK follows the
    // responder's completion), so all 32 receives are waiting in B's CQ now: polls of 8
    // return exactly 8, 8, 8, 8, then nothing.
    // SAFETY: as above, for B's CQ.
    let mut pb = unsafe { CqPoller::<8>::new(p.cq_b.as_raw()) };
    let mut sizes = Vec::new();
    let mut data = Vec::new();
    for _ in 0..5 {
        let n = pb
            .drain(|c| {
                let m = s.recv.on_completion(c).unwrap();
                data.push(s.recv.data(&m).unwrap().to_vec());
                s.recv.release(m).unwrap();
            })
            .unwrap();
        sizes.push(n);
    }
    assert_eq!(sizes, [8, 8, 8, 8, 0]);
    assert_eq!(data, msgs.iter().map(|m| m.to_vec()).collect::<Vec<_>>());
    // poll_spin returns empty after its poll budget when nothing comes.
    assert!(pb.poll_spin(1000).unwrap().is_empty());
    assert_eq!(s.recv.posted(), RQ);
}

#[test]
fn dp_ud_send_ring_with_batching() {
    let Some(ctx) = device() else { return };
    let info = port_info(&ctx);
    let pd = ctx.alloc_pd().unwrap();
    let cq_a = ctx.create_cq(256, None).unwrap();
    let cq_b = ctx.create_cq(256, None).unwrap();
    let a = QpBuilder::new(&pd, &cq_a, &cq_a, QpType::Ud)
        .max_send_wr(32)
        .max_inline_data(INLINE)
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
    const SLOT: u32 = 40 + 64;
    let mr = pd
        .alloc_mr(32 * SLOT as usize, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let dest = UdDest {
        ah: ah.as_raw(),
        remote_qpn: b.qp_num(),
        remote_qkey: DEFAULT_QKEY,
    };
    // SAFETY: the QPs, AH, CQs and MR outlive the rings; one ring per queue; the MR is
    // touched by the receive ring only.
    let (mut send, mut recv, mut sp, mut rp) = unsafe {
        let send: SendRing<32> = SendRing::new(
            a.as_raw(),
            SendConfig::new(1, 32, a.cap().max_inline_data)
                .signal_every(8)
                .batch(8)
                .ud(dest),
        )
        .unwrap();
        let mut recv: RecvRing<32> = RecvRing::new(
            RecvTarget::Qp(b.as_raw()),
            local_of(&mr, 0, 32 * SLOT as usize),
            RecvConfig::new(2, SLOT, 32).repost_batch(8),
        )
        .unwrap();
        recv.fill().unwrap();
        (
            send,
            recv,
            CqPoller::<16>::new(cq_a.as_raw()),
            CqPoller::<16>::new(cq_b.as_raw()),
        )
    };
    const MESSAGES: u64 = 400;
    let mut credits = Credits::new(32);
    let mut returned = 0u64;
    let mut sent = 0u64;
    let mut got = Vec::new();
    let mut progress = Progress::new();
    while (got.len() as u64) < MESSAGES {
        progress.check(got.len() as u64, || {
            format!("stalled: {sent} sent, {} got", got.len())
        });
        let payloads: Vec<[u8; 24]> = (sent..sent + 8).map(payload).collect();
        let mut batch = send.batch();
        for m in &payloads {
            if sent == MESSAGES || !credits.try_take() {
                break;
            }
            match batch.push(Msg::send(Local::Inline(m))) {
                Ok(_) => sent += 1,
                Err(SendError::WouldBlock) => {
                    credits.grant(1);
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        batch.finish().unwrap();
        for c in sp.poll().unwrap() {
            assert_eq!(c.ring(), 1, "{c:?}");
            send.on_completion(c).unwrap();
        }
        for c in rp.poll().unwrap() {
            assert_eq!(c.ring(), 2, "{c:?}");
            assert_eq!(c.opcode(), IBV_WC_RECV);
            let m = recv.on_completion(c).unwrap();
            // UD: a 40-byte GRH area, then the payload.
            assert_eq!(m.byte_len(), 40 + 24);
            assert_eq!(m.src_qp(), a.qp_num());
            got.push(recv.data(&m).unwrap()[40..].to_vec());
            recv.release(m).unwrap();
        }
        let reposted = got.len() as u64 - recv.pending() as u64;
        credits.grant((reposted - returned) as u32);
        returned = reposted;
    }
    got.sort();
    let mut want: Vec<Vec<u8>> = (0..MESSAGES).map(|i| payload(i).to_vec()).collect();
    want.sort();
    assert_eq!(got, want, "every datagram arrived once");
    spin_until("the UD ring to retire", || {
        for c in sp.poll().unwrap() {
            send.on_completion(c).unwrap();
        }
        send.retired_total() == MESSAGES - MESSAGES % 8
    });
}

#[test]
fn dp_post_before_rts_is_refused_and_reset_discards_what_rxe_queued_anyway() {
    let Some(ctx) = device() else { return };
    let p = RcPair::new(&ctx);
    // A back in INIT: posting is not allowed. rxe returns EINVAL with bad_wr NULL but
    // queues the WR anyway (fault-truth S1): the ring cannot know what the device took, so
    // it keeps the chain outstanding (first_rejected = PostError::UNKNOWN) and refuses new
    // WRs until the QP was reset. A provider that names the rejected WR frees the slot.
    p.a.reset().unwrap();
    p.a.to_init(&hotverbs::InitAttr {
        port: p.info.port,
        ..Default::default()
    })
    .unwrap();
    let mut s = Stream::new(&p, 1, 1);
    let e = match s.send.send_now(Msg::send(Local::Inline(b"too early"))) {
        Err(SendError::Post(e)) => e,
        other => panic!("post in INIT: {other:?}"),
    };
    assert_eq!((e.errno, e.first_rejected_seq), (22, 0), "{e}");
    let unknown = e.first_rejected == PostError::UNKNOWN;
    if unknown {
        assert_eq!((s.send.posted_total(), s.send.free()), (1, 0), "{e}");
        assert_eq!(
            s.send.send_now(Msg::send(Local::Inline(b"still early"))),
            Err(SendError::Post(e)),
            "refused until reset"
        );
    } else {
        assert_eq!(e.first_rejected, 0, "{e}");
        assert_eq!((s.send.posted_total(), s.send.free()), (0, SQ as u64));
    }
    // Recovery: RESET (which also discards a WR the provider queued despite the error),
    // then connect. Only the messages posted after that arrive.
    p.reconnect();
    // SAFETY: the QP went through RESET (reconnect / connect_pair): none of the ring's WRs is posted.
    assert_eq!(unsafe { s.send.reset() }, unknown as u64);
    // SAFETY: the QP went through RESET (reconnect / connect_pair): none of the ring's WRs is posted.
    unsafe { s.recv.reset() };
    s.recv.repost().unwrap();
    for m in [&b"first"[..], b"second"] {
        s.send.send_now(Msg::send(Local::Inline(m))).unwrap();
    }
    spin_until("both messages", || {
        s.poll();
        s.send.outstanding() == 0 && s.received.len() >= 2
    });
    // Make sure nothing else is on its way: one more signaled round trip.
    s.send.send_now(Msg::send(Local::Inline(b"third"))).unwrap();
    spin_until("the third", || {
        s.poll();
        s.send.outstanding() == 0 && s.received.len() >= 3
    });
    let got: Vec<&[u8]> = s.received.iter().map(|(_, d, _)| &d[..]).collect();
    assert_eq!(got, [&b"first"[..], b"second", b"third"]);
}

/// A copy of a polled completion (the loops above take one at a time out of the poller).
fn dup(c: &Completion) -> Completion {
    // SAFETY: `c` came from ibv_poll_cq and each copy is given to a ring once.
    unsafe { Completion::from_raw(*c.as_raw()) }
}

/// A stall detector for long transfers: fails only when the count has not grown for `T`
/// (a slow, loaded VM may take long in total; what must not happen is no progress at all).
struct Progress {
    at: Instant,
    seen: u64,
}

impl Progress {
    fn new() -> Self {
        Progress {
            at: Instant::now(),
            seen: 0,
        }
    }

    fn check(&mut self, count: u64, what: impl FnOnce() -> String) {
        if count != self.seen {
            self.seen = count;
            self.at = Instant::now();
        }
        assert!(self.at.elapsed() < T, "{}", what());
    }
}
