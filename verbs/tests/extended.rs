//! The extended verbs on the software device, in whichever profile
//! `HOTVERBS_SOFTNIC_PROFILE` selects (run both: `HOTVERBS_SOFTNIC_PROFILE=rxe`):
//! extended QPs (`ibv_create_qp_ex` with the ops asked for, posting through `ibv_wr_*`),
//! extended CQs (`ibv_create_cq_ex` with the fields asked for, read through
//! `ibv_start_poll` / `ibv_wc_read_*`, and still a full `Cq`), completion timestamps (Spec:
//! present and convertible; Rxe: refused with an error naming the feature and the
//! device), thread and parent domains and their lifetimes, and `ibv_query_rt_values_ex`.

use std::time::{Duration, Instant};

use hotverbs::hotverbs_ffi::{self, ibv_cq_ex, ibv_poll_cq_attr, inline};
use hotverbs::*;
use hotverbs_softnic::Profile;

const T: Duration = Duration::from_secs(5);

fn ctx() -> Context {
    Context::open("softnic").expect("softnic always opens")
}

fn profile(ctx: &Context) -> Profile {
    // SAFETY: a live softnic context.
    unsafe { hotverbs_softnic::device_profile(ctx.as_raw()) }
}

/// `CLOCK_REALTIME` in ns.
fn realtime_ns() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    t.as_nanos() as u64
}

fn rw() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
}

/// One completion read from an extended CQ through the `ibv_wc_read_*` readers of the
/// fields it was created with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ExWc {
    wr_id: u64,
    status: u32,
    opcode: u32,
    byte_len: Option<u32>,
    imm: Option<u32>,
    qp_num: Option<u32>,
    ts: Option<u64>,
    wall: Option<u64>,
}

/// Polls `cq`'s extended interface until `n` completions arrived (or panics after `T`),
/// reading only the fields the CQ carries.
fn poll_ex(cq: &Cq, n: usize) -> Vec<ExWc> {
    let cqx: *mut ibv_cq_ex = cq.as_cq_ex().expect("an extended CQ");
    let f = cq.wc_fields();
    let deadline = Instant::now() + T;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(Instant::now() < deadline, "only {got:?} within {T:?}");
        // SAFETY: plain C data; comp_mask 0.
        let mut attr: ibv_poll_cq_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live extended CQ; this thread is its only poller.
        let ret = unsafe { inline::ibv_start_poll(cqx, &mut attr) };
        if ret == libc::ENOENT {
            std::thread::yield_now();
            continue;
        }
        assert_eq!(ret, 0, "ibv_start_poll");
        loop {
            // SAFETY: between a successful start/next poll and end_poll; only the fields
            // the CQ was created with are read.
            let wc = unsafe {
                let flags = inline::ibv_wc_read_wc_flags(cqx);
                ExWc {
                    wr_id: (*cqx).wr_id,
                    status: (*cqx).status,
                    opcode: inline::ibv_wc_read_opcode(cqx),
                    byte_len: f
                        .contains(WcFields::BYTE_LEN)
                        .then(|| inline::ibv_wc_read_byte_len(cqx)),
                    imm: (f.contains(WcFields::IMM) && flags & hotverbs_ffi::IBV_WC_WITH_IMM != 0)
                        .then(|| u32::from_be(inline::ibv_wc_read_imm_data(cqx))),
                    qp_num: f
                        .contains(WcFields::QP_NUM)
                        .then(|| inline::ibv_wc_read_qp_num(cqx)),
                    ts: f
                        .contains(WcFields::COMPLETION_TIMESTAMP)
                        .then(|| inline::ibv_wc_read_completion_ts(cqx)),
                    wall: f
                        .contains(WcFields::COMPLETION_TIMESTAMP_WALLCLOCK)
                        .then(|| inline::ibv_wc_read_completion_wallclock_ns(cqx)),
                }
            };
            got.push(wc);
            // SAFETY: as above.
            if unsafe { inline::ibv_next_poll(cqx) } != 0 {
                break;
            }
        }
        // SAFETY: after a successful start_poll.
        unsafe { inline::ibv_end_poll(cqx) };
    }
    got
}

struct ExPair {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    a: Qp,
    b: Qp,
}

fn ex_pair_on(ctx: Context, pd: Pd, cq: Cq, ops: SendOps) -> ExPair {
    let build = || {
        QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
            .max_send_wr(32)
            .max_recv_wr(32)
            .max_inline_data(64)
            .send_ops(ops)
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let port = ctx.port_info(None, None).unwrap();
    Qp::connect_pair(&a, &b, &port, &ConnectOptions::default()).unwrap();
    ExPair { ctx, pd, cq, a, b }
}

fn ex_pair(fields: WcFields, ops: SendOps) -> ExPair {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = CqBuilder::new(&ctx, 64).wc_fields(fields).build().unwrap();
    ex_pair_on(ctx, pd, cq, ops)
}

/// Posts one signaled SEND with immediate of `sge` from `qp` through the `ibv_wr_*` API.
fn wr_send_imm(qp: &Qp, wr_id: u64, imm: u32, sge: Sge) {
    let qpx = qp.as_qp_ex().expect("an extended QP");
    // SAFETY: a live extended QP created with SEND_WITH_IMM; sge names registered memory
    // that stays untouched until the completion is polled.
    let ret = unsafe {
        inline::ibv_wr_start(qpx);
        (*qpx).wr_id = wr_id;
        (*qpx).wr_flags = hotverbs_ffi::IBV_SEND_SIGNALED;
        inline::ibv_wr_send_imm(qpx, imm.to_be());
        inline::ibv_wr_set_sge(qpx, sge.lkey, sge.addr, sge.length);
        inline::ibv_wr_complete(qpx)
    };
    assert_eq!(ret, 0, "ibv_wr_complete");
}

#[test]
fn extended_qp_posts_through_wr_api_and_extended_cq_reads_the_fields() {
    let fields = WcFields::BYTE_LEN | WcFields::IMM | WcFields::QP_NUM;
    let ops = SendOps::SEND | SendOps::SEND_WITH_IMM | SendOps::RDMA_WRITE | SendOps::RDMA_READ;
    let p = ex_pair(fields, ops);
    assert_eq!(p.a.send_ops(), ops);
    assert_eq!(p.cq.wc_fields(), fields);
    let mut tx = p.pd.alloc_mr(64, rw()).unwrap();
    let rx = p.pd.alloc_mr(64, rw()).unwrap();
    tx.write_from(0, b"hello").unwrap();
    // SAFETY: rx stays registered and untouched until its completion is polled.
    unsafe { p.b.post_recv(1, &[rx.local(0, 64).unwrap()]).unwrap() };
    wr_send_imm(&p.a, 2, 0xfeed_f00d, tx.local(0, 5).unwrap());

    let mut got = poll_ex(&p.cq, 2);
    got.sort_by_key(|w| w.wr_id);
    let (recv, send) = (got[0], got[1]);
    assert_eq!(recv.wr_id, 1);
    assert_eq!(recv.status, hotverbs_ffi::IBV_WC_SUCCESS);
    assert_eq!(recv.opcode, hotverbs_ffi::IBV_WC_RECV);
    assert_eq!(recv.byte_len, Some(5));
    assert_eq!(recv.imm, Some(0xfeed_f00d));
    assert_eq!(recv.qp_num, Some(p.b.qp_num()));
    assert_eq!(recv.ts, None);
    assert_eq!(send.wr_id, 2);
    assert_eq!(send.status, hotverbs_ffi::IBV_WC_SUCCESS);
    assert_eq!(send.opcode, hotverbs_ffi::IBV_WC_SEND);
    assert_eq!(send.qp_num, Some(p.a.qp_num()));
    assert_eq!(rx.read_vec(0, 5).unwrap(), b"hello");

    // RDMA WRITE through the same QP, and the legacy post_send path still works on it.
    let remote = rx.remote();
    let qpx = p.a.as_qp_ex().unwrap();
    tx.write_from(0, b"world").unwrap();
    let sge = tx.local(0, 5).unwrap();
    // SAFETY: a live extended QP created with RDMA_WRITE; tx and rx stay registered.
    let ret = unsafe {
        inline::ibv_wr_start(qpx);
        (*qpx).wr_id = 3;
        (*qpx).wr_flags = hotverbs_ffi::IBV_SEND_SIGNALED;
        inline::ibv_wr_rdma_write(qpx, remote.rkey, remote.addr);
        inline::ibv_wr_set_sge(qpx, sge.lkey, sge.addr, sge.length);
        inline::ibv_wr_complete(qpx)
    };
    assert_eq!(ret, 0);
    let w = poll_ex(&p.cq, 1)[0];
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (
            3,
            hotverbs_ffi::IBV_WC_SUCCESS,
            hotverbs_ffi::IBV_WC_RDMA_WRITE
        )
    );
    assert_eq!(rx.read_vec(0, 5).unwrap(), b"world");
    // SAFETY: tx stays registered until the completion is polled.
    unsafe {
        p.a.post_send(&SendWr::write(4, &[sge], remote).signaled())
            .unwrap()
    };
    let wc = p.cq.wait_one(T).unwrap().ok().unwrap();
    assert_eq!(wc.wr_id(), 4);
}

#[test]
fn legacy_objects_have_no_extended_handles() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    assert_eq!(cq.as_cq_ex(), None);
    assert_eq!(cq.wc_fields(), WcFields::empty());
    let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    assert_eq!(qp.as_qp_ex(), None);
    assert_eq!(qp.send_ops(), SendOps::empty());
    assert!(!pd.is_parent_domain());
}

#[test]
fn extended_cq_is_still_a_full_cq() {
    let ctx = ctx();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = CqBuilder::new(&ctx, 128)
        .channel(&ch)
        .options(CqOptions {
            comp_vector: 0,
            user_context: 77,
        })
        .build()
        .unwrap();
    assert_eq!(cq.wc_fields(), WcFields::STANDARD);
    assert!(cq.capacity() >= 128);
    assert_eq!(cq.user_context(), 77);
    assert_eq!(
        cq.as_cq_ex().unwrap().cast::<hotverbs_ffi::ibv_cq>(),
        cq.as_raw(),
        "as_raw is ibv_cq_ex_to_cq"
    );
    let pd = ctx.alloc_pd().unwrap();
    let p = ex_pair_on(ctx, pd, cq, SendOps::SEND | SendOps::SEND_WITH_IMM);

    // Completion events on the channel.
    p.cq.req_notify(false).unwrap();
    let mut tx = p.pd.alloc_mr(64, rw()).unwrap();
    let rx = p.pd.alloc_mr(64, rw()).unwrap();
    tx.write_from(0, &[9]).unwrap();
    // SAFETY: rx untouched until its completion.
    unsafe { p.b.post_recv(10, &[rx.local(0, 64).unwrap()]).unwrap() };
    wr_send_imm(&p.a, 11, 5, tx.local(0, 1).unwrap());
    let ev = ch.wait_cq_event(T).unwrap().expect("an event");
    assert!(ev.is_for(&p.cq));
    assert_eq!(ev.user_context(), 77);
    p.cq.ack_events(1);
    // ibv_poll_cq on the extended CQ.
    let mut ids = [
        p.cq.wait_one(T).unwrap().ok().unwrap(),
        p.cq.wait_one(T).unwrap().ok().unwrap(),
    ];
    ids.sort_by_key(|w| w.wr_id());
    assert_eq!((ids[0].wr_id(), ids[0].imm_data()), (10, Some(5)));
    assert_eq!(ids[1].wr_id(), 11);

    // The datapath bridge over the extended QP and CQ: rings reserve the CQ's capacity.
    let mut region = p.pd.alloc_mr(16 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut sring =
        p.a.send_ring::<16>(SendConfig::new(0, 16, 64).signal_every(4))
            .unwrap();
    let mut rring =
        p.b.recv_ring::<16>(&mut region, 0, RecvConfig::new(0, 64, 16))
            .unwrap();
    rring.fill().unwrap();
    let mut poller = p.cq.poller::<8>().unwrap();
    let mut sent = 0u32;
    let mut got = Vec::new();
    let deadline = Instant::now() + T;
    while got.len() < 40 {
        assert!(Instant::now() < deadline, "got {got:?}");
        if sent < 40 {
            let m = sent.to_le_bytes();
            match sring.send_now(Msg::send(Local::Inline(&m))) {
                Ok(_) => sent += 1,
                Err(SendError::WouldBlock) => {}
                Err(e) => panic!("{e}"),
            }
        }
        for c in poller.poll().unwrap() {
            if c.ring() == sring.ring_id() {
                sring.on_completion(c).unwrap();
            } else {
                let m = rring.on_completion(c).unwrap();
                got.push(u32::from_le_bytes(
                    rring.data(&m).unwrap().try_into().unwrap(),
                ));
                rring.release(m).unwrap();
            }
        }
    }
    assert_eq!(got, (0..40).collect::<Vec<_>>());
    // One poller per CQ: Cq::poll refuses while the bridge's poller exists.
    let mut wc = [Wc::default()];
    assert_eq!(p.cq.poll(&mut wc).unwrap_err().errno(), libc::EBUSY);
}

#[test]
fn cq_builder_checks_like_create_cq_with() {
    let ctx = ctx();
    let e = CqBuilder::new(&ctx, 16)
        .options(CqOptions {
            comp_vector: 99,
            user_context: 0,
        })
        .build()
        .unwrap_err();
    assert_eq!(
        (e.verb(), e.errno()),
        ("ibv_create_cq_ex", libc::EINVAL),
        "{e}"
    );
    assert!(e.to_string().contains("comp_vector 99"), "{e}");
    let other = ctx_other();
    let ch = other.create_comp_channel().unwrap();
    let e = CqBuilder::new(&ctx, 16).channel(&ch).build().unwrap_err();
    assert_eq!(
        (e.verb(), e.errno()),
        ("ibv_create_cq_ex", libc::EINVAL),
        "{e}"
    );
    let Some(pdom) = parent_domain_or_refusal(&other.alloc_pd().unwrap()) else {
        return;
    };
    let e = CqBuilder::new(&ctx, 16)
        .parent_domain(&pdom)
        .build()
        .unwrap_err();
    assert_eq!(
        (e.verb(), e.errno()),
        ("ibv_create_cq_ex", libc::EINVAL),
        "{e}"
    );
    assert!(e.to_string().contains("another device context"), "{e}");
}

/// A parent domain without thread domain over `pd`; `None` in the Rxe profile, after
/// checking that the refusal is rxe's (EOPNOTSUPP) and names the feature and the device.
fn parent_domain_or_refusal(pd: &Pd) -> Option<ParentDomain> {
    match pd.alloc_parent_domain(None) {
        Ok(p) => Some(p),
        Err(e) => {
            assert_eq!(profile(pd.context()), Profile::Rxe, "only rxe refuses: {e}");
            assert_eq!(
                (e.verb(), e.errno()),
                ("ibv_alloc_parent_domain", libc::EOPNOTSUPP)
            );
            assert!(
                e.to_string()
                    .contains("parent domains are not supported by device softnic"),
                "{e}"
            );
            None
        }
    }
}

/// A second, distinct softnic context.
fn ctx_other() -> Context {
    let c = ctx();
    assert_ne!(c.as_raw(), ctx().as_raw());
    c
}

#[test]
fn refused_send_op_names_the_op_and_the_device() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    // UD has no RDMA: the op is refused, and the error names it, the device and the type.
    let e = QpBuilder::new(&pd, &cq, &cq, QpType::Ud)
        .send_ops(SendOps::SEND | SendOps::RDMA_WRITE_WITH_IMM)
        .build()
        .unwrap_err();
    assert_eq!(e.verb(), "ibv_create_qp_ex", "{e}");
    assert_eq!(e.errno(), libc::EOPNOTSUPP, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("send op RDMA_WRITE_WITH_IMM is not supported by device softnic for UD QPs"),
        "{msg}"
    );
    assert!(!msg.contains("SEND,"), "SEND alone is fine: {msg}");
    // The same ops are fine on RC, and SEND alone on UD.
    QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .send_ops(SendOps::SEND | SendOps::RDMA_WRITE_WITH_IMM)
        .build()
        .unwrap();
    let ud = QpBuilder::new(&pd, &cq, &cq, QpType::Ud)
        .send_ops(SendOps::SEND | SendOps::SEND_WITH_IMM)
        .build()
        .unwrap();
    assert!(ud.as_qp_ex().is_some());
    // Several refused ops are all named (in the header's order).
    let e = QpBuilder::new(&pd, &cq, &cq, QpType::Uc)
        .send_ops(SendOps::SEND | SendOps::RDMA_READ | SendOps::ATOMIC_FETCH_AND_ADD)
        .build()
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "send ops RDMA_READ, ATOMIC_FETCH_AND_ADD are not supported by device softnic \
             for UC QPs"
        ),
        "{e}"
    );
    // A check of ours before the verb keeps its own error (no probing).
    let other = ctx_other();
    let foreign = other.create_cq(16, None).unwrap();
    let e = QpBuilder::new(&pd, &foreign, &foreign, QpType::Rc)
        .send_ops(SendOps::SEND)
        .build()
        .unwrap_err();
    assert_eq!(
        (e.verb(), e.errno()),
        ("ibv_create_qp_ex", libc::EINVAL),
        "{e}"
    );
    assert!(e.to_string().contains("one device context"), "{e}");
}

#[test]
fn completion_timestamps_per_profile() {
    let ctx = ctx();
    let attr = ctx.query_device().unwrap();
    let fields = WcFields::STANDARD | WcFields::COMPLETION_TIMESTAMP;
    match profile(&ctx) {
        Profile::Rxe => {
            // rxe: no completion timestamps, and a clear error naming the feature and device.
            assert!(!ctx.supports_completion_timestamps().unwrap());
            assert_eq!(attr.completion_timestamp_mask(), 0);
            let e = CqBuilder::new(&ctx, 16)
                .wc_fields(fields)
                .build()
                .unwrap_err();
            assert_eq!(
                (e.verb(), e.errno()),
                ("ibv_create_cq_ex", libc::EOPNOTSUPP),
                "{e}"
            );
            assert!(
                e.to_string()
                    .contains("completion timestamps are not supported by device softnic"),
                "{e}"
            );
            assert!(
                e.to_string().contains("WcFields::COMPLETION_TIMESTAMP"),
                "{e}"
            );
            let e = ctx.timestamp_clock().unwrap_err();
            assert_eq!(e.errno(), libc::EOPNOTSUPP);
            assert!(
                e.to_string()
                    .contains("completion timestamps are not supported by device softnic"),
                "{e}"
            );
            let e = CqBuilder::new(&ctx, 16)
                .wc_fields(WcFields::BYTE_LEN | WcFields::COMPLETION_TIMESTAMP_WALLCLOCK)
                .build()
                .unwrap_err();
            assert!(
                e.to_string().contains(
                    "wall-clock completion timestamps are not supported by device softnic"
                ),
                "{e}"
            );
            // Without the timestamp the same CQ is fine.
            CqBuilder::new(&ctx, 16).build().unwrap();
        }
        _ => {
            assert!(ctx.supports_completion_timestamps().unwrap());
            assert_ne!(attr.completion_timestamp_mask(), 0);
            assert_ne!(attr.hca_core_clock_khz(), 0);
            let clock = ctx.timestamp_clock().unwrap();
            assert_eq!(clock.mask(), attr.completion_timestamp_mask());
            let pd = ctx.alloc_pd().unwrap();
            let cq = CqBuilder::new(&ctx, 64)
                .wc_fields(fields | WcFields::COMPLETION_TIMESTAMP_WALLCLOCK)
                .build()
                .unwrap();
            let p = ex_pair_on(ctx, pd, cq, SendOps::SEND | SendOps::SEND_WITH_IMM);
            let wall_before = realtime_ns();
            let tx = p.pd.alloc_mr(64, rw()).unwrap();
            let rx = p.pd.alloc_mr(64, rw()).unwrap();
            let before = p.ctx.clock_sample().unwrap();
            // SAFETY: rx untouched until its completion.
            unsafe { p.b.post_recv(1, &[rx.local(0, 64).unwrap()]).unwrap() };
            wr_send_imm(&p.a, 2, 1, tx.local(0, 8).unwrap());
            let got = poll_ex(&p.cq, 2);
            let after = p.ctx.clock_sample().unwrap();
            let wall_after = realtime_ns();
            let span = clock.delta_ns(before.raw, after.raw);
            for w in &got {
                let ts = w.ts.expect("timestamp requested");
                let wall = w.wall.expect("wall-clock timestamp requested");
                assert!((wall_before..=wall_after).contains(&wall), "{w:?}");
                // Stamped between the two readings of the same device clock.
                assert!(
                    clock.delta_ns(before.raw, ts) <= span,
                    "{w:?} {before:?} {after:?}"
                );
                assert!(
                    clock.delta_ns(ts, after.raw) <= span,
                    "{w:?} {before:?} {after:?}"
                );
                // On the host's scale (rate measured between the samples): inside the
                // interval the samples bracket.
                if let Some(host) = TimestampClock::from_samples(before, after, clock.mask()) {
                    let ns = host.to_ns(ts);
                    assert!(
                        (before.host_ns..=after.host_ns).contains(&ns),
                        "{ns} outside {before:?}..{after:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn rt_values_give_a_clock_that_moves_forward() {
    let ctx = ctx();
    let attr = ctx.query_device().unwrap();
    let first = match ctx.rt_values() {
        Ok(v) => v,
        Err(e) => {
            // A device without the raw clock (rxe) says so, naming itself.
            assert_eq!(profile(&ctx), Profile::Rxe, "only rxe refuses: {e}");
            assert_eq!(
                (e.verb(), e.errno()),
                ("ibv_query_rt_values_ex", libc::EOPNOTSUPP)
            );
            assert!(e.to_string().contains("device softnic"), "{e}");
            assert!(!attr.supports_completion_timestamps());
            return;
        }
    };
    let mask = attr.completion_timestamp_mask().max(1);
    // Two samples that are apart on both clocks (bounded wait: they move in nanoseconds).
    let a = ctx.clock_sample().unwrap();
    let deadline = Instant::now() + T;
    let b = loop {
        let b = ctx.clock_sample().unwrap();
        if b.host_ns > a.host_ns && (b.raw.wrapping_sub(a.raw) & mask) > 0 {
            break b;
        }
        assert!(Instant::now() < deadline, "the device clock does not move");
    };
    assert!(
        (a.raw.wrapping_sub(first.raw_clock()) & mask) <= mask / 2,
        "monotonic"
    );
    let host = TimestampClock::from_samples(a, b, mask).unwrap();
    assert_eq!(host.to_ns(a.raw), a.host_ns);
    assert_eq!(host.to_ns(b.raw), b.host_ns);
    if let Ok(dev) = ctx.timestamp_clock() {
        // The declared frequency converts the same cycle span to device nanoseconds.
        let cycles = b.raw.wrapping_sub(a.raw) & mask;
        assert_eq!(
            dev.delta_ns(a.raw, b.raw),
            (u128::from(cycles) * 1_000_000 / u128::from(attr.hca_core_clock_khz())) as u64
        );
    }
}

#[test]
fn thread_and_parent_domain_lifetimes() {
    let ctx = ctx();
    let td = match ctx.alloc_td() {
        Ok(td) => td,
        Err(e) => {
            // Only a device without thread domains (rxe) may refuse, and it says which.
            assert_eq!(profile(&ctx), Profile::Rxe, "only rxe refuses: {e}");
            assert!(
                e.to_string().contains("thread domains are not supported"),
                "{e}"
            );
            assert_eq!(
                (e.verb(), e.errno()),
                ("ibv_alloc_td", libc::EOPNOTSUPP),
                "{e}"
            );
            assert!(e.to_string().contains("device softnic"), "{e}");
            return;
        }
    };
    assert!(!td.as_raw().is_null());
    let pd = ctx.alloc_pd().unwrap();
    let pdom = pd.alloc_parent_domain(Some(&td)).unwrap();
    assert!(pdom.is_parent_domain());
    assert_eq!(pdom.protection_domain().as_raw(), pd.as_raw());
    assert_eq!(pdom.thread_domain().unwrap().as_raw(), td.as_raw());
    assert_ne!(pdom.as_raw(), pd.as_raw());
    // A parent domain is not made from a parent domain.
    let e = pdom.alloc_parent_domain(None).unwrap_err();
    assert_eq!(
        (e.verb(), e.errno()),
        ("ibv_alloc_parent_domain", libc::EINVAL)
    );
    // A thread domain of another context is refused before the verb.
    let other = ctx_other();
    let e = pd
        .alloc_parent_domain(Some(&other.alloc_td().unwrap()))
        .unwrap_err();
    assert_eq!(
        (e.verb(), e.errno()),
        ("ibv_alloc_parent_domain", libc::EINVAL)
    );

    // Objects in the parent domain: an MR, an extended CQ, QPs (extended and plain).
    let cq = CqBuilder::new(&ctx, 64)
        .parent_domain(&pdom)
        .single_threaded(true)
        .build()
        .unwrap();
    let mr = pdom.alloc_mr(4096, rw()).unwrap();
    let p = ex_pair_on(
        ctx.clone(),
        (*pdom).clone(),
        cq,
        SendOps::SEND | SendOps::SEND_WITH_IMM,
    );
    let plain = QpBuilder::new(&pdom, &p.cq, &p.cq, QpType::Rc)
        .build()
        .unwrap();
    assert_eq!(plain.pd().as_raw(), pdom.as_raw());
    // Traffic through the parent domain's QPs and MR.
    // SAFETY: mr untouched until the completion.
    unsafe { p.b.post_recv(1, &[mr.local(0, 64).unwrap()]).unwrap() };
    wr_send_imm(&p.a, 2, 3, mr.local(64, 8).unwrap());
    let got = poll_ex(&p.cq, 2);
    assert!(
        got.iter().all(|w| w.status == hotverbs_ffi::IBV_WC_SUCCESS),
        "{got:?}"
    );

    // Each holder keeps what it uses: EBUSY while children live.
    let e = td.clone().destroy().unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_dealloc_td", libc::EBUSY));
    let e = pd.clone().destroy().unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_dealloc_pd", libc::EBUSY));
    let e = pdom.clone().destroy().unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_dealloc_pd", libc::EBUSY));
    let ExPair {
        a,
        b,
        cq,
        pd: pdom_clone,
        ..
    } = p;
    drop((a, b, plain, mr, cq, pdom_clone));
    // Children gone: the parent domain goes, then the PD and TD it held.
    let e = td.clone().destroy().unwrap_err();
    assert_eq!(
        e.errno(),
        libc::EBUSY,
        "the parent domain still holds the TD"
    );
    pdom.destroy().unwrap();
    pd.destroy().unwrap();
    td.destroy().unwrap();
}

#[test]
fn parent_domain_without_thread_domain_and_drop_order() {
    let ctx = ctx();
    let pd = ctx.alloc_pd().unwrap();
    let Some(pdom) = parent_domain_or_refusal(&pd) else {
        return;
    };
    assert!(pdom.thread_domain().is_none());
    let mr = pdom.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    // One protection scope: a QP of the parent domain leases an MR of its protection
    // domain, not one of another PD.
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = QpBuilder::new(&pdom, &cq, &cq, QpType::Rc).build().unwrap();
    let in_pd = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    qp.lease_recv(&in_pd, 0, 64).unwrap();
    let elsewhere = ctx
        .alloc_pd()
        .unwrap()
        .alloc_mr(64, AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert_eq!(
        qp.lease_recv(&elsewhere, 0, 64).unwrap_err().errno(),
        libc::EINVAL
    );
    drop((qp, in_pd, elsewhere));
    // Dropping the handles first is fine: the MR holds the parent domain, which holds the PD.
    drop(pdom);
    drop(pd);
    assert_eq!(mr.as_slice().unwrap().len(), 64);
    drop(mr);
    let errs: Vec<_> = take_drop_errors()
        .into_iter()
        .filter(|e| e.verb() == "ibv_dealloc_pd" || e.verb() == "ibv_dealloc_td")
        .collect();
    assert!(errs.is_empty(), "{errs:?}");
}
