//! loom model of the split mode (poster thread / poller thread sharing `SendCounters`).
//!
//! The poster writes a zero-copy payload into buffer slot `seq % DEPTH` (the memory the NIC
//! reads until the covering completion), rings the doorbell (`ibv_post_send`: the device
//! sees the WR from then on) and only afterwards publishes `posted` (`SendRing::sync`). The
//! "NIC + poller" thread waits for the doorbell, not for `posted`, reads the slot (the DMA)
//! and retires the WR through `SendRetirer` (which publishes `retired`) — so loom also
//! explores a completion handled before the poster published the WR, as softnic produces
//! (it completes inside `ibv_post_send`). Every completion must retire its WR (`Ok(1)`):
//! none may be dropped as stale. loom's `UnsafeCell` flags any access to a slot that is not
//! ordered after the other thread's last access.
//!
//! Invariants: the poster never reuses a slot the NIC may still read (no causality
//! violation, and the NIC reads the value written for its sequence); outstanding <= depth.
//! Two deliberately broken variants must be rejected: Relaxed orderings, and an
//! off-by-one in the capacity check.
//!
//! [`WrRing`](hotverbs_datapath::WrRing) in split mode runs the same protocol: its `sync`
//! observes `retired` (Acquire) before it reuses anything and publishes `posted` after its
//! `ibv_wr_complete`, its capacity rule is [`has_room`], and its completions go through the
//! same [`SendRetirer`]; so this model covers it (the device side, `ibv_wr_complete` instead
//! of `ibv_post_send`, is the model's doorbell either way).
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p hotverbs-datapath
//! --test loom --release` (`cargo xtask loom`).
#![cfg(loom)]

use hotverbs_datapath::split::{
    has_room, Orderings, Paired, RelaxedForModel, SendCounters, SendRetirer,
};
use hotverbs_datapath::{wr_id, Completion};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

const DEPTH: u64 = 2;
const MESSAGES: u64 = 3;

fn completion(seq: u64) -> Completion {
    // SAFETY: ibv_wc is plain data; all-zero is a valid (IBV_WC_SUCCESS) completion.
    let mut wc: hotverbs_ffi::ibv_wc = unsafe { core::mem::zeroed() };
    wc.wr_id = wr_id::encode(0, seq);
    // SAFETY: the model's stand-in for the completion the device produces for `seq`,
    // given to the (unpaired) retirer once.
    unsafe { Completion::from_raw(wc) }
}

/// One run of the protocol; `slack` widens the poster's capacity check (0 = correct).
fn model<O: Orderings + 'static>(slack: u64) {
    loom::model(move || {
        let shared: Arc<SendCounters<O>> = Arc::new(SendCounters::new());
        // The device's view of the send queue: WRs `..doorbell` were handed to it. The
        // provider's doorbell write is ordered after the WR's memory (Release / Acquire):
        // the device side is always correct in this model.
        let doorbell = Arc::new(AtomicU64::new(0));
        let slots: Arc<[UnsafeCell<u64>; DEPTH as usize]> =
            Arc::new([UnsafeCell::new(u64::MAX), UnsafeCell::new(u64::MAX)]);

        let nic = {
            let shared = shared.clone();
            let slots = slots.clone();
            let doorbell = doorbell.clone();
            thread::spawn(move || {
                // The ring's depth (the planted capacity bug widens the ring, not its buffers).
                let mut retirer = SendRetirer::new(0, DEPTH + slack, 0);
                for seq in 0..MESSAGES {
                    while doorbell.load(Ordering::Acquire) <= seq {
                        thread::yield_now();
                    }
                    // The NIC reads the payload of WR `seq` (DMA).
                    let v = slots[(seq % DEPTH) as usize].with(|p| {
                        // SAFETY: loom checks that this read is ordered after the write.
                        unsafe { *p }
                    });
                    assert_eq!(v, seq, "the NIC read a payload that was overwritten");
                    // Completion of WR `seq` (every WR signaled in this model), possibly before
                    // the poster published it: it must still retire exactly that WR.
                    assert_eq!(
                        retirer.on_completion(&completion(seq), &*shared),
                        Ok(1),
                        "completion of seq {seq} dropped"
                    );
                }
            })
        };

        for seq in 0..MESSAGES {
            let retired = loop {
                let r = shared.observe_retired();
                if has_room(seq, r, DEPTH + slack) {
                    break r;
                }
                thread::yield_now();
            };
            assert!(seq + 1 - retired <= DEPTH + slack);
            if slack == 0 {
                assert!(seq + 1 - retired <= DEPTH, "outstanding exceeds the depth");
            }
            // Reuse slot seq % DEPTH for the next zero-copy payload.
            slots[(seq % DEPTH) as usize].with_mut(|p| {
                // SAFETY: loom checks that no read of this slot is concurrent.
                unsafe { *p = seq }
            });
            // ibv_post_send: from here the device may run and complete the WR ...
            doorbell.store(seq + 1, Ordering::Release);
            // ... before the poster publishes it (SendRing::sync).
            thread::yield_now();
            shared.publish_posted(seq + 1);
        }
        nic.join().unwrap();
        assert_eq!(shared.observe_retired(), MESSAGES);
    });
}

#[test]
fn split_mode_release_acquire_is_correct() {
    model::<Paired>(0);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn relaxed_orderings_are_caught() {
    model::<RelaxedForModel>(0);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn off_by_one_capacity_is_caught() {
    model::<Paired>(1);
}
