//! The README's quick start: set up a connected RC pair with the setup layer (`hotverbs`),
//! then stream RDMA WRITEs through the no_std hot path (`hotverbs-datapath`).
//!
//! `cargo run --release -p hotverbs-perf --example quickstart` (softnic when no RDMA device
//! exists; `HOTVERBS_DEVICE=mlx5_0` picks a device).

use hotverbs::*;

pub fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    // --- setup: ordinary verbs -------------------------------------------------------------
    // $HOTVERBS_DEVICE, else the first RDMA device; with none, the software device, said so.
    let ctx = Context::open_default().or_else(|e| {
        eprintln!("{e}: running on softnic, the in-process software device");
        Context::open_softnic()
    })?;
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
    let remote = target.remote(); // (addr, len, rkey): what a peer gets over the exchange

    // --- hot path: a preformatted ring, every 32nd WR signaled, batches of 32 -------------
    let cfg = SendConfig::default() // depth and inline limit: the QP's
        .signal_every(32)
        .batch(32)
        .remote(remote.into());
    let mut ring = a.send_ring::<128>(cfg)?; // borrows `a`: a's send queue is the ring's alone
    let mut poller = cq.poller::<32>()?; // borrows `cq`: its only poller

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
    // Wait for the rest, whatever the count: `drain` asks for the signal the last
    // (unsignaled) WRs need and gives up, saying why, after the timeout.
    ring.drain(std::time::Duration::from_secs(5), |ring| {
        for c in poller.poll()? {
            ring.on_completion(c)?;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    let last = target.read_u64(31 * 8)?; // the last message of the last batch
    println!(
        "quickstart on {}: {sent} RDMA WRITEs, last value {last}",
        ctx.name()
    );
    assert_eq!(last, sent - 1);
    Ok(())
}
