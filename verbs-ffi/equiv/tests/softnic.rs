//! The equivalence, run against softnic's real objects instead of the recording provider:
//! the header's C inlines and `hotverbs_ffi::inline` are driven on the same softnic
//! context, QPs, SRQ and CQ, from the same state, and must return the same values, the
//! same `bad_wr`, the same completions and the same `errno`.
//!
//! softnic's context is extended (a `verbs_context` around it, as libibverbs makes), so the
//! setup inlines reach its extended ops directly; where the header falls back to an
//! exported symbol (`ibv_query_port`, a PD-only `ibv_create_qp_ex`, ...) that is
//! `csrc/equiv.c`'s stand-in, which logs the call and forwards it to softnic's
//! `verbs_table()` (see `record::forward_exports_to`), for the C header and for the Rust
//! side alike.

use core::ffi::c_int;
use core::mem::{size_of, zeroed, MaybeUninit};
use core::ptr;

use hotverbs_ffi::{inline, *};
use hotverbs_ffi_equiv::{c, call, compare, record, Side};
// The raw-verbs setup (PD, CQ, QP, the modify_qp sequence) shared with softnic's tests.
use hotverbs_softnic::testing::{self, ConnectAttr};

/// What `*bad_wr` holds before a post.
const SENTINEL: usize = 0xBAD0_0000;

/// One softnic device with a PD, a CQ, an SRQ and two RC QPs (`a`, `b`).
struct Nic {
    fns: &'static IbvFns,
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    a: *mut ibv_qp,
    b: *mut ibv_qp,
}

impl Nic {
    fn open() -> Nic {
        let fns = hotverbs_softnic::verbs_table();
        let ctx = hotverbs_softnic::open_device(hotverbs_softnic::Config::default());
        assert!(!ctx.is_null(), "softnic open_device failed");
        // SAFETY: softnic's table verbs on its own live context, with valid arguments.
        unsafe {
            let pd = testing::alloc_pd(ctx);
            let cq = testing::create_cq(ctx, 64);
            let mut sattr: ibv_srq_init_attr = zeroed();
            sattr.attr.max_wr = 64;
            sattr.attr.max_sge = 2;
            let srq = fns.ibv_create_srq.unwrap()(pd, &mut sattr);
            assert!(!srq.is_null(), "ibv_create_srq");
            let mut n = Nic {
                fns,
                ctx,
                pd,
                cq,
                srq,
                a: ptr::null_mut(),
                b: ptr::null_mut(),
            };
            n.a = n.create_qp();
            n.b = n.create_qp();
            n
        }
    }

    fn create_qp(&self) -> *mut ibv_qp {
        let cap = ibv_qp_cap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        };
        // SAFETY: softnic's live PD and CQ.
        unsafe { testing::create_qp(self.pd, IBV_QPT_RC, self.cq, self.cq, cap, ptr::null_mut()) }
    }

    /// This file's connection attributes towards `dest_qpn` at `dgid`: local and remote
    /// write only, one RDMA READ/atomic in flight, `min_rnr_timer` 12, hop limit 64.
    fn attrs(dest_qpn: u32, dgid: ibv_gid) -> ConnectAttr {
        ConnectAttr {
            access: IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
            rd_atomic: 1,
            min_rnr_timer: 12,
            hop_limit: 64,
            ..ConnectAttr::new(dest_qpn, dgid)
        }
    }

    fn to_init(&self, qp: *mut ibv_qp) {
        // SAFETY: a live QP of this device.
        unsafe { testing::qp_to_init(qp, &Self::attrs(0, ibv_gid::default())) }
    }

    /// RESET -> INIT -> RTR -> RTS, connected to `peer` (same device, GID index 1).
    fn connect(&self, qp: *mut ibv_qp, peer: *mut ibv_qp) {
        // SAFETY: live QPs and context of this device.
        unsafe {
            let gid = testing::query_gid(self.ctx, 1);
            testing::connect_qp(qp, &Self::attrs((*peer).qp_num, gid));
        }
    }
}

impl Drop for Nic {
    fn drop(&mut self) {
        // SAFETY: destroying our own live softnic objects, children first.
        unsafe {
            assert_eq!(self.fns.ibv_destroy_qp.unwrap()(self.a), 0);
            assert_eq!(self.fns.ibv_destroy_qp.unwrap()(self.b), 0);
            assert_eq!(self.fns.ibv_destroy_srq.unwrap()(self.srq), 0);
            assert_eq!(self.fns.ibv_destroy_cq.unwrap()(self.cq), 0);
            assert_eq!(self.fns.ibv_dealloc_pd.unwrap()(self.pd), 0);
            assert_eq!(self.fns.ibv_close_device.unwrap()(self.ctx), 0);
        }
    }
}

/// The fields of a completion that must agree.
fn wc_key(wc: &ibv_wc) -> (u64, u32, u32, u32, u32, u32, u32) {
    (
        wc.wr_id,
        wc.status,
        wc.opcode,
        wc.byte_len,
        wc.qp_num,
        wc.src_qp,
        wc.wc_flags,
    )
}

/// Polls `cq` through `side`'s `ibv_poll_cq` until it is empty.
///
/// # Safety
/// `cq` is a live softnic CQ.
unsafe fn drain(side: Side, cq: *mut ibv_cq) -> (Vec<c_int>, Vec<ibv_wc>) {
    let mut rets = Vec::new();
    let mut out = Vec::new();
    loop {
        // SAFETY: all-zero is a valid ibv_wc.
        let mut wcs: [ibv_wc; 4] = unsafe { zeroed() };
        // SAFETY: cq live (caller); wcs has room for 4.
        let n = unsafe {
            match side {
                Side::C => c::hv_c_poll_cq(cq, 4, wcs.as_mut_ptr()),
                Side::Rust => inline::ibv_poll_cq(cq, 4, wcs.as_mut_ptr()),
            }
        };
        rets.push(n);
        if n <= 0 {
            return (rets, out);
        }
        out.extend_from_slice(&wcs[..n as usize]);
    }
}

#[test]
fn softnic_rejected_posts_match_the_header() {
    let nic = Nic::open();
    let (a, srq, cq) = (nic.a, nic.srq, nic.cq);
    // SAFETY: all-zero WRs are valid; indices within the arrays.
    let mut swr: [ibv_send_wr; 2] = unsafe { zeroed() };
    let s0 = swr.as_mut_ptr();
    // SAFETY: index 1 of 2.
    let s1 = unsafe { s0.add(1) };
    // SAFETY: s0 points into swr.
    unsafe {
        (*s0).next = s1;
        (*s0).wr_id = 1;
        (*s0).opcode = IBV_WR_SEND;
        (*s1).wr_id = 2;
        (*s1).opcode = IBV_WR_SEND;
    }
    let mut sbad: *mut ibv_send_wr = ptr::null_mut();
    let sbadp = &raw mut sbad;
    // post_send on a QP in RESET: EINVAL, the first WR is the bad one.
    let got = compare("ibv_post_send on RESET QP", &[], |side| {
        // SAFETY: live softnic QP; valid chain; writable bad_wr.
        unsafe {
            *sbadp = SENTINEL as *mut ibv_send_wr;
            let r = match side {
                Side::C => c::hv_c_post_send(a, s0, sbadp),
                Side::Rust => inline::ibv_post_send(a, s0, sbadp),
            };
            (r, *sbadp)
        }
    });
    assert_eq!(got, (libc::EINVAL, s0));

    // SAFETY: all-zero WRs are valid.
    let mut rwr: [ibv_recv_wr; 2] = unsafe { zeroed() };
    let r0 = rwr.as_mut_ptr();
    // SAFETY: index 1 of 2.
    let r1 = unsafe { r0.add(1) };
    // SAFETY: r0 points into rwr.
    unsafe {
        (*r0).next = r1;
        (*r0).wr_id = 10;
        (*r1).wr_id = 11;
    }
    let mut rbad: *mut ibv_recv_wr = ptr::null_mut();
    let rbadp = &raw mut rbad;
    let post_recv = |qp: *mut ibv_qp, what: &str| {
        compare(what, &[], |side| {
            // SAFETY: live softnic QP; valid chain; writable bad_wr.
            unsafe {
                *rbadp = SENTINEL as *mut ibv_recv_wr;
                let r = match side {
                    Side::C => c::hv_c_post_recv(qp, r0, rbadp),
                    Side::Rust => inline::ibv_post_recv(qp, r0, rbadp),
                };
                (r, *rbadp)
            }
        })
    };
    // post_recv in RESET: EINVAL at the first WR.
    assert_eq!(
        post_recv(a, "ibv_post_recv on RESET QP"),
        (libc::EINVAL, r0)
    );
    // In INIT a receive is queued; a second WR with a negative num_sge is rejected.
    nic.to_init(a);
    // SAFETY: r1 points into rwr.
    unsafe { (*r1).num_sge = -1 };
    assert_eq!(post_recv(a, "ibv_post_recv bad 2nd WR"), (libc::EINVAL, r1));

    // The SRQ: same chain, same answer.
    let got = compare("ibv_post_srq_recv bad 2nd WR", &[], |side| {
        // SAFETY: live softnic SRQ; valid chain; writable bad_wr.
        unsafe {
            *rbadp = SENTINEL as *mut ibv_recv_wr;
            let r = match side {
                Side::C => c::hv_c_post_srq_recv(srq, r0, rbadp),
                Side::Rust => inline::ibv_post_srq_recv(srq, r0, rbadp),
            };
            (r, *rbadp)
        }
    });
    assert_eq!(got, (libc::EINVAL, r1));

    // An empty CQ polls 0 through both; arming it succeeds through both.
    let got = compare("ibv_poll_cq empty", &[], |side| {
        // SAFETY: live softnic CQ.
        unsafe { drain(side, cq) }.0
    });
    assert_eq!(got, vec![0]);
    for solicited in [0, 1] {
        let got = compare("ibv_req_notify_cq", &[], |side| {
            // SAFETY: live softnic CQ.
            unsafe {
                match side {
                    Side::C => c::hv_c_req_notify_cq(cq, solicited),
                    Side::Rust => inline::ibv_req_notify_cq(cq, solicited),
                }
            }
        });
        assert_eq!(got, 0);
    }
}

#[test]
fn softnic_send_and_completions_match_the_header() {
    let nic = Nic::open();
    nic.connect(nic.a, nic.b);
    nic.connect(nic.b, nic.a);
    let (fns, a, b, cq) = (nic.fns, nic.a, nic.b, nic.cq);
    let mut rbuf = [0u8; 64];
    let rb = rbuf.as_mut_ptr();
    // SAFETY: softnic's reg_mr on a live PD over our buffer, which outlives the MR.
    let mr = unsafe {
        fns.ibv_reg_mr.unwrap()(
            nic.pd,
            rb.cast(),
            rbuf.len(),
            IBV_ACCESS_LOCAL_WRITE as c_int,
        )
    };
    assert!(!mr.is_null(), "ibv_reg_mr");
    let mut msg = *b"hello through both inlines";
    // SAFETY: mr is live.
    let lkey = unsafe { (*mr).lkey };
    let mut rsge = ibv_sge {
        addr: rb as u64,
        length: 64,
        lkey,
    };
    // SAFETY: all-zero WRs are valid.
    let (mut rwr, mut swr): (ibv_recv_wr, ibv_send_wr) = unsafe { (zeroed(), zeroed()) };
    rwr.wr_id = 0x100;
    rwr.sg_list = &mut rsge;
    rwr.num_sge = 1;
    let mut ssge = ibv_sge {
        addr: msg.as_mut_ptr() as u64,
        length: msg.len() as u32,
        lkey: 0,
    };
    swr.wr_id = 0x200;
    swr.opcode = IBV_WR_SEND_WITH_IMM;
    swr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    swr.__bindgen_anon_1.imm_data = 0x0A0B_0C0Du32.to_be();
    swr.sg_list = &mut ssge;
    swr.num_sge = 1;
    let (rw, sw) = (&raw mut rwr, &raw mut swr);
    let mut rbad: *mut ibv_recv_wr = ptr::null_mut();
    let mut sbad: *mut ibv_send_wr = ptr::null_mut();
    let (rbadp, sbadp) = (&raw mut rbad, &raw mut sbad);

    // The same step from the same state (both QPs in RTS, queues and CQ empty) per side:
    // prepost a receive on b, send from a, drain the CQ, read the received bytes.
    let got = compare("send + poll on softnic", &[], |side| {
        // SAFETY: live softnic objects; WRs, SGEs and buffers outlive the call; the
        // receive buffer is registered; bad_wr pointers are writable.
        unsafe {
            ptr::write_bytes(rb, 0, 64);
            *rbadp = SENTINEL as *mut ibv_recv_wr;
            *sbadp = SENTINEL as *mut ibv_send_wr;
            let rr = match side {
                Side::C => c::hv_c_post_recv(b, rw, rbadp),
                Side::Rust => inline::ibv_post_recv(b, rw, rbadp),
            };
            let sr = match side {
                Side::C => c::hv_c_post_send(a, sw, sbadp),
                Side::Rust => inline::ibv_post_send(a, sw, sbadp),
            };
            let (polls, wcs) = drain(side, cq);
            let imms: Vec<u32> = wcs.iter().map(|w| w.__bindgen_anon_1.imm_data).collect();
            let keys: Vec<_> = wcs.iter().map(wc_key).collect();
            let data = core::slice::from_raw_parts(rb, 64).to_vec();
            (rr, *rbadp, sr, *sbadp, polls, keys, imms, data)
        }
    });
    let (rr, rb_out, sr, sb_out, _polls, keys, imms, data) = got;
    // And what both agreed on is the right thing.
    assert_eq!((rr, rb_out), (0, SENTINEL as *mut ibv_recv_wr));
    assert_eq!((sr, sb_out), (0, SENTINEL as *mut ibv_send_wr));
    assert_eq!(
        keys.len(),
        2,
        "one send and one receive completion: {keys:?}"
    );
    assert!(keys.iter().all(|k| k.1 == IBV_WC_SUCCESS), "{keys:?}");
    let recv = keys
        .iter()
        .position(|k| k.0 == 0x100)
        .expect("receive completion");
    // SAFETY: plain reads of live QPs.
    let (qa, qb) = unsafe { ((*a).qp_num, (*b).qp_num) };
    assert_eq!(keys[recv].2, IBV_WC_RECV);
    assert_eq!(keys[recv].3, msg.len() as u32);
    assert_eq!((keys[recv].4, keys[recv].5), (qb, qa));
    assert_ne!(keys[recv].6 & IBV_WC_WITH_IMM, 0);
    assert_eq!(imms[recv], 0x0A0B_0C0Du32.to_be());
    assert_eq!(&data[..msg.len()], &msg[..]);

    // SAFETY: our MR, no longer used.
    assert_eq!(unsafe { fns.ibv_dereg_mr.unwrap()(mr) }, 0);
}

#[test]
fn softnic_setup_inlines_match_the_header() {
    let nic = Nic::open();
    record::forward_exports_to(Some(nic.fns));
    let fns = c::export_table();
    let (ctx, pd, cq) = (nic.ctx, nic.pd, nic.cq);

    // softnic's context is extended (a verbs_context around it, as libibverbs makes):
    // both sides find the same verbs_context.
    // SAFETY: live context.
    let vctx = unsafe { c::hv_c_verbs_get_ctx(ctx) };
    assert!(!vctx.is_null());
    // SAFETY: live context.
    assert_eq!(unsafe { inline::verbs_get_ctx(ctx) }, vctx);

    for port in [1u8, 2] {
        let mut attr = MaybeUninit::<ibv_port_attr>::uninit();
        let p = attr.as_mut_ptr();
        let expected = call!("export.ibv_query_port", ctx, port, p, true);
        let (ret, bytes) = compare("ibv_query_port on softnic", &[expected], |side| {
            // SAFETY: live context; p writable, filled before the call.
            unsafe {
                ptr::write_bytes(p, 0xA5, 1);
                let r = match side {
                    Side::C => c::hv_c_query_port(ctx, port, p),
                    Side::Rust => inline::ibv_query_port(&fns, ctx, port, p),
                };
                (
                    r,
                    core::slice::from_raw_parts(p.cast::<u8>(), size_of::<ibv_port_attr>())
                        .to_vec(),
                )
            }
        });
        if port == 1 {
            assert_eq!(ret, 0);
            // SAFETY: bytes holds a whole ibv_port_attr.
            let pa = unsafe { ptr::read_unaligned(bytes.as_ptr().cast::<ibv_port_attr>()) };
            assert_eq!((pa.state, pa.gid_tbl_len), (IBV_PORT_ACTIVE, 16));
        } else {
            assert_ne!(ret, 0, "softnic has one port");
        }
    }

    // query_device_ex: softnic's extended op answers (no exported-symbol fallback).
    let mut dattr = MaybeUninit::<ibv_device_attr_ex>::uninit();
    let dp = dattr.as_mut_ptr();
    let (ret, max_qp_wr) = compare("ibv_query_device_ex on softnic", &[], |side| {
        // SAFETY: live context; dp writable, filled before the call.
        unsafe {
            ptr::write_bytes(dp, 0x5A, 1);
            let r = match side {
                Side::C => c::hv_c_query_device_ex(ctx, ptr::null(), dp),
                Side::Rust => inline::ibv_query_device_ex(&fns, ctx, ptr::null(), dp),
            };
            // Everything past orig_attr was written by the op, not left at 0x5A.
            assert_eq!((*dp).max_dm_size, 0);
            assert_eq!((*dp).phys_port_cnt_ex, 1);
            (r, (*dp).orig_attr.max_qp_wr)
        }
    });
    assert_eq!((ret, max_qp_wr), (0, 1_048_576));

    // A PD-only ibv_create_qp_ex is the plain ibv_create_qp; anything else goes to
    // softnic's extended op (no exported-symbol call).
    // SAFETY: all-zero is a valid init attr.
    let mut qattr: ibv_qp_init_attr_ex = unsafe { zeroed() };
    let qa = &raw mut qattr;
    for mask in [
        IBV_QP_INIT_ATTR_PD,
        IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    ] {
        let expected = if mask == IBV_QP_INIT_ATTR_PD {
            vec![call!("export.ibv_create_qp", pd, qa)]
        } else {
            vec![]
        };
        let got = compare("ibv_create_qp_ex on softnic", &expected, |side| {
            // SAFETY: live objects; qa is a valid init attr, reset before each call; a
            // created QP is destroyed before returning.
            unsafe {
                *qa = zeroed();
                (*qa).comp_mask = mask;
                (*qa).pd = pd;
                (*qa).send_cq = cq;
                (*qa).recv_cq = cq;
                (*qa).qp_type = IBV_QPT_RC;
                (*qa).cap.max_send_wr = 4;
                (*qa).cap.max_recv_wr = 4;
                (*qa).cap.max_send_sge = 1;
                (*qa).cap.max_recv_sge = 1;
                let qp = match side {
                    Side::C => c::hv_c_create_qp_ex(ctx, qa),
                    Side::Rust => inline::ibv_create_qp_ex(&fns, ctx, qa),
                };
                if qp.is_null() {
                    return None;
                }
                let seen = ((*qp).qp_type, (*qp).state, (*qp).context == ctx);
                assert_eq!(nic.fns.ibv_destroy_qp.unwrap()(qp), 0);
                Some(seen)
            }
        });
        assert_eq!(
            got,
            Some((IBV_QPT_RC, IBV_QPS_RESET, true)),
            "mask {mask:#x}"
        );
    }

    // SAFETY: all-zero is a valid init attr.
    let mut sattr: ibv_srq_init_attr_ex = unsafe { zeroed() };
    let sa = &raw mut sattr;
    let pd_ty = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
    for (mask, ty) in [(pd_ty, IBV_SRQT_BASIC), (pd_ty, IBV_SRQT_XRC)] {
        let expected = if ty == IBV_SRQT_BASIC {
            vec![call!("export.ibv_create_srq", pd, sa)]
        } else {
            vec![]
        };
        let got = compare("ibv_create_srq_ex on softnic", &expected, |side| {
            // SAFETY: as for the QP above.
            unsafe {
                *sa = zeroed();
                (*sa).comp_mask = mask;
                (*sa).srq_type = ty;
                (*sa).pd = pd;
                (*sa).attr.max_wr = 8;
                (*sa).attr.max_sge = 1;
                let srq = match side {
                    Side::C => c::hv_c_create_srq_ex(ctx, sa),
                    Side::Rust => inline::ibv_create_srq_ex(&fns, ctx, sa),
                };
                if srq.is_null() {
                    return false;
                }
                assert_eq!((*srq).context, ctx);
                assert_eq!(nic.fns.ibv_destroy_srq.unwrap()(srq), 0);
                true
            }
        });
        assert_eq!(got, ty == IBV_SRQT_BASIC);
    }

    // SAFETY: all-zero is a valid init attr.
    let mut cattr: ibv_cq_init_attr_ex = unsafe { zeroed() };
    cattr.cqe = 16;
    let ca = &raw mut cattr;
    let got = compare("ibv_create_cq_ex on softnic", &[], |side| {
        // SAFETY: live context; valid attr; the CQ is destroyed before returning.
        unsafe {
            let cq = match side {
                Side::C => c::hv_c_create_cq_ex(ctx, ca),
                Side::Rust => inline::ibv_create_cq_ex(ctx, ca),
            };
            if cq.is_null() {
                return None;
            }
            let seen = ((*cq).cqe, (*cq).context == ctx, (*cq).start_poll.is_some());
            assert_eq!(
                nic.fns.ibv_destroy_cq.unwrap()(inline::ibv_cq_ex_to_cq(cq)),
                0
            );
            Some(seen)
        }
    });
    assert!(
        matches!(got, Some((cqe, true, true)) if cqe >= 16),
        "{got:?}"
    );

    // GID entries: index 1 is the RoCE v2 GID, an index past the table is ENODATA.
    for index in [1u32, 0, 1000] {
        // SAFETY: all-zero is a valid entry.
        let mut entry: ibv_gid_entry = unsafe { zeroed() };
        let e = &raw mut entry;
        let expected = call!(
            "export._ibv_query_gid_ex",
            ctx,
            1u32,
            index,
            e,
            0u32,
            size_of::<ibv_gid_entry>()
        );
        let (ret, raw, _gid_type) = compare("ibv_query_gid_ex on softnic", &[expected], |side| {
            // SAFETY: live context; e writable, reset before the call.
            unsafe {
                *e = zeroed();
                let r = match side {
                    Side::C => c::hv_c_query_gid_ex(ctx, 1, index, e, 0),
                    Side::Rust => inline::ibv_query_gid_ex(&fns, ctx, 1, index, e, 0),
                };
                (r, (*e).gid.raw, (*e).gid_type)
            }
        });
        if index == 1000 {
            assert_ne!(ret, 0);
        } else {
            assert_eq!(ret, 0, "gid index {index}");
            assert_ne!(raw, [0u8; 16], "gid index {index}");
        }
    }
    record::forward_exports_to(None);
}

/// `ibv_alloc_td` / `ibv_dealloc_td`, `ibv_alloc_parent_domain` and
/// `ibv_query_rt_values_ex` on softnic's extended context: the same answers through the
/// header and through Rust (objects, errno, EOPNOTSUPP in the Rxe profile, where librxe has
/// none of these ops).
#[test]
fn softnic_domains_and_rt_values_match_the_header() {
    let nic = Nic::open();
    let (ctx, pd) = (nic.ctx, nic.pd);
    // SAFETY: a live softnic context.
    let rxe = unsafe { hotverbs_softnic::device_profile(ctx) } == hotverbs_softnic::Profile::Rxe;

    let td = compare("ibv_alloc_td + ibv_dealloc_td on softnic", &[], |side| {
        // SAFETY: live context; a valid attr; the td is freed by the same side.
        unsafe {
            let mut a: ibv_td_init_attr = zeroed();
            let td = match side {
                Side::C => c::hv_c_alloc_td(ctx, &mut a),
                Side::Rust => inline::ibv_alloc_td(ctx, &mut a),
            };
            if td.is_null() {
                return None;
            }
            assert_eq!((*td).context, ctx);
            Some(match side {
                Side::C => c::hv_c_dealloc_td(td),
                Side::Rust => inline::ibv_dealloc_td(td),
            })
        }
    });
    assert_eq!(td, if rxe { None } else { Some(0) });

    let par = compare("ibv_alloc_parent_domain on softnic", &[], |side| {
        // SAFETY: live context and PD; a valid attr; the domain is freed before returning.
        unsafe {
            let mut a: ibv_parent_domain_init_attr = zeroed();
            a.pd = pd;
            let p = match side {
                Side::C => c::hv_c_alloc_parent_domain(ctx, &mut a),
                Side::Rust => inline::ibv_alloc_parent_domain(ctx, &mut a),
            };
            if p.is_null() {
                return None;
            }
            Some(((*p).context == ctx, nic.fns.ibv_dealloc_pd.unwrap()(p)))
        }
    });
    assert_eq!(par, if rxe { None } else { Some((true, 0)) });

    let rt = compare("ibv_query_rt_values_ex on softnic", &[], |side| {
        // SAFETY: live context; a writable values struct.
        unsafe {
            let mut v: ibv_values_ex = zeroed();
            v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
            let r = match side {
                Side::C => c::hv_c_query_rt_values_ex(ctx, &mut v),
                Side::Rust => inline::ibv_query_rt_values_ex(ctx, &mut v),
            };
            (
                r,
                v.comp_mask,
                v.raw_clock.tv_sec,
                r == 0 && v.raw_clock.tv_nsec > 0,
            )
        }
    });
    if rxe {
        assert_eq!(rt.0, libc::EOPNOTSUPP);
    } else {
        assert_eq!(rt, (0, IBV_VALUES_MASK_RAW_CLOCK, 0, true));
    }
}

/// The extended data path on softnic's real `ibv_qp_ex` / `ibv_cq_ex`: the same batch
/// (a WRITE and a SEND_WITH_IMM with inline data) built, completed and polled through the
/// header's `ibv_wr_*` / `ibv_start_poll` family and through Rust's, from the same state,
/// gives the same return values, completions and bytes.
#[test]
fn softnic_extended_post_and_poll_match_the_header() {
    let nic = Nic::open();
    let fns = nic.fns;
    let (ctx, pd) = (nic.ctx, nic.pd);
    // SAFETY: softnic's live objects; valid attrs; everything stays alive for the test.
    let (cqx, qa, qb) = unsafe {
        let mut ca: ibv_cq_init_attr_ex = zeroed();
        ca.cqe = 64;
        ca.wc_flags = (IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM) as u64;
        let cqx = inline::ibv_create_cq_ex(ctx, &mut ca);
        assert!(!cqx.is_null(), "create_cq_ex");
        let mut qa: ibv_qp_init_attr_ex = zeroed();
        qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        qa.pd = pd;
        qa.send_cq = inline::ibv_cq_ex_to_cq(cqx);
        qa.recv_cq = qa.send_cq;
        qa.qp_type = IBV_QPT_RC;
        qa.cap = ibv_qp_cap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        };
        qa.send_ops_flags = (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND_WITH_IMM) as u64;
        let mut qb = qa;
        let a = inline::ibv_create_qp_ex(fns, ctx, &mut qa);
        let b = inline::ibv_create_qp_ex(fns, ctx, &mut qb);
        assert!(!a.is_null() && !b.is_null(), "create_qp_ex");
        (cqx, a, b)
    };
    nic.connect(qa, qb);
    nic.connect(qb, qa);
    // SAFETY: a live softnic QP made by create_qp_ex.
    let x = unsafe { fns.ibv_qp_to_qp_ex.unwrap()(qa) };
    assert!(!x.is_null());
    let mut mem = vec![0u8; 512].into_boxed_slice();
    mem[..8].copy_from_slice(b"ext-data");
    // SAFETY: `mem` outlives the registration (never deregistered before the end).
    let mr = unsafe {
        testing::reg_mr(
            pd,
            mem.as_mut_ptr(),
            512,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
        )
    };
    // SAFETY: a live MR.
    let (lkey, base) = unsafe { ((*mr).lkey, (*mr).addr as u64) };
    let got = compare("ibv_wr_* + ibv_start_poll on softnic", &[], |side| {
        // SAFETY: softnic's live extended QP and CQ; registered memory; builders inside
        // start .. complete; readers after a successful poll.
        unsafe {
            ptr::write_bytes(mem.as_mut_ptr().add(256), 0, 256);
            let mut rs = ibv_sge {
                addr: base + 384,
                length: 64,
                lkey,
            };
            let mut rwr = ibv_recv_wr {
                wr_id: 0x300,
                sg_list: &mut rs,
                num_sge: 1,
                ..Default::default()
            };
            let mut rbad = ptr::null_mut();
            assert_eq!(inline::ibv_post_recv(qb, &mut rwr, &mut rbad), 0);
            let mut note = *b"inline!";
            (*x).wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
            let ret = match side {
                Side::C => {
                    c::hv_c_wr_start(x);
                    (*x).wr_id = 0x101;
                    c::hv_c_wr_rdma_write(x, (*mr).rkey, base + 256);
                    c::hv_c_wr_set_sge(x, lkey, base, 8);
                    (*x).wr_id = 0x102;
                    c::hv_c_wr_send_imm(x, 0x0102_0304u32.to_be());
                    c::hv_c_wr_set_inline_data(x, note.as_mut_ptr().cast(), note.len());
                    c::hv_c_wr_complete(x)
                }
                Side::Rust => {
                    inline::ibv_wr_start(x);
                    (*x).wr_id = 0x101;
                    inline::ibv_wr_rdma_write(x, (*mr).rkey, base + 256);
                    inline::ibv_wr_set_sge(x, lkey, base, 8);
                    (*x).wr_id = 0x102;
                    inline::ibv_wr_send_imm(x, 0x0102_0304u32.to_be());
                    inline::ibv_wr_set_inline_data(x, note.as_mut_ptr().cast(), note.len());
                    inline::ibv_wr_complete(x)
                }
            };
            let mut seen = Vec::new();
            let mut attr: ibv_poll_cq_attr = zeroed();
            let mut r = match side {
                Side::C => c::hv_c_start_poll(cqx, &mut attr),
                Side::Rust => inline::ibv_start_poll(cqx, &mut attr),
            };
            let started = r == 0;
            while r == 0 {
                let fields = match side {
                    Side::C => (
                        c::hv_c_wc_read_opcode(cqx),
                        c::hv_c_wc_read_byte_len(cqx),
                        c::hv_c_wc_read_imm_data(cqx),
                        c::hv_c_wc_read_qp_num(cqx),
                    ),
                    Side::Rust => (
                        inline::ibv_wc_read_opcode(cqx),
                        inline::ibv_wc_read_byte_len(cqx),
                        inline::ibv_wc_read_imm_data(cqx),
                        inline::ibv_wc_read_qp_num(cqx),
                    ),
                };
                seen.push(((*cqx).wr_id, (*cqx).status, fields));
                r = match side {
                    Side::C => c::hv_c_next_poll(cqx),
                    Side::Rust => inline::ibv_next_poll(cqx),
                };
            }
            if started {
                match side {
                    Side::C => c::hv_c_end_poll(cqx),
                    Side::Rust => inline::ibv_end_poll(cqx),
                }
            }
            (ret, r, seen, mem[256..264].to_vec(), mem[384..391].to_vec())
        }
    });
    let (ret, last, seen, written, received) = got;
    assert_eq!((ret, last), (0, libc::ENOENT));
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen.iter().all(|s| s.1 == IBV_WC_SUCCESS), "{seen:?}");
    assert_eq!(&written[..], b"ext-data");
    assert_eq!(&received[..], b"inline!");
    let recv = seen
        .iter()
        .find(|s| s.0 == 0x300)
        .expect("receive completion");
    assert_eq!((recv.2 .1, recv.2 .2), (7, 0x0102_0304u32.to_be()));
    // SAFETY: our own live objects, destroyed once, before the Nic's PD and context.
    unsafe {
        assert_eq!(fns.ibv_destroy_qp.unwrap()(qa), 0);
        assert_eq!(fns.ibv_destroy_qp.unwrap()(qb), 0);
        assert_eq!(fns.ibv_destroy_cq.unwrap()(inline::ibv_cq_ex_to_cq(cqx)), 0);
        assert_eq!(fns.ibv_dereg_mr.unwrap()(mr), 0);
    }
}
