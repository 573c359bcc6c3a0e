//! Zero allocations in the steady-state hot loop: a counting global allocator, armed on the
//! test thread right after setup (no warm-up), sees one million messages go through SendRing (batched inline
//! SENDs), RecvRing (read in place, release, chained re-post) and CqPoller — on the counting
//! device and on softnic — and must count zero allocations.

mod common;

use hotverbs_datapath::*;
use hotverbs_ffi::IBV_WC_EX_WITH_QP_NUM;
use hotverbs_softnic::counting::CountingDevice;
// Counts allocations per armed thread (tests run on parallel threads).
use hotverbs_softnic::testing::CountingAlloc;

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const MESSAGES: u64 = 1_000_000;
const S: u8 = 1;
const R: u8 = 2;

/// The hot loop: send `MESSAGES` inline messages in batches (with credits so the receiver is
/// never overrun), poll both CQs, read each message in place, release it. Returns the
/// number received and a checksum of their contents.
fn hot_loop<const N: usize, const M: usize>(
    send: &mut SendRing<N>,
    sp: &mut CqPoller<64>,
    recv: &mut RecvRing<M>,
    rp: &mut CqPoller<64>,
    same_cq: bool,
    messages: u64,
) -> (u64, u64) {
    let mut credits = Credits::new(recv.posted());
    let mut sent = 0u64;
    let mut received = 0u64;
    let mut sum = 0u64;
    let mut returned = 0u64;
    while received < messages {
        let payloads: [[u8; 8]; 16] = core::array::from_fn(|i| (sent + i as u64).to_le_bytes());
        {
            let mut b = send.batch();
            for p in &payloads {
                if sent == messages || !credits.try_take() {
                    break;
                }
                match b.push(Msg::send(Local::Inline(p))) {
                    Ok(_) => sent += 1,
                    Err(SendError::WouldBlock) => {
                        credits.grant(1);
                        break;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            b.finish().unwrap();
        }
        let mut handle =
            |c: &mut Completion, recv: &mut RecvRing<M>, send: &mut SendRing<N>| match c.ring() {
                S => {
                    send.on_completion(c).unwrap();
                }
                R => {
                    let m = recv.on_completion(c).unwrap();
                    let d = recv.data(&m).unwrap();
                    sum = sum.wrapping_add(u64::from_le_bytes(d.try_into().unwrap()));
                    received += 1;
                    recv.release(m).unwrap();
                }
                r => panic!("ring {r}"),
            };
        for c in sp.poll().unwrap() {
            handle(c, recv, send);
        }
        if !same_cq {
            for c in rp.poll().unwrap() {
                handle(c, recv, send);
            }
        }
        // Credits come back for receives that are posted again.
        let reposted = received - recv.pending() as u64;
        credits.grant((reposted - returned) as u32);
        returned = reposted;
    }
    (received, sum)
}

#[test]
fn one_million_messages_on_the_counting_device_allocate_nothing() {
    let dev = CountingDevice::new(4096);
    dev.set_loopback(true);
    let region = vec![0u8; 256 * 64];
    // SAFETY: the device and the region outlive the rings and pollers.
    let (mut send, mut recv, mut sp, mut rp) = unsafe {
        let send: SendRing<256> = SendRing::new(
            dev.qp(),
            SendConfig::new(S, 256, 64).signal_every(32).batch(16),
        )
        .unwrap();
        let mut recv: RecvRing<256> = RecvRing::new(
            RecvTarget::Qp(dev.qp()),
            LocalBuf::new(region.as_ptr() as u64, region.len() as u32, 1),
            RecvConfig::new(R, 64, 256).repost_batch(16),
        )
        .unwrap();
        recv.fill().unwrap();
        (
            send,
            recv,
            CqPoller::<64>::new(dev.cq()),
            CqPoller::<64>::new(dev.cq()),
        )
    };
    let (allocs, (received, _)) =
        CountingAlloc::count(|| hot_loop(&mut send, &mut sp, &mut recv, &mut rp, true, MESSAGES));
    assert_eq!(received, MESSAGES);
    // The counting device moves no data: the slots keep their zeros.
    assert_eq!(allocs, 0, "allocations in the hot loop");
    assert_eq!(dev.send_wrs(), MESSAGES);
    assert!(
        dev.doorbells() <= MESSAGES / 8,
        "batched: {} doorbells",
        dev.doorbells()
    );
    assert_eq!(dev.cq_overflows(), 0);
    eprintln!(
        "counting device: {MESSAGES} messages, {} doorbells, {} receive doorbells, 0 allocations",
        dev.doorbells(),
        dev.recv_doorbells()
    );
}

#[test]
fn one_million_messages_on_softnic_allocate_nothing() {
    use common::nic::{Pair, PairOpts};
    let pair = Pair::new(PairOpts {
        sq_depth: 256,
        rq_depth: 256,
        cq_size: 4096,
        ..PairOpts::default()
    });
    let region = pair.b.local().slice(0, 256 * 64).unwrap();
    // SAFETY: the pair (QPs, CQs, MRs, buffers) outlives the rings and pollers.
    let (mut send, mut recv, mut sp, mut rp) = unsafe {
        let send: SendRing<256> = SendRing::new(
            pair.a.qp,
            SendConfig::new(S, 256, 64).signal_every(32).batch(16),
        )
        .unwrap();
        let mut recv: RecvRing<256> = RecvRing::new(
            RecvTarget::Qp(pair.b.qp),
            region,
            RecvConfig::new(R, 64, 256).repost_batch(16),
        )
        .unwrap();
        recv.fill().unwrap();
        (
            send,
            recv,
            CqPoller::<64>::new(pair.a.cq),
            CqPoller::<64>::new(pair.b.cq),
        )
    };
    // No warm-up: softnic sizes its queues, spare entries and scratch lists when the QPs
    // and CQs are created, so the very first message is already the steady state.
    let (allocs, (received, sum)) =
        CountingAlloc::count(|| hot_loop(&mut send, &mut sp, &mut recv, &mut rp, false, MESSAGES));
    assert_eq!(received, MESSAGES);
    assert_eq!(
        sum,
        (0..MESSAGES).sum::<u64>(),
        "every payload arrived once, read in place"
    );
    eprintln!("softnic: {MESSAGES} messages from the first one on: {allocs} allocations");
    assert_eq!(
        allocs, 0,
        "allocations in the hot loop (datapath + softnic)"
    );
}

#[path = "common/ex.rs"]
mod ex;

fn wr_msg(p: &[u8; 8], k: u64, write: bool) -> Msg<'_> {
    if write {
        Msg::write(Local::Inline(&p[..]), (k % 512) * 8)
    } else {
        Msg::send(Local::Inline(&p[..]))
    }
}

/// The extended path's hot loop: `MESSAGES` inline messages through [`WrRing`] batches of
/// 16 (every 8th batch a lone `send_now`), completions through an [`ExCqPoller`].
fn wr_hot_loop(ring: &mut WrRing, p: &mut ExCqPoller<64>, write: bool, messages: u64) -> u64 {
    let mut sent = 0u64;
    let mut round = 0u64;
    while sent < messages {
        let payloads: [[u8; 8]; 16] = core::array::from_fn(|i| (sent + i as u64).to_le_bytes());
        round += 1;
        if round % 8 == 0 {
            match ring.send_now(wr_msg(&payloads[0], sent, write)) {
                Ok(_) => sent += 1,
                Err(SendError::WouldBlock) => {}
                Err(e) => panic!("{e}"),
            }
        } else {
            let mut b = ring.batch();
            for p in &payloads {
                if sent == messages {
                    break;
                }
                match b.push(wr_msg(p, sent, write)) {
                    Ok(_) => sent += 1,
                    Err(SendError::WouldBlock) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            b.finish().unwrap();
        }
        for c in p.poll().unwrap().iter() {
            ring.on_completion(c).unwrap();
        }
    }
    ring.signal_next();
    while ring.outstanding() > 0 {
        for c in p.poll().unwrap().iter() {
            ring.on_completion(c).unwrap();
        }
    }
    sent
}

#[test]
fn one_million_messages_through_the_extended_verbs_allocate_nothing() {
    // The counting device.
    let dev = CountingDevice::new(4096);
    // SAFETY: the device outlives the ring and the poller.
    let (mut ring, mut p) = unsafe {
        (
            WrRing::new(
                dev.qp_ex(),
                SendConfig::new(S, 256, 64).signal_every(32).batch(16),
            )
            .unwrap(),
            ExCqPoller::<64>::new(dev.cq_ex(), ExFields::QP_NUM, IBV_WC_EX_WITH_QP_NUM as u64)
                .unwrap(),
        )
    };
    let (allocs, sent) = CountingAlloc::count(|| wr_hot_loop(&mut ring, &mut p, false, MESSAGES));
    assert_eq!(sent, MESSAGES);
    assert_eq!(
        allocs, 0,
        "allocations in the extended hot loop (counting device)"
    );
    assert_eq!(dev.send_wrs(), MESSAGES);
    assert_eq!(ring.outstanding(), 0);

    // softnic (the profile HOTVERBS_SOFTNIC_PROFILE selects): RDMA WRITEs into the peer.
    let (a, b, wc) = ex::ex_pair(256);
    // SAFETY: the pair lives until the process ends; only this ring and poller use A.
    let (mut ring, mut p) = unsafe {
        (
            WrRing::new(
                a.qpx,
                SendConfig::new(S, 256, 64)
                    .signal_every(32)
                    .batch(16)
                    .remote(b.remote()),
            )
            .unwrap(),
            ExCqPoller::<64>::new(a.cq, ExFields::QP_NUM, wc).unwrap(),
        )
    };
    let (allocs, sent) = CountingAlloc::count(|| wr_hot_loop(&mut ring, &mut p, true, MESSAGES));
    assert_eq!(sent, MESSAGES);
    eprintln!("softnic, extended verbs: {MESSAGES} messages: {allocs} allocations");
    assert_eq!(
        allocs, 0,
        "allocations in the extended hot loop (datapath + softnic)"
    );
}

#[test]
fn one_million_messages_through_the_mlx5_direct_path_allocate_nothing() {
    use hotverbs_datapath::mlx5::{DirectCq, DirectSq};
    use hotverbs_softnic::mlx5sim::Mlx5Sim;
    let mut sim = Mlx5Sim::new(1024, 256, 0x1234);
    let p = sim.ptrs();
    let sq = DirectSq {
        buf: p.sq,
        wqe_cnt: 1024,
        stride: 64,
        dbrec: p.qp_dbrec,
        bf_reg: p.bf_reg,
        bf_size: 256,
        bf_offset: 0,
        qp_num: 0x1234,
        ud: false,
        uc: false,
        max_inline: 64,
        max_sge: 1,
        wrid: p.wrid,
    };
    let cq = DirectCq {
        buf: p.cq,
        cqe_cnt: 256,
        cqe_size: 64,
        dbrec: p.cq_dbrec,
        cqn: 1,
        cons_index: 0,
    };
    // SAFETY: the simulator outlives the ring and the poller, its only users.
    let (mut ring, mut poller) = unsafe {
        let ring = DirectRing::new(
            sq,
            SendConfig::new(S, 256, 64).signal_every(32).batch(16),
            None,
        )
        .unwrap();
        let mut poller = DirectPoller::<64>::new(cq).unwrap();
        poller.attach(&sq).unwrap();
        (ring, poller)
    };
    let payload = [7u8; 48];
    let (allocs, sent) = CountingAlloc::count(|| {
        let mut sent = 0u64;
        while sent < MESSAGES {
            let k = sent;
            let m = Msg::send(Local::Inline(&payload[..(k % 49) as usize]));
            let r = if k % 3 == 0 {
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
            sim.process();
            for c in poller.poll().unwrap() {
                ring.on_completion(c).unwrap();
            }
        }
        while ring.outstanding() > 0 {
            ring.signal_next();
            sim.process();
            for c in poller.poll().unwrap() {
                ring.on_completion(c).unwrap();
            }
        }
        sent
    });
    assert_eq!(sent, MESSAGES);
    assert_eq!(allocs, 0, "allocations in the mlx5 direct hot loop");
}
