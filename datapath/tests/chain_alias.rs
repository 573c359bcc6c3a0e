//! Soundness review item 5: the provider follows the ring's preformatted `next`/`sg_list`
//! links long after they were written; nothing in between may invalidate them.
use hotverbs_datapath::{CqPoller, Local, Msg, SendConfig, SendRing};
use hotverbs_softnic::counting::CountingDevice;

fn drain<const N: usize>(p: &mut CqPoller<8>, r: &mut SendRing<N>) {
    for c in p.poll().unwrap().iter() {
        r.on_completion(c).unwrap();
    }
}

#[test]
fn chained_posts_on_a_stack_ring() {
    let dev = CountingDevice::new(64);
    // SAFETY: the device outlives the ring and the poller.
    let mut r: SendRing<8> =
        unsafe { SendRing::new(dev.qp(), SendConfig::new(1, 8, 64).signal_every(4).batch(8)) }
            .unwrap();
    // SAFETY: as above.
    let mut p: CqPoller<8> = unsafe { CqPoller::new(dev.cq()) };
    let data = [7u8; 16];
    for round in 0..3 {
        for i in 0..4 {
            // SAFETY: inline messages; the data outlives the flush.
            unsafe { r.stage(Msg::send(Local::Inline(&data[i..i + 4]))) }.unwrap();
        }
        let _ = r.free();
        r.flush().unwrap();
        drain(&mut p, &mut r);
        assert_eq!(dev.send_wrs(), 4 * (round + 1));
    }
}

#[test]
fn chained_posts_on_a_boxed_ring() {
    let dev = CountingDevice::new(64);
    // SAFETY: the device outlives the ring and the poller.
    let mut r: Box<SendRing<8>> =
        unsafe { SendRing::new_boxed(dev.qp(), SendConfig::new(1, 8, 64).signal_every(4)) }
            .unwrap();
    // SAFETY: as above.
    let mut p: CqPoller<8> = unsafe { CqPoller::new(dev.cq()) };
    let data = [7u8; 16];
    for _ in 0..3 {
        let mut b = r.batch();
        for i in 0..4 {
            b.push(Msg::send(Local::Inline(&data[i..i + 4]))).unwrap();
        }
        b.finish().unwrap();
        // A move of the Box must not invalidate the links either.
        let moved = std::convert::identity(r);
        r = moved;
        drain(&mut p, &mut r);
    }
    r.flush_signaled().unwrap();
}

/// `flush_signaled` marks the last staged WR through the ring before the chain is posted:
/// the provider then follows links into a WR the ring just wrote.
#[test]
fn flush_signaled_chain() {
    let dev = CountingDevice::new(64);
    // SAFETY: the device outlives the ring and the poller.
    let mut r: SendRing<8> =
        unsafe { SendRing::new(dev.qp(), SendConfig::new(1, 8, 64).signal_every(4).batch(8)) }
            .unwrap();
    // SAFETY: as above.
    let mut p: CqPoller<8> = unsafe { CqPoller::new(dev.cq()) };
    let data = [7u8; 16];
    for round in 0..3 {
        for i in 0..3 {
            // SAFETY: inline messages; the data outlives the flush.
            unsafe { r.stage(Msg::send(Local::Inline(&data[i..i + 4]))) }.unwrap();
        }
        assert!(r.flush_signaled().unwrap());
        drain(&mut p, &mut r);
        assert_eq!(dev.send_wrs(), 3 * (round + 1));
        assert_eq!(r.outstanding(), 0, "the signaled last WR retired the chain");
    }
}

/// The same on softnic, which (as a NIC does) reads every WR's SGE list and the inline
/// bytes behind it while following the chain.
#[test]
fn chained_inline_writes_on_softnic() {
    use hotverbs::{AccessFlags, ConnectOptions, Context, Qp, QpBuilder, QpType};
    use hotverbs_datapath::RemoteBuf;
    let ctx = Context::open("softnic").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = |inline| {
        QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
            .max_send_wr(16)
            .max_inline_data(inline)
            .build()
            .unwrap()
    };
    let (a, b) = (qp(64), qp(0));
    let port = ctx.port_info(None, None).unwrap();
    Qp::connect_pair(&a, &b, &port, &ConnectOptions::default()).unwrap();
    let target = pd
        .alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let r = target.remote();
    let cfg = SendConfig::new(1, 8, 64)
        .signal_every(4)
        .batch(8)
        .remote(RemoteBuf::new(r.addr, r.len, r.rkey));
    // SAFETY: `a`, `cq` and `target` outlive the ring and the poller; one ring per SQ.
    let mut ring: SendRing<8> = unsafe { SendRing::new(a.as_raw(), cfg) }.unwrap();
    // SAFETY: as above.
    let mut p: CqPoller<8> = unsafe { CqPoller::new(cq.as_raw()) };
    for round in 0..2u8 {
        let bytes: [[u8; 4]; 4] = core::array::from_fn(|i| [round * 16 + i as u8; 4]);
        let mut batch = ring.batch();
        for (i, m) in bytes.iter().enumerate() {
            batch
                .push(Msg::write(Local::Inline(m), i as u64 * 4))
                .unwrap();
        }
        batch.finish().unwrap();
        drain(&mut p, &mut ring);
        for (i, m) in bytes.iter().enumerate() {
            assert_eq!(target.read_vec(i * 4, 4).unwrap(), m);
        }
    }
}
