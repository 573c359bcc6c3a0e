//! Thread safety as in real verbs: posting on one thread while another polls.

mod common;
use common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const N: u64 = 20_000;
const DEPTH: u64 = 16;
const EVERY: u64 = 4;

/// Poster thread posts RDMA WRITEs with selective signaling and never exceeds the SQ depth;
/// the poller thread retires slots from signaled completions. Every signaled WR completes,
/// in order, successfully; no post fails.
#[test]
fn post_and_poll_on_two_threads() {
    let p = Pair::with(IBV_QPT_RC, DEPTH as u32, 7);
    let retired = Arc::new(AtomicU64::new(0));
    let (qp, cq) = (p.a as usize, p.cq_a as usize);
    let (src, lkey, dst, rkey) = (
        p.buf_a.addr(),
        p.buf_a.lkey(),
        p.buf_b.addr(),
        p.buf_b.rkey(),
    );

    let r2 = retired.clone();
    let poller = std::thread::spawn(move || {
        let cq = cq as *mut ibv_cq;
        let mut expect = EVERY - 1;
        let mut wc = [ibv_wc::default(); 8];
        while expect < N {
            let n = poll(cq, &mut wc);
            assert!(n >= 0);
            for w in &wc[..n as usize] {
                assert_eq!(w.status, IBV_WC_SUCCESS);
                assert_eq!(w.wr_id, expect, "signaled completions in order");
                expect += EVERY;
                // Pairs with the poster's Acquire load: the slots up to wr_id are free.
                r2.store(w.wr_id + 1, Ordering::Release);
            }
            std::thread::yield_now();
        }
    });
    let poster = std::thread::spawn(move || {
        let qp = qp as *mut ibv_qp;
        let mut sge = [ibv_sge {
            addr: src,
            length: 8,
            lkey,
        }];
        for i in 0..N {
            while i - retired.load(Ordering::Acquire) >= DEPTH {
                std::thread::yield_now();
            }
            let flags = if i % EVERY == EVERY - 1 {
                IBV_SEND_SIGNALED
            } else {
                0
            };
            let mut wr = rdma(
                send_wr(i, IBV_WR_RDMA_WRITE, &mut sge, flags),
                dst + (i % 64) * 8,
                rkey,
            );
            assert_eq!(post(qp, &mut wr), 0, "post {i}");
        }
    });
    poster.join().unwrap();
    poller.join().unwrap();
}

/// A sender thread SENDs (inline, sequence numbers) while the receiver thread polls its CQ
/// and re-posts receives; with rnr_retry 7 sends wait for receives instead of failing.
/// Every message arrives once, in order.
#[test]
fn send_while_receiver_reposts() {
    const M: u64 = 5_000;
    let p = Pair::with(IBV_QPT_RC, 64, 7);
    let (a, b, cq_a, cq_b) = (p.a as usize, p.b as usize, p.cq_a as usize, p.cq_b as usize);
    let (rbuf, rkey_l) = (p.buf_b.addr(), p.buf_b.lkey());
    let receiver = std::thread::spawn(move || {
        let (b, cq) = (b as *mut ibv_qp, cq_b as *mut ibv_cq);
        let post_slot = |slot: u64| {
            let mut s = [ibv_sge {
                addr: rbuf + slot * 8,
                length: 8,
                lkey: rkey_l,
            }];
            assert_eq!(post_recv(b, slot, &mut s), 0);
        };
        for slot in 0..16 {
            post_slot(slot);
        }
        let mut next = 0u64;
        let mut wc = [ibv_wc::default(); 8];
        while next < M {
            let n = poll(cq, &mut wc);
            assert!(n >= 0);
            if n == 0 {
                std::thread::yield_now();
            }
            for w in &wc[..n as usize] {
                assert_eq!(w.status, IBV_WC_SUCCESS);
                // SAFETY: slot wr_id (8 bytes, wr_id < 16) of the receive buffer, which
                // outlives the threads; its receive completed, so the device is done
                // with it until the slot is posted again below.
                let v = unsafe { core::ptr::read_volatile((rbuf + w.wr_id * 8) as *const u64) };
                assert_eq!(v, next, "message order");
                next += 1;
                post_slot(w.wr_id);
            }
        }
    });
    let sender = std::thread::spawn(move || {
        let (a, cq) = (a as *mut ibv_qp, cq_a as *mut ibv_cq);
        let mut outstanding = 0u64;
        let mut wc = [ibv_wc::default(); 8];
        for i in 0..M {
            while outstanding >= 32 {
                let n = poll(cq, &mut wc);
                if n == 0 {
                    std::thread::yield_now();
                }
                for w in &wc[..n as usize] {
                    assert_eq!(w.status, IBV_WC_SUCCESS);
                    outstanding -= 8;
                }
            }
            let mut val = i;
            let mut s = [ibv_sge {
                addr: &mut val as *mut u64 as u64,
                length: 8,
                lkey: 0,
            }];
            let flags = IBV_SEND_INLINE | if i % 8 == 7 { IBV_SEND_SIGNALED } else { 0 };
            let mut wr = send_wr(i, IBV_WR_SEND, &mut s, flags);
            assert_eq!(post(a, &mut wr), 0);
            outstanding += 1;
        }
    });
    sender.join().unwrap();
    receiver.join().unwrap();
}
