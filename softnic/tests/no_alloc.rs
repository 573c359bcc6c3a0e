//! softnic sizes its queues when objects are created: from the very first work request,
//! posting (SEND inline, multi-SGE WRITE, READ, FETCH_AND_ADD, WRITE_WITH_IMM in one chain,
//! receives with two SGEs) and polling allocate nothing. A counting global allocator, armed
//! on the test thread right after setup, proves it.

mod common;

use common::*;
use hotverbs_softnic::testing::CountingAlloc;

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Polls `cq` until `want` completions arrived, into a fixed array; returns how many
/// failed.
fn poll_n(cq: *mut ibv_cq, want: usize) -> usize {
    let mut wc = [ibv_wc::default(); 8];
    let (mut got, mut failed) = (0, 0);
    while got < want {
        // SAFETY: live CQ; room for 8 entries.
        let n = unsafe { inline::ibv_poll_cq(cq, 8, wc.as_mut_ptr()) };
        assert!(n >= 0, "poll_cq {n}");
        for w in &wc[..n as usize] {
            failed += (w.status != IBV_WC_SUCCESS) as usize;
        }
        got += n as usize;
    }
    failed
}

#[test]
fn posting_and_polling_allocate_nothing_from_the_first_wr() {
    let mut p = Pair::with(IBV_QPT_RC, 64, 7);
    p.buf_a.fill(256, &[7u8; 128]);
    let (a, b) = (p.a, p.b);
    let (la, lb, rb) = (p.buf_a.lkey(), p.buf_b.lkey(), p.buf_b.rkey());
    let (aa, ab) = (p.buf_a.addr(), p.buf_b.addr());
    const ROUNDS: u64 = 2000;
    CountingAlloc::arm();
    let mut failed = 0;
    for i in 0..ROUNDS {
        for r in 0..2 {
            let mut rs = [
                ibv_sge {
                    addr: ab + r * 128,
                    length: 64,
                    lkey: lb,
                },
                ibv_sge {
                    addr: ab + r * 128 + 64,
                    length: 64,
                    lkey: lb,
                },
            ];
            assert_eq!(post_recv(b, i * 2 + r, &mut rs), 0);
        }
        let msg = i.to_le_bytes();
        let mut s_inline = [ibv_sge {
            addr: msg.as_ptr() as u64,
            length: 8,
            lkey: 0,
        }];
        let mut s_write = [
            ibv_sge {
                addr: aa + 256,
                length: 64,
                lkey: la,
            },
            ibv_sge {
                addr: aa + 320,
                length: 64,
                lkey: la,
            },
        ];
        let mut s_read = [ibv_sge {
            addr: aa + 2048,
            length: 128,
            lkey: la,
        }];
        let mut s_faa = [ibv_sge {
            addr: aa + 3000,
            length: 8,
            lkey: la,
        }];
        let mut s_imm = [ibv_sge {
            addr: aa + 256,
            length: 8,
            lkey: la,
        }];
        let mut chain = [
            send_wr(1, IBV_WR_SEND, &mut s_inline, IBV_SEND_INLINE),
            rdma(
                send_wr(2, IBV_WR_RDMA_WRITE, &mut s_write, 0),
                ab + 1024,
                rb,
            ),
            rdma(send_wr(3, IBV_WR_RDMA_READ, &mut s_read, 0), ab + 1024, rb),
            atomic(
                send_wr(4, IBV_WR_ATOMIC_FETCH_AND_ADD, &mut s_faa, 0),
                ab + 3000,
                rb,
                1,
                0,
            ),
            rdma(
                send_wr(5, IBV_WR_RDMA_WRITE_WITH_IMM, &mut s_imm, IBV_SEND_SIGNALED),
                ab + 2048,
                rb,
            ),
        ];
        assert_eq!(post_chain(a, &mut chain), (0, None));
        failed += poll_n(p.cq_a, 1);
        failed += poll_n(p.cq_b, 2);
    }
    CountingAlloc::disarm();
    let allocs = CountingAlloc::thread_allocs();
    assert_eq!(failed, 0);
    // The work really happened: the counter was added to once per round, the READ brought
    // back what the WRITE wrote, the last SEND carried the last round number.
    let faa = u64::from_ne_bytes(p.buf_b.bytes(3000, 8).try_into().unwrap());
    assert_eq!(faa, ROUNDS);
    assert_eq!(p.buf_a.bytes(2048, 128), vec![7u8; 128]);
    assert_eq!(p.buf_b.bytes(0, 8), (ROUNDS - 1).to_le_bytes());
    assert_eq!(allocs, 0, "allocations while posting and polling");
}
