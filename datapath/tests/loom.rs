//! loom model of the split mode (poster thread / poller thread sharing `SendCounters`).
//!
//! The poster writes a zero-copy payload into buffer slot `seq % DEPTH` (the memory the NIC
//! reads until the covering completion), then publishes `posted`; the "NIC + poller" thread
//! observes `posted`, reads the slot (the DMA), and retires the WR through `SendRetirer`
//! (which publishes `retired`). loom explores the interleavings and its `UnsafeCell` flags
//! any access to a slot that is not ordered after the other thread's last access.
//!
//! Invariants: the poster never reuses a slot the NIC may still read (no causality
//! violation, and the NIC reads the value written for its sequence); outstanding <= depth.
//! Two deliberately broken variants must be rejected: Relaxed orderings, and an
//! off-by-one in the capacity check.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p hotverbs-datapath
//! --test loom --release` (`cargo xtask loom`).
#![cfg(loom)]

use hotverbs_datapath::split::{
    has_room, Orderings, Paired, RelaxedForModel, SendCounters, SendRetirer,
};
use hotverbs_datapath::{wr_id, Completion};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

const DEPTH: u64 = 2;
const MESSAGES: u64 = 3;

fn completion(seq: u64) -> Completion {
    // SAFETY: ibv_wc is plain data; all-zero is a valid (IBV_WC_SUCCESS) completion.
    let mut wc: hotverbs_ffi::ibv_wc = unsafe { core::mem::zeroed() };
    wc.wr_id = wr_id::encode(0, seq);
    Completion(wc)
}

/// One run of the protocol; `slack` widens the poster's capacity check (0 = correct).
fn model<O: Orderings + 'static>(slack: u64) {
    loom::model(move || {
        let shared: Arc<SendCounters<O>> = Arc::new(SendCounters::new());
        let slots: Arc<[UnsafeCell<u64>; DEPTH as usize]> =
            Arc::new([UnsafeCell::new(u64::MAX), UnsafeCell::new(u64::MAX)]);

        let nic = {
            let shared = shared.clone();
            let slots = slots.clone();
            thread::spawn(move || {
                let mut retirer = SendRetirer::new(0);
                for seq in 0..MESSAGES {
                    while shared.observe_posted() <= seq {
                        thread::yield_now();
                    }
                    // The NIC reads the payload of WR `seq` (DMA).
                    let v = slots[(seq % DEPTH) as usize].with(|p| {
                        // SAFETY: loom checks that this read is ordered after the write.
                        unsafe { *p }
                    });
                    assert_eq!(v, seq, "the NIC read a payload that was overwritten");
                    // Completion of WR `seq` (every WR signaled in this model).
                    assert_eq!(retirer.on_completion(&completion(seq), &*shared), Ok(1));
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
