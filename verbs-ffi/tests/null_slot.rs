//! A provider leaves extended slots NULL unless they were requested (rxe fills
//! `ibv_qp_ex.wr_send_tso` only with `IBV_QP_EX_WITH_TSO`; mlx5 fills `ibv_cq_ex.read_*` only
//! for the fields in `wc_flags`). Calling such a slot through `hotverbs_ffi::inline` must
//! abort the process and name the slot, as the C inline would fault at address 0, never run
//! on as undefined behaviour.
//!
//! Each case runs this test binary again as a child (`--exact <case>`) that makes the call;
//! the parent checks that the child died of SIGABRT and said which slot was NULL.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use hotverbs_ffi::{ibv_cq_ex, ibv_qp_ex, inline};

/// Set in the child: which call to make.
const CHILD: &str = "HOTVERBS_NULL_SLOT_CHILD";

/// Runs `case` in a child process and asserts it aborted naming `slot`.
fn assert_aborts(case: &str, slot: &str) {
    let out = Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", case, "--nocapture", "--test-threads=1"])
        .env(CHILD, case)
        .output()
        .expect("spawn the test binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "{case}: the child must abort (status {:?}); stderr:\n{stderr}",
        out.status
    );
    // Not just the slot's name (a panic message names the test, which contains it).
    let message = format!("NULL provider slot `{slot}`");
    assert!(
        stderr.contains(&message),
        "{case}: the abort message must say {message:?}; stderr:\n{stderr}"
    );
}

/// In the parent, asks for a child run; in the child, true.
fn in_child(case: &str, slot: &str) -> bool {
    if std::env::var(CHILD).as_deref() == Ok(case) {
        return true;
    }
    assert_aborts(case, slot);
    false
}

#[test]
fn wr_send_tso_unrequested_aborts() {
    if !in_child("wr_send_tso_unrequested_aborts", "wr_send_tso") {
        return;
    }
    // A QP created without IBV_QP_EX_WITH_TSO: every slot we did not ask for is NULL
    // (here: all of them).
    let mut qp = ibv_qp_ex::default();
    // SAFETY: deliberately breaks the "op requested" part of the contract; everything else
    // holds (qp is a valid ibv_qp_ex for the call's duration). The call must abort.
    unsafe { inline::ibv_wr_send_tso(&mut qp, core::ptr::null_mut(), 0, 0) };
    unreachable!("ibv_wr_send_tso through a NULL slot returned");
}

#[test]
fn wc_read_completion_ts_unrequested_aborts() {
    if !in_child(
        "wc_read_completion_ts_unrequested_aborts",
        "read_completion_ts",
    ) {
        return;
    }
    // A CQ created without IBV_WC_EX_WITH_COMPLETION_TIMESTAMP in wc_flags.
    let mut cq = ibv_cq_ex::default();
    // SAFETY: as above, only the "field requested" part of the contract is broken.
    let ts = unsafe { inline::ibv_wc_read_completion_ts(&mut cq) };
    unreachable!("ibv_wc_read_completion_ts through a NULL slot returned {ts}");
}

#[test]
fn start_poll_on_a_cq_without_poll_ops_aborts() {
    if !in_child("start_poll_on_a_cq_without_poll_ops_aborts", "start_poll") {
        return;
    }
    let mut cq = ibv_cq_ex::default();
    // SAFETY: as above.
    let ret = unsafe { inline::ibv_start_poll(&mut cq, core::ptr::null_mut()) };
    unreachable!("ibv_start_poll through a NULL slot returned {ret}");
}
