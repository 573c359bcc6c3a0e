//! Posting and the QP's state (issue 28 items 5, 6, 7), on softnic, with no `unsafe`:
//! refused posts name the state they were refused in and what to do (rings through
//! `explain`, a receive ring's `fill` itself, the setup layer's posts); the inline hints say
//! why no safe call sends from a registered buffer; `Qp::post_send_inline` posts inline
//! bytes safely; receives filled in INIT (`Qp::init`) are there for the first message, and
//! `connect` keeps a QP in INIT as it is, through a ring's recovery too.
//!
//! Every test passes under both softnic profiles (`HOTVERBS_SOFTNIC_PROFILE=rxe`: a post
//! refused before RTS names no WR, and the ring counts it posted until a reset).

use std::time::Duration;

use hotverbs::*;

const T: Duration = Duration::from_secs(5);

struct Setup {
    ctx: Context,
    pd: Pd,
    cq: Cq,
}

fn setup() -> Setup {
    let ctx = Context::open("softnic").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    Setup { ctx, pd, cq }
}

fn rc_on(s: &Setup, cq: &Cq) -> Qp {
    QpBuilder::new(&s.pd, cq, cq, QpType::Rc)
        .max_send_wr(32)
        .max_recv_wr(32)
        .max_inline_data(64)
        .build()
        .unwrap()
}

fn rc(s: &Setup) -> Qp {
    rc_on(s, &s.cq)
}

fn port(s: &Setup) -> PortInfo {
    s.ctx.port_info(None, None).unwrap()
}

/// RNR is reported at the first refusal (softnic has no timers; rxe would wait one RNR
/// timer): a message that finds no receive fails instead of waiting for one.
fn no_rnr_retry() -> ConnectOptions {
    ConnectOptions {
        rnr_retry: 0,
        ..ConnectOptions::default()
    }
}

fn post_error(e: SendError) -> PostError {
    match e {
        SendError::Post(p) => p,
        other => panic!("expected a refused post, got {other}"),
    }
}

/// Polls `cq` until `want` completions came, handing each to `tx` or `rx`; returns the
/// received messages and the send ring's completion results.
fn pump<const N: usize, const M: usize>(
    cq: &Cq,
    tx: &mut SendRing<'_, N>,
    rx: &mut RecvRing<'_, M>,
    want: usize,
) -> (Vec<Vec<u8>>, Vec<std::result::Result<u64, WcError>>) {
    let mut poller = cq.poller::<16>().unwrap();
    let (mut got, mut sent) = (Vec::new(), Vec::new());
    let deadline = std::time::Instant::now() + T;
    while got.len() + sent.len() < want {
        assert!(std::time::Instant::now() < deadline, "timed out: {sent:?}");
        for c in poller.poll().unwrap() {
            if c.ring() == tx.ring_id() {
                sent.push(tx.on_completion(c));
            } else {
                let m = rx.on_completion(c).unwrap();
                got.push(rx.data(&m).unwrap().to_vec());
                rx.release(m).unwrap();
            }
        }
    }
    (got, sent)
}

// ---- item 5: errors that know the state --------------------------------------------------

/// A ring's post refused in RESET or INIT: the datapath's error says only "the QP state
/// does not allow posting"; the ring's `explain` queries the state and names it.
#[test]
fn a_ring_post_refused_before_rts_names_the_state() {
    let s = setup();
    for (state, want) in [
        (QpState::Reset, "QP is in RESET: connect it first"),
        (QpState::Init, "QP is in INIT: sends need RTS"),
    ] {
        let qp = rc(&s);
        if state == QpState::Init {
            qp.init(&port(&s), &ConnectOptions::default()).unwrap();
        }
        assert_eq!(qp.state().unwrap(), state);
        let mut tx = qp
            .send_ring::<16>(SendConfig::new(0, 16, 64).signal_every(1))
            .unwrap();
        let e = tx.send_now(Msg::send(Local::Inline(b"early"))).unwrap_err();
        let p = post_error(e);
        assert_eq!((p.verb, p.errno), ("ibv_post_send", libc::EINVAL), "{p}");
        let x = tx.explain(&e);
        assert_eq!(
            (x.verb(), x.errno()),
            ("ibv_post_send", libc::EINVAL),
            "{x}"
        );
        let msg = x.to_string();
        assert!(msg.contains(want), "{state:?}: {msg}");
        assert!(
            !msg.contains("does not allow posting"),
            "the state is named, not guessed: {msg}"
        );
        if p.first_rejected == PostError::UNKNOWN {
            // rxe: queued anyway; the hint gives the ring's way out.
            assert!(msg.contains("SendRing::reset_qp()"), "{msg}");
        }
    }
}

/// After an error completion the ring refuses every message (`QpError`); `explain` says
/// the QP is in ERR and names the recovery, which works.
#[test]
fn a_failed_ring_names_err_and_the_recovery() {
    let s = setup();
    let (a, b) = (rc(&s), rc(&s));
    let opts = ConnectOptions::default();
    Qp::connect_pair(&a, &b, &port(&s), &opts).unwrap();
    let mut region = s.pd.alloc_mr(4 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut tx = a
        .send_ring::<16>(SendConfig::new(0, 16, 64).signal_every(1))
        .unwrap();
    let mut rx = b
        .recv_ring::<4>(&mut region, 0, RecvConfig::new(0, 64, 4))
        .unwrap();
    rx.fill().unwrap();
    a.to_error().unwrap();
    // Posting in ERR is accepted and flushed.
    tx.send_now(Msg::send(Local::Inline(b"lost"))).unwrap();
    let (_, sent) = pump(&s.cq, &mut tx, &mut rx, 1);
    assert_eq!(sent, [Err(WcError::WrFlush)]);
    let e = tx.send_now(Msg::send(Local::Inline(b"more"))).unwrap_err();
    assert!(matches!(e, SendError::QpError(_)), "{e}");
    let x = tx.explain(&e);
    assert_eq!((x.verb(), x.errno()), ("SendRing", libc::EIO), "{x}");
    let msg = x.to_string();
    assert!(
        msg.contains("QP is in ERR: reset_qp() on its ring") && msg.contains("IBV_WC_WR_FLUSH_ERR"),
        "{msg}"
    );
    // The recovery it names.
    tx.reset_qp().unwrap();
    a.connect(&port(&s), &b.endpoint(&port(&s)), &opts).unwrap();
    tx.send_now(Msg::send(Local::Inline(b"back"))).unwrap();
    let (got, sent) = pump(&s.cq, &mut tx, &mut rx, 2);
    assert_eq!(got, [b"back".to_vec()]);
    assert!(sent[0].is_ok(), "{sent:?}");
}

/// The setup layer's send post says the same, from the device's state.
#[test]
fn a_setup_post_in_reset_says_connect_it_first() {
    let s = setup();
    let qp = rc(&s);
    let e = qp
        .post_send_inline(&SendWr::send_inline(1, b"early"))
        .unwrap_err();
    assert_eq!(
        (e.verb(), e.errno()),
        ("ibv_post_send", libc::EINVAL),
        "{e}"
    );
    assert!(
        e.to_string().contains("QP is in RESET: connect it first"),
        "{e}"
    );
}

/// Too long for inline, or a registered buffer given to a safe method: the hint says why
/// no safe call takes a registered buffer, and names the unsafe `stage` with its contract.
#[test]
fn inline_hints_say_why_a_registered_buffer_needs_stage() {
    let s = setup();
    let qp = rc(&s);
    let max = qp.cap().max_inline_data;
    let mut tx = qp
        .send_ring::<16>(SendConfig::new(0, 16, max).signal_every(1))
        .unwrap();
    let long = vec![7u8; max as usize + 1];
    let e = tx.send_now(Msg::send(Local::Inline(&long))).unwrap_err();
    assert_eq!(
        e,
        SendError::InlineTooLong {
            len: long.len(),
            max
        }
    );
    let x = tx.explain(&e);
    assert_eq!((x.verb(), x.errno()), ("SendRing", libc::EINVAL), "{x}");
    let msg = x.to_string();
    for part in [
        &format!(
            "inline payload of {} bytes > max_inline_data {max}",
            long.len()
        ) as &str,
        "QpBuilder::max_inline_data",
        "No safe call sends from a registered buffer",
        "the NIC reads it after the post returns",
        "unsafe stage",
        "registered and unwritten until is_retired(seq)",
    ] {
        assert!(msg.contains(part), "missing {part:?}: {msg}");
    }
    let mr = s.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let e = tx
        .send_now(Msg::send(Local::Buf(LocalBuf::from(mr.sge()))))
        .unwrap_err();
    assert_eq!(e, SendError::NotInline);
    let msg = tx.explain(&e).to_string();
    assert!(
        msg.contains("only the unsafe stage takes one")
            && msg.contains("is_retired(seq)")
            && msg.contains("Local::Inline"),
        "{msg}"
    );
}

// ---- item 6: a safe inline post ----------------------------------------------------------

/// `post_send_inline`: a SEND (with immediate data) and an RDMA WRITE of inline bytes,
/// both delivered, with no `unsafe` and no registration of the bytes.
#[test]
fn post_send_inline_delivers_sends_and_writes() {
    let s = setup();
    let cqa = s.ctx.create_cq(16, None).unwrap();
    let (a, b) = (rc_on(&s, &cqa), rc(&s));
    let (port, opts) = (port(&s), ConnectOptions::default());
    b.init(&port, &opts).unwrap();
    let mut region = s.pd.alloc_mr(4 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut rx = b
        .recv_ring::<4>(&mut region, 0, RecvConfig::new(0, 64, 4))
        .unwrap();
    rx.fill().unwrap();
    Qp::connect_pair(&a, &b, &port, &opts).unwrap();

    let bytes = *b"inline hello";
    a.post_send_inline(&SendWr::send_inline(7, &bytes).imm(0xfeed).signaled())
        .unwrap();
    let wc = cqa.wait_one(T).unwrap();
    assert_eq!(wc.wr_id(), 7);
    assert!(wc.is_ok(), "{}", wc.status_name());
    let mut poller = s.cq.poller::<4>().unwrap();
    let m = loop {
        if let Some(c) = poller.poll().unwrap().first_mut() {
            break rx.on_completion(c).unwrap();
        }
    };
    assert_eq!(rx.data(&m).unwrap(), b"inline hello");
    assert_eq!(m.imm(), Some(0xfeed));
    rx.release(m).unwrap();

    let target =
        s.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    a.post_send_inline(&SendWr::write_inline(8, b"written", target.remote()).signaled())
        .unwrap();
    let wc = cqa.wait_one(T).unwrap();
    assert_eq!((wc.wr_id(), wc.is_ok()), (8, true), "{}", wc.status_name());
    let mut got = [0u8; 7];
    target.read_into(0, &mut got).unwrap();
    assert_eq!(&got, b"written");
}

/// What `post_send_inline` refuses, each by name before the provider sees it.
#[test]
fn post_send_inline_refusals_are_named() {
    let s = setup();
    let (a, b) = (rc(&s), rc(&s));
    Qp::connect_pair(&a, &b, &port(&s), &ConnectOptions::default()).unwrap();
    let max = a.cap().max_inline_data;

    let long = vec![1u8; max as usize + 1];
    let e = a
        .post_send_inline(&SendWr::send_inline(1, &long))
        .unwrap_err();
    assert_eq!(
        (e.verb(), e.errno()),
        ("Qp::post_send_inline", libc::EINVAL),
        "{e}"
    );
    assert!(
        e.to_string().contains(&format!(
            "{} inline bytes > the QP's max_inline_data {max}",
            max + 1
        )),
        "{e}"
    );

    let mr = s.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let sges = [mr.sge()];
    for wr in [SendWr::send(2, &sges), SendWr::send(3, &sges).inline()] {
        let e = a.post_send_inline(&wr).unwrap_err();
        assert_eq!(
            (e.verb(), e.errno()),
            ("Qp::post_send_inline", libc::EINVAL),
            "{e}"
        );
        assert!(e.to_string().contains("unsafe Qp::post_send"), "{e}");
    }

    let p = port(&s);
    let ah =
        s.pd.create_ah(&AhAttr::from_port(&p, p.gid, p.lid))
            .unwrap();
    let e = a
        .post_send_inline(&SendWr::ud_inline(4, b"x", &ah, 1, DEFAULT_QKEY))
        .unwrap_err();
    assert_eq!(
        (e.verb(), e.errno()),
        ("Qp::post_send_inline", libc::EINVAL),
        "{e}"
    );
    assert!(e.to_string().contains("UD QPs only"), "{e}");

    // A ring's send queue is the ring's, for the QP's life.
    drop(a.send_ring::<16>(SendConfig::new(0, 16, 64)).unwrap());
    let e = a
        .post_send_inline(&SendWr::send_inline(5, b"x"))
        .unwrap_err();
    assert_eq!(
        (e.verb(), e.errno()),
        ("Qp::post_send_inline", libc::EBUSY),
        "{e}"
    );
    assert!(e.to_string().contains("send_now"), "{e}");
}

// ---- item 7: receives before RTR ---------------------------------------------------------

/// `init` both, fill the receive ring, connect, send: the first message finds its receive
/// (with `rnr_retry` 0 an RNR would fail it at once) — and without the fill it does not.
#[test]
fn receives_filled_in_init_meet_the_first_message() {
    let s = setup();
    let (a, b) = (rc(&s), rc(&s));
    let (port, opts) = (port(&s), no_rnr_retry());
    a.init(&port, &opts).unwrap();
    b.init(&port, &opts).unwrap();
    assert_eq!(
        (a.state().unwrap(), b.state().unwrap()),
        (QpState::Init, QpState::Init)
    );
    let mut region = s.pd.alloc_mr(4 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut rx = b
        .recv_ring::<4>(&mut region, 0, RecvConfig::new(0, 64, 4))
        .unwrap();
    assert_eq!(rx.fill().unwrap(), 4);
    // The RecvRing owns b's receive queue: a connect that reset b would be refused (EBUSY).
    Qp::connect_pair(&a, &b, &port, &opts).unwrap();
    assert_eq!(b.state().unwrap(), QpState::Rts);
    assert_eq!(rx.posted(), 4, "connect kept the receives");
    let mut tx = a
        .send_ring::<16>(SendConfig::new(0, 16, 64).signal_every(1))
        .unwrap();
    tx.send_now(Msg::send(Local::Inline(b"first"))).unwrap();
    let (got, sent) = pump(&s.cq, &mut tx, &mut rx, 2);
    assert_eq!(got, [b"first".to_vec()]);
    assert_eq!(sent, [Ok(1)], "no RNR");

    // The control: the same first message to a peer whose receives come after connect.
    let (c, d) = (rc(&s), rc(&s));
    Qp::connect_pair(&c, &d, &port, &opts).unwrap();
    let mut region2 = s.pd.alloc_mr(4 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut rx2 = d
        .recv_ring::<4>(&mut region2, 0, RecvConfig::new(0, 64, 4))
        .unwrap();
    let mut tx2 = c
        .send_ring::<16>(SendConfig::new(0, 16, 64).signal_every(1))
        .unwrap();
    tx2.send_now(Msg::send(Local::Inline(b"first"))).unwrap();
    let (got, sent) = pump(&s.cq, &mut tx2, &mut rx2, 1);
    assert!(got.is_empty());
    assert_eq!(sent, [Err(WcError::RnrRetryExc)]);
}

/// `fill` in RESET: refused with the named error, which converts into an `Error`; the
/// ring's reset (rxe counts the refused chain posted) and `init` make the next fill work.
#[test]
fn fill_in_reset_names_init() {
    let s = setup();
    let qp = rc(&s);
    let mut region = s.pd.alloc_mr(4 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut rx = qp
        .recv_ring::<4>(&mut region, 0, RecvConfig::new(0, 64, 4))
        .unwrap();
    let e = rx.fill().unwrap_err();
    assert_eq!((e.verb, e.errno), ("ibv_post_recv", libc::EINVAL), "{e}");
    assert_eq!(e.state(), QpState::Reset);
    let want =
        "QP is in RESET: receives can be posted from INIT on — call Qp::init() (or connect) first";
    assert!(e.to_string().contains(want), "{e}");
    assert!(
        !e.to_string().contains("does not allow posting"),
        "the state is named, not guessed: {e}"
    );
    let unnamed = e.first_rejected == PostError::UNKNOWN;
    if unnamed {
        assert!(e.to_string().contains("RecvRing::reset_qp()"), "{e}");
    }
    let err = Error::from(e);
    assert_eq!(
        (err.verb(), err.errno()),
        ("ibv_post_recv", libc::EINVAL),
        "{err}"
    );
    assert!(err.hint().unwrap().contains(want), "{err}");

    // The setup layer's own receive post says the same.
    let mr = s.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    // SAFETY: refused at post (RESET); nothing is in flight.
    let e = unsafe { qp.post_recv(1, &[mr.sge()]) }.unwrap_err();
    assert!(e.to_string().contains(want), "{e}");

    rx.reset_qp().unwrap();
    qp.init(&port(&s), &ConnectOptions::default()).unwrap();
    assert_eq!(rx.fill().unwrap(), 4);
    assert_eq!(rx.posted(), 4);
}

/// `connect` keeps a QP in INIT as it is: the INIT attributes set by `to_init` stay; a
/// QP in INIT on another port than connect's is refused by name.
#[test]
fn connect_keeps_init_attributes_and_refuses_another_port() {
    let s = setup();
    let (a, b) = (rc(&s), rc(&s));
    let port = port(&s);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    b.to_init(&InitAttr {
        port: port.port,
        access,
        ..InitAttr::default()
    })
    .unwrap();
    let opts = ConnectOptions::default();
    assert_ne!(opts.access, access);
    Qp::connect_pair(&a, &b, &port, &opts).unwrap();
    assert_eq!(b.query().unwrap().access(), access, "kept, not connect's");
    assert_eq!(a.query().unwrap().access(), opts.access);

    let c = rc(&s);
    c.init(&port, &opts).unwrap();
    let other = PortInfo {
        port: port.port + 1,
        ..port
    };
    let e = c.connect(&other, &a.endpoint(&port), &opts).unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("Qp::connect", libc::EINVAL), "{e}");
    assert!(
        e.to_string().contains(&format!(
            "INIT on port {} but connect's local port is {}",
            port.port,
            port.port + 1
        )),
        "{e}"
    );
    assert_eq!(c.state().unwrap(), QpState::Init, "nothing moved");
}

/// The rings' recovery: `reset_qp` / `reset_qp_with` leave the QP in RESET with the
/// receive slots requeued; `init`, `fill`, `connect` bring the pair back with the receives
/// posted before the first message (again with `rnr_retry` 0).
#[test]
fn ring_recovery_refills_through_init() {
    let s = setup();
    let (a, b) = (rc(&s), rc(&s));
    let (port, opts) = (port(&s), no_rnr_retry());
    b.init(&port, &opts).unwrap();
    let mut region = s.pd.alloc_mr(4 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut rx = b
        .recv_ring::<4>(&mut region, 0, RecvConfig::new(0, 64, 4))
        .unwrap();
    rx.fill().unwrap();
    Qp::connect_pair(&a, &b, &port, &opts).unwrap();
    let mut tx = a
        .send_ring::<16>(SendConfig::new(0, 16, 64).signal_every(1))
        .unwrap();
    let mut tx_b = b
        .send_ring::<16>(SendConfig::new(0, 16, 64).signal_every(1))
        .unwrap();
    tx.send_now(Msg::send(Local::Inline(b"one"))).unwrap();
    let (got, _) = pump(&s.cq, &mut tx, &mut rx, 2);
    assert_eq!(got, [b"one".to_vec()]);

    // Both sides through RESET by their rings.
    tx.reset_qp().unwrap();
    let (sends, requeued) = tx_b.reset_qp_with(&mut rx).unwrap();
    assert_eq!((sends, requeued), (0, 4));
    assert_eq!(rx.posted(), 0);
    assert_eq!(
        (a.state().unwrap(), b.state().unwrap()),
        (QpState::Reset, QpState::Reset)
    );
    a.init(&port, &opts).unwrap();
    b.init(&port, &opts).unwrap();
    assert_eq!(rx.fill().unwrap(), 4);
    Qp::connect_pair(&a, &b, &port, &opts).unwrap();
    tx.send_now(Msg::send(Local::Inline(b"two"))).unwrap();
    let (got, sent) = pump(&s.cq, &mut tx, &mut rx, 2);
    assert_eq!(got, [b"two".to_vec()]);
    assert!(sent[0].is_ok(), "no RNR: {sent:?}");
}

/// A send refused in INIT without the provider naming the WR (rxe queues it anyway, to run
/// in RTS) makes `connect` go through RESET, which discards it: only what was posted after
/// the connect arrives. (Under the spec profile the refused WR is never queued.)
#[test]
fn a_send_refused_unnamed_in_init_never_runs_after_connect() {
    let s = setup();
    let cqa = s.ctx.create_cq(16, None).unwrap();
    let (a, b) = (rc_on(&s, &cqa), rc(&s));
    let (port, opts) = (port(&s), ConnectOptions::default());
    a.init(&port, &opts).unwrap();
    b.init(&port, &opts).unwrap();
    let mut region = s.pd.alloc_mr(4 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut rx = b
        .recv_ring::<4>(&mut region, 0, RecvConfig::new(0, 64, 4))
        .unwrap();
    rx.fill().unwrap();
    let e = a
        .post_send_inline(&SendWr::send_inline(1, b"early").signaled())
        .unwrap_err();
    assert!(
        e.to_string().contains("QP is in INIT: sends need RTS"),
        "{e}"
    );
    Qp::connect_pair(&a, &b, &port, &opts).unwrap();
    a.post_send_inline(&SendWr::send_inline(2, b"after").signaled())
        .unwrap();
    let wc = cqa.wait_one(T).unwrap();
    assert_eq!((wc.wr_id(), wc.is_ok()), (2, true), "{}", wc.status_name());
    let mut poller = s.cq.poller::<4>().unwrap();
    let m = loop {
        if let Some(c) = poller.poll().unwrap().first_mut() {
            break rx.on_completion(c).unwrap();
        }
    };
    assert_eq!(rx.data(&m).unwrap(), b"after", "the refused WR never ran");
    rx.release(m).unwrap();
    assert!(poller.poll().unwrap().is_empty());
    let mut wcs = [Wc::default(); 4];
    assert_eq!(cqa.poll(&mut wcs).unwrap(), 0, "no completion of WR 1");
}
