//! Soundness review items 1 and 2, and MW_BIND: memory a peer or the NIC can reach is never
//! handed out as a safe slice, and safety never depends on `Drop` running.
//!
//! 1. A forgotten `Mr` over borrowed memory used to stay registered: register `buf` with
//!    REMOTE_WRITE, take `mr.remote()`, `mem::forget(mr)`; the borrow ended, the rkey
//!    lived, and an RDMA WRITE changed `buf` under a live `&buf` (and wrote freed memory
//!    after `drop(buf)`). Now borrowed memory is registered for local access only, or for
//!    the length of a scope.
//! 2. Receives stay posted after the code that posted them is gone (a dropped `RecvRing`):
//!    the safe `Mr::as_slice` over the LOCAL_WRITE-only region gave a `&[u8]` the peer's
//!    next SEND changed. Now the region is leased to the QP until it is reset or destroyed.

use std::time::Duration;

use hotverbs::*;

const T: Duration = Duration::from_secs(5);

struct Pair {
    _ctx: Context,
    pd: Pd,
    cq_a: Cq,
    cq_b: Cq,
    a: Qp,
    b: Qp,
    port: PortInfo,
}

fn pair() -> Pair {
    let ctx = Context::open("softnic").expect("softnic always opens");
    let pd = ctx.alloc_pd().unwrap();
    let cq_a = ctx.create_cq(64, None).unwrap();
    let cq_b = ctx.create_cq(64, None).unwrap();
    let build = |cq: &Cq| {
        QpBuilder::new(&pd, cq, cq, QpType::Rc)
            .max_inline_data(64)
            .build()
            .unwrap()
    };
    let (a, b) = (build(&cq_a), build(&cq_b));
    let port = ctx.port_info(None, None).unwrap();
    Qp::connect_pair(&a, &b, &port, &ConnectOptions::default()).unwrap();
    Pair {
        _ctx: ctx,
        pd,
        cq_a,
        cq_b,
        a,
        b,
        port,
    }
}

/// Posts one signaled inline RDMA WRITE of `data` from `a` to `dst` and returns its status.
fn inline_write(p: &Pair, data: &[u8], dst: RemoteMr) -> u32 {
    let sge = [Sge {
        addr: data.as_ptr() as u64,
        length: data.len() as u32,
        lkey: 0,
    }];
    // SAFETY: inline: the provider copies `data` during the post.
    unsafe {
        p.a.post_send(&SendWr::write(1, &sge, dst).inline().signaled())
            .unwrap()
    };
    p.cq_a.wait_one(T).unwrap().status_raw()
}

/// Item 1: no safe way registers borrowed memory for a peer without deregistering it
/// before the borrow ends.
#[test]
fn borrowed_memory_is_never_left_reachable_by_a_peer() {
    let p = pair();
    let mut buf = vec![0u8; 64];
    for flag in [
        AccessFlags::REMOTE_WRITE,
        AccessFlags::REMOTE_READ,
        AccessFlags::REMOTE_ATOMIC,
        AccessFlags::MW_BIND,
    ] {
        let e =
            p.pd.reg_mr(&mut buf, AccessFlags::LOCAL_WRITE | flag)
                .expect_err("borrowed memory with a remote flag");
        assert_eq!((e.verb(), e.errno()), ("ibv_reg_mr", libc::EINVAL), "{e}");
    }
    // The reviewer's program, as far as it still compiles: the scope deregisters, so the
    // window the peer kept is dead once the borrow is back.
    let window =
        p.pd.scoped_mr(
            &mut buf,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            |mr| {
                let w = mr.remote();
                assert_eq!(inline_write(&p, b"X", w), 0, "writes land inside the scope");
                assert_eq!(mr.read_vec(0, 1).unwrap(), b"X");
                w
            },
        )
        .unwrap();
    let seen = &buf; // a live shared borrow
    assert_ne!(
        inline_write(&p, b"Y", window),
        0,
        "a write through the dead window must fail"
    );
    assert_eq!(seen[0], b'X', "memory changed under a live &[u8]");
    // A panic inside the scope deregisters too.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        p.pd.scoped_mr(
            &mut buf,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            |mr| {
                let w = mr.remote();
                std::panic::panic_any(w);
            },
        )
    }));
    let w = *r.unwrap_err().downcast::<RemoteMr>().unwrap();
    assert_ne!(inline_write(&p, b"Z", w), 0);
    assert_eq!(buf[0], b'X');
}

/// MW_BIND: a type-2 window bound to the MR can grant remote write, so no safe slice.
#[test]
fn mw_bind_counts_as_remote_writable() {
    let p = pair();
    let mr =
        p.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
            .unwrap();
    assert!(mr.is_remote_writable());
    assert_eq!(mr.as_slice().unwrap_err().errno(), libc::EACCES);
}

/// Item 2: a region with receives posted stays leased to its QP after the code that posted
/// them is gone, until the QP is reset.
#[test]
fn a_receive_region_stays_leased_until_the_qp_is_reset() {
    let p = pair();
    let region = p.pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
    assert!(region.as_slice().is_ok(), "not leased yet");
    {
        // What a receive ring does: lease, post, and go away without taking them back.
        let sge = p.b.lease_recv(&region, 0, 64).unwrap();
        // SAFETY: the region is leased to `b` (no safe slice until b is reset) and owned by
        // `region`, which outlives the QPs' use of it in this test.
        unsafe { p.b.post_recv(7, &[sge]).unwrap() };
    }
    let e = region.as_slice().unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("Mr::as_slice", libc::EBUSY), "{e}");
    assert!(region.is_leased());
    // The peer's SEND lands in the leased region: only the atomic copy may look at it.
    let sge = [Sge {
        addr: b"P".as_ptr() as u64,
        length: 1,
        lkey: 0,
    }];
    // SAFETY: inline.
    unsafe {
        p.a.post_send(&SendWr::send(2, &sge).inline().signaled())
            .unwrap()
    };
    assert_eq!(p.cq_a.wait_one(T).unwrap().status(), Ok(()));
    assert_eq!(p.cq_b.wait_one(T).unwrap().status(), Ok(()));
    assert_eq!(region.read_vec(0, 1).unwrap(), b"P");
    assert!(
        region.as_slice().is_err(),
        "still leased: reset ends the lease"
    );
    p.b.reset().unwrap();
    assert!(!region.is_leased());
    assert_eq!(region.as_slice().unwrap()[0], b'P');
    // After reconnecting, a new lease; destroying the QP ends it too.
    let port = &p.port;
    p.b.connect(port, &p.a.endpoint(port), &ConnectOptions::default())
        .unwrap();
    let _ = p.b.lease_recv(&region, 64, 64).unwrap();
    assert!(region.as_slice().is_err());
    let Pair { b, .. } = p;
    b.destroy().unwrap();
    assert!(region.as_slice().is_ok());
}

/// An SRQ's receives survive a QP reset: its leases end only when it is destroyed.
#[test]
fn an_srq_lease_ends_with_the_srq() {
    let p = pair();
    let srq = p.pd.create_srq(16, 1).unwrap();
    let region = p.pd.alloc_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
    let qp = QpBuilder::new(&p.pd, &p.cq_b, &p.cq_b, QpType::Rc)
        .srq(&srq)
        .build()
        .unwrap();
    let e = qp.lease_recv(&region, 0, 64).unwrap_err();
    assert_eq!(
        e.errno(),
        libc::EINVAL,
        "a QP with an SRQ leases through the SRQ"
    );
    let _sge = srq.lease_recv(&region, 0, 64).unwrap();
    qp.reset().unwrap();
    assert!(
        region.is_leased(),
        "a QP reset leaves the SRQ's receives posted"
    );
    drop(qp);
    drop(srq);
    assert!(!region.is_leased());
}

/// Leases check what a receive needs: LOCAL_WRITE, the queue's PD, a range inside the MR.
#[test]
fn lease_arguments_are_checked() {
    let p = pair();
    let ro = p.pd.alloc_mr(64, AccessFlags::empty()).unwrap();
    assert_eq!(p.b.lease_recv(&ro, 0, 8).unwrap_err().errno(), libc::EINVAL);
    let rw = p.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(
        p.b.lease_recv(&rw, 60, 8).unwrap_err().errno(),
        libc::EINVAL
    );
    let other_pd = p.pd.context().alloc_pd().unwrap();
    let elsewhere = other_pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(
        p.b.lease_recv(&elsewhere, 0, 8).unwrap_err().errno(),
        libc::EINVAL
    );
    assert!(!ro.is_leased() && !rw.is_leased() && !elsewhere.is_leased());
}
