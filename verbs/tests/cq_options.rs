//! `Context::create_cq_with` and `CqOptions` (`verbs/src/cq.rs`): the completion vector is
//! checked against the context's `num_comp_vectors` before the verb, and the application's
//! `user_context` comes back on every `CqEvent` for the CQ and from `Cq::user_context`,
//! while `cq_context` itself stays hotverbs' event word (events are still counted and
//! acknowledged, so the CQs can be destroyed).
//!
//! The events come from softnic QPs in the error state (each receive posted completes at
//! once with a flush; on an Rxe-profile device at the ERR -> ERR that follows it), so
//! nothing here needs a clock or a peer.

use std::time::Duration;

use hotverbs::{Context, Cq, CqOptions, InitAttr, Pd, Qp, QpBuilder, QpType, SoftnicConfig};

const T: Duration = Duration::from_secs(5);

/// A QP in the error state on `cq`: every receive posted to it completes at once.
fn flusher(pd: &Pd, cq: &Cq) -> Qp {
    let qp = QpBuilder::new(pd, cq, cq, QpType::Rc)
        .max_recv_wr(4)
        .build()
        .unwrap();
    qp.to_init(&InitAttr::default()).unwrap();
    qp.to_error().unwrap();
    qp
}

/// The next event of `ch`, which must be pending: `wait_cq_event` with a timeout (never
/// hangs), or under miri, which has no `poll(2)`, the plain read of `get_cq_event` (a
/// missing event is then miri's deadlock error, not a hang).
fn next_event(ch: &hotverbs::CompChannel) -> hotverbs::CqEvent {
    if cfg!(miri) {
        ch.get_cq_event().unwrap()
    } else {
        ch.wait_cq_event(T).unwrap().expect("an event")
    }
}

/// One flushed receive: one completion (and, if armed, one event) on the QP's CQ.
fn complete(qp: &Qp) {
    // SAFETY: no SGEs: no memory is involved.
    unsafe { qp.post_recv(1, &[]).unwrap() };
    // SAFETY: a live QP of a live softnic context.
    let profile = unsafe { hotverbs_softnic::device_profile((*qp.as_raw()).context) };
    if profile == hotverbs_softnic::Profile::Rxe {
        // rxe G9: a receive posted in ERR completes only at the next ERR -> ERR.
        qp.to_error().unwrap();
    }
}

fn softnic_with_vectors(name: &str, n: u32) -> Context {
    Context::open_softnic_with(SoftnicConfig {
        name: name.into(),
        num_comp_vectors: n,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn events_carry_each_cqs_user_context() {
    let ctx = softnic_with_vectors("softnic-cq-options", 2);
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let a = ctx
        .create_cq_with(
            8,
            Some(&ch),
            CqOptions {
                comp_vector: 1,
                user_context: 0xA11CE,
            },
        )
        .unwrap();
    let b = ctx
        .create_cq_with(
            8,
            Some(&ch),
            CqOptions {
                comp_vector: 0,
                user_context: u64::MAX,
            },
        )
        .unwrap();
    assert_eq!((a.comp_vector(), a.user_context()), (1, 0xA11CE));
    assert_eq!((b.comp_vector(), b.user_context()), (0, u64::MAX));
    let (qa, qb) = (flusher(&pd, &a), flusher(&pd, &b));

    for round in 0..3 {
        a.req_notify(false).unwrap();
        b.req_notify(false).unwrap();
        // b first, then a: the events arrive in that order and say whose they are.
        complete(&qb);
        complete(&qa);
        for (want, cq) in [(u64::MAX, &b), (0xA11CE, &a)] {
            let ev = next_event(&ch);
            assert!(ev.is_for(cq), "round {round}");
            assert_eq!(ev.user_context(), want, "round {round}");
            // The event is still counted against its CQ (the word kept its job).
            assert_eq!(cq.unacked_events(), 1);
            cq.ack_events(1);
            assert_eq!(cq.unacked_events(), 0);
        }
        let mut wc = [hotverbs::Wc::default(); 4];
        assert_eq!(a.poll(&mut wc).unwrap(), 1);
        assert_eq!(b.poll(&mut wc).unwrap(), 1);
    }

    // An event left unacknowledged is acknowledged by the destroy, as before.
    a.req_notify(false).unwrap();
    complete(&qa);
    let ev = next_event(&ch);
    assert_eq!(ev.user_context(), 0xA11CE);
    drop((qa, qb));
    a.destroy().unwrap();
    b.destroy().unwrap();
    ch.destroy().unwrap();
}

#[test]
fn comp_vector_must_be_below_num_comp_vectors() {
    let one = Context::open("softnic").unwrap();
    assert_eq!(one.num_comp_vectors(), 1);
    let e = one
        .create_cq_with(
            8,
            None,
            CqOptions {
                comp_vector: 1,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_create_cq", libc::EINVAL));
    let msg = e.to_string();
    // Our check, before the verb: it names the device and the range.
    assert!(
        msg.contains("comp_vector 1") && msg.contains("num_comp_vectors"),
        "{msg}"
    );
    assert!(msg.contains("softnic") && msg.contains("0..1"), "{msg}");

    let four = softnic_with_vectors("softnic-cq-vectors", 4);
    assert_eq!(four.num_comp_vectors(), 4);
    for v in 0..4 {
        let cq = four
            .create_cq_with(
                8,
                None,
                CqOptions {
                    comp_vector: v,
                    user_context: v.into(),
                },
            )
            .unwrap();
        assert_eq!((cq.comp_vector(), cq.user_context()), (v, v.into()));
    }
    for v in [4, u32::MAX] {
        let e = four
            .create_cq_with(
                8,
                None,
                CqOptions {
                    comp_vector: v,
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert_eq!(
            (e.verb(), e.errno()),
            ("ibv_create_cq", libc::EINVAL),
            "{v}"
        );
        assert!(e.to_string().contains("0..4"), "{e}");
    }
}

#[test]
fn create_cq_is_vector_zero_without_a_user_context() {
    let ctx = Context::open("softnic").unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(8, Some(&ch)).unwrap();
    assert_eq!((cq.comp_vector(), cq.user_context()), (0, 0));
    let pd = ctx.alloc_pd().unwrap();
    let qp = flusher(&pd, &cq);
    cq.req_notify(false).unwrap();
    complete(&qp);
    let ev = ch.wait_cq_event(T).unwrap().expect("an event");
    assert!(ev.is_for(&cq));
    assert_eq!(ev.user_context(), 0);
    cq.ack_events(1);
}
