//! Arbitrary bytes as `struct ibv_wc` through the completion decoders: the datapath's
//! `Completion` / `WcError` (hot path) and the setup layer's `Wc`.
//!
//! Invariants:
//! - no field value panics any accessor, `Debug` or `Display`;
//! - every `ibv_wc_status` the headers define (1..=23) maps to its own named `WcError`
//!   variant (never `Unknown`), whose `status()` is the input and whose `name()` is
//!   `wc_status_name`'s; any other value is `Unknown(value)` and still formats;
//!   `IBV_WC_SUCCESS` is `Ok`;
//! - the `wr_id` split (`ring`, `seq`) re-encodes to the same `wr_id`, and `full_seq`
//!   only ever names an outstanding sequence whose low 56 bits are the completion's;
//! - `imm()` is present exactly when `IBV_WC_WITH_IMM` is set and both layers agree on it;
//!   `is_recv()` is true exactly for the opcodes `IBV_WC_RECV` and
//!   `IBV_WC_RECV_RDMA_WITH_IMM`.
//!
//! Planted bug (`--features planted-bug`): the decoder treats `IBV_WC_TM_RNDV_INCOMPLETE`
//! (23) as unknown, as a table generated from pre-tag-matching headers would.
#![no_main]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use hotverbs::Wc;
use hotverbs_datapath::{wr_id, Completion, WcError};
use hotverbs_ffi::*;
use hotverbs_fuzz::{debug_with, decimal, display_with};
use libfuzzer_sys::fuzz_target;

/// The status decoder under test (the planted bug lives here).
fn decode(status: ibv_wc_status) -> Option<WcError> {
    if cfg!(feature = "planted-bug") && status == IBV_WC_TM_RNDV_INCOMPLETE {
        return Some(WcError::Unknown(status));
    }
    WcError::from_status(status)
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fuzz_target!(|data: &[u8]| {
    // 48 bytes of ibv_wc fields plus 16 bytes of ring counters for full_seq; a shorter
    // input is zero-padded (`cargo xtask fuzz` caps inputs at 64 bytes, so every input
    // is a completion).
    let mut b = [0u8; 64];
    let n = data.len().min(64);
    b[..n].copy_from_slice(&data[..n]);
    // Built field by field (the struct has padding, which is never read).
    let wc = ibv_wc {
        wr_id: u64::from_ne_bytes(b[0..8].try_into().unwrap()),
        status: u32_at(&b, 8),
        opcode: u32_at(&b, 12),
        vendor_err: u32_at(&b, 16),
        byte_len: u32_at(&b, 20),
        __bindgen_anon_1: ibv_wc__bindgen_ty_1 {
            imm_data: u32_at(&b, 24),
        },
        qp_num: u32_at(&b, 28),
        src_qp: u32_at(&b, 32),
        wc_flags: u32_at(&b, 36),
        pkey_index: u16::from_ne_bytes([b[40], b[41]]),
        slid: u16::from_ne_bytes([b[42], b[43]]),
        sl: b[44],
        dlid_path_bits: b[45],
    };
    // SAFETY: this target checks the accessors only; the completion reaches no ring.
    let c = unsafe { Completion::from_raw(wc) };
    let st = wc.status;

    // Status mapping.
    match (c.status(), decode(st)) {
        (Ok(()), None) => assert_eq!(st, IBV_WC_SUCCESS),
        (Err(got), Some(want)) => {
            assert_eq!(got, want, "status {st}");
            assert_eq!(want.status(), st);
            let mut dec = [0u8; 10];
            let st_dec = decimal(st, &mut dec);
            display_with(&want, |msg| {
                assert!(msg.contains(st_dec), "{msg}");
                assert!(msg.contains(want.name()), "{msg}");
            });
            if (IBV_WC_LOC_LEN_ERR..=IBV_WC_TM_RNDV_INCOMPLETE).contains(&st) {
                assert!(
                    !matches!(want, WcError::Unknown(_)),
                    "status {st} has no name"
                );
                assert_eq!(want.name(), wc_status_name(st));
                assert!(!want.name().contains("unknown"), "{}", want.name());
            } else {
                assert_eq!(want, WcError::Unknown(st));
            }
            assert!(!want.hint().is_empty());
        }
        (got, want) => panic!("status {st}: decoded {got:?}, expected {want:?}"),
    }

    // wr_id split and the sequence rebuild.
    assert_eq!(
        wr_id::encode(c.ring(), c.seq()) | (c.wr_id() & wr_id::RECV_BIT),
        c.wr_id()
    );
    assert_eq!(wr_id::is_recv(c.wr_id()), c.wr_id() & (1 << 55) != 0);
    let posted = u64::from_ne_bytes(b[48..56].try_into().unwrap());
    let retired = posted.saturating_sub(u64::from_ne_bytes(b[56..64].try_into().unwrap()) % 4096);
    if let Some(s) = wr_id::full_seq(posted, retired, c.seq()) {
        assert!(
            retired <= s && s < posted,
            "full_seq {s} outside {retired}..{posted}"
        );
        assert_eq!(wr_id::seq_of(s), c.seq());
    }

    // Immediate data and the receive bit; the setup layer's view agrees.
    let w = Wc::from_raw(wc);
    let has_imm = wc.wc_flags & IBV_WC_WITH_IMM != 0;
    assert_eq!(c.imm().is_some(), has_imm);
    assert_eq!(c.imm(), w.imm_data());
    assert_eq!(
        c.is_recv(),
        wc.opcode == IBV_WC_RECV || wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM
    );
    assert_eq!(w.status_name(), wc_status_name(st));
    assert_eq!(w.is_ok(), st == IBV_WC_SUCCESS);
    assert_eq!(
        w.status(),
        c.status(),
        "one completion-status type for both layers"
    );
    match w.ok() {
        Ok(_) => assert_eq!(st, IBV_WC_SUCCESS),
        Err(e) => display_with(&e, |t| assert!(t.contains(w.status_name()), "{t}")),
    }
    debug_with(&c, |t| assert!(!t.is_empty()));
    debug_with(&w, |t| assert!(!t.is_empty()));
});
