//! Issue 31's API gaps. `Qp::post_send_chain` (one WR per `post_send`, no `bad_wr` index),
//! on the device of `cargo xtask rxe` (rxe0) and on softnic in both profiles: a chain runs
//! in order with one call; a WR the provider refuses is named by its index, the WRs before
//! it run and the ones after it do not (fault-truth S5, S6); a WR our checks refuse names
//! its index before anything is posted; before RTS rxe names no WR (S1), the man pages' way
//! names the first. And `Qp::ud_to_rtr` / `ud_to_rts`, UD transitions without RC attributes.

use std::time::Duration;

use hotverbs::testing::{device_or_softnic_profiles, gid_index};
use hotverbs::*;

const T: Duration = Duration::from_secs(10);

struct Pair {
    a: Qp,
    _b: Qp,
    cqa: Cq,
    target: Mr<'static>,
    port: PortInfo,
}

fn pair(ctx: &Context, connect: bool) -> Pair {
    let pd = ctx.alloc_pd().unwrap();
    let cqa = ctx.create_cq(32, None).unwrap();
    let cqb = ctx.create_cq(32, None).unwrap();
    let a = QpBuilder::new(&pd, &cqa, &cqa, QpType::Rc)
        .max_inline_data(64)
        .build()
        .unwrap();
    let b = QpBuilder::new(&pd, &cqb, &cqb, QpType::Rc).build().unwrap();
    let target = pd
        .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let port = ctx.port_info(None, gid_index()).unwrap();
    if connect {
        Qp::connect_pair(&a, &b, &port, &ConnectOptions::default()).unwrap();
    }
    Pair {
        a,
        _b: b,
        cqa,
        target,
        port,
    }
}

/// The `wr_id`s completed on `cq` until `last` (signaled) completed.
fn ids_until(cq: &Cq, last: u64) -> Vec<(u64, bool)> {
    let mut ids = Vec::new();
    loop {
        let wc = cq.wait_one(T).unwrap();
        ids.push((wc.wr_id(), wc.is_ok()));
        if wc.wr_id() == last {
            return ids;
        }
    }
}

#[test]
fn a_chain_runs_in_order_with_one_call() {
    for (label, ctx) in device_or_softnic_profiles("a_chain_runs_in_order_with_one_call", "c1") {
        let p = pair(&ctx, true);
        let r = p.target.remote();
        let bytes: Vec<[u8; 8]> = (1..=4u8).map(|b| [b; 8]).collect();
        let chain: Vec<SendWr<'_>> = (0..4u64)
            .map(|i| {
                let to = r.slice(8 * i, 8).unwrap();
                SendWr::write_inline(i, &bytes[i as usize], to).signaled()
            })
            .collect();
        // SAFETY: inline payloads; the target MR outlives the WRs (waited for below).
        unsafe { p.a.post_send_chain(&chain) }.unwrap();
        assert_eq!(
            ids_until(&p.cqa, 3),
            [(0, true), (1, true), (2, true), (3, true)],
            "{label}"
        );
        let mut got = [0u8; 32];
        p.target.read_into(0, &mut got).unwrap();
        let want: Vec<u8> = (1..=4u8).flat_map(|b| [b; 8]).collect();
        assert_eq!(&got[..], &want[..], "{label}: the chain's bytes, in order");
        // An empty chain posts nothing and is no error.
        // SAFETY: nothing is posted.
        unsafe { p.a.post_send_chain(&[]) }.unwrap();
    }
}

#[test]
fn the_refused_wr_is_named_and_the_ones_before_it_run() {
    for (label, ctx) in
        device_or_softnic_profiles("the_refused_wr_is_named_and_the_ones_before_it_run", "c2")
    {
        let p = pair(&ctx, true);
        let r = p.target.remote();
        let big = [9u8; 65];
        let chain = [
            SendWr::write_inline(10, b"one", r).signaled(),
            // Above max_inline_data (64): the provider refuses it (fault-truth S5).
            SendWr::write_inline(11, &big, r.slice(64, 65).unwrap()).signaled(),
            SendWr::write_inline(12, b"three", r.slice(256, 5).unwrap()).signaled(),
        ];
        // SAFETY: inline payloads; the target MR outlives the WRs.
        let e = unsafe { p.a.post_send_chain(&chain) }.unwrap_err();
        assert_eq!(e.first_rejected, Some(1), "{label}: {e}");
        assert_eq!(e.error.errno(), libc::EINVAL, "{label}: {e}");
        assert!(e.to_string().contains("WR 1 of the chain"), "{label}: {e}");
        assert!(e.to_string().contains("max_inline_data"), "{label}: {e}");
        assert_eq!(ids_until(&p.cqa, 10), [(10, true)], "{label}");
        // Nothing from the refused WR on ran: a later WR is the next completion.
        p.a.post_send_inline(&SendWr::write_inline(13, b"four", r).signaled())
            .unwrap();
        assert_eq!(ids_until(&p.cqa, 13), [(13, true)], "{label}");
        assert_eq!(
            p.target.read_vec(256, 5).unwrap(),
            [0; 5],
            "{label}: WR 2 ran"
        );

        // Our own check (a UD WR on an RC QP) names its index before anything is posted.
        let pd = p.a.pd();
        let ah = pd
            .create_ah(&AhAttr::from_port(&p.port, p.port.gid, p.port.lid))
            .unwrap();
        let chain = [
            SendWr::write_inline(20, b"one", r).signaled(),
            SendWr::ud_inline(21, b"ud", &ah, 1, DEFAULT_QKEY),
        ];
        // SAFETY: inline payloads; nothing is posted.
        let e = unsafe { p.a.post_send_chain(&chain) }.unwrap_err();
        assert_eq!(e.first_rejected, Some(1), "{label}: {e}");
        assert!(e.to_string().contains("UD QPs only"), "{label}: {e}");
        p.a.post_send_inline(&SendWr::write_inline(22, b"five", r).signaled())
            .unwrap();
        assert_eq!(ids_until(&p.cqa, 22), [(22, true)], "{label}: WR 20 ran");
    }
}

#[test]
fn before_rts_rxe_names_no_wr() {
    for (label, ctx) in device_or_softnic_profiles("before_rts_rxe_names_no_wr", "c3") {
        let p = pair(&ctx, false);
        let r = p.target.remote();
        let chain = [
            SendWr::write_inline(30, b"one", r),
            SendWr::write_inline(31, b"two", r).signaled(),
        ];
        // SAFETY: inline payloads; the QP is reset below, before the MR goes.
        let e = unsafe { p.a.post_send_chain(&chain) }.unwrap_err();
        assert_eq!(e.error.errno(), libc::EINVAL, "{label}: {e}");
        if label == "softnic-spec" {
            assert_eq!(e.first_rejected, Some(0), "{label}: {e}");
        } else {
            // rxe (fault-truth S1): bad_wr NULL, the chain queued anyway.
            assert_eq!(e.first_rejected, None, "{label}: {e}");
            assert!(e.to_string().contains("named none"), "{label}: {e}");
        }
        p.a.reset().unwrap();
    }
}

/// The UD transitions without RC attributes (`Qp::ud_to_rtr`, `Qp::ud_to_rts`): a datagram
/// crosses between two QPs brought up with them; an RC QP is refused, naming what it needs.
#[test]
fn ud_transitions_take_no_rc_attributes() {
    for (label, ctx) in device_or_softnic_profiles("ud_transitions_take_no_rc_attributes", "c4") {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let port = ctx.port_info(None, gid_index()).unwrap();
        let init = InitAttr {
            port: port.port,
            qkey: DEFAULT_QKEY,
            ..InitAttr::default()
        };
        let [a, b] = [0, 1].map(|_| {
            let q = QpBuilder::new(&pd, &cq, &cq, QpType::Ud)
                .max_inline_data(64)
                .build()
                .unwrap();
            q.to_init(&init).unwrap();
            q.ud_to_rtr().unwrap();
            q.ud_to_rts(q.local_psn()).unwrap();
            assert_eq!(q.state().unwrap(), QpState::Rts, "{label}");
            q
        });
        let mut rx = pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
        rx.write_from(0, &[0; 256]).unwrap();
        // SAFETY: `rx` outlives the receive, which completes below before it is read.
        unsafe { b.post_recv(1, &[rx.local(0, 256).unwrap()]) }.unwrap();
        let ah = pd
            .create_ah(&AhAttr::from_port(&port, port.gid, port.lid))
            .unwrap();
        a.post_send_inline(
            &SendWr::ud_inline(2, b"datagram", &ah, b.qp_num(), DEFAULT_QKEY).signaled(),
        )
        .unwrap();
        let mut got = Vec::new();
        while got.len() < 2 {
            got.push(cq.wait_one(T).unwrap().ok().unwrap().wr_id());
        }
        got.sort_unstable();
        assert_eq!(got, [1, 2], "{label}");
        assert_eq!(rx.read_vec(40, 8).unwrap(), b"datagram", "{label}");

        let rc = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
        rc.init(&port, &ConnectOptions::default()).unwrap();
        let e = rc.ud_to_rtr().unwrap_err();
        assert_eq!(
            (e.verb(), e.errno()),
            ("Qp::ud_to_rtr", libc::EINVAL),
            "{label}"
        );
        assert!(e.to_string().contains("to_rtr"), "{label}: {e}");
        assert_eq!(
            rc.state().unwrap(),
            QpState::Init,
            "{label}: refused, nothing changed"
        );
    }
}
