//! The README's quick start: set up a connected RC pair with the setup layer (`hotverbs`),
//! then stream RDMA WRITEs through the no_std hot path (`hotverbs-datapath`).
//!
//! `cargo run --release -p hotverbs-perf --example quickstart` (softnic when no RDMA device
//! exists; `HOTVERBS_DEVICE=mlx5_0` picks a device).

use hotverbs::*;
use hotverbs_datapath::{CqPoller, Local, Msg, RemoteBuf, SendConfig, SendRing};

pub fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    // --- setup: ordinary verbs -------------------------------------------------------------
    let ctx = Context::open_default()?; // $HOTVERBS_DEVICE, else the first real device, else softnic
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(256, None)?;
    let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .max_send_wr(128)
        .max_inline_data(64)
        .build()?;
    let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
    let port = ctx.port_info(None, None)?; // first active port; RoCE v2 IPv4 GID on Ethernet
    Qp::connect_pair(&a, &b, &port, &ConnectOptions::default())?;
    let target = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let r = target.remote(); // (addr, len, rkey): what a peer gets over the exchange

    // --- hot path: a preformatted ring, every 32nd WR signaled, batches of 32 -------------
    let cfg = SendConfig::new(1, 128, 64)
        .signal_every(32)
        .batch(32)
        .remote(RemoteBuf {
            addr: r.addr,
            len: r.len,
            rkey: r.rkey,
        });
    // SAFETY: `a` and `cq` (and the MR behind `r`) outlive the ring and the poller, and this
    // ring is the only user of a's send queue.
    let mut ring: SendRing<128> = unsafe { SendRing::new(a.as_raw(), cfg) }?;
    // SAFETY: as above for the CQ.
    let mut poller: CqPoller<32> = unsafe { CqPoller::new(cq.as_raw()) };

    let mut sent = 0u64;
    while sent < 10_000 {
        // Inline payloads are copied at post time (`finish`), so they only need to live
        // until then.
        let ticks: [[u8; 8]; 32] = core::array::from_fn(|i| (sent + i as u64).to_le_bytes());
        let mut batch = ring.batch(); // one chain, one doorbell
        for (i, tick) in ticks.iter().enumerate() {
            batch.push(Msg::write(Local::Inline(tick), i as u64 * 8))?;
        }
        batch.finish()?;
        sent += 32;
        while ring.free() < 32 {
            for c in poller.poll()? {
                ring.on_completion(c)?; // a signaled completion retires it and all before it
            }
        }
    }
    while ring.outstanding() > 0 {
        for c in poller.poll()? {
            ring.on_completion(c)?;
        }
    }
    let last = target.read_u64(31 * 8)?; // the last message of the last batch
    println!(
        "quickstart on {}: {sent} RDMA WRITEs, last value {last}",
        ctx.name()
    );
    assert_eq!(last, sent - 1);
    Ok(())
}
