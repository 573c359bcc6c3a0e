//! Equivalence of the setup-side inlines, which follow the header's `verbs_context` logic:
//! `verbs_get_ctx`, `___ibv_query_port` (the `ibv_query_port` macro), `ibv_query_device_ex`,
//! `ibv_create_qp_ex`, `ibv_create_srq_ex`, `ibv_create_cq_ex`, `ibv_alloc_td`,
//! `ibv_dealloc_td`, `ibv_alloc_parent_domain`, `ibv_query_rt_values_ex`, and the
//! size-passing wrappers `ibv_query_gid_ex` / `ibv_query_gid_table`.
//!
//! Each is driven through the extended path (`abi_compat` = `__VERBS_ABI_IS_EXTENDED`,
//! op set, `sz` covering it), the `verbs_get_ctx_op` refusals (legacy context, op NULL,
//! `sz` one byte too small, `sz` 0) and the fallbacks to the exported symbols, which here
//! are `csrc/equiv.c`'s recording stand-ins: the C header calls them by symbol, the Rust
//! side through an `IbvFns` table holding the very same functions.

use core::ffi::c_int;
use core::mem::{size_of, zeroed, MaybeUninit};
use core::ptr;

use hotverbs_ffi::{inline, *};
use hotverbs_ffi_equiv::{c, call, compare, fake::Device, min_sz, record, Call, Side};

/// The bytes of `*p` (to compare what each side left in an output struct, padding
/// included: the header's `memset` and Rust's `write_bytes` must both have run).
///
/// # Safety
/// `p` is valid for reading a `T`, every byte initialised.
unsafe fn bytes<T>(p: *const T) -> Vec<u8> {
    // SAFETY: caller's contract.
    unsafe { core::slice::from_raw_parts(p.cast::<u8>(), size_of::<T>()) }.to_vec()
}

/// `(extended, sz, uses_op)` for every context variant of one op: the op is used exactly when
/// the context is extended and `sz >= min`.
fn contexts(min: usize) -> Vec<(bool, usize, bool)> {
    let mut v = Vec::new();
    for extended in [true, false] {
        for sz in Device::sz_cases(min) {
            v.push((extended, sz, extended && sz >= min));
        }
    }
    v
}

fn device(extended: bool, sz: usize) -> Device {
    let mut d = Device::new();
    d.set_sz(sz);
    if !extended {
        d.make_legacy();
    }
    d
}

#[test]
fn verbs_get_ctx_and_abi_marker_match_the_header() {
    // SAFETY: returns the header's constant.
    let c_marker = unsafe { c::hv_c_abi_is_extended() };
    assert_eq!(VERBS_ABI_IS_EXTENDED, c_marker);

    let mut d = Device::new();
    for extended in [true, false] {
        if !extended {
            d.make_legacy();
        }
        let ctx = d.ctx;
        let got = compare("verbs_get_ctx", &[], |side| {
            // SAFETY: ctx is the fake device's live context.
            unsafe {
                match side {
                    Side::C => c::hv_c_verbs_get_ctx(ctx),
                    Side::Rust => inline::verbs_get_ctx(ctx),
                }
            }
        });
        let want = if extended { d.vctx } else { ptr::null_mut() };
        assert_eq!(got, want, "extended={extended}");
    }
}

#[test]
fn query_port_matches_the_header_on_every_path() {
    let fns = c::export_table();
    for (extended, sz, uses_op) in contexts(min_sz!(query_port)) {
        for clear_op in [false, true] {
            let mut d = device(extended, sz);
            if clear_op {
                d.clear_ext_ops();
            }
            let uses_op = uses_op && !clear_op;
            for port in [1u8, 2, 0xFF] {
                let mut attr = MaybeUninit::<ibv_port_attr>::uninit();
                let p = attr.as_mut_ptr();
                let expected = if uses_op {
                    // The op gets the new struct's size and the caller's bytes untouched.
                    call!(
                        "vctx.query_port",
                        d.ctx,
                        port,
                        p,
                        size_of::<ibv_port_attr>(),
                        false
                    )
                } else {
                    // The exported symbol gets the whole new struct zeroed first.
                    call!("export.ibv_query_port", d.ctx, port, p, true)
                };
                let what = format!("ibv_query_port ext={extended} sz={sz} no_op={clear_op}");
                let ctx = d.ctx;
                let (ret, out) = compare(&what, &[expected], |side| {
                    // SAFETY: ctx is live; p is a writable ibv_port_attr, fully written
                    // (0xA5) before the call so every byte is initialised afterwards.
                    unsafe {
                        ptr::write_bytes(p, 0xA5, 1);
                        let r = match side {
                            Side::C => c::hv_c_query_port(ctx, port, p),
                            Side::Rust => inline::ibv_query_port(&fns, ctx, port, p),
                        };
                        (r, bytes(p))
                    }
                });
                let slot = if uses_op {
                    "vctx.query_port"
                } else {
                    "export.ibv_query_port"
                };
                assert_eq!(ret, record::ret(slot) as c_int, "{what}");
                // SAFETY: `out` holds a whole ibv_port_attr.
                let lid = unsafe { ptr::read_unaligned(out.as_ptr().cast::<ibv_port_attr>()) }.lid;
                let tag = if uses_op { 0x4000 } else { 0x2000 };
                assert_eq!(lid, tag | u16::from(port), "{what}");
            }
        }
    }
}

#[test]
fn query_device_ex_matches_the_header_on_every_path() {
    let fns = c::export_table();
    // SAFETY: all-zero is a valid ibv_query_device_ex_input.
    let mut input: ibv_query_device_ex_input = unsafe { zeroed() };
    let inp = &raw mut input;
    for (extended, sz, uses_op) in contexts(min_sz!(query_device_ex)) {
        // What the op answers: success, a real error (returned as is), and the two
        // "not supported" answers the header falls back on.
        let op_rets = [
            record::ret("vctx.query_device_ex"),
            0,
            i64::from(libc::EINVAL),
            i64::from(libc::EOPNOTSUPP),
            i64::from(libc::ENOSYS),
        ];
        for op_ret in op_rets {
            for input_ptr in [ptr::null_mut(), inp] {
                let d = device(extended, sz);
                record::set_ret("vctx.query_device_ex", op_ret);
                let mut attr = MaybeUninit::<ibv_device_attr_ex>::uninit();
                let p = attr.as_mut_ptr();
                let orig = p.cast::<ibv_device_attr>();
                let falls_back = !uses_op
                    || op_ret == i64::from(libc::EOPNOTSUPP)
                    || op_ret == i64::from(libc::ENOSYS);
                let mut expected: Vec<Call> = Vec::new();
                if uses_op {
                    expected.push(call!(
                        "vctx.query_device_ex",
                        d.ctx,
                        input_ptr,
                        p,
                        size_of::<ibv_device_attr_ex>(),
                        false
                    ));
                }
                if falls_back {
                    expected.push(call!("export.ibv_query_device", d.ctx, orig, true));
                }
                let what = format!("ibv_query_device_ex ext={extended} sz={sz} op_ret={op_ret}");
                let ctx = d.ctx;
                let (ret, _out) = compare(&what, &expected, |side| {
                    // SAFETY: ctx is live; input_ptr is null or a valid input; p is a
                    // writable attr, fully written (0x5A) before the call.
                    unsafe {
                        ptr::write_bytes(p, 0x5A, 1);
                        let r = match side {
                            Side::C => c::hv_c_query_device_ex(ctx, input_ptr, p),
                            Side::Rust => inline::ibv_query_device_ex(&fns, ctx, input_ptr, p),
                        };
                        (r, bytes(p))
                    }
                });
                let want = if falls_back {
                    record::ret("export.ibv_query_device")
                } else {
                    op_ret
                };
                assert_eq!(ret, want as c_int, "{what}");
            }
        }
    }
}

#[test]
fn query_device_ex_rejects_input_comp_mask_like_the_header() {
    let fns = c::export_table();
    let d = Device::new();
    // SAFETY: all-zero is a valid ibv_query_device_ex_input.
    let mut input: ibv_query_device_ex_input = unsafe { zeroed() };
    input.comp_mask = 1;
    let inp = &raw mut input;
    let mut attr = MaybeUninit::<ibv_device_attr_ex>::uninit();
    let p = attr.as_mut_ptr();
    let ctx = d.ctx;
    // No provider call at all, EINVAL, and the caller's struct untouched.
    let (ret, out) = compare("ibv_query_device_ex comp_mask", &[], |side| {
        // SAFETY: as in the test above.
        unsafe {
            ptr::write_bytes(p, 0x5A, 1);
            let r = match side {
                Side::C => c::hv_c_query_device_ex(ctx, inp, p),
                Side::Rust => inline::ibv_query_device_ex(&fns, ctx, inp, p),
            };
            (r, bytes(p))
        }
    });
    assert_eq!(ret, libc::EINVAL);
    assert!(out.iter().all(|&b| b == 0x5A));
}

#[test]
fn create_qp_ex_matches_the_header_on_every_path() {
    let fns = c::export_table();
    let pd = 0x0D00_0000usize as *mut ibv_pd;
    let masks = [
        IBV_QP_INIT_ATTR_PD,
        IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS,
        0,
    ];
    for (extended, sz, uses_op) in contexts(min_sz!(create_qp_ex)) {
        for mask in masks {
            let d = device(extended, sz);
            // SAFETY: all-zero is a valid ibv_qp_init_attr_ex.
            let mut attr: ibv_qp_init_attr_ex = unsafe { zeroed() };
            attr.comp_mask = mask;
            attr.pd = pd;
            attr.qp_type = IBV_QPT_RC;
            let a = &raw mut attr;
            let (expected, want) = if mask == IBV_QP_INIT_ATTR_PD {
                // Only the PD: the plain exported ibv_create_qp, whatever the context.
                (
                    vec![call!("export.ibv_create_qp", pd, a)],
                    record::ret("export.ibv_create_qp"),
                )
            } else if uses_op {
                (
                    vec![call!("vctx.create_qp_ex", d.ctx, a)],
                    record::ret("vctx.create_qp_ex"),
                )
            } else {
                (vec![], 0)
            };
            let what = format!("ibv_create_qp_ex ext={extended} sz={sz} mask={mask:#x}");
            let ctx = d.ctx;
            let qp = compare(&what, &expected, |side| {
                // SAFETY: ctx is live; a is a valid, writable init attr.
                unsafe {
                    match side {
                        Side::C => c::hv_c_create_qp_ex(ctx, a),
                        Side::Rust => inline::ibv_create_qp_ex(&fns, ctx, a),
                    }
                }
            });
            assert_eq!(qp as usize, want as usize * 64, "{what}");
            if expected.is_empty() {
                // compare() already checked the errno is the header's; state it too.
                let out = hotverbs_ffi_equiv::run(Side::Rust, &mut |_| {
                    // SAFETY: as above.
                    unsafe { inline::ibv_create_qp_ex(&fns, ctx, a) }
                });
                assert_eq!(out.errno, libc::EOPNOTSUPP, "{what}");
            }
        }
    }
}

#[test]
fn create_srq_ex_matches_the_header_on_every_path() {
    let fns = c::export_table();
    let pd = 0x0D00_0000usize as *mut ibv_pd;
    let pd_ty = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
    // (comp_mask, srq_type, is it the header's "basic SRQ" -> ibv_create_srq case?)
    let cases = [
        (IBV_SRQ_INIT_ATTR_PD, IBV_SRQT_XRC, true), // type not in the mask: ignored
        (pd_ty, IBV_SRQT_BASIC, true),
        (pd_ty, IBV_SRQT_XRC, false),
        (pd_ty, IBV_SRQT_TM, false),
        (IBV_SRQ_INIT_ATTR_TYPE, IBV_SRQT_BASIC, false), // no PD
        (0, IBV_SRQT_BASIC, false),
        (
            IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ,
            IBV_SRQT_BASIC,
            false,
        ),
        (pd_ty | IBV_SRQ_INIT_ATTR_XRCD, IBV_SRQT_BASIC, false),
        (
            IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_RESERVED,
            IBV_SRQT_BASIC,
            false,
        ),
    ];
    for (extended, sz, uses_op) in contexts(min_sz!(create_srq_ex)) {
        for (mask, srq_type, basic) in cases {
            let d = device(extended, sz);
            // SAFETY: all-zero is a valid ibv_srq_init_attr_ex.
            let mut attr: ibv_srq_init_attr_ex = unsafe { zeroed() };
            attr.comp_mask = mask;
            attr.srq_type = srq_type;
            attr.pd = pd;
            attr.attr.max_wr = 16;
            let a = &raw mut attr;
            let expected = if basic {
                vec![call!("export.ibv_create_srq", pd, a)]
            } else if uses_op {
                vec![call!("vctx.create_srq_ex", d.ctx, a)]
            } else {
                vec![]
            };
            let what =
                format!("ibv_create_srq_ex ext={extended} sz={sz} mask={mask:#x} type={srq_type}");
            let ctx = d.ctx;
            let srq = compare(&what, &expected, |side| {
                // SAFETY: ctx is live; a is a valid, writable init attr.
                unsafe {
                    match side {
                        Side::C => c::hv_c_create_srq_ex(ctx, a),
                        Side::Rust => inline::ibv_create_srq_ex(&fns, ctx, a),
                    }
                }
            });
            assert_eq!(srq.is_null(), expected.is_empty(), "{what}");
        }
    }
}

#[test]
fn create_cq_ex_matches_the_header_on_every_path() {
    for (extended, sz, uses_op) in contexts(min_sz!(create_cq_ex)) {
        for clear_op in [false, true] {
            let mut d = device(extended, sz);
            if clear_op {
                d.clear_ext_ops();
            }
            let uses_op = uses_op && !clear_op;
            // SAFETY: all-zero is a valid ibv_cq_init_attr_ex.
            let mut attr: ibv_cq_init_attr_ex = unsafe { zeroed() };
            attr.cqe = 256;
            let a = &raw mut attr;
            let expected = if uses_op {
                vec![call!("vctx.create_cq_ex", d.ctx, a)]
            } else {
                vec![]
            };
            let what = format!("ibv_create_cq_ex ext={extended} sz={sz} no_op={clear_op}");
            let ctx = d.ctx;
            let cq = compare(&what, &expected, |side| {
                // SAFETY: ctx is live; a is a valid init attr.
                unsafe {
                    match side {
                        Side::C => c::hv_c_create_cq_ex(ctx, a),
                        Side::Rust => inline::ibv_create_cq_ex(ctx, a),
                    }
                }
            });
            assert_eq!(cq.is_null(), !uses_op, "{what}");
        }
    }
}

#[test]
fn query_gid_ex_and_table_match_the_header() {
    let fns = c::export_table();
    let d = Device::new();
    let ctx = d.ctx;
    // SAFETY: all-zero is a valid ibv_gid_entry.
    let mut entries: [ibv_gid_entry; 4] = unsafe { zeroed() };
    let e = entries.as_mut_ptr();
    let entry_size = size_of::<ibv_gid_entry>();
    for r in [
        record::ret("export._ibv_query_gid_ex"),
        0,
        i64::from(libc::ENODATA),
    ] {
        record::set_ret("export._ibv_query_gid_ex", r);
        for (port, index, flags) in [(1u32, 1u32, 0u32), (2, 0xFFFF_FFFF, 0x8000_0001)] {
            let what = format!("ibv_query_gid_ex port={port} index={index}");
            let expected = call!(
                "export._ibv_query_gid_ex",
                ctx,
                port,
                index,
                e,
                flags,
                entry_size
            );
            let (ret, idx) = compare(&what, &[expected], |side| {
                // SAFETY: ctx is live; e is a writable ibv_gid_entry.
                unsafe {
                    (*e).gid_index = 0;
                    let r = match side {
                        Side::C => c::hv_c_query_gid_ex(ctx, port, index, e, flags),
                        Side::Rust => inline::ibv_query_gid_ex(&fns, ctx, port, index, e, flags),
                    };
                    (r, (*e).gid_index)
                }
            });
            assert_eq!((ret, idx), (r as c_int, index), "{what}");
        }
    }
    for r in [
        record::ret("export._ibv_query_gid_table"),
        3,
        -i64::from(libc::EINVAL),
    ] {
        record::set_ret("export._ibv_query_gid_table", r);
        for (max, flags) in [(4usize, 0u32), (usize::MAX, 0xFFFF_FFFF)] {
            let what = format!("ibv_query_gid_table max={max}");
            let expected = call!(
                "export._ibv_query_gid_table",
                ctx,
                e,
                max,
                flags,
                entry_size
            );
            let ret = compare(&what, &[expected], |side| {
                // SAFETY: ctx is live; the stand-in never dereferences the entries.
                unsafe {
                    match side {
                        Side::C => c::hv_c_query_gid_table(ctx, e, max, flags),
                        Side::Rust => inline::ibv_query_gid_table(&fns, ctx, e, max, flags),
                    }
                }
            });
            assert_eq!(ret, r as isize, "{what}");
        }
    }
}

/// The four thread/parent-domain and clock inlines: the op with the header's arguments when
/// `verbs_get_ctx_op` finds it, else the header's refusal (NULL + errno EOPNOTSUPP for the
/// constructors, EOPNOTSUPP returned for `ibv_dealloc_td` / `ibv_query_rt_values_ex`), with
/// the op's value passed through unchanged (a pointer, 0, or an errno).
#[test]
fn td_parent_domain_and_rt_values_match_the_header_on_every_path() {
    for (op, min) in [
        ("alloc_td", min_sz!(alloc_td)),
        ("dealloc_td", min_sz!(dealloc_td)),
        ("alloc_parent_domain", min_sz!(alloc_parent_domain)),
        ("query_rt_values", min_sz!(query_rt_values)),
    ] {
        let slot: &'static str = match op {
            "alloc_td" => "vctx.alloc_td",
            "dealloc_td" => "vctx.dealloc_td",
            "alloc_parent_domain" => "vctx.alloc_parent_domain",
            _ => "vctx.query_rt_values",
        };
        for (extended, sz, uses_op) in contexts(min) {
            for clear_op in [false, true] {
                // The op's own answers: its distinctive value, success, an errno.
                for r in [None, Some(0i64), Some(i64::from(libc::EINVAL))] {
                    let mut d = device(extended, sz);
                    if clear_op {
                        d.clear_ext_ops();
                    }
                    if let Some(r) = r {
                        record::set_ret(slot, r);
                    }
                    let uses_op = uses_op && !clear_op;
                    let (ctx, td) = (d.ctx, d.td);
                    // SAFETY: all-zero is valid for these attrs.
                    let (mut ta, mut pa, mut va): (
                        ibv_td_init_attr,
                        ibv_parent_domain_init_attr,
                        ibv_values_ex,
                    ) = unsafe { (zeroed(), zeroed(), zeroed()) };
                    let (tap, pap, vap) = (&raw mut ta, &raw mut pa, &raw mut va);
                    let expected = match (uses_op, op) {
                        (false, _) => vec![],
                        (true, "alloc_td") => vec![call!(slot, ctx, tap)],
                        (true, "dealloc_td") => vec![call!(slot, td)],
                        (true, "alloc_parent_domain") => vec![call!(slot, ctx, pap)],
                        (true, _) => vec![call!(slot, ctx, vap)],
                    };
                    let what = format!("{op} ext={extended} sz={sz} no_op={clear_op} ret={r:?}");
                    let got = compare(&what, &expected, |side| {
                        // SAFETY: the fake device's live objects; valid attrs.
                        unsafe {
                            match (side, op) {
                                (Side::C, "alloc_td") => c::hv_c_alloc_td(ctx, tap) as i64,
                                (Side::Rust, "alloc_td") => inline::ibv_alloc_td(ctx, tap) as i64,
                                (Side::C, "dealloc_td") => i64::from(c::hv_c_dealloc_td(td)),
                                (Side::Rust, "dealloc_td") => i64::from(inline::ibv_dealloc_td(td)),
                                (Side::C, "alloc_parent_domain") => {
                                    c::hv_c_alloc_parent_domain(ctx, pap) as i64
                                }
                                (Side::Rust, "alloc_parent_domain") => {
                                    inline::ibv_alloc_parent_domain(ctx, pap) as i64
                                }
                                (Side::C, _) => i64::from(c::hv_c_query_rt_values_ex(ctx, vap)),
                                (Side::Rust, _) => {
                                    i64::from(inline::ibv_query_rt_values_ex(ctx, vap))
                                }
                            }
                        }
                    });
                    if !uses_op {
                        let refusal = match op {
                            "alloc_td" | "alloc_parent_domain" => 0,
                            _ => i64::from(libc::EOPNOTSUPP),
                        };
                        assert_eq!(got, refusal, "{what}");
                    }
                }
            }
        }
    }
}
