//! Four behaviours where softnic's Rxe profile departed from rxe0 (issue 31, D1-D4), through
//! the public API, on the device of `cargo xtask rxe` (rxe0) and on softnic in both profiles
//! (the `real_device*` convention: `hotverbs::testing::device_or_softnic_profiles`). rxe and
//! softnic's Rxe profile must answer alike; softnic's Spec profile answers as the man pages
//! and the IBA say, where they say. Each scenario waits for every WR it posts: nothing here
//! depends on timing.

use std::time::Duration;

use hotverbs::testing::{device_or_softnic_profiles, gid_index};
use hotverbs::*;

const T: Duration = Duration::from_secs(10);

/// The Spec profile (the man pages); anything else behaves as rxe.
fn spec(label: &str) -> bool {
    label == "softnic-spec"
}

fn port_info(ctx: &Context) -> PortInfo {
    ctx.port_info(None, gid_index()).unwrap()
}

/// Two UD QPs on one CQ, connected with `DEFAULT_QKEY`, and an AH to the port's own GID.
fn ud_pair(ctx: &Context, pd: &Pd, cq: &Cq) -> (Qp, Qp, Ah) {
    let info = port_info(ctx);
    let a = QpBuilder::new(pd, cq, cq, QpType::Ud).build().unwrap();
    let b = QpBuilder::new(pd, cq, cq, QpType::Ud).build().unwrap();
    let o = ConnectOptions::default();
    a.connect(&info, &Endpoint::default(), &o).unwrap();
    b.connect(&info, &Endpoint::default(), &o).unwrap();
    let ah = pd
        .create_ah(&AhAttr::from_port(&info, info.gid, info.lid))
        .unwrap();
    (a, b, ah)
}

/// The completions of the given `wr_id`s on `cq` (in any order), waited for one by one.
fn wait_for(cq: &Cq, ids: &[u64]) -> Vec<Wc> {
    let mut got: Vec<Wc> = Vec::new();
    while got.len() < ids.len() {
        let wc = cq.wait_one(T).unwrap();
        assert!(ids.contains(&wc.wr_id()), "unexpected completion {wc:?}");
        got.push(wc);
    }
    got.sort_by_key(|w| ids.iter().position(|&i| i == w.wr_id()));
    got
}

/// D1: a UD SEND whose remote Q_Key has the high bit set. IBA (Spec): the sending QP's own
/// Q_Key is used and the datagram arrives; rxe sends the value as it is and the target
/// drops it. A second SEND with the right Q_Key tells which: the first posted receive gets
/// the first datagram that arrived (on rxe, the receive left posted is flushed with the QP).
#[test]
fn d1_remote_qkey_with_the_high_bit() {
    for (label, ctx) in device_or_softnic_profiles("d1_remote_qkey_with_the_high_bit", "d1") {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let (a, b, ah) = ud_pair(&ctx, &pd, &cq);
        let mut tx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let rx = pd.alloc_mr(512, AccessFlags::LOCAL_WRITE).unwrap();
        tx.write_from(0, b"AAAABBBB").unwrap();
        // SAFETY: the buffers are not touched until their completions.
        unsafe {
            b.post_recv(1, &[rx.local(0, 256).unwrap()]).unwrap();
            b.post_recv(2, &[rx.local(256, 256).unwrap()]).unwrap();
            let first = [tx.local(0, 4).unwrap()];
            a.post_send(&SendWr::ud(10, &first, &ah, b.qp_num(), 0x8000_0000).signaled())
                .unwrap();
            let second = [tx.local(4, 4).unwrap()];
            a.post_send(&SendWr::ud(11, &second, &ah, b.qp_num(), DEFAULT_QKEY).signaled())
                .unwrap();
        }
        // Every completion there is to wait for: both sends, and one receive per datagram
        // delivered (two in Spec, one on rxe).
        let ids: &[u64] = if spec(&label) {
            &[10, 11, 1, 2]
        } else {
            &[10, 11, 1]
        };
        let w = wait_for(&cq, ids);
        assert!(w.iter().all(|w| w.status().is_ok()), "{label}");
        let names: Vec<_> = w.iter().map(Wc::opcode_name).collect();
        assert_eq!(
            names[..3],
            ["IBV_WC_SEND", "IBV_WC_SEND", "IBV_WC_RECV"],
            "{label}"
        );
        let first = rx.read_vec(40, 4).unwrap();
        let want: &[u8] = if spec(&label) { b"AAAA" } else { b"BBBB" };
        assert_eq!(first, want, "{label}: the first receive's payload");
    }
}

/// D2: an RC WRITE_WITH_IMM to a bad rkey with a receive posted at the responder. The
/// requester: REM_ACCESS_ERR everywhere. The responder's receive: flushed (WR_FLUSH_ERR) in
/// Spec, REM_ACCESS_ERR on rxe.
#[test]
fn d2_refused_write_with_imm_and_the_responders_receive() {
    let name = "d2_refused_write_with_imm_and_the_responders_receive";
    for (label, ctx) in device_or_softnic_profiles(name, "d2") {
        let info = port_info(&ctx);
        let pd = ctx.alloc_pd().unwrap();
        let cq_a = ctx.create_cq(16, None).unwrap();
        let cq_b = ctx.create_cq(16, None).unwrap();
        let a = QpBuilder::new(&pd, &cq_a, &cq_a, QpType::Rc)
            .build()
            .unwrap();
        let b = QpBuilder::new(&pd, &cq_b, &cq_b, QpType::Rc)
            .build()
            .unwrap();
        let o = ConnectOptions::default();
        a.connect(&info, &b.endpoint(&info), &o).unwrap();
        b.connect(&info, &a.endpoint(&info), &o).unwrap();
        let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let tx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let rx = pd.alloc_mr(256, rw).unwrap();
        let bad = RemoteMr {
            rkey: rx.remote().rkey ^ 0x5a5a_0000,
            ..rx.remote()
        };
        // SAFETY: the buffers are not touched until their completions.
        unsafe {
            b.post_recv(50, &[rx.local(0, 64).unwrap()]).unwrap();
            let sge = [tx.local(0, 64).unwrap()];
            a.post_send(&SendWr::write(7, &sge, bad).imm(5).signaled())
                .unwrap();
        }
        let wa = wait_for(&cq_a, &[7]);
        assert_eq!(wa[0].status_name(), "IBV_WC_REM_ACCESS_ERR", "{label}");
        let wb = wait_for(&cq_b, &[50]);
        let want = if spec(&label) {
            "IBV_WC_WR_FLUSH_ERR"
        } else {
            "IBV_WC_REM_ACCESS_ERR"
        };
        assert_eq!(
            wb[0].status_name(),
            want,
            "{label}: the responder's receive"
        );
    }
}

/// D3: the IPv4 header in a UD receive's GRH area is the RoCE v2 packet's: total length
/// 20 + 8 (UDP) + 12 (BTH) + 8 (DETH) [+ 4 immediate] + payload padded to 4 + 4 (ICRC),
/// don't-fragment set, everywhere; the checksum valid in Spec, left 0 on rxe (rxe0 writes 0).
#[test]
fn d3_the_grh_areas_ipv4_header_is_the_packets() {
    let name = "d3_the_grh_areas_ipv4_header_is_the_packets";
    for (label, ctx) in device_or_softnic_profiles(name, "d3") {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let (a, b, ah) = ud_pair(&ctx, &pd, &cq);
        let tx = pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
        let rx = pd.alloc_mr(512, AccessFlags::LOCAL_WRITE).unwrap();
        let cases = [
            (1usize, false),
            (8, false),
            (100, false),
            (1, true),
            (8, true),
        ];
        for (i, &(len, with_imm)) in cases.iter().enumerate() {
            let (r, s) = (100 + i as u64, 200 + i as u64);
            // SAFETY: the buffers are not touched until their completions.
            unsafe {
                b.post_recv(r, &[rx.local(0, 512).unwrap()]).unwrap();
                let sge = [tx.local(0, len).unwrap()];
                let wr = SendWr::ud(s, &sge, &ah, b.qp_num(), DEFAULT_QKEY).signaled();
                a.post_send(&if with_imm { wr.imm(3) } else { wr }).unwrap();
            }
            let w = wait_for(&cq, &[s, r]);
            assert!(w[1].status().is_ok(), "{label} {len} {with_imm}");
            let ip = rx.read_vec(20, 20).unwrap();
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            let want = 52 + len.next_multiple_of(4) + if with_imm { 4 } else { 0 };
            assert_eq!(total, want, "{label}: len {len}, immediate {with_imm}");
            assert_eq!(ip[6] & 0x40, 0x40, "{label}: don't fragment");
            let sum: u32 = ip
                .chunks(2)
                .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
                .sum();
            if spec(&label) {
                let folded = (sum & 0xffff) + (sum >> 16);
                assert_eq!(folded, 0xffff, "{label}: checksum of {ip:02x?}");
            } else {
                // What rxe0 writes (the packet's ID varies, the checksum is left 0).
                assert_eq!(ip[10..12], [0, 0], "{label}: checksum of {ip:02x?}");
            }
        }
    }
}

/// D4: a UD SEND of 16 bytes into a 41-byte receive. Spec: LOC_LEN_ERR, the buffer
/// untouched (the man pages leave it undefined); rxe: LOC_QP_OP_ERR with the 40-byte GRH
/// area written, no payload byte.
#[test]
fn d4_a_ud_receive_too_short_for_the_payload() {
    let name = "d4_a_ud_receive_too_short_for_the_payload";
    for (label, ctx) in device_or_softnic_profiles(name, "d4") {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let (a, b, ah) = ud_pair(&ctx, &pd, &cq);
        let tx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let mut rx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        rx.write_from(0, &[0xee; 64]).unwrap();
        // SAFETY: the buffers are not touched until their completions.
        unsafe {
            b.post_recv(1, &[rx.local(0, 41).unwrap()]).unwrap();
            let sge = [tx.local(0, 16).unwrap()];
            a.post_send(&SendWr::ud(2, &sge, &ah, b.qp_num(), DEFAULT_QKEY).signaled())
                .unwrap();
        }
        let w = wait_for(&cq, &[2, 1]);
        assert!(w[0].status().is_ok(), "{label}: the sender succeeds");
        let area = rx.read_vec(0, 41).unwrap();
        if spec(&label) {
            assert_eq!(w[1].status_name(), "IBV_WC_LOC_LEN_ERR", "{label}");
            assert_eq!(area, vec![0xee; 41], "{label}: untouched");
        } else {
            assert_eq!(w[1].status_name(), "IBV_WC_LOC_QP_OP_ERR", "{label}");
            // D5 (the differential's): rxe fills nothing past wr_id, status and qp_num in
            // an error completion, the source QP included.
            assert_eq!(
                w[1].src_qp(),
                0,
                "{label}: the error completion's source QP"
            );
            assert_eq!(
                area[..20],
                [0; 20],
                "{label}: the GRH area's first 20 bytes"
            );
            assert_eq!(area[20], 0x45, "{label}: the IPv4 header");
            assert_eq!(area[40], 0xee, "{label}: no payload byte");
        }
    }
}

/// D6 (found by the differential, `real_device_differential.rs`): a UD SEND above the path
/// MTU whose SGE names no MR. rxe drops the datagram before it reads the gather list: the
/// sender's completion is a success with the full byte count. The Spec profile checks the
/// lkey first: the WR completes in error.
#[test]
fn d6_a_ud_send_above_the_mtu_with_a_bad_lkey() {
    let name = "d6_a_ud_send_above_the_mtu_with_a_bad_lkey";
    for (label, ctx) in device_or_softnic_profiles(name, "d6") {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let (a, b, ah) = ud_pair(&ctx, &pd, &cq);
        let tx = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let mtu = port_info(&ctx).active_mtu.bytes();
        let sge = [Sge {
            addr: tx.addr(),
            length: mtu + 1,
            lkey: 0x1234_5678,
        }];
        // SAFETY: the SGE names no MR: nothing is read (or the WR fails).
        unsafe {
            a.post_send(&SendWr::ud(2, &sge, &ah, b.qp_num(), DEFAULT_QKEY).signaled())
                .unwrap();
        }
        let w = wait_for(&cq, &[2]);
        if spec(&label) {
            assert!(w[0].status().is_err(), "{label}: {:?}", w[0]);
        } else {
            assert!(w[0].status().is_ok(), "{label}: {:?}", w[0]);
            assert_eq!(w[0].byte_len(), mtu + 1, "{label}");
        }
    }
}

/// An RC pair on CQs of their own (`rnr_retry` 0: an RNR ends the WR at once) and B's
/// memory with remote rights.
fn rc_pair(ctx: &Context, pd: &Pd) -> (Qp, Qp, Cq, Cq) {
    let info = port_info(ctx);
    let cq_a = ctx.create_cq(16, None).unwrap();
    let cq_b = ctx.create_cq(16, None).unwrap();
    let a = QpBuilder::new(pd, &cq_a, &cq_a, QpType::Rc)
        .build()
        .unwrap();
    let b = QpBuilder::new(pd, &cq_b, &cq_b, QpType::Rc)
        .build()
        .unwrap();
    let o = ConnectOptions {
        rnr_retry: 0,
        ..ConnectOptions::default()
    };
    a.connect(&info, &b.endpoint(&info), &o).unwrap();
    b.connect(&info, &a.endpoint(&info), &o).unwrap();
    (a, b, cq_a, cq_b)
}

/// D7 (found by the differential): an RDMA READ whose remote window is bad and whose local
/// SGE names no MR. rxe checks the local side when the response arrives, so the remote
/// fault is what the WR reports (REM_ACCESS_ERR); the Spec profile checks the local SGE
/// first (LOC_PROT_ERR).
#[test]
fn d7_a_read_bad_on_both_sides() {
    let name = "d7_a_read_bad_on_both_sides";
    for (label, ctx) in device_or_softnic_profiles(name, "d7") {
        let pd = ctx.alloc_pd().unwrap();
        let (a, _b, cq_a, _cq_b) = rc_pair(&ctx, &pd);
        let local = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let remote = pd
            .alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
        let bad_remote = RemoteMr {
            rkey: 0x1234_5678,
            ..remote.remote()
        };
        let bad_local = [Sge {
            lkey: 0x1234_5678,
            ..local.local(0, 64).unwrap()
        }];
        // SAFETY: the SGE names no MR: nothing is written.
        unsafe {
            a.post_send(&SendWr::read(3, &bad_local, bad_remote).signaled())
                .unwrap();
        }
        let w = wait_for(&cq_a, &[3]);
        let want = if spec(&label) {
            "IBV_WC_LOC_PROT_ERR"
        } else {
            "IBV_WC_REM_ACCESS_ERR"
        };
        assert_eq!(w[0].status_name(), want, "{label}");
    }
}

/// D8 (found by the differential): an RC WRITE_WITH_IMM of one packet to a bad rkey while
/// the responder has no receive. rxe's responder looks for the receive before it checks the
/// rkey: RNR (with `rnr_retry` 0, RNR_RETRY_EXC_ERR). The Spec profile refuses the rkey
/// first (REM_ACCESS_ERR).
#[test]
fn d8_write_with_imm_to_a_bad_rkey_without_a_receive() {
    let name = "d8_write_with_imm_to_a_bad_rkey_without_a_receive";
    for (label, ctx) in device_or_softnic_profiles(name, "d8") {
        let pd = ctx.alloc_pd().unwrap();
        let (a, _b, cq_a, _cq_b) = rc_pair(&ctx, &pd);
        let tx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let rx = pd
            .alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        let bad = RemoteMr {
            rkey: 0x1234_5678,
            ..rx.remote()
        };
        // SAFETY: the buffers are not touched until the completion.
        unsafe {
            let sge = [tx.local(0, 8).unwrap()];
            a.post_send(&SendWr::write(4, &sge, bad).imm(9).signaled())
                .unwrap();
        }
        let w = wait_for(&cq_a, &[4]);
        let want = if spec(&label) {
            "IBV_WC_REM_ACCESS_ERR"
        } else {
            "IBV_WC_RNR_RETRY_EXC_ERR"
        };
        assert_eq!(w[0].status_name(), want, "{label}");
    }
}

/// D9 (found by the differential), D2's other half: a WRITE_WITH_IMM of several packets
/// (3000 B at MTU 1024) refused for its rkey. rxe refuses its first packet, before any
/// receive was taken: the responder's receive is flushed with the QP in both profiles, where
/// a one-packet message's is completed with REM_ACCESS_ERR on rxe (D2).
#[test]
fn d9_a_refused_write_with_imm_of_several_packets() {
    let name = "d9_a_refused_write_with_imm_of_several_packets";
    for (label, ctx) in device_or_softnic_profiles(name, "d9") {
        let pd = ctx.alloc_pd().unwrap();
        let (a, b, cq_a, cq_b) = rc_pair(&ctx, &pd);
        let tx = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let rx = pd
            .alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        let bad = RemoteMr {
            rkey: 0x1234_5678,
            ..rx.remote()
        };
        // SAFETY: the buffers are not touched until their completions.
        unsafe {
            b.post_recv(50, &[rx.local(0, 64).unwrap()]).unwrap();
            let sge = [tx.local(0, 3000).unwrap()];
            a.post_send(&SendWr::write(7, &sge, bad).imm(5).signaled())
                .unwrap();
        }
        let wa = wait_for(&cq_a, &[7]);
        assert_eq!(wa[0].status_name(), "IBV_WC_REM_ACCESS_ERR", "{label}");
        let wb = wait_for(&cq_b, &[50]);
        assert_eq!(
            wb[0].status_name(),
            "IBV_WC_WR_FLUSH_ERR",
            "{label}: the responder's receive"
        );
    }
}

/// D10 (found by the differential): a send refused in INIT, which rxe queues anyway (S1),
/// then, in RTS, a post whose only WR the provider refuses (65 bytes inline, above the
/// limit). librxe rings its doorbell after its loop whatever became of the chain: the
/// queued send runs and completes. The Spec profile queued nothing.
#[test]
fn d10_a_refused_post_in_rts_still_rings_the_doorbell() {
    let name = "d10_a_refused_post_in_rts_still_rings_the_doorbell";
    for (label, ctx) in device_or_softnic_profiles(name, "d10") {
        let info = port_info(&ctx);
        let pd = ctx.alloc_pd().unwrap();
        let cq_a = ctx.create_cq(16, None).unwrap();
        let cq_b = ctx.create_cq(16, None).unwrap();
        let a = QpBuilder::new(&pd, &cq_a, &cq_a, QpType::Rc)
            .max_inline_data(64)
            .build()
            .unwrap();
        let b = QpBuilder::new(&pd, &cq_b, &cq_b, QpType::Rc)
            .build()
            .unwrap();
        let o = ConnectOptions::default();
        a.init(&info, &o).unwrap();
        b.init(&info, &o).unwrap();
        let tx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let rx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        // SAFETY: the buffers are not touched until their completions (or the QPs' end).
        let refused = unsafe {
            b.post_recv(1, &[rx.local(0, 64).unwrap()]).unwrap();
            a.post_send(&SendWr::send(2, &[tx.local(0, 16).unwrap()]).signaled())
        };
        assert!(refused.is_err(), "{label}: a send in INIT");
        for (q, peer) in [(&a, &b), (&b, &a)] {
            let remote = peer.endpoint(&info);
            q.to_rtr(&RtrAttr {
                path_mtu: info.active_mtu,
                dest_qpn: remote.qpn,
                rq_psn: remote.psn,
                max_dest_rd_atomic: o.max_dest_rd_atomic,
                min_rnr_timer: o.min_rnr_timer,
                ah: AhAttr::from_port(&info, Gid(remote.gid), remote.lid),
            })
            .unwrap();
            q.to_rts(&RtsAttr {
                timeout: o.timeout,
                retry_cnt: o.retry_cnt,
                rnr_retry: o.rnr_retry,
                sq_psn: q.local_psn(),
                max_rd_atomic: o.max_rd_atomic,
            })
            .unwrap();
        }
        // Through the raw post: the safe `post_send_inline` refuses it before the provider.
        // SAFETY: inline bytes only.
        let e = unsafe { a.post_send(&SendWr::send_inline(3, &[0; 65])) }.unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{label}: {e}");
        if spec(&label) {
            // Nothing was queued: a later WR is the only completion.
            a.post_send_inline(&SendWr::write_inline(4, b"", RemoteMr::default()).signaled())
                .unwrap();
            let w = wait_for(&cq_a, &[4]);
            assert!(w[0].status().is_ok(), "{label}: {:?}", w[0]);
        } else {
            let w = wait_for(&cq_a, &[2]);
            assert!(
                w[0].status().is_ok(),
                "{label}: the queued send ran: {:?}",
                w[0]
            );
            let r = wait_for(&cq_b, &[1]);
            assert_eq!(r[0].byte_len(), 16, "{label}");
        }
    }
}
