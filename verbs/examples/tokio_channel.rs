//! Waiting for completions from async code: a completion channel under tokio's `AsyncFd`.
//!
//! ```text
//! cargo run -p hotverbs --example tokio_channel             # softnic
//! cargo run -p hotverbs --example tokio_channel -- rxe0     # a device by name
//! ```
//!
//! Two RC QPs of one context are connected to each other and share one CQ, created on a
//! [`CompChannel`]. The CQ is armed ([`Cq::req_notify`]), one receive and one inline SEND
//! are posted, and the task sleeps in `AsyncFd::readable()` until the channel's fd says an
//! event is pending; then it takes the event ([`CompChannel::get_cq_event`]), acknowledges
//! it ([`Cq::ack_events`]), re-arms and polls. No thread blocks in `ibv_get_cq_event` and
//! nothing busy-polls.
//!
//! Why the fd is made non-blocking ([`CompChannel::set_nonblocking`]): `AsyncFd` reports
//! readiness, not data. Its notice can be stale (the event was taken by someone else, or the
//! notice came from an earlier edge), and the only way to find out is to try the read. On a
//! blocking fd that try would park the runtime's thread inside `ibv_get_cq_event`; on a
//! non-blocking one it returns `EAGAIN`, which converts to an `io::Error` of kind
//! `WouldBlock`, and `AsyncFdReadyGuard::try_io` then clears the readiness and we wait again.
//!
//! [`run`] is the whole flow; `tests/tokio_channel.rs` runs it on softnic and checks what
//! it returns.

use std::error::Error as StdError;
use std::io;
use std::time::Duration;

use hotverbs::*;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The SEND's payload (inline: copied into the WQE when posted).
pub const MSG: &[u8] = b"woken by the completion channel";
/// Bounds each wait so that a broken setup fails instead of hanging; it does not measure
/// anything.
const TIMEOUT: Duration = Duration::from_secs(30);

type Res<T> = std::result::Result<T, Box<dyn StdError + Send + Sync>>;

/// What [`run`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The `wr_id`s of the successful completions polled, sorted: the receive (1) and the
    /// SEND (2).
    pub wr_ids: Vec<u64>,
    /// The bytes the receive got.
    pub received: Vec<u8>,
    /// Completion events taken from the channel (at least one: every poll followed one).
    pub events: u32,
}

/// Waits for the next completion event of `cq` on the channel inside `chan` and
/// acknowledges it.
async fn next_event(chan: &AsyncFd<CompChannel>, cq: &Cq) -> Res<()> {
    loop {
        let mut ready = chan.readable().await?;
        // `try_io` clears the readiness when the closure fails with `WouldBlock`, which is
        // what `EAGAIN` from the non-blocking `ibv_get_cq_event` converts to.
        match ready.try_io(|c| c.get_ref().get_cq_event().map_err(io::Error::from)) {
            Ok(ev) => {
                let ev = ev?;
                if !ev.is_for(cq) {
                    return Err("completion event for an unknown CQ".into());
                }
                cq.ack_events(1);
                return Ok(());
            }
            // Stale readiness: nothing pending after all; wait again.
            Err(_would_block) => continue,
        }
    }
}

/// Connects two RC QPs on `device` (softnic if `None`), sends [`MSG`] inline from one to
/// the other and waits for both completions through the completion channel under tokio.
///
/// Needs a tokio runtime with I/O and time enabled.
pub async fn run(device: Option<&str>) -> Res<Outcome> {
    let ctx = Context::open(device.unwrap_or("softnic"))?;
    let ch = ctx.create_comp_channel()?;
    // AsyncFd needs a non-blocking fd (see the module docs).
    ch.set_nonblocking(true)?;
    let cq = ctx.create_cq(16, Some(&ch))?;
    let pd = ctx.alloc_pd()?;
    // Declared before the QPs so that it is dropped after them: on an early return the
    // posted receive still targets it until the QP is destroyed.
    let rx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE)?;
    let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc)
        .max_inline_data(64)
        .build()?;
    let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
    let port = ctx.port_info(None, None)?;
    Qp::connect_pair(&a, &b, &port, &ConnectOptions::default())?;

    // The AsyncFd owns a clone of the channel, so the fd stays open while it is registered.
    // SAFETY: `AsyncFd::register`'s contract: the fd a `CompChannel` reports is open for as
    // long as the channel (any clone of it) lives, and `as_raw_fd` returns the same fd every
    // time (libibverbs never changes `ibv_comp_channel.fd`).
    let chan = unsafe { AsyncFd::register_with_interest(ch.clone(), Interest::READABLE) }?;

    // Arm before posting: the first completion then raises an event.
    cq.req_notify(false)?;
    let sge = Sge {
        addr: MSG.as_ptr() as u64,
        length: MSG.len() as u32,
        lkey: 0,
    };
    // SAFETY: rx stays registered and is not accessed until the receive's completion is
    // polled below (or the QPs are destroyed on an error path); the SEND is inline, so its
    // data (a static) is copied during the call.
    unsafe {
        b.post_recv(1, &[rx.local(0, 64)?])?;
        a.post_send(&SendWr::send(2, &[sge]).inline().signaled())?;
    }

    let mut wr_ids = Vec::new();
    let mut events = 0;
    let mut wcs = [Wc::default(); 4];
    while wr_ids.len() < 2 {
        tokio::time::timeout(TIMEOUT, next_event(&chan, &cq))
            .await
            .map_err(|_| format!("no completion event within {TIMEOUT:?}"))??;
        events += 1;
        // Re-arm before polling: a completion that lands after the poll below still raises
        // an event, so none is missed between the poll and the next wait.
        cq.req_notify(false)?;
        loop {
            let n = cq.poll(&mut wcs)?;
            if n == 0 {
                break;
            }
            for wc in &wcs[..n] {
                wr_ids.push(wc.ok()?.wr_id());
            }
        }
    }
    wr_ids.sort_unstable();
    let received = rx.read_vec(0, MSG.len())?;
    Ok(Outcome {
        wr_ids,
        received,
        events,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Res<()> {
    let device = std::env::args().nth(1);
    let out = run(device.as_deref()).await?;
    println!(
        "{} completion event(s); completions {:?}; received {:?}",
        out.events,
        out.wr_ids,
        String::from_utf8_lossy(&out.received)
    );
    Ok(())
}
