//! Event fds under tokio, on softnic: `examples/tokio_channel.rs` end to end (a completion
//! channel under `AsyncFd`), the context's async-event fd under `AsyncFd`, and what a
//! non-blocking fd returns when nothing is pending (`EAGAIN`, kind `WouldBlock`, which is
//! what `AsyncFdReadyGuard::try_io` needs to see).
//!
//! Every await is bounded by a generous timeout that only limits how long a failure takes;
//! no assertion depends on timing.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::Duration;

use hotverbs::*;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::time::timeout;

// The example's `main` is not used here.
#[allow(dead_code)]
#[path = "../examples/tokio_channel.rs"]
mod tokio_channel;

const T: Duration = Duration::from_secs(30);

fn is_nonblocking(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: F_GETFL on an fd open for the borrow.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    assert!(flags >= 0, "fcntl: {}", io::Error::last_os_error());
    flags & libc::O_NONBLOCK != 0
}

#[tokio::test(flavor = "current_thread")]
async fn example_wakes_on_the_completion_channel() {
    let out = timeout(T, tokio_channel::run(None))
        .await
        .expect("the example finished in time")
        .unwrap();
    assert_eq!(out.wr_ids, [1, 2], "{out:?}");
    assert_eq!(out.received, tokio_channel::MSG, "{out:?}");
    // Each poll round followed an event taken through AsyncFd; two completions need at
    // most two rounds.
    assert!((1..=2).contains(&out.events), "{out:?}");
    assert!(take_drop_errors().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_runs_on_a_multi_thread_runtime() {
    let out = tokio::spawn(timeout(T, tokio_channel::run(None)))
        .await
        .unwrap()
        .expect("the example finished in time")
        .unwrap();
    assert_eq!(out.wr_ids, [1, 2], "{out:?}");
    assert_eq!(out.received, tokio_channel::MSG, "{out:?}");
}

#[test]
fn nonblocking_channel_says_would_block_when_nothing_is_pending() {
    let ctx = Context::open("softnic").unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(4, Some(&ch)).unwrap();
    cq.req_notify(false).unwrap();
    assert_eq!(ch.as_fd().as_raw_fd(), ch.as_raw_fd());
    assert!(!is_nonblocking(ch.as_fd()));

    ch.set_nonblocking(true).unwrap();
    assert!(is_nonblocking(ch.as_fd()));
    // A clone shares the open file, hence the flag.
    assert!(is_nonblocking(ch.clone().as_fd()));
    let e = ch.get_cq_event().unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_get_cq_event", libc::EAGAIN));
    let io = io::Error::from(e);
    assert_eq!(io.kind(), io::ErrorKind::WouldBlock);
    assert_eq!(Error::errno_of(&io), Some(libc::EAGAIN));
    // Idempotent, and reversible.
    ch.set_nonblocking(true).unwrap();
    assert!(is_nonblocking(ch.as_fd()));
    ch.set_nonblocking(false).unwrap();
    assert!(!is_nonblocking(ch.as_fd()));
    // Non-blocking or not, the timed wait reports "nothing" rather than an error.
    assert!(ch
        .wait_cq_event(Duration::from_millis(10))
        .unwrap()
        .is_none());
    drop(cq);
    ch.destroy().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn async_event_fd_under_async_fd() {
    // A Spec-profile device whatever HOTVERBS_SOFTNIC_PROFILE says: the QP_FATAL this test
    // waits for is never raised by rxe (fault-truth G7).
    let ctx = Context::open_softnic_with(hotverbs::SoftnicConfig {
        profile: hotverbs_softnic::Profile::Spec,
        ..Default::default()
    })
    .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    let port = ctx.port_info(None, None).unwrap();
    Qp::connect_pair(&a, &b, &port, &ConnectOptions::default()).unwrap();

    let events = ctx.async_events().unwrap();
    assert!(events.as_raw_fd() >= 0);
    assert_eq!(events.as_fd().as_raw_fd(), events.as_raw_fd());
    events.set_nonblocking(true).unwrap();
    assert!(is_nonblocking(events.as_fd()));
    // The flag is the context's: another handle sees it.
    assert!(is_nonblocking(ctx.async_events().unwrap().as_fd()));
    let e = events.get().unwrap_err();
    assert_eq!(io::Error::from(e).kind(), io::ErrorKind::WouldBlock);

    // The handle owns a clone of the context: 'static, movable into AsyncFd.
    // SAFETY: `AsyncFd::register`'s contract: the async fd is open as long as the context,
    // which the handle keeps alive, and `as_raw_fd` always returns that same fd.
    let afd = unsafe { AsyncFd::register_with_interest(events, Interest::READABLE) }.unwrap();
    // SAFETY: a live softnic QP.
    unsafe { hotverbs_softnic::inject_qp_error(b.as_raw()) };
    let ev = timeout(T, async {
        loop {
            let mut ready = afd.readable().await.unwrap();
            if let Ok(r) = ready.try_io(|e| e.get_ref().get().map_err(io::Error::from)) {
                break r;
            }
        }
    })
    .await
    .expect("the async event arrived in time")
    .unwrap();
    assert_eq!(ev.name, "IBV_EVENT_QP_FATAL");
    assert_eq!(
        ev.element,
        AsyncElement::Qp {
            qp: b.as_raw(),
            qp_num: b.qp_num()
        }
    );
    // Taken and acknowledged: nothing more pending.
    let e = afd.get_ref().get().unwrap_err();
    assert_eq!(e.errno(), libc::EAGAIN);
    assert!(afd.get_ref().context().async_events().is_ok());
}
