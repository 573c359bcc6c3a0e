//! Regression tests of the soundness review: softnic runs inside the application's process,
//! so it must follow Rust's memory model where a real device need not.
//!
//! - `ibv_destroy_cq` waits for the completion events taken for the CQ to be acknowledged,
//!   as libibverbs does (a runtime check: it returned at once before).
//! - The counting test device keeps provenance over the whole device in the pointers it
//!   hands out, so its `container_of` cast is sound (a miri check: Stacked Borrows stopped
//!   at the first post before).
//! - softnic's copies into application memory from its own buffers (an atomic's original
//!   value, a UD receive's GRH) and from registered memory are sound under miri when the
//!   application keeps its memory behind the pointer it registered (as `hotverbs::Mr`
//!   does).
//! - softnic's device writes that cover part of a word of a memory region meet the
//!   application's accesses of that word with the same size (the MR, not the operation,
//!   decides the unit: softnic/src/mem.rs), and its writes to an MR's ragged edge touch
//!   no byte outside the MR (a miri check: a 3-byte RDMA WRITE raced a whole-word load
//!   with a different access size before).
//!
//! Every test runs natively and under miri with no MIRIFLAGS:
//! `cargo +nightly miri test -p hotverbs-softnic --test soundness`.

use core::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hotverbs_ffi::*;
use hotverbs_softnic::counting::{CountingDevice, QP_NUM};
use hotverbs_softnic::testing::{self, ConnectAttr};
use hotverbs_softnic::{verbs_table, Profile};

/// A raw pointer that may cross to a scoped thread.
struct Shared<T>(*mut T);
// SAFETY: softnic's verbs may be called from any thread; each test says who uses what.
unsafe impl<T> Send for Shared<T> {}

/// A context with a PD, a completion channel, a CQ on it, and an RC QP on the CQ moved to
/// the error state, so each receive posted to it completes at once (a flush): a
/// completion, hence an event, on demand.
struct Events {
    ch: *mut ibv_comp_channel,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
}

impl Events {
    fn new() -> Events {
        let f = verbs_table();
        let (ctx, _) = testing::open_listed_device();
        let cap = ibv_qp_cap {
            max_send_wr: 1,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        // SAFETY: every pointer comes from the verb before it and is live; the objects are
        // destroyed by the tests (or kept for the process).
        unsafe {
            let pd = testing::alloc_pd(ctx);
            let ch = f.ibv_create_comp_channel.unwrap()(ctx);
            assert!(!ch.is_null());
            let cq = f.ibv_create_cq.unwrap()(ctx, 4, null_mut(), ch, 0);
            assert!(!cq.is_null());
            let qp = testing::create_qp(pd, IBV_QPT_RC, cq, cq, cap, null_mut());
            testing::qp_to_init(qp, &ConnectAttr::new(0, testing::query_gid(ctx, 1)));
            let mut attr = ibv_qp_attr {
                qp_state: IBV_QPS_ERR,
                ..Default::default()
            };
            testing::must_modify_qp(qp, &mut attr, IBV_QP_STATE);
            Events { ch, cq, qp }
        }
    }

    /// Arms the CQ and completes one receive: one event on the channel.
    fn raise(&self) {
        let mut wr = ibv_recv_wr::default();
        let mut bad = null_mut();
        // SAFETY: live CQ and QP; a valid single receive WR with no SGEs.
        unsafe {
            assert_eq!(inline::ibv_req_notify_cq(self.cq, 0), 0);
            assert_eq!(inline::ibv_post_recv(self.qp, &mut wr, &mut bad), 0);
            if hotverbs_softnic::device_profile((*self.qp).context) == Profile::Rxe {
                // rxe G9: a receive posted in ERR completes only at the next ERR -> ERR.
                let mut attr = ibv_qp_attr {
                    qp_state: IBV_QPS_ERR,
                    ..Default::default()
                };
                testing::must_modify_qp(self.qp, &mut attr, IBV_QP_STATE);
            }
        }
    }

    /// `ibv_get_cq_event`, expecting an event for our CQ.
    fn take(&self) {
        let (mut cq, mut cq_ctx) = (null_mut(), null_mut());
        // SAFETY: live channel, writable out-pointers.
        let rc = unsafe { verbs_table().ibv_get_cq_event.unwrap()(self.ch, &mut cq, &mut cq_ctx) };
        assert_eq!(rc, 0);
        assert_eq!(cq, self.cq);
    }

    /// Destroys the QP (the CQ's only user).
    fn drop_qp(&self) {
        // SAFETY: our live QP, destroyed once.
        assert_eq!(unsafe { verbs_table().ibv_destroy_qp.unwrap()(self.qp) }, 0);
    }
}

/// `ibv_get_cq_event(3)`: "destroying a CQ will wait for all completion events to be
/// acknowledged". A thread that took an event may still use the CQ (and its `cq_context`)
/// until it acknowledges it; `ibv_destroy_cq` on another thread returns only after the ack.
#[test]
fn destroy_cq_waits_for_taken_events_to_be_acknowledged() {
    let f = verbs_table();
    let ev = Events::new();
    ev.raise();
    ev.take();
    ev.drop_qp();
    let returned = AtomicBool::new(false);
    let cq = Shared(ev.cq);
    std::thread::scope(|s| {
        let destroyer = s.spawn(|| {
            let cq = cq;
            // SAFETY: a live CQ with no QP; destroyed once, here.
            let rc = unsafe { f.ibv_destroy_cq.unwrap()(cq.0) };
            returned.store(true, Ordering::SeqCst);
            rc
        });
        // Long enough for a destroy that does not wait to have returned (natively).
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !returned.load(Ordering::SeqCst),
            "ibv_destroy_cq returned while an event taken for the CQ is unacknowledged"
        );
        // SAFETY: the CQ is live: its destruction is waiting for this acknowledgement.
        unsafe { f.ibv_ack_cq_events.unwrap()(ev.cq, 1) };
        assert_eq!(destroyer.join().unwrap(), 0);
    });
    // SAFETY: live channel; its only CQ is gone.
    assert_eq!(unsafe { f.ibv_destroy_comp_channel.unwrap()(ev.ch) }, 0);
}

/// Events nobody took are dropped with the CQ (as the kernel drops them from the channel):
/// the destruction does not wait for them, and the channel no longer reports them.
#[test]
fn destroy_cq_drops_events_nobody_took() {
    let f = verbs_table();
    let ev = Events::new();
    ev.raise();
    ev.drop_qp();
    // SAFETY: a live CQ with no QP and no event taken; destroyed once.
    assert_eq!(unsafe { f.ibv_destroy_cq.unwrap()(ev.cq) }, 0);
    let (mut cq, mut cq_ctx) = (null_mut(), null_mut());
    // SAFETY: live channel, writable out-pointers; its fd still holds the event's byte, so
    // this does not block.
    let rc = unsafe { f.ibv_get_cq_event.unwrap()(ev.ch, &mut cq, &mut cq_ctx) };
    assert_eq!(rc, -1);
    // SAFETY: live channel; its only CQ is gone.
    assert_eq!(unsafe { f.ibv_destroy_comp_channel.unwrap()(ev.ch) }, 0);
}

/// The counting device under the pointer discipline a datapath uses: the QP, CQ and SRQ
/// pointers go through `ibv_post_send` / `ibv_post_recv` / `ibv_post_srq_recv` /
/// `ibv_poll_cq` into the device's callbacks, which recover the device from
/// `qp->context` (a `container_of` cast) while the test holds `&CountingDevice` and calls
/// its hooks in between. Under miri (Stacked or Tree Borrows) this needs the context
/// pointer to carry provenance over the whole device, not just its `ctx` field.
#[test]
fn counting_device_callbacks_keep_provenance_over_the_device() {
    let dev = CountingDevice::new(8);
    let d: &CountingDevice = &dev;
    let (qp, cq, srq) = (d.qp(), d.cq(), d.srq());
    // SAFETY: the device's own QP, as a datapath reads it.
    unsafe {
        assert_eq!((*qp).qp_num, QP_NUM);
        assert_eq!((*qp).send_cq, cq);
        assert_eq!((*qp).context, d.context());
    }
    d.set_loopback(true);
    let mut recv = ibv_recv_wr {
        wr_id: 7,
        ..Default::default()
    };
    let mut bad_recv = null_mut();
    let mut send = ibv_send_wr {
        wr_id: 8,
        opcode: IBV_WR_SEND,
        send_flags: IBV_SEND_SIGNALED,
        ..Default::default()
    };
    let mut bad_send = null_mut();
    let mut wc = [ibv_wc::default(); 4];
    // SAFETY: the device's live QP, SRQ and CQ; valid single WRs; room for 4 completions.
    unsafe {
        assert_eq!(inline::ibv_post_recv(qp, &mut recv, &mut bad_recv), 0);
        assert_eq!(inline::ibv_post_send(qp, &mut send, &mut bad_send), 0);
        // The CQ as the QP names it.
        assert_eq!(inline::ibv_poll_cq((*qp).recv_cq, 4, wc.as_mut_ptr()), 2);
        assert_eq!((wc[0].wr_id, wc[0].opcode), (7, IBV_WC_RECV));
        assert_eq!((wc[1].wr_id, wc[1].opcode), (8, IBV_WC_SEND));
        assert_eq!(inline::ibv_post_srq_recv(srq, &mut recv, &mut bad_recv), 0);
    }
    assert_eq!(d.posted_srq_recvs(), 1);
    d.use_srq(true);
    assert!(d.complete_recv(16, Some(5)));
    // SAFETY: as above.
    unsafe {
        assert_eq!(inline::ibv_req_notify_cq(cq, 0), 0);
        assert_eq!(inline::ibv_poll_cq(cq, 4, wc.as_mut_ptr()), 1);
    }
    assert_eq!((wc[0].wr_id, wc[0].byte_len), (7, 16));
    assert_eq!((d.send_wrs(), d.recv_wrs(), d.polls()), (1, 2, 2));
    // The handle moves, through a call (the Box does, not the device): pointers taken
    // before stay valid.
    let moved = std::hint::black_box(dev);
    let mut n = 0;
    let mut post = ibv_send_wr {
        wr_id: 9,
        opcode: IBV_WR_RDMA_WRITE,
        send_flags: IBV_SEND_SIGNALED,
        ..Default::default()
    };
    // SAFETY: the device is alive (in `moved`) and pinned, so qp and cq still point to it.
    unsafe {
        assert_eq!(inline::ibv_post_send(qp, &mut post, &mut bad_send), 0);
        n += inline::ibv_poll_cq(cq, 4, wc.as_mut_ptr());
    }
    assert_eq!((n, wc[0].wr_id), (1, 9));
    assert_eq!(moved.polls(), 3);
}

/// Application memory as an RDMA application in Rust should hold it: one heap allocation
/// (8-byte aligned) reached only through the pointer that was registered, never through a
/// `&mut` that would assert exclusive access while the device may write it.
struct AppMem {
    ptr: *mut u8,
    words: usize,
    mr: *mut ibv_mr,
}

impl AppMem {
    fn new(pd: *mut ibv_pd, words: usize) -> AppMem {
        AppMem::registering(pd, words, 0..words * 8)
    }
    /// `words` words of which only the bytes `region` are registered.
    fn registering(pd: *mut ibv_pd, words: usize, region: core::ops::Range<usize>) -> AppMem {
        assert!(region.start <= region.end && region.end <= words * 8);
        let ptr = Box::into_raw(vec![0u64; words].into_boxed_slice()).cast::<u8>();
        // SAFETY: a live PD; the range lies inside the allocation, which outlives the
        // registration (deregistered in Drop before it is freed).
        let mr = unsafe {
            testing::reg_mr(pd, ptr.add(region.start), region.len(), testing::ALL_ACCESS)
        };
        AppMem { ptr, words, mr }
    }
    fn addr(&self, off: usize) -> u64 {
        self.ptr as u64 + off as u64
    }
    fn key(&self) -> u32 {
        // SAFETY: our live MR.
        unsafe { (*self.mr).lkey }
    }
    fn sge(&self, off: usize, len: u32) -> ibv_sge {
        ibv_sge {
            addr: self.addr(off),
            length: len,
            lkey: self.key(),
        }
    }
    /// Reads back what the device wrote (the device wrote on this thread, inside the post).
    fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.words * 8);
        // SAFETY: inside the allocation, through the registered pointer; no write races
        // (the device wrote during a post on this thread).
        (off..off + len)
            .map(|i| unsafe { self.ptr.add(i).read() })
            .collect()
    }
}

impl Drop for AppMem {
    fn drop(&mut self) {
        // SAFETY: our MR, deregistered once; then the allocation made in `new` is freed
        // through the same pointer.
        unsafe {
            assert_eq!(verbs_table().ibv_dereg_mr.unwrap()(self.mr), 0);
            drop(Box::from_raw(core::ptr::slice_from_raw_parts_mut(
                self.ptr.cast::<u64>(),
                self.words,
            )));
        }
    }
}

/// Posts one signaled WR on `qp` and polls its completion (and `extra` more) from `cq`.
fn run(qp: *mut ibv_qp, cq: *mut ibv_cq, wr: &mut ibv_send_wr, extra: i32) -> Vec<ibv_wc> {
    let mut bad = null_mut();
    wr.send_flags |= IBV_SEND_SIGNALED;
    let mut wc = [ibv_wc::default(); 4];
    // SAFETY: live QP and CQ; `wr` and its SGEs are valid; room for 4 completions.
    let n = unsafe {
        assert_eq!(inline::ibv_post_send(qp, wr, &mut bad), 0);
        inline::ibv_poll_cq(cq, 4, wc.as_mut_ptr())
    };
    assert_eq!(n, 1 + extra);
    let wc = wc[..n as usize].to_vec();
    for w in &wc {
        assert_eq!(w.status, IBV_WC_SUCCESS, "{:?}", w.wr_id);
    }
    wc
}

/// RDMA atomics return the original word into the local SGE from softnic's own buffer; a
/// UD receive gets its GRH from one; an RDMA WRITE and READ move registered bytes — every
/// one of these copies, run under miri, on memory the application holds as above.
#[test]
fn device_copies_into_application_memory() {
    let f = verbs_table();
    let (ctx, _) = testing::open_listed_device();
    let cap = ibv_qp_cap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    // SAFETY: every object below comes from the verb before it and lives to the end of the
    // test; the QPs are destroyed before the memory is deregistered.
    unsafe {
        let pd = testing::alloc_pd(ctx);
        let cq = testing::create_cq(ctx, 16);
        let gid = testing::query_gid(ctx, 1);
        let mem = AppMem::new(pd, 16);
        let (a, b) = (
            testing::create_qp(pd, IBV_QPT_RC, cq, cq, cap, null_mut()),
            testing::create_qp(pd, IBV_QPT_RC, cq, cq, cap, null_mut()),
        );
        testing::connect_qp(a, &ConnectAttr::new((*b).qp_num, gid));
        testing::connect_qp(b, &ConnectAttr::new((*a).qp_num, gid));

        // Fetch-and-add: word 1 += 5, its original (0) lands in word 0.
        let mut sge = mem.sge(0, 8);
        let mut wr = ibv_send_wr {
            opcode: IBV_WR_ATOMIC_FETCH_AND_ADD,
            sg_list: &mut sge,
            num_sge: 1,
            ..Default::default()
        };
        wr.wr.atomic.remote_addr = mem.addr(8);
        wr.wr.atomic.rkey = mem.key();
        wr.wr.atomic.compare_add = 5;
        run(a, cq, &mut wr, 0);
        assert_eq!(mem.bytes(8, 8), 5u64.to_ne_bytes());
        // Again: now the original is 5.
        run(a, cq, &mut wr, 0);
        assert_eq!(mem.bytes(0, 8), 5u64.to_ne_bytes());

        // RDMA WRITE of words 0..2 to bytes 19..35 (another phase), then READ them back
        // to bytes 40..56.
        let mut sge = mem.sge(0, 16);
        let mut wr = ibv_send_wr {
            opcode: IBV_WR_RDMA_WRITE,
            sg_list: &mut sge,
            num_sge: 1,
            ..Default::default()
        };
        wr.wr.rdma.remote_addr = mem.addr(19);
        wr.wr.rdma.rkey = mem.key();
        run(a, cq, &mut wr, 0);
        let mut sge = mem.sge(40, 16);
        wr.opcode = IBV_WR_RDMA_READ;
        wr.sg_list = &mut sge;
        run(a, cq, &mut wr, 0);
        assert_eq!(mem.bytes(19, 16), mem.bytes(0, 16));
        assert_eq!(mem.bytes(40, 16), mem.bytes(0, 16));

        // UD: the receive buffer gets the 40-byte GRH, then the payload.
        let (u, v) = (
            testing::create_qp(pd, IBV_QPT_UD, cq, cq, cap, null_mut()),
            testing::create_qp(pd, IBV_QPT_UD, cq, cq, cap, null_mut()),
        );
        testing::connect_qp(u, &ConnectAttr::new(0, gid));
        testing::connect_qp(v, &ConnectAttr::new(0, gid));
        let mut recv_sge = mem.sge(64, 48);
        let mut recv = ibv_recv_wr {
            wr_id: 1,
            sg_list: &mut recv_sge,
            num_sge: 1,
            ..Default::default()
        };
        let mut bad = null_mut();
        assert_eq!(inline::ibv_post_recv(v, &mut recv, &mut bad), 0);
        let mut attr = ibv_ah_attr {
            is_global: 1,
            port_num: 1,
            ..Default::default()
        };
        attr.grh.dgid = gid;
        attr.grh.sgid_index = 1;
        attr.grh.hop_limit = 1;
        let ah = f.ibv_create_ah.unwrap()(pd, &mut attr);
        assert!(!ah.is_null());
        let mut sge = mem.sge(0, 8);
        let mut wr = ibv_send_wr {
            opcode: IBV_WR_SEND,
            sg_list: &mut sge,
            num_sge: 1,
            ..Default::default()
        };
        wr.wr.ud.ah = ah;
        wr.wr.ud.remote_qpn = (*v).qp_num;
        wr.wr.ud.remote_qkey = 0;
        let wcs = run(u, cq, &mut wr, 1);
        assert!(wcs
            .iter()
            .any(|w| w.opcode == IBV_WC_RECV && w.byte_len == 48));
        assert_eq!(mem.bytes(64 + 40, 8), mem.bytes(0, 8));
        // The GRH area was written (for an IPv4 RoCE v2 GID: an IPv4 header in its last
        // 20 bytes).
        assert_ne!(mem.bytes(64, 40), vec![0u8; 40]);

        assert_eq!(f.ibv_destroy_ah.unwrap()(ah), 0);
        for qp in [a, b, u, v] {
            assert_eq!(f.ibv_destroy_qp.unwrap()(qp), 0);
        }
        drop(mem);
        assert_eq!(f.ibv_destroy_cq.unwrap()(cq), 0);
    }
}

/// Posts one signaled RDMA WRITE of `len` bytes from `src` (offset `from`) to `dst`'s
/// address `to` on `qp`, and polls its completion.
fn write(
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
    src: &AppMem,
    from: usize,
    dst: &AppMem,
    to: usize,
    len: u32,
) {
    let mut sge = src.sge(from, len);
    let mut wr = ibv_send_wr {
        opcode: IBV_WR_RDMA_WRITE,
        sg_list: &mut sge,
        num_sge: 1,
        ..Default::default()
    };
    wr.wr.rdma.remote_addr = dst.addr(to);
    wr.wr.rdma.rkey = dst.key();
    run(qp, cq, &mut wr, 0);
}

/// The one access rule (softnic/src/mem.rs, shared with `hotverbs::Mr`): every aligned
/// word wholly inside a memory region is accessed as an `AtomicU64`, whatever part of it
/// an operation covers; the region's ragged edges byte by byte.
///
/// 1. RDMA WRITEs of 3 bytes into the middle of an MR word race an application thread that
///    loads the word whole and merges its own bytes into the word's other 5 (as
///    `Mr::read_into` / `Mr::write_from` do under the rule): under miri, no mixed-size
///    race; and no side's bytes are lost.
/// 2. RDMA WRITEs to the ragged head and tail of an MR that starts and ends inside words
///    race plain application writes to the bytes of those words outside the MR: the
///    device touches none of them.
#[test]
fn device_partial_word_writes_meet_the_application_with_its_unit() {
    let f = verbs_table();
    let (ctx, _) = testing::open_listed_device();
    let cap = ibv_qp_cap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let rounds: u8 = if cfg!(miri) { 3 } else { 100 };
    // SAFETY: every object below comes from the verb before it and lives to the end of the
    // test; the QPs are destroyed before the memory is deregistered. The threads share the
    // memory as each step says.
    unsafe {
        let pd = testing::alloc_pd(ctx);
        let cq = testing::create_cq(ctx, 16);
        let gid = testing::query_gid(ctx, 1);
        let (a, b) = (
            testing::create_qp(pd, IBV_QPT_RC, cq, cq, cap, null_mut()),
            testing::create_qp(pd, IBV_QPT_RC, cq, cq, cap, null_mut()),
        );
        testing::connect_qp(a, &ConnectAttr::new((*b).qp_num, gid));
        testing::connect_qp(b, &ConnectAttr::new((*a).qp_num, gid));

        // 1. Word 1 (bytes 8..16) of `mem` is the target: the device writes bytes 10..13
        // from word 3 (bytes 24..27), the application the others.
        let mem = AppMem::new(pd, 4);
        let word = Shared(mem.ptr.add(8).cast::<u64>());
        let src = mem.ptr.add(24).cast::<u64>();
        let done = &AtomicBool::new(false);
        let app_mask = u64::from_ne_bytes([0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0xff]);
        let last = std::thread::scope(|s| {
            let app = s.spawn(move || {
                let word = word;
                let w = AtomicU64::from_ptr(word.0);
                let mut v = 0u8;
                while !done.load(Ordering::Acquire) {
                    let seen = w.load(Ordering::Relaxed).to_ne_bytes();
                    assert!(seen[2] == seen[3] && seen[3] == seen[4], "{seen:?}");
                    assert_eq!(seen[0], v, "{seen:?}");
                    v = v.wrapping_add(1);
                    let mine = u64::from_ne_bytes([v; 8]);
                    let mut cur = w.load(Ordering::Relaxed);
                    while let Err(now) = w.compare_exchange_weak(
                        cur,
                        (cur & !app_mask) | (mine & app_mask),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ) {
                        cur = now;
                    }
                    std::thread::yield_now();
                }
                v
            });
            for r in 1..=rounds {
                // Word 3 is this thread's alone (the device reads it inside the post).
                AtomicU64::from_ptr(src).store(u64::from_ne_bytes([r; 8]), Ordering::Relaxed);
                write(a, cq, &mem, 24, &mem, 10, 3);
            }
            done.store(true, Ordering::Release);
            app.join().unwrap()
        });
        let v = last;
        assert_eq!(mem.bytes(8, 8), [v, v, rounds, rounds, rounds, v, v, v]);

        // 2. An MR over bytes 3..29 of four words: bytes 3..8 and 24..29 are its ragged
        // edges; the application writes bytes 0..3 and 29..32 plainly meanwhile.
        let edge = AppMem::registering(pd, 4, 3..29);
        let base = Shared(edge.ptr);
        std::thread::scope(|s| {
            s.spawn(move || {
                let base = base;
                for r in 1..=rounds {
                    for i in (0..3).chain(29..32) {
                        // Outside the MR: the device never touches these bytes.
                        base.0.add(i).write(r);
                    }
                    std::thread::yield_now();
                }
            });
            for r in 1..=rounds {
                AtomicU64::from_ptr(src).store(u64::from_ne_bytes([r; 8]), Ordering::Relaxed);
                // Each edge from a source in the same phase, then in another.
                write(a, cq, &mem, 27, &edge, 3, 5);
                write(a, cq, &mem, 26, &edge, 3, 5);
                write(a, cq, &mem, 24, &edge, 24, 5);
                write(a, cq, &mem, 25, &edge, 24, 5);
            }
        });
        let r = rounds;
        assert_eq!(edge.bytes(0, 8), [r, r, r, r, r, r, r, r]);
        assert_eq!(edge.bytes(24, 8), [r, r, r, r, r, r, r, r]);

        for qp in [a, b] {
            assert_eq!(f.ibv_destroy_qp.unwrap()(qp), 0);
        }
        drop(edge);
        drop(mem);
        assert_eq!(f.ibv_destroy_cq.unwrap()(cq), 0);
    }
}
