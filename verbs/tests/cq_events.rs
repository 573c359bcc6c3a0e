//! Completion events against the CQ's lifetime (`verbs/src/cq.rs`, "Invariants"): the
//! event word behind `cq_context` stays put while the `Cq` moves, outlives every
//! `get_cq_event` that counts into it, even one racing the last `Cq`'s drop on another
//! thread, and outlives a CQ whose destruction failed.
//!
//! The events come from a raw softnic QP in the error state (each receive posted to it
//! completes at once with a flush), so no test here needs a clock and all run under miri
//! with no MIRIFLAGS: `cargo +nightly miri test -p hotverbs --test cq_events`.

use std::sync::Barrier;

use hotverbs::{CompChannel, Context, Cq, Pd};
use hotverbs_ffi::*;
use hotverbs_softnic::{testing, verbs_table};

/// A raw softnic RC QP in the error state on `cq`: every receive posted to it completes at
/// once with `IBV_WC_WR_FLUSH_ERR` (on an Rxe-profile device, at the ERR -> ERR that
/// `complete` then makes) — a completion, hence an event, on demand. Destroyed on
/// drop (a QP keeps its CQ from being destroyed).
struct Flusher(*mut ibv_qp);

impl Flusher {
    fn new(pd: &Pd, cq: &Cq) -> Flusher {
        let cap = ibv_qp_cap {
            max_send_wr: 1,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        // SAFETY: pd and cq are live hotverbs objects of one softnic context; the QP is
        // destroyed in Drop or by the test, before them.
        unsafe {
            let qp = testing::create_qp(
                pd.as_raw(),
                IBV_QPT_RC,
                cq.as_raw(),
                cq.as_raw(),
                cap,
                std::ptr::null_mut(),
            );
            let gid = testing::query_gid(pd.context().as_raw(), 1);
            testing::qp_to_init(qp, &testing::ConnectAttr::new(0, gid));
            let mut attr = ibv_qp_attr {
                qp_state: IBV_QPS_ERR,
                ..Default::default()
            };
            testing::must_modify_qp(qp, &mut attr, IBV_QP_STATE);
            Flusher(qp)
        }
    }

    /// One flushed receive: one completion on the CQ.
    fn complete(&self) {
        let mut wr = ibv_recv_wr::default();
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live QP; a valid single receive WR with no SGEs.
        let rc = unsafe { inline::ibv_post_recv(self.0, &mut wr, &mut bad) };
        assert_eq!(rc, 0);
        // SAFETY: a live QP of a live softnic context.
        let profile = unsafe { hotverbs_softnic::device_profile((*self.0).context) };
        if profile == hotverbs_softnic::Profile::Rxe {
            // rxe G9: a receive posted in ERR completes only at the next ERR -> ERR.
            let mut attr = ibv_qp_attr {
                qp_state: IBV_QPS_ERR,
                ..Default::default()
            };
            // SAFETY: as above.
            unsafe { testing::must_modify_qp(self.0, &mut attr, IBV_QP_STATE) };
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        let destroy = verbs_table().ibv_destroy_qp.expect("ibv_destroy_qp");
        // SAFETY: our QP, destroyed once.
        assert_eq!(unsafe { destroy(self.0) }, 0);
    }
}

fn setup() -> (Context, Pd, CompChannel) {
    let ctx = Context::open("softnic").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    (ctx, pd, ch)
}

/// The CQ's handle moves (into its `Arc`, out of this function, into a Vec) before the
/// event is counted: the word `cq_context` points to must not move or be retagged with it
/// (miri flagged the old `Box` field: Stacked Borrows at the count, Tree Borrows at the
/// destroy). Counting, acknowledging, and the drop acknowledging the rest.
#[test]
fn events_count_into_a_word_that_does_not_move_with_the_cq() {
    let (ctx, pd, ch) = setup();
    let make = || ctx.create_cq(4, Some(&ch)).unwrap();
    let mut cqs = vec![make()];
    let cq = cqs.pop().unwrap();
    let flusher = Flusher::new(&pd, &cq);
    for _ in 0..2 {
        cq.req_notify(false).unwrap();
        flusher.complete();
        let ev = ch.get_cq_event().unwrap();
        assert!(ev.is_for(&cq));
    }
    assert_eq!(cq.unacked_events(), 2);
    cq.ack_events(1);
    assert_eq!(cq.unacked_events(), 1);
    // Acknowledging more than were taken is clamped.
    cq.ack_events(5);
    assert_eq!(cq.unacked_events(), 0);
    // One left unacknowledged: the destruction acknowledges it (and does not wait for it).
    cq.req_notify(false).unwrap();
    flusher.complete();
    assert!(ch.get_cq_event().unwrap().is_for(&cq));
    assert_eq!(cq.unacked_events(), 1);
    drop(flusher);
    cq.destroy().unwrap();
}

/// `get_cq_event` on one thread while the last `Cq` is dropped on another (all safe code).
/// Whichever wins, the event is acknowledged exactly once, the destruction neither fails
/// nor hangs, and the word is not freed under the taker (miri flagged a race between the
/// count and the deallocation, a use-after-free on softnic). Natively the rounds give the
/// interleavings a chance; under miri, `-Zmiri-many-seeds` explores more of them.
#[test]
fn last_cq_dropped_while_another_thread_takes_its_event() {
    let rounds = if cfg!(miri) { 2 } else { 200 };
    let (ctx, pd, ch) = setup();
    for _ in 0..rounds {
        let cq = ctx.create_cq(4, Some(&ch)).unwrap();
        let raw = cq.as_raw();
        {
            let flusher = Flusher::new(&pd, &cq);
            cq.req_notify(false).unwrap();
            flusher.complete();
        }
        // The event waits in the channel; the CQ's last handle is `cq`.
        let start = Barrier::new(2);
        std::thread::scope(|s| {
            let taker = s.spawn(|| {
                start.wait();
                // The address only (a CqEvent's raw pointer does not cross threads).
                ch.get_cq_event().map(|ev| ev.cq_raw() as usize)
            });
            start.wait();
            cq.destroy()
                .expect("ibv_destroy_cq neither fails nor hangs");
            match taker.join().unwrap() {
                // Taken before the destruction dropped it: acknowledged (by the
                // destruction, or by get_cq_event itself if it counted after).
                Ok(cq) => assert_eq!(cq, raw as usize),
                // The destruction dropped the queued event first: the fd's byte is left
                // without an event (libibverbs' channel read can fail the same way).
                Err(e) => assert_eq!(e.errno(), libc::EAGAIN, "{e}"),
            }
        });
    }
    drop(ch);
}

/// A destruction that fails leaves the CQ alive, so its word must stay too: an event for
/// that CQ later must not count into freed memory (miri: use-after-free before the fix).
/// The CQ is kept busy by a QP created outside hotverbs.
#[test]
fn a_failed_destroy_leaves_the_word_to_the_living_cq() {
    let (ctx, pd, ch) = setup();
    let cq = ctx.create_cq(4, Some(&ch)).unwrap();
    let raw = cq.as_raw();
    let flusher = Flusher::new(&pd, &cq);
    let e = cq.destroy().unwrap_err();
    assert_eq!(e.errno(), libc::EBUSY, "{e}");
    // The CQ is alive and leaked; arm it through the raw verb and raise an event.
    // SAFETY: the CQ is live (its destruction failed) and stays so (never destroyed).
    assert_eq!(unsafe { inline::ibv_req_notify_cq(raw, 0) }, 0);
    flusher.complete();
    let ev = ch.get_cq_event().unwrap();
    assert_eq!(ev.cq_raw(), raw);
    // Its destruction began, so get_cq_event acknowledged the event itself.
    // SAFETY: as above.
    assert_eq!(unsafe { (*raw).comp_events_completed }, 1);
    drop(flusher);
}
