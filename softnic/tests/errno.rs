//! `errno` as the verbs define it: softnic's entry points leave it untouched where the verb
//! does not define it (`ibv_post_send(3)`, `ibv_post_recv(3)`, `ibv_poll_cq(3)` return their
//! result; rxe G1), whatever softnic's internal locking and system calls did, and set it
//! where the verb does (`ibv_get_cq_event(3)` on an empty non-blocking channel: EAGAIN).

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const SENTINEL: i32 = 4242;

fn errno() -> i32 {
    hotverbs_ffi::errno()
}

/// Posts one signaled inline RDMA WRITE a -> b and returns post_send's result.
fn write_one(p: &Pair, wr_id: u64) -> i32 {
    write_on(p.a, &p.buf_b, wr_id)
}

fn write_on(qp: *mut ibv_qp, dst: &Buf, wr_id: u64) -> i32 {
    let src = (wr_id as u8).to_le_bytes();
    let mut sge = [ibv_sge {
        addr: src.as_ptr() as u64,
        length: 1,
        lkey: 0,
    }];
    let mut wr = rdma(
        send_wr(
            wr_id,
            IBV_WR_RDMA_WRITE,
            &mut sge,
            IBV_SEND_SIGNALED | IBV_SEND_INLINE,
        ),
        dst.addr() + (wr_id % 64),
        dst.rkey(),
    );
    post(qp, &mut wr)
}

/// Deterministic: a system call softnic makes inside `post_send` fails (the completion
/// channel's pipe is full, so waking it gives EAGAIN), yet the caller's `errno` is the one
/// it had before the call, on success and on a rejected post alike; `poll_cq` likewise.
#[test]
fn internal_syscall_failures_do_not_leak_into_errno() {
    let dev = Dev::new();
    let f = fns();
    // SAFETY: dev.ctx is live for the whole test.
    let ch = unsafe { f.ibv_create_comp_channel.unwrap()(dev.ctx) };
    assert!(!ch.is_null());
    // SAFETY: ch is live.
    let fd = unsafe { (*ch).fd };
    // Shrinking the pipe we own to one page (the minimum) makes it fill after 4096
    // one-byte wake-ups.
    // SAFETY: fcntl on our own descriptor.
    let size = unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, 4096) };
    assert!(size >= 4096, "F_SETPIPE_SZ failed: errno {}", errno());
    // SAFETY: live context and channel; the CQ context is an opaque tag.
    let cq = unsafe { f.ibv_create_cq.unwrap()(dev.ctx, 16, null_mut(), ch, 0) };
    assert!(!cq.is_null());
    let cq_b = dev.cq(16);
    let a = dev.qp(IBV_QPT_RC, cq, cq, cap(16));
    let b = dev.qp(IBV_QPT_RC, cq_b, cq_b, cap(16));
    connect(a, dev.ctx, qpn(b), ALL_ACCESS, 7);
    connect(b, dev.ctx, qpn(a), ALL_ACCESS, 7);
    let dst = dev.buf(4096, ALL_ACCESS);

    // Fill the pipe: one event per armed completion, never read.
    let mut wc = [ibv_wc::default(); 4];
    let mut i = 0u64;
    let mut full = false;
    while !full {
        assert_eq!(req_notify(cq, false), 0);
        set_errno(SENTINEL);
        assert_eq!(write_on(a, &dst, i), 0, "post {i}");
        assert_eq!(
            errno(),
            SENTINEL,
            "ibv_post_send (success) changed errno at {i}"
        );
        assert_eq!(poll(cq, &mut wc), 1);
        assert_eq!(errno(), SENTINEL, "ibv_poll_cq changed errno at {i}");
        i += 1;
        // Once the pipe holds `size` bytes, every further wake-up fails with EAGAIN.
        full = i as i32 > size + 8;
    }
    // A rejected post (4 SGEs allowed, 5 given) after a failing wake-up attempt still
    // leaves errno alone.
    let mut sges = [ibv_sge::default(); 5];
    let mut wr = send_wr(9, IBV_WR_SEND, &mut sges, IBV_SEND_SIGNALED);
    set_errno(SENTINEL);
    assert_eq!(post(a, &mut wr), libc::EINVAL);
    assert_eq!(errno(), SENTINEL, "ibv_post_send (rejected) changed errno");
    let mut r = [ibv_sge::default(); 5];
    set_errno(SENTINEL);
    assert_eq!(post_recv(b, 1, &mut r), libc::EINVAL);
    assert_eq!(errno(), SENTINEL, "ibv_post_recv (rejected) changed errno");
}

/// Where the verb defines errno it is set: `ibv_get_cq_event` on a non-blocking channel
/// with no event reports EAGAIN (ibv_get_cq_event(3) with O_NONBLOCK).
#[test]
fn get_cq_event_sets_eagain_on_an_empty_nonblocking_channel() {
    let dev = Dev::new();
    let f = fns();
    // SAFETY: dev.ctx is live.
    let ch = unsafe { f.ibv_create_comp_channel.unwrap()(dev.ctx) };
    assert!(!ch.is_null());
    // SAFETY: ch is live.
    let fd = unsafe { (*ch).fd };
    // SAFETY: fcntl on our own descriptor.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    assert_eq!(
        // SAFETY: fcntl on our own descriptor.
        unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) },
        0
    );
    let mut cq = null_mut();
    let mut ctx = null_mut();
    set_errno(SENTINEL);
    // SAFETY: live channel, writable out-pointers.
    let r = unsafe { f.ibv_get_cq_event.unwrap()(ch, &mut cq, &mut ctx) };
    assert_eq!(r, -1);
    assert_eq!(errno(), libc::EAGAIN);
}

/// Under contention: three threads hammer softnic (posts, polls, queries) while a fourth
/// checks, after each of its own successful and failing `post_send`/`post_recv`/`poll_cq`,
/// that errno still holds the sentinel it set before the call. The fabric mutex's futex
/// wait fails with EAGAIN when contended; that must never reach the caller. Bounded by
/// iteration counts, not by time.
#[test]
fn errno_stays_put_under_contention() {
    const CHECKS: u64 = 20_000;
    let stop = Arc::new(AtomicBool::new(false));
    // Everyone starts hammering together once set up (no thread's setup overlaps the
    // checks alone), and each hammer runs at least one round whatever the scheduler does.
    let start = Arc::new(std::sync::Barrier::new(4));
    let mut hammers = Vec::new();
    for t in 0..3u64 {
        let (stop, start) = (stop.clone(), start.clone());
        hammers.push(std::thread::spawn(move || {
            let p = Pair::with(IBV_QPT_RC, 16, 7);
            let mut wc = [ibv_wc::default(); 16];
            let mut gid = ibv_gid::default();
            let mut n = 0u64;
            start.wait();
            while n == 0 || !stop.load(Ordering::Relaxed) {
                assert_eq!(write_one(&p, n), 0);
                while poll(p.cq_a, &mut wc) == 0 {}
                // SAFETY: live context; writable out-pointer.
                let q =
                    unsafe { fns().ibv_query_gid.unwrap()(p.dev.ctx, 1, (t % 2) as i32, &mut gid) };
                assert_eq!(q, 0);
                n += 1;
            }
            n
        }));
    }
    let p = Pair::with(IBV_QPT_RC, 16, 7);
    let mut wc = [ibv_wc::default(); 4];
    start.wait();
    for i in 0..CHECKS {
        set_errno(SENTINEL);
        assert_eq!(write_one(&p, i), 0);
        assert_eq!(
            errno(),
            SENTINEL,
            "ibv_post_send (success) changed errno at {i}"
        );
        loop {
            set_errno(SENTINEL);
            let n = poll(p.cq_a, &mut wc);
            assert_eq!(errno(), SENTINEL, "ibv_poll_cq changed errno at {i}");
            if n == 1 {
                break;
            }
            assert_eq!(n, 0);
        }
        // Rejected: too many SGEs on the send queue and on the receive queue.
        let mut sges = [ibv_sge::default(); 5];
        let mut wr = send_wr(i, IBV_WR_SEND, &mut sges, 0);
        set_errno(SENTINEL);
        assert_eq!(post(p.a, &mut wr), libc::EINVAL);
        assert_eq!(
            errno(),
            SENTINEL,
            "ibv_post_send (rejected) changed errno at {i}"
        );
        let mut r = [ibv_sge::default(); 5];
        set_errno(SENTINEL);
        assert_eq!(post_recv(p.b, i, &mut r), libc::EINVAL);
        assert_eq!(
            errno(),
            SENTINEL,
            "ibv_post_recv (rejected) changed errno at {i}"
        );
        // Accepted receive (one zero-length SGE), consumed by nothing: the RQ has room for
        // 16, so post and immediately check.
        if i % 2048 == 0 {
            let mut ok = [p.buf_b.sge(0, 0)];
            set_errno(SENTINEL);
            assert_eq!(post_recv(p.b, i, &mut ok), 0);
            assert_eq!(
                errno(),
                SENTINEL,
                "ibv_post_recv (success) changed errno at {i}"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds: Vec<u64> = hammers.into_iter().map(|h| h.join().unwrap()).collect();
    eprintln!("hammer rounds beside {CHECKS} checks: {rounds:?}");
}

use core::ptr::null_mut;

fn set_errno(v: i32) {
    hotverbs_ffi::set_errno(v);
}
