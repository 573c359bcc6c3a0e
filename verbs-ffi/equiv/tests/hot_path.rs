//! Equivalence of the hot-path inlines: the five legacy verbs (`ops` dispatch), the
//! `ibv_wr_*` family (`ibv_qp_ex` dispatch) and the extended-CQ poll family (`ibv_cq_ex`
//! dispatch). Each case runs the header's C inline and `hotverbs_ffi::inline` against the
//! same recording provider and asserts the same slot, arguments, return value, `bad_wr`
//! and `errno` (see `hotverbs_ffi_equiv::compare`).

use core::ffi::{c_int, c_void};
use core::mem::zeroed;
use core::ptr;

use hotverbs_ffi::{inline, *};
use hotverbs_ffi_equiv::{c, call, compare, fake::Device, record, run, Side};

/// What `*bad_wr` holds before a post; a provider that leaves it alone leaves this.
const SENTINEL: usize = 0xBAD0_0000;

/// Return values each "int" slot is driven through: its distinctive default, success, and
/// two errno-style failures.
fn int_rets(slot: &'static str) -> [i64; 4] {
    [
        record::ret(slot),
        0,
        i64::from(libc::EINVAL),
        i64::from(libc::ENOMEM),
    ]
}

#[test]
fn post_send_dispatches_like_the_header() {
    let d = Device::new();
    // SAFETY: all-zero is a valid ibv_send_wr (integers, pointers, unions).
    let mut wrs: [ibv_send_wr; 3] = unsafe { zeroed() };
    let w = wrs.as_mut_ptr();
    // SAFETY: indices within the 3-element array.
    let (w0, w1, w2) = unsafe { (w, w.add(1), w.add(2)) };
    // SAFETY: w0, w1 point into `wrs`, alive for the whole test.
    unsafe {
        (*w0).next = w1;
        (*w0).wr_id = 10;
        (*w1).wr_id = 11;
        (*w2).wr_id = 12;
    }
    let mut bad: *mut ibv_send_wr = ptr::null_mut();
    let badp = &raw mut bad;
    for r in int_rets("ops.post_send") {
        record::set_ret("ops.post_send", r);
        // A two-WR chain (a failure names the second WR) and a lone WR (names itself).
        for (head, failed) in [(w0, w1), (w2, w2)] {
            let got = compare(
                "ibv_post_send",
                &[call!("ops.post_send", d.qp, head, badp)],
                |side| {
                    // SAFETY: d's objects are live; head is a valid chain; badp writable.
                    unsafe {
                        *badp = SENTINEL as *mut ibv_send_wr;
                        let ret = match side {
                            Side::C => c::hv_c_post_send(d.qp, head, badp),
                            Side::Rust => inline::ibv_post_send(d.qp, head, badp),
                        };
                        (ret, *badp)
                    }
                },
            );
            let want_bad = if r == 0 {
                SENTINEL as *mut ibv_send_wr
            } else {
                failed
            };
            assert_eq!(got, (r as c_int, want_bad));
        }
    }
}

#[test]
fn post_recv_dispatches_like_the_header() {
    let d = Device::new();
    // SAFETY: all-zero is a valid ibv_recv_wr.
    let mut wrs: [ibv_recv_wr; 2] = unsafe { zeroed() };
    let w0 = wrs.as_mut_ptr();
    // SAFETY: index 1 of a 2-element array.
    let w1 = unsafe { w0.add(1) };
    // SAFETY: w0 points into `wrs`.
    unsafe { (*w0).next = w1 };
    let mut bad: *mut ibv_recv_wr = ptr::null_mut();
    let badp = &raw mut bad;
    for r in int_rets("ops.post_recv") {
        record::set_ret("ops.post_recv", r);
        let got = compare(
            "ibv_post_recv",
            &[call!("ops.post_recv", d.qp, w0, badp)],
            |side| {
                // SAFETY: d's objects are live; w0 is a valid chain; badp writable.
                unsafe {
                    *badp = SENTINEL as *mut ibv_recv_wr;
                    let ret = match side {
                        Side::C => c::hv_c_post_recv(d.qp, w0, badp),
                        Side::Rust => inline::ibv_post_recv(d.qp, w0, badp),
                    };
                    (ret, *badp)
                }
            },
        );
        let want_bad = if r == 0 {
            SENTINEL as *mut ibv_recv_wr
        } else {
            w1
        };
        assert_eq!(got, (r as c_int, want_bad));
    }
}

#[test]
fn post_srq_recv_dispatches_like_the_header() {
    let d = Device::new();
    // SAFETY: all-zero is a valid ibv_recv_wr.
    let mut wrs: [ibv_recv_wr; 2] = unsafe { zeroed() };
    let w0 = wrs.as_mut_ptr();
    // SAFETY: index 1 of a 2-element array.
    let w1 = unsafe { w0.add(1) };
    // SAFETY: w0 points into `wrs`.
    unsafe { (*w0).next = w1 };
    let mut bad: *mut ibv_recv_wr = ptr::null_mut();
    let badp = &raw mut bad;
    for r in int_rets("ops.post_srq_recv") {
        record::set_ret("ops.post_srq_recv", r);
        let got = compare(
            "ibv_post_srq_recv",
            &[call!("ops.post_srq_recv", d.srq, w0, badp)],
            |side| {
                // SAFETY: d's objects are live; w0 is a valid chain; badp writable.
                unsafe {
                    *badp = SENTINEL as *mut ibv_recv_wr;
                    let ret = match side {
                        Side::C => c::hv_c_post_srq_recv(d.srq, w0, badp),
                        Side::Rust => inline::ibv_post_srq_recv(d.srq, w0, badp),
                    };
                    (ret, *badp)
                }
            },
        );
        let want_bad = if r == 0 {
            SENTINEL as *mut ibv_recv_wr
        } else {
            w1
        };
        assert_eq!(got, (r as c_int, want_bad));
    }
}

#[test]
fn poll_cq_dispatches_like_the_header() {
    let d = Device::new();
    // SAFETY: all-zero is a valid ibv_wc.
    let mut wcs: [ibv_wc; 4] = unsafe { zeroed() };
    let wc = wcs.as_mut_ptr();
    for r in [record::ret("ops.poll_cq"), 0, 2, -1] {
        record::set_ret("ops.poll_cq", r);
        for n in [4, 1, 0] {
            let got = compare(
                "ibv_poll_cq",
                &[call!("ops.poll_cq", d.cq, n, wc)],
                |side| {
                    // SAFETY: d's cq is live; wc has room for 4 >= n completions.
                    unsafe {
                        ptr::write_bytes(wc, 0, 4);
                        let ret = match side {
                            Side::C => c::hv_c_poll_cq(d.cq, n, wc),
                            Side::Rust => inline::ibv_poll_cq(d.cq, n, wc),
                        };
                        let ids: Vec<u64> = (0..4).map(|i| (*wc.add(i)).wr_id).collect();
                        (ret, ids)
                    }
                },
            );
            assert_eq!(got.0, r as c_int);
            // The provider's completions reached the caller's array through both paths.
            let filled = n.min(2) as usize;
            for (i, id) in got.1.iter().enumerate() {
                let want = if i < filled { 0xC0DE0 + i as u64 } else { 0 };
                assert_eq!(*id, want, "n={n} wc[{i}]");
            }
        }
    }
}

#[test]
fn req_notify_cq_dispatches_like_the_header() {
    let d = Device::new();
    for r in int_rets("ops.req_notify_cq") {
        record::set_ret("ops.req_notify_cq", r);
        for solicited in [0, 1, -7] {
            let got = compare(
                "ibv_req_notify_cq",
                &[call!("ops.req_notify_cq", d.cq, solicited)],
                |side| {
                    // SAFETY: d's cq is live.
                    unsafe {
                        match side {
                            Side::C => c::hv_c_req_notify_cq(d.cq, solicited),
                            Side::Rust => inline::ibv_req_notify_cq(d.cq, solicited),
                        }
                    }
                },
            );
            assert_eq!(got, r as c_int);
        }
    }
}

/// One `ibv_wr_*` call on both sides: `wr!(d, wr_send_imm(imm))` compares
/// `c::hv_c_wr_send_imm(qpx, imm)` with `inline::ibv_wr_send_imm(qpx, imm)` and expects
/// exactly one `qp_ex.wr_send_imm` call with `(qpx, imm)`.
macro_rules! wr {
    ($d:expr, wr_start($($a:expr),*)) => {
        same_wr!($d, "wr_start", hv_c_wr_start, ibv_wr_start, $($a),*)
    };
    ($d:expr, wr_complete($($a:expr),*)) => {
        same_wr!($d, "wr_complete", hv_c_wr_complete, ibv_wr_complete, $($a),*)
    };
    ($d:expr, wr_abort($($a:expr),*)) => {
        same_wr!($d, "wr_abort", hv_c_wr_abort, ibv_wr_abort, $($a),*)
    };
    ($d:expr, wr_send($($a:expr),*)) => {
        same_wr!($d, "wr_send", hv_c_wr_send, ibv_wr_send, $($a),*)
    };
    ($d:expr, wr_send_imm($($a:expr),*)) => {
        same_wr!($d, "wr_send_imm", hv_c_wr_send_imm, ibv_wr_send_imm, $($a),*)
    };
    ($d:expr, wr_send_inv($($a:expr),*)) => {
        same_wr!($d, "wr_send_inv", hv_c_wr_send_inv, ibv_wr_send_inv, $($a),*)
    };
    ($d:expr, wr_send_tso($($a:expr),*)) => {
        same_wr!($d, "wr_send_tso", hv_c_wr_send_tso, ibv_wr_send_tso, $($a),*)
    };
    ($d:expr, wr_rdma_write($($a:expr),*)) => {
        same_wr!($d, "wr_rdma_write", hv_c_wr_rdma_write, ibv_wr_rdma_write, $($a),*)
    };
    ($d:expr, wr_rdma_write_imm($($a:expr),*)) => {
        same_wr!($d, "wr_rdma_write_imm", hv_c_wr_rdma_write_imm, ibv_wr_rdma_write_imm, $($a),*)
    };
    ($d:expr, wr_rdma_read($($a:expr),*)) => {
        same_wr!($d, "wr_rdma_read", hv_c_wr_rdma_read, ibv_wr_rdma_read, $($a),*)
    };
    ($d:expr, wr_atomic_cmp_swp($($a:expr),*)) => {
        same_wr!($d, "wr_atomic_cmp_swp", hv_c_wr_atomic_cmp_swp, ibv_wr_atomic_cmp_swp, $($a),*)
    };
    ($d:expr, wr_atomic_fetch_add($($a:expr),*)) => {
        same_wr!($d, "wr_atomic_fetch_add", hv_c_wr_atomic_fetch_add, ibv_wr_atomic_fetch_add, $($a),*)
    };
    ($d:expr, wr_atomic_write($($a:expr),*)) => {
        same_wr!($d, "wr_atomic_write", hv_c_wr_atomic_write, ibv_wr_atomic_write, $($a),*)
    };
    ($d:expr, wr_bind_mw($($a:expr),*)) => {
        same_wr!($d, "wr_bind_mw", hv_c_wr_bind_mw, ibv_wr_bind_mw, $($a),*)
    };
    ($d:expr, wr_local_inv($($a:expr),*)) => {
        same_wr!($d, "wr_local_inv", hv_c_wr_local_inv, ibv_wr_local_inv, $($a),*)
    };
    ($d:expr, wr_set_sge($($a:expr),*)) => {
        same_wr!($d, "wr_set_sge", hv_c_wr_set_sge, ibv_wr_set_sge, $($a),*)
    };
    ($d:expr, wr_set_sge_list($($a:expr),*)) => {
        same_wr!($d, "wr_set_sge_list", hv_c_wr_set_sge_list, ibv_wr_set_sge_list, $($a),*)
    };
    ($d:expr, wr_set_inline_data($($a:expr),*)) => {
        same_wr!($d, "wr_set_inline_data", hv_c_wr_set_inline_data, ibv_wr_set_inline_data, $($a),*)
    };
    ($d:expr, wr_set_inline_data_list($($a:expr),*)) => {
        same_wr!($d, "wr_set_inline_data_list", hv_c_wr_set_inline_data_list, ibv_wr_set_inline_data_list, $($a),*)
    };
    ($d:expr, wr_set_ud_addr($($a:expr),*)) => {
        same_wr!($d, "wr_set_ud_addr", hv_c_wr_set_ud_addr, ibv_wr_set_ud_addr, $($a),*)
    };
    ($d:expr, wr_set_xrc_srqn($($a:expr),*)) => {
        same_wr!($d, "wr_set_xrc_srqn", hv_c_wr_set_xrc_srqn, ibv_wr_set_xrc_srqn, $($a),*)
    };
}

macro_rules! same_wr {
    ($d:expr, $slot:literal, $cfn:ident, $rfn:ident, $($a:expr),*) => {{
        let qpx = $d.qpx;
        compare(
            concat!("ibv_", $slot),
            &[call!(concat!("qp_ex.", $slot), qpx $(, $a)*)],
            |side| {
                // SAFETY: qpx is the fake device's live extended QP with every slot set;
                // the pointer arguments are only logged by the recording provider.
                unsafe {
                    match side {
                        Side::C => c::$cfn(qpx $(, $a)*),
                        Side::Rust => inline::$rfn(qpx $(, $a)*),
                    }
                }
            },
        )
    }};
}

#[test]
fn wr_start_complete_abort_dispatch_like_the_header() {
    let d = Device::new();
    wr!(d, wr_start());
    for r in int_rets("qp_ex.wr_complete") {
        record::set_ret("qp_ex.wr_complete", r);
        assert_eq!(wr!(d, wr_complete()), r as c_int);
    }
    wr!(d, wr_abort());
}

#[test]
fn wr_send_opcodes_dispatch_like_the_header() {
    let d = Device::new();
    let mut hdr = [0u8; 64];
    let hdr_p = hdr.as_mut_ptr().cast::<c_void>();
    wr!(d, wr_send());
    // Byte-order-asymmetric immediates: a swapped or truncated value would show.
    wr!(d, wr_send_imm(0x0102_0304u32.to_be()));
    wr!(d, wr_send_imm(0xFFEE_DDCCu32));
    wr!(d, wr_send_inv(0x8765_4321u32));
    // u16 arguments with high bits set (ABI widening of narrow integers).
    wr!(d, wr_send_tso(hdr_p, 0xFF42u16, 0x8001u16));
    wr!(d, wr_send_tso(hdr_p, 54u16, 1460u16));
}

#[test]
fn wr_rdma_opcodes_dispatch_like_the_header() {
    let d = Device::new();
    wr!(d, wr_rdma_write(0x1111_2222u32, 0x3333_4444_5555_6666u64));
    wr!(d, wr_rdma_write(u32::MAX, u64::MAX));
    wr!(
        d,
        wr_rdma_write_imm(
            0xA1B2_C3D4u32,
            0x0000_7FFF_0000_1000u64,
            0xDEAD_BEEFu32.to_be()
        )
    );
    wr!(d, wr_rdma_read(0x0BAD_F00Du32, 0x8000_0000_0000_0001u64));
}

#[test]
fn wr_atomic_opcodes_dispatch_like_the_header() {
    let d = Device::new();
    let operand = [0x55u8; 8];
    wr!(
        d,
        wr_atomic_cmp_swp(
            0x7777_0001u32,
            0x1000_2000_3000_4000u64,
            0x0123_4567_89AB_CDEFu64,
            0xFEDC_BA98_7654_3210u64
        )
    );
    wr!(
        d,
        wr_atomic_fetch_add(
            0x7777_0002u32,
            0x1000_2000_3000_4008u64,
            0x8000_0000_0000_0000u64
        )
    );
    wr!(
        d,
        wr_atomic_write(
            0x7777_0003u32,
            0x1000_2000_3000_4010u64,
            operand.as_ptr().cast::<c_void>()
        )
    );
}

#[test]
fn wr_memory_window_opcodes_dispatch_like_the_header() {
    let d = Device::new();
    // SAFETY: all-zero is a valid ibv_mw_bind_info; the provider only logs the pointers.
    let bind: ibv_mw_bind_info = unsafe { zeroed() };
    let mw = 0x6060_6000usize as *mut ibv_mw;
    wr!(d, wr_bind_mw(mw, 0x4242_4242u32, &raw const bind));
    wr!(d, wr_local_inv(0x1357_9BDFu32));
}

#[test]
fn wr_sge_and_inline_setters_dispatch_like_the_header() {
    let d = Device::new();
    let sges = [
        ibv_sge {
            addr: 0x1000,
            length: 64,
            lkey: 1,
        },
        ibv_sge {
            addr: 0x2000,
            length: 128,
            lkey: 2,
        },
    ];
    let mut payload = *b"hello, inline world";
    let p = payload.as_mut_ptr().cast::<c_void>();
    // SAFETY: offset 7 is inside `payload`.
    let p7 = unsafe { p.byte_add(7) };
    let bufs = [
        ibv_data_buf { addr: p, length: 5 },
        ibv_data_buf {
            addr: p7,
            length: 6,
        },
    ];
    wr!(
        d,
        wr_set_sge(0xABCD_0001u32, 0xFFFF_8000_1234_5678u64, 0x8000_0000u32)
    );
    wr!(d, wr_set_sge(0u32, 0u64, 0u32));
    wr!(d, wr_set_sge_list(sges.len(), sges.as_ptr()));
    wr!(d, wr_set_sge_list(usize::MAX, sges.as_ptr()));
    wr!(d, wr_set_inline_data(p, payload.len()));
    wr!(d, wr_set_inline_data(p, 1usize << 40));
    wr!(d, wr_set_inline_data_list(bufs.len(), bufs.as_ptr()));
}

#[test]
fn wr_address_setters_dispatch_like_the_header() {
    let d = Device::new();
    let ah = 0x0A0A_0000usize as *mut ibv_ah;
    wr!(d, wr_set_ud_addr(ah, 0x00FF_FFFFu32, 0x1111_1111u32));
    wr!(d, wr_set_ud_addr(ah, 1u32, 0x8000_0000u32));
    wr!(d, wr_set_xrc_srqn(0x00AB_CDEFu32));
}

/// A realistic batch (start, several WRs with their setters, complete) gives the same
/// provider call sequence through both paths.
#[test]
fn wr_batch_sequence_matches_the_header() {
    let d = Device::new();
    let q = d.qpx;
    let mut data = [7u8; 32];
    let p = data.as_mut_ptr().cast::<c_void>();
    let expected = [
        call!("qp_ex.wr_start", q),
        call!("qp_ex.wr_rdma_write", q, 0x10u32, 0x2000u64),
        call!("qp_ex.wr_set_sge", q, 0x30u32, 0x4000u64, 512u32),
        call!("qp_ex.wr_send_imm", q, 0x0000_0001u32.to_be()),
        call!("qp_ex.wr_set_inline_data", q, p, 32usize),
        call!("qp_ex.wr_send", q),
        call!("qp_ex.wr_set_sge", q, 0x31u32, 0x5000u64, 64u32),
        call!("qp_ex.wr_complete", q),
    ];
    let ret = compare("ibv_wr_* batch", &expected, |side| {
        // SAFETY: q is the fake device's live extended QP; p points into `data`.
        unsafe {
            match side {
                Side::C => {
                    c::hv_c_wr_start(q);
                    c::hv_c_wr_rdma_write(q, 0x10, 0x2000);
                    c::hv_c_wr_set_sge(q, 0x30, 0x4000, 512);
                    c::hv_c_wr_send_imm(q, 0x0000_0001u32.to_be());
                    c::hv_c_wr_set_inline_data(q, p, 32);
                    c::hv_c_wr_send(q);
                    c::hv_c_wr_set_sge(q, 0x31, 0x5000, 64);
                    c::hv_c_wr_complete(q)
                }
                Side::Rust => {
                    inline::ibv_wr_start(q);
                    inline::ibv_wr_rdma_write(q, 0x10, 0x2000);
                    inline::ibv_wr_set_sge(q, 0x30, 0x4000, 512);
                    inline::ibv_wr_send_imm(q, 0x0000_0001u32.to_be());
                    inline::ibv_wr_set_inline_data(q, p, 32);
                    inline::ibv_wr_send(q);
                    inline::ibv_wr_set_sge(q, 0x31, 0x5000, 64);
                    inline::ibv_wr_complete(q)
                }
            }
        }
    });
    assert_eq!(ret, record::ret("qp_ex.wr_complete") as c_int);
}

/// One extended-CQ call on both sides: `cqx!(d, "read_byte_len", hv_c_.., ibv_..)`.
macro_rules! cqx {
    ($d:expr, $slot:literal, $cfn:ident, $rfn:ident $(, $a:expr)*) => {{
        let cq = $d.cqx;
        compare(
            concat!("cq_ex.", $slot),
            &[call!(concat!("cq_ex.", $slot), cq $(, $a)*)],
            |side| {
                // SAFETY: cq is the fake device's live extended CQ with every slot set.
                unsafe {
                    match side {
                        Side::C => c::$cfn(cq $(, $a)*),
                        Side::Rust => inline::$rfn(cq $(, $a)*),
                    }
                }
            },
        )
    }};
}

#[test]
fn extended_poll_family_dispatches_like_the_header() {
    let d = Device::new();
    // SAFETY: all-zero is a valid ibv_poll_cq_attr.
    let mut attr: ibv_poll_cq_attr = unsafe { zeroed() };
    let ap = &raw mut attr;
    for r in [record::ret("cq_ex.start_poll"), 0, i64::from(libc::ENOENT)] {
        record::set_ret("cq_ex.start_poll", r);
        assert_eq!(
            cqx!(d, "start_poll", hv_c_start_poll, ibv_start_poll, ap),
            r as c_int
        );
    }
    for r in [record::ret("cq_ex.next_poll"), 0, i64::from(libc::ENOENT)] {
        record::set_ret("cq_ex.next_poll", r);
        assert_eq!(
            cqx!(d, "next_poll", hv_c_next_poll, ibv_next_poll),
            r as c_int
        );
    }
    cqx!(d, "end_poll", hv_c_end_poll, ibv_end_poll);

    // Each reader returns its slot's distinctive value, truncated to the C return type.
    let opcode = cqx!(d, "read_opcode", hv_c_wc_read_opcode, ibv_wc_read_opcode);
    assert_eq!(opcode, record::ret("cq_ex.read_opcode") as ibv_wc_opcode);
    let vendor = cqx!(
        d,
        "read_vendor_err",
        hv_c_wc_read_vendor_err,
        ibv_wc_read_vendor_err
    );
    assert_eq!(vendor, record::ret("cq_ex.read_vendor_err") as u32);
    let len = cqx!(
        d,
        "read_byte_len",
        hv_c_wc_read_byte_len,
        ibv_wc_read_byte_len
    );
    assert_eq!(len, record::ret("cq_ex.read_byte_len") as u32);
    record::set_ret("cq_ex.read_imm_data", i64::from(0x1122_3344u32.to_be()));
    let imm = cqx!(
        d,
        "read_imm_data",
        hv_c_wc_read_imm_data,
        ibv_wc_read_imm_data
    );
    assert_eq!(imm, 0x1122_3344u32.to_be());
    let qpn = cqx!(d, "read_qp_num", hv_c_wc_read_qp_num, ibv_wc_read_qp_num);
    assert_eq!(qpn, record::ret("cq_ex.read_qp_num") as u32);
    let src = cqx!(d, "read_src_qp", hv_c_wc_read_src_qp, ibv_wc_read_src_qp);
    assert_eq!(src, record::ret("cq_ex.read_src_qp") as u32);
    let flags = cqx!(
        d,
        "read_wc_flags",
        hv_c_wc_read_wc_flags,
        ibv_wc_read_wc_flags
    );
    assert_eq!(flags, record::ret("cq_ex.read_wc_flags") as u32);
    let slid = cqx!(d, "read_slid", hv_c_wc_read_slid, ibv_wc_read_slid);
    assert_eq!(slid, record::ret("cq_ex.read_slid") as u32);
    // A value above 255: the u8 return must be truncated identically on both sides.
    record::set_ret("cq_ex.read_sl", 0x1_2F);
    let sl = cqx!(d, "read_sl", hv_c_wc_read_sl, ibv_wc_read_sl);
    assert_eq!(sl, 0x2F);
    record::set_ret("cq_ex.read_completion_ts", 0x7FFF_FFFF_FFFF_FFF1);
    let ts = cqx!(
        d,
        "read_completion_ts",
        hv_c_wc_read_completion_ts,
        ibv_wc_read_completion_ts
    );
    assert_eq!(ts, 0x7FFF_FFFF_FFFF_FFF1);
    record::set_ret("cq_ex.read_dlid_path_bits", 0x3_41);
    let bits = cqx!(
        d,
        "read_dlid_path_bits",
        hv_c_wc_read_dlid_path_bits,
        ibv_wc_read_dlid_path_bits
    );
    assert_eq!(bits, 0x41);
    record::set_ret("cq_ex.read_completion_wallclock_ns", 0x1234_5678_9ABC_DEF0);
    let wall = cqx!(
        d,
        "read_completion_wallclock_ns",
        hv_c_wc_read_completion_wallclock_ns,
        ibv_wc_read_completion_wallclock_ns
    );
    assert_eq!(wall, 0x1234_5678_9ABC_DEF0);
    record::set_ret("cq_ex.read_cvlan", 0x7_BEEF);
    let vlan = cqx!(d, "read_cvlan", hv_c_wc_read_cvlan, ibv_wc_read_cvlan);
    assert_eq!(vlan, 0xBEEF);
    let tag = cqx!(
        d,
        "read_flow_tag",
        hv_c_wc_read_flow_tag,
        ibv_wc_read_flow_tag
    );
    assert_eq!(tag, record::ret("cq_ex.read_flow_tag") as u32);
    // SAFETY: all-zero is a valid ibv_wc_tm_info.
    let mut tm: ibv_wc_tm_info = unsafe { zeroed() };
    let tmp = &raw mut tm;
    cqx!(
        d,
        "read_tm_info",
        hv_c_wc_read_tm_info,
        ibv_wc_read_tm_info,
        tmp
    );
}

/// `ibv_wc_read_invalidated_rkey`: the header returns `read_imm_data`'s value unchanged
/// (only a `__force` cast for sparse). This test caught an early verbs-ffi version that
/// byte-swapped it with `u32::from_be`.
#[test]
fn wc_read_invalidated_rkey_matches_the_header() {
    let d = Device::new();
    record::set_ret("cq_ex.read_imm_data", 0x1122_3344);
    let cq = d.cqx;
    let rkey = compare(
        "ibv_wc_read_invalidated_rkey",
        &[call!("cq_ex.read_imm_data", cq)],
        |side| {
            // SAFETY: cq is the fake device's live extended CQ.
            unsafe {
                match side {
                    Side::C => c::hv_c_wc_read_invalidated_rkey(cq),
                    Side::Rust => inline::ibv_wc_read_invalidated_rkey(cq),
                }
            }
        },
    );
    assert_eq!(rkey, 0x1122_3344);
}

#[test]
fn cq_ex_to_cq_is_the_headers_cast() {
    let d = Device::new();
    // SAFETY: a pure pointer cast in C.
    let c_cq = unsafe { c::hv_c_cq_ex_to_cq(d.cqx) };
    assert_eq!(inline::ibv_cq_ex_to_cq(d.cqx), c_cq);
    assert_eq!(c_cq as usize, d.cqx as usize);
}

/// The harness itself can fail: a Rust call to the wrong slot, a wrong argument, or a
/// wrong return value is reported as a difference (so the passing tests above mean
/// something).
#[test]
fn harness_detects_wrong_slot_argument_and_return() {
    let d = Device::new();
    let q = d.qpx;
    let wrong_slot = std::panic::catch_unwind(|| {
        compare(
            "negative control",
            &[call!("qp_ex.wr_rdma_write", q, 1u32, 2u64)],
            |side| {
                // SAFETY: q is the fake device's live extended QP.
                unsafe {
                    match side {
                        Side::C => c::hv_c_wr_rdma_write(q, 1, 2),
                        Side::Rust => inline::ibv_wr_rdma_read(q, 1, 2),
                    }
                }
            },
        )
    });
    assert!(wrong_slot.is_err(), "a different slot must be reported");

    let mut op = |side: Side| {
        // SAFETY: q is the fake device's live extended QP.
        unsafe {
            match side {
                Side::C => c::hv_c_wr_set_sge(q, 1, 0x1000, 64),
                Side::Rust => inline::ibv_wr_set_sge(q, 1, 0x1000, 65),
            }
        }
    };
    let (c_side, rust_side) = (run(Side::C, &mut op), run(Side::Rust, &mut op));
    assert_ne!(
        c_side.calls, rust_side.calls,
        "a different argument must be visible"
    );

    let wrong_ret = std::panic::catch_unwind(|| {
        compare(
            "negative control",
            &[call!("qp_ex.wr_complete", q)],
            |side| {
                // SAFETY: q is the fake device's live extended QP.
                let r = unsafe { inline::ibv_wr_complete(q) };
                if side == Side::Rust {
                    r + 1
                } else {
                    r
                }
            },
        )
    });
    assert!(
        wrong_ret.is_err(),
        "a different return value must be reported"
    );
}
