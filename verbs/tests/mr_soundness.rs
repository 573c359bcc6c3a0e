//! `Mr::read_into` / `Mr::write_from` are documented as safe "even while a peer writes (or
//! reads) it". On softnic the peer is code in this process, so that promise holds only if
//! softnic's copies follow Rust's memory model: atomics of the same size as `Mr`'s on the
//! same addresses (a plain write, or a different-size atomic, racing an atomic load is
//! undefined behaviour). These tests race the two from different threads; natively they
//! check the bytes, under miri they are the regression tests of the data race
//! (`cargo +nightly miri test -p hotverbs --test mr_soundness`, no MIRIFLAGS needed: the
//! QPs are made with softnic's raw-verbs helpers, which need no clock).

use hotverbs::{AccessFlags, Context, Cq, Pd};
use hotverbs_ffi::*;
use hotverbs_softnic::testing;

/// Bytes per message: whole aligned words and a ragged tail (both access sizes).
const LEN: usize = 61;
/// Messages per test (miri interprets every byte access; natively, more rounds give the
/// threads time to overlap).
const ROUNDS: u8 = if cfg!(miri) { 3 } else { 200 };

/// Two connected RC QPs on raw softnic verbs, `a` -> `b`, both on `cq`; destroyed on drop
/// (before the CQ, whose destruction they would otherwise refuse).
struct RawPair {
    a: *mut ibv_qp,
    b: *mut ibv_qp,
}

impl RawPair {
    fn new(ctx: &Context, pd: &Pd, cq: &Cq) -> RawPair {
        let cap = ibv_qp_cap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        // SAFETY: pd, cq and ctx are live hotverbs objects of one softnic context; the QPs
        // are destroyed in Drop, before `cq` and `pd` (declared earlier by the callers).
        unsafe {
            let a = testing::create_qp(
                pd.as_raw(),
                IBV_QPT_RC,
                cq.as_raw(),
                cq.as_raw(),
                cap,
                std::ptr::null_mut(),
            );
            let b = testing::create_qp(
                pd.as_raw(),
                IBV_QPT_RC,
                cq.as_raw(),
                cq.as_raw(),
                cap,
                std::ptr::null_mut(),
            );
            let gid = testing::query_gid(ctx.as_raw(), 1);
            testing::connect_qp(a, &testing::ConnectAttr::new((*b).qp_num, gid));
            testing::connect_qp(b, &testing::ConnectAttr::new((*a).qp_num, gid));
            RawPair { a, b }
        }
    }

    /// Posts one signaled RDMA WR from `a` and waits for its completion.
    fn run(&self, cq: &Cq, mut wr: ibv_send_wr) {
        let mut bad = std::ptr::null_mut();
        wr.send_flags |= IBV_SEND_SIGNALED;
        // SAFETY: a live QP; `wr` and its SGE list (kept alive by the caller) are valid;
        // softnic executes the WR inside the call, on memory registered with it.
        let rc = unsafe { inline::ibv_post_send(self.a, &mut wr, &mut bad) };
        assert_eq!(rc, 0);
        let wc = cq
            .wait_one(std::time::Duration::from_secs(5))
            .expect("completion");
        assert!(wc.is_ok(), "{wc:?}");
    }
}

impl Drop for RawPair {
    fn drop(&mut self) {
        let destroy = hotverbs_softnic::verbs_table()
            .ibv_destroy_qp
            .expect("ibv_destroy_qp");
        // SAFETY: our QPs, destroyed once.
        unsafe {
            assert_eq!(destroy(self.a), 0);
            assert_eq!(destroy(self.b), 0);
        }
    }
}

/// A one-SGE RDMA WR at byte `offset` of `remote`.
fn rdma(
    wr_id: u64,
    op: ibv_wr_opcode,
    sge: &mut ibv_sge,
    remote: (u64, u32),
    offset: u64,
) -> ibv_send_wr {
    let mut wr = ibv_send_wr {
        wr_id,
        opcode: op,
        sg_list: sge,
        num_sge: 1,
        ..Default::default()
    };
    wr.wr.rdma.remote_addr = remote.0 + offset;
    wr.wr.rdma.rkey = remote.1;
    wr
}

/// A peer's inline RDMA WRITEs land (softnic's stores, on the posting thread) while another
/// thread copies the MR out with `read_into` (atomic loads). Every byte read is a value some
/// write stored, and per byte the values never go back (coherence of atomics).
#[test]
fn read_into_races_inline_rdma_writes() {
    let ctx = Context::open("softnic").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let target = pd
        .alloc_mr(
            LEN + 3,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let pair = RawPair::new(&ctx, &pd, &cq);
    let remote = (target.addr(), target.rkey());
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut last = [0u8; LEN];
            let mut out = [0u8; LEN];
            for _ in 0..ROUNDS {
                // Offset 3: the read starts mid-word, as the write does.
                target.read_into(3, &mut out).unwrap();
                for (i, (&now, before)) in out.iter().zip(last.iter_mut()).enumerate() {
                    assert!(now <= ROUNDS, "byte {i}: {now} was never written");
                    assert!(now >= *before, "byte {i} went back from {before} to {now}");
                    *before = now;
                }
                std::thread::yield_now();
            }
        });
        for round in 1..=ROUNDS {
            let data = [round; LEN];
            let mut sge = ibv_sge {
                addr: data.as_ptr() as u64,
                length: LEN as u32,
                lkey: 0,
            };
            let mut wr = rdma(round.into(), IBV_WR_RDMA_WRITE, &mut sge, remote, 3);
            wr.send_flags = IBV_SEND_INLINE;
            pair.run(&cq, wr);
        }
        reader.join().unwrap();
    });
    assert_eq!(target.read_vec(3, LEN).unwrap(), vec![ROUNDS; LEN]);
}

/// The other direction: the application rewrites an MR with `write_from` (atomic stores)
/// while the device reads it for a peer's RDMA READ (softnic's loads, on another thread).
#[test]
fn write_from_races_rdma_reads() {
    let ctx = Context::open("softnic").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let mut source = pd
        .alloc_mr(LEN + 5, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    let sink = pd.alloc_mr(LEN, AccessFlags::LOCAL_WRITE).unwrap();
    let pair = RawPair::new(&ctx, &pd, &cq);
    let remote = (source.addr(), source.rkey());
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            for round in 1..=ROUNDS {
                source.write_from(5, &[round; LEN]).unwrap();
                std::thread::yield_now();
            }
        });
        let mut last = [0u8; LEN];
        for round in 0..ROUNDS {
            let mut sge = sink.local(0, LEN).unwrap().into();
            let wr = rdma(round.into(), IBV_WR_RDMA_READ, &mut sge, remote, 5);
            pair.run(&cq, wr);
            let got = sink.read_vec(0, LEN).unwrap();
            for (i, (&now, before)) in got.iter().zip(last.iter_mut()).enumerate() {
                assert!(now <= ROUNDS, "byte {i}: {now} was never written");
                assert!(now >= *before, "byte {i} went back from {before} to {now}");
                *before = now;
            }
        }
        writer.join().unwrap();
    });
}
